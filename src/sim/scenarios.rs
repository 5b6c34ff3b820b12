//! Jobs people run, as named scenarios (`muon-opt simulate --scenario`): parallel layouts whose
//! per-rank state fits an 80 GB H100, gradients reduced in bf16 (Megatron's default: the param
//! dtype unless `--accumulate-allreduce-grads-in-fp32`), each compared with distributed AdamW
//! on the same cluster ([`super::simulate_against_adamw`]). `docs/performance.md` is their
//! table.

use crate::bail;
use crate::config::{Dtype, TpMode};
use crate::error::Result;
use crate::plan::presets::preset;

use super::Scenario;
use super::profile::builtin;

/// One named job.
#[derive(Debug, Clone, Copy)]
pub struct Job {
    pub name: &'static str,
    pub model: &'static str,
    pub hardware: &'static str,
    pub dp: usize,
    /// Tensor parallelism (Megatron's placement: TP inside a node), with a norm group over
    /// TP × DP ranks.
    pub tp: Option<usize>,
}

/// Every named job, in table order.
pub const JOBS: &[Job] = &[
    Job {
        name: "llama3-8b dp8 nvlink",
        model: "llama3-8b",
        hardware: "h100-nvlink",
        dp: 8,
        tp: None,
    },
    Job {
        name: "llama3-8b dp64 nvlink",
        model: "llama3-8b",
        hardware: "h100-nvlink",
        dp: 64,
        tp: None,
    },
    Job {
        name: "llama3-70b tp8 dp8 ib",
        model: "llama3-70b",
        hardware: "h100-ib",
        dp: 8,
        tp: Some(8),
    },
    Job {
        name: "llama3-70b tp8 dp64 ib",
        model: "llama3-70b",
        hardware: "h100-ib",
        dp: 64,
        tp: Some(8),
    },
];

impl Job {
    /// The job's scenario, MXFP8 params gathered as bf16 or not.
    pub fn scenario(&self, mxfp8: bool) -> Result<Scenario> {
        let Some(hardware) = builtin(self.hardware) else {
            bail!(
                Internal,
                "scenario {}: no built-in profile {}",
                self.name,
                self.hardware
            );
        };
        let Some(model) = preset(self.model) else {
            bail!(Internal, "scenario {}: no preset {}", self.name, self.model);
        };
        Ok(Scenario {
            mxfp8,
            grad_dtype: Dtype::Bf16,
            tp: self.tp.map(|ranks| (ranks, TpMode::Blockwise)),
            norm_group: self.tp.map(|ranks| ranks * self.dp),
            ..Scenario::new(model, self.dp, hardware)
        })
    }
}

/// The job called `name` (as in [`JOBS`]).
pub fn job(name: &str) -> Result<Job> {
    match JOBS.iter().find(|j| j.name == name) {
        Some(job) => Ok(*job),
        None => {
            let names: Vec<&str> = JOBS.iter().map(|j| j.name).collect();
            bail!(
                InvalidArgument,
                "--scenario '{name}': unknown; the scenarios are all, {}",
                names.join(", ")
            )
        }
    }
}

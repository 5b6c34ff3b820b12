//! Jobs people run, as named scenarios (`muon-opt simulate --scenario`): parallel layouts whose
//! per-rank state fits an 80 GB H100, gradients reduced in bf16 (Megatron's default: the param
//! dtype unless `--accumulate-allreduce-grads-in-fp32`), each compared with distributed AdamW
//! on the same cluster ([`super::simulate_against_adamw`]). `docs/performance.md` is their
//! table.

use crate::bail;
use crate::config::{Dtype, ParamSharding, TpMode};
use crate::error::Result;
use crate::plan::presets::preset;

use super::profile::builtin;
use super::{Batch, ExpertParallel, Scenario};

/// One named job.
#[derive(Debug, Clone, Copy)]
pub struct Job {
    pub name: &'static str,
    pub model: &'static str,
    pub hardware: &'static str,
    pub dp: usize,
    /// Tensor parallelism (Megatron's placement: TP inside a node), with a norm group over
    /// TP × PP × DP ranks.
    pub tp: Option<usize>,
    /// Pipeline parallelism: (stages, the simulated stage), with a norm group over
    /// TP × PP × DP ranks.
    pub pipeline: Option<(usize, usize)>,
    /// Virtual stages per rank (interleaved 1F1B).
    pub virtual_stages: usize,
    pub expert_parallel: Option<ExpertParallel>,
    /// The batch as trained; None = 8192 tokens per GPU in one micro-batch.
    pub batch: Option<Batch>,
    /// `param_sharding = sharded` (with the default policy: reshard after forward, one bucket
    /// prefetched), against AdamW with ZeRO-3 (its params sharded the same way).
    pub sharded: bool,
}

/// DeepSeek-V3's training layout (DeepSeek-V3 Technical Report, arXiv 2412.19437, §3.2:
/// "16-way Pipeline Parallelism, 64-way Expert Parallelism spanning 8 nodes, and ZeRO-1 Data
/// Parallelism" on 2048 H800 GPUs, no tensor parallelism): the 64 expert-parallel ranks are
/// the 8 × 8 GPUs of 8 nodes holding one pipeline stage, so a stage's data-parallel group
/// fills each node's 8 GPUs (the `h100-nvlink` placement, the ring crossing the network
/// between nodes). The report's 2048 GPUs make 128 data-parallel replicas, 2 per expert, so
/// its expert data-parallel group has 2 ranks; the job takes 64 (1024 GPUs), where each expert
/// has one rank (EDP = 1) and every rank holds exactly the params it holds in the report's
/// layout.
const DSV3_PIPELINE_STAGES: usize = 16;
const DSV3_EXPERT_PARALLEL: usize = 64;
/// A middle stage: 61 layers over 16 stages put 3 or 4 MoE layers on each of stages 1–14 (the
/// embedding and the 3 dense layers on stage 0, the output layer and the multi-token-prediction
/// module on stage 15); stage 8 holds layers 30–33.
const DSV3_SIMULATED_STAGE: usize = 8;
/// Routed experts per token (DeepSeek-V3 Technical Report §4.2: "each token will be activated
/// 8 experts" of 256).
const DSV3_EXPERTS_PER_TOKEN: u64 = 8;

/// The Llama 3 batch: 16M tokens, 2048 sequences of 8192 tokens, micro-batch 1 (The Llama 3
/// Herd of Models, arXiv 2407.21783, §3.4.1: 4M tokens of 4,096-token sequences at first, 8M
/// of 8,192 after 252M tokens, 16M after 2.87T; stated for the 405B model, the only Llama 3
/// batch the paper gives).
const LLAMA3_BATCH: Batch = Batch {
    global: 2048,
    micro: 1,
    seq_len: 8192,
};
/// DeepSeek-V3's batch: 15,360 sequences of 4K tokens, micro-batch 1 (DeepSeek-V3 Technical
/// Report §4.2: the batch grows from 3072 to 15360 over the first 469B tokens and stays there;
/// a maximum sequence length of 4K in pre-training).
const DSV3_BATCH: Batch = Batch {
    global: 15360,
    micro: 1,
    seq_len: 4096,
};

/// The jobs at 8192 tokens per GPU that [`JOBS`] also lists at their published batch.
const LLAMA3_8B_DP8_NVLINK: Job = Job {
    name: "llama3-8b dp8 nvlink",
    model: "llama3-8b",
    hardware: "h100-nvlink",
    dp: 8,
    tp: None,
    pipeline: None,
    virtual_stages: 1,
    expert_parallel: None,
    batch: None,
    sharded: false,
};

const LLAMA3_8B_DP64_NVLINK: Job = Job {
    name: "llama3-8b dp64 nvlink",
    model: "llama3-8b",
    hardware: "h100-nvlink",
    dp: 64,
    tp: None,
    pipeline: None,
    virtual_stages: 1,
    expert_parallel: None,
    batch: None,
    sharded: false,
};

const LLAMA3_70B_TP8_DP8_IB: Job = Job {
    name: "llama3-70b tp8 dp8 ib",
    model: "llama3-70b",
    hardware: "h100-ib",
    dp: 8,
    tp: Some(8),
    pipeline: None,
    virtual_stages: 1,
    expert_parallel: None,
    batch: None,
    sharded: false,
};

const LLAMA3_70B_TP8_DP64_IB: Job = Job {
    name: "llama3-70b tp8 dp64 ib",
    model: "llama3-70b",
    hardware: "h100-ib",
    dp: 64,
    tp: Some(8),
    pipeline: None,
    virtual_stages: 1,
    expert_parallel: None,
    batch: None,
    sharded: false,
};

const DEEPSEEK_V3_LIKE_PP16_EP64_DP64_NVLINK: Job = Job {
    name: "deepseek-v3-like pp16 ep64 dp64 nvlink",
    model: "deepseek-v3-like",
    hardware: "h100-nvlink",
    dp: DSV3_EXPERT_PARALLEL,
    tp: None,
    pipeline: Some((DSV3_PIPELINE_STAGES, DSV3_SIMULATED_STAGE)),
    virtual_stages: 1,
    expert_parallel: Some(ExpertParallel {
        ep: DSV3_EXPERT_PARALLEL,
        experts_per_token: DSV3_EXPERTS_PER_TOKEN,
    }),
    batch: None,
    sharded: false,
};

const KIMI_K2_PP4_VPP4_EP64_DP64_GB300: Job = Job {
    name: "kimi-k2 pp4 vpp4 ep64 dp64 gb300",
    model: "kimi-k2",
    hardware: "gb300-nvl72",
    dp: 64,
    tp: None,
    pipeline: Some((4, 2)),
    virtual_stages: 4,
    expert_parallel: Some(ExpertParallel {
        ep: 64,
        experts_per_token: KIMI_K2_EXPERTS_PER_TOKEN,
    }),
    batch: None,
    sharded: false,
};

const QWEN3_30B_A3B_EP8_DP8_GB300: Job = Job {
    name: "qwen3-30b-a3b ep8 dp8 gb300",
    model: "qwen3-30b-a3b",
    hardware: "gb300-nvl72",
    dp: 8,
    tp: None,
    pipeline: None,
    virtual_stages: 1,
    expert_parallel: Some(ExpertParallel {
        ep: 8,
        experts_per_token: QWEN3_EXPERTS_PER_TOKEN,
    }),
    batch: None,
    sharded: false,
};

/// Every named job, in table order, each at 8192 tokens per GPU and at its published batch:
/// the dense and DeepSeek-V3-like jobs, the sharded one (8192 tokens only), then NVIDIA's
/// measured jobs.
pub const JOBS: &[Job] = &[
    LLAMA3_8B_DP8_NVLINK,
    Job {
        name: "llama3-8b dp8 nvlink, 2048 x 8192",
        batch: Some(LLAMA3_BATCH),
        ..LLAMA3_8B_DP8_NVLINK
    },
    LLAMA3_8B_DP64_NVLINK,
    Job {
        name: "llama3-8b dp64 nvlink, 2048 x 8192",
        batch: Some(LLAMA3_BATCH),
        ..LLAMA3_8B_DP64_NVLINK
    },
    LLAMA3_70B_TP8_DP8_IB,
    Job {
        name: "llama3-70b tp8 dp8 ib, 2048 x 8192",
        batch: Some(LLAMA3_BATCH),
        ..LLAMA3_70B_TP8_DP8_IB
    },
    LLAMA3_70B_TP8_DP64_IB,
    Job {
        name: "llama3-70b tp8 dp64 ib, 2048 x 8192",
        batch: Some(LLAMA3_BATCH),
        ..LLAMA3_70B_TP8_DP64_IB
    },
    DEEPSEEK_V3_LIKE_PP16_EP64_DP64_NVLINK,
    Job {
        name: "deepseek-v3-like pp16 ep64 dp64 nvlink, 15360 x 4096",
        batch: Some(DSV3_BATCH),
        ..DEEPSEEK_V3_LIKE_PP16_EP64_DP64_NVLINK
    },
    // Issue 41: 70B on 64 GPUs without tensor parallelism, which replicated params cannot fit.
    Job {
        name: "llama3-70b dp64 nvlink sharded",
        model: "llama3-70b",
        hardware: "h100-nvlink",
        dp: 64,
        tp: None,
        pipeline: None,
        virtual_stages: 1,
        expert_parallel: None,
        batch: None,
        sharded: true,
    },
    // NVIDIA's measured jobs ([`NVIDIA_MEGATRON_MUON`]): Megatron-Bridge 26.02 on GB300 NVL72,
    // at 8192 tokens per GPU and at the batch NVIDIA measured.
    KIMI_K2_PP4_VPP4_EP64_DP64_GB300,
    Job {
        name: "kimi-k2 pp4 vpp4 ep64 dp64 gb300, 4096 x 4096",
        batch: Some(KIMI_K2_BATCH),
        ..KIMI_K2_PP4_VPP4_EP64_DP64_GB300
    },
    QWEN3_30B_A3B_EP8_DP8_GB300,
    Job {
        name: "qwen3-30b-a3b ep8 dp8 gb300, 512 x 4096",
        batch: Some(QWEN3_30B_A3B_BATCH),
        ..QWEN3_30B_A3B_EP8_DP8_GB300
    },
];

/// Kimi K2's micro-batch on GB300: Megatron-Bridge v0.3.1 (2026-03-20, its first GB300 recipe)
/// `scripts/performance/configs/kimi/kimi_workload_base_configs.py` line 36
/// (`KIMI_K2_PRETRAIN_CONFIG_GB300`, `micro_batch_size=2`), kept at 067f987d
/// (`src/megatron/bridge/perf_recipes/kimi/gb300/kimi_k2.py` line 159).
const KIMI_K2_MICRO_BATCH: u64 = 2;

/// Kimi K2 as NVIDIA measured it ([`NVIDIA_MEGATRON_MUON`]): global batch 4096 of 4096-token
/// sequences, micro-batch [`KIMI_K2_MICRO_BATCH`].
const KIMI_K2_BATCH: Batch = Batch {
    global: 4096,
    micro: KIMI_K2_MICRO_BATCH,
    seq_len: 4096,
};

/// Qwen3-30B-A3B as NVIDIA measured it ([`NVIDIA_MEGATRON_MUON`]): global batch 512,
/// micro-batch 8, 4096-token sequences (the Megatron-Bridge recipe's).
const QWEN3_30B_A3B_BATCH: Batch = Batch {
    global: 512,
    micro: 8,
    seq_len: 4096,
};

/// Routed experts per token: `num_experts_per_tok` of moonshotai/Kimi-K2-Instruct's and
/// Qwen/Qwen3-30B-A3B's config.json.
const KIMI_K2_EXPERTS_PER_TOKEN: u64 = 8;
const QWEN3_EXPERTS_PER_TOKEN: u64 = 8;

/// A published measurement of Muon's cost: a named job's model TFLOP/s per GPU under
/// distributed AdamW and under layer-wise distributed Muon, MXFP8.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    pub job: &'static str,
    pub adamw_tflops: f64,
    pub muon_tflops: f64,
    pub source: &'static str,
}

/// NVIDIA's Megatron measurements (the blog "Advancing Emerging Optimizers for Accelerated
/// LLM Training with NVIDIA Megatron", Table 1, Megatron-Bridge 26.02): Kimi K2 on 256 GB300,
/// PP 4 (VPP 4) × DP 64 × EP 64, MXFP8, global batch 4096 of 4096 tokens; Qwen3-30B-A3B on 8
/// GB300, DP 8 × EP 8, MXFP8, global batch 512, micro-batch 8. The micro-batch of Kimi K2
/// (2, `KIMI_K2_MICRO_BATCH`) and the sequence length of Qwen3-30B-A3B (4096) are the
/// Megatron-Bridge recipes', not stated in the table.
pub const NVIDIA_MEGATRON_MUON: &[Measured] = &[
    Measured {
        job: "kimi-k2 pp4 vpp4 ep64 dp64 gb300, 4096 x 4096",
        adamw_tflops: 1051.0,
        muon_tflops: 1029.0,
        source: "NVIDIA, Advancing Emerging Optimizers for Accelerated LLM Training with NVIDIA Megatron, Table 1",
    },
    Measured {
        job: "qwen3-30b-a3b ep8 dp8 gb300, 512 x 4096",
        adamw_tflops: 713.0,
        muon_tflops: 686.0,
        source: "NVIDIA, Advancing Emerging Optimizers for Accelerated LLM Training with NVIDIA Megatron, Table 1",
    },
];

impl Job {
    /// The MXFP8 settings the job runs with: off and on, or off alone for a sharded job (which
    /// gathers MXFP8 params as bf16 into its working set, never staged, whatever
    /// `mxfp8_param_gather` says).
    pub fn mxfp8_modes(&self) -> &'static [bool] {
        if self.sharded { &[false] } else { &[false, true] }
    }

    /// The job's scenario, MXFP8 params gathered as bf16 or not.
    pub fn scenario(&self, mxfp8: bool) -> Result<Scenario> {
        if !self.mxfp8_modes().contains(&mxfp8) {
            bail!(
                IncompatibleOptions,
                "scenario {}: sharded params with MXFP8 staged gathers (mxfp8_param_gather)",
                self.name
            );
        }
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
        let model_parallel = self.tp.unwrap_or(1) * self.pipeline.map_or(1, |(stages, _)| stages);
        Ok(Scenario {
            mxfp8,
            grad_dtype: Dtype::Bf16,
            // Per shard, as these jobs were first priced and as Megatron-LM ran them before its
            // PR #6380; the library's default (duplicated) is `simulate --tp-mode`'s.
            tp: self.tp.map(|ranks| (ranks, TpMode::Blockwise)),
            norm_group: (model_parallel > 1).then_some(model_parallel * self.dp),
            pipeline: self.pipeline,
            virtual_stages: self.virtual_stages,
            batch: self.batch,
            expert_parallel: self.expert_parallel,
            param_sharding: if self.sharded {
                ParamSharding::Sharded
            } else {
                ParamSharding::Replicated
            },
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
                "--scenario '{name}': unknown and not a scenario file; the scenarios are all, {}",
                names.join(", ")
            )
        }
    }
}

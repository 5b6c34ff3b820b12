//! `muon-opt demo`: trains a small MLP on a synthetic teacher task on host ranks (threads),
//! once with Muon on the hidden matrices and once with AdamW only, through nothing but the
//! public optimizer API. The demo is a framework of its own: [`model`] computes forward and
//! backward, [`run`] drives the ranks through registration, `wait_params`, `grad_ready` and
//! `step`, [`report`] prints the loss curves, the plan and the step-time breakdown.

pub mod command;
mod model;
mod report;
mod run;
#[cfg(test)]
mod tests;

use run::run_demo;

use muon_opt::config::{Config, NsPrecision, ScaleMode};
use muon_opt::model::Route;
use muon_opt::plan::Plan;
use muon_opt::schedule::{StepArgs, StepOverrides};

use model::Dims;

/// Everything a demo run depends on.
#[derive(Debug, Clone, PartialEq)]
pub struct DemoConfig {
    pub dims: Dims,
    /// Data-parallel ranks (threads).
    pub dp: usize,
    pub steps: usize,
    /// Examples per rank per step.
    pub batch: usize,
    pub seed: u64,
    /// Optimizer configuration shared by both runs.
    pub optimizer: Config,
    /// Learning rates and weight decays; the AdamW-only run uses `adam_lr` for every param.
    pub args: StepArgs,
}

impl Default for DemoConfig {
    /// Four-token bags over a 48-token vocabulary, 60 steps on 4 ranks. Muon runs as in
    /// Moonlight: Nesterov momentum and updates scaled by `0.2·√max(m, n)` so their RMS
    /// matches AdamW's, which lets both optimizers share one learning rate.
    fn default() -> Self {
        let dims = Dims {
            vocab: 48,
            embed: 32,
            hidden: 64,
            out: 16,
            context: 4,
        };
        DemoConfig {
            dims,
            dp: 4,
            steps: 60,
            batch: 64,
            seed: 0x5EED,
            optimizer: Config {
                clip_grad: 1.0,
                muon_ns_precision: NsPrecision::F32,
                muon_nesterov: true,
                muon_scale_mode: ScaleMode::Spectral,
                muon_extra_scale_factor: 0.2,
                bucket_size: 4096,
                vocab_size: dims.vocab as u64,
                collective_timeout_ms: 60_000,
                ..Config::default()
            },
            args: StepArgs {
                lr: 0.02,
                weight_decay: 0.0,
                adam_lr: 0.02,
                adam_weight_decay: 0.0,
                overrides: StepOverrides::NONE,
            },
        }
    }
}

/// Which optimizer gets the hidden matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Variant {
    /// Hidden matrices on Muon; embedding, head and biases on AdamW.
    Muon,
    /// Every param on AdamW (hidden matrices flagged `NO_MUON`).
    AdamwOnly,
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::Muon => "muon",
            Variant::AdamwOnly => "adamw",
        }
    }
}

/// Progress of rank 0 after one step.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub variant: Variant,
    /// Steps done (1-based).
    pub step: usize,
    pub steps: usize,
    /// Rank 0's training loss of this step.
    pub loss: f64,
}

/// Rank 0's wall-clock seconds, summed over the steps, per part of an iteration.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Timings {
    /// The demo's own forward and backward, including reading params and writing grads.
    pub forward_backward: f64,
    /// `zero_grad` calls.
    pub zero_grad: f64,
    /// `grad_ready` calls (the last one of a bucket launches its gradient collectives).
    pub grad_ready: f64,
    /// `step` calls: wait for the gradient collectives, grad norm, Muon and AdamW updates,
    /// launch of the param collectives.
    pub step: f64,
    /// `wait_params` calls: wait for the param collectives.
    pub wait_params: f64,
    /// The whole training loop.
    pub total: f64,
    /// Inside `step`, by part (from the runtime's own profile).
    pub step_parts: muon_opt::schedule::StepProfile,
}

/// A param as registered, with the route the optimizer gave it (`Optimizer::route`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ParamRoute {
    pub id: u32,
    pub name: String,
    pub shape: Vec<u64>,
    pub route: Route,
}

/// The outcome of one training run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunResult {
    pub variant: Variant,
    /// Per step: the training loss before the update, averaged over ranks (each rank's batch).
    pub losses: Vec<f64>,
    /// Loss of the initial and of the final params on a fixed held-out set.
    pub eval_loss_initial: f64,
    pub eval_loss_final: f64,
    /// Per step: the global gradient norm reported by `step`.
    pub grad_norms: Vec<f64>,
    pub routes: Vec<ParamRoute>,
    pub timings: Timings,
    /// Rank 0's plan.
    pub plan: Plan,
}

/// Both runs, same model, same data.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DemoResult {
    pub dims: Dims,
    pub dp: usize,
    pub steps: usize,
    pub batch_per_rank: usize,
    /// Muon learning rate and weight decay (hidden matrices of the Muon run).
    pub lr: f32,
    pub weight_decay: f32,
    /// AdamW learning rate and weight decay (everything else, and everything in the AdamW-only run).
    pub adam_lr: f32,
    pub adam_weight_decay: f32,
    pub optimizer: Config,
    pub muon: RunResult,
    pub adamw: RunResult,
}

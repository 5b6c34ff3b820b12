//! The options of one simulated job, the same on the command line (`muon-opt simulate
//! --model … --dp …`) and in a scenario file (`muon-opt simulate --scenario FILE.json`, one
//! object per job with these names as keys: `scenario_file.rs`).

use clap::{Args, ValueEnum};
use serde::Deserialize;

use muon_opt::config::{Config, Dtype, MuonOwnership, NsMethod, NsPrecision, TpMode};
use muon_opt::sim::{
    Batch, ExpertParallel, PlanNetwork, Scenario, Schedule, Simulation, simulate, simulate_adamw_baseline,
    simulate_best_ownership, with_baseline,
};

use crate::plan::parse_network;
use crate::shared_args::{LayoutChoice, OwnershipChoice, ShardingArgs, load_model};

use super::load_hardware;

/// One job's options. In a scenario file every key is optional but `name`, `model` and `dp`,
/// and takes the command line's default ([`JobArgs::default`], checked against clap's by a
/// test); an unknown key is an error.
#[derive(Args, Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JobArgs {
    /// Scenario files only: the job's name in the output.
    #[arg(skip)]
    pub name: Option<String>,
    /// A preset (gpt2-124m, llama3-8b, llama3-70b, deepseek-v3-like, kimi-k2, qwen3-30b-a3b)
    /// or a JSON parameter-list file.
    #[arg(long, required_unless_present_any = ["device_run", "scenario", "validation"])]
    pub model: Option<String>,
    /// Data-parallel size.
    #[arg(long, required_unless_present_any = ["device_run", "scenario", "validation"])]
    pub dp: Option<usize>,
    /// Also run the scenario with every param on distributed AdamW (Megatron's
    /// DistributedOptimizer: same buckets, reduce-scatter grads, all-gather params) and report
    /// Muon's overhead over it.
    #[arg(long, value_enum)]
    baseline: Option<BaselineChoice>,
    /// Element type gradients are reduced in (the library's grad_dtype).
    #[arg(long, value_enum, default_value_t = GradDtypeChoice::F32)]
    grad_dtype: GradDtypeChoice,
    /// Muon layout; `all` simulates every layout side by side.
    #[arg(long, value_enum, default_value_t = LayoutChoice::Compact)]
    pub layout: LayoutChoice,
    /// How the rooted layouts give Muon matrices owners (muon_ownership): `contiguous` cuts
    /// buckets at owner changes, one reduce and one broadcast each; `auto` simulates balanced
    /// and contiguous and keeps the faster (padded keeps Megatron's owners) [default: the
    /// library's auto, the planner's choice on the declared network; with --scenario: auto].
    #[arg(long, value_enum)]
    pub ownership: Option<OwnershipChoice>,
    /// The network the library is told it runs on: `LATENCY_US,BANDWIDTH_GBPS`, or `none`
    /// (undeclared: the fewest bytes win) [default: the profile's data-parallel ring].
    #[arg(long, value_name = "LATENCY_US,BANDWIDTH_GBPS|none", allow_hyphen_values = true)]
    network: Option<String>,
    /// Store the Muon matrices as MXFP8 and gather them as bf16.
    #[arg(long)]
    mxfp8: bool,
    /// Newton–Schulz precision.
    #[arg(long, value_enum, default_value_t = PrecisionChoice::Bf16)]
    ns_precision: PrecisionChoice,
    /// Newton–Schulz iteration: `gram` where it applies (docs/newton-schulz.md), else standard.
    #[arg(long, value_enum, default_value_t = MethodChoice::Standard)]
    ns_method: MethodChoice,
    /// A built-in profile (h100-nvlink, h100-ib, h200-nvlink, b200-nvlink, a100-nvlink, gb200-nvl72,
    /// gb300-nvl72) or a hardware JSON file.
    #[arg(long, default_value = "h100-nvlink")]
    pub hardware: String,
    /// Tokens per GPU per iteration (forward and backward cost) in one micro-batch, without
    /// attention FLOPs; --global-batch replaces it.
    #[arg(long, default_value_t = 8192)]
    tokens_per_gpu: u64,
    /// Sequences per iteration over every data-parallel replica (Megatron's
    /// --global-batch-size): each rank runs global / (micro-batch · dp) micro-batches of
    /// --micro-batch sequences of --seq-len tokens, causal attention counted.
    #[arg(
        long,
        value_name = "SEQUENCES",
        requires = "seq_len",
        conflicts_with = "tokens_per_gpu"
    )]
    global_batch: Option<u64>,
    /// Sequences per micro-batch (Megatron's --micro-batch-size).
    #[arg(long, value_name = "SEQUENCES", default_value_t = 1, requires = "global_batch")]
    micro_batch: u64,
    /// Tokens per sequence (Megatron's --seq-length).
    #[arg(long, value_name = "TOKENS", requires = "global_batch")]
    seq_len: Option<u64>,
    /// Pipeline parallelism of N stages, 1F1B: each rank holds --pp-stage's layers, and the
    /// iteration carries the bubble (p − 1) / (m · v).
    #[arg(long, value_name = "N")]
    pp: Option<usize>,
    /// The stage simulated [default: N / 2, a middle stage].
    #[arg(long, value_name = "S", requires = "pp")]
    pp_stage: Option<usize>,
    /// Virtual stages per rank (interleaved 1F1B).
    #[arg(long, value_name = "V", default_value_t = 1, requires = "pp")]
    vpp: usize,
    /// Expert parallelism of N ranks (N = --dp: each rank holds 1/N of every expert stack, in
    /// a second optimizer); each token is routed to --top-k experts.
    #[arg(long, value_name = "N", requires = "top_k")]
    ep: Option<usize>,
    /// Routed experts per token (the model config's num_experts_per_tok).
    #[arg(long, value_name = "K", requires = "ep")]
    top_k: Option<u64>,
    /// Iterations to simulate (>= 2; the figures are the last one's).
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// Gather the gradient norm over a norm group of N ranks (tensor × pipeline × data
    /// parallel, muon_optimizer_set_norm_group) instead of the data-parallel group.
    #[arg(long, value_name = "N")]
    norm_group: Option<usize>,
    /// Tensor parallelism of size N: each rank holds TP rank 0's shards of the column-parallel
    /// (qkv, fc1) and row-parallel (proj, fc2) matrices; their collectives run over NVLink.
    #[arg(long, value_name = "N")]
    tp: Option<usize>,
    /// How TP-sharded Muon matrices are orthogonalized (muon_tp_mode; the library's default,
    /// duplicated, unless given).
    #[arg(long, value_enum, default_value_t = TpModeChoice::Duplicated)]
    tp_mode: TpModeChoice,
    /// QK-clip (MuonClip, muon_optimizer_qk_clip) of every fused QKV before every step.
    #[arg(long)]
    qk_clip: bool,
    /// Register every expert stack as separate matrices, one per expert, as Megatron-LM sees a
    /// MoE layer (not with --ep, which splits the stacks).
    #[arg(long, conflicts_with = "ep")]
    experts_as_params: bool,
    /// Whose step: this library's, or Megatron-LM's layer-wise optimizer as NVIDIA's Muon
    /// recipes run the same job (gradients all-reduced, each expert orthogonalized alone, the
    /// param all-gather after the step; src/sim/megatron.rs). Megatron's sets the layout and
    /// ownership; --baseline adamw stays distributed AdamW.
    #[arg(long, value_enum, default_value_t = ScheduleChoice::Ours, conflicts_with_all = ["layout", "ownership", "scenario", "validation", "device_run"])]
    pub schedule: ScheduleChoice,
    #[command(flatten)]
    sharding: ShardingArgs,
}

impl Default for JobArgs {
    /// The command line's defaults.
    fn default() -> Self {
        JobArgs {
            name: None,
            model: None,
            dp: None,
            baseline: None,
            grad_dtype: GradDtypeChoice::F32,
            layout: LayoutChoice::Compact,
            ownership: None,
            network: None,
            mxfp8: false,
            ns_precision: PrecisionChoice::Bf16,
            ns_method: MethodChoice::Standard,
            hardware: "h100-nvlink".to_string(),
            tokens_per_gpu: 8192,
            global_batch: None,
            micro_batch: 1,
            seq_len: None,
            pp: None,
            pp_stage: None,
            vpp: 1,
            ep: None,
            top_k: None,
            steps: 3,
            norm_group: None,
            tp: None,
            tp_mode: TpModeChoice::Duplicated,
            qk_clip: false,
            experts_as_params: false,
            schedule: ScheduleChoice::Ours,
            sharding: ShardingArgs::default(),
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BaselineChoice {
    Adamw,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleChoice {
    Ours,
    Megatron,
}

#[derive(Clone, Copy, Debug, ValueEnum, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GradDtypeChoice {
    Bf16,
    F32,
}

#[derive(Clone, Copy, Debug, ValueEnum, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TpModeChoice {
    Blockwise,
    Duplicated,
    Distributed,
}

#[derive(Clone, Copy, Debug, ValueEnum, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrecisionChoice {
    Bf16,
    F32,
    #[value(name = "bf16_iterate")]
    Bf16Iterate,
}

#[derive(Clone, Copy, Debug, ValueEnum, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MethodChoice {
    Standard,
    Gram,
}

impl MethodChoice {
    pub fn method(self) -> NsMethod {
        match self {
            MethodChoice::Standard => NsMethod::Standard,
            MethodChoice::Gram => NsMethod::Gram,
        }
    }
}

impl PrecisionChoice {
    pub fn precision(self) -> NsPrecision {
        match self {
            PrecisionChoice::Bf16 => NsPrecision::Bf16,
            PrecisionChoice::F32 => NsPrecision::F32,
            PrecisionChoice::Bf16Iterate => NsPrecision::Bf16Iterate,
        }
    }
}

impl JobArgs {
    /// The rules clap checks on the command line, for a job read from a file: `model` and
    /// `dp` given, `global_batch` with `seq_len` (and `micro_batch` only with it), `ep` with
    /// `top_k`, `pp_stage` and `vpp` only with `pp`, `experts_as_params` not with `ep`, and
    /// Megatron's schedule, which sets the layout and ownership, without them.
    pub fn check_file_rules(&self) -> Result<(), String> {
        let name = self.name.as_deref().unwrap_or("a job without a name");
        let rules: [(bool, &str); 9] = [
            (self.model.is_none(), "needs `model`"),
            (self.dp.is_none(), "needs `dp`"),
            (
                self.global_batch.is_some() != self.seq_len.is_some(),
                "`global_batch` and `seq_len` go together",
            ),
            (
                self.micro_batch != 1 && self.global_batch.is_none(),
                "`micro_batch` needs `global_batch`",
            ),
            (
                self.ep.is_some() != self.top_k.is_some(),
                "`ep` and `top_k` go together",
            ),
            (
                (self.pp_stage.is_some() || self.vpp != 1) && self.pp.is_none(),
                "`pp_stage` and `vpp` need `pp`",
            ),
            (
                self.experts_as_params && self.ep.is_some(),
                "`experts_as_params` does not go with `ep`",
            ),
            (
                self.schedule == ScheduleChoice::Megatron && self.ownership.is_some(),
                "`schedule: megatron` sets the ownership",
            ),
            (
                self.schedule == ScheduleChoice::Megatron && !matches!(self.layout, LayoutChoice::Compact),
                "`schedule: megatron` sets the layout",
            ),
        ];
        match rules.iter().find(|(broken, _)| *broken) {
            Some((_, rule)) => Err(format!("scenario job '{name}': {rule}")),
            None => Ok(()),
        }
    }

    /// Simulates the job in every layout it asks for (against AdamW with `baseline`).
    pub fn simulate(&self) -> Result<Vec<Simulation>, String> {
        let (Some(model), Some(dp)) = (&self.model, self.dp) else {
            return Err("--model and --dp are required without --device-run".to_string());
        };
        let model = load_model(model, self.experts_as_params)?;
        let hardware = load_hardware(&self.hardware)?;
        let plan_network = match self.network.as_deref() {
            None => PlanNetwork::Profile,
            Some("none") => PlanNetwork::Undeclared,
            Some(text) => PlanNetwork::Declared(parse_network(text)?),
        };
        let mut sims = Vec::new();
        // The AdamW baseline has no Muon layout: one run serves every layout.
        let mut adamw: Option<Simulation> = None;
        for layout in self.layout.layouts() {
            let scenario = Scenario {
                layout,
                ownership: self.ownership.map_or(MuonOwnership::Auto, |o| o.for_layout(layout)),
                plan_network,
                mxfp8: self.mxfp8,
                ns_precision: self.ns_precision.precision(),
                ns_method: self.ns_method.method(),
                tokens_per_gpu: self.tokens_per_gpu,
                iterations: self.steps,
                // Pipeline stages step together: by default the norm group spans them.
                norm_group: self
                    .norm_group
                    .or_else(|| self.pp.map(|stages| stages * self.tp.unwrap_or(1) * dp)),
                tp: self.tp.map(|ranks| {
                    let mode = match self.tp_mode {
                        TpModeChoice::Blockwise => TpMode::Blockwise,
                        TpModeChoice::Duplicated => TpMode::Duplicated,
                        TpModeChoice::Distributed => TpMode::Distributed,
                    };
                    (ranks, mode)
                }),
                grad_dtype: match self.grad_dtype {
                    GradDtypeChoice::Bf16 => Dtype::Bf16,
                    GradDtypeChoice::F32 => Dtype::F32,
                },
                qk_clip: self.qk_clip,
                pipeline: self.pp.map(|stages| (stages, self.pp_stage.unwrap_or(stages / 2))),
                virtual_stages: self.vpp,
                batch: self.global_batch.map(|global| Batch {
                    global,
                    micro: self.micro_batch,
                    seq_len: self.seq_len.unwrap_or_default(),
                }),
                expert_parallel: self.ep.map(|ep| ExpertParallel {
                    ep,
                    experts_per_token: self.top_k.unwrap_or_default(),
                }),
                ..Scenario::new(model.clone(), dp, hardware.clone())
            };
            let cfg = self.sharding.apply(Config::default());
            let scenario = Scenario {
                param_sharding: cfg.param_sharding,
                reshard_after_forward: cfg.reshard_after_forward,
                param_prefetch_buckets: cfg.param_prefetch_buckets,
                ..scenario
            };
            if matches!(self.baseline, Some(BaselineChoice::Adamw)) && adamw.is_none() {
                adamw = Some(simulate_adamw_baseline(&scenario).map_err(|e| e.to_string())?);
            }
            let scenario = scenario.with_schedule(match self.schedule {
                ScheduleChoice::Ours => Schedule::Ours,
                ScheduleChoice::Megatron => Schedule::Megatron,
            });
            let sim = match self.ownership {
                Some(OwnershipChoice::Auto) => simulate_best_ownership(&scenario, adamw.as_ref()),
                _ => simulate(&scenario).map(|sim| match &adamw {
                    Some(adamw) => with_baseline(sim, adamw),
                    None => sim,
                }),
            };
            sims.push(sim.map_err(|e| e.to_string())?);
        }
        Ok(sims)
    }
}

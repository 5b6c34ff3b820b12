//! `muon-opt simulate`: training iterations of the real schedule on a modelled GPU cluster,
//! in one or every layout.

mod performance;
mod table;
mod trace;
mod validation;

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use muon_opt::config::{Config, Dtype, MuonOwnership, NsMethod, NsPrecision, TpMode};
use muon_opt::sim::profile::{HARDWARE_NAMES, Hardware, builtin};
use muon_opt::sim::{
    Batch, ExpertParallel, PlanNetwork, Scenario, Schedule, Simulation, simulate, simulate_adamw_baseline,
    simulate_best_ownership, with_baseline,
};

use crate::plan::parse_network;
use crate::shared_args::{LayoutChoice, OwnershipChoice, ShardingArgs, load_model};

#[derive(Args)]
pub struct SimulateArgs {
    /// A preset (gpt2-124m, llama3-8b, llama3-70b, deepseek-v3-like, kimi-k2, qwen3-30b-a3b)
    /// or a JSON parameter-list file.
    #[arg(long, required_unless_present_any = ["device_run", "scenario", "validation"])]
    model: Option<String>,
    /// Data-parallel size.
    #[arg(long, required_unless_present_any = ["device_run", "scenario", "validation"])]
    dp: Option<usize>,
    /// Instead of --model/--dp: a named job people run (`all`: every one, MXFP8 off and on,
    /// each against its AdamW baseline), as a table (`--markdown`: docs/performance.md).
    #[arg(long, value_name = "NAME", conflicts_with_all = ["model", "dp", "device_run"])]
    scenario: Option<String>,
    /// With --scenario: print docs/performance.md.
    #[arg(long, requires = "scenario")]
    markdown: bool,
    /// Print docs/validation.md: published measurements of Muon's cost beside the simulated
    /// prediction for the same jobs.
    #[arg(long, conflicts_with_all = ["model", "dp", "device_run", "scenario"])]
    validation: bool,
    /// Also run the scenario with every param on distributed AdamW (Megatron's
    /// DistributedOptimizer: same buckets, reduce-scatter grads, all-gather params) and report
    /// Muon's overhead over it.
    #[arg(long, value_enum)]
    baseline: Option<BaselineChoice>,
    /// Element type gradients are reduced in (the library's grad_dtype).
    #[arg(long, value_enum, default_value_t = GradDtypeChoice::F32)]
    grad_dtype: GradDtypeChoice,
    /// Instead of a scenario: price a device run's measured op classes (`muon-opt measure
    /// --out`, `bench/device/*.json`) with `--hardware` and print measured / predicted.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["model", "dp"])]
    device_run: Option<PathBuf>,
    /// Muon layout; `all` simulates every layout side by side.
    #[arg(long, value_enum, default_value_t = LayoutChoice::Compact)]
    layout: LayoutChoice,
    /// How the rooted layouts give Muon matrices owners (muon_ownership): `contiguous` cuts
    /// buckets at owner changes, one reduce and one broadcast each; `auto` simulates balanced
    /// and contiguous and keeps the faster (padded keeps Megatron's owners) [default: the
    /// library's auto, the planner's choice on the declared network; with --scenario: auto].
    #[arg(long, value_enum)]
    ownership: Option<OwnershipChoice>,
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
    hardware: String,
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
    schedule: ScheduleChoice,
    #[command(flatten)]
    sharding: ShardingArgs,
    /// Print the figures as JSON.
    #[arg(long)]
    json: bool,
    /// Write a Chrome/Perfetto trace of the first layout to FILE.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Write an SVG timeline of the first layout to FILE.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
}

#[derive(Clone, Copy, ValueEnum)]
enum BaselineChoice {
    Adamw,
}

#[derive(Clone, Copy, ValueEnum)]
enum ScheduleChoice {
    Ours,
    Megatron,
}

#[derive(Clone, Copy, ValueEnum)]
enum GradDtypeChoice {
    Bf16,
    F32,
}

#[derive(Clone, Copy, ValueEnum)]
enum TpModeChoice {
    Blockwise,
    Duplicated,
    Distributed,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum PrecisionChoice {
    Bf16,
    F32,
    #[value(name = "bf16_iterate")]
    Bf16Iterate,
}

#[derive(Clone, Copy, ValueEnum)]
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

/// A built-in hardware profile by name, else a profile JSON file.
pub fn load_hardware(arg: &str) -> Result<Hardware, String> {
    if let Some(hw) = builtin(arg) {
        return Ok(hw);
    }
    let text = std::fs::read_to_string(arg).map_err(|e| {
        format!(
            "--hardware '{arg}': not a built-in profile ({}) and not a readable file: {e}",
            HARDWARE_NAMES.join(", ")
        )
    })?;
    Hardware::from_json(&text).map_err(|e| format!("--hardware '{arg}': {e}"))
}

pub fn run(args: &SimulateArgs) -> Result<(), String> {
    if let Some(path) = &args.device_run {
        return crate::device::run_comparison(path, &args.hardware, args.json);
    }
    if args.validation {
        return validation::run();
    }
    if let Some(name) = &args.scenario {
        return performance::run(
            name,
            args.ownership.unwrap_or(OwnershipChoice::Auto),
            args.markdown,
            args.json,
        );
    }
    let (Some(model), Some(dp)) = (&args.model, args.dp) else {
        return Err("--model and --dp are required without --device-run".to_string());
    };
    let model = load_model(model, args.experts_as_params)?;
    let hardware = load_hardware(&args.hardware)?;
    let plan_network = match args.network.as_deref() {
        None => PlanNetwork::Profile,
        Some("none") => PlanNetwork::Undeclared,
        Some(text) => PlanNetwork::Declared(parse_network(text)?),
    };
    let mut sims = Vec::new();
    // The AdamW baseline has no Muon layout: one run serves every layout.
    let mut adamw: Option<Simulation> = None;
    for layout in args.layout.layouts() {
        let scenario = Scenario {
            layout,
            ownership: args.ownership.map_or(MuonOwnership::Auto, |o| o.for_layout(layout)),
            plan_network,
            mxfp8: args.mxfp8,
            ns_precision: args.ns_precision.precision(),
            ns_method: args.ns_method.method(),
            tokens_per_gpu: args.tokens_per_gpu,
            iterations: args.steps,
            // Pipeline stages step together: by default the norm group spans them.
            norm_group: args
                .norm_group
                .or_else(|| args.pp.map(|stages| stages * args.tp.unwrap_or(1) * dp)),
            tp: args.tp.map(|ranks| {
                let mode = match args.tp_mode {
                    TpModeChoice::Blockwise => TpMode::Blockwise,
                    TpModeChoice::Duplicated => TpMode::Duplicated,
                    TpModeChoice::Distributed => TpMode::Distributed,
                };
                (ranks, mode)
            }),
            grad_dtype: match args.grad_dtype {
                GradDtypeChoice::Bf16 => Dtype::Bf16,
                GradDtypeChoice::F32 => Dtype::F32,
            },
            qk_clip: args.qk_clip,
            pipeline: args.pp.map(|stages| (stages, args.pp_stage.unwrap_or(stages / 2))),
            virtual_stages: args.vpp,
            batch: args.global_batch.map(|global| Batch {
                global,
                micro: args.micro_batch,
                seq_len: args.seq_len.unwrap_or_default(),
            }),
            expert_parallel: args.ep.map(|ep| ExpertParallel {
                ep,
                experts_per_token: args.top_k.unwrap_or_default(),
            }),
            ..Scenario::new(model.clone(), dp, hardware.clone())
        };
        let cfg = args.sharding.apply(Config::default());
        let scenario = Scenario {
            param_sharding: cfg.param_sharding,
            reshard_after_forward: cfg.reshard_after_forward,
            param_prefetch_buckets: cfg.param_prefetch_buckets,
            ..scenario
        };
        if matches!(args.baseline, Some(BaselineChoice::Adamw)) && adamw.is_none() {
            adamw = Some(simulate_adamw_baseline(&scenario).map_err(|e| e.to_string())?);
        }
        let scenario = scenario.with_schedule(match args.schedule {
            ScheduleChoice::Ours => Schedule::Ours,
            ScheduleChoice::Megatron => Schedule::Megatron,
        });
        let sim = match args.ownership {
            Some(OwnershipChoice::Auto) => simulate_best_ownership(&scenario, adamw.as_ref()),
            _ => simulate(&scenario).map(|sim| match &adamw {
                Some(adamw) => with_baseline(sim, adamw),
                None => sim,
            }),
        };
        sims.push(sim.map_err(|e| e.to_string())?);
    }
    for sim in sims.iter().filter(|s| !s.fits) {
        eprintln!(
            "warning: {} at dp={} ({}): the library alone needs {:.1} GB per rank, more than the profile's {} GB",
            sim.model,
            sim.dp,
            sim.layout,
            sim.rank_bytes() as f64 / 1e9,
            sim.memory_gb
        );
    }
    let first = &sims[0];
    let ranks = trace::ranks_to_show(&first.timelines);
    if let Some(path) = &args.trace {
        std::fs::write(path, trace::chrome(&first.timelines, &ranks))
            .map_err(|e| format!("--trace '{}': cannot write: {e}", path.display()))?;
    }
    if let Some(path) = &args.svg {
        let title = format!("{} dp={} {} on {}", first.model, first.dp, first.layout, first.hardware);
        std::fs::write(path, trace::svg(&first.timelines, &ranks, &title))
            .map_err(|e| format!("--svg '{}': cannot write: {e}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&sims).map_err(|e| e.to_string())?);
    } else {
        print!("{}", table::table(&sims));
        let (measured, estimated) = hardware.provenance();
        let list = |v: &[&str]| if v.is_empty() { "none".to_string() } else { v.join(", ") };
        println!(
            "profile {}: measured on a GPU: {}; estimated: {}",
            hardware.name,
            list(&measured),
            list(&estimated)
        );
    }
    Ok(())
}

//! `muon-opt simulate`: a training step of the real schedule on a modelled GPU cluster.
//!
//! Every rank runs the real [`crate::schedule::Runtime`] on the cuda backend's real
//! translator; instead of a device, each translated action gets a duration from the
//! [`cost::CostModel`] of a [`profile::Hardware`] profile, and the [`engine`] plays every rank's
//! host timeline and streams against each other. Nothing of the schedule is re-implemented
//! here: a change to the schedule or the translation shows in the figures as it would on a GPU
//! (within the model). Definitions of every figure: `docs/simulate.md`.

pub mod cost;
pub mod device;
pub mod drive;
pub mod engine;
pub mod gram_speedup;
pub mod megatron;
pub mod metrics;
pub mod profile;
pub mod qk_clip;
pub mod scenarios;
mod sharding;
pub mod work;

use serde::Serialize;

use crate::bail;
use crate::config::{Config, Dtype, MuonLayout, MuonOwnership, Network, NsMethod, NsPrecision, ParamSharding, TpMode};
use crate::error::Result;
use crate::model::{ParamFlags, ParamSpec, Route};
use crate::plan::presets::{Attention, ModelDesc, attention};
use crate::plan::{Plan, build_plan};
use crate::schedule::state::StateLayout;

use crate::backend::ops::StreamKind;
use cost::CostModel;
use drive::{Member, RecordOptions, Trainer, record_shared};
use engine::{Class, Item, Timeline};
pub use megatron::Schedule;
use metrics::{DeviceBytes, Figures};
use profile::Hardware;

/// What to simulate.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub model: ModelDesc,
    pub dp: usize,
    pub layout: MuonLayout,
    /// How the rooted layouts give Muon matrices owners (`muon_ownership`).
    pub ownership: MuonOwnership,
    /// Muon-routed matrices stored as MXFP8, gathered as bf16 (`mxfp8_param_gather`).
    pub mxfp8: bool,
    pub ns_precision: NsPrecision,
    /// The Newton–Schulz iteration (`muon_ns_method`): Gram where it applies, or standard.
    pub ns_method: NsMethod,
    pub hardware: Hardware,
    pub tokens_per_gpu: u64,
    /// Iterations to run (≥ 2; the figures are the last one's).
    pub iterations: usize,
    /// Overrides of the default config (`overlap_*`, `bucket_size`).
    pub overlap_grad_reduce: bool,
    pub overlap_param_gather: bool,
    pub bucket_size: u64,
    /// Ranks of a norm group spanning the data-parallel group (tensor × pipeline × data
    /// parallel), over which the gradient norm is gathered; None = the data-parallel group.
    pub norm_group: Option<usize>,
    /// Tensor parallelism: the TP size (each simulated rank holds TP rank 0's shards,
    /// [`ModelDesc::with_tensor_parallel`]) and how its Muon matrices are orthogonalized.
    pub tp: Option<(usize, TpMode)>,
    /// Element type gradients are reduced in (`grad_dtype`; Megatron reduces in the param
    /// dtype unless `--accumulate-allreduce-grads-in-fp32`).
    pub grad_dtype: Dtype,
    /// Every param on distributed AdamW (flagged `NO_MUON`), the same buckets, collectives and
    /// MXFP8 params otherwise: Megatron's DistributedOptimizer, the baseline Muon is compared to.
    pub adamw_only: bool,
    /// QK-clip (MuonClip) of every fused QKV before every step ([`qk_clip::requests`]).
    pub qk_clip: bool,
    /// Pipeline parallelism: (stages, stage): each simulated rank holds that stage's params
    /// ([`ModelDesc::pipeline_stage`]) and computes their forward and backward.
    pub pipeline: Option<(usize, usize)>,
    /// Virtual stages per rank (interleaved 1F1B, Megatron's
    /// `--num-layers-per-virtual-pipeline-stage`): only the bubble changes, `(p − 1) / (m · v)`;
    /// the rank holds its stage's layers as one contiguous chunk.
    pub virtual_stages: usize,
    /// The batch as trained; None = `tokens_per_gpu` in one micro-batch, no attention FLOPs.
    pub batch: Option<Batch>,
    /// The model's attention (its causal FLOPs are counted with a batch's sequence length).
    pub attention: Option<Attention>,
    /// Expert parallelism: each rank holds `1/ep` of every expert stack, optimized by a second
    /// optimizer over the expert data-parallel group, stepped with the dense one.
    pub expert_parallel: Option<ExpertParallel>,
    /// The network the library is told it runs on (`muon_config_t.network`): the profile's
    /// figures by default, as a job on this cluster would declare them.
    pub plan_network: PlanNetwork,
    /// Whose step: this library's, or Megatron-LM's as it runs the same job (set with
    /// [`Scenario::with_schedule`], which also sets the layout and overlap it implies).
    pub schedule: Schedule,
    /// `param_sharding`, `reshard_after_forward` and `param_prefetch_buckets`: sharded, the
    /// gathers around the forward and backward are priced (`sharding.rs`).
    pub param_sharding: ParamSharding,
    pub reshard_after_forward: bool,
    pub param_prefetch_buckets: u32,
}

/// The batch as trained (Megatron-LM's `--global-batch-size`, `--micro-batch-size`,
/// `--seq-length`): every data-parallel replica runs `global / (micro · dp)` micro-batches of
/// `micro` sequences of `seq_len` tokens per iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Batch {
    /// Sequences per iteration over all data-parallel replicas.
    pub global: u64,
    /// Sequences per micro-batch.
    pub micro: u64,
    pub seq_len: u64,
}

/// What a simulated job declares as its network ([`Config::network`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PlanNetwork {
    /// The profile's data-parallel ring at the job's dp and placement
    /// ([`CostModel::network`]), and the expert data-parallel group's for the expert optimizer.
    Profile,
    /// Nothing: the planner takes the plan that moves the fewest bytes.
    Undeclared,
    /// Figures of the caller's (another cluster's, or wrong ones: docs/design.md §4).
    Declared(Network),
}

/// Expert parallelism over the data-parallel ranks (Megatron-LM's and DeepSeek-V3's placement:
/// the EP group is part of the data-parallel group of a stage). Each rank holds `E/ep` experts
/// of every expert stack (`[E/ep, m, n]`, [`ModelDesc::with_expert_parallel`]) in a second
/// optimizer over the expert data-parallel group of `dp / ep` ranks; the dense and the expert
/// optimizer step together with one clip ([`drive::train_shared`], as `muon_optimizers_step`),
/// each on its own comm stream and with its own norm gather over the norm group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertParallel {
    pub ep: usize,
    /// Experts each token is routed to: an expert stack's forward and backward are those of
    /// `tokens · experts_per_token` token-expert pairs spread evenly over the EP group's
    /// experts (balanced routing).
    pub experts_per_token: u64,
}

impl Scenario {
    /// Defaults: the library's layout and ownership (compact, auto), the profile's network
    /// declared, bf16 standard Newton–Schulz, 8192 tokens per GPU, 3 iterations, overlap on.
    pub fn new(model: ModelDesc, dp: usize, hardware: Hardware) -> Self {
        Scenario {
            dp,
            layout: Config::default().muon_layout,
            ownership: Config::default().muon_ownership,
            mxfp8: false,
            ns_precision: NsPrecision::Bf16,
            ns_method: NsMethod::Standard,
            hardware,
            tokens_per_gpu: 8192,
            iterations: 3,
            overlap_grad_reduce: true,
            overlap_param_gather: true,
            bucket_size: 0,
            norm_group: None,
            tp: None,
            grad_dtype: Config::default().grad_dtype,
            adamw_only: false,
            qk_clip: false,
            pipeline: None,
            virtual_stages: 1,
            batch: None,
            attention: attention(&model.name),
            expert_parallel: None,
            plan_network: PlanNetwork::Profile,
            schedule: Schedule::Ours,
            param_sharding: Config::default().param_sharding,
            reshard_after_forward: Config::default().reshard_after_forward,
            param_prefetch_buckets: Config::default().param_prefetch_buckets,
            model,
        }
    }

    /// Micro-batches per iteration (1 without a batch).
    ///
    /// # Errors
    /// `InvalidArgument` when `micro · dp` does not divide the global batch.
    pub fn micro_batches(&self) -> Result<usize> {
        let Some(Batch { global, micro, .. }) = self.batch else {
            return Ok(1);
        };
        let per_step = micro * self.dp as u64;
        if micro == 0 || global == 0 || !global.is_multiple_of(per_step) {
            bail!(
                InvalidArgument,
                "simulate: global batch {global} is not a multiple of micro-batch {micro} x dp {} (>= 1)",
                self.dp
            );
        }
        Ok((global / per_step) as usize)
    }

    /// Tokens each rank processes per iteration: its micro-batches' (or `tokens_per_gpu`).
    pub fn tokens(&self) -> Result<u64> {
        Ok(match self.batch {
            Some(Batch { micro, seq_len, .. }) => self.micro_batches()? as u64 * micro * seq_len,
            None => self.tokens_per_gpu,
        })
    }

    /// The pipeline bubble as a fraction of the ideal compute: `(p − 1) / (m · v)` for `p`
    /// stages, `m` micro-batches and `v` virtual stages (Narayanan et al. 2021, "Efficient
    /// Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", §2.2.1–2.2.2);
    /// 0 without pipeline parallelism, and without a batch (`tokens_per_gpu` names no
    /// micro-batches: the figures from before batches were modelled).
    pub fn pipeline_bubble(&self) -> Result<f64> {
        if self.virtual_stages == 0 || (self.virtual_stages > 1 && self.pipeline.is_none()) {
            bail!(
                InvalidArgument,
                "simulate: {} virtual stages need >= 1 and pipeline parallelism beyond 1",
                self.virtual_stages
            );
        }
        Ok(match self.pipeline {
            Some((stages, _)) if self.batch.is_some() => {
                (stages as f64 - 1.0) / (self.micro_batches()? as f64 * self.virtual_stages as f64)
            }
            _ => 0.0,
        })
    }

    /// The trainer of every simulated rank: its tokens in micro-batches, routed experts,
    /// causal attention and pipeline bubble.
    pub fn trainer(&self) -> Result<Trainer> {
        // Causal attention per token per layer, forward and backward: 3 · T · H · (d_qk + d_v)
        // FLOPs (PaLM, Chowdhery et al. 2022, appendix B: 6·N + 12·L·H·Q·T per token without
        // the causal mask, halved with it, as Megatron-LM's `num_floating_point_operations`
        // does), the same as `6 · params` of T · H · (d_qk + d_v) / 2 params; H / tp heads
        // per tensor-parallel rank.
        let attention_params = match (self.batch, self.attention) {
            (Some(batch), Some(a)) => {
                let heads = a.heads / self.tp.map_or(1, |(ranks, _)| ranks as u64);
                batch.seq_len * heads * (a.qk_head_dim + a.v_head_dim) / 2
            }
            _ => 0,
        };
        Ok(Trainer {
            tokens: self.tokens()?,
            iterations: self.iterations,
            experts_per_token: self.expert_parallel.map(|e| e.experts_per_token),
            micro_batches: self.micro_batches()?,
            attention_params,
            bubble: self.pipeline_bubble()?,
            expert_pieces: match self.schedule {
                Schedule::Megatron => self.local_experts(),
                Schedule::Ours => 1,
            },
            params_after_step: self.schedule == Schedule::Megatron,
        })
    }

    /// Experts of an expert stack on each rank: `E / ep` with expert parallelism, else `E`
    /// (1 without expert stacks).
    fn local_experts(&self) -> u64 {
        let ep = self.expert_parallel.map_or(1, |e| e.ep as u64);
        self.model
            .params
            .iter()
            .find(|p| p.is_expert_stack())
            .map_or(1, |p| p.shape[0] / ep)
    }

    fn config(&self) -> Config {
        Config {
            muon_layout: self.layout,
            muon_ownership: self.ownership,
            muon_ns_precision: self.ns_precision,
            muon_ns_method: self.ns_method,
            mxfp8_param_gather: self.mxfp8,
            overlap_grad_reduce: self.overlap_grad_reduce,
            overlap_param_gather: self.overlap_param_gather,
            bucket_size: self.bucket_size,
            vocab_size: self.model.vocab_size,
            muon_tp_mode: self.tp.map_or(TpMode::Blockwise, |(_, mode)| mode),
            grad_dtype: self.grad_dtype,
            param_sharding: self.param_sharding,
            reshard_after_forward: self.reshard_after_forward,
            param_prefetch_buckets: self.param_prefetch_buckets,
            ..Config::default()
        }
    }
}

/// The result of one simulation.
#[derive(Debug, Clone, Serialize)]
pub struct Simulation {
    pub schema_version: u32,
    pub model: String,
    pub hardware: String,
    pub dp: usize,
    pub layout: String,
    /// `muon_ownership` of the Muon run.
    pub ownership: String,
    pub mxfp8: bool,
    pub ns_precision: String,
    pub ns_method: String,
    /// Whose step ([`Schedule::name`]).
    pub schedule: String,
    pub tokens_per_gpu: u64,
    /// The batch as trained, when given, and the micro-batches per iteration it makes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch: Option<Batch>,
    pub micro_batches: usize,
    /// The pipeline bubble's fraction of the ideal compute (0 without pipeline parallelism).
    pub pipeline_bubble: f64,
    pub iterations: usize,
    pub grad_dtype: String,
    /// Every param on distributed AdamW (the baseline run itself).
    pub adamw_only: bool,
    #[serde(flatten)]
    pub figures: Figures,
    /// `param_sharding` of the run.
    pub param_sharding: String,
    /// The largest per-rank device footprint, by kind, as the cuda backend allocates it for
    /// replicated params.
    pub device_bytes: DeviceBytes,
    /// Sharded: the largest per-rank footprint with the param and gradient buffers replaced by
    /// what the rank owns and the working set of gathered buckets (the plan report's
    /// `sharding`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sharded_device_bytes: Option<u64>,
    /// The profile's device memory, GB, and whether the library's bytes fit in it (the
    /// framework's activations and workspace come on top).
    pub memory_gb: f64,
    pub fits: bool,
    /// The same scenario with every param on distributed AdamW, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adamw_baseline: Option<Overhead>,
    #[serde(skip)]
    pub timelines: Vec<Timeline>,
}

impl Simulation {
    /// The library's bytes on the busiest rank: sharded where params are, else as allocated.
    pub fn rank_bytes(&self) -> u64 {
        self.sharded_device_bytes.unwrap_or(self.device_bytes.total)
    }
}

/// Runs `scenario`.
pub fn simulate(scenario: &Scenario) -> Result<Simulation> {
    if scenario.iterations < 2 {
        bail!(
            OutOfRange,
            "simulate: iterations {} must be >= 2 (the figures compare the last two)",
            scenario.iterations
        );
    }
    if scenario.dp == 0 {
        bail!(OutOfRange, "simulate: dp must be >= 1");
    }
    let setup = rank_optimizers(scenario)?;
    let trainer = scenario.trainer()?;
    let mut programs = Vec::with_capacity(scenario.dp);
    let mut device_bytes = DeviceBytes::default();
    let mut sharded_bytes = 0;
    for rank in 0..scenario.dp {
        let clips = if scenario.qk_clip {
            qk_clip::requests(&setup.optimizers[0].params)
        } else {
            Vec::new()
        };
        let members: Vec<Member<'_>> = setup.optimizers.iter().map(|o| o.member(rank, scenario.dp)).collect();
        let recorded = record_shared(
            &members,
            &setup.order,
            trainer,
            RecordOptions {
                keep_actions: false,
                clips: &clips,
            },
        )?;
        let bytes = DeviceBytes::of(&recorded.allocations);
        // Sharded: the recorded allocations with the param and gradient buffers replaced by the
        // library's sharded storage of the rank (owned ranges and gather window).
        let first = &setup.optimizers[0];
        let storage = StateLayout::new(&first.plan, &first.params, &first.cfg, members[0].rank).memory;
        sharded_bytes = sharded_bytes.max(bytes.total - bytes.params - bytes.grads + storage.param_and_grad_bytes());
        if bytes.total > device_bytes.total {
            device_bytes = bytes;
        }
        programs.push(recorded.items);
    }
    let sharded = setup.optimizers[0].cfg.sharded().then_some(sharded_bytes);
    let cost = &setup.optimizers[0].cost;
    let first = engine::run(programs.clone())?;
    let model = metrics::model_compute(&first[0], scenario.iterations - 1);
    let programs = contend(programs, &first, cost.comm_sm_share());
    let timelines = engine::run(programs)?;
    Ok(Simulation {
        schema_version: crate::SCHEMA_VERSION,
        model: scenario.model.name.clone(),
        hardware: scenario.hardware.name.clone(),
        dp: scenario.dp,
        layout: scenario.layout.name().to_string(),
        ownership: scenario.ownership.name().to_string(),
        mxfp8: scenario.mxfp8,
        ns_precision: scenario.ns_precision.name().to_string(),
        ns_method: scenario.ns_method.name().to_string(),
        schedule: scenario.schedule.name().to_string(),
        tokens_per_gpu: trainer.tokens,
        batch: scenario.batch,
        micro_batches: trainer.micro_batches,
        pipeline_bubble: trainer.bubble,
        iterations: scenario.iterations,
        grad_dtype: scenario.grad_dtype.name().to_string(),
        adamw_only: scenario.adamw_only,
        figures: metrics::figures(&timelines, scenario.iterations, model, &first),
        memory_gb: scenario.hardware.memory_gb,
        param_sharding: scenario.param_sharding.name().to_string(),
        sharded_device_bytes: sharded,
        fits: sharded.unwrap_or(device_bytes.total) as f64 <= scenario.hardware.memory_gb * 1e9,
        device_bytes,
        adamw_baseline: None,
        timelines,
    })
}

/// One optimizer of every simulated rank: its params, plan, config and cost model.
#[derive(Debug, Clone)]
pub struct RankOptimizer {
    pub params: Vec<ParamSpec>,
    pub plan: Plan,
    pub cfg: Config,
    pub cost: CostModel,
}

impl RankOptimizer {
    /// Rank `rank` (of `dp`)'s member: its place in this optimizer's data-parallel group, whose
    /// ranks are `dp / group` apart (an expert data-parallel group takes one rank of each EP
    /// group).
    pub fn member(&self, rank: usize, dp: usize) -> Member<'_> {
        Member {
            plan: &self.plan,
            params: &self.params,
            cfg: &self.cfg,
            cost: self.cost.clone(),
            rank: rank * self.plan.dp as usize / dp,
        }
    }
}

/// The optimizers of a simulated rank and the model's params in forward order as (optimizer,
/// param of its plan).
#[derive(Debug, Clone)]
pub struct RankSetup {
    /// The dense optimizer (every param without expert parallelism), then the expert one.
    pub optimizers: Vec<RankOptimizer>,
    pub order: Vec<(usize, usize)>,
}

/// The params each simulated rank holds (its pipeline stage, tensor- and expert-parallel
/// shards, MXFP8 or AdamW flags) and the optimizers they go to: the data-parallel group's
/// dense optimizer and, with expert parallelism, the expert optimizer over the expert
/// data-parallel group (the same config and norm group).
///
/// # Errors
/// `InvalidArgument` when the layout does not split the model or `ep` is not `dp`: the engine
/// meets every collective over the simulated data-parallel group, so an expert data-parallel
/// group of several ranks is not modelled.
pub fn rank_optimizers(scenario: &Scenario) -> Result<RankSetup> {
    let cfg = scenario.config();
    let mut model = scenario.model.clone();
    if let Some((stages, stage)) = scenario.pipeline {
        model = model.pipeline_stage(stages, stage)?;
    }
    if let Some((ranks, _)) = scenario.tp {
        model = model.with_tensor_parallel(ranks)?;
    }
    let mut groups = vec![scenario.dp];
    if let Some(ExpertParallel { ep, .. }) = scenario.expert_parallel {
        if ep != scenario.dp {
            bail!(
                InvalidArgument,
                "simulate: ep {ep} with dp {}: only ep = dp (an expert data-parallel group of one rank) is modelled",
                scenario.dp
            );
        }
        model = model.with_expert_parallel(ep)?;
        groups.push(scenario.dp / ep);
    }
    if scenario.schedule == Schedule::Megatron {
        model = megatron::split_expert_stacks(&model)?;
    }
    if scenario.mxfp8 || scenario.adamw_only {
        let registry = model.registry(&cfg)?;
        let routes = registry.routes().to_vec();
        for (spec, route) in model.params.iter_mut().zip(&routes) {
            let (rows, cols) = spec.flat_2d();
            if scenario.mxfp8 && *route == Route::Muon && rows % 32 == 0 && cols % 32 == 0 {
                spec.flags = ParamFlags(spec.flags.0 | ParamFlags::MXFP8);
            }
            if scenario.adamw_only {
                // AdamW is element-wise: a fused matrix's split means nothing to it.
                let whole = ParamSpec::new(spec.name.clone(), &spec.shape, spec.dtype);
                spec.split_sizes = whole.split_sizes;
                spec.split_groups = whole.split_groups;
                spec.flags = ParamFlags(spec.flags.0 | ParamFlags::NO_MUON);
            }
        }
    }
    let costs: Vec<CostModel> = groups
        .iter()
        .map(|&dp| {
            let mut cost = CostModel::new(scenario.hardware.clone(), dp);
            if let Some(ranks) = scenario.norm_group {
                cost = cost.with_norm_group(ranks);
            }
            if let Some((ranks, _)) = scenario.tp {
                cost = cost.with_tp_group(ranks);
            }
            cost
        })
        .collect();
    let cfg = Config {
        network: match scenario.plan_network {
            PlanNetwork::Profile => Some(costs[0].network()),
            PlanNetwork::Undeclared => None,
            PlanNetwork::Declared(network) => Some(network),
        },
        expert_network: match (scenario.plan_network, costs.get(1)) {
            (PlanNetwork::Profile, Some(expert)) => Some(expert.network()),
            _ => None,
        },
        ..cfg
    };
    let experts = scenario.expert_parallel.is_some();
    let mut parts: Vec<Vec<ParamSpec>> = vec![Vec::new(); groups.len()];
    let mut order = Vec::with_capacity(model.params.len());
    for spec in model.params {
        let k = usize::from(experts && spec.is_expert_stack());
        order.push((k, parts[k].len()));
        parts[k].push(spec);
    }
    let mut optimizers = Vec::with_capacity(groups.len());
    for ((params, dp), cost) in parts.into_iter().zip(groups).zip(costs) {
        let desc = ModelDesc {
            name: scenario.model.name.clone(),
            vocab_size: scenario.model.vocab_size,
            params,
        };
        let registry = desc.registry(&cfg)?;
        let plan = build_plan(registry.params(), registry.routes(), &cfg, dp)?;
        optimizers.push(RankOptimizer {
            params: registry.params().to_vec(),
            plan,
            cfg: cfg.clone(),
            cost,
        });
    }
    Ok(RankSetup { optimizers, order })
}

/// What Muon adds to an iteration over distributed AdamW on the same scenario.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Overhead {
    pub adamw_iteration_ms: f64,
    /// `iteration_muon − iteration_adamw`.
    pub difference_ms: f64,
    /// `iteration_muon / iteration_adamw − 1`.
    pub muon_overhead: f64,
    /// The busiest rank's Newton–Schulz ms (the Muon run's).
    pub newton_schulz_ms: f64,
    /// `difference_ms / newton_schulz_ms`: 1 when Muon costs exactly its Newton–Schulz.
    pub difference_over_newton_schulz: f64,
    /// The baseline's exposed optimizer ms and device bytes per rank.
    pub adamw_exposed_ms: f64,
    pub adamw_device_bytes: u64,
}

/// `scenario` and its AdamW baseline (the same scenario with `adamw_only`): the Muon run with
/// `adamw_baseline` filled.
pub fn simulate_against_adamw(scenario: &Scenario) -> Result<Simulation> {
    let adamw = simulate_adamw_baseline(scenario)?;
    Ok(with_baseline(simulate(scenario)?, &adamw))
}

/// The same scenario with every param on distributed AdamW (it has no Muon owners, so neither
/// the Muon layout nor the ownership changes it).
pub fn simulate_adamw_baseline(scenario: &Scenario) -> Result<Simulation> {
    simulate(&Scenario {
        adamw_only: true,
        ..scenario.clone()
    })
}

/// `muon` with `adamw_baseline` filled from the baseline run `adamw`.
pub fn with_baseline(mut muon: Simulation, adamw: &Simulation) -> Simulation {
    let (m, a) = (&muon.figures, &adamw.figures);
    let difference = m.iteration_ms - a.iteration_ms;
    muon.adamw_baseline = Some(Overhead {
        adamw_iteration_ms: a.iteration_ms,
        difference_ms: difference,
        muon_overhead: m.iteration_ms / a.iteration_ms - 1.0,
        newton_schulz_ms: m.newton_schulz_ms,
        difference_over_newton_schulz: if m.newton_schulz_ms > 0.0 {
            difference / m.newton_schulz_ms
        } else {
            f64::NAN
        },
        adamw_exposed_ms: a.exposed_ms,
        adamw_device_bytes: adamw.rank_bytes(),
    });
    muon
}

/// `scenario` under balanced and contiguous ownership (balanced only where the layout takes
/// no other, [`MuonLayout::takes_contiguous_ownership`]), each against the AdamW baseline run
/// `adamw` when given ([`simulate_adamw_baseline`]): the run with the shortest iteration,
/// balanced on a tie. What `muon-opt simulate --ownership auto` finds fastest on the modelled
/// cluster, and how the named jobs choose; the library's `auto` is one of these two runs,
/// chosen by the planner's model instead (`tests/sim_model.rs` holds it within 1 %).
pub fn simulate_best_ownership(scenario: &Scenario, adamw: Option<&Simulation>) -> Result<Simulation> {
    let mut best: Option<Simulation> = None;
    for ownership in [MuonOwnership::Balanced, MuonOwnership::Contiguous] {
        if ownership == MuonOwnership::Contiguous && !scenario.layout.takes_contiguous_ownership() {
            continue;
        }
        let mut sim = simulate(&Scenario {
            ownership,
            ..scenario.clone()
        })?;
        if let Some(adamw) = adamw {
            sim = with_baseline(sim, adamw);
        }
        if best
            .as_ref()
            .is_none_or(|b| sim.figures.iteration_ms < b.figures.iteration_ms)
        {
            best = Some(sim);
        }
    }
    Ok(best.expect("balanced takes every layout"))
}

/// SM contention, one fixed-point step: every optimizer item on the compute stream grows by the
/// part of it that overlapped a collective of its rank in `timelines` (the run without
/// contention), which runs at `1 − share` of full speed: `d · (1 + f·share / (1 − share))` for
/// an overlapped fraction `f`. The modelled forward and backward are not stretched: their
/// `model_efficiency` is an end-to-end MFU measured with the training's collectives running,
/// so it already contains what those take from them.
fn contend(mut programs: Vec<Vec<Item>>, timelines: &[Timeline], share: f64) -> Vec<Vec<Item>> {
    for (program, timeline) in programs.iter_mut().zip(timelines) {
        let mut collectives: Vec<(f64, f64)> = timeline
            .slices
            .iter()
            .filter(|s| s.class == Class::Collective)
            .map(|s| (s.start, s.end))
            .collect();
        collectives.sort_by(|a, b| a.0.total_cmp(&b.0));
        // Items that make a stream node correspond, in order, to the timeline's slices.
        let mut slices = timeline.slices.iter();
        for item in program.iter_mut() {
            let slice = match item {
                Item::Work { .. } | Item::Collective { .. } | Item::Record { .. } | Item::Wait { .. } => slices.next(),
                _ => None,
            };
            if let (
                Item::Work {
                    stream: StreamKind::Compute,
                    class: Class::Optimizer,
                    device,
                    ..
                },
                Some(s),
            ) = (item, slice)
                && s.end > s.start
            {
                let f = metrics::covered(s.start, s.end, &collectives) / (s.end - s.start);
                *device *= 1.0 + f * share / (1.0 - share);
            }
        }
    }
    programs
}

//! The plan report: memory, padding, Newton–Schulz balance and communication volume.
//!
//! # Communication cost model
//!
//! Bytes on the wire per step per rank follow NCCL's bus-bandwidth model of ring algorithms
//! (the "busbw" of `nccl-tests`): the volume is what crosses the busiest link, which for a
//! ring is what every rank sends. For a collective over S bytes on `dp` ranks:
//!
//! | collective      | bytes per rank        |
//! |-----------------|-----------------------|
//! | reduce          | S (pipelined chain ending at the root: every link carries S) |
//! | broadcast       | S (pipelined chain starting at the root) |
//! | reduce-scatter  | (dp−1)/dp · S         |
//! | all-gather      | (dp−1)/dp · S         |
//! | all-reduce      | 2·(dp−1)/dp · S       |
//!
//! and nothing at dp = 1. Per layout, summed over buckets (grad bytes per element from
//! `grad_dtype`, param bytes from the buffer dtype):
//! - `compact_rooted` Muon: reduce of every owner range to its owner, broadcast of it back;
//! - `compact` Muon: shard buckets (groups, `groups.rs`) like `padded`, rooted ones like
//!   `compact_rooted`;
//! - `allreduce` Muon: all-reduce of the whole bucket's grads, broadcast of every owner range;
//! - `padded` Muon and every AdamW bucket: reduce-scatter of grads, all-gather of params over
//!   the padded bucket.
//!
//! The lower bound is a reduce-scatter plus all-gather of the unpadded elements,
//! `(dp−1)/dp · Σ numel · (grad bytes + param bytes)`; rooted buckets come within `dp/(dp−1)`
//! of it (a reduce moves all of S per link where reduce-scatter moves (dp−1)/dp of it).
//!
//! # Gradient wait
//!
//! Grouping trades bytes for overlap: a bucket's gradient collective starts when its last
//! gradient is ready, so a gradient waits for every param of its bucket that comes later in
//! backward. `grad_wait_fraction` is that wait, in elements of backward (all params walked in
//! reverse registration order), averaged over every element and divided by the model's
//! elements: 0 would be a collective per param as its gradient lands.

use crate::config::{Config, Dtype, MuonLayout};
use crate::model::{ParamSpec, Route};

use super::Layout;
use super::choice::Choice;
use super::cost::NsLoads;
use super::ownership::OwnershipMethod;
use super::queries::shard_pieces;
use super::sharding::ShardingBytes;
use super::types::BucketSplit;

/// Muon: fp32 momentum (half of it with `muon_momentum_dtype = bf16`).
pub const MUON_MOMENT_BYTES_PER_ELEMENT: u64 = 4;
/// NorMuon and AdaMuon (`muon_variant` normuon, adamuon): one fp32 per second-moment value of
/// a unit ([`ParamSpec::moment2_values`]).
pub const MUON_MOMENT2_BYTES_PER_VALUE: u64 = 4;
/// AdamW: fp32 m + v.
pub const ADAMW_MOMENT_BYTES_PER_ELEMENT: u64 = 8;
/// The fp32 master of a param that is not f32 (an f32 param is its own master).
pub const MASTER_BYTES_PER_ELEMENT: u64 = 4;

/// Optimizer-state bytes per element of `spec` with `moment_bytes` of moments.
fn state_bytes_per_element(spec: &ParamSpec, moment_bytes: u64) -> u64 {
    let master = if spec.dtype == Dtype::F32 {
        0
    } else {
        MASTER_BYTES_PER_ELEMENT
    };
    moment_bytes + master
}

/// A per-rank quantity with its maximum and mean.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RankStats<T> {
    pub max: T,
    pub mean: f64,
    pub per_rank: Vec<T>,
}

impl RankStats<u64> {
    fn of(per_rank: Vec<u64>) -> Self {
        let max = per_rank.iter().copied().max().unwrap_or(0);
        let mean = per_rank.iter().sum::<u64>() as f64 / per_rank.len() as f64;
        RankStats { max, mean, per_rank }
    }
}

impl RankStats<f64> {
    fn of(per_rank: Vec<f64>) -> Self {
        let max = per_rank.iter().copied().fold(0.0, f64::max);
        let mean = per_rank.iter().sum::<f64>() / per_rank.len() as f64;
        RankStats { max, mean, per_rank }
    }
}

/// Elements per route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RouteElements {
    pub muon: u64,
    pub adamw: u64,
}

/// A collective as the report counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Collective {
    /// One reduce per owner range, to its owner.
    Reduce,
    /// One broadcast per owner range, from its owner.
    Broadcast,
    ReduceScatter,
    AllGather,
    AllReduce,
}

/// The bytes one bucket sends per rank per step, by collective (module docs).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BucketTraffic {
    pub bucket: u32,
    pub grad_collective: Collective,
    pub grad_bytes_per_rank: f64,
    pub param_collective: Collective,
    pub param_bytes_per_rank: f64,
}

/// Bytes per rank per step by collective, over every bucket.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CollectiveMix {
    pub reduce: f64,
    pub broadcast: f64,
    pub reduce_scatter: f64,
    pub all_gather: f64,
    pub all_reduce: f64,
}

impl CollectiveMix {
    fn add(&mut self, collective: Collective, bytes: f64) {
        let slot = match collective {
            Collective::Reduce => &mut self.reduce,
            Collective::Broadcast => &mut self.broadcast,
            Collective::ReduceScatter => &mut self.reduce_scatter,
            Collective::AllGather => &mut self.all_gather,
            Collective::AllReduce => &mut self.all_reduce,
        };
        *slot += bytes;
    }

    /// Every byte, whatever the collective.
    pub fn total(&self) -> f64 {
        self.reduce + self.broadcast + self.reduce_scatter + self.all_gather + self.all_reduce
    }
}

/// What a plan costs, for one layout mode.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Report {
    pub layout: MuonLayout,
    pub dp: u32,
    pub ownership: OwnershipMethod,
    pub num_params: u32,
    /// Unpadded elements per route.
    pub elements: RouteElements,
    pub num_buckets: u32,
    /// Buffer elements that hold no param (alignment, shard and bucket-end padding).
    pub padding_elements: u64,
    /// `padding_elements` over the unpadded element count.
    pub padding_fraction: f64,
    pub param_buffer_bytes: u64,
    pub grad_buffer_bytes: u64,
    /// Muon elements owned per rank (the memory cap is 1.3 × the mean).
    pub muon_elements: RankStats<u64>,
    /// Optimizer state per rank: 4 B per owned Muon element, 8 B per AdamW shard element, and
    /// 4 B more per element of a param that is not f32 (its fp32 master); with NorMuon 4 B per
    /// line of every owned Muon matrix's components (their longer sides).
    pub optimizer_state_bytes: RankStats<u64>,
    /// Persistent param and gradient bytes per rank and the peak working set of gathered
    /// buckets, replicated and sharded (`sharding.rs`), for the config's sharding policy.
    pub sharding: ShardingBytes,
    /// Newton–Schulz cost per rank, `T·(4m²n + 2m³)` summed over owned matrices.
    pub ns_cost: RankStats<f64>,
    /// `max(total / dp, largest unit)`.
    pub ns_lower_bound: f64,
    pub ns_makespan_over_lower_bound: f64,
    /// Bytes each rank sends per step (see the module docs for the model).
    pub wire_bytes_per_rank: f64,
    pub wire_lower_bound_bytes: f64,
    pub wire_over_lower_bound: f64,
    /// `wire_bytes_per_rank` by collective.
    pub collective_mix: CollectiveMix,
    /// Every bucket's collectives and bytes, in bucket order.
    pub traffic: Vec<BucketTraffic>,
    /// How long a gradient waits for the rest of its bucket, as a fraction of backward (module
    /// docs).
    pub grad_wait_fraction: f64,
    /// What the planner chose among (group window, ownership) and why: every candidate's bytes
    /// and, on a declared network, its modelled exposed time (`choice.rs`).
    pub choice: Choice,
    /// Wall time of `build_plan`; the only field that differs between runs, so it is not
    /// part of the JSON (the plan command shows it with `--timing`).
    #[serde(skip)]
    pub planning_time_ms: f64,
}

/// `value / bound`, or 1 when both are zero.
fn ratio(value: f64, bound: f64) -> f64 {
    if bound > 0.0 { value / bound } else { 1.0 }
}

impl Report {
    pub(crate) fn of(
        params: &[ParamSpec],
        cfg: &Config,
        dp: usize,
        layout: &Layout,
        ownership: OwnershipMethod,
    ) -> Report {
        let mut elements = RouteElements { muon: 0, adamw: 0 };
        let mut muon_elements = vec![0u64; dp];
        let mut state = vec![0u64; dp];
        for (spec, placement) in params.iter().zip(&layout.params) {
            match placement.route {
                Route::Muon => elements.muon += spec.numel(),
                Route::Adamw => elements.adamw += spec.numel(),
            }
            let momentum = MUON_MOMENT_BYTES_PER_ELEMENT * cfg.muon_momentum_dtype.size() as u64 / 4;
            let per_element = state_bytes_per_element(spec, momentum);
            let moment2 = match placement.route {
                Route::Muon => spec.moment2_values(cfg.muon_variant) * MUON_MOMENT2_BYTES_PER_VALUE,
                Route::Adamw => 0,
            };
            for &r in &placement.unit_owners {
                muon_elements[r as usize] += placement.unit_numel;
                state[r as usize] += placement.unit_numel * per_element + moment2;
            }
        }
        for bucket in layout.buckets.iter().filter(|b| b.route == Route::Adamw) {
            for &p in &bucket.params {
                let per_element = state_bytes_per_element(&params[p as usize], ADAMW_MOMENT_BYTES_PER_ELEMENT);
                for (rank, piece) in shard_pieces(bucket, p, &layout.params[p as usize]) {
                    state[rank] += piece.param_range.len() * per_element;
                }
            }
        }
        let sharding = ShardingBytes::of(params, cfg, dp, layout, &state);
        let ns = NsLoads::of(params, &layout.params, dp, cfg.muon_num_ns_steps);
        let ns_lower_bound = (ns.total as f64 / dp as f64).max(ns.largest as f64);
        let makespan = ns.makespan as f64;
        let unpadded = elements.muon + elements.adamw;
        let buffer_numel: u64 = layout.buffers.iter().map(|b| b.numel).sum();
        let padding_elements = buffer_numel - unpadded;
        let traffic = bucket_traffic(cfg, dp, layout);
        let mut collective_mix = CollectiveMix::default();
        for t in &traffic {
            collective_mix.add(t.grad_collective, t.grad_bytes_per_rank);
            collective_mix.add(t.param_collective, t.param_bytes_per_rank);
        }
        let wire = collective_mix.total();
        let wire_lower_bound = wire_lower_bound(params, cfg, dp);
        Report {
            layout: cfg.muon_layout,
            dp: dp as u32,
            ownership,
            num_params: params.len() as u32,
            elements,
            num_buckets: layout.buckets.len() as u32,
            padding_elements,
            padding_fraction: padding_elements as f64 / unpadded as f64,
            param_buffer_bytes: layout
                .buffers
                .iter()
                .map(|b| b.param_numel * b.dtype.size() as u64)
                .sum(),
            grad_buffer_bytes: buffer_numel * cfg.grad_dtype.size() as u64,
            muon_elements: RankStats::<u64>::of(muon_elements),
            optimizer_state_bytes: RankStats::<u64>::of(state),
            sharding,
            ns_cost: RankStats::<f64>::of(ns.per_rank.into_iter().map(|c| c as f64).collect()),
            ns_lower_bound,
            ns_makespan_over_lower_bound: ratio(makespan, ns_lower_bound),
            wire_bytes_per_rank: wire,
            wire_lower_bound_bytes: wire_lower_bound,
            wire_over_lower_bound: ratio(wire, wire_lower_bound),
            collective_mix,
            traffic,
            grad_wait_fraction: grad_wait_fraction(params, layout),
            choice: Choice::default(),
            planning_time_ms: 0.0,
        }
    }
}

/// The bytes each rank sends per step under `layout` (module docs).
pub(crate) fn wire_bytes_per_rank(cfg: &Config, dp: usize, layout: &Layout) -> f64 {
    bucket_traffic(cfg, dp, layout)
        .iter()
        .map(|t| t.grad_bytes_per_rank + t.param_bytes_per_rank)
        .sum()
}

/// Every bucket's collectives and the bytes each rank sends in them (module docs).
fn bucket_traffic(cfg: &Config, dp: usize, layout: &Layout) -> Vec<BucketTraffic> {
    let share = if dp == 1 { 0.0 } else { (dp - 1) as f64 / dp as f64 };
    let rooted = if dp == 1 { 0.0 } else { 1.0 };
    let grad = cfg.grad_dtype.size() as f64;
    layout
        .buckets
        .iter()
        .map(|bucket| {
            let param = bucket.dtype.size() as f64;
            let numel = bucket.numel() as f64;
            let (grad_collective, grad_bytes, param_collective, param_bytes) = match &bucket.split {
                BucketSplit::EqualShards { .. } => (
                    Collective::ReduceScatter,
                    share * numel * grad,
                    Collective::AllGather,
                    share * numel * param,
                ),
                BucketSplit::OwnerRanges(ranges) => {
                    let owned = rooted * ranges.iter().map(|r| r.len()).sum::<u64>() as f64;
                    let (kind, bytes) = if cfg.muon_layout == MuonLayout::Allreduce {
                        (Collective::AllReduce, 2.0 * share * numel * grad)
                    } else {
                        (Collective::Reduce, owned * grad)
                    };
                    (kind, bytes, Collective::Broadcast, owned * param)
                }
            };
            BucketTraffic {
                bucket: bucket.id,
                grad_collective,
                grad_bytes_per_rank: grad_bytes,
                param_collective,
                param_bytes_per_rank: param_bytes,
            }
        })
        .collect()
}

/// The module docs' gradient wait.
fn grad_wait_fraction(params: &[ParamSpec], layout: &Layout) -> f64 {
    let mut ready = vec![0u64; params.len()];
    let mut position = 0u64;
    for (p, spec) in params.iter().enumerate().rev() {
        position += spec.numel();
        ready[p] = position;
    }
    let total = position as f64;
    let waited: f64 = layout
        .buckets
        .iter()
        .map(|bucket| {
            let complete = bucket.params.iter().map(|&p| ready[p as usize]).max().unwrap_or(0);
            bucket
                .params
                .iter()
                .map(|&p| params[p as usize].numel() as f64 * (complete - ready[p as usize]) as f64)
                .sum::<f64>()
        })
        .sum();
    if total > 0.0 { waited / (total * total) } else { 0.0 }
}

/// Reduce-scatter plus all-gather of the unpadded elements.
fn wire_lower_bound(params: &[ParamSpec], cfg: &Config, dp: usize) -> f64 {
    let share = (dp - 1) as f64 / dp as f64;
    let grad = cfg.grad_dtype.size() as f64;
    params
        .iter()
        .map(|p| share * p.numel() as f64 * (grad + p.dtype.size() as f64))
        .sum()
}

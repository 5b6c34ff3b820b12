//! The planner (docs/design.md §4): a pure, deterministic function from the registered
//! params, their routes, the config and dp to the layout of every buffer and bucket and the
//! owner of every Muon matrix and AdamW shard. Buffers, collectives and checkpoints all read
//! the [`Plan`]; every rank computes the same plan and compares [`Plan::hash`].
//!
//! - **Buffers**: one per (route, dtype, staged), Muon buffers first, then AdamW, each by dtype
//!   code, the params staged on the grad buffer (MXFP8 with `mxfp8_param_gather`) in a buffer of
//!   their own so that a bucket is gathered by one collective over exactly its bytes.
//! - **Buckets**: params walked in reverse registration order (backward order), each starting
//!   64-aligned; a bucket closes once it spans `cfg.effective_bucket_size(dp)` elements (one
//!   bucket per buffer when `overlap_grad_reduce` is off). Bucket ids are global: buffers in
//!   order, buckets of a buffer in backward order.
//! - **AdamW buckets** (`adamw.rs`): equal shards, bucket end padded to `lcm(dp, 128)`.
//! - **Muon buckets**: `compact` and `allreduce` (`ownership.rs`, `compact.rs`): each rank's
//!   owned elements in a bucket form one contiguous range; `padded` (`padded.rs`): Megatron-LM's
//!   shard-aligned layer-wise layout.
//! - **Choice** (`choice.rs`): compact's group window and, under `muon_ownership = auto`, the
//!   ownership, among candidates laid out in full: the fewest bytes with no network declared,
//!   else the least modelled exposed time on the declared ring (`network.rs`: the ring formula
//!   the simulator prices collectives with).
//! - **Report** ([`Report`], with the communication cost model) and **hash** (FNV-1a over a
//!   canonical encoding, `hash.rs`).
//! - Models to plan without a framework: the [`presets`] (the `muon-opt` tools, the simulator,
//!   the tests and benches).

mod adamw;
mod buckets;
mod choice;
mod compact;
mod contiguous;
mod cost;
mod groups;
pub(crate) mod hash;
pub mod network;
mod ownership;
mod padded;
pub mod presets;
mod queries;
mod rebalance;
mod report;
mod sharding;
mod types;

use std::cell::OnceCell;
use std::collections::BTreeSet;
use std::time::Instant;

use crate::bail;
use crate::config::{Config, MuonLayout, MuonOwnership};
use crate::error::Result;
use crate::model::{ParamSpec, Route};

pub use choice::{Alternative, Choice, EXPOSURE_COMPUTE_OVER_GATHER};
pub use groups::GroupWindow;
pub use ownership::OwnershipMethod;
pub use queries::{AdamwShard, OwnedUnit, ShardPiece};
pub use report::{
    ADAMW_MOMENT_BYTES_PER_ELEMENT, BucketTraffic, Collective, CollectiveMix, MASTER_BYTES_PER_ELEMENT,
    MUON_MOMENT_BYTES_PER_ELEMENT, RankStats, Report, RouteElements,
};
pub use sharding::{ModeBytes, ShardingBytes};
pub use types::{Bucket, BucketSplit, Buffer, ElemRange, ParamPlacement, Plan, forward_order};

use buckets::{BufferGroup, BufferKey, backward_chunks, group_buffers};
use cost::NsLoads;
use groups::{CompactBucket, CompactBuffer, Grouping};
use presets::ModelDesc;
use report::wire_bytes_per_rank;

/// The layout part of a plan, before the report and hash are added.
pub(crate) struct Layout {
    pub buffers: Vec<Buffer>,
    pub buckets: Vec<Bucket>,
    pub params: Vec<ParamPlacement>,
}

/// Plans the layout of `params` (registration order, routed by `routes`) for `dp` ranks.
///
/// Errors: `OutOfRange` for dp 0, `InvalidState` without params, `InvalidArgument` when
/// `routes` does not match `params` or a Muon-routed param is not a matrix or expert stack,
/// and the param and config validation errors.
pub fn build_plan(params: &[ParamSpec], routes: &[Route], cfg: &Config, dp: usize) -> Result<Plan> {
    let started = Instant::now();
    check_inputs(params, routes, cfg, dp)?;
    let chosen = choice::choose(params, routes, cfg, dp)?;
    let layout = chosen.layout;
    let mut report = Report::of(params, cfg, dp, &layout, chosen.method);
    report.choice = chosen.choice;
    let hash = hash::plan_hash(params, routes, cfg, dp, &layout);
    report.planning_time_ms = started.elapsed().as_secs_f64() * 1e3;
    Ok(Plan {
        dp: dp as u32,
        layout: cfg.muon_layout,
        buffers: layout.buffers,
        buckets: layout.buckets,
        params: layout.params,
        hash,
        report,
    })
}

/// Lays out a plan of one ownership and (`compact`, balanced) group window: see
/// [`lay_out_grouped`] and [`lay_out_contiguous`]; padded keeps Megatron-LM's owners.
/// `byte_ceiling`: with no network declared, Megatron-LM's bytes, beyond which `compact`
/// searches a balanced plan harder ([`lay_out_grouped`]).
pub(crate) fn lay_out_with(
    params: &[ParamSpec],
    routes: &[Route],
    cfg: &Config,
    dp: usize,
    ownership: MuonOwnership,
    window: GroupWindow,
    byte_ceiling: Option<&MegatronBytes>,
) -> Result<(Layout, OwnershipMethod)> {
    match (cfg.muon_layout, ownership) {
        (MuonLayout::Padded, _) => lay_out(params, routes, cfg, dp, Grouping::Nothing, window, &BTreeSet::new()),
        (_, MuonOwnership::Contiguous) => lay_out_contiguous(params, routes, cfg, dp),
        (MuonLayout::Compact, _) if window != GroupWindow::Rooted => {
            lay_out_grouped(params, routes, cfg, dp, window, byte_ceiling)
        }
        _ => lay_out(params, routes, cfg, dp, Grouping::Nothing, window, &BTreeSet::new()),
    }
}

/// What Megatron-LM's layout (`padded`) of the same params moves per rank, laid out once and
/// only when asked: with no network declared, `compact` searches harder for a balanced plan
/// that moves no more (docs/design.md §4).
pub(crate) struct MegatronBytes<'a> {
    params: &'a [ParamSpec],
    routes: &'a [Route],
    cfg: &'a Config,
    dp: usize,
    bytes: OnceCell<f64>,
}

impl<'a> MegatronBytes<'a> {
    pub(crate) fn new(params: &'a [ParamSpec], routes: &'a [Route], cfg: &'a Config, dp: usize) -> Self {
        MegatronBytes {
            params,
            routes,
            cfg,
            dp,
            bytes: OnceCell::new(),
        }
    }

    fn get(&self) -> Result<f64> {
        if let Some(&bytes) = self.bytes.get() {
            return Ok(bytes);
        }
        let padded = Config {
            muon_layout: MuonLayout::Padded,
            ..self.cfg.clone()
        };
        let none = BTreeSet::new();
        let (layout, _) = lay_out(
            self.params,
            self.routes,
            &padded,
            self.dp,
            Grouping::Nothing,
            GroupWindow::Rooted,
            &none,
        )?;
        let bytes = wire_bytes_per_rank(&padded, self.dp, &layout);
        Ok(*self.bytes.get_or_init(|| bytes))
    }
}

/// Lays out the `compact` mode with group window `window`: groups of stacks and matrices,
/// unless grouping unbalances Newton–Schulz (see [`NS_TOLERANCE`]) or breaks the ownership
/// guarantee (`ownership.rs`); then groups of matrices only. Groups give every rank the same
/// work, so they unbalance a plan only when the rooted rest is too coarse to even out
/// (llama3-8b at dp 6: 32 of each matrix class leave two of each rooted, two fused MLP
/// matrices among six ranks). If neither balances, the fewest grouped params are released to
/// the rooted rest, cheapest Newton–Schulz first (they save the fewest bytes grouped and fill
/// the gaps best), until it balances; releasing every group is the all-rooted plan.
///
/// With `byte_ceiling` (no network declared), where the balanced plan moves more bytes than
/// Megatron-LM's layout, the fewest-bytes grouping is laid out once more with matrices
/// exchanged between the ranks' shards of a bucket (the same elements each way, so the same
/// bytes: `rebalance.rs`) and taken if that balances: gpt2-124m at dp 5, whose groups and
/// packed leftovers leave one rank a QKV above the tolerance until a QKV and a projection
/// trade places with an MLP matrix of another rank's shard.
fn lay_out_grouped(
    params: &[ParamSpec],
    routes: &[Route],
    cfg: &Config,
    dp: usize,
    window: GroupWindow,
    byte_ceiling: Option<&MegatronBytes>,
) -> Result<(Layout, OwnershipMethod)> {
    let steps = cfg.muon_num_ns_steps;
    let none = BTreeSet::new();
    let rooted = lay_out(params, routes, cfg, dp, Grouping::Nothing, window, &none)?;
    let limit = NsLoads::of(params, &rooted.0.params, dp, steps).makespan as f64 * (1.0 + NS_TOLERANCE);
    let balanced = |candidate: &(Layout, OwnershipMethod)| {
        let loads = NsLoads::of(params, &candidate.0.params, dp, steps);
        loads.makespan as f64 <= limit && loads.within_guarantee(dp)
    };
    let bytes = |c: &(Layout, OwnershipMethod)| wire_bytes_per_rank(cfg, dp, &c.0);
    let everything = lay_out(params, routes, cfg, dp, Grouping::Everything, window, &none)?;
    if balanced(&everything) {
        return Ok(everything);
    }
    let matrices = lay_out(params, routes, cfg, dp, Grouping::MatricesOnly, window, &none)?;
    if balanced(&matrices) {
        return Ok(matrices);
    }
    let released = fewest_released_that_balance(params, routes, cfg, dp, window, &everything.0, &balanced)?;
    let balanced_plan = match released {
        Some(plan) if bytes(&plan) < bytes(&rooted) => plan,
        _ => rooted,
    };
    let ceiling = match byte_ceiling {
        Some(megatron) => megatron.get()?,
        None => return Ok(balanced_plan),
    };
    if bytes(&balanced_plan) <= ceiling {
        return Ok(balanced_plan);
    }
    // Balance costs more bytes than Megatron-LM's layout moves: the fewest-bytes grouping with
    // matrices exchanged between its shards to even out Newton–Schulz (`rebalance.rs`).
    let exchanged = lay_out_shards(params, routes, cfg, dp, Grouping::Everything, window, &none, true)?;
    Ok(if balanced(&exchanged) && bytes(&exchanged) < bytes(&balanced_plan) {
        exchanged
    } else {
        balanced_plan
    })
}

/// The fewest grouped params released to the rooted rest (in [`release_order`]) that make the
/// plan `balanced`: doubling, then bisection between the last count that did not balance and
/// the first that did; `None` if releasing every one does not.
fn fewest_released_that_balance(
    params: &[ParamSpec],
    routes: &[Route],
    cfg: &Config,
    dp: usize,
    window: GroupWindow,
    everything: &Layout,
    balanced: &dyn Fn(&(Layout, OwnershipMethod)) -> bool,
) -> Result<Option<(Layout, OwnershipMethod)>> {
    let order = release_order(params, everything, cfg.muon_num_ns_steps);
    let release = |n: usize| {
        let released: BTreeSet<u32> = order[..n].iter().copied().collect();
        lay_out(params, routes, cfg, dp, Grouping::Everything, window, &released)
    };
    let (mut failed, mut passed) = (0, None);
    let mut n = 1;
    while passed.is_none() && failed < order.len() {
        n = n.min(order.len());
        let candidate = release(n)?;
        if balanced(&candidate) {
            passed = Some((n, candidate));
        } else {
            failed = n;
            n *= 2;
        }
    }
    let Some((mut enough, mut best)) = passed else {
        return Ok(None);
    };
    while enough - failed > 1 {
        let mid = (failed + enough) / 2;
        let candidate = release(mid)?;
        if balanced(&candidate) {
            (enough, best) = (mid, candidate);
        } else {
            failed = mid;
        }
    }
    Ok(Some(best))
}

/// The grouped Muon params of a compact layout (those in equal-shard buckets), cheapest
/// Newton–Schulz unit first (ties: registration order): the order they are released in.
fn release_order(params: &[ParamSpec], layout: &Layout, steps: u32) -> Vec<u32> {
    let mut grouped: Vec<u32> = layout
        .buckets
        .iter()
        .filter(|b| b.route == Route::Muon && matches!(b.split, BucketSplit::EqualShards { .. }))
        .flat_map(|b| b.params.iter().copied())
        .collect();
    grouped.sort_by_key(|&p| (cost::ns_unit_cost(&params[p as usize], steps), p));
    grouped
}

/// How much longer the slowest rank's Newton–Schulz may get for grouping to be kept: groups
/// give every rank the same work, so they only unbalance a plan when the rooted rest cannot
/// even out the large matrices (deepseek-v3-like at dp=256: 1.30 with expert stacks split
/// evenly, against 1.001 when the stacks fill around the dense matrices).
const NS_TOLERANCE: f64 = 0.01;

/// Lays out every buffer with the given grouping and group window of compact Muon buffers.
fn lay_out(
    params: &[ParamSpec],
    routes: &[Route],
    cfg: &Config,
    dp: usize,
    grouping: Grouping,
    window: GroupWindow,
    released: &BTreeSet<u32>,
) -> Result<(Layout, OwnershipMethod)> {
    lay_out_shards(params, routes, cfg, dp, grouping, window, released, false)
}

/// [`lay_out`], and with `rebalance` the shard buckets' matrices exchanged between ranks to
/// even out Newton–Schulz once the rooted owners are placed (`rebalance.rs`).
#[allow(clippy::too_many_arguments)]
fn lay_out_shards(
    params: &[ParamSpec],
    routes: &[Route],
    cfg: &Config,
    dp: usize,
    grouping: Grouping,
    window: GroupWindow,
    released: &BTreeSet<u32>,
    rebalance: bool,
) -> Result<(Layout, OwnershipMethod)> {
    let bucket_size = cfg.overlap_grad_reduce.then(|| cfg.effective_bucket_size(dp));
    let mut placements = initial_placements(params, routes);
    let groups = group_buffers(params, routes, cfg);
    let chunks: Vec<Vec<Vec<u32>>> = groups
        .iter()
        .map(|g| backward_chunks(params, &g.params, bucket_size))
        .collect();
    let mut sequences: Vec<Vec<CompactBucket>> = groups
        .iter()
        .map(|g| match (g.route, cfg.muon_layout) {
            (Route::Muon, MuonLayout::Compact) => CompactBuffer {
                params,
                ids: &g.params,
                bucket_size,
                dp,
                steps: cfg.muon_num_ns_steps,
                grouping,
                window,
                released,
            }
            .buckets(),
            _ => Vec::new(),
        })
        .collect();
    let ownership = match cfg.muon_layout {
        MuonLayout::Padded => OwnershipMethod::MegatronPadded,
        MuonLayout::Compact | MuonLayout::CompactRooted | MuonLayout::Allreduce => {
            let rooted = |c: &CompactBucket| match c {
                CompactBucket::Rooted(ids) => Some(ids.clone()),
                _ => None,
            };
            let muon: Vec<Vec<u32>> = groups
                .iter()
                .zip(&chunks)
                .zip(&sequences)
                .filter(|((g, _), _)| g.route == Route::Muon)
                .flat_map(|((_, chunks), sequence)| match cfg.muon_layout {
                    MuonLayout::Compact => sequence.iter().filter_map(rooted).collect::<Vec<_>>(),
                    _ => chunks.clone(),
                })
                .collect();
            ownership::assign_owners(params, &muon, dp, cfg.muon_num_ns_steps, &mut placements)
        }
    };
    if rebalance {
        rebalance::rebalance_shards(params, &mut sequences, &placements, dp, cfg.muon_num_ns_steps);
    }
    let layout = finish_layout(
        params,
        &groups,
        BufferInputs {
            chunks: &chunks,
            sequences: Some(&sequences),
        },
        cfg,
        dp,
        placements,
    )?;
    Ok((layout, ownership))
}

/// `muon_ownership = contiguous` (compact, compact_rooted, allreduce): the owners first, one run
/// per rank over every Muon buffer in backward order, then each Muon buffer's rooted buckets
/// cut at owner changes (`contiguous.rs`).
fn lay_out_contiguous(
    params: &[ParamSpec],
    routes: &[Route],
    cfg: &Config,
    dp: usize,
) -> Result<(Layout, OwnershipMethod)> {
    let bucket_size = cfg.overlap_grad_reduce.then(|| cfg.effective_bucket_size(dp));
    let mut placements = initial_placements(params, routes);
    let groups = group_buffers(params, routes, cfg);
    let order: Vec<u32> = groups
        .iter()
        .filter(|g| g.route == Route::Muon)
        .flat_map(|g| g.params.iter().rev().copied())
        .collect();
    contiguous::assign_contiguous(params, &order, dp, cfg.muon_num_ns_steps, &mut placements);
    let chunks: Vec<Vec<Vec<u32>>> = groups
        .iter()
        .map(|g| match g.route {
            Route::Muon => contiguous::owner_chunks(params, &g.params, &placements, bucket_size),
            Route::Adamw => backward_chunks(params, &g.params, bucket_size),
        })
        .collect();
    // Every bucket is rooted: no compact bucket sequence.
    let layout = finish_layout(
        params,
        &groups,
        BufferInputs {
            chunks: &chunks,
            sequences: None,
        },
        cfg,
        dp,
        placements,
    )?;
    Ok((layout, OwnershipMethod::Contiguous))
}

/// The buffers and buckets of bucket memberships whose owners are in `placements`.
fn finish_layout(
    params: &[ParamSpec],
    groups: &[BufferGroup],
    inputs: BufferInputs,
    cfg: &Config,
    dp: usize,
    mut placements: Vec<ParamPlacement>,
) -> Result<Layout> {
    let (buffers, buckets) = lay_out_buffers(params, groups, inputs, cfg, dp, &mut placements)?;
    Ok(Layout {
        buffers,
        buckets,
        params: placements,
    })
}

/// Bucket memberships per buffer: backward chunks, and (balanced ownership) the compact bucket
/// sequence of Muon buffers, which `compact` mode lays out; None when every bucket is rooted.
struct BufferInputs<'a> {
    chunks: &'a [Vec<Vec<u32>>],
    sequences: Option<&'a [Vec<CompactBucket>]>,
}

/// Lays out every buffer (bucket ids global, in buffer order); records param offsets.
fn lay_out_buffers(
    params: &[ParamSpec],
    groups: &[BufferGroup],
    inputs: BufferInputs,
    cfg: &Config,
    dp: usize,
    placements: &mut [ParamPlacement],
) -> Result<(Vec<Buffer>, Vec<Bucket>)> {
    let bucket_size = cfg.overlap_grad_reduce.then(|| cfg.effective_bucket_size(dp));
    let mut buffers = Vec::with_capacity(groups.len());
    let mut all_buckets: Vec<Bucket> = Vec::new();
    for (index, (group, chunks)) in groups.iter().zip(inputs.chunks).enumerate() {
        let key = BufferKey {
            index: index as u32,
            route: group.route,
            dtype: group.dtype,
            first_bucket: all_buckets.len() as u32,
        };
        let sequence = inputs.sequences.map(|s| &s[index]);
        let mut buckets = match (group.route, cfg.muon_layout, sequence) {
            (Route::Adamw, ..) => adamw::layout_adamw(params, chunks, dp, key, placements),
            (Route::Muon, MuonLayout::Padded, _) => {
                padded::layout_padded(params, &group.params, bucket_size, dp, key, placements)
            }
            (Route::Muon, MuonLayout::Compact, Some(sequence)) => {
                compact::layout_grouped(params, sequence, dp, key, placements)?
            }
            (Route::Muon, ..) => compact::layout_compact(params, chunks, dp, key, placements)?,
        };
        let param_numel = place_param_storage(&mut buckets, params, cfg);
        buffers.push(Buffer {
            route: group.route,
            dtype: group.dtype,
            numel: buckets.last().map_or(0, |b| b.end),
            param_numel,
            first_bucket: key.first_bucket,
            num_buckets: buckets.len() as u32,
        });
        all_buckets.extend(buckets);
    }
    Ok((buffers, all_buckets))
}

/// Places the buckets of one buffer in its param storage, back to back in bucket order, except
/// those whose every param is staged on the grad buffer ([`ParamSpec::is_staged`]): their
/// params live as MXFP8 only, so param storage for them would never be read (2 bytes per
/// element of a bf16 model). Returns the storage's elements.
fn place_param_storage(buckets: &mut [Bucket], params: &[ParamSpec], cfg: &Config) -> u64 {
    let mut next = 0;
    for bucket in buckets {
        let staged = bucket.params.iter().all(|&p| params[p as usize].is_staged(cfg));
        bucket.param_start = (!staged).then_some(next);
        next += bucket
            .param_range(ElemRange::new(bucket.start, bucket.end))
            .map_or(0, |r| r.len());
    }
    next
}

/// Plans `model` once per Muon layout in `layouts` (to compare them side by side); every
/// param is registered through [`crate::model::Registry::add`] first.
pub fn build_plans(model: &ModelDesc, cfg: &Config, dp: usize, layouts: &[MuonLayout]) -> Result<Vec<Plan>> {
    let registry = model.registry(cfg)?;
    layouts
        .iter()
        .map(|&muon_layout| {
            let cfg = Config {
                muon_layout,
                ..cfg.clone()
            };
            build_plan(registry.params(), registry.routes(), &cfg, dp)
        })
        .collect()
}

fn check_inputs(params: &[ParamSpec], routes: &[Route], cfg: &Config, dp: usize) -> Result<()> {
    if dp == 0 {
        bail!(OutOfRange, "dp: must be >= 1");
    }
    if dp > u32::MAX as usize {
        bail!(OutOfRange, "dp: {dp} exceeds {}", u32::MAX);
    }
    if params.is_empty() {
        bail!(
            InvalidState,
            "plan: no params registered; register at least one param before planning"
        );
    }
    if routes.len() != params.len() {
        bail!(
            InvalidArgument,
            "plan: {} routes given for {} params",
            routes.len(),
            params.len()
        );
    }
    cfg.validate()?;
    for (spec, &route) in params.iter().zip(routes) {
        spec.validate()?;
        let matrix_like = spec.shape.len() == 2 || spec.is_expert_stack();
        if route == Route::Muon && !matrix_like {
            bail!(
                InvalidArgument,
                "param '{}': routed to muon but shape {:?} is neither a matrix nor an expert stack",
                spec.name,
                spec.shape
            );
        }
    }
    Ok(())
}

/// Placements with route and sizes filled in; Muon params get one owner slot per unit.
pub(crate) fn initial_placements(params: &[ParamSpec], routes: &[Route]) -> Vec<ParamPlacement> {
    params
        .iter()
        .zip(routes)
        .map(|(spec, &route)| {
            let units = if route == Route::Muon { spec.num_units() } else { 1 };
            ParamPlacement {
                route,
                buffer: 0,
                bucket: 0,
                offset: 0,
                numel: spec.numel(),
                unit_numel: spec.numel() / units,
                unit_owners: if route == Route::Muon {
                    vec![0; units as usize]
                } else {
                    Vec::new()
                },
            }
        })
        .collect()
}

//! The planner (docs/design.md §4): a pure, deterministic function from the registered
//! params, their routes, the config and dp to the layout of every buffer and bucket and the
//! owner of every Muon matrix and AdamW shard. Buffers, collectives and checkpoints all read
//! the [`Plan`]; every rank computes the same plan and compares [`Plan::hash`].
//!
//! - **Buffers**: one per (route, dtype), Muon buffers first, then AdamW, each by dtype code.
//! - **Buckets**: params walked in reverse registration order (backward order), each starting
//!   64-aligned; a bucket closes once it spans `cfg.effective_bucket_size(dp)` elements (one
//!   bucket per buffer when `overlap_grad_reduce` is off). Bucket ids are global: buffers in
//!   order, buckets of a buffer in backward order.
//! - **AdamW buckets** (`adamw.rs`): equal shards, bucket end padded to `lcm(dp, 128)`.
//! - **Muon buckets**: `compact` and `allreduce` (`ownership.rs`, `compact.rs`): each rank's
//!   owned elements in a bucket form one contiguous range; `padded` (`padded.rs`): Megatron-LM's
//!   shard-aligned layer-wise layout.
//! - **Report** ([`Report`], with the communication cost model) and **hash** (FNV-1a over a
//!   canonical encoding, `hash.rs`).
//! - Inputs for tools: [`presets`] and the JSON parameter list of [`model_json`]; [`render`]
//!   draws reports as a table, JSON or SVG.

mod adamw;
mod buckets;
mod compact;
mod cost;
pub(crate) mod hash;
pub mod model_json;
mod ownership;
mod padded;
pub mod presets;
mod queries;
pub mod render;
mod report;
mod types;

use std::time::Instant;

use crate::bail;
use crate::config::{Config, MuonLayout};
use crate::error::Result;
use crate::model::{ParamSpec, Route};

pub use ownership::OwnershipMethod;
pub use queries::{AdamwShard, OwnedUnit, ShardPiece};
pub use report::{ADAMW_STATE_BYTES_PER_ELEMENT, MUON_STATE_BYTES_PER_ELEMENT, RankStats, Report, RouteElements};
pub use types::{Bucket, BucketSplit, Buffer, ElemRange, ParamPlacement, Plan};

use buckets::{BufferGroup, BufferKey, backward_chunks, group_buffers};
use presets::ModelDesc;

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
    let bucket_size = cfg.overlap_grad_reduce.then(|| cfg.effective_bucket_size(dp));
    let mut placements = initial_placements(params, routes);
    let groups = group_buffers(params, routes);
    let chunks: Vec<Vec<Vec<u32>>> = groups
        .iter()
        .map(|g| backward_chunks(params, &g.params, bucket_size))
        .collect();
    let ownership = match cfg.muon_layout {
        MuonLayout::Padded => OwnershipMethod::MegatronPadded,
        MuonLayout::Compact | MuonLayout::Allreduce => {
            let muon: Vec<Vec<u32>> = groups
                .iter()
                .zip(&chunks)
                .filter(|(g, _)| g.route == Route::Muon)
                .flat_map(|(_, c)| c.iter().cloned())
                .collect();
            ownership::assign_owners(params, &muon, dp, cfg.muon_num_ns_steps, &mut placements)
        }
    };
    let (buffers, buckets) = lay_out_buffers(params, &groups, &chunks, cfg, dp, &mut placements)?;
    let layout = Layout {
        buffers,
        buckets,
        params: placements,
    };
    let mut report = Report::of(params, cfg, dp, &layout, ownership);
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

/// Lays out every buffer (bucket ids global, in buffer order); records param offsets.
fn lay_out_buffers(
    params: &[ParamSpec],
    groups: &[BufferGroup],
    chunks: &[Vec<Vec<u32>>],
    cfg: &Config,
    dp: usize,
    placements: &mut [ParamPlacement],
) -> Result<(Vec<Buffer>, Vec<Bucket>)> {
    let bucket_size = cfg.overlap_grad_reduce.then(|| cfg.effective_bucket_size(dp));
    let mut buffers = Vec::with_capacity(groups.len());
    let mut all_buckets: Vec<Bucket> = Vec::new();
    for (index, (group, chunks)) in groups.iter().zip(chunks).enumerate() {
        let key = BufferKey {
            index: index as u32,
            route: group.route,
            dtype: group.dtype,
            first_bucket: all_buckets.len() as u32,
        };
        let buckets = match (group.route, cfg.muon_layout) {
            (Route::Adamw, _) => adamw::layout_adamw(params, chunks, dp, key, placements),
            (Route::Muon, MuonLayout::Padded) => {
                padded::layout_padded(params, &group.params, bucket_size, dp, key, placements)
            }
            (Route::Muon, _) => compact::layout_compact(params, chunks, dp, key, placements)?,
        };
        buffers.push(Buffer {
            route: group.route,
            dtype: group.dtype,
            numel: buckets.last().map_or(0, |b| b.end),
            first_bucket: key.first_bucket,
            num_buckets: buckets.len() as u32,
        });
        all_buckets.extend(buckets);
    }
    Ok((buffers, all_buckets))
}

/// Plans `model` once per Muon layout in `layouts` (the CLI's side-by-side comparison); every
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
fn initial_placements(params: &[ParamSpec], routes: &[Route]) -> Vec<ParamPlacement> {
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

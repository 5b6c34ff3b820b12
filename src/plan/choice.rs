//! What the planner chooses (docs/design.md §4): the group window of `compact` (which decides,
//! bucket by bucket, whether equal matrices travel grouped or rooted) and, under
//! `muon_ownership = auto`, balanced or contiguous ownership.
//!
//! Every candidate is laid out in full. With no network declared the planner keeps the one
//! that moves the fewest bytes per rank (widest window first on a tie), with balanced
//! ownership, searching harder for a balanced plan where balance would cost more bytes than
//! Megatron-LM's layout ([`MegatronBytes`]): `compact` then moves no more than `padded` at
//! every dp `tests/plan_api.rs` checks (docs/design.md §4). With a declared network it keeps the one
//! whose collectives the model exposes least (fewest bytes, then widest window, on a tie).
//!
//! # The exposure model
//!
//! Every bucket's collectives are priced on the declared ring by the formula the simulator
//! prices them with ([`super::network`]), plus NCCL's base latency per call. The library cannot
//! see the model's compute, so the model assumes the forward lasts
//! [`EXPOSURE_COMPUTE_OVER_GATHER`] times what the ring needs to all-gather every param at the
//! byte lower bound (`(dp−1)/dp` of its bytes; nothing for an input embedding, whose forward is
//! a lookup: [`crate::model::lookups`]), and the backward twice the forward (the `6·N·D` split),
//! each param's share in proportion to its elements. Then, as the schedule issues them
//! (docs/design.md §5):
//! - **gradients**: each bucket's collective starts once its last gradient is ready and the one
//!   before it (reverse forward order) is done; what runs past the end of the backward is
//!   exposed;
//! - **params**: every bucket's collective queued at the step in forward order; the forward
//!   waits at a bucket whose collective is not done when it gets there, and the waits add up.
//!
//! The exposed cost is the sum of both. It prices what the candidates differ in — bytes
//! (grouped versus rooted), calls and their latency (one reduce per owner of a rooted bucket,
//! contiguous ownership's one owner per bucket), and how late a group's last gradient comes —
//! and leaves out what they share or what the planner cannot know (Newton–Schulz time, SM
//! contention).

use crate::config::{Config, MuonLayout, MuonOwnership, Network};
use crate::error::Result;
use crate::model::{ParamSpec, Route, lookups};

use super::groups::GroupWindow;
use super::network::{NCCL_BASE_LATENCY_US, Ring, RingCollective};
use super::ownership::OwnershipMethod;
use super::report::wire_bytes_per_rank;
use super::types::{Bucket, BucketSplit, forward_order};
use super::{Layout, MegatronBytes, lay_out_with};

/// The model's forward over the byte-lower-bound all-gather of every param on the declared
/// ring (module docs): a job whose forward just hides Megatron's distributed-optimizer param
/// all-gathers, with half as much again to spare. The figure is the model's, not measured:
/// docs/design.md §4 gives what a choice costs where the job is faster or slower than this.
pub const EXPOSURE_COMPUTE_OVER_GATHER: f64 = 1.5;

/// One plan the planner laid out and priced.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Alternative {
    /// How its owners were chosen (`contiguous`, or balanced's `lpt_stack_fill` /
    /// `global_wrap`; `megatron_padded` for padded).
    pub ownership: OwnershipMethod,
    /// The group window (`compact` with balanced ownership; else `rooted`).
    pub group_window: GroupWindow,
    pub wire_bytes_per_rank: f64,
    /// The modelled exposed time on the declared network (module docs); `None` undeclared.
    pub modelled_exposed_ms: Option<f64>,
}

/// What the planner chose among, and why.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Choice {
    /// The network the plan is for (the expert network for an optimizer of expert stacks);
    /// `None`: undeclared, the fewest bytes won.
    pub network: Option<Network>,
    /// Every candidate, in the order tried.
    pub alternatives: Vec<Alternative>,
    /// Index of the plan taken.
    pub chosen: usize,
}

/// The plan taken, with the method of its owners and the choice.
pub(crate) struct Chosen {
    pub layout: Layout,
    pub method: OwnershipMethod,
    pub choice: Choice,
}

/// The network an optimizer plans on: the expert network when one is declared and every
/// Muon-routed param is an expert stack (the expert optimizer of a dense + expert pair, which
/// may share one config with the dense one), else the data-parallel network.
pub fn planning_network(params: &[ParamSpec], routes: &[Route], cfg: &Config) -> Option<Network> {
    let mut muon = params.iter().zip(routes).filter(|(_, r)| **r == Route::Muon).peekable();
    let experts_only = muon.peek().is_some() && muon.all(|(p, _)| p.is_expert_stack());
    match cfg.expert_network {
        Some(network) if experts_only => Some(network),
        _ => cfg.network,
    }
}

/// The (ownership, window) pairs tried for `cfg`.
fn candidates(cfg: &Config, declared: bool) -> Vec<(MuonOwnership, GroupWindow)> {
    if cfg.muon_layout == MuonLayout::Padded {
        return vec![(MuonOwnership::Balanced, GroupWindow::Rooted)];
    }
    // Sharded params are gathered bucket by bucket around their use: a group holds one matrix
    // of each of dp layers, so every one would be gathered whole (sharding.rs).
    let windows: &[GroupWindow] = if cfg.muon_layout == MuonLayout::Compact && !cfg.sharded() {
        &GroupWindow::CANDIDATES
    } else {
        &[GroupWindow::Rooted]
    };
    let (balanced, contiguous) = match cfg.muon_ownership {
        MuonOwnership::Balanced => (true, false),
        MuonOwnership::Contiguous => (false, true),
        MuonOwnership::Auto => (true, declared),
    };
    let mut out: Vec<(MuonOwnership, GroupWindow)> = Vec::new();
    if balanced {
        out.extend(windows.iter().map(|&w| (MuonOwnership::Balanced, w)));
    }
    if contiguous {
        out.push((MuonOwnership::Contiguous, GroupWindow::Rooted));
    }
    out
}

/// Lays out every candidate and keeps the best (module docs).
pub(crate) fn choose(params: &[ParamSpec], routes: &[Route], cfg: &Config, dp: usize) -> Result<Chosen> {
    let network = planning_network(params, routes, cfg);
    let mut best: Option<(Layout, OwnershipMethod, (f64, f64))> = None;
    let mut choice = Choice {
        network,
        ..Choice::default()
    };
    let megatron = MegatronBytes::new(params, routes, cfg, dp);
    let byte_ceiling = network.is_none().then_some(&megatron);
    for (ownership, window) in candidates(cfg, network.is_some()) {
        let (layout, method) = lay_out_with(params, routes, cfg, dp, ownership, window, byte_ceiling)?;
        let bytes = wire_bytes_per_rank(cfg, dp, &layout);
        let exposed = network.map(|n| exposed_seconds(params, cfg, dp, &layout.buckets, n.ring()));
        choice.alternatives.push(Alternative {
            ownership: method,
            group_window: window,
            wire_bytes_per_rank: bytes,
            modelled_exposed_ms: exposed.map(|s| s * 1e3),
        });
        let key = (exposed.unwrap_or(0.0), bytes);
        if best.as_ref().is_none_or(|(_, _, b)| key < *b) {
            choice.chosen = choice.alternatives.len() - 1;
            best = Some((layout, method, key));
        }
    }
    let (layout, method, _) = best.expect("every layout has a candidate");
    Ok(Chosen { layout, method, choice })
}

/// Seconds of a bucket's gradient and param collectives on `ring` (every call of a rooted
/// bucket, as the schedule groups them).
fn bucket_seconds(bucket: &Bucket, cfg: &Config, dp: usize, ring: Ring) -> (f64, f64) {
    let (grad, param) = (cfg.grad_dtype.size() as u64, bucket.dtype.size() as u64);
    let call = |c: RingCollective, bytes: u64| ring.seconds(c, bytes, dp as u64, NCCL_BASE_LATENCY_US);
    match &bucket.split {
        BucketSplit::EqualShards { .. } => (
            call(RingCollective::ReduceScatter, bucket.numel() * grad),
            call(RingCollective::AllGather, bucket.numel() * param),
        ),
        BucketSplit::OwnerRanges(ranges) => {
            let owned = || ranges.iter().filter(|r| !r.is_empty());
            let grads = if cfg.muon_layout == MuonLayout::Allreduce {
                call(RingCollective::AllReduce, bucket.numel() * grad)
            } else {
                owned().map(|r| call(RingCollective::Reduce, r.len() * grad)).sum()
            };
            let params = owned().map(|r| call(RingCollective::Broadcast, r.len() * param)).sum();
            (grads, params)
        }
    }
}

/// The modelled exposed seconds of a plan's collectives on `ring` (module docs).
pub(crate) fn exposed_seconds(params: &[ParamSpec], cfg: &Config, dp: usize, buckets: &[Bucket], ring: Ring) -> f64 {
    if dp <= 1 {
        return 0.0;
    }
    let share = (dp - 1) as f64 / dp as f64;
    let lookup = lookups(params);
    let forward: Vec<f64> = params
        .iter()
        .zip(&lookup)
        .map(|(spec, &is_lookup)| {
            let gather = share * (spec.numel() * spec.dtype.size() as u64) as f64 / ring.bytes_per_second;
            if is_lookup {
                0.0
            } else {
                EXPOSURE_COMPUTE_OVER_GATHER * gather
            }
        })
        .collect();
    let mut ready = vec![0.0; params.len()];
    let mut backward = 0.0;
    for p in (0..params.len()).rev() {
        backward += 2.0 * forward[p];
        ready[p] = backward;
    }
    let mut reached = vec![0.0; params.len()];
    let mut at = 0.0;
    for (p, seconds) in forward.iter().enumerate() {
        reached[p] = at;
        at += seconds;
    }
    let seconds: Vec<(f64, f64)> = buckets.iter().map(|b| bucket_seconds(b, cfg, dp, ring)).collect();
    let order = forward_order(buckets);
    let mut comm: f64 = 0.0;
    for &b in order.iter().rev() {
        let last = buckets[b].params.iter().map(|&p| ready[p as usize]).fold(0.0, f64::max);
        comm = comm.max(last) + seconds[b].0;
    }
    let grads = (comm - backward).max(0.0);
    let (mut comm, mut waited) = (0.0, 0.0);
    for &b in &order {
        comm += seconds[b].1;
        let first = buckets[b].params.iter().copied().min().unwrap_or(0) as usize;
        let needed = reached[first] + waited;
        if comm > needed {
            waited += comm - needed;
        }
    }
    grads + waited
}

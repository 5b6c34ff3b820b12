//! Per-rank bytes of params and gradients under `param_sharding` (docs/design.md §4, "Sharded
//! params"): what every rank keeps persistently and the peak working set of gathered buckets.
//!
//! - **replicated**: every rank holds the whole param buffers and the whole gradient buffers;
//!   no working set.
//! - **sharded**: a rank keeps persistently the params it owns and their reduced gradients —
//!   every Muon unit (matrix, expert) of which it is the owner, whole, and its pieces of the
//!   equal-shard (AdamW) buckets — in the param dtype and `grad_dtype`. Around their use it
//!   gathers whole buckets (padding included) into a working set: in the forward, the bucket
//!   in use and `param_prefetch_buckets` ahead of it, in forward order; in the backward, the
//!   same window in reverse forward order, each bucket's params (gathered again when
//!   `reshard_after_forward`; otherwise every bucket stays gathered from its forward through
//!   its backward) and its transient gradient buffer, released once reduced to the owners.
//!   The peak is the larger of the two phases' largest windows. The owner's persistent copy
//!   is counted beside its gathered bucket (an upper bound).
//!
//! The optimizer state (masters, moments) is the same in both modes and is reported apart
//! ([`super::Report::optimizer_state_bytes`]).

use crate::config::Config;
use crate::model::{ParamSpec, Route};

use super::Layout;
use super::queries::shard_pieces;
use super::types::forward_order;

/// One mode's per-rank param and gradient bytes.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModeBytes {
    /// Persistent param bytes of each rank.
    pub params: Vec<u64>,
    /// Persistent gradient bytes of each rank.
    pub grads: Vec<u64>,
    /// Peak bytes of gathered buckets (params and transient gradients), the same on every rank.
    pub working_set: u64,
    /// The largest `params + grads + working_set + optimizer state` over the ranks.
    pub max_total: u64,
}

/// Both modes, for the plan's buckets and the config's sharding policy.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ShardingBytes {
    pub reshard_after_forward: bool,
    pub param_prefetch_buckets: u32,
    pub replicated: ModeBytes,
    pub sharded: ModeBytes,
}

/// The largest sum of `window` consecutive values (all of them when fewer).
fn largest_window(values: &[u64], window: usize) -> u64 {
    let window = window.clamp(1, values.len().max(1));
    values
        .windows(window)
        .map(|w| w.iter().sum::<u64>())
        .max()
        .unwrap_or_else(|| values.iter().sum())
}

/// The peak working set of gathered buckets (module docs).
fn working_set(cfg: &Config, layout: &Layout) -> u64 {
    let order = forward_order(&layout.buckets);
    let params: Vec<u64> = order
        .iter()
        .map(|&b| layout.buckets[b].numel() * layout.buckets[b].dtype.size() as u64)
        .collect();
    let grads: Vec<u64> = order
        .iter()
        .map(|&b| layout.buckets[b].numel() * cfg.grad_dtype.size() as u64)
        .collect();
    let window = cfg.param_prefetch_buckets as usize + 1;
    let all_params: u64 = params.iter().sum();
    if cfg.reshard_after_forward {
        let both: Vec<u64> = params.iter().zip(&grads).map(|(p, g)| p + g).collect();
        largest_window(&params, window).max(largest_window(&both, window))
    } else {
        all_params + largest_window(&grads, window)
    }
}

impl ShardingBytes {
    /// Both modes for `layout`, with each rank's optimizer state `state`.
    pub(crate) fn of(params: &[ParamSpec], cfg: &Config, dp: usize, layout: &Layout, state: &[u64]) -> Self {
        let grad_size = cfg.grad_dtype.size() as u64;
        let mut owned_params = vec![0u64; dp];
        let mut owned_grads = vec![0u64; dp];
        for (spec, placement) in params.iter().zip(&layout.params) {
            if placement.route != Route::Muon {
                continue;
            }
            for &r in &placement.unit_owners {
                owned_params[r as usize] += placement.unit_numel * spec.dtype.size() as u64;
                owned_grads[r as usize] += placement.unit_numel * grad_size;
            }
        }
        for bucket in layout.buckets.iter().filter(|b| b.route == Route::Adamw) {
            for &p in &bucket.params {
                let size = params[p as usize].dtype.size() as u64;
                for (rank, piece) in shard_pieces(bucket, p, &layout.params[p as usize]) {
                    owned_params[rank] += piece.param_range.len() * size;
                    owned_grads[rank] += piece.param_range.len() * grad_size;
                }
            }
        }
        let param_buffers: u64 = layout
            .buffers
            .iter()
            .map(|b| b.param_numel * b.dtype.size() as u64)
            .sum();
        let grad_buffers: u64 = layout.buffers.iter().map(|b| b.numel).sum::<u64>() * grad_size;
        let mode = |params: Vec<u64>, grads: Vec<u64>, working_set: u64| {
            let max_total = (0..dp)
                .map(|r| params[r] + grads[r] + working_set + state[r])
                .max()
                .unwrap_or(0);
            ModeBytes {
                params,
                grads,
                working_set,
                max_total,
            }
        };
        ShardingBytes {
            reshard_after_forward: cfg.reshard_after_forward,
            param_prefetch_buckets: cfg.param_prefetch_buckets,
            replicated: mode(vec![param_buffers; dp], vec![grad_buffers; dp], 0),
            sharded: mode(owned_params, owned_grads, working_set(cfg, layout)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::largest_window;

    #[test]
    fn the_largest_window_sums_consecutive_values() {
        assert_eq!(largest_window(&[1, 5, 2, 7, 1], 2), 9);
        assert_eq!(largest_window(&[1, 5, 2, 7, 1], 1), 7);
        assert_eq!(largest_window(&[1, 5, 2], 10), 8);
        assert_eq!(largest_window(&[], 3), 0);
    }
}

//! Where a rank keeps params and gradients with `param_sharding = sharded` (issue 41,
//! docs/design.md "Sharded params"): persistently only its own range of every bucket
//! ([`Bucket::rank_range`]: its Muon matrices whole, its AdamW shard), in `Mem::OwnedParam(i)`
//! and `Mem::OwnedGrad(i)`, and a gather window of slots, fixed at finalize, that whole buckets
//! are gathered into around their use, in `Mem::Param(i)` and `Mem::Grad(i)` (which hold the
//! whole buffer when params are replicated).
//!
//! A bucket always takes the same slot — its position in the forward order modulo the number
//! of slots — so its gathered params and gradients have the same addresses at every gather (a
//! framework may keep its views, and a captured CUDA graph stays valid). With
//! `reshard_after_forward` there are `param_prefetch_buckets + 1` slots (the bucket in use and
//! the prefetched ones, in forward order going forward and in reverse going backward); without
//! it every bucket has a slot of its own, since every bucket stays gathered from its forward to
//! its backward. Each slot of a buffer is as large as the largest bucket of the buffer that
//! takes it. Every range keeps its elements' offsets modulo 64 (the alignment the plan gives
//! them), so kernels see the alignment they see with replicated params.

use crate::backend::ops::{Mem, Span};
use crate::config::Config;
use crate::plan::{Bucket, ElemRange, Plan};

/// Elements whose offset modulo which every window and owned range keeps.
const ALIGN: u64 = 64;

/// The first offset at or after `cursor` with `residue` modulo [`ALIGN`].
fn place(cursor: u64, residue: u64) -> u64 {
    cursor.next_multiple_of(ALIGN) + residue % ALIGN
}

/// A sharded rank's storage layout (module docs).
#[derive(Debug, Clone)]
pub struct Window {
    /// Slots of the window.
    pub slots: usize,
    /// Per bucket: its slot.
    pub slot: Vec<usize>,
    /// Per bucket: the window offset of its first element, in its buffer's `Mem::Param` and
    /// `Mem::Grad`.
    start: Vec<u64>,
    /// Per bucket: the range of it this rank keeps (buffer coordinates, possibly empty) and
    /// that range's offset in its buffer's `Mem::OwnedParam` and `Mem::OwnedGrad`.
    owned: Vec<(ElemRange, u64)>,
    /// Per buffer: elements of its window.
    pub window_numel: Vec<u64>,
    /// Per buffer: elements of its owned storage.
    pub owned_numel: Vec<u64>,
}

impl Window {
    /// The layout of `rank` for `plan` under `cfg`'s sharding policy.
    pub fn new(plan: &Plan, cfg: &Config, rank: usize) -> Window {
        let order = crate::plan::forward_order(&plan.buckets);
        let buckets = plan.buckets.len();
        let slots = if cfg.reshard_after_forward {
            (cfg.param_prefetch_buckets as usize + 1).min(buckets.max(1))
        } else {
            buckets.max(1)
        };
        let mut slot = vec![0; buckets];
        for (position, &b) in order.iter().enumerate() {
            slot[b] = position % slots;
        }
        let buffers = plan.buffers.len();
        // Per buffer and slot: the elements the slot needs (with its first element's residue).
        let mut need = vec![vec![0u64; slots]; buffers];
        for (b, bucket) in plan.buckets.iter().enumerate() {
            let n = &mut need[bucket.buffer as usize][slot[b]];
            *n = (*n).max(bucket.start % ALIGN + bucket.numel());
        }
        let mut slot_base = vec![vec![0u64; slots]; buffers];
        let mut window_numel = vec![0u64; buffers];
        for (i, needs) in need.iter().enumerate() {
            for (k, &n) in needs.iter().enumerate() {
                slot_base[i][k] = window_numel[i].next_multiple_of(ALIGN);
                window_numel[i] = slot_base[i][k] + n;
            }
        }
        let start = plan
            .buckets
            .iter()
            .enumerate()
            .map(|(b, bucket)| slot_base[bucket.buffer as usize][slot[b]] + bucket.start % ALIGN)
            .collect();
        let mut owned_numel = vec![0u64; buffers];
        let owned = plan
            .buckets
            .iter()
            .map(|bucket| {
                let range = bucket.rank_range(rank);
                let cursor = &mut owned_numel[bucket.buffer as usize];
                let at = if range.is_empty() {
                    *cursor
                } else {
                    place(*cursor, range.start)
                };
                *cursor = at + range.len();
                (range, at)
            })
            .collect();
        Window {
            slots,
            slot,
            start,
            owned,
            window_numel,
            owned_numel,
        }
    }

    /// The range of `bucket` this rank keeps.
    pub fn owned_range(&self, bucket: &Bucket) -> ElemRange {
        self.owned[bucket.id as usize].0
    }

    /// `range` (elements of `bucket`) in the window of `mem` (`Mem::Param` or `Mem::Grad` of
    /// the bucket's buffer).
    pub fn gathered(&self, bucket: &Bucket, range: ElemRange, mem: Mem) -> Span {
        Span::new(
            mem,
            self.start[bucket.id as usize] + (range.start - bucket.start),
            range.len(),
        )
    }

    /// `range` (elements of `bucket`, inside the range this rank keeps) in its owned storage:
    /// `Mem::OwnedParam` (`grad` false) or `Mem::OwnedGrad` of the bucket's buffer.
    pub fn kept(&self, bucket: &Bucket, range: ElemRange, grad: bool) -> Span {
        let (owned, at) = self.owned[bucket.id as usize];
        debug_assert!(range.is_empty() || (owned.start <= range.start && range.end <= owned.end));
        let mem = if grad {
            Mem::OwnedGrad(bucket.buffer)
        } else {
            Mem::OwnedParam(bucket.buffer)
        };
        Span::new(mem, at + (range.start - owned.start), range.len())
    }
}

/// Where the owner of `range` (elements of `bucket`) keeps its model-dtype values: the param
/// buffer (None when the bucket has no param storage, see [`Bucket::param_start`]), or with
/// sharding its owned storage.
pub fn kept_param(bucket: &Bucket, window: Option<&Window>, range: ElemRange) -> Option<Span> {
    match window {
        Some(w) => Some(w.kept(bucket, range, false)),
        None => bucket
            .param_range(range)
            .map(|r| Span::new(Mem::Param(bucket.buffer), r.start, r.len())),
    }
}

/// Where the owner of `range` (elements of `bucket`) finds its reduced gradient: the grad
/// buffer, or with sharding its owned storage.
pub fn kept_grad(bucket: &Bucket, window: Option<&Window>, range: ElemRange) -> Span {
    match window {
        Some(w) => w.kept(bucket, range, true),
        None => Span::new(Mem::Grad(bucket.buffer), range.start, range.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::place;

    #[test]
    fn a_placed_range_keeps_its_residue_modulo_64() {
        assert_eq!(place(0, 0), 0);
        assert_eq!(place(0, 130), 2);
        assert_eq!(place(65, 3), 131);
        assert_eq!(place(128, 64), 128);
    }
}

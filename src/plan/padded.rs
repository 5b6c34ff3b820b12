//! `padded` Muon layout: a faithful port of Megatron-LM's shard-aligned layer-wise layout
//! (`LayerWiseDistributedOptimizer._compute_per_buffer_param_layout`, main branch), so users
//! migrating from Megatron see the same buckets, offsets and memory.
//!
//! Per buffer, params in backward order are gathered into chunks. Before adding param p to a
//! non-empty chunk, the chunk is emitted as a bucket if it holds at least
//! `max(bucket_size, int(dp·largest_param·0.9))` elements and p does not "absorb" into the
//! estimated shard padding (`pad64(min load) + numel <= pad_to(max load, shard_divisor)`,
//! loads estimated by placing params on the least-loaded shard in backward order).
//!
//! Emitting a chunk: params sorted by `max(M,N)·min(M,N)²` descending (stable) go to the shard
//! with the least compute load accumulated over the buffer's buckets so far, among shards
//! whose 64-aligned cursor plus the param stays within `1.3 · chunk_numel / dp`; if none fits,
//! to the shard with the smallest cursor. Ties go to the lowest index. Every shard is then
//! padded to `pad_to(max cursor, lcm(64, lcm(dp, 128) / dp))`, and shard r holds rank r's
//! params in assignment order at 64-aligned offsets.
//!
//! Here a param is one item even when it is an expert stack (cost E·unit cost): Megatron has
//! no expert stacks in this buffer, so this is the natural extension.

use crate::model::ParamSpec;

use super::buckets::{BUCKET_END_ALIGN, BufferKey, PARAM_ALIGN, lcm, pad_to, pad64};
use super::cost::megatron_cost;
use super::types::{Bucket, BucketSplit, ParamPlacement};

/// Megatron's `_NUMEL_EPSILON`: a shard may hold up to 1.3× the chunk's mean shard numel.
const NUMEL_EPSILON: f64 = 0.3;

/// Megatron's `PADDING_FLOOR`.
const PADDING_FLOOR: f64 = 0.9;

/// Per-shard alignment: `dp` shards of this size make a bucket end aligned to
/// `lcm(dp, 128)` and keep every shard start 64-aligned.
pub(crate) fn shard_divisor(dp: u64) -> u64 {
    lcm(PARAM_ALIGN, lcm(dp, BUCKET_END_ALIGN) / dp)
}

/// Index of the first minimum of `values` by `key` (ties go to the lowest index).
fn argmin_by<T: Ord>(len: usize, key: impl Fn(usize) -> T) -> usize {
    (0..len).min_by_key(|&i| key(i)).unwrap_or(0)
}

/// Lays out one Muon buffer in padded mode. Returns its buckets; records each param's
/// bucket, offset and owner in `placements`.
pub(crate) fn layout_padded(
    params: &[ParamSpec],
    ids: &[u32],
    bucket_size: Option<u64>,
    dp: usize,
    key: BufferKey,
    placements: &mut [ParamPlacement],
) -> Vec<Bucket> {
    let mut emitter = Emitter {
        params,
        dp,
        key,
        divisor: shard_divisor(dp as u64),
        compute_loads: vec![0; dp],
        cursor: 0,
        buckets: Vec::new(),
    };
    let mut chunk: Vec<u32> = Vec::new();
    let mut chunk_numel = 0u64;
    let mut chunk_max = 0u64;
    let mut shard_loads = vec![0u64; dp];
    for &id in ids.iter().rev() {
        let numel = params[id as usize].numel();
        if let (Some(size), false) = (bucket_size, chunk.is_empty()) {
            let floor = ((dp as u128 * chunk_max as u128) as f64 * PADDING_FLOOR) as u64;
            let threshold = size.max(floor);
            if chunk_numel >= threshold && !absorbs(&shard_loads, numel, emitter.divisor) {
                emitter.emit(&chunk, placements);
                chunk.clear();
                chunk_numel = 0;
                chunk_max = 0;
                shard_loads.fill(0);
            }
        }
        let shard = argmin_by(dp, |s| shard_loads[s]);
        shard_loads[shard] = pad64(shard_loads[shard]) + numel;
        chunk.push(id);
        chunk_numel += numel;
        chunk_max = chunk_max.max(numel);
    }
    emitter.emit(&chunk, placements);
    emitter.buckets
}

/// True if `numel` fits into the least-loaded shard without growing the padded bucket.
fn absorbs(shard_loads: &[u64], numel: u64, divisor: u64) -> bool {
    let min = shard_loads.iter().copied().min().unwrap_or(0);
    let max = shard_loads.iter().copied().max().unwrap_or(0);
    pad64(min) + numel <= pad_to(max, divisor)
}

/// Bin-packs chunks into shard-aligned buckets, in buffer order.
struct Emitter<'a> {
    params: &'a [ParamSpec],
    dp: usize,
    key: BufferKey,
    divisor: u64,
    /// Megatron cost per shard, accumulated over the buffer's buckets.
    compute_loads: Vec<u128>,
    /// Buffer cursor: the end of the last bucket.
    cursor: u64,
    buckets: Vec<Bucket>,
}

impl Emitter<'_> {
    fn emit(&mut self, chunk: &[u32], placements: &mut [ParamPlacement]) {
        if chunk.is_empty() {
            return;
        }
        let dp = self.dp;
        let numel = |id: u32| self.params[id as usize].numel();
        let mut sorted = chunk.to_vec();
        sorted.sort_by_key(|&id| std::cmp::Reverse(megatron_cost(&self.params[id as usize])));
        let chunk_numel: u64 = chunk.iter().map(|&id| numel(id)).sum();
        let max_shard_numel = chunk_numel as f64 / dp as f64 * (1.0 + NUMEL_EPSILON);
        let mut shards: Vec<Vec<u32>> = vec![Vec::new(); dp];
        let mut cursors = vec![0u64; dp];
        for &id in &sorted {
            let n = numel(id);
            let fits = |s: usize| ((pad64(cursors[s]) + n) as f64) <= max_shard_numel;
            let shard = match (0..dp).filter(|&s| fits(s)).min_by_key(|&s| self.compute_loads[s]) {
                Some(s) => s,
                None => argmin_by(dp, |s| cursors[s]),
            };
            cursors[shard] = pad64(cursors[shard]) + n;
            self.compute_loads[shard] += megatron_cost(&self.params[id as usize]);
            shards[shard].push(id);
        }
        let shard_size = pad_to(cursors.iter().copied().max().unwrap_or(0), self.divisor);
        let start = self.cursor;
        let local = self.buckets.len();
        let bucket_id = self.key.first_bucket + local as u32;
        let mut layout_order = Vec::with_capacity(chunk.len());
        for (rank, shard) in shards.iter().enumerate() {
            let mut cursor = start + rank as u64 * shard_size;
            for &id in shard {
                cursor = pad64(cursor);
                let placement = &mut placements[id as usize];
                self.key.place(placement, bucket_id, cursor);
                placement.unit_owners.fill(rank as u32);
                cursor += numel(id);
                layout_order.push(id);
            }
        }
        let end = start + dp as u64 * shard_size;
        let split = BucketSplit::EqualShards { shard_size };
        self.buckets
            .push(self.key.bucket(local, start, end, layout_order, split));
        self.cursor = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_divisor_matches_megatron() {
        assert_eq!(shard_divisor(1), 128);
        assert_eq!(shard_divisor(2), 64);
        assert_eq!(shard_divisor(3), 128);
        assert_eq!(shard_divisor(4), 64);
        assert_eq!(shard_divisor(256), 64);
    }
}

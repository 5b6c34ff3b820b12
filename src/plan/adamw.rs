//! AdamW buckets: the distributed-optimizer layout (Megatron-LM's
//! `DistributedOptimizer._compute_per_buffer_param_layout`). Params in backward order at
//! 64-aligned offsets, each bucket's end padded to a multiple of `lcm(dp, 128)` and cut into
//! `dp` equal shards; a param may span shards.

use crate::model::ParamSpec;

use super::buckets::{BUCKET_END_ALIGN, BufferKey, lcm, pad_to, pad64};
use super::types::{Bucket, BucketSplit, ParamPlacement};

/// Lays out one AdamW buffer from its bucket memberships (backward order).
pub(crate) fn layout_adamw(
    params: &[ParamSpec],
    chunks: &[Vec<u32>],
    dp: usize,
    key: BufferKey,
    placements: &mut [ParamPlacement],
) -> Vec<Bucket> {
    let end_divisor = lcm(dp as u64, BUCKET_END_ALIGN);
    let mut cursor = 0;
    let mut buckets = Vec::with_capacity(chunks.len());
    for (local, chunk) in chunks.iter().enumerate() {
        let start = cursor;
        let id = key.first_bucket + local as u32;
        for &p in chunk {
            cursor = pad64(cursor);
            key.place(&mut placements[p as usize], id, cursor);
            cursor += params[p as usize].numel();
        }
        let end = pad_to(cursor, end_divisor);
        let shard_size = (end - start) / dp as u64;
        buckets.push(key.bucket(
            local,
            start,
            end,
            chunk.clone(),
            BucketSplit::EqualShards { shard_size },
        ));
        cursor = end;
    }
    buckets
}

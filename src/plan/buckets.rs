//! Buffer grouping, alignment and bucket membership shared by every layout mode.

use crate::config::{Config, Dtype};
use crate::model::{ParamSpec, Route};

use super::types::{Bucket, BucketSplit, ParamPlacement};

/// Every param starts at a multiple of this many elements.
pub(crate) const PARAM_ALIGN: u64 = 64;

/// AdamW bucket ends are padded to a multiple of `lcm(dp, BUCKET_END_ALIGN)`.
pub(crate) const BUCKET_END_ALIGN: u64 = 128;

/// Rounds `value` up to a multiple of `divisor`.
pub(crate) fn pad_to(value: u64, divisor: u64) -> u64 {
    value.div_ceil(divisor) * divisor
}

/// Rounds `value` up to the param alignment.
pub(crate) fn pad64(value: u64) -> u64 {
    pad_to(value, PARAM_ALIGN)
}

pub(crate) fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Least common multiple.
pub(crate) fn lcm(a: u64, b: u64) -> u64 {
    a / gcd(a, b) * b
}

/// Identity of the buffer being laid out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BufferKey {
    pub index: u32,
    pub route: Route,
    pub dtype: Dtype,
    pub first_bucket: u32,
}

impl BufferKey {
    /// A bucket of this buffer with local index `local`.
    pub(crate) fn bucket(&self, local: usize, start: u64, end: u64, params: Vec<u32>, split: BucketSplit) -> Bucket {
        Bucket {
            id: self.first_bucket + local as u32,
            route: self.route,
            dtype: self.dtype,
            buffer: self.index,
            start,
            end,
            params,
            split,
            param_start: None,
        }
    }

    /// Records where param `id` landed.
    pub(crate) fn place(&self, placement: &mut ParamPlacement, bucket: u32, offset: u64) {
        placement.buffer = self.index;
        placement.bucket = bucket;
        placement.offset = offset;
    }
}

/// The params of one buffer (one route, one dtype), in registration order.
pub(crate) struct BufferGroup {
    pub route: Route,
    pub dtype: Dtype,
    pub params: Vec<u32>,
}

/// Groups params into buffers: Muon buffers first, then AdamW, each ordered by dtype code, and
/// within a dtype the params gathered in place before those staged on the grad buffer
/// ([`ParamSpec::is_staged`]): a bucket is gathered by one collective over its own bytes, in
/// param storage or on its staging view, never by two over the whole bucket. Buffers without
/// params are left out.
pub(crate) fn group_buffers(params: &[ParamSpec], routes: &[Route], cfg: &Config) -> Vec<BufferGroup> {
    let mut groups = Vec::new();
    for route in [Route::Muon, Route::Adamw] {
        for &dtype in Dtype::ALL {
            for staged in [false, true] {
                let ids: Vec<u32> = (0..params.len())
                    .filter(|&i| routes[i] == route && params[i].dtype == dtype && params[i].is_staged(cfg) == staged)
                    .map(|i| i as u32)
                    .collect();
                if !ids.is_empty() {
                    groups.push(BufferGroup {
                        route,
                        dtype,
                        params: ids,
                    });
                }
            }
        }
    }
    groups
}

/// Elements a bucket membership (backward order) spans, each param starting 64-aligned, as
/// [`backward_chunks`] counts them.
pub(crate) fn chunk_span(params: &[ParamSpec], chunk: &[u32]) -> u64 {
    chunk
        .iter()
        .fold(0, |cursor, &id| pad64(cursor) + params[id as usize].numel())
}

/// Splits a buffer's params into bucket memberships: params walked in reverse registration
/// order, each starting 64-aligned; a bucket closes once it spans `bucket_size` elements.
/// `None` means one bucket for the whole buffer.
pub(crate) fn backward_chunks(params: &[ParamSpec], ids: &[u32], bucket_size: Option<u64>) -> Vec<Vec<u32>> {
    let mut chunks = Vec::new();
    let mut chunk = Vec::new();
    let mut cursor = 0;
    for &id in ids.iter().rev() {
        cursor = pad64(cursor) + params[id as usize].numel();
        chunk.push(id);
        if bucket_size.is_some_and(|size| cursor >= size) {
            chunks.push(std::mem::take(&mut chunk));
            cursor = 0;
        }
    }
    if !chunk.is_empty() {
        chunks.push(chunk);
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_helpers_round_up() {
        assert_eq!(pad64(0), 0);
        assert_eq!(pad64(1), 64);
        assert_eq!(pad64(128), 128);
        assert_eq!(pad_to(129, 96), 192);
        assert_eq!(lcm(3, 128), 384);
        assert_eq!(lcm(64, 128), 128);
    }

    #[test]
    fn chunks_close_at_bucket_size_in_backward_order() {
        let params: Vec<ParamSpec> = [100, 30, 50, 200]
            .iter()
            .enumerate()
            .map(|(i, &n)| ParamSpec::new(format!("p{i}"), &[n], Dtype::F32))
            .collect();
        let ids = [0, 1, 2, 3];
        assert_eq!(backward_chunks(&params, &ids, Some(250)), vec![vec![3, 2], vec![1, 0]]);
        assert_eq!(backward_chunks(&params, &ids, None), vec![vec![3, 2, 1, 0]]);
    }
}

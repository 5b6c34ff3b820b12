//! The plan's data: buffers, buckets and per-parameter placements. Everything is in elements
//! of the buffer a thing lives in, never bytes.

use crate::config::{Dtype, MuonLayout};
use crate::model::Route;

use super::report::Report;

/// A half-open element range `start..end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
pub struct ElemRange {
    pub start: u64,
    pub end: u64,
}

impl ElemRange {
    /// The range `start..end`.
    pub fn new(start: u64, end: u64) -> Self {
        ElemRange { start, end }
    }

    /// Number of elements.
    pub fn len(self) -> u64 {
        self.end - self.start
    }

    /// True when the range holds no element.
    pub fn is_empty(self) -> bool {
        self.start == self.end
    }

    /// The range moved `delta` elements towards zero.
    pub fn shifted_down(self, delta: u64) -> ElemRange {
        ElemRange::new(self.start - delta, self.end - delta)
    }

    /// The overlap of two ranges, if any element is shared.
    pub fn intersect(self, other: ElemRange) -> Option<ElemRange> {
        let start = self.start.max(other.start);
        let end = self.end.min(other.end);
        (start < end).then_some(ElemRange { start, end })
    }
}

/// One contiguous allocation: all params of one route and one dtype.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Buffer {
    pub route: Route,
    pub dtype: Dtype,
    /// Elements, padding included.
    pub numel: u64,
    /// Elements of the param storage: `numel` less the buckets that have none (see
    /// [`Bucket::param_start`]). Grad storage always has `numel`.
    pub param_numel: u64,
    /// Global id of this buffer's first bucket; its buckets are `first_bucket..first_bucket + num_buckets`.
    pub first_bucket: u32,
    pub num_buckets: u32,
}

/// How a bucket is divided among ranks.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BucketSplit {
    /// Compact and allreduce Muon buckets: rank r owns `ranges[r]` (possibly empty), in rank order.
    OwnerRanges(Vec<ElemRange>),
    /// Padded Muon and all AdamW buckets: `dp` equal shards; shard r is
    /// `start + r·shard_size .. start + (r+1)·shard_size`.
    EqualShards { shard_size: u64 },
}

/// Params of one route whose gradients become ready together, stored contiguously.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Bucket {
    /// Global bucket id: buffers in order, buckets of a buffer in backward order.
    pub id: u32,
    pub route: Route,
    pub dtype: Dtype,
    /// Index into `Plan::buffers`.
    pub buffer: u32,
    /// Element range in the buffer; `end` includes padding.
    pub start: u64,
    pub end: u64,
    /// Param ids in layout (memory) order.
    pub params: Vec<u32>,
    pub split: BucketSplit,
    /// Where this bucket starts in its buffer's param storage, which holds the buckets that have
    /// one back to back in bucket order; `None` when every param of the bucket travels as bf16
    /// staged on its grad bytes (MXFP8 with `mxfp8_param_gather`), so nothing ever reads or
    /// writes it in param storage.
    pub param_start: Option<u64>,
}

impl Bucket {
    /// Elements, padding included.
    pub fn numel(&self) -> u64 {
        self.end - self.start
    }

    /// The element range (in the buffer) that rank `rank` owns or shards in this bucket.
    pub fn rank_range(&self, rank: usize) -> ElemRange {
        match &self.split {
            BucketSplit::OwnerRanges(ranges) => ranges[rank],
            BucketSplit::EqualShards { shard_size } => {
                let start = self.start + rank as u64 * shard_size;
                ElemRange::new(start, start + shard_size)
            }
        }
    }

    /// Where `range` (elements of this bucket) lies in the buffer's param storage; `None` when
    /// the bucket has none.
    pub fn param_range(&self, range: ElemRange) -> Option<ElemRange> {
        self.param_start
            .map(|first| ElemRange::new(first + (range.start - self.start), first + (range.end - self.start)))
    }

    /// Per-rank owner ranges of a compact or allreduce Muon bucket.
    pub fn owner_ranges(&self) -> Option<&[ElemRange]> {
        match &self.split {
            BucketSplit::OwnerRanges(ranges) => Some(ranges),
            BucketSplit::EqualShards { .. } => None,
        }
    }

    /// Shard size of a padded Muon or AdamW bucket.
    pub fn shard_size(&self) -> Option<u64> {
        match self.split {
            BucketSplit::OwnerRanges(_) => None,
            BucketSplit::EqualShards { shard_size } => Some(shard_size),
        }
    }
}

/// Buckets in the order the forward first uses them: by the smallest registration index of
/// their params (registration order is forward order). The schedule issues param collectives
/// in this order and gradient collectives in its reverse (docs/design.md §5).
pub fn forward_order(buckets: &[Bucket]) -> Vec<usize> {
    let first_use = |b: &Bucket| b.params.iter().copied().min().unwrap_or(u32::MAX);
    let mut order: Vec<usize> = (0..buckets.len()).collect();
    order.sort_by_key(|&b| (first_use(&buckets[b]), b));
    order
}

/// Where one param lives and who owns it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ParamPlacement {
    pub route: Route,
    /// Index into `Plan::buffers`.
    pub buffer: u32,
    /// Global bucket id.
    pub bucket: u32,
    /// First element in the buffer (64-element aligned).
    pub offset: u64,
    pub numel: u64,
    /// Elements of one Muon unit (`numel` unless the param is an expert stack).
    pub unit_numel: u64,
    /// Muon: the owner rank of every unit (one per expert of a stack). AdamW: empty.
    pub unit_owners: Vec<u32>,
}

impl ParamPlacement {
    /// The element range of the whole param in its buffer.
    pub fn range(&self) -> ElemRange {
        ElemRange::new(self.offset, self.offset + self.numel)
    }

    /// The element range of Muon unit `unit` in the buffer.
    pub fn unit_range(&self, unit: usize) -> ElemRange {
        let start = self.offset + unit as u64 * self.unit_numel;
        ElemRange::new(start, start + self.unit_numel)
    }

    /// The rank owning every unit of a Muon param, or `None` for AdamW params (sharded) and
    /// expert stacks split over several ranks.
    pub fn single_owner(&self) -> Option<u32> {
        let (&first, rest) = self.unit_owners.split_first()?;
        rest.iter().all(|&r| r == first).then_some(first)
    }
}

/// The complete, deterministic layout and ownership of every parameter.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Plan {
    pub dp: u32,
    pub layout: MuonLayout,
    pub buffers: Vec<Buffer>,
    pub buckets: Vec<Bucket>,
    /// Indexed by param id (registration index).
    pub params: Vec<ParamPlacement>,
    /// 64-bit FNV-1a hash of the inputs and the layout; equal on every rank that planned the
    /// same model with the same config.
    #[serde(with = "hex_u64")]
    pub hash: u64,
    pub report: Report,
}

/// Serializes a `u64` as a `"0x…"` hex string, so JSON readers that parse numbers as doubles
/// keep every bit.
mod hex_u64 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &u64, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format!("{value:#018x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
        let text = String::deserialize(deserializer)?;
        let digits = text.strip_prefix("0x").unwrap_or(&text);
        u64::from_str_radix(digits, 16).map_err(serde::de::Error::custom)
    }
}

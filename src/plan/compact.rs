//! In-bucket layout of the `compact`, `compact_rooted` and `allreduce` modes: params ordered
//! by owner so that every rank's owned elements form one contiguous range.
//!
//! Shard buckets of `compact` (`groups.rs`) hold dp equal shards, shard r holding rank r's
//! matrices back to back (every element count is 64-aligned, so there is no gap), or expert
//! stacks back to back, each cut into equal pieces of consecutive experts, one piece per rank.
//! Rooted buckets are laid out as below.
//!
//! For each rank r in order: [the tail of a stack begun on an earlier rank] [r's atomic
//! matrices, in backward order] [stacks entirely owned by r] [the head of a stack continuing
//! onto later ranks]. A rank strictly inside a stack split holds only its middle piece. Param
//! starts are 64-aligned; stack pieces continue without a gap, so each param stays contiguous.

use crate::bail;
use crate::error::Result;
use crate::model::ParamSpec;

use super::buckets::{BufferKey, PARAM_ALIGN, pad64};
use super::groups::CompactBucket;
use super::types::{Bucket, BucketSplit, ElemRange, ParamPlacement};

/// A run of consecutive units of one expert stack owned by one rank.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Piece {
    param: u32,
    units: u64,
}

/// What one rank holds in one bucket.
#[derive(Default)]
struct RankItems {
    tail: Option<Piece>,
    middle: Option<Piece>,
    atoms: Vec<u32>,
    entire: Vec<u32>,
    head: Option<Piece>,
}

impl RankItems {
    fn holds_whole_params(&self) -> bool {
        !self.atoms.is_empty() || !self.entire.is_empty() || self.head.is_some()
    }
}

/// Sorts the params of one bucket (membership in backward order) into per-rank items.
fn items_per_rank(
    params: &[ParamSpec],
    chunk: &[u32],
    placements: &[ParamPlacement],
    dp: usize,
) -> Result<Vec<RankItems>> {
    let mut items: Vec<RankItems> = (0..dp).map(|_| RankItems::default()).collect();
    for &param in chunk {
        let owners = &placements[param as usize].unit_owners;
        if !params[param as usize].is_expert_stack() {
            items[owners[0] as usize].atoms.push(param);
            continue;
        }
        let runs = owner_runs(owners);
        if runs.windows(2).any(|w| w[0].0 >= w[1].0) {
            bail!(
                Internal,
                "plan: expert stack {param} has owners out of rank order: {owners:?}"
            );
        }
        if let [(rank, _)] = runs[..] {
            items[rank as usize].entire.push(param);
            continue;
        }
        let last = runs.len() - 1;
        for (i, &(rank, units)) in runs.iter().enumerate() {
            let piece = Some(Piece { param, units });
            let slot = match i {
                0 => &mut items[rank as usize].head,
                i if i == last => &mut items[rank as usize].tail,
                _ => &mut items[rank as usize].middle,
            };
            if slot.is_some() {
                bail!(
                    Internal,
                    "plan: rank {rank} holds pieces of two split stacks in one bucket"
                );
            }
            *slot = piece;
        }
    }
    Ok(items)
}

/// `(owner, number of consecutive units)` runs of a stack's owner list.
fn owner_runs(owners: &[u32]) -> Vec<(u32, u64)> {
    let mut runs: Vec<(u32, u64)> = Vec::new();
    for &owner in owners {
        match runs.last_mut() {
            Some((rank, count)) if *rank == owner => *count += 1,
            _ => runs.push((owner, 1)),
        }
    }
    runs
}

/// Lays out one compact bucket (membership `chunk`, backward order) starting at buffer element
/// `start`; records param offsets. Fails with `Internal` if the owners break contiguity.
pub(crate) fn layout_compact_bucket(
    params: &[ParamSpec],
    chunk: &[u32],
    start: u64,
    local: usize,
    dp: usize,
    key: BufferKey,
    placements: &mut [ParamPlacement],
) -> Result<Bucket> {
    let items = items_per_rank(params, chunk, placements, dp)?;
    let id = key.first_bucket + local as u32;
    let mut cursor = start;
    let mut open: Option<u32> = None;
    let mut order = Vec::with_capacity(chunk.len());
    let mut ranges = Vec::with_capacity(dp);
    for (rank, items) in items.iter().enumerate() {
        let mut first = None;
        let mut continue_piece = |piece: Piece, cursor: &mut u64| {
            first.get_or_insert(*cursor);
            *cursor += piece.units * placements[piece.param as usize].unit_numel;
        };
        match (open, items.middle, items.tail) {
            (Some(p), Some(piece), None) if piece.param == p && !items.holds_whole_params() => {
                continue_piece(piece, &mut cursor);
            }
            (Some(p), None, Some(piece)) if piece.param == p => {
                continue_piece(piece, &mut cursor);
                open = None;
            }
            (Some(_), None, None) if !items.holds_whole_params() => {}
            (None, None, None) => {}
            _ => bail!(
                Internal,
                "plan: bucket {id}: rank {rank}'s owned range would not be contiguous"
            ),
        }
        if open.is_none() {
            let whole = items
                .atoms
                .iter()
                .chain(&items.entire)
                .map(|&p| (p, params[p as usize].numel()));
            let head = items
                .head
                .map(|h| (h.param, h.units * placements[h.param as usize].unit_numel));
            for (param, numel) in whole.chain(head) {
                cursor = pad64(cursor);
                first.get_or_insert(cursor);
                key.place(&mut placements[param as usize], id, cursor);
                order.push(param);
                cursor += numel;
            }
            open = items.head.map(|h| h.param);
        }
        ranges.push(ElemRange::new(first.unwrap_or(cursor), cursor));
    }
    if let Some(p) = open {
        bail!(Internal, "plan: bucket {id}: expert stack {p} ends on no rank");
    }
    let end = pad64(cursor);
    Ok(key.bucket(local, start, end, order, BucketSplit::OwnerRanges(ranges)))
}

/// Lays out one Muon buffer in compact mode from its bucket memberships (backward order);
/// owners must already be in `placements`.
pub(crate) fn layout_compact(
    params: &[ParamSpec],
    chunks: &[Vec<u32>],
    dp: usize,
    key: BufferKey,
    placements: &mut [ParamPlacement],
) -> Result<Vec<Bucket>> {
    let mut buckets: Vec<Bucket> = Vec::with_capacity(chunks.len());
    for (local, chunk) in chunks.iter().enumerate() {
        let start = buckets.last().map_or(0, |b| b.end);
        buckets.push(layout_compact_bucket(params, chunk, start, local, dp, key, placements)?);
    }
    Ok(buckets)
}

/// Lays out one Muon buffer in `compact` mode from its bucket sequence; records the owners of
/// shard buckets (rooted owners must already be in `placements`).
pub(crate) fn layout_grouped(
    params: &[ParamSpec],
    sequence: &[CompactBucket],
    dp: usize,
    key: BufferKey,
    placements: &mut [ParamPlacement],
) -> Result<Vec<Bucket>> {
    let mut buckets: Vec<Bucket> = Vec::with_capacity(sequence.len());
    for (local, bucket) in sequence.iter().enumerate() {
        let start = buckets.last().map_or(0, |b| b.end);
        buckets.push(match bucket {
            CompactBucket::Rooted(chunk) => layout_compact_bucket(params, chunk, start, local, dp, key, placements)?,
            CompactBucket::Shards(shards) => layout_shards(params, shards, start, local, key, placements)?,
            CompactBucket::Stacks(stacks) => layout_split_stacks(params, stacks, start, local, dp, key, placements)?,
        });
    }
    Ok(buckets)
}

/// A bucket of equal shards, shard r holding `shards[r]` (all owned by rank r) back to back.
fn layout_shards(
    params: &[ParamSpec],
    shards: &[Vec<u32>],
    start: u64,
    local: usize,
    key: BufferKey,
    placements: &mut [ParamPlacement],
) -> Result<Bucket> {
    let id = key.first_bucket + local as u32;
    let shard_size: u64 = shards[0].iter().map(|&p| params[p as usize].numel()).sum();
    let mut cursor = start;
    let mut order = Vec::new();
    for (rank, shard) in shards.iter().enumerate() {
        for &param in shard {
            key.place(&mut placements[param as usize], id, cursor);
            placements[param as usize].unit_owners = vec![rank as u32];
            order.push(param);
            cursor += params[param as usize].numel();
        }
        if cursor != start + (rank as u64 + 1) * shard_size || !cursor.is_multiple_of(PARAM_ALIGN) {
            bail!(
                Internal,
                "plan: bucket {id}: shard {rank} does not end at {} elements (64-aligned)",
                (rank as u64 + 1) * shard_size
            );
        }
    }
    Ok(key.bucket(local, start, cursor, order, BucketSplit::EqualShards { shard_size }))
}

/// A bucket of equal expert stacks back to back, `k·E/dp` consecutive experts per rank: with
/// `k = dp / gcd(E, dp)` stacks that is `E / gcd(E, dp)` experts, so each rank's piece lies in
/// one stack (`groups.rs`).
fn layout_split_stacks(
    params: &[ParamSpec],
    stacks: &[u32],
    start: u64,
    local: usize,
    dp: usize,
    key: BufferKey,
    placements: &mut [ParamPlacement],
) -> Result<Bucket> {
    let id = key.first_bucket + local as u32;
    let units: u64 = stacks.iter().map(|&p| params[p as usize].num_units()).sum();
    if !units.is_multiple_of(dp as u64) {
        bail!(
            Internal,
            "plan: bucket {id}: {units} experts do not split among {dp} ranks"
        );
    }
    let per_rank = units / dp as u64;
    let (mut cursor, mut unit) = (start, 0u64);
    for &param in stacks {
        let placement = &mut placements[param as usize];
        key.place(placement, id, cursor);
        for owner in placement.unit_owners.iter_mut() {
            *owner = (unit / per_rank) as u32;
            unit += 1;
        }
        cursor += params[param as usize].numel();
    }
    let split = BucketSplit::EqualShards {
        shard_size: (cursor - start) / dp as u64,
    };
    Ok(key.bucket(local, start, cursor, stacks.to_vec(), split))
}

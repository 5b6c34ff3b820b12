//! Balancing swaps between the shards of `compact`'s shard buckets (docs/design.md §4).
//!
//! A shard bucket holds dp shards of equal elements, shard r rank r's whole matrices. Groups
//! of one class give every rank the same Newton–Schulz work, but packed leftovers need not
//! (gpt2-124m at dp 5: four shards of one MLP matrix, one of a QKV and a projection, equal in
//! elements, 3 against 4 units of work), and the rooted rest placed on top may then be too
//! coarse to even out. Exchanging one or two matrices of the busiest rank's shard for one or
//! two of another rank's shard in the same bucket with as many elements keeps every shard's
//! size, so the bytes and the collectives stay as they are, and moves work between the two.
//! The busiest rank trades, each time the exchange that lowers the larger of the two loads
//! most, until no exchange lowers it.

use crate::model::ParamSpec;

use super::cost::ns_unit_cost;
use super::groups::CompactBucket;
use super::types::ParamPlacement;

/// One or two matrices of a shard: their elements, their Newton–Schulz cost and their
/// positions in the shard.
struct Subset {
    numel: u64,
    cost: u128,
    members: Vec<usize>,
}

/// Every single matrix and every pair of a shard.
fn subsets(params: &[ParamSpec], shard: &[u32], steps: u32) -> Vec<Subset> {
    let of = |i: usize| {
        (
            params[shard[i] as usize].numel(),
            ns_unit_cost(&params[shard[i] as usize], steps),
        )
    };
    let mut out = Vec::new();
    for i in 0..shard.len() {
        let (numel, cost) = of(i);
        out.push(Subset {
            numel,
            cost,
            members: vec![i],
        });
        for j in i + 1..shard.len() {
            let (numel_j, cost_j) = of(j);
            out.push(Subset {
                numel: numel + numel_j,
                cost: cost + cost_j,
                members: vec![i, j],
            });
        }
    }
    out
}

/// Each rank's Newton–Schulz work: its rooted units (owners in `placements`) and its shards.
/// Split expert stacks give every rank the same experts of one class and are left out.
fn loads(
    params: &[ParamSpec],
    sequences: &[Vec<CompactBucket>],
    placements: &[ParamPlacement],
    dp: usize,
    steps: u32,
) -> Vec<u128> {
    let mut loads = vec![0u128; dp];
    for bucket in sequences.iter().flatten() {
        match bucket {
            CompactBucket::Rooted(ids) => {
                for &p in ids {
                    let cost = ns_unit_cost(&params[p as usize], steps);
                    for &owner in &placements[p as usize].unit_owners {
                        loads[owner as usize] += cost;
                    }
                }
            }
            CompactBucket::Shards(shards) => {
                for (rank, shard) in shards.iter().enumerate() {
                    loads[rank] += shard
                        .iter()
                        .map(|&p| ns_unit_cost(&params[p as usize], steps))
                        .sum::<u128>();
                }
            }
            CompactBucket::Stacks(_) => {}
        }
    }
    loads
}

/// The best exchange for the busiest rank `r`: (bucket, other rank, r's subset, its subset,
/// the larger of the two loads after it).
type Exchange = (usize, usize, Vec<usize>, Vec<usize>, u128);

fn best_exchange(
    params: &[ParamSpec],
    buckets: &[&mut CompactBucket],
    loads: &[u128],
    r: usize,
    steps: u32,
) -> Option<Exchange> {
    let mut best: Option<Exchange> = None;
    for (b, bucket) in buckets.iter().enumerate() {
        let CompactBucket::Shards(shards) = &**bucket else {
            continue;
        };
        let mine = subsets(params, &shards[r], steps);
        for s in (0..loads.len()).filter(|&s| loads[s] < loads[r]) {
            for theirs in subsets(params, &shards[s], steps) {
                for give in mine.iter().filter(|g| g.numel == theirs.numel && g.cost > theirs.cost) {
                    let moved = give.cost - theirs.cost;
                    let larger = (loads[r] - moved).max(loads[s] + moved);
                    if larger < loads[r] && best.as_ref().is_none_or(|e| larger < e.4) {
                        best = Some((b, s, give.members.clone(), theirs.members.clone(), larger));
                    }
                }
            }
        }
    }
    best
}

/// Swaps matrices between the shards of the Muon buffers' shard buckets until the busiest
/// rank's Newton–Schulz work can no longer be lowered (module docs). Rooted owners must be in
/// `placements`; shard owners follow the shards when the buckets are laid out.
pub(crate) fn rebalance_shards(
    params: &[ParamSpec],
    sequences: &mut [Vec<CompactBucket>],
    placements: &[ParamPlacement],
    dp: usize,
    steps: u32,
) {
    let mut loads = loads(params, sequences, placements, dp, steps);
    let mut buckets: Vec<&mut CompactBucket> = sequences.iter_mut().flatten().collect();
    // Each exchange lowers the busiest load or the number of ranks at it, so the sorted loads
    // fall: the loop ends; the bound only caps the work on pathological inputs.
    let matrices: usize = buckets
        .iter()
        .map(|b| match &**b {
            CompactBucket::Shards(shards) => shards.iter().map(Vec::len).sum(),
            _ => 0,
        })
        .sum();
    for _ in 0..matrices {
        let busiest = (0..dp).max_by_key(|&r| (loads[r], std::cmp::Reverse(r))).unwrap_or(0);
        let Some((b, s, give, take, _)) = best_exchange(params, &buckets, &loads, busiest, steps) else {
            return;
        };
        let CompactBucket::Shards(shards) = &mut *buckets[b] else {
            unreachable!("exchanges are found in shard buckets")
        };
        let given: Vec<u32> = give.iter().map(|&i| shards[busiest][i]).collect();
        let taken: Vec<u32> = take.iter().map(|&i| shards[s][i]).collect();
        let cost = |ids: &[u32]| {
            ids.iter()
                .map(|&p| ns_unit_cost(&params[p as usize], steps))
                .sum::<u128>()
        };
        loads[busiest] = loads[busiest] - cost(&given) + cost(&taken);
        loads[s] = loads[s] - cost(&taken) + cost(&given);
        shards[busiest].retain(|p| !given.contains(p));
        shards[s].retain(|p| !taken.contains(p));
        shards[busiest].extend(taken);
        shards[s].extend(given);
    }
}

//! `muon_ownership = contiguous`: every rank owns one run of consecutive Muon units in backward
//! order, and the rooted buckets are cut at owner changes, so a bucket has one owner (two or
//! more only around an expert stack split between ranks).
//!
//! Each rooted bucket costs one reduce and one broadcast per owner, and on a ring over dp ranks
//! each of those pays dp − 1 hops of latency. Balanced ownership (`ownership.rs`) spreads a
//! bucket over many owners: at least `buckets + dp − 1` (bucket, owner) pairs, against the
//! `buckets` reduce-scatters and all-gathers of a distributed AdamW. Here the pairs are the
//! buckets, and there are about `max(dp, bytes / bucket_size)` of them: a bucket closes once it
//! spans `bucket_size`, as in the other layouts, except that the end of an owner's run shorter
//! than `bucket_size` stays in the bucket before it rather than paying a collective of its own,
//! so every bucket spans at least `bucket_size` unless its whole run is shorter.
//!
//! The price is balance: the runs are the optimal contiguous partition of the Newton–Schulz
//! cost (the smallest per-rank limit under which consecutive filling fits in dp ranks), whose
//! makespan is at most `total/dp + largest unit` and can exceed LPT's.

use crate::model::ParamSpec;

use super::buckets::{backward_chunks, chunk_span};
use super::cost::ns_unit_cost;
use super::types::ParamPlacement;

/// The Muon units of `order` (params in backward order) as (param, unit cost, units).
fn units(params: &[ParamSpec], order: &[u32], steps: u32) -> Vec<(u32, u128, u64)> {
    order
        .iter()
        .map(|&p| {
            let spec = &params[p as usize];
            (p, ns_unit_cost(spec, steps), spec.num_units())
        })
        .collect()
}

/// Ranks used when consecutive units fill each rank up to `limit` (a unit above `limit` on an
/// empty rank still goes there).
fn ranks_needed(units: &[(u32, u128, u64)], limit: u128, mut owners: Option<&mut Vec<Vec<u32>>>) -> usize {
    let (mut rank, mut load) = (0usize, 0u128);
    for (i, &(_, cost, count)) in units.iter().enumerate() {
        for _ in 0..count {
            if load > 0 && load + cost > limit {
                rank += 1;
                load = 0;
            }
            load += cost;
            if let Some(owners) = owners.as_deref_mut() {
                owners[i].push(rank as u32);
            }
        }
    }
    rank + 1
}

/// The least per-rank limit under which consecutive filling fits `units` in `dp` ranks: the
/// optimal contiguous partition's makespan (a binary search; filling is monotone in the limit).
fn least_limit(units: &[(u32, u128, u64)], dp: usize) -> u128 {
    let total: u128 = units.iter().map(|&(_, c, n)| c * n as u128).sum();
    let largest = units.iter().map(|&(_, c, _)| c).max().unwrap_or(0);
    // Filling under `total/dp + largest` always fits: every rank it closes holds more than
    // total/dp.
    let (mut lo, mut hi) = (largest, total.div_ceil(dp as u128) + largest);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if ranks_needed(units, mid, None) <= dp {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    hi
}

/// Owns the Muon params of `order` (every Muon buffer's params in backward order, buffer after
/// buffer) by the optimal contiguous partition over `dp` ranks; writes `unit_owners`.
pub(crate) fn assign_contiguous(
    params: &[ParamSpec],
    order: &[u32],
    dp: usize,
    steps: u32,
    placements: &mut [ParamPlacement],
) {
    let units = units(params, order, steps);
    let limit = least_limit(&units, dp);
    let mut owners = vec![Vec::new(); units.len()];
    ranks_needed(&units, limit, Some(&mut owners));
    for (&(param, _, _), owners) in units.iter().zip(owners) {
        placements[param as usize].unit_owners = owners;
    }
}

/// Bucket memberships of one Muon buffer (`ids` in registration order) under contiguous owners:
/// walked in backward order, a run of params whose first unit has the previous param's last
/// owner stays together and is cut as every buffer is (`backward_chunks`: a bucket closes once
/// it spans `bucket_size`), except that a last bucket shorter than `bucket_size` joins the one
/// before it (`None`: one bucket per run).
pub(crate) fn owner_chunks(
    params: &[ParamSpec],
    ids: &[u32],
    placements: &[ParamPlacement],
    bucket_size: Option<u64>,
) -> Vec<Vec<u32>> {
    let mut runs: Vec<Vec<u32>> = Vec::new();
    let mut last_owner: Option<u32> = None;
    for &p in ids.iter().rev() {
        let owners = &placements[p as usize].unit_owners;
        match runs.last_mut() {
            Some(run) if last_owner == owners.first().copied() => run.push(p),
            _ => runs.push(vec![p]),
        }
        last_owner = owners.last().copied();
    }
    let mut chunks = Vec::new();
    for run in runs {
        let in_registration_order: Vec<u32> = run.into_iter().rev().collect();
        let mut cut = backward_chunks(params, &in_registration_order, bucket_size);
        let short = |chunk: &[u32]| bucket_size.is_some_and(|size| chunk_span(params, chunk) < size);
        if cut.len() > 1 && short(&cut[cut.len() - 1]) {
            let tail = cut.pop().unwrap_or_default();
            if let Some(last) = cut.last_mut() {
                last.extend(tail);
            }
        }
        chunks.extend(cut);
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The least makespan of any split of `costs` into at most `dp` consecutive runs, by trying
    /// every set of cut points.
    fn brute_force(costs: &[u128], dp: usize) -> u128 {
        let n = costs.len();
        (0u32..1 << (n - 1))
            .filter(|cuts| (cuts.count_ones() as usize) < dp)
            .map(|cuts| {
                let (mut worst, mut run) = (0, 0);
                for (i, &c) in costs.iter().enumerate() {
                    run += c;
                    if i + 1 == n || cuts >> i & 1 == 1 {
                        worst = worst.max(run);
                        run = 0;
                    }
                }
                worst
            })
            .min()
            .unwrap()
    }

    /// The limit found is the optimal contiguous makespan on random costs (one unit per param
    /// and stacks of several units), and filling under it gives every unit a rank below dp with
    /// owners that never decrease.
    #[test]
    fn the_least_limit_is_the_optimal_contiguous_partition() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |below: u64| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) % below
        };
        for _ in 0..300 {
            let params = 1 + next(6) as usize;
            let units: Vec<(u32, u128, u64)> = (0..params)
                .map(|p| (p as u32, 1 + next(50) as u128, 1 + next(3)))
                .collect();
            let costs: Vec<u128> = units
                .iter()
                .flat_map(|&(_, c, n)| std::iter::repeat_n(c, n as usize))
                .collect();
            let dp = 1 + next(5) as usize;
            let limit = least_limit(&units, dp);
            assert_eq!(limit, brute_force(&costs, dp), "{units:?} over {dp}");
            let mut owners = vec![Vec::new(); units.len()];
            assert!(ranks_needed(&units, limit, Some(&mut owners)) <= dp);
            let flat: Vec<u32> = owners.concat();
            assert_eq!(flat.len(), costs.len());
            assert!(flat.windows(2).all(|w| w[0] <= w[1]), "{flat:?}");
        }
    }
}

//! Muon ownership for the `compact` and `allreduce` layouts.
//!
//! The ownership unit is one matrix; an expert stack `[E, m, n]` is E units whose memory order
//! is fixed, so a stack can only be split among consecutive ranks, and a rank strictly inside
//! such a split ("intermediate" for that bucket) can own nothing else in that bucket — else its
//! owned range in the bucket would not be contiguous. The assignment:
//!
//! 1. **Atomic matrices** (Muon params that are not expert stacks) are placed by global LPT
//!    over *all* units, stack units included: cost descending (ties: registration index, then
//!    unit index) onto the rank with the least accumulated cost (ties: the rank owning a unit
//!    of the nearest bucket, then the lowest rank: fewer owners per bucket), skipping
//!    ranks that would exceed the memory cap (1.3 × the mean Muon elements per rank) unless
//!    none fits, then the one with the fewest elements. Only the atomics keep their rank:
//!    counting stack units here just tells LPT how much indivisible work is still to come.
//! 2. **Expert stacks** fill around the atomics, largest unit first (ties: layout order): each
//!    stack goes to consecutive ranks starting from the last rank used by an earlier stack of
//!    the same bucket (rank 0 for a bucket's first stack), filling each rank while its load
//!    stays within a limit M. M is the smallest limit for which every unit finds a rank
//!    (binary search). Each stack's owners are nondecreasing along it, and the stacks of one
//!    bucket follow rank order, so their pieces line up in memory.
//! 3. **Conflicts**: an atomic matrix whose owner is intermediate for a stack of its bucket
//!    swaps owners with an atomic matrix of equal cost and size for which the swap is allowed
//!    (loads unchanged); without such a twin it moves to the allowed rank with the least cost,
//!    and step 2 runs again on the new loads (at most `MAX_REWRAPS` times).
//! 4. **Guarantee**: if the makespan then exceeds `total/dp + largest unit` (possible only in
//!    adversarial models where the memory cap or conflicts bind), the whole assignment is
//!    replaced by one global wrap over all units in layout order: the optimal contiguous
//!    partition of `contiguous.rs` (owners nondecreasing along the units, so contiguity holds by
//!    construction), whose makespan is within that bound.
//!
//! A plain global LPT would scatter a stack's experts over arbitrary ranks (its memory order
//! is fixed, so owner ranges would not be contiguous); wrapping stacks first at `total/dp`
//! each would put the large dense matrices (e.g. a MoE model's dense MLPs) on top of a full
//! share of expert work. All arithmetic is exact (`u128`), so every rank computes the same
//! owners.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

use crate::model::ParamSpec;

use super::contiguous::assign_contiguous;
use super::cost::ns_unit_cost;
use super::types::ParamPlacement;

/// How the owners of a plan were chosen (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OwnershipMethod {
    /// LPT of atomic matrices, then first-fit of expert stacks (compact, allreduce).
    LptStackFill,
    /// One wrap over all units in layout order (the guaranteed fallback).
    GlobalWrap,
    /// Megatron-LM's per-bucket cost-balanced shard assignment (padded).
    MegatronPadded,
    /// One run of consecutive units per rank, buckets cut at owner changes
    /// (`muon_ownership = contiguous`, `contiguous.rs`).
    Contiguous,
}

impl OwnershipMethod {
    /// The snake_case name used in JSON and tables.
    pub fn name(self) -> &'static str {
        match self {
            OwnershipMethod::LptStackFill => "lpt_stack_fill",
            OwnershipMethod::GlobalWrap => "global_wrap",
            OwnershipMethod::MegatronPadded => "megatron_padded",
            OwnershipMethod::Contiguous => "contiguous",
        }
    }
}

/// Rounds of "partition stacks, move conflicting atomics" before the last conflicts are
/// settled without partitioning again.
const MAX_REWRAPS: usize = 8;

/// A Muon param that is one unit.
struct Atom {
    param: u32,
    bucket: usize,
    cost: u128,
    numel: u64,
}

/// An expert stack: `units` equal, consecutive units.
struct Stack {
    param: u32,
    bucket: usize,
    units: u64,
    unit_cost: u128,
    unit_numel: u64,
}

/// The units of the Muon buckets, in layout order.
struct Units {
    atoms: Vec<Atom>,
    stacks: Vec<Stack>,
    total_cost: u128,
    total_numel: u64,
    largest: u128,
}

impl Units {
    fn collect(params: &[ParamSpec], buckets: &[Vec<u32>], steps: u32) -> Self {
        let mut units = Units {
            atoms: Vec::new(),
            stacks: Vec::new(),
            total_cost: 0,
            total_numel: 0,
            largest: 0,
        };
        for (bucket, ids) in buckets.iter().enumerate() {
            for &param in ids {
                let spec = &params[param as usize];
                let cost = ns_unit_cost(spec, steps);
                let count = spec.num_units();
                units.total_cost += cost * count as u128;
                units.total_numel += spec.numel();
                units.largest = units.largest.max(cost);
                if spec.is_expert_stack() {
                    let unit_numel = spec.numel() / count;
                    units.stacks.push(Stack {
                        param,
                        bucket,
                        units: count,
                        unit_cost: cost,
                        unit_numel,
                    });
                } else {
                    units.atoms.push(Atom {
                        param,
                        bucket,
                        cost,
                        numel: spec.numel(),
                    });
                }
            }
        }
        units
    }
}

/// Accumulated cost and elements per rank, and the memory cap.
struct Loads {
    cost: Vec<u128>,
    numel: Vec<u64>,
    total_numel: u64,
}

impl Loads {
    fn new(dp: usize, total_numel: u64) -> Self {
        Loads {
            cost: vec![0; dp],
            numel: vec![0; dp],
            total_numel,
        }
    }

    /// True if `numel` more elements keep rank `r` within 1.3 × the mean.
    fn fits(&self, r: usize, numel: u64) -> bool {
        10 * self.cost.len() as u128 * (self.numel[r] + numel) as u128 <= 13 * self.total_numel as u128
    }

    fn add(&mut self, r: usize, cost: u128, numel: u64) {
        self.cost[r] += cost;
        self.numel[r] += numel;
    }

    fn remove(&mut self, r: usize, cost: u128, numel: u64) {
        self.cost[r] -= cost;
        self.numel[r] -= numel;
    }

    /// The allowed rank with the fewest elements (ties: lowest rank).
    fn fewest_elements(&self, allowed: impl Fn(usize) -> bool) -> usize {
        (0..self.cost.len())
            .filter(|&r| allowed(r))
            .min_by_key(|&r| self.numel[r])
            .unwrap_or(0)
    }

    /// The allowed rank with the least cost among those that stay within the memory cap with
    /// `numel` more elements, else the allowed rank with the fewest elements; ties go to the
    /// lowest rank.
    fn pick(&self, numel: u64, allowed: impl Fn(usize) -> bool) -> usize {
        (0..self.cost.len())
            .filter(|&r| allowed(r) && self.fits(r, numel))
            .min_by_key(|&r| self.cost[r])
            .unwrap_or_else(|| self.fewest_elements(allowed))
    }
}

/// Ranks strictly inside a multi-rank stack split, per bucket, as open intervals.
struct Intermediates(Vec<Vec<(u32, u32)>>);

impl Intermediates {
    fn of(stacks: &[Stack], owners: &[Vec<u32>], num_buckets: usize) -> Self {
        let mut per_bucket = vec![Vec::new(); num_buckets];
        for (stack, owners) in stacks.iter().zip(owners) {
            let (first, last) = (owners[0], owners[owners.len() - 1]);
            if last > first + 1 {
                per_bucket[stack.bucket].push((first, last));
            }
        }
        Intermediates(per_bucket)
    }

    fn contains(&self, bucket: usize, rank: u32) -> bool {
        self.0[bucket].iter().any(|&(lo, hi)| lo < rank && rank < hi)
    }
}

/// Assigns an owner to every Muon unit of `buckets` (memberships in layout order) and writes
/// them to `placements[param].unit_owners`.
pub(crate) fn assign_owners(
    params: &[ParamSpec],
    buckets: &[Vec<u32>],
    dp: usize,
    steps: u32,
    placements: &mut [ParamPlacement],
) -> OwnershipMethod {
    let units = Units::collect(params, buckets, steps);
    let mut atom_owner = place_atoms(&units, dp);
    let order = atoms_by_cost(&units.atoms);
    let mut round = 0;
    let (stack_owners, loads) = loop {
        let mut loads = Loads::new(dp, units.total_numel);
        for (atom, &r) in units.atoms.iter().zip(&atom_owner) {
            loads.add(r as usize, atom.cost, atom.numel);
        }
        let stack_owners = partition_stacks(&units.stacks, buckets.len(), &loads.cost);
        for (stack, owners) in units.stacks.iter().zip(&stack_owners) {
            owners
                .iter()
                .for_each(|&r| loads.add(r as usize, stack.unit_cost, stack.unit_numel));
        }
        let intermediates = Intermediates::of(&units.stacks, &stack_owners, buckets.len());
        let moved = resolve_conflicts(&units.atoms, &order, &intermediates, &mut loads, &mut atom_owner);
        round += 1;
        if !moved || round > MAX_REWRAPS {
            break (stack_owners, loads);
        }
    };
    let dpu = dp as u128;
    let makespan = loads.cost.iter().copied().max().unwrap_or(0);
    if dpu * makespan > units.total_cost + dpu * units.largest {
        global_wrap(params, buckets, dp, steps, placements);
        return OwnershipMethod::GlobalWrap;
    }
    for (atom, &r) in units.atoms.iter().zip(&atom_owner) {
        placements[atom.param as usize].unit_owners = vec![r];
    }
    for (stack, owners) in units.stacks.iter().zip(stack_owners) {
        placements[stack.param as usize].unit_owners = owners;
    }
    OwnershipMethod::LptStackFill
}

/// Atom indices by cost descending, then registration index ascending.
fn atoms_by_cost(atoms: &[Atom]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..atoms.len()).collect();
    order.sort_by_key(|&i| (Reverse(atoms[i].cost), atoms[i].param));
    order
}

/// Step 1 of the module docs: LPT over all units; returns the rank of every atom. Among the
/// ranks of equal least cost, a unit goes to the one owning a unit of the nearest bucket
/// (ties: lowest rank): balance is LPT's, and a bucket has fewer owners, each one reduce and
/// one broadcast whose latency grows with dp.
fn place_atoms(units: &Units, dp: usize) -> Vec<u32> {
    // (cost, registration index, unit index, atom index or None for a stack unit, elements, bucket)
    let mut items: Vec<(u128, u32, u64, Option<usize>, u64, usize)> = Vec::new();
    for (i, atom) in units.atoms.iter().enumerate() {
        items.push((atom.cost, atom.param, 0, Some(i), atom.numel, atom.bucket));
    }
    for stack in &units.stacks {
        items.extend((0..stack.units).map(|u| (stack.unit_cost, stack.param, u, None, stack.unit_numel, stack.bucket)));
    }
    items.sort_by_key(|&(cost, param, unit, _, _, _)| (Reverse(cost), param, unit));
    let mut loads = Loads::new(dp, units.total_numel);
    let mut least: BinaryHeap<Reverse<(u128, usize)>> = (0..dp).map(|r| Reverse((0, r))).collect();
    let mut atom_owner = vec![0u32; units.atoms.len()];
    let mut buckets_of: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); dp];
    let mut skipped = Vec::new();
    for (cost, _, _, atom, numel, bucket) in items {
        let mut tied: Vec<usize> = Vec::new();
        while let Some(&Reverse((c, r))) = least.peek() {
            if tied.first().is_some_and(|&t| loads.cost[t] != c) {
                break;
            }
            least.pop();
            if loads.fits(r, numel) {
                tied.push(r);
            } else {
                skipped.push(r);
            }
        }
        let r = tied
            .iter()
            .copied()
            .min_by_key(|&r| (bucket_distance(&buckets_of[r], bucket), r))
            .unwrap_or_else(|| loads.fewest_elements(|_| true));
        loads.add(r, cost, numel);
        buckets_of[r].insert(bucket);
        if let Some(i) = atom {
            atom_owner[i] = r as u32;
        }
        least.extend(
            skipped
                .drain(..)
                .chain(tied)
                .filter(|&s| s != r)
                .map(|s| Reverse((loads.cost[s], s))),
        );
        least.push(Reverse((loads.cost[r], r)));
    }
    atom_owner
}

/// How far `bucket` is from the nearest bucket in `owned` (`usize::MAX` when it is empty).
fn bucket_distance(owned: &BTreeSet<usize>, bucket: usize) -> usize {
    let below = owned.range(..=bucket).next_back().map(|&b| bucket - b);
    let above = owned.range(bucket..).next().map(|&b| b - bucket);
    below.into_iter().chain(above).min().unwrap_or(usize::MAX)
}

/// Step 2 of the module docs: stacks by first-fit decreasing under the smallest limit.
fn partition_stacks(stacks: &[Stack], num_buckets: usize, atom_cost: &[u128]) -> Vec<Vec<u32>> {
    if stacks.is_empty() {
        return Vec::new();
    }
    let mut order: Vec<usize> = (0..stacks.len()).collect();
    order.sort_by_key(|&i| Reverse(stacks[i].unit_cost));
    let stack_total: u128 = stacks.iter().map(|s| s.units as u128 * s.unit_cost).sum();
    let fill = StackFill {
        stacks,
        order: &order,
        num_buckets,
        atom_cost,
    };
    // Everything fits on rank 0 below this limit, so the search starts from a feasible one.
    let (mut lo, mut hi) = (0u128, atom_cost.iter().copied().max().unwrap_or(0) + stack_total);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if fill.run(mid, None) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let mut owners = vec![Vec::new(); stacks.len()];
    fill.run(hi, Some(&mut owners));
    owners
}

/// First-fit of stack units onto ranks under a per-rank limit.
struct StackFill<'a> {
    stacks: &'a [Stack],
    /// Stack indices, largest unit first.
    order: &'a [usize],
    num_buckets: usize,
    atom_cost: &'a [u128],
}

impl StackFill<'_> {
    /// Places every stack, in `order`, on consecutive ranks starting from the last rank used
    /// by an earlier stack of the same bucket (rank 0 for the first), filling each rank while
    /// its load stays within `limit`. True if every unit found a rank; records the owners
    /// (indexed like `stacks`) when asked.
    fn run(&self, limit: u128, mut owners: Option<&mut Vec<Vec<u32>>>) -> bool {
        let dp = self.atom_cost.len();
        let mut load = self.atom_cost.to_vec();
        let mut start = vec![0usize; self.num_buckets];
        for &i in self.order {
            let stack = &self.stacks[i];
            let mut rank = start[stack.bucket];
            let mut left = stack.units;
            while left > 0 {
                let room = limit.saturating_sub(load[rank]) / stack.unit_cost;
                let take = room.min(left as u128) as u64;
                if take == 0 {
                    rank += 1;
                    if rank == dp {
                        return false;
                    }
                    continue;
                }
                if let Some(owners) = owners.as_deref_mut() {
                    owners[i].extend(std::iter::repeat_n(rank as u32, take as usize));
                }
                load[rank] += take as u128 * stack.unit_cost;
                left -= take;
            }
            start[stack.bucket] = rank;
        }
        true
    }
}

/// Step 3 of the module docs. Returns true if an atomic matrix moved (loads changed), so
/// the stacks should be partitioned again.
fn resolve_conflicts(
    atoms: &[Atom],
    order: &[usize],
    intermediates: &Intermediates,
    loads: &mut Loads,
    owner: &mut [u32],
) -> bool {
    let mut moved = false;
    for (pos, &i) in order.iter().enumerate() {
        let atom = &atoms[i];
        if !intermediates.contains(atom.bucket, owner[i]) {
            continue;
        }
        let twin = equal_cost_run(atoms, order, pos).find(|&j| {
            let other = &atoms[j];
            other.numel == atom.numel
                && owner[j] != owner[i]
                && !intermediates.contains(atom.bucket, owner[j])
                && !intermediates.contains(other.bucket, owner[i])
        });
        match twin {
            Some(j) => owner.swap(i, j),
            None => {
                loads.remove(owner[i] as usize, atom.cost, atom.numel);
                let r = loads.pick(atom.numel, |r| !intermediates.contains(atom.bucket, r as u32));
                loads.add(r, atom.cost, atom.numel);
                owner[i] = r as u32;
                moved = true;
            }
        }
    }
    moved
}

/// Atom indices of equal cost around position `pos` of the cost order (excluding it).
fn equal_cost_run<'a>(atoms: &'a [Atom], order: &'a [usize], pos: usize) -> impl Iterator<Item = usize> + 'a {
    let cost = atoms[order[pos]].cost;
    let same = move |&&j: &&usize| atoms[j].cost == cost;
    let before = order[..pos].iter().rev().take_while(same);
    let after = order[pos + 1..].iter().take_while(same);
    before.chain(after).copied()
}

/// Step 4 of the module docs.
fn global_wrap(params: &[ParamSpec], buckets: &[Vec<u32>], dp: usize, steps: u32, placements: &mut [ParamPlacement]) {
    let order: Vec<u32> = buckets.iter().flatten().copied().collect();
    assign_contiguous(params, &order, dp, steps, placements);
}

#[cfg(test)]
mod tests {
    use super::super::cost::NsLoads;
    use super::*;
    use crate::config::Dtype;
    use crate::model::{ParamFlags, Route};

    /// The fallback of step 4 over two buckets holding matrices and an expert stack: owners never
    /// decrease along the units in layout order (so every rank's range in a bucket is contiguous
    /// and the stack is split among consecutive ranks), every rank is used here, and the
    /// makespan is within `total/dp + largest unit`.
    #[test]
    fn the_global_wrap_is_contiguous_and_within_the_bound() {
        let mut params: Vec<ParamSpec> = [[8, 24], [16, 16], [8, 8], [24, 8]]
            .iter()
            .enumerate()
            .map(|(i, shape)| ParamSpec::new(format!("w{i}"), shape, Dtype::F32))
            .collect();
        let mut stack = ParamSpec::new("experts", &[6, 8, 16], Dtype::F32);
        stack.flags = ParamFlags(ParamFlags::EXPERT_STACK);
        params.push(stack);
        let buckets = vec![vec![4, 3], vec![2, 1, 0]];
        let dp = 4;
        let mut placements = crate::plan::initial_placements(&params, &[Route::Muon; 5]);
        global_wrap(&params, &buckets, dp, 5, &mut placements);
        let owners: Vec<u32> = buckets
            .iter()
            .flatten()
            .flat_map(|&p| placements[p as usize].unit_owners.iter().copied())
            .collect();
        assert!(owners.windows(2).all(|w| w[0] <= w[1]), "{owners:?}");
        let loads = NsLoads::of(&params, &placements, dp, 5);
        assert!(loads.per_rank.iter().all(|&l| l > 0), "{:?}", loads.per_rank);
        assert!(loads.within_guarantee(dp), "{:?}", loads.per_rank);
    }
}

//! Muon ownership for the `compact` and `allreduce` layouts.
//!
//! The ownership unit is one matrix; an expert stack `[E, m, n]` is E units whose memory order
//! is fixed, so a stack can only be split among consecutive ranks, and a rank strictly inside
//! such a split ("intermediate" for that bucket) can own nothing else in that bucket — else its
//! owned range in the bucket would not be contiguous. The assignment:
//!
//! 1. **Atomic matrices** (every Muon param that is not an expert stack) go through global LPT:
//!    cost descending (ties: registration index ascending) onto the rank with the least
//!    accumulated cost (ties: lowest rank), skipping ranks that would exceed the memory cap
//!    (1.3 × the mean Muon elements per rank) unless none fits, then the one with the fewest
//!    elements.
//! 2. **Expert stacks** are divisible work that fills the gaps: with `T = total cost / dp`, rank
//!    r has capacity `max(0, T − atomic load of r)`; stacks are walked in layout order (buckets
//!    in order, params in bucket order) and unit u (cost c, cumulative stack cost A before it)
//!    goes to the first rank whose cumulative capacity reaches `A + c/2` (McNaughton's wrap
//!    rule with global boundaries, so rounding never drifts). A stack's owners are therefore
//!    nondecreasing along it, every rank's load is at most `max(T, atomic load) + c`, and
//!    the stacks of one bucket follow the pointer order.
//! 3. **Conflicts**: an atomic matrix whose owner is intermediate for a stack of its bucket
//!    swaps owners with an atomic matrix of equal cost and size for which the swap is allowed
//!    (loads unchanged); without such a twin it moves to the allowed rank with the least cost.
//! 4. **Guarantee**: if the makespan then exceeds `total/dp + largest unit` (possible only in
//!    adversarial models where the memory cap or conflicts bind), the whole assignment is
//!    replaced by one global wrap over all units in layout order, which satisfies that bound
//!    and contiguity by construction (every rank's units have their cost midpoints inside a
//!    window of width `T`).
//!
//! Doing atomics first and letting stacks fill the remaining capacity is what keeps large
//! dense matrices (e.g. the dense MLPs of a MoE model) from landing on top of a full share of
//! expert work. All arithmetic is exact (`u128`), so every rank computes the same owners.

use crate::model::ParamSpec;

use super::cost::ns_unit_cost;
use super::types::ParamPlacement;

/// How the owners of a compact plan were chosen (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OwnershipMethod {
    /// LPT of atomic matrices, then the capacity wrap of expert stacks (compact, allreduce).
    LptStackFill,
    /// One wrap over all units in layout order (the guaranteed fallback).
    GlobalWrap,
    /// Megatron-LM's per-bucket cost-balanced shard assignment (padded).
    MegatronPadded,
}

impl OwnershipMethod {
    /// The snake_case name used in JSON and tables.
    pub fn name(self) -> &'static str {
        match self {
            OwnershipMethod::LptStackFill => "lpt_stack_fill",
            OwnershipMethod::GlobalWrap => "global_wrap",
            OwnershipMethod::MegatronPadded => "megatron_padded",
        }
    }
}

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
    units: usize,
    unit_cost: u128,
    unit_numel: u64,
}

/// Accumulated cost and elements per rank, and the memory cap.
struct Loads {
    cost: Vec<u128>,
    numel: Vec<u64>,
    total_numel: u64,
}

impl Loads {
    fn new(dp: usize, total_numel: u64) -> Self {
        Loads { cost: vec![0; dp], numel: vec![0; dp], total_numel }
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

    /// The allowed rank with the least cost among those that stay within the memory cap with
    /// `numel` more elements, else the allowed rank with the fewest elements; ties go to the
    /// lowest rank.
    fn pick(&self, numel: u64, allowed: impl Fn(usize) -> bool) -> usize {
        let dp = self.cost.len();
        (0..dp)
            .filter(|&r| allowed(r) && self.fits(r, numel))
            .min_by_key(|&r| self.cost[r])
            .or_else(|| (0..dp).filter(|&r| allowed(r)).min_by_key(|&r| self.numel[r]))
            .unwrap_or(0)
    }
}

/// Units of the Muon buckets, in layout order.
struct Units {
    atoms: Vec<Atom>,
    stacks: Vec<Stack>,
    total_cost: u128,
    total_numel: u64,
    largest: u128,
}

impl Units {
    fn collect(params: &[ParamSpec], buckets: &[Vec<u32>], steps: u32) -> Self {
        let mut units = Units { atoms: Vec::new(), stacks: Vec::new(), total_cost: 0, total_numel: 0, largest: 0 };
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
                    units.stacks.push(Stack { param, bucket, units: count as usize, unit_cost: cost, unit_numel });
                } else {
                    units.atoms.push(Atom { param, bucket, cost, numel: spec.numel() });
                }
            }
        }
        units
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

/// Rounds of "wrap stacks, move conflicting atomics" before the last conflicts are settled
/// without re-wrapping.
const MAX_REWRAPS: usize = 8;

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
    let order = lpt_order(&units.atoms);
    let mut atom_owner = vec![0u32; units.atoms.len()];
    let mut loads = Loads::new(dp, units.total_numel);
    for &i in &order {
        let atom = &units.atoms[i];
        let r = loads.pick(atom.numel, |_| true);
        loads.add(r, atom.cost, atom.numel);
        atom_owner[i] = r as u32;
    }
    let mut round = 0;
    let (stack_owners, loads) = loop {
        let atom_loads = loads_of_atoms(&units, &atom_owner, dp);
        let stack_owners = wrap_stacks(&units, &atom_loads.cost);
        let mut loads = atom_loads;
        for (stack, owners) in units.stacks.iter().zip(&stack_owners) {
            owners.iter().for_each(|&r| loads.add(r as usize, stack.unit_cost, stack.unit_numel));
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
fn lpt_order(atoms: &[Atom]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..atoms.len()).collect();
    order.sort_by(|&a, &b| atoms[b].cost.cmp(&atoms[a].cost).then(atoms[a].param.cmp(&atoms[b].param)));
    order
}

/// Per-rank loads of the atomic matrices alone.
fn loads_of_atoms(units: &Units, owner: &[u32], dp: usize) -> Loads {
    let mut loads = Loads::new(dp, units.total_numel);
    for (atom, &r) in units.atoms.iter().zip(owner) {
        loads.add(r as usize, atom.cost, atom.numel);
    }
    loads
}

/// Step 2 of the module docs: stacks fill each rank's capacity `T − atomic load`.
fn wrap_stacks(units: &Units, atom_cost: &[u128]) -> Vec<Vec<u32>> {
    let dp = atom_cost.len();
    let dpu = dp as u128;
    // Capacities and boundaries are scaled by dp to stay integral: dp·(T − a) = total − dp·a.
    let capacity: Vec<u128> = atom_cost.iter().map(|&a| units.total_cost.saturating_sub(dpu * a)).collect();
    let mut rank = 0;
    let mut boundary = capacity[0];
    let mut cumulative = 0u128;
    let mut owners = Vec::with_capacity(units.stacks.len());
    for stack in &units.stacks {
        let c = stack.unit_cost;
        let mut stack_owners = Vec::with_capacity(stack.units);
        for _ in 0..stack.units {
            while rank + 1 < dp && dpu * (2 * cumulative + c) > 2 * boundary {
                rank += 1;
                boundary += capacity[rank];
            }
            stack_owners.push(rank as u32);
            cumulative += c;
        }
        owners.push(stack_owners);
    }
    owners
}

/// Step 3 of the module docs. Returns true if an atomic matrix moved (loads changed), so
/// the stacks should be wrapped again.
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

/// Atom indices of equal cost around position `pos` of the LPT order (excluding it).
fn equal_cost_run<'a>(atoms: &'a [Atom], order: &'a [usize], pos: usize) -> impl Iterator<Item = usize> + 'a {
    let cost = atoms[order[pos]].cost;
    let same = move |&&j: &&usize| atoms[j].cost == cost;
    let before = order[..pos].iter().rev().take_while(same);
    let after = order[pos + 1..].iter().take_while(same);
    before.chain(after).copied()
}

/// Step 4 of the module docs: unit with cumulative cost A before it and cost c goes to the
/// first rank p with `A + c/2 <= (p+1)·total/dp`.
fn global_wrap(params: &[ParamSpec], buckets: &[Vec<u32>], dp: usize, steps: u32, placements: &mut [ParamPlacement]) {
    let total: u128 = buckets
        .iter()
        .flatten()
        .map(|&p| super::cost::ns_param_cost(&params[p as usize], steps))
        .sum();
    let dpu = dp as u128;
    let mut cumulative = 0u128;
    for &param in buckets.iter().flatten() {
        let spec = &params[param as usize];
        let c = ns_unit_cost(spec, steps);
        let owners = (0..spec.num_units())
            .map(|_| {
                let rank = (dpu * (2 * cumulative + c)).div_ceil(2 * total) - 1;
                cumulative += c;
                rank.min(dpu - 1) as u32
            })
            .collect();
        placements[param as usize].unit_owners = owners;
    }
}

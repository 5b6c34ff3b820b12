//! Bucket membership of the `compact` Muon layout: equal-shard groups moved by reduce-scatter
//! and all-gather, and rooted buckets (reduce to owner, broadcast from owner) for the rest.
//!
//! A reduce or broadcast moves the whole range over every link of its chain, where a
//! reduce-scatter or all-gather moves (dp−1)/dp of it (`report.rs`). A bucket whose dp shards
//! have equal sizes, each holding only its rank's whole matrices, is exactly a padded bucket
//! with no padding, so it travels by reduce-scatter and all-gather with nothing persistent
//! added. Such buckets are built from **groups**: dp Muon matrices of one class — equal element
//! count and equal Newton–Schulz cost (same shape, or a transposed one) — one per rank, so every
//! group adds the same work to every rank and balance is left to the rooted rest.
//!
//! Params are walked in backward order (the order their gradients become ready). A matrix
//! waits in its class's pool until the pool holds dp members; the completed group joins the
//! open shard bucket, which closes once it spans the bucket size. Expert stacks group the same
//! way: k = dp / gcd(E, dp) stacks of one class (equal experts, expert shape and cost) laid out
//! back to back make a shard bucket, each stack cut into gcd(E, dp) equal pieces of E/gcd(E, dp)
//! consecutive experts, one piece per rank (k = 1 when the experts divide evenly among the
//! ranks). Matrices still waiting at the end of backward are packed into shard buckets of dp
//! equal shards of several whole matrices ([`pack`]). Everything else is rooted: matrices whose
//! element count is not 64-aligned (shards must start 64-aligned), stacks whose experts are
//! not, params the planner releases from grouping (`mod.rs`: when the groups leave the rooted
//! rest unable to balance Newton–Schulz), and pool members that waited longer than the **group
//! window**. A second walk keeps the groups of the first and roots every other matrix where it
//! stands, so rooted buckets keep backward order instead of collecting matrices late when they
//! leave a pool. The window trades bytes for overlap: a group's collective waits for its last
//! member, so a long wait holds gradients back; the planner (`choice.rs`) lays out every
//! [`GroupWindow::CANDIDATES`] and keeps the fewest bytes, or on a declared network the least
//! modelled exposure (docs/design.md §4).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::model::ParamSpec;

use super::buckets::{PARAM_ALIGN, gcd};
use super::cost::ns_unit_cost;

/// One compact Muon bucket before placement, in the order buckets complete in backward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CompactBucket {
    /// `dp` equal shards; shard r holds the matrices in `shards[r]`, all owned by rank r.
    Shards(Vec<Vec<u32>>),
    /// Expert stacks of one class back to back, each cut into equal pieces of consecutive
    /// experts on consecutive ranks, one piece per rank (module docs).
    Stacks(Vec<u32>),
    /// Matrices and stacks moved to and from their owners (ownership by `ownership.rs`).
    Rooted(Vec<u32>),
}

impl CompactBucket {
    /// Every param of the bucket.
    fn params(&self) -> Box<dyn Iterator<Item = &u32> + '_> {
        match self {
            CompactBucket::Shards(shards) => Box::new(shards.iter().flatten()),
            CompactBucket::Stacks(ids) => Box::new(ids.iter()),
            CompactBucket::Rooted(ids) => Box::new(ids.iter()),
        }
    }
}

/// What a compact Muon buffer may group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Grouping {
    /// Equal expert stacks and equal matrices.
    Everything,
    /// Equal matrices; every stack is rooted.
    MatricesOnly,
    /// Nothing: every bucket is rooted (the `compact_rooted` buckets).
    Nothing,
}

/// A Muon matrix waiting for dp − 1 more of its class.
struct Waiting {
    param: u32,
    /// Backward position (elements of the buffer walked before it).
    position: u64,
}

/// How long a matrix may wait for its group, in backward: the planner tries each of these
/// (`choice.rs`) and keeps the one that moves the fewest bytes, or, with a declared network,
/// the one whose collectives expose the least (docs/design.md §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupWindow {
    /// Any wait: every matrix with dp − 1 partners of its class is grouped.
    Unbounded,
    /// At most `1/divisor` of the buffer's backward (elements walked).
    Fraction(u64),
    /// No groups: every bucket rooted (what `compact_rooted` always does).
    Rooted,
}

impl GroupWindow {
    /// The windows the planner tries for `compact`, widest first.
    pub const CANDIDATES: [GroupWindow; 6] = [
        GroupWindow::Unbounded,
        GroupWindow::Fraction(3),
        GroupWindow::Fraction(6),
        GroupWindow::Fraction(12),
        GroupWindow::Fraction(24),
        GroupWindow::Rooted,
    ];

    /// How it reads in tables: `unbounded`, `1/12`, `rooted`.
    pub fn label(self) -> String {
        match self {
            GroupWindow::Unbounded => "unbounded".to_string(),
            GroupWindow::Fraction(d) => format!("1/{d}"),
            GroupWindow::Rooted => "rooted".to_string(),
        }
    }

    /// The wait allowed in a buffer of `total` elements of backward.
    fn elements(self, total: u64) -> u64 {
        match self {
            GroupWindow::Unbounded => u64::MAX,
            GroupWindow::Fraction(divisor) => total / divisor,
            GroupWindow::Rooted => 0,
        }
    }
}

/// One compact Muon buffer to lay out: its params (`ids`, registration order) and settings.
pub(crate) struct CompactBuffer<'a> {
    pub params: &'a [ParamSpec],
    pub ids: &'a [u32],
    pub bucket_size: Option<u64>,
    pub dp: usize,
    /// Newton–Schulz steps (the class of a matrix includes its cost).
    pub steps: u32,
    pub grouping: Grouping,
    pub window: GroupWindow,
    /// Params that are rooted whatever their class (released from grouping by the planner).
    pub released: &'a BTreeSet<u32>,
}

impl CompactBuffer<'_> {
    /// The buffer's bucket sequence.
    pub(crate) fn buckets(&self) -> Vec<CompactBucket> {
        let grouped: BTreeSet<u32> = self
            .walk(None)
            .iter()
            .filter(|bucket| !matches!(bucket, CompactBucket::Rooted(_)))
            .flat_map(CompactBucket::params)
            .copied()
            .collect();
        self.walk(Some(&grouped))
    }

    /// One walk over the buffer in backward order. With `grouped`, only those matrices wait
    /// for a group (the ones that formed groups in a first walk, which form the same groups
    /// again) and every other matrix is rooted where it stands, so rooted buckets keep
    /// backward order.
    fn walk(&self, grouped: Option<&BTreeSet<u32>>) -> Vec<CompactBucket> {
        let CompactBuffer {
            params,
            ids,
            bucket_size,
            dp,
            steps,
            grouping,
            window,
            released,
        } = *self;
        let total: u64 = ids.iter().map(|&p| params[p as usize].numel()).sum();
        let mut builder = Builder {
            dp,
            bucket_size,
            window: window.elements(total),
            pools: BTreeMap::new(),
            stack_pools: BTreeMap::new(),
            shards: vec![Vec::new(); dp],
            shards_numel: 0,
            rooted: Vec::new(),
            rooted_numel: 0,
            out: Vec::new(),
            params,
        };
        let mut position = 0u64;
        let mut positions = vec![0u64; params.len()];
        for &param in ids.iter().rev() {
            positions[param as usize] = position;
            let spec = &params[param as usize];
            builder.expire(position, builder.window);
            let eligible = !released.contains(&param) && grouped.is_none_or(|g| g.contains(&param));
            if spec.is_expert_stack() {
                let (units, unit) = (spec.num_units(), spec.numel() / spec.num_units());
                if eligible && unit.is_multiple_of(PARAM_ALIGN) && grouping == Grouping::Everything {
                    let class = (unit, ns_unit_cost(spec, steps), units);
                    builder.wait_stack(class, Waiting { param, position });
                } else {
                    builder.push_rooted(param);
                }
            } else if eligible && spec.numel().is_multiple_of(PARAM_ALIGN) && grouping != Grouping::Nothing {
                let class = (spec.numel(), ns_unit_cost(spec, steps));
                builder.wait(class, Waiting { param, position });
            } else {
                builder.push_rooted(param);
            }
            position += spec.numel();
        }
        builder.finish(&positions)
    }
}

struct Builder<'a> {
    params: &'a [ParamSpec],
    dp: usize,
    bucket_size: Option<u64>,
    window: u64,
    /// Waiting matrices per class `(elements, Newton–Schulz cost)`, oldest first.
    pools: BTreeMap<(u64, u128), VecDeque<Waiting>>,
    /// Waiting expert stacks per class `(expert elements, expert cost, experts)`, oldest first.
    stack_pools: BTreeMap<(u64, u128, u64), VecDeque<Waiting>>,
    shards: Vec<Vec<u32>>,
    shards_numel: u64,
    rooted: Vec<u32>,
    rooted_numel: u64,
    out: Vec<CompactBucket>,
}

impl Builder<'_> {
    fn closes(&self, numel: u64) -> bool {
        self.bucket_size.is_some_and(|size| numel >= size)
    }

    /// Sends every waiting matrix that entered more than `window` elements before `position`
    /// to the rooted buckets, oldest first.
    fn expire(&mut self, position: u64, window: u64) {
        let mut expired: Vec<Waiting> = Vec::new();
        for pool in self.pools.values_mut().chain(self.stack_pools.values_mut()) {
            while pool.front().is_some_and(|w| position - w.position > window) {
                expired.extend(pool.pop_front());
            }
        }
        expired.sort_by_key(|w| w.position);
        expired.into_iter().for_each(|w| self.push_rooted(w.param));
    }

    fn wait(&mut self, class: (u64, u128), waiting: Waiting) {
        let pool = self.pools.entry(class).or_default();
        pool.push_back(waiting);
        if pool.len() < self.dp {
            return;
        }
        for (shard, member) in self.shards.iter_mut().zip(pool.drain(..)) {
            shard.push(member.param);
        }
        self.shards_numel += class.0 * self.dp as u64;
        if self.closes(self.shards_numel) {
            self.close_shards();
        }
    }

    /// A stack of `class` waits for the `dp / gcd(E, dp)` stacks that split evenly (module docs).
    fn wait_stack(&mut self, class: (u64, u128, u64), waiting: Waiting) {
        let needed = self.dp / gcd(class.2, self.dp as u64) as usize;
        let pool = self.stack_pools.entry(class).or_default();
        pool.push_back(waiting);
        if pool.len() == needed {
            let stacks = pool.drain(..).map(|w| w.param).collect();
            self.out.push(CompactBucket::Stacks(stacks));
        }
    }

    /// Packs the matrices still waiting at the end of backward, which no group of their class
    /// took, into shard buckets of dp shards with equal elements, each shard one or more whole
    /// matrices: gpt2-124m at dp 9 leaves three fused QKV, three projection and six MLP
    /// matrices, and each QKV with a projection has as many elements as one MLP matrix. Shard
    /// size: the largest waiting size for which [`pack`] fills dp shards, again until none does.
    fn pack_leftovers(&mut self) {
        loop {
            let mut left: Vec<(u64, u32)> = self
                .pools
                .iter()
                .flat_map(|(class, pool)| pool.iter().map(|w| (class.0, w.param)))
                .collect();
            left.sort_by_key(|&(numel, param)| (std::cmp::Reverse(numel), param));
            let mut sizes: Vec<u64> = left.iter().map(|l| l.0).collect();
            sizes.dedup();
            let Some(shards) = sizes.into_iter().find_map(|size| pack(&left, size, self.dp)) else {
                return;
            };
            let taken: BTreeSet<u32> = shards.iter().flatten().copied().collect();
            for pool in self.pools.values_mut() {
                pool.retain(|w| !taken.contains(&w.param));
            }
            self.out.push(CompactBucket::Shards(shards));
        }
    }

    fn close_shards(&mut self) {
        if self.shards_numel > 0 {
            let shards = std::mem::replace(&mut self.shards, vec![Vec::new(); self.dp]);
            self.out.push(CompactBucket::Shards(shards));
            self.shards_numel = 0;
        }
    }

    fn push_rooted(&mut self, param: u32) {
        self.rooted.push(param);
        self.rooted_numel = self.rooted_numel.next_multiple_of(PARAM_ALIGN) + self.params[param as usize].numel();
        if self.closes(self.rooted_numel) {
            self.close_rooted();
        }
    }

    fn close_rooted(&mut self) {
        if !self.rooted.is_empty() {
            self.out.push(CompactBucket::Rooted(std::mem::take(&mut self.rooted)));
            self.rooted_numel = 0;
        }
    }

    /// Ends the walk: the open shard bucket closes, matrices still waiting become rooted in
    /// backward order, and the buckets are ordered by when their last gradient arrives.
    fn finish(mut self, positions: &[u64]) -> Vec<CompactBucket> {
        self.close_shards();
        self.pack_leftovers();
        self.expire(u64::MAX, 0);
        self.close_rooted();
        self.out
            .sort_by_cached_key(|bucket| bucket.params().map(|&p| positions[p as usize]).max());
        self.out
    }
}

/// Fills `dp` shards of exactly `size` elements from `left` (elements, param; largest first),
/// each shard taking the largest matrices that still fit; `None` if a shard cannot be filled.
fn pack(left: &[(u64, u32)], size: u64, dp: usize) -> Option<Vec<Vec<u32>>> {
    let mut used = vec![false; left.len()];
    let mut shards = Vec::with_capacity(dp);
    for _ in 0..dp {
        let (mut room, mut shard) = (size, Vec::new());
        for (i, &(numel, param)) in left.iter().enumerate() {
            if !used[i] && numel <= room {
                used[i] = true;
                room -= numel;
                shard.push(param);
            }
        }
        if room != 0 {
            return None;
        }
        shards.push(shard);
    }
    Some(shards)
}

//! Tensor-parallel shards in the coordinates of the unsharded param (docs/checkpoint.md,
//! "Tensor parallelism"). A param flagged `TP_SHARD_ROWS` / `_COLS` on a rank of a TP group
//! of T > 1 ranks is saved as the block of the unsharded param's components it holds, so that
//! a checkpoint written at one TP size loads at any other:
//!
//! - **rows** (`TP_SHARD_ROWS`): the unsharded param has T times the rows (dim 0; dim 1 of an
//!   expert stack, the rows of every expert; dim 0 of a 1-D param) and every fused component
//!   is split alike — SwiGLU's gate|up, GDN's q|k|v|z|β|α: shard t holds rows
//!   `t·s_c .. (t+1)·s_c` of component c, whose unsharded size is `T·s_c`;
//! - **groups** (`TP_SHARD_ROWS` with `split_groups` > 1 or `TP_WHOLE_GROUPS`): shard t holds
//!   whole groups `t·G .. (t+1)·G` of a per-group split (Megatron's QKV), each component of
//!   them whole;
//! - **cols** (`TP_SHARD_COLS`): T times the columns (the last dim of a matrix or of every
//!   expert, dim 1 of a param of three or more dims, dim 0 of a 1-D param); shard t holds
//!   columns `t·n .. (t+1)·n` of every component.
//!
//! A block is a box of a component, `[lo, hi)` per dimension of its shape; a piece of it is a
//! range of the block's own row-major items. [`runs`] maps such a piece onto the component's
//! items, so pieces saved at one TP size meet the blocks a rank needs at another.

use serde::{Deserialize, Serialize};

use super::components::{Component, components};
use crate::bail;
use crate::error::Result;
use crate::model::{ParamFlags, ParamSpec, element_count};
use crate::numerics::muon::TpDim;
use crate::plan::ElemRange;

/// A rank's place in its tensor-parallel group (`muon_optimizer_set_tp_group`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TpRank {
    pub rank: u32,
    pub size: u32,
}

/// How a TP shard lies in the unsharded param (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TpSplit {
    Rows,
    Groups,
    Cols,
}

impl TpSplit {
    /// The split of `spec` on a rank of `tp`: None for a param that is not a TP shard, or
    /// without a TP group of more than one rank.
    pub fn of(spec: &ParamSpec, tp: Option<TpRank>) -> Option<TpSplit> {
        if tp.is_none_or(|tp| tp.size <= 1) {
            return None;
        }
        Some(match spec.tp_shard()? {
            TpDim::Cols => TpSplit::Cols,
            TpDim::Rows
                if spec.split_groups > 1
                    || spec.flags.has(ParamFlags::TP_WHOLE_GROUPS)
                    || spec.flags.has(ParamFlags::TP_WHOLE_COMPONENTS) =>
            {
                TpSplit::Groups
            }
            TpDim::Rows => TpSplit::Rows,
        })
    }

    /// The param dimension the shards split.
    fn dim(self, spec: &ParamSpec) -> usize {
        let ndim = spec.shape.len();
        match self {
            TpSplit::Rows | TpSplit::Groups => usize::from(spec.is_expert_stack()),
            TpSplit::Cols if spec.is_expert_stack() => 2,
            TpSplit::Cols => usize::from(ndim > 1),
        }
    }

    /// The dimension of each component the shards split (a component of an expert stack is
    /// one expert's matrix).
    fn component_axis(self, ndim: usize) -> usize {
        match self {
            TpSplit::Cols => usize::from(ndim > 1),
            TpSplit::Rows | TpSplit::Groups => 0,
        }
    }
}

/// A box of a component: `[lo, hi)` per dimension of its shape.
pub type Block = Vec<[u64; 2]>;

/// Items of a block: the product of its ranges' lengths.
pub fn block_items(block: &[[u64; 2]]) -> u64 {
    block.iter().map(|[lo, hi]| hi - lo).product()
}

/// A block as text, `[lo:hi,…]` per dimension; empty for None (the whole component).
pub fn block_text(block: Option<&[[u64; 2]]>) -> String {
    block.map_or_else(String::new, |b| {
        let dims: Vec<String> = b.iter().map(|[lo, hi]| format!("{lo}:{hi}")).collect();
        format!("[{}]", dims.join(","))
    })
}

/// Where the param a rank registered lies in the unsharded param.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    /// The unsharded param: what the checkpoint describes (the registered one when it is not
    /// a TP shard).
    pub global: ParamSpec,
    pub split: Option<TpSplit>,
    /// Per component of the registered param, in order: the unsharded param's component it
    /// lies in and the block of it that it is (None: all of it).
    pub parts: Vec<(usize, Option<Block>)>,
}

/// The placement of `spec` registered on a rank of `tp`. Fails when the unsharded param's
/// element count overflows.
pub fn place(spec: &ParamSpec, tp: Option<TpRank>) -> Result<Placement> {
    let local = components(spec);
    let (Some(split), Some(tp)) = (TpSplit::of(spec, tp), tp) else {
        let parts = (0..local.len()).map(|c| (c, None)).collect();
        return Ok(Placement {
            global: spec.clone(),
            split: None,
            parts,
        });
    };
    let (t, size) = (u64::from(tp.rank), u64::from(tp.size));
    let mut global = spec.clone();
    let dim = split.dim(spec);
    global.shape[dim] = spec.shape[dim].saturating_mul(size);
    if element_count(&global.shape).is_none() {
        bail!(
            InvalidParam,
            "param '{}': its unsharded shape ({:?} with dim {dim} times the TP size {size}) overflows the element count",
            spec.name,
            spec.shape
        );
    }
    match split {
        TpSplit::Rows => global.split_sizes.iter_mut().for_each(|s| *s *= size),
        TpSplit::Groups => global.split_groups *= size,
        TpSplit::Cols => {}
    }
    let parts = local
        .iter()
        .enumerate()
        .map(|(c, component)| match split {
            TpSplit::Groups => {
                let per_group = spec.split_sizes.len() as u64;
                let (g, part) = (c as u64 / per_group, c as u64 % per_group);
                (((t * spec.split_groups + g) * per_group + part) as usize, None)
            }
            TpSplit::Rows | TpSplit::Cols => (c, Some(shard_block(component, split, t))),
        })
        .collect();
    Ok(Placement {
        global,
        split: Some(split),
        parts,
    })
}

/// The block of its unsharded component that `component` of shard `t` is.
fn shard_block(component: &Component, split: TpSplit, t: u64) -> Block {
    let axis = split.component_axis(component.shape.len());
    component
        .shape
        .iter()
        .enumerate()
        .map(|(a, &d)| if a == axis { [t * d, (t + 1) * d] } else { [0, d] })
        .collect()
}

/// The shard TP rank `tp` holds of the unsharded param `global` split as `split`: the param
/// that rank registers (its splits and flags as far as they place it), or why there is none.
pub fn shard_of(global: &ParamSpec, split: TpSplit, tp: TpRank) -> std::result::Result<ParamSpec, String> {
    let size = u64::from(tp.size);
    let mut local = global.clone();
    let dim = split.dim(global);
    let (flag, whole_groups) = match split {
        TpSplit::Cols => (ParamFlags::TP_SHARD_COLS, 0),
        TpSplit::Rows => (ParamFlags::TP_SHARD_ROWS, 0),
        TpSplit::Groups => (ParamFlags::TP_SHARD_ROWS, ParamFlags::TP_WHOLE_GROUPS),
    };
    local.flags = ParamFlags(global.flags.0 | flag | whole_groups);
    let divides = |n: u64| size > 0 && n.is_multiple_of(size);
    let ok = divides(global.shape[dim])
        && match split {
            TpSplit::Rows => global.split_sizes.iter().all(|&s| divides(s)),
            TpSplit::Groups => !global.split_sizes.is_empty() && divides(global.split_groups),
            TpSplit::Cols => true,
        };
    if !ok || tp.rank >= tp.size {
        return Err(format!(
            "param '{}' ({:?}, split_sizes {:?} × {} groups) has no TP shard {} of {} split by {split:?}",
            global.name, global.shape, global.split_sizes, global.split_groups, tp.rank, tp.size
        ));
    }
    local.shape[dim] /= size;
    match split {
        TpSplit::Rows => local.split_sizes.iter_mut().for_each(|s| *s /= size),
        TpSplit::Groups => local.split_groups /= size,
        TpSplit::Cols => {}
    }
    Ok(local)
}

/// Per component of the unsharded param `global` (saved as split `split` by TP rank `tp`),
/// the block of it that rank's shard holds: None = none of it, Some(None) = all of it. Fails
/// when no such shard exists (the sizes do not divide) or its components do not follow.
pub fn held_blocks(
    global: &ParamSpec,
    split: TpSplit,
    tp: TpRank,
) -> std::result::Result<Vec<Option<Option<Block>>>, String> {
    let local = shard_of(global, split, tp)?;
    let placement = place(&local, Some(tp)).map_err(|e| e.message)?;
    // `place` multiplies back exactly what `shard_of` divided; only the split it infers from
    // the shard can differ from the one saved.
    if placement.split != Some(split) {
        return Err(format!(
            "param '{}': its TP shards do not follow from its shape, splits and TP split",
            global.name
        ));
    }
    let mut held = vec![None; components(global).len()];
    for (c, block) in placement.parts {
        held[c] = Some(block);
    }
    Ok(held)
}

/// A run of items of a piece: `len` items from `local` on in the piece's block (its own
/// row-major order) are the component's items from `global` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub global: u64,
    pub local: u64,
    pub len: u64,
}

/// The items `range` of `block` (None: the whole component) of a component of shape `dims`,
/// as runs contiguous in both orders, in item order.
pub fn runs(dims: &[u64], block: Option<&[[u64; 2]]>, range: ElemRange) -> Vec<Run> {
    let whole = vec![Run {
        global: range.start,
        local: range.start,
        len: range.len(),
    }];
    let Some(block) = block else {
        return whole;
    };
    // The last dimension the block does not cover whole: below it, a run per block row.
    let Some(k) = (0..dims.len()).rev().find(|&a| block[a] != [0, dims[a]]) else {
        return whole;
    };
    if range.is_empty() {
        return Vec::new();
    }
    let inner: u64 = dims[k + 1..].iter().product();
    let run = (block[k][1] - block[k][0]) * inner;
    (range.start / run..=(range.end - 1) / run)
        .map(|j| {
            let (mut rest, mut global, mut stride) = (j, block[k][0] * inner, inner * dims[k]);
            for a in (0..k).rev() {
                let extent = block[a][1] - block[a][0];
                global += (block[a][0] + rest % extent) * stride;
                rest /= extent;
                stride *= dims[a];
            }
            let (lo, hi) = ((j * run).max(range.start), ((j + 1) * run).min(range.end));
            Run {
                global: global + lo - j * run,
                local: lo,
                len: hi - lo,
            }
        })
        .collect()
}

/// The items two pieces of one component share, as (local item of `a`, local item of `b`,
/// count), in item order. Each piece is (block, range of its items).
pub fn overlap(dims: &[u64], a: (Option<&[[u64; 2]]>, ElemRange), b: (Option<&[[u64; 2]]>, ElemRange)) -> Vec<Shared> {
    if a.0 == b.0 {
        return a.1.intersect(b.1).map_or_else(Vec::new, |o| {
            vec![Shared {
                a: o.start,
                b: o.start,
                len: o.len(),
            }]
        });
    }
    let (ra, rb) = (runs(dims, a.0, a.1), runs(dims, b.0, b.1));
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < ra.len() && j < rb.len() {
        let (x, y) = (ra[i], rb[j]);
        let (lo, hi) = (x.global.max(y.global), (x.global + x.len).min(y.global + y.len));
        if lo < hi {
            out.push(Shared {
                a: x.local + lo - x.global,
                b: y.local + lo - y.global,
                len: hi - lo,
            });
        }
        if x.global + x.len <= y.global + y.len {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// Items two pieces share: `len` from `a` in the first piece's block and `b` in the second's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shared {
    pub a: u64,
    pub b: u64,
    pub len: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Dtype;

    fn shard(name: &str, shape: &[u64], flags: u32, splits: &[u64], groups: u64) -> ParamSpec {
        ParamSpec {
            flags: ParamFlags(flags),
            split_sizes: splits.to_vec(),
            split_groups: groups,
            ..ParamSpec::new(name, shape, Dtype::Bf16)
        }
    }

    fn tp(rank: u32, size: u32) -> Option<TpRank> {
        Some(TpRank { rank, size })
    }

    const ROWS: u32 = ParamFlags::TP_SHARD_ROWS;

    #[test]
    fn shards_grow_into_the_unsharded_param() {
        // SwiGLU gate|up: every component split alike.
        let p = place(&shard("fc1", &[16, 8], ROWS, &[8, 8], 1), tp(1, 2)).unwrap();
        assert_eq!((p.split, p.global.shape.clone()), (Some(TpSplit::Rows), vec![32, 8]));
        assert_eq!(p.global.split_sizes, vec![16, 16]);
        assert_eq!(
            p.parts,
            vec![(0, Some(vec![[8, 16], [0, 8]])), (1, Some(vec![[8, 16], [0, 8]]))]
        );
        // QKV of 2 local groups at TP rank 1 of 2: global groups 2 and 3, whole.
        let p = place(&shard("qkv", &[16, 8], ROWS, &[4, 2, 2], 2), tp(1, 2)).unwrap();
        assert_eq!((p.split, p.global.split_groups), (Some(TpSplit::Groups), 4));
        let parts: Vec<usize> = p.parts.iter().map(|(c, b)| if b.is_none() { *c } else { 99 }).collect();
        assert_eq!(parts, vec![6, 7, 8, 9, 10, 11]);
        // One group per rank, flagged whole: global group 3 of 4.
        let one = shard("qkv", &[8, 8], ROWS | ParamFlags::TP_WHOLE_GROUPS, &[4, 2, 2], 1);
        let p = place(&one, tp(3, 4)).unwrap();
        assert_eq!((p.global.shape.clone(), p.global.split_groups), (vec![32, 8], 4));
        assert_eq!(p.parts, vec![(9, None), (10, None), (11, None)]);
        // Without the flag the same shard reads as a slice of every component.
        let p = place(&shard("qkv", &[8, 8], ROWS, &[4, 2, 2], 1), tp(3, 4)).unwrap();
        assert_eq!(
            (p.split, p.global.split_sizes.clone()),
            (Some(TpSplit::Rows), vec![16, 8, 8])
        );
        // Columns of a row-parallel matrix, of every expert of a stack, of a 1-D param.
        let p = place(&shard("proj", &[8, 6], ParamFlags::TP_SHARD_COLS, &[], 1), tp(2, 3)).unwrap();
        assert_eq!(
            (p.global.shape.clone(), p.parts.clone()),
            (vec![8, 18], vec![(0, Some(vec![[0, 8], [12, 18]]))])
        );
        let stack = shard(
            "experts",
            &[2, 4, 6],
            ParamFlags::EXPERT_STACK | ParamFlags::TP_SHARD_COLS,
            &[],
            1,
        );
        let p = place(&stack, tp(1, 2)).unwrap();
        assert_eq!(p.global.shape, vec![2, 4, 12]);
        assert_eq!(p.parts[1], (1, Some(vec![[0, 4], [6, 12]])));
        let p = place(&shard("bias", &[5], ROWS, &[], 1), tp(1, 2)).unwrap();
        assert_eq!(
            (p.global.shape.clone(), p.parts.clone()),
            (vec![10], vec![(0, Some(vec![[5, 10]]))])
        );
        // No TP group of more than one rank, or no TP flag: the param as registered.
        for (spec, at) in [
            (shard("fc1", &[16, 8], ROWS, &[8, 8], 1), tp(0, 1)),
            (shard("w", &[4, 4], 0, &[], 1), tp(1, 2)),
        ] {
            let p = place(&spec, at).unwrap();
            assert_eq!(
                (p.global, p.split, p.parts),
                (
                    spec.clone(),
                    None,
                    vec![(0, None), (1, None)][..components(&spec).len()].to_vec()
                )
            );
        }
        let err = place(&shard("huge", &[1 << 24, 1 << 24], ROWS, &[], 1), tp(0, 2)).unwrap_err();
        assert!(err.message.contains("overflows"), "{}", err.message);
    }

    /// Every TP rank's held blocks, placed back by `shard_of` and `place`, cover every item of
    /// the unsharded param exactly once.
    #[test]
    fn the_shards_of_every_rank_tile_the_unsharded_param() {
        let cases = [
            (shard("gdn", &[104, 8], 0, &[16, 16, 32, 32, 4, 4], 1), TpSplit::Rows, 4),
            (shard("qkv", &[64, 8], 0, &[8, 4, 4], 4), TpSplit::Groups, 4),
            (shard("proj", &[6, 12], 0, &[], 1), TpSplit::Cols, 3),
            (
                shard("e", &[2, 8, 6], ParamFlags::EXPERT_STACK, &[4, 4], 1),
                TpSplit::Rows,
                2,
            ),
            (
                shard("e", &[2, 8, 6], ParamFlags::EXPERT_STACK, &[4, 4], 1),
                TpSplit::Cols,
                2,
            ),
            (
                shard("emb", &[12, 4], ParamFlags::EMBEDDING_OR_OUTPUT, &[], 1),
                TpSplit::Rows,
                3,
            ),
        ];
        for (global, split, size) in cases {
            let comps = components(&global);
            let mut seen: Vec<Vec<u32>> = comps.iter().map(|c| vec![0; c.range.len() as usize]).collect();
            for rank in 0..size {
                let held = held_blocks(&global, split, TpRank { rank, size }).unwrap();
                for (c, block) in held.iter().enumerate() {
                    let Some(block) = block else { continue };
                    let items = block.as_ref().map_or(comps[c].range.len(), |b| block_items(b));
                    for run in runs(&comps[c].shape, block.as_deref(), ElemRange::new(0, items)) {
                        for g in run.global..run.global + run.len {
                            seen[c][g as usize] += 1;
                        }
                    }
                }
            }
            assert!(
                seen.iter().flatten().all(|&n| n == 1),
                "{}: {split:?} × {size}: {seen:?}",
                global.name
            );
        }
        let err = held_blocks(
            &shard("fc1", &[6, 4], 0, &[3, 3], 1),
            TpSplit::Rows,
            TpRank { rank: 0, size: 2 },
        )
        .unwrap_err();
        assert!(err.contains("has no TP shard 0 of 2"), "{err}");
    }

    /// Item `i` of `block` (row-major in the block) as an item of the component.
    fn brute(dims: &[u64], block: &[[u64; 2]], mut i: u64) -> u64 {
        let mut index = vec![0; dims.len()];
        for a in (0..dims.len()).rev() {
            let extent = block[a][1] - block[a][0];
            index[a] = block[a][0] + i % extent;
            i /= extent;
        }
        index.iter().zip(dims).fold(0, |flat, (&x, &d)| flat * d + x)
    }

    #[test]
    fn runs_and_overlaps_agree_with_item_by_item_placement() {
        let dims = [3u64, 4, 5];
        let blocks: Vec<Option<Block>> = vec![
            None,
            Some(vec![[1, 3], [0, 4], [0, 5]]),
            Some(vec![[0, 3], [1, 3], [0, 5]]),
            Some(vec![[0, 3], [0, 4], [2, 5]]),
            Some(vec![[1, 2], [1, 4], [0, 2]]),
        ];
        let whole: Block = dims.iter().map(|&d| [0, d]).collect();
        let place_items = |block: &Option<Block>, range: ElemRange| -> Vec<(u64, u64)> {
            let b = block.as_ref().unwrap_or(&whole);
            (range.start..range.end).map(|i| (brute(&dims, b, i), i)).collect()
        };
        for block in &blocks {
            let items = block_items(block.as_ref().unwrap_or(&whole));
            for (start, end) in [(0, items), (1, items - 1), (3, 4), (items / 2, items)] {
                let range = ElemRange::new(start, end);
                let listed: Vec<(u64, u64)> = runs(&dims, block.as_deref(), range)
                    .iter()
                    .flat_map(|r| (0..r.len).map(move |k| (r.global + k, r.local + k)))
                    .collect();
                assert_eq!(listed, place_items(block, range), "{block:?} {range:?}");
                for other in &blocks {
                    let n = block_items(other.as_ref().unwrap_or(&whole));
                    let theirs = place_items(other, ElemRange::new(0, n));
                    let want: Vec<(u64, u64)> = place_items(block, range)
                        .into_iter()
                        .filter_map(|(g, a)| theirs.iter().find(|(h, _)| *h == g).map(|&(_, b)| (a, b)))
                        .collect();
                    let got: Vec<(u64, u64)> = overlap(
                        &dims,
                        (block.as_deref(), range),
                        (other.as_deref(), ElemRange::new(0, n)),
                    )
                    .iter()
                    .flat_map(|s| (0..s.len).map(move |k| (s.a + k, s.b + k)))
                    .collect();
                    assert_eq!(got, want, "{block:?} {range:?} with {other:?}");
                }
            }
        }
    }
}

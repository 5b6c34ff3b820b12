//! The amax half of the loop nest: raw block amaxes of rows and columns, and the scale bytes
//! and fast-path constants derived from them (docs/mxfp8.md §1, §7).
//!
//! Amaxes are taken on raw keys (`|x|` as an integer, NaN not filtered out), which vectorize
//! as integer maxima; a block whose raw amax is NaN or ±∞ has its NaN-free amax recomputed
//! when its scale is needed.

use super::fast::{Element, FAST_MIN_SCALE};
use super::scalar::BLOCK_SIZE;

/// The amax key of `x`, ignoring NaN (docs/mxfp8.md §7).
#[inline(always)]
fn nan_free_key<E: Element>(x: E) -> E::Key {
    let k = x.raw_key();
    if k > E::NON_FINITE { E::Key::default() } else { k }
}

/// The maximum NaN-free key of `xs`: the block amax of docs/mxfp8.md §7.
pub(super) fn nan_free_max<E: Element>(xs: impl Iterator<Item = E>) -> E::Key {
    xs.map(nan_free_key).fold(E::Key::default(), Ord::max)
}

/// Whether a block with raw amax key `raw` (NaN not filtered out) and scale byte `b` takes the
/// fast path.
#[inline(always)]
pub(super) fn is_fast<E: Element>(raw: E::Key, b: u8) -> bool {
    raw < E::NON_FINITE && b >= FAST_MIN_SCALE
}

/// Fills `b` and `drop` with the scale bytes and fast-path constants of a run of blocks whose
/// raw amax keys (NaN not filtered out) are `raw`, and returns whether every block takes the
/// fast path. `nan_free(i)` recomputes the amax of block `i` without NaN; it is called only
/// for blocks holding a NaN or ±∞.
#[inline(always)]
pub(super) fn scale_bytes<E: Element>(
    raw: &[E::Key],
    b: &mut [u8],
    drop: &mut [E::Lane],
    nan_free: impl Fn(usize) -> E::Key,
) -> bool {
    let n = raw.len();
    let (b, drop) = (&mut b[..n], &mut drop[..n]);
    let mut all_fast = true;
    for i in 0..n {
        b[i] = E::scale_byte(raw[i]);
        drop[i] = E::fast_drop(b[i]);
        all_fast &= is_fast::<E>(raw[i], b[i]);
    }
    if !all_fast {
        for i in 0..n {
            if raw[i] >= E::NON_FINITE {
                b[i] = E::scale_byte(nan_free(i));
            }
        }
    }
    all_fast
}

/// `[max(a[0], a[1]), max(a[2], a[3]), …, max(b[30], b[31])]`: one level of the reduction
/// tree of [`block_maxima`] (two permutes and a max on AVX-512).
#[inline(always)]
fn pair_max<K: Copy + Ord + Default>(a: &[K; BLOCK_SIZE], b: &[K; BLOCK_SIZE]) -> [K; BLOCK_SIZE] {
    const HALF: usize = BLOCK_SIZE / 2;
    let mut out = [K::default(); BLOCK_SIZE];
    for j in 0..HALF {
        out[j] = a[2 * j].max(a[2 * j + 1]);
        out[HALF + j] = b[2 * j].max(b[2 * j + 1]);
    }
    out
}

/// The raw keys of one block.
#[inline(always)]
fn keys<E: Element>(block: &[E; BLOCK_SIZE]) -> [E::Key; BLOCK_SIZE] {
    let mut k = [E::Key::default(); BLOCK_SIZE];
    for j in 0..BLOCK_SIZE {
        k[j] = block[j].raw_key();
    }
    k
}

/// One level of the reduction tree: `N` arrays from `2N`.
#[inline(always)]
fn tree_level<K: Copy + Ord + Default, const N: usize>(
    below: impl Fn(usize) -> [K; BLOCK_SIZE],
) -> [[K; BLOCK_SIZE]; N] {
    let mut out = [[K::default(); BLOCK_SIZE]; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = pair_max(&below(2 * i), &below(2 * i + 1));
    }
    out
}

/// The raw amax keys of 32 consecutive blocks as one array, reduced as a tree of [`pair_max`]
/// levels: 31 vector maxima instead of 32 horizontal reductions.
#[inline(always)]
fn block_maxima<E: Element>(blocks: &[[E; BLOCK_SIZE]; BLOCK_SIZE]) -> [E::Key; BLOCK_SIZE] {
    let l1: [_; 16] = tree_level(|i| keys(&blocks[i]));
    let l2: [_; 8] = tree_level(|i| l1[i]);
    let l3: [_; 4] = tree_level(|i| l2[i]);
    let l4: [_; 2] = tree_level(|i| l3[i]);
    pair_max(&l4[0], &l4[1])
}

/// The amax pass over a row (or a segment of one, starting at a block boundary): the raw
/// maximum of each rowwise block into `row_raw` (when `ROW`) and the running columnwise
/// maxima in `col_raw` (when `COL`). With [`Element::TREE_REDUCTION`], blocks are reduced 32
/// at a time by [`block_maxima`].
#[inline(always)]
pub(super) fn amax_row<E: Element, const ROW: bool, const COL: bool>(
    src: &[E],
    row_raw: &mut [E::Key],
    col_raw: &mut [E::Key],
) {
    let (groups, tail) = src.as_chunks::<BLOCK_SIZE>();
    let (accs, acc_tail) = col_raw[..src.len()].as_chunks_mut::<BLOCK_SIZE>();
    // Without the tree, every block is reduced on its own by the loop after this one.
    let tree_groups = if E::TREE_REDUCTION { groups.len() } else { 0 };
    let (tree_accs, other_accs) = accs.split_at_mut(tree_groups);
    let (units, rest) = groups[..tree_groups].as_chunks::<BLOCK_SIZE>();
    let (acc_units, acc_rest) = tree_accs.as_chunks_mut::<BLOCK_SIZE>();
    let (rest, acc_rest) = (
        rest.iter().chain(&groups[tree_groups..]),
        acc_rest.iter_mut().chain(other_accs),
    );
    let (raw_units, raw_rest) = row_raw.split_at_mut(units.len() * BLOCK_SIZE);
    for ((unit, acc), raw) in units
        .iter()
        .zip(acc_units)
        .zip(raw_units.as_chunks_mut::<BLOCK_SIZE>().0)
    {
        if COL {
            for (a, g) in acc.iter_mut().zip(unit) {
                // Keys in a local array first: the compiler cannot rule out that `a` aliases `g`.
                let k = keys(g);
                for j in 0..BLOCK_SIZE {
                    a[j] = a[j].max(k[j]);
                }
            }
        }
        if ROW {
            *raw = block_maxima(unit);
        }
    }
    let blocks = rest.map(|g| g.as_slice()).chain((!tail.is_empty()).then_some(tail));
    let accs = acc_rest.map(|a| a.as_mut_slice()).chain(Some(acc_tail));
    for ((blk, acc), raw) in blocks.zip(accs).zip(raw_rest.iter_mut()) {
        let mut m = E::Key::default();
        for (a, v) in acc.iter_mut().zip(blk) {
            let k = v.raw_key();
            if COL {
                *a = (*a).max(k);
            }
            m = m.max(k);
        }
        if ROW {
            *raw = m;
        }
    }
}

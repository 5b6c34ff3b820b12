//! The encoding half of the loop nest: one row segment of the input into one or both MXFP8
//! copies, once the scale bytes of its blocks are known.
//!
//! On the fast path (`fast.rs`) a segment is encoded group by group with the common formula
//! only, without branches, while the minimum of the lanes' [`Element::window`] offsets is
//! kept. A segment with a lane in the window is then encoded once more, checking group by
//! group and using the full formula for the groups that need it; in typical data no lane is
//! (elements 2^9 to 2^14 times smaller than their block's amax). A segment whose predecessor
//! needed the full formula is encoded with the checks at once ([`Checks`]), so that data full
//! of such elements is not encoded twice. Blocks off the fast path take the exact f32 path.

use super::amax::is_fast;
use super::fast::{Element, WINDOW};
use super::scalar::{BLOCK_SIZE, f32_to_e4m3, scale_inv};

/// Lanes per group of the fast encoding loops. A group of a row is one rowwise block.
const GROUP: usize = BLOCK_SIZE;

/// The fast-path constants of a group's lanes: one for the whole group (a rowwise block) or
/// one per lane (columns).
trait GroupScale<L>: Copy {
    fn at(self, j: usize) -> L;
}

impl<L: Copy> GroupScale<L> for L {
    #[inline(always)]
    fn at(self, _: usize) -> L {
        self
    }
}

impl<L: Copy> GroupScale<L> for &[L; GROUP] {
    #[inline(always)]
    fn at(self, j: usize) -> L {
        self[j]
    }
}

/// Per copy, whether the last fast segment needed the full formula somewhere: the next
/// segment is then encoded with the checks from the start.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Checks {
    pub(super) rows: bool,
    pub(super) cols: bool,
}

/// `f32_to_e4m3(v * s)`: the exact path, for blocks that do not qualify for the fast one.
#[inline(always)]
fn encode_exact<E: Element>(v: E, s: f32) -> u8 {
    f32_to_e4m3(v.to_f32() * s)
}

/// Whether no lane of `window` is in the window of the full formula.
#[inline(always)]
fn outside_window<L: Copy + Ord + From<u8>>(window: &[L; GROUP]) -> bool {
    window.iter().fold(true, |ok, &w| ok & (w >= WINDOW.into()))
}

/// Encodes a group into `out` with the common formula; returns the lanes' windows.
#[inline(always)]
fn encode_group_common<E: Element, S: GroupScale<E::Lane>>(
    x: &[E; GROUP],
    s: S,
    out: &mut [u8; GROUP],
) -> [E::Lane; GROUP] {
    let mut window = [E::Lane::default(); GROUP];
    for j in 0..GROUP {
        let p = x[j].prepare();
        out[j] = E::common_code(p, s.at(j));
        window[j] = E::window(p, s.at(j));
    }
    window
}

/// [`encode_group_common`] into both copies, sharing [`Element::prepare`].
#[inline(always)]
fn encode_group_common_both<E: Element>(
    x: &[E; GROUP],
    (rs, rd): (E::Lane, &mut [u8; GROUP]),
    (cs, cd): (&[E::Lane; GROUP], &mut [u8; GROUP]),
) -> ([E::Lane; GROUP], [E::Lane; GROUP]) {
    let mut window = ([E::Lane::default(); GROUP], [E::Lane::default(); GROUP]);
    for j in 0..GROUP {
        let p = x[j].prepare();
        rd[j] = E::common_code(p, rs);
        cd[j] = E::common_code(p, cs[j]);
        window.0[j] = E::window(p, rs);
        window.1[j] = E::window(p, cs[j]);
    }
    window
}

/// Lowers `acc` to `window` lane by lane.
#[inline(always)]
fn lower<L: Copy + Ord>(acc: &mut [L; GROUP], window: &[L; GROUP]) {
    for j in 0..GROUP {
        acc[j] = acc[j].min(window[j]);
    }
}

/// Encodes a group with the common formula and, if some lane needs it, the full one; returns
/// whether one did.
#[inline(always)]
fn encode_group_checked<E: Element, S: GroupScale<E::Lane>>(x: &[E; GROUP], s: S, out: &mut [u8; GROUP]) -> bool {
    let mut need = false;
    for j in 0..GROUP {
        let (code, n) = E::finish_common(x[j].prepare(), s.at(j));
        out[j] = code;
        need |= n;
    }
    if need {
        for j in 0..GROUP {
            out[j] = E::finish(x[j].prepare(), s.at(j));
        }
    }
    need
}

/// Encodes groups with the common formula only; returns whether that was exact for all.
#[inline(always)]
fn encode_groups_common<E: Element, S: GroupScale<E::Lane>>(
    xs: &[[E; GROUP]],
    scale: impl Fn(usize) -> S,
    out: &mut [[u8; GROUP]],
) -> bool {
    let out = &mut out[..xs.len()];
    let mut window = [E::Lane::from(WINDOW); GROUP];
    for (g, (x, o)) in xs.iter().zip(out).enumerate() {
        lower(&mut window, &encode_group_common::<E, _>(x, scale(g), o));
    }
    outside_window(&window)
}

/// Encodes groups checking each; returns whether some group needed the full formula.
#[inline(always)]
fn encode_groups_checked<E: Element, S: GroupScale<E::Lane>>(
    xs: &[[E; GROUP]],
    scale: impl Fn(usize) -> S,
    out: &mut [[u8; GROUP]],
) -> bool {
    let out = &mut out[..xs.len()];
    let mut need = false;
    for (g, (x, o)) in xs.iter().zip(out).enumerate() {
        need |= encode_group_checked::<E, _>(x, scale(g), o);
    }
    need
}

/// Encodes groups on the fast path: common formula first unless `check` (see [`Checks`]).
#[inline(always)]
fn encode_groups_fast<E: Element, S: GroupScale<E::Lane>>(
    xs: &[[E; GROUP]],
    scale: impl Fn(usize) -> S + Copy,
    out: &mut [[u8; GROUP]],
    check: &mut bool,
) {
    if !*check && encode_groups_common::<E, _>(xs, scale, out) {
        return;
    }
    *check = encode_groups_checked::<E, _>(xs, scale, out);
}

/// [`encode_groups_common`] into both copies at once, sharing [`Element::prepare`]; returns,
/// per copy, whether the common formula was exact for all groups.
#[inline(always)]
fn encode_groups_common_both<E: Element>(
    xs: &[[E; GROUP]],
    (row_drop, row_out): (&[E::Lane], &mut [[u8; GROUP]]),
    (col_drop, col_out): (&[[E::Lane; GROUP]], &mut [[u8; GROUP]]),
) -> (bool, bool) {
    let ng = xs.len();
    // Equal lengths everywhere, so that the loop needs no bounds checks.
    let (rd, cd) = (&mut row_out[..ng], &mut col_out[..ng]);
    let (rs, cs) = (&row_drop[..ng], &col_drop[..ng]);
    let mut rw = [E::Lane::from(WINDOW); GROUP];
    let mut cw = rw;
    for g in 0..ng {
        let (r, c) = encode_group_common_both::<E>(&xs[g], (rs[g], &mut rd[g]), (&cs[g], &mut cd[g]));
        lower(&mut rw, &r);
        lower(&mut cw, &c);
    }
    (outside_window(&rw), outside_window(&cw))
}

/// Encodes a row segment into both copies on the fast path: rowwise with one constant per
/// block (`row_drop`), columnwise with one per column (`col_drop`).
#[inline(always)]
pub(super) fn encode_both_fast<E: Element>(
    src: &[E],
    (row_drop, row_dst): (&[E::Lane], &mut [u8]),
    (col_drop, col_dst): (&[E::Lane], &mut [u8]),
    checks: &mut Checks,
) {
    let n = src.len();
    let (xs, x_tail) = src.as_chunks::<GROUP>();
    let (rd, cd) = (row_dst[..n].as_chunks_mut().0, col_dst[..n].as_chunks_mut().0);
    let cs = col_drop[..n].as_chunks().0;
    if checks.rows | checks.cols {
        encode_groups_fast::<E, _>(xs, |g| row_drop[g], rd, &mut checks.rows);
        encode_groups_fast::<E, _>(xs, |g| &cs[g], cd, &mut checks.cols);
    } else {
        let (rows_exact, cols_exact) = encode_groups_common_both(xs, (row_drop, &mut *rd), (cs, &mut *cd));
        if !rows_exact {
            checks.rows = encode_groups_checked::<E, _>(xs, |g| row_drop[g], rd);
        }
        if !cols_exact {
            checks.cols = encode_groups_checked::<E, _>(xs, |g| &cs[g], cd);
        }
    }
    let start = n - x_tail.len();
    if !x_tail.is_empty() {
        encode_full(x_tail, |_| row_drop[xs.len()], &mut row_dst[start..n]);
        encode_full(x_tail, |j| col_drop[start + j], &mut col_dst[start..n]);
    }
}

/// Encodes a row segment into the rowwise copy on the fast path.
#[inline(always)]
pub(super) fn encode_rows_fast<E: Element>(src: &[E], row_drop: &[E::Lane], dst: &mut [u8], check: &mut bool) {
    let n = src.len();
    let (xs, x_tail) = src.as_chunks::<GROUP>();
    encode_groups_fast::<E, _>(xs, |g| row_drop[g], dst[..n].as_chunks_mut().0, check);
    if !x_tail.is_empty() {
        encode_full(x_tail, |_| row_drop[xs.len()], &mut dst[n - x_tail.len()..n]);
    }
}

/// Encodes a row segment into the columnwise copy on the fast path.
#[inline(always)]
pub(super) fn encode_cols_fast<E: Element>(src: &[E], col_drop: &[E::Lane], dst: &mut [u8], check: &mut bool) {
    let n = src.len();
    let (xs, x_tail) = src.as_chunks::<GROUP>();
    let cs = col_drop[..n].as_chunks().0;
    encode_groups_fast::<E, _>(xs, |g| &cs[g], dst[..n].as_chunks_mut().0, check);
    let start = n - x_tail.len();
    encode_full(x_tail, |j| col_drop[start + j], &mut dst[start..n]);
}

/// Encodes elements with the full formula, `drop(j)` being the constant of element `j`: the
/// elements of a row after its last full group, and fast blocks among slow ones.
#[inline(always)]
fn encode_full<E: Element>(x: &[E], drop: impl Fn(usize) -> E::Lane, dst: &mut [u8]) {
    for (j, (d, &v)) in dst.iter_mut().zip(x).enumerate() {
        *d = E::finish(v.prepare(), drop(j));
    }
}

/// Encodes a row segment into the rowwise copy when some block of its strip is off the fast
/// path: block by block, fast or exact. `raw`, `b` and `drop` hold the raw amax keys, scale
/// bytes and fast-path constants of the segment's blocks.
#[inline(always)]
pub(super) fn encode_rows_mixed<E: Element>(src: &[E], raw: &[E::Key], b: &[u8], drop: &[E::Lane], dst: &mut [u8]) {
    let blocks = src.chunks(BLOCK_SIZE).zip(dst.chunks_mut(BLOCK_SIZE));
    for (k, (blk, out)) in blocks.enumerate() {
        if is_fast::<E>(raw[k], b[k]) {
            encode_full(blk, |_| drop[k], out);
        } else {
            let si = scale_inv(b[k]);
            for (d, &v) in out.iter_mut().zip(blk) {
                *d = encode_exact(v, si);
            }
        }
    }
}

/// Encodes a row segment into the columnwise copy exactly, with the inverse scale of each
/// column in `scale_inv`.
#[inline(always)]
pub(super) fn encode_cols_exact<E: Element>(src: &[E], scale_inv: &[f32], dst: &mut [u8]) {
    for ((d, &v), &si) in dst.iter_mut().zip(src).zip(scale_inv) {
        *d = encode_exact(v, si);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numerics::mxfp8::fast::FAST_MIN_SCALE;
    use crate::numerics::mxfp8::scalar::e8m0_from_amax;

    /// The amax the test scales are chosen for: every element of [`segment`] is below it.
    const SCALE_AMAX: f32 = 16.0;

    /// bf16 bits of magnitudes in `[2^-3, 2^4)`, except in the groups listed in `tiny`, where
    /// every eighth element is about 2^-12: in the window of the full formula for the scale of
    /// [`SCALE_AMAX`] (products in `[2^-10, 2^-6)`).
    fn segment(groups: usize, tiny: &[usize]) -> Vec<u16> {
        (0..groups * GROUP)
            .map(|i| {
                let (g, j) = (i / GROUP, i % GROUP);
                let mant = (i * 37 % 128) as u16;
                let sign = if i % 3 == 0 { 0x8000 } else { 0 };
                let exponent = if tiny.contains(&g) && j % 8 == 5 {
                    115
                } else {
                    124 + (i % 7) as u16
                };
                sign | (exponent << 7) | mant
            })
            .collect()
    }

    #[test]
    fn checks_carry_over_segments_without_changing_a_code() {
        let b = e8m0_from_amax(SCALE_AMAX);
        assert!(b >= FAST_MIN_SCALE);
        let drop = <u16 as Element>::fast_drop(b);
        // Segments of 5 groups and a 7-element tail; the rowwise window is hit only where a
        // segment lists tiny groups, the columnwise one as well, as both share the constant.
        let plan: [&[usize]; 6] = [&[], &[2], &[], &[], &[0, 4], &[]];
        let mut checks = Checks::default();
        let mut rows_only = false;
        let mut cols_only = false;
        for tiny in plan {
            let mut x = segment(5, tiny);
            x.extend_from_slice(&segment(1, &[])[..7]);
            let want: Vec<u8> = x.iter().map(|&v| <u16 as Element>::finish(v.prepare(), drop)).collect();
            let (row_drop, col_drop) = (vec![drop; 6], vec![drop; x.len()]);
            let (mut rd, mut cd) = (vec![0; x.len()], vec![0; x.len()]);
            encode_both_fast(&x, (&row_drop, &mut rd), (&col_drop, &mut cd), &mut checks);
            assert_eq!((&rd, &cd), (&want, &want), "both, tiny groups {tiny:?}");
            assert_eq!((checks.rows, checks.cols), (!tiny.is_empty(), !tiny.is_empty()));
            let mut out = vec![0; x.len()];
            encode_rows_fast(&x, &row_drop, &mut out, &mut rows_only);
            assert_eq!(out, want, "rows, tiny groups {tiny:?}");
            out.fill(0xEE);
            encode_cols_fast(&x, &col_drop, &mut out, &mut cols_only);
            assert_eq!(out, want, "cols, tiny groups {tiny:?}");
            assert_eq!((rows_only, cols_only), (!tiny.is_empty(), !tiny.is_empty()));
        }
    }

    #[test]
    fn one_copy_checked_while_the_other_is_not() {
        let row_b = e8m0_from_amax(SCALE_AMAX);
        let drop = <u16 as Element>::fast_drop(row_b);
        // A column scale 2^20 times larger moves every product below 2^-10, out of the window:
        // only the rowwise copy needs the full formula.
        let col_drop = <u16 as Element>::fast_drop(row_b + 20);
        let x = segment(4, &[1]);
        let encode = |d: u16| -> Vec<u8> { x.iter().map(|&v| <u16 as Element>::finish(v.prepare(), d)).collect() };
        let (want_rows, want_cols) = (encode(drop), encode(col_drop));
        let mut checks = Checks::default();
        for round in 0..3 {
            let (mut rd, mut cd) = (vec![0; x.len()], vec![0; x.len()]);
            let cols = vec![col_drop; x.len()];
            encode_both_fast(&x, (&[drop; 4], &mut rd), (&cols, &mut cd), &mut checks);
            assert_eq!((rd == want_rows, cd == want_cols), (true, true), "round {round}");
            assert_eq!((checks.rows, checks.cols), (true, false), "round {round}");
        }
    }
}

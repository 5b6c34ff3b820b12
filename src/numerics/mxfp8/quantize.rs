//! Host MXFP8 quantization, rowwise and columnwise, fused into one pass over the input.
//!
//! The input is walked in strips of 32 rows (one columnwise block row). For a strip, the raw
//! amaxes of all its rowwise blocks and columns are known before it is encoded: they were taken
//! while the previous strip was being encoded, interleaved segment by segment (1024 columns)
//! with that work, so the reads of new data overlap with computation and each strip is read
//! from memory once. The scale bytes of the whole strip are then computed together and the
//! strip, still in L2, is encoded into both copies, sharing the scale-independent half of the
//! fast encoding (see `fast.rs`). The inner loops are branch-free over fixed 32-lane groups so
//! that they vectorize; on x86-64 the loop nest is also compiled for AVX2 and AVX-512 and
//! picked at run time.

use super::fast::{Element, FAST_MIN_SCALE};
use super::scalar::{BLOCK_SIZE, e8m0_from_amax, f32_to_e4m3, scale_inv};
use super::{Direction, Input, QuantizedMut, ScaleLayout, ScaleMap, check_len, element_count, scale_shape};
use crate::error::Result;

/// Columns per segment of a row: the unit of interleaving, and 32 rowwise blocks, whose amaxes
/// [`block_maxima`] reduces together.
const SEGMENT: usize = BLOCK_SIZE * BLOCK_SIZE;

/// Quantizes a `[rows, cols]` row-major input into the requested MXFP8 copies: the host
/// reference behind `muon_mxfp8_quantize_host`. Either copy may be omitted; when both are
/// given they are produced in one pass (see [`quantize_both`]).
///
/// Every buffer length must match exactly: `rows * cols` input elements and data bytes, and
/// `scale_shape(rows, cols, direction)` scale bytes per copy. All scale bytes are written,
/// padding with `0x00`. On error nothing is written.
///
/// # Errors
/// `InvalidArgument` if `rows * cols` overflows or a buffer has the wrong length.
pub fn quantize(
    input: Input<'_>,
    rows: usize,
    cols: usize,
    layout: ScaleLayout,
    rowwise: Option<QuantizedMut<'_>>,
    colwise: Option<QuantizedMut<'_>>,
) -> Result<()> {
    const WHAT: &str = "mxfp8 quantize";
    let n = element_count(WHAT, rows, cols)?;
    check_len(WHAT, "input", input.len(), n)?;
    for (copy, direction, names) in [
        (&rowwise, Direction::Rowwise, ["rowwise data", "rowwise scales"]),
        (&colwise, Direction::Colwise, ["colwise data", "colwise scales"]),
    ] {
        if let Some(q) = copy {
            let (sr, sc) = scale_shape(rows, cols, direction);
            check_len(WHAT, names[0], q.data.len(), n)?;
            check_len(WHAT, names[1], q.scales.len(), sr * sc)?;
        }
    }
    let mut rowwise = rowwise.map(|q| Target::new(q, rows, cols, Direction::Rowwise, layout));
    let mut colwise = colwise.map(|q| Target::new(q, rows, cols, Direction::Colwise, layout));
    match input {
        Input::Bf16(x) => quantize_dispatch(x, rows, cols, rowwise.as_mut(), colwise.as_mut()),
        Input::F32(x) => quantize_dispatch(x, rows, cols, rowwise.as_mut(), colwise.as_mut()),
    }
    Ok(())
}

/// Rowwise (1×32 blocks) quantization into `data_out` (`rows * cols` bytes) and `scales_out`
/// (`scale_shape(rows, cols, Rowwise)` bytes).
///
/// # Errors
/// As [`quantize`].
pub fn quantize_rowwise(
    input: Input<'_>,
    rows: usize,
    cols: usize,
    layout: ScaleLayout,
    data_out: &mut [u8],
    scales_out: &mut [u8],
) -> Result<()> {
    let q = QuantizedMut {
        data: data_out,
        scales: scales_out,
    };
    quantize(input, rows, cols, layout, Some(q), None)
}

/// Columnwise (32×1 blocks) quantization into `data_out` (`rows * cols` bytes, row-major, not
/// transposed) and `scales_out` (`scale_shape(rows, cols, Colwise)` bytes).
///
/// # Errors
/// As [`quantize`].
pub fn quantize_colwise(
    input: Input<'_>,
    rows: usize,
    cols: usize,
    layout: ScaleLayout,
    data_out: &mut [u8],
    scales_out: &mut [u8],
) -> Result<()> {
    let q = QuantizedMut {
        data: data_out,
        scales: scales_out,
    };
    quantize(input, rows, cols, layout, None, Some(q))
}

/// Rowwise and columnwise quantization in one pass over the input (strips of 32 rows), with
/// results identical to [`quantize_rowwise`] followed by [`quantize_colwise`].
///
/// # Errors
/// As [`quantize`].
pub fn quantize_both(
    input: Input<'_>,
    rows: usize,
    cols: usize,
    layout: ScaleLayout,
    rowwise: QuantizedMut<'_>,
    colwise: QuantizedMut<'_>,
) -> Result<()> {
    quantize(input, rows, cols, layout, Some(rowwise), Some(colwise))
}

/// One output copy with its scale index map.
struct Target<'a> {
    data: &'a mut [u8],
    scales: &'a mut [u8],
    map: ScaleMap,
    /// Swizzled layout only: the compact scales of the current band of tiles
    /// ([`ScaleMap::band_rows`] rows), written out tile by tile once the band is complete, so
    /// that the swizzled buffer is written in whole cache lines.
    band: Vec<u8>,
}

impl<'a> Target<'a> {
    fn new(q: QuantizedMut<'a>, rows: usize, cols: usize, direction: Direction, layout: ScaleLayout) -> Self {
        // The quantization loop never visits padding bytes; they stay 0x00.
        q.scales.fill(0);
        let map = ScaleMap::new(rows, cols, direction, layout);
        let band = match layout {
            ScaleLayout::Compact => Vec::new(),
            ScaleLayout::Swizzled => vec![0; map.band_rows() * map.stride],
        };
        Target {
            data: q.data,
            scales: q.scales,
            map,
            band,
        }
    }

    /// Stores compact scale row `r` (columns `0..bytes.len()`). `last` marks the last row the
    /// call will store.
    fn store_scales(&mut self, r: usize, bytes: &[u8], last: bool) {
        let stride = self.map.stride;
        if self.band.is_empty() {
            self.scales[r * stride..][..bytes.len()].copy_from_slice(bytes);
            return;
        }
        let band_rows = self.map.band_rows();
        self.band[(r % band_rows) * stride..][..bytes.len()].copy_from_slice(bytes);
        if r % band_rows == band_rows - 1 || last {
            self.map.store_band(self.scales, r / band_rows, &self.band);
            self.band.fill(0);
        }
    }
}

/// The amax key of `x`, ignoring NaN (docs/mxfp8.md §7).
#[inline(always)]
fn nan_free_key<E: Element>(x: E) -> E::Key {
    let k = x.raw_key();
    if k > E::NON_FINITE { E::Key::default() } else { k }
}

/// The maximum NaN-free key of `xs`: the block amax of docs/mxfp8.md §7.
fn nan_free_max<E: Element>(xs: impl Iterator<Item = E>) -> E::Key {
    xs.map(nan_free_key).fold(E::Key::default(), Ord::max)
}

/// Whether a block with raw amax key `raw` (NaN not filtered out) and scale byte `b` takes the
/// fast path.
#[inline(always)]
fn is_fast<E: Element>(raw: E::Key, b: u8) -> bool {
    raw < E::NON_FINITE && b >= FAST_MIN_SCALE
}

/// `f32_to_e4m3(v * s)`: the exact path, for blocks that do not qualify for the fast one.
#[inline(always)]
fn encode_exact<E: Element>(v: E, s: f32) -> u8 {
    f32_to_e4m3(v.to_f32() * s)
}

/// Fills `b` and `drop` with the scale bytes and fast-path constants of a run of blocks whose
/// raw amax keys (NaN not filtered out) are `raw`, and returns whether every block takes the
/// fast path. `nan_free(i)` recomputes the amax of block `i` without NaN; it is called only
/// for blocks holding a NaN or ±∞.
#[inline(always)]
fn scale_bytes<E: Element>(
    raw: &[E::Key],
    b: &mut [u8],
    drop: &mut [E::Lane],
    nan_free: impl Fn(usize) -> E::Key,
) -> bool {
    let n = raw.len();
    let (b, drop) = (&mut b[..n], &mut drop[..n]);
    let mut all_fast = true;
    for i in 0..n {
        b[i] = e8m0_from_amax(E::key_to_f32(raw[i]));
        drop[i] = E::fast_drop(b[i]);
        all_fast &= is_fast::<E>(raw[i], b[i]);
    }
    if !all_fast {
        for i in 0..n {
            if raw[i] >= E::NON_FINITE {
                b[i] = e8m0_from_amax(E::key_to_f32(nan_free(i)));
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
fn amax_row<E: Element, const ROW: bool, const COL: bool>(src: &[E], row_raw: &mut [E::Key], col_raw: &mut [E::Key]) {
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

/// Lanes per group of the fast encoding loops: the full formula is evaluated only for groups
/// that contain a lane needing it (see `fast.rs`). A group of a row is one rowwise block.
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

/// Encodes a group with the common formula into one or two copies and returns, per copy,
/// whether any lane needs the full formula. `prepare` is shared between the copies.
#[inline(always)]
fn encode_group<E: Element, R: GroupScale<E::Lane>, C: GroupScale<E::Lane>>(
    x: &[E; GROUP],
    (rs, rd): (R, &mut [u8; GROUP]),
    col: Option<(C, &mut [u8; GROUP])>,
) -> (bool, bool) {
    let (mut need_row, mut need_col) = (false, false);
    match col {
        Some((cs, cd)) => {
            for j in 0..GROUP {
                let p = x[j].prepare();
                let (code, n) = E::finish_common(p, rs.at(j));
                rd[j] = code;
                need_row |= n;
                let (code, n) = E::finish_common(p, cs.at(j));
                cd[j] = code;
                need_col |= n;
            }
        }
        None => {
            for j in 0..GROUP {
                let (code, n) = E::finish_common(x[j].prepare(), rs.at(j));
                rd[j] = code;
                need_row |= n;
            }
        }
    }
    (need_row, need_col)
}

/// Encodes a group with the full formula.
#[inline(always)]
fn encode_group_full<E: Element, S: GroupScale<E::Lane>>(x: &[E; GROUP], s: S, out: &mut [u8; GROUP]) {
    for j in 0..GROUP {
        out[j] = E::finish(x[j].prepare(), s.at(j));
    }
}

/// Encodes a row segment into both copies on the fast path: rowwise with one constant per
/// block (`row_drop`), columnwise with one per column (`col_drop`).
#[inline(always)]
fn encode_both_fast<E: Element>(
    src: &[E],
    row_drop: &[E::Lane],
    col_drop: &[E::Lane],
    row_dst: &mut [u8],
    col_dst: &mut [u8],
) {
    let n = src.len();
    let (xs, x_tail) = src.as_chunks::<GROUP>();
    let ng = xs.len();
    // Equal lengths everywhere, so that the loop needs no bounds checks.
    let rds = &mut row_dst[..n].as_chunks_mut::<GROUP>().0[..ng];
    let cds = &mut col_dst[..n].as_chunks_mut::<GROUP>().0[..ng];
    let rdrop = &row_drop[..ng];
    let cdrop = &col_drop[..n].as_chunks::<GROUP>().0[..ng];
    for g in 0..ng {
        let (x, rs, cs) = (&xs[g], rdrop[g], &cdrop[g]);
        let (need_row, need_col) = encode_group::<E, _, _>(x, (rs, &mut rds[g]), Some((cs, &mut cds[g])));
        if need_row | need_col {
            if need_row {
                encode_group_full::<E, _>(x, rs, &mut rds[g]);
            }
            if need_col {
                encode_group_full::<E, _>(x, cs, &mut cds[g]);
            }
        }
    }
    let start = n - x_tail.len();
    for (j, &v) in x_tail.iter().enumerate() {
        let p = v.prepare();
        row_dst[start + j] = E::finish(p, row_drop[ng]);
        col_dst[start + j] = E::finish(p, col_drop[start + j]);
    }
}

/// Encodes a row segment into the rowwise copy on the fast path (all its blocks fast).
#[inline(always)]
fn encode_rows_fast<E: Element>(src: &[E], row_drop: &[E::Lane], dst: &mut [u8]) {
    let n = src.len();
    let (xs, x_tail) = src.as_chunks::<GROUP>();
    let ng = xs.len();
    let ds = &mut dst[..n].as_chunks_mut::<GROUP>().0[..ng];
    let rdrop = &row_drop[..ng];
    for g in 0..ng {
        if encode_group::<E, _, E::Lane>(&xs[g], (rdrop[g], &mut ds[g]), None).0 {
            encode_group_full::<E, _>(&xs[g], rdrop[g], &mut ds[g]);
        }
    }
    let start = n - x_tail.len();
    for (j, &v) in x_tail.iter().enumerate() {
        dst[start + j] = E::finish(v.prepare(), row_drop[ng]);
    }
}

/// Encodes a row segment into the columnwise copy on the fast path.
#[inline(always)]
fn encode_cols_fast<E: Element>(src: &[E], col_drop: &[E::Lane], dst: &mut [u8]) {
    let n = src.len();
    let (xs, x_tail) = src.as_chunks::<GROUP>();
    let ng = xs.len();
    let ds = &mut dst[..n].as_chunks_mut::<GROUP>().0[..ng];
    let cdrop = &col_drop[..n].as_chunks::<GROUP>().0[..ng];
    for g in 0..ng {
        if encode_group::<E, _, E::Lane>(&xs[g], (&cdrop[g], &mut ds[g]), None).0 {
            encode_group_full::<E, _>(&xs[g], &cdrop[g], &mut ds[g]);
        }
    }
    let start = n - x_tail.len();
    for (j, &v) in x_tail.iter().enumerate() {
        dst[start + j] = E::finish(v.prepare(), col_drop[start + j]);
    }
}

/// Raw amax keys of one strip: `32 * ceil(cols/32)` rowwise blocks (row `i`, block `k` at
/// `i * blocks_per_row + k`) and `cols` columns.
struct StripAmax<K> {
    row: Vec<K>,
    col: Vec<K>,
}

/// Per-call scratch: the amaxes of the strip being encoded and of the next one, and the scale
/// bytes and constants of the strip being encoded.
struct Scratch<E: Element> {
    amax: StripAmax<E::Key>,
    next_amax: StripAmax<E::Key>,
    row_b: Vec<u8>,
    row_drop: Vec<E::Lane>,
    col_b: Vec<u8>,
    col_drop: Vec<E::Lane>,
    col_scale_inv: Vec<f32>,
}

impl<E: Element> Scratch<E> {
    fn new(cols: usize) -> Self {
        let blocks = BLOCK_SIZE * cols.div_ceil(BLOCK_SIZE);
        let amax = || StripAmax {
            row: vec![E::Key::default(); blocks],
            col: vec![E::Key::default(); cols],
        };
        Scratch {
            amax: amax(),
            next_amax: amax(),
            row_b: vec![0; blocks],
            row_drop: vec![E::Lane::default(); blocks],
            col_b: vec![0; cols],
            col_drop: vec![E::Lane::default(); cols],
            col_scale_inv: vec![0.0; cols],
        }
    }
}

/// Which copies a call produces.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wanted {
    Both,
    Rowwise,
    Colwise,
}

/// The amax pass over one row segment, for the wanted copies: see [`amax_row`].
#[inline(always)]
fn amax_segment<E: Element>(wanted: Wanted, src: &[E], row_raw: &mut [E::Key], col_raw: &mut [E::Key]) {
    match wanted {
        Wanted::Both => amax_row::<E, true, true>(src, row_raw, col_raw),
        Wanted::Rowwise => amax_row::<E, true, false>(src, row_raw, col_raw),
        Wanted::Colwise => amax_row::<E, false, true>(src, row_raw, col_raw),
    }
}

/// Runs [`quantize_impl`] compiled for the widest vector extension the CPU has.
fn quantize_dispatch<E: Element>(
    x: &[E],
    rows: usize,
    cols: usize,
    rowwise: Option<&mut Target<'_>>,
    colwise: Option<&mut Target<'_>>,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512bw") && std::arch::is_x86_feature_detected!("avx512vl") {
            // SAFETY: the CPU supports every feature `quantize_avx512` is compiled with.
            return unsafe { quantize_avx512(x, rows, cols, rowwise, colwise) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports every feature `quantize_avx2` is compiled with.
            return unsafe { quantize_avx2(x, rows, cols, rowwise, colwise) };
        }
    }
    quantize_impl(x, rows, cols, rowwise, colwise)
}

/// [`quantize_impl`] compiled with AVX-512 (F, BW, VL).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
fn quantize_avx512<E: Element>(
    x: &[E],
    rows: usize,
    cols: usize,
    rowwise: Option<&mut Target<'_>>,
    colwise: Option<&mut Target<'_>>,
) {
    quantize_impl(x, rows, cols, rowwise, colwise)
}

/// [`quantize_impl`] compiled with AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn quantize_avx2<E: Element>(
    x: &[E],
    rows: usize,
    cols: usize,
    rowwise: Option<&mut Target<'_>>,
    colwise: Option<&mut Target<'_>>,
) {
    quantize_impl(x, rows, cols, rowwise, colwise)
}

/// The quantization loop nest (see the module documentation) for the requested copies, whose
/// buffers have been checked.
#[inline(always)]
fn quantize_impl<E: Element>(
    x: &[E],
    rows: usize,
    cols: usize,
    mut rowwise: Option<&mut Target<'_>>,
    mut colwise: Option<&mut Target<'_>>,
) {
    let wanted = match (rowwise.is_some(), colwise.is_some()) {
        (true, true) => Wanted::Both,
        (true, false) => Wanted::Rowwise,
        (false, true) => Wanted::Colwise,
        (false, false) => return,
    };
    if rows == 0 || cols == 0 {
        return;
    }
    let nbc = cols.div_ceil(BLOCK_SIZE);
    let strips = rows.div_ceil(BLOCK_SIZE);
    let strip_rows = |s: usize| BLOCK_SIZE.min(rows - s * BLOCK_SIZE);
    let row_of = |r: usize| &x[r * cols..(r + 1) * cols];
    let segments = |i: usize| (i * SEGMENT..((i + 1) * SEGMENT).min(cols), i * BLOCK_SIZE);
    let nseg = cols.div_ceil(SEGMENT);
    let mut s = Scratch::<E>::new(cols);

    // The first strip's amaxes; every later strip's are taken while its predecessor is encoded.
    s.amax.col.fill(E::Key::default());
    for i in 0..strip_rows(0) {
        amax_segment(
            wanted,
            row_of(i),
            &mut s.amax.row[i * nbc..(i + 1) * nbc],
            &mut s.amax.col,
        );
    }

    for strip in 0..strips {
        let (r0, nr) = (strip * BLOCK_SIZE, strip_rows(strip));
        let next_rows = if strip + 1 < strips { strip_rows(strip + 1) } else { 0 };

        // Scale bytes of the whole strip.
        let mut row_all_fast = false;
        if let Some(t) = rowwise.as_deref_mut() {
            row_all_fast = scale_bytes::<E>(&s.amax.row[..nr * nbc], &mut s.row_b, &mut s.row_drop, |j| {
                let (i, k) = (j / nbc, j % nbc);
                let block = row_of(r0 + i).chunks(BLOCK_SIZE).nth(k).unwrap_or_default();
                nan_free_max(block.iter().copied())
            });
            for i in 0..nr {
                t.store_scales(r0 + i, &s.row_b[i * nbc..(i + 1) * nbc], r0 + i + 1 == rows);
            }
        }
        let mut col_all_fast = false;
        if let Some(t) = colwise.as_deref_mut() {
            col_all_fast = scale_bytes::<E>(&s.amax.col, &mut s.col_b, &mut s.col_drop, |c| {
                nan_free_max((r0..r0 + nr).map(|r| x[r * cols + c]))
            });
            t.store_scales(strip, &s.col_b, strip + 1 == strips);
            if !col_all_fast {
                for (si, &b) in s.col_scale_inv.iter_mut().zip(&s.col_b) {
                    *si = scale_inv(b);
                }
            }
        }

        // Encode the strip, segment by segment, taking the next strip's amaxes in between.
        s.next_amax.col.fill(E::Key::default());
        for i in 0..nr {
            let r = r0 + i;
            for seg in 0..nseg {
                let (span, first_block) = segments(seg);
                let blocks = first_block..(first_block + BLOCK_SIZE).min(nbc);
                if i < next_rows {
                    let row_raw = &mut s.next_amax.row[i * nbc..(i + 1) * nbc][blocks.clone()];
                    amax_segment(
                        wanted,
                        &row_of(r + BLOCK_SIZE)[span.clone()],
                        row_raw,
                        &mut s.next_amax.col[span.clone()],
                    );
                }
                let src = &row_of(r)[span.clone()];
                let at = r * cols + span.start..r * cols + span.end;
                let row_consts = &s.row_drop[i * nbc..][blocks.clone()];
                let col_consts = &s.col_drop[span.clone()];
                if let (Some(rt), Some(ct), true, true) = (
                    rowwise.as_deref_mut(),
                    colwise.as_deref_mut(),
                    row_all_fast,
                    col_all_fast,
                ) {
                    encode_both_fast(src, row_consts, col_consts, &mut rt.data[at.clone()], &mut ct.data[at]);
                    continue;
                }
                if let Some(t) = rowwise.as_deref_mut() {
                    let dst = &mut t.data[at.clone()];
                    if row_all_fast {
                        encode_rows_fast(src, row_consts, dst);
                    } else {
                        let blocks = src.chunks(BLOCK_SIZE).zip(dst.chunks_mut(BLOCK_SIZE));
                        for (k, (blk, out)) in blocks.enumerate() {
                            let j = i * nbc + first_block + k;
                            let b = s.row_b[j];
                            if is_fast::<E>(s.amax.row[j], b) {
                                let f = row_consts[k];
                                for (d, &v) in out.iter_mut().zip(blk) {
                                    *d = E::finish(v.prepare(), f);
                                }
                            } else {
                                let si = scale_inv(b);
                                for (d, &v) in out.iter_mut().zip(blk) {
                                    *d = encode_exact(v, si);
                                }
                            }
                        }
                    }
                }
                if let Some(t) = colwise.as_deref_mut() {
                    let dst = &mut t.data[at];
                    if col_all_fast {
                        encode_cols_fast(src, col_consts, dst);
                    } else {
                        for ((d, &v), &si) in dst.iter_mut().zip(src).zip(&s.col_scale_inv[span]) {
                            *d = encode_exact(v, si);
                        }
                    }
                }
            }
        }
        std::mem::swap(&mut s.amax, &mut s.next_amax);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    /// The loop nest compiled for each instruction set the CPU has.
    #[derive(Debug, Clone, Copy)]
    enum Variant {
        Portable,
        #[cfg(target_arch = "x86_64")]
        Avx2,
        #[cfg(target_arch = "x86_64")]
        Avx512,
    }

    fn variants() -> Vec<Variant> {
        let mut v = vec![Variant::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                v.push(Variant::Avx2);
            }
            if std::arch::is_x86_feature_detected!("avx512bw") && std::arch::is_x86_feature_detected!("avx512vl") {
                v.push(Variant::Avx512);
            }
        }
        v
    }

    /// Rowwise and columnwise data and scales from one variant.
    fn run<E: Element>(variant: Variant, x: &[E], rows: usize, cols: usize, layout: ScaleLayout) -> [Vec<u8>; 4] {
        let n = rows * cols;
        let (rs, cs) = (
            scale_shape(rows, cols, Direction::Rowwise),
            scale_shape(rows, cols, Direction::Colwise),
        );
        let mut out = [
            vec![0xEEu8; n],
            vec![0xEE; rs.0 * rs.1],
            vec![0xEE; n],
            vec![0xEE; cs.0 * cs.1],
        ];
        let [rd, rsc, cd, csc] = &mut out;
        let q = |data, scales| QuantizedMut { data, scales };
        let mut row = Target::new(q(rd, rsc), rows, cols, Direction::Rowwise, layout);
        let mut col = Target::new(q(cd, csc), rows, cols, Direction::Colwise, layout);
        let (row, col) = (Some(&mut row), Some(&mut col));
        match variant {
            Variant::Portable => quantize_impl(x, rows, cols, row, col),
            // SAFETY: `variants` lists these only when the CPU supports them.
            #[cfg(target_arch = "x86_64")]
            Variant::Avx2 => unsafe { quantize_avx2(x, rows, cols, row, col) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Variant::Avx512 => unsafe { quantize_avx512(x, rows, cols, row, col) },
        }
        out
    }

    /// bf16 test data: mostly normal values spread over 2^±10, with NaN, ±∞, ±0, subnormals and
    /// runs of tiny values (scales below the fast-path threshold) mixed in.
    fn data(n: usize, seed: u64) -> Vec<u16> {
        let mut rng = SplitMix64::new(seed);
        (0..n)
            .map(|i| {
                let r = rng.next_u64();
                let sign = (r >> 63) as u16 * 0x8000;
                let mant = (r >> 20) as u16 & 0x7F;
                if (i / 4096) % 5 == 4 {
                    return sign | ((r % 12) as u16) << 7 | mant;
                }
                match r % 97 {
                    0 => 0x7FC0 | sign,
                    1 => 0x7F80 | sign,
                    2 => sign,
                    3 => sign | mant,
                    _ => sign | ((117 + (r >> 40) % 21) as u16) << 7 | mant,
                }
            })
            .collect()
    }

    #[test]
    fn every_instruction_set_variant_gives_identical_bytes() {
        let variants = variants();
        for (rows, cols) in [(1, 5), (33, 70), (64, 1024), (35, 2080), (40, 4096 + 33)] {
            let bits = data(rows * cols, (rows * 131 + cols) as u64);
            let values: Vec<f32> = bits.iter().map(|&b| f32::from_bits(u32::from(b) << 16)).collect();
            for layout in [ScaleLayout::Compact, ScaleLayout::Swizzled] {
                let want = run(Variant::Portable, &bits, rows, cols, layout);
                assert_eq!(
                    want,
                    run(Variant::Portable, &values, rows, cols, layout),
                    "f32 {rows}x{cols}"
                );
                for &v in &variants[1..] {
                    assert_eq!(
                        want,
                        run(v, &bits, rows, cols, layout),
                        "{v:?} bf16 {rows}x{cols} {layout:?}"
                    );
                    assert_eq!(
                        want,
                        run(v, &values, rows, cols, layout),
                        "{v:?} f32 {rows}x{cols} {layout:?}"
                    );
                }
            }
        }
    }
}

//! Host MXFP8 quantization, rowwise and columnwise, fused into one pass over the input.
//!
//! The input is walked in strips of 32 rows (one columnwise block row) and, inside a strip,
//! in chunks of [`CHUNK_COLS`] columns. For each 32 × `CHUNK_COLS` piece, one pass takes the
//! rowwise and columnwise amaxes from the same loads, the scale bytes of all its blocks are
//! computed together, and a second pass, with the piece still in L2, encodes both copies
//! (sharing the scale-independent half of the fast encoding, see `fast.rs`). The inner loops
//! run over whole rows of the piece, branch-free, so that they vectorize; on x86-64 the loop
//! nest is also compiled for AVX2 and AVX-512 and picked at run time.

use super::fast::{Element, FAST_MIN_SCALE, FastScale};
use super::scalar::{BLOCK_SIZE, e8m0_from_amax, f32_to_e4m3, scale_inv};
use super::{Direction, Input, QuantizedMut, ScaleLayout, ScaleMap, check_len, element_count, scale_shape};
use crate::error::Result;

/// Columns per chunk of a strip: 32 rows × 2048 bf16 = 128 KiB (256 KiB for f32) stays in L2
/// between the two passes, and each row is read as one run the prefetcher can follow.
const CHUNK_COLS: usize = 2048;

/// Rowwise blocks per chunk (all 32 rows).
const CHUNK_ROW_BLOCKS: usize = CHUNK_COLS;

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
}

impl<'a> Target<'a> {
    fn new(q: QuantizedMut<'a>, rows: usize, cols: usize, direction: Direction, layout: ScaleLayout) -> Self {
        // The quantization loop never visits padding bytes; they stay 0x00.
        q.scales.fill(0);
        Target {
            data: q.data,
            scales: q.scales,
            map: ScaleMap::new(rows, cols, direction, layout),
        }
    }
}

/// The amax key of `x`, ignoring NaN (MXFP8.md §7).
#[inline(always)]
fn nan_free_key<E: Element>(x: E) -> E::Key {
    let k = x.raw_key();
    if k > E::NON_FINITE { E::Key::default() } else { k }
}

/// The maximum NaN-free key of `xs`: the block amax of MXFP8.md §7.
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

/// Fast-path constants, one entry per block or per column, as separate arrays so that the
/// loops over them vectorize.
struct Lanes<L> {
    drop: Vec<L>,
    shift_offset: Vec<L>,
}

impl<L: Copy + Default> Lanes<L> {
    fn new(n: usize) -> Self {
        Lanes {
            drop: vec![L::default(); n],
            shift_offset: vec![L::default(); n],
        }
    }

    #[inline(always)]
    fn get(&self, i: usize) -> FastScale<L> {
        FastScale {
            drop: self.drop[i],
            shift_offset: self.shift_offset[i],
        }
    }
}

/// Fills `b` and `fast` with the scale bytes and fast-path constants of a run of blocks whose
/// raw amax keys (NaN not filtered out) are `raw`, and returns whether every block takes the
/// fast path. `nan_free(i)` recomputes the amax of block `i` without NaN; it is called only
/// for blocks holding a NaN or ±∞.
#[inline(always)]
fn scale_bytes<E: Element>(
    raw: &[E::Key],
    b: &mut [u8],
    fast: &mut Lanes<E::Lane>,
    nan_free: impl Fn(usize) -> E::Key,
) -> bool {
    let n = raw.len();
    let (b, drop, shift) = (&mut b[..n], &mut fast.drop[..n], &mut fast.shift_offset[..n]);
    let mut all_fast = true;
    for i in 0..n {
        b[i] = e8m0_from_amax(E::key_to_f32(raw[i]));
        let s = E::fast_scale(b[i]);
        drop[i] = s.drop;
        shift[i] = s.shift_offset;
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

/// The amax pass over one row of a piece: the raw maximum of each rowwise block into
/// `row_raw` (when `ROW`) and the running columnwise maxima in `col_raw` (when `COL`).
/// Blocks are reduced 32 at a time by [`block_maxima`].
#[inline(always)]
fn amax_row<E: Element, const ROW: bool, const COL: bool>(src: &[E], row_raw: &mut [E::Key], col_raw: &mut [E::Key]) {
    let (groups, tail) = src.as_chunks::<BLOCK_SIZE>();
    let (accs, acc_tail) = col_raw[..src.len()].as_chunks_mut::<BLOCK_SIZE>();
    let (units, rest) = groups.as_chunks::<BLOCK_SIZE>();
    let (acc_units, acc_rest) = accs.as_chunks_mut::<BLOCK_SIZE>();
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
    let blocks = rest
        .iter()
        .map(|g| g.as_slice())
        .chain((!tail.is_empty()).then_some(tail));
    let accs = acc_rest.iter_mut().map(|a| a.as_mut_slice()).chain(Some(acc_tail));
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

/// The fast-path constants of a group's lanes: one pair for the whole group (a rowwise block)
/// or one per lane (columns).
trait GroupScale<L>: Copy {
    fn at(self, j: usize) -> FastScale<L>;
}

impl<L: Copy> GroupScale<L> for FastScale<L> {
    #[inline(always)]
    fn at(self, _: usize) -> FastScale<L> {
        self
    }
}

impl<L: Copy> GroupScale<L> for (&[L; GROUP], &[L; GROUP]) {
    #[inline(always)]
    fn at(self, j: usize) -> FastScale<L> {
        FastScale {
            drop: self.0[j],
            shift_offset: self.1[j],
        }
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

/// The per-column constants of a row of a piece, in groups.
#[inline(always)]
fn column_groups<L>(lanes: &Lanes<L>, n: usize) -> impl Iterator<Item = (&[L; GROUP], &[L; GROUP])> {
    let drop = lanes.drop[..n].as_chunks::<GROUP>().0;
    let shift = lanes.shift_offset[..n].as_chunks::<GROUP>().0;
    drop.iter().zip(shift)
}

/// The per-block constants of one row's rowwise blocks.
#[inline(always)]
fn block_scales<L: Copy + Default>(
    lanes: &Lanes<L>,
    blocks: usize,
    first: usize,
) -> impl Iterator<Item = FastScale<L>> {
    (first..first + blocks).map(|j| lanes.get(j))
}

/// Encodes one row of a piece into both copies on the fast path: rowwise with the row's
/// per-block constants starting at entry `first_block` of `row`, columnwise with per-column
/// constants.
#[inline(always)]
fn encode_both_fast<E: Element>(
    src: &[E],
    (row, first_block): (&Lanes<E::Lane>, usize),
    col: &Lanes<E::Lane>,
    row_dst: &mut [u8],
    col_dst: &mut [u8],
) {
    let n = src.len();
    let (xs, x_tail) = src.as_chunks::<GROUP>();
    let ng = xs.len();
    // Equal lengths everywhere, so that the loop below needs no bounds checks.
    let rds = &mut row_dst[..n].as_chunks_mut::<GROUP>().0[..ng];
    let cds = &mut col_dst[..n].as_chunks_mut::<GROUP>().0[..ng];
    let (rdrop, rshift) = (&row.drop[first_block..][..ng], &row.shift_offset[first_block..][..ng]);
    let (cdrop, cshift) = (
        &col.drop[..n].as_chunks::<GROUP>().0[..ng],
        &col.shift_offset[..n].as_chunks::<GROUP>().0[..ng],
    );
    for g in 0..ng {
        let rs = FastScale {
            drop: rdrop[g],
            shift_offset: rshift[g],
        };
        let cs = (&cdrop[g], &cshift[g]);
        let (need_row, need_col) = encode_group::<E, _, _>(&xs[g], (rs, &mut rds[g]), Some((cs, &mut cds[g])));
        if need_row {
            encode_group_full::<E, _>(&xs[g], rs, &mut rds[g]);
        }
        if need_col {
            encode_group_full::<E, _>(&xs[g], cs, &mut cds[g]);
        }
    }
    if !x_tail.is_empty() {
        let start = n - x_tail.len();
        let rs = row.get(first_block + ng);
        for (j, &v) in x_tail.iter().enumerate() {
            let p = v.prepare();
            row_dst[start + j] = E::finish(p, rs);
            col_dst[start + j] = E::finish(p, col.get(start + j));
        }
    }
}

/// Encodes one row of a piece into the rowwise copy on the fast path (all its blocks fast).
#[inline(always)]
fn encode_rows_fast<E: Element>(src: &[E], (row, first_block): (&Lanes<E::Lane>, usize), dst: &mut [u8]) {
    let n = src.len();
    let (xs, x_tail) = src.as_chunks::<GROUP>();
    let (ds, d_tail) = dst[..n].as_chunks_mut::<GROUP>();
    for ((x, d), rs) in xs
        .iter()
        .zip(ds.iter_mut())
        .zip(block_scales(row, xs.len(), first_block))
    {
        if encode_group::<E, _, FastScale<E::Lane>>(x, (rs, d), None).0 {
            encode_group_full::<E, _>(x, rs, d);
        }
    }
    if !x_tail.is_empty() {
        let rs = row.get(first_block + xs.len());
        for (&v, d) in x_tail.iter().zip(d_tail) {
            *d = E::finish(v.prepare(), rs);
        }
    }
}

/// Encodes one row of a piece into the columnwise copy on the fast path.
#[inline(always)]
fn encode_cols_fast<E: Element>(src: &[E], col: &Lanes<E::Lane>, dst: &mut [u8]) {
    let n = src.len();
    let (xs, x_tail) = src.as_chunks::<GROUP>();
    let (ds, d_tail) = dst[..n].as_chunks_mut::<GROUP>();
    for ((x, d), cs) in xs.iter().zip(ds.iter_mut()).zip(column_groups(col, n)) {
        if encode_group::<E, _, FastScale<E::Lane>>(x, (cs, d), None).0 {
            encode_group_full::<E, _>(x, cs, d);
        }
    }
    let start = n - x_tail.len();
    for (j, (&v, d)) in x_tail.iter().zip(d_tail).enumerate() {
        *d = E::finish(v.prepare(), col.get(start + j));
    }
}

/// Per-call scratch. Rowwise block entries are dense, `nb` blocks per row of the strip.
struct Scratch<E: Element> {
    row_raw: Vec<E::Key>,
    row_b: Vec<u8>,
    row_fast: Lanes<E::Lane>,
    col_raw: Vec<E::Key>,
    col_b: Vec<u8>,
    col_fast: Lanes<E::Lane>,
    col_scale_inv: Vec<f32>,
}

impl<E: Element> Scratch<E> {
    fn new() -> Self {
        Scratch {
            row_raw: vec![E::Key::default(); CHUNK_ROW_BLOCKS],
            row_b: vec![0; CHUNK_ROW_BLOCKS],
            row_fast: Lanes::new(CHUNK_ROW_BLOCKS),
            col_raw: vec![E::Key::default(); CHUNK_COLS],
            col_b: vec![0; CHUNK_COLS],
            col_fast: Lanes::new(CHUNK_COLS),
            col_scale_inv: vec![0.0; CHUNK_COLS],
        }
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

#[inline(always)]
fn quantize_impl<E: Element>(
    x: &[E],
    rows: usize,
    cols: usize,
    mut rowwise: Option<&mut Target<'_>>,
    mut colwise: Option<&mut Target<'_>>,
) {
    let mut s = Scratch::<E>::new();
    let (want_row, want_col) = (rowwise.is_some(), colwise.is_some());
    for r0 in (0..rows).step_by(BLOCK_SIZE) {
        let nr = BLOCK_SIZE.min(rows - r0);
        for c0 in (0..cols).step_by(CHUNK_COLS) {
            let width = CHUNK_COLS.min(cols - c0);
            let nb = width.div_ceil(BLOCK_SIZE);
            let at = |i: usize| (r0 + i) * cols + c0..(r0 + i) * cols + c0 + width;

            // Pass 1: raw amaxes of both directions from the same loads.
            s.col_raw[..width].fill(E::Key::default());
            for i in 0..nr {
                let (src, row_raw) = (&x[at(i)], &mut s.row_raw[i * nb..(i + 1) * nb]);
                match (want_row, want_col) {
                    (true, true) => amax_row::<E, true, true>(src, row_raw, &mut s.col_raw),
                    (true, false) => amax_row::<E, true, false>(src, row_raw, &mut s.col_raw),
                    _ => amax_row::<E, false, true>(src, row_raw, &mut s.col_raw),
                }
            }

            // Scale bytes.
            let mut row_all_fast = false;
            if let Some(t) = rowwise.as_deref_mut() {
                row_all_fast = scale_bytes::<E>(&s.row_raw[..nr * nb], &mut s.row_b, &mut s.row_fast, |j| {
                    let (i, k) = (j / nb, j % nb);
                    let block = x[at(i)].chunks(BLOCK_SIZE).nth(k).unwrap_or_default();
                    nan_free_max(block.iter().copied())
                });
                for i in 0..nr {
                    for (k, &b) in s.row_b[i * nb..(i + 1) * nb].iter().enumerate() {
                        t.scales[t.map.offset(r0 + i, c0 / BLOCK_SIZE + k)] = b;
                    }
                }
            }
            let mut col_all_fast = false;
            if let Some(t) = colwise.as_deref_mut() {
                col_all_fast = scale_bytes::<E>(&s.col_raw[..width], &mut s.col_b, &mut s.col_fast, |c| {
                    nan_free_max((0..nr).map(|i| x[at(i).start + c]))
                });
                for (c, &b) in s.col_b[..width].iter().enumerate() {
                    t.scales[t.map.offset(r0 / BLOCK_SIZE, c0 + c)] = b;
                }
                if !col_all_fast {
                    for (si, &b) in s.col_scale_inv.iter_mut().zip(&s.col_b[..width]) {
                        *si = scale_inv(b);
                    }
                }
            }

            // Pass 2: encode.
            for i in 0..nr {
                let src = &x[at(i)];
                let row_blocks = (&s.row_fast, i * nb);
                if let (Some(rt), Some(ct), true, true) = (
                    rowwise.as_deref_mut(),
                    colwise.as_deref_mut(),
                    row_all_fast,
                    col_all_fast,
                ) {
                    let (rd, cd) = (&mut rt.data[at(i)], &mut ct.data[at(i)]);
                    encode_both_fast(src, row_blocks, &s.col_fast, rd, cd);
                    continue;
                }
                if let Some(t) = rowwise.as_deref_mut() {
                    let dst = &mut t.data[at(i)];
                    if row_all_fast {
                        encode_rows_fast(src, row_blocks, dst);
                    } else {
                        let blocks = src.chunks(BLOCK_SIZE).zip(dst.chunks_mut(BLOCK_SIZE));
                        for (k, (blk, out)) in blocks.enumerate() {
                            let j = i * nb + k;
                            if is_fast::<E>(s.row_raw[j], s.row_b[j]) {
                                let f = s.row_fast.get(j);
                                for (d, &v) in out.iter_mut().zip(blk) {
                                    *d = E::finish(v.prepare(), f);
                                }
                            } else {
                                let si = scale_inv(s.row_b[j]);
                                for (d, &v) in out.iter_mut().zip(blk) {
                                    *d = encode_exact(v, si);
                                }
                            }
                        }
                    }
                }
                if let Some(t) = colwise.as_deref_mut() {
                    let dst = &mut t.data[at(i)];
                    if col_all_fast {
                        encode_cols_fast(src, &s.col_fast, dst);
                    } else {
                        for ((d, &v), &si) in dst.iter_mut().zip(src).zip(&s.col_scale_inv) {
                            *d = encode_exact(v, si);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let mut state = seed;
        (0..n)
            .map(|i| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let r = state;
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

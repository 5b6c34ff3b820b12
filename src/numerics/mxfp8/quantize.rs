//! Host MXFP8 quantization, rowwise and columnwise, fused into one pass over the input.
//!
//! The input is walked in strips of 32 rows (one columnwise block row) and, inside a strip,
//! in chunks of [`CHUNK_COLS`] columns. For each 32 × `CHUNK_COLS` piece, one pass takes the
//! rowwise and columnwise amaxes, the scale bytes of all its blocks are computed together,
//! and a second pass, with the piece still in L1, encodes both copies. The inner loops are
//! branch-free over contiguous slices so that they vectorize; on x86-64 the whole loop nest
//! is also compiled for AVX2 and AVX-512 and picked at run time.

use super::scalar::{BLOCK_SIZE, bf16_bits_to_f32, e8m0_from_amax, f32_to_e4m3, scale_inv};
use super::{Direction, Input, QuantizedMut, ScaleLayout, ScaleMap, check_len, element_count, scale_shape};
use crate::error::Result;

/// Columns per chunk of a strip: 32 rows × 256 bf16 = 16 KiB (32 KiB for f32) stays in L1.
const CHUNK_COLS: usize = 256;

/// Rowwise blocks per row of a chunk.
const CHUNK_BLOCKS: usize = CHUNK_COLS / BLOCK_SIZE;

/// Blocks with a scale byte at least this large, and no NaN or ±∞, take the fast path
/// ([`Element::encode_fast`]). With `b >= 11` the inverse scale is `2^k` with `k <= 116`, so
/// an input subnormal, or an element whose product underflows f32, lands below `2^-10` and
/// encodes as ±0 either way.
const FAST_MIN_SCALE: u8 = 11;

/// A high-precision element type.
trait Element: Copy {
    /// `|x|` as an integer (sign bit cleared); for non-NaN values, integer order is magnitude
    /// order.
    type Key: Copy + Ord + Default;
    /// The fast path's `k << mantissa_bits` for an inverse scale `2^k`.
    type Step: Copy + Default;
    /// Smallest key of a non-finite value (+∞); larger keys are NaN.
    const NON_FINITE: Self::Key;
    fn raw_key(self) -> Self::Key;
    /// The f32 magnitude a key stands for.
    fn key_to_f32(key: Self::Key) -> f32;
    /// Exact conversion to f32.
    fn to_f32(self) -> f32;
    /// The fast-path step of scale byte `b` (`FAST_MIN_SCALE <= b <= 253`).
    fn step(b: u8) -> Self::Step;
    /// `f32_to_e4m3(x * 2^k)` computed by adding `k` to the exponent field, exact when `x` is
    /// finite, `|x| * 2^k <= 448` and `k <= 116` (the fast-path conditions; checked
    /// exhaustively for bf16 by this module's tests).
    fn encode_fast(self, step: Self::Step) -> u8;
}

/// bf16 bits. The amax is taken on the bf16 values, which equals the amax of the upcast values.
impl Element for u16 {
    type Key = u16;
    type Step = i16;
    const NON_FINITE: u16 = 0x7F80;

    #[inline(always)]
    fn raw_key(self) -> u16 {
        self & 0x7FFF
    }

    #[inline(always)]
    fn key_to_f32(key: u16) -> f32 {
        bf16_bits_to_f32(key)
    }

    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16_bits_to_f32(self)
    }

    #[inline(always)]
    fn step(b: u8) -> i16 {
        (127 - i16::from(b)) << 7
    }

    /// With `t` the bf16 bits of `|x| * 2^k` (negative when the product underflows):
    /// - `t >= 2^-6`: drop 4 mantissa bits with ties to even and rebias (`960 << 4 = 15360`);
    /// - `t < 2^-6`: the significand `M` (8 bits) times `2^(e-117)` has the E4M3 subnormal
    ///   code in its bits 8 and up (`e` in 117..=120); round that at bit 8 with ties to even.
    ///   Smaller exponents give a shift outside `0..16` and the code 0.
    #[inline(always)]
    fn encode_fast(self, step: i16) -> u8 {
        let t = ((self & 0x7FFF) as i16).wrapping_add(step);
        let normal = (t.wrapping_sub(15353) + ((t >> 4) & 1)) >> 4;
        let shift = ((t >> 7) - 117) as u16;
        let m = ((t & 0x7F) | 0x80) as u16;
        let p = if shift < 16 { m << shift } else { 0 };
        let sub = (p.wrapping_add(0x7F) + ((p >> 8) & 1)) >> 8;
        let mag = if t < 0x3C80 { sub as u8 } else { normal as u8 };
        ((self >> 8) as u8 & 0x80) | mag
    }
}

impl Element for f32 {
    type Key = u32;
    type Step = i32;
    const NON_FINITE: u32 = 0x7F80_0000;

    #[inline(always)]
    fn raw_key(self) -> u32 {
        self.to_bits() & 0x7FFF_FFFF
    }

    #[inline(always)]
    fn key_to_f32(key: u32) -> f32 {
        f32::from_bits(key)
    }

    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }

    #[inline(always)]
    fn step(b: u8) -> i32 {
        (127 - i32::from(b)) << 23
    }

    /// As for bf16 with 23 mantissa bits: the significand has 24 bits and the subnormal code
    /// is rounded at bit 24.
    #[inline(always)]
    fn encode_fast(self, step: i32) -> u8 {
        let bits = self.to_bits();
        let t = ((bits & 0x7FFF_FFFF) as i32).wrapping_add(step);
        let normal = (t.wrapping_sub(0x3C00_0000 - 0x7_FFFF) + ((t >> 20) & 1)) >> 20;
        let shift = ((t >> 23) - 117) as u32;
        let m = ((t & 0x7F_FFFF) | 0x80_0000) as u32;
        let p = if shift < 32 { m << shift } else { 0 };
        let sub = (p.wrapping_add(0x7F_FFFF) + ((p >> 24) & 1)) >> 24;
        let mag = if t < 0x3C80_0000 { sub as u8 } else { normal as u8 };
        ((bits >> 24) as u8 & 0x80) | mag
    }
}

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

/// The maximum raw key of `xs` (NaN not filtered out).
#[inline(always)]
fn raw_max<E: Element>(xs: &[E]) -> E::Key {
    xs.iter()
        .map(|v| v.raw_key())
        .fold(E::Key::default(), Ord::max)
}

/// The maximum NaN-free key of `xs`: the block amax of MXFP8.md §7.
fn nan_free_max<E: Element>(xs: impl Iterator<Item = E>) -> E::Key {
    xs.map(nan_free_key).fold(E::Key::default(), Ord::max)
}

/// Whether a block with raw amax key `raw` and scale byte `b` takes the fast path.
#[inline(always)]
fn is_fast<E: Element>(raw: E::Key, b: u8) -> bool {
    raw < E::NON_FINITE && b >= FAST_MIN_SCALE
}

/// Fills `b` and `step` with the scale bytes and fast-path steps of a run of blocks whose raw
/// amax keys are `raw`, and returns whether every block takes the fast path. `nan_free(i)`
/// recomputes the amax of block `i` without NaN; it is called only for blocks holding a NaN
/// or ±∞.
#[inline(always)]
fn scale_bytes<E: Element>(
    raw: &[E::Key],
    b: &mut [u8],
    step: &mut [E::Step],
    nan_free: impl Fn(usize) -> E::Key,
) -> bool {
    let mut all_fast = true;
    for ((b, step), &k) in b.iter_mut().zip(step.iter_mut()).zip(raw) {
        *b = e8m0_from_amax(E::key_to_f32(k));
        *step = E::step(*b);
        all_fast &= is_fast::<E>(k, *b);
    }
    if !all_fast {
        for (i, (b, &k)) in b.iter_mut().zip(raw).enumerate() {
            if k >= E::NON_FINITE {
                *b = e8m0_from_amax(E::key_to_f32(nan_free(i)));
            }
        }
    }
    all_fast
}

/// `f32_to_e4m3(v * s)`: the exact path, for blocks that do not qualify for the fast one.
#[inline(always)]
fn encode_exact<E: Element>(v: E, s: f32) -> u8 {
    f32_to_e4m3(v.to_f32() * s)
}

/// Encodes one rowwise block with scale byte `b` and raw amax key `raw`.
#[inline(always)]
fn encode_row_block<E: Element>(src: &[E], raw: E::Key, b: u8, dst: &mut [u8]) {
    if is_fast::<E>(raw, b) {
        let step = E::step(b);
        for (d, &v) in dst.iter_mut().zip(src) {
            *d = v.encode_fast(step);
        }
    } else {
        let s = scale_inv(b);
        for (d, &v) in dst.iter_mut().zip(src) {
            *d = encode_exact(v, s);
        }
    }
}

/// Encodes one block of a row into both copies, all on the fast path: rowwise with `row_step`,
/// columnwise with the per-column `col_step`.
#[inline(always)]
fn encode_both_fast<E: Element>(
    src: &[E],
    row_step: E::Step,
    col_step: &[E::Step],
    row_dst: &mut [u8],
    col_dst: &mut [u8],
) {
    for (((&v, rd), cd), &cs) in src.iter().zip(row_dst).zip(col_dst).zip(col_step) {
        *rd = v.encode_fast(row_step);
        *cd = v.encode_fast(cs);
    }
}

/// Per-chunk scratch: rowwise parameters of the strip's `32 × CHUNK_BLOCKS` blocks (dense,
/// `nb` per row) and columnwise parameters of its columns.
struct Scratch<E: Element> {
    row_raw: [E::Key; BLOCK_SIZE * CHUNK_BLOCKS],
    row_b: [u8; BLOCK_SIZE * CHUNK_BLOCKS],
    row_step: [E::Step; BLOCK_SIZE * CHUNK_BLOCKS],
    col_raw: [E::Key; CHUNK_COLS],
    col_b: [u8; CHUNK_COLS],
    col_step: [E::Step; CHUNK_COLS],
    col_scale_inv: [f32; CHUNK_COLS],
}

impl<E: Element> Scratch<E> {
    fn new() -> Self {
        Scratch {
            row_raw: [E::Key::default(); BLOCK_SIZE * CHUNK_BLOCKS],
            row_b: [0; BLOCK_SIZE * CHUNK_BLOCKS],
            row_step: [E::Step::default(); BLOCK_SIZE * CHUNK_BLOCKS],
            col_raw: [E::Key::default(); CHUNK_COLS],
            col_b: [0; CHUNK_COLS],
            col_step: [E::Step::default(); CHUNK_COLS],
            col_scale_inv: [0.0; CHUNK_COLS],
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
        if std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
        {
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
    for r0 in (0..rows).step_by(BLOCK_SIZE) {
        let nr = BLOCK_SIZE.min(rows - r0);
        let rb = r0 / BLOCK_SIZE;
        for c0 in (0..cols).step_by(CHUNK_COLS) {
            let width = CHUNK_COLS.min(cols - c0);
            let nb = width.div_ceil(BLOCK_SIZE);
            let cb0 = c0 / BLOCK_SIZE;
            let at = |i: usize| (r0 + i) * cols + c0..(r0 + i) * cols + c0 + width;

            // Pass 1: amaxes and scale bytes.
            let mut row_all_fast = false;
            if let Some(t) = rowwise.as_deref_mut() {
                for i in 0..nr {
                    let raw = &mut s.row_raw[i * nb..(i + 1) * nb];
                    for (raw, block) in raw.iter_mut().zip(x[at(i)].chunks(BLOCK_SIZE)) {
                        *raw = raw_max(block);
                    }
                }
                row_all_fast = scale_bytes::<E>(
                    &s.row_raw[..nr * nb],
                    &mut s.row_b[..nr * nb],
                    &mut s.row_step[..nr * nb],
                    |j| {
                        let block = x[at(j / nb)].chunks(BLOCK_SIZE).nth(j % nb);
                        nan_free_max(block.unwrap_or_default().iter().copied())
                    },
                );
                for i in 0..nr {
                    for (k, &b) in s.row_b[i * nb..(i + 1) * nb].iter().enumerate() {
                        t.scales[t.map.offset(r0 + i, cb0 + k)] = b;
                    }
                }
            }
            let mut col_all_fast = false;
            if let Some(t) = colwise.as_deref_mut() {
                let raw = &mut s.col_raw[..width];
                raw.fill(E::Key::default());
                for i in 0..nr {
                    for (k, v) in raw.iter_mut().zip(&x[at(i)]) {
                        *k = (*k).max(v.raw_key());
                    }
                }
                col_all_fast = scale_bytes::<E>(
                    &s.col_raw[..width],
                    &mut s.col_b[..width],
                    &mut s.col_step[..width],
                    |c| nan_free_max((0..nr).map(|i| x[at(i).start + c])),
                );
                for (c, &b) in s.col_b[..width].iter().enumerate() {
                    t.scales[t.map.offset(rb, c0 + c)] = b;
                }
                if !col_all_fast {
                    for (si, &b) in s.col_scale_inv.iter_mut().zip(&s.col_b[..width]) {
                        *si = scale_inv(b);
                    }
                }
            }

            // Pass 2: encode.
            if let (Some(rt), Some(ct), true, true) = (
                rowwise.as_deref_mut(),
                colwise.as_deref_mut(),
                row_all_fast,
                col_all_fast,
            ) {
                for i in 0..nr {
                    let src = &x[at(i)];
                    let row_dst = &mut rt.data[at(i)];
                    let col_dst = &mut ct.data[at(i)];
                    for ((((blk, rd), cd), cs), &rs) in src
                        .chunks(BLOCK_SIZE)
                        .zip(row_dst.chunks_mut(BLOCK_SIZE))
                        .zip(col_dst.chunks_mut(BLOCK_SIZE))
                        .zip(s.col_step.chunks(BLOCK_SIZE))
                        .zip(&s.row_step[i * nb..(i + 1) * nb])
                    {
                        encode_both_fast(blk, rs, cs, rd, cd);
                    }
                }
                continue;
            }
            if let Some(t) = rowwise.as_deref_mut() {
                for i in 0..nr {
                    let params = s.row_raw[i * nb..].iter().zip(&s.row_b[i * nb..]);
                    for ((blk, out), (&raw, &b)) in x[at(i)]
                        .chunks(BLOCK_SIZE)
                        .zip(t.data[at(i)].chunks_mut(BLOCK_SIZE))
                        .zip(params)
                    {
                        encode_row_block(blk, raw, b, out);
                    }
                }
            }
            if let Some(t) = colwise.as_deref_mut() {
                for i in 0..nr {
                    let src = &x[at(i)];
                    let dst = &mut t.data[at(i)];
                    if col_all_fast {
                        for ((d, &v), &step) in dst.iter_mut().zip(src).zip(&s.col_step) {
                            *d = v.encode_fast(step);
                        }
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

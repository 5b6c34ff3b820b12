//! Host MXFP8 quantization, rowwise and columnwise, fused into one pass over the input.
//!
//! The input is walked in strips of 32 rows (one columnwise block row) and, inside a strip,
//! in chunks of [`CHUNK_COLS`] columns, so that the 32 × `CHUNK_COLS` piece read for the
//! rowwise blocks is still in L1 when the columnwise pass reads it again. The inner loops are
//! branch-free over contiguous slices and vectorize.

use super::scalar::{BLOCK_SIZE, bf16_bits_to_f32, e8m0_from_amax, f32_to_e4m3, scale_inv};
use super::{Direction, Input, QuantizedMut, ScaleLayout, ScaleMap, check_len, element_count, scale_shape};
use crate::error::Result;

/// Columns per chunk of a strip: 32 rows × 256 bf16 = 16 KiB (32 KiB for f32) stays in L1.
const CHUNK_COLS: usize = 256;

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

    #[inline]
    fn raw_key(self) -> u16 {
        self & 0x7FFF
    }

    #[inline]
    fn key_to_f32(key: u16) -> f32 {
        bf16_bits_to_f32(key)
    }

    #[inline]
    fn to_f32(self) -> f32 {
        bf16_bits_to_f32(self)
    }

    #[inline]
    fn step(b: u8) -> i16 {
        (127 - i16::from(b)) << 7
    }

    /// With `t` the bf16 bits of `|x| * 2^k` (negative when the product underflows):
    /// - `t >= 2^-6`: drop 4 mantissa bits with ties to even and rebias (`960 << 4 = 15360`);
    /// - `t < 2^-6`: the significand `M` (8 bits) times `2^(e-117)` has the E4M3 subnormal
    ///   code in its bits 8 and up (`e` in 117..=120); round that at bit 8 with ties to even.
    ///   Smaller exponents give a shift outside `0..16` and the code 0.
    #[inline]
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

    #[inline]
    fn raw_key(self) -> u32 {
        self.to_bits() & 0x7FFF_FFFF
    }

    #[inline]
    fn key_to_f32(key: u32) -> f32 {
        f32::from_bits(key)
    }

    #[inline]
    fn to_f32(self) -> f32 {
        self
    }

    #[inline]
    fn step(b: u8) -> i32 {
        (127 - i32::from(b)) << 23
    }

    /// As for bf16 with 23 mantissa bits: the significand has 24 bits and the subnormal code
    /// is rounded at bit 24.
    #[inline]
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
        Input::Bf16(x) => quantize_impl(x, rows, cols, rowwise.as_mut(), colwise.as_mut()),
        Input::F32(x) => quantize_impl(x, rows, cols, rowwise.as_mut(), colwise.as_mut()),
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
#[inline]
fn nan_free_key<E: Element>(x: E) -> E::Key {
    let k = x.raw_key();
    if k > E::NON_FINITE { E::Key::default() } else { k }
}

/// The maximum raw key of `xs` (NaN not filtered).
#[inline]
fn raw_max<E: Element>(xs: &[E]) -> E::Key {
    xs.iter()
        .map(|v| v.raw_key())
        .fold(E::Key::default(), Ord::max)
}

/// Fills `b` with the scale bytes of a run of blocks whose raw amax keys are `raw`, and
/// `fast` with whether each block takes the fast path; returns whether all do. `nan_free(i)`
/// recomputes the amax of block `i` without NaN and is called only for blocks holding a NaN
/// or ±∞.
#[inline]
fn scale_bytes<E: Element>(
    raw: &[E::Key],
    b: &mut [u8],
    fast: &mut [bool],
    nan_free: impl Fn(usize) -> E::Key,
) -> bool {
    for (b, &k) in b.iter_mut().zip(raw) {
        *b = e8m0_from_amax(E::key_to_f32(k));
    }
    let mut all_fast = true;
    for ((f, &k), &b) in fast.iter_mut().zip(raw).zip(b.iter()) {
        *f = k < E::NON_FINITE && b >= FAST_MIN_SCALE;
        all_fast &= *f;
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

/// Encodes `src` with the scale byte `b`: the fast path when `fast`, else the exact f32
/// multiply and [`f32_to_e4m3`].
#[inline]
fn encode_uniform<E: Element>(src: &[E], b: u8, fast: bool, dst: &mut [u8]) {
    if fast {
        let step = E::step(b);
        for (d, &v) in dst.iter_mut().zip(src) {
            *d = v.encode_fast(step);
        }
    } else {
        let s = scale_inv(b);
        for (d, &v) in dst.iter_mut().zip(src) {
            *d = f32_to_e4m3(v.to_f32() * s);
        }
    }
}

/// Rowwise blocks per chunk.
const CHUNK_BLOCKS: usize = CHUNK_COLS / BLOCK_SIZE;

/// Scratch space for one chunk: per-block rowwise and per-column columnwise parameters.
struct Scratch<E: Element> {
    row_raw: [E::Key; CHUNK_BLOCKS],
    row_b: [u8; CHUNK_BLOCKS],
    row_fast: [bool; CHUNK_BLOCKS],
    col_raw: [E::Key; CHUNK_COLS],
    col_b: [u8; CHUNK_COLS],
    col_fast: [bool; CHUNK_COLS],
    col_step: [E::Step; CHUNK_COLS],
    col_scale_inv: [f32; CHUNK_COLS],
}

fn quantize_impl<E: Element>(
    x: &[E],
    rows: usize,
    cols: usize,
    mut rowwise: Option<&mut Target<'_>>,
    mut colwise: Option<&mut Target<'_>>,
) {
    let mut s = Scratch::<E> {
        row_raw: [E::Key::default(); CHUNK_BLOCKS],
        row_b: [0; CHUNK_BLOCKS],
        row_fast: [false; CHUNK_BLOCKS],
        col_raw: [E::Key::default(); CHUNK_COLS],
        col_b: [0; CHUNK_COLS],
        col_fast: [false; CHUNK_COLS],
        col_step: [E::Step::default(); CHUNK_COLS],
        col_scale_inv: [0.0; CHUNK_COLS],
    };
    for r0 in (0..rows).step_by(BLOCK_SIZE) {
        let strip = r0..(r0 + BLOCK_SIZE).min(rows);
        for c0 in (0..cols).step_by(CHUNK_COLS) {
            let width = CHUNK_COLS.min(cols - c0);
            let piece = |r: usize| r * cols + c0..r * cols + c0 + width;
            if let Some(t) = rowwise.as_deref_mut() {
                let nb = width.div_ceil(BLOCK_SIZE);
                for r in strip.clone() {
                    let src = &x[piece(r)];
                    for (raw, block) in s.row_raw.iter_mut().zip(src.chunks(BLOCK_SIZE)) {
                        *raw = raw_max(block);
                    }
                    let all_fast = scale_bytes::<E>(
                        &s.row_raw[..nb],
                        &mut s.row_b[..nb],
                        &mut s.row_fast[..nb],
                        |k| {
                            src[k * BLOCK_SIZE..]
                                .iter()
                                .take(BLOCK_SIZE)
                                .map(|&v| nan_free_key(v))
                                .fold(E::Key::default(), Ord::max)
                        },
                    );
                    let cb0 = c0 / BLOCK_SIZE;
                    for (k, &b) in s.row_b[..nb].iter().enumerate() {
                        t.scales[t.map.offset(r, cb0 + k)] = b;
                    }
                    let dst = &mut t.data[piece(r)];
                    for ((block, out), (&b, &fast)) in src
                        .chunks(BLOCK_SIZE)
                        .zip(dst.chunks_mut(BLOCK_SIZE))
                        .zip(s.row_b.iter().zip(&s.row_fast))
                    {
                        encode_uniform(block, b, all_fast || fast, out);
                    }
                }
            }
            if let Some(t) = colwise.as_deref_mut() {
                let raw = &mut s.col_raw[..width];
                raw.fill(E::Key::default());
                for r in strip.clone() {
                    for (k, v) in raw.iter_mut().zip(&x[piece(r)]) {
                        *k = (*k).max(v.raw_key());
                    }
                }
                let all_fast = scale_bytes::<E>(
                    &s.col_raw[..width],
                    &mut s.col_b[..width],
                    &mut s.col_fast[..width],
                    |c| {
                        strip
                            .clone()
                            .map(|r| nan_free_key(x[r * cols + c0 + c]))
                            .fold(E::Key::default(), Ord::max)
                    },
                );
                let rb = r0 / BLOCK_SIZE;
                for (c, &b) in s.col_b[..width].iter().enumerate() {
                    t.scales[t.map.offset(rb, c0 + c)] = b;
                }
                if all_fast {
                    for (step, &b) in s.col_step.iter_mut().zip(&s.col_b[..width]) {
                        *step = E::step(b);
                    }
                    for r in strip.clone() {
                        let dst = &mut t.data[piece(r)];
                        for ((d, &v), &step) in dst.iter_mut().zip(&x[piece(r)]).zip(&s.col_step) {
                            *d = v.encode_fast(step);
                        }
                    }
                } else {
                    for (si, &b) in s.col_scale_inv.iter_mut().zip(&s.col_b[..width]) {
                        *si = scale_inv(b);
                    }
                    for r in strip.clone() {
                        let dst = &mut t.data[piece(r)];
                        for ((d, &v), &si) in
                            dst.iter_mut().zip(&x[piece(r)]).zip(&s.col_scale_inv)
                        {
                            *d = f32_to_e4m3(v.to_f32() * si);
                        }
                    }
                }
            }
        }
    }
}

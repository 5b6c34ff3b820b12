//! MXFP8 quantization (E4M3 elements, one E8M0 scale per 32 elements), bit-compatible with
//! NVIDIA TransformerEngine's MXFP8 cast kernels. The specification is `docs/mxfp8.md`; section
//! numbers below refer to it. This is the host reference and the host backend; the CUDA kernel
//! `kernels/mxfp8_quantize.cu` uses the same numerics from `kernels/mxfp8.cuh`.
//!
//! - Scale of a block: `float_to_e8m0(amax * (1/448))` with NaN ignored in the amax and a
//!   round-up to a power of two (§1), so finite elements never saturate.
//! - Elements: `x * 2^(127-b)` in f32, then E4M3 round-to-nearest-even with saturation (§2, §6).
//!   −0 encodes as `0x80` (TE's generic kernel), NaN as [`E4M3_NAN`].
//! - Rowwise blocks are 1×32 along a row, columnwise blocks 32×1 along a column. Both data
//!   copies are `[rows, cols]` row-major like the input (the columnwise copy is not
//!   transposed). Partial blocks at the right or bottom edge are allowed: their missing
//!   elements count as 0 in the amax (§3).
//! - Scales are written in TE's padded shapes ([`scale_shape`]), either compact (row-major) or
//!   swizzled for cuBLAS ([`ScaleLayout`]). Every padding byte is written as `0x00`: TE does the
//!   same for swizzled scales and leaves compact padding uninitialised (`torch.empty`, §3
//!   "Padding contents"), so consumers must not rely on compact padding anyway.
//! - N-D tensors are passed flattened: `rows = prod(shape[..-1])`, `cols = shape[-1]` (§3).
//!
//! The host quantizer produces both copies in one pass over the input, in strips of 32 rows,
//! with integer arithmetic equivalent to the f32 path for ordinary blocks (see the
//! `quantize` and `fast` submodules); `benches/mxfp8.rs` measures it against memcpy.

mod amax;
mod dequantize;
mod encode;
mod fast;
mod pass;
mod quantize;
mod scalar;
mod stream;

pub use dequantize::{dequantize_colwise, dequantize_rowwise};
pub use quantize::{quantize, quantize_both, quantize_colwise, quantize_rowwise};
pub use scalar::{
    BLOCK_SIZE, E4M3_MAX, E4M3_NAN, MAX_NORM, MAX_NORM_RCP, e4m3_to_f32, e8m0_from_amax, f32_to_e4m3, float_to_e8m0,
    scale, scale_inv, swizzled_scale_index,
};

/// Byte order of a scale tensor (docs/mxfp8.md §3, "Compact or swizzled").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScaleLayout {
    /// Row-major in the padded [`scale_shape`]: TE's default (`optimize_for_gemm = False`),
    /// the form that can be all-gathered.
    Compact,
    /// The cuBLAS / tcgen05 order of [`swizzled_scale_index`], same byte size as compact
    /// (TE's `with_gemm_swizzled_scales`).
    Swizzled,
}

/// Which of the two MXFP8 copies a scale tensor belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// 1×32 blocks along each row; scale `(r, cb)` covers `x[r][32cb .. 32cb+32]`.
    Rowwise,
    /// 32×1 blocks along each column; scale `(rb, c)` covers `x[32rb .. 32rb+32][c]`.
    Colwise,
}

/// A high-precision `[rows, cols]` row-major input.
#[derive(Debug, Clone, Copy)]
pub enum Input<'a> {
    /// bf16 values as their raw bits.
    Bf16(&'a [u16]),
    /// f32 values.
    F32(&'a [f32]),
}

impl Input<'_> {
    fn len(&self) -> usize {
        match self {
            Input::Bf16(x) => x.len(),
            Input::F32(x) => x.len(),
        }
    }
}

/// A dequantization destination, `[rows, cols]` row-major.
#[derive(Debug)]
pub enum Output<'a> {
    /// bf16 bits, rounded to nearest even from the f32 product (docs/mxfp8.md §4).
    Bf16(&'a mut [u16]),
    /// f32 values (the product is exact in f32, except for overflow to ±∞).
    F32(&'a mut [f32]),
}

/// Caller-provided storage for one MXFP8 copy: `data` holds `rows * cols` E4M3 codes
/// (row-major) and `scales` the E8M0 bytes, `scale_shape(..).0 * scale_shape(..).1` of them.
#[derive(Debug)]
pub struct QuantizedMut<'a> {
    /// E4M3 codes, `[rows, cols]` row-major.
    pub data: &'a mut [u8],
    /// E8M0 scale bytes in the padded [`scale_shape`] and the chosen [`ScaleLayout`].
    pub scales: &'a mut [u8],
}

/// The padded 2-D shape of a scale tensor, as TE allocates it
/// (`MXFP8Quantizer::get_scale_shape`, alignment constants in `common/common.h`; docs/mxfp8.md §3):
///
/// - rowwise: `[roundup(rows, 128), roundup(ceil(cols/32), 4)]`,
/// - columnwise: `[roundup(ceil(rows/32), 4), roundup(cols, 128)]`.
///
/// The swizzled layout has the same byte size. An empty tensor has an empty scale tensor.
pub fn scale_shape(rows: usize, cols: usize, direction: Direction) -> (usize, usize) {
    match direction {
        Direction::Rowwise => (
            rows.next_multiple_of(128),
            cols.div_ceil(BLOCK_SIZE).next_multiple_of(4),
        ),
        Direction::Colwise => (
            rows.div_ceil(BLOCK_SIZE).next_multiple_of(4),
            cols.next_multiple_of(128),
        ),
    }
}

/// Offset in the scale buffer of the scale with compact coordinates `(r, c)`: `(row, row
/// block)` rowwise, `(row block, column)` columnwise. Compact is `r * stride + c`; swizzled is
/// [`swizzled_scale_index`] with `(i, j) = (r, c)` rowwise and `(c, r)` columnwise (docs/mxfp8.md
/// §3). `(r, c)` may lie in the padding of [`scale_shape`].
pub fn scale_index(rows: usize, cols: usize, direction: Direction, layout: ScaleLayout, r: usize, c: usize) -> usize {
    ScaleMap::new(rows, cols, direction, layout).offset(r, c)
}

/// Precomputed [`scale_index`] for one tensor.
#[derive(Debug, Clone, Copy)]
struct ScaleMap {
    swizzled: bool,
    transposed: bool,
    stride: usize,
    num_tiles_x: usize,
}

impl ScaleMap {
    fn new(rows: usize, cols: usize, direction: Direction, layout: ScaleLayout) -> Self {
        let stride = scale_shape(rows, cols, direction).1;
        let (transposed, num_tiles_x) = match direction {
            Direction::Rowwise => (false, cols.div_ceil(128)),
            Direction::Colwise => (true, rows.div_ceil(128)),
        };
        ScaleMap {
            swizzled: layout == ScaleLayout::Swizzled,
            transposed,
            stride,
            num_tiles_x,
        }
    }

    #[inline]
    fn offset(&self, r: usize, c: usize) -> usize {
        match (self.swizzled, self.transposed) {
            (false, _) => r * self.stride + c,
            (true, false) => swizzled_scale_index(r, c, self.num_tiles_x),
            (true, true) => swizzled_scale_index(c, r, self.num_tiles_x),
        }
    }

    /// Compact rows per band of swizzled tiles: 128 rows rowwise, 4 block rows columnwise.
    /// A band's tiles are complete once all its compact rows are known.
    fn band_rows(&self) -> usize {
        if self.transposed { 4 } else { 128 }
    }

    /// Writes band `band`, given as its compact rows (`band_rows() * stride` bytes), into the
    /// swizzled buffer, 512-byte tile by tile. Within a tile, compact row/column `i` (of 128)
    /// and column/row `j` (of 4) go to `(i % 32) * 16 + (i / 32) * 4 + j`
    /// ([`swizzled_scale_index`]), so the 4 bytes of one `i` are adjacent.
    fn store_band(&self, scales: &mut [u8], band: usize, compact: &[u8]) {
        let at = |i: usize| (i % 32) * 16 + (i / 32) * 4;
        if self.transposed {
            // i = column, j = block row: tile (t, band) holds columns 128t..128t+128.
            for t in 0..self.stride / 128 {
                let tile = &mut scales[(t * self.num_tiles_x + band) * 512..][..512];
                for j in 0..4 {
                    let row = &compact[j * self.stride + 128 * t..][..128];
                    for (i, &b) in row.iter().enumerate() {
                        tile[at(i) + j] = b;
                    }
                }
            }
        } else {
            // i = row, j = block column: tile (band, t) holds block columns 4t..4t+4, which are
            // adjacent in a compact row.
            for t in 0..self.num_tiles_x {
                let tile = &mut scales[(band * self.num_tiles_x + t) * 512..][..512];
                for i in 0..128 {
                    tile[at(i)..at(i) + 4].copy_from_slice(&compact[i * self.stride + 4 * t..][..4]);
                }
            }
        }
    }
}

/// `rows * cols`, or an `InvalidArgument` error when it overflows.
fn element_count(what: &str, rows: usize, cols: usize) -> crate::error::Result<usize> {
    match rows.checked_mul(cols) {
        Some(n) => Ok(n),
        None => crate::bail!(InvalidArgument, "{what}: rows * cols overflows ({rows} x {cols})"),
    }
}

/// Checks that a buffer holds exactly `expected` elements.
fn check_len(what: &str, name: &str, len: usize, expected: usize) -> crate::error::Result<()> {
    if len != expected {
        crate::bail!(
            InvalidArgument,
            "{what}: {name} has {len} elements, expected {expected}"
        );
    }
    Ok(())
}

//! MXFP8 → f32 / bf16, TE's `dequantize_mxfp8.cuh` (docs/mxfp8.md §4):
//! `out = round_to_output(scale(b) * e4m3_to_f32(code))`.
//!
//! The f32 product is exact (an E4M3 value has at most 4 significant bits and `2^-136` is above
//! the f32 subnormal floor) except that it overflows to ±∞ for scale `0xF7` with code `0x78`
//! or larger. bf16 output rounds that product to nearest even, subnormals kept, as CUDA's
//! `static_cast<bf16>(float)` (`__float2bfloat16_rn`) does: products of at most `2^-134` (a tie,
//! to even) become 0, while `5·2^-136 … 7·2^-136` round up to the smallest bf16 subnormal
//! `2^-133`.

use super::scalar::{BLOCK_SIZE, e4m3_to_f32, scale};
use super::{Direction, Output, ScaleLayout, ScaleMap, check_len, element_count, scale_shape};
use crate::error::Result;
use crate::numerics::bf16::f32_to_bf16_rne;

/// Dequantizes a rowwise MXFP8 copy (`rows * cols` codes, scales in the padded
/// `scale_shape(rows, cols, Rowwise)` and `layout`) into `out`.
///
/// # Errors
/// `InvalidArgument` if `rows * cols` overflows or a buffer has the wrong length.
pub fn dequantize_rowwise(
    data: &[u8],
    scales: &[u8],
    rows: usize,
    cols: usize,
    layout: ScaleLayout,
    out: Output<'_>,
) -> Result<()> {
    dequantize(data, scales, rows, cols, Direction::Rowwise, layout, out)
}

/// Dequantizes a columnwise MXFP8 copy (`rows * cols` codes, row-major; scales in the padded
/// `scale_shape(rows, cols, Colwise)` and `layout`) into `out`.
///
/// # Errors
/// `InvalidArgument` if `rows * cols` overflows or a buffer has the wrong length.
pub fn dequantize_colwise(
    data: &[u8],
    scales: &[u8],
    rows: usize,
    cols: usize,
    layout: ScaleLayout,
    out: Output<'_>,
) -> Result<()> {
    dequantize(data, scales, rows, cols, Direction::Colwise, layout, out)
}

fn dequantize(
    data: &[u8],
    scales: &[u8],
    rows: usize,
    cols: usize,
    direction: Direction,
    layout: ScaleLayout,
    out: Output<'_>,
) -> Result<()> {
    const WHAT: &str = "mxfp8 dequantize";
    let n = element_count(WHAT, rows, cols)?;
    let (sr, sc) = scale_shape(rows, cols, direction);
    check_len(WHAT, "data", data.len(), n)?;
    check_len(WHAT, "scales", scales.len(), sr * sc)?;
    let out_len = match &out {
        Output::Bf16(o) => o.len(),
        Output::F32(o) => o.len(),
    };
    check_len(WHAT, "output", out_len, n)?;
    let map = ScaleMap::new(rows, cols, direction, layout);
    let value = |i: usize| {
        let (r, c) = (i / cols, i % cols);
        let at = match direction {
            Direction::Rowwise => map.offset(r, c / BLOCK_SIZE),
            Direction::Colwise => map.offset(r / BLOCK_SIZE, c),
        };
        scale(scales[at]) * e4m3_to_f32(data[i])
    };
    match out {
        Output::F32(o) => o.iter_mut().enumerate().for_each(|(i, y)| *y = value(i)),
        Output::Bf16(o) => o
            .iter_mut()
            .enumerate()
            .for_each(|(i, y)| *y = f32_to_bf16_rne(value(i))),
    }
    Ok(())
}

//! MXFP8 reference utilities: the library's own TE-exact quantization on host arrays, so
//! frameworks and test harnesses use exactly the numerics the optimizer uses.

use crate::bail;
use crate::capi::boundary::{non_null, run};
use crate::capi::constants::{MUON_MXFP8_SCALES_COMPACT, MUON_MXFP8_SCALES_SWIZZLED};
use crate::capi::status::muon_status_t;
use crate::config::Dtype;
use crate::error::Result;
use crate::numerics::mxfp8::{Direction, Input, QuantizedMut, ScaleLayout, quantize_both, scale_shape};

fn scale_layout(code: u32) -> Result<ScaleLayout> {
    match code {
        MUON_MXFP8_SCALES_COMPACT => Ok(ScaleLayout::Compact),
        MUON_MXFP8_SCALES_SWIZZLED => Ok(ScaleLayout::Swizzled),
        other => bail!(
            InvalidEnumValue,
            "scale_layout: unknown value {other}; valid values are {MUON_MXFP8_SCALES_COMPACT} (compact), {MUON_MXFP8_SCALES_SWIZZLED} (swizzled)"
        ),
    }
}

fn dims(rows: u64, cols: u64) -> Result<(usize, usize)> {
    if rows == 0 || cols == 0 || rows.checked_mul(cols).is_none_or(|n| n > 1 << 40) {
        bail!(
            OutOfRange,
            "rows × cols = {rows} × {cols} must be non-empty and at most 2^40 elements"
        );
    }
    Ok((rows as usize, cols as usize))
}

/// @brief Shapes of the rowwise and columnwise E8M0 scale arrays of a [rows, cols] tensor, as
///        TransformerEngine allocates them (both layouts have the same size):
///        rowwise [roundup(rows,128), roundup(ceil(cols/32),4)],
///        columnwise [roundup(ceil(rows/32),4), roundup(cols,128)].
/// @param[out] shapes shapes[0..2] = rowwise rows, cols; shapes[2..4] = columnwise rows, cols.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_mxfp8_scale_shape(rows: u64, cols: u64, shapes: *mut u64) -> muon_status_t {
    run("muon_mxfp8_scale_shape", || {
        non_null(shapes, "shapes")?;
        let (rows, cols) = dims(rows, cols)?;
        let (rr, rc) = scale_shape(rows, cols, Direction::Rowwise);
        let (cr, cc) = scale_shape(rows, cols, Direction::Colwise);
        // SAFETY: the caller provides four writable values.
        unsafe { std::slice::from_raw_parts_mut(shapes, 4) }.copy_from_slice(&[rr, rc, cr, cc].map(|v| v as u64));
        Ok(())
    })
}

/// @brief Quantize a host [rows, cols] row-major bf16 or f32 array to MXFP8 (E4M3 data, E8M0
///        scale per 32 elements), rowwise and columnwise, TransformerEngine bit-exact.
/// @param[in]  input        rows·cols values of @p input_dtype (MUON_DTYPE_BF16 or _F32).
/// @param[out] rowwise_data rows·cols bytes; @p rowwise_scales / @p colwise_scales sized by
///             muon_mxfp8_scale_shape(); @p colwise_data rows·cols bytes (not transposed).
/// @param[in]  scale_layout MUON_MXFP8_SCALES_COMPACT or MUON_MXFP8_SCALES_SWIZZLED; padding
///             bytes are written as 0.
#[must_use]
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn muon_mxfp8_quantize_host(
    input: *const std::ffi::c_void,
    input_dtype: u32,
    rows: u64,
    cols: u64,
    scale_layout_code: u32,
    rowwise_data: *mut u8,
    rowwise_scales: *mut u8,
    colwise_data: *mut u8,
    colwise_scales: *mut u8,
) -> muon_status_t {
    run("muon_mxfp8_quantize_host", || {
        for (ptr, name) in [
            (input as *const u8, "input"),
            (rowwise_data as *const u8, "rowwise_data"),
            (rowwise_scales as *const u8, "rowwise_scales"),
            (colwise_data as *const u8, "colwise_data"),
            (colwise_scales as *const u8, "colwise_scales"),
        ] {
            non_null(ptr, name)?;
        }
        let (rows, cols) = dims(rows, cols)?;
        let layout = scale_layout(scale_layout_code)?;
        let n = rows * cols;
        let (rr, rc) = scale_shape(rows, cols, Direction::Rowwise);
        let (cr, cc) = scale_shape(rows, cols, Direction::Colwise);
        // SAFETY: the caller provides arrays of the documented sizes.
        let (input, row, col) = unsafe {
            let input = match Dtype::from_code("input_dtype", input_dtype)? {
                Dtype::Bf16 => Input::Bf16(std::slice::from_raw_parts(input.cast::<u16>(), n)),
                Dtype::F32 => Input::F32(std::slice::from_raw_parts(input.cast::<f32>(), n)),
            };
            let row = QuantizedMut {
                data: std::slice::from_raw_parts_mut(rowwise_data, n),
                scales: std::slice::from_raw_parts_mut(rowwise_scales, rr * rc),
            };
            let col = QuantizedMut {
                data: std::slice::from_raw_parts_mut(colwise_data, n),
                scales: std::slice::from_raw_parts_mut(colwise_scales, cr * cc),
            };
            (input, row, col)
        };
        quantize_both(input, rows, cols, layout, row, col)
    })
}

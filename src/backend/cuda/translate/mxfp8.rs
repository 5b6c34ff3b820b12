//! MXFP8 param storage: the quantize of a param's bf16 values into both directions
//! (`kernels/mxfp8_quantize.cu`).

use super::{Translator, to_u32};
use crate::backend::cuda::action::{Action, Arg, Buf, DevPtr, Kernel, Launch};
use crate::backend::ops::{Span, StreamKind};
use crate::bail;
use crate::config::Dtype;
use crate::error::Result;
use crate::numerics::mxfp8::ScaleLayout;

/// MXFP8 quantize: most tile rows covered by separate blocks (the kernel strides over more).
pub(super) const MXFP8_MAX_GRID_Y: u64 = 1024;

impl Translator {
    /// Device addresses of `param`'s MXFP8 storage, or None when it has none.
    pub fn mxfp8_addresses(&self, param: u32) -> Option<[DevPtr; 4]> {
        let part = |part: u8| self.map.get(&Buf::Mxfp8 { param, part }).map(|&(ptr, _)| ptr);
        Some([part(0)?, part(1)?, part(2)?, part(3)?])
    }

    pub(super) fn mxfp8_quantize(&self, stream: StreamKind, src: Span, param: u32) -> Result<Vec<Action>> {
        let layout = self.layout()?;
        let Some(tensor) = layout.mxfp8.iter().find(|t| t.param == param) else {
            bail!(Internal, "param {param} has no MXFP8 storage")
        };
        let (rows, cols) = (tensor.rows as u64, tensor.cols as u64);
        if src.len != rows * cols {
            bail!(Internal, "mxfp8_quantize: {src:?} does not hold {rows}x{cols} values");
        }
        let r = self.resolve(src)?;
        if r.dtype != Dtype::Bf16 {
            bail!(Internal, "mxfp8_quantize: {src:?} is not bf16");
        }
        let Some(parts) = self.mxfp8_addresses(param) else {
            bail!(Internal, "param {param}'s MXFP8 storage is not allocated")
        };
        let tiles_y = rows.div_ceil(32).next_multiple_of(4);
        let swizzled = layout.mxfp8_scale_layout == ScaleLayout::Swizzled;
        Ok(vec![Action::Launch(Launch {
            kernel: Kernel::Mxfp8Quantize,
            grid: [
                to_u32("MXFP8 grid", cols.next_multiple_of(128) / 32)?,
                tiles_y.min(MXFP8_MAX_GRID_Y) as u32,
                1,
            ],
            block: [32, 8, 1],
            stream,
            args: vec![
                Arg::Ptr(r.ptr),
                Arg::U32(to_u32("rows", rows)?),
                Arg::U32(to_u32("cols", cols)?),
                Arg::Ptr(parts[0]),
                Arg::Ptr(parts[1]),
                Arg::Ptr(parts[2]),
                Arg::Ptr(parts[3]),
                Arg::I32(i32::from(swizzled)),
            ],
        })])
    }
}

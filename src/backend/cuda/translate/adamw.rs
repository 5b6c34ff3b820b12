//! AdamW (`kernels/adamw.cu`), the casts between storage types (`kernels/cast.cu`) and the
//! plain copies.

use super::{Translator, launch};
use crate::backend::cuda::action::{Action, Arg, Kernel};
use crate::backend::ops::{AdamwJob, Span, StreamKind};
use crate::bail;
use crate::error::Result;

impl Translator {
    pub(super) fn adamw_update(&self, job: &AdamwJob) -> Result<Vec<Action>> {
        let master = self.resolve_f32(job.master)?;
        let m = self.resolve_f32(job.exp_avg)?;
        let v = self.resolve_f32(job.exp_avg_sq)?;
        let grad = self.resolve(job.grad)?;
        if m.len != master.len || v.len != master.len || grad.len != master.len {
            bail!(
                InvalidArgument,
                "adamw_update: lengths differ (master {}, exp_avg {}, exp_avg_sq {}, grad {})",
                master.len,
                m.len,
                v.len,
                grad.len
            );
        }
        Ok(vec![launch(
            Kernel::Adamw,
            master.len,
            StreamKind::Compute,
            vec![
                Arg::Ptr(master.ptr),
                Arg::Ptr(m.ptr),
                Arg::Ptr(v.ptr),
                Arg::Ptr(grad.ptr),
                Arg::I32(grad.is_bf16()),
                Arg::U64(master.len),
                Arg::F32(job.scales.lr_scale),
                Arg::F32(job.scales.wd_scale),
                Arg::Ptr(self.slot(0)?),
                Arg::I32(job.lr.slot() as i32),
                Arg::I32(i32::from(self.muon.cautious_weight_decay)),
            ],
        )])
    }

    pub(super) fn copy(&self, stream: StreamKind, src: Span, dst: Span) -> Result<Vec<Action>> {
        let (s, d) = (self.resolve(src)?, self.resolve(dst)?);
        if src.len != dst.len || src.mem == dst.mem || s.dtype != d.dtype {
            bail!(
                Internal,
                "copy {src:?} -> {dst:?}: lengths or dtypes differ, or spans share memory"
            );
        }
        Ok(vec![Action::CopyDevice {
            dst: d.ptr,
            src: s.ptr,
            bytes: s.bytes(),
            stream,
        }])
    }

    pub(super) fn cast(&self, src: Span, dst: Span) -> Result<Vec<Action>> {
        if src.len != dst.len || src.mem == dst.mem {
            bail!(
                Internal,
                "cast {src:?} -> {dst:?}: lengths differ or spans share memory"
            );
        }
        if let Some(copy) = self.cast_from_host_init(src, dst) {
            return copy;
        }
        let (s, d) = (self.resolve(src)?, self.resolve(dst)?);
        if s.dtype == d.dtype {
            return Ok(vec![Action::CopyDevice {
                dst: d.ptr,
                src: s.ptr,
                bytes: s.bytes(),
                stream: StreamKind::Compute,
            }]);
        }
        let args = vec![
            Arg::Ptr(s.ptr),
            Arg::I32(s.is_bf16()),
            Arg::Ptr(d.ptr),
            Arg::I32(d.is_bf16()),
            Arg::U64(s.len),
        ];
        Ok(vec![launch(Kernel::Cast, s.len, StreamKind::Compute, args)])
    }
}

//! The host backend's [`Op::QkClip`](crate::backend::ops::Op::QkClip).

use super::HostBackend;
use crate::backend::ops::{QkClipJob, QkMaxima};
use crate::bail;
use crate::error::Result;
use crate::numerics::qk_clip::qk_clip;

impl HostBackend {
    pub(super) fn run_qk_clip(&mut self, job: &QkClipJob) -> Result<()> {
        let QkMaxima::Host(maxima) = &job.maxima else {
            bail!(Internal, "the host backend reads QK-clip maxima from host memory, got {:?}", job.maxima)
        };
        if maxima.len() != job.map.heads() || job.master.len != (job.map.rows() * job.cols) as u64 {
            bail!(Internal, "QK-clip job does not fit its master: {job:?}");
        }
        // SAFETY: an f32 span of this backend's memory, bounds checked by `f32s`.
        let master = unsafe { self.f32s(job.master) }?;
        qk_clip(master, job.cols, &job.map, maxima, job.tau, job.alpha);
        Ok(())
    }
}

//! The host backend's [`Op::QkClip`](crate::backend::ops::Op::QkClip).

use super::HostBackend;
use crate::backend::ops::{QkClipJob, QkMaxima};
use crate::bail;
use crate::error::Result;
use crate::numerics::qk_clip::qk_clip;

impl HostBackend {
    pub(super) fn run_qk_clip(&mut self, job: &QkClipJob) -> Result<()> {
        let heads = job.map.heads();
        if job.master.len != (job.map.rows() * job.cols) as u64 {
            bail!(Internal, "QK-clip job does not fit its master: {job:?}");
        }
        let maxima = match &job.maxima {
            QkMaxima::Host(values) if values.len() == heads => values.clone(),
            QkMaxima::Host(values) => bail!(Internal, "{} QK-clip maxima for {heads} heads", values.len()),
            // This backend's memory is host memory: the address of `heads` floats the caller
            // keeps valid until the step (as a device pointer on the cuda backend).
            &QkMaxima::Device(address) if address != 0 && address % 4 == 0 => {
                // SAFETY: documented contract of `QkMaxima::Device` on this backend.
                unsafe { std::slice::from_raw_parts(address as *const f32, heads) }.to_vec()
            }
            QkMaxima::Device(address) => bail!(Internal, "QK-clip maxima at {address:#x}"),
        };
        // SAFETY: an f32 span of this backend's memory, bounds checked by `f32s`.
        let master = unsafe { self.f32s(job.master) }?;
        qk_clip(master, job.cols, &job.map, &maxima, job.tau, job.alpha);
        Ok(())
    }
}

//! [`Op::QkClip`](crate::backend::ops::Op::QkClip) on the device: one `muon_qk_clip` launch
//! (`kernels/qk_clip.cu`) over the owner's master, reading the maxima where the caller's
//! forward left them on the compute stream (no host read, capture safe).

use super::{THREADS, Translator, to_u32};
use crate::backend::cuda::action::{Action, Arg, Kernel, Launch};
use crate::backend::ops::{QkClipJob, QkMaxima, StreamKind};
use crate::bail;
use crate::error::Result;
use crate::numerics::qk_clip::MAX_SEGMENTS;

/// Most blocks along a group's elements (grid.y) and along the groups (grid.x).
const MAX_BLOCKS_Y: u64 = 64;
const MAX_BLOCKS_X: u64 = 65_535;

impl Translator {
    pub(super) fn qk_clip(&self, job: &QkClipJob) -> Result<Vec<Action>> {
        let QkMaxima::Device(maxima) = job.maxima else {
            bail!(
                InvalidArgument,
                "qk_clip: the cuda backend reads the maxima from device memory (a device pointer on the optimizer's stream)"
            )
        };
        let master = self.resolve_f32(job.master)?;
        let map = &job.map;
        if master.len != (map.rows() * job.cols) as u64 || map.segments.len() > MAX_SEGMENTS {
            bail!(Internal, "qk_clip: the job does not fit its master: {job:?}");
        }
        let mut segs = vec![0u64; MAX_SEGMENTS];
        for (slot, &(role, rows)) in segs.iter_mut().zip(&map.segments) {
            *slot = u64::from(to_u32("QK-clip segment rows", rows as u64)?) | (u64::from(role.code()) << 32);
        }
        let group_len = (map.group_rows() * job.cols) as u64;
        let grid = [
            (map.groups as u64).clamp(1, MAX_BLOCKS_X) as u32,
            group_len.div_ceil(THREADS as u64).clamp(1, MAX_BLOCKS_Y) as u32,
            1,
        ];
        Ok(vec![Action::Launch(Launch {
            kernel: Kernel::QkClip,
            grid,
            block: [THREADS, 1, 1],
            stream: StreamKind::Compute,
            args: vec![
                Arg::Ptr(master.ptr),
                Arg::Ptr(maxima),
                Arg::U64(job.cols as u64),
                Arg::U32(to_u32("QK-clip groups", map.groups as u64)?),
                Arg::U32(to_u32("QK-clip heads per group", map.heads_per_group as u64)?),
                Arg::U32(map.segments.len() as u32),
                Arg::Words(segs),
                Arg::F32(job.tau),
                Arg::F32(job.alpha),
            ],
        })])
    }
}

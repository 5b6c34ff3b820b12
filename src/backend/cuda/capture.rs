//! The rules CUDA stream capture imposes on a captured region, checked over its translated
//! actions without a device (CUDA Programming Guide, "Stream Capture": cross-stream
//! dependencies, prohibited operations, and the join every fork needs before the capture
//! ends). The region is captured on the compute stream; the comm stream joins the capture by
//! waiting on an event recorded in it.

use crate::backend::cuda::action::Action;
use crate::backend::ops::{EventId, StreamKind};
use crate::bail;
use crate::error::Result;

/// The stream `action` runs on; None for actions that are not stream work.
fn stream_of(action: &Action) -> Option<StreamKind> {
    match action {
        Action::Alloc { .. } | Action::Synchronize(_) => None,
        Action::CopyIn { stream, .. }
        | Action::CopyInAsync { stream, .. }
        | Action::CopyOut { stream, .. }
        | Action::Zero { stream, .. }
        | Action::CopyDevice { stream, .. }
        | Action::CopyDevice2D { stream, .. }
        | Action::Record { stream, .. }
        | Action::Wait { stream, .. } => Some(*stream),
        Action::Launch(launch) => Some(launch.stream),
        Action::Gemm(_) => Some(StreamKind::Compute),
        Action::Nccl(..) => Some(StreamKind::Comm),
    }
}

/// Checks that `actions`, issued between `cuStreamBeginCapture` and `cuStreamEndCapture` on
/// the compute stream, can be captured: no allocation, host-blocking copy or synchronize;
/// every wait is on an event recorded inside the region; the comm stream works only after it
/// joined the capture; and everything it did is joined back into the compute stream before
/// the region ends. The error names the first offending action by index.
pub fn check_capture(actions: &[Action]) -> Result<()> {
    // Per event: where it was last recorded in the region, and on which stream.
    let mut recorded: Vec<(EventId, StreamKind, usize)> = Vec::new();
    let mut comm_captured = false;
    let mut comm_last = None;
    // The latest comm-stream record the compute stream waited on.
    let mut joined_through = None;
    for (i, action) in actions.iter().enumerate() {
        if let Action::Alloc { .. } | Action::CopyIn { .. } | Action::CopyOut { .. } | Action::Synchronize(_) = action {
            bail!(
                Unsupported,
                "action {i} ({action:?}) blocks the host or allocates, which stream capture prohibits"
            );
        }
        if let &Action::Wait { stream, event } = action {
            let Some(&(_, from, at)) = recorded.iter().find(|(e, _, _)| *e == event) else {
                bail!(
                    Unsupported,
                    "action {i}: the {stream:?} stream waits on {event:?}, which was not recorded in the captured region (a dependency on uncaptured work)"
                )
            };
            match (stream, from) {
                (StreamKind::Comm, StreamKind::Compute) => comm_captured = true,
                (StreamKind::Compute, StreamKind::Comm) => joined_through = joined_through.max(Some(at)),
                _ => {}
            }
            continue;
        }
        if stream_of(action) == Some(StreamKind::Comm) {
            if !comm_captured {
                bail!(
                    Unsupported,
                    "action {i} ({action:?}) runs on the comm stream before it joined the capture (no wait on an event of the captured stream)"
                );
            }
            comm_last = Some(i);
        }
        if let &Action::Record { stream, event } = action {
            recorded.retain(|(e, _, _)| *e != event);
            recorded.push((event, stream, i));
        }
    }
    if let Some(last) = comm_last
        && joined_through.is_none_or(|at| at < last)
    {
        bail!(
            Unsupported,
            "the comm stream's work up to action {last} is not joined into the compute stream before the region ends (cudaErrorStreamCaptureUnjoined)"
        );
    }
    Ok(())
}

//! The schedule's event records and waits, with the one piece of bookkeeping CUDA graph
//! capture needs: which events were recorded since the compute stream last joined the comm
//! stream. A wait on an older event is already satisfied by stream order, and issuing it
//! would break a capture that began after it was recorded (a dependency on uncaptured work,
//! `cudaErrorStreamCaptureIsolation`), so it is left out.

use super::Runtime;
use crate::backend::ops::{EventId, StreamKind};
use crate::error::Result;

/// The event slot [`Runtime::join`] uses, after every bucket's and the step's own.
pub(super) fn join_event(buckets: usize) -> EventId {
    EventId(buckets * 4 + 2)
}

/// Event slots of a plan with `buckets` buckets.
pub(super) fn event_slots(buckets: usize) -> usize {
    join_event(buckets).0 + 1
}

impl Runtime {
    /// Records `event` on `stream`.
    pub(super) fn record(&mut self, stream: StreamKind, event: EventId) -> Result<()> {
        self.backend.record(stream, event)?;
        self.live[event.0] = true;
        self.comm_unjoined |= stream == StreamKind::Comm;
        Ok(())
    }

    /// `stream` waits for `event`, unless it was recorded before the last join (or never).
    pub(super) fn wait(&mut self, stream: StreamKind, event: EventId) -> Result<()> {
        if self.live[event.0] {
            self.backend.wait(stream, event)?;
        }
        Ok(())
    }

    /// The compute stream waits for everything the library queued on its comm stream (no host
    /// wait). Call it last in a region captured into a CUDA graph: every collective the region
    /// forked onto the comm stream is joined back, as capture requires, and the next region
    /// waits on nothing recorded outside it. Nothing is issued when the comm stream has had
    /// no work since the last join.
    pub fn join(&mut self) -> Result<()> {
        if !self.comm_unjoined {
            return Ok(());
        }
        let join = join_event(self.plan.buckets.len());
        self.backend.record(StreamKind::Comm, join)?;
        self.backend.wait(StreamKind::Compute, join)?;
        self.forget_events();
        Ok(())
    }

    /// Every recorded event is behind the compute stream's position.
    pub(super) fn forget_events(&mut self) {
        self.live.iter_mut().for_each(|l| *l = false);
        self.comm_unjoined = false;
    }
}

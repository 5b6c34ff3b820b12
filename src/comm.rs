//! Communicators: an in-process host group (ranks on threads) or the caller's NCCL
//! communicator. The kind of communicator decides the backend: host group → host backend,
//! NCCL → cuda backend.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::backend::cuda::nccl::NcclComm;
use crate::backend::host::comm::HostComm;
use crate::bail;
use crate::error::Result;

/// The transport behind a `muon_comm_t`.
pub enum Transport {
    Host(HostComm),
    Nccl(NcclComm),
}

/// A communicator handle's contents, shared with the optimizer that uses it (so destroying
/// the handle first cannot leave the optimizer with a dangling transport).
pub struct Communicator {
    pub transport: Transport,
    in_use: AtomicBool,
}

impl Communicator {
    pub fn new(transport: Transport) -> Arc<Self> {
        Arc::new(Communicator {
            transport,
            in_use: AtomicBool::new(false),
        })
    }

    pub fn rank(&self) -> usize {
        match &self.transport {
            Transport::Host(c) => c.rank(),
            Transport::Nccl(c) => c.rank,
        }
    }

    pub fn size(&self) -> usize {
        match &self.transport {
            Transport::Host(c) => c.size(),
            Transport::Nccl(c) => c.size,
        }
    }

    /// Makes the collectives the optimizer issues on this communicator wait at most `timeout`
    /// for the other ranks: a host group's rank handle takes it; on NCCL the cuda backend
    /// polls every communicator it issues on against the same timeout.
    pub fn inherit_timeout(&self, timeout: Duration) {
        if let Transport::Host(host) = &self.transport {
            host.set_timeout(timeout);
        }
    }

    /// Marks the communicator as used by one optimizer; a second optimizer on the same
    /// communicator would interleave its collectives with the first one's.
    pub fn claim(self: &Arc<Self>) -> Result<Claim> {
        if self.in_use.swap(true, Ordering::AcqRel) {
            bail!(
                InvalidState,
                "comm: already used by another optimizer (one optimizer per communicator; destroy the other optimizer first)"
            );
        }
        Ok(Claim(self.clone()))
    }
}

/// Exclusive use of a communicator by one optimizer, released on drop.
pub struct Claim(Arc<Communicator>);

impl Claim {
    pub fn comm(&self) -> &Communicator {
        &self.0
    }

    /// A shared reference to the communicator, for the backend's comm stream.
    pub fn shared(&self) -> Arc<Communicator> {
        self.0.clone()
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.0.in_use.store(false, Ordering::Release);
    }
}

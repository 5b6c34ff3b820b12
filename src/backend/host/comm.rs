//! An in-process communicator for a group of ranks running on threads, with NCCL semantics.
//!
//! [`HostGroup::new`] creates one [`HostComm`] per rank. Each rank's handle is used by one
//! thread at a time (normally its comm-stream worker); different ranks run on different threads
//! concurrently. Collectives operate on [`Region`]s: element ranges of caller memory, f32 or
//! bf16 (bf16 as `u16` bits), passed as raw pointers because the ranks share one address space.
//!
//! # Rendezvous
//! Every call of every rank is a collective with a per-rank sequence number: the k-th call of
//! each rank belongs to collective #k. A rank posts its descriptor (op kinds, dtype, element
//! counts, roots) and its regions into the group's slot and blocks. The **last rank to arrive**
//! checks nothing further (each arrival was already matched against the earlier ones) and
//! starts the operation outside the lock; it wakes the others, and every rank's thread claims
//! chunks of the elements until none is left (`comm/work.rs`), so the reduction runs on all the
//! group's threads in parallel. A rank returns once every chunk is done. Each element is
//! summed in the same order whichever thread computes it, so the result is independent of
//! thread timing.
//!
//! # Numerics
//! Sums are computed in rank order in f32: `acc = x₀; acc += x₁; …; acc += x_{n−1}`, every bf16
//! input converted exactly to f32 first and the f32 sum rounded to bf16 once, to nearest even.
//! The result is therefore bit-for-bit equal to that sequential loop on every run. Every
//! element of an op is read in full before it is written, so every in-place form NCCL allows
//! works; an op's `send` and `recv` must otherwise not overlap, and the ops of one group must
//! not overlap each other's memory (undefined in NCCL as well; refused here as an invalid
//! argument, since the ops of a group run concurrently).
//!
//! # Failures
//! The group fails as a whole and stays failed: after the first failure every later call on
//! any rank returns [`ErrorKind::CommBroken`](crate::error::ErrorKind::CommBroken) at once, naming the original failure.
//! - **Mismatch.** The k-th calls of all ranks must agree in op kinds, dtypes, element counts
//!   and roots. Every rank whose k-th call is the mismatched collective gets
//!   [`ErrorKind::CommMismatch`](crate::error::ErrorKind::CommMismatch) naming the ranks and both descriptors.
//! - **Timeout.** A rank waits at most its timeout ([`HostComm::set_timeout`]) for the others
//!   to arrive. When the first waiting rank's deadline passes, every rank that joined gets
//!   [`ErrorKind::CommTimeout`](crate::error::ErrorKind::CommTimeout) naming the ranks that did not arrive, the op, the sequence
//!   number and the timeout. Once every rank has arrived the operation runs to completion; the
//!   timeout bounds the rendezvous, not the computation.
//! - **Invalid arguments** (region lengths, dtypes, root, alignment) are checked before
//!   posting: the calling rank gets [`ErrorKind::InvalidArgument`](crate::error::ErrorKind::InvalidArgument) and the group breaks, so the
//!   other ranks get [`ErrorKind::CommBroken`](crate::error::ErrorKind::CommBroken) instead of waiting for their timeout.
//! - **Panic** while computing: every participant gets [`ErrorKind::Panic`](crate::error::ErrorKind::Panic).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::config::Dtype;
use crate::error::Result;

mod collective;
mod group;
mod work;

pub use collective::{Collective, Region};
use collective::{Item, Kind, check_disjoint};
use group::GroupState;

/// The longest timeout honoured; longer ones are clamped to it (one year).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

/// The shared state of a group. Only [`HostGroup::new`] is public: ranks use [`HostComm`].
pub struct HostGroup {
    size: usize,
    state: Mutex<GroupState>,
    cv: Condvar,
}

impl HostGroup {
    /// Creates a group of `world_size` ranks and returns their handles; element `r` is rank `r`.
    /// Every handle starts with `timeout` (clamped to [`MAX_TIMEOUT`]) as its collective timeout.
    #[allow(
        clippy::new_ret_no_self,
        reason = "a group is only reachable through its rank handles"
    )]
    pub fn new(world_size: usize, timeout: Duration) -> Vec<HostComm> {
        let group = Arc::new(HostGroup {
            size: world_size,
            state: Mutex::new(GroupState::new(world_size)),
            cv: Condvar::new(),
        });
        (0..world_size)
            .map(|rank| HostComm {
                rank,
                group: group.clone(),
                timeout_nanos: AtomicU64::new(clamp_nanos(timeout)),
            })
            .collect()
    }
}

fn clamp_nanos(timeout: Duration) -> u64 {
    timeout.min(MAX_TIMEOUT).as_nanos() as u64
}

/// One rank's handle on a [`HostGroup`]. `Send + Sync`; use it from one thread at a time.
pub struct HostComm {
    rank: usize,
    group: Arc<HostGroup>,
    timeout_nanos: AtomicU64,
}

impl HostComm {
    /// This handle's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks in the group.
    pub fn size(&self) -> usize {
        self.group.size
    }

    /// How long this rank waits for the others to arrive at a collective.
    pub fn timeout(&self) -> Duration {
        Duration::from_nanos(self.timeout_nanos.load(Ordering::Relaxed))
    }

    /// Sets this rank's collective timeout (clamped to [`MAX_TIMEOUT`]) for its later calls.
    pub fn set_timeout(&self, timeout: Duration) {
        self.timeout_nanos.store(clamp_nanos(timeout), Ordering::Relaxed);
    }

    /// [`Collective::Reduce`]: sum of `send` over ranks into `recv` of `root`.
    pub fn reduce(&self, root: usize, send: Region, recv: Region) -> Result<()> {
        self.group(&[Collective::Reduce { root, send, recv }])
    }

    /// [`Collective::Broadcast`]: `buf` of `root` into `buf` of every rank.
    pub fn broadcast(&self, root: usize, buf: Region) -> Result<()> {
        self.group(&[Collective::Broadcast { root, buf }])
    }

    /// [`Collective::ReduceScatter`]: chunk `rank` of the sum of the `send`s into `recv`.
    pub fn reduce_scatter(&self, send: Region, recv: Region) -> Result<()> {
        self.group(&[Collective::ReduceScatter { send, recv }])
    }

    /// [`Collective::AllGather`]: every rank's `send` into `recv`, in rank order.
    pub fn all_gather(&self, send: Region, recv: Region) -> Result<()> {
        self.group(&[Collective::AllGather { send, recv }])
    }

    /// [`Collective::AllReduce`] in place: `buf` becomes the sum of every rank's `buf`.
    pub fn all_reduce(&self, buf: Region) -> Result<()> {
        self.group(&[Collective::AllReduce { send: buf, recv: buf }])
    }

    /// Runs `ops` as one collective (`ncclGroupStart` … `ncclGroupEnd`): one rendezvous, then
    /// the ops in list order. Every rank must pass the same kinds, dtypes, counts and roots in
    /// the same order. An empty list is a barrier.
    pub fn group(&self, ops: &[Collective]) -> Result<()> {
        let mut items = Vec::with_capacity(ops.len());
        for op in ops {
            match op.item(self.rank, self.size()) {
                Ok(item) => items.push(item),
                Err(err) => return Err(self.fail_invalid(err)),
            }
        }
        if let Err(err) = check_disjoint(&items) {
            return Err(self.fail_invalid(err));
        }
        self.run(items).map(drop)
    }

    /// Blocks until every rank has called `barrier`.
    pub fn barrier(&self) -> Result<()> {
        self.group(&[])
    }

    /// Every rank's `value`, indexed by rank.
    pub fn all_gather_u64(&self, value: u64) -> Result<Vec<u64>> {
        self.run(vec![Item::scalar(Kind::AllGatherU64, value)])
    }

    /// Every rank's `words` (the same count on every rank), concatenated in rank order: an
    /// all-gather of their bits, moved unchanged.
    pub fn all_gather_words(&self, words: &[u64]) -> Result<Vec<u64>> {
        let mut send = words.to_vec();
        let mut recv = vec![0u64; words.len() * self.size()];
        // SAFETY: both vectors live until the collective returns and are touched by it alone;
        // u64 memory holds two 4-byte elements per word, suitably aligned, copied as bits.
        let (send_region, recv_region) = unsafe {
            (
                Region::new(send.as_mut_ptr().cast(), 2 * send.len(), Dtype::F32),
                Region::new(recv.as_mut_ptr().cast(), 2 * recv.len(), Dtype::F32),
            )
        };
        self.all_gather(send_region, recv_region)?;
        Ok(recv)
    }
}

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
//! any rank returns [`ErrorKind::CommBroken`] at once, naming the original failure.
//! - **Mismatch.** The k-th calls of all ranks must agree in op kinds, dtypes, element counts
//!   and roots. Every rank whose k-th call is the mismatched collective gets
//!   [`ErrorKind::CommMismatch`] naming the ranks and both descriptors.
//! - **Timeout.** A rank waits at most its timeout ([`HostComm::set_timeout`]) for the others
//!   to arrive. When the first waiting rank's deadline passes, every rank that joined gets
//!   [`ErrorKind::CommTimeout`] naming the ranks that did not arrive, the op, the sequence
//!   number and the timeout. Once every rank has arrived the operation runs to completion; the
//!   timeout bounds the rendezvous, not the computation.
//! - **Invalid arguments** (region lengths, dtypes, root, alignment) are checked before
//!   posting: the calling rank gets [`ErrorKind::InvalidArgument`] and the group breaks, so the
//!   other ranks get [`ErrorKind::CommBroken`] instead of waiting for their timeout.
//! - **Panic** while computing: every participant gets [`ErrorKind::Panic`].

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::config::Dtype;
use crate::error::{Error, ErrorKind, Result};

mod work;

use work::Work;

/// The longest timeout honoured; longer ones are clamped to it (one year).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

/// A range of `len` elements of `dtype` in caller memory, used as a collective's input or
/// output. Copyable: a region is a description, not an owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    ptr: *mut u8,
    len: usize,
    dtype: Dtype,
}

// SAFETY: a region is only dereferenced inside a collective, under the contract of
// `Region::new`: the memory stays valid and is accessed by nobody else until the collective
// returns, so moving or sharing the description between threads is sound.
unsafe impl Send for Region {}
// SAFETY: as for `Send`; `Region` has no interior mutability.
unsafe impl Sync for Region {}

impl Region {
    /// Describes `len` elements of `dtype` starting at `ptr`.
    ///
    /// # Safety
    /// For as long as any collective that receives this region (or a sub-region of it) has not
    /// returned, `ptr` must be valid for reads of `len` elements of `dtype` if the region is an
    /// input and for writes if it is an output, and nothing else may access that memory except
    /// through the collective. A region may be enqueued on a comm stream: the contract then
    /// extends until that queued op has completed or been dropped. Alignment is checked when
    /// the region is used; a zero-length region may use any pointer, including null.
    pub unsafe fn new(ptr: *mut u8, len: usize, dtype: Dtype) -> Region {
        Region { ptr, len, dtype }
    }

    /// Describes an f32 slice.
    ///
    /// # Safety
    /// The region outlives the borrow: the contract of [`Region::new`] applies.
    pub unsafe fn from_f32(data: &mut [f32]) -> Region {
        Region {
            ptr: data.as_mut_ptr().cast(),
            len: data.len(),
            dtype: Dtype::F32,
        }
    }

    /// Describes a slice of bf16 values (as `u16` bits).
    ///
    /// # Safety
    /// The region outlives the borrow: the contract of [`Region::new`] applies.
    pub unsafe fn from_bf16(data: &mut [u16]) -> Region {
        Region {
            ptr: data.as_mut_ptr().cast(),
            len: data.len(),
            dtype: Dtype::Bf16,
        }
    }

    /// An empty region of `dtype`.
    pub fn empty(dtype: Dtype) -> Region {
        Region {
            ptr: std::ptr::null_mut(),
            len: 0,
            dtype,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the region has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Element type.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// Address of the first element.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The `len` elements starting at element `offset` (for in-place forms: a rank's chunk of
    /// the whole buffer). Fails with `InvalidArgument` if the range does not fit.
    pub fn sub(&self, offset: usize, len: usize) -> Result<Region> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(Region {
                ptr: self.ptr.wrapping_add(offset * self.dtype.size()),
                len,
                dtype: self.dtype,
            }),
            _ => Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "region: elements {offset}..{offset}+{len} are outside the region of {} elements",
                    self.len
                ),
            )),
        }
    }

    fn check(&self, op: Kind, role: &str) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        let size = self.dtype.size();
        if self.ptr.is_null() {
            return Err(invalid(format!("{op}: {role} is NULL with {} elements", self.len)));
        }
        let aligned = match self.dtype {
            Dtype::F32 => self.ptr.cast::<f32>().is_aligned(),
            Dtype::Bf16 => self.ptr.cast::<u16>().is_aligned(),
        };
        if !aligned {
            return Err(invalid(format!(
                "{op}: {role} at {:p} is not aligned to its {}-byte {} elements",
                self.ptr,
                size,
                self.dtype.name()
            )));
        }
        if self
            .len
            .checked_mul(size)
            .is_none_or(|bytes| bytes > isize::MAX as usize)
        {
            return Err(invalid(format!("{op}: {role} of {} elements is too large", self.len)));
        }
        Ok(())
    }

    /// The addresses the region covers, as a half-open byte range.
    fn address_range(&self) -> std::ops::Range<usize> {
        let start = self.ptr as usize;
        start..start + self.len * self.dtype.size()
    }

    /// Elements `at..at + len` as f32 values (`dtype` must be f32).
    ///
    /// # Safety
    /// The region contract holds, the elements are in bounds, and no mutable view of them is
    /// alive; alignment and non-null were checked at posting.
    unsafe fn sub_f32s<'a>(self, at: usize, len: usize) -> &'a [f32] {
        // SAFETY: per the caller's promise.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<f32>().add(at), len) }
    }

    /// Elements `at..at + len` as bf16 bits (`dtype` must be bf16).
    ///
    /// # Safety
    /// As for [`Region::sub_f32s`].
    unsafe fn sub_u16s<'a>(self, at: usize, len: usize) -> &'a [u16] {
        // SAFETY: per the caller's promise.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u16>().add(at), len) }
    }
}

fn invalid(message: String) -> Error {
    Error::new(ErrorKind::InvalidArgument, message)
}

/// One data collective (NCCL semantics, sum only). All regions of an op share one dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collective {
    /// `ncclReduce`: the sum of every rank's `send` is written to `recv` of rank `root`; the
    /// other ranks' `recv` is not written. `send` and `recv` have equal lengths; in place:
    /// `send == recv`.
    Reduce { root: usize, send: Region, recv: Region },
    /// `ncclBroadcast` in place: `buf` of rank `root` is copied into `buf` of every rank.
    Broadcast { root: usize, buf: Region },
    /// `ncclReduceScatter`: `send` holds `size × c` elements, `recv` receives chunk `rank` of the
    /// sum (`c` elements). In place: `recv = send.sub(rank·c, c)`.
    ReduceScatter { send: Region, recv: Region },
    /// `ncclAllGather`: `recv` (`size × c` elements) receives every rank's `send` (`c`
    /// elements) in rank order. In place: `send = recv.sub(rank·c, c)`.
    AllGather { send: Region, recv: Region },
    /// `ncclAllReduce`: every rank's `recv` receives the sum of all `send`s; equal lengths; in
    /// place: `send == recv`.
    AllReduce { send: Region, recv: Region },
}

impl Collective {
    /// Checks the regions against each other, the rank and the group size and builds the
    /// posted item.
    fn item(&self, rank: usize, size: usize) -> Result<Item> {
        let (kind, root, send, recv) = match *self {
            Collective::Reduce { root, send, recv } => (Kind::Reduce, Some(root), send, recv),
            Collective::Broadcast { root, buf } => (Kind::Broadcast, Some(root), buf, buf),
            Collective::ReduceScatter { send, recv } => (Kind::ReduceScatter, None, send, recv),
            Collective::AllGather { send, recv } => (Kind::AllGather, None, send, recv),
            Collective::AllReduce { send, recv } => (Kind::AllReduce, None, send, recv),
        };
        send.check(kind, "send")?;
        recv.check(kind, "recv")?;
        if send.dtype != recv.dtype {
            return Err(invalid(format!(
                "{kind}: send is {} but recv is {}",
                send.dtype.name(),
                recv.dtype.name()
            )));
        }
        if let Some(root) = root.filter(|&root| root >= size) {
            return Err(invalid(format!("{kind}: root {root} is outside 0..{size}")));
        }
        let count = match kind {
            Kind::ReduceScatter => {
                if recv.len.checked_mul(size) != Some(send.len) {
                    return Err(invalid(format!(
                        "{kind}: send has {} elements but must have recv's {} × {size} ranks",
                        send.len, recv.len
                    )));
                }
                recv.len
            }
            Kind::AllGather => {
                if send.len.checked_mul(size) != Some(recv.len) {
                    return Err(invalid(format!(
                        "{kind}: recv has {} elements but must have send's {} × {size} ranks",
                        recv.len, send.len
                    )));
                }
                send.len
            }
            _ => {
                if send.len != recv.len {
                    return Err(invalid(format!(
                        "{kind}: send has {} elements but recv has {}",
                        send.len, recv.len
                    )));
                }
                send.len
            }
        };
        check_in_place(kind, rank, count, send, recv)?;
        Ok(Item {
            desc: Desc {
                kind,
                dtype: send.dtype,
                count,
                root,
            },
            send,
            recv,
            value: 0,
        })
    }
}

/// `send` and `recv` of one op may only overlap in NCCL's in-place form: the same region for
/// reduce, broadcast and all-reduce; `recv` = chunk `rank` of `send` for reduce-scatter; `send`
/// = chunk `rank` of `recv` for all-gather.
fn check_in_place(kind: Kind, rank: usize, count: usize, send: Region, recv: Region) -> Result<()> {
    let (s, r) = (send.address_range(), recv.address_range());
    if send.is_empty() || recv.is_empty() || s.end <= r.start || r.end <= s.start {
        return Ok(());
    }
    let chunk = count * send.dtype.size();
    let in_place = match kind {
        Kind::ReduceScatter => r.start == s.start + rank * chunk && r.len() == chunk,
        Kind::AllGather => s.start == r.start + rank * chunk && s.len() == chunk,
        _ => s == r,
    };
    if in_place {
        return Ok(());
    }
    Err(invalid(format!(
        "{kind}: send {:#x}..{:#x} and recv {:#x}..{:#x} overlap but are not the in-place form of rank {rank}",
        s.start, s.end, r.start, r.end
    )))
}

/// The ops of one group run concurrently, so their memory must not overlap (NCCL leaves it
/// undefined too).
fn check_disjoint(items: &[Item]) -> Result<()> {
    let mut ranges: Vec<(std::ops::Range<usize>, usize)> = items
        .iter()
        .enumerate()
        .flat_map(|(op, item)| [(item.send, op), (item.recv, op)])
        .filter(|(region, _)| !region.is_empty())
        .map(|(region, op)| (region.address_range(), op))
        .collect();
    ranges.sort_by_key(|(range, _)| range.start);
    let mut reach: Option<(usize, usize)> = None;
    for (range, op) in ranges {
        if let Some((_, other)) = reach.filter(|&(end, other)| other != op && range.start < end) {
            return Err(invalid(format!(
                "group: op {op} ({}) and op {other} ({}) overlap in memory at {:#x}; the ops of one group must use disjoint memory",
                items[op].desc, items[other].desc, range.start
            )));
        }
        if reach.is_none_or(|(end, _)| range.end > end) {
            reach = Some((range.end, op));
        }
    }
    Ok(())
}

/// The operation kinds, including the private scalar exchanges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Reduce,
    Broadcast,
    ReduceScatter,
    AllGather,
    AllReduce,
    AllGatherU64,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Reduce => "reduce",
            Kind::Broadcast => "broadcast",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::AllGather => "all_gather",
            Kind::AllReduce => "all_reduce",
            Kind::AllGatherU64 => "all_gather_u64",
        })
    }
}

/// What must agree across ranks for one op: kind, dtype, element count (per rank for
/// reduce-scatter and all-gather, as in NCCL) and root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Desc {
    kind: Kind,
    dtype: Dtype,
    count: usize,
    root: Option<usize>,
}

impl fmt::Display for Desc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.kind, self.root) {
            (Kind::AllGatherU64, _) => write!(f, "{}(one value)", self.kind),
            (kind, Some(root)) => write!(f, "{kind}(root={root}, {}, count={})", self.dtype.name(), self.count),
            (kind, None) => write!(f, "{kind}({}, count={})", self.dtype.name(), self.count),
        }
    }
}

/// One op as posted by one rank: what must match, and this rank's memory or value.
#[derive(Debug, Clone, Copy)]
struct Item {
    desc: Desc,
    send: Region,
    recv: Region,
    value: u64,
}

impl Item {
    fn scalar(kind: Kind, value: u64) -> Item {
        Item {
            desc: Desc {
                kind,
                dtype: Dtype::F32,
                count: 1,
                root: None,
            },
            send: Region::empty(Dtype::F32),
            recv: Region::empty(Dtype::F32),
            value,
        }
    }
}

/// Describes the ops of one call for messages.
fn describe(items: &[Item]) -> String {
    match items {
        [] => "barrier".to_string(),
        [one] => one.desc.to_string(),
        many => {
            let parts: Vec<String> = many.iter().map(|i| i.desc.to_string()).collect();
            format!("group[{}]", parts.join(", "))
        }
    }
}

fn same_descs(a: &[Item], b: &[Item]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.desc == y.desc)
}

/// Why the group broke; decides what the other ranks are told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    Timeout,
    Mismatch,
    Panic,
    InvalidArgument,
}

#[derive(Debug)]
struct Failure {
    seq: u64,
    cause: Cause,
    error: Error,
}

impl Failure {
    /// The error for a rank that had posted collective #`seq` when the group broke.
    fn for_participant(&self, rank: usize, seq: u64) -> Error {
        if self.seq == seq && self.cause != Cause::InvalidArgument {
            self.error.clone()
        } else {
            self.broken(rank, seq)
        }
    }

    /// The error for a rank that calls collective #`seq` after the group broke.
    fn for_arrival(&self, rank: usize, seq: u64) -> Error {
        if self.seq == seq && self.cause == Cause::Mismatch {
            self.error.clone()
        } else {
            self.broken(rank, seq)
        }
    }

    fn broken(&self, rank: usize, seq: u64) -> Error {
        Error::new(
            ErrorKind::CommBroken,
            format!(
                "host group: rank {rank} cannot run collective #{seq}: the group is broken since collective #{} failed ({:?}): {}",
                self.seq, self.error.kind, self.error.message
            ),
        )
    }
}

/// The collective whose ranks are arriving (all ranks are in lockstep, so there is at most one).
struct Gathering {
    posts: Vec<Option<Vec<Item>>>,
    executing: bool,
    /// Once every rank arrived: the shared work and the scalar exchange's values.
    work: Option<(Arc<Work>, Vec<u64>)>,
}

struct GroupState {
    /// Per rank: how many collectives it has entered (its next sequence number).
    entered: Vec<u64>,
    /// Number of collectives completed (all ranks released).
    completed: u64,
    gathering: Option<Gathering>,
    /// Per-rank values of the last completed scalar exchange. Stable until every rank has
    /// entered the next collective, so a waiter released late still reads its own.
    scalars: Vec<u64>,
    failure: Option<Failure>,
}

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
            state: Mutex::new(GroupState {
                entered: vec![0; world_size],
                completed: 0,
                gathering: None,
                scalars: Vec::new(),
                failure: None,
            }),
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

    fn lock(&self) -> MutexGuard<'_, GroupState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'a>(&self, guard: MutexGuard<'a, GroupState>, timeout: Duration) -> MutexGuard<'a, GroupState> {
        self.cv
            .wait_timeout(guard, timeout)
            .unwrap_or_else(PoisonError::into_inner)
            .0
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

    /// Breaks the group because this rank's arguments are invalid, so nobody waits for it.
    fn fail_invalid(&self, err: Error) -> Error {
        let mut st = self.group.lock();
        if st.failure.is_none() {
            let seq = st.entered[self.rank];
            let error = Error::new(err.kind, format!("rank {}: {}", self.rank, err.message));
            self.fail(&mut st, seq, Cause::InvalidArgument, error);
        }
        err
    }

    /// Posts `items` as this rank's next collective, waits for the rendezvous, and returns the
    /// per-rank values of a scalar exchange (empty for data collectives).
    fn run(&self, items: Vec<Item>) -> Result<Vec<u64>> {
        let mut st = self.group.lock();
        let description = describe(&items);
        let seq = self.post(&mut st, items)?;
        let done = Self::start_if_all_arrived(&mut st, seq);
        if st.gathering.as_ref().is_none_or(|g| g.executing) {
            self.group.cv.notify_all();
        }
        match done {
            Some(scalars) => Ok(scalars),
            None => self.await_completion(st, seq, &description),
        }
    }

    /// Enters this rank's next collective and posts its items, after checking them against the
    /// ranks already there. Returns the collective's sequence number.
    fn post(&self, st: &mut GroupState, items: Vec<Item>) -> Result<u64> {
        let rank = self.rank;
        let seq = st.entered[rank];
        if let Some(failure) = &st.failure {
            return Err(failure.for_arrival(rank, seq));
        }
        if st
            .gathering
            .as_ref()
            .is_some_and(|g| g.executing || g.posts[rank].is_some())
        {
            return Err(Error::new(
                ErrorKind::InvalidState,
                format!(
                    "host group: rank {rank} called a collective while its previous one is still running; use each rank's handle from one thread at a time"
                ),
            ));
        }
        st.entered[rank] += 1;
        // Lockstep: a rank enters #k+1 only after #k completed (which cleared `gathering`), so
        // an existing gathering is this rank's collective #seq.
        let size = self.group.size;
        let gathering = st.gathering.get_or_insert_with(|| Gathering {
            posts: vec![None; size],
            executing: false,
            work: None,
        });
        let mismatch = gathering
            .posts
            .iter()
            .enumerate()
            .find_map(|(r, p)| p.as_ref().map(|p| (r, p)))
            .filter(|(_, posted)| !same_descs(posted, &items))
            .map(|(other, posted)| {
                format!(
                    "host group: collective #{seq} does not match across ranks: rank {rank} called {} but rank {other} called {}",
                    describe(&items),
                    describe(posted)
                )
            });
        if let Some(message) = mismatch {
            let error = Error::new(ErrorKind::CommMismatch, message);
            self.fail(st, seq, Cause::Mismatch, error.clone());
            return Err(error);
        }
        gathering.posts[rank] = Some(items);
        Ok(seq)
    }

    /// When every rank has posted collective #`seq`, starts it: returns its scalars at once if
    /// there is nothing to compute, else publishes the work for the ranks to share.
    fn start_if_all_arrived(st: &mut GroupState, seq: u64) -> Option<Vec<u64>> {
        let gathering = st.gathering.as_mut()?;
        if !gathering.posts.iter().all(Option::is_some) {
            return None;
        }
        let posts: Vec<Vec<Item>> = gathering.posts.iter_mut().filter_map(Option::take).collect();
        let scalars: Vec<u64> = match posts[0].as_slice() {
            [only] if only.desc.kind == Kind::AllGatherU64 => posts.iter().map(|p| p[0].value).collect(),
            _ => Vec::new(),
        };
        let work = Work::new(posts);
        if work.is_empty() {
            st.gathering = None;
            st.completed = seq + 1;
            st.scalars = scalars.clone();
            return Some(scalars);
        }
        gathering.executing = true;
        gathering.work = Some((Arc::new(work), scalars));
        None
    }

    /// Waits until collective #`seq` completed or failed. While the ranks are arriving the wait
    /// is bounded by this rank's timeout; once all arrived, this rank helps with the work and
    /// waits for the last chunk (the work always finishes, panics are caught).
    fn await_completion<'a>(
        &'a self,
        mut st: MutexGuard<'a, GroupState>,
        seq: u64,
        description: &str,
    ) -> Result<Vec<u64>> {
        let (group, rank, timeout) = (&*self.group, self.rank, self.timeout());
        let deadline = Instant::now() + timeout;
        let mut helped = false;
        loop {
            if st.completed > seq {
                return Ok(st.scalars.clone());
            }
            if let Some(failure) = &st.failure {
                return Err(failure.for_participant(rank, seq));
            }
            let Some(gathering) = &st.gathering else {
                return Err(Error::new(
                    ErrorKind::Internal,
                    format!("host group: collective #{seq} vanished on rank {rank}"),
                ));
            };
            if gathering.executing {
                match gathering.work.clone() {
                    Some((work, scalars)) if !helped => {
                        helped = true;
                        drop(st);
                        let completed_last = work.help();
                        st = group.lock();
                        if completed_last {
                            Self::complete(&mut st, seq, &work, scalars, rank);
                            group.cv.notify_all();
                        }
                    }
                    _ => st = group.wait(st, timeout.max(Duration::from_millis(1))),
                }
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<usize> = (0..group.size).filter(|&r| gathering.posts[r].is_none()).collect();
                return Err(self.time_out(&mut st, (seq, description), timeout, &missing));
            }
            st = group.wait(st, deadline - now);
        }
    }

    /// Breaks the group at collective #`seq` (`description`) because ranks `missing` did not
    /// arrive within `timeout`.
    fn time_out(
        &self,
        st: &mut GroupState,
        (seq, description): (u64, &str),
        timeout: Duration,
        missing: &[usize],
    ) -> Error {
        let error = Error::new(
            ErrorKind::CommTimeout,
            format!(
                "host group: collective #{seq} {description} timed out after {} ms on rank {}: ranks {missing:?} did not arrive",
                timeout.as_millis(),
                self.rank
            ),
        );
        self.fail(st, seq, Cause::Timeout, error.clone());
        error
    }

    /// Breaks the group at collective #`seq` and wakes every waiting rank.
    fn fail(&self, st: &mut GroupState, seq: u64, cause: Cause, error: Error) {
        st.gathering = None;
        st.failure = Some(Failure { seq, cause, error });
        self.group.cv.notify_all();
    }

    /// Ends collective #`seq` once its last chunk ran: released with its scalars, or failed
    /// for every participant if a chunk panicked.
    fn complete(st: &mut GroupState, seq: u64, work: &Work, scalars: Vec<u64>, rank: usize) {
        st.gathering = None;
        match work.panic_message() {
            None => {
                st.completed = seq + 1;
                st.scalars = scalars;
            }
            Some(message) => {
                st.failure = Some(Failure {
                    seq,
                    cause: Cause::Panic,
                    error: Error::new(
                        ErrorKind::Panic,
                        format!(
                            "host group: collective #{seq} {} panicked (noticed on rank {rank}): {message}",
                            describe(&work.posts()[0])
                        ),
                    ),
                });
            }
        }
    }
}

//! A host group's shared state and its rendezvous: each rank posts its collective, the last
//! to arrive starts it, the ranks share its work, and a timeout, mismatch, invalid argument or
//! panic breaks the group for every rank (see the parent module for the rules).

use std::sync::{Arc, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::collective::{Item, Kind, describe, same_descs};
use super::work::Work;
use super::{HostComm, HostGroup};
use crate::error::{Error, ErrorKind, Result};

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

pub(super) struct GroupState {
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

impl GroupState {
    pub(super) fn new(world_size: usize) -> GroupState {
        GroupState {
            entered: vec![0; world_size],
            completed: 0,
            gathering: None,
            scalars: Vec::new(),
            failure: None,
        }
    }
}

impl HostGroup {
    pub(super) fn lock(&self) -> MutexGuard<'_, GroupState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn wait<'a>(&self, guard: MutexGuard<'a, GroupState>, timeout: Duration) -> MutexGuard<'a, GroupState> {
        self.cv
            .wait_timeout(guard, timeout)
            .unwrap_or_else(PoisonError::into_inner)
            .0
    }
}

impl HostComm {
    /// Breaks the group because this rank's arguments are invalid, so nobody waits for it.
    pub(super) fn fail_invalid(&self, err: Error) -> Error {
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
    pub(super) fn run(&self, items: Vec<Item>) -> Result<Vec<u64>> {
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

//! Host streams and events, ordered exactly as CUDA streams and events.
//!
//! - The **compute stream** is the calling thread: its work has run by the time a call
//!   returns, so it needs no type. Recording an event on it completes the event at once
//!   ([`HostEvent::record_on_compute`]); making it wait on an event blocks the calling thread
//!   ([`HostEvent::synchronize`]).
//! - The **comm stream** is a [`HostStream`]: a worker thread that runs queued closures one at a
//!   time in FIFO order. In [`CommMode::Eager`] it runs each op as soon as it can; in
//!   [`CommMode::Lazy`] it runs ops only when a wait needs them (an event wait or
//!   [`HostStream::synchronize`]), and then only up to the point waited for, so a missing wait
//!   reads stale data deterministically.
//!
//! An event recorded on a comm stream captures a *ticket*: the number of ops enqueued so far.
//! It is complete once that many ops have completed. Re-recording replaces the ticket (the
//! latest record counts); an event never recorded, or last recorded on the compute stream, is
//! complete.
//!
//! # Errors
//! When an op returns an error or panics ([`ErrorKind::Panic`]), the stream fails: the ops
//! queued behind it are dropped without running, `enqueue` returns the error, and every wait
//! for work at or after the failed op (every later `synchronize`, every event recorded after
//! it was enqueued) returns the error. A wait for work that completed before the failed op
//! succeeds, so the outcome of each wait depends only on the program, not on thread timing.

use std::collections::VecDeque;
use std::env::VarError;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use crate::bail;
use crate::config::CommMode;
use crate::error::{Error, ErrorKind, Result};

/// The environment variable read by [`resolve_comm_mode`] for [`CommMode::FromEnv`].
pub const COMM_MODE_ENV: &str = "MUON_HOST_COMM_MODE";

/// Resolves [`CommMode::FromEnv`] from [`COMM_MODE_ENV`] (`eager` or `lazy`; unset or empty
/// means eager); other modes are returned unchanged. An invalid value is an
/// `InvalidEnumValue` error naming the variable.
pub fn resolve_comm_mode(mode: CommMode) -> Result<CommMode> {
    if mode != CommMode::FromEnv {
        return Ok(mode);
    }
    match std::env::var(COMM_MODE_ENV) {
        Err(VarError::NotPresent) => Ok(CommMode::Eager),
        Err(VarError::NotUnicode(value)) => {
            bail!(
                InvalidEnumValue,
                "{COMM_MODE_ENV}: value {value:?} is not valid Unicode; valid values are eager, lazy"
            )
        }
        Ok(value) => match value.as_str() {
            "" | "eager" => Ok(CommMode::Eager),
            "lazy" => Ok(CommMode::Lazy),
            other => bail!(
                InvalidEnumValue,
                "{COMM_MODE_ENV}: unknown value '{other}'; valid values are eager, lazy"
            ),
        },
    }
}

/// One queued op of a comm stream.
type StreamOp = Box<dyn FnOnce() -> Result<()> + Send + 'static>;

struct State {
    queue: VecDeque<StreamOp>,
    /// Ops ever enqueued; the ticket of an event recorded now.
    enqueued: u64,
    /// Ops completed successfully, in order.
    completed: u64,
    /// Lazy mode: ops with index below this may run.
    demanded: u64,
    /// Index of the op that failed, and its error.
    failure: Option<(u64, Error)>,
    shutdown: bool,
}

struct Shared {
    lazy: bool,
    state: Mutex<State>,
    cv: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Blocks until the first `ticket` ops completed (in lazy mode, demanding them first).
    fn wait_for(&self, ticket: u64) -> Result<()> {
        let mut st = self.lock();
        if self.lazy && st.demanded < ticket {
            st.demanded = ticket;
            self.cv.notify_all();
        }
        loop {
            if st.completed >= ticket {
                return Ok(());
            }
            if let Some((_, error)) = &st.failure {
                return Err(error.clone());
            }
            if st.shutdown {
                bail!(
                    InvalidState,
                    "comm stream: destroyed before the awaited work ran ({} of {ticket} ops completed)",
                    st.completed
                );
            }
            // Ends: the worker completes or fails every op it runs (panics are caught), and
            // shutdown wakes every waiter.
            st = self.cv.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// The worker thread: runs ops in order until shutdown or the first failure.
    fn work(&self) {
        loop {
            let op = {
                let mut st = self.lock();
                loop {
                    if st.shutdown || st.failure.is_some() {
                        return;
                    }
                    if !st.queue.is_empty() && (!self.lazy || st.completed < st.demanded) {
                        break st.queue.pop_front();
                    }
                    st = self.cv.wait(st).unwrap_or_else(PoisonError::into_inner);
                }
            };
            let Some(op) = op else { continue };
            let outcome = catch_unwind(AssertUnwindSafe(op));
            let dropped = {
                let mut st = self.lock();
                let index = st.completed;
                let dropped = match outcome {
                    Ok(Ok(())) => {
                        st.completed += 1;
                        VecDeque::new()
                    }
                    Ok(Err(error)) => {
                        st.failure = Some((index, error));
                        std::mem::take(&mut st.queue)
                    }
                    Err(payload) => {
                        let error = Error::new(
                            ErrorKind::Panic,
                            format!(
                                "comm stream: op #{index} panicked: {}",
                                crate::error::panic_text(payload.as_ref())
                            ),
                        );
                        st.failure = Some((index, error));
                        std::mem::take(&mut st.queue)
                    }
                };
                self.cv.notify_all();
                dropped
            };
            drop(dropped);
        }
    }
}

/// A comm stream: a worker thread running queued ops in FIFO order (see the module docs).
///
/// Dropping it discards the ops that have not started (they never run), waits for the running
/// op to finish (a collective ends at the latest when its group timeout expires) and joins the
/// worker; waits on its events that are still pending then fail with `InvalidState`.
/// Synchronize first to run everything.
pub struct HostStream {
    shared: Arc<Shared>,
    worker: Option<JoinHandle<()>>,
}

impl HostStream {
    /// Starts a comm stream. [`CommMode::FromEnv`] is resolved by [`resolve_comm_mode`].
    pub fn new(mode: CommMode) -> Result<HostStream> {
        let lazy = resolve_comm_mode(mode)? == CommMode::Lazy;
        let shared = Arc::new(Shared {
            lazy,
            state: Mutex::new(State {
                queue: VecDeque::new(),
                enqueued: 0,
                completed: 0,
                demanded: 0,
                failure: None,
                shutdown: false,
            }),
            cv: Condvar::new(),
        });
        let worker_shared = shared.clone();
        let worker = std::thread::Builder::new()
            .name("muon-comm-stream".to_string())
            .spawn(move || worker_shared.work())
            .map_err(|err| {
                Error::new(
                    ErrorKind::Internal,
                    format!("comm stream: cannot start its worker thread: {err}"),
                )
            })?;
        Ok(HostStream {
            shared,
            worker: Some(worker),
        })
    }

    /// The resolved mode: [`CommMode::Eager`] or [`CommMode::Lazy`].
    pub fn mode(&self) -> CommMode {
        if self.shared.lazy {
            CommMode::Lazy
        } else {
            CommMode::Eager
        }
    }

    /// Appends `op` to the queue. Fails with the stream's error if an earlier op failed.
    pub fn enqueue(&self, op: impl FnOnce() -> Result<()> + Send + 'static) -> Result<()> {
        let mut st = self.shared.lock();
        if let Some((_, error)) = &st.failure {
            return Err(error.clone());
        }
        st.queue.push_back(Box::new(op));
        st.enqueued += 1;
        self.shared.cv.notify_all();
        Ok(())
    }

    /// `cudaEventRecord(event, comm)`: `event` completes when every op enqueued so far has
    /// completed. Replaces any earlier record of `event`.
    pub fn record_on_comm(&self, event: &HostEvent) {
        let ticket = self.shared.lock().enqueued;
        event.set(Some((self.shared.clone(), ticket)));
    }

    /// `cudaStreamWaitEvent(comm, event)`: ops enqueued after this call run only after
    /// `event`'s current record completed. A no-op for a complete or never-recorded event and
    /// for an event recorded on this stream (FIFO order already implies it). For an event of
    /// another stream the wait is a queued op, so it drives that stream in lazy mode when this
    /// one runs, and fails this stream if that stream failed. Fails like [`HostStream::enqueue`].
    pub fn comm_wait_event(&self, event: &HostEvent) -> Result<()> {
        match event.get() {
            Some((stream, ticket)) if !Arc::ptr_eq(&stream, &self.shared) => {
                self.enqueue(move || stream.wait_for(ticket))
            }
            _ => Ok(()),
        }
    }

    /// `cudaStreamSynchronize(comm)`: blocks until every op enqueued so far has completed (in
    /// lazy mode, runs them). Returns the stream's error if an op failed.
    pub fn synchronize(&self) -> Result<()> {
        let ticket = self.shared.lock().enqueued;
        self.shared.wait_for(ticket)
    }
}

impl Drop for HostStream {
    fn drop(&mut self) {
        let dropped = {
            let mut st = self.shared.lock();
            st.shutdown = true;
            self.shared.cv.notify_all();
            std::mem::take(&mut st.queue)
        };
        drop(dropped);
        if let Some(worker) = self.worker.take() {
            // The worker catches every panic of an op, so join only fails if dropping a
            // discarded op panicked there; nothing is left to clean up in that case.
            let _ = worker.join();
        }
    }
}

/// An event with CUDA semantics (see the module docs). Shareable between threads.
#[derive(Default)]
pub struct HostEvent {
    record: Mutex<Option<(Arc<Shared>, u64)>>,
}

impl HostEvent {
    /// A never-recorded event (complete).
    pub fn new() -> HostEvent {
        HostEvent::default()
    }

    /// `cudaEventRecord(event, compute)`: the compute stream's work has already run, so the
    /// event is complete. Replaces any earlier record.
    pub fn record_on_compute(&self) {
        self.set(None);
    }

    /// The compute stream waits for the event (`cudaStreamWaitEvent(compute, event)`, which
    /// on the host is `cudaEventSynchronize`): blocks the calling thread until the event's
    /// latest record completed; in lazy mode this runs the recording stream's ops up to the
    /// record and no further. Returns at once for a complete or never-recorded event. Fails
    /// with the stream's error if an op at or before the record failed.
    pub fn synchronize(&self) -> Result<()> {
        match self.get() {
            Some((stream, ticket)) => stream.wait_for(ticket),
            None => Ok(()),
        }
    }

    fn get(&self) -> Option<(Arc<Shared>, u64)> {
        self.record.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn set(&self, record: Option<(Arc<Shared>, u64)>) {
        *self.record.lock().unwrap_or_else(PoisonError::into_inner) = record;
    }
}

//! Device time of every action, for `muon-opt measure` ([`crate::measure`]). [`Timed`] runs
//! another executor and, while its log records, brackets each action that does device work
//! with two timing marks on the action's stream. A mark completes once its stream has run
//! everything before it, so the times are read when the schedule synchronizes that stream
//! (`Action::Synchronize`): no extra host synchronization is added to the step.

use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::sys as cu;

use crate::backend::cuda::Executor;
use crate::backend::cuda::action::{Action, Buf, DevPtr};
use crate::backend::cuda::device::{Device, driver_check};
use crate::backend::ops::StreamKind;
use crate::error::Result;

/// An executor that can time its streams.
pub trait Marker: Executor {
    /// Records a mark on `stream` after everything issued to it so far; returns its id.
    fn mark(&mut self, stream: StreamKind) -> Result<usize>;
    /// Seconds from mark `from` to mark `to`, both on a stream that has since been
    /// synchronized; releases both marks.
    fn take_seconds(&mut self, from: usize, to: usize) -> Result<f64>;
}

/// One timed action and its device time.
#[derive(Debug, Clone)]
pub struct Timing {
    pub action: Action,
    pub seconds: f64,
}

/// What a [`Timed`] executor recorded; shared with whoever reads the times.
#[derive(Debug, Default)]
pub struct TimingLog {
    recording: bool,
    pending: Vec<(Action, StreamKind, usize, usize)>,
    done: Vec<Timing>,
    /// Work actions and event records/waits issued while recording.
    issued: (u64, u64),
}

/// A [`TimingLog`] shared between the executor and its reader.
pub type SharedLog = Arc<Mutex<TimingLog>>;

impl TimingLog {
    /// Starts timing the actions that follow.
    pub fn start(&mut self) {
        self.recording = true;
    }

    /// Stops timing; actions not yet read stay pending until their stream synchronizes.
    pub fn stop(&mut self) {
        self.recording = false;
    }

    /// The timed actions whose stream has synchronized since, in issue order per stream;
    /// clears them from the log.
    pub fn take(&mut self) -> Vec<Timing> {
        std::mem::take(&mut self.done)
    }

    /// Work actions and event records or waits issued while recording.
    pub fn counts(&self) -> (u64, u64) {
        self.issued
    }

    /// Actions timed but not yet read (their stream has not synchronized).
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

/// The stream an action does device work on, if it does any that is worth timing.
pub fn work_stream(action: &Action) -> Option<StreamKind> {
    match action {
        Action::Launch(l) => Some(l.stream),
        Action::Gemm(_) => Some(StreamKind::Compute),
        Action::Nccl(..) => Some(StreamKind::Comm),
        Action::Zero { stream, .. } | Action::CopyDevice { stream, .. } | Action::CopyDevice2D { stream, .. } => {
            Some(*stream)
        }
        Action::Alloc { .. }
        | Action::CopyIn { .. }
        | Action::CopyInAsync { .. }
        | Action::CopyOut { .. }
        | Action::Record { .. }
        | Action::Wait { .. }
        | Action::Synchronize(_) => None,
    }
}

/// Runs `inner`, timing each work action while the log records.
pub struct Timed<E: Marker> {
    inner: E,
    log: SharedLog,
}

impl<E: Marker> Timed<E> {
    pub fn new(inner: E, log: SharedLog) -> Self {
        Timed { inner, log }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TimingLog> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads the marks of every pending action on `stream`, which has just synchronized.
    fn settle(&mut self, stream: StreamKind) -> Result<()> {
        let pending = std::mem::take(&mut self.lock().pending);
        let mut still = Vec::new();
        let mut done = Vec::new();
        for (action, on, from, to) in pending {
            if on == stream {
                let seconds = self.inner.take_seconds(from, to)?;
                done.push(Timing { action, seconds });
            } else {
                still.push((action, on, from, to));
            }
        }
        let mut log = self.lock();
        log.pending = still;
        log.done.extend(done);
        Ok(())
    }
}

impl<E: Marker> Executor for Timed<E> {
    fn run(&mut self, actions: &[Action], bind: &mut dyn FnMut(Buf, DevPtr, u64)) -> Result<Vec<Vec<u8>>> {
        let mut out = Vec::new();
        for action in actions {
            let one = std::slice::from_ref(action);
            let timed = {
                let mut log = self.lock();
                if log.recording && matches!(action, Action::Record { .. } | Action::Wait { .. }) {
                    log.issued.1 += 1;
                }
                if log.recording { work_stream(action) } else { None }
            };
            match timed {
                Some(stream) => {
                    let from = self.inner.mark(stream)?;
                    out.extend(self.inner.run(one, bind)?);
                    let to = self.inner.mark(stream)?;
                    let mut log = self.lock();
                    log.pending.push((action.clone(), stream, from, to));
                    log.issued.0 += 1;
                }
                None => out.extend(self.inner.run(one, bind)?),
            }
            if let Action::Synchronize(stream) = action {
                self.settle(*stream)?;
            }
        }
        Ok(out)
    }
}

pub(crate) type ElapsedTime = unsafe extern "C" fn(*mut f32, cu::CUevent, cu::CUevent) -> cu::CUresult;

/// `cuEventElapsedTime` of the loaded driver. The CUDA 13 headers (and so the binding) only
/// declare `cuEventElapsedTime_v2`, new in 12.8; the library runs on 12.4 drivers, and every
/// driver keeps exporting the first version, so it is looked up by name (then `_v2`).
pub(crate) fn elapsed_time() -> Result<ElapsedTime> {
    // SAFETY: dlopen of the driver library the backend already loaded (RTLD_NOLOAD).
    let lib = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if lib.is_null() {
        crate::bail!(
            CudaUnavailable,
            "libcuda.so.1 is not loaded: no timing without the driver"
        );
    }
    for name in [c"cuEventElapsedTime", c"cuEventElapsedTime_v2"] {
        // SAFETY: dlsym on a live handle.
        let ptr = unsafe { libc::dlsym(lib, name.as_ptr()) };
        if !ptr.is_null() {
            // SAFETY: both names have the C signature of `ElapsedTime`.
            return Ok(unsafe { std::mem::transmute::<*mut std::ffi::c_void, ElapsedTime>(ptr) });
        }
    }
    crate::bail!(
        CudaUnavailable,
        "libcuda.so.1 exports neither cuEventElapsedTime nor cuEventElapsedTime_v2"
    )
}

/// The timing events of a [`Device`], created on first use and reused.
#[derive(Debug, Default)]
pub struct TimingEvents {
    events: Vec<cu::CUevent>,
    free: Vec<usize>,
}

impl TimingEvents {
    fn take(&mut self) -> Result<usize> {
        if let Some(id) = self.free.pop() {
            return Ok(id);
        }
        let mut event = std::ptr::null_mut();
        // SAFETY: plain out-parameter in the current context; timing enabled (flags 0).
        driver_check(|| "cuEventCreate (timing)".into(), unsafe {
            cu::cuEventCreate(&mut event, 0)
        })?;
        self.events.push(event);
        Ok(self.events.len() - 1)
    }

    /// Destroys every event (teardown, in the device's context).
    pub(crate) fn destroy(&mut self) {
        for event in self.events.drain(..) {
            // SAFETY: created by `take`, destroyed once.
            unsafe { cu::cuEventDestroy_v2(event) };
        }
        self.free.clear();
    }
}

impl Marker for Device {
    fn mark(&mut self, stream: StreamKind) -> Result<usize> {
        let _current = self.enter()?;
        let id = self.timing.take()?;
        let handle = self.stream(stream);
        // SAFETY: our event on a live stream of this context.
        driver_check(|| "cuEventRecord (timing)".into(), unsafe {
            cu::cuEventRecord(self.timing.events[id], handle)
        })?;
        Ok(id)
    }

    fn take_seconds(&mut self, from: usize, to: usize) -> Result<f64> {
        let _current = self.enter()?;
        let elapsed = elapsed_time()?;
        let mut ms = 0.0f32;
        // SAFETY: two recorded events of this context whose stream has synchronized.
        driver_check(|| "cuEventElapsedTime".into(), unsafe {
            elapsed(&mut ms, self.timing.events[from], self.timing.events[to])
        })?;
        self.timing.free.extend([from, to]);
        Ok(f64::from(ms) * 1e-3)
    }
}

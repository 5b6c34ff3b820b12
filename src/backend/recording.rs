//! A backend wrapper that logs every [`Backend`] call as its comparable [`Op`] value and
//! forwards it. It lets a test check that two backends receive the identical operation
//! sequence for the same plan and iteration, and tee the sequence into a device-free
//! consumer (the CUDA translator's dry run).

use std::ffi::c_void;
use std::sync::{Arc, Mutex, PoisonError};

use crate::backend::Backend;
use crate::backend::ops::{NormTerm, Op, Scalar, Span};
use crate::error::Result;

/// Receives every op a [`Recording`] forwards, before it is forwarded.
pub trait Observer: Send {
    fn observe(&mut self, op: &Op);
}

/// A plain log.
impl Observer for Vec<Op> {
    fn observe(&mut self, op: &Op) {
        self.push(op.clone());
    }
}

/// A shared observer, readable after the recording backend is gone.
impl<T: Observer> Observer for Arc<Mutex<T>> {
    fn observe(&mut self, op: &Op) {
        self.lock().unwrap_or_else(PoisonError::into_inner).observe(op);
    }
}

/// A tee: both observers see every op, the first one first.
impl<A: Observer, B: Observer> Observer for (A, B) {
    fn observe(&mut self, op: &Op) {
        self.0.observe(op);
        self.1.observe(op);
    }
}

/// Logs every call into `observer`, then forwards it to `inner` unchanged.
pub struct Recording<B, O> {
    inner: B,
    // A mutex because `address` and `mxfp8_addresses` take `&self`.
    observer: Mutex<O>,
}

impl<B: Backend, O: Observer> Recording<B, O> {
    pub fn new(inner: B, observer: O) -> Self {
        Recording {
            inner,
            observer: Mutex::new(observer),
        }
    }

    /// The wrapped backend and the observer.
    pub fn into_parts(self) -> (B, O) {
        (
            self.inner,
            self.observer.into_inner().unwrap_or_else(PoisonError::into_inner),
        )
    }

    fn note(&self, op: &Op) {
        self.observer.lock().unwrap_or_else(PoisonError::into_inner).observe(op);
    }
}

impl<B: Backend, O: Observer> Backend for Recording<B, O> {
    fn execute(&mut self, op: &Op) -> Result<()> {
        self.note(op);
        self.inner.execute(op)
    }

    fn download(&mut self, src: Span) -> Result<Vec<f32>> {
        self.note(&Op::Download(src));
        self.inner.download(src)
    }

    fn download_mxfp8(&mut self, param: u32, part: u8) -> Result<Vec<u8>> {
        self.note(&Op::DownloadMxfp8 { param, part });
        self.inner.download_mxfp8(param, part)
    }

    fn read_scalars(&mut self) -> Result<[f64; Scalar::COUNT]> {
        self.note(&Op::ReadScalars);
        self.inner.read_scalars()
    }

    fn all_gather_u64(&mut self, value: u64) -> Result<Vec<u64>> {
        self.note(&Op::AllGatherU64 { value });
        self.inner.all_gather_u64(value)
    }

    fn mxfp8_addresses(&self, param: u32) -> Option<[*mut u8; 4]> {
        self.note(&Op::Mxfp8Addresses(param));
        self.inner.mxfp8_addresses(param)
    }

    fn address(&self, span: Span) -> *mut c_void {
        self.note(&Op::Address(span));
        self.inner.address(span)
    }

    fn norm_term(&self) -> Result<NormTerm> {
        self.inner.norm_term()
    }
}

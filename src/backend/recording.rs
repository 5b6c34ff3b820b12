//! A backend wrapper that logs every [`Backend`] call as a comparable [`Op`] value and
//! forwards it. It lets a test check that two backends receive the identical operation
//! sequence for the same plan and iteration, and tee the sequence into a device-free
//! consumer (the CUDA translator's dry run).

use std::ffi::c_void;
use std::sync::{Arc, Mutex, PoisonError};

use crate::backend::Backend;
use crate::backend::ops::{
    AdamwJob, CollOp, EventId, InitAt, InitValues, MemoryLayout, MuonJob, NormTerm, Scalar, Span, StepConstants,
    StreamKind,
};
use crate::config::Dtype;
use crate::error::Result;

/// One backend call with its arguments. Floating-point arguments of the plain calls are kept
/// as bits so that NaN compares equal to itself; the float fields of the jobs compare by value
/// (the schedule issues jobs only for finite steps).
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Allocate(MemoryLayout),
    /// The values as f32 bits.
    Upload {
        dst: Span,
        bits: Vec<u32>,
    },
    Download(Span),
    MemsetZero(Span),
    Cast {
        src: Span,
        dst: Span,
    },
    AttachInit {
        param: u32,
        dtype: Dtype,
        numel: u64,
        source: InitSource,
    },
    DetachInit(u32),
    SquaredNorm {
        counted: Vec<Span>,
        checked: Vec<Span>,
    },
    GatherNormSums,
    FinishStep {
        constants: StepConstants,
        terms: Vec<NormTerm>,
    },
    /// The arguments as f32 bits.
    SetStepArgs([u32; 4]),
    SetStepCount(u64),
    ReadScalars,
    MuonUpdate(MuonJob),
    AdamwUpdate(AdamwJob),
    Record {
        stream: StreamKind,
        event: EventId,
    },
    Wait {
        stream: StreamKind,
        event: EventId,
    },
    Collectives(Vec<CollOp>),
    AllGatherU64 {
        value: u64,
    },
    Mxfp8Quantize {
        stream: StreamKind,
        src: Span,
        param: u32,
    },
    Mxfp8Addresses(u32),
    DownloadMxfp8 {
        param: u32,
        part: u8,
    },
    Synchronize,
    Address(Span),
}

/// The values of an [`Op::AttachInit`]: host values as their bytes, device values by address.
#[derive(Debug, Clone, PartialEq)]
pub enum InitSource {
    Host(Vec<u8>),
    Device(u64),
}

impl Op {
    /// `Op::AttachInit` of `init`.
    pub fn attach_init(param: u32, init: InitValues<'_>) -> Op {
        Op::AttachInit {
            param,
            dtype: init.dtype,
            numel: init.numel,
            source: match init.at {
                InitAt::Host(bytes) => InitSource::Host(bytes.to_vec()),
                InitAt::Device(address) => InitSource::Device(address),
            },
        }
    }

    /// `Op::Upload` of `values`.
    pub fn upload(dst: Span, values: &[f32]) -> Op {
        Op::Upload {
            dst,
            bits: values.iter().map(|v| v.to_bits()).collect(),
        }
    }

    /// `Op::SetStepArgs` of `args`.
    pub fn set_step_args(args: [f32; 4]) -> Op {
        Op::SetStepArgs(args.map(f32::to_bits))
    }
}

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

    fn note(&self, op: Op) {
        self.observer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .observe(&op);
    }
}

impl<B: Backend, O: Observer> Backend for Recording<B, O> {
    fn allocate(&mut self, layout: &MemoryLayout) -> Result<()> {
        self.note(Op::Allocate(layout.clone()));
        self.inner.allocate(layout)
    }

    fn upload(&mut self, dst: Span, values: &[f32]) -> Result<()> {
        self.note(Op::upload(dst, values));
        self.inner.upload(dst, values)
    }

    fn download(&mut self, src: Span) -> Result<Vec<f32>> {
        self.note(Op::Download(src));
        self.inner.download(src)
    }

    fn download_mxfp8(&mut self, param: u32, part: u8) -> Result<Vec<u8>> {
        self.note(Op::DownloadMxfp8 { param, part });
        self.inner.download_mxfp8(param, part)
    }

    fn memset_zero(&mut self, span: Span) -> Result<()> {
        self.note(Op::MemsetZero(span));
        self.inner.memset_zero(span)
    }

    fn cast(&mut self, src: Span, dst: Span) -> Result<()> {
        self.note(Op::Cast { src, dst });
        self.inner.cast(src, dst)
    }

    fn attach_init(&mut self, param: u32, init: InitValues<'_>) -> Result<()> {
        self.note(Op::attach_init(param, init));
        self.inner.attach_init(param, init)
    }

    fn detach_init(&mut self, param: u32) -> Result<()> {
        self.note(Op::DetachInit(param));
        self.inner.detach_init(param)
    }

    fn squared_norm(&mut self, counted: &[Span], checked: &[Span]) -> Result<()> {
        self.note(Op::SquaredNorm {
            counted: counted.to_vec(),
            checked: checked.to_vec(),
        });
        self.inner.squared_norm(counted, checked)
    }

    fn gather_norm_sums(&mut self) -> Result<()> {
        self.note(Op::GatherNormSums);
        self.inner.gather_norm_sums()
    }

    fn norm_term(&self) -> Result<NormTerm> {
        self.inner.norm_term()
    }

    fn finish_step(&mut self, constants: &StepConstants, terms: &[NormTerm]) -> Result<()> {
        self.note(Op::FinishStep {
            constants: *constants,
            terms: terms.to_vec(),
        });
        self.inner.finish_step(constants, terms)
    }

    fn set_step_args(&mut self, args: [f32; 4]) -> Result<()> {
        self.note(Op::set_step_args(args));
        self.inner.set_step_args(args)
    }

    fn set_step_count(&mut self, step: u64) -> Result<()> {
        self.note(Op::SetStepCount(step));
        self.inner.set_step_count(step)
    }

    fn read_scalars(&mut self) -> Result<[f64; Scalar::COUNT]> {
        self.note(Op::ReadScalars);
        self.inner.read_scalars()
    }

    fn muon_update(&mut self, job: &MuonJob) -> Result<()> {
        self.note(Op::MuonUpdate(job.clone()));
        self.inner.muon_update(job)
    }

    fn adamw_update(&mut self, job: &AdamwJob) -> Result<()> {
        self.note(Op::AdamwUpdate(job.clone()));
        self.inner.adamw_update(job)
    }

    fn record(&mut self, stream: StreamKind, event: EventId) -> Result<()> {
        self.note(Op::Record { stream, event });
        self.inner.record(stream, event)
    }

    fn wait(&mut self, stream: StreamKind, event: EventId) -> Result<()> {
        self.note(Op::Wait { stream, event });
        self.inner.wait(stream, event)
    }

    fn collectives(&mut self, ops: &[CollOp]) -> Result<()> {
        self.note(Op::Collectives(ops.to_vec()));
        self.inner.collectives(ops)
    }

    fn all_gather_u64(&mut self, value: u64) -> Result<Vec<u64>> {
        self.note(Op::AllGatherU64 { value });
        self.inner.all_gather_u64(value)
    }

    fn mxfp8_quantize(&mut self, stream: StreamKind, src: Span, param: u32) -> Result<()> {
        self.note(Op::Mxfp8Quantize { stream, src, param });
        self.inner.mxfp8_quantize(stream, src, param)
    }

    fn mxfp8_addresses(&self, param: u32) -> Option<[*mut u8; 4]> {
        self.note(Op::Mxfp8Addresses(param));
        self.inner.mxfp8_addresses(param)
    }

    fn synchronize(&mut self) -> Result<()> {
        self.note(Op::Synchronize);
        self.inner.synchronize()
    }

    fn address(&self, span: Span) -> *mut c_void {
        self.note(Op::Address(span));
        self.inner.address(span)
    }
}

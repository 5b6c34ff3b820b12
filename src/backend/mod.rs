//! Backends execute the schedule's operations ([`ops::Op`]); they make no decisions of their
//! own. The host backend runs them on the CPU (the executable specification); the cuda backend
//! runs the same sequence on the caller's stream and NCCL communicator.

pub mod cuda;
pub mod host;
pub mod ops;
pub mod recording;

use std::ffi::c_void;

use crate::error::Result;
use ops::{
    AdamwJob, CollOp, EventId, InitValues, MemoryLayout, MuonJob, NormTerm, Op, STEP_ARGS, Scalar, Span, StepConstants,
    StreamKind,
};

/// What the schedule needs from a backend: [`Backend::execute`] runs every command (an [`Op`]
/// that returns nothing), the queries have a method each. Compute-stream operations are
/// ordered by call order; comm-stream operations by call order on the comm stream; the two
/// streams are ordered only by events, exactly as CUDA orders them.
///
/// The provided methods name the commands for the schedule; each builds its [`Op`] (whose
/// documentation says what it does) and executes it.
pub trait Backend: Send {
    /// Runs the command `op`. A query op (`Download`, `DownloadMxfp8`, `ReadScalars`,
    /// `AllGatherU64`, `Mxfp8Addresses`, `Address`) is not a command: call its method.
    fn execute(&mut self, op: &Op) -> Result<()>;
    /// [`Op::Download`]: reads `src` as f32 (exact for bf16).
    fn download(&mut self, src: Span) -> Result<Vec<f32>>;
    /// [`Op::DownloadMxfp8`]: the bytes of part `part` (in the order of
    /// [`Backend::mxfp8_addresses`]) of `param`'s MXFP8 storage.
    fn download_mxfp8(&mut self, param: u32, part: u8) -> Result<Vec<u8>>;
    /// [`Op::ReadScalars`]: every scalar, indexed by [`Scalar::slot`].
    fn read_scalars(&mut self) -> Result<[f64; Scalar::COUNT]>;
    /// [`Op::AllGatherU64`]: every rank's `value`, indexed by rank.
    fn all_gather_u64(&mut self, value: u64) -> Result<Vec<u64>>;
    /// Every rank of the tensor-parallel or norm group's `value`, indexed by its rank in that
    /// group (host-synchronizing), for a backend that holds the group's communicator.
    fn peer_all_gather_u64(&mut self, group: PeerGroup, _value: u64) -> Result<Vec<u64>> {
        crate::bail!(
            Internal,
            "this backend exchanges nothing over the {} group",
            group.name()
        )
    }
    /// [`Op::Mxfp8Addresses`]: the four parts of `param`'s MXFP8 storage, or None.
    fn mxfp8_addresses(&self, param: u32) -> Option<[*mut u8; 4]>;
    /// [`Op::Address`]: address of the first element of `span` (host or device), for views.
    fn address(&self, span: Span) -> *mut c_void;
    /// This backend's gathered sums as another backend of the rank reads them in a shared step
    /// (valid once its `gather_norm_sums` is done on the compute stream).
    fn norm_term(&self) -> Result<NormTerm>;

    /// [`Op::Allocate`].
    fn allocate(&mut self, layout: &MemoryLayout) -> Result<()> {
        self.execute(&Op::Allocate(layout.clone()))
    }
    /// [`Op::Upload`] of `values`.
    fn upload(&mut self, dst: Span, values: &[f32]) -> Result<()> {
        self.execute(&Op::upload(dst, values))
    }
    /// [`Op::MemsetZero`].
    fn memset_zero(&mut self, stream: StreamKind, span: Span) -> Result<()> {
        self.execute(&Op::MemsetZero { stream, span })
    }
    /// [`Op::Cast`].
    fn cast(&mut self, src: Span, dst: Span) -> Result<()> {
        self.execute(&Op::Cast { src, dst })
    }
    /// [`Op::Copy`].
    fn copy(&mut self, stream: StreamKind, src: Span, dst: Span) -> Result<()> {
        self.execute(&Op::Copy { stream, src, dst })
    }
    /// [`Op::AttachInit`] of `init`.
    fn attach_init(&mut self, param: u32, init: InitValues<'_>) -> Result<()> {
        self.execute(&Op::attach_init(param, init))
    }
    /// [`Op::DetachInit`].
    fn detach_init(&mut self, param: u32) -> Result<()> {
        self.execute(&Op::DetachInit(param))
    }
    /// [`Op::SquaredNorm`].
    fn squared_norm(&mut self, counted: Vec<Span>, checked: Vec<Span>) -> Result<()> {
        self.execute(&Op::SquaredNorm { counted, checked })
    }
    /// [`Op::GatherNormSums`].
    fn gather_norm_sums(&mut self) -> Result<()> {
        self.execute(&Op::GatherNormSums)
    }
    /// [`Op::FinishStep`].
    fn finish_step(&mut self, constants: &StepConstants, terms: &[NormTerm]) -> Result<()> {
        self.execute(&Op::FinishStep {
            constants: *constants,
            terms: terms.to_vec(),
        })
    }
    /// [`Op::SetStepArgs`] of `args`.
    fn set_step_args(&mut self, args: [f32; STEP_ARGS]) -> Result<()> {
        self.execute(&Op::set_step_args(args))
    }
    /// [`Op::SetStepCount`].
    fn set_step_count(&mut self, step: u64) -> Result<()> {
        self.execute(&Op::SetStepCount(step))
    }
    /// [`Op::MuonUpdate`].
    fn muon_update(&mut self, job: MuonJob) -> Result<()> {
        self.execute(&Op::MuonUpdate(job))
    }
    /// [`Op::AdamwUpdate`].
    fn adamw_update(&mut self, job: AdamwJob) -> Result<()> {
        self.execute(&Op::AdamwUpdate(job))
    }
    /// [`Op::QkClip`].
    fn qk_clip(&mut self, job: ops::QkClipJob) -> Result<()> {
        self.execute(&Op::QkClip(job))
    }
    /// [`Op::Record`].
    fn record(&mut self, stream: StreamKind, event: EventId) -> Result<()> {
        self.execute(&Op::Record { stream, event })
    }
    /// [`Op::Wait`].
    fn wait(&mut self, stream: StreamKind, event: EventId) -> Result<()> {
        self.execute(&Op::Wait { stream, event })
    }
    /// [`Op::Collectives`].
    fn collectives(&mut self, ops: Vec<CollOp>) -> Result<()> {
        self.execute(&Op::Collectives(ops))
    }
    /// [`Op::Mxfp8Quantize`].
    fn mxfp8_quantize(&mut self, stream: StreamKind, src: Span, param: u32) -> Result<()> {
        self.execute(&Op::Mxfp8Quantize { stream, src, param })
    }
    /// [`Op::Synchronize`].
    fn synchronize(&mut self) -> Result<()> {
        self.execute(&Op::Synchronize)
    }
}

/// A group besides the data-parallel one that the optimizer was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerGroup {
    Tensor,
    Norm,
}

impl PeerGroup {
    pub fn name(self) -> &'static str {
        match self {
            PeerGroup::Tensor => "tensor-parallel",
            PeerGroup::Norm => "norm",
        }
    }
}

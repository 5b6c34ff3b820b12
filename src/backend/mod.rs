//! Backends execute the schedule's operations; they make no decisions of their own. The
//! host backend runs them on the CPU (the executable specification); the cuda backend runs
//! the same sequence on the caller's stream and NCCL communicator.

pub mod cuda;
pub mod host;
pub mod ops;
pub mod recording;

use std::ffi::c_void;

use crate::error::Result;
use ops::{
    AdamwJob, CollOp, EventId, InitValues, MemoryLayout, MuonJob, NormTerm, Scalar, Span, StepConstants, StreamKind,
};

/// What the schedule needs from a backend. Compute-stream operations are ordered by call
/// order; comm-stream operations by call order on the comm stream; the two streams are
/// ordered only by events, exactly as CUDA orders them.
pub trait Backend: Send {
    /// Allocates every buffer and state array (zeroed).
    fn allocate(&mut self, layout: &MemoryLayout) -> Result<()>;
    /// Writes host f32 values into `dst`, converting to its dtype (round to nearest even).
    fn upload(&mut self, dst: Span, values: &[f32]) -> Result<()>;
    /// Reads `src` as f32 (exact for bf16).
    fn download(&mut self, src: Span) -> Result<Vec<f32>>;
    /// Compute stream: zero `span`.
    fn memset_zero(&mut self, span: Span) -> Result<()>;
    /// Compute stream: `dst = src`, converted (f32 → bf16 rounds to nearest even).
    fn cast(&mut self, src: Span, dst: Span) -> Result<()>;
    /// Makes `init` readable as `Mem::Init(param)` (host values are copied in; device values
    /// are read in place, so they must stay valid until `detach_init`).
    fn attach_init(&mut self, param: u32, init: InitValues<'_>) -> Result<()>;
    /// Ends `Mem::Init(param)` once the compute stream has finished reading it (blocks until
    /// then): what `attach_init` copied is freed, and device values may be freed by their owner.
    fn detach_init(&mut self, param: u32) -> Result<()>;
    /// Compute stream: Σ x² over `counted` in f64, spans in order
    /// ([`crate::numerics::squared_norm`] per span), plus 0 · Σ x² over `checked` (a finite
    /// sum is unchanged to the bit; a NaN or infinity in `checked` makes it NaN), into
    /// [`Scalar::NormSq`].
    fn squared_norm(&mut self, counted: &[Span], checked: &[Span]) -> Result<()>;
    /// Comm stream: every rank's [`Scalar::NormSq`], kept in rank order for `finish_step`.
    fn gather_norm_sums(&mut self) -> Result<()>;
    /// This backend's gathered sums as another backend of the rank reads them in a shared step
    /// (valid once its `gather_norm_sums` is done on the compute stream).
    fn norm_term(&self) -> Result<NormTerm>;
    /// Compute stream, after the `gather_norm_sums` of every term's backend: the step's scalars
    /// from the terms' sums, in order, and the steps taken so far
    /// ([`crate::numerics::step_scalars`]).
    fn finish_step(&mut self, constants: &StepConstants, terms: &[NormTerm]) -> Result<()>;
    /// Compute stream, without blocking the host: the step's arguments into [`Scalar::Lr`],
    /// [`Scalar::WeightDecay`], [`Scalar::AdamLr`] and [`Scalar::AdamWeightDecay`].
    fn set_step_args(&mut self, args: [f32; 4]) -> Result<()>;
    /// Compute stream: [`Scalar::Step`] = `step` (a loaded checkpoint's count).
    fn set_step_count(&mut self, step: u64) -> Result<()>;
    /// Compute stream, host-synchronizing: every scalar, indexed by [`Scalar::slot`].
    fn read_scalars(&mut self) -> Result<[f64; Scalar::COUNT]>;
    /// Compute stream: one Muon update with the step's scalars (none when skipped).
    fn muon_update(&mut self, job: &MuonJob) -> Result<()>;
    /// Compute stream: one AdamW update with the step's scalars (none when skipped).
    fn adamw_update(&mut self, job: &AdamwJob) -> Result<()>;
    /// Records `event` on `stream`.
    fn record(&mut self, stream: StreamKind, event: EventId) -> Result<()>;
    /// `stream` waits for `event` (the compute stream blocks the caller on the host).
    fn wait(&mut self, stream: StreamKind, event: EventId) -> Result<()>;
    /// Comm stream: the collectives as one group.
    fn collectives(&mut self, ops: &[CollOp]) -> Result<()>;
    /// Comm stream, host-synchronizing: every rank's `value`, indexed by rank (checkpoint
    /// agreement and per-file checksums).
    fn all_gather_u64(&mut self, value: u64) -> Result<Vec<u64>>;
    /// On `stream`: quantizes the bf16 values of `src` (param `param`'s `[rows, cols]`) into
    /// the param's persistent MXFP8 storage, rowwise and columnwise (docs/mxfp8.md, TE-exact).
    fn mxfp8_quantize(&mut self, stream: StreamKind, src: Span, param: u32) -> Result<()>;
    /// Rowwise data, rowwise scales, columnwise data, columnwise scales of `param`'s MXFP8
    /// storage, or None when the param has none.
    fn mxfp8_addresses(&self, param: u32) -> Option<[*mut u8; 4]>;
    /// Compute stream, host-synchronizing: the bytes of part `part` (in the order of
    /// [`Backend::mxfp8_addresses`]) of `param`'s MXFP8 storage.
    fn download_mxfp8(&mut self, param: u32, part: u8) -> Result<Vec<u8>>;
    /// Blocks until both streams finished everything enqueued.
    fn synchronize(&mut self) -> Result<()>;
    /// Address of the first element of `span` (host or device), for views.
    fn address(&self, span: Span) -> *mut c_void;
}

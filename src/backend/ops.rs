//! The operations the schedule asks a backend to run: [`Op`], one value per operation, and
//! the types its arguments are made of. Everything is named by memory kind and element range;
//! the schedule decides every offset, event and collective, the backend only executes
//! (docs/design.md §5).
//!
//! A command (an op that returns nothing) reaches a backend as an [`Op`] through
//! [`crate::backend::Backend::execute`]; the queries (ops that return values) have a
//! `Backend` method each. The cuda backend translates every command
//! ([`crate::backend::cuda::translate::Translator::translate`]) and answers the queries from
//! its translator and device, the host backend runs each in its `execute`, and
//! [`crate::backend::recording::Recording`] logs them.

mod layout;
mod qk_clip;

use std::sync::{Arc, Mutex};

use crate::config::Dtype;
use crate::numerics::RankNorm;
use crate::numerics::muon::TpJob;
use crate::numerics::step_args::ParamScales;

pub use layout::{BufferSizes, MemoryLayout, MuonWork, Mxfp8Tensor, TpComponent};
pub use qk_clip::{QkClipJob, QkMaxima};

/// One backend operation with its arguments. Floating-point arguments of the plain ops are kept
/// as bits so that NaN compares equal to itself; the float fields of the jobs compare by value
/// (the schedule issues jobs only for finite steps).
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Allocates every buffer and state array (zeroed).
    Allocate(MemoryLayout),
    /// Writes host values (f32 bits) into `dst`, converting to its dtype (round to nearest
    /// even).
    Upload { dst: Span, bits: Vec<u32> },
    /// Query: reads the span as f32 (exact for bf16).
    Download(Span),
    /// `stream`: zero the span.
    MemsetZero { stream: StreamKind, span: Span },
    /// Compute stream: `dst = src`, converted (f32 → bf16 rounds to nearest even).
    Cast { src: Span, dst: Span },
    /// `stream`: `dst = src`, bytes for bytes (the same dtype and length, different memory).
    Copy { stream: StreamKind, src: Span, dst: Span },
    /// Makes the values readable as `Mem::Init(param)` (host values are copied in; device
    /// values are read in place, so they must stay valid until the compute stream has read
    /// them: the runtime synchronizes before it returns from writing the initial values).
    AttachInit {
        param: u32,
        dtype: Dtype,
        numel: u64,
        source: InitSource,
    },
    /// Ends `Mem::Init(param)`; what `AttachInit` copied is freed once the ops queued before
    /// have read it (at once on the host, whose compute stream is the calling thread).
    DetachInit(u32),
    /// Compute stream: this rank's exact Σ x² over `counted` and the non-finite values of
    /// `counted` and `checked` ([`crate::numerics::SquareSum`]; a NaN or infinity in `checked`
    /// makes the sum NaN), with the steps it has taken ([`crate::numerics::RankNorm`]).
    SquaredNorm { counted: Vec<Span>, checked: Vec<Span> },
    /// Comm stream: every rank's sum of `SquaredNorm`, kept in rank order for `FinishStep`.
    GatherNormSums,
    /// Compute stream, after the `GatherNormSums` of every term's backend: the step's scalars
    /// from the terms' sums, in order, and the steps taken so far
    /// ([`crate::numerics::step_scalars`]).
    FinishStep {
        constants: StepConstants,
        terms: Vec<NormTerm>,
    },
    /// Compute stream, without blocking the host: the step's arguments (f32 bits) into the
    /// [`STEP_ARGS`] slots from [`Scalar::Lr`] to [`Scalar::DecoupledLr`]
    /// ([`crate::schedule::StepArgs::slots`]).
    SetStepArgs([u32; STEP_ARGS]),
    /// Compute stream: [`Scalar::Step`] = the count (a loaded checkpoint's).
    SetStepCount(u64),
    /// Query, compute stream, host-synchronizing: every scalar, indexed by [`Scalar::slot`].
    ReadScalars,
    /// Compute stream: one Muon update with the step's scalars (none when skipped).
    MuonUpdate(MuonJob),
    /// Compute stream: one AdamW update with the step's scalars (none when skipped).
    AdamwUpdate(AdamwJob),
    /// Compute stream: QK-clip of an owner's master after its update ([`QkClipJob`]).
    QkClip(QkClipJob),
    /// Records `event` on `stream`.
    Record { stream: StreamKind, event: EventId },
    /// `stream` waits for `event` (the compute stream blocks the caller on the host).
    Wait { stream: StreamKind, event: EventId },
    /// Comm stream: the collectives as one group.
    Collectives(Vec<CollOp>),
    /// Query, comm stream, host-synchronizing: every rank's `value`, indexed by rank
    /// (checkpoint agreement and per-file checksums).
    AllGatherU64 { value: u64 },
    /// On `stream`: quantizes the bf16 values of `src` (param `param`'s `[rows, cols]`) into
    /// the param's persistent MXFP8 storage, rowwise and columnwise (docs/mxfp8.md, TE-exact).
    Mxfp8Quantize { stream: StreamKind, src: Span, param: u32 },
    /// Query: rowwise data, rowwise scales, columnwise data, columnwise scales of the param's
    /// MXFP8 storage, or None when the param has none.
    Mxfp8Addresses(u32),
    /// Query, compute stream, host-synchronizing: the bytes of part `part` (in the order of
    /// `Mxfp8Addresses`) of `param`'s MXFP8 storage.
    DownloadMxfp8 { param: u32, part: u8 },
    /// Blocks until both streams finished everything enqueued.
    Synchronize,
    /// Query: address of the first element of the span (host or device), for views.
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
    pub fn set_step_args(args: [f32; STEP_ARGS]) -> Op {
        Op::SetStepArgs(args.map(f32::to_bits))
    }
}

/// A memory allocation of one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mem {
    /// Param buffer `i` of the plan (model dtype); with `param_sharding = sharded`, its gather
    /// window (the slots the rank's gathered buckets of the buffer are gathered into).
    Param(u32),
    /// Grad buffer `i` of the plan (grad dtype); with `param_sharding = sharded`, the transient
    /// gradients of the gather window.
    Grad(u32),
    /// With `param_sharding = sharded`: the persistent model-dtype values of what this rank
    /// owns of buffer `i` (its range of each bucket of it, back to back).
    OwnedParam(u32),
    /// With `param_sharding = sharded`: the reduced gradients (grad dtype) of what this rank
    /// owns of buffer `i`, laid out as `OwnedParam(i)`.
    OwnedGrad(u32),
    /// fp32 masters of everything this rank owns (Muon units, then AdamW shard pieces).
    Master,
    /// fp32 Muon momentum of the owned units (same layout as the Muon part of `Master`).
    Momentum,
    /// fp32 NorMuon second moment of the owned units (`muon_variant = normuon`): per unit, per
    /// component, one value per line of its longer side (`numerics::normuon`).
    Moment2,
    /// fp32 AdamW first moment of the owned pieces.
    ExpAvg,
    /// fp32 AdamW second moment of the owned pieces.
    ExpAvgSq,
    /// The bytes of grad buffer `i` viewed as bf16: MXFP8 params are staged here after the
    /// step (element `e` of the staging view is bytes `2e..2e+2` of the grad buffer).
    Staging(u32),
    /// Param `p`'s initial values in the dtype the caller gave them, readable between
    /// [`crate::backend::Backend::attach_init`] and `detach_init` of `p`.
    Init(u32),
}

/// `len` elements of `mem` starting at element `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Span {
    pub mem: Mem,
    pub start: u64,
    pub len: u64,
}

impl Span {
    pub fn new(mem: Mem, start: u64, len: u64) -> Self {
        Span { mem, start, len }
    }
}

/// A param's initial values as the caller gave them (f32 or bf16), for
/// [`crate::backend::Backend::attach_init`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InitValues<'a> {
    pub dtype: Dtype,
    pub numel: u64,
    pub at: InitAt<'a>,
}

/// Where [`InitValues`] are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum InitAt<'a> {
    /// `numel` values in host memory, as laid out in memory.
    Host(&'a [u8]),
    /// `numel` values at this device address, in the backend's context (the cuda backend's
    /// copy made at registration).
    Device(u64),
}

/// The two streams of a rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamKind {
    /// The caller's stream (the calling thread on the host backend).
    Compute,
    /// The library's communication stream.
    Comm,
}

/// An event slot, numbered by the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventId(pub usize);

/// One in-place collective on a span of a buffer (NCCL semantics, sum).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollOp {
    /// `ncclReduce` in place onto `root`.
    Reduce { root: u32, span: Span },
    /// `ncclBroadcast` in place from `root`.
    Broadcast { root: u32, span: Span },
    /// `ncclReduceScatter` in place: `span` holds dp equal chunks; rank r's chunk gets the sum.
    ReduceScatter { span: Span },
    /// `ncclAllGather` in place: rank r contributes chunk r of `span`.
    AllGather { span: Span },
    /// `ncclAllReduce` in place.
    AllReduce { span: Span },
}

/// The step's scalars, resident in device memory (f64 slots; f32 values are stored exactly):
/// the step writes them on the streams and the update kernels read them, so a step needs no
/// host round trip and a captured step replays with new values. `kernels/muon_common.cuh`
/// numbers the slots alike (`MUON_SCALAR_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scalar {
    /// ‖g‖ of the mean gradient over every rank (NaN or inf when skipped).
    GradNorm,
    /// The clip multiplier (1 when clipping is off, not needed or skipped).
    ClipCoef,
    /// What the updates multiply the summed gradients by before `clip_coef`: `1/dp`.
    GradScale,
    /// 1 when a non-finite gradient skips the step (every update leaves its state as is).
    Skip,
    /// Optimizer steps taken (skipped steps excluded), the AdamW `t`.
    Step,
    /// AdamW bias corrections `1 − β1^t`, `1 − β2^t`, with the step's β1 and β2.
    Bc1,
    Bc2,
    /// The step's arguments (`StepArgs::slots`), copied in asynchronously at the start of the
    /// step: the learning rates and weight decays, then the Muon momentum and the AdamW β1,
    /// β2 and ε (a step's overrides, else the config's), then the learning rate of the AdamW
    /// params flagged `EMBEDDING_OR_OUTPUT` (the step's decoupled one, else the AdamW one).
    Lr,
    WeightDecay,
    AdamLr,
    AdamWeightDecay,
    MuonMomentum,
    AdamBeta1,
    AdamBeta2,
    AdamEps,
    DecoupledLr,
    /// Ranks the norm is gathered over that have taken different numbers of steps (the step
    /// is skipped): the optimizer of the shared step, 1 + the rank (0 when they agree), its
    /// steps and its rank 0's ([`crate::numerics::StepsDisagree`]).
    DisagreeTerm,
    DisagreeRank,
    DisagreeSteps,
    DisagreeRank0Steps,
}

impl Scalar {
    pub const COUNT: usize = 20;
    pub const ALL: [Scalar; Scalar::COUNT] = [
        Scalar::GradNorm,
        Scalar::ClipCoef,
        Scalar::GradScale,
        Scalar::Skip,
        Scalar::Step,
        Scalar::Bc1,
        Scalar::Bc2,
        Scalar::Lr,
        Scalar::WeightDecay,
        Scalar::AdamLr,
        Scalar::AdamWeightDecay,
        Scalar::MuonMomentum,
        Scalar::AdamBeta1,
        Scalar::AdamBeta2,
        Scalar::AdamEps,
        Scalar::DecoupledLr,
        Scalar::DisagreeTerm,
        Scalar::DisagreeRank,
        Scalar::DisagreeSteps,
        Scalar::DisagreeRank0Steps,
    ];

    /// The slot's index.
    pub fn slot(self) -> usize {
        self as usize
    }
}

/// Scalars of a step's arguments ([`Op::SetStepArgs`]): the slots from [`Scalar::Lr`] to
/// [`Scalar::DecoupledLr`].
pub const STEP_ARGS: usize = 9;

/// The constants the step's scalars are derived with ([`crate::numerics::step_scalars`]; the
/// AdamW betas of the bias corrections are the step's, [`Scalar::AdamBeta1`] and
/// [`Scalar::AdamBeta2`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepConstants {
    pub clip_grad: f32,
}

/// Most optimizers one step can share a clip between ([`NormTerm`]s of one `finish_step`; the
/// `muon_norm_terms` struct of `kernels/step.cu` has this many entries).
pub const MAX_NORM_TERMS: usize = 8;

/// One optimizer's part of the step's gradient norm: its gathered Σ g² (`ranks` sums, one per
/// rank of its norm group, each of its mean gradient's squares). A step has one term, or one
/// per optimizer when several optimizers of a rank share one clip (`muon_optimizers_step`).
#[derive(Debug, Clone, PartialEq)]
pub struct NormTerm {
    pub ranks: usize,
    pub sums: NormSums,
}

/// Where a [`NormTerm`]'s gathered sums are, after the `gather_norm_sums` of its optimizer.
#[derive(Debug, Clone)]
pub enum NormSums {
    /// The backend's own (the one running `finish_step`).
    Own,
    /// Another host backend's, read under its lock.
    Host(Arc<Mutex<Vec<RankNorm>>>),
    /// Another cuda backend's receive slots on the same device and stream.
    Device(u64),
}

impl PartialEq for NormSums {
    /// The same memory.
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (NormSums::Own, NormSums::Own) => true,
            (NormSums::Host(a), NormSums::Host(b)) => Arc::ptr_eq(a, b),
            (NormSums::Device(a), NormSums::Device(b)) => a == b,
            _ => false,
        }
    }
}

/// One Muon matrix update (docs/design.md §6) on fp32 state.
#[derive(Debug, Clone, PartialEq)]
pub struct MuonJob {
    pub master: Span,
    pub momentum: Span,
    /// The NorMuon second moment of the job's units (`MuonOptions::moment2_len` values; empty
    /// for standard Muon).
    pub moment2: Span,
    /// The reduced gradient (grad dtype).
    pub grad: Span,
    pub rows: usize,
    pub cols: usize,
    /// Rows of each fused component; empty = not fused.
    pub split_rows: Vec<usize>,
    /// Groups the components are interleaved in ([`crate::numerics::muon::MuonShape`]).
    pub split_groups: usize,
    /// A tensor-parallel shard (`muon_tp_mode` duplicated or distributed), with the dimension
    /// it is split along.
    pub tp: Option<TpJob>,
    /// The multipliers of the step's learning rate and weight decay (the gradient scale comes
    /// from the step's scalars too).
    pub scales: ParamScales,
}

/// One AdamW update of a contiguous piece.
#[derive(Debug, Clone, PartialEq)]
pub struct AdamwJob {
    pub master: Span,
    pub exp_avg: Span,
    pub exp_avg_sq: Span,
    /// The reduced gradient (grad dtype).
    pub grad: Span,
    /// The multipliers of the step's learning rate and weight decay (the betas, ε, gradient
    /// scale and bias corrections come from the step's scalars too).
    pub scales: ParamScales,
    /// The step's learning rate: [`Scalar::AdamLr`], or [`Scalar::DecoupledLr`] for an
    /// embedding or output param.
    pub lr: Scalar,
}

//! Backend operation → device actions, without a device. Every decision of the cuda backend
//! is made here (pointers, grids, kernel arguments, cuBLAS parameters, NCCL calls);
//! [`super::device::Device`] only executes. Because the
//! translation needs no driver, the no-GPU tests run every schedule op through it.
//!
//! Numerics follow the host backend operation for operation (`src/numerics`): element-wise
//! kernels round like the host (bit-identical), sums of squares are f64 over exact squares in
//! a fixed order that differs from the host's 8-lane order (see `kernels/reduce.cu`), and the
//! Newton–Schulz products run on cuBLAS with the host's operand roundings but cuBLAS's
//! accumulation order.

mod init;
mod qk_clip;

use std::collections::HashMap;

use crate::backend::cuda::action::{
    Action, Arg, Buf, DevPtr, Gemm, GemmInputs, Kernel, Launch, NcclCall, NcclComm, NcclType, Work,
};
use crate::backend::ops::{
    AdamwJob, CollOp, EventId, MAX_NORM_TERMS, Mem, MemoryLayout, MuonJob, MuonWork, NormSums, NormTerm, Op, Scalar,
    Span, StepConstants, StreamKind,
};
use crate::bail;
use crate::config::{Dtype, NsPrecision, TpMode};
use crate::error::Result;
use crate::numerics::bf16::f32_to_bf16_rne;
use crate::numerics::muon::{MuonOptions, MuonShape, TpDim, TpJob, muon_scale};
use crate::numerics::mxfp8::{Direction, ScaleLayout, scale_shape};
use crate::numerics::newton_schulz::ns_coefficients;

/// Threads per block of every 1-D kernel.
const THREADS: u32 = 256;
/// Most blocks of a grid-stride launch (enough to fill any current GPU).
const MAX_BLOCKS: u64 = 8192;
/// Spans (or groups) per sum-of-squares launch: the fixed arrays of `kernels/reduce.cu`.
const SUMSQ_SPANS: usize = 32;
/// Elements per block of a sum-of-squares span before it gets another block.
const SUMSQ_BLOCK_ELEMS: u64 = 4096;
/// Most blocks per span (so one launch writes at most `SUMSQ_SPANS * SUMSQ_MAX_BLOCKS` partials).
const SUMSQ_MAX_BLOCKS: u64 = 2048;
/// Capacity of the partials workspace.
const PARTIALS: u64 = SUMSQ_SPANS as u64 * SUMSQ_MAX_BLOCKS;
/// Scalar slot of an exchange's send value, right after the step's scalars.
const SEND_SLOT: u64 = Scalar::COUNT as u64;
/// First of the `dp` receive slots (an exchange's values, the gathered Σ g² of the step).
const RECEIVE_SLOTS: u64 = SEND_SLOT + 1;
/// MXFP8 quantize: most tile rows covered by separate blocks (the kernel strides over more).
const MXFP8_MAX_GRID_Y: u64 = 1024;

/// A span resolved to device memory.
#[derive(Debug, Clone, Copy)]
struct Resolved {
    ptr: DevPtr,
    dtype: Dtype,
    len: u64,
}

impl Resolved {
    fn is_bf16(&self) -> i32 {
        i32::from(self.dtype == Dtype::Bf16)
    }

    fn bytes(&self) -> u64 {
        self.len * self.dtype.size() as u64
    }

    /// Element `index` of the span.
    fn at(&self, index: u64) -> DevPtr {
        self.ptr + index * self.dtype.size() as u64
    }
}

/// Element capacities of the Muon workspace, the real need of the rank's jobs
/// ([`crate::backend::ops::MuonWork`]).
#[derive(Debug, Clone, Copy, Default)]
struct WorkSizes {
    /// Elements of `Update`, `X`, `XNext`, `XBf16`: the largest job's `rows · cols`.
    matrix: u64,
    /// Elements of `Gram`, `Poly`, `GramBf16`: the largest `batch · min(r, c)²` of a batch of
    /// equal components.
    gram: u64,
    /// f64 slots of `Norms`: the most matrices of one batch.
    norms: u64,
}

/// Translates the ops of one rank.
#[derive(Debug)]
pub struct Translator {
    rank: usize,
    dp: usize,
    muon: MuonOptions,
    map: HashMap<Buf, (DevPtr, u64)>,
    layout: Option<MemoryLayout>,
    work: WorkSizes,
    /// Ranks of the norm group, when the gradient norm is summed over one.
    norm_group: Option<usize>,
    /// (ranks, this rank) of the tensor-parallel group TP shards are orthogonalized over.
    tp_group: Option<(usize, usize)>,
    /// Initial values attached by param, for the writes at finalize.
    init: HashMap<u32, init::Attached>,
}

/// The translation's own events around a tensor-parallel collective (the schedule numbers its
/// events from 0 up): its input is ready on the compute stream, its result on the comm stream.
const TP_INPUT_READY: EventId = EventId(usize::MAX - 1);
const TP_RESULT_READY: EventId = EventId(usize::MAX);

fn grid_1d(n: u64) -> [u32; 3] {
    [n.div_ceil(THREADS as u64).clamp(1, MAX_BLOCKS) as u32, 1, 1]
}

fn launch(kernel: Kernel, n: u64, stream: StreamKind, args: Vec<Arg>) -> Action {
    Action::Launch(Launch {
        kernel,
        grid: grid_1d(n),
        block: [THREADS, 1, 1],
        stream,
        args,
    })
}

fn to_i32(what: &str, value: u64) -> Result<i32> {
    i32::try_from(value).or_else(|_| bail!(Unsupported, "{what} {value} exceeds cuBLAS's 32-bit dimensions"))
}

fn to_u32(what: &str, value: u64) -> Result<u32> {
    u32::try_from(value).or_else(|_| bail!(Unsupported, "{what} {value} exceeds the kernels' 32-bit dimensions"))
}

/// One row-major product `C (m×n) = alpha·A (m×k)·op(B) + beta·C` per matrix of a batch of
/// contiguous matrices; `B` is `k×n`, or `n×k` read transposed when `b_transposed`. The same
/// call as the host's `gemm` in `numerics::newton_schulz`.
struct Product {
    inputs: GemmInputs,
    m: u64,
    k: u64,
    n: u64,
    alpha: f32,
    a: DevPtr,
    b: DevPtr,
    b_transposed: bool,
    beta: f32,
    c: DevPtr,
    batch: u64,
}

impl Product {
    /// The product as cuBLAS's column-major `Cᵀ = op(B)ᵀ·Aᵀ`: a row-major matrix is its
    /// column-major transpose, so A and B swap places and the dimensions read `n, m, k`.
    fn gemm(self) -> Result<Action> {
        let (m, k, n) = (self.m, self.k, self.n);
        Ok(Action::Gemm(Gemm {
            inputs: self.inputs,
            transpose_a: self.b_transposed,
            m: to_i32("Newton–Schulz dimension", n)?,
            n: to_i32("Newton–Schulz dimension", m)?,
            k: to_i32("Newton–Schulz dimension", k)?,
            alpha: self.alpha,
            a: self.b,
            lda: to_i32("leading dimension", if self.b_transposed { k } else { n })?,
            stride_a: (k * n) as i64,
            b: self.a,
            ldb: to_i32("leading dimension", k)?,
            stride_b: (m * k) as i64,
            beta: self.beta,
            c: self.c,
            ldc: to_i32("leading dimension", n)?,
            stride_c: (m * n) as i64,
            batch: to_i32("batch", self.batch)?,
        }))
    }
}

/// The words of `struct muon_sumsq_spans` (`kernels/reduce.cu`): per span the pointer, the
/// length, then `is_bf16 | first_block << 32`; then the count.
fn sumsq_spans(spans: &[(SumSpan, u32)]) -> Vec<u64> {
    let mut words = vec![0u64; SUMSQ_SPANS * 3 + 1];
    for (i, (s, first_block)) in spans.iter().enumerate() {
        words[3 * i] = s.span.ptr;
        words[3 * i + 1] = s.span.len;
        let flags = s.span.is_bf16() as u64 | (u64::from(s.check_only) << 1);
        words[3 * i + 2] = flags | (u64::from(*first_block) << 32);
    }
    words[SUMSQ_SPANS * 3] = spans.len() as u64;
    words
}

/// One group of `struct muon_sumsq_groups`: partials `[first, first + count)` into `out`.
#[derive(Clone, Copy)]
struct Group {
    first: u32,
    count: u32,
    out: u32,
    accumulate: bool,
}

/// The words of `struct muon_sumsq_groups`.
fn sumsq_groups(groups: &[Group]) -> Vec<u64> {
    let mut words = vec![0u64; SUMSQ_SPANS * 2 + 1];
    for (i, g) in groups.iter().enumerate() {
        words[2 * i] = u64::from(g.first) | (u64::from(g.count) << 32);
        words[2 * i + 1] = u64::from(g.out) | (u64::from(g.accumulate) << 32);
    }
    words[SUMSQ_SPANS * 2] = groups.len() as u64;
    words
}

/// One span of a sum of squares; a `check_only` span adds its squares times 0 (non-finite
/// values still make the sum NaN).
#[derive(Clone, Copy)]
struct SumSpan {
    span: Resolved,
    check_only: bool,
}

/// Where sums of squares go.
#[derive(Clone, Copy)]
enum SumInto {
    Total,
    PerSpan,
}

/// Copies between a per-group split matrix in param row order (`param`) and in component order
/// (`ordered`), one copy per (component, group) block (`numerics::muon::component_row_order`);
/// `to_param` copies back.
fn group_copies(param: DevPtr, ordered: DevPtr, split: &[u64], groups: u64, cols: u64, to_param: bool) -> Vec<Action> {
    let group_rows = split.iter().sum::<u64>() / groups;
    let mut actions = Vec::new();
    let (mut offset, mut component_start) = (0u64, 0u64);
    for &rows in split {
        let part = rows / groups;
        for g in 0..groups {
            let at_param = param + (g * group_rows + offset) * cols * 4;
            let at_ordered = ordered + (component_start + g * part) * cols * 4;
            let (src, dst) = if to_param {
                (at_ordered, at_param)
            } else {
                (at_param, at_ordered)
            };
            actions.push(Action::CopyDevice {
                dst,
                src,
                bytes: part * cols * 4,
                stream: StreamKind::Compute,
            });
        }
        offset += part;
        component_start += rows;
    }
    actions
}

/// How a Newton–Schulz input is split over the tensor-parallel group.
#[derive(Clone, Copy)]
enum Sharding {
    /// Not split: the iterate is the input or, when it is tall, its transpose.
    None,
    /// The iterate (the input, or its transpose with `transpose`) is one shard of a matrix
    /// split along its columns: the norm and every Gram matrix are all-reduced.
    Columns { transpose: bool },
}

/// `call` on the tensor-parallel communicator, after the compute stream's work so far and
/// before any later compute (the translation's own two events).
fn on_tp_comm(actions: &mut Vec<Action>, call: NcclCall) {
    actions.extend([
        Action::Record {
            stream: StreamKind::Compute,
            event: TP_INPUT_READY,
        },
        Action::Wait {
            stream: StreamKind::Comm,
            event: TP_INPUT_READY,
        },
        Action::Nccl(NcclComm::Tensor, vec![call]),
        Action::Record {
            stream: StreamKind::Comm,
            event: TP_RESULT_READY,
        },
        Action::Wait {
            stream: StreamKind::Compute,
            event: TP_RESULT_READY,
        },
    ]);
}

/// An in-place sum of `count` values at `ptr` over the group.
fn all_reduce(ptr: DevPtr, count: u64, dtype: NcclType) -> NcclCall {
    NcclCall::AllReduce {
        send: ptr,
        recv: ptr,
        count,
        dtype,
    }
}

/// The whole shape of a tensor-parallel component whose shard is `rows × cols`, split along
/// `dim` over `ranks` ranks.
fn whole_shape(dim: TpDim, rows: u64, cols: u64, ranks: u64) -> (u64, u64) {
    match dim {
        TpDim::Rows => (ranks * rows, cols),
        TpDim::Cols => (rows, ranks * cols),
    }
}

/// Blocks of one span of a sum-of-squares launch.
fn sumsq_blocks(len: u64) -> u32 {
    len.div_ceil(SUMSQ_BLOCK_ELEMS).clamp(1, SUMSQ_MAX_BLOCKS) as u32
}

impl Translator {
    /// A translator for rank `rank` of `dp` with the Muon options of the config.
    pub fn new(rank: usize, dp: usize, muon: MuonOptions) -> Self {
        Translator {
            rank,
            dp,
            muon,
            map: HashMap::new(),
            layout: None,
            work: WorkSizes::default(),
            norm_group: None,
            tp_group: None,
            init: HashMap::new(),
        }
    }

    /// Orthogonalizes tensor-parallel shards over a TP group of `size` ranks, this one being
    /// `rank`.
    pub fn with_tp_group(mut self, size: usize, rank: usize) -> Self {
        self.tp_group = Some((size, rank));
        self
    }

    /// Sums the gradient norm over a norm group of `size` ranks (spanning this rank's
    /// data-parallel group) instead of the data-parallel group alone.
    pub fn with_norm_group(mut self, size: usize) -> Self {
        self.norm_group = Some(size);
        self
    }

    /// Ranks whose Σ g² make the global norm.
    fn norm_ranks(&self) -> usize {
        self.norm_group.unwrap_or(self.dp)
    }

    /// Ranks of the tensor-parallel group (1 without one).
    fn tp_ranks(&self) -> usize {
        self.tp_group.map_or(1, |(size, _)| size)
    }

    /// This backend's gathered sums as another cuda backend of the rank reads them.
    pub fn norm_term(&self) -> Result<NormTerm> {
        Ok(NormTerm {
            ranks: self.norm_ranks(),
            dp: self.dp,
            sums: NormSums::Device(self.slot(RECEIVE_SLOTS)?),
        })
    }

    /// The allocations a backend makes at creation, before `allocate`: the step's scalars
    /// ([`Scalar`]), the send slot of an exchange and one receive slot per rank.
    pub fn setup(&self) -> Vec<Action> {
        vec![
            Action::Alloc {
                buf: Buf::Scalars,
                bytes: (RECEIVE_SLOTS + self.dp.max(self.norm_ranks()).max(self.tp_ranks()) as u64) * 8,
            },
            // Zeroed on the compute stream; the comm stream uses the slots next.
            Action::Synchronize(StreamKind::Compute),
        ]
    }

    /// Records where `buf` was allocated.
    pub fn bind(&mut self, buf: Buf, ptr: DevPtr, bytes: u64) {
        self.map.insert(buf, (ptr, bytes));
    }

    fn buffer(&self, buf: Buf) -> Result<(DevPtr, u64)> {
        match self.map.get(&buf) {
            Some(&entry) => Ok(entry),
            None => bail!(Internal, "{buf:?} is not allocated"),
        }
    }

    fn layout(&self) -> Result<&MemoryLayout> {
        match &self.layout {
            Some(layout) => Ok(layout),
            None => bail!(Internal, "the cuda backend is not allocated"),
        }
    }

    fn work(&self, work: Work) -> Result<DevPtr> {
        Ok(self.buffer(Buf::Work(work))?.0)
    }

    /// Scalar slot `i` (f64).
    fn slot(&self, i: u64) -> Result<DevPtr> {
        Ok(self.buffer(Buf::Scalars)?.0 + 8 * i)
    }

    /// The slot of `scalar`.
    fn scalar(&self, scalar: Scalar) -> Result<DevPtr> {
        self.slot(scalar.slot() as u64)
    }

    /// The device memory of `span`, bounds-checked; a staging span views its grad buffer's
    /// bytes as bf16 (as on the host).
    fn resolve(&self, span: Span) -> Result<Resolved> {
        let layout = self.layout()?;
        let (mem, dtype) = match span.mem {
            Mem::Staging(i) => (Mem::Grad(i), Dtype::Bf16),
            Mem::Grad(_) => (span.mem, layout.grad_dtype),
            Mem::Param(i) => match layout.buffers.get(i as usize) {
                Some(sizes) => (span.mem, sizes.dtype),
                None => bail!(Internal, "{:?} is not allocated", span.mem),
            },
            Mem::Master | Mem::Momentum | Mem::ExpAvg | Mem::ExpAvgSq => (span.mem, Dtype::F32),
            Mem::Init(p) => (span.mem, self.init_dtype(p)?),
        };
        let (ptr, bytes) = self.buffer(Buf::Mem(mem))?;
        let capacity = bytes / dtype.size() as u64;
        if span.start + span.len > capacity {
            bail!(Internal, "span {span:?} exceeds its allocation of {capacity} elements");
        }
        Ok(Resolved {
            ptr: ptr + span.start * dtype.size() as u64,
            dtype,
            len: span.len,
        })
    }

    fn resolve_f32(&self, span: Span) -> Result<Resolved> {
        let r = self.resolve(span)?;
        if r.dtype != Dtype::F32 {
            bail!(Internal, "{:?} is not f32", span.mem);
        }
        Ok(r)
    }

    /// The element type of `span`'s memory.
    pub fn dtype(&self, span: Span) -> Result<Dtype> {
        Ok(self.resolve(span)?.dtype)
    }

    /// Device address of the first element of `span`.
    pub fn address(&self, span: Span) -> Result<DevPtr> {
        Ok(self.resolve(span)?.ptr)
    }

    /// Device addresses of `param`'s MXFP8 storage, or None when it has none.
    pub fn mxfp8_addresses(&self, param: u32) -> Option<[DevPtr; 4]> {
        let part = |part: u8| self.map.get(&Buf::Mxfp8 { param, part }).map(|&(ptr, _)| ptr);
        Some([part(0)?, part(1)?, part(2)?, part(3)?])
    }

    /// Every rank of the tensor-parallel group's `value` (a host-synchronizing exchange on the
    /// TP communicator, for the agreement at finalize).
    pub fn tp_exchange(&self, value: u64) -> Result<Vec<Action>> {
        self.exchange_on(NcclComm::Tensor, self.tp_ranks(), value.to_le_bytes())
    }

    /// The all-gather of `value` over the norm group (finalize's agreement).
    pub fn norm_exchange(&self, value: u64) -> Result<Vec<Action>> {
        self.exchange_on(NcclComm::Norm, self.norm_ranks(), value.to_le_bytes())
    }

    fn exchange(&self, value: [u8; 8]) -> Result<Vec<Action>> {
        self.exchange_on(NcclComm::Data, self.dp, value)
    }

    /// The all-gather of one 8-byte value per rank of `comm` (`ranks` ranks): the value goes
    /// to the send slot, the ranks' values come back in rank order (`ranks · 8` bytes, the
    /// result of the actions).
    fn exchange_on(&self, comm: NcclComm, ranks: usize, value: [u8; 8]) -> Result<Vec<Action>> {
        let (send, recv) = (self.slot(SEND_SLOT)?, self.slot(RECEIVE_SLOTS)?);
        Ok(vec![
            Action::CopyIn {
                dst: send,
                bytes: value.to_vec(),
                stream: StreamKind::Comm,
            },
            Action::Nccl(
                comm,
                vec![NcclCall::AllGather {
                    send,
                    recv,
                    send_count: 8,
                    dtype: NcclType::U8,
                }],
            ),
            Action::CopyOut {
                src: recv,
                bytes: 8 * ranks as u64,
                stream: StreamKind::Comm,
            },
        ])
    }

    /// The device actions of one op. Queries (`Address`, `Mxfp8Addresses`) do no device work:
    /// they are answered by [`Translator::address`] and [`Translator::mxfp8_addresses`].
    pub fn translate(&mut self, op: &Op) -> Result<Vec<Action>> {
        match op {
            Op::Allocate(layout) => Ok(self.allocate(layout)),
            Op::Upload { dst, bits } => self.upload(*dst, bits),
            Op::Download(src) => {
                let r = self.resolve(*src)?;
                Ok(vec![Action::CopyOut {
                    src: r.ptr,
                    bytes: r.bytes(),
                    stream: StreamKind::Compute,
                }])
            }
            &Op::DownloadMxfp8 { param, part } => {
                let (src, bytes) = self.buffer(Buf::Mxfp8 { param, part })?;
                Ok(vec![Action::CopyOut {
                    src,
                    bytes,
                    stream: StreamKind::Compute,
                }])
            }
            Op::MemsetZero { stream, span } => {
                let r = self.resolve(*span)?;
                Ok(vec![Action::Zero {
                    dst: r.ptr,
                    bytes: r.bytes(),
                    stream: *stream,
                }])
            }
            Op::Cast { src, dst } => self.cast(*src, *dst),
            Op::AttachInit {
                param,
                dtype,
                numel,
                source,
            } => self.attach_init(*param, *dtype, *numel, source),
            &Op::DetachInit(param) => self.detach_init(param),
            Op::SquaredNorm { counted, checked } => self.squared_norm(counted, checked),
            Op::GatherNormSums => Ok(vec![Action::Nccl(
                if self.norm_group.is_some() {
                    NcclComm::Norm
                } else {
                    NcclComm::Data
                },
                vec![NcclCall::AllGather {
                    send: self.scalar(Scalar::NormSq)?,
                    recv: self.slot(RECEIVE_SLOTS)?,
                    send_count: 1,
                    dtype: NcclType::F64,
                }],
            )]),
            Op::FinishStep { constants, terms } => self.finish_step(constants, terms),
            Op::SetStepArgs(bits) => Ok(vec![Action::CopyInAsync {
                dst: self.scalar(Scalar::Lr)?,
                bytes: bits
                    .iter()
                    .flat_map(|&b| f64::from(f32::from_bits(b)).to_le_bytes())
                    .collect(),
                stream: StreamKind::Compute,
            }]),
            Op::SetStepCount(step) => Ok(vec![Action::CopyIn {
                dst: self.scalar(Scalar::Step)?,
                bytes: (*step as f64).to_le_bytes().to_vec(),
                stream: StreamKind::Compute,
            }]),
            Op::ReadScalars => Ok(vec![Action::CopyOut {
                src: self.slot(0)?,
                bytes: Scalar::COUNT as u64 * 8,
                stream: StreamKind::Compute,
            }]),
            Op::MuonUpdate(job) => self.muon_update(job),
            Op::AdamwUpdate(job) => self.adamw_update(job),
            Op::QkClip(job) => self.qk_clip(job),
            Op::Record { stream, event } => Ok(vec![Action::Record {
                stream: *stream,
                event: *event,
            }]),
            Op::Wait { stream, event } => Ok(vec![Action::Wait {
                stream: *stream,
                event: *event,
            }]),
            Op::Collectives(ops) => Ok(vec![Action::Nccl(
                NcclComm::Data,
                ops.iter().map(|op| self.collective(op)).collect::<Result<_>>()?,
            )]),
            Op::AllGatherU64 { value } => self.exchange(value.to_le_bytes()),
            Op::Mxfp8Quantize { stream, src, param } => self.mxfp8_quantize(*stream, *src, *param),
            Op::Synchronize => Ok(vec![
                Action::Synchronize(StreamKind::Compute),
                Action::Synchronize(StreamKind::Comm),
            ]),
            Op::Mxfp8Addresses(_) | Op::Address(_) => {
                bail!(
                    Internal,
                    "{op:?} is a query without device work; use Translator::address"
                )
            }
        }
    }

    fn allocate(&mut self, layout: &MemoryLayout) -> Vec<Action> {
        self.map.retain(|buf, _| *buf == Buf::Scalars);
        let mut actions = Vec::new();
        let mut alloc = |buf: Buf, bytes: u64| actions.push(Action::Alloc { buf, bytes });
        for (i, b) in layout.buffers.iter().enumerate() {
            alloc(Buf::Mem(Mem::Param(i as u32)), b.param_numel * b.dtype.size() as u64);
            alloc(Buf::Mem(Mem::Grad(i as u32)), b.numel * layout.grad_dtype.size() as u64);
        }
        alloc(Buf::Mem(Mem::Master), layout.master * 4);
        alloc(Buf::Mem(Mem::Momentum), layout.momentum * 4);
        alloc(Buf::Mem(Mem::ExpAvg), layout.adam_moments * 4);
        alloc(Buf::Mem(Mem::ExpAvgSq), layout.adam_moments * 4);
        for t in &layout.mxfp8 {
            let data = (t.rows * t.cols) as u64;
            let scales = |d| {
                let (r, c) = scale_shape(t.rows, t.cols, d);
                (r * c) as u64
            };
            let sizes = [data, scales(Direction::Rowwise), data, scales(Direction::Colwise)];
            for (part, bytes) in sizes.into_iter().enumerate() {
                alloc(
                    Buf::Mxfp8 {
                        param: t.param,
                        part: part as u8,
                    },
                    bytes,
                );
            }
        }
        let (need, gathered) = self.tp_need(layout);
        let work = WorkSizes {
            matrix: need.matrix,
            gram: need.gram,
            norms: need.run.max(1),
        };
        alloc(Buf::Work(Work::Update), work.matrix * 4);
        alloc(Buf::Work(Work::X), work.matrix * 4);
        alloc(Buf::Work(Work::Gram), work.gram * 4);
        match self.muon.ns.precision {
            NsPrecision::Bf16 | NsPrecision::Bf16Iterate => {
                alloc(Buf::Work(Work::XBf16), work.matrix * 2);
                alloc(Buf::Work(Work::GramBf16), work.gram * 2);
            }
            NsPrecision::F32 => {
                alloc(Buf::Work(Work::XNext), work.matrix * 4);
                alloc(Buf::Work(Work::Poly), work.gram * 4);
            }
        }
        alloc(Buf::Work(Work::Norms), work.norms * 8);
        alloc(Buf::Work(Work::Partials), PARTIALS * 8);
        if need.grouped > 0 {
            alloc(Buf::Work(Work::Grouped), need.grouped * 4);
        }
        if gathered > 0 {
            alloc(Buf::Work(Work::Gathered), gathered * 4);
            if layout.tp_components.iter().any(|c| c.dim == TpDim::Cols) {
                alloc(Buf::Work(Work::Assembled), gathered * 4);
            }
        }
        // The allocations are zeroed on the compute stream; finish before anything else runs.
        actions.push(Action::Synchronize(StreamKind::Compute));
        self.layout = Some(layout.clone());
        self.work = work;
        actions
    }

    fn upload(&self, dst: Span, bits: &[u32]) -> Result<Vec<Action>> {
        if bits.len() as u64 != dst.len {
            bail!(Internal, "upload of {} values into {dst:?}", bits.len());
        }
        let r = self.resolve(dst)?;
        let bytes = match r.dtype {
            Dtype::F32 => bits.iter().flat_map(|b| b.to_le_bytes()).collect(),
            Dtype::Bf16 => bits
                .iter()
                .flat_map(|&b| f32_to_bf16_rne(f32::from_bits(b)).to_le_bytes())
                .collect(),
        };
        Ok(vec![Action::CopyIn {
            dst: r.ptr,
            bytes,
            stream: StreamKind::Compute,
        }])
    }

    fn cast(&self, src: Span, dst: Span) -> Result<Vec<Action>> {
        if src.len != dst.len || src.mem == dst.mem {
            bail!(
                Internal,
                "cast {src:?} -> {dst:?}: lengths differ or spans share memory"
            );
        }
        if let Some(copy) = self.cast_from_host_init(src, dst) {
            return copy;
        }
        let (s, d) = (self.resolve(src)?, self.resolve(dst)?);
        if s.dtype == d.dtype {
            return Ok(vec![Action::CopyDevice {
                dst: d.ptr,
                src: s.ptr,
                bytes: s.bytes(),
                stream: StreamKind::Compute,
            }]);
        }
        let args = vec![
            Arg::Ptr(s.ptr),
            Arg::I32(s.is_bf16()),
            Arg::Ptr(d.ptr),
            Arg::I32(d.is_bf16()),
            Arg::U64(s.len),
        ];
        Ok(vec![launch(Kernel::Cast, s.len, StreamKind::Compute, args)])
    }

    /// Sums of squares of the non-empty `spans`: one partials launch and one finish launch per
    /// 32 spans. `Total` adds every span into `out[0]` (which must hold a start value);
    /// `PerSpan` writes span i's sum into `out[i]`.
    fn sumsq(&self, actions: &mut Vec<Action>, spans: &[SumSpan], into: SumInto, out: DevPtr) -> Result<()> {
        let partials = self.work(Work::Partials)?;
        for (c, chunk) in spans.chunks(SUMSQ_SPANS).enumerate() {
            let mut first = 0u32;
            let mut described = Vec::with_capacity(chunk.len());
            let mut groups = Vec::with_capacity(chunk.len());
            for (i, span) in chunk.iter().enumerate() {
                let blocks = sumsq_blocks(span.span.len);
                described.push((*span, first));
                groups.push(Group {
                    first,
                    count: blocks,
                    out: i as u32,
                    accumulate: false,
                });
                first += blocks;
            }
            let (groups, out) = match into {
                SumInto::Total => {
                    let all = Group {
                        first: 0,
                        count: first,
                        out: 0,
                        accumulate: true,
                    };
                    (vec![all], out)
                }
                SumInto::PerSpan => (groups, out + (c * SUMSQ_SPANS) as u64 * 8),
            };
            actions.push(Action::Launch(Launch {
                kernel: Kernel::SumsqPartials,
                grid: [first, 1, 1],
                block: [THREADS, 1, 1],
                stream: StreamKind::Compute,
                args: vec![Arg::Words(sumsq_spans(&described)), Arg::Ptr(partials)],
            }));
            actions.push(Action::Launch(Launch {
                kernel: Kernel::SumsqFinish,
                grid: [groups.len() as u32, 1, 1],
                block: [THREADS, 1, 1],
                stream: StreamKind::Compute,
                args: vec![Arg::Words(sumsq_groups(&groups)), Arg::Ptr(partials), Arg::Ptr(out)],
            }));
        }
        Ok(())
    }

    fn squared_norm(&self, counted: &[Span], checked: &[Span]) -> Result<Vec<Action>> {
        let mark = |check_only: bool| {
            move |s: &Span| -> Result<SumSpan> {
                Ok(SumSpan {
                    span: self.resolve(*s)?,
                    check_only,
                })
            }
        };
        let resolved = counted
            .iter()
            .map(mark(false))
            .chain(checked.iter().map(mark(true)))
            .filter(|r| !matches!(r, Ok(r) if r.span.len == 0))
            .collect::<Result<Vec<_>>>()?;
        let out = self.scalar(Scalar::NormSq)?;
        let mut actions = vec![Action::Zero {
            dst: out,
            bytes: 8,
            stream: StreamKind::Compute,
        }];
        self.sumsq(&mut actions, &resolved, SumInto::Total, out)?;
        Ok(actions)
    }

    /// One thread derives the step's scalars from the gathered sums of every term
    /// (`numerics::step_scalars`); another backend's sums are read where they are.
    fn finish_step(&self, constants: &StepConstants, terms: &[NormTerm]) -> Result<Vec<Action>> {
        Ok(vec![launch(
            Kernel::StepScalars,
            1,
            StreamKind::Compute,
            vec![
                Arg::Ptr(self.slot(0)?),
                Arg::Words(self.norm_terms(terms)?),
                Arg::U32(to_u32("dp", self.dp as u64)?),
                Arg::F32(constants.clip_grad),
                Arg::F32(constants.beta1),
                Arg::F32(constants.beta2),
            ],
        )])
    }

    /// The words of `struct muon_norm_terms` (`kernels/step.cu`): the sums' addresses, then
    /// the ranks and the dp of each term as u32 pairs, then the count.
    fn norm_terms(&self, terms: &[NormTerm]) -> Result<Vec<u64>> {
        if terms.is_empty() || terms.len() > MAX_NORM_TERMS {
            bail!(
                InvalidArgument,
                "step: {} optimizers share the clip; 1 to {MAX_NORM_TERMS} can",
                terms.len()
            );
        }
        let pairs = MAX_NORM_TERMS / 2;
        let mut words = vec![0u64; MAX_NORM_TERMS + 2 * pairs + 1];
        for (i, term) in terms.iter().enumerate() {
            words[i] = match term.sums {
                NormSums::Own => self.slot(RECEIVE_SLOTS)?,
                NormSums::Device(address) => address,
                NormSums::Host(_) => bail!(
                    CommMismatch,
                    "step: a cuda optimizer cannot share a clip with a host optimizer's norm"
                ),
            };
            let shift = 32 * (i % 2) as u32;
            words[MAX_NORM_TERMS + i / 2] |= u64::from(to_u32("norm ranks", term.ranks as u64)?) << shift;
            words[MAX_NORM_TERMS + pairs + i / 2] |= u64::from(to_u32("dp", term.dp as u64)?) << shift;
        }
        words[MAX_NORM_TERMS + 2 * pairs] = terms.len() as u64;
        Ok(words)
    }

    /// The Muon workspace the layout's jobs need with their tensor-parallel components
    /// orthogonalized whole (this translator knows the TP size), and the elements of the
    /// largest gathered component.
    fn tp_need(&self, layout: &MemoryLayout) -> (MuonWork, u64) {
        let Some((ranks, _)) = self.tp_group else {
            return (layout.muon_work, 0);
        };
        layout
            .tp_components
            .iter()
            .fold((layout.muon_work, 0), |(need, gathered), c| match c.mode {
                // The shard is the iterate, its unsplit dimension the Gram matrix's.
                TpMode::Distributed => {
                    let unsplit = match c.dim {
                        TpDim::Rows => c.cols,
                        TpDim::Cols => c.rows,
                    } as u64;
                    let gram = MuonWork {
                        gram: unsplit * unsplit,
                        ..MuonWork::default()
                    };
                    (need.max(gram), gathered)
                }
                TpMode::Duplicated | TpMode::Blockwise => {
                    let (rows, cols) = whole_shape(c.dim, c.rows as u64, c.cols as u64, ranks as u64);
                    (
                        need.max(MuonWork::of_job(&[rows as usize], cols as usize, 1)),
                        gathered.max(rows * cols),
                    )
                }
            })
    }

    /// Orthogonalizes the `rows × cols` tensor-parallel shard component at `shard` whole:
    /// all-gathers it over the TP group (ordered after the compute stream's writes, and the
    /// compute stream after the gather), assembles the whole component (row blocks follow each
    /// other; column blocks are placed side by side by a 2-D copy), runs Newton–Schulz on it and
    /// returns this rank's chunk of the result as (pointer, transposed, row stride), with the
    /// whole shape for the scale.
    fn gathered_newton_schulz(
        &self,
        actions: &mut Vec<Action>,
        shard: DevPtr,
        (rows, cols): (u64, u64),
        dim: TpDim,
    ) -> Result<(DevPtr, bool, u64, (u64, u64))> {
        let (ranks, rank) = self.tp_group_for("duplicated")?;
        let count = rows * cols;
        let gathered = self.work(Work::Gathered)?;
        on_tp_comm(
            actions,
            NcclCall::AllGather {
                send: shard,
                recv: gathered,
                send_count: count,
                dtype: NcclType::F32,
            },
        );
        let whole = match dim {
            TpDim::Rows => gathered,
            TpDim::Cols => {
                let assembled = self.work(Work::Assembled)?;
                for t in 0..ranks {
                    actions.push(Action::CopyDevice2D {
                        dst: assembled + t * cols * 4,
                        dst_pitch: ranks * cols * 4,
                        src: gathered + t * count * 4,
                        src_pitch: cols * 4,
                        width: cols * 4,
                        height: rows,
                        stream: StreamKind::Compute,
                    });
                }
                assembled
            }
        };
        let (whole_rows, whole_cols) = whole_shape(dim, rows, cols, ranks);
        let (x, transposed) = self.newton_schulz(actions, whole, whole_rows, whole_cols, 1, Sharding::None)?;
        // X is whole_rows × whole_cols, or stored transposed (whole_cols × whole_rows).
        let (chunk, ld) = match (dim, transposed) {
            (TpDim::Rows, false) => (x + rank * count * 4, cols),
            (TpDim::Rows, true) => (x + rank * rows * 4, whole_rows),
            (TpDim::Cols, false) => (x + rank * cols * 4, whole_cols),
            (TpDim::Cols, true) => (x + rank * count * 4, rows),
        };
        Ok((chunk, transposed, ld, (whole_rows, whole_cols)))
    }

    /// Orthogonalizes the `rows × cols` tensor-parallel shard component at `shard` with
    /// Megatron's `distributed` mode: Newton–Schulz on the shard (transposed for a row split,
    /// so the split dimension is the iterate's columns), the norm and every `X·Xᵀ` all-reduced
    /// over the TP group. Returns the result as `gathered_newton_schulz` does.
    fn distributed_newton_schulz(
        &self,
        actions: &mut Vec<Action>,
        shard: DevPtr,
        (rows, cols): (u64, u64),
        dim: TpDim,
    ) -> Result<(DevPtr, bool, u64, (u64, u64))> {
        let (ranks, _) = self.tp_group_for("distributed")?;
        let transpose = dim == TpDim::Rows;
        let (x, transposed) = self.newton_schulz(actions, shard, rows, cols, 1, Sharding::Columns { transpose })?;
        let ld = if transposed { rows } else { cols };
        Ok((x, transposed, ld, whole_shape(dim, rows, cols, ranks)))
    }

    /// (ranks, this rank) of the TP group a `mode` shard needs.
    fn tp_group_for(&self, mode: &str) -> Result<(u64, u64)> {
        match self.tp_group {
            Some((ranks, rank)) => Ok((ranks as u64, rank as u64)),
            None => bail!(
                InvalidState,
                "muon_update: a {mode} tensor-parallel shard needs the TP group (muon_optimizer_set_tp_group)"
            ),
        }
    }

    fn muon_update(&self, job: &MuonJob) -> Result<Vec<Action>> {
        self.muon.ns.validate()?;
        MuonShape {
            rows: job.rows,
            cols: job.cols,
            split_rows: &job.split_rows,
            split_groups: job.split_groups,
        }
        .check()?;
        let (rows, cols) = (job.rows as u64, job.cols as u64);
        let split: Vec<u64> = if job.split_rows.is_empty() {
            vec![rows]
        } else {
            job.split_rows.iter().map(|&r| r as u64).collect()
        };
        let groups = job.split_groups.max(1) as u64;
        let len = rows * cols;
        let master = self.resolve_f32(job.master)?;
        let momentum = self.resolve_f32(job.momentum)?;
        let grad = self.resolve(job.grad)?;
        for (name, r) in [("master", master), ("momentum", momentum), ("grad", grad)] {
            if r.len != len {
                bail!(
                    InvalidArgument,
                    "muon_update: {name} has {} elements, expected {rows}×{cols}",
                    r.len
                );
            }
        }
        if len > self.work.matrix {
            bail!(
                Internal,
                "muon_update: {rows}×{cols} exceeds the workspace sized at allocate for {} elements",
                self.work.matrix
            );
        }
        let opts = &self.muon;
        let update = self.work(Work::Update)?;
        let scalars = self.slot(0)?;
        let mut actions = vec![launch(
            Kernel::MuonMomentum,
            len,
            StreamKind::Compute,
            vec![
                Arg::Ptr(grad.ptr),
                Arg::I32(grad.is_bf16()),
                Arg::Ptr(momentum.ptr),
                Arg::Ptr(update),
                Arg::U64(len),
                Arg::F32(opts.momentum),
                Arg::F32(1.0 - opts.momentum),
                Arg::Ptr(scalars),
                Arg::I32(i32::from(opts.nesterov)),
            ],
        )];
        // A per-group split runs in component order: the update into the grouped workspace,
        // the masters into the update's place (no longer needed), and back after the apply.
        let (ns_input, target) = if groups > 1 {
            let grouped = self.work(Work::Grouped)?;
            actions.extend(group_copies(update, grouped, &split, groups, cols, false));
            actions.extend(group_copies(master.ptr, update, &split, groups, cols, false));
            (grouped, update)
        } else {
            (update, master.ptr)
        };
        // Consecutive components of equal shape form one strided batch; a tensor-parallel
        // shard's components are gathered and orthogonalized whole, one at a time.
        let mut start = 0u64;
        let mut i = 0;
        while i < split.len() {
            let comp_rows = split[i];
            let batch = match job.tp {
                Some(_) => 1,
                None => split[i..].iter().take_while(|&&r| r == comp_rows).count() as u64,
            };
            let shard = ns_input + start * 4;
            let (x, transposed, ld, (scale_rows, scale_cols)) = match job.tp {
                Some(TpJob {
                    dim,
                    mode: TpMode::Distributed,
                }) => self.distributed_newton_schulz(&mut actions, shard, (comp_rows, cols), dim)?,
                Some(TpJob { dim, .. }) => self.gathered_newton_schulz(&mut actions, shard, (comp_rows, cols), dim)?,
                None => {
                    let (x, transposed) =
                        self.newton_schulz(&mut actions, shard, comp_rows, cols, batch, Sharding::None)?;
                    let ld = if transposed { comp_rows } else { cols };
                    (x, transposed, ld, (comp_rows, cols))
                }
            };
            let scale = muon_scale(
                opts.scale_mode,
                scale_rows as usize,
                scale_cols as usize,
                opts.extra_scale_factor,
            );
            actions.push(launch(
                Kernel::MuonApply,
                batch * comp_rows * cols,
                StreamKind::Compute,
                vec![
                    Arg::Ptr(target + start * 4),
                    Arg::Ptr(x),
                    Arg::U32(to_u32("batch", batch)?),
                    Arg::U32(to_u32("rows", comp_rows)?),
                    Arg::U32(to_u32("cols", cols)?),
                    Arg::I32(i32::from(transposed)),
                    Arg::U32(to_u32("x_ld", ld)?),
                    Arg::Ptr(scalars),
                    Arg::F32(job.scales.lr_scale),
                    Arg::F32(job.scales.wd_scale),
                    Arg::F32(scale),
                ],
            ));
            start += batch * comp_rows * cols;
            i += batch as usize;
        }
        if groups > 1 {
            actions.extend(group_copies(master.ptr, update, &split, groups, cols, true));
        }
        Ok(actions)
    }

    /// Newton–Schulz of `batch` consecutive `rows × cols` f32 matrices at `u`
    /// (`numerics::newton_schulz`, step for step). Returns where the result is (`m × n`, per
    /// matrix) and whether it is transposed.
    fn newton_schulz(
        &self,
        actions: &mut Vec<Action>,
        u: DevPtr,
        rows: u64,
        cols: u64,
        batch: u64,
        sharding: Sharding,
    ) -> Result<(DevPtr, bool)> {
        let transposed = match sharding {
            Sharding::None => rows > cols,
            Sharding::Columns { transpose } => transpose,
        };
        let (m, n) = if transposed { (cols, rows) } else { (rows, cols) };
        let reduce = matches!(sharding, Sharding::Columns { .. });
        let (mn, mm) = (m * n, m * m);
        if batch * mm > self.work.gram || batch > self.work.norms {
            bail!(
                Internal,
                "newton_schulz: {batch}×{rows}×{cols} exceeds the workspace sized at allocate"
            );
        }
        let norms = self.work(Work::Norms)?;
        let spans: Vec<SumSpan> = (0..batch)
            .map(|k| SumSpan {
                span: Resolved {
                    ptr: u + k * mn * 4,
                    dtype: Dtype::F32,
                    len: mn,
                },
                check_only: false,
            })
            .collect();
        self.sumsq(actions, &spans, SumInto::PerSpan, norms)?;
        if reduce {
            on_tp_comm(actions, all_reduce(norms, batch, NcclType::F64));
        }
        let x = self.work(Work::X)?;
        actions.push(launch(
            Kernel::NsNormalize,
            batch * mn,
            StreamKind::Compute,
            vec![
                Arg::Ptr(u),
                Arg::Ptr(x),
                Arg::Ptr(norms),
                Arg::U32(to_u32("batch", batch)?),
                Arg::U32(to_u32("rows", rows)?),
                Arg::U32(to_u32("cols", cols)?),
                Arg::I32(i32::from(transposed)),
                Arg::F32(self.muon.ns.eps),
            ],
        ));
        let gram = self.work(Work::Gram)?;
        let product = |inputs, (m, k, n), alpha, a, b, b_transposed, beta, c| Product {
            inputs,
            m,
            k,
            n,
            alpha,
            a,
            b,
            b_transposed,
            beta,
            c,
            batch,
        };
        let round = |src: DevPtr, dst: DevPtr, count: u64| {
            launch(
                Kernel::CastF32ToBf16,
                count,
                StreamKind::Compute,
                vec![Arg::Ptr(src), Arg::Ptr(dst), Arg::U64(count)],
            )
        };
        // f32 → bf16 → f32 in place: the value a bf16 store keeps, through `scratch`.
        let store_bf16 = |actions: &mut Vec<Action>, values: DevPtr, scratch: DevPtr, count: u64| {
            actions.push(round(values, scratch, count));
            let widen = vec![
                Arg::Ptr(scratch),
                Arg::I32(1),
                Arg::Ptr(values),
                Arg::I32(0),
                Arg::U64(count),
            ];
            actions.push(launch(Kernel::Cast, count, StreamKind::Compute, widen));
        };
        let copy = |src: DevPtr, dst: DevPtr, count: u64| Action::CopyDevice {
            dst,
            src,
            bytes: count * 4,
            stream: StreamKind::Compute,
        };
        let mut current = x;
        if self.muon.ns.precision == NsPrecision::Bf16Iterate {
            store_bf16(actions, x, self.work(Work::XBf16)?, batch * mn);
        }
        for step in 0..self.muon.ns.steps as usize {
            let [a, b, c] = ns_coefficients(self.muon.ns.coefficients, step);
            match self.muon.ns.precision {
                NsPrecision::Bf16 | NsPrecision::Bf16Iterate => {
                    // Bf16Iterate keeps `x` at bf16 values, with `xb` holding the same values
                    // as bf16 (`store_bf16`); `A` is stored at bf16 values before `b·A` reads it.
                    use GemmInputs::Bf16;
                    let iterate = self.muon.ns.precision == NsPrecision::Bf16Iterate;
                    let (xb, gb) = (self.work(Work::XBf16)?, self.work(Work::GramBf16)?);
                    if !iterate {
                        actions.push(round(x, xb, batch * mn));
                    }
                    actions.push(product(Bf16, (m, n, m), 1.0, xb, xb, true, 0.0, gram).gemm()?);
                    if reduce {
                        on_tp_comm(actions, all_reduce(gram, batch * mm, NcclType::F32));
                    }
                    if iterate {
                        store_bf16(actions, gram, gb, batch * mm);
                    } else {
                        actions.push(round(gram, gb, batch * mm));
                    }
                    actions.push(product(Bf16, (m, m, m), c, gb, gb, false, b, gram).gemm()?);
                    actions.push(round(gram, gb, batch * mm));
                    actions.push(product(Bf16, (m, m, n), 1.0, gb, xb, false, a, x).gemm()?);
                    if iterate {
                        store_bf16(actions, x, xb, batch * mn);
                    }
                }
                NsPrecision::F32 => {
                    use GemmInputs::F32;
                    let poly = self.work(Work::Poly)?;
                    let next = if current == x { self.work(Work::XNext)? } else { x };
                    actions.push(product(F32, (m, n, m), 1.0, current, current, true, 0.0, gram).gemm()?);
                    if reduce {
                        on_tp_comm(actions, all_reduce(gram, batch * mm, NcclType::F32));
                    }
                    actions.push(copy(gram, poly, batch * mm));
                    actions.push(product(F32, (m, m, m), c, gram, gram, false, b, poly).gemm()?);
                    actions.push(copy(current, next, batch * mn));
                    actions.push(product(F32, (m, m, n), 1.0, poly, current, false, a, next).gemm()?);
                    current = next;
                }
            }
        }
        Ok((current, transposed))
    }

    fn adamw_update(&self, job: &AdamwJob) -> Result<Vec<Action>> {
        let args = &job.args;
        let master = self.resolve_f32(job.master)?;
        let m = self.resolve_f32(job.exp_avg)?;
        let v = self.resolve_f32(job.exp_avg_sq)?;
        let grad = self.resolve(job.grad)?;
        if m.len != master.len || v.len != master.len || grad.len != master.len {
            bail!(
                InvalidArgument,
                "adamw_update: lengths differ (master {}, exp_avg {}, exp_avg_sq {}, grad {})",
                master.len,
                m.len,
                v.len,
                grad.len
            );
        }
        Ok(vec![launch(
            Kernel::Adamw,
            master.len,
            StreamKind::Compute,
            vec![
                Arg::Ptr(master.ptr),
                Arg::Ptr(m.ptr),
                Arg::Ptr(v.ptr),
                Arg::Ptr(grad.ptr),
                Arg::I32(grad.is_bf16()),
                Arg::U64(master.len),
                Arg::F32(args.beta1),
                Arg::F32(args.beta2),
                Arg::F32(1.0 - args.beta1),
                Arg::F32(1.0 - args.beta2),
                Arg::F32(args.eps),
                Arg::F32(args.scales.lr_scale),
                Arg::F32(args.scales.wd_scale),
                Arg::Ptr(self.slot(0)?),
            ],
        )])
    }

    fn collective(&self, op: &CollOp) -> Result<NcclCall> {
        let nccl_type = |r: &Resolved| match r.dtype {
            Dtype::F32 => NcclType::F32,
            Dtype::Bf16 => NcclType::Bf16,
        };
        let chunk_of = |r: &Resolved| {
            if !r.len.is_multiple_of(self.dp as u64) {
                bail!(
                    Internal,
                    "{op:?}: {} elements do not split into {} equal chunks",
                    r.len,
                    self.dp
                );
            }
            Ok(r.len / self.dp as u64)
        };
        Ok(match *op {
            CollOp::Reduce { root, span } => {
                let r = self.resolve(span)?;
                NcclCall::Reduce {
                    send: r.ptr,
                    recv: r.ptr,
                    count: r.len,
                    dtype: nccl_type(&r),
                    root,
                }
            }
            CollOp::Broadcast { root, span } => {
                let r = self.resolve(span)?;
                NcclCall::Broadcast {
                    send: r.ptr,
                    recv: r.ptr,
                    count: r.len,
                    dtype: nccl_type(&r),
                    root,
                }
            }
            CollOp::ReduceScatter { span } => {
                let r = self.resolve(span)?;
                let chunk = chunk_of(&r)?;
                NcclCall::ReduceScatter {
                    send: r.ptr,
                    recv: r.at(self.rank as u64 * chunk),
                    recv_count: chunk,
                    dtype: nccl_type(&r),
                }
            }
            CollOp::AllGather { span } => {
                let r = self.resolve(span)?;
                let chunk = chunk_of(&r)?;
                NcclCall::AllGather {
                    send: r.at(self.rank as u64 * chunk),
                    recv: r.ptr,
                    send_count: chunk,
                    dtype: nccl_type(&r),
                }
            }
            CollOp::AllReduce { span } => {
                let r = self.resolve(span)?;
                NcclCall::AllReduce {
                    send: r.ptr,
                    recv: r.ptr,
                    count: r.len,
                    dtype: nccl_type(&r),
                }
            }
        })
    }

    fn mxfp8_quantize(&self, stream: StreamKind, src: Span, param: u32) -> Result<Vec<Action>> {
        let layout = self.layout()?;
        let Some(tensor) = layout.mxfp8.iter().find(|t| t.param == param) else {
            bail!(Internal, "param {param} has no MXFP8 storage")
        };
        let (rows, cols) = (tensor.rows as u64, tensor.cols as u64);
        if src.len != rows * cols {
            bail!(Internal, "mxfp8_quantize: {src:?} does not hold {rows}x{cols} values");
        }
        let r = self.resolve(src)?;
        if r.dtype != Dtype::Bf16 {
            bail!(Internal, "mxfp8_quantize: {src:?} is not bf16");
        }
        let Some(parts) = self.mxfp8_addresses(param) else {
            bail!(Internal, "param {param}'s MXFP8 storage is not allocated")
        };
        let tiles_y = rows.div_ceil(32).next_multiple_of(4);
        let swizzled = layout.mxfp8_scale_layout == ScaleLayout::Swizzled;
        Ok(vec![Action::Launch(Launch {
            kernel: Kernel::Mxfp8Quantize,
            grid: [
                to_u32("MXFP8 grid", cols.next_multiple_of(128) / 32)?,
                tiles_y.min(MXFP8_MAX_GRID_Y) as u32,
                1,
            ],
            block: [32, 8, 1],
            stream,
            args: vec![
                Arg::Ptr(r.ptr),
                Arg::U32(to_u32("rows", rows)?),
                Arg::U32(to_u32("cols", cols)?),
                Arg::Ptr(parts[0]),
                Arg::Ptr(parts[1]),
                Arg::Ptr(parts[2]),
                Arg::Ptr(parts[3]),
                Arg::I32(i32::from(swizzled)),
            ],
        })])
    }
}

//! Device actions: what one backend operation becomes on a GPU. The [`Translator`] produces
//! them without a device (every offset, grid, kernel argument, cuBLAS parameter and NCCL
//! call is decided there); the [`Device`] executes them with the driver, cuBLAS and NCCL.
//!
//! [`Translator`]: super::translate::Translator
//! [`Device`]: super::device::Device

use crate::backend::ops::{EventId, Mem, StreamKind};

/// A device pointer (`CUdeviceptr`).
pub type DevPtr = u64;

/// One device allocation of a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Buf {
    /// A memory kind of the schedule (never `Mem::Staging`, which views `Mem::Grad`).
    Mem(Mem),
    /// Part `part` of a param's MXFP8 storage: 0 rowwise data, 1 rowwise scales,
    /// 2 columnwise data, 3 columnwise scales.
    Mxfp8 { param: u32, part: u8 },
    /// Muon workspace.
    Work(Work),
    /// f64 slots: the step's scalars (`ops::Scalar`), then the all-gather send slot, then one
    /// receive slot per rank.
    Scalars,
}

/// The Muon workspace, sized once at allocate from `MemoryLayout::muon_work`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Work {
    /// The momentum-updated matrix `U` (f32).
    Update,
    /// The iterate `X` (f32).
    X,
    /// The next iterate (f32; f32 precision only).
    XNext,
    /// `X` rounded to bf16 (bf16 precision only).
    XBf16,
    /// `A = X·Xᵀ`, then `B = b·A + c·A·A` in place in bf16 precision (f32); `R` of the Gram
    /// iteration.
    Gram,
    /// `B` (f32; f32 precision only); `Z = b·R + c·R·R` of the Gram iteration (every
    /// precision, when it runs).
    Poly,
    /// `A`, then `B`, rounded to bf16 (bf16 precision only); `R` rounded to bf16.
    GramBf16,
    /// `Z` rounded to bf16 (the Gram iteration in bf16 precision only).
    PolyBf16,
    /// `Q`, the Gram iteration's product of polynomials (f32; only when it runs).
    GramQ,
    /// `Q` rounded to bf16 (the Gram iteration in bf16 precision only).
    GramQBf16,
    /// The next `Q` and `RZ = a·R + Z·R`, in turn with `GramQ` (f32; the Gram iteration in
    /// f32 precision only).
    GramSpare,
    /// Squared Frobenius norms of the matrices of one batch (f64).
    Norms,
    /// NorMuon: the line sums of squares of one batch, then its matrices' norm ratios (f64;
    /// only with `muon_variant = normuon`).
    Moment2Sums,
    /// Block partial sums of squares (f64).
    Partials,
    /// The pointer lists of the tiled symmetric products of one Newton–Schulz call
    /// ([`Matrices::Listed`]; only when a product is tiled).
    TileTables,
    /// The update of a per-group split job in component order (f32; only with such jobs).
    Grouped,
    /// Every tensor-parallel rank's shard of one component, in rank order (f32; only with
    /// duplicated shards).
    Gathered,
    /// A column-split component assembled whole from `Gathered` (f32; only with such shards).
    Assembled,
}

/// What one second-moment value of a matrix covers: `muon_apply`'s `moment2_layout` argument
/// (`kernels/muon.cu`'s `MUON_MOMENT2_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment2Layout {
    /// NorMuon, a line per column.
    Columns = 0,
    /// NorMuon, a line per row.
    Rows = 1,
    /// AdaMuon, every element.
    Elements = 2,
}

/// A kernel of `kernels/*.cu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    CastF32ToBf16,
    Cast,
    SumsqPartials,
    SumsqFinish,
    NormPartials,
    MuonMomentum,
    NsNormalize,
    NsSymmetrize,
    NsAddIdentity,
    GemmTileTables,
    MuonApply,
    NormuonLineSums,
    NormuonMoments,
    StepScalars,
    Adamw,
    Mxfp8Quantize,
    QkClip,
}

impl Kernel {
    /// Every kernel the backend loads.
    pub const ALL: [Kernel; 17] = [
        Kernel::CastF32ToBf16,
        Kernel::Cast,
        Kernel::SumsqPartials,
        Kernel::SumsqFinish,
        Kernel::NormPartials,
        Kernel::MuonMomentum,
        Kernel::NsNormalize,
        Kernel::NsSymmetrize,
        Kernel::NsAddIdentity,
        Kernel::GemmTileTables,
        Kernel::MuonApply,
        Kernel::NormuonLineSums,
        Kernel::NormuonMoments,
        Kernel::Adamw,
        Kernel::StepScalars,
        Kernel::Mxfp8Quantize,
        Kernel::QkClip,
    ];

    /// The `kernels/` file that defines it.
    pub fn source(self) -> &'static str {
        match self {
            Kernel::CastF32ToBf16 | Kernel::Cast => "cast.cu",
            Kernel::SumsqPartials | Kernel::SumsqFinish | Kernel::NormPartials => "reduce.cu",
            Kernel::MuonMomentum
            | Kernel::NsNormalize
            | Kernel::NsSymmetrize
            | Kernel::NsAddIdentity
            | Kernel::GemmTileTables
            | Kernel::MuonApply
            | Kernel::NormuonLineSums
            | Kernel::NormuonMoments => "muon.cu",
            Kernel::Adamw => "adamw.cu",
            Kernel::StepScalars => "step.cu",
            Kernel::Mxfp8Quantize => "mxfp8_quantize.cu",
            Kernel::QkClip => "qk_clip.cu",
        }
    }

    /// Its `extern "C"` name.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::CastF32ToBf16 => "muon_cast_f32_to_bf16",
            Kernel::Cast => "muon_cast",
            Kernel::SumsqPartials => "muon_sumsq_partials",
            Kernel::SumsqFinish => "muon_sumsq_finish",
            Kernel::NormPartials => "muon_norm_partials",
            Kernel::MuonMomentum => "muon_momentum",
            Kernel::NsNormalize => "muon_ns_normalize",
            Kernel::NsSymmetrize => "muon_ns_symmetrize",
            Kernel::NsAddIdentity => "muon_ns_add_identity",
            Kernel::GemmTileTables => "muon_gemm_tile_tables",
            Kernel::MuonApply => "muon_apply",
            Kernel::NormuonLineSums => "muon_normuon_line_sums",
            Kernel::NormuonMoments => "muon_normuon_moments",
            Kernel::Adamw => "muon_adamw",
            Kernel::StepScalars => "muon_step_scalars",
            Kernel::Mxfp8Quantize => "muon_mxfp8_quantize_bf16",
            Kernel::QkClip => "muon_qk_clip",
        }
    }
}

/// One kernel argument, passed by value.
#[derive(Debug, Clone, PartialEq)]
pub enum Arg {
    Ptr(DevPtr),
    U64(u64),
    U32(u32),
    I32(i32),
    F32(f32),
    /// A struct passed by value, as little-endian 8-byte words laid out as the C struct.
    Words(Vec<u64>),
}

impl Arg {
    /// The parameter's bytes as cuLaunchKernel reads them: one little-endian u64 word for a
    /// scalar or pointer (a 4-byte value in its low half), the struct's words for a struct.
    pub fn words(&self) -> Vec<u64> {
        match self {
            Arg::Ptr(p) | Arg::U64(p) => vec![*p],
            Arg::U32(v) => vec![u64::from(*v)],
            Arg::I32(v) => vec![u64::from(*v as u32)],
            Arg::F32(v) => vec![u64::from(v.to_bits())],
            Arg::Words(words) => words.clone(),
        }
    }
}

/// One kernel launch.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    pub kernel: Kernel,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub stream: StreamKind,
    pub args: Vec<Arg>,
}

/// Element type of a GEMM's A and B operands; C and the accumulation are always f32
/// (`CUBLAS_COMPUTE_32F`, never TF32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmInputs {
    Bf16,
    F32,
}

/// A batched GEMM on the compute stream, column-major as cuBLAS sees it:
/// `C = alpha·op(A)·B + beta·C` with `op(A) = Aᵀ` when `transpose_a`, for `batch` matrices
/// where [`Matrices`] says.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemm {
    pub inputs: GemmInputs,
    pub transpose_a: bool,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub alpha: f32,
    pub lda: i32,
    pub ldb: i32,
    pub beta: f32,
    pub ldc: i32,
    pub batch: i32,
    pub matrices: Matrices,
}

/// Where the matrices of a [`Gemm`]'s batch are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Matrices {
    /// `cublasGemmStridedBatchedEx`: matrix `i` of A at `a + i·stride_a` elements, and so on.
    Strided {
        a: DevPtr,
        stride_a: i64,
        b: DevPtr,
        stride_b: i64,
        c: DevPtr,
        stride_c: i64,
    },
    /// `cublasGemmBatchedEx`: matrix `i` of A at the `i`-th of `batch` device pointers at
    /// `table`, of B at the `i`-th of the next `batch`, of C of the `batch` after them (written
    /// on the device by `muon_gemm_tile_tables`). `panels`: the distinct matrices each operand
    /// list addresses (the tiles of a symmetric product share their row and column panels).
    Listed { table: DevPtr, panels: u32 },
}

/// `ncclDataType_t` of a collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NcclType {
    U8,
    U64,
    F64,
    F32,
    Bf16,
}

/// One NCCL call (sum reductions), element counts as NCCL takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NcclCall {
    Reduce {
        send: DevPtr,
        recv: DevPtr,
        count: u64,
        dtype: NcclType,
        root: u32,
    },
    Broadcast {
        send: DevPtr,
        recv: DevPtr,
        count: u64,
        dtype: NcclType,
        root: u32,
    },
    ReduceScatter {
        send: DevPtr,
        recv: DevPtr,
        recv_count: u64,
        dtype: NcclType,
    },
    AllGather {
        send: DevPtr,
        recv: DevPtr,
        send_count: u64,
        dtype: NcclType,
    },
    AllReduce {
        send: DevPtr,
        recv: DevPtr,
        count: u64,
        dtype: NcclType,
    },
}

/// Which communicator an NCCL group runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NcclComm {
    /// The data-parallel communicator (every data collective and exchange).
    Data,
    /// The norm group's communicator (the gather of every rank's Σ g²), when one is set.
    Norm,
    /// The tensor-parallel group's communicator (the gather of `duplicated` shards).
    Tensor,
}

/// One device action.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Allocates `bytes` device bytes (plain `cuMemAlloc`, never managed memory) for `buf` and
    /// zeroes them on the compute stream.
    Alloc {
        buf: Buf,
        bytes: u64,
    },
    /// Copies host bytes to the device on `stream` and waits for the copy.
    CopyIn {
        dst: DevPtr,
        bytes: Vec<u8>,
        stream: StreamKind,
    },
    /// Copies host bytes to the device on `stream` without blocking the host: the executor
    /// stages them in pinned memory it does not reuse before the copy has run, so a captured
    /// graph's copy reads the values of its replay.
    CopyInAsync {
        dst: DevPtr,
        bytes: Vec<u8>,
        stream: StreamKind,
    },
    /// Copies `bytes` device bytes to the host on `stream` and waits: the result of the op.
    CopyOut {
        src: DevPtr,
        bytes: u64,
        stream: StreamKind,
    },
    /// `cuMemsetD8Async(dst, 0, bytes)` on `stream`.
    Zero {
        dst: DevPtr,
        bytes: u64,
        stream: StreamKind,
    },
    /// `cuMemcpyDtoDAsync` on `stream`.
    CopyDevice {
        dst: DevPtr,
        src: DevPtr,
        bytes: u64,
        stream: StreamKind,
    },
    /// `cuMemcpy2DAsync` on `stream`: `height` rows of `width` bytes, `src_pitch` and
    /// `dst_pitch` bytes apart.
    CopyDevice2D {
        dst: DevPtr,
        dst_pitch: u64,
        src: DevPtr,
        src_pitch: u64,
        width: u64,
        height: u64,
        stream: StreamKind,
    },
    Launch(Launch),
    Gemm(Gemm),
    /// The calls as one `ncclGroupStart`/`ncclGroupEnd` group on the comm stream.
    Nccl(NcclComm, Vec<NcclCall>),
    /// `cuEventRecord` of `event` on `stream`.
    Record {
        stream: StreamKind,
        event: EventId,
    },
    /// `cuStreamWaitEvent`: `stream` waits for `event` (no host block).
    Wait {
        stream: StreamKind,
        event: EventId,
    },
    /// Blocks the host until `stream` finished its work, polling NCCL's asynchronous error.
    Synchronize(StreamKind),
}

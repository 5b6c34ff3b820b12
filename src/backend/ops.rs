//! The operations the schedule asks a backend to run. Everything is named by memory kind and
//! element range; the schedule decides every offset, event and collective, the backend only
//! executes (DESIGN.md section 5).

use crate::numerics::adamw::AdamWArgs;
use crate::numerics::muon::MuonStepArgs;

/// A memory allocation of one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mem {
    /// Param buffer `i` of the plan (model dtype).
    Param(u32),
    /// Grad buffer `i` of the plan (grad dtype).
    Grad(u32),
    /// fp32 masters of everything this rank owns (Muon units, then AdamW shard pieces).
    Master,
    /// fp32 Muon momentum of the owned units (same layout as the Muon part of `Master`).
    Momentum,
    /// fp32 AdamW first moment of the owned pieces.
    ExpAvg,
    /// fp32 AdamW second moment of the owned pieces.
    ExpAvgSq,
    /// The bytes of grad buffer `i` viewed as bf16: MXFP8 params are staged here after the
    /// step (element `e` of the staging view is bytes `2e..2e+2` of the grad buffer).
    Staging(u32),
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

/// One Muon matrix update (DESIGN.md section 6) on fp32 state.
#[derive(Debug, Clone, PartialEq)]
pub struct MuonJob {
    pub master: Span,
    pub momentum: Span,
    /// The reduced gradient (grad dtype).
    pub grad: Span,
    pub rows: usize,
    pub cols: usize,
    /// Rows of each fused component; empty = not fused.
    pub split_rows: Vec<usize>,
    pub args: MuonStepArgs,
}

/// One AdamW update of a contiguous piece.
#[derive(Debug, Clone, PartialEq)]
pub struct AdamwJob {
    pub master: Span,
    pub exp_avg: Span,
    pub exp_avg_sq: Span,
    /// The reduced gradient (grad dtype).
    pub grad: Span,
    pub args: AdamWArgs,
}

/// One param with persistent MXFP8 storage, `[rows, cols]` (the flattened 2-D view).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mxfp8Tensor {
    pub param: u32,
    pub rows: usize,
    pub cols: usize,
}

/// Elements a Muon workspace needs for every job of a rank: the largest job (`rows · cols`),
/// the largest Gram batch (a run of consecutive equal components is orthogonalized as one
/// strided batch: `count · min(rows, cols)²`) and the longest such run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MuonWork {
    pub matrix: u64,
    pub gram: u64,
    pub run: u64,
}

impl MuonWork {
    /// The need of one job of `cols` columns whose components have `component_rows` rows.
    pub fn of_job(component_rows: &[usize], cols: usize) -> MuonWork {
        let cols = cols as u64;
        let mut need = MuonWork {
            matrix: component_rows.iter().map(|&r| r as u64).sum::<u64>() * cols,
            ..MuonWork::default()
        };
        for run in component_rows.chunk_by(|a, b| a == b) {
            let m = (run[0] as u64).min(cols);
            need.gram = need.gram.max(run.len() as u64 * m * m);
            need.run = need.run.max(run.len() as u64);
        }
        need
    }

    /// The need of both.
    pub fn max(self, other: MuonWork) -> MuonWork {
        MuonWork {
            matrix: self.matrix.max(other.matrix),
            gram: self.gram.max(other.gram),
            run: self.run.max(other.run),
        }
    }
}

/// Sizes of every allocation of a rank (elements).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryLayout {
    /// Per plan buffer: (elements, param dtype).
    pub buffers: Vec<(u64, crate::config::Dtype)>,
    pub grad_dtype: crate::config::Dtype,
    pub master: u64,
    pub momentum: u64,
    pub adam_moments: u64,
    /// Largest Muon matrix this rank updates, for workspaces.
    pub max_matrix: (usize, usize),
    /// What the Muon jobs of this rank need of a device workspace.
    pub muon_work: MuonWork,
    /// Params with persistent MXFP8 storage (rowwise and columnwise copies on every rank).
    pub mxfp8: Vec<Mxfp8Tensor>,
    /// Byte order of the MXFP8 scales.
    pub mxfp8_scale_layout: crate::numerics::mxfp8::ScaleLayout,
}

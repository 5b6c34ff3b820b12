//! The memory a rank's backend allocates at finalize: [`MemoryLayout`] and its parts.

use crate::config::{Dtype, TpMode};
use crate::numerics::muon::TpDim;
use crate::numerics::mxfp8::ScaleLayout;
use crate::numerics::newton_schulz::{NsOptions, runs_gram};

/// One param with persistent MXFP8 storage, `[rows, cols]` (the flattened 2-D view).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mxfp8Tensor {
    pub param: u32,
    pub rows: usize,
    pub cols: usize,
}

/// Elements a Muon workspace needs for every job of a rank: the largest job (`rows · cols`),
/// the largest Gram batch (a run of consecutive equal components is orthogonalized as one
/// strided batch: `count · min(rows, cols)²`), the largest such batch that runs the Gram
/// iteration and the longest run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MuonWork {
    pub matrix: u64,
    pub gram: u64,
    /// The largest `count · m²` of a run that takes the Gram Newton–Schulz iteration
    /// ([`runs_gram`]), whose square matrices it holds; 0 when none does.
    pub gram_iteration: u64,
    pub run: u64,
    /// Elements of the largest job whose components are interleaved in split groups (its
    /// update in component order); 0 when there is none.
    pub grouped: u64,
    /// The most NorMuon lines of one run (`count · max(rows, cols)`), whose line sums a
    /// NorMuon update holds at once.
    pub lines: u64,
}

impl MuonWork {
    /// The need of one job of `cols` columns whose components have `component_rows` rows,
    /// interleaved in `split_groups` groups, orthogonalized with `ns`.
    pub fn of_job(component_rows: &[usize], cols: usize, split_groups: usize, ns: &NsOptions) -> MuonWork {
        let cols = cols as u64;
        let matrix = component_rows.iter().map(|&r| r as u64).sum::<u64>() * cols;
        let mut need = MuonWork {
            matrix,
            grouped: if split_groups > 1 { matrix } else { 0 },
            ..MuonWork::default()
        };
        for run in component_rows.chunk_by(|a, b| a == b) {
            let m = (run[0] as u64).min(cols);
            let gram = run.len() as u64 * m * m;
            need.gram = need.gram.max(gram);
            if runs_gram(m as usize, (run[0] as u64).max(cols) as usize, ns) {
                need.gram_iteration = need.gram_iteration.max(gram);
            }
            need.run = need.run.max(run.len() as u64);
            need.lines = need.lines.max(run.len() as u64 * (run[0] as u64).max(cols));
        }
        need
    }

    /// The need of both.
    pub fn max(self, other: MuonWork) -> MuonWork {
        MuonWork {
            matrix: self.matrix.max(other.matrix),
            gram: self.gram.max(other.gram),
            gram_iteration: self.gram_iteration.max(other.gram_iteration),
            run: self.run.max(other.run),
            grouped: self.grouped.max(other.grouped),
            lines: self.lines.max(other.lines),
        }
    }
}

/// One component of a tensor-parallel shard, as this rank holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TpComponent {
    pub rows: usize,
    pub cols: usize,
    pub dim: TpDim,
    pub mode: TpMode,
}

/// The two allocations of one plan buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferSizes {
    /// Elements of the grad storage (the whole buffer).
    pub numel: u64,
    /// Elements of the param storage (fewer when buckets of staged params need none).
    pub param_numel: u64,
    /// Elements of [`super::Mem::OwnedParam`] and [`super::Mem::OwnedGrad`] of the buffer (0
    /// unless params are sharded).
    pub owned_numel: u64,
    pub dtype: Dtype,
}

impl BufferSizes {
    /// A buffer whose every element has param storage.
    pub fn whole(numel: u64, dtype: Dtype) -> BufferSizes {
        BufferSizes {
            numel,
            param_numel: numel,
            owned_numel: 0,
            dtype,
        }
    }
}

impl MemoryLayout {
    /// Bytes of the param and gradient storage: every buffer's param and grad allocations and,
    /// with sharded params, its owned storage.
    pub fn param_and_grad_bytes(&self) -> u64 {
        let grad = self.grad_dtype.size() as u64;
        self.buffers
            .iter()
            .map(|b| {
                let size = b.dtype.size() as u64;
                b.param_numel * size + b.numel * grad + b.owned_numel * (size + grad)
            })
            .sum()
    }
}

/// Sizes of every allocation of a rank (elements).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryLayout {
    /// Per plan buffer.
    pub buffers: Vec<BufferSizes>,
    pub grad_dtype: Dtype,
    pub master: u64,
    pub momentum: u64,
    /// Storage of the Muon momentum (`muon_momentum_dtype`).
    pub momentum_dtype: Dtype,
    /// Elements of the NorMuon second moment ([`super::Mem::Moment2`]; 0 for standard Muon).
    pub moment2: u64,
    pub adam_moments: u64,
    /// Bounds of every single matrix Newton–Schulz orthogonalizes on this rank (a fused
    /// component, an expert): (elements, shorter side), for a workspace that takes them one at
    /// a time.
    pub max_component: (usize, usize),
    /// What the Muon jobs of this rank need of a device workspace.
    pub muon_work: MuonWork,
    /// The distinct components of this rank's tensor-parallel shards that `duplicated` or
    /// `distributed` mode orthogonalizes over the TP group (local shape, dimension, mode): a
    /// backend that knows its TP size sizes its workspaces from them.
    pub tp_components: Vec<TpComponent>,
    /// Params with persistent MXFP8 storage (rowwise and columnwise copies on every rank).
    pub mxfp8: Vec<Mxfp8Tensor>,
    /// Byte order of the MXFP8 scales.
    pub mxfp8_scale_layout: ScaleLayout,
}

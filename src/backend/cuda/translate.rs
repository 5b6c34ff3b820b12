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

mod adamw;
mod collectives;
mod init;
mod memory;
mod muon;
mod mxfp8;
mod newton_schulz;
mod newton_schulz_gram;
mod norm;
mod qk_clip;

use std::collections::HashMap;

use crate::backend::cuda::action::{Action, Arg, Buf, DevPtr, Kernel, Launch, NcclCall, NcclComm, NcclType};
use crate::backend::ops::{MemoryLayout, NormSums, NormTerm, Op, Scalar, StreamKind};
use crate::bail;
use crate::error::Result;
use crate::numerics::RANK_NORM_WORDS;
use crate::numerics::muon::MuonOptions;
use memory::WorkSizes;

/// Threads per block of every 1-D kernel.
const THREADS: u32 = 256;
/// Most blocks of a grid-stride launch (enough to fill any current GPU).
const MAX_BLOCKS: u64 = 8192;
/// Scalar slot of an exchange's send value, right after the step's scalars.
const SEND_SLOT: u64 = Scalar::COUNT as u64;
/// First of the [`RANK_NORM_WORDS`] slots of this rank's part of the norm: its exact Σ g²
/// (`muon_norm_partials`) and its steps (`numerics::RankNorm`).
const NORM_SUM_SLOT: u64 = SEND_SLOT + 1;
/// First of the receive slots: an exchange's values, or every rank's part of the step's norm
/// ([`RANK_NORM_WORDS`] per rank).
const RECEIVE_SLOTS: u64 = NORM_SUM_SLOT + RANK_NORM_WORDS as u64;

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

/// Rows and columns of a tile of the transposing kernels (`MUON_TILE` in kernels/muon.cu).
const TILE: u64 = 32;
/// Most blocks along grid.y or grid.z (CUDA's limit is 65535; the tiled kernels stride past it).
const MAX_GRID_YZ: u64 = 65535;

/// A launch of a tiled kernel over `batch` matrices of `rows × cols`: one block of 32 × 8
/// threads per 32 × 32 tile.
fn launch_tiled(kernel: Kernel, rows: u64, cols: u64, batch: u64, args: Vec<Arg>) -> Result<Action> {
    Ok(Action::Launch(Launch {
        kernel,
        grid: [
            to_u32("column tiles", cols.div_ceil(TILE).max(1))?,
            rows.div_ceil(TILE).clamp(1, MAX_GRID_YZ) as u32,
            batch.clamp(1, MAX_GRID_YZ) as u32,
        ],
        block: [TILE as u32, 8, 1],
        stream: StreamKind::Compute,
        args,
    }))
}

fn to_i32(what: &str, value: u64) -> Result<i32> {
    i32::try_from(value).or_else(|_| bail!(Unsupported, "{what} {value} exceeds cuBLAS's 32-bit dimensions"))
}

fn to_u32(what: &str, value: u64) -> Result<u32> {
    u32::try_from(value).or_else(|_| bail!(Unsupported, "{what} {value} exceeds the kernels' 32-bit dimensions"))
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
            sums: NormSums::Device(self.slot(RECEIVE_SLOTS)?),
        })
    }

    /// The allocations a backend makes at creation, before `allocate`: the step's scalars
    /// ([`Scalar`]), the send slot of an exchange, this rank's Σ g² and the receive slots (one
    /// per rank of an exchange, or every rank's Σ g²).
    pub fn setup(&self) -> Vec<Action> {
        let exchange = self.dp.max(self.norm_ranks()).max(self.tp_ranks());
        let receive = exchange.max(self.norm_ranks() * RANK_NORM_WORDS) as u64;
        vec![
            Action::Alloc {
                buf: Buf::Scalars,
                bytes: (RECEIVE_SLOTS + receive) * 8,
            },
            // Zeroed on the compute stream; the comm stream uses the slots next.
            Action::Synchronize(StreamKind::Compute),
        ]
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
            &Op::Copy { stream, src, dst } => self.copy(stream, src, dst),
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
                    send: self.slot(NORM_SUM_SLOT)?,
                    recv: self.slot(RECEIVE_SLOTS)?,
                    send_count: RANK_NORM_WORDS as u64,
                    dtype: NcclType::U64,
                }],
            )]),
            Op::FinishStep { constants, terms } => self.finish_step(constants, terms),
            // The slots from Lr on (`StepArgs::slots`): a captured step reads them at replay.
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
}

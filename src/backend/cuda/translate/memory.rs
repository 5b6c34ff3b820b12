//! Memory: the allocations of a layout, spans resolved to device addresses, uploads.

use super::Translator;
use super::newton_schulz::TILE_LISTS;
use super::norm::PARTIALS;
use crate::backend::cuda::action::{Action, Buf, DevPtr, Work};
use crate::backend::ops::{Mem, MemoryLayout, Scalar, Span, StreamKind};
use crate::bail;
use crate::config::{Dtype, MuonVariant, NsPrecision};
use crate::error::Result;
use crate::numerics::bf16::f32_to_bf16_rne;
use crate::numerics::muon::TpDim;
use crate::numerics::mxfp8::{Direction, scale_shape};

/// A span resolved to device memory.
#[derive(Debug, Clone, Copy)]
pub(super) struct Resolved {
    pub(super) ptr: DevPtr,
    pub(super) dtype: Dtype,
    pub(super) len: u64,
}

impl Resolved {
    pub(super) fn is_bf16(&self) -> i32 {
        i32::from(self.dtype == Dtype::Bf16)
    }

    pub(super) fn bytes(&self) -> u64 {
        self.len * self.dtype.size() as u64
    }

    /// Element `index` of the span.
    pub(super) fn at(&self, index: u64) -> DevPtr {
        self.ptr + index * self.dtype.size() as u64
    }
}

/// Element capacities of the Muon workspace, the real need of the rank's jobs
/// ([`crate::backend::ops::MuonWork`]).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct WorkSizes {
    /// Elements of `Update`, `X`, `XNext`, `XBf16`: the largest job's `rows · cols`.
    pub(super) matrix: u64,
    /// Elements of `Gram`, `Poly`, `GramBf16`: the largest `batch · min(r, c)²` of a batch of
    /// equal components.
    pub(super) gram: u64,
    /// Elements of `PolyBf16`, `GramQ`, `GramQBf16`, `GramSpare` (and of `Poly` in bf16
    /// precision): the largest `batch · m²` that runs the Gram iteration; 0 when none does.
    pub(super) gram_iteration: u64,
    /// f64 slots of `Norms`: the most matrices of one batch.
    pub(super) norms: u64,
    /// NorMuon's f64 line sums of one batch (`Moment2Sums`, followed by `norms` ratios); 0
    /// for standard Muon.
    pub(super) lines: u64,
    /// Device pointers of `TileTables`: [`TILE_LISTS`] lists of three operands' tiles, each as
    /// many as the most tiles of one batch of symmetric products (`batch · T(T+1)/2 ≤
    /// batch · m² / tile² ≤ gram / tile²`); 0 when no product is tiled.
    pub(super) tile_pointers: u64,
}

impl Translator {
    /// Records where `buf` was allocated.
    pub fn bind(&mut self, buf: Buf, ptr: DevPtr, bytes: u64) {
        self.map.insert(buf, (ptr, bytes));
    }

    pub(super) fn buffer(&self, buf: Buf) -> Result<(DevPtr, u64)> {
        match self.map.get(&buf) {
            Some(&entry) => Ok(entry),
            None => bail!(Internal, "{buf:?} is not allocated"),
        }
    }

    pub(super) fn layout(&self) -> Result<&MemoryLayout> {
        match &self.layout {
            Some(layout) => Ok(layout),
            None => bail!(Internal, "the cuda backend is not allocated"),
        }
    }

    pub(super) fn work(&self, work: Work) -> Result<DevPtr> {
        Ok(self.buffer(Buf::Work(work))?.0)
    }

    /// Scalar slot `i` (f64).
    pub(super) fn slot(&self, i: u64) -> Result<DevPtr> {
        Ok(self.buffer(Buf::Scalars)?.0 + 8 * i)
    }

    /// The slot of `scalar`.
    pub(super) fn scalar(&self, scalar: Scalar) -> Result<DevPtr> {
        self.slot(scalar.slot() as u64)
    }

    /// The device memory of `span`, bounds-checked; a staging span views its grad buffer's
    /// bytes as bf16 (as on the host).
    pub(super) fn resolve(&self, span: Span) -> Result<Resolved> {
        let layout = self.layout()?;
        let (mem, dtype) = match span.mem {
            Mem::Staging(i) => (Mem::Grad(i), Dtype::Bf16),
            Mem::Grad(_) | Mem::OwnedGrad(_) => (span.mem, layout.grad_dtype),
            Mem::Param(i) | Mem::OwnedParam(i) => match layout.buffers.get(i as usize) {
                Some(sizes) => (span.mem, sizes.dtype),
                None => bail!(Internal, "{:?} is not allocated", span.mem),
            },
            Mem::Momentum => (span.mem, layout.momentum_dtype),
            Mem::Master | Mem::Moment2 | Mem::ExpAvg | Mem::ExpAvgSq => (span.mem, Dtype::F32),
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

    pub(super) fn resolve_f32(&self, span: Span) -> Result<Resolved> {
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

    pub(super) fn allocate(&mut self, layout: &MemoryLayout) -> Vec<Action> {
        self.map.retain(|buf, _| *buf == Buf::Scalars);
        let mut actions = Vec::new();
        let mut alloc = |buf: Buf, bytes: u64| actions.push(Action::Alloc { buf, bytes });
        for (i, b) in layout.buffers.iter().enumerate() {
            alloc(Buf::Mem(Mem::Param(i as u32)), b.param_numel * b.dtype.size() as u64);
            alloc(Buf::Mem(Mem::Grad(i as u32)), b.numel * layout.grad_dtype.size() as u64);
            if b.owned_numel > 0 {
                alloc(
                    Buf::Mem(Mem::OwnedParam(i as u32)),
                    b.owned_numel * b.dtype.size() as u64,
                );
                alloc(
                    Buf::Mem(Mem::OwnedGrad(i as u32)),
                    b.owned_numel * layout.grad_dtype.size() as u64,
                );
            }
        }
        alloc(Buf::Mem(Mem::Master), layout.master * 4);
        alloc(
            Buf::Mem(Mem::Momentum),
            layout.momentum * layout.momentum_dtype.size() as u64,
        );
        if layout.moment2 > 0 {
            alloc(Buf::Mem(Mem::Moment2), layout.moment2 * 4);
        }
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
            gram_iteration: need.gram_iteration,
            norms: need.run.max(1),
            lines: if self.muon.variant == MuonVariant::Normuon {
                need.lines
            } else {
                0
            },
            tile_pointers: self.tile_pointers(need.gram),
        };
        // The update of a Nesterov step or of a bf16 momentum; otherwise it is the momentum
        // itself, and the workspace only holds the masters of a per-group split while it runs
        // in component order.
        let update = if self.muon.nesterov || self.muon.momentum_bf16 {
            work.matrix
        } else {
            need.grouped
        };
        if update > 0 {
            alloc(Buf::Work(Work::Update), update * 4);
        }
        alloc(Buf::Work(Work::X), work.matrix * 4);
        alloc(Buf::Work(Work::Gram), work.gram * 4);
        // The Gram iteration's square matrices, only as large as the batches that run it.
        let squares = work.gram_iteration;
        match self.muon.ns.precision {
            NsPrecision::Bf16 | NsPrecision::Bf16Iterate => {
                alloc(Buf::Work(Work::XBf16), work.matrix * 2);
                alloc(Buf::Work(Work::GramBf16), work.gram * 2);
                if squares > 0 {
                    alloc(Buf::Work(Work::Poly), squares * 4);
                    alloc(Buf::Work(Work::PolyBf16), squares * 2);
                    alloc(Buf::Work(Work::GramQ), squares * 4);
                    alloc(Buf::Work(Work::GramQBf16), squares * 2);
                }
            }
            NsPrecision::F32 => {
                alloc(Buf::Work(Work::XNext), work.matrix * 4);
                alloc(Buf::Work(Work::Poly), work.gram * 4);
                if squares > 0 {
                    alloc(Buf::Work(Work::GramQ), squares * 4);
                    alloc(Buf::Work(Work::GramSpare), squares * 4);
                }
            }
        }
        alloc(Buf::Work(Work::Norms), work.norms * 8);
        if work.lines > 0 {
            alloc(Buf::Work(Work::Moment2Sums), (work.lines + work.norms) * 8);
        }
        if work.tile_pointers > 0 {
            alloc(Buf::Work(Work::TileTables), work.tile_pointers * 8);
        }
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

    /// [`WorkSizes::tile_pointers`] for `gram` elements of the largest batch of squares.
    fn tile_pointers(&self, gram: u64) -> u64 {
        let side = self.muon.ns.symmetric_tile as u64;
        // A product is tiled from two tiles a side: below 4·tile² elements none is.
        if side == 0 || gram < 4 * side * side {
            return 0;
        }
        TILE_LISTS * 3 * (gram / (side * side))
    }

    pub(super) fn upload(&self, dst: Span, bits: &[u32]) -> Result<Vec<Action>> {
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
}

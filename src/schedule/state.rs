//! Where a rank keeps its fp32 masters and optimizer state: the Muon units it owns, then the
//! AdamW pieces of its shards, packed in plan order. The master of an f32 param is the param
//! itself (its range of the param buffer, or with sharding of the owned storage): a copy would
//! hold the same bits.

use crate::backend::ops::{BufferSizes, Mem, MemoryLayout, MuonWork, Mxfp8Tensor, Span, TpComponent};
use crate::config::{Config, Dtype, MuonVariant, TpMode};
use crate::model::ParamFlags;
use crate::model::ParamSpec;
use crate::numerics::mxfp8::ScaleLayout;
use crate::numerics::newton_schulz::NsOptions;
use crate::plan::Plan;
use crate::plan::{ElemRange, OwnedUnit, ShardPiece};

use super::window::{Window, kept_grad, kept_param};

/// One owned Muon unit and where its state is.
#[derive(Debug, Clone, Copy)]
pub struct MuonSlot {
    pub unit: OwnedUnit,
    /// Offset in `Mem::Momentum`.
    pub state: u64,
    /// Offset in `Mem::Moment2` and length (0 for standard Muon): the NorMuon second moment of
    /// the unit, [`moment2_lines`] values.
    pub moment2: (u64, u64),
    /// Its fp32 master: in `Mem::Master`, or the unit's range of an f32 param buffer.
    pub master: Span,
    /// Its reduced gradient: in the grad buffer, or with sharded params in its owned storage.
    pub grad: Span,
}

/// One owned AdamW piece and where its state is.
#[derive(Debug, Clone, Copy)]
pub struct AdamwSlot {
    pub bucket: u32,
    pub buffer: u32,
    pub piece: ShardPiece,
    /// Its fp32 master: in `Mem::Master`, or the piece's range of an f32 param buffer.
    pub master: Span,
    /// Its reduced gradient: in the grad buffer, or with sharded params in its owned storage.
    pub grad: Span,
    /// Offset in `Mem::ExpAvg` and `Mem::ExpAvgSq`.
    pub moments: u64,
}

/// Where the master of `range` (elements of bucket `bucket`'s buffer) lives: the owner's
/// model-dtype storage itself when the buffer is f32 ([`kept_param`]), else the next
/// `range.len()` elements of `Mem::Master` from `*offset` (which advances).
fn master_span(plan: &Plan, window: Option<&Window>, bucket: u32, range: ElemRange, offset: &mut u64) -> Span {
    let bucket = &plan.buckets[bucket as usize];
    let in_place = (plan.buffers[bucket.buffer as usize].dtype == Dtype::F32)
        .then(|| kept_param(bucket, window, range))
        .flatten();
    match in_place {
        Some(span) => span,
        None => {
            let span = Span::new(Mem::Master, *offset, range.len());
            *offset += range.len();
            span
        }
    }
}

/// A rank's state layout.
#[derive(Debug, Clone)]
pub struct StateLayout {
    pub muon: Vec<MuonSlot>,
    pub adamw: Vec<AdamwSlot>,
    /// The owned Muon units grouped into update jobs: consecutive experts of one stack go
    /// together (one strided batch on the GPU), up to [`MAX_BATCH_ELEMENTS`].
    pub muon_batches: Vec<MuonBatch>,
    pub memory: MemoryLayout,
    /// With `param_sharding = sharded`: the owned storage and gather window of the params and
    /// gradients.
    pub window: Option<Window>,
}

/// Largest number of elements batched into one Muon job (the job's workspace scales with it);
/// a single larger matrix still forms a job of its own.
pub const MAX_BATCH_ELEMENTS: u64 = 1 << 26;

/// `count` consecutive entries of [`StateLayout::muon`], starting at `first`: consecutive
/// units of one param, so their buffer ranges and their state are both contiguous.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MuonBatch {
    pub first: usize,
    pub count: usize,
}

fn batch_units(muon: &[MuonSlot]) -> Vec<MuonBatch> {
    let mut batches: Vec<MuonBatch> = Vec::new();
    for (i, slot) in muon.iter().enumerate() {
        if let Some(last) = batches.last_mut() {
            let first = &muon[last.first];
            let prev = &muon[i - 1];
            let joins = first.unit.param == slot.unit.param
                && prev.unit.unit + 1 == slot.unit.unit
                && prev.unit.range.end == slot.unit.range.start
                && (last.count as u64 + 1) * slot.unit.range.len() <= MAX_BATCH_ELEMENTS;
            if joins {
                last.count += 1;
                continue;
            }
        }
        batches.push(MuonBatch { first: i, count: 1 });
    }
    batches
}

impl StateLayout {
    /// Lays out the state of `rank` (with `param_sharding = sharded`, in its [`Window`]).
    pub fn new(plan: &Plan, params: &[ParamSpec], cfg: &Config, rank: usize) -> Self {
        let sharded = cfg.sharded().then(|| Window::new(plan, cfg, rank));
        let window = sharded.as_ref();
        let (mut momentum, mut master, mut moment2) = (0u64, 0u64, 0u64);
        let muon: Vec<MuonSlot> = plan
            .muon_units_of(rank)
            .into_iter()
            .map(|unit| {
                let lines = moment2_lines(&params[unit.param as usize], cfg);
                let slot = MuonSlot {
                    unit,
                    state: momentum,
                    moment2: (moment2, lines),
                    master: master_span(plan, window, unit.bucket, unit.range, &mut master),
                    grad: kept_grad(&plan.buckets[unit.bucket as usize], window, unit.range),
                };
                momentum += unit.range.len();
                moment2 += lines;
                slot
            })
            .collect();
        let muon_batches = batch_units(&muon);
        let max_component = muon_batches.iter().fold((0usize, 0usize), |bound, batch| {
            let spec = &params[muon[batch.first].unit.param as usize];
            let cols = spec.unit_matrix().cols as usize;
            component_rows(spec, 1)
                .into_iter()
                .fold(bound, |(elements, short), rows| {
                    (elements.max(rows * cols), short.max(rows.min(cols)))
                })
        });
        let ns = NsOptions::from_config(cfg);
        let muon_work = muon_batches.iter().fold(MuonWork::default(), |need, batch| {
            let spec = &params[muon[batch.first].unit.param as usize];
            let rows = component_rows(spec, batch.count);
            let mut job = MuonWork::of_job(&rows, spec.unit_matrix().cols as usize, spec.split_groups as usize, &ns);
            // A duplicated or distributed TP shard never runs Newton–Schulz as it is shaped here
            // (whole, or in the orientation the mode forces): its Gram iteration is sized with
            // the TP components (`tp_components`), by the translator, which knows the TP size.
            if spec.tp_joined().is_some() && cfg.muon_tp_mode != TpMode::Blockwise {
                job.gram_iteration = 0;
            }
            need.max(job)
        });
        let mut tp_components: Vec<TpComponent> = Vec::new();
        if cfg.muon_tp_mode != TpMode::Blockwise {
            for batch in &muon_batches {
                let spec = &params[muon[batch.first].unit.param as usize];
                if let Some(dim) = spec.tp_joined() {
                    let cols = spec.unit_matrix().cols as usize;
                    tp_components.extend(component_rows(spec, 1).into_iter().map(|rows| TpComponent {
                        rows,
                        cols,
                        dim,
                        mode: cfg.muon_tp_mode,
                    }));
                }
            }
            tp_components.sort_by_key(|c| (c.rows, c.cols, c.dim));
            tp_components.dedup();
        }
        let mut moments = 0u64;
        let mut adamw = Vec::new();
        for shard in plan.adamw_shards_of(rank) {
            for piece in shard.pieces {
                adamw.push(AdamwSlot {
                    bucket: shard.bucket,
                    buffer: shard.buffer,
                    piece,
                    master: master_span(plan, window, shard.bucket, piece.buffer_range, &mut master),
                    grad: kept_grad(&plan.buckets[shard.bucket as usize], window, piece.buffer_range),
                    moments,
                });
                moments += piece.param_range.len();
            }
        }
        let memory = MemoryLayout {
            buffers: plan
                .buffers
                .iter()
                .enumerate()
                .map(|(i, b)| match window {
                    Some(w) => BufferSizes {
                        numel: w.window_numel[i],
                        param_numel: w.window_numel[i],
                        owned_numel: w.owned_numel[i],
                        dtype: b.dtype,
                    },
                    None => BufferSizes {
                        numel: b.numel,
                        param_numel: b.param_numel,
                        owned_numel: 0,
                        dtype: b.dtype,
                    },
                })
                .collect(),
            grad_dtype: cfg.grad_dtype,
            master,
            momentum,
            momentum_dtype: cfg.muon_momentum_dtype,
            moment2,
            adam_moments: moments,
            max_component,
            muon_work,
            tp_components,
            mxfp8: params
                .iter()
                .enumerate()
                .filter(|(_, spec)| spec.flags.has(ParamFlags::MXFP8))
                .map(|(p, spec)| {
                    let (rows, cols) = spec.flat_2d();
                    Mxfp8Tensor {
                        param: p as u32,
                        rows: rows as usize,
                        cols: cols as usize,
                    }
                })
                .collect(),
            mxfp8_scale_layout: if cfg.mxfp8_swizzled_scales {
                ScaleLayout::Swizzled
            } else {
                ScaleLayout::Compact
            },
        };
        StateLayout {
            muon,
            adamw,
            muon_batches,
            memory,
            window: sharded,
        }
    }
}

impl MuonSlot {
    pub fn master(&self) -> Span {
        self.master
    }
    pub fn momentum(&self) -> Span {
        Span::new(Mem::Momentum, self.state, self.unit.range.len())
    }
    pub fn moment2(&self) -> Span {
        Span::new(Mem::Moment2, self.moment2.0, self.moment2.1)
    }
    pub fn grad(&self) -> Span {
        self.grad
    }
}

impl AdamwSlot {
    fn len(&self) -> u64 {
        self.piece.buffer_range.len()
    }
    pub fn master(&self) -> Span {
        self.master
    }
    pub fn exp_avg(&self) -> Span {
        Span::new(Mem::ExpAvg, self.moments, self.len())
    }
    pub fn exp_avg_sq(&self) -> Span {
        Span::new(Mem::ExpAvgSq, self.moments, self.len())
    }
    pub fn grad(&self) -> Span {
        self.grad
    }
}

/// The second-moment values of one unit of `spec` under `cfg` ([`ParamSpec::moment2_values`]
/// of the components as this rank holds them: a TP shard's own): 0 for standard Muon.
pub fn moment2_lines(spec: &ParamSpec, cfg: &Config) -> u64 {
    spec.moment2_values(cfg.muon_variant)
}

/// The rows of each component of a Muon job over `count` consecutive units of `spec`: every
/// unit is one matrix, split further by the fused splits (a component of a per-group split
/// holds its rows of every group).
pub fn component_rows(spec: &ParamSpec, count: usize) -> Vec<usize> {
    let unit: Vec<usize> = spec.unit_components().iter().map(|c| c.rows as usize).collect();
    unit.repeat(count)
}

/// Calls `visit(item, value, first)` for every item of one unit of `spec` (row-major in the
/// unit) with the index of its second-moment value in the unit's [`moment2_lines`] values
/// under `variant`, and whether it is the first item of that value: per component (its rows in
/// component order, `numerics::muon::component_row_order`), NorMuon's values are its rows when
/// it has at least as many rows as columns, else its columns; AdaMuon's are its elements.
fn visit_moment2_items(spec: &ParamSpec, variant: MuonVariant, mut visit: impl FnMut(usize, usize, bool)) {
    let cols = spec.unit_matrix().cols as usize;
    let rows = component_rows(spec, 1);
    let order = crate::numerics::muon::component_row_order(&rows, spec.split_groups.max(1) as usize);
    let (mut first_row, mut base) = (0, 0);
    for &comp_rows in &rows {
        let by_row = crate::numerics::normuon::per_row(comp_rows, cols);
        for i in 0..comp_rows {
            let row = order[first_row + i];
            for j in 0..cols {
                let (value, first) = match variant {
                    MuonVariant::Adamuon => (i * cols + j, true),
                    _ if by_row => (i, j == 0),
                    _ => (j, i == 0),
                };
                visit(row * cols + j, base + value, first);
            }
        }
        first_row += comp_rows;
        base += crate::numerics::adaptive::moment2_values(variant, comp_rows, cols);
    }
}

/// One unit's second moment under `variant` (`values`, [`moment2_lines`] values) as one value
/// per item of the unit: each item holds its value (NorMuon: its line's; how checkpoints store
/// it, `checkpoint::StateKind::Moment2`).
pub fn moment2_to_items(spec: &ParamSpec, variant: MuonVariant, values: &[f32]) -> Vec<f32> {
    let mut items = vec![0.0; spec.unit_matrix().rows as usize * spec.unit_matrix().cols as usize];
    visit_moment2_items(spec, variant, |item, value, _| items[item] = values[value]);
    items
}

/// The inverse of [`moment2_to_items`]: each value takes that of its first item (a NorMuon
/// checkpoint of another TP shard shape, whose lines differ, gives each line the statistic
/// its first item had).
pub fn moment2_from_items(spec: &ParamSpec, variant: MuonVariant, items: &[f32]) -> Vec<f32> {
    let mut values = vec![0.0; spec.moment2_values(variant) as usize];
    visit_moment2_items(spec, variant, |item, value, first| {
        if first {
            values[value] = items[item];
        }
    });
    values
}

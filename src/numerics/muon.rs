//! The per-matrix Muon update on fp32 masters (docs/design.md §6), following
//! Megatron-LM / Emerging-Optimizers (`OrthogonalizedOptimizer.step`, `Muon`).
//!
//! For one owned matrix `W` (`rows × cols`) with momentum `M` and reduced gradient `G`, every
//! scalar operation in f32, in this order (`lr_eff = lr·lr_scale`, `wd_eff = wd·wd_scale`,
//! `decay = 1 − lr_eff·wd_eff` from [`param_rates`]):
//! 1. `g = (G·grad_scale)·clip_coef`, `M = μ·M + (1−μ)·g`, with a bf16 momentum
//!    (`muon_momentum_dtype = bf16`) rounded to bf16 (nearest even) as it is stored;
//! 2. `U = g + μ·(M − g)` with Nesterov, else `U = M`;
//! 3. per fused component `k` (rows split along dim 0; the whole matrix when there is no
//!    split): `X_k = NS(U_k)` ([`newton_schulz`](super::newton_schulz)) and
//!    `scale_k = s(mode, rows_k, cols)·extra_scale_factor`, `s` from [`muon_scale`]. With
//!    per-group splits component `k` is its rows of every group, in group order. For a
//!    tensor-parallel shard ([`muon_update_sharded`]) `duplicated` mode gathers `U_k` whole
//!    over the TP ranks, orthogonalizes it and keeps this rank's chunk; `distributed` mode runs
//!    Newton–Schulz on the shard with the norm and every `X·Xᵀ` summed over the ranks; both
//!    scale by the whole component's shape;
//! 4. with `muon_variant = normuon` or `adamuon`, `X_k` is normalized by its second moment
//!    first ([`normuon`](super::normuon): statistics per line of the longer side of the
//!    component as this rank holds it — a TP shard's own, as Megatron-LM's
//!    `TensorParallelAdaptiveMuon` keeps them; [`adamuon`](super::adamuon): one per element)
//!    — each component with its [`adaptive::moment2_values`] values of the param's moment2
//!    state, in component order;
//! 5. `W = W·decay − (lr_eff·scale_k)·X_k`; with cautious weight decay
//!    (`cautious_weight_decay`) `W = W·d − (lr_eff·scale_k)·X_k`, `d = decay` where
//!    `W·X_k ≥ 0` (the f32 product) and `d = 1` (no rounding) elsewhere.
//!
//! Step 5 fuses Megatron's decoupled weight decay `p.mul_(1 − lr·wd)` (done before the
//! update there) with the update; it is the same `W ← W − lr·wd·W − lr·scale·X`. Cautious
//! weight decay is microsoft/dion's `cautious_wd` (arXiv 2510.12402): `dion/muon.py`
//! `muon_update_post_orthogonalize` (commit 0a059a4542e5aa74b40dcd1dce363836c7afcd48) decays
//! `X` by `base_lr·weight_decay·X·mask` with `mask = min(sign(X·U) + 1, 1)`, i.e. 1 where
//! `X·U ≥ 0`, before `X −= adjusted_lr·U` — the same rule, fused as the plain decay is. The scale is
//! computed per component shape, as Emerging-Optimizers does when it orthogonalizes split
//! QKV components one by one through `scaled_orthogonalize_fn`.

use crate::bail;
use crate::config::{Config, Dtype, MuonVariant, NsPrecision, ScaleMode, TpMode};
use crate::error::Result;
use crate::numerics::adaptive::{self, AdaptiveOptions};
use crate::numerics::bf16::round_through_bf16;
use crate::numerics::newton_schulz::{
    NsOptions, NsWorkspace, ShardSums, newton_schulz_in_place, newton_schulz_sharded_in_place,
};
use crate::numerics::step_args::{ParamScales, param_rates};

/// The Muon fields of a configuration (the momentum μ is the step's: [`MuonStepArgs`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MuonOptions {
    /// Nesterov momentum.
    pub nesterov: bool,
    /// The Newton–Schulz iteration.
    pub ns: NsOptions,
    /// How the orthogonalized update is scaled.
    pub scale_mode: ScaleMode,
    /// Extra multiplier of the update scale (0.2 matches AdamW's update RMS, Moonlight).
    pub extra_scale_factor: f32,
    /// Muon, NorMuon or AdaMuon.
    pub variant: MuonVariant,
    /// The adaptive variants' β2 and ε (not read by standard Muon).
    pub adaptive: AdaptiveOptions,
    /// Cautious weight decay: decay only where the weight and its update share a sign.
    pub cautious_weight_decay: bool,
    /// The momentum is stored in bf16: each new value is rounded to bf16 (`muon_momentum_dtype`).
    pub momentum_bf16: bool,
}

impl MuonOptions {
    /// Takes `muon_nesterov`, the Newton–Schulz fields, `muon_scale_mode`,
    /// `muon_extra_scale_factor`, `muon_variant`, the adaptive variants' constants and
    /// `cautious_weight_decay` and whether `muon_momentum_dtype` is bf16 from `cfg`.
    pub fn from_config(cfg: &Config) -> Self {
        MuonOptions {
            nesterov: cfg.muon_nesterov,
            ns: NsOptions::from_config(cfg),
            scale_mode: cfg.muon_scale_mode,
            extra_scale_factor: cfg.muon_extra_scale_factor,
            variant: cfg.muon_variant,
            adaptive: AdaptiveOptions {
                beta2: cfg.adaptive_muon_beta2,
                eps: cfg.adaptive_muon_eps,
            },
            cautious_weight_decay: cfg.cautious_weight_decay,
            momentum_bf16: cfg.muon_momentum_dtype == Dtype::Bf16,
        }
    }

    /// The second-moment values of a job of `shape` (0 for standard Muon): per component,
    /// [`adaptive::moment2_values`] of its rows and the columns.
    pub fn moment2_len(&self, shape: &MuonShape<'_>) -> usize {
        let whole = [shape.rows];
        let components = if shape.split_rows.is_empty() {
            &whole[..]
        } else {
            shape.split_rows
        };
        components
            .iter()
            .map(|&rows| adaptive::moment2_values(self.variant, rows, shape.cols))
            .sum()
    }
}

/// The per-step, per-parameter scalars of a Muon update.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MuonStepArgs {
    /// Learning rate of the Muon group at this step.
    pub lr: f32,
    /// Weight decay of the Muon group.
    pub weight_decay: f32,
    /// The parameter's multipliers of both.
    pub scales: ParamScales,
    /// EMA momentum coefficient μ at this step (the config's `muon_momentum`, or the step's
    /// override).
    pub momentum: f32,
    /// What the summed gradient is multiplied by first: `1/dp`, its mean (1 for a gradient
    /// that is the mean already).
    pub grad_scale: f32,
    /// The global gradient-clip multiplier ([`clip_coefficient`](super::clip_coefficient)),
    /// applied to the mean; 1 when clipping is off.
    pub clip_coef: f32,
}

/// The shape of one Muon matrix and its fused components.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MuonShape<'a> {
    /// Rows of the whole matrix (dim 0).
    pub rows: usize,
    /// Columns (dim 1), shared by every component.
    pub cols: usize,
    /// Rows of each fused component, summing to `rows`; empty = not fused.
    pub split_rows: &'a [usize],
    /// Groups the components are interleaved in: the rows are `split_groups` blocks, each
    /// holding `split_rows[c] / split_groups` rows of every component c in order, and
    /// component c is its part of every group stacked in group order (Megatron's
    /// per-query-group QKV split). 1 = consecutive components.
    pub split_groups: usize,
}

impl MuonShape<'_> {
    /// `InvalidArgument` unless both dimensions are >= 1 and every component (the whole matrix
    /// when there is no split) has >= 1 row, a multiple of the split groups, the components
    /// summing to `rows`. Both backends check a job with it.
    pub fn check(&self) -> Result<()> {
        let (rows, cols, splits) = (self.rows, self.cols, self.split_rows);
        if rows == 0 || cols == 0 || rows.checked_mul(cols).is_none() {
            bail!(
                InvalidArgument,
                "muon_update: shape {rows}×{cols} is invalid; both dimensions must be >= 1"
            );
        }
        let whole = [rows];
        let components = if splits.is_empty() { &whole[..] } else { splits };
        if components.contains(&0) {
            bail!(
                InvalidArgument,
                "muon_update: split_rows {splits:?} has a 0; every component needs >= 1 row"
            );
        }
        let sum = components.iter().try_fold(0usize, |acc, &r| acc.checked_add(r));
        if sum != Some(rows) {
            bail!(
                InvalidArgument,
                "muon_update: split_rows {splits:?} do not sum to rows {rows}"
            );
        }
        let groups = self.split_groups.max(1);
        if let Some(c) = components.iter().position(|&r| r % groups != 0) {
            bail!(
                InvalidArgument,
                "muon_update: split_rows[{c}] = {} is not a multiple of the {groups} split groups",
                components[c]
            );
        }
        Ok(())
    }
}

/// The update scale of an orthogonalized `rows × cols` matrix (`m = rows`, `n = cols`):
/// `spectral` √max(m, n), `shape_scaling` √max(1, m/n), `unit_rms_norm` √(m/n), computed in
/// f64 and rounded to f32, then multiplied in f32 by `extra_scale_factor`.
pub fn muon_scale(mode: ScaleMode, rows: usize, cols: usize, extra_scale_factor: f32) -> f32 {
    let (m, n) = (rows as f64, cols as f64);
    let base = match mode {
        ScaleMode::Spectral => m.max(n).sqrt(),
        ScaleMode::ShapeScaling => (m / n).max(1.0).sqrt(),
        ScaleMode::UnitRmsNorm => (m / n).sqrt(),
    };
    base as f32 * extra_scale_factor
}

/// Scratch memory of [`muon_update`]: the Newton–Schulz workspace and the update buffer.
#[derive(Debug, Clone, Default)]
pub struct MuonWorkspace {
    ns: NsWorkspace,
    update: Vec<f32>,
    /// A tensor-parallel component gathered whole.
    full: Vec<f32>,
    /// The update in component-major row order (per-group splits).
    grouped: Vec<f32>,
}

impl MuonWorkspace {
    /// A workspace that never allocates for matrices up to `max_rows × max_cols`.
    pub fn new(max_rows: usize, max_cols: usize) -> Self {
        MuonWorkspace {
            ns: NsWorkspace::new(max_rows, max_cols),
            update: vec![0.0; max_rows * max_cols],
            full: Vec::new(),
            grouped: Vec::new(),
        }
    }

    /// A workspace for jobs of at most `job_elements` elements whose single matrices (fused
    /// components) have at most `elements` elements and a shorter side of at most
    /// `short_side`, running the Newton–Schulz products on `threads` threads.
    ///
    /// # Errors
    /// `OutOfMemory` (naming the sizes) if it does not fit; nothing stays allocated then.
    pub fn for_need(
        job_elements: usize,
        (elements, short_side): (usize, usize),
        precision: NsPrecision,
        threads: usize,
    ) -> Result<Self> {
        let ns = NsWorkspace::for_need(elements, short_side, precision)?.with_threads(threads);
        let mut update = Vec::new();
        if update.try_reserve_exact(job_elements).is_err() {
            bail!(
                OutOfMemory,
                "muon_update: an update buffer of {job_elements} elements does not fit in host memory"
            );
        }
        update.resize(job_elements, 0.0);
        Ok(MuonWorkspace {
            ns,
            update,
            full: Vec::new(),
            grouped: Vec::new(),
        })
    }
}

/// The dimension along which a matrix is sharded over tensor-parallel ranks (Megatron's
/// `partition_dim`): `Rows` for a column-parallel weight `[out/tp, in]`, `Cols` for a
/// row-parallel weight `[out, in/tp]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TpDim {
    Rows,
    Cols,
}

/// A tensor-parallel Muon job: the dimension its matrix is split along, and how the shards
/// are orthogonalized (`muon_tp_mode` duplicated or distributed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TpJob {
    pub dim: TpDim,
    pub mode: TpMode,
}

/// This rank's shard of a tensor-parallel matrix, with `gather` returning every one of the
/// `ranks` TP ranks' values in rank order (this one is `rank`). Duplicated mode orthogonalizes
/// each component gathered whole and keeps this rank's part; distributed mode runs
/// Newton–Schulz on the shard with the norm and every `X·Xᵀ` summed over the ranks in rank
/// order (through the same gather). Either way the update scale is the whole component's.
pub struct TpShard<'a> {
    pub job: TpJob,
    pub ranks: usize,
    pub rank: usize,
    pub gather: &'a mut dyn FnMut(&[f32]) -> Result<Vec<f32>>,
}

/// Applies one Muon update to `master` and `momentum` from `grad` (all `rows × cols`,
/// row-major). The exact operation order is in the module documentation.
///
/// # Errors
/// `InvalidArgument` if a dimension is 0, a slice is not `rows·cols` long, or the splits have
/// a 0 or do not sum to `rows`; `OutOfRange` for bad `opts.ns.steps`. Nothing is modified on
/// error.
pub fn muon_update(
    master: &mut [f32],
    momentum: &mut [f32],
    grad: &[f32],
    shape: &MuonShape<'_>,
    args: &MuonStepArgs,
    opts: &MuonOptions,
    ws: &mut MuonWorkspace,
) -> Result<()> {
    muon_update_with_moment2(master, momentum, &mut [], grad, shape, args, opts, ws)
}

/// [`muon_update`] with the NorMuon second moment `moment2` ([`MuonOptions::moment2_len`]
/// values; empty for standard Muon).
///
/// # Errors
/// As [`muon_update`], and `InvalidArgument` if `moment2` has the wrong length.
#[allow(clippy::too_many_arguments)]
pub fn muon_update_with_moment2(
    master: &mut [f32],
    momentum: &mut [f32],
    moment2: &mut [f32],
    grad: &[f32],
    shape: &MuonShape<'_>,
    args: &MuonStepArgs,
    opts: &MuonOptions,
    ws: &mut MuonWorkspace,
) -> Result<()> {
    muon_update_sharded(master, (momentum, moment2), grad, shape, args, opts, ws, None)
}

/// [`muon_update`] of a tensor-parallel shard: with `tp`, step 3 orthogonalizes each component
/// as Emerging-Optimizers' `newton_schulz_tp` does in `tp.job.mode` (duplicated: all-gather
/// along the partition dim, Newton–Schulz, keep this rank's chunk; distributed: Newton–Schulz
/// on the shard with the sums completed over the ranks) and scales it by the whole
/// component's shape (Megatron's `scale_factor_fn_tp`); without `tp` it is [`muon_update`].
/// Every TP rank makes the same gathers in the same order. `state` is the momentum and the
/// NorMuon second moment ([`MuonOptions::moment2_len`] values, of the shard).
#[allow(clippy::too_many_arguments)]
pub fn muon_update_sharded(
    master: &mut [f32],
    (momentum, moment2): (&mut [f32], &mut [f32]),
    grad: &[f32],
    shape: &MuonShape<'_>,
    args: &MuonStepArgs,
    opts: &MuonOptions,
    ws: &mut MuonWorkspace,
    mut tp: Option<&mut TpShard<'_>>,
) -> Result<()> {
    let (rows, cols) = (shape.rows, shape.cols);
    shape.check()?;
    let len = rows * cols;
    for (name, actual) in [
        ("master", master.len()),
        ("momentum", momentum.len()),
        ("grad", grad.len()),
    ] {
        if actual != len {
            bail!(
                InvalidArgument,
                "muon_update: {name} has {actual} elements, expected {rows}×{cols}"
            );
        }
    }
    opts.ns.validate()?;
    let moment2_len = opts.moment2_len(shape);
    if moment2.len() != moment2_len {
        bail!(
            InvalidArgument,
            "muon_update: moment2 has {} elements, expected {moment2_len} for {rows}×{cols} with muon_variant {}",
            moment2.len(),
            opts.variant.name()
        );
    }

    if ws.update.len() < len {
        ws.update.resize(len, 0.0);
    }
    let update = &mut ws.update[..len];
    let mu = args.momentum;
    let one_minus_mu = 1.0 - mu;
    let (scale, clip) = (args.grad_scale, args.clip_coef);
    for ((u, m), &g) in update.iter_mut().zip(momentum.iter_mut()).zip(grad) {
        let g = (g * scale) * clip;
        *m = mu * *m + one_minus_mu * g;
        if opts.momentum_bf16 {
            *m = round_through_bf16(*m);
        }
        *u = if opts.nesterov { g + mu * (*m - g) } else { *m };
    }

    let rates = param_rates(args.lr, args.weight_decay, args.scales);
    let whole = [rows];
    let components = if shape.split_rows.is_empty() {
        &whole[..]
    } else {
        shape.split_rows
    };
    // Per-group splits run in component order: row i of the component-major update is row
    // `order[i]` of the param. Consecutive components need no reordering.
    let order = (shape.split_groups > 1).then(|| component_row_order(components, shape.split_groups));
    if let Some(order) = &order {
        ws.grouped.clear();
        for &r in order {
            ws.grouped.extend_from_slice(&update[r * cols..(r + 1) * cols]);
        }
        update.copy_from_slice(&ws.grouped);
    }
    let (mut start, mut line) = (0, 0);
    for &comp_rows in components {
        let range = start..start + comp_rows * cols;
        start = range.end;
        let first_row = range.start / cols;
        let x = &mut update[range.clone()];
        let (full_rows, full_cols) = match tp.as_deref_mut() {
            Some(shard) if shard.job.mode == TpMode::Distributed => {
                orthogonalize_distributed(x, comp_rows, cols, shard, &opts.ns, &mut ws.ns)?
            }
            Some(shard) if shard.job.mode == TpMode::Duplicated => {
                orthogonalize_gathered(x, comp_rows, cols, shard, &opts.ns, &mut ws.ns, &mut ws.full)?
            }
            _ => {
                newton_schulz_in_place(x, comp_rows, cols, &opts.ns, &mut ws.ns)?;
                (comp_rows, cols)
            }
        };
        let values = adaptive::moment2_values(opts.variant, comp_rows, cols);
        let state = &mut moment2[line..line + values];
        adaptive::normalize(opts.variant, x, comp_rows, cols, state, &opts.adaptive)?;
        line += values;
        let step = rates.lr * muon_scale(opts.scale_mode, full_rows, full_cols, opts.extra_scale_factor);
        let cautious = opts.cautious_weight_decay;
        let apply = |w: &mut [f32], x: &[f32]| {
            for (w, &x) in w.iter_mut().zip(x) {
                *w = *w * cautious_decay(cautious, rates.decay, *w, x) - step * x;
            }
        };
        match &order {
            None => apply(&mut master[range], x),
            Some(order) => {
                for (i, x_row) in x.chunks_exact(cols).enumerate() {
                    let r = order[first_row + i];
                    apply(&mut master[r * cols..(r + 1) * cols], x_row);
                }
            }
        }
    }
    Ok(())
}

/// The factor a weight `w` with update `u` (the direction subtracted from it) is decayed by:
/// `decay`, except with cautious weight decay where `w·u < 0` (or is NaN), where it is 1 — the
/// weight kept, as dion's mask of `X·U ≥ 0` keeps it. The AdamW update uses it too.
#[inline]
pub fn cautious_decay(cautious: bool, decay: f32, w: f32, u: f32) -> f32 {
    if !cautious || w * u >= 0.0 { decay } else { 1.0 }
}

/// Orthogonalizes the `rows × cols` shard `x` of one component in place with Megatron's
/// `distributed` mode (Emerging-Optimizers' `newton_schulz_tp`): the iterate is the shard —
/// transposed for a row split, so the split dimension is always the iterate's columns — and
/// the norm and every `X·Xᵀ` are summed over the TP ranks; returns the whole shape.
fn orthogonalize_distributed(
    x: &mut [f32],
    rows: usize,
    cols: usize,
    shard: &mut TpShard<'_>,
    ns: &NsOptions,
    ns_ws: &mut NsWorkspace,
) -> Result<(usize, usize)> {
    let ranks = shard.ranks;
    let mut sums = GatheredSums {
        gather: &mut *shard.gather,
        ranks,
    };
    let transpose = shard.job.dim == TpDim::Rows;
    newton_schulz_sharded_in_place(x, rows, cols, transpose, ns, ns_ws, &mut sums)?;
    Ok(match shard.job.dim {
        TpDim::Rows => (ranks * rows, cols),
        TpDim::Cols => (rows, ranks * cols),
    })
}

/// [`ShardSums`] through an all-gather: every rank's values added in rank order, so every rank
/// computes the same bits.
struct GatheredSums<'a> {
    gather: &'a mut dyn FnMut(&[f32]) -> Result<Vec<f32>>,
    ranks: usize,
}

impl GatheredSums<'_> {
    fn all(&mut self, local: &[f32]) -> Result<Vec<f32>> {
        let all = (self.gather)(local)?;
        if all.len() != local.len() * self.ranks {
            bail!(
                Internal,
                "newton_schulz: the tensor-parallel gather returned {} values for {} shards of {}",
                all.len(),
                self.ranks,
                local.len()
            );
        }
        Ok(all)
    }
}

impl ShardSums for GatheredSums<'_> {
    /// The f64 travels as two f32 bit patterns (the gather copies bytes).
    fn norm(&mut self, local: f64) -> Result<f64> {
        let bits = local.to_bits();
        let halves = [f32::from_bits(bits as u32), f32::from_bits((bits >> 32) as u32)];
        let all = self.all(&halves)?;
        let value = |p: &[f32]| f64::from_bits(u64::from(p[0].to_bits()) | (u64::from(p[1].to_bits()) << 32));
        let mut ranks = all.chunks_exact(2);
        let first = value(ranks.next().expect("at least one rank"));
        Ok(ranks.fold(first, |acc, p| acc + value(p)))
    }

    fn gram(&mut self, local: &mut [f32]) -> Result<()> {
        let all = self.all(local)?;
        let len = local.len();
        for (i, v) in local.iter_mut().enumerate() {
            *v = (1..self.ranks).fold(all[i], |acc, r| acc + all[r * len + i]);
        }
        Ok(())
    }
}

/// The param rows in component-major order: for each component c (`component_rows[c]` rows in
/// all), its block of every one of `groups` groups in group order.
pub fn component_row_order(component_rows: &[usize], groups: usize) -> Vec<usize> {
    let rows: usize = component_rows.iter().sum();
    if groups <= 1 {
        return (0..rows).collect();
    }
    let group_rows = rows / groups;
    let mut order = Vec::with_capacity(rows);
    let mut offset = 0;
    for &component in component_rows {
        let part = component / groups;
        for g in 0..groups {
            order.extend(g * group_rows + offset..g * group_rows + offset + part);
        }
        offset += part;
    }
    order
}

/// Gathers the `rows × cols` shard `x` of one component over the TP ranks, orthogonalizes the
/// whole component and writes this rank's chunk of the result back into `x`; returns the
/// whole component's shape.
fn orthogonalize_gathered(
    x: &mut [f32],
    rows: usize,
    cols: usize,
    shard: &mut TpShard<'_>,
    ns: &NsOptions,
    ns_ws: &mut NsWorkspace,
    full: &mut Vec<f32>,
) -> Result<(usize, usize)> {
    let (ranks, rank, len) = (shard.ranks, shard.rank, x.len());
    let gathered = (shard.gather)(x)?;
    if gathered.len() != ranks * len || rank >= ranks {
        bail!(
            Internal,
            "muon_update: the tensor-parallel gather returned {} values for {ranks} shards of {len} (rank {rank})",
            gathered.len()
        );
    }
    match shard.job.dim {
        TpDim::Rows => {
            full.clear();
            full.extend_from_slice(&gathered);
            newton_schulz_in_place(full, ranks * rows, cols, ns, ns_ws)?;
            x.copy_from_slice(&full[rank * len..(rank + 1) * len]);
            Ok((ranks * rows, cols))
        }
        TpDim::Cols => {
            let wide = ranks * cols;
            full.resize(rows * wide, 0.0);
            for (t, block) in gathered.chunks_exact(len).enumerate() {
                for (r, row) in block.chunks_exact(cols).enumerate() {
                    full[r * wide + t * cols..r * wide + (t + 1) * cols].copy_from_slice(row);
                }
            }
            newton_schulz_in_place(full, rows, wide, ns, ns_ws)?;
            for (r, row) in x.chunks_exact_mut(cols).enumerate() {
                row.copy_from_slice(&full[r * wide + rank * cols..r * wide + (rank + 1) * cols]);
            }
            Ok((rows, wide))
        }
    }
}

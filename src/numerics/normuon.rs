//! NorMuon: the second-moment normalization of an orthogonalized Muon update
//! (`muon_variant = normuon`), as Emerging-Optimizers' `AdaptiveMuon` computes it with
//! `moment2_method="normuon"` (github.com/NVIDIA-NeMo/Emerging-Optimizers, v0.3.0 = commit
//! b309e2f0, the version Megatron-LM d98e8a64 pins and PyPI's `emerging-optimizers` 0.3.0;
//! `orthogonalized_optimizers/adaptive_muon.py`, `_init_group` and
//! `_apply_moment2_normalization`, unchanged in v0.4.0 but for log text). Megatron-LM's
//! `--optimizer adaptive_muon` (`TensorParallelAdaptiveMuon`,
//! `megatron/core/optimizer/emerging_optimizers.py`) runs that `step`. The NorMuon paper's
//! algorithm (arXiv 2510.05491; its reference `normuon.py`, github.com/zichongli5/NorMuon
//! d45c9a42) differs in three details this module does not follow: it always keeps one
//! statistic per row, divides by `√v + 1e-10` and matches the norm with `+ 1e-10`.
//!
//! For the orthogonalized update `X` (`rows × cols`, before the Muon scale), with the state
//! `V` of `lines = max(rows, cols)` f32 values:
//! 1. the lines are the rows when `rows >= cols`, else the columns (the statistic is averaged
//!    along the shorter side: `avg_dim = -1 if rows >= cols else -2`);
//! 2. per line `l` of `n` elements: `s_l = Σ x²` in f64 (each square exact, added in element
//!    order), `mean_l = f32(s_l / n)`, `V_l = β2·V_l + (1−β2)·mean_l` (f32, `1−β2` one f32
//!    subtraction: the EMA of `moment2.lerp_(v_mean, 1 − beta2)`, no bias correction; `V`
//!    starts at 0), `inv_l = 1 / √max(V_l, ε)` (f32 square root and division:
//!    `moment2.clamp_min(eps).rsqrt_()`);
//! 3. the Frobenius norms of `X` and of `Y = X·inv` (each line scaled): `‖X‖² = Σ_l s_l`,
//!    `‖Y‖² = Σ_l inv_l²·s_l` (`inv_l²` exact in f64, times `s_l` one f64 rounding), both
//!    added in [`LANES`] lanes (line `l` into lane `l mod LANES`, in line order) and the lanes
//!    by a halving tree — the order of the device's one block per matrix;
//!    `ratio = f32(√‖X‖²) / max(f32(√‖Y‖²), ε)` (`_match_frobenius_norm`: the update keeps
//!    the orthogonalized update's norm);
//! 4. the update is `(x·inv_l)·ratio`, two f32 roundings, then scaled and applied as Muon's
//!    ([`crate::numerics::muon`]).
//!
//! The statistic of `mean_l` is summed in f64 where torch sums f32 (its `mean`), and `‖Y‖`
//! comes from the line sums instead of the rounded `Y`: both differ from the peer by f32
//! rounding only (`tests/numerics_adaptive_muon_peer.rs`).

use crate::bail;
use crate::error::Result;
use crate::numerics::adaptive::AdaptiveOptions;

/// Lanes of the Frobenius-norm sums (the device's threads per block).
pub const LANES: usize = 256;

/// Whether the statistics of a `rows × cols` matrix are per row (else per column).
pub fn per_row(rows: usize, cols: usize) -> bool {
    rows >= cols
}

/// The second-moment values of a `rows × cols` matrix: one per line of its longer side.
pub fn lines(rows: usize, cols: usize) -> usize {
    rows.max(cols)
}

/// The lane sums of `values` (value `l` into lane `l mod LANES`, in order) added by a halving
/// tree: lane `i` += lane `i + w` for `w` = 128, 64, …, 1.
pub fn lane_tree_sum(values: impl Iterator<Item = f64>) -> f64 {
    let mut lanes = [0.0f64; LANES];
    for (l, v) in values.enumerate() {
        lanes[l % LANES] += v;
    }
    let mut width = LANES / 2;
    while width > 0 {
        for i in 0..width {
            lanes[i] += lanes[i + width];
        }
        width /= 2;
    }
    lanes[0]
}

/// `1 / √max(v, eps)` in f32.
pub fn inverse_root(v: f32, eps: f32) -> f32 {
    1.0 / v.max(eps).sqrt()
}

/// Steps 1–3 of the module documentation on `x` (`rows × cols`, row-major): updates `moment2`
/// (`lines(rows, cols)` values) and returns the norm ratio; the caller applies
/// `(x·inverse_root(V_l))·ratio` (or [`normalize`] does).
///
/// # Errors
/// `InvalidArgument` if a slice has the wrong length.
pub fn update_moment2(x: &[f32], rows: usize, cols: usize, moment2: &mut [f32], opts: &AdaptiveOptions) -> Result<f32> {
    if x.len() != rows * cols || moment2.len() != lines(rows, cols) {
        bail!(
            InvalidArgument,
            "normuon: {} values and {} second-moment values for a {rows}×{cols} matrix (expected {} and {})",
            x.len(),
            moment2.len(),
            rows * cols,
            lines(rows, cols)
        );
    }
    let by_row = per_row(rows, cols);
    let n = if by_row { cols } else { rows };
    let line_sum = |l: usize| -> f64 {
        (0..n)
            .map(|i| {
                let v = f64::from(if by_row { x[l * cols + i] } else { x[i * cols + l] });
                v * v
            })
            .fold(0.0, |acc, sq| acc + sq)
    };
    let (beta2, one_minus_beta2) = (opts.beta2, 1.0 - opts.beta2);
    let mut sums = Vec::with_capacity(moment2.len());
    for (l, v) in moment2.iter_mut().enumerate() {
        let s = line_sum(l);
        let mean = (s / n as f64) as f32;
        *v = beta2 * *v + one_minus_beta2 * mean;
        let inv = f64::from(inverse_root(*v, opts.eps));
        sums.push((s, inv * inv * s));
    }
    let x_norm = lane_tree_sum(sums.iter().map(|s| s.0)).sqrt() as f32;
    let y_norm = lane_tree_sum(sums.iter().map(|s| s.1)).sqrt() as f32;
    Ok(x_norm / y_norm.max(opts.eps))
}

/// [`update_moment2`], then `x ← (x·inv_l)·ratio` in place.
///
/// # Errors
/// As [`update_moment2`]; nothing changes then.
pub fn normalize(x: &mut [f32], rows: usize, cols: usize, moment2: &mut [f32], opts: &AdaptiveOptions) -> Result<()> {
    let ratio = update_moment2(x, rows, cols, moment2, opts)?;
    let by_row = per_row(rows, cols);
    for (r, row) in x.chunks_exact_mut(cols).enumerate() {
        for (c, v) in row.iter_mut().enumerate() {
            let inv = inverse_root(moment2[if by_row { r } else { c }], opts.eps);
            *v = (*v * inv) * ratio;
        }
    }
    Ok(())
}

//! Element-wise AdamW on fp32 masters: bias-corrected moments and decoupled weight decay
//! (docs/design.md §6), the operation every rank applies to its shard of the AdamW buckets.
//!
//! Per step, the scalars are computed once, in f32 (the CUDA kernel computes the same from the
//! step's scalars): `bc1 = 1 − β1^t`, `bc2 = 1 − β2^t` ([`adamw_bias_corrections`], 1-based
//! step `t`), and the parameter's `lr`, `wd` and `decay = 1 − lr·wd` ([`param_rates`]: the
//! group's values times the parameter's scales). The powers are
//! [`powi_f32`], an explicit f32 binary exponentiation, not `f32::powi`: `powi` is documented
//! as unspecified in precision, and the optimizer does fold it differently (a constant step
//! gave a different last bit in release than in debug builds).
//!
//! Per element, in f32, each operation rounded on its own (no fused multiply-add; a CUDA
//! mirror must use `__fmul_rn`/`__fadd_rn` or compile with `--fmad=false`, with IEEE division
//! and square root), in this order:
//! ```text
//! g    = (grad·grad_scale)·clip_coef
//! m    = β1·m + (1 − β1)·g
//! v    = β2·v + ((1 − β2)·g)·g
//! mhat = m / bc1
//! vhat = v / bc2
//! w    = w·decay − (lr·mhat) / (sqrt(vhat) + eps)
//! ```
//! (`1 − β1`, `1 − β2` are f32 scalars computed once.) With cautious weight decay the last
//! line is `u = (lr·mhat) / (sqrt(vhat) + eps)`, `w = w·d − u` with `d = decay` where `w·u ≥ 0`
//! and `d = 1` elsewhere ([`cautious_decay`]): microsoft/dion's `adamw_update`
//! (`dion/scalar_opts.py`, commit 0a059a4542e5aa74b40dcd1dce363836c7afcd48) masks the decay
//! with `(M / denom)·X ≥ 0`, the sign of the same update before its learning rate.

use crate::bail;
use crate::error::Result;
use crate::numerics::muon::cautious_decay;
use crate::numerics::split_workers;
use crate::numerics::step_args::{ParamScales, param_rates};

/// The scalars of one AdamW step for one parameter group.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWArgs {
    /// Learning rate of the AdamW group at this step.
    pub lr: f32,
    /// Decoupled weight decay of the AdamW group.
    pub weight_decay: f32,
    /// The parameter's multipliers of both.
    pub scales: ParamScales,
    /// First-moment decay β1.
    pub beta1: f32,
    /// Second-moment decay β2.
    pub beta2: f32,
    /// Denominator epsilon.
    pub eps: f32,
    /// 1-based step count `t` of the bias corrections.
    pub step: u64,
    /// What the summed gradient is multiplied by first: `1/dp`, its mean (1 for a gradient
    /// that is the mean already).
    pub grad_scale: f32,
    /// The global gradient-clip multiplier ([`clip_coefficient`](super::clip_coefficient)),
    /// applied to the mean; 1 when clipping is off.
    pub clip_coef: f32,
    /// Cautious weight decay (`cautious_weight_decay`): decay only where the weight and its
    /// update share a sign.
    pub cautious_weight_decay: bool,
}

/// `base^exp` in f32 by binary exponentiation, every product rounded to f32: scanning the bits
/// of `exp` from the least significant, `result *= square` for each set bit, then
/// `square *= square`. Deterministic on every platform and optimization level.
pub fn powi_f32(base: f32, exp: u64) -> f32 {
    let (mut result, mut square, mut e) = (1.0f32, base, exp);
    while e > 0 {
        if e & 1 == 1 {
            result *= square;
        }
        square *= square;
        e >>= 1;
    }
    result
}

/// `(1 − β1^t, 1 − β2^t)` in f32 with [`powi_f32`].
pub fn adamw_bias_corrections(beta1: f32, beta2: f32, step: u64) -> (f32, f32) {
    (1.0 - powi_f32(beta1, step), 1.0 - powi_f32(beta2, step))
}

/// [`adamw_update`] with the elements split among up to `threads` workers of the process's
/// thread pool ([`split_workers`]): element-wise, so the same bits.
///
/// # Errors
/// As [`adamw_update`]; nothing is modified on error.
pub fn adamw_update_split(
    master: &mut [f32],
    exp_avg: &mut [f32],
    exp_avg_sq: &mut [f32],
    grad: &[f32],
    args: &AdamWArgs,
    threads: usize,
) -> Result<()> {
    check(master.len(), exp_avg.len(), exp_avg_sq.len(), grad.len(), args)?;
    let workers = split_workers(master.len(), threads);
    let chunk = master.len().div_ceil(workers).max(1);
    let parts = master
        .chunks_mut(chunk)
        .zip(exp_avg.chunks_mut(chunk))
        .zip(exp_avg_sq.chunks_mut(chunk))
        .zip(grad.chunks(chunk));
    if workers == 1 {
        parts.for_each(|(((w, m), v), g)| apply(w, m, v, g, args));
        return Ok(());
    }
    rayon::in_place_scope(|scope| {
        for (((w, m), v), g) in parts {
            scope.spawn(move |_| apply(w, m, v, g, args));
        }
    });
    Ok(())
}

/// Applies one AdamW step to `master` with moments `exp_avg` (m) and `exp_avg_sq` (v) from
/// `grad`, element by element; the exact operation order is in the module documentation.
///
/// # Errors
/// `InvalidArgument` if the four slices differ in length; `OutOfRange` if `args.step` is 0.
/// Nothing is modified on error.
pub fn adamw_update(
    master: &mut [f32],
    exp_avg: &mut [f32],
    exp_avg_sq: &mut [f32],
    grad: &[f32],
    args: &AdamWArgs,
) -> Result<()> {
    check(master.len(), exp_avg.len(), exp_avg_sq.len(), grad.len(), args)?;
    apply(master, exp_avg, exp_avg_sq, grad, args);
    Ok(())
}

/// The refusals of [`adamw_update`].
fn check(len: usize, exp_avg: usize, exp_avg_sq: usize, grad: usize, args: &AdamWArgs) -> Result<()> {
    if args.step == 0 {
        bail!(OutOfRange, "adamw_update: step must be >= 1 (1-based), got 0");
    }
    if exp_avg != len || exp_avg_sq != len || grad != len {
        bail!(
            InvalidArgument,
            "adamw_update: lengths differ (master {len}, exp_avg {exp_avg}, exp_avg_sq {exp_avg_sq}, grad {grad})"
        );
    }
    Ok(())
}

/// The element loop of [`adamw_update`] on checked slices.
fn apply(master: &mut [f32], exp_avg: &mut [f32], exp_avg_sq: &mut [f32], grad: &[f32], args: &AdamWArgs) {
    let (bc1, bc2) = adamw_bias_corrections(args.beta1, args.beta2, args.step);
    let (b1, b2) = (args.beta1, args.beta2);
    let (one_minus_b1, one_minus_b2) = (1.0 - b1, 1.0 - b2);
    let rates = param_rates(args.lr, args.weight_decay, args.scales);
    let (lr, decay, eps) = (rates.lr, rates.decay, args.eps);
    let (scale, clip, cautious) = (args.grad_scale, args.clip_coef, args.cautious_weight_decay);
    let elements = master
        .iter_mut()
        .zip(exp_avg.iter_mut())
        .zip(exp_avg_sq.iter_mut())
        .zip(grad);
    for (((w, m), v), &grad) in elements {
        let g = (grad * scale) * clip;
        *m = b1 * *m + one_minus_b1 * g;
        *v = b2 * *v + one_minus_b2 * g * g;
        let mhat = *m / bc1;
        let vhat = *v / bc2;
        let u = lr * mhat / (vhat.sqrt() + eps);
        *w = *w * cautious_decay(cautious, decay, *w, u) - u;
    }
}

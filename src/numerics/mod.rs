//! Host reference numerics: the executable specification of every floating-point operation
//! of the optimizer step (docs/design.md §6). The CUDA backend mirrors these functions; each
//! documents its exact operation order where a bit-for-bit mirror is required.
//!
//! Gradient norm and found-inf, the two reductions in front of the step:
//! - every rank sums [`squared_norm`] over the gradient ranges it owns (each unique gradient
//!   counted once) in f64, the ranks all-reduce that one f64 scalar, and
//!   [`clip_coefficient`] turns the total into the multiplier both optimizers apply to the
//!   gradient (`clip_coef`);
//! - [`has_non_finite`] over the same ranges, OR-reduced across ranks, decides the skip.

pub mod adamw;
pub mod bf16;
pub mod gemm;
pub mod muon;
pub mod mxfp8;
pub mod newton_schulz;
pub mod qk_clip;
pub mod step_args;

/// `Σ x²` accumulated in f64.
///
/// Each square is exact in f64 (an f32 product has at most 48 significant bits). The order is
/// fixed: element `i` goes to partial sum `i mod 8`, the partial sums are then added in index
/// order. The result therefore depends only on the data, not on threads or hardware.
pub fn squared_norm(x: &[f32]) -> f64 {
    let mut lanes = [0.0f64; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            let v = f64::from(v);
            *lane += v * v;
        }
    }
    for (lane, &v) in lanes.iter_mut().zip(tail) {
        let v = f64::from(v);
        *lane += v * v;
    }
    lanes.iter().sum()
}

/// True if any element is NaN or ±∞ (the found-inf check of the step).
pub fn has_non_finite(x: &[f32]) -> bool {
    x.iter().any(|v| !v.is_finite())
}

/// The global gradient-clip multiplier from the all-reduced squared norm, Megatron-LM's rule
/// (`clip_grads.py`): `min(1, clip_grad / (‖g‖ + 1e-6))` with `‖g‖ = sqrt(total_squared_norm)`,
/// computed in f64 and rounded to f32. `clip_grad == 0` means clipping is off and gives 1.
///
/// Call it only for a finite norm: a non-finite gradient skips the step before clipping.
pub fn clip_coefficient(total_squared_norm: f64, clip_grad: f32) -> f32 {
    if clip_grad == 0.0 {
        return 1.0;
    }
    let coef = f64::from(clip_grad) / (total_squared_norm.sqrt() + 1e-6);
    coef.min(1.0) as f32
}

/// What a step derives from every rank's Σ g² (the kernel `muon_step_scalars` computes the
/// same, operation for operation).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepScalars {
    /// ‖g‖ of the mean gradient; NaN or inf when skipped.
    pub grad_norm: f64,
    pub clip_coef: f32,
    /// `clip_coef / dp`: the summed gradients times this are the clipped mean.
    pub grad_scale: f32,
    pub skipped: bool,
    /// Steps taken after this one (skipped steps excluded).
    pub step: u64,
    /// AdamW bias corrections at `step`.
    pub bc1: f32,
    pub bc2: f32,
}

/// One optimizer's gathered Σ g² in a step: every rank's sum of squares of the gradients it
/// owns (the ranks of its data-parallel group, or of the norm group that spans it, in rank
/// order), the gradients being sums over `dp` ranks (so the mean's squared norm is the total
/// over dp²).
#[derive(Debug, Clone, Copy)]
pub struct GatheredSums<'a> {
    pub rank_sums: &'a [f64],
    pub dp: usize,
}

impl GatheredSums<'_> {
    /// The squared norm of the mean gradient: the sums added in rank order, over dp².
    fn mean_squared_norm(&self) -> f64 {
        let dp = self.dp.max(1) as f64;
        let summed = self
            .rank_sums
            .iter()
            .skip(1)
            .fold(self.rank_sums.first().copied().unwrap_or(0.0), |acc, v| acc + v);
        summed / (dp * dp)
    }
}

/// The step's scalars from the gathered sums of every optimizer sharing the clip (one, unless
/// the step is shared: their mean squared norms added in the order given, which every rank and
/// every optimizer of the set uses), this optimizer's data-parallel size `dp` (its gradients
/// are scaled by `clip_coef / dp`), the steps taken before, and the clip and AdamW constants.
pub fn step_scalars(
    terms: &[GatheredSums<'_>],
    dp: usize,
    previous_step: u64,
    clip_grad: f32,
    beta1: f32,
    beta2: f32,
) -> StepScalars {
    let dp = dp.max(1);
    let total = terms
        .iter()
        .skip(1)
        .fold(terms.first().map_or(0.0, GatheredSums::mean_squared_norm), |acc, t| {
            acc + t.mean_squared_norm()
        });
    let skipped = !total.is_finite();
    let clip_coef = if skipped {
        1.0
    } else {
        clip_coefficient(total, clip_grad)
    };
    let grad_scale = if dp > 1 {
        clip_coef * (1.0 / dp as f32)
    } else {
        clip_coef
    };
    let step = previous_step + u64::from(!skipped);
    let (bc1, bc2) = adamw::adamw_bias_corrections(beta1, beta2, step);
    StepScalars {
        grad_norm: total.sqrt(),
        clip_coef,
        grad_scale,
        skipped,
        step,
        bc1,
        bc2,
    }
}

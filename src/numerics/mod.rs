//! Host reference numerics: the executable specification of every floating-point operation
//! of the optimizer step (docs/design.md §6). The CUDA backend mirrors these functions; each
//! documents its exact operation order where a bit-for-bit mirror is required.
//!
//! Gradient norm and found-inf, the two reductions in front of the step:
//! - the updates take the mean of the summed gradients (`grad_scale`, [`mean_scale`] = `1/dp`)
//!   and then clip it: `(g·grad_scale)·clip_coef`, two roundings in that order (Megatron-LM
//!   likewise averages over dp before it clips);
//! - every rank accumulates the exact [`SquareSum`] of that mean `g·grad_scale` over the
//!   gradient ranges it owns (each unique gradient counted once), counting their non-finite
//!   values; the ranks gather those sums, and [`step_scalars`] adds them exactly, rounds the
//!   total once and turns it into the clip multiplier (`clip_coef`) and the skip decision. The
//!   result is the same bits at any data-parallel size, layout and ownership whenever the mean
//!   gradient is.

pub mod adamuon;
pub mod adamw;
pub mod adaptive;
pub mod bf16;
pub mod gemm;
pub mod muon;
pub mod mxfp8;
pub mod newton_schulz;
pub mod normuon;
pub mod qk_clip;
pub mod simd;
pub mod square_sum;
pub mod step_args;
pub mod transpose;

pub use square_sum::SquareSum;

/// The fewest elements a worker of an element-wise pass split among threads takes
/// ([`adamw::adamw_update_split`], [`SquareSum::add_split`]).
pub const MIN_ELEMENTS_PER_THREAD: usize = 1 << 16;

/// The workers an element-wise pass over `len` elements is split among on `threads` threads:
/// at most `threads`, each with at least [`MIN_ELEMENTS_PER_THREAD`], at least one.
pub fn split_workers(len: usize, threads: usize) -> usize {
    threads.min(len / MIN_ELEMENTS_PER_THREAD).max(1)
}

/// What each rank adds to a step's norm: the exact sum of squares of the mean gradients it
/// owns, and the optimizer steps it has taken before this one, which every rank the norm is
/// gathered over must agree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RankNorm {
    pub sum: SquareSum,
    pub steps: u64,
}

/// Words of a [`RankNorm`] as ranks gather it: the sum's words, then the steps as the bits of
/// an f64 (the device's step slot, copied as is).
pub const RANK_NORM_WORDS: usize = square_sum::SQUARE_SUM_WORDS + 1;

impl RankNorm {
    pub fn words(&self) -> [u64; RANK_NORM_WORDS] {
        let mut words = [0; RANK_NORM_WORDS];
        words[..square_sum::SQUARE_SUM_WORDS].copy_from_slice(&self.sum.words());
        words[square_sum::SQUARE_SUM_WORDS] = (self.steps as f64).to_bits();
        words
    }

    pub fn from_words(words: &[u64; RANK_NORM_WORDS]) -> Self {
        let (sum, steps) = words.split_at(square_sum::SQUARE_SUM_WORDS);
        RankNorm {
            sum: SquareSum::from_words(sum.try_into().expect("SQUARE_SUM_WORDS words")),
            steps: f64::from_bits(steps[0]) as u64,
        }
    }
}

/// Ranks a step's norm is gathered over that have taken different numbers of steps: the
/// first rank of optimizer `term` (of a shared step) whose count differs from its rank 0's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepsDisagree {
    pub term: usize,
    pub rank: usize,
    pub steps: u64,
    pub rank0_steps: u64,
}

/// `Σ x²` accumulated in f64 (the Newton–Schulz inputs' Frobenius norms; the gradient norm
/// is exact, [`SquareSum`]).
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
    /// `1/dp`: the summed gradients times this are the mean, which `clip_coef` then scales.
    pub grad_scale: f32,
    pub skipped: bool,
    /// Steps taken after this one (skipped steps excluded).
    pub step: u64,
    /// AdamW bias corrections at `step`.
    pub bc1: f32,
    pub bc2: f32,
    /// Ranks at different step counts: the step is skipped on every rank.
    pub disagree: Option<StepsDisagree>,
}

/// What the updates multiply a gradient summed over `dp` ranks by to get the mean (`1/dp` in
/// f32; 1 at dp 1), before the clip. The gradient norm is the norm of that mean, squared
/// element by element after the same multiply.
pub fn mean_scale(dp: usize) -> f32 {
    if dp > 1 { 1.0 / dp as f32 } else { 1.0 }
}

/// The step's scalars from the gathered sums of every optimizer sharing the clip (one term,
/// unless the step is shared; a term holds one [`RankNorm`] per rank of the optimizer's norm
/// group, each sum of the mean gradient's squares), this optimizer's data-parallel size `dp`,
/// the steps taken before, and the clip and AdamW constants. Every sum is added exactly and the
/// total rounded once: the same bits in any order, at any dp, layout and ownership. A step
/// whose ranks have taken different numbers of steps is skipped ([`StepsDisagree`]), as is one
/// with a gradient that is not finite.
pub fn step_scalars(
    terms: &[&[RankNorm]],
    dp: usize,
    previous_step: u64,
    clip_grad: f32,
    beta1: f32,
    beta2: f32,
) -> StepScalars {
    let mut sum = SquareSum::default();
    terms.iter().flat_map(|t| t.iter()).for_each(|r| sum.merge(&r.sum));
    let total = sum.to_f64();
    let disagree = terms.iter().enumerate().find_map(|(term, ranks)| {
        let rank0_steps = ranks.first()?.steps;
        let (rank, other) = ranks.iter().enumerate().find(|(_, r)| r.steps != rank0_steps)?;
        Some(StepsDisagree {
            term,
            rank,
            steps: other.steps,
            rank0_steps,
        })
    });
    let skipped = !total.is_finite() || disagree.is_some();
    let clip_coef = if skipped {
        1.0
    } else {
        clip_coefficient(total, clip_grad)
    };
    let grad_scale = mean_scale(dp);
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
        disagree,
    }
}

// The step's scalars from every rank's sum of squares (src/numerics/mod.rs `step_scalars`,
// operation for operation): one thread, after the gathered sums arrived, so the step needs no
// host round trip. f64 arithmetic is IEEE (division and square root correctly rounded, no
// contraction with --fmad=false); the f32 products are the host's powi_f32 and clip scaling.
// Launch: one block of at least one thread.

#include "muon_common.cuh"

// base^exp by binary exponentiation, every product rounded to f32 (numerics::adamw::powi_f32).
__device__ float muon_powi_f32(float base, muon_u64 exp) {
    float result = 1.0f;
    float square = base;
    while (exp > 0ull) {
        if (exp & 1ull) {
            result = result * square;
        }
        square = square * square;
        exp >>= 1;
    }
    return result;
}

// Most optimizers sharing one clip (src/backend/ops.rs MAX_NORM_TERMS).
#define MUON_NORM_TERMS_MAX 8

// The gathered sums of every optimizer sharing the step's clip, in the order every rank uses:
// term k has ranks[k] sums (its norm group) of gradients summed over dp[k] ranks.
struct muon_norm_terms {
    const double *sums[MUON_NORM_TERMS_MAX];
    muon_u32 ranks[MUON_NORM_TERMS_MAX];
    muon_u32 dp[MUON_NORM_TERMS_MAX];
    muon_u64 count;
};

// The squared norm of term k's mean gradient: its sums added in rank order, over dp².
__device__ double muon_term_squared_norm(const struct muon_norm_terms *terms, muon_u32 k) {
    const double *sums = terms->sums[k];
    double summed = sums[0];
    for (muon_u32 r = 1u; r < terms->ranks[k]; ++r) {
        summed = summed + sums[r];
    }
    const double ranks = (double)terms->dp[k];
    return summed / (ranks * ranks);
}

// This optimizer's gradients are summed over `dp` ranks.
extern "C" __global__ void muon_step_scalars(double *scalars, struct muon_norm_terms terms, muon_u32 dp,
                                             float clip_grad, float beta1, float beta2) {
    if (blockIdx.x != 0u || threadIdx.x != 0u) {
        return;
    }
    double total = muon_term_squared_norm(&terms, 0u);
    for (muon_u32 k = 1u; k < (muon_u32)terms.count; ++k) {
        total = total + muon_term_squared_norm(&terms, k);
    }
    const bool skipped = !isfinite(total);
    float clip_coef = 1.0f;
    if (!skipped && clip_grad != 0.0f) {
        const double coef = (double)clip_grad / (sqrt(total) + 1e-6);
        clip_coef = (float)fmin(coef, 1.0);
    }
    const float grad_scale = dp > 1u ? clip_coef * (1.0f / (float)dp) : clip_coef;
    const muon_u64 step = (muon_u64)scalars[MUON_SCALAR_STEP] + (skipped ? 0ull : 1ull);
    scalars[MUON_SCALAR_GRAD_NORM] = sqrt(total);
    scalars[MUON_SCALAR_CLIP_COEF] = (double)clip_coef;
    scalars[MUON_SCALAR_GRAD_SCALE] = (double)grad_scale;
    scalars[MUON_SCALAR_SKIP] = skipped ? 1.0 : 0.0;
    scalars[MUON_SCALAR_STEP] = (double)step;
    scalars[MUON_SCALAR_BC1] = (double)(1.0f - muon_powi_f32(beta1, step));
    scalars[MUON_SCALAR_BC2] = (double)(1.0f - muon_powi_f32(beta2, step));
}

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

// `count` sums (the data-parallel ranks, or the norm group spanning them), gradients summed
// over `dp` ranks.
extern "C" __global__ void muon_step_scalars(double *scalars, const double *rank_sums, muon_u32 count, muon_u32 dp,
                                             float clip_grad, float beta1, float beta2) {
    if (blockIdx.x != 0u || threadIdx.x != 0u) {
        return;
    }
    double summed = rank_sums[0];
    for (muon_u32 r = 1u; r < count; ++r) {
        summed = summed + rank_sums[r];
    }
    const double ranks = (double)dp;
    const double total = summed / (ranks * ranks);
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

// Element-wise AdamW on fp32 masters (src/numerics/adamw.rs). The per-step scalars (bias
// corrections bc1 = 1 - beta1^t and bc2 = 1 - beta2^t with the host's powi_f32, 1 - beta1,
// 1 - beta2, decay = 1 - lr * wd) are computed once on the host exactly as the host backend
// does and passed in. Per element, each operation one f32 rounding, in the host's order
// (--fmad=false, IEEE division and square root). Launch: block 256, any 1-D grid.

#include "muon_common.cuh"

extern "C" __global__ void muon_adamw(float *w, float *exp_avg, float *exp_avg_sq, const void *grad, int grad_bf16,
                                      muon_u64 n, float beta1, float beta2, float one_minus_beta1,
                                      float one_minus_beta2, float bc1, float bc2, float decay, float lr, float eps,
                                      float clip) {
    for (muon_u64 i = muon_first_index(); i < n; i += muon_grid_stride()) {
        const float g = muon_load(grad, grad_bf16, i) * clip;
        const float m = beta1 * exp_avg[i] + one_minus_beta1 * g;
        const float v = beta2 * exp_avg_sq[i] + one_minus_beta2 * g * g;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
        const float mhat = m / bc1;
        const float vhat = v / bc2;
        w[i] = w[i] * decay - lr * mhat / (sqrtf(vhat) + eps);
    }
}

// Element-wise AdamW on fp32 masters (src/numerics/adamw.rs). The step's scalars (gradient
// scale and clip, bias corrections, learning rate and weight decay, betas and eps, the skip flag)
// are read from device memory (muon_step_scalars); 1 - beta1, 1 - beta2,
// lr = the scalar of slot lr_slot (MUON_SCALAR_ADAM_LR, or MUON_SCALAR_DECOUPLED_LR for an
// embedding or output param) * lr_scale, wd = adam_wd * wd_scale and
// decay = 1 - lr * wd are the host's f32 products; with `cautious` (cautious weight decay) an
// element is decayed only where it and its update share a sign (muon_cautious_decay). Per element, each operation one f32 rounding, in the host's order
// (--fmad=false, IEEE division and square root). Launch: block 256, any 1-D grid.

#include "muon_common.cuh"

extern "C" __global__ void muon_adamw(float *w, float *exp_avg, float *exp_avg_sq, const void *grad, int grad_bf16,
                                      muon_u64 n, float lr_scale, float wd_scale, const double *scalars,
                                      int lr_slot, int cautious) {
    if (muon_step_skipped(scalars)) {
        return;
    }
    const float beta1 = muon_scalar(scalars, MUON_SCALAR_ADAM_BETA1);
    const float beta2 = muon_scalar(scalars, MUON_SCALAR_ADAM_BETA2);
    const float one_minus_beta1 = 1.0f - beta1;
    const float one_minus_beta2 = 1.0f - beta2;
    const float eps = muon_scalar(scalars, MUON_SCALAR_ADAM_EPS);
    const float mean_scale = muon_scalar(scalars, MUON_SCALAR_GRAD_SCALE);
    const float clip = muon_scalar(scalars, MUON_SCALAR_CLIP_COEF);
    const float bc1 = muon_scalar(scalars, MUON_SCALAR_BC1);
    const float bc2 = muon_scalar(scalars, MUON_SCALAR_BC2);
    const float lr = muon_scalar(scalars, lr_slot) * lr_scale;
    const float wd = muon_scalar(scalars, MUON_SCALAR_ADAM_WEIGHT_DECAY) * wd_scale;
    const float decay = 1.0f - lr * wd;
    for (muon_u64 i = muon_first_index(); i < n; i += muon_grid_stride()) {
        const float g = muon_scaled_grad(grad, grad_bf16, i, mean_scale, clip);
        const float m = beta1 * exp_avg[i] + one_minus_beta1 * g;
        const float v = beta2 * exp_avg_sq[i] + one_minus_beta2 * g * g;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
        const float mhat = m / bc1;
        const float vhat = v / bc2;
        const float u = lr * mhat / (sqrtf(vhat) + eps);
        w[i] = w[i] * muon_cautious_decay(cautious, decay, w[i], u) - u;
    }
}

// Element access and conversions shared by the element-wise kernels. Numerics match
// src/numerics/bf16.rs bit for bit: f32 -> bf16 rounds to nearest, ties to even; bf16 -> f32
// is exact; a NaN stays a NaN with the quiet bit set (the `half` crate's behaviour, which the
// host backend uses). Compiled by NVRTC with --fmad=false, --ftz=false, IEEE division and
// square root, so every `a * b + c` below rounds twice, as on the host.

#ifndef MUON_COMMON_CUH
#define MUON_COMMON_CUH

typedef unsigned int muon_u32;
typedef unsigned short muon_u16;
typedef unsigned long long muon_u64;

__device__ __forceinline__ muon_u16 muon_f32_to_bf16_rne(float x) {
    muon_u32 bits = __float_as_uint(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        return (muon_u16)((bits >> 16) | 0x0040u);
    }
    muon_u32 rounding = 0x7fffu + ((bits >> 16) & 1u);
    return (muon_u16)((bits + rounding) >> 16);
}

__device__ __forceinline__ float muon_bf16_to_f32(muon_u16 b) {
    muon_u32 bits = (muon_u32)b;
    if ((bits & 0x7fffu) > 0x7f80u) {
        bits |= 0x0040u;
    }
    return __uint_as_float(bits << 16);
}

// Element i of a buffer holding f32 (is_bf16 == 0) or bf16 values, as f32 (exact).
__device__ __forceinline__ float muon_load(const void *p, int is_bf16, muon_u64 i) {
    return is_bf16 ? muon_bf16_to_f32(((const muon_u16 *)p)[i]) : ((const float *)p)[i];
}

// Stores v into element i of an f32 or bf16 buffer (bf16: round to nearest even).
__device__ __forceinline__ void muon_store(void *p, int is_bf16, muon_u64 i, float v) {
    if (is_bf16) {
        ((muon_u16 *)p)[i] = muon_f32_to_bf16_rne(v);
    } else {
        ((float *)p)[i] = v;
    }
}

// First index and stride of a one-dimensional grid-stride loop.
__device__ __forceinline__ muon_u64 muon_first_index() {
    return (muon_u64)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ muon_u64 muon_grid_stride() {
    return (muon_u64)gridDim.x * blockDim.x;
}

// Slots of the step's scalars (f64 each; src/backend/ops.rs `Scalar`, same order): the step
// writes them on the device and the update kernels read them, so no host round trip. LR to
// DECOUPLED_LR are the step's arguments (the momentum and betas a scheduler may change every step:
// read here, never baked into a launch, so a captured step replays with new ones).
#define MUON_SCALAR_GRAD_NORM 0
#define MUON_SCALAR_CLIP_COEF 1
#define MUON_SCALAR_GRAD_SCALE 2
#define MUON_SCALAR_SKIP 3
#define MUON_SCALAR_STEP 4
#define MUON_SCALAR_BC1 5
#define MUON_SCALAR_BC2 6
#define MUON_SCALAR_LR 7
#define MUON_SCALAR_WEIGHT_DECAY 8
#define MUON_SCALAR_ADAM_LR 9
#define MUON_SCALAR_ADAM_WEIGHT_DECAY 10
#define MUON_SCALAR_MUON_MOMENTUM 11
#define MUON_SCALAR_ADAM_BETA1 12
#define MUON_SCALAR_ADAM_BETA2 13
#define MUON_SCALAR_ADAM_EPS 14
#define MUON_SCALAR_DECOUPLED_LR 15
#define MUON_SCALAR_DISAGREE_TERM 16
#define MUON_SCALAR_DISAGREE_RANK 17
#define MUON_SCALAR_DISAGREE_STEPS 18
#define MUON_SCALAR_DISAGREE_RANK0_STEPS 19

// The exact sum of squares of the gradient norm (src/numerics/square_sum.rs): 20 limbs of
// 32-bit digits of a fixed-point number whose last bit weighs 2^-298, each limb in a u64, then
// the infinities counted and the NaNs seen. A rank's gathered words (numerics::RankNorm) add
// the steps it has taken, as f64 bits.
#define MUON_SQUARE_SUM_LIMBS 20u
#define MUON_SQUARE_SUM_WORDS 22u
#define MUON_RANK_NORM_WORDS 23u
#define MUON_DIGIT 0xffffffffull

// The updates' gradient: the summed gradient times 1/dp (its mean), then times the clip.
__device__ __forceinline__ float muon_scaled_grad(const void *grad, int grad_bf16, muon_u64 i, float mean_scale,
                                                  float clip) {
    return (muon_load(grad, grad_bf16, i) * mean_scale) * clip;
}

// The factor weight w with update u (the direction subtracted from it) is decayed by: decay, or
// with cautious weight decay 1 where w * u < 0 (src/numerics/muon.rs cautious_decay).
__device__ __forceinline__ float muon_cautious_decay(int cautious, float decay, float w, float u) {
    return (!cautious || w * u >= 0.0f) ? decay : 1.0f;
}

// An f32 scalar of the step (stored exactly as f64).
__device__ __forceinline__ float muon_scalar(const double *scalars, int slot) {
    return (float)scalars[slot];
}

// Whether a non-finite gradient skips this step: every update leaves its state as is.
__device__ __forceinline__ bool muon_step_skipped(const double *scalars) {
    return scalars[MUON_SCALAR_SKIP] != 0.0;
}

#endif

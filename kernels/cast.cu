// Element-wise casts and fills used by the schedule. Numerics match src/numerics/bf16.rs
// bit for bit: f32 -> bf16 rounds to nearest, ties to even; NaN stays a quiet NaN.
// Compiled by NVRTC with --fmad=false and without fast-math.

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

extern "C" __global__ void muon_cast_f32_to_bf16(const float *src, muon_u16 *dst, muon_u64 n) {
    muon_u64 i = (muon_u64)blockIdx.x * blockDim.x + threadIdx.x;
    muon_u64 stride = (muon_u64)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        dst[i] = muon_f32_to_bf16_rne(src[i]);
    }
}

extern "C" __global__ void muon_memset_u32(muon_u32 *dst, muon_u32 value, muon_u64 n) {
    muon_u64 i = (muon_u64)blockIdx.x * blockDim.x + threadIdx.x;
    muon_u64 stride = (muon_u64)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        dst[i] = value;
    }
}

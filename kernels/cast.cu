// Element-wise casts and scaling used by the schedule. Numerics in muon_common.cuh (the same as
// src/numerics/bf16.rs bit for bit). Launch: any 1-D grid (grid-stride loops).

#include "muon_common.cuh"

// dst = bf16(src), round to nearest even (the bf16 operands of the Newton-Schulz products).
extern "C" __global__ void muon_cast_f32_to_bf16(const float *src, muon_u16 *dst, muon_u64 n) {
    for (muon_u64 i = muon_first_index(); i < n; i += muon_grid_stride()) {
        dst[i] = muon_f32_to_bf16_rne(src[i]);
    }
}

// dst = src converted between f32 and bf16 (Backend::cast; same-dtype casts are copies and
// never reach this kernel).
extern "C" __global__ void muon_cast(const void *src, int src_bf16, void *dst, int dst_bf16, muon_u64 n) {
    for (muon_u64 i = muon_first_index(); i < n; i += muon_grid_stride()) {
        muon_store(dst, dst_bf16, i, muon_load(src, src_bf16, i));
    }
}

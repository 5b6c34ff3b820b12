// MXFP8 (E4M3 elements, E8M0 block scales) numerics, TransformerEngine-compatible bit for bit.
// Specification: docs/mxfp8.md (section numbers below refer to it). Mirrored in Rust by
// src/numerics/mxfp8/scalar.rs; tests/mxfp8_cuh_mirror.rs compiles this header as plain C++ on
// the host and compares both exhaustively over all 65,536 bf16 inputs.
//
// Everything here is integer arithmetic plus IEEE f32 multiplies and adds with round to nearest
// even. Compile without fast-math and without flush-to-zero: the scale of a block whose
// amax * (1/448) is an f32 subnormal depends on subnormals being kept (section 10).

#ifndef MUON_MXFP8_CUH
#define MUON_MXFP8_CUH

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define MUON_MX_FN __host__ __device__ __forceinline__
#else
#define MUON_MX_FN inline
#endif

// Elements per scaling block (1x32 rowwise, 32x1 columnwise; section 3).
#define MUON_MX_BLOCK 32u
// (float)(1.0 / 448.0), TE `Quantized_Limits<fp8e4m3>::max_norm_rcp` (section 1).
#define MUON_MX_MAX_NORM_RCP_BITS 0x3B124925u
// E4M3 code of NaN emitted for every NaN input, whatever its sign (section 2, "NaN sign").
#define MUON_MX_E4M3_NAN 0x7Fu
// Largest finite E4M3 magnitude code, 448 (section 6).
#define MUON_MX_E4M3_MAX 0x7Eu

MUON_MX_FN float muon_mx_bits_to_f32(unsigned int bits) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(bits);
#else
    float f;
    __builtin_memcpy(&f, &bits, sizeof f);
    return f;
#endif
}

MUON_MX_FN unsigned int muon_mx_f32_to_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    unsigned int bits;
    __builtin_memcpy(&bits, &f, sizeof bits);
    return bits;
#endif
}

// IEEE f32 multiply and add, round to nearest even, never contracted into an FMA.
MUON_MX_FN float muon_mx_mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

MUON_MX_FN float muon_mx_add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

// bf16 bits -> f32, exact (cvt.f32.bf16 / prmt in TE; section 7).
MUON_MX_FN float muon_mx_bf16_to_f32(unsigned short bits) {
    return muon_mx_bits_to_f32((unsigned int)bits << 16);
}

// Amax key of a bf16 element: |x| as bits, or 0 for NaN (NaN is ignored by the amax, section 7).
// For non-NaN magnitudes, integer order equals float order, so the block amax is the integer
// maximum of the keys.
MUON_MX_FN unsigned int muon_mx_amax_key_bf16(unsigned short bits) {
    unsigned int a = bits & 0x7FFFu;
    return a > 0x7F80u ? 0u : a;
}

// Amax key of an f32 element, as above.
MUON_MX_FN unsigned int muon_mx_amax_key_f32(float x) {
    unsigned int a = muon_mx_f32_to_bits(x) & 0x7FFFFFFFu;
    return a > 0x7F800000u ? 0u : a;
}

// TE `ptx::float_to_e8m0` software fallback (common/util/ptx_arch_spec.cuh), section 1: round
// up to a power of two, saturate at 0xFE, NaN -> 0xFF, zero -> 0x00. The sign is ignored.
MUON_MX_FN unsigned char muon_mx_float_to_e8m0(float v) {
    unsigned int bits = muon_mx_f32_to_bits(v);
    unsigned int a = bits & 0x7FFFFFFFu;
    if (a > 0x7F800000u) {
        return 0xFFu;
    }
    if (a == 0x7F800000u) {
        return 0xFEu;
    }
    if (a == 0u) {
        return 0x00u;
    }
    unsigned int e = (bits >> 23) & 0xFFu;
    unsigned int m = bits & 0x7FFFFFu;
    if (m > 0u && e != 0xFEu && !(e == 0u && m <= 0x400000u)) {
        e += 1u;
    }
    return (unsigned char)e;
}

// Scale byte of a block from its f32 amax: float_to_e8m0(amax * (1/448)) with one IEEE f32
// multiply (section 1).
MUON_MX_FN unsigned char muon_mx_e8m0_from_amax(float amax) {
    return muon_mx_float_to_e8m0(muon_mx_mul_rn(amax, muon_mx_bits_to_f32(MUON_MX_MAX_NORM_RCP_BITS)));
}

// Inverse scale 2^(127-b) multiplied into elements before encoding, TE `ptx::exp2f_rcp`
// (common/util/ptx.cuh): 255 -> NaN, 254 -> 2^-127 (an f32 subnormal).
MUON_MX_FN float muon_mx_scale_inv(unsigned char b) {
    if (b == 255u) {
        return muon_mx_bits_to_f32(0x7FFFFFFFu);
    }
    if (b == 254u) {
        return muon_mx_bits_to_f32(0x00400000u);
    }
    return muon_mx_bits_to_f32((254u - b) << 23);
}

// Scale 2^(b-127) used by dequantization, TE `ptx::exp2f`: 255 -> NaN, 0 -> 2^-127.
MUON_MX_FN float muon_mx_scale(unsigned char b) {
    if (b == 255u) {
        return muon_mx_bits_to_f32(0x7FFFFFFFu);
    }
    if (b == 0u) {
        return muon_mx_bits_to_f32(0x00400000u);
    }
    return muon_mx_bits_to_f32((unsigned int)b << 23);
}

// f32 -> E4M3 with round to nearest even and saturation to +-448, the behaviour of PTX
// `cvt.rn.satfinite.e4m3x2.f32` (sections 2 and 6). NaN of either sign gives 0x7F. Written
// branch-free so the host loops vectorize:
// - |x| < 2^-6 lands on the subnormal grid 2^-9: adding 2^14 (whose ulp is 2^-9) rounds |x|
//   to that grid with the FPU's ties-to-even, and the bits above 2^14 are the code (0..8);
// - otherwise 20 mantissa bits are dropped with ties to even and the exponent is rebiased from
//   127 to 7 ((127 - 7) << 3 = 960), saturating at 0x7E (448, also for +-inf).
MUON_MX_FN unsigned char muon_mx_f32_to_e4m3(float x) {
    unsigned int bits = muon_mx_f32_to_bits(x);
    unsigned int sign = (bits >> 24) & 0x80u;
    unsigned int a = bits & 0x7FFFFFFFu;
    unsigned int sub = muon_mx_f32_to_bits(muon_mx_add_rn(muon_mx_bits_to_f32(a), 16384.0f)) - 0x46800000u;
    unsigned int norm = ((a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20) - 960u;
    norm = norm < MUON_MX_E4M3_MAX ? norm : MUON_MX_E4M3_MAX;
    unsigned int mag = a < 0x3C800000u ? sub : norm;
    unsigned int code = sign | mag;
    return (unsigned char)(a > 0x7F800000u ? MUON_MX_E4M3_NAN : code);
}

// E4M3 code -> f32 (exact). 0x7F and 0xFF are NaN.
MUON_MX_FN float muon_mx_e4m3_to_f32(unsigned char c) {
    unsigned int e = (c >> 3) & 0xFu;
    unsigned int m = c & 7u;
    unsigned int sign = (unsigned int)(c & 0x80u) << 24;
    if (e == 15u && m == 7u) {
        return muon_mx_bits_to_f32(sign | 0x7FC00000u);
    }
    // Normal: 2^(e-7) * (1 + m/8) -> f32 exponent e + 120. Subnormal: m * 2^-9.
    unsigned int mag = e != 0u ? ((e + 120u) << 23) | (m << 20) : muon_mx_f32_to_bits((float)m * 0.001953125f);
    return muon_mx_bits_to_f32(sign | mag);
}

// E4M3 code of one bf16 element after multiplying by the block's inverse scale (TE mul_cvt:
// exact upcast, one f32 multiply, satfinite cvt; section 2). -0 stays -0 (0x80), the generic
// kernel's behaviour.
MUON_MX_FN unsigned char muon_mx_encode_bf16(unsigned short x, float scale_inv) {
    return muon_mx_f32_to_e4m3(muon_mx_mul_rn(muon_mx_bf16_to_f32(x), scale_inv));
}

// Byte offset of scale (i, j) in the swizzled layout read by cuBLAS / tcgen05, TE
// `gemm_swizzled_scale_idx` (common/cast/mxfp8/swizzle.cuh; section 3). Rowwise: i = row,
// j = row block, num_tiles_x = ceil(cols/128). Columnwise: i = column, j = column block,
// num_tiles_x = ceil(rows/128).
MUON_MX_FN unsigned long long muon_mx_swizzled_scale_index(unsigned long long i, unsigned long long j,
                                                           unsigned long long num_tiles_x) {
    unsigned long long tile = ((i / 128u) * num_tiles_x + j / 4u) * 512u;
    return tile + (i % 32u) * 16u + ((i % 128u) / 32u) * 4u + (j % 4u);
}

#endif

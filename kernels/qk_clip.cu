// QK-clip of one attention matrix's fp32 master (src/numerics/qk_clip.rs, the specification;
// Kimi K2's MuonClip, Megatron-LM's clip_qk rules). The matrix is `groups` blocks of rows; block
// g takes eta = tau / max(maxima[g*heads_per_group ..]) when that maximum is finite and above
// tau, and multiplies each of its row segments by eta^e, e by role: query alpha, key 1 - alpha,
// rope 1, value untouched (0). eta is one f32 division; eta^e is muon_pow_unit in f64 (adds,
// multiplies and divides only; --fmad=false) rounded to f32; each weight one f32 multiply.
// Launch: block 256; grid.x walks the groups, grid.y the elements of a group's block.

#include "muon_common.cuh"

#define MUON_QK_SEGMENTS 4
#define MUON_QK_QUERY 0u
#define MUON_QK_KEY 1u
#define MUON_QK_ROPE 2u

// Segment k of a group's block: rows in the low 32 bits, role in the high 32.
struct muon_qk_segments {
    muon_u64 seg[MUON_QK_SEGMENTS];
};

// x^e for x in (0, 1], e in (0, 1): numerics::qk_clip::pow_unit, operation for operation.
__device__ double muon_pow_unit(double x, double e) {
    const double ln2 = 0.6931471805599453;
    const double sqrt2 = 1.4142135623730951;
    if (x == 0.0) {
        return 0.0;
    }
    const muon_u64 bits = (muon_u64)__double_as_longlong(x);
    long long k = (long long)((bits >> 52) & 0x7ffull) - 1023;
    double m = __longlong_as_double((long long)((bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull));
    if (m > sqrt2) {
        m = m / 2.0;
        k += 1;
    }
    const double s = (m - 1.0) / (m + 1.0);
    const double s2 = s * s;
    double series = 0.0;
    for (int i = 13; i >= 0; --i) {
        series = series * s2 + 1.0 / (double)(2 * i + 1);
    }
    const double ln = (double)k * ln2 + 2.0 * s * series;
    const double y = e * ln;
    const double n = floor(y / ln2 + 0.5);
    const double r = y - n * ln2;
    double t = 1.0;
    for (int i = 20; i >= 1; --i) {
        t = 1.0 + t * r / (double)i;
    }
    return t * __longlong_as_double((long long)(((muon_u64)((long long)n + 1023)) << 52));
}

extern "C" __global__ void muon_qk_clip(float *w, const float *maxima, muon_u64 cols, muon_u32 groups,
                                        muon_u32 heads_per_group, muon_u32 segments,
                                        struct muon_qk_segments segs, float tau, float alpha) {
    muon_u64 group_rows = 0;
    for (muon_u32 k = 0; k < segments; ++k) {
        group_rows += segs.seg[k] & 0xffffffffull;
    }
    const muon_u64 group_len = group_rows * cols;
    for (muon_u32 g = blockIdx.x; g < groups; g += gridDim.x) {
        float max = -__int_as_float(0x7f800000);
        bool finite = true;
        for (muon_u32 h = 0; h < heads_per_group; ++h) {
            const float s = maxima[(muon_u64)g * heads_per_group + h];
            finite = finite && isfinite(s);
            if (s > max) {
                max = s;
            }
        }
        if (!finite || !(max > tau)) {
            continue;
        }
        const float eta = tau / max;
        float factor[MUON_QK_SEGMENTS];
        bool active[MUON_QK_SEGMENTS];
        for (muon_u32 k = 0; k < segments; ++k) {
            const muon_u32 role = (muon_u32)(segs.seg[k] >> 32);
            double e = 0.0;
            if (role == MUON_QK_QUERY) {
                e = (double)alpha;
            } else if (role == MUON_QK_KEY) {
                e = 1.0 - (double)alpha;
            } else if (role == MUON_QK_ROPE) {
                e = 1.0;
            }
            active[k] = e != 0.0;
            factor[k] = e == 1.0 ? eta : (float)muon_pow_unit((double)eta, e);
        }
        float *block = w + (muon_u64)g * group_len;
        for (muon_u64 i = (muon_u64)blockIdx.y * blockDim.x + threadIdx.x; i < group_len;
             i += (muon_u64)gridDim.y * blockDim.x) {
            muon_u64 row = i / cols;
            muon_u32 k = 0;
            while (row >= (segs.seg[k] & 0xffffffffull)) {
                row -= segs.seg[k] & 0xffffffffull;
                ++k;
            }
            if (active[k]) {
                block[i] = block[i] * factor[k];
            }
        }
    }
}

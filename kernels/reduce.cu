// Sums of squares. The global gradient norm's is exact (muon_norm_partials below); the Frobenius
// norms of the Newton-Schulz inputs are summed in f64 (muon_sumsq_*): every square is exact in f64 (an f32 product has at most
// 48 significant bits), so only the order of the f64 additions can differ from the host, which
// adds element i to lane i mod 8 and then the 8 lanes in order (src/numerics/mod.rs). Here the
// order is a fixed tree that depends only on the span lengths (never on the device, the
// timing or the SM count): each block strides over its share of a span, a 256-thread tree
// reduces the block, and a second kernel adds the block partials of each group in a second
// fixed tree. Results are deterministic and agree with the host's to the last bit or
// within a few f64 ulps.
//
// Launch: block 256 threads. muon_sumsq_partials and muon_norm_partials: grid.x = total blocks
// of the spans (span s owns blocks [first_block_s, first_block_{s+1})). muon_sumsq_finish:
// grid.x = groups.

#include "muon_common.cuh"

#define MUON_SUMSQ_MAX_SPANS 32u
#define MUON_SUMSQ_THREADS 256u

// flags: bit 0 the span is bf16; bit 1 (muon_norm_partials) the span is only checked for
// non-finite values (the found-inf check of gradients another rank counts in the norm).
struct muon_sumsq_span {
    const void *ptr;
    muon_u64 len;
    muon_u32 flags;
    muon_u32 first_block;
};

struct muon_sumsq_spans {
    muon_sumsq_span span[MUON_SUMSQ_MAX_SPANS];
    muon_u32 count;
    muon_u32 pad;
};

struct muon_sumsq_group {
    muon_u32 first;
    muon_u32 count;
    muon_u32 out;
    muon_u32 pad;
};

struct muon_sumsq_groups {
    muon_sumsq_group group[MUON_SUMSQ_MAX_SPANS];
    muon_u32 count;
    muon_u32 pad;
};

// Tree sum of lanes[0..256) into lanes[0]; every thread of the block must call it.
template <typename T> __device__ __forceinline__ void muon_block_sum(T *lanes) {
    for (muon_u32 width = MUON_SUMSQ_THREADS / 2u; width > 0u; width >>= 1) {
        if (threadIdx.x < width) {
            lanes[threadIdx.x] += lanes[threadIdx.x + width];
        }
        __syncthreads();
    }
}

// The span of this block and the block's range of it: elements first, first + stride, ... of
// span.len for this thread.
struct muon_span_share {
    muon_sumsq_span span;
    muon_u64 first;
    muon_u64 stride;
};

__device__ __forceinline__ muon_span_share muon_block_share(const muon_sumsq_spans &spans) {
    const muon_u32 block = blockIdx.x;
    muon_u32 s = 0u;
    while (s + 1u < spans.count && spans.span[s + 1u].first_block <= block) {
        ++s;
    }
    muon_span_share share;
    share.span = spans.span[s];
    const muon_u32 end = s + 1u < spans.count ? spans.span[s + 1u].first_block : gridDim.x;
    share.stride = (muon_u64)(end - share.span.first_block) * MUON_SUMSQ_THREADS;
    share.first = (muon_u64)(block - share.span.first_block) * MUON_SUMSQ_THREADS + threadIdx.x;
    return share;
}

// partials[block] = sum of x^2 over the block's share of its span.
extern "C" __global__ void __launch_bounds__(256) muon_sumsq_partials(muon_sumsq_spans spans, double *partials) {
    __shared__ double lanes[MUON_SUMSQ_THREADS];
    const muon_span_share share = muon_block_share(spans);
    const muon_sumsq_span span = share.span;
    double acc = 0.0;
    for (muon_u64 i = share.first; i < span.len; i += share.stride) {
        const double v = (double)muon_load(span.ptr, (int)(span.flags & 1u), i);
        acc += v * v;
    }
    lanes[threadIdx.x] = acc;
    __syncthreads();
    muon_block_sum(lanes);
    if (threadIdx.x == 0u) {
        partials[blockIdx.x] = lanes[0];
    }
}

// out[g.out] = sum of partials[g.first .. g.first + g.count), one block per group.
extern "C" __global__ void __launch_bounds__(256)
    muon_sumsq_finish(muon_sumsq_groups groups, const double *partials, double *out) {
    __shared__ double lanes[MUON_SUMSQ_THREADS];
    const muon_sumsq_group g = groups.group[blockIdx.x];
    double acc = 0.0;
    for (muon_u32 i = threadIdx.x; i < g.count; i += MUON_SUMSQ_THREADS) {
        acc += partials[g.first + i];
    }
    lanes[threadIdx.x] = acc;
    __syncthreads();
    muon_block_sum(lanes);
    if (threadIdx.x == 0u) {
        out[g.out] = lanes[0];
    }
}

// Adds x^2 to a thread's square-sum words (src/numerics/square_sum.rs): x = M * 2^E with an
// integer M < 2^24 and E >= -149, so x^2 is the integer M^2 < 2^48 at bit 2E + 298 of the
// fixed-point sum, split over three limbs. A non-finite x is counted instead: an infinity of
// a counted span as an infinity, anything else as a NaN; a checked span adds no squares.
__device__ __forceinline__ void muon_square_sum_add(muon_u64 *words, float x, bool counted) {
    const muon_u32 bits = __float_as_uint(x);
    const muon_u32 exponent = (bits >> 23) & 0xffu;
    const muon_u64 fraction = bits & 0x7fffffu;
    if (exponent == 0xffu) {
        words[counted && fraction == 0ull ? MUON_SQUARE_SUM_LIMBS : MUON_SQUARE_SUM_LIMBS + 1u] += 1ull;
        return;
    }
    if (!counted) {
        return;
    }
    const muon_u64 m = exponent == 0u ? fraction : (fraction | 0x800000ull);
    const muon_u32 position = exponent == 0u ? 0u : 2u * exponent - 2u;
    const muon_u64 square = m * m;
    const muon_u32 limb = position >> 5, offset = position & 31u;
    words[limb] += (square << offset) & MUON_DIGIT;
    words[limb + 1u] += (square >> (32u - offset)) & MUON_DIGIT;
    words[limb + 2u] += offset == 0u ? 0ull : square >> (64u - offset);
}

// sum[0 .. MUON_SQUARE_SUM_WORDS) += the exact sum of squares of mean_scale * x over the block's
// share of its span (the updates' mean gradient, each product rounded to f32; sum zeroed
// before the first launch). Integer additions commute, so the atomic adds of the
// blocks give the same bits in any order. Each block carries its limbs to digits below 2^32
// first, so 2^32 blocks cannot overflow a limb.
extern "C" __global__ void __launch_bounds__(256) muon_norm_partials(muon_sumsq_spans spans, float mean_scale,
                                                                     muon_u64 *sum) {
    __shared__ muon_u64 lanes[MUON_SUMSQ_THREADS];
    __shared__ muon_u64 block_words[MUON_SQUARE_SUM_WORDS];
    const muon_span_share share = muon_block_share(spans);
    const muon_sumsq_span span = share.span;
    const bool counted = (span.flags & 2u) == 0u;
    muon_u64 words[MUON_SQUARE_SUM_WORDS];
    for (muon_u32 w = 0u; w < MUON_SQUARE_SUM_WORDS; ++w) {
        words[w] = 0ull;
    }
    for (muon_u64 i = share.first; i < span.len; i += share.stride) {
        muon_square_sum_add(words, muon_load(span.ptr, (int)(span.flags & 1u), i) * mean_scale, counted);
    }
    for (muon_u32 w = 0u; w < MUON_SQUARE_SUM_WORDS; ++w) {
        lanes[threadIdx.x] = words[w];
        __syncthreads();
        muon_block_sum(lanes);
        if (threadIdx.x == 0u) {
            block_words[w] = lanes[0];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0u) {
        for (muon_u32 w = 0u; w + 1u < MUON_SQUARE_SUM_LIMBS; ++w) {
            block_words[w + 1u] += block_words[w] >> 32;
            block_words[w] &= MUON_DIGIT;
        }
    }
    __syncthreads();
    if (threadIdx.x < MUON_SQUARE_SUM_WORDS && block_words[threadIdx.x] != 0ull) {
        atomicAdd(&sum[threadIdx.x], block_words[threadIdx.x]);
    }
}

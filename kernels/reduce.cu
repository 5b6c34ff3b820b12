// Sums of squares in f64: the global gradient norm (Backend::squared_norm) and the Frobenius
// norms of the Newton-Schulz inputs. Every square is exact in f64 (an f32 product has at most
// 48 significant bits), so only the order of the f64 additions can differ from the host, which
// adds element i to lane i mod 8 and then the 8 lanes in order (src/numerics/mod.rs). Here the
// order is a fixed tree that depends only on the span lengths (never on the device, the
// timing or the SM count): each block strides over its share of a span, a 256-thread tree
// reduces the block, and a second kernel adds the block partials of each group in a second
// fixed tree. Results are deterministic and agree with the host's to the last bit or
// within a few f64 ulps. A NaN or infinity in the input makes the sum non-finite exactly as on
// the host (the squares are non-negative, so no inf - inf can appear): that is the found-inf
// check of the step.
//
// Launch: block 256 threads. muon_sumsq_partials: grid.x = total blocks of the spans
// (span s owns blocks [first_block_s, first_block_{s+1})). muon_sumsq_finish: grid.x = groups.

#include "muon_common.cuh"

#define MUON_SUMSQ_MAX_SPANS 32u
#define MUON_SUMSQ_THREADS 256u

// flags: bit 0 the span is bf16; bit 1 the span is only checked for non-finite values — its
// squares are added times 0, which leaves a finite sum unchanged to the bit and turns it into
// NaN when the span holds a NaN or an infinity (the found-inf check of gradients another rank
// counts in the norm).
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
    muon_u32 accumulate;
};

struct muon_sumsq_groups {
    muon_sumsq_group group[MUON_SUMSQ_MAX_SPANS];
    muon_u32 count;
    muon_u32 pad;
};

// Tree sum of lanes[0..256) into lanes[0]; every thread of the block must call it.
__device__ __forceinline__ void muon_block_sum(double *lanes) {
    for (muon_u32 width = MUON_SUMSQ_THREADS / 2u; width > 0u; width >>= 1) {
        if (threadIdx.x < width) {
            lanes[threadIdx.x] += lanes[threadIdx.x + width];
        }
        __syncthreads();
    }
}

// partials[block] = sum of x^2 over the block's share of its span.
extern "C" __global__ void __launch_bounds__(256) muon_sumsq_partials(muon_sumsq_spans spans, double *partials) {
    __shared__ double lanes[MUON_SUMSQ_THREADS];
    const muon_u32 block = blockIdx.x;
    muon_u32 s = 0u;
    while (s + 1u < spans.count && spans.span[s + 1u].first_block <= block) {
        ++s;
    }
    const muon_sumsq_span span = spans.span[s];
    const muon_u32 end = s + 1u < spans.count ? spans.span[s + 1u].first_block : gridDim.x;
    const muon_u64 stride = (muon_u64)(end - span.first_block) * MUON_SUMSQ_THREADS;
    double acc = 0.0;
    for (muon_u64 i = (muon_u64)(block - span.first_block) * MUON_SUMSQ_THREADS + threadIdx.x; i < span.len;
         i += stride) {
        const double v = (double)muon_load(span.ptr, (int)(span.flags & 1u), i);
        const double square = v * v;
        acc += (span.flags & 2u) ? 0.0 * square : square;
    }
    lanes[threadIdx.x] = acc;
    __syncthreads();
    muon_block_sum(lanes);
    if (threadIdx.x == 0u) {
        partials[block] = lanes[0];
    }
}

// out[g.out] = (g.accumulate ? out[g.out] : 0) + sum of partials[g.first .. g.first + g.count),
// one block per group.
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
        out[g.out] = (g.accumulate ? out[g.out] : 0.0) + lanes[0];
    }
}

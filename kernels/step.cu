// The step's scalars from every rank's sum of squares (src/numerics/mod.rs `step_scalars`,
// operation for operation): one block, after the gathered sums arrived, so the step needs no
// host round trip. Each rank's exact sum of squares (src/numerics/square_sum.rs) is added to
// the others' in integers and rounded once; f64 arithmetic is IEEE (division and square root
// correctly rounded, no contraction with --fmad=false); the f32 products are the host's
// powi_f32 and clip scaling.
// Launch: one block of 256 threads.

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

// Most optimizers sharing one clip (src/backend/ops.rs MAX_NORM_TERMS).
#define MUON_NORM_TERMS_MAX 8

// The gathered sums of every optimizer sharing the step's clip: term k has ranks[k] of them (its
// norm group, MUON_RANK_NORM_WORDS words each: the sum of its mean gradient's squares, then the
// steps the rank has taken as f64 bits).
struct muon_norm_terms {
    const muon_u64 *sums[MUON_NORM_TERMS_MAX];
    muon_u32 ranks[MUON_NORM_TERMS_MAX];
    muon_u64 count;
};

// mantissa * 2^exponent, exact (mantissa <= 2^53, a normal f64 result).
__device__ __forceinline__ double muon_scaled(muon_u64 mantissa, long long exponent) {
    return (double)mantissa * __longlong_as_double((exponent + 1023ll) << 52);
}

// The carried sum `limbs` (digits below 2^32) and its counts rounded to the nearest f64, ties
// to even (SquareSum::to_f64): the top three limbs form a window of at least 65 bits whose
// top 53 are the mantissa, the next the rounding bit, and every bit below sticky.
__device__ double muon_square_sum_round(const muon_u64 *words) {
    if (words[MUON_SQUARE_SUM_LIMBS + 1u] != 0ull) {
        return __longlong_as_double(0x7ff8000000000000ll);
    }
    if (words[MUON_SQUARE_SUM_LIMBS] != 0ull) {
        return __longlong_as_double(0x7ff0000000000000ll);
    }
    int top = (int)MUON_SQUARE_SUM_LIMBS - 1;
    while (top >= 0 && words[top] == 0ull) {
        --top;
    }
    if (top < 0) {
        return 0.0;
    }
    const muon_u64 hi = words[top];
    const muon_u64 mid = top >= 1 ? words[top - 1] : 0ull;
    const muon_u64 lo = top >= 2 ? words[top - 2] : 0ull;
    // window = hi * 2^64 + mid * 2^32 + lo; `dropped` of its bits lie below the 54 kept.
    const int significant = 64 - __clzll((long long)hi) + 64;
    const int dropped = significant - 54;
    const muon_u64 upper = (hi << 32) | mid;
    muon_u64 kept;
    bool sticky;
    if (dropped <= 32) {
        kept = (upper << (32 - dropped)) | (lo >> dropped);
        sticky = (lo & ((1ull << dropped) - 1ull)) != 0ull;
    } else {
        kept = upper >> (dropped - 32);
        sticky = (upper & ((1ull << (dropped - 32)) - 1ull)) != 0ull || lo != 0ull;
    }
    for (int i = 0; i + 2 < top; ++i) {
        sticky = sticky || words[i] != 0ull;
    }
    muon_u64 mantissa = kept >> 1;
    if ((kept & 1ull) != 0ull && (sticky || (mantissa & 1ull) != 0ull)) {
        mantissa += 1ull;
    }
    return muon_scaled(mantissa, -298ll + 32ll * (top - 2) + dropped + 1);
}

// Every rank's sum of every term added exactly (each word's low and high 32 bits summed apart,
// so no number of sums below 2^32 overflows), carried and rounded once. Every thread of the
// block calls it; thread 0 gets the value.
__device__ double muon_total_squared_norm(const struct muon_norm_terms *terms) {
    __shared__ muon_u64 low[MUON_SQUARE_SUM_WORDS];
    __shared__ muon_u64 high[MUON_SQUARE_SUM_WORDS];
    __shared__ muon_u64 total[MUON_SQUARE_SUM_WORDS];
    const muon_u32 w = threadIdx.x;
    if (w < MUON_SQUARE_SUM_WORDS) {
        muon_u64 l = 0ull, h = 0ull;
        for (muon_u32 k = 0u; k < (muon_u32)terms->count; ++k) {
            for (muon_u32 r = 0u; r < terms->ranks[k]; ++r) {
                const muon_u64 word = terms->sums[k][(muon_u64)r * MUON_RANK_NORM_WORDS + w];
                l += word & MUON_DIGIT;
                h += word >> 32;
            }
        }
        low[w] = l;
        high[w] = h;
    }
    __syncthreads();
    if (threadIdx.x != 0u) {
        return 0.0;
    }
    for (muon_u32 i = 0u; i < MUON_SQUARE_SUM_LIMBS; ++i) {
        total[i] = low[i] + (i > 0u ? high[i - 1u] : 0ull);
    }
    for (muon_u32 i = MUON_SQUARE_SUM_LIMBS; i < MUON_SQUARE_SUM_WORDS; ++i) {
        total[i] = low[i] + (high[i] << 32);
    }
    for (muon_u32 i = 0u; i + 1u < MUON_SQUARE_SUM_LIMBS; ++i) {
        total[i + 1u] += total[i] >> 32;
        total[i] &= MUON_DIGIT;
    }
    return muon_square_sum_round(total);
}

// The first rank of a term whose steps differ from its rank 0's (numerics::StepsDisagree) into
// the DISAGREE slots (rank 1 + r; 0 when every term's ranks agree); whether one was found.
__device__ bool muon_steps_disagree(double *scalars, const struct muon_norm_terms *terms) {
    scalars[MUON_SCALAR_DISAGREE_RANK] = 0.0;
    for (muon_u32 k = 0u; k < (muon_u32)terms->count; ++k) {
        const muon_u64 *sums = terms->sums[k];
        const muon_u64 first = sums[MUON_SQUARE_SUM_WORDS];
        for (muon_u32 r = 1u; r < terms->ranks[k]; ++r) {
            const muon_u64 steps = sums[(muon_u64)r * MUON_RANK_NORM_WORDS + MUON_SQUARE_SUM_WORDS];
            if (steps != first) {
                scalars[MUON_SCALAR_DISAGREE_TERM] = (double)k;
                scalars[MUON_SCALAR_DISAGREE_RANK] = (double)(r + 1u);
                scalars[MUON_SCALAR_DISAGREE_STEPS] = __longlong_as_double((long long)steps);
                scalars[MUON_SCALAR_DISAGREE_RANK0_STEPS] = __longlong_as_double((long long)first);
                return true;
            }
        }
    }
    return false;
}

// This optimizer's gradients are summed over `dp` ranks (the updates scale them by 1/dp). The
// bias corrections take the step's betas (its arguments, copied in before this launch) and the
// new step count, as torch.optim.AdamW does when a scheduler changes the betas.
extern "C" __global__ void muon_step_scalars(double *scalars, struct muon_norm_terms terms, muon_u32 dp,
                                             float clip_grad) {
    if (blockIdx.x != 0u) {
        return;
    }
    const double total = muon_total_squared_norm(&terms);
    if (threadIdx.x != 0u) {
        return;
    }
    const bool disagree = muon_steps_disagree(scalars, &terms);
    const bool skipped = !isfinite(total) || disagree;
    float clip_coef = 1.0f;
    if (!skipped && clip_grad != 0.0f) {
        const double coef = (double)clip_grad / (sqrt(total) + 1e-6);
        clip_coef = (float)fmin(coef, 1.0);
    }
    const float grad_scale = dp > 1u ? 1.0f / (float)dp : 1.0f;
    const muon_u64 step = (muon_u64)scalars[MUON_SCALAR_STEP] + (skipped ? 0ull : 1ull);
    scalars[MUON_SCALAR_GRAD_NORM] = sqrt(total);
    scalars[MUON_SCALAR_CLIP_COEF] = (double)clip_coef;
    scalars[MUON_SCALAR_GRAD_SCALE] = (double)grad_scale;
    scalars[MUON_SCALAR_SKIP] = skipped ? 1.0 : 0.0;
    scalars[MUON_SCALAR_STEP] = (double)step;
    const float beta1 = muon_scalar(scalars, MUON_SCALAR_ADAM_BETA1);
    const float beta2 = muon_scalar(scalars, MUON_SCALAR_ADAM_BETA2);
    scalars[MUON_SCALAR_BC1] = (double)(1.0f - muon_powi_f32(beta1, step));
    scalars[MUON_SCALAR_BC2] = (double)(1.0f - muon_powi_f32(beta2, step));
}

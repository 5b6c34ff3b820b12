// The element-wise parts of one Muon update (src/numerics/muon.rs, src/numerics/newton_schulz.rs);
// the matrix products run on cuBLAS (the tiled ones from pointer lists written here). Every
// operation is one f32 rounding in the host's order (--fmad=false). Launch: block 256 threads,
// any 1-D grid (grid-stride loops), except the tiled kernels (MUON_TILE below).

#include "muon_common.cuh"

// g = (grad * grad_scale) * clip; m = mu * m + (1 - mu) * g; u = nesterov ? g + mu * (m - g) : m, with the
// step's mu (and 1 - mu one f32 subtraction, as on the host). A bf16 momentum (`momentum_bf16`) is
// read exactly and m rounded to bf16 (nearest even) before it is stored and used. Without Nesterov
// an f32 `update` may be `momentum` itself (u = m): then nothing more is stored.
extern "C" __global__ void muon_momentum(const void *grad, int grad_bf16, void *momentum, float *update,
                                         muon_u64 n, const double *scalars, int nesterov, int momentum_bf16) {
    if (muon_step_skipped(scalars)) {
        return;
    }
    const float mean_scale = muon_scalar(scalars, MUON_SCALAR_GRAD_SCALE);
    const float clip = muon_scalar(scalars, MUON_SCALAR_CLIP_COEF);
    const float mu = muon_scalar(scalars, MUON_SCALAR_MUON_MOMENTUM);
    const float one_minus_mu = 1.0f - mu;
    for (muon_u64 i = muon_first_index(); i < n; i += muon_grid_stride()) {
        const float g = muon_scaled_grad(grad, grad_bf16, i, mean_scale, clip);
        float m = mu * muon_load(momentum, momentum_bf16, i) + one_minus_mu * g;
        if (momentum_bf16) {
            m = muon_bf16_to_f32(muon_f32_to_bf16_rne(m));
        }
        muon_store(momentum, momentum_bf16, i, m);
        if ((void *)update != momentum) {
            update[i] = nesterov ? g + mu * (m - g) : m;
        }
    }
}

// 32 x 32 tiles of row-major matrices, each staged in shared memory so that a transposed
// element is read and written by consecutive threads (coalesced on both sides), as in NVIDIA's
// transpose sample. Launch: block 32 x 8; grid.x the column tiles, grid.y and grid.z any number
// of blocks (the kernels stride over the row tiles and the batch).
#define MUON_TILE 32u

// The Newton-Schulz input of `batch` consecutive rows x cols matrices of u: X = U / norm with
// norm = max(f32(sqrt(sumsq[k])), eps) for matrix k, written transposed (cols x rows) when
// `transpose` is set, as the host's normalization and transpose_map. u and x do not overlap.
extern "C" __global__ void muon_ns_normalize(const float *u, float *x, const double *sumsq, muon_u32 batch,
                                             muon_u32 rows, muon_u32 cols, int transpose, float eps) {
    __shared__ float tile[MUON_TILE][MUON_TILE + 1];
    const muon_u64 size = (muon_u64)rows * cols;
    const muon_u64 c0 = (muon_u64)blockIdx.x * MUON_TILE;
    for (muon_u64 k = blockIdx.z; k < batch; k += gridDim.z) {
        const float norm = fmaxf(__double2float_rn(sqrt(sumsq[k])), eps);
        const float *uk = u + k * size;
        float *xk = x + k * size;
        for (muon_u64 r0 = (muon_u64)blockIdx.y * MUON_TILE; r0 < rows; r0 += (muon_u64)gridDim.y * MUON_TILE) {
            for (muon_u32 dy = threadIdx.y; dy < MUON_TILE; dy += blockDim.y) {
                const muon_u64 r = r0 + dy;
                const muon_u64 c = c0 + threadIdx.x;
                if (r < rows && c < cols) {
                    const float v = uk[r * cols + c] / norm;
                    if (transpose) {
                        tile[dy][threadIdx.x] = v;
                    } else {
                        xk[r * cols + c] = v;
                    }
                }
            }
            if (!transpose) {
                continue;
            }
            __syncthreads();
            for (muon_u32 dy = threadIdx.y; dy < MUON_TILE; dy += blockDim.y) {
                const muon_u64 c = c0 + dy;
                const muon_u64 r = r0 + threadIdx.x;
                if (r < rows && c < cols) {
                    xk[c * rows + r] = tile[threadIdx.x][dy];
                }
            }
            __syncthreads();
        }
    }
}

// `batch` consecutive symmetric m x m matrices of src made whole from their lower triangles
// (a symmetric product computes its tiles on and below the diagonal, src/numerics/gemm.rs):
// element (i, j) is src[max(i, j)][min(i, j)], stored into dst as bf16 (dst_bf16: the host's
// rounding of the mirrored matrix) or, in place (dst = src), as f32 into the upper triangle.
// The block of a tile (bi, bj) on or below the diagonal stages it once and writes it (bf16) and
// its mirror (bj, bi); the blocks above the diagonal have nothing to do. In place, the tiles
// below the diagonal are only read, and each diagonal tile is read and written by its own block.
extern "C" __global__ void muon_ns_symmetrize(const float *src, void *dst, int dst_bf16, muon_u32 batch,
                                              muon_u32 m) {
    __shared__ float tile[MUON_TILE][MUON_TILE + 1];
    const muon_u64 size = (muon_u64)m * m;
    const muon_u64 bj = blockIdx.x;
    for (muon_u64 k = blockIdx.z; k < batch; k += gridDim.z) {
        for (muon_u64 bi = blockIdx.y; bi * MUON_TILE < m; bi += gridDim.y) {
            if (bi < bj) {
                continue;
            }
            const muon_u64 r0 = bi * MUON_TILE;
            const muon_u64 c0 = bj * MUON_TILE;
            for (muon_u32 dy = threadIdx.y; dy < MUON_TILE; dy += blockDim.y) {
                const muon_u64 r = r0 + dy;
                const muon_u64 c = c0 + threadIdx.x;
                if (r < m && c < m) {
                    tile[dy][threadIdx.x] = src[k * size + r * m + c];
                }
            }
            __syncthreads();
            for (muon_u32 dy = threadIdx.y; dy < MUON_TILE; dy += blockDim.y) {
                // The tile itself: (i, j) below the diagonal as staged, above it (a diagonal
                // tile's upper part) mirrored.
                muon_u64 i = r0 + dy;
                muon_u64 j = c0 + threadIdx.x;
                if (i < m && j < m && (dst_bf16 || i < j)) {
                    const float v = i >= j ? tile[dy][threadIdx.x] : tile[threadIdx.x][dy];
                    muon_store(dst, dst_bf16, k * size + i * m + j, v);
                }
                // Its mirror above the diagonal: (i, j) = (c0 + dy, r0 + x) is src[j][i].
                i = c0 + dy;
                j = r0 + threadIdx.x;
                if (bi > bj && i < m && j < m) {
                    muon_store(dst, dst_bf16, k * size + i * m + j, tile[threadIdx.x][dy]);
                }
            }
            __syncthreads();
        }
    }
}

// The pointer lists of the tiled symmetric products of one Newton-Schulz call
// (src/backend/cuda/translate/newton_schulz.rs, TileTables; cublasGemmBatchedEx reads them).
// List l holds three arrays of `entries` device pointers at `at` (cuBLAS's A, B, C in turn);
// entry q is tile p = q mod P of matrix k = q / P, P = rows (rows + 1) / 2 tiles on and below
// the diagonal, row by row: (0, 0), (1, 0), (1, 1), ... Operand o of tile (i, j) of matrix k
// is at base + k * matrix + i * row + j * col (bytes).
#define MUON_TILE_LISTS 12u

struct muon_tile_operand {
    muon_u64 base;
    muon_u64 matrix;
    muon_u64 row;
    muon_u64 col;
};

struct muon_tile_list {
    muon_u64 at;
    muon_tile_operand operand[3];
};

struct muon_tile_lists {
    muon_tile_list list[MUON_TILE_LISTS];
    muon_u32 count;
    muon_u32 rows;
    muon_u64 entries;
};

extern "C" __global__ void muon_gemm_tile_tables(muon_tile_lists lists) {
    const muon_u64 per_matrix = (muon_u64)lists.rows * (lists.rows + 1u) / 2u;
    const muon_u64 n = (muon_u64)lists.count * lists.entries;
    for (muon_u64 e = muon_first_index(); e < n; e += muon_grid_stride()) {
        const muon_u64 l = e / lists.entries;
        const muon_u64 q = e - l * lists.entries;
        const muon_u64 k = q / per_matrix;
        const muon_u64 p = q - k * per_matrix;
        // The tile row is the largest i with i (i + 1) / 2 <= p; the estimate is corrected.
        muon_u64 i = (muon_u64)((sqrt(8.0 * (double)p + 1.0) - 1.0) / 2.0);
        while ((i + 1u) * (i + 2u) / 2u <= p) {
            ++i;
        }
        while (i * (i + 1u) / 2u > p) {
            --i;
        }
        const muon_u64 j = p - i * (i + 1u) / 2u;
        const muon_tile_list list = lists.list[l];
        muon_u64 *out = (muon_u64 *)list.at;
        for (muon_u32 o = 0u; o < 3u; ++o) {
            const muon_tile_operand op = list.operand[o];
            out[o * lists.entries + q] = op.base + k * op.matrix + i * op.row + j * op.col;
        }
    }
}

// `batch` consecutive m x m matrices of src plus a times the identity into dst (dst = src
// allowed): the Gram iteration's Q = Z + a*I (src/numerics/newton_schulz.rs, iterate_gram),
// one f32 addition on the diagonal, every other element copied as it is.
extern "C" __global__ void muon_ns_add_identity(const float *src, float *dst, float a, muon_u32 batch,
                                                muon_u32 m) {
    const muon_u64 size = (muon_u64)m * m;
    const muon_u64 n = size * batch;
    for (muon_u64 e = muon_first_index(); e < n; e += muon_grid_stride()) {
        const muon_u64 within = e % size;
        dst[e] = within / m == within % m ? src[e] + a : src[e];
    }
}

// NorMuon (src/numerics/normuon.rs): the sum of squares of every line of `batch` matrices of
// `lines` lines of n elements each, in f64 (each square exact) added in element order:
// sums[k * lines + l] = sum over i < n of x[k * matrix + l * line_stride + i * element_stride]^2.
// One thread per line (grid-stride over every line of the batch).
extern "C" __global__ void muon_normuon_line_sums(const float *x, double *sums, muon_u32 batch, muon_u32 lines,
                                                  muon_u32 n, muon_u64 matrix, muon_u64 line_stride,
                                                  muon_u64 element_stride, const double *scalars) {
    if (muon_step_skipped(scalars)) {
        return;
    }
    const muon_u64 total = (muon_u64)batch * lines;
    for (muon_u64 e = muon_first_index(); e < total; e += muon_grid_stride()) {
        const muon_u64 k = e / lines;
        const float *line = x + k * matrix + (e - k * lines) * line_stride;
        double s = 0.0;
        for (muon_u32 i = 0u; i < n; ++i) {
            const double v = (double)line[i * element_stride];
            s += v * v;
        }
        sums[e] = s;
    }
}

// NorMuon's second moment and norm ratio of matrix k (one block of 256 threads per matrix,
// blocks striding over the batch), in the host's order: line l of sums[k * lines ..] gives
// mean = f32(s / n), V = beta2 * V + (1 - beta2) * mean, inv = 1 / sqrt(max(V, eps)); thread t
// adds s and inv^2 * s of lines t, t + 256, ... in f64, the lanes are added by a halving tree,
// and ratio[k] = f32(sqrt(sum s)) / max(f32(sqrt(sum inv^2 s)), eps) (stored as f64, exact).
extern "C" __global__ void muon_normuon_moments(const double *sums, float *moment2, double *ratio,
                                                muon_u32 batch, muon_u32 lines, muon_u32 n, float beta2,
                                                float eps, const double *scalars) {
    __shared__ double x_lanes[256];
    __shared__ double y_lanes[256];
    if (muon_step_skipped(scalars)) {
        return;
    }
    const float one_minus_beta2 = 1.0f - beta2;
    for (muon_u64 k = blockIdx.x; k < batch; k += gridDim.x) {
        double xs = 0.0;
        double ys = 0.0;
        for (muon_u64 l = threadIdx.x; l < lines; l += blockDim.x) {
            const double s = sums[k * lines + l];
            const float mean = __double2float_rn(s / (double)n);
            const float v = beta2 * moment2[k * lines + l] + one_minus_beta2 * mean;
            moment2[k * lines + l] = v;
            const double inv = (double)(1.0f / sqrtf(fmaxf(v, eps)));
            xs += s;
            ys += inv * inv * s;
        }
        x_lanes[threadIdx.x] = xs;
        y_lanes[threadIdx.x] = ys;
        __syncthreads();
        for (muon_u32 width = 128u; width > 0u; width >>= 1) {
            if (threadIdx.x < width) {
                x_lanes[threadIdx.x] += x_lanes[threadIdx.x + width];
                y_lanes[threadIdx.x] += y_lanes[threadIdx.x + width];
            }
            __syncthreads();
        }
        if (threadIdx.x == 0u) {
            const float x_norm = __double2float_rn(sqrt(x_lanes[0]));
            const float y_norm = __double2float_rn(sqrt(y_lanes[0]));
            ratio[k] = (double)(x_norm / fmaxf(y_norm, eps));
        }
        __syncthreads();
    }
}

// W = W * decay - step * X for `batch` consecutive rows x cols matrices of w, X read transposed
// (cols x rows) when `transposed` is set (the host's transpose back, then the update), each of
// its stored rows `x_ld` elements apart (cols, or rows when transposed, unless X is a block of
// a wider matrix: this rank's chunk of a gathered tensor-parallel matrix), with
// lr_eff = lr * lr_scale, decay = 1 - lr_eff * (wd * wd_scale), step = lr_eff * scale: the
// host's f32 products, lr and wd read from the step's scalars. With a second moment (`moment2`
// not NULL) X is normalized first, by `moment2_layout`:
// - MUON_MOMENT2_ROWS or MUON_MOMENT2_COLUMNS (NorMuon, src/numerics/normuon.rs): the matrices'
//   second moments, `rows` or `cols` values each, and `ratio` one per matrix, from
//   muon_normuon_moments: x = (x * inv) * ratio with inv = 1 / sqrt(max(V, eps)) of its line;
// - MUON_MOMENT2_ELEMENTS (AdaMuon, src/numerics/adamuon.rs): one value V per element of the
//   matrices (row-major), updated here: V = beta2 * V + (1 - beta2) * (x * x), then
//   x = x / (sqrt(V) + eps); `ratio` is not read.
// With `cautious` (cautious weight decay) an element is decayed only where it and X share a
// sign (muon_cautious_decay).
#define MUON_MOMENT2_COLUMNS 0
#define MUON_MOMENT2_ROWS 1
#define MUON_MOMENT2_ELEMENTS 2
extern "C" __global__ void muon_apply(float *w, const float *x, muon_u32 batch, muon_u32 rows, muon_u32 cols,
                                      int transposed, muon_u32 x_ld, const double *scalars, float lr_scale,
                                      float wd_scale, float scale, float *moment2, int moment2_layout,
                                      const double *ratio, float beta2, float eps, int cautious) {
    __shared__ float tile[MUON_TILE][MUON_TILE + 1];
    if (muon_step_skipped(scalars)) {
        return;
    }
    const float lr_eff = muon_scalar(scalars, MUON_SCALAR_LR) * lr_scale;
    const float wd_eff = muon_scalar(scalars, MUON_SCALAR_WEIGHT_DECAY) * wd_scale;
    const float decay = 1.0f - lr_eff * wd_eff;
    const float step = lr_eff * scale;
    const muon_u64 size = (muon_u64)rows * cols;
    const muon_u64 c0 = (muon_u64)blockIdx.x * MUON_TILE;
    const int per_element = moment2_layout == MUON_MOMENT2_ELEMENTS;
    const muon_u64 values = per_element ? size : (moment2_layout == MUON_MOMENT2_ROWS ? rows : cols);
    for (muon_u64 k = blockIdx.z; k < batch; k += gridDim.z) {
        float *wk = w + k * size;
        const float *xk = x + k * size;
        float *vk = moment2 ? moment2 + k * values : moment2;
        const float ratio_k = moment2 && !per_element ? (float)ratio[k] : 1.0f;
        for (muon_u64 r0 = (muon_u64)blockIdx.y * MUON_TILE; r0 < rows; r0 += (muon_u64)gridDim.y * MUON_TILE) {
            if (transposed) {
                // Tile (c0, r0) of X (cols x rows) staged, so both X and W are read along rows.
                for (muon_u32 dy = threadIdx.y; dy < MUON_TILE; dy += blockDim.y) {
                    const muon_u64 c = c0 + dy;
                    const muon_u64 r = r0 + threadIdx.x;
                    if (r < rows && c < cols) {
                        tile[dy][threadIdx.x] = xk[c * x_ld + r];
                    }
                }
                __syncthreads();
            }
            for (muon_u32 dy = threadIdx.y; dy < MUON_TILE; dy += blockDim.y) {
                const muon_u64 r = r0 + dy;
                const muon_u64 c = c0 + threadIdx.x;
                if (r < rows && c < cols) {
                    float xv = transposed ? tile[threadIdx.x][dy] : xk[r * x_ld + c];
                    if (vk && per_element) {
                        const float v = beta2 * vk[r * cols + c] + (1.0f - beta2) * (xv * xv);
                        vk[r * cols + c] = v;
                        xv = xv / (sqrtf(v) + eps);
                    } else if (vk) {
                        const float inv = 1.0f / sqrtf(fmaxf(vk[moment2_layout == MUON_MOMENT2_ROWS ? r : c], eps));
                        xv = (xv * inv) * ratio_k;
                    }
                    const float wv = wk[r * cols + c];
                    wk[r * cols + c] = wv * muon_cautious_decay(cautious, decay, wv, xv) - step * xv;
                }
            }
            if (transposed) {
                __syncthreads();
            }
        }
    }
}

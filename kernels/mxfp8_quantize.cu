// bf16 -> MXFP8 (E4M3 + E8M0) quantization, rowwise (1x32 blocks) and columnwise (32x1 blocks)
// in one pass over the input; numerics in mxfp8.cuh (docs/mxfp8.md §1, 2, 3 and 10), the
// same as src/numerics/mxfp8 on the host. Compiled by NVRTC without fast-math or flush-to-zero.
//
// Launch: block (32, 8) = 256 threads; grid.x = roundup(cols, 128) / 32,
// grid.y = any value >= 1 (blocks stride over the roundup(rows, 128) / 32 tile rows).
// Every block owns one 32x32 tile: the tile's 32 rowwise scales (rows of the tile, row block
// blockIdx.x) and its 32 columnwise scales (column block of the tile, its 32 columns). Over
// the padded grid that is every byte of both scale tensors exactly once, so the padding is
// written with 0x00 (amax 0) in both layouts and no memset is needed.
//
// Both data outputs are [rows, cols] row-major, like the input. Scales are compact
// ([roundup(rows,128)][roundup(ceil(cols/32),4)] and [roundup(ceil(rows/32),4)][roundup(cols,128)])
// when `swizzled` is 0, else in the cuBLAS swizzled order of the same size.

#include "mxfp8.cuh"

extern "C" __global__ void __launch_bounds__(256)
    muon_mxfp8_quantize_bf16(const unsigned short *__restrict__ in, unsigned int rows, unsigned int cols,
                             unsigned char *__restrict__ row_data, unsigned char *__restrict__ row_scales,
                             unsigned char *__restrict__ col_data, unsigned char *__restrict__ col_scales,
                             int swizzled) {
    // Padded to 33 columns to spread the per-row amax loop (one thread per row) over the banks.
    __shared__ unsigned short tile[32][33];
    __shared__ float row_scale_inv[32];
    __shared__ float col_scale_inv[32];

    const unsigned int tx = threadIdx.x;
    const unsigned int ty = threadIdx.y;
    const unsigned int col_blocks = (cols + 31u) / 32u;
    const unsigned int row_blocks = (rows + 31u) / 32u;
    const unsigned int row_scale_stride = (col_blocks + 3u) / 4u * 4u;
    const unsigned int col_scale_stride = (cols + 127u) / 128u * 128u;
    const unsigned int tiles_y = (row_blocks + 3u) / 4u * 4u;
    const unsigned long long row_ntx = (cols + 127u) / 128u;
    const unsigned long long col_ntx = (rows + 127u) / 128u;
    const unsigned int cb = blockIdx.x;
    const unsigned int col = cb * 32u + tx;
    if (cb >= row_scale_stride) {
        return;
    }

    for (unsigned int rb = blockIdx.y; rb < tiles_y; rb += gridDim.y) {
        const unsigned int row0 = rb * 32u;
        for (unsigned int r = ty; r < 32u; r += 8u) {
            const unsigned int row = row0 + r;
            tile[r][tx] = (row < rows && col < cols) ? in[(unsigned long long)row * cols + col] : (unsigned short)0u;
        }
        __syncthreads();

        if (ty == 0u) {
            // Rowwise scale of tile row tx (out-of-bounds elements were loaded as 0).
            unsigned int key = 0u;
            for (unsigned int k = 0u; k < 32u; ++k) {
                unsigned int e = muon_mx_amax_key_bf16(tile[tx][k]);
                key = e > key ? e : key;
            }
            const unsigned char b = muon_mx_e8m0_from_amax(muon_mx_bits_to_f32(key << 16));
            row_scale_inv[tx] = muon_mx_scale_inv(b);
            const unsigned long long row = row0 + tx;
            const unsigned long long idx =
                swizzled ? muon_mx_swizzled_scale_index(row, cb, row_ntx) : row * row_scale_stride + cb;
            row_scales[idx] = b;
        } else if (ty == 1u) {
            // Columnwise scale of tile column tx.
            unsigned int key = 0u;
            for (unsigned int k = 0u; k < 32u; ++k) {
                unsigned int e = muon_mx_amax_key_bf16(tile[k][tx]);
                key = e > key ? e : key;
            }
            const unsigned char b = muon_mx_e8m0_from_amax(muon_mx_bits_to_f32(key << 16));
            col_scale_inv[tx] = muon_mx_scale_inv(b);
            const unsigned long long idx = swizzled ? muon_mx_swizzled_scale_index(col, rb, col_ntx)
                                                    : (unsigned long long)rb * col_scale_stride + col;
            col_scales[idx] = b;
        }
        __syncthreads();

        if (col < cols) {
            for (unsigned int r = ty; r < 32u; r += 8u) {
                const unsigned int row = row0 + r;
                if (row < rows) {
                    const unsigned short x = tile[r][tx];
                    const unsigned long long at = (unsigned long long)row * cols + col;
                    row_data[at] = muon_mx_encode_bf16(x, row_scale_inv[r]);
                    col_data[at] = muon_mx_encode_bf16(x, col_scale_inv[tx]);
                }
            }
        }
        __syncthreads();
    }
}

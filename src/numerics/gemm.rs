//! The host's matrix products (faer), shared by Newton–Schulz and every test that must
//! reproduce its bits.
//!
//! One call is `C ← α·A·B + β·C` on strided f32 matrices, computed as two passes: `C ← β·C`
//! element by element (skipped when `β = 0`, which overwrites `C` instead), then faer's
//! `C ← C + α·A·B`. With [`Output::SymmetricLower`] (an `m × m` product that is symmetric by
//! construction: `X·Xᵀ`, or `A·A` with `A` symmetric) only the blocks on and below the
//! diagonal are computed, each as such a product of its own (`A`'s rows and `B`'s columns
//! restricted to the block's), and the strict lower triangle is then mirrored into the upper
//! one, so the result is exactly symmetric. The blocks are [`symmetric_blocks`]: the matrix is
//! halved while the halves stay at least a given order (1024 by default,
//! [`DEFAULT_SYMMETRIC_LEAF`]); each halving computes the lower-left quarter of every diagonal
//! block, and the diagonal blocks left are computed whole. At depth `d` that is
//! `1/2 + 1/2^(d+1)` of the full product's flops (5/8 for order 4096). The CUDA backend issues
//! the same block products (a strided-batched GEMM per batch of blocks) and reads only the
//! lower triangle afterwards, so the emulated device reproduces these bits.
//!
//! faer splits the output, never the sum over `k`, between threads: the result does not
//! depend on the number of threads (checked by the same tests). That is what lets dp ranks on
//! one thread each agree bitwise with one rank on every core.

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};

/// The default smallest diagonal block of a symmetric product ([`symmetric_blocks`]): every
/// batch of blocks of a product of order ≥ 2048 then covers a GPU's SMs with 128 × 128 output
/// tiles at least once (order 4096: 256, 2 × 64, 4 × 64 tiles on 132 SMs), so no level runs a
/// mostly idle device; below order 2048 the full product is as fast and nothing is split.
pub const DEFAULT_SYMMETRIC_LEAF: usize = 1024;

/// `count` equal square blocks of a symmetric product's lower part: block `i` is rows
/// `row + i·step .. + size` and columns `col + i·step .. + size` of `C`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockBatch {
    pub count: usize,
    pub size: usize,
    pub row: usize,
    pub col: usize,
    pub step: usize,
}

/// The blocks an [`Output::SymmetricLower`] product of order `m` computes, one batch per
/// level: `m` is halved while it divides evenly and the halves are at least `leaf`; level `l`
/// computes the lower-left `m/2^(l+1)` square of each of
/// the `2^l` diagonal blocks of order `m/2^l`, and the last batch is the diagonal blocks left,
/// whole. Every element on or below the diagonal is in exactly one block.
pub fn symmetric_blocks(m: usize, leaf: usize) -> Vec<BlockBatch> {
    let mut depth = 0;
    while m.is_multiple_of(2 << depth) && m >> (depth + 1) >= leaf.max(1) {
        depth += 1;
    }
    let mut blocks: Vec<BlockBatch> = (0..depth)
        .map(|level| {
            let order = m >> level;
            BlockBatch {
                count: 1 << level,
                size: order / 2,
                row: order / 2,
                col: 0,
                step: order,
            }
        })
        .collect();
    let leaf = m >> depth;
    blocks.push(BlockBatch {
        count: 1 << depth,
        size: leaf,
        row: 0,
        col: 0,
        step: leaf,
    });
    blocks
}

/// Threads one product may use: 1 runs on the calling thread, more split the product over
/// faer's rayon pool (shared by every rank of the process, so ranks never oversubscribe it).
pub fn parallelism(threads: usize) -> Par {
    if threads <= 1 { Par::Seq } else { Par::rayon(threads) }
}

/// What part of `C` a product writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Every element.
    Full,
    /// The blocks on and below the diagonal ([`symmetric_blocks`] with this smallest
    /// block), then the lower triangle mirrored into the upper one; the product must be
    /// symmetric.
    SymmetricLower { leaf: usize },
}

/// A strided matrix view: `rows × cols` elements, element `(i, j)` at
/// `i·row_stride + j·col_stride`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strides {
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
    pub col_stride: usize,
}

impl Strides {
    /// A contiguous row-major `rows × cols` matrix.
    pub fn row_major(rows: usize, cols: usize) -> Strides {
        Strides {
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// A contiguous column-major `rows × cols` matrix with leading dimension `ld`.
    pub fn column_major(rows: usize, cols: usize, ld: usize) -> Strides {
        Strides {
            rows,
            cols,
            row_stride: 1,
            col_stride: ld,
        }
    }

    /// The same memory read as the transposed matrix.
    pub fn transposed(self) -> Strides {
        Strides {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
        }
    }

    /// Elements a slice must hold for every `(i, j)` to be in bounds.
    fn extent(&self) -> usize {
        if self.rows == 0 || self.cols == 0 {
            return 0;
        }
        (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride + 1
    }

    fn view<'a>(&self, data: &'a [f32]) -> MatRef<'a, f32> {
        assert!(
            data.len() >= self.extent(),
            "gemm: operand slice is shorter than its strides address"
        );
        // SAFETY: every addressed element `i·row_stride + j·col_stride` is below `extent()`,
        // which the assert keeps within `data`; the view borrows `data` for its lifetime.
        unsafe {
            MatRef::from_raw_parts(
                data.as_ptr(),
                self.rows,
                self.cols,
                self.row_stride as isize,
                self.col_stride as isize,
            )
        }
    }

    fn view_mut<'a>(&self, data: &'a mut [f32]) -> MatMut<'a, f32> {
        assert!(
            data.len() >= self.extent(),
            "gemm: output slice is shorter than its strides address"
        );
        assert!(
            self.row_stride >= self.cols * self.col_stride || self.col_stride >= self.rows * self.row_stride,
            "gemm: output strides map two elements to one address"
        );
        // SAFETY: in bounds as in `view`; the stride assert makes distinct (i, j) distinct
        // addresses; `data` is borrowed mutably for the view's lifetime.
        unsafe {
            MatMut::from_raw_parts_mut(
                data.as_mut_ptr(),
                self.rows,
                self.cols,
                self.row_stride as isize,
                self.col_stride as isize,
            )
        }
    }
}

/// `C ← α·A·B + β·C` (see the module documentation for the exact passes). `A` is `m × k`,
/// `B` is `k × n`, `C` is `m × n`, each a strided view of its slice.
///
/// # Panics
/// If the dimensions disagree, a slice is shorter than its strides address, the output
/// strides overlap, or `Output::SymmetricLower` is asked of a non-square `C`.
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    alpha: f32,
    a: (&[f32], Strides),
    b: (&[f32], Strides),
    beta: f32,
    c: (&mut [f32], Strides),
    output: Output,
    threads: usize,
) {
    let (a, b, (c_data, c_shape)) = (a.1.view(a.0), b.1.view(b.0), c);
    assert!(
        a.ncols() == b.nrows() && a.nrows() == c_shape.rows && b.ncols() == c_shape.cols,
        "gemm: {}×{} · {}×{} into {}×{}",
        a.nrows(),
        a.ncols(),
        b.nrows(),
        b.ncols(),
        c_shape.rows,
        c_shape.cols
    );
    let mut dst = c_shape.view_mut(c_data);
    let par = parallelism(threads);
    match output {
        Output::Full => product(dst, alpha, a, b, beta, par),
        Output::SymmetricLower { leaf } => {
            assert_eq!(c_shape.rows, c_shape.cols, "gemm: a symmetric output must be square");
            for blocks in symmetric_blocks(c_shape.rows, leaf) {
                for i in 0..blocks.count {
                    let (row, col, size) = (blocks.row + i * blocks.step, blocks.col + i * blocks.step, blocks.size);
                    product(
                        dst.as_mut().submatrix_mut(row, col, size, size),
                        alpha,
                        a.subrows(row, size),
                        b.subcols(col, size),
                        beta,
                        par,
                    );
                }
            }
            mirror_lower(dst);
        }
    }
}

/// `dst ← α·a·b + β·dst`: the β pass (none when `β` is 0 or 1), then faer's product.
fn product(mut dst: MatMut<'_, f32>, alpha: f32, a: MatRef<'_, f32>, b: MatRef<'_, f32>, beta: f32, par: Par) {
    let accum = if beta == 0.0 {
        Accum::Replace
    } else {
        if beta != 1.0 {
            scale(dst.as_mut(), beta);
        }
        Accum::Add
    };
    matmul(dst, accum, a, b, alpha, par);
}

/// `C ← β·C`, walking the unit-stride dimension innermost.
fn scale(mut dst: MatMut<'_, f32>, beta: f32) {
    let (rows, cols) = (dst.nrows(), dst.ncols());
    let (rs, cs) = (dst.row_stride(), dst.col_stride());
    let ptr = dst.as_mut().as_ptr_mut();
    let rows_inner = rs.unsigned_abs() <= cs.unsigned_abs();
    let (outer, inner) = if rows_inner { (cols, rows) } else { (rows, cols) };
    let (outer_stride, inner_stride) = if rows_inner { (cs, rs) } else { (rs, cs) };
    for o in 0..outer {
        for i in 0..inner {
            // SAFETY: (o, i) maps to an element of `dst` (in bounds by its shape and strides),
            // which this function borrows mutably.
            unsafe {
                let v = ptr.offset(o as isize * outer_stride + i as isize * inner_stride);
                *v *= beta;
            }
        }
    }
}

/// Copies the strict lower triangle into the upper one, in tiles.
fn mirror_lower(mut dst: MatMut<'_, f32>) {
    const TILE: usize = 64;
    let n = dst.nrows();
    let (rs, cs) = (dst.row_stride(), dst.col_stride());
    let ptr = dst.as_mut().as_ptr_mut();
    let at = |i: usize, j: usize| i as isize * rs + j as isize * cs;
    for j0 in (0..n).step_by(TILE) {
        for i0 in (j0..n).step_by(TILE) {
            for i in i0..(i0 + TILE).min(n) {
                for j in j0..(j0 + TILE).min(n).min(i) {
                    // SAFETY: (i, j) and (j, i) are elements of the square `dst`, borrowed
                    // mutably here; the strides map them to distinct addresses for i != j.
                    unsafe { *ptr.offset(at(j, i)) = *ptr.offset(at(i, j)) };
                }
            }
        }
    }
}

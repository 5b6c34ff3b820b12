//! The host's matrix products (faer), shared by Newton–Schulz and every test that must
//! reproduce its bits.
//!
//! One call is `C ← α·A·B + β·C` on strided f32 matrices, computed as two passes: `C ← β·C`
//! element by element (skipped when `β = 0`, which overwrites `C` instead), then faer's
//! `C ← C + α·A·B`. With [`Output::SymmetricLower`] (an `m × m` product that is symmetric by
//! construction: `X·Xᵀ`, or `A·A` with `A` symmetric) only the lower triangle is computed,
//! in column panels of equal work (one per thread, each by sequential faer products: its
//! top block's lower triangle by halves down to blocks of `32..64`, the rows below it as one
//! product), and the strict lower triangle is then mirrored into the upper one, so the result
//! is exactly symmetric.
//!
//! A sequential faer product gives every element of its output the same bits whatever rows
//! and columns it is computed with: its sum runs over `k` alone, in blocks of 512 (faer's
//! x86 kernels, `private-gemm-x86` 0.1.22 `kc = min(depth, 512)`), whatever the shape. So
//! the panels' lower triangle has the bits of the CUDA backend's tiles ([`SymmetricTiles`]:
//! one cuBLAS product per `t × t` tile on and below the diagonal and one for the strip of
//! rows past the last whole tile), as the emulated device computes them, one product each;
//! tested for every thread count.
//!
//! faer splits the output of the full products (the shapes Newton–Schulz runs), not their
//! sums, between threads, and every panel of a symmetric product runs on one thread: the
//! result does not depend on the number of threads (checked by the same tests). That is what
//! lets dp ranks on one thread each agree bitwise with one rank on every core.

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};

use crate::numerics::transpose::mirror_lower;

/// The default side of the tiles of a symmetric product ([`SymmetricTiles`]): a GPU GEMM's
/// output tile (128 × 128 on H100, the simulator's `gemm_tile`), so the tiles on and below the
/// diagonal are the output tiles a triangular product runs and no more (order 4096: 528 of
/// the full product's 1024, exactly 4 waves on 132 SMs).
pub const DEFAULT_SYMMETRIC_TILE: usize = 128;

/// The lower part of a symmetric product of order `m` in `size × size` tiles: tile `p` of the
/// `rows·(rows + 1)/2` on and below the diagonal (row by row: `(0, 0), (1, 0), (1, 1), …`) is
/// rows `i·size ..` and columns `j·size ..` of `C`; the rows from `rows·size` to `m` (a
/// remainder smaller than a tile) are one strip over every column. Below two whole tiles a
/// side (`m < 2·size`) nothing is tiled: the strip is the whole product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SymmetricTiles {
    pub rows: usize,
    pub size: usize,
}

impl SymmetricTiles {
    pub fn of(m: usize, size: usize) -> Self {
        let rows = m.checked_div(size).unwrap_or(0);
        SymmetricTiles {
            rows: if rows >= 2 { rows } else { 0 },
            size,
        }
    }

    /// Tiles on and below the diagonal.
    pub fn count(&self) -> usize {
        self.rows * (self.rows + 1) / 2
    }

    /// The (tile row, tile column) of every tile on and below the diagonal, row by row.
    pub fn positions(&self) -> impl Iterator<Item = (usize, usize)> {
        (0..self.rows).flat_map(|i| (0..=i).map(move |j| (i, j)))
    }

    /// The first row of the strip (`m` when there is none).
    pub fn strip_start(&self) -> usize {
        self.rows * self.size
    }
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
    /// The lower triangle, then mirrored into the upper one; the product must be symmetric.
    SymmetricLower,
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
    let dst = c_shape.view_mut(c_data);
    let par = parallelism(threads);
    match output {
        Output::Full => product(dst, alpha, a, b, beta, par),
        Output::SymmetricLower => {
            let m = c_shape.rows;
            assert_eq!(m, c_shape.cols, "gemm: a symmetric output must be square");
            symmetric_lower(dst, alpha, a, b, beta, threads);
            mirror_lower(c_data, m, c_shape.row_stride, c_shape.col_stride);
        }
    }
}

/// The lower triangle of `dst ← α·a·b + β·dst` (see the module documentation) in column
/// panels of equal work, one per worker of `threads`: panel `[c0, c1)` is its `[c0, c1)²`
/// block's lower triangle ([`lower_block`]) and rows `c1..` of its columns (one product), each
/// sequential.
fn symmetric_lower(
    mut dst: MatMut<'_, f32>,
    alpha: f32,
    a: MatRef<'_, f32>,
    b: MatRef<'_, f32>,
    beta: f32,
    threads: usize,
) {
    let accum = prepare(dst.as_mut(), beta);
    let m = dst.nrows();
    let out = SharedOutput {
        ptr: dst.as_ptr_mut(),
        row_stride: dst.row_stride(),
        col_stride: dst.col_stride(),
    };
    let run = |&(c0, c1): &(usize, usize)| {
        let w = c1 - c0;
        // SAFETY: the panels cover disjoint column ranges of `dst`, which is borrowed mutably
        // for this call, and each block lies within `m × m`.
        let (top, below) = unsafe { (out.block(c0, c0, w, w), out.block(c1, c0, m - c1, w)) };
        lower_block(top, accum, a.subrows(c0, w), b.subcols(c0, w), alpha);
        matmul(below, accum, a.subrows(c1, m - c1), b.subcols(c0, w), alpha, Par::Seq);
    };
    let panels = panels(m, threads);
    if panels.len() == 1 {
        return run(&panels[0]);
    }
    rayon::in_place_scope(|scope| {
        for panel in &panels {
            let run = &run;
            scope.spawn(move |_| run(panel));
        }
    });
}

/// Square blocks narrower than this [`lower_block`] computes whole; it splits wider ones into
/// halves of at least 32.
const LEAF: usize = 64;

/// The lower triangle of the square block `dst` (and the upper part of the blocks of
/// `32..64` on its diagonal) by sequential products: halves, the lower-left quarter one
/// product. Every product is at least `32 × 8 × k`, so faer runs each in its blocked kernels
/// (it sends products of at most `16³` multiply-adds, and vectors, to other kernels whose
/// sums may run in another order), and faer's own triangular product, which adds a `β = 1`
/// term in another order than its full products on small blocks, is not used.
fn lower_block(mut dst: MatMut<'_, f32>, accum: Accum, a: MatRef<'_, f32>, b: MatRef<'_, f32>, alpha: f32) {
    let w = dst.nrows();
    if w < LEAF {
        return matmul(dst, accum, a, b, alpha, Par::Seq);
    }
    let h = w / 2 / 16 * 16;
    let (top, _, bottom_left, bottom) = dst.as_mut().split_at_mut(h, h);
    lower_block(top, accum, a.subrows(0, h), b.subcols(0, h), alpha);
    matmul(
        bottom_left,
        accum,
        a.subrows(h, w - h),
        b.subcols(0, h),
        alpha,
        Par::Seq,
    );
    lower_block(bottom, accum, a.subrows(h, w - h), b.subcols(h, w - h), alpha);
}

/// Order of a symmetric product per worker at the least.
const ORDER_PER_WORKER: usize = 64;

/// Column ranges `[c0, c1)` of an order-`m` lower triangle, one per worker (at most
/// `threads`, and one per [`ORDER_PER_WORKER`] of order), of about equal area: the triangle's
/// area left of column `c` is `c·m − c²/2`, so the `k`-th of `p` boundaries is
/// `m·(1 − √(1 − k/p))`, rounded to a multiple of 16 (whole cache lines of f32). The first
/// panel, the narrowest, is about `m/(2p)` ≥ 32 wide, and the rows below the last but one,
/// `m/√p` ≥ 64, so every product is one faer runs in its blocked kernels.
fn panels(m: usize, threads: usize) -> Vec<(usize, usize)> {
    let p = threads.min(m / ORDER_PER_WORKER).max(1);
    let mut bounds: Vec<usize> = (0..=p)
        .map(|k| {
            let c = m as f64 * (1.0 - (1.0 - k as f64 / p as f64).sqrt());
            ((c / 16.0).round() as usize * 16).min(m)
        })
        .collect();
    bounds[p] = m;
    bounds.dedup();
    bounds.windows(2).map(|w| (w[0], w[1])).collect()
}

/// The output of [`symmetric_lower`], shared by its workers, each writing its own blocks.
struct SharedOutput {
    ptr: *mut f32,
    row_stride: isize,
    col_stride: isize,
}

// SAFETY: the workers write disjoint blocks through it (see `symmetric_lower`).
unsafe impl Sync for SharedOutput {}

impl SharedOutput {
    /// # Safety
    /// The block must lie inside the output and no other live view may overlap it.
    unsafe fn block(&self, row: usize, col: usize, rows: usize, cols: usize) -> MatMut<'_, f32> {
        // SAFETY: by the caller's contract.
        unsafe {
            MatMut::from_raw_parts_mut(
                self.ptr
                    .offset(row as isize * self.row_stride + col as isize * self.col_stride),
                rows,
                cols,
                self.row_stride,
                self.col_stride,
            )
        }
    }
}

/// `dst ← α·a·b + β·dst`: the β pass, then faer's product.
fn product(mut dst: MatMut<'_, f32>, alpha: f32, a: MatRef<'_, f32>, b: MatRef<'_, f32>, beta: f32, par: Par) {
    let accum = prepare(dst.as_mut(), beta);
    matmul(dst, accum, a, b, alpha, par);
}

/// The β pass of `dst ← α·a·b + β·dst` (none when `β` is 0 or 1) and how the product then
/// writes `dst`: over it for `β = 0`, added to it otherwise.
fn prepare(dst: MatMut<'_, f32>, beta: f32) -> Accum {
    if beta == 0.0 {
        return Accum::Replace;
    }
    if beta != 1.0 {
        scale(dst, beta);
    }
    Accum::Add
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

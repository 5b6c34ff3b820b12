//! The host's matrix products (faer), shared by Newton–Schulz and every test that must
//! reproduce its bits.
//!
//! One call is `C ← α·A·B + β·C` on strided f32 matrices, computed as two passes: `C ← β·C`
//! element by element (skipped when `β = 0`, which overwrites `C` instead), then faer's
//! `C ← C + α·A·B`. With [`Output::SymmetricLower`] (an `m × m` product that is symmetric by
//! construction: `X·Xᵀ`, or `A·A` with `A` symmetric) only the tiles on and below the
//! diagonal are computed ([`SymmetricTiles`]: `t × t` tiles, 128 by default,
//! [`DEFAULT_SYMMETRIC_TILE`], the rows past the last whole tile as one strip), and the
//! strict lower triangle is then mirrored into the upper one, so the result is exactly
//! symmetric: `(T + 1)/(2T)` of the full product's flops for `T` tiles a side (33/64 at
//! order 4096). The tiles of a column are one product and the strip another, each on one
//! thread (the threads share them); the CUDA backend issues one batched GEMM over the tiles (one cuBLAS product per
//! tile) and one for the strip and reads only the lower triangle afterwards, so the emulated
//! device reproduces these bits.
//!
//! faer splits the output of the full products (the shapes Newton–Schulz runs), not their
//! sums, between threads, and every tile of a symmetric product runs on one thread: the result
//! does not depend on the number of threads (checked by the same tests). That is what lets dp ranks on
//! one thread each agree bitwise with one rank on every core.

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};

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
    /// The tiles on and below the diagonal ([`SymmetricTiles`] of this side), then the lower
    /// triangle mirrored into the upper one; the product must be symmetric.
    SymmetricLower { tile: usize },
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
        Output::SymmetricLower { tile } => {
            let m = c_shape.rows;
            assert_eq!(m, c_shape.cols, "gemm: a symmetric output must be square");
            let tiles = SymmetricTiles::of(m, tile);
            if tiles.rows == 0 {
                product(dst.as_mut(), alpha, a, b, beta, par);
            } else {
                symmetric_lower(dst.as_mut(), alpha, a, b, beta, tiles, threads);
            }
            mirror_lower(dst);
        }
    }
}

/// The tiles and the strip of `tiles` (see [`SymmetricTiles`]; at least two tiles a side). The
/// tiles of one column are one product (rows `j·size` to the strip, columns `j·size ..` of one
/// tile): a sequential faer product gives every element the same bits whatever rows and
/// columns it is computed with (its sums run over `k` alone), so a column's tiles computed
/// together are the tiles computed one by one, as the device runs them (one cuBLAS product per
/// tile), with one packing of the column's panel and the CPU kernel's row blocks filled (128
/// rows are 96 + 32 on AVX-512). Each product runs on one thread: a row of tiles computed as
/// one product on 2 threads gave other bits than on 1 (a 257 × 513 iterate in f32,
/// `result_does_not_depend_on_the_number_of_threads`), one product per thread never does.
/// `threads` workers share the products, the largest first to the least loaded.
fn symmetric_lower(
    dst: MatMut<'_, f32>,
    alpha: f32,
    a: MatRef<'_, f32>,
    b: MatRef<'_, f32>,
    beta: f32,
    tiles: SymmetricTiles,
    threads: usize,
) {
    let (m, size, strip) = (dst.nrows(), tiles.size, tiles.strip_start());
    // (first row, first column, rows, columns) of each product; the strip first.
    let strip = (strip < m).then_some([strip, 0, m - strip, m]);
    let columns = (0..tiles.rows).map(|j| [j * size, j * size, (tiles.rows - j) * size, size]);
    let products: Vec<[usize; 4]> = strip.into_iter().chain(columns).collect();
    let out = SharedOutput {
        ptr: dst.as_ptr_mut(),
        row_stride: dst.row_stride(),
        col_stride: dst.col_stride(),
    };
    let run = |&[row, col, rows, cols]: &[usize; 4]| {
        // SAFETY: the products cover disjoint blocks of `dst`, which is borrowed mutably for
        // this call; each block is inside `dst` (columns of tiles and strip lie within `m × m`).
        let block = unsafe { out.block(row, col, rows, cols) };
        product(block, alpha, a.subrows(row, rows), b.subcols(col, cols), beta, Par::Seq);
    };
    let workers = threads.clamp(1, products.len().max(1));
    if workers == 1 {
        products.iter().for_each(run);
        return;
    }
    let shares = shares(&products, workers);
    rayon::in_place_scope(|scope| {
        for share in &shares {
            let run = &run;
            scope.spawn(move |_| share.iter().for_each(run));
        }
    });
}

/// `products` dealt to `workers`: each, largest first (by elements), to the least loaded.
fn shares(products: &[[usize; 4]], workers: usize) -> Vec<Vec<[usize; 4]>> {
    let mut order: Vec<&[usize; 4]> = products.iter().collect();
    order.sort_by_key(|p| std::cmp::Reverse(p[2] * p[3]));
    let mut shares: Vec<(usize, Vec<[usize; 4]>)> = vec![(0, Vec::new()); workers];
    for p in order {
        let least = shares.iter_mut().min_by_key(|(load, _)| *load).expect("workers >= 1");
        least.0 += p[2] * p[3];
        least.1.push(*p);
    }
    shares.into_iter().map(|(_, share)| share).collect()
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

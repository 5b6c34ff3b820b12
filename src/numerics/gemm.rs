//! The host's matrix products (faer), shared by Newton–Schulz and every test that must
//! reproduce its bits.
//!
//! One call is `C ← α·A·B + β·C` on strided f32 matrices, computed as two passes: `C ← β·C`
//! element by element (skipped when `β = 0`, which overwrites `C` instead), then faer's
//! `C ← C + α·A·B`. With [`Output::SymmetricLower`] only the lower triangle of `C` is
//! computed and then mirrored into the upper one: for a product that is symmetric by
//! construction (`X·Xᵀ`, or `A·A` with `A` symmetric) this halves the flops. The result is
//! exactly symmetric and equals the full product up to the order of summation (faer picks
//! other kernels for small blocks; `tests/numerics_gemm.rs`).
//!
//! faer splits the output, never the sum over `k`, between threads: the result does not
//! depend on the number of threads (checked by the same tests). That is what lets dp ranks on
//! one thread each agree bitwise with one rank on every core.

use faer::linalg::matmul::matmul;
use faer::linalg::matmul::triangular::{BlockStructure, matmul as triangular_matmul};
use faer::{Accum, MatMut, MatRef, Par};

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
    /// The lower triangle, mirrored into the upper one; the product must be symmetric.
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
    let mut dst = c_shape.view_mut(c_data);
    let accum = if beta == 0.0 {
        Accum::Replace
    } else {
        if beta != 1.0 {
            scale(dst.as_mut(), beta, output);
        }
        Accum::Add
    };
    let par = parallelism(threads);
    match output {
        Output::Full => matmul(dst, accum, a, b, alpha, par),
        Output::SymmetricLower => {
            assert_eq!(c_shape.rows, c_shape.cols, "gemm: a symmetric output must be square");
            triangular_matmul(
                dst.as_mut(),
                BlockStructure::TriangularLower,
                accum,
                a,
                BlockStructure::Rectangular,
                b,
                BlockStructure::Rectangular,
                alpha,
                par,
            );
            mirror_lower(dst);
        }
    }
}

/// `C ← β·C` on the elements the product will write (the lower triangle only for a
/// symmetric output), walking the unit-stride dimension innermost.
fn scale(mut dst: MatMut<'_, f32>, beta: f32, output: Output) {
    let lower = output == Output::SymmetricLower;
    let (rows, cols) = (dst.nrows(), dst.ncols());
    let (rs, cs) = (dst.row_stride(), dst.col_stride());
    let ptr = dst.as_mut().as_ptr_mut();
    let rows_inner = rs.unsigned_abs() <= cs.unsigned_abs();
    let (outer, inner) = if rows_inner { (cols, rows) } else { (rows, cols) };
    let (outer_stride, inner_stride) = if rows_inner { (cs, rs) } else { (rs, cs) };
    for o in 0..outer {
        // Lower triangle: i >= j. With rows innermost (o = j) that is i in o..; with columns
        // innermost (o = i) it is j in ..=o.
        let span = match (lower, rows_inner) {
            (false, _) => 0..inner,
            (true, true) => o.min(inner)..inner,
            (true, false) => 0..(o + 1).min(inner),
        };
        for i in span {
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

//! Transpositions of f32 matrices through a small local block.
//!
//! A column of a matrix whose rows are a power of two bytes apart (4 KiB for 1024 f32) maps
//! every element to one cache set, so writing a transposed tile element by element evicts each
//! destination line long before the tile has filled it. Here a `16 × 16` block is read row by
//! row into a local buffer and written row by row from it: every source and destination row of
//! a block is one 64-byte line, read or written whole.

const BLOCK: usize = 16;

/// `dst[j·rows + i] = f(src[i·cols + j])`: row-major `src` (`rows × cols`) into row-major
/// `dst` (`cols × rows`).
///
/// # Panics
/// If a slice is shorter than `rows·cols`.
pub fn transpose_map(src: &[f32], rows: usize, cols: usize, dst: &mut [f32], f: impl Fn(f32) -> f32) {
    let (src, dst) = (&src[..rows * cols], &mut dst[..rows * cols]);
    let mut block = [0.0f32; BLOCK * BLOCK];
    for i0 in (0..rows).step_by(BLOCK) {
        let h = BLOCK.min(rows - i0);
        for j0 in (0..cols).step_by(BLOCK) {
            let w = BLOCK.min(cols - j0);
            for i in 0..h {
                let row = &src[(i0 + i) * cols + j0..][..w];
                for (j, &v) in row.iter().enumerate() {
                    block[j * BLOCK + i] = f(v);
                }
            }
            for j in 0..w {
                dst[(j0 + j) * rows + i0..][..h].copy_from_slice(&block[j * BLOCK..][..h]);
            }
        }
    }
}

/// Copies the strict lower triangle of the `n × n` matrix in `data` (element `(i, j)` at
/// `i·row_stride + j·col_stride`) into its upper triangle: `(j, i) ← (i, j)` for `i > j`.
///
/// # Panics
/// If `data` is shorter than the strides address.
pub fn mirror_lower(data: &mut [f32], n: usize, row_stride: usize, col_stride: usize) {
    let at = |i: usize, j: usize| i * row_stride + j * col_stride;
    let mut block = [0.0f32; BLOCK * BLOCK];
    for i0 in (0..n).step_by(BLOCK) {
        let h = BLOCK.min(n - i0);
        for j0 in (0..=i0).step_by(BLOCK) {
            let w = BLOCK.min(n - j0);
            for i in 0..h {
                for j in 0..w.min(i0 + i - j0) {
                    block[j * BLOCK + i] = data[at(i0 + i, j0 + j)];
                }
            }
            for j in 0..w {
                for i in 0..h {
                    if j0 + j < i0 + i {
                        data[at(j0 + j, i0 + i)] = block[j * BLOCK + i];
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_map_moves_every_element_of_every_shape() {
        for (rows, cols) in [(1, 1), (1, 37), (37, 1), (16, 16), (17, 33), (64, 48), (100, 7)] {
            let src: Vec<f32> = (0..rows * cols).map(|v| v as f32).collect();
            let mut dst = vec![-1.0; rows * cols];
            transpose_map(&src, rows, cols, &mut dst, |v| 2.0 * v);
            for i in 0..rows {
                for j in 0..cols {
                    assert_eq!(
                        dst[j * rows + i],
                        2.0 * src[i * cols + j],
                        "{rows}×{cols} at ({i}, {j})"
                    );
                }
            }
        }
    }

    #[test]
    fn mirror_lower_copies_the_strict_lower_triangle_and_keeps_the_rest() {
        for n in [1, 2, 15, 16, 17, 40] {
            for (row_stride, col_stride, len) in [(n, 1, n * n), (1, n + 3, (n + 3) * n)] {
                let original: Vec<f32> = (0..len).map(|v| v as f32).collect();
                let mut data = original.clone();
                mirror_lower(&mut data, n, row_stride, col_stride);
                let at = |i: usize, j: usize| i * row_stride + j * col_stride;
                for i in 0..n {
                    for j in 0..n {
                        let from = if j > i { at(j, i) } else { at(i, j) };
                        assert_eq!(
                            data[at(i, j)],
                            original[from],
                            "n {n}, strides {row_stride}/{col_stride}, ({i}, {j})"
                        );
                    }
                }
                let touched: std::collections::HashSet<usize> = (0..n)
                    .flat_map(|i| (0..n).map(move |j| (i, j)))
                    .map(|(i, j)| at(i, j))
                    .collect();
                for (k, (&d, &o)) in data.iter().zip(&original).enumerate() {
                    if !touched.contains(&k) {
                        assert_eq!(d, o, "n {n}: padding element {k} changed");
                    }
                }
            }
        }
    }
}

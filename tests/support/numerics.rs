//! Helpers of the `numerics_*` integration tests: an f64 Newton–Schulz reference, matrix
//! products and singular values.

use muon_opt::config::CoefficientSet;
use muon_opt::numerics::newton_schulz::ns_coefficients;

/// Row-major `a (m×k) · b (k×n)` in f64.
pub fn matmul(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            let aip = a[i * k + p];
            for j in 0..n {
                c[i * n + j] += aip * b[p * n + j];
            }
        }
    }
    c
}

/// Row-major transpose of an `rows × cols` matrix.
pub fn transpose<T: Copy>(x: &[T], rows: usize, cols: usize) -> Vec<T> {
    let mut t = Vec::with_capacity(x.len());
    for j in 0..cols {
        for i in 0..rows {
            t.push(x[i * cols + j]);
        }
    }
    t
}

/// The Newton–Schulz iteration of docs/design.md §6 in f64, written independently of the
/// library (only the coefficient table is shared): transpose when rows > cols, normalize by
/// max(‖U‖_F, 1e-7), `steps` quintic steps, transpose back.
pub fn ns_reference_f64(u: &[f64], rows: usize, cols: usize, set: CoefficientSet, steps: usize) -> Vec<f64> {
    ns_reference_f64_eps(u, rows, cols, set, steps, 1e-7)
}

/// [`ns_reference_f64`] with the normalization floor `eps`: `X = U / max(‖U‖_F, eps)`.
pub fn ns_reference_f64_eps(
    u: &[f64],
    rows: usize,
    cols: usize,
    set: CoefficientSet,
    steps: usize,
    eps: f64,
) -> Vec<f64> {
    let transposed = rows > cols;
    let (m, n) = if transposed { (cols, rows) } else { (rows, cols) };
    let mut x = if transposed {
        transpose(u, rows, cols)
    } else {
        u.to_vec()
    };
    let norm = x.iter().map(|v| v * v).sum::<f64>().sqrt().max(eps);
    x.iter_mut().for_each(|v| *v /= norm);
    for step in 0..steps {
        let [a, b, c] = ns_coefficients(set, &[], step).map(f64::from);
        let xt = transpose(&x, m, n);
        let gram = matmul(&x, &xt, m, n, m);
        let gram2 = matmul(&gram, &gram, m, m, m);
        let poly: Vec<f64> = gram.iter().zip(&gram2).map(|(g, g2)| b * g + c * g2).collect();
        let px = matmul(&poly, &x, m, m, n);
        x = x.iter().zip(&px).map(|(xv, pv)| a * xv + pv).collect();
    }
    if transposed { transpose(&x, m, n) } else { x }
}

/// Widens to f64.
pub fn to_f64(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| f64::from(v)).collect()
}

/// Largest |a[i] − b[i]|, NaN if any difference is NaN (so a NaN never passes a bound;
/// `f64::max` would drop it).
pub fn max_abs_diff(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - y).abs())
        .fold(0.0, |largest, d| if d.is_nan() || d > largest { d } else { largest })
}

/// Eigenvalues of a symmetric `n × n` matrix by cyclic Jacobi rotations, ascending.
pub fn symmetric_eigenvalues(mut a: Vec<f64>, n: usize) -> Vec<f64> {
    let scale: f64 = a.iter().map(|v| v * v).sum();
    for _sweep in 0..64 {
        let mut off = 0.0;
        for p in 0..n {
            for q in 0..n {
                if p != q {
                    off += a[p * n + q] * a[p * n + q];
                }
            }
        }
        if off <= 1e-26 * scale {
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                let apq = a[p * n + q];
                if apq == 0.0 {
                    continue;
                }
                let theta = (a[q * n + q] - a[p * n + p]) / (2.0 * apq);
                let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
                let c = 1.0 / (t * t + 1.0).sqrt();
                let s = t * c;
                for k in 0..n {
                    let (akp, akq) = (a[k * n + p], a[k * n + q]);
                    a[k * n + p] = c * akp - s * akq;
                    a[k * n + q] = s * akp + c * akq;
                }
                for k in 0..n {
                    let (apk, aqk) = (a[p * n + k], a[q * n + k]);
                    a[p * n + k] = c * apk - s * aqk;
                    a[q * n + k] = s * apk + c * aqk;
                }
            }
        }
    }
    let mut eig: Vec<f64> = (0..n).map(|i| a[i * n + i]).collect();
    eig.sort_by(f64::total_cmp);
    eig
}

/// Singular values of a row-major `rows × cols` matrix (min(rows, cols) of them), ascending.
pub fn singular_values(x: &[f32], rows: usize, cols: usize) -> Vec<f64> {
    let x = to_f64(x);
    let (x, m, n) = if rows > cols {
        (transpose(&x, rows, cols), cols, rows)
    } else {
        (x, rows, cols)
    };
    let gram = matmul(&x, &transpose(&x, m, n), m, n, m);
    symmetric_eigenvalues(gram, m)
        .into_iter()
        .map(|e| e.max(0.0).sqrt())
        .collect()
}

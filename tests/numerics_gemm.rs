//! The host GEMM (`numerics::gemm`): every stride form against an f64 reference, the `β`
//! passes, symmetric outputs, and the checks that keep a bad call from touching memory.

mod support;

use muon_opt::numerics::gemm::{Output, Strides, gemm};
use support::rng::Rng;

/// `α·A·B + β·C` in f64 from row-major operands.
#[allow(clippy::too_many_arguments)]
fn reference(alpha: f32, a: &[f32], b: &[f32], beta: f32, c: &[f32], m: usize, k: usize, n: usize) -> Vec<f64> {
    (0..m * n)
        .map(|e| {
            let (i, j) = (e / n, e % n);
            let dot: f64 = (0..k).map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j])).sum();
            f64::from(alpha) * dot + f64::from(beta) * f64::from(c[e])
        })
        .collect()
}

fn close(got: &[f32], want: &[f64], what: &str) {
    let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (f64::from(g) - w).abs() <= 1e-5 * scale,
            "{what}: element {i} is {g}, want {w}"
        );
    }
}

/// Row-major, column-major and transposed views of the same operands give the same product,
/// with `β` of 0 (overwrite, even over NaN), 1 and another value.
#[test]
fn every_stride_form_matches_the_f64_reference() {
    let mut rng = Rng::new(7);
    for (m, k, n) in [(1, 1, 1), (5, 3, 7), (33, 17, 9), (64, 130, 48)] {
        let a = rng.normal_vec(m * k, 1.0);
        let b = rng.normal_vec(k * n, 1.0);
        let c0 = rng.normal_vec(m * n, 1.0);
        for (alpha, beta) in [(1.0, 0.0), (0.5, 1.0), (-1.25, 0.75)] {
            let want = reference(alpha, &a, &b, beta, &c0, m, k, n);
            let mut c = c0.clone();
            gemm(
                alpha,
                (&a, Strides::row_major(m, k)),
                (&b, Strides::row_major(k, n)),
                beta,
                (&mut c, Strides::row_major(m, n)),
                Output::Full,
                1,
            );
            close(&c, &want, "row-major");
            let a_cm: Vec<f32> = (0..m * k).map(|e| a[(e % m) * k + e / m]).collect();
            let bt: Vec<f32> = (0..k * n).map(|e| b[(e % k) * n + e / k]).collect();
            let mut c_cm: Vec<f32> = (0..m * n).map(|e| c0[(e % m) * n + e / m]).collect();
            gemm(
                alpha,
                (&a_cm, Strides::column_major(m, k, m)),
                (&bt, Strides::row_major(n, k).transposed()),
                beta,
                (&mut c_cm, Strides::column_major(m, n, m)),
                Output::Full,
                2,
            );
            let back: Vec<f32> = (0..m * n).map(|e| c_cm[(e % n) * m + e / n]).collect();
            close(&back, &want, "column-major");
        }
    }
}

/// `β = 0` overwrites `C` (BLAS semantics): NaN or infinity there does not leak into the result.
#[test]
fn beta_zero_overwrites_nan() {
    let (m, k, n) = (9, 4, 6);
    let mut rng = Rng::new(9);
    let (a, b) = (rng.normal_vec(m * k, 1.0), rng.normal_vec(k * n, 1.0));
    let mut c = vec![f32::NAN; m * n];
    c[1] = f32::INFINITY;
    gemm(
        1.0,
        (&a, Strides::row_major(m, k)),
        (&b, Strides::row_major(k, n)),
        0.0,
        (&mut c, Strides::row_major(m, n)),
        Output::Full,
        1,
    );
    close(&c, &reference(1.0, &a, &b, 0.0, &vec![0.0; m * n], m, k, n), "β = 0");
}

/// `X·Xᵀ` and `b·A + c·A·A` by their lower triangles: exactly symmetric, and the full
/// product's values up to summation order.
#[test]
fn symmetric_outputs_are_exactly_symmetric_and_match_the_full_product() {
    let mut rng = Rng::new(8);
    for (m, n) in [(1, 1), (3, 8), (16, 48), (70, 70), (129, 300)] {
        let x = rng.normal_vec(m * n, 1.0);
        let (wide, square) = (Strides::row_major(m, n), Strides::row_major(m, m));
        let mut gram = vec![0.0f32; m * m];
        gemm(
            1.0,
            (&x, wide),
            (&x, wide.transposed()),
            0.0,
            (&mut gram, square),
            Output::SymmetricLower,
            2,
        );
        let xt: Vec<f32> = (0..n * m).map(|e| x[(e % m) * n + e / m]).collect();
        close(&gram, &reference(1.0, &x, &xt, 0.0, &gram, m, n, m), "X·Xᵀ");
        let mut poly = gram.clone();
        gemm(
            -0.5,
            (&gram, square),
            (&gram, square),
            2.0,
            (&mut poly, square),
            Output::SymmetricLower,
            1,
        );
        close(
            &poly,
            &reference(-0.5, &gram, &gram, 2.0, &gram, m, m, m),
            "b·A + c·A·A",
        );
        for matrix in [&gram, &poly] {
            for i in 0..m {
                for j in 0..i {
                    assert_eq!(matrix[i * m + j].to_bits(), matrix[j * m + i].to_bits(), "({i}, {j})");
                }
            }
        }
    }
}

/// Every element of a symmetric output's lower triangle has the bits of one sequential full
/// product, at every order (whatever blocks the host splits it into), on 1–4 threads, with
/// and without a β term (faer's own triangular product failed this with `β = 1`).
#[test]
fn a_symmetric_output_has_the_bits_of_one_full_product_at_every_order() {
    let mut rng = Rng::new(10);
    for m in (1..=70).chain([95, 128, 129, 161, 200, 257]) {
        let k = m + 3;
        let x = rng.normal_vec(m * k, 1.0);
        let (wide, square) = (Strides::row_major(m, k), Strides::row_major(m, m));
        let c0: Vec<f32> = (0..m * m)
            .map(|e| ((e / m).max(e % m) * 31 + (e / m).min(e % m)) as f32 * 1e-3)
            .collect();
        for (alpha, beta) in [(1.0f32, 0.0f32), (0.75, 1.0), (0.75, -1.5)] {
            let mut gram = c0.clone();
            gemm(
                alpha,
                (&x, wide),
                (&x, wide.transposed()),
                beta,
                (&mut gram, square),
                Output::Full,
                1,
            );
            let mut poly = c0.clone();
            gemm(
                alpha,
                (&gram, square),
                (&gram, square),
                beta,
                (&mut poly, square),
                Output::Full,
                1,
            );
            for threads in 1..=4 {
                let mut got = c0.clone();
                gemm(
                    alpha,
                    (&x, wide),
                    (&x, wide.transposed()),
                    beta,
                    (&mut got, square),
                    Output::SymmetricLower,
                    threads,
                );
                let mut got_poly = c0.clone();
                gemm(
                    alpha,
                    (&gram, square),
                    (&gram, square),
                    beta,
                    (&mut got_poly, square),
                    Output::SymmetricLower,
                    threads,
                );
                for (what, full, got) in [("X·Xᵀ", &gram, &got), ("A·A", &poly, &got_poly)] {
                    for i in 0..m {
                        for j in 0..=i {
                            assert_eq!(
                                got[i * m + j].to_bits(),
                                full[i * m + j].to_bits(),
                                "{what}, order {m}, α {alpha}, β {beta}, {threads} threads: ({i}, {j})"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// The device runs one product per tile (and one for the strip): the host computes the lower
/// triangle in column panels, which must give every tile the bits of its own product, and the
/// strip the bits of one full product, whatever the thread count, with a β term too.
#[test]
fn a_symmetric_output_has_the_bits_of_its_tiles_computed_one_by_one() {
    let mut rng = Rng::new(9);
    for (m, k, tile) in [(454, 300, 128), (70, 33, 16), (256, 1000, 128), (600, 40, 128)] {
        let x = rng.normal_vec(m * k, 1.0);
        let c0 = rng.normal_vec(m * m, 1.0);
        let c0: Vec<f32> = (0..m * m)
            .map(|e| c0[(e / m).max(e % m) * m + (e / m).min(e % m)])
            .collect();
        let (wide, square) = (Strides::row_major(m, k), Strides::row_major(m, m));
        let tiles = m / tile;
        let mut by_tile = c0.clone();
        for j in 0..tiles {
            for i in j..tiles {
                let mut block = vec![0.0f32; tile * tile];
                for r in 0..tile {
                    block[r * tile..(r + 1) * tile].copy_from_slice(&c0[(i * tile + r) * m + j * tile..][..tile]);
                }
                gemm(
                    0.75,
                    (&x[i * tile * k..(i + 1) * tile * k], Strides::row_major(tile, k)),
                    (
                        &x[j * tile * k..(j + 1) * tile * k],
                        Strides::row_major(tile, k).transposed(),
                    ),
                    -1.5,
                    (&mut block, Strides::row_major(tile, tile)),
                    Output::Full,
                    1,
                );
                for r in 0..tile {
                    by_tile[(i * tile + r) * m + j * tile..][..tile].copy_from_slice(&block[r * tile..(r + 1) * tile]);
                }
            }
        }
        let mut full = c0.clone();
        gemm(
            0.75,
            (&x, wide),
            (&x, wide.transposed()),
            -1.5,
            (&mut full, square),
            Output::Full,
            1,
        );
        for threads in [1, 2, 3, 8] {
            let mut got = c0.clone();
            gemm(
                0.75,
                (&x, wide),
                (&x, wide.transposed()),
                -1.5,
                (&mut got, square),
                Output::SymmetricLower,
                threads,
            );
            for i in 0..tiles * tile {
                for j in 0..=i.min(tiles * tile - 1) {
                    if j / tile <= i / tile {
                        assert_eq!(
                            got[i * m + j].to_bits(),
                            by_tile[i * m + j].to_bits(),
                            "m {m}, tile {tile}, {threads} threads: ({i}, {j})"
                        );
                    }
                }
            }
            for i in 0..m {
                for j in 0..=i {
                    assert_eq!(
                        got[i * m + j].to_bits(),
                        full[i * m + j].to_bits(),
                        "m {m}, {threads} threads: ({i}, {j}) against one full product"
                    );
                }
            }
        }
    }
}

#[test]
fn mismatched_dimensions_panic_before_any_write() {
    let (a, b, mut c) = (vec![1.0f32; 6], vec![1.0f32; 4], vec![7.0f32; 4]);
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        gemm(
            1.0,
            (&a, Strides::row_major(2, 3)),
            (&b, Strides::row_major(2, 2)),
            2.0,
            (&mut c, Strides::row_major(2, 2)),
            Output::Full,
            1,
        )
    }))
    .expect_err("mismatched dimensions must panic");
    let message = panic.downcast_ref::<String>().expect("a formatted panic message");
    assert!(message.contains("gemm: 2×3 · 2×2 into 2×2"), "{message}");
    assert_eq!(c, vec![7.0f32; 4], "C was scaled by beta before the check");
}

#[test]
#[should_panic(expected = "shorter than its strides address")]
fn a_short_operand_panics() {
    let (a, b, mut c) = (vec![1.0f32; 5], vec![1.0f32; 6], vec![0.0f32; 4]);
    gemm(
        1.0,
        (&a, Strides::row_major(2, 3)),
        (&b, Strides::row_major(3, 2)),
        0.0,
        (&mut c, Strides::row_major(2, 2)),
        Output::Full,
        1,
    );
}

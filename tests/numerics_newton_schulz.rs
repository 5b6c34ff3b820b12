//! Host Newton–Schulz: golden vectors, orthogonality, precision modes, transposition,
//! batched and split entry points, argument checks.

mod support;

use muon_opt::config::{CoefficientSet, DEFAULT_NS_EPS, DEFAULT_SYMMETRIC_TILE, NsMethod, NsPrecision};
use muon_opt::error::ErrorKind;
use muon_opt::numerics::newton_schulz::{
    CustomCoefficients, GRAM_MIN_ASPECT, NsOptions, NsWorkspace, newton_schulz, newton_schulz_batched,
    newton_schulz_gram, newton_schulz_gram_always, newton_schulz_in_place, newton_schulz_split, ns_coefficients,
};
use support::golden::{NS_BF16_BOUND, read, read_f32, read_f64};
use support::numerics::{max_abs_diff, ns_reference_f64, ns_reference_f64_eps, singular_values, to_f64, transpose};
use support::rng::Rng;

struct GoldenCase {
    rows: usize,
    cols: usize,
    set: CoefficientSet,
    steps: u32,
    input: Vec<f32>,
    output_f64: Vec<f64>,
}

fn golden_cases() -> Vec<GoldenCase> {
    let manifest: serde_json::Value = serde_json::from_slice(&read("manifest.json")).unwrap();
    let cases = manifest["ns"].as_array().unwrap();
    assert!(!cases.is_empty());
    cases
        .iter()
        .map(|c| {
            let rows = c["rows"].as_u64().unwrap() as usize;
            let cols = c["cols"].as_u64().unwrap() as usize;
            let set = CoefficientSet::from_name("coefficients", c["coefficients"].as_str().unwrap()).unwrap();
            let input = read_f32(c["input_f32"].as_str().unwrap());
            let output_f64 = read_f64(c["output_f64"].as_str().unwrap());
            assert_eq!(input.len(), rows * cols);
            assert_eq!(output_f64.len(), rows * cols);
            GoldenCase {
                rows,
                cols,
                set,
                steps: c["steps"].as_u64().unwrap() as u32,
                input,
                output_f64,
            }
        })
        .collect()
}

fn opts(set: CoefficientSet, steps: u32, precision: NsPrecision) -> NsOptions {
    NsOptions {
        coefficients: set,
        custom: CustomCoefficients::NONE,
        steps,
        precision,
        eps: DEFAULT_NS_EPS,
        symmetric_tile: DEFAULT_SYMMETRIC_TILE,
        method: NsMethod::Standard,
    }
}

fn run(input: &[f32], rows: usize, cols: usize, o: &NsOptions) -> Vec<f32> {
    let mut out = vec![0.0; input.len()];
    newton_schulz(input, &mut out, rows, cols, o, &mut NsWorkspace::default()).unwrap();
    out
}

#[test]
fn golden_f32_within_1e5_of_f64_truth() {
    let cases = golden_cases();
    let sets: Vec<_> = cases.iter().map(|c| c.set).collect();
    assert!(sets.contains(&CoefficientSet::Simple) && sets.contains(&CoefficientSet::Quintic));
    let mut ws = NsWorkspace::new(8, 8);
    for case in &cases {
        let o = opts(case.set, case.steps, NsPrecision::F32);
        let mut out = vec![0.0; case.input.len()];
        newton_schulz(&case.input, &mut out, case.rows, case.cols, &o, &mut ws).unwrap();
        let diff = max_abs_diff(&out, &case.output_f64);
        assert!(
            diff <= 1e-5,
            "{}×{} {:?}: max abs diff {diff:e}",
            case.rows,
            case.cols,
            case.set
        );
    }
}

#[test]
fn f64_test_reference_matches_golden() {
    // The f64 reference of support::numerics is what the Muon tests compare against.
    for case in golden_cases() {
        let r = ns_reference_f64(
            &to_f64(&case.input),
            case.rows,
            case.cols,
            case.set,
            case.steps as usize,
        );
        let diff = r
            .iter()
            .zip(&case.output_f64)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        // The golden normalization is ‖U‖ + 1e-7, ours max(‖U‖, 1e-7): a relative difference
        // of 1e-7/‖U‖ in every element.
        assert!(diff <= 1e-6, "{}×{}: {diff:e}", case.rows, case.cols);
    }
}

#[test]
fn golden_bf16_close_to_f64_truth() {
    for case in golden_cases() {
        let out = run(
            &case.input,
            case.rows,
            case.cols,
            &opts(case.set, case.steps, NsPrecision::Bf16),
        );
        let diff = max_abs_diff(&out, &case.output_f64);
        assert!(
            diff <= NS_BF16_BOUND,
            "{}×{} {:?}: {diff:e}",
            case.rows,
            case.cols,
            case.set
        );
    }
}

/// The scalar map the iteration applies to every singular value of the normalized input:
/// `σ ↦ p_T(…p_1(σ))`, `p_t(x) = a x + b x³ + c x⁵`, in f64.
fn scalar_composition(set: CoefficientSet, steps: usize, mut x: f64) -> f64 {
    for t in 0..steps {
        let [a, b, c] = ns_coefficients(set, &[], t).map(f64::from);
        x = a * x + b * x.powi(3) + c * x.powi(5);
    }
    x
}

/// `[min, max]` of [`scalar_composition`] over a log grid of `[lo, 1]`.
fn scalar_band(set: CoefficientSet, steps: usize, lo: f64) -> (f64, f64) {
    (0..=4000)
        .map(|i| lo.powf(1.0 - f64::from(i) / 4000.0))
        .map(|x| scalar_composition(set, steps, x))
        .fold((f64::MAX, f64::MIN), |(l, h), y| (l.min(y), h.max(y)))
}

#[test]
fn polar_express_maps_singular_values_as_designed() {
    let mut rng = Rng::new(7);
    // Rectangular Gaussian matrices: singular values spread over a range inside the design
    // interval [1e-3, 1] of the coefficients once normalized.
    for (rows, cols) in [(64, 128), (96, 48), (40, 120)] {
        let input = rng.normal_vec(rows * cols, 1.0);
        let before = singular_values(&input, rows, cols);
        let norm = before.iter().map(|s| s * s).sum::<f64>().sqrt();
        assert!(before.last().unwrap() / before[0] > 3.0, "input too well conditioned");
        assert!(before[0] / norm > 1e-3, "input outside the design interval");
        for steps in [5, 8] {
            let o = opts(CoefficientSet::PolarExpress, steps, NsPrecision::F32);
            let after = singular_values(&run(&input, rows, cols, &o), rows, cols);
            // NS acts on each singular value separately: sorted outputs equal the sorted
            // images of the normalized input singular values under the scalar composition.
            let mut expected: Vec<f64> = before
                .iter()
                .map(|s| scalar_composition(CoefficientSet::PolarExpress, steps as usize, s / norm))
                .collect();
            expected.sort_by(f64::total_cmp);
            let diff = after
                .iter()
                .zip(&expected)
                .map(|(a, e)| (a - e).abs())
                .fold(0.0, f64::max);
            assert!(diff <= 1e-4, "{rows}×{cols}, {steps} steps: {diff:e}");
            // After 5 steps every singular value is inside the band the composition guarantees
            // on [1e-3, 1] (about [0.85, 1.12]); after 8 it has converged to 1.
            let (lo, hi) = scalar_band(CoefficientSet::PolarExpress, steps as usize, 1e-3);
            let (first, last) = (after[0], *after.last().unwrap());
            assert!(lo > 0.8 && hi < 1.2, "band [{lo}, {hi}]");
            assert!(
                first >= lo - 1e-4 && last <= hi + 1e-4,
                "{steps} steps: [{first}, {last}]"
            );
            if steps == 8 {
                assert!(first >= 0.999 && last <= 1.001, "[{first}, {last}]");
            }
        }
    }
}

#[test]
fn quintic_and_simple_singular_values_in_band() {
    let mut rng = Rng::new(8);
    let (rows, cols) = (64, 128);
    let input = rng.normal_vec(rows * cols, 1.0);
    for set in [CoefficientSet::Quintic, CoefficientSet::Simple] {
        let after = singular_values(&run(&input, rows, cols, &opts(set, 5, NsPrecision::F32)), rows, cols);
        // Jordan's coefficients trade exact convergence for speed: singular values land in a
        // band around 1, about [0.68, 1.13] for the simple triple.
        let (first, last) = (after[0], *after.last().unwrap());
        assert!(first >= 0.6 && last <= 1.2, "{set:?}: [{first}, {last}]");
    }
}

#[test]
fn bf16_close_to_f32() {
    let mut rng = Rng::new(9);
    for (rows, cols) in [(64, 128), (100, 36)] {
        let input = rng.normal_vec(rows * cols, 0.01);
        // The original four sets; tests/ns_coefficient_sets.rs bounds the later ones.
        for set in [
            CoefficientSet::Quintic,
            CoefficientSet::Simple,
            CoefficientSet::PolarExpress,
            CoefficientSet::QuinticCyclic,
        ] {
            let f = run(&input, rows, cols, &opts(set, 5, NsPrecision::F32));
            let b = run(&input, rows, cols, &opts(set, 5, NsPrecision::Bf16));
            let num: f64 = f.iter().zip(&b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
            let den: f64 = f.iter().map(|x| f64::from(*x).powi(2)).sum();
            let rel = (num / den).sqrt();
            // bf16 operands do round (the modes differ) but only at bf16 resolution.
            assert!(rel > 1e-4 && rel < 0.03, "{set:?}: {rel:e}");
        }
    }
}

#[test]
fn tall_matrix_equals_transposed_wide_matrix() {
    let mut rng = Rng::new(10);
    let (rows, cols) = (90, 40);
    let input = rng.normal_vec(rows * cols, 1.0);
    for precision in [NsPrecision::F32, NsPrecision::Bf16] {
        let o = opts(CoefficientSet::Quintic, 5, precision);
        let tall = run(&input, rows, cols, &o);
        let wide = run(&transpose(&input, rows, cols), cols, rows, &o);
        let wide_back = to_f64(&transpose(&wide, cols, rows));
        assert!(max_abs_diff(&tall, &wide_back) <= 1e-6, "{precision:?}");
    }
}

#[test]
fn in_place_equals_out_of_place() {
    let mut rng = Rng::new(11);
    let (rows, cols) = (50, 30);
    let input = rng.normal_vec(rows * cols, 1.0);
    let o = opts(CoefficientSet::Quintic, 5, NsPrecision::Bf16);
    let expected = run(&input, rows, cols, &o);
    let mut data = input.clone();
    newton_schulz_in_place(&mut data, rows, cols, &o, &mut NsWorkspace::default()).unwrap();
    assert_eq!(data, expected);
}

#[test]
fn batched_equals_one_by_one() {
    let mut rng = Rng::new(12);
    let (batch, rows, cols) = (3, 24, 40);
    let input = rng.normal_vec(batch * rows * cols, 1.0);
    let o = opts(CoefficientSet::Simple, 5, NsPrecision::F32);
    let mut out = vec![0.0; input.len()];
    let mut ws = NsWorkspace::new(rows, cols);
    newton_schulz_batched(&input, &mut out, batch, rows, cols, &o, &mut ws).unwrap();
    for (src, got) in input.chunks(rows * cols).zip(out.chunks(rows * cols)) {
        assert_eq!(got, run(src, rows, cols, &o).as_slice());
    }
}

#[test]
fn split_equals_each_component() {
    let mut rng = Rng::new(13);
    let (splits, cols) = ([16usize, 48, 8], 32);
    let rows: usize = splits.iter().sum();
    let input = rng.normal_vec(rows * cols, 1.0);
    let o = opts(CoefficientSet::Quintic, 5, NsPrecision::F32);
    let mut out = vec![0.0; input.len()];
    newton_schulz_split(&input, &mut out, &splits, cols, &o, &mut NsWorkspace::default()).unwrap();
    let mut start = 0;
    for r in splits {
        let range = start..start + r * cols;
        assert_eq!(&out[range.clone()], run(&input[range.clone()], r, cols, &o).as_slice());
        start = range.end;
    }
    // Components are not the whole matrix: orthogonalizing it jointly gives another result.
    assert_ne!(out, run(&input, rows, cols, &o));
}

#[test]
fn reused_workspace_gives_fresh_results() {
    let mut rng = Rng::new(14);
    let big = rng.normal_vec(70 * 90, 1.0);
    let small = rng.normal_vec(20 * 10, 1.0);
    let o = opts(CoefficientSet::PolarExpress, 6, NsPrecision::Bf16);
    let mut ws = NsWorkspace::new(90, 70);
    let mut out_big = vec![0.0; big.len()];
    let mut out_small = vec![0.0; small.len()];
    newton_schulz(&big, &mut out_big, 70, 90, &o, &mut ws).unwrap();
    newton_schulz(&small, &mut out_small, 20, 10, &o, &mut ws).unwrap();
    assert_eq!(out_small, run(&small, 20, 10, &o));
    newton_schulz(&big, &mut out_big, 70, 90, &o, &mut ws).unwrap();
    assert_eq!(out_big, run(&big, 70, 90, &o));
}

#[test]
fn zero_input_gives_zero_output() {
    for precision in [NsPrecision::F32, NsPrecision::Bf16] {
        let out = run(&[0.0; 12], 3, 4, &opts(CoefficientSet::Quintic, 5, precision));
        assert!(out.iter().all(|&v| v == 0.0), "{out:?}");
    }
}

#[test]
fn coefficient_schedules() {
    // Quintic: five distinct triples, then the fifth repeats.
    for t in 0..4 {
        assert_ne!(
            ns_coefficients(CoefficientSet::Quintic, &[], t),
            ns_coefficients(CoefficientSet::Quintic, &[], t + 1)
        );
    }
    for t in 5..12 {
        assert_eq!(
            ns_coefficients(CoefficientSet::Quintic, &[], t),
            ns_coefficients(CoefficientSet::Quintic, &[], 4)
        );
    }
    // Quintic cyclic (Megatron-LM, Emerging-Optimizers): step t uses triple t mod 5, so ten
    // steps are the five-step polynomial applied twice, and up to five steps it is Quintic.
    for t in 0..12 {
        assert_eq!(
            ns_coefficients(CoefficientSet::QuinticCyclic, &[], t),
            ns_coefficients(CoefficientSet::Quintic, &[], t % 5)
        );
    }
    for x in [1e-3, 0.1, 0.5, 0.9, 1.0] {
        let twice = scalar_composition(
            CoefficientSet::Quintic,
            5,
            scalar_composition(CoefficientSet::Quintic, 5, x),
        );
        assert_eq!(scalar_composition(CoefficientSet::QuinticCyclic, 10, x), twice);
        assert_ne!(scalar_composition(CoefficientSet::Quintic, 10, x), twice, "x = {x}");
    }
    // Simple: one triple.
    for t in 1..12 {
        assert_eq!(
            ns_coefficients(CoefficientSet::Simple, &[], t),
            ns_coefficients(CoefficientSet::Simple, &[], 0)
        );
    }
    // Polar Express: the last listed polynomial (eighth, no safety factor) has a fixed point
    // at 1 with zero slope, p(1) = a + b + c = 1, p'(1) = a + 3b + 5c = 0, and repeats.
    let [a, b, c] = ns_coefficients(CoefficientSet::PolarExpress, &[], 7);
    assert_eq!(a + b + c, 1.0);
    assert_eq!(a + 3.0 * b + 5.0 * c, 0.0);
    for t in 8..20 {
        assert_eq!(ns_coefficients(CoefficientSet::PolarExpress, &[], t), [a, b, c]);
    }
    // The eight Polar Express steps, safety factor included, take every singular value in
    // [1e-3, 1] (the design interval) to 1.
    let (lo, hi) = scalar_band(CoefficientSet::PolarExpress, 8, 1e-3);
    assert!((lo - 1.0).abs() < 1e-6 && (hi - 1.0).abs() < 1e-6, "[{lo}, {hi}]");
}

#[test]
fn steps_past_the_table_repeat_the_last_triple() {
    let mut rng = Rng::new(15);
    let input = rng.normal_vec(16 * 24, 1.0);
    let o = opts(CoefficientSet::PolarExpress, 10, NsPrecision::F32);
    let out = run(&input, 16, 24, &o);
    let reference = ns_reference_f64(&to_f64(&input), 16, 24, CoefficientSet::PolarExpress, 10);
    assert!(max_abs_diff(&out, &reference) <= 1e-5);
}

#[test]
fn rejects_bad_arguments() {
    let mut ws = NsWorkspace::default();
    let o = opts(CoefficientSet::Quintic, 5, NsPrecision::F32);
    let input = vec![1.0; 12];
    let mut out = vec![0.0; 12];
    let kind = |r: muon_opt::error::Result<()>| r.unwrap_err().kind;
    assert_eq!(
        kind(newton_schulz(&input, &mut out, 3, 5, &o, &mut ws)),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        kind(newton_schulz(&input, &mut out[..11], 3, 4, &o, &mut ws)),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        kind(newton_schulz(&[], &mut [], 0, 4, &o, &mut ws)),
        ErrorKind::InvalidArgument
    );
    for steps in [0, 101] {
        let bad = NsOptions { steps, ..o };
        assert_eq!(
            kind(newton_schulz(&input, &mut out, 3, 4, &bad, &mut ws)),
            ErrorKind::OutOfRange
        );
    }
    assert_eq!(
        kind(newton_schulz_split(&input, &mut out, &[1, 1], 4, &o, &mut ws)),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        kind(newton_schulz_split(&input, &mut out, &[3, 0], 4, &o, &mut ws)),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        kind(newton_schulz_split(&input, &mut out, &[], 4, &o, &mut ws)),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        kind(newton_schulz_batched(&input, &mut out, 2, 2, 4, &o, &mut ws)),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        kind(newton_schulz_batched(&input, &mut out, 0, 3, 4, &o, &mut ws)),
        ErrorKind::InvalidArgument
    );
    assert!(out.iter().all(|&v| v == 0.0), "output written on error");
}

/// The result is the same bits on 1, 2 or 3 threads, for small, square, wide and tall matrices
/// in both precisions, by the standard and the Gram iteration (the wide and tall ones take it).
/// The host parity suites (dp ranks on one GEMM thread each against one rank on every core)
/// rely on it.
#[test]
fn result_does_not_depend_on_the_number_of_threads() {
    let mut rng = Rng::new(41);
    for (rows, cols) in [(1, 1), (3, 5), (17, 33), (130, 70), (64, 64), (200, 600), (513, 257)] {
        let input: Vec<f32> = (0..rows * cols).map(|_| rng.normal() as f32).collect();
        let runs = [NsPrecision::F32, NsPrecision::Bf16]
            .into_iter()
            .flat_map(|p| [NsMethod::Standard, NsMethod::Gram].map(|method| (p, method)));
        for (precision, method) in runs {
            let o = NsOptions {
                method,
                ..opts(CoefficientSet::Quintic, 5, precision)
            };
            let on = |threads: usize| {
                let mut out = vec![0.0; input.len()];
                let mut ws = NsWorkspace::default().with_threads(threads);
                newton_schulz(&input, &mut out, rows, cols, &o, &mut ws).unwrap();
                out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
            };
            let one = on(1);
            assert!(one.iter().all(|&b| f32::from_bits(b).is_finite()));
            for threads in [2, 3] {
                assert!(
                    on(threads) == one,
                    "{rows}×{cols} {precision:?} {method:?}: {threads} threads differ from 1"
                );
            }
        }
    }
}

/// A workspace sized by need ([`NsWorkspace::for_need`]) gives the bits of a grown one, and an
/// impossible size is an error, not an abort.
#[test]
fn workspace_sized_by_need_matches_and_refuses_impossible_sizes() {
    let mut rng = Rng::new(42);
    let (rows, cols) = (96, 40);
    let input: Vec<f32> = (0..rows * cols).map(|_| rng.normal() as f32).collect();
    let o = opts(CoefficientSet::Quintic, 5, NsPrecision::Bf16);
    let mut ws = NsWorkspace::for_need(rows * cols, cols, NsPrecision::Bf16).unwrap();
    let mut out = vec![0.0; input.len()];
    newton_schulz(&input, &mut out, rows, cols, &o, &mut ws).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    assert!(bits(&out) == bits(&run(&input, rows, cols, &o)));
    let err = NsWorkspace::for_need(usize::MAX / 2, 1 << 20, NsPrecision::F32).unwrap_err();
    assert_eq!(err.kind, ErrorKind::OutOfMemory);
    assert!(err.message.contains("does not fit in host memory"), "{}", err.message);
}

/// Megatron-LM's `medium` scheme written out plainly (Emerging-Optimizers' `newton_schulz`
/// after `X.to(bfloat16)`): every stored matrix rounded to bf16, products summed in f64 here.
fn bf16_iterate_reference(u: &[f32], rows: usize, cols: usize, steps: usize) -> Vec<f64> {
    let bf16 = |v: f64| f64::from(half_round(v as f32));
    let (m, n) = (rows.min(cols), rows.max(cols));
    let u = if rows > cols {
        transpose(u, rows, cols)
    } else {
        u.to_vec()
    };
    let norm = (u.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>().sqrt() as f32).max(1e-7);
    let mut x: Vec<f64> = u.iter().map(|&v| bf16(f64::from(v / norm))).collect();
    for t in 0..steps {
        let [a, b, c] = ns_coefficients(CoefficientSet::QuinticCyclic, &[], t).map(f64::from);
        let xt = transpose(&x, m, n);
        let gram: Vec<f64> = support::numerics::matmul(&x, &xt, m, n, m)
            .into_iter()
            .map(bf16)
            .collect();
        let square = support::numerics::matmul(&gram, &gram, m, m, m);
        let poly: Vec<f64> = gram.iter().zip(&square).map(|(g, s)| bf16(b * g + c * s)).collect();
        let product = support::numerics::matmul(&poly, &x, m, m, n);
        x = x.iter().zip(&product).map(|(x, p)| bf16(a * x + p)).collect();
    }
    if rows > cols { transpose(&x, m, n) } else { x }
}

/// Round to nearest even bf16, as f32.
fn half_round(v: f32) -> f32 {
    let bits = v.to_bits();
    f32::from_bits((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF_0000)
}

#[test]
fn bf16_iterate_stores_every_iterate_in_bf16_like_megatron() {
    let mut rng = Rng::new(17);
    for (rows, cols) in [(24usize, 40usize), (48, 16)] {
        let input = rng.normal_vec(rows * cols, 1.0);
        let o = opts(CoefficientSet::QuinticCyclic, 7, NsPrecision::Bf16Iterate);
        let out = run(&input, rows, cols, &o);
        assert!(
            out.iter().all(|&v| half_round(v) == v),
            "{rows}×{cols}: the result is the last bf16 iterate"
        );
        let reference = bf16_iterate_reference(&input, rows, cols, 7);
        let diff = max_abs_diff(&out, &reference);
        assert!(
            diff <= 4e-3,
            "{rows}×{cols}: {diff:e} from Megatron's scheme (two bf16 ulps)"
        );
        let ours = run(
            &input,
            rows,
            cols,
            &opts(CoefficientSet::QuinticCyclic, 7, NsPrecision::Bf16),
        );
        assert!(ours.iter().any(|&v| half_round(v) != v), "bf16 keeps an f32 iterate");
    }
}

/// The normalization floor (`muon_ns_eps`): `X = U / max(‖U‖, eps)`. For an input of norm
/// ≈ 1e-14, a floor of 1e-15 normalizes it — bit for bit what the default floor does with the
/// input scaled by 2^27 (an exact scaling of U and of its norm) — while the default 1e-7
/// leaves X at norm ≈ 1e-7, which five quintic steps do not bring to an orthogonal matrix.
#[test]
fn the_normalization_floor_is_an_option() {
    let (rows, cols) = (8usize, 16usize);
    let mut rng = Rng::new(77);
    let tiny: Vec<f32> = rng.normal_vec(rows * cols, 1.0).iter().map(|v| v * 1e-15).collect();
    let scaled: Vec<f32> = tiny.iter().map(|v| v * (1u64 << 27) as f32).collect();
    let run = |input: &[f32], eps: f32| {
        let o = NsOptions {
            eps,
            ..opts(CoefficientSet::Quintic, 5, NsPrecision::F32)
        };
        let mut out = vec![0.0f32; rows * cols];
        newton_schulz(input, &mut out, rows, cols, &o, &mut NsWorkspace::default()).unwrap();
        out
    };
    let floor_low = run(&tiny, 1e-15);
    let rescaled = run(&scaled, DEFAULT_NS_EPS);
    assert!(floor_low.iter().zip(&rescaled).all(|(a, b)| a.to_bits() == b.to_bits()));
    let frobenius = |x: &[f32]| x.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt();
    let orthogonal = (rows as f64).sqrt();
    assert!(
        (frobenius(&floor_low) / orthogonal - 1.0).abs() < 0.3,
        "{}",
        frobenius(&floor_low)
    );
    let floor_default = run(&tiny, DEFAULT_NS_EPS);
    assert!(
        frobenius(&floor_default) < 0.1 * orthogonal,
        "{}",
        frobenius(&floor_default)
    );
}

/// Megatron-LM's floor on tiny gradients (norms 1e-6, 1e-9, 1e-12). Megatron-LM calls
/// Emerging-Optimizers' `newton_schulz_tp` without an eps, and pins Emerging-Optimizers v0.3.0,
/// whose `newton_schulz` defaults `eps=1e-7`: our default. Above the floor (1e-6) the input is
/// normalized: the result is bit for bit the one of the floor 1e-15 (Emerging-Optimizers ≥
/// 0.4.0's default). Below it, `X = U / 1e-7` has norm 1e-2 or 1e-5: at 1e-2 five quintic
/// steps still reach the orthogonal norm √rows, on another path (the results differ by more
/// than 1 %), at 1e-5 they leave the update near zero. The floor 1e-15 orthogonalizes all
/// three to the same result up to rounding. Every result is also checked against the f64
/// reference with the same floor.
#[test]
fn tiny_norm_gradients_follow_megatrons_floor() {
    assert_eq!(DEFAULT_NS_EPS.to_bits(), 1e-7f32.to_bits());
    let (rows, cols) = (8usize, 16usize);
    let mut rng = Rng::new(2027);
    let raw = rng.normal_vec(rows * cols, 1.0);
    let raw_norm = raw.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>().sqrt();
    let orthogonal = (rows as f64).sqrt();
    let relative_norm = |x: &[f32]| x.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt() / orthogonal;
    let run = |norm: f64, eps: f32| {
        let input: Vec<f32> = raw.iter().map(|&v| (f64::from(v) * norm / raw_norm) as f32).collect();
        let o = NsOptions {
            eps,
            ..opts(CoefficientSet::Quintic, 5, NsPrecision::F32)
        };
        let mut out = vec![0.0f32; rows * cols];
        newton_schulz(&input, &mut out, rows, cols, &o, &mut NsWorkspace::default()).unwrap();
        let reference = ns_reference_f64_eps(&to_f64(&input), rows, cols, CoefficientSet::Quintic, 5, f64::from(eps));
        let scale = reference.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let diff = max_abs_diff(&out, &reference);
        assert!(
            diff <= 1e-4 * scale,
            "norm {norm:e}, eps {eps:e}: {diff:e} of {scale:e}"
        );
        out
    };
    let largest_difference = |a: &[f32], b: &[f32]| {
        let diff = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        diff / b.iter().fold(0.0f32, |m, v| m.max(v.abs()))
    };
    let low = [1e-6, 1e-9, 1e-12].map(|norm| run(norm, 1e-15));
    for out in &low {
        assert!((0.95..1.05).contains(&relative_norm(out)), "{}", relative_norm(out));
        assert!(largest_difference(out, &low[0]) < 1e-4);
    }
    let above = run(1e-6, DEFAULT_NS_EPS);
    assert!(above.iter().zip(&low[0]).all(|(a, b)| a.to_bits() == b.to_bits()));
    let partly = run(1e-9, DEFAULT_NS_EPS);
    assert!(
        (0.95..1.1).contains(&relative_norm(&partly)),
        "{}",
        relative_norm(&partly)
    );
    assert!(largest_difference(&partly, &low[1]) > 1e-2);
    let held = run(1e-12, DEFAULT_NS_EPS);
    assert!(relative_norm(&held) < 1e-2, "{}", relative_norm(&held));
}

/// The Gram iteration (forced, whatever `gram_applies` says) is the standard one in exact
/// arithmetic: on wide and tall inputs
/// (aspect 3 and 4, 4 tiles a side at order 64), 5 and 8 steps, three coefficient
/// sets, it stays within rounding of the f64 standard iteration: f32 within 5e-6 (the host's
/// standard f32 run: within 1.1e-6), bf16 within 4e-2 and bf16_iterate within 2e-2 (standard:
/// 1.4e-2 and 6.7e-3). Its rounding error is larger than the standard iteration's: up to
/// 2.4× in f32 and 3.1× in bf16 with `polar_express` (whose first coefficients are the
/// largest), 1.5× with `quintic`. Below `GRAM_MIN_ASPECT` (64 × 80) it is the standard
/// iteration, bit for bit.
#[test]
fn gram_newton_schulz_matches_the_standard_iteration() {
    let mut rng = Rng::new(2028);
    for (rows, cols) in [(64usize, 192usize), (256, 64)] {
        let input = rng.normal_vec(rows * cols, 1.0);
        for set in [
            CoefficientSet::Quintic,
            CoefficientSet::PolarExpress,
            CoefficientSet::Simple,
        ] {
            for steps in [5u32, 8] {
                let reference = ns_reference_f64(&to_f64(&input), rows, cols, set, steps as usize);
                for (precision, tolerance) in [
                    (NsPrecision::F32, 5e-6),
                    (NsPrecision::Bf16, 4e-2),
                    (NsPrecision::Bf16Iterate, 2e-2),
                ] {
                    let o = NsOptions {
                        symmetric_tile: 16,
                        ..opts(set, steps, precision)
                    };
                    let mut gram = vec![0.0f32; rows * cols];
                    newton_schulz_gram_always(&input, &mut gram, rows, cols, &o, &mut NsWorkspace::default()).unwrap();
                    let standard = run(&input, rows, cols, &o);
                    let (d_gram, d_standard) = (max_abs_diff(&gram, &reference), max_abs_diff(&standard, &reference));
                    assert!(
                        d_gram <= tolerance,
                        "{rows}×{cols} {set:?} {steps} steps {precision:?}: gram {d_gram:e}, standard {d_standard:e}"
                    );
                }
            }
        }
    }
    let (rows, cols) = (64usize, 80usize);
    assert!((cols as f64) < GRAM_MIN_ASPECT * rows as f64);
    let input = rng.normal_vec(rows * cols, 1.0);
    let o = opts(CoefficientSet::Quintic, 5, NsPrecision::Bf16);
    let mut gram = vec![0.0f32; rows * cols];
    newton_schulz_gram(&input, &mut gram, rows, cols, &o, &mut NsWorkspace::default()).unwrap();
    assert!(bits_equal(&gram, &run(&input, rows, cols, &o)));
}

fn bits_equal(a: &[f32], b: &[f32]) -> bool {
    a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

//! The reductions in front of the step: squared gradient norm, found-inf, clip coefficient.

mod support;

use muon_opt::numerics::adamw::adamw_bias_corrections;
use muon_opt::numerics::{GatheredSums, clip_coefficient, has_non_finite, squared_norm, step_scalars};
use support::rng::Rng;

#[test]
fn squared_norm_matches_naive_f64_sum() {
    let mut rng = Rng::new(51);
    for len in (0..40).chain([1000, 4097]) {
        let x = rng.normal_vec(len, 3.0);
        let naive: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let got = squared_norm(&x);
        assert!((got - naive).abs() <= 1e-13 * naive, "len {len}: {got} vs {naive}");
    }
    assert_eq!(squared_norm(&[]), 0.0);
    // Values whose f32 squares overflow are fine in f64.
    let big = [f32::MAX, -f32::MAX];
    assert_eq!(squared_norm(&big), 2.0 * f64::from(f32::MAX).powi(2));
}

#[test]
fn squared_norm_is_independent_of_position_shifts_only_through_rounding() {
    // The fixed lane order makes the result a function of the data: repeated calls agree
    // bit for bit, and a reversed copy agrees up to f64 rounding.
    let mut rng = Rng::new(52);
    let x = rng.normal_vec(10_001, 1.0);
    let a = squared_norm(&x);
    assert_eq!(a.to_bits(), squared_norm(&x).to_bits());
    let rev: Vec<f32> = x.iter().rev().copied().collect();
    assert!((squared_norm(&rev) - a).abs() <= 1e-12 * a);
}

#[test]
fn non_finite_values_are_found_anywhere() {
    for len in 1..20 {
        let finite = vec![f32::MAX; len];
        assert!(!has_non_finite(&finite));
        for pos in 0..len {
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                let mut x = vec![1.0f32; len];
                x[pos] = bad;
                assert!(has_non_finite(&x), "len {len} pos {pos} {bad}");
            }
        }
    }
    assert!(!has_non_finite(&[]));
    assert!(!has_non_finite(&[f32::MIN_POSITIVE / 4.0, -0.0, f32::MIN]));
}

#[test]
fn clip_coefficient_brings_the_norm_to_the_threshold() {
    let mut rng = Rng::new(53);
    let g = rng.normal_vec(5000, 0.1);
    let sq = squared_norm(&g);
    let norm = sq.sqrt();
    assert!(norm > 1.0);
    // Off, and below the threshold: no scaling.
    assert_eq!(clip_coefficient(sq, 0.0), 1.0);
    assert_eq!(clip_coefficient(sq, (2.0 * norm) as f32), 1.0);
    // Above: the clipped gradient has the threshold's norm (Megatron's +1e-6 aside).
    let clip = 1.0f32;
    let coef = clip_coefficient(sq, clip);
    assert!(coef < 1.0);
    assert_eq!(coef, (1.0 / (norm + 1e-6)) as f32);
    let clipped: Vec<f32> = g.iter().map(|&v| v * coef).collect();
    assert!((squared_norm(&clipped).sqrt() - f64::from(clip)).abs() < 1e-5);
    assert_eq!(clip_coefficient(0.0, 1.0), 1.0);
}

/// The step's scalars: the ranks' sums added in rank order (observable: 1e17 + 1 rounds), the
/// mean's norm over dp², the clip, 1/dp folded into the gradient scale, the step count and the
/// bias corrections at it.
/// One optimizer's sums (a step that shares no clip).
fn alone(rank_sums: &[f64], dp: usize) -> [GatheredSums<'_>; 1] {
    [GatheredSums { rank_sums, dp }]
}

#[test]
fn step_scalars_sum_in_rank_order_and_derive_the_clip_and_step() {
    let s = step_scalars(&alone(&[1e17, 1.0, -1e17, 1.0], 4), 4, 6, 0.0, 0.9, 0.95);
    assert_eq!(
        s.grad_norm,
        (1.0f64 / 16.0).sqrt(),
        "((1e17 + 1) − 1e17) + 1 = 1, over dp² = 16"
    );
    assert_eq!((s.clip_coef, s.grad_scale, s.skipped, s.step), (1.0, 0.25, false, 7));
    assert_eq!((s.bc1, s.bc2), adamw_bias_corrections(0.9, 0.95, 7));

    let clipped = step_scalars(&alone(&[36.0, 64.0], 2), 2, 0, 1.0, 0.9, 0.95);
    let coef = clip_coefficient(100.0 / 4.0, 1.0);
    assert!(coef < 1.0);
    assert_eq!((clipped.clip_coef, clipped.grad_scale), (coef, coef * 0.5));

    let single = step_scalars(&alone(&[4.0], 1), 1, 2, 0.0, 0.9, 0.95);
    assert_eq!((single.grad_norm, single.grad_scale, single.step), (2.0, 1.0, 3));

    // A norm group of 4 ranks over a data-parallel size of 2: the sums of all 4 are added
    // (each rank owns distinct gradients), the mean over dp² = 4.
    let grouped = step_scalars(&alone(&[1.0, 2.0, 3.0, 10.0], 2), 2, 0, 0.0, 0.9, 0.95);
    assert_eq!((grouped.grad_norm, grouped.grad_scale), ((16.0f64 / 4.0).sqrt(), 0.5));
}

/// Optimizers sharing one clip: each term's mean squared norm (its sums over its own dp²), added
/// in the order given; the clip comes from the total, the gradient scale from this optimizer's
/// dp; a non-finite sum in any term skips every optimizer of the set.
#[test]
fn shared_terms_add_each_mean_squared_norm_and_scale_by_the_own_dp() {
    let dense = GatheredSums {
        rank_sums: &[8.0, 8.0, 8.0, 8.0],
        dp: 4,
    };
    let expert = GatheredSums {
        rank_sums: &[6.0, 2.0, 0.0, 0.0],
        dp: 2,
    };
    let total: f64 = 32.0 / 16.0 + 8.0 / 4.0;
    for (own_dp, terms) in [(4, [dense, expert]), (2, [dense, expert])] {
        let s = step_scalars(&terms, own_dp, 0, 1.0, 0.9, 0.95);
        assert_eq!(s.grad_norm, total.sqrt());
        assert_eq!(s.clip_coef, clip_coefficient(total, 1.0));
        assert!(s.clip_coef < 1.0, "the shared norm 2 clips at 1");
        assert_eq!(s.grad_scale, s.clip_coef * (1.0 / own_dp as f32));
    }
    let alone_dense = step_scalars(&[dense], 4, 0, 1.0, 0.9, 0.95);
    assert_ne!(
        alone_dense.clip_coef,
        step_scalars(&[dense, expert], 4, 0, 1.0, 0.9, 0.95).clip_coef
    );
    let inf = GatheredSums {
        rank_sums: &[f64::INFINITY, 0.0],
        dp: 2,
    };
    assert!(step_scalars(&[dense, inf], 4, 0, 1.0, 0.9, 0.95).skipped);
    // The order is part of the result: 1e17 and 1 do not commute under rounding.
    let big = GatheredSums {
        rank_sums: &[1e17],
        dp: 1,
    };
    let one = GatheredSums {
        rank_sums: &[1.0],
        dp: 1,
    };
    let minus = GatheredSums {
        rank_sums: &[-1e17],
        dp: 1,
    };
    assert_eq!(step_scalars(&[big, one, minus], 1, 0, 0.0, 0.9, 0.95).grad_norm, 0.0);
    assert_eq!(step_scalars(&[big, minus, one], 1, 0, 0.0, 0.9, 0.95).grad_norm, 1.0);
}

/// A non-finite sum skips the step: no clip, the step count stays.
#[test]
fn a_non_finite_sum_skips_without_counting_the_step() {
    for sums in [[f64::NAN, 1.0], [f64::INFINITY, 0.0]] {
        let s = step_scalars(&alone(&sums, 2), 2, 4, 1.0, 0.9, 0.95);
        assert!(s.skipped && !s.grad_norm.is_finite());
        assert_eq!((s.clip_coef, s.step), (1.0, 4));
        assert_eq!((s.bc1, s.bc2), adamw_bias_corrections(0.9, 0.95, 4));
    }
}

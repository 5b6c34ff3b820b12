//! The reductions in front of the step: the exact sum of squares of the gradient norm with its
//! found-inf counts, the f64 sums of the Newton–Schulz inputs, the clip coefficient.

mod support;

use muon_opt::numerics::adamw::adamw_bias_corrections;
use muon_opt::numerics::{
    RankNorm, SquareSum, StepsDisagree, clip_coefficient, mean_scale, squared_norm, step_scalars,
};
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

/// The exact sum of `values` (all counted).
fn sum_of(values: &[f32]) -> SquareSum {
    let mut s = SquareSum::default();
    s.add(values, 1.0, true);
    s
}

/// The exact Σ x² of finite `values` whose squares lie within 2^60 of each other and number
/// fewer than 2^16, from a u128 integer: rounded to f64 by Rust's `as` (to nearest, ties to
/// even), then scaled by a power of two (exact).
fn reference(values: &[f32]) -> f64 {
    let parts: Vec<(u128, i32)> = values
        .iter()
        .filter(|v| **v != 0.0)
        .map(|v| {
            let bits = v.to_bits();
            let (e, f) = ((bits >> 23) & 0xff, u128::from(bits & 0x7f_ffff));
            if e == 0 {
                (f * f, -298)
            } else {
                ((f | 1 << 23).pow(2), 2 * e as i32 - 300)
            }
        })
        .collect();
    let Some(low) = parts.iter().map(|p| p.1).min() else {
        return 0.0;
    };
    let total: u128 = parts.iter().map(|(m, e)| m << (e - low)).sum();
    total as f64 * 2f64.powi(low)
}

#[test]
fn the_square_sum_is_exact_and_rounds_once_to_nearest_even() {
    let mut rng = Rng::new(54);
    for len in [1usize, 2, 7, 100, 4097, 70_000] {
        // Random mantissas over 30 binades: the f64 sum of these squares rounds.
        let values: Vec<f32> = (0..len)
            .map(|_| {
                let m = 1.0 + rng.unit_f64() as f32;
                let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
                sign * m * 2f32.powi(rng.below(30) as i32 - 15)
            })
            .collect();
        assert_eq!(
            sum_of(&values).to_f64().to_bits(),
            reference(&values).to_bits(),
            "len {len}"
        );
    }
    // Ties go to even; a bit below the tie breaks it upward.
    let big = 2f32.powi(26); // 2^52 squared
    assert_eq!(
        sum_of(&[big, big, 1.0]).to_f64(),
        2f64.powi(53),
        "2^53 + 1 ties to 2^53"
    );
    assert_eq!(
        sum_of(&[big, big, 1.0, 1.0, 1.0]).to_f64(),
        2f64.powi(53) + 4.0,
        "2^53 + 3"
    );
    let tiny = f32::from_bits(1); // 2^-149, square 2^-298
    assert_eq!(sum_of(&[big, big, 1.0, tiny]).to_f64(), 2f64.powi(53) + 2.0, "sticky");
    // The whole range: the largest and the smallest squares, and many of the largest.
    assert_eq!(sum_of(&[tiny]).to_f64(), 2f64.powi(-298));
    assert_eq!(
        sum_of(&[f32::MAX, -f32::MAX]).to_f64(),
        2.0 * f64::from(f32::MAX).powi(2)
    );
    assert_eq!(sum_of(&[f32::MAX, tiny]).to_f64(), f64::from(f32::MAX).powi(2));
    let many = vec![f32::MAX; 200_000];
    let m = u128::from(f32::MAX.to_bits() & 0x7f_ffff | 1 << 23);
    let exact = (200_000u128 * m * m) as f64 * 2f64.powi(2 * 104);
    assert_eq!(sum_of(&many).to_f64(), exact);
    assert_eq!(sum_of(&[]).to_f64(), 0.0);
    assert_eq!(sum_of(&[0.0, -0.0]).to_f64(), 0.0);
}

/// Any split into parts, in any order, merged: the same bits — where the f64 sum of the same
/// parts, added in another order, differs.
#[test]
fn the_square_sum_is_independent_of_split_and_order() {
    let mut rng = Rng::new(55);
    let values: Vec<f32> = (0..10_000)
        .map(|_| (rng.normal() as f32) * 2f32.powi(rng.below(40) as i32 - 20))
        .collect();
    let whole = sum_of(&values).to_f64();
    let mut f64_sums = std::collections::HashSet::new();
    for parts in [1usize, 2, 3, 5, 7, 64] {
        let mut cuts: Vec<usize> = (1..parts).map(|_| rng.below(values.len() as u64) as usize).collect();
        cuts.sort_unstable();
        let bounds: Vec<usize> = std::iter::once(0).chain(cuts).chain([values.len()]).collect();
        let mut pieces: Vec<&[f32]> = bounds.windows(2).map(|w| &values[w[0]..w[1]]).collect();
        pieces.reverse();
        let mut merged = SquareSum::default();
        for piece in &pieces {
            merged.merge(&sum_of(piece));
        }
        assert_eq!(merged.to_f64().to_bits(), whole.to_bits(), "{parts} parts");
        let round_trip = SquareSum::from_words(merged.words());
        assert_eq!(round_trip, merged);
        f64_sums.insert(pieces.iter().map(|p| squared_norm(p)).sum::<f64>().to_bits());
    }
    assert!(
        f64_sums.len() > 1,
        "the data must be one whose f64 sums depend on the split"
    );
}

/// An infinity among the counted values makes the sum +∞; a NaN anywhere, or an infinity among
/// the values only checked, makes it NaN; checked finite values add nothing.
#[test]
fn non_finite_values_are_counted_wherever_they_are() {
    for len in 1..20 {
        for pos in 0..len {
            for (bad, counted, expected) in [
                (f32::INFINITY, true, f64::INFINITY),
                (f32::NEG_INFINITY, true, f64::INFINITY),
                (f32::NAN, true, f64::NAN),
                (f32::INFINITY, false, f64::NAN),
                (f32::NAN, false, f64::NAN),
            ] {
                let mut x = vec![f32::MAX; len];
                x[pos] = bad;
                let mut s = SquareSum::default();
                s.add(&x, 1.0, counted);
                let got = s.to_f64();
                assert!(
                    got.to_bits() == expected.to_bits() || (got.is_nan() && expected.is_nan()),
                    "len {len} pos {pos} {bad} counted {counted}: {got}"
                );
            }
        }
    }
    let mut checked = sum_of(&[3.0]);
    checked.add(&[f32::MAX, 1e-40, -2.0], 1.0, false);
    assert_eq!(checked.to_f64(), 9.0);
    let mut both = sum_of(&[f32::INFINITY]);
    both.merge(&sum_of(&[f32::NAN]));
    assert!(both.to_f64().is_nan());
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

/// The squares are of `x·scale` rounded to f32, the mean gradient the updates see.
#[test]
fn the_square_sum_squares_the_scaled_values() {
    let mut rng = Rng::new(56);
    let values = rng.normal_vec(5000, 0.1);
    for dp in [1usize, 2, 3, 5, 7] {
        let scale = mean_scale(dp);
        let scaled: Vec<f32> = values.iter().map(|v| v * scale).collect();
        let mut direct = SquareSum::default();
        direct.add(&values, scale, true);
        assert_eq!(direct.to_f64().to_bits(), sum_of(&scaled).to_f64().to_bits(), "dp {dp}");
    }
    assert_eq!((mean_scale(0), mean_scale(1), mean_scale(4)), (1.0, 1.0, 0.25));
}

/// Every rank's part of the norm, all at step 0.
fn r(sums: &[SquareSum]) -> Vec<RankNorm> {
    sums.iter().map(|&sum| RankNorm { sum, steps: 0 }).collect()
}

/// The step's scalars: every rank's sum added exactly (in any rank order), the clip, 1/dp as
/// the gradient scale, the step count and the bias corrections at it.
#[test]
fn step_scalars_add_the_ranks_exactly_and_derive_the_clip_and_step() {
    let half = 2f32.powi(26); // its square is 2^52
    let sums = [sum_of(&[half]), sum_of(&[1.0]), sum_of(&[half]), sum_of(&[1.0])];
    let s = step_scalars(&[&r(&sums)], 4, 6, 0.0, 0.9, 0.95);
    let exact = 2f64.powi(53) + 2.0;
    assert_eq!(s.grad_norm, exact.sqrt(), "2^52 + 1 + 2^52 + 1, exact");
    let in_f64 = ((2f64.powi(52) + 1.0) + 2f64.powi(52)) + 1.0;
    assert_ne!(in_f64, exact, "added in f64 in rank order the sum rounds twice");
    let reversed: Vec<SquareSum> = sums.iter().rev().copied().collect();
    assert_eq!(step_scalars(&[&r(&reversed)], 4, 6, 0.0, 0.9, 0.95), s);
    assert_eq!((s.clip_coef, s.grad_scale, s.skipped, s.step), (1.0, 0.25, false, 7));
    assert_eq!((s.bc1, s.bc2), adamw_bias_corrections(0.9, 0.95, 7));

    let clipped = step_scalars(&[&r(&[sum_of(&[3.0]), sum_of(&[4.0])])], 2, 0, 1.0, 0.9, 0.95);
    let coef = clip_coefficient(25.0, 1.0);
    assert!(coef < 1.0);
    assert_eq!(
        (clipped.grad_norm, clipped.clip_coef, clipped.grad_scale),
        (5.0, coef, 0.5)
    );

    let single = step_scalars(&[&r(&[sum_of(&[2.0])])], 1, 2, 0.0, 0.9, 0.95);
    assert_eq!((single.grad_norm, single.grad_scale, single.step), (2.0, 1.0, 3));
}

/// Optimizers sharing one clip: every sum of every term added exactly, in any order; the clip
/// comes from the total, the gradient scale from this optimizer's dp; a non-finite sum in any
/// term skips every optimizer of the set.
#[test]
fn shared_terms_add_exactly_and_scale_by_the_own_dp() {
    let dense = [sum_of(&[4.0]); 4];
    let expert = [sum_of(&[1.0]), sum_of(&[0.5]), sum_of(&[]), sum_of(&[])];
    let total = 64.0f64 + 1.25;
    for own_dp in [4, 2] {
        let s = step_scalars(&[&r(&dense), &r(&expert)], own_dp, 0, 1.0, 0.9, 0.95);
        assert_eq!(s.grad_norm, total.sqrt());
        assert_eq!(s.clip_coef, clip_coefficient(total, 1.0));
        assert!(s.clip_coef < 1.0);
        assert_eq!(s.grad_scale, 1.0 / own_dp as f32);
        assert_eq!(step_scalars(&[&r(&expert), &r(&dense)], own_dp, 0, 1.0, 0.9, 0.95), s);
    }
    assert_ne!(
        step_scalars(&[&r(&dense)], 4, 0, 1e20, 0.9, 0.95).grad_norm,
        step_scalars(&[&r(&dense), &r(&expert)], 4, 0, 1e20, 0.9, 0.95).grad_norm
    );
    let inf = [sum_of(&[f32::INFINITY]), sum_of(&[])];
    assert!(step_scalars(&[&r(&dense), &r(&inf)], 4, 0, 1.0, 0.9, 0.95).skipped);
}

/// A non-finite sum skips the step: no clip, the step count stays.
#[test]
fn a_non_finite_sum_skips_without_counting_the_step() {
    for bad in [f32::NAN, f32::INFINITY] {
        let sums = [sum_of(&[bad]), sum_of(&[1.0])];
        let s = step_scalars(&[&r(&sums)], 2, 4, 1.0, 0.9, 0.95);
        assert!(s.skipped && !s.grad_norm.is_finite());
        assert_eq!((s.clip_coef, s.step), (1.0, 4));
        assert_eq!((s.bc1, s.bc2), adamw_bias_corrections(0.9, 0.95, 4));
    }
}

/// Ranks at different step counts skip the step and are named: the first rank of a term that
/// differs from its rank 0, with both counts; a term of its own is compared within itself.
#[test]
fn ranks_at_different_step_counts_skip_the_step_and_are_named() {
    let at = |steps: &[u64]| -> Vec<RankNorm> {
        steps
            .iter()
            .map(|&steps| RankNorm {
                sum: sum_of(&[1.0]),
                steps,
            })
            .collect()
    };
    let agree = step_scalars(&[&at(&[3, 3, 3])], 3, 3, 1.0, 0.9, 0.95);
    assert_eq!((agree.skipped, agree.disagree, agree.step), (false, None, 4));
    let s = step_scalars(&[&at(&[3, 3, 1, 0])], 4, 3, 1.0, 0.9, 0.95);
    assert!(s.skipped);
    assert_eq!(s.step, 3, "a skipped step is not counted");
    let named = StepsDisagree {
        term: 0,
        rank: 2,
        steps: 1,
        rank0_steps: 3,
    };
    assert_eq!(s.disagree, Some(named));
    let shared = step_scalars(&[&at(&[5, 5]), &at(&[7, 2])], 2, 5, 1.0, 0.9, 0.95);
    assert_eq!(
        shared.disagree,
        Some(StepsDisagree {
            term: 1,
            rank: 1,
            steps: 2,
            rank0_steps: 7,
        })
    );
    let words = RankNorm {
        sum: sum_of(&[2.0]),
        steps: 41,
    }
    .words();
    assert_eq!(
        RankNorm::from_words(&words),
        RankNorm {
            sum: sum_of(&[2.0]),
            steps: 41
        }
    );
}

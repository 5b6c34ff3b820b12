//! f32 → bf16 round-to-nearest-even against an independent value-based definition, NaN,
//! infinities, subnormals and the slice helpers.

mod support;

use muon_opt::numerics::bf16::{
    bf16_to_f32, cast_bf16_to_f32, cast_f32_to_bf16, f32_to_bf16_rne, round_slice_through_bf16_in_place,
    round_through_bf16, round_through_bf16_and_scale, scale_then_round_through_bf16,
};
use support::rng::Rng;

/// RNE by value: of the two bf16 neighbours of finite `x` (its upper 16 bits, and the next
/// bf16 away from zero), take the nearer in f64; on a tie the one with an even last mantissa
/// bit. One step past the largest finite bf16 is ∞, whose "value" for the distance is 2^128.
fn reference_rne(x: f32) -> u16 {
    assert!(!x.is_nan());
    if x.is_infinite() {
        return (x.to_bits() >> 16) as u16;
    }
    let bits = x.to_bits();
    let down = bits & 0xFFFF_0000;
    let up = down + 0x0001_0000;
    let value = |b: u32| {
        if b & 0x7FFF_FFFF == 0x7F80_0000 {
            2f64.powi(128).copysign(f64::from(x))
        } else {
            f64::from(f32::from_bits(b))
        }
    };
    let x = f64::from(x);
    let (d_down, d_up) = ((x - value(down)).abs(), (value(up) - x).abs());
    let chosen = if d_down < d_up || (d_down == d_up && (down >> 16) & 1 == 0) {
        down
    } else {
        up
    };
    (chosen >> 16) as u16
}

#[test]
fn matches_reference_on_a_sweep_of_all_f32_bit_patterns() {
    let mut bits: u64 = 0;
    let mut checked = 0;
    while bits <= u64::from(u32::MAX) {
        let x = f32::from_bits(bits as u32);
        if !x.is_nan() {
            assert_eq!(f32_to_bf16_rne(x), reference_rne(x), "x = {x:e} ({bits:#010x})");
            checked += 1;
        }
        bits += 3001;
    }
    assert!(checked > 1_000_000);
}

#[test]
fn ties_and_near_ties_around_every_kind_of_value() {
    let mut rng = Rng::new(31);
    for _ in 0..200_000 {
        // A random bf16 (NaN patterns skipped), then the exact midpoint to the next one and
        // the f32 values one ULP either side of it.
        let b = (rng.next_u64() & 0xFFFF) as u32;
        if b & 0x7FFF >= 0x7F80 {
            continue;
        }
        let tie = (b << 16) | 0x8000;
        for t in [tie - 1, tie, tie + 1] {
            let x = f32::from_bits(t);
            assert_eq!(f32_to_bf16_rne(x), reference_rne(x), "{t:#010x}");
        }
        let x = f32::from_bits(tie);
        let got = f32_to_bf16_rne(x);
        assert_eq!(got & 1, 0, "tie {x:e} must round to an even mantissa");
        assert!(got == b as u16 || got == b as u16 + 1);
    }
}

#[test]
fn ties_to_even_near_one() {
    let ulp = 2f32.powi(-7); // bf16 spacing in [1, 2)
    // 1 + ulp/2 is halfway between 1 (even) and 1 + ulp (odd): down to 1.
    assert_eq!(round_through_bf16(1.0 + ulp / 2.0), 1.0);
    // 1 + 3·ulp/2 is halfway between 1 + ulp (odd) and 1 + 2·ulp (even): up.
    assert_eq!(round_through_bf16(1.0 + 1.5 * ulp), 1.0 + 2.0 * ulp);
    // Just above a tie rounds up, just below rounds down.
    let above = f32::from_bits((1.0 + ulp / 2.0f32).to_bits() + 1);
    let below = f32::from_bits((1.0 + ulp / 2.0f32).to_bits() - 1);
    assert_eq!(round_through_bf16(above), 1.0 + ulp);
    assert_eq!(round_through_bf16(below), 1.0);
    assert_eq!(round_through_bf16(-(1.0 + ulp / 2.0)), -1.0);
}

#[test]
fn nan_stays_a_quiet_nan() {
    for bits in [
        0x7FC0_0000u32,
        0x7F80_0001,
        0x7F80_8000,
        0xFF80_0001,
        0xFFFF_FFFF,
        0x7FBF_FFFF,
    ] {
        let h = f32_to_bf16_rne(f32::from_bits(bits));
        assert!(bf16_to_f32(h).is_nan(), "{bits:#010x} -> {h:#06x}");
        assert_ne!(h & 0x0040, 0, "{bits:#010x}: quiet bit");
        assert_eq!(h & 0x8000, ((bits >> 16) & 0x8000) as u16, "{bits:#010x}: sign");
    }
    assert!(round_through_bf16(f32::NAN).is_nan());
    assert!(bf16_to_f32(0x7F81).is_nan());
}

#[test]
fn infinities_and_overflow() {
    assert_eq!(round_through_bf16(f32::INFINITY), f32::INFINITY);
    assert_eq!(round_through_bf16(f32::NEG_INFINITY), f32::NEG_INFINITY);
    let max_bf16 = bf16_to_f32(0x7F7F);
    assert!(max_bf16.is_finite());
    assert!(bf16_to_f32(0x7F80).is_infinite());
    // Half an ULP above the largest bf16 rounds to ∞ (its last mantissa bit is odd).
    let halfway = f32::from_bits(0x7F7F_8000);
    assert_eq!(round_through_bf16(halfway), f32::INFINITY);
    assert_eq!(round_through_bf16(f32::from_bits(0x7F7F_7FFF)), max_bf16);
    assert_eq!(round_through_bf16(f32::MAX), f32::INFINITY);
    assert_eq!(round_through_bf16(-f32::MAX), f32::NEG_INFINITY);
}

#[test]
fn subnormals_round_without_flushing() {
    let min_sub_bf16 = bf16_to_f32(0x0001);
    assert!(min_sub_bf16 > 0.0 && !min_sub_bf16.is_normal());
    assert_eq!(min_sub_bf16, f32::from_bits(0x0001_0000));
    assert_eq!(round_through_bf16(min_sub_bf16), min_sub_bf16);
    // Below half of the smallest bf16 subnormal: ±0 with the sign kept.
    assert_eq!(f32_to_bf16_rne(f32::from_bits(0x0000_7FFF)), 0x0000);
    assert_eq!(f32_to_bf16_rne(f32::from_bits(0x8000_7FFF)), 0x8000);
    // Exactly half: tie to even, i.e. 0. Just above: the smallest subnormal.
    assert_eq!(f32_to_bf16_rne(f32::from_bits(0x0000_8000)), 0x0000);
    assert_eq!(f32_to_bf16_rne(f32::from_bits(0x0000_8001)), 0x0001);
    // Largest bf16 subnormal rounds up into the smallest normal.
    assert_eq!(f32_to_bf16_rne(f32::from_bits(0x007F_C000)), 0x0080);
}

#[test]
fn every_bf16_value_round_trips() {
    for h in 0..=u16::MAX {
        let x = bf16_to_f32(h);
        if x.is_nan() {
            assert!(h & 0x7FFF > 0x7F80);
            continue;
        }
        assert_eq!(x.to_bits(), u32::from(h) << 16, "{h:#06x} widens exactly");
        assert_eq!(f32_to_bf16_rne(x), h);
        assert_eq!(round_through_bf16(x).to_bits(), x.to_bits());
    }
}

#[test]
fn slice_helpers_match_the_scalar_conversion() {
    let mut rng = Rng::new(32);
    let src: Vec<f32> = (0..1000)
        .map(|i| {
            if i % 97 == 0 {
                f32::INFINITY
            } else {
                rng.normal_vec(1, 10.0)[0]
            }
        })
        .collect();
    let mut bits = vec![0u16; src.len()];
    cast_f32_to_bf16(&src, &mut bits);
    let mut back = vec![0.0f32; src.len()];
    cast_bf16_to_f32(&bits, &mut back);
    const FACTOR: f32 = -3.4445;
    let (mut rounded, mut scaled) = (vec![0.0f32; src.len()], vec![0.0f32; src.len()]);
    round_through_bf16_and_scale(&src, &mut rounded, &mut scaled, FACTOR);
    let mut in_place = src.clone();
    round_slice_through_bf16_in_place(&mut in_place);
    let (mut rounded_in_place, mut scaled_first) = (src.clone(), vec![0.0f32; src.len()]);
    scale_then_round_through_bf16(&mut rounded_in_place, &mut scaled_first, FACTOR);
    for i in 0..src.len() {
        assert_eq!(bits[i], f32_to_bf16_rne(src[i]));
        assert_eq!(back[i].to_bits(), bf16_to_f32(bits[i]).to_bits());
        assert_eq!(rounded[i].to_bits(), round_through_bf16(src[i]).to_bits());
        assert_eq!(in_place[i].to_bits(), rounded[i].to_bits());
        assert_eq!(rounded_in_place[i].to_bits(), rounded[i].to_bits());
        assert_eq!(scaled[i].to_bits(), (FACTOR * src[i]).to_bits());
        assert_eq!(scaled_first[i].to_bits(), (FACTOR * src[i]).to_bits());
    }
}

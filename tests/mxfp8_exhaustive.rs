//! Exhaustive and large-sample checks of the scalar MXFP8 primitives against independent
//! references (docs/mxfp8.md §1, §3, §6), and of the swizzled layout as a permutation of the
//! compact one.

mod support;

use muon_opt::numerics::bf16::bf16_to_f32;
use muon_opt::numerics::mxfp8::{
    Direction, E4M3_MAX, E4M3_NAN, Input, MAX_NORM_RCP, ScaleLayout, e4m3_to_f32, e8m0_from_amax, f32_to_e4m3,
    float_to_e8m0, scale, scale_index, scale_inv, scale_shape, swizzled_scale_index,
};
use support::mxfp8::{DIRECTIONS, E4m3Reference, run_single};

/// Scale bytes used with every bf16 input: both ends, the fast-path threshold and its
/// neighbour, common values, the largest finite-amax scale (0xF7) and the specials.
const SCALE_BYTES: [u8; 14] = [0, 1, 10, 11, 100, 117, 119, 127, 134, 200, 247, 252, 253, 254];

#[test]
fn encoder_matches_f64_reference_for_every_bf16_input_and_scale() {
    let r = E4m3Reference::new();
    for b in SCALE_BYTES {
        let s = scale_inv(b);
        let exact = 2f64.powi(127 - i32::from(b));
        for x in 0..=u16::MAX {
            let v = bf16_to_f32(x);
            let got = f32_to_e4m3(v * s);
            let want = r.encode(f64::from(v) * exact);
            assert_eq!(got, want, "bf16 {x:#06x} scale byte {b}");
        }
    }
}

#[test]
fn encoder_matches_f64_reference_on_a_sample_of_all_f32() {
    let r = E4m3Reference::new();
    // Every 257th bit pattern (all exponents, all signs, NaN and inf included) and every
    // pattern around each E4M3 rounding boundary.
    let sample = (0..=u32::MAX).step_by(257);
    let boundaries = (0u8..0x7E).flat_map(|c| {
        let mid = ((r.value(c) + r.value(c + 1)) / 2.0) as f32;
        (-2i32..=2).flat_map(move |d| {
            let m = f32::from_bits(mid.to_bits().wrapping_add_signed(d));
            [m, -m]
        })
    });
    for v in sample.map(f32::from_bits).chain(boundaries) {
        assert_eq!(f32_to_e4m3(v), r.encode(f64::from(v)), "{:#010x}", v.to_bits());
    }
}

#[test]
fn decoder_matches_the_format_definition_and_round_trips() {
    let r = E4m3Reference::new();
    for c in 0..=u8::MAX {
        let v = e4m3_to_f32(c);
        if c & 0x7F == 0x7F {
            assert!(v.is_nan(), "{c:#04x}");
            continue;
        }
        assert_eq!(f64::from(v), r.value(c), "{c:#04x}");
        assert_eq!(v.is_sign_negative(), c & 0x80 != 0);
        assert_eq!(f32_to_e4m3(v), c, "round trip {c:#04x}");
    }
    assert_eq!(e4m3_to_f32(E4M3_MAX), 448.0);
    assert_eq!(f32_to_e4m3(f32::NAN), E4M3_NAN);
    assert_eq!(f32_to_e4m3(-f32::NAN), E4M3_NAN);
    assert_eq!(f32_to_e4m3(f32::INFINITY), 0x7E);
    assert_eq!(f32_to_e4m3(f32::NEG_INFINITY), 0xFE);
    assert_eq!(f32_to_e4m3(480.0), 0x7E, "would round to 480: saturates");
    assert_eq!(f32_to_e4m3(-0.0), 0x80);
}

/// `max(0, be - 8 + (mf > 0x600000))` for a normal amax, 0 for zero or subnormal (docs/mxfp8.md §1).
fn closed_form(amax: f32) -> u8 {
    let bits = amax.to_bits();
    let (be, mf) = ((bits >> 23) as i32, bits & 0x7F_FFFF);
    if be == 0 {
        return 0;
    }
    (be - 8 + i32::from(mf > 0x60_0000)).max(0) as u8
}

/// Whether `b` is the smallest scale byte with `amax <= 448 * 2^(b-127)` (exact arithmetic:
/// both sides are exact in f64).
fn is_smallest_covering_scale(amax: f32, b: u8) -> bool {
    let covers = |b: i32| f64::from(amax) <= 448.0 * 2f64.powi(b - 127);
    let b = i32::from(b);
    covers(b) && (b == 0 || !covers(b - 1))
}

#[test]
fn scale_byte_closed_form_holds_for_every_bf16_amax() {
    for x in 0..=0x7F7Fu16 {
        let amax = bf16_to_f32(x);
        let b = e8m0_from_amax(amax);
        assert_eq!(b, float_to_e8m0(amax * MAX_NORM_RCP));
        assert_eq!(b, closed_form(amax), "bf16 amax {x:#06x}");
        assert!(is_smallest_covering_scale(amax, b), "bf16 amax {x:#06x}");
        assert!(b <= 0xF7, "finite amax gives at most 0xF7");
    }
}

#[test]
fn scale_byte_closed_form_has_one_exception_in_a_large_f32_sample() {
    // Every 499th positive finite f32 (4.3 million) plus the neighbourhoods of 1.75·2^k (where
    // the closed form changes), of the powers of two and of the exception itself.
    let sample = (0..0x7F80_0000u32).step_by(499);
    let edges = (1u32..=254).flat_map(|be| {
        let at = (be << 23) | 0x60_0000;
        (at - 3..=at + 3).chain((be << 23)..=(be << 23) + 2)
    });
    let around = 0x0460_0001u32 - 100..0x0460_0001 + 100;
    let mut mismatches: Vec<u32> = sample
        .chain(edges)
        .chain(around)
        .filter(|&bits| {
            let amax = f32::from_bits(bits);
            let b = e8m0_from_amax(amax);
            b != closed_form(amax) || !is_smallest_covering_scale(amax, b)
        })
        .collect();
    mismatches.dedup();
    assert_eq!(mismatches, [0x0460_0001]);
    // There: amax·(1/448) rounds to exactly 2^-127 (an f32 subnormal), so TE gives 0x00.
    let exception = f32::from_bits(0x0460_0001);
    assert_eq!((exception * MAX_NORM_RCP).to_bits(), 0x0040_0000);
    assert_eq!(e8m0_from_amax(exception), 0x00);
    assert_eq!(closed_form(exception), 0x01);
}

#[test]
fn float_to_e8m0_special_values() {
    assert_eq!(float_to_e8m0(f32::NAN), 0xFF);
    assert_eq!(float_to_e8m0(f32::INFINITY), 0xFE);
    assert_eq!(float_to_e8m0(f32::NEG_INFINITY), 0xFE);
    assert_eq!(float_to_e8m0(0.0), 0x00);
    assert_eq!(float_to_e8m0(-0.0), 0x00);
    assert_eq!(float_to_e8m0(1.0), 0x7F);
    assert_eq!(float_to_e8m0(-1.5), 0x80, "sign ignored, rounded up");
    assert_eq!(float_to_e8m0(f32::from_bits(0x7F00_0001)), 0xFE, "saturates");
    assert_eq!(float_to_e8m0(f32::MAX), 0xFE);
    // Subnormals: up to 2^-127 give 0, above give 1.
    assert_eq!(float_to_e8m0(f32::from_bits(0x0040_0000)), 0x00);
    assert_eq!(float_to_e8m0(f32::from_bits(0x0000_0001)), 0x00);
    assert_eq!(float_to_e8m0(f32::from_bits(0x0040_0001)), 0x01);
    assert_eq!(float_to_e8m0(f32::from_bits(0x007F_FFFF)), 0x01);
    assert_eq!(MAX_NORM_RCP.to_bits(), 0x3B12_4925);
    assert_eq!(448.0 * MAX_NORM_RCP, 1.0);
}

#[test]
fn scale_and_inverse_scale_bytes() {
    assert_eq!(scale_inv(255).to_bits(), 0x7FFF_FFFF);
    assert_eq!(scale_inv(254).to_bits(), 0x0040_0000);
    assert_eq!(scale_inv(0), 2f32.powi(127));
    assert_eq!(scale(255).to_bits(), 0x7FFF_FFFF);
    assert_eq!(scale(0).to_bits(), 0x0040_0000);
    assert_eq!(scale(254), 2f32.powi(127));
    for b in 1..=253u8 {
        assert_eq!(scale(b), 2f32.powi(i32::from(b) - 127));
        assert_eq!(scale(b) * scale_inv(b), 1.0, "{b}");
    }
    // TE test_mxfp8_dequantize_extreme_scales: code 0x38 (1.0) with scale byte 0 is 2^-127.
    assert_eq!(scale(0) * e4m3_to_f32(0x38), f32::from_bits(0x0040_0000));
}

#[test]
fn no_finite_bf16_element_saturates_or_encodes_as_nan() {
    // Each finite bf16 value as the amax of its own block: the scaled value is at most 448
    // (code 0x7E only for exactly 448, or the next values that round to it).
    for x in 0..=u16::MAX {
        let v = bf16_to_f32(x);
        if !v.is_finite() {
            continue;
        }
        let b = e8m0_from_amax(v.abs());
        let scaled = f64::from(v.abs()) * 2f64.powi(127 - i32::from(b));
        assert!(scaled <= 448.0, "{x:#06x}");
        let code = f32_to_e4m3(v * scale_inv(b));
        assert_ne!(code & 0x7F, 0x7F, "{x:#06x}");
    }
}

/// The permutation PyTorch's test helpers apply to a padded compact scale tensor
/// (`tests/pytorch/mxfp8/mxfp8_utils.py`, docs/mxfp8.md §3): the destination of compact entry
/// `(r, c)` in the swizzled buffer.
fn pytorch_swizzle(rows: usize, cols: usize, direction: Direction, r: usize, c: usize) -> usize {
    let (m, n) = scale_shape(rows, cols, direction);
    match direction {
        // view(M/128, 4, 32, N/4, 4).permute(0, 3, 2, 1, 4)
        Direction::Rowwise => {
            let (a, b, cc, d, e) = (r / 128, (r % 128) / 32, r % 32, c / 4, c % 4);
            (((a * (n / 4) + d) * 32 + cc) * 4 + b) * 4 + e
        }
        // view(M/4, 4, N/128, 4, 32).permute(2, 0, 4, 3, 1) on the [rows/32, cols] tensor
        Direction::Colwise => {
            let (a, b, d, e, f) = (r / 4, r % 4, c / 128, (c % 128) / 32, c % 32);
            (((d * (m / 4) + a) * 32 + f) * 4 + e) * 4 + b
        }
    }
}

#[test]
fn swizzled_index_is_a_bijection_and_matches_the_pytorch_permutation() {
    for (rows, cols) in [(1, 1), (128, 128), (130, 300), (993, 48), (256, 1000)] {
        for direction in DIRECTIONS {
            let (m, n) = scale_shape(rows, cols, direction);
            let mut seen = vec![false; m * n];
            for r in 0..m {
                for c in 0..n {
                    let s = scale_index(rows, cols, direction, ScaleLayout::Swizzled, r, c);
                    assert!(!seen[s], "{rows}x{cols} {direction:?} ({r},{c}) twice");
                    seen[s] = true;
                    assert_eq!(s, pytorch_swizzle(rows, cols, direction, r, c));
                    assert_eq!(
                        scale_index(rows, cols, direction, ScaleLayout::Compact, r, c),
                        r * n + c
                    );
                }
            }
            assert!(seen.iter().all(|&s| s));
        }
    }
    assert_eq!(swizzled_scale_index(33, 5, 2), 533);
}

#[test]
fn swizzled_scales_are_a_permutation_of_compact_scales_with_zero_padding() {
    let (rows, cols) = (161, 290);
    let x: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 1013) as f32 * 0.37 - 150.0)
        .collect();
    for direction in DIRECTIONS {
        let compact = run_single(Input::F32(&x), rows, cols, direction, ScaleLayout::Compact);
        let swizzled = run_single(Input::F32(&x), rows, cols, direction, ScaleLayout::Swizzled);
        assert_eq!(compact.data, swizzled.data);
        let (m, n) = scale_shape(rows, cols, direction);
        let (vr, vc) = match direction {
            Direction::Rowwise => (rows, cols.div_ceil(32)),
            Direction::Colwise => (rows.div_ceil(32), cols),
        };
        for r in 0..m {
            for c in 0..n {
                let from = compact.scales[r * n + c];
                let to = swizzled.scales[scale_index(rows, cols, direction, ScaleLayout::Swizzled, r, c)];
                assert_eq!(from, to, "{direction:?} ({r},{c})");
                let valid = r < vr && c < vc;
                assert_eq!(
                    from != 0,
                    valid,
                    "{direction:?} ({r},{c}): valid scales are non-zero here"
                );
            }
        }
    }
}

//! The optimized host quantizer (fused strips, fast path, SIMD dispatch) against the naive
//! reference of docs/mxfp8.md §10 on many shapes and value mixes, plus argument checking and
//! dequantization.

mod support;

use muon_opt::error::ErrorKind;
use muon_opt::numerics::bf16::bf16_to_f32;
use muon_opt::numerics::mxfp8::{
    Direction, Input, Output, QuantizedMut, ScaleLayout, dequantize_colwise, dequantize_rowwise, e4m3_to_f32, quantize,
    quantize_rowwise, scale, scale_index, scale_shape,
};
use support::mxfp8::{DIRECTIONS, LAYOUTS, Quantized, reference_quantize, run_both, run_single};
use support::rng::Rng;

/// Value mixes. Each returns bf16 bits; the f32 input is their exact upcast.
#[derive(Debug, Clone, Copy)]
enum Mix {
    /// Random signs, exponents within 2^±8 around a random block centre: typical data.
    Normal,
    /// Every bf16 bit pattern with equal probability (NaN, ±inf, subnormals, huge, tiny).
    AnyBits,
    /// Tiny magnitudes (around the bf16 subnormal range), so that scales fall below the
    /// fast-path threshold, with some zeros.
    Tiny,
    /// Normal data with rare NaN, ±inf, ±0 and subnormal elements.
    Sprinkled,
}

fn make(mix: Mix, n: usize, rng: &mut Rng) -> Vec<u16> {
    let centre = 100 + rng.below(60) as u16;
    (0..n)
        .map(|_| {
            let r = rng.next_u64();
            let sign = ((r >> 40) as u16) & 0x8000;
            let mant = (r >> 20) as u16 & 0x7F;
            let normal = |rng: &mut Rng| {
                let e = centre + rng.below(17) as u16 - 8;
                sign | (e << 7) | mant
            };
            match mix {
                Mix::Normal => normal(rng),
                Mix::AnyBits => (r >> 8) as u16,
                Mix::Tiny => match r % 4 {
                    0 => sign,
                    1 => sign | mant,
                    _ => sign | ((1 + rng.below(12) as u16) << 7) | mant,
                },
                Mix::Sprinkled => match r % 64 {
                    0 => sign | 0x7FC1,
                    1 => sign | 0x7F80,
                    2 => sign,
                    3 => sign | mant,
                    _ => normal(rng),
                },
            }
        })
        .collect()
}

/// Shapes covering partial blocks in both directions, partial scale tiles (not multiples of
/// 128), rows of more than 32 blocks (the rowwise amax reduces 32 blocks at a time), and rows
/// longer than the quantizer's 2048-column chunks.
const SHAPES: [(usize, usize); 15] = [
    (1, 1),
    (1, 16),
    (1, 32),
    (2, 33),
    (32, 32),
    (33, 48),
    (31, 257),
    (64, 256),
    (65, 300),
    (129, 513),
    (300, 40),
    (97, 1000),
    (40, 1056),
    (3, 2100),
    (33, 4160),
];

#[test]
fn library_matches_naive_reference_on_all_shapes_and_mixes() {
    let mut rng = Rng::new(0x1234_5678_9ABC_DEF1);
    for (rows, cols) in SHAPES {
        for mix in [Mix::Normal, Mix::AnyBits, Mix::Tiny, Mix::Sprinkled] {
            let bits = make(mix, rows * cols, &mut rng);
            let values: Vec<f32> = bits.iter().map(|&b| bf16_to_f32(b)).collect();
            for layout in LAYOUTS {
                let expected: Vec<Quantized> = DIRECTIONS
                    .iter()
                    .map(|&d| reference_quantize(&values, rows, cols, d, layout))
                    .collect();
                for input in [Input::Bf16(&bits), Input::F32(&values)] {
                    let ctx = format!("{rows}x{cols} {mix:?} {layout:?} {input:?}");
                    let (row, col) = run_both(input, rows, cols, layout);
                    assert_eq!(row, expected[0], "fused rowwise {ctx}");
                    assert_eq!(col, expected[1], "fused colwise {ctx}");
                    for (d, e) in DIRECTIONS.iter().zip(&expected) {
                        let single = run_single(input, rows, cols, *d, layout);
                        assert_eq!(&single, e, "single {d:?} {ctx}");
                    }
                }
            }
        }
    }
}

#[test]
fn f32_inputs_that_are_not_bf16_match_reference() {
    let mut rng = Rng::new(0xDEAD_BEEF_0BAD_CAFE);
    let (rows, cols) = (67, 290);
    for spread in [4u32, 30, 120] {
        let values: Vec<f32> = (0..rows * cols)
            .map(|_| {
                let r = rng.next_u64();
                let e = 127 - spread / 2 + (r as u32 % spread);
                f32::from_bits(((r >> 32) as u32 & 0x8000_0000) | (e << 23) | (r >> 40) as u32 & 0x7F_FFFF)
            })
            .collect();
        for layout in LAYOUTS {
            let (row, col) = run_both(Input::F32(&values), rows, cols, layout);
            assert_eq!(row, reference_quantize(&values, rows, cols, Direction::Rowwise, layout));
            assert_eq!(col, reference_quantize(&values, rows, cols, Direction::Colwise, layout));
        }
    }
}

#[test]
fn empty_tensors_are_accepted() {
    for (rows, cols) in [(0, 0), (0, 64), (5, 0)] {
        for d in DIRECTIONS {
            assert_eq!(scale_shape(rows, cols, d).0 * scale_shape(rows, cols, d).1, 0);
            let c = run_single(Input::F32(&[]), rows, cols, d, ScaleLayout::Compact);
            assert!(c.data.is_empty() && c.scales.is_empty());
        }
    }
}

#[test]
fn wrong_buffer_lengths_are_invalid_arguments_and_write_nothing() {
    let x = vec![1.0f32; 40 * 64];
    let (sr, sc) = scale_shape(40, 64, Direction::Rowwise);
    let cases: [(usize, usize, usize, &str); 4] = [
        (40 * 64 - 1, 40 * 64, sr * sc, "input"),
        (40 * 64, 40 * 64 + 1, sr * sc, "rowwise data"),
        (40 * 64, 40 * 64, sr * sc - 1, "rowwise scales"),
        (40 * 64, 40 * 64, 40 * 2, "rowwise scales"),
    ];
    for (n_in, n_data, n_scales, name) in cases {
        let mut data = vec![7u8; n_data];
        let mut scales = vec![7u8; n_scales];
        let err = quantize_rowwise(
            Input::F32(&x[..n_in]),
            40,
            64,
            ScaleLayout::Compact,
            &mut data,
            &mut scales,
        )
        .expect_err("length mismatch");
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        assert!(err.message.contains(name), "{}", err.message);
        assert!(data.iter().chain(&scales).all(|&b| b == 7));
    }
    let err = quantize(Input::F32(&[]), usize::MAX, 2, ScaleLayout::Compact, None, None).expect_err("overflow");
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    let mut data = vec![0u8; 40 * 64];
    let mut scales = vec![0u8; 4];
    let colwise = QuantizedMut {
        data: &mut data,
        scales: &mut scales,
    };
    let err = quantize(Input::F32(&x), 40, 64, ScaleLayout::Compact, None, Some(colwise))
        .expect_err("colwise scales too short");
    assert!(err.message.contains("colwise scales"), "{}", err.message);
}

#[test]
fn dequantize_is_scale_times_code_in_both_layouts_and_output_types() {
    let mut rng = Rng::new(77);
    let (rows, cols) = (45, 70);
    let bits = make(Mix::Sprinkled, rows * cols, &mut rng);
    for layout in LAYOUTS {
        let (row, col) = run_both(Input::Bf16(&bits), rows, cols, layout);
        for (d, q) in [(Direction::Rowwise, &row), (Direction::Colwise, &col)] {
            let mut f = vec![0f32; rows * cols];
            let mut h = vec![0u16; rows * cols];
            let deq = match d {
                Direction::Rowwise => dequantize_rowwise,
                Direction::Colwise => dequantize_colwise,
            };
            deq(&q.data, &q.scales, rows, cols, layout, Output::F32(&mut f)).unwrap();
            deq(&q.data, &q.scales, rows, cols, layout, Output::Bf16(&mut h)).unwrap();
            for r in 0..rows {
                for c in 0..cols {
                    let (i, j) = match d {
                        Direction::Rowwise => (r, c / 32),
                        Direction::Colwise => (r / 32, c),
                    };
                    let b = q.scales[scale_index(rows, cols, d, layout, i, j)];
                    let k = r * cols + c;
                    let want = f64::from(scale(b)) * f64::from(e4m3_to_f32(q.data[k]));
                    let got = f[k];
                    // Exact in f32 unless it overflows (docs/mxfp8.md §4).
                    let ok = if want.is_nan() {
                        got.is_nan()
                    } else if want.abs() > f64::from(f32::MAX) {
                        got.is_infinite() && got.is_sign_negative() == (want < 0.0)
                    } else {
                        f64::from(got) == want
                    };
                    assert!(ok, "{d:?} {layout:?} ({r},{c}): {got} vs {want}");
                    let want16 = half::bf16::from_f32(got).to_bits();
                    assert!(
                        h[k] == want16 || (got.is_nan() && bf16_to_f32(h[k]).is_nan()),
                        "bf16 ({r},{c})"
                    );
                }
            }
        }
    }
}

#[test]
fn dequantize_rejects_wrong_lengths() {
    let mut out = vec![0f32; 64];
    let err = dequantize_rowwise(&[0; 64], &[0; 3], 2, 32, ScaleLayout::Compact, Output::F32(&mut out))
        .expect_err("short scales");
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    let err = dequantize_colwise(
        &[0; 64],
        &[0; 512],
        2,
        32,
        ScaleLayout::Swizzled,
        Output::F32(&mut out[..63]),
    )
    .expect_err("short output");
    assert!(err.message.contains("output"), "{}", err.message);
}

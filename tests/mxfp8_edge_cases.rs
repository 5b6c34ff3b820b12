//! The edge cases of docs/mxfp8.md §11 and the table "Computed with the TE model" of
//! section 8, one named test each. Every block is checked rowwise and columnwise, with compact
//! and swizzled scales, through the single-direction and the fused entry points, from f32 input
//! and (when its values are bf16 numbers) from bf16 input, both as a full block (zero padded)
//! and as a partial block at the matrix edge.
//!
//! Where TE's paths differ (docs/mxfp8.md §2), the expected bytes are this crate's documented choice:
//! −0 encodes as 0x80 (TE's generic kernel) and a NaN of either sign as 0x7F.

mod support;

use muon_opt::numerics::bf16::bf16_to_f32;
use muon_opt::numerics::mxfp8::{
    Direction, Output, ScaleLayout, dequantize_colwise, dequantize_rowwise, scale_index, scale_shape,
    swizzled_scale_index,
};
use support::mxfp8::{DIRECTIONS, LAYOUTS, run_all};

/// Where a test block sits: block 1 of row/column 2 of a 3-wide matrix.
const LINE: usize = 2;
const BLOCK: usize = 1;

/// The matrix shape holding `n` block elements, for a direction and placement. `partial` puts
/// the block at the edge so that it has exactly `n` elements; otherwise it is a full block of
/// 32 whose other elements are 0, followed by 6 more zero columns (rows).
fn shape(direction: Direction, n: usize, partial: bool) -> (usize, usize) {
    let along = if partial { 32 * BLOCK + n } else { 32 * BLOCK + 38 };
    match direction {
        Direction::Rowwise => (3, along),
        Direction::Colwise => (along, 3),
    }
}

/// Flat index of block element `k`.
fn at(direction: Direction, cols: usize, k: usize) -> usize {
    match direction {
        Direction::Rowwise => LINE * cols + 32 * BLOCK + k,
        Direction::Colwise => (32 * BLOCK + k) * cols + LINE,
    }
}

/// Scale coordinates of the test block.
fn block_coords(direction: Direction) -> (usize, usize) {
    match direction {
        Direction::Rowwise => (LINE, BLOCK),
        Direction::Colwise => (BLOCK, LINE),
    }
}

/// Quantizes a block in every configuration and checks its scale byte and codes, and that
/// every other data and scale byte (padding included) is 0. Returns the number of
/// configurations that used bf16 input.
fn check_block(values: &[f32], scale: u8, codes: &[u8]) -> usize {
    assert_eq!(values.len(), codes.len());
    let mut bf16_runs = 0;
    for direction in DIRECTIONS {
        for layout in LAYOUTS {
            for partial in [false, true] {
                let (rows, cols) = shape(direction, values.len(), partial);
                let mut x = vec![0.0f32; rows * cols];
                for (k, &v) in values.iter().enumerate() {
                    x[at(direction, cols, k)] = v;
                }
                let (q, kinds) = run_all(&x, rows, cols, direction, layout);
                bf16_runs += kinds - 1;
                let ctx = format!("{direction:?} {layout:?} partial={partial}");
                let (i, j) = block_coords(direction);
                let s_at = scale_index(rows, cols, direction, layout, i, j);
                assert_eq!(q.scales[s_at], scale, "scale, {ctx}");
                for (s, &b) in q.scales.iter().enumerate() {
                    assert!(s == s_at || b == 0, "scale byte {s} = {b:#04x}, {ctx}");
                }
                let mut expected = vec![0u8; rows * cols];
                for (k, &c) in codes.iter().enumerate() {
                    expected[at(direction, cols, k)] = c;
                }
                assert_eq!(q.data, expected, "codes, {ctx}");
            }
        }
    }
    bf16_runs
}

/// `check_block` for a block of bf16 numbers: asserts that the bf16 input path ran.
fn check_bf16_block(values: &[f32], scale: u8, codes: &[u8]) {
    assert!(check_block(values, scale, codes) > 0, "values must be bf16 numbers");
}

/// Dequantizes the test block (rowwise and columnwise, both layouts) to f32 and bf16.
fn dequantized(values: &[f32]) -> Vec<(Vec<f32>, Vec<u16>)> {
    let mut out = Vec::new();
    for direction in DIRECTIONS {
        for layout in LAYOUTS {
            let (rows, cols) = shape(direction, values.len(), true);
            let mut x = vec![0.0f32; rows * cols];
            for (k, &v) in values.iter().enumerate() {
                x[at(direction, cols, k)] = v;
            }
            let (q, _) = run_all(&x, rows, cols, direction, layout);
            let (mut f, mut h) = (vec![0f32; rows * cols], vec![0u16; rows * cols]);
            let deq = match direction {
                Direction::Rowwise => dequantize_rowwise,
                Direction::Colwise => dequantize_colwise,
            };
            deq(&q.data, &q.scales, rows, cols, layout, Output::F32(&mut f)).unwrap();
            deq(&q.data, &q.scales, rows, cols, layout, Output::Bf16(&mut h)).unwrap();
            let pick = |k| at(direction, cols, k);
            out.push((
                (0..values.len()).map(|k| f[pick(k)]).collect(),
                (0..values.len()).map(|k| h[pick(k)]).collect(),
            ));
        }
    }
    out
}

/// `2^e` as an f32, exact also for subnormal results (an f32 `powi` with a large negative
/// exponent may divide by an overflowed power and give 0).
fn p2(e: i32) -> f32 {
    2f64.powi(e) as f32
}

/// The nearest bf16 number (the input a bf16 caller would pass).
fn bf16(v: f32) -> f32 {
    bf16_to_f32(half::bf16::from_f32(v).to_bits())
}

// --- docs/mxfp8.md §8, "Computed with the TE model" -------------------------------------------

#[test]
fn table_all_ones() {
    check_bf16_block(&[1.0; 32], 0x77, &[0x78; 32]);
}

#[test]
fn table_448_1_minus3() {
    check_bf16_block(&[448.0, 1.0, -3.0], 0x7F, &[0x7E, 0x38, 0xC4]);
}

#[test]
fn table_450_1_minus3_point1() {
    let codes = [0x76, 0x30, 0xBC, 0x15];
    check_block(&[450.0, 1.0, -3.0, 0.1], 0x80, &codes);
    check_bf16_block(&[450.0, 1.0, -3.0, bf16(0.1)], 0x80, &codes);
    for (f, _) in dequantized(&[450.0, 1.0, -3.0, 0.1]) {
        assert_eq!(f, [448.0, 1.0, -3.0, 0.1015625]);
    }
}

#[test]
fn table_1_75() {
    check_bf16_block(&[1.75], 0x77, &[0x7E]);
}

#[test]
fn table_1_7578125_bumps_the_scale() {
    check_bf16_block(&[1.7578125], 0x78, &[0x76]);
}

#[test]
fn table_0_21875_0_001_minus1e4() {
    let codes = [0x7E, 0x40, 0xA5];
    check_block(&[0.21875, 0.001, -1e-4], 0x74, &codes);
    check_bf16_block(&[0.21875, bf16(0.001), bf16(-1e-4)], 0x74, &codes);
}

#[test]
fn table_all_zero() {
    check_bf16_block(&[0.0; 32], 0x00, &[0x00; 32]);
}

#[test]
fn table_negative_zero_and_one() {
    check_bf16_block(&[-0.0, 1.0], 0x77, &[0x80, 0x78]);
}

#[test]
fn table_nan_3_minus2() {
    check_bf16_block(&[f32::NAN, 3.0, -2.0], 0x78, &[0x7F, 0x7C, 0xF8]);
}

#[test]
fn table_all_nan() {
    check_bf16_block(&[f32::NAN; 32], 0x00, &[0x7F; 32]);
}

#[test]
fn table_inf_3_1e38() {
    let codes = [0x7E, 0x00, 0x31];
    check_block(&[f32::INFINITY, 3.0, 1e38], 0xFE, &codes);
    check_bf16_block(&[f32::INFINITY, 3.0, bf16(1e38)], 0xFE, &codes);
    for (f, _) in dequantized(&[f32::INFINITY, 3.0, 1e38]) {
        assert_eq!(f[0], f32::INFINITY);
        assert_eq!(f[1], 0.0);
        assert_eq!(f[2], 1.125 * p2(126), "9.5704e37");
    }
}

#[test]
fn table_2pow_minus126_and_minus127() {
    check_bf16_block(&[p2(-126), p2(-127)], 0x00, &[0x40, 0x38]);
}

#[test]
fn table_bf16_subnormal_2pow_minus133() {
    check_bf16_block(&[p2(-133)], 0x00, &[0x08]);
    for (f, h) in dequantized(&[p2(-133)]) {
        assert_eq!(f[0], p2(-133));
        assert_eq!(h[0], 0x0001, "2^-133 is the smallest bf16 subnormal");
    }
}

#[test]
fn table_scaled_small_values_stay_normal() {
    let values = [1.0, p2(-9), p2(-10), 3.0 * p2(-11), -p2(-11)];
    check_bf16_block(&values, 0x77, &[0x78, 0x30, 0x28, 0x2C, 0xA0]);
}

#[test]
fn table_e4m3_subnormals_and_ties() {
    let values = [
        448.0,
        p2(-9),
        p2(-10),
        3.0 * p2(-10),
        7.5 * p2(-9),
        -p2(-11),
        1.0625,
        1.1875,
    ];
    check_bf16_block(&values, 0x7F, &[0x7E, 0x01, 0x00, 0x02, 0x08, 0x80, 0x38, 0x3A]);
}

#[test]
fn table_256_and_tie_0_53125() {
    check_bf16_block(&[256.0, 0.53125], 0x7F, &[0x78, 0x30]);
}

#[test]
fn table_f32_subnormal_exception_0x04600001() {
    check_block(&[f32::from_bits(0x0460_0001)], 0x00, &[0x7E]);
}

#[test]
fn table_bf16_max() {
    let max = bf16_to_f32(0x7F7F);
    check_bf16_block(&[max], 0xF7, &[0x78]);
    for (f, h) in dequantized(&[max]) {
        assert_eq!(f[0], f32::INFINITY);
        assert_eq!(h[0], 0x7F80);
    }
}

// --- docs/mxfp8.md §5, TE versus the OCP reference ---------------------------------------------

#[test]
fn ocp_vector_485_475_uses_te_scale_and_rne() {
    let codes = [0x77, 0x77, 0x74, 0xF7, 0xF7, 0xF6, 0x04, 0x84];
    let values = [485.0, 475.0, 400.0, -485.0, -475.0, -450.0, p2(-6), -p2(-6)];
    check_block(&values, 0x80, &codes);
    for (f, _) in dequantized(&values) {
        assert_eq!(f, [480.0, 480.0, 384.0, -480.0, -480.0, -448.0, p2(-6), -p2(-6)]);
    }
    // As bf16 the vector reads [484, 476, ...]: same scale and codes.
    let rounded = values.map(bf16);
    assert_eq!(rounded[..2], [484.0, 476.0]);
    check_bf16_block(&rounded, 0x80, &codes);
}

// --- docs/mxfp8.md §11 -----------------------------------------------------------------------

#[test]
fn s11_01_all_zero_block_with_negative_zeros() {
    let values: Vec<f32> = (0..32).map(|k| if k % 3 == 0 { -0.0 } else { 0.0 }).collect();
    let codes: Vec<u8> = (0..32).map(|k| if k % 3 == 0 { 0x80 } else { 0x00 }).collect();
    check_bf16_block(&values, 0x00, &codes);
}

#[test]
fn s11_02_nan_is_ignored_by_the_amax_and_encodes_as_0x7f() {
    check_bf16_block(&[-f32::NAN, 1.0, f32::NAN, -448.0], 0x7F, &[0x7F, 0x38, 0x7F, 0xFE]);
    check_bf16_block(&[-f32::NAN; 5], 0x00, &[0x7F; 5]);
}

#[test]
fn s11_03_infinities_saturate_and_force_scale_0xfe() {
    let codes = [0x7E, 0xFE, 0x31, 0x00];
    check_block(&[f32::INFINITY, f32::NEG_INFINITY, 1e38, 1.0], 0xFE, &codes);
    check_bf16_block(&[f32::INFINITY, f32::NEG_INFINITY, bf16(1e38), 1.0], 0xFE, &codes);
    for (f, _) in dequantized(&[f32::INFINITY, f32::NEG_INFINITY]) {
        assert_eq!(f, [f32::INFINITY, f32::NEG_INFINITY]);
    }
}

#[test]
fn s11_04_amax_exactly_448_times_power_of_two() {
    for k in [-20, 0, 20] {
        let b = (127 + k) as u8;
        let amax = 448.0 * p2(k);
        check_bf16_block(&[amax, -p2(k)], b, &[0x7E, 0xB8]);
        // The next bf16 above (450·2^k) and the next f32 above both bump the scale; 224 = 0x76.
        check_bf16_block(&[450.0 * p2(k)], b + 1, &[0x76]);
        check_block(&[f32::from_bits(amax.to_bits() + 1)], b + 1, &[0x76]);
    }
    // Significand exactly 1.75 versus 1.75 + 1 ulp (f32).
    check_bf16_block(&[1.75], 0x77, &[0x7E]);
    check_block(&[f32::from_bits(1.75f32.to_bits() + 1)], 0x78, &[0x76]);
}

#[test]
fn s11_05_significand_just_below_and_above_1_75() {
    check_bf16_block(&[1.7421875], 0x77, &[0x7E]);
    check_bf16_block(&[1.7578125], 0x78, &[0x76]);
}

#[test]
fn s11_06_finite_values_never_saturate_but_inf_and_the_exception_do() {
    // 485/475 (the OCP clamp case) encode as 480, not 448.
    check_block(&[485.0, 475.0], 0x80, &[0x77, 0x77]);
    check_bf16_block(&[f32::INFINITY, 1.0], 0xFE, &[0x7E, 0x00]);
    check_block(&[f32::from_bits(0x0460_0001)], 0x00, &[0x7E]);
}

#[test]
fn s11_07_e4m3_subnormal_outputs() {
    // Scale 2^8 (amax 1): elements at 2^-9·2^-8 etc. land on the E4M3 subnormal grid.
    // 3·2^-10 is a tie (→ 2, even), 3·2^-11 is not (0.75 → 1), 7.5·2^-9 ties up to 0x08.
    let s = p2(-8);
    let values = [
        1.0,
        p2(-9) * s,
        p2(-10) * s,
        3.0 * p2(-10) * s,
        3.0 * p2(-11) * s,
        7.5 * p2(-9) * s,
        -p2(-9) * s,
    ];
    check_bf16_block(&values, 0x77, &[0x78, 0x01, 0x00, 0x02, 0x01, 0x08, 0x81]);
}

#[test]
fn s11_08_ties_round_to_even_on_every_binade_boundary() {
    // Scale byte 0x7F (amax 448, inverse scale 1): every midpoint between consecutive
    // non-negative E4M3 values goes to the even code.
    let value = |c: u8| muon_opt::numerics::mxfp8::e4m3_to_f32(c);
    for c in 0u8..0x7E {
        let mid = (value(c) + value(c + 1)) / 2.0;
        let even = if c % 2 == 0 { c } else { c + 1 };
        check_bf16_block(&[448.0, mid, -mid], 0x7F, &[0x7E, even, 0x80 | even]);
    }
    check_bf16_block(&[448.0, 1.0625, 1.1875], 0x7F, &[0x7E, 0x38, 0x3A]);
    // 2^-7 ties in the subnormal range: 0.5·2^-9 → 0, 1.5·2^-9 → 2, 2.5·2^-9 → 2.
    check_bf16_block(
        &[448.0, 0.5 * p2(-9), 1.5 * p2(-9), 2.5 * p2(-9)],
        0x7F,
        &[0x7E, 0x00, 0x02, 0x02],
    );
}

#[test]
fn s11_09_tiny_amax() {
    // bf16 and f32 subnormal inputs.
    check_bf16_block(&[p2(-133)], 0x00, &[0x08]);
    check_block(&[p2(-140)], 0x00, &[0x00]);
    check_bf16_block(&[p2(-130)], 0x00, &[0x20]);
    // amax·(1/448) is an f32 subnormal: with flush-to-zero this would give scale 0x00.
    check_bf16_block(&[1.3125 * p2(-118)], 0x01, &[0x7A]);
    check_bf16_block(&[p2(-120)], 0x00, &[0x70]);
    // The exception.
    check_block(&[f32::from_bits(0x0460_0001)], 0x00, &[0x7E]);
}

#[test]
fn s11_10_huge_amax_overflows_on_dequantization() {
    let bf16_max = bf16_to_f32(0x7F7F);
    check_bf16_block(&[bf16_max], 0xF7, &[0x78]);
    check_block(&[f32::MAX], 0xF7, &[0x78]);
    for (f, _) in dequantized(&[f32::MAX]) {
        assert_eq!(f[0], f32::INFINITY);
    }
}

#[test]
fn s11_11_negative_zero_and_tiny_negatives() {
    check_block(&[1.0, -1e-30, -0.0], 0x77, &[0x78, 0x80, 0x80]);
    check_bf16_block(&[1.0, bf16(-1e-30), -0.0], 0x77, &[0x78, 0x80, 0x80]);
}

#[test]
fn s11_12_shapes_padding_is_zero_in_both_layouts() {
    // Rows and columns not multiples of 128, partial blocks (48 columns: block 1 holds 16
    // elements; 993 rows), every scale byte outside the valid region is 0x00.
    for (rows, cols) in [(993, 48), (130, 130), (1, 16)] {
        let x: Vec<f32> = (0..rows * cols).map(|i| 1.0 + (i % 7) as f32).collect();
        for direction in DIRECTIONS {
            for layout in LAYOUTS {
                let (q, _) = run_all(&x, rows, cols, direction, layout);
                let (sr, sc) = scale_shape(rows, cols, direction);
                let (vr, vc) = match direction {
                    Direction::Rowwise => (rows, cols.div_ceil(32)),
                    Direction::Colwise => (rows.div_ceil(32), cols),
                };
                let mut valid = vec![false; sr * sc];
                for i in 0..vr {
                    for j in 0..vc {
                        let s = scale_index(rows, cols, direction, layout, i, j);
                        valid[s] = true;
                        assert_ne!(q.scales[s], 0, "valid scale ({i}, {j})");
                    }
                }
                for (s, &b) in q.scales.iter().enumerate() {
                    assert!(
                        valid[s] || b == 0,
                        "padding byte {s} of {rows}x{cols} {direction:?} {layout:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn s11_13_swizzle_index_spot_checks() {
    // Rowwise (r=33, cb=5), cols=256: ntx=2, tile 512, 512 + 1*16 + 1*4 + 1.
    assert_eq!(swizzled_scale_index(33, 5, 2), 533);
    assert_eq!(
        scale_index(40, 256, Direction::Rowwise, ScaleLayout::Swizzled, 33, 5),
        533
    );
    // Columnwise uses (i = column, j = row block): the same element of a 256-row tensor.
    assert_eq!(
        scale_index(256, 40, Direction::Colwise, ScaleLayout::Swizzled, 5, 33),
        533
    );
    assert_eq!(swizzled_scale_index(0, 0, 1), 0);
    assert_eq!(swizzled_scale_index(127, 3, 1), 31 * 16 + 3 * 4 + 3);
    assert_eq!(swizzled_scale_index(128, 0, 3), 3 * 512);
    assert_eq!(swizzled_scale_index(5, 9, 3), 2 * 512 + 5 * 16 + 1);
    // Compact indices.
    assert_eq!(
        scale_index(40, 256, Direction::Rowwise, ScaleLayout::Compact, 33, 5),
        33 * 8 + 5
    );
    assert_eq!(
        scale_index(256, 40, Direction::Colwise, ScaleLayout::Compact, 5, 33),
        5 * 128 + 33
    );
}

#[test]
fn s11_14_rowwise_and_colwise_copies_differ() {
    // A 32x32 tile whose row 0 is large and whose other rows are small: the rowwise scale of
    // rows 1..32 is small, the columnwise scale of every column is set by row 0.
    let (rows, cols) = (32, 32);
    let x: Vec<f32> = (0..rows * cols)
        .map(|i| if i < cols { 256.0 } else { 1.0 + (i % 3) as f32 })
        .collect();
    for layout in LAYOUTS {
        let (row, _) = run_all(&x, rows, cols, Direction::Rowwise, layout);
        let (col, _) = run_all(&x, rows, cols, Direction::Colwise, layout);
        assert_ne!(row.data, col.data);
        // Element (5, 2) is 1.0: rowwise scale 2^-7 (row amax 3 -> 0x78) gives 0x70,
        // columnwise scale 2^0 (column amax 256 -> 0x7F) gives 0x38.
        assert_eq!(x[5 * cols + 2], 1.0);
        assert_eq!(row.data[5 * cols + 2], 0x70);
        assert_eq!(col.data[5 * cols + 2], 0x38);
        // Row 0 agrees: both scales come from 256.
        assert_eq!(row.data[..cols], col.data[..cols]);
    }
}

#[test]
fn bf16_input_of_the_same_values_gives_the_same_bytes() {
    // `run_all` compares f32 and bf16 inputs; make sure it saw bf16 here.
    // amax 100 -> scale 0x7D (inverse scale 4): 12, -2, 400 -> 384 (tie to even).
    let n = check_block(&[3.0, -0.5, 100.0], 0x7D, &[0x54, 0xC0, 0x7C]);
    assert_eq!(n, DIRECTIONS.len() * LAYOUTS.len() * 2);
}

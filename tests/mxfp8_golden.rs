//! The golden MXFP8 vectors of `tests/data/golden/mxfp8` (produced outside this project, see
//! `tests/data/golden/README.md`): rowwise and columnwise codes and scales byte for byte, from f32
//! and from bf16 input, through every entry point and both scale layouts. Golden scales are
//! compact and unpadded, so they are compared with the valid region of our padded buffers.

mod support;

use muon_opt::numerics::mxfp8::{Direction, Input, ScaleLayout, scale_index};
use serde_json::Value;
use support::golden::{read, read_f32};
use support::mxfp8::{LAYOUTS, Quantized, bf16_exact, run_both, run_single};

struct Case {
    rows: usize,
    cols: usize,
    input: Vec<f32>,
    row_data: Vec<u8>,
    row_scales: Vec<u8>,
    col_data: Vec<u8>,
    col_scales: Vec<u8>,
}

fn cases() -> Vec<Case> {
    let manifest: Value = serde_json::from_slice(&read("manifest.json")).expect("manifest.json");
    let list = manifest["mxfp8"].as_array().expect("manifest key \"mxfp8\"");
    assert!(!list.is_empty());
    list.iter()
        .map(|c| {
            let field = |k: &str| c[k].as_str().unwrap_or_else(|| panic!("field {k}"));
            let dim = |k: &str| c[k].as_u64().unwrap_or_else(|| panic!("field {k}")) as usize;
            let input = read_f32(field("input_bf16_as_f32"));
            Case {
                rows: dim("rows"),
                cols: dim("cols"),
                input,
                row_data: read(field("rowwise_data_u8")),
                row_scales: read(field("rowwise_scale_u8_compact_unpadded")),
                col_data: read(field("colwise_data_u8")),
                col_scales: read(field("colwise_scale_u8_compact_unpadded")),
            }
        })
        .collect()
}

/// Compares one of our copies with the golden data and unpadded compact scales.
fn check(case: &Case, ours: &Quantized, direction: Direction, layout: ScaleLayout, what: &str) {
    let (rows, cols) = (case.rows, case.cols);
    let (golden_data, golden_scales, srows, scols) = match direction {
        Direction::Rowwise => (&case.row_data, &case.row_scales, rows, cols.div_ceil(32)),
        Direction::Colwise => (&case.col_data, &case.col_scales, rows.div_ceil(32), cols),
    };
    assert_eq!(golden_scales.len(), srows * scols, "{what}: golden scale size");
    assert_eq!(&ours.data, golden_data, "{what}: {direction:?} data");
    for i in 0..srows {
        for j in 0..scols {
            let got = ours.scales[scale_index(rows, cols, direction, layout, i, j)];
            assert_eq!(
                got,
                golden_scales[i * scols + j],
                "{what}: {direction:?} scale ({i}, {j})"
            );
        }
    }
}

#[test]
fn golden_vectors_match_byte_for_byte() {
    let cases = cases();
    for case in &cases {
        let (rows, cols) = (case.rows, case.cols);
        assert_eq!(case.input.len(), rows * cols);
        let bf16: Vec<u16> = case
            .input
            .iter()
            .map(|&v| bf16_exact(v).expect("golden inputs are bf16 values"))
            .collect();
        for layout in LAYOUTS {
            for (input, kind) in [(Input::F32(&case.input), "f32"), (Input::Bf16(&bf16), "bf16")] {
                let what = format!("{rows}x{cols} {kind} {layout:?}");
                let (row, col) = run_both(input, rows, cols, layout);
                check(case, &row, Direction::Rowwise, layout, &format!("fused {what}"));
                check(case, &col, Direction::Colwise, layout, &format!("fused {what}"));
                for d in [Direction::Rowwise, Direction::Colwise] {
                    let single = run_single(input, rows, cols, d, layout);
                    check(case, &single, d, layout, &format!("single {what}"));
                }
            }
        }
    }
}

#[test]
fn golden_set_covers_partial_blocks_and_edge_values() {
    let cases = cases();
    assert!(
        cases.iter().any(|c| c.rows % 32 != 0),
        "a case with a partial columnwise block"
    );
    let values: Vec<f32> = cases.iter().flat_map(|c| c.input.iter().copied()).collect();
    for v in [448.0f32, 450.0, 1.7578125] {
        assert!(values.contains(&v), "golden inputs contain {v}");
    }
    assert!(values.iter().any(|v| *v == 0.0 && v.is_sign_negative()), "-0 present");
    assert!(values.iter().any(|v| v.is_subnormal()), "a bf16 subnormal present");
}

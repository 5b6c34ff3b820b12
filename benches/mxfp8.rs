//! Host MXFP8 quantization throughput versus a plain memcpy of the same input bytes.
//!
//! `cargo bench --bench mxfp8` (optionally `-- ROWS COLS`, default 4096 × 4096). Single
//! threaded. Reports GB/s of *input* bytes for each variant and the ratio to memcpy measured
//! in the same run (goal for the fused rowwise + columnwise bf16 path: ≥ 0.5).

use std::hint::black_box;
use std::time::{Duration, Instant};

use muon_opt::numerics::mxfp8::{
    Direction, Input, QuantizedMut, ScaleLayout, quantize_both, quantize_colwise, quantize_rowwise, scale_shape,
};

/// Best wall time of `f` over `reps` runs after one warm-up run.
fn best_of(reps: usize, mut f: impl FnMut()) -> Duration {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
}

/// Deterministic bf16 test data: values of magnitude ~2^-4 … 2^4 with random signs, so blocks
/// have varied scales and mostly normal E4M3 codes, plus a few zeros.
fn make_input(n: usize) -> Vec<u16> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let r = (state >> 33) as u32;
            let exponent = 123 + (r % 9);
            let bits = ((r >> 8) & 0x8000) | (exponent << 7) | ((r >> 16) & 0x7F);
            if r.is_multiple_of(97) { 0 } else { bits as u16 }
        })
        .collect()
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (rows, cols) = match args[..] {
        [r, c, ..] => (r, c),
        _ => (4096, 4096),
    };
    let reps = 15;
    let n = rows * cols;
    let input = make_input(n);
    let f32_input: Vec<f32> = input.iter().map(|&b| f32::from_bits(u32::from(b) << 16)).collect();
    let (rs_r, rs_c) = scale_shape(rows, cols, Direction::Rowwise);
    let (cs_r, cs_c) = scale_shape(rows, cols, Direction::Colwise);
    let mut row_data = vec![1u8; n];
    let mut col_data = vec![1u8; n];
    let mut row_scales = vec![1u8; rs_r * rs_c];
    let mut col_scales = vec![1u8; cs_r * cs_c];
    let mut copy = vec![1u16; n];

    let bf16_bytes = (n * 2) as f64;
    let gbps = |bytes: f64, d: Duration| bytes / d.as_secs_f64() / 1e9;

    let memcpy = best_of(reps, || {
        copy.copy_from_slice(black_box(&input));
        black_box(&mut copy);
    });
    let memcpy_gbps = gbps(bf16_bytes, memcpy);
    println!("mxfp8 host bench: {rows} x {cols}, single thread, best of {reps}");
    println!("memcpy (bf16 bytes)               {memcpy_gbps:7.2} GB/s");

    let report = |name: &str, bytes: f64, f: &mut dyn FnMut()| {
        let d = best_of(reps, f);
        let g = gbps(bytes, d);
        let ratio = g / memcpy_gbps;
        println!(
            "{name:<34}{g:7.2} GB/s of input  {:8.2} ms  ratio to memcpy {ratio:.2}",
            d.as_secs_f64() * 1e3
        );
    };

    for layout in [ScaleLayout::Compact, ScaleLayout::Swizzled] {
        report(&format!("both bf16 {layout:?}"), bf16_bytes, &mut || {
            quantize_both(
                Input::Bf16(black_box(&input)),
                rows,
                cols,
                layout,
                QuantizedMut {
                    data: &mut row_data,
                    scales: &mut row_scales,
                },
                QuantizedMut {
                    data: &mut col_data,
                    scales: &mut col_scales,
                },
            )
            .expect("quantize_both");
        });
    }
    report("rowwise bf16 Compact", bf16_bytes, &mut || {
        quantize_rowwise(
            Input::Bf16(black_box(&input)),
            rows,
            cols,
            ScaleLayout::Compact,
            &mut row_data,
            &mut row_scales,
        )
        .expect("quantize_rowwise");
    });
    report("colwise bf16 Compact", bf16_bytes, &mut || {
        quantize_colwise(
            Input::Bf16(black_box(&input)),
            rows,
            cols,
            ScaleLayout::Compact,
            &mut col_data,
            &mut col_scales,
        )
        .expect("quantize_colwise");
    });
    report("both f32 Compact", (n * 4) as f64, &mut || {
        quantize_both(
            Input::F32(black_box(&f32_input)),
            rows,
            cols,
            ScaleLayout::Compact,
            QuantizedMut {
                data: &mut row_data,
                scales: &mut row_scales,
            },
            QuantizedMut {
                data: &mut col_data,
                scales: &mut col_scales,
            },
        )
        .expect("quantize_both");
    });
    black_box((&row_data, &col_data, &row_scales, &col_scales));
}

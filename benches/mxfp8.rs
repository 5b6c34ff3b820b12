//! Host MXFP8 quantization throughput versus a plain memcpy of the same input bytes.
//!
//! `cargo bench --bench mxfp8` (optionally `-- ROWS COLS`, default 4096 × 4096). Single
//! threaded, best of 15 runs after a warm-up. Reports GB/s of *input* bytes and the ratio to a
//! memcpy of the same bytes measured in the same run (goal for the fused rowwise + columnwise
//! bf16 path: ≥ 0.5).
//!
//! Two data sets: "typical" values within 2^±4 of each other (blocks rarely contain elements
//! 2^9 times below their amax), and "wide" values spread over 2^-20 … 2^4, where most 32-lane
//! groups contain E4M3 subnormal outputs and take the slower full formula of the fast path.

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

/// Deterministic bf16 data with random signs and mantissas, biased exponents uniform in
/// `128 - binades + 4 ..= 131`, and one zero in about 97 elements.
fn make_input(n: usize, binades: u32) -> Vec<u16> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let r = (state >> 33) as u32;
            let exponent = 132 - binades + (r % binades);
            let bits = ((r >> 8) & 0x8000) | (exponent << 7) | ((r >> 16) & 0x7F);
            if r.is_multiple_of(97) { 0 } else { bits as u16 }
        })
        .collect()
}

/// Output buffers for both copies.
struct Outputs {
    row_data: Vec<u8>,
    row_scales: Vec<u8>,
    col_data: Vec<u8>,
    col_scales: Vec<u8>,
}

impl Outputs {
    fn new(rows: usize, cols: usize) -> Self {
        let size = |d| {
            let (r, c) = scale_shape(rows, cols, d);
            r * c
        };
        // Non-zero fill so that every page is mapped before timing.
        Outputs {
            row_data: vec![1; rows * cols],
            row_scales: vec![1; size(Direction::Rowwise)],
            col_data: vec![1; rows * cols],
            col_scales: vec![1; size(Direction::Colwise)],
        }
    }

    fn both(&mut self, input: Input<'_>, rows: usize, cols: usize, layout: ScaleLayout) {
        let row = QuantizedMut {
            data: &mut self.row_data,
            scales: &mut self.row_scales,
        };
        let col = QuantizedMut {
            data: &mut self.col_data,
            scales: &mut self.col_scales,
        };
        quantize_both(input, rows, cols, layout, row, col).expect("quantize_both");
    }
}

/// GB/s of memcpy for `bytes` input bytes.
fn memcpy_gbps<T: Copy + Default>(src: &[T], reps: usize) -> f64 {
    let mut dst = vec![T::default(); src.len()];
    let d = best_of(reps, || {
        dst.copy_from_slice(black_box(src));
        black_box(&mut dst);
    });
    std::mem::size_of_val(src) as f64 / d.as_secs_f64() / 1e9
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (rows, cols) = match args[..] {
        [r, c, ..] => (r, c),
        _ => (4096, 4096),
    };
    let reps = 15;
    let n = rows * cols;
    let typical = make_input(n, 9);
    let wide = make_input(n, 25);
    let typical_f32: Vec<f32> = typical.iter().map(|&b| f32::from_bits(u32::from(b) << 16)).collect();
    let mut out = Outputs::new(rows, cols);

    let bf16_copy = memcpy_gbps(&typical, reps);
    let f32_copy = memcpy_gbps(&typical_f32, reps);
    println!("mxfp8 host quantization, {rows} x {cols}, single thread, best of {reps}");
    println!("{:<44}{bf16_copy:7.2} GB/s", "memcpy of the bf16 input");
    println!("{:<44}{f32_copy:7.2} GB/s", "memcpy of the f32 input");
    let report = |name: &str, bytes: usize, copy: f64, f: &mut dyn FnMut()| {
        let d = best_of(reps, f);
        let g = bytes as f64 / d.as_secs_f64() / 1e9;
        println!(
            "{name:<44}{g:7.2} GB/s of input {:8.2} ms   ratio to memcpy {:.2}",
            d.as_secs_f64() * 1e3,
            g / copy
        );
    };
    let bf16_bytes = n * 2;
    for layout in [ScaleLayout::Compact, ScaleLayout::Swizzled] {
        report(
            &format!("both, bf16 typical, {layout:?}"),
            bf16_bytes,
            bf16_copy,
            &mut || {
                out.both(Input::Bf16(black_box(&typical)), rows, cols, layout);
            },
        );
    }
    report("both, bf16 wide, Compact", bf16_bytes, bf16_copy, &mut || {
        out.both(Input::Bf16(black_box(&wide)), rows, cols, ScaleLayout::Compact);
    });
    report(
        "rowwise only, bf16 typical, Compact",
        bf16_bytes,
        bf16_copy,
        &mut || {
            let input = Input::Bf16(black_box(&typical));
            quantize_rowwise(
                input,
                rows,
                cols,
                ScaleLayout::Compact,
                &mut out.row_data,
                &mut out.row_scales,
            )
            .expect("quantize_rowwise");
        },
    );
    report(
        "colwise only, bf16 typical, Compact",
        bf16_bytes,
        bf16_copy,
        &mut || {
            let input = Input::Bf16(black_box(&typical));
            quantize_colwise(
                input,
                rows,
                cols,
                ScaleLayout::Compact,
                &mut out.col_data,
                &mut out.col_scales,
            )
            .expect("quantize_colwise");
        },
    );
    report("both, f32 typical, Compact", n * 4, f32_copy, &mut || {
        out.both(Input::F32(black_box(&typical_f32)), rows, cols, ScaleLayout::Compact);
    });
}

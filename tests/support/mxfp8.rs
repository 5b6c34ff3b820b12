//! Helpers shared by the `mxfp8_*` integration tests: a naive reference quantizer written
//! straight from docs/mxfp8.md §10, an independent f64 E4M3 encoder, and runners that call the
//! library for every direction, layout and input type.

use muon_opt::numerics::mxfp8::{
    Direction, Input, MAX_NORM_RCP, QuantizedMut, ScaleLayout, f32_to_e4m3, float_to_e8m0, quantize_both,
    quantize_colwise, quantize_rowwise, scale_index, scale_inv, scale_shape,
};

pub const DIRECTIONS: [Direction; 2] = [Direction::Rowwise, Direction::Colwise];
pub const LAYOUTS: [ScaleLayout; 2] = [ScaleLayout::Compact, ScaleLayout::Swizzled];

/// One MXFP8 copy: `[rows, cols]` codes and the padded scale buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quantized {
    pub data: Vec<u8>,
    pub scales: Vec<u8>,
}

/// bf16 bits of an f32 that is exactly representable in bf16 (or NaN).
pub fn bf16_exact(v: f32) -> Option<u16> {
    let bits = v.to_bits();
    if v.is_nan() {
        return Some(((bits >> 16) as u16) | 0x0040);
    }
    (bits & 0xFFFF == 0).then_some((bits >> 16) as u16)
}

/// Independent E4M3 reference: the nearest of the 127 non-negative finite E4M3 values,
/// computed in f64 from the format definition (docs/mxfp8.md §6), ties to the even code,
/// saturating above 448, NaN → 0x7F.
pub struct E4m3Reference {
    /// Value of code `c` for `c` in `0..=0x7E`, increasing.
    values: Vec<f64>,
}

impl E4m3Reference {
    pub fn new() -> Self {
        let values = (0u8..=0x7E)
            .map(|c| {
                let (e, m) = (i32::from(c >> 3), f64::from(c & 7));
                if e == 0 {
                    m * 2f64.powi(-9)
                } else {
                    (1.0 + m / 8.0) * 2f64.powi(e - 7)
                }
            })
            .collect();
        E4m3Reference { values }
    }

    /// The value of a non-NaN code.
    pub fn value(&self, c: u8) -> f64 {
        let v = self.values[usize::from(c & 0x7F)];
        if c & 0x80 != 0 { -v } else { v }
    }

    pub fn encode(&self, y: f64) -> u8 {
        if y.is_nan() {
            return 0x7F;
        }
        let sign = if y.is_sign_negative() { 0x80 } else { 0 };
        let v = y.abs();
        if v >= 448.0 {
            return sign | 0x7E;
        }
        // First code whose value is >= v; then pick between it and its predecessor.
        let hi = self.values.partition_point(|&x| x < v);
        if hi == 0 {
            return sign;
        }
        let lo = hi - 1;
        let (dlo, dhi) = (v - self.values[lo], self.values[hi] - v);
        let code = if dlo < dhi || (dlo == dhi && lo % 2 == 0) {
            lo
        } else {
            hi
        };
        sign | code as u8
    }
}

/// Naive reference quantization of upcast values `x` (docs/mxfp8.md §10), one block at a time,
/// built on the scalar primitives (which have their own exhaustive tests).
pub fn reference_quantize(x: &[f32], rows: usize, cols: usize, direction: Direction, layout: ScaleLayout) -> Quantized {
    let (sr, sc) = scale_shape(rows, cols, direction);
    let mut out = Quantized {
        data: vec![0; rows * cols],
        scales: vec![0; sr * sc],
    };
    let blocks: Vec<(usize, usize, Vec<usize>)> = match direction {
        Direction::Rowwise => (0..rows)
            .flat_map(|r| {
                (0..cols.div_ceil(32)).map(move |cb| {
                    let idx = (cb * 32..(cb * 32 + 32).min(cols)).map(|c| r * cols + c);
                    (r, cb, idx.collect())
                })
            })
            .collect(),
        Direction::Colwise => (0..rows.div_ceil(32))
            .flat_map(|rb| {
                (0..cols).map(move |c| {
                    let idx = (rb * 32..(rb * 32 + 32).min(rows)).map(|r| r * cols + c);
                    (rb, c, idx.collect())
                })
            })
            .collect(),
    };
    for (i, j, idx) in blocks {
        let amax = idx
            .iter()
            .map(|&k| x[k])
            .filter(|v| !v.is_nan())
            .fold(0.0f32, |m, v| m.max(v.abs()));
        let b = float_to_e8m0(amax * MAX_NORM_RCP);
        let s = scale_inv(b);
        for &k in &idx {
            out.data[k] = f32_to_e4m3(x[k] * s);
        }
        out.scales[scale_index(rows, cols, direction, layout, i, j)] = b;
    }
    out
}

/// Runs the library on `input` for one direction, through the single-direction entry point.
pub fn run_single(input: Input<'_>, rows: usize, cols: usize, direction: Direction, layout: ScaleLayout) -> Quantized {
    let (sr, sc) = scale_shape(rows, cols, direction);
    // Non-zero fill: every byte must be written by the library.
    let mut out = Quantized {
        data: vec![0xA5; rows * cols],
        scales: vec![0xA5; sr * sc],
    };
    let f = match direction {
        Direction::Rowwise => quantize_rowwise,
        Direction::Colwise => quantize_colwise,
    };
    f(input, rows, cols, layout, &mut out.data, &mut out.scales).expect("quantize");
    out
}

/// Runs the fused entry point and returns (rowwise, colwise).
pub fn run_both(input: Input<'_>, rows: usize, cols: usize, layout: ScaleLayout) -> (Quantized, Quantized) {
    let new = |d| {
        let (sr, sc) = scale_shape(rows, cols, d);
        Quantized {
            data: vec![0x5A; rows * cols],
            scales: vec![0x5A; sr * sc],
        }
    };
    let (mut row, mut col) = (new(Direction::Rowwise), new(Direction::Colwise));
    quantize_both(
        input,
        rows,
        cols,
        layout,
        QuantizedMut {
            data: &mut row.data,
            scales: &mut row.scales,
        },
        QuantizedMut {
            data: &mut col.data,
            scales: &mut col.scales,
        },
    )
    .expect("quantize_both");
    (row, col)
}

/// Quantizes `x` (f32 values) with every entry point, layout and, when every value is exact
/// in bf16, both input types; asserts they all agree with each other and returns the result
/// for `direction` and `layout` together with the number of input types run.
pub fn run_all(x: &[f32], rows: usize, cols: usize, direction: Direction, layout: ScaleLayout) -> (Quantized, usize) {
    let bf16: Option<Vec<u16>> = x.iter().map(|&v| bf16_exact(v)).collect();
    let mut inputs = vec![Input::F32(x)];
    if let Some(b) = &bf16 {
        inputs.push(Input::Bf16(b));
    }
    let mut result = None;
    for input in &inputs {
        let single = run_single(*input, rows, cols, direction, layout);
        let (row, col) = run_both(*input, rows, cols, layout);
        let both = match direction {
            Direction::Rowwise => row,
            Direction::Colwise => col,
        };
        assert_eq!(single, both, "single vs fused ({direction:?}, {layout:?})");
        if let Some(r) = &result {
            assert_eq!(r, &single, "f32 vs bf16 input ({direction:?}, {layout:?})");
        }
        result = Some(single);
    }
    (result.expect("at least the f32 input"), inputs.len())
}

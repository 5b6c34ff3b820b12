//! bfloat16 conversions: f32 → bf16 with round-to-nearest-even, bf16 → f32 (exact).
//!
//! The conversion is the `half` crate's (`half::bf16::from_f32`, half 2.7.1
//! `src/bfloat/convert.rs`, `f32_to_bf16`): it keeps the upper 16 bits of the f32 and adds one
//! when the dropped half is above one half ULP, or exactly one half and the kept LSB is odd —
//! round to nearest, ties to even. Values beyond the largest finite bf16 after rounding become
//! ±∞, subnormals round like any other value (no flush to zero), and a NaN stays a NaN with its
//! sign and upper payload bits and the quiet bit set. This matches CUDA's
//! `__float2bfloat16_rn` on every non-NaN input; CUDA returns the canonical NaN `0x7FFF`
//! instead of propagating the payload.

use half::bf16;

/// Converts `x` to bf16 bits, rounding to nearest even; NaN becomes a quiet NaN.
#[inline]
pub fn f32_to_bf16_rne(x: f32) -> u16 {
    bf16::from_f32(x).to_bits()
}

/// Converts bf16 bits to f32. Exact for every non-NaN value; a NaN comes back quiet.
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    bf16::from_bits(bits).to_f32()
}

/// Rounds `x` to the nearest bf16 value (ties to even) and returns it as f32.
#[inline]
pub fn round_through_bf16(x: f32) -> f32 {
    bf16_to_f32(f32_to_bf16_rne(x))
}

/// Converts every element of `src` into `dst` as bf16 bits.
///
/// # Panics
/// If the slices differ in length.
pub fn cast_f32_to_bf16(src: &[f32], dst: &mut [u16]) {
    assert_eq!(src.len(), dst.len(), "cast_f32_to_bf16: length mismatch");
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f32_to_bf16_rne(s);
    }
}

/// Converts every bf16 element of `src` into `dst` as f32.
///
/// # Panics
/// If the slices differ in length.
pub fn cast_bf16_to_f32(src: &[u16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "cast_bf16_to_f32: length mismatch");
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = bf16_to_f32(s);
    }
}

/// `rounded` ← every element of `src` rounded to the nearest bf16 value and `scaled` ←
/// `factor·src` (each product rounded to f32), in one pass over `src`.
///
/// # Panics
/// If the slices differ in length.
pub fn round_through_bf16_and_scale(src: &[f32], rounded: &mut [f32], scaled: &mut [f32], factor: f32) {
    assert!(
        src.len() == rounded.len() && src.len() == scaled.len(),
        "round_through_bf16_and_scale: length mismatch"
    );
    for ((r, c), &s) in rounded.iter_mut().zip(scaled.iter_mut()).zip(src) {
        *r = round_through_bf16(s);
        *c = factor * s;
    }
}

/// `scaled` ← `factor·data` (each product rounded to f32), then every element of `data`
/// rounded to the nearest bf16 value in place, in one pass.
///
/// # Panics
/// If the slices differ in length.
pub fn scale_then_round_through_bf16(data: &mut [f32], scaled: &mut [f32], factor: f32) {
    assert_eq!(
        data.len(),
        scaled.len(),
        "scale_then_round_through_bf16: length mismatch"
    );
    for (d, c) in data.iter_mut().zip(scaled.iter_mut()) {
        *c = factor * *d;
        *d = round_through_bf16(*d);
    }
}

/// Rounds every element of `data` to the nearest bf16 value in place.
pub fn round_slice_through_bf16_in_place(data: &mut [f32]) {
    for x in data {
        *x = round_through_bf16(*x);
    }
}

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

use crate::numerics::simd;

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
/// `factor·src` (each product rounded to f32), in one pass over `src` (compiled for the
/// widest vector extension, [`simd::widest`]).
///
/// # Panics
/// If the slices differ in length.
pub fn round_through_bf16_and_scale(src: &[f32], rounded: &mut [f32], scaled: &mut [f32], factor: f32) {
    assert!(
        src.len() == rounded.len() && src.len() == scaled.len(),
        "round_through_bf16_and_scale: length mismatch"
    );
    simd::widest(|| round_and_scale_pass(src, rounded, scaled, factor));
}

/// `scaled` ← `factor·data` (each product rounded to f32), then every element of `data`
/// rounded to the nearest bf16 value in place, in one pass ([`simd::widest`]).
///
/// # Panics
/// If the slices differ in length.
pub fn scale_then_round_through_bf16(data: &mut [f32], scaled: &mut [f32], factor: f32) {
    assert_eq!(
        data.len(),
        scaled.len(),
        "scale_then_round_through_bf16: length mismatch"
    );
    simd::widest(|| scale_then_round_pass(data, scaled, factor));
}

/// Rounds every element of `data` to the nearest bf16 value in place ([`simd::widest`]).
pub fn round_slice_through_bf16_in_place(data: &mut [f32]) {
    simd::widest(|| round_in_place_pass(data));
}

#[inline(always)]
fn round_and_scale_pass(src: &[f32], rounded: &mut [f32], scaled: &mut [f32], factor: f32) {
    for ((r, c), &s) in rounded.iter_mut().zip(scaled.iter_mut()).zip(src) {
        *r = round_through_bf16(s);
        *c = factor * s;
    }
}

#[inline(always)]
fn scale_then_round_pass(data: &mut [f32], scaled: &mut [f32], factor: f32) {
    for (d, c) in data.iter_mut().zip(scaled.iter_mut()) {
        *c = factor * *d;
        *d = round_through_bf16(*d);
    }
}

#[inline(always)]
fn round_in_place_pass(data: &mut [f32]) {
    for x in data {
        *x = round_through_bf16(*x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numerics::simd::Isa;

    /// Finite values of every binade, ties, NaNs with payloads, infinities, subnormals and
    /// values that round past the largest finite bf16.
    fn awkward_values() -> Vec<f32> {
        let mut bits: Vec<u32> = (0..4099u32).map(|i| i.wrapping_mul(0x9E37_79B9) ^ (i << 7)).collect();
        bits.extend([
            0x3F80_8000,
            0x3F81_8000,
            0x7F7F_FFFF,
            0x7F80_0000,
            0xFF80_0000,
            0x7FC0_1234,
            0xFFA0_0001,
            0x0000_8000,
            0x8000_0001,
        ]);
        bits.into_iter().map(f32::from_bits).collect()
    }

    #[test]
    fn every_compiled_variant_has_the_bits_of_each_element_alone() {
        let src = awkward_values();
        let n = src.len();
        let factor = 1.0 / 3.0;
        let rounded_alone: Vec<u32> = src.iter().map(|&x| round_through_bf16(x).to_bits()).collect();
        let scaled_alone: Vec<u32> = src.iter().map(|&x| (factor * x).to_bits()).collect();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        for isa in Isa::supported() {
            let (mut rounded, mut scaled) = (vec![0.0; n], vec![0.0; n]);
            isa.run(|| round_and_scale_pass(&src, &mut rounded, &mut scaled, factor));
            assert_eq!(bits(&rounded), rounded_alone, "{isa:?}: round_and_scale rounded");
            assert_eq!(bits(&scaled), scaled_alone, "{isa:?}: round_and_scale scaled");
            let (mut data, mut scaled) = (src.clone(), vec![0.0; n]);
            isa.run(|| scale_then_round_pass(&mut data, &mut scaled, factor));
            assert_eq!(bits(&data), rounded_alone, "{isa:?}: scale_then_round rounded");
            assert_eq!(bits(&scaled), scaled_alone, "{isa:?}: scale_then_round scaled");
            let mut data = src.clone();
            isa.run(|| round_in_place_pass(&mut data));
            assert_eq!(bits(&data), rounded_alone, "{isa:?}: round in place");
        }
    }
}

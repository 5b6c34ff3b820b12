//! The element types of the host quantizer and its fast encoding path.
//!
//! TE encodes `x * 2^k` (`2^k = scale_inv(b)`) with an f32 multiply and a saturating E4M3
//! conversion ([`super::f32_to_e4m3`]). For a block whose scale byte is at least
//! [`FAST_MIN_SCALE`] and that holds no NaN or ±∞, the same codes follow from integer
//! arithmetic on the input's own bits, split into a scale-independent part
//! ([`Element::prepare`], shared by the rowwise and the columnwise copy) and a cheap
//! scale-dependent part ([`Element::finish`]):
//!
//! - With `t = |x|_bits + (k << mantissa_bits)` the bits of `|x| * 2^k`, the normal E4M3 code
//!   is `rne(t >> (mantissa_bits - 3)) - 960` (ties to even; `960 = (127 - 7) << 3`
//!   rebiases). Because `k << mantissa_bits` is a multiple of `2^(mantissa_bits - 3)` whose
//!   bit `mantissa_bits - 3` is clear, this equals `rne(|x|_bits >> (mantissa_bits - 3)) +
//!   8k - 960`: the rounding is done once per element.
//! - Below `2^-6` the code is on the subnormal grid `2^-9`: with the significand `M` (hidden
//!   bit set) and the exponent `e` of `|x| * 2^k`, it is `rne(M * 2^(e-117) >> (mantissa_bits
//!   + 1))` for `e` in 117..=120, and 0 below (the shift `e - 117` then falls outside the lane
//!   width). The normal formula gives a value below 8 exactly when `t` is below the
//!   midpoint of 7·2^-9 and 2^-6, where both formulas agree, so it also selects the branch.
//!
//! The conditions make the fast path exact: `|x| * 2^k <= 448` holds for every finite element
//! of a block (the scale rounds up, MXFP8.md §1), so no saturation is needed; and `k <= 116`
//! puts input subnormals (and products that would underflow f32) below `2^-10`, which
//! encodes as ±0 in both computations. This module's tests compare it with the exact path
//! for every bf16 input and every scale byte it can be used with.

use super::scalar::bf16_bits_to_f32;

/// The smallest scale byte whose blocks may take the fast path (with no NaN or ±∞ present):
/// `b >= 11` means `k = 127 - b <= 116`.
pub(super) const FAST_MIN_SCALE: u8 = 11;

/// The scale-independent part of an element's fast encoding.
#[derive(Debug, Clone, Copy)]
pub(super) struct Prepared<L> {
    /// `rne(|x|_bits >> (mantissa_bits - 3))`.
    normal: L,
    /// Biased exponent field of `|x|`.
    exponent: L,
    /// Significand with the hidden bit set.
    significand: L,
    /// `0x80` for negative `x`, else 0.
    sign: u8,
}

/// The scale-dependent constants of the fast encoding for an inverse scale `2^k`.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct FastScale<L> {
    /// `8k - 960`.
    pub(super) normal_offset: L,
    /// `k - 117`.
    pub(super) shift_offset: L,
}

/// A high-precision input element type.
pub(super) trait Element: Copy {
    /// `|x|` as an integer (sign bit cleared). For non-NaN values, integer order is magnitude
    /// order, so the block amax is the integer maximum.
    type Key: Copy + Ord + Default;
    /// Signed lane type of the fast path.
    type Lane: Copy + Default;
    /// The key of +∞; larger keys are NaN.
    const NON_FINITE: Self::Key;
    fn raw_key(self) -> Self::Key;
    /// The f32 magnitude a key stands for.
    fn key_to_f32(key: Self::Key) -> f32;
    /// Exact conversion to f32.
    fn to_f32(self) -> f32;
    /// The fast-path constants of scale byte `b` (meaningful for `FAST_MIN_SCALE <= b <= 253`).
    fn fast_scale(b: u8) -> FastScale<Self::Lane>;
    fn prepare(self) -> Prepared<Self::Lane>;
    /// `f32_to_e4m3(x * scale_inv(b))` for a fast-path block with constants `s`.
    fn finish(p: Prepared<Self::Lane>, s: FastScale<Self::Lane>) -> u8;
}

/// bf16 bits. The amax is taken on the bf16 values, which equals the amax of the upcast values
/// (MXFP8.md §7).
impl Element for u16 {
    type Key = u16;
    type Lane = i16;
    const NON_FINITE: u16 = 0x7F80;

    #[inline(always)]
    fn raw_key(self) -> u16 {
        self & 0x7FFF
    }

    #[inline(always)]
    fn key_to_f32(key: u16) -> f32 {
        bf16_bits_to_f32(key)
    }

    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16_bits_to_f32(self)
    }

    #[inline(always)]
    fn fast_scale(b: u8) -> FastScale<i16> {
        let k = 127 - i16::from(b);
        FastScale {
            normal_offset: 8 * k - 960,
            shift_offset: k - 117,
        }
    }

    #[inline(always)]
    fn prepare(self) -> Prepared<i16> {
        let a = self & 0x7FFF;
        Prepared {
            normal: ((a + 7 + ((a >> 4) & 1)) >> 4) as i16,
            exponent: (a >> 7) as i16,
            significand: ((a & 0x7F) | 0x80) as i16,
            sign: (self >> 8) as u8 & 0x80,
        }
    }

    #[inline(always)]
    fn finish(p: Prepared<i16>, s: FastScale<i16>) -> u8 {
        let normal = p.normal + s.normal_offset;
        let shift = (p.exponent + s.shift_offset) as u16;
        let m = p.significand as u16;
        let scaled = if shift < 16 { m << shift } else { 0 };
        let sub = (scaled.wrapping_add(0x7F) + ((scaled >> 8) & 1)) >> 8;
        let mag = if normal < 8 { sub as u8 } else { normal as u8 };
        p.sign | mag
    }
}

impl Element for f32 {
    type Key = u32;
    type Lane = i32;
    const NON_FINITE: u32 = 0x7F80_0000;

    #[inline(always)]
    fn raw_key(self) -> u32 {
        self.to_bits() & 0x7FFF_FFFF
    }

    #[inline(always)]
    fn key_to_f32(key: u32) -> f32 {
        f32::from_bits(key)
    }

    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }

    #[inline(always)]
    fn fast_scale(b: u8) -> FastScale<i32> {
        let k = 127 - i32::from(b);
        FastScale {
            normal_offset: 8 * k - 960,
            shift_offset: k - 117,
        }
    }

    #[inline(always)]
    fn prepare(self) -> Prepared<i32> {
        let bits = self.to_bits();
        let a = bits & 0x7FFF_FFFF;
        Prepared {
            normal: ((a + 0x7_FFFF + ((a >> 20) & 1)) >> 20) as i32,
            exponent: (a >> 23) as i32,
            significand: ((a & 0x7F_FFFF) | 0x80_0000) as i32,
            sign: (bits >> 24) as u8 & 0x80,
        }
    }

    #[inline(always)]
    fn finish(p: Prepared<i32>, s: FastScale<i32>) -> u8 {
        let normal = p.normal + s.normal_offset;
        let shift = (p.exponent + s.shift_offset) as u32;
        let m = p.significand as u32;
        let scaled = if shift < 32 { m << shift } else { 0 };
        let sub = (scaled.wrapping_add(0x7F_FFFF) + ((scaled >> 24) & 1)) >> 24;
        let mag = if normal < 8 { sub as u8 } else { normal as u8 };
        p.sign | mag
    }
}

#[cfg(test)]
mod tests {
    use super::super::scalar::{f32_to_e4m3, scale_inv};
    use super::*;

    /// Largest scale byte a finite bf16 or f32 amax produces (MXFP8.md §1).
    const MAX_FINITE_SCALE: u8 = 0xF7;

    fn fast<E: Element>(x: E, b: u8) -> u8 {
        E::finish(x.prepare(), E::fast_scale(b))
    }

    #[test]
    fn bf16_fast_path_equals_exact_path_for_every_input_and_scale() {
        for b in FAST_MIN_SCALE..=MAX_FINITE_SCALE {
            let s = scale_inv(b);
            // Every element a block with scale byte b can hold: |x| <= 448 * 2^(b-127).
            let limit = 448.0 * f64::from(b as i32 - 127).exp2();
            for x in 0..=u16::MAX {
                let v = bf16_bits_to_f32(x);
                if !v.is_finite() || f64::from(v.abs()) > limit {
                    continue;
                }
                assert_eq!(fast(x, b), f32_to_e4m3(v * s), "x={x:#06x} b={b}");
            }
        }
    }

    #[test]
    fn f32_fast_path_equals_exact_path_on_bf16_values_and_their_neighbours() {
        for b in FAST_MIN_SCALE..=MAX_FINITE_SCALE {
            let s = scale_inv(b);
            let limit = 448.0 * f64::from(b as i32 - 127).exp2();
            for hi in 0..=u16::MAX {
                for lo in [0u32, 1, 0x8000, 0xFFFF] {
                    let v = f32::from_bits((u32::from(hi) << 16) | lo);
                    if !v.is_finite() || f64::from(v.abs()) > limit {
                        continue;
                    }
                    assert_eq!(fast(v, b), f32_to_e4m3(v * s), "x={:#010x} b={b}", v.to_bits());
                }
            }
        }
    }
}

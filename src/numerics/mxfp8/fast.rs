//! The element types of the host quantizer and its fast encoding path.
//!
//! TE encodes `x * 2^k` (`2^k = scale_inv(b)`) with an f32 multiply and a saturating E4M3
//! conversion ([`super::f32_to_e4m3`]). For a block whose scale byte is at least
//! [`FAST_MIN_SCALE`] and that holds no NaN or ±∞, the same codes follow from integer
//! arithmetic on the input's own bits, split into a scale-independent part
//! ([`Element::prepare`], shared by the rowwise and the columnwise copy) and a cheap part that
//! depends on the scale only through one per-block constant, `drop = 960 - 8k`:
//!
//! - With `t = |x|_bits + (k << mantissa_bits)` the bits of `|x| * 2^k`, the normal E4M3 code
//!   is `rne(t >> (mantissa_bits - 3)) - 960` (ties to even; `960 = (127 - 7) << 3`
//!   rebiases). Because `k << mantissa_bits` is a multiple of `2^(mantissa_bits - 3)` whose
//!   bit `mantissa_bits - 3` is clear, this equals `rne(|x|_bits >> (mantissa_bits - 3)) -
//!   drop`: the rounding is done once per element. Subtracting `drop` (positive, as
//!   `k <= 116`) with saturation at 0 also maps every product below `2^-10` to code 0.
//! - Products in `[2^-10, 2^-6)` (exponent `e` in 117..=120) land on the subnormal grid
//!   `2^-9`: their code is `rne(M * 2^(e-117) >> (mantissa_bits + 1))` with `M` the
//!   significand (hidden bit set). Their normal formula lies in `-24..8` (products just below
//!   `2^-10` and just below `2^-6`, where both formulas agree, may or may not be included),
//!   which [`Element::window`] reports. Such lanes are rare in real data (elements 2^9 to
//!   2^14 times smaller than their block's amax), so the loops compute the second formula
//!   ([`Element::finish`]) only for the 32-lane groups that contain one.
//!
//! The conditions make the fast path exact: `|x| * 2^k <= 448` holds for every finite element
//! of a block (the scale rounds up, docs/mxfp8.md §1), so no saturation is needed; and `k <= 116`
//! puts input subnormals (and products that would underflow f32) below `2^-10`, which
//! encodes as ±0 in both computations. This module's tests compare it with the exact path
//! for every bf16 input and every scale byte it can be used with.

use super::scalar::{bf16_bits_to_f32, e8m0_from_amax};

/// The smallest scale byte whose blocks may take the fast path (with no NaN or ±∞ present):
/// `b >= 11` means `k = 127 - b <= 116`.
pub(super) const FAST_MIN_SCALE: u8 = 11;

/// Width of the range `-24..8` of normal-formula results that need the full formula, as
/// offset by [`Element::window`].
pub(super) const WINDOW: u8 = 32;

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

/// A high-precision input element type.
pub(super) trait Element: Copy {
    /// `|x|` as an integer (sign bit cleared). For non-NaN values, integer order is magnitude
    /// order, so the block amax is the integer maximum.
    type Key: Copy + Ord + Default;
    /// Unsigned lane type of the fast path.
    type Lane: Copy + Default + Ord + From<u8>;
    /// The key of +∞; larger keys are NaN.
    const NON_FINITE: Self::Key;
    /// Whether rowwise block amaxes are reduced 32 blocks at a time by a tree of pairwise
    /// maxima (cheaper than 32 horizontal reductions for 16-bit keys; for 32-bit keys the
    /// compiler vectorizes across blocks with gathers instead, so those are reduced block by
    /// block).
    const TREE_REDUCTION: bool;
    /// Whether the loop nest prefetches the input of the amax pass in software. Measured with
    /// `benches/mxfp8.rs` (AMD EPYC with AVX-512, 4096 × 4096): about 10–20 % faster for bf16, whose
    /// amax pass otherwise waits on memory, but about 30 % slower for f32, which reads twice
    /// the bytes per segment and is served well by the hardware prefetchers.
    const PREFETCH: bool;
    /// Whether a call producing both copies writes the columnwise one with streaming stores
    /// (`stream.rs`). Measured with `benches/mxfp8.rs` (AMD EPYC with AVX-512, 4096 × 4096): about 20 %
    /// faster for bf16 (saving the read for ownership of half the output), but about 20 %
    /// slower for f32. Streaming the rowwise copy instead, or both, is slower for bf16.
    const STREAM_BOTH: bool;
    fn raw_key(self) -> Self::Key;
    /// The scale byte of a block with amax key `key`: `e8m0_from_amax` of the value it stands
    /// for.
    fn scale_byte(key: Self::Key) -> u8;
    /// Exact conversion to f32.
    fn to_f32(self) -> f32;
    /// The fast-path constant `drop = 960 - 8k` of scale byte `b` (meaningful for
    /// `FAST_MIN_SCALE <= b <= 253`).
    fn fast_drop(b: u8) -> Self::Lane;
    fn prepare(self) -> Prepared<Self::Lane>;
    /// The code of a lane by the normal formula, exact unless [`Element::window`] says that its
    /// product may be in `[2^-10, 2^-6)`.
    fn common_code(p: Prepared<Self::Lane>, drop: Self::Lane) -> u8;
    /// The lane's normal formula plus 24, wrapping: below [`WINDOW`] exactly when the formula
    /// lies in `-24..8`, where the product may be in `[2^-10, 2^-6)` and [`Element::finish`]
    /// gives the code. Loops take the minimum over many lanes to test them all at once.
    fn window(p: Prepared<Self::Lane>, drop: Self::Lane) -> Self::Lane;
    /// The code of a lane unless its product may be in `[2^-10, 2^-6)`, and whether it may
    /// (then [`Element::finish`] gives the code).
    #[inline(always)]
    fn finish_common(p: Prepared<Self::Lane>, drop: Self::Lane) -> (u8, bool) {
        (Self::common_code(p, drop), Self::window(p, drop) < WINDOW.into())
    }
    /// `f32_to_e4m3(x * scale_inv(b))` for a fast-path block with constant `drop`: both
    /// formulas, selected per lane.
    fn finish(p: Prepared<Self::Lane>, drop: Self::Lane) -> u8;
}

/// bf16 bits. The amax is taken on the bf16 values, which equals the amax of the upcast values
/// (docs/mxfp8.md §7).
impl Element for u16 {
    type Key = u16;
    type Lane = u16;
    const NON_FINITE: u16 = 0x7F80;
    const TREE_REDUCTION: bool = true;
    const PREFETCH: bool = true;
    const STREAM_BOTH: bool = true;

    #[inline(always)]
    fn raw_key(self) -> u16 {
        self & 0x7FFF
    }

    /// `e8m0_from_amax` is `max(0, be - 8 + (mf > 0x600000))` for a normal amax with biased
    /// exponent `be` and f32 mantissa field `mf`, and 0 for a subnormal or zero one (its
    /// exception has nonzero low 16 bits, so it is not a bf16 value). For bf16,
    /// `mf > 0x600000` is `key & 0x7F > 0x60`, so `(key + 0x1F) >> 7` is `be` plus that bump,
    /// and a subnormal or zero key (`be = 0`) gives at most 1, below the 8 subtracted. ±∞ gives
    /// 0xFE and NaN 0xFF, as in `float_to_e8m0`.
    #[inline(always)]
    fn scale_byte(key: u16) -> u8 {
        let finite = (((key + 0x1F) >> 7).max(8) - 8) as u8;
        match key {
            0x7F80 => 0xFE,
            0x7F81.. => 0xFF,
            _ => finite,
        }
    }

    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16_bits_to_f32(self)
    }

    #[inline(always)]
    fn fast_drop(b: u8) -> u16 {
        // 960 - 8(127 - b) = 8b - 56.
        (8 * u16::from(b)).wrapping_sub(56)
    }

    #[inline(always)]
    fn prepare(self) -> Prepared<u16> {
        let a = self & 0x7FFF;
        Prepared {
            normal: (a + 7 + ((a >> 4) & 1)) >> 4,
            exponent: a >> 7,
            significand: (a & 0x7F) | 0x80,
            sign: (self >> 8) as u8 & 0x80,
        }
    }

    #[inline(always)]
    fn common_code(p: Prepared<u16>, drop: u16) -> u8 {
        p.sign | p.normal.saturating_sub(drop) as u8
    }

    #[inline(always)]
    fn window(p: Prepared<u16>, drop: u16) -> u16 {
        (p.normal + 24).wrapping_sub(drop)
    }

    #[inline(always)]
    fn finish(p: Prepared<u16>, drop: u16) -> u8 {
        // k - 117 = (24 - drop) / 8, exact: drop is a multiple of 8.
        let shift = p.exponent.wrapping_add(((24u16.wrapping_sub(drop) as i16) >> 3) as u16);
        let scaled = p.significand << (shift & 3);
        let sub = (scaled + 0x7F + ((scaled >> 8) & 1)) >> 8;
        let normal = p.normal.saturating_sub(drop);
        p.sign | if shift < 4 { sub as u8 } else { normal as u8 }
    }
}

impl Element for f32 {
    type Key = u32;
    type Lane = u32;
    const NON_FINITE: u32 = 0x7F80_0000;
    const TREE_REDUCTION: bool = false;
    const PREFETCH: bool = false;
    const STREAM_BOTH: bool = false;

    #[inline(always)]
    fn raw_key(self) -> u32 {
        self.to_bits() & 0x7FFF_FFFF
    }

    #[inline(always)]
    fn scale_byte(key: u32) -> u8 {
        e8m0_from_amax(f32::from_bits(key))
    }

    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }

    #[inline(always)]
    fn fast_drop(b: u8) -> u32 {
        (8 * u32::from(b)).wrapping_sub(56)
    }

    /// As for bf16 with 23 mantissa bits: the significand has 24 bits and the subnormal code
    /// is rounded at bit 24.
    #[inline(always)]
    fn prepare(self) -> Prepared<u32> {
        let bits = self.to_bits();
        let a = bits & 0x7FFF_FFFF;
        Prepared {
            normal: (a + 0x7_FFFF + ((a >> 20) & 1)) >> 20,
            exponent: a >> 23,
            significand: (a & 0x7F_FFFF) | 0x80_0000,
            sign: (bits >> 24) as u8 & 0x80,
        }
    }

    #[inline(always)]
    fn common_code(p: Prepared<u32>, drop: u32) -> u8 {
        p.sign | p.normal.saturating_sub(drop) as u8
    }

    #[inline(always)]
    fn window(p: Prepared<u32>, drop: u32) -> u32 {
        (p.normal + 24).wrapping_sub(drop)
    }

    #[inline(always)]
    fn finish(p: Prepared<u32>, drop: u32) -> u8 {
        let shift = p.exponent.wrapping_add(((24u32.wrapping_sub(drop) as i32) >> 3) as u32);
        let scaled = p.significand << (shift & 3);
        let sub = (scaled + 0x7F_FFFF + ((scaled >> 24) & 1)) >> 24;
        let normal = p.normal.saturating_sub(drop);
        p.sign | if shift < 4 { sub as u8 } else { normal as u8 }
    }
}

#[cfg(test)]
mod tests {
    use super::super::scalar::{f32_to_e4m3, scale_inv};
    use super::*;

    /// Largest scale byte a finite bf16 or f32 amax produces (docs/mxfp8.md §1).
    const MAX_FINITE_SCALE: u8 = 0xF7;

    /// Both the full formula and, where it applies, the common one.
    fn fast<E: Element>(x: E, b: u8) -> u8 {
        let (p, drop) = (x.prepare(), E::fast_drop(b));
        let full = E::finish(p, drop);
        let (common, needs_full) = E::finish_common(p, drop);
        if !needs_full {
            assert_eq!(common, full, "common formula, b={b}");
        }
        full
    }

    #[test]
    fn bf16_scale_byte_equals_e8m0_from_amax_for_every_key() {
        for key in 0..=0x7FFF {
            let want = e8m0_from_amax(bf16_bits_to_f32(key));
            assert_eq!(<u16 as Element>::scale_byte(key), want, "key={key:#06x}");
        }
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

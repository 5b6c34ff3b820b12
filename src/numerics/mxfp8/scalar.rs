//! Scalar MXFP8 primitives: the E8M0 block scale, the inverse and forward scale, the E4M3
//! encoder and decoder, and the swizzled scale index.
//!
//! Each function mirrors the function of the same name (prefix `muon_mx_`) in
//! `kernels/mxfp8.cuh` operation for operation; `tests/mxfp8_cuh_mirror.rs` compiles that header
//! as host C++ and compares both over all 65,536 bf16 inputs.

/// Elements per scaling block: 1×32 rowwise, 32×1 columnwise (docs/mxfp8.md §3).
pub const BLOCK_SIZE: usize = 32;

/// Largest finite E4M3 magnitude, 448 (`Quantized_Limits<fp8e4m3>::max_norm`, docs/mxfp8.md §1).
pub const MAX_NORM: f32 = 448.0;

/// `(float)(1.0 / 448.0)`, bits `0x3B124925`: TE's `max_norm_rcp`, computed in double and
/// rounded to f32 (docs/mxfp8.md §1). `448.0 * MAX_NORM_RCP == 1.0` exactly.
pub const MAX_NORM_RCP: f32 = f32::from_bits(0x3B12_4925);

/// The E4M3 code this crate emits for a NaN input of either sign.
///
/// NVIDIA's host converter keeps the sign (`0xFF` for −NaN), but on the GPU the NaN first goes
/// through an f32 multiply that very probably yields the canonical `0x7FFFFFFF`, so TE's
/// expected output is `0x7F` (docs/mxfp8.md §2, "NaN sign"; the golden vectors use `0x7F`).
pub const E4M3_NAN: u8 = 0x7F;

/// E4M3 code of +448, the largest finite value (docs/mxfp8.md §6).
pub const E4M3_MAX: u8 = 0x7E;

/// f32 bits of `2^14`, the constant whose ulp is the E4M3 subnormal step `2^-9`.
const SUBNORMAL_MAGIC_BITS: u32 = 0x4680_0000;

/// f32 bits of `2^-6`, the smallest normal E4M3 magnitude.
const E4M3_MIN_NORMAL_BITS: u32 = 0x3C80_0000;

/// `(127 - 7) << 3`: rebiases a shifted f32 exponent/mantissa pair to E4M3.
const E4M3_REBIAS: u32 = 960;

/// `2^-127` as an f32 (subnormal), bits `0x00400000`.
const TWO_POW_MINUS_127: f32 = f32::from_bits(0x0040_0000);

/// The NaN returned for scale byte 255 (`0x7fffffff`, as in TE's `ptx::exp2f_rcp`).
const SCALE_NAN: f32 = f32::from_bits(0x7FFF_FFFF);

/// TE's `ptx::float_to_e8m0` (software fallback in `common/util/ptx_arch_spec.cuh`, also the
/// C++ test reference `tests/cpp/test_common.h::float_to_e8m0`), docs/mxfp8.md §1.
///
/// Rounds `|v|` up to a power of two and returns its biased exponent: NaN → `0xFF`,
/// ±∞ → `0xFE`, ±0 → `0x00`, saturating at `0xFE`. An f32 subnormal gives 0 when
/// `|v| ≤ 2^-127` and 1 otherwise. The sign is ignored.
///
/// Written without branches (the selects vectorize); `kernels/mxfp8.cuh` keeps TE's branching
/// form and the mirror test checks both agree.
#[inline]
pub fn float_to_e8m0(v: f32) -> u8 {
    let bits = v.to_bits();
    let a = bits & 0x7FFF_FFFF;
    let e = (bits >> 23) & 0xFF;
    let m = bits & 0x7F_FFFF;
    let bump = m > 0 && e != 0xFE && (e != 0 || m > 0x40_0000);
    let finite = e + u32::from(bump);
    let special = if a == 0x7F80_0000 { 0xFE } else { 0xFF };
    (if a >= 0x7F80_0000 { special } else { finite }) as u8
}

/// The E8M0 scale byte of a block with the given amax: `float_to_e8m0(amax * MAX_NORM_RCP)`,
/// one IEEE f32 multiply with round to nearest even and subnormals kept (docs/mxfp8.md §1, §10).
///
/// For a normal amax with biased exponent `be` and mantissa field `mf` this equals
/// `max(0, be - 8 + (mf > 0x600000))`, and 0 for a subnormal or zero amax, with the single
/// exception of amax bits `0x04600001`: the product rounds to exactly `2^-127` in the f32
/// subnormal range, so TE gives 0 where the closed form gives 1 (docs/mxfp8.md §1).
#[inline]
pub fn e8m0_from_amax(amax: f32) -> u8 {
    float_to_e8m0(amax * MAX_NORM_RCP)
}

/// The inverse scale `2^(127-b)` multiplied into the elements before encoding, TE's
/// `ptx::exp2f_rcp<float>` (`common/util/ptx.cuh`, docs/mxfp8.md §1): 255 → NaN, 254 → `2^-127`
/// (an f32 subnormal), otherwise the f32 with bits `(254 - b) << 23`.
#[inline]
pub fn scale_inv(b: u8) -> f32 {
    match b {
        255 => SCALE_NAN,
        254 => TWO_POW_MINUS_127,
        _ => f32::from_bits((254 - u32::from(b)) << 23),
    }
}

/// The scale `2^(b-127)` used by dequantization, TE's `ptx::exp2f` (docs/mxfp8.md §4): 255 → NaN,
/// 0 → `2^-127` (an f32 subnormal), otherwise the f32 with bits `b << 23`.
#[inline]
pub fn scale(b: u8) -> f32 {
    match b {
        255 => SCALE_NAN,
        0 => TWO_POW_MINUS_127,
        _ => f32::from_bits(u32::from(b) << 23),
    }
}

/// f32 → E4M3 with round to nearest, ties to even, saturating to ±448: the result of PTX
/// `cvt.rn.satfinite.e4m3x2.f32` and of the reference encoder of docs/mxfp8.md §6, except that a
/// NaN of either sign gives [`E4M3_NAN`] (§2).
///
/// Branch-free so that loops over it vectorize. Magnitudes below `2^-6` are rounded onto the
/// subnormal grid `2^-9` by adding `2^14` (whose ulp is `2^-9`) with the FPU's ties-to-even;
/// the others drop 20 mantissa bits with ties to even and are rebiased, saturating at `0x7E`
/// (which also covers ±∞).
#[inline]
pub fn f32_to_e4m3(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = (bits >> 24) & 0x80;
    let a = bits & 0x7FFF_FFFF;
    let sub = (f32::from_bits(a) + f32::from_bits(SUBNORMAL_MAGIC_BITS))
        .to_bits()
        .wrapping_sub(SUBNORMAL_MAGIC_BITS);
    let norm = ((a + 0x7_FFFF + ((a >> 20) & 1)) >> 20)
        .wrapping_sub(E4M3_REBIAS)
        .min(u32::from(E4M3_MAX));
    let mag = if a < E4M3_MIN_NORMAL_BITS { sub } else { norm };
    if a > 0x7F80_0000 { E4M3_NAN } else { (sign | mag) as u8 }
}

/// E4M3 code → f32, exact (docs/mxfp8.md §6). `0x7F` and `0xFF` are NaN (quiet, sign kept); there
/// is no infinity.
#[inline]
pub fn e4m3_to_f32(c: u8) -> f32 {
    let e = u32::from((c >> 3) & 0xF);
    let m = u32::from(c & 7);
    let sign = u32::from(c & 0x80) << 24;
    if e == 15 && m == 7 {
        return f32::from_bits(sign | 0x7FC0_0000);
    }
    let mag = if e != 0 {
        ((e + 120) << 23) | (m << 20)
    } else {
        (m as f32 * 0.001_953_125).to_bits()
    };
    f32::from_bits(sign | mag)
}

/// Byte offset of scale `(i, j)` in the swizzled scale layout consumed by cuBLAS / tcgen05,
/// TE's `gemm_swizzled_scale_idx(i, j, num_tiles_X)` (`common/cast/mxfp8/swizzle.cuh`,
/// docs/mxfp8.md §3): 128×4 tiles of 512 bytes, inside a tile `(i%32)*16 + ((i%128)/32)*4 + j%4`.
///
/// Rowwise scales use `i = row`, `j = row block`, `num_tiles_x = ceil(cols/128)`; columnwise
/// scales the transposed view `i = column`, `j = column block`, `num_tiles_x = ceil(rows/128)`.
/// [`super::scale_index`] applies this for a tensor.
#[inline]
pub fn swizzled_scale_index(i: usize, j: usize, num_tiles_x: usize) -> usize {
    let tile = ((i / 128) * num_tiles_x + j / 4) * 512;
    tile + (i % 32) * 16 + ((i % 128) / 32) * 4 + (j % 4)
}

/// bf16 bits → f32 (exact; the `cvt.f32.bf16` upcast of docs/mxfp8.md §7).
#[inline]
pub(crate) fn bf16_bits_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

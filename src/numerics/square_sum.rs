//! The exact sum of squares behind the global gradient norm: the same bits however the
//! gradients are split among ranks, blocks and threads and in whatever order they are added,
//! so the clip is the same at every data-parallel size, layout and ownership, on the host and
//! on the device.
//!
//! Every finite f32 is `M·2^E` with an integer `M < 2^24` and `E ≥ −149`, so its square is the
//! integer `M² < 2^48` at bit `2E + 298 ≥ 0` of a fixed-point number whose last bit weighs
//! `2^−298`. The sum is held as such a number in 32-bit digits ("limbs"), each kept in a u64 so
//! that it takes 2^32 additions before it must carry: integer additions, exact and
//! commutative. The largest square sits below bit 554, so 20 limbs (640 bits) hold the sum of
//! 2^64 of them. The total is rounded to f64 once, to nearest with ties to even. (The idea is
//! the "superaccumulator" of exact floating-point summation, e.g. R. M. Neal, "Fast exact
//! summation using small and large superaccumulators", 2015.)
//!
//! Non-finite values are counted instead: an infinity among the counted gradients makes the
//! total +∞, a NaN anywhere — or an infinity among the gradients only checked, which the
//! previous f64 sum added times 0 — makes it NaN; either skips the step.
//!
//! `kernels/reduce.cu` (`muon_norm_partials`) accumulates the same limbs on the device and
//! `kernels/step.cu` rounds them as [`SquareSum::to_f64`] does.

use crate::numerics::split_workers;

/// Limbs of 32-bit digits.
pub const SQUARE_SUM_LIMBS: usize = 20;

/// Words of a [`SquareSum`]: the limbs, then the infinities counted, then the NaNs.
pub const SQUARE_SUM_WORDS: usize = SQUARE_SUM_LIMBS + 2;

const INFINITIES: usize = SQUARE_SUM_LIMBS;
const NANS: usize = SQUARE_SUM_LIMBS + 1;
const DIGIT: u64 = 0xffff_ffff;

/// Weight of the fixed-point number's last bit: the square of f32's smallest subnormal.
const LAST_BIT_EXPONENT: i64 = -298;

/// Values per block of [`SquareSum::add`]'s windowed sum.
const BLOCK: usize = 512;

/// Binades below a block's largest exponent whose squares the windowed sum adds: a square
/// shifted by up to `2·WINDOW` bits, split at bit 32, stays exact in two u64 sums per block.
const WINDOW: u32 = 16;

/// Blocks between carries: a block adds below `(BLOCK + 2)·2^32` to a limb.
const BLOCKS_PER_CARRY: usize = 1 << 12;

/// An exact Σ x² of f32 values plus their non-finite counts (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SquareSum {
    words: [u64; SQUARE_SUM_WORDS],
}

impl Default for SquareSum {
    fn default() -> Self {
        SquareSum {
            words: [0; SQUARE_SUM_WORDS],
        }
    }
}

impl SquareSum {
    /// The sum as its words (the layout the device gathers and `kernels/step.cu` reads).
    pub fn words(&self) -> [u64; SQUARE_SUM_WORDS] {
        self.words
    }

    /// The sum whose words are `words` (as gathered from a rank); limbs need not be carried.
    pub fn from_words(words: [u64; SQUARE_SUM_WORDS]) -> Self {
        SquareSum { words }
    }

    /// Adds `value · 2^position` (`value < 2^64`) to the limbs.
    fn add_at(&mut self, value: u64, position: u32) {
        let shifted = u128::from(value) << (position % 32);
        let first = (position / 32) as usize;
        for (k, limb) in self.words[first..first + 3].iter_mut().enumerate() {
            *limb += (shifted >> (32 * k)) as u64 & DIGIT;
        }
    }

    /// Carries every limb into the next, leaving digits below 2^32 (the top limb keeps its
    /// excess, which a sum of fewer than 2^64 squares never has).
    fn carry(&mut self) {
        for i in 0..SQUARE_SUM_LIMBS - 1 {
            let carry = self.words[i] >> 32;
            self.words[i] &= DIGIT;
            self.words[i + 1] += carry;
        }
    }

    fn count_non_finite(&mut self, x: f32, counted: bool) {
        let slot = if counted && x.is_infinite() { INFINITIES } else { NANS };
        self.words[slot] += 1;
    }

    /// Adds `Σ (x·scale)²` over `values` (each product rounded to f32, as the updates compute
    /// it) when `counted`; otherwise only counts their non-finite values (gradients another
    /// rank of the norm group counts, still checked for the skip).
    pub fn add(&mut self, values: &[f32], scale: f32, counted: bool) {
        if !counted {
            for &x in values.iter().filter(|x| !(*x * scale).is_finite()) {
                self.count_non_finite(x * scale, false);
            }
            return;
        }
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU supports every feature `add_counted_avx512` is compiled with.
                return unsafe { self.add_counted_avx512(values, scale) };
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU supports every feature `add_counted_avx2` is compiled with.
                return unsafe { self.add_counted_avx2(values, scale) };
            }
        }
        self.add_counted(values, scale);
    }

    /// [`SquareSum::add`] with `values` split among up to `threads` workers of the process's
    /// thread pool ([`split_workers`]): the same words, as the sum is
    /// exact.
    pub fn add_split(&mut self, values: &[f32], scale: f32, counted: bool, threads: usize) {
        let workers = split_workers(values.len(), threads);
        if workers == 1 {
            return self.add(values, scale, counted);
        }
        let mut parts = vec![SquareSum::default(); workers];
        rayon::in_place_scope(|scope| {
            for (part, values) in parts.iter_mut().zip(values.chunks(values.len().div_ceil(workers))) {
                scope.spawn(move |_| part.add(values, scale, counted));
            }
        });
        for part in &parts {
            self.merge(part);
        }
    }

    /// [`SquareSum::add_counted`] compiled with AVX-512 F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2")]
    fn add_counted_avx512(&mut self, values: &[f32], scale: f32) {
        self.add_counted(values, scale);
    }

    /// [`SquareSum::add_counted`] compiled with AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn add_counted_avx2(&mut self, values: &[f32], scale: f32) {
        self.add_counted(values, scale);
    }

    /// The counted sum by blocks of [`BLOCK`] values, carried every [`BLOCKS_PER_CARRY`].
    #[inline(always)]
    fn add_counted(&mut self, values: &[f32], scale: f32) {
        for carried in values.chunks(BLOCK * BLOCKS_PER_CARRY) {
            for block in carried.chunks(BLOCK) {
                self.add_block(block, scale);
            }
            self.carry();
        }
    }

    /// One block's squares. Each is `m² < 2^48` at bit `2f` (`f` = [`half_position`]); those
    /// within [`WINDOW`] binades of the block's largest `f` are summed exactly as
    /// `m²·2^(2(f − base))` split at bit 32 into two u64 sums, in a loop without branches that
    /// vectorizes, and added to the limbs at bit `2·base`; the rest (rare: below 2^−16 of the
    /// block's largest magnitude) and blocks with a non-finite value go one by one.
    #[inline(always)]
    fn add_block(&mut self, block: &[f32], scale: f32) {
        let top = block
            .iter()
            .fold(0u32, |top, &x| top.max(exponent_field((x * scale).to_bits())));
        if top == 0xff {
            for &x in block {
                self.add_one(x * scale);
            }
            return;
        }
        let base = half_position(top).saturating_sub(WINDOW);
        let (mut high, mut low, mut below) = (0u64, 0u64, false);
        for &x in block {
            let bits = (x * scale).to_bits();
            let f = half_position(exponent_field(bits));
            let inside = f >= base;
            let shift = if inside { 2 * (f - base) } else { 0 };
            let keep = if inside { u64::MAX } else { 0 };
            let square = significand_square(bits);
            high += (square >> (32 - shift)) & keep;
            low += (square << shift) & DIGIT & keep;
            below |= !inside;
        }
        if below {
            for &x in block {
                let y = x * scale;
                if half_position(exponent_field(y.to_bits())) < base {
                    self.add_one(y);
                }
            }
        }
        self.add_at(high, 2 * base + 32);
        self.add_at(low, 2 * base);
    }

    /// `x²` at its bit, or `x` counted when it is not finite.
    fn add_one(&mut self, x: f32) {
        let bits = x.to_bits();
        let exponent = exponent_field(bits);
        if exponent == 0xff {
            self.count_non_finite(x, true);
            return;
        }
        self.add_at(significand_square(bits), 2 * half_position(exponent));
    }

    /// Adds another sum (another rank's, another span's): exact, in any order.
    pub fn merge(&mut self, other: &SquareSum) {
        let mut other = *other;
        other.carry();
        self.carry();
        for (a, b) in self.words.iter_mut().zip(other.words) {
            *a += b;
        }
        self.carry();
    }

    /// The sum rounded to the nearest f64 (ties to even); NaN when a NaN (or a checked
    /// infinity) was seen, +∞ when a counted infinity was.
    pub fn to_f64(&self) -> f64 {
        if self.words[NANS] != 0 {
            return f64::NAN;
        }
        if self.words[INFINITIES] != 0 {
            return f64::INFINITY;
        }
        let mut sum = *self;
        sum.carry();
        let limbs = &sum.words[..SQUARE_SUM_LIMBS];
        let Some(top) = limbs.iter().rposition(|&l| l != 0) else {
            return 0.0;
        };
        let limb = |i: usize| u128::from(limbs[i]);
        // The top three limbs as one integer of at least 65 bits whose last bit is bit
        // 32·(top − 2) of the sum (limbs below the first are zero): its top 53 bits are the
        // mantissa, the next the rounding bit, every bit below sticky.
        let window =
            (limb(top) << 64) | (top.checked_sub(1).map_or(0, limb) << 32) | top.checked_sub(2).map_or(0, limb);
        let window_last_bit = 32 * top as i64 - 64;
        let dropped = 128 - i64::from(window.leading_zeros()) - 54;
        let kept = (window >> dropped) as u64;
        let lower_nonzero = top >= 3 && limbs[..top - 2].iter().any(|&l| l != 0);
        let sticky = window & ((1u128 << dropped) - 1) != 0 || lower_nonzero;
        let mut mantissa = kept >> 1;
        if kept & 1 == 1 && (sticky || mantissa & 1 == 1) {
            mantissa += 1;
        }
        scaled(mantissa, LAST_BIT_EXPONENT + window_last_bit + dropped + 1)
    }
}

/// The biased exponent field of the f32 with bits `bits`.
#[inline(always)]
fn exponent_field(bits: u32) -> u32 {
    (bits >> 23) & 0xff
}

/// Half the bit at which the square of a finite f32 with exponent field `exponent` sits:
/// `exponent − 1`, subnormals (field 0) with the smallest normals.
#[inline(always)]
fn half_position(exponent: u32) -> u32 {
    exponent.max(1) - 1
}

/// `m²` for the integer significand `m < 2^24` of the finite f32 with bits `bits`.
#[inline(always)]
fn significand_square(bits: u32) -> u64 {
    let m = (bits & 0x7f_ffff) | (u32::from(exponent_field(bits) != 0) << 23);
    u64::from(m) * u64::from(m)
}

/// `mantissa · 2^exponent`, exact: `mantissa ≤ 2^53` and the result is a normal f64 (the
/// exponents of a sum of squares lie in [−362, 620]).
fn scaled(mantissa: u64, exponent: i64) -> f64 {
    let power = f64::from_bits(((exponent + 1023) as u64) << 52);
    mantissa as f64 * power
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numerics::MIN_ELEMENTS_PER_THREAD;
    use crate::rng::SplitMix64;

    /// Values whose blocks exercise every path: a narrow range (all in the window), every
    /// exponent (most below it), subnormals and zeros, and blocks with infinities or NaNs.
    fn values(rng: &mut SplitMix64) -> Vec<f32> {
        let mut v = Vec::new();
        for block in 0..24 {
            for _ in 0..BLOCK + block * 7 {
                let bits = rng.next_u64() as u32;
                v.push(match block % 4 {
                    0 => f32::from_bits(bits & 0x807f_ffff | 0x3e00_0000 | (bits & 0x0380_0000)),
                    1 => f32::from_bits(bits & 0xff7f_ffff),
                    2 => f32::from_bits(bits & 0x80ff_ffff),
                    _ => f32::from_bits(bits),
                });
            }
        }
        v
    }

    /// Each square added alone: the exact sum the windowed blocks must equal.
    fn one_by_one(values: &[f32], scale: f32) -> SquareSum {
        let mut sum = SquareSum::default();
        for &x in values {
            sum.add_one(x * scale);
        }
        sum.carry();
        sum
    }

    #[test]
    fn a_split_sum_has_the_words_of_one_sum() {
        let mut rng = SplitMix64::new(11);
        let data: Vec<f32> = (0..3 * MIN_ELEMENTS_PER_THREAD + 77)
            .map(|i| {
                if i % 100_003 == 5 {
                    f32::INFINITY
                } else {
                    rng.uniform() * 1e-3
                }
            })
            .collect();
        for counted in [true, false] {
            let mut whole = SquareSum::default();
            whole.add(&data, 0.5, counted);
            for threads in [2, 3, 8] {
                let mut split = SquareSum::default();
                split.add_split(&data, 0.5, counted, threads);
                assert_eq!(split.words(), whole.words(), "{threads} threads, counted {counted}");
            }
        }
    }

    #[test]
    fn every_compiled_variant_equals_adding_each_square_alone() {
        let mut rng = SplitMix64::new(7);
        let data = values(&mut rng);
        for scale in [1.0f32, 0.25, 1.0 / 3.0] {
            let expected = one_by_one(&data, scale);
            let mut portable = SquareSum::default();
            portable.add_counted(&data, scale);
            assert_eq!(portable, expected, "portable, scale {scale}");
            let mut dispatched = SquareSum::default();
            dispatched.add(&data, scale, true);
            assert_eq!(dispatched, expected, "dispatched, scale {scale}");
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx2") {
                    let mut avx2 = SquareSum::default();
                    unsafe { avx2.add_counted_avx2(&data, scale) };
                    assert_eq!(avx2, expected, "avx2, scale {scale}");
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    let mut avx512 = SquareSum::default();
                    unsafe { avx512.add_counted_avx512(&data, scale) };
                    assert_eq!(avx512, expected, "avx512, scale {scale}");
                }
            }
        }
    }
}

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

/// Limbs of 32-bit digits.
pub const SQUARE_SUM_LIMBS: usize = 20;

/// Words of a [`SquareSum`]: the limbs, then the infinities counted, then the NaNs.
pub const SQUARE_SUM_WORDS: usize = SQUARE_SUM_LIMBS + 2;

const INFINITIES: usize = SQUARE_SUM_LIMBS;
const NANS: usize = SQUARE_SUM_LIMBS + 1;
const DIGIT: u64 = 0xffff_ffff;

/// Weight of the fixed-point number's last bit: the square of f32's smallest subnormal.
const LAST_BIT_EXPONENT: i64 = -298;

/// Squares per exponent bucket before the buckets are carried into the limbs: `M² < 2^48`,
/// so a u64 bucket takes 2^16 of them.
const BUCKET_CAPACITY: usize = 1 << 16;

/// Bucket sets of [`SquareSum::add`].
const LANES: usize = 8;

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
        // Eight bucket sets, element i into set i mod 8: consecutive squares of one exponent
        // land in different memory, so the additions do not wait on each other.
        let mut buckets = [[0u64; 256]; LANES];
        for chunk in values.chunks((BUCKET_CAPACITY - 1) * LANES) {
            let groups = chunk.chunks_exact(LANES);
            let rest = groups.remainder();
            for group in groups {
                for (lane, &x) in group.iter().enumerate() {
                    self.add_square(&mut buckets[lane], x * scale);
                }
            }
            for (lane, &x) in rest.iter().enumerate() {
                self.add_square(&mut buckets[lane], x * scale);
            }
            for lane in buckets.iter_mut() {
                for (half_position, bucket) in lane.iter_mut().enumerate() {
                    if *bucket != 0 {
                        self.add_at(*bucket, 2 * half_position as u32);
                        *bucket = 0;
                    }
                }
            }
            self.carry();
        }
    }

    /// `x²` into the bucket of its bit position (`2·(exponent field − 1)`, subnormals with the
    /// smallest normals), or `x` counted when it is not finite.
    #[inline(always)]
    fn add_square(&mut self, buckets: &mut [u64; 256], x: f32) {
        let bits = x.to_bits();
        let exponent = (bits >> 23) & 0xff;
        if exponent == 0xff {
            self.count_non_finite(x, true);
            return;
        }
        let m = u64::from(bits & 0x7f_ffff) | (u64::from(exponent != 0) << 23);
        buckets[exponent.saturating_sub(1) as usize] += m * m;
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

/// `mantissa · 2^exponent`, exact: `mantissa ≤ 2^53` and the result is a normal f64 (the
/// exponents of a sum of squares lie in [−362, 620]).
fn scaled(mantissa: u64, exponent: i64) -> f64 {
    let power = f64::from_bits(((exponent + 1023) as u64) << 52);
    mantissa as f64 * power
}

//! The tests' one generator, SplitMix64 (the library's own, `muon_opt::rng`), as a seeded stream
//! and as a hash of coordinates.

use muon_opt::rng::SplitMix64;

/// A seeded stream of test data.
pub struct Rng(SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(SplitMix64::new(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in [0, 1), f64 (unlike `SplitMix64::uniform`, f32 in [-1, 1)).
    pub fn unit_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.unit_f64();
        let u2 = self.unit_f64();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// `n` normal values times `scale`, as f32.
    pub fn normal_vec(&mut self, n: usize, scale: f64) -> Vec<f32> {
        (0..n).map(|_| (self.normal() * scale) as f32).collect()
    }
}

/// A well-mixed hash of `seed`: the first value of its stream.
pub fn mix(seed: u64) -> u64 {
    Rng::new(seed).next_u64()
}

/// A hash of a name, to key values by param name.
pub fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0, |h, b| mix(h ^ u64::from(b)))
}

/// A value in [-1, 1) drawn from `seed`.
pub fn noise(seed: u64) -> f32 {
    SplitMix64::new(seed).uniform()
}

/// One of the 2001 values -1, -0.999, …, 1 drawn from `seed`.
pub fn milli(seed: u64) -> f32 {
    (mix(seed) % 2001) as f32 / 1000.0 - 1.0
}

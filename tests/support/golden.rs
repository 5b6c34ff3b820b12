//! The golden vectors of `tests/data/golden` (computed outside this project; see its README)
//! and the little-endian decoding of them and of checkpoint tensors.

/// The golden-vector directory.
pub const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/golden");

/// Largest element error of bf16 Newton–Schulz (5 steps) against the golden f64 truth, host
/// and device alike: the host's worst case is 0.0312 (8 × 8, simple coefficients), the H200's
/// 0.0312 too (bench/device/2026-11-28-h200.json's run; the f32 accumulation order of cuBLAS
/// moves it in the fifth digit).
pub const NS_BF16_BOUND: f64 = 0.05;

/// The bytes of golden file `name` (relative to [`DIR`]).
pub fn read(name: &str) -> Vec<u8> {
    let path = format!("{DIR}/{name}");
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Golden file `name` as little-endian f32 values.
pub fn read_f32(name: &str) -> Vec<f32> {
    f32_from_le(&read(name))
}

/// Golden file `name` as little-endian f64 values.
pub fn read_f64(name: &str) -> Vec<f64> {
    read(name)
        .chunks_exact(8)
        .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// Little-endian f32 values.
pub fn f32_from_le(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

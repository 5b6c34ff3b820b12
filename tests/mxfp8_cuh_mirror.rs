//! `kernels/mxfp8.cuh` (the device functions of the CUDA quantize kernel) against their Rust
//! mirror in `numerics::mxfp8`: the header is compiled as plain C++ with the system `g++`
//! (-O2, no fast-math), a driver dumps its results over all 65,536 bf16 inputs for a set of
//! scale bytes (the exact expression the kernel evaluates per element), over all bf16 amax
//! values, and over samples of f32 inputs, and the bytes are compared with the Rust results.
//!
//! Without `g++` the test prints a notice and passes, unless `MUON_REQUIRE_CXX=1` is set.

mod support;

use std::process::Command;

use muon_opt::numerics::mxfp8::{
    e4m3_to_f32, e8m0_from_amax, f32_to_e4m3, float_to_e8m0, scale, scale_inv, swizzled_scale_index,
};
use support::tempdir::TempDir;

/// Scale bytes for the per-element check: both ends, the values around typical data, the
/// largest finite-amax scale (0xF7 = 247), the subnormal inverse scale (254) and NaN (255).
const SCALE_BYTES: [u8; 13] = [0, 1, 10, 11, 100, 117, 127, 134, 200, 247, 253, 254, 255];

/// Every `F32_STRIDE`-th f32 bit pattern is in the f32 sample.
const F32_STRIDE: u64 = 65_521;

const DRIVER: &str = r#"
#include "mxfp8.cuh"
#include <cstdio>
#include <cstdlib>

static FILE *out;

static void put_u8(unsigned v) { std::fputc((int)(v & 0xFFu), out); }
static void put_u32(unsigned v) { for (int k = 0; k < 4; ++k) put_u8(v >> (8 * k)); }
static void put_u64(unsigned long long v) { for (int k = 0; k < 8; ++k) put_u8((unsigned)(v >> (8 * k))); }

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    out = std::fopen(argv[1], "wb");
    if (!out) return 3;
    const unsigned long long stride = std::strtoull(argv[2], nullptr, 10);
    static const unsigned char scales[] = {SCALES};
    // 1. The kernel's per-element expression for every bf16 input and scale byte.
    for (unsigned char b : scales) {
        const float s = muon_mx_scale_inv(b);
        for (unsigned x = 0; x < 65536u; ++x) put_u8(muon_mx_encode_bf16((unsigned short)x, s));
    }
    // 2. The scale byte of every bf16 amax, and its amax key.
    for (unsigned x = 0; x < 65536u; ++x) {
        put_u8(muon_mx_e8m0_from_amax(muon_mx_bf16_to_f32((unsigned short)x)));
        put_u32(muon_mx_amax_key_bf16((unsigned short)x));
    }
    // 3. A sample of all f32 bit patterns through the scalar functions.
    for (unsigned long long v = 0; v <= 0xFFFFFFFFull; v += stride) {
        const float f = muon_mx_bits_to_f32((unsigned)v);
        put_u8(muon_mx_f32_to_e4m3(f));
        put_u8(muon_mx_float_to_e8m0(f));
        put_u8(muon_mx_e8m0_from_amax(f));
        put_u32(muon_mx_amax_key_f32(f));
    }
    // 4. Byte-indexed tables.
    for (unsigned b = 0; b < 256u; ++b) {
        put_u32(muon_mx_f32_to_bits(muon_mx_scale_inv((unsigned char)b)));
        put_u32(muon_mx_f32_to_bits(muon_mx_scale((unsigned char)b)));
        put_u32(muon_mx_f32_to_bits(muon_mx_e4m3_to_f32((unsigned char)b)));
    }
    // 5. Swizzled indices.
    for (unsigned long long ntx = 1; ntx <= 3; ++ntx)
        for (unsigned long long i = 0; i < 400; i += 3)
            for (unsigned long long j = 0; j < 4 * ntx; ++j) put_u64(muon_mx_swizzled_scale_index(i, j, ntx));
    return std::fclose(out) == 0 ? 0 : 4;
}
"#;

/// The same stream computed by the Rust mirror.
fn expected() -> Vec<u8> {
    let mut v = Vec::new();
    let bf16 = |x: u16| f32::from_bits(u32::from(x) << 16);
    for b in SCALE_BYTES {
        let s = scale_inv(b);
        v.extend((0..=u16::MAX).map(|x| f32_to_e4m3(bf16(x) * s)));
    }
    for x in 0..=u16::MAX {
        v.push(e8m0_from_amax(bf16(x)));
        let a = u32::from(x & 0x7FFF);
        v.extend_from_slice(&(if a > 0x7F80 { 0 } else { a }).to_le_bytes());
    }
    for bits in (0..=u64::from(u32::MAX)).step_by(F32_STRIDE as usize) {
        let f = f32::from_bits(bits as u32);
        v.extend([f32_to_e4m3(f), float_to_e8m0(f), e8m0_from_amax(f)]);
        let a = f.to_bits() & 0x7FFF_FFFF;
        v.extend_from_slice(&(if a > 0x7F80_0000 { 0 } else { a }).to_le_bytes());
    }
    for b in 0..=u8::MAX {
        for f in [scale_inv(b), scale(b), e4m3_to_f32(b)] {
            v.extend_from_slice(&f.to_bits().to_le_bytes());
        }
    }
    for ntx in 1..=3usize {
        for i in (0..400).step_by(3) {
            for j in 0..4 * ntx {
                v.extend_from_slice(&(swizzled_scale_index(i, j, ntx) as u64).to_le_bytes());
            }
        }
    }
    v
}

#[test]
fn cuh_device_functions_equal_the_rust_mirror() {
    let required = std::env::var("MUON_REQUIRE_CXX").is_ok_and(|v| v == "1");
    if Command::new("g++").arg("--version").output().is_err() {
        assert!(!required, "MUON_REQUIRE_CXX=1 but g++ was not found");
        eprintln!("notice: g++ not found; skipping the kernels/mxfp8.cuh host check");
        return;
    }
    let kernels = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels");
    let tmp = TempDir::new("mxfp8-cuh-mirror");
    let source = tmp.join("mxfp8_mirror.cpp");
    let exe = tmp.join("mxfp8_mirror");
    let dump = tmp.join("mxfp8_mirror.bin");
    let scales: Vec<String> = SCALE_BYTES.iter().map(|b| b.to_string()).collect();
    let program = DRIVER.replace("SCALES", &scales.join(", "));
    std::fs::write(&source, program).expect("write driver");
    let compile = Command::new("g++")
        .args(["-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-I", kernels])
        .arg(&source)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run g++");
    assert!(
        compile.status.success(),
        "g++ failed:\n{}",
        String::from_utf8_lossy(&compile.stderr)
    );
    let run = Command::new(&exe)
        .arg(&dump)
        .arg(F32_STRIDE.to_string())
        .output()
        .expect("run driver");
    assert!(run.status.success(), "driver failed: {:?}", run.status);
    let got = std::fs::read(&dump).expect("read dump");
    let want = expected();
    assert_eq!(got.len(), want.len(), "stream length");
    if let Some(k) = got.iter().zip(&want).position(|(a, b)| a != b) {
        panic!(
            "first difference at byte {k}: C++ {:#04x}, Rust {:#04x}",
            got[k], want[k]
        );
    }
}

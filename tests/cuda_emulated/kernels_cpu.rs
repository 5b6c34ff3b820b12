//! The real kernels of `kernels/*.cu` on the CPU: `tests/kernels_cpu/launch.cpp` (the
//! unchanged sources through `tests/kernels_cpu/cuda_cpu.h`) built by the system `g++` into a
//! shared library once per test process (kept under the target directory, so a sanitizer's
//! report names the kernel's lines), and called for every launch with the launch's grid,
//! block and arguments, as cuLaunchKernel takes them.
//!
//! `MUON_KERNELS_SANITIZE` builds it under a sanitizer: `address` (AddressSanitizer and
//! UndefinedBehaviorSanitizer: compute-sanitizer memcheck's out-of-bounds, misaligned and
//! undefined-operation class) or `thread` (ThreadSanitizer: racecheck's races between the
//! threads of a block); the process must then start with the sanitizer's runtime
//! (`LD_PRELOAD`, as `scripts/test-kernels.sh` does). Without `g++` the emulated tests cannot
//! run the kernels: they fail when `MUON_REQUIRE_CXX=1`, else they are skipped by [`available`].

use std::ffi::{CString, c_char, c_void};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use muon_opt::backend::cuda::action::{Arg, Launch};

type LaunchFn = unsafe extern "C" fn(*const c_char, *const u32, *const u32, *mut *mut c_void) -> i32;

struct Kernels {
    launch: LaunchFn,
    _library: libloading::Library,
}

/// The library, built on first use; None without `g++`.
fn kernels() -> Option<&'static Kernels> {
    static KERNELS: OnceLock<Option<Kernels>> = OnceLock::new();
    KERNELS.get_or_init(build).as_ref()
}

/// Whether the real kernels can run here (prints why not, once).
pub fn available() -> bool {
    kernels().is_some()
}

fn build() -> Option<Kernels> {
    let required = std::env::var("MUON_REQUIRE_CXX").is_ok_and(|v| v == "1");
    if Command::new("g++").arg("--version").output().is_err() {
        assert!(!required, "MUON_REQUIRE_CXX=1 but g++ was not found");
        eprintln!("SKIPPED: g++ not found; the emulated device runs the kernels of kernels/*.cu built by it");
        return None;
    }
    let sanitize = std::env::var("MUON_KERNELS_SANITIZE").unwrap_or_default();
    let flags: &[&str] = match sanitize.as_str() {
        "" => &[],
        "address" => &[
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer",
        ],
        "thread" => &["-fsanitize=thread"],
        other => panic!("MUON_KERNELS_SANITIZE={other}: address, thread or unset"),
    };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kernels_cpu");
    std::fs::create_dir_all(&dir).unwrap();
    let library = dir.join(format!("libmuon_kernels_cpu-{}-{}.so", std::process::id(), sanitize));
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("g++")
        .args([
            "-std=c++20",
            "-O1",
            "-g",
            "-ffp-contract=off",
            "-fPIC",
            "-shared",
            "-Wall",
            "-Wextra",
            "-Werror",
        ])
        .args(flags)
        .arg(format!("-I{root}/kernels"))
        .arg(format!("{root}/tests/kernels_cpu/launch.cpp"))
        .arg("-o")
        .arg(&library)
        .output()
        .expect("run g++");
    assert!(
        out.status.success(),
        "g++ failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // SAFETY: the library was just built from our sources; its initializers only set up
    // statics.
    let lib = unsafe { libloading::Library::new(&library) }.expect("load the CPU kernels");
    // SAFETY: `muon_cpu_launch` has this signature in launch.cpp.
    let launch = *unsafe { lib.get::<LaunchFn>(b"muon_cpu_launch\0") }.expect("muon_cpu_launch");
    Some(Kernels { launch, _library: lib })
}

/// Runs `launch` with the real kernel; its pointer arguments are the emulator's host
/// addresses.
pub fn launch(launch: &Launch) {
    let kernels = kernels().expect("the emulated tests check kernels_cpu::available() first");
    let mut args: Vec<Vec<u64>> = launch.args.iter().map(Arg::words).collect();
    let mut params: Vec<*mut c_void> = args.iter_mut().map(|w| w.as_mut_ptr().cast()).collect();
    let name = CString::new(launch.kernel.name()).unwrap();
    // SAFETY: the arguments match the kernel's signature (the translator builds them per kernel,
    // `cuda_translation.rs` checks them against the PTX) and point into live allocations.
    let status = unsafe {
        (kernels.launch)(
            name.as_ptr(),
            launch.grid.as_ptr(),
            launch.block.as_ptr(),
            params.as_mut_ptr(),
        )
    };
    assert_eq!(status, 0, "{} is not a kernel of kernels/*.cu", launch.kernel.name());
}

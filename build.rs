//! Writes include/muon_opt.h with cbindgen (the version macros come from Cargo.toml) and sets
//! the shared library's soname.

use std::env;
use std::path::{Path, PathBuf};

fn after_includes() -> String {
    let part = |name: &str| {
        env::var(name)
            .expect("cargo sets CARGO_PKG_VERSION_*")
            .parse::<u32>()
            .expect("numeric version")
    };
    let (major, minor, patch) = (
        part("CARGO_PKG_VERSION_MAJOR"),
        part("CARGO_PKG_VERSION_MINOR"),
        part("CARGO_PKG_VERSION_PATCH"),
    );
    format!(
        r#"
#define MUON_VERSION_MAJOR {major}
#define MUON_VERSION_MINOR {minor}
#define MUON_VERSION_PATCH {patch}
#define MUON_VERSION_CODE {code}

#ifndef MUON_API
#define MUON_API
#endif

#ifndef MUON_NODISCARD
#if (defined(__cplusplus) && __cplusplus >= 201703L) || \
    (!defined(__cplusplus) && defined(__STDC_VERSION__) && __STDC_VERSION__ >= 202311L)
#define MUON_NODISCARD [[nodiscard]]
#elif defined(__GNUC__) || defined(__clang__)
#define MUON_NODISCARD __attribute__((warn_unused_result))
#else
#define MUON_NODISCARD
#endif
#endif

/* The types behind cudaStream_t and ncclComm_t, so no CUDA or NCCL header is needed. */
struct CUstream_st;
struct ncclComm;
"#,
        code = major * 10_000 + minor * 100 + patch
    )
}

/// A program linked in the build tree (`-L target/release -lmuon_opt`) records the soname and
/// loads `libmuon_opt.so.<abi>` at run time: the link to the library cargo writes beside it
/// (`OUT_DIR` is `<target>/<profile>/build/<package>/out`). Made before the library exists.
fn link_soname(abi: &str) {
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let Some(profile) = out.ancestors().nth(3) else {
        return;
    };
    let link = profile.join(format!("libmuon_opt.so.{abi}"));
    if std::fs::read_link(&link).is_ok_and(|target| target == Path::new("libmuon_opt.so")) {
        return;
    }
    let _ = std::fs::remove_file(&link);
    if let Err(err) = std::os::unix::fs::symlink("libmuon_opt.so", &link) {
        println!("cargo:warning=could not link {}: {err}", link.display());
    }
}

fn main() {
    let crate_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-changed=Cargo.toml");
    // The soname carries the ABI version: MAJOR from 1.0 on; before 1.0 every minor version may
    // change the ABI (the header says so), so 0.MINOR — cargo-c's convention.
    let major = env::var("CARGO_PKG_VERSION_MAJOR").expect("cargo sets CARGO_PKG_VERSION_MAJOR");
    let minor = env::var("CARGO_PKG_VERSION_MINOR").expect("cargo sets CARGO_PKG_VERSION_MINOR");
    let abi = if major == "0" { format!("0.{minor}") } else { major };
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmuon_opt.so.{abi}");
    link_soname(&abi);
    let mut config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml parses");
    config.after_includes = Some(after_includes());
    let include = crate_dir.join("include");
    // Only the C layer (src/capi and the modules it declares) is parsed, so nothing of the
    // safe core leaks into the header.
    let builder = cbindgen::Builder::new()
        .with_config(config)
        .with_src(crate_dir.join("src/capi/mod.rs"));
    match builder.generate() {
        Ok(bindings) => {
            bindings.write_to_file(include.join("muon_opt.h"));
        }
        Err(err) => println!("cargo:warning=cbindgen could not generate include/muon_opt.h: {err}"),
    }
    println!("cargo:include={}", include.display());
}

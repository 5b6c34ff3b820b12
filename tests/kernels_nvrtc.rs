//! Every `kernels/*.cu` compiles through NVRTC to PTX and CUBIN for Hopper (compute_90,
//! sm_90) and, with an NVRTC that knows it (12.8+), Blackwell (compute_100, sm_100). CI runs it
//! with NVRTC 13.0 and again with NVRTC 12.4, the oldest the library supports
//! (`MUON_NVRTC_MAJOR` says which it expects). Skips with a notice when NVRTC is absent,
//! unless MUON_REQUIRE_NVRTC=1 (CI sets it), in which case absence is a failure.

use muon_opt::backend::cuda::nvrtc::{self, SOURCES, Target};

fn nvrtc_or_skip() -> bool {
    if nvrtc::available() {
        return true;
    }
    assert!(
        std::env::var("MUON_REQUIRE_NVRTC").as_deref() != Ok("1"),
        "MUON_REQUIRE_NVRTC=1 but neither libnvrtc.so.13 nor libnvrtc.so.12 loads (LD_LIBRARY_PATH={:?})",
        std::env::var("LD_LIBRARY_PATH").ok()
    );
    eprintln!("SKIPPED: NVRTC not available; set MUON_REQUIRE_NVRTC=1 to make this a failure");
    false
}

#[test]
fn every_kernel_file_is_embedded() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels");
    let mut on_disk: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".cu"))
        .collect();
    on_disk.sort();
    let mut embedded: Vec<String> = SOURCES.iter().map(|s| s.name.to_string()).collect();
    embedded.sort();
    assert_eq!(
        on_disk, embedded,
        "kernels/*.cu and nvrtc::SOURCES must list the same files"
    );
    for source in SOURCES {
        let on_disk = std::fs::read_to_string(format!("{dir}/{}", source.name)).unwrap();
        assert_eq!(on_disk, source.text);
    }
}

#[test]
fn every_kernel_compiles_for_hopper_and_blackwell() {
    if !nvrtc_or_skip() {
        return;
    }
    let (major, minor) = nvrtc::version().expect("NVRTC loads");
    let expected: i32 =
        std::env::var("MUON_NVRTC_MAJOR").map_or(13, |v| v.parse().expect("MUON_NVRTC_MAJOR is a number"));
    assert_eq!(
        major, expected,
        "NVRTC {major}.{minor} loaded, {expected}.x expected (MUON_NVRTC_MAJOR)"
    );
    assert!(
        (major, minor) >= (12, 4),
        "NVRTC {major}.{minor} is older than the supported 12.4"
    );
    let architectures: &[u32] = if (major, minor) >= (12, 8) { &[90, 100] } else { &[90] };
    for source in SOURCES {
        let kernels: Vec<&str> = source
            .text
            .split("extern \"C\" __global__ void ")
            .skip(1)
            .filter_map(|rest| {
                let rest = rest.trim_start();
                let rest = match rest.strip_prefix("__launch_bounds__(") {
                    Some(bounds) => bounds.split_once(')').map_or("", |(_, after)| after).trim_start(),
                    None => rest,
                };
                rest.split('(').next()
            })
            .collect();
        assert!(!kernels.is_empty(), "{} defines no extern \"C\" kernel", source.name);
        for &cc in architectures {
            let ptx = String::from_utf8(nvrtc::compile(source, Target::Ptx(cc)).unwrap()).unwrap();
            assert!(
                ptx.contains(&format!(".target sm_{cc}")),
                "{}: PTX for compute_{cc} lacks its target",
                source.name
            );
            for kernel in &kernels {
                assert!(
                    ptx.contains(&format!(".entry {kernel}(")),
                    "{}: PTX lacks entry {kernel}",
                    source.name
                );
            }
            let cubin = nvrtc::compile(source, Target::Cubin(cc)).unwrap();
            assert_eq!(
                &cubin[..4],
                b"\x7fELF",
                "{}: sm_{cc} output is not a CUBIN (ELF)",
                source.name
            );
        }
    }
}

#[test]
fn a_broken_kernel_reports_the_nvrtc_log() {
    if !nvrtc_or_skip() {
        return;
    }
    let broken = nvrtc::Source {
        name: "broken.cu",
        text: "extern \"C\" __global__ void k() { undefined_call(); }",
    };
    let err = nvrtc::compile(&broken, Target::Ptx(90)).unwrap_err();
    assert_eq!(err.kind, muon_opt::error::ErrorKind::KernelCompileFailed);
    assert!(err.message.contains("undefined_call"), "{}", err.message);
}

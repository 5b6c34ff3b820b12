//! The committed header exposes only `muon_*` / `MUON_*` names (plus the two borrowed CUDA and
//! NCCL types) and declares every status the library can return.

const HEADER: &str = include_str!("../include/muon_opt.h");

#[test]
fn header_exposes_only_muon_names() {
    for line in HEADER.lines() {
        if let Some(rest) = line.strip_prefix("#define ") {
            let name = rest.split_whitespace().next().unwrap();
            assert!(name.starts_with("MUON_"), "macro {name} lacks the MUON_ prefix");
        }
        for keyword in ["struct ", "enum "] {
            if let Some(rest) = line.strip_prefix(keyword) {
                let name = rest
                    .trim_end_matches([';', '{', ' '])
                    .split_whitespace()
                    .next()
                    .unwrap();
                assert!(
                    name.starts_with("muon_") || name == "CUstream_st" || name == "ncclComm",
                    "type {name} lacks the muon_ prefix"
                );
            }
        }
        if line.contains('(') && !line.starts_with(' ') && !line.starts_with('#') && !line.starts_with('/') {
            let before_paren = line.split('(').next().unwrap();
            let name = before_paren.split_whitespace().last().unwrap().trim_start_matches('*');
            assert!(
                name.starts_with("muon_"),
                "function {name} lacks the muon_ prefix: {line}"
            );
        }
    }
}

#[test]
fn header_declares_every_status_and_uses_tagged_borrowed_types() {
    for status in muon_opt::capi::status::muon_status_t::ALL {
        let name = format!("{status:?}");
        assert!(
            HEADER.contains(&format!("{name} = {}", *status as u32)),
            "{name} missing from the header"
        );
    }
    assert!(HEADER.contains("struct CUstream_st *stream"));
    assert!(HEADER.contains("struct ncclComm *nccl"));
    assert!(!HEADER.contains("#include <cuda") && !HEADER.contains("#include <nccl"));
}

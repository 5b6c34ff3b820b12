//! `muon-opt inspect DIR`: the summary of a checkpoint, every file's checksum verified; a
//! damaged file fails the command with exit code 2.

mod checkpoint_harness;
mod common;

use std::process::Command;

use checkpoint_harness::{Group, TempDir, all_ok, config};
use muon_opt::checkpoint::inspect::inspect;
use muon_opt::config::MuonLayout;
use muon_opt::model::Route;

fn muon_opt(args: &[&std::ffi::OsStr]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_muon-opt"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn inspect_summarizes_and_verifies_a_checkpoint() {
    let tmp = TempDir::new("inspect");
    let dir = tmp.join("ckpt");
    let mut group = Group::new(&config(MuonLayout::Padded), 3);
    group.train(4);
    all_ok(group.save(&dir), "save");

    let summary = inspect(&dir).unwrap();
    assert!(summary.verified());
    assert_eq!((summary.dp, summary.step, summary.layout), (3, 4, MuonLayout::Padded));
    assert_eq!(summary.files.len(), 3);
    let muon = summary.routes.iter().find(|r| r.route == Route::Muon).unwrap();
    assert_eq!(muon.bytes, muon.items * 8, "master and momentum per Muon item");
    let adamw = summary.routes.iter().find(|r| r.route == Route::Adamw).unwrap();
    assert_eq!(adamw.bytes, adamw.items * 12, "master and two moments per AdamW item");

    let (code, text, err) = muon_opt(&["inspect".as_ref(), dir.as_os_str()]);
    assert_eq!(code, 0, "{err}");
    for needle in [
        "step 4, dp 3, padded layout",
        "rank-00002.safetensors",
        "verified  3 of 3 files",
        "muon",
    ] {
        assert!(text.contains(needle), "missing '{needle}' in:\n{text}");
    }
    let (code, json, _) = muon_opt(&["inspect".as_ref(), dir.as_os_str(), "--json".as_ref()]);
    assert_eq!(code, 0);
    let parsed: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(parsed["step"], 4);
    assert_eq!(parsed["files"].as_array().unwrap().len(), 3);

    let rank1 = dir.join("rank-00001.safetensors");
    let mut bytes = std::fs::read(&rank1).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x10;
    std::fs::write(&rank1, &bytes).unwrap();
    let (code, text, err) = muon_opt(&["inspect".as_ref(), dir.as_os_str()]);
    assert_eq!(code, 2);
    assert!(text.contains("FAILED: CRC-32"), "{text}");
    assert!(err.contains("1 of 3 files"), "{err}");

    let (code, _, err) = muon_opt(&["inspect".as_ref(), tmp.join("missing").as_os_str()]);
    assert_eq!(code, 2);
    assert!(err.contains("index.json"), "{err}");
}

/// Identical state gives identical checkpoint bytes, file for file, so users can deduplicate
/// and diff checkpoints (safetensors' own metadata order is random per process).
#[test]
fn saving_identical_state_twice_writes_identical_bytes() {
    let tmp = TempDir::new("deterministic");
    let (a, b) = (tmp.join("a"), tmp.join("b"));
    let mut group = Group::new(&config(MuonLayout::Compact), 2);
    group.train(2);
    all_ok(group.save(&a), "save a");
    all_ok(group.save(&b), "save b");
    let mut names: Vec<_> = std::fs::read_dir(&a).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert!(names.len() >= 3, "index and two rank files: {names:?}");
    for name in names {
        let (x, y) = (
            std::fs::read(a.join(&name)).unwrap(),
            std::fs::read(b.join(&name)).unwrap(),
        );
        assert!(x == y, "{name:?} differs between two saves of the same state");
    }
    // And the canonical header still loads.
    all_ok(group.load(&b), "load");
}

//! `muon-opt inspect DIR`: the summary of a checkpoint, every file's checksum verified; a
//! damaged file fails the command with exit code 2.

mod support;

use std::process::Command;

use muon_opt::checkpoint::inspect::inspect;
use muon_opt::config::MuonLayout;
use muon_opt::model::Route;
use support::checkpoint::{Group, all_ok, config};
use support::golden::f32_from_le;
use support::tempdir::TempDir;
use support::training::bits;

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

/// `muon-opt export`: every param's fp32 master, assembled from the shards of all ranks, in
/// one safetensors file keyed by param name; bitwise the masters the ranks hold.
#[test]
fn export_merges_the_shards_into_full_fp32_masters() {
    let tmp = TempDir::new("export");
    let dir = tmp.join("ckpt");
    let mut group = Group::new(&config(MuonLayout::Compact), 3);
    group.train(3);
    all_ok(group.save(&dir), "save");
    let snapshot = group.snapshot();
    let out = tmp.join("model.safetensors");
    std::fs::write(&out, b"an older export").unwrap();

    let (code, text, err) = muon_opt(&["export".as_ref(), dir.as_os_str(), out.as_os_str()]);
    assert_eq!(code, 0, "{err}");
    assert!(text.contains(&format!("wrote {} params", group.specs.len())), "{text}");
    let bytes = std::fs::read(&out).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(file.len(), group.specs.len());
    for (p, spec) in group.specs.iter().enumerate() {
        let tensor = file.tensor(&spec.name).unwrap();
        assert_eq!(tensor.dtype(), safetensors::Dtype::F32);
        let shape: Vec<u64> = tensor.shape().iter().map(|&d| d as u64).collect();
        assert_eq!(shape, spec.shape, "{}", spec.name);
        assert!(
            bits(&f32_from_le(tensor.data())) == bits(&snapshot.state[p][0]),
            "{}: exported values differ from the master",
            spec.name
        );
    }
    let (_, metadata) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(metadata.metadata().as_ref().unwrap()["step"], "3");

    // A damaged master tensor: the export fails naming the file, and the earlier export stays.
    let rank1 = dir.join("rank-00001.safetensors");
    let mut damaged = std::fs::read(&rank1).unwrap();
    let (header_len, header) = safetensors::SafeTensors::read_metadata(&damaged).unwrap();
    let (_, info) = header
        .tensors()
        .into_iter()
        .find(|(key, _)| key.contains("/master@"))
        .unwrap();
    damaged[8 + header_len + info.data_offsets.0] ^= 0x40;
    std::fs::write(&rank1, &damaged).unwrap();
    let (code, _, err) = muon_opt(&["export".as_ref(), dir.as_os_str(), out.as_os_str()]);
    assert_eq!(code, 2);
    assert!(
        err.contains("rank-00001.safetensors") && err.contains("checksum"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&out).unwrap(),
        bytes,
        "a failed export leaves the target as it was"
    );
    assert!(!tmp.join("model.safetensors.partial").exists());
}

/// `muon-opt inspect --params`: every param with its components and the rank files holding
/// each component, in text and JSON.
#[test]
fn inspect_params_lists_components_and_their_pieces() {
    let tmp = TempDir::new("inspect-params");
    let dir = tmp.join("ckpt");
    let mut group = Group::new(&config(MuonLayout::Compact), 2);
    group.train(1);
    all_ok(group.save(&dir), "save");
    let (code, text, err) = muon_opt(&["inspect".as_ref(), dir.as_os_str(), "--params".as_ref()]);
    assert_eq!(code, 0, "{err}");
    for needle in [
        "layers.0.qkv.weight 96x32 bf16 muon",
        "  layers.0.qkv.weight/part2 32x32  rank-0000",
        "  layers.1.experts.fc1/expert3/part1 24x32  rank-0000",
        "embedding.weight 64x32 bf16 adamw",
    ] {
        assert!(text.contains(needle), "missing '{needle}' in:\n{text}");
    }
    let (code, json, _) = muon_opt(&[
        "inspect".as_ref(),
        dir.as_os_str(),
        "--params".as_ref(),
        "--json".as_ref(),
    ]);
    assert_eq!(code, 0);
    let parsed: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(parsed["schema_version"], muon_opt::SCHEMA_VERSION);
    let params = parsed["param_components"].as_array().unwrap();
    assert_eq!(params.len(), group.specs.len());
    let experts = params.iter().find(|p| p["name"] == "layers.0.experts.fc1").unwrap();
    assert_eq!(
        experts["components"].as_array().unwrap().len(),
        8,
        "4 experts x 2 parts"
    );
}

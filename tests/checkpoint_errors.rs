//! Bad input on load: each case gives a distinct status with a message, the same status on
//! every rank, and changes nothing in memory on any rank.

mod support;

use std::path::{Path, PathBuf};

use muon_opt::checkpoint::FORMAT_VERSION;
use muon_opt::config::{Config, MuonLayout, NsMethod};
use muon_opt::error::{Error, ErrorKind, Result};
use muon_opt::model::{ParamFlags, ParamSpec};
use support::checkpoint::{Group, Snapshot, all_ok, config, model};
use support::tempdir::TempDir;

/// A checkpoint saved at dp=3 after two steps.
fn saved(label: &str) -> (TempDir, PathBuf) {
    let tmp = TempDir::new(label);
    let dir = tmp.join("ckpt");
    let mut group = Group::new(&config(MuonLayout::Compact), 3);
    group.train(2);
    all_ok(group.save(&dir), "save");
    (tmp, dir)
}

/// A trained dp=2 group that the failed loads must leave untouched.
fn victim(cfg: &Config, specs: &[ParamSpec]) -> (Group, Snapshot) {
    let mut group = Group::with_model(cfg, 2, specs);
    group.train(1);
    let before = group.snapshot();
    (group, before)
}

/// Loads `dir` into `group`, expects the same error kind on every rank, checks that nothing
/// changed, and returns the first rank's error.
fn failed_load(group: &mut Group, before: &Snapshot, dir: &Path, label: &str) -> Error {
    let results: Vec<Result<()>> = group.load(dir);
    let errors: Vec<Error> = results
        .into_iter()
        .map(|r| r.expect_err(&format!("{label}: load must fail")))
        .collect();
    for e in &errors {
        assert_eq!(e.kind, errors[0].kind, "{label}: ranks disagree: {errors:?}");
    }
    group
        .snapshot()
        .assert_same(before, &format!("{label}: state after the failed load"));
    errors
        .into_iter()
        .find(|e| !e.message.contains("failed on rank"))
        .unwrap_or_else(|| panic!("{label}: no rank has the cause"))
}

#[test]
fn flipping_any_sampled_byte_of_any_file_is_detected() {
    let (_tmp, dir) = saved("flip");
    let (mut group, before) = victim(&config(MuonLayout::Padded), &model());
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), 4);
    let mut checked = 0;
    for name in names {
        let path = dir.join(&name);
        let original = std::fs::read(&path).unwrap();
        let n = original.len();
        let mut positions: Vec<usize> = (0..12).chain(n - 12..n).collect();
        positions.extend((0..40).map(|i| (i * 7919 + 13) % n));
        for (i, &pos) in positions.iter().enumerate() {
            let mut bytes = original.clone();
            bytes[pos] ^= [0x01, 0x80, 0xff, 0x20][i % 4];
            std::fs::write(&path, &bytes).unwrap();
            let label = format!("{name} byte {pos}");
            let err = failed_load(&mut group, &before, &dir, &label);
            let allowed: &[ErrorKind] = if name == "index.json" {
                &[
                    ErrorKind::CheckpointCorrupt,
                    ErrorKind::CheckpointVersion,
                    ErrorKind::CheckpointMismatch,
                ]
            } else {
                &[ErrorKind::CheckpointCorrupt]
            };
            assert!(allowed.contains(&err.kind), "{label}: {err:?}");
            checked += 1;
        }
        std::fs::write(&path, &original).unwrap();
    }
    assert!(checked > 200);
    all_ok(group.load(&dir), "the restored checkpoint loads");
}

#[test]
fn truncated_extended_and_missing_files() {
    let (_tmp, dir) = saved("files");
    let (mut group, before) = victim(&config(MuonLayout::Compact), &model());
    let rank1 = dir.join("rank-00001.safetensors");
    let original = std::fs::read(&rank1).unwrap();

    std::fs::write(&rank1, &original[..original.len() - 100]).unwrap();
    let err = failed_load(&mut group, &before, &dir, "truncated");
    assert_eq!(err.kind, ErrorKind::CheckpointCorrupt);
    assert!(
        err.message.contains("rank-00001.safetensors") && err.message.contains("truncated"),
        "{}",
        err.message
    );

    let mut longer = original.clone();
    longer.extend_from_slice(&[0; 8]);
    std::fs::write(&rank1, &longer).unwrap();
    assert_eq!(
        failed_load(&mut group, &before, &dir, "extended").kind,
        ErrorKind::CheckpointCorrupt
    );

    std::fs::remove_file(&rank1).unwrap();
    let err = failed_load(&mut group, &before, &dir, "missing rank file");
    assert_eq!(err.kind, ErrorKind::Io);
    assert!(err.message.contains("rank-00001.safetensors"), "{}", err.message);
    std::fs::write(&rank1, &original).unwrap();

    let index = dir.join("index.json");
    let text = std::fs::read(&index).unwrap();
    std::fs::remove_file(&index).unwrap();
    let err = failed_load(&mut group, &before, &dir, "missing index");
    assert_eq!(err.kind, ErrorKind::Io);
    assert!(err.message.contains("index.json"), "{}", err.message);
    std::fs::write(&index, &text).unwrap();

    let err = failed_load(&mut group, &before, &dir.with_file_name("nowhere"), "missing directory");
    assert_eq!(err.kind, ErrorKind::Io);
    all_ok(group.load(&dir), "the repaired checkpoint loads");
}

#[test]
fn a_newer_format_version_is_refused() {
    let (_tmp, dir) = saved("version");
    let (mut group, before) = victim(&config(MuonLayout::Compact), &model());
    let path = dir.join("index.json");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with(r#"{"format":"muon_opt.checkpoint","format_version":1,"#));
    let newer = FORMAT_VERSION + 1;
    std::fs::write(
        &path,
        text.replacen(r#""format_version":1"#, &format!(r#""format_version":{newer}"#), 1),
    )
    .unwrap();
    let err = failed_load(&mut group, &before, &dir, "a newer version");
    assert_eq!(err.kind, ErrorKind::CheckpointVersion);
    assert!(
        err.message.contains(&format!("format_version {newer}")),
        "{}",
        err.message
    );
}

/// A format_version that is not a version names the field; one past u32 is still a version
/// (a newer one).
#[test]
fn a_format_version_that_is_no_version_names_the_field() {
    let (_tmp, dir) = saved("version-values");
    let (mut group, before) = victim(&config(MuonLayout::Compact), &model());
    let path = dir.join("index.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let cases = [
        (
            "4294967296",
            ErrorKind::CheckpointVersion,
            "format_version 4294967296 is newer",
        ),
        (
            "-1",
            ErrorKind::CheckpointCorrupt,
            "format_version: -1 is not a format version",
        ),
        (
            r#""2""#,
            ErrorKind::CheckpointCorrupt,
            r#"format_version: "2" is not a format version"#,
        ),
        (
            "2.5",
            ErrorKind::CheckpointCorrupt,
            "format_version: 2.5 is not a format version",
        ),
        ("null", ErrorKind::CheckpointCorrupt, "format_version: missing or null"),
        ("0", ErrorKind::CheckpointCorrupt, "format_version: 0 does not exist"),
    ];
    for (value, kind, needle) in cases {
        std::fs::write(
            &path,
            text.replacen(r#""format_version":1"#, &format!(r#""format_version":{value}"#), 1),
        )
        .unwrap();
        let err = failed_load(&mut group, &before, &dir, value);
        assert_eq!(err.kind, kind, "{value}: {}", err.message);
        assert!(err.message.contains(needle), "{value}: {}", err.message);
    }
    std::fs::write(&path, text).unwrap();
    all_ok(group.load(&dir), "the repaired checkpoint loads");
}

fn renamed(specs: &mut [ParamSpec], name: &str, edit: impl FnOnce(&mut ParamSpec)) {
    edit(specs.iter_mut().find(|s| s.name == name).unwrap());
}

#[test]
fn a_different_model_is_a_mismatch_naming_the_param() {
    let (_tmp, dir) = saved("model");
    let cfg = config(MuonLayout::Compact);
    let mut cases: Vec<(Vec<ParamSpec>, &str)> = Vec::new();

    let mut missing = model();
    missing.retain(|s| s.name != "layers.1.router.weight");
    cases.push((missing, "not registered here: layers.1.router.weight"));

    let mut extra = model();
    extra.push(ParamSpec::new("extra.bias", &[16], muon_opt::config::Dtype::F32));
    cases.push((extra, "param 'extra.bias' is not in the checkpoint"));

    let mut shape = model();
    renamed(&mut shape, "layers.0.proj.weight", |s| s.shape = vec![32, 48]);
    cases.push((
        shape,
        "param 'layers.0.proj.weight': shape is [32, 48] but the checkpoint has [32, 32]",
    ));

    let mut route = model();
    renamed(&mut route, "layers.0.proj.weight", |s| {
        s.flags = ParamFlags(ParamFlags::NO_MUON)
    });
    cases.push((
        route,
        "param 'layers.0.proj.weight': route is adamw but the checkpoint has muon",
    ));

    let mut splits = model();
    renamed(&mut splits, "layers.1.fc1.weight", |s| s.split_sizes = vec![32, 96]);
    cases.push((
        splits,
        "param 'layers.1.fc1.weight': split_sizes is [32, 96] but the checkpoint has [64, 64]",
    ));

    for (specs, needle) in cases {
        let (mut group, before) = victim(&cfg, &specs);
        let err = failed_load(&mut group, &before, &dir, needle);
        assert_eq!(err.kind, ErrorKind::CheckpointMismatch, "{err:?}");
        assert!(err.message.contains(needle), "{} lacks {needle}", err.message);
    }
}

#[test]
fn a_numerics_config_mismatch_names_the_field_and_other_fields_may_differ() {
    let (_tmp, dir) = saved("config");
    let base = config(MuonLayout::Compact);
    let cases = [
        (
            Config {
                adam_beta2: 0.99,
                ..base.clone()
            },
            "adam_beta2",
        ),
        (
            Config {
                muon_momentum: 0.9,
                ..base.clone()
            },
            "muon_momentum",
        ),
        (
            Config {
                clip_grad: 1.0,
                ..base.clone()
            },
            "clip_grad",
        ),
        (
            Config {
                muon_num_ns_steps: 6,
                ..base.clone()
            },
            "muon_num_ns_steps",
        ),
        (
            Config {
                muon_ns_eps: 1e-15,
                ..base.clone()
            },
            "muon_ns_eps",
        ),
        (
            Config {
                muon_ns_method: NsMethod::Gram,
                ..base.clone()
            },
            "muon_ns_method",
        ),
    ];
    for (cfg, field) in cases {
        let (mut group, before) = victim(&cfg, &model());
        let err = failed_load(&mut group, &before, &dir, field);
        assert_eq!(err.kind, ErrorKind::CheckpointMismatch);
        assert!(
            err.message.contains(&format!("config field {field}")),
            "{}",
            err.message
        );
    }
    let free = Config {
        bucket_size: 1 << 20,
        overlap_grad_reduce: false,
        overlap_param_gather: false,
        collective_timeout_ms: 60_000,
        ..config(MuonLayout::Allreduce)
    };
    let mut group = Group::new(&free, 2);
    all_ok(
        group.load(&dir),
        "layout, buckets, overlap and timeouts do not change numerics",
    );
}

#[test]
fn loading_in_the_middle_of_an_iteration_is_refused() {
    let (_tmp, dir) = saved("midway");
    let (mut group, before) = victim(&config(MuonLayout::Compact), &model());
    group.run(|_, opt| {
        opt.zero_grad().unwrap();
        opt.grad_ready(opt.registry().len() as u32 - 1).unwrap();
    });
    let err = failed_load(&mut group, &before, &dir, "mid-iteration");
    assert_eq!(err.kind, ErrorKind::InvalidState);
    assert!(err.message.contains("between steps"), "{}", err.message);
}

#[test]
fn params_are_matched_by_name_not_by_registration_order() {
    let tmp = TempDir::new("order");
    let dir = tmp.join("ckpt");
    let mut saver = Group::new(&config(MuonLayout::Compact), 2);
    saver.train(2);
    all_ok(saver.save(&dir), "save");
    let saved = saver.snapshot();
    let mut reversed = model();
    reversed.reverse();
    let mut loader = Group::with_model(&config(MuonLayout::Compact), 3, &reversed);
    all_ok(loader.load(&dir), "load in another registration order");
    let loaded = loader.snapshot();
    for (p, name) in saved.names.iter().enumerate() {
        let q = loaded.names.iter().position(|n| n == name).unwrap();
        assert!(loaded.state[q] == saved.state[p], "{name}");
        assert!(loaded.params[2][q] == saved.params[0][p], "{name}");
    }
}

/// Collective calls are two-phase: ranks that make different calls, or load different
/// checkpoints, all fail before anything changes on any rank.
#[test]
fn ranks_in_different_calls_or_on_different_checkpoints_change_nothing() {
    let tmp = TempDir::new("disagree");
    let (a, b) = (tmp.join("a"), tmp.join("b"));
    let mut group = Group::new(&config(MuonLayout::Compact), 2);
    group.train(1);
    all_ok(group.save(&a), "save a");
    group.train(1);
    all_ok(group.save(&b), "save b");
    group.train(1);
    let before = group.snapshot();

    // Rank 0 saves into `a` while rank 1 loads `a`.
    let results = group.run(|rank, opt| if rank == 0 { opt.save(&a) } else { opt.load(&a) });
    for (rank, result) in results.iter().enumerate() {
        let err = result.as_ref().expect_err("mixed save and load must fail");
        assert_eq!(err.kind, ErrorKind::InvalidState, "rank {rank}: {}", err.message);
        assert!(
            err.message.contains("every rank must make the same collective call"),
            "{}",
            err.message
        );
    }
    group.snapshot().assert_same(&before, "after a mixed save and load");
    // The checkpoint rank 0 tried to overwrite still loads on its own.
    assert!(a.join("index.json").exists());

    // Rank 0 loads `a`, rank 1 loads `b`: each read succeeds, the commit must not happen.
    let results = group.run(|rank, opt| opt.load(if rank == 0 { &a } else { &b }));
    for (rank, result) in results.iter().enumerate() {
        let err = result.as_ref().expect_err("loading different checkpoints must fail");
        assert_eq!(err.kind, ErrorKind::CheckpointMismatch, "rank {rank}: {}", err.message);
        assert!(
            err.message.contains("every rank must load the same checkpoint"),
            "{}",
            err.message
        );
    }
    group
        .snapshot()
        .assert_same(&before, "after loading different checkpoints");

    // Both load `b`: it works, and the group is still usable afterwards.
    all_ok(group.load(&b), "load b");
    group.train(1);
}

//! Save at dp=4 (compact), load at other dp sizes and layouts, continue training: bitwise
//! identical to an uninterrupted run at the loading dp (see the harness for why the data make
//! that exact). Also: every rank's file holds its state, load re-synchronizes every rank's
//! params, and a later save replaces the whole directory.

mod support;

use std::collections::BTreeMap;

use muon_opt::checkpoint::{INDEX_FILE, Index, StateKind};
use muon_opt::config::{Config, Dtype, MuonLayout, MuonOwnership, MuonVariant, NsMethod};
use muon_opt::model::{ParamFlags, ParamSpec, Route};
use muon_opt::numerics::mxfp8::{Direction, scale_shape};
use safetensors::SafeTensors;
use support::checkpoint::{Group, Snapshot, all_ok, config, model};
use support::golden::f32_from_le;
use support::tempdir::TempDir;
use support::training::bits;

const SAVED_AT: u64 = 3;
const MORE: u64 = 3;

#[test]
fn resumed_training_is_bitwise_identical_at_every_dp_layout_and_ownership() {
    let tmp = TempDir::new("resume");
    let dir = tmp.join("ckpt");
    let mut saver = Group::new(&config(MuonLayout::Compact), 4);
    saver.train(SAVED_AT);
    all_ok(saver.save(&dir), "save");
    let saved = saver.snapshot();
    drop(saver);

    let cases = [
        (1, MuonLayout::Compact, MuonOwnership::Balanced),
        (2, MuonLayout::Compact, MuonOwnership::Balanced),
        (3, MuonLayout::Compact, MuonOwnership::Balanced),
        (4, MuonLayout::Compact, MuonOwnership::Balanced),
        (2, MuonLayout::Padded, MuonOwnership::Balanced),
        (3, MuonLayout::Padded, MuonOwnership::Balanced),
        (4, MuonLayout::Allreduce, MuonOwnership::Balanced),
        (3, MuonLayout::CompactRooted, MuonOwnership::Contiguous),
        (4, MuonLayout::Compact, MuonOwnership::Contiguous),
    ];
    for (dp, layout, ownership) in cases {
        let label = format!("dp={dp} {} {}", layout.name(), ownership.name());
        let cfg = Config {
            muon_ownership: ownership,
            ..config(layout)
        };
        let mut reference = Group::new(&cfg, dp);
        reference.train(SAVED_AT);
        reference
            .snapshot()
            .assert_same(&saved, &format!("{label}: the data must train alike at every dp"));
        reference.train(MORE);
        let expected = reference.snapshot();

        let mut resumed = Group::new(&cfg, dp);
        all_ok(resumed.load(&dir), &label);
        resumed.snapshot().assert_same(
            &saved,
            &format!("{label}: right after load (params re-synchronized on every rank)"),
        );
        resumed.train(MORE);
        let after = resumed.snapshot();
        after.assert_same(&expected, &format!("{label}: resumed vs uninterrupted"));
        assert!(
            after.state != saved.state,
            "{label}: training after load must move the state"
        );
    }
}

/// The Newton–Schulz method is part of the numerics record: a checkpoint of the default
/// (`standard`) has no `muon_ns_method` field, as checkpoints written before the field existed,
/// and loads into a standard optimizer only; one saved with `gram` records it, refuses a
/// standard optimizer naming the field, and resumes bitwise under `gram` at another dp.
#[test]
fn the_newton_schulz_method_is_recorded_and_a_gram_run_resumes_bitwise() {
    let gram = Config {
        muon_ns_method: NsMethod::Gram,
        ..config(MuonLayout::Compact)
    };
    let tmp = TempDir::new("ns_method");
    let (standard_dir, gram_dir) = (tmp.join("standard"), tmp.join("gram"));
    let mut standard_saver = Group::new(&config(MuonLayout::Compact), 2);
    standard_saver.train(SAVED_AT);
    all_ok(standard_saver.save(&standard_dir), "save standard");
    let mut saver = Group::new(&gram, 2);
    saver.train(SAVED_AT);
    all_ok(saver.save(&gram_dir), "save gram");
    let saved = saver.snapshot();
    assert!(
        saved.state != standard_saver.snapshot().state,
        "the model has Muon matrices the Gram iteration applies to"
    );
    drop((saver, standard_saver));

    let text = |dir: &std::path::Path| std::fs::read_to_string(dir.join(INDEX_FILE)).unwrap();
    assert!(!text(&standard_dir).contains("muon_ns_method"));
    assert!(text(&gram_dir).contains(r#""muon_ns_method": "gram""#));
    let (index, _) = read_back(&gram_dir);
    assert_eq!(index.config.muon_ns_method, NsMethod::Gram);
    let (index, _) = read_back(&standard_dir);
    assert_eq!(index.config.muon_ns_method, NsMethod::Standard);

    for (dir, cfg, saved_with) in [
        (&gram_dir, config(MuonLayout::Compact), r#"saved with "gram""#),
        (&standard_dir, gram.clone(), "saved with the default"),
    ] {
        let mut other = Group::new(&cfg, 2);
        for result in other.load(dir) {
            let err = result.expect_err("a different method must not load");
            if !err.message.contains("failed on rank") {
                assert!(err.message.contains("config field muon_ns_method"), "{}", err.message);
                assert!(err.message.contains(saved_with), "{}", err.message);
            }
        }
    }

    let mut reference = Group::new(&gram, 3);
    reference.train(SAVED_AT + MORE);
    let expected = reference.snapshot();
    let mut resumed = Group::new(&gram, 3);
    all_ok(resumed.load(&gram_dir), "load gram at dp=3");
    resumed.snapshot().assert_same(&saved, "gram: right after load");
    resumed.train(MORE);
    resumed
        .snapshot()
        .assert_same(&expected, "gram: resumed vs uninterrupted");
}

/// The momentum dtype is part of the numerics record: a checkpoint of a bf16 momentum records
/// `muon_momentum_dtype`, holds momenta that are bf16 values (stored as f32, exactly), refuses
/// an f32 optimizer naming the field (and an f32 checkpoint refuses a bf16 optimizer), and
/// resumes bitwise at another dp.
#[test]
fn a_bf16_momentum_is_recorded_and_resumes_bitwise() {
    use muon_opt::numerics::bf16::round_through_bf16;
    let bf16 = Config {
        muon_momentum_dtype: Dtype::Bf16,
        ..config(MuonLayout::Compact)
    };
    let tmp = TempDir::new("momentum_dtype");
    let (f32_dir, bf16_dir) = (tmp.join("f32"), tmp.join("bf16"));
    let mut f32_saver = Group::new(&config(MuonLayout::Compact), 2);
    f32_saver.train(SAVED_AT);
    all_ok(f32_saver.save(&f32_dir), "save f32");
    let mut saver = Group::new(&bf16, 2);
    saver.train(SAVED_AT);
    all_ok(saver.save(&bf16_dir), "save bf16");
    let saved = saver.snapshot();
    drop((saver, f32_saver));

    let text = |dir: &std::path::Path| std::fs::read_to_string(dir.join(INDEX_FILE)).unwrap();
    assert!(!text(&f32_dir).contains("muon_momentum_dtype"));
    assert!(text(&bf16_dir).contains(r#""muon_momentum_dtype": "bf16""#));
    let (index, tensors) = read_back(&bf16_dir);
    assert_eq!(index.config.muon_momentum_dtype, Dtype::Bf16);
    let momenta: Vec<f32> = (tensors.iter())
        .filter(|((_, kind), _)| *kind == StateKind::Momentum)
        .flat_map(|(_, values)| values.iter().copied())
        .collect();
    assert!(momenta.iter().any(|&m| m != 0.0));
    assert!(momenta.iter().all(|&m| round_through_bf16(m).to_bits() == m.to_bits()));

    for (dir, cfg, saved_with) in [
        (&bf16_dir, config(MuonLayout::Compact), r#"saved with "bf16""#),
        (&f32_dir, bf16.clone(), "saved with the default"),
    ] {
        let mut other = Group::new(&cfg, 2);
        for result in other.load(dir) {
            let err = result.expect_err("a different momentum dtype must not load");
            if !err.message.contains("failed on rank") {
                assert!(
                    err.message.contains("config field muon_momentum_dtype"),
                    "{}",
                    err.message
                );
                assert!(err.message.contains(saved_with), "{}", err.message);
            }
        }
    }

    let mut reference = Group::new(&bf16, 3);
    reference.train(SAVED_AT + MORE);
    let expected = reference.snapshot();
    let mut resumed = Group::new(&bf16, 3);
    all_ok(resumed.load(&bf16_dir), "load bf16 at dp=3");
    resumed
        .snapshot()
        .assert_same(&saved, "bf16 momentum: right after load");
    resumed.train(MORE);
    resumed
        .snapshot()
        .assert_same(&expected, "bf16 momentum: resumed vs uninterrupted");
}

/// Every state tensor of every param, assembled from the rank files through the index.
fn read_back(dir: &std::path::Path) -> (Index, BTreeMap<(String, StateKind), Vec<f32>>) {
    let index = Index::decode(&std::fs::read(dir.join(INDEX_FILE)).unwrap()).unwrap();
    let files: BTreeMap<String, Vec<u8>> = index
        .files
        .iter()
        .map(|f| (f.name.clone(), std::fs::read(dir.join(&f.name)).unwrap()))
        .collect();
    let mut out = BTreeMap::new();
    for param in &index.params {
        let numel = param.shape.iter().product::<u64>() as usize;
        for &kind in StateKind::of(param.route, index.config.muon_variant) {
            let mut values = vec![f32::NAN; numel];
            for component in &param.components {
                for piece in &component.pieces {
                    let file = SafeTensors::deserialize(&files[&piece.file]).unwrap();
                    let tensor = file.tensor(&piece.keys[&kind]).unwrap();
                    let data = f32_from_le(tensor.data());
                    let start = (component.offset + piece.start) as usize;
                    values[start..start + data.len()].copy_from_slice(&data);
                }
            }
            out.insert((param.name.clone(), kind), values);
        }
    }
    (index, out)
}

#[test]
fn every_rank_file_holds_its_masters_momenta_and_moments() {
    for dp in [1, 3, 4] {
        let tmp = TempDir::new("holds");
        let dir = tmp.join("ckpt");
        let mut group = Group::new(&config(MuonLayout::Compact), dp);
        group.train(2);
        all_ok(group.save(&dir), "save");
        let snapshot: Snapshot = group.snapshot();
        let (index, tensors) = read_back(&dir);
        assert_eq!((index.dp as usize, index.step), (dp, 2));
        assert_eq!(index.files.len(), dp);
        for (p, spec) in model().iter().enumerate() {
            let kinds = StateKind::of(spec.route(), MuonVariant::Standard);
            for (k, &kind) in kinds.iter().enumerate() {
                let from_files = &tensors[&(spec.name.clone(), kind)];
                assert!(
                    bits(from_files) == bits(&snapshot.state[p][k]),
                    "dp={dp}: {} {} differs from the owners' state",
                    spec.name,
                    kind.name()
                );
                if kind == StateKind::Momentum {
                    assert!(
                        from_files.iter().any(|&v| v != 0.0),
                        "{}: momentum saved as zeros",
                        spec.name
                    );
                }
            }
        }
        let muon_files: std::collections::BTreeSet<&str> = index
            .params
            .iter()
            .filter(|p| p.route == Route::Muon)
            .flat_map(|p| {
                p.components
                    .iter()
                    .flat_map(|c| c.pieces.iter().map(|x| x.file.as_str()))
            })
            .collect();
        assert_eq!(
            muon_files.len(),
            dp.min(4),
            "dp={dp}: every rank owns and saves Muon state"
        );
    }
}

#[test]
fn a_later_save_replaces_the_whole_directory() {
    let tmp = TempDir::new("replace");
    let dir = tmp.join("ckpt");
    let mut four = Group::new(&config(MuonLayout::Compact), 4);
    four.train(1);
    all_ok(four.save(&dir), "save at dp=4");
    let first = std::fs::read(dir.join(INDEX_FILE)).unwrap();

    let mut two = Group::new(&config(MuonLayout::Padded), 2);
    two.train(2);
    all_ok(two.save(&dir), "save at dp=2");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["index.json", "rank-00000.safetensors", "rank-00001.safetensors"]
    );
    assert_ne!(std::fs::read(dir.join(INDEX_FILE)).unwrap(), first);
    let beside: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert_eq!(
        beside.len(),
        1,
        "no staging or backup directory is left beside the checkpoint"
    );

    let saved = two.snapshot();
    let mut three = Group::new(&config(MuonLayout::Compact), 3);
    all_ok(three.load(&dir), "load at dp=3");
    three.snapshot().assert_same(&saved, "the dp=2 checkpoint");
}

#[test]
fn saving_in_the_middle_of_an_iteration_completes_its_collectives_and_changes_nothing() {
    let tmp = TempDir::new("midway");
    let dir = tmp.join("ckpt");
    let mut group = Group::new(&config(MuonLayout::Compact), 2);
    group.train(2);
    let before = group.snapshot();
    let results = group.run(|_, opt| {
        opt.zero_grad().unwrap();
        let last = opt.registry().len() as u32 - 1;
        opt.grad_ready(last).unwrap();
        opt.save(&dir)
    });
    all_ok(results, "save during backward");
    group.snapshot().assert_same(&before, "state after the save");
    let mut other = Group::new(&config(MuonLayout::Compact), 2);
    all_ok(other.load(&dir), "load");
    other.snapshot().assert_same(&before, "loaded");
}

fn mxfp8_model() -> Vec<ParamSpec> {
    let with = |name: &str, shape: &[u64], flags: u32| {
        let mut p = ParamSpec::new(name, shape, Dtype::Bf16);
        p.flags = ParamFlags(flags);
        p
    };
    let mut fc1 = with("fc1.weight", &[64, 32], ParamFlags::MXFP8);
    fc1.split_sizes = vec![32, 32];
    vec![
        with("embedding.weight", &[40, 32], ParamFlags::EMBEDDING_OR_OUTPUT),
        fc1,
        with("fc2.weight", &[32, 96], ParamFlags::MXFP8),
        with("fc2.bias", &[32], 0),
        with("router.weight", &[32, 64], ParamFlags::MXFP8 | ParamFlags::NO_MUON),
    ]
}

/// Per rank: every MXFP8 byte (rowwise and columnwise data and scales) of every MXFP8 param.
fn mxfp8_bytes(group: &mut Group) -> Vec<Vec<u8>> {
    let specs = group.specs.clone();
    group.run(|_, opt| {
        let runtime = opt.running().unwrap();
        runtime.synchronize().unwrap();
        let mut out = Vec::new();
        for (p, spec) in specs.iter().enumerate() {
            let Some(parts) = runtime.mxfp8_addresses(p) else {
                continue;
            };
            let (rows, cols) = spec.flat_2d();
            let (rows, cols) = (rows as usize, cols as usize);
            let (rs, cs) = (
                scale_shape(rows, cols, Direction::Rowwise),
                scale_shape(rows, cols, Direction::Colwise),
            );
            for (ptr, len) in parts
                .into_iter()
                .zip([rows * cols, rs.0 * rs.1, rows * cols, cs.0 * cs.1])
            {
                // SAFETY: the library's MXFP8 storage of param p holds these sizes.
                out.extend_from_slice(unsafe { std::slice::from_raw_parts(ptr, len) });
            }
        }
        out
    })
}

#[test]
fn mxfp8_storage_is_requantized_from_the_loaded_masters() {
    for gather in [true, false] {
        let tmp = TempDir::new("mxfp8");
        let dir = tmp.join("ckpt");
        let cfg = Config {
            mxfp8_param_gather: gather,
            ..config(MuonLayout::Compact)
        };
        let mut saver = Group::with_model(&cfg, 2, &mxfp8_model());
        saver.train(2);
        all_ok(saver.save(&dir), "save");
        let expected = mxfp8_bytes(&mut saver);
        assert!(!expected[0].is_empty() && expected[1] == expected[0]);
        let saved = saver.snapshot().state;

        let mut loader = Group::with_model(&cfg, 3, &mxfp8_model());
        assert!(
            mxfp8_bytes(&mut loader)[0] != expected[0],
            "training must change the MXFP8 params"
        );
        all_ok(loader.load(&dir), "load");
        assert!(loader.snapshot().state == saved, "gather={gather}: loaded state");
        for (rank, bytes) in mxfp8_bytes(&mut loader).iter().enumerate() {
            assert!(
                bytes == &expected[0],
                "gather={gather}: rank {rank}'s MXFP8 storage after load"
            );
        }
    }
}

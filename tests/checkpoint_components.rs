//! Fused params are saved per component, in global item coordinates: SwiGLU `fc1` as its gate
//! and up halves, QKV as its three blocks, split expert stacks per expert and part; AdamW
//! shards that start or end inside a component (an AdamW-routed expert stack) are saved as
//! partial pieces with their range in the component.
//!
//! Muon matrices are owned whole (one unit per matrix or expert), so a Muon owned range never
//! starts or ends inside a component; splits are Muon-only, so the cut case is exercised with
//! the per-expert components of an AdamW expert stack here and on the range math in the
//! library's unit tests (`checkpoint::components`).

mod support;

use muon_opt::checkpoint::{INDEX_FILE, Index, StateKind};
use muon_opt::config::MuonLayout;
use safetensors::SafeTensors;
use support::checkpoint::{Group, all_ok, config, model};
use support::golden::f32_from_le;
use support::tempdir::TempDir;
use support::training::bits;

/// Tensor `key` of `file` in `dir`, as f32 values, with its shape.
fn tensor(dir: &std::path::Path, file: &str, key: &str) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(dir.join(file)).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let view = st
        .tensor(key)
        .unwrap_or_else(|e| panic!("{file} has no '{key}': {e:?}"));
    (view.shape().to_vec(), f32_from_le(view.data()))
}

#[test]
fn fused_params_are_saved_as_their_components() {
    for dp in [1, 3] {
        let tmp = TempDir::new("parts");
        let dir = tmp.join("ckpt");
        let mut group = Group::new(&config(MuonLayout::Compact), dp);
        group.train(2);
        all_ok(group.save(&dir), "save");
        let state = group.snapshot().state;
        let index = Index::decode(&std::fs::read(dir.join(INDEX_FILE)).unwrap()).unwrap();
        let specs = model();
        let id = |name: &str| specs.iter().position(|s| s.name == name).unwrap();

        let fc1 = id("layers.0.fc1.weight");
        let entry = index.param("layers.0.fc1.weight").unwrap();
        let names: Vec<&str> = entry.components.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["layers.0.fc1.weight/part0", "layers.0.fc1.weight/part1"]);
        for (c, half) in [(0usize, 0..64 * 32), (1, 64 * 32..128 * 32)] {
            let component = &entry.components[c];
            assert_eq!(component.shape, [64, 32]);
            assert_eq!(component.pieces.len(), 1, "a Muon matrix is owned whole");
            let piece = &component.pieces[0];
            assert_eq!((piece.start, piece.end), (0, 64 * 32));
            for (k, kind) in [StateKind::Master, StateKind::Momentum].into_iter().enumerate() {
                let key = &piece.keys[&kind];
                assert_eq!(key, &format!("layers.0.fc1.weight/part{c}/{}@0:2048", kind.name()));
                let (shape, values) = tensor(&dir, &piece.file, key);
                assert_eq!(shape, [64, 32]);
                assert!(
                    bits(&values) == bits(&state[fc1][k][half.clone()]),
                    "dp={dp}: part{c} {} is not that half of the param",
                    kind.name()
                );
            }
        }

        let consecutive = index.param("layers.0.qkv.weight").unwrap();
        assert_eq!(consecutive.components.len(), 3);
        assert_eq!(consecutive.components[2].offset, 64 * 32);

        // Split per query group: one component per (group, part), each a contiguous block.
        let grouped = id("layers.1.qkv.weight");
        let entry = index.param("layers.1.qkv.weight").unwrap();
        assert_eq!(entry.split_groups, 3);
        assert_eq!(entry.components.len(), 3 * 3);
        for g in 0..3usize {
            for (c, (rows, within)) in [(16usize, 0usize), (8, 16), (8, 24)].into_iter().enumerate() {
                let component = &entry.components[3 * g + c];
                assert_eq!(component.name, format!("layers.1.qkv.weight/group{g}/part{c}"));
                assert_eq!(component.shape, [rows as u64, 32]);
                let start = (g * 32 + within) * 32;
                assert_eq!(component.offset as usize, start);
                let piece = &component.pieces[0];
                let (_, values) = tensor(&dir, &piece.file, &piece.keys[&StateKind::Master]);
                assert!(
                    bits(&values) == bits(&state[grouped][0][start..start + rows * 32]),
                    "dp={dp}: group {g} part {c} master"
                );
            }
        }

        let experts = id("layers.1.experts.fc1");
        let entry = index.param("layers.1.experts.fc1").unwrap();
        assert_eq!(entry.components.len(), 4 * 2);
        for e in 0..4usize {
            for c in 0..2usize {
                let component = &entry.components[2 * e + c];
                assert_eq!(component.name, format!("layers.1.experts.fc1/expert{e}/part{c}"));
                assert_eq!(component.shape, [24, 32]);
                let start = e * 48 * 32 + c * 24 * 32;
                assert_eq!(component.offset as usize, start);
                let piece = &component.pieces[0];
                let (_, values) = tensor(&dir, &piece.file, &piece.keys[&StateKind::Momentum]);
                assert!(
                    bits(&values) == bits(&state[experts][1][start..start + 24 * 32]),
                    "dp={dp}: expert {e} part {c} momentum"
                );
            }
        }
    }
}

#[test]
fn shard_bounds_inside_a_component_are_saved_as_partial_pieces() {
    let tmp = TempDir::new("cut");
    let dir = tmp.join("ckpt");
    let mut group = Group::new(&config(MuonLayout::Compact), 3);
    group.train(2);
    all_ok(group.save(&dir), "save");
    let state = group.snapshot().state;
    let index = Index::decode(&std::fs::read(dir.join(INDEX_FILE)).unwrap()).unwrap();
    let specs = model();
    let mut cut = 0;
    for (p, spec) in specs.iter().enumerate() {
        let entry = index.param(&spec.name).unwrap();
        for component in &entry.components {
            let numel: u64 = component.shape.iter().product();
            for piece in &component.pieces {
                let partial = piece.end - piece.start != numel;
                for (k, &kind) in StateKind::of(entry.route, index.config.muon_variant).iter().enumerate() {
                    let key = &piece.keys[&kind];
                    assert!(key.ends_with(&format!("@{}:{}", piece.start, piece.end)), "{key}");
                    let (shape, values) = tensor(&dir, &piece.file, key);
                    if partial {
                        assert_eq!(shape, [(piece.end - piece.start) as usize], "{key}");
                    } else {
                        assert_eq!(shape.iter().map(|&d| d as u64).collect::<Vec<_>>(), component.shape);
                    }
                    let start = (component.offset + piece.start) as usize;
                    assert!(
                        bits(&values) == bits(&state[p][k][start..start + values.len()]),
                        "{key}"
                    );
                }
                if partial && entry.name.contains("experts.scale") {
                    cut += 1;
                }
            }
        }
    }
    assert!(
        cut >= 2,
        "dp=3 must cut some expert of the AdamW expert stacks ({cut} cut pieces)"
    );

    let saved = group.snapshot();
    for dp in [2, 4] {
        let mut other = Group::new(&config(MuonLayout::Padded), dp);
        all_ok(other.load(&dir), "load");
        other.snapshot().assert_same(&saved, &format!("dp={dp} padded"));
    }
}

//! The device bytes `muon-opt plan` reports come from the cuda translator's own allocations;
//! here they are checked against the planner's report (buffers, optimizer state per rank) and
//! against what the simulator's full run allocates.

use muon_opt::config::{Config, Dtype, MuonLayout, MuonVariant};
use muon_opt::model::{ParamFlags, Registry, Route};
use muon_opt::plan::build_plan;
use muon_opt::plan::presets::preset;
use muon_opt::sim::device::{device_bytes, rank_device_bytes};
use muon_opt::sim::profile::builtin;
use muon_opt::sim::{Scenario, simulate};

#[test]
fn the_translator_allocates_what_the_plan_report_counts() {
    for name in ["gpt2-124m", "deepseek-v3-like"] {
        let model = preset(name).unwrap();
        let layouts = MuonLayout::ALL.iter().map(|&l| (l, MuonVariant::Standard, Dtype::F32));
        let others = [
            (MuonLayout::Compact, MuonVariant::Normuon, Dtype::F32),
            (MuonLayout::Compact, MuonVariant::Normuon, Dtype::Bf16),
            (MuonLayout::Padded, MuonVariant::Adamuon, Dtype::F32),
        ];
        for (muon_layout, muon_variant, muon_momentum_dtype) in layouts.chain(others) {
            let cfg = Config {
                vocab_size: model.vocab_size,
                muon_layout,
                muon_variant,
                muon_momentum_dtype,
                ..Config::default()
            };
            let registry = model.registry(&cfg).unwrap();
            let dp = 4;
            let plan = build_plan(registry.params(), registry.routes(), &cfg, dp).unwrap();
            let r = &plan.report;
            for rank in 0..dp {
                let d = rank_device_bytes(&plan, registry.params(), &cfg, rank).unwrap();
                let label = format!(
                    "{name} {} {} {} momentum rank {rank}",
                    muon_layout.name(),
                    muon_variant.name(),
                    muon_momentum_dtype.name()
                );
                assert_eq!(d.params, r.param_buffer_bytes, "{label}: param buffers");
                assert_eq!(d.grads, r.grad_buffer_bytes, "{label}: grad buffers");
                assert_eq!(
                    d.masters + d.momenta + d.muon_moment2 + d.adam_moments,
                    r.optimizer_state_bytes.per_rank[rank],
                    "{label}: optimizer state"
                );
                assert!(d.workspaces > 0 && d.mxfp8 == 0, "{label}: {d:?}");
                // One f32 per line of every owned Muon matrix's components with NorMuon, per
                // element with AdaMuon.
                let units = plan.muon_units_of(rank);
                let components = units
                    .iter()
                    .flat_map(|u| registry.params()[u.param as usize].unit_components());
                let moment2: u64 = match muon_variant {
                    MuonVariant::Standard => 0,
                    MuonVariant::Normuon => components.map(|c| 4 * c.rows.max(c.cols)).sum(),
                    MuonVariant::Adamuon => units.iter().map(|u| 4 * u.range.len()).sum(),
                };
                assert_eq!(d.muon_moment2, moment2, "{label}: second moments");
                // The momentum: one value of its dtype per owned Muon element.
                let elements: u64 = plan.muon_units_of(rank).iter().map(|u| u.range.len()).sum();
                assert_eq!(
                    d.momenta,
                    muon_momentum_dtype.size() as u64 * elements,
                    "{label}: momenta"
                );
                let parts = d.params
                    + d.grads
                    + d.masters
                    + d.momenta
                    + d.muon_moment2
                    + d.adam_moments
                    + d.mxfp8
                    + d.workspaces;
                assert_eq!(d.total, parts, "{label}");
            }
        }
    }
}

#[test]
fn the_simulation_allocates_what_the_plan_command_reports() {
    let model = preset("gpt2-124m").unwrap();
    for mxfp8 in [false, true] {
        let scenario = Scenario {
            mxfp8,
            iterations: 2,
            ..Scenario::new(model.clone(), 4, builtin("h100-nvlink").unwrap())
        };
        let simulated = simulate(&scenario).unwrap().device_bytes;
        let (cfg, registry) = mxfp8_registry(&model, mxfp8, Config::default().muon_layout);
        let plan = build_plan(registry.params(), registry.routes(), &cfg, 4).unwrap();
        let planned = device_bytes(&plan, registry.params(), &cfg).unwrap();
        assert_eq!(planned, simulated, "mxfp8 {mxfp8}");
        assert_eq!(planned.mxfp8 > 0, mxfp8);
    }
}

/// `model` registered as the simulator does: with `mxfp8`, every Muon matrix whose sides are
/// multiples of 32 is MXFP8 and `mxfp8_param_gather` is on.
fn mxfp8_registry(
    model: &muon_opt::plan::presets::ModelDesc,
    mxfp8: bool,
    muon_layout: MuonLayout,
) -> (Config, Registry) {
    let cfg = Config {
        vocab_size: model.vocab_size,
        mxfp8_param_gather: mxfp8,
        muon_layout,
        ..Config::default()
    };
    let mut registry = Registry::default();
    for spec in &model.params {
        let mut spec = spec.clone();
        let (rows, cols) = spec.flat_2d();
        if mxfp8 && spec.route() == Route::Muon && rows % 32 == 0 && cols % 32 == 0 {
            spec.flags = ParamFlags(spec.flags.0 | ParamFlags::MXFP8);
        }
        registry.add(spec, &cfg).unwrap();
    }
    (cfg, registry)
}

#[test]
fn mxfp8_gathered_buckets_have_no_param_storage() {
    for name in ["gpt2-124m", "deepseek-v3-like"] {
        let model = preset(name).unwrap();
        for &layout in MuonLayout::ALL {
            let label = format!("{name} {}", layout.name());
            let (cfg_off, off) = mxfp8_registry(&model, false, layout);
            let (cfg_on, on) = mxfp8_registry(&model, true, layout);
            let plan_off = build_plan(off.params(), off.routes(), &cfg_off, 4).unwrap();
            let plan_on = build_plan(on.params(), on.routes(), &cfg_on, 4).unwrap();
            let mut staged_bytes = 0;
            let mut staged_buckets = 0;
            for bucket in &plan_on.buckets {
                let all_staged = bucket
                    .params
                    .iter()
                    .all(|&p| on.params()[p as usize].is_staged(&cfg_on));
                assert_eq!(bucket.param_start.is_none(), all_staged, "{label} bucket {}", bucket.id);
                if all_staged {
                    staged_buckets += 1;
                    staged_bytes += (bucket.end - bucket.start) * 2;
                }
            }
            assert!(staged_buckets > 0, "{label}: no bucket is all MXFP8");
            assert_eq!(
                plan_on.report.param_buffer_bytes,
                plan_off.report.param_buffer_bytes - staged_bytes,
                "{label}"
            );
            for buffer in &plan_on.buffers {
                let buckets =
                    &plan_on.buckets[buffer.first_bucket as usize..(buffer.first_bucket + buffer.num_buckets) as usize];
                let mut next = 0;
                for bucket in buckets.iter().filter(|b| b.param_start.is_some()) {
                    assert_eq!(
                        bucket.param_start,
                        Some(next),
                        "{label} bucket {}: back to back",
                        bucket.id
                    );
                    next += bucket.end - bucket.start;
                }
                assert_eq!(buffer.param_numel, next, "{label}");
            }
            for rank in 0..4 {
                let d = rank_device_bytes(&plan_on, on.params(), &cfg_on, rank).unwrap();
                assert_eq!(d.params, plan_on.report.param_buffer_bytes, "{label} rank {rank}");
            }
        }
    }
}

/// A param gathered in place beside staged ones gets a buffer of its own (one collective per
/// bucket, over exactly its bytes): param storage for it alone, none for the staged ones.
#[test]
fn an_unstaged_param_beside_staged_ones_gets_param_storage_of_its_own() {
    let cfg = Config {
        mxfp8_param_gather: true,
        bucket_size: 1 << 30,
        ..Config::default()
    };
    let mut registry = Registry::default();
    let shapes = [
        ([64u64, 64], ParamFlags::MXFP8),
        ([48, 64], 0),
        ([64, 32], ParamFlags::MXFP8),
    ];
    for (i, (shape, flags)) in shapes.into_iter().enumerate() {
        let mut spec = muon_opt::model::ParamSpec::new(format!("w{i}"), &shape, muon_opt::config::Dtype::Bf16);
        spec.flags = ParamFlags(flags);
        registry.add(spec, &cfg).unwrap();
    }
    let plan = build_plan(registry.params(), registry.routes(), &cfg, 2).unwrap();
    let muon: Vec<_> = plan.buckets.iter().filter(|b| b.route == Route::Muon).collect();
    let summary: Vec<(Vec<u32>, Option<u64>, u64)> = muon
        .iter()
        .map(|b| {
            (
                b.params.clone(),
                b.param_start,
                plan.buffers[b.buffer as usize].param_numel,
            )
        })
        .collect();
    assert_eq!(summary, vec![(vec![1], Some(0), 48 * 64), (vec![0, 2], None, 0)]);
}

/// With `muon_ns_method = gram` the translator adds the Gram iteration's square matrices and
/// nothing else: `Z`, `Q` and their bf16 copies (12 bytes per element) in bf16, `Q` and a
/// spare (8 bytes) in f32, each as large as the largest batch that runs the iteration — for
/// llama3-8b a pair of 4096² matrices, less than the 4096 × 14336 iterates it replaces the
/// products of; for gpt2-124m its 768 × 3072 MLP matrices. A model of square matrices only
/// allocates the same bytes with either method.
#[test]
fn the_gram_iteration_adds_only_its_square_matrices() {
    use muon_opt::config::{NsMethod, NsPrecision};
    use muon_opt::schedule::state::StateLayout;
    for (name, dp) in [("llama3-8b", 8), ("gpt2-124m", 4)] {
        let model = preset(name).unwrap();
        for (precision, per_element) in [
            (NsPrecision::Bf16, 12),
            (NsPrecision::Bf16Iterate, 12),
            (NsPrecision::F32, 8),
        ] {
            let standard = Config {
                vocab_size: model.vocab_size,
                muon_ns_precision: precision,
                ..Config::default()
            };
            let gram = Config {
                muon_ns_method: NsMethod::Gram,
                ..standard.clone()
            };
            let registry = model.registry(&standard).unwrap();
            let plan = build_plan(registry.params(), registry.routes(), &standard, dp).unwrap();
            for rank in 0..dp {
                let label = format!("{name} {precision:?} rank {rank}");
                let need = StateLayout::new(&plan, registry.params(), &gram, rank).memory.muon_work;
                assert!(
                    need.gram_iteration > 0 && need.gram_iteration < need.matrix,
                    "{label}: {need:?}"
                );
                let before = rank_device_bytes(&plan, registry.params(), &standard, rank).unwrap();
                let after = rank_device_bytes(&plan, registry.params(), &gram, rank).unwrap();
                assert_eq!(
                    after.workspaces - before.workspaces,
                    per_element * need.gram_iteration,
                    "{label}"
                );
                assert_eq!(
                    after.total - before.total,
                    after.workspaces - before.workspaces,
                    "{label}"
                );
            }
        }
    }
    let square = muon_opt::plan::presets::ModelDesc {
        name: "square".into(),
        vocab_size: 0,
        params: vec![muon_opt::model::ParamSpec::new(
            "layer.weight",
            &[256, 256],
            muon_opt::config::Dtype::Bf16,
        )],
    };
    let cfg = Config::default();
    let registry = square.registry(&cfg).unwrap();
    let plan = build_plan(registry.params(), registry.routes(), &cfg, 1).unwrap();
    let gram = Config {
        muon_ns_method: NsMethod::Gram,
        ..cfg.clone()
    };
    assert_eq!(
        rank_device_bytes(&plan, registry.params(), &gram, 0).unwrap(),
        rank_device_bytes(&plan, registry.params(), &cfg, 0).unwrap()
    );
}

/// A duplicated or distributed TP shard is sized by what its Newton–Schulz runs on: with
/// llama3-8b at TP 8, `distributed` iterates are 4096 wide along their unsplit side and at most
/// 1792 along the shard's, so none runs the Gram iteration and `gram` allocates exactly what
/// `standard` does; `duplicated` runs the whole matrices, whose wide ones do.
#[test]
fn tensor_parallel_shards_size_the_gram_iteration_by_what_runs() {
    use muon_opt::config::{NsMethod, TpMode};
    let bytes = |mode, ns_method| {
        let scenario = Scenario {
            tp: Some((8, mode)),
            ns_method,
            iterations: 2,
            ..Scenario::new(preset("llama3-8b").unwrap(), 1, builtin("h100-nvlink").unwrap())
        };
        simulate(&scenario).unwrap().device_bytes
    };
    assert_eq!(
        bytes(TpMode::Distributed, NsMethod::Gram),
        bytes(TpMode::Distributed, NsMethod::Standard)
    );
    let (gram, standard) = (
        bytes(TpMode::Duplicated, NsMethod::Gram),
        bytes(TpMode::Duplicated, NsMethod::Standard),
    );
    assert!(gram.workspaces > standard.workspaces, "{gram:?} vs {standard:?}");
}

/// Without Nesterov the update is the momentum itself: the update workspace (one f32 per
/// element of the largest Muon job) is allocated only for a Nesterov step or a bf16 momentum, or as large as the
/// largest per-group split that parks its masters there. gpt2-124m at dp 1 (every matrix one
/// job on rank 0, no per-group split): exactly 4 bytes per element of its largest Muon matrix.
#[test]
fn the_update_workspace_is_allocated_only_for_nesterov_or_a_bf16_momentum() {
    let model = preset("gpt2-124m").unwrap();
    let workspaces = |nesterov: bool, muon_momentum_dtype: Dtype| {
        let cfg = Config {
            vocab_size: model.vocab_size,
            muon_nesterov: nesterov,
            muon_momentum_dtype,
            ..Config::default()
        };
        let registry = model.registry(&cfg).unwrap();
        let plan = build_plan(registry.params(), registry.routes(), &cfg, 1).unwrap();
        let largest = registry
            .params()
            .iter()
            .zip(registry.routes())
            .filter(|(_, r)| **r == Route::Muon)
            .map(|(p, _)| p.numel())
            .max()
            .unwrap();
        (
            device_bytes(&plan, registry.params(), &cfg).unwrap().workspaces,
            largest,
        )
    };
    let ((with, largest), (without, _)) = (workspaces(true, Dtype::F32), workspaces(false, Dtype::F32));
    assert_eq!(with - without, 4 * largest);
    // A bf16 momentum's update is its f32 value, in the workspace, with or without Nesterov.
    assert_eq!(workspaces(false, Dtype::Bf16).0, with);
}

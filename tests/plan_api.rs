//! The planner's public API on small hand-checked models, its errors, and the figures it must
//! reach on the presets.

use muon_opt::config::{Config, Dtype, MuonLayout, MuonOwnership, Network};
use muon_opt::error::ErrorKind;
use muon_opt::model::{ParamFlags, ParamSpec, Registry, Route};
use muon_opt::plan::presets::{PRESET_NAMES, preset};
use muon_opt::plan::{BucketSplit, ElemRange, GroupWindow, OwnershipMethod, Plan, ShardPiece, build_plan, build_plans};

fn register(specs: Vec<ParamSpec>) -> Registry {
    let mut registry = Registry::default();
    for spec in specs {
        registry.add(spec, &Config::default()).unwrap();
    }
    registry
}

fn plan(registry: &Registry, cfg: &Config, dp: usize) -> Plan {
    build_plan(registry.params(), registry.routes(), cfg, dp).unwrap()
}

fn stack(name: &str, shape: &[u64]) -> ParamSpec {
    let mut spec = ParamSpec::new(name, shape, Dtype::Bf16);
    spec.flags = ParamFlags(ParamFlags::EXPERT_STACK);
    spec
}

#[test]
fn invalid_inputs_are_errors_naming_the_rule() {
    let registry = register(vec![ParamSpec::new("w", &[4, 4], Dtype::F32)]);
    let cfg = Config::default();
    let err = build_plan(registry.params(), registry.routes(), &cfg, 0).unwrap_err();
    assert_eq!(
        (err.kind, err.message.as_str()),
        (ErrorKind::OutOfRange, "dp: must be >= 1")
    );
    let err = build_plan(&[], &[], &cfg, 2).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidState);
    let err = build_plan(registry.params(), &[], &cfg, 2).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    let vector = [ParamSpec::new("b", &[4], Dtype::F32)];
    let err = build_plan(&vector, &[Route::Muon], &cfg, 2).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    assert!(err.message.contains("'b'"), "{}", err.message);
}

#[test]
fn buffers_are_muon_first_then_adamw_each_f32_before_bf16() {
    let registry = register(vec![
        ParamSpec::new("a", &[64], Dtype::Bf16),
        ParamSpec::new("b", &[8, 8], Dtype::Bf16),
        ParamSpec::new("c", &[64], Dtype::F32),
        ParamSpec::new("d", &[8, 8], Dtype::F32),
    ]);
    let p = plan(&registry, &Config::default(), 2);
    let keys: Vec<(Route, Dtype)> = p.buffers.iter().map(|b| (b.route, b.dtype)).collect();
    let expected = [
        (Route::Muon, Dtype::F32),
        (Route::Muon, Dtype::Bf16),
        (Route::Adamw, Dtype::F32),
        (Route::Adamw, Dtype::Bf16),
    ];
    assert_eq!(keys, expected);
    assert_eq!(p.param(3).buffer, 0);
    assert_eq!(p.param(0).buffer, 3);
}

#[test]
fn buckets_close_in_backward_order_unless_overlap_is_off() {
    let specs = (0..6)
        .map(|i| ParamSpec::new(format!("w{i}"), &[16, 16], Dtype::F32))
        .collect();
    let registry = register(specs);
    let cfg = Config {
        bucket_size: 512,
        ..Config::default()
    };
    let p = plan(&registry, &cfg, 2);
    let members: Vec<Vec<u32>> = p
        .buckets
        .iter()
        .map(|b| {
            let mut ids = b.params.clone();
            ids.sort_unstable_by(|a, b| b.cmp(a));
            ids
        })
        .collect();
    assert_eq!(members, vec![vec![5, 4], vec![3, 2], vec![1, 0]]);
    let one = plan(
        &registry,
        &Config {
            overlap_grad_reduce: false,
            ..cfg
        },
        2,
    );
    assert_eq!(one.buckets.len(), 1);
    assert_eq!(one.buckets[0].params.len(), 6);
}

#[test]
fn adamw_params_span_equal_shards() {
    let registry = register(vec![
        ParamSpec::new("big", &[300], Dtype::F32),
        ParamSpec::new("small", &[100], Dtype::F32),
    ]);
    let p = plan(&registry, &Config::default(), 4);
    let bucket = &p.buckets[0];
    // Backward order: small at 0..100, big at 128..428; end padded to lcm(4, 128) = 128.
    assert_eq!((bucket.start, bucket.end, bucket.shard_size()), (0, 512, Some(128)));
    assert_eq!((p.param(1).offset, p.param(0).offset), (0, 128));
    let piece = |param, p0, p1, b0, b1| ShardPiece {
        param,
        param_range: ElemRange::new(p0, p1),
        buffer_range: ElemRange::new(b0, b1),
    };
    let expected = vec![
        (1, piece(0, 0, 128, 128, 256)),
        (2, piece(0, 128, 256, 256, 384)),
        (3, piece(0, 256, 300, 384, 428)),
    ];
    assert_eq!(p.adamw_pieces(0), expected);
    assert_eq!(p.adamw_pieces(1), vec![(0, piece(1, 0, 100, 0, 100))]);
    let shard = &p.adamw_shards_of(3)[0];
    assert_eq!(
        (shard.range, shard.pieces.clone()),
        (ElemRange::new(384, 512), vec![piece(0, 256, 300, 384, 428)])
    );
    assert_eq!(p.param(0).single_owner(), None);
    // Two f32 moments per element; an f32 param is its own master.
    assert_eq!(p.report.optimizer_state_bytes.per_rank, vec![800, 1024, 1024, 352]);
}

#[test]
fn an_expert_stack_is_wrapped_over_consecutive_ranks() {
    let registry = register(vec![stack("experts", &[8, 64, 64])]);
    let rooted = Config {
        muon_layout: MuonLayout::CompactRooted,
        ..Config::default()
    };
    let quarter = 2 * 64 * 64;
    let expected: Vec<ElemRange> = (0..4).map(|r| ElemRange::new(r * quarter, (r + 1) * quarter)).collect();
    let p = plan(&registry, &rooted, 4);
    assert_eq!(p.param(0).unit_owners, vec![0, 0, 1, 1, 2, 2, 3, 3]);
    assert_eq!(p.buckets[0].owner_ranges().unwrap(), &expected[..]);
    let p = plan(&registry, &Config::default(), 4);
    assert_eq!(p.param(0).unit_owners, vec![0, 0, 1, 1, 2, 2, 3, 3]);
    assert_eq!(
        p.buckets[0].shard_size(),
        Some(quarter),
        "8 experts over 4 ranks are equal shards"
    );
    let ranges: Vec<ElemRange> = (0..4).map(|r| p.buckets[0].rank_range(r)).collect();
    assert_eq!(ranges, expected);
    let units = p.muon_units_of(2);
    assert_eq!(
        units.iter().map(|u| (u.unit, u.range)).collect::<Vec<_>>(),
        vec![
            (4, ElemRange::new(4 * 4096, 5 * 4096)),
            (5, ElemRange::new(5 * 4096, 6 * 4096)),
        ]
    );
    assert_eq!(p.report.ns_makespan_over_lower_bound, 1.0);
}

#[test]
fn atomic_matrices_move_to_the_ends_of_a_split_stack() {
    // One bucket: three dense matrices and a stack of nine experts, all of equal cost c, at
    // dp 4 (T = 3c). LPT puts the dense matrices on ranks 0, 1, 2; the stack then spans all
    // four ranks, so ranks 1 and 2 would hold a dense matrix inside the stack. The dense
    // matrices move to the stack's end ranks and the stack is wrapped again around them.
    let registry = register(vec![
        ParamSpec::new("dense.0", &[64, 64], Dtype::Bf16),
        ParamSpec::new("dense.1", &[64, 64], Dtype::Bf16),
        ParamSpec::new("dense.2", &[64, 64], Dtype::Bf16),
        stack("experts", &[9, 64, 64]),
    ]);
    let p = plan(&registry, &Config::default(), 4);
    assert_eq!(p.report.ownership, OwnershipMethod::LptStackFill);
    assert_eq!(p.report.ns_makespan_over_lower_bound, 1.0);
    let owners: Vec<u32> = (0..3).map(|i| p.param(i).single_owner().unwrap()).collect();
    assert_eq!(owners, vec![0, 0, 3]);
    assert_eq!(p.param(3).unit_owners, vec![0, 1, 1, 1, 2, 2, 2, 3, 3]);
    // Rank 0: dense.1, dense.0 (backward order), the stack's head; ranks 1 and 2: middle
    // pieces; rank 3: the stack's tail, then dense.2.
    let unit = 64 * 64;
    let offsets: Vec<u64> = (0..4).map(|i| p.param(i).offset).collect();
    assert_eq!(offsets, vec![unit, 0, 11 * unit, 2 * unit]);
    let ranges = p.buckets[0].owner_ranges().unwrap().to_vec();
    let expected: Vec<ElemRange> = (0..4)
        .map(|r| ElemRange::new(3 * r * unit, 3 * (r + 1) * unit))
        .collect();
    assert_eq!(ranges, expected);
}

#[test]
fn plan_json_round_trips_with_a_hex_hash() {
    let model = preset("gpt2-124m").unwrap();
    let plans = build_plans(&model, &Config::default(), 8, MuonLayout::ALL).unwrap();
    let names: Vec<String> = model.params.iter().map(|s| s.name.clone()).collect();
    for p in plans {
        let json = p.to_json(&names);
        assert!(json.contains(&format!("\"hash\":\"{:#018x}\"", p.hash)));
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value["schema_version"], muon_opt::SCHEMA_VERSION);
        assert!(
            value["report"]["planning_time_ms"].is_null(),
            "no wall clock in the plan JSON"
        );
        let listed: Vec<&str> = value["params"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert_eq!(listed, names);
        let back: Plan = serde_json::from_str(&json).unwrap();
        assert_eq!(
            (&back.buffers, &back.buckets, &back.params, back.hash),
            (&p.buffers, &p.buckets, &p.params, p.hash)
        );
        assert_eq!(
            back.report.optimizer_state_bytes.per_rank,
            p.report.optimizer_state_bytes.per_rank
        );
        assert!((back.report.wire_over_lower_bound - p.report.wire_over_lower_bound).abs() < 1e-12);
    }
}

#[test]
fn compact_layout_reaches_the_figures_on_every_preset() {
    for &name in PRESET_NAMES {
        let model = preset(name).unwrap();
        let cfg = Config {
            vocab_size: model.vocab_size,
            ..Config::default()
        };
        let registry = model.registry(&cfg).unwrap();
        for dp in [2usize, 3, 4, 8, 64, 256] {
            let r = plan(&registry, &cfg, dp).report;
            assert!(
                r.padding_fraction <= 0.001,
                "{name} dp {dp}: padding {}",
                r.padding_fraction
            );
            let wire_limit = dp as f64 / (dp - 1) as f64 + 0.001;
            assert!(
                r.wire_over_lower_bound <= wire_limit,
                "{name} dp {dp}: wire {}",
                r.wire_over_lower_bound
            );
            let makespan = r.ns_makespan_over_lower_bound;
            if (name, dp) == ("llama3-70b", 64) || (name, dp) == ("deepseek-v3-like", 256) {
                assert!(makespan <= 1.05, "{name} dp {dp}: makespan / lower bound {makespan}");
            }
        }
    }
}

/// `count` layers of a 128×64 matrix and its transpose (one class: equal elements and cost) and
/// a 64×64 matrix, in registration order.
fn layers(count: usize) -> Registry {
    let mut specs = Vec::new();
    for l in 0..count {
        specs.push(ParamSpec::new(format!("layers.{l}.up"), &[128, 64], Dtype::Bf16));
        specs.push(ParamSpec::new(format!("layers.{l}.down"), &[64, 128], Dtype::Bf16));
        specs.push(ParamSpec::new(format!("layers.{l}.proj"), &[64, 64], Dtype::Bf16));
    }
    register(specs)
}

#[test]
fn equal_matrices_are_grouped_one_per_rank_into_unpadded_shards() {
    // A large matrix registered first (last in backward, alone in its class) makes the group
    // window (a twelfth of the buffer's backward) span more than a layer.
    let mut specs = vec![ParamSpec::new("head", &[1024, 512], Dtype::Bf16)];
    for l in 0..3 {
        specs.push(ParamSpec::new(format!("layers.{l}.up"), &[128, 64], Dtype::Bf16));
        specs.push(ParamSpec::new(format!("layers.{l}.down"), &[64, 128], Dtype::Bf16));
        specs.push(ParamSpec::new(format!("layers.{l}.proj"), &[64, 64], Dtype::Bf16));
    }
    let registry = register(specs);
    let cfg = Config {
        bucket_size: 1,
        ..Config::default()
    };
    let p = plan(&registry, &cfg, 2);
    // Backward: proj2 down2 up2 proj1 down1 up1 proj0 down0 up0 head; up and down are one
    // class, so every layer's pair is a group, and proj2 waits for proj1.
    let shards: Vec<Vec<u32>> = p
        .buckets
        .iter()
        .filter(|b| b.shard_size().is_some())
        .map(|b| b.params.clone())
        .collect();
    assert_eq!(shards, vec![vec![8, 7], vec![9, 6], vec![5, 4], vec![2, 1]]);
    for bucket in p.buckets.iter().filter(|b| b.shard_size().is_some()) {
        let owners: Vec<u32> = bucket
            .params
            .iter()
            .map(|&q| p.param(q as usize).unit_owners[0])
            .collect();
        assert_eq!(owners, vec![0, 1], "bucket {}: one matrix per rank", bucket.id);
        assert_eq!(bucket.shard_size(), Some(bucket.numel() / 2));
    }
    let rooted: Vec<Vec<u32>> = p
        .buckets
        .iter()
        .filter(|b| b.owner_ranges().is_some())
        .map(|b| b.params.clone())
        .collect();
    assert_eq!(rooted, vec![vec![3], vec![0]], "proj0 and head have no partner");
    assert_eq!(p.report.padding_elements, 0);
    let mix = &p.report.collective_mix;
    let alone = 4096.0 + 1024.0 * 512.0;
    assert_eq!(
        (mix.reduce, mix.broadcast),
        (alone * 4.0, alone * 2.0),
        "proj0 and head alone are rooted"
    );
    assert_eq!(mix.reduce_scatter, 0.5 * (3.0 * 16384.0 + 8192.0) * 4.0);
    let rooted_layout = plan(
        &registry,
        &Config {
            muon_layout: MuonLayout::CompactRooted,
            ..cfg.clone()
        },
        2,
    );
    assert!(p.report.wire_over_lower_bound < rooted_layout.report.wire_over_lower_bound);
    assert_eq!(rooted_layout.report.collective_mix.reduce_scatter, 0.0);
    assert!(p.report.grad_wait_fraction > rooted_layout.report.grad_wait_fraction);
    let traffic: f64 = p
        .report
        .traffic
        .iter()
        .map(|t| t.grad_bytes_per_rank + t.param_bytes_per_rank)
        .sum();
    assert_eq!(traffic, p.report.wire_bytes_per_rank);
}

/// The group window is the planner's choice: 24 layers at dp=4, where an up/down group spans
/// 1.4 layers and a group of four proj matrices three. Undeclared, the fewest bytes win: every
/// class is grouped (the unbounded window). The candidates are in the report: a twelfth of
/// backward (two layers) groups up/down only and moves more bytes; rooted moves the most.
#[test]
fn the_group_window_is_chosen_among_laid_out_candidates() {
    let p = plan(&layers(24), &Config::default(), 4);
    let grouped = |p: &Plan, name: &str| {
        p.buckets
            .iter()
            .filter(|b| b.shard_size().is_some())
            .flat_map(|b| &b.params)
            .any(|&q| q % 3 == if name == "proj" { 2 } else { 0 })
    };
    assert!(grouped(&p, "up") && grouped(&p, "proj"));
    let choice = &p.report.choice;
    assert_eq!(choice.network, None);
    let windows: Vec<GroupWindow> = choice.alternatives.iter().map(|a| a.group_window).collect();
    assert_eq!(windows, GroupWindow::CANDIDATES);
    assert_eq!(choice.alternatives[choice.chosen].group_window, GroupWindow::Unbounded);
    let bytes = |w: GroupWindow| {
        let a = choice.alternatives.iter().find(|a| a.group_window == w).unwrap();
        assert_eq!(a.modelled_exposed_ms, None, "nothing is modelled undeclared");
        a.wire_bytes_per_rank
    };
    assert_eq!(bytes(GroupWindow::Unbounded), p.report.wire_bytes_per_rank);
    assert!(bytes(GroupWindow::Unbounded) < bytes(GroupWindow::Fraction(12)));
    assert!(bytes(GroupWindow::Fraction(12)) < bytes(GroupWindow::Rooted));
}

/// Elements of a plan's Muon buffers that hold no param (AdamW buckets always end padded to
/// `lcm(dp, 128)`, in every layout alike).
fn muon_padding(plan: &Plan) -> u64 {
    let muon = |route: Route| route == Route::Muon;
    let buffers: u64 = plan.buffers.iter().filter(|b| muon(b.route)).map(|b| b.numel).sum();
    let params: u64 = plan.params.iter().filter(|p| muon(p.route)).map(|p| p.numel).sum();
    buffers - params
}

/// Nothing declared: `compact` never moves more bytes per rank than `padded` — Megatron-LM's
/// own layer-wise layout, element for element — at every dp from 2 to 64 and at larger ones up
/// to 256, on every preset, with no padding in its Muon buffers, and owners are balanced
/// (`auto` is balanced without a network).
#[test]
fn undeclared_compact_never_moves_more_bytes_than_megatron() {
    let dps = (2usize..=64).chain([96, 100, 127, 128, 255, 256]);
    let dps: Vec<usize> = dps.collect();
    for &name in PRESET_NAMES {
        let model = preset(name).unwrap();
        let cfg = Config {
            vocab_size: model.vocab_size,
            ..Config::default()
        };
        assert_eq!((cfg.muon_ownership, cfg.network), (MuonOwnership::Auto, None));
        for &dp in &dps {
            let plans = build_plans(&model, &cfg, dp, &[MuonLayout::Compact, MuonLayout::Padded]).unwrap();
            let (compact, padded) = (&plans[0].report, &plans[1].report);
            assert!(
                compact.wire_bytes_per_rank <= padded.wire_bytes_per_rank,
                "{name} dp {dp}: compact {} bytes, padded {}",
                compact.wire_bytes_per_rank,
                padded.wire_bytes_per_rank
            );
            assert_eq!(muon_padding(&plans[0]), 0, "{name} dp {dp}");
            assert_ne!(compact.ownership, OwnershipMethod::Contiguous, "{name} dp {dp}");
        }
    }
}

/// gpt2-124m at dp 5, the one preset and dp where Newton–Schulz balance costs bytes: its 144
/// units of 768² Muon elements (12 layers of a fused QKV of 3, a projection of 1 and two MLP
/// matrices of 4) leave at least 4 units rooted (144 mod 5), which ties padded's unit of
/// padding, and the groups and packed leftovers that root only 4 put a QKV on top of a busy
/// rank. Declared (with balanced ownership), the 1 % tolerance releases groups (14 units
/// rooted, more bytes than Megatron-LM); undeclared, matrices exchanged between the shards of
/// a bucket balance it at padded's bytes, where Megatron-LM's own owners are 25/24 of the
/// lower bound.
#[test]
fn undeclared_gpt2_124m_at_dp_5_balances_at_megatrons_bytes_by_exchanging_matrices() {
    let model = preset("gpt2-124m").unwrap();
    let cfg = Config {
        vocab_size: model.vocab_size,
        ..Config::default()
    };
    let layouts = [MuonLayout::Compact, MuonLayout::Padded];
    let plans = build_plans(&model, &cfg, 5, &layouts).unwrap();
    let (compact, padded) = (&plans[0].report, &plans[1].report);
    assert!(compact.wire_bytes_per_rank <= padded.wire_bytes_per_rank);
    assert_eq!(compact.ns_makespan_over_lower_bound, 1.0);
    assert_eq!(muon_padding(&plans[0]), 0);
    assert!((padded.ns_makespan_over_lower_bound - 25.0 / 24.0).abs() < 1e-9);
    let declared = Config {
        network: Some(Network {
            hop_latency_us: 3.4,
            bus_bandwidth_gbps: 360.0,
        }),
        muon_ownership: MuonOwnership::Balanced,
        ..cfg
    };
    let plans = build_plans(&model, &declared, 5, &layouts).unwrap();
    let (compact, padded) = (&plans[0].report, &plans[1].report);
    assert!(compact.ns_makespan_over_lower_bound <= 1.01);
    assert!(compact.wire_bytes_per_rank > padded.wire_bytes_per_rank);
}

/// The cause of the bytes above Megatron-LM at dp 6 before the planner released groups and
/// grouped expert stacks across layers: llama3-8b's 32 matrices of each class leave two of each
/// rooted, too coarse to balance Newton–Schulz, so every matrix was rooted (47.1 GB against
/// padded's 44.3); deepseek-v3-like's 256 experts do not divide among 6 ranks, so every stack
/// was rooted. Now both group, and stacks three at a time split 128 experts per rank.
#[test]
fn odd_dp_groups_matrices_and_splits_stacks_across_layers() {
    for name in ["llama3-8b", "deepseek-v3-like"] {
        let model = preset(name).unwrap();
        let cfg = Config {
            vocab_size: model.vocab_size,
            ..Config::default()
        };
        let plans = build_plans(&model, &cfg, 6, &[MuonLayout::Compact, MuonLayout::CompactRooted]).unwrap();
        let (compact, rooted) = (&plans[0], &plans[1]);
        assert!(
            compact.report.wire_bytes_per_rank < 0.96 * rooted.report.wire_bytes_per_rank,
            "{name}: compact {} rooted {}",
            compact.report.wire_bytes_per_rank,
            rooted.report.wire_bytes_per_rank
        );
        let registry = model.registry(&cfg).unwrap();
        let stacks_split = compact.buckets.iter().any(|b| {
            matches!(b.split, BucketSplit::EqualShards { .. })
                && b.params.len() == 3
                && b.params
                    .iter()
                    .all(|&p| registry.params()[p as usize].is_expert_stack())
        });
        assert_eq!(stacks_split, name == "deepseek-v3-like", "{name}");
    }
}

/// Issue 38's figure: llama3-8b at dp 4, Megatron-LM's layout moves 38.9 GB per rank; compact
/// with a twelfth of backward as its window moved 46.6 GB (45.9 now that the matrices still
/// waiting for partners at the end of backward are packed into equal shards); undeclared it
/// takes the fewest bytes, 36.1 GB.
#[test]
fn llama3_8b_at_dp_4_moves_fewer_bytes_than_megatron() {
    let model = preset("llama3-8b").unwrap();
    let cfg = Config {
        vocab_size: model.vocab_size,
        ..Config::default()
    };
    let plans = build_plans(&model, &cfg, 4, &[MuonLayout::Compact, MuonLayout::Padded]).unwrap();
    let gb = |p: &Plan| (p.report.wire_bytes_per_rank / 1e8).round() / 10.0;
    assert_eq!((gb(&plans[0]), gb(&plans[1])), (36.1, 38.9));
    let twelfth = plans[0]
        .report
        .choice
        .alternatives
        .iter()
        .find(|a| a.group_window == GroupWindow::Fraction(12))
        .unwrap();
    assert_eq!((twelfth.wire_bytes_per_rank / 1e8).round() / 10.0, 45.9);
}

/// A declared network is priced: every candidate carries its modelled exposed time, the plan
/// taken has the least, the report names the network, and the figures are part of the plan
/// hash. The expert network applies to an optimizer whose Muon params are all expert stacks.
#[test]
fn a_declared_network_chooses_by_modelled_exposure_and_changes_the_hash() {
    let registry = layers(24);
    let ib = Network {
        hop_latency_us: 14.0,
        bus_bandwidth_gbps: 45.0,
    };
    let declared = Config {
        network: Some(ib),
        ..Config::default()
    };
    let p = plan(&registry, &declared, 4);
    let choice = &p.report.choice;
    assert_eq!(choice.network, Some(ib));
    let exposed: Vec<f64> = choice
        .alternatives
        .iter()
        .map(|a| a.modelled_exposed_ms.unwrap())
        .collect();
    assert_eq!(exposed.len(), GroupWindow::CANDIDATES.len() + 1, "auto adds contiguous");
    let least = exposed.iter().copied().fold(f64::INFINITY, f64::min);
    assert_eq!(exposed[choice.chosen], least);
    let undeclared = plan(&registry, &Config::default(), 4);
    assert_ne!(p.hash, undeclared.hash);
    let slower = plan(
        &registry,
        &Config {
            network: Some(Network {
                bus_bandwidth_gbps: 40.0,
                ..ib
            }),
            ..Config::default()
        },
        4,
    );
    assert_ne!(
        p.hash, slower.hash,
        "the figures are hashed, not only whether one is declared"
    );
    let experts = register(vec![stack("a", &[8, 128, 128]), stack("b", &[8, 128, 128])]);
    let both = Config {
        expert_network: Some(Network {
            hop_latency_us: 3.4,
            bus_bandwidth_gbps: 360.0,
        }),
        ..declared.clone()
    };
    assert_eq!(plan(&experts, &both, 4).report.choice.network, both.expert_network);
    assert_eq!(plan(&registry, &both, 4).report.choice.network, Some(ib));
}

#[test]
fn groups_that_would_unbalance_newton_schulz_are_not_made() {
    // Two stacks of 4 experts at dp=4 split evenly put two experts on every rank; a dense
    // matrix as costly as two experts then lands on top of one rank's (makespan 4 experts).
    // Rooted, the stacks fill around it (makespan 3 experts).
    let registry = register(vec![
        ParamSpec::new("dense", &[320, 128], Dtype::Bf16),
        stack("a", &[4, 128, 128]),
        stack("b", &[4, 128, 128]),
    ]);
    let p = plan(&registry, &Config::default(), 4);
    assert!(
        p.buckets
            .iter()
            .all(|b| b.route != Route::Muon || b.shard_size().is_none())
    );
    let even = plan(
        &registry,
        &Config {
            muon_layout: MuonLayout::CompactRooted,
            ..Config::default()
        },
        4,
    );
    assert_eq!(
        p.report.ns_makespan_over_lower_bound,
        even.report.ns_makespan_over_lower_bound
    );
}

/// Megatron never sees an expert stack: it sees E separate 2-D weights. Registered that way,
/// the padded layout (Megatron's own algorithm) shows Megatron's padding for a DeepSeek-V3-like
/// model — the figures measured by running Megatron-LM's layout code on the same list. A stack
/// registered as one `[E, m, n]` param stays one contiguous item (its param view is one
/// pointer), so its padded layout differs (docs/design.md §4).
#[test]
fn padded_mode_given_experts_one_by_one_has_megatrons_padding() {
    let stacked = preset("deepseek-v3-like").unwrap();
    let stacks = stacked.params.iter().filter(|p| p.is_expert_stack()).count();
    let model = stacked.with_experts_as_params();
    let cfg = Config {
        vocab_size: model.vocab_size,
        muon_layout: MuonLayout::Padded,
        ..Config::default()
    };
    let registry = model.registry(&cfg).unwrap();
    assert!(registry.params().iter().all(|p| !p.is_expert_stack()));
    assert_eq!(registry.params().len(), stacked.params.len() + stacks * 255);
    for (dp, megatron_percent) in [(4usize, 1.39), (8, 3.06), (64, 16.2)] {
        let percent = 100.0 * plan(&registry, &cfg, dp).report.padding_fraction;
        assert!(
            (percent - megatron_percent).abs() < 0.05,
            "dp {dp}: padding {percent:.3} % where Megatron pads {megatron_percent} %"
        );
    }
}

/// Every (bucket, owner) pair of a rooted bucket is one reduce and one broadcast, each paying
/// the ring's latency once, which grows with dp: LPT breaks its ties towards the rank owning
/// the nearest bucket. llama3-70b's TP=8 shards, `compact_rooted`: at dp 64 the pairs fall from
/// 272 (ties to the lowest rank) to 191 against a floor of buckets + dp − 1 = 144, at dp 8 from
/// 239 to 168 (floor 167), with the same Newton–Schulz makespan.
#[test]
fn rooted_buckets_have_few_owners_at_the_same_balance() {
    let model = preset("llama3-70b").unwrap().with_tensor_parallel(8).unwrap();
    let cfg = Config {
        muon_layout: MuonLayout::CompactRooted,
        ..Config::default()
    };
    let registry = model.registry(&cfg).unwrap();
    for (dp, most_pairs, makespan) in [(64, 191, 1.0358), (8, 168, 1.0)] {
        let p = plan(&registry, &cfg, dp);
        let (mut buckets, mut pairs) = (0, 0);
        for bucket in &p.buckets {
            if let BucketSplit::OwnerRanges(ranges) = &bucket.split {
                buckets += 1;
                pairs += ranges.iter().filter(|r| !r.is_empty()).count();
            }
        }
        assert!(pairs >= buckets + dp - 1, "dp {dp}: {pairs} pairs under the floor");
        assert!(pairs <= most_pairs, "dp {dp}: {pairs} (bucket, owner) pairs");
        let ratio = p.report.ns_makespan_over_lower_bound;
        assert!((ratio - makespan).abs() < 1e-4, "dp {dp}: makespan / bound {ratio}");
    }
}

/// `muon_ownership = contiguous` on llama3-70b's TP=8 shards at dp 64: each rank owns one run
/// of consecutive matrices and buckets are cut at owner changes, so every bucket is one
/// (bucket, owner) pair — 80 against balanced ownership's 191 and the floor of buckets + dp − 1
/// that any spread of a bucket over owners pays — every bucket spans at least `bucket_size`,
/// and the Newton–Schulz makespan stays within `total/dp + largest matrix` (here 1.31 × the
/// lower bound against balanced's 1.036: the price, docs/design.md §4). Every layout that takes
/// the ownership gives the same buckets; padded refuses it naming the field.
#[test]
fn contiguous_ownership_gives_each_bucket_one_owner() {
    let model = preset("llama3-70b").unwrap().with_tensor_parallel(8).unwrap();
    let dp = 64;
    let mut memberships = Vec::new();
    for layout in [MuonLayout::Compact, MuonLayout::CompactRooted, MuonLayout::Allreduce] {
        let cfg = Config {
            muon_layout: layout,
            muon_ownership: MuonOwnership::Contiguous,
            ..Config::default()
        };
        let registry = model.registry(&cfg).unwrap();
        let p = plan(&registry, &cfg, dp);
        assert_eq!(p.report.ownership, OwnershipMethod::Contiguous);
        let muon: Vec<_> = p.buckets.iter().filter(|b| b.route == Route::Muon).collect();
        let mut last_owner = 0;
        for bucket in &muon {
            let BucketSplit::OwnerRanges(ranges) = &bucket.split else {
                panic!("bucket {} is not rooted", bucket.id);
            };
            let owners: Vec<usize> = (0..dp).filter(|&r| !ranges[r].is_empty()).collect();
            assert_eq!(owners.len(), 1, "bucket {}: owners {owners:?}", bucket.id);
            assert!(owners[0] >= last_owner, "bucket {}: owners go back", bucket.id);
            last_owner = owners[0];
            assert!(
                bucket.numel() >= cfg.effective_bucket_size(dp),
                "bucket {} spans {}",
                bucket.id,
                bucket.numel()
            );
        }
        assert_eq!(muon.len(), 80, "{}", layout.name());
        let ratio = p.report.ns_makespan_over_lower_bound;
        assert!((ratio - 1.3088).abs() < 1e-4, "makespan / bound {ratio}");
        memberships.push(
            p.buckets
                .iter()
                .map(|b| (b.route, b.params.clone()))
                .collect::<Vec<_>>(),
        );
    }
    assert!(
        memberships.windows(2).all(|w| w[0] == w[1]),
        "the layouts cut different buckets"
    );
    let padded = Config {
        muon_layout: MuonLayout::Padded,
        muon_ownership: MuonOwnership::Contiguous,
        ..Config::default()
    };
    let err = padded.validate().unwrap_err();
    assert_eq!(err.kind, ErrorKind::IncompatibleOptions, "{err}");
    assert!(
        err.message.contains("muon_ownership: contiguous needs a compact"),
        "{err}"
    );
}

/// With `mxfp8_param_gather`, the MXFP8 params travel as bf16 on their bucket's staging view
/// and the others in param storage: they get buffers of their own, so every bucket is gathered
/// by one collective over its own bytes (a bucket holding both would be gathered twice, each
/// time over the whole bucket). Without the gather they share one buffer.
#[test]
fn staged_params_never_share_a_bucket_with_params_gathered_in_place() {
    let specs = || -> Vec<ParamSpec> {
        (0..12)
            .map(|i| {
                let mut spec = ParamSpec::new(format!("w{i}"), &[64, 64], Dtype::Bf16);
                spec.flags = ParamFlags(ParamFlags::NO_MUON);
                if i % 2 == 0 {
                    spec.flags = ParamFlags(ParamFlags::NO_MUON | ParamFlags::MXFP8);
                }
                spec
            })
            .collect()
    };
    for gather in [false, true] {
        let cfg = Config {
            mxfp8_param_gather: gather,
            bucket_size: 64 * 64 * 3,
            ..Config::default()
        };
        let mut registry = Registry::default();
        for spec in specs() {
            registry.add(spec, &cfg).unwrap();
        }
        let p = build_plan(registry.params(), registry.routes(), &cfg, 2).unwrap();
        let staged = |id: &u32| registry.params()[*id as usize].is_staged(&cfg);
        for bucket in &p.buckets {
            let count = bucket.params.iter().filter(|id| staged(id)).count();
            assert!(
                count == 0 || count == bucket.params.len(),
                "gather {gather}: bucket {} mixes staged and in-place params",
                bucket.id
            );
            assert_eq!(bucket.param_start.is_none(), count > 0, "bucket {}", bucket.id);
        }
        assert_eq!(p.buffers.len(), if gather { 2 } else { 1 }, "gather {gather}");
    }
}

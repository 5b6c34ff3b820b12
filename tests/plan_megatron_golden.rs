//! The `padded` layout against golden vectors computed with Megatron-LM's
//! `LayerWiseDistributedOptimizer._compute_per_buffer_param_layout` (main branch).

use muon_opt::config::{Config, Dtype, MuonLayout};
use muon_opt::model::{ParamSpec, Route};
use muon_opt::plan::{Plan, build_plan};

/// Four layers, forward order per layer: qkv 3072×1024, proj 1024×1024, fc1 8192×1024,
/// fc2 1024×4096 (67,108,864 elements).
fn four_layers() -> Vec<ParamSpec> {
    let mut params = Vec::new();
    for layer in 0..4 {
        for (name, rows, cols) in [
            ("qkv", 3072, 1024),
            ("proj", 1024, 1024),
            ("fc1", 8192, 1024),
            ("fc2", 1024, 4096),
        ] {
            params.push(ParamSpec::new(
                format!("layer{layer}.{name}"),
                &[rows, cols],
                Dtype::Bf16,
            ));
        }
    }
    params
}

/// One-row matrices, so Megatron's `max·min²` cost equals the element count as for the 1-D
/// params of the upstream unit tests. `numels` is in forward (registration) order.
fn rows(numels: &[u64]) -> Vec<ParamSpec> {
    numels
        .iter()
        .enumerate()
        .map(|(i, &n)| ParamSpec::new(format!("p{i}"), &[1, n], Dtype::Bf16))
        .collect()
}

/// Expected `(start, end)` of every bucket.
type Bounds = &'static [(u64, u64)];

fn padded(params: &[ParamSpec], bucket_size: u64, dp: usize) -> Plan {
    let routes = vec![Route::Muon; params.len()];
    let cfg = Config {
        bucket_size,
        muon_layout: MuonLayout::Padded,
        ..Config::default()
    };
    build_plan(params, &routes, &cfg, dp).unwrap()
}

fn bucket_bounds(plan: &Plan) -> Vec<(u64, u64)> {
    plan.buckets.iter().map(|b| (b.start, b.end)).collect()
}

fn padding(plan: &Plan) -> u64 {
    plan.report.padding_elements
}

#[test]
fn four_layers_at_40m_elements_per_bucket() {
    let params = four_layers();
    let total: u64 = params.iter().map(ParamSpec::numel).sum();
    assert_eq!(total, 67_108_864);
    let cases: [(usize, Bounds, u64); 4] = [
        (2, &[(0, 50_331_648), (50_331_648, 67_108_864)], 0),
        (3, &[(0, 56_623_104), (56_623_104, 81_788_928)], 14_680_064),
        (4, &[(0, 58_720_256), (58_720_256, 92_274_688)], 25_165_824),
        (8, &[(0, 67_108_864)], 0),
    ];
    for (dp, buckets, pad) in cases {
        let plan = padded(&params, 40_000_000, dp);
        assert_eq!(bucket_bounds(&plan), buckets, "dp {dp}");
        assert_eq!(padding(&plan), pad, "dp {dp}");
    }
    let dp4 = padded(&params, 40_000_000, 4);
    assert!((dp4.report.padding_fraction - 0.375).abs() < 1e-12);
}

#[test]
fn four_layers_at_12m_elements_per_bucket_dp4_offsets() {
    let params = four_layers();
    let plan = padded(&params, 12_582_912, 4);
    assert_eq!(bucket_bounds(&plan), [(0, 41_943_040), (41_943_040, 75_497_472)]);
    let id = |name: &str| params.iter().position(|p| p.name == name).unwrap();
    let at = |name: &str| {
        let p = plan.param(id(name));
        (p.offset, p.offset + p.numel, p.bucket, p.single_owner().unwrap())
    };
    assert_eq!(at("layer3.fc1"), (0, 8_388_608, 0, 0));
    assert_eq!(at("layer3.proj"), (8_388_608, 9_437_184, 0, 0));
    let fc1 = at("layer2.fc1");
    assert_eq!((fc1.0, fc1.2, fc1.3), (10_485_760, 0, 1));
    let proj = at("layer0.proj");
    assert_eq!((proj.0, proj.1, proj.2), (71_303_168, 72_351_744, 1));
}

#[test]
fn six_equal_params_absorb_into_one_bucket() {
    let plan = padded(&rows(&[256; 6]), 1280, 4);
    assert_eq!(bucket_bounds(&plan), [(0, 2048)]);
    assert_eq!(padding(&plan), 512);
}

#[test]
fn eight_equal_params_pack_without_padding() {
    let plan = padded(&rows(&[256; 8]), 1280, 4);
    assert_eq!(bucket_bounds(&plan).last().unwrap().1, 2048);
    assert_eq!(padding(&plan), 0);
}

#[test]
fn mixed_sizes_absorb_into_a_larger_bucket() {
    let backward: [u64; 6] = [192, 192, 256, 128, 128, 192];
    let forward: Vec<u64> = backward.iter().rev().copied().collect();
    let plan = padded(&rows(&forward), 448, 2);
    assert_eq!(plan.buckets.len(), 2);
    assert_eq!(plan.buckets[1].end, 1408);
    for bucket in &plan.buckets {
        let shard = bucket.shard_size().unwrap();
        for &p in &bucket.params {
            let placement = plan.param(p as usize);
            let owner = placement.single_owner().unwrap() as u64;
            let shard_start = bucket.start + owner * shard;
            assert!(shard_start <= placement.offset && placement.offset + placement.numel <= shard_start + shard);
        }
    }
}

//! `param_sharding` (issue 41): the option and its policy are validated, agreed at finalize
//! and part of the plan hash; the plan reports each rank's persistent bytes and the peak
//! working set of gathered buckets in both modes (the iteration: `tests/sharded_parity.rs`).

mod support;

use std::process::Command;
use std::time::Duration;

use muon_opt::backend::cuda::CallerStream;
use muon_opt::backend::host::comm::HostGroup;
use muon_opt::comm::{Communicator, Transport};
use muon_opt::config::{Config, Dtype, MuonLayout, ParamSharding};
use muon_opt::error::{Error, ErrorKind};
use muon_opt::model::{ParamSpec, Route};
use muon_opt::optimizer::Optimizer;
use muon_opt::plan::presets::preset;
use muon_opt::plan::{BucketSplit, Plan, build_plan, build_plans};
use support::ranks::on_ranks;

fn sharded(cfg: Config) -> Config {
    Config {
        param_sharding: ParamSharding::Sharded,
        ..cfg
    }
}

fn finalize(configs: [Config; 2]) -> Vec<Result<(), Error>> {
    let comms = HostGroup::new(2, Duration::from_secs(20));
    on_ranks(comms.into_iter().zip(configs), |_, (comm, cfg)| {
        let claim = Communicator::new(Transport::Host(comm)).claim().unwrap();
        let mut opt = Optimizer::new(cfg, claim, CallerStream::NULL).unwrap();
        for i in 0..4 {
            opt.add_param(
                ParamSpec::new(format!("layers.{i}.weight"), &[64, 32], Dtype::Bf16),
                None,
            )
            .unwrap();
        }
        opt.add_param(ParamSpec::new("norm.weight", &[64], Dtype::Bf16), None)
            .unwrap();
        opt.finalize()
    })
}

/// Sharded params with MXFP8 gathered (`mxfp8_param_gather`) are accepted: sharded gathers
/// MXFP8 params as bf16 into its working set either way (tests/sharded_parity.rs trains both
/// bitwise like replicated).
#[test]
fn sharded_is_refused_with_the_options_it_cannot_run_with() {
    let gathered = Config {
        mxfp8_param_gather: true,
        ..Config::default()
    };
    sharded(gathered).validate().expect("sharded with MXFP8 gathered");
    let param_gather = Config {
        overlap_param_gather: false,
        ..Config::default()
    };
    let grad_reduce = Config {
        overlap_grad_reduce: false,
        ..Config::default()
    };
    for (cfg, field) in [
        (param_gather, "overlap_param_gather"),
        (grad_reduce, "overlap_grad_reduce"),
    ] {
        cfg.validate().expect("valid replicated");
        let err = sharded(cfg).validate().unwrap_err();
        assert_eq!(err.kind, ErrorKind::IncompatibleOptions, "{err}");
        assert!(
            err.message
                .starts_with(&format!("param_sharding: sharded needs {field} = 1")),
            "{err}"
        );
    }
}

/// Ranks that all ask for sharded finalize; a rank asking for sharded beside a replicated one
/// gets the mismatch, as the replicated rank does, instead of leaving it in a collective
/// alone, and so does a rank with another sharding policy.
#[test]
fn finalize_agrees_on_sharding() {
    for result in finalize([sharded(Config::default()), sharded(Config::default())]) {
        result.expect("every rank sharded");
    }
    for result in finalize([sharded(Config::default()), Config::default()]) {
        let err = result.unwrap_err();
        assert_eq!(err.kind, ErrorKind::PlanMismatch, "{err}");
        assert!(err.message.contains("'param_sharding'"), "{err}");
    }
    let policy = Config {
        param_prefetch_buckets: 3,
        ..sharded(Config::default())
    };
    for result in finalize([sharded(Config::default()), policy]) {
        let err = result.unwrap_err();
        assert!(err.message.contains("'param_prefetch_buckets'"), "{err}");
    }
}

fn gpt2(cfg: &Config, dp: usize) -> Plan {
    let model = preset("gpt2-124m").unwrap();
    let registry = model.registry(cfg).unwrap();
    build_plan(registry.params(), registry.routes(), cfg, dp).unwrap()
}

/// Sharded, every element of every param is kept by exactly one rank (the sum over ranks of
/// the persistent bytes is the model's unpadded bytes), replicated by every rank; the policy
/// is in the plan hash; compact lays out no groups.
#[test]
fn sharded_ranks_keep_each_element_once() {
    let model = preset("gpt2-124m").unwrap();
    for layout in MuonLayout::ALL.iter().copied().filter(|&l| l != MuonLayout::Allreduce) {
        for dp in [1, 3, 4] {
            let cfg = sharded(Config {
                muon_layout: layout,
                grad_dtype: Dtype::Bf16,
                ..Config::default()
            });
            let plan = gpt2(&cfg, dp);
            let s = &plan.report.sharding;
            let params: u64 = model.params.iter().map(|p| p.numel() * p.dtype.size() as u64).sum();
            let grads: u64 = model.params.iter().map(|p| p.numel() * 2).sum();
            assert_eq!(s.sharded.params.iter().sum::<u64>(), params, "{layout:?} dp {dp}");
            assert_eq!(s.sharded.grads.iter().sum::<u64>(), grads, "{layout:?} dp {dp}");
            assert_eq!(s.replicated.params, vec![plan.report.param_buffer_bytes; dp]);
            assert_eq!(s.replicated.working_set, 0);
            if layout == MuonLayout::Compact {
                assert!(
                    plan.buckets
                        .iter()
                        .all(|b| b.route == Route::Adamw || matches!(b.split, BucketSplit::OwnerRanges(_)))
                );
            }
            let replicated = gpt2(
                &Config {
                    param_sharding: ParamSharding::Replicated,
                    ..cfg.clone()
                },
                dp,
            );
            assert_ne!(replicated.hash, plan.hash);
            let policy = gpt2(
                &Config {
                    param_prefetch_buckets: 2,
                    ..cfg.clone()
                },
                dp,
            );
            assert_ne!(policy.hash, plan.hash);
        }
    }
}

/// The working set grows with the prefetch window, holds at least the largest bucket, and
/// without resharding after the forward every param is gathered by the backward.
#[test]
fn the_working_set_follows_the_policy() {
    let base = sharded(Config {
        muon_layout: MuonLayout::CompactRooted,
        bucket_size: 2_000_000,
        ..Config::default()
    });
    let set = |prefetch: u32, reshard: bool| {
        let cfg = Config {
            param_prefetch_buckets: prefetch,
            reshard_after_forward: reshard,
            ..base.clone()
        };
        let plan = gpt2(&cfg, 4);
        (plan.report.sharding.sharded.working_set, plan)
    };
    let (one, plan) = set(0, true);
    let largest = plan
        .buckets
        .iter()
        .map(|b| b.numel() * (b.dtype.size() as u64 + 4))
        .max()
        .unwrap();
    assert_eq!(one, largest);
    let (two, _) = set(1, true);
    let (all, _) = set(1000, true);
    assert!(one < two && two <= all, "{one} {two} {all}");
    let every_param: u64 = plan.buffers.iter().map(|b| b.numel * b.dtype.size() as u64).sum();
    let (kept, _) = set(0, false);
    assert!(kept > every_param && kept < every_param + one, "{kept} {every_param}");
}

/// `muon-opt plan` for llama3-70b at dp 64 without tensor parallelism: replicated needs more
/// than an 80 GB GPU holds before any activation; sharded (compact) fits with over half of it
/// left for activations.
#[test]
fn llama3_70b_at_dp_64_fits_an_80_gb_gpu_sharded() {
    let out = Command::new(env!("CARGO_BIN_EXE_muon-opt"))
        .args(["plan", "--model", "llama3-70b", "--dp", "64", "--layout", "compact"])
        .args(["--param-sharding", "sharded", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let plan = &json["plans"][0];
    let replicated = plan["device_bytes"]["total"].as_u64().unwrap();
    let sharded = plan["sharded_device_bytes"].as_u64().unwrap();
    assert!(replicated > 80_000_000_000, "{replicated}");
    assert!(sharded < 40_000_000_000, "{sharded}");
    let gb = |bytes: u64| format!("{:.1} GB", bytes as f64 / 1e9);
    support::docs::assert_quotes(
        "README.md",
        &[format!(
            "{} allocated per rank sharded against {} replicated",
            gb(sharded),
            gb(replicated)
        )],
    );
    support::docs::assert_quotes("docs/design.md", &[format!("{} allocated", gb(sharded))]);
    assert!(sharded > plan["device_bytes"]["masters"].as_u64().unwrap());
    let plans = build_plans(
        &preset("llama3-70b").unwrap(),
        &sharded_cfg_for_70b(),
        64,
        &[MuonLayout::Compact],
    )
    .unwrap();
    assert_eq!(format!("{:#018x}", plans[0].hash), plan["hash"].as_str().unwrap());
}

fn sharded_cfg_for_70b() -> Config {
    sharded(Config {
        vocab_size: preset("llama3-70b").unwrap().vocab_size,
        ..Config::default()
    })
}

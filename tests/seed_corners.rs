//! Corners of the seed behaviours that parity alone would not catch if they regressed: the
//! collectives the `allreduce` layout really issues, one quantize per MXFP8 param per step,
//! MXFP8 only on bf16 params, finalize agreeing on `grad_dtype` and `mxfp8_param_gather`,
//! param overlap without grad overlap, an evaluation iteration without a step, and a
//! checkpoint index whose splits or components do not follow from the model.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use muon_opt::backend::cuda::CallerStream;
use muon_opt::backend::host::comm::HostGroup;
use muon_opt::backend::host::executor::HostBackend;
use muon_opt::backend::ops::{CollOp, Mem, Op};
use muon_opt::backend::recording::Recording;
use muon_opt::comm::{Communicator, Transport};
use muon_opt::config::{CommMode, Config, Dtype, MuonLayout};
use muon_opt::error::{Error, ErrorKind};
use muon_opt::model::{ParamFlags, ParamSpec, Registry, Route};
use muon_opt::numerics::muon::MuonOptions;
use muon_opt::optimizer::Optimizer;
use muon_opt::plan::build_plan;
use support::checkpoint::{Group, all_ok, config as ckpt_config, model as ckpt_model};
use support::cuda::{cuda_model, iterate, runtime};
use support::ranks::on_ranks;
use support::tempdir::TempDir;
use support::training::bits;

const DP: usize = 2;

fn config(layout: MuonLayout, mxfp8_param_gather: bool) -> Config {
    Config {
        bucket_size: 4096,
        muon_layout: layout,
        mxfp8_param_gather,
        grad_dtype: Dtype::Bf16,
        host_comm_mode: CommMode::Eager,
        clip_grad: 0.0,
        ..Config::default()
    }
}

/// Runs `steps` iterations of `cuda_model` on DP host ranks, every op recorded; returns each
/// rank's ops and final params (bits).
fn recorded_run(cfg: &Config, steps: u64) -> Vec<(Vec<Op>, Vec<Vec<u32>>)> {
    let specs = cuda_model();
    let muon = MuonOptions::from_config(cfg);
    on_ranks(HostGroup::new(DP, Duration::from_secs(20)), |rank, comm| {
        let log = Arc::new(Mutex::new(Vec::new()));
        let host = HostBackend::new(Communicator::new(Transport::Host(comm)), cfg.host_comm_mode, muon).unwrap();
        let mut rt = runtime(cfg, &specs, rank, DP, Box::new(Recording::new(host, log.clone())));
        for step in 0..steps {
            iterate(&mut rt, rank, step, false);
        }
        rt.synchronize().unwrap();
        let params = (0..specs.len()).map(|p| bits(&rt.param_values(p).unwrap())).collect();
        drop(rt);
        let ops = log.lock().unwrap().clone();
        (ops, params)
    })
}

/// The grad buffers of the buckets holding Muon params under `cfg`.
fn muon_buffers(cfg: &Config) -> Vec<u32> {
    let mut registry = Registry::default();
    for spec in cuda_model() {
        registry.add(spec, cfg).unwrap();
    }
    let plan = build_plan(registry.params(), registry.routes(), cfg, DP).unwrap();
    let mut buffers: Vec<u32> = plan
        .buckets
        .iter()
        .filter(|b| b.params.iter().any(|&p| registry.routes()[p as usize] == Route::Muon))
        .map(|b| b.buffer)
        .collect();
    buffers.dedup();
    buffers
}

/// The `allreduce` layout all-reduces every Muon gradient (a reduce to the owner would pass the
/// parity suites as well) and brings params back by broadcast from their owners.
#[test]
fn the_allreduce_layout_all_reduces_the_gradients() {
    let cfg = config(MuonLayout::Allreduce, false);
    let muon = muon_buffers(&cfg);
    assert!(!muon.is_empty());
    let runs = recorded_run(&cfg, 1);
    let collectives: Vec<&CollOp> = runs[0]
        .0
        .iter()
        .filter_map(|op| match op {
            Op::Collectives(ops) => Some(ops.iter()),
            _ => None,
        })
        .flatten()
        .collect();
    let on_grads = |c: &CollOp| match c {
        CollOp::Reduce { span, .. }
        | CollOp::Broadcast { span, .. }
        | CollOp::ReduceScatter { span }
        | CollOp::AllGather { span }
        | CollOp::AllReduce { span } => matches!(span.mem, Mem::Grad(b) if muon.contains(&b)),
    };
    let grads: Vec<&&CollOp> = collectives.iter().filter(|c| on_grads(c)).collect();
    assert!(!grads.is_empty());
    assert!(
        grads.iter().all(|c| matches!(c, CollOp::AllReduce { .. })),
        "gradient collectives: {grads:?}"
    );
    assert!(collectives.iter().any(|c| matches!(c, CollOp::Broadcast { .. })));
}

/// With MXFP8 params under every layout (gather on and off), each MXFP8 param is quantized
/// exactly once per step, and the allreduce layout's MXFP8 params equal the bf16-gather path's
/// bit for bit.
#[test]
fn each_mxfp8_param_is_quantized_once_per_step_in_every_layout() {
    let specs = cuda_model();
    let mxfp8: Vec<u32> = specs
        .iter()
        .enumerate()
        .filter(|(_, s)| s.flags.has(ParamFlags::MXFP8))
        .map(|(p, _)| p as u32)
        .collect();
    assert!(!mxfp8.is_empty());
    for layout in [MuonLayout::Compact, MuonLayout::Padded, MuonLayout::Allreduce] {
        let mut results = Vec::new();
        for gather in [false, true] {
            let runs = recorded_run(&config(layout, gather), 2);
            let ops = &runs[0].0;
            let steps: Vec<usize> = ops
                .iter()
                .enumerate()
                .filter(|(_, op)| matches!(op, Op::FinishStep { .. }))
                .map(|(i, _)| i)
                .collect();
            assert_eq!(steps.len(), 2, "{layout:?}: two steps");
            // Between the first step's scalars and the second's: one step's quantizes.
            let between = &ops[steps[0]..steps[1]];
            for &p in &mxfp8 {
                let count = between
                    .iter()
                    .filter(|op| matches!(op, Op::Mxfp8Quantize { param, .. } if *param == p))
                    .count();
                assert_eq!(
                    count, 1,
                    "{layout:?} gather {gather}: param {p} quantized {count} times"
                );
            }
            results.push(runs[0].1.clone());
        }
        for p in &mxfp8 {
            assert_eq!(
                results[0][*p as usize], results[1][*p as usize],
                "{layout:?}: MXFP8 param {p} differs between gather off and on"
            );
        }
    }
}

#[test]
fn the_mxfp8_flag_is_refused_on_a_param_that_is_not_bf16() {
    let mut spec = ParamSpec::new("w", &[64, 64], Dtype::F32);
    spec.flags = ParamFlags(ParamFlags::MXFP8);
    let err = Registry::default().add(spec, &Config::default()).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidParam);
    assert!(
        err.message.contains("param 'w'") && err.message.contains("bf16"),
        "{}",
        err.message
    );
}

fn finalize_pair(configs: [Config; 2]) -> Vec<Result<(), Error>> {
    on_ranks(
        HostGroup::new(2, Duration::from_secs(20)).into_iter().zip(configs),
        |_, (comm, cfg)| {
            let claim = Communicator::new(Transport::Host(comm)).claim().unwrap();
            let mut opt = Optimizer::new(cfg, claim, CallerStream::NULL).unwrap();
            for spec in cuda_model() {
                opt.add_param(spec, None).unwrap();
            }
            opt.finalize()
        },
    )
}

/// Ranks that disagree on the gradient dtype or on MXFP8 param gather would issue collectives
/// of different sizes: finalize fails on both, naming the field.
#[test]
fn finalize_agreement_covers_grad_dtype_and_mxfp8_param_gather() {
    let base = config(MuonLayout::Compact, false);
    let cases = [
        (
            Config {
                grad_dtype: Dtype::F32,
                ..base.clone()
            },
            "grad_dtype",
        ),
        (
            Config {
                mxfp8_param_gather: true,
                ..base.clone()
            },
            "mxfp8_param_gather",
        ),
    ];
    for (other, field) in cases {
        for (rank, result) in finalize_pair([base.clone(), other]).iter().enumerate() {
            let err = result.as_ref().expect_err("finalize must fail on every rank");
            assert_eq!(err.kind, ErrorKind::PlanMismatch, "rank {rank}");
            assert!(
                err.message.contains(&format!("'{field}'")),
                "rank {rank}: {}",
                err.message
            );
        }
    }
}

/// Param-gather overlap with gradient overlap off (and the reverse) gives the params of both on,
/// bit for bit.
#[test]
fn overlap_switches_set_alone_give_the_same_params() {
    let both = recorded_run(&config(MuonLayout::Compact, false), 3);
    for (grad, param) in [(false, true), (true, false)] {
        let cfg = Config {
            overlap_grad_reduce: grad,
            overlap_param_gather: param,
            ..config(MuonLayout::Compact, false)
        };
        let runs = recorded_run(&cfg, 3);
        for rank in 0..DP {
            assert_eq!(
                runs[rank].1, both[rank].1,
                "grad overlap {grad}, param overlap {param}: rank {rank}"
            );
        }
    }
}

/// An evaluation iteration — zero_grad and the forward's waits, no backward, no step — changes
/// no param, and training resumes as if it had not happened.
#[test]
fn an_evaluation_iteration_without_a_step_changes_nothing() {
    for gather in [false, true] {
        let cfg = config(MuonLayout::Compact, gather);
        let specs = cuda_model();
        let muon = MuonOptions::from_config(&cfg);
        let runs = on_ranks(HostGroup::new(DP, Duration::from_secs(20)), |rank, comm| {
            let host = HostBackend::new(Communicator::new(Transport::Host(comm)), cfg.host_comm_mode, muon).unwrap();
            let mut rt = runtime(&cfg, &specs, rank, DP, Box::new(host));
            iterate(&mut rt, rank, 0, false);
            let before: Vec<Vec<u32>> = (0..specs.len()).map(|p| bits(&rt.param_values(p).unwrap())).collect();
            for _ in 0..2 {
                rt.zero_grad().unwrap();
                for b in 0..rt.plan().buckets.len() as u32 {
                    rt.wait_params(b).unwrap();
                }
            }
            let after: Vec<Vec<u32>> = (0..specs.len()).map(|p| bits(&rt.param_values(p).unwrap())).collect();
            iterate(&mut rt, rank, 1, false);
            let resumed: Vec<Vec<u32>> = (0..specs.len()).map(|p| bits(&rt.param_values(p).unwrap())).collect();
            (before, after, resumed)
        });
        let plain = recorded_run(&cfg, 2);
        for (rank, (before, after, resumed)) in runs.iter().enumerate() {
            assert_eq!(
                before, after,
                "gather {gather}: rank {rank}: evaluation changed a param"
            );
            assert_eq!(
                *resumed, plain[rank].1,
                "gather {gather}: rank {rank}: training after evaluation differs"
            );
        }
    }
}

/// The muon routes of the test model stay Muon (the corners above exercise Muon params).
#[test]
fn the_model_has_muon_and_adamw_params() {
    let mut registry = Registry::default();
    for spec in cuda_model() {
        registry.add(spec, &Config::default()).unwrap();
    }
    assert!(registry.routes().contains(&Route::Muon) && registry.routes().contains(&Route::Adamw));
}

/// Edits `index.json` of a saved checkpoint with `edit`, then loads: every rank fails with
/// `kind`, the message holding `needle`.
fn load_after_editing_the_index(label: &str, edit: impl Fn(&mut serde_json::Value), kind: ErrorKind, needle: &str) {
    let tmp = TempDir::new(label);
    let dir = tmp.join("ckpt");
    let cfg = ckpt_config(MuonLayout::Compact);
    let mut group = Group::new(&cfg, 2);
    group.train(1);
    all_ok(group.save(&dir), "save");
    // The file's CRC-32 covers the exact bytes of "index": rewrite both, so the load gets past
    // the checksum to the check under test.
    let path = dir.join("index.json");
    let file: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let mut index = file["index"].clone();
    edit(&mut index);
    let text = serde_json::to_string(&index).unwrap();
    let rewritten = format!(
        r#"{{"format":{},"format_version":{},"crc32":"{:08x}","index":{text}}}"#,
        file["format"],
        file["format_version"],
        crc32fast::hash(text.as_bytes())
    );
    std::fs::write(&path, rewritten).unwrap();
    let mut fresh = Group::new(&cfg, 2);
    for result in fresh.load(&dir) {
        let err = result.expect_err(&format!("{label}: load must fail"));
        assert_eq!(err.kind, kind, "{label}: {}", err.message);
        if !err.message.contains("failed on rank") {
            assert!(
                err.message.contains(needle),
                "{label}: '{}' lacks '{needle}'",
                err.message
            );
        }
    }
}

fn fused(index: &mut serde_json::Value) -> &mut serde_json::Value {
    let params = index["params"].as_array_mut().unwrap();
    params
        .iter_mut()
        .find(|p| p["split_sizes"].as_array().is_some_and(|s| s.len() > 1))
        .expect("the checkpoint model has a fused param")
}

#[test]
fn a_checkpoint_whose_splits_or_components_do_not_follow_from_the_model_is_refused() {
    assert!(ckpt_model().iter().any(|s| !s.split_sizes.is_empty()));
    load_after_editing_the_index(
        "ckpt_groups",
        |index| fused(index)["split_groups"] = serde_json::json!(2),
        ErrorKind::CheckpointMismatch,
        "split_groups is 1 but the checkpoint has 2",
    );
    load_after_editing_the_index(
        "ckpt_components",
        |index| {
            // The same items, another shape: [rows, cols] read as [cols, rows].
            let oblong = index["params"]
                .as_array_mut()
                .unwrap()
                .iter_mut()
                .flat_map(|p| p["components"].as_array_mut().unwrap().iter_mut())
                .find(|c| c["shape"].as_array().unwrap().len() == 2 && c["shape"][0] != c["shape"][1])
                .expect("a 2-D component that is not square");
            let mut shape = oblong["shape"].as_array().unwrap().clone();
            shape.reverse();
            oblong["shape"] = serde_json::Value::Array(shape);
        },
        ErrorKind::CheckpointCorrupt,
        "do not follow from its shape and splits",
    );
}

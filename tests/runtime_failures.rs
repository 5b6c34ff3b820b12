//! Failure paths of the runtime: a non-finite gradient on one rank, a rank that stops calling,
//! and wrong call order.

mod support;

use std::time::Duration;

use muon_opt::config::Config;
use muon_opt::error::ErrorKind;
use muon_opt::optimizer::Optimizer;
use support::ranks::{on_ranks, optimizers};
use support::training::{ARGS, init_values, model};

fn register(opt: &mut Optimizer) {
    for (p, spec) in model().into_iter().enumerate() {
        let n = spec.numel();
        opt.add_param(spec, Some(muon_opt::init_data::InitData::from_f32(&init_values(p, n))))
            .unwrap();
    }
}

fn write_grads(opt: &mut Optimizer, value: impl Fn(usize, usize) -> f32) {
    for p in (0..model().len()).rev() {
        let n = model()[p].numel() as usize;
        let ptr = opt.running().unwrap().address(p, true).cast::<f32>();
        let grad = unsafe { std::slice::from_raw_parts_mut(ptr, n) };
        for (i, g) in grad.iter_mut().enumerate() {
            *g = value(p, i);
        }
        opt.grad_ready(p as u32).unwrap();
    }
}

#[test]
fn a_non_finite_gradient_on_one_rank_skips_the_step_everywhere_and_changes_nothing() {
    let dp = 3;
    let cfg = Config {
        bucket_size: 3000,
        ..Config::default()
    };
    let opts = optimizers(&cfg, dp, Duration::from_secs(20));
    on_ranks(opts, |rank, mut opt| {
        register(&mut opt);
        opt.finalize().unwrap();
        opt.zero_grad().unwrap();
        write_grads(&mut opt, |p, i| ((p * 7 + i) % 13) as f32 * 1e-3);
        assert!(!opt.step(&ARGS).unwrap().skipped);
        let before = opt.running().unwrap().owned_state().unwrap();
        let params_before: Vec<Vec<f32>> = (0..model().len())
            .map(|p| opt.running().unwrap().param_values(p).unwrap())
            .collect();
        opt.zero_grad().unwrap();
        write_grads(
            &mut opt,
            |p, i| if rank == 1 && p == 2 && i == 5 { f32::NAN } else { 1e-3 },
        );
        let info = opt.step(&ARGS).unwrap();
        assert!(
            info.skipped,
            "rank {rank}: a NaN on rank 1 must skip the step on every rank"
        );
        assert_eq!(info.step, 1, "a skipped step is not counted");
        assert!(!info.grad_norm.is_finite());
        opt.synchronize().unwrap();
        let after = opt.running().unwrap().owned_state().unwrap();
        assert_eq!(
            format!("{before:?}"),
            format!("{after:?}"),
            "rank {rank}: state changed on a skipped step"
        );
        for (p, values) in params_before.iter().enumerate() {
            let now = opt.running().unwrap().param_values(p).unwrap();
            assert_eq!(
                values.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                now.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
        opt.zero_grad().unwrap();
        write_grads(&mut opt, |_, _| 1e-3);
        assert!(
            !opt.step(&ARGS).unwrap().skipped,
            "training continues after a skipped step"
        );
    });
}

/// The ranks still calling get `CommTimeout` (the test returning at all shows nobody hangs),
/// and from then on every call — also those that need no peer — returns `CommBroken` naming
/// the timeout.
#[test]
fn a_rank_that_stops_calling_times_out_the_others_without_hanging() {
    let timeout = Duration::from_millis(300);
    let cfg = Config {
        collective_timeout_ms: 300,
        ..Config::default()
    };
    let opts = optimizers(&cfg, 3, timeout);
    let results: Vec<(usize, Option<ErrorKind>)> = on_ranks(opts, |rank, mut opt| {
        register(&mut opt);
        opt.finalize().unwrap();
        if rank == 2 {
            return (rank, None);
        }
        write_grads(&mut opt, |_, _| 1e-3);
        let err = opt.step(&ARGS).unwrap_err();
        assert!(err.message.contains("rank"), "{}", err.message);
        let later = [
            opt.zero_grad().unwrap_err(),
            opt.step(&ARGS).unwrap_err(),
            opt.step_info().unwrap_err(),
            opt.synchronize().unwrap_err(),
        ];
        for again in later {
            assert_eq!(again.kind, ErrorKind::CommBroken, "{}", again.message);
            assert!(again.message.contains("CommTimeout"), "{}", again.message);
        }
        drop(opt);
        (rank, Some(err.kind))
    });
    for (rank, outcome) in results {
        if let Some(kind) = outcome {
            assert_eq!(kind, ErrorKind::CommTimeout, "rank {rank}");
        }
    }
}

#[test]
fn wrong_call_order_is_a_state_error_with_a_message() {
    let mut opt = optimizers(&Config::default(), 1, Duration::from_secs(5)).pop().unwrap();
    register(&mut opt);
    let err = opt.step(&ARGS).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidState);
    assert!(err.message.contains("finalize"), "{}", err.message);
    assert_eq!(opt.grad_ready(0).unwrap_err().kind, ErrorKind::InvalidState);
    opt.finalize().unwrap();
    opt.grad_ready(0).unwrap();
    let twice = opt.grad_ready(0).unwrap_err();
    assert_eq!(twice.kind, ErrorKind::InvalidState);
    assert!(twice.message.contains("already marked ready"), "{}", twice.message);
    let buckets = opt.plan().unwrap().buckets.len() as u32;
    let unknown = opt.wait_params(buckets).unwrap_err();
    assert_eq!(
        unknown.kind,
        ErrorKind::InvalidArgument,
        "an unknown id is an argument error"
    );
    assert!(
        unknown.message.contains(&format!("bucket {buckets} does not exist")),
        "{}",
        unknown.message
    );
    let bad_lr = opt
        .step(&muon_opt::schedule::StepArgs { lr: f32::NAN, ..ARGS })
        .unwrap_err();
    assert_eq!(bad_lr.kind, ErrorKind::OutOfRange);
    assert!(bad_lr.message.contains("args->lr"));
}

#[test]
fn ranks_that_registered_different_models_fail_finalize_with_plan_mismatch() {
    let opts = optimizers(&Config::default(), 2, Duration::from_secs(5));
    let errors: Vec<_> = on_ranks(opts, |rank, mut opt| {
        let rows = if rank == 0 { 64 } else { 65 };
        let spec = muon_opt::model::ParamSpec::new("w", &[rows, 32], muon_opt::config::Dtype::Bf16);
        opt.add_param(spec, None).unwrap();
        opt.finalize().unwrap_err()
    });
    for err in errors {
        assert_eq!(err.kind, ErrorKind::PlanMismatch);
        assert!(
            err.message.contains("every rank must register the same params"),
            "{}",
            err.message
        );
    }
}

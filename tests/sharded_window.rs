//! The gather window of `param_sharding = sharded` refuses every use of a bucket outside it
//! with INVALID_STATE naming the param and the bucket (never stale values or another bucket's
//! storage), refuses a gather into a slot another bucket holds and a release that would lose
//! gradients; a bucket's views are the same at every gather.

mod support;

use std::time::Duration;

use muon_opt::config::{Config, ParamSharding};
use muon_opt::error::ErrorKind;
use muon_opt::init_data::InitData;
use muon_opt::optimizer::Optimizer;
use support::ranks::optimizers;
use support::training::{ARGS, init_values, model};

/// A finalized one-rank optimizer of the test model with sharded params, small buckets and
/// `param_prefetch_buckets` = 1 (two slots).
fn sharded() -> Optimizer {
    let cfg = Config {
        param_sharding: ParamSharding::Sharded,
        param_prefetch_buckets: 1,
        bucket_size: 3000,
        ..Config::default()
    };
    let mut opt = optimizers(&cfg, 1, Duration::from_secs(20)).pop().unwrap();
    for (p, spec) in model().iter().enumerate() {
        opt.add_param(spec.clone(), Some(InitData::from_f32(&init_values(p, spec.numel()))))
            .unwrap();
    }
    opt.finalize().unwrap();
    opt
}

fn order(opt: &Optimizer) -> Vec<u32> {
    muon_opt::plan::forward_order(&opt.plan().unwrap().buckets)
        .into_iter()
        .map(|b| b as u32)
        .collect()
}

/// The first param of bucket `b` and its name.
fn first_param(opt: &Optimizer, b: u32) -> (u32, String) {
    let p = opt.plan().unwrap().buckets[b as usize].params[0];
    (p, opt.registry().params()[p as usize].name.clone())
}

fn assert_invalid_state(err: muon_opt::error::Error, wants: &[&str]) {
    assert_eq!(err.kind, ErrorKind::InvalidState, "{err}");
    for want in wants {
        assert!(err.message.contains(want), "{err} lacks {want:?}");
    }
}

#[test]
fn a_param_outside_its_gathered_window_is_refused_naming_the_param_and_the_bucket() {
    let mut opt = sharded();
    let b = order(&opt)[0];
    let (p, name) = first_param(&opt, b);
    let bucket = format!("bucket {b}");
    assert_invalid_state(opt.param_view(p).unwrap_err(), &["param_view", &name, &bucket]);
    assert_invalid_state(opt.grad_ready(p).unwrap_err(), &["grad_ready", &name, &bucket]);
    assert_invalid_state(
        opt.running().unwrap().param_values(p as usize).unwrap_err(),
        &["param_values", &name, &bucket],
    );
    opt.gather_params(b).unwrap();
    let view = opt.param_view(p).unwrap();
    opt.release_params(b).unwrap();
    assert_invalid_state(opt.param_view(p).unwrap_err(), &["param_view", &name]);
    opt.wait_params(b).unwrap();
    let again = opt.param_view(p).unwrap();
    assert_eq!(
        (view.data, view.grad),
        (again.data, again.grad),
        "the slot of a bucket is fixed"
    );
    opt.grad_ready(p).unwrap();
    opt.step(&ARGS).unwrap();
    assert_invalid_state(opt.param_view(p).unwrap_err(), &["param_view", &name, &bucket]);
}

#[test]
fn the_window_refuses_a_taken_slot_a_double_release_and_lost_gradients() {
    let mut opt = sharded();
    let order = order(&opt);
    assert!(order.len() >= 3, "the test model needs 3 buckets here");
    opt.gather_params(order[0]).unwrap();
    opt.gather_params(order[0]).unwrap();
    opt.gather_params(order[1]).unwrap();
    let taken = format!("still holds bucket {}", order[0]);
    assert_invalid_state(opt.gather_params(order[2]).unwrap_err(), &["gather_params", &taken]);
    assert_invalid_state(opt.wait_params(order[2]).unwrap_err(), &["gather_params", &taken]);
    opt.release_params(order[0]).unwrap();
    assert_invalid_state(
        opt.release_params(order[0]).unwrap_err(),
        &["release_params", &format!("bucket {} is not gathered", order[0])],
    );
    opt.wait_params(order[2]).unwrap();
    let b = order[1];
    let params = opt.plan().unwrap().buckets[b as usize].params.clone();
    assert!(params.len() >= 2, "bucket {b} needs two params here");
    opt.grad_ready(params[0]).unwrap();
    let waiting = opt.registry().params()[params[1] as usize].name.clone();
    assert_invalid_state(opt.release_params(b).unwrap_err(), &["release_params", &waiting]);
    assert_eq!(
        opt.gather_params(u32::MAX).unwrap_err().kind,
        ErrorKind::InvalidArgument
    );
}

/// With replicated params the window calls do nothing: every bucket is always gathered.
#[test]
fn replicated_params_are_always_gathered() {
    let mut opt = optimizers(&Config::default(), 1, Duration::from_secs(20))
        .pop()
        .unwrap();
    for (p, spec) in model().iter().enumerate() {
        opt.add_param(spec.clone(), Some(InitData::from_f32(&init_values(p, spec.numel()))))
            .unwrap();
    }
    assert_eq!(opt.gather_params(0).unwrap_err().kind, ErrorKind::InvalidState);
    opt.finalize().unwrap();
    opt.release_params(0).unwrap();
    opt.param_view(0).unwrap();
    opt.gather_params(0).unwrap();
}

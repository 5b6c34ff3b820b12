//! `muon_optimizer_set_param_scales`: a param's learning-rate and weight-decay multipliers
//! changed between steps. Stepping with lr = wd = 1 and each param's rate as its scale gives
//! the same bits as the rate in the step args (lr · 1 and 1 · lr are the same f32 products), so
//! a framework can schedule param groups of one route apart (issue 42's torch param groups).

mod support;

use std::time::Duration;

use muon_opt::config::{Config, NsPrecision};
use muon_opt::init_data::InitData;
use muon_opt::optimizer::Optimizer;
use muon_opt::schedule::{StepArgs, StepOverrides};
use support::ranks::optimizers;
use support::training::{bits, init_values, model, rank_grad};

/// One optimizer at dp 1 over the test model.
fn optimizer(cfg: &Config) -> Optimizer {
    let mut opt = optimizers(cfg, 1, Duration::from_secs(20)).remove(0);
    for (p, spec) in model().iter().enumerate() {
        opt.add_param(spec.clone(), Some(InitData::from_f32(&init_values(p, spec.numel()))))
            .unwrap();
    }
    opt.finalize().unwrap();
    opt
}

fn iterate(opt: &mut Optimizer, step: u64, args: &StepArgs) {
    opt.zero_grad().unwrap();
    let n = opt.registry().len();
    for b in 0..opt.plan().unwrap().buckets.len() as u32 {
        opt.wait_params(b).unwrap();
    }
    for p in (0..n).rev() {
        let seen = opt.running().unwrap().param_values(p).unwrap();
        let g = rank_grad(step, 0, p, &seen);
        let ptr = opt.running().unwrap().address(p, true).cast::<f32>();
        // SAFETY: the grad view of param p holds numel f32 values (grad_dtype f32).
        unsafe { std::slice::from_raw_parts_mut(ptr, g.len()) }.copy_from_slice(&g);
        opt.grad_ready(p as u32).unwrap();
    }
    opt.step(args).unwrap();
}

fn params(opt: &mut Optimizer) -> Vec<Vec<u32>> {
    let n = opt.registry().len();
    (0..n)
        .map(|p| bits(&opt.running().unwrap().param_values(p).unwrap()))
        .collect()
}

#[test]
fn rates_as_param_scales_step_like_rates_in_the_args() {
    let cfg = Config {
        muon_ns_precision: NsPrecision::F32,
        ..Config::default()
    };
    let specs = model();
    let (mut by_args, mut by_scales) = (optimizer(&cfg), optimizer(&cfg));
    let ones = StepArgs {
        lr: 1.0,
        weight_decay: 1.0,
        adam_lr: 1.0,
        adam_weight_decay: 1.0,
        overrides: StepOverrides::NONE,
    };
    for step in 0..4u64 {
        // A schedule: the rates halve after two steps.
        let decay = if step < 2 { 1.0 } else { 0.5 };
        let args = StepArgs {
            lr: 0.02 * decay,
            weight_decay: 0.1,
            adam_lr: 0.003 * decay,
            adam_weight_decay: 0.01,
            overrides: StepOverrides::NONE,
        };
        for (p, spec) in specs.iter().enumerate() {
            let muon = by_scales.route(p as u32).unwrap() == muon_opt::model::Route::Muon;
            let (lr, wd) = if muon {
                (args.lr, args.weight_decay)
            } else {
                (args.adam_lr, args.adam_weight_decay)
            };
            by_scales
                .set_param_scales(p as u32, lr * spec.lr_scale, wd * spec.wd_scale)
                .unwrap();
        }
        iterate(&mut by_args, step, &args);
        iterate(&mut by_scales, step, &ones);
        assert!(
            params(&mut by_args) == params(&mut by_scales),
            "step {step}: params differ"
        );
    }
    let err = by_scales.set_param_scales(99, 1.0, 1.0).unwrap_err();
    assert!(err.message.contains("param 99 is not registered"), "{}", err.message);
}

//! A step's overrides of the config's Muon momentum and AdamW β1, β2 and ε (issue 42, what a
//! scheduler drives), on the host backend: a run whose every step overrides them equals, bit
//! for bit, a run of an optimizer configured with those values; values changed mid-run follow
//! a reference computed step by step with the host numerics (AdamW's bias corrections with the
//! step's β and step count, torch.optim.AdamW's convention); a bad override is refused naming
//! the field and changes nothing. The decoupled learning rate (Megatron-LM's `--decoupled-lr`)
//! steps the embedding and output params alone.

mod support;

use std::time::Duration;

use muon_opt::config::{Config, Dtype, NsPrecision};
use muon_opt::error::ErrorKind;
use muon_opt::init_data::InitData;
use muon_opt::model::{ParamFlags, ParamSpec};
use muon_opt::numerics::adamw::{AdamWArgs, adamw_update};
use muon_opt::numerics::muon::{MuonOptions, MuonShape, MuonStepArgs, MuonWorkspace, muon_update};
use muon_opt::optimizer::Optimizer;
use muon_opt::schedule::{StepArgs, StepOverrides};
use support::ranks::optimizers;
use support::training::{ARGS, Data, Snapshot, bits, model, train_with};

const STEPS: u64 = 3;

/// Every value of every step (params of each rank, then the assembled state), as bits.
fn bitwise(run: &[Snapshot]) -> Vec<Vec<u32>> {
    run.iter()
        .flat_map(|s| s.params.iter().flatten().chain(s.state.iter().flatten()))
        .map(|values| bits(values))
        .collect()
}

fn config() -> Config {
    Config {
        clip_grad: 0.0,
        muon_ns_precision: NsPrecision::F32,
        bucket_size: 3000,
        ..Config::default()
    }
}

fn with(overrides: StepOverrides) -> StepArgs {
    StepArgs { overrides, ..ARGS }
}

/// At dp 2 on the test model (fused QKV, an expert stack, embeddings, norms, biases): steps that
/// override every value equal steps of an optimizer whose config holds them, bit for bit, and
/// differ from the config's own values.
#[test]
fn a_step_with_overrides_equals_an_optimizer_configured_with_them() {
    let overrides = StepOverrides {
        muon_momentum: Some(0.8),
        adam_beta1: Some(0.85),
        adam_beta2: Some(0.95),
        adam_eps: Some(1e-6),
        decoupled_lr: None,
    };
    let configured = Config {
        muon_momentum: 0.8,
        adam_beta1: 0.85,
        adam_beta2: 0.95,
        adam_eps: 1e-6,
        ..config()
    };
    let specs = model();
    let data = Data::ranks(2);
    let overridden = bitwise(&train_with(&specs, &config(), 2, data, STEPS, &|_| with(overrides)));
    let reference = bitwise(&train_with(&specs, &configured, 2, data, STEPS, &|_| ARGS));
    assert!(overridden == reference, "overrides differ from the configured values");
    let plain = bitwise(&train_with(&specs, &config(), 2, data, STEPS, &|_| ARGS));
    assert!(overridden != plain, "the overrides must change the run");
    // Overriding with the config's own values changes nothing.
    let same = StepOverrides {
        muon_momentum: Some(0.95),
        adam_beta1: Some(0.9),
        adam_beta2: Some(0.999),
        adam_eps: Some(1e-8),
        decoupled_lr: None,
    };
    assert!(bitwise(&train_with(&specs, &config(), 2, data, STEPS, &|_| with(same))) == plain);
}

/// The per-step schedule of [`the_values_follow_a_reference_when_changed_mid_run`]: a momentum
/// warmup that drops back, betas and ε moved every step; step 2 keeps the config's β2.
fn schedule(step: u64) -> StepOverrides {
    let table = [
        (Some(0.85), Some(0.8), Some(0.95), Some(1e-6)),
        (Some(0.9), Some(0.85), Some(0.99), None),
        (None, Some(0.9), None, Some(1e-7)),
        (Some(0.5), None, Some(0.9), Some(1e-5)),
    ];
    let (muon_momentum, adam_beta1, adam_beta2, adam_eps) = table[step as usize];
    StepOverrides {
        muon_momentum,
        adam_beta1,
        adam_beta2,
        adam_eps,
        decoupled_lr: None,
    }
}

/// At dp 2 on the test model (its embedding flagged EMBEDDING_OR_OUTPUT and sharded over both
/// ranks): with a decoupled learning rate the embedding's state and values equal, bit for bit,
/// those of a run whose adam_lr is that rate, and every other param's those of the run without
/// it — Megatron-LM's rule: `--decoupled-lr` for `is_embedding_or_output_parameter` alone.
#[test]
fn the_decoupled_lr_steps_the_embedding_and_output_params_alone() {
    let specs = model();
    let data = Data::ranks(2);
    let decoupled_lr = 4e-3;
    let run = |args: StepArgs| train_with(&specs, &config(), 2, data, STEPS, &|_| args);
    let got = run(with(StepOverrides {
        decoupled_lr: Some(decoupled_lr),
        ..StepOverrides::NONE
    }));
    let plain = run(ARGS);
    let at_decoupled = run(StepArgs {
        adam_lr: decoupled_lr,
        ..ARGS
    });
    let mut embeddings = 0;
    for (p, spec) in specs.iter().enumerate() {
        let embedding = spec.flags.has(ParamFlags::EMBEDDING_OR_OUTPUT);
        embeddings += usize::from(embedding);
        let reference = if embedding { &at_decoupled } else { &plain };
        for (step, (a, b)) in got.iter().zip(reference).enumerate() {
            let state = |s: &Snapshot| s.state[p].iter().map(|v| bits(v)).collect::<Vec<_>>();
            assert!(state(a) == state(b), "'{}' after step {step}", spec.name);
            for rank in 0..2 {
                assert!(
                    bits(&a.params[rank][p]) == bits(&b.params[rank][p]),
                    "'{}' on rank {rank}",
                    spec.name
                );
            }
        }
    }
    assert!(embeddings > 0, "the test model has an embedding");
    assert!(
        bitwise(&plain) != bitwise(&at_decoupled),
        "the rates must differ in the run"
    );
}

/// Deterministic gradient of param `p` at `step`.
fn grad(step: u64, p: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7 + p * 3 + step as usize * 5) % 11) as f32 * 0.01 - 0.05)
        .collect()
}

/// A one-rank optimizer (f32 params and grads) holding `specs` (a 24×16 Muon matrix and a
/// 40-element AdamW vector), stepped with `args(step)`; its params after every step.
fn run(specs: &[ParamSpec], cfg: &Config, steps: u64, args: impl Fn(u64) -> StepArgs) -> Vec<Vec<Vec<f32>>> {
    let mut opt = optimizers(cfg, 1, Duration::from_secs(20)).remove(0);
    register(&mut opt, specs);
    (0..steps)
        .map(|step| {
            fill_grads(&mut opt, specs, step);
            assert!(!opt.step(&args(step)).unwrap().skipped);
            values(&mut opt, specs)
        })
        .collect()
}

/// A Muon matrix and a 1-D AdamW param, flagged WEIGHT_DECAY so that its decay takes part in
/// what is compared (the default rule, Megatron-LM's, exempts 1-D params).
fn specs() -> Vec<ParamSpec> {
    let mut b = ParamSpec::new("b", &[40], Dtype::F32);
    b.flags = ParamFlags(ParamFlags::WEIGHT_DECAY);
    vec![ParamSpec::new("w", &[24, 16], Dtype::F32), b]
}

fn init(p: usize, n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 13 + p) % 17) as f32 * 0.01 - 0.08).collect()
}

fn register(opt: &mut Optimizer, specs: &[ParamSpec]) {
    for (p, spec) in specs.iter().enumerate() {
        let values = init(p, spec.numel() as usize);
        opt.add_param(spec.clone(), Some(InitData::from_f32(&values))).unwrap();
    }
    opt.finalize().unwrap();
}

fn fill_grads(opt: &mut Optimizer, specs: &[ParamSpec], step: u64) {
    opt.zero_grad().unwrap();
    for (p, spec) in specs.iter().enumerate().rev() {
        let g = grad(step, p, spec.numel() as usize);
        let ptr = opt.running().unwrap().address(p, true).cast::<f32>();
        // SAFETY: the grad view of param p holds numel f32 values (grad_dtype f32).
        unsafe { std::slice::from_raw_parts_mut(ptr, g.len()) }.copy_from_slice(&g);
        opt.grad_ready(p as u32).unwrap();
    }
}

fn values(opt: &mut Optimizer, specs: &[ParamSpec]) -> Vec<Vec<f32>> {
    (0..specs.len())
        .map(|p| opt.running().unwrap().param_values(p).unwrap())
        .collect()
}

/// Muon momentum and AdamW β1, β2, ε changed at every step (and back to the config's on some)
/// move the params as the host numerics do, step by step, with each step's values: Muon with
/// that step's μ, AdamW with that step's β1, β2, ε and bias corrections `1 − β^t` of the step's
/// β at the step count t.
#[test]
fn the_values_follow_a_reference_when_changed_mid_run() {
    let cfg = config();
    let specs = specs();
    let steps = 4;
    let got = run(&specs, &cfg, steps, |step| with(schedule(step)));
    let opts = MuonOptions::from_config(&cfg);
    let (rows, cols) = (24, 16);
    let shape = MuonShape {
        rows,
        cols,
        split_rows: &[],
        split_groups: 1,
    };
    let mut w = init(0, rows * cols);
    let mut momentum = vec![0.0; rows * cols];
    let mut b = init(1, 40);
    let (mut m, mut v) = (vec![0.0; 40], vec![0.0; 40]);
    let mut ws = MuonWorkspace::default();
    for step in 0..steps {
        let o = schedule(step);
        let muon = MuonStepArgs {
            lr: ARGS.lr,
            weight_decay: ARGS.weight_decay,
            scales: specs[0].scales(),
            momentum: o.muon_momentum.unwrap_or(cfg.muon_momentum),
            grad_scale: 1.0,
            clip_coef: 1.0,
        };
        muon_update(
            &mut w,
            &mut momentum,
            &grad(step, 0, rows * cols),
            &shape,
            &muon,
            &opts,
            &mut ws,
        )
        .unwrap();
        let adamw = AdamWArgs {
            lr: ARGS.adam_lr,
            weight_decay: ARGS.adam_weight_decay,
            scales: specs[1].scales(),
            beta1: o.adam_beta1.unwrap_or(cfg.adam_beta1),
            beta2: o.adam_beta2.unwrap_or(cfg.adam_beta2),
            eps: o.adam_eps.unwrap_or(cfg.adam_eps),
            step: step + 1,
            grad_scale: 1.0,
            clip_coef: 1.0,
            cautious_weight_decay: false,
        };
        adamw_update(&mut b, &mut m, &mut v, &grad(step, 1, 40), &adamw).unwrap();
        assert_eq!(bits(&got[step as usize][0]), bits(&w), "Muon param after step {step}");
        assert_eq!(bits(&got[step as usize][1]), bits(&b), "AdamW param after step {step}");
    }
    let constant = run(&specs, &cfg, steps, |_| ARGS);
    assert!(constant[3] != got[3], "the schedule must change the run");
}

/// A bad override is refused before anything is enqueued, naming the field and the rule: the
/// params and the step count stay, and the next good step is the one a run without the refused
/// call takes. So is a bad set_step_args, and the args set before it stay in force.
#[test]
fn a_bad_override_is_refused_naming_the_field_and_changes_nothing() {
    let cfg = config();
    let specs = specs();
    let mut opt = optimizers(&cfg, 1, Duration::from_secs(20)).remove(0);
    register(&mut opt, &specs);
    let reference = run(&specs, &cfg, 2, |step| with(schedule(step)));
    fill_grads(&mut opt, &specs, 0);
    opt.step(&with(schedule(0))).unwrap();
    fill_grads(&mut opt, &specs, 1);
    let before = values(&mut opt, &specs);
    let bad = [
        (
            StepOverrides {
                muon_momentum: Some(1.0),
                ..schedule(1)
            },
            "step: args->muon_momentum 1 is outside [0, 1)",
        ),
        (
            StepOverrides {
                adam_beta2: Some(f32::NAN),
                ..schedule(1)
            },
            "step: args->adam_beta2 NaN is outside [0, 1)",
        ),
        (
            StepOverrides {
                adam_eps: Some(-1e-8),
                ..schedule(1)
            },
            "step: args->adam_eps -0.00000001 must be finite and > 0",
        ),
    ];
    for (overrides, message) in bad {
        let err = opt.step(&with(overrides)).unwrap_err();
        assert_eq!(err.kind, ErrorKind::OutOfRange, "{err}");
        assert!(err.message.contains(message), "{err}");
        let err = opt.set_step_args(&with(overrides)).unwrap_err();
        assert!(err.message.contains(message), "{err}");
    }
    assert_eq!(opt.running().unwrap().steps().unwrap(), 1);
    assert_eq!(values(&mut opt, &specs), before);
    opt.set_step_args(&with(schedule(1))).unwrap();
    assert!(opt.set_step_args(&with(bad[0].0)).is_err());
    opt.step_with_set_args().unwrap();
    assert_eq!(values(&mut opt, &specs), reference[1]);
}

/// Overrides are part of the set arguments a step without its own uses (the ones a CUDA graph
/// replays): `set(A); step(B); step(NULL)` steps with B's overrides, then A's.
#[test]
fn a_step_given_its_overrides_leaves_the_set_ones_for_the_next_null_step() {
    let cfg = config();
    let specs = specs();
    let (a, b) = (with(schedule(0)), with(schedule(3)));
    let reference = run(&specs, &cfg, 2, |step| if step == 0 { b } else { a });
    let mut opt = optimizers(&cfg, 1, Duration::from_secs(20)).remove(0);
    register(&mut opt, &specs);
    opt.set_step_args(&a).unwrap();
    fill_grads(&mut opt, &specs, 0);
    opt.step(&b).unwrap();
    assert_eq!(values(&mut opt, &specs), reference[0]);
    fill_grads(&mut opt, &specs, 1);
    opt.step_with_set_args().unwrap();
    assert_eq!(values(&mut opt, &specs), reference[1]);
    assert!(
        reference[1] != run(&specs, &cfg, 2, |_| b)[1],
        "A's overrides must change the second step"
    );
}

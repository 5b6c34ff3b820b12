//! `muon_ns_method` end to end on the host backend, through the C API: an optimizer step with
//! `gram` updates every Muon matrix the Gram iteration applies to (`gram_applies`) by exactly
//! `numerics::newton_schulz::newton_schulz_gram` of its momentum, in every precision, and every
//! other matrix (square, near-square, bf16 with more than 5 steps) by the standard iteration,
//! bit for bit; `muon_newton_schulz_host_config` is the same iteration.

mod support;

use std::ptr::null_mut;

use muon_opt::capi::config::muon_config_t;
use muon_opt::capi::constants::{
    MUON_NS_METHOD_GRAM, MUON_NS_METHOD_STANDARD, MUON_PARAM_FLAG_EXPERT_STACK, MUON_ROUTE_MUON,
};
use muon_opt::capi::iteration::{
    muon_newton_schulz_host, muon_newton_schulz_host_config, muon_optimizer_grad_ready, muon_optimizer_step,
    muon_optimizer_synchronize, muon_optimizer_zero_grad,
};
use muon_opt::capi::optimizer::{muon_optimizer_finalize, muon_optimizer_param_view};
use muon_opt::capi::param::muon_param_view_t;
use muon_opt::config::{Config, NsMethod, NsPrecision, ScaleMode};
use muon_opt::numerics::muon::muon_scale;
use muon_opt::numerics::newton_schulz::{NsOptions, NsWorkspace, gram_applies, newton_schulz, newton_schulz_gram};
use support::capi::{add_param, config, create, destroy, destroy_group, host_group, outcome, step_args};
use support::rng::{milli, mix};
use support::training::bits;

const LR: f32 = 0.02;

/// (name, shape): `[rows, cols]`, or `[experts, rows, cols]` for an expert stack.
const PARAMS: [(&str, &[i64]); 5] = [
    ("wide", &[16, 48]),
    ("tall", &[48, 16]),
    ("square", &[32, 32]),
    ("near_square", &[32, 44]),
    ("experts", &[2, 16, 40]),
];

fn gradient(p: usize, numel: usize) -> Vec<f32> {
    (0..numel).map(|i| milli(mix(((p as u64) << 32) | i as u64))).collect()
}

/// The matrices of a param: (rows, cols, element offset) of each.
fn matrices(shape: &[i64]) -> Vec<(usize, usize, usize)> {
    let dims: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
    match dims[..] {
        [rows, cols] => vec![(rows, cols, 0)],
        [experts, rows, cols] => (0..experts).map(|e| (rows, cols, e * rows * cols)).collect(),
        _ => unreachable!(),
    }
}

/// One step of a one-rank optimizer of `cfg` from zero params and momenta with PARAMS'
/// gradients: every param's values after it.
fn one_step(cfg: &muon_config_t) -> Vec<Vec<f32>> {
    let comm = host_group(1)[0];
    let opt = create(cfg, comm);
    for (name, shape) in PARAMS {
        let flags = if shape.len() == 3 {
            MUON_PARAM_FLAG_EXPERT_STACK
        } else {
            0
        };
        add_param(opt, name, shape, flags);
    }
    outcome(unsafe { muon_optimizer_finalize(opt.0) }).expect("finalize");
    let views: Vec<(muon_param_view_t, usize)> = PARAMS
        .iter()
        .enumerate()
        .map(|(p, (_, shape))| {
            let mut view = unsafe { std::mem::zeroed::<muon_param_view_t>() };
            view.struct_size = std::mem::size_of::<muon_param_view_t>() as u32;
            outcome(unsafe { muon_optimizer_param_view(opt.0, p as u32, &mut view) }).expect("param_view");
            assert_eq!(view.route, MUON_ROUTE_MUON, "{p}");
            (view, shape.iter().product::<i64>() as usize)
        })
        .collect();
    outcome(unsafe { muon_optimizer_zero_grad(opt.0) }).expect("zero_grad");
    for (p, (view, numel)) in views.iter().enumerate().rev() {
        // SAFETY: the host backend's f32 grad view of param p holds numel values.
        unsafe { std::slice::from_raw_parts_mut(view.grad.cast::<f32>(), *numel) }
            .copy_from_slice(&gradient(p, *numel));
        outcome(unsafe { muon_optimizer_grad_ready(opt.0, p as u32) }).expect("grad_ready");
    }
    outcome(unsafe { muon_optimizer_step(opt.0, &step_args(LR), null_mut()) }).expect("step");
    outcome(unsafe { muon_optimizer_synchronize(opt.0) }).expect("synchronize");
    let values = views
        .iter()
        // SAFETY: the f32 param view of each param holds numel values.
        .map(|(view, numel)| unsafe { std::slice::from_raw_parts(view.data.cast::<f32>(), *numel) }.to_vec())
        .collect();
    destroy(opt);
    destroy_group(&[comm]);
    values
}

/// What the step does to a zero param with zero momentum, its Newton–Schulz given: each
/// matrix `0·decay − (lr·scale)·NS((1 − μ)·g)` in f32 (numerics::muon; weight decay 0, clip off).
fn expected(cfg: &Config, ns: impl Fn(&[f32], usize, usize) -> Vec<f32>) -> Vec<Vec<f32>> {
    PARAMS
        .iter()
        .enumerate()
        .map(|(p, (_, shape))| {
            let numel = shape.iter().product::<i64>() as usize;
            let g = gradient(p, numel);
            let mut out = vec![0.0f32; numel];
            for (rows, cols, offset) in matrices(shape) {
                let range = offset..offset + rows * cols;
                let mu = cfg.muon_momentum;
                let u: Vec<f32> = g[range.clone()].iter().map(|&g| mu * 0.0 + (1.0 - mu) * g).collect();
                let x = ns(&u, rows, cols);
                let step = LR * muon_scale(ScaleMode::Spectral, rows, cols, 1.0);
                for (w, x) in out[range].iter_mut().zip(x) {
                    *w = 0.0 * 1.0 - step * x;
                }
            }
            out
        })
        .collect()
}

fn c_config(precision: NsPrecision, steps: u32, method: u32) -> (muon_config_t, Config) {
    let mut cfg = config(60_000);
    cfg.clip_grad = 0.0;
    cfg.muon_ns_precision = precision.code();
    cfg.muon_num_ns_steps = steps;
    cfg.muon_ns_method = method;
    let typed = cfg.to_config().unwrap();
    (cfg, typed)
}

fn run_ns(opts: &NsOptions, gram: bool) -> impl Fn(&[f32], usize, usize) -> Vec<f32> + '_ {
    move |u, rows, cols| {
        let mut x = vec![0.0f32; u.len()];
        let run = if gram { newton_schulz_gram } else { newton_schulz };
        run(u, &mut x, rows, cols, opts, &mut NsWorkspace::default()).unwrap();
        x
    }
}

#[test]
fn a_gram_step_is_newton_schulz_gram_where_it_applies_and_standard_elsewhere_in_every_precision() {
    for &precision in NsPrecision::ALL {
        for steps in [5, 8] {
            let (c_gram, gram) = c_config(precision, steps, MUON_NS_METHOD_GRAM);
            let (c_standard, standard) = c_config(precision, steps, MUON_NS_METHOD_STANDARD);
            assert_eq!(gram.muon_ns_method, NsMethod::Gram);
            let opts = NsOptions::from_config(&standard);
            let label = format!("{} {steps} steps", precision.name());
            let by_gram = one_step(&c_gram);
            let by_standard = one_step(&c_standard);
            let want_gram = expected(&gram, run_ns(&opts, true));
            let want_standard = expected(&standard, run_ns(&opts, false));
            for (p, (name, shape)) in PARAMS.iter().enumerate() {
                assert_eq!(bits(&by_gram[p]), bits(&want_gram[p]), "{label}: {name} by gram");
                assert_eq!(
                    bits(&by_standard[p]),
                    bits(&want_standard[p]),
                    "{label}: {name} by standard"
                );
                let (rows, cols, _) = matrices(shape)[0];
                let applies = gram_applies(rows.min(cols), rows.max(cols), &opts);
                let expect_applies =
                    rows.max(cols) >= 3 * rows.min(cols) / 2 && (precision == NsPrecision::F32 || steps <= 5);
                assert_eq!(applies, expect_applies, "{label}: {name}");
                // Where Gram applies it is another rounding of the same update; elsewhere the
                // standard iteration runs whatever the method.
                assert_eq!(bits(&by_gram[p]) != bits(&by_standard[p]), applies, "{label}: {name}");
                let moved = by_standard[p].iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let off = by_gram[p]
                    .iter()
                    .zip(&by_standard[p])
                    .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
                let tolerance = if precision == NsPrecision::F32 { 1e-4 } else { 0.1 };
                assert!(off <= tolerance * moved, "{label}: {name}: {off} of {moved}");
            }
        }
    }
}

/// The host utility with a config runs what the optimizer's Newton–Schulz runs:
/// `newton_schulz_gram` with `gram`, and with `standard` the config-less utility's bits.
#[test]
fn the_host_newton_schulz_utility_takes_the_configs_method() {
    let (rows, cols) = (16usize, 48usize);
    let input = gradient(7, rows * cols);
    for &precision in NsPrecision::ALL {
        let (mut cfg, typed) = c_config(precision, 5, MUON_NS_METHOD_STANDARD);
        let opts = NsOptions::from_config(&typed);
        let mut plain = vec![0.0f32; rows * cols];
        let status = unsafe {
            muon_newton_schulz_host(
                input.as_ptr(),
                plain.as_mut_ptr(),
                rows as u32,
                cols as u32,
                cfg.muon_coefficient_set,
                5,
                precision.code(),
            )
        };
        outcome(status).expect("muon_newton_schulz_host");
        let run = |cfg: &muon_config_t| {
            let mut out = vec![0.0f32; rows * cols];
            let status = unsafe {
                muon_newton_schulz_host_config(input.as_ptr(), out.as_mut_ptr(), rows as u32, cols as u32, cfg)
            };
            outcome(status).expect("muon_newton_schulz_host_config");
            out
        };
        assert_eq!(bits(&run(&cfg)), bits(&plain), "{}: standard", precision.name());
        cfg.muon_ns_method = MUON_NS_METHOD_GRAM;
        assert_eq!(
            bits(&run(&cfg)),
            bits(&run_ns(&opts, true)(&input, rows, cols)),
            "{}: gram",
            precision.name()
        );
    }
}

//! Element-wise AdamW against its formulas in f64 and against its documented f32 operation
//! order bit for bit.

mod support;

use muon_opt::error::ErrorKind;
use muon_opt::numerics::MIN_ELEMENTS_PER_THREAD;
use muon_opt::numerics::adamw::{AdamWArgs, adamw_bias_corrections, adamw_update, adamw_update_split, powi_f32};
use muon_opt::numerics::step_args::ParamScales;
use support::rng::Rng;

fn args(step: u64) -> AdamWArgs {
    AdamWArgs {
        lr: 1e-3,
        weight_decay: 0.1,
        scales: ParamScales {
            lr_scale: 1.0,
            wd_scale: 1.0,
        },
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        step,
        grad_scale: 1.0 / 3.0,
        clip_coef: 0.7,
        cautious_weight_decay: false,
    }
}

#[test]
fn several_steps_match_f64_formulas() {
    let mut rng = Rng::new(41);
    let n = 1000;
    let w0 = rng.normal_vec(n, 1.0);
    let (mut w, mut m, mut v) = (w0.clone(), vec![0.0f32; n], vec![0.0f32; n]);
    let mut w64: Vec<f64> = w0.iter().map(|&x| f64::from(x)).collect();
    let (mut m64, mut v64) = (vec![0.0f64; n], vec![0.0f64; n]);
    for t in 1..=6u64 {
        let g = rng.normal_vec(n, 0.01);
        let a = args(t);
        adamw_update(&mut w, &mut m, &mut v, &g, &a).unwrap();
        let (b1, b2) = (f64::from(a.beta1), f64::from(a.beta2));
        let (lr, wd, eps) = (f64::from(a.lr), f64::from(a.weight_decay), f64::from(a.eps));
        for i in 0..n {
            let g = f64::from(g[i]) * f64::from(a.grad_scale) * f64::from(a.clip_coef);
            m64[i] = b1 * m64[i] + (1.0 - b1) * g;
            v64[i] = b2 * v64[i] + (1.0 - b2) * g * g;
            let mhat = m64[i] / (1.0 - b1.powi(t as i32));
            let vhat = v64[i] / (1.0 - b2.powi(t as i32));
            w64[i] = w64[i] - lr * wd * w64[i] - lr * mhat / (vhat.sqrt() + eps);
        }
        for i in 0..n {
            // m can cancel to near 0, so its tolerance has an absolute part (m is ~1e-3 here);
            // v is a sum of positive terms.
            assert!(
                (f64::from(m[i]) - m64[i]).abs() < 1e-5 * m64[i].abs() + 1e-10,
                "step {t} m[{i}]"
            );
            assert!((f64::from(v[i]) - v64[i]).abs() < 1e-5 * v64[i], "step {t} v[{i}]");
            // The update is ~lr per step; f32 rounding of w (~6e-8) dominates the error.
            assert!((f64::from(w[i]) - w64[i]).abs() < 1e-6, "step {t} w[{i}]");
        }
    }
    let moved = w.iter().zip(&w0).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(moved > 1e-3, "the updates must be far above the tolerance");
}

#[test]
fn documented_operation_order_is_bit_exact() {
    let mut rng = Rng::new(42);
    let n = 257;
    let mut w = rng.normal_vec(n, 1.0);
    let mut m = rng.normal_vec(n, 1e-3);
    let mut v: Vec<f32> = rng.normal_vec(n, 1e-3).iter().map(|x| x * x).collect();
    let g = rng.normal_vec(n, 0.01);
    let a = args(3);
    let (w0, m0, v0) = (w.clone(), m.clone(), v.clone());
    adamw_update(&mut w, &mut m, &mut v, &g, &a).unwrap();
    // The sequence the module documentation specifies (and the CUDA kernel mirrors).
    // The bias corrections are the host-computed scalars (the CUDA kernel receives them).
    let (bc1, bc2) = adamw_bias_corrections(a.beta1, a.beta2, 3);
    let decay = 1.0 - a.lr * a.weight_decay;
    for i in 0..n {
        let gi = (g[i] * a.grad_scale) * a.clip_coef;
        let mi = a.beta1 * m0[i] + (1.0 - a.beta1) * gi;
        let vi = a.beta2 * v0[i] + ((1.0 - a.beta2) * gi) * gi;
        let mhat = mi / bc1;
        let vhat = vi / bc2;
        let wi = w0[i] * decay - (a.lr * mhat) / (vhat.sqrt() + a.eps);
        assert_eq!(m[i].to_bits(), mi.to_bits(), "m[{i}]");
        assert_eq!(v[i].to_bits(), vi.to_bits(), "v[{i}]");
        assert_eq!(w[i].to_bits(), wi.to_bits(), "w[{i}]");
    }
}

#[test]
fn first_step_moves_each_weight_by_about_lr() {
    // At t = 1 the bias corrections undo the zero initialization: mhat = g, vhat = g², so
    // without weight decay every weight moves by lr·g/(|g| + eps) ≈ lr·sign(g).
    let mut rng = Rng::new(43);
    let n = 500;
    let w0 = rng.normal_vec(n, 1.0);
    let g = rng.normal_vec(n, 0.01);
    let (mut w, mut m, mut v) = (w0.clone(), vec![0.0; n], vec![0.0; n]);
    let a = AdamWArgs {
        weight_decay: 0.0,
        grad_scale: 1.0,
        clip_coef: 1.0,
        ..args(1)
    };
    adamw_update(&mut w, &mut m, &mut v, &g, &a).unwrap();
    for i in 0..n {
        let step = f64::from(w0[i]) - f64::from(w[i]);
        let expected = f64::from(a.lr) * f64::from(g[i]).signum();
        assert!(
            (step - expected).abs() < 1e-6 + 1e-4 * f64::from(a.lr),
            "{i}: {step} vs {expected}"
        );
    }
}

#[test]
fn decoupled_weight_decay_without_gradient() {
    let mut rng = Rng::new(44);
    let n = 64;
    let w0 = rng.normal_vec(n, 1.0);
    let (mut w, mut m, mut v) = (w0.clone(), vec![0.0; n], vec![0.0; n]);
    let a = args(5);
    adamw_update(&mut w, &mut m, &mut v, &vec![0.0; n], &a).unwrap();
    let decay = 1.0 - a.lr * a.weight_decay;
    for i in 0..n {
        assert_eq!(w[i], w0[i] * decay);
    }
    assert!(m.iter().chain(&v).all(|&x| x == 0.0));
}

#[test]
fn param_scales_multiply_the_group_rates_in_f32() {
    let mut rng = Rng::new(46);
    let n = 100;
    let w0 = rng.normal_vec(n, 1.0);
    let g = rng.normal_vec(n, 0.01);
    let run = |a: &AdamWArgs| {
        let (mut w, mut m, mut v) = (w0.clone(), vec![0.0; n], vec![0.0; n]);
        adamw_update(&mut w, &mut m, &mut v, &g, a).unwrap();
        w
    };
    let scales = ParamScales {
        lr_scale: 0.3,
        wd_scale: 0.7,
    };
    let scaled = AdamWArgs { scales, ..args(3) };
    let premultiplied = AdamWArgs {
        lr: scaled.lr * scales.lr_scale,
        weight_decay: scaled.weight_decay * scales.wd_scale,
        ..args(3)
    };
    assert_eq!(run(&scaled), run(&premultiplied));
    assert_ne!(run(&scaled), run(&args(3)));
}

#[test]
fn clip_coefficient_scales_the_gradient() {
    let mut rng = Rng::new(45);
    let n = 100;
    let w0 = rng.normal_vec(n, 1.0);
    let g = rng.normal_vec(n, 0.01);
    let half: Vec<f32> = g.iter().map(|x| x * 0.5).collect();
    let run = |grad: &[f32], clip_coef| {
        let (mut w, mut m, mut v) = (w0.clone(), vec![0.0; n], vec![0.0; n]);
        adamw_update(&mut w, &mut m, &mut v, grad, &AdamWArgs { clip_coef, ..args(2) }).unwrap();
        (w, m, v)
    };
    assert_eq!(run(&g, 0.5), run(&half, 1.0));
    assert_ne!(run(&g, 0.5).1, run(&g, 1.0).1);
}

#[test]
fn bias_corrections_and_powers() {
    for base in [0.9f32, 0.95, 0.999, 0.9999] {
        assert_eq!(powi_f32(base, 0), 1.0);
        assert_eq!(powi_f32(base, 1), base);
        assert_eq!(powi_f32(base, 2), base * base);
        assert_eq!(powi_f32(base, u64::MAX), 0.0);
        for t in [3u64, 10, 1000, 100_000] {
            // Each squaring at most doubles the relative error and adds one rounding, so the
            // error of base^t stays below about 2·t roundings.
            let exact = f64::from(base).powf(t as f64);
            let got = f64::from(powi_f32(base, t));
            let bound = 2.0 * t as f64 * f64::from(f32::EPSILON) / 2.0 * exact + 1e-45;
            assert!((got - exact).abs() <= bound, "{base}^{t}: {got} vs {exact}");
            let (bc1, bc2) = adamw_bias_corrections(base, base, t);
            assert_eq!((bc1, bc2), (1.0 - powi_f32(base, t), 1.0 - powi_f32(base, t)));
        }
    }
}

#[test]
fn rejects_bad_arguments_without_touching_state() {
    let (mut w, mut m, mut v) = (vec![1.0; 4], vec![2.0; 4], vec![3.0; 4]);
    let g = vec![1.0; 4];
    let err = adamw_update(&mut w, &mut m, &mut v, &g, &args(0)).unwrap_err();
    assert_eq!(err.kind, ErrorKind::OutOfRange);
    let err = adamw_update(&mut w, &mut m, &mut v, &g[..3], &args(1)).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    let err = adamw_update(&mut w, &mut m[..3], &mut v, &g, &args(1)).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    assert_eq!((w, m, v), (vec![1.0; 4], vec![2.0; 4], vec![3.0; 4]));
}

#[test]
fn split_among_threads_gives_the_same_bits() {
    let mut rng = Rng::new(43);
    let n = 3 * MIN_ELEMENTS_PER_THREAD + 5;
    let w0 = rng.normal_vec(n, 1.0);
    let mut reference = (w0.clone(), vec![0.0f32; n], vec![0.0f32; n]);
    let mut split = reference.clone();
    for t in 1..=3u64 {
        let g = rng.normal_vec(n, 0.01);
        adamw_update(&mut reference.0, &mut reference.1, &mut reference.2, &g, &args(t)).unwrap();
        adamw_update_split(&mut split.0, &mut split.1, &mut split.2, &g, &args(t), 1 + t as usize).unwrap();
    }
    for (a, b) in [
        (&reference.0, &split.0),
        (&reference.1, &split.1),
        (&reference.2, &split.2),
    ] {
        assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
    let mut short = vec![0.0f32; n - 1];
    let error = adamw_update_split(&mut split.0, &mut split.1, &mut short, &vec![0.0; n], &args(4), 2).unwrap_err();
    assert_eq!(error.kind, ErrorKind::InvalidArgument);
    for (a, b) in [(&reference.0, &split.0), (&reference.1, &split.1)] {
        assert!(
            a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "nothing changes on refusal"
        );
    }
}

/// Cautious weight decay (microsoft/dion's `adamw_update` with `cautious_wd`): per element the
/// update `u = (lr·mhat) / (sqrt(vhat) + eps)` in the module's order, and the weight decayed
/// only where `w·u ≥ 0` (dion's mask `(M / denom)·X ≥ 0`, the same sign); bit for bit against
/// that written out here over several steps, with both kinds of element present, the moments
/// those of plain AdamW.
#[test]
fn cautious_weight_decay_matches_a_per_element_reference() {
    let mut rng = Rng::new(47);
    let n = 999;
    let w0 = rng.normal_vec(n, 1.0);
    let (mut w, mut m, mut v) = (w0.clone(), vec![0.0f32; n], vec![0.0f32; n]);
    let (mut rw, mut rm, mut rv) = (w0, vec![0.0f32; n], vec![0.0f32; n]);
    let (mut kept, mut decayed) = (0, 0);
    for t in 1..=4u64 {
        let g = rng.normal_vec(n, 0.01);
        let a = AdamWArgs {
            cautious_weight_decay: true,
            ..args(t)
        };
        adamw_update(&mut w, &mut m, &mut v, &g, &a).unwrap();
        let (bc1, bc2) = adamw_bias_corrections(a.beta1, a.beta2, t);
        let lr = a.lr * a.scales.lr_scale;
        let decay = 1.0 - lr * (a.weight_decay * a.scales.wd_scale);
        for i in 0..n {
            let gi = (g[i] * a.grad_scale) * a.clip_coef;
            rm[i] = a.beta1 * rm[i] + (1.0 - a.beta1) * gi;
            rv[i] = a.beta2 * rv[i] + (1.0 - a.beta2) * gi * gi;
            let u = lr * (rm[i] / bc1) / ((rv[i] / bc2).sqrt() + a.eps);
            rw[i] = if rw[i] * u >= 0.0 {
                decayed += 1;
                rw[i] * decay - u
            } else {
                kept += 1;
                rw[i] - u
            };
        }
        for (name, ours, reference) in [("w", &w, &rw), ("m", &m, &rm), ("v", &v, &rv)] {
            for i in 0..n {
                assert_eq!(ours[i].to_bits(), reference[i].to_bits(), "step {t} {name}[{i}]");
            }
        }
    }
    assert!(kept > n && decayed > n, "kept {kept}, decayed {decayed} of 4 × {n}");
}

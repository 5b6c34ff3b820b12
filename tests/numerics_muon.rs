//! The per-matrix Muon update against the docs/design.md §6 formulas evaluated in f64.

mod support;

use muon_opt::config::{CoefficientSet, Config, NsPrecision, ScaleMode};
use muon_opt::error::ErrorKind;
use muon_opt::numerics::muon::{MuonOptions, MuonShape, MuonStepArgs, MuonWorkspace, muon_scale, muon_update};
use muon_opt::numerics::step_args::{ParamScales, param_rates};
use support::docs::assert_quotes;
use support::numerics::{max_abs_diff, ns_reference_f64, to_f64};
use support::rng::Rng;

fn options(scale_mode: ScaleMode, nesterov: bool, extra: f32) -> MuonOptions {
    let cfg = Config {
        muon_nesterov: nesterov,
        muon_coefficient_set: CoefficientSet::Quintic,
        muon_num_ns_steps: 5,
        muon_ns_precision: NsPrecision::F32,
        muon_scale_mode: scale_mode,
        muon_extra_scale_factor: extra,
        ..Config::default()
    };
    MuonOptions::from_config(&cfg)
}

fn args() -> MuonStepArgs {
    MuonStepArgs {
        lr: 0.02,
        weight_decay: 0.1,
        scales: ParamScales {
            lr_scale: 1.5,
            wd_scale: 0.5,
        },
        momentum: 0.9,
        grad_scale: 1.0 / 3.0,
        clip_coef: 0.8,
    }
}

/// The scale of docs/design.md §6 for an m×n component, in f64.
fn scale_f64(mode: ScaleMode, m: usize, n: usize, extra: f32) -> f64 {
    let (m, n) = (m as f64, n as f64);
    let base = match mode {
        ScaleMode::Spectral => m.max(n).sqrt(),
        ScaleMode::ShapeScaling => (m / n).max(1.0).sqrt(),
        ScaleMode::UnitRmsNorm => (m / n).sqrt(),
    };
    base * f64::from(extra)
}

/// One Muon step in f64: returns (W', M').
#[allow(clippy::too_many_arguments)]
fn muon_step_f64(
    w: &[f64],
    m: &[f64],
    g: &[f32],
    rows: usize,
    cols: usize,
    splits: &[usize],
    a: &MuonStepArgs,
    o: &MuonOptions,
) -> (Vec<f64>, Vec<f64>) {
    let mu = f64::from(a.momentum);
    let (scale, clip) = (f64::from(a.grad_scale), f64::from(a.clip_coef));
    let g: Vec<f64> = g.iter().map(|&v| f64::from(v) * scale * clip).collect();
    let m_new: Vec<f64> = m.iter().zip(&g).map(|(m, g)| mu * m + (1.0 - mu) * g).collect();
    let u: Vec<f64> = if o.nesterov {
        g.iter().zip(&m_new).map(|(g, m)| g + mu * (m - g)).collect()
    } else {
        m_new.clone()
    };
    let lr = f64::from(a.lr) * f64::from(a.scales.lr_scale);
    let wd = f64::from(a.weight_decay) * f64::from(a.scales.wd_scale);
    let whole = [rows];
    let comps = if splits.is_empty() { &whole[..] } else { splits };
    let mut w_new = Vec::with_capacity(w.len());
    let mut start = 0;
    for &r in comps {
        let range = start..start + r * cols;
        let x = ns_reference_f64(&u[range.clone()], r, cols, o.ns.coefficients, o.ns.steps as usize);
        let s = scale_f64(o.scale_mode, r, cols, o.extra_scale_factor);
        for (wv, xv) in w[range.clone()].iter().zip(&x) {
            w_new.push(wv - lr * wd * wv - lr * s * xv);
        }
        start = range.end;
    }
    (w_new, m_new)
}

struct State {
    w: Vec<f32>,
    m: Vec<f32>,
}

fn random_state(rng: &mut Rng, n: usize) -> State {
    State {
        w: rng.normal_vec(n, 0.05),
        m: rng.normal_vec(n, 0.01),
    }
}

fn max_abs(x: &[f64]) -> f64 {
    x.iter().fold(0.0, |a, v| a.max(v.abs()))
}

#[test]
fn single_step_matches_f64_formulas() {
    let mut rng = Rng::new(21);
    for (rows, cols) in [(48, 80), (96, 40)] {
        let n = rows * cols;
        let g = rng.normal_vec(n, 0.01);
        let start = random_state(&mut rng, n);
        for mode in ScaleMode::ALL.iter().copied() {
            for nesterov in [false, true] {
                for extra in [1.0, 0.2] {
                    let o = options(mode, nesterov, extra);
                    let a = args();
                    let (w_ref, m_ref) =
                        muon_step_f64(&to_f64(&start.w), &to_f64(&start.m), &g, rows, cols, &[], &a, &o);
                    let (mut w, mut m) = (start.w.clone(), start.m.clone());
                    let shape = MuonShape {
                        rows,
                        cols,
                        split_rows: &[],
                        split_groups: 1,
                    };
                    muon_update(&mut w, &mut m, &g, &shape, &a, &o, &mut MuonWorkspace::default()).unwrap();
                    let what = format!("{rows}×{cols} {mode:?} nesterov={nesterov} extra={extra}");
                    assert!(max_abs_diff(&m, &m_ref) <= 1e-8, "{what}: momentum");
                    let diff = max_abs_diff(&w, &w_ref);
                    assert!(diff <= 1e-5, "{what}: master diff {diff:e}");
                    // The update is far larger than the tolerance.
                    let moved: Vec<f64> = w_ref.iter().zip(&start.w).map(|(a, &b)| a - f64::from(b)).collect();
                    assert!(max_abs(&moved) > 1e-3, "{what}: update too small to test");
                }
            }
        }
    }
}

#[test]
fn momentum_follows_the_documented_f32_order_bit_for_bit() {
    let mut rng = Rng::new(27);
    let (rows, cols) = (24, 40);
    let g = rng.normal_vec(rows * cols, 0.01);
    let start = random_state(&mut rng, rows * cols);
    let o = options(ScaleMode::Spectral, true, 1.0);
    let a = args();
    let (mut w, mut m) = (start.w.clone(), start.m.clone());
    let shape = MuonShape {
        rows,
        cols,
        split_rows: &[],
        split_groups: 1,
    };
    muon_update(&mut w, &mut m, &g, &shape, &a, &o, &mut MuonWorkspace::default()).unwrap();
    let mu = a.momentum;
    for i in 0..g.len() {
        let gi = (g[i] * a.grad_scale) * a.clip_coef;
        let expected = mu * start.m[i] + (1.0 - mu) * gi;
        assert_eq!(m[i].to_bits(), expected.to_bits(), "m[{i}]");
    }
}

#[test]
fn nesterov_changes_the_update() {
    let mut rng = Rng::new(22);
    let (rows, cols) = (32, 48);
    let g = rng.normal_vec(rows * cols, 0.01);
    let start = random_state(&mut rng, rows * cols);
    let shape = MuonShape {
        rows,
        cols,
        split_rows: &[],
        split_groups: 1,
    };
    let run = |nesterov| {
        let (mut w, mut m) = (start.w.clone(), start.m.clone());
        let o = options(ScaleMode::Spectral, nesterov, 1.0);
        muon_update(&mut w, &mut m, &g, &shape, &args(), &o, &mut MuonWorkspace::default()).unwrap();
        (w, m)
    };
    let (w_plain, m_plain) = run(false);
    let (w_nesterov, m_nesterov) = run(true);
    assert_eq!(m_plain, m_nesterov, "Nesterov only changes what is orthogonalized");
    assert_ne!(w_plain, w_nesterov);
}

#[test]
fn several_steps_accumulate_momentum() {
    let mut rng = Rng::new(23);
    let (rows, cols) = (40, 24);
    let n = rows * cols;
    let o = options(ScaleMode::ShapeScaling, true, 1.0);
    let a = args();
    let shape = MuonShape {
        rows,
        cols,
        split_rows: &[],
        split_groups: 1,
    };
    let start = random_state(&mut rng, n);
    let (mut w, mut m) = (start.w.clone(), start.m.clone());
    let (mut w_ref, mut m_ref) = (to_f64(&start.w), to_f64(&start.m));
    let mut ws = MuonWorkspace::new(rows, cols);
    for _ in 0..3 {
        let g = rng.normal_vec(n, 0.01);
        muon_update(&mut w, &mut m, &g, &shape, &a, &o, &mut ws).unwrap();
        (w_ref, m_ref) = muon_step_f64(&w_ref, &m_ref, &g, rows, cols, &[], &a, &o);
    }
    assert!(max_abs_diff(&m, &m_ref) <= 1e-7);
    assert!(max_abs_diff(&w, &w_ref) <= 3e-5);
}

#[test]
fn split_components_match_separate_updates_and_f64() {
    let mut rng = Rng::new(24);
    let (splits, cols) = ([24usize, 8, 8], 32);
    let rows: usize = splits.iter().sum();
    let n = rows * cols;
    let g = rng.normal_vec(n, 0.01);
    let start = random_state(&mut rng, n);
    for mode in ScaleMode::ALL.iter().copied() {
        let o = options(mode, false, 1.0);
        let a = args();
        let mut ws = MuonWorkspace::default();
        let (mut w, mut m) = (start.w.clone(), start.m.clone());
        let shape = MuonShape {
            rows,
            cols,
            split_rows: &splits,
            split_groups: 1,
        };
        muon_update(&mut w, &mut m, &g, &shape, &a, &o, &mut ws).unwrap();

        let (mut w_sep, mut m_sep) = (start.w.clone(), start.m.clone());
        let mut begin = 0;
        for r in splits {
            let range = begin..begin + r * cols;
            let part = MuonShape {
                rows: r,
                cols,
                split_rows: &[],
                split_groups: 1,
            };
            let (wp, mp) = (&mut w_sep[range.clone()], &mut m_sep[range.clone()]);
            muon_update(wp, mp, &g[range.clone()], &part, &a, &o, &mut ws).unwrap();
            begin = range.end;
        }
        assert_eq!(w, w_sep, "{mode:?}");
        assert_eq!(m, m_sep, "{mode:?}");

        let (w_ref, _) = muon_step_f64(&to_f64(&start.w), &to_f64(&start.m), &g, rows, cols, &splits, &a, &o);
        assert!(max_abs_diff(&w, &w_ref) <= 1e-5, "{mode:?}");
    }
}

/// Megatron's per-query-group QKV split (Emerging-Optimizers / Megatron `orthogonalize`:
/// `grad.view(groups, q + k + v, -1)`, split along dim 1, each part reshaped to a matrix):
/// with 4 query groups of 2 q-heads, component Q is the q rows of every group stacked in
/// group order. The grouped update equals gathering Q, K and V by that formula, updating each
/// as a matrix of its own and writing the rows back — bit for bit — and differs from the
/// consecutive split of the same sizes by far more than rounding (by how much, docs/megatron.md
/// quotes).
#[test]
fn per_group_splits_match_the_megatron_view_split_formula() {
    let mut rng = Rng::new(26);
    let (groups, head, heads_per_group, cols) = (4usize, 4usize, 2usize, 24usize);
    let pattern = [heads_per_group * head, head, head];
    let group_rows: usize = pattern.iter().sum();
    let rows = groups * group_rows;
    let n = rows * cols;
    let g = rng.normal_vec(n, 0.01);
    let start = random_state(&mut rng, n);
    let (o, a) = (options(ScaleMode::Spectral, true, 1.0), args());
    let mut ws = MuonWorkspace::default();
    let components: Vec<usize> = pattern.iter().map(|&p| p * groups).collect();
    let (mut w, mut m) = (start.w.clone(), start.m.clone());
    let grouped = MuonShape {
        rows,
        cols,
        split_rows: &components,
        split_groups: groups,
    };
    muon_update(&mut w, &mut m, &g, &grouped, &a, &o, &mut ws).unwrap();

    // The formula: rows of part c are, per group gi in order, gi·(q+k+v) + offset_c + j.
    let (mut w_ref, mut m_ref) = (start.w.clone(), start.m.clone());
    let mut offset = 0;
    for &part in &pattern {
        let rows_of: Vec<usize> = (0..groups)
            .flat_map(|gi| (0..part).map(move |j| gi * group_rows + offset + j))
            .collect();
        let take = |v: &[f32]| -> Vec<f32> {
            rows_of
                .iter()
                .flat_map(|&r| v[r * cols..(r + 1) * cols].to_vec())
                .collect()
        };
        let (mut wp, mut mp, gp) = (take(&w_ref), take(&m_ref), take(&g));
        let matrix = MuonShape {
            rows: rows_of.len(),
            cols,
            split_rows: &[],
            split_groups: 1,
        };
        muon_update(&mut wp, &mut mp, &gp, &matrix, &a, &o, &mut ws).unwrap();
        for (i, &r) in rows_of.iter().enumerate() {
            w_ref[r * cols..(r + 1) * cols].copy_from_slice(&wp[i * cols..(i + 1) * cols]);
            m_ref[r * cols..(r + 1) * cols].copy_from_slice(&mp[i * cols..(i + 1) * cols]);
        }
        offset += part;
    }
    assert_eq!(w, w_ref);
    assert_eq!(m, m_ref);

    let (mut w_consecutive, mut m_consecutive) = (start.w.clone(), start.m.clone());
    let consecutive = MuonShape {
        split_groups: 1,
        ..grouped
    };
    muon_update(
        &mut w_consecutive,
        &mut m_consecutive,
        &g,
        &consecutive,
        &a,
        &o,
        &mut ws,
    )
    .unwrap();
    let delta = |x: &[f32]| -> Vec<f32> { x.iter().zip(&start.w).map(|(a, b)| a - b).collect() };
    let (grouped_delta, consecutive_delta) = (delta(&w), delta(&w_consecutive));
    let norm = |x: &[f32]| x.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt();
    let difference: Vec<f32> = grouped_delta
        .iter()
        .zip(&consecutive_delta)
        .map(|(a, b)| a - b)
        .collect();
    let relative = norm(&difference) / norm(&grouped_delta);
    assert!(
        relative > 0.3,
        "the interleaved split is another update: relative difference {relative}"
    );
    assert_quotes(
        "docs/megatron.md",
        &[format!(
            "differs from the consecutive split by {:.0} % relative in `tests/numerics_muon.rs` \
             ({groups} groups of [{} q \\| {head} k \\| {head} v] rows, random gradients;",
            relative * 100.0,
            heads_per_group * head
        )],
    );

    let uneven = MuonShape {
        split_rows: &[9, 4, 3],
        ..grouped
    };
    let (w16, m16) = (&mut w[..16 * cols], &mut m[..16 * cols]);
    let err = muon_update(
        w16,
        m16,
        &g[..16 * cols],
        &MuonShape { rows: 16, ..uneven },
        &a,
        &o,
        &mut ws,
    )
    .unwrap_err();
    assert!(err.message.contains("not a multiple of the 4 split groups"), "{err}");
}

#[test]
fn weight_decay_alone_scales_the_master() {
    let mut rng = Rng::new(25);
    let (rows, cols) = (16, 24);
    let n = rows * cols;
    let w0 = rng.normal_vec(n, 1.0);
    let o = options(ScaleMode::Spectral, false, 1.0);
    let shape = MuonShape {
        rows,
        cols,
        split_rows: &[],
        split_groups: 1,
    };
    let a = args();
    // Zero gradient and momentum: the orthogonalized update is 0 and only decay remains.
    let (mut w, mut m) = (w0.clone(), vec![0.0; n]);
    muon_update(
        &mut w,
        &mut m,
        &vec![0.0; n],
        &shape,
        &a,
        &o,
        &mut MuonWorkspace::default(),
    )
    .unwrap();
    let factor =
        1.0 - f64::from(a.lr) * f64::from(a.scales.lr_scale) * f64::from(a.weight_decay) * f64::from(a.scales.wd_scale);
    let expected: Vec<f64> = w0.iter().map(|&v| f64::from(v) * factor).collect();
    assert!(max_abs_diff(&w, &expected) <= 1e-6);
    assert!(w.iter().zip(&w0).all(|(a, b)| a.abs() < b.abs() || *b == 0.0));
    assert!(m.iter().all(|&v| v == 0.0));
    // wd_scale = 0 (a no-weight-decay parameter) leaves the master untouched.
    let mut w = w0.clone();
    let a0 = MuonStepArgs {
        scales: ParamScales {
            wd_scale: 0.0,
            ..a.scales
        },
        ..a
    };
    muon_update(
        &mut w,
        &mut m,
        &vec![0.0; n],
        &shape,
        &a0,
        &o,
        &mut MuonWorkspace::default(),
    )
    .unwrap();
    assert_eq!(w, w0);
}

#[test]
fn clip_coefficient_scales_the_gradient() {
    let mut rng = Rng::new(26);
    let (rows, cols) = (20, 30);
    let n = rows * cols;
    let g = rng.normal_vec(n, 0.01);
    let half_g: Vec<f32> = g.iter().map(|v| v * 0.5).collect();
    let start = random_state(&mut rng, n);
    let o = options(ScaleMode::Spectral, true, 1.0);
    let shape = MuonShape {
        rows,
        cols,
        split_rows: &[],
        split_groups: 1,
    };
    let run = |grad: &[f32], grad_scale, clip_coef| {
        let (mut w, mut m) = (start.w.clone(), start.m.clone());
        let a = MuonStepArgs {
            grad_scale,
            clip_coef,
            ..args()
        };
        muon_update(&mut w, &mut m, grad, &shape, &a, &o, &mut MuonWorkspace::default()).unwrap();
        (w, m)
    };
    // Multiplying by 0.5 is exact, so clipping by 0.5 is bit-identical to a halved gradient.
    assert_eq!(run(&g, 1.0, 0.5), run(&half_g, 1.0, 1.0));
    assert_ne!(run(&g, 1.0, 0.5), run(&g, 1.0, 1.0));
    // The mean first, then the clip: two roundings in that order (a gradient already the mean
    // clips alike, whatever dp it was summed over).
    let third = 1.0f32 / 3.0;
    let mean: Vec<f32> = g.iter().map(|v| v * third).collect();
    assert_eq!(run(&g, third, 0.8), run(&mean, 1.0, 0.8));
}

#[test]
fn scale_modes_follow_the_component_shape() {
    for (m, n) in [(96, 40), (40, 96), (64, 64), (1, 7)] {
        for mode in ScaleMode::ALL.iter().copied() {
            let got = f64::from(muon_scale(mode, m, n, 0.2));
            let want = scale_f64(mode, m, n, 0.2);
            assert!((got - want).abs() <= 1e-6 * want, "{mode:?} {m}×{n}: {got} vs {want}");
        }
    }
    assert!(muon_scale(ScaleMode::ShapeScaling, 40, 96, 1.0) == 1.0);
    assert!(muon_scale(ScaleMode::UnitRmsNorm, 40, 96, 1.0) < 1.0);
}

#[test]
fn rejects_bad_arguments_without_touching_state() {
    let (rows, cols) = (8, 6);
    let n = rows * cols;
    let o = options(ScaleMode::Spectral, false, 1.0);
    let g = vec![1.0; n];
    let (mut w, mut m) = (vec![1.0; n], vec![0.5; n]);
    let mut ws = MuonWorkspace::default();
    let mut check = |shape: MuonShape<'_>, grad: &[f32], opts: &MuonOptions, kind| {
        let err = muon_update(&mut w, &mut m, grad, &shape, &args(), opts, &mut ws).unwrap_err();
        assert_eq!(err.kind, kind, "{}", err.message);
    };
    let plain = MuonShape {
        rows,
        cols,
        split_rows: &[],
        split_groups: 1,
    };
    check(plain, &g[1..], &o, ErrorKind::InvalidArgument);
    check(MuonShape { rows: 7, ..plain }, &g, &o, ErrorKind::InvalidArgument);
    check(
        MuonShape {
            split_rows: &[4, 3],
            split_groups: 1,
            ..plain
        },
        &g,
        &o,
        ErrorKind::InvalidArgument,
    );
    check(
        MuonShape {
            split_rows: &[8, 0],
            split_groups: 1,
            ..plain
        },
        &g,
        &o,
        ErrorKind::InvalidArgument,
    );
    check(
        MuonShape {
            rows: 0,
            cols: 0,
            split_rows: &[],
            split_groups: 1,
        },
        &[],
        &o,
        ErrorKind::InvalidArgument,
    );
    let mut bad = o;
    bad.ns.steps = 0;
    check(plain, &g, &bad, ErrorKind::OutOfRange);
    assert!(w.iter().all(|&v| v == 1.0) && m.iter().all(|&v| v == 0.5));
}

/// Cautious weight decay (microsoft/dion's `cautious_wd` in `muon_update_post_orthogonalize`):
/// a weight is decayed only where it and its orthogonalized update `X` share a sign. Against a
/// per-element reference built from the same step's scaled update `s·X` — read off a zero
/// master, which no decay moves, so `W' = 0·d − s·X = −(s·X)` exactly — bit for bit, with both
/// kinds of element present; the momentum is plain Muon's, and plain decay (checked against
/// the same `s·X`) differs wherever the weight was kept.
#[test]
fn cautious_weight_decay_decays_only_where_weight_and_update_agree() {
    let (rows, cols) = (24, 16);
    let n = rows * cols;
    let mut rng = Rng::new(77);
    let (w0, m0, g) = (rng.normal_vec(n, 1.0), rng.normal_vec(n, 0.01), rng.normal_vec(n, 0.01));
    let shape = MuonShape {
        rows,
        cols,
        split_rows: &[],
        split_groups: 1,
    };
    let a = args();
    let plain = options(ScaleMode::Spectral, true, 1.0);
    let cautious = MuonOptions {
        cautious_weight_decay: true,
        ..plain
    };
    let run = |w0: &[f32], o: &MuonOptions| {
        let (mut w, mut m) = (w0.to_vec(), m0.clone());
        muon_update(&mut w, &mut m, &g, &shape, &a, o, &mut MuonWorkspace::default()).unwrap();
        (w, m)
    };
    let (minus_step_x, m_plain) = run(&vec![0.0; n], &plain);
    let (w_cautious, m_cautious) = run(&w0, &cautious);
    let (w_plain, _) = run(&w0, &plain);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&m_cautious), bits(&m_plain));
    let decay = param_rates(a.lr, a.weight_decay, a.scales).decay;
    let (mut kept, mut decayed) = (0, 0);
    for i in 0..n {
        let step_x = -minus_step_x[i];
        assert_eq!(
            w_plain[i].to_bits(),
            (w0[i] * decay - step_x).to_bits(),
            "plain, element {i}"
        );
        let expected = if w0[i] * step_x >= 0.0 {
            decayed += 1;
            w0[i] * decay - step_x
        } else {
            kept += 1;
            w0[i] - step_x
        };
        assert_eq!(w_cautious[i].to_bits(), expected.to_bits(), "cautious, element {i}");
        assert_eq!(w_cautious[i] == w_plain[i], w0[i] * step_x >= 0.0, "element {i}");
    }
    assert!(kept > n / 4 && decayed > n / 4, "kept {kept}, decayed {decayed} of {n}");
}

/// A bf16 momentum (`muon_momentum_dtype = bf16`, microsoft/dion's `momentum_dtype`): each new
/// momentum value is `μ·M + (1−μ)·g` rounded to bf16 (nearest even), and the update is that of
/// the rounded momentum — bit for bit the f32 update of a step with μ = 0 and the rounded
/// momentum as its gradient (then `M = 0·M + 1·g` is that gradient exactly), with and without
/// Nesterov.
#[test]
fn a_bf16_momentum_is_rounded_where_it_is_updated() {
    use muon_opt::numerics::bf16::round_through_bf16;
    let (rows, cols) = (24, 16);
    let n = rows * cols;
    let mut rng = Rng::new(79);
    let w0 = rng.normal_vec(n, 1.0);
    let m0: Vec<f32> = rng.normal_vec(n, 0.01).into_iter().map(round_through_bf16).collect();
    let g = rng.normal_vec(n, 0.01);
    let shape = MuonShape {
        rows,
        cols,
        split_rows: &[],
        split_groups: 1,
    };
    let a = args();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for nesterov in [false, true] {
        let f32_opts = options(ScaleMode::Spectral, nesterov, 1.0);
        let bf16_opts = MuonOptions {
            momentum_bf16: true,
            ..f32_opts
        };
        let (mut w, mut m) = (w0.clone(), m0.clone());
        muon_update(
            &mut w,
            &mut m,
            &g,
            &shape,
            &a,
            &bf16_opts,
            &mut MuonWorkspace::default(),
        )
        .unwrap();
        let (scale, clip) = (a.grad_scale, a.clip_coef);
        let expected_m: Vec<f32> = (0..n)
            .map(|i| round_through_bf16(a.momentum * m0[i] + (1.0 - a.momentum) * ((g[i] * scale) * clip)))
            .collect();
        assert_eq!(bits(&m), bits(&expected_m), "nesterov {nesterov}: momentum");
        let (mut f32_w, mut f32_m) = (w0.clone(), vec![0.0; n]);
        let direct = MuonStepArgs {
            momentum: 0.0,
            grad_scale: 1.0,
            clip_coef: 1.0,
            ..a
        };
        let plain = options(ScaleMode::Spectral, false, 1.0);
        let u: Vec<f32> = if nesterov {
            let g: Vec<f32> = g.iter().map(|&g| (g * scale) * clip).collect();
            (0..n).map(|i| g[i] + a.momentum * (expected_m[i] - g[i])).collect()
        } else {
            expected_m.clone()
        };
        muon_update(
            &mut f32_w,
            &mut f32_m,
            &u,
            &shape,
            &direct,
            &plain,
            &mut MuonWorkspace::default(),
        )
        .unwrap();
        assert_eq!(bits(&w), bits(&f32_w), "nesterov {nesterov}: master");
    }
}

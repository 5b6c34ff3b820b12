//! Host NorMuon and AdaMuon against the published implementation: Emerging-Optimizers'
//! `AdaptiveMuon(moment2_method="normuon" | "adamuon")` (PyPI `emerging-optimizers` 0.3.0 = git
//! tag v0.3.0, commit b309e2f0, the version Megatron-LM pins), run in float32 for three steps by
//! the peer script `tests/data/golden/peer/adaptive_muon_emerging_optimizers.py` on the vendored
//! inputs of `tests/data/golden/normuon` and `tests/data/golden/adamuon` (provenance in
//! `tests/data/golden/README.md`).

mod support;

use muon_opt::config::{Config, MuonVariant, NsPrecision};
use muon_opt::numerics::adaptive::{self, AdaptiveOptions};
use muon_opt::numerics::muon::{MuonOptions, MuonShape, MuonStepArgs, MuonWorkspace, muon_update_with_moment2};
use muon_opt::numerics::step_args::ParamScales;
use support::golden::{read, read_f32};

/// One vendored case: the inputs and the peer's params and second moments after every step.
struct PeerCase {
    rows: usize,
    cols: usize,
    steps: usize,
    nesterov: bool,
    lr: f32,
    weight_decay: f32,
    momentum: f32,
    init: Vec<f32>,
    grads: Vec<f32>,
    params: Vec<f32>,
    moment2: Vec<f32>,
}

/// The vendored cases of `variant` (the manifest's entries of its name).
fn peer_cases(variant: MuonVariant) -> Vec<PeerCase> {
    let manifest: serde_json::Value = serde_json::from_slice(&read("manifest.json")).unwrap();
    manifest[variant.name()]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let int = |key: &str| c[key].as_u64().unwrap() as usize;
            let float = |key: &str| c[key].as_f64().unwrap() as f32;
            let (rows, cols, steps) = (int("rows"), int("cols"), int("steps"));
            let file = |key: &str, len: usize| {
                let values = read_f32(c[key].as_str().unwrap());
                assert_eq!(values.len(), len, "{key}");
                values
            };
            let moment2_values = adaptive::moment2_values(variant, rows, cols);
            assert_eq!(int("moment2_lines"), moment2_values);
            PeerCase {
                rows,
                cols,
                steps,
                nesterov: c["nesterov"].as_bool().unwrap(),
                lr: float("lr"),
                weight_decay: float("weight_decay"),
                momentum: float("momentum"),
                init: file("init_f32", rows * cols),
                grads: file("grads_f32", steps * rows * cols),
                params: file("params_f32", steps * rows * cols),
                moment2: file("moment2_f32", steps * moment2_values),
            }
        })
        .collect()
}

/// The library's `variant` with the peer's settings: f32 products, quintic coefficients, 5
/// steps, spectral scale, eps 1e-7 of the Newton–Schulz normalization (Emerging-Optimizers
/// v0.3.0's `newton_schulz` default), β2 0.95 and ε 1e-8 (`AdaptiveMuon`'s defaults, the
/// config's).
fn options(variant: MuonVariant, nesterov: bool) -> MuonOptions {
    MuonOptions::from_config(&Config {
        muon_variant: variant,
        muon_ns_precision: NsPrecision::F32,
        muon_nesterov: nesterov,
        ..Config::default()
    })
}

/// What the comparison with the peer allows.
#[derive(Clone, Copy)]
struct Tolerance {
    /// Largest `|ours − peer|` of any param after any step.
    param: f64,
    /// Largest 99th percentile of `|ours − peer|` over a case's params after a step.
    param_p99: f64,
    /// Largest `|ours − peer|` of a second-moment value, relative to the peer's value
    /// (`per_value`) or to the mean of the peer's values of the case at that step.
    moment2: f64,
    per_value: bool,
}

/// NorMuon. Largest `|ours − peer|` allowed on the params: 4e-7, about 7 units of f32 roundoff
/// (`u = 2⁻²⁴ ≈ 6e-8`) of the params' magnitude (≤ 1). The two f32 Newton–Schulz iterations
/// (faer here, MKL in the peer, summing in different orders) differ by ~1e-6 relative per
/// element, the line statistics too (f64 sums here, f32 in torch's `mean`), and a step's update
/// is `lr·√max(m, n)·Y` with elements of about 0.01–0.03, so three steps leave the params a few
/// `u` apart: measured 1.9e-7 (96×40), 1.6e-7 (40×112), 1.5e-7 (64×64). A changed algorithm
/// misses by far more (`a_changed_algorithm_misses_the_peer`: standard Muon 1.7e-3 to 2.3e-2,
/// β2 0.9 instead of 0.95 3.7e-5 to 3.5e-4). The second moment, a mean of squares of elements
/// that agree to ~1e-6 relative, agrees to 1e-5 of each value: measured ≤ 1.6e-6.
const NORMUON: Tolerance = Tolerance {
    param: 4e-7,
    param_p99: 4e-7,
    moment2: 1e-5,
    per_value: true,
};

/// AdaMuon divides every element by the root of its own second moment, so an element that is
/// small at every step carries the two Newton–Schulz iterations' absolute difference (about
/// 1e-7: faer here, MKL in the peer) amplified by `1/√V`, where NorMuon's line statistics
/// average it away. After one step the params agree as NorMuon's do (99th percentile ≤ 3e-7);
/// after three, measured: largest 7.5e-5 (96×40), 4.3e-5 (40×112), 2.6e-5 (64×64), 99th
/// percentile ≤ 3.4e-6, median ≤ 4.8e-7 — against a step that moves an element by up to
/// `lr·√max(m, n)/√(1 − β2)` ≈ 0.9. The second moment, `(1 − β2)·x²` summed, agrees to ≤ 4.5e-5
/// of its mean (its largest values carry `2·Δx/x` of the largest elements). A changed
/// algorithm misses by more than 10× these (`a_changed_algorithm_misses_the_peer`).
const ADAMUON: Tolerance = Tolerance {
    param: 2e-4,
    param_p99: 1e-5,
    moment2: 1e-4,
    per_value: false,
};

/// Runs the library's `opts` on `case`'s inputs, returning (params, moment2) after every step.
fn run(case: &PeerCase, opts: &MuonOptions) -> (Vec<f32>, Vec<f32>) {
    let (rows, cols) = (case.rows, case.cols);
    let len = rows * cols;
    let shape = MuonShape {
        rows,
        cols,
        split_rows: &[],
        split_groups: 1,
    };
    let args = MuonStepArgs {
        lr: case.lr,
        weight_decay: case.weight_decay,
        scales: ParamScales {
            lr_scale: 1.0,
            wd_scale: 1.0,
        },
        momentum: case.momentum,
        grad_scale: 1.0,
        clip_coef: 1.0,
    };
    let (mut master, mut momentum) = (case.init.clone(), vec![0.0f32; len]);
    let mut moment2 = vec![0.0f32; opts.moment2_len(&shape)];
    let mut ws = MuonWorkspace::default();
    let (mut params, mut moments) = (Vec::new(), Vec::new());
    for step in 0..case.steps {
        let grad = &case.grads[step * len..(step + 1) * len];
        muon_update_with_moment2(
            &mut master,
            &mut momentum,
            &mut moment2,
            grad,
            &shape,
            &args,
            opts,
            &mut ws,
        )
        .unwrap();
        params.extend_from_slice(&master);
        moments.extend_from_slice(&moment2);
    }
    (params, moments)
}

fn max_diff(ours: &[f32], peer: &[f32]) -> f64 {
    ours.iter()
        .zip(peer)
        .map(|(&a, &b)| (f64::from(a) - f64::from(b)).abs())
        .fold(0.0, f64::max)
}

fn percentile_99(ours: &[f32], peer: &[f32]) -> f64 {
    let mut diffs: Vec<f64> = ours
        .iter()
        .zip(peer)
        .map(|(&a, &b)| (f64::from(a) - f64::from(b)).abs())
        .collect();
    diffs.sort_by(f64::total_cmp);
    diffs[diffs.len() * 99 / 100]
}

/// Checks `variant` against the peer's cases: the params and the second moment (its
/// `moment2_buffer`) after every step within `tolerance`.
fn check_matches_peer(variant: MuonVariant, tolerance: Tolerance) {
    let cases = peer_cases(variant);
    assert!(cases.iter().any(|c| c.rows > c.cols) && cases.iter().any(|c| c.rows < c.cols));
    assert!(cases.iter().any(|c| c.nesterov) && cases.iter().any(|c| !c.nesterov));
    for case in &cases {
        let (params, moment2) = run(case, &options(variant, case.nesterov));
        let (len, values) = (case.init.len(), case.moment2.len() / case.steps);
        for step in 0..case.steps {
            let label = format!("{} {}×{} step {step}", variant.name(), case.rows, case.cols);
            let (ours, peer) = (&params[step * len..][..len], &case.params[step * len..][..len]);
            let diff = max_diff(ours, peer);
            assert!(diff <= tolerance.param, "{label}: params differ by {diff:e}");
            let p99 = percentile_99(ours, peer);
            assert!(p99 <= tolerance.param_p99, "{label}: 99th percentile {p99:e}");
            let (ours, peer) = (
                &moment2[step * values..][..values],
                &case.moment2[step * values..][..values],
            );
            let mean = peer.iter().map(|&v| f64::from(v)).sum::<f64>() / values as f64;
            for (i, (&o, &p)) in ours.iter().zip(peer).enumerate() {
                let scale = if tolerance.per_value { f64::from(p).abs() } else { mean };
                let relative = (f64::from(o) - f64::from(p)).abs() / scale;
                assert!(
                    relative <= tolerance.moment2,
                    "{label}: moment2[{i}] {o:e} vs the peer's {p:e}"
                );
            }
        }
        // The params moved: the comparison is not of two unchanged copies.
        assert!(max_diff(&case.params[..len], &case.init) > 1e-3, "{variant:?}");
    }
}

/// Three NorMuon steps on tall (per-row statistics), wide (per-column) and square matrices,
/// with and without Nesterov, agree with Emerging-Optimizers' within f32 rounding: the params
/// after every step and the second moment (one value per line).
#[test]
fn normuon_matches_emerging_optimizers_adaptive_muon() {
    check_matches_peer(MuonVariant::Normuon, NORMUON);
}

/// Three AdaMuon steps on the same shapes agree with Emerging-Optimizers' within f32 rounding:
/// the params after every step and the element-wise second moment.
#[test]
fn adamuon_matches_emerging_optimizers_adaptive_muon() {
    check_matches_peer(MuonVariant::Adamuon, ADAMUON);
}

/// The comparison tells the algorithm apart: standard Muon, the other adaptive variant, another
/// β2 and another ε (which makes NorMuon's floor bind and AdaMuon's term count) each miss the
/// peer by far more than the tolerance.
#[test]
fn a_changed_algorithm_misses_the_peer() {
    for (variant, other, tolerance) in [
        (MuonVariant::Normuon, MuonVariant::Adamuon, NORMUON),
        (MuonVariant::Adamuon, MuonVariant::Normuon, ADAMUON),
    ] {
        for case in &peer_cases(variant) {
            let opts = options(variant, case.nesterov);
            let changed = [
                ("standard Muon", MuonVariant::Standard, opts.adaptive),
                ("the other variant", other, opts.adaptive),
                (
                    "beta2 0.9",
                    variant,
                    AdaptiveOptions {
                        beta2: 0.9,
                        ..opts.adaptive
                    },
                ),
                (
                    "eps 1e-2",
                    variant,
                    AdaptiveOptions {
                        eps: 1e-2,
                        ..opts.adaptive
                    },
                ),
            ];
            for (what, changed_variant, adaptive) in changed {
                let changed_opts = MuonOptions {
                    variant: changed_variant,
                    adaptive,
                    ..opts
                };
                let (params, _) = run(case, &changed_opts);
                let diff = max_diff(&params, &case.params);
                assert!(
                    diff > 10.0 * tolerance.param,
                    "{} {}×{} {what}: only {diff:e} from the peer",
                    variant.name(),
                    case.rows,
                    case.cols
                );
            }
        }
    }
}

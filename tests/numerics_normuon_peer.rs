//! Host NorMuon against the published implementation: Emerging-Optimizers'
//! `AdaptiveMuon(moment2_method="normuon")` (PyPI `emerging-optimizers` 0.3.0 = git tag v0.3.0,
//! commit b309e2f0, the version Megatron-LM pins), run in float32 for three steps by the peer
//! script `tests/data/golden/peer/normuon_emerging_optimizers.py` on the vendored inputs of
//! `tests/data/golden/normuon` (provenance in `tests/data/golden/README.md`).

mod support;

use muon_opt::config::{Config, MuonVariant, NsPrecision};
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

fn peer_cases() -> Vec<PeerCase> {
    let manifest: serde_json::Value = serde_json::from_slice(&read("manifest.json")).unwrap();
    manifest["normuon"]
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
            assert_eq!(int("moment2_lines"), rows.max(cols));
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
                moment2: file("moment2_f32", steps * rows.max(cols)),
            }
        })
        .collect()
}

/// The library's NorMuon with the peer's settings: f32 products, quintic coefficients, 5 steps,
/// spectral scale, eps 1e-7 of the Newton–Schulz normalization (Emerging-Optimizers v0.3.0's
/// `newton_schulz` default), β2 0.95 and ε 1e-8 (`AdaptiveMuon`'s defaults, the config's).
fn options(nesterov: bool) -> MuonOptions {
    MuonOptions::from_config(&Config {
        muon_variant: MuonVariant::Normuon,
        muon_ns_precision: NsPrecision::F32,
        muon_nesterov: nesterov,
        ..Config::default()
    })
}

/// Largest `|ours − peer|` allowed on the params: 4e-7, about 7 units of f32 roundoff
/// (`u = 2⁻²⁴ ≈ 6e-8`) of the params' magnitude (≤ 1). The two f32 Newton–Schulz iterations
/// (faer here, MKL in the peer, summing in different orders) differ by ~1e-6 relative per
/// element, the line statistics too (f64 sums here, f32 in torch's `mean`), and a step's update
/// is `lr·√max(m, n)·Y` with elements of about 0.01–0.03, so three steps leave the params a few
/// `u` apart: measured 1.9e-7 (96×40), 1.6e-7 (40×112), 1.5e-7 (64×64). A changed algorithm
/// misses by far more (`a_changed_algorithm_misses_the_peer`: standard Muon 1.7e-3 to 2.3e-2,
/// β2 0.9 instead of 0.95 3.7e-5 to 3.5e-4).
const PARAM_TOLERANCE: f64 = 4e-7;

/// Relative tolerance on the second moment, a mean of squares of elements that agree to ~1e-6
/// relative: measured ≤ 1.6e-6.
const MOMENT2_RELATIVE_TOLERANCE: f64 = 1e-5;

/// Runs the library's NorMuon on `case`'s inputs, returning (params, moment2) after every step.
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

/// Three NorMuon steps on tall (per-row statistics), wide (per-column) and square matrices,
/// with and without Nesterov, agree with Emerging-Optimizers' within f32 rounding: the params
/// after every step and the second moment (its `moment2_buffer`, one value per line).
#[test]
fn normuon_matches_emerging_optimizers_adaptive_muon() {
    let cases = peer_cases();
    assert!(cases.iter().any(|c| c.rows > c.cols) && cases.iter().any(|c| c.rows < c.cols));
    assert!(cases.iter().any(|c| c.nesterov) && cases.iter().any(|c| !c.nesterov));
    for case in &cases {
        let (params, moment2) = run(case, &options(case.nesterov));
        let label = format!("{}×{}", case.rows, case.cols);
        let diff = max_diff(&params, &case.params);
        assert!(diff <= PARAM_TOLERANCE, "{label}: params differ by {diff:e}");
        for (i, (&ours, &peer)) in moment2.iter().zip(&case.moment2).enumerate() {
            let relative = (f64::from(ours) - f64::from(peer)).abs() / f64::from(peer).abs();
            assert!(
                relative <= MOMENT2_RELATIVE_TOLERANCE,
                "{label}: moment2[{i}] {ours:e} vs the peer's {peer:e}"
            );
        }
        // The params moved: the comparison is not of two unchanged copies.
        assert!(max_diff(&case.params[..case.init.len()], &case.init) > 1e-3, "{label}");
    }
}

/// The comparison tells the algorithm apart: standard Muon, NorMuon with another β2 and
/// NorMuon with another ε floor (which makes the floor bind) each miss the peer by far more
/// than the tolerance.
#[test]
fn a_changed_algorithm_misses_the_peer() {
    for case in &peer_cases() {
        let normuon = options(case.nesterov);
        let variants = [
            (
                "standard Muon",
                MuonOptions {
                    variant: MuonVariant::Standard,
                    ..normuon
                },
            ),
            ("beta2 0.9", {
                let mut o = normuon;
                o.normuon.beta2 = 0.9;
                o
            }),
            ("eps 1e-2", {
                let mut o = normuon;
                o.normuon.eps = 1e-2;
                o
            }),
        ];
        for (what, opts) in variants {
            let (params, _) = run(case, &opts);
            let diff = max_diff(&params, &case.params);
            assert!(
                diff > 10.0 * PARAM_TOLERANCE,
                "{}×{} {what}: only {diff:e} from the peer",
                case.rows,
                case.cols
            );
        }
    }
}

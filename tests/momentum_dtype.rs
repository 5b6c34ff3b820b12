//! The figures of docs/bf16-momentum.md, produced here (`cargo test --release --test
//! momentum_dtype`): the device bytes a bf16 Muon momentum saves on named jobs, and what it
//! does to the update against an f32 momentum. Each table row is computed and must appear in
//! the doc as printed (`-- --nocapture` prints the rows).

mod support;

use muon_opt::config::{Config, Dtype, NsPrecision};
use muon_opt::numerics::muon::{MuonOptions, MuonShape, MuonStepArgs, MuonWorkspace, muon_update};
use muon_opt::numerics::step_args::ParamScales;
use muon_opt::plan::build_plan;
use muon_opt::plan::presets::preset;
use muon_opt::sim::device::device_bytes;
use support::docs::assert_quotes;
use support::rng::Rng;

const DOC: &str = "docs/bf16-momentum.md";
const GB: f64 = 1e9;

/// `| model | dp | momenta GB f32 | bf16 | device GB / rank f32 | bf16 | saved | saved with
/// Nesterov |`: the largest rank's device bytes (`muon-opt plan`'s figures) with each momentum
/// dtype. Without Nesterov a bf16 run also holds the f32 update of its largest Muon job in a
/// workspace (an f32 momentum is its own update); a Nesterov run holds it either way.
fn memory_row(model: &str, dp: usize) -> String {
    let m = preset(model).unwrap();
    let bytes = |muon_momentum_dtype, muon_nesterov| {
        let cfg = Config {
            vocab_size: m.vocab_size,
            muon_momentum_dtype,
            muon_nesterov,
            ..Config::default()
        };
        let registry = m.registry(&cfg).unwrap();
        let plan = build_plan(registry.params(), registry.routes(), &cfg, dp).unwrap();
        device_bytes(&plan, registry.params(), &cfg).unwrap()
    };
    let (f32, bf16) = (bytes(Dtype::F32, false), bytes(Dtype::Bf16, false));
    let saved = f32.total as f64 - bf16.total as f64;
    let nesterov = bytes(Dtype::F32, true).total as f64 - bytes(Dtype::Bf16, true).total as f64;
    format!(
        "| {model} | {dp} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} GB ({:.1} %) | {:.2} GB |",
        f32.momenta as f64 / GB,
        bf16.momenta as f64 / GB,
        f32.total as f64 / GB,
        bf16.total as f64 / GB,
        saved / GB,
        100.0 * saved / f32.total as f64,
        nesterov / GB
    )
}

#[test]
fn the_doc_quotes_the_memory_a_bf16_momentum_saves() {
    let rows: Vec<String> = [("gpt2-124m", 8), ("llama3-8b", 8), ("llama3-70b", 64)]
        .iter()
        .map(|&(model, dp)| memory_row(model, dp))
        .collect();
    println!("{}", rows.join("\n"));
    assert_quotes(DOC, &rows);
}

/// ‖a − b‖_F / ‖b‖_F in f64.
fn relative(a: &[f32], b: &[f32]) -> f64 {
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        diff += (f64::from(x) - f64::from(y)).powi(2);
        norm += f64::from(y).powi(2);
    }
    (diff / norm).sqrt()
}

/// A `rows × cols` gradient: normal entries (full rank), or the product of `rows × rank` and
/// `rank × cols` normal factors.
fn gradient(rng: &mut Rng, rows: usize, cols: usize, rank: Option<usize>) -> Vec<f32> {
    match rank {
        None => rng.normal_vec(rows * cols, 1e-3),
        Some(k) => {
            let (a, b) = (rng.normal_vec(rows * k, 1e-2), rng.normal_vec(k * cols, 1e-2));
            let mut g = vec![0.0f32; rows * cols];
            for i in 0..rows {
                for j in 0..cols {
                    g[i * cols + j] = (0..k).map(|t| a[i * k + t] * b[t * cols + j]).sum();
                }
            }
            g
        }
    }
}

const STEPS: usize = 10;

/// The momentum after [`STEPS`] steps of one matrix (μ 0.95, no weight decay) on the same
/// gradients, and the last step's update (the change of the master).
fn trained(
    (rows, cols): (usize, usize),
    rank: Option<usize>,
    precision: NsPrecision,
    muon_momentum_dtype: Dtype,
) -> (Vec<f32>, Vec<f32>) {
    let shape = MuonShape {
        rows,
        cols,
        split_rows: &[],
        split_groups: 1,
    };
    let args = MuonStepArgs {
        lr: 0.02,
        weight_decay: 0.0,
        scales: ParamScales {
            lr_scale: 1.0,
            wd_scale: 1.0,
        },
        momentum: 0.95,
        grad_scale: 1.0,
        clip_coef: 1.0,
    };
    let run = || {
        let opts = MuonOptions::from_config(&Config {
            muon_ns_precision: precision,
            muon_momentum_dtype,
            ..Config::default()
        });
        let mut rng = Rng::new(97);
        let mut w = rng.normal_vec(rows * cols, 0.02);
        let mut m = vec![0.0f32; rows * cols];
        let mut ws = MuonWorkspace::default();
        let mut before = w.clone();
        for _ in 0..STEPS {
            let g = gradient(&mut rng, rows, cols, rank);
            before.copy_from_slice(&w);
            muon_update(&mut w, &mut m, &g, &shape, &args, &opts, &mut ws).unwrap();
        }
        let step: Vec<f32> = w.iter().zip(&before).map(|(a, b)| a - b).collect();
        (m, step)
    };
    run()
}

#[test]
fn the_doc_quotes_the_effect_of_a_bf16_momentum_on_the_update() {
    let (rows, cols) = (512, 256);
    let mut quotes = Vec::new();
    for (gradients, rank) in [("full rank", None), ("rank 4", Some(4))] {
        let run = |precision, dtype| trained((rows, cols), rank, precision, dtype);
        // The reference: what the Newton–Schulz precision alone does to the same update.
        let (_, f32_ns) = run(NsPrecision::F32, Dtype::F32);
        for precision in [NsPrecision::Bf16, NsPrecision::F32] {
            let ((m32, u32), (m16, u16)) = (run(precision, Dtype::F32), run(precision, Dtype::Bf16));
            quotes.push(format!(
                "| {rows} × {cols}, {gradients} | {} | {:.2} % | {:.2} % | {:.2} % |",
                precision.name(),
                100.0 * relative(&m16, &m32),
                100.0 * relative(&u16, &u32),
                100.0 * relative(&u32, &f32_ns)
            ));
        }
    }
    println!("{}", quotes.join("\n"));
    assert_quotes(DOC, &quotes);
}

//! Host Newton–Schulz throughput, side by side with the GEMM crate's own full products
//! (`numerics::gemm`, faer) running the same three products per step (X·Xᵀ, A·A, B·X) on the
//! same shapes, all on every core. Newton–Schulz computes the two symmetric products by their
//! lower triangles, so its effective rate (the full products' flops over its time) can pass
//! the plain GEMM's.
//!
//! Run: `cargo bench --bench newton_schulz`. `MUON_BENCH_REPS` sets the repetitions (best of,
//! default 3).
//!
//! FLOPs per run (m = min(rows, cols), n = max): `T·(2·m²·n + 2·m³ + 2·m²·n)`.
//!
//! Then the standard and the Gram iteration (`newton_schulz_gram`) in f32 on the Gram shapes
//! (`MUON_BENCH_GRAM_SHAPE=ROWSxCOLS`, default 4096x14336, llama3-8b's MLP), best of the same
//! repetitions, interleaved, and standard time / Gram time.

use std::time::{Duration, Instant};

use muon_opt::config::{CoefficientSet, NsMethod, NsPrecision};
use muon_opt::numerics::gemm::{Output, Strides, gemm};
use muon_opt::numerics::newton_schulz::{NsOptions, NsWorkspace, newton_schulz, newton_schulz_gram};

const STEPS: u32 = 5;
const SHAPES: [(usize, usize); 3] = [(1024, 1024), (1024, 4096), (2048, 2048)];

/// The GEMM content of `STEPS` Newton–Schulz steps, nothing else.
struct PlainGemm {
    m: usize,
    n: usize,
    x: Vec<f32>,
    a: Vec<f32>,
    b: Vec<f32>,
    y: Vec<f32>,
}

impl PlainGemm {
    fn new(x: &[f32], m: usize, n: usize) -> Self {
        PlainGemm {
            m,
            n,
            x: x.to_vec(),
            a: vec![0.0; m * m],
            b: vec![0.0; m * m],
            y: vec![0.0; m * n],
        }
    }

    fn run(&mut self) {
        let threads = cores();
        let (wide, square) = (Strides::row_major(self.m, self.n), Strides::row_major(self.m, self.m));
        for _ in 0..STEPS {
            gemm(
                1.0,
                (&self.x, wide),
                (&self.x, wide.transposed()),
                0.0,
                (&mut self.a, square),
                Output::Full,
                threads,
            );
            gemm(
                1.0,
                (&self.a, square),
                (&self.a, square),
                0.0,
                (&mut self.b, square),
                Output::Full,
                threads,
            );
            gemm(
                1.0,
                (&self.b, square),
                (&self.x, wide),
                0.0,
                (&mut self.y, wide),
                Output::Full,
                threads,
            );
        }
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn time(f: &mut dyn FnMut()) -> Duration {
    let start = Instant::now();
    f();
    start.elapsed()
}

fn main() {
    let reps: usize = std::env::var("MUON_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    println!("host Newton–Schulz, {STEPS} quintic steps, best of {reps}; GFLOP/s");
    println!(
        "{:>11} | {:>8} | {:>8} | {:>8} | {:>9} | {:>10}",
        "shape", "gemm", "NS f32", "NS bf16", "f32/gemm", "bf16/gemm"
    );
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut random = |len: usize| -> Vec<f32> {
        (0..len)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect()
    };
    let opts = |precision| NsOptions {
        coefficients: CoefficientSet::Quintic,
        steps: STEPS,
        precision,
        eps: muon_opt::config::DEFAULT_NS_EPS,
        symmetric_leaf: muon_opt::config::DEFAULT_SYMMETRIC_LEAF,
        method: NsMethod::Standard,
    };
    for (rows, cols) in SHAPES {
        let (m, n) = (rows.min(cols), rows.max(cols));
        let flops = f64::from(STEPS) * (4.0 * (m * m * n) as f64 + 2.0 * (m * m * m) as f64);
        let input = random(rows * cols);
        let mut output = vec![0.0f32; rows * cols];
        let mut ws = NsWorkspace::new(rows, cols).with_threads(cores());
        let mut plain = PlainGemm::new(&input, m, n);
        let mut ns = |precision| {
            newton_schulz(&input, &mut output, rows, cols, &opts(precision), &mut ws).expect("valid arguments");
        };
        let mut best = [Duration::MAX; 3];
        // One warm-up round, then `reps` interleaved rounds.
        for rep in 0..=reps {
            let t = [
                time(&mut || plain.run()),
                time(&mut || ns(NsPrecision::F32)),
                time(&mut || ns(NsPrecision::Bf16)),
            ];
            if rep > 0 {
                for (b, t) in best.iter_mut().zip(t) {
                    *b = (*b).min(t);
                }
            }
        }
        let gflops = best.map(|t| flops / t.as_secs_f64() / 1e9);
        println!(
            "{:>11} | {:>8.1} | {:>8.1} | {:>8.1} | {:>9.3} | {:>10.3}",
            format!("{rows}x{cols}"),
            gflops[0],
            gflops[1],
            gflops[2],
            gflops[1] / gflops[0],
            gflops[2] / gflops[0]
        );
    }
    let (rows, cols) = std::env::var("MUON_BENCH_GRAM_SHAPE")
        .ok()
        .and_then(|v| {
            let (r, c) = v.split_once('x')?;
            Some((r.parse().ok()?, c.parse().ok()?))
        })
        .unwrap_or((4096usize, 14336usize));
    let input = random(rows * cols);
    let mut output = vec![0.0f32; rows * cols];
    let mut ws = NsWorkspace::new(rows, cols).with_threads(cores());
    let f32_opts = opts(NsPrecision::F32);
    let mut best = [Duration::MAX; 2];
    for _ in 0..reps {
        let t = [
            time(&mut || newton_schulz(&input, &mut output, rows, cols, &f32_opts, &mut ws).expect("valid")),
            time(&mut || newton_schulz_gram(&input, &mut output, rows, cols, &f32_opts, &mut ws).expect("valid")),
        ];
        for (b, t) in best.iter_mut().zip(t) {
            *b = (*b).min(t);
        }
    }
    println!(
        "{rows}x{cols} f32, {STEPS} quintic steps, best of {reps}: standard {:.2} s, gram {:.2} s, standard / gram {:.2}",
        best[0].as_secs_f64(),
        best[1].as_secs_f64(),
        best[0].as_secs_f64() / best[1].as_secs_f64()
    );
}

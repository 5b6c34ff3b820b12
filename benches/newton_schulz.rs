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
//! Then the standard and the Gram iteration (`newton_schulz_gram`) in f32, side by side per
//! shape, best of the same repetitions, interleaved, and standard time / Gram time. The shapes
//! are `MUON_BENCH_GRAM_SHAPES`, a comma-separated list of `ROWSxCOLS` and model names
//! (default `4096x14336`, llama3-8b's down projection):
//! - `llama3-8b`: q, o 4096×4096, k, v 1024×4096, gate, up 14336×4096, down 4096×14336;
//! - `llama3-70b-tp8`: one tensor-parallel rank's shards at TP = 8 (hidden 8192, ffn 28672,
//!   8 kv heads of 128): q 1024×8192, k, v 128×8192, o 8192×1024, gate, up 3584×8192,
//!   down 8192×3584.
//!
//! Each is timed by the wall clock and by the process's CPU time (`CLOCK_PROCESS_CPUTIME_ID`,
//! all threads): on shared cores the wall time counts the waits for a core, the CPU time
//! mostly not. Where `gram_applies` does not hold (aspect below `GRAM_MIN_ASPECT`)
//! `newton_schulz_gram` is the standard iteration: the Gram columns then say so and it is not
//! timed.

use std::time::{Duration, Instant};

use muon_opt::config::{CoefficientSet, NsMethod, NsPrecision};
use muon_opt::numerics::gemm::{Output, Strides, gemm};
use muon_opt::numerics::newton_schulz::{NsOptions, NsWorkspace, gram_applies, newton_schulz, newton_schulz_gram};

const STEPS: u32 = 5;
const SHAPES: [(usize, usize); 3] = [(1024, 1024), (1024, 4096), (2048, 2048)];

/// llama3-8b's Muon matrices, `(name, rows, cols)` as `[out, in]`.
const LLAMA3_8B: [(&str, usize, usize); 4] = [
    ("llama3-8b q, o", 4096, 4096),
    ("llama3-8b k, v", 1024, 4096),
    ("llama3-8b gate, up", 14336, 4096),
    ("llama3-8b down", 4096, 14336),
];

/// llama3-70b's Muon matrices as one rank owns them at TP = 8: q, k, v, gate and up split
/// along the rows (column parallel), o and down along the columns (row parallel).
const LLAMA3_70B_TP8: [(&str, usize, usize); 5] = [
    ("llama3-70b tp8 q", 1024, 8192),
    ("llama3-70b tp8 k, v", 128, 8192),
    ("llama3-70b tp8 o", 8192, 1024),
    ("llama3-70b tp8 gate, up", 3584, 8192),
    ("llama3-70b tp8 down", 8192, 3584),
];

/// The shapes of `MUON_BENCH_GRAM_SHAPES` (see the module documentation).
fn gram_shapes() -> Vec<(String, usize, usize)> {
    let list = std::env::var("MUON_BENCH_GRAM_SHAPES").unwrap_or_else(|_| "4096x14336".to_owned());
    let named = |table: &[(&str, usize, usize)]| -> Vec<(String, usize, usize)> {
        table.iter().map(|&(name, r, c)| (name.to_owned(), r, c)).collect()
    };
    list.split(',')
        .flat_map(|item| match item.trim() {
            "llama3-8b" => named(&LLAMA3_8B),
            "llama3-70b-tp8" => named(&LLAMA3_70B_TP8),
            shape => {
                let parsed = shape
                    .split_once('x')
                    .and_then(|(r, c)| Some((r.parse().ok()?, c.parse().ok()?)));
                let Some((rows, cols)) = parsed else {
                    panic!("MUON_BENCH_GRAM_SHAPES: {shape:?} is neither ROWSxCOLS nor llama3-8b, llama3-70b-tp8");
                };
                vec![(String::new(), rows, cols)]
            }
        })
        .collect()
}

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

/// CPU time of the whole process so far, every thread.
fn process_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant Linux provides.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// `[wall time, process CPU time]` of one call of `f`.
fn time_wall_and_cpu(f: &mut dyn FnMut()) -> [Duration; 2] {
    let cpu = process_cpu_time();
    let wall = time(f);
    [wall, process_cpu_time() - cpu]
}

fn main() {
    let reps: usize = std::env::var("MUON_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let gram_shapes = gram_shapes();
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
        custom: muon_opt::numerics::newton_schulz::CustomCoefficients::NONE,
        steps: STEPS,
        precision,
        eps: muon_opt::config::DEFAULT_NS_EPS,
        symmetric_tile: muon_opt::config::DEFAULT_SYMMETRIC_TILE,
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
    let f32_opts = opts(NsPrecision::F32);
    println!("\nf32, {STEPS} quintic steps, best of {reps}; milliseconds (wall clock, process CPU time)");
    println!(
        "{:>24} | {:>11} | {:>6} | {:>10} | {:>10} | {:>10} | {:>10} | {:>10} | {:>10}",
        "matrix", "shape", "n/m", "std wall", "gram wall", "ratio", "std CPU", "gram CPU", "ratio"
    );
    for (name, rows, cols) in gram_shapes {
        let (m, n) = (rows.min(cols), rows.max(cols));
        let input = random(rows * cols);
        let mut output = vec![0.0f32; rows * cols];
        let mut ws = NsWorkspace::new(rows, cols).with_threads(cores());
        let gram = gram_applies(m, n, &f32_opts);
        // [standard, gram] × [wall, CPU]
        let mut best = [[Duration::MAX; 2]; 2];
        let mut keep_best = |which: usize, t: [Duration; 2]| {
            for (b, t) in best[which].iter_mut().zip(t) {
                *b = (*b).min(t);
            }
        };
        for _ in 0..reps {
            keep_best(
                0,
                time_wall_and_cpu(&mut || {
                    newton_schulz(&input, &mut output, rows, cols, &f32_opts, &mut ws).expect("valid")
                }),
            );
            if gram {
                keep_best(
                    1,
                    time_wall_and_cpu(&mut || {
                        newton_schulz_gram(&input, &mut output, rows, cols, &f32_opts, &mut ws).expect("valid")
                    }),
                );
            }
        }
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let columns: Vec<String> = (0..2)
            .map(|clock| {
                let standard = ms(best[0][clock]);
                let (gram_ms, ratio) = if gram {
                    let g = ms(best[1][clock]);
                    (format!("{g:.1}"), format!("{:.2}", standard / g))
                } else {
                    ("= std".to_owned(), "fallback".to_owned())
                };
                format!("{standard:>10.1} | {gram_ms:>10} | {ratio:>10}")
            })
            .collect();
        println!(
            "{name:>24} | {:>11} | {:>6.2} | {} | {}",
            format!("{rows}x{cols}"),
            n as f64 / m as f64,
            columns[0],
            columns[1]
        );
    }
}

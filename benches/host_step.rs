//! The host backend's optimizer step at dp ∈ {1, 2, 4} on an 8-layer model, against its
//! roofline on this machine.
//!
//! `cargo bench --bench host_step [-- muon|adamw-only]`. The model: an 8192 × 1024 embedding, then 8 layers of a
//! 1024 × 1024 and a 4096 × 1024 matrix and a 1024-element norm (50.3 M params). Two
//! routings: **Muon** (the matrices on Muon, the rest on AdamW) and **AdamW-only** (every
//! param on AdamW). All ranks of a data-parallel group run as threads of this process, so the
//! machine's cores are shared by all ranks, as they are for a framework's CPU job.
//!
//! One step is `zero_grad`, `grad_ready` for every param, `step`, and `wait_params` for every
//! bucket: what the optimizer adds to a training iteration. Best of `MUON_BENCH_REPS`
//! (default 3) steps after one warm-up step.
//!
//! Roofline, from figures measured in the same run. The ranks share the machine, so the
//! roofline is the machine's, over every rank's work:
//! - compute: the Newton–Schulz flops of every owned matrix (with the symmetric products,
//!   `T·(3·m²·n + m³)` per `m × n` matrix, `m ≤ n`) over the GEMM peak, measured as the best
//!   single `2048 × 2048 × 2048` product with all threads;
//! - memory: the bytes the step must move (every rank's [`step_bytes`]) over the measured copy
//!   bandwidth with all threads.
//!
//! Peak RSS is the process's high-water mark during the timed steps (reset through
//! `/proc/self/clear_refs`), over the sum of every rank's planned buffers and optimizer state.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use muon_opt::backend::cuda::CallerStream;
use muon_opt::backend::host::comm::HostGroup;
use muon_opt::comm::{Communicator, Transport};
use muon_opt::config::{Config, Dtype};
use muon_opt::model::{ParamFlags, ParamSpec};
use muon_opt::numerics::gemm::{Output, Strides, gemm};
use muon_opt::optimizer::Optimizer;
use muon_opt::schedule::{StepArgs, StepOverrides};

const LAYERS: usize = 8;
const HIDDEN: u64 = 1024;
const FFN: u64 = 4096;
const VOCAB: u64 = 8192;

const ARGS: StepArgs = StepArgs {
    lr: 0.02,
    weight_decay: 0.01,
    adam_lr: 1e-3,
    adam_weight_decay: 0.01,
    overrides: StepOverrides::NONE,
};

fn model(adamw_only: bool) -> Vec<ParamSpec> {
    let extra = if adamw_only { ParamFlags::NO_MUON } else { 0 };
    let mut specs = vec![ParamSpec {
        flags: ParamFlags(ParamFlags::EMBEDDING_OR_OUTPUT),
        ..ParamSpec::new("embedding", &[VOCAB, HIDDEN], Dtype::F32)
    }];
    for l in 0..LAYERS {
        specs.push(ParamSpec {
            flags: ParamFlags(extra),
            ..ParamSpec::new(format!("layer{l}.proj"), &[HIDDEN, HIDDEN], Dtype::F32)
        });
        specs.push(ParamSpec {
            flags: ParamFlags(extra),
            ..ParamSpec::new(format!("layer{l}.fc"), &[FFN, HIDDEN], Dtype::F32)
        });
        specs.push(ParamSpec::new(format!("layer{l}.norm"), &[HIDDEN], Dtype::F32));
    }
    specs
}

fn reps() -> usize {
    std::env::var("MUON_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1)
}

/// What one timed configuration measured.
struct Measured {
    step: Duration,
    ns_flops_all_ranks: f64,
    bytes_all_ranks: f64,
    planned_bytes_all_ranks: f64,
    peak_rss: f64,
}

/// Newton–Schulz flops of one `rows × cols` matrix with the symmetric products.
fn ns_flops(rows: u64, cols: u64, steps: u32) -> f64 {
    let (m, n) = (rows.min(cols) as f64, rows.max(cols) as f64);
    f64::from(steps) * (3.0 * m * m * n + m * m * m)
}

/// What a rank owns: Newton–Schulz flops (with the symmetric products), Muon elements and
/// AdamW elements.
fn owned_work(opt: &Optimizer, specs: &[ParamSpec]) -> (f64, f64, f64) {
    let plan = opt.plan().expect("finalized");
    let rank = opt.rank();
    let steps = opt.config().muon_num_ns_steps;
    let mut flops = 0.0;
    let mut muon = 0.0;
    for unit in plan.muon_units_of(rank) {
        let (rows, cols) = specs[unit.param as usize].flat_2d();
        flops += ns_flops(rows, cols, steps);
        muon += unit.range.len() as f64;
    }
    let adamw: u64 = plan.adamw_shards_of(rank).iter().map(|s| s.range.len()).sum();
    (flops, muon, adamw as f64)
}

/// The bytes rank `rank` of `dp` adds to the machine's traffic at the least. The gradient
/// collective reads every rank's gradient buffer and writes the sums once: `G` per rank plus
/// `G / dp`. The param collective reads the new values once and writes every other rank's
/// copy: `P` per rank. Each owned element is updated once, and the model's params are f32, so
/// each is its own master: AdamW reads grad, param and two moments and writes param and two
/// moments (7 × 4 bytes); Muon reads grad, param and momentum, writes param and momentum, and
/// moves the Newton–Schulz input in and the result out (7 × 4 bytes).
fn step_bytes(opt: &Optimizer, muon: f64, adamw: f64) -> f64 {
    let report = &opt.plan().expect("finalized").report;
    let dp = opt.dp() as f64;
    let (grads, params) = (report.grad_buffer_bytes as f64, report.param_buffer_bytes as f64);
    grads * (1.0 + 1.0 / dp) + params + (muon + adamw) * 28.0
}

fn run(dp: usize, adamw_only: bool) -> Measured {
    let cfg = Config::default();
    let specs = model(adamw_only);
    let comms = HostGroup::new(dp, Duration::from_secs(600));
    let barrier = Barrier::new(dp);
    let reps = reps();
    let results: Vec<(Duration, f64, f64, f64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let (cfg, specs, barrier) = (cfg.clone(), specs.clone(), &barrier);
                scope.spawn(move || {
                    let comm = Communicator::new(Transport::Host(comm));
                    let mut opt =
                        Optimizer::new(cfg, comm.claim().expect("fresh"), CallerStream::NULL).expect("optimizer");
                    for spec in &specs {
                        opt.add_param(spec.clone(), None).expect("add_param");
                    }
                    opt.finalize().expect("finalize");
                    let ids: Vec<u32> = (0..specs.len() as u32).collect();
                    let buckets = opt.plan().expect("plan").buckets.len() as u32;
                    let step = |opt: &mut Optimizer| {
                        opt.zero_grad().expect("zero_grad");
                        for &id in ids.iter().rev() {
                            opt.grad_ready(id).expect("grad_ready");
                        }
                        opt.step(&ARGS).expect("step");
                        for b in 0..buckets {
                            opt.wait_params(b).expect("wait_params");
                        }
                    };
                    step(&mut opt);
                    if barrier.wait().is_leader() {
                        std::fs::write("/proc/self/clear_refs", "5").ok();
                    }
                    let mut best = Duration::MAX;
                    for _ in 0..reps {
                        barrier.wait();
                        let t = Instant::now();
                        step(&mut opt);
                        barrier.wait();
                        best = best.min(t.elapsed());
                    }
                    let (flops, muon, adamw) = owned_work(&opt, &specs);
                    let r = &opt.plan().expect("plan").report;
                    let planned = (r.param_buffer_bytes
                        + r.grad_buffer_bytes
                        + r.optimizer_state_bytes.per_rank[opt.rank()]) as f64;
                    (best, flops, step_bytes(&opt, muon, adamw), planned)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank")).collect()
    });
    Measured {
        step: results.iter().map(|r| r.0).max().unwrap_or_default(),
        ns_flops_all_ranks: results.iter().map(|r| r.1).sum(),
        bytes_all_ranks: results.iter().map(|r| r.2).sum(),
        planned_bytes_all_ranks: results.iter().map(|r| r.3).sum(),
        peak_rss: peak_rss_bytes(),
    }
}

/// `VmHWM` of this process, in bytes.
fn peak_rss_bytes() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb * 1024.0)
}

/// Best GEMM throughput: one `2048³` product, all threads, best of 7 (the roofline divides by
/// it: a slow repetition must not lower it).
fn gemm_peak_flops() -> f64 {
    let n = 2048;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let a = vec![0.5f32; n * n];
    let mut c = vec![0.0f32; n * n];
    let mut best = f64::MAX;
    for _ in 0..7 {
        let t = Instant::now();
        let square = Strides::row_major(n, n);
        gemm(
            1.0,
            (&a, square),
            (&a, square),
            0.0,
            (&mut c, square),
            Output::Full,
            threads,
        );
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * (n * n * n) as f64 / best
}

/// Copy bandwidth (bytes read + written per second), all threads, over a 256 MiB buffer.
fn copy_bandwidth() -> f64 {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let len = 64 << 20;
    let src = vec![1.0f32; len];
    let mut dst = vec![0.0f32; len];
    let chunk = len.div_ceil(threads);
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        std::thread::scope(|s| {
            for (d, s_) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
                s.spawn(move || d.copy_from_slice(s_));
            }
        });
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * (len * 4) as f64 / best
}

fn main() {
    let peak = gemm_peak_flops();
    let bandwidth = copy_bandwidth();
    println!(
        "GEMM peak {:.1} GFLOP/s, copy bandwidth {:.1} GB/s (both all threads, this run)",
        peak / 1e9,
        bandwidth / 1e9
    );
    println!(
        "{:<11} {:>3} {:>10} {:>12} {:>10} {:>12} {:>10}",
        "routing", "dp", "step ms", "roofline ms", "/roofline", "vs dp=1", "RSS/plan"
    );
    let only: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    for adamw_only in [false, true] {
        let routing = if adamw_only { "adamw-only" } else { "muon" };
        if !only.is_empty() && !only.iter().any(|o| o == routing) {
            continue;
        }
        let mut dp1 = None;
        for dp in [1usize, 2, 4] {
            let m = run(dp, adamw_only);
            let roofline = m.ns_flops_all_ranks / peak + m.bytes_all_ranks / bandwidth;
            let step = m.step.as_secs_f64();
            let base = *dp1.get_or_insert(step);
            println!(
                "{:<11} {dp:>3} {:>10.1} {:>12.1} {:>10.2} {:>12.2} {:>10.2}",
                routing,
                step * 1e3,
                roofline * 1e3,
                step / roofline,
                step / base,
                m.peak_rss / m.planned_bytes_all_ranks
            );
        }
    }
}

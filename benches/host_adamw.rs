//! The host backend's AdamW step beside the loop a C trainer writes for itself (llm.c's
//! `train_gpt2.c` updates its params this way), on the same f32 model, side by side in one run.
//!
//! `cargo bench --bench host_adamw`. The model: a GPT-2-style stack of f32 params, 7.1 M in
//! all (an 8192 × 256 token embedding, a 1024 × 256 position embedding, 6 layers of norms,
//! biases and the 768 × 256, 256 × 256, 1024 × 256 and 256 × 1024 matrices), every one on
//! AdamW, f32 gradients, dp 1, the default config (gradient clipping at 1.0).
//!
//! Both get the same gradients (uniform in ±1e-3, written between the timed parts as a backward
//! would). One step of the library is `zero_grad`, `grad_ready` for every param, `step` and
//! `wait_params` for every bucket; of the loop, zeroing the gradients and one pass over every
//! element: `m = β1·m + (1−β1)·g`, `v = β2·v + (1−β2)·g²`, `w −= lr·(m̂/(√v̂ + ε) + wd·w)`.
//! The library's step does more: the exact global gradient norm (the clip and the skip of a
//! non-finite gradient need it before any element is updated), so one more read of the
//! gradients. Best of `MUON_BENCH_REPS` (default 5) steps after one warm-up step; the
//! library's time is split by its step profile.

use std::time::{Duration, Instant};

use muon_opt::backend::cuda::CallerStream;
use muon_opt::backend::host::comm::HostGroup;
use muon_opt::comm::{Communicator, Transport};
use muon_opt::config::{Config, Dtype};
use muon_opt::model::{ParamFlags, ParamSpec};
use muon_opt::optimizer::Optimizer;
use muon_opt::rng::SplitMix64;
use muon_opt::schedule::{StepArgs, StepOverrides};

const VOCAB: u64 = 8192;
const CONTEXT: u64 = 1024;
const WIDTH: u64 = 256;
const LAYERS: usize = 6;

const ARGS: StepArgs = StepArgs {
    lr: 0.0,
    weight_decay: 0.0,
    adam_lr: 3e-4,
    adam_weight_decay: 0.1,
    overrides: StepOverrides::NONE,
};

fn model() -> Vec<ParamSpec> {
    let tensor = |name: String, shape: &[u64]| ParamSpec {
        flags: ParamFlags(ParamFlags::NO_MUON),
        ..ParamSpec::new(name, shape, Dtype::F32)
    };
    let mut specs = vec![
        ParamSpec {
            flags: ParamFlags(ParamFlags::EMBEDDING_OR_OUTPUT),
            ..ParamSpec::new("wte", &[VOCAB, WIDTH], Dtype::F32)
        },
        tensor("wpe".into(), &[CONTEXT, WIDTH]),
    ];
    for l in 0..LAYERS {
        for (name, shape) in [
            ("ln1.weight", vec![WIDTH]),
            ("ln1.bias", vec![WIDTH]),
            ("attn.qkv.weight", vec![3 * WIDTH, WIDTH]),
            ("attn.qkv.bias", vec![3 * WIDTH]),
            ("attn.proj.weight", vec![WIDTH, WIDTH]),
            ("attn.proj.bias", vec![WIDTH]),
            ("ln2.weight", vec![WIDTH]),
            ("ln2.bias", vec![WIDTH]),
            ("mlp.fc.weight", vec![4 * WIDTH, WIDTH]),
            ("mlp.fc.bias", vec![4 * WIDTH]),
            ("mlp.proj.weight", vec![WIDTH, 4 * WIDTH]),
            ("mlp.proj.bias", vec![WIDTH]),
        ] {
            specs.push(tensor(format!("h{l}.{name}"), &shape));
        }
    }
    specs.push(tensor("ln_f.weight".into(), &[WIDTH]));
    specs.push(tensor("ln_f.bias".into(), &[WIDTH]));
    specs
}

fn reps() -> usize {
    std::env::var("MUON_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
        .max(1)
}

/// One gradient per element, uniform in ±1e-3.
fn gradients(numel: usize) -> Vec<f32> {
    let mut rng = SplitMix64::new(1);
    (0..numel).map(|_| rng.uniform() * 1e-3).collect()
}

/// The library's best step, its profile's split of that step's time (norm, AdamW, casts, ms),
/// and its bytes per param (buffers and optimizer state).
fn library_step(specs: &[ParamSpec], gradients: &[f32]) -> (Duration, [f64; 3], f64) {
    let comm = HostGroup::new(1, Duration::from_secs(60)).pop().expect("one rank");
    let comm = Communicator::new(Transport::Host(comm));
    let mut opt =
        Optimizer::new(Config::default(), comm.claim().expect("fresh"), CallerStream::NULL).expect("optimizer");
    for spec in specs {
        opt.add_param(spec.clone(), None).expect("add_param");
    }
    opt.finalize().expect("finalize");
    let buckets = opt.plan().expect("plan").buckets.len() as u32;
    let report = &opt.plan().expect("plan").report;
    let bytes = (report.param_buffer_bytes + report.grad_buffer_bytes + report.optimizer_state_bytes.max) as f64;
    let step = |opt: &mut Optimizer| {
        let t = Instant::now();
        opt.zero_grad().expect("zero_grad");
        let zeroing = t.elapsed();
        let mut offset = 0;
        for (p, spec) in specs.iter().enumerate() {
            let numel = spec.numel() as usize;
            let grad = opt.runtime().expect("runtime").address(p, true).cast::<f32>();
            // SAFETY: param p's gradient is `numel` f32 of the host grad buffer, which nothing
            // else touches between zero_grad and grad_ready.
            unsafe { std::slice::from_raw_parts_mut(grad, numel) }.copy_from_slice(&gradients[offset..offset + numel]);
            offset += numel;
        }
        let t = Instant::now();
        for id in (0..specs.len() as u32).rev() {
            opt.grad_ready(id).expect("grad_ready");
        }
        opt.step(&ARGS).expect("step");
        for b in 0..buckets {
            opt.wait_params(b).expect("wait_params");
        }
        zeroing + t.elapsed()
    };
    step(&mut opt);
    let (mut best, mut split) = (Duration::MAX, [0.0; 3]);
    for _ in 0..reps() {
        let before = opt.runtime().expect("runtime").profile();
        let elapsed = step(&mut opt);
        let after = opt.runtime().expect("runtime").profile();
        if elapsed < best {
            best = elapsed;
            split = [
                after.grad_norm - before.grad_norm,
                after.adamw - before.adamw,
                after.casts - before.casts,
            ]
            .map(|s| s * 1e3);
        }
    }
    (best, split, bytes)
}

/// The C trainer's own update: zeroed gradients, then one fused pass per element.
fn fused_loop(gradients: &[f32]) -> Duration {
    let numel = gradients.len();
    let (beta1, beta2, eps) = (0.9f32, 0.999f32, 1e-8f32);
    let (lr, wd) = (ARGS.adam_lr, ARGS.adam_weight_decay);
    let mut params = vec![0.01f32; numel];
    let mut grads = vec![0.0f32; numel];
    let mut m = vec![0.0f32; numel];
    let mut v = vec![0.0f32; numel];
    let mut best = Duration::MAX;
    for t in 1..=reps() as i32 + 1 {
        let zeroing = Instant::now();
        grads.fill(0.0);
        let zeroing = zeroing.elapsed();
        grads.copy_from_slice(gradients);
        let start = Instant::now();
        let (bc1, bc2) = (1.0 - beta1.powi(t), 1.0 - beta2.powi(t));
        for (((w, g), m), v) in params.iter_mut().zip(&grads).zip(m.iter_mut()).zip(v.iter_mut()) {
            *m = beta1 * *m + (1.0 - beta1) * g;
            *v = beta2 * *v + (1.0 - beta2) * g * g;
            let (m_hat, v_hat) = (*m / bc1, *v / bc2);
            *w -= lr * (m_hat / (v_hat.sqrt() + eps) + wd * *w);
        }
        if t > 1 {
            best = best.min(zeroing + start.elapsed());
        }
    }
    std::hint::black_box(&params);
    best
}

fn main() {
    let specs = model();
    let numel: u64 = specs.iter().map(ParamSpec::numel).sum();
    let gradients = gradients(numel as usize);
    let (library, [norm, adamw, casts], bytes) = library_step(&specs, &gradients);
    let fused = fused_loop(&gradients);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{:.2} M f32 params, every one on AdamW, dp 1 (best of {})",
        numel as f64 / 1e6,
        reps()
    );
    println!("{:<26} {:>9} {:>12}", "", "step ms", "bytes/param");
    println!(
        "{:<26} {:>9.2} {:>12.1}",
        "libmuon_opt step",
        ms(library),
        bytes / numel as f64
    );
    println!("{:<26} {:>9.2}", "  of which exact norm", norm);
    println!("{:<26} {:>9.2}", "  of which AdamW", adamw);
    println!("{:<26} {:>9.2}", "  of which casts", casts);
    println!("{:<26} {:>9.2} {:>12.1}", "C trainer's fused loop", ms(fused), 16.0);
    println!("library / loop: {:.2}", ms(library) / ms(fused));
}

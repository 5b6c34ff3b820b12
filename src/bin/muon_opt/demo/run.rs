//! The ranks: one thread and one [`Optimizer`] each on a host group, driven through the public
//! API exactly as a framework would: register, finalize, then per step `zero_grad`,
//! `wait_params` before a bucket's params are read, `grad_ready` as backward produces each
//! gradient, and `step`.

use std::panic::resume_unwind;
use std::time::{Duration, Instant};

use muon_opt::backend::cuda::CallerStream;
use muon_opt::backend::host::comm::{HostComm, HostGroup};
use muon_opt::bail;
use muon_opt::comm::{Communicator, Transport};
use muon_opt::config::Dtype;
use muon_opt::error::{ErrorKind, Result};
use muon_opt::init_data::InitData;
use muon_opt::model::ParamSpec;
use muon_opt::optimizer::Optimizer;
use muon_opt::plan::Plan;
use muon_opt::rng::SplitMix64;

use super::model::{Batch, Dims, Weights, backward, forward, loss};
use super::{DemoConfig, DemoResult, ParamRoute, Progress, RunResult, Timings, Variant};

/// Examples in the held-out set.
const EVAL_EXAMPLES: usize = 1024;
/// Seed offsets of the teacher and of the held-out set.
const TEACHER_SEED: u64 = 0x7EAC_4E12;
const EVAL_SEED: u64 = 0xE7A1;
/// The teacher's matrix gain (larger: more nonlinear) and the student's output-head gain.
const TEACHER_GAIN: f32 = 1.5;
const STUDENT_HEAD_GAIN: f32 = 0.1;

/// Trains the model twice (Muon, then AdamW only) on the same data; `progress` is called by
/// rank 0 after every step.
pub fn run_demo(cfg: &DemoConfig, progress: &(dyn Fn(&Progress) + Sync)) -> Result<DemoResult> {
    let muon = train(cfg, Variant::Muon, progress)?;
    let adamw = train(cfg, Variant::AdamwOnly, progress)?;
    Ok(DemoResult {
        dims: cfg.dims,
        dp: cfg.dp,
        steps: cfg.steps,
        batch_per_rank: cfg.batch,
        lr: cfg.args.lr,
        weight_decay: cfg.args.weight_decay,
        adam_lr: cfg.args.adam_lr,
        adam_weight_decay: cfg.args.adam_weight_decay,
        optimizer: cfg.optimizer.clone(),
        muon,
        adamw,
    })
}

/// One run: `cfg.dp` ranks on threads, `cfg.steps` steps.
pub fn train(cfg: &DemoConfig, variant: Variant, progress: &(dyn Fn(&Progress) + Sync)) -> Result<RunResult> {
    if cfg.dp == 0 || cfg.steps == 0 || cfg.batch == 0 {
        bail!(
            OutOfRange,
            "demo: dp {}, steps {} and batch {} must all be >= 1",
            cfg.dp,
            cfg.steps,
            cfg.batch
        );
    }
    if cfg.optimizer.grad_dtype != Dtype::F32 {
        bail!(
            Unsupported,
            "demo: grad_dtype must be f32 (the demo writes f32 gradients)"
        );
    }
    let task = Task {
        teacher: cfg.dims.init(cfg.seed ^ TEACHER_SEED, TEACHER_GAIN, 1.0),
        init: cfg.dims.init(cfg.seed, 1.0, STUDENT_HEAD_GAIN),
        specs: cfg.dims.specs(variant == Variant::AdamwOnly),
    };
    let timeout = Duration::from_millis(u64::from(cfg.optimizer.collective_timeout_ms));
    let task = &task;
    let ranks: Vec<Result<RankOutput>> = std::thread::scope(|scope| {
        let handles: Vec<_> = HostGroup::new(cfg.dp, timeout)
            .into_iter()
            .map(|comm| scope.spawn(move || train_rank(cfg, variant, task, comm, progress)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|panic| resume_unwind(panic)))
            .collect()
    });
    let ranks = first_cause(ranks)?;
    let final_params: Vec<&Weights> = ranks.iter().map(|r| &r.final_params).collect();
    check_ranks_agree(&final_params, &task.specs)?;
    let losses = (0..cfg.steps)
        .map(|s| ranks.iter().map(|r| r.losses[s]).sum::<f64>() / ranks.len() as f64)
        .collect();
    let rank0 = ranks.into_iter().next().expect("dp >= 1");
    Ok(RunResult {
        variant,
        losses,
        eval_loss_initial: rank0.eval_loss_initial,
        eval_loss_final: rank0.eval_loss_final,
        grad_norms: rank0.grad_norms,
        routes: rank0.routes,
        timings: rank0.timings,
        plan: rank0.plan,
    })
}

/// Every rank must end with rank 0's params, bit for bit (the optimizer's guarantee, checked
/// as a framework would); else an `Internal` error naming the first rank and param that differ.
fn check_ranks_agree(final_params: &[&Weights], specs: &[ParamSpec]) -> Result<()> {
    let bits = |values: &[f32]| values.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
    for (rank, params) in final_params.iter().enumerate().skip(1) {
        for (p, spec) in specs.iter().enumerate() {
            if bits(&params[p]) != bits(&final_params[0][p]) {
                bail!(
                    Internal,
                    "demo: rank {rank} ends with other values of '{}' than rank 0",
                    spec.name
                );
            }
        }
    }
    Ok(())
}

/// What every rank starts from: the teacher, the student's initial weights, the param list.
struct Task {
    teacher: Weights,
    init: Weights,
    specs: Vec<ParamSpec>,
}

struct RankOutput {
    losses: Vec<f64>,
    grad_norms: Vec<f64>,
    eval_loss_initial: f64,
    eval_loss_final: f64,
    routes: Vec<ParamRoute>,
    timings: Timings,
    plan: Plan,
    final_params: Weights,
}

/// Every rank's output, or the error that caused the failure: a rank's own error rather than
/// the timeouts and broken-group errors its peers saw as a consequence.
fn first_cause(ranks: Vec<Result<RankOutput>>) -> Result<Vec<RankOutput>> {
    let consequence = |kind: ErrorKind| matches!(kind, ErrorKind::CommTimeout | ErrorKind::CommBroken);
    let errors: Vec<_> = ranks.iter().filter_map(|r| r.as_ref().err()).collect();
    if let Some(error) = errors.iter().find(|e| !consequence(e.kind)).or(errors.first()) {
        return Err((*error).clone());
    }
    Ok(ranks.into_iter().flatten().collect())
}

/// The seed of rank `rank`'s batch at step `step`.
fn batch_seed(seed: u64, step: usize, rank: usize) -> u64 {
    SplitMix64::new(seed ^ ((step as u64) << 32) ^ rank as u64).next_u64()
}

/// Adds the time `f` takes to `total`.
fn timed<T>(total: &mut f64, f: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = f();
    *total += started.elapsed().as_secs_f64();
    out
}

/// Reads every param in forward order, waiting for each bucket's params before the first
/// read from it; the time of `wait_params` goes to `timings.wait_params`.
fn read_params(opt: &mut Optimizer, buckets: &[u32], timings: &mut Timings) -> Result<Weights> {
    let mut waited = vec![false; opt.plan()?.buckets.len()];
    let mut weights = Vec::with_capacity(buckets.len());
    for (p, &bucket) in buckets.iter().enumerate() {
        if !std::mem::replace(&mut waited[bucket as usize], true) {
            timed(&mut timings.wait_params, || opt.wait_params(bucket))?;
        }
        weights.push(opt.running()?.param_values(p)?);
    }
    Ok(weights)
}

/// Writes `grad` into param `p`'s slot of the grad buffer.
fn write_grad(opt: &mut Optimizer, p: usize, grad: &[f32]) -> Result<()> {
    let numel = opt.plan()?.params[p].numel;
    if grad.len() as u64 != numel {
        bail!(
            Internal,
            "demo: gradient of param {p} has {} values for {numel} elements",
            grad.len()
        );
    }
    let ptr = opt.running()?.address(p, true).cast::<f32>();
    // SAFETY: with grad_dtype f32 (checked in `train`) the grad view of param p holds `numel`
    // f32 values; the host backend's compute stream is this thread, and no collective reads
    // this param's gradient before its `grad_ready`.
    unsafe { std::slice::from_raw_parts_mut(ptr, grad.len()) }.copy_from_slice(grad);
    Ok(())
}

fn train_rank(
    cfg: &DemoConfig,
    variant: Variant,
    task: &Task,
    comm: HostComm,
    progress: &(dyn Fn(&Progress) + Sync),
) -> Result<RankOutput> {
    let rank = comm.rank();
    let dims: &Dims = &cfg.dims;
    let mut opt = Optimizer::new(
        cfg.optimizer.clone(),
        Communicator::new(Transport::Host(comm)).claim()?,
        CallerStream::NULL,
    )?;
    for (spec, values) in task.specs.iter().zip(&task.init) {
        opt.add_param(spec.clone(), Some(InitData::from_f32(values)))?;
    }
    opt.finalize()?;
    let routes = task
        .specs
        .iter()
        .enumerate()
        .map(|(id, spec)| {
            Ok(ParamRoute {
                id: id as u32,
                name: spec.name.clone(),
                shape: spec.shape.clone(),
                route: opt.route(id as u32)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let buckets: Vec<u32> = opt.plan()?.params.iter().map(|p| p.bucket).collect();
    let eval = Batch::sample(dims, &task.teacher, cfg.seed ^ EVAL_SEED, EVAL_EXAMPLES);
    let eval_loss = |w: &Weights| loss(&forward(dims, w, &eval.tokens).y, &eval.targets);

    let mut timings = Timings::default();
    let mut losses = Vec::with_capacity(cfg.steps);
    let mut grad_norms = Vec::with_capacity(cfg.steps);
    let eval_loss_initial = eval_loss(&task.init);
    let started = Instant::now();
    for step in 0..cfg.steps {
        let batch = Batch::sample(dims, &task.teacher, batch_seed(cfg.seed, step, rank), cfg.batch);
        timed(&mut timings.zero_grad, || opt.zero_grad())?;
        let pass = Instant::now();
        let in_api = timings.wait_params + timings.grad_ready;
        let weights = read_params(&mut opt, &buckets, &mut timings)?;
        let acts = forward(dims, &weights, &batch.tokens);
        losses.push(loss(&acts.y, &batch.targets));
        backward(dims, &weights, &batch.tokens, &acts, &batch.targets, |p, grad| {
            write_grad(&mut opt, p, grad)?;
            timed(&mut timings.grad_ready, || opt.grad_ready(p as u32))
        })?;
        let in_api = timings.wait_params + timings.grad_ready - in_api;
        timings.forward_backward += pass.elapsed().as_secs_f64() - in_api;
        let info = timed(&mut timings.step, || opt.step(&cfg.args))?;
        grad_norms.push(info.grad_norm);
        if rank == 0 {
            progress(&Progress {
                variant,
                step: step + 1,
                steps: cfg.steps,
                loss: losses[step],
            });
        }
    }
    let final_params = read_params(&mut opt, &buckets, &mut timings)?;
    timings.total = started.elapsed().as_secs_f64();
    timings.step_parts = opt.running()?.profile();
    Ok(RankOutput {
        losses,
        grad_norms,
        eval_loss_initial,
        eval_loss_final: eval_loss(&final_params),
        routes,
        timings,
        plan: opt.plan()?.clone(),
        final_params,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_agree_only_bit_for_bit() {
        let specs = DemoConfig::default().dims.specs(false);
        let rank0: Weights = specs.iter().map(|s| vec![0.5; s.numel() as usize]).collect();
        let mut rank1 = rank0.clone();
        assert!(check_ranks_agree(&[&rank0, &rank1], &specs).is_ok());
        rank1[3][7] = f32::from_bits(0.5f32.to_bits() + 1);
        let err = check_ranks_agree(&[&rank0, &rank1], &specs).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Internal);
        assert!(
            err.message.contains("rank 1") && err.message.contains(&specs[3].name),
            "{err}"
        );
    }
}

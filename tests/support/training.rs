//! Multi-rank training for the runtime tests: ranks on threads over a host group, a small
//! model with every kind of param, deterministic per-rank gradients that depend on the params
//! each rank sees (so a missing param sync changes the result).

use std::time::Duration;

use muon_opt::config::{Config, Dtype};
use muon_opt::init_data::InitData;
use muon_opt::model::{ParamFlags, ParamSpec};
use muon_opt::optimizer::Optimizer;
use muon_opt::schedule::{OwnedState, StepArgs, StepOverrides};

use super::ranks::{on_ranks, optimizers};
use super::rng::noise;

/// The test model: embedding, fused QKV, an expert stack, plain matrices, biases, a norm.
pub fn model() -> Vec<ParamSpec> {
    layered_model(2)
}

/// The test model with `layers` layers.
pub fn layered_model(layers: usize) -> Vec<ParamSpec> {
    let mut params = Vec::new();
    let mut emb = ParamSpec::new("embedding.weight", &[50, 32], Dtype::Bf16);
    emb.flags = ParamFlags(ParamFlags::EMBEDDING_OR_OUTPUT);
    params.push(emb);
    for layer in 0..layers {
        let mut qkv = ParamSpec::new(format!("layers.{layer}.qkv.weight"), &[96, 32], Dtype::Bf16);
        qkv.split_sizes = vec![32, 32, 32];
        params.push(qkv);
        params.push(ParamSpec::new(
            format!("layers.{layer}.proj.weight"),
            &[32, 32],
            Dtype::Bf16,
        ));
        params.push(ParamSpec::new(
            format!("layers.{layer}.norm.weight"),
            &[32],
            Dtype::Bf16,
        ));
        let mut experts = ParamSpec::new(format!("layers.{layer}.experts.fc1"), &[4, 48, 32], Dtype::Bf16);
        experts.flags = ParamFlags(ParamFlags::EXPERT_STACK);
        params.push(experts);
        let mut fc2 = ParamSpec::new(format!("layers.{layer}.fc2.weight"), &[32, 64], Dtype::Bf16);
        fc2.lr_scale = 0.5;
        params.push(fc2);
        let mut bias = ParamSpec::new(format!("layers.{layer}.fc2.bias"), &[32], Dtype::Bf16);
        bias.flags = ParamFlags(ParamFlags::NO_WEIGHT_DECAY);
        params.push(bias);
    }
    let mut out = ParamSpec::new("output.weight", &[50, 32], Dtype::Bf16);
    out.flags = ParamFlags(ParamFlags::EMBEDDING_OR_OUTPUT);
    params.push(out);
    params
}

/// Bits of every value (equality is then bitwise, NaN included).
pub fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

pub fn init_values(p: usize, numel: u64) -> Vec<f32> {
    (0..numel).map(|i| 0.1 * noise(1_000_000 * p as u64 + i)).collect()
}

/// Rank `rank`'s gradient of param `p` at `step`, from the params it sees.
pub fn rank_grad(step: u64, rank: usize, p: usize, params: &[f32]) -> Vec<f32> {
    params
        .iter()
        .enumerate()
        .map(|(i, &w)| noise((step << 40) ^ ((rank as u64) << 32) ^ ((p as u64) << 20) ^ i as u64) * 0.01 + 0.05 * w)
        .collect()
}

pub const ARGS: StepArgs = StepArgs {
    lr: 0.02,
    weight_decay: 0.1,
    adam_lr: 0.003,
    adam_weight_decay: 0.01,
    overrides: StepOverrides::NONE,
};

/// Everything observable after a step: every rank's params and the assembled owned state.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Per rank, per param: the param values that rank holds.
    pub params: Vec<Vec<Vec<f32>>>,
    /// Per param: master, then each moment, assembled in global coordinates.
    pub state: Vec<Vec<Vec<f32>>>,
}

pub fn assemble(specs: &[ParamSpec], owned: Vec<Vec<OwnedState>>) -> Vec<Vec<Vec<f32>>> {
    let mut state: Vec<Vec<Vec<f32>>> = specs.iter().map(|_| Vec::new()).collect();
    for pieces in owned {
        for piece in pieces {
            let n = specs[piece.param as usize].numel() as usize;
            let slot = &mut state[piece.param as usize];
            if slot.is_empty() {
                *slot = vec![vec![f32::NAN; n]; 1 + piece.moments.len()];
            }
            let r = piece.range.start as usize..piece.range.end as usize;
            slot[0][r.clone()].copy_from_slice(&piece.master);
            for (k, m) in piece.moments.iter().enumerate() {
                slot[1 + k][r.clone()].copy_from_slice(m);
            }
        }
    }
    state
}

/// How a rank produces its gradient for a step: per rank by default; the dp=1 reference
/// sums the per-rank gradients of `emulated_dp` ranks in rank order. `grad_ready`: whether
/// the rank announces each gradient (else the step reduces every bucket itself).
#[derive(Debug, Clone, Copy)]
pub struct Data {
    pub emulated_dp: usize,
    pub grad_ready: bool,
}

impl Data {
    /// Gradients of `emulated_dp` ranks, each announced with grad_ready.
    pub fn ranks(emulated_dp: usize) -> Self {
        Data {
            emulated_dp,
            grad_ready: true,
        }
    }
}

/// Per step: every param as this rank sees it, and this rank's owned state.
type RankHistory = Vec<(Vec<Vec<f32>>, Vec<OwnedState>)>;

/// Trains `steps` steps at `dp` ranks and returns a snapshot after every step.
pub fn train(cfg: &Config, dp: usize, data: Data, steps: u64) -> Vec<Snapshot> {
    train_model(&model(), cfg, dp, data, steps)
}

/// [`train`] on the params `specs`.
pub fn train_model(specs: &[ParamSpec], cfg: &Config, dp: usize, data: Data, steps: u64) -> Vec<Snapshot> {
    train_with(specs, cfg, dp, data, steps, &|_| ARGS)
}

/// [`train_model`] stepping with `args(step)` at each step (0-based).
pub fn train_with(
    specs: &[ParamSpec],
    cfg: &Config,
    dp: usize,
    data: Data,
    steps: u64,
    args: &(dyn Fn(u64) -> StepArgs + Sync),
) -> Vec<Snapshot> {
    let opts = optimizers(cfg, dp, Duration::from_secs(20));
    let per_rank: Vec<RankHistory> = on_ranks(opts, |rank, mut opt| {
        run_rank(&mut opt, specs, rank, (dp, data), steps, args)
    });
    (0..steps as usize)
        .map(|s| Snapshot {
            params: per_rank.iter().map(|r| r[s].0.clone()).collect(),
            state: assemble(specs, per_rank.iter().map(|r| r[s].1.clone()).collect()),
        })
        .collect()
}

fn run_rank(
    opt: &mut Optimizer,
    specs: &[ParamSpec],
    rank: usize,
    (dp, data): (usize, Data),
    steps: u64,
    args: &(dyn Fn(u64) -> StepArgs + Sync),
) -> RankHistory {
    for (p, spec) in specs.iter().enumerate() {
        opt.add_param(spec.clone(), Some(InitData::from_f32(&init_values(p, spec.numel()))))
            .unwrap();
    }
    opt.finalize().unwrap();
    let mut out = Vec::new();
    let order = muon_opt::plan::forward_order(&opt.plan().unwrap().buckets);
    for step in 0..steps {
        opt.zero_grad().unwrap();
        let grads = |opt: &mut Optimizer, p: usize| {
            write_grad(opt, step, rank, p, (dp, data));
            if data.grad_ready {
                opt.grad_ready(p as u32).unwrap();
            }
        };
        let params = if opt.config().sharded() {
            sharded_iteration(opt, &order, &mut |opt, p| grads(opt, p));
            let info = opt.step(&args(step)).unwrap();
            assert!(!info.skipped);
            sharded_params(opt, &order, specs.len())
        } else {
            for &b in &order {
                opt.wait_params(b as u32).unwrap();
            }
            for p in (0..specs.len()).rev() {
                grads(opt, p);
            }
            let info = opt.step(&args(step)).unwrap();
            assert!(!info.skipped);
            for &b in &order {
                opt.wait_params(b as u32).unwrap();
            }
            (0..specs.len())
                .map(|p| opt.running().unwrap().param_values(p).unwrap())
                .collect()
        };
        out.push((params, opt.running().unwrap().owned_state().unwrap()));
    }
    out
}

/// Writes rank `rank`'s gradient of param `p` at `step` (from the values of p it sees) into
/// p's gradient storage.
fn write_grad(opt: &mut Optimizer, step: u64, rank: usize, p: usize, (dp, data): (usize, Data)) {
    let seen = opt.running().unwrap().param_values(p).unwrap();
    let grad = if dp == 1 && data.emulated_dp > 1 {
        // The ranks' gradients are summed in rank order; the optimizer scales the
        // sum by clip_coef / dp in one multiply, which is this multiply at clip 1.
        let scale = 1.0 / data.emulated_dp as f32;
        let mut sum = vec![0.0f32; seen.len()];
        for r in 0..data.emulated_dp {
            for (s, g) in sum.iter_mut().zip(rank_grad(step, r, p, &seen)) {
                *s += g;
            }
        }
        sum.iter().map(|s| s * scale).collect()
    } else {
        rank_grad(step, rank, p, &seen)
    };
    let ptr = opt.running().unwrap().address(p, true).cast::<f32>();
    // SAFETY: the grad view of param p holds numel f32 values (grad_dtype f32).
    unsafe { std::slice::from_raw_parts_mut(ptr, grad.len()) }.copy_from_slice(&grad);
}

/// One forward and backward with sharded params, as a framework with FSDP-style hooks runs it:
/// the forward gathers the buckets in `order` (`param_prefetch_buckets` ahead of the one in
/// use) and releases each after its use when `reshard_after_forward`; the backward gathers
/// them again in reverse order (those still gathered are left), calls `grads(opt, p)` for
/// each param of a bucket and releases it.
pub fn sharded_iteration(opt: &mut Optimizer, order: &[usize], grads: &mut dyn FnMut(&mut Optimizer, usize)) {
    let ahead = opt.config().param_prefetch_buckets as usize;
    let reshard = opt.config().reshard_after_forward;
    for (i, &b) in order.iter().enumerate() {
        for &next in order.iter().skip(i + 1).take(ahead) {
            opt.gather_params(next as u32).unwrap();
        }
        opt.wait_params(b as u32).unwrap();
        if reshard {
            opt.release_params(b as u32).unwrap();
        }
    }
    for (i, &b) in order.iter().enumerate().rev() {
        for &next in order[..i].iter().rev().take(ahead) {
            opt.gather_params(next as u32).unwrap();
        }
        opt.wait_params(b as u32).unwrap();
        let params = opt.plan().unwrap().buckets[b].params.clone();
        for &p in params.iter().rev() {
            grads(opt, p as usize);
        }
        opt.release_params(b as u32).unwrap();
    }
}

/// Every param as this rank sees it, each bucket gathered for the reading and released.
pub fn sharded_params(opt: &mut Optimizer, order: &[usize], params: usize) -> Vec<Vec<f32>> {
    let mut values = vec![Vec::new(); params];
    for &b in order {
        opt.wait_params(b as u32).unwrap();
        for &p in &opt.plan().unwrap().buckets[b].params.clone() {
            values[p as usize] = opt.running().unwrap().param_values(p as usize).unwrap();
        }
        opt.release_params(b as u32).unwrap();
    }
    values
}

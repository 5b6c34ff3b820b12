//! Harness of the checkpoint tests: a model with every kind of component (fused SwiGLU and QKV
//! matrices, expert stacks with and without splits, an AdamW-routed expert stack whose shards
//! cut experts), groups of ranks on threads, and gradients that make training bitwise
//! independent of dp.
//!
//! The gradients are the same on every rank and every element is ±2^e, so the reduced gradient
//! is exact at every dp: with pre-scaling by 1/dp, `dp·(g·(1/dp))` summed in rank order gives
//! back `g` exactly for dp ∈ {1, 2, 3, 4} (for dp = 3, `3·f32(1/3)·2^e` rounds to `2^e`). A run
//! resumed at another dp must therefore match an uninterrupted run bit for bit.

use std::path::Path;
use std::time::Duration;

use muon_opt::config::{CommMode, Config, Dtype, MuonLayout, NsPrecision};
use muon_opt::error::Result;
use muon_opt::model::{ParamFlags, ParamSpec};
use muon_opt::optimizer::Optimizer;

use super::ranks::{on_ranks, optimizers};
use super::rng::mix;
use super::training::{ARGS, assemble, bits, sharded_iteration, sharded_params};

fn flagged(name: String, shape: &[u64], flags: u32) -> ParamSpec {
    let mut p = ParamSpec::new(name, shape, Dtype::Bf16);
    p.flags = ParamFlags(flags);
    p
}

/// The test model (registration order = forward order).
pub fn model() -> Vec<ParamSpec> {
    let mut params = vec![flagged(
        "embedding.weight".into(),
        &[64, 32],
        ParamFlags::EMBEDDING_OR_OUTPUT,
    )];
    for layer in 0..2 {
        let name = |suffix: &str| format!("layers.{layer}.{suffix}");
        let mut qkv = ParamSpec::new(name("qkv.weight"), &[96, 32], Dtype::Bf16);
        // Layer 0 as q|k|v blocks; layer 1 as Megatron's 3 query groups of [16 q | 8 k | 8 v].
        if layer == 0 {
            qkv.split_sizes = vec![32, 32, 32];
        } else {
            qkv.split_sizes = vec![16, 8, 8];
            qkv.split_groups = 3;
        }
        params.push(qkv);
        params.push(ParamSpec::new(name("proj.weight"), &[32, 32], Dtype::Bf16));
        params.push(ParamSpec::new(name("norm.weight"), &[32], Dtype::F32));
        let mut fc1 = ParamSpec::new(name("fc1.weight"), &[128, 32], Dtype::Bf16);
        fc1.split_sizes = vec![64, 64];
        params.push(fc1);
        params.push(ParamSpec::new(name("fc2.weight"), &[32, 64], Dtype::Bf16));
        params.push(flagged(name("router.weight"), &[8, 32], ParamFlags::NO_MUON));
        let mut experts_fc1 = flagged(name("experts.fc1"), &[4, 48, 32], ParamFlags::EXPERT_STACK);
        experts_fc1.split_sizes = vec![24, 24];
        params.push(experts_fc1);
        params.push(flagged(name("experts.fc2"), &[4, 32, 24], ParamFlags::EXPERT_STACK));
        params.push(flagged(
            name("experts.scale"),
            &[4, 48, 20],
            ParamFlags::EXPERT_STACK | ParamFlags::NO_MUON,
        ));
    }
    params.push(flagged(
        "output.weight".into(),
        &[64, 32],
        ParamFlags::EMBEDDING_OR_OUTPUT,
    ));
    params
}

pub fn config(layout: MuonLayout) -> Config {
    Config {
        muon_layout: layout,
        bucket_size: 3000,
        clip_grad: 0.0,
        muon_ns_precision: NsPrecision::F32,
        host_comm_mode: CommMode::Eager,
        ..Config::default()
    }
}

pub fn init_values(p: usize, numel: u64) -> Vec<f32> {
    (0..numel)
        .map(|i| 0.1 * ((mix(((p as u64) << 32) | i) >> 40) as f32 / (1u64 << 24) as f32 - 0.5))
        .collect()
}

/// The gradient of param `p` at `step` given the values every rank sees: ±2^e per element,
/// with sign and exponent drawn from the step, the position and the value's bits.
pub fn grad(step: u64, p: usize, seen: &[f32]) -> Vec<f32> {
    seen.iter()
        .enumerate()
        .map(|(i, w)| {
            let h = mix((step << 48) ^ ((p as u64) << 32) ^ ((i as u64) << 8) ^ w.to_bits() as u64);
            let magnitude = 2f32.powi(-14 + (h % 8) as i32);
            if (h >> 20) & 1 == 1 { -magnitude } else { magnitude }
        })
        .collect()
}

/// Everything observable: per rank the step count and the params it holds; per param the
/// master and each moment assembled from every rank's owned pieces, in global coordinates.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub names: Vec<String>,
    pub steps: Vec<u64>,
    pub params: Vec<Vec<Vec<f32>>>,
    pub state: Vec<Vec<Vec<f32>>>,
}

impl Snapshot {
    /// Asserts bitwise equality, naming the first difference.
    pub fn assert_same(&self, expected: &Snapshot, label: &str) {
        let names = &self.names;
        for (rank, &steps) in self.steps.iter().enumerate() {
            assert_eq!(steps, expected.steps[0], "{label}: step count of rank {rank}");
        }
        for (p, (a, e)) in self.state.iter().zip(&expected.state).enumerate() {
            assert_eq!(a.len(), e.len(), "{label}: state tensors of {}", names[p]);
            for (k, (x, y)) in a.iter().zip(e).enumerate() {
                assert!(bits(x) == bits(y), "{label}: state tensor {k} of {} differs", names[p]);
            }
        }
        for (rank, params) in self.params.iter().enumerate() {
            for (p, values) in params.iter().enumerate() {
                assert!(
                    bits(values) == bits(&expected.params[0][p]),
                    "{label}: rank {rank} holds different values of {}",
                    names[p]
                );
            }
        }
    }
}

/// A param's gradient at a step from the values every rank sees (the same on every rank).
pub type Gradients = fn(u64, usize, &[f32]) -> Vec<f32>;

/// A finalized group of ranks on threads.
pub struct Group {
    pub opts: Vec<Optimizer>,
    pub specs: Vec<ParamSpec>,
    /// [`grad`] unless a test sets another.
    pub gradients: Gradients,
}

impl Group {
    pub fn new(cfg: &Config, dp: usize) -> Group {
        Self::with_model(cfg, dp, &model())
    }

    pub fn with_model(cfg: &Config, dp: usize, specs: &[ParamSpec]) -> Group {
        let mut opts = optimizers(cfg, dp, Duration::from_secs(20));
        for opt in &mut opts {
            for (p, spec) in specs.iter().enumerate() {
                opt.add_param(
                    spec.clone(),
                    Some(muon_opt::init_data::InitData::from_f32(&init_values(p, spec.numel()))),
                )
                .unwrap();
            }
        }
        let mut group = Group {
            opts,
            specs: specs.to_vec(),
            gradients: grad,
        };
        group.run(|_, opt| opt.finalize()).into_iter().for_each(|r| r.unwrap());
        group
    }

    pub fn dp(&self) -> usize {
        self.opts.len()
    }

    /// Runs `f` on every rank at once.
    pub fn run<T: Send>(&mut self, f: impl Fn(usize, &mut Optimizer) -> T + Sync) -> Vec<T> {
        on_ranks(&mut self.opts, f)
    }

    /// `steps` more steps; the data of a step depends on the step count the rank has reached.
    pub fn train(&mut self, steps: u64) {
        let gradients = self.gradients;
        self.run(|_, opt| {
            let n = opt.registry().len();
            for _ in 0..steps {
                let step = opt.running().unwrap().steps().unwrap();
                opt.zero_grad().unwrap();
                let grad = |opt: &mut Optimizer, p: usize| {
                    let seen = opt.running().unwrap().param_values(p).unwrap();
                    let g = gradients(step, p, &seen);
                    let ptr = opt.running().unwrap().address(p, true).cast::<f32>();
                    // SAFETY: the grad view of param p holds numel f32 values (grad_dtype f32).
                    unsafe { std::slice::from_raw_parts_mut(ptr, g.len()) }.copy_from_slice(&g);
                    opt.grad_ready(p as u32).unwrap();
                };
                let order = muon_opt::plan::forward_order(&opt.plan().unwrap().buckets);
                if opt.config().sharded() {
                    sharded_iteration(opt, &order, &mut |opt, p| grad(opt, p));
                } else {
                    for &b in &order {
                        opt.wait_params(b as u32).unwrap();
                    }
                    for p in (0..n).rev() {
                        grad(opt, p);
                    }
                }
                assert!(!opt.step(&ARGS).unwrap().skipped);
            }
        });
    }

    pub fn save(&mut self, dir: &Path) -> Vec<Result<()>> {
        self.run(|_, opt| opt.save(dir))
    }

    pub fn load(&mut self, dir: &Path) -> Vec<Result<()>> {
        self.run(|_, opt| opt.load(dir))
    }

    pub fn snapshot(&mut self) -> Snapshot {
        let per_rank = self.run(|_, opt| {
            let n = opt.registry().len();
            opt.running().unwrap().synchronize().unwrap();
            let params: Vec<Vec<f32>> = if opt.config().sharded() {
                let order = muon_opt::plan::forward_order(&opt.plan().unwrap().buckets);
                sharded_params(opt, &order, n)
            } else {
                let rt = opt.running().unwrap();
                (0..n).map(|p| rt.param_values(p).unwrap()).collect()
            };
            let rt = opt.running().unwrap();
            (rt.steps().unwrap(), params, rt.owned_state().unwrap())
        });
        let steps = per_rank.iter().map(|r| r.0).collect();
        let params = per_rank.iter().map(|r| r.1.clone()).collect();
        let state = assemble(&self.specs, per_rank.into_iter().map(|r| r.2).collect());
        let names = self.specs.iter().map(|s| s.name.clone()).collect();
        Snapshot {
            names,
            steps,
            params,
            state,
        }
    }
}

/// Unwraps every rank's result.
pub fn all_ok(results: Vec<Result<()>>, what: &str) {
    for (rank, r) in results.into_iter().enumerate() {
        if let Err(e) = r {
            panic!("{what} on rank {rank}: {e:?}");
        }
    }
}

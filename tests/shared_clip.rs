//! A dense and an expert optimizer of each rank share one clip (`Optimizer::step_shared`, the C
//! `muon_optimizers_step`): 4 ranks on threads, the dense params data-parallel over all 4, the
//! experts expert-parallel over 2 ranks (EP = 2) and data-parallel over the other 2 (EDP = 2),
//! both optimizers summing the norm over the world. Every optimizer of every rank clips with
//! the norm of the whole model — each optimizer's mean over its own dp — and skips together;
//! the pair's checkpoints resume bitwise.

mod support;

use std::path::Path;
use std::sync::Arc;

use muon_opt::backend::cuda::CallerStream;
use muon_opt::comm::Communicator;
use muon_opt::config::{Config, Dtype, NsPrecision, ParamSharding};
use muon_opt::error::{ErrorKind, Result};
use muon_opt::model::{ParamFlags, ParamSpec};
use muon_opt::optimizer::Optimizer;
use muon_opt::schedule::{StepArgs, StepInfo};
use support::ranks::{host_comms, on_ranks};
use support::rng::{milli, name_hash};
use support::tempdir::TempDir;
use support::training::ARGS;

const WORLD: usize = 4;
const EP: usize = 2;
const EDP: usize = WORLD / EP;

fn dense_model() -> Vec<ParamSpec> {
    vec![
        ParamSpec {
            flags: ParamFlags(ParamFlags::EMBEDDING_OR_OUTPUT),
            ..ParamSpec::new("embedding.weight", &[40, 16], Dtype::F32)
        },
        ParamSpec::new("layers.0.attn.weight", &[16, 16], Dtype::F32),
        ParamSpec::new("layers.0.norm.weight", &[16], Dtype::F32),
        ParamSpec::new("layers.0.router.weight", &[4, 16], Dtype::F32),
    ]
}

/// Expert-parallel rank `e`'s experts (global numbers 2e, 2e + 1), each a matrix and a bias.
fn expert_model(e: usize) -> Vec<ParamSpec> {
    experts(2 * e..2 * e + 2)
}

/// The experts `range` (global numbers), each a matrix and a bias.
fn experts(range: std::ops::Range<usize>) -> Vec<ParamSpec> {
    range
        .flat_map(|x| {
            [
                ParamSpec::new(format!("layers.0.experts.{x}.fc.weight"), &[24, 16], Dtype::F32),
                ParamSpec::new(format!("layers.0.experts.{x}.fc.bias"), &[24], Dtype::F32),
            ]
        })
        .collect()
}

/// World rank `w`'s expert-parallel rank and its rank in its expert-data-parallel group
/// (Megatron's order: expert-parallel ranks are consecutive).
fn expert_coordinates(w: usize) -> (usize, usize) {
    (w % EP, w / EP)
}

/// Gradient element `i` of param `name` on world rank `w` at `step`.
fn grad(step: usize, w: usize, name: &str, i: usize) -> f32 {
    milli(name_hash(name) ^ (step * 15_485_863 + w * 7919 + i * 31) as u64)
}

/// The communicators of the job: the world as the dense data-parallel group, one
/// expert-data-parallel group per expert-parallel rank, and a norm group over the world for
/// each optimizer (a communicator serves one optimizer: its collectives run on that
/// optimizer's comm stream).
struct Comms {
    world: Vec<Arc<Communicator>>,
    expert_data: Vec<Vec<Arc<Communicator>>>,
    dense_norm: Vec<Arc<Communicator>>,
    expert_norm: Vec<Arc<Communicator>>,
}

fn comms() -> Comms {
    Comms {
        world: host_comms(WORLD),
        expert_data: (0..EP).map(|_| host_comms(EDP)).collect(),
        dense_norm: host_comms(WORLD),
        expert_norm: host_comms(WORLD),
    }
}

fn config(clip_grad: f32, sharded: bool) -> Config {
    Config {
        bucket_size: 512,
        clip_grad,
        muon_ns_precision: NsPrecision::F32,
        param_sharding: if sharded {
            ParamSharding::Sharded
        } else {
            ParamSharding::Replicated
        },
        ..Config::default()
    }
}

/// The buckets of `opt` in the order a backward reaches them, each with its params.
fn backward_buckets(opt: &Optimizer) -> Result<Vec<(u32, Vec<u32>)>> {
    let buckets = &opt.plan()?.buckets;
    Ok(muon_opt::plan::forward_order(buckets)
        .into_iter()
        .rev()
        .map(|b| (b as u32, buckets[b].params.clone()))
        .collect())
}

fn optimizer(
    cfg: &Config,
    comm: &Arc<Communicator>,
    norm: &Arc<Communicator>,
    specs: &[ParamSpec],
) -> Result<Optimizer> {
    let mut opt = Optimizer::new(cfg.clone(), comm.claim()?, CallerStream::NULL)?;
    for spec in specs {
        let init: Vec<f32> = (0..spec.numel() as usize)
            .map(|i| grad(99, 0, &spec.name, i) * 0.1)
            .collect();
        opt.add_param(spec.clone(), Some(muon_opt::init_data::InitData::from_f32(&init)))?;
    }
    opt.set_norm_group(norm.clone())?;
    opt.finalize()?;
    Ok(opt)
}

/// Writes step `step`'s gradients (`nan` = (world rank, param name) of a NaN) and marks them.
fn backward(opt: &mut Optimizer, specs: &[ParamSpec], step: usize, w: usize, nan: Option<(usize, &str)>) -> Result<()> {
    opt.zero_grad()?;
    // Bucket by bucket, each gathered for its gradients (and released) with sharded params.
    for (b, params) in backward_buckets(opt)? {
        opt.wait_params(b)?;
        for p in params {
            write_grad(opt, specs, step, w, nan, p as usize)?;
        }
        opt.release_params(b)?;
    }
    Ok(())
}

/// Writes param `p`'s gradient of step `step` (NaN at `nan`) and marks it ready.
fn write_grad(
    opt: &mut Optimizer,
    specs: &[ParamSpec],
    step: usize,
    w: usize,
    nan: Option<(usize, &str)>,
    p: usize,
) -> Result<()> {
    let ptr = opt.running()?.address(p, true).cast::<f32>();
    let n = specs[p].numel() as usize;
    // SAFETY: the host backend's f32 grad view of param p holds n values.
    let g = unsafe { std::slice::from_raw_parts_mut(ptr, n) };
    for (i, v) in g.iter_mut().enumerate() {
        *v = grad(step, w, &specs[p].name, i);
    }
    if nan == Some((w, specs[p].name.as_str())) {
        g[0] = f32::NAN;
    }
    opt.grad_ready(p as u32)?;
    Ok(())
}

fn values(opt: &mut Optimizer, specs: &[ParamSpec]) -> Result<Vec<u32>> {
    Ok(named_values(opt, specs)?
        .into_iter()
        .flat_map(|(_, bits)| bits)
        .collect())
}

/// One rank's view after a run: both optimizers' last step and their params' bits.
#[derive(Debug, PartialEq)]
struct RankResult {
    dense: StepInfo,
    expert: StepInfo,
    params: Vec<u32>,
}

/// What a run does besides its steps.
#[derive(Clone, Copy, Default)]
struct Run<'a> {
    steps: usize,
    clip_grad: f32,
    nan: Option<(usize, &'a str)>,
    /// `param_sharding = sharded`.
    sharded: bool,
    /// Save the pair into `<dir>/dense` and `<dir>/experts` after this many steps.
    save_after: Option<(usize, &'a Path)>,
    /// Load the pair from there first, and count steps from this number.
    load_from: Option<(usize, &'a Path)>,
}

fn run(setup: Run) -> Vec<Result<RankResult>> {
    let comms = comms();
    let cfg = config(setup.clip_grad, setup.sharded);
    on_ranks(0..WORLD, |_, w| -> Result<RankResult> {
        let (e, edp_rank) = expert_coordinates(w);
        let (world, expert) = (&comms.world[w], &comms.expert_data[e][edp_rank]);
        let (dense_norm, expert_norm) = (&comms.dense_norm[w], &comms.expert_norm[w]);
        let cfg = &cfg;
        let (dense_specs, expert_specs) = (dense_model(), expert_model(e));
        let mut dense = optimizer(cfg, world, dense_norm, &dense_specs)?;
        let mut experts = optimizer(cfg, expert, expert_norm, &expert_specs)?;
        let mut first = 0;
        if let Some((at, dir)) = setup.load_from {
            dense.load(&dir.join("dense"))?;
            experts.load(&dir.join(format!("experts.{e}")))?;
            first = at;
        }
        for step in first..setup.steps {
            backward(&mut dense, &dense_specs, step, w, setup.nan)?;
            backward(&mut experts, &expert_specs, step, w, setup.nan)?;
            Optimizer::step_shared(&mut [&mut dense, &mut experts], Some(&[ARGS, ARGS]))?;
            if let Some((at, dir)) = setup.save_after
                && at == step + 1
            {
                dense.save(&dir.join("dense"))?;
                experts.save(&dir.join(format!("experts.{e}")))?;
            }
        }
        let mut params = values(&mut dense, &dense_specs)?;
        params.extend(values(&mut experts, &expert_specs)?);
        Ok(RankResult {
            dense: dense.step_info()?,
            expert: experts.step_info()?,
            params,
        })
    })
}

fn all_ok(results: Vec<Result<RankResult>>) -> Vec<RankResult> {
    results.into_iter().map(|r| r.unwrap()).collect()
}

/// Σ over a param's elements of (the gradient summed over `ranks`, in rank order, in f32)².
fn summed_squares(spec: &ParamSpec, step: usize, ranks: &[usize]) -> f64 {
    (0..spec.numel() as usize)
        .map(|i| {
            let sum = ranks.iter().fold(0.0f32, |acc, &w| acc + grad(step, w, &spec.name, i));
            f64::from(sum) * f64::from(sum)
        })
        .sum()
}

/// The squared norms of the dense and of the expert mean gradients at `step`, by hand.
fn squared_norms_by_hand(step: usize) -> (f64, f64) {
    let world: Vec<usize> = (0..WORLD).collect();
    let dense: f64 = dense_model().iter().map(|s| summed_squares(s, step, &world)).sum();
    let expert: f64 = (0..EP)
        .map(|e| {
            let group: Vec<usize> = (0..WORLD).filter(|&w| expert_coordinates(w).0 == e).collect();
            expert_model(e)
                .iter()
                .map(|s| summed_squares(s, step, &group))
                .sum::<f64>()
        })
        .sum();
    (dense / (WORLD * WORLD) as f64, expert / (EDP * EDP) as f64)
}

/// With sharded params both optimizers of the pair step bitwise as with replicated ones: the
/// same norm, clip and step on every rank and the same params, over two clipped steps.
#[test]
fn sharded_params_step_the_pair_bitwise_like_replicated() {
    let (dense, expert) = squared_norms_by_hand(0);
    let clip_grad = ((dense + expert).sqrt() * 0.5) as f32;
    let setup = Run {
        steps: 2,
        clip_grad,
        ..Run::default()
    };
    let replicated = all_ok(run(setup));
    let sharded = all_ok(run(Run { sharded: true, ..setup }));
    assert!(replicated[0].dense.clip_coef < 1.0, "{replicated:?}");
    assert_eq!(sharded, replicated);
}

#[test]
fn dense_and_expert_optimizers_clip_with_the_norm_of_the_whole_model() {
    let (dense, expert) = squared_norms_by_hand(0);
    let exact = (dense + expert).sqrt();
    let clip_grad = (exact * 0.5) as f32;
    let results = all_ok(run(Run {
        steps: 1,
        clip_grad,
        ..Run::default()
    }));
    let first = &results[0].dense;
    for r in &results {
        for info in [&r.dense, &r.expert] {
            assert_eq!(info.grad_norm.to_bits(), first.grad_norm.to_bits(), "{results:?}");
            assert_eq!(info.clip_coef.to_bits(), first.clip_coef.to_bits(), "{results:?}");
            assert_eq!((info.skipped, info.step), (false, 1));
        }
    }
    assert!(
        (first.grad_norm - exact).abs() <= 1e-12 * exact,
        "{} vs {exact} by hand",
        first.grad_norm
    );
    assert_eq!(
        first.clip_coef,
        (f64::from(clip_grad) / (first.grad_norm + 1e-6)) as f32
    );
    // Either optimizer alone would clip with another coefficient: the experts weigh in.
    assert!(expert > 0.05 * dense, "dense {dense}, expert {expert}");
    let dense_alone = (f64::from(clip_grad) / (dense.sqrt() + 1e-6)) as f32;
    assert_ne!(first.clip_coef, dense_alone);
}

#[test]
fn a_non_finite_expert_gradient_on_one_rank_skips_both_optimizers_everywhere() {
    let name = "layers.0.experts.3.fc.bias";
    let results = all_ok(run(Run {
        steps: 2,
        clip_grad: 1.0,
        nan: Some((3, name)),
        ..Run::default()
    }));
    assert_eq!(expert_coordinates(3).0, 1, "rank 3 holds expert 3");
    for r in &results {
        for info in [&r.dense, &r.expert] {
            assert!(info.skipped && !info.grad_norm.is_finite(), "{results:?}");
            assert_eq!(info.step, 0, "both steps skipped");
        }
    }
}

#[test]
fn the_pair_resumes_from_its_checkpoints_bitwise() {
    let tmp = TempDir::new("shared-clip");
    let straight = all_ok(run(Run {
        steps: 4,
        clip_grad: 0.5,
        save_after: Some((2, tmp.path())),
        ..Run::default()
    }));
    let resumed = all_ok(run(Run {
        steps: 4,
        clip_grad: 0.5,
        load_from: Some((2, tmp.path())),
        ..Run::default()
    }));
    assert_eq!(straight, resumed);
    assert_eq!(straight[0].dense.step, 4);
}

/// Preconditions fail before anything is enqueued: the optimizers stay usable and untouched.
#[test]
fn a_shared_step_refuses_mismatched_optimizers_and_changes_nothing() {
    let comms = comms();
    on_ranks(0..WORLD, |_, w| -> Result<()> {
        let (e, edp_rank) = expert_coordinates(w);
        let (world, expert) = (&comms.world[w], &comms.expert_data[e][edp_rank]);
        let (dense_norm, expert_norm) = (&comms.dense_norm[w], &comms.expert_norm[w]);
        let (dense_specs, expert_specs) = (dense_model(), expert_model(e));
        let mut dense = optimizer(&config(1.0, false), world, dense_norm, &dense_specs)?;
        let mut experts = optimizer(&config(2.0, false), expert, expert_norm, &expert_specs)?;
        let before = values(&mut dense, &dense_specs)?;
        backward(&mut dense, &dense_specs, 0, w, None)?;
        backward(&mut experts, &expert_specs, 0, w, None)?;
        let err = Optimizer::step_shared(&mut [&mut dense, &mut experts], Some(&[ARGS, ARGS])).unwrap_err();
        assert_eq!(err.kind, ErrorKind::IncompatibleOptions);
        assert!(err.message.contains("opts[1] has clip_grad 2"), "{err}");
        let err = Optimizer::step_shared(&mut [&mut dense, &mut experts], Some(&[ARGS])).unwrap_err();
        assert!(err.message.contains("1 step args for 2 optimizers"), "{err}");
        let err = Optimizer::step_shared(&mut [&mut dense], None).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidState, "{err}");
        let bad = StepArgs { lr: f32::NAN, ..ARGS };
        let err = Optimizer::step_shared(&mut [&mut dense], Some(&[bad])).unwrap_err();
        assert!(err.message.contains("args[0].lr"), "{err}");
        let err = Optimizer::step_shared(&mut [], None).unwrap_err();
        assert!(err.message.contains("count 0"), "{err}");
        assert_eq!(values(&mut dense, &dense_specs)?, before);
        assert_eq!(dense.step_info()?.step, 0);
        // Nothing was enqueued: the dense optimizer's collectives still line up
        // with the other ranks'.
        Optimizer::step_shared(&mut [&mut dense], Some(&[ARGS]))?;
        assert_eq!(dense.step_info()?.step, 1);
        Ok(())
    })
    .into_iter()
    .for_each(|r| r.unwrap());
}

/// What a rank of a resumed run saw: the loaded expert values by name, then the dense and the
/// expert optimizer's next step.
type Resumed = (Vec<(String, Vec<u32>)>, StepInfo, StepInfo);

/// Each param's value bits by name.
fn named_values(opt: &mut Optimizer, specs: &[ParamSpec]) -> Result<Vec<(String, Vec<u32>)>> {
    opt.synchronize()?;
    let mut values = vec![Vec::new(); specs.len()];
    // Each bucket gathered for the reading (and released) with sharded params.
    for (b, params) in backward_buckets(opt)? {
        opt.wait_params(b)?;
        for p in params {
            let ptr = opt.running()?.address(p as usize, false).cast::<f32>();
            // SAFETY: the host backend's f32 param view of param p, gathered.
            let v = unsafe { std::slice::from_raw_parts(ptr, specs[p as usize].numel() as usize) };
            values[p as usize] = v.iter().map(|x| x.to_bits()).collect();
        }
        opt.release_params(b)?;
    }
    Ok(specs.iter().map(|s| s.name.clone()).zip(values).collect())
}

/// After 2 shared steps at EP 2 × EDP 2 (dense, `experts.0`, `experts.1` saved), the experts
/// reload at other expert-parallel splits from the union of the expert checkpoints: EP 1 ×
/// EDP 4 (every rank holds all four experts, from both directories) and EP 4 × EDP 1 (each
/// rank one expert, from the directory that has it). Every expert's values and the step come
/// back exactly, and the pair steps on with one clip.
#[test]
fn expert_checkpoints_reload_at_another_expert_parallel_split() {
    let tmp = TempDir::new("ep-resplit");
    let saved = all_ok(run(Run {
        steps: 2,
        clip_grad: 0.5,
        save_after: Some((2, tmp.path())),
        ..Run::default()
    }));
    let expert_dirs = [tmp.join("experts.0"), tmp.join("experts.1")];
    // The saved values of every expert param, from the rank that holds it.
    let mut want = std::collections::BTreeMap::new();
    let comms = comms();
    for values in on_ranks(0..WORLD, |_, w| -> Result<Vec<(String, Vec<u32>)>> {
        let (e, edp_rank) = expert_coordinates(w);
        let (expert, norm) = (&comms.expert_data[e][edp_rank], &comms.expert_norm[w]);
        let specs = expert_model(e);
        let mut opt = optimizer(&config(0.5, false), expert, norm, &specs)?;
        opt.load(&expert_dirs[e])?;
        named_values(&mut opt, &specs)
    }) {
        want.extend(values.unwrap());
    }
    assert_eq!(want.len(), 8, "four experts, a matrix and a bias each");
    assert_eq!(saved[0].expert.step, 2);

    for ep in [1usize, 4] {
        let edp = WORLD / ep;
        let expert_data: Vec<Vec<Arc<Communicator>>> = (0..ep).map(|_| host_comms(edp)).collect();
        let (world, dense_norm, expert_norm) = (host_comms(WORLD), host_comms(WORLD), host_comms(WORLD));
        let results: Vec<Result<Resumed>> = on_ranks(0..WORLD, |_, w| -> Result<Resumed> {
            let (e, edp_rank) = (w % ep, w / ep);
            let comm = &expert_data[e][edp_rank];
            let (world, dense_norm, expert_norm) = (&world[w], &dense_norm[w], &expert_norm[w]);
            let (dirs, root) = (&expert_dirs, tmp.path());
            let (dense_specs, expert_specs) = (dense_model(), experts(e * 4 / ep..(e + 1) * 4 / ep));
            let mut dense = optimizer(&config(0.5, false), world, dense_norm, &dense_specs)?;
            let mut moe = optimizer(&config(0.5, false), comm, expert_norm, &expert_specs)?;
            dense.load(&root.join("dense"))?;
            moe.load_union(&[dirs[0].as_path(), dirs[1].as_path()])?;
            let loaded = named_values(&mut moe, &expert_specs)?;
            assert_eq!(moe.step_info()?.step, 2);
            backward(&mut dense, &dense_specs, 2, w, None)?;
            backward(&mut moe, &expert_specs, 2, w, None)?;
            Optimizer::step_shared(&mut [&mut dense, &mut moe], Some(&[ARGS, ARGS]))?;
            Ok((loaded, dense.step_info()?, moe.step_info()?))
        });
        let results: Vec<_> = results.into_iter().map(|r| r.unwrap()).collect();
        for (loaded, dense, moe) in &results {
            for (name, bits) in loaded {
                assert!(want[name] == *bits, "EP {ep}: {name} did not come back exactly");
            }
            assert_eq!((dense.step, moe.step), (3, 3), "EP {ep}");
            assert_eq!(dense.clip_coef.to_bits(), results[0].1.clip_coef.to_bits(), "EP {ep}");
            assert_eq!(moe.grad_norm.to_bits(), dense.grad_norm.to_bits(), "EP {ep}");
        }
    }
}

/// A union load names the param no checkpoint holds, or the one two of them hold, and
/// changes nothing.
#[test]
fn a_union_load_needs_each_param_in_exactly_one_checkpoint() {
    let tmp = TempDir::new("union-errors");
    all_ok(run(Run {
        steps: 1,
        clip_grad: 0.5,
        save_after: Some((1, tmp.path())),
        ..Run::default()
    }));
    let (experts0, experts1) = (tmp.join("experts.0"), tmp.join("experts.1"));
    let (comms, norms) = (host_comms(WORLD), host_comms(WORLD));
    let errors: Vec<Result<()>> = on_ranks(0..WORLD, |_, w| -> Result<()> {
        let (comm, norm) = (&comms[w], &norms[w]);
        let (experts0, experts1) = (&experts0, &experts1);
        let specs = experts(0..4);
        let mut opt = optimizer(&config(0.5, false), comm, norm, &specs)?;
        let before = named_values(&mut opt, &specs)?;
        let err = opt.load_union(&[experts0.as_path()]).unwrap_err();
        assert_eq!(err.kind, ErrorKind::CheckpointMismatch);
        assert!(
            err.message
                .contains("layers.0.experts.2.fc.weight' is in none of the 1 checkpoints"),
            "{err}"
        );
        let err = opt
            .load_union(&[experts0.as_path(), experts1.as_path(), experts0.as_path()])
            .unwrap_err();
        assert!(err.message.contains("is in both"), "{err}");
        assert_eq!(named_values(&mut opt, &specs)?, before, "a failed load changes nothing");
        assert_eq!(opt.step_info()?.step, 0);
        Ok(())
    });
    for e in errors {
        e.unwrap();
    }
}

//! CUDA graph capture of an iteration, checked on the translation (no GPU): the region
//! `step(NULL); zero_grad; forward waits; backward grad_ready; join` translates to actions
//! stream capture accepts — nothing host-blocking, no wait on work recorded outside the
//! region, the comm stream joined back at the end — and to the same operations at every
//! iteration, so one captured graph is valid for every replay. Without the join the checker
//! reports the unjoined comm stream, and the region after it the dependency on uncaptured
//! work. The order changes no numerics: params equal an eager run without joins bit for bit.

mod support;

use std::sync::{Arc, Mutex};

use muon_opt::backend::cuda::capture::check_capture;
use muon_opt::backend::cuda::dry_run::{DryRun, Translated};
use muon_opt::backend::host::comm::{HostComm, HostGroup};
use muon_opt::backend::host::executor::HostBackend;
use muon_opt::backend::ops::Op;
use muon_opt::backend::recording::Recording;
use muon_opt::comm::{Communicator, Transport};
use muon_opt::config::{CommMode, Config, Dtype, MuonLayout};
use muon_opt::error::Result;
use muon_opt::numerics::muon::MuonOptions;
use muon_opt::schedule::Runtime;
use support::cuda::{cuda_model, runtime, sharded_pass};
use support::ranks::{TIMEOUT, on_ranks};
use support::training::{ARGS, bits, rank_grad};

type Dry = Arc<Mutex<DryRun>>;

fn configs() -> Vec<(&'static str, Config)> {
    let base = Config {
        bucket_size: 4096,
        grad_dtype: Dtype::F32,
        ..Config::default()
    };
    vec![
        ("overlapped", base.clone()),
        (
            "no overlap",
            Config {
                overlap_grad_reduce: false,
                overlap_param_gather: false,
                ..base.clone()
            },
        ),
        (
            "MXFP8 gather",
            Config {
                mxfp8_param_gather: true,
                ..base.clone()
            },
        ),
        (
            "padded",
            Config {
                muon_layout: MuonLayout::Padded,
                ..base
            },
        ),
    ]
}

/// Backward: every param's gradient written in place (the framework's kernels, no op of
/// ours), then `grad_ready`, in reverse registration order.
fn backward(rt: &mut Runtime, rank: usize, step: u64) {
    for p in (0..rt.plan().params.len()).rev() {
        let n = rt.plan().params[p].numel as usize;
        let grad = rank_grad(step, rank, p, &vec![0.5; n]);
        let ptr = rt.address(p, true).cast::<f32>();
        // SAFETY: the host backend's f32 grad view of param p holds n values.
        unsafe { std::slice::from_raw_parts_mut(ptr, n) }.copy_from_slice(&grad);
        rt.grad_ready(p as u32).unwrap();
    }
}

/// The iteration as captured: the step first, then the next forward and backward.
fn region(rt: &mut Runtime, rank: usize, step: u64, join: bool) {
    rt.step(None).unwrap();
    rt.zero_grad().unwrap();
    for b in 0..rt.plan().buckets.len() as u32 {
        rt.wait_params(b).unwrap();
    }
    backward(rt, rank, step);
    if join {
        rt.join().unwrap();
    }
}

/// The ops and device actions `dry` received since `mark`.
fn since(dry: &Dry, mark: usize) -> (Vec<Op>, Vec<muon_opt::backend::cuda::action::Action>) {
    let dry = dry.lock().unwrap();
    let mut ops = Vec::new();
    let mut actions = Vec::new();
    for (op, translated) in &dry.log[mark..] {
        ops.push(op.clone());
        if let Ok(Translated::Actions(a)) = translated {
            actions.extend(a.iter().cloned());
        }
    }
    (ops, actions)
}

/// Rank `rank` of `comm`'s group after one eager backward and a join, recording into a dry
/// run. Lazy comm: a wait the schedule leaves out reads stale data deterministically.
fn setup_rank(cfg: &Config, rank: usize, comm: HostComm) -> (Runtime, Dry) {
    let dp = comm.size();
    let dry = Arc::new(Mutex::new(DryRun::new(rank, dp, MuonOptions::from_config(cfg))));
    let comm = Communicator::new(Transport::Host(comm));
    let host = HostBackend::new(comm, CommMode::Lazy, MuonOptions::from_config(cfg)).unwrap();
    let backend = Recording::new(host, dry.clone());
    let mut rt = runtime(cfg, &cuda_model(), rank, dp, Box::new(backend));
    rt.set_step_args(&ARGS).unwrap();
    rt.zero_grad().unwrap();
    backward(&mut rt, rank, 0);
    rt.join().unwrap();
    (rt, dry)
}

fn setup(cfg: &Config) -> (Runtime, Dry) {
    setup_rank(cfg, 0, HostGroup::new(1, TIMEOUT).remove(0))
}

fn log_len(dry: &Dry) -> usize {
    dry.lock().unwrap().log.len()
}

#[test]
fn a_joined_iteration_is_capturable_and_replays_the_same_operations() {
    for (label, cfg) in configs() {
        let (mut rt, dry) = setup(&cfg);
        let mut regions = Vec::new();
        for step in 1..=3 {
            let mark = log_len(&dry);
            region(&mut rt, 0, step, true);
            let (ops, actions) = since(&dry, mark);
            let checked: Result<()> = check_capture(&actions);
            assert!(checked.is_ok(), "{label}, step {step}: {}", checked.unwrap_err());
            assert!(
                actions
                    .iter()
                    .any(|a| matches!(a, muon_opt::backend::cuda::action::Action::Nccl(..)))
            );
            regions.push(ops);
        }
        assert!(
            regions[0] == regions[1] && regions[1] == regions[2],
            "{label}: the region's operations change between iterations"
        );
    }
}

/// With gradient collectives overlapping the backward, the region ends with comm work that
/// only the join brings back; without overlap the step issues them itself and waits for the
/// param collectives, so the region is joined anyway.
#[test]
fn without_the_join_the_region_is_unjoined_and_the_next_depends_on_uncaptured_work() {
    for (label, cfg) in configs() {
        let (mut rt, dry) = setup(&cfg);
        let mark = log_len(&dry);
        region(&mut rt, 0, 1, false);
        let unjoined = check_capture(&since(&dry, mark).1);
        let mark = log_len(&dry);
        region(&mut rt, 0, 2, true);
        let next = check_capture(&since(&dry, mark).1);
        if cfg.overlap_grad_reduce {
            let err = unjoined.unwrap_err().to_string();
            assert!(err.contains("not joined"), "{label}: {err}");
            let err = next.unwrap_err().to_string();
            assert!(err.contains("not recorded in the captured region"), "{label}: {err}");
        } else {
            assert!(unjoined.is_ok() && next.is_ok(), "{label}: {unjoined:?} {next:?}");
        }
    }
}

/// On two ranks (so a collective changes data and a left-out wait would read stale sums or
/// params), with joins and without, rank 0's params agree bit for bit.
#[test]
fn the_captured_order_changes_no_bits() {
    for (label, cfg) in configs() {
        let run = |join: bool| -> Vec<Vec<u32>> {
            let params = on_ranks(HostGroup::new(2, TIMEOUT), |rank, comm| {
                let (mut rt, _dry) = setup_rank(&cfg, rank, comm);
                for step in 1..=3 {
                    region(&mut rt, rank, step, join);
                }
                rt.synchronize().unwrap();
                (0..rt.plan().params.len())
                    .map(|p| bits(&rt.param_values(p).unwrap()))
                    .collect::<Vec<_>>()
            });
            params.into_iter().next().unwrap()
        };
        assert!(run(true) == run(false), "{label}: joins changed the params");
    }
}

/// [`sharded_pass`] writing each gradient into its slot in place, through the host backend's
/// view.
fn sharded_iteration(rt: &mut Runtime, rank: usize, step: u64) {
    sharded_pass(rt, |rt, p| {
        let n = rt.plan().params[p as usize].numel as usize;
        let grad = rank_grad(step, rank, p as usize, &vec![0.5; n]);
        let ptr = rt.address(p as usize, true).cast::<f32>();
        // SAFETY: the host backend's f32 grad view of param p, in its gathered slot, holds n values.
        unsafe { std::slice::from_raw_parts_mut(ptr, n) }.copy_from_slice(&grad);
    });
}

/// Sharded params (docs/design.md "Sharded params", CUDA-graph capture): the region `step(NULL);
/// the forward's gathers, waits and releases; the backward's gathers, grad_ready and releases;
/// join` translates to actions capture accepts, with collectives, and to the same operations
/// at every iteration; on two ranks its params equal an eager run without joins bit for bit.
#[test]
fn a_sharded_iteration_is_capturable_and_replays_the_same_operations() {
    let cfg = Config {
        param_sharding: muon_opt::config::ParamSharding::Sharded,
        ..configs().remove(0).1
    };
    let run = |join: bool, check: bool| -> Vec<Vec<u32>> {
        let params = on_ranks(HostGroup::new(2, TIMEOUT), |rank, comm| {
            let dp = comm.size();
            let dry = Arc::new(Mutex::new(DryRun::new(rank, dp, MuonOptions::from_config(&cfg))));
            let comm = Communicator::new(Transport::Host(comm));
            let host = HostBackend::new(comm, CommMode::Lazy, MuonOptions::from_config(&cfg)).unwrap();
            let mut rt = runtime(
                &cfg,
                &cuda_model(),
                rank,
                dp,
                Box::new(Recording::new(host, dry.clone())),
            );
            rt.set_step_args(&ARGS).unwrap();
            sharded_iteration(&mut rt, rank, 0);
            rt.join().unwrap();
            let mut regions = Vec::new();
            for step in 1..=3 {
                let mark = log_len(&dry);
                rt.step(None).unwrap();
                rt.zero_grad().unwrap();
                sharded_iteration(&mut rt, rank, step);
                if join {
                    rt.join().unwrap();
                }
                let (ops, actions) = since(&dry, mark);
                if check {
                    let checked: Result<()> = check_capture(&actions);
                    assert!(checked.is_ok(), "rank {rank}, step {step}: {}", checked.unwrap_err());
                    assert!(
                        actions
                            .iter()
                            .any(|a| matches!(a, muon_opt::backend::cuda::action::Action::Nccl(..)))
                    );
                }
                regions.push(ops);
            }
            if check {
                assert!(
                    regions[0] == regions[1] && regions[1] == regions[2],
                    "the region's operations change"
                );
            }
            rt.step(None).unwrap();
            let order = muon_opt::plan::forward_order(&rt.plan().buckets);
            let mut params = vec![Vec::new(); rt.plan().params.len()];
            for b in order {
                rt.wait_params(b as u32).unwrap();
                for p in rt.plan().buckets[b].params.clone() {
                    params[p as usize] = bits(&rt.param_values(p as usize).unwrap());
                }
                rt.release_params(b as u32).unwrap();
            }
            params
        });
        params.into_iter().next().unwrap()
    };
    assert!(run(true, true) == run(false, false), "joins changed the params");
}

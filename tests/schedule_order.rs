//! The collective order on NCCL is a function of the plan alone, and the step is pipelined.
//!
//! - Ranks that call `grad_ready` in different orders (MoE routing, unused params, other hook
//!   orders) still issue their gradient collectives in one order: the translated NCCL call
//!   sequence is identical on every rank, and the params equal bitwise those of a run where
//!   every rank used the backward order.
//! - The step updates buckets in the order the next forward uses them and releases each
//!   bucket (`PARAM_READY`) right after its own updates; the param collectives follow in
//!   forward order, every one issued after every update, so no update's tensor-parallel
//!   collective queues on the comm stream behind a param collective that waits for another
//!   rank.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use muon_opt::backend::cuda::action::{Action, NcclCall};
use muon_opt::backend::cuda::dry_run::{DryRun, Translated};
use muon_opt::backend::host::comm::HostGroup;
use muon_opt::backend::host::executor::HostBackend;
use muon_opt::backend::ops::{EventId, Mem, Op, Span, StreamKind};
use muon_opt::backend::recording::Recording;
use muon_opt::comm::{Communicator, Transport};
use muon_opt::config::{CommMode, Config};
use muon_opt::model::{ParamSpec, Registry, Route};
use muon_opt::numerics::muon::MuonOptions;
use muon_opt::plan::build_plan;
use muon_opt::schedule::Runtime;
use support::cuda::{cuda_model, runtime};
use support::ranks::on_ranks;
use support::training::{ARGS, bits, layered_model, rank_grad};

const DP: usize = 2;
const STEPS: u64 = 3;

/// The order in which a rank calls `grad_ready`.
#[derive(Clone, Copy, PartialEq)]
enum Order {
    Backward,
    Forward,
    /// Odd params first, then even ones.
    Interleaved,
}

impl Order {
    fn params(self, n: usize) -> Vec<usize> {
        match self {
            Order::Backward => (0..n).rev().collect(),
            Order::Forward => (0..n).collect(),
            Order::Interleaved => (0..n)
                .filter(|p| p % 2 == 1)
                .chain((0..n).filter(|p| p % 2 == 0))
                .collect(),
        }
    }
}

fn config(mode: CommMode) -> Config {
    Config {
        bucket_size: 2048,
        clip_grad: 0.0,
        host_comm_mode: mode,
        ..Config::default()
    }
}

/// One iteration with `order`'s grad_ready calls; gradients written before each call.
fn iterate(rt: &mut Runtime, rank: usize, step: u64, order: Order) {
    rt.zero_grad().unwrap();
    for b in 0..rt.plan().buckets.len() as u32 {
        rt.wait_params(b).unwrap();
    }
    for p in order.params(rt.plan().params.len()) {
        let seen = rt.param_values(p).unwrap();
        let grad = rank_grad(step, rank, p, &seen);
        let placement = &rt.plan().params[p];
        let span = Span::new(Mem::Grad(placement.buffer), placement.offset, placement.numel);
        rt.backend_mut().upload(span, &grad).unwrap();
        rt.grad_ready(p as u32).unwrap();
    }
    rt.step(Some(&ARGS)).unwrap();
}

/// Runs `STEPS` steps on a dp=2 host group, rank r using `orders[r]`; returns each rank's
/// params (bits) and its NCCL calls (without the rank-specific pointers).
fn run(cfg: &Config, orders: [Order; DP]) -> Vec<(Vec<Vec<u32>>, Vec<String>)> {
    run_model(cfg, &cuda_model(), orders)
}

fn run_model(cfg: &Config, specs: &[ParamSpec], orders: [Order; DP]) -> Vec<(Vec<Vec<u32>>, Vec<String>)> {
    let muon = MuonOptions::from_config(cfg);
    let comms = HostGroup::new(DP, Duration::from_secs(20));
    on_ranks(comms, |rank, comm| {
        let order = orders[rank];
        let dry = Arc::new(Mutex::new(DryRun::new(rank, DP, muon)));
        let comm = Communicator::new(Transport::Host(comm));
        let host = HostBackend::new(comm, cfg.host_comm_mode, muon).unwrap();
        let mut rt = runtime(cfg, specs, rank, DP, Box::new(Recording::new(host, dry.clone())));
        for step in 0..STEPS {
            iterate(&mut rt, rank, step, order);
        }
        rt.synchronize().unwrap();
        let params = (0..specs.len()).map(|p| bits(&rt.param_values(p).unwrap())).collect();
        let calls = nccl_calls(&dry.lock().unwrap());
        (params, calls)
    })
}

fn nccl_calls(dry: &DryRun) -> Vec<String> {
    let mut out = Vec::new();
    for (_, translated) in &dry.log {
        let Ok(Translated::Actions(actions)) = translated else {
            continue;
        };
        for action in actions {
            if let Action::Nccl(_, calls) = action {
                let group: Vec<String> = calls
                    .iter()
                    .map(|c| match *c {
                        NcclCall::Reduce { count, root, .. } => format!("reduce {count} to {root}"),
                        NcclCall::Broadcast { count, root, .. } => format!("broadcast {count} from {root}"),
                        NcclCall::ReduceScatter { recv_count, .. } => format!("reduce-scatter {recv_count}"),
                        NcclCall::AllGather { send_count, .. } => format!("all-gather {send_count}"),
                        NcclCall::AllReduce { count, .. } => format!("all-reduce {count}"),
                    })
                    .collect();
                out.push(group.join(", "));
            }
        }
    }
    out
}

#[test]
fn ranks_with_different_grad_ready_orders_issue_one_collective_order_and_agree_bitwise() {
    for mode in [CommMode::Eager, CommMode::Lazy] {
        let cfg = config(mode);
        let reference = run(&cfg, [Order::Backward, Order::Backward]);
        for orders in [[Order::Backward, Order::Forward], [Order::Interleaved, Order::Backward]] {
            let mixed = run(&cfg, orders);
            assert!(mixed[0].1.len() > 10, "{} NCCL groups", mixed[0].1.len());
            assert_eq!(mixed[0].1, mixed[1].1, "the ranks' NCCL call sequences differ");
            assert_eq!(
                mixed[0].1, reference[0].1,
                "the NCCL sequence depends on the grad_ready order"
            );
            for rank in 0..DP {
                assert_eq!(
                    mixed[rank].0, reference[rank].0,
                    "rank {rank}: params differ from the backward-order run"
                );
            }
        }
    }
}

#[test]
fn compact_groups_translate_to_nccl_reduce_scatter_and_all_gather_of_their_shards() {
    let specs = layered_model(4);
    let cfg = config(CommMode::Eager);
    let mut registry = Registry::default();
    specs
        .iter()
        .for_each(|s| registry.add(s.clone(), &cfg).map(|_| ()).unwrap());
    let plan = build_plan(registry.params(), registry.routes(), &cfg, DP).unwrap();
    let shards: Vec<u64> = plan
        .buckets
        .iter()
        .filter(|b| b.route == Route::Muon)
        .filter_map(|b| b.shard_size())
        .collect();
    assert!(
        shards.len() >= 2,
        "groups of matrices and an evenly split stack: {shards:?}"
    );
    let ranks = run_model(&cfg, &specs, [Order::Backward, Order::Interleaved]);
    assert_eq!(ranks[0].1, ranks[1].1, "the ranks' NCCL call sequences differ");
    for shard in shards {
        let buckets = plan.buckets.iter().filter(|b| b.shard_size() == Some(shard)).count() as u64;
        for call in [format!("reduce-scatter {shard}"), format!("all-gather {shard}")] {
            let issued = ranks[0]
                .1
                .iter()
                .filter(|group| group.split(", ").any(|c| c == call))
                .count();
            assert_eq!(issued as u64, STEPS * buckets, "'{call}': once per bucket and step");
        }
    }
}

/// `Record { Compute, PARAM_READY(b) }` is event `4b + 2` (see `src/schedule/mod.rs`).
fn param_ready_bucket(op: &Op) -> Option<usize> {
    match op {
        Op::Record {
            stream: StreamKind::Compute,
            event: EventId(e),
        } if e % 4 == 2 => Some(e / 4),
        _ => None,
    }
}

#[test]
fn the_step_updates_and_releases_buckets_in_forward_order() {
    let cfg = config(CommMode::Eager);
    let specs = cuda_model();
    let muon = MuonOptions::from_config(&cfg);
    let comms = HostGroup::new(1, Duration::from_secs(20));
    let comm = Communicator::new(Transport::Host(comms.into_iter().next().unwrap()));
    let log = Arc::new(Mutex::new(Vec::<Op>::new()));
    let host = HostBackend::new(comm, cfg.host_comm_mode, muon).unwrap();
    let mut rt = runtime(&cfg, &specs, 0, 1, Box::new(Recording::new(host, log.clone())));
    iterate(&mut rt, 0, 0, Order::Backward);
    let plan = rt.plan().clone();
    let ops = log.lock().unwrap().clone();
    let step_start = ops.iter().rposition(|op| matches!(op, Op::SquaredNorm { .. })).unwrap();
    let step = &ops[step_start..];

    // Forward order: by the first (smallest) param index of each bucket.
    let first_param = |b: usize| plan.buckets[b].params.iter().min().copied().unwrap();
    let released: Vec<usize> = step.iter().filter_map(param_ready_bucket).collect();
    assert_eq!(released.len(), plan.buckets.len());
    let firsts: Vec<u32> = released.iter().map(|&b| first_param(b)).collect();
    assert!(
        firsts.windows(2).all(|w| w[0] < w[1]),
        "param collectives not in forward order: {firsts:?}"
    );

    // Each bucket is released right after its own updates: between two releases, only the
    // next bucket's params are updated.
    let bucket_of_grad = |span: &Span| {
        plan.buckets
            .iter()
            .position(|b| Mem::Grad(b.buffer) == span.mem && b.start <= span.start && span.start < b.end)
            .unwrap()
    };
    let mut current = Vec::new();
    let mut interleaved = 0;
    for op in step {
        match op {
            Op::MuonUpdate(job) => current.push(bucket_of_grad(&job.grad)),
            Op::AdamwUpdate(job) => current.push(bucket_of_grad(&job.grad)),
            _ => {
                if let Some(b) = param_ready_bucket(op) {
                    assert!(
                        current.iter().all(|&u| u == b),
                        "bucket {b} released after updates of {current:?}"
                    );
                    interleaved += usize::from(!current.is_empty());
                    current.clear();
                }
            }
        }
    }
    assert!(
        interleaved >= 3,
        "updates and releases interleave ({interleaved} buckets with updates)"
    );

    let last_update = step
        .iter()
        .rposition(|op| matches!(op, Op::MuonUpdate(_) | Op::AdamwUpdate(_)))
        .unwrap();
    let first_collective = step.iter().position(|op| matches!(op, Op::Collectives(_))).unwrap();
    assert!(
        last_update < first_collective,
        "a param collective (op {first_collective}) is issued before the last update (op {last_update})"
    );
}

//! The figures of a simulated run, read off the timelines (definitions in `docs/simulate.md`).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::backend::cuda::action::Buf;
use crate::backend::ops::{Mem, StreamKind};

use super::engine::{Call, Class, Slice, Timeline};

/// Peak device bytes of one rank by kind (everything is allocated at finalize and kept).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DeviceBytes {
    pub params: u64,
    pub grads: u64,
    pub masters: u64,
    pub momenta: u64,
    /// NorMuon's second moments (`muon_variant = normuon`).
    pub muon_moment2: u64,
    pub adam_moments: u64,
    pub mxfp8: u64,
    pub workspaces: u64,
    pub total: u64,
}

impl DeviceBytes {
    /// Every kind with its name, in the order of the fields.
    pub fn parts(&self) -> [(&'static str, u64); 8] {
        [
            ("params", self.params),
            ("grads", self.grads),
            ("masters", self.masters),
            ("momenta", self.momenta),
            ("muon moment2", self.muon_moment2),
            ("adam moments", self.adam_moments),
            ("mxfp8", self.mxfp8),
            ("workspaces", self.workspaces),
        ]
    }

    pub fn of(allocations: &[(Buf, u64)]) -> Self {
        let mut d = DeviceBytes::default();
        for &(buf, bytes) in allocations {
            let slot = match buf {
                // Initial values are mapped from the caller's copy, never allocated here.
                Buf::Mem(Mem::Param(_) | Mem::OwnedParam(_) | Mem::Init(_)) => &mut d.params,
                Buf::Mem(Mem::Grad(_) | Mem::OwnedGrad(_) | Mem::Staging(_)) => &mut d.grads,
                Buf::Mem(Mem::Master) => &mut d.masters,
                Buf::Mem(Mem::Momentum) => &mut d.momenta,
                Buf::Mem(Mem::Moment2) => &mut d.muon_moment2,
                Buf::Mem(Mem::ExpAvg | Mem::ExpAvgSq) => &mut d.adam_moments,
                Buf::Mxfp8 { .. } => &mut d.mxfp8,
                Buf::Work(_) | Buf::Scalars => &mut d.workspaces,
            };
            *slot += bytes;
            d.total += bytes;
        }
        d
    }
}

/// One iteration's figures, all in milliseconds where a time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Figures {
    /// Steady-state iteration time: between the compute stream finishing the last two
    /// iterations.
    pub iteration_ms: f64,
    /// Modelled forward + backward compute of the iteration.
    pub model_compute_ms: f64,
    /// `iteration_ms − model_compute_ms`: what the optimizer adds to an iteration.
    pub exposed_ms: f64,
    /// Lower bound of `exposed_ms` without SM contention: `max(0, grad comm − backward) +
    /// max(optimizer compute, param comm − forward)`, every term from the run without
    /// contention (see `docs/simulate.md`).
    pub lower_bound_ms: f64,
    /// `exposed_ms / lower_bound_ms`.
    pub ratio: f64,
    /// Of `exposed_ms`, what SM contention costs: the iteration time with contention minus the
    /// iteration time of the same run without it. The lower bound leaves it out (a schedule
    /// hides communication only by paying it), so `(exposed_ms − contention_ms) /
    /// lower_bound_ms` measures the schedule alone.
    pub contention_ms: f64,
    /// The slowest rank's optimizer work on the compute stream (Newton–Schulz, AdamW, casts,
    /// norm, memsets): it cannot overlap the model's compute, which shares the stream.
    pub optimizer_compute_ms: f64,
    /// Of which Newton–Schulz (its GEMMs and Muon kernels).
    pub newton_schulz_ms: f64,
    /// Collective time no schedule can hide: gradient collectives beyond the backward, plus
    /// param collectives beyond the forward (busiest rank).
    pub unhidden_comm_ms: f64,
    /// Fraction of gradient-collective time during which the compute stream is busy (the
    /// model's compute or the optimizer's kernels: either way the collective is hidden).
    pub grad_overlap: f64,
    /// Fraction of param-collective time during which the compute stream is busy (the
    /// param collectives of the iteration before the last, which run into the last one).
    pub param_overlap: f64,
    /// Device work items the optimizer issues per iteration (kernels, GEMMs, memsets, copies,
    /// NCCL groups), busiest rank.
    pub launches: u64,
    /// Host synchronizations per iteration (copies the host waits for, stream syncs).
    pub host_syncs: u64,
    /// Host time stalled in them.
    pub host_stall_ms: f64,
    /// How long the forward's first layer waits after the iteration's zero_grad.
    pub first_forward_wait_ms: f64,
    /// The compute stream's longest waits by what it waited on (largest first).
    pub dominant_waits: Vec<(String, f64)>,
}

const MS: f64 = 1e3;

fn is_model(s: &Slice) -> bool {
    matches!(s.class, Class::Forward | Class::Backward)
}

fn in_iter(s: &Slice, i: usize) -> bool {
    s.iteration == Some(i)
}

/// Where the compute stream of iteration `i` ends.
fn compute_end(t: &Timeline, i: usize) -> f64 {
    t.slices
        .iter()
        .filter(|s| in_iter(s, i) && s.stream == StreamKind::Compute)
        .fold(0.0, |a, s| a.max(s.end))
}

fn sum(t: &Timeline, i: usize, keep: impl Fn(&Slice) -> bool) -> f64 {
    t.slices
        .iter()
        .filter(|s| in_iter(s, i) && keep(s))
        .map(|s| s.end - s.start)
        .sum()
}

/// Total length of `[start, end)` covered by `intervals` (sorted by start).
pub(crate) fn covered(start: f64, end: f64, intervals: &[(f64, f64)]) -> f64 {
    let mut total = 0.0;
    let mut reach = start;
    for &(a, b) in intervals {
        if a >= end {
            break;
        }
        let (a, b) = (a.max(reach), b.min(end));
        if b > a {
            total += b - a;
            reach = b;
        }
    }
    total
}

/// Compute-stream work: the model's forward and backward and the optimizer's kernels.
fn is_compute_work(s: &Slice) -> bool {
    s.stream == StreamKind::Compute && matches!(s.class, Class::Forward | Class::Backward | Class::Optimizer)
}

fn overlap(t: &Timeline, i: usize, keep: impl Fn(&Slice) -> bool) -> f64 {
    let mut busy: Vec<(f64, f64)> = t
        .slices
        .iter()
        .filter(|s| is_compute_work(s))
        .map(|s| (s.start, s.end))
        .collect();
    busy.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut hidden, mut total) = (0.0, 0.0);
    for s in t
        .slices
        .iter()
        .filter(|s| in_iter(s, i) && s.class == Class::Collective && keep(s))
    {
        hidden += covered(s.start, s.end, &busy);
        total += s.end - s.start;
    }
    if total > 0.0 { hidden / total } else { 1.0 }
}

fn is_grad_collective(s: &Slice) -> bool {
    matches!(s.label.what, "reduce" | "reduce-scatter" | "all-reduce")
}

fn is_param_collective(s: &Slice) -> bool {
    matches!(s.label.what, "broadcast" | "all-gather")
}

fn call_name(call: Call) -> String {
    match call {
        Call::WaitParams(b) => format!("wait_params(bucket {b})"),
        Call::GradReady(b) => format!("grad_ready (bucket {b})"),
        Call::Step => "step".into(),
        Call::ZeroGrad => "zero_grad".into(),
        Call::Setup => "setup".into(),
        Call::Forward => "forward".into(),
        Call::Backward => "backward".into(),
    }
}

/// The trace labels of the work the Newton–Schulz figure counts: the momentum, the
/// normalization, the products and their tile lists, the mirrors, `Q = Z + a·I` and the apply.
pub const NEWTON_SCHULZ_WORK: [&str; 7] = [
    "muon momentum",
    "ns normalize",
    "ns tile tables",
    "ns gemm",
    "ns symmetrize",
    "ns add identity",
    "muon apply",
];

/// Iteration `i`'s time: between the compute stream finishing iterations `i − 1` and `i`.
fn iteration_time(t: &Timeline, i: usize) -> f64 {
    (compute_end(t, i) - compute_end(t, i - 1)).max(0.0)
}

/// The modelled forward and backward compute of iteration `i` of `t`.
pub fn model_compute(t: &Timeline, i: usize) -> f64 {
    sum(t, i, is_model)
}

/// The figures of the last iteration (`iterations ≥ 2`; the param overlap is read from the
/// iteration before, whose param collectives run under the last iteration's forward).
/// `model` is the iteration's forward and backward compute without SM contention: what the
/// collectives take from it counts as exposed optimizer time.
/// `uncontended` are the timelines of the same run without SM contention: the iteration time it
/// adds is what contention costs, and the lower bound (which leaves contention out) is read
/// from them.
pub fn figures(timelines: &[Timeline], iterations: usize, model: f64, uncontended: &[Timeline]) -> Figures {
    let last = iterations - 1;
    let t0 = &timelines[0];
    let u0 = &uncontended[0];
    let iteration = iteration_time(t0, last);
    // Contention only slows work down; the two runs' sums can differ by rounding (−1e-13 s).
    let contention = (iteration - iteration_time(u0, last)).max(0.0);
    let exposed = iteration - model;
    let optimizer = |t: &Timeline| {
        sum(t, last, |s| {
            s.stream == StreamKind::Compute && s.class == Class::Optimizer
        })
    };
    let ns = |t: &Timeline| sum(t, last, |s| NEWTON_SCHULZ_WORK.contains(&s.label.what));
    let max_uncontended = |f: &dyn Fn(&Timeline) -> f64| uncontended.iter().map(f).fold(0.0, f64::max);
    let optimizer_compute = max_uncontended(&optimizer);
    let forward = sum(u0, last, |s| s.class == Class::Forward);
    let backward = sum(u0, last, |s| s.class == Class::Backward);
    let grad_comm = max_uncontended(&|t| sum(t, last, |s| s.class == Class::Collective && is_grad_collective(s)));
    let param_comm = max_uncontended(&|t| sum(t, last, |s| s.class == Class::Collective && is_param_collective(s)));
    let unhidden_grad = (grad_comm - backward).max(0.0);
    let unhidden_param = (param_comm - forward).max(0.0);
    let lower_bound = unhidden_grad + optimizer_compute.max(unhidden_param);
    let launches = timelines
        .iter()
        .map(|t| {
            t.slices
                .iter()
                .filter(|s| {
                    in_iter(s, last) && matches!(s.class, Class::Optimizer | Class::Collective | Class::HostCopy)
                })
                .count() as u64
        })
        .max()
        .unwrap_or(0);
    let first_forward_wait = t0
        .slices
        .iter()
        .filter(|s| in_iter(s, last) && s.stream == StreamKind::Compute && !matches!(s.class, Class::Event))
        .collect::<Vec<_>>()
        .windows(2)
        .find(|w| w[1].class == Class::Forward)
        .map_or(0.0, |w| (w[1].start - w[0].end).max(0.0));
    let mut waits: BTreeMap<String, f64> = BTreeMap::new();
    for s in t0
        .slices
        .iter()
        .filter(|s| in_iter(s, last) && s.stream == StreamKind::Compute && s.waited > 0.0)
    {
        *waits.entry(call_name(s.label.call)).or_default() += s.waited;
    }
    let mut dominant: Vec<(String, f64)> = waits.into_iter().map(|(k, v)| (k, v * MS)).collect();
    dominant.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    dominant.truncate(3);
    Figures {
        iteration_ms: iteration * MS,
        model_compute_ms: model * MS,
        exposed_ms: exposed * MS,
        lower_bound_ms: lower_bound * MS,
        ratio: if lower_bound > 0.0 {
            exposed / lower_bound
        } else {
            f64::NAN
        },
        contention_ms: contention * MS,
        optimizer_compute_ms: optimizer_compute * MS,
        newton_schulz_ms: max_uncontended(&ns) * MS,
        unhidden_comm_ms: (unhidden_grad + unhidden_param) * MS,
        grad_overlap: overlap(t0, last, is_grad_collective),
        param_overlap: overlap(t0, last - 1, is_param_collective),
        launches,
        host_syncs: timelines.iter().map(|t| t.host_syncs[last]).max().unwrap_or(0),
        host_stall_ms: t0.host_stall[last] * MS,
        first_forward_wait_ms: first_forward_wait * MS,
        dominant_waits: dominant,
    }
}

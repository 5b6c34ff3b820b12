//! A device run against a cost model (`muon-opt simulate --device-run`), and a profile
//! calibrated from a run (`muon-opt calibrate`).
//!
//! Calibration replaces the achievable fractions a single GPU can measure and nothing else:
//! `gemm_efficiency` (the step's GEMMs), `hbm_efficiency` (its bandwidth-bound kernels,
//! memsets and copies, and the copy references), `kernel_min_us` (its tiny kernels) and
//! `launch_host_us` (host time per issued action). NVLink, the network, NCCL latencies and
//! `comm_sm_share` need several GPUs and stay the profile's sourced estimates.

use serde::Serialize;

use crate::bail;
use crate::error::Result;
use crate::sim::cost::CostModel;
use crate::sim::profile::Hardware;
use crate::sim::work::Work;

use super::{DeviceRun, median};

/// One op class measured and priced again.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassRow {
    pub class: String,
    pub count: u64,
    pub measured_ms: f64,
    pub predicted_ms: Option<f64>,
    pub ratio: Option<f64>,
}

/// A device run priced by one profile.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub profile: String,
    pub device: String,
    pub date: String,
    pub classes: Vec<ClassRow>,
    /// The step's measured median, and the profile's price of its actions back to back.
    pub step_measured_ms: f64,
    pub step_predicted_ms: f64,
    pub references: Vec<ClassRow>,
}

fn priced(cost: &CostModel, work: &Work, count: u64) -> Option<f64> {
    cost.work_seconds(work).map(|s| s * count as f64 * 1e3)
}

fn row(class: &str, count: u64, measured_ms: f64, predicted_ms: Option<f64>) -> ClassRow {
    ClassRow {
        class: class.to_string(),
        count,
        measured_ms,
        predicted_ms,
        ratio: predicted_ms.filter(|p| *p > 0.0).map(|p| measured_ms / p),
    }
}

fn measured(run: &DeviceRun) -> Result<f64> {
    match (&run.status[..], &run.step) {
        ("measured", Some(step)) => Ok(step.measured_ms),
        _ => bail!(
            InvalidArgument,
            "device run of {}: status '{}' ({}), nothing was measured",
            run.date,
            run.status,
            run.skipped.as_deref().unwrap_or("no step")
        ),
    }
}

/// `run` priced again by `cost`.
pub fn compare(run: &DeviceRun, cost: &CostModel) -> Result<Comparison> {
    let step_measured_ms = measured(run)?;
    let mut step_predicted_ms = 0.0;
    let mut classes = Vec::new();
    for class in &run.op_classes {
        let mut predicted = Some(0.0);
        for w in &class.works {
            let one = priced(cost, &w.work, w.count);
            step_predicted_ms += one.unwrap_or(0.0);
            predicted = predicted.zip(one).map(|(a, b)| a + b);
        }
        classes.push(row(&class.class, class.count, class.measured_ms, predicted));
    }
    let references = run
        .references
        .iter()
        .map(|r| {
            row(
                &r.name,
                u64::from(r.repetitions),
                r.measured_ms,
                priced(cost, &r.work, 1),
            )
        })
        .collect();
    Ok(Comparison {
        profile: cost.hardware().name.clone(),
        device: run.device.as_ref().map_or_else(String::new, |d| d.name.clone()),
        date: run.date.clone(),
        classes,
        step_measured_ms,
        step_predicted_ms,
        references,
    })
}

/// One timed work of a run: its op class (or reference) name, the work, its count and its
/// measured milliseconds.
type Timed<'a> = (&'a str, &'a Work, u64, f64);

/// The timed step's works.
fn step_works(run: &DeviceRun) -> impl Iterator<Item = Timed<'_>> {
    run.op_classes.iter().flat_map(|c| {
        c.works
            .iter()
            .map(|w| (c.class.as_str(), &w.work, w.count, w.measured_ms))
    })
}

/// The value in `[lo, 1]` of a fraction at which `predicted(fraction)` (non-increasing in it)
/// equals `target`, by bisection; 1 when even 1 predicts more than `target`.
fn solve(target: f64, lo: f64, predicted: impl Fn(f64) -> f64) -> f64 {
    if predicted(1.0) >= target {
        return 1.0;
    }
    let (mut lo, mut hi) = (lo, 1.0);
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if predicted(mid) > target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

fn total(hw: &Hardware, works: &[Timed]) -> f64 {
    let cost = CostModel::new(hw.clone(), 1);
    works
        .iter()
        .filter_map(|(_, w, count, _)| priced(&cost, w, *count))
        .sum()
}

/// The fitted fractions' physical range: below it a fit says more about the run (or a work the
/// model cannot price) than about the device; at 1 the device beat the profile's peak, which is
/// then the wrong peak for it.
const FRACTION_RANGE: (f64, f64) = (0.01, 1.0);
/// The fitted per-launch times' physical range, µs: CUDA launches cost a few µs of host time
/// and a tiny kernel a few µs of device time (the profiles' `launch` source).
const MICROSECONDS_RANGE: (f64, f64) = (0.5, 100.0);
/// A host that spends more than this share of the step issuing it was held back by the device
/// (CUDA blocks a launch while the device's queue is full), so its issue time is not the
/// launches' cost: the first H200 run issued 4371 actions in 422 ms of a 521 ms step.
const HOST_BOUND_SHARE: f64 = 0.5;

/// The work of `works` furthest from the base profile's price (|ln(measured / predicted)|), as
/// "'class' (measured ms measured, predicted ms predicted)", for a refusal's message.
fn furthest(base: &Hardware, works: &[Timed]) -> String {
    let cost = CostModel::new(base.clone(), 1);
    let distance = |(_, w, count, ms): &Timed| match priced(&cost, w, *count) {
        Some(p) if p > 0.0 && *ms > 0.0 => (ms / p).ln().abs(),
        _ => f64::INFINITY,
    };
    works
        .iter()
        .max_by(|a, b| distance(a).total_cmp(&distance(b)))
        .map_or_else(String::new, |(class, w, count, ms)| {
            let predicted = priced(&cost, w, *count).map_or("not".to_string(), |p| format!("{p:.4} ms"));
            format!(
                "op class '{class}' ({ms:.4} ms measured, {predicted} predicted by {})",
                base.name
            )
        })
}

/// `value` of `field` when inside `(lo, hi)` (exclusive), else the refusal naming `source`
/// (what the figure was fitted to).
fn in_range(field: &str, value: f64, (lo, hi): (f64, f64), source: impl FnOnce() -> String) -> Result<f64> {
    if value.is_finite() && value > lo && value < hi {
        return Ok(value);
    }
    bail!(
        OutOfRange,
        "calibrate: {field} = {value} is outside its physical range ({lo}, {hi}), fitted to {}; no profile \
         was written",
        source()
    )
}

/// `base` with the figures one GPU measures taken from `run` (see the module docs), the run
/// named in its sources and those figures listed in `measured`. `run_name` is how the sources
/// cite the run (its file under `bench/device/`).
pub fn calibrate(run: &DeviceRun, base: &Hardware, run_name: &str) -> Result<Hardware> {
    let step_ms = measured(run)?;
    let step = run.step.as_ref().expect("checked by measured()");
    let mut hw = base.clone();
    // GEMMs: the step's own, which its prediction is made of (the plain reference GEMMs at
    // peak shapes would flatter the fraction); bandwidth: the step's kernels, memsets and
    // copies and the copy and memset references.
    let gemms: Vec<Timed> = step_works(run)
        .filter(|(_, w, ..)| matches!(w, Work::Gemm { .. }))
        .collect();
    let references = run
        .references
        .iter()
        .map(|r| (r.name.as_str(), &r.work, 1, r.measured_ms));
    let all: Vec<Timed> = step_works(run).chain(references).collect();
    // Bandwidth-bound: above 4× the shortest kernel at the base profile's rate, so the fit is
    // not a fit of launch floors.
    let base_cost = CostModel::new(base.clone(), 1);
    let floor = base.kernel_min_us * 1e-6;
    let streaming: Vec<Timed> = all
        .iter()
        .copied()
        .filter(|(_, w, count, _)| w.bytes() > 0 && *count > 0 && base_cost.kernel_seconds(w.bytes()) > 4.0 * floor)
        .collect();
    let tiny: Vec<Timed> = all
        .iter()
        .copied()
        .filter(|(_, w, count, _)| w.bytes() > 0 && *count > 0 && base_cost.kernel_seconds(w.bytes()) <= floor)
        .collect();
    let mut measured = Vec::new();
    // The fraction `field` of `hw` at which the model prices `works` at their measured total.
    let fit = |hw: &Hardware, works: &[Timed], field: fn(&mut Hardware) -> &mut f64| {
        let target: f64 = works.iter().map(|(.., ms)| ms).sum();
        solve(target, 1e-3, |e| {
            let mut trial = hw.clone();
            *field(&mut trial) = e;
            total(&trial, works)
        })
    };
    if !gemms.is_empty() {
        let e = fit(&hw, &gemms, |h| &mut h.gemm_efficiency);
        hw.gemm_efficiency = in_range("gemm_efficiency", e, FRACTION_RANGE, || furthest(base, &gemms))?;
        measured.push("gemm_efficiency");
    }
    if !streaming.is_empty() {
        let e = fit(&hw, &streaming, |h| &mut h.hbm_efficiency);
        hw.hbm_efficiency = in_range("hbm_efficiency", e, FRACTION_RANGE, || furthest(base, &streaming))?;
        measured.push("hbm_efficiency");
    }
    if let Some(us) = median(tiny.iter().map(|(.., count, ms)| ms * 1e3 / *count as f64).collect()) {
        hw.kernel_min_us = in_range("kernel_min_us", us, MICROSECONDS_RANGE, || furthest(base, &tiny))?;
        measured.push("kernel_min_us");
    }
    let events = step.event_actions as f64 * hw.event_host_us;
    let mut kept = String::new();
    if step.host_issue_ms > HOST_BOUND_SHARE * step_ms {
        kept = format!(
            "; launch_host_us kept: the host issued the step in {:.1} of its {step_ms:.1} ms, held back by the \
             device's launch queue",
            step.host_issue_ms
        );
    } else if step.work_actions > 0 && step.host_issue_ms * 1e3 > events {
        let us = (step.host_issue_ms * 1e3 - events) / step.work_actions as f64;
        hw.launch_host_us = in_range("launch_host_us", us, MICROSECONDS_RANGE, || {
            format!("{} actions issued in {} ms", step.work_actions, step.host_issue_ms)
        })?;
        measured.push("launch_host_us");
    }
    let device = run.device.as_ref().map_or("an unnamed device", |d| d.name.as_str());
    hw.sources.insert(
        "measured".to_string(),
        format!(
            "{} ({device}, {}): {} fitted to its timed step and references by `muon-opt calibrate`{kept}",
            run_name,
            run.date,
            measured.join(", ")
        ),
    );
    hw.measured = measured.iter().map(|s| s.to_string()).collect();
    hw.validate()?;
    Ok(hw)
}

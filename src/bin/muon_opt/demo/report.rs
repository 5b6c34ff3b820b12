//! Printing a demo result: the progress bar, the text report (routing, loss curves side by
//! side, plan summary, step-time breakdown) and the JSON document.

use std::fmt::Write;

use muon_opt::plan::Plan;

use super::{DemoResult, Progress, RunResult, Timings};
use crate::render;

const BAR_WIDTH: usize = 20;
const CHART_WIDTH: usize = 24;
/// Loss rows printed at most (plus the last step).
const LOSS_ROWS: usize = 12;

/// `[#####...............] muon   step 12/60 loss 0.1234`, without a line end.
pub fn progress_line(p: &Progress) -> String {
    let filled = BAR_WIDTH * p.step / p.steps.max(1);
    format!(
        "[{}{}] {:<5} step {}/{} loss {:.4}",
        "#".repeat(filled),
        ".".repeat(BAR_WIDTH - filled),
        p.variant.name(),
        p.step,
        p.steps,
        p.loss
    )
}

/// The result as pretty-printed JSON.
pub fn json(result: &DemoResult) -> String {
    let mut document = serde_json::to_value(result).expect("a demo result always serializes");
    document["schema_version"] = muon_opt::SCHEMA_VERSION.into();
    serde_json::to_string_pretty(&document).expect("a JSON value always serializes")
}

/// The human-readable report.
pub fn text(result: &DemoResult) -> String {
    let mut out = String::new();
    header(&mut out, result);
    routing(&mut out, result);
    losses(&mut out, result);
    plan(&mut out, &result.muon, "Muon run");
    plan_line(&mut out, &result.adamw.plan, "AdamW-only run");
    out.push('\n');
    timings(&mut out, result);
    out
}

fn header(out: &mut String, r: &DemoResult) {
    let d = &r.dims;
    let _ = writeln!(
        out,
        "MLP: embedding {}x{} ({} tokens summed) -> fc1 {}x{} -> fc2 {}x{} -> head {}x{}, tanh, biases; \
         MSE against a fixed random teacher",
        d.vocab, d.embed, d.context, d.hidden, d.embed, d.hidden, d.hidden, d.out, d.hidden
    );
    let _ = writeln!(
        out,
        "{} ranks (threads), {} examples per rank per step, {} steps; Muon lr {} wd {} (scale {} x {}{}), \
         AdamW lr {} wd {}\n",
        r.dp,
        r.batch_per_rank,
        r.steps,
        r.lr,
        r.weight_decay,
        r.optimizer.muon_scale_mode.name(),
        r.optimizer.muon_extra_scale_factor,
        if r.optimizer.muon_nesterov { ", Nesterov" } else { "" },
        r.adam_lr,
        r.adam_weight_decay
    );
}

fn shape(dims: &[u64]) -> String {
    dims.iter().map(u64::to_string).collect::<Vec<_>>().join("x")
}

fn routing(out: &mut String, r: &DemoResult) {
    let _ = writeln!(out, "Routing (Optimizer::route)");
    let _ = writeln!(out, "  {:<18} {:>7}  {:<8} adamw run", "param", "shape", "muon run");
    for (m, a) in r.muon.routes.iter().zip(&r.adamw.routes) {
        let _ = writeln!(
            out,
            "  {:<18} {:>7}  {:<8} {}",
            m.name,
            shape(&m.shape),
            m.route.name(),
            a.route.name()
        );
    }
    out.push('\n');
}

/// A bar of `value / max` of the chart width.
fn bar(value: f64, max: f64) -> String {
    let n = if max > 0.0 {
        ((value / max) * CHART_WIDTH as f64).round() as usize
    } else {
        0
    };
    "#".repeat(n.min(CHART_WIDTH))
}

fn losses(out: &mut String, r: &DemoResult) {
    let _ = writeln!(out, "Training loss (mean over ranks, before each step's update)");
    let _ = writeln!(out, "  {:>5}  {:<9}{:<w$}  adamw", "step", "muon", "", w = CHART_WIDTH);
    let max = r.muon.losses.iter().chain(&r.adamw.losses).copied().fold(0.0, f64::max);
    let every = r.steps.div_ceil(LOSS_ROWS).max(1);
    let rows = (0..r.steps).filter(|s| s % every == 0 || s + 1 == r.steps);
    for s in rows {
        let (m, a) = (r.muon.losses[s], r.adamw.losses[s]);
        let _ = writeln!(
            out,
            "  {:>5}  {m:<9.4}{:<w$}  {a:<9.4}{}",
            s + 1,
            bar(m, max),
            bar(a, max),
            w = CHART_WIDTH
        );
    }
    let _ = writeln!(
        out,
        "  held-out loss: initial {:.4}  final muon {:.4}  adamw {:.4}\n",
        r.muon.eval_loss_initial, r.muon.eval_loss_final, r.adamw.eval_loss_final
    );
}

/// How a bucket is split, and its params with the owner rank of every Muon unit.
fn plan_line(out: &mut String, plan: &Plan, label: &str) {
    let r = &plan.report;
    let _ = writeln!(
        out,
        "{label}: {} layout, {} buckets, elements muon {} adamw {}, padding {} ({:.1} %)",
        r.layout.name(),
        r.num_buckets,
        r.elements.muon,
        r.elements.adamw,
        r.padding_elements,
        100.0 * r.padding_fraction
    );
}

fn per_rank(values: &[u64]) -> String {
    values.iter().map(u64::to_string).collect::<Vec<_>>().join(" / ")
}

fn plan(out: &mut String, run: &RunResult, label: &str) {
    let plan = &run.plan;
    let _ = writeln!(out, "Plan (rank 0)");
    plan_line(out, plan, label);
    let names: Vec<String> = run.routes.iter().map(|r| r.name.clone()).collect();
    out.push_str(&render::bucket_table(plan, &names));
    let r = &plan.report;
    let _ = writeln!(
        out,
        "  muon elements per rank:          {}",
        per_rank(&r.muon_elements.per_rank)
    );
    let _ = writeln!(
        out,
        "  optimizer state bytes per rank:  {}\n",
        per_rank(&r.optimizer_state_bytes.per_rank)
    );
}

/// The step-time rows of one run, in seconds over all steps.
fn timing_rows(t: &Timings) -> [(&'static str, f64); 13] {
    let other = t.total - t.forward_backward - t.zero_grad - t.grad_ready - t.step - t.wait_params;
    let parts = &t.step_parts;
    [
        ("forward/backward (the demo's own)", t.forward_backward),
        ("zero_grad", t.zero_grad),
        ("grad_ready (launches grad collectives)", t.grad_ready),
        ("step (grad sync, Muon + AdamW)", t.step),
        ("  of which: grad collectives (wait)", parts.grad_collectives),
        ("            grad norm + all-reduce", parts.grad_norm),
        ("            Muon (momentum, NS, apply)", parts.muon),
        ("            AdamW", parts.adamw),
        ("            casts (master -> params)", parts.casts),
        ("            param collectives (launch)", parts.param_collectives),
        ("wait_params (param collectives)", t.wait_params),
        ("other (data, progress)", other),
        ("total", t.total),
    ]
}

fn timings(out: &mut String, r: &DemoResult) {
    let per_step = |seconds: f64| format!("{:.3} ms", 1e3 * seconds / r.steps as f64);
    let _ = writeln!(out, "Step time, rank 0, mean per step (wall clock)");
    let _ = writeln!(out, "  {:<40} {:>12} {:>12}", "", "muon run", "adamw run");
    for ((label, m), (_, a)) in timing_rows(&r.muon.timings)
        .into_iter()
        .zip(timing_rows(&r.adamw.timings))
    {
        let _ = writeln!(out, "  {label:<40} {:>12} {:>12}", per_step(m), per_step(a));
    }
}

//! Renders plan reports for people and tools: a text table with the layouts side by side, a
//! JSON summary, and an SVG bar chart of per-rank Newton–Schulz cost and optimizer state.

use std::fmt::Write;

use muon_opt::plan::{BucketSplit, Collective, ModeBytes, Plan};

#[cfg(test)]
mod tests;

/// `1234567` → `"1.23 M"`.
fn si(value: f64) -> String {
    let units = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")];
    match units.iter().find(|(scale, _)| value >= *scale) {
        Some((scale, unit)) => format!("{:.2} {unit}", value / scale),
        None => format!("{value:.0}"),
    }
}

/// `3221225472` → `"3.00 GiB"`.
fn bytes(value: f64) -> String {
    let units = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
    match units.iter().find(|(shift, _)| value >= (1u64 << shift) as f64) {
        Some((shift, unit)) => format!("{:.2} {unit}", value / (1u64 << shift) as f64),
        None => format!("{value:.0} B"),
    }
}

/// One table row: a label and a value per plan.
fn row(out: &mut String, label: &str, plans: &[Plan], value: impl Fn(&Plan) -> String) {
    let _ = write!(out, "{label:<32}");
    for plan in plans {
        let _ = write!(out, "{:>22}", value(plan));
    }
    out.push('\n');
}

/// A row aligned with [`table`]'s columns for figures computed outside the plan: `bytes[i]`
/// is plan i's value.
pub fn bytes_row(label: &str, values: &[u64]) -> String {
    let mut out = format!("{label:<32}");
    for &value in values {
        let _ = write!(out, "{:>22}", bytes(value as f64));
    }
    out.push('\n');
    out
}

/// A readable table of the reports of `plans` (one column per layout) for model `model`; the
/// wall-clock planning time only when `timing`.
pub fn table(model: &str, plans: &[Plan], timing: bool) -> String {
    let mut out = String::new();
    let Some(first) = plans.first() else {
        return out;
    };
    let r = &first.report;
    let _ = writeln!(
        out,
        "model {model}  dp {}  params {}  elements: muon {}, adamw {}\n",
        r.dp,
        r.num_params,
        si(r.elements.muon as f64),
        si(r.elements.adamw as f64)
    );
    row(&mut out, "", plans, |p| p.layout.name().to_string());
    row(&mut out, "buckets", plans, |p| p.report.num_buckets.to_string());
    row(&mut out, "padding elements", plans, |p| {
        si(p.report.padding_elements as f64)
    });
    row(&mut out, "padding", plans, |p| {
        format!("{:.4} %", 100.0 * p.report.padding_fraction)
    });
    row(&mut out, "param buffers", plans, |p| {
        bytes(p.report.param_buffer_bytes as f64)
    });
    row(&mut out, "grad buffers", plans, |p| {
        bytes(p.report.grad_buffer_bytes as f64)
    });
    for (mode, of) in [
        (
            "replicated",
            (|p: &Plan| &p.report.sharding.replicated) as fn(&Plan) -> &ModeBytes,
        ),
        ("sharded", |p: &Plan| &p.report.sharding.sharded),
    ] {
        row(&mut out, &format!("{mode}: params+grads / rank"), plans, |p| {
            let m = of(p);
            bytes(m.params.iter().zip(&m.grads).map(|(a, b)| a + b).max().unwrap_or(0) as f64)
        });
        row(&mut out, &format!("{mode}: working set"), plans, |p| {
            bytes(of(p).working_set as f64)
        });
        row(&mut out, &format!("{mode}: + optimizer state"), plans, |p| {
            bytes(of(p).max_total as f64)
        });
    }
    row(&mut out, "optimizer state / rank, max", plans, |p| {
        bytes(p.report.optimizer_state_bytes.max as f64)
    });
    row(&mut out, "optimizer state / rank, mean", plans, |p| {
        bytes(p.report.optimizer_state_bytes.mean)
    });
    row(&mut out, "muon elements / rank, max/mean", plans, |p| {
        let e = &p.report.muon_elements;
        format!("{:.3}", if e.mean > 0.0 { e.max as f64 / e.mean } else { 1.0 })
    });
    row(&mut out, "NS cost / rank, max", plans, |p| si(p.report.ns_cost.max));
    row(&mut out, "NS cost / rank, mean", plans, |p| si(p.report.ns_cost.mean));
    row(&mut out, "NS makespan / lower bound", plans, |p| {
        format!("{:.4}", p.report.ns_makespan_over_lower_bound)
    });
    row(&mut out, "wire / rank / step", plans, |p| {
        bytes(p.report.wire_bytes_per_rank)
    });
    row(&mut out, "wire / lower bound", plans, |p| {
        format!("{:.4}", p.report.wire_over_lower_bound)
    });
    row(&mut out, "  by reduce-scatter+all-gather", plans, |p| {
        let mix = &p.report.collective_mix;
        let sharded = mix.reduce_scatter + mix.all_gather;
        format!(
            "{:.1} %",
            100.0 * if mix.total() > 0.0 { sharded / mix.total() } else { 1.0 }
        )
    });
    row(&mut out, "gradient wait / backward", plans, |p| {
        format!("{:.4}", p.report.grad_wait_fraction)
    });
    row(&mut out, "ownership", plans, |p| p.report.ownership.name().to_string());
    row(&mut out, "group window", plans, |p| {
        let c = &p.report.choice;
        c.alternatives
            .get(c.chosen)
            .map_or_else(String::new, |a| a.group_window.label())
    });
    if timing {
        row(&mut out, "planning time", plans, |p| {
            format!("{:.2} ms", p.report.planning_time_ms)
        });
    }
    row(&mut out, "plan hash", plans, |p| format!("{:#018x}", p.hash));
    out
}

/// What the planner chose for one plan and why: the network it planned for and every candidate
/// it laid out, with its bytes per rank and, on a declared network, its modelled exposed time;
/// `*` marks the plan taken.
pub fn choice_table(plan: &Plan) -> String {
    let c = &plan.report.choice;
    let mut out = match c.network {
        Some(n) => format!(
            "{} layout: planned for a ring of {} µs per hop, {} GB/s bus bandwidth; least modelled exposed time wins\n",
            plan.layout.name(),
            n.hop_latency_us,
            n.bus_bandwidth_gbps
        ),
        None => format!(
            "{} layout: no network declared; fewest bytes per rank wins (balanced ownership)\n",
            plan.layout.name()
        ),
    };
    let _ = writeln!(
        out,
        "  {:<16}{:<14}{:>16}{:>22}",
        "ownership", "group window", "wire / rank", "modelled exposed ms"
    );
    for (i, a) in c.alternatives.iter().enumerate() {
        let exposed = a
            .modelled_exposed_ms
            .map_or_else(|| "-".to_string(), |ms| format!("{ms:.2}"));
        let _ = writeln!(
            out,
            "{} {:<16}{:<14}{:>16}{:>22}",
            if i == c.chosen { '*' } else { ' ' },
            a.ownership.name(),
            a.group_window.label(),
            bytes(a.wire_bytes_per_rank),
            exposed
        );
    }
    out
}

/// The buckets of one plan, one line each: id, route, elements, padding, how the bucket is
/// split over ranks, and its params (`names` in registration order), each Muon param with
/// the owner rank of every unit.
pub fn bucket_table(plan: &Plan, names: &[String]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  {:>6}  {:<5}  {:>10}  {:>8}  {:<20}  {:<46}  params (-> owner rank)",
        "bucket", "route", "elements", "padding", "split", "collectives, bytes / rank"
    );
    for (b, traffic) in plan.buckets.iter().zip(&plan.report.traffic) {
        let collectives = format!(
            "{} {} + {} {}",
            collective_name(traffic.grad_collective),
            bytes(traffic.grad_bytes_per_rank),
            collective_name(traffic.param_collective),
            bytes(traffic.param_bytes_per_rank)
        );
        let used: u64 = b.params.iter().map(|&p| plan.params[p as usize].numel).sum();
        let split = match &b.split {
            BucketSplit::OwnerRanges(_) => "whole matrices".to_string(),
            BucketSplit::EqualShards { shard_size } => format!("{} shards of {shard_size}", plan.dp),
        };
        let params: Vec<String> = b
            .params
            .iter()
            .map(|&p| {
                let owners = &plan.params[p as usize].unit_owners;
                let name = &names[p as usize];
                if owners.is_empty() {
                    name.clone()
                } else {
                    let ranks: Vec<String> = owners.iter().map(|r| format!("r{r}")).collect();
                    format!("{name} -> {}", ranks.join(","))
                }
            })
            .collect();
        let _ = writeln!(
            out,
            "  {:>6}  {:<5}  {:>10}  {:>8}  {split:<20}  {collectives:<46}  {}",
            b.id,
            b.route.name(),
            b.numel(),
            b.numel() - used,
            params.join(", ")
        );
    }
    out
}

fn collective_name(collective: Collective) -> &'static str {
    match collective {
        Collective::Reduce => "reduce",
        Collective::Broadcast => "broadcast",
        Collective::ReduceScatter => "reduce-scatter",
        Collective::AllGather => "all-gather",
        Collective::AllReduce => "all-reduce",
    }
}

/// A JSON summary: `{"schema_version", "model", "dp", "plans": [{"layout", "hash", "report"}]}`,
/// with each plan's wall-clock `planning_time_ms` only when `timing` (the rest is
/// deterministic).
pub fn json_summary(model: &str, plans: &[Plan], timing: bool) -> String {
    let entries: Vec<serde_json::Value> = plans
        .iter()
        .map(|p| {
            let mut entry = serde_json::json!({
                "layout": p.layout,
                "hash": format!("{:#018x}", p.hash),
                "report": p.report,
            });
            if timing {
                entry["planning_time_ms"] = p.report.planning_time_ms.into();
            }
            entry
        })
        .collect();
    let dp = plans.first().map_or(0, |p| p.dp);
    let summary = serde_json::json!({
        "schema_version": muon_opt::SCHEMA_VERSION,
        "model": model,
        "dp": dp,
        "plans": entries,
    });
    serde_json::to_string_pretty(&summary).unwrap_or_default()
}

fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const SVG_WIDTH: f64 = 960.0;
const PANEL_HEIGHT: f64 = 190.0;
const MARGIN: f64 = 50.0;
const TITLE_HEIGHT: f64 = 30.0;
const AXIS_HEIGHT: f64 = 22.0;

/// One bar chart of a value per rank, bars scaled so that `top_value` fills the panel, with
/// the mean as a dashed line and the first and last rank labelled.
struct Panel<'a> {
    title: String,
    class: &'a str,
    values: &'a [f64],
    top_value: f64,
}

impl Panel<'_> {
    fn draw(&self, out: &mut String, top: f64, label: impl Fn(f64) -> String) {
        let plot_width = SVG_WIDTH - 2.0 * MARGIN;
        let plot_height = PANEL_HEIGHT - TITLE_HEIGHT - AXIS_HEIGHT;
        let base = top + PANEL_HEIGHT - AXIS_HEIGHT;
        let ranks = self.values.len().max(1);
        let mean = self.values.iter().sum::<f64>() / ranks as f64;
        let scale = if self.top_value > 0.0 {
            plot_height / self.top_value
        } else {
            0.0
        };
        let slot = plot_width / ranks as f64;
        let width = (slot * 0.8).max(0.5);
        let _ = writeln!(
            out,
            r#"<text x="{MARGIN}" y="{:.1}" class="title">{}</text>"#,
            top + 20.0,
            xml_escape(&self.title)
        );
        for (rank, &value) in self.values.iter().enumerate() {
            let height = value * scale;
            let _ = writeln!(
                out,
                r#"<rect class="bar {}" x="{:.2}" y="{:.2}" width="{width:.2}" height="{height:.2}"><title>rank {rank}: {}</title></rect>"#,
                self.class,
                MARGIN + rank as f64 * slot,
                base - height,
                label(value)
            );
        }
        let y = base - mean * scale;
        let right = MARGIN + plot_width;
        let _ = writeln!(
            out,
            r#"<line class="mean" x1="{MARGIN}" x2="{right:.1}" y1="{y:.2}" y2="{y:.2}"><title>mean {}</title></line>"#,
            label(mean)
        );
        let _ = writeln!(
            out,
            r#"<line class="axis" x1="{MARGIN}" x2="{right:.1}" y1="{base:.2}" y2="{base:.2}"/>"#
        );
        let label_y = base + 15.0;
        let _ = writeln!(out, r#"<text x="{MARGIN}" y="{label_y:.1}">rank 0</text>"#);
        let _ = writeln!(
            out,
            r#"<text x="{right:.1}" y="{label_y:.1}" text-anchor="end">rank {}</text>"#,
            ranks - 1
        );
    }
}

/// An SVG with, per plan, a bar per rank of Newton–Schulz cost and of optimizer-state bytes.
/// Each metric uses one scale across plans, so layouts compare at a glance.
pub fn svg(model: &str, plans: &[Plan]) -> String {
    let height = TITLE_HEIGHT + 2.0 * PANEL_HEIGHT * plans.len() as f64 + 10.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{SVG_WIDTH}" height="{height}" viewBox="0 0 {SVG_WIDTH} {height}">"#
    );
    out.push_str(
        "<style>text{font:13px sans-serif} .title{font-weight:bold} .ns{fill:#4c72b0} \
         .state{fill:#dd8452} .mean{stroke:#333;stroke-dasharray:4 3} .axis{stroke:#999}</style>\n",
    );
    let dp = plans.first().map_or(0, |p| p.dp);
    let _ = writeln!(
        out,
        r#"<text x="{MARGIN}" y="20">{} at dp {dp}</text>"#,
        xml_escape(model)
    );
    let top_ns = plans.iter().map(|p| p.report.ns_cost.max).fold(0.0, f64::max);
    let top_state = plans
        .iter()
        .map(|p| p.report.optimizer_state_bytes.max as f64)
        .fold(0.0, f64::max);
    for (i, plan) in plans.iter().enumerate() {
        let top = TITLE_HEIGHT + 2.0 * PANEL_HEIGHT * i as f64;
        let r = &plan.report;
        let layout = plan.layout.name();
        let ns = Panel {
            title: format!(
                "{layout}: Newton–Schulz cost per rank (max {}, makespan / lower bound {:.3})",
                si(r.ns_cost.max),
                r.ns_makespan_over_lower_bound
            ),
            class: "ns",
            values: &r.ns_cost.per_rank,
            top_value: top_ns,
        };
        ns.draw(&mut out, top, si);
        let state: Vec<f64> = r.optimizer_state_bytes.per_rank.iter().map(|&b| b as f64).collect();
        let state_panel = Panel {
            title: format!(
                "{layout}: optimizer state per rank (max {})",
                bytes(r.optimizer_state_bytes.max as f64)
            ),
            class: "state",
            values: &state,
            top_value: top_state,
        };
        state_panel.draw(&mut out, top + PANEL_HEIGHT, bytes);
    }
    out.push_str("</svg>\n");
    out
}

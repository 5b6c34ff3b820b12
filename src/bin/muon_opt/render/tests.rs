//! Rendering of plan reports: the JSON summary, the SVG chart and the text table.

use muon_opt::config::{Config, MuonLayout};
use muon_opt::plan::presets::preset;
use muon_opt::plan::{Plan, build_plans};

use super::{json_summary, svg, table};

fn gpt2_plans(dp: usize) -> Vec<Plan> {
    build_plans(&preset("gpt2-124m").unwrap(), &Config::default(), dp, MuonLayout::ALL).unwrap()
}

#[test]
fn json_summary_parses_and_carries_every_report_field() {
    let plans = gpt2_plans(4);
    let json: serde_json::Value = serde_json::from_str(&json_summary("gpt2-124m", &plans, false)).unwrap();
    assert_eq!(json["schema_version"], muon_opt::SCHEMA_VERSION);
    assert_eq!(json["model"], "gpt2-124m");
    assert_eq!(json["dp"], 4);
    let entries = json["plans"].as_array().unwrap();
    let layouts: Vec<&str> = entries.iter().map(|e| e["layout"].as_str().unwrap()).collect();
    assert_eq!(layouts, ["compact", "padded", "allreduce", "compact_rooted"]);
    for (entry, plan) in entries.iter().zip(&plans) {
        assert_eq!(entry["hash"], format!("{:#018x}", plan.hash));
        let report = &entry["report"];
        for field in [
            "elements",
            "num_buckets",
            "padding_elements",
            "padding_fraction",
            "param_buffer_bytes",
            "grad_buffer_bytes",
            "ns_makespan_over_lower_bound",
            "wire_bytes_per_rank",
            "wire_over_lower_bound",
            "collective_mix",
            "traffic",
            "grad_wait_fraction",
        ] {
            assert!(!report[field].is_null(), "report lacks {field}");
        }
        assert!(report["planning_time_ms"].is_null(), "wall clock only when asked");
        assert!(entry["planning_time_ms"].is_null(), "wall clock only when asked");
        assert_eq!(report["optimizer_state_bytes"]["per_rank"].as_array().unwrap().len(), 4);
        assert_eq!(report["ns_cost"]["per_rank"].as_array().unwrap().len(), 4);
        assert_eq!(report["elements"]["muon"], plan.report.elements.muon);
        assert_eq!(report["padding_elements"], plan.report.padding_elements);
    }
}

#[test]
fn svg_draws_one_bar_per_rank_per_chart() {
    let plans = gpt2_plans(8);
    let chart = svg("gpt2 <124m> & co", &plans);
    assert!(chart.starts_with("<svg") && chart.trim_end().ends_with("</svg>"));
    assert_eq!(chart.matches(r#"class="bar ns""#).count(), 8 * plans.len());
    assert_eq!(chart.matches(r#"class="bar state""#).count(), 8 * plans.len());
    assert!(chart.contains("gpt2 &lt;124m&gt; &amp; co"));
    for rank in 0..8 {
        assert!(chart.contains(&format!("<title>rank {rank}: ")));
    }
}

#[test]
fn table_shows_layouts_side_by_side() {
    let plans = gpt2_plans(2);
    let text = table("gpt2-124m", &plans, false);
    let header = text.lines().find(|l| l.contains("compact")).unwrap();
    let order: Vec<usize> = ["compact", "padded", "allreduce"]
        .iter()
        .map(|l| header.find(l).unwrap())
        .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{header}");
    for label in [
        "padding",
        "NS makespan / lower bound",
        "wire / lower bound",
        "plan hash",
    ] {
        assert!(text.contains(label), "table lacks {label}");
    }
    assert!(text.contains(&format!("{:#018x}", plans[1].hash)));
    assert!(!text.contains("planning time"), "wall clock only when asked");
    assert!(table("gpt2-124m", &plans, true).contains("planning time"));
}

//! `muon-opt simulate`'s figures as a table for a person.

use muon_opt::sim::Simulation;
use muon_opt::sim::metrics::DeviceBytes;

/// The simulations as a table for a person, one column each.
pub fn table(sims: &[Simulation]) -> String {
    fn gb(b: u64) -> String {
        format!("{:.2}", b as f64 / 1e9)
    }
    fn ms(v: f64) -> String {
        format!("{v:.3}")
    }
    type Row = (&'static str, Box<dyn Fn(&Simulation) -> String>);
    let rows: Vec<Row> = vec![
        ("schedule", Box::new(|s| s.schedule.clone())),
        ("layout", Box::new(|s| s.layout.clone())),
        ("ownership", Box::new(|s| s.ownership.clone())),
        ("iteration ms", Box::new(|s| ms(s.figures.iteration_ms))),
        ("model fwd+bwd ms", Box::new(|s| ms(s.figures.model_compute_ms))),
        ("exposed optimizer ms", Box::new(|s| ms(s.figures.exposed_ms))),
        ("lower bound ms", Box::new(|s| ms(s.figures.lower_bound_ms))),
        ("exposed / lower bound", Box::new(|s| format!("{:.3}", s.figures.ratio))),
        ("  of exposed: contention", Box::new(|s| ms(s.figures.contention_ms))),
        (
            "  (exposed−cont.) / bound",
            Box::new(|s| {
                format!(
                    "{:.3}",
                    (s.figures.exposed_ms - s.figures.contention_ms) / s.figures.lower_bound_ms
                )
            }),
        ),
        ("optimizer compute ms", Box::new(|s| ms(s.figures.optimizer_compute_ms))),
        ("  of which Newton–Schulz", Box::new(|s| ms(s.figures.newton_schulz_ms))),
        ("unhidden comm ms", Box::new(|s| ms(s.figures.unhidden_comm_ms))),
        (
            "grad collective overlap",
            Box::new(|s| format!("{:.3}", s.figures.grad_overlap)),
        ),
        (
            "param collective overlap",
            Box::new(|s| format!("{:.3}", s.figures.param_overlap)),
        ),
        (
            "first forward wait ms",
            Box::new(|s| ms(s.figures.first_forward_wait_ms)),
        ),
        ("launches / step", Box::new(|s| s.figures.launches.to_string())),
        ("host syncs / step", Box::new(|s| s.figures.host_syncs.to_string())),
        ("host stall ms", Box::new(|s| ms(s.figures.host_stall_ms))),
        ("device GB / rank", Box::new(|s| gb(s.rank_bytes()))),
        (
            "fits the GPU",
            Box::new(|s| format!("{} ({} GB)", if s.fits { "yes" } else { "NO" }, s.memory_gb)),
        ),
    ];
    let baseline = |f: fn(&muon_opt::sim::Overhead) -> String| -> Box<dyn Fn(&Simulation) -> String> {
        Box::new(move |s| s.adamw_baseline.as_ref().map_or_else(|| "-".to_string(), f))
    };
    let baseline_rows: Vec<Row> = if sims.iter().any(|s| s.adamw_baseline.is_some()) {
        vec![
            ("AdamW iteration ms", baseline(|o| ms(o.adamw_iteration_ms))),
            ("Muon − AdamW ms", baseline(|o| ms(o.difference_ms))),
            (
                "Muon overhead",
                baseline(|o| format!("{:.2} %", 100.0 * o.muon_overhead)),
            ),
            (
                "  (Muon − AdamW) / NS",
                baseline(|o| format!("{:.3}", o.difference_over_newton_schulz)),
            ),
        ]
    } else {
        Vec::new()
    };
    let rows: Vec<Row> = rows.into_iter().chain(baseline_rows).collect();
    let mut out = String::new();
    if let Some(first) = sims.first() {
        out.push_str(&format!(
            "{} on {} at dp={}, {} tokens/GPU, NS {} {}, {} grads{}\n",
            first.model,
            first.hardware,
            first.dp,
            first.tokens_per_gpu,
            first.ns_precision,
            first.ns_method,
            first.grad_dtype,
            if first.mxfp8 { ", MXFP8 params" } else { "" }
        ));
    }
    let kinds = DeviceBytes::default().parts().map(|(kind, _)| format!("  {kind}"));
    let device_rows = kinds.iter().enumerate().map(|(k, name)| {
        let value: Box<dyn Fn(&Simulation) -> String> = Box::new(move |s| gb(s.device_bytes.parts()[k].1));
        (name.as_str(), value)
    });
    for (name, value) in rows.into_iter().chain(device_rows) {
        out.push_str(&format!("{name:<26}"));
        for s in sims {
            out.push_str(&format!("{:>16}", value(s)));
        }
        out.push('\n');
    }
    for s in sims {
        let waits: Vec<String> = s
            .figures
            .dominant_waits
            .iter()
            .map(|(k, v)| format!("{k} {v:.3} ms"))
            .collect();
        out.push_str(&format!(
            "{}: compute stream waits most on: {}\n",
            s.layout,
            waits.join(", ")
        ));
    }
    out
}

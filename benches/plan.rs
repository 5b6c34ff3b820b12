//! Planner wall time on the presets.
//!
//! `cargo bench --bench plan`. For every preset, dp ∈ {8, 64, 256} and every Muon layout,
//! prints the best of five `build_plan` runs (goal: the DeepSeek-V3-like preset at dp 256 in
//! under 200 ms) and the plan's headline figures.

use std::hint::black_box;
use std::time::{Duration, Instant};

use muon_opt::config::{Config, MuonLayout};
use muon_opt::plan::build_plan;
use muon_opt::plan::presets::{PRESET_NAMES, preset};

/// Best wall time of `f` over `reps` runs after one warm-up run.
fn best_of(reps: usize, mut f: impl FnMut()) -> Duration {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
}

fn main() {
    println!(
        "{:<18} {:>4} {:<10} {:>10} {:>10} {:>10}",
        "model", "dp", "layout", "ms", "NS/LB", "wire/LB"
    );
    for &name in PRESET_NAMES {
        let model = preset(name).expect("listed presets exist");
        for dp in [8usize, 64, 256] {
            for &muon_layout in MuonLayout::ALL {
                let cfg = Config {
                    muon_layout,
                    vocab_size: model.vocab_size,
                    ..Config::default()
                };
                let registry = model.registry(&cfg).expect("presets register");
                let run = || build_plan(registry.params(), registry.routes(), &cfg, dp).expect("presets plan");
                let time = best_of(5, || {
                    black_box(run());
                });
                let report = run().report;
                println!(
                    "{name:<18} {dp:>4} {:<10} {:>10.3} {:>10.4} {:>10.4}",
                    muon_layout.name(),
                    time.as_secs_f64() * 1e3,
                    report.ns_makespan_over_lower_bound,
                    report.wire_over_lower_bound
                );
            }
        }
    }
}

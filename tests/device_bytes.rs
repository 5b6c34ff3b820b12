//! The device bytes `muon-opt plan` reports come from the cuda translator's own allocations;
//! here they are checked against the planner's report (buffers, optimizer state per rank) and
//! against what the simulator's full run allocates.

use muon_opt::config::{Config, MuonLayout};
use muon_opt::plan::build_plan;
use muon_opt::plan::presets::preset;
use muon_opt::sim::device::{device_bytes, rank_device_bytes};
use muon_opt::sim::profile::builtin;
use muon_opt::sim::{Scenario, simulate};

#[test]
fn the_translator_allocates_what_the_plan_report_counts() {
    for name in ["gpt2-124m", "deepseek-v3-like"] {
        let model = preset(name).unwrap();
        for &muon_layout in MuonLayout::ALL {
            let cfg = Config {
                vocab_size: model.vocab_size,
                muon_layout,
                ..Config::default()
            };
            let registry = model.registry(&cfg).unwrap();
            let dp = 4;
            let plan = build_plan(registry.params(), registry.routes(), &cfg, dp).unwrap();
            let r = &plan.report;
            for rank in 0..dp {
                let d = rank_device_bytes(&plan, registry.params(), &cfg, rank).unwrap();
                let label = format!("{name} {} rank {rank}", muon_layout.name());
                assert_eq!(d.params, r.param_buffer_bytes, "{label}: param buffers");
                assert_eq!(d.grads, r.grad_buffer_bytes, "{label}: grad buffers");
                assert_eq!(
                    d.masters + d.momenta + d.adam_moments,
                    r.optimizer_state_bytes.per_rank[rank],
                    "{label}: optimizer state"
                );
                assert!(d.workspaces > 0 && d.mxfp8 == 0, "{label}: {d:?}");
                let parts = d.params + d.grads + d.masters + d.momenta + d.adam_moments + d.mxfp8 + d.workspaces;
                assert_eq!(d.total, parts, "{label}");
            }
        }
    }
}

#[test]
fn the_simulation_allocates_what_the_plan_command_reports() {
    let model = preset("gpt2-124m").unwrap();
    for mxfp8 in [false, true] {
        let scenario = Scenario {
            mxfp8,
            iterations: 2,
            ..Scenario::new(model.clone(), 4, builtin("h100-nvlink").unwrap())
        };
        let simulated = simulate(&scenario).unwrap().device_bytes;
        let cfg = Config {
            vocab_size: model.vocab_size,
            mxfp8_param_gather: mxfp8,
            ..Config::default()
        };
        let mut registry = muon_opt::model::Registry::default();
        for spec in &model.params {
            let mut spec = spec.clone();
            let (rows, cols) = spec.flat_2d();
            if mxfp8 && spec.route() == muon_opt::model::Route::Muon && rows % 32 == 0 && cols % 32 == 0 {
                spec.flags = muon_opt::model::ParamFlags(spec.flags.0 | muon_opt::model::ParamFlags::MXFP8);
            }
            registry.add(spec, &cfg).unwrap();
        }
        let plan = build_plan(registry.params(), registry.routes(), &cfg, 4).unwrap();
        let planned = device_bytes(&plan, registry.params(), &cfg).unwrap();
        assert_eq!(planned, simulated, "mxfp8 {mxfp8}");
        assert_eq!(planned.mxfp8 > 0, mxfp8);
    }
}

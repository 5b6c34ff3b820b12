//! `simulate --schedule megatron`: the same job stepped as Megatron-LM's layer-wise optimizer
//! steps it (src/sim/megatron.rs), through the same runtime, translation and cost model.

use muon_opt::backend::cuda::action::Action;
use muon_opt::config::MuonLayout;
use muon_opt::plan::presets::preset;
use muon_opt::sim::drive::{Member, RecordOptions, record_shared};
use muon_opt::sim::engine::{Class, Slice};
use muon_opt::sim::profile::builtin;
use muon_opt::sim::{ExpertParallel, Scenario, Schedule, rank_optimizers, simulate};

fn dense(model: &str, dp: usize) -> Scenario {
    Scenario::new(preset(model).unwrap(), dp, builtin("h100-nvlink").unwrap())
}

/// One MoE layer of Qwen3-30B-A3B (pipeline stage 24 of 48: 128 experts per stack) on 8 GB300
/// ranks with expert parallelism 8: 16 experts of each stack per rank.
fn moe_layer() -> Scenario {
    Scenario {
        pipeline: Some((48, 24)),
        expert_parallel: Some(ExpertParallel {
            ep: 8,
            experts_per_token: 8,
        }),
        ..Scenario::new(preset("qwen3-30b-a3b").unwrap(), 8, builtin("gb300-nvl72").unwrap())
    }
}

fn last_iteration(slices: &[Slice], iterations: usize) -> impl Iterator<Item = &Slice> {
    slices.iter().filter(move |s| s.iteration == Some(iterations - 1))
}

fn is_param_collective(s: &Slice) -> bool {
    s.class == Class::Collective && matches!(s.label.what, "broadcast" | "all-gather")
}

/// (end of the last update on the compute stream, start of the first param collective) of
/// every rank, in the last iteration.
fn updates_then_gathers(sim: &muon_opt::sim::Simulation, iterations: usize) -> Vec<(f64, f64)> {
    sim.timelines
        .iter()
        .map(|t| {
            let slices: Vec<&Slice> = last_iteration(&t.slices, iterations).collect();
            let updates = slices
                .iter()
                .filter(|s| s.class == Class::Optimizer && matches!(s.label.what, "ns gemm" | "muon apply" | "adamw"))
                .map(|s| s.end)
                .fold(f64::NEG_INFINITY, f64::max);
            let gathers = slices
                .iter()
                .filter(|s| is_param_collective(s))
                .map(|s| s.start)
                .fold(f64::INFINITY, f64::min);
            (updates, gathers)
        })
        .collect()
}

/// Megatron's all-gather starts after the whole step (`allgather_params` after
/// `step_with_ready_grads`); ours starts each bucket's as soon as its owners are done, under
/// the later buckets' updates.
#[test]
fn megatron_gathers_params_after_the_last_update_ours_under_the_updates() {
    let base = dense("llama3-8b", 8);
    let megatron = base.with_schedule(Schedule::Megatron);
    let sim = simulate(&megatron).unwrap();
    let ranks = updates_then_gathers(&sim, megatron.iterations);
    assert!(ranks.iter().all(|(u, g)| u.is_finite() && g.is_finite()));
    for (rank, &(update, gather)) in ranks.iter().enumerate() {
        assert!(
            gather >= update,
            "rank {rank}: gather at {gather} before its last update at {update}"
        );
    }
    // The same layout and overlap on our schedule: some gather runs under a later update.
    let ours = Scenario {
        schedule: Schedule::Ours,
        ..megatron.clone()
    };
    let sim = simulate(&ours).unwrap();
    let ranks = updates_then_gathers(&sim, ours.iterations);
    assert!(ranks.iter().any(|&(update, gather)| gather < update), "{ranks:?}");
}

/// Where our schedule wins by construction — the same layout, overlap, precision and params,
/// the gather pipelined behind the updates instead of after them — Megatron's iteration is
/// never shorter; and our default schedule (compact, the gathers under the next forward) is
/// faster than Megatron's on the same job.
#[test]
fn megatron_is_never_faster_where_ours_pipelines_the_gather() {
    for (model, dp) in [("gpt2-124m", 4), ("llama3-8b", 8)] {
        let base = dense(model, dp);
        let megatron = base.with_schedule(Schedule::Megatron);
        assert_eq!(megatron.layout, MuonLayout::Allreduce);
        assert!(!megatron.overlap_param_gather);
        let m = simulate(&megatron).unwrap().figures.iteration_ms;
        let same = simulate(&Scenario {
            schedule: Schedule::Ours,
            ..megatron.clone()
        })
        .unwrap()
        .figures
        .iteration_ms;
        assert!(m >= same, "{model}: megatron {m} ms, ours on its layout {same} ms");
        let ours = simulate(&base).unwrap().figures.iteration_ms;
        assert!(m > ours, "{model}: megatron {m} ms, ours {ours} ms");
    }
}

/// The batch of every Newton–Schulz GEMM the expert optimizer of rank 0 issues, run alone.
fn expert_gemm_batches(scenario: &Scenario) -> Vec<i32> {
    let setup = rank_optimizers(scenario).unwrap();
    let member: Member<'_> = setup.optimizers[1].member(0, scenario.dp);
    let order: Vec<(usize, usize)> = setup
        .order
        .iter()
        .filter(|&&(k, _)| k == 1)
        .map(|&(_, p)| (0, p))
        .collect();
    let options = RecordOptions {
        keep_actions: true,
        clips: &[],
    };
    let recorded = record_shared(&[member], &order, scenario.trainer().unwrap(), options).unwrap();
    recorded
        .actions
        .unwrap()
        .iter()
        .filter_map(|a| match a {
            Action::Gemm(g) => Some(g.batch),
            _ => None,
        })
        .collect()
}

/// Megatron orthogonalizes each expert alone (one param per expert): every Newton–Schulz
/// GEMM of ours, over a rank's experts of a stack batched, is one GEMM per expert there, over
/// the same matrices.
#[test]
fn megatron_orthogonalizes_experts_one_at_a_time() {
    let ours = moe_layer();
    let local_experts = 128 / 8;
    let megatron = ours.with_schedule(Schedule::Megatron);
    let setup = rank_optimizers(&megatron).unwrap();
    let expert_params = &setup.optimizers[1].params;
    assert!(expert_params.iter().all(|p| p.shape[0] == 1));
    // Two expert stacks per layer (the fused gate|up and the down projection).
    assert_eq!(expert_params.len(), 2 * local_experts);
    let (o, m) = (expert_gemm_batches(&ours), expert_gemm_batches(&megatron));
    assert!(!o.is_empty());
    assert_eq!(m.len(), local_experts * o.len());
    assert_eq!(
        m.iter().map(|&b| i64::from(b)).sum::<i64>(),
        o.iter().map(|&b| i64::from(b)).sum::<i64>()
    );
    // The same routed tokens: splitting the stacks changes no model compute.
    let (o, m) = (simulate(&ours).unwrap(), simulate(&megatron).unwrap());
    let rel = (m.figures.model_compute_ms / o.figures.model_compute_ms - 1.0).abs();
    assert!(
        rel < 1e-6,
        "{} against {}",
        m.figures.model_compute_ms,
        o.figures.model_compute_ms
    );
    assert!(m.figures.newton_schulz_ms >= o.figures.newton_schulz_ms);
}

fn muon_opt(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_muon-opt"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn the_command_line_takes_the_schedule_and_refuses_bad_values() {
    let out = muon_opt(&[
        "simulate",
        "--model",
        "gpt2-124m",
        "--dp",
        "4",
        "--schedule",
        "megatron",
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let runs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(runs[0]["schedule"], "megatron");
    assert_eq!(runs[0]["layout"], "allreduce");
    let named = simulate(&dense("gpt2-124m", 4).with_schedule(Schedule::Megatron)).unwrap();
    assert_eq!(runs[0]["iteration_ms"].as_f64(), Some(named.figures.iteration_ms));
    let bad = muon_opt(&["simulate", "--model", "gpt2-124m", "--dp", "4", "--schedule", "nemo"]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("--schedule") && err.contains("nemo"), "{err}");
    let layout = muon_opt(&[
        "simulate",
        "--model",
        "gpt2-124m",
        "--dp",
        "4",
        "--schedule",
        "megatron",
        "--layout",
        "padded",
    ]);
    assert!(!layout.status.success());
    let err = String::from_utf8_lossy(&layout.stderr);
    assert!(err.contains("--schedule") && err.contains("--layout"), "{err}");
}

/// NVIDIA's Qwen3-30B-A3B job on Megatron's schedule is one `simulate` command, and it is the
/// Megatron column of docs/validation.md.
#[test]
fn the_measured_job_on_megatrons_schedule_is_one_command_and_the_validation_row() {
    let out = muon_opt(&[
        "simulate",
        "--model",
        "qwen3-30b-a3b",
        "--dp",
        "8",
        "--ep",
        "8",
        "--top-k",
        "8",
        "--global-batch",
        "512",
        "--micro-batch",
        "8",
        "--seq-len",
        "4096",
        "--hardware",
        "gb300-nvl72",
        "--mxfp8",
        "--grad-dtype",
        "bf16",
        "--schedule",
        "megatron",
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let runs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ms = runs[0]["iteration_ms"].as_f64().unwrap();
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/validation.md")).unwrap();
    let row = doc
        .lines()
        .find(|l| l.starts_with("| qwen3-30b-a3b ep8 dp8 gb300, 512 x 4096 |"))
        .unwrap();
    let cells: Vec<&str> = row.split(" | ").collect();
    assert!(
        cells.iter().any(|c| c.starts_with(&format!("{ms:.1}, "))),
        "{ms:.1} ms not in {row}"
    );
}

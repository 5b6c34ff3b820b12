//! The job as trained in the simulator: a batch's micro-batches (gradient collectives in the
//! last micro-batch's backward only), causal-attention FLOPs, the 1F1B pipeline bubble, and
//! the defaults without them (8192 tokens per GPU in one micro-batch, the figures of the docs).

use muon_opt::plan::presets::preset;
use muon_opt::sim::drive::lookups;
use muon_opt::sim::engine::{Class, Slice};
use muon_opt::sim::profile::builtin;
use muon_opt::sim::{Batch, Scenario, simulate};

fn gpt2(dp: usize) -> Scenario {
    Scenario::new(preset("gpt2-124m").unwrap(), dp, builtin("h100-nvlink").unwrap())
}

fn batch(global: u64, micro: u64, seq_len: u64) -> Option<Batch> {
    Some(Batch { global, micro, seq_len })
}

#[test]
fn without_a_batch_a_rank_computes_tokens_per_gpu_in_one_micro_batch() {
    let t = gpt2(2).trainer().unwrap();
    assert_eq!((t.tokens, t.micro_batches, t.attention_params), (8192, 1, 0));
    assert_eq!(t.bubble, 0.0);
}

#[test]
fn a_batch_makes_micro_batches_with_causal_attention() {
    let s = Scenario {
        batch: batch(64, 2, 1024),
        ..gpt2(4)
    };
    assert_eq!(s.micro_batches().unwrap(), 8);
    assert_eq!(s.tokens().unwrap(), 8 * 2 * 1024);
    // GPT-2: 12 heads of 64; T · H · (d_qk + d_v) / 2 params per layer.
    assert_eq!(s.trainer().unwrap().attention_params, 1024 * 12 * 128 / 2);
    let uneven = Scenario {
        batch: batch(60, 2, 1024),
        ..gpt2(4)
    };
    let err = uneven.micro_batches().unwrap_err().to_string();
    assert!(err.contains("not a multiple"), "{err}");
}

/// The same tokens in one micro-batch with and without a batch: the attention FLOPs are
/// the model compute's only difference, 12 layers × T·H·(d_qk + d_v)/2 params beside the
/// model's matmul params (every param but the embedding lookups).
#[test]
fn attention_adds_its_flops_to_the_model_compute() {
    let plain = simulate(&Scenario {
        tokens_per_gpu: 2048,
        ..gpt2(2)
    })
    .unwrap();
    let trained = simulate(&Scenario {
        batch: batch(2, 1, 2048),
        ..gpt2(2)
    })
    .unwrap();
    assert_eq!((trained.tokens_per_gpu, trained.micro_batches), (2048, 1));
    let params = preset("gpt2-124m").unwrap().params;
    let matmul: u64 = params
        .iter()
        .zip(lookups(&params))
        .filter(|(_, lookup)| !lookup)
        .map(|(p, _)| p.numel())
        .sum();
    let attention = 12 * (2048 * 12 * 128 / 2);
    let ratio = trained.figures.model_compute_ms / plain.figures.model_compute_ms;
    let expected = (matmul + attention) as f64 / matmul as f64;
    assert!((ratio / expected - 1.0).abs() < 1e-9, "{ratio} against {expected}");
}

fn last_iteration(slices: &[Slice], iterations: usize) -> impl Iterator<Item = &Slice> {
    slices.iter().filter(move |s| s.iteration == Some(iterations - 1))
}

#[test]
fn gradient_collectives_run_in_the_last_micro_batch_only() {
    let s = Scenario {
        batch: batch(8, 1, 1024),
        ..gpt2(2)
    };
    let sim = simulate(&s).unwrap();
    assert_eq!(sim.micro_batches, 4);
    let slices: Vec<&Slice> = last_iteration(&sim.timelines[0].slices, s.iterations).collect();
    let accumulated: Vec<&&Slice> = slices
        .iter()
        .filter(|s| s.label.what == "model (accumulated micro-batches)")
        .collect();
    assert_eq!(accumulated.len(), 1);
    let grads: Vec<&&Slice> = slices
        .iter()
        .filter(|s| s.class == Class::Collective && matches!(s.label.what, "reduce" | "reduce-scatter"))
        .collect();
    assert!(!grads.is_empty());
    assert!(grads.iter().all(|g| g.start >= accumulated[0].end));
}

#[test]
fn the_pipeline_bubble_is_p_minus_one_over_m_v_of_the_ideal_compute() {
    let s = Scenario {
        pipeline: Some((4, 1)),
        virtual_stages: 2,
        batch: batch(32, 1, 1024),
        ..gpt2(2)
    };
    assert_eq!(s.micro_batches().unwrap(), 16);
    assert_eq!(s.pipeline_bubble().unwrap(), 3.0 / 32.0);
    let sim = simulate(&s).unwrap();
    assert_eq!(sim.pipeline_bubble, 3.0 / 32.0);
    let (mut bubble, mut ideal) = (0.0, 0.0);
    for slice in last_iteration(&sim.timelines[0].slices, s.iterations) {
        match (slice.class, slice.label.what) {
            (_, "pipeline bubble") => bubble += slice.end - slice.start,
            (Class::Forward | Class::Backward, _) => ideal += slice.end - slice.start,
            _ => {}
        }
    }
    assert!((bubble / ideal - 3.0 / 32.0).abs() < 1e-9, "{}", bubble / ideal);
    let unbatched = Scenario { batch: None, ..s };
    assert_eq!(unbatched.pipeline_bubble().unwrap(), 0.0);
    let flat = Scenario {
        pipeline: None,
        virtual_stages: 2,
        ..gpt2(2)
    };
    assert!(flat.pipeline_bubble().is_err());
}

/// `simulate` with the batch, expert and pipeline flags is the named job: NVIDIA's
/// Qwen3-30B-A3B run as one command gives the named scenario's figures.
#[test]
fn the_command_line_runs_the_named_job() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_muon-opt"))
        .args([
            "simulate",
            "--model",
            "qwen3-30b-a3b",
            "--dp",
            "8",
            "--ep",
            "8",
            "--top-k",
            "8",
        ])
        .args(["--global-batch", "512", "--micro-batch", "8", "--seq-len", "4096"])
        .args([
            "--hardware",
            "gb300-nvl72",
            "--mxfp8",
            "--grad-dtype",
            "bf16",
            "--ownership",
            "balanced",
        ])
        .arg("--json")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let runs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let run = &runs[0];
    assert_eq!(
        (run["tokens_per_gpu"].as_u64(), run["micro_batches"].as_u64()),
        (Some(512 * 4096 / 8), Some(8))
    );
    let job = muon_opt::sim::scenarios::job("qwen3-30b-a3b ep8 dp8 gb300, 512 x 4096")
        .unwrap()
        .scenario(true)
        .unwrap();
    let named = simulate(&Scenario {
        ownership: muon_opt::config::MuonOwnership::Balanced,
        ..job
    })
    .unwrap();
    assert_eq!(run["iteration_ms"].as_f64(), Some(named.figures.iteration_ms));
    let uneven = std::process::Command::new(env!("CARGO_BIN_EXE_muon-opt"))
        .args([
            "simulate",
            "--model",
            "gpt2-124m",
            "--dp",
            "3",
            "--global-batch",
            "8",
            "--seq-len",
            "1024",
        ])
        .output()
        .unwrap();
    assert!(!uneven.status.success());
    assert!(String::from_utf8_lossy(&uneven.stderr).contains("not a multiple"));
}

/// Issue 39: every named job at its published batch also runs at a small batch (8192 tokens
/// per GPU, one micro-batch) on the same model, cluster and parallelism, so the sensitivity
/// of Muon's share to the batch shows in docs/performance.md.
#[test]
fn every_job_at_its_published_batch_has_a_small_batch_twin() {
    use muon_opt::sim::scenarios::JOBS;
    let published: Vec<_> = JOBS.iter().filter(|j| j.batch.is_some()).collect();
    assert_eq!(published.len(), 7);
    for job in published {
        let twin = JOBS.iter().find(|t| {
            t.batch.is_none()
                && (t.model, t.hardware, t.dp, t.tp, t.pipeline, t.virtual_stages, t.sharded)
                    == (
                        job.model,
                        job.hardware,
                        job.dp,
                        job.tp,
                        job.pipeline,
                        job.virtual_stages,
                        job.sharded,
                    )
                && t.expert_parallel == job.expert_parallel
        });
        let twin = twin.unwrap_or_else(|| panic!("{}: no small-batch twin", job.name));
        assert!(
            job.name.starts_with(&format!("{}, ", twin.name)),
            "{} / {}",
            job.name,
            twin.name
        );
    }
}

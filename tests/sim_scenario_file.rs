//! Scenario files (`muon-opt simulate --scenario FILE.json`): every job option the command
//! line takes, written once per job, simulates exactly as the same flags do.

use std::process::Command;

fn muon_opt(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_muon-opt"))
        .args(args)
        .output()
        .unwrap()
}

/// Writes `text` to a file of this test's own and returns its path.
fn scenario_file(test: &str, text: &str) -> String {
    let path = std::env::temp_dir().join(format!("muon_opt_{test}_{}.json", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// The runs of each job of a file, as `--json` prints them.
fn file_runs(path: &str) -> Vec<(String, serde_json::Value)> {
    let out = muon_opt(&["simulate", "--scenario", path, "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let jobs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    jobs.as_array()
        .unwrap()
        .iter()
        .map(|j| (j["name"].as_str().unwrap().to_string(), j["runs"].clone()))
        .collect()
}

fn cli_runs(flags: &[&str]) -> serde_json::Value {
    let mut args = vec!["simulate"];
    args.extend_from_slice(flags);
    args.push("--json");
    let out = muon_opt(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Each job of a file is the command line with the same options, figure for figure: a dense
/// job that sets every option a dense model takes (but `mxfp8`, refused with sharded params)
/// to a value other than its default, an MoE job at NVIDIA's Qwen3-30B-A3B batch with MXFP8 on
/// Megatron's schedule (`schedule` per job), and a job of `model` and `dp` alone (the file's
/// defaults are the command line's). `experts_as_params` is the one option left out: it
/// registers an MoE model's experts one by one, too many params for a quick test.
#[test]
fn every_job_of_a_file_simulates_as_its_flags_do() {
    let path = scenario_file(
        "every_job",
        r#"{"jobs": [
          {"name": "dense, every option", "model": "gpt2-124m", "dp": 4, "hardware": "h100-ib",
           "baseline": "adamw", "layout": "compact_rooted", "ownership": "contiguous",
           "network": "14,45", "ns_precision": "f32", "ns_method": "gram",
           "global_batch": 64, "micro_batch": 2, "seq_len": 1024, "pp": 2, "pp_stage": 1,
           "vpp": 2, "steps": 2, "norm_group": 16, "tp": 2, "tp_mode": "blockwise",
           "qk_clip": true, "grad_dtype": "bf16",
           "sharding": {"param_sharding": "sharded", "reshard_after_forward": false, "prefetch": 2}},
          {"name": "qwen3 as NVIDIA ran it, Megatron's schedule", "model": "qwen3-30b-a3b",
           "dp": 8, "hardware": "gb300-nvl72", "ep": 8, "top_k": 8, "global_batch": 512,
           "micro_batch": 8, "seq_len": 4096, "mxfp8": true, "grad_dtype": "bf16",
           "baseline": "adamw", "schedule": "megatron"},
          {"name": "defaults", "model": "gpt2-124m", "dp": 2}
        ]}"#,
    );
    let runs = file_runs(&path);
    let flags = [
        "--model gpt2-124m --dp 4 --hardware h100-ib --baseline adamw --layout compact_rooted \
         --ownership contiguous --network 14,45 --ns-precision f32 --ns-method gram \
         --global-batch 64 --micro-batch 2 --seq-len 1024 --pp 2 --pp-stage 1 --vpp 2 --steps 2 \
         --norm-group 16 --tp 2 --tp-mode blockwise --qk-clip --grad-dtype bf16 \
         --param-sharding sharded --reshard-after-forward false --prefetch 2",
        "--model qwen3-30b-a3b --dp 8 --hardware gb300-nvl72 --ep 8 --top-k 8 --global-batch 512 \
         --micro-batch 8 --seq-len 4096 --mxfp8 --grad-dtype bf16 --baseline adamw \
         --schedule megatron",
        "--model gpt2-124m --dp 2",
    ];
    assert_eq!(runs.len(), flags.len());
    for ((name, file), flags) in runs.iter().zip(flags) {
        let flags: Vec<&str> = flags.split_whitespace().collect();
        assert_eq!(file, &cli_runs(&flags), "{name}");
    }
    let megatron = &runs[1].1[0];
    assert_eq!(megatron["schedule"].as_str(), Some("megatron"));
    assert!(megatron["adamw_baseline"].is_object());
    std::fs::remove_file(path).unwrap();
}

/// The file is checked as the command line checks its flags: an unknown key is named, a job
/// needs a name, a model and dp, and options that go together go together.
#[test]
fn a_bad_scenario_file_is_refused_naming_what_is_wrong() {
    let cases = [
        (
            r#"{"jobs": [{"name": "a", "model": "gpt2-124m", "dp": 2, "top-k": 8}]}"#,
            "unknown field `top-k`",
        ),
        (
            r#"{"jobs": [{"model": "gpt2-124m", "dp": 2}]}"#,
            "every job needs a `name`",
        ),
        (
            r#"{"jobs": [{"name": "a", "model": "gpt2-124m"}]}"#,
            "scenario job 'a': needs `dp`",
        ),
        (
            r#"{"jobs": [{"name": "a", "model": "gpt2-124m", "dp": 2, "global_batch": 8}]}"#,
            "`global_batch` and `seq_len` go together",
        ),
        (
            r#"{"jobs": [{"name": "a", "model": "gpt2-124m", "dp": 2, "schedule": "megatron", "layout": "padded"}]}"#,
            "`schedule: megatron` sets the layout",
        ),
        (r#"{"jobs": []}"#, "no jobs"),
    ];
    for (i, (text, message)) in cases.iter().enumerate() {
        let path = scenario_file(&format!("bad_{i}"), text);
        let out = muon_opt(&["simulate", "--scenario", &path]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(message), "{text}: {stderr}");
        std::fs::remove_file(path).unwrap();
    }
}

/// The example file of docs/simulate.md runs, and its Megatron-schedule job is the row of
/// docs/validation.md for the same job.
#[test]
fn the_example_of_simulate_md_runs() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/simulate.md")).unwrap();
    let start = doc.find("```json\n{\"jobs\"").unwrap() + "```json\n".len();
    let end = start + doc[start..].find("```").unwrap();
    let path = scenario_file("simulate_md", &doc[start..end]);
    let runs = file_runs(&path);
    assert_eq!(runs.len(), 2);
    let megatron_ms = runs[0].1[0]["iteration_ms"].as_f64().unwrap();
    let validation = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/validation.md")).unwrap();
    let row = validation
        .lines()
        .find(|l| l.starts_with("| qwen3-30b-a3b ep8 dp8 gb300, 512 x 4096 |"))
        .unwrap();
    assert!(
        row.contains(&format!("| {megatron_ms:.1}, ")),
        "{megatron_ms:.1} ms not in {row}"
    );
    std::fs::remove_file(path).unwrap();
}

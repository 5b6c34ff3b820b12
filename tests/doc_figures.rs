//! Figures that README.md and docs/ quote from `muon-opt simulate` (outside the generated
//! docs/performance.md): each is produced by the command the text names, run here, and must
//! appear in the text as the command prints it (rounded as quoted).

mod support;

use std::collections::HashMap;
use std::process::Command;

use muon_opt::sim::profile::builtin;
use support::docs::assert_quotes;

/// The `label   value` lines `muon-opt simulate ARGS` prints, by label.
fn simulate(args: &str) -> HashMap<String, f64> {
    let out = Command::new(env!("CARGO_BIN_EXE_muon-opt"))
        .arg("simulate")
        .args(args.split_whitespace())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "simulate {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| {
            let (label, value) = line.trim_end().rsplit_once(' ')?;
            Some((label.trim().to_string(), value.trim_end_matches('%').parse().ok()?))
        })
        .collect()
}

/// A run's iteration ms, exposed optimizer ms and device GB per rank.
fn iteration_exposed_memory(run: &HashMap<String, f64>) -> (f64, f64, f64) {
    (
        run["iteration ms"],
        run["exposed optimizer ms"],
        run["device GB / rank"],
    )
}

#[test]
fn simulate_md_quotes_the_tensor_parallel_modes() {
    let (dp, tp) = (8u32, 8u32);
    // The data-parallel ring's nodes: a node holds `dp_ranks_per_node / tp` of its ranks.
    let per_node = builtin("h100-nvlink").unwrap().dp_ranks_per_node;
    let nodes = |tp: u32| match dp.div_ceil((per_node / tp).max(1)) {
        1 => "one node".to_string(),
        n => format!("{n} nodes"),
    };
    let mut quote = format!(
        "llama3-8b, dp {dp} × tp {tp} ({} GPUs, the data-parallel ring across {}), h100-nvlink \
         (`muon-opt simulate --model llama3-8b --dp {dp} --tp {tp} --tp-mode MODE`):",
        dp * tp,
        nodes(tp)
    );
    for mode in ["blockwise", "duplicated", "distributed"] {
        let run = simulate(&format!("--model llama3-8b --dp {dp} --tp {tp} --tp-mode {mode}"));
        let (iteration, exposed, gb) = iteration_exposed_memory(&run);
        quote += &if mode == "blockwise" {
            format!(" {mode} {iteration:.1} ms per iteration ({exposed:.1} exposed, {gb:.2} GB per rank)")
        } else {
            format!(", {mode} {iteration:.1} ({exposed:.1}, {gb:.2} GB)")
        };
    }
    let (iteration, exposed, gb) = iteration_exposed_memory(&simulate(&format!("--model llama3-8b --dp {dp}")));
    quote += &format!(
        "; without TP (`--dp {dp}` alone, {}) {iteration:.1} ({exposed:.1}, {gb:.2} GB).",
        nodes(1)
    );
    assert_quotes("docs/simulate.md", &[quote]);
}

#[test]
fn design_md_and_the_readme_quote_the_cost_of_qk_clip() {
    let (off, on) = (
        simulate("--model llama3-70b --dp 8 --tp 8 --tp-mode blockwise"),
        simulate("--model llama3-70b --dp 8 --tp 8 --tp-mode blockwise --qk-clip"),
    );
    let (a, b) = (off["iteration ms"], on["iteration ms"]);
    let (added, percent) = (b - a, (b - a) / a * 100.0);
    let launches = on["launches / step"] - off["launches / step"];
    assert_quotes(
        "docs/design.md",
        &[format!(
            "from {a:.2} to {b:.2} ms (+{added:.2} ms, {percent:.2} %), {launches} more launches"
        )],
    );
    assert_quotes(
        "README.md",
        &[format!(
            "llama3-70b tp 8 dp 8 simulated +{added:.2} ms ({percent:.2} %) \
             (`muon-opt simulate --model llama3-70b --dp 8 --tp 8 --tp-mode blockwise [--qk-clip]`;"
        )],
    );
}

#[test]
fn readme_quotes_mxfp8_memory_and_contiguous_ownership() {
    let (plain, mxfp8) = (
        simulate("--model llama3-8b --dp 8"),
        simulate("--model llama3-8b --dp 8 --mxfp8"),
    );
    let ib = "--model llama3-70b --dp 64 --tp 8 --tp-mode blockwise --hardware h100-ib --grad-dtype bf16 --baseline adamw --ownership";
    let (balanced, contiguous) = (
        simulate(&format!("{ib} balanced")),
        simulate(&format!("{ib} contiguous")),
    );
    assert_quotes(
        "README.md",
        &[
            format!(
                "{:.2} GB per rank without MXFP8, {:.2} GB with it",
                plain["device GB / rank"], mxfp8["device GB / rank"]
            ),
            format!(
                "Muon − AdamW {:.1} → {:.1} ms",
                balanced["Muon − AdamW ms"], contiguous["Muon − AdamW ms"]
            ),
        ],
    );
}

/// The row of `muon-opt simulate --scenario JOB --ownership OWNERSHIP` with MXFP8 off: its
/// AdamW ms, Muon ms and busiest Newton–Schulz ms columns.
fn scenario_row(job: &str, ownership: &str) -> (f64, f64, f64) {
    let out = Command::new(env!("CARGO_BIN_EXE_muon-opt"))
        .args(["simulate", "--scenario", job, "--ownership", ownership])
        .output()
        .unwrap();
    assert!(out.status.success(), "{job}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let row = text
        .lines()
        .find(|l| l.contains("| off |"))
        .unwrap_or_else(|| panic!("{job}: no MXFP8-off row in\n{text}"));
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    let number = |i: usize| {
        cells[i]
            .parse::<f64>()
            .unwrap_or_else(|_| panic!("{job}: column {i} of {row}"))
    };
    (number(5), number(6), number(9))
}

#[test]
fn design_md_quotes_contiguous_ownership_on_the_named_jobs() {
    let job = "llama3-70b tp8 dp64 ib";
    let ((adamw, balanced, ns_balanced), (_, contiguous, ns_contiguous)) =
        (scenario_row(job, "balanced"), scenario_row(job, "contiguous"));
    let mut figures = vec![format!(
        "its iteration from {balanced:.1} to {contiguous:.1} ms (AdamW: {adamw:.1}), at {:.2} × balanced's busiest Newton–Schulz ({ns_balanced:.1} → {ns_contiguous:.1} ms)",
        ns_contiguous / ns_balanced
    )];
    for (job, quoted) in [
        ("llama3-70b tp8 dp8 ib", "llama3-70b TP=8 dp=8 InfiniBand"),
        ("llama3-8b dp64 nvlink", "llama3-8b dp=64 NVLink"),
        ("llama3-8b dp8 nvlink", "llama3-8b dp=8 NVLink"),
        ("deepseek-v3-like pp16 ep64 dp64 nvlink", "deepseek-v3-like"),
    ] {
        let (b, c) = (scenario_row(job, "balanced").1, scenario_row(job, "contiguous").1);
        figures.push(format!("{quoted} {b:.1} → {c:.1} ms"));
    }
    assert_quotes("docs/design.md", &figures);
}

#[test]
fn newton_schulz_md_and_the_readme_quote_the_simulated_methods() {
    let (mut rows, mut readme) = (Vec::new(), Vec::new());
    for args in [
        "--model llama3-8b --dp 8",
        "--model llama3-70b --tp 8 --tp-mode blockwise --dp 8 --hardware h100-ib",
        "--model deepseek-v3-like --dp 64",
    ] {
        let mut ns = Vec::new();
        for method in ["standard", "gram"] {
            let run = simulate(&format!("{args} --ns-method {method}"));
            ns.push(run["of which Newton–Schulz"]);
            rows.push(format!(
                "| {method} | {:.2} | {:.2} |",
                run["of which Newton–Schulz"], run["exposed optimizer ms"]
            ));
        }
        if args == "--model llama3-8b --dp 8" {
            readme.push(format!(
                "llama3-8b dp 8 simulated NS {:.1} → {:.1} ms against the standard iteration \
                 (`muon-opt simulate {args} --ns-method standard\\|gram`;",
                ns[0], ns[1]
            ));
        }
    }
    assert_quotes("docs/newton-schulz.md", &rows);
    assert_quotes("README.md", &readme);
}

/// docs/design.md §4's cost of wrong network figures: llama3-70b TP=8 on InfiniBand at dp 8 and
/// 64, planned with the profile's figures, with none, with NVLink's and with a 10 GB/s ring.
#[test]
fn design_md_quotes_what_wrong_network_figures_cost() {
    let mut quote = String::new();
    for dp in [8, 64] {
        let run = |network: &str| {
            simulate(&format!(
                "--model llama3-70b --tp 8 --tp-mode blockwise --dp {dp} --norm-group {} --hardware h100-ib --grad-dtype bf16 {network}",
                8 * dp
            ))["iteration ms"]
        };
        let profile = run("");
        let percent = |ms: f64| format!("{ms:.1} ({:+.1} %)", (ms / profile - 1.0) * 100.0);
        quote += &format!(
            "dp {dp}: the profile's figures (14 µs, 45 GB/s) {profile:.1}; nothing declared {}; NVLink's (3.4 µs, 360 GB/s) {}; a 10 GB/s ring at 14 µs {}{}",
            percent(run("--network none")),
            percent(run("--network 3.4,360")),
            percent(run("--network 14,10")),
            if dp == 8 { ". " } else { "." }
        );
    }
    assert_quotes("docs/design.md", &[quote]);
}

/// docs/validation.md is what `muon-opt simulate --validation` prints: the published
/// measurements beside the simulated predictions, regenerated here.
#[test]
fn validation_md_is_what_simulate_validation_prints() {
    let out = Command::new(env!("CARGO_BIN_EXE_muon-opt"))
        .args(["simulate", "--validation"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed = String::from_utf8(out.stdout).unwrap();
    let committed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/validation.md")).unwrap();
    assert_eq!(
        printed, committed,
        "docs/validation.md is stale: regenerate it with `muon-opt simulate --validation > docs/validation.md`"
    );
    for job in [
        "kimi-k2 pp4 vpp4 ep64 dp64 gb300, 4096 x 4096",
        "qwen3-30b-a3b ep8 dp8 gb300, 512 x 4096",
    ] {
        assert!(printed.contains(&format!("| {job} |")), "{job}");
    }
    assert!(
        printed.contains("| 2.14 % |") && printed.contains("| 3.94 % |"),
        "{printed}"
    );
}

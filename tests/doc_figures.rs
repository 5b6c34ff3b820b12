//! Figures that README.md and docs/ quote from `muon-opt simulate` (outside the generated
//! docs/performance.md): each is produced by the command the text names, run here, and must
//! appear in the text as the command prints it (rounded as quoted).

use std::collections::HashMap;
use std::process::Command;

fn read(doc: &str) -> String {
    std::fs::read_to_string(format!("{}/{doc}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

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

fn assert_quotes(doc: &str, figures: &[String]) {
    let text = read(doc);
    for figure in figures {
        assert!(text.contains(figure.as_str()), "{doc} does not quote '{figure}'");
    }
}

#[test]
fn simulate_md_quotes_the_tensor_parallel_modes() {
    let mut figures = Vec::new();
    for (mode, first) in [("blockwise", true), ("duplicated", false), ("distributed", false)] {
        let run = simulate(&format!("--model llama3-8b --dp 8 --tp 8 --tp-mode {mode}"));
        let (iteration, exposed, gb) = (
            run["iteration ms"],
            run["exposed optimizer ms"],
            run["device GB / rank"],
        );
        figures.push(if first {
            format!("{mode} {iteration:.1} ms per\niteration ({exposed:.1} exposed, {gb:.2} GB per\nrank)")
        } else {
            format!("{mode} {iteration:.1} ({exposed:.1}, {gb:.2} GB)")
        });
    }
    let dense = simulate("--model llama3-8b --dp 8");
    figures.push(format!(
        "{:.1} ({:.1}, {:.2} GB)",
        dense["iteration ms"], dense["exposed optimizer ms"], dense["device GB / rank"]
    ));
    let text = read("docs/simulate.md").replace(['\n', ' '], "");
    for figure in figures {
        let figure = figure.replace(['\n', ' '], "");
        assert!(text.contains(&figure), "docs/simulate.md does not quote '{figure}'");
    }
}

#[test]
fn design_md_quotes_the_cost_of_qk_clip() {
    let (off, on) = (
        simulate("--model llama3-70b --dp 8 --tp 8"),
        simulate("--model llama3-70b --dp 8 --tp 8 --qk-clip"),
    );
    let (a, b) = (off["iteration ms"], on["iteration ms"]);
    let launches = on["launches / step"] - off["launches / step"];
    assert_quotes(
        "docs/design.md",
        &[format!(
            "from {a:.2} to {b:.2} ms (+{:.2} ms, {:.2} %), {launches} more launches",
            b - a,
            (b - a) / a * 100.0
        )],
    );
}

#[test]
fn readme_quotes_mxfp8_memory_and_contiguous_ownership() {
    let (plain, mxfp8) = (
        simulate("--model llama3-8b --dp 8"),
        simulate("--model llama3-8b --dp 8 --mxfp8"),
    );
    let ib = "--model llama3-70b --dp 64 --tp 8 --hardware h100-ib --grad-dtype bf16 --baseline adamw --ownership";
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
    (number(4), number(5), number(8))
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
    let text = read("docs/design.md").replace(['\n', ' '], "");
    for figure in figures {
        assert!(
            text.contains(&figure.replace(['\n', ' '], "")),
            "docs/design.md does not quote '{figure}'"
        );
    }
}

#[test]
fn newton_schulz_md_quotes_the_simulated_methods() {
    let mut rows = Vec::new();
    for args in [
        "--model llama3-8b --dp 8",
        "--model llama3-70b --tp 8 --dp 8 --hardware h100-ib",
        "--model deepseek-v3-like --dp 64",
    ] {
        for method in ["standard", "gram"] {
            let run = simulate(&format!("{args} --ns-method {method}"));
            rows.push(format!(
                "| {method} | {:.2} | {:.2} |",
                run["of which Newton–Schulz"], run["exposed optimizer ms"]
            ));
        }
    }
    assert_quotes("docs/newton-schulz.md", &rows);
}

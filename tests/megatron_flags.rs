//! `docs/megatron.md` maps Megatron-LM's flags to our config fields. Its table is checked on
//! both sides: every default it states for a config field is the code's default, so the table
//! cannot drift from the library; and every Muon flag of Megatron-LM — the snapshot
//! `tests/data/megatron_flags.json` vendors with its commit (`scripts/megatron_flags.py`
//! regenerates it) — has a row stating Megatron's default, so a flag Megatron adds or a default
//! it changes fails here until the table says what the library does with it.

use muon_opt::config::Config;
use serde_json::Value;

/// The text between the first pair of backticks of a table cell.
fn code(cell: &str) -> Option<&str> {
    let start = cell.find('`')? + 1;
    let len = cell[start..].find('`')?;
    Some(&cell[start..start + len])
}

/// Every text between backticks in a cell.
fn codes(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// The flag rows of the table, as trimmed cells (`cells[1]` the flag, `[2]` Megatron's default,
/// `[3]` our field, `[4]` our default).
fn rows() -> Vec<Vec<String>> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/megatron.md")).unwrap();
    doc.lines()
        .filter(|l| l.starts_with("| `--") || l.starts_with("| Newton"))
        .map(|row| row.split('|').map(|c| c.trim().to_string()).collect())
        .collect()
}

fn snapshot() -> Value {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/megatron_flags.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// A *Megatron default* cell as the snapshot writes it: its first word, backticks removed
/// (`off (split)` is `off`).
fn stated_default(cell: &str) -> String {
    cell.replace('`', "")
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_string()
}

#[test]
fn the_megatron_table_states_the_code_defaults() {
    // Through text, so an f32 reads as its shortest form (0.95, not 0.949999988079071).
    let defaults: Value = serde_json::from_str(&serde_json::to_string(&Config::default()).unwrap()).unwrap();
    let mut checked = Vec::new();
    for cells in rows() {
        let (Some(field), Some(ours)) = (code(&cells[3]), code(&cells[4])) else {
            continue;
        };
        let Some(actual) = defaults.get(field) else {
            continue;
        };
        let stated: Value = serde_json::from_str(ours).unwrap_or_else(|e| panic!("{field}: '{ours}' is not JSON: {e}"));
        let same = match (stated.as_f64(), actual.as_f64()) {
            (Some(a), Some(b)) => (a - b).abs() <= 1e-12 * b.abs(),
            _ => stated == *actual,
        };
        assert!(
            same,
            "docs/megatron.md says {field} defaults to {ours}; the code says {actual}"
        );
        checked.push(field.to_string());
    }
    for field in [
        "muon_momentum",
        "muon_nesterov",
        "muon_ns_precision",
        "muon_ns_method",
        "muon_coefficient_set",
        "clip_grad",
        "bucket_size",
        "muon_layout",
        "muon_tp_mode",
        "weight_decay_rule",
    ] {
        assert!(
            checked.iter().any(|f| f == field),
            "the table lost its row for {field}: {checked:?}"
        );
    }
}

/// The snapshot's flags (and `--optimizer`'s choices) that no row of `rows` names: a row whose
/// first cell names the flag, or `--optimizer CHOICE`, or the `--optimizer` row listing the
/// choice. Every row that does name a flag must state the snapshot's default.
fn missing_rows(rows: &[Vec<String>], snapshot: &Value) -> Vec<String> {
    let commit = snapshot["commit"].as_str().unwrap();
    let named =
        |flag: &str| -> Vec<&Vec<String>> { rows.iter().filter(|cells| code(&cells[1]) == Some(flag)).collect() };
    let mut missing = Vec::new();
    for entry in snapshot["flags"].as_array().unwrap() {
        let flag = entry["flag"].as_str().unwrap();
        let default = entry["default"].as_str().unwrap();
        let found = named(flag);
        let choices: Vec<&str> = entry["choices"]
            .as_array()
            .map_or(Vec::new(), |c| c.iter().map(|c| c.as_str().unwrap()).collect());
        if found.is_empty() && choices.is_empty() {
            missing.push(flag.to_string());
        }
        for choice in choices {
            let own = named(&format!("{flag} {choice}"));
            if own.is_empty() && !found.iter().any(|cells| codes(&cells[1]).contains(&choice)) {
                missing.push(format!("{flag} {choice}"));
            }
            for cells in own {
                assert_eq!(stated_default(&cells[2]), default, "{flag} {choice}");
            }
        }
        for cells in found {
            assert_eq!(
                stated_default(&cells[2]),
                default,
                "docs/megatron.md states {} as {flag}'s Megatron default; Megatron-LM {commit} has {default}",
                cells[2]
            );
        }
    }
    missing
}

/// Every flag of the vendored snapshot has a row stating Megatron's default (every choice of
/// `--optimizer` too, `--optimizer adaptive_muon` among them), and no row names a `--muon-*` or
/// `--qk-clip*` flag Megatron-LM does not have.
#[test]
fn every_megatron_muon_flag_has_a_row_with_megatrons_default() {
    let snapshot = snapshot();
    let commit = snapshot["commit"].as_str().unwrap();
    assert_eq!(commit.len(), 40, "the snapshot names its Megatron-LM commit");
    assert!(snapshot["source"].as_str().unwrap().ends_with("NVIDIA/Megatron-LM"));
    let flags = snapshot["flags"].as_array().unwrap();
    let known: Vec<&str> = flags.iter().map(|e| e["flag"].as_str().unwrap()).collect();
    for flag in [
        "--muon-tp-mode",
        "--muon-fp32-matmul-prec",
        "--qk-clip-threshold",
        "--decoupled-lr",
        "--optimizer",
    ] {
        assert!(known.contains(&flag), "the snapshot lost {flag}: {known:?}");
    }
    let rows = rows();
    let missing = missing_rows(&rows, &snapshot);
    assert!(
        missing.is_empty(),
        "docs/megatron.md has no row for these Megatron-LM flags ({commit}): {missing:?}; add a row saying what the library does with each (or that it does not implement it)"
    );
    for cells in &rows {
        let Some(flag) = code(&cells[1]) else { continue };
        let name = flag.split_whitespace().next().unwrap_or(flag);
        if name.starts_with("--muon-") || name.starts_with("--qk-clip") {
            assert!(
                known.contains(&name),
                "docs/megatron.md has a row for {name}, which Megatron-LM {commit} does not define"
            );
        }
    }
}

/// The check fails for a flag without a row: the table less its `--muon-tp-mode` row, and less
/// its `--optimizer adaptive_muon` row, each misses exactly that flag.
#[test]
fn a_flag_without_a_row_is_found_missing() {
    let (rows, snapshot) = (rows(), snapshot());
    for (left_out, expected) in [
        ("--muon-tp-mode", "--muon-tp-mode"),
        ("--optimizer adaptive_muon", "--optimizer adaptive_muon"),
    ] {
        let fewer: Vec<Vec<String>> = rows
            .iter()
            .filter(|cells| code(&cells[1]) != Some(left_out))
            .cloned()
            .collect();
        assert_eq!(fewer.len() + 1, rows.len(), "one row names {left_out}");
        assert_eq!(missing_rows(&fewer, &snapshot), [expected]);
    }
}

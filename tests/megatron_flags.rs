//! `docs/megatron.md` maps Megatron-LM's flags to our config fields: every default it states
//! for a config field is the code's default, so the table cannot drift from the library.

use muon_opt::config::Config;
use serde_json::Value;

/// The text between the first pair of backticks of a table cell.
fn code(cell: &str) -> Option<&str> {
    let start = cell.find('`')? + 1;
    let len = cell[start..].find('`')?;
    Some(&cell[start..start + len])
}

#[test]
fn the_megatron_table_states_the_code_defaults() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/megatron.md")).unwrap();
    // Through text, so an f32 reads as its shortest form (0.95, not 0.949999988079071).
    let defaults: Value = serde_json::from_str(&serde_json::to_string(&Config::default()).unwrap()).unwrap();
    let mut checked = Vec::new();
    for row in doc
        .lines()
        .filter(|l| l.starts_with("| `--") || l.starts_with("| Newton"))
    {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (Some(field), Some(ours)) = (code(cells[3]), code(cells[4])) else {
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
        "clip_grad",
        "bucket_size",
        "muon_layout",
        "muon_tp_mode",
    ] {
        assert!(
            checked.iter().any(|f| f == field),
            "the table lost its row for {field}: {checked:?}"
        );
    }
}

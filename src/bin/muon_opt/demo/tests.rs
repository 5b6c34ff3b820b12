//! A short demo on 2 ranks trains both variants (and so passed its check that every rank ends
//! with bit-identical params) and routes the hidden matrices as registered.

use muon_opt::model::Route;

use super::model::{FC1, FC2};
use super::{DemoConfig, DemoResult, RunResult, report, run_demo};

/// The hidden matrices: Muon's in the Muon run, AdamW's (flagged `NO_MUON`) in the other.
const HIDDEN_MATRICES: [usize; 2] = [FC1, FC2];

fn short_demo() -> DemoResult {
    let cfg = DemoConfig {
        dp: 2,
        steps: 12,
        ..DemoConfig::default()
    };
    run_demo(&cfg, &|_| {}).unwrap()
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

fn assert_trained(run: &RunResult) {
    let name = run.variant.name();
    assert_eq!(run.losses.len(), 12, "{name}");
    assert!(
        run.losses.iter().chain(&run.grad_norms).all(|v| v.is_finite()),
        "{name}: {run:?}"
    );
    let (first, last) = (mean(&run.losses[..3]), mean(&run.losses[9..]));
    assert!(last < 0.8 * first, "{name}: training loss {first} -> {last}");
    assert!(
        run.eval_loss_final < 0.8 * run.eval_loss_initial,
        "{name}: held-out loss {} -> {}",
        run.eval_loss_initial,
        run.eval_loss_final
    );
}

#[test]
fn short_demo_trains_both_variants_identically_on_every_rank() {
    let result = short_demo();
    for run in [&result.muon, &result.adamw] {
        assert_trained(run);
    }
    assert_ne!(
        result.muon.losses, result.adamw.losses,
        "the runs used different optimizers"
    );
}

#[test]
fn muon_run_routes_hidden_matrices_to_muon_and_adamw_run_routes_everything_to_adamw() {
    let result = short_demo();
    for route in &result.muon.routes {
        let expected = if HIDDEN_MATRICES.contains(&(route.id as usize)) {
            Route::Muon
        } else {
            Route::Adamw
        };
        assert_eq!(route.route, expected, "muon run: {}", route.name);
    }
    assert!(
        result.adamw.routes.iter().all(|r| r.route == Route::Adamw),
        "{:?}",
        result.adamw.routes
    );
    for &p in &HIDDEN_MATRICES {
        let placement = &result.muon.plan.params[p];
        assert_eq!(placement.route, Route::Muon);
        assert!(placement.single_owner().is_some(), "{p} is owned whole by one rank");
        assert_eq!(result.adamw.plan.params[p].route, Route::Adamw);
    }
    assert_eq!(result.adamw.plan.report.elements.muon, 0);
}

#[test]
fn reports_render_every_section() {
    let result = short_demo();
    let text = report::text(&result);
    for section in [
        "Routing",
        "Training loss",
        "Plan (rank 0)",
        "AdamW-only run",
        "Step time",
        "wait_params",
    ] {
        assert!(text.contains(section), "missing '{section}' in\n{text}");
    }
    let json: serde_json::Value = serde_json::from_str(&report::json(&result)).unwrap();
    assert_eq!(json["muon"]["losses"].as_array().map(Vec::len), Some(12));
    assert_eq!(json["adamw"]["variant"], "adamw_only");
    assert!(json["muon"]["timings"]["step"].is_number());
}

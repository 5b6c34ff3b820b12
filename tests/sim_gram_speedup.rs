//! The Gram Newton–Schulz rows of `docs/validation.md`: every published speed-up is cited and
//! set beside the simulator's prediction for it, and the prediction behaves as the iteration's
//! flops say it must.

use muon_opt::config::NsMethod;
use muon_opt::model::MatrixShape;
use muon_opt::sim::gram_speedup::{GRAM_SPEEDUPS, largest_predicted_speedup, one_matrix_ns_ms, preset_matrices};
use muon_opt::sim::profile::builtin;

fn speedup(rows: u64, cols: u64, profile: &str) -> f64 {
    let hw = builtin(profile).unwrap();
    let shape = MatrixShape { rows, cols };
    one_matrix_ns_ms(shape, &hw, NsMethod::Standard).unwrap() / one_matrix_ns_ms(shape, &hw, NsMethod::Gram).unwrap()
}

/// Each claim names its source with the commit read, and docs/validation.md has one row per
/// profile it names with the prediction the simulator gives now.
#[test]
fn every_published_gram_speedup_has_a_cited_row_per_profile() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/validation.md")).unwrap();
    let shapes = preset_matrices().unwrap();
    assert!(!GRAM_SPEEDUPS.is_empty());
    for claim in GRAM_SPEEDUPS {
        assert!(
            claim.source.contains("github.com/") && claim.source.contains(" at "),
            "{}",
            claim.source
        );
        assert!(!claim.profiles.is_empty());
        for profile in claim.profiles {
            let (shape, predicted) = largest_predicted_speedup(&shapes, &builtin(profile).unwrap()).unwrap();
            let row = format!(
                "| {} | {} | up to {:.2} | {profile} | {predicted:.2} ({} × {}) | {:.2} |",
                claim.source,
                claim.measured,
                claim.speedup,
                shape.rows,
                shape.cols,
                predicted / claim.speedup
            );
            assert!(doc.contains(&row), "no row {row}");
        }
    }
}

/// A square matrix takes the standard iteration (no gain), and the gain grows with the aspect
/// ratio towards the flop ratio's 2.5: llama3-8b's MLP (3.5 : 1) against an MLA up-projection
/// (64 : 1).
#[test]
fn the_predicted_speedup_grows_with_the_aspect_ratio() {
    for profile in ["h100-nvlink", "b200-nvlink"] {
        let square = speedup(4096, 4096, profile);
        let mlp = speedup(4096, 14336, profile);
        let wide = speedup(512, 32768, profile);
        assert_eq!(square, 1.0, "{profile}");
        assert!(1.3 < mlp && mlp < wide && wide < 2.5, "{profile}: {mlp} {wide}");
    }
}

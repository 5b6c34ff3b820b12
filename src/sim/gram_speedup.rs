//! Published speed-ups of the Gram Newton–Schulz iteration over the standard one, and the
//! simulator's prediction for the same claim (`muon-opt simulate --validation`,
//! `docs/validation.md`).
//!
//! The prediction prices one matrix on one GPU (dp 1, the library's defaults: 5 quintic steps,
//! a bf16 iterate) through the same translation and cost model as every simulated job, once
//! with `muon_ns_method = standard` and once with `gram`, and reads the Newton–Schulz ms of
//! each ([`super::metrics::Figures::newton_schulz_ms`]: the GEMMs and the Muon kernels of the
//! matrix, momentum and update included).

use std::collections::BTreeSet;

use crate::config::{Config, Dtype, NsMethod};
use crate::error::Result;
use crate::model::{MatrixShape, ParamSpec, Route};
use crate::plan::presets::{ModelDesc, PRESET_NAMES, preset};

use super::profile::Hardware;
use super::{Scenario, simulate};

/// A published speed-up, standard Newton–Schulz time over Gram Newton–Schulz time.
#[derive(Debug, Clone, Copy)]
pub struct GramSpeedup {
    /// Who measured it, and where it is published (with the commit read).
    pub source: &'static str,
    /// What was measured, as published: device, shapes, dtype.
    pub measured: &'static str,
    /// Standard / Gram time; for an "up to" claim, the largest.
    pub speedup: f64,
    /// The built-in profiles of the devices named.
    pub profiles: &'static [&'static str],
}

/// Every published Gram Newton–Schulz speed-up with a figure in reachable text. Dao AI Lab's
/// per-shape timings are a figure (an image) in the README and the blog post, so only the
/// headline the text states is here; DeepSpeed's pull request #7953 (which made Gram its
/// default) gives its timings in a part of the description not reachable from here.
pub const GRAM_SPEEDUPS: &[GramSpeedup] = &[GramSpeedup {
    source: "Dao AI Lab (J. Zhang, N. Amsel, B. Chen, T. Dao), github.com/Dao-AILab/gram-newton-schulz \
             README at 7d2dc813 and pypi.org/project/gram-newton-schulz: \"up to 2x faster Newton-Schulz \
             with Gram Newton-Schulz and symmetric CuTeDSL GEMM kernels\"",
    measured: "H100 or B200/B300 (the devices the package requires), fp16 iterate, 5 steps, one restart; \
               shapes not given in text",
    speedup: 2.0,
    profiles: &["h100-nvlink", "b200-nvlink"],
}];

/// The simulator's Newton–Schulz ms of one `shape` matrix on `hardware`, with `method`.
pub fn one_matrix_ns_ms(shape: MatrixShape, hardware: &Hardware, method: NsMethod) -> Result<f64> {
    let model = ModelDesc {
        name: format!("one {} x {} matrix", shape.rows, shape.cols),
        vocab_size: 0,
        params: vec![ParamSpec::new("w", &[shape.rows, shape.cols], Dtype::Bf16)],
    };
    let scenario = Scenario {
        ns_method: method,
        ..Scenario::new(model, 1, hardware.clone())
    };
    Ok(simulate(&scenario)?.figures.newton_schulz_ms)
}

/// Every distinct Muon matrix the presets orthogonalize (each fused component, each expert),
/// as `rows ≤ cols` (a matrix and its transpose cost the same).
pub fn preset_matrices() -> Result<Vec<MatrixShape>> {
    let mut shapes = BTreeSet::new();
    for name in PRESET_NAMES {
        let model = preset(name).expect("every preset name has a preset");
        let cfg = Config {
            vocab_size: model.vocab_size,
            ..Config::default()
        };
        let registry = model.registry(&cfg)?;
        let muon = registry
            .params()
            .iter()
            .zip(registry.routes())
            .filter(|(_, r)| **r == Route::Muon);
        for (spec, _) in muon {
            for c in spec.unit_components() {
                shapes.insert((c.rows.min(c.cols), c.rows.max(c.cols)));
            }
        }
    }
    Ok(shapes
        .into_iter()
        .map(|(rows, cols)| MatrixShape { rows, cols })
        .collect())
}

/// The simulator's largest standard / Gram ratio over `shapes` on `hardware`, and its shape.
pub fn largest_predicted_speedup(shapes: &[MatrixShape], hardware: &Hardware) -> Result<(MatrixShape, f64)> {
    let mut best: Option<(MatrixShape, f64)> = None;
    for &shape in shapes {
        let standard = one_matrix_ns_ms(shape, hardware, NsMethod::Standard)?;
        let gram = one_matrix_ns_ms(shape, hardware, NsMethod::Gram)?;
        let speedup = standard / gram;
        if best.is_none_or(|(_, b)| speedup > b) {
            best = Some((shape, speedup));
        }
    }
    Ok(best.expect("the presets have Muon matrices"))
}

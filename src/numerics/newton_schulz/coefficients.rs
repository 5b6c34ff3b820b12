//! The published Newton–Schulz coefficient sets, one `(a, b, c)` triple per step.

use crate::config::CoefficientSet;

/// Keller Jordan's tuned quintic triples, one per step (modded-nanogpt `train_gpt_medium.py`,
/// also Emerging-Optimizers' `quintic`).
const QUINTIC: [[f32; 3]; 5] = [
    [4.0848, -6.8946, 2.9270],
    [3.9505, -6.3029, 2.6377],
    [3.7418, -5.5913, 2.3037],
    [2.8769, -3.1427, 1.2046],
    [2.8366, -3.0525, 1.2012],
];

/// The original Muon triple, used at every step.
const SIMPLE: [[f32; 3]; 1] = [[3.4445, -4.7750, 2.0315]];

/// Polar Express degree-5 coefficients before the safety factor, as published by Amsel,
/// Persson, Musco, Gower, "The Polar Express: Optimal Matrix Sign Methods and Their Application
/// to the Muon Algorithm" (arXiv:2505.16932, Algorithm 1), and in their reference code
/// github.com/NoahAmsel/PolarExpress `polar_express/basic.py` (`optimal_composition(l=1e-3,
/// num_iters=8, safety_factor_eps=1e-2, cushion=0.02)`).
const POLAR_EXPRESS_RAW: [[f64; 3]; 8] = [
    [8.28721201814563, -23.595886519098837, 17.300387312530933],
    [4.107059111542203, -2.9478499167379106, 0.5448431082926601],
    [3.9486908534822946, -2.908902115962949, 0.5518191394370137],
    [3.3184196573706015, -2.488488024314874, 0.51004894012372],
    [2.300652019954817, -1.6689039845747493, 0.4188073119525673],
    [1.891301407787398, -1.2679958271945868, 0.37680408948524835],
    [1.8750014808534479, -1.2500016453999487, 0.3750001645474248],
    [1.875, -1.25, 0.375],
];

/// The reference code's safety factor `s`: every triple but the last becomes
/// `(a/s, b/s³, c/s⁵)`, i.e. `p(x/s)`, so values slightly above 1 are not amplified.
const POLAR_EXPRESS_SAFETY: f64 = 1.01;

/// [`POLAR_EXPRESS_RAW`] with the safety factor applied in f64, then rounded to f32.
const POLAR_EXPRESS: [[f32; 3]; 8] = polar_express_with_safety();

const fn polar_express_with_safety() -> [[f32; 3]; 8] {
    let s = POLAR_EXPRESS_SAFETY;
    let mut out = [[0.0f32; 3]; 8];
    let mut i = 0;
    while i < POLAR_EXPRESS_RAW.len() {
        let [a, b, c] = POLAR_EXPRESS_RAW[i];
        out[i] = if i + 1 < POLAR_EXPRESS_RAW.len() {
            [
                (a / s) as f32,
                (b / (s * s * s)) as f32,
                (c / (s * s * s * s * s)) as f32,
            ]
        } else {
            [a as f32, b as f32, c as f32]
        };
        i += 1;
    }
    out
}

/// The `(a, b, c)` triple of step `step` (0-based) of a coefficient set.
///
/// - `Quintic`: the five tuned triples of docs/design.md; steps past the fifth repeat the fifth.
/// - `QuinticCyclic`: the same five triples cycled, step k using triple k mod 5, as
///   Emerging-Optimizers (and so Megatron-LM) does; the two agree for `steps <= 5`.
/// - `Simple`: `(3.4445, −4.7750, 2.0315)` at every step.
/// - `PolarExpress`: the eight published triples with the reference code's safety factor 1.01
///   applied to the first seven (`a/1.01, b/1.01³, c/1.01⁵`, computed in f64, rounded to f32);
///   steps past the eighth repeat the eighth, `(1.875, −1.25, 0.375)`, as the reference code
///   does. Emerging-Optimizers lists the same safety-scaled values rounded to four decimals.
///   The reference code also divides the input by `1.01·‖U‖_F + 1e-7`; this library keeps its
///   one normalization `max(‖U‖_F, 1e-7)` for every set.
pub fn ns_coefficients(set: CoefficientSet, step: usize) -> [f32; 3] {
    let table: &[[f32; 3]] = match set {
        CoefficientSet::Quintic => &QUINTIC,
        CoefficientSet::QuinticCyclic => return QUINTIC[step % QUINTIC.len()],
        CoefficientSet::Simple => &SIMPLE,
        CoefficientSet::PolarExpress => &POLAR_EXPRESS,
    };
    table[step.min(table.len() - 1)]
}

//! The published Newton–Schulz coefficient sets, one `(a, b, c)` triple per step, and how a
//! run of more steps than a set has continues it.

use crate::config::{CoefficientSet, MAX_CUSTOM_NS_COEFFICIENTS};

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

/// Emerging-Optimizers' `cans` set (Grishina, Smirnov, Rakhuba, "Accelerating Newton–Schulz
/// Iteration for Orthogonalization via Chebyshev-type Polynomials", arXiv:2506.10935), as
/// listed in `emerging_optimizers/orthogonalized_optimizers/muon_utils.py` `_COEFFICIENT_SETS`
/// (NVIDIA-NeMo/Emerging-Optimizers v0.4.0, commit 925e1bfe, unchanged at fd772926 of
/// 2026-08-20; also in v0.3.0).
const CANS: [[f32; 3]; 5] = [
    [8.4703, -25.1081, 18.6293],
    [4.1828, -3.1087, 0.5806],
    [3.9619, -2.9541, 0.5630],
    [3.2866, -2.4647, 0.5074],
    [2.2737, -1.6447, 0.4162],
];

/// Emerging-Optimizers' `aol` set (same file and versions; its source is
/// thib-s/flash-newton-schulz `newton_schulz_triton.py`).
const AOL: [[f32; 3]; 4] = [
    [4.0098, -7.0585, 2.4635],
    [3.4585, -5.5479, 2.5959],
    [2.7573, -3.2939, 1.4254],
    [2.7215, -3.0494, 1.3169],
];

/// Emerging-Optimizers' `deepseekv4` set (same file and versions, from the DeepSeek-V4
/// report): the original Muon triple for eight steps, then `(2, −1.5, 0.5)` for two.
const DEEPSEEK_V4: [[f32; 3]; 10] = [
    SIMPLE[0],
    SIMPLE[0],
    SIMPLE[0],
    SIMPLE[0],
    SIMPLE[0],
    SIMPLE[0],
    SIMPLE[0],
    SIMPLE[0],
    [2.0, -1.5, 0.5],
    [2.0, -1.5, 0.5],
];

/// Emerging-Optimizers' `cubic5` set (v0.4.0, commit a4c2c262 "Add Muon Cubic5 coefficients";
/// arXiv:2606.00371): five cubic steps, `c = 0`, a fixed five-step schedule (its
/// `newton_schulz` refuses any other step count, as [`crate::config::Config::validate`]
/// does).
const CUBIC5: [[f32; 3]; 5] = [
    [3.3656576, -3.3420992, 0.0],
    [2.5744352, -1.4957376, 0.0],
    [2.5368962, -1.431257, 0.0],
    [2.4418906, -1.276404, 0.0],
    [2.2230472, -0.963065, 0.0],
];

/// The five-step Polar Express of microsoft/dion `dion/polar_express.py`
/// `_POLAR_EXPRESS_COEFFS` (commit 0a059a45, 2026-08-07; "num_iters=5, safety_factor=2e-2,
/// cushion=2", the safety factor 1.02 applied to all but the last triple, the values
/// modded-nanogpt uses), as f64 literals rounded to f32 as torch rounds a Python float
/// scalar for an f32 product. dion also divides the input by `1.02·‖G‖_F + ε`; this library
/// keeps its one normalization `max(‖U‖_F, muon_ns_eps)` for every set.
const POLAR_EXPRESS_5_F64: [[f64; 3]; 5] = [
    [8.156554524902461, -22.48329292557795, 15.878769915207462],
    [4.042929935166739, -2.808917465908714, 0.5000178451051316],
    [3.8916678022926607, -2.772484153217685, 0.5060648178503393],
    [3.285753657755655, -2.3681294933425376, 0.46449024233003106],
    [2.3465413258596377, -1.7097828382687081, 0.42323551169305323],
];

const POLAR_EXPRESS_5: [[f32; 3]; 5] = to_f32(POLAR_EXPRESS_5_F64);

const fn to_f32<const N: usize>(table: [[f64; 3]; N]) -> [[f32; 3]; N] {
    let mut out = [[0.0f32; 3]; N];
    let mut i = 0;
    while i < N {
        out[i] = [table[i][0] as f32, table[i][1] as f32, table[i][2] as f32];
        i += 1;
    }
    out
}

/// A caller's coefficient table (the `custom` set) held by value, so [`NsOptions`](super::NsOptions) stays
/// `Copy`: up to [`MAX_CUSTOM_NS_COEFFICIENTS`] triples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CustomCoefficients {
    len: usize,
    triples: [[f32; 3]; MAX_CUSTOM_NS_COEFFICIENTS],
}

impl CustomCoefficients {
    /// No table (every set but `custom`).
    pub const NONE: CustomCoefficients = CustomCoefficients {
        len: 0,
        triples: [[0.0; 3]; MAX_CUSTOM_NS_COEFFICIENTS],
    };

    /// The first [`MAX_CUSTOM_NS_COEFFICIENTS`] triples of `table` (validation refuses a
    /// longer one).
    pub fn new(table: &[[f32; 3]]) -> Self {
        let mut out = Self::NONE;
        out.len = table.len().min(MAX_CUSTOM_NS_COEFFICIENTS);
        out.triples[..out.len].copy_from_slice(&table[..out.len]);
        out
    }

    /// The triples.
    pub fn as_slice(&self) -> &[[f32; 3]] {
        &self.triples[..self.len]
    }
}

/// How a run of more steps than a table has continues it.
#[derive(Clone, Copy)]
enum Continue {
    /// Repeat the last triple (Emerging-Optimizers' `repeat_last`).
    RepeatLast,
    /// Start over (Emerging-Optimizers' `cycle`).
    Cycle,
}

/// The `(a, b, c)` triple of step `step` (0-based) of a coefficient set; `custom` is the
/// caller's table, read only for [`CoefficientSet::Custom`] (validation refuses that set
/// without a table).
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
/// - `Cans`, `DeepseekV4`: Emerging-Optimizers' tables, the last triple repeated past their
///   end (its `repeat_last_types`); `Aol`: its table cycled (its default mode).
/// - `Cubic5`, `PolarExpress5`: fixed five-step schedules (validation refuses other step
///   counts).
/// - `Custom`: the caller's table, cycled past its end as Emerging-Optimizers cycles a
///   `custom` set.
pub fn ns_coefficients(set: CoefficientSet, custom: &[[f32; 3]], step: usize) -> [f32; 3] {
    let (table, mode): (&[[f32; 3]], Continue) = match set {
        CoefficientSet::Quintic => (&QUINTIC, Continue::RepeatLast),
        CoefficientSet::QuinticCyclic => (&QUINTIC, Continue::Cycle),
        CoefficientSet::Simple => (&SIMPLE, Continue::RepeatLast),
        CoefficientSet::PolarExpress => (&POLAR_EXPRESS, Continue::RepeatLast),
        CoefficientSet::Cans => (&CANS, Continue::RepeatLast),
        CoefficientSet::Aol => (&AOL, Continue::Cycle),
        CoefficientSet::Cubic5 => (&CUBIC5, Continue::RepeatLast),
        CoefficientSet::DeepseekV4 => (&DEEPSEEK_V4, Continue::RepeatLast),
        CoefficientSet::PolarExpress5 => (&POLAR_EXPRESS_5, Continue::RepeatLast),
        CoefficientSet::Custom => (custom, Continue::Cycle),
    };
    let index = match mode {
        Continue::RepeatLast => step.min(table.len().saturating_sub(1)),
        Continue::Cycle => step % table.len().max(1),
    };
    // Only an empty custom table (refused by validation) has no triple at `index`.
    table.get(index).copied().unwrap_or_default()
}

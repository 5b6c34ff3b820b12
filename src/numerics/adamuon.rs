//! AdaMuon: the element-wise second-moment normalization of an orthogonalized Muon update
//! (`muon_variant = adamuon`), as Emerging-Optimizers' `AdaptiveMuon` computes it with
//! `moment2_method="adamuon"` (github.com/NVIDIA-NeMo/Emerging-Optimizers, v0.3.0 = commit
//! b309e2f0, the version Megatron-LM d98e8a64 pins; `orthogonalized_optimizers/adaptive_muon.py`,
//! `_init_group` and `_apply_moment2_normalization`). It is Megatron-LM's default
//! `adaptive_muon_moment2_method` (`megatron/core/optimizer/optimizer_config.py`), after the
//! AdaMuon paper (arXiv 2507.11005).
//!
//! For the orthogonalized update `X` (`rows × cols`, before the Muon scale) and the state `V`
//! of `rows × cols` f32 values (starting at 0), element by element in f32:
//! `V = β2·V + (1−β2)·(x·x)` (`1−β2` one f32 subtraction; the EMA of
//! `moment2.lerp_(orth_grad.square(), 1 − beta2)`, no bias correction), then
//! `x ← x / (√V + ε)` (`orth_grad / (moment2.sqrt() + eps)`). The update is then scaled and
//! applied as Muon's ([`crate::numerics::muon`]); unlike NorMuon, no norm is matched.
//!
//! torch's `lerp_` with a weight below ½ computes `V + w·(x² − V)`, which differs from
//! `β2·V + (1−β2)·x²` by f32 rounding only (`tests/numerics_adamuon_peer.rs`).

use crate::bail;
use crate::error::Result;
use crate::numerics::adaptive::AdaptiveOptions;

/// One element: updates its second moment `v` with the orthogonalized value `x` and returns
/// the normalized value (the device's `muon_apply` computes the same f32 operations).
#[inline]
pub fn normalize_element(x: f32, v: &mut f32, opts: &AdaptiveOptions) -> f32 {
    *v = opts.beta2 * *v + (1.0 - opts.beta2) * (x * x);
    x / (v.sqrt() + opts.eps)
}

/// The module's normalization of `x` (`rows × cols`, row-major) in place, updating `moment2`
/// (`rows × cols` values, the same order).
///
/// # Errors
/// `InvalidArgument` if a slice has the wrong length; nothing changes then.
pub fn normalize(x: &mut [f32], rows: usize, cols: usize, moment2: &mut [f32], opts: &AdaptiveOptions) -> Result<()> {
    if x.len() != rows * cols || moment2.len() != x.len() {
        bail!(
            InvalidArgument,
            "adamuon: {} values and {} second-moment values for a {rows}×{cols} matrix (expected {} of each)",
            x.len(),
            moment2.len(),
            rows * cols
        );
    }
    for (x, v) in x.iter_mut().zip(moment2.iter_mut()) {
        *x = normalize_element(*x, v, opts);
    }
    Ok(())
}

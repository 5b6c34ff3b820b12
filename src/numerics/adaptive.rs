//! The second moments of Muon's adaptive variants (`muon_variant` normuon and adamuon,
//! Emerging-Optimizers' `AdaptiveMuon` and Megatron-LM's `--optimizer adaptive_muon`): both
//! normalize the orthogonalized update by an EMA of its squares before the Muon scale, and
//! differ in what that EMA is kept of ([`crate::numerics::normuon`]: one value per line of
//! the longer side; [`crate::numerics::adamuon`]: one value per element).

use crate::config::MuonVariant;
use crate::error::Result;
use crate::numerics::{adamuon, normuon};

/// The adaptive variants' constants (`adaptive_muon_beta2`, `adaptive_muon_eps`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveOptions {
    pub beta2: f32,
    pub eps: f32,
}

/// The second-moment values `variant` keeps for one `rows × cols` matrix (0 for standard
/// Muon).
pub fn moment2_values(variant: MuonVariant, rows: usize, cols: usize) -> usize {
    match variant {
        MuonVariant::Standard => 0,
        MuonVariant::Normuon => normuon::lines(rows, cols),
        MuonVariant::Adamuon => rows * cols,
    }
}

/// Normalizes the orthogonalized `rows × cols` update `x` (row-major) in place by `variant`'s
/// second moment `moment2` ([`moment2_values`] values), updating it; standard Muon leaves both
/// alone.
///
/// # Errors
/// `InvalidArgument` if a slice has the wrong length; nothing changes then.
pub fn normalize(
    variant: MuonVariant,
    x: &mut [f32],
    rows: usize,
    cols: usize,
    moment2: &mut [f32],
    opts: &AdaptiveOptions,
) -> Result<()> {
    match variant {
        MuonVariant::Standard => Ok(()),
        MuonVariant::Normuon => normuon::normalize(x, rows, cols, moment2, opts),
        MuonVariant::Adamuon => adamuon::normalize(x, rows, cols, moment2, opts),
    }
}

//! Where `step` spends its time (host wall clock), for the demo's breakdown.

use crate::error::Result;

/// Host wall-clock seconds spent inside `step`, summed over steps, by part. On the host
/// backend every part runs inside the call; on an asynchronous backend these are launch times.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct StepProfile {
    /// Waiting for the gradient collectives (and launching those not yet started).
    pub grad_collectives: f64,
    /// Local squared norms and the scalar all-reduce.
    pub grad_norm: f64,
    /// Muon updates (momentum, Newton–Schulz, apply).
    pub muon: f64,
    /// AdamW updates.
    pub adamw: f64,
    /// Writing new values (master → param dtype or staging).
    pub casts: f64,
    /// Launching the param collectives (and waiting for them without overlap_param_gather).
    pub param_collectives: f64,
}

pub(super) fn timed<T>(total: &mut f64, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let start = std::time::Instant::now();
    let result = f();
    *total += start.elapsed().as_secs_f64();
    result
}

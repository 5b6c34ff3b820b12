//! QK-clip requests on a finalized optimizer (docs/design.md §14).

use super::Optimizer;
use crate::error::Result;
use crate::schedule::QkClipRequest;

impl Optimizer {
    /// Asks the next step to clip each request's attention matrix with threshold `tau` and
    /// exponent `alpha` ([`crate::schedule::Runtime::request_qk_clip`]); every rank makes the
    /// same requests. Nothing is requested when any request is refused.
    pub fn qk_clip(&mut self, requests: &[QkClipRequest], tau: f32, alpha: f32) -> Result<()> {
        self.with_runtime("qk_clip", |rt| rt.request_qk_clip(requests, tau, alpha))
    }

    /// Whether QK-clip maxima are read as device pointers (the cuda backend) rather than host
    /// pointers.
    pub fn qk_maxima_on_device(&self) -> bool {
        self.init_on_device()
    }
}

//! The argument of [`super::Op::QkClip`].

use super::Span;
use crate::numerics::qk_clip::QkRowMap;

/// Compute stream: QK-clip of one owned attention matrix's fp32 master, right after its update
/// and before its cast ([`crate::numerics::qk_clip::qk_clip`]). It runs on a skipped step too
/// (Megatron-LM clips after every `optimizer.step()`); the momentum is not touched.
#[derive(Debug, Clone, PartialEq)]
pub struct QkClipJob {
    /// The master (`map.rows() · cols` elements, row-major).
    pub master: Span,
    pub cols: usize,
    pub map: QkRowMap,
    /// `map.heads()` per-head maxima of the pre-softmax logits.
    pub maxima: QkMaxima,
    pub tau: f32,
    pub alpha: f32,
}

/// Where a [`QkClipJob`]'s maxima are.
#[derive(Debug, Clone, PartialEq)]
pub enum QkMaxima {
    /// Values read by the host when the clip was requested (host backend).
    Host(Vec<f32>),
    /// `map.heads()` f32 values at this address of the backend's memory (device memory on
    /// the cuda backend, host memory on the host backend), read on the compute stream when
    /// the job runs: the caller keeps them valid and unchanged until then.
    Device(u64),
}

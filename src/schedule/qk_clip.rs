//! QK-clip requests: validated when the caller makes them, applied by the next step on each
//! param's owner right after its Muon update and before its cast, so the clipped master reaches
//! every rank's model-dtype copy (and its MXFP8 copy, requantized) through the step's own param
//! collective — no pass and no collective of its own (docs/design.md §14).

use std::collections::BTreeMap;

use super::Runtime;
use crate::backend::ops::{QkClipJob, QkMaxima, Span};
use crate::bail;
use crate::error::Result;
use crate::model::Route;
use crate::numerics::qk_clip::{QkHeads, QkRowMap, check_scalars};

/// One param's clip as the caller asks for it.
#[derive(Debug, Clone, PartialEq)]
pub struct QkClipRequest {
    pub param: u32,
    pub heads: QkHeads,
    pub maxima: QkMaxima,
}

/// A validated request, waiting for the next step.
#[derive(Debug, Clone, PartialEq)]
struct Pending {
    map: QkRowMap,
    maxima: QkMaxima,
    tau: f32,
    alpha: f32,
}

/// The requests of the coming step, by param.
#[derive(Debug, Default)]
pub struct QkClips(BTreeMap<u32, Pending>);

impl Runtime {
    /// Asks the next step to clip each request's param with threshold `tau` and exponent
    /// `alpha` (every rank makes the same requests; only the owner does the work). All
    /// requests are checked before any is kept: on an error nothing is requested. A param may
    /// be requested once per step.
    pub fn request_qk_clip(&mut self, requests: &[QkClipRequest], tau: f32, alpha: f32) -> Result<()> {
        if let Err(msg) = check_scalars(tau, alpha) {
            bail!(InvalidArgument, "qk_clip: {msg}");
        }
        let mut accepted = Vec::with_capacity(requests.len());
        for (i, req) in requests.iter().enumerate() {
            let Some(spec) = self.params.get(req.param as usize) else {
                bail!(
                    InvalidArgument,
                    "qk_clip: clips[{i}].param_id {} is not a registered param",
                    req.param
                )
            };
            let name = &spec.name;
            let placement = &self.plan.params[req.param as usize];
            if placement.route != Route::Muon || spec.shape.len() != 2 {
                bail!(
                    InvalidArgument,
                    "qk_clip: clips[{i}] param '{name}' is not an attention matrix: QK-clip takes a 2-D Muon-routed Q, K, fused QKV or MLA projection (route {}, shape {:?})",
                    placement.route.name(),
                    spec.shape
                );
            }
            let matrix = spec.unit_matrix();
            let map = match req.heads.row_map(matrix.rows) {
                Ok(map) => map,
                Err(msg) => bail!(InvalidArgument, "qk_clip: clips[{i}] param '{name}': {msg}"),
            };
            if let QkMaxima::Host(values) = &req.maxima {
                if values.len() != map.heads() {
                    bail!(
                        InvalidArgument,
                        "qk_clip: clips[{i}] param '{name}': {} maxima for {} heads",
                        values.len(),
                        map.heads()
                    );
                }
                if let Some(h) = values.iter().position(|v| v.is_nan()) {
                    bail!(
                        InvalidArgument,
                        "qk_clip: clips[{i}] param '{name}': max_logits[{h}] is NaN"
                    );
                }
            }
            if self.qk_clips.0.contains_key(&req.param) || requests[..i].iter().any(|r| r.param == req.param) {
                bail!(
                    InvalidArgument,
                    "qk_clip: clips[{i}] param '{name}' already has a clip for this step"
                );
            }
            accepted.push((
                req.param,
                Pending {
                    map,
                    maxima: req.maxima.clone(),
                    tau,
                    alpha,
                },
            ));
        }
        self.qk_clips.0.extend(accepted);
        Ok(())
    }

    /// Params with a clip waiting for the next step.
    pub fn pending_qk_clips(&self) -> usize {
        self.qk_clips.0.len()
    }

    /// The clip of the owned unit of `param` whose master is `master`, if one was requested.
    pub(super) fn qk_clip_job(&self, param: u32, master: Span) -> Option<QkClipJob> {
        let pending = self.qk_clips.0.get(&param)?;
        Some(QkClipJob {
            master,
            cols: self.params[param as usize].unit_matrix().cols as usize,
            map: pending.map.clone(),
            maxima: pending.maxima.clone(),
            tau: pending.tau,
            alpha: pending.alpha,
        })
    }

    /// The step has enqueued every requested clip.
    pub(super) fn clear_qk_clips(&mut self) {
        self.qk_clips.0.clear();
    }
}

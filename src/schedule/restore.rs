//! What a checkpoint load needs from the runtime: the owned ranges, replacing the owned state
//! and the step count, and bringing every rank's param buffer back in line with the masters.

use super::{Ev, OwnedState, Runtime, event};
use crate::backend::ops::StreamKind;
use crate::bail;
use crate::config::Config;
use crate::error::Result;
use crate::model::ParamSpec;
use crate::plan::ElemRange;

impl Runtime {
    /// The registered params, in registration order.
    pub fn params(&self) -> &[ParamSpec] {
        &self.params
    }

    /// The configuration this runtime runs with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// True from the first `grad_ready` of an iteration until its `step`.
    pub fn iteration_in_progress(&self) -> bool {
        self.ready.iter().any(|&r| r) || self.launched.iter().any(|&l| l)
    }

    /// Param id and element range inside the param of every piece of state this rank owns, in
    /// the order of [`Runtime::owned_state`]: Muon units first, then AdamW pieces.
    pub fn owned_ranges(&self) -> Vec<(u32, ElemRange)> {
        let muon = self.layout.muon.iter().map(|slot| {
            let offset = self.plan.params[slot.unit.param as usize].offset;
            (slot.unit.param, slot.unit.range.shifted_down(offset))
        });
        let adamw = self
            .layout
            .adamw
            .iter()
            .map(|slot| (slot.piece.param, slot.piece.param_range));
        muon.chain(adamw).collect()
    }

    /// Replaces this rank's masters and optimizer state with `pieces` (exactly the pieces of
    /// [`Runtime::owned_ranges`], in that order, with the moments of [`Runtime::owned_state`])
    /// and the step count with `steps`, then re-synchronizes every param buffer
    /// ([`Runtime::resync_params`]; collective). Nothing changes when `pieces` do not fit.
    pub fn load_owned_state(&mut self, steps: u64, pieces: &[OwnedState]) -> Result<()> {
        let ranges = self.owned_ranges();
        if pieces.len() != ranges.len() {
            bail!(
                Internal,
                "load: {} state pieces for {} owned ranges",
                pieces.len(),
                ranges.len()
            );
        }
        let moments = |i: usize| match self.layout.muon.get(i) {
            Some(slot) => 1 + usize::from(slot.moment2.1 > 0),
            None => 2,
        };
        for (i, (piece, &(param, range))) in pieces.iter().zip(&ranges).enumerate() {
            let fits = piece.param == param
                && piece.range == range
                && piece.moments.len() == moments(i)
                && std::iter::once(&piece.master)
                    .chain(&piece.moments)
                    .all(|v| v.len() as u64 == range.len());
            if !fits {
                bail!(
                    Internal,
                    "load: state piece {i} (param {}, {:?}) does not fit owned range (param {param}, {range:?})",
                    piece.param,
                    piece.range
                );
            }
        }
        self.backend.synchronize()?;
        let (muon, adamw) = pieces.split_at(self.layout.muon.len());
        for (slot, piece) in self.layout.muon.clone().iter().zip(muon) {
            self.backend.upload(slot.master(), &piece.master)?;
            self.backend.upload(slot.momentum(), &piece.moments[0])?;
            if let Some(items) = piece.moments.get(1) {
                let spec = &self.params[slot.unit.param as usize];
                let values = super::state::moment2_from_items(spec, self.cfg.muon_variant, items);
                self.backend.upload(slot.moment2(), &values)?;
            }
        }
        for (slot, piece) in self.layout.adamw.clone().iter().zip(adamw) {
            self.backend.upload(slot.master(), &piece.master)?;
            self.backend.upload(slot.exp_avg(), &piece.moments[0])?;
            self.backend.upload(slot.exp_avg_sq(), &piece.moments[1])?;
        }
        self.backend.set_step_count(steps)?;
        self.resync_params()
    }

    /// Collective: every owner writes its masters into the param buffer (bf16 staging for
    /// gathered MXFP8 params) exactly as a step does, the same param collectives as after a
    /// step follow, and the call returns once they completed on this rank. With sharded params
    /// the owners write their persistent storage and every bucket is released, so the next
    /// gather of each brings the loaded values.
    pub fn resync_params(&mut self) -> Result<()> {
        self.backend.synchronize()?;
        for slot in self.layout.muon.clone() {
            let destination = self.param_destination(slot.unit.param, slot.unit.bucket, slot.unit.range)?;
            self.write_master(slot.master(), destination)?;
        }
        for slot in self.layout.adamw.clone() {
            let destination = self.param_destination(slot.piece.param, slot.bucket, slot.piece.buffer_range)?;
            self.write_master(slot.master(), destination)?;
        }
        if let Some(sharded) = &mut self.sharded {
            sharded.release_all();
            return self.backend.synchronize();
        }
        for b in 0..self.plan.buckets.len() {
            self.record(StreamKind::Compute, event(b, Ev::ParamReady))?;
            self.launch_param_sync(b, b)?;
        }
        self.backend.synchronize()
    }
}

//! Read access to a rank's state and storage, for tests, tools, views and checkpoints.

use crate::backend::ops::Span;
use crate::error::Result;
use crate::numerics::mxfp8::{Output, dequantize_rowwise};
use crate::plan::ElemRange;

use super::Runtime;

impl Runtime {
    /// Rowwise data, rowwise scales, columnwise data, columnwise scales of an MXFP8 param.
    pub fn mxfp8_addresses(&self, p: usize) -> Option<[*mut u8; 4]> {
        self.backend.mxfp8_addresses(p as u32)
    }

    /// Address of param `p`'s gradient (`grad`) or model-dtype storage; an MXFP8 param has no
    /// model-dtype storage a framework may use (NULL). With sharded params both are in the
    /// bucket's gather slot: the same at every gather, valid while it is gathered
    /// ([`Runtime::check_gathered`]).
    pub fn address(&self, p: usize, grad: bool) -> *mut std::ffi::c_void {
        if !grad && self.is_mxfp8(p as u32) {
            return std::ptr::null_mut();
        }
        let placement = &self.plan.params[p];
        let bucket = &self.plan.buckets[placement.bucket as usize];
        let span = if grad {
            self.grad_span(bucket, placement.range())
        } else {
            match self.param_span(bucket, placement.range()) {
                Ok(span) => span,
                Err(_) => return std::ptr::null_mut(),
            }
        };
        self.backend.address(span)
    }
}

impl Runtime {
    /// Where param `p`'s gradient is accumulated (the framework's `grad` view as a span): the
    /// grad buffer, or with sharded params its bucket's gather slot, only while gathered.
    pub fn grad_storage(&self, p: usize) -> Result<Span> {
        self.check_gathered("grad_storage", p)?;
        let placement = &self.plan.params[p];
        Ok(self.grad_span(&self.plan.buckets[placement.bucket as usize], placement.range()))
    }
}

/// The fp32 state a rank owns for one piece of a param, in the param's flat coordinates.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnedState {
    pub param: u32,
    /// Element range inside the param.
    pub range: ElemRange,
    pub master: Vec<f32>,
    /// Muon: `[momentum]`, with NorMuon or AdaMuon `[momentum, moment2]` (the second moment as one value
    /// per item, `state::moment2_to_items`); AdamW: `[exp_avg, exp_avg_sq]`.
    pub moments: Vec<Vec<f32>>,
}

impl Runtime {
    /// Everything this rank owns, Muon units first, after synchronizing.
    pub fn owned_state(&mut self) -> Result<Vec<OwnedState>> {
        self.backend.synchronize()?;
        let mut out = Vec::new();
        for slot in self.layout.muon.clone() {
            let offset = self.plan.params[slot.unit.param as usize].offset;
            let mut moments = vec![self.backend.download(slot.momentum())?];
            if slot.moment2.1 > 0 {
                let values = self.backend.download(slot.moment2())?;
                moments.push(super::state::moment2_to_items(
                    &self.params[slot.unit.param as usize],
                    self.cfg.muon_variant,
                    &values,
                ));
            }
            out.push(OwnedState {
                param: slot.unit.param,
                range: slot.unit.range.shifted_down(offset),
                master: self.backend.download(slot.master())?,
                moments,
            });
        }
        for slot in self.layout.adamw.clone() {
            out.push(OwnedState {
                param: slot.piece.param,
                range: slot.piece.param_range,
                master: self.backend.download(slot.master())?,
                moments: vec![
                    self.backend.download(slot.exp_avg())?,
                    self.backend.download(slot.exp_avg_sq())?,
                ],
            });
        }
        Ok(out)
    }

    /// This rank's copy of param `p` as f32: what its forward reads, so the dequantized rowwise
    /// copy of an MXFP8 param. With sharded params, only while its bucket is gathered.
    pub fn param_values(&mut self, p: usize) -> Result<Vec<f32>> {
        self.check_gathered("param_values", p)?;
        if let Some(tensor) = self.layout.memory.mxfp8.iter().find(|t| t.param == p as u32) {
            let (rows, cols) = (tensor.rows, tensor.cols);
            let data = self.backend.download_mxfp8(p as u32, 0)?;
            let scales = self.backend.download_mxfp8(p as u32, 1)?;
            let mut out = vec![0.0; rows * cols];
            let layout = self.layout.memory.mxfp8_scale_layout;
            dequantize_rowwise(&data, &scales, rows, cols, layout, Output::F32(&mut out))?;
            return Ok(out);
        }
        let placement = &self.plan.params[p];
        let bucket = &self.plan.buckets[placement.bucket as usize];
        let span = self.param_span(bucket, placement.range())?;
        self.backend.download(span)
    }
}

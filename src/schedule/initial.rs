//! Writing the initial values a runtime starts from: every rank's model-dtype copy and MXFP8
//! storage, and the masters of what the rank owns.

use super::Runtime;
use crate::backend::ops::StreamKind;
use crate::error::Result;
use crate::plan::ElemRange;

impl Runtime {
    /// Writes `init(p)` (None = zeros) where param p's values live: its model-dtype copy, or
    /// for a param staged on the grad buffer (which has no model-dtype copy) its bf16 staging,
    /// from which its MXFP8 storage is quantized as after a step; then the masters of the
    /// units and pieces this rank owns. The staging bytes are zeroed again afterwards, so the
    /// grad buffer starts at zero as allocated.
    pub(super) fn write_initial_values<'a>(&mut self, init: impl Fn(usize) -> Option<&'a [f32]>) -> Result<()> {
        // `allocate` zeroes every buffer, so a param without initial values needs no upload
        // (and no zero-filled host copy of its size).
        let mut staged_buckets = Vec::new();
        for p in 0..self.plan.params.len() {
            let placement = &self.plan.params[p];
            let (bucket, range) = (placement.bucket, placement.range());
            let storage = self.param_destination(p as u32, bucket, range)?;
            if let Some(values) = init(p) {
                self.backend.upload(storage, values)?;
            }
            if self.is_mxfp8(p as u32) {
                self.backend.mxfp8_quantize(StreamKind::Compute, storage, p as u32)?;
            }
            if self.is_staged(p as u32) && init(p).is_some() {
                staged_buckets.push(bucket);
            }
        }
        staged_buckets.sort_unstable();
        staged_buckets.dedup();
        for b in staged_buckets {
            let bucket = &self.plan.buckets[b as usize];
            let whole = self.staging_span(bucket, ElemRange::new(bucket.start, bucket.end));
            self.backend.memset_zero(whole)?;
        }
        for slot in self.layout.muon.clone() {
            let p = slot.unit.param as usize;
            let local = (slot.unit.range.start - self.plan.params[p].offset) as usize;
            if let Some(values) = init(p) {
                self.backend
                    .upload(slot.master(), &values[local..local + slot.unit.range.len() as usize])?;
            }
        }
        for slot in self.layout.adamw.clone() {
            let r = slot.piece.param_range;
            if let Some(values) = init(slot.piece.param as usize) {
                self.backend
                    .upload(slot.master(), &values[r.start as usize..r.end as usize])?;
            }
        }
        Ok(())
    }
}

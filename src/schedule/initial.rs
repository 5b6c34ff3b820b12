//! Writing the initial values a runtime starts from: every rank's model-dtype copy and MXFP8
//! storage, and the masters of what the rank owns.

use super::Runtime;
use crate::backend::ops::{InitValues, Mem, Span, StreamKind};
use crate::bail;
use crate::error::Result;
use crate::plan::ElemRange;

impl Runtime {
    /// Writes `init(p)` (None = zeros) where param p's values live: its model-dtype copy, or
    /// for a param staged on the grad buffer (which has no model-dtype copy) its bf16 staging,
    /// from which its MXFP8 storage is quantized as after a step; then the masters of the
    /// units and pieces this rank owns. Each param's values are attached to the backend only
    /// while they are cast into place, so no converted copy of the model exists at any time.
    /// The staging bytes are zeroed again afterwards, so the grad buffer starts at zero as
    /// allocated. Ends with one synchronize, after which the caller may free every device copy
    /// of the values.
    pub(super) fn write_initial_values<'a>(&mut self, init: impl Fn(usize) -> Option<InitValues<'a>>) -> Result<()> {
        // `allocate` zeroes every buffer, so a param without initial values needs no write.
        let mut staged_buckets = Vec::new();
        let mut attached = false;
        for p in 0..self.plan.params.len() {
            let placement = &self.plan.params[p];
            let (bucket, range) = (placement.bucket, placement.range());
            let storage = self.param_destination(p as u32, bucket, range)?;
            if let Some(values) = init(p) {
                self.write_param_initial_values(p as u32, values, storage)?;
                attached = true;
                if self.is_staged(p as u32) {
                    staged_buckets.push(bucket);
                }
            }
            if self.is_mxfp8(p as u32) {
                self.backend.mxfp8_quantize(StreamKind::Compute, storage, p as u32)?;
            }
        }
        staged_buckets.sort_unstable();
        staged_buckets.dedup();
        for b in staged_buckets {
            let bucket = &self.plan.buckets[b as usize];
            let whole = self.staging_span(bucket, ElemRange::new(bucket.start, bucket.end));
            self.backend.memset_zero(StreamKind::Compute, whole)?;
        }
        if attached {
            self.backend.synchronize()?;
        }
        Ok(())
    }

    /// Casts param `p`'s initial values into `storage` and into the masters of the Muon units
    /// and AdamW pieces of it this rank owns (an f32 param's masters are its storage).
    fn write_param_initial_values(&mut self, p: u32, values: InitValues<'_>, storage: Span) -> Result<()> {
        let numel = self.params[p as usize].numel();
        if values.numel != numel {
            bail!(
                Internal,
                "initial values of param {p}: {} values for {numel} elements",
                values.numel
            );
        }
        self.backend.attach_init(p, values)?;
        let init = |start: u64, len: u64| Span::new(Mem::Init(p), start, len);
        self.backend.cast(init(0, numel), storage)?;
        let offset = self.plan.params[p as usize].offset;
        let separate = |master: Span| master.mem == Mem::Master;
        for slot in self
            .layout
            .muon
            .iter()
            .filter(|s| s.unit.param == p && separate(s.master()))
        {
            let range = slot.unit.range;
            self.backend
                .cast(init(range.start - offset, range.len()), slot.master())?;
        }
        for slot in self
            .layout
            .adamw
            .iter()
            .filter(|s| s.piece.param == p && separate(s.master()))
        {
            let range = slot.piece.param_range;
            self.backend.cast(init(range.start, range.len()), slot.master())?;
        }
        self.backend.detach_init(p)
    }
}

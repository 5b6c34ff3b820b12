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
            // With sharded params a rank keeps only its own ranges (written with the masters),
            // and each gather quantizes its MXFP8 params.
            let storage = match self.sharded {
                Some(_) => None,
                None => Some(self.param_destination(p as u32, bucket, range)?),
            };
            if let Some(values) = init(p) {
                self.write_param_initial_values(p as u32, values, storage)?;
                attached = true;
                if self.is_staged(p as u32) {
                    staged_buckets.push(bucket);
                }
            }
            if let Some(storage) = storage.filter(|_| self.is_mxfp8(p as u32)) {
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

    /// Casts param `p`'s initial values into `storage` (the whole param; None with sharded
    /// params) and into the masters of the Muon units and AdamW pieces of it this rank owns
    /// and, with sharded params, their persistent storage (an f32 param's masters are its
    /// storage).
    fn write_param_initial_values(&mut self, p: u32, values: InitValues<'_>, storage: Option<Span>) -> Result<()> {
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
        if let Some(storage) = storage {
            self.backend.cast(init(0, numel), storage)?;
        }
        let offset = self.plan.params[p as usize].offset;
        // Per owned range: its values (in the param's coordinates), its place in the buffer,
        // its bucket and its master.
        let muon = self.layout.muon.iter().filter(|s| s.unit.param == p).map(|s| {
            let range = s.unit.range;
            (range.shifted_down(offset), range, s.unit.bucket, s.master())
        });
        let adamw = self
            .layout
            .adamw
            .iter()
            .filter(|s| s.piece.param == p)
            .map(|s| (s.piece.param_range, s.piece.buffer_range, s.bucket, s.master()));
        let owned: Vec<_> = muon.chain(adamw).collect();
        for (values, range, bucket, master) in owned {
            let from = init(values.start, values.len());
            if storage.is_none() {
                let kept = self.param_destination(p, bucket, range)?;
                self.backend.cast(from, kept)?;
                if kept == master {
                    continue;
                }
            }
            if master.mem == Mem::Master {
                self.backend.cast(from, master)?;
            }
        }
        self.backend.detach_init(p)
    }
}

//! Which bytes move in each collective of a bucket, and where MXFP8 params are staged.

use crate::backend::ops::{CollOp, Mem, Span};
use crate::bail;
use crate::config::MuonLayout;
use crate::error::Result;
use crate::model::ParamFlags;
use crate::plan::{Bucket, BucketSplit, ElemRange};

use super::Runtime;
use super::window::kept_param;

impl Runtime {
    pub(super) fn bucket_span(bucket: &Bucket, mem: Mem) -> Span {
        Span::new(mem, bucket.start, bucket.numel())
    }

    /// `range` (elements of `bucket`) where the framework accumulates its gradient and the
    /// gradient collectives reduce it: the grad buffer, or with sharding the gather window.
    pub(super) fn grad_span(&self, bucket: &Bucket, range: ElemRange) -> Span {
        match self.window() {
            Some(w) => w.gathered(bucket, range, Mem::Grad(bucket.buffer)),
            None => Span::new(Mem::Grad(bucket.buffer), range.start, range.len()),
        }
    }

    pub(super) fn grad_ops(&self, bucket: &Bucket) -> Vec<CollOp> {
        let span = self.grad_span(bucket, ElemRange::new(bucket.start, bucket.end));
        match (&bucket.split, self.plan.layout) {
            (BucketSplit::OwnerRanges(_), MuonLayout::Allreduce) => vec![CollOp::AllReduce { span }],
            (BucketSplit::OwnerRanges(ranges), _) => owner_ops(ranges, |root, range| CollOp::Reduce {
                root,
                span: self.grad_span(bucket, range),
            }),
            (BucketSplit::EqualShards { .. }, _) => vec![CollOp::ReduceScatter { span }],
        }
    }

    /// The param collectives of `bucket` on the param buffer, or on its bf16 staging view.
    pub(super) fn param_ops(&self, bucket: &Bucket, staging: bool) -> Result<Vec<CollOp>> {
        let span = |range: ElemRange| {
            if staging {
                Ok(self.staging_span(bucket, range))
            } else {
                self.param_span(bucket, range)
            }
        };
        match &bucket.split {
            BucketSplit::OwnerRanges(ranges) => ranges
                .iter()
                .enumerate()
                .filter(|(_, r)| !r.is_empty())
                .map(|(root, r)| {
                    Ok(CollOp::Broadcast {
                        root: root as u32,
                        span: span(*r)?,
                    })
                })
                .collect(),
            BucketSplit::EqualShards { .. } => Ok(vec![CollOp::AllGather {
                span: span(ElemRange::new(bucket.start, bucket.end))?,
            }]),
        }
    }

    /// `range` (elements of `bucket`) where the framework reads it and the param collectives
    /// bring it: its buffer's param storage, or with sharding the gather window.
    pub(super) fn param_span(&self, bucket: &Bucket, range: ElemRange) -> Result<Span> {
        if let Some(w) = self.window() {
            return Ok(w.gathered(bucket, range, Mem::Param(bucket.buffer)));
        }
        match bucket.param_range(range) {
            Some(r) => Ok(Span::new(Mem::Param(bucket.buffer), r.start, r.len())),
            None => bail!(
                Internal,
                "bucket {} has no param storage: every param of it is staged on the grad buffer",
                bucket.id
            ),
        }
    }

    /// Where the bf16 copy of `range` (elements of `bucket`'s buffer) is staged: inside
    /// `bucket`'s own grad bytes, at `2·(e − bucket.start)` bytes from the bucket's first grad
    /// byte. A grad element is at least 2 bytes, so the staging of a bucket never leaves that
    /// bucket's grad bytes ([`Runtime::staging_stays_in_bucket`] checks it).
    pub(super) fn staging_span(&self, bucket: &Bucket, range: ElemRange) -> Span {
        let per_grad = (self.cfg.grad_dtype.size() / 2) as u64;
        Span::new(
            Mem::Staging(bucket.buffer),
            bucket.start * per_grad + (range.start - bucket.start),
            range.len(),
        )
    }

    /// The byte range a staging span covers, and the grad bytes of its bucket: the first must
    /// lie inside the second.
    pub fn staging_stays_in_bucket(&self, b: usize) -> bool {
        let bucket = &self.plan.buckets[b];
        let grad_size = self.cfg.grad_dtype.size() as u64;
        let whole = self.staging_span(bucket, ElemRange::new(bucket.start, bucket.end));
        let (first, last) = (whole.start * 2, (whole.start + whole.len) * 2);
        bucket.start * grad_size <= first && last <= bucket.end * grad_size
    }

    pub(super) fn is_mxfp8(&self, p: u32) -> bool {
        self.params[p as usize].flags.has(ParamFlags::MXFP8)
    }

    /// Whether param `p` travels as bf16 staged on the grad buffer (MXFP8 with gather on).
    pub(super) fn is_staged(&self, p: u32) -> bool {
        self.params[p as usize].is_staged(&self.cfg)
    }

    /// Where an owner writes the new value of `range` of param `p` (bucket `b`): the param
    /// storage (with sharding its owned storage), or the bf16 staging of a staged param.
    pub(super) fn param_destination(&self, p: u32, b: u32, range: ElemRange) -> Result<Span> {
        let bucket = &self.plan.buckets[b as usize];
        if self.is_staged(p) {
            return Ok(self.staging_span(bucket, range));
        }
        match kept_param(bucket, self.window(), range) {
            Some(span) => Ok(span),
            None => bail!(
                Internal,
                "bucket {} has no param storage: every param of it is staged on the grad buffer",
                bucket.id
            ),
        }
    }
}

fn owner_ops(ranges: &[ElemRange], op: impl Fn(u32, ElemRange) -> CollOp) -> Vec<CollOp> {
    ranges
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.is_empty())
        .map(|(root, &r)| op(root as u32, r))
        .collect()
}

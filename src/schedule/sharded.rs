//! The iteration with `param_sharding = sharded` (issue 41; the storage is in `window.rs`):
//! a bucket is gathered into its slot before its use and released after it, its gradients are
//! produced into the slot, reduced to their owners and copied into the owners' persistent
//! storage; and every call that touches a bucket checks that it is inside its gathered window,
//! so a framework that uses a param outside it gets an error naming the param and the bucket,
//! never stale values.
//!
//! Per bucket b, the gather (comm stream, ordered after everything the compute stream was
//! given before it, which includes the release of the slot's previous bucket and the step's
//! updates): the owner's persistent range into the slot, the slot's gradients zeroed, the
//! param collectives of b on the slot, MXFP8 params quantized from the gathered bf16, then
//! `PARAM_SYNCED(b)`, which `wait_params` orders the compute stream after. The gradient
//! collectives of b run on the slot as with replicated params, and copy each owner's reduced
//! range out of it before `GRAD_SYNCED(b)`; the comm stream reaches a slot's next gather only
//! after that copy.

use super::{Ev, Runtime, event};
use crate::backend::ops::{Mem, Span, StreamKind};
use crate::bail;
use crate::error::Result;
use crate::plan::ElemRange;

use super::window::Window;

/// Where a bucket stands in the gather window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gather {
    /// Not gathered: its slot may hold another bucket.
    Released,
    /// Gathered into its slot (or being gathered, on the comm stream).
    Held,
    /// Released with every gradient ready while its reduction waits for the buckets reduced
    /// before it: the slot stays taken until the reduction is issued.
    Draining,
}

/// The sharded iteration's state: where each bucket and slot of the window stands.
#[derive(Debug)]
pub(super) struct Sharded {
    /// Per bucket.
    state: Vec<Gather>,
    /// Per slot: the bucket holding it.
    occupant: Vec<Option<usize>>,
}

impl Sharded {
    pub(super) fn new(window: &Window, buckets: usize) -> Sharded {
        Sharded {
            state: vec![Gather::Released; buckets],
            occupant: vec![None; window.slots],
        }
    }

    fn free(&mut self, b: usize) {
        self.state[b] = Gather::Released;
        if let Some(slot) = self.occupant.iter_mut().find(|o| **o == Some(b)) {
            *slot = None;
        }
    }

    /// Every bucket released (after a step, whose updates make every gathered copy stale, and
    /// after a load).
    pub(super) fn release_all(&mut self) {
        self.state.iter_mut().for_each(|s| *s = Gather::Released);
        self.occupant.iter_mut().for_each(|o| *o = None);
    }
}

impl Runtime {
    /// The sharded storage layout, when params are sharded.
    pub(super) fn window(&self) -> Option<&Window> {
        self.layout.window.as_ref()
    }

    fn check_bucket(&self, call: &str, b: u32) -> Result<usize> {
        if b as usize >= self.plan.buckets.len() {
            bail!(
                InvalidArgument,
                "{call}: bucket {b} does not exist (the plan has {} buckets)",
                self.plan.buckets.len()
            );
        }
        Ok(b as usize)
    }

    /// Whether bucket `b` is gathered (always, when params are replicated).
    pub fn is_gathered(&self, b: usize) -> bool {
        self.sharded.as_ref().is_none_or(|s| s.state[b] == Gather::Held)
    }

    /// Fails, naming param `p` and its bucket, when params are sharded and the bucket is not
    /// gathered: `call` would touch storage that holds another bucket or stale values.
    pub fn check_gathered(&self, call: &str, p: usize) -> Result<()> {
        let b = self.plan.params[p].bucket;
        if self.is_gathered(b as usize) {
            return Ok(());
        }
        bail!(
            InvalidState,
            "{call}: param '{}' is in bucket {b}, which is not gathered (param_sharding = sharded: a bucket's params and gradients exist from muon_optimizer_gather_params or wait_params to muon_optimizer_release_params, and a step releases every bucket)",
            self.params[p].name
        )
    }

    /// Issues the gather of bucket `b` into its slot (module docs) unless it is gathered
    /// already; nothing with replicated params, whose buckets are always there. Fails when
    /// the slot still holds another bucket.
    pub fn gather_params(&mut self, b: u32) -> Result<()> {
        let b = self.check_bucket("gather_params", b)?;
        let (Some(sharded), Some(window)) = (&self.sharded, self.window()) else {
            return Ok(());
        };
        match sharded.state[b] {
            Gather::Held => return Ok(()),
            Gather::Draining => bail!(
                InvalidState,
                "gather_params: bucket {b} was released with its gradients ready and they wait for their reduction; it cannot be gathered again before the step"
            ),
            Gather::Released => {}
        }
        let slot = window.slot[b];
        if let Some(other) = sharded.occupant[slot] {
            let why = if sharded.state[other] == Gather::Draining {
                format!(
                    "bucket {other} was released with its gradients ready, and its reduction waits for the grad_ready of the buckets reduced before it"
                )
            } else {
                format!("release bucket {other} with muon_optimizer_release_params first")
            };
            bail!(
                InvalidState,
                "gather_params: bucket {b} is gathered into slot {slot} of {}, which still holds bucket {other}: {why} (param_prefetch_buckets = {} gathers at most {} buckets at a time, in forward order, or in its reverse in the backward)",
                window.slots,
                self.cfg.param_prefetch_buckets,
                window.slots
            );
        }
        let bucket = &self.plan.buckets[b];
        let whole = ElemRange::new(bucket.start, bucket.end);
        let owned = window.owned_range(bucket);
        let copy = (!owned.is_empty()).then(|| {
            (
                window.kept(bucket, owned, false),
                window.gathered(bucket, owned, Mem::Param(bucket.buffer)),
            )
        });
        let grads = self.grad_span(bucket, whole);
        let ops = self.param_ops(bucket, false)?;
        let quantize: Vec<(Span, u32)> = bucket
            .params
            .iter()
            .filter(|&&p| self.is_mxfp8(p))
            .map(|&p| Ok((self.param_span(bucket, self.plan.params[p as usize].range())?, p)))
            .collect::<Result<_>>()?;
        self.record(StreamKind::Compute, event(b, Ev::ParamReady))?;
        self.wait(StreamKind::Comm, event(b, Ev::ParamReady))?;
        if let Some((src, dst)) = copy {
            self.backend.copy(StreamKind::Comm, src, dst)?;
        }
        self.backend.memset_zero(StreamKind::Comm, grads)?;
        self.backend.collectives(ops)?;
        for (src, p) in quantize {
            self.backend.mxfp8_quantize(StreamKind::Comm, src, p)?;
        }
        self.record(StreamKind::Comm, event(b, Ev::ParamSynced))?;
        if let Some(sharded) = &mut self.sharded {
            sharded.state[b] = Gather::Held;
            sharded.occupant[slot] = Some(b);
        }
        Ok(())
    }

    /// Ends bucket `b`'s gathered window (nothing with replicated params). Fails when the
    /// bucket is not gathered, or when some but not all of its gradients are ready (the others
    /// would be lost). A bucket released with every gradient ready keeps its slot until its
    /// reduction is issued.
    pub fn release_params(&mut self, b: u32) -> Result<()> {
        let b = self.check_bucket("release_params", b)?;
        let Some(sharded) = &self.sharded else {
            return Ok(());
        };
        if sharded.state[b] != Gather::Held {
            bail!(
                InvalidState,
                "release_params: bucket {b} is not gathered (muon_optimizer_gather_params or wait_params gathers it; each gather takes one release, and a step releases every bucket)"
            );
        }
        let params = &self.plan.buckets[b].params;
        let ready = params.iter().filter(|&&p| self.ready[p as usize]).count();
        let next = if self.launched[b] || ready == 0 {
            Gather::Released
        } else if ready == params.len() {
            Gather::Draining
        } else {
            let waiting = params.iter().find(|&&p| !self.ready[p as usize]).copied().unwrap_or(0);
            bail!(
                InvalidState,
                "release_params: bucket {b} has the gradients of {ready} of its {} params ready but not of param '{}'; release it before the first grad_ready of it or after the last, else the gradients written into its slot would be lost",
                params.len(),
                self.params[waiting as usize].name
            );
        };
        if let Some(sharded) = &mut self.sharded {
            match next {
                Gather::Released => sharded.free(b),
                _ => sharded.state[b] = next,
            }
        }
        Ok(())
    }

    /// After bucket `b`'s gradient collectives (comm stream): the owner's reduced range into
    /// its persistent storage; a bucket released while waiting for them frees its slot.
    pub(super) fn keep_reduced_grads(&mut self, b: usize) -> Result<()> {
        let Some(window) = self.window() else {
            return Ok(());
        };
        let bucket = &self.plan.buckets[b];
        let owned = window.owned_range(bucket);
        if !owned.is_empty() {
            let (src, dst) = (self.grad_span(bucket, owned), window.kept(bucket, owned, true));
            self.backend.copy(StreamKind::Comm, src, dst)?;
        }
        if let Some(sharded) = &mut self.sharded
            && sharded.state[b] == Gather::Draining
        {
            sharded.free(b);
        }
        Ok(())
    }

    /// Whether the step reduces bucket `b`'s gradients: with sharded params a bucket that is
    /// not gathered has none this iteration, and its owners' reduced gradients are zeroed
    /// instead (what reducing zeros gives) — no collective.
    pub(super) fn zero_ungathered_grads(&mut self, b: usize) -> Result<bool> {
        let (Some(sharded), Some(window)) = (&self.sharded, self.window()) else {
            return Ok(false);
        };
        if sharded.state[b] != Gather::Released {
            return Ok(false);
        }
        let bucket = &self.plan.buckets[b];
        let owned = window.owned_range(bucket);
        if !owned.is_empty() {
            let span = window.kept(bucket, owned, true);
            self.backend.memset_zero(StreamKind::Compute, span)?;
        }
        Ok(true)
    }
}

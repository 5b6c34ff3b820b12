//! The step pipeline as backend-neutral operations with stream and event order (docs/design.md
//! section 5). Every decision — which bytes move, when, after which event, which state is
//! updated — is made here; a backend only executes.
//!
//! Events per bucket b: `GRAD_READY` (compute: all of b's grads accumulated), `GRAD_SYNCED`
//! (comm: b's gradient collective done), `PARAM_READY` (compute: owners wrote b's new values),
//! `PARAM_SYNCED` (comm: b's param collective done).

mod args;
mod collectives;
mod events;
mod initial;
mod inspect;
mod profile;
mod qk_clip;
pub mod restore;
mod sharded;
pub mod state;
mod window;

use crate::backend::Backend;
use crate::backend::ops::{
    AdamwJob, EventId, InitValues, Mem, MuonJob, NormSums, NormTerm, Scalar, Span, StepConstants, StreamKind,
};
use crate::bail;
use crate::config::{Config, TpMode};
use crate::error::Result;
use crate::model::{ParamFlags, ParamSpec};
use crate::numerics::muon::TpJob;
use crate::plan::ElemRange;
use crate::plan::Plan;
use state::StateLayout;

pub use args::{StepArgs, StepOverrides};
pub use inspect::OwnedState;
pub use profile::StepProfile;
use profile::timed;
pub use qk_clip::QkClipRequest;
use sharded::Sharded;
pub use window::Window;

/// One step of `members` optimizers sharing one gradient norm (`muon_optimizers_step`):
/// every member begins its step ([`Runtime::begin_step`], with `args[k]`) before any waits for
/// its gathered sums ([`Runtime::await_norm`]), so every member's sum of squares is issued
/// before the first wait; then each finishes with every member's norm term, its own read as
/// its own. `with(k, f)` runs `f` on member `k`'s runtime and returns its error as the caller
/// reports it.
pub fn step_shared(
    members: usize,
    args: Option<&[StepArgs]>,
    mut with: impl FnMut(usize, &mut dyn FnMut(&mut Runtime) -> Result<()>) -> Result<()>,
) -> Result<()> {
    for k in 0..members {
        with(k, &mut |rt| rt.begin_step(args.map(|a| &a[k])))?;
    }
    for k in 0..members {
        with(k, &mut |rt| rt.await_norm())?;
    }
    let mut terms = Vec::with_capacity(members);
    for k in 0..members {
        with(k, &mut |rt| {
            terms.push(rt.norm_term()?);
            Ok(())
        })?;
    }
    for k in 0..members {
        let mut own = terms.clone();
        own[k].sums = NormSums::Own;
        with(k, &mut |rt| rt.finish_step(&own))?;
    }
    Ok(())
}

/// What a step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepInfo {
    /// Global gradient norm (each unique gradient counted once); NaN or inf when skipped.
    pub grad_norm: f64,
    /// The clip multiplier applied (1 when clipping is off or not needed).
    pub clip_coef: f32,
    /// True when a non-finite gradient skipped the step on every rank.
    pub skipped: bool,
    /// Optimizer steps taken so far (skipped steps excluded).
    pub step: u64,
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    GradReady,
    GradSynced,
    ParamReady,
    ParamSynced,
}

fn event(bucket: usize, ev: Ev) -> EventId {
    EventId(bucket * 4 + ev as usize)
}

/// A step between [`Runtime::begin_step`] and [`Runtime::finish_step`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NormStage {
    /// No step begun.
    Idle,
    /// `begin_step` recorded the gathered Σ g²; the compute stream has not waited for it.
    Gathered,
    /// The compute stream waits for it ([`Runtime::await_norm`]).
    Awaited,
}

/// The step's own events, numbered after every bucket's: this rank's Σ g² is written (compute),
/// every rank's is gathered (comm).
fn norm_event(buckets: usize, gathered: bool) -> EventId {
    EventId(buckets * 4 + usize::from(gathered))
}

/// One rank's runtime after finalize.
pub struct Runtime {
    plan: Box<Plan>,
    params: Vec<ParamSpec>,
    cfg: Config,
    layout: StateLayout,
    backend: Box<dyn Backend>,
    /// Per param: grad_ready called since the last step.
    ready: Vec<bool>,
    /// Per bucket: params still to become ready.
    pending: Vec<usize>,
    /// Per bucket: gradient collective launched since the last step.
    launched: Vec<bool>,
    /// Buckets of staged MXFP8 params whose grad bytes the last step's param sync zeroed on the
    /// comm stream (after the quantize that read them), so `zero_grad` has nothing left to do
    /// for them; cleared by `zero_grad`.
    zeroed_by_param_sync: Vec<bool>,
    /// Buckets in the order the forward first uses them; the backward completes them in the
    /// reverse order, which is the order their gradient collectives are issued in.
    forward_order: Vec<usize>,
    /// Position in the reverse of `forward_order` of the next gradient collective to issue.
    next_grad_sync: usize,
    /// Per bucket: the Muon batches and AdamW slots whose params live in it.
    bucket_batches: Vec<Vec<usize>>,
    /// Every param collective of a step waits for the step's last update instead of its own
    /// bucket's ([`Runtime::sync_params_after_step`]).
    params_after_step: bool,
    bucket_adamw: Vec<Vec<usize>>,
    profile: StepProfile,
    /// The arguments last set by [`Runtime::set_step_args`], which a step without arguments
    /// uses. A step given its own leaves them in place: its arguments take the device's slots
    /// for its updates, and the set ones are copied back after them.
    set_args: Option<StepArgs>,
    /// The running step was given its own arguments.
    own_args: bool,
    /// Where the running step is between `begin_step` and `finish_step`.
    norm: NormStage,
    /// Per event slot: recorded since the last join ([`Runtime::join`]).
    live: Vec<bool>,
    /// The comm stream has work the compute stream has not joined.
    comm_unjoined: bool,
    /// QK-clips the next step applies ([`Runtime::request_qk_clip`]).
    qk_clips: qk_clip::QkClips,
    /// With `param_sharding = sharded`: the gather window and where each bucket stands in it.
    sharded: Option<Sharded>,
}

impl Runtime {
    /// Allocates the buffers and state, writes the initial params on every rank and the
    /// masters on their owners. `init(p)` gives param p's initial values (None = zeros).
    pub fn new<'a>(
        plan: Box<Plan>,
        params: Vec<ParamSpec>,
        cfg: Config,
        rank: usize,
        mut backend: Box<dyn Backend>,
        init: impl Fn(usize) -> Option<InitValues<'a>>,
    ) -> Result<Self> {
        let layout = StateLayout::new(&plan, &params, &cfg, rank);
        backend.allocate(&layout.memory)?;
        let pending = plan.buckets.iter().map(|b| b.params.len()).collect();
        let mut bucket_batches = vec![Vec::new(); plan.buckets.len()];
        for (i, batch) in layout.muon_batches.iter().enumerate() {
            bucket_batches[layout.muon[batch.first].unit.bucket as usize].push(i);
        }
        let mut bucket_adamw = vec![Vec::new(); plan.buckets.len()];
        for (i, slot) in layout.adamw.iter().enumerate() {
            bucket_adamw[slot.bucket as usize].push(i);
        }
        let live = vec![false; events::event_slots(plan.buckets.len())];
        let sharded = layout.window.as_ref().map(|w| Sharded::new(w, plan.buckets.len()));
        let mut runtime = Runtime {
            sharded,
            ready: vec![false; params.len()],
            launched: vec![false; plan.buckets.len()],
            zeroed_by_param_sync: vec![false; plan.buckets.len()],
            forward_order: crate::plan::forward_order(&plan.buckets),
            next_grad_sync: 0,
            bucket_batches,
            bucket_adamw,
            pending,
            plan,
            params,
            cfg,
            layout,
            backend,
            profile: StepProfile::default(),
            set_args: None,
            own_args: false,
            norm: NormStage::Idle,
            live,
            comm_unjoined: false,
            qk_clips: qk_clip::QkClips::default(),
            params_after_step: false,
        };
        runtime.write_initial_values(init)?;
        Ok(runtime)
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// From the next step on, the param collectives start after the step's last update, not
    /// as each bucket's owners are done: how Megatron-LM's layer-wise optimizer gathers
    /// (`LayerWiseDistributedOptimizer.step_with_ready_grads`, its all-gather after the whole
    /// step: `megatron/core/optimizer/layer_wise_optimizer.py` lines 964–990 at d98e8a64). `muon-opt simulate --schedule megatron` prices it; the library never sets it.
    pub fn sync_params_after_step(&mut self) {
        self.params_after_step = true;
    }

    pub fn backend_mut(&mut self) -> &mut dyn Backend {
        self.backend.as_mut()
    }

    /// Optimizer steps taken (skipped steps excluded). Waits for the compute stream.
    pub fn steps(&mut self) -> Result<u64> {
        Ok(self.backend.read_scalars()?[Scalar::Step.slot()] as u64)
    }

    /// What the last step did, read from the device: waits for the compute stream (the only
    /// host synchronization of an iteration, and only when asked). An error when the ranks its
    /// norm was gathered over had taken different numbers of steps (the step was skipped on
    /// every rank).
    pub fn step_info(&mut self) -> Result<StepInfo> {
        let s = self.backend.read_scalars()?;
        let rank = s[Scalar::DisagreeRank.slot()] as u64;
        if rank != 0 {
            let term = s[Scalar::DisagreeTerm.slot()] as u64;
            let of = if term > 0 {
                format!(" (of optimizer {term} of the shared step)")
            } else {
                String::new()
            };
            bail!(
                PlanMismatch,
                "step: the ranks the gradient norm is gathered over{of} are at different step counts: rank {} has taken {} steps, rank 0 {}; the step was skipped on every rank. Every rank of the data-parallel and norm groups must load the same checkpoint and step together",
                rank - 1,
                s[Scalar::DisagreeSteps.slot()] as u64,
                s[Scalar::DisagreeRank0Steps.slot()] as u64
            );
        }
        Ok(StepInfo {
            grad_norm: s[Scalar::GradNorm.slot()],
            clip_coef: s[Scalar::ClipCoef.slot()] as f32,
            skipped: s[Scalar::Skip.slot()] != 0.0,
            step: s[Scalar::Step.slot()] as u64,
        })
    }

    /// Param `p`'s multipliers of its route's learning rate and weight decay, for the steps
    /// enqueued after this call (the registration's `lr_scale` and `wd_scale`: finite, ≥ 0).
    pub fn set_param_scales(&mut self, p: usize, lr_scale: f32, wd_scale: f32) -> Result<()> {
        let count = self.params.len();
        let Some(spec) = self.params.get_mut(p) else {
            bail!(
                InvalidArgument,
                "set_param_scales: param {p} is not registered ({count} are)"
            );
        };
        if let Some((field, value)) = crate::model::invalid_scale(lr_scale, wd_scale) {
            bail!(
                OutOfRange,
                "set_param_scales: param '{}': {field} {value} must be finite and >= 0",
                spec.name
            );
        }
        spec.lr_scale = lr_scale;
        spec.wd_scale = wd_scale;
        Ok(())
    }

    /// Marks the grad buffer for zeroing: each bucket's memset is ordered after everything
    /// that still reads its grad bytes — its gradient collective and, when MXFP8 params are
    /// staged on it, their param gather and quantize. A bucket of staged params that the last
    /// step's param sync already zeroed (on the comm stream, before `ParamSynced`, which the
    /// forward waits for in `wait_params` before the backward can write the bucket) is left
    /// alone: the compute stream never waits here for a param gather. With sharded params
    /// there is nothing to do: each gather zeroes its bucket's transient gradients.
    pub fn zero_grad(&mut self) -> Result<()> {
        if self.sharded.is_some() {
            return Ok(());
        }
        for b in 0..self.plan.buckets.len() {
            if std::mem::take(&mut self.zeroed_by_param_sync[b]) {
                continue;
            }
            self.wait(StreamKind::Compute, event(b, Ev::GradSynced))?;
            if self.has_staged(b) {
                self.wait(StreamKind::Compute, event(b, Ev::ParamSynced))?;
            }
            let bucket = &self.plan.buckets[b];
            self.backend
                .memset_zero(StreamKind::Compute, Self::bucket_span(bucket, Mem::Grad(bucket.buffer)))?;
        }
        Ok(())
    }

    /// Whether bucket `b` holds params staged on its grad bytes (MXFP8 with gather on).
    fn has_staged(&self, b: usize) -> bool {
        self.plan.buckets[b].params.iter().any(|&p| self.is_staged(p))
    }

    /// Forward pre-hook: the compute stream waits for bucket `b`'s params; with sharded
    /// params it gathers the bucket first unless it is gathered ([`Runtime::gather_params`]).
    pub fn wait_params(&mut self, b: u32) -> Result<()> {
        if b as usize >= self.plan.buckets.len() {
            bail!(
                InvalidArgument,
                "wait_params: bucket {b} does not exist (the plan has {} buckets)",
                self.plan.buckets.len()
            );
        }
        if !self.is_gathered(b as usize) {
            self.gather_params(b)?;
        }
        self.wait(StreamKind::Compute, event(b as usize, Ev::ParamSynced))
    }

    /// Backward hook: param `p`'s gradient is final for this iteration.
    pub fn grad_ready(&mut self, p: u32) -> Result<()> {
        let Some(ready) = self.ready.get_mut(p as usize) else {
            bail!(
                InvalidArgument,
                "grad_ready: param_id {p} is not registered ({} params)",
                self.params.len()
            );
        };
        if *ready {
            bail!(
                InvalidState,
                "grad_ready: param {p} ('{}') was already marked ready in this iteration; call it once per param between steps",
                self.params[p as usize].name
            );
        }
        self.check_gathered("grad_ready", p as usize)?;
        self.ready[p as usize] = true;
        let b = self.plan.params[p as usize].bucket as usize;
        self.pending[b] -= 1;
        if self.cfg.overlap_grad_reduce {
            self.launch_ready_grad_syncs()?;
        }
        Ok(())
    }

    /// The bucket whose gradient collective is issued `i`-th: the reverse forward order, a
    /// function of the plan alone, so every rank issues the collectives in one order whatever
    /// the order of its `grad_ready` calls (as PyTorch DDP does).
    fn grad_sync_bucket(&self, i: usize) -> usize {
        self.forward_order[self.forward_order.len() - 1 - i]
    }

    /// Issues, in order, every gradient collective whose bucket is complete and whose
    /// predecessors are issued; a complete bucket waits for the buckets before it.
    fn launch_ready_grad_syncs(&mut self) -> Result<()> {
        while self.next_grad_sync < self.forward_order.len() {
            let b = self.grad_sync_bucket(self.next_grad_sync);
            if self.pending[b] != 0 {
                break;
            }
            self.launch_grad_sync(b)?;
            self.next_grad_sync += 1;
        }
        Ok(())
    }

    /// The gradients are summed, not averaged: 1/dp is folded into the factor the updates
    /// apply to them (see [`Runtime::step`]), so no pass over the buckets scales them.
    fn launch_grad_sync(&mut self, b: usize) -> Result<()> {
        let bucket = &self.plan.buckets[b];
        let ops = self.grad_ops(bucket);
        self.record(StreamKind::Compute, event(b, Ev::GradReady))?;
        self.wait(StreamKind::Comm, event(b, Ev::GradReady))?;
        self.backend.collectives(ops)?;
        self.launched[b] = true;
        self.keep_reduced_grads(b)?;
        self.record(StreamKind::Comm, event(b, Ev::GradSynced))?;
        Ok(())
    }

    /// The gradients this rank owns, split into those it counts in the global norm and the
    /// `NORM_REPLICA` copies another rank of the norm group counts — which are still checked
    /// for non-finite values, so a NaN in any gradient skips the step (as Megatron checks
    /// every main grad for found-inf but counts duplicates once in the norm).
    fn owned_grad_spans(&self) -> (Vec<Span>, Vec<Span>) {
        let replica = |param: u32| self.params[param as usize].flags.has(ParamFlags::NORM_REPLICA);
        let muon = self.layout.muon.iter().map(|s| (s.unit.param, s.grad()));
        let adamw = self.layout.adamw.iter().map(|s| (s.piece.param, s.grad()));
        let (checked, counted): (Vec<_>, Vec<_>) = muon.chain(adamw).partition(|&(p, _)| replica(p));
        let spans = |v: Vec<(u32, Span)>| v.into_iter().map(|(_, s)| s).collect();
        (spans(counted), spans(checked))
    }

    /// One optimizer step (docs/design.md §5 and §6), enqueued without a host
    /// synchronization: the arguments go to the device asynchronously, this rank's Σ g² is
    /// gathered from every rank on the comm stream, and one kernel derives the norm, the clip
    /// coefficient, the skip decision, the step count and the bias corrections there
    /// ([`crate::numerics::step_scalars`]); the updates read them from device memory and leave
    /// every state as is when the step is skipped. The reduced gradients are sums over the
    /// ranks: the updates scale them by `clip_coef / dp` in the multiply that applies the clip.
    /// Owners update the buckets in the order the next forward uses them, and each bucket's
    /// param collective starts as soon as its own updates are done. [`Runtime::step_info`]
    /// reads what the step did.
    /// With `args` None the step uses the arguments last copied by [`Runtime::set_step_args`]
    /// and issues no host-to-device copy at all (a step captured in a CUDA graph reads them
    /// from device memory at every replay). With `args` the step uses them and leaves the set
    /// arguments in place for the later steps without.
    pub fn step(&mut self, args: Option<&StepArgs>) -> Result<()> {
        self.begin_step(args)?;
        let own = self.backend.norm_term()?;
        self.finish_step(&[NormTerm {
            sums: NormSums::Own,
            ..own
        }])
    }

    /// The first half of a step, up to this rank's gathered Σ g² (see [`Runtime::step`]);
    /// [`Runtime::finish_step`] completes it, with the terms of every optimizer sharing the
    /// clip.
    pub fn begin_step(&mut self, args: Option<&StepArgs>) -> Result<()> {
        if self.norm != NormStage::Idle {
            bail!(
                InvalidState,
                "step: the previous step of this optimizer was begun and not finished"
            );
        }
        if args.is_none() && self.set_args.is_none() {
            bail!(
                InvalidState,
                "step: no step arguments: pass them, or set them first with muon_optimizer_set_step_args"
            );
        }
        let mut profile = self.profile;
        let buckets = self.plan.buckets.len();
        timed(&mut profile.grad_collectives, || {
            for i in 0..self.forward_order.len() {
                let b = self.grad_sync_bucket(i);
                if !self.launched[b] && !self.zero_ungathered_grads(b)? {
                    self.launch_grad_sync(b)?;
                }
            }
            if let Some(sharded) = &mut self.sharded {
                sharded.release_all();
            }
            for b in 0..buckets {
                self.wait(StreamKind::Compute, event(b, Ev::GradSynced))?;
            }
            Ok(())
        })?;
        if let Some(args) = args {
            self.copy_args(args)?;
        }
        self.own_args = args.is_some();
        timed(&mut profile.grad_norm, || {
            let (counted, checked) = self.owned_grad_spans();
            self.backend.squared_norm(counted, checked)?;
            self.record(StreamKind::Compute, norm_event(buckets, false))?;
            self.wait(StreamKind::Comm, norm_event(buckets, false))?;
            self.backend.gather_norm_sums()?;
            self.record(StreamKind::Comm, norm_event(buckets, true))
        })?;
        self.profile = profile;
        self.norm = NormStage::Gathered;
        Ok(())
    }

    /// Compute stream: waits for the Σ g² gathered by [`Runtime::begin_step`] (once;
    /// [`Runtime::finish_step`] waits unless this did). The optimizers of a shared step begin
    /// theirs first and wait for all after, so their gathers overlap each other and the later
    /// optimizers' sums of squares.
    pub fn await_norm(&mut self) -> Result<()> {
        match self.norm {
            NormStage::Idle => bail!(
                InvalidState,
                "step: await_norm without begin_step; the gradient norm is not gathered"
            ),
            NormStage::Gathered => {
                self.wait(StreamKind::Compute, norm_event(self.plan.buckets.len(), true))?;
                self.norm = NormStage::Awaited;
                Ok(())
            }
            NormStage::Awaited => Ok(()),
        }
    }

    /// This optimizer's gathered sums, for the other optimizers sharing its clip (valid after
    /// [`Runtime::begin_step`]).
    pub fn norm_term(&self) -> Result<NormTerm> {
        self.backend.norm_term()
    }

    /// The second half of a step begun by [`Runtime::begin_step`]: the step's scalars from
    /// `terms` (this optimizer's as [`NormSums::Own`]; every rank passes them in one order),
    /// then the updates and param collectives.
    pub fn finish_step(&mut self, terms: &[NormTerm]) -> Result<()> {
        if self.norm == NormStage::Idle {
            bail!(
                InvalidState,
                "step: finish_step without begin_step; the gradient norm is not gathered"
            );
        }
        let mut profile = self.profile;
        let buckets = self.plan.buckets.len();
        timed(&mut profile.grad_norm, || {
            self.await_norm()?;
            self.backend.finish_step(
                &StepConstants {
                    clip_grad: self.cfg.clip_grad,
                },
                terms,
            )
        })?;
        self.norm = NormStage::Idle;
        self.end_iteration();
        // Every update (and its tensor-parallel collectives, on the comm stream) is issued
        // before any param collective: a collective waits there for its bucket's owner, which
        // is another rank, so a tensor-parallel gather issued after it would hold this rank's
        // Newton–Schulz until that owner's was done, and the owners' Newton–Schulz would run
        // one after another. The comm stream still starts bucket b's collective as soon as b's
        // owners wrote it.
        for i in 0..self.forward_order.len() {
            let b = self.forward_order[i];
            self.update_muon(b, &mut profile)?;
            self.update_adamw(b, &mut profile)?;
            self.record(StreamKind::Compute, event(b, Ev::ParamReady))?;
        }
        let last = self.forward_order.last().copied();
        // With sharded params there is none: the next gather of each bucket brings its new
        // values.
        for i in 0..self.forward_order.len() * usize::from(self.sharded.is_none()) {
            let b = self.forward_order[i];
            let after = if self.params_after_step { last.unwrap_or(b) } else { b };
            timed(&mut profile.param_collectives, || self.launch_param_sync(b, after))?;
        }
        self.clear_qk_clips();
        if !self.cfg.overlap_param_gather {
            for b in 0..buckets {
                self.wait(StreamKind::Compute, event(b, Ev::ParamSynced))?;
            }
        }
        self.profile = profile;
        match self.set_args {
            Some(set) if std::mem::take(&mut self.own_args) => self.copy_args(&set),
            _ => Ok(()),
        }
    }

    /// Sets the arguments of the later steps that are not given their own: copies them to the
    /// device, ordered on the compute stream before any later step (no host wait).
    pub fn set_step_args(&mut self, args: &StepArgs) -> Result<()> {
        self.copy_args(args)?;
        self.set_args = Some(*args);
        Ok(())
    }

    /// Copies `args` into the device's argument slots, on the compute stream, each override
    /// resolved against the config ([`StepArgs::slots`]).
    fn copy_args(&mut self, args: &StepArgs) -> Result<()> {
        self.backend.set_step_args(args.slots(&self.cfg))
    }

    /// Arguments were set with [`Runtime::set_step_args`], so a step may omit them.
    pub fn has_step_args(&self) -> bool {
        self.set_args.is_some()
    }

    /// Where `step` spent its time so far.
    pub fn profile(&self) -> StepProfile {
        self.profile
    }

    /// Comm stream, after the owners wrote bucket `after`'s new values (`ParamReady`, which the
    /// caller records on the compute stream; `after` is `b`, or the step's last bucket with
    /// [`Runtime::sync_params_after_step`]): bucket `b`'s param collective(s),
    /// then every rank quantizes the bucket's MXFP8 params from the gathered bf16; when params
    /// are staged on the bucket's grad bytes, those bytes are zeroed right after the quantize
    /// read them, on the same stream (the next `zero_grad` then skips the bucket).
    fn launch_param_sync(&mut self, b: usize, after: usize) -> Result<()> {
        let bucket = &self.plan.buckets[b];
        let (staged, direct): (Vec<u32>, Vec<u32>) = bucket.params.iter().partition(|&&p| self.is_staged(p));
        let mut ops = Vec::new();
        if !direct.is_empty() {
            ops.extend(self.param_ops(bucket, false)?);
        }
        if !staged.is_empty() {
            ops.extend(self.param_ops(bucket, true)?);
        }
        let quantize: Vec<(Span, u32)> = bucket
            .params
            .iter()
            .filter(|&&p| self.is_mxfp8(p))
            .map(|&p| {
                let placement = &self.plan.params[p as usize];
                Ok((self.param_destination(p, b as u32, placement.range())?, p))
            })
            .collect::<Result<_>>()?;
        let staged_grads = (!staged.is_empty()).then(|| Self::bucket_span(bucket, Mem::Grad(bucket.buffer)));
        self.wait(StreamKind::Comm, event(after, Ev::ParamReady))?;
        self.backend.collectives(ops)?;
        for (src, p) in quantize {
            self.backend.mxfp8_quantize(StreamKind::Comm, src, p)?;
        }
        if let Some(grads) = staged_grads {
            self.backend.memset_zero(StreamKind::Comm, grads)?;
            self.zeroed_by_param_sync[b] = true;
        }
        self.record(StreamKind::Comm, event(b, Ev::ParamSynced))
    }

    fn end_iteration(&mut self) {
        self.ready.iter_mut().for_each(|r| *r = false);
        self.launched.iter_mut().for_each(|l| *l = false);
        self.next_grad_sync = 0;
        for (pending, bucket) in self.pending.iter_mut().zip(&self.plan.buckets) {
            *pending = bucket.params.len();
        }
    }

    /// The Muon updates of bucket `bucket`'s owned matrices.
    fn update_muon(&mut self, bucket: usize, profile: &mut StepProfile) -> Result<()> {
        for k in 0..self.bucket_batches[bucket].len() {
            let batch = self.layout.muon_batches[self.bucket_batches[bucket][k]];
            let first = self.layout.muon[batch.first];
            let last = self.layout.muon[batch.first + batch.count - 1];
            let spec = &self.params[first.unit.param as usize];
            let matrix = spec.unit_matrix();
            let range = ElemRange::new(first.unit.range.start, last.unit.range.end);
            let len = range.len();
            // Each unit of the batch is one component (split further by the fused splits), so
            // the update is exactly the per-unit update.
            let job = MuonJob {
                master: Span::new(first.master.mem, first.master.start, len),
                momentum: Span::new(Mem::Momentum, first.state, len),
                moment2: Span::new(
                    Mem::Moment2,
                    first.moment2.0,
                    last.moment2.0 + last.moment2.1 - first.moment2.0,
                ),
                grad: window::kept_grad(&self.plan.buckets[first.unit.bucket as usize], self.window(), range),
                rows: batch.count * matrix.rows as usize,
                cols: matrix.cols as usize,
                split_rows: if batch.count == 1 && spec.split_sizes.is_empty() {
                    Vec::new()
                } else {
                    state::component_rows(spec, batch.count)
                },
                split_groups: spec.split_groups as usize,
                tp: spec
                    .tp_joined()
                    .filter(|_| self.cfg.muon_tp_mode != TpMode::Blockwise)
                    .map(|dim| TpJob {
                        dim,
                        mode: self.cfg.muon_tp_mode,
                    }),
                scales: spec.scales(),
            };
            let master = job.master;
            timed(&mut profile.muon, || self.backend.muon_update(job))?;
            if let Some(clip) = self.qk_clip_job(first.unit.param, master) {
                timed(&mut profile.muon, || self.backend.qk_clip(clip))?;
            }
            let destination = self.param_destination(first.unit.param, first.unit.bucket, range)?;
            timed(&mut profile.casts, || self.write_master(master, destination))?;
        }
        Ok(())
    }

    /// The AdamW updates of this rank's pieces of bucket `bucket`.
    fn update_adamw(&mut self, bucket: usize, profile: &mut StepProfile) -> Result<()> {
        for k in 0..self.bucket_adamw[bucket].len() {
            let slot = self.layout.adamw[self.bucket_adamw[bucket][k]];
            let spec = &self.params[slot.piece.param as usize];
            let job = AdamwJob {
                master: slot.master(),
                exp_avg: slot.exp_avg(),
                exp_avg_sq: slot.exp_avg_sq(),
                grad: slot.grad(),
                scales: spec.scales(),
                lr: if spec.flags.has(ParamFlags::EMBEDDING_OR_OUTPUT) {
                    Scalar::DecoupledLr
                } else {
                    Scalar::AdamLr
                },
            };
            timed(&mut profile.adamw, || self.backend.adamw_update(job))?;
            let destination = self.param_destination(slot.piece.param, slot.bucket, slot.piece.buffer_range)?;
            timed(&mut profile.casts, || self.write_master(slot.master(), destination))?;
        }
        Ok(())
    }

    /// An owner's new value into its param's storage: a cast from the master, or nothing when
    /// the master is that storage (an f32 param).
    fn write_master(&mut self, master: Span, destination: Span) -> Result<()> {
        if master == destination {
            return Ok(());
        }
        self.backend.cast(master, destination)
    }

    /// Blocks until every enqueued operation finished.
    pub fn synchronize(&mut self) -> Result<()> {
        self.backend.synchronize()?;
        self.forget_events();
        Ok(())
    }
}

impl Drop for Runtime {
    /// Finishes the queued collectives before the memory goes away, so peers in the same
    /// collectives are not left waiting for this rank. A failure here (a broken group) has
    /// already been reported by the call that hit it.
    fn drop(&mut self) {
        let _ = self.backend.synchronize();
    }
}

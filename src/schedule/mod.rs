//! The step pipeline as backend-neutral operations with stream and event order (DESIGN.md
//! section 5). Every decision — which bytes move, when, after which event, which state is
//! updated — is made here; a backend only executes.
//!
//! Events per bucket b: `GRAD_READY` (compute: all of b's grads accumulated), `GRAD_SYNCED`
//! (comm: b's gradient collective done), `PARAM_READY` (compute: owners wrote b's new values),
//! `PARAM_SYNCED` (comm: b's param collective done).

pub mod restore;
pub mod state;

use crate::backend::Backend;
use crate::backend::ops::{AdamwJob, CollOp, EventId, Mem, MuonJob, Span, StreamKind};
use crate::bail;
use crate::config::{Config, MuonLayout};
use crate::error::Result;
use crate::model::{ParamFlags, ParamSpec};
use crate::numerics::adamw::AdamWArgs;
use crate::numerics::clip_coefficient;
use crate::numerics::muon::MuonStepArgs;
use crate::plan::Plan;
use crate::plan::{Bucket, BucketSplit, ElemRange};
use state::StateLayout;

/// Learning rates and weight decays of one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepArgs {
    pub lr: f32,
    pub weight_decay: f32,
    pub adam_lr: f32,
    pub adam_weight_decay: f32,
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

/// Host wall-clock seconds spent inside `step`, summed over steps, by part. On the host
/// backend every part runs inside the call; on an asynchronous backend these are launch times.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct StepProfile {
    /// Waiting for the gradient collectives (and launching those not yet started).
    pub grad_collectives: f64,
    /// Local squared norms and the scalar all-reduce.
    pub grad_norm: f64,
    /// Muon updates (momentum, Newton–Schulz, apply).
    pub muon: f64,
    /// AdamW updates.
    pub adamw: f64,
    /// Writing new values (master → param dtype or staging).
    pub casts: f64,
    /// Launching the param collectives (and waiting for them without overlap_param_gather).
    pub param_collectives: f64,
}

fn timed<T>(total: &mut f64, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let start = std::time::Instant::now();
    let result = f();
    *total += start.elapsed().as_secs_f64();
    result
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
    steps: u64,
    profile: StepProfile,
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
        init: impl Fn(usize) -> Option<&'a [f32]>,
    ) -> Result<Self> {
        let layout = StateLayout::new(&plan, &params, &cfg, rank);
        backend.allocate(&layout.memory)?;
        let zeros = |n: u64| vec![0.0f32; n as usize];
        for (p, placement) in plan.params.iter().enumerate() {
            let values = init(p).map_or_else(|| zeros(placement.numel), <[f32]>::to_vec);
            backend.upload(
                Span::new(Mem::Param(placement.buffer), placement.offset, placement.numel),
                &values,
            )?;
        }
        for slot in &layout.muon {
            let p = slot.unit.param as usize;
            let local = slot.unit.range.start - plan.params[p].offset;
            let values = init(p).map_or_else(
                || zeros(slot.unit.range.len()),
                |v| v[local as usize..(local + slot.unit.range.len()) as usize].to_vec(),
            );
            backend.upload(slot.master(), &values)?;
        }
        for slot in &layout.adamw {
            let r = slot.piece.param_range;
            let values = init(slot.piece.param as usize)
                .map_or_else(|| zeros(r.len()), |v| v[r.start as usize..r.end as usize].to_vec());
            backend.upload(slot.master(), &values)?;
        }
        for tensor in &layout.memory.mxfp8 {
            let placement = &plan.params[tensor.param as usize];
            let src = Span::new(Mem::Param(placement.buffer), placement.offset, placement.numel);
            backend.mxfp8_quantize(StreamKind::Compute, src, tensor.param)?;
        }
        let pending = plan.buckets.iter().map(|b| b.params.len()).collect();
        Ok(Runtime {
            ready: vec![false; params.len()],
            launched: vec![false; plan.buckets.len()],
            pending,
            plan,
            params,
            cfg,
            layout,
            backend,
            steps: 0,
            profile: StepProfile::default(),
        })
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    pub fn layout(&self) -> &StateLayout {
        &self.layout
    }

    pub fn backend_mut(&mut self) -> &mut dyn Backend {
        self.backend.as_mut()
    }

    pub fn steps(&self) -> u64 {
        self.steps
    }

    fn dp(&self) -> usize {
        self.plan.dp as usize
    }

    fn bucket_span(bucket: &Bucket, mem: Mem) -> Span {
        Span::new(mem, bucket.start, bucket.numel())
    }

    fn grad_ops(&self, bucket: &Bucket) -> Vec<CollOp> {
        let span = Self::bucket_span(bucket, Mem::Grad(bucket.buffer));
        match (&bucket.split, self.plan.layout) {
            (BucketSplit::OwnerRanges(_), MuonLayout::Allreduce) => vec![CollOp::AllReduce { span }],
            (BucketSplit::OwnerRanges(ranges), _) => owner_ops(ranges, Mem::Grad(bucket.buffer), |root, span| {
                CollOp::Reduce { root, span }
            }),
            (BucketSplit::EqualShards { .. }, _) => vec![CollOp::ReduceScatter { span }],
        }
    }

    /// The param collectives of `bucket` on the param buffer, or on its bf16 staging view.
    fn param_ops(&self, bucket: &Bucket, staging: bool) -> Vec<CollOp> {
        let span = |range: ElemRange| {
            if staging {
                self.staging_span(bucket, range)
            } else {
                Span::new(Mem::Param(bucket.buffer), range.start, range.len())
            }
        };
        match &bucket.split {
            BucketSplit::OwnerRanges(ranges) => ranges
                .iter()
                .enumerate()
                .filter(|(_, r)| !r.is_empty())
                .map(|(root, r)| CollOp::Broadcast {
                    root: root as u32,
                    span: span(*r),
                })
                .collect(),
            BucketSplit::EqualShards { .. } => {
                vec![CollOp::AllGather {
                    span: span(ElemRange::new(bucket.start, bucket.end)),
                }]
            }
        }
    }

    /// Where the bf16 copy of `range` (elements of `bucket`'s buffer) is staged: inside
    /// `bucket`'s own grad bytes, at `2·(e − bucket.start)` bytes from the bucket's first grad
    /// byte. A grad element is at least 2 bytes, so the staging of a bucket never leaves that
    /// bucket's grad bytes ([`Runtime::staging_stays_in_bucket`] checks it).
    fn staging_span(&self, bucket: &Bucket, range: ElemRange) -> Span {
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

    fn is_mxfp8(&self, p: u32) -> bool {
        self.params[p as usize].flags.has(ParamFlags::MXFP8)
    }

    /// Whether param `p` travels as bf16 staged on the grad buffer (MXFP8 with gather on).
    fn is_staged(&self, p: u32) -> bool {
        self.cfg.mxfp8_param_gather && self.is_mxfp8(p)
    }

    /// Where an owner writes the new value of `range` of param `p` (bucket `b`).
    fn param_destination(&self, p: u32, b: u32, range: ElemRange) -> Span {
        let bucket = &self.plan.buckets[b as usize];
        if self.is_staged(p) {
            self.staging_span(bucket, range)
        } else {
            Span::new(Mem::Param(bucket.buffer), range.start, range.len())
        }
    }

    /// Marks the grad buffer for zeroing: each bucket's memset is ordered after everything
    /// that still reads its grad bytes — its gradient collective and, when MXFP8 params are
    /// staged on it, their param gather and quantize.
    pub fn zero_grad(&mut self) -> Result<()> {
        for b in 0..self.plan.buckets.len() {
            self.backend.wait(StreamKind::Compute, event(b, Ev::GradSynced))?;
            if self.plan.buckets[b].params.iter().any(|&p| self.is_staged(p)) {
                self.backend.wait(StreamKind::Compute, event(b, Ev::ParamSynced))?;
            }
            let bucket = &self.plan.buckets[b];
            self.backend
                .memset_zero(Self::bucket_span(bucket, Mem::Grad(bucket.buffer)))?;
        }
        Ok(())
    }

    /// Forward pre-hook: the compute stream waits for bucket `b`'s params.
    pub fn wait_params(&mut self, b: u32) -> Result<()> {
        if b as usize >= self.plan.buckets.len() {
            bail!(
                InvalidState,
                "wait_params: bucket {b} does not exist (the plan has {} buckets)",
                self.plan.buckets.len()
            );
        }
        self.backend
            .wait(StreamKind::Compute, event(b as usize, Ev::ParamSynced))
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
        *ready = true;
        let b = self.plan.params[p as usize].bucket as usize;
        self.pending[b] -= 1;
        if self.pending[b] == 0 && self.cfg.overlap_grad_reduce {
            self.launch_grad_sync(b)?;
        }
        Ok(())
    }

    fn launch_grad_sync(&mut self, b: usize) -> Result<()> {
        let bucket = &self.plan.buckets[b];
        if self.dp() > 1 {
            self.backend.scale(
                Self::bucket_span(bucket, Mem::Grad(bucket.buffer)),
                1.0 / self.dp() as f32,
            )?;
        }
        let ops = self.grad_ops(bucket);
        self.backend.record(StreamKind::Compute, event(b, Ev::GradReady))?;
        self.backend.wait(StreamKind::Comm, event(b, Ev::GradReady))?;
        self.backend.collectives(&ops)?;
        self.backend.record(StreamKind::Comm, event(b, Ev::GradSynced))?;
        self.launched[b] = true;
        Ok(())
    }

    fn owned_grad_spans(&self) -> Vec<Span> {
        let muon = self.layout.muon.iter().map(|s| s.grad());
        muon.chain(self.layout.adamw.iter().map(|s| s.grad())).collect()
    }

    /// One optimizer step (DESIGN.md sections 5 and 6).
    pub fn step(&mut self, args: &StepArgs) -> Result<StepInfo> {
        let mut profile = self.profile;
        timed(&mut profile.grad_collectives, || {
            for b in 0..self.plan.buckets.len() {
                if !self.launched[b] {
                    self.launch_grad_sync(b)?;
                }
            }
            for b in 0..self.plan.buckets.len() {
                self.backend.wait(StreamKind::Compute, event(b, Ev::GradSynced))?;
            }
            Ok(())
        })?;
        let total = timed(&mut profile.grad_norm, || {
            let local = self.backend.squared_norm(&self.owned_grad_spans())?;
            self.backend.all_reduce_f64(local)
        })?;
        self.end_iteration();
        if !total.is_finite() {
            self.profile = profile;
            return Ok(StepInfo {
                grad_norm: total.sqrt(),
                clip_coef: 1.0,
                skipped: true,
                step: self.steps,
            });
        }
        let clip_coef = clip_coefficient(total, self.cfg.clip_grad);
        self.steps += 1;
        self.update_muon(args, clip_coef, &mut profile)?;
        self.update_adamw(args, clip_coef, &mut profile)?;
        timed(&mut profile.param_collectives, || {
            for b in 0..self.plan.buckets.len() {
                self.launch_param_sync(b)?;
            }
            if !self.cfg.overlap_param_gather {
                for b in 0..self.plan.buckets.len() {
                    self.backend.wait(StreamKind::Compute, event(b, Ev::ParamSynced))?;
                }
            }
            Ok(())
        })?;
        self.profile = profile;
        Ok(StepInfo {
            grad_norm: total.sqrt(),
            clip_coef,
            skipped: false,
            step: self.steps,
        })
    }

    /// Where `step` spent its time so far.
    pub fn profile(&self) -> StepProfile {
        self.profile
    }

    /// Comm stream, after the owners wrote bucket `b`'s new values: the param collective(s),
    /// then every rank quantizes the bucket's MXFP8 params from the gathered bf16.
    fn launch_param_sync(&mut self, b: usize) -> Result<()> {
        let bucket = &self.plan.buckets[b];
        let (staged, direct): (Vec<u32>, Vec<u32>) = bucket.params.iter().partition(|&&p| self.is_staged(p));
        let mut ops = Vec::new();
        if !direct.is_empty() {
            ops.extend(self.param_ops(bucket, false));
        }
        if !staged.is_empty() {
            ops.extend(self.param_ops(bucket, true));
        }
        let quantize: Vec<(Span, u32)> = bucket
            .params
            .iter()
            .filter(|&&p| self.is_mxfp8(p))
            .map(|&p| {
                let placement = &self.plan.params[p as usize];
                (self.param_destination(p, b as u32, placement.range()), p)
            })
            .collect();
        self.backend.record(StreamKind::Compute, event(b, Ev::ParamReady))?;
        self.backend.wait(StreamKind::Comm, event(b, Ev::ParamReady))?;
        self.backend.collectives(&ops)?;
        for (src, p) in quantize {
            self.backend.mxfp8_quantize(StreamKind::Comm, src, p)?;
        }
        self.backend.record(StreamKind::Comm, event(b, Ev::ParamSynced))
    }

    fn end_iteration(&mut self) {
        self.ready.iter_mut().for_each(|r| *r = false);
        self.launched.iter_mut().for_each(|l| *l = false);
        for (pending, bucket) in self.pending.iter_mut().zip(&self.plan.buckets) {
            *pending = bucket.params.len();
        }
    }

    fn wd_scale(spec: &ParamSpec) -> f32 {
        if spec.flags.has(ParamFlags::NO_WEIGHT_DECAY) {
            0.0
        } else {
            spec.wd_scale
        }
    }

    fn update_muon(&mut self, args: &StepArgs, clip_coef: f32, profile: &mut StepProfile) -> Result<()> {
        for b in 0..self.layout.muon_batches.len() {
            let batch = self.layout.muon_batches[b];
            let first = self.layout.muon[batch.first];
            let last = self.layout.muon[batch.first + batch.count - 1];
            let spec = &self.params[first.unit.param as usize];
            let matrix = spec.unit_matrix();
            let range = ElemRange::new(first.unit.range.start, last.unit.range.end);
            let len = range.len();
            // Each unit of the batch is one component (split further by the fused splits), so
            // the update is exactly the per-unit update.
            let unit_rows: Vec<usize> = if spec.split_sizes.is_empty() {
                vec![matrix.rows as usize]
            } else {
                spec.split_sizes.iter().map(|&s| s as usize).collect()
            };
            let job = MuonJob {
                master: Span::new(Mem::Master, first.state, len),
                momentum: Span::new(Mem::Momentum, first.state, len),
                grad: Span::new(Mem::Grad(first.unit.buffer), range.start, len),
                rows: batch.count * matrix.rows as usize,
                cols: matrix.cols as usize,
                split_rows: if batch.count == 1 && spec.split_sizes.is_empty() {
                    Vec::new()
                } else {
                    unit_rows.repeat(batch.count)
                },
                args: MuonStepArgs {
                    lr: args.lr,
                    weight_decay: args.weight_decay,
                    lr_scale: spec.lr_scale,
                    wd_scale: Self::wd_scale(spec),
                    clip_coef,
                },
            };
            timed(&mut profile.muon, || self.backend.muon_update(&job))?;
            let destination = self.param_destination(first.unit.param, first.unit.bucket, range);
            timed(&mut profile.casts, || self.backend.cast(job.master, destination))?;
        }
        Ok(())
    }

    fn update_adamw(&mut self, args: &StepArgs, clip_coef: f32, profile: &mut StepProfile) -> Result<()> {
        for i in 0..self.layout.adamw.len() {
            let slot = self.layout.adamw[i];
            let spec = &self.params[slot.piece.param as usize];
            let job = AdamwJob {
                master: slot.master(),
                exp_avg: slot.exp_avg(),
                exp_avg_sq: slot.exp_avg_sq(),
                grad: slot.grad(),
                args: AdamWArgs {
                    lr: args.adam_lr * spec.lr_scale,
                    weight_decay: args.adam_weight_decay * Self::wd_scale(spec),
                    beta1: self.cfg.adam_beta1,
                    beta2: self.cfg.adam_beta2,
                    eps: self.cfg.adam_eps,
                    step: self.steps,
                    clip_coef,
                },
            };
            timed(&mut profile.adamw, || self.backend.adamw_update(&job))?;
            let destination = self.param_destination(slot.piece.param, slot.bucket, slot.piece.buffer_range);
            timed(&mut profile.casts, || self.backend.cast(slot.master(), destination))?;
        }
        Ok(())
    }

    /// Blocks until every enqueued operation finished.
    pub fn synchronize(&mut self) -> Result<()> {
        self.backend.synchronize()
    }

    /// Rowwise data, rowwise scales, columnwise data, columnwise scales of an MXFP8 param.
    pub fn mxfp8_addresses(&self, p: usize) -> Option<[*mut u8; 4]> {
        self.backend.mxfp8_addresses(p as u32)
    }

    /// Address of param `p`'s gradient (`grad`) or model-dtype storage; an MXFP8 param has no
    /// model-dtype storage a framework may use (NULL).
    pub fn address(&self, p: usize, grad: bool) -> *mut std::ffi::c_void {
        if !grad && self.is_mxfp8(p as u32) {
            return std::ptr::null_mut();
        }
        let placement = &self.plan.params[p];
        let mem = if grad {
            Mem::Grad(placement.buffer)
        } else {
            Mem::Param(placement.buffer)
        };
        self.backend.address(Span::new(mem, placement.offset, placement.numel))
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

/// The fp32 state a rank owns for one piece of a param, in the param's flat coordinates.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnedState {
    pub param: u32,
    /// Element range inside the param.
    pub range: ElemRange,
    pub master: Vec<f32>,
    /// Muon: `[momentum]`; AdamW: `[exp_avg, exp_avg_sq]`.
    pub moments: Vec<Vec<f32>>,
}

impl Runtime {
    /// Everything this rank owns, Muon units first, after synchronizing.
    pub fn owned_state(&mut self) -> Result<Vec<OwnedState>> {
        self.backend.synchronize()?;
        let mut out = Vec::new();
        for slot in self.layout.muon.clone() {
            let offset = self.plan.params[slot.unit.param as usize].offset;
            out.push(OwnedState {
                param: slot.unit.param,
                range: slot.unit.range.shifted_down(offset),
                master: self.backend.download(slot.master())?,
                moments: vec![self.backend.download(slot.momentum())?],
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

    /// This rank's copy of param `p` as f32 (what its forward would read).
    pub fn param_values(&mut self, p: usize) -> Result<Vec<f32>> {
        let placement = &self.plan.params[p];
        self.backend.download(Span::new(
            Mem::Param(placement.buffer),
            placement.offset,
            placement.numel,
        ))
    }
}

fn owner_ops(ranges: &[ElemRange], mem: Mem, op: impl Fn(u32, Span) -> CollOp) -> Vec<CollOp> {
    ranges
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.is_empty())
        .map(|(root, r)| op(root as u32, Span::new(mem, r.start, r.len())))
        .collect()
}

//! The host backend's commands: [`Op`]s run on host memory (compute stream) or queued on the
//! rank's stream worker (comm stream).

use std::collections::HashMap;
use std::sync::PoisonError;

use super::{HostBackend, Mxfp8Storage, Mxfp8Target, Storage};
use crate::backend::ops::{
    AdamwJob, CollOp, EventId, InitSource, Mem, MemoryLayout, MuonJob, NormSums, NormTerm, Op, STEP_ARGS, Scalar, Span,
    StepConstants, StreamKind,
};
use crate::bail;
use crate::config::Dtype;
use crate::error::Result;
use crate::numerics::adamw::{AdamWArgs, adamw_update_split};
use crate::numerics::bf16::{bf16_to_f32, cast_f32_to_bf16, f32_to_bf16_rne};
use crate::numerics::muon::{MuonShape, MuonStepArgs, MuonWorkspace, TpShard, muon_update_sharded};
use crate::numerics::mxfp8::{Direction, scale_shape};
use crate::numerics::{RANK_NORM_WORDS, RankNorm, SquareSum, mean_scale, step_scalars};

impl HostBackend {
    /// Runs the command `op` ([`crate::backend::Backend::execute`]).
    pub(super) fn run_command(&mut self, op: &Op) -> Result<()> {
        match op {
            Op::Allocate(layout) => self.run_allocate(layout),
            Op::Upload { dst, bits } => self.run_upload(*dst, bits),
            &Op::MemsetZero { stream, span } => self.run_memset_zero(stream, span),
            &Op::Cast { src, dst } => self.run_cast(src, dst),
            &Op::Copy { stream, src, dst } => self.run_copy(stream, src, dst),
            Op::AttachInit {
                param,
                dtype,
                numel,
                source,
            } => self.run_attach_init(*param, *dtype, *numel, source),
            &Op::DetachInit(param) => self.run_detach_init(param),
            Op::SquaredNorm { counted, checked } => self.run_squared_norm(counted, checked),
            Op::GatherNormSums => self.run_gather_norm_sums(),
            Op::FinishStep { constants, terms } => self.run_finish_step(constants, terms),
            &Op::SetStepArgs(bits) => self.run_set_step_args(bits),
            &Op::SetStepCount(step) => self.run_set_step_count(step),
            Op::MuonUpdate(job) => self.run_muon_update(job),
            Op::AdamwUpdate(job) => self.run_adamw_update(job),
            Op::QkClip(job) => self.run_qk_clip(job),
            &Op::Record { stream, event } => self.run_record(stream, event),
            &Op::Wait { stream, event } => self.run_wait(stream, event),
            Op::Collectives(ops) => self.run_collectives(ops),
            &Op::Mxfp8Quantize { stream, src, param } => self.run_mxfp8_quantize(stream, src, param),
            Op::Synchronize => self.stream.synchronize(),
            Op::Download(_)
            | Op::DownloadMxfp8 { .. }
            | Op::ReadScalars
            | Op::AllGatherU64 { .. }
            | Op::Mxfp8Addresses(_)
            | Op::Address(_) => bail!(Internal, "{op:?} is a query, not a command"),
        }
    }

    fn run_allocate(&mut self, layout: &MemoryLayout) -> Result<()> {
        let mut mems = HashMap::new();
        for (i, b) in layout.buffers.iter().enumerate() {
            mems.insert(Mem::Param(i as u32), Storage::new(b.param_numel, b.dtype)?);
            mems.insert(Mem::Grad(i as u32), Storage::new(b.numel, layout.grad_dtype)?);
            if b.owned_numel > 0 {
                mems.insert(Mem::OwnedParam(i as u32), Storage::new(b.owned_numel, b.dtype)?);
                mems.insert(
                    Mem::OwnedGrad(i as u32),
                    Storage::new(b.owned_numel, layout.grad_dtype)?,
                );
            }
        }
        mems.insert(Mem::Master, Storage::new(layout.master, Dtype::F32)?);
        mems.insert(Mem::Momentum, Storage::new(layout.momentum, layout.momentum_dtype)?);
        mems.insert(Mem::Moment2, Storage::new(layout.moment2, Dtype::F32)?);
        mems.insert(Mem::ExpAvg, Storage::new(layout.adam_moments, Dtype::F32)?);
        mems.insert(Mem::ExpAvgSq, Storage::new(layout.adam_moments, Dtype::F32)?);
        self.mems = mems;
        self.mxfp8 = layout
            .mxfp8
            .iter()
            .map(|t| {
                let (rows, cols) = (t.rows, t.cols);
                let bytes = |d| {
                    let (r, c) = scale_shape(rows, cols, d);
                    vec![0u8; r * c].into_boxed_slice()
                };
                let data = || vec![0u8; rows * cols].into_boxed_slice();
                let parts = [data(), bytes(Direction::Rowwise), data(), bytes(Direction::Colwise)];
                (t.param, Mxfp8Storage { rows, cols, parts })
            })
            .collect();
        self.mxfp8_layout = layout.mxfp8_scale_layout;
        self.workspace = MuonWorkspace::for_need(
            layout.muon_work.matrix as usize,
            layout.max_component,
            self.muon_opts.ns.precision,
            self.threads,
        )?;
        Ok(())
    }

    fn run_upload(&mut self, dst: Span, bits: &[u32]) -> Result<()> {
        if bits.len() as u64 != dst.len {
            bail!(Internal, "upload of {} values into {dst:?}", bits.len());
        }
        match self.resolve(dst)?.1 {
            Dtype::F32 => {
                for (d, &b) in unsafe { self.f32s(dst) }?.iter_mut().zip(bits) {
                    *d = f32::from_bits(b);
                }
            }
            Dtype::Bf16 => {
                for (d, &b) in unsafe { self.u16s(dst) }?.iter_mut().zip(bits) {
                    *d = f32_to_bf16_rne(f32::from_bits(b));
                }
            }
        }
        Ok(())
    }

    fn run_memset_zero(&mut self, stream: StreamKind, span: Span) -> Result<()> {
        let region = self.region(span)?;
        let bytes = region.len() * region.dtype().size();
        let run = move || {
            // SAFETY: bounds checked by `region`; live and ordered by events (field order).
            unsafe { std::ptr::write_bytes(region.as_ptr(), 0, bytes) };
            Ok(())
        };
        match stream {
            StreamKind::Compute => run(),
            StreamKind::Comm => self.stream.enqueue(run),
        }
    }

    fn run_copy(&mut self, stream: StreamKind, src: Span, dst: Span) -> Result<()> {
        let (from, to) = (self.region(src)?, self.region(dst)?);
        if src.len != dst.len || src.mem == dst.mem || from.dtype() != to.dtype() {
            bail!(
                Internal,
                "copy {src:?} -> {dst:?}: lengths or dtypes differ, or spans share memory"
            );
        }
        let bytes = from.len() * from.dtype().size();
        let run = move || {
            // SAFETY: bounds checked by `region`, distinct allocations; live and ordered by
            // events (field order).
            unsafe { std::ptr::copy_nonoverlapping(from.as_ptr(), to.as_ptr(), bytes) };
            Ok(())
        };
        match stream {
            StreamKind::Compute => run(),
            StreamKind::Comm => self.stream.enqueue(run),
        }
    }

    fn run_cast(&mut self, src: Span, dst: Span) -> Result<()> {
        if src.len != dst.len || src.mem == dst.mem {
            bail!(
                Internal,
                "cast {src:?} -> {dst:?}: lengths differ or spans share memory"
            );
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        let values = self.read_as_f32(src, &mut scratch)?;
        match self.resolve(dst)?.1 {
            Dtype::F32 => unsafe { self.f32s(dst) }?.copy_from_slice(values),
            Dtype::Bf16 => {
                for (d, &v) in unsafe { self.u16s(dst) }?.iter_mut().zip(values) {
                    *d = f32_to_bf16_rne(v);
                }
            }
        }
        self.scratch = scratch;
        Ok(())
    }

    fn run_attach_init(&mut self, param: u32, dtype: Dtype, numel: u64, source: &InitSource) -> Result<()> {
        let InitSource::Host(bytes) = source else {
            bail!(Internal, "the host backend reads initial values from host memory")
        };
        if numel == 0 || bytes.len() as u64 != numel * dtype.size() as u64 {
            bail!(
                Internal,
                "init of param {param}: {} bytes for {numel} values",
                bytes.len()
            );
        }
        let storage = Storage::new(numel, dtype)?;
        // SAFETY: `storage` is a fresh allocation of exactly `bytes.len()` > 0 bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), storage.ptr, bytes.len()) };
        self.mems.insert(Mem::Init(param), storage);
        Ok(())
    }

    fn run_detach_init(&mut self, param: u32) -> Result<()> {
        match self.mems.remove(&Mem::Init(param)) {
            Some(_) => Ok(()),
            None => bail!(Internal, "init of param {param} is not attached"),
        }
    }

    fn run_squared_norm(&mut self, counted: &[Span], checked: &[Span]) -> Result<()> {
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut sum = SquareSum::default();
        let scale = mean_scale(self.comm.size());
        let result = (|| {
            for (spans, counts) in [(counted, true), (checked, false)] {
                for span in spans {
                    sum.add_split(self.read_as_f32(*span, &mut scratch)?, scale, counts, self.threads);
                }
            }
            Ok(())
        })();
        self.scratch = scratch;
        let steps = self.scalars().get(Scalar::Step) as u64;
        *self.own_sum.lock().unwrap_or_else(PoisonError::into_inner) = RankNorm { sum, steps };
        result
    }

    fn run_gather_norm_sums(&mut self) -> Result<()> {
        let comm = self.norm_group.clone().unwrap_or_else(|| self.comm.clone());
        let own_sum = self.own_sum.clone();
        let rank_sums = self.rank_sums.clone();
        self.stream.enqueue(move || {
            let local = own_sum.lock().unwrap_or_else(PoisonError::into_inner).words();
            let words = Self::host_comm(&comm).all_gather_words(&local)?;
            *rank_sums.lock().unwrap_or_else(PoisonError::into_inner) = words
                .chunks_exact(RANK_NORM_WORDS)
                .map(|w| RankNorm::from_words(w.try_into().expect("chunks of RANK_NORM_WORDS")))
                .collect();
            Ok(())
        })
    }

    fn run_finish_step(&mut self, constants: &StepConstants, terms: &[NormTerm]) -> Result<()> {
        let gathered = terms
            .iter()
            .map(|term| {
                let sums = match &term.sums {
                    NormSums::Own => &self.rank_sums,
                    NormSums::Host(sums) => sums,
                    NormSums::Device(_) => bail!(
                        CommMismatch,
                        "step: a host optimizer cannot share a clip with a cuda optimizer's device norm"
                    ),
                };
                Ok(sums.lock().unwrap_or_else(PoisonError::into_inner).clone())
            })
            .collect::<Result<Vec<_>>>()?;
        let terms: Vec<&[RankNorm]> = gathered.iter().map(Vec::as_slice).collect();
        let mut scalars = self.scalars();
        let previous = scalars.get(Scalar::Step) as u64;
        let s = step_scalars(
            &terms,
            self.comm.size(),
            previous,
            constants.clip_grad,
            scalars.f32(Scalar::AdamBeta1),
            scalars.f32(Scalar::AdamBeta2),
        );
        for (slot, value) in [
            (Scalar::GradNorm, s.grad_norm),
            (Scalar::ClipCoef, f64::from(s.clip_coef)),
            (Scalar::GradScale, f64::from(s.grad_scale)),
            (Scalar::Skip, f64::from(u8::from(s.skipped))),
            (Scalar::Step, s.step as f64),
            (Scalar::Bc1, f64::from(s.bc1)),
            (Scalar::Bc2, f64::from(s.bc2)),
            (Scalar::DisagreeRank, 0.0),
        ] {
            scalars.values[slot.slot()] = value;
        }
        if let Some(d) = s.disagree {
            for (slot, value) in [
                (Scalar::DisagreeTerm, d.term as f64),
                (Scalar::DisagreeRank, (d.rank + 1) as f64),
                (Scalar::DisagreeSteps, d.steps as f64),
                (Scalar::DisagreeRank0Steps, d.rank0_steps as f64),
            ] {
                scalars.values[slot.slot()] = value;
            }
        }
        Ok(())
    }

    fn run_set_step_args(&mut self, bits: [u32; STEP_ARGS]) -> Result<()> {
        let first = Scalar::Lr.slot();
        let mut scalars = self.scalars();
        for (slot, value) in scalars.values[first..first + STEP_ARGS].iter_mut().zip(bits) {
            *slot = f64::from(f32::from_bits(value));
        }
        Ok(())
    }

    fn run_set_step_count(&mut self, step: u64) -> Result<()> {
        self.scalars().values[Scalar::Step.slot()] = step as f64;
        Ok(())
    }

    fn run_muon_update(&mut self, job: &MuonJob) -> Result<()> {
        let tp_group = match (job.tp, &self.tp_group) {
            (None, _) => None,
            (Some(tp), Some(group)) => Some((tp, group.clone())),
            (Some(_), None) => bail!(
                InvalidState,
                "muon_update: a tensor-parallel shard needs the TP group (muon_optimizer_set_tp_group)"
            ),
        };
        let (args, skipped) = {
            let s = self.scalars();
            let args = MuonStepArgs {
                lr: s.f32(Scalar::Lr),
                weight_decay: s.f32(Scalar::WeightDecay),
                scales: job.scales,
                momentum: s.f32(Scalar::MuonMomentum),
                grad_scale: s.f32(Scalar::GradScale),
                clip_coef: s.f32(Scalar::ClipCoef),
            };
            (args, s.get(Scalar::Skip) != 0.0)
        };
        if skipped && tp_group.is_none() {
            return Ok(());
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut workspace = std::mem::take(&mut self.workspace);
        let result = (|| {
            let grad = self.read_as_f32(job.grad, &mut scratch)?;
            let master = unsafe { self.f32s(job.master) }?;
            // A bf16 momentum is updated as f32 values (exact) and stored back after: the
            // update rounds each new value to bf16 already, so the store is exact too.
            let (bf16_momentum, mut widened) = match self.resolve(job.momentum)?.1 {
                Dtype::Bf16 => {
                    let bits = unsafe { self.u16s(job.momentum) }?;
                    let values: Vec<f32> = bits.iter().map(|&b| bf16_to_f32(b)).collect();
                    (Some(bits), values)
                }
                Dtype::F32 => (None, Vec::new()),
            };
            let momentum = match bf16_momentum {
                Some(_) => &mut widened[..],
                None => unsafe { self.f32s(job.momentum) }?,
            };
            let moment2 = unsafe { self.f32s(job.moment2) }?;
            let shape = MuonShape {
                rows: job.rows,
                cols: job.cols,
                split_rows: &job.split_rows,
                split_groups: job.split_groups,
            };
            let Some((tp, group)) = &tp_group else {
                muon_update_sharded(
                    master,
                    (&mut *momentum, moment2),
                    grad,
                    &shape,
                    &args,
                    &self.muon_opts,
                    &mut workspace,
                    None,
                )?;
                if let Some(bits) = bf16_momentum {
                    cast_f32_to_bf16(momentum, bits);
                }
                return Ok(());
            };
            let mut gather = |shard: &[f32]| Self::gather_tp(group, shard);
            let mut shard = TpShard {
                job: *tp,
                ranks: group.size(),
                rank: group.rank(),
                gather: &mut gather,
            };
            // A skipped step changes no state, yet the TP peers gather whatever this rank
            // does: the update runs on copies, so every collective of it is joined.
            let (mut master_copy, mut momentum_copy, mut moment2_copy);
            let (master, updated, moment2) = if skipped {
                (master_copy, momentum_copy, moment2_copy) = (master.to_vec(), momentum.to_vec(), moment2.to_vec());
                (&mut master_copy[..], &mut momentum_copy[..], &mut moment2_copy[..])
            } else {
                (master, &mut *momentum, moment2)
            };
            muon_update_sharded(
                master,
                (updated, moment2),
                grad,
                &shape,
                &args,
                &self.muon_opts,
                &mut workspace,
                Some(&mut shard),
            )?;
            if let (Some(bits), false) = (bf16_momentum, skipped) {
                cast_f32_to_bf16(momentum, bits);
            }
            Ok(())
        })();
        self.scratch = scratch;
        self.workspace = workspace;
        result
    }

    fn run_adamw_update(&mut self, job: &AdamwJob) -> Result<()> {
        let args = {
            let s = self.scalars();
            if s.get(Scalar::Skip) != 0.0 {
                return Ok(());
            }
            AdamWArgs {
                lr: s.f32(job.lr),
                weight_decay: s.f32(Scalar::AdamWeightDecay),
                scales: job.scales,
                beta1: s.f32(Scalar::AdamBeta1),
                beta2: s.f32(Scalar::AdamBeta2),
                eps: s.f32(Scalar::AdamEps),
                step: s.get(Scalar::Step) as u64,
                grad_scale: s.f32(Scalar::GradScale),
                clip_coef: s.f32(Scalar::ClipCoef),
                cautious_weight_decay: self.muon_opts.cautious_weight_decay,
            }
        };
        let mut scratch = std::mem::take(&mut self.scratch);
        let result = (|| {
            let grad = self.read_as_f32(job.grad, &mut scratch)?;
            let master = unsafe { self.f32s(job.master) }?;
            let m = unsafe { self.f32s(job.exp_avg) }?;
            let v = unsafe { self.f32s(job.exp_avg_sq) }?;
            adamw_update_split(master, m, v, grad, &args, self.threads)
        })();
        self.scratch = scratch;
        result
    }

    fn run_record(&mut self, stream: StreamKind, event: EventId) -> Result<()> {
        self.event(event);
        match stream {
            StreamKind::Compute => self.events[event.0].record_on_compute(),
            StreamKind::Comm => self.stream.record_on_comm(&self.events[event.0]),
        }
        Ok(())
    }

    fn run_wait(&mut self, stream: StreamKind, event: EventId) -> Result<()> {
        self.event(event);
        match stream {
            StreamKind::Compute => self.events[event.0].synchronize(),
            StreamKind::Comm => self.stream.comm_wait_event(&self.events[event.0]),
        }
    }

    fn run_collectives(&mut self, ops: &[CollOp]) -> Result<()> {
        let group = ops
            .iter()
            .map(|op| self.to_collective(op))
            .collect::<Result<Vec<_>>>()?;
        let comm = self.comm.clone();
        self.stream.enqueue(move || Self::host_comm(&comm).group(&group))
    }

    fn run_mxfp8_quantize(&mut self, stream: StreamKind, src: Span, param: u32) -> Result<()> {
        let Some(storage) = self.mxfp8.get_mut(&param) else {
            bail!(Internal, "param {param} has no MXFP8 storage")
        };
        let (rows, cols, layout) = (storage.rows, storage.cols, self.mxfp8_layout);
        let target = Mxfp8Target {
            parts: storage.parts.each_mut().map(|p| (p.as_mut_ptr(), p.len())),
        };
        if src.len as usize != rows * cols {
            bail!(Internal, "mxfp8_quantize: {src:?} does not hold {rows}x{cols} values");
        }
        let region = self.region(src)?;
        if region.dtype() != Dtype::Bf16 {
            bail!(Internal, "mxfp8_quantize: {src:?} is not bf16");
        }
        let run = move || {
            // SAFETY: the region and the target are live (field order) and ordered by events.
            let values = unsafe { std::slice::from_raw_parts(region.as_ptr().cast::<u16>(), region.len()) };
            unsafe { target.quantize(values, rows, cols, layout) }
        };
        match stream {
            StreamKind::Compute => run(),
            StreamKind::Comm => self.stream.enqueue(run),
        }
    }
}

//! The optimizer's safe core: configuration, the parameter registry and the lifecycle
//! (register → finalize → iterate). The C layer in `capi::optimizer` only converts types.

mod param_view;
mod qk_clip;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::agreement::{self, Setting};
use crate::backend::cuda::{CallerStream, CudaBackend, Groups};
use crate::backend::host::comm::HostComm;
use crate::backend::host::executor::HostBackend;
use crate::backend::ops::MAX_NORM_TERMS;
use crate::backend::{Backend, PeerGroup};
use crate::bail;
use crate::checkpoint::{self, TpRank};
use crate::comm::{Claim, Communicator, Transport};
use crate::config::{Config, TpMode};
use crate::error::{Error, ErrorKind, Result};
use crate::init_data::InitData;
use crate::model::{ParamSpec, Registry, Route};
use crate::numerics::muon::{MuonOptions, TpDim};
use crate::plan::hash::Fnv1a;
use crate::plan::{Plan, build_plan};
use crate::schedule::{Runtime, StepArgs, StepInfo};

pub use param_view::{Mxfp8View, ParamView};

/// Lifecycle phase; calls check it so a wrong call order is a status, never UB.
pub enum Phase {
    /// Parameters may be added.
    Registering,
    /// Planned, allocated and initialised: the iteration API is available.
    Running(Box<Runtime>),
}

/// One rank's optimizer.
pub struct Optimizer {
    cfg: Config,
    claim: Claim,
    registry: Registry,
    init_values: Vec<Option<InitData>>,
    phase: Phase,
    /// The caller's stream (cuda backend; NULL with a host group).
    stream: CallerStream,
    /// The communicator over which the gradient norm and the skip decision are global, when
    /// it spans more than the data-parallel group.
    /// Claimed like the data-parallel communicator: its collectives run on this optimizer's
    /// comm stream, so no other optimizer may issue collectives on it.
    norm_group: Option<Claim>,
    /// The tensor-parallel group TP shards are orthogonalized over (claimed likewise).
    tp_group: Option<Claim>,
    /// The failure that made the communicator unusable, once one happened.
    broken: Option<Error>,
}

impl Optimizer {
    /// Creates an optimizer on a claimed communicator: a host group runs the host backend
    /// (`stream` must be NULL), an NCCL communicator the cuda backend on the caller's `stream`
    /// (borrowed; NULL = the legacy default stream), which needs a usable CUDA driver here and
    /// is built at finalize.
    pub fn new(cfg: Config, claim: Claim, stream: CallerStream) -> Result<Self> {
        cfg.validate()?;
        match &claim.comm().transport {
            Transport::Host(_) => {
                if !stream.is_null() {
                    bail!(
                        IncompatibleOptions,
                        "stream: must be NULL with a host communicator (the host backend runs on the calling thread)"
                    );
                }
            }
            Transport::Nccl(_) => {
                crate::backend::cuda::probe::device_count()?;
            }
        }
        claim.comm().inherit_timeout(cfg.collective_timeout());
        let optimizer = Optimizer {
            cfg,
            claim,
            registry: Registry::default(),
            init_values: Vec::new(),
            phase: Phase::Registering,
            stream,
            norm_group: None,
            broken: None,
            tp_group: None,
        };
        crate::log!(
            Info,
            "rank {}/{}: created on the {} backend",
            optimizer.rank(),
            optimizer.dp(),
            backend_name(optimizer.init_on_device())
        );
        Ok(optimizer)
    }

    /// Whether registration reads `init_data` as a device pointer (the cuda backend).
    pub fn init_on_device(&self) -> bool {
        matches!(self.claim.comm().transport, Transport::Nccl(_))
    }

    /// The stream a device `init_data` is copied on: the caller's, on the cuda backend; None
    /// on the host backend, which reads `init_data` from host memory.
    pub fn init_stream(&self) -> Option<CallerStream> {
        self.init_on_device().then_some(self.stream)
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn rank(&self) -> usize {
        self.claim.comm().rank()
    }

    pub fn dp(&self) -> usize {
        self.claim.comm().size()
    }

    /// Registers a parameter; `init` holds its high-precision initial values (or None for
    /// zeros). Returns the parameter id. Nothing changes on error.
    pub fn add_param(&mut self, spec: ParamSpec, init: Option<InitData>) -> Result<u32> {
        if !matches!(self.phase, Phase::Registering) {
            bail!(
                InvalidState,
                "add_param: the optimizer is finalized; register every param before muon_optimizer_finalize"
            );
        }
        if let Some(values) = &init
            && values.numel() != spec.numel()
        {
            bail!(
                InvalidArgument,
                "init_data of '{}': {} values for {} elements",
                spec.name,
                values.numel(),
                spec.numel()
            );
        }
        let id = self.registry.add(spec, &self.cfg)?;
        self.init_values.push(init);
        Ok(id)
    }

    /// The route of a registered parameter.
    pub fn route(&self, id: u32) -> Result<Route> {
        self.check_id(id)?;
        Ok(self.registry.routes()[id as usize])
    }

    fn check_id(&self, id: u32) -> Result<()> {
        if id as usize >= self.registry.len() {
            bail!(
                InvalidArgument,
                "param_id: {id} is not registered ({} params)",
                self.registry.len()
            );
        }
        Ok(())
    }

    /// Plans the layout and verifies that every rank planned the same (collective).
    pub fn finalize(&mut self) -> Result<()> {
        if !matches!(self.phase, Phase::Registering) {
            bail!(InvalidState, "finalize: already finalized");
        }
        if self.registry.is_empty() {
            bail!(
                InvalidState,
                "finalize: no params registered; call muon_optimizer_add_param first"
            );
        }
        let tp_shard_name = self.first_tp_shard();
        if let Some(name) = &tp_shard_name
            && self.tp_group.is_none()
        {
            bail!(
                InvalidState,
                "finalize: muon_tp_mode {} orthogonalizes TP-sharded Muon params ('{name}') over the tensor-parallel group; call muon_optimizer_set_tp_group first",
                self.cfg.muon_tp_mode.name()
            );
        }
        let plan = build_plan(self.registry.params(), self.registry.routes(), &self.cfg, self.dp())?;
        let r = &plan.report;
        crate::log!(
            Info,
            "rank {}/{}: finalize: {} params, {} layout, {} buckets, elements muon {} adamw {}, padding {}, plan hash {:#018x}",
            self.rank(),
            self.dp(),
            self.registry.len(),
            self.cfg.muon_layout.name(),
            r.num_buckets,
            r.elements.muon,
            r.elements.adamw,
            r.padding_elements,
            plan.hash
        );
        let muon = MuonOptions::from_config(&self.cfg);
        let backend: Box<dyn Backend> = match &self.claim.comm().transport {
            Transport::Host(host) => {
                let (tensor, norm) = (
                    self.tp_group.as_ref().map(host_of),
                    self.norm_group.as_ref().map(host_of),
                );
                self.verify_groups(&plan, &mut |group, v| match (group, tensor, norm) {
                    (Group::Tensor, Some(comm), _) | (Group::Norm, _, Some(comm)) => comm.all_gather_u64(v),
                    _ => host.all_gather_u64(v),
                })?;
                let mut backend = HostBackend::new(self.claim.shared(), self.cfg.host_comm_mode, muon)?
                    .with_threads(self.cfg.host_threads_for(host.size()));
                if let Some(group) = &self.norm_group {
                    backend = backend.with_norm_group(group.shared())?;
                }
                if let (Some(group), Some(_)) = (&self.tp_group, &tp_shard_name) {
                    backend = backend.with_tp_group(group.shared())?;
                }
                Box::new(backend)
            }
            Transport::Nccl(_) => {
                let groups = Groups {
                    norm: self.norm_group.as_ref().map(Claim::shared),
                    tensor: self.tp_group.as_ref().map(Claim::shared),
                };
                let timeout = self.cfg.collective_timeout();
                let mut backend = CudaBackend::new(self.claim.shared(), groups, self.stream, muon, timeout)?;
                self.verify_groups(&plan, &mut |group, v| match group {
                    Group::Data => backend.all_gather_u64(v),
                    Group::Tensor => backend.tp_all_gather_u64(v),
                    Group::Norm => backend.norm_all_gather_u64(v),
                })?;
                Box::new(backend)
            }
        };
        let init = &self.init_values;
        let runtime = Runtime::new(
            Box::new(plan),
            self.registry.params().to_vec(),
            self.cfg.clone(),
            self.rank(),
            backend,
            |p| init[p].as_ref().map(InitData::values),
        )?;
        self.init_values = Vec::new();
        self.phase = Phase::Running(Box::new(runtime));
        Ok(())
    }

    /// Collective: fails when another rank's config (a field that changes numerics or
    /// communication), params or plan differ from this rank's, naming the first difference.
    fn verify_agreement(&self, hash: u64, exchange: &mut agreement::Exchange) -> Result<()> {
        agreement::verify_config(&self.cfg, self.dp(), self.rank(), exchange)?;
        let size = self.norm_group.as_ref().map_or(0, |g| g.comm().size() as u64);
        if let Some((rank, &other)) = exchange(size)?.iter().enumerate().find(|(_, s)| **s != size) {
            let name = |s: u64| {
                if s == 0 {
                    "none".to_string()
                } else {
                    format!("{s} ranks")
                }
            };
            bail!(
                PlanMismatch,
                "finalize: rank {} sums the gradient norm over a norm group of {} but rank {rank} over {}; every rank of the data-parallel group must set the same norm group",
                self.rank(),
                name(size),
                name(other)
            );
        }
        let hashes = exchange(hash)?;
        if hashes.iter().any(|h| *h != hash) {
            agreement::explain_param_mismatch(self.registry.params(), self.registry.routes(), self.rank(), exchange)?;
        }
        if let Some((rank, other)) = hashes.iter().enumerate().find(|(_, h)| **h != hash) {
            bail!(
                PlanMismatch,
                "finalize: rank {} planned hash {hash:016x} but rank {rank} planned {other:016x}; every rank must register the same params (names, shapes, dtypes, flags, order) with the same config",
                self.rank()
            );
        }
        Ok(())
    }

    /// Sums the gradient norm, and so the clip coefficient and the skip decision, over
    /// `group` — a communicator of the same kind spanning this rank's data-parallel group, e.g.
    /// every rank of a tensor-, pipeline- and data-parallel job — instead of the data-parallel
    /// group alone. Each rank counts the gradients it owns except those flagged
    /// `NORM_REPLICA`. Before finalize; every rank of the data-parallel group sets a group of
    /// the same size. The group is this optimizer's alone (a second optimizer, e.g. the expert
    /// one of a shared clip, needs a communicator of its own over the same ranks).
    pub fn set_norm_group(&mut self, group: Arc<Communicator>) -> Result<()> {
        self.check_group(&group, "set_norm_group", "norm group")?;
        if group.size() < self.dp() || !group.size().is_multiple_of(self.dp()) {
            bail!(
                CommMismatch,
                "set_norm_group: a norm group of {} ranks cannot span data-parallel groups of {}; its size must be a multiple of dp",
                group.size(),
                self.dp()
            );
        }
        claim_group(
            &mut self.norm_group,
            group,
            "set_norm_group",
            self.cfg.collective_timeout(),
        )
    }

    /// Orthogonalizes the tensor-parallel shards over `group` (`muon_tp_mode` duplicated or
    /// distributed): this rank's TP group, the
    /// ranks holding the other shards of its matrices at the same data-parallel index
    /// (Megatron's tensor-model-parallel group). Claimed like the data-parallel communicator.
    /// Before finalize.
    pub fn set_tp_group(&mut self, group: Arc<Communicator>) -> Result<()> {
        self.check_group(&group, "set_tp_group", "TP group")?;
        let tp = group.size() as u64;
        self.registry.check_tensor_parallel(tp, &self.cfg)?;
        claim_group(&mut self.tp_group, group, "set_tp_group", self.cfg.collective_timeout())?;
        self.registry.set_tensor_parallel(tp);
        Ok(())
    }

    /// The checks every extra group passes: set before finalize, and of the optimizer's kind.
    fn check_group(&self, group: &Communicator, call: &str, what: &str) -> Result<()> {
        if !matches!(self.phase, Phase::Registering) {
            bail!(
                InvalidState,
                "{call}: the optimizer is finalized; set the {what} before finalize"
            );
        }
        let same_kind = matches!(
            (&self.claim.comm().transport, &group.transport),
            (Transport::Host(_), Transport::Host(_)) | (Transport::Nccl(_), Transport::Nccl(_))
        );
        if !same_kind {
            bail!(
                CommMismatch,
                "{call}: the {what} must be a communicator of the same kind as the optimizer's (a host group with a host group, NCCL with NCCL)"
            );
        }
        Ok(())
    }

    /// The first Muon param whose shards `muon_tp_mode` duplicated or distributed exchanges
    /// over the TP group, if any.
    fn first_tp_shard(&self) -> Option<String> {
        if self.cfg.muon_tp_mode == TpMode::Blockwise {
            return None;
        }
        self.tp_shards().map(|(_, spec)| spec.name.clone()).next()
    }

    /// Finalize's agreement, before anything changes (collective over every group the
    /// optimizer uses, in one order: data-parallel, TP, norm; then `vocab_size`'s default over
    /// the norm group, or the data-parallel group without one). A group's ranks all find its
    /// first disagreement and fail; the ranks of a later group then wait for this rank at
    /// most `collective_timeout_ms`.
    fn verify_groups(&self, plan: &Plan, exchange: &mut dyn FnMut(Group, u64) -> Result<Vec<u64>>) -> Result<()> {
        self.verify_agreement(plan.hash, &mut |v| exchange(Group::Data, v))?;
        let tp = self
            .tp_rank()
            .map_or("none".to_string(), |t| format!("rank {} of {}", t.rank, t.size));
        agreement::verify_settings(
            &[Setting::new("the place in the TP group", tp)],
            ("data-parallel", self.rank()),
            "the ranks of a data-parallel group hold the same shards, so they sit at one rank of TP groups of one size (muon_optimizer_set_tp_group)",
            &mut |v| exchange(Group::Data, v),
        )?;
        if let Some(group) = &self.tp_group {
            self.verify_tp(plan, group.comm().rank(), &mut |v| exchange(Group::Tensor, v))?;
        }
        if let Some(group) = &self.norm_group {
            agreement::verify_settings(
                &[
                    Setting::new("clip_grad", self.cfg.clip_grad),
                    Setting::new("the data-parallel size", self.dp()),
                ],
                ("norm", group.comm().rank()),
                "every rank of a norm group clips with one clip_grad over data-parallel groups of one size",
                &mut |v| exchange(Group::Norm, v),
            )?;
            let routes: Vec<(u32, Route, &str)> = self
                .registry
                .params()
                .iter()
                .zip(self.registry.routes())
                .filter(|(spec, _)| spec.tie_group != 0)
                .map(|(spec, route)| (spec.tie_group, *route, spec.name.as_str()))
                .collect();
            agreement::verify_tie_routes(&routes, group.comm().rank(), &mut |v| exchange(Group::Norm, v))?;
        }
        let (group, named) = match &self.norm_group {
            Some(norm) => (Group::Norm, ("norm", norm.comm().rank())),
            None => (Group::Data, ("data-parallel", self.rank())),
        };
        agreement::verify_vocab_default(&self.registry, self.cfg.vocab_size, named, &mut |v| exchange(group, v))
    }

    /// Collective over the TP group: the ranks agree on `muon_tp_mode`, the Muon variant,
    /// `cautious_weight_decay` and `muon_momentum_dtype` (the shards of one matrix take one
    /// update rule) and, unless it is
    /// blockwise, on the Newton–Schulz settings (the shards of a matrix are orthogonalized
    /// together: in `distributed` mode one iteration whose collectives follow the method and the
    /// steps, in `duplicated` mode each rank's copy of the whole matrix), on every TP-sharded
    /// Muon param (each one's name, shape, shard dimension and flags, in registration order: a
    /// param sharded on one rank only is named against `(none)`) and its owners.
    fn verify_tp(&self, plan: &Plan, tp_rank: usize, exchange: &mut agreement::Exchange) -> Result<()> {
        let (cfg, mode) = (&self.cfg, self.cfg.muon_tp_mode);
        let mut settings = vec![
            Setting::new("muon_tp_mode", mode.name()),
            Setting::new("muon_variant", cfg.muon_variant.name()),
            Setting::new("cautious_weight_decay", cfg.cautious_weight_decay),
            Setting::new("muon_momentum_dtype", cfg.muon_momentum_dtype.name()),
        ];
        if cfg.muon_variant.is_adaptive() {
            settings.extend([
                Setting::new("adaptive_muon_beta2", cfg.adaptive_muon_beta2),
                Setting::new("adaptive_muon_eps", cfg.adaptive_muon_eps),
            ]);
        }
        if mode != TpMode::Blockwise {
            settings.extend([
                Setting::new("muon_ns_method", cfg.muon_ns_method.name()),
                Setting::new("muon_ns_precision", cfg.muon_ns_precision.name()),
                Setting::new("muon_num_ns_steps", cfg.muon_num_ns_steps),
                Setting::new("muon_coefficient_set", cfg.muon_coefficient_set.name()),
                Setting::new(
                    "muon_custom_coefficients",
                    format!("{:?}", cfg.muon_custom_coefficients),
                ),
                Setting::new("muon_ns_eps", cfg.muon_ns_eps),
            ]);
            for (k, (p, spec)) in self.tp_shards().enumerate() {
                let name = &spec.name;
                let dim = match spec.tp_shard() {
                    Some(TpDim::Rows) => "rows (MUON_PARAM_FLAG_TP_SHARD_ROWS)",
                    _ => "columns (MUON_PARAM_FLAG_TP_SHARD_COLS)",
                };
                settings.extend([
                    Setting::new(format!("the name of TP-sharded param #{k}"), format!("'{name}'")),
                    Setting::new(
                        format!("the shard shape of '{name}' (param {p})"),
                        format!("{:?}", spec.shape),
                    ),
                    Setting::new(format!("the shard dimension of '{name}' (param {p})"), dim),
                    Setting::new(
                        format!("the flags of '{name}' (param {p})"),
                        format!("0x{:x}", spec.flags.0),
                    ),
                ]);
            }
        }
        agreement::verify_settings(
            &settings,
            ("TP", tp_rank),
            "every TP rank must use the same muon_tp_mode, muon_variant (with NorMuon the same adaptive_muon_beta2 and adaptive_muon_eps), cautious_weight_decay and muon_momentum_dtype, the same Newton–Schulz settings (muon_ns_method, muon_ns_precision, muon_num_ns_steps, muon_coefficient_set, muon_custom_coefficients, muon_ns_eps) unless blockwise, and register the same TP-sharded params (names, shard shapes, shard dimension, flags, order)",
            exchange,
        )?;
        if mode != TpMode::Blockwise {
            self.verify_tp_owners(plan, tp_rank, exchange)?;
        }
        Ok(())
    }

    /// The TP-sharded Muon params with their ids, in registration order.
    fn tp_shards(&self) -> impl Iterator<Item = (usize, &ParamSpec)> {
        let params = self.registry.params().iter().zip(self.registry.routes()).enumerate();
        params
            .filter(|(_, (spec, route))| **route == Route::Muon && spec.tp_shard().is_some())
            .map(|(p, (spec, _))| (p, spec))
    }

    /// Collective over the TP group: every TP rank must own the same gathered shards (so each
    /// matrix's shards meet in one gather), which holds when they register the same shard
    /// names, shapes and flags in the same order.
    fn verify_tp_owners(&self, plan: &Plan, tp_rank: usize, exchange: &mut agreement::Exchange) -> Result<()> {
        let mut hash = Fnv1a::new();
        for (p, spec) in self.tp_shards() {
            hash.str(&spec.name);
            hash.u64(spec.unit_matrix().rows);
            hash.u64(spec.unit_matrix().cols);
            hash.list(plan.params[p].unit_owners.iter().map(|&o| u64::from(o)));
        }
        let mine = hash.finish();
        if let Some(other) = exchange(mine)?.iter().position(|&h| h != mine) {
            bail!(
                PlanMismatch,
                "finalize: TP rank {other} owns other tensor-parallel shards than TP rank {tp_rank}; every TP rank must register the same TP-sharded params (names, shard shapes, order) with the same config"
            );
        }
        Ok(())
    }

    /// The runtime, once finalized.
    pub fn runtime(&self) -> Result<&Runtime> {
        match &self.phase {
            Phase::Running(runtime) => Ok(runtime),
            Phase::Registering => bail!(
                InvalidState,
                "the optimizer is not finalized; call muon_optimizer_finalize first"
            ),
        }
    }

    /// The runtime for an iteration call named `call`.
    pub fn runtime_mut(&mut self, call: &str) -> Result<&mut Runtime> {
        if let Some(failure) = &self.broken {
            bail!(
                CommBroken,
                "{call}: the communicator is unusable since an earlier call failed ({:?}: {}); destroy the optimizer, then abort the communicator (ncclCommAbort; muon never aborts the caller's communicator)",
                failure.kind,
                failure.message
            );
        }
        match &mut self.phase {
            Phase::Running(runtime) => Ok(runtime),
            Phase::Registering => {
                bail!(
                    InvalidState,
                    "{call}: the optimizer is not finalized; call muon_optimizer_finalize first"
                )
            }
        }
    }

    /// Runs `f` on the runtime for the call `call`. A failure that leaves the communicator
    /// unusable (a timeout, an NCCL error) makes every later call fail at once with
    /// `CommBroken` naming it — on both backends, including calls that need no peer.
    fn with_runtime<T>(&mut self, call: &str, f: impl FnOnce(&mut Runtime) -> Result<T>) -> Result<T> {
        let result = f(self.runtime_mut(call)?);
        if let Err(err) = &result
            && err.kind.breaks_communicator()
        {
            self.broken = Some(err.clone());
        }
        result
    }

    /// The plan, once finalized.
    pub fn plan(&self) -> Result<&Plan> {
        Ok(self.runtime()?.plan())
    }

    /// Zeroes the grad buffer (ordered after everything that still reads it).
    pub fn zero_grad(&mut self) -> Result<()> {
        self.with_runtime("zero_grad", Runtime::zero_grad)
    }

    /// Forward pre-hook for bucket `bucket`.
    pub fn wait_params(&mut self, bucket: u32) -> Result<()> {
        self.with_runtime("wait_params", |rt| rt.wait_params(bucket))
    }

    /// Gathers bucket `bucket` ahead of its use (sharded params; nothing when replicated).
    pub fn gather_params(&mut self, bucket: u32) -> Result<()> {
        self.with_runtime("gather_params", |rt| rt.gather_params(bucket))
    }

    /// Ends bucket `bucket`'s gathered window (sharded params; nothing when replicated).
    pub fn release_params(&mut self, bucket: u32) -> Result<()> {
        self.with_runtime("release_params", |rt| rt.release_params(bucket))
    }

    /// Param `id`'s multipliers of its route's learning rate and weight decay from the next
    /// step on ([`Runtime::set_param_scales`]).
    pub fn set_param_scales(&mut self, id: u32, lr_scale: f32, wd_scale: f32) -> Result<()> {
        self.with_runtime("set_param_scales", |rt| {
            rt.set_param_scales(id as usize, lr_scale, wd_scale)
        })
    }

    /// Backward hook for param `id`.
    pub fn grad_ready(&mut self, id: u32) -> Result<()> {
        self.with_runtime("grad_ready", |rt| rt.grad_ready(id))
    }

    /// One optimizer step and what it did: [`Optimizer::step_async`], then
    /// [`Optimizer::step_info`] (which waits for the compute stream).
    pub fn step(&mut self, args: &StepArgs) -> Result<StepInfo> {
        self.step_async(args)?;
        self.step_info()
    }

    /// One optimizer step, enqueued on the streams without waiting for the device (the
    /// norm, clip and skip decision stay on the device). `args.overrides` replace the config's
    /// Muon momentum and AdamW β1, β2, ε for this step (a scheduler's values); values out of
    /// range are refused naming the field, before anything is enqueued.
    pub fn step_async(&mut self, args: &StepArgs) -> Result<()> {
        args.check("args->")?;
        self.with_runtime("step", |rt| rt.step(Some(args)))
    }

    /// One optimizer step with the arguments last set by [`Optimizer::set_step_args`]: no
    /// host-to-device copy, so it can be captured in a CUDA graph and replayed with new values.
    pub fn step_with_set_args(&mut self) -> Result<()> {
        self.with_runtime("step", |rt| rt.step(None))
    }

    /// One step of several optimizers of this rank with one gradient norm — e.g. dense params on
    /// the data-parallel group and expert params on the expert-data-parallel group, as
    /// Megatron's chained optimizer clips them: each optimizer gathers its Σ g² over its norm
    /// group, then every optimizer derives the norm from all of them (each term's mean squared
    /// norm over its own dp², added in `members` order), so every optimizer of every rank clips
    /// with the same coefficient and skips the same steps. `args` holds one entry per member,
    /// or None to use the arguments each last set. Every rank passes its optimizers in the same
    /// order. Checks everything before enqueueing anything.
    ///
    /// A failure once the checks passed leaves the step begun on some members, with
    /// collectives on their groups that the other ranks may wait for, and no norm to finish
    /// it with: every member then fails each later call with `CommBroken` naming the failure
    /// and the member it happened on.
    pub fn step_shared(members: &mut [&mut Optimizer], args: Option<&[StepArgs]>) -> Result<()> {
        Self::check_shared(members, args)?;
        let result = Self::run_shared(members, args);
        if let Err(err) = &result {
            let why = format!(
                "a shared step (muon_optimizers_step) failed after it began, so it cannot finish on any of its optimizers: {}",
                err.message
            );
            for member in members.iter_mut() {
                member.broken = Some(Error::new(ErrorKind::CommBroken, why.clone()));
            }
        }
        result
    }

    /// The work of [`Optimizer::step_shared`]; an error names the member (`opts[k]`).
    fn run_shared(members: &mut [&mut Optimizer], args: Option<&[StepArgs]>) -> Result<()> {
        let in_member = |k: usize| move |err: Error| Error::new(err.kind, format!("opts[{k}]: {}", err.message));
        crate::schedule::step_shared(members.len(), args, |k, f| {
            members[k].with_runtime("step", |rt| f(rt)).map_err(in_member(k))
        })
    }

    /// The preconditions of [`Optimizer::step_shared`], naming the member that breaks one.
    fn check_shared(members: &mut [&mut Optimizer], args: Option<&[StepArgs]>) -> Result<()> {
        if members.is_empty() || members.len() > MAX_NORM_TERMS {
            bail!(
                InvalidArgument,
                "step: count {} must be 1 to {MAX_NORM_TERMS} optimizers",
                members.len()
            );
        }
        if let Some(args) = args {
            if args.len() != members.len() {
                bail!(
                    InvalidArgument,
                    "step: {} step args for {} optimizers; pass one per optimizer",
                    args.len(),
                    members.len()
                );
            }
            for (k, a) in args.iter().enumerate() {
                a.check(&format!("args[{k}]."))?;
            }
        }
        let first = &members[0];
        let (device, stream, clip_grad) = (first.init_on_device(), first.stream.0, first.cfg.clip_grad);
        for (k, member) in members.iter_mut().enumerate() {
            if member.init_on_device() != device {
                bail!(
                    CommMismatch,
                    "step: opts[{k}] runs on the {} backend and opts[0] on the {}; optimizers sharing a clip run on one",
                    backend_name(member.init_on_device()),
                    backend_name(device)
                );
            }
            if member.stream.0 != stream {
                bail!(
                    IncompatibleOptions,
                    "step: opts[{k}] uses stream {:p} and opts[0] {stream:p}; optimizers sharing a clip share the caller's stream",
                    member.stream.0
                );
            }
            if member.cfg.clip_grad != clip_grad {
                bail!(
                    IncompatibleOptions,
                    "step: opts[{k}] has clip_grad {} and opts[0] {clip_grad}; optimizers sharing a clip need one clip_grad",
                    member.cfg.clip_grad
                );
            }
            let runtime = member.runtime_mut(&format!("step: opts[{k}]"))?;
            if args.is_none() && !runtime.has_step_args() {
                bail!(
                    InvalidState,
                    "step: opts[{k}] has no step arguments: pass them, or set them first with muon_optimizer_set_step_args"
                );
            }
        }
        Ok(())
    }

    /// Copies the arguments of the next steps to the device, ordered on the caller's stream
    /// (no host wait).
    pub fn set_step_args(&mut self, args: &StepArgs) -> Result<()> {
        args.check("args->")?;
        self.with_runtime("set_step_args", |rt| rt.set_step_args(args))
    }

    /// What the last step did (all zeros before the first); waits for the compute stream.
    pub fn step_info(&mut self) -> Result<StepInfo> {
        let info = self.with_runtime("step_info", Runtime::step_info)?;
        crate::log!(
            Debug,
            "rank {}: step {}: grad norm {}, clip {}{}",
            self.rank(),
            info.step,
            info.grad_norm,
            info.clip_coef,
            if info.skipped {
                ", skipped (non-finite gradient)"
            } else {
                ""
            }
        );
        Ok(info)
    }

    /// The runtime for tests and tools that inspect state (state, param values).
    pub fn running(&mut self) -> Result<&mut Runtime> {
        self.runtime_mut("inspect")
    }

    /// Waits for everything enqueued.
    pub fn synchronize(&mut self) -> Result<()> {
        self.with_runtime("synchronize", Runtime::synchronize)
    }

    /// Orders the caller's stream after the queued communication (see [`Runtime::join`]).
    pub fn join(&mut self) -> Result<()> {
        self.with_runtime("join", Runtime::join)
    }

    /// Saves every rank's optimizer state into the checkpoint directory `dir` (collective;
    /// see [`crate::checkpoint`]). Finishes the queued collectives first; changes no state.
    pub fn save(&mut self, dir: &Path) -> Result<()> {
        let rank = self.rank();
        let tp = self.tp_rank();
        self.with_runtime("save", |rt| checkpoint::save(rt, rank, tp, dir))?;
        crate::log!(Info, "rank {rank}: saved checkpoint '{}'", dir.display());
        Ok(())
    }

    /// Loads the checkpoint in `dir`, saved at any dp and layout, and re-synchronizes every
    /// param buffer (collective; see [`crate::checkpoint`]). On failure nothing changed on any
    /// rank.
    pub fn load(&mut self, dir: &Path) -> Result<()> {
        let tp = self.tp_rank();
        let peers = self.peer_groups();
        self.with_runtime("load", |rt| {
            with_peers(&peers, &mut |p| checkpoint::load(rt, tp, dir, p))
        })?;
        crate::log!(Info, "rank {}: loaded checkpoint '{}'", self.rank(), dir.display());
        Ok(())
    }

    /// Loads from the checkpoints in `dirs` together, each registered param from the one that
    /// holds it, or from those of every TP rank that saved its shards (collective; see
    /// [`checkpoint::load_union`]). On failure nothing changed.
    pub fn load_union(&mut self, dirs: &[&Path]) -> Result<()> {
        let tp = self.tp_rank();
        let peers = self.peer_groups();
        self.with_runtime("load", |rt| {
            with_peers(&peers, &mut |p| checkpoint::load_union(rt, tp, dirs, p))
        })?;
        crate::log!(Info, "rank {}: loaded {} checkpoints", self.rank(), dirs.len());
        Ok(())
    }

    /// The groups besides the data-parallel one that this optimizer was given (TP, then norm),
    /// each with its communicator: a collective call that changes state agrees over them.
    fn peer_groups(&self) -> Vec<(PeerGroup, Arc<Communicator>)> {
        [(PeerGroup::Tensor, &self.tp_group), (PeerGroup::Norm, &self.norm_group)]
            .into_iter()
            .filter_map(|(group, claim)| Some((group, claim.as_ref()?.shared())))
            .collect()
    }

    /// This rank's place in its tensor-parallel group, when it has one of more than one rank:
    /// checkpoints hold its TP shards in the unsharded params' coordinates.
    fn tp_rank(&self) -> Option<TpRank> {
        let comm = self.tp_group.as_ref()?.comm();
        (comm.size() > 1).then(|| TpRank {
            rank: comm.rank() as u32,
            size: comm.size() as u32,
        })
    }

    /// Checks the id and returns the finalized plan.
    pub fn plan_for(&self, id: u32) -> Result<&Plan> {
        self.check_id(id)?;
        self.plan()
    }
}

/// Claims `group` into `slot` for the call `call` (setting the group it already holds again is a
/// no-op); the group's collectives then wait at most `timeout`, as the optimizer's own. A
/// group's collectives run on its optimizer's comm stream, so no other optimizer may use it;
/// on failure `slot` keeps what it held.
fn claim_group(slot: &mut Option<Claim>, group: Arc<Communicator>, call: &str, timeout: Duration) -> Result<()> {
    if slot
        .as_ref()
        .is_some_and(|current| std::ptr::eq(current.comm(), &*group))
    {
        return Ok(());
    }
    match group.claim() {
        Ok(claim) => {
            claim.comm().inherit_timeout(timeout);
            *slot = Some(claim);
        }
        Err(_) => bail!(
            InvalidState,
            "{call}: the group is already used by another optimizer (or is this optimizer's own communicator); each optimizer needs a group of its own, since its collectives run on that optimizer's comm stream"
        ),
    }
    Ok(())
}

/// One exchange of a peer group (see [`checkpoint::PeerExchange`]).
type PeerCall<'a> = Box<dyn FnMut(&mut dyn Backend, u64) -> Result<Vec<u64>> + 'a>;

/// Runs `call` with the exchanges over `peers`: a host group's on the calling thread, an NCCL
/// communicator's through the cuda backend (which holds it).
fn with_peers<T>(
    peers: &[(PeerGroup, Arc<Communicator>)],
    call: &mut dyn FnMut(&mut [checkpoint::PeerExchange]) -> Result<T>,
) -> Result<T> {
    let mut calls: Vec<PeerCall> = peers
        .iter()
        .map(|(group, comm)| -> PeerCall {
            match &comm.transport {
                Transport::Host(host) => Box::new(move |_, v| host.all_gather_u64(v)),
                Transport::Nccl(_) => Box::new(move |backend, v| backend.peer_all_gather_u64(*group, v)),
            }
        })
        .collect();
    let mut exchanges: Vec<checkpoint::PeerExchange> = peers
        .iter()
        .zip(calls.iter_mut())
        .map(|((group, _), f)| -> checkpoint::PeerExchange { (*group, &mut **f) })
        .collect();
    call(&mut exchanges)
}

/// The groups finalize's agreement exchanges over.
#[derive(Clone, Copy)]
enum Group {
    Data,
    Tensor,
    Norm,
}

/// The host rank handle of a claimed group (set_*_group takes a group of the optimizer's kind).
fn host_of(claim: &Claim) -> &HostComm {
    match &claim.comm().transport {
        Transport::Host(host) => host,
        Transport::Nccl(_) => unreachable!("set_*_group takes a group of the optimizer's kind"),
    }
}

/// The backend an optimizer runs on.
fn backend_name(on_device: bool) -> &'static str {
    if on_device { "cuda" } else { "host" }
}

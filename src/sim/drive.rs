//! Runs the real schedule ([`Runtime`]) of every rank on the real cuda backend glue
//! ([`CudaBackend`]) whose executor, instead of a GPU, prices each translated action with the
//! [`CostModel`] and appends it to the rank's host program. Forward and backward are modelled
//! compute on the caller's stream, issued with the hooks in the order a trainer calls them.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};

use crate::backend::cuda::action::{Action, Buf, DevPtr, Kernel, NcclCall, NcclComm, NcclType};
use crate::backend::cuda::dry_run::VirtualMemory;
use crate::backend::cuda::translate::Translator;
use crate::backend::cuda::{CudaBackend, Executor};
use crate::backend::ops::StreamKind;
use crate::bail;
use crate::config::Config;
use crate::error::Result;
use crate::model::ParamSpec;
pub use crate::model::lookups;
use crate::numerics::muon::MuonOptions;
use crate::plan::Plan;
use crate::plan::presets::Attention;
use crate::schedule::step_shared;
use crate::schedule::{QkClipRequest, Runtime, StepArgs, StepOverrides};

use super::cost::{Cost, CostModel};
use super::engine::{Call, Class, Item, Label};
use super::sharding::{Gathers, Issue, Phase};

/// What the simulation of one rank recorded.
#[derive(Debug, Default)]
pub struct Recorded {
    /// The host program: priced actions and modelled compute, in issue order.
    pub items: Vec<Item>,
    /// Every allocation the translator made.
    pub allocations: Vec<(Buf, u64)>,
    /// The translated actions, in order (kept only when asked for).
    pub actions: Option<Vec<Action>>,
}

struct Recorder {
    /// The cost model of each optimizer of the rank.
    costs: Vec<CostModel>,
    /// The optimizer whose items are being recorded ([`Item::Optimizer`]).
    optimizer: usize,
    call: Call,
    memory: VirtualMemory,
    out: Recorded,
    /// Sharded params: the step's param collectives (one per bucket, in forward order) but the
    /// first `Some(n)` are the forward's gathers, moved to the forward (`sharding.rs`), and
    /// priced at zero; the count of the current step's so far.
    sharded: Option<usize>,
    step_gathers: usize,
}

/// The executor of optimizer `.1` of a simulated rank: prices actions instead of running them.
struct SimExecutor(Arc<Mutex<Recorder>>, usize);

fn lock(recorder: &Mutex<Recorder>) -> std::sync::MutexGuard<'_, Recorder> {
    recorder.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The name of an action in the trace.
fn what(action: &Action) -> &'static str {
    match action {
        Action::Alloc { .. } => "alloc",
        Action::CopyIn { .. } => "copy to device",
        Action::CopyInAsync { .. } => "step arguments to device",
        Action::CopyOut { .. } => "copy to host",
        Action::Zero { .. } => "memset",
        Action::CopyDevice { .. } | Action::CopyDevice2D { .. } => "copy",
        Action::Launch(l) => match l.kernel {
            Kernel::CastF32ToBf16 | Kernel::Cast => "cast",
            Kernel::SumsqPartials | Kernel::SumsqFinish => "sum of squares",
            Kernel::NormPartials => "gradient norm",
            Kernel::MuonMomentum => "muon momentum",
            Kernel::NsNormalize => "ns normalize",
            Kernel::NsSymmetrize => "ns symmetrize",
            Kernel::NsAddIdentity => "ns add identity",
            Kernel::GemmTileTables => "ns tile tables",
            Kernel::MuonApply => "muon apply",
            Kernel::NormuonLineSums | Kernel::NormuonMoments => "normuon moments",
            Kernel::Adamw => "adamw",
            Kernel::StepScalars => "step scalars",
            Kernel::Mxfp8Quantize => "mxfp8 quantize",
            Kernel::QkClip => "qk clip",
        },
        Action::Gemm(_) => "ns gemm",
        Action::Nccl(NcclComm::Tensor, calls) => match calls.first() {
            Some(NcclCall::AllGather { .. }) => "tensor-parallel all-gather",
            _ => "tensor-parallel all-reduce",
        },
        Action::Nccl(_, calls) => match calls.first() {
            Some(NcclCall::AllGather {
                dtype: NcclType::U8, ..
            }) => "scalar exchange",
            Some(NcclCall::AllGather {
                dtype: NcclType::U64, ..
            }) => "norm all-gather",
            Some(NcclCall::Reduce { .. }) => "reduce",
            Some(NcclCall::Broadcast { .. }) => "broadcast",
            Some(NcclCall::ReduceScatter { .. }) => "reduce-scatter",
            Some(NcclCall::AllGather { .. }) => "all-gather",
            Some(NcclCall::AllReduce { .. }) => "all-reduce",
            None => "empty group",
        },
        Action::Record { .. } => "record",
        Action::Wait { .. } => "wait",
        Action::Synchronize(_) => "synchronize",
    }
}

/// What an NCCL group moves, without the rank-specific pointers.
fn signature(calls: &[NcclCall]) -> u64 {
    let mut h = DefaultHasher::new();
    for call in calls {
        let (kind, count, dtype, root) = match *call {
            NcclCall::Reduce { count, dtype, root, .. } => (0u8, count, dtype, root),
            NcclCall::Broadcast { count, dtype, root, .. } => (1, count, dtype, root),
            NcclCall::ReduceScatter { recv_count, dtype, .. } => (2, recv_count, dtype, 0),
            NcclCall::AllGather { send_count, dtype, .. } => (3, send_count, dtype, 0),
            NcclCall::AllReduce { count, dtype, .. } => (4, count, dtype, 0),
        };
        (kind, count, dtype as u8, root).hash(&mut h);
    }
    h.finish()
}

/// A collective bringing params from their owners (not an exchange of scalars or norms).
fn is_param_gather(action: &Action) -> bool {
    match action {
        Action::Nccl(NcclComm::Data, calls) => matches!(
            calls.first(),
            Some(NcclCall::Broadcast { dtype, .. } | NcclCall::AllGather { dtype, .. })
                if !matches!(dtype, NcclType::U8 | NcclType::U64)
        ),
        _ => false,
    }
}

impl Recorder {
    /// Records the gathers of sharded params, each labelled as its bucket's `wait_params`.
    fn record_gathers(&mut self, issues: Vec<Issue>) {
        let call = self.call;
        for (bucket, action) in issues {
            self.call = Call::WaitParams(bucket);
            self.record(&action);
        }
        self.call = call;
    }

    /// Items from here on are optimizer `k`'s.
    fn switch_to(&mut self, k: usize) {
        if self.optimizer != k {
            self.optimizer = k;
            self.out.items.push(Item::Optimizer(k));
        }
    }

    fn record(&mut self, action: &Action) {
        let label = Label {
            call: self.call,
            what: what(action),
        };
        let mut cost = self.costs[self.optimizer].cost(action);
        if let (Some(prefetched), Call::Step, Cost::Collective { device, .. }) = (self.sharded, self.call, &mut cost)
            && is_param_gather(action)
        {
            if self.step_gathers >= prefetched {
                *device = 0.0;
            }
            self.step_gathers += 1;
        }
        let items = &mut self.out.items;
        match cost {
            Cost::Free => {}
            Cost::Work { stream, host, device } => items.push(Item::Work {
                stream,
                host,
                device,
                class: Class::Optimizer,
                label,
            }),
            Cost::Collective { host, device } => {
                let Action::Nccl(_, calls) = action else { return };
                items.push(Item::Collective {
                    host,
                    device,
                    signature: signature(calls),
                    label,
                });
            }
            Cost::Blocking { stream, host, device } => {
                items.push(Item::Work {
                    stream,
                    host,
                    device,
                    class: Class::HostCopy,
                    label,
                });
                items.push(Item::Sync { stream, label });
            }
            Cost::Sync { stream } => items.push(Item::Sync { stream, label }),
            Cost::Record { stream, host } => {
                let Action::Record { event, .. } = action else { return };
                items.push(Item::Record {
                    stream,
                    event: *event,
                    host,
                    label,
                });
            }
            Cost::Wait { stream, host } => {
                let Action::Wait { event, .. } = action else { return };
                items.push(Item::Wait {
                    stream,
                    event: *event,
                    host,
                    label,
                });
            }
        }
    }
}

impl Executor for SimExecutor {
    fn run(&mut self, actions: &[Action], bind: &mut dyn FnMut(Buf, DevPtr, u64)) -> Result<Vec<Vec<u8>>> {
        let mut recorder = lock(&self.0);
        recorder.switch_to(self.1);
        let mut out = Vec::new();
        for action in actions {
            match *action {
                Action::Alloc { buf, bytes } => {
                    bind(buf, recorder.memory.alloc(bytes), bytes);
                    recorder.out.allocations.push((buf, bytes));
                }
                Action::CopyOut { bytes, .. } => out.push(vec![0u8; bytes as usize]),
                _ => {}
            }
            recorder.record(action);
            if let Some(log) = recorder.out.actions.as_mut() {
                log.push(action.clone());
            }
        }
        Ok(out)
    }
}

/// The iterations a simulated trainer runs.
#[derive(Debug, Clone, Copy)]
pub struct Trainer {
    /// Tokens each rank processes per iteration (forward and backward cost), over all its
    /// micro-batches.
    pub tokens: u64,
    pub iterations: usize,
    /// With expert parallelism, the experts each token is routed to: an expert stack's
    /// compute is then that of the tokens routed to its experts, `tokens · k` spread evenly
    /// over the expert-parallel group's experts (every expert of the stack counted: a dense
    /// upper bound, without).
    pub experts_per_token: Option<u64>,
    /// Micro-batches per iteration (gradient accumulation, ≥ 1), `tokens` split evenly.
    pub micro_batches: usize,
    /// Causal attention of each layer, as the params whose `6 · params · tokens` matmul FLOPs
    /// equal its score and value FLOPs (counted with the param that closes the layer,
    /// [`crate::plan::presets::Attention::closes_layer`]); 0 = not counted.
    pub attention_params: u64,
    /// The pipeline bubble as a fraction of the iteration's ideal compute (1F1B:
    /// `(p − 1) / (m · v)`); 0 without pipeline parallelism.
    pub bubble: f64,
    /// The pieces each expert stack of the rank is registered as (1; Megatron's schedule: one
    /// `[1, m, n]` piece per expert): a piece computes its share of the stack's routed tokens.
    pub expert_pieces: u64,
    /// Megatron-LM's step ([`super::Schedule::Megatron`]): every runtime starts its param
    /// collectives after the step's last update ([`Runtime::sync_params_after_step`]), and
    /// the optimizers finish their steps last to first, so the dense optimizer's gathers
    /// (optimizer 0) also follow the expert optimizer's updates.
    pub params_after_step: bool,
}

impl Trainer {
    /// `iterations` of `tokens` per rank in one micro-batch, without attention FLOPs or bubble.
    pub fn new(tokens: u64, iterations: usize) -> Trainer {
        Trainer {
            tokens,
            iterations,
            experts_per_token: None,
            micro_batches: 1,
            attention_params: 0,
            bubble: 0.0,
            expert_pieces: 1,
            params_after_step: false,
        }
    }
}

/// Learning rates of the simulated steps (they change no timing).
const STEP_ARGS: StepArgs = StepArgs {
    lr: 0.02,
    weight_decay: 0.1,
    adam_lr: 3e-4,
    adam_weight_decay: 0.1,
    overrides: StepOverrides::NONE,
};

/// What the trainer does besides calling the runtime.
#[derive(Debug, Clone, Copy)]
pub enum TrainerEvent {
    /// An iteration begins.
    Iteration,
    /// The API call about to be made.
    Call(Call),
    /// The framework's forward or backward compute of param `param` for one micro-batch.
    Compute { param: usize, backward: bool },
    /// Whole-model forwards and backwards of micro-batches that call no hook (gradient
    /// accumulation between the first micro-batch's forward and the last one's backward).
    Accumulate { forwards: usize, backwards: usize },
    /// The pipeline's idle time, before the last micro-batch's backward.
    Bubble,
}

/// The calls a trainer makes, `iterations` times: `zero_grad`; the forward, calling
/// `wait_params(b)` before the first param of bucket b; the backward in reverse order, calling
/// `grad_ready(p)` after param p's gradient; `step`. `hooks` sees each call before it is made
/// and the modelled compute in between. The QK-clip requests `clips` (if any) are made before
/// every step.
pub fn train(
    runtime: &mut Runtime,
    plan: &Plan,
    iterations: usize,
    clips: &[QkClipRequest],
    hooks: &mut dyn FnMut(TrainerEvent),
) -> Result<()> {
    let order: Vec<(usize, usize)> = (0..plan.params.len()).map(|p| (0, p)).collect();
    train_shared(&mut [runtime], &[plan], &order, (iterations, 1, false), clips, hooks)
}

/// [`train`] for several optimizers of a rank (dense and expert params) stepped together with
/// one clip, as `muon_optimizers_step` does: `order` lists the model's params in forward order
/// as (optimizer, param of its plan); every optimizer's `zero_grad`, the hooks of each param on
/// its own optimizer, then one shared step (each optimizer gathers its Σ g², then each finishes
/// with every optimizer's term). A `Compute` event's `param` is the position in `order`.
/// `clips` go to optimizer 0. Each of the `iterations` runs `micro_batches` micro-batches
/// (Megatron's gradient accumulation, `no_sync` but for the last): the hooks wait for params
/// in the first micro-batch's forward only and report gradients in the last one's backward
/// only; the micro-batches in between call none ([`TrainerEvent::Accumulate`]). With
/// `last_first` the optimizers take the shared step's calls last to first
/// ([`Trainer::params_after_step`]).
pub fn train_shared(
    runtimes: &mut [&mut Runtime],
    plans: &[&Plan],
    order: &[(usize, usize)],
    (iterations, micro_batches, last_first): (usize, usize, bool),
    clips: &[QkClipRequest],
    hooks: &mut dyn FnMut(TrainerEvent),
) -> Result<()> {
    for _ in 0..iterations {
        hooks(TrainerEvent::Iteration);
        hooks(TrainerEvent::Call(Call::ZeroGrad));
        for runtime in runtimes.iter_mut() {
            runtime.zero_grad()?;
        }
        let mut waited: Vec<Vec<bool>> = plans.iter().map(|plan| vec![false; plan.buckets.len()]).collect();
        for (i, &(k, p)) in order.iter().enumerate() {
            let b = plans[k].params[p].bucket as usize;
            if !waited[k][b] {
                waited[k][b] = true;
                hooks(TrainerEvent::Call(Call::WaitParams(b as u32)));
                runtimes[k].wait_params(b as u32)?;
            }
            hooks(TrainerEvent::Compute {
                param: i,
                backward: false,
            });
        }
        let more = micro_batches.saturating_sub(1);
        if more > 0 {
            hooks(TrainerEvent::Accumulate {
                forwards: more,
                backwards: more,
            });
        }
        hooks(TrainerEvent::Bubble);
        for (i, &(k, p)) in order.iter().enumerate().rev() {
            hooks(TrainerEvent::Compute {
                param: i,
                backward: true,
            });
            hooks(TrainerEvent::Call(Call::GradReady(plans[k].params[p].bucket)));
            runtimes[k].grad_ready(p as u32)?;
        }
        if !clips.is_empty() {
            runtimes[0].request_qk_clip(clips, super::qk_clip::THRESHOLD, super::qk_clip::ALPHA)?;
        }
        hooks(TrainerEvent::Call(Call::Step));
        if let [runtime] = runtimes {
            runtime.step(Some(&STEP_ARGS))?;
            continue;
        }
        let n = runtimes.len();
        let args = vec![STEP_ARGS; n];
        step_shared(n, Some(&args), |k, f| {
            f(runtimes[if last_first { n - 1 - k } else { k }])
        })?;
    }
    Ok(())
}

/// What [`record_rank`] keeps besides the host program, and what its trainer requests.
#[derive(Debug, Clone, Copy, Default)]
pub struct RecordOptions<'a> {
    /// Keep every translated action (the dry-run comparison in the tests).
    pub keep_actions: bool,
    /// QK-clips requested before every step.
    pub clips: &'a [QkClipRequest],
}

/// Runs rank `rank`'s schedule for `plan` and records its host program.
pub fn record_rank(
    plan: &Plan,
    params: &[ParamSpec],
    cfg: &Config,
    rank: usize,
    cost: CostModel,
    trainer: Trainer,
    options: RecordOptions<'_>,
) -> Result<Recorded> {
    let member = Member {
        plan,
        params,
        cfg,
        cost,
        rank,
    };
    let order: Vec<(usize, usize)> = (0..plan.params.len()).map(|p| (0, p)).collect();
    record_shared(&[member], &order, trainer, options)
}

/// One optimizer of a simulated rank: its plan, params and config, the cost model of its
/// groups, and the rank's place in its data-parallel group.
#[derive(Debug, Clone)]
pub struct Member<'a> {
    pub plan: &'a Plan,
    pub params: &'a [ParamSpec],
    pub cfg: &'a Config,
    pub cost: CostModel,
    pub rank: usize,
}

/// Runs a rank whose optimizers `members` step together ([`train_shared`], the model's params
/// in forward order `order`) on the caller's compute stream, each with its own comm stream and
/// events, and records its host program.
pub fn record_shared(
    members: &[Member<'_>],
    order: &[(usize, usize)],
    trainer: Trainer,
    RecordOptions { keep_actions, clips }: RecordOptions<'_>,
) -> Result<Recorded> {
    let mut gathers = Gathers::new(members[0].plan, members[0].cfg);
    if members.iter().skip(1).any(|m| m.cfg.sharded()) || (gathers.is_some() && members.len() > 1) {
        bail!(
            Unsupported,
            "simulate: sharded params with a second optimizer (expert parallelism) are not modelled"
        );
    }
    let recorder = Arc::new(Mutex::new(Recorder {
        costs: members.iter().map(|m| m.cost.clone()).collect(),
        optimizer: 0,
        call: Call::Setup,
        memory: VirtualMemory::default(),
        out: Recorded {
            actions: keep_actions.then(Vec::new),
            ..Recorded::default()
        },
        sharded: gathers.as_ref().map(Gathers::prefetched_at_step),
        step_gathers: 0,
    }));
    let mut runtimes = Vec::with_capacity(members.len());
    for (k, m) in members.iter().enumerate() {
        let mut translator = Translator::new(m.rank, m.plan.dp as usize, MuonOptions::from_config(m.cfg));
        if let Some(ranks) = m.cost.norm_group() {
            translator = translator.with_norm_group(ranks);
        }
        if let Some(ranks) = m.cost.tp_group() {
            translator = translator.with_tp_group(ranks, 0);
        }
        let backend = CudaBackend::with_executor(translator, SimExecutor(Arc::clone(&recorder), k))?;
        // Sharded params are priced on the replicated schedule, with the gathers around the
        // forward and backward added by `sharding.rs`.
        let mut runtime = Runtime::new(
            Box::new(m.plan.clone()),
            m.params.to_vec(),
            m.cfg.replicated(),
            m.rank,
            Box::new(backend),
            |_| None,
        )?;
        if trainer.params_after_step {
            runtime.sync_params_after_step();
        }
        runtimes.push(runtime);
    }
    let lookup: Vec<Vec<bool>> = members.iter().map(|m| lookups(m.params)).collect();
    // The params whose flops the forward and backward of each param in `order` amount to.
    let flops_params: Vec<u64> = order
        .iter()
        .map(|&(k, p)| {
            let spec = &members[k].params[p];
            let attention = if Attention::closes_layer(&spec.name) {
                trainer.attention_params
            } else {
                0
            };
            attention
                + match trainer.experts_per_token {
                    _ if lookup[k][p] => 0,
                    // The stack's experts share `tokens · routed` token-expert pairs: as many
                    // flops as one expert over every token `routed` times, shared by its pieces.
                    Some(routed) if spec.is_expert_stack() => {
                        spec.numel() / spec.shape[0] * routed / trainer.expert_pieces.max(1)
                    }
                    _ => spec.numel(),
                }
        })
        .collect();
    let model_params: u64 = flops_params.iter().sum();
    let micro_batches = trainer.micro_batches.max(1);
    let micro_tokens = trainer.tokens / micro_batches as u64;
    let model_cost = members[0].cost.clone();
    let host = model_cost.hardware().launch_host_us * 1e-6;
    let model = |r: &mut Recorder, device: f64, backward: bool, what: &'static str| {
        let (call, class) = if backward {
            (Call::Backward, Class::Backward)
        } else {
            (Call::Forward, Class::Forward)
        };
        r.out.items.push(Item::Work {
            stream: StreamKind::Compute,
            host,
            device,
            class,
            label: Label { call, what },
        });
    };
    let mut hooks = |event: TrainerEvent| {
        let mut r = lock(&recorder);
        let mut issues = Vec::new();
        match event {
            TrainerEvent::Iteration => {
                r.out.items.push(Item::IterationStart);
                r.step_gathers = 0;
                if let Some(g) = gathers.as_mut() {
                    g.start_iteration();
                }
            }
            TrainerEvent::Call(call) => r.call = call,
            TrainerEvent::Compute { param, backward } => {
                let phase = if backward { Phase::Backward } else { Phase::Forward };
                let (k, p) = order[param];
                let bucket = members[k].plan.params[p].bucket;
                if let Some(g) = gathers.as_mut() {
                    g.before(phase, p, bucket, &mut issues);
                }
                r.record_gathers(std::mem::take(&mut issues));
                let share = if backward { 2.0 / 3.0 } else { 1.0 / 3.0 };
                let device = model_cost.model_compute(flops_params[param], micro_tokens, share);
                model(&mut r, device, backward, "model");
                if let Some(g) = gathers.as_mut() {
                    g.after(phase, p, bucket, &mut issues);
                }
                r.record_gathers(issues);
            }
            TrainerEvent::Accumulate { forwards, backwards } => {
                let share = (forwards as f64 + 2.0 * backwards as f64) / 3.0;
                let device = model_cost.model_compute(model_params, micro_tokens, share);
                model(&mut r, device, true, "model (accumulated micro-batches)");
            }
            TrainerEvent::Bubble => {
                if trainer.bubble > 0.0 {
                    let ideal = model_cost.model_compute(model_params, micro_tokens * micro_batches as u64, 1.0);
                    model(&mut r, trainer.bubble * ideal, true, "pipeline bubble");
                }
                if let Some(g) = gathers.as_mut() {
                    g.issue(Phase::Backward, None, &mut issues);
                }
                r.record_gathers(issues);
            }
        }
    };
    let plans: Vec<&Plan> = members.iter().map(|m| m.plan).collect();
    let mut refs: Vec<&mut Runtime> = runtimes.iter_mut().collect();
    let runs = (trainer.iterations, micro_batches, trainer.params_after_step);
    train_shared(&mut refs, &plans, order, runs, clips, &mut hooks)?;
    lock(&recorder).out.items.push(Item::Teardown);
    lock(&recorder).call = Call::Setup;
    for runtime in &mut runtimes {
        runtime.synchronize()?;
    }
    drop(runtimes);
    let Ok(recorder) = Arc::try_unwrap(recorder) else {
        bail!(
            Internal,
            "simulate: the recorder of a rank is still shared after the run"
        );
    };
    Ok(recorder.into_inner().unwrap_or_else(PoisonError::into_inner).out)
}

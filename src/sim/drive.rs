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
use crate::model::{ParamFlags, ParamSpec};
use crate::numerics::muon::MuonOptions;
use crate::plan::Plan;
use crate::schedule::{QkClipRequest, Runtime, StepArgs};

use super::cost::{Cost, CostModel};
use super::engine::{Call, Class, Item, Label};

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
    cost: CostModel,
    call: Call,
    memory: VirtualMemory,
    out: Recorded,
}

/// The executor of a simulated rank: prices actions instead of running them.
struct SimExecutor(Arc<Mutex<Recorder>>);

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
            Kernel::MuonMomentum => "muon momentum",
            Kernel::NsNormalize => "ns normalize",
            Kernel::NsSymmetrize => "ns symmetrize",
            Kernel::NsAddIdentity => "ns add identity",
            Kernel::MuonApply => "muon apply",
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
                dtype: NcclType::F64, ..
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

impl Recorder {
    fn record(&mut self, action: &Action) {
        let label = Label {
            call: self.call,
            what: what(action),
        };
        let items = &mut self.out.items;
        match self.cost.cost(action) {
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
    /// Tokens each rank processes per iteration (forward and backward cost).
    pub tokens: u64,
    pub iterations: usize,
}

/// Learning rates of the simulated steps (they change no timing).
const STEP_ARGS: StepArgs = StepArgs {
    lr: 0.02,
    weight_decay: 0.1,
    adam_lr: 3e-4,
    adam_weight_decay: 0.1,
};

/// What the trainer does besides calling the runtime.
#[derive(Debug, Clone, Copy)]
pub enum TrainerEvent {
    /// An iteration begins.
    Iteration,
    /// The API call about to be made.
    Call(Call),
    /// The framework's forward or backward compute of param `param`.
    Compute { param: usize, backward: bool },
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
    for _ in 0..iterations {
        hooks(TrainerEvent::Iteration);
        hooks(TrainerEvent::Call(Call::ZeroGrad));
        runtime.zero_grad()?;
        let mut waited = vec![false; plan.buckets.len()];
        for (p, placement) in plan.params.iter().enumerate() {
            let b = placement.bucket as usize;
            if !waited[b] {
                waited[b] = true;
                hooks(TrainerEvent::Call(Call::WaitParams(b as u32)));
                runtime.wait_params(b as u32)?;
            }
            hooks(TrainerEvent::Compute {
                param: p,
                backward: false,
            });
        }
        for (p, placement) in plan.params.iter().enumerate().rev() {
            hooks(TrainerEvent::Compute {
                param: p,
                backward: true,
            });
            hooks(TrainerEvent::Call(Call::GradReady(placement.bucket)));
            runtime.grad_ready(p as u32)?;
        }
        if !clips.is_empty() {
            runtime.request_qk_clip(clips, super::qk_clip::THRESHOLD, super::qk_clip::ALPHA)?;
        }
        hooks(TrainerEvent::Call(Call::Step));
        runtime.step(Some(&STEP_ARGS))?;
    }
    Ok(())
}

/// Params whose forward is a table lookup rather than a GEMM (no `6·numel·tokens` flops): the
/// input embeddings (`…embeddings…`, flagged as embedding) of a model that has an output layer
/// of its own. A word embedding tied to the output (GPT-2) is also the output GEMM and is
/// charged as one; position embeddings are lookups either way.
pub fn lookups(params: &[ParamSpec]) -> Vec<bool> {
    let embedding = |s: &ParamSpec| s.flags.has(ParamFlags::EMBEDDING_OR_OUTPUT) && s.name.contains("embeddings");
    let own_output = params
        .iter()
        .any(|s| s.flags.has(ParamFlags::EMBEDDING_OR_OUTPUT) && !s.name.contains("embeddings"));
    params
        .iter()
        .map(|s| embedding(s) && (own_output || s.name.contains("position")))
        .collect()
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
    RecordOptions { keep_actions, clips }: RecordOptions<'_>,
) -> Result<Recorded> {
    let (norm_group, tp_group) = (cost.norm_group(), cost.tp_group());
    let recorder = Arc::new(Mutex::new(Recorder {
        cost,
        call: Call::Setup,
        memory: VirtualMemory::default(),
        out: Recorded {
            actions: keep_actions.then(Vec::new),
            ..Recorded::default()
        },
    }));
    let dp = plan.dp as usize;
    let mut translator = Translator::new(rank, dp, MuonOptions::from_config(cfg));
    if let Some(ranks) = norm_group {
        translator = translator.with_norm_group(ranks);
    }
    if let Some(ranks) = tp_group {
        translator = translator.with_tp_group(ranks, 0);
    }
    let backend = CudaBackend::with_executor(translator, SimExecutor(Arc::clone(&recorder)))?;
    let mut runtime = Runtime::new(
        Box::new(plan.clone()),
        params.to_vec(),
        cfg.clone(),
        rank,
        Box::new(backend),
        |_| None,
    )?;
    let model_cost = lock(&recorder).cost.clone();
    let lookup = lookups(params);
    let mut hooks = |event: TrainerEvent| {
        let mut r = lock(&recorder);
        match event {
            TrainerEvent::Iteration => r.out.items.push(Item::IterationStart),
            TrainerEvent::Call(call) => r.call = call,
            TrainerEvent::Compute { param, backward } => {
                let (call, class, share) = if backward {
                    (Call::Backward, Class::Backward, 2.0 / 3.0)
                } else {
                    (Call::Forward, Class::Forward, 1.0 / 3.0)
                };
                let host = r.cost.hardware().launch_host_us * 1e-6;
                r.out.items.push(Item::Work {
                    stream: StreamKind::Compute,
                    host,
                    device: if lookup[param] {
                        0.0
                    } else {
                        model_cost.model_compute(params[param].numel(), trainer.tokens, share)
                    },
                    class,
                    label: Label { call, what: "model" },
                });
            }
        }
    };
    train(&mut runtime, plan, trainer.iterations, clips, &mut hooks)?;
    lock(&recorder).out.items.push(Item::Teardown);
    lock(&recorder).call = Call::Setup;
    runtime.synchronize()?;
    drop(runtime);
    let Ok(recorder) = Arc::try_unwrap(recorder) else {
        bail!(
            Internal,
            "simulate: the recorder of rank {rank} is still shared after the run"
        );
    };
    Ok(recorder.into_inner().unwrap_or_else(PoisonError::into_inner).out)
}

//! The cuda backend receives the same operations as the host backend and has a device
//! implementation for every one of them — checked without a GPU.
//!
//! Two dp=2 host-group runs of the schedule (a few steps, a skipped step, a state reload):
//! run A records the ops the host backend receives; run B tees every op into the host backend
//! and into the CUDA translator's dry run (virtual device addresses, no driver). The
//! translator must receive exactly run A's sequence and translate every command into at
//! least one device action (a QK-clip of the grouped QKV is requested every step). With NVRTC present, every kernel launch of the translation is
//! also checked against the kernel's compiled PTX signature.

mod support;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use muon_opt::backend::cuda::action::{Action, Arg, Kernel};
use muon_opt::backend::cuda::dry_run::{DryRun, Translated};
use muon_opt::backend::cuda::nvrtc::{self, SOURCES, Target};
use muon_opt::backend::host::comm::HostGroup;
use muon_opt::backend::host::executor::HostBackend;
use muon_opt::backend::ops::Op;
use muon_opt::backend::recording::{Observer, Recording};
use muon_opt::comm::{Communicator, Transport};
use muon_opt::config::{CommMode, Config, Dtype, MuonLayout, MuonVariant, NsMethod, NsPrecision};
use muon_opt::error::ErrorKind;
use muon_opt::model::{ParamFlags, ParamSpec};
use muon_opt::numerics::muon::MuonOptions;
use support::cuda::{cuda_model, iterate, runtime};
use support::ranks::on_ranks;
use support::training::{ARGS, bits, rank_grad};

const DP: usize = 2;
/// Words per rank of the gathered parts of the norm (exact sum of squares, steps taken).
const RANK_NORM_WORDS_U64: u64 = muon_opt::numerics::RANK_NORM_WORDS as u64;
const STEPS: u64 = 3;
/// The step whose gradient holds a NaN (skipped on every rank).
const NAN_STEP: u64 = 1;

type Log = Arc<Mutex<Vec<Op>>>;
type Dry = Arc<Mutex<DryRun>>;

/// The configurations the schedule is run with: every layout, both Newton–Schulz precisions,
/// bf16 gradients, overlap off, MXFP8 storage with and without the gather, NorMuon.
fn cases() -> Vec<(&'static str, Config, Vec<ParamSpec>)> {
    let base = Config {
        bucket_size: 4096,
        host_comm_mode: CommMode::Eager,
        // The test matrices' symmetric products by tiles (order 64: 4 a side).
        muon_ns_symmetric_tile: 16,
        ..Config::default()
    };
    vec![
        ("compact, bf16 NS", base.clone(), cuda_model()),
        (
            "padded, f32 NS, bf16 grads, nesterov, no overlap",
            Config {
                muon_layout: MuonLayout::Padded,
                muon_ns_precision: NsPrecision::F32,
                grad_dtype: Dtype::Bf16,
                muon_nesterov: true,
                overlap_grad_reduce: false,
                overlap_param_gather: false,
                ..base.clone()
            },
            cuda_model(),
        ),
        (
            "allreduce, MXFP8 gather, swizzled scales",
            Config {
                muon_layout: MuonLayout::Allreduce,
                mxfp8_param_gather: true,
                mxfp8_swizzled_scales: true,
                ..base.clone()
            },
            cuda_model(),
        ),
        (
            "compact, gram NS, bf16_iterate",
            Config {
                muon_ns_method: NsMethod::Gram,
                muon_ns_precision: NsPrecision::Bf16Iterate,
                ..base.clone()
            },
            cuda_model(),
        ),
        (
            "compact, NorMuon",
            Config {
                muon_variant: MuonVariant::Normuon,
                ..base.clone()
            },
            cuda_model(),
        ),
        (
            "compact, AdaMuon",
            Config {
                muon_variant: MuonVariant::Adamuon,
                ..base.clone()
            },
            cuda_model(),
        ),
        ("compact, MXFP8 without gather", base, cuda_model()),
    ]
}

/// Runs the schedule on a dp=2 host group; every rank's host backend is wrapped in a
/// `Recording` with the observer `observer(rank)`.
fn run<O: Observer + 'static>(cfg: &Config, specs: &[ParamSpec], observer: impl Fn(usize) -> O) {
    let comms = HostGroup::new(DP, Duration::from_secs(20));
    let observers: Vec<O> = (0..DP).map(observer).collect();
    on_ranks(comms.into_iter().zip(observers), |rank, (comm, observer)| {
        let comm = Communicator::new(Transport::Host(comm));
        let host = HostBackend::new(comm, cfg.host_comm_mode, MuonOptions::from_config(cfg)).unwrap();
        let mut rt = runtime(cfg, specs, rank, DP, Box::new(Recording::new(host, observer)));
        // The plan-hash exchange of finalize.
        let hash = rt.plan().hash;
        rt.backend_mut().all_gather_u64(hash).unwrap();
        for step in 0..STEPS {
            let clip = support::qk_clip::grouped_qkv_request(specs);
            rt.request_qk_clip(&[clip], 10.0, 0.5).unwrap();
            let info = iterate(&mut rt, rank, step, step == NAN_STEP);
            assert_eq!(info.skipped, step == NAN_STEP);
        }
        let state = rt.owned_state().unwrap();
        let steps = rt.steps().unwrap();
        rt.load_owned_state(steps, &state).unwrap();
        for p in 0..specs.len() {
            rt.address(p, true);
            rt.mxfp8_addresses(p);
        }
        rt.synchronize().unwrap();
    });
}

fn first_difference(a: &[Op], b: &[Op]) -> Option<usize> {
    (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i))
}

fn name(op: &Op) -> String {
    format!("{op:?}")
        .split([' ', '(', '{'])
        .next()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn the_cuda_translator_receives_the_host_sequence_and_translates_every_op() {
    for (label, cfg, specs) in cases() {
        let host_logs: Vec<Log> = (0..DP).map(|_| Log::default()).collect();
        run(&cfg, &specs, |rank| host_logs[rank].clone());

        let muon = MuonOptions::from_config(&cfg);
        let tee_logs: Vec<Log> = (0..DP).map(|_| Log::default()).collect();
        let dry: Vec<Dry> = (0..DP)
            .map(|rank| Arc::new(Mutex::new(DryRun::new(rank, DP, muon))))
            .collect();
        run(&cfg, &specs, |rank| (tee_logs[rank].clone(), dry[rank].clone()));

        for rank in 0..DP {
            let host = host_logs[rank].lock().unwrap().clone();
            let teed = tee_logs[rank].lock().unwrap().clone();
            let dry = dry[rank].lock().unwrap();
            let received = dry.received();
            assert!(host.len() > 100, "{label}: only {} ops recorded", host.len());
            for (what, other) in [("the teed host backend", &teed), ("the CUDA translator", &received)] {
                if let Some(i) = first_difference(&host, other) {
                    panic!(
                        "{label}, rank {rank}: {what} diverges from the host sequence at op {i}:\nhost: {:?}\nother: {:?}",
                        host.get(i).map(name),
                        other.get(i).map(name)
                    );
                }
            }
            let mut kinds = BTreeSet::new();
            for (i, (op, translated)) in dry.log.iter().enumerate() {
                kinds.insert(name(op));
                match translated {
                    Err(e) => panic!("{label}, rank {rank}: op {i} ({}) failed to translate: {e:?}", name(op)),
                    Ok(Translated::Actions(actions)) => {
                        // Host initial values are only bookkept: the casts from them copy.
                        let bookkeeping = matches!(op, Op::AttachInit { .. } | Op::DetachInit(_));
                        assert!(
                            !actions.is_empty() || bookkeeping,
                            "{label}: op {i} ({}) has no device action",
                            name(op)
                        )
                    }
                    Ok(Translated::Address(address)) => {
                        assert_ne!(*address, 0, "{label}: op {i} ({op:?}) resolved to address 0")
                    }
                    Ok(Translated::Mxfp8(parts)) => {
                        let Op::Mxfp8Addresses(p) = op else { unreachable!() };
                        let is_mxfp8 = specs[*p as usize].flags.has(ParamFlags::MXFP8);
                        assert_eq!(parts.is_some(), is_mxfp8, "{label}: MXFP8 storage of param {p}");
                    }
                }
            }
            let mut expected: BTreeSet<String> = [
                "Allocate",
                "Upload",
                "Download",
                "MemsetZero",
                "Cast",
                "SquaredNorm",
                "MuonUpdate",
                "AdamwUpdate",
                "Record",
                "Wait",
                "Collectives",
                "GatherNormSums",
                "FinishStep",
                "SetStepArgs",
                "SetStepCount",
                "ReadScalars",
                "AllGatherU64",
                "Synchronize",
                "Address",
                "Mxfp8Addresses",
            ]
            .map(String::from)
            .into();
            if specs.iter().any(|s| s.flags.has(ParamFlags::MXFP8)) {
                expected.insert("Mxfp8Quantize".into());
            }
            let missing: Vec<_> = expected.difference(&kinds).collect();
            assert!(missing.is_empty(), "{label}: the run never exercised {missing:?}");
        }
    }
}

/// Without Nesterov the update is the new momentum: the momentum kernel stores nothing more
/// (its update pointer is the momentum's) and Newton–Schulz reads the momentum where it is —
/// normalizing it, or copying it into component order for a per-group split — saving one f32
/// store per element; with Nesterov the update goes to the workspace. Both are bitwise equal to
/// the host (`tests/cuda_emulated.rs`, which runs both).
#[test]
fn without_nesterov_newton_schulz_reads_the_momentum_in_place() {
    let ptr = |args: &[Arg], i: usize| match args.get(i) {
        Some(Arg::Ptr(p)) => *p,
        other => panic!("argument {i} is {other:?}, not a pointer"),
    };
    for (label, cfg, specs) in cases().into_iter().take(2) {
        let muon = MuonOptions::from_config(&cfg);
        let dry: Vec<Dry> = (0..DP)
            .map(|rank| Arc::new(Mutex::new(DryRun::new(rank, DP, muon))))
            .collect();
        run(&cfg, &specs, |rank| dry[rank].clone());
        let (mut normalized, mut reordered, mut jobs) = (0, 0, 0);
        for rank in &dry {
            for (op, translated) in &rank.lock().unwrap().log {
                let (Op::MuonUpdate(job), Ok(Translated::Actions(actions))) = (op, translated) else {
                    continue;
                };
                jobs += 1;
                let Some(Action::Launch(momentum)) = actions.first() else {
                    panic!("{label}: a Muon update starts with the momentum kernel");
                };
                assert_eq!(momentum.kernel, Kernel::MuonMomentum);
                let (m, u) = (ptr(&momentum.args, 2), ptr(&momentum.args, 3));
                assert_eq!(m == u, !cfg.muon_nesterov, "{label}: {job:?}");
                if cfg.muon_nesterov || job.tp.is_some() {
                    continue;
                }
                if job.split_groups > 1 {
                    let Some(Action::CopyDevice { src, .. }) = actions.get(1) else {
                        panic!("{label}: a per-group split copies into component order first");
                    };
                    assert_eq!(*src, m, "{label}: the reordering reads the momentum");
                    reordered += 1;
                } else {
                    let normalize = actions
                        .iter()
                        .find_map(|a| match a {
                            Action::Launch(l) if l.kernel == Kernel::NsNormalize => Some(l),
                            _ => None,
                        })
                        .unwrap();
                    assert_eq!(ptr(&normalize.args, 0), m, "{label}: Newton–Schulz reads the momentum");
                    normalized += 1;
                }
            }
        }
        assert!(jobs > 0, "{label}");
        if !cfg.muon_nesterov {
            assert!(
                normalized > 0 && reordered > 0,
                "{label}: {normalized} normalized, {reordered} reordered in place"
            );
        }
    }
}

/// The parameter types of every `.entry` of a PTX file.
fn ptx_signatures(ptx: &str) -> HashMap<String, Vec<String>> {
    let mut out = HashMap::new();
    for entry in ptx.split(".entry ").skip(1) {
        let (name, rest) = entry.split_once('(').unwrap();
        let params = rest.split_once(')').unwrap().0;
        let types = params
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| {
                let words: Vec<&str> = p.split_whitespace().collect();
                match words.as_slice() {
                    [".param", ".align", _, ".b8", decl] => {
                        let bytes = decl.split_once('[').unwrap().1.trim_end_matches(']');
                        format!("struct[{bytes}]")
                    }
                    [".param", ty, _] => ty.trim_start_matches('.').to_string(),
                    other => panic!("unexpected PTX parameter {other:?}"),
                }
            })
            .collect();
        out.insert(name.trim().to_string(), types);
    }
    out
}

fn arg_fits(arg: &Arg, ptx_type: &str) -> bool {
    match arg {
        Arg::Ptr(_) | Arg::U64(_) => matches!(ptx_type, "u64" | "b64" | "s64"),
        Arg::U32(_) | Arg::I32(_) => matches!(ptx_type, "u32" | "b32" | "s32"),
        Arg::F32(_) => ptx_type == "f32",
        Arg::Words(words) => ptx_type == format!("struct[{}]", words.len() * 8),
    }
}

#[test]
fn every_translated_launch_matches_the_compiled_kernel_signature() {
    if !nvrtc::available() {
        assert!(
            std::env::var("MUON_REQUIRE_NVRTC").as_deref() != Ok("1"),
            "MUON_REQUIRE_NVRTC=1 but libnvrtc.so.13 cannot be loaded"
        );
        eprintln!("SKIPPED: NVRTC not available; set MUON_REQUIRE_NVRTC=1 to make this a failure");
        return;
    }
    let mut signatures = HashMap::new();
    for source in SOURCES {
        let ptx = String::from_utf8(nvrtc::compile(source, Target::Ptx(90)).unwrap()).unwrap();
        signatures.extend(ptx_signatures(&ptx));
    }
    let mut launched = BTreeSet::new();
    for (label, cfg, specs) in cases() {
        let muon = MuonOptions::from_config(&cfg);
        let dry: Vec<Dry> = (0..DP)
            .map(|rank| Arc::new(Mutex::new(DryRun::new(rank, DP, muon))))
            .collect();
        run(&cfg, &specs, |rank| dry[rank].clone());
        for dry in &dry {
            for (op, translated) in &dry.lock().unwrap().log {
                let Ok(Translated::Actions(actions)) = translated else {
                    continue;
                };
                for action in actions {
                    let Action::Launch(launch) = action else { continue };
                    let kernel = launch.kernel.name();
                    launched.insert(kernel);
                    let types = &signatures[kernel];
                    assert_eq!(
                        types.len(),
                        launch.args.len(),
                        "{label}: {kernel} argument count ({op:?})"
                    );
                    for (i, (arg, ty)) in launch.args.iter().zip(types).enumerate() {
                        assert!(arg_fits(arg, ty), "{label}: {kernel} argument {i} is {arg:?}, PTX {ty}");
                    }
                    let threads: u32 = launch.block.iter().product();
                    assert!(
                        threads > 0 && threads <= 256,
                        "{label}: {kernel} block {:?}",
                        launch.block
                    );
                    assert!(
                        launch.grid.iter().all(|&g| g > 0),
                        "{label}: {kernel} grid {:?}",
                        launch.grid
                    );
                }
            }
        }
    }
    let all: BTreeSet<&str> = Kernel::ALL.iter().map(|k| k.name()).collect();
    assert_eq!(launched, all, "every kernel is launched by some schedule op");
}

/// True for an action that blocks the host until the device caught up (or that cannot be
/// captured in a CUDA graph for the same reason).
fn synchronizes_the_host(action: &Action) -> bool {
    matches!(
        action,
        Action::CopyIn { .. } | Action::CopyOut { .. } | Action::Synchronize(_)
    )
}

/// An iteration as a trainer drives it — zero_grad, forward pre-hooks, gradients written in
/// place and grad_ready in backward order, step, the next forward's pre-hooks — translates to
/// device actions none of which waits for the device: the norm, the clip and the skip decision
/// stay on the device, and the step's arguments go in through pinned staging. Only asking for
/// the step's info reads back (one copy to the host).
#[test]
fn an_iteration_translates_to_no_host_synchronizing_action() {
    for (label, cfg, specs) in cases() {
        let dry: Vec<Dry> = (0..DP)
            .map(|rank| Arc::new(Mutex::new(DryRun::new(rank, DP, MuonOptions::from_config(&cfg)))))
            .collect();
        let comms = HostGroup::new(DP, Duration::from_secs(20));
        let marks: Vec<usize> = on_ranks(comms, |rank, comm| {
            let (cfg, specs, dry) = (&cfg, &specs, dry[rank].clone());
            let comm = Communicator::new(Transport::Host(comm));
            let host = HostBackend::new(comm, cfg.host_comm_mode, MuonOptions::from_config(cfg)).unwrap();
            let mut rt = runtime(cfg, specs, rank, DP, Box::new(Recording::new(host, dry.clone())));
            let buckets = rt.plan().buckets.len() as u32;
            let mark = dry.lock().unwrap().log.len();
            rt.zero_grad().unwrap();
            for b in 0..buckets {
                rt.wait_params(b).unwrap();
            }
            for p in (0..specs.len()).rev() {
                let seen = rt.param_values(p).unwrap();
                let grad = rank_grad(0, rank, p, &seen);
                let ptr = rt.address(p, true).cast::<f32>();
                // SAFETY: the host backend's grad view of param p, f32 (grad_dtype).
                if cfg.grad_dtype == Dtype::F32 {
                    unsafe { std::slice::from_raw_parts_mut(ptr, grad.len()) }.copy_from_slice(&grad);
                }
                rt.grad_ready(p as u32).unwrap();
            }
            rt.step(Some(&ARGS)).unwrap();
            for b in 0..buckets {
                rt.wait_params(b).unwrap();
            }
            let end = dry.lock().unwrap().log.len();
            let info = rt.step_info().unwrap();
            assert!(!info.skipped && info.step == 1, "{label}: {info:?}");
            (mark, end)
        })
        .into_iter()
        .flat_map(|(mark, end)| [mark, end])
        .collect();
        for rank in 0..DP {
            let dry = dry[rank].lock().unwrap();
            let (mark, end) = (marks[2 * rank], marks[2 * rank + 1]);
            let mut kinds = BTreeSet::new();
            for (op, translated) in &dry.log[mark..end] {
                // param_values reads are the test's own (Download); they are not part of it.
                if matches!(op, Op::Download(_) | Op::DownloadMxfp8 { .. } | Op::Address(_)) {
                    continue;
                }
                kinds.insert(name(op));
                let Ok(Translated::Actions(actions)) = translated else {
                    panic!("{label}: {op:?} did not translate: {translated:?}");
                };
                let blocking: Vec<_> = actions.iter().filter(|a| synchronizes_the_host(a)).collect();
                assert!(
                    blocking.is_empty(),
                    "{label}, rank {rank}: {} synchronizes: {blocking:?}",
                    name(op)
                );
            }
            for expected in [
                "SquaredNorm",
                "GatherNormSums",
                "FinishStep",
                "SetStepArgs",
                "MuonUpdate",
                "AdamwUpdate",
            ] {
                assert!(kinds.contains(expected), "{label}: the iteration never ran {expected}");
            }
            let (read, translated) = &dry.log[end];
            assert_eq!(*read, Op::ReadScalars);
            let Ok(Translated::Actions(actions)) = translated else {
                unreachable!()
            };
            assert_eq!(actions.iter().filter(|a| synchronizes_the_host(a)).count(), 1);
        }
    }
}

/// The kernels number the step's scalars as `ops::Scalar` does (`MUON_SCALAR_*` of
/// `kernels/muon_common.cuh`), every slot once.
#[test]
fn the_kernels_number_the_scalars_like_the_schedule() {
    use muon_opt::backend::ops::Scalar;
    let header = include_str!("../kernels/muon_common.cuh");
    let defined: HashMap<String, usize> = header
        .lines()
        .filter_map(|l| l.strip_prefix("#define MUON_SCALAR_"))
        .map(|rest| {
            let (name, value) = rest.split_once(' ').unwrap();
            (name.to_string(), value.trim().parse().unwrap())
        })
        .collect();
    assert_eq!(defined.len(), Scalar::COUNT);
    for scalar in Scalar::ALL {
        let mut name = String::new();
        for (i, c) in format!("{scalar:?}").chars().enumerate() {
            if c.is_ascii_uppercase() && i > 0 {
                name.push('_');
            }
            name.push(c.to_ascii_uppercase());
        }
        assert_eq!(defined.get(&name), Some(&scalar.slot()), "MUON_SCALAR_{name}");
    }
}

/// With a norm group the gather of every rank's Σ g² runs on the group's communicator and the
/// step kernel adds the group's sums but divides by the data-parallel size; without one, both
/// are the data-parallel group's. A shared step's other terms are read at their own addresses
/// with their own rank counts and dp (`struct muon_norm_terms`: 8 addresses, 4 words of rank
/// pairs, 4 of dp pairs, the count).
#[test]
fn a_norm_group_gathers_on_its_own_communicator() {
    use muon_opt::backend::cuda::action::{NcclCall, NcclComm, NcclType};
    use muon_opt::backend::cuda::translate::Translator;
    use muon_opt::backend::ops::{NormSums, NormTerm, StepConstants};
    let muon = MuonOptions::from_config(&Config::default());
    let constants = StepConstants { clip_grad: 1.0 };
    for (group, comm, count) in [(Some(8), NcclComm::Norm, 8u32), (None, NcclComm::Data, 2)] {
        let translator = Translator::new(1, 2, muon);
        let translator = match group {
            Some(size) => translator.with_norm_group(size),
            None => translator,
        };
        let mut dry = DryRun::with_translator(translator);
        let own = NormTerm {
            ranks: count as usize,
            sums: NormSums::Own,
        };
        let partner = NormTerm {
            ranks: 16,
            sums: NormSums::Device(0xABC0_0000),
        };
        dry.observe(&Op::GatherNormSums);
        dry.observe(&Op::FinishStep {
            constants,
            terms: vec![partner, own],
        });
        let actions: Vec<Action> = dry
            .log
            .iter()
            .flat_map(|(_, t)| match t {
                Ok(Translated::Actions(a)) => a.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        let [Action::Nccl(which, calls), Action::Launch(launch)] = &actions[..] else {
            panic!("{actions:?}")
        };
        assert_eq!(*which, comm);
        assert!(matches!(
            calls[..],
            [NcclCall::AllGather {
                send_count: RANK_NORM_WORDS_U64,
                dtype: NcclType::U64,
                ..
            }]
        ));
        assert_eq!(launch.kernel, Kernel::StepScalars);
        let NcclCall::AllGather { recv, .. } = calls[0] else {
            unreachable!()
        };
        let Arg::Words(words) = &launch.args[1] else {
            panic!("{:?}", launch.args)
        };
        assert_eq!(words.len(), 13);
        assert_eq!(
            &words[..3],
            &[0xABC0_0000, recv, 0],
            "the partner's sums first, then this rank's receive slots"
        );
        assert_eq!(words[8], 16 | (u64::from(count) << 32), "ranks of each term");
        assert_eq!(words[12], 2, "two terms");
        assert_eq!(launch.args[2], Arg::U32(2), "this optimizer's dp scales its gradients");
    }
    let mut dry = DryRun::with_translator(Translator::new(0, 2, muon));
    let host_partner = NormTerm {
        ranks: 2,
        sums: NormSums::Host(Arc::default()),
    };
    dry.observe(&Op::FinishStep {
        constants,
        terms: vec![host_partner],
    });
    let (_, translated) = &dry.log[0];
    let err = translated.as_ref().unwrap_err();
    assert_eq!(err.kind, ErrorKind::CommMismatch, "{err}");
}

/// The capture-ready form of the step: arguments copied beforehand with `set_step_args`
/// (ordered on the stream), then `step(None)`, which copies nothing from the host — its
/// translation holds no host-to-device copy at all, the argument copy is the one action of
/// `set_step_args`, and the params equal those of steps given their arguments, bit for bit,
/// also when the learning rate, the momentum and the betas change every step; every preset
/// step after the first (which waits for no earlier iteration) translates to the same actions
/// (no per-step value is a launch argument), so one captured graph replays them all.
#[test]
fn steps_with_preset_arguments_copy_nothing_and_match_bitwise() {
    use muon_opt::schedule::{StepArgs, StepOverrides};
    let (cfg, specs) = (cases()[0].1.clone(), cuda_model());
    let args = |step: u64| StepArgs {
        lr: 0.02 / (1.0 + step as f32),
        overrides: StepOverrides {
            muon_momentum: Some(0.9 - 0.1 * step as f32),
            adam_beta1: Some(0.8 + 0.05 * step as f32),
            adam_beta2: Some(0.95),
            adam_eps: Some(1e-6 * (1 + step) as f32),
            decoupled_lr: Some(1e-3 * (2 + step) as f32),
        },
        ..ARGS
    };
    type DryLog = Vec<(Op, muon_opt::error::Result<Translated>)>;
    let run = |preset: bool| -> (Vec<Vec<f32>>, Vec<DryLog>) {
        let dry = Arc::new(Mutex::new(DryRun::new(0, 1, MuonOptions::from_config(&cfg))));
        let comm = Communicator::new(Transport::Host(HostGroup::new(1, Duration::from_secs(20)).remove(0)));
        let host = HostBackend::new(comm, cfg.host_comm_mode, MuonOptions::from_config(&cfg)).unwrap();
        let mut rt = runtime(&cfg, &specs, 0, 1, Box::new(Recording::new(host, dry.clone())));
        let mut step_log = Vec::new();
        for step in 0..3u64 {
            if preset {
                rt.set_step_args(&args(step)).unwrap();
            }
            let mark = dry.lock().unwrap().log.len();
            rt.zero_grad().unwrap();
            for b in 0..rt.plan().buckets.len() as u32 {
                rt.wait_params(b).unwrap();
            }
            for p in (0..specs.len()).rev() {
                let seen = rt.param_values(p).unwrap();
                let grad = rank_grad(step, 0, p, &seen);
                let ptr = rt.address(p, true).cast::<f32>();
                // SAFETY: the host backend's f32 grad view of param p (grad_dtype f32).
                unsafe { std::slice::from_raw_parts_mut(ptr, grad.len()) }.copy_from_slice(&grad);
                rt.grad_ready(p as u32).unwrap();
            }
            if preset {
                rt.step(None).unwrap();
            } else {
                rt.step(Some(&args(step))).unwrap();
            }
            step_log.push(dry.lock().unwrap().log[mark..].to_vec());
        }
        rt.synchronize().unwrap();
        let params = (0..specs.len()).map(|p| rt.param_values(p).unwrap()).collect();
        (params, step_log)
    };
    let (given, given_log) = run(false);
    let (preset, preset_log) = run(true);
    for (p, (a, b)) in given.iter().zip(&preset).enumerate() {
        assert!(bits(a) == bits(b), "param {p} differs");
    }
    assert!(
        format!("{:?}", preset_log[1]) == format!("{:?}", preset_log[2]),
        "every preset step translates alike"
    );
    let copies = |log: &[DryLog]| {
        log.iter()
            .flatten()
            .filter_map(|(_, t)| match t {
                Ok(Translated::Actions(a)) => {
                    Some(a.iter().filter(|x| matches!(x, Action::CopyInAsync { .. })).count())
                }
                _ => None,
            })
            .sum::<usize>()
    };
    assert_eq!(copies(&given_log), 3, "a step given its arguments copies them");
    assert_eq!(copies(&preset_log), 0, "a step with preset arguments copies nothing");
}

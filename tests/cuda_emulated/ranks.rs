//! Several emulated devices at once (issue 37, item 4): each rank of dp 2 or 3 (and of a
//! dp 2 × tp 2 grid) an emulated device on its own thread, its NCCL communicators over host
//! groups with NCCL's semantics and argument rules (`nccl.rs`), against the host backend's
//! ranks on host groups of their own — every layout and ownership, MXFP8 gathered and local,
//! standard and Gram Newton–Schulz, QK-clip, a shared step of two optimizers, compared bit for
//! bit after every step: every rank's params, its owned state and the step's norm and clip.
//! The tests are named `ranks_*` (scripts/test-kernels.sh leaves them out of the
//! ThreadSanitizer run: several ranks' launches serialize through one kernel lock and outlast
//! its time limit; every kernel they launch runs under it in the one-rank tests).

use std::sync::Arc;
use std::time::Duration;

use muon_opt::backend::cuda::CudaBackend;
use muon_opt::backend::cuda::action::NcclComm;
use muon_opt::backend::cuda::translate::Translator;
use muon_opt::backend::host::comm::{HostComm, HostGroup};
use muon_opt::backend::host::executor::HostBackend;
use muon_opt::backend::ops::QkMaxima;
use muon_opt::comm::{Communicator, Transport};
use muon_opt::config::{CommMode, Config, MuonLayout, MuonOwnership, NsMethod, NsPrecision, ParamSharding};
use muon_opt::model::{ParamFlags, ParamSpec};
use muon_opt::numerics::muon::MuonOptions;
use muon_opt::schedule::{Runtime, StepInfo, step_shared};

use super::emulator::{Emulator, SMALL_TILE};
use super::kernels_cpu;
use super::support::cuda::{backward, grouped_qkv, mxfp8_params, runtime, sharded_backward};
use super::support::qk_clip::grouped_qkv_request;
use super::support::ranks::on_ranks;
use super::support::training::{ARGS, bits, model};

const STEPS: u64 = 2;
const TIMEOUT: Duration = Duration::from_secs(120);

/// The common test model, a fused MXFP8 matrix and an MXFP8 AdamW matrix, and Megatron's
/// grouped QKV the QK-clip runs on.
fn ranks_model() -> Vec<ParamSpec> {
    let mut specs = model();
    specs.extend(mxfp8_params());
    specs.push(grouped_qkv());
    specs
}

fn config(layout: MuonLayout, ownership: MuonOwnership) -> Config {
    Config {
        muon_layout: layout,
        muon_ownership: ownership,
        bucket_size: 2048,
        muon_ns_symmetric_tile: SMALL_TILE,
        muon_ns_precision: NsPrecision::F32,
        host_comm_mode: CommMode::Eager,
        clip_grad: 1e-2,
        ..Config::default()
    }
}

fn host_comm(comm: HostComm) -> Arc<Communicator> {
    Communicator::new(Transport::Host(comm))
}

/// Rank `rank`'s pair of runtimes: the host backend on `host` and the emulated device with its
/// data-parallel communicator on `emulated`.
fn pair(cfg: &Config, specs: &[ParamSpec], rank: usize, dp: usize, host: HostComm, emulated: HostComm) -> [Runtime; 2] {
    let muon = MuonOptions::from_config(cfg);
    let host = HostBackend::new(host_comm(host), CommMode::Eager, muon).unwrap();
    let device = Emulator::new().with_comm(NcclComm::Data, emulated);
    let emulated = CudaBackend::with_executor(Translator::new(rank, dp, muon), device).unwrap();
    [
        runtime(cfg, specs, rank, dp, Box::new(host)),
        runtime(cfg, specs, rank, dp, Box::new(emulated)),
    ]
}

fn forward(rt: &mut Runtime) -> StepInfo {
    for b in 0..rt.plan().buckets.len() as u32 {
        rt.wait_params(b).unwrap();
    }
    rt.step_info().unwrap()
}

/// The QK-clip of the grouped QKV: the maxima in host memory for the host backend, at a device
/// address (the same values) for the emulated one.
pub(super) fn clip(rt: &mut Runtime, specs: &[ParamSpec], device: bool) {
    let mut request = grouped_qkv_request(specs);
    if !device {
        let QkMaxima::Device(address) = request.maxima else {
            unreachable!()
        };
        // SAFETY: grouped_qkv_request's maxima are a static array of its 6 heads.
        let values = unsafe { std::slice::from_raw_parts(address as *const f32, 6) };
        request.maxima = QkMaxima::Host(values.to_vec());
    }
    rt.request_qk_clip(&[request], 10.0, 0.5).unwrap();
}

/// Asserts the host and emulated runtimes of one rank hold the same bits.
fn assert_same(label: &str, rank: usize, step: u64, runs: &mut [Runtime], infos: [StepInfo; 2], specs: &[ParamSpec]) {
    let every: Vec<usize> = (0..specs.len()).collect();
    assert_same_params(label, rank, step, runs, specs, &every);
    assert_same_state(label, rank, step, runs, infos, specs);
}

/// Asserts the host and emulated runtimes of one rank see the same bits of params `params`.
fn assert_same_params(
    label: &str,
    rank: usize,
    step: u64,
    runs: &mut [Runtime],
    specs: &[ParamSpec],
    params: &[usize],
) {
    for &p in params {
        assert!(
            bits(&runs[0].param_values(p).unwrap()) == bits(&runs[1].param_values(p).unwrap()),
            "{label}: rank {rank} step {step}: param {} differs",
            specs[p].name
        );
    }
}

/// Asserts the host and emulated runtimes of one rank hold the same step info and owned state.
fn assert_same_state(
    label: &str,
    rank: usize,
    step: u64,
    runs: &mut [Runtime],
    infos: [StepInfo; 2],
    specs: &[ParamSpec],
) {
    let [a, b] = infos;
    assert_eq!(
        (a.grad_norm.to_bits(), a.clip_coef.to_bits(), a.skipped, a.step),
        (b.grad_norm.to_bits(), b.clip_coef.to_bits(), b.skipped, b.step),
        "{label}: rank {rank} step {step}: step info"
    );
    let (sa, sb) = (runs[0].owned_state().unwrap(), runs[1].owned_state().unwrap());
    assert_eq!(sa.len(), sb.len(), "{label}: rank {rank}: owned pieces");
    for (x, y) in sa.iter().zip(&sb) {
        let arrays = std::iter::once((&x.master, &y.master)).chain(x.moments.iter().zip(&y.moments));
        for (k, (u, v)) in arrays.enumerate() {
            assert!(
                bits(u) == bits(v),
                "{label}: rank {rank} step {step}: {} state array {k} differs",
                specs[x.param as usize].name
            );
        }
    }
}

/// `STEPS` steps at `dp`, host and emulated rank by rank, compared after every step.
fn compare(label: &str, cfg: &Config, dp: usize, qk_clip: bool) {
    let specs = ranks_model();
    let groups = HostGroup::new(dp, TIMEOUT).into_iter().zip(HostGroup::new(dp, TIMEOUT));
    on_ranks(groups, |rank, (host, emulated)| {
        let mut runs = pair(cfg, &specs, rank, dp, host, emulated);
        for step in 0..STEPS {
            let infos = [0, 1].map(|k| {
                let rt = &mut runs[k];
                backward(rt, rank, step, false);
                if qk_clip {
                    clip(rt, &specs, k == 1);
                }
                rt.step(Some(&ARGS)).unwrap();
                forward(rt)
            });
            assert_same(label, rank, step, &mut runs, infos, &specs);
        }
    });
}

/// [`compare`] with `param_sharding = sharded` (MXFP8 params gathered as bf16 into the
/// window and quantized there): each rank's iteration is [`sharded_backward`] and the step;
/// then every bucket is gathered on both runtimes, its params compared, and released.
fn compare_sharded(label: &str, cfg: &Config, dp: usize) {
    let specs = ranks_model();
    let cfg = Config {
        param_sharding: ParamSharding::Sharded,
        ..cfg.clone()
    };
    let groups = HostGroup::new(dp, TIMEOUT).into_iter().zip(HostGroup::new(dp, TIMEOUT));
    on_ranks(groups, |rank, (host, emulated)| {
        let mut runs = pair(&cfg, &specs, rank, dp, host, emulated);
        for step in 0..STEPS {
            let infos = [0, 1].map(|k| {
                let rt = &mut runs[k];
                sharded_backward(rt, rank, step);
                rt.step(Some(&ARGS)).unwrap();
                rt.step_info().unwrap()
            });
            assert_same_state(label, rank, step, &mut runs, infos, &specs);
            for b in 0..runs[0].plan().buckets.len() {
                let params: Vec<usize> = runs[0].plan().buckets[b].params.iter().map(|&p| p as usize).collect();
                for rt in runs.iter_mut() {
                    rt.wait_params(b as u32).unwrap();
                }
                assert_same_params(label, rank, step, &mut runs, &specs, &params);
                for rt in runs.iter_mut() {
                    rt.release_params(b as u32).unwrap();
                }
            }
        }
    });
}

/// Sharded params on the emulated device equal the host backend's bit for bit at dp 1 to 4 in
/// every layout (balanced ownership; the host backend's sharded runs equal its replicated
/// ones in every layout and ownership: `tests/sharded_parity.rs`).
#[test]
fn ranks_sharded_params_every_layout() {
    if !kernels_cpu::available() {
        return;
    }
    let every = (1..=4).flat_map(|dp| MuonLayout::ALL.iter().map(move |&l| (dp, l)));
    for (dp, layout) in every {
        let label = format!("sharded dp {dp} {}", layout.name());
        compare_sharded(&label, &config(layout, MuonOwnership::Balanced), dp);
    }
}

#[test]
fn ranks_every_layout_and_ownership_at_dp_2_and_3() {
    if !kernels_cpu::available() {
        return;
    }
    for dp in [2, 3] {
        for &layout in MuonLayout::ALL {
            for &ownership in MuonOwnership::ALL {
                if ownership == MuonOwnership::Contiguous && !layout.takes_contiguous_ownership() {
                    continue;
                }
                let label = format!("dp {dp} {} {}", layout.name(), ownership.name());
                compare(&label, &config(layout, ownership), dp, false);
            }
        }
    }
}

#[test]
fn ranks_mxfp8_gathered_gram_and_qk_clip() {
    if !kernels_cpu::available() {
        return;
    }
    let base = config(MuonLayout::Compact, MuonOwnership::Balanced);
    let gathered = Config {
        mxfp8_param_gather: true,
        ..base.clone()
    };
    compare("dp 3 MXFP8 gathered as bf16, QK-clip", &gathered, 3, true);
    let gram = Config {
        muon_ns_method: NsMethod::Gram,
        muon_ns_precision: NsPrecision::Bf16,
        ..base
    };
    compare("dp 2 Gram Newton-Schulz in bf16, QK-clip", &gram, 2, true);
}

/// Two optimizers of each rank (dense params and expert stacks) share one clip
/// (`step_shared`): their sums of squares read across backends on the device.
#[test]
fn ranks_a_shared_step_of_two_optimizers() {
    if !kernels_cpu::available() {
        return;
    }
    const DP: usize = 2;
    let cfg = config(MuonLayout::Compact, MuonOwnership::Balanced);
    let (experts, dense): (Vec<ParamSpec>, Vec<ParamSpec>) = ranks_model()
        .into_iter()
        .partition(|s| s.flags.has(ParamFlags::EXPERT_STACK));
    let members = [dense, experts];
    let groups: Vec<_> = (0..4).map(|_| HostGroup::new(DP, TIMEOUT)).collect();
    let mut per_rank: Vec<Vec<HostComm>> = (0..DP).map(|_| Vec::new()).collect();
    for group in groups {
        for (rank, comm) in group.into_iter().enumerate() {
            per_rank[rank].push(comm);
        }
    }
    on_ranks(per_rank, |rank, comms| {
        let mut comms = comms.into_iter();
        let mut runs: Vec<[Runtime; 2]> = members
            .iter()
            .map(|specs| pair(&cfg, specs, rank, DP, comms.next().unwrap(), comms.next().unwrap()))
            .collect();
        for step in 0..STEPS {
            let infos = [0, 1].map(|k| {
                for run in runs.iter_mut() {
                    backward(&mut run[k], rank, step, false);
                }
                step_shared(2, Some(&[ARGS, ARGS]), |m, f| f(&mut runs[m][k])).unwrap();
                runs.iter_mut().map(|run| forward(&mut run[k])).collect::<Vec<_>>()
            });
            for (m, specs) in members.iter().enumerate() {
                let label = format!("dp {DP} shared step, optimizer {m}");
                assert_same(&label, rank, step, &mut runs[m], [infos[0][m], infos[1][m]], specs);
            }
        }
    });
}

/// A rank at another step count (set alone): on the device as on the host, the step is skipped
/// on every rank and its info names both ranks' counts.
#[test]
fn ranks_at_different_step_counts_are_refused_alike() {
    if !kernels_cpu::available() {
        return;
    }
    const DP: usize = 2;
    let cfg = config(MuonLayout::Compact, MuonOwnership::Balanced);
    let specs = ranks_model();
    let groups = HostGroup::new(DP, TIMEOUT).into_iter().zip(HostGroup::new(DP, TIMEOUT));
    on_ranks(groups, |rank, (host, emulated)| {
        let mut runs = pair(&cfg, &specs, rank, DP, host, emulated);
        let outcomes = [0, 1].map(|k| {
            let rt = &mut runs[k];
            if rank == 1 {
                rt.backend_mut().set_step_count(5).unwrap();
            }
            let values = |rt: &mut Runtime| -> Vec<Vec<u32>> {
                (0..specs.len()).map(|p| bits(&rt.param_values(p).unwrap())).collect()
            };
            let before = values(rt);
            backward(rt, rank, 0, false);
            rt.step(Some(&ARGS)).unwrap();
            for b in 0..rt.plan().buckets.len() as u32 {
                rt.wait_params(b).unwrap();
            }
            let err = rt.step_info().unwrap_err();
            assert!(values(rt) == before, "rank {rank}: the refused step changed params");
            (err.kind, err.message)
        });
        assert_eq!(outcomes[0], outcomes[1], "rank {rank}: host and device");
        assert!(
            outcomes[1].1.contains("rank 1 has taken 5 steps, rank 0 0"),
            "{}",
            outcomes[1].1
        );
    });
}

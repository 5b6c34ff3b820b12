//! `muon-opt simulate`: the cost model against closed forms, the engine against hand-built
//! programs with exact expected times, the simulated actions against the dry-run translation
//! of the same schedule run on the host backend, and a schedule change that removes overlap
//! made visible in the figures.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use muon_opt::backend::cuda::action::{Action, Gemm, GemmInputs, Kernel, Matrices, NcclCall, NcclType};
use muon_opt::backend::cuda::dry_run::{DryRun, Translated};
use muon_opt::backend::cuda::translate::Translator;
use muon_opt::backend::host::comm::HostGroup;
use muon_opt::backend::host::executor::HostBackend;
use muon_opt::backend::ops::{EventId, StreamKind};
use muon_opt::backend::recording::Recording;
use muon_opt::comm::{Communicator, Transport};
use muon_opt::config::{CommMode, Config, MuonLayout};
use muon_opt::model::Registry;
use muon_opt::numerics::muon::MuonOptions;
use muon_opt::plan::build_plan;
use muon_opt::plan::presets::preset;
use muon_opt::schedule::Runtime;
use muon_opt::sim::cost::{Cost, CostModel};
use muon_opt::sim::drive::{RecordOptions, Trainer, record_rank, train};
use muon_opt::sim::engine::{self, Call, Class, Item, Label};
use muon_opt::sim::profile::{HARDWARE_NAMES, Hardware, builtin};
use muon_opt::sim::{Scenario, simulate};
use support::cuda::cuda_model;
use support::ranks::on_ranks;

const US: f64 = 1e-6;

fn h100() -> Hardware {
    builtin("h100-nvlink").unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(b.abs()).max(1e-30)
}

#[test]
fn builtin_profiles_parse_validate_and_cite_sources() {
    for name in HARDWARE_NAMES {
        let hw = builtin(name).unwrap();
        assert_eq!(hw.name, *name);
        assert!(
            hw.sources.contains_key("gpu") && hw.sources.contains_key("nccl_latency"),
            "{name}"
        );
        for key in [
            "memory",
            "network",
            "placement",
            "achievable_fractions",
            "model_efficiency",
        ] {
            assert!(hw.sources.contains_key(key), "{name}: no source for {key}");
        }
        if hw.measured.is_empty() {
            // Nothing measured: every achievable fraction is named an estimate.
            assert!(hw.sources["achievable_fractions"].contains("estimate"), "{name}");
        }
        let text = serde_json::to_string(&hw).unwrap();
        assert_eq!(Hardware::from_json(&text).unwrap(), hw);
    }
    let bad = serde_json::to_string(&Hardware {
        hbm_efficiency: 1.5,
        ..h100()
    })
    .unwrap();
    let err = Hardware::from_json(&bad).unwrap_err().to_string();
    assert!(err.contains("hbm_efficiency"), "{err}");
    let unknown = r#"{"name": "x", "bogus": 1}"#;
    assert!(Hardware::from_json(unknown).is_err());
}

/// The datasheet peaks of the A100 and NVL72 profiles (their `sources.gpu`), and the NVL72
/// placement: a data-parallel group of up to 72 ranks stays inside the NVLink domain.
#[test]
fn a100_and_nvl72_profiles_carry_their_datasheet_peaks_and_placement() {
    let a100 = builtin("a100-nvlink").unwrap();
    assert_eq!((a100.bf16_tflops, a100.hbm_gbps, a100.memory_gb), (312.0, 2039.0, 80.0));
    assert_eq!((a100.nvlink_gbps, a100.network_gbps, a100.sms), (300.0, 25.0, 108));
    let gb200 = builtin("gb200-nvl72").unwrap();
    let gb300 = builtin("gb300-nvl72").unwrap();
    for hw in [&gb200, &gb300] {
        assert_eq!((hw.bf16_tflops, hw.hbm_gbps, hw.nvlink_gbps), (2500.0, 8000.0, 900.0));
        assert_eq!(hw.dp_ranks_per_node, 72);
        assert!(hw.sources["gpu"].contains("NVL72 datasheet"), "{}", hw.name);
    }
    assert_eq!((gb200.network_gbps, gb300.network_gbps), (50.0, 100.0));
    assert_eq!((gb200.memory_gb, gb300.memory_gb), (186.0, 288.0));
    let inside = CostModel::new(gb300.clone(), 64).network();
    let nvlink = CostModel::new(gb300.clone(), 8).network();
    assert_eq!(inside.bus_bandwidth_gbps, nvlink.bus_bandwidth_gbps);
    let across = CostModel::new(gb300, 144).network();
    assert!(across.bus_bandwidth_gbps <= inside.bus_bandwidth_gbps);
    assert!(across.hop_latency_us > inside.hop_latency_us);
}

/// A strided batch at no address: the cost model prices the shape only.
const UNADDRESSED: Matrices = Matrices::Strided {
    a: 0,
    stride_a: 0,
    b: 0,
    stride_b: 0,
    c: 0,
    stride_c: 0,
};

#[test]
fn a_lone_gemm_costs_its_flops_at_the_filled_fraction_of_the_peak() {
    let cost = CostModel::new(h100(), 8);
    let gemm = |m: i32, n: i32, k: i32, batch: i32| Gemm {
        inputs: GemmInputs::Bf16,
        transpose_a: false,
        m,
        n,
        k,
        alpha: 1.0,
        lda: m,
        ldb: k,
        beta: 0.0,
        ldc: m,
        batch,
        matrices: UNADDRESSED,
    };
    // 4096³: 32·32 = 1024 tiles of 128² in ceil(1024/132) = 8 waves of 132 SMs.
    let fill = 1024.0 / (8.0 * 132.0);
    let expected = 2.0 * 4096f64.powi(3) / (989e12 * 0.72 * fill);
    assert!(close(cost.gemm(&gemm(4096, 4096, 4096, 1)), expected));
    // One 128² tile fills one SM of 132: compute at 1/132 of the peak beats the operand bytes.
    let small = cost.gemm(&gemm(128, 128, 4096, 1));
    let expected_small = 2.0 * 128.0 * 128.0 * 4096.0 / (989e12 * 0.72 / 132.0);
    assert!(close(small, expected_small), "{small} vs {expected_small}");
    // Per flop, the small GEMM is 132·fill times slower than the large one.
    let per_flop = |t: f64, m: f64, n: f64, k: f64| t / (2.0 * m * n * k);
    assert!(per_flop(small, 128.0, 128.0, 4096.0) > 100.0 * per_flop(expected, 4096.0, 4096.0, 4096.0));
}

/// The 528 tiles on and below the diagonal of an order-4096 `X·Xᵀ` (`k` = 14336) as one
/// listed batch: exactly 4 full waves of compute, the operands read once per panel (32 row
/// panels of `X` as each operand). As a strided batch of 528 distinct matrices the same work
/// would stream 528 operand pairs and be bound by HBM.
#[test]
fn a_listed_batch_of_tiles_reads_each_operand_panel_once() {
    let cost = CostModel::new(h100(), 8);
    let (tile, k, tiles) = (128i32, 14336i32, 528i32);
    let gemm = |matrices| Gemm {
        inputs: GemmInputs::Bf16,
        transpose_a: true,
        m: tile,
        n: tile,
        k,
        alpha: 1.0,
        lda: k,
        ldb: k,
        beta: 0.0,
        ldc: 4096,
        batch: tiles,
        matrices,
    };
    let listed = cost.gemm(&gemm(Matrices::Listed { table: 0, panels: 32 }));
    let flops = 2.0 * 128.0 * 128.0 * 14336.0 * 528.0;
    assert!(close(listed, flops / (989e12 * 0.72)), "{listed}");
    let full = cost.gemm(&gemm(UNADDRESSED));
    let streamed = 528.0 * 2.0 * 128.0 * 14336.0 * 2.0 + 528.0 * 128.0 * 128.0 * 4.0;
    assert!(close(full, streamed / (3350e9 * 0.8)), "{full}");
    assert!(listed < full / 4.0);
}

#[test]
fn lone_collectives_follow_the_ring_alpha_beta_model_per_algorithm() {
    let s_elems = 64 << 20; // 64 Mi f32 elements = 256 MiB
    let bytes = (s_elems * 4) as f64;
    let call = |kind: u8| match kind {
        0 => NcclCall::ReduceScatter {
            send: 0,
            recv: 0,
            recv_count: s_elems / 8,
            dtype: NcclType::F32,
        },
        1 => NcclCall::AllGather {
            send: 0,
            recv: 0,
            send_count: s_elems / 8,
            dtype: NcclType::F32,
        },
        2 => NcclCall::AllReduce {
            send: 0,
            recv: 0,
            count: s_elems,
            dtype: NcclType::F32,
        },
        3 => NcclCall::Reduce {
            send: 0,
            recv: 0,
            count: s_elems,
            dtype: NcclType::F32,
            root: 3,
        },
        _ => NcclCall::Broadcast {
            send: 0,
            recv: 0,
            count: s_elems,
            dtype: NcclType::F32,
            root: 0,
        },
    };
    // dp = 8 in one NVLink node: hops of 3.4 µs, 450 GB/s · 0.8.
    let nvl = CostModel::new(h100(), 8);
    let bw = 450e9 * 0.8;
    let alpha = |steps: f64| (8.4 + steps * 3.4) * US;
    assert!(close(nvl.nccl(&call(0)), alpha(7.0) + bytes * 7.0 / 8.0 / bw));
    assert!(close(nvl.nccl(&call(1)), alpha(7.0) + bytes * 7.0 / 8.0 / bw));
    assert!(close(nvl.nccl(&call(2)), alpha(14.0) + 2.0 * bytes * 7.0 / 8.0 / bw));
    assert!(close(nvl.nccl(&call(3)), alpha(7.0) + bytes / bw));
    assert!(close(nvl.nccl(&call(4)), alpha(7.0) + bytes / bw));
    // dp = 8 with one data-parallel rank per node: every hop crosses the network.
    let ib = CostModel::new(builtin("h100-ib").unwrap(), 8);
    let net = 50e9 * 0.9;
    assert!(close(
        ib.nccl(&call(0)),
        (8.4 + 7.0 * 14.0) * US + bytes * 7.0 / 8.0 / net
    ));
    // A group of one rank moves nothing.
    assert_eq!(CostModel::new(h100(), 1).nccl(&call(2)), 0.0);
}

#[test]
fn a_lone_element_wise_kernel_costs_its_bytes_at_achievable_hbm_bandwidth() {
    let cost = CostModel::new(h100(), 8);
    let adamw = |n: u64| {
        Action::Launch(muon_opt::backend::cuda::action::Launch {
            kernel: Kernel::Adamw,
            grid: [1, 1, 1],
            block: [256, 1, 1],
            stream: StreamKind::Compute,
            args: vec![
                muon_opt::backend::cuda::action::Arg::Ptr(0),
                muon_opt::backend::cuda::action::Arg::Ptr(0),
                muon_opt::backend::cuda::action::Arg::Ptr(0),
                muon_opt::backend::cuda::action::Arg::Ptr(0),
                muon_opt::backend::cuda::action::Arg::I32(0),
                muon_opt::backend::cuda::action::Arg::U64(n),
            ],
        })
    };
    // f32 grads: master, exp_avg, exp_avg_sq read and written, the grad read = 28 bytes.
    let n = 1u64 << 28;
    let Cost::Work { device, host, stream } = cost.cost(&adamw(n)) else {
        panic!("a kernel is stream work")
    };
    assert_eq!(stream, StreamKind::Compute);
    assert!(close(device, 28.0 * n as f64 / (3350e9 * 0.8)));
    assert!(close(host, 4.0 * US));
    // A tiny kernel costs the minimum kernel time.
    let Cost::Work { device, .. } = cost.cost(&adamw(16)) else {
        unreachable!()
    };
    assert!(close(device, 2.0 * US));
}

fn label(what: &'static str) -> Label {
    Label { call: Call::Step, what }
}

fn work(stream: StreamKind, host: f64, device: f64) -> Item {
    Item::Work {
        stream,
        host,
        device,
        class: Class::Optimizer,
        label: label("work"),
    }
}

#[test]
fn the_engine_orders_two_streams_by_events_and_stalls_the_host_on_a_sync() {
    use StreamKind::{Comm, Compute};
    let e = EventId(7);
    let program = vec![
        Item::IterationStart,
        work(Compute, 1.0, 10.0),
        Item::Record {
            stream: Compute,
            event: e,
            host: 0.0,
            label: label("record"),
        },
        Item::Wait {
            stream: Comm,
            event: e,
            host: 0.0,
            label: label("wait"),
        },
        // A wait on an event never recorded is no wait.
        Item::Wait {
            stream: Comm,
            event: EventId(99),
            host: 0.0,
            label: label("wait"),
        },
        work(Comm, 1.0, 5.0),
        Item::Sync {
            stream: Comm,
            label: label("sync"),
        },
        work(Compute, 1.0, 2.0),
    ];
    let timeline = &engine::run(vec![program]).unwrap()[0];
    let real = optimizer_spans(timeline);
    // compute 1..11; comm waits for the record at 11, runs 11..16; the host, blocked until 16,
    // issues the last work at 17, which runs 17..19.
    assert_eq!(real, vec![(1.0, 11.0), (11.0, 16.0), (17.0, 19.0)]);
    // The event wait carries the waiting (issued at 1, satisfied at 11), not the work behind it.
    let waits: Vec<f64> = timeline
        .slices
        .iter()
        .filter(|s| s.stream == Comm && s.class == Class::Event)
        .map(|s| s.waited)
        .collect();
    assert_eq!(waits, vec![10.0, 0.0]);
    assert_eq!(timeline.host_syncs, vec![1]);
    assert_eq!(timeline.host_stall, vec![14.0]);
    assert_eq!(timeline.host_end, 17.0);
}

/// Two optimizers of a rank: each has its own comm stream (their work overlaps) and its own
/// events (optimizer 1's record of event 3 is not the one optimizer 0's wait refers to); the
/// compute stream is shared.
#[test]
fn each_optimizer_of_a_rank_has_its_own_comm_stream_and_events() {
    use StreamKind::{Comm, Compute};
    let e = EventId(3);
    let record = |stream| Item::Record {
        stream,
        event: e,
        host: 0.0,
        label: label("record"),
    };
    let wait = |stream| Item::Wait {
        stream,
        event: e,
        host: 0.0,
        label: label("wait"),
    };
    let program = vec![
        Item::IterationStart,
        work(Comm, 0.0, 10.0),
        record(Comm),
        Item::Optimizer(1),
        work(Comm, 0.0, 4.0),
        record(Comm),
        work(Compute, 0.0, 1.0),
        Item::Optimizer(0),
        wait(Compute),
        work(Compute, 0.0, 2.0),
    ];
    let timeline = &engine::run(vec![program]).unwrap()[0];
    let real = optimizer_spans(timeline);
    // Comm work of optimizers 0 and 1 side by side (0..10, 0..4); the compute stream's wait
    // on optimizer 0's event ends at 10, not at optimizer 1's 4.
    assert_eq!(real, vec![(0.0, 10.0), (0.0, 4.0), (0.0, 1.0), (10.0, 12.0)]);
    let err = engine::run(vec![vec![Item::Optimizer(engine::MAX_OPTIMIZERS)]]).unwrap_err();
    assert!(err.message.contains("at most 2"), "{err}");
}

#[test]
fn a_collective_ends_its_duration_after_the_last_rank_reaches_it() {
    use StreamKind::{Comm, Compute};
    let collective = |signature| Item::Collective {
        host: 0.0,
        device: 3.0,
        signature,
        label: label("reduce"),
    };
    let ready = |rank_compute: f64| {
        vec![
            Item::IterationStart,
            work(Compute, 0.0, rank_compute),
            Item::Record {
                stream: Compute,
                event: EventId(0),
                host: 0.0,
                label: label("record"),
            },
            Item::Wait {
                stream: Comm,
                event: EventId(0),
                host: 0.0,
                label: label("wait"),
            },
            collective(42),
        ]
    };
    let timelines = engine::run(vec![ready(1.0), ready(5.0)]).unwrap();
    for t in &timelines {
        let c = t.slices.iter().find(|s| s.class == Class::Collective).unwrap();
        assert_eq!((c.start, c.end), (5.0, 8.0));
    }
    let early = timelines[0]
        .slices
        .iter()
        .find(|s| s.class == Class::Collective)
        .unwrap();
    assert_eq!(early.waited, 4.0, "rank 0 waits 1..5 for rank 1");

    let mut other = ready(5.0);
    other[4] = collective(43);
    let err = engine::run(vec![ready(1.0), other]).unwrap_err().to_string();
    assert!(err.contains("different collective"), "{err}");
    let err = engine::run(vec![ready(1.0), vec![Item::IterationStart]])
        .unwrap_err()
        .to_string();
    assert!(err.contains("wait on each other"), "{err}");
}

/// The plan and params of the cuda tests' model.
fn cuda_case(cfg: &Config, dp: usize) -> (muon_opt::plan::Plan, Vec<muon_opt::model::ParamSpec>) {
    let mut registry = Registry::default();
    for spec in cuda_model() {
        registry.add(spec, cfg).unwrap();
    }
    let plan = build_plan(registry.params(), registry.routes(), cfg, dp).unwrap();
    (plan, registry.params().to_vec())
}

#[test]
fn the_simulated_actions_are_the_dry_run_translation_of_the_same_schedule_run() {
    const DP: usize = 2;
    const ITERATIONS: usize = 2;
    for cfg in [
        Config {
            bucket_size: 4096,
            host_comm_mode: CommMode::Eager,
            ..Config::default()
        },
        Config {
            bucket_size: 4096,
            muon_layout: MuonLayout::Padded,
            mxfp8_param_gather: true,
            host_comm_mode: CommMode::Eager,
            ..Config::default()
        },
    ] {
        let (plan, params) = cuda_case(&cfg, DP);
        let muon = MuonOptions::from_config(&cfg);
        let dry: Vec<Arc<Mutex<DryRun>>> = (0..DP)
            .map(|r| Arc::new(Mutex::new(DryRun::new(r, DP, muon))))
            .collect();
        let comms = HostGroup::new(DP, Duration::from_secs(20));
        on_ranks(comms, |rank, comm| {
            let dry = dry[rank].clone();
            let comm = Communicator::new(Transport::Host(comm));
            let host = HostBackend::new(comm, cfg.host_comm_mode, muon).unwrap();
            let backend = Box::new(Recording::new(host, dry));
            let mut rt = Runtime::new(
                Box::new(plan.clone()),
                params.clone(),
                cfg.clone(),
                rank,
                backend,
                |_| None,
            )
            .unwrap();
            train(&mut rt, &plan, ITERATIONS, &[], &mut |_| {}).unwrap();
            rt.synchronize().unwrap();
        });
        let setup = Translator::new(0, DP, muon).setup().len();
        for (rank, dry) in dry.iter().enumerate() {
            let translated: Vec<Action> = dry
                .lock()
                .unwrap()
                .log
                .iter()
                .flat_map(|(_, t)| match t {
                    Ok(Translated::Actions(a)) => a.clone(),
                    _ => Vec::new(),
                })
                .collect();
            let trainer = Trainer::new(1024, ITERATIONS);
            let cost = CostModel::new(h100(), DP);
            let recorded = record_rank(
                &plan,
                &params,
                &cfg,
                rank,
                cost,
                trainer,
                RecordOptions {
                    keep_actions: true,
                    clips: &[],
                },
            )
            .unwrap();
            let simulated = recorded.actions.unwrap();
            assert!(translated.len() > 100, "rank {rank}: {} actions", translated.len());
            assert_eq!(simulated[setup..], translated[..], "rank {rank}, {:?}", cfg.muon_layout);
            let priced = recorded
                .items
                .iter()
                .filter(|i| matches!(i, Item::Collective { .. }))
                .count();
            let nccl = translated.iter().filter(|a| matches!(a, Action::Nccl(..))).count();
            assert_eq!(priced, nccl, "every NCCL group is one priced collective");
        }
    }
}

fn exposed(scenario: &Scenario) -> f64 {
    simulate(scenario).unwrap().figures.exposed_ms
}

#[test]
fn removing_gradient_overlap_raises_the_exposed_time() {
    let base = Scenario::new(preset("gpt2-124m").unwrap(), 4, h100());
    let overlapped = simulate(&base).unwrap();
    let serial = simulate(&Scenario {
        overlap_grad_reduce: false,
        ..base.clone()
    })
    .unwrap();
    assert!(
        serial.figures.exposed_ms > overlapped.figures.exposed_ms + 0.1,
        "no overlap {} ms vs overlap {} ms",
        serial.figures.exposed_ms,
        overlapped.figures.exposed_ms
    );
    assert!(overlapped.figures.grad_overlap > 0.5);
    assert_eq!(
        serial.figures.grad_overlap, 0.0,
        "every grad collective runs after the backward"
    );
    assert!(overlapped.figures.lower_bound_ms > 0.0 && overlapped.figures.ratio >= 1.0);
}

#[test]
fn the_figures_count_host_syncs_launches_and_device_bytes() {
    let sim = simulate(&Scenario::new(preset("gpt2-124m").unwrap(), 2, h100())).unwrap();
    let f = &sim.figures;
    assert_eq!(sim.schema_version, 1);
    assert!(f.launches > 0);
    assert_eq!(
        f.host_syncs, 0,
        "an iteration never waits for the device (the step info is not read)"
    );
    let d = sim.device_bytes;
    assert_eq!(
        d.total,
        d.params + d.grads + d.masters + d.momenta + d.muon_moment2 + d.adam_moments + d.mxfp8 + d.workspaces
    );
    // bf16 params and f32 grads of every element, at least.
    let numel: u64 = preset("gpt2-124m").unwrap().params.iter().map(|p| p.numel()).sum();
    assert!(d.params >= 2 * numel && d.grads >= 4 * numel);
    // More tokens: the same optimizer, more model compute to hide it behind.
    let longer = exposed(&Scenario {
        tokens_per_gpu: 65536,
        ..Scenario::new(preset("gpt2-124m").unwrap(), 2, h100())
    });
    assert!(longer <= f.exposed_ms + 1e-9, "{longer} vs {}", f.exposed_ms);
    let json = serde_json::to_value(&sim).unwrap();
    assert_eq!(json["schema_version"], 1);
    assert!(json["exposed_ms"].is_number() && json["device_bytes"]["total"].is_number());
}

#[test]
fn collectives_slow_the_compute_they_overlap_by_their_sm_share() {
    let with_share = |comm_sm_share: f64| {
        let hardware = Hardware {
            comm_sm_share,
            ..h100()
        };
        simulate(&Scenario::new(preset("gpt2-124m").unwrap(), 4, hardware)).unwrap()
    };
    let (free, contended) = (with_share(0.0), with_share(0.5));
    assert_eq!(free.figures.model_compute_ms, contended.figures.model_compute_ms);
    assert_eq!(free.figures.contention_ms, 0.0);
    assert!(contended.figures.contention_ms > 0.0);
    assert!(
        contended.figures.exposed_ms > free.figures.exposed_ms,
        "share 0.5: {} ms, share 0: {} ms",
        contended.figures.exposed_ms,
        free.figures.exposed_ms
    );
}

#[test]
fn the_lower_bound_never_exceeds_the_exposed_time_without_contention() {
    for (model, dp) in [("gpt2-124m", 2), ("gpt2-124m", 8), ("llama3-8b", 4)] {
        for layout in MuonLayout::ALL.iter().copied() {
            for overlap in [true, false] {
                let scenario = Scenario {
                    layout,
                    overlap_grad_reduce: overlap,
                    overlap_param_gather: overlap,
                    ..Scenario::new(preset(model).unwrap(), dp, builtin("h100-ib").unwrap())
                };
                let f = simulate(&scenario).unwrap().figures;
                assert!(f.lower_bound_ms > 0.0);
                assert!(
                    f.exposed_ms - f.contention_ms >= f.lower_bound_ms * (1.0 - 1e-9),
                    "{model} dp={dp} {layout:?} overlap {overlap}: exposed {} − contention {} < bound {}",
                    f.exposed_ms,
                    f.contention_ms,
                    f.lower_bound_ms
                );
            }
        }
    }
}

/// A norm group (tensor × pipeline × data parallel) replaces the data-parallel gather of the
/// ranks' Σ g² by one over the whole group: one tiny collective more on the critical path —
/// visible, and small against the step.
#[test]
fn a_norm_group_costs_one_tiny_collective() {
    let model = preset("llama3-8b").unwrap();
    let base = simulate(&Scenario::new(model.clone(), 8, h100())).unwrap();
    let grouped = simulate(&Scenario {
        norm_group: Some(64),
        ..Scenario::new(model, 8, h100())
    })
    .unwrap();
    let extra = grouped.figures.exposed_ms - base.figures.exposed_ms;
    assert!(extra > 0.0, "the gather over 64 ranks takes longer than over 8");
    assert!(extra < 1.0, "{extra} ms more per iteration");
    assert_eq!(grouped.figures.host_syncs, 0);
}

/// Tensor parallelism in the simulator (llama3-8b at TP 2, dp 2): each simulated rank holds TP
/// rank 0's shards; blockwise runs no TP collective, duplicated an all-gather per owned shard
/// component and step, distributed all-reduces (the norm and every X·Xᵀ) and no gather. The
/// TP collectives are the rank's own comm-stream work (its TP peers run the same schedule),
/// so the simulated data-parallel ranks never wait on each other for them; duplicated holds
/// the gathered matrices besides.
#[test]
fn tensor_parallel_modes_add_their_own_collectives() {
    use muon_opt::config::TpMode;
    let model = preset("llama3-8b").unwrap();
    let run = |mode: TpMode| {
        simulate(&Scenario {
            tp: Some((2, mode)),
            ..Scenario::new(model.clone(), 2, h100())
        })
        .unwrap()
    };
    let count = |sim: &muon_opt::sim::Simulation, what: &str| {
        sim.timelines[0]
            .slices
            .iter()
            .filter(|s| s.label.what == what && s.iteration == Some(1))
            .count()
    };
    let (blockwise, duplicated, distributed) = (
        run(TpMode::Blockwise),
        run(TpMode::Duplicated),
        run(TpMode::Distributed),
    );
    for sim in [&blockwise, &duplicated, &distributed] {
        assert_eq!(sim.figures.host_syncs, 0);
    }
    assert_eq!(
        count(&blockwise, "tensor-parallel all-gather") + count(&blockwise, "tensor-parallel all-reduce"),
        0
    );
    assert!(count(&duplicated, "tensor-parallel all-gather") > 0);
    assert_eq!(count(&duplicated, "tensor-parallel all-reduce"), 0);
    assert!(count(&distributed, "tensor-parallel all-reduce") > count(&duplicated, "tensor-parallel all-gather"));
    assert_eq!(count(&distributed, "tensor-parallel all-gather"), 0);
    assert!(duplicated.device_bytes.workspaces > distributed.device_bytes.workspaces);
    assert!(duplicated.figures.exposed_ms > blockwise.figures.exposed_ms);
}

/// (start, end) of every optimizer slice of `timeline`, in order.
fn optimizer_spans(timeline: &engine::Timeline) -> Vec<(f64, f64)> {
    timeline
        .slices
        .iter()
        .filter(|s| s.class == Class::Optimizer)
        .map(|s| (s.start, s.end))
        .collect()
}

/// The data-parallel owners' Newton–Schulz runs side by side under duplicated TP: a step
/// issues its TP gathers before any param collective, so none queues on the comm stream
/// behind a broadcast waiting for another owner (which made the owners' Newton–Schulz run one
/// after another: exposed time about dp times its bound).
#[test]
fn owners_orthogonalize_side_by_side_under_duplicated_tensor_parallelism() {
    use muon_opt::config::TpMode;
    let sim = simulate(&Scenario {
        tp: Some((8, TpMode::Duplicated)),
        ..Scenario::new(preset("llama3-8b").unwrap(), 8, h100())
    })
    .unwrap();
    let f = &sim.figures;
    assert!(
        f.exposed_ms < 2.0 * f.lower_bound_ms,
        "exposed {} ms against a lower bound of {} ms",
        f.exposed_ms,
        f.lower_bound_ms
    );
}

//! The simulator's model choices, one test each: contention reported as the iteration time it
//! adds and left out of the lower bound; the SM share of a collective by its transport;
//! multi-rail network rings; overlap counted against every compute-stream kernel; the
//! embedding's forward as a lookup; the AdamW baseline, bf16 gradients and the memory check;
//! the deepseek-v3-like job's pipeline stage and expert optimizer; the Gram iteration's kernels
//! counted as Newton–Schulz time.

use muon_opt::backend::cuda::action::{NcclCall, NcclType};
use muon_opt::backend::ops::StreamKind;
use muon_opt::config::Dtype;
use muon_opt::model::ParamFlags;
use muon_opt::plan::presets::preset;
use muon_opt::sim::cost::CostModel;
use muon_opt::sim::drive::{RecordOptions, lookups, record_shared};
use muon_opt::sim::engine::Item;
use muon_opt::sim::metrics::NEWTON_SCHULZ_WORK;
use muon_opt::sim::profile::{Hardware, builtin};
use muon_opt::sim::scenarios::{self, JOBS, job};
use muon_opt::sim::{
    Scenario, rank_optimizers, simulate, simulate_adamw_baseline, simulate_against_adamw, simulate_best_ownership,
};

fn h100(name: &str) -> Hardware {
    builtin(name).unwrap()
}

/// Share 0 against share s on one scenario: the reported contention is exactly the iteration
/// time the share adds, and the lower bound (which leaves contention out) does not move.
#[test]
fn contention_is_the_iteration_time_it_adds_and_not_part_of_the_bound() {
    for (model, dp, profile) in [("gpt2-124m", 4, "h100-nvlink"), ("llama3-8b", 2, "h100-ib")] {
        let run = |share: f64| {
            let hardware = Hardware {
                comm_sm_share: share,
                comm_sm_share_network: share,
                ..h100(profile)
            };
            simulate(&Scenario::new(preset(model).unwrap(), dp, hardware))
                .unwrap()
                .figures
        };
        let (free, contended) = (run(0.0), run(0.3));
        assert_eq!(free.contention_ms, 0.0);
        let added = contended.iteration_ms - free.iteration_ms;
        assert!(added > 0.0, "{model}: a share of 0.3 adds nothing");
        assert!(
            (contended.contention_ms - added).abs() < 1e-9,
            "{model}: contention {} ms vs iteration difference {added} ms",
            contended.contention_ms
        );
        assert!((contended.lower_bound_ms - free.lower_bound_ms).abs() < 1e-9);
        assert_eq!(contended.model_compute_ms, free.model_compute_ms);
    }
}

/// A ring inside one node takes NVLink's share of the SMs, a ring across nodes the network's.
#[test]
fn the_sm_share_of_a_collective_follows_its_transport() {
    let nvlink = h100("h100-nvlink");
    assert_eq!(CostModel::new(nvlink.clone(), 8).comm_sm_share(), nvlink.comm_sm_share);
    assert_eq!(
        CostModel::new(nvlink.clone(), 16).comm_sm_share(),
        nvlink.comm_sm_share_network
    );
    let ib = h100("h100-ib");
    assert_eq!(CostModel::new(ib.clone(), 2).comm_sm_share(), ib.comm_sm_share_network);
    assert!(ib.comm_sm_share_network < ib.comm_sm_share / 3.0);
}

/// Across nodes, a group holding every GPU of its nodes runs one ring per NIC: the bandwidth of
/// all the node's NICs, capped by NVLink's; one rank per node (TP fills the node) has one NIC.
#[test]
fn multi_rail_rings_use_every_nic_of_the_node() {
    let bytes: u64 = 1 << 30;
    let call = NcclCall::AllGather {
        send: 0,
        recv: 0,
        send_count: bytes / 2 / 16,
        dtype: NcclType::Bf16,
    };
    let time = |hw: Hardware| CostModel::new(hw, 16).nccl(&call);
    let nvlink = h100("h100-nvlink");
    let traffic = bytes as f64 * 15.0 / 16.0;
    let latency = |hw: &Hardware| {
        let nodes = 2.0;
        let hop = (nodes * hw.nccl_hop_latency_network_us + (16.0 - nodes) * hw.nccl_hop_latency_nvlink_us) / 16.0;
        (hw.nccl_base_latency_us + 15.0 * hop) * 1e-6
    };
    let rails = (nvlink.network_gbps * 1e9 * nvlink.network_efficiency * 8.0)
        .min(nvlink.nvlink_gbps * 1e9 * nvlink.nvlink_efficiency);
    let expected = latency(&nvlink) + traffic / rails;
    assert!(
        (time(nvlink.clone()) - expected).abs() < 1e-12,
        "{} vs {expected}",
        time(nvlink.clone())
    );
    let one_nic = Hardware {
        dp_ranks_per_node: 1,
        ..nvlink.clone()
    };
    let single = time(one_nic.clone());
    let hop = one_nic.nccl_hop_latency_network_us;
    let expected = (one_nic.nccl_base_latency_us + 15.0 * hop) * 1e-6 + traffic / (50e9 * 0.9);
    assert!((single - expected).abs() < 1e-12, "{single} vs {expected}");
    assert!(single > 6.0 * time(nvlink));
}

/// Param all-gathers that run under Newton–Schulz kernels are hidden: the overlap counts
/// every compute-stream kernel, not only the model's.
#[test]
fn param_overlap_counts_the_optimizer_kernels_as_cover() {
    let f = simulate(&Scenario::new(preset("llama3-8b").unwrap(), 8, h100("h100-nvlink")))
        .unwrap()
        .figures;
    assert!(f.param_overlap > 0.5, "param overlap {}", f.param_overlap);
}

/// The model compute charges `6·numel·tokens` to every param but the lookups: llama3's input
/// embedding (it has an output layer of its own) and GPT-2's position embedding (its word
/// embedding is tied to the output, so it stays a GEMM).
#[test]
fn an_embedding_forward_is_a_lookup_unless_it_is_the_tied_output() {
    for (model, lookup_names) in [
        ("llama3-8b", vec!["embedding.word_embeddings.weight"]),
        ("gpt2-124m", vec!["embedding.position_embeddings.weight"]),
    ] {
        let desc = preset(model).unwrap();
        let flags = lookups(&desc.params);
        let names: Vec<&str> = desc
            .params
            .iter()
            .zip(&flags)
            .filter(|(_, l)| **l)
            .map(|(p, _)| p.name.as_str())
            .collect();
        assert_eq!(names, lookup_names, "{model}");
        assert!(
            desc.params
                .iter()
                .zip(&flags)
                .all(|(p, l)| !l || p.flags.has(ParamFlags::EMBEDDING_OR_OUTPUT))
        );
        let hw = h100("h100-nvlink");
        let scenario = Scenario::new(desc.clone(), 2, hw.clone());
        let counted: u64 = desc
            .params
            .iter()
            .zip(&flags)
            .filter(|(_, l)| !**l)
            .map(|(p, _)| p.numel())
            .sum();
        let expected = CostModel::new(hw, 2).model_compute(counted, scenario.tokens_per_gpu, 1.0) * 1e3;
        let got = simulate(&scenario).unwrap().figures.model_compute_ms;
        assert!((got - expected).abs() < 1e-6 * expected, "{model}: {got} vs {expected}");
    }
}

/// The AdamW baseline runs the same scenario with every param on distributed AdamW: no
/// Newton–Schulz at all, and the overhead figures follow from the two iterations.
#[test]
fn the_adamw_baseline_has_no_newton_schulz_and_the_overhead_follows_from_both_runs() {
    let scenario = Scenario::new(preset("gpt2-124m").unwrap(), 4, h100("h100-nvlink"));
    let muon = simulate_against_adamw(&scenario).unwrap();
    let adamw = simulate(&Scenario {
        adamw_only: true,
        ..scenario.clone()
    })
    .unwrap();
    assert_eq!(adamw.figures.newton_schulz_ms, 0.0);
    assert!(adamw.adamw_only && !muon.adamw_only);
    let b = muon.adamw_baseline.as_ref().unwrap();
    assert_eq!(b.adamw_iteration_ms, adamw.figures.iteration_ms);
    assert!((b.difference_ms - (muon.figures.iteration_ms - adamw.figures.iteration_ms)).abs() < 1e-9);
    assert!((b.muon_overhead - (muon.figures.iteration_ms / adamw.figures.iteration_ms - 1.0)).abs() < 1e-12);
    assert_eq!(b.newton_schulz_ms, muon.figures.newton_schulz_ms);
    assert!(muon.figures.newton_schulz_ms > 0.0);
}

/// bf16 gradients halve the grad buffers and the gradient collectives' bytes.
#[test]
fn bf16_gradients_halve_the_gradient_bytes() {
    let run = |grad_dtype| {
        simulate(&Scenario {
            grad_dtype,
            ..Scenario::new(preset("gpt2-124m").unwrap(), 4, h100("h100-ib"))
        })
        .unwrap()
    };
    let (f32, bf16) = (run(Dtype::F32), run(Dtype::Bf16));
    assert_eq!(f32.grad_dtype, "f32");
    assert_eq!(bf16.device_bytes.grads * 2, f32.device_bytes.grads);
    assert!(bf16.figures.unhidden_comm_ms <= f32.figures.unhidden_comm_ms);
}

/// The library's bytes per rank are checked against the GPU's memory.
#[test]
fn a_job_that_needs_more_than_the_gpu_does_not_fit() {
    let small = simulate(&Scenario::new(preset("llama3-8b").unwrap(), 8, h100("h100-nvlink"))).unwrap();
    assert!(small.fits && small.memory_gb == 80.0);
    let big = simulate(&Scenario::new(preset("llama3-70b").unwrap(), 8, h100("h100-ib"))).unwrap();
    assert!(!big.fits, "{} GB per rank", big.device_bytes.total as f64 / 1e9);
    for job in JOBS {
        let sim = simulate(&job.scenario(false).unwrap()).unwrap();
        assert!(sim.fits, "{}: {} GB", job.name, sim.device_bytes.total as f64 / 1e9);
    }
}

/// The deepseek-v3-like job as DeepSeek-V3 trains it: a middle pipeline stage (MoE layers
/// 30–33), its expert stacks holding E/ep = 4 of 256 experts on a second optimizer whose
/// expert data-parallel group is the rank alone, so its only collectives are the norm gathers
/// over the norm group (its bucket collectives meet no rank and take no time); the dense
/// params on the 64-rank data-parallel group; the two step together; each expert stack
/// computes the tokens routed to it; the state fits 80 GB.
#[test]
fn the_deepseek_job_runs_its_experts_on_a_second_optimizer_of_one_rank() {
    let job = scenarios::job("deepseek-v3-like pp16 ep64 dp64 nvlink").unwrap();
    let scenario = job.scenario(false).unwrap();
    let setup = rank_optimizers(&scenario).unwrap();
    let [dense, experts] = &setup.optimizers[..] else {
        panic!("{} optimizers", setup.optimizers.len())
    };
    assert_eq!((dense.plan.dp, experts.plan.dp), (64, 1));
    assert_eq!(experts.params.len(), 8, "fc1 and fc2 of 4 MoE layers");
    assert!(experts.params.iter().all(|p| p.is_expert_stack() && p.shape[0] == 4));
    assert!(dense.params.iter().all(|p| !p.is_expert_stack()));
    let layers: Vec<&str> = dense
        .params
        .iter()
        .map(|p| p.name.strip_prefix("layers.").unwrap().split('.').next().unwrap())
        .collect();
    assert_eq!((layers[0], *layers.last().unwrap()), ("30", "33"));
    assert_eq!(setup.order.len(), dense.params.len() + experts.params.len());

    let trainer = scenario.trainer().unwrap();
    let members: Vec<_> = setup.optimizers.iter().map(|o| o.member(5, 64)).collect();
    let recorded = record_shared(&members, &setup.order, trainer, RecordOptions::default()).unwrap();
    let mut optimizer = 0;
    let (mut collectives, mut local) = ([Vec::new(), Vec::new()], 0);
    for item in &recorded.items {
        match item {
            Item::Optimizer(k) => optimizer = *k,
            Item::Collective { label, .. } => collectives[optimizer].push(label.what),
            Item::Work {
                stream: StreamKind::Comm,
                device,
                label,
                ..
            } if optimizer == 1
                && matches!(
                    label.what,
                    "reduce" | "broadcast" | "reduce-scatter" | "all-gather" | "all-reduce"
                ) =>
            {
                assert_eq!(*device, 0.0);
                local += 1;
            }
            _ => {}
        }
    }
    assert!(
        collectives[1]
            .iter()
            .all(|&w| w == "norm all-gather" || w == "scalar exchange"),
        "{:?}",
        collectives[1]
    );
    let gathers = collectives[1].iter().filter(|&&w| w == "norm all-gather").count();
    assert_eq!(gathers, scenario.iterations);
    assert!(local > 0, "the expert buckets' one-rank collectives");
    assert!(collectives[0].contains(&"reduce-scatter") || collectives[0].contains(&"reduce"));

    let sim = simulate(&scenario).unwrap();
    assert!(sim.fits, "{} GB", sim.device_bytes.total as f64 / 1e9);
    let flops_params: u64 = dense.params.iter().map(|p| p.numel()).sum::<u64>()
        + experts.params.iter().map(|p| p.numel() / p.shape[0] * 8).sum::<u64>();
    let hw = h100("h100-nvlink");
    let expected = 6.0 * flops_params as f64 * 8192.0 / (hw.bf16_tflops * 1e12 * hw.model_efficiency) * 1e3;
    assert!(
        (sim.figures.model_compute_ms - expected).abs() < 1e-6 * expected,
        "{} vs {expected} ms",
        sim.figures.model_compute_ms
    );
}

/// `ns_method = gram` (`simulate --ns-method gram`): the run names its method, its
/// Newton–Schulz figure is the sum of the iteration's Newton–Schulz work on the busiest rank —
/// its GEMMs and kernels, the `muon_ns_add_identity` of `Q = Z + a·I` and the tile lists of
/// the symmetric products included — and it is
/// below the standard iteration's on gpt2-124m's wide MLP matrices (SM contention off, so the
/// timelines are the ones the figure is read from).
#[test]
fn the_gram_iteration_counts_its_kernels_as_newton_schulz_time() {
    use muon_opt::config::NsMethod;
    let hardware = Hardware {
        comm_sm_share: 0.0,
        comm_sm_share_network: 0.0,
        ..h100("h100-nvlink")
    };
    let standard = Scenario::new(preset("gpt2-124m").unwrap(), 2, hardware);
    let gram = simulate(&Scenario {
        ns_method: NsMethod::Gram,
        ..standard.clone()
    })
    .unwrap();
    let standard = simulate(&standard).unwrap();
    assert_eq!(
        (standard.ns_method.as_str(), gram.ns_method.as_str()),
        ("standard", "gram")
    );
    assert_eq!(serde_json::to_value(&gram).unwrap()["ns_method"], "gram");
    let last = gram.iterations - 1;
    let busiest = |labels: &[&str]| {
        gram.timelines
            .iter()
            .map(|t| {
                t.slices
                    .iter()
                    .filter(|s| s.iteration == Some(last) && labels.contains(&s.label.what))
                    .map(|s| s.end - s.start)
                    .sum::<f64>()
            })
            .fold(0.0, f64::max)
            * 1e3
    };
    assert!((busiest(&NEWTON_SCHULZ_WORK) - gram.figures.newton_schulz_ms).abs() < 1e-9);
    assert!(busiest(&["ns add identity"]) > 0.0);
    assert!(busiest(&["ns tile tables"]) > 0.0);
    assert!(
        gram.figures.newton_schulz_ms < standard.figures.newton_schulz_ms,
        "gram {} ms, standard {} ms",
        gram.figures.newton_schulz_ms,
        standard.figures.newton_schulz_ms
    );
}

/// A shared step (`muon_optimizers_step`) begins every optimizer's step before the compute
/// stream waits for any gathered norm: the expert optimizer's sum of squares runs while the
/// dense optimizer's norm all-gather is on the wire, not after it (deepseek-v3-like job, one
/// rank's program, last iteration).
#[test]
fn a_shared_step_overlaps_the_second_sum_of_squares_with_the_first_norm_gather() {
    let scenario = scenarios::job("deepseek-v3-like pp16 ep64 dp64 nvlink")
        .unwrap()
        .scenario(false)
        .unwrap();
    let setup = rank_optimizers(&scenario).unwrap();
    let trainer = scenario.trainer().unwrap();
    let members: Vec<_> = setup.optimizers.iter().map(|o| o.member(0, 64)).collect();
    let recorded = record_shared(&members, &setup.order, trainer, RecordOptions::default()).unwrap();
    let timeline = &muon_opt::sim::engine::run(vec![recorded.items]).unwrap()[0];
    let last = scenario.iterations - 1;
    let spans = |what: &str| -> Vec<(f64, f64)> {
        timeline
            .slices
            .iter()
            .filter(|s| s.iteration == Some(last) && s.label.what == what && s.end > s.start)
            .map(|s| (s.start, s.end))
            .collect()
    };
    let gathers = spans("norm all-gather");
    let sums = spans("gradient norm");
    assert_eq!(gathers.len(), 2, "one norm gather per optimizer: {gathers:?}");
    let expert_sums_start = sums
        .iter()
        .map(|s| s.0)
        .filter(|&start| start > gathers[0].0)
        .fold(f64::INFINITY, f64::min);
    assert!(
        expert_sums_start < gathers[0].1,
        "the second sum of squares starts at {expert_sums_start}, after the first gather ended at {}",
        gathers[0].1
    );
}

/// Issue 38: on every named job, MXFP8 off and on, the plan the library makes by default —
/// compact, `muon_ownership = auto`, the profile's figures declared as its network — is within
/// 1 % of the fastest run of `simulate --layout all --ownership auto` (every layout, each under
/// the faster ownership), same constants; on llama3-70b TP8 dp 64 InfiniBand it takes
/// contiguous ownership, within 1 % of the better ownership. Declaring nothing there is not
/// enough: the plan that moves the fewest bytes groups matrices whose groups complete late, and
/// is more than 1 % slower on llama3-70b TP8 dp 8 InfiniBand.
#[test]
fn the_library_default_plan_is_within_one_percent_of_the_fastest_on_every_named_job() {
    use muon_opt::config::{MuonLayout, MuonOwnership};
    use muon_opt::sim::PlanNetwork;
    for job in JOBS {
        for &mxfp8 in job.mxfp8_modes() {
            let scenario = job.scenario(mxfp8).unwrap();
            assert_eq!(
                (scenario.layout, scenario.ownership, scenario.plan_network),
                (MuonLayout::Compact, MuonOwnership::Auto, PlanNetwork::Profile)
            );
            let library = simulate(&scenario).unwrap();
            let fastest = MuonLayout::ALL
                .iter()
                .map(|&layout| {
                    let run = simulate_best_ownership(
                        &Scenario {
                            layout,
                            ..scenario.clone()
                        },
                        None,
                    )
                    .unwrap();
                    (run.figures.iteration_ms, format!("{} {}", run.layout, run.ownership))
                })
                .fold((f64::INFINITY, String::new()), |a, b| if b.0 < a.0 { b } else { a });
            assert!(
                library.figures.iteration_ms <= 1.01 * fastest.0,
                "{} mxfp8 {mxfp8}: the library's plan {} ms, {} {} ms",
                job.name,
                library.figures.iteration_ms,
                fastest.1,
                fastest.0
            );
            if job.name == "llama3-70b tp8 dp64 ib" {
                let setup = rank_optimizers(&scenario).unwrap();
                assert_eq!(setup.optimizers[0].plan.report.ownership.name(), "contiguous");
            }
            if job.name == "llama3-70b tp8 dp8 ib" && !mxfp8 {
                let undeclared = simulate(&Scenario {
                    plan_network: PlanNetwork::Undeclared,
                    ..scenario.clone()
                })
                .unwrap();
                assert!(
                    undeclared.figures.iteration_ms > 1.01 * library.figures.iteration_ms,
                    "undeclared {} ms, declared {} ms",
                    undeclared.figures.iteration_ms,
                    library.figures.iteration_ms
                );
            }
        }
    }
}

/// Issue 31's overhead criterion on every named job, MXFP8 off and on, same constants, under
/// the ownership the simulator picks for the cluster: Muon's iteration exceeds distributed
/// AdamW's by at most 1.15 × the busiest rank's Newton–Schulz. Both ownerships are picked
/// somewhere: on llama3-70b TP8 dp 64 InfiniBand balanced ownership's 191 (bucket, owner)
/// collectives, each paying 63 ring hops, exceed the criterion (≈ 6 × NS), contiguous
/// ownership's 80 meet it, and so does the library's default there (auto); at dp 8 balanced is
/// faster.
#[test]
fn muon_costs_at_most_its_newton_schulz_on_every_named_job() {
    let mut picked = std::collections::BTreeSet::new();
    for job in JOBS {
        for &mxfp8 in job.mxfp8_modes() {
            let scenario = job.scenario(mxfp8).unwrap();
            let adamw = simulate_adamw_baseline(&scenario).unwrap();
            let sim = simulate_best_ownership(&scenario, Some(&adamw)).unwrap();
            let overhead = sim.adamw_baseline.as_ref().unwrap();
            assert!(
                overhead.difference_ms <= 1.15 * overhead.newton_schulz_ms,
                "{} mxfp8 {mxfp8} ({}): Muon − AdamW {} ms, NS {} ms",
                job.name,
                sim.ownership,
                overhead.difference_ms,
                overhead.newton_schulz_ms
            );
            picked.insert((job.name, sim.ownership.clone()));
        }
    }
    assert!(
        picked.contains(&("llama3-70b tp8 dp64 ib", "contiguous".to_string())),
        "{picked:?}"
    );
    assert!(
        picked.contains(&("llama3-70b tp8 dp8 ib", "balanced".to_string())),
        "{picked:?}"
    );
    let dp64 = job("llama3-70b tp8 dp64 ib").unwrap().scenario(false).unwrap();
    let balanced = simulate_against_adamw(&Scenario {
        ownership: muon_opt::config::MuonOwnership::Balanced,
        ..dp64.clone()
    })
    .unwrap();
    let b = balanced.adamw_baseline.unwrap();
    assert!(
        b.difference_ms > 1.15 * b.newton_schulz_ms,
        "balanced ownership alone meets it: {b:?}"
    );
    let library = simulate_against_adamw(&dp64).unwrap().adamw_baseline.unwrap();
    assert!(
        library.difference_ms <= 1.15 * library.newton_schulz_ms,
        "the library's default (auto) misses it: {library:?}"
    );
}

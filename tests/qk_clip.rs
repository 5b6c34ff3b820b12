//! QK-clip (Kimi K2's MuonClip; `muon_optimizer_qk_clip`): the host formula against a plain
//! reference for every head layout (MHA, GQA, separate Q and K, MLA) and α = 0, ½, 1; heads at
//! or under τ keep their bits; the clip applied by the step reaches the master, the bf16 copy
//! and the MXFP8 copy and leaves the momentum; dp = 1 and dp = 3 give the same bits; bad
//! requests change nothing.

mod support;

use muon_opt::backend::host::comm::HostGroup;
use muon_opt::backend::host::executor::HostBackend;
use muon_opt::backend::ops::{Mem, QkMaxima, Span};
use muon_opt::comm::{Communicator, Transport};
use muon_opt::config::{CommMode, Config, Dtype};
use muon_opt::error::ErrorKind;
use muon_opt::model::{ParamFlags, ParamSpec};
use muon_opt::numerics::muon::MuonOptions;
use muon_opt::numerics::qk_clip::{QkHeads, QkKind, pow_unit, qk_clip};
use muon_opt::schedule::{QkClipRequest, Runtime};
use support::cuda::runtime;
use support::qk_clip::{cases, maxima_sets, reference, rows, values};
use support::ranks::{TIMEOUT, on_ranks};
use support::training::{ARGS, bits, rank_grad};

/// Within one f32 ulp (the reference's `powf` against the specification's `pow_unit`).
fn close(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.to_bits() as i64 - b.to_bits() as i64).abs() <= 1
}

#[test]
fn host_formula_matches_a_plain_reference_for_every_layout_and_alpha() {
    let tau = 8.0;
    for (k, case) in cases().iter().enumerate() {
        let map = case.heads.row_map(rows(&case.heads) as u64).unwrap();
        let w = values(k, map.rows() * case.cols);
        for alpha in [0.0f32, 0.5, 1.0, 0.3] {
            for (set, maxima) in maxima_sets(map.heads()).into_iter().take(3).enumerate() {
                let mut clipped = w.clone();
                qk_clip(&mut clipped, case.cols, &map, &maxima, tau, alpha);
                let expected = reference(&w, &case.heads, case.cols, &maxima, tau, alpha);
                for (i, (a, b)) in clipped.iter().zip(&expected).enumerate() {
                    assert!(
                        close(*a, *b),
                        "{} α {alpha} maxima set {set}: element {i} is {a}, the reference {b}",
                        case.label
                    );
                }
                match set {
                    // τ above every head: nothing changes, bit for bit.
                    2 => assert!(bits(&clipped) == bits(&w), "{}: a head under τ changed", case.label),
                    // τ below every head: every query and key row changes (α strictly inside).
                    1 if alpha == 0.3 => {
                        let changed = clipped.iter().zip(&w).filter(|(a, b)| a != b).count();
                        assert!(changed > 0, "{}: nothing clipped", case.label);
                    }
                    _ => {}
                }
            }
        }
    }
}

/// The logit of the clipped group comes back to τ: q·k scales by η^α · η^(1−α) = η.
#[test]
fn the_clipped_logit_equals_the_threshold() {
    let heads = QkHeads {
        kind: QkKind::FusedQkv,
        heads: 1,
        query_groups: 1,
        head_dim: 4,
        rope_dim: 0,
        v_head_dim: 0,
    };
    let map = heads.row_map(12).unwrap();
    let cols = 5;
    let w = values(7, 12 * cols);
    let x: Vec<f32> = values(8, cols);
    let logit = |w: &[f32]| {
        let proj = |r: usize| {
            (0..cols)
                .map(|c| f64::from(w[r * cols + c]) * f64::from(x[c]))
                .sum::<f64>()
        };
        (0..4).map(|d| proj(d) * proj(4 + d)).sum::<f64>()
    };
    let s = logit(&w).abs() as f32;
    let tau = s / 3.0;
    for alpha in [0.0, 0.5, 0.25, 1.0] {
        let mut clipped = w.clone();
        qk_clip(&mut clipped, cols, &map, &[s], tau, alpha);
        let after = logit(&clipped).abs();
        assert!(
            ((after - f64::from(tau)) / f64::from(tau)).abs() < 1e-5,
            "α {alpha}: logit {after}, τ {tau}"
        );
    }
}

#[test]
fn non_finite_maxima_leave_their_group_and_pow_unit_is_accurate() {
    let case = &cases()[0];
    let map = case.heads.row_map(rows(&case.heads) as u64).unwrap();
    let w = values(0, map.rows() * case.cols);
    let mut clipped = w.clone();
    qk_clip(
        &mut clipped,
        case.cols,
        &map,
        &[f32::NAN, 50.0, f32::INFINITY, 4.0],
        8.0,
        0.5,
    );
    let group = map.group_rows() * case.cols;
    assert!(
        bits(&clipped[..group]) == bits(&w[..group]),
        "a NaN maximum clipped its group"
    );
    assert!(clipped[group..2 * group] != w[group..2 * group], "50 > τ did not clip");
    assert!(
        bits(&clipped[2 * group..]) == bits(&w[2 * group..]),
        "inf or under-τ clipped"
    );
    for i in 1..2000u32 {
        let x = f64::from(i) / 2000.0 * 0.999_999 + 1e-9 * f64::from(i % 7);
        for e in [0.1, 0.5, 0.7, 0.999] {
            let (got, want) = (pow_unit(x, e), x.powf(e));
            assert!(((got - want) / want).abs() < 1e-14, "{x}^{e}: {got} vs {want}");
        }
    }
    let tiny = f64::from(f32::from_bits(1));
    assert!(
        (pow_unit(tiny, 0.5) / tiny.sqrt() - 1.0).abs() < 1e-14,
        "the smallest η"
    );
    assert_eq!(pow_unit(0.0, 0.5), 0.0);
}

/// The test model: an AdamW embedding, a GQA fused QKV (4 heads in 2 groups of head dim 8),
/// MLA's query (2 heads, 8 + 4 rotary rows) and key/value (2 heads, 8 + 8 value rows), an MLP
/// matrix and a norm; the QKV stored as MXFP8 when `mxfp8`.
fn attention_model(mxfp8: bool) -> Vec<ParamSpec> {
    let mut emb = ParamSpec::new("embedding.weight", &[40, 32], Dtype::Bf16);
    emb.flags = ParamFlags(ParamFlags::EMBEDDING_OR_OUTPUT);
    let mut qkv = ParamSpec::new("attn.qkv.weight", &[64, 32], Dtype::Bf16);
    qkv.split_sizes = vec![16, 8, 8];
    qkv.split_groups = 2;
    if mxfp8 {
        qkv.flags = ParamFlags(ParamFlags::MXFP8);
    }
    vec![
        emb,
        qkv,
        ParamSpec::new("mla.q.weight", &[24, 32], Dtype::Bf16),
        ParamSpec::new("mla.kv_up.weight", &[32, 16], Dtype::Bf16),
        ParamSpec::new("mlp.fc.weight", &[48, 32], Dtype::Bf16),
        ParamSpec::new("norm.weight", &[32], Dtype::Bf16),
    ]
}

fn heads(kind: QkKind, heads: u32, query_groups: u32, head_dim: u32, extra: u32) -> QkHeads {
    QkHeads {
        kind,
        heads,
        query_groups,
        head_dim,
        rope_dim: if kind == QkKind::MlaQuery { extra } else { 0 },
        v_head_dim: if kind == QkKind::MlaKeyValue { extra } else { 0 },
    }
}

/// The clips of step `step`: maxima around τ = 10 that change with the step.
fn requests(step: u64) -> Vec<QkClipRequest> {
    let m = |vals: &[f32]| QkMaxima::Host(vals.iter().map(|v| v * (1.0 + step as f32 * 0.1)).collect());
    vec![
        QkClipRequest {
            param: 1,
            heads: heads(QkKind::FusedQkv, 4, 2, 8, 0),
            maxima: m(&[40.0, 3.0, 9.0, 9.5]),
        },
        QkClipRequest {
            param: 2,
            heads: heads(QkKind::MlaQuery, 2, 0, 8, 4),
            maxima: m(&[2.0, 25.0]),
        },
        QkClipRequest {
            param: 3,
            heads: heads(QkKind::MlaKeyValue, 2, 0, 8, 8),
            maxima: m(&[25.0, 12.0]),
        },
    ]
}

/// One iteration of rank `rank`: gradients from the params it sees (at dp = 1 the sum of
/// `emulated_dp` ranks' gradients in rank order times 1/emulated_dp, as the collectives and
/// the update's scale compute them), the clips, the step.
fn iterate(rt: &mut Runtime, rank: usize, step: u64, emulated_dp: usize, clip: Option<(f32, f32)>) {
    iterate_with(
        rt,
        rank,
        step,
        emulated_dp,
        clip.map(|(tau, alpha)| (requests(step), tau, alpha)),
    );
}

/// [`iterate`] with the clip requests given.
fn iterate_with(
    rt: &mut Runtime,
    rank: usize,
    step: u64,
    emulated_dp: usize,
    clip: Option<(Vec<QkClipRequest>, f32, f32)>,
) {
    rt.zero_grad().unwrap();
    let sharded = rt.config().sharded();
    let order = muon_opt::plan::forward_order(&rt.plan().buckets);
    for &b in &order {
        rt.wait_params(b as u32).unwrap();
        if sharded {
            rt.release_params(b as u32).unwrap();
        }
    }
    // The backward bucket by bucket (gathered again and released with sharded params).
    for &b in order.iter().rev() {
        rt.wait_params(b as u32).unwrap();
        for p in rt.plan().buckets[b].params.clone() {
            backward_param(rt, rank, step, emulated_dp, p as usize);
        }
        if sharded {
            rt.release_params(b as u32).unwrap();
        }
    }
    if let Some((requests, tau, alpha)) = clip {
        rt.request_qk_clip(&requests, tau, alpha).unwrap();
    }
    rt.step(Some(&ARGS)).unwrap();
    for &b in order.iter().take(usize::from(!sharded) * order.len()) {
        rt.wait_params(b as u32).unwrap();
    }
}

/// Param `p`'s gradient (of `emulated_dp` ranks at dp 1) written and announced.
fn backward_param(rt: &mut Runtime, rank: usize, step: u64, emulated_dp: usize, p: usize) {
    let seen = rt.param_values(p).unwrap();
    let grad = if rt.plan().dp == 1 && emulated_dp > 1 {
        let mut sum = vec![0.0f32; seen.len()];
        for r in 0..emulated_dp {
            for (s, g) in sum.iter_mut().zip(rank_grad(step, r, p, &seen)) {
                *s += g;
            }
        }
        sum.iter().map(|s| s * (1.0 / emulated_dp as f32)).collect()
    } else {
        rank_grad(step, rank, p, &seen)
    };
    let span = rt.grad_storage(p).unwrap();
    rt.backend_mut().upload(span, &grad).unwrap();
    rt.grad_ready(p as u32).unwrap();
}

/// Every param's values as this rank sees them (each bucket gathered for the reading with
/// sharded params).
fn param_bits(rt: &mut Runtime) -> Vec<Vec<u32>> {
    let sharded = rt.config().sharded();
    let mut values = vec![Vec::new(); rt.plan().params.len()];
    for b in muon_opt::plan::forward_order(&rt.plan().buckets) {
        rt.wait_params(b as u32).unwrap();
        for p in rt.plan().buckets[b].params.clone() {
            values[p as usize] = bits(&rt.param_values(p as usize).unwrap());
        }
        if sharded {
            rt.release_params(b as u32).unwrap();
        }
    }
    values
}

fn host_runtimes(cfg: &Config, specs: &[ParamSpec], dp: usize) -> Vec<Runtime> {
    HostGroup::new(dp, TIMEOUT)
        .into_iter()
        .enumerate()
        .map(|(rank, comm)| {
            let backend = HostBackend::new(
                Communicator::new(Transport::Host(comm)),
                CommMode::Eager,
                MuonOptions::from_config(cfg),
            )
            .unwrap();
            runtime(cfg, specs, rank, dp, Box::new(backend))
        })
        .collect()
}

/// Every param's values on every rank after `steps` clipped steps at `dp` (data of 3 ranks).
fn run(cfg: &Config, specs: &[ParamSpec], dp: usize, steps: u64) -> Vec<Vec<Vec<u32>>> {
    on_ranks(host_runtimes(cfg, specs, dp), |rank, mut rt| {
        for step in 0..steps {
            iterate(&mut rt, rank, step, 3, Some((10.0, 0.5)));
        }
        param_bits(&mut rt)
    })
}

/// With sharded params (every copy of a clipped matrix comes from the next gather of the
/// owner's clipped master) three clipped steps give every rank the bits of replicated params,
/// at dp 3, with the QKV stored as bf16 and as MXFP8.
#[test]
fn sharded_params_clip_bitwise_like_replicated() {
    for mxfp8 in [false, true] {
        let cfg = Config {
            bucket_size: 2048,
            host_comm_mode: CommMode::Eager,
            muon_ns_precision: muon_opt::config::NsPrecision::F32,
            ..Config::default()
        };
        let sharded = Config {
            param_sharding: muon_opt::config::ParamSharding::Sharded,
            ..cfg.clone()
        };
        let specs = attention_model(mxfp8);
        assert!(
            run(&sharded, &specs, 3, 3) == run(&cfg, &specs, 3, 3),
            "MXFP8 {mxfp8}: sharded differs from replicated"
        );
    }
}

/// dp = 1 and dp = 3 (owners spread over the ranks) give every rank the same bits after three
/// clipped steps, with the QKV stored as bf16 and as MXFP8 (gathered as bf16 and quantized on
/// every rank, or quantized locally).
#[test]
fn dp1_and_dp3_clip_bitwise_alike_with_and_without_mxfp8() {
    for (mxfp8, gather) in [(false, false), (true, true), (true, false)] {
        // Gradient clipping off: its f64 sums run in another order at another dp.
        let cfg = Config {
            bucket_size: 2048,
            mxfp8_param_gather: gather,
            host_comm_mode: CommMode::Eager,
            clip_grad: 0.0,
            muon_ns_precision: muon_opt::config::NsPrecision::F32,
            ..Config::default()
        };
        let specs = attention_model(mxfp8);
        let one = run(&cfg, &specs, 1, 3);
        let three = run(&cfg, &specs, 3, 3);
        for (rank, values) in three.iter().enumerate() {
            for (p, spec) in specs.iter().enumerate() {
                assert!(
                    values[p] == one[0][p],
                    "MXFP8 {mxfp8} gather {gather}: {} differs on rank {rank} of 3 from dp 1",
                    spec.name
                );
            }
        }
        let unclipped = on_ranks(host_runtimes(&cfg, &specs, 1), |rank, mut rt| {
            for step in 0..3 {
                iterate(&mut rt, rank, step, 3, None);
            }
            bits(&rt.param_values(1).unwrap())
        });
        assert!(unclipped[0] != one[0][1], "MXFP8 {mxfp8}: the clip changed nothing");
    }
}

/// Only the owner of a param reads its clip request (the header says every rank must pass
/// the same list): at dp 3, ranks that pass 100× the maxima for params they do not own leave
/// every rank's bits as when all agree; the owner's own request decides.
#[test]
fn only_the_owner_reads_a_clip_request() {
    let cfg = Config {
        bucket_size: 2048,
        host_comm_mode: CommMode::Eager,
        clip_grad: 0.0,
        muon_ns_precision: muon_opt::config::NsPrecision::F32,
        ..Config::default()
    };
    let specs = attention_model(false);
    let distorted = |rt: &Runtime, rank: usize, step: u64, owners_too: bool| {
        let mut list = requests(step);
        for request in &mut list {
            let owner = rt.plan().params[request.param as usize].single_owner().unwrap() as usize;
            if let (true, QkMaxima::Host(maxima)) = (owners_too || owner != rank, &mut request.maxima) {
                maxima.iter_mut().for_each(|m| *m *= 100.0);
            }
        }
        list
    };
    let run_with = |distort: Option<bool>| {
        on_ranks(host_runtimes(&cfg, &specs, 3), |rank, mut rt| {
            for step in 0..2 {
                let list = match distort {
                    Some(owners_too) => distorted(&rt, rank, step, owners_too),
                    None => requests(step),
                };
                iterate_with(&mut rt, rank, step, 3, Some((list, 10.0, 0.5)));
            }
            (0..specs.len())
                .map(|p| bits(&rt.param_values(p).unwrap()))
                .collect::<Vec<_>>()
        })
    };
    let agreed = run_with(None);
    assert_eq!(
        run_with(Some(false)),
        agreed,
        "a non-owner's request changed the result"
    );
    assert_ne!(run_with(Some(true)), agreed, "the owners' requests changed nothing");
}

/// One step with and without the clip from the same state: the clipped run's masters are the
/// specification applied to the unclipped run's (on the owner, after the update), the momentum
/// is the same bits, and with η = ¼ and α = ½ (a factor of exactly ½) every copy of the
/// clipped head group — bf16 param, MXFP8 dequantized — is exactly half, every other value
/// the same bits.
#[test]
fn the_step_clips_the_master_and_every_copy_and_leaves_the_momentum() {
    for mxfp8 in [false, true] {
        let cfg = Config {
            bucket_size: 2048,
            host_comm_mode: CommMode::Eager,
            ..Config::default()
        };
        let specs = attention_model(mxfp8);
        let quarter = QkMaxima::Host(vec![40.0, 3.0, 9.0, 9.5]);
        let mut runs = host_runtimes(&cfg, &specs, 1)
            .into_iter()
            .chain(host_runtimes(&cfg, &specs, 1));
        let (mut plain, mut clipped) = (runs.next().unwrap(), runs.next().unwrap());
        iterate(&mut plain, 0, 0, 1, None);
        clipped.zero_grad().unwrap();
        for p in (0..specs.len()).rev() {
            let grad = rank_grad(0, 0, p, &clipped.param_values(p).unwrap());
            let placement = &clipped.plan().params[p];
            let span = Span::new(Mem::Grad(placement.buffer), placement.offset, placement.numel);
            clipped.backend_mut().upload(span, &grad).unwrap();
            clipped.grad_ready(p as u32).unwrap();
        }
        let request = QkClipRequest {
            param: 1,
            heads: heads(QkKind::FusedQkv, 4, 2, 8, 0),
            maxima: quarter.clone(),
        };
        clipped.request_qk_clip(&[request], 10.0, 0.5).unwrap();
        assert_eq!(clipped.pending_qk_clips(), 1);
        clipped.step(Some(&ARGS)).unwrap();
        assert_eq!(clipped.pending_qk_clips(), 0, "the step consumes its clips");
        let (a, b) = (plain.owned_state().unwrap(), clipped.owned_state().unwrap());
        for (x, y) in a.iter().zip(&b) {
            assert!(
                bits(&x.moments[0]) == bits(&y.moments[0]),
                "momentum of param {}",
                x.param
            );
            let mut expected = x.master.clone();
            if x.param == 1 {
                let map = heads(QkKind::FusedQkv, 4, 2, 8, 0).row_map(64).unwrap();
                let QkMaxima::Host(m) = &quarter else { unreachable!() };
                qk_clip(&mut expected, 32, &map, m, 10.0, 0.5);
            }
            assert!(bits(&expected) == bits(&y.master), "master of param {}", x.param);
        }
        let (u, v) = (plain.param_values(1).unwrap(), clipped.param_values(1).unwrap());
        // Group 0 (η = 10/40 = ¼): its 16 query and 8 key rows × ½; its value rows and group 1
        // (max 9.5 < τ) unchanged.
        for (i, (x, y)) in u.iter().zip(&v).enumerate() {
            let want = if i < 24 * 32 { x * 0.5 } else { *x };
            assert_eq!(
                want.to_bits(),
                y.to_bits(),
                "MXFP8 {mxfp8}: element {i} of the QKV copy"
            );
        }
    }
}

/// Refused requests name the field and leave nothing requested: an unknown param, an AdamW
/// param, rows that do not fit the layout, a wrong head count, a NaN maximum, τ ≤ 0, α > 1, a
/// param twice.
#[test]
fn bad_requests_are_refused_and_change_nothing() {
    let cfg = Config::default();
    let specs = attention_model(false);
    let mut rt = host_runtimes(&cfg, &specs, 1).remove(0);
    let good = requests(0);
    let with = |f: &dyn Fn(&mut QkClipRequest)| {
        let mut r = good.clone();
        f(&mut r[2]);
        r
    };
    let cases: Vec<(Vec<QkClipRequest>, f32, f32, &str)> = vec![
        (
            with(&|r| r.param = 99),
            10.0,
            0.5,
            "param_id 99 is not a registered param",
        ),
        (
            with(&|r| r.param = 0),
            10.0,
            0.5,
            "'embedding.weight' is not an attention matrix",
        ),
        (
            with(&|r| r.param = 5),
            10.0,
            0.5,
            "'norm.weight' is not an attention matrix",
        ),
        (with(&|r| r.heads.head_dim = 4), 10.0, 0.5, "the layout has 24 rows"),
        (with(&|r| r.heads.v_head_dim = 0), 10.0, 0.5, "v_head_dim is 0"),
        (
            with(&|r| r.maxima = QkMaxima::Host(vec![1.0])),
            10.0,
            0.5,
            "1 maxima for 2 heads",
        ),
        (
            with(&|r| r.maxima = QkMaxima::Host(vec![1.0, f32::NAN])),
            10.0,
            0.5,
            "max_logits[1] is NaN",
        ),
        (with(&|r| *r = requests(0)[0].clone()), 10.0, 0.5, "already has a clip"),
        (good.clone(), 0.0, 0.5, "threshold 0 is not a finite number above 0"),
        (good.clone(), -1.0, 0.5, "threshold -1"),
        (good.clone(), f32::NAN, 0.5, "threshold NaN"),
        (good.clone(), 10.0, 1.5, "alpha 1.5 is not in [0, 1]"),
    ];
    for (requests, tau, alpha, message) in cases {
        let err = rt.request_qk_clip(&requests, tau, alpha).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument, "{message}: {err:?}");
        assert!(
            err.message.contains(message),
            "expected '{message}' in: {}",
            err.message
        );
        assert_eq!(
            rt.pending_qk_clips(),
            0,
            "{message}: a refused call requested something"
        );
    }
    let mut gqa = good.clone();
    gqa[0].heads.query_groups = 3;
    let err = rt.request_qk_clip(&gqa, 10.0, 0.5).unwrap_err();
    assert!(
        err.message.contains("num_query_groups 3 does not divide num_heads 4"),
        "{}",
        err.message
    );
    let before: Vec<Vec<u32>> = (0..specs.len()).map(|p| bits(&rt.param_values(p).unwrap())).collect();
    rt.request_qk_clip(&good, 10.0, 0.5).unwrap();
    let err = rt.request_qk_clip(&good[..1], 10.0, 0.5).unwrap_err();
    assert!(
        err.message.contains("already has a clip for this step"),
        "{}",
        err.message
    );
    assert_eq!(rt.pending_qk_clips(), 3);
    let after: Vec<Vec<u32>> = (0..specs.len()).map(|p| bits(&rt.param_values(p).unwrap())).collect();
    assert!(before == after, "a request changed values before the step");
}

/// The simulator prices the clip of every fused QKV (the owners' passes inside the step, no
/// collective of its own): llama3-70b at tp = 8, dp = 8 on H100 NVLink, more launches, more
/// time, under 1 % of the iteration.
#[test]
fn the_simulated_clip_costs_under_one_percent_of_a_llama3_70b_iteration() {
    use muon_opt::config::TpMode;
    use muon_opt::plan::presets::preset;
    use muon_opt::sim::profile::builtin;
    use muon_opt::sim::{Scenario, simulate};
    let base = Scenario {
        tp: Some((8, TpMode::Blockwise)),
        ..Scenario::new(preset("llama3-70b").unwrap(), 8, builtin("h100-nvlink").unwrap())
    };
    let plain = simulate(&base).unwrap().figures;
    let clipped = simulate(&Scenario { qk_clip: true, ..base }).unwrap().figures;
    let cost = clipped.iteration_ms - plain.iteration_ms;
    assert!(
        clipped.launches > plain.launches,
        "{} vs {} launches",
        clipped.launches,
        plain.launches
    );
    assert!(
        cost > 0.0 && cost < 0.01 * plain.iteration_ms,
        "the clip costs {cost} ms of a {} ms iteration",
        plain.iteration_ms
    );
}

//! A norm group makes the gradient norm, the clip coefficient and the found-inf skip global
//! over a tensor-parallel × data-parallel job (ranks on threads, dp = 2 × tp = 2): every rank
//! clips and skips alike, each gradient is counted once (a `NORM_REPLICA` copy is not), and the
//! norm equals the one computed by hand over the whole model.

mod support;

use std::sync::Arc;
use std::time::Duration;

use muon_opt::backend::cuda::CallerStream;
use muon_opt::backend::host::comm::HostGroup;
use muon_opt::comm::{Communicator, Transport};
use muon_opt::config::{Config, Dtype, NsPrecision};
use muon_opt::error::{ErrorKind, Result};
use muon_opt::model::{ParamFlags, ParamSpec};
use muon_opt::optimizer::Optimizer;
use muon_opt::schedule::StepInfo;
use support::ranks::{host_comms, on_ranks};
use support::rng::milli;
use support::training::ARGS;

const DP: usize = 2;
const TP: usize = 2;

/// TP rank `t`'s part of the model: its shard of two matrices and of a bias, and the layer
/// norm every TP rank holds a copy of (a tensor-parallel duplicate), flagged `NORM_REPLICA`
/// on TP ranks > 0 when `flag_replicas`.
fn model(t: usize, flag_replicas: bool) -> Vec<ParamSpec> {
    let mut norm = ParamSpec::new("layers.0.norm.weight", &[24], Dtype::F32);
    if t > 0 && flag_replicas {
        norm.flags = ParamFlags(ParamFlags::NORM_REPLICA);
    }
    vec![
        ParamSpec::new("layers.0.fc1.weight", &[32, 24], Dtype::F32),
        ParamSpec::new("layers.0.fc1.bias", &[32], Dtype::F32),
        norm,
        ParamSpec::new("layers.0.fc2.weight", &[24, 16], Dtype::F32),
    ]
}

/// Gradient element `i` of param `p` on (data-parallel rank d, TP rank t). The layer norm's
/// gradient is the same on every TP rank (frameworks all-reduce duplicates over TP first).
fn grad(d: usize, t: usize, p: usize, i: usize) -> f32 {
    let t = if p == 2 { 0 } else { t };
    milli((d * 7919 + t * 104_729 + p * 1_000_003 + i * 31) as u64)
}

/// What a run of one step reports on every rank, (d, t) in world-rank order t·DP + d.
struct Setup {
    flag_replicas: bool,
    norm_group: bool,
    clip_grad: f32,
    /// (d, t, p, i) of a NaN gradient.
    nan: Option<(usize, usize, usize, usize)>,
    /// (d, t) of a rank that has taken 5 steps before this one (the others none).
    ahead: Option<(usize, usize)>,
}

fn run(setup: &Setup) -> Vec<Result<StepInfo>> {
    let world = host_comms(DP * TP);
    let data: Vec<Vec<Arc<Communicator>>> = (0..TP).map(|_| host_comms(DP)).collect();
    let cfg = Config {
        bucket_size: 256,
        clip_grad: setup.clip_grad,
        muon_ns_precision: NsPrecision::F32,
        ..Config::default()
    };
    on_ranks(
        (0..TP).flat_map(|t| (0..DP).map(move |d| (d, t))),
        |_, (d, t)| -> Result<StepInfo> {
            let (dp_comm, world_comm) = (data[t][d].clone(), world[t * DP + d].clone());
            let cfg = cfg.clone();
            let mut opt = Optimizer::new(cfg, dp_comm.claim()?, CallerStream::NULL)?;
            let specs = model(t, setup.flag_replicas);
            for (p, spec) in specs.iter().enumerate() {
                let init: Vec<f32> = (0..spec.numel() as usize).map(|i| grad(9, t, p, i) * 0.1).collect();
                opt.add_param(spec.clone(), Some(muon_opt::init_data::InitData::from_f32(&init)))?;
            }
            if setup.norm_group {
                opt.set_norm_group(world_comm)?;
            }
            opt.finalize()?;
            if setup.ahead == Some((d, t)) {
                opt.running()?.backend_mut().set_step_count(5)?;
            }
            opt.zero_grad()?;
            for p in (0..specs.len()).rev() {
                let rt = opt.running()?;
                let ptr = rt.address(p, true).cast::<f32>();
                let n = specs[p].numel() as usize;
                // SAFETY: the host backend's f32 grad view of param p holds n values.
                let g = unsafe { std::slice::from_raw_parts_mut(ptr, n) };
                for (i, v) in g.iter_mut().enumerate() {
                    *v = if setup.nan == Some((d, t, p, i)) {
                        f32::NAN
                    } else {
                        grad(d, t, p, i)
                    };
                }
                opt.grad_ready(p as u32)?;
            }
            opt.step(&ARGS)
        },
    )
}

/// ‖mean gradient‖² by hand: per TP rank, the data-parallel sum in rank order (f32, as the
/// collectives add), squared in f64, over dp²; the layer norm counted `norm_copies` times.
fn norm_squared_by_hand(norm_copies: usize) -> f64 {
    let mut total = 0.0f64;
    for t in 0..TP {
        for (p, spec) in model(t, true).iter().enumerate() {
            if p == 2 && t >= norm_copies {
                continue;
            }
            for i in 0..spec.numel() as usize {
                let sum = (0..DP).map(|d| grad(d, t, p, i)).fold(0.0f32, |acc, g| acc + g);
                total += f64::from(sum) * f64::from(sum);
            }
        }
    }
    total / (DP * DP) as f64
}

fn all_ok(results: Vec<Result<StepInfo>>) -> Vec<StepInfo> {
    results.into_iter().map(|r| r.unwrap()).collect()
}

#[test]
fn every_rank_clips_with_the_norm_of_the_whole_model() {
    let exact = norm_squared_by_hand(1).sqrt();
    let clip_grad = (exact * 0.5) as f32;
    let infos = all_ok(run(&Setup {
        flag_replicas: true,
        norm_group: true,
        clip_grad,
        nan: None,
        ahead: None,
    }));
    for info in &infos {
        assert_eq!(info.grad_norm.to_bits(), infos[0].grad_norm.to_bits(), "{infos:?}");
        assert_eq!(info.clip_coef.to_bits(), infos[0].clip_coef.to_bits(), "{infos:?}");
        assert!(!info.skipped);
    }
    let norm = infos[0].grad_norm;
    assert!((norm - exact).abs() <= 1e-12 * exact, "{norm} vs {exact} by hand");
    let expected_clip = (f64::from(clip_grad) / (norm + 1e-6)) as f32;
    assert_eq!(infos[0].clip_coef, expected_clip);

    // Without the group, each TP rank's data-parallel group clips with its own part of the
    // model: the coefficients differ — the silent divergence the group prevents.
    let alone = all_ok(run(&Setup {
        flag_replicas: true,
        norm_group: false,
        clip_grad,
        nan: None,
        ahead: None,
    }));
    assert_ne!(alone[0].clip_coef, alone[DP].clip_coef);
}

#[test]
fn a_tensor_parallel_duplicate_is_counted_once() {
    let flagged = all_ok(run(&Setup {
        flag_replicas: true,
        norm_group: true,
        clip_grad: 0.0,
        nan: None,
        ahead: None,
    }));
    let once = norm_squared_by_hand(1);
    let twice = norm_squared_by_hand(2);
    assert!(twice > once * (1.0 + 1e-6), "the layer norm's gradient must weigh in");
    let got = flagged[0].grad_norm.powi(2);
    assert!((got - once).abs() <= 1e-12 * once, "counted once: {got} vs {once}");
    let unflagged = all_ok(run(&Setup {
        flag_replicas: false,
        norm_group: true,
        clip_grad: 0.0,
        nan: None,
        ahead: None,
    }));
    let got = unflagged[0].grad_norm.powi(2);
    assert!(
        (got - twice).abs() <= 1e-12 * twice,
        "unflagged, both copies count: {got} vs {twice}"
    );
}

#[test]
fn a_non_finite_gradient_on_one_rank_skips_the_step_everywhere() {
    let nan = Some((1, 1, 0, 5)); // data-parallel rank 1 of TP rank 1
    let grouped = all_ok(run(&Setup {
        flag_replicas: true,
        norm_group: true,
        clip_grad: 1.0,
        nan,
        ahead: None,
    }));
    assert!(grouped.iter().all(|i| i.skipped && i.step == 0), "{grouped:?}");
    let alone = all_ok(run(&Setup {
        flag_replicas: true,
        norm_group: false,
        clip_grad: 1.0,
        nan,
        ahead: None,
    }));
    let skipped: Vec<bool> = alone.iter().map(|i| i.skipped).collect();
    assert_eq!(
        skipped,
        [false, false, true, true],
        "without the group only TP rank 1 skips"
    );
}

/// A NaN in a copy no rank counts in the norm (TP rank 1's layer norm, `NORM_REPLICA`) still
/// skips the step on every rank: replicas are checked for non-finite values, not counted.
#[test]
fn a_non_finite_replica_gradient_still_skips_the_step() {
    let infos = all_ok(run(&Setup {
        flag_replicas: true,
        norm_group: true,
        clip_grad: 1.0,
        nan: Some((0, 1, 2, 3)),
        ahead: None,
    }));
    assert!(infos.iter().all(|i| i.skipped && i.step == 0), "{infos:?}");
}

#[test]
fn ranks_of_one_data_parallel_group_must_set_the_same_group() {
    let (world, data) = (host_comms(DP), host_comms(DP));
    let results: Vec<Result<()>> = on_ranks(0..DP, |_, d| {
        let (dp_comm, group) = (data[d].clone(), world[d].clone());
        let mut opt = Optimizer::new(Config::default(), dp_comm.claim()?, CallerStream::NULL)?;
        opt.add_param(ParamSpec::new("w", &[16, 8], Dtype::F32), None)?;
        if d == 0 {
            opt.set_norm_group(group)?;
        }
        opt.finalize()
    });
    for r in results {
        let err = r.unwrap_err();
        assert_eq!(err.kind, ErrorKind::PlanMismatch);
        assert!(err.message.contains("norm group"), "{}", err.message);
    }

    let comm = Communicator::new(Transport::Host(HostGroup::new(2, Duration::from_secs(1)).remove(0)));
    let odd = Communicator::new(Transport::Host(HostGroup::new(3, Duration::from_secs(1)).remove(0)));
    let mut opt = Optimizer::new(Config::default(), comm.claim().unwrap(), CallerStream::NULL).unwrap();
    let err = opt.set_norm_group(odd).unwrap_err();
    assert_eq!(err.kind, ErrorKind::CommMismatch);
    assert!(err.message.contains("multiple of dp"), "{}", err.message);
}

/// A norm group's collectives run on its optimizer's comm stream, so two optimizers on one
/// communicator would interleave their gathers in any order: the group is claimed, a second
/// optimizer (or the optimizer's own data-parallel communicator) is refused, and a refused call
/// leaves the optimizer's group as it was.
#[test]
fn a_norm_group_serves_one_optimizer() {
    let host = |n: usize| Communicator::new(Transport::Host(HostGroup::new(n, Duration::from_secs(1)).remove(0)));
    let (comm_a, comm_b, group) = (host(1), host(1), host(2));
    let mut a = Optimizer::new(Config::default(), comm_a.claim().unwrap(), CallerStream::NULL).unwrap();
    let mut b = Optimizer::new(Config::default(), comm_b.claim().unwrap(), CallerStream::NULL).unwrap();
    a.set_norm_group(group.clone()).unwrap();
    a.set_norm_group(group.clone()).unwrap();
    let err = b.set_norm_group(group.clone()).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidState);
    assert!(
        err.message.contains("already used by another optimizer"),
        "{}",
        err.message
    );
    let err = a.set_norm_group(comm_a.clone()).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidState, "its own communicator: {err}");
    assert!(
        group.claim().is_err(),
        "a's claim on the group survived the refused call"
    );
    drop(a);
    b.set_norm_group(group).unwrap();
}

/// The setup of Megatron's multi-token-prediction PR: stage 0 holds the word embedding, the
/// MTP stage (another pipeline stage, another optimizer) holds its copy, both declaring one tie
/// group; the norm group spans both stages. An untagged copy (which would route to Muon) fails
/// finalize on both stages, naming both params; tagged alike, both finalize.
#[test]
fn an_untagged_embedding_copy_on_another_pipeline_stage_fails_finalize_on_both() {
    const VOCAB: u64 = 96;
    let finalize = |tag_the_copy: bool| -> Vec<Result<()>> {
        let norm = host_comms(2);
        on_ranks(0..2, |_, stage| {
            let dp_comm = host_comms(1).remove(0);
            let mut opt = Optimizer::new(Config::default(), dp_comm.claim()?, CallerStream::NULL)?;
            let mut embedding = if stage == 0 {
                ParamSpec::new("embedding.word_embeddings.weight", &[VOCAB, 32], Dtype::F32)
            } else {
                ParamSpec::new("mtp.embedding.word_embeddings.weight", &[VOCAB, 32], Dtype::F32)
            };
            embedding.tie_group = 7;
            if stage == 0 || tag_the_copy {
                embedding.flags = ParamFlags(ParamFlags::EMBEDDING_OR_OUTPUT);
            }
            opt.add_param(embedding, None)?;
            opt.add_param(
                ParamSpec::new(format!("stage{stage}.fc.weight"), &[32, 32], Dtype::F32),
                None,
            )?;
            opt.set_norm_group(norm[stage].clone())?;
            opt.finalize()
        })
    };
    for (stage, result) in finalize(false).into_iter().enumerate() {
        let err = result.expect_err("the untagged copy must fail finalize on every stage");
        assert_eq!(err.kind, ErrorKind::PlanMismatch, "stage {stage}: {}", err.message);
        for needle in [
            "tie_group 7",
            "'embedding.word_embeddings.weight' routes to adamw on norm rank 0",
            "'mtp.embedding.word_embeddings.weight' routes to muon on norm rank 1",
        ] {
            assert!(
                err.message.contains(needle),
                "stage {stage}: '{}' lacks '{needle}'",
                err.message
            );
        }
    }
    assert!(
        finalize(true).iter().all(Result::is_ok),
        "tagged alike, both stages finalize"
    );
}

/// `vocab_size` left at 0 takes the vocabulary the embedding declares, over the norm group: an
/// untagged `[vocab, hidden]` copy on the MTP stage, declared without a tie group (so the tie
/// check cannot pair it), fails finalize on both stages naming it and the rule; flagged
/// `ALLOW_VOCAB_DIM` (a hidden matrix that happens to have as many rows), both finalize.
#[test]
fn an_untied_untagged_embedding_copy_on_the_mtp_stage_fails_finalize_by_the_vocab_default() {
    const VOCAB: u64 = 96;
    let finalize = |copy_flags: u32| -> Vec<Result<()>> {
        let norm = host_comms(2);
        on_ranks(0..2, |_, stage| {
            let dp_comm = host_comms(1).remove(0);
            let cfg = Config::default();
            assert_eq!(cfg.vocab_size, 0, "the default is derived");
            let mut opt = Optimizer::new(cfg, dp_comm.claim()?, CallerStream::NULL)?;
            let mut embedding = if stage == 0 {
                ParamSpec::new("embedding.word_embeddings.weight", &[VOCAB, 32], Dtype::F32)
            } else {
                ParamSpec::new("mtp.embedding.word_embeddings.weight", &[VOCAB, 32], Dtype::F32)
            };
            embedding.flags = ParamFlags(if stage == 0 {
                ParamFlags::EMBEDDING_OR_OUTPUT
            } else {
                copy_flags
            });
            opt.add_param(
                ParamSpec::new(format!("stage{stage}.fc.weight"), &[32, VOCAB], Dtype::F32),
                None,
            )?;
            opt.add_param(embedding, None)?;
            opt.set_norm_group(norm[stage].clone())?;
            opt.finalize()
        })
    };
    for (stage, result) in finalize(0).into_iter().enumerate() {
        let err = result.expect_err("the untagged copy must fail finalize on every stage");
        assert_eq!(err.kind, ErrorKind::RoutingConflict, "stage {stage}: {}", err.message);
        for needle in [
            "param 'mtp.embedding.word_embeddings.weight' on norm rank 1 routes to Muon",
            "dim 0 is 96",
            "with vocab_size 0 the vocabulary size is the largest dim 0",
            "flag it EMBEDDING_OR_OUTPUT",
        ] {
            assert!(
                err.message.contains(needle),
                "stage {stage}: '{}' lacks '{needle}'",
                err.message
            );
        }
    }
    for flags in [ParamFlags::EMBEDDING_OR_OUTPUT, ParamFlags::ALLOW_VOCAB_DIM] {
        assert!(
            finalize(flags).iter().all(Result::is_ok),
            "flags 0x{flags:x}: both stages finalize"
        );
    }
}

/// A rank of the norm group at another step count (its count set alone): the step is
/// refused on every rank, naming that rank and rank 0 with their counts, and skipped.
#[test]
fn ranks_at_different_step_counts_refuse_the_step_on_every_rank() {
    let results = run(&Setup {
        flag_replicas: true,
        norm_group: true,
        clip_grad: 0.0,
        nan: None,
        ahead: Some((1, 1)),
    });
    assert_eq!(results.len(), DP * TP);
    for r in results {
        let err = r.unwrap_err();
        assert_eq!(err.kind, ErrorKind::PlanMismatch);
        assert!(
            err.message
                .contains("rank 3 has taken 5 steps, rank 0 0; the step was skipped on every rank"),
            "{}",
            err.message
        );
    }
}

//! Every group an optimizer uses honours `collective_timeout_ms`, and finalize's agreement
//! over the tensor-parallel and norm groups: programs as a user writes them against the C
//! API, ranks on threads, the bad setup on one rank only. Each test checks the status on
//! every rank and how long the call took (generous bounds: a 2 s timeout returns well
//! before 30 s, never after the host group's default 300 s).

mod support;

use std::time::Duration;

use muon_opt::capi::comm::muon_comm_t;
use muon_opt::capi::config::muon_config_t;
use muon_opt::capi::constants::{
    MUON_NS_METHOD_GRAM, MUON_NS_METHOD_STANDARD, MUON_PARAM_FLAG_TP_SHARD_COLS, MUON_PARAM_FLAG_TP_SHARD_ROWS,
    MUON_TP_MODE_BLOCKWISE, MUON_TP_MODE_DISTRIBUTED, MUON_TP_MODE_DUPLICATED,
};
use muon_opt::capi::iteration::{
    muon_optimizer_grad_ready, muon_optimizer_step, muon_optimizer_zero_grad, muon_optimizers_step,
};
use muon_opt::capi::optimizer::{
    muon_optimizer_finalize, muon_optimizer_set_norm_group, muon_optimizer_set_tp_group, muon_optimizer_t,
};
use muon_opt::capi::status::muon_status_t::{self, *};
use support::capi::{
    Handle, Outcome, add_param, config, create, destroy, destroy_group, host_group, outcome, step_args, timed,
};
use support::ranks::on_ranks;

/// The timeout of the tests whose ranks wait for a peer that never comes.
const SHORT_MS: u32 = 2_000;
/// The timeout of the tests that must fail without waiting for one.
const LONG_MS: u32 = 120_000;
/// Generous bound on a call that waits at most SHORT_MS, or not at all.
const BOUND: Duration = Duration::from_secs(30);

fn finalize(opt: Handle<muon_optimizer_t>) -> Outcome {
    outcome(unsafe { muon_optimizer_finalize(opt.0) })
}

/// One optimizer per TP rank, each alone in its data-parallel group, with the TP group set:
/// `setup(tp_rank)` gives the rank's tp mode and its params (name, shape, flags).
fn tp_ranks(
    timeout_ms: u32,
    tp: &[Handle<muon_comm_t>],
    setup: impl Fn(usize) -> (u32, Vec<(&'static str, Vec<i64>, u32)>),
) -> Vec<(Handle<muon_optimizer_t>, Handle<muon_comm_t>)> {
    (0..tp.len())
        .map(|t| {
            let (mode, params) = setup(t);
            let mut cfg = config(timeout_ms);
            cfg.muon_tp_mode = mode;
            tp_rank(&cfg, tp[t], params)
        })
        .collect()
}

/// One TP rank alone in its data-parallel group, with `params` registered and the TP group
/// set.
fn tp_rank(
    cfg: &muon_config_t,
    tp: Handle<muon_comm_t>,
    params: Vec<(&'static str, Vec<i64>, u32)>,
) -> (Handle<muon_optimizer_t>, Handle<muon_comm_t>) {
    let dp = host_group(1)[0];
    let opt = create(cfg, dp);
    for (name, shape, flags) in params {
        add_param(opt, name, &shape, flags);
    }
    outcome(unsafe { muon_optimizer_set_tp_group(opt.0, tp.0) }).expect("set_tp_group");
    (opt, dp)
}

fn teardown(ranks: Vec<(Handle<muon_optimizer_t>, Handle<muon_comm_t>)>, group: &[Handle<muon_comm_t>]) {
    for (opt, dp) in ranks {
        destroy(opt);
        destroy_group(&[dp]);
    }
    destroy_group(group);
}

/// Finalize on every rank at once: each rank's outcome and how long it took.
fn finalize_all(ranks: &[(Handle<muon_optimizer_t>, Handle<muon_comm_t>)]) -> Vec<(Outcome, Duration)> {
    on_ranks(ranks, |_, (opt, _)| timed(|| finalize(*opt)))
}

/// A failure with `status` within BOUND whose message holds every one of `parts`.
fn assert_fails(result: &(Outcome, Duration), status: muon_status_t, parts: &[&str]) {
    let (outcome, took) = result;
    let (got, message) = outcome.as_ref().expect_err("the call must fail");
    assert_eq!(*got, status, "{message}");
    assert!(*took < BOUND, "took {took:?}: {message}");
    for part in parts {
        assert!(message.contains(part), "'{part}' missing from: {message}");
    }
}

#[test]
fn a_tp_peer_that_never_finalizes_times_out_after_the_configured_timeout() {
    let tp = host_group(2);
    let shard = |_| {
        (
            MUON_TP_MODE_DUPLICATED,
            vec![("w", vec![12, 24], MUON_PARAM_FLAG_TP_SHARD_ROWS)],
        )
    };
    let ranks = tp_ranks(SHORT_MS, &tp, shard);
    // TP rank 1 never calls finalize.
    let result = timed(|| finalize(ranks[0].0));
    assert_fails(
        &result,
        MUON_STATUS_COMM_TIMEOUT,
        &["timed out after 2000 ms", "ranks [1]"],
    );
    assert!(result.1 >= Duration::from_millis(u64::from(SHORT_MS)), "{:?}", result.1);
    teardown(ranks, &tp);
}

#[test]
fn a_norm_group_peer_that_stops_stepping_times_out_after_the_configured_timeout() {
    let norm = host_group(2);
    let ranks: Vec<_> = (0..2)
        .map(|r| {
            let dp = host_group(1)[0];
            let opt = create(&config(SHORT_MS), dp);
            add_param(opt, "w", &[16, 8], 0);
            outcome(unsafe { muon_optimizer_set_norm_group(opt.0, norm[r].0) }).expect("set_norm_group");
            (opt, dp)
        })
        .collect();
    for result in finalize_all(&ranks) {
        result.0.expect("finalize");
    }
    // Rank 1 stops stepping: rank 0's step waits for its sum of squares over the norm group.
    let (opt, _) = ranks[0];
    let result = timed(|| {
        outcome(unsafe { muon_optimizer_zero_grad(opt.0) })?;
        outcome(unsafe { muon_optimizer_grad_ready(opt.0, 0) })?;
        let mut info = unsafe { std::mem::zeroed::<muon_opt::capi::iteration::muon_step_info_t>() };
        info.struct_size = std::mem::size_of_val(&info) as u32;
        outcome(unsafe { muon_optimizer_step(opt.0, &step_args(0.01), &mut info) })
    });
    assert_fails(&result, MUON_STATUS_COMM_TIMEOUT, &["timed out after 2000 ms"]);
    teardown(ranks, &norm);
}

#[test]
fn tp_ranks_that_shard_a_matrix_along_different_dimensions_fail_finalize_then_retry() {
    let tp = host_group(2);
    let flags = [MUON_PARAM_FLAG_TP_SHARD_ROWS, MUON_PARAM_FLAG_TP_SHARD_COLS];
    let mut ranks = tp_ranks(LONG_MS, &tp, |t| {
        (MUON_TP_MODE_DUPLICATED, vec![("w", vec![24, 24], flags[t])])
    });
    for result in finalize_all(&ranks) {
        assert_fails(
            &result,
            MUON_STATUS_PLAN_MISMATCH,
            &[
                "muon_optimizer_finalize",
                "'w'",
                "shard dimension",
                "TP_SHARD_ROWS",
                "TP_SHARD_COLS",
            ],
        );
    }
    // Finalize changed nothing: TP rank 1 starts over with the right flag, TP rank 0 retries
    // on its handle, and both finalize and step.
    let (wrong, dp) = ranks.pop().unwrap();
    destroy(wrong);
    destroy_group(&[dp]);
    ranks.extend(tp_ranks(LONG_MS, &tp[1..], |_| {
        (MUON_TP_MODE_DUPLICATED, vec![("w", vec![24, 24], flags[0])])
    }));
    let results = on_ranks(&ranks, |_, (opt, _)| {
        finalize(*opt)?;
        outcome(unsafe { muon_optimizer_zero_grad(opt.0) })?;
        outcome(unsafe { muon_optimizer_grad_ready(opt.0, 0) })?;
        outcome(unsafe { muon_optimizer_step(opt.0, &step_args(0.01), std::ptr::null_mut()) })
    });
    for result in results {
        result.expect("the retried finalize and a step");
    }
    teardown(ranks, &tp);
}

#[test]
fn a_matrix_flagged_as_a_tp_shard_on_one_rank_only_fails_finalize_on_both() {
    let tp = host_group(2);
    let ranks = tp_ranks(LONG_MS, &tp, |t| {
        let flags = if t == 0 { MUON_PARAM_FLAG_TP_SHARD_ROWS } else { 0 };
        (
            MUON_TP_MODE_DUPLICATED,
            vec![("a", vec![16, 16], 0), ("w", vec![12, 24], flags)],
        )
    });
    for result in finalize_all(&ranks) {
        assert_fails(
            &result,
            MUON_STATUS_PLAN_MISMATCH,
            &["TP-sharded param #0", "'w'", "(none)"],
        );
    }
    teardown(ranks, &tp);
}

#[test]
fn tp_ranks_with_different_tp_modes_fail_finalize_on_both() {
    let tp = host_group(2);
    let modes = [MUON_TP_MODE_DUPLICATED, MUON_TP_MODE_DISTRIBUTED];
    let ranks = tp_ranks(LONG_MS, &tp, |t| {
        (modes[t], vec![("w", vec![12, 24], MUON_PARAM_FLAG_TP_SHARD_ROWS)])
    });
    for result in finalize_all(&ranks) {
        assert_fails(
            &result,
            MUON_STATUS_PLAN_MISMATCH,
            &["muon_tp_mode", "duplicated", "distributed"],
        );
    }
    teardown(ranks, &tp);
}

/// Data-parallel ranks with different Newton–Schulz methods fail finalize on both, naming the
/// field. So do TP ranks (each alone in its data-parallel group) in `distributed` mode, whose
/// shards run one iteration with collectives that follow the method, and in `duplicated` mode,
/// where each rank orthogonalizes its own copy of the whole matrix; in `blockwise` mode each
/// shard is a matrix of its own and the methods may differ.
#[test]
fn ranks_with_different_newton_schulz_methods_fail_finalize_on_both() {
    let methods = [MUON_NS_METHOD_STANDARD, MUON_NS_METHOD_GRAM];
    let dp = host_group(2);
    let ranks: Vec<_> = (0..2)
        .map(|r| {
            let mut cfg = config(LONG_MS);
            cfg.muon_ns_method = methods[r];
            let opt = create(&cfg, dp[r]);
            add_param(opt, "w", &[16, 48], 0);
            (opt, dp[r])
        })
        .collect();
    for result in finalize_all(&ranks) {
        assert_fails(&result, MUON_STATUS_PLAN_MISMATCH, &["config field 'muon_ns_method'"]);
    }
    ranks.into_iter().for_each(|(opt, _)| destroy(opt));
    destroy_group(&dp);

    for mode in [
        MUON_TP_MODE_DISTRIBUTED,
        MUON_TP_MODE_DUPLICATED,
        MUON_TP_MODE_BLOCKWISE,
    ] {
        let tp = host_group(2);
        let ranks: Vec<_> = (0..2)
            .map(|t| {
                let mut cfg = config(LONG_MS);
                cfg.muon_tp_mode = mode;
                cfg.muon_ns_method = methods[t];
                tp_rank(&cfg, tp[t], vec![("w", vec![16, 48], MUON_PARAM_FLAG_TP_SHARD_COLS)])
            })
            .collect();
        for result in finalize_all(&ranks) {
            if mode == MUON_TP_MODE_BLOCKWISE {
                result.0.expect("blockwise: each shard is a matrix of its own");
            } else {
                assert_fails(
                    &result,
                    MUON_STATUS_PLAN_MISMATCH,
                    &[
                        "the TP group disagrees on muon_ns_method",
                        "standard on TP rank",
                        "gram on TP rank",
                    ],
                );
            }
        }
        teardown(ranks, &tp);
    }
}

#[test]
fn norm_group_ranks_with_different_clip_grad_fail_finalize_on_both() {
    let norm = host_group(2);
    let ranks: Vec<_> = (0..2)
        .map(|r| {
            let dp = host_group(1)[0];
            let mut cfg = config(LONG_MS);
            cfg.clip_grad = [1.0, 0.5][r];
            let opt = create(&cfg, dp);
            add_param(opt, "w", &[16, 8], 0);
            outcome(unsafe { muon_optimizer_set_norm_group(opt.0, norm[r].0) }).expect("set_norm_group");
            (opt, dp)
        })
        .collect();
    for result in finalize_all(&ranks) {
        assert_fails(
            &result,
            MUON_STATUS_PLAN_MISMATCH,
            &["norm group", "clip_grad", "1 on", "0.5 on"],
        );
    }
    teardown(ranks, &norm);
}

/// A shared step (dense and expert optimizers, muon_optimizers_step) whose expert member times
/// out: the step began on the dense member, whose group may hold collectives its peers wait
/// for, and cannot finish without the shared norm. Every member then answers COMM_BROKEN
/// naming the failure and the member, at once (never "begun and not finished" forever).
#[test]
fn a_shared_step_whose_member_times_out_breaks_every_member() {
    let (dense, expert) = (host_group(2), host_group(2));
    let ranks: Vec<[Handle<muon_optimizer_t>; 2]> = (0..2)
        .map(|r| {
            let opts = [
                create(&config(SHORT_MS), dense[r]),
                create(&config(SHORT_MS), expert[r]),
            ];
            for opt in opts {
                add_param(opt, "w", &[16, 8], 0);
            }
            opts
        })
        .collect();
    let args = [step_args(0.01), step_args(0.01)];
    let results = on_ranks(&ranks, |r, opts| {
        for opt in opts {
            finalize(*opt)?;
            outcome(unsafe { muon_optimizer_zero_grad(opt.0) })?;
            outcome(unsafe { muon_optimizer_grad_ready(opt.0, 0) })?;
        }
        if r == 1 {
            // Rank 1 steps its dense optimizer alone; its expert never steps.
            return outcome(unsafe { muon_optimizer_step(opts[0].0, &args[0], std::ptr::null_mut()) });
        }
        let raw = [opts[0].0, opts[1].0];
        let failed = timed(|| outcome(unsafe { muon_optimizers_step(raw.as_ptr(), 2, args.as_ptr()) }));
        assert_fails(
            &failed,
            MUON_STATUS_COMM_TIMEOUT,
            &["opts[1]", "timed out after 2000 ms"],
        );
        for opt in opts {
            let again = timed(|| outcome(unsafe { muon_optimizer_step(opt.0, &args[0], std::ptr::null_mut()) }));
            assert_fails(
                &again,
                MUON_STATUS_COMM_BROKEN,
                &["muon_optimizers_step", "opts[1]", "timed out"],
            );
            assert!(again.1 < Duration::from_millis(u64::from(SHORT_MS)), "{:?}", again.1);
        }
        Ok(())
    });
    results[0].clone().expect("rank 0");
    for opts in ranks {
        for opt in opts {
            destroy(opt);
        }
    }
    destroy_group(&dense);
    destroy_group(&expert);
}

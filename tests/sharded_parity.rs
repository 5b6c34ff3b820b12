//! `param_sharding = sharded` trains bit for bit like replicated params on the host backend:
//! the same model and data at dp 1–4, every layout and ownership, with and without
//! `reshard_after_forward`, prefetch windows of 0–2 buckets, eager and lazy comm streams. The
//! params every rank sees (each bucket gathered for the reading) and the assembled optimizer
//! state are compared bit for bit after every step.

mod support;

use muon_opt::config::{CommMode, Config, MuonLayout, MuonOwnership, NsPrecision, ParamSharding};
use support::cuda::mxfp8_params;
use support::training::{Data, Snapshot, bits, model, train, train_model};

const STEPS: u64 = 4;

fn assert_same(reference: &[Snapshot], run: &[Snapshot], label: &str) {
    assert_eq!(reference.len(), run.len(), "{label}: steps");
    for (step, (a, b)) in reference.iter().zip(run).enumerate() {
        for (p, (sa, sb)) in a.state.iter().zip(&b.state).enumerate() {
            for (k, (x, y)) in sa.iter().zip(sb).enumerate() {
                assert_eq!(
                    bits(x),
                    bits(y),
                    "{label}: step {step}, param {p}, state tensor {k} differs"
                );
            }
        }
        for (rank, (pa, pb)) in a.params.iter().zip(&b.params).enumerate() {
            for (p, (x, y)) in pa.iter().zip(pb).enumerate() {
                assert_eq!(bits(x), bits(y), "{label}: step {step}, rank {rank}, param {p} differs");
            }
        }
    }
}

fn config(layout: MuonLayout, ownership: MuonOwnership, mode: CommMode) -> Config {
    Config {
        muon_layout: layout,
        muon_ownership: ownership,
        host_comm_mode: mode,
        clip_grad: 0.0,
        muon_ns_precision: NsPrecision::F32,
        bucket_size: 3000,
        ..Config::default()
    }
}

fn sharded(cfg: &Config, reshard_after_forward: bool, param_prefetch_buckets: u32) -> Config {
    Config {
        param_sharding: ParamSharding::Sharded,
        reshard_after_forward,
        param_prefetch_buckets,
        ..cfg.clone()
    }
}

#[test]
fn sharded_trains_bitwise_like_replicated_at_every_dp_layout_and_ownership() {
    for dp in 1..=4usize {
        for &layout in MuonLayout::ALL {
            for &ownership in MuonOwnership::ALL {
                if ownership == MuonOwnership::Contiguous && !layout.takes_contiguous_ownership() {
                    continue;
                }
                let cfg = config(layout, ownership, CommMode::Lazy);
                let reference = train(&cfg, dp, Data::ranks(dp), STEPS);
                assert_ne!(reference[0].params[0], reference[STEPS as usize - 1].params[0]);
                let label = format!("dp={dp} {} {}", layout.name(), ownership.name());
                let run = train(&sharded(&cfg, true, 1), dp, Data::ranks(dp), STEPS);
                assert_same(&reference, &run, &label);
            }
        }
    }
}

#[test]
fn every_sharding_policy_and_comm_mode_trains_bitwise_like_replicated() {
    for dp in [2usize, 3] {
        for mode in [CommMode::Eager, CommMode::Lazy] {
            let cfg = config(MuonLayout::Compact, MuonOwnership::Auto, mode);
            let reference = train(&cfg, dp, Data::ranks(dp), STEPS);
            for reshard in [true, false] {
                for prefetch in [0u32, 1, 2] {
                    let label = format!("dp={dp} {} reshard={reshard} prefetch={prefetch}", mode.name());
                    let run = train(&sharded(&cfg, reshard, prefetch), dp, Data::ranks(dp), STEPS);
                    assert_same(&reference, &run, &label);
                }
            }
        }
    }
}

/// MXFP8 params (a fused Muon matrix and an AdamW one) sharded — gathered as bf16 into the
/// working set and quantized there, with `mxfp8_param_gather` off and on — train bit for bit
/// like replicated ones with MXFP8 gathered locally (the params every rank sees are the
/// dequantized MXFP8 copies).
#[test]
fn mxfp8_params_sharded_train_bitwise_like_replicated() {
    let mut specs = model();
    specs.extend(mxfp8_params());
    for dp in [1usize, 2, 3] {
        let cfg = config(MuonLayout::Compact, MuonOwnership::Auto, CommMode::Lazy);
        let reference = train_model(&specs, &cfg, dp, Data::ranks(dp), STEPS);
        for gather in [false, true] {
            let run_cfg = Config {
                mxfp8_param_gather: gather,
                ..sharded(&cfg, true, 1)
            };
            let run = train_model(&specs, &run_cfg, dp, Data::ranks(dp), STEPS);
            assert_same(&reference, &run, &format!("dp={dp} MXFP8 mxfp8_param_gather={gather}"));
        }
    }
}

/// A sharded job saves the same global-coordinate checkpoint as a replicated one: saved
/// sharded at dp 4 it resumes replicated at dp 2 and 3, and saved replicated at dp 4 it
/// resumes sharded at dp 2 and 3, each bitwise like an uninterrupted run at the loading dp
/// and mode (the checkpoint harness's data train alike at every dp).
#[test]
fn checkpoints_resume_across_modes_and_dp() {
    use support::checkpoint::{Group, all_ok};
    use support::tempdir::TempDir;
    let tmp = TempDir::new("sharded-resume");
    let replicated = support::checkpoint::config(MuonLayout::Compact);
    let sharded_cfg = sharded(&replicated, true, 1);
    for (saved_as, loaded_as) in [(&sharded_cfg, &replicated), (&replicated, &sharded_cfg)] {
        let dir = tmp.join(if saved_as.sharded() {
            "from-sharded"
        } else {
            "from-replicated"
        });
        let mut saver = Group::new(saved_as, 4);
        saver.train(3);
        all_ok(saver.save(&dir), "save");
        let saved = saver.snapshot();
        drop(saver);
        for dp in [2usize, 3] {
            let label = format!(
                "saved {} dp 4, loaded {} dp {dp}",
                saved_as.param_sharding.name(),
                loaded_as.param_sharding.name()
            );
            let mut reference = Group::new(loaded_as, dp);
            reference.train(3);
            reference
                .snapshot()
                .assert_same(&saved, &format!("{label}: trains alike"));
            reference.train(2);
            let expected = reference.snapshot();
            let mut resumed = Group::new(loaded_as, dp);
            all_ok(resumed.load(&dir), &label);
            resumed
                .snapshot()
                .assert_same(&saved, &format!("{label}: right after load"));
            resumed.train(2);
            resumed
                .snapshot()
                .assert_same(&expected, &format!("{label}: resumed vs uninterrupted"));
        }
    }
}

/// The global gradient clip (each owner's reduced gradients counted once) clips sharded runs
/// as it clips replicated ones: bitwise at dp 2 and 3 with a threshold every step exceeds.
#[test]
fn the_global_clip_clips_sharded_runs_bitwise_like_replicated() {
    for dp in [2usize, 3] {
        let cfg = Config {
            clip_grad: 1e-2,
            ..config(MuonLayout::Compact, MuonOwnership::Auto, CommMode::Lazy)
        };
        let reference = train(&cfg, dp, Data::ranks(dp), STEPS);
        let unclipped = train(
            &Config {
                clip_grad: 0.0,
                ..cfg.clone()
            },
            dp,
            Data::ranks(dp),
            STEPS,
        );
        assert_ne!(reference[1].state, unclipped[1].state, "dp={dp}: the clip must act");
        let run = train(&sharded(&cfg, true, 1), dp, Data::ranks(dp), STEPS);
        assert_same(&reference, &run, &format!("dp={dp} clipped"));
    }
}

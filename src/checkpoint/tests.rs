//! Crash simulation: a save interrupted at every stage of the protocol (through the test-only
//! hook of [`save_with`]) leaves the previous checkpoint loadable and unchanged, and the next
//! save succeeds over what the crash left behind.
//!
//! A simulated crash returns from the save at once, skipping everything after that point on
//! that rank, as a killed process would; what the test then inspects is what a crash leaves,
//! the file system. At the stages every rank passes, every rank crashes there (no survivor is
//! left waiting for a dead peer); at rank 0's stages the others learn of it through the final
//! agreement. Each scenario then loads with a fresh group, as a restarted job would.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::publish::{Paths, publish_by_renames};
use super::{Stage, save_with};
use crate::backend::cuda::CallerStream;
use crate::backend::host::comm::HostGroup;
use crate::comm::{Communicator, Transport};
use crate::config::{CommMode, Config, Dtype};
use crate::error::{Error, ErrorKind, Result};
use crate::model::{ParamFlags, ParamSpec};
use crate::optimizer::Optimizer;
use crate::rng::SplitMix64;
use crate::schedule::{OwnedState, StepArgs, StepOverrides};
use crate::tempdir::TempDir;

const DP: usize = 2;

fn model() -> Vec<ParamSpec> {
    let mut emb = ParamSpec::new("emb", &[20, 16], Dtype::Bf16);
    emb.flags = ParamFlags(ParamFlags::EMBEDDING_OR_OUTPUT);
    let mut fc1 = ParamSpec::new("fc1", &[32, 16], Dtype::Bf16);
    fc1.split_sizes = vec![16, 16];
    vec![
        emb,
        fc1,
        ParamSpec::new("fc2", &[16, 32], Dtype::Bf16),
        ParamSpec::new("bias", &[16], Dtype::F32),
    ]
}

/// A value in [-0.5, 0.5) drawn from `seed`.
fn value(seed: u64) -> f32 {
    SplitMix64::new(seed).uniform() / 2.0
}

/// A finalized group of `DP` ranks.
fn group() -> Vec<Optimizer> {
    let cfg = Config {
        bucket_size: 256,
        clip_grad: 0.0,
        host_comm_mode: CommMode::Eager,
        collective_timeout_ms: 20_000,
        ..Config::default()
    };
    let mut opts: Vec<Optimizer> = HostGroup::new(DP, Duration::from_secs(20))
        .into_iter()
        .map(|c| {
            Optimizer::new(
                cfg.clone(),
                Communicator::new(Transport::Host(c)).claim().unwrap(),
                CallerStream::NULL,
            )
            .unwrap()
        })
        .collect();
    for opt in &mut opts {
        for (p, spec) in model().into_iter().enumerate() {
            let init: Vec<f32> = (0..spec.numel()).map(|i| 0.1 * value((p as u64) << 20 | i)).collect();
            opt.add_param(spec, Some(crate::init_data::InitData::from_f32(&init)))
                .unwrap();
        }
    }
    on_ranks(&mut opts, |_, opt| opt.finalize())
        .into_iter()
        .for_each(|r| r.unwrap());
    opts
}

/// Runs `f` on every rank at once (ranks on threads).
fn on_ranks<T: Send>(opts: &mut [Optimizer], f: impl Fn(usize, &mut Optimizer) -> T + Sync) -> Vec<T> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = opts
            .iter_mut()
            .enumerate()
            .map(|(rank, opt)| {
                let f = &f;
                scope.spawn(move || f(rank, opt))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn train_step(opt: &mut Optimizer, rank: usize) {
    let step = opt.running().unwrap().steps().unwrap();
    opt.zero_grad().unwrap();
    for p in (0..model().len()).rev() {
        let seen = opt.running().unwrap().param_values(p).unwrap();
        let ptr = opt.running().unwrap().address(p, true).cast::<f32>();
        // SAFETY: the grad view of param p holds numel f32 values (grad_dtype f32).
        let grad = unsafe { std::slice::from_raw_parts_mut(ptr, seen.len()) };
        for (i, (g, w)) in grad.iter_mut().zip(&seen).enumerate() {
            *g = 0.01 * value((step << 40) ^ ((rank as u64) << 32) ^ ((p as u64) << 20) ^ i as u64) + 0.1 * w;
        }
        opt.grad_ready(p as u32).unwrap();
    }
    let args = StepArgs {
        lr: 0.02,
        weight_decay: 0.1,
        adam_lr: 0.01,
        adam_weight_decay: 0.01,
        overrides: StepOverrides::NONE,
    };
    assert!(!opt.step(&args).unwrap().skipped);
}

/// Per rank: step count, owned state and the param values it holds.
type RankState = (u64, Vec<OwnedState>, Vec<Vec<f32>>);

fn state(opts: &mut [Optimizer]) -> Vec<RankState> {
    on_ranks(opts, |_, opt| {
        let rt = opt.running().unwrap();
        rt.synchronize().unwrap();
        let params = (0..model().len()).map(|p| rt.param_values(p).unwrap()).collect();
        (rt.steps().unwrap(), rt.owned_state().unwrap(), params)
    })
}

/// Asserts equal states, naming the first difference instead of printing every value.
fn assert_same(actual: &[RankState], expected: &[RankState], label: &str) {
    for (rank, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert_eq!(a.0, e.0, "{label}: rank {rank} step count");
        for (i, (pa, pe)) in a.1.iter().zip(&e.1).enumerate() {
            assert!(
                pa == pe,
                "{label}: rank {rank} state piece {i} (param {}) differs",
                pe.param
            );
        }
        for (p, (va, ve)) in a.2.iter().zip(&e.2).enumerate() {
            assert!(va == ve, "{label}: rank {rank} param {p} values differ");
        }
    }
}

fn load_fresh(dir: &Path) -> Vec<RankState> {
    let mut opts = group();
    for result in on_ranks(&mut opts, |_, opt| opt.load(dir)) {
        result.unwrap();
    }
    state(&mut opts)
}

fn crash() -> Error {
    Error::new(ErrorKind::Internal, "simulated crash")
}

/// Saves with a hook that crashes rank `rank` when `crashes(rank, stage)`.
fn save_crashing(opts: &mut [Optimizer], dir: &Path, crashes: impl Fn(usize, Stage) -> bool + Sync) -> Vec<Result<()>> {
    on_ranks(opts, |rank, opt| {
        let mut hook = |stage| if crashes(rank, stage) { Err(crash()) } else { Ok(()) };
        save_with(opt.running().unwrap(), rank, None, dir, &mut hook)
    })
}

/// Trains a group, saves (the previous checkpoint), trains on, and runs `interrupted` on the
/// group and the target; returns the state of the previous checkpoint and of the group.
fn scenario(
    label: &str,
    interrupted: impl FnOnce(&mut [Optimizer], &Path),
) -> (TempDir, PathBuf, Vec<RankState>, Vec<RankState>) {
    let tmp = TempDir::new(label);
    let dir = tmp.join("ckpt");
    let mut opts = group();
    on_ranks(&mut opts, |rank, opt| train_step(opt, rank));
    on_ranks(&mut opts, |_, opt| opt.save(&dir))
        .into_iter()
        .for_each(|r| r.unwrap());
    let previous = state(&mut opts);
    on_ranks(&mut opts, |rank, opt| train_step(opt, rank));
    let newer = state(&mut opts);
    assert!(previous != newer, "training must change the state");
    interrupted(&mut opts, &dir);
    (tmp, dir, previous, newer)
}

/// After whatever a crash left: a new group saves over it, and that checkpoint loads.
fn next_save_succeeds(dir: &Path) {
    let mut opts = group();
    on_ranks(&mut opts, |_, opt| opt.load(dir))
        .into_iter()
        .for_each(|r| r.unwrap());
    on_ranks(&mut opts, |rank, opt| train_step(opt, rank));
    on_ranks(&mut opts, |_, opt| opt.save(dir))
        .into_iter()
        .for_each(|r| r.unwrap());
    let saved = state(&mut opts);
    assert_same(&load_fresh(dir), &saved, "the save after the crash");
    let parent = dir.parent().unwrap();
    let leftovers: Vec<_> = std::fs::read_dir(parent)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "ckpt")
        .collect();
    assert!(leftovers.is_empty(), "left behind: {leftovers:?}");
}

#[test]
fn a_crash_after_any_number_of_rank_files_keeps_the_previous_checkpoint() {
    for written in 0..=DP {
        let (_tmp, dir, previous, _) = scenario(&format!("files{written}"), |opts, dir| {
            let results = save_crashing(opts, dir, |rank, stage| {
                (stage == Stage::WriteFile && rank >= written) || (stage == Stage::FileWritten && rank < written)
            });
            assert!(results.iter().all(|r| r.is_err()));
        });
        let staged = Paths::new(&dir).unwrap().staging;
        let files = std::fs::read_dir(&staged).unwrap().count();
        assert_eq!(files, written, "{written} rank files must be in the staging directory");
        assert_same(&load_fresh(&dir), &previous, &format!("crash after {written} files"));
        next_save_succeeds(&dir);
    }
}

#[test]
fn a_crash_before_the_index_or_before_the_rename_keeps_the_previous_checkpoint() {
    for stage in [Stage::WriteIndex, Stage::Publish] {
        let (_tmp, dir, previous, _) = scenario(&format!("{stage:?}"), |opts, dir| {
            let results = save_crashing(opts, dir, |_, s| s == stage);
            assert!(results.iter().all(|r| r.is_err()), "{stage:?}: {results:?}");
        });
        let staged = Paths::new(&dir).unwrap().staging;
        assert_eq!(
            staged.join("index.json").exists(),
            stage == Stage::Publish,
            "the index is written just before the rename"
        );
        assert_same(&load_fresh(&dir), &previous, &format!("crash at {stage:?}"));
        next_save_succeeds(&dir);
    }
}

#[test]
fn a_crash_after_the_exchange_has_the_new_checkpoint_in_place() {
    let (_tmp, dir, _, newer) = scenario("published", |opts, dir| {
        let results = save_crashing(opts, dir, |_, s| s == Stage::Published);
        assert!(results.iter().all(|r| r.is_err()));
    });
    assert_same(&load_fresh(&dir), &newer, "crash after the new checkpoint is in place");
    next_save_succeeds(&dir);
}

/// The fallback without `RENAME_EXCHANGE`: the new checkpoint is complete in the staging
/// directory (saved elsewhere and moved there), then the renames are interrupted.
fn renames_interrupted_at(stage: Stage) -> (TempDir, PathBuf, Vec<RankState>, Vec<RankState>) {
    scenario(&format!("renames-{stage:?}"), |opts, dir| {
        let elsewhere = dir.with_file_name("complete");
        on_ranks(opts, |_, opt| opt.save(&elsewhere))
            .into_iter()
            .for_each(|r| r.unwrap());
        let paths = Paths::new(dir).unwrap();
        std::fs::rename(&elsewhere, &paths.staging).unwrap();
        let mut hook = |s| if s == stage { Err(crash()) } else { Ok(()) };
        assert!(publish_by_renames(&paths, &mut hook).is_err());
    })
}

#[test]
fn a_crash_between_the_two_renames_loads_the_previous_checkpoint_from_the_backup() {
    let (_tmp, dir, previous, _) = renames_interrupted_at(Stage::RenamedAway);
    assert!(!dir.exists(), "the crash hit after the old checkpoint was renamed away");
    assert_same(&load_fresh(&dir), &previous, "previous checkpoint");
    let summary = super::inspect::inspect(&dir).unwrap();
    assert!(summary.verified() && summary.dir == Paths::new(&dir).unwrap().replaced);
    next_save_succeeds(&dir);
}

#[test]
fn a_crash_after_the_second_rename_has_the_new_checkpoint_in_place() {
    let (_tmp, dir, _, newer) = renames_interrupted_at(Stage::Published);
    assert_same(&load_fresh(&dir), &newer, "crash after the new checkpoint is in place");
    next_save_succeeds(&dir);
}

#[test]
fn a_failure_on_one_rank_fails_the_save_on_every_rank() {
    let (_tmp, dir, previous, _) = scenario("failed", |opts, dir| {
        let results = on_ranks(opts, |rank, opt| {
            let mut hook = |stage| {
                if rank == 1 && stage == Stage::WriteFile {
                    // Rank 0 may be writing its file into the directory at this moment; retry
                    // until the directory is gone (rank 0 never recreates it).
                    let staging = Paths::new(dir).unwrap().staging;
                    while staging.exists() {
                        let _ = std::fs::remove_dir_all(&staging);
                    }
                }
                Ok(())
            };
            save_with(opt.running().unwrap(), rank, None, dir, &mut hook)
        });
        for result in results {
            assert_eq!(result.unwrap_err().kind, ErrorKind::Io);
        }
    });
    assert!(!Paths::new(&dir).unwrap().staging.exists());
    assert_same(&load_fresh(&dir), &previous, "previous checkpoint");
    next_save_succeeds(&dir);
}

#[test]
fn ranks_saving_to_different_directories_fail_and_keep_the_previous_checkpoint() {
    let (tmp, dir, previous, _) = scenario("apart", |opts, dir| {
        let elsewhere = dir.with_file_name("elsewhere");
        let results = on_ranks(opts, |rank, opt| {
            let target = if rank == 0 {
                dir.to_path_buf()
            } else {
                elsewhere.clone()
            };
            // Rank 1's own directory exists, as a node-local disk would have it.
            let mut hook = |stage| {
                if stage == Stage::WriteFile && rank == 1 {
                    std::fs::create_dir_all(Paths::new(&elsewhere).unwrap().staging).unwrap();
                }
                Ok(())
            };
            save_with(opt.running().unwrap(), rank, None, &target, &mut hook)
        });
        for result in &results {
            assert_eq!(result.as_ref().unwrap_err().kind, ErrorKind::Io, "{results:?}");
        }
        let cause = &results[0].as_ref().unwrap_err().message;
        assert!(cause.contains("rank 0 does not see rank 1's file"), "{cause}");
    });
    assert_same(&load_fresh(&dir), &previous, "previous checkpoint");
    std::fs::remove_dir_all(tmp.join("elsewhere.muon-saving")).unwrap();
    next_save_succeeds(&dir);
}

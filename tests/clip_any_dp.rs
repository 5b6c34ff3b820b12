//! Gradient clipping active at every step, bitwise alike at dp 1 to 5 under every layout and
//! ownership, and across a checkpoint resumed at another dp (issue 43, item 2).
//!
//! The gradient is the same on every rank, each element `±m·2^e` with a 16-bit mantissa `m`:
//! summed over dp ≤ 5 ranks in rank order it stays exact, and the updates' mean (the sum times
//! f32 `1/dp`) rounds back to the element itself — the test checks both — so every dp sees the
//! same mean gradient. The norm of those means is an f64 sum whose value depends on the order
//! and the split of its additions (checked too); the library's exact sum does not, and the clip
//! multiplies the mean, so the params and every state tensor must be equal bit for bit.

mod support;

use muon_opt::config::{Config, MuonLayout, MuonOwnership};
use muon_opt::numerics::{mean_scale, squared_norm};
use support::checkpoint::{Group, Snapshot, all_ok, config};
use support::rng::mix;
use support::tempdir::TempDir;

const STEPS: u64 = 3;
/// Far below the gradient's norm: the clip scales every step.
const CLIP: f32 = 1e-3;

/// `±m·2^e` per element: `m` in [1, 2) with 16 significant bits, `e` in [−20, −5], drawn from
/// the step, the position and the value's bits.
fn rich_gradient(step: u64, p: usize, seen: &[f32]) -> Vec<f32> {
    seen.iter()
        .enumerate()
        .map(|(i, w)| {
            let h = mix((step << 48) ^ ((p as u64) << 32) ^ ((i as u64) << 8) ^ w.to_bits() as u64);
            let mantissa = 1.0 + ((h >> 8) & 0x7fff) as f32 / 32768.0;
            let magnitude = mantissa * 2f32.powi(-20 + (h % 16) as i32);
            if (h >> 40) & 1 == 1 { -magnitude } else { magnitude }
        })
        .collect()
}

fn clipped(cfg: Config) -> Config {
    Config { clip_grad: CLIP, ..cfg }
}

fn trained(cfg: &Config, dp: usize, steps: u64) -> (Group, Snapshot) {
    let mut group = Group::new(cfg, dp);
    group.gradients = rich_gradient;
    group.train(steps);
    let snapshot = group.snapshot();
    (group, snapshot)
}

/// Every rank's last reported gradient norm and clip coefficient, as bits.
fn last_norms(group: &mut Group) -> Vec<(u64, u32)> {
    group.run(|_, opt| {
        let info = opt.step_info().unwrap();
        (info.grad_norm.to_bits(), info.clip_coef.to_bits())
    })
}

#[test]
fn the_data_keep_the_mean_exact_and_the_f64_norm_order_dependent() {
    let g = rich_gradient(0, 3, &vec![0.25f32; 20_000]);
    for dp in 1..=5usize {
        for &x in &g {
            let sum = (1..dp).fold(x, |acc, _| acc + x);
            assert_eq!((sum * mean_scale(dp)).to_bits(), x.to_bits(), "dp {dp}: {x}");
        }
    }
    let (a, b) = g.split_at(7_777);
    let split = squared_norm(b) + squared_norm(a);
    assert_ne!(
        split.to_bits(),
        squared_norm(&g).to_bits(),
        "an f64 norm would depend on the split"
    );
}

#[test]
fn clipped_training_is_bitwise_alike_at_dp_1_to_5_under_every_layout_and_ownership() {
    let reference_cfg = clipped(config(MuonLayout::Compact));
    let (mut reference_group, reference) = trained(&reference_cfg, 1, STEPS);
    let reference_norm = last_norms(&mut reference_group)[0];
    assert!(f32::from_bits(reference_norm.1) < 1.0, "the clip must be active");
    for &layout in MuonLayout::ALL {
        for &ownership in MuonOwnership::ALL {
            if ownership == MuonOwnership::Contiguous && !layout.takes_contiguous_ownership() {
                continue;
            }
            for dp in 1..=5 {
                let cfg = Config {
                    muon_ownership: ownership,
                    ..clipped(config(layout))
                };
                let label = format!("dp={dp} {} {} with the clip", layout.name(), ownership.name());
                let (mut group, run) = trained(&cfg, dp, STEPS);
                run.assert_same(&reference, &label);
                assert_eq!(
                    last_norms(&mut group),
                    vec![reference_norm; dp],
                    "{label}: reported norm"
                );
            }
        }
    }
}

#[test]
fn a_clipped_job_resumed_at_another_dp_continues_bit_for_bit() {
    let tmp = TempDir::new("clip_any_dp");
    let dir = tmp.join("ckpt");
    let cfg = clipped(config(MuonLayout::Compact));
    let (mut saver, _) = trained(&cfg, 3, 2);
    all_ok(saver.save(&dir), "save at dp 3");
    drop(saver);
    let (_, uninterrupted) = trained(&cfg, 1, 4);
    for dp in [1, 2, 4, 5] {
        let mut resumed = Group::new(&cfg, dp);
        resumed.gradients = rich_gradient;
        all_ok(resumed.load(&dir), &format!("load at dp {dp}"));
        resumed.train(2);
        resumed
            .snapshot()
            .assert_same(&uninterrupted, &format!("saved at dp 3, resumed at dp {dp}"));
    }
}

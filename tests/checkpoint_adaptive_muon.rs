//! NorMuon's and AdaMuon's second moments in checkpoints: recorded with their variant, stored
//! per item in global coordinates, reloaded at another data-parallel size and layout into a run
//! that goes on bit for bit as the uninterrupted one, and refused by an optimizer of another
//! variant or another β2.

mod support;

use muon_opt::checkpoint::INDEX_FILE;
use muon_opt::config::{Config, MuonLayout, MuonVariant};
use support::checkpoint::{Group, all_ok, config, model};
use support::tempdir::TempDir;

const SAVED_AT: u64 = 3;
const MORE: u64 = 3;

fn adaptive(variant: MuonVariant, layout: MuonLayout) -> Config {
    Config {
        muon_variant: variant,
        ..config(layout)
    }
}

#[test]
fn a_normuon_checkpoint_resumes_bitwise_at_another_dp_and_layout() {
    resumes_bitwise_and_is_refused_by_others(MuonVariant::Normuon, MuonVariant::Adamuon);
}

#[test]
fn an_adamuon_checkpoint_resumes_bitwise_at_another_dp_and_layout() {
    resumes_bitwise_and_is_refused_by_others(MuonVariant::Adamuon, MuonVariant::Normuon);
}

/// Saves a `variant` run at dp 4, resumes it at dp 2 padded and dp 3 compact bit for bit, and
/// checks that standard Muon, `other` and another β2 refuse it, naming the field.
fn resumes_bitwise_and_is_refused_by_others(variant: MuonVariant, other: MuonVariant) {
    let tmp = TempDir::new(variant.name());
    let dir = tmp.join("ckpt");
    let mut saver = Group::new(&adaptive(variant, MuonLayout::Compact), 4);
    saver.train(SAVED_AT);
    all_ok(saver.save(&dir), "save");
    let saved = saver.snapshot();
    drop(saver);
    let index = std::fs::read_to_string(dir.join(INDEX_FILE)).unwrap();
    let recorded = format!(r#""muon_variant": "{}""#, variant.name());
    assert!(index.contains(&recorded), "{index}");
    assert!(index.contains(r#""moment2""#), "the pieces carry a moment2 key");
    // Every Muon param carries three state tensors: master, momentum, moment2.
    let muon_params = model()
        .iter()
        .filter(|s| s.route() == muon_opt::model::Route::Muon)
        .count();
    assert!(muon_params > 0);
    assert!(saved.state.iter().filter(|s| s.len() == 3).count() >= muon_params);

    for (dp, layout) in [(2, MuonLayout::Padded), (3, MuonLayout::Compact)] {
        let label = format!("dp={dp} {}", layout.name());
        let cfg = adaptive(variant, layout);
        let mut reference = Group::new(&cfg, dp);
        reference.train(SAVED_AT + MORE);
        let expected = reference.snapshot();
        let mut resumed = Group::new(&cfg, dp);
        all_ok(resumed.load(&dir), &label);
        resumed
            .snapshot()
            .assert_same(&saved, &format!("{label}: right after load"));
        resumed.train(MORE);
        resumed
            .snapshot()
            .assert_same(&expected, &format!("{label}: resumed vs uninterrupted"));
    }

    for (cfg, field) in [
        (config(MuonLayout::Compact), "muon_variant"),
        (adaptive(other, MuonLayout::Compact), "muon_variant"),
        (
            Config {
                adaptive_muon_beta2: 0.9,
                ..adaptive(variant, MuonLayout::Compact)
            },
            "adaptive_muon_beta2",
        ),
    ] {
        let mut other = Group::new(&cfg, 2);
        for result in other.load(&dir) {
            let err = result.expect_err("another variant or beta2 must not load");
            if !err.message.contains("failed on rank") {
                assert!(err.message.contains(field), "{}", err.message);
            }
        }
    }
}

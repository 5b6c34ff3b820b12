//! Finalize fails on every rank when the ranks disagree on anything that changes numerics or
//! communication, and the message names the first difference: a config field, a param, or
//! the param count. Settings that are a rank's own (timeout, comm mode) may differ.

mod support;

use std::time::Duration;

use muon_opt::backend::cuda::CallerStream;
use muon_opt::backend::host::comm::HostGroup;
use muon_opt::comm::{Communicator, Transport};
use muon_opt::config::{Config, Dtype, MuonVariant, Network, WeightDecayRule};
use muon_opt::error::{Error, ErrorKind};
use muon_opt::model::ParamSpec;
use muon_opt::optimizer::Optimizer;
use support::ranks::on_ranks;

fn model(rank: usize, change: Option<(usize, usize)>, extra: bool) -> Vec<ParamSpec> {
    let mut params: Vec<ParamSpec> = (0..7)
        .map(|i| ParamSpec::new(format!("layers.{i}.weight"), &[64, 32], Dtype::Bf16))
        .collect();
    if let Some((changed_rank, index)) = change
        && rank == changed_rank
    {
        params[index] = ParamSpec::new(format!("layers.{index}.weight"), &[32, 64], Dtype::Bf16);
    }
    if extra && rank == 1 {
        params.push(ParamSpec::new("extra.bias", &[32], Dtype::Bf16));
    }
    params
}

/// Finalizes on 2 host ranks with per-rank configs and models; returns each rank's result.
fn finalize(configs: [Config; 2], change: Option<(usize, usize)>, extra: bool) -> Vec<Result<(), Error>> {
    let comms = HostGroup::new(2, Duration::from_secs(20));
    on_ranks(comms.into_iter().zip(configs), |rank, (comm, cfg)| {
        let claim = Communicator::new(Transport::Host(comm)).claim().unwrap();
        let mut opt = Optimizer::new(cfg, claim, CallerStream::NULL).unwrap();
        for spec in model(rank, change, extra) {
            opt.add_param(spec, None).unwrap();
        }
        opt.finalize()
    })
}

fn assert_mismatch(results: &[Result<(), Error>], needles: &[&str]) {
    for (rank, result) in results.iter().enumerate() {
        let err = result.as_ref().expect_err("finalize must fail on every rank");
        assert_eq!(err.kind, ErrorKind::PlanMismatch, "rank {rank}: {}", err.message);
        for needle in needles {
            assert!(
                err.message.contains(needle),
                "rank {rank}: '{}' lacks '{needle}'",
                err.message
            );
        }
    }
}

#[test]
fn a_differing_numerics_setting_is_named() {
    let other = Config {
        muon_momentum: 0.9,
        ..Config::default()
    };
    let results = finalize([Config::default(), other], None, false);
    assert_mismatch(&results, &["config field 'muon_momentum'"]);
    assert!(results[0].as_ref().unwrap_err().message.contains("is 0.95 on rank 0"));
    assert!(results[1].as_ref().unwrap_err().message.contains("is 0.9 on rank 1"));
    let other = Config {
        clip_grad: 0.0,
        ..Config::default()
    };
    assert_mismatch(&finalize([Config::default(), other], None, false), &["'clip_grad'"]);
    // Which params are decayed: a rank keeping the rule of an older header (flagged) and one
    // on Megatron-LM's would decay the shards of one bias apart.
    let other = Config {
        weight_decay_rule: WeightDecayRule::Flagged,
        ..Config::default()
    };
    let results = finalize([Config::default(), other], None, false);
    assert_mismatch(&results, &["config field 'weight_decay_rule'"]);
    assert!(
        results[1]
            .as_ref()
            .unwrap_err()
            .message
            .contains("is \"flagged\" on rank 1")
    );
    // Muon on one rank and NorMuon on the other would give one matrix two updates.
    let other = Config {
        muon_variant: MuonVariant::Normuon,
        ..Config::default()
    };
    let results = finalize([Config::default(), other], None, false);
    assert_mismatch(&results, &["config field 'muon_variant'"]);
    assert!(
        results[1]
            .as_ref()
            .unwrap_err()
            .message
            .contains("is \"normuon\" on rank 1")
    );
    let normuon = Config {
        muon_variant: MuonVariant::Normuon,
        ..Config::default()
    };
    let other = Config {
        adaptive_muon_beta2: 0.9,
        ..normuon.clone()
    };
    assert_mismatch(
        &finalize([normuon.clone(), other], None, false),
        &["'adaptive_muon_beta2'"],
    );
    // NorMuon and AdaMuon keep different second moments of one matrix.
    let adamuon = Config {
        muon_variant: MuonVariant::Adamuon,
        ..normuon.clone()
    };
    let results = finalize([normuon, adamuon], None, false);
    assert_mismatch(&results, &["config field 'muon_variant'"]);
    assert!(
        results[1]
            .as_ref()
            .unwrap_err()
            .message
            .contains("is \"adamuon\" on rank 1")
    );
    // Two custom tables differing in one value orthogonalize one matrix two ways.
    let custom = Config {
        muon_coefficient_set: muon_opt::config::CoefficientSet::Custom,
        muon_custom_coefficients: vec![[3.0, -3.2, 1.2], [2.0, -1.5, 0.5]],
        ..Config::default()
    };
    let mut other = custom.clone();
    other.muon_custom_coefficients[1][0] = 2.5;
    assert_mismatch(
        &finalize([custom, other], None, false),
        &["config field 'muon_custom_coefficients'"],
    );
    // Cautious weight decay keeps other weights than plain decay.
    let cautious = Config {
        cautious_weight_decay: true,
        ..Config::default()
    };
    assert_mismatch(
        &finalize([cautious, Config::default()], None, false),
        &["config field 'cautious_weight_decay'"],
    );
    // A bf16 momentum rounds every step's momentum.
    let bf16 = Config {
        muon_momentum_dtype: muon_opt::config::Dtype::Bf16,
        ..Config::default()
    };
    assert_mismatch(
        &finalize([Config::default(), bf16], None, false),
        &["config field 'muon_momentum_dtype'"],
    );
}

/// The declared network is part of the agreement: a rank that declares other figures, or none
/// where another declares some, or another expert network, fails every rank naming the field;
/// ranks that declare the same figures finalize and plan alike.
#[test]
fn a_differing_network_is_named() {
    let ib = Network {
        hop_latency_us: 14.0,
        bus_bandwidth_gbps: 45.0,
    };
    let declared = Config {
        network: Some(ib),
        ..Config::default()
    };
    let slower = Config {
        network: Some(Network {
            bus_bandwidth_gbps: 25.0,
            ..ib
        }),
        ..Config::default()
    };
    let results = finalize([declared.clone(), slower], None, false);
    assert_mismatch(&results, &["config field 'network'"]);
    assert!(
        results[0]
            .as_ref()
            .unwrap_err()
            .message
            .contains("\"bus_bandwidth_gbps\":45.0")
    );
    assert!(
        results[1]
            .as_ref()
            .unwrap_err()
            .message
            .contains("\"bus_bandwidth_gbps\":25.0")
    );
    assert_mismatch(
        &finalize([declared.clone(), Config::default()], None, false),
        &["config field 'network'"],
    );
    let expert = Config {
        expert_network: Some(ib),
        ..declared.clone()
    };
    assert_mismatch(
        &finalize([declared.clone(), expert], None, false),
        &["config field 'expert_network'"],
    );
    let results = finalize([declared.clone(), declared], None, false);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
}

#[test]
fn a_rank_s_own_settings_may_differ() {
    let own = Config {
        collective_timeout_ms: 12_345,
        ..Config::default()
    };
    let explicit_default_bucket = Config {
        bucket_size: Config::default().effective_bucket_size(2),
        ..Config::default()
    };
    for results in [
        finalize([Config::default(), own], None, false),
        finalize([Config::default(), explicit_default_bucket], None, false),
    ] {
        assert!(results.iter().all(Result::is_ok), "{results:?}");
    }
}

#[test]
fn the_first_differing_param_is_named() {
    for index in [0, 3, 6] {
        let results = finalize([Config::default(), Config::default()], Some((1, index)), false);
        assert_mismatch(&results, &[&format!("param {index} is 'layers.{index}.weight'")]);
        assert!(results[0].as_ref().unwrap_err().message.contains("[64, 32]"));
        assert!(results[1].as_ref().unwrap_err().message.contains("[32, 64]"));
    }
}

#[test]
fn differing_param_counts_are_named() {
    let results = finalize([Config::default(), Config::default()], None, true);
    assert_mismatch(&results, &["registered 7", "registered 8", "the first 7 agree"]);
}

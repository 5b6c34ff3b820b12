//! `muon-opt simulate` with `param_sharding = sharded`: the gathers around the forward and
//! backward are issued on the comm stream (one per bucket in the forward but those the step
//! gathers, and again in the backward when resharding), the step's other param collectives are
//! priced at zero, the prefetch
//! window and resharding move the iteration the way they must, and AdamW with ZeRO-3 is the
//! baseline's sharded run.

use muon_opt::config::{MuonLayout, ParamSharding};
use muon_opt::error::ErrorKind;
use muon_opt::plan::presets::preset;
use muon_opt::sim::engine::{Call, Class};
use muon_opt::sim::profile::builtin;
use muon_opt::sim::{ExpertParallel, Scenario, Simulation, rank_optimizers, simulate};

fn scenario(sharding: ParamSharding, reshard: bool, prefetch: u32) -> Scenario {
    Scenario {
        layout: MuonLayout::CompactRooted,
        bucket_size: 4_000_000,
        param_sharding: sharding,
        reshard_after_forward: reshard,
        param_prefetch_buckets: prefetch,
        ..Scenario::new(preset("gpt2-124m").unwrap(), 4, builtin("h100-nvlink").unwrap())
    }
}

/// Param collectives of rank 0's last iteration with device time, issued by a bucket's
/// `wait_params` (the sharded gathers) and by the step.
fn param_collectives(sim: &Simulation) -> (usize, usize) {
    let last = sim.iterations - 1;
    let timeline = &sim.timelines[0];
    let of = |step: bool| {
        timeline
            .slices
            .iter()
            .filter(|s| s.iteration == Some(last) && s.class == Class::Collective && s.end > s.start)
            .filter(|s| matches!(s.label.what, "broadcast" | "all-gather"))
            .filter(|s| {
                (s.label.call == Call::Step) == step && matches!(s.label.call, Call::WaitParams(_) | Call::Step)
            })
            .count()
    };
    (of(false), of(true))
}

#[test]
fn sharded_gathers_are_issued_per_bucket_but_the_first_ones_by_the_step() {
    let plan = &rank_optimizers(&scenario(ParamSharding::Sharded, true, 1))
        .unwrap()
        .optimizers[0]
        .plan;
    // One collective group per bucket at the step, replicated; sharded, the step's groups of
    // the first two buckets in forward order (the window of one bucket ahead) keep their cost
    // and the others' move to the forward.
    let buckets = plan.buckets.len();
    let replicated = simulate(&scenario(ParamSharding::Replicated, true, 1)).unwrap();
    assert_eq!(param_collectives(&replicated), (0, buckets));
    let kept = simulate(&scenario(ParamSharding::Sharded, false, 1)).unwrap();
    assert_eq!(param_collectives(&kept), (buckets - 2, 2));
    let resharded = simulate(&scenario(ParamSharding::Sharded, true, 1)).unwrap();
    // The backward gathers every bucket again but the forward's last, still gathered.
    assert_eq!(param_collectives(&resharded), (2 * buckets - 3, 2));
    assert!(resharded.figures.iteration_ms >= kept.figures.iteration_ms);
    assert_eq!(resharded.param_sharding, "sharded");
    let sharded = resharded.sharded_device_bytes.unwrap();
    assert!(sharded < resharded.device_bytes.total, "{sharded}");
    assert_eq!(resharded.rank_bytes(), sharded);
    assert_eq!(replicated.sharded_device_bytes, None);
}

/// Gathering on first use exposes every gather; a window of buckets ahead hides them.
#[test]
fn the_prefetch_window_hides_gathers() {
    let on_demand = simulate(&scenario(ParamSharding::Sharded, true, 0)).unwrap();
    let ahead = simulate(&scenario(ParamSharding::Sharded, true, 2)).unwrap();
    assert!(
        on_demand.figures.iteration_ms > ahead.figures.iteration_ms,
        "{} vs {}",
        on_demand.figures.iteration_ms,
        ahead.figures.iteration_ms
    );
}

/// AdamW with ZeRO-3: every bucket all-gathered in the forward (the first two by the step) and
/// again in the backward (but the forward's last).
#[test]
fn the_adamw_baseline_shards_as_zero_3() {
    let base = Scenario {
        adamw_only: true,
        ..scenario(ParamSharding::Sharded, true, 1)
    };
    let plan = &rank_optimizers(&base).unwrap().optimizers[0].plan;
    let sim = simulate(&base).unwrap();
    assert_eq!(param_collectives(&sim), (2 * plan.buckets.len() - 3, 2));
}

#[test]
fn sharded_params_with_expert_parallelism_are_not_modelled() {
    let s = Scenario {
        expert_parallel: Some(ExpertParallel {
            ep: 4,
            experts_per_token: 2,
        }),
        ..Scenario::new(preset("qwen3-30b-a3b").unwrap(), 4, builtin("h100-nvlink").unwrap())
    };
    let err = simulate(&Scenario {
        param_sharding: ParamSharding::Sharded,
        ..s
    })
    .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Unsupported, "{err}");
}

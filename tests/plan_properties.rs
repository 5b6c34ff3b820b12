//! Property tests of the planner over random models: placement, alignment, contiguity of
//! owned ranges, shard shapes, determinism of plan and hash, the Newton–Schulz makespan
//! bound, and contiguous ownership's runs and buckets.

use proptest::prelude::*;

use muon_opt::config::{Config, Dtype, MuonLayout, MuonOwnership};
use muon_opt::model::{ParamFlags, ParamSpec, Registry, Route};
use muon_opt::plan::{BucketSplit, OwnershipMethod, Plan, build_plan};

fn dim() -> impl Strategy<Value = u64> {
    prop_oneof![1u64..200, (1u64..6).prop_map(|k| k * 64)]
}

fn dtype() -> impl Strategy<Value = Dtype> {
    prop_oneof![Just(Dtype::F32), Just(Dtype::Bf16)]
}

fn with_flags(mut spec: ParamSpec, flags: u32) -> ParamSpec {
    spec.flags = ParamFlags(flags);
    spec
}

/// One param of any kind the planner distinguishes; named later.
fn param() -> impl Strategy<Value = ParamSpec> {
    prop_oneof![
        1 => (dim(), dtype()).prop_map(|(n, d)| ParamSpec::new("", &[n], d)),
        3 => (dim(), dim(), dtype()).prop_map(|(m, n, d)| ParamSpec::new("", &[m, n], d)),
        3 => (1u64..3, prop::bool::ANY).prop_map(|(k, wide)| {
            let shape = if wide { [64, 128 * k] } else { [128 * k, 64] };
            ParamSpec::new("", &shape, Dtype::Bf16)
        }),
        1 => (prop::collection::vec(1u64..100, 1..4), dim(), dtype()).prop_map(|(splits, n, d)| {
            let mut spec = ParamSpec::new("", &[splits.iter().sum(), n], d);
            spec.split_sizes = splits;
            spec
        }),
        2 => (1u64..12, dim(), dim(), dtype())
            .prop_map(|(e, m, n, d)| with_flags(ParamSpec::new("", &[e, m, n], d), ParamFlags::EXPERT_STACK)),
        1 => (dim(), dim()).prop_map(|(m, n)| with_flags(ParamSpec::new("", &[m, n], Dtype::Bf16), ParamFlags::EMBEDDING_OR_OUTPUT)),
        1 => (dim(), dim()).prop_map(|(m, n)| with_flags(ParamSpec::new("", &[m, n], Dtype::F32), ParamFlags::NO_MUON)),
    ]
}

/// A registered random model.
fn model() -> impl Strategy<Value = Registry> {
    prop::collection::vec(param(), 1..40).prop_map(|specs| {
        let mut registry = Registry::default();
        for (i, mut spec) in specs.into_iter().enumerate() {
            spec.name = format!("layers.{i}.weight");
            registry
                .add(spec, &Config::default())
                .expect("generated params are valid");
        }
        registry
    })
}

fn config() -> impl Strategy<Value = (Config, usize)> {
    let bucket_size = prop_oneof![Just(0u64), 200u64..20_000];
    let layout = prop_oneof![
        Just(MuonLayout::Compact),
        Just(MuonLayout::Padded),
        Just(MuonLayout::Allreduce),
        Just(MuonLayout::CompactRooted)
    ];
    let dp = prop_oneof![1usize..=8, Just(16), Just(64)];
    (bucket_size, layout, any::<bool>(), any::<bool>(), dp).prop_map(
        |(bucket_size, muon_layout, overlap_grad_reduce, contiguous, dp)| {
            let muon_ownership = if contiguous && muon_layout != MuonLayout::Padded {
                MuonOwnership::Contiguous
            } else {
                MuonOwnership::Balanced
            };
            (
                Config {
                    bucket_size,
                    muon_layout,
                    muon_ownership,
                    overlap_grad_reduce,
                    ..Config::default()
                },
                dp,
            )
        },
    )
}

/// `T·(4m²n + 2m³)` summed over the fused components of one unit (m ≤ n).
fn unit_cost(spec: &ParamSpec, steps: u32) -> u128 {
    spec.unit_components()
        .iter()
        .map(|c| {
            let (m, n) = (c.rows.min(c.cols) as u128, c.rows.max(c.cols) as u128);
            steps as u128 * (4 * m * m * n + 2 * m * m * m)
        })
        .sum()
}

fn lcm(a: u64, b: u64) -> u64 {
    let gcd = |mut a: u64, mut b: u64| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    a / gcd(a, b) * b
}

/// Every param placed once, inside its bucket, 64-aligned, without overlap; buckets tile their
/// buffer in id order.
fn check_placement(plan: &Plan, reg: &Registry) {
    let mut seen = vec![0u32; reg.len()];
    let mut next_id = 0;
    for (index, buffer) in plan.buffers.iter().enumerate() {
        let buckets = &plan.buckets[buffer.first_bucket as usize..][..buffer.num_buckets as usize];
        let mut cursor = 0;
        let mut ranges = Vec::new();
        for bucket in buckets {
            assert_eq!(bucket.id, next_id);
            next_id += 1;
            assert_eq!(
                (bucket.buffer as usize, bucket.route, bucket.dtype),
                (index, buffer.route, buffer.dtype)
            );
            assert_eq!(bucket.start, cursor, "buckets tile the buffer");
            cursor = bucket.end;
            for &p in &bucket.params {
                seen[p as usize] += 1;
                let placement = plan.param(p as usize);
                assert_eq!((placement.bucket, placement.buffer as usize), (bucket.id, index));
                assert_eq!(placement.route, reg.routes()[p as usize]);
                assert_eq!(reg.params()[p as usize].dtype, bucket.dtype);
                assert_eq!(placement.offset % 64, 0, "param {p} is not 64-aligned");
                assert!(bucket.start <= placement.offset && placement.range().end <= bucket.end);
                ranges.push(placement.range());
            }
        }
        assert_eq!(buffer.numel, cursor);
        ranges.sort_by_key(|r| r.start);
        assert!(ranges.windows(2).all(|w| w[0].end <= w[1].start), "params overlap");
    }
    assert_eq!(next_id as usize, plan.buckets.len());
    assert!(
        seen.iter().all(|&n| n == 1),
        "every param is placed exactly once: {seen:?}"
    );
    let routes: Vec<Route> = plan.buffers.iter().map(|b| b.route).collect();
    assert!(routes.windows(2).all(|w| w[0] <= w[1]), "Muon buffers come first");
}

/// Compact owner ranges: in rank order, separated only by alignment padding, and each rank's
/// range holds exactly its own units.
fn check_owner_ranges(plan: &Plan, reg: &Registry) {
    let dp = plan.dp as usize;
    for bucket in plan.buckets.iter().filter(|b| b.route == Route::Muon) {
        let Some(ranges) = bucket.owner_ranges() else {
            assert_eq!(plan.layout, MuonLayout::Compact, "only compact has Muon shard buckets");
            continue;
        };
        assert_eq!(ranges.len(), dp);
        let nonempty: Vec<_> = ranges.iter().filter(|r| !r.is_empty()).collect();
        assert_eq!(nonempty[0].start, bucket.start);
        assert!(bucket.end - nonempty.last().unwrap().end < 64);
        for w in nonempty.windows(2) {
            assert!(
                w[0].end <= w[1].start && w[1].start - w[0].end < 64,
                "only alignment between ranges"
            );
        }
        assert!(
            ranges.windows(2).all(|w| w[0].end <= w[1].start),
            "ranges are in rank order"
        );
        let mut owned = vec![0u64; dp];
        for &p in &bucket.params {
            let placement = plan.param(p as usize);
            assert_eq!(placement.unit_owners.len() as u64, reg.params()[p as usize].num_units());
            for (unit, &owner) in placement.unit_owners.iter().enumerate() {
                let range = placement.unit_range(unit);
                let own = ranges[owner as usize];
                assert!(
                    own.start <= range.start && range.end <= own.end,
                    "unit outside its owner's range"
                );
                owned[owner as usize] += range.len();
            }
        }
        for (rank, range) in ranges.iter().enumerate() {
            let padding = range.len() - owned[rank];
            assert!(
                padding < 64 * bucket.params.len() as u64,
                "rank {rank} range holds foreign data"
            );
        }
    }
}

/// Equal shards: padded Muon shards hold their owner's whole params; AdamW shards partition
/// each bucket and every param's pieces cover it exactly once.
fn check_shards(plan: &Plan) {
    let dp = plan.dp as u64;
    for bucket in &plan.buckets {
        let Some(shard) = bucket.shard_size() else { continue };
        assert_eq!(shard * dp, bucket.numel());
        if bucket.route == Route::Adamw {
            assert_eq!(bucket.end % lcm(dp, 128), 0, "AdamW bucket end alignment");
            for &p in &bucket.params {
                let pieces = plan.adamw_pieces(p);
                let placement = plan.param(p as usize);
                let mut covered = 0;
                for (rank, piece) in pieces {
                    assert_eq!(piece.param_range.start, covered);
                    covered = piece.param_range.end;
                    let own = bucket.rank_range(rank as usize);
                    assert!(own.start <= piece.buffer_range.start && piece.buffer_range.end <= own.end);
                    assert_eq!(piece.buffer_range.start - placement.offset, piece.param_range.start);
                }
                assert_eq!(covered, placement.numel);
            }
        } else {
            assert_eq!(shard % 64, 0);
            if plan.layout == MuonLayout::Compact {
                let held: u64 = bucket.params.iter().map(|&p| plan.param(p as usize).numel).sum();
                assert_eq!(held, bucket.numel(), "compact shard buckets hold no padding");
            }
            for &p in &bucket.params {
                let placement = plan.param(p as usize);
                for (unit, &owner) in placement.unit_owners.iter().enumerate() {
                    let (own, range) = (bucket.rank_range(owner as usize), placement.unit_range(unit));
                    assert!(
                        own.start <= range.start && range.end <= own.end,
                        "unit in its owner's shard"
                    );
                }
            }
        }
    }
    let adamw_total: u64 = (0..plan.dp as usize)
        .flat_map(|r| plan.adamw_shards_of(r))
        .flat_map(|s| s.pieces)
        .map(|piece| piece.param_range.len())
        .sum();
    assert_eq!(adamw_total, plan.report.elements.adamw);
}

/// Rank views list every Muon unit once, with its owner; the makespan bound holds.
fn check_ownership(plan: &Plan, reg: &Registry, cfg: &Config) {
    let dp = plan.dp as usize;
    let mut cost = vec![0u128; dp];
    let (mut total, mut largest, mut units) = (0u128, 0u128, 0usize);
    for (spec, placement) in reg.params().iter().zip(&plan.params) {
        if placement.route == Route::Muon {
            let c = unit_cost(spec, cfg.muon_num_ns_steps);
            largest = largest.max(c);
            total += c * placement.unit_owners.len() as u128;
            units += placement.unit_owners.len();
            placement.unit_owners.iter().for_each(|&r| cost[r as usize] += c);
        }
    }
    let listed: usize = (0..dp)
        .map(|r| {
            let owned = plan.muon_units_of(r);
            for u in &owned {
                assert_eq!(plan.param(u.param as usize).unit_owners[u.unit as usize] as usize, r);
            }
            owned.len()
        })
        .sum();
    assert_eq!(listed, units);
    let makespan = cost.iter().copied().max().unwrap_or(0);
    if plan.layout != MuonLayout::Padded {
        let dpu = dp as u128;
        assert!(
            dpu * makespan <= total + dpu * largest,
            "makespan {makespan} > {total}/{dp} + {largest}"
        );
        let has_stacks = reg.params().iter().any(|p| p.is_expert_stack());
        if !has_stacks && plan.report.ownership == OwnershipMethod::LptStackFill {
            let elements = &plan.report.muon_elements;
            let total_e = plan.report.elements.muon as u128;
            let largest_e = reg
                .params()
                .iter()
                .zip(reg.routes())
                .filter(|(_, r)| **r == Route::Muon);
            let largest_e = largest_e.map(|(p, _)| p.numel()).max().unwrap_or(0) as u128;
            let max_e = elements.max as u128;
            assert!(
                10 * dpu * max_e <= 13 * total_e || dpu * max_e <= total_e + dpu * largest_e,
                "memory cap"
            );
        }
    }
}

/// `muon_ownership = contiguous`: along the Muon buckets in order (each in memory order) the
/// owners never decrease; a bucket has one owner unless it holds an expert stack split between
/// ranks; a bucket spanning less than `bucket_size` is its run's only bucket (the owner changes
/// at both ends).
fn check_contiguous(plan: &Plan, cfg: &Config) {
    let muon: Vec<_> = plan.buckets.iter().filter(|b| b.route == Route::Muon).collect();
    let owners_of = |b: &muon_opt::plan::Bucket| -> Vec<u32> {
        b.params
            .iter()
            .flat_map(|&p| plan.param(p as usize).unit_owners.clone())
            .collect()
    };
    let mut last = 0u32;
    for (i, b) in muon.iter().enumerate() {
        let owners = owners_of(b);
        assert!(
            owners.iter().all(|&o| o >= last) && owners.windows(2).all(|w| w[0] <= w[1]),
            "bucket {}: owners decrease",
            b.id
        );
        last = *owners.last().unwrap();
        let split_stack = b.params.iter().any(|&p| {
            let o = &plan.param(p as usize).unit_owners;
            o.first() != o.last()
        });
        assert!(
            owners.first() == owners.last() || split_stack,
            "bucket {}: owners {owners:?} without a split stack",
            b.id
        );
        // Padding included: at least what the planner's closing rule counts.
        let spanned = b.numel();
        if cfg.overlap_grad_reduce && spanned < cfg.effective_bucket_size(plan.dp as usize) {
            let before = (i > 0).then(|| *owners_of(muon[i - 1]).last().unwrap());
            let after = muon.get(i + 1).map(|n| owners_of(n)[0]);
            let continues = |o: Option<u32>, here: u32| o == Some(here) && muon.len() > 1;
            let same_buffer = |j: usize| muon.get(j).is_some_and(|n| n.buffer == b.buffer);
            let run_continues_before = i > 0 && same_buffer(i - 1) && continues(before, owners[0]);
            let run_continues_after = same_buffer(i + 1) && continues(after, *owners.last().unwrap());
            assert!(
                !(run_continues_before || run_continues_after),
                "bucket {} spans {spanned} < bucket_size but its run has another bucket",
                b.id
            );
        }
    }
}

fn plan_without_time(reg: &Registry, cfg: &Config, dp: usize) -> Plan {
    let mut plan = build_plan(reg.params(), reg.routes(), cfg, dp).expect("random models plan");
    plan.report.planning_time_ms = 0.0;
    plan
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn plans_of_random_models_are_valid((reg, (cfg, dp)) in (model(), config())) {
        let plan = plan_without_time(&reg, &cfg, dp);
        check_placement(&plan, &reg);
        if plan.layout != MuonLayout::Padded {
            check_owner_ranges(&plan, &reg);
        }
        check_shards(&plan);
        check_ownership(&plan, &reg, &cfg);
        if cfg.muon_ownership == MuonOwnership::Contiguous {
            check_contiguous(&plan, &cfg);
        }
        let bucket_splits_match_mode = plan.buckets.iter().all(|b| {
            let owner_ranges = matches!(b.split, BucketSplit::OwnerRanges(_));
            let rooted_layout = matches!(plan.layout, MuonLayout::CompactRooted | MuonLayout::Allreduce);
            match (b.route, plan.layout) {
                (Route::Adamw, _) | (_, MuonLayout::Padded) => !owner_ranges,
                (Route::Muon, MuonLayout::Compact) => true,
                (Route::Muon, _) => owner_ranges && rooted_layout,
            }
        });
        prop_assert!(bucket_splits_match_mode);
    }

    #[test]
    fn plans_are_deterministic_and_hash_their_inputs(
        (reg, (cfg, dp)) in (model(), config()),
        pick in any::<prop::sample::Index>(),
    ) {
        let first = plan_without_time(&reg, &cfg, dp);
        let second = plan_without_time(&reg, &cfg, dp);
        prop_assert_eq!(&first, &second);
        let names: Vec<String> = reg.params().iter().map(|s| s.name.clone()).collect();
        prop_assert_eq!(first.to_json(&names), second.to_json(&names));

        let changed = pick.index(reg.len());
        let mut modified = Registry::default();
        for (i, spec) in reg.params().iter().enumerate() {
            let mut spec = spec.clone();
            if i == changed {
                *spec.shape.last_mut().unwrap() += 1;
            }
            modified.add(spec, &Config::default()).unwrap();
        }
        let other = plan_without_time(&modified, &cfg, dp);
        prop_assert_ne!(first.hash, other.hash);
    }
}

//! Consecutive experts of a stack owned by one rank form one Muon job (one strided batch on
//! the GPU); the update is the same as expert by expert, which the parity tests check bitwise.

use muon_opt::config::{Config, Dtype};
use muon_opt::model::{ParamFlags, ParamSpec, Registry};
use muon_opt::plan::build_plan;
use muon_opt::schedule::state::{MAX_BATCH_ELEMENTS, StateLayout};

fn registry(experts: u64, rows: u64, cols: u64) -> Registry {
    let cfg = Config::default();
    let mut reg = Registry::default();
    let mut stack = ParamSpec::new("experts.fc1", &[experts, rows, cols], Dtype::Bf16);
    stack.flags = ParamFlags(ParamFlags::EXPERT_STACK);
    stack.split_sizes = vec![rows / 2, rows / 2];
    reg.add(stack, &cfg).unwrap();
    reg.add(ParamSpec::new("proj", &[cols, cols], Dtype::Bf16), &cfg)
        .unwrap();
    reg
}

#[test]
fn a_ranks_experts_form_one_batch_per_contiguous_run() {
    let cfg = Config::default();
    let reg = registry(8, 64, 32);
    for dp in [1usize, 2, 3] {
        let plan = build_plan(reg.params(), reg.routes(), &cfg, dp).unwrap();
        for rank in 0..dp {
            let layout = StateLayout::new(&plan, reg.params(), &cfg, rank);
            let experts = layout.muon.iter().filter(|s| s.unit.param == 0).count();
            let stack_batches: Vec<_> = layout
                .muon_batches
                .iter()
                .filter(|b| layout.muon[b.first].unit.param == 0)
                .collect();
            if experts > 0 {
                assert_eq!(
                    stack_batches.len(),
                    1,
                    "dp={dp} rank={rank}: one contiguous run of experts, one job"
                );
                assert_eq!(stack_batches[0].count, experts);
            }
            let units: usize = layout.muon_batches.iter().map(|b| b.count).sum();
            assert_eq!(units, layout.muon.len(), "every owned unit is in exactly one batch");
            // Components: an expert's two 32×32 halves, the 32×32 projection.
            let owns_any = !layout.muon.is_empty();
            assert_eq!(
                layout.memory.max_component,
                if owns_any { (32 * 32, 32) } else { (0, 0) }
            );
        }
    }
}

#[test]
fn batches_are_capped_so_the_workspace_stays_bounded() {
    let cfg = Config::default();
    let (rows, cols) = (2048u64, 4096u64);
    let per_batch = (MAX_BATCH_ELEMENTS / (rows * cols)) as usize;
    let reg = registry(per_batch as u64 * 2 + 1, rows, cols);
    let plan = build_plan(reg.params(), reg.routes(), &cfg, 1).unwrap();
    let layout = StateLayout::new(&plan, reg.params(), &cfg, 0);
    let counts: Vec<usize> = layout
        .muon_batches
        .iter()
        .filter(|b| layout.muon[b.first].unit.param == 0)
        .map(|b| b.count)
        .collect();
    assert_eq!(counts, vec![per_batch, per_batch, 1]);
    // The host takes one matrix at a time: its bound is the largest single component (the
    // cols × cols projection; an expert's halves are (rows/2) × cols), not a batch.
    assert_eq!(layout.memory.max_component, ((cols * cols) as usize, cols as usize));
}

/// The Muon workspace is sized by what the jobs need, not by the largest rows times the
/// largest cols of different matrices.
#[test]
fn the_muon_workspace_is_the_real_need_of_the_jobs() {
    use muon_opt::backend::ops::MuonWork;
    use muon_opt::numerics::newton_schulz::NsOptions;
    let ns = NsOptions::from_config(&Config::default());
    // A fused [2·14336, 4096] gate|up: one job of 117M elements whose Gram batch is two
    // 4096² matrices; a [4096, 14336] down projection: 4096² again.
    let gate_up = MuonWork::of_job(&[14336, 14336], 4096, 1, &ns);
    assert_eq!(
        gate_up,
        MuonWork {
            matrix: 28672 * 4096,
            gram: 2 * 4096 * 4096,
            run: 2,
            grouped: 0,
            lines: 28672,
            ..MuonWork::default()
        }
    );
    let down = MuonWork::of_job(&[4096], 14336, 1, &ns);
    assert_eq!(
        down,
        MuonWork {
            matrix: 4096 * 14336,
            gram: 4096 * 4096,
            run: 1,
            grouped: 0,
            lines: 14336,
            ..MuonWork::default()
        }
    );
    assert_eq!(gate_up.max(down), gate_up);
    // Runs of equal components batch; different ones do not.
    let qkv = MuonWork::of_job(&[64, 16, 16], 32, 1, &ns);
    assert_eq!(
        qkv,
        MuonWork {
            matrix: 96 * 32,
            gram: 32 * 32,
            run: 2,
            grouped: 0,
            lines: 64,
            ..MuonWork::default()
        }
    );
    // The same QKV split per query group (4 groups of [16, 4, 4] rows) also needs its update
    // in component order.
    assert_eq!(
        MuonWork::of_job(&[64, 16, 16], 32, 4, &ns),
        MuonWork {
            grouped: 96 * 32,
            ..qkv
        }
    );

    // The layout of a rank carries the need of its own jobs.
    let cfg = Config::default();
    let reg = registry(8, 64, 32);
    let plan = build_plan(reg.params(), reg.routes(), &cfg, 1).unwrap();
    let layout = StateLayout::new(&plan, reg.params(), &cfg, 0);
    // All 8 experts in one job: 16 components of 32×32, and the 32×32 projection.
    assert_eq!(
        layout.memory.muon_work,
        MuonWork {
            matrix: 8 * 64 * 32,
            gram: 16 * 32 * 32,
            run: 16,
            grouped: 0,
            lines: 512,
            ..MuonWork::default()
        }
    );
}

/// With `muon_ns_method = gram` the workspace holds the Gram iteration's square matrices for
/// the batches that run it (`n/m ≥ 1.5`, `numerics::newton_schulz::runs_gram`) and no others:
/// the largest such `count · m²`, 0 when every matrix is square.
#[test]
fn the_gram_iteration_workspace_is_the_need_of_the_batches_that_run_it() {
    use muon_opt::backend::ops::MuonWork;
    use muon_opt::config::NsMethod;
    use muon_opt::numerics::newton_schulz::NsOptions;
    let gram = NsOptions::from_config(&Config {
        muon_ns_method: NsMethod::Gram,
        ..Config::default()
    });
    let iteration = |rows: &[usize], cols| MuonWork::of_job(rows, cols, 1, &gram).gram_iteration;
    assert_eq!(iteration(&[14336, 14336], 4096), 2 * 4096 * 4096);
    assert_eq!(iteration(&[4096], 14336), 4096 * 4096);
    assert_eq!(iteration(&[4096], 4096), 0);
    // 1024 × 1536 is at the threshold; 1024 × 1535 is below it.
    assert_eq!(iteration(&[1024], 1536), 1024 * 1024);
    assert_eq!(iteration(&[1024], 1535), 0);
    // A fused QKV: the 32 × 64 query runs it (32²), the pair of 16 × 32 keys and values too
    // (2 · 16²), the largest is kept; the square projection does not.
    assert_eq!(iteration(&[64, 16, 16], 32), 32 * 32);
    assert_eq!(iteration(&[32, 32, 32], 32), 0);
    // The standard method and bf16 with more than 5 steps (where the rule disables it) need none.
    let standard = NsOptions::from_config(&Config::default());
    assert_eq!(MuonWork::of_job(&[4096], 14336, 1, &standard).gram_iteration, 0);
    let long = NsOptions { steps: 8, ..gram };
    assert_eq!(MuonWork::of_job(&[4096], 14336, 1, &long).gram_iteration, 0);
    let reg = registry(8, 64, 32);
    let cfg = Config {
        muon_ns_method: NsMethod::Gram,
        ..Config::default()
    };
    let plan = build_plan(reg.params(), reg.routes(), &cfg, 1).unwrap();
    let layout = StateLayout::new(&plan, reg.params(), &cfg, 0);
    // 16 expert halves of 32 × 32 (square) and the 32 × 32 projection: none runs it.
    assert_eq!(layout.memory.muon_work.gram_iteration, 0);
}

//! An f32 param is its own fp32 master (issue 43, item 12): the owner's part of the param
//! buffer is what the step updates, so there is no second f32 copy of it — 4 bytes per element
//! less — and the training is the same bits at every dp, layout and ownership.

mod support;

use muon_opt::config::{Config, Dtype, MuonLayout, MuonOwnership};
use muon_opt::model::ParamSpec;
use muon_opt::schedule::{StepArgs, StepOverrides};
use support::checkpoint::{Group, config, model};
use support::training::bits;

/// The checkpoint tests' model with every param in `dtype`.
fn model_in(dtype: Dtype) -> Vec<ParamSpec> {
    model().into_iter().map(|spec| ParamSpec { dtype, ..spec }).collect()
}

fn state_bytes(cfg: &Config, specs: &[ParamSpec], dp: usize) -> u64 {
    let mut group = Group::with_model(cfg, dp, specs);
    let per_rank = group.run(|rank, opt| opt.plan().unwrap().report.optimizer_state_bytes.per_rank[rank]);
    per_rank.iter().sum()
}

#[test]
fn an_f32_param_has_no_second_master_copy() {
    let cfg = config(MuonLayout::Compact);
    for dp in [1, 3] {
        let numel: u64 = model().iter().map(ParamSpec::numel).sum();
        let (f32_bytes, bf16_bytes) = (
            state_bytes(&cfg, &model_in(Dtype::F32), dp),
            state_bytes(&cfg, &model_in(Dtype::Bf16), dp),
        );
        assert_eq!(
            bf16_bytes - f32_bytes,
            4 * numel,
            "dp {dp}: a master per bf16 element only"
        );
    }
}

#[test]
fn an_f32_model_trains_alike_at_every_dp_layout_and_ownership() {
    let specs = model_in(Dtype::F32);
    let layouts = [
        MuonLayout::Compact,
        MuonLayout::CompactRooted,
        MuonLayout::Padded,
        MuonLayout::Allreduce,
    ];
    for layout in layouts {
        for ownership in [MuonOwnership::Balanced, MuonOwnership::Contiguous] {
            if ownership == MuonOwnership::Contiguous && !layout.takes_contiguous_ownership() {
                continue;
            }
            let cfg = Config {
                muon_ownership: ownership,
                ..config(layout)
            };
            let reference = {
                let mut group = Group::with_model(&cfg, 1, &specs);
                group.train(3);
                group.snapshot()
            };
            for (p, state) in reference.state.iter().enumerate() {
                assert!(
                    bits(&state[0]) == bits(&reference.params[0][p]),
                    "the master of {} is its param",
                    specs[p].name
                );
            }
            for dp in [2, 3] {
                let mut group = Group::with_model(&cfg, dp, &specs);
                group.train(3);
                group
                    .snapshot()
                    .assert_same(&reference, &format!("{layout:?} {ownership:?} dp {dp}"));
            }
        }
    }
}

/// A value written into an f32 param's buffer between steps is its master from then on; a bf16
/// param's buffer is a copy of its master, which the next step writes again.
#[test]
fn a_write_into_an_f32_params_buffer_is_its_new_master() {
    const WRITTEN: f32 = 0.5;
    let specs = model();
    let mut group = Group::with_model(&config(MuonLayout::Compact), 2, &specs);
    group.train(1);
    let before = group.snapshot();
    let standing = StepArgs {
        lr: 0.0,
        weight_decay: 0.0,
        adam_lr: 0.0,
        adam_weight_decay: 0.0,
        overrides: StepOverrides::NONE,
    };
    group.run(|_, opt| {
        for (p, spec) in model().iter().enumerate() {
            let rt = opt.running().unwrap();
            let n = spec.numel() as usize;
            match spec.dtype {
                Dtype::F32 => {
                    let ptr = rt.address(p, false).cast::<f32>();
                    // SAFETY: the model-dtype view of param p holds numel f32 values.
                    unsafe { std::slice::from_raw_parts_mut(ptr, n) }.fill(WRITTEN);
                }
                Dtype::Bf16 => {
                    let ptr = rt.address(p, false).cast::<u16>();
                    // SAFETY: the model-dtype view of param p holds numel bf16 values.
                    unsafe { std::slice::from_raw_parts_mut(ptr, n) }.fill((WRITTEN.to_bits() >> 16) as u16);
                }
            }
        }
        opt.zero_grad().unwrap();
        assert!(!opt.step(&standing).unwrap().skipped);
        for b in 0..opt.plan().unwrap().buckets.len() as u32 {
            opt.wait_params(b).unwrap();
        }
    });
    let after = group.snapshot();
    for (p, spec) in specs.iter().enumerate() {
        let expected = match spec.dtype {
            Dtype::F32 => vec![WRITTEN; spec.numel() as usize],
            _ => before.params[0][p].clone(),
        };
        for (rank, params) in after.params.iter().enumerate() {
            assert!(
                bits(&params[p]) == bits(&expected),
                "rank {rank} holds {} as {:?}",
                spec.name,
                &params[p][..2]
            );
        }
        let master = &after.state[p][0];
        let expected_master = match spec.dtype {
            Dtype::F32 => &expected,
            _ => &before.state[p][0],
        };
        assert!(bits(master) == bits(expected_master), "master of {}", spec.name);
    }
}

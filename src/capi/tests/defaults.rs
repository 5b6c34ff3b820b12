//! The defaults Megatron-LM parity changed, through the exports as C calls them: the
//! duplicated TP mode and the weight-decay rule of the current config layout, the blockwise
//! mode and the flagged rule that a caller compiled against an older layout keeps, the flags
//! that override the rule, and the decoupled AdamW learning rate of the embedding and output
//! params.

use std::ffi::CString;
use std::ptr::null_mut;

use super::{default_config, desc, last_error, single_rank_optimizer, teardown};
use crate::capi::config::muon_config_t;
use crate::capi::constants::*;
use crate::capi::iteration::*;
use crate::capi::optimizer::*;
use crate::capi::param::muon_param_view_t;
use crate::capi::status::muon_status_t::{self, *};

/// One registered param: name, shape, flags.
type Param<'a> = (&'a str, &'a [i64], u32);

/// Registers `params` (f32, every value 1 + its index / 64) on a one-rank optimizer with `cfg`,
/// finalizes, then runs two steps with `args`, each with the gradients `grad(param, element,
/// step)`; returns every param's values, or the status and message of the first call refused.
fn run(
    cfg: &muon_config_t,
    params: &[Param],
    args: &muon_step_args_t,
    grad: impl Fn(usize, usize, usize) -> f32,
) -> Result<Vec<Vec<f32>>, (muon_status_t, String)> {
    let (comm, opt) = single_rank_optimizer(cfg);
    let result = (|| {
        let check = |status: muon_status_t| {
            if status == MUON_STATUS_SUCCESS {
                Ok(())
            } else {
                Err((status, last_error()))
            }
        };
        let mut numels = Vec::new();
        for &(name, shape, flags) in params {
            let name = CString::new(name).unwrap();
            let numel = shape.iter().product::<i64>() as usize;
            let init: Vec<f32> = (0..numel).map(|i| 1.0 + i as f32 / 64.0).collect();
            let mut d = desc(&name, shape);
            d.flags = flags;
            d.dtype = MUON_DTYPE_F32;
            d.init_data = init.as_ptr().cast();
            check(unsafe { muon_optimizer_add_param(opt, &d, null_mut()) })?;
            numels.push(numel);
        }
        check(unsafe { muon_optimizer_finalize(opt) })?;
        let views: Vec<muon_param_view_t> = (0..params.len())
            .map(|p| {
                let mut view = unsafe { std::mem::zeroed::<muon_param_view_t>() };
                view.struct_size = std::mem::size_of::<muon_param_view_t>() as u32;
                assert_eq!(
                    unsafe { muon_optimizer_param_view(opt, p as u32, &mut view) },
                    MUON_STATUS_SUCCESS
                );
                view
            })
            .collect();
        for step in 0..2 {
            check(unsafe { muon_optimizer_zero_grad(opt) })?;
            for (p, view) in views.iter().enumerate() {
                // SAFETY: the host backend's f32 gradient of the param (the default grad dtype).
                let g = unsafe { std::slice::from_raw_parts_mut(view.grad.cast::<f32>(), numels[p]) };
                for (i, value) in g.iter_mut().enumerate() {
                    *value = grad(p, i, step);
                }
            }
            check(unsafe { muon_optimizer_step(opt, args, null_mut()) })?;
        }
        check(unsafe { muon_optimizer_synchronize(opt) })?;
        // SAFETY: the host backend's f32 values of each param.
        Ok(views
            .iter()
            .zip(&numels)
            .map(|(view, &n)| unsafe { std::slice::from_raw_parts(view.data.cast::<f32>(), n) }.to_vec())
            .collect())
    })();
    teardown(comm, opt);
    result
}

fn args(adam_lr: f32, adam_weight_decay: f32) -> muon_step_args_t {
    muon_step_args_t {
        struct_size: std::mem::size_of::<muon_step_args_t>() as u32,
        lr: 0.02,
        weight_decay: 0.1,
        adam_lr,
        adam_weight_decay,
        ..Default::default()
    }
}

/// A TP-sharded Muon matrix with no TP group: refused at finalize in the current layout's
/// default mode (duplicated gathers the shards over that group), accepted — blockwise, each
/// shard on its own — for a caller of the 104-byte layout (which has no muon_tp_mode) and for
/// one of an older layout holding the MUON_TP_MODE_BLOCKWISE its MUON_CONFIG_INIT wrote.
#[test]
fn the_default_tp_mode_is_duplicated_and_older_layouts_keep_blockwise() {
    let shard: &[Param] = &[("fc1.weight", &[8, 16], MUON_PARAM_FLAG_TP_SHARD_ROWS)];
    let step = args(1e-3, 0.0);
    let no_grad = |_: usize, _: usize, _: usize| 0.0;
    let (status, message) = run(&default_config(), shard, &step, no_grad).unwrap_err();
    assert_eq!(status, MUON_STATUS_INVALID_STATE, "{message}");
    assert!(
        message.contains("muon_tp_mode duplicated orthogonalizes TP-sharded Muon params ('fc1.weight')")
            && message.contains("call muon_optimizer_set_tp_group first"),
        "{message}"
    );
    let mut old = default_config();
    old.struct_size = 104;
    run(&old, shard, &step, no_grad).expect("the 104-byte layout reads blockwise");
    for size in [112, 136] {
        old.struct_size = size;
        old.muon_tp_mode = MUON_TP_MODE_BLOCKWISE;
        run(&old, shard, &step, no_grad).expect("an explicit blockwise stays blockwise");
    }
}

/// What a step with zero gradients leaves of each param: its decoupled decay alone
/// (`1 − lr·wd` per step), so a param is decayed iff its values moved.
fn decayed(cfg: &muon_config_t, params: &[Param]) -> Result<Vec<bool>, (muon_status_t, String)> {
    let after = run(cfg, params, &args(0.1, 0.5), |_, _, _| 0.0)?;
    Ok(after.iter().map(|values| values[0] != 1.0).collect())
}

/// The AdamW weight decay of the current layout's default rule is Megatron-LM's: no decay for
/// 1-D params and `*.bias` (a 2-D bias too), decay for the rest, an embedding included;
/// MUON_WEIGHT_DECAY_RULE_MEGATRON_QK_LAYERNORM decays the QK layernorms as well; a caller of
/// the 136-byte layout (or older) keeps the flagged rule: every param decayed unless flagged.
/// MUON_PARAM_FLAG_WEIGHT_DECAY decays a param the rule exempts, NO_WEIGHT_DECAY exempts any,
/// and both on one param are refused naming it.
#[test]
fn weight_decay_follows_megatron_for_1d_params_and_biases_unless_flagged() {
    let model: Vec<Param> = vec![
        ("layers.0.w", &[16, 8], 0),
        ("layers.0.norm.weight", &[8], 0),
        ("layers.0.proj.bias", &[8], 0),
        ("layers.0.adapter.bias", &[4, 8], 0),
        ("layers.0.self_attention.q_layernorm.weight", &[8], 0),
        (
            "embedding.word_embeddings.weight",
            &[32, 8],
            MUON_PARAM_FLAG_EMBEDDING_OR_OUTPUT,
        ),
    ];
    let mut cfg = default_config();
    assert_eq!(decayed(&cfg, &model).unwrap(), [true, false, false, false, false, true]);
    cfg.weight_decay_rule = MUON_WEIGHT_DECAY_RULE_MEGATRON_QK_LAYERNORM;
    assert_eq!(decayed(&cfg, &model).unwrap(), [true, false, false, false, true, true]);
    cfg.weight_decay_rule = MUON_WEIGHT_DECAY_RULE_FLAGGED;
    assert_eq!(decayed(&cfg, &model).unwrap(), [true; 6]);
    let mut old = default_config();
    old.struct_size = 136;
    old.weight_decay_rule = MUON_WEIGHT_DECAY_RULE_MEGATRON;
    assert_eq!(
        decayed(&old, &model).unwrap(),
        [true; 6],
        "the 136-byte layout reads flagged"
    );
    let mut flagged = model.clone();
    flagged[1].2 = MUON_PARAM_FLAG_WEIGHT_DECAY;
    flagged[5].2 |= MUON_PARAM_FLAG_NO_WEIGHT_DECAY;
    assert_eq!(
        decayed(&default_config(), &flagged).unwrap(),
        [true, true, false, false, false, false]
    );
    flagged[2].2 = MUON_PARAM_FLAG_WEIGHT_DECAY | MUON_PARAM_FLAG_NO_WEIGHT_DECAY;
    let (status, message) = decayed(&default_config(), &flagged).unwrap_err();
    assert_eq!(status, MUON_STATUS_INVALID_PARAM, "{message}");
    assert!(
        message.contains("param 'layers.0.proj.bias': NO_WEIGHT_DECAY and WEIGHT_DECAY both set"),
        "{message}"
    );
}

/// MUON_STEP_OVERRIDE_DECOUPLED_LR: the params flagged EMBEDDING_OR_OUTPUT step with
/// decoupled_lr, bit for bit as when adam_lr is that value, and every other AdamW param with
/// adam_lr, bit for bit as without the override; without the bit the embedding steps with
/// adam_lr.
#[test]
fn the_decoupled_lr_steps_the_embedding_and_output_params_only() {
    let model: Vec<Param> = vec![
        ("embedding.weight", &[32, 8], MUON_PARAM_FLAG_EMBEDDING_OR_OUTPUT),
        ("layers.0.w", &[16, 8], 0),
        ("layers.0.norm.weight", &[8], MUON_PARAM_FLAG_WEIGHT_DECAY),
        ("output_layer.weight", &[32, 8], MUON_PARAM_FLAG_EMBEDDING_OR_OUTPUT),
    ];
    let grad = |p: usize, i: usize, step: usize| ((p * 7 + i * 3 + step) % 5) as f32 - 2.0;
    let cfg = default_config();
    let decoupled = muon_step_args_t {
        overrides: MUON_STEP_OVERRIDE_DECOUPLED_LR,
        decoupled_lr: 2e-2,
        ..args(1e-3, 0.01)
    };
    let got = run(&cfg, &model, &decoupled, grad).unwrap();
    let at_adam_lr = run(&cfg, &model, &args(1e-3, 0.01), grad).unwrap();
    let at_decoupled_lr = run(&cfg, &model, &args(2e-2, 0.01), grad).unwrap();
    for p in [0, 3] {
        assert_eq!(got[p], at_decoupled_lr[p], "{}", model[p].0);
        assert_ne!(got[p], at_adam_lr[p], "{}", model[p].0);
    }
    assert_eq!(got[1], at_adam_lr[1], "the Muon matrix");
    assert_eq!(got[2], at_adam_lr[2], "the norm steps with adam_lr");
    assert_ne!(got[2], at_decoupled_lr[2], "the norm steps with adam_lr");
    let unset = muon_step_args_t {
        overrides: 0,
        ..decoupled
    };
    assert_eq!(run(&cfg, &model, &unset, grad).unwrap(), at_adam_lr);
}

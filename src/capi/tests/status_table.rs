//! Every entry point of `include/muon_opt.h` against the statuses the header documents, as one
//! table: a NULL handle or out-pointer is `NULL_ARGUMENT`, a call in the wrong state is
//! `INVALID_STATE`, an unknown id is `INVALID_ARGUMENT`, a wrong `struct_size` is
//! `ABI_MISMATCH`; each failure names its function in `muon_last_error_message()`. A function
//! the header declares but the table lacks fails the test.

use std::collections::BTreeSet;
use std::ffi::{CStr, c_char};
use std::ptr::{null, null_mut};

use super::{default_config, desc, host_group, last_error, one_param_optimizer, teardown};
use crate::capi::checkpoint::*;
use crate::capi::comm::*;
use crate::capi::config::*;
use crate::capi::iteration::*;
use crate::capi::mxfp8::*;
use crate::capi::optimizer::*;
use crate::capi::param::*;
use crate::capi::qk_clip::*;
use crate::capi::status::muon_status_t::{self, *};
use crate::capi::status::{muon_last_error_message, muon_status_string};
use crate::capi::version::muon_get_version;

/// The optimizer states a row runs in.
#[derive(Clone, Copy, Debug)]
enum State {
    /// No optimizer: the call gets NULL (or needs none).
    None,
    /// Created, one param registered, not finalized.
    Registering,
    /// Finalized.
    Finalized,
}

struct Row {
    function: &'static str,
    what: &'static str,
    state: State,
    call: fn(*mut muon_optimizer_t) -> muon_status_t,
    expected: muon_status_t,
}

fn args() -> muon_step_args_t {
    muon_step_args_t {
        struct_size: std::mem::size_of::<muon_step_args_t>() as u32,
        lr: 0.02,
        weight_decay: 0.0,
        adam_lr: 1e-3,
        adam_weight_decay: 0.0,
        ..Default::default()
    }
}

fn info(struct_size: u32) -> muon_step_info_t {
    let mut info = unsafe { std::mem::zeroed::<muon_step_info_t>() };
    info.struct_size = struct_size;
    info
}

fn view(struct_size: u32) -> muon_param_view_t {
    let mut view = unsafe { std::mem::zeroed::<muon_param_view_t>() };
    view.struct_size = struct_size;
    view
}

/// A query-projection clip of the fixture's 16 × 8 param: 2 heads of `head_dim` rows.
fn qk(struct_size: u32, head_dim: u32) -> muon_qk_clip_t {
    static MAXIMA: [f32; 2] = [1.0, 300.0];
    muon_qk_clip_t {
        struct_size,
        param_id: 0,
        kind: MUON_QK_KIND_QUERY,
        num_heads: 2,
        num_query_groups: 2,
        head_dim,
        rope_dim: 0,
        v_head_dim: 0,
        max_logits: MAXIMA.as_ptr(),
    }
}

const QK_SIZE: u32 = std::mem::size_of::<muon_qk_clip_t>() as u32;
const INFO_SIZE: u32 = std::mem::size_of::<muon_step_info_t>() as u32;
const VIEW_SIZE: u32 = std::mem::size_of::<muon_param_view_t>() as u32;
const DIR: &CStr = c"/nonexistent/muon-status-table";

macro_rules! row {
    ($function:literal, $what:literal, $state:ident, $expected:ident, |$opt:ident| $body:expr) => {
        Row {
            function: $function,
            what: $what,
            state: State::$state,
            call: |$opt| {
                let _ = $opt;
                unsafe { $body }
            },
            expected: $expected,
        }
    };
}

fn table() -> Vec<Row> {
    vec![
        row!(
            "muon_host_group_create",
            "NULL comms",
            None,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_host_group_create(2, null_mut())
        ),
        row!(
            "muon_host_group_create",
            "world_size 0",
            None,
            MUON_STATUS_OUT_OF_RANGE,
            |o| muon_host_group_create(0, [null_mut(); 1].as_mut_ptr())
        ),
        row!(
            "muon_comm_create_nccl",
            "NULL nccl",
            None,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_comm_create_nccl(null_mut(), [null_mut(); 1].as_mut_ptr())
        ),
        row!("muon_comm_rank", "NULL comm", None, MUON_STATUS_NULL_ARGUMENT, |o| {
            muon_comm_rank(null(), &mut 0)
        }),
        row!("muon_comm_size", "NULL comm", None, MUON_STATUS_NULL_ARGUMENT, |o| {
            muon_comm_size(null(), &mut 0)
        }),
        row!(
            "muon_comm_destroy",
            "an optimizer handle",
            Registering,
            MUON_STATUS_INVALID_HANDLE,
            |o| muon_comm_destroy(o.cast())
        ),
        row!(
            "muon_config_validate",
            "NULL cfg",
            None,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_config_validate(null())
        ),
        row!(
            "muon_config_validate",
            "struct_size 0",
            None,
            MUON_STATUS_ABI_MISMATCH,
            |o| muon_config_validate(&std::mem::zeroed())
        ),
        row!(
            "muon_optimizer_create",
            "NULL comm",
            None,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_optimizer_create(&default_config(), null_mut(), null_mut(), &mut null_mut())
        ),
        row!(
            "muon_optimizer_add_param",
            "NULL opt",
            None,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_optimizer_add_param(o, &desc(c"w", &[16, 8]), null_mut())
        ),
        row!(
            "muon_optimizer_add_param",
            "after finalize",
            Finalized,
            MUON_STATUS_INVALID_STATE,
            |o| muon_optimizer_add_param(o, &desc(c"late", &[16, 8]), null_mut())
        ),
        row!(
            "muon_optimizer_set_norm_group",
            "NULL group",
            Registering,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_optimizer_set_norm_group(o, null_mut())
        ),
        row!(
            "muon_optimizer_set_norm_group",
            "after finalize",
            Finalized,
            MUON_STATUS_INVALID_STATE,
            |o| muon_optimizer_set_norm_group(o, host_group(1)[0])
        ),
        row!(
            "muon_optimizer_set_tp_group",
            "NULL group",
            Registering,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_optimizer_set_tp_group(o, null_mut())
        ),
        row!(
            "muon_optimizer_set_tp_group",
            "after finalize",
            Finalized,
            MUON_STATUS_INVALID_STATE,
            |o| muon_optimizer_set_tp_group(o, host_group(1)[0])
        ),
        row!(
            "muon_optimizer_set_tp_group",
            "NULL opt",
            None,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_optimizer_set_tp_group(o, host_group(1)[0])
        ),
        row!(
            "muon_optimizer_param_route",
            "NULL route",
            Registering,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_optimizer_param_route(o, 0, null_mut())
        ),
        row!(
            "muon_optimizer_param_route",
            "unknown id",
            Registering,
            MUON_STATUS_INVALID_ARGUMENT,
            |o| muon_optimizer_param_route(o, 7, &mut 0)
        ),
        row!(
            "muon_optimizer_set_param_scales",
            "NULL opt",
            None,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_optimizer_set_param_scales(o, 0, 1.0, 1.0)
        ),
        row!(
            "muon_optimizer_set_param_scales",
            "before finalize",
            Registering,
            MUON_STATUS_INVALID_STATE,
            |o| muon_optimizer_set_param_scales(o, 0, 1.0, 1.0)
        ),
        row!(
            "muon_optimizer_set_param_scales",
            "unknown id",
            Finalized,
            MUON_STATUS_INVALID_ARGUMENT,
            |o| muon_optimizer_set_param_scales(o, 7, 1.0, 1.0)
        ),
        row!(
            "muon_optimizer_set_param_scales",
            "a negative lr_scale",
            Finalized,
            MUON_STATUS_OUT_OF_RANGE,
            |o| muon_optimizer_set_param_scales(o, 0, -1.0, 1.0)
        ),
        row!(
            "muon_optimizer_set_param_scales",
            "a NaN wd_scale",
            Finalized,
            MUON_STATUS_OUT_OF_RANGE,
            |o| muon_optimizer_set_param_scales(o, 0, 1.0, f32::NAN)
        ),
        row!(
            "muon_optimizer_finalize",
            "NULL opt",
            None,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_optimizer_finalize(o)
        ),
        row!(
            "muon_optimizer_finalize",
            "twice",
            Finalized,
            MUON_STATUS_INVALID_STATE,
            |o| muon_optimizer_finalize(o)
        ),
        row!(
            "muon_optimizer_num_buckets",
            "before finalize",
            Registering,
            MUON_STATUS_INVALID_STATE,
            |o| muon_optimizer_num_buckets(o, &mut 0)
        ),
        row!(
            "muon_optimizer_num_buckets",
            "NULL count",
            Finalized,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_optimizer_num_buckets(o, null_mut())
        ),
        row!(
            "muon_optimizer_plan_json",
            "before finalize",
            Registering,
            MUON_STATUS_INVALID_STATE,
            |o| muon_optimizer_plan_json(o, null_mut(), 0, &mut 0)
        ),
        row!(
            "muon_optimizer_plan_json",
            "NULL len",
            Finalized,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_optimizer_plan_json(o, null_mut(), 0, null_mut())
        ),
        row!(
            "muon_optimizer_plan_json",
            "cap too small",
            Finalized,
            MUON_STATUS_BUFFER_TOO_SMALL,
            |o| muon_optimizer_plan_json(o, [0 as c_char; 4].as_mut_ptr(), 4, &mut 0)
        ),
        row!(
            "muon_optimizer_param_view",
            "before finalize",
            Registering,
            MUON_STATUS_INVALID_STATE,
            |o| muon_optimizer_param_view(o, 0, &mut view(VIEW_SIZE))
        ),
        row!(
            "muon_optimizer_param_view",
            "unknown id",
            Finalized,
            MUON_STATUS_INVALID_ARGUMENT,
            |o| muon_optimizer_param_view(o, 7, &mut view(VIEW_SIZE))
        ),
        row!(
            "muon_optimizer_param_view",
            "struct_size 0",
            Finalized,
            MUON_STATUS_ABI_MISMATCH,
            |o| muon_optimizer_param_view(o, 0, &mut view(0))
        ),
        row!(
            "muon_optimizer_zero_grad",
            "NULL opt",
            None,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_optimizer_zero_grad(o)
        ),
        row!(
            "muon_optimizer_zero_grad",
            "before finalize",
            Registering,
            MUON_STATUS_INVALID_STATE,
            |o| muon_optimizer_zero_grad(o)
        ),
        row!(
            "muon_optimizer_wait_params",
            "before finalize",
            Registering,
            MUON_STATUS_INVALID_STATE,
            |o| muon_optimizer_wait_params(o, 0)
        ),
        row!(
            "muon_optimizer_wait_params",
            "unknown bucket",
            Finalized,
            MUON_STATUS_INVALID_ARGUMENT,
            |o| muon_optimizer_wait_params(o, 99)
        ),
        row!(
            "muon_optimizer_gather_params",
            "NULL opt",
            None,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_optimizer_gather_params(o, 0)
        ),
        row!(
            "muon_optimizer_gather_params",
            "before finalize",
            Registering,
            MUON_STATUS_INVALID_STATE,
            |o| muon_optimizer_gather_params(o, 0)
        ),
        row!(
            "muon_optimizer_gather_params",
            "unknown bucket",
            Finalized,
            MUON_STATUS_INVALID_ARGUMENT,
            |o| muon_optimizer_gather_params(o, 99)
        ),
        row!(
            "muon_optimizer_release_params",
            "NULL opt",
            None,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_optimizer_release_params(o, 0)
        ),
        row!(
            "muon_optimizer_release_params",
            "before finalize",
            Registering,
            MUON_STATUS_INVALID_STATE,
            |o| muon_optimizer_release_params(o, 0)
        ),
        row!(
            "muon_optimizer_release_params",
            "unknown bucket",
            Finalized,
            MUON_STATUS_INVALID_ARGUMENT,
            |o| muon_optimizer_release_params(o, 99)
        ),
        row!(
            "muon_optimizer_grad_ready",
            "before finalize",
            Registering,
            MUON_STATUS_INVALID_STATE,
            |o| muon_optimizer_grad_ready(o, 0)
        ),
        row!(
            "muon_optimizer_grad_ready",
            "unknown id",
            Finalized,
            MUON_STATUS_INVALID_ARGUMENT,
            |o| muon_optimizer_grad_ready(o, 7)
        ),
        row!(
            "muon_optimizer_qk_clip",
            "NULL opt",
            None,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_optimizer_qk_clip(o, &qk(QK_SIZE, 8), 1, 100.0, 0.5)
        ),
        row!(
            "muon_optimizer_qk_clip",
            "before finalize",
            Registering,
            MUON_STATUS_INVALID_STATE,
            |o| muon_optimizer_qk_clip(o, &qk(QK_SIZE, 8), 1, 100.0, 0.5)
        ),
        row!(
            "muon_optimizer_qk_clip",
            "NULL clips",
            Finalized,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_optimizer_qk_clip(o, null(), 1, 100.0, 0.5)
        ),
        row!(
            "muon_optimizer_qk_clip",
            "clip struct_size 0",
            Finalized,
            MUON_STATUS_ABI_MISMATCH,
            |o| muon_optimizer_qk_clip(o, &qk(0, 8), 1, 100.0, 0.5)
        ),
        row!(
            "muon_optimizer_qk_clip",
            "rows not matching the head layout",
            Finalized,
            MUON_STATUS_INVALID_ARGUMENT,
            |o| muon_optimizer_qk_clip(o, &qk(QK_SIZE, 4), 1, 100.0, 0.5)
        ),
        row!(
            "muon_optimizer_step",
            "before finalize",
            Registering,
            MUON_STATUS_INVALID_STATE,
            |o| muon_optimizer_step(o, &args(), null_mut())
        ),
        row!(
            "muon_optimizer_step",
            "NULL args before set_step_args",
            Finalized,
            MUON_STATUS_INVALID_STATE,
            |o| muon_optimizer_step(o, null(), null_mut())
        ),
        row!(
            "muon_optimizer_step",
            "info struct_size 0",
            Finalized,
            MUON_STATUS_ABI_MISMATCH,
            |o| muon_optimizer_step(o, &args(), &mut info(0))
        ),
        row!(
            "muon_optimizers_step",
            "NULL opts",
            None,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_optimizers_step(null(), 1, null())
        ),
        row!(
            "muon_optimizers_step",
            "NULL opts[0]",
            None,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_optimizers_step([null_mut()].as_ptr(), 1, null())
        ),
        row!(
            "muon_optimizers_step",
            "count 0",
            Finalized,
            MUON_STATUS_INVALID_ARGUMENT,
            |o| muon_optimizers_step([o].as_ptr(), 0, null())
        ),
        row!(
            "muon_optimizers_step",
            "count 9",
            Finalized,
            MUON_STATUS_INVALID_ARGUMENT,
            |o| muon_optimizers_step([o; 9].as_ptr(), 9, null())
        ),
        row!(
            "muon_optimizers_step",
            "the same optimizer twice",
            Finalized,
            MUON_STATUS_INVALID_ARGUMENT,
            |o| muon_optimizers_step([o, o].as_ptr(), 2, null())
        ),
        row!(
            "muon_optimizers_step",
            "before finalize",
            Registering,
            MUON_STATUS_INVALID_STATE,
            |o| muon_optimizers_step([o].as_ptr(), 1, &args())
        ),
        row!(
            "muon_optimizers_step",
            "NULL args before set_step_args",
            Finalized,
            MUON_STATUS_INVALID_STATE,
            |o| muon_optimizers_step([o].as_ptr(), 1, null())
        ),
        row!(
            "muon_optimizers_step",
            "args struct_size 0",
            Finalized,
            MUON_STATUS_ABI_MISMATCH,
            |o| muon_optimizers_step(
                [o].as_ptr(),
                1,
                &muon_step_args_t {
                    struct_size: 0,
                    ..args()
                }
            )
        ),
        row!(
            "muon_optimizer_set_step_args",
            "NULL args",
            Finalized,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_optimizer_set_step_args(o, null())
        ),
        row!(
            "muon_optimizer_set_step_args",
            "before finalize",
            Registering,
            MUON_STATUS_INVALID_STATE,
            |o| muon_optimizer_set_step_args(o, &args())
        ),
        row!(
            "muon_optimizer_step_info",
            "before finalize",
            Registering,
            MUON_STATUS_INVALID_STATE,
            |o| muon_optimizer_step_info(o, &mut info(INFO_SIZE))
        ),
        row!(
            "muon_optimizer_step_info",
            "NULL info",
            Finalized,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_optimizer_step_info(o, null_mut())
        ),
        row!(
            "muon_optimizer_join",
            "before finalize",
            Registering,
            MUON_STATUS_INVALID_STATE,
            |o| muon_optimizer_join(o)
        ),
        row!(
            "muon_optimizer_synchronize",
            "before finalize",
            Registering,
            MUON_STATUS_INVALID_STATE,
            |o| muon_optimizer_synchronize(o)
        ),
        row!(
            "muon_optimizer_save",
            "before finalize",
            Registering,
            MUON_STATUS_INVALID_STATE,
            |o| muon_optimizer_save(o, DIR.as_ptr())
        ),
        row!(
            "muon_optimizer_save",
            "NULL dir",
            Finalized,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_optimizer_save(o, null())
        ),
        row!(
            "muon_optimizer_load",
            "NULL dir",
            Finalized,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_optimizer_load(o, null())
        ),
        row!(
            "muon_optimizer_load",
            "missing directory",
            Finalized,
            MUON_STATUS_IO_ERROR,
            |o| muon_optimizer_load(o, DIR.as_ptr())
        ),
        row!(
            "muon_optimizer_load_union",
            "NULL dirs",
            Finalized,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_optimizer_load_union(o, null(), 1)
        ),
        row!(
            "muon_optimizer_load_union",
            "count 0",
            Finalized,
            MUON_STATUS_INVALID_ARGUMENT,
            |o| muon_optimizer_load_union(o, [DIR.as_ptr()].as_ptr(), 0)
        ),
        row!(
            "muon_optimizer_load_union",
            "NULL dirs[1]",
            Finalized,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_optimizer_load_union(o, [DIR.as_ptr(), null()].as_ptr(), 2)
        ),
        row!(
            "muon_optimizer_load_union",
            "before finalize",
            Registering,
            MUON_STATUS_INVALID_STATE,
            |o| muon_optimizer_load_union(o, [DIR.as_ptr()].as_ptr(), 1)
        ),
        row!(
            "muon_optimizer_load_union",
            "missing directory",
            Finalized,
            MUON_STATUS_IO_ERROR,
            |o| muon_optimizer_load_union(o, [DIR.as_ptr()].as_ptr(), 1)
        ),
        row!(
            "muon_optimizer_destroy",
            "a comm handle",
            None,
            MUON_STATUS_INVALID_HANDLE,
            |o| muon_optimizer_destroy(host_group(1)[0].cast())
        ),
        row!(
            "muon_newton_schulz_host",
            "NULL in",
            None,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_newton_schulz_host(null(), [0f32; 4].as_mut_ptr(), 2, 2, 0, 5, 1)
        ),
        row!(
            "muon_newton_schulz_host",
            "rows 0",
            None,
            MUON_STATUS_OUT_OF_RANGE,
            |o| muon_newton_schulz_host([0f32; 4].as_ptr(), [0f32; 4].as_mut_ptr(), 0, 2, 0, 5, 1)
        ),
        row!(
            "muon_newton_schulz_host_config",
            "NULL out",
            None,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_newton_schulz_host_config([0f32; 4].as_ptr(), null_mut(), 2, 2, &default_config())
        ),
        row!(
            "muon_newton_schulz_host_config",
            "NULL cfg",
            None,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_newton_schulz_host_config([0f32; 4].as_ptr(), [0f32; 4].as_mut_ptr(), 2, 2, null())
        ),
        row!(
            "muon_newton_schulz_host_config",
            "cols 0",
            None,
            MUON_STATUS_OUT_OF_RANGE,
            |o| muon_newton_schulz_host_config([0f32; 4].as_ptr(), [0f32; 4].as_mut_ptr(), 2, 0, &default_config())
        ),
        row!(
            "muon_newton_schulz_host_config",
            "torn struct_size",
            None,
            MUON_STATUS_ABI_MISMATCH,
            |o| {
                let mut cfg = default_config();
                cfg.struct_size -= 2;
                muon_newton_schulz_host_config([0f32; 4].as_ptr(), [0f32; 4].as_mut_ptr(), 2, 2, &cfg)
            }
        ),
        row!(
            "muon_mxfp8_scale_shape",
            "NULL shapes",
            None,
            MUON_STATUS_NULL_ARGUMENT,
            |o| muon_mxfp8_scale_shape(32, 32, null_mut())
        ),
        row!(
            "muon_mxfp8_quantize_host",
            "NULL input",
            None,
            MUON_STATUS_NULL_ARGUMENT,
            |o| {
                let mut b = [0u8; 64];
                muon_mxfp8_quantize_host(
                    null(),
                    0,
                    1,
                    32,
                    0,
                    b.as_mut_ptr(),
                    b.as_mut_ptr(),
                    b.as_mut_ptr(),
                    b.as_mut_ptr(),
                )
            }
        ),
    ]
}

/// Entry points without a status: each is called with NULL where it takes a pointer.
fn statusless() -> Vec<(&'static str, fn())> {
    vec![
        ("muon_config_init", || unsafe { muon_config_init(null_mut()) }),
        ("muon_param_desc_init", || unsafe { muon_param_desc_init(null_mut()) }),
        ("muon_qk_clip_init", || unsafe { muon_qk_clip_init(null_mut()) }),
        ("muon_cuda_available", || {
            let _ = muon_cuda_available();
        }),
        ("muon_last_error_message", || {
            assert!(!muon_last_error_message().is_null())
        }),
        ("muon_status_string", || {
            assert!(!muon_status_string(u32::MAX).is_null())
        }),
        ("muon_get_version", || assert_eq!(muon_get_version(), 100)),
    ]
}

/// A fresh optimizer in `state` (and its comm), or NULLs.
fn fixture(state: State) -> (*mut muon_comm_t, *mut muon_optimizer_t) {
    match state {
        State::None => (null_mut(), null_mut()),
        State::Registering => one_param_optimizer(false),
        State::Finalized => one_param_optimizer(true),
    }
}

/// The functions `include/muon_opt.h` declares.
fn declared() -> BTreeSet<String> {
    let header = include_str!("../../../include/muon_opt.h");
    header
        .lines()
        .filter(|l| !l.trim_start().starts_with('*') && !l.trim_start().starts_with('/'))
        .filter_map(|l| {
            let name = l.split('(').next()?.split_whitespace().last()?.trim_start_matches('*');
            (l.contains('(') && name.starts_with("muon_") && !l.starts_with("#define")).then(|| name.to_string())
        })
        .collect()
}

#[test]
fn every_entry_point_returns_the_documented_status() {
    let mut covered = BTreeSet::new();
    for row in table() {
        covered.insert(row.function.to_string());
        let (comm, opt) = fixture(row.state);
        let status = (row.call)(opt);
        assert_eq!(status, row.expected, "{} ({}): {:?}", row.function, row.what, row.state);
        let message = last_error();
        assert!(
            message.starts_with(row.function),
            "{} ({}): the message names another function: {message}",
            row.function,
            row.what
        );
        if !opt.is_null() {
            teardown(comm, opt);
        }
    }
    for (function, call) in statusless() {
        call();
        covered.insert(function.to_string());
    }
    let declared = declared();
    assert!(
        declared.len() >= 30 && declared.contains("muon_status_string") && declared.contains("muon_get_version"),
        "the header parse found {declared:?}"
    );
    let missing: Vec<&String> = declared.difference(&covered).collect();
    assert!(missing.is_empty(), "entry points without a row: {missing:?}");
}

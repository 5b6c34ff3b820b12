//! Unit tests of the exports called directly, as C would call them.

use std::ffi::CString;
use std::ptr::{null, null_mut};

use crate::capi::comm::*;
use crate::capi::config::*;
use crate::capi::constants::*;
use crate::capi::fixtures::{
    default_config, desc, host_group, last_error, one_param_optimizer, single_rank_optimizer, teardown,
};
use crate::capi::iteration::*;
use crate::capi::optimizer::*;
use crate::capi::param::*;
use crate::capi::status::muon_status_t::{self, *};

fn validate(cfg: &muon_config_t) -> (muon_status_t, String) {
    let status = unsafe { muon_config_validate(cfg) };
    (status, last_error())
}

/// A param description of the first ABI (ending at wd_scale) is accepted with one split
/// group whatever lies beyond its struct_size; the current one carries num_split_groups
/// (Megatron's QKV split per query group), checked against the rows.
#[test]
fn a_param_desc_of_the_first_abi_defaults_the_split_groups() {
    let sizes = [8i64, 4, 4];
    let name = CString::new("attn.qkv.weight").unwrap();
    let mut d = desc(&name, &[48, 32]);
    d.num_splits = 3;
    d.split_sizes = sizes.as_ptr();
    d.num_split_groups = 3;
    let read = unsafe { crate::capi::param::read_desc(&d, None) }.unwrap();
    assert_eq!(
        (read.spec.split_sizes.clone(), read.spec.split_groups),
        (vec![8, 4, 4], 3)
    );
    d.struct_size = std::mem::offset_of!(muon_param_desc_t, num_split_groups) as u32;
    let err = unsafe { crate::capi::param::read_desc(&d, None) }.err().unwrap();
    assert!(err.message.contains("sum to 16, but dim 0 is 48"), "{err}");
    d.num_split_groups = 2;
    d.struct_size = std::mem::size_of::<muon_param_desc_t>() as u32;
    let err = unsafe { crate::capi::param::read_desc(&d, None) }.err().unwrap();
    assert!(err.message.contains("× 2 groups sum to 32"), "{err}");
    d.struct_size = std::mem::offset_of!(muon_param_desc_t, num_split_groups) as u32 - 4;
    let err = unsafe { crate::capi::param::read_desc(&d, None) }.err().unwrap();
    assert_eq!(err.kind, crate::error::ErrorKind::AbiMismatch);
}

#[test]
fn defaults_validate_and_match_the_design() {
    let cfg = default_config();
    assert_eq!(cfg.struct_size as usize, std::mem::size_of::<muon_config_t>());
    assert_eq!(validate(&cfg).0, MUON_STATUS_SUCCESS);
    assert_eq!(cfg.muon_layout, MUON_LAYOUT_COMPACT);
    assert_eq!(cfg.muon_momentum, 0.95);
    assert_eq!(cfg.muon_num_ns_steps, 5);
    assert_eq!((cfg.adam_beta1, cfg.adam_beta2, cfg.adam_eps), (0.9, 0.999, 1e-8));
    assert_eq!(cfg.muon_scale_mode, MUON_SCALE_SPECTRAL);
    assert_eq!(cfg.muon_coefficient_set, MUON_COEFFICIENTS_QUINTIC);
    assert_eq!(cfg.host_threads, 0);
}

/// A caller compiled against the first ABI passes a struct that ends at host_comm_mode: it is
/// accepted, and the fields appended since (host_threads) take their defaults whatever lies
/// beyond its struct_size.
#[test]
fn a_config_of_the_first_abi_defaults_the_appended_fields() {
    let mut cfg = default_config();
    cfg.host_threads = 4;
    cfg.struct_size = std::mem::offset_of!(muon_config_t, host_threads) as u32;
    cfg.muon_momentum = 0.5;
    let read = unsafe { crate::capi::config::read_config(&cfg) }.unwrap();
    assert_eq!((read.host_threads, read.muon_momentum), (0, 0.5));
    cfg.struct_size -= 4;
    let (status, message) = validate(&cfg);
    assert_eq!(status, MUON_STATUS_ABI_MISMATCH);
    assert!(message.contains("oldest supported muon_config_t"), "{message}");
}

/// Only the sizes of released layouts are accepted: a struct_size cutting a field in half
/// (sizeof − 2 cuts muon_ns_eps) is ABI_MISMATCH naming the size; every released size and a
/// larger one (a newer header) pass.
#[test]
fn a_torn_config_struct_size_is_refused() {
    let size = std::mem::size_of::<muon_config_t>() as u32;
    for torn in [size - 2, size - 4, MIN_CONFIG_SIZE as u32 + 2] {
        let mut cfg = default_config();
        cfg.struct_size = torn;
        let (status, message) = validate(&cfg);
        assert_eq!(status, MUON_STATUS_ABI_MISMATCH, "struct_size {torn}");
        assert!(
            message.contains(&format!(
                "cfg->struct_size: {torn} is not the size of a released muon_config_t"
            )),
            "{message}"
        );
    }
    let released = released_config_sizes();
    assert_eq!(released.len(), 3, "{released:?}");
    for ok in released {
        let mut cfg = default_config();
        cfg.struct_size = ok as u32;
        assert_eq!(validate(&cfg).0, MUON_STATUS_SUCCESS, "struct_size {ok}");
    }
}

#[test]
fn each_invalid_field_gets_its_status_and_names_the_field() {
    type Edit = fn(&mut muon_config_t);
    let cases: Vec<(Edit, muon_status_t, &str)> = vec![
        (
            |c| c.muon_layout = 7,
            MUON_STATUS_INVALID_ENUM_VALUE,
            "muon_layout: unknown value 7",
        ),
        (|c| c.grad_dtype = 9, MUON_STATUS_INVALID_ENUM_VALUE, "grad_dtype"),
        (
            |c| c.muon_coefficient_set = 4,
            MUON_STATUS_INVALID_ENUM_VALUE,
            "muon_coefficient_set",
        ),
        (
            |c| c.muon_ns_precision = 3,
            MUON_STATUS_INVALID_ENUM_VALUE,
            "muon_ns_precision",
        ),
        (
            |c| c.muon_scale_mode = 3,
            MUON_STATUS_INVALID_ENUM_VALUE,
            "muon_scale_mode",
        ),
        (
            |c| c.muon_tp_mode = 3,
            MUON_STATUS_INVALID_ENUM_VALUE,
            "muon_tp_mode: unknown value 3",
        ),
        (
            |c| c.muon_ns_eps = f32::NAN,
            MUON_STATUS_OUT_OF_RANGE,
            "muon_ns_eps: NaN must be finite and > 0",
        ),
        (
            |c| c.host_comm_mode = 3,
            MUON_STATUS_INVALID_ENUM_VALUE,
            "host_comm_mode",
        ),
        (
            |c| c.host_threads = 1025,
            MUON_STATUS_OUT_OF_RANGE,
            "host_threads: 1025 is outside 0..=1024",
        ),
        (
            |c| c.muon_momentum = 1.0,
            MUON_STATUS_OUT_OF_RANGE,
            "muon_momentum: 1 is outside [0, 1)",
        ),
        (|c| c.muon_momentum = -0.1, MUON_STATUS_OUT_OF_RANGE, "muon_momentum"),
        (
            |c| c.muon_momentum = f32::NAN,
            MUON_STATUS_OUT_OF_RANGE,
            "muon_momentum",
        ),
        (|c| c.adam_beta1 = 1.5, MUON_STATUS_OUT_OF_RANGE, "adam_beta1"),
        (|c| c.adam_beta2 = 1.0, MUON_STATUS_OUT_OF_RANGE, "adam_beta2"),
        (|c| c.adam_eps = 0.0, MUON_STATUS_OUT_OF_RANGE, "adam_eps"),
        (
            |c| c.muon_num_ns_steps = 0,
            MUON_STATUS_OUT_OF_RANGE,
            "muon_num_ns_steps: 0",
        ),
        (
            |c| c.muon_extra_scale_factor = 0.0,
            MUON_STATUS_OUT_OF_RANGE,
            "muon_extra_scale_factor",
        ),
        (|c| c.clip_grad = -1.0, MUON_STATUS_OUT_OF_RANGE, "clip_grad"),
        (
            |c| c.collective_timeout_ms = 0,
            MUON_STATUS_OUT_OF_RANGE,
            "collective_timeout_ms",
        ),
        (
            |c| c.overlap_grad_reduce = 2,
            MUON_STATUS_OUT_OF_RANGE,
            "overlap_grad_reduce: 2 is not a boolean",
        ),
        (|c| c.struct_size = 8, MUON_STATUS_ABI_MISMATCH, "struct_size: 8"),
        (|c| c.abi_version = 10_000 * 7, MUON_STATUS_ABI_MISMATCH, "abi_version"),
    ];
    for (edit, status, needle) in cases {
        let mut cfg = default_config();
        edit(&mut cfg);
        let (got, message) = validate(&cfg);
        assert_eq!(got, status, "{needle}: {message}");
        assert!(message.contains(needle), "'{message}' does not contain '{needle}'");
        assert!(message.starts_with("muon_config_validate: "), "{message}");
    }
}

#[test]
fn null_arguments_are_reported_not_dereferenced() {
    assert_eq!(unsafe { muon_config_validate(null()) }, MUON_STATUS_NULL_ARGUMENT);
    assert!(last_error().contains("cfg is NULL"));
    unsafe { muon_config_init(null_mut()) };
    assert_eq!(
        unsafe { muon_host_group_create(2, null_mut()) },
        MUON_STATUS_NULL_ARGUMENT
    );
    let cfg = default_config();
    let mut opt = null_mut();
    assert_eq!(
        unsafe { muon_optimizer_create(&cfg, null_mut(), null_mut(), &mut opt) },
        MUON_STATUS_NULL_ARGUMENT
    );
    assert!(opt.is_null(), "outputs are written only on success");
    assert_eq!(
        unsafe { muon_optimizer_add_param(null_mut(), null(), null_mut()) },
        MUON_STATUS_NULL_ARGUMENT
    );
    assert_eq!(
        unsafe { muon_optimizer_finalize(null_mut()) },
        MUON_STATUS_NULL_ARGUMENT
    );
    let mut rank = 0;
    assert_eq!(unsafe { muon_comm_rank(null(), &mut rank) }, MUON_STATUS_NULL_ARGUMENT);
    assert_eq!(
        unsafe { muon_comm_create_nccl(null_mut(), null_mut()) },
        MUON_STATUS_NULL_ARGUMENT
    );
    let (comm, opt) = single_rank_optimizer(&cfg);
    assert_eq!(
        unsafe { muon_optimizer_add_param(opt, null(), null_mut()) },
        MUON_STATUS_NULL_ARGUMENT
    );
    assert!(last_error().contains("desc is NULL"));
    let mut d = desc(&CString::new("w").unwrap(), &[4, 4]);
    d.name = null();
    assert_eq!(
        unsafe { muon_optimizer_add_param(opt, &d, null_mut()) },
        MUON_STATUS_NULL_ARGUMENT
    );
    assert!(last_error().contains("desc->name is NULL"));
    teardown(comm, opt);
}

#[test]
fn destroy_null_is_success_and_wrong_handles_are_rejected() {
    assert_eq!(unsafe { muon_optimizer_destroy(null_mut()) }, MUON_STATUS_SUCCESS);
    assert_eq!(unsafe { muon_comm_destroy(null_mut()) }, MUON_STATUS_SUCCESS);
    let comm = host_group(1)[0];
    let as_optimizer = comm.cast::<muon_optimizer_t>();
    assert_eq!(
        unsafe { muon_optimizer_finalize(as_optimizer) },
        MUON_STATUS_INVALID_HANDLE
    );
    assert!(last_error().contains("not a live optimizer handle"));
    assert_eq!(unsafe { muon_comm_destroy(comm) }, MUON_STATUS_SUCCESS);
}

#[test]
fn wrong_call_order_is_a_state_error() {
    let cfg = default_config();
    let (comm, opt) = single_rank_optimizer(&cfg);
    assert_eq!(unsafe { muon_optimizer_finalize(opt) }, MUON_STATUS_INVALID_STATE);
    assert!(last_error().contains("no params registered"));
    let mut view = unsafe { std::mem::zeroed::<muon_param_view_t>() };
    view.struct_size = std::mem::size_of::<muon_param_view_t>() as u32;
    assert_eq!(
        unsafe { muon_optimizer_param_view(opt, 0, &mut view) },
        MUON_STATUS_INVALID_ARGUMENT
    );
    let name = CString::new("layers.0.fc1.weight").unwrap();
    let mut id = u32::MAX;
    assert_eq!(
        unsafe { muon_optimizer_add_param(opt, &desc(&name, &[64, 32]), &mut id) },
        MUON_STATUS_SUCCESS
    );
    assert_eq!(id, 0);
    assert_eq!(
        unsafe { muon_optimizer_param_view(opt, 0, &mut view) },
        MUON_STATUS_INVALID_STATE
    );
    assert!(last_error().contains("not finalized"));
    assert_eq!(
        unsafe { muon_optimizer_finalize(opt) },
        MUON_STATUS_SUCCESS,
        "{}",
        last_error()
    );
    let late = CString::new("late").unwrap();
    assert_eq!(
        unsafe { muon_optimizer_add_param(opt, &desc(&late, &[4]), null_mut()) },
        MUON_STATUS_INVALID_STATE
    );
    assert!(last_error().contains("finalized"));
    assert_eq!(unsafe { muon_optimizer_finalize(opt) }, MUON_STATUS_INVALID_STATE);
    assert_eq!(
        unsafe { muon_optimizer_param_view(opt, 0, &mut view) },
        MUON_STATUS_SUCCESS
    );
    assert_eq!((view.route, view.owner, view.numel), (MUON_ROUTE_MUON, 0, 64 * 32));
    assert!(
        !view.data.is_null() && !view.grad.is_null(),
        "finalize allocates the buffers"
    );
    teardown(comm, opt);
}

#[test]
fn a_comm_serves_one_optimizer_at_a_time() {
    let cfg = default_config();
    let (comm, opt) = single_rank_optimizer(&cfg);
    let mut second = null_mut();
    assert_eq!(
        unsafe { muon_optimizer_create(&cfg, comm, null_mut(), &mut second) },
        MUON_STATUS_INVALID_STATE
    );
    assert_eq!(unsafe { muon_optimizer_destroy(opt) }, MUON_STATUS_SUCCESS);
    assert_eq!(
        unsafe { muon_optimizer_create(&cfg, comm, null_mut(), &mut second) },
        MUON_STATUS_SUCCESS
    );
    teardown(comm, second);
}

#[test]
fn a_panic_is_caught_and_poisons_the_handle() {
    let cfg = default_config();
    let (comm, opt) = single_rank_optimizer(&cfg);
    assert_eq!(force_panic(opt), MUON_STATUS_PANIC);
    assert!(last_error().contains("forced panic for a test"), "{}", last_error());
    assert_eq!(unsafe { muon_optimizer_finalize(opt) }, MUON_STATUS_INVALID_STATE);
    assert!(last_error().contains("poisoned"));
    teardown(comm, opt);
}

#[test]
fn last_error_is_per_thread() {
    assert_eq!(unsafe { muon_config_validate(null()) }, MUON_STATUS_NULL_ARGUMENT);
    let here = last_error();
    let there = std::thread::spawn(|| {
        let before = last_error();
        let mut cfg = default_config();
        cfg.muon_layout = 9;
        assert_eq!(unsafe { muon_config_validate(&cfg) }, MUON_STATUS_INVALID_ENUM_VALUE);
        (before, last_error())
    })
    .join()
    .unwrap();
    assert_eq!(there.0, "", "a new thread starts with an empty message");
    assert!(there.1.contains("muon_layout"));
    assert_eq!(
        last_error(),
        here,
        "another thread's failure must not change this thread's message"
    );
}

#[test]
fn host_group_ranks_and_bounds() {
    let comms = host_group(3);
    for (r, comm) in comms.iter().enumerate() {
        let (mut rank, mut size) = (99, 99);
        assert_eq!(unsafe { muon_comm_rank(*comm, &mut rank) }, MUON_STATUS_SUCCESS);
        assert_eq!(unsafe { muon_comm_size(*comm, &mut size) }, MUON_STATUS_SUCCESS);
        assert_eq!((rank, size), (r as u32, 3));
    }
    for comm in comms {
        assert_eq!(unsafe { muon_comm_destroy(comm) }, MUON_STATUS_SUCCESS);
    }
    let mut out = [null_mut(); 1];
    assert_eq!(
        unsafe { muon_host_group_create(0, out.as_mut_ptr()) },
        MUON_STATUS_OUT_OF_RANGE
    );
    assert!(last_error().contains("world_size: 0"));
}

#[test]
fn nccl_and_cuda_absence_are_statuses() {
    let fake = 0x1000usize as *mut ncclComm;
    let mut out = null_mut();
    if unsafe { libc::dlopen(c"libnccl.so.2".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) }.is_null()
        && std::env::var_os("LD_LIBRARY_PATH").is_none_or(|p| !p.to_string_lossy().contains("nccl"))
    {
        assert_eq!(
            unsafe { muon_comm_create_nccl(fake, &mut out) },
            MUON_STATUS_NCCL_UNAVAILABLE
        );
        assert!(last_error().contains("libnccl.so.2"), "{}", last_error());
        assert!(out.is_null());
    }
    if !muon_cuda_available() {
        assert!(last_error().contains("muon_cuda_available: "), "{}", last_error());
    }
}

#[test]
fn registration_errors_through_the_c_api() {
    let mut cfg = default_config();
    cfg.vocab_size = 1000;
    let (comm, opt) = single_rank_optimizer(&cfg);
    let emb = CString::new("embedding.weight").unwrap();
    let mut d = desc(&emb, &[1000, 64]);
    d.flags = MUON_PARAM_FLAG_EMBEDDING_OR_OUTPUT;
    d.tie_group = 1;
    assert_eq!(
        unsafe { muon_optimizer_add_param(opt, &d, null_mut()) },
        MUON_STATUS_SUCCESS
    );
    let mtp = CString::new("mtp.embedding.weight").unwrap();
    let mut dup = desc(&mtp, &[1000, 64]);
    dup.tie_group = 1;
    assert_eq!(
        unsafe { muon_optimizer_add_param(opt, &dup, null_mut()) },
        MUON_STATUS_ROUTING_CONFLICT
    );
    let message = last_error();
    assert!(
        message.contains("'embedding.weight'") && message.contains("'mtp.embedding.weight'"),
        "{message}"
    );
    dup.tie_group = 0;
    assert_eq!(
        unsafe { muon_optimizer_add_param(opt, &dup, null_mut()) },
        MUON_STATUS_ROUTING_CONFLICT
    );
    assert!(last_error().contains("vocab_size 1000"));
    let bad_utf8 = CString::new(vec![0xff, 0xfe]).unwrap();
    assert_eq!(
        unsafe { muon_optimizer_add_param(opt, &desc(&bad_utf8, &[4]), null_mut()) },
        MUON_STATUS_INVALID_PARAM
    );
    assert!(last_error().contains("UTF-8"));
    let neg = CString::new("neg").unwrap();
    assert_eq!(
        unsafe { muon_optimizer_add_param(opt, &desc(&neg, &[4, -2]), null_mut()) },
        MUON_STATUS_INVALID_PARAM
    );
    assert!(last_error().contains("shape[1] is -2"));
    let mut d5 = desc(&neg, &[4]);
    d5.ndim = 5;
    assert_eq!(
        unsafe { muon_optimizer_add_param(opt, &d5, null_mut()) },
        MUON_STATUS_INVALID_PARAM
    );
    let mut small = desc(&neg, &[4]);
    small.struct_size = 4;
    assert_eq!(
        unsafe { muon_optimizer_add_param(opt, &small, null_mut()) },
        MUON_STATUS_ABI_MISMATCH
    );
    let mut route = 9;
    assert_eq!(
        unsafe { muon_optimizer_param_route(opt, 0, &mut route) },
        MUON_STATUS_SUCCESS
    );
    assert_eq!(route, MUON_ROUTE_ADAMW);
    assert_eq!(
        unsafe { muon_optimizer_param_route(opt, 1, &mut route) },
        MUON_STATUS_INVALID_ARGUMENT
    );
    let split = CString::new("qkv").unwrap();
    let mut fused = desc(&split, &[96, 32]);
    let sizes = [32i64, 32, 16];
    fused.num_splits = 3;
    fused.split_sizes = sizes.as_ptr();
    assert_eq!(
        unsafe { muon_optimizer_add_param(opt, &fused, null_mut()) },
        MUON_STATUS_INVALID_PARAM
    );
    assert!(last_error().contains("sum to 80, but dim 0 is 96"), "{}", last_error());
    teardown(comm, opt);
}

/// `const` functions may run concurrently on one handle (the header's threading rule): from
/// several threads at once they all succeed and agree.
#[test]
fn const_calls_run_concurrently_on_one_handle() {
    let cfg = default_config();
    let (comm, opt) = single_rank_optimizer(&cfg);
    let names: Vec<CString> = (0..4).map(|i| CString::new(format!("w{i}")).unwrap()).collect();
    for name in &names {
        let mut id = 0;
        assert_eq!(
            unsafe { muon_optimizer_add_param(opt, &desc(name, &[64, 32]), &mut id) },
            MUON_STATUS_SUCCESS
        );
    }
    assert_eq!(unsafe { muon_optimizer_finalize(opt) }, MUON_STATUS_SUCCESS);
    struct Shared(*const muon_optimizer_t);
    // SAFETY: only the const functions run on it from the threads below, as the header allows.
    unsafe impl Sync for Shared {}
    let shared = Shared(opt);
    let results: Vec<Vec<(usize, usize)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let shared = &shared;
                scope.spawn(move || {
                    let mut seen = Vec::new();
                    for round in 0..200 {
                        let mut len = 0usize;
                        let status = unsafe { muon_optimizer_plan_json(shared.0, null_mut(), 0, &mut len) };
                        assert!(matches!(status, MUON_STATUS_SUCCESS | MUON_STATUS_BUFFER_TOO_SMALL));
                        let mut view = unsafe { std::mem::zeroed::<muon_param_view_t>() };
                        view.struct_size = std::mem::size_of::<muon_param_view_t>() as u32;
                        let status = unsafe { muon_optimizer_param_view(shared.0, round % 4, &mut view) };
                        assert_eq!(status, MUON_STATUS_SUCCESS);
                        seen.push((len, view.data as usize));
                    }
                    seen
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in &results[1..] {
        assert_eq!(r, &results[0], "every thread sees the same plan and views");
    }
    assert!(results[0].iter().all(|&(len, data)| len > 0 && data != 0));
    teardown(comm, opt);
}

/// `muon_optimizer_step` with a NULL info only enqueues; `muon_optimizer_step_info` reads what
/// the last step did (zeros before the first), in either order of calls; a bad info is refused.
#[test]
fn step_info_is_read_on_demand() {
    let cfg = default_config();
    let (comm, opt) = single_rank_optimizer(&cfg);
    let name = CString::new("layers.0.fc1.weight").unwrap();
    let mut info = unsafe { std::mem::zeroed::<muon_step_info_t>() };
    info.struct_size = std::mem::size_of::<muon_step_info_t>() as u32;
    assert_eq!(
        unsafe { muon_optimizer_step_info(opt, &mut info) },
        MUON_STATUS_INVALID_STATE
    );
    assert_eq!(
        unsafe { muon_optimizer_add_param(opt, &desc(&name, &[64, 32]), null_mut()) },
        MUON_STATUS_SUCCESS
    );
    assert_eq!(
        unsafe { muon_optimizer_finalize(opt) },
        MUON_STATUS_SUCCESS,
        "{}",
        last_error()
    );
    assert_eq!(unsafe { muon_optimizer_step_info(opt, &mut info) }, MUON_STATUS_SUCCESS);
    assert_eq!(
        (info.step, info.skipped, info.grad_norm),
        (0, 0, 0.0),
        "before the first step"
    );
    let args = muon_step_args_t {
        struct_size: std::mem::size_of::<muon_step_args_t>() as u32,
        lr: 0.02,
        weight_decay: 0.0,
        adam_lr: 1e-3,
        adam_weight_decay: 0.0,
    };
    for step in 1..=2u64 {
        assert_eq!(unsafe { muon_optimizer_zero_grad(opt) }, MUON_STATUS_SUCCESS);
        assert_eq!(unsafe { muon_optimizer_grad_ready(opt, 0) }, MUON_STATUS_SUCCESS);
        assert_eq!(
            unsafe { muon_optimizer_step(opt, &args, null_mut()) },
            MUON_STATUS_SUCCESS,
            "{}",
            last_error()
        );
        assert_eq!(unsafe { muon_optimizer_step_info(opt, &mut info) }, MUON_STATUS_SUCCESS);
        assert_eq!((info.step, info.skipped, info.clip_coef), (step, 0, 1.0));
    }
    // Arguments set beforehand, then a step that copies nothing (the capture-ready form).
    assert_eq!(unsafe { muon_optimizer_set_step_args(opt, &args) }, MUON_STATUS_SUCCESS);
    assert_eq!(unsafe { muon_optimizer_zero_grad(opt) }, MUON_STATUS_SUCCESS);
    assert_eq!(unsafe { muon_optimizer_grad_ready(opt, 0) }, MUON_STATUS_SUCCESS);
    assert_eq!(
        unsafe { muon_optimizer_step(opt, null(), null_mut()) },
        MUON_STATUS_SUCCESS,
        "{}",
        last_error()
    );
    assert_eq!(unsafe { muon_optimizer_step_info(opt, &mut info) }, MUON_STATUS_SUCCESS);
    assert_eq!(info.step, 3);
    assert_eq!(
        unsafe { muon_optimizer_step_info(opt, null_mut()) },
        MUON_STATUS_NULL_ARGUMENT
    );
    info.struct_size = 3;
    assert_eq!(
        unsafe { muon_optimizer_step_info(opt, &mut info) },
        MUON_STATUS_ABI_MISMATCH
    );
    assert_eq!(
        unsafe { muon_optimizer_step_info(null_mut(), &mut info) },
        MUON_STATUS_NULL_ARGUMENT
    );
    teardown(comm, opt);
}

/// `muon_optimizers_step` steps two optimizers with one norm: each holds one matrix whose
/// gradient is all ones (A, 64×32) or all twos (B, 16×8), so both report ‖g‖ = √(2048 + 512)
/// and clip with it. The args array is read with the stride of the caller's struct_size (a
/// newer header's larger struct); an element of another size is refused before any work.
#[test]
fn optimizers_step_shares_one_norm() {
    let mut cfg = default_config();
    cfg.grad_dtype = MUON_DTYPE_F32;
    cfg.clip_grad = 1.0;
    let (comm_a, a) = single_rank_optimizer(&cfg);
    let (comm_b, b) = single_rank_optimizer(&cfg);
    let name = CString::new("layers.0.fc1.weight").unwrap();
    for (opt, shape, value) in [(a, [64i64, 32], 1.0f32), (b, [16, 8], 2.0)] {
        assert_eq!(
            unsafe { muon_optimizer_add_param(opt, &desc(&name, &shape), null_mut()) },
            MUON_STATUS_SUCCESS
        );
        assert_eq!(
            unsafe { muon_optimizer_finalize(opt) },
            MUON_STATUS_SUCCESS,
            "{}",
            last_error()
        );
        assert_eq!(unsafe { muon_optimizer_zero_grad(opt) }, MUON_STATUS_SUCCESS);
        let mut view = unsafe { std::mem::zeroed::<muon_param_view_t>() };
        view.struct_size = std::mem::size_of::<muon_param_view_t>() as u32;
        assert_eq!(
            unsafe { muon_optimizer_param_view(opt, 0, &mut view) },
            MUON_STATUS_SUCCESS
        );
        // SAFETY: the host backend's f32 grad of the param.
        unsafe { std::slice::from_raw_parts_mut(view.grad.cast::<f32>(), view.numel as usize) }.fill(value);
        assert_eq!(unsafe { muon_optimizer_grad_ready(opt, 0) }, MUON_STATUS_SUCCESS);
    }
    /// A caller's newer muon_step_args_t: eight more bytes.
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Newer {
        args: muon_step_args_t,
        extra: u64,
    }
    let element = Newer {
        args: muon_step_args_t {
            struct_size: std::mem::size_of::<Newer>() as u32,
            lr: 0.02,
            weight_decay: 0.0,
            adam_lr: 1e-3,
            adam_weight_decay: 0.0,
        },
        extra: 0,
    };
    let mut array = [element; 2];
    array[1].args.struct_size -= 8;
    let opts = [a, b];
    assert_eq!(
        unsafe { muon_optimizers_step(opts.as_ptr(), 2, array.as_ptr().cast()) },
        MUON_STATUS_ABI_MISMATCH
    );
    assert!(last_error().contains("args[1].struct_size"), "{}", last_error());
    array[1].args.struct_size += 8;
    assert_eq!(
        unsafe { muon_optimizers_step(opts.as_ptr(), 2, array.as_ptr().cast()) },
        MUON_STATUS_SUCCESS,
        "{}",
        last_error()
    );
    let expected = (2048.0f64 + 512.0).sqrt();
    for opt in opts {
        let mut info = unsafe { std::mem::zeroed::<muon_step_info_t>() };
        info.struct_size = std::mem::size_of::<muon_step_info_t>() as u32;
        assert_eq!(unsafe { muon_optimizer_step_info(opt, &mut info) }, MUON_STATUS_SUCCESS);
        assert_eq!((info.step, info.skipped, info.grad_norm), (1, 0, expected));
        assert_eq!(info.clip_coef, (1.0 / (expected + 1e-6)) as f32);
    }
    teardown(comm_a, a);
    teardown(comm_b, b);
}

/// The element-wise arguments of muon_optimizers_step and muon_optimizer_load_union are
/// named with their index: an unfinalized opts[1], a NaN args[1].lr, a NULL dirs[1].
#[test]
fn array_arguments_name_the_element() {
    let (comm_a, a) = one_param_optimizer(true);
    let (comm_b, b) = one_param_optimizer(false);
    let opts = [a, b];
    let args = |lr: f32| muon_step_args_t {
        struct_size: std::mem::size_of::<muon_step_args_t>() as u32,
        lr,
        weight_decay: 0.0,
        adam_lr: 1e-3,
        adam_weight_decay: 0.0,
    };
    let array = [args(0.02), args(0.02)];
    assert_eq!(
        unsafe { muon_optimizers_step(opts.as_ptr(), 2, array.as_ptr()) },
        MUON_STATUS_INVALID_STATE
    );
    assert!(
        last_error().contains("opts[1]: the optimizer is not finalized"),
        "{}",
        last_error()
    );
    assert_eq!(unsafe { muon_optimizer_finalize(b) }, MUON_STATUS_SUCCESS);
    let array = [args(0.02), args(f32::NAN)];
    assert_eq!(
        unsafe { muon_optimizers_step(opts.as_ptr(), 2, array.as_ptr()) },
        MUON_STATUS_OUT_OF_RANGE
    );
    assert!(last_error().contains("args[1].lr NaN"), "{}", last_error());
    let dir = CString::new("/nonexistent/ckpt").unwrap();
    let dirs = [dir.as_ptr(), null()];
    assert_eq!(
        unsafe { crate::capi::checkpoint::muon_optimizer_load_union(a, dirs.as_ptr(), 2) },
        MUON_STATUS_NULL_ARGUMENT
    );
    assert!(last_error().contains("dirs[1] is NULL"), "{}", last_error());
    teardown(comm_a, a);
    teardown(comm_b, b);
}

/// The state an optimizer starts from, as bits: every param's model-dtype values, then every
/// owned master as (param, its values' range in the param, values).
type InitialState = (Vec<Vec<u32>>, Vec<(u32, std::ops::Range<usize>, Vec<u32>)>);

fn initial_state(opt: *mut muon_optimizer_t) -> InitialState {
    let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let (mut params, mut masters) = (Vec::new(), Vec::new());
    let status = crate::capi::handle::with_mut::<crate::optimizer::Optimizer>("test", opt, "opt", |o| {
        let rt = o.runtime_mut("test")?;
        for p in 0..rt.plan().params.len() {
            params.push(bits(rt.param_values(p)?));
        }
        for owned in rt.owned_state()? {
            let range = owned.range.start as usize..owned.range.end as usize;
            masters.push((owned.param, range, bits(owned.master)));
        }
        Ok(())
    });
    assert_eq!(status, MUON_STATUS_SUCCESS, "{}", last_error());
    (params, masters)
}

/// `init_data` is read during `add_param` only (the caller overwrites it right after with
/// other values), in either dtype: bf16 values and the same values given as f32 start every
/// param and every master at exactly those values.
#[test]
fn init_data_is_copied_at_registration_in_either_dtype() {
    use crate::numerics::bf16::{bf16_to_f32, f32_to_bf16_rne};
    let cfg = default_config();
    let names = [c"layers.0.fc1.weight", c"layers.0.fc1.bias"];
    let shapes: [&[i64]; 2] = [&[64, 32], &[32]];
    let values = |p: usize, n: usize| -> Vec<u16> {
        (0..n)
            .map(|i| f32_to_bf16_rne(((p * 131 + i * 7) % 97) as f32 / 97.0 - 0.5))
            .collect()
    };
    let expected: Vec<Vec<u32>> = shapes
        .iter()
        .enumerate()
        .map(|(p, shape)| {
            let n = shape.iter().product::<i64>() as usize;
            values(p, n).iter().map(|&b| bf16_to_f32(b).to_bits()).collect()
        })
        .collect();
    for dtype in [MUON_DTYPE_BF16, MUON_DTYPE_F32] {
        let (comm, opt) = single_rank_optimizer(&cfg);
        for (p, (name, shape)) in names.iter().zip(shapes).enumerate() {
            let bf16 = values(p, shape.iter().product::<i64>() as usize);
            let mut f32s: Vec<f32> = bf16.iter().map(|&b| bf16_to_f32(b)).collect();
            let mut halves = bf16.clone();
            let mut d = desc(name, shape);
            d.init_dtype = dtype;
            d.init_data = if dtype == MUON_DTYPE_BF16 {
                halves.as_ptr().cast()
            } else {
                f32s.as_ptr().cast()
            };
            assert_eq!(
                unsafe { muon_optimizer_add_param(opt, &d, null_mut()) },
                MUON_STATUS_SUCCESS,
                "{}",
                last_error()
            );
            halves.fill(0x3F80);
            f32s.fill(2.0);
        }
        assert_eq!(
            unsafe { muon_optimizer_finalize(opt) },
            MUON_STATUS_SUCCESS,
            "{}",
            last_error()
        );
        let (params, masters) = initial_state(opt);
        teardown(comm, opt);
        assert_eq!(params, expected, "dtype {dtype}: params hold the values given");
        assert!(!masters.is_empty());
        for (p, range, master) in masters {
            assert_eq!(
                master, expected[p as usize][range],
                "dtype {dtype}: master of param {p}"
            );
        }
    }
}

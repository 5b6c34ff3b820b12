//! Steps through the C API: step info on demand, a shared step over several optimizers, and
//! array arguments named by element.

use std::ffi::CString;
use std::ptr::{null, null_mut};

use super::{default_config, desc, last_error, one_param_optimizer, single_rank_optimizer, teardown};
use crate::capi::constants::*;
use crate::capi::iteration::*;
use crate::capi::optimizer::*;
use crate::capi::param::*;
use crate::capi::status::muon_status_t::*;

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
        ..Default::default()
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
            ..Default::default()
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
        ..Default::default()
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

//! The versioned step arguments: the released layouts, the first one (20 bytes) overriding
//! nothing whatever lies beyond it, the second (40 bytes) refusing the decoupled learning rate
//! it has no field for, torn sizes and unknown override bits refused, and a step's overrides
//! through the exports — bad values named and refused before anything changes.

use std::ptr::null_mut;

use super::{last_error, one_param_optimizer, teardown};
use crate::capi::constants::*;
use crate::capi::iteration::*;
use crate::capi::optimizer::*;
use crate::capi::param::muon_param_view_t;
use crate::capi::status::muon_status_t::*;
use crate::error::ErrorKind;
use crate::schedule::StepOverrides;

/// Current-layout args with every override set.
fn overriding() -> muon_step_args_t {
    muon_step_args_t {
        struct_size: std::mem::size_of::<muon_step_args_t>() as u32,
        lr: 0.02,
        weight_decay: 0.1,
        adam_lr: 1e-3,
        adam_weight_decay: 0.01,
        overrides: MUON_STEP_OVERRIDE_MUON_MOMENTUM
            | MUON_STEP_OVERRIDE_ADAM_BETA1
            | MUON_STEP_OVERRIDE_ADAM_BETA2
            | MUON_STEP_OVERRIDE_ADAM_EPS
            | MUON_STEP_OVERRIDE_DECOUPLED_LR,
        muon_momentum: 0.5,
        adam_beta1: 0.8,
        adam_beta2: 0.95,
        adam_eps: 1e-6,
        decoupled_lr: 5e-4,
    }
}

/// Each released layout's size is its last field's end (every field is 4 bytes), the current
/// struct is the last row, and the sizes grow.
#[test]
fn every_released_step_args_layout_has_a_size_of_its_own() {
    use std::mem::offset_of;
    let end = |field: &str| -> usize {
        4 + match field {
            "adam_weight_decay" => offset_of!(muon_step_args_t, adam_weight_decay),
            "adam_eps" => offset_of!(muon_step_args_t, adam_eps),
            "decoupled_lr" => offset_of!(muon_step_args_t, decoupled_lr),
            other => panic!("no field {other}"),
        }
    };
    for (field, size) in RELEASED_STEP_ARGS_LAYOUTS {
        assert_eq!(end(field), size, "the layout ending at {field}");
    }
    let (last, last_size) = RELEASED_STEP_ARGS_LAYOUTS[RELEASED_STEP_ARGS_LAYOUTS.len() - 1];
    assert_eq!(
        std::mem::size_of::<muon_step_args_t>(),
        last_size,
        "muon_step_args_t grew past the {last} layout: add its row to RELEASED_STEP_ARGS_LAYOUTS"
    );
    assert!(RELEASED_STEP_ARGS_LAYOUTS.windows(2).all(|p| p[0].1 < p[1].1));
    assert_eq!(RELEASED_STEP_ARGS_LAYOUTS.map(|(_, size)| size), [20, 40, 44]);
}

/// A caller compiled against the first layout (struct_size 20) overrides nothing, whatever the
/// bytes beyond it hold; the current size reads every override, a newer header's larger struct
/// too; a size cutting a field, or below the first layout, is ABI_MISMATCH naming it; an
/// undefined override bit is INVALID_ARGUMENT naming the field.
#[test]
fn the_first_step_args_layout_overrides_nothing() {
    let mut args = overriding();
    let read = unsafe { read_step_args(&args, "args->") }.unwrap();
    assert_eq!(
        read.overrides,
        StepOverrides {
            muon_momentum: Some(0.5),
            adam_beta1: Some(0.8),
            adam_beta2: Some(0.95),
            adam_eps: Some(1e-6),
            decoupled_lr: Some(5e-4),
        }
    );
    args.struct_size = 20;
    let read = unsafe { read_step_args(&args, "args->") }.unwrap();
    assert_eq!(read.overrides, StepOverrides::NONE);
    assert_eq!((read.lr, read.adam_weight_decay), (0.02, 0.01));
    #[repr(C)]
    struct Newer {
        args: muon_step_args_t,
        extra: u64,
    }
    let newer = Newer {
        args: muon_step_args_t {
            struct_size: std::mem::size_of::<Newer>() as u32,
            overrides: MUON_STEP_OVERRIDE_ADAM_EPS,
            ..overriding()
        },
        extra: u64::MAX,
    };
    let read = unsafe { read_step_args(&newer.args, "args->") }.unwrap();
    assert_eq!(newer.extra, u64::MAX);
    assert_eq!(
        read.overrides,
        StepOverrides {
            adam_eps: Some(1e-6),
            ..StepOverrides::NONE
        }
    );
    for torn in [0u32, 16, 24, 38, 42] {
        args.struct_size = torn;
        let err = unsafe { read_step_args(&args, "args->") }.unwrap_err();
        assert_eq!(err.kind, ErrorKind::AbiMismatch, "{torn}: {err}");
        assert!(
            err.message.contains(&format!(
                "args->struct_size: {torn} is not the size of a released muon_step_args_t (20, 40, 44 bytes"
            )),
            "{err}"
        );
    }
    args.struct_size = 40;
    let err = unsafe { read_step_args(&args, "args->") }.unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    assert!(
        err.message.contains(
            "args->overrides: MUON_STEP_OVERRIDE_DECOUPLED_LR is set, but a 40-byte muon_step_args_t has no decoupled_lr"
        ),
        "{err}"
    );
    args.overrides &= !MUON_STEP_OVERRIDE_DECOUPLED_LR;
    let read = unsafe { read_step_args(&args, "args->") }.unwrap();
    assert_eq!(
        (read.overrides.adam_eps, read.overrides.decoupled_lr),
        (Some(1e-6), None)
    );
    args.struct_size = std::mem::size_of::<muon_step_args_t>() as u32;
    args.overrides = 1 << 5;
    let err = unsafe { read_step_args(&args, "args[1].") }.unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    assert!(err.message.contains("args[1].overrides: unknown bits 0x20"), "{err}");
}

/// The bf16 bits of param `w` (16×8) of a one-param optimizer after two steps with `args` on
/// two different gradients (the second update's direction depends on the momentum), or the
/// status and message of the first step, refused without changing the param.
fn two_steps(args: &muon_step_args_t) -> Result<Vec<u16>, (crate::capi::status::muon_status_t, String)> {
    let (comm, opt) = one_param_optimizer(true);
    let mut view = unsafe { std::mem::zeroed::<muon_param_view_t>() };
    view.struct_size = std::mem::size_of::<muon_param_view_t>() as u32;
    assert_eq!(
        unsafe { muon_optimizer_param_view(opt, 0, &mut view) },
        MUON_STATUS_SUCCESS
    );
    // SAFETY: the host backend's 128 bf16 values of the param (the desc's default dtype).
    let read = || unsafe { std::slice::from_raw_parts(view.data.cast::<u16>(), 128) }.to_vec();
    let before = read();
    for step in 0..2 {
        assert_eq!(unsafe { muon_optimizer_zero_grad(opt) }, MUON_STATUS_SUCCESS);
        // SAFETY: the host backend's f32 grad of the param (the default grad dtype).
        let grad = unsafe { std::slice::from_raw_parts_mut(view.grad.cast::<f32>(), 128) };
        for (i, g) in grad.iter_mut().enumerate() {
            *g = if step == 0 { 1.0 } else { (i % 3) as f32 - 1.0 };
        }
        let status = unsafe { muon_optimizer_step(opt, args, null_mut()) };
        if status != MUON_STATUS_SUCCESS {
            let message = last_error();
            assert_eq!(read(), before, "a refused step changes nothing: {message}");
            teardown(comm, opt);
            return Err((status, message));
        }
    }
    let after = read();
    teardown(comm, opt);
    Ok(after)
}

/// Through muon_optimizer_step: a 20-byte struct steps with the config's momentum whatever
/// follows it, as the current struct without overrides does, and unlike one overriding the
/// momentum. Bad values are refused naming the field and the rule, and change nothing.
#[test]
fn a_step_of_the_first_layout_uses_the_config_and_bad_overrides_are_refused() {
    let plain = muon_step_args_t {
        overrides: 0,
        ..overriding()
    };
    let config = two_steps(&plain).unwrap();
    let first = muon_step_args_t {
        struct_size: 20,
        ..overriding()
    };
    assert_eq!(
        two_steps(&first).unwrap(),
        config,
        "the 20-byte layout overrides nothing"
    );
    assert_ne!(
        two_steps(&overriding()).unwrap(),
        config,
        "the momentum override reaches the step"
    );
    let bad = |edit: fn(&mut muon_step_args_t)| {
        let mut args = overriding();
        edit(&mut args);
        two_steps(&args).unwrap_err()
    };
    for (edit, status, needle) in [
        (
            (|a| a.muon_momentum = 1.0) as fn(&mut muon_step_args_t),
            MUON_STATUS_OUT_OF_RANGE,
            "muon_optimizer_step: step: args->muon_momentum 1 is outside [0, 1)",
        ),
        (
            |a| a.adam_beta1 = f32::NAN,
            MUON_STATUS_OUT_OF_RANGE,
            "args->adam_beta1 NaN is outside [0, 1)",
        ),
        (
            |a| a.adam_beta2 = -0.5,
            MUON_STATUS_OUT_OF_RANGE,
            "args->adam_beta2 -0.5 is outside [0, 1)",
        ),
        (
            |a| a.adam_eps = 0.0,
            MUON_STATUS_OUT_OF_RANGE,
            "args->adam_eps 0 must be finite and > 0",
        ),
        (
            |a| a.decoupled_lr = f32::INFINITY,
            MUON_STATUS_OUT_OF_RANGE,
            "args->decoupled_lr inf must be finite and >= 0",
        ),
        (
            |a| a.overrides = 1 << 31,
            MUON_STATUS_INVALID_ARGUMENT,
            "args->overrides: unknown bits 0x80000000",
        ),
    ] {
        let (got, message) = bad(edit);
        assert_eq!(got, status, "{message}");
        assert!(message.contains(needle), "'{message}' does not contain '{needle}'");
    }
    // A value whose bit is clear is ignored.
    let ignored = muon_step_args_t {
        overrides: 0,
        muon_momentum: f32::NAN,
        ..overriding()
    };
    assert_eq!(two_steps(&ignored).unwrap(), config);
}

/// muon_optimizer_set_step_args and muon_optimizers_step name a bad override as the other
/// arguments: `args->` and `args[k].`.
#[test]
fn set_and_shared_steps_name_a_bad_override() {
    let (comm_a, a) = one_param_optimizer(true);
    let (comm_b, b) = one_param_optimizer(true);
    let mut args = overriding();
    args.adam_eps = -1.0;
    assert_eq!(
        unsafe { muon_optimizer_set_step_args(a, &args) },
        MUON_STATUS_OUT_OF_RANGE
    );
    assert!(
        last_error().contains("muon_optimizer_set_step_args: step: args->adam_eps -1 must be finite and > 0"),
        "{}",
        last_error()
    );
    let array = [overriding(), args];
    assert_eq!(
        unsafe { muon_optimizers_step([a, b].as_ptr(), 2, array.as_ptr()) },
        MUON_STATUS_OUT_OF_RANGE
    );
    assert!(last_error().contains("args[1].adam_eps -1"), "{}", last_error());
    teardown(comm_a, a);
    teardown(comm_b, b);
}

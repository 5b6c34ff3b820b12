//! The contract of stored step arguments, through the C API: a step with NULL args uses the
//! ones last set with muon_optimizer_set_step_args — the arguments a step captured in a CUDA
//! graph replays — and a step given its own args uses them for itself only. Checked by the
//! params: an optimizer whose steps use (B, A) ends bit for bit where one given (B, A)
//! explicitly ends, and elsewhere than one given (B, B).

mod support;

use std::ptr::{null, null_mut};

use muon_opt::capi::iteration::{
    muon_optimizer_grad_ready, muon_optimizer_set_step_args, muon_optimizer_step, muon_optimizer_zero_grad,
    muon_optimizers_step, muon_step_args_t,
};
use muon_opt::capi::optimizer::{muon_optimizer_finalize, muon_optimizer_param_view, muon_optimizer_t};
use muon_opt::capi::param::muon_param_view_t;
use muon_opt::capi::status::muon_status_t::*;
use support::capi::{Handle, add_param, config, create, destroy, destroy_group, host_group, outcome, step_args};

/// How one step gets its arguments.
#[derive(Clone, Copy)]
enum Call {
    /// muon_optimizer_set_step_args(lr), no step.
    Set(f32),
    /// muon_optimizer_step with its own args.
    Own(f32),
    /// muon_optimizer_step(NULL).
    Stored,
    /// muon_optimizers_step over this one optimizer with its own args, or NULL.
    Shared(Option<f32>),
}

const A: f32 = 0.02;
const B: f32 = 0.5;

fn view(opt: Handle<muon_optimizer_t>, id: u32) -> muon_param_view_t {
    let mut view = unsafe { std::mem::zeroed::<muon_param_view_t>() };
    view.struct_size = std::mem::size_of::<muon_param_view_t>() as u32;
    outcome(unsafe { muon_optimizer_param_view(opt.0, id, &mut view) }).expect("param_view");
    view
}

/// A one-rank optimizer with a Muon matrix and an AdamW vector, run through `calls` (each
/// step on the same gradients); returns the params' final bits.
fn run(calls: &[Call]) -> Vec<u32> {
    let comm = host_group(1)[0];
    let opt = create(&config(60_000), comm);
    let ids = [add_param(opt, "w", &[16, 8], 0), add_param(opt, "b", &[16], 0)];
    outcome(unsafe { muon_optimizer_finalize(opt.0) }).expect("finalize");
    for &call in calls {
        if let Call::Set(lr) = call {
            outcome(unsafe { muon_optimizer_set_step_args(opt.0, &step_args(lr)) }).expect("set_step_args");
            continue;
        }
        outcome(unsafe { muon_optimizer_zero_grad(opt.0) }).expect("zero_grad");
        for &id in ids.iter().rev() {
            let v = view(opt, id);
            let grad = unsafe { std::slice::from_raw_parts_mut(v.grad.cast::<f32>(), v.numel as usize) };
            for (i, g) in grad.iter_mut().enumerate() {
                *g = ((i * 7 + id as usize) % 5) as f32 - 2.0;
            }
            outcome(unsafe { muon_optimizer_grad_ready(opt.0, id) }).expect("grad_ready");
        }
        let status = match call {
            Call::Own(lr) => unsafe { muon_optimizer_step(opt.0, &step_args(lr), null_mut()) },
            Call::Stored => unsafe { muon_optimizer_step(opt.0, null(), null_mut()) },
            Call::Shared(lr) => {
                let args: Option<muon_step_args_t> = lr.map(step_args);
                let args = args.as_ref().map_or(null(), |a| a as *const _);
                unsafe { muon_optimizers_step(&opt.0, 1, args) }
            }
            Call::Set(_) => unreachable!(),
        };
        outcome(status).expect("step");
    }
    let bits = ids
        .iter()
        .flat_map(|&id| {
            let v = view(opt, id);
            unsafe { std::slice::from_raw_parts(v.data.cast::<f32>(), v.numel as usize) }
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>()
        })
        .collect();
    destroy(opt);
    destroy_group(&[comm]);
    bits
}

#[test]
fn a_step_given_its_own_args_leaves_the_set_ones_for_the_next_null_step() {
    let reference = run(&[Call::Own(B), Call::Own(A)]);
    assert_ne!(
        reference,
        run(&[Call::Own(B), Call::Own(B)]),
        "the test must tell A from B"
    );
    // Set before the explicit step, and after it.
    assert_eq!(run(&[Call::Set(A), Call::Own(B), Call::Stored]), reference);
    assert_eq!(run(&[Call::Own(B), Call::Set(A), Call::Stored]), reference);
    // The same through muon_optimizers_step.
    assert_eq!(
        run(&[Call::Set(A), Call::Shared(Some(B)), Call::Shared(None)]),
        reference
    );
    assert_eq!(run(&[Call::Set(A), Call::Own(B), Call::Shared(None)]), reference);
    // A NULL step before an explicit one uses the set args too.
    let mixed = run(&[Call::Own(A), Call::Own(B), Call::Own(A)]);
    assert_eq!(run(&[Call::Set(A), Call::Stored, Call::Own(B), Call::Stored]), mixed);
}

#[test]
fn a_null_step_after_only_explicit_steps_is_an_invalid_state() {
    let comm = host_group(1)[0];
    let opt = create(&config(60_000), comm);
    add_param(opt, "w", &[16, 8], 0);
    outcome(unsafe { muon_optimizer_finalize(opt.0) }).expect("finalize");
    for call in [Call::Own(B), Call::Shared(Some(B))] {
        let status = match call {
            Call::Own(lr) => unsafe { muon_optimizer_step(opt.0, &step_args(lr), null_mut()) },
            _ => unsafe { muon_optimizers_step(&opt.0, 1, &step_args(B)) },
        };
        outcome(status).expect("explicit step");
        let err = outcome(unsafe { muon_optimizer_step(opt.0, null(), null_mut()) }).expect_err("NULL step");
        assert_eq!(err.0, MUON_STATUS_INVALID_STATE, "{}", err.1);
        assert!(err.1.contains("muon_optimizer_set_step_args"), "{}", err.1);
        let err = outcome(unsafe { muon_optimizers_step(&opt.0, 1, null()) }).expect_err("NULL shared step");
        assert_eq!(err.0, MUON_STATUS_INVALID_STATE, "{}", err.1);
        assert!(err.1.contains("opts[0]"), "{}", err.1);
    }
    destroy(opt);
    destroy_group(&[comm]);
}

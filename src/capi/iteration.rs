//! Per-iteration calls around the framework's forward and backward, and the host
//! Newton–Schulz reference utility.

use crate::bail;
use crate::capi::boundary::{checked_size, non_null, run};
use crate::capi::handle::with_mut;
use crate::capi::optimizer::muon_optimizer_t;
use crate::capi::status::muon_status_t;
use crate::config::{CoefficientSet, NsPrecision};
use crate::numerics::newton_schulz::{NsOptions, NsWorkspace, newton_schulz};
use crate::optimizer::Optimizer;
use crate::schedule::StepArgs;

/// Learning rates and weight decays of one step.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct muon_step_args_t {
    /// sizeof(muon_step_args_t) as compiled by the caller.
    pub struct_size: u32,
    /// Muon learning rate.
    pub lr: f32,
    /// Muon decoupled weight decay.
    pub weight_decay: f32,
    /// AdamW learning rate.
    pub adam_lr: f32,
    /// AdamW decoupled weight decay.
    pub adam_weight_decay: f32,
}

/// What a step did.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct muon_step_info_t {
    /// sizeof(muon_step_info_t) as compiled by the caller.
    pub struct_size: u32,
    /// 1 when a non-finite gradient skipped the step on every rank (no state changed).
    pub skipped: u32,
    /// Global gradient norm, each unique gradient counted once (before clipping).
    pub grad_norm: f64,
    /// Clip multiplier applied to every gradient (1 = none).
    pub clip_coef: f32,
    /// Reserved for alignment; written as 0.
    pub reserved: u32,
    /// Optimizer steps taken so far (skipped steps excluded).
    pub step: u64,
}

/// @brief Zero the gradient buffer before accumulating a new iteration's gradients.
/// @note Stream: async on the host backend's terms; each bucket's memset is ordered after
///       everything that still reads its gradient bytes.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_zero_grad(opt: *mut muon_optimizer_t) -> muon_status_t {
    with_mut::<Optimizer>("muon_optimizer_zero_grad", opt, "opt", |o| o.zero_grad())
}

/// @brief Forward pre-hook: order the caller after bucket @p bucket's param collective.
/// @param[in] bucket The bucket of the param about to be used (muon_param_view_t.bucket); an
///            unknown bucket is MUON_STATUS_INVALID_ARGUMENT.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_wait_params(opt: *mut muon_optimizer_t, bucket: u32) -> muon_status_t {
    with_mut::<Optimizer>("muon_optimizer_wait_params", opt, "opt", |o| o.wait_params(bucket))
}

/// @brief Backward hook: param @p param_id's gradient is fully accumulated for this iteration.
///        With overlap_grad_reduce, a bucket's gradient collective starts when its last param
///        is ready and every bucket before it in the plan's backward order has started: the
///        collectives are issued in one order on every rank whatever the order of these calls
///        (NCCL needs one order). Call once per param per iteration.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_grad_ready(opt: *mut muon_optimizer_t, param_id: u32) -> muon_status_t {
    with_mut::<Optimizer>("muon_optimizer_grad_ready", opt, "opt", |o| o.grad_ready(param_id))
}

/// @brief One optimizer step: orders the updates after the gradient collectives (which sum
///        the ranks' gradients; 1/dp is applied with the clip coefficient), computes the global
///        grad norm, the clip coefficient and the skip decision on a non-finite gradient on the
///        device, then bucket by bucket in the order the next forward uses them updates the
///        owned params and launches that bucket's param collectives, so they overlap the
///        updates of later buckets (with overlap_param_gather, wait_params orders their use).
///        With @p info NULL the call only enqueues work on the streams and never waits for the
///        device (the arguments reach the device by an asynchronous copy from pinned memory);
///        read what the step did later with muon_optimizer_step_info.
/// @param[in]  args Learning rates and weight decays, or NULL to use the ones last set with
///             muon_optimizer_set_step_args (then the step copies nothing from the host: a
///             step captured in a CUDA graph reads them from device memory at every replay;
///             MUON_STATUS_INVALID_STATE if none were set).
/// @param[out] info What the step did, or NULL. Non-NULL waits for the caller's stream to
///             read it back (the same as muon_optimizer_step_info right after the step).
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_step(
    opt: *mut muon_optimizer_t,
    args: *const muon_step_args_t,
    info: *mut muon_step_info_t,
) -> muon_status_t {
    with_mut::<Optimizer>("muon_optimizer_step", opt, "opt", |o| {
        if !info.is_null() {
            checked_size(info as *const muon_step_info_t, "info")?;
        }
        if args.is_null() {
            o.step_with_set_args()?;
        } else {
            o.step_async(&unsafe { read_step_args(args) }?)?;
        }
        if !info.is_null() {
            write_step_info(info, o.step_info()?);
        }
        Ok(())
    })
}

/// @brief Copy the arguments of the next steps (learning rates, weight decays) to the device,
///        ordered on the caller's stream before any later step; never waits. With
///        muon_optimizer_step(opt, NULL, NULL) captured in a CUDA graph, call this before each
///        replay to change the learning rate.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_set_step_args(
    opt: *mut muon_optimizer_t,
    args: *const muon_step_args_t,
) -> muon_status_t {
    with_mut::<Optimizer>("muon_optimizer_set_step_args", opt, "opt", |o| {
        o.set_step_args(&unsafe { read_step_args(args) }?)
    })
}

/// The caller's step arguments, NULL and `struct_size` checked.
///
/// # Safety
/// `args` is NULL or points to a readable `muon_step_args_t` of at least the checked size.
unsafe fn read_step_args(args: *const muon_step_args_t) -> crate::error::Result<StepArgs> {
    checked_size(args, "args")?;
    // SAFETY: non-NULL and of the checked size.
    let a = unsafe { std::ptr::read_unaligned(args) };
    Ok(StepArgs {
        lr: a.lr,
        weight_decay: a.weight_decay,
        adam_lr: a.adam_lr,
        adam_weight_decay: a.adam_weight_decay,
    })
}

/// @brief What the last step did (all zeros before the first step): grad norm, clip
///        coefficient, whether it was skipped, steps taken. Waits for the caller's stream (a
///        device-to-host copy of a few scalars): call it when the value is needed, e.g. for
///        logging every N steps, not inside a captured region.
/// @param[out] info Written on success; info->struct_size must be set by the caller.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_step_info(
    opt: *mut muon_optimizer_t,
    info: *mut muon_step_info_t,
) -> muon_status_t {
    with_mut::<Optimizer>("muon_optimizer_step_info", opt, "opt", |o| {
        checked_size(info as *const muon_step_info_t, "info")?;
        write_step_info(info, o.step_info()?);
        Ok(())
    })
}

fn write_step_info(info: *mut muon_step_info_t, result: crate::schedule::StepInfo) {
    let out = muon_step_info_t {
        struct_size: std::mem::size_of::<muon_step_info_t>() as u32,
        skipped: result.skipped as u32,
        grad_norm: result.grad_norm,
        clip_coef: result.clip_coef,
        reserved: 0,
        step: result.step,
    };
    // SAFETY: the callers checked info (non-NULL, struct_size).
    unsafe { info.write_unaligned(out) };
}

/// @brief Block until every operation the optimizer enqueued has finished.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_synchronize(opt: *mut muon_optimizer_t) -> muon_status_t {
    with_mut::<Optimizer>("muon_optimizer_synchronize", opt, "opt", |o| o.synchronize())
}

/// @brief The library's own host Newton–Schulz orthogonalization (for checking numerics).
/// @param[in]  in   rows×cols row-major f32 input (host).
/// @param[out] out  rows×cols row-major f32 output (host); may not alias @p in.
/// @param[in]  rows, cols >= 1 each (else MUON_STATUS_OUT_OF_RANGE).
/// @param[in]  coefficient_set MUON_COEFFICIENTS_*; @p steps 1..=100;
///             @p precision MUON_NS_PRECISION_*.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_newton_schulz_host(
    input: *const f32,
    out: *mut f32,
    rows: u32,
    cols: u32,
    coefficient_set: u32,
    steps: u32,
    precision: u32,
) -> muon_status_t {
    run("muon_newton_schulz_host", || {
        non_null(input, "in")?;
        non_null(out, "out")?;
        if rows == 0 || cols == 0 {
            bail!(OutOfRange, "rows and cols must be >= 1 (got {rows}×{cols})");
        }
        let opts = NsOptions {
            coefficients: CoefficientSet::from_code("coefficient_set", coefficient_set)?,
            steps,
            precision: NsPrecision::from_code("precision", precision)?,
        };
        let n = rows as usize * cols as usize;
        // SAFETY: the caller provides rows·cols values in each array.
        let (src, dst) = unsafe {
            (
                std::slice::from_raw_parts(input, n),
                std::slice::from_raw_parts_mut(out, n),
            )
        };
        newton_schulz(
            src,
            dst,
            rows as usize,
            cols as usize,
            &opts,
            &mut NsWorkspace::default(),
        )
    })
}

//! Per-iteration calls around the framework's forward and backward, and the host
//! Newton–Schulz reference utility.

use crate::backend::ops::MAX_NORM_TERMS;
use crate::bail;
use crate::capi::boundary::{checked_size, fail, non_null, run};
use crate::capi::config::{muon_config_t, read_config};
use crate::capi::constants::{
    MUON_STEP_OVERRIDE_ADAM_BETA1, MUON_STEP_OVERRIDE_ADAM_BETA2, MUON_STEP_OVERRIDE_ADAM_EPS,
    MUON_STEP_OVERRIDE_DECOUPLED_LR, MUON_STEP_OVERRIDE_MUON_MOMENTUM,
};
use crate::capi::handle::{with_mut, with_mut_each};
use crate::capi::optimizer::muon_optimizer_t;
use crate::capi::status::muon_status_t;
use crate::config::{CoefficientSet, DEFAULT_NS_EPS, DEFAULT_SYMMETRIC_TILE, NsMethod, NsPrecision};
use crate::error::{Error, ErrorKind};
use crate::numerics::newton_schulz::{CustomCoefficients, NsOptions, NsWorkspace, newton_schulz};
use crate::optimizer::Optimizer;
use crate::schedule::{StepArgs, StepOverrides};

/// Learning rates and weight decays of one step, and the config values it overrides (a
/// scheduler's momentum and betas). Every rank of the data-parallel group passes the same
/// values, as it does the learning rates (they are not compared across ranks).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
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
    /// The fields below that this step uses in place of the config's: MUON_STEP_OVERRIDE_* bits
    /// (0 = none, the config's values; a bit no MUON_STEP_OVERRIDE_* defines is
    /// MUON_STATUS_INVALID_ARGUMENT). A field whose bit is clear is ignored; one whose bit is set
    /// and whose value breaks its rule is MUON_STATUS_OUT_OF_RANGE naming it, and nothing is
    /// enqueued. An override is for this step's route (every Muon matrix, every AdamW param),
    /// and a step given its args leaves the set ones in place (muon_optimizer_step), overrides
    /// included: like the learning rates they are device data, so a step captured in a CUDA
    /// graph reads the values last set. A caller compiled against the 20-byte layout (which
    /// ended at adam_weight_decay) overrides nothing.
    pub overrides: u32,
    /// Muon momentum μ in [0, 1), with MUON_STEP_OVERRIDE_MUON_MOMENTUM (else
    /// muon_config_t.muon_momentum).
    pub muon_momentum: f32,
    /// AdamW β1 in [0, 1), with MUON_STEP_OVERRIDE_ADAM_BETA1. The bias corrections are
    /// torch.optim.AdamW's with a scheduled beta: 1 − β^t with this step's β and step count t.
    pub adam_beta1: f32,
    /// AdamW β2 in [0, 1), with MUON_STEP_OVERRIDE_ADAM_BETA2.
    pub adam_beta2: f32,
    /// AdamW ε, finite and > 0, with MUON_STEP_OVERRIDE_ADAM_EPS.
    pub adam_eps: f32,
    /// With MUON_STEP_OVERRIDE_DECOUPLED_LR: the learning rate, finite and >= 0, of the AdamW
    /// params flagged MUON_PARAM_FLAG_EMBEDDING_OR_OUTPUT, in place of adam_lr (times each
    /// param's lr_scale) — Megatron-LM's `--decoupled-lr`, which applies to its embedding and
    /// output params (`is_embedding_or_output_parameter`) and is scheduled like `--lr` (the
    /// same warmup and decay) from `--decoupled-lr` down to `--decoupled-min-lr` (else
    /// `--min-lr`): the caller's scheduler computes it every step. Without the bit those params
    /// step with adam_lr, as every AdamW param does; a caller compiled against an older layout
    /// (20 or 40 bytes) has no such field, and the bit is refused there.
    pub decoupled_lr: f32,
}

/// Every released `muon_step_args_t` layout, oldest first: its last field and `sizeof` (every
/// field is 4 bytes, so no layout has padding). Appending a field appends a row (a test checks
/// the list against the struct). A struct_size below the current one and not listed is
/// refused (a torn or hand-computed size); the first layout's overrides nothing.
pub(crate) const RELEASED_STEP_ARGS_LAYOUTS: [(&str, usize); 3] =
    [("adam_weight_decay", 20), ("adam_eps", 40), ("decoupled_lr", 44)];

/// Every MUON_STEP_OVERRIDE_* bit.
const STEP_OVERRIDE_BITS: u32 = MUON_STEP_OVERRIDE_MUON_MOMENTUM
    | MUON_STEP_OVERRIDE_ADAM_BETA1
    | MUON_STEP_OVERRIDE_ADAM_BETA2
    | MUON_STEP_OVERRIDE_ADAM_EPS
    | MUON_STEP_OVERRIDE_DECOUPLED_LR;

impl muon_step_args_t {
    /// The step's arguments: each override whose bit is set; unknown bits are refused, named
    /// `{arg}overrides` (`args->`, `args[1].`). The values are checked by the step.
    pub fn to_args(&self, arg: &str) -> crate::error::Result<StepArgs> {
        let unknown = self.overrides & !STEP_OVERRIDE_BITS;
        if unknown != 0 {
            bail!(
                InvalidArgument,
                "{arg}overrides: unknown bits 0x{unknown:x} (the MUON_STEP_OVERRIDE_* bits are 0x{STEP_OVERRIDE_BITS:x})"
            );
        }
        let field = |bit: u32, value: f32| (self.overrides & bit != 0).then_some(value);
        Ok(StepArgs {
            lr: self.lr,
            weight_decay: self.weight_decay,
            adam_lr: self.adam_lr,
            adam_weight_decay: self.adam_weight_decay,
            overrides: StepOverrides {
                muon_momentum: field(MUON_STEP_OVERRIDE_MUON_MOMENTUM, self.muon_momentum),
                adam_beta1: field(MUON_STEP_OVERRIDE_ADAM_BETA1, self.adam_beta1),
                adam_beta2: field(MUON_STEP_OVERRIDE_ADAM_BETA2, self.adam_beta2),
                adam_eps: field(MUON_STEP_OVERRIDE_ADAM_EPS, self.adam_eps),
                decoupled_lr: field(MUON_STEP_OVERRIDE_DECOUPLED_LR, self.decoupled_lr),
            },
        })
    }
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
///        With param_sharding = sharded (and before its backward use too) it first gathers
///        the bucket, as muon_optimizer_gather_params, unless it is gathered.
/// @param[in] bucket The bucket of the param about to be used (muon_param_view_t.bucket); an
///            unknown bucket is MUON_STATUS_INVALID_ARGUMENT.
/// @note Stream: async, stream-ordered (the caller's stream waits for the bucket's param
///       collective), no host sync, graph-capture safe.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_wait_params(opt: *mut muon_optimizer_t, bucket: u32) -> muon_status_t {
    with_mut::<Optimizer>("muon_optimizer_wait_params", opt, "opt", |o| o.wait_params(bucket))
}

/// @brief Prefetch: with param_sharding = sharded, issue the gather of bucket @p bucket into
///        its slot of the gather window, on the library's comm stream after everything
///        enqueued on the caller's stream so far; muon_optimizer_wait_params(bucket) then orders
///        the caller after it. The gather copies each owner's range into the slot, zeroes the
///        slot's gradients and runs the bucket's param collectives (MXFP8 params are quantized
///        from the gathered bf16). A bucket always takes the same slot (its position in the
///        forward order modulo the slots: param_prefetch_buckets + 1 with
///        reshard_after_forward, else one per bucket), so its muon_param_view_t pointers are the
///        same at every gather; they are valid from the gather to its release.
///        A gathered bucket is left as it is; with replicated params (every bucket always
///        gathered) the call does nothing.
/// @param[in,out] opt    Finalized optimizer (one thread at a time).
/// @param[in]     bucket muon_param_view_t.bucket; an unknown bucket is
///                       MUON_STATUS_INVALID_ARGUMENT.
/// @return MUON_STATUS_SUCCESS once enqueued; MUON_STATUS_INVALID_STATE when the bucket's slot
///         still holds another bucket (release it first), or when the bucket was released with
///         its gradients ready and their reduction is still to be issued; the message names
///         the buckets and the slot.
/// @note Collective over the data-parallel group (every rank gathers the same buckets in the
///       same order). Stream: async, stream-ordered, no host sync, graph-capture safe (the
///       slots are allocated at finalize).
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_gather_params(opt: *mut muon_optimizer_t, bucket: u32) -> muon_status_t {
    with_mut::<Optimizer>("muon_optimizer_gather_params", opt, "opt", |o| o.gather_params(bucket))
}

/// @brief With param_sharding = sharded, end bucket @p bucket's gathered window after its last
///        use on the caller's stream (after its forward with reshard_after_forward, after its
///        backward): its slot may take the next bucket, whose gather is ordered after the
///        caller's work enqueued before it. Call it before the first muon_optimizer_grad_ready
///        of the bucket's params or after the last: a bucket released with every gradient
///        ready keeps its slot until its gradient reduction is issued (the reductions run in
///        the plan's backward order). With replicated params the call does nothing.
/// @param[in,out] opt    Finalized optimizer (one thread at a time).
/// @param[in]     bucket muon_param_view_t.bucket; an unknown bucket is
///                       MUON_STATUS_INVALID_ARGUMENT.
/// @return MUON_STATUS_SUCCESS; MUON_STATUS_INVALID_STATE when the bucket is not gathered, or
///         when only some of its params' gradients are ready (the others would be lost); the
///         message names the bucket and a param.
/// @note Stream: nothing is enqueued; no host sync; graph-capture safe.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_release_params(opt: *mut muon_optimizer_t, bucket: u32) -> muon_status_t {
    with_mut::<Optimizer>("muon_optimizer_release_params", opt, "opt", |o| {
        o.release_params(bucket)
    })
}

/// @brief Backward hook: param @p param_id's gradient is fully accumulated for this iteration.
///        With overlap_grad_reduce, a bucket's gradient collective starts when its last param
///        is ready and every bucket before it in the plan's backward order has started: the
///        collectives are issued in one order on every rank whatever the order of these calls
///        (NCCL needs one order). Optional: call it at most once per param per iteration, for
///        the params whose gradients are complete; the step then reduces every bucket whose
///        collective has not started, after everything enqueued on the caller's stream, so a
///        step with no grad_ready at all gives the same bits, without the overlap.
///        With param_sharding = sharded the gradient lives in the bucket's gather slot, so the
///        call must come while the bucket is gathered (else MUON_STATUS_INVALID_STATE naming the
///        param and the bucket), and a bucket's gradients reach their owners only through it
///        or through a step while the bucket is still gathered (a step counts a bucket that is
///        not gathered as having no gradient).
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_grad_ready(opt: *mut muon_optimizer_t, param_id: u32) -> muon_status_t {
    with_mut::<Optimizer>("muon_optimizer_grad_ready", opt, "opt", |o| o.grad_ready(param_id))
}

/// @brief One optimizer step: orders the updates after the gradient collectives (which sum
///        the ranks' gradients; the updates take their mean, times 1/dp, then clip it), computes
///        the global grad norm, the clip coefficient and the skip decision on a non-finite
///        gradient on the device, then bucket by bucket in the order the next forward uses them updates the
///        owned params and launches that bucket's param collectives, so they overlap the
///        updates of later buckets (with overlap_param_gather, wait_params orders their use).
///        With @p info NULL the call only enqueues work on the streams and never waits for the
///        device (the arguments reach the device by an asynchronous copy from pinned memory);
///        read what the step did later with muon_optimizer_step_info.
/// @param[in]  args Learning rates and weight decays (and overrides of the config's momentum
///             and betas, muon_step_args_t.overrides) for this step only, or NULL to use the
///             ones last set with muon_optimizer_set_step_args (then the step copies nothing
///             from the host: a step captured in a CUDA graph reads them from device memory at
///             every replay; MUON_STATUS_INVALID_STATE if none were set — a step's own args
///             never count as set). A step given its args leaves the set ones in place, so
///             `set_step_args(A); step(B); step(NULL)` steps with B, then with A: the copy of
///             B is followed, after the step's updates, by a copy of A back (two asynchronous
///             host-to-device copies; capture the NULL form).
/// @param[out] info What the step did, or NULL. Non-NULL waits for the caller's stream to
///             read it back (the same as muon_optimizer_step_info right after the step).
/// @return MUON_STATUS_PLAN_MISMATCH with a non-NULL @p info (or from the next
///         muon_optimizer_step_info) when the ranks the norm is gathered over — the
///         data-parallel group, or the norm group that spans the TP and PP ranks too — have
///         taken different numbers of steps (a checkpoint loaded on some ranks only): the step
///         is skipped on every rank, and the message names a rank and rank 0 with their counts.
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
            o.step_async(&unsafe { read_step_args(args, "args->") }?)?;
        }
        if !info.is_null() {
            write_step_info(info, o.step_info()?);
        }
        Ok(())
    })
}

/// @brief One step of several optimizers of this rank with one gradient norm, clip
///        coefficient and skip decision — e.g. dense params on the data-parallel
///        communicator and expert params on the expert-data-parallel one (Megatron's chained
///        optimizer). Each optimizer gathers its ranks' Σ g² over its norm group
///        (muon_optimizer_set_norm_group; give both a group spanning every rank whose
///        gradients the norm covers; each sums the squares of its mean gradients, its sums
///        times 1 / its own dp), then each derives the norm from all of them, added exactly,
///        and steps as muon_optimizer_step does, scaling its gradients by 1 / its own dp, then
///        by the clip.
///        Enqueues only, never waits; read what the step did with muon_optimizer_step_info on
///        any of them (the norm, clip and skip are the same).
///
/// Every rank passes its optimizers in the same order (their gathers are issued in that
/// order). The optimizers run on the same backend and, with
/// NCCL, on the same caller stream (each reads the others' gathered sums in stream order),
/// and have the same clip_grad. Everything is checked before any work is enqueued.
/// @param[in] opts  @p count distinct finalized optimizer handles.
/// @param[in] count 1 to 8.
/// @param[in] args  NULL to use the arguments each optimizer last set with
///                  muon_optimizer_set_step_args (MUON_STATUS_INVALID_STATE naming opts[k] if
///                  one has none), or an array of @p count step args (one per optimizer, each
///                  with struct_size set to the caller's sizeof) for this step only: as with
///                  muon_optimizer_step, the set ones stay in place for later NULL steps.
/// @return MUON_STATUS_INVALID_ARGUMENT for a handle passed twice, a count out of range,
///         different streams or clip_grad values (the message names the optimizer);
///         MUON_STATUS_COMM_MISMATCH for a host optimizer beside an NCCL one. A failure of
///         these checks changes nothing. A failure after them (a member's collective timed
///         out, an NCCL error; the message names opts[k]) leaves the step begun on some
///         members, with collectives their peers may wait for, and no shared norm to finish
///         it: every member becomes unusable, and each later call on any of them returns
///         MUON_STATUS_COMM_BROKEN naming the failure. Destroy them all (and abort their NCCL
///         communicators).
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizers_step(
    opts: *const *mut muon_optimizer_t,
    count: usize,
    args: *const muon_step_args_t,
) -> muon_status_t {
    const FUNCTION: &str = "muon_optimizers_step";
    if opts.is_null() {
        return fail(
            FUNCTION,
            Error::new(ErrorKind::NullArgument, "opts is NULL".to_string()),
        );
    }
    if count == 0 || count > MAX_NORM_TERMS {
        return fail(
            FUNCTION,
            Error::new(
                ErrorKind::InvalidArgument,
                format!("count {count} must be 1 to {MAX_NORM_TERMS} optimizers"),
            ),
        );
    }
    // SAFETY: the caller passes `count` handles.
    let handles = unsafe { std::slice::from_raw_parts(opts, count) };
    with_mut_each::<Optimizer>(FUNCTION, handles, "opts", |members| {
        let args = if args.is_null() {
            None
        } else {
            Some(unsafe { read_step_args_array(args, count) }?)
        };
        Optimizer::step_shared(members, args.as_deref())
    })
}

/// `count` step args laid out with the stride of the first one's struct_size.
///
/// # Safety
/// `args` points to `count` readable `muon_step_args_t` of the caller's size.
unsafe fn read_step_args_array(args: *const muon_step_args_t, count: usize) -> crate::error::Result<Vec<StepArgs>> {
    non_null(args, "args")?;
    // SAFETY: non-NULL, starts with a u32.
    let stride = unsafe { std::ptr::read_unaligned(args.cast::<u32>()) } as usize;
    (0..count)
        .map(|k| {
            // SAFETY: element k of the caller's array.
            let element = unsafe { args.cast::<u8>().add(k * stride) }.cast::<muon_step_args_t>();
            let size = unsafe { std::ptr::read_unaligned(element.cast::<u32>()) } as usize;
            if size != stride {
                bail!(
                    AbiMismatch,
                    "args[{k}].struct_size: {size} differs from args[0]'s {stride}; set every element's to sizeof(muon_step_args_t)"
                );
            }
            unsafe { read_step_args(element, &format!("args[{k}].")) }
        })
        .collect()
}

/// @brief Copy the arguments of the next steps (learning rates, weight decays, overrides of the
///        config's momentum and betas) to the device, ordered on the caller's stream before
///        any later step; never waits. Every later step without args of its own uses them
///        until the next call (steps given their own args do not replace them). With
///        muon_optimizer_step(opt, NULL, NULL) captured in a CUDA graph, call this before each
///        replay to change the learning rate, the momentum or the betas.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_set_step_args(
    opt: *mut muon_optimizer_t,
    args: *const muon_step_args_t,
) -> muon_status_t {
    with_mut::<Optimizer>("muon_optimizer_set_step_args", opt, "opt", |o| {
        o.set_step_args(&unsafe { read_step_args(args, "args->") }?)
    })
}

/// The caller's step arguments, named `{arg}…` (`args->`, `args[1].`): NULL and
/// `struct_size` checked (a released layout's size, or larger: a newer header's), then
/// `min(struct_size, sizeof)` bytes read over no overrides, as [`read_config`] reads a config.
///
/// # Safety
/// `args` is NULL or points to `struct_size` readable bytes.
pub(crate) unsafe fn read_step_args(args: *const muon_step_args_t, arg: &str) -> crate::error::Result<StepArgs> {
    non_null(args, "args")?;
    // SAFETY: non-NULL; the struct starts with a u32.
    let size = unsafe { std::ptr::read_unaligned(args.cast::<u32>()) } as usize;
    let current = std::mem::size_of::<muon_step_args_t>();
    let released = RELEASED_STEP_ARGS_LAYOUTS.map(|(_, size)| size);
    if size < current && !released.contains(&size) {
        let list: Vec<String> = released.iter().map(usize::to_string).collect();
        bail!(
            AbiMismatch,
            "{arg}struct_size: {size} is not the size of a released muon_step_args_t ({} bytes, or more from a newer header); set it to sizeof(muon_step_args_t)",
            list.join(", ")
        );
    }
    let mut raw = muon_step_args_t::default();
    // SAFETY: the caller guarantees `size` readable bytes; we copy at most our own size.
    unsafe {
        std::ptr::copy_nonoverlapping(
            args.cast::<u8>(),
            (&mut raw as *mut muon_step_args_t).cast::<u8>(),
            size.min(current),
        )
    };
    if raw.overrides & MUON_STEP_OVERRIDE_DECOUPLED_LR != 0
        && size < std::mem::offset_of!(muon_step_args_t, decoupled_lr) + 4
    {
        bail!(
            InvalidArgument,
            "{arg}overrides: MUON_STEP_OVERRIDE_DECOUPLED_LR is set, but a {size}-byte muon_step_args_t has no decoupled_lr; set struct_size to sizeof(muon_step_args_t)"
        );
    }
    raw.to_args(arg)
}

/// @brief What the last step did (all zeros before the first step): grad norm, clip
///        coefficient, whether it was skipped, steps taken. Waits for the caller's stream (a
///        device-to-host copy of a few scalars): call it when the value is needed, e.g. for
///        logging every N steps, not inside a captured region.
/// @param[out] info Written on success; info->struct_size must be set by the caller.
/// @return MUON_STATUS_PLAN_MISMATCH when the last step's ranks had taken different numbers
///         of steps (see muon_optimizer_step; the step was skipped on every rank).
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

/// @brief Order the caller's stream after all of the library's queued communication, without
///        waiting on the host (an event the caller's stream waits on; nothing when the comm
///        stream has had no work since the last join or synchronize).
///
/// CUDA graph capture of an iteration. Every call between zero_grad and step issues only
/// stream-ordered work and event records and waits (no allocation, no event query or
/// synchronize, no host branch on device values; step reads its arguments and the clip and
/// skip decisions from device memory). Capture requires every stream forked from the captured
/// one (the library's comm stream) to be joined back before it ends, and no wait on work
/// recorded outside the capture. The protocol:
///   1. Warm up eagerly, ending each iteration with muon_optimizer_join.
///   2. muon_optimizer_set_step_args (outside the capture; again before each replay to change
///      the arguments).
///   3. cudaStreamBeginCapture(stream); muon_optimizer_step(opt, NULL, NULL);
///      muon_optimizer_zero_grad; forward with muon_optimizer_wait_params per bucket;
///      backward with muon_optimizer_grad_ready per param; muon_optimizer_join;
///      cudaStreamEndCapture. Starting the region with the step keeps every overlap: the
///      param collectives overlap the forward, the gradient collectives the backward, and the
///      join waits only for the last gradient collective, which the next step waits for
///      anyway.
///   4. Replay the graph once per iteration; muon_optimizer_step_info reads the step's outcome
///      after a replay (it waits), never inside the captured region.
///
/// The communicator must support capture (NCCL 2.9.6+).
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_join(opt: *mut muon_optimizer_t) -> muon_status_t {
    with_mut::<Optimizer>("muon_optimizer_join", opt, "opt", |o| o.join())
}

/// @brief Block until every operation the optimizer enqueued has finished.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_synchronize(opt: *mut muon_optimizer_t) -> muon_status_t {
    with_mut::<Optimizer>("muon_optimizer_synchronize", opt, "opt", |o| o.synchronize())
}

/// @brief The library's own host Newton–Schulz orthogonalization (for checking numerics), with
///        the default normalization floor (muon_config_t.muon_ns_eps = 1e-7) and the standard
///        iteration (muon_newton_schulz_host_config() takes every Newton–Schulz field).
/// @param[in]  in   rows×cols row-major f32 input (host).
/// @param[out] out  rows×cols row-major f32 output (host); may not alias @p in.
/// @param[in]  rows, cols >= 1 each (else MUON_STATUS_OUT_OF_RANGE).
/// @param[in]  coefficient_set MUON_COEFFICIENTS_* but _CUSTOM (whose table only
///             muon_newton_schulz_host_config() takes); @p steps 1..=100 (5 with
///             _CUBIC5 and _POLAR_EXPRESS_5); @p precision MUON_NS_PRECISION_*.
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
        let opts = || {
            Ok(NsOptions {
                coefficients: CoefficientSet::from_code("coefficient_set", coefficient_set)?,
                custom: CustomCoefficients::NONE,
                steps,
                precision: NsPrecision::from_code("precision", precision)?,
                eps: DEFAULT_NS_EPS,
                symmetric_tile: DEFAULT_SYMMETRIC_TILE,
                method: NsMethod::Standard,
            })
        };
        // SAFETY: forwarded from the caller's contract.
        unsafe { host_newton_schulz(input, out, (rows, cols), opts) }
    })
}

/// @brief The library's own host Newton–Schulz orthogonalization (for checking numerics) with
///        the Newton–Schulz fields of @p cfg: muon_coefficient_set, muon_num_ns_steps,
///        muon_ns_precision, muon_ns_eps and muon_ns_method (the Gram iteration where it
///        applies to a rows×cols matrix, see muon_config_t.muon_ns_method); what an optimizer
///        with @p cfg computes for one unsharded Muon matrix.
/// @param[in]  in   rows×cols row-major f32 input (host).
/// @param[out] out  rows×cols row-major f32 output (host); may not alias @p in.
/// @param[in]  rows, cols >= 1 each (else MUON_STATUS_OUT_OF_RANGE).
/// @param[in]  cfg  Config initialised by muon_config_init(); checked as by
///             muon_config_validate().
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_newton_schulz_host_config(
    input: *const f32,
    out: *mut f32,
    rows: u32,
    cols: u32,
    cfg: *const muon_config_t,
) -> muon_status_t {
    run("muon_newton_schulz_host_config", || {
        // SAFETY: NULL or a muon_config_t of struct_size bytes, per the contract.
        let opts = || unsafe { read_config(cfg) }.map(|cfg| NsOptions::from_config(&cfg));
        // SAFETY: forwarded from the caller's contract.
        unsafe { host_newton_schulz(input, out, (rows, cols), opts) }
    })
}

/// The body of the host Newton–Schulz exports: checks the pointers and the shape, then reads
/// the options and runs.
///
/// # Safety
/// `input` and `out` are NULL or hold `rows·cols` values each.
unsafe fn host_newton_schulz(
    input: *const f32,
    out: *mut f32,
    (rows, cols): (u32, u32),
    opts: impl FnOnce() -> crate::error::Result<NsOptions>,
) -> crate::error::Result<()> {
    non_null(input, "in")?;
    non_null(out, "out")?;
    if rows == 0 || cols == 0 {
        bail!(OutOfRange, "rows and cols must be >= 1 (got {rows}×{cols})");
    }
    let opts = opts()?;
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
}

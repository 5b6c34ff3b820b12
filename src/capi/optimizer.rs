//! `muon_optimizer_t`: lifecycle, registration, plan and views.

use std::ffi::c_char;
use std::sync::Arc;

use crate::bail;
use crate::capi::boundary::{checked_size_at_least, non_null, run};
use crate::capi::comm::muon_comm_t;
use crate::capi::config::{muon_config_t, read_config};
use crate::capi::constants::route_code;
use crate::capi::handle::{Exposed, destroy, into_raw, with_mut, with_ref};
use crate::capi::param::{MIN_VIEW_SIZE, muon_param_desc_t, muon_param_view_t, read_desc};
use crate::capi::status::muon_status_t;
use crate::comm::Communicator;
use crate::optimizer::Optimizer;

/// Opaque optimizer handle (one per rank).
#[allow(non_camel_case_types)]
pub struct muon_optimizer_t {
    _private: [u8; 0],
}

/// `struct CUstream_st` — the type behind `cudaStream_t`; declared, never defined, in the header.
#[allow(non_camel_case_types)]
#[repr(C)]
pub struct CUstream_st {
    _private: [u8; 0],
}

impl Exposed for Optimizer {
    type C = muon_optimizer_t;
    const MAGIC: u32 = 0x4D55_4F4E;
    const NAME: &'static str = "optimizer";
}

/// @brief Create an optimizer for this rank.
/// @param[in]  cfg    Configuration (see muon_config_init()); copied.
/// @param[in]  comm   Communicator of this rank; must stay alive until the optimizer is
///                    destroyed. One optimizer per communicator at a time.
/// @param[in]  stream cudaStream_t the framework computes on (borrowed; NULL = legacy default
///                    stream). Must be NULL with a host group.
/// @param[out] out    The new optimizer (caller owns; release with muon_optimizer_destroy).
/// @return MUON_STATUS_INCOMPATIBLE_OPTIONS for a non-NULL stream with a host group, or a
///         configuration whose fields cannot be combined (a padded muon_layout with contiguous
///         muon_ownership); the message names both.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_create(
    cfg: *const muon_config_t,
    comm: *mut muon_comm_t,
    stream: *mut CUstream_st,
    out: *mut *mut muon_optimizer_t,
) -> muon_status_t {
    let communicator = match borrow_comm("muon_optimizer_create", comm, "comm") {
        Ok(c) => c,
        Err(status) => return status,
    };
    run("muon_optimizer_create", || {
        non_null(out, "out")?;
        let cfg = unsafe { read_config(cfg) }?;
        let stream = crate::backend::cuda::CallerStream(stream.cast());
        let optimizer = Optimizer::new(cfg, communicator.claim()?, stream)?;
        // SAFETY: non-NULL out-pointer.
        unsafe { *out = into_raw(optimizer) };
        Ok(())
    })
}

/// The communicator behind handle `comm` (argument `name` of `function`), or the status of a
/// NULL, foreign or poisoned handle (its message set).
fn borrow_comm(function: &str, comm: *mut muon_comm_t, name: &str) -> Result<Arc<Communicator>, muon_status_t> {
    let mut communicator = None;
    let status = with_ref::<Arc<Communicator>>(function, comm, name, |c| {
        communicator = Some(c.clone());
        Ok(())
    });
    communicator.ok_or(status)
}

/// @brief Make the gradient norm — and so the clip coefficient and the found-inf skip — global
///        over @p group instead of the optimizer's data-parallel communicator alone.
///
/// With tensor, pipeline or expert parallelism each data-parallel group holds a different
/// part of the model: pass a communicator spanning all of them (e.g. every rank of the job),
/// and every rank then clips with the same coefficient and skips the same steps. Each rank
/// counts the gradients it owns once; flag copies that another rank counts with
/// MUON_PARAM_FLAG_NORM_REPLICA (tensor-parallel duplicates on TP ranks > 0, a later pipeline
/// stage's copy of a shared embedding). The ranks' sums are exact and gathered and added
/// exactly, so every rank computes the same bits (the same at any data-parallel size). Several optimizers of a rank (dense and
/// expert params) share one clip through muon_optimizers_step, each with a norm group of its
/// own over the same ranks. Finalize also checks, over the group, that every tie group
/// (muon_param_desc_t.tie_group) declared on several ranks routes alike on all of them: an
/// untagged copy of an embedding on another pipeline stage (an MTP layer's) fails finalize on
/// every rank with MUON_STATUS_PLAN_MISMATCH naming both params; with vocab_size 0, an untagged
/// copy declared without a tie group fails it with MUON_STATUS_ROUTING_CONFLICT when its rows
/// match the embedding any stage declares (muon_config_t.vocab_size).
/// @param[in,out] opt   Optimizer handle, before muon_optimizer_finalize().
/// @param[in]     group A communicator of the same kind as the optimizer's (host group or
///                      NCCL) whose size is a multiple of the data-parallel size; borrowed
///                      (its handle may be destroyed after this call; the optimizer keeps what
///                      it needs). Collectives on it run on the optimizer's comm stream, so
///                      the optimizer claims it as it claims its data-parallel communicator:
///                      no other optimizer may use it while this one lives. Every rank of the
///                      data-parallel group must set a group of the same size (else finalize
///                      returns MUON_STATUS_PLAN_MISMATCH). The group inherits the
///                      optimizer's collective_timeout_ms.
/// @return MUON_STATUS_COMM_MISMATCH for a group of another kind or size;
///         MUON_STATUS_INVALID_STATE for a group another optimizer uses (or this one's own
///         data-parallel communicator).
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_set_norm_group(
    opt: *mut muon_optimizer_t,
    group: *mut muon_comm_t,
) -> muon_status_t {
    let communicator = match borrow_comm("muon_optimizer_set_norm_group", group, "group") {
        Ok(c) => c,
        Err(status) => return status,
    };
    with_mut::<Optimizer>("muon_optimizer_set_norm_group", opt, "opt", |o| {
        o.set_norm_group(communicator)
    })
}

/// @brief Give the optimizer its tensor-parallel group, over which MUON_TP_MODE_DUPLICATED
///        gathers the shards of every Muon matrix flagged MUON_PARAM_FLAG_TP_SHARD_ROWS or
///        _COLS: each owner orthogonalizes the whole matrix and keeps its shard, scaled by
///        the whole matrix's shape (Megatron's `--muon-tp-mode duplicated`); with
///        MUON_TP_MODE_DISTRIBUTED each owner runs Newton–Schulz on its shard with the norm
///        and every X·Xᵀ all-reduced over the group (`--muon-tp-mode distributed`). Fused
///        splits apply per shard, each component orthogonalized whole (Megatron's split QKV in
///        these modes).
///
/// The group is this rank's tensor-parallel group: the ranks holding the other shards of its
/// matrices at the same data-parallel index (and pipeline stage); its rank order is the order
/// of the shards. Every TP rank registers the same shard names, shapes and order, so each
/// matrix's shards have owners at one data-parallel index, and in these two modes uses the same
/// Newton–Schulz settings (muon_ns_method, muon_ns_precision, muon_num_ns_steps,
/// muon_coefficient_set, muon_custom_coefficients, muon_ns_eps), so the shards of a matrix are
/// orthogonalized alike (finalize checks both over the group: MUON_STATUS_PLAN_MISMATCH otherwise). Give the optimizers a norm group spanning the TP
/// ranks too, so the shards are clipped and skipped alike. On the cuda backend the gather is
/// an NCCL all-gather on this communicator, on the optimizer's comm stream between event
/// waits, inside the owner's update (no host synchronization). In any muon_tp_mode, a group of
/// more than one rank also makes checkpoints hold the TP shards in the unsharded params'
/// coordinates, so they reload at another TP size (muon_optimizer_save,
/// muon_optimizer_load_union); the ranks of a data-parallel group must then sit at one TP rank
/// of groups of one size (finalize: MUON_STATUS_PLAN_MISMATCH).
/// @param[in,out] opt   Optimizer handle, before muon_optimizer_finalize().
/// @param[in]     group A communicator of the optimizer's kind (host group or NCCL, on the
///                      optimizer's device); borrowed, and claimed like the data-parallel one
///                      (no other optimizer may use it while this one lives). The group
///                      inherits the optimizer's collective_timeout_ms.
/// @return MUON_STATUS_COMM_MISMATCH for a group of another kind;
///         MUON_STATUS_INVALID_STATE for a group another optimizer uses.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_set_tp_group(
    opt: *mut muon_optimizer_t,
    group: *mut muon_comm_t,
) -> muon_status_t {
    let communicator = match borrow_comm("muon_optimizer_set_tp_group", group, "group") {
        Ok(c) => c,
        Err(status) => return status,
    };
    with_mut::<Optimizer>("muon_optimizer_set_tp_group", opt, "opt", |o| {
        o.set_tp_group(communicator)
    })
}

/// @brief Register a parameter (forward order). Only before muon_optimizer_finalize().
///        Each route's buffer holds its params in reverse registration order (backward order,
///        so a bucket's gradients complete together), each starting 64-element aligned: the
///        last param registered is first in its buffer. A framework whose own flat buffer
///        should alias the library's (zero copy) lays it out the same way, or reads every
///        param's offset from muon_optimizer_param_view after finalize.
///        An f32 param has no separate fp32 master: the part of its buffer a rank owns is the
///        master the step updates in place, so writing into it between steps changes the
///        training state (and the checkpoint); another dtype's buffer holds a cast of the
///        master, which the next step overwrites.
/// @param[in,out] opt      Optimizer handle.
/// @param[in]     desc     Description; every pointer in it is read during this call only.
/// @param[out]    param_id Id of the new param (its registration index); may be NULL.
/// @return On failure nothing is registered.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_add_param(
    opt: *mut muon_optimizer_t,
    desc: *const muon_param_desc_t,
    param_id: *mut u32,
) -> muon_status_t {
    with_mut::<Optimizer>("muon_optimizer_add_param", opt, "opt", |o| {
        let decoded = unsafe { read_desc(desc, o.init_stream()) }?;
        let id = o.add_param(decoded.spec, decoded.init)?;
        if !param_id.is_null() {
            // SAFETY: non-NULL out-pointer.
            unsafe { *param_id = id };
        }
        Ok(())
    })
}

/// @brief The route (MUON_ROUTE_MUON or MUON_ROUTE_ADAMW) of a registered param.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_param_route(
    opt: *const muon_optimizer_t,
    param_id: u32,
    route: *mut u32,
) -> muon_status_t {
    with_ref::<Optimizer>("muon_optimizer_param_route", opt, "opt", |o| {
        non_null(route, "route")?;
        let r = o.route(param_id)?;
        // SAFETY: non-NULL out-pointer.
        unsafe { *route = route_code(r) };
        Ok(())
    })
}

/// @brief Change a finalized param's multipliers of its route's learning rate and weight decay
///        (its muon_param_desc_t lr_scale and wd_scale) for the steps enqueued after this call:
///        lr_eff = lr · lr_scale and wd_eff = wd · wd_scale (0 for a param flagged
///        MUON_PARAM_FLAG_NO_WEIGHT_DECAY or spared by the config's weight_decay_rule), as at
///        registration — e.g. a
///        framework whose param groups share a route but follow schedules of their own passes
///        lr = 1 in the step args and each group's current rate here (the same bits as that
///        rate in the args). Every rank makes the same change before the same step; a step
///        captured in a CUDA graph keeps the scales it was captured with. The plan and a
///        checkpoint do not depend on the scales.
/// @param[in] param_id The id muon_optimizer_add_param returned.
/// @return MUON_STATUS_INVALID_STATE before finalize; MUON_STATUS_INVALID_ARGUMENT for an
///         unknown param_id; MUON_STATUS_OUT_OF_RANGE for a scale that is negative or not
///         finite (the message names it); nothing changes on failure.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_set_param_scales(
    opt: *mut muon_optimizer_t,
    param_id: u32,
    lr_scale: f32,
    wd_scale: f32,
) -> muon_status_t {
    with_mut::<Optimizer>("muon_optimizer_set_param_scales", opt, "opt", |o| {
        o.set_param_scales(param_id, lr_scale, wd_scale)
    })
}

/// @brief Plan the layout and verify every rank planned the same. Collective: every rank of
///        the communicator calls it.
/// @return MUON_STATUS_PLAN_MISMATCH on every rank when the ranks registered different params
///         (the message names the first differing param, or the counts) or use different
///         settings that change numerics or communication (the message names the first
///         differing config field; collective_timeout_ms, host_comm_mode, host_threads and
///         vocab_size are a rank's own and may differ);
///         MUON_STATUS_ROUTING_CONFLICT on every rank of the norm group (the data-parallel
///         group without one) when, with vocab_size 0, a Muon-routed param has as many rows as
///         the embedding declared on any of its ranks (muon_config_t.vocab_size; the message
///         names the param and its rank).
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_finalize(opt: *mut muon_optimizer_t) -> muon_status_t {
    with_mut::<Optimizer>("muon_optimizer_finalize", opt, "opt", |o| o.finalize())
}

/// @brief The number of buckets of the finalized plan: muon_optimizer_wait_params takes 0 to
///        *count − 1, and every param's muon_param_view_t.bucket is one of them.
/// @param[in]  opt   Finalized optimizer.
/// @param[out] count Written on success.
/// @return MUON_STATUS_INVALID_STATE before finalize.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_num_buckets(opt: *const muon_optimizer_t, count: *mut u32) -> muon_status_t {
    with_ref::<Optimizer>("muon_optimizer_num_buckets", opt, "opt", |o| {
        non_null(count, "count")?;
        let n = o.plan()?.buckets.len() as u32;
        // SAFETY: non-NULL out-pointer.
        unsafe { *count = n };
        Ok(())
    })
}

/// @brief Copy the plan and its report as JSON (NUL-terminated) into @p buf.
/// @param[in]  opt Finalized optimizer.
/// @param[out] buf Destination, or NULL with @p cap 0 to query the size.
/// @param[in]  cap Capacity of @p buf in bytes.
/// @param[out] len Bytes needed including the NUL; written on success and on
///             MUON_STATUS_BUFFER_TOO_SMALL.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_plan_json(
    opt: *const muon_optimizer_t,
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> muon_status_t {
    with_ref::<Optimizer>("muon_optimizer_plan_json", opt, "opt", |o| {
        non_null(len, "len")?;
        let names: Vec<String> = o.registry().params().iter().map(|p| p.name.clone()).collect();
        let json = o.plan()?.to_json(&names);
        let needed = json.len() + 1;
        // SAFETY: non-NULL out-pointer.
        unsafe { *len = needed };
        if buf.is_null() && cap == 0 {
            return Ok(());
        }
        non_null(buf, "buf")?;
        if cap < needed {
            bail!(BufferTooSmall, "buf: capacity {cap} < {needed} bytes needed (see *len)");
        }
        // SAFETY: buf has cap >= needed writable bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(json.as_ptr(), buf.cast::<u8>(), json.len());
            *buf.add(json.len()) = 0;
        }
        Ok(())
    })
}

/// @brief Where param @p param_id lives: bucket, buffer offset, owner, and pointers. With
///        param_sharding = sharded the pointers are in the bucket's gather slot (the same at
///        every gather) and the call fails with MUON_STATUS_INVALID_STATE, naming the param and
///        the bucket, while the bucket is not gathered.
/// @param[in]  opt  Finalized optimizer.
/// @param[out] view Written on success; view->struct_size must be set by the caller
///                  (sizeof(muon_param_view_t)): a struct of an older header gets the fields it
///                  has (its struct_size bytes), a smaller one MUON_STATUS_ABI_MISMATCH.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_param_view(
    opt: *const muon_optimizer_t,
    param_id: u32,
    view: *mut muon_param_view_t,
) -> muon_status_t {
    with_ref::<Optimizer>("muon_optimizer_param_view", opt, "opt", |o| {
        let size = checked_size_at_least(view as *const muon_param_view_t, MIN_VIEW_SIZE, "view")?;
        let mut out = muon_param_view_t::new(o.param_view(param_id)?, o.config().mxfp8_swizzled_scales);
        let n = size.min(std::mem::size_of::<muon_param_view_t>());
        out.struct_size = n as u32;
        // SAFETY: non-NULL with at least `size` >= `n` writable bytes (the caller's struct_size).
        unsafe { std::ptr::copy_nonoverlapping((&out as *const muon_param_view_t).cast::<u8>(), view.cast::<u8>(), n) };
        Ok(())
    })
}

/// @brief Destroy an optimizer. NULL is a no-op; must not be called twice. Synchronize the
///        streams used before calling.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_destroy(opt: *mut muon_optimizer_t) -> muon_status_t {
    destroy::<Optimizer>("muon_optimizer_destroy", opt, "opt")
}

/// Status for a test-only forced panic inside a handle call.
#[cfg(test)]
pub fn force_panic(opt: *mut muon_optimizer_t) -> muon_status_t {
    with_mut::<Optimizer>("force_panic", opt, "opt", |_| panic!("forced panic for a test"))
}

//! QK-clip (Kimi K2's MuonClip) of attention matrices by the next step: `muon_qk_clip_t`,
//! `muon_qk_clip_init`, `muon_optimizer_qk_clip` (docs/design.md §14).

use crate::backend::ops::QkMaxima;
use crate::bail;
use crate::capi::boundary::{checked_size, non_null, run_or};
use crate::capi::handle::with_mut;
use crate::capi::optimizer::muon_optimizer_t;
use crate::capi::status::muon_status_t;
use crate::error::Result;
use crate::numerics::qk_clip::{QkHeads, QkKind};
use crate::optimizer::Optimizer;
use crate::schedule::QkClipRequest;

/// Megatron's fused `linear_qkv` `[G·(H/G·d + 2·d), hidden]`: per query group its heads' query
/// rows, its key rows, its value rows (register it with `split_sizes = {H/G·d, d, d}` and
/// `num_split_groups = G`).
pub const MUON_QK_KIND_FUSED_QKV: u32 = 1;
/// A separate query projection `[H·d, hidden]`.
pub const MUON_QK_KIND_QUERY: u32 = 2;
/// A separate key projection `[G·d, hidden]`.
pub const MUON_QK_KIND_KEY: u32 = 3;
/// MLA's query projection (`linear_q_proj` / `linear_q_up_proj`) `[H·(d + rope_dim), in]`.
pub const MUON_QK_KIND_MLA_QUERY: u32 = 4;
/// MLA's `linear_kv_up_proj` `[H·(d + v_head_dim), kv_lora_rank]`.
pub const MUON_QK_KIND_MLA_KEY_VALUE: u32 = 5;

/// One attention matrix to clip and the per-head maxima of its logits.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct muon_qk_clip_t {
    /// sizeof(muon_qk_clip_t) as compiled by the caller.
    pub struct_size: u32,
    /// The registered param (a 2-D Muon-routed matrix).
    pub param_id: u32,
    /// MUON_QK_KIND_*.
    pub kind: u32,
    /// Attention heads of this param on this tensor-parallel rank (Megatron's
    /// num_attention_heads_per_partition); the number of @p max_logits.
    pub num_heads: u32,
    /// Query groups (key/value heads) on this rank; = num_heads without GQA; unused by MLA.
    pub num_query_groups: u32,
    /// Rows per head of the query and key (MLA: qk_head_dim, the non-rotary part).
    pub head_dim: u32,
    /// MLA query: rotary rows per head (qk_pos_emb_head_dim); else 0.
    pub rope_dim: u32,
    /// MLA key/value: value rows per head (v_head_dim); else 0.
    pub v_head_dim: u32,
    /// num_heads f32 maxima of the pre-softmax logits, one per head in head order, already
    /// reduced with MAX over the data-parallel (and context-parallel) ranks. cuda backend: a
    /// device pointer, read on the optimizer's stream when the next step runs (keep it valid
    /// and unchanged until then); host backend: a host pointer, read during this call.
    pub max_logits: *const f32,
}

/// @brief Fill @p clip with defaults: struct_size set, kind MUON_QK_KIND_FUSED_QKV, every
///        count 0, max_logits NULL. NULL is ignored.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_qk_clip_init(clip: *mut muon_qk_clip_t) {
    run_or("muon_qk_clip_init", (), || {
        if !clip.is_null() {
            // SAFETY: the caller passes a writable muon_qk_clip_t.
            unsafe {
                clip.write(muon_qk_clip_t {
                    struct_size: std::mem::size_of::<muon_qk_clip_t>() as u32,
                    param_id: 0,
                    kind: MUON_QK_KIND_FUSED_QKV,
                    num_heads: 0,
                    num_query_groups: 0,
                    head_dim: 0,
                    rope_dim: 0,
                    v_head_dim: 0,
                    max_logits: std::ptr::null(),
                })
            }
        }
    })
}

/// @brief QK-clip (Kimi K2's MuonClip) by the next step: on the owner of each param, right
///        after its Muon update and before its cast, each head group whose largest logit S
///        exceeds @p threshold gets eta = threshold / S, its query rows × eta^alpha, its key
///        rows × eta^(1 − alpha) (MLA: the rotary query rows × eta), value rows untouched. GQA:
///        one eta per query group from the max over its heads (Megatron-LM's clip_qk). The
///        step's own param collective then carries the clipped values to every rank's model
///        copy and MXFP8 copy (requantized): no pass or collective of its own. The momentum is
///        not touched; the masters are the checkpointed state, so checkpoints need nothing
///        more. A step skipped for a non-finite gradient still clips (as Megatron does).
///        A group whose maximum is not finite is left as it is (the device cannot report it
///        without a host read; the host backend refuses a NaN maximum here).
///        Every rank calls it with the same params, in the same step, before muon_optimizer_step
///        (or muon_optimizers_step); several calls before one step add up, one clip per param.
///        Only the owner of a param reads its request (threshold, alpha, maxima): the library
///        does not compare requests across ranks, so one that differs on another rank is
///        silently overridden by the owner's. Pass the same list (with the maxima already
///        reduced over the data-parallel group) on every rank.
/// @param[in,out] opt       Finalized optimizer handle.
/// @param[in]     clips     @p count descriptions, each with struct_size set (muon_qk_clip_init).
/// @param[in]     count     Number of params; all layers in one call is one validation pass
///                          and, per owned param, one kernel inside the step.
/// @param[in]     threshold tau, finite and > 0 (Megatron's --qk-clip-threshold, default 100).
/// @param[in]     alpha     In [0, 1] (Megatron's --qk-clip-alpha, default 0.5).
/// @return MUON_STATUS_SUCCESS once requested; INVALID_ARGUMENT naming the field (unknown
///         param, not a 2-D Muon matrix, rows not matching the layout, wrong head count, NaN
///         maximum on the host, threshold or alpha out of range, the same param twice in a
///         step) and nothing requested; INVALID_STATE before finalize.
/// @note Stream: enqueues nothing; the next step reads the maxima in stream order. No host
///       sync, graph-capture safe (the step that applies it is).
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_qk_clip(
    opt: *mut muon_optimizer_t,
    clips: *const muon_qk_clip_t,
    count: usize,
    threshold: f32,
    alpha: f32,
) -> muon_status_t {
    with_mut::<Optimizer>("muon_optimizer_qk_clip", opt, "opt", |o| {
        let on_device = o.qk_maxima_on_device();
        // SAFETY: the caller passes `count` descriptions (checked element by element).
        let requests = unsafe { read_clips(clips, count, on_device) }?;
        o.qk_clip(&requests, threshold, alpha)
    })
}

/// `count` descriptions laid out with the stride of the first one's struct_size.
///
/// # Safety
/// `clips` points to `count` readable `muon_qk_clip_t` of the caller's size.
unsafe fn read_clips(clips: *const muon_qk_clip_t, count: usize, on_device: bool) -> Result<Vec<QkClipRequest>> {
    if count == 0 {
        return Ok(Vec::new());
    }
    checked_size(clips, "clips")?;
    // SAFETY: checked above: non-NULL, starts with a u32.
    let stride = unsafe { std::ptr::read_unaligned(clips.cast::<u32>()) } as usize;
    (0..count)
        .map(|i| {
            // SAFETY: element i of the caller's array.
            let element = unsafe { clips.cast::<u8>().add(i * stride) }.cast::<muon_qk_clip_t>();
            let size = unsafe { std::ptr::read_unaligned(element.cast::<u32>()) } as usize;
            if size != stride {
                bail!(
                    AbiMismatch,
                    "clips[{i}].struct_size: {size} differs from clips[0]'s {stride}; set every element's with muon_qk_clip_init"
                );
            }
            // SAFETY: a whole muon_qk_clip_t (size checked above).
            let c = unsafe { std::ptr::read_unaligned(element) };
            let kind = match c.kind {
                MUON_QK_KIND_FUSED_QKV => QkKind::FusedQkv,
                MUON_QK_KIND_QUERY => QkKind::Query,
                MUON_QK_KIND_KEY => QkKind::Key,
                MUON_QK_KIND_MLA_QUERY => QkKind::MlaQuery,
                MUON_QK_KIND_MLA_KEY_VALUE => QkKind::MlaKeyValue,
                other => bail!(InvalidEnumValue, "clips[{i}].kind: {other} is no MUON_QK_KIND_* value"),
            };
            non_null(c.max_logits, &format!("clips[{i}].max_logits"))?;
            let maxima = if on_device {
                QkMaxima::Device(c.max_logits as u64)
            } else {
                // SAFETY: the host backend's maxima: num_heads readable floats (documented).
                QkMaxima::Host(unsafe { std::slice::from_raw_parts(c.max_logits, c.num_heads as usize) }.to_vec())
            };
            Ok(QkClipRequest {
                param: c.param_id,
                heads: QkHeads {
                    kind,
                    heads: c.num_heads,
                    query_groups: c.num_query_groups,
                    head_dim: c.head_dim,
                    rope_dim: c.rope_dim,
                    v_head_dim: c.v_head_dim,
                },
                maxima,
            })
        })
        .collect()
}

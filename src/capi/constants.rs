//! Named values of the `uint32_t` enumerations and flags in the C API.

use crate::model::Route;

/// Owner-sorted Muon layout without persistent padding (default): groups of equal matrices,
/// one per rank, move by reduce-scatter and all-gather; the rest by reduce and broadcast.
pub const MUON_LAYOUT_COMPACT: u32 = 0;
/// Megatron-LM's shard-aligned layer-wise layout.
pub const MUON_LAYOUT_PADDED: u32 = 1;
/// Compact layout with all-reduced gradients.
pub const MUON_LAYOUT_ALLREDUCE: u32 = 2;
/// Compact layout without groups: every Muon bucket reduces to its owners and broadcasts back.
pub const MUON_LAYOUT_COMPACT_ROOTED: u32 = 3;

/// 32-bit IEEE float.
pub const MUON_DTYPE_F32: u32 = 0;
/// bfloat16.
pub const MUON_DTYPE_BF16: u32 = 1;

/// Five tuned quintic triples (default).
pub const MUON_COEFFICIENTS_QUINTIC: u32 = 0;
/// (3.4445, −4.7750, 2.0315) every step.
pub const MUON_COEFFICIENTS_SIMPLE: u32 = 1;
/// Polar Express per-step coefficients.
pub const MUON_COEFFICIENTS_POLAR_EXPRESS: u32 = 2;
/// The five quintic triples cycled past the fifth step (Megatron-LM's schedule).
pub const MUON_COEFFICIENTS_QUINTIC_CYCLIC: u32 = 3;
/// Emerging-Optimizers' `cans` (CANS): five triples, the last repeated.
pub const MUON_COEFFICIENTS_CANS: u32 = 4;
/// Emerging-Optimizers' `aol`: four triples, cycled.
pub const MUON_COEFFICIENTS_AOL: u32 = 5;
/// Emerging-Optimizers' `cubic5`: five cubic steps; muon_num_ns_steps must be 5.
pub const MUON_COEFFICIENTS_CUBIC5: u32 = 6;
/// Emerging-Optimizers' `deepseekv4`: the simple triple 8 times, then (2, −1.5, 0.5).
pub const MUON_COEFFICIENTS_DEEPSEEK_V4: u32 = 7;
/// The 5-step Polar Express of microsoft/dion and modded-nanogpt; muon_num_ns_steps must be 5.
pub const MUON_COEFFICIENTS_POLAR_EXPRESS_5: u32 = 8;
/// The caller's table, muon_config_t.muon_custom_coefficients, cycled.
pub const MUON_COEFFICIENTS_CUSTOM: u32 = 9;
/// Most (a, b, c) triples of muon_config_t.muon_custom_coefficients.
pub const MUON_MAX_CUSTOM_COEFFICIENTS: u32 = 16;

/// bf16 operands, fp32 accumulation (default).
pub const MUON_NS_PRECISION_BF16: u32 = 0;
/// fp32 throughout.
pub const MUON_NS_PRECISION_F32: u32 = 1;
/// Megatron-LM's bf16 scheme: the iterate and every product stored in bf16.
pub const MUON_NS_PRECISION_BF16_ITERATE: u32 = 2;

/// Newton–Schulz on the m×n iterate every step (default; Megatron-LM's).
pub const MUON_NS_METHOD_STANDARD: u32 = 0;
/// Gram Newton–Schulz on the m×m X·Xᵀ with a restart where it applies (muon_config_t.muon_ns_method).
pub const MUON_NS_METHOD_GRAM: u32 = 1;

/// Muon owners balanced by Newton–Schulz cost (muon_config_t.muon_ownership).
pub const MUON_OWNERSHIP_BALANCED: u32 = 0;
/// One run of consecutive Muon matrices per rank, buckets cut at owner changes: one reduce and
/// one broadcast per bucket (muon_config_t.muon_ownership).
pub const MUON_OWNERSHIP_CONTIGUOUS: u32 = 1;
/// Balanced or contiguous, whichever the planner's model exposes less on the declared network
/// (muon_config_t.network); balanced when none is declared (default;
/// muon_config_t.muon_ownership).
pub const MUON_OWNERSHIP_AUTO: u32 = 2;

/// √max(m, n) (default).
pub const MUON_SCALE_SPECTRAL: u32 = 0;
/// √max(1, m/n).
pub const MUON_SCALE_SHAPE_SCALING: u32 = 1;
/// √(m/n).
pub const MUON_SCALE_UNIT_RMS_NORM: u32 = 2;

/// Each tensor-parallel rank orthogonalizes its own shard (Megatron's `blockwise`; the default
/// of headers before muon_config_t.weight_decay_rule).
pub const MUON_TP_MODE_BLOCKWISE: u32 = 0;
/// The owner gathers a TP-sharded matrix whole over the TP group, orthogonalizes it and keeps
/// its shard (default; Megatron's `duplicated`, its default since its PR #6380).
pub const MUON_TP_MODE_DUPLICATED: u32 = 1;
/// Newton–Schulz on the shards, the norm and every X·Xᵀ all-reduced over the TP group
/// (Megatron's `distributed`).
pub const MUON_TP_MODE_DISTRIBUTED: u32 = 2;

/// No weight decay for 1-D params and params named `*.bias` unless flagged
/// MUON_PARAM_FLAG_WEIGHT_DECAY (default; Megatron-LM's rule).
pub const MUON_WEIGHT_DECAY_RULE_MEGATRON: u32 = 0;
/// MUON_WEIGHT_DECAY_RULE_MEGATRON, but names containing `q_layernorm.` or `k_layernorm.` are
/// decayed (Megatron-LM's `--apply-wd-to-qk-layernorm`).
pub const MUON_WEIGHT_DECAY_RULE_MEGATRON_QK_LAYERNORM: u32 = 1;
/// Every param decayed unless flagged MUON_PARAM_FLAG_NO_WEIGHT_DECAY (the rule of headers
/// before muon_config_t.weight_decay_rule).
pub const MUON_WEIGHT_DECAY_RULE_FLAGGED: u32 = 2;

/// Muon on the Muon matrices (default; muon_config_t.muon_variant).
pub const MUON_VARIANT_STANDARD: u32 = 0;
/// NorMuon: Megatron-LM's `--optimizer adaptive_muon` with `moment2_method` "normuon"
/// (Emerging-Optimizers' `AdaptiveMuon`; muon_config_t.muon_variant).
pub const MUON_VARIANT_NORMUON: u32 = 1;
/// AdaMuon: Megatron-LM's `--optimizer adaptive_muon` with `moment2_method` "adamuon", its
/// default (Emerging-Optimizers' `AdaptiveMuon`; muon_config_t.muon_variant).
pub const MUON_VARIANT_ADAMUON: u32 = 2;

/// Every rank holds every param (default; muon_config_t.param_sharding).
pub const MUON_PARAM_SHARDING_REPLICATED: u32 = 0;
/// Each rank keeps what it owns; buckets gathered around their use (muon_config_t.param_sharding).
pub const MUON_PARAM_SHARDING_SHARDED: u32 = 1;

/// Host comm mode from MUON_HOST_COMM_MODE (eager|lazy), else eager (default).
pub const MUON_COMM_MODE_FROM_ENV: u32 = 0;
/// Host comm worker runs work as soon as it can.
pub const MUON_COMM_MODE_EAGER: u32 = 1;
/// Host comm work runs only when a wait or synchronize needs it.
pub const MUON_COMM_MODE_LAZY: u32 = 2;

/// The param is updated by Muon on its owner rank.
pub const MUON_ROUTE_MUON: u32 = 0;
/// The param is updated by AdamW, sharded element-wise.
pub const MUON_ROUTE_ADAMW: u32 = 1;

/// Embedding or output layer: always AdamW.
pub const MUON_PARAM_FLAG_EMBEDDING_OR_OUTPUT: u32 = 1 << 0;
/// Opt out of Muon.
pub const MUON_PARAM_FLAG_NO_MUON: u32 = 1 << 1;
/// 3-D [E, m, n] stack of E expert matrices.
pub const MUON_PARAM_FLAG_EXPERT_STACK: u32 = 1 << 2;
/// Persistent MXFP8 storage (dims multiples of 32, dtype bf16).
pub const MUON_PARAM_FLAG_MXFP8: u32 = 1 << 3;
/// No weight decay, whatever muon_config_t.weight_decay_rule says.
pub const MUON_PARAM_FLAG_NO_WEIGHT_DECAY: u32 = 1 << 4;
/// Allow a Muon matrix with a dimension equal to vocab_size.
pub const MUON_PARAM_FLAG_ALLOW_VOCAB_DIM: u32 = 1 << 5;
/// A copy of a gradient another rank of the norm group counts (muon_optimizer_set_norm_group):
/// left out of this rank's share of the gradient norm, e.g. a tensor-parallel duplicate
/// (layer norm, row-parallel bias) on TP ranks > 0, or the last pipeline stage's copy of an
/// embedding the first stage also holds. Still updated.
pub const MUON_PARAM_FLAG_NORM_REPLICA: u32 = 1 << 6;
/// A tensor-parallel shard along dim 0 (rows: a column-parallel weight `[out/tp, in]`,
/// Megatron's `partition_dim` 0); orthogonalized whole with MUON_TP_MODE_DUPLICATED or
/// _DISTRIBUTED (a Muon matrix, or every expert of an expert stack — Megatron's expert tensor
/// parallelism; ignored by AdamW's update and in blockwise mode). With a TP group
/// (muon_optimizer_set_tp_group) of more than one rank, checkpoints hold the shard — of any
/// route — in the unsharded param's coordinates, each fused component split alike (SwiGLU's
/// gate|up, GDN's q|k|v|z|β|α) or, for a per-group split, whole groups
/// (MUON_PARAM_FLAG_TP_WHOLE_GROUPS), so they load at another TP size.
pub const MUON_PARAM_FLAG_TP_SHARD_ROWS: u32 = 1 << 7;
/// A tensor-parallel shard along dim 1 (columns: a row-parallel weight `[out, in/tp]`,
/// Megatron's `partition_dim` 1); orthogonalized whole with MUON_TP_MODE_DUPLICATED or
/// _DISTRIBUTED (a Muon matrix, or every expert of an expert stack; ignored by AdamW's update
/// and in blockwise mode). Checkpoints place it like MUON_PARAM_FLAG_TP_SHARD_ROWS.
pub const MUON_PARAM_FLAG_TP_SHARD_COLS: u32 = 1 << 8;
/// A MUON_PARAM_FLAG_TP_SHARD_ROWS shard of a per-group split (Megatron's fused QKV) that holds
/// whole query groups of the unsharded param — implied when num_split_groups > 1, needed when
/// the shard holds one group (e.g. 8 query groups at TP 8), which would otherwise read as a
/// slice of every component. Only where checkpoints place the shard; needs TP_SHARD_ROWS and
/// split_sizes (no expert stack).
pub const MUON_PARAM_FLAG_TP_WHOLE_GROUPS: u32 = 1 << 9;
/// Weight decay for a param muon_config_t.weight_decay_rule exempts (a 1-D param or one named
/// `*.bias` under the Megatron rules); not with MUON_PARAM_FLAG_NO_WEIGHT_DECAY.
pub const MUON_PARAM_FLAG_WEIGHT_DECAY: u32 = 1 << 10;
/// A MUON_PARAM_FLAG_TP_SHARD_ROWS shard whose split_sizes components are whole components of
/// the unsharded param — per-head Muon where TP holds whole heads (split_sizes one entry per
/// head of this rank; Megatron-LM's `--muon-split-qkv-per-head`, its PR #6326): each component
/// is orthogonalized alone on its rank in every muon_tp_mode, bit for bit as the unsharded
/// param's. Checkpoints place the shard as whole rows, as for TP_WHOLE_GROUPS; resharding it
/// to another TP size is not supported yet.
/// Needs TP_SHARD_ROWS and split_sizes; not with num_split_groups > 1, TP_WHOLE_GROUPS or an
/// expert stack.
pub const MUON_PARAM_FLAG_TP_WHOLE_COMPONENTS: u32 = 1 << 11;

/// muon_step_args_t.overrides: the step's Muon momentum is muon_step_args_t.muon_momentum.
pub const MUON_STEP_OVERRIDE_MUON_MOMENTUM: u32 = 1 << 0;
/// muon_step_args_t.overrides: the step's AdamW β1 is muon_step_args_t.adam_beta1.
pub const MUON_STEP_OVERRIDE_ADAM_BETA1: u32 = 1 << 1;
/// muon_step_args_t.overrides: the step's AdamW β2 is muon_step_args_t.adam_beta2.
pub const MUON_STEP_OVERRIDE_ADAM_BETA2: u32 = 1 << 2;
/// muon_step_args_t.overrides: the step's AdamW ε is muon_step_args_t.adam_eps.
pub const MUON_STEP_OVERRIDE_ADAM_EPS: u32 = 1 << 3;
/// muon_step_args_t.overrides: the AdamW params flagged MUON_PARAM_FLAG_EMBEDDING_OR_OUTPUT step
/// with muon_step_args_t.decoupled_lr in place of adam_lr (Megatron-LM's `--decoupled-lr`).
pub const MUON_STEP_OVERRIDE_DECOUPLED_LR: u32 = 1 << 4;

/// MXFP8 scales row-major in TransformerEngine's padded compact shape (default).
pub const MUON_MXFP8_SCALES_COMPACT: u32 = 0;
/// MXFP8 scales in the cuBLAS / tcgen05 swizzled order.
pub const MUON_MXFP8_SCALES_SWIZZLED: u32 = 1;

/// Largest muon_num_ns_steps.
pub const MUON_MAX_NS_STEPS: u32 = 100;
/// Default collective_timeout_ms (five minutes).
pub const MUON_DEFAULT_COLLECTIVE_TIMEOUT_MS: u32 = 300_000;

/// Decodes a route for the C API.
pub fn route_code(route: Route) -> u32 {
    match route {
        Route::Muon => MUON_ROUTE_MUON,
        Route::Adamw => MUON_ROUTE_ADAMW,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{
        CoefficientSet, CommMode, Dtype, MuonLayout, MuonOwnership, MuonVariant, NsMethod, NsPrecision, ParamSharding,
        ScaleMode, TpMode, WeightDecayRule,
    };
    use crate::model::ParamFlags;

    #[test]
    fn c_constants_equal_core_codes() {
        assert_eq!(MuonLayout::Compact.code(), MUON_LAYOUT_COMPACT);
        assert_eq!(MuonLayout::Padded.code(), MUON_LAYOUT_PADDED);
        assert_eq!(MuonLayout::Allreduce.code(), MUON_LAYOUT_ALLREDUCE);
        assert_eq!(MuonLayout::CompactRooted.code(), MUON_LAYOUT_COMPACT_ROOTED);
        assert_eq!(Dtype::F32.code(), MUON_DTYPE_F32);
        assert_eq!(Dtype::Bf16.code(), MUON_DTYPE_BF16);
        assert_eq!(CoefficientSet::Quintic.code(), MUON_COEFFICIENTS_QUINTIC);
        assert_eq!(CoefficientSet::Simple.code(), MUON_COEFFICIENTS_SIMPLE);
        assert_eq!(CoefficientSet::PolarExpress.code(), MUON_COEFFICIENTS_POLAR_EXPRESS);
        assert_eq!(CoefficientSet::QuinticCyclic.code(), MUON_COEFFICIENTS_QUINTIC_CYCLIC);
        assert_eq!(CoefficientSet::Cans.code(), MUON_COEFFICIENTS_CANS);
        assert_eq!(CoefficientSet::Aol.code(), MUON_COEFFICIENTS_AOL);
        assert_eq!(CoefficientSet::Cubic5.code(), MUON_COEFFICIENTS_CUBIC5);
        assert_eq!(CoefficientSet::DeepseekV4.code(), MUON_COEFFICIENTS_DEEPSEEK_V4);
        assert_eq!(CoefficientSet::PolarExpress5.code(), MUON_COEFFICIENTS_POLAR_EXPRESS_5);
        assert_eq!(CoefficientSet::Custom.code(), MUON_COEFFICIENTS_CUSTOM);
        assert_eq!(
            crate::config::MAX_CUSTOM_NS_COEFFICIENTS,
            MUON_MAX_CUSTOM_COEFFICIENTS as usize
        );
        assert_eq!(NsPrecision::Bf16.code(), MUON_NS_PRECISION_BF16);
        assert_eq!(NsPrecision::F32.code(), MUON_NS_PRECISION_F32);
        assert_eq!(NsPrecision::Bf16Iterate.code(), MUON_NS_PRECISION_BF16_ITERATE);
        assert_eq!(NsMethod::Standard.code(), MUON_NS_METHOD_STANDARD);
        assert_eq!(NsMethod::Gram.code(), MUON_NS_METHOD_GRAM);
        assert_eq!(ScaleMode::Spectral.code(), MUON_SCALE_SPECTRAL);
        assert_eq!(ScaleMode::ShapeScaling.code(), MUON_SCALE_SHAPE_SCALING);
        assert_eq!(ScaleMode::UnitRmsNorm.code(), MUON_SCALE_UNIT_RMS_NORM);
        assert_eq!(CommMode::FromEnv.code(), MUON_COMM_MODE_FROM_ENV);
        assert_eq!(CommMode::Eager.code(), MUON_COMM_MODE_EAGER);
        assert_eq!(CommMode::Lazy.code(), MUON_COMM_MODE_LAZY);
        assert_eq!(ParamFlags::EMBEDDING_OR_OUTPUT, MUON_PARAM_FLAG_EMBEDDING_OR_OUTPUT);
        assert_eq!(ParamFlags::NO_MUON, MUON_PARAM_FLAG_NO_MUON);
        assert_eq!(ParamFlags::EXPERT_STACK, MUON_PARAM_FLAG_EXPERT_STACK);
        assert_eq!(ParamFlags::MXFP8, MUON_PARAM_FLAG_MXFP8);
        assert_eq!(ParamFlags::NO_WEIGHT_DECAY, MUON_PARAM_FLAG_NO_WEIGHT_DECAY);
        assert_eq!(ParamFlags::ALLOW_VOCAB_DIM, MUON_PARAM_FLAG_ALLOW_VOCAB_DIM);
        assert_eq!(ParamFlags::NORM_REPLICA, MUON_PARAM_FLAG_NORM_REPLICA);
        assert_eq!(ParamFlags::TP_SHARD_ROWS, MUON_PARAM_FLAG_TP_SHARD_ROWS);
        assert_eq!(ParamFlags::TP_SHARD_COLS, MUON_PARAM_FLAG_TP_SHARD_COLS);
        assert_eq!(ParamFlags::TP_WHOLE_GROUPS, MUON_PARAM_FLAG_TP_WHOLE_GROUPS);
        assert_eq!(ParamFlags::TP_WHOLE_COMPONENTS, MUON_PARAM_FLAG_TP_WHOLE_COMPONENTS);
        assert_eq!(ParamFlags::WEIGHT_DECAY, MUON_PARAM_FLAG_WEIGHT_DECAY);
        assert_eq!(WeightDecayRule::Megatron.code(), MUON_WEIGHT_DECAY_RULE_MEGATRON);
        assert_eq!(
            WeightDecayRule::MegatronQkLayernorm.code(),
            MUON_WEIGHT_DECAY_RULE_MEGATRON_QK_LAYERNORM
        );
        assert_eq!(WeightDecayRule::Flagged.code(), MUON_WEIGHT_DECAY_RULE_FLAGGED);
        assert_eq!(MuonVariant::Standard.code(), MUON_VARIANT_STANDARD);
        assert_eq!(MuonVariant::Normuon.code(), MUON_VARIANT_NORMUON);
        assert_eq!(MuonVariant::Adamuon.code(), MUON_VARIANT_ADAMUON);
        assert_eq!(ParamSharding::Replicated.code(), MUON_PARAM_SHARDING_REPLICATED);
        assert_eq!(ParamSharding::Sharded.code(), MUON_PARAM_SHARDING_SHARDED);
        assert_eq!(MuonOwnership::Balanced.code(), MUON_OWNERSHIP_BALANCED);
        assert_eq!(MuonOwnership::Contiguous.code(), MUON_OWNERSHIP_CONTIGUOUS);
        assert_eq!(MuonOwnership::Auto.code(), MUON_OWNERSHIP_AUTO);
        assert_eq!(TpMode::Blockwise.code(), MUON_TP_MODE_BLOCKWISE);
        assert_eq!(TpMode::Duplicated.code(), MUON_TP_MODE_DUPLICATED);
        assert_eq!(TpMode::Distributed.code(), MUON_TP_MODE_DISTRIBUTED);
        assert_eq!(route_code(Route::Muon), MUON_ROUTE_MUON);
        assert_eq!(crate::config::MAX_NS_STEPS, MUON_MAX_NS_STEPS);
        assert_eq!(
            crate::config::DEFAULT_COLLECTIVE_TIMEOUT_MS,
            MUON_DEFAULT_COLLECTIVE_TIMEOUT_MS
        );
        assert_eq!(route_code(Route::Adamw), MUON_ROUTE_ADAMW);
    }
}

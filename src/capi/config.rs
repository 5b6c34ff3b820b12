//! `muon_config_t`: the C mirror of [`Config`], with `struct_size` versioning.

use crate::capi::boundary::{non_null, run, run_or};
use crate::capi::status::muon_status_t;
use crate::capi::version::MUON_VERSION_CODE;
use crate::config::{
    CoefficientSet, CommMode, Config, Dtype, MAX_CUSTOM_NS_COEFFICIENTS, MuonLayout, MuonOwnership, MuonVariant,
    Network, NsMethod, NsPrecision, ParamSharding, ScaleMode, TpMode, WeightDecayRule,
};
use crate::error::{Error, ErrorKind, Result};

/// A data-parallel ring as the planner prices it (docs/design.md §4): declared = 1 with its
/// per-hop latency and bus bandwidth, or declared = 0 (undeclared: the other fields are
/// ignored). nccl-tests measures both on the group's ranks: the bus bandwidth (`busbw`) of a
/// large reduce-scatter or all-gather, and the per-hop latency as a small message's time over
/// its ring steps (n − 1 for an all-gather over n ranks).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct muon_network_t {
    /// 1 = the figures below describe the ring; 0 (default) = undeclared.
    pub declared: u32,
    /// Ignored; written as 0.
    pub reserved: u32,
    /// Latency of one ring step, µs: finite, >= 0.
    pub hop_latency_us: f64,
    /// Bus bandwidth, GB/s (1e9 bytes): finite, > 0.
    pub bus_bandwidth_gbps: f64,
}

impl muon_network_t {
    /// The C struct of `network` (`None`: undeclared, zeros).
    pub fn from_network(network: Option<Network>) -> Self {
        match network {
            Some(n) => muon_network_t {
                declared: 1,
                reserved: 0,
                hop_latency_us: n.hop_latency_us,
                bus_bandwidth_gbps: n.bus_bandwidth_gbps,
            },
            None => muon_network_t {
                declared: 0,
                reserved: 0,
                hop_latency_us: 0.0,
                bus_bandwidth_gbps: 0.0,
            },
        }
    }

    /// The declared network, checked (errors name `field` and the figure), or `None`.
    pub fn to_network(&self, field: &str) -> Result<Option<Network>> {
        if !flag(&format!("{field}.declared"), self.declared)? {
            return Ok(None);
        }
        let network = Network {
            hop_latency_us: self.hop_latency_us,
            bus_bandwidth_gbps: self.bus_bandwidth_gbps,
        };
        network.validate(field)?;
        Ok(Some(network))
    }
}

/// Optimizer configuration. Initialise with muon_config_init() (or MUON_CONFIG_INIT), then
/// change fields. Enumerations are `uint32_t` codes of the `MUON_*` constants; booleans are
/// `uint32_t` 0 or 1. Fields are append-only: the library reads `struct_size` bytes and
/// defaults the fields a smaller (older) struct does not have.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct muon_config_t {
    /// sizeof(muon_config_t) as compiled by the caller: the size of a released layout (or
    /// more, from a newer header); any other size is refused with MUON_STATUS_ABI_MISMATCH.
    pub struct_size: u32,
    /// MUON_VERSION_CODE the caller compiled against (major must match).
    pub abi_version: u32,
    /// Elements per bucket; 0 = max(40,000,000, 1,000,000·dp).
    pub bucket_size: u64,
    /// MUON_LAYOUT_COMPACT (default), MUON_LAYOUT_PADDED, MUON_LAYOUT_ALLREDUCE or
    /// MUON_LAYOUT_COMPACT_ROOTED.
    pub muon_layout: u32,
    /// 1 (default): start a bucket's gradient collective when its last gradient is ready.
    pub overlap_grad_reduce: u32,
    /// 1 (default): step() returns after launching param collectives; wait_params orders.
    pub overlap_param_gather: u32,
    /// Gradient buffer dtype: MUON_DTYPE_F32 (default) or MUON_DTYPE_BF16.
    pub grad_dtype: u32,
    /// Muon EMA momentum μ in [0, 1); default 0.95.
    pub muon_momentum: f32,
    /// 1 = Nesterov momentum; default 0.
    pub muon_nesterov: u32,
    /// MUON_COEFFICIENTS_QUINTIC (default), _SIMPLE, _POLAR_EXPRESS, _QUINTIC_CYCLIC,
    /// Emerging-Optimizers' _CANS, _AOL, _CUBIC5 and _DEEPSEEK_V4, dion's and modded-nanogpt's
    /// _POLAR_EXPRESS_5, or _CUSTOM (the table muon_custom_coefficients). _CUBIC5 and
    /// _POLAR_EXPRESS_5 are 5-step schedules: other muon_num_ns_steps are refused
    /// (MUON_STATUS_INCOMPATIBLE_OPTIONS). docs/newton-schulz.md lists the sets.
    pub muon_coefficient_set: u32,
    /// Newton–Schulz steps, 1..=100; default 5.
    pub muon_num_ns_steps: u32,
    /// MUON_NS_PRECISION_BF16 (default), MUON_NS_PRECISION_F32 or
    /// MUON_NS_PRECISION_BF16_ITERATE (Megatron-LM's scheme).
    pub muon_ns_precision: u32,
    /// MUON_SCALE_SPECTRAL (default), _SHAPE_SCALING or _UNIT_RMS_NORM.
    pub muon_scale_mode: u32,
    /// Extra factor on the Muon update scale (> 0); default 1.0 (0.2 = Moonlight's).
    pub muon_extra_scale_factor: f32,
    /// AdamW β1 in [0, 1); default 0.9.
    pub adam_beta1: f32,
    /// AdamW β2 in [0, 1); default 0.999.
    pub adam_beta2: f32,
    /// AdamW ε (> 0); default 1e-8.
    pub adam_eps: f32,
    /// Global grad-norm clip threshold; 0 = off; default 1.0.
    pub clip_grad: f32,
    /// 1 = MXFP8 params travel as bf16 staged on their bucket's idle grad bytes and every rank
    /// re-quantizes the gathered bf16; 0 (default) = they are gathered as bf16 in the param
    /// buffer and quantized locally on every rank (same bits, more memory). With
    /// param_sharding = sharded both gather them as bf16 into the working set.
    pub mxfp8_param_gather: u32,
    /// 1 = MXFP8 scales in the swizzled (GEMM) layout; 0 (default) = compact.
    pub mxfp8_swizzled_scales: u32,
    /// Vocabulary size for the untagged-embedding check. Non-zero: muon_optimizer_add_param
    /// refuses (MUON_STATUS_ROUTING_CONFLICT) a Muon-routed param with a dimension equal to it
    /// or to it padded as Megatron-LM pads the embedding (up to a multiple of 128 × the size of
    /// the TP group, when muon_optimizer_set_tp_group was called: 50257 → 50304 at TP 1),
    /// unless flagged MUON_PARAM_FLAG_ALLOW_VOCAB_DIM; muon_optimizer_set_tp_group refuses a
    /// group whose padding would make a registered param the vocabulary. 0 (default): Megatron-style, the
    /// vocabulary the caller declares — the largest dim 0 of the params of two or more dims
    /// flagged MUON_PARAM_FLAG_EMBEDDING_OR_OUTPUT on every rank of the norm group (every
    /// pipeline stage; the data-parallel group without muon_optimizer_set_norm_group) — and
    /// muon_optimizer_finalize fails with MUON_STATUS_ROUTING_CONFLICT on every rank of that
    /// group when a Muon-routed param has dim 0 equal to it without ALLOW_VOCAB_DIM (an untagged
    /// copy of the embedding, e.g. on a multi-token-prediction stage); no embedding declared,
    /// no check.
    pub vocab_size: u64,
    /// A collective not joined by every rank within this time fails with
    /// MUON_STATUS_COMM_TIMEOUT; default 300,000. It bounds every communicator the optimizer
    /// issues on: its own, and the norm and tensor-parallel groups it is given, which inherit
    /// it (a host group's rank handle takes this timeout; with NCCL every host wait polls each
    /// communicator's asynchronous error against it). Includes finalize's agreement.
    pub collective_timeout_ms: u32,
    /// Host backend comm stream: MUON_COMM_MODE_FROM_ENV (default), _EAGER or _LAZY.
    pub host_comm_mode: u32,
    /// Host backend: threads of each rank's matrix products, 0..=1024; 0 (default) = the
    /// cores of the process divided by the ranks of the optimizer's host group, at least 1
    /// (a process running several groups sets cores / all its ranks). Results do not depend
    /// on it.
    pub host_threads: u32,
    /// Muon on tensor-parallel shards: MUON_TP_MODE_DUPLICATED (default, Megatron-LM's since
    /// its PR #6380: the owner orthogonalizes the whole matrix, the update of the unsharded
    /// model), MUON_TP_MODE_BLOCKWISE (each TP rank's shard alone, the default before) or
    /// MUON_TP_MODE_DISTRIBUTED. The codes never change meaning: a caller compiled against an
    /// older header whose MUON_CONFIG_INIT wrote MUON_TP_MODE_BLOCKWISE keeps blockwise, and
    /// the 104-byte layout, which has no such field, reads as blockwise.
    pub muon_tp_mode: u32,
    /// Newton–Schulz normalization X = U / max(‖U‖_F, muon_ns_eps); finite, > 0; default
    /// 1e-7 (Megatron-LM's: Emerging-Optimizers v0.3.0, which it pins; 1e-15 matches
    /// Emerging-Optimizers ≥ 0.4.0).
    pub muon_ns_eps: f32,
    /// Padding that ended the 120-byte layout (after muon_ns_eps), named so the next field
    /// makes a layout of another size: ignored, written as 0. A caller compiled against that
    /// layout has unspecified bytes here.
    pub reserved: u32,
    /// MUON_NS_METHOD_STANDARD (default; Megatron-LM's) or MUON_NS_METHOD_GRAM (Dao AI Lab's
    /// Gram Newton–Schulz, DeepSpeed's `ns_method="gram"`): the same polynomial steps carried on
    /// the m×m Gram matrix X·Xᵀ of an m×n iterate (m ≤ n), with a restart, for fewer flops on
    /// wide matrices; results equal the standard method's up to rounding. Gram applies per
    /// matrix (each fused component, each expert) where n/m ≥ 1.5 and, with
    /// MUON_NS_PRECISION_BF16 or _BF16_ITERATE, muon_num_ns_steps ≤ 5 and a coefficient set
    /// other than MUON_COEFFICIENTS_POLAR_EXPRESS (with MUON_NS_PRECISION_F32: any steps and
    /// coefficients). MUON_TP_MODE_DISTRIBUTED judges each rank's shard, whose products it
    /// computes: m = the unsplit side, n = the shard's part of the split side. Every other
    /// matrix takes the standard iteration (docs/newton-schulz.md). A caller compiled against
    /// an older header gets standard.
    pub muon_ns_method: u32,
    /// Padding that ended the 128-byte layout (after muon_ns_method), named so the next field
    /// makes a layout of another size: ignored, written as 0.
    pub reserved2: u32,
    /// How the compact, compact_rooted and allreduce layouts give Muon matrices owners:
    /// MUON_OWNERSHIP_AUTO (default: balanced or contiguous, whichever the planner's model
    /// exposes less on the declared `network`; balanced when none is declared),
    /// MUON_OWNERSHIP_BALANCED (Newton–Schulz cost balanced over the ranks, a bucket
    /// spread over several owners) or MUON_OWNERSHIP_CONTIGUOUS (each rank owns one run of
    /// consecutive matrices in backward order and buckets are cut where the owner changes, so
    /// a bucket is one reduce to its owner and one broadcast back: for data-parallel groups
    /// whose collectives are latency-bound, such as many nodes with one rank each; Newton–Schulz
    /// balance may be worse, by at most the largest matrix). Each run is cut into the whole
    /// number of buckets of at least bucket_size (one when shorter). Contiguous not with
    /// MUON_LAYOUT_PADDED (which keeps Megatron-LM's owners; auto leaves them too). A caller
    /// compiled against a header before contiguous gets auto, which without a declared
    /// network is balanced.
    pub muon_ownership: u32,
    /// Padding that ended the 136-byte layout (after muon_ownership), named so the next field
    /// makes a layout of another size: ignored, written as 0.
    pub reserved3: u32,
    /// Which AdamW params get no weight decay without a flag: MUON_WEIGHT_DECAY_RULE_MEGATRON
    /// (default; Megatron-LM's: every 1-D param and every param whose name ends in `.bias` —
    /// biases, norms — unless flagged MUON_PARAM_FLAG_WEIGHT_DECAY),
    /// MUON_WEIGHT_DECAY_RULE_MEGATRON_QK_LAYERNORM (Megatron-LM's `--apply-wd-to-qk-layernorm`:
    /// the same, but names containing `q_layernorm.` or `k_layernorm.` are decayed) or
    /// MUON_WEIGHT_DECAY_RULE_FLAGGED (only params flagged MUON_PARAM_FLAG_NO_WEIGHT_DECAY are
    /// exempt). MUON_PARAM_FLAG_NO_WEIGHT_DECAY always exempts a param. A caller compiled
    /// against an older header (a struct_size of 136 bytes or less) gets _FLAGGED, the rule it
    /// was built with.
    pub weight_decay_rule: u32,
    /// The ring the data-parallel collectives run on (default: undeclared). Declared, the
    /// planner chooses compact's group window and, under MUON_OWNERSHIP_AUTO, the ownership by
    /// the modelled exposed time of each candidate plan on it; undeclared, the plan that moves
    /// the fewest bytes per rank, with balanced ownership (docs/design.md §4). Part of the plan
    /// hash: every rank must declare the same figures (finalize fails with
    /// MUON_STATUS_PLAN_MISMATCH naming the field otherwise). `muon-opt plan --hardware
    /// PROFILE` prints a simulator profile's figures. A caller compiled against an older
    /// header gets undeclared.
    pub network: muon_network_t,
    /// The expert data-parallel group's ring, where it differs from `network`: an optimizer
    /// whose every Muon-routed param is an expert stack (the expert optimizer of a dense +
    /// expert pair sharing one config) plans on it; undeclared (default): on `network`.
    pub expert_network: muon_network_t,
    /// The update of the Muon matrices: MUON_VARIANT_STANDARD (default; Muon),
    /// MUON_VARIANT_NORMUON (NorMuon, Megatron-LM's `--optimizer adaptive_muon` with
    /// `adaptive_muon_moment2_method = "normuon"`, Emerging-Optimizers' `AdaptiveMuon`: a
    /// second moment per line of the orthogonalized update along its longer side, one f32 per
    /// line of every matrix) or MUON_VARIANT_ADAMUON (AdaMuon, the same flag with
    /// `"adamuon"`, Megatron-LM's default method: a second moment per element, one f32 per
    /// element; docs/design.md §6). Every rank of the data-parallel and TP groups
    /// must use the same variant (finalize checks it); a checkpoint loads only with the variant
    /// it was saved with. A caller compiled against an older header gets standard.
    pub muon_variant: u32,
    /// The adaptive variants' second-moment EMA coefficient β2 in [0, 1); default 0.95
    /// (Megatron-LM's `adaptive_muon_beta2`). Read only with MUON_VARIANT_NORMUON and
    /// MUON_VARIANT_ADAMUON.
    pub adaptive_muon_beta2: f32,
    /// The adaptive variants' ε (finite, > 0): NorMuon's floor of the second moment and of the
    /// normalized update's Frobenius norm, AdaMuon's term added to the root of the second
    /// moment; default 1e-8 (Megatron-LM's `adaptive_muon_eps`). Read only with
    /// MUON_VARIANT_NORMUON and MUON_VARIANT_ADAMUON.
    pub adaptive_muon_eps: f32,
    /// Padding that ended the 208-byte layout (after adaptive_muon_eps), named so the next
    /// field makes a layout of another size: ignored, written as 0.
    pub reserved4: u32,
    /// MUON_PARAM_SHARDING_REPLICATED (default: every rank holds every param and a full
    /// gradient buffer) or MUON_PARAM_SHARDING_SHARDED (ZeRO-3 / FSDP style with whole-matrix
    /// owners: a rank keeps persistently only what it owns, its Muon matrices whole and its
    /// AdamW shards, and gathers each bucket into a bounded working set around its use, with
    /// muon_optimizer_gather_params, muon_optimizer_wait_params and
    /// muon_optimizer_release_params; docs/design.md "Sharded params"). Sharded trains bit for
    /// bit like replicated. It needs overlap_param_gather = 1 and overlap_grad_reduce = 1
    /// (MUON_STATUS_INCOMPATIBLE_OPTIONS otherwise); MXFP8 params are gathered as bf16 into the
    /// working set and quantized there whatever mxfp8_param_gather says. Every rank must use
    /// the same value (finalize checks it). A caller compiled against an older header gets
    /// replicated.
    pub param_sharding: u32,
    /// Sharded: 1 (default, FSDP2's) = release a bucket after its forward use and gather it
    /// again before its backward use; 0 = keep it gathered from forward to backward. Read only
    /// with MUON_PARAM_SHARDING_SHARDED.
    pub reshard_after_forward: u32,
    /// Sharded: buckets gathered ahead of the one in use (0 = on first use); default 1. The
    /// working set holds at most this many plus one buckets. Read only with
    /// MUON_PARAM_SHARDING_SHARDED.
    pub param_prefetch_buckets: u32,
    /// Padding that ended the 224-byte layout (after param_prefetch_buckets), named so the
    /// next field makes a layout of another size: ignored, written as 0.
    pub reserved5: u32,
    /// With MUON_COEFFICIENTS_CUSTOM: the number of (a, b, c) triples of
    /// muon_custom_coefficients, 1..=MUON_MAX_CUSTOM_COEFFICIENTS; otherwise 0 (default). Part
    /// of the plan hash and of a checkpoint's record, as the set is.
    pub muon_custom_coefficient_steps: u32,
    /// With MUON_COEFFICIENTS_CUSTOM: triple k (a, b, c) of Newton–Schulz step k at
    /// [3k], [3k + 1], [3k + 2], every value finite; step k of a run uses triple
    /// k mod muon_custom_coefficient_steps (Emerging-Optimizers cycles a custom set). Entries
    /// past the count are ignored. A caller compiled against an older header gets no table.
    pub muon_custom_coefficients: [f32; 48],
    /// Padding that ended the 424-byte layout (after muon_custom_coefficients), named so the
    /// next field makes a layout of another size: ignored, written as 0.
    pub reserved6: u32,
    /// 1 = cautious weight decay on Muon and AdamW (microsoft/dion's `cautious_wd`, arXiv
    /// 2510.12402): an element is decayed only where it and its update have the same sign
    /// (w·u >= 0), the rest of the update unchanged; default 0 (every element decayed). Every
    /// rank must use the same value (finalize checks it). A caller compiled against an older
    /// header gets 0.
    pub cautious_weight_decay: u32,
    /// MUON_DTYPE_F32 (default) or MUON_DTYPE_BF16: storage of the Muon momentum (microsoft/dion's
    /// `momentum_dtype`). BF16 halves its bytes; the new momentum is rounded to bf16 (nearest
    /// even) where it is updated and the update reads the rounded value. A checkpoint records
    /// it and loads only with the same dtype. A caller compiled against an older header gets
    /// F32.
    pub muon_momentum_dtype: u32,
}

/// `muon_config_t` fields of the first ABI (up to `host_comm_mode`); a smaller struct_size is
/// rejected, the fields after it take their defaults.
pub(crate) const MIN_CONFIG_SIZE: usize = std::mem::offset_of!(muon_config_t, host_threads);

/// Every released `muon_config_t` layout, oldest first: its last field and `sizeof` as a C
/// compiler reports it (the last field's end rounded up to the struct's alignment, 8). The
/// list is the ABI's history: appending a field appends a row (a test checks the list against
/// the struct, and that no two rows share a size but the pair below).
///
/// The `host_threads` and `muon_tp_mode` layouts are both 112 bytes (the second field filled
/// the first's tail padding), and both were released as version 0.1.0, so no mark tells them
/// apart: a 112-byte struct is read as the later one, and a `muon_tp_mode` word that is no tp
/// mode — the earlier layout's padding, which its `muon_config_init()` left unspecified — is
/// refused as ABI_MISMATCH naming both layouts. Since then a field that would end inside the
/// last layout's tail padding is preceded by a `reserved` `uint32_t` filling it (as before
/// `muon_ns_method`, 120 → 128 bytes, `muon_ownership`, 128 → 136, and `weight_decay_rule`,
/// 136 → 144), so every later layout has a size of its own; `network` and `expert_network`
/// (two 24-byte `muon_network_t`, 8-byte aligned, starting at the 144-byte end) make 192, which
/// ends on the struct's alignment, and `muon_variant`, `adaptive_muon_beta2` and
/// `adaptive_muon_eps` follow it: 208; after a `reserved4` filling that layout's tail padding,
/// `param_sharding`, `reshard_after_forward` and `param_prefetch_buckets` end at 220, rounded
/// up to 224; after a `reserved5` filling that layout's tail padding,
/// `muon_custom_coefficient_steps` and the 48 floats of `muon_custom_coefficients` end at 420,
/// rounded up to 424; after a `reserved6` filling that layout's tail padding,
/// `cautious_weight_decay` and `muon_momentum_dtype` end at 432.
pub(crate) const RELEASED_CONFIG_LAYOUTS: [(&str, usize); 12] = [
    ("host_comm_mode", 104),
    ("host_threads", 112),
    ("muon_tp_mode", 112),
    ("muon_ns_eps", 120),
    ("muon_ns_method", 128),
    ("muon_ownership", 136),
    ("weight_decay_rule", 144),
    ("expert_network", 192),
    ("adaptive_muon_eps", 208),
    ("param_prefetch_buckets", 224),
    ("muon_custom_coefficients", 424),
    ("muon_momentum_dtype", 432),
];

/// The size two released layouts share (see [`RELEASED_CONFIG_LAYOUTS`]).
pub(crate) const AMBIGUOUS_CONFIG_SIZE: usize = 112;

/// The distinct sizes of [`RELEASED_CONFIG_LAYOUTS`]: any other size below the current one is
/// a torn or hand-computed struct_size, whose last field would be read in part.
pub(crate) fn released_config_sizes() -> Vec<usize> {
    let mut sizes: Vec<usize> = RELEASED_CONFIG_LAYOUTS.iter().map(|&(_, size)| size).collect();
    sizes.dedup();
    sizes
}

// `muon_custom_coefficients` holds the longest custom table, three floats a triple.
const _: () = assert!(48 == 3 * MAX_CUSTOM_NS_COEFFICIENTS);

/// The C array of a custom table (zeros past its end; validation keeps it within the array).
fn custom_coefficients_c(table: &[[f32; 3]]) -> [f32; 48] {
    let mut out = [0.0; 48];
    for (slot, value) in out.iter_mut().zip(table.iter().flatten()) {
        *slot = *value;
    }
    out
}

fn flag(field: &str, value: u32) -> Result<bool> {
    match value {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(Error::new(
            ErrorKind::OutOfRange,
            format!("{field}: {other} is not a boolean (0 or 1)"),
        )),
    }
}

impl muon_config_t {
    /// The C struct holding `cfg`'s values.
    pub fn from_config(cfg: &Config) -> Self {
        muon_config_t {
            struct_size: std::mem::size_of::<muon_config_t>() as u32,
            abi_version: MUON_VERSION_CODE,
            bucket_size: cfg.bucket_size,
            muon_layout: cfg.muon_layout.code(),
            overlap_grad_reduce: cfg.overlap_grad_reduce as u32,
            overlap_param_gather: cfg.overlap_param_gather as u32,
            grad_dtype: cfg.grad_dtype.code(),
            muon_momentum: cfg.muon_momentum,
            muon_nesterov: cfg.muon_nesterov as u32,
            muon_coefficient_set: cfg.muon_coefficient_set.code(),
            muon_num_ns_steps: cfg.muon_num_ns_steps,
            muon_ns_precision: cfg.muon_ns_precision.code(),
            muon_scale_mode: cfg.muon_scale_mode.code(),
            muon_extra_scale_factor: cfg.muon_extra_scale_factor,
            adam_beta1: cfg.adam_beta1,
            adam_beta2: cfg.adam_beta2,
            adam_eps: cfg.adam_eps,
            clip_grad: cfg.clip_grad,
            mxfp8_param_gather: cfg.mxfp8_param_gather as u32,
            mxfp8_swizzled_scales: cfg.mxfp8_swizzled_scales as u32,
            vocab_size: cfg.vocab_size,
            collective_timeout_ms: cfg.collective_timeout_ms,
            host_comm_mode: cfg.host_comm_mode.code(),
            host_threads: cfg.host_threads,
            muon_tp_mode: cfg.muon_tp_mode.code(),
            muon_ns_eps: cfg.muon_ns_eps,
            reserved: 0,
            muon_ns_method: cfg.muon_ns_method.code(),
            reserved2: 0,
            muon_ownership: cfg.muon_ownership.code(),
            reserved3: 0,
            weight_decay_rule: cfg.weight_decay_rule.code(),
            network: muon_network_t::from_network(cfg.network),
            expert_network: muon_network_t::from_network(cfg.expert_network),
            muon_variant: cfg.muon_variant.code(),
            adaptive_muon_beta2: cfg.adaptive_muon_beta2,
            adaptive_muon_eps: cfg.adaptive_muon_eps,
            reserved4: 0,
            param_sharding: cfg.param_sharding.code(),
            reshard_after_forward: cfg.reshard_after_forward as u32,
            param_prefetch_buckets: cfg.param_prefetch_buckets,
            reserved5: 0,
            muon_custom_coefficient_steps: cfg.muon_custom_coefficients.len() as u32,
            muon_custom_coefficients: custom_coefficients_c(&cfg.muon_custom_coefficients),
            reserved6: 0,
            cautious_weight_decay: cfg.cautious_weight_decay as u32,
            muon_momentum_dtype: cfg.muon_momentum_dtype.code(),
        }
    }

    /// The values a struct of `size` bytes (a released layout, or larger) starts from before
    /// the caller's bytes are copied over it: today's defaults, except the defaults a field
    /// appended later changed. A layout without `weight_decay_rule` keeps the rule it was
    /// built with, `flagged`; one without `muon_tp_mode` the mode, `blockwise` (a layout that
    /// has it holds the caller's code, whose meaning never changes).
    fn defaults_for_size(size: usize) -> Self {
        let ends_after = |offset: usize| size >= offset + 4;
        let mut cfg = Config::default();
        if !ends_after(std::mem::offset_of!(muon_config_t, weight_decay_rule)) {
            cfg.weight_decay_rule = WeightDecayRule::Flagged;
        }
        if !ends_after(std::mem::offset_of!(muon_config_t, muon_tp_mode)) {
            cfg.muon_tp_mode = TpMode::Blockwise;
        }
        muon_config_t::from_config(&cfg)
    }

    /// The custom table's triples: the first `muon_custom_coefficient_steps` of the array
    /// (checked against its bound here; the values by [`Config::validate`]).
    fn custom_coefficients(&self) -> Result<Vec<[f32; 3]>> {
        let steps = self.muon_custom_coefficient_steps as usize;
        if steps > MAX_CUSTOM_NS_COEFFICIENTS {
            crate::bail!(
                OutOfRange,
                "muon_custom_coefficient_steps: {steps} is outside 0..={MAX_CUSTOM_NS_COEFFICIENTS}"
            );
        }
        Ok(self.muon_custom_coefficients[..3 * steps]
            .chunks_exact(3)
            .map(|t| [t[0], t[1], t[2]])
            .collect())
    }

    /// Decodes and validates every field.
    pub fn to_config(&self) -> Result<Config> {
        let cfg = Config {
            bucket_size: self.bucket_size,
            muon_layout: MuonLayout::from_code("muon_layout", self.muon_layout)?,
            overlap_grad_reduce: flag("overlap_grad_reduce", self.overlap_grad_reduce)?,
            overlap_param_gather: flag("overlap_param_gather", self.overlap_param_gather)?,
            grad_dtype: Dtype::from_code("grad_dtype", self.grad_dtype)?,
            muon_momentum: self.muon_momentum,
            muon_nesterov: flag("muon_nesterov", self.muon_nesterov)?,
            muon_coefficient_set: CoefficientSet::from_code("muon_coefficient_set", self.muon_coefficient_set)?,
            muon_num_ns_steps: self.muon_num_ns_steps,
            muon_ns_precision: NsPrecision::from_code("muon_ns_precision", self.muon_ns_precision)?,
            muon_scale_mode: ScaleMode::from_code("muon_scale_mode", self.muon_scale_mode)?,
            muon_extra_scale_factor: self.muon_extra_scale_factor,
            adam_beta1: self.adam_beta1,
            adam_beta2: self.adam_beta2,
            adam_eps: self.adam_eps,
            clip_grad: self.clip_grad,
            mxfp8_param_gather: flag("mxfp8_param_gather", self.mxfp8_param_gather)?,
            mxfp8_swizzled_scales: flag("mxfp8_swizzled_scales", self.mxfp8_swizzled_scales)?,
            vocab_size: self.vocab_size,
            collective_timeout_ms: self.collective_timeout_ms,
            host_comm_mode: CommMode::from_code("host_comm_mode", self.host_comm_mode)?,
            host_threads: self.host_threads,
            muon_tp_mode: TpMode::from_code("muon_tp_mode", self.muon_tp_mode)?,
            muon_ns_eps: self.muon_ns_eps,
            muon_ns_method: NsMethod::from_code("muon_ns_method", self.muon_ns_method)?,
            muon_ownership: MuonOwnership::from_code("muon_ownership", self.muon_ownership)?,
            weight_decay_rule: WeightDecayRule::from_code("weight_decay_rule", self.weight_decay_rule)?,
            network: self.network.to_network("network")?,
            expert_network: self.expert_network.to_network("expert_network")?,
            muon_variant: MuonVariant::from_code("muon_variant", self.muon_variant)?,
            adaptive_muon_beta2: self.adaptive_muon_beta2,
            adaptive_muon_eps: self.adaptive_muon_eps,
            param_sharding: ParamSharding::from_code("param_sharding", self.param_sharding)?,
            reshard_after_forward: flag("reshard_after_forward", self.reshard_after_forward)?,
            param_prefetch_buckets: self.param_prefetch_buckets,
            muon_custom_coefficients: self.custom_coefficients()?,
            cautious_weight_decay: flag("cautious_weight_decay", self.cautious_weight_decay)?,
            muon_momentum_dtype: Dtype::from_code("muon_momentum_dtype", self.muon_momentum_dtype)?,
            ..Config::default()
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

/// Reads a caller's config: checks `struct_size` and `abi_version`, copies
/// `min(struct_size, sizeof)` bytes over the defaults of that layout
/// (`muon_config_t::defaults_for_size`), decodes and validates.
///
/// # Safety
/// `ptr` must be NULL or point to at least `struct_size` readable bytes.
pub unsafe fn read_config(ptr: *const muon_config_t) -> Result<Config> {
    non_null(ptr, "cfg")?;
    let size = unsafe { std::ptr::read_unaligned(ptr.cast::<u32>()) } as usize;
    if size < MIN_CONFIG_SIZE {
        crate::bail!(
            AbiMismatch,
            "cfg->struct_size: {size} is smaller than the {MIN_CONFIG_SIZE} bytes of the oldest supported muon_config_t; initialise it with muon_config_init()"
        );
    }
    let released = released_config_sizes();
    if size < std::mem::size_of::<muon_config_t>() && !released.contains(&size) {
        let list: Vec<String> = released.iter().map(usize::to_string).collect();
        crate::bail!(
            AbiMismatch,
            "cfg->struct_size: {size} is not the size of a released muon_config_t ({} bytes, or more from a newer header); set it to sizeof(muon_config_t) or with muon_config_init()",
            list.join(", ")
        );
    }
    let mut raw = muon_config_t::defaults_for_size(size);
    let n = size.min(std::mem::size_of::<muon_config_t>());
    // SAFETY: the caller guarantees `size` readable bytes; we copy at most our own size.
    unsafe { std::ptr::copy_nonoverlapping(ptr.cast::<u8>(), (&mut raw as *mut muon_config_t).cast::<u8>(), n) };
    if size == AMBIGUOUS_CONFIG_SIZE && TpMode::from_code("muon_tp_mode", raw.muon_tp_mode).is_err() {
        crate::bail!(
            AbiMismatch,
            "cfg->struct_size: {size} bytes is both the host_threads and the muon_tp_mode layout of muon_config_t, and its muon_tp_mode word holds {}, no tp mode: a caller compiled against the host_threads layout has unspecified padding there; recompile against this header (or zero the struct before muon_config_init)",
            raw.muon_tp_mode
        );
    }
    let major = raw.abi_version / 10_000;
    if major != MUON_VERSION_CODE / 10_000 {
        crate::bail!(
            AbiMismatch,
            "cfg->abi_version: {} was compiled against major version {major}, this library is {}",
            raw.abi_version,
            MUON_VERSION_CODE / 10_000
        );
    }
    raw.to_config()
}

/// @brief Fill @p cfg with the defaults and set struct_size and abi_version.
/// @param[out] cfg Config to initialise; NULL is ignored. Writes sizeof(muon_config_t) of this
///            library: a program compiled against an older header (a smaller muon_config_t)
///            initialises its struct with that header's MUON_CONFIG_INIT, whose defaults it then
///            keeps (a header whose muon_config_t has no weight_decay_rule wrote
///            MUON_TP_MODE_BLOCKWISE).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_config_init(cfg: *mut muon_config_t) {
    run_or("muon_config_init", (), || {
        if !cfg.is_null() {
            // SAFETY: non-NULL and, per the contract, points to a muon_config_t.
            unsafe { cfg.write_unaligned(muon_config_t::from_config(&Config::default())) };
        }
    })
}

/// @brief Check every field of @p cfg and every combination of fields.
/// @param[in] cfg Config initialised by muon_config_init().
/// @return MUON_STATUS_SUCCESS, or the status of the first violated rule with a message
///         naming the field and the rule (see muon_last_error_message()).
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_config_validate(cfg: *const muon_config_t) -> muon_status_t {
    run("muon_config_validate", || unsafe { read_config(cfg) }.map(|_| ()))
}

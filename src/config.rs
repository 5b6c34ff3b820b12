//! Optimizer configuration: typed fields, defaults and validation. Field names follow
//! Megatron-LM's where one exists. The C mirror is `capi::config::muon_config_t`.

use crate::bail;
use crate::error::Result;
pub use crate::plan::network::Network;

/// Declares a `u32`-coded enumeration whose decoding names the config field on failure.
macro_rules! coded_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $code:expr => $text:expr),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name { $($(#[$vmeta])* $variant),+ }

        impl $name {
            /// Every variant, in code order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The C code of this variant.
            pub fn code(self) -> u32 {
                match self { $($name::$variant => $code),+ }
            }

            /// The lower-case name used in JSON, the CLI and messages.
            pub fn name(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }

            /// Decodes the C code of field `field`, naming the field and the valid codes on error.
            pub fn from_code(field: &str, code: u32) -> Result<Self> {
                match code {
                    $(c if c == $code => Ok($name::$variant),)+
                    other => {
                        let valid: Vec<String> = Self::ALL.iter().map(|v| format!("{} ({})", v.code(), v.name())).collect();
                        bail!(InvalidEnumValue, "{field}: unknown value {other}; valid values are {}", valid.join(", "))
                    }
                }
            }

            /// Parses the lower-case name.
            pub fn from_name(field: &str, text: &str) -> Result<Self> {
                match text {
                    $($text => Ok($name::$variant),)+
                    other => {
                        let valid: Vec<&str> = Self::ALL.iter().map(|v| v.name()).collect();
                        bail!(InvalidEnumValue, "{field}: unknown value '{other}'; valid values are {}", valid.join(", "))
                    }
                }
            }
        }
    };
}

coded_enum! {
    /// How Muon buckets are laid out and synchronized (docs/design.md §4).
    MuonLayout {
        /// Owner-sorted, no persistent padding; groups of equal matrices, one per rank, move by
        /// reduce-scatter and all-gather, the rest by reduce to owner and broadcast from owner.
        Compact = 0 => "compact",
        /// Megatron-LM's shard-aligned layer-wise layout; reduce-scatter, all-gather.
        Padded = 1 => "padded",
        /// Compact layout; all-reduce of gradients, broadcast of params.
        Allreduce = 2 => "allreduce",
        /// Compact layout without groups: every bucket reduces to owners and broadcasts back.
        CompactRooted = 3 => "compact_rooted",
    }
}

impl MuonLayout {
    /// Whether `muon_ownership = contiguous` applies: every layout but `padded`, which keeps
    /// Megatron-LM's per-bucket owners.
    pub fn takes_contiguous_ownership(self) -> bool {
        self != MuonLayout::Padded
    }
}

coded_enum! {
    /// How Muon matrices are given owners in the rooted layouts (docs/design.md §4).
    MuonOwnership {
        /// Balanced Newton–Schulz cost (LPT; ties to the rank owning the nearest bucket).
        Balanced = 0 => "balanced",
        /// One run of consecutive matrices per rank, buckets cut at owner changes: one
        /// reduce and one broadcast per bucket, for data-parallel groups whose collectives
        /// are latency-bound (many nodes, one rank each).
        Contiguous = 1 => "contiguous",
        /// Balanced or contiguous, whichever exposes less on the declared network
        /// ([`Config::network`]); balanced when none is declared (the default).
        Auto = 2 => "auto",
    }
}

coded_enum! {
    /// Element type of a buffer or tensor.
    Dtype {
        F32 = 0 => "f32",
        Bf16 = 1 => "bf16",
    }
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 => 2,
        }
    }
}

coded_enum! {
    /// Newton–Schulz coefficient schedule.
    CoefficientSet {
        /// Five per-step triples (Keller Jordan's tuned quintic), the default.
        Quintic = 0 => "quintic",
        /// (3.4445, −4.7750, 2.0315) every step.
        Simple = 1 => "simple",
        /// Polar Express per-step coefficients.
        PolarExpress = 2 => "polar_express",
        /// The five quintic triples cycled (step k uses triple k mod 5), Megatron-LM's and
        /// Emerging-Optimizers' schedule beyond five steps.
        QuinticCyclic = 3 => "quintic_cyclic",
        /// Emerging-Optimizers' `cans` (CANS, Chebyshev-type polynomials), the last of its
        /// five triples repeated.
        Cans = 4 => "cans",
        /// Emerging-Optimizers' `aol`: four triples, cycled.
        Aol = 5 => "aol",
        /// Emerging-Optimizers' `cubic5`: five cubic steps (`c = 0`); exactly 5 steps.
        Cubic5 = 6 => "cubic5",
        /// Emerging-Optimizers' `deepseekv4`: the `simple` triple for 8 steps, then
        /// (2, −1.5, 0.5), repeated.
        DeepseekV4 = 7 => "deepseekv4",
        /// The five-step Polar Express of microsoft/dion and modded-nanogpt (safety factor
        /// 1.02); exactly 5 steps.
        PolarExpress5 = 8 => "polar_express_5",
        /// The caller's table (`muon_custom_coefficients`), cycled past its end.
        Custom = 9 => "custom",
    }
}

impl CoefficientSet {
    /// The step count a fixed schedule must run: `cubic5` (Emerging-Optimizers'
    /// `newton_schulz` refuses any other) and `polar_express_5` (dion runs its five triples).
    pub fn fixed_steps(self) -> Option<u32> {
        match self {
            CoefficientSet::Cubic5 | CoefficientSet::PolarExpress5 => Some(5),
            _ => None,
        }
    }
}

/// Upper bound on the triples of a `custom` coefficient table (`muon_custom_coefficients`);
/// the longest published set, `deepseekv4`, has 10.
pub const MAX_CUSTOM_NS_COEFFICIENTS: usize = 16;

/// Checks a coefficient set with the step count and the caller's table it runs with; errors
/// name `set_field`, `steps_field` or `table_field` and the rule.
pub fn check_coefficients(
    (set_field, set): (&str, CoefficientSet),
    (steps_field, steps): (&str, u32),
    (table_field, table): (&str, &[[f32; 3]]),
) -> Result<()> {
    if let Some(fixed) = set.fixed_steps()
        && steps != fixed
    {
        bail!(
            IncompatibleOptions,
            "{steps_field}: {steps} steps with {set_field} {}, a fixed {fixed}-step schedule; use {fixed} steps or a custom table",
            set.name()
        );
    }
    if set != CoefficientSet::Custom {
        if !table.is_empty() {
            bail!(
                IncompatibleOptions,
                "{table_field}: a table of {} triples is given but {set_field} is {}; set {set_field} to custom or give no table",
                table.len(),
                set.name()
            );
        }
        return Ok(());
    }
    if table.is_empty() || table.len() > MAX_CUSTOM_NS_COEFFICIENTS {
        bail!(
            OutOfRange,
            "{table_field}: {} triples is outside 1..={MAX_CUSTOM_NS_COEFFICIENTS} ({set_field} custom needs a table)",
            table.len()
        );
    }
    for (step, triple) in table.iter().enumerate() {
        for (value, name) in triple.iter().zip(["a", "b", "c"]) {
            if !value.is_finite() {
                bail!(OutOfRange, "{table_field}[{step}].{name}: {value} is not finite");
            }
        }
    }
    Ok(())
}

coded_enum! {
    /// Precision of the Newton–Schulz products.
    NsPrecision {
        /// bf16 operands, fp32 accumulation (the GPU default).
        Bf16 = 0 => "bf16",
        /// fp32 throughout.
        F32 = 1 => "f32",
        /// Megatron-LM's `--muon-fp32-matmul-prec medium`: the iterate and every product stored
        /// in bf16 (fp32 accumulation inside each product).
        Bf16Iterate = 2 => "bf16_iterate",
    }
}

coded_enum! {
    /// How Newton–Schulz iterates (docs/newton-schulz.md).
    NsMethod {
        /// On the `m × n` iterate, every step (Megatron-LM's and Emerging-Optimizers').
        Standard = 0 => "standard",
        /// On the `m × m` Gram matrix with restarts (Dao AI Lab; DeepSpeed's `ns_method="gram"`),
        /// where `numerics::newton_schulz::gram_applies` holds; the standard iteration elsewhere.
        Gram = 1 => "gram",
    }
}

coded_enum! {
    /// Scale applied to the orthogonalized update of an m×n matrix.
    ScaleMode {
        /// √max(m, n).
        Spectral = 0 => "spectral",
        /// √max(1, m/n).
        ShapeScaling = 1 => "shape_scaling",
        /// √(m/n).
        UnitRmsNorm = 2 => "unit_rms_norm",
    }
}

coded_enum! {
    /// Which Muon update the Muon matrices take (Megatron-LM's `--optimizer muon` or
    /// `--optimizer adaptive_muon`, docs/design.md §6).
    MuonVariant {
        /// Muon: the orthogonalized momentum, scaled.
        Standard = 0 => "standard",
        /// NorMuon as Emerging-Optimizers' `AdaptiveMuon(moment2_method="normuon")` computes it
        /// (v0.3.0, b309e2f0, `orthogonalized_optimizers/adaptive_muon.py`; Megatron-LM's
        /// `--optimizer adaptive_muon` with `adaptive_muon_moment2_method = "normuon"`): an EMA
        /// of the mean square of each line of the orthogonalized update along its longer side
        /// (rows when rows >= cols, else columns), the update divided by the root of it and
        /// brought back to its own Frobenius norm before the scale (`numerics::normuon`).
        Normuon = 1 => "normuon",
        /// AdaMuon as Emerging-Optimizers' `AdaptiveMuon(moment2_method="adamuon")` computes it
        /// (the same class and version; Megatron-LM's default `adaptive_muon_moment2_method`,
        /// arXiv 2507.11005): an EMA of the square of every element of the orthogonalized
        /// update, the update divided element-wise by its root plus ε before the scale
        /// (`numerics::adamuon`).
        Adamuon = 2 => "adamuon",
    }
}

impl MuonVariant {
    /// Whether the variant keeps a second moment (NorMuon, AdaMuon), read with
    /// `adaptive_muon_beta2` and `adaptive_muon_eps`.
    pub fn is_adaptive(self) -> bool {
        self != MuonVariant::Standard
    }
}

coded_enum! {
    /// Whether every rank keeps every param (docs/design.md §4, "Sharded params").
    ParamSharding {
        /// Every rank holds every param and a full gradient buffer (the layouts as they are).
        Replicated = 0 => "replicated",
        /// ZeRO-3 / FSDP style with whole-matrix owners: a rank keeps persistently only what it
        /// owns (its Muon matrices whole, its AdamW shards) and gathers each bucket into a
        /// bounded working set around its forward and backward use. Planned and simulated;
        /// the iteration itself is not implemented yet (finalize refuses it).
        Sharded = 1 => "sharded",
    }
}

coded_enum! {
    /// When the host backend's comm stream runs its queue.
    CommMode {
        /// Take the mode from `MUON_HOST_COMM_MODE` (`eager` or `lazy`), else eager.
        FromEnv = 0 => "from_env",
        /// The comm worker runs work as soon as it can.
        Eager = 1 => "eager",
        /// Comm work runs only when an event wait or synchronize needs it.
        Lazy = 2 => "lazy",
    }
}

coded_enum! {
    /// Muon on tensor-parallel shards (`MUON_PARAM_FLAG_TP_SHARD_ROWS` / `_COLS`), Megatron's
    /// `--muon-tp-mode`.
    TpMode {
        /// Each TP rank orthogonalizes its own shard, so the update depends on the TP size
        /// (Megatron-LM's default until its PR #6380, and ours until 0.1.0's `muon_config_t`
        /// grew `weight_decay_rule`: a caller of an older layout keeps it, see
        /// `capi::config::read_config`).
        Blockwise = 0 => "blockwise",
        /// The owner gathers the whole matrix over its TP group, orthogonalizes it and keeps
        /// its shard (the same update as the unsharded model): the default, Megatron-LM's
        /// since its PR #6380 (commit bb47df54, 2026-08-21, `--muon-tp-mode` in
        /// `megatron/training/arguments.py`).
        Duplicated = 1 => "duplicated",
        /// Newton–Schulz runs on the shards, the norm and every `X·Xᵀ` summed over the TP
        /// group (the unsharded model's update up to the order of those sums).
        Distributed = 2 => "distributed",
    }
}

coded_enum! {
    /// Which params AdamW leaves undecayed without a flag (`MUON_PARAM_FLAG_NO_WEIGHT_DECAY`
    /// exempts one, `MUON_PARAM_FLAG_WEIGHT_DECAY` decays one the rule exempts).
    WeightDecayRule {
        /// Megatron-LM's: a 1-D param or one whose name ends in `.bias` gets no weight decay
        /// (`get_standard_config_overrides` in `megatron/core/optimizer/__init__.py`, commit
        /// d98e8a64: `wd_mult` 0 for `len(param.shape) == 1` or a name matching `*.bias`).
        Megatron = 0 => "megatron",
        /// Megatron-LM's with `--apply-wd-to-qk-layernorm`: the same, except that params whose
        /// name contains `q_layernorm.` or `k_layernorm.` are decayed.
        MegatronQkLayernorm = 1 => "megatron_qk_layernorm",
        /// Every param is decayed unless flagged `NO_WEIGHT_DECAY` (the rule of every
        /// `muon_config_t` layout older than the one with `weight_decay_rule`).
        Flagged = 2 => "flagged",
    }
}

impl WeightDecayRule {
    /// Whether the rule exempts a param named `name` of `ndim` dimensions from weight decay.
    pub fn exempts(self, name: &str, ndim: usize) -> bool {
        let megatron = ndim == 1 || name.ends_with(".bias");
        match self {
            WeightDecayRule::Megatron => megatron,
            WeightDecayRule::MegatronQkLayernorm => {
                megatron && !(name.contains("q_layernorm.") || name.contains("k_layernorm."))
            }
            WeightDecayRule::Flagged => false,
        }
    }
}

/// The default `muon_ns_eps`, Megatron-LM's effective floor: Megatron-LM's Muon
/// (`megatron/core/optimizer/emerging_optimizers.py`, commit d98e8a64, 2026-08-22) calls
/// Emerging-Optimizers' `newton_schulz_tp` without an eps, and its `pyproject.toml`
/// (`[tool.uv.sources]`, and `uv.lock`) pins Emerging-Optimizers v0.3.0 (b309e2f0), whose
/// `newton_schulz` defaults `eps=1e-7` (`muon_utils.py`; `F.normalize` clamps the norm at eps).
/// Emerging-Optimizers v0.4.0 (925e1bfe; commit 7ebd3cf "Reduce eps for newton_schulz") lowered
/// its default to 1e-15: a setup on that version (which Megatron's `--muon-use-syrk` needs)
/// sets `muon_ns_eps = 1e-15`.
pub const DEFAULT_NS_EPS: f32 = 1e-7;

pub use crate::numerics::gemm::DEFAULT_SYMMETRIC_TILE;

/// The default `adaptive_muon_beta2`: Megatron-LM's `OptimizerConfig.adaptive_muon_beta2`
/// (`megatron/core/optimizer/optimizer_config.py`, commit d98e8a64) and Emerging-Optimizers'
/// `AdaptiveMuon` `beta2` (v0.3.0).
pub const DEFAULT_ADAPTIVE_MUON_BETA2: f32 = 0.95;

/// The default `adaptive_muon_eps`: Megatron-LM's `OptimizerConfig.adaptive_muon_eps` and
/// Emerging-Optimizers' `AdaptiveMuon` `eps` (same sources).
pub const DEFAULT_ADAPTIVE_MUON_EPS: f32 = 1e-8;

/// The default `param_prefetch_buckets`: one bucket gathered ahead of the one in use, FSDP2's
/// implicit forward prefetch of the next module (PyTorch 2.5 `torch.distributed.fsdp.
/// fully_shard`: "FSDP2 implicitly prefetches the next all-gather").
pub const DEFAULT_PARAM_PREFETCH_BUCKETS: u32 = 1;

/// The default `collective_timeout_ms`: five minutes, NCCL-watchdog-like.
pub const DEFAULT_COLLECTIVE_TIMEOUT_MS: u32 = 300_000;

/// Typed optimizer configuration.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Config {
    /// Elements per bucket; 0 = `max(40_000_000, 1_000_000·dp)`.
    pub bucket_size: u64,
    pub muon_layout: MuonLayout,
    /// How the rooted layouts give Muon matrices owners; `padded` keeps Megatron's.
    pub muon_ownership: MuonOwnership,
    pub overlap_grad_reduce: bool,
    pub overlap_param_gather: bool,
    pub grad_dtype: Dtype,
    pub muon_momentum: f32,
    pub muon_nesterov: bool,
    pub muon_coefficient_set: CoefficientSet,
    /// The caller's `(a, b, c)` table of the `custom` set, one triple per step (cycled);
    /// empty with every other set.
    pub muon_custom_coefficients: Vec<[f32; 3]>,
    pub muon_num_ns_steps: u32,
    pub muon_ns_precision: NsPrecision,
    pub muon_ns_method: NsMethod,
    pub muon_scale_mode: ScaleMode,
    pub muon_extra_scale_factor: f32,
    pub adam_beta1: f32,
    pub adam_beta2: f32,
    pub adam_eps: f32,
    /// Global grad-norm clip threshold; 0 = off.
    pub clip_grad: f32,
    /// MXFP8 params travel as bf16 staged on their bucket's idle grad bytes
    /// ([`crate::model::ParamSpec::is_staged`]); with sharded params, which gather every
    /// bucket into the working set, it changes nothing.
    pub mxfp8_param_gather: bool,
    pub mxfp8_swizzled_scales: bool,
    /// Vocabulary size used to catch untagged embeddings (docs/design.md §4). Non-zero: a
    /// Muon-routed param with any dimension equal to it fails registration unless flagged
    /// `ALLOW_VOCAB_DIM`. 0 (default): derived at finalize, Megatron-style, from the params
    /// flagged `EMBEDDING_OR_OUTPUT` — the largest dim 0 of those with two or more dims on
    /// every rank of the norm group (every pipeline stage; the data-parallel group without a
    /// norm group) — and a Muon-routed param whose dim 0 equals it fails finalize on every rank
    /// of that group unless flagged `ALLOW_VOCAB_DIM`; no embedding declared, no check.
    pub vocab_size: u64,
    pub collective_timeout_ms: u32,
    pub host_comm_mode: CommMode,
    /// Host backend: threads of each rank's matrix products; 0 = [`Config::host_threads_for`].
    pub host_threads: u32,
    pub muon_tp_mode: TpMode,
    /// Floor of the Frobenius norm the Newton–Schulz input is divided by.
    pub muon_ns_eps: f32,
    /// Which params AdamW leaves undecayed without a flag.
    pub weight_decay_rule: WeightDecayRule,
    /// Muon or NorMuon on the Muon matrices.
    pub muon_variant: MuonVariant,
    /// NorMuon: EMA coefficient of the second moment (`normuon` only).
    pub adaptive_muon_beta2: f32,
    /// NorMuon: floor of the second moment and of the normalized update's norm.
    pub adaptive_muon_eps: f32,
    /// Side of the tiles of the symmetric Newton–Schulz products
    /// (`numerics::gemm::SymmetricTiles`); not in `muon_config_t`: the C API always uses the
    /// default, tests lower it to tile small matrices too.
    pub muon_ns_symmetric_tile: u32,
    /// The ring the data-parallel collectives run on; `None` (default): undeclared, and the
    /// planner takes the plan that moves the fewest bytes (docs/design.md §4).
    pub network: Option<Network>,
    /// The expert data-parallel group's ring, where it differs: an optimizer whose every
    /// Muon-routed param is an expert stack plans on it (`None`: on `network`).
    pub expert_network: Option<Network>,
    /// Replicated params (every rank holds every param) or sharded ones (each rank keeps what
    /// it owns; buckets gathered around their use).
    pub param_sharding: ParamSharding,
    /// Sharded: release a bucket after its forward use and gather it again before its backward
    /// use (FSDP2's `reshard_after_forward`, default true); false keeps every gathered bucket
    /// from its forward to its backward. Read only with `param_sharding = sharded`.
    pub reshard_after_forward: bool,
    /// Sharded: buckets gathered ahead of the one in use (0 = each gathered when first used);
    /// the working set holds at most this many plus one. Read only with `param_sharding =
    /// sharded`.
    pub param_prefetch_buckets: u32,
    /// Cautious weight decay (microsoft/dion's `cautious_wd`, arXiv 2510.12402) on Muon and
    /// AdamW: an element is decayed only where it and its update have the same sign
    /// (`w·u ≥ 0`); default false (every element decayed).
    #[serde(default)]
    pub cautious_weight_decay: bool,
    /// Storage of the Muon momentum: `f32` (default) or `bf16` (microsoft/dion's
    /// `DionMixedPrecisionConfig(momentum_dtype=torch.bfloat16)`): the new momentum is rounded
    /// to bf16 where it is updated, and the update reads the rounded value.
    #[serde(default = "f32_dtype")]
    pub muon_momentum_dtype: Dtype,
}

fn f32_dtype() -> Dtype {
    Dtype::F32
}

impl Default for Config {
    fn default() -> Self {
        Config {
            bucket_size: 0,
            muon_layout: MuonLayout::Compact,
            muon_ownership: MuonOwnership::Auto,
            overlap_grad_reduce: true,
            overlap_param_gather: true,
            grad_dtype: Dtype::F32,
            muon_momentum: 0.95,
            muon_nesterov: false,
            muon_coefficient_set: CoefficientSet::Quintic,
            muon_custom_coefficients: Vec::new(),
            muon_num_ns_steps: 5,
            muon_ns_precision: NsPrecision::Bf16,
            muon_ns_method: NsMethod::Standard,
            muon_scale_mode: ScaleMode::Spectral,
            muon_extra_scale_factor: 1.0,
            adam_beta1: 0.9,
            adam_beta2: 0.999,
            adam_eps: 1e-8,
            clip_grad: 1.0,
            mxfp8_param_gather: false,
            mxfp8_swizzled_scales: false,
            vocab_size: 0,
            collective_timeout_ms: DEFAULT_COLLECTIVE_TIMEOUT_MS,
            host_comm_mode: CommMode::FromEnv,
            host_threads: 0,
            muon_tp_mode: TpMode::Duplicated,
            muon_ns_eps: DEFAULT_NS_EPS,
            weight_decay_rule: WeightDecayRule::Megatron,
            muon_variant: MuonVariant::Standard,
            adaptive_muon_beta2: DEFAULT_ADAPTIVE_MUON_BETA2,
            adaptive_muon_eps: DEFAULT_ADAPTIVE_MUON_EPS,
            muon_ns_symmetric_tile: DEFAULT_SYMMETRIC_TILE as u32,
            network: None,
            expert_network: None,
            param_sharding: ParamSharding::Replicated,
            reshard_after_forward: true,
            param_prefetch_buckets: DEFAULT_PARAM_PREFETCH_BUCKETS,
            cautious_weight_decay: false,
            muon_momentum_dtype: Dtype::F32,
        }
    }
}

/// Upper bound on `host_threads`.
pub const MAX_HOST_THREADS: u32 = 1024;

/// Upper bound on `muon_num_ns_steps`: more steps than this only waste compute.
pub const MAX_NS_STEPS: u32 = 100;

fn check_unit_interval(field: &str, value: f32) -> Result<()> {
    if !(0.0..1.0).contains(&value) {
        bail!(OutOfRange, "{field}: {value} is outside [0, 1)");
    }
    Ok(())
}

fn check_positive_finite(field: &str, value: f32) -> Result<()> {
    if !(value.is_finite() && value > 0.0) {
        bail!(OutOfRange, "{field}: {value} must be finite and > 0");
    }
    Ok(())
}

impl Config {
    /// How long a collective on any communicator of the optimizer waits for the other ranks.
    pub fn collective_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(u64::from(self.collective_timeout_ms))
    }

    /// Checks every field and combination; the error names the field and the rule.
    pub fn validate(&self) -> Result<()> {
        check_unit_interval("muon_momentum", self.muon_momentum)?;
        check_unit_interval("adam_beta1", self.adam_beta1)?;
        check_unit_interval("adam_beta2", self.adam_beta2)?;
        check_positive_finite("adam_eps", self.adam_eps)?;
        check_positive_finite("muon_extra_scale_factor", self.muon_extra_scale_factor)?;
        check_positive_finite("muon_ns_eps", self.muon_ns_eps)?;
        check_unit_interval("adaptive_muon_beta2", self.adaptive_muon_beta2)?;
        check_positive_finite("adaptive_muon_eps", self.adaptive_muon_eps)?;
        if self.muon_num_ns_steps == 0 || self.muon_num_ns_steps > MAX_NS_STEPS {
            bail!(
                OutOfRange,
                "muon_num_ns_steps: {} is outside 1..={MAX_NS_STEPS}",
                self.muon_num_ns_steps
            );
        }
        check_coefficients(
            ("muon_coefficient_set", self.muon_coefficient_set),
            ("muon_num_ns_steps", self.muon_num_ns_steps),
            ("muon_custom_coefficients", &self.muon_custom_coefficients),
        )?;
        if !(self.clip_grad.is_finite() && self.clip_grad >= 0.0) {
            bail!(
                OutOfRange,
                "clip_grad: {} must be finite and >= 0 (0 = off)",
                self.clip_grad
            );
        }
        if self.muon_ownership == MuonOwnership::Contiguous && !self.muon_layout.takes_contiguous_ownership() {
            bail!(
                IncompatibleOptions,
                "muon_ownership: contiguous needs a compact, compact_rooted or allreduce muon_layout; padded keeps Megatron-LM's per-bucket owners"
            );
        }
        self.validate_sharding()?;
        for (field, network) in [("network", &self.network), ("expert_network", &self.expert_network)] {
            if let Some(network) = network {
                network.validate(field)?;
            }
        }
        if self.collective_timeout_ms == 0 {
            bail!(OutOfRange, "collective_timeout_ms: must be > 0");
        }
        if self.host_threads > MAX_HOST_THREADS {
            bail!(
                OutOfRange,
                "host_threads: {} is outside 0..={MAX_HOST_THREADS} (0 = the cores divided by the ranks of the host group)",
                self.host_threads
            );
        }
        Ok(())
    }

    /// The combinations `param_sharding = sharded` cannot run with.
    fn validate_sharding(&self) -> Result<()> {
        if self.param_sharding != ParamSharding::Sharded {
            return Ok(());
        }
        if !self.overlap_param_gather {
            bail!(
                IncompatibleOptions,
                "param_sharding: sharded needs overlap_param_gather = 1; overlap_param_gather = 0 makes step() return with every param gathered on every rank, which a sharded rank has no storage for (its buckets are gathered around their forward and backward use)"
            );
        }
        if !self.overlap_grad_reduce {
            bail!(
                IncompatibleOptions,
                "param_sharding: sharded needs overlap_grad_reduce = 1; overlap_grad_reduce = 0 reduces every bucket's gradients at the step, but a sharded rank's gradients live in the gather slots, which the backward's next buckets take over once a bucket is released"
            );
        }
        Ok(())
    }

    /// Whether params are sharded.
    pub fn sharded(&self) -> bool {
        self.param_sharding == ParamSharding::Sharded
    }

    /// This config with replicated params.
    pub fn replicated(&self) -> Config {
        Config {
            param_sharding: ParamSharding::Replicated,
            ..self.clone()
        }
    }

    /// The threads of one rank's matrix products on the host backend in a data-parallel group
    /// of `group_size` ranks of this process: `host_threads` when set, else the cores this
    /// process may use divided by the ranks (at least 1), so the ranks of a group never ask
    /// for more threads than there are cores. A process that runs several groups (model
    /// parallelism on threads) sets `host_threads` to the cores divided by all its ranks.
    pub fn host_threads_for(&self, group_size: usize) -> usize {
        if self.host_threads > 0 {
            return self.host_threads as usize;
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores / group_size.max(1)).max(1)
    }

    /// The effective bucket size in elements for `dp` ranks.
    pub fn effective_bucket_size(&self, dp: usize) -> u64 {
        if self.bucket_size == 0 {
            40_000_000u64.max(1_000_000 * dp as u64)
        } else {
            self.bucket_size
        }
    }
}

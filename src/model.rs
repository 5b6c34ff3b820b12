//! Parameter specifications, the routing rule (Muon or AdamW) and the registry that validates
//! every registration against the ones before it (docs/design.md §4, "Routing").

use std::collections::HashMap;

use crate::bail;
use crate::config::{Config, Dtype, MuonVariant};
use crate::error::Result;
use crate::numerics::adaptive::moment2_values;
use crate::numerics::muon::TpDim;
use crate::numerics::step_args::ParamScales;

/// Bit flags of a parameter description (`MUON_PARAM_FLAG_*` in C).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
pub struct ParamFlags(pub u32);

impl ParamFlags {
    /// Embedding or output layer: always AdamW.
    pub const EMBEDDING_OR_OUTPUT: u32 = 1 << 0;
    /// Opt out of Muon: AdamW even when 2-D.
    pub const NO_MUON: u32 = 1 << 1;
    /// A 3-D `[E, m, n]` stack of E expert matrices, each a Muon unit.
    pub const EXPERT_STACK: u32 = 1 << 2;
    /// Persistent MXFP8 storage instead of a model-dtype copy.
    pub const MXFP8: u32 = 1 << 3;
    /// No weight decay for this parameter, whatever the config's `weight_decay_rule`.
    pub const NO_WEIGHT_DECAY: u32 = 1 << 4;
    /// Allow a Muon-routed parameter to have a dimension equal to `vocab_size`.
    pub const ALLOW_VOCAB_DIM: u32 = 1 << 5;
    /// A copy of a gradient that another rank of the norm group counts: left out of this
    /// rank's share of the global gradient norm (tensor-parallel duplicates on TP ranks > 0, a
    /// pipeline stage's copy of a shared embedding). Updated as usual.
    pub const NORM_REPLICA: u32 = 1 << 6;
    /// A tensor-parallel shard along dim 0 (a column-parallel weight).
    pub const TP_SHARD_ROWS: u32 = 1 << 7;
    /// A tensor-parallel shard along dim 1 (a row-parallel weight).
    pub const TP_SHARD_COLS: u32 = 1 << 8;
    /// A `TP_SHARD_ROWS` shard of a per-group split (Megatron's QKV) holds whole groups of the
    /// unsharded param, also when it holds one (`split_groups` 1, e.g. 8 query groups at TP 8);
    /// implied by `split_groups` > 1. Without it a row shard of a fused param holds a slice of
    /// every component (SwiGLU's gate|up, GDN's q|k|v|z|β|α). Places the shard in checkpoints
    /// (docs/checkpoint.md, "Tensor parallelism"); the update does not depend on it.
    pub const TP_WHOLE_GROUPS: u32 = 1 << 9;
    /// Weight decay for a parameter the config's `weight_decay_rule` exempts (a 1-D param or
    /// a `*.bias` under Megatron's rule); not with `NO_WEIGHT_DECAY`.
    pub const WEIGHT_DECAY: u32 = 1 << 10;
    /// A `TP_SHARD_ROWS` shard whose split components are whole components of the unsharded
    /// param (per-head Muon where TP holds whole heads: `split_sizes` one entry per head of
    /// this rank, Megatron-LM's `--muon-split-qkv-per-head` of its PR #6326): each component is
    /// orthogonalized alone on its rank in every TP mode, as the unsharded param's is.
    pub const TP_WHOLE_COMPONENTS: u32 = 1 << 11;
    /// Every defined bit.
    pub const ALL: u32 = (1 << 12) - 1;

    pub fn has(self, bit: u32) -> bool {
        self.0 & bit != 0
    }
}

/// Which optimizer updates a parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Route {
    Muon,
    Adamw,
}

impl Route {
    pub fn name(self) -> &'static str {
        match self {
            Route::Muon => "muon",
            Route::Adamw => "adamw",
        }
    }
}

/// One registered tensor, validated. Registration order is forward order.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ParamSpec {
    pub name: String,
    pub shape: Vec<u64>,
    pub dtype: Dtype,
    pub flags: ParamFlags,
    /// 0 = not tied; members of one non-zero group are copies of one logical weight.
    pub tie_group: u32,
    /// Fused components along the matrix row dimension (dim 0 of a matrix, dim 1 of an
    /// expert stack); empty = not fused.
    pub split_sizes: Vec<u64>,
    /// How many times `split_sizes` repeats along the rows (Megatron's fused QKV: one
    /// `[q, k, v]` block per query group); component c is the c-th block of every group,
    /// stacked in group order. 1 = consecutive components.
    pub split_groups: u64,
    pub lr_scale: f32,
    pub wd_scale: f32,
}

/// One Newton–Schulz problem: an m×n matrix (as stored, before any transpose).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MatrixShape {
    pub rows: u64,
    pub cols: u64,
}

/// The elements of a param of `shape`; None past 2⁴⁸ (or overflowing u64), the most a param
/// may hold.
pub(crate) fn element_count(shape: &[u64]) -> Option<u64> {
    shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .filter(|&n| n <= 1 << 48)
}

/// The first of a param's `lr_scale` and `wd_scale` that is negative or not finite, named.
pub fn invalid_scale(lr_scale: f32, wd_scale: f32) -> Option<(&'static str, f32)> {
    [("lr_scale", lr_scale), ("wd_scale", wd_scale)]
        .into_iter()
        .find(|&(_, value)| !(value.is_finite() && value >= 0.0))
}

impl ParamSpec {
    /// A plain parameter with default flags and scales.
    pub fn new(name: impl Into<String>, shape: &[u64], dtype: Dtype) -> Self {
        ParamSpec {
            name: name.into(),
            shape: shape.to_vec(),
            dtype,
            flags: ParamFlags::default(),
            tie_group: 0,
            split_sizes: Vec::new(),
            split_groups: 1,
            lr_scale: 1.0,
            wd_scale: 1.0,
        }
    }

    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }

    pub fn is_expert_stack(&self) -> bool {
        self.flags.has(ParamFlags::EXPERT_STACK)
    }

    /// The route this parameter takes on its own (tie groups are checked by the registry).
    pub fn route(&self) -> Route {
        let matrix_like = self.shape.len() == 2 || (self.shape.len() == 3 && self.is_expert_stack());
        if matrix_like && !self.flags.has(ParamFlags::EMBEDDING_OR_OUTPUT) && !self.flags.has(ParamFlags::NO_MUON) {
            Route::Muon
        } else {
            Route::Adamw
        }
    }

    /// Whether this param is stored as MXFP8 only and travels as bf16 staged on the idle grad
    /// buffer (MXFP8 with `mxfp8_param_gather`), never in param storage. Never with sharded
    /// params: their gathers bring MXFP8 params as bf16 into the working set.
    pub fn is_staged(&self, cfg: &Config) -> bool {
        cfg.mxfp8_param_gather && !cfg.sharded() && self.flags.has(ParamFlags::MXFP8)
    }

    /// Its multipliers of its optimizer group's learning rate and weight decay: `lr_scale`, and
    /// `wd_scale` or 0 when it is flagged `no_weight_decay`.
    pub fn scales(&self) -> ParamScales {
        ParamScales {
            lr_scale: self.lr_scale,
            wd_scale: if self.flags.has(ParamFlags::NO_WEIGHT_DECAY) {
                0.0
            } else {
                self.wd_scale
            },
        }
    }

    /// Number of Muon ownership units: E for an expert stack, else 1.
    pub fn num_units(&self) -> u64 {
        if self.is_expert_stack() { self.shape[0] } else { 1 }
    }

    /// The matrix of one ownership unit (a whole 2-D param or one expert).
    pub fn unit_matrix(&self) -> MatrixShape {
        let n = self.shape.len();
        MatrixShape {
            rows: self.shape[n - 2],
            cols: self.shape[n - 1],
        }
    }

    /// The second-moment values of one unit under `variant`: per each of its
    /// [`ParamSpec::unit_components`], NorMuon's one per line of the longer side, AdaMuon's one
    /// per element (`numerics::adaptive::moment2_values`); 0 for standard Muon.
    pub fn moment2_values(&self, variant: MuonVariant) -> u64 {
        (self.unit_components().iter())
            .map(|c| moment2_values(variant, c.rows as usize, c.cols as usize) as u64)
            .sum()
    }

    /// The Newton–Schulz problems inside one unit: one per fused component (its blocks of
    /// every split group stacked), else the unit.
    pub fn unit_components(&self) -> Vec<MatrixShape> {
        let unit = self.unit_matrix();
        if self.split_sizes.is_empty() {
            vec![unit]
        } else {
            self.split_sizes
                .iter()
                .map(|&rows| MatrixShape {
                    rows: rows * self.split_groups,
                    cols: unit.cols,
                })
                .collect()
        }
    }

    /// The 2-D view used by MXFP8: `[prod(shape[:-1]), shape[-1]]`.
    pub fn flat_2d(&self) -> (u64, u64) {
        let n = self.shape.len();
        (self.shape[..n - 1].iter().product(), self.shape[n - 1])
    }

    /// Checks everything that can be checked on this parameter alone.
    pub fn validate(&self) -> Result<()> {
        let name = &self.name;
        if name.is_empty() {
            bail!(InvalidParam, "name: must not be empty");
        }
        if name.chars().any(char::is_control) {
            bail!(
                InvalidParam,
                "name '{}': must not contain control characters",
                name.escape_debug()
            );
        }
        if !(1..=4).contains(&self.shape.len()) {
            bail!(
                InvalidParam,
                "param '{name}': ndim {} is outside 1..=4",
                self.shape.len()
            );
        }
        if let Some(d) = self.shape.iter().position(|&d| d == 0) {
            bail!(
                InvalidParam,
                "param '{name}': shape[{d}] is 0; every dimension must be >= 1"
            );
        }
        if element_count(&self.shape).is_none() {
            bail!(
                InvalidParam,
                "param '{name}': element count overflows (shape {:?})",
                self.shape
            );
        }
        if self.flags.0 & !ParamFlags::ALL != 0 {
            bail!(
                InvalidParam,
                "param '{name}': unknown flag bits 0x{:x} (defined bits: 0x{:x})",
                self.flags.0 & !ParamFlags::ALL,
                ParamFlags::ALL
            );
        }
        if self.is_expert_stack() && self.shape.len() != 3 {
            bail!(
                InvalidParam,
                "param '{name}': EXPERT_STACK needs a 3-D [E, m, n] shape, got ndim {}",
                self.shape.len()
            );
        }
        if self.flags.has(ParamFlags::NO_WEIGHT_DECAY) && self.flags.has(ParamFlags::WEIGHT_DECAY) {
            bail!(
                InvalidParam,
                "param '{name}': NO_WEIGHT_DECAY and WEIGHT_DECAY both set; a param is decayed or not"
            );
        }
        self.validate_tp_shard()?;
        self.validate_splits()?;
        self.validate_mxfp8()?;
        if let Some((field, value)) = invalid_scale(self.lr_scale, self.wd_scale) {
            bail!(InvalidParam, "param '{name}': {field} {value} must be finite and >= 0");
        }
        Ok(())
    }

    /// The dimension a tensor-parallel shard is split along, from its flags.
    /// The dimension along which the TP ranks' shards of this Muon matrix are orthogonalized
    /// together in the duplicated and distributed modes: [`ParamSpec::tp_shard`], but none for
    /// a shard of whole components (`TP_WHOLE_COMPONENTS`), each orthogonalized on its rank.
    pub fn tp_joined(&self) -> Option<TpDim> {
        self.tp_shard()
            .filter(|_| !self.flags.has(ParamFlags::TP_WHOLE_COMPONENTS))
    }

    pub fn tp_shard(&self) -> Option<TpDim> {
        if self.flags.has(ParamFlags::TP_SHARD_ROWS) {
            Some(TpDim::Rows)
        } else if self.flags.has(ParamFlags::TP_SHARD_COLS) {
            Some(TpDim::Cols)
        } else {
            None
        }
    }

    fn validate_tp_shard(&self) -> Result<()> {
        let both = ParamFlags::TP_SHARD_ROWS | ParamFlags::TP_SHARD_COLS;
        if self.flags.0 & both == both {
            bail!(
                InvalidParam,
                "param '{}': TP_SHARD_ROWS and TP_SHARD_COLS both set; a shard is split along one dimension",
                self.name
            );
        }
        if self.flags.has(ParamFlags::TP_WHOLE_GROUPS)
            && (!self.flags.has(ParamFlags::TP_SHARD_ROWS) || self.split_sizes.is_empty() || self.is_expert_stack())
        {
            bail!(
                InvalidParam,
                "param '{}': TP_WHOLE_GROUPS describes a TP_SHARD_ROWS shard of a per-group split; it needs TP_SHARD_ROWS and split_sizes, and no EXPERT_STACK",
                self.name
            );
        }
        if self.flags.has(ParamFlags::TP_WHOLE_COMPONENTS)
            && (!self.flags.has(ParamFlags::TP_SHARD_ROWS)
                || self.split_sizes.is_empty()
                || self.split_groups > 1
                || self.flags.has(ParamFlags::TP_WHOLE_GROUPS)
                || self.is_expert_stack())
        {
            bail!(
                InvalidParam,
                "param '{}': TP_WHOLE_COMPONENTS describes a TP_SHARD_ROWS shard holding whole components (heads); it needs TP_SHARD_ROWS and split_sizes, and no split groups, TP_WHOLE_GROUPS or EXPERT_STACK",
                self.name
            );
        }
        // On a param AdamW updates (a column-parallel bias, a norm) the flags are accepted: its
        // update ignores them, checkpoints place its shard in the unsharded param, as the header
        // documents (a Megatron adapter maps `partition_dim` onto every sharded tensor).
        Ok(())
    }

    fn validate_splits(&self) -> Result<()> {
        let name = &self.name;
        if self.split_sizes.is_empty() {
            if self.split_groups != 1 {
                bail!(
                    InvalidParam,
                    "param '{name}': split_groups {} without split_sizes; give the sizes of one group's components",
                    self.split_groups
                );
            }
            return Ok(());
        }
        if self.route() != Route::Muon {
            bail!(
                InvalidParam,
                "param '{name}': split_sizes apply to Muon matrices only (this param routes to AdamW)"
            );
        }
        let (dim, rows) = if self.is_expert_stack() {
            (1, self.shape[1])
        } else {
            (0, self.shape[0])
        };
        if let Some(i) = self.split_sizes.iter().position(|&s| s == 0) {
            bail!(
                InvalidParam,
                "param '{name}': split_sizes[{i}] is 0; every component needs >= 1 row"
            );
        }
        let groups = self.split_groups;
        if groups == 0 || (groups > 1 && self.is_expert_stack()) {
            bail!(
                InvalidParam,
                "param '{name}': split_groups {groups} must be >= 1, and 1 for an expert stack"
            );
        }
        // Checked: a wrapped sum could equal `rows` and pass.
        let sum = self
            .split_sizes
            .iter()
            .try_fold(0u64, |acc, &s| acc.checked_add(s))
            .and_then(|s| s.checked_mul(groups));
        if sum != Some(rows) {
            let sum = sum.map_or_else(|| "more than 2^64".to_string(), |s| s.to_string());
            let times = if groups > 1 {
                format!(" × {groups} groups")
            } else {
                String::new()
            };
            bail!(
                InvalidParam,
                "param '{name}': split_sizes {:?}{times} sum to {sum}, but dim {dim} is {rows}",
                self.split_sizes
            );
        }
        Ok(())
    }

    fn validate_mxfp8(&self) -> Result<()> {
        let name = &self.name;
        if !self.flags.has(ParamFlags::MXFP8) {
            return Ok(());
        }
        if self.dtype != Dtype::Bf16 {
            bail!(
                InvalidParam,
                "param '{name}': MXFP8 storage is quantized from bf16, so dtype must be bf16 (got {})",
                self.dtype.name()
            );
        }
        let (rows, cols) = self.flat_2d();
        if rows % 32 != 0 || cols % 32 != 0 {
            bail!(
                InvalidParam,
                "param '{name}': MXFP8 storage needs both flattened dims to be multiples of 32, got [{rows}, {cols}]"
            );
        }
        Ok(())
    }
}

/// The validated list of parameters and their routes.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    params: Vec<ParamSpec>,
    routes: Vec<Route>,
    by_name: HashMap<String, usize>,
    tie_first: HashMap<u32, usize>,
    /// The tensor-parallel size the vocabulary is padded for (0 until a TP group is set: 1).
    tensor_parallel: u64,
}

/// Megatron-LM pads the vocabulary to a multiple of `make_vocab_size_divisible_by` (default
/// 128) times the tensor-parallel size (`_vocab_size_with_padding` in
/// megatron/training/tokenizer/tokenizer.py): an embedding of `vocab_size` tokens has up to
/// that many rows.
const VOCAB_DIVISIBLE_BY: u64 = 128;

/// The dimension of `spec` that is the vocabulary `vocab`, as given or padded for `tp` ranks
/// (exactly the padded size: a hidden dimension between the two stays one), if any.
fn vocab_dim(spec: &ParamSpec, vocab: u64, tp: u64) -> Option<(usize, u64)> {
    let padded = vocab
        .checked_next_multiple_of(VOCAB_DIVISIBLE_BY * tp.max(1))
        .unwrap_or(vocab);
    let d = spec.shape.iter().position(|&d| d == vocab || d == padded)?;
    Some((d, padded))
}

/// The explicit `vocab_size` check: a Muon-routed param with a dimension in the (padded)
/// vocabulary is an untagged embedding or output layer, unless it allows it.
fn check_vocab(spec: &ParamSpec, route: Route, vocab: u64, tp: u64) -> Result<()> {
    if route != Route::Muon || vocab == 0 || spec.flags.has(ParamFlags::ALLOW_VOCAB_DIM) {
        return Ok(());
    }
    if let Some((d, padded)) = vocab_dim(spec, vocab, tp) {
        bail!(
            RoutingConflict,
            "param '{}': routes to Muon but shape[{d}] = {} is the vocabulary (vocab_size {vocab}, which Megatron-LM pads to {padded}: a multiple of 128 x TP {}); an embedding or output layer must be flagged EMBEDDING_OR_OUTPUT (or set ALLOW_VOCAB_DIM if this really is a hidden matrix)",
            spec.name,
            spec.shape[d],
            tp.max(1)
        );
    }
    Ok(())
}

impl Registry {
    pub fn params(&self) -> &[ParamSpec] {
        &self.params
    }

    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    pub fn len(&self) -> usize {
        self.params.len()
    }

    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// The vocabulary size the params flagged `EMBEDDING_OR_OUTPUT` declare: the largest dim 0
    /// of those with two or more dims (Megatron's embedding and output weights are
    /// `[vocab / TP, hidden]`), 0 when there are none.
    pub fn embedding_rows(&self) -> u64 {
        self.params
            .iter()
            .filter(|p| p.flags.has(ParamFlags::EMBEDDING_OR_OUTPUT) && p.shape.len() >= 2)
            .map(|p| p.shape[0])
            .max()
            .unwrap_or(0)
    }

    /// The first Muon-routed param not flagged `ALLOW_VOCAB_DIM` whose dim 0 is `vocab`: an
    /// untagged copy of an embedding or output layer of that vocabulary (`vocab_size` 0 at
    /// finalize, docs/design.md §4).
    pub fn first_with_vocab_rows(&self, vocab: u64) -> Option<&ParamSpec> {
        self.params.iter().zip(&self.routes).find_map(|(p, route)| {
            let copy = *route == Route::Muon && !p.flags.has(ParamFlags::ALLOW_VOCAB_DIM) && p.shape[0] == vocab;
            copy.then_some(p)
        })
    }

    /// Validates `spec` against the config and earlier registrations and appends it.
    /// Returns the new parameter's id (its registration index). On error nothing changes.
    /// Checks the params registered so far against the `vocab_size` check's vocabulary padded
    /// for a tensor-parallel group of `tp` ranks; changes nothing.
    pub fn check_tensor_parallel(&self, tp: u64, cfg: &Config) -> Result<()> {
        self.params
            .iter()
            .zip(&self.routes)
            .try_for_each(|(spec, &route)| check_vocab(spec, route, cfg.vocab_size, tp))
    }

    /// Pads the vocabulary of the `vocab_size` check for `tp` ranks from now on (after
    /// [`Registry::check_tensor_parallel`]).
    pub fn set_tensor_parallel(&mut self, tp: u64) {
        self.tensor_parallel = tp;
    }

    pub fn add(&mut self, mut spec: ParamSpec, cfg: &Config) -> Result<u32> {
        spec.validate()?;
        if cfg.weight_decay_rule.exempts(&spec.name, spec.shape.len()) && !spec.flags.has(ParamFlags::WEIGHT_DECAY) {
            spec.flags.0 |= ParamFlags::NO_WEIGHT_DECAY;
        }
        if let Some(&other) = self.by_name.get(&spec.name) {
            bail!(
                DuplicateName,
                "name '{}': already registered as param id {other}",
                spec.name
            );
        }
        let route = spec.route();
        if spec.tie_group != 0
            && let Some(&first) = self.tie_first.get(&spec.tie_group)
        {
            let other = &self.params[first];
            if self.routes[first] != route {
                bail!(
                    RoutingConflict,
                    "tie_group {}: param '{}' routes to {} but its tied copy '{}' routes to {}; tied copies of one weight must route alike (flag both EMBEDDING_OR_OUTPUT, or neither)",
                    spec.tie_group,
                    spec.name,
                    route.name(),
                    other.name,
                    self.routes[first].name()
                );
            }
            if other.shape != spec.shape {
                bail!(
                    RoutingConflict,
                    "tie_group {}: param '{}' has shape {:?} but its tied copy '{}' has shape {:?}",
                    spec.tie_group,
                    spec.name,
                    spec.shape,
                    other.name,
                    other.shape
                );
            }
        }
        check_vocab(&spec, route, cfg.vocab_size, self.tensor_parallel)?;
        let id = self.params.len();
        if spec.tie_group != 0 {
            self.tie_first.entry(spec.tie_group).or_insert(id);
        }
        self.by_name.insert(spec.name.clone(), id);
        self.params.push(spec);
        self.routes.push(route);
        Ok(id as u32)
    }
}

/// Params whose forward is a table lookup rather than a GEMM (no `6·numel·tokens` flops): the
/// input embeddings (`…embeddings…`, flagged as embedding) of a model that has an output layer
/// of its own. A word embedding tied to the output (GPT-2) is also the output GEMM and is
/// charged as one; position embeddings are lookups either way.
pub fn lookups(params: &[ParamSpec]) -> Vec<bool> {
    let embedding = |s: &ParamSpec| s.flags.has(ParamFlags::EMBEDDING_OR_OUTPUT) && s.name.contains("embeddings");
    let own_output = params
        .iter()
        .any(|s| s.flags.has(ParamFlags::EMBEDDING_OR_OUTPUT) && !s.name.contains("embeddings"));
    params
        .iter()
        .map(|s| embedding(s) && (own_output || s.name.contains("position")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn flagged(name: &str, shape: &[u64], flags: u32) -> ParamSpec {
        let mut p = ParamSpec::new(name, shape, Dtype::Bf16);
        p.flags = ParamFlags(flags);
        p
    }

    #[test]
    fn routing_rule() {
        assert_eq!(ParamSpec::new("w", &[4, 8], Dtype::F32).route(), Route::Muon);
        assert_eq!(ParamSpec::new("b", &[8], Dtype::F32).route(), Route::Adamw);
        assert_eq!(ParamSpec::new("c", &[2, 4, 8], Dtype::F32).route(), Route::Adamw);
        assert_eq!(flagged("e", &[2, 4, 8], ParamFlags::EXPERT_STACK).route(), Route::Muon);
        assert_eq!(
            flagged("emb", &[10, 8], ParamFlags::EMBEDDING_OR_OUTPUT).route(),
            Route::Adamw
        );
        assert_eq!(flagged("x", &[10, 8], ParamFlags::NO_MUON).route(), Route::Adamw);
    }

    #[test]
    fn mtp_duplicate_embedding_in_tie_group_is_rejected_naming_both() {
        let cfg = Config::default();
        let mut reg = Registry::default();
        let mut emb = flagged(
            "embedding.word_embeddings.weight",
            &[1000, 64],
            ParamFlags::EMBEDDING_OR_OUTPUT,
        );
        emb.tie_group = 7;
        reg.add(emb, &cfg).unwrap();
        let mut mtp = ParamSpec::new("mtp.0.embedding.word_embeddings.weight", &[1000, 64], Dtype::Bf16);
        mtp.tie_group = 7;
        let err = reg.add(mtp, &cfg).unwrap_err();
        assert_eq!(err.kind, ErrorKind::RoutingConflict);
        assert!(
            err.message.contains("embedding.word_embeddings.weight"),
            "{}",
            err.message
        );
        assert!(
            err.message.contains("mtp.0.embedding.word_embeddings.weight"),
            "{}",
            err.message
        );
        assert_eq!(reg.len(), 1, "a failed add must not register anything");
    }

    #[test]
    fn mtp_duplicate_without_tie_group_is_caught_by_vocab_size() {
        let cfg = Config {
            vocab_size: 1000,
            ..Config::default()
        };
        let mut reg = Registry::default();
        reg.add(flagged("emb", &[1000, 64], ParamFlags::EMBEDDING_OR_OUTPUT), &cfg)
            .unwrap();
        let err = reg
            .add(ParamSpec::new("mtp.emb", &[1000, 64], Dtype::Bf16), &cfg)
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::RoutingConflict);
        assert!(
            err.message.contains("mtp.emb") && err.message.contains("vocab_size 1000"),
            "{}",
            err.message
        );
        let allowed = flagged("mtp.emb", &[1000, 64], ParamFlags::ALLOW_VOCAB_DIM);
        assert_eq!(reg.add(allowed, &cfg).unwrap(), 1);
    }

    /// llm.c's GPT-2: vocab_size 50257, the embedding padded to 50304 rows (a multiple of 128,
    /// as Megatron-LM pads it): an untagged 50304-row copy is the vocabulary too, a hidden
    /// matrix of another size is not; at TP 8 the padding is 51200 (a multiple of 1024), and a
    /// TP group that would make a registered param the vocabulary is refused before anything
    /// changes.
    #[test]
    fn a_padded_vocabulary_is_the_vocabulary() {
        let cfg = Config {
            vocab_size: 50257,
            ..Config::default()
        };
        let mut reg = Registry::default();
        for rows in [50257, 50304] {
            let err = reg
                .add(ParamSpec::new("wte.copy", &[rows, 768], Dtype::F32), &cfg)
                .unwrap_err();
            assert_eq!(err.kind, ErrorKind::RoutingConflict, "{rows}: {}", err.message);
            assert!(
                err.message.contains("pads to 50304") && err.message.contains("TP 1"),
                "{}",
                err.message
            );
        }
        for rows in [50256, 50280, 50305] {
            reg.add(ParamSpec::new(format!("hidden.{rows}"), &[rows, 768], Dtype::F32), &cfg)
                .unwrap();
        }
        reg.add(ParamSpec::new("hidden.a", &[51200, 768], Dtype::F32), &cfg)
            .unwrap();
        let err = reg.check_tensor_parallel(8, &cfg).unwrap_err();
        assert!(
            err.message.contains("hidden.a") && err.message.contains("pads to 51200"),
            "{}",
            err.message
        );
        reg.check_tensor_parallel(1, &cfg).unwrap();
        reg.set_tensor_parallel(8);
        let err = reg
            .add(ParamSpec::new("wte.tp8", &[51200, 768], Dtype::F32), &cfg)
            .unwrap_err();
        assert!(err.message.contains("TP 8"), "{}", err.message);
        reg.add(ParamSpec::new("hidden.c", &[51072, 768], Dtype::F32), &cfg)
            .unwrap();
    }

    #[test]
    fn invalid_descriptions_name_the_rule() {
        let cfg = Config::default();
        let cases: Vec<(ParamSpec, &str)> = vec![
            (ParamSpec::new("", &[4], Dtype::F32), "must not be empty"),
            (ParamSpec::new("z", &[4, 0], Dtype::F32), "shape[1] is 0"),
            (ParamSpec::new("n", &[1, 2, 3, 4, 5], Dtype::F32), "ndim 5"),
            (
                ParamSpec {
                    split_sizes: vec![3, 3],
                    ..ParamSpec::new("s", &[8, 4], Dtype::F32)
                },
                "sum to 6",
            ),
            (
                // Wraps to exactly 8 in unchecked u64 arithmetic.
                ParamSpec {
                    split_sizes: vec![u64::MAX, 9],
                    ..ParamSpec::new("w", &[8, 4], Dtype::F32)
                },
                "sum to more than 2^64",
            ),
            (flagged("m", &[48, 64], ParamFlags::MXFP8), "multiples of 32"),
            (flagged("u", &[4, 4], 1 << 20), "unknown flag bits"),
            (flagged("x", &[4, 4], ParamFlags::EXPERT_STACK), "3-D"),
            (
                flagged("t", &[4, 4], ParamFlags::TP_SHARD_ROWS | ParamFlags::TP_SHARD_COLS),
                "both set",
            ),
            (
                flagged("g", &[4, 4], ParamFlags::TP_SHARD_ROWS | ParamFlags::TP_WHOLE_GROUPS),
                "TP_WHOLE_GROUPS describes",
            ),
            (
                flagged(
                    "h",
                    &[4, 4],
                    ParamFlags::TP_SHARD_ROWS | ParamFlags::TP_WHOLE_COMPONENTS,
                ),
                "TP_WHOLE_COMPONENTS describes",
            ),
            (
                ParamSpec {
                    split_sizes: vec![2, 2],
                    ..flagged(
                        "c",
                        &[4, 4],
                        ParamFlags::TP_SHARD_COLS | ParamFlags::TP_WHOLE_COMPONENTS,
                    )
                },
                "TP_WHOLE_COMPONENTS describes",
            ),
            (
                ParamSpec {
                    split_sizes: vec![1, 1],
                    split_groups: 2,
                    ..flagged(
                        "q",
                        &[4, 4],
                        ParamFlags::TP_SHARD_ROWS | ParamFlags::TP_WHOLE_COMPONENTS,
                    )
                },
                "TP_WHOLE_COMPONENTS describes",
            ),
        ];
        for (spec, needle) in cases {
            let err = Registry::default().add(spec, &cfg).unwrap_err();
            assert_eq!(err.kind, ErrorKind::InvalidParam);
            assert!(err.message.contains(needle), "{} lacks {needle}", err.message);
        }
    }

    /// TP flags on params AdamW updates are accepted and change nothing: a column-parallel
    /// bias (1-D) routes to AdamW as without them.
    #[test]
    fn tp_flags_on_adamw_params_are_accepted_and_ignored() {
        let cfg = Config::default();
        let mut reg = Registry::default();
        for (name, shape) in [("bias", &[4][..]), ("stack", &[2, 4, 4][..])] {
            reg.add(flagged(name, shape, ParamFlags::TP_SHARD_ROWS), &cfg).unwrap();
        }
        assert!(reg.routes().iter().all(|r| *r == Route::Adamw), "{:?}", reg.routes());
    }

    #[test]
    fn duplicate_names_are_rejected() {
        let cfg = Config::default();
        let mut reg = Registry::default();
        reg.add(ParamSpec::new("w", &[4, 4], Dtype::F32), &cfg).unwrap();
        let err = reg.add(ParamSpec::new("w", &[4], Dtype::F32), &cfg).unwrap_err();
        assert_eq!(err.kind, ErrorKind::DuplicateName);
    }

    #[test]
    fn expert_stack_units_and_components() {
        let mut p = flagged("experts.fc1", &[8, 64, 32], ParamFlags::EXPERT_STACK);
        p.split_sizes = vec![32, 32];
        p.validate().unwrap();
        assert_eq!(p.num_units(), 8);
        assert_eq!(p.unit_components(), vec![MatrixShape { rows: 32, cols: 32 }; 2]);
    }
}

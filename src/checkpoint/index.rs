//! `index.json`: what a checkpoint holds and where. An envelope
//! `{"format", "format_version", "crc32", "index"}` whose `crc32` covers the exact bytes of the
//! `index` value, so that any change to the file is detected.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use super::components::{Component, StateKind, components, split_by_component, tensor_key};
use super::tp::{Block, Placement, TpRank, TpSplit, block_items, block_text, held_blocks};
use crate::bail;
use crate::config::{
    CoefficientSet, Config, DEFAULT_NS_EPS, Dtype, MuonLayout, MuonVariant, NsMethod, NsPrecision, ScaleMode, TpMode,
};
use crate::error::{Error, ErrorKind, Result};
use crate::model::{ParamFlags, ParamSpec, Route};
use crate::plan::{ElemRange, Plan};

/// The `format` of every index.
pub const FORMAT: &str = "muon_opt.checkpoint";
/// The newest format version, which this library reads with every older one. It writes
/// version 2 for a checkpoint saved by a rank of a tensor-parallel group (pieces of blocks of
/// the unsharded params, `tp.rs`), and version 1 otherwise, byte for byte as before.
pub const FORMAT_VERSION: u32 = 2;

/// File name of rank `rank`'s state.
pub fn rank_file_name(rank: usize) -> String {
    format!("rank-{rank:05}.safetensors")
}

/// The config fields that change numerics: a checkpoint loads only into an optimizer whose
/// values are equal. (Layout, buckets, overlap, timeouts and MXFP8 storage do not change a
/// single bit of the state, so they may differ.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NumericsConfig {
    pub grad_dtype: Dtype,
    pub muon_momentum: f32,
    pub muon_nesterov: bool,
    pub muon_coefficient_set: CoefficientSet,
    pub muon_num_ns_steps: u32,
    pub muon_ns_precision: NsPrecision,
    pub muon_scale_mode: ScaleMode,
    pub muon_extra_scale_factor: f32,
    pub adam_beta1: f32,
    pub adam_beta2: f32,
    pub adam_eps: f32,
    pub clip_grad: f32,
    /// Written only when it differs from the default (checkpoints of the default keep their
    /// bytes; older ones read as the default).
    #[serde(default = "default_ns_eps", skip_serializing_if = "is_default_ns_eps")]
    pub muon_ns_eps: f32,
    /// Written only when it is not `standard` (checkpoints of the default keep their bytes;
    /// older ones, which have no such field, read as `standard`). Like the precision, the
    /// method changes the rounding of every Muon update, so a checkpoint loads only into an
    /// optimizer with the same method.
    #[serde(default = "standard_method", skip_serializing_if = "is_standard_method")]
    pub muon_ns_method: NsMethod,
    /// Written only when it is not `standard` (older checkpoints read as `standard`): a NorMuon
    /// or AdaMuon checkpoint holds a second moment a standard optimizer has no place for (and
    /// each a different statistic), and a standard one none to resume them from, so a
    /// checkpoint loads only with its variant.
    #[serde(default = "standard_variant", skip_serializing_if = "is_standard_variant")]
    pub muon_variant: MuonVariant,
    /// The adaptive variants' β2 and ε, written with `normuon` and `adamuon` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive_muon_beta2: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive_muon_eps: Option<f32>,
    /// The `custom` set's table, written with that set only (every other checkpoint keeps its
    /// bytes): a load with another table is refused as one with another set is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub muon_custom_coefficients: Option<Vec<[f32; 3]>>,
    /// Written only when it is not `f32` (older checkpoints read as `f32`): a bf16 momentum
    /// rounds every step's momentum, so a checkpoint loads only with the dtype it was saved
    /// with, as with the precision.
    #[serde(default = "f32_momentum", skip_serializing_if = "is_f32_momentum")]
    pub muon_momentum_dtype: Dtype,
}

fn f32_momentum() -> Dtype {
    Dtype::F32
}

fn is_f32_momentum(value: &Dtype) -> bool {
    *value == Dtype::F32
}

fn standard_variant() -> MuonVariant {
    MuonVariant::Standard
}

fn is_standard_variant(value: &MuonVariant) -> bool {
    *value == MuonVariant::Standard
}

fn standard_method() -> NsMethod {
    NsMethod::Standard
}

fn is_standard_method(value: &NsMethod) -> bool {
    *value == NsMethod::Standard
}

fn default_ns_eps() -> f32 {
    DEFAULT_NS_EPS
}

fn is_default_ns_eps(value: &f32) -> bool {
    value.to_bits() == DEFAULT_NS_EPS.to_bits()
}

impl NumericsConfig {
    /// The fields as JSON values, each float written as its shortest f32 text (0.9, not
    /// 0.8999999761581421): equal values give equal fields and different ones different.
    pub fn fields(&self) -> serde_json::Map<String, serde_json::Value> {
        let text = serde_json::to_string(self).expect("plain data serializes");
        serde_json::from_str(&text).expect("serde_json reads its own output")
    }

    pub fn of(cfg: &Config) -> Self {
        NumericsConfig {
            grad_dtype: cfg.grad_dtype,
            muon_momentum: cfg.muon_momentum,
            muon_nesterov: cfg.muon_nesterov,
            muon_coefficient_set: cfg.muon_coefficient_set,
            muon_num_ns_steps: cfg.muon_num_ns_steps,
            muon_ns_precision: cfg.muon_ns_precision,
            muon_scale_mode: cfg.muon_scale_mode,
            muon_extra_scale_factor: cfg.muon_extra_scale_factor,
            adam_beta1: cfg.adam_beta1,
            adam_beta2: cfg.adam_beta2,
            adam_eps: cfg.adam_eps,
            clip_grad: cfg.clip_grad,
            muon_ns_eps: cfg.muon_ns_eps,
            muon_ns_method: cfg.muon_ns_method,
            muon_variant: cfg.muon_variant,
            adaptive_muon_beta2: cfg.muon_variant.is_adaptive().then_some(cfg.adaptive_muon_beta2),
            adaptive_muon_eps: cfg.muon_variant.is_adaptive().then_some(cfg.adaptive_muon_eps),
            muon_custom_coefficients: (cfg.muon_coefficient_set == CoefficientSet::Custom)
                .then(|| cfg.muon_custom_coefficients.clone()),
            muon_momentum_dtype: cfg.muon_momentum_dtype,
        }
    }
}

/// One rank's file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    pub name: String,
    pub rank: u32,
    /// Size of the whole file.
    pub bytes: u64,
    /// CRC-32 (IEEE) of the whole file.
    #[serde(with = "hex_u32")]
    pub crc32: u32,
    /// Size of the safetensors header: the 8-byte length and the JSON header.
    pub header_bytes: u64,
    /// CRC-32 of those header bytes (the header holds the CRC-32 of every tensor).
    #[serde(with = "hex_u32")]
    pub header_crc32: u32,
}

/// Items `start..end` of a component — of `block` of it, in the block's own row-major order,
/// when one is given — held by `file` under one key per state kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PieceEntry {
    pub file: String,
    pub start: u64,
    pub end: u64,
    pub keys: BTreeMap<StateKind, String>,
    /// The box of the component (`[lo, hi)` per dimension) a TP shard holds; absent = all of
    /// it (format version 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<Block>,
}

impl PieceEntry {
    pub fn range(&self) -> ElemRange {
        ElemRange::new(self.start, self.end)
    }
}

/// One component of a param and the pieces that hold it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComponentEntry {
    pub name: String,
    /// First item of the component in the param.
    pub offset: u64,
    pub shape: Vec<u64>,
    /// In item order, disjoint, covering the component.
    pub pieces: Vec<PieceEntry>,
}

/// One param as registered when the checkpoint was saved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamEntry {
    pub name: String,
    pub shape: Vec<u64>,
    pub dtype: Dtype,
    pub route: Route,
    pub expert_stack: bool,
    pub split_sizes: Vec<u64>,
    /// Groups `split_sizes` repeats in (absent = 1, so checkpoints without per-group splits
    /// keep their bytes).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub split_groups: u64,
    /// How the saving rank's TP shard lies in this (unsharded) param; absent = the rank held
    /// all of it (format version 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp_split: Option<TpSplit>,
    pub components: Vec<ComponentEntry>,
}

fn one() -> u64 {
    1
}

fn is_one(value: &u64) -> bool {
    *value == 1
}

/// The checkpoint index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Index {
    /// Version of the library that wrote the checkpoint.
    pub library_version: String,
    /// SHA-256 of the model description (params sorted by name: name, shape, route, expert
    /// flag, split sizes).
    pub model_hash: String,
    /// Data-parallel size and Muon layout at save time.
    pub dp: u32,
    pub layout: MuonLayout,
    /// Optimizer steps taken (AdamW bias correction continues from it).
    pub step: u64,
    /// The saving ranks' place in their tensor-parallel group of more than one rank (format
    /// version 2); absent without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp: Option<TpRank>,
    /// The `muon_tp_mode` of ranks saving in such a group, where it changes every Muon update
    /// of a TP shard (blockwise orthogonalizes the shard, duplicated and distributed the whole
    /// matrix); absent without one, and in checkpoints saved before it was recorded, which then
    /// load in any mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub muon_tp_mode: Option<TpMode>,
    pub config: NumericsConfig,
    /// One per rank, in rank order.
    pub files: Vec<FileEntry>,
    /// In registration order.
    pub params: Vec<ParamEntry>,
}

#[derive(Serialize)]
struct ModelKey<'a> {
    name: &'a str,
    shape: &'a [u64],
    route: Route,
    expert_stack: bool,
    split_sizes: &'a [u64],
    #[serde(skip_serializing_if = "is_one")]
    split_groups: u64,
}

/// The model description hash (see [`Index::model_hash`]).
pub fn model_hash(specs: &[ParamSpec]) -> String {
    let mut keys: Vec<ModelKey> = specs
        .iter()
        .map(|s| ModelKey {
            name: &s.name,
            shape: &s.shape,
            route: s.route(),
            expert_stack: s.is_expert_stack(),
            split_sizes: &s.split_sizes,
            split_groups: s.split_groups,
        })
        .collect();
    keys.sort_by(|a, b| a.name.cmp(b.name));
    let text = serde_json::to_string(&keys).expect("plain data serializes");
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every piece of state rank `rank` owns: (param, items of the param), in the order of
/// [`crate::schedule::Runtime::owned_ranges`].
pub fn rank_ranges(plan: &Plan, rank: usize) -> Vec<(u32, ElemRange)> {
    let muon = plan.muon_units_of(rank).into_iter().map(|unit| {
        let offset = plan.params[unit.param as usize].offset;
        (unit.param, unit.range.shifted_down(offset))
    });
    let adamw = plan
        .adamw_shards_of(rank)
        .into_iter()
        .flat_map(|shard| shard.pieces.into_iter().map(|p| (p.param, p.param_range)));
    muon.chain(adamw).collect()
}

impl Index {
    /// The index of a checkpoint of `specs` planned as `plan`, placed in the unsharded params
    /// as `placements` by ranks at `tp`, with `files` written by every rank. Every rank's
    /// pieces come from the plan, so the result is the same on every rank.
    pub fn new(
        plan: &Plan,
        specs: &[ParamSpec],
        placements: &[Placement],
        cfg: &Config,
        step: u64,
        files: Vec<FileEntry>,
        tp: Option<TpRank>,
    ) -> Index {
        let mut params: Vec<ParamEntry> = placements
            .iter()
            .zip(&plan.params)
            .map(|(placement, planned)| {
                let global = &placement.global;
                ParamEntry {
                    name: global.name.clone(),
                    shape: global.shape.clone(),
                    dtype: global.dtype,
                    route: planned.route,
                    expert_stack: global.is_expert_stack(),
                    split_sizes: global.split_sizes.clone(),
                    split_groups: global.split_groups,
                    tp_split: placement.split,
                    components: components(global)
                        .into_iter()
                        .map(|c| ComponentEntry {
                            name: c.name,
                            offset: c.range.start,
                            shape: c.shape,
                            pieces: Vec::new(),
                        })
                        .collect(),
                }
            })
            .collect();
        let comps: Vec<Vec<Component>> = specs.iter().map(components).collect();
        for rank in 0..plan.dp as usize {
            for (param, range) in rank_ranges(plan, rank) {
                let (p, entry) = (param as usize, &mut params[param as usize]);
                let kinds = StateKind::of(entry.route, cfg.muon_variant);
                for (c, part) in split_by_component(&comps[p], range) {
                    let (global, block) = &placements[p].parts[c];
                    let component = &mut entry.components[*global];
                    let local = part.shifted_down(comps[p][c].range.start);
                    let keys = kinds
                        .iter()
                        .map(|&k| (k, tensor_key(&component.name, k, block.as_deref(), local)))
                        .collect();
                    component.pieces.push(PieceEntry {
                        file: rank_file_name(rank),
                        start: local.start,
                        end: local.end,
                        keys,
                        block: block.clone(),
                    });
                }
            }
        }
        for component in params.iter_mut().flat_map(|p| p.components.iter_mut()) {
            component.pieces.sort_by_key(|p| p.start);
        }
        let globals: Vec<ParamSpec> = placements.iter().map(|p| p.global.clone()).collect();
        Index {
            library_version: env!("CARGO_PKG_VERSION").to_string(),
            model_hash: model_hash(&globals),
            dp: plan.dp,
            layout: plan.layout,
            step,
            tp,
            muon_tp_mode: tp.map(|_| cfg.muon_tp_mode),
            config: NumericsConfig::of(cfg),
            files,
            params,
        }
    }

    /// The format version of this index: 2 with a TP group, else 1.
    pub fn format_version(&self) -> u32 {
        if self.tp.is_some() { 2 } else { 1 }
    }

    /// The file `index.json` holds.
    pub fn encode(&self) -> String {
        let body = serde_json::to_string_pretty(self).expect("the index has only string map keys");
        let raw = RawValue::from_string(body).expect("serde_json output is valid JSON");
        let envelope = Envelope {
            format: FORMAT.to_string(),
            format_version: self.format_version(),
            crc32: crc32fast::hash(raw.get().as_bytes()),
            index: raw,
        };
        let mut text = serde_json::to_string(&envelope).expect("the envelope serializes");
        text.push('\n');
        text
    }

    /// Parses `index.json`: CHECKPOINT_VERSION for a newer format, CHECKPOINT_MISMATCH for
    /// another format, CHECKPOINT_CORRUPT for anything else that is wrong.
    pub fn decode(bytes: &[u8]) -> Result<Index> {
        let corrupt = |what: String| Error::new(ErrorKind::CheckpointCorrupt, format!("index.json: {what}"));
        let probe: Probe =
            serde_json::from_slice(bytes).map_err(|e| corrupt(format!("not a checkpoint index ({e})")))?;
        if probe.format != FORMAT {
            bail!(
                CheckpointMismatch,
                "index.json: format '{}' is not a muon_opt checkpoint ('{FORMAT}')",
                probe.format
            );
        }
        let version = match &probe.format_version {
            Some(Value::Number(n)) if n.as_u64().is_some() => n.as_u64().expect("checked"),
            Some(other) => {
                return Err(corrupt(format!(
                    "format_version: {other} is not a format version (a positive integer)"
                )));
            }
            None => return Err(corrupt("format_version: missing or null (a positive integer)".into())),
        };
        if version > u64::from(FORMAT_VERSION) {
            bail!(
                CheckpointVersion,
                "index.json: format_version {version} is newer than the {FORMAT_VERSION} this library (version {}) reads; load it with a newer libmuon_opt",
                env!("CARGO_PKG_VERSION")
            );
        }
        if version == 0 {
            return Err(corrupt("format_version: 0 does not exist (versions start at 1)".into()));
        }
        let envelope: Envelope = serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
        let actual = crc32fast::hash(envelope.index.get().as_bytes());
        if actual != envelope.crc32 {
            return Err(corrupt(format!(
                "checksum {actual:08x} of the index differs from the recorded {:08x}",
                envelope.crc32
            )));
        }
        let index: Index = serde_json::from_str(envelope.index.get()).map_err(|e| corrupt(e.to_string()))?;
        if index.format_version() > envelope.format_version {
            return Err(corrupt(format!(
                "a version {} index holds the tensor-parallel fields of version {}",
                envelope.format_version,
                index.format_version()
            )));
        }
        index.check_consistent().map_err(corrupt)?;
        Ok(index)
    }

    /// Checks what a well-formed index guarantees: one file per rank, and pieces of every
    /// component that are in order, disjoint, cover it — or, for a param saved as a TP shard,
    /// exactly the block of it the saving TP rank holds — name a file of the index and carry a
    /// key for every state kind of the param's route.
    fn check_consistent(&self) -> std::result::Result<(), String> {
        if self.dp == 0 || self.files.len() != self.dp as usize {
            return Err(format!("{} files for dp {}", self.files.len(), self.dp));
        }
        for (rank, file) in self.files.iter().enumerate() {
            if file.rank as usize != rank || file.name != rank_file_name(rank) {
                return Err(format!("file {rank} is '{}' of rank {}", file.name, file.rank));
            }
        }
        let names: HashMap<&str, ()> = self.files.iter().map(|f| (f.name.as_str(), ())).collect();
        for param in &self.params {
            let held = match (param.tp_split, self.tp) {
                (None, _) => vec![Some(None); param.components.len()],
                (Some(split), Some(tp)) => {
                    let spec = param.spec();
                    spec.validate().map_err(|e| e.message)?;
                    if !param.components_follow(&spec) {
                        return Err(format!(
                            "the components of param '{}' do not follow from its shape and splits",
                            param.name
                        ));
                    }
                    held_blocks(&spec, split, tp)?
                }
                (Some(_), None) => return Err(format!("param '{}': a TP shard without a TP group", param.name)),
            };
            let mut next_offset = 0;
            for (component, held) in param.components.iter().zip(held) {
                if component.offset != next_offset {
                    return Err(format!("component '{}' starts at {}", component.name, component.offset));
                }
                next_offset += component.shape.iter().product::<u64>();
                check_pieces(
                    StateKind::of(param.route, self.config.muon_variant),
                    component,
                    held.as_ref(),
                    &names,
                )?;
            }
            if next_offset != param.shape.iter().product::<u64>() {
                return Err(format!("param '{}': components cover {next_offset} items", param.name));
            }
        }
        Ok(())
    }

    /// Checks that this checkpoint can load into `specs` with `cfg`: the same params (by
    /// name) with the same shapes, routes, expert flags and splits, and the same numerics.
    pub fn check_matches(&self, specs: &[ParamSpec], cfg: &Config) -> Result<()> {
        let saved: HashMap<&str, &ParamEntry> = self.params.iter().map(|p| (p.name.as_str(), p)).collect();
        for spec in specs {
            let Some(entry) = saved.get(spec.name.as_str()) else {
                bail!(
                    CheckpointMismatch,
                    "param '{}' is not in the checkpoint (saved model {}, {} params)",
                    spec.name,
                    self.model_hash,
                    self.params.len()
                );
            };
            entry.check_matches(spec)?;
        }
        if saved.len() != specs.len() {
            let ours: std::collections::HashSet<&str> = specs.iter().map(|s| s.name.as_str()).collect();
            let extra: Vec<&str> = self
                .params
                .iter()
                .map(|p| p.name.as_str())
                .filter(|n| !ours.contains(n))
                .take(3)
                .collect();
            bail!(
                CheckpointMismatch,
                "the checkpoint has {} params, this optimizer registered {}; not registered here: {}",
                self.params.len(),
                specs.len(),
                extra.join(", ")
            );
        }
        self.check_config(cfg)
    }

    /// Checks that the checkpoint was saved with `cfg`'s numerics.
    pub fn check_config(&self, cfg: &Config) -> Result<()> {
        if self.config.muon_variant != cfg.muon_variant {
            bail!(
                CheckpointMismatch,
                "config field muon_variant: this optimizer has \"{}\" but the checkpoint was saved with \"{}\"; the variant decides which state the Muon matrices have, so it must be equal",
                cfg.muon_variant.name(),
                self.config.muon_variant.name()
            );
        }
        let (saved, ours) = (self.config.fields(), NumericsConfig::of(cfg).fields());
        for (field, value) in ours.clone() {
            if saved.get(&field) != Some(&value) {
                bail!(
                    CheckpointMismatch,
                    "config field {field}: this optimizer has {value} but the checkpoint was saved with {}; the field changes numerics, so it must be equal",
                    saved.get(&field).map_or("the default".to_string(), |v| v.to_string())
                );
            }
        }
        if let Some((field, value)) = saved.iter().find(|(field, _)| !ours.contains_key(*field)) {
            bail!(
                CheckpointMismatch,
                "config field {field}: the checkpoint was saved with {value} but this optimizer has the default; the field changes numerics, so it must be equal"
            );
        }
        Ok(())
    }

    /// Checks that a checkpoint saved by the ranks of a TP group of more than one rank loads
    /// into an optimizer at `tp` — also in such a group — with its `muon_tp_mode` (like the
    /// numerics of [`Index::check_config`]: the mode changes the update, and its default
    /// changed from blockwise to duplicated). At one TP rank the modes coincide, so a
    /// checkpoint of either side without a TP group loads in any mode.
    pub fn check_tp_mode(&self, cfg: &Config, tp: Option<TpRank>) -> Result<()> {
        if let (Some(saved), Some(ours)) = (self.muon_tp_mode, tp)
            && saved != cfg.muon_tp_mode
        {
            bail!(
                CheckpointMismatch,
                "config field muon_tp_mode: this optimizer has {} but the checkpoint was saved with {} by the ranks of a TP group of {} (this one has {}); the mode changes every Muon update of a TP shard, so it must be equal: set muon_tp_mode to {} to resume",
                cfg.muon_tp_mode.name(),
                saved.name(),
                self.tp.map_or(0, |t| t.size),
                ours.size,
                saved.name()
            );
        }
        Ok(())
    }

    /// The entry of param `name`.
    pub fn param(&self, name: &str) -> Option<&ParamEntry> {
        self.params.iter().find(|p| p.name == name)
    }
}

impl ParamEntry {
    /// Whether the components are those of `spec` (names, offsets, shapes).
    fn components_follow(&self, spec: &ParamSpec) -> bool {
        let ours = components(spec);
        ours.len() == self.components.len()
            && ours
                .iter()
                .zip(&self.components)
                .all(|(c, saved)| c.name == saved.name && c.range.start == saved.offset && c.shape == saved.shape)
    }

    /// The param as registered unsharded: what places its components.
    pub fn spec(&self) -> ParamSpec {
        let mut flags = 0;
        if self.expert_stack {
            flags |= ParamFlags::EXPERT_STACK;
        }
        if self.route == Route::Adamw {
            flags |= ParamFlags::NO_MUON;
        }
        ParamSpec {
            flags: ParamFlags(flags),
            split_sizes: self.split_sizes.clone(),
            split_groups: self.split_groups,
            ..ParamSpec::new(self.name.clone(), &self.shape, self.dtype)
        }
    }

    /// Checks that this saved param can load into `spec`: the same shape, route, expert flag
    /// and splits, with the components they imply.
    pub fn check_matches(&self, spec: &ParamSpec) -> Result<()> {
        let differs = |field: &str, saved: String, ours: String| {
            Error::new(
                ErrorKind::CheckpointMismatch,
                format!(
                    "param '{}': {field} is {ours} but the checkpoint has {saved}",
                    spec.name
                ),
            )
        };
        if self.shape != spec.shape {
            return Err(differs(
                "shape",
                format!("{:?}", self.shape),
                format!("{:?}", spec.shape),
            ));
        }
        if self.route != spec.route() {
            return Err(differs("route", self.route.name().into(), spec.route().name().into()));
        }
        if self.expert_stack != spec.is_expert_stack() {
            return Err(differs(
                "the EXPERT_STACK flag",
                self.expert_stack.to_string(),
                spec.is_expert_stack().to_string(),
            ));
        }
        if self.split_sizes != spec.split_sizes {
            return Err(differs(
                "split_sizes",
                format!("{:?}", self.split_sizes),
                format!("{:?}", spec.split_sizes),
            ));
        }
        if self.split_groups != spec.split_groups {
            return Err(differs(
                "split_groups",
                self.split_groups.to_string(),
                spec.split_groups.to_string(),
            ));
        }
        if !self.components_follow(spec) {
            bail!(
                CheckpointCorrupt,
                "index.json: the components of param '{}' do not follow from its shape and splits",
                spec.name
            );
        }
        Ok(())
    }
}

/// The pieces of `component` are in order, disjoint, carry a key per state kind of `kinds`,
/// name a file of `files` and cover exactly `held`: None = nothing, Some(None) = the whole
/// component, Some(Some(block)) = that block of it.
fn check_pieces(
    kinds: &[StateKind],
    component: &ComponentEntry,
    held: Option<&Option<Block>>,
    files: &HashMap<&str, ()>,
) -> std::result::Result<(), String> {
    let (block, items) = match held {
        None => (None, 0),
        Some(None) => (None, component.shape.iter().product()),
        Some(Some(block)) => (Some(block), block_items(block)),
    };
    let mut next = 0;
    for piece in &component.pieces {
        let keys_ok = piece.keys.len() == kinds.len() && kinds.iter().all(|k| piece.keys.contains_key(k));
        if piece.start != next
            || piece.end <= piece.start
            || piece.block.as_ref() != block
            || !files.contains_key(piece.file.as_str())
            || !keys_ok
        {
            return Err(format!(
                "component '{}': piece {}..{} of block {} in '{}' does not continue at {next} of block {} with a key per state",
                component.name,
                piece.start,
                piece.end,
                described(piece.block.as_deref()),
                piece.file,
                described(block.map(Vec::as_slice))
            ));
        }
        next = piece.end;
    }
    if next != items {
        return Err(format!(
            "component '{}': pieces cover {next} of {items} items",
            component.name
        ));
    }
    Ok(())
}

/// A block for messages: `[lo:hi,…]`, or `(whole)`.
fn described(block: Option<&[[u64; 2]]>) -> String {
    block.map_or("(whole)".to_string(), |b| block_text(Some(b)))
}

/// The envelope's format fields, read before the rest: `format_version` as any JSON value, so
/// a value that is no version is named as such.
#[derive(Deserialize)]
struct Probe {
    format: String,
    format_version: Option<Value>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    format: String,
    format_version: u32,
    #[serde(with = "hex_u32")]
    crc32: u32,
    index: Box<RawValue>,
}

/// A CRC-32 as 8 lower-case hex digits.
pub(crate) mod hex_u32 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &u32, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format!("{value:08x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text.len() != 8 || !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(serde::de::Error::custom(format!(
                "checksum '{text}' is not 8 lower-case hex digits"
            )));
        }
        u32::from_str_radix(&text, 16).map_err(serde::de::Error::custom)
    }
}

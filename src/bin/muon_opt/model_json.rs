//! The JSON parameter list: describes any model to `muon-opt plan --model FILE`.
//!
//! ```json
//! {
//!   "vocab_size": 50257,
//!   "params": [
//!     {"name": "embedding.word_embeddings.weight", "shape": [50257, 768],
//!      "flags": ["embedding_or_output"], "tie_group": 1},
//!     {"name": "layers.0.self_attention.qkv.weight", "shape": [2304, 768],
//!      "split_sizes": [768, 768, 768]},
//!     {"name": "layers.0.mlp.experts.fc1.weight", "shape": [64, 512, 768],
//!      "dtype": "f32", "flags": ["expert_stack"]}
//!   ]
//! }
//! ```
//!
//! Params are listed in registration (forward) order. Fields:
//! - `name` (required, unique), `shape` (required, 1 to 4 dims);
//! - `dtype`: `"bf16"` (default) or `"f32"`;
//! - `flags`: any of `embedding_or_output`, `no_muon`, `expert_stack`, `mxfp8`,
//!   `no_weight_decay`, `allow_vocab_dim`, `weight_decay` (default none);
//! - `tie_group`: copies of one logical weight share a non-zero group (default 0);
//! - `split_sizes`: fused components along the matrix row dimension (default none);
//! - `split_groups`: how many times `split_sizes` repeats along the rows (Megatron's QKV per
//!   query group; default 1);
//! - `lr_scale`, `wd_scale`: per-param multipliers (default 1).
//!
//! The optional top-level `vocab_size` enables the untagged-embedding check. Unknown fields
//! are errors. Every param goes through [`muon_opt::model::Registry::add`], so the routing rules
//! apply exactly as for a registering framework.

use serde::Deserialize;

use muon_opt::bail;
use muon_opt::config::Dtype;
use muon_opt::error::Result;
use muon_opt::model::{ParamFlags, ParamSpec};
use muon_opt::plan::presets::ModelDesc;

/// JSON flag names and their bits.
pub const FLAG_NAMES: &[(&str, u32)] = &[
    ("embedding_or_output", ParamFlags::EMBEDDING_OR_OUTPUT),
    ("no_muon", ParamFlags::NO_MUON),
    ("expert_stack", ParamFlags::EXPERT_STACK),
    ("mxfp8", ParamFlags::MXFP8),
    ("no_weight_decay", ParamFlags::NO_WEIGHT_DECAY),
    ("allow_vocab_dim", ParamFlags::ALLOW_VOCAB_DIM),
    ("weight_decay", ParamFlags::WEIGHT_DECAY),
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelFile {
    #[serde(default)]
    vocab_size: u64,
    params: Vec<ParamEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ParamEntry {
    name: String,
    shape: Vec<u64>,
    #[serde(default)]
    dtype: Option<String>,
    #[serde(default)]
    flags: Vec<String>,
    #[serde(default)]
    tie_group: u32,
    #[serde(default)]
    split_sizes: Vec<u64>,
    #[serde(default)]
    split_groups: Option<u64>,
    #[serde(default)]
    lr_scale: Option<f32>,
    #[serde(default)]
    wd_scale: Option<f32>,
}

impl ParamEntry {
    fn into_spec(self) -> Result<ParamSpec> {
        let dtype = match &self.dtype {
            Some(text) => Dtype::from_name(&format!("param '{}': dtype", self.name), text)?,
            None => Dtype::Bf16,
        };
        let mut flags = 0;
        for flag in &self.flags {
            match FLAG_NAMES.iter().find(|(name, _)| name == flag) {
                Some(&(_, bit)) => flags |= bit,
                None => {
                    let valid: Vec<&str> = FLAG_NAMES.iter().map(|(name, _)| *name).collect();
                    bail!(
                        InvalidArgument,
                        "param '{}': unknown flag '{flag}'; valid flags are {}",
                        self.name,
                        valid.join(", ")
                    );
                }
            }
        }
        let mut spec = ParamSpec::new(self.name, &self.shape, dtype);
        spec.flags = ParamFlags(flags);
        spec.tie_group = self.tie_group;
        spec.split_sizes = self.split_sizes;
        spec.split_groups = self.split_groups.unwrap_or(1);
        spec.lr_scale = self.lr_scale.unwrap_or(1.0);
        spec.wd_scale = self.wd_scale.unwrap_or(1.0);
        Ok(spec)
    }
}

/// Parses a JSON parameter list (format in the module docs) into a model called `name`.
/// Params are validated later, when registered.
pub fn parse_model_json(name: &str, text: &str) -> Result<ModelDesc> {
    let file: ModelFile = match serde_json::from_str(text) {
        Ok(file) => file,
        Err(e) => bail!(InvalidArgument, "model '{name}': not a valid parameter list: {e}"),
    };
    if file.params.is_empty() {
        bail!(InvalidArgument, "model '{name}': \"params\" is empty");
    }
    let params = file
        .params
        .into_iter()
        .map(ParamEntry::into_spec)
        .collect::<Result<Vec<_>>>()?;
    Ok(ModelDesc {
        name: name.to_string(),
        vocab_size: file.vocab_size,
        params,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use muon_opt::config::Config;
    use muon_opt::error::ErrorKind;
    use muon_opt::model::Route;

    #[test]
    fn parses_the_documented_example_and_routes_it() {
        let text = r#"{"vocab_size": 50257, "params": [
            {"name": "embedding.word_embeddings.weight", "shape": [50257, 768],
             "flags": ["embedding_or_output"], "tie_group": 1},
            {"name": "layers.0.self_attention.qkv.weight", "shape": [2304, 768],
             "split_sizes": [768, 768, 768]},
            {"name": "layers.0.mlp.experts.fc1.weight", "shape": [64, 512, 768],
             "dtype": "f32", "flags": ["expert_stack"], "lr_scale": 0.5}]}"#;
        let model = parse_model_json("example", text).unwrap();
        assert_eq!(model.vocab_size, 50257);
        let cfg = Config {
            vocab_size: model.vocab_size,
            ..Config::default()
        };
        let registry = model.registry(&cfg).unwrap();
        assert_eq!(registry.routes(), &[Route::Adamw, Route::Muon, Route::Muon]);
        let experts = &registry.params()[2];
        assert_eq!(
            (experts.dtype, experts.num_units(), experts.lr_scale),
            (Dtype::F32, 64, 0.5)
        );
        assert_eq!(registry.params()[1].split_sizes, vec![768, 768, 768]);
        assert_eq!(registry.params()[0].tie_group, 1);
    }

    #[test]
    fn errors_name_the_param_and_the_rule() {
        let cases = [
            (
                r#"{"params": [{"name": "w", "shape": [4, 4], "flags": ["muon"]}]}"#,
                "unknown flag 'muon'",
            ),
            (
                r#"{"params": [{"name": "w", "shape": [4, 4], "dtype": "fp8"}]}"#,
                "param 'w': dtype",
            ),
            (
                r#"{"params": [{"name": "w", "shape": [4], "bias": true}]}"#,
                "unknown field `bias`",
            ),
            (r#"{"params": []}"#, "\"params\" is empty"),
            ("[1, 2]", "not a valid parameter list"),
        ];
        for (text, needle) in cases {
            let err = parse_model_json("m", text).unwrap_err();
            assert!(err.message.contains(needle), "{} lacks {needle}", err.message);
            assert!(matches!(
                err.kind,
                ErrorKind::InvalidArgument | ErrorKind::InvalidEnumValue
            ));
        }
    }
}

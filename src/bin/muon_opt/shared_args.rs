//! The arguments `plan` and `simulate` share: `--model` (a preset or a JSON parameter list),
//! `--layout`, `--ownership` and the param sharding.

use clap::{Args, ValueEnum};
use serde::Deserialize;

use muon_opt::config::{Config, DEFAULT_PARAM_PREFETCH_BUCKETS, MuonLayout, MuonOwnership, ParamSharding};
use muon_opt::plan::presets::{ModelDesc, PRESET_NAMES, preset};

use crate::model_json::parse_model_json;

#[derive(Clone, Copy, Debug, ValueEnum, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayoutChoice {
    Compact,
    Padded,
    Allreduce,
    #[value(name = "compact_rooted")]
    CompactRooted,
    All,
}

impl LayoutChoice {
    pub fn layouts(self) -> Vec<MuonLayout> {
        match self {
            LayoutChoice::Compact => vec![MuonLayout::Compact],
            LayoutChoice::Padded => vec![MuonLayout::Padded],
            LayoutChoice::Allreduce => vec![MuonLayout::Allreduce],
            LayoutChoice::CompactRooted => vec![MuonLayout::CompactRooted],
            LayoutChoice::All => MuonLayout::ALL.to_vec(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OwnershipChoice {
    Balanced,
    Contiguous,
    /// The library's `auto`: the planner chooses by the declared network (`plan`); `simulate`
    /// simulates balanced and contiguous and keeps the faster.
    Auto,
}

impl OwnershipChoice {
    /// The `muon_ownership` of a `layout` plan or run: `contiguous` where the layout takes it
    /// (padded keeps Megatron-LM's owners), `auto` as asked, else balanced.
    pub fn for_layout(self, layout: MuonLayout) -> MuonOwnership {
        match self {
            OwnershipChoice::Contiguous if layout.takes_contiguous_ownership() => MuonOwnership::Contiguous,
            OwnershipChoice::Auto => MuonOwnership::Auto,
            _ => MuonOwnership::Balanced,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardingChoice {
    Replicated,
    Sharded,
}

/// `param_sharding`, `reshard_after_forward` and `param_prefetch_buckets` as muon_config_t
/// sets them (in a scenario file, the object under `sharding`).
#[derive(Args, Clone, Copy, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShardingArgs {
    /// Every rank holds every param (`replicated`, the library's default) or keeps only what it
    /// owns and gathers buckets around their use (`sharded`, ZeRO-3 style).
    #[arg(long, value_enum, default_value_t = ShardingChoice::Replicated)]
    param_sharding: ShardingChoice,
    /// Sharded: gather each bucket again for its backward (true, FSDP2's default) or keep it
    /// gathered from its forward (false).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    reshard_after_forward: bool,
    /// Sharded: buckets gathered ahead of the one in use (param_prefetch_buckets).
    #[arg(long, default_value_t = DEFAULT_PARAM_PREFETCH_BUCKETS)]
    prefetch: u32,
}

impl Default for ShardingArgs {
    /// The command line's defaults (the library's).
    fn default() -> Self {
        ShardingArgs {
            param_sharding: ShardingChoice::Replicated,
            reshard_after_forward: true,
            prefetch: DEFAULT_PARAM_PREFETCH_BUCKETS,
        }
    }
}

impl ShardingArgs {
    /// `cfg` with these sharding fields.
    pub fn apply(&self, cfg: Config) -> Config {
        Config {
            param_sharding: match self.param_sharding {
                ShardingChoice::Replicated => ParamSharding::Replicated,
                ShardingChoice::Sharded => ParamSharding::Sharded,
            },
            reshard_after_forward: self.reshard_after_forward,
            param_prefetch_buckets: self.prefetch,
            ..cfg
        }
    }
}

/// A preset by name, else a JSON parameter-list file; with every expert stack registered as
/// separate matrices when `experts_as_params`.
pub fn load_model(arg: &str, experts_as_params: bool) -> Result<ModelDesc, String> {
    let model = match preset(arg) {
        Some(model) => model,
        None => {
            let text = std::fs::read_to_string(arg).map_err(|e| {
                format!(
                    "--model '{arg}': not a preset ({}) and not a readable file: {e}",
                    PRESET_NAMES.join(", ")
                )
            })?;
            parse_model_json(arg, &text).map_err(|e| e.to_string())?
        }
    };
    Ok(if experts_as_params {
        model.with_experts_as_params()
    } else {
        model
    })
}

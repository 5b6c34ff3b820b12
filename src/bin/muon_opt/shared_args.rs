//! The arguments `plan` and `simulate` share: `--model` (a preset or a JSON parameter list),
//! `--layout` and `--ownership`.

use clap::ValueEnum;

use muon_opt::config::{MuonLayout, MuonOwnership};
use muon_opt::plan::presets::{ModelDesc, PRESET_NAMES, preset};

use crate::model_json::parse_model_json;

#[derive(Clone, Copy, ValueEnum)]
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

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
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

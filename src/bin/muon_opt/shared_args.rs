//! The arguments `plan` and `simulate` share: `--model` (a preset or a JSON parameter list)
//! and `--layout`.

use clap::ValueEnum;

use muon_opt::config::MuonLayout;
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

//! `muon-opt plan`: the plans of a model in one or every layout, side by side.

use std::path::PathBuf;

use clap::Args;

use muon_opt::config::Config;
use muon_opt::plan::build_plans;
use muon_opt::sim::device::device_bytes;
use muon_opt::sim::metrics::DeviceBytes;

use crate::render;
use crate::shared_args::{LayoutChoice, OwnershipChoice, load_model};

#[derive(Args)]
pub struct PlanArgs {
    /// A preset (gpt2-124m, llama3-8b, llama3-70b, deepseek-v3-like) or a JSON parameter-list file.
    #[arg(long)]
    model: String,
    /// Data-parallel size.
    #[arg(long)]
    dp: usize,
    /// Muon layout to plan; `all` shows every layout side by side.
    #[arg(long, value_enum, default_value_t = LayoutChoice::All)]
    layout: LayoutChoice,
    /// How the rooted layouts give Muon matrices owners (muon_ownership); padded keeps
    /// Megatron-LM's.
    #[arg(long, value_enum, default_value_t = OwnershipChoice::Balanced)]
    ownership: OwnershipChoice,
    /// Elements per bucket [default: max(40M, 1M·dp)].
    #[arg(long)]
    bucket_size: Option<u64>,
    /// Print the reports as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also print every bucket of each plan: route, elements, padding, split, params and owners.
    #[arg(long)]
    buckets: bool,
    /// Include the wall-clock planning time (left out by default: the rest is deterministic).
    #[arg(long)]
    timing: bool,
    /// Also write a per-rank bar chart of Newton–Schulz cost and optimizer state to FILE.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Register every expert stack as separate matrices, one per expert, as Megatron-LM sees a
    /// MoE layer (its padded layout then matches Megatron's for MoE models).
    #[arg(long)]
    experts_as_params: bool,
}

pub fn run(args: &PlanArgs) -> Result<(), String> {
    let model = load_model(&args.model, args.experts_as_params)?;
    let cfg = Config {
        bucket_size: args.bucket_size.unwrap_or(0),
        vocab_size: model.vocab_size,
        ..Config::default()
    };
    if args.ownership == OwnershipChoice::Auto {
        return Err(
            "--ownership auto: only simulate can choose (it needs a cluster model); plan takes balanced or contiguous"
                .to_string(),
        );
    }
    let mut plans = Vec::new();
    for layout in args.layout.layouts() {
        let cfg = Config {
            muon_ownership: args.ownership.for_layout(layout),
            ..cfg.clone()
        };
        plans.extend(build_plans(&model, &cfg, args.dp, &[layout]).map_err(|e| e.to_string())?);
    }
    let registry = model.registry(&cfg).map_err(|e| e.to_string())?;
    let devices = plans
        .iter()
        .map(|plan| {
            let cfg = Config {
                muon_layout: plan.layout,
                muon_ownership: args.ownership.for_layout(plan.layout),
                ..cfg.clone()
            };
            device_bytes(plan, registry.params(), &cfg).map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<DeviceBytes>, String>>()?;
    if let Some(path) = &args.svg {
        std::fs::write(path, render::svg(&model.name, &plans))
            .map_err(|e| format!("--svg '{}': cannot write: {e}", path.display()))?;
    }
    let names: Vec<String> = model.params.iter().map(|p| p.name.clone()).collect();
    if args.json {
        let mut summary: serde_json::Value =
            serde_json::from_str(&render::json_summary(&model.name, &plans, args.timing)).map_err(|e| e.to_string())?;
        for (entry, device) in summary["plans"].as_array_mut().into_iter().flatten().zip(&devices) {
            entry["device_bytes"] = serde_json::to_value(device).map_err(|e| e.to_string())?;
        }
        if args.buckets {
            for (entry, plan) in summary["plans"].as_array_mut().into_iter().flatten().zip(&plans) {
                let full: serde_json::Value = serde_json::from_str(&plan.to_json(&names)).map_err(|e| e.to_string())?;
                entry["buckets"] = full["buckets"].clone();
                entry["params"] = full["params"].clone();
            }
        }
        println!("{}", serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())?);
        return Ok(());
    }
    print!("{}", render::table(&model.name, &plans, args.timing));
    let totals: Vec<u64> = devices.iter().map(|d| d.total).collect();
    print!("{}", render::bytes_row("device bytes / rank (cuda), max", &totals));
    for (k, (kind, _)) in DeviceBytes::default().parts().into_iter().enumerate() {
        let values: Vec<u64> = devices.iter().map(|d| d.parts()[k].1).collect();
        print!("{}", render::bytes_row(&format!("  {kind}"), &values));
    }
    println!();
    if args.buckets {
        for plan in &plans {
            println!("{} layout, {} buckets", plan.layout.name(), plan.buckets.len());
            print!("{}", render::bucket_table(plan, &names));
        }
    }
    Ok(())
}

//! `muon-opt plan`: the plans of a model in one or every layout, side by side.

use std::path::PathBuf;

use clap::Args;

use muon_opt::config::{Config, Network, ParamSharding};
use muon_opt::plan::build_plans;
use muon_opt::sim::cost::CostModel;
use muon_opt::sim::device::rank_device_bytes;
use muon_opt::sim::metrics::DeviceBytes;

use crate::render;
use crate::shared_args::{LayoutChoice, OwnershipChoice, ShardingArgs, load_model};
use crate::simulate::load_hardware;

#[derive(Args)]
pub struct PlanArgs {
    /// A preset (gpt2-124m, llama3-8b, llama3-70b, deepseek-v3-like, kimi-k2, qwen3-30b-a3b)
    /// or a JSON parameter-list file.
    #[arg(long)]
    model: String,
    /// Data-parallel size.
    #[arg(long)]
    dp: usize,
    /// Muon layout to plan; `all` shows every layout side by side.
    #[arg(long, value_enum, default_value_t = LayoutChoice::All)]
    layout: LayoutChoice,
    /// How the rooted layouts give Muon matrices owners (muon_ownership; `auto`, the library's
    /// default: the planner chooses by the declared network, balanced without one); padded
    /// keeps Megatron-LM's.
    #[arg(long, value_enum, default_value_t = OwnershipChoice::Auto)]
    ownership: OwnershipChoice,
    /// The ring the data-parallel collectives run on, as muon_config_t.network declares it:
    /// per-hop latency (µs) and bus bandwidth (GB/s), e.g. `14,45`; without it (or
    /// --hardware) nothing is declared and the fewest bytes win.
    #[arg(
        long,
        value_name = "LATENCY_US,BANDWIDTH_GBPS",
        conflicts_with = "hardware",
        allow_hyphen_values = true
    )]
    network: Option<String>,
    /// Declare a simulator profile's data-parallel ring at this dp (h100-nvlink, h100-ib,
    /// h200-nvlink, b200-nvlink, a100-nvlink, gb200-nvl72, gb300-nvl72, or a profile JSON
    /// file), the figures `simulate` plans with.
    #[arg(long, value_name = "PROFILE")]
    hardware: Option<String>,
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
    #[command(flatten)]
    sharding: ShardingArgs,
}

/// `--network LATENCY_US,BANDWIDTH_GBPS`, checked as muon_config_t.network is.
pub fn parse_network(text: &str) -> Result<Network, String> {
    let figures: Vec<&str> = text.split(',').map(str::trim).collect();
    let [latency, bandwidth] = figures[..] else {
        return Err(format!(
            "--network '{text}': expected LATENCY_US,BANDWIDTH_GBPS (two numbers, e.g. 14,45)"
        ));
    };
    let number = |figure: &str, what: &str| {
        figure
            .parse::<f64>()
            .map_err(|e| format!("--network '{text}': {what} '{figure}' is not a number: {e}"))
    };
    let network = Network {
        hop_latency_us: number(latency, "the latency")?,
        bus_bandwidth_gbps: number(bandwidth, "the bandwidth")?,
    };
    network
        .validate("network")
        .map_err(|e| format!("--network '{text}': {e}"))?;
    Ok(network)
}

/// A plan's device bytes: the rank needing the most as the cuda backend allocates replicated
/// params, and the most any rank needs with sharded params (its owned storage and gather
/// window, `src/schedule/window.rs`).
struct PlanDeviceBytes {
    replicated: DeviceBytes,
    sharded: u64,
}

fn plan_device_bytes(
    plan: &muon_opt::plan::Plan,
    params: &[muon_opt::model::ParamSpec],
    cfg: &Config,
) -> muon_opt::error::Result<PlanDeviceBytes> {
    let mut replicated = DeviceBytes::default();
    let mut sharded = 0;
    let sharded_cfg = Config {
        param_sharding: ParamSharding::Sharded,
        ..cfg.clone()
    };
    for rank in 0..plan.dp as usize {
        let device = rank_device_bytes(plan, params, &cfg.replicated(), rank)?;
        sharded = sharded.max(rank_device_bytes(plan, params, &sharded_cfg, rank)?.total);
        if device.total > replicated.total {
            replicated = device;
        }
    }
    Ok(PlanDeviceBytes { replicated, sharded })
}

pub fn run(args: &PlanArgs) -> Result<(), String> {
    let model = load_model(&args.model, args.experts_as_params)?;
    let network = match (&args.network, &args.hardware) {
        (Some(text), _) => Some(parse_network(text)?),
        (None, Some(profile)) => Some(CostModel::new(load_hardware(profile)?, args.dp).network()),
        (None, None) => None,
    };
    let cfg = args.sharding.apply(Config {
        bucket_size: args.bucket_size.unwrap_or(0),
        vocab_size: model.vocab_size,
        network,
        ..Config::default()
    });
    cfg.validate().map_err(|e| e.to_string())?;
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
            plan_device_bytes(plan, registry.params(), &cfg).map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<PlanDeviceBytes>, String>>()?;
    if let Some(path) = &args.svg {
        std::fs::write(path, render::svg(&model.name, &plans))
            .map_err(|e| format!("--svg '{}': cannot write: {e}", path.display()))?;
    }
    let names: Vec<String> = model.params.iter().map(|p| p.name.clone()).collect();
    if args.json {
        let mut summary: serde_json::Value =
            serde_json::from_str(&render::json_summary(&model.name, &plans, args.timing)).map_err(|e| e.to_string())?;
        for (entry, device) in summary["plans"].as_array_mut().into_iter().flatten().zip(&devices) {
            entry["device_bytes"] = serde_json::to_value(device.replicated).map_err(|e| e.to_string())?;
            entry["sharded_device_bytes"] = serde_json::to_value(device.sharded).map_err(|e| e.to_string())?;
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
    let totals: Vec<u64> = devices.iter().map(|d| d.replicated.total).collect();
    print!("{}", render::bytes_row("device bytes / rank (cuda), max", &totals));
    for (k, (kind, _)) in DeviceBytes::default().parts().into_iter().enumerate() {
        let values: Vec<u64> = devices.iter().map(|d| d.replicated.parts()[k].1).collect();
        print!("{}", render::bytes_row(&format!("  {kind}"), &values));
    }
    let sharded: Vec<u64> = devices.iter().map(|d| d.sharded).collect();
    print!("{}", render::bytes_row("device bytes / rank, sharded, max", &sharded));
    println!();
    for plan in &plans {
        print!("{}", render::choice_table(plan));
    }
    if args.buckets {
        for plan in &plans {
            println!("{} layout, {} buckets", plan.layout.name(), plan.buckets.len());
            print!("{}", render::bucket_table(plan, &names));
        }
    }
    Ok(())
}

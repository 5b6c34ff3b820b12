//! `muon-opt`: command-line tools of libmuon_opt. Each subcommand is a thin shell over the
//! library; errors print one line and exit with code 2.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

use muon_opt::checkpoint::export::export;
use muon_opt::checkpoint::inspect::inspect;
use muon_opt::config::{Config, MuonLayout, NsPrecision, TpMode};
use muon_opt::demo::{self, DemoConfig};
use muon_opt::plan::model_json::parse_model_json;
use muon_opt::plan::presets::{ModelDesc, PRESET_NAMES, preset};
use muon_opt::plan::{build_plans, render};
use muon_opt::sim::device::device_bytes;
use muon_opt::sim::metrics::DeviceBytes;
use muon_opt::sim::profile::{HARDWARE_NAMES, Hardware};
use muon_opt::sim::{self, Scenario};

#[derive(Parser)]
#[command(
    name = "muon-opt",
    version,
    about = "Tools for the Muon optimizer runtime libmuon_opt"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Plan buckets and ownership for a model and print the report.
    Plan(PlanArgs),
    /// Train a small MLP on 4 host ranks with Muon and with AdamW only, and compare.
    Demo(DemoArgs),
    /// Summarize a checkpoint directory and verify the checksum of every file.
    Inspect(InspectArgs),
    /// Merge a checkpoint into one safetensors file of every param's full fp32 master weight.
    Export(ExportArgs),
    /// Simulate training iterations of the real schedule on a modelled GPU cluster.
    Simulate(SimulateArgs),
}

#[derive(Args)]
struct SimulateArgs {
    /// A preset (gpt2-124m, llama3-8b, llama3-70b, deepseek-v3-like) or a JSON parameter-list file.
    #[arg(long)]
    model: String,
    /// Data-parallel size.
    #[arg(long)]
    dp: usize,
    /// Muon layout; `all` simulates every layout side by side.
    #[arg(long, value_enum, default_value_t = LayoutChoice::Compact)]
    layout: LayoutChoice,
    /// Store the Muon matrices as MXFP8 and gather them as bf16.
    #[arg(long)]
    mxfp8: bool,
    /// Newton–Schulz precision.
    #[arg(long, value_enum, default_value_t = PrecisionChoice::Bf16)]
    ns_precision: PrecisionChoice,
    /// A built-in profile (h100-nvlink, h100-ib, b200-nvlink) or a hardware JSON file.
    #[arg(long, default_value = "h100-nvlink")]
    hardware: String,
    /// Tokens per GPU per iteration (forward and backward cost).
    #[arg(long, default_value_t = 8192)]
    tokens_per_gpu: u64,
    /// Iterations to simulate (>= 2; the figures are the last one's).
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// Gather the gradient norm over a norm group of N ranks (tensor × pipeline × data
    /// parallel, muon_optimizer_set_norm_group) instead of the data-parallel group.
    #[arg(long, value_name = "N")]
    norm_group: Option<usize>,
    /// Tensor parallelism of size N: each rank holds TP rank 0's shards of the column-parallel
    /// (qkv, fc1) and row-parallel (proj, fc2) matrices; their collectives run over NVLink.
    #[arg(long, value_name = "N")]
    tp: Option<usize>,
    /// How TP-sharded Muon matrices are orthogonalized (muon_tp_mode).
    #[arg(long, value_enum, default_value_t = TpModeChoice::Blockwise)]
    tp_mode: TpModeChoice,
    /// Register every expert stack as separate matrices, one per expert, as Megatron-LM sees a
    /// MoE layer.
    #[arg(long)]
    experts_as_params: bool,
    /// Print the figures as JSON.
    #[arg(long)]
    json: bool,
    /// Write a Chrome/Perfetto trace of the first layout to FILE.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Write an SVG timeline of the first layout to FILE.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
}

#[derive(Clone, Copy, ValueEnum)]
enum TpModeChoice {
    Blockwise,
    Duplicated,
    Distributed,
}

#[derive(Clone, Copy, ValueEnum)]
enum PrecisionChoice {
    Bf16,
    F32,
    #[value(name = "bf16_iterate")]
    Bf16Iterate,
}

#[derive(Args)]
struct InspectArgs {
    /// The checkpoint directory (as passed to muon_optimizer_save).
    dir: PathBuf,
    /// Print the summary as JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Also list every param with its components (shape, route, and the rank files and item
    /// ranges holding each component).
    #[arg(long)]
    params: bool,
}

#[derive(Args)]
struct ExportArgs {
    /// The checkpoint directory (as passed to muon_optimizer_save).
    dir: PathBuf,
    /// The safetensors file to write (replaced only once complete).
    out: PathBuf,
}

#[derive(Args)]
struct DemoArgs {
    /// Training steps per run.
    #[arg(long, default_value_t = 60)]
    steps: usize,
    /// Data-parallel ranks (threads).
    #[arg(long, default_value_t = 4)]
    dp: usize,
    /// Print the result (losses, curves, plans, timings) as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct PlanArgs {
    /// A preset (gpt2-124m, llama3-8b, llama3-70b, deepseek-v3-like) or a JSON parameter-list file.
    #[arg(long)]
    model: String,
    /// Data-parallel size.
    #[arg(long)]
    dp: usize,
    /// Muon layout to plan; `all` shows every layout side by side.
    #[arg(long, value_enum, default_value_t = LayoutChoice::All)]
    layout: LayoutChoice,
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

#[derive(Clone, Copy, ValueEnum)]
enum LayoutChoice {
    Compact,
    Padded,
    Allreduce,
    #[value(name = "compact_rooted")]
    CompactRooted,
    All,
}

impl LayoutChoice {
    fn layouts(self) -> Vec<MuonLayout> {
        match self {
            LayoutChoice::Compact => vec![MuonLayout::Compact],
            LayoutChoice::Padded => vec![MuonLayout::Padded],
            LayoutChoice::Allreduce => vec![MuonLayout::Allreduce],
            LayoutChoice::CompactRooted => vec![MuonLayout::CompactRooted],
            LayoutChoice::All => MuonLayout::ALL.to_vec(),
        }
    }
}

fn main() -> ExitCode {
    // Like every Unix filter: a closed pipe (`muon-opt plan … | head`) ends the process
    // quietly instead of failing the next write. Rust starts programs with SIGPIPE ignored.
    // SAFETY: restores the default disposition before any thread or output exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let result = match Cli::parse().command {
        Command::Plan(args) => run_plan(&args),
        Command::Demo(args) => run_demo(&args),
        Command::Inspect(args) => run_inspect(&args),
        Command::Export(args) => run_export(&args),
        Command::Simulate(args) => run_simulate(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("muon-opt: {message}");
            ExitCode::from(2)
        }
    }
}

/// A preset by name, else a JSON parameter-list file.
fn load_model(arg: &str) -> Result<ModelDesc, String> {
    if let Some(model) = preset(arg) {
        return Ok(model);
    }
    let text = std::fs::read_to_string(arg).map_err(|e| {
        format!(
            "--model '{arg}': not a preset ({}) and not a readable file: {e}",
            PRESET_NAMES.join(", ")
        )
    })?;
    parse_model_json(arg, &text).map_err(|e| e.to_string())
}

fn run_plan(args: &PlanArgs) -> Result<(), String> {
    let model = load_model(&args.model)?;
    let model = if args.experts_as_params {
        model.with_experts_as_params()
    } else {
        model
    };
    let cfg = Config {
        bucket_size: args.bucket_size.unwrap_or(0),
        vocab_size: model.vocab_size,
        ..Config::default()
    };
    let plans = build_plans(&model, &cfg, args.dp, &args.layout.layouts()).map_err(|e| e.to_string())?;
    let registry = model.registry(&cfg).map_err(|e| e.to_string())?;
    let devices = plans
        .iter()
        .map(|plan| {
            let cfg = Config {
                muon_layout: plan.layout,
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

fn run_demo(args: &DemoArgs) -> Result<(), String> {
    let cfg = DemoConfig {
        steps: args.steps,
        dp: args.dp,
        ..DemoConfig::default()
    };
    let live = std::io::stderr().is_terminal();
    let progress = |p: &demo::Progress| {
        let last = p.step == p.steps;
        if live || last {
            let mut err = std::io::stderr().lock();
            let _ = write!(
                err,
                "\r{}{}",
                demo::report::progress_line(p),
                if last { "\n" } else { "" }
            );
            let _ = err.flush();
        }
    };
    let result = demo::run_demo(&cfg, &progress).map_err(|e| e.to_string())?;
    let text = if args.json {
        demo::report::json(&result)
    } else {
        demo::report::text(&result)
    };
    println!("{text}");
    Ok(())
}

/// A built-in hardware profile by name, else a profile JSON file.
fn load_hardware(arg: &str) -> Result<Hardware, String> {
    if let Some(hw) = sim::profile::builtin(arg) {
        return Ok(hw);
    }
    let text = std::fs::read_to_string(arg).map_err(|e| {
        format!(
            "--hardware '{arg}': not a built-in profile ({}) and not a readable file: {e}",
            HARDWARE_NAMES.join(", ")
        )
    })?;
    Hardware::from_json(&text).map_err(|e| format!("--hardware '{arg}': {e}"))
}

fn run_simulate(args: &SimulateArgs) -> Result<(), String> {
    let model = load_model(&args.model)?;
    let model = if args.experts_as_params {
        model.with_experts_as_params()
    } else {
        model
    };
    let hardware = load_hardware(&args.hardware)?;
    let mut sims = Vec::new();
    for layout in args.layout.layouts() {
        let scenario = Scenario {
            layout,
            mxfp8: args.mxfp8,
            ns_precision: match args.ns_precision {
                PrecisionChoice::Bf16 => NsPrecision::Bf16,
                PrecisionChoice::F32 => NsPrecision::F32,
                PrecisionChoice::Bf16Iterate => NsPrecision::Bf16Iterate,
            },
            tokens_per_gpu: args.tokens_per_gpu,
            iterations: args.steps,
            norm_group: args.norm_group,
            tp: args.tp.map(|ranks| {
                let mode = match args.tp_mode {
                    TpModeChoice::Blockwise => TpMode::Blockwise,
                    TpModeChoice::Duplicated => TpMode::Duplicated,
                    TpModeChoice::Distributed => TpMode::Distributed,
                };
                (ranks, mode)
            }),
            ..Scenario::new(model.clone(), args.dp, hardware.clone())
        };
        sims.push(sim::simulate(&scenario).map_err(|e| e.to_string())?);
    }
    let first = &sims[0];
    let ranks = sim::trace::ranks_to_show(&first.timelines);
    if let Some(path) = &args.trace {
        std::fs::write(path, sim::trace::chrome(&first.timelines, &ranks))
            .map_err(|e| format!("--trace '{}': cannot write: {e}", path.display()))?;
    }
    if let Some(path) = &args.svg {
        let title = format!("{} dp={} {} on {}", first.model, first.dp, first.layout, first.hardware);
        std::fs::write(path, sim::trace::svg(&first.timelines, &ranks, &title))
            .map_err(|e| format!("--svg '{}': cannot write: {e}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&sims).map_err(|e| e.to_string())?);
    } else {
        print!("{}", sim::table(&sims));
    }
    Ok(())
}

fn run_inspect(args: &InspectArgs) -> Result<(), String> {
    let summary = inspect(&args.dir).map_err(|e| format!("inspect '{}': {e}", args.dir.display()))?;
    if args.json {
        let mut json = serde_json::to_value(&summary).map_err(|e| e.to_string())?;
        if args.params {
            json["param_components"] = serde_json::to_value(&summary.param_entries).map_err(|e| e.to_string())?;
        }
        println!("{}", serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?);
    } else {
        println!("{}", summary.text());
        if args.params {
            print!("{}", summary.params_text());
        }
    }
    let failed = summary.files.iter().filter(|f| f.problem.is_some()).count();
    if failed > 0 {
        return Err(format!(
            "{failed} of {} files of '{}' failed verification",
            summary.files.len(),
            args.dir.display()
        ));
    }
    Ok(())
}

fn run_export(args: &ExportArgs) -> Result<(), String> {
    let done = export(&args.dir, &args.out).map_err(|e| format!("export '{}': {e}", args.dir.display()))?;
    println!(
        "wrote {} params (fp32 master weights at step {}), {} bytes, to {}",
        done.params,
        done.step,
        done.bytes,
        done.path.display()
    );
    Ok(())
}

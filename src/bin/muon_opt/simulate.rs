//! `muon-opt simulate`: training iterations of the real schedule on a modelled GPU cluster,
//! in one or every layout.

pub mod job;
mod performance;
mod scenario_file;
mod table;
mod trace;
mod validation;

use std::path::PathBuf;

use clap::Args;

use muon_opt::sim::profile::{HARDWARE_NAMES, Hardware, builtin};

use crate::shared_args::OwnershipChoice;

use job::JobArgs;

#[derive(Args)]
pub struct SimulateArgs {
    #[command(flatten)]
    job: JobArgs,
    /// Instead of --model/--dp: a named job people run (`all`: every one, MXFP8 off and on,
    /// each against its AdamW baseline), as a table (`--markdown`: docs/performance.md); or a
    /// scenario file, a JSON list of jobs with the command line's options as keys
    /// (docs/simulate.md, "Scenario files").
    #[arg(long, value_name = "NAME|FILE", conflicts_with_all = ["model", "dp", "device_run"])]
    scenario: Option<String>,
    /// With --scenario: print docs/performance.md.
    #[arg(long, requires = "scenario")]
    markdown: bool,
    /// Print docs/validation.md: published measurements of Muon's cost beside the simulated
    /// prediction for the same jobs.
    #[arg(long, conflicts_with_all = ["model", "dp", "device_run", "scenario"])]
    validation: bool,
    /// Instead of a scenario: price a device run's measured op classes (`muon-opt measure
    /// --out`, `bench/device/*.json`) with `--hardware` and print measured / predicted.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["model", "dp"])]
    device_run: Option<PathBuf>,
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

/// A built-in hardware profile by name, else a profile JSON file.
pub fn load_hardware(arg: &str) -> Result<Hardware, String> {
    if let Some(hw) = builtin(arg) {
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

pub fn run(args: &SimulateArgs) -> Result<(), String> {
    if let Some(path) = &args.device_run {
        return crate::device::run_comparison(path, &args.job.hardware, args.json);
    }
    if args.validation {
        return validation::run();
    }
    if let Some(name) = &args.scenario {
        if std::path::Path::new(name).is_file() {
            if args.markdown {
                return Err("--markdown prints docs/performance.md: give it `--scenario all`".to_string());
            }
            return scenario_file::run(name, args.json);
        }
        return performance::run(
            name,
            args.job.ownership.unwrap_or(OwnershipChoice::Auto),
            args.markdown,
            args.json,
        );
    }
    let sims = args.job.simulate()?;
    for sim in sims.iter().filter(|s| !s.fits) {
        eprintln!(
            "warning: {} at dp={} ({}): the library alone needs {:.1} GB per rank, more than the profile's {} GB",
            sim.model,
            sim.dp,
            sim.layout,
            sim.rank_bytes() as f64 / 1e9,
            sim.memory_gb
        );
    }
    let first = &sims[0];
    let ranks = trace::ranks_to_show(&first.timelines);
    if let Some(path) = &args.trace {
        std::fs::write(path, trace::chrome(&first.timelines, &ranks))
            .map_err(|e| format!("--trace '{}': cannot write: {e}", path.display()))?;
    }
    if let Some(path) = &args.svg {
        let title = format!("{} dp={} {} on {}", first.model, first.dp, first.layout, first.hardware);
        std::fs::write(path, trace::svg(&first.timelines, &ranks, &title))
            .map_err(|e| format!("--svg '{}': cannot write: {e}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&sims).map_err(|e| e.to_string())?);
    } else {
        print!("{}", table::table(&sims));
        println!("{}", provenance(&load_hardware(&args.job.hardware)?));
    }
    Ok(())
}

/// Which of a profile's figures were measured on a GPU and which are estimates.
fn provenance(hardware: &Hardware) -> String {
    let (measured, estimated) = hardware.provenance();
    let list = |v: &[&str]| if v.is_empty() { "none".to_string() } else { v.join(", ") };
    format!(
        "profile {}: measured on a GPU: {}; estimated: {}",
        hardware.name,
        list(&measured),
        list(&estimated)
    )
}

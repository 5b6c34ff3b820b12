//! `muon-opt`: command-line tools of libmuon_opt. Each subcommand is a thin shell over the
//! library; errors print one line and exit with code 2.

mod checkpoint;
mod demo;
mod device;
mod model_json;
mod plan;
mod render;
mod shared_args;
mod simulate;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    Plan(plan::PlanArgs),
    /// Train a small MLP on 4 host ranks with Muon and with AdamW only, and compare.
    Demo(demo::command::DemoArgs),
    /// Summarize a checkpoint directory and verify the checksum of every file.
    Inspect(checkpoint::InspectArgs),
    /// Merge a checkpoint (or those of every rank of a TP group) into one safetensors file of
    /// every param's full fp32 master weight.
    Export(checkpoint::ExportArgs),
    /// Simulate training iterations of the real schedule on a modelled GPU cluster.
    Simulate(Box<simulate::SimulateArgs>),
    /// Time the optimizer's step on a GPU, op class by op class, beside the simulator's cost model.
    Measure(device::MeasureArgs),
    /// Calibrate a hardware profile from a device run (`measure --out`).
    Calibrate(device::CalibrateArgs),
}

fn main() -> ExitCode {
    // Like every Unix filter: a closed pipe (`muon-opt plan … | head`) ends the process
    // quietly instead of failing the next write. Rust starts programs with SIGPIPE ignored.
    // SAFETY: restores the default disposition before any thread or output exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let result = match Cli::parse().command {
        Command::Plan(args) => plan::run(&args),
        Command::Demo(args) => demo::command::run(&args),
        Command::Inspect(args) => checkpoint::run_inspect(&args),
        Command::Export(args) => checkpoint::run_export(&args),
        Command::Simulate(args) => simulate::run(&args),
        Command::Measure(args) => device::run_measure(&args),
        Command::Calibrate(args) => device::run_calibrate(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("muon-opt: {message}");
            ExitCode::from(2)
        }
    }
}

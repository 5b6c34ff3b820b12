//! The `muon-opt demo` command: both runs with a live progress line, then the report.

use std::io::{IsTerminal, Write};

use clap::Args;

use super::{DemoConfig, Progress, report, run_demo};

#[derive(Args)]
pub struct DemoArgs {
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

pub fn run(args: &DemoArgs) -> Result<(), String> {
    let cfg = DemoConfig {
        steps: args.steps,
        dp: args.dp,
        ..DemoConfig::default()
    };
    let live = std::io::stderr().is_terminal();
    let progress = |p: &Progress| {
        let last = p.step == p.steps;
        if live || last {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r{}{}", report::progress_line(p), if last { "\n" } else { "" });
            let _ = err.flush();
        }
    };
    let result = run_demo(&cfg, &progress).map_err(|e| e.to_string())?;
    let text = if args.json {
        report::json(&result)
    } else {
        report::text(&result)
    };
    println!("{text}");
    Ok(())
}

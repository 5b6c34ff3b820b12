//! `muon-opt simulate --scenario FILE.json`: the jobs of a scenario file, each simulated as
//! the command line would simulate it with the same options ([`JobArgs`]), so a job as
//! trained (batch, micro-batch, sequence length, pipeline and virtual stages, expert
//! parallelism and top-k, the model, the hardware, the schedule) is written once and rerun.
//!
//! The file is `{"jobs": [{"name": "…", "model": "…", "dp": N, …}, …]}`; every other key is
//! a command-line option without its dashes (`global_batch`, `schedule`, `top_k`, …; the
//! sharding options under `sharding`), and an unknown key is an error naming it.

use serde::Deserialize;

use muon_opt::sim::Simulation;

use super::job::JobArgs;
use super::{load_hardware, provenance, table};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScenarioFile {
    jobs: Vec<JobArgs>,
}

/// One job of a file and its runs, as `--json` prints them.
#[derive(serde::Serialize)]
struct JobRuns<'a> {
    name: &'a str,
    runs: Vec<Simulation>,
}

/// The jobs of the scenario file at `path`, checked as the command line checks its options.
pub fn read(path: &str) -> Result<Vec<JobArgs>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("--scenario '{path}': {e}"))?;
    let file: ScenarioFile = serde_json::from_str(&text).map_err(|e| format!("--scenario '{path}': {e}"))?;
    if file.jobs.is_empty() {
        return Err(format!("--scenario '{path}': no jobs"));
    }
    for job in &file.jobs {
        if job.name.is_none() {
            return Err(format!("--scenario '{path}': every job needs a `name`"));
        }
        job.check_file_rules()?;
    }
    Ok(file.jobs)
}

/// Simulates every job of the file and prints each one's table (or all of them as JSON).
pub fn run(path: &str, json: bool) -> Result<(), String> {
    let jobs = read(path)?;
    let mut all = Vec::with_capacity(jobs.len());
    for job in &jobs {
        let name = job.name.as_deref().unwrap_or_default();
        let runs = job.simulate().map_err(|e| format!("scenario job '{name}': {e}"))?;
        all.push(JobRuns { name, runs });
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&all).map_err(|e| e.to_string())?);
        return Ok(());
    }
    for (job, runs) in jobs.iter().zip(&all) {
        println!("## {}\n", runs.name);
        print!("{}", table::table(&runs.runs));
        println!("{}\n", provenance(&load_hardware(&job.hardware)?));
    }
    Ok(())
}

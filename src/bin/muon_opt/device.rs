//! `muon-opt measure` (the optimizer's step timed on a GPU, beside the cost model's price),
//! `muon-opt calibrate` (a hardware profile from such a run) and the device-run table of
//! `muon-opt simulate --device-run`.

use std::path::PathBuf;

use clap::Args;

use muon_opt::error::ErrorKind;
use muon_opt::measure::compare::{Comparison, calibrate, compare};
use muon_opt::measure::step::{Options, measure};
use muon_opt::measure::{DeviceRun, OpClass};
use muon_opt::sim::cost::CostModel;

use crate::simulate::job::{MethodChoice, PrecisionChoice};
use crate::simulate::load_hardware;

#[derive(Args)]
pub struct MeasureArgs {
    /// llama3-8b-like layers in the step (16 take about half a second of Newton–Schulz on an H100).
    #[arg(long, default_value_t = 16)]
    layers: u32,
    /// 256-wide layers instead of llama3-8b's (a quick loop, e.g. under compute-sanitizer).
    #[arg(long)]
    small: bool,
    /// Newton–Schulz precision.
    #[arg(long, value_enum, default_value_t = PrecisionChoice::Bf16)]
    ns_precision: PrecisionChoice,
    /// Newton–Schulz iteration: `gram` where it applies (docs/newton-schulz.md), else standard.
    #[arg(long, value_enum, default_value_t = MethodChoice::Standard)]
    ns_method: MethodChoice,
    /// Untimed steps first.
    #[arg(long, default_value_t = 2)]
    warmup: u32,
    /// Whole steps timed (the median is reported).
    #[arg(long, default_value_t = 3)]
    steps: u32,
    /// The profile whose cost model prices every work: built-in name or JSON file.
    #[arg(long, default_value = "h100-nvlink")]
    hardware: String,
    /// Write the device run's JSON (docs/device-run.md) to FILE.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// The run's date as recorded (default: now, UTC).
    #[arg(long)]
    date: Option<String>,
}

#[derive(Args)]
pub struct CalibrateArgs {
    /// A device run's JSON (`muon-opt measure --out`, `bench/device/*.json`).
    run: PathBuf,
    /// The profile to calibrate: built-in name or JSON file.
    #[arg(long, default_value = "h100-nvlink")]
    hardware: String,
    /// Write the calibrated profile to FILE (default: stdout).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

/// UTC now as `YYYY-MM-DDTHH:MM:SSZ` (civil date from days since 1970-01-01 by Howard
/// Hinnant's `civil_from_days` algorithm).
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

fn write_json(path: &PathBuf, run: &DeviceRun) -> Result<(), String> {
    let text = serde_json::to_string_pretty(run).map_err(|e| e.to_string())?;
    std::fs::write(path, text + "\n").map_err(|e| format!("--out '{}': cannot write: {e}", path.display()))
}

fn ms(v: f64) -> String {
    format!("{v:.3}")
}

fn ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "-".to_string(), |r| format!("{r:.2}"))
}

fn header() -> String {
    format!(
        "{:<44} {:>7} {:>12} {:>12} {:>7}\n",
        "op class", "count", "measured ms", "model ms", "ratio"
    )
}

fn line(class: &str, count: u64, measured_ms: f64, predicted_ms: Option<f64>, r: Option<f64>) -> String {
    format!(
        "{:<44} {:>7} {:>12} {:>12} {:>7}\n",
        class,
        count,
        ms(measured_ms),
        predicted_ms.map_or_else(|| "-".to_string(), ms),
        ratio(r)
    )
}

fn class_lines(classes: &[OpClass]) -> String {
    let mut out = header();
    for c in classes {
        out += &line(&c.class, c.count, c.measured_ms, c.predicted_ms, c.ratio);
    }
    out
}

pub fn run_measure(args: &MeasureArgs) -> Result<(), String> {
    let hardware = load_hardware(&args.hardware)?;
    let date = args.date.clone().unwrap_or_else(utc_now);
    let opts = Options {
        layers: args.layers,
        small: args.small,
        ns_precision: args.ns_precision.precision(),
        ns_method: args.ns_method.method(),
        warmup_steps: args.warmup,
        whole_steps: args.steps.max(1),
        hardware: hardware.clone(),
    };
    let run = match measure(&opts, date.clone()) {
        Ok(run) => run,
        Err(e) if matches!(e.kind, ErrorKind::CudaUnavailable | ErrorKind::CudaNoDevice) => {
            println!("no GPU: skipped ({})", e.message);
            if let Some(path) = &args.out {
                write_json(path, &DeviceRun::skipped(date, e.message, &hardware.name))?;
            }
            return Ok(());
        }
        Err(e) => return Err(format!("measure: {e}")),
    };
    if let Some(path) = &args.out {
        write_json(path, &run)?;
    }
    let (device, step) = (run.device.as_ref(), run.step.as_ref());
    if let (Some(device), Some(step)) = (device, step) {
        println!(
            "{} (sm {}, {} SMs, CUDA {} driver) — {}",
            device.name, device.compute_capability, device.sms, device.driver_cuda, run.date
        );
        println!(
            "step: measured {} ms (median of {:?}), {} predicts {} ms (ratio {:.2}); host issue {} ms for {} work actions",
            ms(step.measured_ms),
            step.runs_ms.iter().map(|v| format!("{v:.2}")).collect::<Vec<_>>(),
            run.predicted_with,
            ms(step.predicted_ms),
            step.measured_ms / step.predicted_ms,
            ms(step.host_issue_ms),
            step.work_actions
        );
    }
    print!("{}", class_lines(&run.op_classes));
    for r in &run.references {
        println!(
            "reference {:<40} {:>10} ms  {:>9.1} {}  model {} ms",
            r.name,
            ms(r.measured_ms),
            r.achieved,
            r.unit,
            r.predicted_ms.map_or_else(|| "-".to_string(), ms)
        );
    }
    Ok(())
}

pub fn run_calibrate(args: &CalibrateArgs) -> Result<(), String> {
    let text = std::fs::read_to_string(&args.run).map_err(|e| format!("'{}': {e}", args.run.display()))?;
    let run = DeviceRun::from_json(&text).map_err(|e| format!("'{}': {e}", args.run.display()))?;
    let base = load_hardware(&args.hardware)?;
    let name = args
        .run
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let hw = calibrate(&run, &base, &format!("bench/device/{name}")).map_err(|e| e.to_string())?;
    for field in &hw.measured {
        eprintln!("calibrated {field}");
    }
    let json = serde_json::to_string_pretty(&hw).map_err(|e| e.to_string())? + "\n";
    match &args.out {
        Some(path) => std::fs::write(path, json).map_err(|e| format!("--out '{}': cannot write: {e}", path.display())),
        None => {
            print!("{json}");
            Ok(())
        }
    }
}

/// `simulate --device-run`: the run priced by `hardware`, as a table or JSON.
pub fn run_comparison(path: &PathBuf, hardware: &str, json: bool) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("--device-run '{}': {e}", path.display()))?;
    let run = DeviceRun::from_json(&text).map_err(|e| format!("--device-run '{}': {e}", path.display()))?;
    let cost = CostModel::new(load_hardware(hardware)?, 1);
    let cmp = compare(&run, &cost).map_err(|e| format!("--device-run '{}': {e}", path.display()))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&cmp).map_err(|e| e.to_string())?);
    } else {
        print!("{}", comparison_table(&cmp));
    }
    Ok(())
}

fn comparison_table(cmp: &Comparison) -> String {
    let mut out = format!(
        "device run of {} on {}, priced by {}\nstep: measured {} ms, model {} ms (ratio {:.3})\n",
        cmp.date,
        cmp.device,
        cmp.profile,
        ms(cmp.step_measured_ms),
        ms(cmp.step_predicted_ms),
        cmp.step_measured_ms / cmp.step_predicted_ms
    );
    out += &header();
    for r in cmp.classes.iter().chain(&cmp.references) {
        out += &line(&r.class, r.count, r.measured_ms, r.predicted_ms, r.ratio);
    }
    out
}

//! The device-run pipeline without a GPU: a real schedule on the cuda translation runs on a
//! stand-in executor whose clock advances by a known time per work action, through the same
//! `Timed` executor `muon-opt measure` uses on a GPU. Then: every work action is timed once and
//! read at the schedule's synchronize, the op classes price and sum exactly, `calibrate` recovers
//! a planted GEMM efficiency, and the CLI (`measure` without a GPU, `simulate --device-run`,
//! `calibrate`) reads and writes the documented JSON.

mod support;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::{Arc, Mutex};

use muon_opt::backend::cuda::action::{Action, Buf, DevPtr};
use muon_opt::backend::cuda::dry_run::VirtualMemory;
use muon_opt::backend::cuda::timing::{Marker, SharedLog, Timed, TimingLog, work_stream};
use muon_opt::backend::cuda::translate::Translator;
use muon_opt::backend::cuda::{CudaBackend, Executor};
use muon_opt::backend::ops::StreamKind;
use muon_opt::config::{Config, Dtype};
use muon_opt::error::{ErrorKind, Result};
use muon_opt::measure::compare::{calibrate, compare};
use muon_opt::measure::{DeviceInfo, DeviceRun, Reference, StepTime, Workload, op_classes, reference_gemm};
use muon_opt::model::{ParamFlags, ParamSpec, Registry};
use muon_opt::numerics::muon::MuonOptions;
use muon_opt::plan::build_plan;
use muon_opt::schedule::{Runtime, StepArgs, StepOverrides};
use muon_opt::sim::cost::CostModel;
use muon_opt::sim::profile::{Hardware, builtin};
use muon_opt::sim::work::Work;
use support::docs::assert_quotes;
use support::tempdir::TempDir;

/// A stand-in device: virtual addresses, and one clock per stream that each work action
/// advances by the cost model's price times `gemm_factor` (GEMMs) or 1 (the rest).
struct Clocked {
    memory: VirtualMemory,
    cost: CostModel,
    gemm_factor: f64,
    clocks: [f64; 2],
    marks: Vec<f64>,
}

impl Executor for Clocked {
    fn run(&mut self, actions: &[Action], bind: &mut dyn FnMut(Buf, DevPtr, u64)) -> Result<Vec<Vec<u8>>> {
        let mut out = Vec::new();
        for action in actions {
            match action {
                Action::Alloc { buf, bytes } => bind(*buf, self.memory.alloc(*bytes), *bytes),
                Action::CopyOut { bytes, .. } => out.push(vec![0u8; *bytes as usize]),
                _ => {}
            }
            if let (Some(stream), Some(work)) = (work_stream(action), Work::of(action)) {
                let factor = if matches!(work, Work::Gemm { .. }) {
                    self.gemm_factor
                } else {
                    1.0
                };
                self.clocks[stream as usize] += self.cost.work_seconds(&work).unwrap_or(0.0) * factor;
            }
        }
        Ok(out)
    }
}

impl Marker for Clocked {
    fn mark(&mut self, stream: StreamKind) -> Result<usize> {
        self.marks.push(self.clocks[stream as usize]);
        Ok(self.marks.len() - 1)
    }

    fn take_seconds(&mut self, from: usize, to: usize) -> Result<f64> {
        Ok(self.marks[to] - self.marks[from])
    }
}

fn model() -> Vec<ParamSpec> {
    let mut specs = vec![
        ParamSpec::new("emb.weight", &[512, 256], Dtype::Bf16),
        ParamSpec::new("l0.fc1.weight", &[1024, 1024], Dtype::Bf16),
        ParamSpec::new("l0.fc2.weight", &[1024, 1024], Dtype::Bf16),
        ParamSpec::new("l0.norm.weight", &[1024], Dtype::Bf16),
    ];
    specs[0].flags = ParamFlags(ParamFlags::EMBEDDING_OR_OUTPUT);
    specs
}

const ARGS: StepArgs = StepArgs {
    lr: 0.02,
    weight_decay: 0.1,
    adam_lr: 3e-4,
    adam_weight_decay: 0.1,
    overrides: StepOverrides::NONE,
};

/// One timed step on the stand-in; returns the timed (work, seconds) pairs, the issued counts
/// and the number of work actions the translation produced while recording.
fn timed_step(gemm_factor: f64) -> (Vec<(Work, f64)>, (u64, u64)) {
    let cfg = Config::default();
    let specs = model();
    let mut registry = Registry::default();
    for s in &specs {
        registry.add(s.clone(), &cfg).unwrap();
    }
    let plan = build_plan(registry.params(), registry.routes(), &cfg, 1).unwrap();
    let log: SharedLog = Arc::new(Mutex::new(TimingLog::default()));
    let device = Clocked {
        memory: VirtualMemory::default(),
        cost: CostModel::new(builtin("h100-nvlink").unwrap(), 1),
        gemm_factor,
        clocks: [0.0; 2],
        marks: Vec::new(),
    };
    let backend = CudaBackend::with_executor(
        Translator::new(0, 1, MuonOptions::from_config(&cfg)),
        Timed::new(device, log.clone()),
    )
    .unwrap();
    let mut rt = Runtime::new(Box::new(plan), specs.clone(), cfg, 0, Box::new(backend), |_| None).unwrap();
    rt.zero_grad().unwrap();
    log.lock().unwrap().start();
    for p in (0..specs.len() as u32).rev() {
        rt.grad_ready(p).unwrap();
    }
    rt.step(Some(&ARGS)).unwrap();
    for b in 0..rt.plan().buckets.len() as u32 {
        rt.wait_params(b).unwrap();
    }
    assert!(
        log.lock().unwrap().pending() > 0,
        "nothing is read before the streams synchronize"
    );
    rt.synchronize().unwrap();
    let mut log = log.lock().unwrap();
    log.stop();
    assert_eq!(log.pending(), 0, "the synchronize reads every mark");
    let timings: Vec<(Work, f64)> = log
        .take()
        .iter()
        .map(|t| (Work::of(&t.action).expect("only work actions are timed"), t.seconds))
        .collect();
    (timings, log.counts())
}

fn run_of(timings: &[(Work, f64)], counts: (u64, u64), hw: &Hardware) -> DeviceRun {
    let cost = CostModel::new(hw.clone(), 1);
    let price = |w: &Work| cost.work_seconds(w);
    let predicted_ms = timings.iter().filter_map(|(w, _)| price(w)).sum::<f64>() * 1e3;
    let measured_ms = timings.iter().map(|(_, s)| s).sum::<f64>() * 1e3;
    let mut run = DeviceRun::skipped("2026-11-26T00:00:00Z".into(), String::new(), &hw.name);
    run.status = "measured".into();
    run.skipped = None;
    run.device = Some(DeviceInfo {
        name: "stand-in".into(),
        compute_capability: "9.0".into(),
        sms: 132,
        memory_gib: 80.0,
        driver_cuda: "13.0".into(),
    });
    run.step = Some(StepTime {
        measured_ms,
        runs_ms: vec![measured_ms],
        host_issue_ms: 1.0,
        work_actions: counts.0,
        event_actions: counts.1,
        predicted_ms,
    });
    run.op_classes = op_classes(timings, &price);
    run
}

/// Every work action of the step is timed exactly once, with the stand-in's clock; the op
/// classes sum to the step and each priced class's ratio is 1 when the device runs at the
/// model's speed.
#[test]
fn every_work_action_is_timed_and_the_classes_price_it() {
    let (timings, counts) = timed_step(1.0);
    assert_eq!(timings.len() as u64, counts.0, "one timing per issued work action");
    assert!(counts.1 > 0, "the step records and waits on events");
    let hw = builtin("h100-nvlink").unwrap();
    let run = run_of(&timings, counts, &hw);
    let names: Vec<&str> = run.op_classes.iter().map(|c| c.class.as_str()).collect();
    for expected in [
        "gemm bf16 1024x1024x1024",
        "kernel muon_adamw",
        "kernel muon_momentum",
        "kernel muon_apply",
    ] {
        assert!(names.contains(&expected), "{expected} missing from {names:?}");
    }
    let total: f64 = run.op_classes.iter().map(|c| c.measured_ms).sum();
    assert!((total - run.step.as_ref().unwrap().measured_ms).abs() < 1e-9);
    for class in &run.op_classes {
        let count: u64 = class.works.iter().map(|w| w.count).sum();
        assert_eq!(count, class.count, "{}", class.class);
        if let Some(ratio) = class.ratio {
            assert!((ratio - 1.0).abs() < 1e-9, "{}: ratio {ratio}", class.class);
        }
    }
    let cmp = compare(&run, &CostModel::new(hw, 1)).unwrap();
    assert!((cmp.step_predicted_ms - cmp.step_measured_ms).abs() < 1e-9);
}

/// Fits outside a physical range are refused, naming the figure and the op class, and nothing
/// is returned to write: a GEMM the model cannot price (its fit would sit at the solver's
/// floor), a kernel timed at 1e300 ms (a launch floor of 1e303 µs).
#[test]
fn calibration_refuses_fits_outside_physical_ranges() {
    let hw = builtin("h100-nvlink").unwrap();
    let huge = Work::Gemm {
        inputs: "bf16".into(),
        m: 1 << 40,
        n: 8,
        k: 8,
        batch: 1,
        accumulate: false,
        panels: 0,
    };
    let stalled = Work::Kernel {
        kernel: "muon_step_scalars".into(),
        bytes: 8,
    };
    for (work, seconds, field) in [(huge, 1.0, "gemm_efficiency"), (stalled, 1e297, "kernel_min_us")] {
        let class = op_classes(&[(work.clone(), 0.0)], &|_| None)[0].class.clone();
        let run = run_of(&[(work, seconds)], (1, 0), &hw);
        let err = calibrate(&run, &hw, "bench/device/stand-in.json").unwrap_err();
        assert_eq!(err.kind, ErrorKind::OutOfRange, "{}", err.message);
        for needle in [field, "physical range", class.as_str(), "no profile was written"] {
            assert!(err.message.contains(needle), "'{needle}' missing from: {}", err.message);
        }
    }
}

/// A host that issued the step in most of its time was held back by the device's launch queue:
/// its issue time is not the launches' cost, and `launch_host_us` keeps the profile's value
/// (the sources say why). A host well ahead of the device is fitted.
#[test]
fn launch_time_is_fitted_only_from_a_host_ahead_of_the_device() {
    let hw = builtin("h100-nvlink").unwrap();
    let kernel = Work::Kernel {
        kernel: "muon_apply".into(),
        bytes: 1 << 36,
    };
    let mut run = run_of(&[(kernel, 0.1)], (1000, 0), &hw);
    for (issue_ms, fitted) in [(90.0, false), (5.0, true)] {
        run.step.as_mut().unwrap().host_issue_ms = issue_ms;
        let calibrated = calibrate(&run, &hw, "bench/device/stand-in.json").unwrap();
        assert_eq!(
            calibrated.measured.contains(&"launch_host_us".to_string()),
            fitted,
            "issue {issue_ms} ms"
        );
        if fitted {
            assert!(
                (calibrated.launch_host_us - 5.0).abs() < 1e-9,
                "{}",
                calibrated.launch_host_us
            );
        } else {
            assert_eq!(calibrated.launch_host_us, hw.launch_host_us);
            assert!(calibrated.sources["measured"].contains("launch_host_us kept"));
        }
    }
}

/// GEMMs twice as slow as the model says: calibration halves `gemm_efficiency`, keeps the
/// bandwidth fit, names the run in the sources, and the calibrated profile then predicts the
/// step it was fitted to.
#[test]
fn calibration_recovers_a_planted_gemm_efficiency() {
    let hw = builtin("h100-nvlink").unwrap();
    let (timings, counts) = timed_step(2.0);
    let run = run_of(&timings, counts, &hw);
    // A plain reference GEMM far faster than the model says: the fit is the step's GEMMs'.
    let mut run = run;
    let (name, peak) = reference_gemm();
    let fast = CostModel::new(hw.clone(), 1).work_seconds(&peak).unwrap() * 1e3 / 10.0;
    run.references.push(Reference {
        name,
        work: peak,
        repetitions: 5,
        measured_ms: fast,
        predicted_ms: None,
        achieved: 0.0,
        unit: "TFLOP/s".into(),
    });
    let calibrated = calibrate(&run, &hw, "bench/device/stand-in.json").unwrap();
    let rel = (calibrated.gemm_efficiency - hw.gemm_efficiency / 2.0).abs() / hw.gemm_efficiency;
    assert!(
        rel < 1e-6,
        "gemm_efficiency {} vs {}",
        calibrated.gemm_efficiency,
        hw.gemm_efficiency / 2.0
    );
    assert!((calibrated.hbm_efficiency - hw.hbm_efficiency).abs() < 1e-6);
    assert!(calibrated.measured.contains(&"gemm_efficiency".to_string()));
    assert!(calibrated.sources["measured"].contains("bench/device/stand-in.json"));
    let text = serde_json::to_string(&calibrated).unwrap();
    let reread = Hardware::from_json(&text).unwrap();
    let (measured, estimated) = reread.provenance();
    assert!(measured.contains(&"gemm_efficiency") && estimated.contains(&"comm_sm_share"));
    let cmp = compare(&run, &CostModel::new(reread, 1)).unwrap();
    let error = (cmp.step_predicted_ms - cmp.step_measured_ms).abs() / cmp.step_measured_ms;
    assert!(error < 1e-6, "calibrated prediction off by {error}");
}

/// A profile may only claim achievable figures as measured.
#[test]
fn a_profile_naming_an_unknown_measured_figure_is_refused() {
    let mut hw = builtin("h100-ib").unwrap();
    hw.measured = vec!["bf16_tflops".into()];
    let err = Hardware::from_json(&serde_json::to_string(&hw).unwrap()).unwrap_err();
    assert!(err.message.contains("measured lists 'bf16_tflops'"), "{}", err.message);
}

/// The JSON round-trips; another schema version and a skipped run are refused by name.
#[test]
fn device_run_json_round_trips_and_refuses_what_it_cannot_use() {
    let hw = builtin("h100-nvlink").unwrap();
    let (timings, counts) = timed_step(1.0);
    let mut run = run_of(&timings, counts, &hw);
    run.environment = BTreeMap::from([("gpu".to_string(), "stand-in".to_string())]);
    let text = serde_json::to_string_pretty(&run).unwrap();
    assert_eq!(DeviceRun::from_json(&text).unwrap(), run, "exact float round trip");
    let other = text.replacen("\"schema_version\": 1", "\"schema_version\": 7", 1);
    let err = DeviceRun::from_json(&other).unwrap_err();
    assert!(err.message.contains("schema_version 7"), "{}", err.message);
    let skipped = DeviceRun::skipped("d".into(), "no GPU here".into(), "h100-nvlink");
    let err = compare(&skipped, &CostModel::new(hw.clone(), 1)).unwrap_err();
    assert!(err.message.contains("no GPU here"), "{}", err.message);
    assert!(calibrate(&skipped, &hw, "x").is_err());
}

/// `workload.ns_method` names the Newton–Schulz iteration and round-trips; a run written
/// before the field existed reads as `standard`.
#[test]
fn the_workload_names_its_newton_schulz_method() {
    let hw = builtin("h100-nvlink").unwrap();
    let (timings, counts) = timed_step(1.0);
    let mut run = run_of(&timings, counts, &hw);
    run.workload = Some(Workload {
        layers: 1,
        layer_params: vec![("fc".into(), vec![64, 256])],
        other_params: Vec::new(),
        elements: 64 * 256,
        ns_precision: "bf16".into(),
        ns_method: "gram".into(),
        grad_dtype: "f32".into(),
        warmup_steps: 1,
        whole_steps: 1,
    });
    let text = serde_json::to_string_pretty(&run).unwrap();
    assert_eq!(DeviceRun::from_json(&text).unwrap(), run);
    let mut older: serde_json::Value = serde_json::from_str(&text).unwrap();
    older["workload"].as_object_mut().unwrap().remove("ns_method").unwrap();
    let older = DeviceRun::from_json(&older.to_string()).unwrap();
    assert_eq!(older.workload.unwrap().ns_method, "standard");
}

fn muon_opt(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_muon-opt"))
        .args(args)
        .env("LD_LIBRARY_PATH", "/nonexistent")
        .output()
        .unwrap()
}

/// The command line: `measure` (either Newton–Schulz method) without a GPU says so, exits 0 and
/// writes a skipped run;
/// `simulate --device-run` prints measured / predicted per op class; `calibrate` writes a
/// profile `simulate` accepts (here with `--ns-method gram`, named in its header) and reports
/// as measured.
#[test]
fn cli_measures_compares_and_calibrates() {
    let dir = TempDir::new("device_run_cli");
    let skipped = dir.join("skipped.json");
    for method in ["standard", "gram"] {
        let out = muon_opt(&["measure", "--ns-method", method, "--out", skipped.to_str().unwrap()]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).starts_with("no GPU: skipped ("));
    }
    let run = DeviceRun::from_json(&std::fs::read_to_string(&skipped).unwrap()).unwrap();
    assert_eq!(run.status, "skipped");

    let hw = builtin("h100-nvlink").unwrap();
    let (timings, counts) = timed_step(2.0);
    let measured = dir.join("run.json");
    std::fs::write(
        &measured,
        serde_json::to_string(&run_of(&timings, counts, &hw)).unwrap(),
    )
    .unwrap();
    let table = muon_opt(&["simulate", "--device-run", measured.to_str().unwrap()]);
    assert!(table.status.success(), "{}", String::from_utf8_lossy(&table.stderr));
    let text = String::from_utf8_lossy(&table.stdout);
    let gemm = text
        .lines()
        .find(|l| l.starts_with("gemm bf16 1024x1024x1024"))
        .expect(&text);
    assert!(
        gemm.trim_end().ends_with("2.00"),
        "GEMMs measured at twice the model: {gemm}"
    );
    let refused = muon_opt(&["simulate", "--device-run", skipped.to_str().unwrap()]);
    assert_eq!(refused.status.code(), Some(2));

    let profile = dir.join("calibrated.json");
    let cal = muon_opt(&[
        "calibrate",
        measured.to_str().unwrap(),
        "--out",
        profile.to_str().unwrap(),
    ]);
    assert!(cal.status.success(), "{}", String::from_utf8_lossy(&cal.stderr));
    let sim = muon_opt(&[
        "simulate",
        "--model",
        "gpt2-124m",
        "--dp",
        "2",
        "--hardware",
        profile.to_str().unwrap(),
        "--ns-method",
        "gram",
    ]);
    assert!(sim.status.success(), "{}", String::from_utf8_lossy(&sim.stderr));
    let text = String::from_utf8_lossy(&sim.stdout);
    assert!(text.lines().next().unwrap().contains(", NS bf16 gram,"), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("profile h100-nvlink: measured on a GPU:"))
        .expect(&text);
    assert!(line.contains("measured on a GPU: gemm_efficiency"), "{line}");
    let recompared = muon_opt(&[
        "simulate",
        "--device-run",
        measured.to_str().unwrap(),
        "--hardware",
        profile.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&recompared.stdout);
    assert!(text.contains("(ratio 1.000)"), "{text}");
}

/// A committed run of `bench/device/`: `2026-11-28-NAME.json`.
fn committed_run(name: &str) -> DeviceRun {
    let path = format!("{}/bench/device/2026-11-28-{name}.json", env!("CARGO_MANIFEST_DIR"));
    DeviceRun::from_json(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// docs/device-run.md quotes the committed H200 runs as `simulate --device-run` prices them.
#[test]
fn the_docs_quote_the_committed_h200_runs() {
    let priced = |name: &str, profile: &str| {
        compare(&committed_run(name), &CostModel::new(builtin(profile).unwrap(), 1)).unwrap()
    };
    let ratio = |name: &str, class: &str, digits: usize| {
        let row = priced(name, "h100-nvlink")
            .classes
            .into_iter()
            .find(|c| c.class == class)
            .unwrap();
        format!("{:.digits$}×", row.ratio.unwrap())
    };
    let measured = |name: &str| format!("{:.1}", priced(name, "h100-nvlink").step_measured_ms);
    let step_ratio = |name: &str, profile: &str| {
        let cmp = priced(name, profile);
        format!("{:.2}×", cmp.step_measured_ms / cmp.step_predicted_ms)
    };
    let [normalize, symmetrize] = ["kernel muon_ns_normalize", "kernel muon_ns_symmetrize"];
    let quotes = [
        format!(
            "`muon_ns_normalize` ({} its model) and `muon_ns_symmetrize` ({})",
            ratio("h200", normalize, 1),
            ratio("h200", symmetrize, 1)
        ),
        format!(
            "they run {} and {} (`muon_apply` {} → {}), the step {} → {} ms and with Gram \
             Newton–Schulz {} → {} ms.",
            ratio("h200-2", normalize, 1),
            ratio("h200-2", symmetrize, 1),
            ratio("h200", "kernel muon_apply", 2),
            ratio("h200-2", "kernel muon_apply", 2),
            measured("h200"),
            measured("h200-2"),
            measured("h200-gram"),
            measured("h200-2-gram"),
        ),
        format!(
            "its achievable fractions calibrated from the second run) prices that run's step at {} \
             (Gram {}, f32 {}:",
            step_ratio("h200-2", "h200-nvlink"),
            step_ratio("h200-2-gram", "h200-nvlink"),
            step_ratio("h200-2-f32", "h200-nvlink"),
        ),
        format!(
            "`h100-nvlink` priced the first run at {}.",
            step_ratio("h200", "h100-nvlink")
        ),
        "**Sanitizers**: memcheck and synccheck are clean over the library's kernels.".to_string(),
    ];
    assert_quotes("docs/device-run.md", &quotes);
    for tool in ["memcheck", "synccheck"] {
        let result = committed_run("h200-2")
            .sanitizer
            .into_iter()
            .find(|r| r.tool == tool)
            .unwrap();
        assert_eq!((result.status.as_str(), result.errors), ("clean", 0), "{tool}");
    }
    let sources = builtin("h200-nvlink").unwrap().sources;
    assert!(
        sources["measured"].starts_with("bench/device/2026-11-28-h200-2.json "),
        "h200-nvlink is not calibrated from the second run: {}",
        sources["measured"]
    );
}

/// docs/device-run.md's JSON is an excerpt of the second H200 run, numbers rounded.
#[test]
fn the_docs_json_is_an_excerpt_of_the_second_h200_run() {
    let run = committed_run("h200-2");
    let (device, workload, step) = (run.device.unwrap(), run.workload.unwrap(), run.step.unwrap());
    let (class, reference, test, sanitizer) =
        (&run.op_classes[0], &run.references[0], &run.tests[0], &run.sanitizer[0]);
    let (layer, shape) = &workload.layer_params[0];
    let runs_ms: Vec<String> = step.runs_ms.iter().map(|ms| format!("{ms:.1}")).collect();
    let work = &class.works[0];
    let quotes = [
        format!(r#""schema_version": {},"date": "{}","#, run.schema_version, run.date),
        format!(r#""status": "{}","#, run.status),
        format!(
            r#""device": {{"name": "{}", "compute_capability": "{}", "sms": {}, "memory_gib": {:.1}, "driver_cuda": "{}"}},"#,
            device.name, device.compute_capability, device.sms, device.memory_gib, device.driver_cuda
        ),
        format!(
            r#""workload": {{"layers": {}, "layer_params": [["{layer}", {shape:?}], …], "other_params": […],
               "elements": {}, "ns_precision": "{}", "ns_method": "{}", "grad_dtype": "{}", "warmup_steps": {}, "whole_steps": {}}},"#,
            workload.layers,
            workload.elements,
            workload.ns_precision,
            workload.ns_method,
            workload.grad_dtype,
            workload.warmup_steps,
            workload.whole_steps
        ),
        format!(r#""predicted_with": "{}","#, run.predicted_with),
        format!(
            r#""step": {{"measured_ms": {:.1}, "runs_ms": [{}], "host_issue_ms": {:.1}, "work_actions": {}, "event_actions": {}, "predicted_ms": {:.1}}},"#,
            step.measured_ms,
            runs_ms.join(", "),
            step.host_issue_ms,
            step.work_actions,
            step.event_actions,
            step.predicted_ms
        ),
        format!(
            r#"{{"class": "{}", "count": {}, "measured_ms": {:.1}, "predicted_ms": {:.1}, "ratio": {:.3},"#,
            class.class,
            class.count,
            class.measured_ms,
            class.predicted_ms.unwrap(),
            class.ratio.unwrap()
        ),
        format!(
            r#""works": [{{"work": {}, "count": {}, "measured_ms": {:.1}}}]}},"#,
            serde_json::to_string(&work.work).unwrap(),
            work.count,
            work.measured_ms
        ),
        format!(
            r#""references": [{{"name": "{}", "work": {{…}}, "repetitions": {}, "measured_ms": {:.2}, "predicted_ms": {:.2}, "achieved": {:.1}, "unit": "{}"}}, …],"#,
            reference.name,
            reference.repetitions,
            reference.measured_ms,
            reference.predicted_ms.unwrap(),
            reference.achieved,
            reference.unit
        ),
        format!(
            r#""environment": {{"gpu": "{}", …, "libnccl.so.2": "{}", …}},"#,
            run.environment["gpu"], run.environment["libnccl.so.2"]
        ),
        format!(
            r#""tests": [{{"suite": "{}", "name": "{}", "status": "{}"}}, …],"#,
            test.suite, test.name, test.status
        ),
        format!(
            r#""sanitizer": [{{"tool": "{}", "status": "{}", "errors": {},"#,
            sanitizer.tool, sanitizer.status, sanitizer.errors
        ),
        format!(r#""summary": "{}"}}, …]"#, sanitizer.summary),
    ];
    assert_quotes("docs/device-run.md", &quotes);
}

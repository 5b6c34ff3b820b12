//! A device run: the optimizer's step measured on one GPU, op class by op class, beside what
//! `muon-opt simulate`'s cost model predicts for the same work (`muon-opt measure`,
//! `scripts/device/check.sh`). The JSON schema is documented in `docs/device-run.md`; a run's
//! JSON is committed under `bench/device/`, and `muon-opt simulate --device-run` prices it
//! again under any profile, `muon-opt calibrate` turns it into a profile.
//!
//! - [`step`]: the measurement on a GPU (llama3-8b-like layers, one rank, a one-rank NCCL
//!   communicator), with every action timed by CUDA events;
//! - [`compare`]: the run against a cost model, and the calibration of a profile from it.

pub mod compare;
pub mod step;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::bail;
use crate::error::Result;
use crate::sim::work::Work;

/// One device run (`docs/device-run.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceRun {
    /// [`crate::SCHEMA_VERSION`], as every JSON document of the library.
    pub schema_version: u32,
    /// UTC date and time of the run (`YYYY-MM-DDTHH:MM:SSZ`).
    pub date: String,
    /// `measured`; `skipped` (no GPU) or `failed` (the measurement failed on a GPU): then
    /// `skipped` says why and only the runner's fields are filled.
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<Workload>,
    /// The profile the `predicted_ms` figures come from.
    pub predicted_with: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<StepTime>,
    /// Every op class of one timed step, the most expensive first.
    #[serde(default)]
    pub op_classes: Vec<OpClass>,
    /// Plain cuBLAS GEMMs and device copies at the step's shapes and at peak size.
    #[serde(default)]
    pub references: Vec<Reference>,
    /// What the runner found: GPU, driver, where NVRTC and NCCL were taken from (check.sh).
    #[serde(default)]
    pub environment: BTreeMap<String, String>,
    /// Every GPU test the runner ran (check.sh).
    #[serde(default)]
    pub tests: Vec<TestResult>,
    /// compute-sanitizer over a small optimizer loop (check.sh).
    #[serde(default)]
    pub sanitizer: Vec<SanitizerResult>,
}

/// The GPU, as the driver reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceInfo {
    pub name: String,
    pub compute_capability: String,
    pub sms: u32,
    pub memory_gib: f64,
    /// `cuDriverGetVersion` as `major.minor`.
    pub driver_cuda: String,
}

/// What was measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    pub layers: u32,
    /// Every param of one layer: name and shape.
    pub layer_params: Vec<(String, Vec<u64>)>,
    /// Params beside the layers (an embedding, a final norm).
    pub other_params: Vec<(String, Vec<u64>)>,
    pub elements: u64,
    pub ns_precision: String,
    /// `standard` | `gram` (`muon_ns_method`); runs recorded before the field were standard.
    #[serde(default = "standard_method")]
    pub ns_method: String,
    pub grad_dtype: String,
    /// Steps before the timed ones (kernel compilation, cuBLAS heuristics, allocations).
    pub warmup_steps: u32,
    /// Steps timed whole; `step.measured_ms` is their median.
    pub whole_steps: u32,
}

fn standard_method() -> String {
    crate::config::NsMethod::Standard.name().to_string()
}

/// The whole step: grads ready → step → every bucket's params back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepTime {
    /// Median device time of the whole-step runs (CUDA events on the caller's stream).
    pub measured_ms: f64,
    pub runs_ms: Vec<f64>,
    /// Host time to issue the step (it does not wait for the device).
    pub host_issue_ms: f64,
    /// Kernels, GEMMs, memsets, copies and NCCL groups one step issues.
    pub work_actions: u64,
    /// Event records and stream waits one step issues.
    pub event_actions: u64,
    /// The cost model's device time of those actions, back to back (one GPU, one rank).
    pub predicted_ms: f64,
}

/// One op class of the timed step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpClass {
    pub class: String,
    pub count: u64,
    pub measured_ms: f64,
    /// None where the model prices no such work on one GPU (one-rank collectives).
    pub predicted_ms: Option<f64>,
    /// measured / predicted.
    pub ratio: Option<f64>,
    /// The distinct works of the class with their counts and measured time.
    pub works: Vec<WorkTime>,
}

/// One distinct work of an op class.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkTime {
    pub work: Work,
    pub count: u64,
    pub measured_ms: f64,
}

/// The reference GEMM a device run times beside the step (cuBLAS bf16, 8192³): its name and work.
pub fn reference_gemm() -> (String, Work) {
    let work = Work::Gemm {
        inputs: "bf16".into(),
        m: 8192,
        n: 8192,
        k: 8192,
        batch: 1,
        accumulate: false,
        panels: 0,
    };
    ("cuBLAS bf16 8192x8192x8192".into(), work)
}

/// A reference operation timed alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reference {
    pub name: String,
    pub work: Work,
    pub repetitions: u32,
    /// Per repetition.
    pub measured_ms: f64,
    pub predicted_ms: Option<f64>,
    /// TFLOP/s for GEMMs, GB/s (bytes read + written) for copies and memsets.
    pub achieved: f64,
    pub unit: String,
}

/// One GPU test.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestResult {
    /// The test executable (`cuda_gpu`, `kernels_nvrtc`, …).
    pub suite: String,
    pub name: String,
    /// `pass` | `fail` | `skip`.
    pub status: String,
}

/// One compute-sanitizer tool's findings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SanitizerResult {
    /// `memcheck` | `racecheck` | `synccheck`.
    pub tool: String,
    /// `clean` | `errors` | `failed` (the tool or the program failed) | `not_run`.
    pub status: String,
    pub errors: u64,
    /// The tool's summary line, or why it did not run.
    pub summary: String,
}

impl DeviceRun {
    /// A run that measured nothing, saying why.
    pub fn skipped(date: String, reason: String, predicted_with: &str) -> DeviceRun {
        DeviceRun {
            schema_version: crate::SCHEMA_VERSION,
            date,
            status: "skipped".to_string(),
            skipped: Some(reason),
            device: None,
            workload: None,
            predicted_with: predicted_with.to_string(),
            step: None,
            op_classes: Vec::new(),
            references: Vec::new(),
            environment: BTreeMap::new(),
            tests: Vec::new(),
            sanitizer: Vec::new(),
        }
    }

    /// A run from its JSON; refuses another schema version.
    pub fn from_json(text: &str) -> Result<DeviceRun> {
        let run: DeviceRun = match serde_json::from_str(text) {
            Ok(run) => run,
            Err(e) => bail!(InvalidArgument, "device run: {e}"),
        };
        if run.schema_version != crate::SCHEMA_VERSION {
            bail!(
                InvalidArgument,
                "device run: schema_version {} is not {} (this muon-opt's)",
                run.schema_version,
                crate::SCHEMA_VERSION
            );
        }
        Ok(run)
    }
}

/// Groups timed works into op classes, the most expensive first: `timings` are (work, seconds)
/// pairs of one step, `price` the model's seconds of a work.
pub fn op_classes(timings: &[(Work, f64)], price: &dyn Fn(&Work) -> Option<f64>) -> Vec<OpClass> {
    let mut works: BTreeMap<&Work, (u64, f64)> = BTreeMap::new();
    for (work, seconds) in timings {
        let entry = works.entry(work).or_default();
        entry.0 += 1;
        entry.1 += seconds;
    }
    let mut classes: BTreeMap<String, OpClass> = BTreeMap::new();
    for (work, (count, seconds)) in works {
        let class = classes.entry(work.class()).or_insert_with(|| OpClass {
            class: work.class(),
            count: 0,
            measured_ms: 0.0,
            predicted_ms: Some(0.0),
            ratio: None,
            works: Vec::new(),
        });
        class.count += count;
        class.measured_ms += seconds * 1e3;
        class.predicted_ms = match (class.predicted_ms, price(work)) {
            (Some(total), Some(one)) => Some(total + one * count as f64 * 1e3),
            _ => None,
        };
        class.works.push(WorkTime {
            work: work.clone(),
            count,
            measured_ms: seconds * 1e3,
        });
    }
    let mut classes: Vec<OpClass> = classes.into_values().collect();
    for class in &mut classes {
        class.ratio = class.predicted_ms.filter(|p| *p > 0.0).map(|p| class.measured_ms / p);
    }
    classes.sort_by(|a, b| b.measured_ms.total_cmp(&a.measured_ms).then(a.class.cmp(&b.class)));
    classes
}

/// The median of `values` (None when empty).
pub(crate) fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    (n > 0).then(|| {
        if n % 2 == 1 {
            values[n / 2]
        } else {
            0.5 * (values[n / 2 - 1] + values[n / 2])
        }
    })
}

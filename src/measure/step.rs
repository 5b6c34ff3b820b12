//! The measured step on one GPU: llama3-8b-like layers (4096², 1024×4096, 14336×4096 and
//! 4096×14336 matrices, norms, an embedding, one MXFP8 matrix per layer) on the cuda backend
//! over a one-rank NCCL communicator. Three measurements:
//!
//! 1. whole steps (grads ready → step → every bucket's params back), timed by CUDA events on
//!    the caller's stream, nothing else recorded; the median is `step.measured_ms`;
//! 2. one step with every work action bracketed by timing events ([`Timed`]), grouped into
//!    op classes and priced by the cost model;
//! 3. references timed alone: a plain cuBLAS GEMM at every GEMM shape of the step and at
//!    8192³, a device-to-device copy and a memset of 1 GiB.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use cudarc::driver::CudaContext;
use cudarc::driver::sys as cu;

use crate::backend::cuda::action::{Action, Buf, DevPtr, Gemm, GemmInputs, Matrices, Work as Scratch};
use crate::backend::cuda::device::{Device, driver_check};
use crate::backend::cuda::nccl::SingleRankComm;
use crate::backend::cuda::timing::{Marker, SharedLog, Timed, TimingLog, elapsed_time};
use crate::backend::cuda::translate::Translator;
use crate::backend::cuda::{CudaBackend, Executor, probe};
use crate::backend::ops::{Mem, Span, StreamKind};
use crate::comm::{Communicator, Transport};
use crate::config::{Config, Dtype, NsMethod, NsPrecision};
use crate::error::{Error, ErrorKind, Result};
use crate::model::{ParamFlags, ParamSpec, Registry};
use crate::numerics::muon::MuonOptions;
use crate::plan::build_plan;
use crate::rng::SplitMix64;
use crate::schedule::{Runtime, StepArgs, StepOverrides};
use crate::sim::cost::CostModel;
use crate::sim::profile::Hardware;
use crate::sim::work::Work;

use super::{DeviceInfo, DeviceRun, Reference, StepTime, Workload, op_classes, reference_gemm};

/// What to measure.
#[derive(Debug, Clone)]
pub struct Options {
    pub layers: u32,
    /// Small matrices (256-wide layers) instead of llama3-8b's: the sanitizer run.
    pub small: bool,
    pub ns_precision: NsPrecision,
    /// The Newton–Schulz iteration (`muon_ns_method`).
    pub ns_method: NsMethod,
    pub warmup_steps: u32,
    pub whole_steps: u32,
    /// The profile that prices every work.
    pub hardware: Hardware,
}

const ARGS: StepArgs = StepArgs {
    lr: 0.02,
    weight_decay: 0.1,
    adam_lr: 3e-4,
    adam_weight_decay: 0.1,
    overrides: StepOverrides::NONE,
};

/// Host waits of the measurement (a whole 8b-like step takes well under a second).
const TIMEOUT: Duration = Duration::from_secs(120);

fn cuda(call: &str) -> impl FnOnce(cudarc::driver::DriverError) -> Error + '_ {
    move |e| Error::new(ErrorKind::CudaError, format!("{call}: {e:?}"))
}

/// A param of the measured model: name, shape, `ParamFlags` bits.
type Param = (String, Vec<u64>, u32);

/// One layer's params and the params beside the layers.
fn model(small: bool) -> (Vec<Param>, Vec<Param>) {
    let (h, kv, ffn, vocab) = if small {
        (256, 64, 896, 1024)
    } else {
        (4096, 1024, 14336, 16384)
    };
    let layer = vec![
        ("q_proj".to_string(), vec![h, h], 0),
        ("k_proj".to_string(), vec![kv, h], 0),
        ("v_proj".to_string(), vec![kv, h], 0),
        ("o_proj".to_string(), vec![h, h], ParamFlags::MXFP8),
        ("gate_proj".to_string(), vec![ffn, h], 0),
        ("up_proj".to_string(), vec![ffn, h], 0),
        ("down_proj".to_string(), vec![h, ffn], 0),
        ("input_norm".to_string(), vec![h], 0),
        ("post_attention_norm".to_string(), vec![h], 0),
    ];
    let other = vec![
        ("embedding".to_string(), vec![vocab, h], ParamFlags::EMBEDDING_OR_OUTPUT),
        ("final_norm".to_string(), vec![h], 0),
    ];
    (layer, other)
}

fn specs(opts: &Options) -> (Vec<ParamSpec>, Workload) {
    let (layer, other) = model(opts.small);
    let mut specs = Vec::new();
    let spec = |name: String, shape: &[u64], flags: u32| {
        let mut s = ParamSpec::new(name, shape, Dtype::Bf16);
        s.flags = ParamFlags(flags);
        s
    };
    specs.push(spec("embedding".into(), &other[0].1, other[0].2));
    for l in 0..opts.layers {
        for (name, shape, flags) in &layer {
            specs.push(spec(format!("layers.{l}.{name}.weight"), shape, *flags));
        }
    }
    specs.push(spec("final_norm.weight".into(), &other[1].1, other[1].2));
    let shapes = |list: &[Param]| list.iter().map(|(n, s, _)| (n.clone(), s.clone())).collect();
    let workload = Workload {
        layers: opts.layers,
        layer_params: shapes(&layer),
        other_params: shapes(&other),
        elements: specs.iter().map(ParamSpec::numel).sum(),
        ns_precision: opts.ns_precision.name().to_string(),
        ns_method: opts.ns_method.name().to_string(),
        grad_dtype: Config::default().grad_dtype.name().to_string(),
        warmup_steps: opts.warmup_steps,
        whole_steps: opts.whole_steps,
    };
    (specs, workload)
}

/// Deterministic values in [-1, 1), the gradients of every step.
fn noise(n: u64) -> Vec<f32> {
    let mut rng = SplitMix64::new(0x6d75_6f6e);
    (0..n).map(|_| rng.uniform()).collect()
}

/// zero_grad, every bucket waited for, every gradient written (before the timed steps).
fn load_grads(rt: &mut Runtime, grads: &[f32]) -> Result<()> {
    rt.zero_grad()?;
    for b in 0..rt.plan().buckets.len() as u32 {
        rt.wait_params(b)?;
    }
    for p in 0..rt.plan().params.len() {
        let placement = &rt.plan().params[p];
        let span = Span::new(Mem::Grad(placement.buffer), placement.offset, placement.numel);
        let numel = placement.numel as usize;
        rt.backend_mut().upload(span, &grads[..numel])?;
    }
    Ok(())
}

/// The timed window: every grad ready in backward order, the step, every bucket's params back.
fn step(rt: &mut Runtime) -> Result<()> {
    for p in (0..rt.plan().params.len() as u32).rev() {
        rt.grad_ready(p)?;
    }
    rt.step(Some(&ARGS))?;
    for b in 0..rt.plan().buckets.len() as u32 {
        rt.wait_params(b)?;
    }
    Ok(())
}

/// Two timing events on the caller's stream.
struct Window {
    start: cu::CUevent,
    end: cu::CUevent,
}

impl Window {
    fn new() -> Result<Window> {
        let mut w = Window {
            start: std::ptr::null_mut(),
            end: std::ptr::null_mut(),
        };
        for event in [&mut w.start, &mut w.end] {
            // SAFETY: out-parameter in the context bound to this thread.
            driver_check(|| "cuEventCreate".into(), unsafe { cu::cuEventCreate(event, 0) })?;
        }
        Ok(w)
    }

    fn record(event: cu::CUevent, stream: cu::CUstream) -> Result<()> {
        // SAFETY: our event on the caller's live stream.
        driver_check(|| "cuEventRecord".into(), unsafe { cu::cuEventRecord(event, stream) })
    }

    /// Milliseconds between the two events, once the stream has synchronized.
    fn ms(&self) -> Result<f64> {
        let elapsed = elapsed_time()?;
        let mut ms = 0.0f32;
        // SAFETY: both events recorded and complete.
        driver_check(|| "cuEventElapsedTime".into(), unsafe {
            elapsed(&mut ms, self.start, self.end)
        })?;
        Ok(f64::from(ms))
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        for event in [self.start, self.end] {
            if !event.is_null() {
                // SAFETY: created by `new`, destroyed once.
                unsafe { cu::cuEventDestroy_v2(event) };
            }
        }
    }
}

fn device_info(ctx: &CudaContext) -> Result<DeviceInfo> {
    let (major, minor) = ctx.compute_capability().map_err(cuda("cuDeviceGetAttribute"))?;
    let sms = ctx
        .attribute(cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(cuda("cuDeviceGetAttribute"))?;
    let mut version = 0;
    // SAFETY: plain out-parameter.
    driver_check(|| "cuDriverGetVersion".into(), unsafe {
        cu::cuDriverGetVersion(&mut version)
    })?;
    Ok(DeviceInfo {
        name: ctx.name().map_err(cuda("cuDeviceGetName"))?,
        compute_capability: format!("{major}.{minor}"),
        sms: sms as u32,
        memory_gib: ctx.total_mem().map_err(cuda("cuDeviceTotalMem"))? as f64 / (1u64 << 30) as f64,
        driver_cuda: format!("{}.{}", version / 1000, version % 1000 / 10),
    })
}

/// Measures the step on device 0 (see the module docs). Fails with CudaNoDevice /
/// CudaUnavailable without a GPU, NcclUnavailable without libnccl.so.2.
pub fn measure(opts: &Options, date: String) -> Result<DeviceRun> {
    probe::device_count()?;
    let ctx = CudaContext::new(0).map_err(cuda("cuCtxCreate (device 0)"))?;
    ctx.bind_to_thread().map_err(cuda("cuCtxSetCurrent"))?;
    let device = device_info(&ctx)?;
    let stream = ctx.new_stream().map_err(cuda("cuStreamCreate"))?;
    let raw_stream: cu::CUstream = stream.cu_stream();
    let nccl = SingleRankComm::new()?;
    let comm = Communicator::new(Transport::Nccl(nccl.borrow()?));
    let cfg = Config {
        muon_ns_precision: opts.ns_precision,
        muon_ns_method: opts.ns_method,
        ..Config::default()
    };
    let (specs, workload) = specs(opts);
    let mut registry = Registry::default();
    for spec in &specs {
        registry.add(spec.clone(), &cfg)?;
    }
    let plan = build_plan(registry.params(), registry.routes(), &cfg, 1)?;
    let log: SharedLog = Arc::new(Mutex::new(TimingLog::default()));
    let executor = Timed::new(Device::new(comm.clone(), raw_stream, TIMEOUT)?, log.clone());
    let translator = Translator::new(0, 1, MuonOptions::from_config(&cfg));
    let backend = CudaBackend::with_executor(translator, executor)?;
    let mut rt = Runtime::new(Box::new(plan), specs.clone(), cfg, 0, Box::new(backend), |_| None)?;
    let grads = noise(specs.iter().map(ParamSpec::numel).max().unwrap_or(0));

    // The gradients are written once: a step reads them and leaves them as they are (one rank:
    // every reduction is the identity; no param is staged on them), so every step sees the
    // same values and no multi-GB upload sits between the timed steps.
    load_grads(&mut rt, &grads)?;
    for _ in 0..opts.warmup_steps {
        step(&mut rt)?;
    }
    rt.synchronize()?;
    let window = Window::new()?;
    let mut runs_ms = Vec::new();
    let mut host_ms = Vec::new();
    for _ in 0..opts.whole_steps {
        rt.synchronize()?;
        Window::record(window.start, raw_stream)?;
        let host = Instant::now();
        step(&mut rt)?;
        host_ms.push(host.elapsed().as_secs_f64() * 1e3);
        Window::record(window.end, raw_stream)?;
        rt.synchronize()?;
        runs_ms.push(window.ms()?);
    }
    rt.synchronize()?;
    let lock = || log.lock().unwrap_or_else(PoisonError::into_inner);
    lock().start();
    step(&mut rt)?;
    rt.synchronize()?;
    let (timings, counts, pending) = {
        let mut log = lock();
        log.stop();
        (log.take(), log.counts(), log.pending())
    };
    if pending > 0 {
        crate::bail!(Internal, "measure: {pending} timed actions were never synchronized");
    }
    drop(rt);

    let cost = CostModel::new(opts.hardware.clone(), 1);
    let price = |w: &Work| cost.work_seconds(w);
    let works: Vec<(Work, f64)> = timings
        .iter()
        .filter_map(|t| Work::of(&t.action).map(|w| (w, t.seconds)))
        .collect();
    let classes = op_classes(&works, &price);
    let predicted_ms = works.iter().filter_map(|(w, _)| price(w)).sum::<f64>() * 1e3;
    let references = references(comm, raw_stream, &classes, &cost)?;
    Ok(DeviceRun {
        schema_version: crate::SCHEMA_VERSION,
        date,
        status: "measured".to_string(),
        skipped: None,
        device: Some(device),
        workload: Some(workload),
        predicted_with: opts.hardware.name.clone(),
        step: Some(StepTime {
            measured_ms: super::median(runs_ms.clone()).unwrap_or(0.0),
            runs_ms,
            host_issue_ms: super::median(host_ms).unwrap_or(0.0),
            work_actions: counts.0,
            event_actions: counts.1,
            predicted_ms,
        }),
        op_classes: classes,
        references,
        environment: Default::default(),
        tests: Vec::new(),
        sanitizer: Vec::new(),
    })
}

/// Repetitions of each reference (after one untimed).
const REPETITIONS: u32 = 5;

/// The action that does `work` on scratch buffers `a`, `b`, `c` (`c` the output).
fn reference_action(work: &Work, a: DevPtr, b: DevPtr, c: DevPtr) -> Option<Action> {
    let stream = StreamKind::Compute;
    Some(match work {
        Work::Gemm {
            inputs,
            m,
            n,
            k,
            batch,
            accumulate,
            panels: 0,
        } => Action::Gemm(Gemm {
            inputs: if inputs == "f32" {
                GemmInputs::F32
            } else {
                GemmInputs::Bf16
            },
            transpose_a: false,
            m: *m as i32,
            n: *n as i32,
            k: *k as i32,
            alpha: 1.0,
            lda: *m as i32,
            ldb: *k as i32,
            beta: if *accumulate { 1.0 } else { 0.0 },
            ldc: *m as i32,
            batch: *batch as i32,
            matrices: Matrices::Strided {
                a,
                stride_a: (m * k) as i64,
                b,
                stride_b: (k * n) as i64,
                c,
                stride_c: (m * n) as i64,
            },
        }),
        Work::Copy { bytes } => Action::CopyDevice {
            dst: c,
            src: a,
            bytes: *bytes,
            stream,
        },
        Work::Memset { bytes } => Action::Zero {
            dst: c,
            bytes: *bytes,
            stream,
        },
        Work::Gemm { .. } | Work::Kernel { .. } | Work::Collective { .. } => return None,
    })
}

/// Bytes of the three scratch buffers `work` needs.
fn scratch_bytes(work: &Work) -> [u64; 3] {
    match work {
        Work::Gemm {
            inputs, m, n, k, batch, ..
        } => {
            let size = if inputs == "f32" { 4 } else { 2 };
            [m * k * batch * size, k * n * batch * size, m * n * batch * 4]
        }
        Work::Copy { bytes } => [*bytes, 0, *bytes],
        Work::Memset { bytes } => [0, 0, *bytes],
        Work::Kernel { .. } | Work::Collective { .. } => [0; 3],
    }
}

fn references(
    comm: Arc<Communicator>,
    stream: cu::CUstream,
    classes: &[super::OpClass],
    cost: &CostModel,
) -> Result<Vec<Reference>> {
    let mut device = Device::new(comm, stream, TIMEOUT)?;
    let gib = 1u64 << 30;
    let mut works: Vec<(String, Work)> = vec![
        reference_gemm(),
        ("device-to-device copy 1 GiB".into(), Work::Copy { bytes: gib }),
        ("memset 1 GiB".into(), Work::Memset { bytes: gib }),
    ];
    for class in classes {
        for w in &class.works {
            // A listed batch of tiles is timed in the step only (its lists live there).
            if let Work::Gemm { panels: 0, .. } = w.work {
                works.push((
                    format!("cuBLAS {}", w.work.class().trim_start_matches("gemm "),),
                    w.work.clone(),
                ));
            }
        }
    }
    let mut out = Vec::new();
    for (name, work) in works {
        let [a, b, c] = scratch_bytes(&work);
        let mut ptrs = [0; 3];
        for (i, (bytes, buf)) in [(a, Scratch::X), (b, Scratch::Gram), (c, Scratch::Update)]
            .into_iter()
            .enumerate()
        {
            device.run(
                &[Action::Alloc {
                    buf: Buf::Work(buf),
                    bytes,
                }],
                &mut |_, ptr, _| ptrs[i] = ptr,
            )?;
        }
        let Some(action) = reference_action(&work, ptrs[0], ptrs[1], ptrs[2]) else {
            continue;
        };
        device.run(std::slice::from_ref(&action), &mut |_, _, _| {})?;
        let from = device.mark(StreamKind::Compute)?;
        for _ in 0..REPETITIONS {
            device.run(std::slice::from_ref(&action), &mut |_, _, _| {})?;
        }
        let to = device.mark(StreamKind::Compute)?;
        device.run(&[Action::Synchronize(StreamKind::Compute)], &mut |_, _, _| {})?;
        let seconds = device.take_seconds(from, to)? / f64::from(REPETITIONS);
        let (achieved, unit) = match work {
            Work::Gemm { .. } => (work.flops() / seconds / 1e12, "TFLOP/s"),
            _ => (work.bytes() as f64 / seconds / 1e9, "GB/s"),
        };
        out.push(Reference {
            name,
            predicted_ms: cost.work_seconds(&work).map(|s| s * 1e3),
            work,
            repetitions: REPETITIONS,
            measured_ms: seconds * 1e3,
            achieved,
            unit: unit.to_string(),
        });
    }
    Ok(out)
}

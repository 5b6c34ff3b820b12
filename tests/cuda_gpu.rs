//! The cuda backend on a real GPU against the host backend (`cargo test --features gpu-tests`).
//! Needs a CUDA driver and device, libnccl.so.2, NVRTC 13 and cuBLAS 13 on LD_LIBRARY_PATH;
//! without them every test prints a SKIPPED notice and passes. One rank: a 1-rank NCCL
//! communicator made with `ncclCommInitRank` (`nccl::SingleRankComm`, as `muon-opt measure` uses).
//!
//! Expected: element-wise kernels, the gradient-norm skip decision and MXFP8 bytes bit for
//! bit; Newton–Schulz (cuBLAS) within tolerance; the golden Newton–Schulz vectors of
//! `tests/data/golden/ns` within f32 accuracy.

#![cfg(feature = "gpu-tests")]

mod support;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use cudarc::driver::CudaContext;
use cudarc::driver::sys as cu;
use muon_opt::backend::Backend;
use muon_opt::backend::cuda::nccl::SingleRankComm;
use muon_opt::backend::cuda::{CallerStream, CudaBackend, Groups, probe};
use muon_opt::backend::ops::{
    BufferSizes, EventId, Mem, MemoryLayout, MuonJob, MuonWork, NormSums, NormTerm, Span, StepConstants, StreamKind,
};
use muon_opt::comm::{Communicator, Transport};
use muon_opt::config::{CoefficientSet, CommMode, Config, Dtype, NsMethod, NsPrecision, ScaleMode};
use muon_opt::error::ErrorKind;
use muon_opt::init_data::InitData;
use muon_opt::model::{ParamSpec, Route};
use muon_opt::numerics::muon::{MuonOptions, muon_scale};
use muon_opt::numerics::mxfp8::{Direction, ScaleLayout, scale_shape};
use muon_opt::numerics::newton_schulz::NsOptions;
use muon_opt::numerics::step_args::ParamScales;
use muon_opt::optimizer::Optimizer;
use muon_opt::schedule::Runtime;
use serde_json::Value;
use support::cuda::{cuda_model, elementwise_script, host_backend, iterate, runtime};
use support::golden;
use support::ranks::optimizers;
use support::training::{ARGS, bits, init_values, model, rank_grad};

/// One GPU test at a time (one device, one NCCL communicator each).
static SERIAL: Mutex<()> = Mutex::new(());

/// The device context (bound to this thread) and a 1-rank NCCL communicator on it.
struct Gpu {
    ctx: Arc<CudaContext>,
    nccl: SingleRankComm,
    _serial: MutexGuard<'static, ()>,
}

fn gpu(test: &str) -> Option<Gpu> {
    let serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    if let Err(e) = probe::device_count() {
        eprintln!("SKIPPED {test}: {}", e.message);
        return None;
    }
    let ctx = CudaContext::new(0).expect("device 0");
    ctx.bind_to_thread().expect("bind the context");
    let nccl = match SingleRankComm::new() {
        Ok(nccl) => nccl,
        Err(e) if e.kind == ErrorKind::NcclUnavailable => {
            eprintln!(
                "SKIPPED {test}: {} (put NCCL's lib directory on LD_LIBRARY_PATH)",
                e.message
            );
            return None;
        }
        Err(e) => panic!("a one-rank NCCL communicator: {e}"),
    };
    Some(Gpu {
        ctx,
        nccl,
        _serial: serial,
    })
}

impl Gpu {
    fn communicator(&self) -> Arc<Communicator> {
        Communicator::new(Transport::Nccl(self.nccl.borrow().unwrap()))
    }

    fn backend(&self, cfg: &Config, stream: CallerStream) -> CudaBackend {
        CudaBackend::new(
            self.communicator(),
            Groups::default(),
            stream,
            MuonOptions::from_config(cfg),
            Duration::from_secs(60),
        )
        .unwrap()
    }
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Casts in every direction, scaling of f32 and bf16, memset, bf16 staging: bit for bit.
#[test]
fn elementwise_ops_are_bitwise_equal_to_the_host_backend() {
    let Some(gpu) = gpu("elementwise_ops_are_bitwise_equal_to_the_host_backend") else {
        return;
    };
    let cfg = Config::default();
    let specials = [
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        f32::from_bits(1),
        f32::from_bits(0x3F80_8000),
        f32::from_bits(0x3F81_8000),
        f32::MAX,
        1e-40,
    ];
    let (host, h) = elementwise_script(&mut host_backend(&cfg), 4096, &specials);
    let (cuda, c) = elementwise_script(&mut gpu.backend(&cfg, CallerStream::NULL), 4096, &specials);
    assert_eq!(host, cuda);
    assert_eq!(
        h.to_bits(),
        c.to_bits(),
        "gradient norm {h} vs {c}: the exact sums must agree"
    );
}

/// The most two runs' Muon masters can drift apart in four steps when each run's Newton–Schulz
/// stays within `ns_bound` of the f64 truth (elementwise): two results up to `2 ns_bound` apart
/// per update, each update applied with lr · scale, spectral scales ≤ √3 (`cuda_model`'s
/// 48 × 16 components). The GPU runs of 2026-11-28 (bench/device/) differed by 1.86e-5 with
/// f32 iterations (bound 2.8e-5) and by 6.8e-3 with bf16 Gram iterations (bound 1.4e-2).
fn muon_drift_bound(ns_bound: f64) -> f32 {
    (4.0 * f64::from(ARGS.lr) * 3f64.sqrt() * 2.0 * ns_bound) as f32
}

/// dp=1 optimizer runs on the cuda backend and on the host backend: AdamW state, AdamW params
/// and the MXFP8 bytes of AdamW params bit for bit at every step (clipping off, so the norm's
/// summation order cannot reach them); Muon within `muon_drift_bound(ns_bound)`.
fn compare_runs(gpu: &Gpu, label: &str, cfg: &Config, specs: &[ParamSpec], ns_bound: f64) {
    let tolerance = muon_drift_bound(ns_bound);
    let stream = gpu.ctx.new_stream().unwrap();
    let mut host = runtime(cfg, specs, 0, 1, Box::new(host_backend(cfg)));
    let backend = gpu.backend(cfg, CallerStream(stream.cu_stream().cast()));
    let mut cuda = runtime(cfg, specs, 0, 1, Box::new(backend));
    // ‖Δw‖ between the runs' params: the next step's grads (`rank_grad`: noise + 0.05 w) differ
    // by 0.05 ‖Δw‖, and once they differ a bf16 grad buffer may round them apart by one ulp each.
    let mut param_distance = 0.0f64;
    let grad_rounding = if cfg.grad_dtype == Dtype::Bf16 {
        2f64.powi(-8)
    } else {
        0.0
    };
    for step in 0..4 {
        let nan = step == 2;
        let (a, b) = (iterate(&mut host, 0, step, nan), iterate(&mut cuda, 0, step, nan));
        assert_eq!((a.skipped, a.step), (b.skipped, b.step), "{label}: step {step}");
        if !a.skipped {
            // The summation order alone (equal grads) moves the norm by far less than 1e-6.
            let bound = if param_distance == 0.0 {
                1e-6 * a.grad_norm
            } else {
                0.05 * param_distance + (grad_rounding + 1e-6) * a.grad_norm
            };
            assert!(
                (a.grad_norm - b.grad_norm).abs() <= bound,
                "{label}: step {step} grad norm {} vs {} (bound {bound}: params {param_distance} apart)",
                a.grad_norm,
                b.grad_norm
            );
        }
        let (sa, sb) = (host.owned_state().unwrap(), cuda.owned_state().unwrap());
        for (x, y) in sa.iter().zip(&sb) {
            let spec = &specs[x.param as usize];
            let arrays = std::iter::once((&x.master, &y.master)).chain(x.moments.iter().zip(&y.moments));
            for (k, (u, v)) in arrays.enumerate() {
                if spec.route() == Route::Adamw {
                    assert_eq!(bits(u), bits(v), "{label}: step {step} {} array {k}", spec.name);
                } else {
                    let d = max_abs_diff(u, v);
                    assert!(
                        d <= tolerance,
                        "{label}: step {step} {} array {k} differs by {d}",
                        spec.name
                    );
                }
            }
        }
        param_distance = (0..specs.len())
            .flat_map(|p| {
                let (u, v) = (host.param_values(p).unwrap(), cuda.param_values(p).unwrap());
                u.into_iter().zip(v).map(|(x, y)| (f64::from(x) - f64::from(y)).powi(2))
            })
            .sum::<f64>()
            .sqrt();
        for (p, spec) in specs.iter().enumerate() {
            let (u, v) = (host.param_values(p).unwrap(), cuda.param_values(p).unwrap());
            if spec.route() != Route::Adamw {
                let d = max_abs_diff(&u, &v);
                let bf16_ulp = u.iter().fold(0.0f32, |m, x| m.max(x.abs())) / 128.0;
                assert!(
                    d <= tolerance + bf16_ulp,
                    "{label}: step {step} param {} differs by {d}",
                    spec.name
                );
                continue;
            }
            assert_eq!(bits(&u), bits(&v), "{label}: step {step} param {}", spec.name);
            if let (Some(h), Some(c)) = (host.mxfp8_addresses(p), cuda.mxfp8_addresses(p)) {
                let (rows, cols) = spec.flat_2d();
                let (rows, cols) = (rows as usize, cols as usize);
                let size = |d| {
                    let (r, c) = scale_shape(rows, cols, d);
                    r * c
                };
                let sizes = [
                    rows * cols,
                    size(Direction::Rowwise),
                    rows * cols,
                    size(Direction::Colwise),
                ];
                for ((h, c), len) in h.iter().zip(c).zip(sizes) {
                    let mut device = vec![0u8; len];
                    // SAFETY: `len` bytes of the backend's MXFP8 storage, streams synchronized.
                    unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut device, c as u64) }.unwrap();
                    // SAFETY: host MXFP8 storage of `len` bytes.
                    let host_bytes = unsafe { std::slice::from_raw_parts(*h, len) };
                    assert_eq!(host_bytes, &device[..], "{label}: MXFP8 bytes of {}", spec.name);
                }
            }
        }
    }
}

#[test]
fn optimizer_runs_match_the_host_backend() {
    let Some(gpu) = gpu("optimizer_runs_match_the_host_backend") else {
        return;
    };
    let base = Config {
        bucket_size: 4096,
        host_comm_mode: CommMode::Eager,
        clip_grad: 0.0,
        ..Config::default()
    };
    let f32_ns = Config {
        muon_ns_precision: NsPrecision::F32,
        ..base.clone()
    };
    // Each Newton–Schulz bound is the golden test's for its precision, host and device alike.
    compare_runs(&gpu, "f32 NS", &f32_ns, &cuda_model(), NS_F32_BOUND);
    // The Gram iteration (wide matrices, expert stacks, fused components; the square ones
    // standard) against the host's, each product on cuBLAS.
    let gram = Config {
        muon_ns_method: NsMethod::Gram,
        ..base.clone()
    };
    compare_runs(&gpu, "gram bf16 NS", &gram, &cuda_model(), golden::NS_BF16_BOUND);
    let mxfp8 = Config {
        mxfp8_param_gather: true,
        mxfp8_swizzled_scales: true,
        grad_dtype: Dtype::Bf16,
        ..base
    };
    compare_runs(
        &gpu,
        "bf16 NS, MXFP8 gather",
        &mxfp8,
        &cuda_model(),
        golden::NS_BF16_BOUND,
    );
}

/// Through the optimizer: create on the NCCL communicator and a caller stream, finalize (plan
/// hash all-gathered with NCCL), device pointers in the views, grads written by the "framework"
/// with cuMemcpyHtoD, three steps; the AdamW params equal the host optimizer's bit for bit.
#[test]
fn the_optimizer_runs_on_the_caller_stream_and_communicator() {
    let Some(gpu) = gpu("the_optimizer_runs_on_the_caller_stream_and_communicator") else {
        return;
    };
    let cfg = Config {
        bucket_size: 4096,
        clip_grad: 0.0,
        ..Config::default()
    };
    let specs = model();
    let stream = gpu.ctx.new_stream().unwrap();
    let mut cuda = Optimizer::new(
        cfg.clone(),
        gpu.communicator().claim().unwrap(),
        CallerStream(stream.cu_stream().cast()),
    )
    .unwrap();
    let mut host = optimizers(&cfg, 1, Duration::from_secs(20)).remove(0);
    for opt in [&mut cuda, &mut host] {
        for (p, spec) in specs.iter().enumerate() {
            opt.add_param(spec.clone(), Some(InitData::from_f32(&init_values(p, spec.numel()))))
                .unwrap();
        }
        opt.finalize().unwrap();
    }
    for step in 0..3 {
        for (is_cuda, opt) in [(true, &mut cuda), (false, &mut host)] {
            opt.zero_grad().unwrap();
            for p in (0..specs.len()).rev() {
                let seen = opt.running().unwrap().param_values(p).unwrap();
                let grad = rank_grad(step, 0, p, &seen);
                let ptr = opt.running().unwrap().address(p, true);
                if is_cuda {
                    stream.synchronize().unwrap();
                    // SAFETY: the device grad view of param p holds numel f32 values.
                    unsafe { cudarc::driver::result::memcpy_htod_sync(ptr as u64, &grad) }.unwrap();
                } else {
                    // SAFETY: the host grad view of param p holds numel f32 values.
                    unsafe { std::slice::from_raw_parts_mut(ptr.cast::<f32>(), grad.len()) }.copy_from_slice(&grad);
                }
                opt.grad_ready(p as u32).unwrap();
            }
            assert!(!opt.step(&ARGS).unwrap().skipped);
            opt.synchronize().unwrap();
        }
        for (p, spec) in specs.iter().enumerate() {
            let (a, b) = (
                host.running().unwrap().param_values(p).unwrap(),
                cuda.running().unwrap().param_values(p).unwrap(),
            );
            if spec.route() == Route::Adamw {
                assert_eq!(bits(&a), bits(&b), "step {step}: {}", spec.name);
            } else {
                assert!(max_abs_diff(&a, &b) < 2e-2, "step {step}: {}", spec.name);
            }
        }
    }
}

/// The golden Newton–Schulz vectors (optax, f64 truth) through `muon_update` with momentum 0,
/// weight decay 0, lr 1 and zero masters, so the new master is `−scale·NS(G)`.
#[test]
fn newton_schulz_matches_the_golden_vectors() {
    let Some(gpu) = gpu("newton_schulz_matches_the_golden_vectors") else {
        return;
    };
    let manifest: Value = serde_json::from_slice(&golden::read("manifest.json")).unwrap();
    for case in manifest["ns"].as_array().unwrap() {
        let (rows, cols) = (
            case["rows"].as_u64().unwrap() as usize,
            case["cols"].as_u64().unwrap() as usize,
        );
        let coefficients = match case["coefficients"].as_str().unwrap() {
            "simple" => CoefficientSet::Simple,
            _ => CoefficientSet::Quintic,
        };
        let input = golden::read_f32(case["input_f32"].as_str().unwrap());
        let truth = golden::read_f64(case["output_f64"].as_str().unwrap());
        // The default tile (the test matrices, of order ≤ 128, are one product) and tiles of
        // 16 (the tile lists written by `muon_gemm_tile_tables`, read by `cublasGemmBatchedEx`).
        let runs = [
            (NsPrecision::F32, NS_F32_BOUND),
            (NsPrecision::Bf16, golden::NS_BF16_BOUND),
        ]
        .into_iter()
        .flat_map(|run| [muon_opt::config::DEFAULT_SYMMETRIC_TILE, 16].map(|tile| (run, tile)));
        for ((precision, tolerance), symmetric_tile) in runs {
            let muon = MuonOptions {
                nesterov: false,
                ns: NsOptions {
                    coefficients,
                    custom: muon_opt::numerics::newton_schulz::CustomCoefficients::NONE,
                    steps: case["steps"].as_u64().unwrap() as u32,
                    precision,
                    eps: muon_opt::config::DEFAULT_NS_EPS,
                    symmetric_tile,
                    method: NsMethod::Standard,
                },
                scale_mode: ScaleMode::Spectral,
                extra_scale_factor: 1.0,
                ..MuonOptions::from_config(&Config::default())
            };
            let n = (rows * cols) as u64;
            let mut backend = CudaBackend::new(
                gpu.communicator(),
                Groups::default(),
                CallerStream::NULL,
                muon,
                Duration::from_secs(60),
            )
            .unwrap();
            backend
                .allocate(&MemoryLayout {
                    buffers: vec![BufferSizes::whole(n, Dtype::F32)],
                    grad_dtype: Dtype::F32,
                    master: n,
                    momentum: n,
                    momentum_dtype: muon_opt::config::Dtype::F32,
                    moment2: 0,
                    adam_moments: 0,
                    max_component: (rows * cols, rows.min(cols)),
                    muon_work: MuonWork::of_job(&[rows], cols, 1, &muon.ns),
                    tp_components: Vec::new(),
                    mxfp8: Vec::new(),
                    mxfp8_scale_layout: ScaleLayout::Compact,
                })
                .unwrap();
            backend.upload(Span::new(Mem::Grad(0), 0, n), &input).unwrap();
            let job = MuonJob {
                master: Span::new(Mem::Master, 0, n),
                momentum: Span::new(Mem::Momentum, 0, n),
                moment2: Span::new(Mem::Moment2, 0, 0),
                grad: Span::new(Mem::Grad(0), 0, n),
                rows,
                cols,
                split_rows: Vec::new(),
                split_groups: 1,
                tp: None,
                scales: ParamScales {
                    lr_scale: 1.0,
                    wd_scale: 1.0,
                },
            };
            // The step's scalars as a step derives them: lr 1, no decay, no clip (scale 1),
            // momentum 0.
            backend
                .set_step_args([1.0, 0.0, 0.0, 0.0, 0.0, 0.9, 0.999, 1e-8, 0.0])
                .unwrap();
            backend.squared_norm(vec![job.grad], Vec::new()).unwrap();
            backend.record(StreamKind::Compute, EventId(0)).unwrap();
            backend.wait(StreamKind::Comm, EventId(0)).unwrap();
            backend.gather_norm_sums().unwrap();
            backend.record(StreamKind::Comm, EventId(1)).unwrap();
            backend.wait(StreamKind::Compute, EventId(1)).unwrap();
            let constants = StepConstants { clip_grad: 0.0 };
            let own = NormTerm {
                sums: NormSums::Own,
                ..backend.norm_term().unwrap()
            };
            backend.finish_step(&constants, &[own]).unwrap();
            backend.muon_update(job.clone()).unwrap();
            let scale = muon_scale(ScaleMode::Spectral, rows, cols, 1.0);
            let out = backend.download(Span::new(Mem::Master, 0, n)).unwrap();
            let worst = out
                .iter()
                .zip(&truth)
                .map(|(&w, &t)| (f64::from(-w / scale) - t).abs())
                .fold(0.0f64, f64::max);
            assert!(
                worst < tolerance,
                "{rows}x{cols} {coefficients:?} {precision:?} tiles of {symmetric_tile}: max error {worst} vs the f64 truth"
            );
        }
    }
}

/// Largest element error of the device's f32 Newton–Schulz against the golden f64 truth (the
/// host stays within 1e-5: `numerics_newton_schulz.rs`; cuBLAS sums in another order).
const NS_F32_BOUND: f64 = 1e-4;

/// Device gradients of every param of `specs` (f32), uploaded once: the "backward" of the
/// capture test copies them into the grad buffer on the caller's stream, as a framework's
/// backward kernels would write it.
struct DeviceGrads(Vec<(u64, usize)>);

impl DeviceGrads {
    fn new(specs: &[ParamSpec]) -> Self {
        let grads = specs
            .iter()
            .enumerate()
            .map(|(p, spec)| {
                let values = rank_grad(1, 0, p, &vec![0.5; spec.numel() as usize]);
                let bytes = values.len() * 4;
                let mut ptr = 0;
                // SAFETY: a fresh allocation of `bytes`, filled from `values` (same length).
                unsafe {
                    assert_eq!(cu::cuMemAlloc_v2(&mut ptr, bytes), cu::CUresult::CUDA_SUCCESS);
                    assert_eq!(
                        cu::cuMemcpyHtoD_v2(ptr, values.as_ptr().cast(), bytes),
                        cu::CUresult::CUDA_SUCCESS
                    );
                }
                (ptr, bytes)
            })
            .collect();
        DeviceGrads(grads)
    }

    /// Copies every gradient into its grad view on `stream`, then marks it ready.
    fn backward(&self, rt: &mut Runtime, stream: cu::CUstream) {
        for p in (0..self.0.len()).rev() {
            let (src, bytes) = self.0[p];
            let dst = rt.address(p, true) as u64;
            // SAFETY: device ranges of `bytes` each (the grad view of param p is f32 here).
            let status = unsafe { cu::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream) };
            assert_eq!(status, cu::CUresult::CUDA_SUCCESS);
            rt.grad_ready(p as u32).unwrap();
        }
    }
}

impl Drop for DeviceGrads {
    fn drop(&mut self) {
        for &(ptr, _) in &self.0 {
            // SAFETY: our allocations, freed once.
            unsafe { cu::cuMemFree_v2(ptr) };
        }
    }
}

/// One iteration captured in a CUDA graph by the protocol of `muon_optimizer_join` (step
/// with preset arguments, zero_grad, forward waits, backward, join) and replayed three times
/// leaves every param bit for bit as three eager iterations do.
#[test]
fn a_captured_iteration_replays_bitwise_like_eager_ones() {
    let Some(gpu) = gpu("a_captured_iteration_replays_bitwise_like_eager_ones") else {
        return;
    };
    let cfg = Config {
        bucket_size: 4096,
        grad_dtype: Dtype::F32,
        ..Config::default()
    };
    let specs = cuda_model();
    let grads = DeviceGrads::new(&specs);
    let run = |capture: bool| -> Vec<Vec<u32>> {
        let stream = gpu.ctx.new_stream().unwrap();
        let raw: cu::CUstream = stream.cu_stream();
        let mut rt = runtime(
            &cfg,
            &specs,
            0,
            1,
            Box::new(gpu.backend(&cfg, CallerStream(raw.cast()))),
        );
        rt.set_step_args(&ARGS).unwrap();
        rt.zero_grad().unwrap();
        grads.backward(&mut rt, raw);
        rt.join().unwrap();
        let region = |rt: &mut Runtime| {
            rt.step(None).unwrap();
            rt.zero_grad().unwrap();
            for b in 0..rt.plan().buckets.len() as u32 {
                rt.wait_params(b).unwrap();
            }
            grads.backward(rt, raw);
            rt.join().unwrap();
        };
        if capture {
            let (mut graph, mut exec) = (std::ptr::null_mut(), std::ptr::null_mut());
            // SAFETY: capture on our stream; the graph and its instance are destroyed below.
            unsafe {
                let mode = cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
                assert_eq!(cu::cuStreamBeginCapture_v2(raw, mode), cu::CUresult::CUDA_SUCCESS);
                region(&mut rt);
                assert_eq!(cu::cuStreamEndCapture(raw, &mut graph), cu::CUresult::CUDA_SUCCESS);
                assert_eq!(
                    cu::cuGraphInstantiateWithFlags(&mut exec, graph, 0),
                    cu::CUresult::CUDA_SUCCESS
                );
                for _ in 0..3 {
                    assert_eq!(cu::cuGraphLaunch(exec, raw), cu::CUresult::CUDA_SUCCESS);
                }
            }
            rt.synchronize().unwrap();
            // SAFETY: created above, destroyed once after the replays finished.
            unsafe {
                cu::cuGraphExecDestroy(exec);
                cu::cuGraphDestroy(graph);
            }
        } else {
            for _ in 0..3 {
                region(&mut rt);
            }
            rt.synchronize().unwrap();
        }
        assert_eq!(rt.step_info().unwrap().step, 3, "capture {capture}: steps taken");
        (0..specs.len()).map(|p| bits(&rt.param_values(p).unwrap())).collect()
    };
    assert!(
        run(false) == run(true),
        "the replayed graph differs from eager iterations"
    );
}

/// `muon-opt measure`'s pipeline on the GPU (small layers), standard and Gram Newton–Schulz:
/// every work action of the timed step has a positive device time, the classes cover the
/// Newton–Schulz GEMMs and the optimizer's kernels (the Gram iteration's too), and every
/// reference ran.
#[test]
fn the_measured_step_times_every_work_action() {
    let Some(gpu) = gpu("the_measured_step_times_every_work_action") else {
        return;
    };
    drop(gpu.nccl);
    for method in [NsMethod::Standard, NsMethod::Gram] {
        let opts = muon_opt::measure::step::Options {
            layers: 2,
            small: true,
            ns_precision: NsPrecision::Bf16,
            ns_method: method,
            warmup_steps: 1,
            whole_steps: 2,
            hardware: muon_opt::sim::profile::builtin("h100-nvlink").unwrap(),
        };
        let run = muon_opt::measure::step::measure(&opts, "test".into()).unwrap();
        assert_eq!(run.workload.as_ref().unwrap().ns_method, method.name());
        let step = run.step.as_ref().unwrap();
        assert!(step.measured_ms > 0.0 && step.runs_ms.len() == 2, "{step:?}");
        assert!(step.work_actions > 0 && step.event_actions > 0, "{step:?}");
        let timed: u64 = run.op_classes.iter().map(|c| c.count).sum();
        assert_eq!(timed, step.work_actions, "every work action timed once");
        for class in &run.op_classes {
            if !class.class.starts_with("nccl") {
                assert!(class.measured_ms > 0.0, "{}: {} ms", class.class, class.measured_ms);
            }
        }
        // The Gram iteration runs on the wide matrices (k, v, gate, up, down).
        let gram = (method == NsMethod::Gram).then_some("kernel muon_ns_add_identity");
        for expected in [
            "kernel muon_adamw",
            "kernel muon_momentum",
            "kernel muon_mxfp8_quantize_bf16",
        ]
        .into_iter()
        .chain(gram)
        {
            assert!(
                run.op_classes.iter().any(|c| c.class == expected),
                "{method:?}: {expected} not timed"
            );
        }
        assert!(run.op_classes.iter().any(|c| c.class.starts_with("gemm bf16")));
        assert!(run.references.iter().all(|r| r.measured_ms > 0.0 && r.achieved > 0.0));
    }
}

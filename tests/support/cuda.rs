//! Shared by the cuda backend tests: builds a rank's `Runtime` on any backend and drives
//! iterations through the backend ops only (gradients are written with `Backend::upload`,
//! so the same driver works on host memory, on virtual device addresses and on a GPU), and
//! the one-rank host backend the cuda backend is compared with.

use muon_opt::backend::Backend;
use muon_opt::backend::host::comm::HostGroup;
use muon_opt::backend::host::executor::HostBackend;
use muon_opt::backend::ops::{BufferSizes, Mem, Span};
use muon_opt::comm::{Communicator, Transport};
use muon_opt::config::{CommMode, Config};
use muon_opt::init_data::InitData;
use muon_opt::model::{ParamFlags, ParamSpec, Registry};
use muon_opt::numerics::muon::MuonOptions;
use muon_opt::plan::build_plan;
use muon_opt::schedule::{Runtime, StepInfo};

use super::ranks::TIMEOUT;
use super::rng::noise;
use super::training::{ARGS, bits, init_values, model, rank_grad};

/// The common test model plus fused matrices with non-square components (wide, and tall so
/// they are orthogonalized transposed; both run as strided batches), a GDN-shaped split with
/// tiny β/α blocks, and MXFP8 params (a fused Muon matrix and an AdamW matrix).
pub fn cuda_model() -> Vec<ParamSpec> {
    let mut params = model();
    let mut wide = ParamSpec::new("fused.wide.weight", &[64, 48], muon_opt::config::Dtype::Bf16);
    wide.split_sizes = vec![16, 16, 16, 16];
    params.push(wide);
    let mut tall = ParamSpec::new("fused.tall.weight", &[112, 16], muon_opt::config::Dtype::Bf16);
    tall.split_sizes = vec![48, 48, 16];
    params.push(tall);
    params.push(grouped_qkv());
    // Order 64 (64 rows, 80 columns): the symmetric products by 4 tiles a side with tiles of
    // 16 (`numerics::gemm::SymmetricTiles`); the model's order-32 matrices by 2.
    params.push(ParamSpec::new("deep.weight", &[64, 80], muon_opt::config::Dtype::Bf16));
    // A gated-delta-net input projection [q|k|v|z|β|α] with β and α one row per value head:
    // six components, two of them tiny, each orthogonalized alone.
    let mut gdn = ParamSpec::new("gdn.in_proj.weight", &[104, 32], muon_opt::config::Dtype::Bf16);
    gdn.split_sizes = vec![16, 16, 32, 32, 4, 4];
    params.push(gdn);
    params.extend(mxfp8_params());
    // A tensor-parallel duplicate another rank counts in the norm: checked, not counted.
    let mut replica = ParamSpec::new("tp.duplicate.norm.weight", &[64], muon_opt::config::Dtype::F32);
    replica.flags = ParamFlags(ParamFlags::NORM_REPLICA);
    params.push(replica);
    params
}

/// Megatron's fused QKV of 3 query groups ([8 q | 4 k | 4 v] rows each), split per group (the
/// param `support::qk_clip::grouped_qkv_request` clips).
pub fn grouped_qkv() -> ParamSpec {
    let mut qkv = ParamSpec::new("grouped.qkv.weight", &[48, 32], muon_opt::config::Dtype::Bf16);
    qkv.split_sizes = vec![8, 4, 4];
    qkv.split_groups = 3;
    qkv
}

/// MXFP8 params: a fused Muon matrix and an AdamW matrix.
pub fn mxfp8_params() -> [ParamSpec; 2] {
    let mut fc = ParamSpec::new("mx.fc.weight", &[64, 32], muon_opt::config::Dtype::Bf16);
    fc.flags = ParamFlags(ParamFlags::MXFP8);
    fc.split_sizes = vec![32, 32];
    let mut router = ParamSpec::new("mx.router.weight", &[32, 64], muon_opt::config::Dtype::Bf16);
    router.flags = ParamFlags(ParamFlags::MXFP8 | ParamFlags::NO_MUON);
    [fc, router]
}

/// Rank `rank` of `dp`'s runtime on `backend`, initialised with `training::init_values`.
pub fn runtime(cfg: &Config, specs: &[ParamSpec], rank: usize, dp: usize, backend: Box<dyn Backend>) -> Runtime {
    let mut registry = Registry::default();
    for spec in specs {
        registry.add(spec.clone(), cfg).unwrap();
    }
    let plan = build_plan(registry.params(), registry.routes(), cfg, dp).unwrap();
    let init: Vec<InitData> = specs
        .iter()
        .enumerate()
        .map(|(p, s)| InitData::from_f32(&init_values(p, s.numel())))
        .collect();
    Runtime::new(Box::new(plan), specs.to_vec(), cfg.clone(), rank, backend, |p| {
        Some(init[p].values())
    })
    .unwrap()
}

/// zero_grad, forward waits, every gradient uploaded in backward order (with a NaN in param
/// 0's gradient on rank 0 when `nan`) and announced with grad_ready.
pub fn backward(rt: &mut Runtime, rank: usize, step: u64, nan: bool) {
    rt.zero_grad().unwrap();
    let buckets = rt.plan().buckets.len() as u32;
    for b in 0..buckets {
        rt.wait_params(b).unwrap();
    }
    for p in (0..rt.plan().params.len()).rev() {
        let seen = rt.param_values(p).unwrap();
        let mut grad = rank_grad(step, rank, p, &seen);
        if nan && rank == 0 && p == 0 {
            grad[0] = f32::NAN;
        }
        let span = rt.grad_storage(p).unwrap();
        rt.backend_mut().upload(span, &grad).unwrap();
        rt.grad_ready(p as u32).unwrap();
    }
}

/// With sharded params: the forward gathers every bucket in forward order (one ahead of the
/// one in use) and releases it after its use; the backward gathers them again in reverse
/// order, lets `write_grad(rt, param)` put each of the bucket's gradients into its slot,
/// announces it and releases the bucket.
pub fn sharded_pass(rt: &mut Runtime, mut write_grad: impl FnMut(&mut Runtime, u32)) {
    let order = muon_opt::plan::forward_order(&rt.plan().buckets);
    for (i, &b) in order.iter().enumerate() {
        if let Some(&next) = order.get(i + 1) {
            rt.gather_params(next as u32).unwrap();
        }
        rt.wait_params(b as u32).unwrap();
        rt.release_params(b as u32).unwrap();
    }
    for (i, &b) in order.iter().enumerate().rev() {
        if i > 0 {
            rt.gather_params(order[i - 1] as u32).unwrap();
        }
        rt.wait_params(b as u32).unwrap();
        for p in rt.plan().buckets[b].params.clone() {
            write_grad(rt, p);
            rt.grad_ready(p).unwrap();
        }
        rt.release_params(b as u32).unwrap();
    }
}

/// [`sharded_pass`] uploading each gradient into its slot as [`backward`] computes it.
pub fn sharded_backward(rt: &mut Runtime, rank: usize, step: u64) {
    sharded_pass(rt, |rt, p| {
        let seen = rt.param_values(p as usize).unwrap();
        let grad = rank_grad(step, rank, p as usize, &seen);
        let span = rt.grad_storage(p as usize).unwrap();
        rt.backend_mut().upload(span, &grad).unwrap();
    });
}

/// One iteration: [`backward`], step, forward waits; what the step did.
pub fn iterate(rt: &mut Runtime, rank: usize, step: u64, nan: bool) -> StepInfo {
    backward(rt, rank, step, nan);
    rt.step(Some(&ARGS)).unwrap();
    for b in 0..rt.plan().buckets.len() as u32 {
        rt.wait_params(b).unwrap();
    }
    rt.step_info().unwrap()
}

/// Element-wise ops the optimizer runs do not all reach — casts in every direction, scaling of
/// f32 and bf16, memset, bf16 staging — on `n` values starting with `specials`. Returns the
/// bits of every buffer afterwards and the gradient norm of part of a bf16 grad buffer (the
/// exact sum of squares rounded once, then its square root: the same bits on every backend).
pub fn elementwise_script(backend: &mut dyn Backend, n: u64, specials: &[f32]) -> (Vec<Vec<u32>>, f64) {
    use muon_opt::backend::ops::MemoryLayout;
    use muon_opt::config::Dtype;
    use muon_opt::numerics::mxfp8::ScaleLayout;
    let layout = MemoryLayout {
        buffers: vec![BufferSizes::whole(n, Dtype::Bf16), BufferSizes::whole(n, Dtype::F32)],
        grad_dtype: Dtype::Bf16,
        master: n,
        momentum: 0,
        momentum_dtype: muon_opt::config::Dtype::F32,
        moment2: 0,
        adam_moments: 0,
        max_component: (0, 0),
        muon_work: muon_opt::backend::ops::MuonWork::default(),
        tp_components: Vec::new(),
        mxfp8: Vec::new(),
        mxfp8_scale_layout: ScaleLayout::Compact,
    };
    let mut values: Vec<f32> = (0..n).map(|i| noise(i) * 3.0).collect();
    values[..specials.len()].copy_from_slice(specials);
    backend.allocate(&layout).unwrap();
    let span = |mem| Span::new(mem, 0, n);
    backend.upload(span(Mem::Master), &values).unwrap();
    backend.cast(span(Mem::Master), span(Mem::Param(0))).unwrap();
    backend.cast(span(Mem::Param(0)), span(Mem::Param(1))).unwrap();
    backend.cast(span(Mem::Master), span(Mem::Grad(0))).unwrap();
    backend.cast(span(Mem::Param(1)), span(Mem::Grad(1))).unwrap();
    let half = n / 2;
    backend
        .cast(Span::new(Mem::Grad(1), 0, half), Span::new(Mem::Staging(0), half, half))
        .unwrap();
    backend
        .memset_zero(
            muon_opt::backend::ops::StreamKind::Compute,
            Span::new(Mem::Param(0), 100, 7),
        )
        .unwrap();
    backend
        .squared_norm(vec![Span::new(Mem::Grad(1), 8, n - 96)], Vec::new())
        .unwrap();
    // The gather runs on the comm stream: done before the compute stream reads it.
    backend.synchronize().unwrap();
    backend.gather_norm_sums().unwrap();
    backend.synchronize().unwrap();
    let own = muon_opt::backend::ops::NormTerm {
        sums: muon_opt::backend::ops::NormSums::Own,
        ..backend.norm_term().unwrap()
    };
    backend
        .set_step_args([0.02, 0.1, 3e-3, 0.01, 0.9, 0.9, 0.95, 1e-8, 3e-3])
        .unwrap();
    let constants = muon_opt::backend::ops::StepConstants { clip_grad: 0.0 };
    backend.finish_step(&constants, &[own]).unwrap();
    let norm = backend.read_scalars().unwrap()[muon_opt::backend::ops::Scalar::GradNorm.slot()];
    let out = [Mem::Param(0), Mem::Param(1), Mem::Grad(0), Mem::Grad(1), Mem::Master]
        .into_iter()
        .map(|m| bits(&backend.download(span(m)).unwrap()))
        .collect();
    (out, norm)
}

/// A one-rank host backend, the reference the cuda backend is compared with.
pub fn host_backend(cfg: &Config) -> HostBackend {
    let comm = HostGroup::new(1, TIMEOUT).remove(0);
    HostBackend::new(
        Communicator::new(Transport::Host(comm)),
        CommMode::Eager,
        MuonOptions::from_config(cfg),
    )
    .unwrap()
}

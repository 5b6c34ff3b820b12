//! The cuda backend's translation, executed on a CPU emulation of the device, against the
//! host backend — without a GPU.
//!
//! The emulated device runs every action of the translator: copies and memsets on heap blocks
//! whose addresses are the device pointers, every kernel launch by the real kernel of
//! `kernels/*.cu` built for the CPU (`cuda_emulated/kernels_cpu.rs`: the threads of a block as
//! OS threads meeting at real barriers), cuBLAS's column-major GEMMs on the host's GEMM, and
//! NCCL for one rank. This checks the translator's decisions — pointers, offsets, dtype flags,
//! kernel arguments, the Newton–Schulz sequence with its transposes, ping-pong buffers and
//! batches, the GEMM parameters in column-major form, the packed reduction structs — and the
//! kernels' own code, by comparing whole optimizer runs with the host backend: element-wise
//! results bit for bit, Newton–Schulz within tolerance. `scripts/test-kernels.sh` runs it under
//! AddressSanitizer + UndefinedBehaviorSanitizer and ThreadSanitizer too. What only a GPU shows:
//! docs/kernels-cpu.md.

#[path = "cuda_emulated/emulator.rs"]
mod emulator;
#[path = "cuda_emulated/kernels_cpu.rs"]
mod kernels_cpu;
#[path = "cuda_emulated/ranks.rs"]
mod ranks;
mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use muon_opt::backend::Backend;
use muon_opt::backend::cuda::action::{Action, Buf, DevPtr, NcclComm};
use muon_opt::backend::cuda::translate::Translator;
use muon_opt::backend::cuda::{CudaBackend, Executor};
use muon_opt::backend::host::comm::HostGroup;
use muon_opt::backend::ops::{Mem, StreamKind};
use muon_opt::comm::{Communicator, Transport};
use muon_opt::config::{CommMode, Config, Dtype, MuonLayout, MuonVariant, NsPrecision};
use muon_opt::error::{ErrorKind, Result};
use muon_opt::model::ParamSpec;
use muon_opt::numerics::muon::MuonOptions;
use muon_opt::numerics::mxfp8::ScaleLayout;
use muon_opt::schedule::{Runtime, StepArgs, StepInfo, StepOverrides};
use support::cuda::{backward, cuda_model, elementwise_script, host_backend, iterate, runtime};
use support::ranks::on_ranks;
use support::training::{ARGS, bits};

use emulator::{Emulator, SMALL_TILE, emulated_backend, part_sizes};

/// dp=1 runs of the optimizer on the emulated device and on the host backend, compared after
/// every step bit for bit: params, masters, optimizer state, MXFP8 bytes and the reported
/// gradient norm (an exact sum on both). The GEMM is the host's, so the only difference left
/// is the order of the Newton–Schulz inputs' f64 sums of squares (a fixed tree instead of the
/// host's 8 lanes), which agrees with the host's after rounding to f32 here.
fn compare_runs(label: &str, cfg: &Config, specs: &[ParamSpec]) {
    compare_clipped_runs(label, cfg, specs, false);
}

/// [`compare_runs`], with a QK-clip of the grouped QKV at every step when `qk_clip`; returns
/// the names of the kernels the emulated device launched.
fn compare_clipped_runs(label: &str, cfg: &Config, specs: &[ParamSpec], qk_clip: bool) -> BTreeSet<&'static str> {
    compare_stepped_runs(label, cfg, specs, qk_clip, &|rt, step| iterate(rt, 0, step, step == 2))
}

/// [`compare_clipped_runs`] with each iteration `iteration(runtime, step)` (gradients, step,
/// params waited for; the step 2 of the others has a NaN gradient and is skipped).
fn compare_stepped_runs(
    label: &str,
    cfg: &Config,
    specs: &[ParamSpec],
    qk_clip: bool,
    iteration: &dyn Fn(&mut Runtime, u64) -> StepInfo,
) -> BTreeSet<&'static str> {
    let mut host = runtime(cfg, specs, 0, 1, Box::new(host_backend(cfg)));
    let mut emu = runtime(
        cfg,
        specs,
        0,
        1,
        Box::new(emulated_backend(MuonOptions::from_config(cfg))),
    );
    for step in 0..4 {
        if qk_clip {
            ranks::clip(&mut host, specs, false);
            ranks::clip(&mut emu, specs, true);
        }
        let (a, b) = (iteration(&mut host, step), iteration(&mut emu, step));
        assert_eq!((a.skipped, a.step), (b.skipped, b.step), "{label}: step {step}");
        assert_eq!(
            a.grad_norm.to_bits(),
            b.grad_norm.to_bits(),
            "{label}: step {step} grad norm {} vs {}",
            a.grad_norm,
            b.grad_norm
        );
        assert_eq!(a.clip_coef, b.clip_coef, "{label}: step {step} clip coefficient");
        let (sa, sb) = (host.owned_state().unwrap(), emu.owned_state().unwrap());
        assert_eq!(sa.len(), sb.len());
        for (x, y) in sa.iter().zip(&sb) {
            assert_eq!((x.param, x.range), (y.param, y.range));
            let name = &specs[x.param as usize].name;
            let arrays = std::iter::once((&x.master, &y.master)).chain(x.moments.iter().zip(&y.moments));
            for (k, (u, v)) in arrays.enumerate() {
                assert!(
                    bits(u) == bits(v),
                    "{label}: step {step} {name} state array {k} differs"
                );
            }
        }
        for (p, spec) in specs.iter().enumerate() {
            let (u, v) = (host.param_values(p).unwrap(), emu.param_values(p).unwrap());
            assert!(bits(&u) == bits(&v), "{label}: step {step} param {} differs", spec.name);
            if let (Some(host_parts), Some(emu_parts)) = (host.mxfp8_addresses(p), emu.mxfp8_addresses(p)) {
                let (rows, cols) = spec.flat_2d();
                let sizes = part_sizes(rows as usize, cols as usize);
                // SAFETY: the runtime's backend is the emulated cuda backend built above; only read here.
                let backend = unsafe { &*(emu.backend_mut() as *mut dyn Backend as *const CudaBackend<Emulator>) };
                let device = backend.executor();
                for ((h, e), len) in host_parts.iter().zip(emu_parts).zip(sizes) {
                    // SAFETY: host MXFP8 storage of `len` bytes.
                    let host_bytes = unsafe { std::slice::from_raw_parts(*h, len) };
                    assert!(
                        host_bytes == device.bytes(e as DevPtr, len),
                        "{label}: step {step} MXFP8 bytes of {}",
                        spec.name
                    );
                }
            }
        }
    }
    // SAFETY: as above: the emulated cuda backend built here, only read.
    let backend = unsafe { &*(emu.backend_mut() as *mut dyn Backend as *const CudaBackend<Emulator>) };
    backend.executor().launched().clone()
}

/// Shapes that are no multiple of any block or tile (1-D kernels of 256 threads, 32 × 32 tiles,
/// symmetric tiles of 16) and tiny problems — one element, one row, one MXFP8 block — each
/// launched on the grid the translator picks for it (a block of 256 threads for one element,
/// a whole tile for one row), compared with the host bit for bit under f32 standard and bf16
/// Gram Newton–Schulz (the second with NorMuon), with MXFP8 gathered and local and a QK-clip
/// every step; together the
/// runs launch every kernel of `kernels/`.
#[test]
fn emulated_ragged_and_tiny_shapes_launch_every_kernel() {
    if !kernels_cpu::available() {
        return;
    }
    use muon_opt::backend::cuda::action::Kernel;
    use muon_opt::model::ParamFlags;
    let flagged = |name: &str, shape: &[u64], dtype, flags| ParamSpec {
        flags: ParamFlags(flags),
        ..ParamSpec::new(name, shape, dtype)
    };
    let specs = vec![
        flagged("tiny.bias", &[1], Dtype::F32, 0),
        flagged("tiny.scale", &[1], Dtype::Bf16, 0),
        flagged("ragged.norm", &[7], Dtype::Bf16, 0),
        flagged("one.row.weight", &[1, 7], Dtype::Bf16, 0),
        flagged("ragged.tall.weight", &[33, 17], Dtype::Bf16, 0),
        flagged("ragged.wide.weight", &[17, 45], Dtype::Bf16, 0),
        flagged("one.block.mx.weight", &[32, 32], Dtype::Bf16, ParamFlags::MXFP8),
        flagged("replica.norm", &[5], Dtype::F32, ParamFlags::NORM_REPLICA),
        support::cuda::grouped_qkv(),
    ];
    let base = Config {
        bucket_size: 256,
        muon_ns_symmetric_tile: SMALL_TILE,
        muon_ns_precision: NsPrecision::F32,
        host_comm_mode: CommMode::Eager,
        clip_grad: 0.05,
        ..Config::default()
    };
    let gram = Config {
        muon_ns_method: muon_opt::config::NsMethod::Gram,
        muon_ns_precision: NsPrecision::Bf16,
        mxfp8_param_gather: true,
        grad_dtype: Dtype::Bf16,
        muon_variant: MuonVariant::Normuon,
        ..base.clone()
    };
    let mut launched = compare_clipped_runs("ragged, f32 standard", &base, &specs, true);
    launched.extend(compare_clipped_runs(
        "ragged, bf16 Gram, MXFP8 gathered, NorMuon",
        &gram,
        &specs,
        true,
    ));
    let every: BTreeSet<&str> = Kernel::ALL.iter().map(|k| k.name()).collect();
    let missing: Vec<_> = every.difference(&launched).collect();
    assert!(missing.is_empty(), "kernels never launched: {missing:?}");
}

#[test]
fn emulated_translation_matches_the_host_backend_f32_newton_schulz() {
    if !kernels_cpu::available() {
        return;
    }
    let cfg = Config {
        bucket_size: 4096,
        muon_ns_symmetric_tile: SMALL_TILE,
        muon_ns_precision: NsPrecision::F32,
        host_comm_mode: CommMode::Eager,
        ..Config::default()
    };
    compare_runs("f32 NS, compact", &cfg, &cuda_model());
    let cfg = Config {
        muon_layout: MuonLayout::Padded,
        muon_nesterov: true,
        grad_dtype: Dtype::Bf16,
        clip_grad: 0.05,
        ..cfg
    };
    compare_runs("f32 NS, padded, bf16 grads, nesterov, clipping", &cfg, &cuda_model());
}

/// Runs `variant` on the emulated device against the host, bit for bit: in f32 on the compact
/// layout with a skipped step (the second moments left as they were), where each kernel of
/// `ran` must run and none of `not_ran`; then in bf16 on the padded layout with Nesterov, bf16
/// grads, clipping, β2 0.9 and what `more` sets.
fn compare_adaptive_variant(variant: MuonVariant, ran: &[&str], not_ran: &[&str], more: impl FnOnce(Config) -> Config) {
    let cfg = Config {
        bucket_size: 4096,
        muon_ns_symmetric_tile: SMALL_TILE,
        muon_ns_precision: NsPrecision::F32,
        muon_variant: variant,
        host_comm_mode: CommMode::Eager,
        ..Config::default()
    };
    let label = format!("{}, f32 NS, compact", variant.name());
    let launched = compare_clipped_runs(&label, &cfg, &cuda_model(), false);
    for kernel in ran {
        assert!(launched.contains(kernel), "{kernel} did not run: {launched:?}");
    }
    for kernel in not_ran {
        assert!(!launched.contains(kernel), "{kernel} ran: {launched:?}");
    }
    let cfg = more(Config {
        muon_layout: MuonLayout::Padded,
        muon_ns_precision: NsPrecision::Bf16,
        muon_nesterov: true,
        grad_dtype: Dtype::Bf16,
        clip_grad: 0.05,
        adaptive_muon_beta2: 0.9,
        ..cfg
    });
    let label = format!(
        "{}, bf16 NS, padded, bf16 grads, nesterov, clipping, beta2 0.9, eps {}, cautious wd {}",
        variant.name(),
        cfg.adaptive_muon_eps,
        cfg.cautious_weight_decay
    );
    compare_runs(&label, &cfg, &cuda_model());
}

/// NorMuon (`muon_variant = normuon`) on the emulated device equals the host bit for bit —
/// params, masters, momenta and the second moments — on every shape of the model (tall and
/// wide components, so per-row and per-column statistics, transposed Newton–Schulz outputs,
/// batched experts, per-group splits), with f32 and bf16 products, Nesterov, bf16 grads and
/// clipping, a skipped step leaving the second moments as they were.
#[test]
fn emulated_normuon_matches_the_host_backend_bitwise() {
    if !kernels_cpu::available() {
        return;
    }
    let kernels = ["muon_normuon_line_sums", "muon_normuon_moments", "muon_apply"];
    compare_adaptive_variant(MuonVariant::Normuon, &kernels, &[], |cfg| cfg);
}

/// AdaMuon (`muon_variant = adamuon`) on the emulated device equals the host bit for bit —
/// params, masters, momenta and the element-wise second moments, which `muon_apply` updates in
/// place (no NorMuon kernel runs) — on every shape of the model (transposed Newton–Schulz
/// outputs, batched experts, per-group splits), with f32 and bf16 products, Nesterov, bf16
/// grads, clipping, a larger ε and cautious weight decay, a skipped step leaving the second
/// moments as they were.
#[test]
fn emulated_adamuon_matches_the_host_backend_bitwise() {
    if !kernels_cpu::available() {
        return;
    }
    let normuon = ["muon_normuon_line_sums", "muon_normuon_moments"];
    compare_adaptive_variant(MuonVariant::Adamuon, &["muon_apply"], &normuon, |cfg| Config {
        adaptive_muon_eps: 1e-3,
        cautious_weight_decay: true,
        ..cfg
    });
}

/// A step's overrides of the config's momentum and betas (a scheduler's, new every step) and
/// the decoupled learning rate of the embedding (MUON_STEP_OVERRIDE_DECOUPLED_LR, the AdamW
/// kernel's learning-rate slot) reach the kernels through the device's scalars: given with the
/// step (steps 0 and 1) or set
/// beforehand for a step that copies nothing (steps 2 and 3, the form a CUDA graph captures:
/// no per-step value is a launch argument), the emulated device equals the host bit for bit,
/// with Nesterov and bf16 grads too.
#[test]
fn emulated_step_overrides_match_the_host_backend_bitwise() {
    if !kernels_cpu::available() {
        return;
    }
    let iteration = |rt: &mut Runtime, step: u64| {
        backward(rt, 0, step, false);
        let args = StepArgs {
            overrides: StepOverrides {
                muon_momentum: Some(0.8 + 0.05 * step as f32),
                adam_beta1: Some(0.85 - 0.1 * step as f32),
                adam_beta2: (step != 1).then_some(0.95 + 0.01 * step as f32),
                adam_eps: Some(1e-6 / (1 + step) as f32),
                decoupled_lr: (step != 2).then_some(2e-3 * (1 + step) as f32),
            },
            ..ARGS
        };
        if step < 2 {
            rt.step(Some(&args)).unwrap();
        } else {
            rt.set_step_args(&args).unwrap();
            rt.step(None).unwrap();
        }
        for b in 0..rt.plan().buckets.len() as u32 {
            rt.wait_params(b).unwrap();
        }
        rt.step_info().unwrap()
    };
    let cfg = Config {
        bucket_size: 4096,
        muon_ns_symmetric_tile: SMALL_TILE,
        muon_ns_precision: NsPrecision::F32,
        host_comm_mode: CommMode::Eager,
        ..Config::default()
    };
    compare_stepped_runs("overrides, f32 NS", &cfg, &cuda_model(), false, &iteration);
    let cfg = Config {
        muon_nesterov: true,
        grad_dtype: Dtype::Bf16,
        ..cfg
    };
    compare_stepped_runs(
        "overrides, nesterov, bf16 grads",
        &cfg,
        &cuda_model(),
        false,
        &iteration,
    );
}

#[test]
fn emulated_translation_matches_the_host_backend_bf16_newton_schulz() {
    if !kernels_cpu::available() {
        return;
    }
    let cfg = Config {
        bucket_size: 4096,
        muon_ns_symmetric_tile: SMALL_TILE,
        host_comm_mode: CommMode::Eager,
        mxfp8_param_gather: true,
        mxfp8_swizzled_scales: true,
        ..Config::default()
    };
    compare_runs("bf16 NS, MXFP8 gather", &cfg, &cuda_model());
    let cfg = Config {
        mxfp8_param_gather: false,
        muon_layout: MuonLayout::Allreduce,
        ..cfg
    };
    compare_runs("bf16 NS, MXFP8 local, allreduce", &cfg, &cuda_model());
}

#[test]
fn emulated_translation_matches_the_host_backend_bf16_iterate_newton_schulz() {
    if !kernels_cpu::available() {
        return;
    }
    let cfg = Config {
        bucket_size: 4096,
        muon_ns_symmetric_tile: SMALL_TILE,
        host_comm_mode: CommMode::Eager,
        muon_ns_precision: NsPrecision::Bf16Iterate,
        muon_coefficient_set: muon_opt::config::CoefficientSet::QuinticCyclic,
        muon_num_ns_steps: 7,
        ..Config::default()
    };
    compare_runs("bf16-iterate NS, cyclic quintic, 7 steps", &cfg, &cuda_model());
}

/// The Gram Newton–Schulz iteration (`muon_ns_method = gram`) on the emulated device, bit for
/// bit like the host in every precision: bf16 and bf16_iterate with 5 quintic steps (one
/// restart), f32 with 9 Polar Express steps (restarts at steps 2, 5 and 8). The model's wide
/// matrices (order 32 and 64 with tiles of 16: the symmetric products 2 and 4 tiles a side),
/// its expert stack and fused components (strided batches, tall ones transposed)
/// take the Gram iteration; its square and near-square ones (`n/m < 1.5`) the standard one,
/// checked against a host run with `standard`: after one step those params are equal to it
/// bit for bit and every other Muon param differs.
#[test]
fn emulated_gram_newton_schulz_matches_the_host_backend_bitwise() {
    if !kernels_cpu::available() {
        return;
    }
    use muon_opt::config::{CoefficientSet, NsMethod};
    let mut specs = cuda_model();
    specs.push(ParamSpec::new("wide.deep.weight", &[64, 160], Dtype::Bf16));
    let standard_only = [
        "layers.0.qkv.weight",
        "layers.0.proj.weight",
        "layers.1.qkv.weight",
        "layers.1.proj.weight",
        "deep.weight",
        "mx.fc.weight",
    ];
    for (precision, coefficients, steps) in [
        (NsPrecision::Bf16, CoefficientSet::Quintic, 5),
        (NsPrecision::Bf16Iterate, CoefficientSet::QuinticCyclic, 5),
        (NsPrecision::F32, CoefficientSet::PolarExpress, 9),
    ] {
        let cfg = Config {
            bucket_size: 4096,
            muon_ns_symmetric_tile: SMALL_TILE,
            host_comm_mode: CommMode::Eager,
            muon_ns_precision: precision,
            muon_coefficient_set: coefficients,
            muon_num_ns_steps: steps,
            muon_ns_method: NsMethod::Gram,
            ..Config::default()
        };
        compare_runs(&format!("gram NS, {precision:?}, {steps} steps"), &cfg, &specs);
        let standard = Config {
            muon_ns_method: NsMethod::Standard,
            ..cfg.clone()
        };
        let mut gram = runtime(&cfg, &specs, 0, 1, Box::new(host_backend(&cfg)));
        let mut plain = runtime(&standard, &specs, 0, 1, Box::new(host_backend(&standard)));
        iterate(&mut gram, 0, 0, false);
        iterate(&mut plain, 0, 0, false);
        let (a, b) = (gram.owned_state().unwrap(), plain.owned_state().unwrap());
        for (x, y) in a.iter().zip(&b) {
            let name = &specs[x.param as usize].name;
            if gram.plan().params[x.param as usize].route != muon_opt::model::Route::Muon {
                continue;
            }
            let same = bits(&x.master) == bits(&y.master);
            let expected = standard_only.contains(&name.as_str());
            assert_eq!(same, expected, "{precision:?}: {name} equal to the standard iteration");
        }
    }
}

/// Every coefficient set, the caller's table among them, takes the same `(a, b, c)` in the
/// translated kernels as on the host: bit for bit, with the fixed schedules at their 5 steps
/// and the others past the end of their tables (cycled or the last repeated).
#[test]
fn emulated_coefficient_sets_match_the_host_backend_bitwise() {
    if !kernels_cpu::available() {
        return;
    }
    use muon_opt::config::CoefficientSet;
    // A wide matrix (order 32: two tiles a side) and a tall fused one: the coefficients enter
    // the same kernels whatever the shape, so two matrices cover them and keep six runs short.
    let mut tall = ParamSpec::new("fused.tall.weight", &[48, 16], Dtype::Bf16);
    tall.split_sizes = vec![32, 16];
    let specs = vec![ParamSpec::new("wide.weight", &[32, 48], Dtype::Bf16), tall];
    for (coefficients, steps, table) in [
        (CoefficientSet::Cans, 6, vec![]),
        (CoefficientSet::Aol, 6, vec![]),
        (CoefficientSet::Cubic5, 5, vec![]),
        (CoefficientSet::DeepseekV4, 11, vec![]),
        (CoefficientSet::PolarExpress5, 5, vec![]),
        (
            CoefficientSet::Custom,
            7,
            vec![[3.5, -4.5, 2.0], [3.0, -3.2, 1.2], [2.0, -1.5, 0.5]],
        ),
    ] {
        let cfg = Config {
            bucket_size: 4096,
            muon_ns_symmetric_tile: SMALL_TILE,
            host_comm_mode: CommMode::Eager,
            muon_coefficient_set: coefficients,
            muon_custom_coefficients: table,
            muon_num_ns_steps: steps,
            ..Config::default()
        };
        compare_runs(&format!("{} NS, {steps} steps", coefficients.name()), &cfg, &specs);
    }
}

/// Cautious weight decay (`cautious_weight_decay`) takes the same mask in `muon_apply` and
/// `muon_adamw` as on the host: bit for bit with f32 Newton–Schulz, and with NorMuon (the mask
/// of the normalized update), bf16 grads, Nesterov and clipping. The host's runs differ from
/// plain decay (tests/numerics_muon.rs, tests/numerics_adamw.rs), so a kernel that ignored the
/// flag would differ here.
#[test]
fn emulated_cautious_weight_decay_matches_the_host_backend_bitwise() {
    if !kernels_cpu::available() {
        return;
    }
    let cfg = Config {
        bucket_size: 4096,
        muon_ns_symmetric_tile: SMALL_TILE,
        muon_ns_precision: NsPrecision::F32,
        cautious_weight_decay: true,
        host_comm_mode: CommMode::Eager,
        ..Config::default()
    };
    let launched = compare_clipped_runs("cautious wd, f32 NS", &cfg, &cuda_model(), false);
    for kernel in ["muon_apply", "muon_adamw"] {
        assert!(launched.contains(kernel), "{kernel} did not run: {launched:?}");
    }
    let cfg = Config {
        muon_variant: MuonVariant::Normuon,
        muon_nesterov: true,
        grad_dtype: Dtype::Bf16,
        clip_grad: 0.05,
        ..cfg
    };
    compare_runs(
        "cautious wd, normuon, bf16 grads, nesterov, clipping",
        &cfg,
        &cuda_model(),
    );
}

/// A bf16 momentum (`muon_momentum_dtype = bf16`): `muon_momentum` reads and stores bf16 and
/// writes the f32 update to the workspace; the state (downloaded as f32) and the params equal
/// the host's bit for bit, with and without Nesterov, bf16 grads and a per-group split among
/// the params.
#[test]
fn emulated_bf16_momentum_matches_the_host_backend_bitwise() {
    if !kernels_cpu::available() {
        return;
    }
    let cfg = Config {
        bucket_size: 4096,
        muon_ns_symmetric_tile: SMALL_TILE,
        muon_ns_precision: NsPrecision::F32,
        muon_momentum_dtype: Dtype::Bf16,
        host_comm_mode: CommMode::Eager,
        ..Config::default()
    };
    compare_runs("bf16 momentum, f32 NS", &cfg, &cuda_model());
    let cfg = Config {
        muon_nesterov: true,
        grad_dtype: Dtype::Bf16,
        ..cfg
    };
    compare_runs("bf16 momentum, nesterov, bf16 grads", &cfg, &cuda_model());
}

/// The element-wise ops the dp=1 runs do not reach (scale, casts in every direction, bf16
/// buffers), bit for bit, including NaN, infinities, subnormals and rounding ties.
#[test]
fn emulated_elementwise_ops_match_the_host_backend_bit_for_bit() {
    if !kernels_cpu::available() {
        return;
    }
    let cfg = Config::default();
    let specials = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        f32::from_bits(1),
        f32::from_bits(0x3F80_8000),
        f32::from_bits(0x3F81_8000),
        f32::MAX,
    ];
    let (host, host_norm) = elementwise_script(&mut host_backend(&cfg), 512, &specials);
    let (emu, emu_norm) = elementwise_script(&mut emulated_backend(MuonOptions::from_config(&cfg)), 512, &specials);
    assert_eq!(host, emu);
    assert_eq!(
        host_norm.to_bits(),
        emu_norm.to_bits(),
        "gradient norm {host_norm} vs {emu_norm}"
    );
}

/// `Op::QkClip` (kernels/qk_clip.cu) with the maxima in device memory, bit for bit like the
/// host backend: every head layout, α = 0, ½, 1, 0.3, maxima above, under, at τ and not finite.
#[test]
fn emulated_qk_clip_matches_the_host_backend_bit_for_bit() {
    if !kernels_cpu::available() {
        return;
    }
    let cfg = Config::default();
    let host = support::qk_clip::clip_script(&mut host_backend(&cfg), false);
    let emu = support::qk_clip::clip_script(&mut emulated_backend(MuonOptions::from_config(&cfg)), true);
    assert!(host == emu);
}

/// The emulated device with a fault: its `fail_at`-th NCCL group fails with `kind`, as a
/// collective whose peer never arrives (the device's polling wait gives `CommTimeout`) or one
/// NCCL reports failed (`NcclError`).
struct Faulty {
    device: Emulator,
    fail_at: usize,
    kind: ErrorKind,
    groups: usize,
}

impl Executor for Faulty {
    fn run(&mut self, actions: &[Action], bind: &mut dyn FnMut(Buf, DevPtr, u64)) -> Result<Vec<Vec<u8>>> {
        for action in actions {
            if matches!(action, Action::Nccl(..)) {
                self.groups += 1;
                if self.groups == self.fail_at {
                    return Err(muon_opt::error::Error::new(
                        self.kind,
                        "ncclReduce: the peer did not arrive within collective_timeout_ms".to_string(),
                    ));
                }
            }
        }
        self.device.run(actions, bind)
    }
}

/// A collective that times out or fails in NCCL returns its status, and every later call of
/// the backend returns `CommBroken` at once naming it — nothing more is issued to a
/// communicator the peers will never match again. Other failures (a span out of bounds) do not
/// break the backend.
#[test]
fn a_failed_collective_breaks_the_backend_and_later_calls_return_at_once() {
    if !kernels_cpu::available() {
        return;
    }
    use muon_opt::backend::ops::{BufferSizes, CollOp, MemoryLayout, MuonWork, Span};
    for kind in [ErrorKind::CommTimeout, ErrorKind::NcclError] {
        let faulty = Faulty {
            device: Emulator::new(),
            fail_at: 2,
            kind,
            groups: 0,
        };
        let muon = MuonOptions::from_config(&Config::default());
        let mut backend = CudaBackend::with_executor(Translator::new(0, 1, muon), faulty).unwrap();
        backend
            .allocate(&MemoryLayout {
                buffers: vec![BufferSizes::whole(256, Dtype::F32)],
                grad_dtype: Dtype::F32,
                master: 0,
                momentum: 0,
                momentum_dtype: muon_opt::config::Dtype::F32,
                moment2: 0,
                adam_moments: 0,
                max_component: (0, 0),
                muon_work: MuonWork::default(),
                tp_components: Vec::new(),
                mxfp8: Vec::new(),
                mxfp8_scale_layout: ScaleLayout::Compact,
            })
            .unwrap();
        let grads = Span::new(Mem::Grad(0), 0, 256);
        let reduce = [CollOp::Reduce { root: 0, span: grads }];
        backend.collectives(reduce.to_vec()).unwrap();
        let bad = backend
            .upload(Span::new(Mem::Grad(0), 250, 100), &[0.0; 100])
            .unwrap_err();
        assert_eq!(bad.kind, ErrorKind::Internal, "{bad:?}");
        assert_eq!(backend.collectives(reduce.to_vec()).unwrap_err().kind, kind);
        for err in [
            backend.memset_zero(StreamKind::Compute, grads).unwrap_err(),
            backend.collectives(reduce.to_vec()).unwrap_err(),
            backend.synchronize().unwrap_err(),
        ] {
            assert_eq!(err.kind, ErrorKind::CommBroken, "{err:?}");
            assert!(
                err.message.contains("peer did not arrive") && err.message.contains("ncclCommAbort"),
                "{}",
                err.message
            );
        }
    }
}

/// Tensor-parallel shards on the emulated device, TP 2 (one emulator per TP rank on threads,
/// their collectives over a host group) against the host backend's TP 2 run, bit for bit after
/// every step: column-parallel and row-parallel matrices whose whole result is stored plain or
/// transposed (both for each split dimension), a square shard, an expert stack split per
/// expert (expert tensor parallelism), Megatron's QKV split per query group (two groups per
/// shard) and a per-head split holding whole heads (`TP_WHOLE_COMPONENTS`). `duplicated` in f32 and bf16 Newton–Schulz — the gather,
/// the 2-D assembly of column blocks, the chunk of a transposed result read with its row
/// stride, the whole-shape scale; `distributed` in f32 and bf16_iterate — the forced
/// orientation and the all-reduced norm and Gram matrices; the Gram iteration in both modes
/// and every precision (its `X·Xᵀ` all-reduced in `distributed`, its products with `Q`
/// shard-local), on the wide iterates, the others taking the standard one.
#[test]
fn tensor_parallel_shards_match_the_host_backend_bitwise() {
    if !kernels_cpu::available() {
        return;
    }
    use muon_opt::config::{NsMethod, TpMode};
    use muon_opt::model::ParamFlags;
    const TP: usize = 2;
    let shard = |name: &str, shape: &[u64], flags: u32| ParamSpec {
        flags: ParamFlags(flags),
        ..ParamSpec::new(name, shape, Dtype::F32)
    };
    let mut qkv = shard("attn.qkv.weight", &[32, 16], ParamFlags::TP_SHARD_ROWS);
    qkv.split_sizes = vec![8, 4, 4];
    qkv.split_groups = 2;
    // Per-head Muon, two whole heads per TP rank: each orthogonalized alone on its rank.
    let mut heads = shard(
        "attn.q_heads.weight",
        &[16, 24],
        ParamFlags::TP_SHARD_ROWS | ParamFlags::TP_WHOLE_COMPONENTS,
    );
    heads.split_sizes = vec![8, 8];
    let specs = vec![
        qkv,
        heads,
        shard("mlp.fc1.weight", &[32, 24], ParamFlags::TP_SHARD_ROWS),
        shard("mlp.fc2.weight", &[24, 16], ParamFlags::TP_SHARD_COLS),
        shard("attn.proj.weight", &[16, 16], ParamFlags::TP_SHARD_COLS),
        shard("mlp.down.weight", &[40, 8], ParamFlags::TP_SHARD_COLS),
        // Iterate and Gram matrix of order 64: the symmetric products by 4 tiles a side.
        shard("attn.out.weight", &[64, 40], ParamFlags::TP_SHARD_COLS),
        shard(
            "experts.fc2",
            &[3, 16, 12],
            ParamFlags::EXPERT_STACK | ParamFlags::TP_SHARD_COLS,
        ),
        // Wide iterates in both modes (the Gram iteration's): whole 32 × 128 and 16 × 192
        // (transposed); shards 32 × 64 (order 32: 2 tiles a side) and 16 × 96.
        shard("mlp.wide.weight", &[32, 64], ParamFlags::TP_SHARD_COLS),
        shard("attn.tall.weight", &[96, 16], ParamFlags::TP_SHARD_ROWS),
    ];
    let standard = MuonVariant::Standard;
    let mut runs = vec![
        (NsPrecision::F32, TpMode::Duplicated, NsMethod::Standard, standard),
        (NsPrecision::Bf16, TpMode::Duplicated, NsMethod::Standard, standard),
        (NsPrecision::F32, TpMode::Distributed, NsMethod::Standard, standard),
        (
            NsPrecision::Bf16Iterate,
            TpMode::Distributed,
            NsMethod::Standard,
            standard,
        ),
        // NorMuon's statistics of each rank's shard of the orthogonalized matrix.
        (
            NsPrecision::F32,
            TpMode::Duplicated,
            NsMethod::Standard,
            MuonVariant::Normuon,
        ),
        (
            NsPrecision::Bf16,
            TpMode::Distributed,
            NsMethod::Standard,
            MuonVariant::Normuon,
        ),
        // AdaMuon's element-wise moments of each rank's shard.
        (
            NsPrecision::F32,
            TpMode::Duplicated,
            NsMethod::Standard,
            MuonVariant::Adamuon,
        ),
    ];
    for precision in [NsPrecision::F32, NsPrecision::Bf16, NsPrecision::Bf16Iterate] {
        for mode in [TpMode::Duplicated, TpMode::Distributed] {
            runs.push((precision, mode, NsMethod::Gram, standard));
        }
    }
    for (precision, mode, method, variant) in runs {
        let cfg = Config {
            bucket_size: 4096,
            muon_ns_symmetric_tile: SMALL_TILE,
            muon_ns_precision: precision,
            muon_ns_method: method,
            muon_tp_mode: mode,
            muon_variant: variant,
            host_comm_mode: CommMode::Eager,
            ..Config::default()
        };
        let host_tp = HostGroup::new(TP, Duration::from_secs(20));
        let emu_tp = HostGroup::new(TP, Duration::from_secs(20));
        on_ranks(host_tp.into_iter().zip(emu_tp), |t, (host_comm, emu_comm)| {
            let (cfg, specs) = (&cfg, &specs);
            let host = host_backend(cfg)
                .with_tp_group(Communicator::new(Transport::Host(host_comm)))
                .unwrap();
            let device = Emulator::new().with_comm(NcclComm::Tensor, emu_comm);
            let translator = Translator::new(0, 1, MuonOptions::from_config(cfg)).with_tp_group(TP, t);
            let emulated = CudaBackend::with_executor(translator, device).unwrap();
            let mut host = runtime(cfg, specs, 0, 1, Box::new(host));
            let mut emu = runtime(cfg, specs, 0, 1, Box::new(emulated));
            for step in 0..3 {
                let (a, b) = (iterate(&mut host, t, step, false), iterate(&mut emu, t, step, false));
                assert_eq!(a.step, b.step);
                for (x, y) in host.owned_state().unwrap().iter().zip(&emu.owned_state().unwrap()) {
                    let name = &specs[x.param as usize].name;
                    assert!(
                        bits(&x.master) == bits(&y.master) && x.moments.len() == y.moments.len(),
                        "{mode:?} {precision:?} {method:?} {variant:?} TP rank {t} step {step}: {name} master differs"
                    );
                    for (m, n) in x.moments.iter().zip(&y.moments) {
                        assert!(
                            bits(m) == bits(n),
                            "{variant:?} TP rank {t} step {step}: {name} state differs"
                        );
                    }
                }
            }
        });
    }
}

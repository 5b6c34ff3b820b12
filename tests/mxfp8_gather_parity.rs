//! MXFP8 param gather, bitwise: run A registers MXFP8 params with `mxfp8_param_gather` on
//! (bf16 staged on the grad buffer, gathered, re-quantized on every rank); run B registers the
//! same params as plain bf16 and the test quantizes the gathered bf16 with the library's own
//! function. Both runs compute their gradients from the dequantized rowwise MXFP8 copy, so the
//! math is the same: masters, optimizer state and MXFP8 bytes must be equal bit for bit.

mod support;

use std::time::Duration;

use muon_opt::config::{CommMode, Config, Dtype, MuonLayout, NsPrecision};
use muon_opt::model::{ParamFlags, ParamSpec};
use muon_opt::numerics::mxfp8::{
    Direction, Input, Output, QuantizedMut, ScaleLayout, dequantize_rowwise, quantize_both, scale_shape,
};
use muon_opt::optimizer::Optimizer;
use support::ranks::{on_ranks, optimizers};
use support::rng::noise;
use support::training::{ARGS, assemble};

const STEPS: u64 = 10;

/// Per step: per param the four MXFP8 parts (rowwise data, scales, colwise data, scales), and
/// the assembled owned state.
type History = Vec<(Vec<Vec<Vec<u8>>>, Vec<Vec<Vec<f32>>>)>;

fn model(mxfp8: bool) -> Vec<ParamSpec> {
    let flag = if mxfp8 { ParamFlags::MXFP8 } else { 0 };
    let mut params = Vec::new();
    let mut emb = ParamSpec::new("embedding.weight", &[40, 32], Dtype::Bf16);
    emb.flags = ParamFlags(ParamFlags::EMBEDDING_OR_OUTPUT);
    params.push(emb);
    for layer in 0..2 {
        let mut fc1 = ParamSpec::new(format!("layers.{layer}.fc1.weight"), &[64, 32], Dtype::Bf16);
        fc1.flags = ParamFlags(flag);
        fc1.split_sizes = vec![32, 32];
        params.push(fc1);
        let mut fc2 = ParamSpec::new(format!("layers.{layer}.fc2.weight"), &[32, 96], Dtype::Bf16);
        fc2.flags = ParamFlags(flag);
        params.push(fc2);
        params.push(ParamSpec::new(format!("layers.{layer}.fc2.bias"), &[32], Dtype::Bf16));
    }
    let mut adam_mx = ParamSpec::new("router.weight", &[32, 64], Dtype::Bf16);
    adam_mx.flags = ParamFlags(flag | ParamFlags::NO_MUON);
    params.push(adam_mx);
    params
}

fn parts(rows: usize, cols: usize) -> [Vec<u8>; 4] {
    let scales = |d| {
        let (r, c) = scale_shape(rows, cols, d);
        vec![0u8; r * c]
    };
    [
        vec![0; rows * cols],
        scales(Direction::Rowwise),
        vec![0; rows * cols],
        scales(Direction::Colwise),
    ]
}

/// The MXFP8 bytes of param `p` as this rank holds them: read from the library's storage in
/// run A, quantized by the test from the gathered bf16 in run B.
fn mxfp8_bytes(opt: &mut Optimizer, spec: &ParamSpec, p: usize, layout: ScaleLayout) -> Vec<Vec<u8>> {
    let (rows, cols) = spec.flat_2d();
    let (rows, cols) = (rows as usize, cols as usize);
    let mut out = parts(rows, cols);
    let runtime = opt.running().unwrap();
    if let Some(addresses) = runtime.mxfp8_addresses(p) {
        assert!(
            runtime.address(p, false).is_null(),
            "an MXFP8 param exposes no bf16 data"
        );
        for (dst, src) in out.iter_mut().zip(addresses) {
            let len = dst.len();
            dst.copy_from_slice(unsafe { std::slice::from_raw_parts(src, len) });
        }
    } else {
        let bits: Vec<u16> = runtime
            .param_values(p)
            .unwrap()
            .iter()
            .map(|v| (v.to_bits() >> 16) as u16)
            .collect();
        let [rd, rs, cd, cs] = &mut out;
        let row = QuantizedMut { data: rd, scales: rs };
        let col = QuantizedMut { data: cd, scales: cs };
        quantize_both(Input::Bf16(&bits), rows, cols, layout, row, col).unwrap();
    }
    out.to_vec()
}

fn run_rank(opt: &mut Optimizer, mxfp8: bool, rank: usize, layout: ScaleLayout) -> History {
    let specs = model(true);
    for (p, spec) in model(mxfp8).into_iter().enumerate() {
        let init: Vec<f32> = (0..spec.numel())
            .map(|i| 0.1 * noise(1_000_000 * p as u64 + i))
            .collect();
        opt.add_param(spec, Some(muon_opt::init_data::InitData::from_f32(&init)))
            .unwrap();
    }
    opt.finalize().unwrap();
    let buckets = opt.plan().unwrap().buckets.len() as u32;
    let mut history = Vec::new();
    opt.zero_grad().unwrap();
    for step in 0..STEPS {
        for b in 0..buckets {
            opt.wait_params(b).unwrap();
        }
        for p in (0..specs.len()).rev() {
            let seen: Vec<f32> = if specs[p].flags.has(ParamFlags::MXFP8) {
                let bytes = mxfp8_bytes(opt, &specs[p], p, layout);
                let (rows, cols) = specs[p].flat_2d();
                let mut values = vec![0f32; (rows * cols) as usize];
                dequantize_rowwise(
                    &bytes[0],
                    &bytes[1],
                    rows as usize,
                    cols as usize,
                    layout,
                    Output::F32(&mut values),
                )
                .unwrap();
                values
            } else {
                opt.running().unwrap().param_values(p).unwrap()
            };
            let grad: Vec<f32> = seen
                .iter()
                .enumerate()
                .map(|(i, &w)| {
                    noise((step << 40) ^ ((rank as u64) << 32) ^ ((p as u64) << 20) ^ i as u64) * 0.01 + 0.05 * w
                })
                .collect();
            let ptr = opt.running().unwrap().address(p, true).cast::<f32>();
            unsafe { std::slice::from_raw_parts_mut(ptr, grad.len()) }.copy_from_slice(&grad);
            opt.grad_ready(p as u32).unwrap();
        }
        opt.step(&ARGS).unwrap();
        // As a training loop does: zero the grads for the next iteration right after the step,
        // while (with overlap) the staged params may still be in flight on the grad buffer.
        opt.zero_grad().unwrap();
        for b in 0..buckets {
            opt.wait_params(b).unwrap();
        }
        let bytes = (0..specs.len())
            .map(|p| {
                if specs[p].flags.has(ParamFlags::MXFP8) {
                    mxfp8_bytes(opt, &specs[p], p, layout)
                } else {
                    Vec::new()
                }
            })
            .collect();
        let state = assemble(&specs, vec![opt.running().unwrap().owned_state().unwrap()]);
        history.push((bytes, state));
    }
    history
}

/// Trains at `dp` and returns rank 0's MXFP8 bytes, every rank's bytes checked equal, and the
/// assembled state of all ranks.
fn train(cfg: &Config, dp: usize, mxfp8: bool) -> History {
    let layout = if cfg.mxfp8_swizzled_scales {
        ScaleLayout::Swizzled
    } else {
        ScaleLayout::Compact
    };
    let opts = optimizers(cfg, dp, Duration::from_secs(20));
    let per_rank: Vec<History> = on_ranks(opts, |rank, mut opt| run_rank(&mut opt, mxfp8, rank, layout));
    let specs = model(true);
    (0..STEPS as usize)
        .map(|s| {
            for (rank, history) in per_rank.iter().enumerate() {
                assert_eq!(
                    history[s].0, per_rank[0][s].0,
                    "rank {rank} holds different MXFP8 bytes at step {s}"
                );
            }
            let mut state = vec![Vec::new(); specs.len()];
            for history in &per_rank {
                for (p, tensors) in history[s].1.iter().enumerate() {
                    if tensors.is_empty() {
                        continue;
                    }
                    if state[p].is_empty() {
                        state[p] = tensors.clone();
                    } else {
                        for (merged, part) in state[p].iter_mut().zip(tensors) {
                            for (m, v) in merged.iter_mut().zip(part) {
                                if !v.is_nan() {
                                    *m = *v;
                                }
                            }
                        }
                    }
                }
            }
            (per_rank[0][s].0.clone(), state)
        })
        .collect()
}

fn config(layout: MuonLayout, overlap: bool, mode: CommMode, gather: bool) -> Config {
    Config {
        muon_layout: layout,
        overlap_grad_reduce: overlap,
        overlap_param_gather: overlap,
        host_comm_mode: mode,
        mxfp8_param_gather: gather,
        clip_grad: 0.0,
        muon_ns_precision: NsPrecision::F32,
        bucket_size: 4096,
        ..Config::default()
    }
}

/// A history with every f32 replaced by its bits, so equality is bitwise (NaN included).
type HistoryBits = Vec<(Vec<Vec<Vec<u8>>>, Vec<Vec<Vec<u32>>>)>;

fn bits(history: &History) -> HistoryBits {
    history
        .iter()
        .map(|(b, s)| {
            (
                b.clone(),
                s.iter()
                    .map(|t| t.iter().map(|v| v.iter().map(|x| x.to_bits()).collect()).collect())
                    .collect(),
            )
        })
        .collect()
}

#[test]
fn gather_of_staged_bf16_equals_quantizing_plain_bf16_bitwise() {
    for dp in [1usize, 2, 4] {
        for layout in [MuonLayout::Compact, MuonLayout::Padded] {
            for overlap in [true, false] {
                for mode in [CommMode::Eager, CommMode::Lazy] {
                    let label = format!("dp={dp} {} overlap={overlap} {}", layout.name(), mode.name());
                    let a = train(&config(layout, overlap, mode, true), dp, true);
                    let b = train(&config(layout, overlap, mode, true), dp, false);
                    assert!(
                        bits(&a) == bits(&b),
                        "{label}: MXFP8 gather differs from quantizing the bf16 path"
                    );
                }
            }
        }
    }
}

#[test]
fn local_quantize_without_gather_and_swizzled_scales_match_too() {
    let mut cfg = config(MuonLayout::Compact, true, CommMode::Lazy, false);
    let a = train(&cfg, 2, true);
    let b = train(&cfg, 2, false);
    assert!(bits(&a) == bits(&b), "MXFP8 without gather differs");
    cfg.mxfp8_param_gather = true;
    cfg.mxfp8_swizzled_scales = true;
    let a = train(&cfg, 2, true);
    let b = train(&cfg, 2, false);
    assert!(bits(&a) == bits(&b), "swizzled scales differ");
}

#[test]
fn params_change_every_step_with_overlap_and_lazy_comm() {
    let history = train(&config(MuonLayout::Compact, true, CommMode::Lazy, true), 2, true);
    for (p, spec) in model(true).iter().enumerate() {
        if !spec.flags.has(ParamFlags::MXFP8) {
            continue;
        }
        for s in 1..STEPS as usize {
            assert_ne!(
                history[s].0[p][0],
                history[s - 1].0[p][0],
                "param {p} froze at step {s}"
            );
        }
    }
}

#[test]
fn staging_stays_inside_each_buckets_grad_bytes_for_every_grad_dtype() {
    for grad_dtype in [Dtype::F32, Dtype::Bf16] {
        for layout in [MuonLayout::Compact, MuonLayout::Padded, MuonLayout::Allreduce] {
            let cfg = Config {
                grad_dtype,
                ..config(layout, true, CommMode::Eager, true)
            };
            let mut opt = optimizers(&cfg, 1, Duration::from_secs(5)).pop().unwrap();
            for spec in model(true) {
                opt.add_param(spec, None).unwrap();
            }
            opt.finalize().unwrap();
            let buckets = opt.plan().unwrap().buckets.len();
            for b in 0..buckets {
                assert!(
                    opt.running().unwrap().staging_stays_in_bucket(b),
                    "{grad_dtype:?} {layout:?} bucket {b}"
                );
            }
        }
    }
}

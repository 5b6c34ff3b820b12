//! QK-clip test material shared by `tests/qk_clip.rs` and `tests/cuda_emulated.rs`: head
//! layouts of every kind, a plain per-row reference, the emulation of `kernels/qk_clip.cu`
//! and the op-level comparison of a backend with the host backend.

use muon_opt::backend::Backend;
use muon_opt::backend::cuda::action::Arg;
use muon_opt::backend::ops::{BufferSizes, Mem, MemoryLayout, MuonWork, QkClipJob, QkMaxima, Span};
use muon_opt::config::Dtype;
use muon_opt::numerics::mxfp8::ScaleLayout;
use muon_opt::numerics::qk_clip::{MAX_SEGMENTS, QkHeads, QkKind, QkRowMap, pow_unit};
use muon_opt::schedule::QkClipRequest;

use super::rng::noise;
use super::training::bits;

/// A head layout with its matrix's column count.
pub struct Case {
    pub label: &'static str,
    pub heads: QkHeads,
    pub cols: usize,
}

fn heads(kind: QkKind, heads: u32, query_groups: u32, head_dim: u32, rope_dim: u32, v_head_dim: u32) -> QkHeads {
    QkHeads {
        kind,
        heads,
        query_groups,
        head_dim,
        rope_dim,
        v_head_dim,
    }
}

/// Every kind: MHA and GQA fused QKV, separate Q and K (GQA), MLA query and key/value.
pub fn cases() -> Vec<Case> {
    vec![
        Case {
            label: "fused QKV, MHA",
            heads: heads(QkKind::FusedQkv, 4, 4, 4, 0, 0),
            cols: 12,
        },
        Case {
            label: "fused QKV, GQA 6 heads in 2 groups",
            heads: heads(QkKind::FusedQkv, 6, 2, 4, 0, 0),
            cols: 8,
        },
        Case {
            label: "query, GQA",
            heads: heads(QkKind::Query, 6, 3, 4, 0, 0),
            cols: 8,
        },
        Case {
            label: "key, GQA",
            heads: heads(QkKind::Key, 6, 3, 4, 0, 0),
            cols: 8,
        },
        Case {
            label: "MLA query",
            heads: heads(QkKind::MlaQuery, 3, 0, 4, 2, 0),
            cols: 10,
        },
        Case {
            label: "MLA key/value",
            heads: heads(QkKind::MlaKeyValue, 3, 0, 4, 0, 5),
            cols: 6,
        },
    ]
}

/// Rows of the matrix of `heads`.
pub fn rows(heads: &QkHeads) -> usize {
    let (h, g, d) = (
        heads.heads as usize,
        heads.query_groups as usize,
        heads.head_dim as usize,
    );
    match heads.kind {
        QkKind::FusedQkv => h * d + 2 * g * d,
        QkKind::Query => h * d,
        QkKind::Key => g * d,
        QkKind::MlaQuery => h * (d + heads.rope_dim as usize),
        QkKind::MlaKeyValue => h * (d + heads.v_head_dim as usize),
    }
}

/// What the reference does to row `r`: the heads whose maxima decide it and the exponent of
/// η (None: a value row), written from the layouts' definitions (Megatron-LM's `clip_qk`).
fn row_rule(heads: &QkHeads, r: usize, alpha: f64) -> (std::ops::Range<usize>, Option<f64>) {
    let (h, g, d) = (
        heads.heads as usize,
        heads.query_groups as usize,
        heads.head_dim as usize,
    );
    match heads.kind {
        QkKind::FusedQkv => {
            let per = h / g * d + 2 * d;
            let (group, within) = (r / per, r % per);
            let e = if within < h / g * d {
                Some(alpha)
            } else if within < h / g * d + d {
                Some(1.0 - alpha)
            } else {
                None
            };
            (group * h / g..(group + 1) * h / g, e)
        }
        QkKind::Query => {
            let group = r / d / (h / g);
            (group * h / g..(group + 1) * h / g, Some(alpha))
        }
        QkKind::Key => (r / d * h / g..(r / d + 1) * h / g, Some(1.0 - alpha)),
        QkKind::MlaQuery => {
            let per = d + heads.rope_dim as usize;
            let e = if r % per < d { alpha } else { 1.0 };
            (r / per..r / per + 1, Some(e))
        }
        QkKind::MlaKeyValue => {
            let per = d + heads.v_head_dim as usize;
            (r / per..r / per + 1, (r % per < d).then_some(1.0 - alpha))
        }
    }
}

/// The plain reference: per row, η of its heads' max and the f64 `powf` of its exponent.
pub fn reference(w: &[f32], heads: &QkHeads, cols: usize, maxima: &[f32], tau: f32, alpha: f32) -> Vec<f32> {
    let mut out = w.to_vec();
    for (r, row) in out.chunks_mut(cols).enumerate() {
        let (group, e) = row_rule(heads, r, f64::from(alpha));
        let max = maxima[group].iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
        let (Some(e), true) = (e, max > tau) else { continue };
        if e == 0.0 {
            continue;
        }
        let f = (f64::from(tau / max)).powf(e) as f32;
        row.iter_mut().for_each(|v| *v *= f);
    }
    out
}

/// The maxima of [`grouped_qkv_request`]: one address for every run, so recorded ops compare.
static GROUPED_QKV_MAXIMA: [f32; 6] = [3.0, 40.0, 9.0, 9.5, 1e3, 2.0];

/// A clip of `cuda_model()`'s grouped QKV (3 query groups of 2 heads, head dim 4) with its
/// maxima at an address of the backend's memory: host memory on the host backend, standing
/// for device memory in a dry run.
pub fn grouped_qkv_request(specs: &[muon_opt::model::ParamSpec]) -> QkClipRequest {
    QkClipRequest {
        param: specs.iter().position(|s| s.name == "grouped.qkv.weight").unwrap() as u32,
        heads: QkHeads {
            kind: QkKind::FusedQkv,
            heads: 6,
            query_groups: 3,
            head_dim: 4,
            rope_dim: 0,
            v_head_dim: 0,
        },
        maxima: QkMaxima::Device(GROUPED_QKV_MAXIMA.as_ptr() as u64),
    }
}

/// Matrix values for case `k`.
pub fn values(k: usize, n: usize) -> Vec<f32> {
    (0..n as u64).map(|i| noise((k as u64) << 32 | i)).collect()
}

/// Applies `muon_qk_clip` as `kernels/qk_clip.cu` states it, thread for thread's arithmetic:
/// returns the writes `(address, value)`, reading f32 memory through `ld`.
pub fn emulate(args: &[Arg], ld: impl Fn(u64) -> f32) -> Vec<(u64, f32)> {
    let int = |i: usize| match args[i] {
        Arg::Ptr(v) | Arg::U64(v) => v,
        Arg::U32(v) => u64::from(v),
        ref other => panic!("muon_qk_clip argument {i} is {other:?}"),
    };
    let float = |i: usize| match args[i] {
        Arg::F32(v) => v,
        ref other => panic!("muon_qk_clip argument {i} is {other:?}"),
    };
    let Arg::Words(segs) = &args[6] else {
        panic!("muon_qk_clip argument 6 is {:?}", args[6])
    };
    assert_eq!(segs.len(), MAX_SEGMENTS);
    let (w, maxima, cols, groups, heads_per_group, segments) = (int(0), int(1), int(2), int(3), int(4), int(5));
    let (tau, alpha) = (float(7), float(8));
    let group_rows: u64 = segs[..segments as usize].iter().map(|s| s & 0xffff_ffff).sum();
    let mut writes = Vec::new();
    for g in 0..groups {
        let mut max = f32::NEG_INFINITY;
        let mut finite = true;
        for h in 0..heads_per_group {
            let s = ld(maxima + 4 * (g * heads_per_group + h));
            finite = finite && s.is_finite();
            if s > max {
                max = s;
            }
        }
        if !finite || max <= tau {
            continue;
        }
        let eta = tau / max;
        let mut row = 0;
        for &seg in &segs[..segments as usize] {
            let (rows, role) = (seg & 0xffff_ffff, seg >> 32);
            let e = match role {
                0 => f64::from(alpha),
                1 => 1.0 - f64::from(alpha),
                2 => 1.0,
                _ => 0.0,
            };
            if e != 0.0 {
                let factor = if e == 1.0 {
                    eta
                } else {
                    pow_unit(f64::from(eta), e) as f32
                };
                for i in (g * group_rows + row) * cols..(g * group_rows + row + rows) * cols {
                    writes.push((w + 4 * i, ld(w + 4 * i) * factor));
                }
            }
            row += rows;
        }
    }
    writes
}

/// Maxima sets for `n` heads around τ = 8: mixed, all above, all below, and specials (a NaN, an
/// infinity, exactly τ, negative).
pub fn maxima_sets(n: usize) -> Vec<Vec<f32>> {
    let mixed = (0..n).map(|h| [3.0, 40.0, 8.0, 9.5, 1e30, 200.0][h % 6]).collect();
    let above = (0..n).map(|h| 9.0 + 17.0 * h as f32).collect();
    let below = (0..n).map(|h| 8.0 - 0.5 * h as f32).collect();
    let specials = (0..n)
        .map(|h| [f32::NAN, 50.0, f32::INFINITY, 8.0, -90.0, 12.0][h % 6])
        .collect();
    vec![mixed, above, below, specials]
}

/// Runs every case × α × maxima set as `Op::QkClip` on `backend` (maxima on the device at
/// addresses of its memory when `device`, else host values); the masters' bits afterwards.
pub fn clip_script(backend: &mut dyn Backend, device: bool) -> Vec<Vec<u32>> {
    let tau = 8.0;
    let mut out = Vec::new();
    for (k, case) in cases().iter().enumerate() {
        let map: QkRowMap = case.heads.row_map(rows(&case.heads) as u64).unwrap();
        let n = map.rows() * case.cols;
        backend
            .allocate(&MemoryLayout {
                buffers: vec![BufferSizes::whole(64, Dtype::F32)],
                grad_dtype: Dtype::F32,
                master: n as u64,
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
        let master = Span::new(Mem::Master, 0, n as u64);
        for alpha in [0.0f32, 0.5, 1.0, 0.3] {
            for maxima in maxima_sets(map.heads()) {
                backend.upload(master, &values(k, n)).unwrap();
                let at = Span::new(Mem::Grad(0), 0, maxima.len() as u64);
                backend.upload(at, &maxima).unwrap();
                let maxima = if device {
                    QkMaxima::Device(backend.address(at) as u64)
                } else {
                    QkMaxima::Host(maxima)
                };
                let job = QkClipJob {
                    master,
                    cols: case.cols,
                    map: map.clone(),
                    maxima,
                    tau,
                    alpha,
                };
                backend.qk_clip(job).unwrap();
                out.push(bits(&backend.download(master).unwrap()));
            }
        }
    }
    out
}

//! Muon on tensor-parallel shards (`muon_tp_mode`), ranks on threads in a dp 2 × tp 2 grid:
//! in `duplicated` mode each owner gathers its matrices' shards over its TP group,
//! orthogonalizes the whole matrix and keeps its shard, so the full logical model after N
//! steps equals, bit for bit, the unsharded model trained at dp 2 (the math is the same:
//! element-wise steps per element, one Newton–Schulz on the same matrix, the same scale); in
//! `blockwise` mode each shard is orthogonalized alone, which equals the unsharded run with
//! every shard registered as a matrix of its own. Column-parallel (rows) and row-parallel
//! (columns) shards, a fused gate|up split per shard and Megatron's QKV split per query group
//! (TP shards whole groups) are covered, with the standard and the Gram Newton–Schulz
//! (`muon_ns_method`). A per-head split whose shards hold whole heads (`TP_WHOLE_COMPONENTS`)
//! orthogonalizes each head alone on its rank in every mode: bit for bit the unsharded
//! per-head model in all three.

mod support;

use std::sync::Arc;

use muon_opt::backend::cuda::CallerStream;
use muon_opt::comm::Communicator;
use muon_opt::config::{Config, Dtype, NsMethod, NsPrecision, TpMode};
use muon_opt::error::{ErrorKind, Result};
use muon_opt::model::{ParamFlags, ParamSpec};
use muon_opt::numerics::muon::TpDim;
use muon_opt::optimizer::Optimizer;
use support::ranks::{host_comms, on_ranks};
use support::rng::{milli, mix, name_hash};
use support::training::{ARGS, bits};

const DP: usize = 2;
const TP: usize = 2;
const STEPS: usize = 3;

/// A weight of the logical (unsharded) model and how TP shards it.
struct Logical {
    name: &'static str,
    rows: usize,
    cols: usize,
    tp: Option<TpDim>,
    /// Fused components along the rows: each sharded over TP separately, or with `groups` > 1
    /// the pattern of one query group (Megatron's QKV: TP shards whole groups).
    splits: &'static [usize],
    groups: usize,
    /// The components are heads and TP holds whole ones (`TP_WHOLE_COMPONENTS`): shard t is
    /// rows `t·rows/TP ..`, its split the heads it holds.
    whole_heads: bool,
}

const MODEL: [Logical; 9] = [
    Logical {
        name: "attn.qkv.weight",
        rows: 64,
        cols: 32,
        tp: Some(TpDim::Rows),
        splits: &[16, 8, 8],
        groups: 2,
        whole_heads: false,
    },
    Logical {
        name: "mlp.gate_up.weight",
        rows: 64,
        cols: 32,
        tp: Some(TpDim::Rows),
        splits: &[32, 32],
        groups: 1,
        whole_heads: false,
    },
    Logical {
        name: "attn.proj.weight",
        rows: 32,
        cols: 48,
        tp: Some(TpDim::Cols),
        splits: &[],
        groups: 1,
        whole_heads: false,
    },
    Logical {
        name: "mlp.fc1.weight",
        rows: 64,
        cols: 32,
        tp: Some(TpDim::Rows),
        splits: &[],
        groups: 1,
        whole_heads: false,
    },
    Logical {
        name: "mlp.fc2.weight",
        rows: 32,
        cols: 64,
        tp: Some(TpDim::Cols),
        splits: &[],
        groups: 1,
        whole_heads: false,
    },
    Logical {
        name: "mlp.wide_in.weight",
        rows: 96,
        cols: 16,
        tp: Some(TpDim::Rows),
        splits: &[],
        groups: 1,
        whole_heads: false,
    },
    Logical {
        name: "mlp.wide_out.weight",
        rows: 16,
        cols: 96,
        tp: Some(TpDim::Cols),
        splits: &[],
        groups: 1,
        whole_heads: false,
    },
    Logical {
        name: "attn.q_heads.weight",
        rows: 32,
        cols: 24,
        tp: Some(TpDim::Rows),
        splits: &[8, 8, 8, 8],
        groups: 1,
        whole_heads: true,
    },
    Logical {
        name: "norm.weight",
        rows: 1,
        cols: 32,
        tp: None,
        splits: &[],
        groups: 1,
        whole_heads: false,
    },
];

impl Logical {
    fn components(&self) -> Vec<usize> {
        if self.splits.is_empty() {
            vec![self.rows]
        } else {
            self.splits.to_vec()
        }
    }

    /// TP rank `t`'s shard: its shape, its split, and for each of its elements the index of
    /// the logical element it holds.
    fn shard(&self, t: usize) -> (usize, usize, Vec<usize>, Vec<usize>) {
        match self.tp {
            None => (self.rows, self.cols, Vec::new(), (0..self.rows * self.cols).collect()),
            Some(TpDim::Cols) => {
                let c = self.cols / TP;
                let map = (0..self.rows)
                    .flat_map(|r| (0..c).map(move |j| r * self.cols + t * c + j))
                    .collect();
                (self.rows, c, Vec::new(), map)
            }
            Some(TpDim::Rows) if self.whole_heads => {
                let (rows, heads) = (self.rows / TP, self.splits.len() / TP);
                let map = (t * rows * self.cols..(t + 1) * rows * self.cols).collect();
                (rows, self.cols, self.splits[t * heads..(t + 1) * heads].to_vec(), map)
            }
            Some(TpDim::Rows) if self.groups > 1 => {
                let rows = self.rows / TP;
                let map = (t * rows * self.cols..(t + 1) * rows * self.cols).collect();
                (rows, self.cols, self.splits.to_vec(), map)
            }
            Some(TpDim::Rows) => {
                let mut map = Vec::new();
                let mut split = Vec::new();
                let mut start = 0;
                for rows in self.components() {
                    let local = rows / TP;
                    split.push(local);
                    for r in start + t * local..start + (t + 1) * local {
                        map.extend((0..self.cols).map(|j| r * self.cols + j));
                    }
                    start += rows;
                }
                let split = if self.splits.is_empty() { Vec::new() } else { split };
                (self.rows / TP, self.cols, split, map)
            }
        }
    }

    /// A param of `rows × cols` with `split` (one group's pattern when grouped) over as many
    /// query groups as its rows hold.
    fn spec(&self, name: String, rows: usize, cols: usize, split: Vec<usize>, flags: u32) -> ParamSpec {
        let shape: Vec<u64> = if self.rows == 1 {
            vec![cols as u64]
        } else {
            vec![rows as u64, cols as u64]
        };
        let groups = if self.groups > 1 {
            rows / self.splits.iter().sum::<usize>()
        } else {
            1
        };
        ParamSpec {
            flags: ParamFlags(flags),
            split_sizes: split.into_iter().map(|s| s as u64).collect(),
            split_groups: groups as u64,
            ..ParamSpec::new(name, &shape, Dtype::F32)
        }
    }
}

/// Logical element `i` of weight `name`: its initial value (`step` None) or the gradient of
/// data-parallel rank `d` at `step`.
fn value(name: &str, step: Option<usize>, d: usize, i: usize) -> f32 {
    let salt = step.map_or(0, |s| 1 + s * 7919 + d * 104_729) as u64;
    let v = milli(name_hash(name) ^ mix(salt) ^ i as u64);
    if step.is_none() { v * 0.1 } else { v }
}

fn config(mode: TpMode) -> Config {
    with_method(mode, NsMethod::Standard)
}

fn with_method(mode: TpMode, method: NsMethod) -> Config {
    Config {
        bucket_size: 1024,
        clip_grad: 0.0,
        muon_ns_precision: NsPrecision::F32,
        muon_tp_mode: mode,
        muon_ns_method: method,
        ..Config::default()
    }
}

/// One rank's registered params: (spec, logical element of each of its elements).
type Params = Vec<(ParamSpec, Vec<usize>, &'static str)>;

/// Trains `params` for STEPS steps as data-parallel rank `d`; returns each param's values.
fn train(opt: &mut Optimizer, params: &Params, d: usize) -> Result<Vec<Vec<f32>>> {
    for (spec, map, logical) in params {
        let init: Vec<f32> = map.iter().map(|&i| value(logical, None, d, i)).collect();
        opt.add_param(spec.clone(), Some(muon_opt::init_data::InitData::from_f32(&init)))?;
    }
    opt.finalize()?;
    // Bucket by bucket in the backward's order: each gathered (and released) with sharded params.
    let buckets: Vec<(u32, Vec<u32>)> = {
        let plan = opt.plan()?;
        muon_opt::plan::forward_order(&plan.buckets)
            .into_iter()
            .rev()
            .map(|b| (b as u32, plan.buckets[b].params.clone()))
            .collect()
    };
    for step in 0..STEPS {
        opt.zero_grad()?;
        for (b, members) in &buckets {
            opt.wait_params(*b)?;
            for &p in members {
                let (_, map, logical) = &params[p as usize];
                let ptr = opt.running()?.address(p as usize, true).cast::<f32>();
                // SAFETY: the host backend's f32 grad view of param p holds map.len() values.
                let g = unsafe { std::slice::from_raw_parts_mut(ptr, map.len()) };
                for (v, &i) in g.iter_mut().zip(map) {
                    *v = value(logical, Some(step), d, i);
                }
                opt.grad_ready(p)?;
            }
            opt.release_params(*b)?;
        }
        opt.step(&ARGS)?;
    }
    opt.synchronize()?;
    let mut values = vec![Vec::new(); params.len()];
    for (b, members) in &buckets {
        opt.wait_params(*b)?;
        for &p in members {
            let ptr = opt.running()?.address(p as usize, false).cast::<f32>();
            // SAFETY: the host backend's f32 param view of param p, gathered.
            values[p as usize] = unsafe { std::slice::from_raw_parts(ptr, params[p as usize].1.len()) }.to_vec();
        }
        opt.release_params(*b)?;
    }
    Ok(values)
}

/// TP rank `t`'s params, flagged as TP shards.
fn sharded_params(t: usize) -> Params {
    MODEL
        .iter()
        .map(|l| {
            let (rows, cols, split, map) = l.shard(t);
            let flags = match l.tp {
                Some(TpDim::Rows) if l.whole_heads => ParamFlags::TP_SHARD_ROWS | ParamFlags::TP_WHOLE_COMPONENTS,
                Some(TpDim::Rows) => ParamFlags::TP_SHARD_ROWS,
                Some(TpDim::Cols) => ParamFlags::TP_SHARD_COLS,
                None if t > 0 => ParamFlags::NORM_REPLICA,
                None => 0,
            };
            (l.spec(l.name.to_string(), rows, cols, split, flags), map, l.name)
        })
        .collect()
}

/// The full logical model of a dp × tp run: each weight assembled from its TP shards (as
/// trained by data-parallel rank 0; every data-parallel rank holds the same values).
fn tp_run(mode: TpMode, method: NsMethod) -> Vec<Vec<f32>> {
    tp_run_with(&with_method(mode, method))
}

/// [`tp_run`] under `cfg`.
fn tp_run_with(cfg: &Config) -> Vec<Vec<f32>> {
    let data: Vec<Vec<Arc<Communicator>>> = (0..TP).map(|_| host_comms(DP)).collect();
    let tensor: Vec<Vec<Arc<Communicator>>> = (0..DP).map(|_| host_comms(TP)).collect();
    let results: Vec<Result<Vec<Vec<f32>>>> = on_ranks(
        (0..TP).flat_map(|t| (0..DP).map(move |d| (d, t))),
        |_, (d, t)| -> Result<Vec<Vec<f32>>> {
            let (dp_comm, tp_comm) = (data[t][d].clone(), tensor[d][t].clone());
            let mut opt = Optimizer::new(cfg.clone(), dp_comm.claim()?, CallerStream::NULL)?;
            opt.set_tp_group(tp_comm)?;
            train(&mut opt, &sharded_params(t), d)
        },
    );
    let shards: Vec<Vec<Vec<f32>>> = results.into_iter().map(|r| r.unwrap()).collect();
    // shards[t * DP + d][param]
    MODEL
        .iter()
        .enumerate()
        .map(|(p, l)| {
            let mut full = vec![f32::NAN; l.rows * l.cols];
            for t in 0..TP {
                for d in 0..DP {
                    assert_eq!(
                        bits(&shards[t * DP + d][p]),
                        bits(&shards[t * DP][p]),
                        "{}: data-parallel ranks differ",
                        l.name
                    );
                }
                for (&v, i) in shards[t * DP][p].iter().zip(l.shard(t).3) {
                    full[i] = v;
                }
            }
            full
        })
        .collect()
}

/// The unsharded model (or, `split_shards`, every shard a matrix of its own) at dp 2, TP 1.
fn reference_run(split_shards: bool, method: NsMethod) -> Vec<Vec<f32>> {
    reference_run_with(split_shards, &with_method(TpMode::Blockwise, method))
}

/// [`reference_run`] under `cfg` (its TP mode unused: nothing is sharded).
fn reference_run_with(split_shards: bool, cfg: &Config) -> Vec<Vec<f32>> {
    let params: Params = MODEL
        .iter()
        .flat_map(|l| {
            if split_shards && l.tp.is_some() {
                (0..TP)
                    .map(|t| {
                        let (rows, cols, split, map) = l.shard(t);
                        (
                            l.spec(format!("{}.shard{t}", l.name), rows, cols, split, 0),
                            map,
                            l.name,
                        )
                    })
                    .collect::<Vec<_>>()
            } else {
                let split = l.splits.to_vec();
                vec![(
                    l.spec(l.name.to_string(), l.rows, l.cols, split, 0),
                    (0..l.rows * l.cols).collect(),
                    l.name,
                )]
            }
        })
        .collect();
    let comms = host_comms(DP);
    let results: Vec<Result<Vec<Vec<f32>>>> = on_ranks(0..DP, |_, d| -> Result<Vec<Vec<f32>>> {
        let (comm, params) = (comms[d].clone(), &params);
        let mut opt = Optimizer::new(cfg.clone(), comm.claim()?, CallerStream::NULL)?;
        train(&mut opt, params, d)
    });
    let values = results.into_iter().next().unwrap().unwrap();
    MODEL
        .iter()
        .map(|l| {
            let mut full = vec![f32::NAN; l.rows * l.cols];
            for (p, (_, map, logical)) in params.iter().enumerate() {
                if *logical == l.name {
                    for (&v, &i) in values[p].iter().zip(map) {
                        full[i] = v;
                    }
                }
            }
            full
        })
        .collect()
}

fn assert_same_model(got: &[Vec<f32>], want: &[Vec<f32>]) {
    for (l, (g, w)) in MODEL.iter().zip(got.iter().zip(want)) {
        assert!(g.iter().all(|v| v.is_finite()), "{}: every element assembled", l.name);
        assert_eq!(bits(g), bits(w), "{}", l.name);
    }
}

#[test]
fn duplicated_shards_train_bitwise_like_the_unsharded_model() {
    let initial: Vec<f32> = (0..64 * 32).map(|i| value("attn.qkv.weight", None, 0, i)).collect();
    let duplicated = tp_run(TpMode::Duplicated, NsMethod::Standard);
    assert_ne!(bits(&duplicated[0]), bits(&initial), "the weights moved");
    assert_same_model(&duplicated, &reference_run(false, NsMethod::Standard));
}

/// Sharded params (`param_sharding = sharded`) at dp 2 × tp 2 in duplicated mode: each TP
/// rank's data-parallel group keeps its owned shards and gathers the rest around their use,
/// and the model trains bitwise like the unsharded, replicated one.
#[test]
fn sharded_params_with_duplicated_shards_train_bitwise_like_the_unsharded_model() {
    let cfg = Config {
        param_sharding: muon_opt::config::ParamSharding::Sharded,
        ..config(TpMode::Duplicated)
    };
    assert_same_model(&tp_run_with(&cfg), &reference_run(false, NsMethod::Standard));
}

/// A bf16 momentum (`muon_momentum_dtype = bf16`) in duplicated mode: each TP rank rounds its
/// shard's momentum as the unsharded param rounds those elements, so the model trains bitwise
/// like the unsharded bf16-momentum model, and differs from the f32-momentum one.
#[test]
fn duplicated_shards_with_a_bf16_momentum_train_bitwise_like_the_unsharded_model() {
    let cfg = Config {
        muon_momentum_dtype: muon_opt::config::Dtype::Bf16,
        ..config(TpMode::Duplicated)
    };
    let bf16 = tp_run_with(&cfg);
    assert_same_model(&bf16, &reference_run_with(false, &cfg));
    let f32 = tp_run(TpMode::Duplicated, NsMethod::Standard);
    assert_ne!(bits(&bf16[0]), bits(&f32[0]), "the momentum dtype changes the update");
}

/// AdaMuon (`muon_variant = adamuon`) in duplicated mode: its second moment is element-wise, so
/// each TP rank's moments of its chunk of the gathered orthogonalized matrix are those the
/// unsharded param keeps for those elements, and the model trains bitwise like the unsharded
/// AdaMuon model, and differs from the Muon one.
#[test]
fn duplicated_shards_with_adamuon_train_bitwise_like_the_unsharded_model() {
    let cfg = Config {
        muon_variant: muon_opt::config::MuonVariant::Adamuon,
        ..config(TpMode::Duplicated)
    };
    let adamuon = tp_run_with(&cfg);
    assert_same_model(&adamuon, &reference_run_with(false, &cfg));
    let muon = tp_run(TpMode::Duplicated, NsMethod::Standard);
    assert_ne!(bits(&adamuon[0]), bits(&muon[0]), "the variant changes the update");
}

#[test]
fn blockwise_shards_train_like_separate_matrices_and_differ_from_duplicated() {
    let blockwise = tp_run(TpMode::Blockwise, NsMethod::Standard);
    assert_same_model(&blockwise, &reference_run(true, NsMethod::Standard));
    let unsharded = reference_run(false, NsMethod::Standard);
    for (l, (b, u)) in MODEL.iter().zip(blockwise.iter().zip(&unsharded)) {
        if l.whole_heads {
            assert_eq!(bits(b), bits(u), "{}: each head is orthogonalized alone", l.name);
        } else if l.tp.is_some() {
            assert_ne!(
                bits(b),
                bits(u),
                "{}: orthogonalizing shards alone is another update",
                l.name
            );
        }
    }
}

/// The initial values of logical param `l`.
fn initial(l: &Logical) -> Vec<f32> {
    (0..l.rows * l.cols).map(|i| value(l.name, None, 0, i)).collect()
}

/// The largest `|a − b|`, NaN if any difference is NaN.
fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(
        0.0f32,
        |m, d| if d.is_nan() || m.is_nan() { f32::NAN } else { m.max(d) },
    )
}

/// `distributed` mode runs Newton–Schulz on the shards with the norm and every `X·Xᵀ` summed
/// over the TP group: the unsharded model's update up to the order of those sums (and, for a
/// row split, the orientation of the iterate), so the full model after 3 steps is within
/// float rounding of the unsharded one — while orthogonalizing the shards alone (`blockwise`)
/// is another update by orders of magnitude more.
#[test]
fn distributed_shards_train_like_the_unsharded_model_up_to_rounding() {
    let unsharded = reference_run(false, NsMethod::Standard);
    let distributed = tp_run(TpMode::Distributed, NsMethod::Standard);
    let blockwise = tp_run(TpMode::Blockwise, NsMethod::Standard);
    for (l, ((d, u), b)) in MODEL.iter().zip(distributed.iter().zip(&unsharded).zip(&blockwise)) {
        if l.tp.is_none() || l.whole_heads {
            assert_eq!(
                bits(d),
                bits(u),
                "{}: element-wise params and heads are bitwise",
                l.name
            );
            continue;
        }
        let moved = max_abs_diff(u, &initial(l));
        let off = max_abs_diff(d, u);
        let blockwise_off = max_abs_diff(b, u);
        assert!(
            off <= 1e-4 * moved,
            "{}: {off} off the unsharded model, which moved {moved}",
            l.name
        );
        assert!(
            blockwise_off > 100.0 * off.max(f32::EPSILON * moved),
            "{}: blockwise {blockwise_off}, distributed {off}",
            l.name
        );
    }
}

/// With `muon_ns_method = gram`, `duplicated` mode orthogonalizes each gathered matrix as the
/// unsharded model does, so it trains bit for bit like the unsharded gram model. The Gram
/// iteration ran where it applies (those weights differ from the standard model's), and the
/// square components (`mlp.gate_up.weight`'s two 32 × 32) took the standard path: bitwise the
/// standard model's.
#[test]
fn duplicated_shards_with_gram_train_bitwise_like_the_unsharded_gram_model() {
    let gram = reference_run(false, NsMethod::Gram);
    assert_same_model(&tp_run(TpMode::Duplicated, NsMethod::Gram), &gram);
    let standard = reference_run(false, NsMethod::Standard);
    for (l, (g, s)) in MODEL.iter().zip(gram.iter().zip(&standard)) {
        let standard_path = l.name == "mlp.gate_up.weight" || l.tp.is_none();
        assert_eq!(bits(g) == bits(s), standard_path, "{}", l.name);
    }
}

/// `distributed` mode with `gram`: each rank runs the Gram iteration on its shard's iterate
/// where `gram_applies` holds for it (m = the unsplit side, n = the shard's part of the split
/// side), each `X·Xᵀ` completed over the TP group. Here only the two wide weights have wide
/// shard iterates (16 × 48), so they alone differ from a distributed `standard` run; every
/// other shard iterate is square or tall and takes the standard iteration, bitwise. The model
/// is within rounding of the unsharded gram model: at most 1e-4 of how far each weight moved
/// in 3 steps (the sums over the shards change the order of additions, and where the shard
/// takes the standard iteration the unsharded matrix took the Gram one).
#[test]
fn distributed_shards_with_gram_train_like_the_unsharded_gram_model_up_to_rounding() {
    let unsharded = reference_run(false, NsMethod::Gram);
    let gram = tp_run(TpMode::Distributed, NsMethod::Gram);
    let standard = tp_run(TpMode::Distributed, NsMethod::Standard);
    for (l, ((g, s), u)) in MODEL.iter().zip(gram.iter().zip(&standard).zip(&unsharded)) {
        // The heads (8 × 24 each) are wide on their rank too.
        let wide_shards = l.name.starts_with("mlp.wide") || l.whole_heads;
        assert_eq!(bits(g) != bits(s), wide_shards, "{}", l.name);
        if l.tp.is_none() {
            assert_eq!(bits(g), bits(u), "{}: element-wise params are bitwise", l.name);
            continue;
        }
        let moved = max_abs_diff(u, &initial(l));
        let off = max_abs_diff(g, u);
        assert!(
            off <= 1e-4 * moved,
            "{}: {off} off the unsharded gram model, which moved {moved}",
            l.name
        );
    }
}

/// Expert tensor parallelism (Megatron's `expt_tp`): an expert stack whose every expert is
/// split along its rows; each owner gathers each of its experts whole, so the stack trains as
/// the unsharded one bit for bit, also where one rank's experts form a batch.
#[test]
fn duplicated_expert_stacks_train_like_the_unsharded_stack() {
    const EXPERTS: usize = 4;
    let (rows, cols) = (16usize, 12usize);
    let stack = |rows: usize, flags: u32| ParamSpec {
        flags: ParamFlags(ParamFlags::EXPERT_STACK | flags),
        ..ParamSpec::new("experts.fc1", &[EXPERTS as u64, rows as u64, cols as u64], Dtype::F32)
    };
    let shard_map = |t: usize| -> Vec<usize> {
        (0..EXPERTS)
            .flat_map(|e| {
                (t * rows / TP..(t + 1) * rows / TP)
                    .flat_map(move |r| (0..cols).map(move |c| (e * rows + r) * cols + c))
            })
            .collect()
    };
    let data: Vec<Vec<Arc<Communicator>>> = (0..TP).map(|_| host_comms(DP)).collect();
    let tensor: Vec<Vec<Arc<Communicator>>> = (0..DP).map(|_| host_comms(TP)).collect();
    let shards: Vec<Vec<f32>> = on_ranks(
        (0..TP).flat_map(|t| (0..DP).map(move |d| (d, t))),
        |_, (d, t)| -> Result<Vec<f32>> {
            let (dp_comm, tp_comm) = (data[t][d].clone(), tensor[d][t].clone());
            let mut opt = Optimizer::new(config(TpMode::Duplicated), dp_comm.claim()?, CallerStream::NULL)?;
            opt.set_tp_group(tp_comm)?;
            let params: Params = vec![(stack(rows / TP, ParamFlags::TP_SHARD_ROWS), shard_map(t), "experts.fc1")];
            Ok(train(&mut opt, &params, d)?.remove(0))
        },
    )
    .into_iter()
    .map(Result::unwrap)
    .collect();
    let comms = host_comms(DP);
    let whole: Vec<f32> = on_ranks(0..DP, |_, d| -> Result<Vec<f32>> {
        let comm = comms[d].clone();
        let mut opt = Optimizer::new(config(TpMode::Blockwise), comm.claim()?, CallerStream::NULL)?;
        let params: Params = vec![(stack(rows, 0), (0..EXPERTS * rows * cols).collect(), "experts.fc1")];
        Ok(train(&mut opt, &params, d)?.remove(0))
    })
    .into_iter()
    .map(Result::unwrap)
    .next()
    .unwrap();
    let mut assembled = vec![f32::NAN; whole.len()];
    for t in 0..TP {
        for (&v, i) in shards[t * DP].iter().zip(shard_map(t)) {
            assembled[i] = v;
        }
    }
    assert_eq!(bits(&assembled), bits(&whole));
}

/// Finalize refuses a duplicated shard without a TP group, TP ranks whose shards differ, and TP
/// ranks whose momentum dtypes differ.
#[test]
fn duplicated_mode_needs_the_tp_group_and_matching_shards() {
    let comm = host_comms(1).remove(0);
    let mut opt = Optimizer::new(config(TpMode::Duplicated), comm.claim().unwrap(), CallerStream::NULL).unwrap();
    let spec = sharded_params(0).remove(0).0;
    opt.add_param(spec, None).unwrap();
    let err = opt.finalize().unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidState);
    assert!(err.message.contains("muon_optimizer_set_tp_group"), "{err}");
    let comm = host_comms(1).remove(0);
    let mut opt = Optimizer::new(config(TpMode::Distributed), comm.claim().unwrap(), CallerStream::NULL).unwrap();
    opt.add_param(sharded_params(0).remove(0).0, None).unwrap();
    let err = opt.finalize().unwrap_err();
    assert!(err.message.contains("muon_tp_mode distributed orthogonalizes"), "{err}");

    let tensor = host_comms(TP);
    let results: Vec<Result<()>> = on_ranks(0..TP, |_, t| -> Result<()> {
        let tp_comm = tensor[t].clone();
        let comm = host_comms(1).remove(0);
        let mut opt = Optimizer::new(config(TpMode::Duplicated), comm.claim()?, CallerStream::NULL)?;
        opt.set_tp_group(tp_comm)?;
        let rows = if t == 0 { 32 } else { 16 };
        let flags = ParamFlags(ParamFlags::TP_SHARD_ROWS);
        opt.add_param(
            ParamSpec {
                flags,
                ..ParamSpec::new("fc1.weight", &[rows, 32], Dtype::F32)
            },
            None,
        )?;
        opt.finalize()
    });
    for r in results {
        let err = r.unwrap_err();
        assert_eq!(err.kind, ErrorKind::PlanMismatch);
        for part in [
            "shard shape of 'fc1.weight'",
            "[32, 32] on TP rank 0",
            "[16, 32] on TP rank 1",
        ] {
            assert!(err.message.contains(part), "{err}");
        }
    }

    let tensor = host_comms(TP);
    let results: Vec<Result<()>> = on_ranks(0..TP, |_, t| -> Result<()> {
        let cfg = Config {
            muon_momentum_dtype: if t == 0 { Dtype::F32 } else { Dtype::Bf16 },
            ..config(TpMode::Duplicated)
        };
        let comm = host_comms(1).remove(0);
        let mut opt = Optimizer::new(cfg, comm.claim()?, CallerStream::NULL)?;
        opt.set_tp_group(tensor[t].clone())?;
        opt.add_param(sharded_params(t).remove(0).0, None)?;
        opt.finalize()
    });
    for r in results {
        let err = r.unwrap_err();
        assert_eq!(err.kind, ErrorKind::PlanMismatch);
        assert!(err.message.contains("muon_momentum_dtype"), "{err}");
    }
}

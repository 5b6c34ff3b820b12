//! Checkpoints of tensor-parallel shards in the unsharded params' coordinates (docs/checkpoint.md,
//! "Tensor parallelism"): a model with Megatron's fused QKV of 4 query groups (TP shards whole
//! groups; one per rank at TP 4), SwiGLU's gate|up and a GatedDeltaNet-shaped in_proj
//! (q|k|v|z|β|α with 4-row β and α blocks; both split alike on every TP rank), a row-parallel
//! projection (columns), a vocab-parallel embedding and a column-parallel bias (AdamW shards)
//! and a layer norm every TP rank holds, trained at TP 2 × DP 2 in `duplicated` mode (which
//! trains bit for bit like the unsharded model), saved by each TP rank into its own directory,
//! then loaded at TP 1, TP 4 and TP 2 with other data-parallel sizes and continued: every
//! master, momentum and Adam moment, assembled in the unsharded coordinates, and every param
//! value is bitwise the unsharded run's. Gradients are the same on every data-parallel rank and
//! each element is ±2^e, so the reduced gradient is exact at every dp
//! (`tests/support/checkpoint.rs`).

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use muon_opt::backend::cuda::CallerStream;
use muon_opt::checkpoint::TpRank;
use muon_opt::checkpoint::export::export;
use muon_opt::checkpoint::inspect::inspect;
use muon_opt::comm::Communicator;
use muon_opt::config::{CommMode, Config, Dtype, NsPrecision, TpMode};
use muon_opt::error::{Error, ErrorKind, Result};
use muon_opt::init_data::InitData;
use muon_opt::model::{ParamFlags, ParamSpec, Route};
use muon_opt::optimizer::Optimizer;
use support::ranks::{host_comms, on_ranks};
use support::rng::{mix, name_hash};
use support::tempdir::TempDir;
use support::training::ARGS;

/// How the TP ranks hold a weight of the unsharded model.
#[derive(Clone, Copy, PartialEq)]
enum Shard {
    /// Every rank holds all of it (flagged NORM_REPLICA on TP ranks > 0).
    Copy,
    /// Rows, every fused component split alike.
    Rows,
    /// Whole groups of a per-group split.
    Groups,
    /// Columns.
    Cols,
}

struct Logical {
    name: &'static str,
    shape: &'static [usize],
    shard: Shard,
    /// One group's components along the rows; `groups` groups.
    splits: &'static [usize],
    groups: usize,
    flags: u32,
}

const MODEL: [Logical; 7] = [
    Logical {
        name: "embedding.weight",
        shape: &[48, 32],
        shard: Shard::Rows,
        splits: &[],
        groups: 1,
        flags: ParamFlags::EMBEDDING_OR_OUTPUT,
    },
    Logical {
        name: "attn.qkv.weight",
        shape: &[64, 32],
        shard: Shard::Groups,
        splits: &[8, 4, 4],
        groups: 4,
        flags: 0,
    },
    Logical {
        name: "attn.qkv.bias",
        shape: &[64],
        shard: Shard::Rows,
        splits: &[],
        groups: 1,
        flags: 0,
    },
    Logical {
        name: "attn.proj.weight",
        shape: &[32, 64],
        shard: Shard::Cols,
        splits: &[],
        groups: 1,
        flags: 0,
    },
    Logical {
        name: "norm.weight",
        shape: &[32],
        shard: Shard::Copy,
        splits: &[],
        groups: 1,
        flags: 0,
    },
    Logical {
        name: "mlp.fc1.weight",
        shape: &[64, 32],
        shard: Shard::Rows,
        splits: &[32, 32],
        groups: 1,
        flags: 0,
    },
    Logical {
        name: "gdn.in_proj.weight",
        shape: &[104, 32],
        shard: Shard::Rows,
        splits: &[16, 16, 32, 32, 4, 4],
        groups: 1,
        flags: 0,
    },
];

impl Logical {
    fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// TP rank `t` of `tp`'s shard: its spec and, for each of its elements, the unsharded
    /// element it holds.
    fn shard(&self, t: usize, tp: usize) -> (ParamSpec, Vec<usize>) {
        let cols = if self.shape.len() == 2 { self.shape[1] } else { 1 };
        let rows = self.shape[0];
        let components = if self.splits.is_empty() {
            vec![rows]
        } else {
            self.splits.to_vec()
        };
        let row_map = |rows: std::ops::Range<usize>| rows.flat_map(move |r| (0..cols).map(move |j| r * cols + j));
        let (mut shape, mut splits, mut groups, mut flags) =
            (self.shape.to_vec(), self.splits.to_vec(), self.groups, self.flags);
        let map: Vec<usize> = match self.shard {
            _ if tp == 1 => (0..self.numel()).collect(),
            Shard::Copy => {
                if t > 0 {
                    flags |= ParamFlags::NORM_REPLICA;
                }
                (0..self.numel()).collect()
            }
            Shard::Groups => {
                shape[0] /= tp;
                groups /= tp;
                flags |= ParamFlags::TP_SHARD_ROWS | ParamFlags::TP_WHOLE_GROUPS;
                row_map(t * shape[0]..(t + 1) * shape[0]).collect()
            }
            Shard::Rows => {
                shape[0] /= tp;
                splits.iter_mut().for_each(|s| *s /= tp);
                flags |= ParamFlags::TP_SHARD_ROWS;
                let mut start = 0;
                let mut map = Vec::new();
                for c in components {
                    let local = c / tp;
                    map.extend(row_map(start + t * local..start + (t + 1) * local));
                    start += c;
                }
                map
            }
            Shard::Cols => {
                shape[1] /= tp;
                flags |= ParamFlags::TP_SHARD_COLS;
                let c = shape[1];
                (0..rows)
                    .flat_map(|r| (0..c).map(move |j| r * cols + t * c + j))
                    .collect()
            }
        };
        let spec = ParamSpec {
            flags: ParamFlags(flags),
            split_sizes: splits.iter().map(|&s| s as u64).collect(),
            split_groups: groups as u64,
            ..ParamSpec::new(
                self.name,
                &shape.iter().map(|&d| d as u64).collect::<Vec<_>>(),
                Dtype::F32,
            )
        };
        (spec, map)
    }
}

fn init(name: &str, i: usize) -> f32 {
    0.1 * ((mix(name_hash(name) ^ i as u64) >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
}

/// The gradient of unsharded element `i` of `name` at `step` seeing value `w`: ±2^e, the same
/// on every data-parallel rank.
fn grad(step: u64, name: &str, i: usize, w: f32) -> f32 {
    let h = mix((step << 48) ^ name_hash(name) ^ ((i as u64) << 8) ^ u64::from(w.to_bits()));
    let magnitude = 2f32.powi(-14 + (h % 8) as i32);
    if (h >> 20) & 1 == 1 { -magnitude } else { magnitude }
}

fn config() -> Config {
    Config {
        bucket_size: 2048,
        clip_grad: 0.0,
        muon_ns_precision: NsPrecision::F32,
        muon_tp_mode: TpMode::Duplicated,
        host_comm_mode: CommMode::Eager,
        ..Config::default()
    }
}

/// One step of a job.
enum Phase<'a> {
    Train(u64),
    /// Every TP rank saves into its directory.
    Save(&'a [PathBuf]),
    /// `muon_optimizer_load_union` of all of them.
    LoadUnion(&'a [PathBuf]),
    /// `muon_optimizer_load` of the one directory.
    Load(&'a Path),
    /// `muon_optimizer_load` of this TP rank's own directory.
    LoadOwn(&'a [PathBuf]),
    /// `muon_optimizer_load_union` of these, which must fail: on this rank (a shard it would
    /// read is missing: CHECKPOINT_MISMATCH) or on a rank of its TP group.
    FailedLoadUnion(&'a [PathBuf]),
    Snapshot,
}

/// What one rank holds at a snapshot, in unsharded coordinates: its step count, its values of
/// every param and the state it owns, as (param, unsharded element, [master, moments…]).
struct RankView {
    steps: u64,
    params: Vec<Vec<(usize, f32)>>,
    state: Vec<(usize, usize, Vec<f32>)>,
}

fn train(opt: &mut Optimizer, maps: &[Vec<usize>], steps: u64) -> Result<()> {
    for _ in 0..steps {
        let step = opt.running()?.steps()?;
        opt.zero_grad()?;
        for bucket in 0..opt.plan()?.buckets.len() as u32 {
            opt.wait_params(bucket)?;
        }
        for (p, map) in maps.iter().enumerate().rev() {
            let seen = opt.running()?.param_values(p)?;
            let ptr = opt.running()?.address(p, true).cast::<f32>();
            // SAFETY: the host backend's f32 grad view of param p holds map.len() values.
            let g = unsafe { std::slice::from_raw_parts_mut(ptr, map.len()) };
            for ((g, &i), &w) in g.iter_mut().zip(map).zip(&seen) {
                *g = grad(step, MODEL[p].name, i, w);
            }
            opt.grad_ready(p as u32)?;
        }
        assert!(!opt.step(&ARGS)?.skipped);
    }
    Ok(())
}

fn view(opt: &mut Optimizer, maps: &[Vec<usize>]) -> Result<RankView> {
    let rt = opt.running()?;
    rt.synchronize()?;
    let params = (0..maps.len())
        .map(|p| Ok(maps[p].iter().copied().zip(rt.param_values(p)?).collect()))
        .collect::<Result<_>>()?;
    let mut state = Vec::new();
    for piece in rt.owned_state()? {
        let p = piece.param as usize;
        for k in 0..piece.range.len() as usize {
            let local = piece.range.start as usize + k;
            let values = std::iter::once(&piece.master)
                .chain(&piece.moments)
                .map(|v| v[k])
                .collect();
            state.push((p, maps[p][local], values));
        }
    }
    Ok(RankView {
        steps: rt.steps()?,
        params,
        state,
    })
}

/// Runs `phases` on a TP × DP grid of ranks on threads (TP rank t, data-parallel rank d);
/// returns each rank's views, or its first error.
fn job(tp: usize, dp: usize, phases: &[Phase]) -> Vec<Result<Vec<RankView>>> {
    let data: Vec<Vec<Arc<Communicator>>> = (0..tp).map(|_| host_comms(dp)).collect();
    let tensor: Vec<Vec<Arc<Communicator>>> = (0..dp).map(|_| host_comms(tp)).collect();
    on_ranks((0..tp).flat_map(|t| (0..dp).map(move |d| (t, d))), |_, (t, d)| {
        let mut opt = Optimizer::new(config(), data[t][d].claim()?, CallerStream::NULL)?;
        if tp > 1 {
            opt.set_tp_group(tensor[d][t].clone())?;
        }
        let mut maps = Vec::new();
        for l in &MODEL {
            let (spec, map) = l.shard(t, tp);
            let values: Vec<f32> = map.iter().map(|&i| init(l.name, i)).collect();
            opt.add_param(spec, Some(InitData::from_f32(&values)))?;
            maps.push(map);
        }
        opt.finalize()?;
        let mut views = Vec::new();
        for phase in phases {
            match phase {
                Phase::Train(steps) => train(&mut opt, &maps, *steps)?,
                Phase::Save(dirs) => opt.save(&dirs[t])?,
                Phase::LoadUnion(dirs) => opt.load_union(&dirs.iter().map(PathBuf::as_path).collect::<Vec<_>>())?,
                Phase::Load(dir) => opt.load(dir)?,
                Phase::LoadOwn(dirs) => opt.load(&dirs[t])?,
                Phase::FailedLoadUnion(dirs) => {
                    match opt.load_union(&dirs.iter().map(PathBuf::as_path).collect::<Vec<_>>()) {
                        Ok(()) => return Err(Error::new(ErrorKind::Internal, "a load missing TP shards succeeded")),
                        Err(e) if e.kind == ErrorKind::CheckpointMismatch => {}
                        Err(e) => return Err(e),
                    }
                }
                Phase::Snapshot => views.push(view(&mut opt, &maps)?),
            }
        }
        Ok(views)
    })
}

/// The unsharded model as every rank of a job sees it: per param its values and its state
/// tensors (master, moments), each element assembled from whichever rank owns it (a copy
/// every TP rank holds must be the same on all of them).
#[derive(PartialEq)]
struct Model {
    steps: u64,
    params: Vec<Vec<u32>>,
    state: Vec<Vec<Vec<u32>>>,
}

fn assemble(views: &[&RankView]) -> Model {
    let steps = views[0].steps;
    let mut params: Vec<Vec<Option<u32>>> = MODEL.iter().map(|l| vec![None; l.numel()]).collect();
    let mut state: Vec<Vec<Vec<Option<u32>>>> = MODEL
        .iter()
        .map(|l| {
            let kinds = if l.shape.len() == 2 && l.flags & ParamFlags::EMBEDDING_OR_OUTPUT == 0 {
                2
            } else {
                3
            };
            vec![vec![None; l.numel()]; kinds]
        })
        .collect();
    let put = |slot: &mut Option<u32>, v: f32, what: &str| {
        assert!(slot.is_none_or(|s| s == v.to_bits()), "{what}: ranks disagree");
        *slot = Some(v.to_bits());
    };
    for view in views {
        assert_eq!(view.steps, steps, "step counts differ");
        for (p, values) in view.params.iter().enumerate() {
            for &(i, v) in values {
                put(&mut params[p][i], v, MODEL[p].name);
            }
        }
        for (p, i, values) in &view.state {
            assert_eq!(values.len(), state[*p].len(), "{}: state kinds", MODEL[*p].name);
            for (k, &v) in values.iter().enumerate() {
                put(&mut state[*p][k][*i], v, MODEL[*p].name);
            }
        }
    }
    let whole = |v: Vec<Option<u32>>, name: &str| -> Vec<u32> {
        v.into_iter()
            .map(|b| b.unwrap_or_else(|| panic!("{name}: an element no rank holds")))
            .collect()
    };
    Model {
        steps,
        params: params.into_iter().zip(&MODEL).map(|(v, l)| whole(v, l.name)).collect(),
        state: state
            .into_iter()
            .zip(&MODEL)
            .map(|(s, l)| s.into_iter().map(|v| whole(v, l.name)).collect())
            .collect(),
    }
}

/// Each snapshot of a job, assembled over its ranks.
fn models(results: Vec<Result<Vec<RankView>>>) -> Vec<Model> {
    let views: Vec<Vec<RankView>> = results
        .into_iter()
        .enumerate()
        .map(|(r, v)| v.unwrap_or_else(|e| panic!("rank {r}: {e:?}")))
        .collect();
    (0..views[0].len())
        .map(|s| assemble(&views.iter().map(|v| &v[s]).collect::<Vec<_>>()))
        .collect()
}

fn assert_same(got: &Model, want: &Model, label: &str) {
    assert_eq!(got.steps, want.steps, "{label}: steps");
    for (p, l) in MODEL.iter().enumerate() {
        assert!(got.params[p] == want.params[p], "{label}: values of {}", l.name);
        for (k, (g, w)) in got.state[p].iter().zip(&want.state[p]).enumerate() {
            assert!(g == w, "{label}: state tensor {k} of {}", l.name);
        }
    }
}

const FIRST: u64 = 3;
const THEN: u64 = 2;

#[test]
fn a_tp2_checkpoint_resumes_at_tp1_tp4_and_tp2_bitwise_like_the_unsharded_run() {
    let tmp = TempDir::new("ckpt_tp");
    let tp2: Vec<PathBuf> = (0..2).map(|t| tmp.join(&format!("tp2-rank{t}"))).collect();
    let unsharded = [tmp.join("tp1")];
    let reference = models(job(
        1,
        2,
        &[
            Phase::Train(FIRST),
            Phase::Save(&unsharded),
            Phase::Snapshot,
            Phase::Train(THEN),
            Phase::Snapshot,
        ],
    ));
    let moved = reference[0].state.iter().zip(&reference[1].state).all(|(a, b)| a != b);
    assert!(
        moved,
        "every param's state moves in the steps after the save, which the resumed runs must reproduce"
    );

    let saved = models(job(2, 2, &[Phase::Train(FIRST), Phase::Save(&tp2), Phase::Snapshot]));
    assert_same(&saved[0], &reference[0], "TP 2 × DP 2 trains like the unsharded model");
    for index in &tp2 {
        let text = std::fs::read_to_string(index.join("index.json")).unwrap();
        assert!(text.contains(r#""format_version":2"#), "a TP checkpoint is version 2");
    }
    let plain = std::fs::read_to_string(unsharded[0].join("index.json")).unwrap();
    assert!(
        plain.contains(r#""format_version":1"#),
        "one without TP stays version 1"
    );

    for (tp, dp) in [(1, 3), (4, 1), (2, 1), (4, 2)] {
        let resumed = models(job(
            tp,
            dp,
            &[
                Phase::LoadUnion(&tp2),
                Phase::Snapshot,
                Phase::Train(THEN),
                Phase::Snapshot,
            ],
        ));
        assert_same(&resumed[0], &reference[0], &format!("loaded at TP {tp} × DP {dp}"));
        assert_same(&resumed[1], &reference[1], &format!("continued at TP {tp} × DP {dp}"));
    }
    // The unsharded checkpoint loads into TP shards.
    let from_unsharded = models(job(4, 1, &[Phase::Load(&unsharded[0]), Phase::Snapshot]));
    assert_same(&from_unsharded[0], &reference[0], "the TP 1 checkpoint loaded at TP 4");
    // A param every TP rank holds whole (the norm) is read from the lowest TP rank's
    // checkpoint: with its tensor keys broken in TP rank 1's copy, listed first, the load
    // still gives the reference.
    let broken = tmp.join("tp2-rank1-broken-norm");
    std::fs::create_dir_all(&broken).unwrap();
    for file in std::fs::read_dir(&tp2[1]).unwrap() {
        let file = file.unwrap();
        std::fs::copy(file.path(), broken.join(file.file_name())).unwrap();
    }
    edit_index(&broken, |index, _| {
        for component in entry(index, "norm.weight")["components"].as_array_mut().unwrap() {
            for piece in component["pieces"].as_array_mut().unwrap() {
                for key in piece["keys"].as_object_mut().unwrap().values_mut() {
                    *key = serde_json::json!("no.such.tensor");
                }
            }
        }
    });
    let lowest = models(job(
        1,
        2,
        &[Phase::LoadUnion(&[broken, tp2[0].clone()]), Phase::Snapshot],
    ));
    assert_same(&lowest[0], &reference[0], "the norm read from TP rank 0's checkpoint");
    // One TP rank's directory holds that rank's shards: each rank loads its own, and its
    // shards hold the reference's values.
    let own = job(2, 1, &[Phase::LoadOwn(&tp2), Phase::Snapshot]);
    for (t, loaded) in own.iter().enumerate() {
        let views = loaded
            .as_ref()
            .unwrap_or_else(|e| panic!("TP rank {t} loads its own directory: {e}"));
        assert_eq!(views[0].steps, reference[0].steps);
        for (p, values) in views[0].params.iter().enumerate() {
            for &(i, v) in values {
                assert_eq!(
                    v.to_bits(),
                    reference[0].params[p][i],
                    "TP rank {t}: {}[{i}]",
                    MODEL[p].name
                );
            }
        }
    }
    // And no other's: given one rank's directory, the other rank fails, naming why, and so
    // does the rank whose shards are there (all or nothing over the TP group).
    for t in 0..2 {
        let loaded = job(2, 1, &[Phase::Load(&tp2[t]), Phase::Snapshot]);
        let peer = loaded[t]
            .as_ref()
            .err()
            .expect("a load that fails on a TP peer commits nothing");
        assert!(
            peer.message
                .contains(&format!("load failed on rank {} of the tensor-parallel group", 1 - t)),
            "{}",
            peer.message
        );
        let err = loaded[1 - t]
            .as_ref()
            .err()
            .expect("the other TP rank's shards are not there");
        assert_eq!(err.kind, ErrorKind::CheckpointMismatch, "{}", err.message);
        for needle in [
            &format!(
                "this rank needs at TP rank {} of 2 are in none of the checkpoints holding it",
                1 - t
            ),
            &format!("(TP rank {t} of 2)"),
            "load the checkpoints of every TP rank together (muon_optimizer_load_union)",
        ] {
            assert!(err.message.contains(needle), "'{}' lacks '{needle}'", err.message);
        }
    }
}

/// The TP ranks' checkpoints export together as the unsharded model: the same bytes as the
/// export of the unsharded run's checkpoint. One of them alone is refused, naming what is
/// missing.
#[test]
fn the_tp_ranks_checkpoints_export_as_the_unsharded_model() {
    let tmp = TempDir::new("ckpt_tp_export");
    let tp2: Vec<PathBuf> = (0..2).map(|t| tmp.join(&format!("tp2-rank{t}"))).collect();
    let unsharded = [tmp.join("tp1")];
    models(job(1, 2, &[Phase::Train(FIRST), Phase::Save(&unsharded)]));
    models(job(2, 2, &[Phase::Train(FIRST), Phase::Save(&tp2)]));
    let (a, b) = (tmp.join("tp1.safetensors"), tmp.join("tp2.safetensors"));
    export(&[&unsharded[0]], &a).unwrap();
    let dirs: Vec<&Path> = tp2.iter().map(PathBuf::as_path).collect();
    export(&dirs, &b).unwrap();
    assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(), "same bytes");
    // inspect reads one TP rank's checkpoint: version 2, its TP rank, the half it holds.
    let whole = inspect(&unsharded[0]).unwrap();
    let half = inspect(&tp2[1]).unwrap();
    assert_eq!((whole.format_version, whole.tp), (1, None));
    assert_eq!((half.format_version, half.tp), (2, Some(TpRank { rank: 1, size: 2 })));
    for (h, w) in half.routes.iter().zip(&whole.routes) {
        let copies = if h.route == Route::Adamw { 32 } else { 0 };
        assert_eq!(
            2 * h.items,
            w.items + copies,
            "{:?}: TP rank 1 holds half, and the norm whole",
            h.route
        );
    }
    let err = export(&dirs[..1], &tmp.join("half.safetensors")).unwrap_err();
    assert_eq!(err.kind, ErrorKind::CheckpointMismatch);
    for needle in [
        "param 'embedding.weight': 768 of the 1536 items",
        "(TP rank 0 of 2)",
        "export the checkpoints of every TP rank together",
    ] {
        assert!(err.message.contains(needle), "'{}' lacks '{needle}'", err.message);
    }
    assert!(!tmp.join("half.safetensors").exists());
}

/// Edits `index.json` of `dir` (the envelope's version and checksum rewritten to match).
fn edit_index(dir: &Path, edit: impl Fn(&mut serde_json::Value, &mut u64)) {
    let path = dir.join("index.json");
    let file: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let (mut index, mut version) = (file["index"].clone(), file["format_version"].as_u64().unwrap());
    edit(&mut index, &mut version);
    let text = serde_json::to_string(&index).unwrap();
    let envelope = format!(
        r#"{{"format":{},"format_version":{version},"crc32":"{:08x}","index":{text}}}"#,
        file["format"],
        crc32fast::hash(text.as_bytes())
    );
    std::fs::write(&path, envelope).unwrap();
}

/// The entry of param `name` in an index.
fn entry<'a>(index: &'a mut serde_json::Value, name: &str) -> &'a mut serde_json::Value {
    let params = index["params"].as_array_mut().unwrap();
    params.iter_mut().find(|p| p["name"] == name).unwrap()
}

type Edit = Box<dyn Fn(&mut serde_json::Value, &mut u64)>;

/// A TP checkpoint whose pieces do not follow from the shapes, splits and TP rank it records,
/// or checkpoints that are not of one TP group, are refused on every rank, naming why.
#[test]
fn tp_checkpoints_that_do_not_fit_together_are_refused() {
    let tmp = TempDir::new("ckpt_tp_refused");
    let tp2: Vec<PathBuf> = (0..2).map(|t| tmp.join(&format!("tp2-rank{t}"))).collect();
    let tp4: Vec<PathBuf> = (0..4).map(|t| tmp.join(&format!("tp4-rank{t}"))).collect();
    models(job(2, 1, &[Phase::Train(1), Phase::Save(&tp2)]));
    models(job(4, 1, &[Phase::Train(1), Phase::Save(&tp4)]));
    // (what, the directory loaded beside tp2[0], an edit of its index, kind, message)
    let cases: Vec<(&str, &Path, Edit, ErrorKind, &str)> = vec![
        (
            "a piece of another block",
            &tp2[1],
            Box::new(|index, _| {
                entry(index, "mlp.fc1.weight")["components"][0]["pieces"][0]["block"][0] = serde_json::json!([0, 16]);
            }),
            ErrorKind::CheckpointCorrupt,
            "piece 0..512 of block [0:16,0:32] in 'rank-00000.safetensors' does not continue at 0 of block [16:32,0:32]",
        ),
        (
            "split by columns",
            &tp2[1],
            Box::new(|index, _| entry(index, "mlp.fc1.weight")["tp_split"] = serde_json::json!("cols")),
            ErrorKind::CheckpointCorrupt,
            "component 'mlp.fc1.weight/part0'",
        ),
        (
            "groups that do not fit the shape",
            &tp2[1],
            Box::new(|index, _| entry(index, "attn.qkv.weight")["split_groups"] = serde_json::json!(3)),
            ErrorKind::CheckpointCorrupt,
            "sum to 48",
        ),
        (
            "no TP group",
            &tp2[1],
            Box::new(|index, _| {
                index.as_object_mut().unwrap().remove("tp");
            }),
            ErrorKind::CheckpointCorrupt,
            "a TP shard without a TP group",
        ),
        (
            "version 1",
            &tp2[1],
            Box::new(|_, version| *version = 1),
            ErrorKind::CheckpointCorrupt,
            "holds the tensor-parallel fields of version 2",
        ),
        (
            "TP rank 0 twice",
            &tp2[0],
            Box::new(|_, _| {}),
            ErrorKind::CheckpointMismatch,
            "or from the checkpoints of different ranks of one tensor-parallel group",
        ),
        (
            "another TP size",
            &tp4[1],
            Box::new(|_, _| {}),
            ErrorKind::CheckpointMismatch,
            "or from the checkpoints of different ranks of one tensor-parallel group",
        ),
    ];
    for (label, source, edit, kind, needle) in cases {
        let copy = tmp.join(label);
        std::fs::create_dir_all(&copy).unwrap();
        for file in std::fs::read_dir(source).unwrap() {
            let file = file.unwrap();
            std::fs::copy(file.path(), copy.join(file.file_name())).unwrap();
        }
        edit_index(&copy, |index, version| edit(index, version));
        let dirs = [tp2[0].clone(), copy];
        for (rank, result) in job(1, 2, &[Phase::LoadUnion(&dirs)]).into_iter().enumerate() {
            let err = result.err().unwrap_or_else(|| panic!("{label}: rank {rank} must fail"));
            assert_eq!(err.kind, kind, "{label}: {}", err.message);
            assert!(
                err.message.contains(needle),
                "{label}: '{}' lacks '{needle}'",
                err.message
            );
        }
    }
}

/// A TP checkpoint records its `muon_tp_mode` (the default changed from blockwise to
/// duplicated, and the mode changes every update of a TP shard): loaded in a TP group with
/// another mode it is refused on every rank, naming both; at TP 1, where the modes coincide,
/// and from a checkpoint older than the record, it loads.
#[test]
fn a_tp_checkpoint_loads_in_a_tp_group_only_with_its_tp_mode() {
    let tmp = TempDir::new("ckpt_tp_mode");
    let saved: Vec<PathBuf> = (0..2).map(|t| tmp.join(&format!("rank{t}"))).collect();
    models(job(2, 1, &[Phase::Train(1), Phase::Save(&saved)]));
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(saved[0].join("index.json")).unwrap()).unwrap();
    assert_eq!(index["index"]["muon_tp_mode"], "duplicated");
    let copy = |label: &str, mode: Option<&str>| -> Vec<PathBuf> {
        (0..2)
            .map(|t| {
                let dir = tmp.join(&format!("{label}{t}"));
                std::fs::create_dir_all(&dir).unwrap();
                for file in std::fs::read_dir(&saved[t]).unwrap() {
                    let file = file.unwrap();
                    std::fs::copy(file.path(), dir.join(file.file_name())).unwrap();
                }
                edit_index(&dir, |index, _| match mode {
                    Some(mode) => index["muon_tp_mode"] = serde_json::json!(mode),
                    None => {
                        index.as_object_mut().unwrap().remove("muon_tp_mode");
                    }
                });
                dir
            })
            .collect()
    };
    let blockwise = copy("blockwise", Some("blockwise"));
    for (rank, result) in job(2, 1, &[Phase::LoadOwn(&blockwise)]).into_iter().enumerate() {
        let err = result
            .err()
            .unwrap_or_else(|| panic!("rank {rank} must refuse another tp mode"));
        assert_eq!(err.kind, ErrorKind::CheckpointMismatch, "{}", err.message);
        assert!(
            err.message.contains(
                "config field muon_tp_mode: this optimizer has duplicated but the checkpoint was saved with blockwise by the ranks of a TP group of 2"
            ),
            "{}",
            err.message
        );
    }
    models(job(2, 1, &[Phase::LoadOwn(&copy("unrecorded", None)), Phase::Snapshot]));
    models(job(1, 1, &[Phase::LoadUnion(&blockwise), Phase::Snapshot]));
    models(job(2, 1, &[Phase::LoadOwn(&saved), Phase::Snapshot]));
}

/// The ranks of a data-parallel group save one index for all of them, so they must sit at one
/// rank of TP groups of one size: finalize refuses it otherwise, before any TP exchange.
#[test]
fn a_data_parallel_group_across_tp_ranks_fails_finalize() {
    let data = host_comms(2);
    let (a, b) = (host_comms(2), host_comms(2));
    let results = on_ranks(0..2, |_, d| -> Result<()> {
        let mut opt = Optimizer::new(config(), data[d].claim()?, CallerStream::NULL)?;
        opt.set_tp_group(if d == 0 { a[0].clone() } else { b[1].clone() })?;
        for l in &MODEL {
            opt.add_param(l.shard(0, 2).0, None)?;
        }
        opt.finalize()
    });
    for (d, result) in results.into_iter().enumerate() {
        let err = result.expect_err("ranks at two TP ranks must not form a data-parallel group");
        assert_eq!(err.kind, ErrorKind::PlanMismatch, "{}", err.message);
        assert!(
            err.message
                .contains("the place in the TP group: rank 0 of 2 on data-parallel rank 0, rank 1 of 2")
                || err
                    .message
                    .contains("the place in the TP group: rank 1 of 2 on data-parallel rank 1, rank 0 of 2"),
            "rank {d}: {}",
            err.message
        );
    }
}

/// A load is all or nothing over the TP group too: TP 4 × DP 1 and TP 2 × DP 2 given only TP
/// rank 0's directory. The TP ranks whose shards are elsewhere fail, so every rank fails (the
/// others naming the failed rank of their TP group, or of their data-parallel group), every
/// rank stays at its step, and training on gives the bits of a job that never tried. (Before,
/// TP ranks 0–1 loaded and went back to the saved step while ranks 2–3 stayed.)
#[test]
fn a_load_that_fails_on_one_tp_rank_changes_nothing_on_any() {
    for (tp, dp) in [(4, 1), (2, 2)] {
        let tmp = TempDir::new("ckpt_tp_partial");
        let dirs: Vec<PathBuf> = (0..tp).map(|t| tmp.join(&format!("rank{t}"))).collect();
        let tried = models(job(
            tp,
            dp,
            &[
                Phase::Train(FIRST),
                Phase::Save(&dirs),
                Phase::Train(1),
                Phase::FailedLoadUnion(&dirs[..1]),
                Phase::Train(1),
                Phase::Snapshot,
            ],
        ));
        let untried = models(job(tp, dp, &[Phase::Train(FIRST + 2), Phase::Snapshot]));
        assert_eq!(
            tried[0].steps,
            FIRST + 2,
            "TP {tp} x DP {dp}: the failed load moved a step count"
        );
        assert_same(
            &tried[0],
            &untried[0],
            &format!("TP {tp} x DP {dp} after a failed load"),
        );
    }
}

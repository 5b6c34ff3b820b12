//! The reading side of a load: which checkpoint holds each param, the reads that fill this
//! rank's pieces of state (cut by component, by TP block, by saved piece) and reading them.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use super::components::{StateKind, components, split_by_component};
use super::files::Reader;
use super::index::{ComponentEntry, FileEntry, Index, ParamEntry, PieceEntry};
use super::publish::Paths;
use super::tp::{Block, Placement, TpRank, overlap};
use super::{INDEX_FILE, io_error};
use crate::bail;
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::model::ParamSpec;
use crate::plan::ElemRange;
use crate::schedule::{OwnedState, Runtime};

/// One checkpoint of a load: its directory and index.
pub(super) struct Source {
    pub dir: PathBuf,
    pub index: Index,
    /// Position in `index.params` by name.
    by_name: HashMap<String, usize>,
}

impl Source {
    /// The entry of param `name`, if this checkpoint holds it.
    fn param(&self, name: &str) -> Option<&ParamEntry> {
        self.by_name.get(name).map(|&i| &self.index.params[i])
    }
}

/// Which params the checkpoints of a load must hold.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Coverage {
    /// One checkpoint with exactly the registered params.
    Exact,
    /// Every registered param in one of them, or in those of several TP ranks; others are
    /// ignored.
    Union,
}

/// Reads every index; returns the sources and the identity of the set (the CRC-32 of their
/// index bytes in order).
pub(super) fn open_sources(dirs: &[&Path]) -> Result<(Vec<Source>, u64)> {
    let mut sources = Vec::new();
    let mut identity = crc32fast::Hasher::new();
    for dir in dirs {
        let paths = Paths::new(dir)?;
        let dir = paths.for_load();
        let index_path = dir.join(INDEX_FILE);
        let bytes = std::fs::read(&index_path).map_err(|e| io_error("read the checkpoint index", &index_path, &e))?;
        identity.update(&bytes);
        let index = Index::decode(&bytes)?;
        let by_name = index
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| (p.name.clone(), i))
            .collect();
        sources.push(Source {
            dir: dir.to_path_buf(),
            index,
            by_name,
        });
    }
    Ok((sources, u64::from(identity.finalize())))
}

/// Per param of `globals` (the registered params, unsharded), the sources to read it from
/// with its entry in each ([`sources_of`]), checking `coverage`, the params and the numerics
/// (the TP mode too when this rank, at `tp`, and the checkpoint's are in TP groups).
pub(super) fn holders<'a>(
    sources: &'a [Source],
    globals: &[ParamSpec],
    cfg: &Config,
    tp: Option<TpRank>,
    coverage: Coverage,
) -> Result<Vec<Vec<(usize, &'a ParamEntry)>>> {
    if coverage == Coverage::Exact {
        sources[0].index.check_matches(globals, cfg)?;
    }
    for source in sources {
        source.index.check_config(cfg)?;
        source.index.check_tp_mode(cfg, tp)?;
        if source.index.step != sources[0].index.step {
            bail!(
                CheckpointMismatch,
                "load: '{}' was saved at step {} but '{}' at step {}; checkpoints loaded together must be of one step",
                source.dir.display(),
                source.index.step,
                sources[0].dir.display(),
                sources[0].index.step
            );
        }
    }
    globals
        .iter()
        .map(|spec| sources_of(sources, &spec.name, Some(spec)))
        .collect()
}

/// The sources to read param `name` from, with its entry in each, of those that hold it, each
/// checked against `spec` (without one, against the first's entry). A param the checkpoints of
/// several TP ranks hold comes from all of them when they saved it as TP shards, else (a copy
/// every TP rank holds) from the lowest TP rank's.
pub(super) fn sources_of<'a>(
    sources: &'a [Source],
    name: &str,
    spec: Option<&ParamSpec>,
) -> Result<Vec<(usize, &'a ParamEntry)>> {
    let found: Vec<(usize, &ParamEntry)> = sources
        .iter()
        .enumerate()
        .filter_map(|(s, source)| source.param(name).map(|e| (s, e)))
        .collect();
    let Some(&(first, entry)) = found.first() else {
        bail!(
            CheckpointMismatch,
            "param '{name}' is in none of the {} checkpoints",
            sources.len()
        );
    };
    let reference = spec.cloned().unwrap_or_else(|| entry.spec());
    for (_, entry) in &found {
        entry.check_matches(&reference)?;
    }
    if found.len() == 1 {
        return Ok(vec![(first, entry)]);
    }
    let ranks = tp_holders(sources, name, &found)?;
    Ok(match entry.tp_split {
        Some(_) => found,
        None => {
            let (_, lowest) = *ranks.iter().min().expect("tp_holders names a TP rank per holder");
            let held = found.iter().find(|&&(s, _)| s == lowest);
            vec![*held.expect("tp_holders names holders among those found")]
        }
    })
}

/// The TP ranks of the sources in `found` that hold param `name`, as (TP rank, source): they
/// must be checkpoints of different ranks of TP groups of one size, saving the param alike.
fn tp_holders(sources: &[Source], name: &str, found: &[(usize, &ParamEntry)]) -> Result<Vec<(u32, usize)>> {
    let (a, first) = found[0];
    let size = sources[a].index.tp.map(|t| t.size);
    let mut ranks: Vec<(u32, usize)> = Vec::new();
    for &(b, entry) in found {
        let rank = sources[b].index.tp.filter(|t| Some(t.size) == size).map(|t| t.rank);
        // The source this one clashes with: a holder of the same TP rank, or (not a TP
        // checkpoint of the first one's group size) another holder.
        let other = match rank {
            Some(rank) => match ranks.iter().find(|(r, _)| *r == rank) {
                Some(&(_, s)) => s,
                None => {
                    if entry.tp_split != first.tp_split {
                        bail!(
                            CheckpointMismatch,
                            "param '{name}' is saved {} in '{}' but {} in '{}'; the TP ranks of a job save it alike",
                            saved_as(first),
                            sources[a].dir.display(),
                            saved_as(entry),
                            sources[b].dir.display()
                        );
                    }
                    ranks.push((rank, b));
                    continue;
                }
            },
            None if b == a => found[1].0,
            None => a,
        };
        bail!(
            CheckpointMismatch,
            "param '{name}' is in both '{}' and '{}'; each param must come from one checkpoint, or from the checkpoints of different ranks of one tensor-parallel group",
            sources[other].dir.display(),
            sources[b].dir.display()
        );
    }
    Ok(ranks)
}

/// How a checkpoint holds a param, for messages.
fn saved_as(entry: &ParamEntry) -> String {
    entry
        .tp_split
        .map_or("whole".into(), |split| format!("as TP shards split by {split:?}"))
}

/// Part of a saved tensor that lands in a piece of this rank's state.
pub(super) struct Transfer {
    piece: usize,
    /// 0 = master, k = moment k − 1.
    slot: usize,
    src: usize,
    dst: usize,
    len: usize,
}

/// Per saved tensor (source, file, key): its length and the transfers out of it, in file
/// order so that each file is opened once.
pub(super) type Reads<'a> = BTreeMap<(usize, &'a str, &'a str), (u64, Vec<Transfer>)>;

/// The zeroed pieces of state this rank owns and the reads that fill them: each owned range
/// is cut by component, placed in the unsharded param's component (`placements`, this rank
/// at `tp`), then met with the saved pieces of every source in `holders` it overlaps. Fails
/// when the sources miss some of it (the checkpoints of other TP ranks).
pub(super) fn plan_reads<'a>(
    runtime: &Runtime,
    placements: &[Placement],
    tp: Option<TpRank>,
    sources: &'a [Source],
    holders: &[Vec<(usize, &'a ParamEntry)>],
) -> Result<(Vec<OwnedState>, Reads<'a>)> {
    let mut pieces = Vec::new();
    let mut reads = Reads::new();
    for (i, (param, range)) in runtime.owned_ranges().into_iter().enumerate() {
        let p = param as usize;
        let (spec, placement) = (&runtime.params()[p], &placements[p]);
        let saved = &holders[p];
        let kinds = StateKind::of(saved[0].1.route, runtime.config().muon_variant);
        let len = range.len() as usize;
        pieces.push(OwnedState {
            param,
            range,
            master: vec![0.0; len],
            moments: vec![vec![0.0; len]; kinds.len() - 1],
        });
        let local = components(spec);
        for (c, part) in split_by_component(&local, range) {
            let (global, block) = &placement.parts[c];
            let want = Want {
                component: *global,
                block: block.as_ref(),
                range: part.shifted_down(local[c].range.start),
                piece: i,
                dst: part.start - range.start,
            };
            plan_want(saved, &want, kinds, &mut reads).map_err(|missing| {
                let here = tp.map_or(String::new(), |t| format!(" at TP rank {} of {}", t.rank, t.size));
                let hint = "load the checkpoints of every TP rank together (muon_optimizer_load_union)";
                missing.error(sources, saved, &spec.name, &format!("this rank needs{here}"), hint)
            })?;
        }
    }
    Ok((pieces, reads))
}

/// Items of a component to read: `range` of `block` of component `component` of a param,
/// into destination piece `piece` from its item `dst` on.
pub(super) struct Want<'b> {
    pub component: usize,
    pub block: Option<&'b Block>,
    pub range: ElemRange,
    pub piece: usize,
    pub dst: u64,
}

/// Items a plan could not find in any checkpoint holding their param.
pub(super) struct Missing {
    component: String,
    missing: u64,
    wanted: u64,
}

impl Missing {
    /// The error naming the param, the items (`who` wants them), the checkpoints that hold
    /// the param, and `hint`.
    pub fn error(
        &self,
        sources: &[Source],
        saved: &[(usize, &ParamEntry)],
        name: &str,
        who: &str,
        hint: &str,
    ) -> Error {
        let held: Vec<String> = saved
            .iter()
            .map(|&(s, _)| {
                let by = sources[s]
                    .index
                    .tp
                    .map_or("whole".into(), |t| format!("TP rank {} of {}", t.rank, t.size));
                format!("'{}' ({by})", sources[s].dir.display())
            })
            .collect();
        Error::new(
            ErrorKind::CheckpointMismatch,
            format!(
                "param '{name}': {} of the {} items of its component '{}' {who} are in none of the checkpoints holding it: {}; {hint}",
                self.missing,
                self.wanted,
                self.component,
                held.join(", ")
            ),
        )
    }
}

/// Adds to `reads` the transfers that fill `want` with `kinds` (slot k of the destination
/// for kind k) from the pieces of the entries `saved` hold; fails when they do not cover it.
pub(super) fn plan_want<'a>(
    saved: &[(usize, &'a ParamEntry)],
    want: &Want,
    kinds: &[StateKind],
    reads: &mut Reads<'a>,
) -> std::result::Result<(), Missing> {
    let mut covered = 0;
    for &(source, entry) in saved {
        let component = &entry.components[want.component];
        for piece in candidates(component, want.block, want.range) {
            let mine = (want.block.map(Vec::as_slice), want.range);
            for shared in overlap(&component.shape, (piece.block.as_deref(), piece.range()), mine) {
                covered += shared.len;
                for (slot, kind) in kinds.iter().enumerate() {
                    let (_, transfers) = reads
                        .entry((source, piece.file.as_str(), piece.keys[kind].as_str()))
                        .or_insert_with(|| (piece.range().len(), Vec::new()));
                    transfers.push(Transfer {
                        piece: want.piece,
                        slot,
                        src: (shared.a - piece.start) as usize,
                        dst: (want.dst + shared.b - want.range.start) as usize,
                        len: shared.len as usize,
                    });
                }
            }
        }
    }
    if covered == want.range.len() {
        return Ok(());
    }
    Err(Missing {
        component: saved[0].1.components[want.component].name.clone(),
        missing: want.range.len().saturating_sub(covered),
        wanted: want.range.len(),
    })
}

/// The saved pieces of `component` that may share items with `want` of `block`: those whose
/// range meets it when they are pieces of the same block (all pieces of a component in one
/// checkpoint are of one block), else all of them.
fn candidates<'c>(component: &'c ComponentEntry, block: Option<&Block>, want: ElemRange) -> &'c [PieceEntry] {
    let pieces = &component.pieces[..];
    if pieces.first().is_none_or(|p| p.block.as_ref() != block) {
        return pieces;
    }
    let first = pieces.partition_point(|p| p.end <= want.start);
    let last = pieces.partition_point(|p| p.start < want.end);
    &pieces[first..last.max(first)]
}

/// Reads every saved tensor of `reads` once (each file opened once) and copies its transfers
/// into `pieces`.
pub(super) fn execute_reads(sources: &[Source], reads: Reads<'_>, pieces: &mut [OwnedState]) -> Result<()> {
    let files: Vec<HashMap<&str, &FileEntry>> = sources
        .iter()
        .map(|s| s.index.files.iter().map(|f| (f.name.as_str(), f)).collect())
        .collect();
    let mut reader: Option<((usize, &str), Reader)> = None;
    for ((source, file, key), (len, transfers)) in reads {
        if reader.as_ref().is_none_or(|(open, _)| *open != (source, file)) {
            reader = Some(((source, file), Reader::open(&sources[source].dir, files[source][file])?));
        }
        let values = reader.as_mut().expect("opened above").1.read(key, len)?;
        for t in transfers {
            let piece = &mut pieces[t.piece];
            let dst = if t.slot == 0 {
                &mut piece.master
            } else {
                &mut piece.moments[t.slot - 1]
            };
            dst[t.dst..t.dst + t.len].copy_from_slice(&values[t.src..t.src + t.len]);
        }
    }
    Ok(())
}

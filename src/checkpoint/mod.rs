//! Sharded checkpoints of the optimizer state (docs/design.md §9): a directory that loads at
//! any data-parallel size and any Muon layout — and, with the directories of a TP group's
//! other ranks, at any TP size — replaced crash-safely.
//!
//! # Format (version 1, and 2 for TP shards)
//! - `rank-NNNNN.safetensors`, one per rank of the saving group: that rank's fp32 state as F32
//!   tensors — `master` and `momentum` of every Muon matrix it owns, `master`, `exp_avg` and
//!   `exp_avg_sq` of every AdamW piece in its shards. A tensor is keyed
//!   `{component}/{kind}@{start}:{end}`: the component ([`components`]: the param, a fused
//!   part `name/part{c}`, an expert `name/expert{e}`, or `name/expert{e}/part{c}`) and the
//!   item range in that component's own flat coordinates. A tensor covering its whole
//!   component has the component's shape, a partial one (an AdamW shard boundary) is 1-D.
//!   The header's `__metadata__` holds the CRC-32 of every tensor's bytes under its key, and
//!   `format`, `rank`, `dp`.
//! - `index.json`, written last by rank 0: `{"format": "muon_opt.checkpoint",
//!   "format_version": 1, "crc32": …, "index": {…}}` where `crc32` covers the exact bytes of
//!   `index` ([`Index`]): library version, model hash, dp, layout, step, the numerics config
//!   fields, every file with its size, CRC-32 and header CRC-32, and every param with its
//!   shape, dtype, route, expert flag, splits and components, each with the pieces (file,
//!   range, keys) that hold it.
//! - Version 2 (ranks of a tensor-parallel group, `tp.rs`): a TP shard is described as its
//!   unsharded param, each piece as a range of a block (a box) of one of its components, keyed
//!   `{component}/{kind}[{lo}:{hi},…]@{start}:{end}`; the index records the TP rank and each
//!   shard's split. Loads at any TP size read each block from the checkpoints holding it.
//!
//! # Protocol
//! Both calls are collective and first finish every queued collective of the rank. Ranks
//! agree on success after each phase (every rank learns whether every rank succeeded), so
//! every rank returns the same outcome.
//! - **save**: rank 0 prepares `<dir>.muon-saving`; every rank writes and fsyncs its file; once
//!   all have, rank 0 writes and fsyncs the index and the directory and puts it in place
//!   (`publish.rs`). A crash at any point leaves the previous checkpoint loadable.
//! - **load**: every rank reads and checks the index against its model and config, then reads
//!   exactly the tensors that overlap what it owns now, verifying their checksums; only when
//!   every rank succeeded does any rank replace its state, after which every param buffer is
//!   re-synchronized from the loaded masters. A failed load changes nothing on any rank.

mod components;
pub mod export;
mod files;
mod index;
pub mod inspect;
mod load;
mod publish;
mod tp;

#[cfg(test)]
mod tests;

use std::path::Path;

use crate::backend::{Backend, PeerGroup};
use crate::bail;
use crate::error::{Error, ErrorKind, Result};
use crate::model::ParamSpec;
use crate::schedule::{OwnedState, Runtime};

pub use components::{Component, StateKind, components, split_by_component, tensor_key};
pub use index::{
    ComponentEntry, FORMAT, FORMAT_VERSION, FileEntry, Index, NumericsConfig, ParamEntry, PieceEntry, model_hash,
    rank_file_name,
};

pub use tp::{Block, TpRank, TpSplit, block_text};

use files::Tensor;
use load::{Coverage, execute_reads, holders, open_sources, plan_reads};
use publish::Paths;
use tp::{Placement, place};

/// Name of the index file.
pub const INDEX_FILE: &str = "index.json";

/// Points of the save protocol where a test can simulate a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Every rank, before writing its file.
    WriteFile,
    /// Every rank, after its file is written and fsynced.
    FileWritten,
    /// Every rank, after all files are written, before rank 0 writes the index.
    WriteIndex,
    /// Rank 0, after the index and the staging directory are fsynced, before the rename.
    Publish,
    /// Rank 0, between the two renames of the fallback without `RENAME_EXCHANGE`.
    RenamedAway,
    /// Rank 0, once the new checkpoint is in place, before the old one is deleted.
    Published,
}

pub(crate) fn io_error(op: &str, path: &Path, err: &std::io::Error) -> Error {
    Error::new(ErrorKind::Io, format!("cannot {op} '{}': {err}", path.display()))
}

/// The error kinds a rank reports to the others; anything else travels as `Internal`.
const AGREED_KINDS: [ErrorKind; 9] = [
    ErrorKind::Io,
    ErrorKind::CheckpointCorrupt,
    ErrorKind::CheckpointMismatch,
    ErrorKind::CheckpointVersion,
    ErrorKind::InvalidArgument,
    ErrorKind::InvalidState,
    ErrorKind::OutOfMemory,
    ErrorKind::Unsupported,
    ErrorKind::Internal,
];

/// The collective checkpoint calls; ranks in different calls must fail, not pair up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Save = 1,
    Load = 2,
}

impl Call {
    fn name(self) -> &'static str {
        match self {
            Call::Save => "save",
            Call::Load => "load",
        }
    }
}

/// What a rank tells the others of its part of a collective call: 0 for success, else
/// 1 + the index of its error's kind in [`AGREED_KINDS`] (its last entry for any other kind).
fn outcome_code<T>(local: &Result<T>) -> u64 {
    match local {
        Ok(_) => 0,
        Err(err) => {
            1 + AGREED_KINDS
                .iter()
                .position(|k| *k == err.kind)
                .unwrap_or(AGREED_KINDS.len() - 1) as u64
        }
    }
}

/// The error kind a non-zero [`outcome_code`] stands for.
fn agreed_kind(code: u64) -> ErrorKind {
    AGREED_KINDS
        .get(code as usize - 1)
        .copied()
        .unwrap_or(ErrorKind::Internal)
}

/// Collective: every rank learns whether every rank is in the same call and whether every
/// rank's `local` succeeded. A failed rank returns its own error; the others return the first
/// failed rank's kind, naming it. Ranks in different calls (one saves while another loads)
/// all fail with `InvalidState` before either call changes anything.
fn agree<T>(backend: &mut dyn Backend, call: Call, local: Result<T>) -> Result<T> {
    let what = call.name();
    let code = outcome_code(&local);
    let words = backend.all_gather_u64(((call as u64) << 32) | code)?;
    if let Some(rank) = words.iter().position(|&w| w >> 32 != call as u64) {
        let other = match words[rank] >> 32 {
            1 => "save",
            2 => "load",
            _ => "another collective call",
        };
        bail!(
            InvalidState,
            "{what}: rank {rank} called {other} while this rank called {what}; every rank must make the same collective call (nothing was changed)"
        );
    }
    let codes: Vec<u64> = words.iter().map(|&w| w & 0xffff_ffff).collect();
    let value = local?;
    match codes.iter().position(|&c| c != 0) {
        None => Ok(value),
        Some(rank) => {
            let kind = agreed_kind(codes[rank]);
            Err(Error::new(
                kind,
                format!("{what} failed on rank {rank} ({kind:?}); that rank's error message has the details"),
            ))
        }
    }
}

/// Saves the state of every rank into the checkpoint directory `dir` (collective; `rank` is
/// this rank, `tp` its place in its tensor-parallel group: TP shards are saved in the
/// unsharded params' coordinates).
pub fn save(runtime: &mut Runtime, rank: usize, tp: Option<TpRank>, dir: &Path) -> Result<()> {
    save_with(runtime, rank, tp, dir, &mut |_| Ok(()))
}

/// [`save`] with `hook` called at every [`Stage`]; an error from it stops the save on the spot,
/// as a crash would.
pub(crate) fn save_with(
    runtime: &mut Runtime,
    rank: usize,
    tp: Option<TpRank>,
    dir: &Path,
    hook: &mut dyn FnMut(Stage) -> Result<()>,
) -> Result<()> {
    runtime.synchronize()?;
    let prepared = Paths::new(dir).and_then(|paths| {
        let placements = placements(runtime.params(), tp)?;
        let globals: Vec<ParamSpec> = placements.iter().map(|p| p.global.clone()).collect();
        components::check_unique_names(&globals)?;
        if rank == 0 {
            publish::prepare(&paths)?;
        }
        Ok((paths, placements))
    });
    let (paths, placements) = agree(runtime.backend_mut(), Call::Save, prepared).inspect_err(|_| {
        if rank == 0 {
            let _ = Paths::new(dir).map(|paths| publish::abandon(&paths));
        }
    })?;
    hook(Stage::WriteFile)?;
    let written = write_rank_file(runtime, rank, &placements, &paths.staging);
    if written.is_ok() {
        hook(Stage::FileWritten)?;
    }
    let written = agree(runtime.backend_mut(), Call::Save, written).inspect_err(|_| {
        if rank == 0 {
            // Best effort: the next save deletes a staging directory left behind anyway.
            let _ = publish::abandon(&paths);
        }
    })?;
    let dp = runtime.plan().dp as usize;
    let files = gather_files(runtime.backend_mut(), dp, &written)?;
    hook(Stage::WriteIndex)?;
    let published = if rank == 0 {
        let steps = runtime.steps()?;
        let (plan, specs, cfg) = (runtime.plan(), runtime.params(), runtime.config());
        let index = Index::new(plan, specs, &placements, cfg, steps, files, tp);
        check_visible(&paths.staging, &index.files)
            .and_then(|()| write_index(&paths.staging, &index))
            .and_then(|()| publish::publish(&paths, hook))
    } else {
        Ok(())
    };
    agree(runtime.backend_mut(), Call::Save, published)
}

/// Writes this rank's file into `dir`: its owned state cut at component bounds, keyed by the
/// unsharded params' components as `placements` place them.
fn write_rank_file(runtime: &mut Runtime, rank: usize, placements: &[Placement], dir: &Path) -> Result<files::Written> {
    let dp = runtime.plan().dp as usize;
    let comps: Vec<Vec<Component>> = runtime.params().iter().map(components).collect();
    let globals: Vec<Vec<Component>> = placements.iter().map(|p| components(&p.global)).collect();
    let routes: Vec<_> = runtime.plan().params.iter().map(|p| p.route).collect();
    let variant = runtime.config().muon_variant;
    let mut tensors = Vec::new();
    for piece in runtime.owned_state()? {
        let p = piece.param as usize;
        let values: Vec<&Vec<f32>> = std::iter::once(&piece.master).chain(&piece.moments).collect();
        for (c, part) in split_by_component(&comps[p], piece.range) {
            let component = &comps[p][c];
            let (global, block) = &placements[p].parts[c];
            let name = &globals[p][*global].name;
            let local = part.shifted_down(component.range.start);
            let shape: Vec<usize> = if local.len() == component.range.len() {
                component.shape.iter().map(|&d| d as usize).collect()
            } else {
                vec![local.len() as usize]
            };
            let within = part.shifted_down(piece.range.start);
            let within = within.start as usize..within.end as usize;
            for (&kind, values) in StateKind::of(routes[p], variant).iter().zip(&values) {
                let key = tensor_key(name, kind, block.as_deref(), local);
                tensors.push(Tensor::new(key, shape.clone(), &values[within.clone()]));
            }
        }
    }
    files::write(&dir.join(rank_file_name(rank)), rank, dp, &tensors)
}

/// Collective: every rank's file sizes and checksums.
fn gather_files(backend: &mut dyn Backend, dp: usize, written: &files::Written) -> Result<Vec<FileEntry>> {
    let bytes = backend.all_gather_u64(written.bytes)?;
    let header_bytes = backend.all_gather_u64(written.header_bytes)?;
    let crcs = backend.all_gather_u64((u64::from(written.crc32) << 32) | u64::from(written.header_crc32))?;
    Ok((0..dp)
        .map(|r| FileEntry {
            name: rank_file_name(r),
            rank: r as u32,
            bytes: bytes[r],
            crc32: (crcs[r] >> 32) as u32,
            header_bytes: header_bytes[r],
            header_crc32: crcs[r] as u32,
        })
        .collect())
}

/// Rank 0: every rank's file is in `dir` with the size that rank wrote. Otherwise the ranks
/// saved to different directories, or to one path on file systems they do not share.
fn check_visible(dir: &Path, files: &[FileEntry]) -> Result<()> {
    for file in files {
        let path = dir.join(&file.name);
        let size = std::fs::metadata(&path).map(|m| m.len()).ok();
        if size != Some(file.bytes) {
            bail!(
                Io,
                "rank 0 does not see rank {}'s file at '{}' ({}); every rank must save to the same directory, on a file system all ranks share",
                file.rank,
                path.display(),
                size.map_or("missing".to_string(), |s| format!(
                    "{s} bytes, rank {} wrote {}",
                    file.rank, file.bytes
                ))
            );
        }
    }
    Ok(())
}

/// Writes and fsyncs `index.json` and then the directory holding it.
fn write_index(dir: &Path, index: &Index) -> Result<()> {
    use std::io::Write;
    let path = dir.join(INDEX_FILE);
    let mut file = std::fs::File::create(&path).map_err(|e| io_error("create", &path, &e))?;
    file.write_all(index.encode().as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| io_error("write", &path, &e))?;
    publish::fsync_dir(dir)
}

/// A group besides the data-parallel one that a load agrees over, and its exchange of one
/// u64 per rank of that group (indexed by its rank there).
pub type PeerExchange<'a> = (PeerGroup, &'a mut dyn FnMut(&mut dyn Backend, u64) -> Result<Vec<u64>>);

/// Loads the checkpoint in `dir` into every rank (collective), this rank at `tp` in its
/// tensor-parallel group: it holds exactly the params this optimizer registered. All or
/// nothing over the data-parallel group and every group of `peers`.
pub fn load(runtime: &mut Runtime, tp: Option<TpRank>, dir: &Path, peers: &mut [PeerExchange]) -> Result<()> {
    load_from(runtime, tp, &[dir], Coverage::Exact, peers)
}

/// Loads from several checkpoints at once (collective): every registered param from the one
/// checkpoint that holds it — or from those of every TP rank that saved its shards — params
/// this optimizer does not register left out. Expert optimizers of an earlier expert-parallel
/// split, each of which saved its own experts under their global names, reload at another
/// split; the optimizers of a TP group reload at another TP size. The checkpoints must share
/// their step and numerics.
pub fn load_union(runtime: &mut Runtime, tp: Option<TpRank>, dirs: &[&Path], peers: &mut [PeerExchange]) -> Result<()> {
    if dirs.is_empty() {
        bail!(InvalidArgument, "load: no checkpoint directories given");
    }
    load_from(runtime, tp, dirs, Coverage::Union, peers)
}

fn load_from(
    runtime: &mut Runtime,
    tp: Option<TpRank>,
    dirs: &[&Path],
    coverage: Coverage,
    peers: &mut [PeerExchange],
) -> Result<()> {
    runtime.synchronize()?;
    let local = read_owned_state(runtime, tp, dirs, coverage);
    let outcome = agree(runtime.backend_mut(), Call::Load, local).and_then(|(identity, step, pieces)| {
        // Every rank read successfully; commit only if they all read the same checkpoint.
        let identities = runtime.backend_mut().all_gather_u64(identity)?;
        if let Some(rank) = identities.iter().position(|&i| i != identity) {
            let names: Vec<String> = dirs.iter().map(|d| format!("'{}'", d.display())).collect();
            bail!(
                CheckpointMismatch,
                "load: rank {rank} read a different checkpoint than this rank's {} (index checksums {:08x} and {identity:08x}); every rank must load the same checkpoint (nothing was changed)",
                names.join(", "),
                identities[rank]
            );
        }
        Ok((step, pieces))
    });
    let (step, pieces) = agree_with_peers(runtime.backend_mut(), peers, outcome)?;
    runtime.load_owned_state(step, &pieces)
}

/// Collective over every group of `peers`, in their order, whatever `local` is: every rank
/// learns whether every rank of those groups succeeded (a data-parallel group of a TP rank
/// that failed fails the TP ranks beside it too). A failed rank returns its own error; the
/// others return the first failed peer's kind, naming the group and the rank.
fn agree_with_peers<T>(backend: &mut dyn Backend, peers: &mut [PeerExchange], local: Result<T>) -> Result<T> {
    let code = outcome_code(&local);
    let mut failed = None;
    for (group, exchange) in peers.iter_mut() {
        let codes = exchange(backend, code)?;
        if failed.is_none()
            && let Some(rank) = codes.iter().position(|&c| c != 0)
        {
            failed = Some((group.name(), rank, agreed_kind(codes[rank])));
        }
    }
    let value = local?;
    match failed {
        None => Ok(value),
        Some((group, rank, kind)) => Err(Error::new(
            kind,
            format!(
                "load failed on rank {rank} of the {group} group ({kind:?}); that rank's error message has the details (nothing was changed on any rank)"
            ),
        )),
    }
}

/// Reads everything this rank owns from the checkpoints in `dirs`, changing nothing. Returns
/// their identity (the CRC-32 of their indexes, which hold every file's CRC-32), their step
/// and the state.
fn read_owned_state(
    runtime: &Runtime,
    tp: Option<TpRank>,
    dirs: &[&Path],
    coverage: Coverage,
) -> Result<(u64, u64, Vec<OwnedState>)> {
    if runtime.iteration_in_progress() {
        bail!(
            InvalidState,
            "load: an iteration is in progress (grad_ready was called since the last step); load between steps"
        );
    }
    let placements = placements(runtime.params(), tp)?;
    let globals: Vec<ParamSpec> = placements.iter().map(|p| p.global.clone()).collect();
    let (sources, identity) = open_sources(dirs)?;
    let holders = holders(&sources, &globals, runtime.config(), tp, coverage)?;
    let (mut pieces, reads) = plan_reads(runtime, &placements, tp, &sources, &holders)?;
    execute_reads(&sources, reads, &mut pieces)?;
    Ok((identity, sources[0].index.step, pieces))
}

/// Where each of `specs`, registered at `tp`, lies in its unsharded param.
fn placements(specs: &[ParamSpec], tp: Option<TpRank>) -> Result<Vec<Placement>> {
    specs.iter().map(|spec| place(spec, tp)).collect()
}

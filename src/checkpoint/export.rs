//! `muon-opt export`: a sharded checkpoint (or the checkpoints of every rank of a
//! tensor-parallel group) merged into one safetensors file holding every param's full fp32
//! master weight, keyed by the param's name and shaped as registered unsharded — the file a
//! user loads into another framework or an evaluation job. Tied copies are exported
//! under each name. Every tensor read is verified against its checksum; the output appears
//! only complete (written beside the target, fsynced, renamed into place), so a failed export
//! leaves an existing file at the target untouched.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::components::StateKind;
use super::index::{Index, ParamEntry};
use super::io_error;
use super::load::{Reads, Source, Want, execute_reads, open_sources, plan_want, sources_of};
use crate::error::{Error, ErrorKind, Result};
use crate::plan::ElemRange;
use crate::schedule::OwnedState;

/// What an export wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exported {
    pub path: PathBuf,
    pub params: usize,
    /// Size of the file written.
    pub bytes: u64,
    /// The checkpoint's step.
    pub step: u64,
}

/// Merges the checkpoints in `dirs` into the safetensors file `out`: one checkpoint, or those
/// of every rank of a tensor-parallel group (each holding its TP shards), which export the
/// unsharded params. Every param is read as a load would (`load.rs`); the
/// checkpoints must share their step and numerics.
pub fn export(dirs: &[&Path], out: &Path) -> Result<Exported> {
    let (sources, _) = open_sources(dirs)?;
    let Some(first) = sources.first() else {
        return Err(Error::new(ErrorKind::InvalidArgument, "export: no checkpoint given"));
    };
    for source in &sources {
        if source.index.step != first.index.step || source.index.config != first.index.config {
            return Err(Error::new(
                ErrorKind::CheckpointMismatch,
                format!(
                    "export: '{}' and '{}' differ in step or numerics; checkpoints exported together are of one job and step",
                    first.dir.display(),
                    source.dir.display()
                ),
            ));
        }
    }
    let mut seen = std::collections::HashSet::new();
    let params: Vec<&ParamEntry> = sources
        .iter()
        .flat_map(|s| &s.index.params)
        .filter(|entry| seen.insert(entry.name.as_str()))
        .collect();
    let header = header(&params, &first.index)?;
    let partial = partial_path(out)?;
    let written = write_file(&sources, &params, &header, &partial);
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    let bytes = written?;
    std::fs::rename(&partial, out).map_err(|e| io_error("rename into place", out, &e))?;
    Ok(Exported {
        path: out.to_path_buf(),
        params: params.len(),
        bytes,
        step: first.index.step,
    })
}

/// `out` with `.partial` appended: the file being written.
fn partial_path(out: &Path) -> Result<PathBuf> {
    let Some(name) = out.file_name() else {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("export: '{}' names no file", out.display()),
        ));
    };
    let mut partial = name.to_os_string();
    partial.push(".partial");
    Ok(out.with_file_name(partial))
}

fn numel(p: &ParamEntry) -> u64 {
    p.shape.iter().product()
}

/// The safetensors header: one F32 tensor per param in registration order, then the
/// checkpoint's identity (from `index`) in `__metadata__`; padded with spaces to a multiple of
/// 8 bytes.
fn header(params: &[&ParamEntry], index: &Index) -> Result<Vec<u8>> {
    let mut entries = serde_json::Map::new();
    let mut offset = 0u64;
    for p in params {
        let end = offset + 4 * numel(p);
        entries.insert(
            p.name.clone(),
            serde_json::json!({ "dtype": "F32", "shape": p.shape, "data_offsets": [offset, end] }),
        );
        offset = end;
    }
    let metadata: BTreeMap<&str, String> = BTreeMap::from([
        ("format", "muon_opt.export".to_string()),
        ("content", "fp32 master weights".to_string()),
        ("step", index.step.to_string()),
        ("model_hash", index.model_hash.clone()),
        ("library_version", index.library_version.clone()),
    ]);
    entries.insert("__metadata__".into(), serde_json::json!(metadata));
    let mut bytes =
        serde_json::to_vec(&entries).map_err(|e| Error::new(ErrorKind::Internal, format!("export header: {e}")))?;
    bytes.resize(bytes.len().next_multiple_of(8), b' ');
    Ok(bytes)
}

/// Writes the header and every param's master, assembled from the pieces, to `path`; returns
/// the file's size.
fn write_file(sources: &[Source], params: &[&ParamEntry], header: &[u8], path: &Path) -> Result<u64> {
    let file = File::create(path).map_err(|e| io_error("create", path, &e))?;
    let mut out = BufWriter::new(file);
    let write = |out: &mut BufWriter<File>, bytes: &[u8]| out.write_all(bytes).map_err(|e| io_error("write", path, &e));
    write(&mut out, &(header.len() as u64).to_le_bytes())?;
    write(&mut out, header)?;
    let mut size = 8 + header.len() as u64;
    for p in params {
        let saved = sources_of(sources, &p.name, None)?;
        let mut reads = Reads::new();
        for (c, component) in p.components.iter().enumerate() {
            let want = Want {
                component: c,
                block: None,
                range: ElemRange::new(0, component.shape.iter().product()),
                piece: 0,
                dst: component.offset,
            };
            plan_want(&saved, &want, &[StateKind::Master], &mut reads).map_err(|missing| {
                let hint = "export the checkpoints of every TP rank together";
                missing.error(sources, &saved, &p.name, "to export", hint)
            })?;
        }
        let numel = numel(p);
        let mut values = [OwnedState {
            param: 0,
            range: ElemRange::new(0, numel),
            master: vec![0f32; numel as usize],
            moments: Vec::new(),
        }];
        execute_reads(sources, reads, &mut values)?;
        let mut bytes = Vec::with_capacity(4 * values[0].master.len());
        for v in &values[0].master {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        write(&mut out, &bytes)?;
        size += bytes.len() as u64;
    }
    let file = out.into_inner().map_err(|e| io_error("write", path, e.error()))?;
    file.sync_all().map_err(|e| io_error("fsync", path, &e))?;
    Ok(size)
}

//! `muon-opt export`: a sharded checkpoint merged into one safetensors file holding every
//! param's full fp32 master weight, keyed by the param's name and shaped as registered — the
//! file a user loads into another framework or an evaluation job. Tied copies are exported
//! under each name. Every tensor read is verified against its checksum; the output appears
//! only complete (written beside the target, fsynced, renamed into place), so a failed export
//! leaves an existing file at the target untouched.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::components::StateKind;
use super::files::Reader;
use super::index::{FileEntry, Index, ParamEntry};
use super::publish::Paths;
use super::{INDEX_FILE, io_error};
use crate::error::{Error, ErrorKind, Result};

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

/// Merges the checkpoint in `dir` into the safetensors file `out`.
pub fn export(dir: &Path, out: &Path) -> Result<Exported> {
    let paths = Paths::new(dir)?;
    let dir = paths.for_load();
    let index_path = dir.join(INDEX_FILE);
    let bytes = std::fs::read(&index_path).map_err(|e| io_error("read the checkpoint index", &index_path, &e))?;
    let index = Index::decode(&bytes)?;
    let header = header(&index)?;
    let partial = partial_path(out)?;
    let written = write_file(dir, &index, &header, &partial);
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    let bytes = written?;
    std::fs::rename(&partial, out).map_err(|e| io_error("rename into place", out, &e))?;
    Ok(Exported {
        path: out.to_path_buf(),
        params: index.params.len(),
        bytes,
        step: index.step,
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
/// checkpoint's identity in `__metadata__`; padded with spaces to a multiple of 8 bytes.
fn header(index: &Index) -> Result<Vec<u8>> {
    let mut entries = serde_json::Map::new();
    let mut offset = 0u64;
    for p in &index.params {
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
fn write_file(dir: &Path, index: &Index, header: &[u8], path: &Path) -> Result<u64> {
    let file = File::create(path).map_err(|e| io_error("create", path, &e))?;
    let mut out = BufWriter::new(file);
    let write = |out: &mut BufWriter<File>, bytes: &[u8]| out.write_all(bytes).map_err(|e| io_error("write", path, &e));
    write(&mut out, &(header.len() as u64).to_le_bytes())?;
    write(&mut out, header)?;
    let files: HashMap<&str, &FileEntry> = index.files.iter().map(|f| (f.name.as_str(), f)).collect();
    let mut readers: HashMap<&str, Reader> = HashMap::new();
    let mut size = 8 + header.len() as u64;
    for p in &index.params {
        let mut values = vec![0f32; numel(p) as usize];
        for component in &p.components {
            for piece in &component.pieces {
                // A decoded index names only files it lists (Index::decode checks it).
                let reader = match readers.entry(piece.file.as_str()) {
                    Entry::Occupied(e) => e.into_mut(),
                    Entry::Vacant(e) => e.insert(Reader::open(dir, files[piece.file.as_str()])?),
                };
                let master = reader.read(&piece.keys[&StateKind::Master], piece.end - piece.start)?;
                let start = (component.offset + piece.start) as usize;
                values[start..start + master.len()].copy_from_slice(&master);
            }
        }
        let mut bytes = Vec::with_capacity(4 * values.len());
        for v in &values {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        write(&mut out, &bytes)?;
        size += bytes.len() as u64;
    }
    let file = out.into_inner().map_err(|e| io_error("write", path, e.error()))?;
    file.sync_all().map_err(|e| io_error("fsync", path, &e))?;
    Ok(size)
}

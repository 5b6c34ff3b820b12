//! One rank's `rank-NNNNN.safetensors`: F32 tensors keyed by [`super::components::tensor_key`],
//! with the CRC-32 of every tensor's bytes in the header's `__metadata__` (under the tensor's
//! key) beside `format`, `rank` and `dp`.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use safetensors::tensor::Metadata;
use safetensors::{Dtype, View};

use super::index::{FORMAT, FileEntry};
use super::io_error;
use crate::bail;
use crate::error::{Error, ErrorKind, Result};

/// One tensor to write: little-endian f32 bytes.
pub struct Tensor {
    pub key: String,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

impl Tensor {
    pub fn new(key: String, shape: Vec<usize>, values: &[f32]) -> Tensor {
        let mut bytes = Vec::with_capacity(4 * values.len());
        for v in values {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        Tensor { key, shape, bytes }
    }
}

impl View for &Tensor {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// What the index records of a written file.
pub struct Written {
    pub bytes: u64,
    pub crc32: u32,
    pub header_bytes: u64,
    pub header_crc32: u32,
}

/// Writes `tensors` as rank `rank`'s file at `path`, fsyncs it, and returns its sizes and
/// checksums (read back from the disk).
pub fn write(path: &Path, rank: usize, dp: usize, tensors: &[Tensor]) -> Result<Written> {
    let mut metadata: HashMap<String, String> = tensors
        .iter()
        .map(|t| (t.key.clone(), format!("{:08x}", crc32fast::hash(&t.bytes))))
        .collect();
    metadata.insert("format".into(), FORMAT.into());
    metadata.insert("rank".into(), rank.to_string());
    metadata.insert("dp".into(), dp.to_string());
    // safetensors writes a private temporary file and renames it into place; give the result
    // the permissions of any file this process creates (0666 minus the umask), like index.json.
    let permissions = File::create(path)
        .and_then(|f| f.metadata())
        .map_err(|e| io_error("create", path, &e))?
        .permissions();
    safetensors::serialize_to_file(tensors.iter().map(|t| (t.key.as_str(), t)), Some(metadata), path).map_err(|e| {
        match e {
            safetensors::SafeTensorError::IoError(io) => io_error("write", path, &io),
            other => Error::new(ErrorKind::Internal, format!("{}: {other}", path.display())),
        }
    })?;
    std::fs::set_permissions(path, permissions).map_err(|e| io_error("set permissions of", path, &e))?;
    canonicalize_header(path)?;
    let mut file = File::open(path).map_err(|e| io_error("open", path, &e))?;
    let written = scan(&mut file, path)?;
    file.sync_all().map_err(|e| io_error("fsync", path, &e))?;
    Ok(written)
}

/// Rewrites the JSON header of the safetensors file at `path` with every object's keys in
/// sorted order, so identical state gives identical bytes (safetensors writes `__metadata__`
/// from a `HashMap`, in a per-process random order). The same entries in another order have
/// the same length, so the header is rewritten in place and the data does not move.
fn canonicalize_header(path: &Path) -> Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| io_error("open", path, &e))?;
    let mut prefix = [0u8; 8];
    file.read_exact(&mut prefix).map_err(|e| io_error("read", path, &e))?;
    let len = u64::from_le_bytes(prefix) as usize;
    let mut header = vec![0u8; len];
    file.read_exact(&mut header).map_err(|e| io_error("read", path, &e))?;
    let internal = |what: &str| Error::new(ErrorKind::Internal, format!("{}: header {what}", path.display()));
    // serde_json's map is ordered by key.
    let value: serde_json::Value = serde_json::from_slice(&header).map_err(|_| internal("is not JSON"))?;
    let mut canonical = serde_json::to_vec(&value).map_err(|_| internal("does not serialize"))?;
    if canonical.len() > len {
        return Err(internal("grew when its keys were sorted"));
    }
    canonical.resize(len, b' ');
    file.seek(SeekFrom::Start(8)).map_err(|e| io_error("seek", path, &e))?;
    file.write_all(&canonical).map_err(|e| io_error("write", path, &e))
}

/// Reads a whole rank file: its size, CRC-32, header size and header CRC-32.
pub fn scan(file: &mut File, path: &Path) -> Result<Written> {
    let mut prefix = [0u8; 8];
    file.read_exact(&mut prefix).map_err(|e| io_error("read", path, &e))?;
    let header_bytes = 8u64.saturating_add(u64::from_le_bytes(prefix));
    let mut whole = crc32fast::Hasher::new();
    let mut header = crc32fast::Hasher::new();
    whole.update(&prefix);
    header.update(&prefix);
    let mut offset = 8u64;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|e| io_error("read", path, &e))?;
        if n == 0 {
            break;
        }
        let chunk = &buf[..n];
        whole.update(chunk);
        let in_header = header_bytes.saturating_sub(offset).min(n as u64) as usize;
        header.update(&chunk[..in_header]);
        offset += n as u64;
    }
    Ok(Written {
        bytes: offset,
        crc32: whole.finalize(),
        header_bytes,
        header_crc32: header.finalize(),
    })
}

/// A rank file opened for reading, its size and header verified against the index.
pub struct Reader {
    file: File,
    name: String,
    header_bytes: u64,
    metadata: Metadata,
}

fn corrupt(name: &str, what: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::CheckpointCorrupt, format!("{name}: {what}"))
}

impl Reader {
    /// Opens `entry` in `dir`: CHECKPOINT_CORRUPT when its size or header differs from what
    /// the index recorded (truncated, extended or damaged).
    pub fn open(dir: &Path, entry: &FileEntry) -> Result<Reader> {
        let path = dir.join(&entry.name);
        let name = entry.name.clone();
        let mut file = File::open(&path).map_err(|e| io_error("open", &path, &e))?;
        let size = file.metadata().map_err(|e| io_error("stat", &path, &e))?.len();
        if size != entry.bytes {
            bail!(
                CheckpointCorrupt,
                "{name}: {size} bytes, the index recorded {} (truncated or overwritten)",
                entry.bytes
            );
        }
        if entry.header_bytes < 8 || entry.header_bytes > size {
            return Err(corrupt(&name, "header size outside the file"));
        }
        let mut header = vec![0u8; entry.header_bytes as usize];
        file.read_exact(&mut header).map_err(|e| io_error("read", &path, &e))?;
        let crc = crc32fast::hash(&header);
        if crc != entry.header_crc32 {
            return Err(corrupt(
                &name,
                format!(
                    "header checksum {crc:08x} differs from the recorded {:08x}",
                    entry.header_crc32
                ),
            ));
        }
        let declared = u64::from_le_bytes(header[..8].try_into().expect("8 bytes"));
        if declared + 8 != entry.header_bytes {
            return Err(corrupt(&name, "header length differs from the index"));
        }
        let metadata: Metadata =
            serde_json::from_slice(&header[8..]).map_err(|e| corrupt(&name, format!("header: {e}")))?;
        if entry.header_bytes + metadata.data_len() as u64 != size {
            return Err(corrupt(&name, "tensor data does not end at the end of the file"));
        }
        Ok(Reader {
            file,
            name,
            header_bytes: entry.header_bytes,
            metadata,
        })
    }

    /// Reads tensor `key` (`len` f32 values), verified against its checksum.
    pub fn read(&mut self, key: &str, len: u64) -> Result<Vec<f32>> {
        let Some(info) = self.metadata.info(key) else {
            return Err(corrupt(&self.name, format!("tensor '{key}' is missing")));
        };
        let (start, end) = info.data_offsets;
        if info.dtype != Dtype::F32 || (end - start) as u64 != 4 * len {
            return Err(corrupt(
                &self.name,
                format!(
                    "tensor '{key}' is {:?} of {} bytes, expected F32 of {len} items",
                    info.dtype,
                    end - start
                ),
            ));
        }
        let recorded = self
            .metadata
            .metadata()
            .as_ref()
            .and_then(|m| m.get(key))
            .and_then(|text| u32::from_str_radix(text, 16).ok());
        let Some(recorded) = recorded else {
            return Err(corrupt(&self.name, format!("no checksum for tensor '{key}'")));
        };
        let mut bytes = vec![0u8; end - start];
        self.file
            .seek(SeekFrom::Start(self.header_bytes + start as u64))
            .and_then(|_| self.file.read_exact(&mut bytes))
            .map_err(|e| corrupt(&self.name, format!("reading tensor '{key}': {e}")))?;
        let crc = crc32fast::hash(&bytes);
        if crc != recorded {
            return Err(corrupt(
                &self.name,
                format!("tensor '{key}': checksum {crc:08x} differs from the recorded {recorded:08x}"),
            ));
        }
        Ok(bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect())
    }
}

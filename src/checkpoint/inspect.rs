//! A checkpoint's summary for `muon-opt inspect`: what it holds, and every file's checksum
//! verified.

use std::path::{Path, PathBuf};

use super::components::StateKind;
use super::files::scan;
use super::index::{Index, NumericsConfig, ParamEntry};
use super::publish::Paths;
use super::tp::TpRank;
use super::{INDEX_FILE, io_error};
use crate::config::MuonLayout;
use crate::error::Result;
use crate::model::Route;

/// State held for one route.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RouteState {
    pub route: Route,
    pub params: usize,
    /// Items of those params the checkpoint holds (each one f32 per state kind): all of them,
    /// or a TP rank's shards.
    pub items: u64,
    pub bytes: u64,
}

/// One rank file and the outcome of verifying it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FileCheck {
    pub name: String,
    pub bytes: u64,
    pub crc32: String,
    /// None when its size and CRC-32 match the index, else what is wrong.
    pub problem: Option<String>,
}

/// What `muon-opt inspect` prints.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Summary {
    pub schema_version: u32,
    /// The directory read (the target, or the previous checkpoint a crash left beside it).
    pub dir: PathBuf,
    pub format_version: u32,
    pub library_version: String,
    pub model_hash: String,
    pub dp: u32,
    pub layout: MuonLayout,
    pub step: u64,
    /// The saving ranks' place in their tensor-parallel group, when they had one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tp: Option<TpRank>,
    pub params: usize,
    pub config: NumericsConfig,
    pub routes: Vec<RouteState>,
    pub files: Vec<FileCheck>,
    /// Every param with its components and the pieces holding them (`inspect --params`).
    #[serde(skip)]
    pub param_entries: Vec<ParamEntry>,
}

/// Reads the index of the checkpoint in `dir` and verifies every file it lists. Errors are
/// those of the index (missing, corrupt, newer format); a bad rank file is reported in
/// [`FileCheck::problem`].
pub fn inspect(dir: &Path) -> Result<Summary> {
    let paths = Paths::new(dir)?;
    let dir = paths.for_load().to_path_buf();
    let index_path = dir.join(INDEX_FILE);
    let bytes = std::fs::read(&index_path).map_err(|e| io_error("read the checkpoint index", &index_path, &e))?;
    let index = Index::decode(&bytes)?;
    let routes = [Route::Muon, Route::Adamw]
        .into_iter()
        .map(|route| {
            let params: Vec<_> = index.params.iter().filter(|p| p.route == route).collect();
            let items: u64 = params
                .iter()
                .flat_map(|p| &p.components)
                .flat_map(|c| &c.pieces)
                .map(|piece| piece.end - piece.start)
                .sum();
            RouteState {
                route,
                params: params.len(),
                items,
                bytes: items * 4 * StateKind::of(route, index.config.muon_variant).len() as u64,
            }
        })
        .collect();
    let files = index
        .files
        .iter()
        .map(|entry| {
            let path = dir.join(&entry.name);
            let scanned = std::fs::File::open(&path)
                .map_err(|e| io_error("open", &path, &e))
                .and_then(|mut f| scan(&mut f, &path));
            let problem = match scanned {
                Err(err) => Some(err.message),
                Ok(w) if w.bytes != entry.bytes => {
                    Some(format!("{} bytes, the index recorded {}", w.bytes, entry.bytes))
                }
                Ok(w) if w.crc32 != entry.crc32 => Some(format!(
                    "CRC-32 {:08x} differs from the recorded {:08x}",
                    w.crc32, entry.crc32
                )),
                Ok(_) => None,
            };
            FileCheck {
                name: entry.name.clone(),
                bytes: entry.bytes,
                crc32: format!("{:08x}", entry.crc32),
                problem,
            }
        })
        .collect();
    Ok(Summary {
        schema_version: crate::SCHEMA_VERSION,
        dir,
        format_version: index.format_version(),
        library_version: index.library_version,
        model_hash: index.model_hash,
        dp: index.dp,
        layout: index.layout,
        step: index.step,
        tp: index.tp,
        params: index.params.len(),
        config: index.config,
        routes,
        files,
        param_entries: index.params,
    })
}

impl Summary {
    /// True when every file matched its size and checksum.
    pub fn verified(&self) -> bool {
        self.files.iter().all(|f| f.problem.is_none())
    }
}

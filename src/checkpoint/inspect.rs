//! A checkpoint's summary for `muon-opt inspect`: what it holds, and every file's checksum
//! verified.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::components::StateKind;
use super::files::scan;
use super::index::{FORMAT, FORMAT_VERSION, Index, NumericsConfig, ParamEntry};
use super::publish::Paths;
use super::{INDEX_FILE, io_error};
use crate::config::MuonLayout;
use crate::error::Result;
use crate::model::Route;

/// State held for one route.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RouteState {
    pub route: Route,
    pub params: usize,
    /// Items of those params (each holds one f32 per state kind).
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
            let items: u64 = params.iter().map(|p| p.shape.iter().product::<u64>()).sum();
            RouteState {
                route,
                params: params.len(),
                items,
                bytes: items * 4 * StateKind::of(route).len() as u64,
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
        format_version: FORMAT_VERSION,
        library_version: index.library_version,
        model_hash: index.model_hash,
        dp: index.dp,
        layout: index.layout,
        step: index.step,
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

    /// The summary as an aligned text block.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "checkpoint {}", self.dir.display());
        let _ = writeln!(
            out,
            "  format    {FORMAT} v{}, written by libmuon_opt {}",
            self.format_version, self.library_version
        );
        let _ = writeln!(out, "  model     {} params, sha256 {}", self.params, self.model_hash);
        let _ = writeln!(
            out,
            "  saved at  step {}, dp {}, {} layout",
            self.step,
            self.dp,
            self.layout.name()
        );
        for (i, r) in self.routes.iter().enumerate() {
            let kinds: Vec<&str> = StateKind::of(r.route).iter().map(|k| k.name()).collect();
            let _ = writeln!(
                out,
                "  {:<9} {:<5} {:>5} params {:>14} items {:>16} bytes ({})",
                if i == 0 { "state" } else { "" },
                r.route.name(),
                r.params,
                r.items,
                r.bytes,
                kinds.join(", ")
            );
        }
        let pairs: Vec<String> = self.config.fields().iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(out, "  numerics  {}", pairs.join(" ").replace('"', ""));
        let good = self.files.iter().filter(|f| f.problem.is_none()).count();
        for (i, f) in self.files.iter().enumerate() {
            let _ = writeln!(
                out,
                "  {:<9} {} {:>16} bytes  crc32 {}  {}",
                if i == 0 { "files" } else { "" },
                f.name,
                f.bytes,
                f.crc32,
                f.problem
                    .as_deref()
                    .map_or("ok".to_string(), |p| format!("FAILED: {p}"))
            );
        }
        let _ = write!(out, "  verified  {good} of {} files", self.files.len());
        out
    }

    /// Every param, then each of its components with the rank files and component item
    /// ranges that hold it.
    pub fn params_text(&self) -> String {
        let dims = |shape: &[u64]| shape.iter().map(u64::to_string).collect::<Vec<_>>().join("x");
        let mut out = String::new();
        for p in &self.param_entries {
            let _ = writeln!(
                out,
                "{} {} {} {}{}",
                p.name,
                dims(&p.shape),
                p.dtype.name(),
                p.route.name(),
                if p.expert_stack { " expert stack" } else { "" }
            );
            for c in &p.components {
                let pieces: Vec<String> = c
                    .pieces
                    .iter()
                    .map(|s| format!("{}[{}..{}]", s.file, s.start, s.end))
                    .collect();
                let _ = writeln!(out, "  {} {}  {}", c.name, dims(&c.shape), pieces.join(" "));
            }
        }
        out
    }
}

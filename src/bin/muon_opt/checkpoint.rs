//! `muon-opt inspect` and `muon-opt export`: a checkpoint's summary as text or JSON, and its
//! merge into one safetensors file.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Args;

use muon_opt::checkpoint::export::export;
use muon_opt::checkpoint::inspect::{Summary, inspect};
use muon_opt::checkpoint::{FORMAT, StateKind, block_text};

#[derive(Args)]
pub struct InspectArgs {
    /// The checkpoint directory (as passed to muon_optimizer_save).
    dir: PathBuf,
    /// Print the summary as JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Also list every param with its components (shape, route, and the rank files and item
    /// ranges holding each component).
    #[arg(long)]
    params: bool,
}

#[derive(Args)]
pub struct ExportArgs {
    /// The checkpoint directory (as passed to muon_optimizer_save), or the directories of
    /// every rank of a tensor-parallel group, whose TP shards export as the unsharded params.
    #[arg(required = true, num_args = 1..)]
    dirs: Vec<PathBuf>,
    /// The safetensors file to write (replaced only once complete).
    out: PathBuf,
}

pub fn run_inspect(args: &InspectArgs) -> Result<(), String> {
    let summary = inspect(&args.dir).map_err(|e| format!("inspect '{}': {e}", args.dir.display()))?;
    if args.json {
        let mut json = serde_json::to_value(&summary).map_err(|e| e.to_string())?;
        if args.params {
            json["param_components"] = serde_json::to_value(&summary.param_entries).map_err(|e| e.to_string())?;
        }
        println!("{}", serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?);
    } else {
        println!("{}", summary_text(&summary));
        if args.params {
            print!("{}", params_text(&summary));
        }
    }
    let failed = summary.files.iter().filter(|f| f.problem.is_some()).count();
    if failed > 0 {
        return Err(format!(
            "{failed} of {} files of '{}' failed verification",
            summary.files.len(),
            args.dir.display()
        ));
    }
    Ok(())
}

pub fn run_export(args: &ExportArgs) -> Result<(), String> {
    let dirs: Vec<&Path> = args.dirs.iter().map(PathBuf::as_path).collect();
    let names: Vec<String> = args.dirs.iter().map(|d| format!("'{}'", d.display())).collect();
    let done = export(&dirs, &args.out).map_err(|e| format!("export {}: {e}", names.join(", ")))?;
    println!(
        "wrote {} params (fp32 master weights at step {}), {} bytes, to {}",
        done.params,
        done.step,
        done.bytes,
        done.path.display()
    );
    Ok(())
}

/// The summary as an aligned text block.
fn summary_text(summary: &Summary) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "checkpoint {}", summary.dir.display());
    let _ = writeln!(
        out,
        "  format    {FORMAT} v{}, written by libmuon_opt {}",
        summary.format_version, summary.library_version
    );
    let _ = writeln!(
        out,
        "  model     {} params, sha256 {}",
        summary.params, summary.model_hash
    );
    let _ = writeln!(
        out,
        "  saved at  step {}, dp {}, {} layout{}",
        summary.step,
        summary.dp,
        summary.layout.name(),
        summary.tp.map_or(String::new(), |t| format!(
            ", TP rank {} of {} (TP shards in unsharded coordinates)",
            t.rank, t.size
        ))
    );
    for (i, r) in summary.routes.iter().enumerate() {
        let kinds: Vec<&str> = StateKind::of(r.route, summary.config.muon_variant)
            .iter()
            .map(|k| k.name())
            .collect();
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
    let pairs: Vec<String> = summary
        .config
        .fields()
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let _ = writeln!(out, "  numerics  {}", pairs.join(" ").replace('"', ""));
    let good = summary.files.iter().filter(|f| f.problem.is_none()).count();
    for (i, f) in summary.files.iter().enumerate() {
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
    let _ = write!(out, "  verified  {good} of {} files", summary.files.len());
    out
}

/// Every param, then each of its components with the rank files and component item
/// ranges that hold it.
fn params_text(summary: &Summary) -> String {
    let dims = |shape: &[u64]| shape.iter().map(u64::to_string).collect::<Vec<_>>().join("x");
    let mut out = String::new();
    for p in &summary.param_entries {
        let _ = writeln!(
            out,
            "{} {} {} {}{}{}",
            p.name,
            dims(&p.shape),
            p.dtype.name(),
            p.route.name(),
            if p.expert_stack { " expert stack" } else { "" },
            p.tp_split.map_or(String::new(), |s| format!(" TP shards by {s:?}"))
        );
        for c in &p.components {
            let pieces: Vec<String> = c
                .pieces
                .iter()
                .map(|s| {
                    let block = s
                        .block
                        .as_deref()
                        .map_or(String::new(), |b| format!(" of block {}", block_text(Some(b))));
                    format!("{}[{}..{}{block}]", s.file, s.start, s.end)
                })
                .collect();
            let _ = writeln!(out, "  {} {}  {}", c.name, dims(&c.shape), pieces.join(" "));
        }
    }
    out
}

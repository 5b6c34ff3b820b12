//! Crash-safe replacement of a checkpoint directory.
//!
//! Every rank writes into `<dir>.muon-saving`, beside the target. Once every file and the
//! index are fsynced, rank 0 swaps it with the target in one `renameat2(RENAME_EXCHANGE)`
//! (or renames it into place when there is no target yet), fsyncs the parent and deletes
//! the swapped-out old checkpoint. File systems without `RENAME_EXCHANGE` take two renames:
//! target → `<dir>.muon-replaced`, staging → target, then the backup is deleted. Whatever
//! point a crash interrupts, the previous checkpoint stays complete: at the target, or — only
//! between those two renames — at `<dir>.muon-replaced`, which load falls back to and the
//! next save moves back before it starts.

use std::ffi::CString;
use std::fs::{self, File};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::io_error;
use super::{INDEX_FILE, Stage};
use crate::bail;
use crate::error::Result;

/// The directories involved in saving to one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    pub target: PathBuf,
    pub staging: PathBuf,
    pub replaced: PathBuf,
    pub parent: PathBuf,
}

impl Paths {
    pub fn new(dir: &Path) -> Result<Paths> {
        let Some(name) = dir.file_name() else {
            bail!(
                InvalidArgument,
                "dir '{}': names no directory (it ends in '..' or is the root)",
                dir.display()
            );
        };
        let parent = match dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let sibling = |suffix: &str| {
            let mut n = name.to_os_string();
            n.push(suffix);
            parent.join(n)
        };
        Ok(Paths {
            target: parent.join(name),
            staging: sibling(".muon-saving"),
            replaced: sibling(".muon-replaced"),
            parent,
        })
    }

    /// Where a load reads: the target, or the previous checkpoint a crash left at the backup
    /// path between the two renames of the fallback.
    pub fn for_load(&self) -> &Path {
        if !self.target.exists() && self.replaced.join(INDEX_FILE).is_file() {
            &self.replaced
        } else {
            &self.target
        }
    }
}

/// True when every entry of `dir` is a file a checkpoint consists of, so deleting or
/// replacing `dir` loses nothing else.
fn holds_only_checkpoint_files(dir: &Path) -> Result<bool> {
    for entry in fs::read_dir(dir).map_err(|e| io_error("list", dir, &e))? {
        let entry = entry.map_err(|e| io_error("list", dir, &e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        // `.tmp*`: a rank file that a crash interrupted while safetensors was writing it.
        let ours = name == INDEX_FILE
            || (name.starts_with("rank-") && name.ends_with(".safetensors"))
            || name.starts_with(".tmp");
        if !ours || !entry.path().is_file() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Deletes a directory left by an interrupted save, after checking it holds nothing else.
fn remove_leftover(dir: &Path) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    if !dir.is_dir() || !holds_only_checkpoint_files(dir)? {
        bail!(
            InvalidArgument,
            "'{}' holds files that are not part of a checkpoint; refusing to delete it",
            dir.display()
        );
    }
    fs::remove_dir_all(dir).map_err(|e| io_error("remove", dir, &e))
}

/// fsyncs a directory, making the entries created, renamed or deleted in it durable.
pub fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error("fsync", dir, &e))
}

/// Rank 0, before any rank writes: restores a checkpoint a crash left at the backup path,
/// deletes leftovers of interrupted saves, checks that the target is replaceable and creates
/// an empty staging directory.
pub fn prepare(paths: &Paths) -> Result<()> {
    fs::create_dir_all(&paths.parent).map_err(|e| io_error("create", &paths.parent, &e))?;
    if paths.replaced.exists() {
        if paths.target.exists() {
            remove_leftover(&paths.replaced)?;
        } else {
            fs::rename(&paths.replaced, &paths.target).map_err(|e| io_error("rename", &paths.replaced, &e))?;
        }
    }
    remove_leftover(&paths.staging)?;
    if paths.target.exists() && !(paths.target.is_dir() && holds_only_checkpoint_files(&paths.target)?) {
        bail!(
            InvalidArgument,
            "dir '{}' exists and is not a checkpoint directory; refusing to replace it",
            paths.target.display()
        );
    }
    fs::create_dir(&paths.staging).map_err(|e| io_error("create", &paths.staging, &e))?;
    fsync_dir(&paths.parent)
}

/// Rank 0, after the staging directory is complete and fsynced: puts it in place of the
/// target and deletes the previous checkpoint.
pub fn publish(paths: &Paths, hook: &mut dyn FnMut(Stage) -> Result<()>) -> Result<()> {
    hook(Stage::Publish)?;
    if !paths.target.exists() {
        fs::rename(&paths.staging, &paths.target).map_err(|e| io_error("rename", &paths.staging, &e))?;
        return fsync_dir(&paths.parent);
    }
    match exchange(&paths.staging, &paths.target) {
        Ok(()) => {
            fsync_dir(&paths.parent)?;
            hook(Stage::Published)?;
            fs::remove_dir_all(&paths.staging).map_err(|e| io_error("remove", &paths.staging, &e))?;
            fsync_dir(&paths.parent)
        }
        Err(err) if matches!(err.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)) => {
            publish_by_renames(paths, hook)
        }
        Err(err) => Err(io_error("exchange", &paths.target, &err)),
    }
}

/// The fallback of [`publish`] for file systems without `RENAME_EXCHANGE`.
pub fn publish_by_renames(paths: &Paths, hook: &mut dyn FnMut(Stage) -> Result<()>) -> Result<()> {
    fs::rename(&paths.target, &paths.replaced).map_err(|e| io_error("rename", &paths.target, &e))?;
    fsync_dir(&paths.parent)?;
    hook(Stage::RenamedAway)?;
    fs::rename(&paths.staging, &paths.target).map_err(|e| io_error("rename", &paths.staging, &e))?;
    fsync_dir(&paths.parent)?;
    hook(Stage::Published)?;
    fs::remove_dir_all(&paths.replaced).map_err(|e| io_error("remove", &paths.replaced, &e))?;
    fsync_dir(&paths.parent)
}

/// Atomically swaps two directory entries (Linux `renameat2(RENAME_EXCHANGE)`, called through
/// `syscall` so that no particular glibc version is needed).
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other);
    let (a, b) = (c(a)?, c(b)?);
    // SAFETY: two valid NUL-terminated paths; the syscall reads nothing else.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Rank 0, after a save failed on some rank: deletes the partial staging directory.
pub fn abandon(paths: &Paths) -> Result<()> {
    remove_leftover(&paths.staging)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tempdir::TempDir;

    #[test]
    fn exchange_swaps_two_directories() {
        let root = TempDir::new("exchange");
        let (a, b) = (root.join("a"), root.join("b"));
        fs::create_dir(&a).unwrap();
        fs::create_dir(&b).unwrap();
        fs::write(a.join("index.json"), "a").unwrap();
        match exchange(&a, &b) {
            Ok(()) => {
                assert!(b.join("index.json").exists() && !a.join("index.json").exists());
            }
            Err(err) => eprintln!("RENAME_EXCHANGE unsupported here ({err}); saves use the two-rename fallback"),
        }
    }

    #[test]
    fn paths_sit_beside_the_target() {
        let paths = Paths::new(Path::new("runs/ckpt/")).unwrap();
        assert_eq!(paths.target, Path::new("runs/ckpt"));
        assert_eq!(paths.staging, Path::new("runs/ckpt.muon-saving"));
        assert_eq!(paths.replaced, Path::new("runs/ckpt.muon-replaced"));
        assert_eq!(Paths::new(Path::new("ckpt")).unwrap().parent, Path::new("."));
        assert!(Paths::new(Path::new("/")).is_err());
        assert!(Paths::new(Path::new("a/..")).is_err());
    }

    #[test]
    fn prepare_refuses_to_replace_or_delete_foreign_directories() {
        let root = TempDir::new("foreign");
        let paths = Paths::new(&root.join("ckpt")).unwrap();
        fs::create_dir(&paths.target).unwrap();
        fs::write(paths.target.join("notes.txt"), "mine").unwrap();
        let err = prepare(&paths).unwrap_err();
        assert!(err.message.contains("not a checkpoint directory"), "{}", err.message);
        fs::remove_file(paths.target.join("notes.txt")).unwrap();
        fs::create_dir(&paths.staging).unwrap();
        fs::write(paths.staging.join("notes.txt"), "mine").unwrap();
        let err = prepare(&paths).unwrap_err();
        assert!(err.message.contains("refusing to delete"), "{}", err.message);
        assert!(paths.staging.join("notes.txt").exists());
    }

    #[test]
    fn prepare_moves_a_backup_back_and_clears_leftovers() {
        let root = TempDir::new("recover");
        let paths = Paths::new(&root.join("ckpt")).unwrap();
        fs::create_dir(&paths.replaced).unwrap();
        fs::write(paths.replaced.join(INDEX_FILE), "old").unwrap();
        fs::create_dir(&paths.staging).unwrap();
        fs::write(paths.staging.join("rank-00000.safetensors"), "partial").unwrap();
        assert_eq!(paths.for_load(), paths.replaced);
        prepare(&paths).unwrap();
        assert_eq!(fs::read_to_string(paths.target.join(INDEX_FILE)).unwrap(), "old");
        assert!(!paths.replaced.exists());
        assert_eq!(fs::read_dir(&paths.staging).unwrap().count(), 0);
        assert_eq!(paths.for_load(), paths.target);
    }
}

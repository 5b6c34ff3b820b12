//! Sharded checkpoints of a `muon_optimizer_t` (see the `checkpoint` module for the format).

use std::ffi::{CStr, OsStr, c_char};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::bail;
use crate::capi::boundary::non_null;
use crate::capi::handle::with_mut;
use crate::capi::optimizer::muon_optimizer_t;
use crate::capi::status::muon_status_t;
use crate::error::Result;
use crate::optimizer::Optimizer;

/// The directory path behind the C string argument `name` (any bytes but NUL; not
/// necessarily UTF-8).
unsafe fn read_dir_arg<'a>(dir: *const c_char, name: &str) -> Result<&'a Path> {
    non_null(dir, name)?;
    // SAFETY: non-NULL, and the caller passes a NUL-terminated string.
    let bytes = unsafe { CStr::from_ptr(dir) }.to_bytes();
    if bytes.is_empty() {
        bail!(InvalidArgument, "{name}: the path is empty");
    }
    Ok(Path::new(OsStr::from_bytes(bytes)))
}

/// @brief Save the optimizer state of every rank as a checkpoint directory @p dir.
///        Collective: every rank of the communicator calls it with the same @p dir, which all
///        ranks must reach on a shared file system.
/// @param[in,out] opt Finalized optimizer; its state is not changed.
/// @param[in]     dir Checkpoint directory (NUL-terminated path). An existing checkpoint there
///                    is replaced atomically once every rank has written and fsynced its file;
///                    a crash at any point leaves the previous checkpoint loadable. Parent
///                    directories are created. A @p dir that exists and holds anything but
///                    checkpoint files is refused (MUON_STATUS_INVALID_ARGUMENT).
/// @return MUON_STATUS_SUCCESS on every rank once the checkpoint is in place; otherwise the
///         same failure on every rank (MUON_STATUS_IO_ERROR, or the status of the rank that
///         failed first) and see muon_last_error_message().
/// @note Stream: host-synchronizing. Finishes every queued collective (including a param
///       gather still in flight) before reading the state, and holds no buffer afterwards.
///       Writes `index.json` and one `rank-NNNNN.safetensors` per rank (fp32 masters, Muon
///       momenta, AdamW moments, keyed by component and item range in global coordinates).
///       With a tensor-parallel group of more than one rank (muon_optimizer_set_tp_group),
///       every param flagged MUON_PARAM_FLAG_TP_SHARD_ROWS or _COLS is saved as the block it
///       holds of the unsharded param's components: each TP rank's data-parallel group saves
///       into its own @p dir, and those directories reload together at any TP size
///       (muon_optimizer_load_union).
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_save(opt: *mut muon_optimizer_t, dir: *const c_char) -> muon_status_t {
    with_mut::<Optimizer>("muon_optimizer_save", opt, "opt", |o| {
        let dir = unsafe { read_dir_arg(dir, "dir") }?;
        o.save(dir)
    })
}

/// @brief Load the checkpoint in @p dir into every rank. Collective: every rank of the
///        communicator calls it with the same @p dir.
/// @param[in,out] opt Finalized optimizer, between steps (not after a grad_ready of an
///                    unfinished iteration: MUON_STATUS_INVALID_STATE).
/// @param[in]     dir Checkpoint directory written by muon_optimizer_save() at any data-parallel
///                    size and any Muon layout; each rank reads only the tensors that overlap
///                    the state it owns now. A TP rank's checkpoint holds only that rank's
///                    shards: at another TP size, or another TP rank, load the checkpoints of
///                    every TP rank together with muon_optimizer_load_union.
/// @return MUON_STATUS_SUCCESS on every rank once the masters, moments and step count are
///         replaced and every rank's param buffer is re-synchronized from the loaded masters.
///         On failure nothing changed on any rank, and every rank returns the same status:
///         MUON_STATUS_IO_ERROR (missing directory or file), MUON_STATUS_CHECKPOINT_CORRUPT
///         (truncated or damaged file, checksum mismatch), MUON_STATUS_CHECKPOINT_MISMATCH
///         (another model — names, shapes, routes, splits — or a config field that changes
///         numerics, named in the message), MUON_STATUS_CHECKPOINT_VERSION (a newer format).
/// @note Stream: host-synchronizing; the param collectives have completed on return. The
///       gradient buffer is not restored: call muon_optimizer_zero_grad() before the next
///       backward, as in every iteration.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_load(opt: *mut muon_optimizer_t, dir: *const c_char) -> muon_status_t {
    with_mut::<Optimizer>("muon_optimizer_load", opt, "opt", |o| {
        let dir = unsafe { read_dir_arg(dir, "dir") }?;
        o.load(dir)
    })
}

/// @brief Load from several checkpoints at once into every rank: each registered param from
///        the one checkpoint that holds it, or from the checkpoints of several TP ranks; params
///        the checkpoints hold that this optimizer does not register are left for other
///        optimizers. Collective, like muon_optimizer_load, every rank passing the same
///        directories in the same order.
///
/// Tensor parallelism: the checkpoints of every rank of a TP group (each saved by that rank's
/// data-parallel group, its TP shards in the unsharded params' coordinates) load at any TP
/// size — this rank's TP shards (MUON_PARAM_FLAG_TP_SHARD_ROWS / _COLS, at its rank of
/// muon_optimizer_set_tp_group), or the whole params without a TP group — and any data-parallel
/// size: each piece is read from the checkpoints that hold it, a param every TP rank holds
/// whole (a layer norm) from the lowest TP rank's.
///
/// Expert parallelism: each expert-parallel rank's expert optimizer saves its own experts
/// (registered under their global names, e.g. `layers.3.experts.12.fc1.weight`) into its own
/// directory; at another expert-parallel split an optimizer loads its experts from all of
/// those directories (and at a finer split from the one that has them), at any expert
/// data-parallel size.
/// @param[in] dirs  @p count NUL-terminated checkpoint directories, each saved by
///                  muon_optimizer_save at the same step with the same numerics.
/// @param[in] count >= 1.
/// @return As muon_optimizer_load; MUON_STATUS_CHECKPOINT_MISMATCH also for a param found in
///         none of the checkpoints, or in two that are not of different ranks of one TP group,
///         for TP shards this rank needs that none of them holds, or checkpoints of different
///         steps (named in the message).
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_optimizer_load_union(
    opt: *mut muon_optimizer_t,
    dirs: *const *const c_char,
    count: usize,
) -> muon_status_t {
    with_mut::<Optimizer>("muon_optimizer_load_union", opt, "opt", |o| {
        non_null(dirs, "dirs")?;
        if count == 0 {
            bail!(InvalidArgument, "count: 0 directories; pass at least one");
        }
        // SAFETY: the caller passes `count` pointers.
        let raw = unsafe { std::slice::from_raw_parts(dirs, count) };
        let paths = raw
            .iter()
            .enumerate()
            .map(|(k, &d)| unsafe { read_dir_arg(d, &format!("dirs[{k}]")) })
            .collect::<Result<Vec<&Path>>>()?;
        o.load_union(&paths)
    })
}

#[cfg(test)]
mod tests {
    use std::ffi::CString;
    use std::ptr::{null, null_mut};

    use super::*;
    use crate::capi::status::muon_status_t::*;
    use crate::capi::tests::{last_error, one_param_optimizer, teardown};
    use crate::tempdir::TempDir;

    #[test]
    fn arguments_and_call_order_are_checked() {
        let dir = CString::new("/nonexistent/ckpt").unwrap();
        assert_eq!(
            unsafe { muon_optimizer_save(null_mut(), dir.as_ptr()) },
            MUON_STATUS_NULL_ARGUMENT
        );
        let (comm, opt) = one_param_optimizer(false);
        assert_eq!(
            unsafe { muon_optimizer_save(opt, dir.as_ptr()) },
            MUON_STATUS_INVALID_STATE
        );
        assert!(last_error().starts_with("muon_optimizer_save: save: the optimizer is not finalized"));
        teardown(comm, opt);

        let (comm, opt) = one_param_optimizer(true);
        assert_eq!(unsafe { muon_optimizer_load(opt, null()) }, MUON_STATUS_NULL_ARGUMENT);
        assert!(last_error().contains("dir is NULL"), "{}", last_error());
        let empty = CString::new("").unwrap();
        assert_eq!(
            unsafe { muon_optimizer_save(opt, empty.as_ptr()) },
            MUON_STATUS_INVALID_ARGUMENT
        );
        assert_eq!(unsafe { muon_optimizer_load(opt, dir.as_ptr()) }, MUON_STATUS_IO_ERROR);
        assert!(
            last_error()
                .starts_with("muon_optimizer_load: cannot read the checkpoint index '/nonexistent/ckpt/index.json'"),
            "{}",
            last_error()
        );
        teardown(comm, opt);
    }

    #[test]
    fn save_then_load_through_the_exports() {
        let root = TempDir::new("capi-ckpt");
        let dir = CString::new(root.join("ckpt").into_os_string().into_encoded_bytes()).unwrap();
        let (comm, opt) = one_param_optimizer(true);
        assert_eq!(
            unsafe { muon_optimizer_save(opt, dir.as_ptr()) },
            MUON_STATUS_SUCCESS,
            "{}",
            last_error()
        );
        assert_eq!(
            unsafe { muon_optimizer_load(opt, dir.as_ptr()) },
            MUON_STATUS_SUCCESS,
            "{}",
            last_error()
        );
        teardown(comm, opt);
    }
}

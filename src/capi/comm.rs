//! `muon_comm_t`: host groups, borrowed NCCL communicators, and the CUDA availability probe.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::cuda::nccl::{NcclComm, NcclCommRaw};
use crate::backend::host::comm::HostGroup;
use crate::capi::boundary::{non_null, run, run_or};
use crate::capi::handle::{Exposed, destroy, into_raw, with_ref};
use crate::capi::status::muon_status_t;
use crate::comm::{Communicator, Transport};
use crate::config::DEFAULT_COLLECTIVE_TIMEOUT_MS;
use crate::error::Result;

/// Opaque communicator handle: one rank of a host group or a borrowed NCCL communicator.
#[allow(non_camel_case_types)]
pub struct muon_comm_t {
    _private: [u8; 0],
}

/// `struct ncclComm` — the type behind `ncclComm_t`; declared, never defined, in the header.
#[allow(non_camel_case_types)]
pub type ncclComm = NcclCommRaw;

impl Exposed for Arc<Communicator> {
    type C = muon_comm_t;
    const MAGIC: u32 = 0x4D43_4F4D;
    const NAME: &'static str = "comm";
}

/// Largest host group: ranks are threads of this process.
pub const MUON_MAX_HOST_GROUP_SIZE: u32 = 4096;

/// @brief Create an in-process group of @p world_size ranks for the host backend.
/// @param[in]  world_size Number of ranks, 1..=4096.
/// @param[out] comms      Array of @p world_size handles; comms[r] is rank r. Written only on
///                        success. The caller owns each handle; release with muon_comm_destroy.
/// @note Each rank's handle is used by one thread at a time; ranks run on different threads.
///       A rank's collectives wait MUON_DEFAULT_COLLECTIVE_TIMEOUT_MS for the others until an
///       optimizer uses the handle (as its communicator, norm group or TP group): from then on
///       they wait that optimizer's collective_timeout_ms.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_host_group_create(world_size: u32, comms: *mut *mut muon_comm_t) -> muon_status_t {
    run("muon_host_group_create", || {
        non_null(comms, "comms")?;
        if world_size == 0 || world_size > MUON_MAX_HOST_GROUP_SIZE {
            crate::bail!(
                OutOfRange,
                "world_size: {world_size} is outside 1..={MUON_MAX_HOST_GROUP_SIZE}"
            );
        }
        let timeout = Duration::from_millis(DEFAULT_COLLECTIVE_TIMEOUT_MS as u64);
        let handles: Vec<*mut muon_comm_t> = HostGroup::new(world_size as usize, timeout)
            .into_iter()
            .map(|c| into_raw(Communicator::new(Transport::Host(c))))
            .collect();
        // SAFETY: the caller provides room for world_size pointers.
        unsafe { std::ptr::copy_nonoverlapping(handles.as_ptr(), comms, handles.len()) };
        Ok(())
    })
}

/// @brief Wrap the caller's NCCL communicator for the cuda backend.
///
/// The optimizer issues its collectives on its own stream, at the greatest stream priority.
/// NCCL orders collectives per communicator in issue order: if the framework issues its own
/// collectives on the same communicator from the same rank, the two sequences interleave in
/// the order the host calls them, which must be the same on every rank. A dedicated
/// communicator avoids the coupling: `ncclCommSplit(framework_comm, 0, rank, &muon_comm,
/// NULL)` over the data-parallel group gives one at no bootstrap cost.
/// @param[in]  nccl The caller's ncclComm_t. Borrowed: it must outlive every handle made from
///                  it; muon never finalizes, destroys or aborts it. Destroy the optimizer
///                  before this communicator and before the stream it was created with.
/// @param[out] out  The new handle (caller owns; release with muon_comm_destroy).
/// @return MUON_STATUS_NCCL_UNAVAILABLE when libnccl.so.2 is neither loaded in the process nor
///         loadable; the library never loads a second copy beside the caller's.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_comm_create_nccl(nccl: *mut ncclComm, out: *mut *mut muon_comm_t) -> muon_status_t {
    run("muon_comm_create_nccl", || {
        non_null(nccl, "nccl")?;
        non_null(out, "out")?;
        // SAFETY: the documented contract: `nccl` is the caller's live communicator.
        let comm = unsafe { NcclComm::borrow(nccl) }?;
        // SAFETY: non-NULL out-pointer.
        unsafe { *out = into_raw(Communicator::new(Transport::Nccl(comm))) };
        Ok(())
    })
}

fn query(function: &str, comm: *const muon_comm_t, out: *mut u32, get: fn(&Communicator) -> usize) -> muon_status_t {
    with_ref::<Arc<Communicator>>(function, comm, "comm", |c| -> Result<()> {
        non_null(out, "out")?;
        // SAFETY: non-NULL out-pointer.
        unsafe { *out = get(c) as u32 };
        Ok(())
    })
}

/// @brief This handle's rank in its group.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_comm_rank(comm: *const muon_comm_t, rank: *mut u32) -> muon_status_t {
    query("muon_comm_rank", comm, rank, Communicator::rank)
}

/// @brief Number of ranks in the handle's group.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_comm_size(comm: *const muon_comm_t, size: *mut u32) -> muon_status_t {
    query("muon_comm_size", comm, size, Communicator::size)
}

/// @brief Release a communicator handle. NULL is a no-op; must not be called twice.
/// @note An optimizer created on this handle keeps the transport alive until it is destroyed;
///       a borrowed NCCL communicator is never destroyed by muon.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn muon_comm_destroy(comm: *mut muon_comm_t) -> muon_status_t {
    destroy::<Arc<Communicator>>("muon_comm_destroy", comm, "comm")
}

/// @brief Whether a CUDA driver and at least one device are usable in this process.
/// @return false (never a crash) when libcuda is missing or reports no device; the reason is
///         left in muon_last_error_message().
#[unsafe(no_mangle)]
pub extern "C" fn muon_cuda_available() -> bool {
    run_or(
        "muon_cuda_available",
        false,
        || match crate::backend::cuda::probe::device_count() {
            Ok(_) => true,
            Err(err) => {
                crate::capi::boundary::set_last_error(&format!("muon_cuda_available: {}", err.message));
                false
            }
        },
    )
}

//! # libmuon_opt
//!
//! The Muon optimizer with layer-wise data-parallel ownership, as a C-ABI shared library for
//! C++/CUDA training frameworks. The framework keeps its forward and backward; around them it
//! calls this library, which owns the bucket layout of params and grads, the ownership of every
//! Muon matrix, the gradient and param collectives, the Muon and AdamW math on fp32 masters,
//! MXFP8 param storage and sharded checkpoints.
//!
//! ## C API conventions (`include/muon_opt.h`)
//! - **Errors.** Every fallible function returns `muon_status_t` (0 = success; blocks: 1xx
//!   usage, 2xx CUDA, 3xx NCCL, 4xx memory, 5xx communication, 6xx I/O and checkpoints,
//!   7xx unsupported, 9xx internal). The details are in `muon_last_error_message()`, a
//!   thread-local, never-NULL string naming the function, the field and the rule. Outputs are
//!   written only on success. A failed call changes nothing.
//! - **Panics** never cross the boundary: they become `MUON_STATUS_PANIC`, and the handle
//!   involved is poisoned (later calls return `MUON_STATUS_INVALID_STATE`; destroy still works).
//! - **NULL.** Every pointer argument is checked (`MUON_STATUS_NULL_ARGUMENT`);
//!   `*_destroy(NULL)` is a no-op.
//! - **Order.** A call in the wrong phase (e.g. `add_param` after `finalize`) returns
//!   `MUON_STATUS_INVALID_STATE` with a message.
//! - **Handles** are opaque (`muon_comm_t`, `muon_optimizer_t`), created by `*_create(..., &out)`
//!   and owned by the caller. A magic value guards against foreign pointers and double destroy
//!   on a best-effort basis; the contract remains "destroy once".
//! - **Threads.** One thread per handle at a time; different handles (ranks) on different
//!   threads concurrently; `const` functions may run concurrently with each other (the handle
//!   serializes them internally), not with a non-`const` call on the same handle.
//! - **Streams and communicators** are borrowed: typed as `struct CUstream_st *` and
//!   `struct ncclComm *` so the header needs no CUDA or NCCL header; NULL is the legacy default
//!   stream; muon never destroys, finalizes or aborts what it borrowed.
//! - **ABI.** Config and description structs start with `struct_size`; fields are
//!   append-only; status codes are append-only. No ABI promise before 1.0.

/// Version of every JSON document the library and `muon-opt` print (the plan of
/// `muon_optimizer_plan_json` and `plan --json`, `simulate --json`, `inspect --json`,
/// `demo --json`), in its `schema_version` field; raised when a field changes meaning or goes
/// away (adding a field does not raise it).
pub const SCHEMA_VERSION: u32 = 1;

pub mod agreement;
pub mod backend;
pub mod capi;
pub mod checkpoint;
pub mod comm;
pub mod config;
pub mod error;
pub mod init_data;
pub mod log;
pub mod measure;
pub mod model;
pub mod numerics;
pub mod optimizer;
pub mod plan;
pub mod rng;
pub mod schedule;
pub mod sim;
/// The integration tests' scratch directories, shared with the unit tests.
#[cfg(test)]
#[path = "../tests/support/tempdir.rs"]
#[allow(dead_code)] // The unit tests use a subset of it.
mod tempdir;

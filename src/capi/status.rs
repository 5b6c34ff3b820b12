//! `muon_status_t`: explicit values in blocks, append-only; retired values stay reserved.

use std::ffi::c_char;

use crate::error::ErrorKind;

/// Result of every fallible `muon_*` call. 0 = success; 1xx usage, 2xx CUDA, 3xx NCCL,
/// 4xx memory, 5xx communication, 6xx I/O and checkpoints, 7xx unsupported, 9xx internal.
/// Details: muon_last_error_message().
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum muon_status_t {
    /// The call succeeded.
    MUON_STATUS_SUCCESS = 0,
    /// A required pointer argument was NULL.
    MUON_STATUS_NULL_ARGUMENT = 100,
    /// An argument is malformed (string, array length, unknown id).
    MUON_STATUS_INVALID_ARGUMENT = 101,
    /// A handle is not a live handle of the expected type.
    MUON_STATUS_INVALID_HANDLE = 102,
    /// Wrong call order for the handle's current state.
    MUON_STATUS_INVALID_STATE = 103,
    /// struct_size or abi_version do not match this library.
    MUON_STATUS_ABI_MISMATCH = 104,
    /// An enumeration field holds an unknown value.
    MUON_STATUS_INVALID_ENUM_VALUE = 105,
    /// A numeric field is outside its range.
    MUON_STATUS_OUT_OF_RANGE = 106,
    /// Individually valid options that cannot be combined.
    MUON_STATUS_INCOMPATIBLE_OPTIONS = 107,
    /// A caller-provided output buffer is too small.
    MUON_STATUS_BUFFER_TOO_SMALL = 108,
    /// A parameter description is invalid.
    MUON_STATUS_INVALID_PARAM = 109,
    /// A parameter name is already registered.
    MUON_STATUS_DUPLICATE_NAME = 110,
    /// Routing rules violated (tie group disagreement, vocabulary-sized Muon matrix).
    MUON_STATUS_ROUTING_CONFLICT = 111,
    /// No CUDA driver (libcuda) could be loaded.
    MUON_STATUS_CUDA_UNAVAILABLE = 200,
    /// A CUDA driver is present but there is no usable device.
    MUON_STATUS_CUDA_NO_DEVICE = 201,
    /// A CUDA driver call failed.
    MUON_STATUS_CUDA_ERROR = 202,
    /// NVRTC could not be loaded.
    MUON_STATUS_NVRTC_UNAVAILABLE = 203,
    /// A kernel failed to compile.
    MUON_STATUS_KERNEL_COMPILE_FAILED = 204,
    /// NCCL (libnccl.so.2) is not available in this process.
    MUON_STATUS_NCCL_UNAVAILABLE = 300,
    /// An NCCL call failed, or the communicator reports an asynchronous error. Every later call
    /// of the optimizer returns MUON_STATUS_COMM_BROKEN: destroy it, then abort the
    /// communicator (ncclCommAbort); muon never aborts the caller's communicator.
    MUON_STATUS_NCCL_ERROR = 301,
    /// The communicator does not match (size, rank, kind).
    MUON_STATUS_COMM_MISMATCH = 302,
    /// An allocation failed.
    MUON_STATUS_OUT_OF_MEMORY = 400,
    /// A collective did not complete within collective_timeout_ms (a rank stopped calling, or a
    /// peer died); every wait on device work that depends on a peer is bounded by it. Every
    /// later call of the optimizer returns MUON_STATUS_COMM_BROKEN (as after NCCL_ERROR).
    MUON_STATUS_COMM_TIMEOUT = 500,
    /// The communication group is unusable after an earlier failure, which the message names.
    MUON_STATUS_COMM_BROKEN = 501,
    /// Ranks registered different models (plan hashes differ).
    MUON_STATUS_PLAN_MISMATCH = 502,
    /// A file-system operation failed.
    MUON_STATUS_IO_ERROR = 600,
    /// A checkpoint file is corrupt or truncated.
    MUON_STATUS_CHECKPOINT_CORRUPT = 601,
    /// A checkpoint does not match this model or configuration.
    MUON_STATUS_CHECKPOINT_MISMATCH = 602,
    /// A checkpoint was written by a newer format version.
    MUON_STATUS_CHECKPOINT_VERSION = 603,
    /// Valid but not supported by this build or backend.
    MUON_STATUS_UNSUPPORTED = 700,
    /// A bug in the library.
    MUON_STATUS_INTERNAL = 900,
    /// A panic was caught at the C boundary; the handle involved is poisoned.
    MUON_STATUS_PANIC = 901,
}

impl muon_status_t {
    /// Every status, success first.
    pub const ALL: &'static [muon_status_t] = &[
        muon_status_t::MUON_STATUS_SUCCESS,
        muon_status_t::MUON_STATUS_NULL_ARGUMENT,
        muon_status_t::MUON_STATUS_INVALID_ARGUMENT,
        muon_status_t::MUON_STATUS_INVALID_HANDLE,
        muon_status_t::MUON_STATUS_INVALID_STATE,
        muon_status_t::MUON_STATUS_ABI_MISMATCH,
        muon_status_t::MUON_STATUS_INVALID_ENUM_VALUE,
        muon_status_t::MUON_STATUS_OUT_OF_RANGE,
        muon_status_t::MUON_STATUS_INCOMPATIBLE_OPTIONS,
        muon_status_t::MUON_STATUS_BUFFER_TOO_SMALL,
        muon_status_t::MUON_STATUS_INVALID_PARAM,
        muon_status_t::MUON_STATUS_DUPLICATE_NAME,
        muon_status_t::MUON_STATUS_ROUTING_CONFLICT,
        muon_status_t::MUON_STATUS_CUDA_UNAVAILABLE,
        muon_status_t::MUON_STATUS_CUDA_NO_DEVICE,
        muon_status_t::MUON_STATUS_CUDA_ERROR,
        muon_status_t::MUON_STATUS_NVRTC_UNAVAILABLE,
        muon_status_t::MUON_STATUS_KERNEL_COMPILE_FAILED,
        muon_status_t::MUON_STATUS_NCCL_UNAVAILABLE,
        muon_status_t::MUON_STATUS_NCCL_ERROR,
        muon_status_t::MUON_STATUS_COMM_MISMATCH,
        muon_status_t::MUON_STATUS_OUT_OF_MEMORY,
        muon_status_t::MUON_STATUS_COMM_TIMEOUT,
        muon_status_t::MUON_STATUS_COMM_BROKEN,
        muon_status_t::MUON_STATUS_PLAN_MISMATCH,
        muon_status_t::MUON_STATUS_IO_ERROR,
        muon_status_t::MUON_STATUS_CHECKPOINT_CORRUPT,
        muon_status_t::MUON_STATUS_CHECKPOINT_MISMATCH,
        muon_status_t::MUON_STATUS_CHECKPOINT_VERSION,
        muon_status_t::MUON_STATUS_UNSUPPORTED,
        muon_status_t::MUON_STATUS_INTERNAL,
        muon_status_t::MUON_STATUS_PANIC,
    ];
    /// The status reported for a core error kind.
    pub fn from_kind(kind: ErrorKind) -> Self {
        match kind {
            ErrorKind::NullArgument => muon_status_t::MUON_STATUS_NULL_ARGUMENT,
            ErrorKind::InvalidArgument => muon_status_t::MUON_STATUS_INVALID_ARGUMENT,
            ErrorKind::InvalidHandle => muon_status_t::MUON_STATUS_INVALID_HANDLE,
            ErrorKind::InvalidState => muon_status_t::MUON_STATUS_INVALID_STATE,
            ErrorKind::AbiMismatch => muon_status_t::MUON_STATUS_ABI_MISMATCH,
            ErrorKind::InvalidEnumValue => muon_status_t::MUON_STATUS_INVALID_ENUM_VALUE,
            ErrorKind::OutOfRange => muon_status_t::MUON_STATUS_OUT_OF_RANGE,
            ErrorKind::IncompatibleOptions => muon_status_t::MUON_STATUS_INCOMPATIBLE_OPTIONS,
            ErrorKind::BufferTooSmall => muon_status_t::MUON_STATUS_BUFFER_TOO_SMALL,
            ErrorKind::InvalidParam => muon_status_t::MUON_STATUS_INVALID_PARAM,
            ErrorKind::DuplicateName => muon_status_t::MUON_STATUS_DUPLICATE_NAME,
            ErrorKind::RoutingConflict => muon_status_t::MUON_STATUS_ROUTING_CONFLICT,
            ErrorKind::CudaUnavailable => muon_status_t::MUON_STATUS_CUDA_UNAVAILABLE,
            ErrorKind::CudaNoDevice => muon_status_t::MUON_STATUS_CUDA_NO_DEVICE,
            ErrorKind::CudaError => muon_status_t::MUON_STATUS_CUDA_ERROR,
            ErrorKind::NvrtcUnavailable => muon_status_t::MUON_STATUS_NVRTC_UNAVAILABLE,
            ErrorKind::KernelCompileFailed => muon_status_t::MUON_STATUS_KERNEL_COMPILE_FAILED,
            ErrorKind::NcclUnavailable => muon_status_t::MUON_STATUS_NCCL_UNAVAILABLE,
            ErrorKind::NcclError => muon_status_t::MUON_STATUS_NCCL_ERROR,
            ErrorKind::CommMismatch => muon_status_t::MUON_STATUS_COMM_MISMATCH,
            ErrorKind::OutOfMemory => muon_status_t::MUON_STATUS_OUT_OF_MEMORY,
            ErrorKind::CommTimeout => muon_status_t::MUON_STATUS_COMM_TIMEOUT,
            ErrorKind::CommBroken => muon_status_t::MUON_STATUS_COMM_BROKEN,
            ErrorKind::PlanMismatch => muon_status_t::MUON_STATUS_PLAN_MISMATCH,
            ErrorKind::Io => muon_status_t::MUON_STATUS_IO_ERROR,
            ErrorKind::CheckpointCorrupt => muon_status_t::MUON_STATUS_CHECKPOINT_CORRUPT,
            ErrorKind::CheckpointMismatch => muon_status_t::MUON_STATUS_CHECKPOINT_MISMATCH,
            ErrorKind::CheckpointVersion => muon_status_t::MUON_STATUS_CHECKPOINT_VERSION,
            ErrorKind::Unsupported => muon_status_t::MUON_STATUS_UNSUPPORTED,
            ErrorKind::Internal => muon_status_t::MUON_STATUS_INTERNAL,
            ErrorKind::Panic => muon_status_t::MUON_STATUS_PANIC,
        }
    }
    /// Static, NUL-terminated description.
    pub fn text(self) -> &'static str {
        match self {
            muon_status_t::MUON_STATUS_SUCCESS => "success\0",
            muon_status_t::MUON_STATUS_NULL_ARGUMENT => "a required pointer argument is NULL\0",
            muon_status_t::MUON_STATUS_INVALID_ARGUMENT => "invalid argument\0",
            muon_status_t::MUON_STATUS_INVALID_HANDLE => "invalid or destroyed handle\0",
            muon_status_t::MUON_STATUS_INVALID_STATE => "call not allowed in the current state\0",
            muon_status_t::MUON_STATUS_ABI_MISMATCH => "struct size or ABI version mismatch\0",
            muon_status_t::MUON_STATUS_INVALID_ENUM_VALUE => "unknown enumeration value\0",
            muon_status_t::MUON_STATUS_OUT_OF_RANGE => "value out of range\0",
            muon_status_t::MUON_STATUS_INCOMPATIBLE_OPTIONS => "incompatible options\0",
            muon_status_t::MUON_STATUS_BUFFER_TOO_SMALL => "output buffer too small\0",
            muon_status_t::MUON_STATUS_INVALID_PARAM => "invalid parameter description\0",
            muon_status_t::MUON_STATUS_DUPLICATE_NAME => "duplicate parameter name\0",
            muon_status_t::MUON_STATUS_ROUTING_CONFLICT => "routing conflict\0",
            muon_status_t::MUON_STATUS_CUDA_UNAVAILABLE => "CUDA driver not available\0",
            muon_status_t::MUON_STATUS_CUDA_NO_DEVICE => "no CUDA device\0",
            muon_status_t::MUON_STATUS_CUDA_ERROR => "CUDA error\0",
            muon_status_t::MUON_STATUS_NVRTC_UNAVAILABLE => "NVRTC not available\0",
            muon_status_t::MUON_STATUS_KERNEL_COMPILE_FAILED => "kernel compilation failed\0",
            muon_status_t::MUON_STATUS_NCCL_UNAVAILABLE => "NCCL not available\0",
            muon_status_t::MUON_STATUS_NCCL_ERROR => "NCCL error\0",
            muon_status_t::MUON_STATUS_COMM_MISMATCH => "communicator mismatch\0",
            muon_status_t::MUON_STATUS_OUT_OF_MEMORY => "out of memory\0",
            muon_status_t::MUON_STATUS_COMM_TIMEOUT => "collective timed out\0",
            muon_status_t::MUON_STATUS_COMM_BROKEN => "communication group broken\0",
            muon_status_t::MUON_STATUS_PLAN_MISMATCH => "ranks disagree on the plan\0",
            muon_status_t::MUON_STATUS_IO_ERROR => "I/O error\0",
            muon_status_t::MUON_STATUS_CHECKPOINT_CORRUPT => "checkpoint corrupt\0",
            muon_status_t::MUON_STATUS_CHECKPOINT_MISMATCH => "checkpoint does not match\0",
            muon_status_t::MUON_STATUS_CHECKPOINT_VERSION => "checkpoint format too new\0",
            muon_status_t::MUON_STATUS_UNSUPPORTED => "unsupported\0",
            muon_status_t::MUON_STATUS_INTERNAL => "internal error\0",
            muon_status_t::MUON_STATUS_PANIC => "internal panic caught\0",
        }
    }
}

/// @brief Static description of a status code.
/// @param[in] status A muon_status_t value (any integer is accepted).
/// @return A static NUL-terminated string; "unknown status" for values that name no status.
#[unsafe(no_mangle)]
pub extern "C" fn muon_status_string(status: u32) -> *const c_char {
    let found = muon_status_t::ALL.iter().find(|s| **s as u32 == status);
    found.map_or("unknown status\0", |s| s.text()).as_ptr().cast()
}

/// @brief The message of the most recent failed `muon_*` call on the calling thread.
/// @return A NUL-terminated string owned by the library, valid until the next failing call
///         on this thread; empty when no call has failed. Never NULL.
#[unsafe(no_mangle)]
pub extern "C" fn muon_last_error_message() -> *const c_char {
    crate::capi::boundary::last_error_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn every_status_has_text_and_unique_value() {
        let mut seen = std::collections::HashSet::new();
        for s in muon_status_t::ALL {
            assert!(seen.insert(*s as u32), "duplicate value {}", *s as u32);
            let text = unsafe { CStr::from_ptr(muon_status_string(*s as u32)) };
            assert!(!text.to_bytes().is_empty());
            assert_ne!(text.to_str().unwrap(), "unknown status");
        }
        let unknown = unsafe { CStr::from_ptr(muon_status_string(12345)) };
        assert_eq!(unknown.to_str().unwrap(), "unknown status");
    }

    #[test]
    fn blocks_follow_the_documented_ranges() {
        use muon_status_t::*;
        assert_eq!(MUON_STATUS_NULL_ARGUMENT as u32 / 100, 1);
        assert_eq!(MUON_STATUS_CUDA_UNAVAILABLE as u32 / 100, 2);
        assert_eq!(MUON_STATUS_NCCL_UNAVAILABLE as u32 / 100, 3);
        assert_eq!(MUON_STATUS_OUT_OF_MEMORY as u32 / 100, 4);
        assert_eq!(MUON_STATUS_COMM_TIMEOUT as u32 / 100, 5);
        assert_eq!(MUON_STATUS_IO_ERROR as u32 / 100, 6);
        assert_eq!(MUON_STATUS_UNSUPPORTED as u32 / 100, 7);
        assert_eq!(MUON_STATUS_PANIC as u32 / 100, 9);
    }
}

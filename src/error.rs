//! The error type of the safe core. Every failure carries a kind (mapped one-to-one onto a
//! C status code by `capi::status`) and a message that names the field and the rule.

use std::fmt;

/// What went wrong, in the categories a caller can act on. Each kind maps onto exactly one
/// `muon_status_t` value; see `capi::status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A required pointer argument was NULL.
    NullArgument,
    /// An argument is malformed (bad string, bad array length, unknown id).
    InvalidArgument,
    /// A handle is not a live handle of the expected type.
    InvalidHandle,
    /// The call is not allowed in the handle's current state (wrong call order).
    InvalidState,
    /// `struct_size` or `abi_version` do not match this library.
    AbiMismatch,
    /// An enumeration field holds a value that names no variant.
    InvalidEnumValue,
    /// A numeric field lies outside its documented range.
    OutOfRange,
    /// Two or more fields are individually valid but cannot be combined.
    IncompatibleOptions,
    /// A caller-provided output buffer is too small.
    BufferTooSmall,
    /// A parameter description is invalid (name, shape, splits, flags, dtype).
    InvalidParam,
    /// A parameter name is already registered.
    DuplicateName,
    /// Routing rules are violated (tie group disagreement, vocabulary-sized Muon matrix).
    RoutingConflict,
    /// No CUDA driver could be loaded.
    CudaUnavailable,
    /// A CUDA driver is present but no usable device.
    CudaNoDevice,
    /// A CUDA driver call failed.
    CudaError,
    /// NVRTC could not be loaded.
    NvrtcUnavailable,
    /// A kernel failed to compile.
    KernelCompileFailed,
    /// NCCL could not be found in the process.
    NcclUnavailable,
    /// An NCCL call failed.
    NcclError,
    /// The communicator does not match what the call expects (size, rank).
    CommMismatch,
    /// An allocation failed.
    OutOfMemory,
    /// A collective did not complete within `collective_timeout_ms`.
    CommTimeout,
    /// The communication group is unusable after an earlier failure.
    CommBroken,
    /// Ranks registered different models (plan hashes differ).
    PlanMismatch,
    /// A file-system operation failed.
    Io,
    /// A checkpoint file is corrupt or truncated.
    CheckpointCorrupt,
    /// A checkpoint does not match this model or configuration.
    CheckpointMismatch,
    /// A checkpoint was written by a newer format version.
    CheckpointVersion,
    /// The request is valid but not supported by this build or backend.
    Unsupported,
    /// A bug in the library.
    Internal,
    /// A panic was caught at the C boundary.
    Panic,
}

/// An error of the safe core: a kind and a human-readable message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

impl ErrorKind {
    /// Whether a failure of this kind leaves the communicator unusable: peers may be inside a
    /// collective this rank will never match.
    pub fn breaks_communicator(self) -> bool {
        matches!(
            self,
            ErrorKind::CommTimeout | ErrorKind::NcclError | ErrorKind::CommBroken
        )
    }
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// The text of a caught panic's payload.
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// Returns early with an [`Error`] of the given kind and a formatted message.
#[macro_export]
macro_rules! bail {
    ($kind:ident, $($arg:tt)*) => {
        return Err($crate::error::Error::new($crate::error::ErrorKind::$kind, format!($($arg)*)))
    };
}

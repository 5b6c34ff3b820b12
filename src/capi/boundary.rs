//! The panic boundary and the thread-local error slot.

use std::cell::RefCell;
use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::capi::status::muon_status_t;
use crate::error::{Error, ErrorKind, Result, panic_text};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Stores `message` as this thread's last error (interior NULs are replaced).
pub fn set_last_error(message: &str) {
    let text = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|slot| *slot.borrow_mut() = text);
}

/// Pointer to this thread's last error message; valid until the next failing call on
/// this thread. Never NULL.
pub fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|slot| slot.borrow().as_ptr())
}

/// Converts a core error into a status, recording its message with the entry point name.
pub fn fail(function: &str, err: Error) -> muon_status_t {
    let serious = matches!(
        err.kind,
        ErrorKind::CommTimeout
            | ErrorKind::CommBroken
            | ErrorKind::PlanMismatch
            | ErrorKind::CheckpointMismatch
            | ErrorKind::NcclError
            | ErrorKind::CudaError
            | ErrorKind::Internal
            | ErrorKind::Panic
    );
    if serious {
        crate::log!(Error, "{function}: {:?}: {}", err.kind, err.message);
    } else {
        crate::log!(Debug, "{function}: {:?}: {}", err.kind, err.message);
    }
    set_last_error(&format!("{function}: {}", err.message));
    muon_status_t::from_kind(err.kind)
}

/// Runs `body` for the export `function`: `Ok` → SUCCESS, `Err` → its status and message,
/// panic → `MUON_STATUS_PANIC` and the panic text. Nothing unwinds past this frame.
pub fn run(function: &str, body: impl FnOnce() -> Result<()>) -> muon_status_t {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => muon_status_t::MUON_STATUS_SUCCESS,
        Ok(Err(err)) => fail(function, err),
        Err(payload) => fail(
            function,
            Error::new(ErrorKind::Panic, format!("internal panic: {}", panic_text(&*payload))),
        ),
    }
}

/// Like [`run`] for exports that return a value instead of a status: a panic yields
/// `fallback` (and records the message).
pub fn run_or<T>(function: &str, fallback: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(payload) => {
            let message = format!("{function}: internal panic: {}", panic_text(&*payload));
            crate::log!(Error, "{message}");
            set_last_error(&message);
            fallback
        }
    }
}

/// Returns `NullArgument` naming `name` when `ptr` is NULL.
pub fn non_null<T>(ptr: *const T, name: &str) -> Result<()> {
    if ptr.is_null() {
        return Err(Error::new(ErrorKind::NullArgument, format!("{name} is NULL")));
    }
    Ok(())
}

/// Checks that `ptr` is non-NULL and that the `struct_size` it starts with covers this
/// library's `T` (the caller set `struct_size = sizeof(T)` from a header at least this new).
pub fn checked_size<T>(ptr: *const T, name: &str) -> Result<()> {
    checked_size_at_least(ptr, std::mem::size_of::<T>(), name).map(drop)
}

/// The caller's `struct_size` of a versioned output struct whose oldest released layout is
/// `min` bytes: at least `min` (a struct of an older header gets its own fields written).
pub fn checked_size_at_least<T>(ptr: *const T, min: usize, name: &str) -> Result<usize> {
    non_null(ptr, name)?;
    // SAFETY: non-NULL; every sized struct of the API starts with a u32 struct_size.
    let size = unsafe { std::ptr::read_unaligned(ptr.cast::<u32>()) } as usize;
    if size < min {
        return Err(Error::new(
            ErrorKind::AbiMismatch,
            format!("{name}->struct_size: {size} is smaller than {min}; set it to sizeof before the call"),
        ));
    }
    Ok(size)
}

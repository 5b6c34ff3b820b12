//! Opaque handles: a `Box<Handle<T>>` behind a zero-sized C type, with a magic value as
//! the first field (a best-effort guard against foreign pointers and double destroy) and
//! a poison flag set when a call on the handle panicked.
//!
//! Access follows the documented threading rules soundly: a non-`const` function gets
//! `&mut T` (the caller guarantees one thread at a time and no concurrent `const` call);
//! `const` functions may be called from several threads at once, so they get `&T` one at a
//! time under the handle's lock (`T` need not be `Sync`); the poison flag is atomic.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::capi::boundary::fail;
use crate::capi::status::muon_status_t;
use crate::error::{Error, ErrorKind, Result, panic_text};

/// Heap representation of every handle.
#[repr(C)]
pub struct Handle<T> {
    magic: u32,
    poisoned: AtomicBool,
    /// Serializes the `const` functions, which callers may run concurrently.
    shared: Mutex<()>,
    value: T,
}

/// A Rust type exposed to C through an opaque handle type `C`.
pub trait Exposed: Sized {
    /// The zero-sized C-visible type.
    type C;
    /// Magic value of live handles of this type.
    const MAGIC: u32;
    /// Name used in messages ("optimizer", "comm").
    const NAME: &'static str;
}

/// Boxes `value` and returns the opaque pointer the caller owns.
pub fn into_raw<T: Exposed>(value: T) -> *mut T::C {
    Box::into_raw(Box::new(Handle {
        magic: T::MAGIC,
        poisoned: AtomicBool::new(false),
        shared: Mutex::new(()),
        value,
    }))
    .cast()
}

fn check<T: Exposed>(ptr: *const T::C, arg: &str) -> Result<*mut Handle<T>> {
    if ptr.is_null() {
        return Err(Error::new(ErrorKind::NullArgument, format!("{arg} is NULL")));
    }
    let handle = ptr as *mut Handle<T>;
    // SAFETY: the contract says `ptr` came from `into_raw::<T>`; the magic read is the
    // documented best-effort check for anything else.
    let magic = unsafe { (*handle).magic };
    if magic != T::MAGIC {
        return Err(Error::new(
            ErrorKind::InvalidHandle,
            format!("{arg} is not a live {} handle (destroyed, or another type)", T::NAME),
        ));
    }
    if unsafe { (*handle).poisoned.load(Ordering::Acquire) } {
        return Err(Error::new(
            ErrorKind::InvalidState,
            format!(
                "{arg}: the {} handle is poisoned by an earlier internal panic; destroy it",
                T::NAME
            ),
        ));
    }
    Ok(handle)
}

/// Checks `ptr` and runs `body` on its handle inside the export's panic boundary; a panic
/// poisons the handle.
fn run<T: Exposed>(
    function: &str,
    ptr: *const T::C,
    arg: &str,
    body: impl FnOnce(*mut Handle<T>) -> Result<()>,
) -> muon_status_t {
    let handle = match catch_unwind(AssertUnwindSafe(|| check::<T>(ptr, arg))) {
        Ok(Ok(h)) => h,
        Ok(Err(err)) => return fail(function, err),
        Err(payload) => return fail(function, Error::new(ErrorKind::Panic, panic_text(&*payload))),
    };
    match catch_unwind(AssertUnwindSafe(|| body(handle))) {
        Ok(Ok(())) => muon_status_t::MUON_STATUS_SUCCESS,
        Ok(Err(err)) => fail(function, err),
        Err(payload) => {
            // SAFETY: checked live handle; the flag is atomic, so this races with nothing.
            unsafe { (*handle).poisoned.store(true, Ordering::Release) };
            fail(
                function,
                Error::new(ErrorKind::Panic, format!("internal panic: {}", panic_text(&*payload))),
            )
        }
    }
}

/// Runs `body` with exclusive access to the handle behind `ptr` (non-`const` functions: one
/// thread at a time is the caller's contract).
pub fn with_mut<T: Exposed>(
    function: &str,
    ptr: *mut T::C,
    arg: &str,
    body: impl FnOnce(&mut T) -> Result<()>,
) -> muon_status_t {
    // SAFETY: `run` checked the handle; no other call runs on it (the documented contract).
    run::<T>(function, ptr, arg, |handle| body(unsafe { &mut (*handle).value }))
}

/// Runs `body` with exclusive access to every handle of `ptrs` (named `arg[k]` in messages)
/// inside one panic boundary: the same handle twice is an error (never two `&mut` to one
/// value), and a panic poisons every handle of the call.
pub fn with_mut_each<T: Exposed>(
    function: &str,
    ptrs: &[*mut T::C],
    arg: &str,
    body: impl FnOnce(&mut [&mut T]) -> Result<()>,
) -> muon_status_t {
    let checked = catch_unwind(AssertUnwindSafe(|| -> Result<Vec<*mut Handle<T>>> {
        let handles = ptrs
            .iter()
            .enumerate()
            .map(|(k, &ptr)| check::<T>(ptr, &format!("{arg}[{k}]")))
            .collect::<Result<Vec<_>>>()?;
        for (k, handle) in handles.iter().enumerate() {
            if let Some(first) = handles[..k].iter().position(|h| h == handle) {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!("{arg}[{k}] and {arg}[{first}] are the same {}; pass each once", T::NAME),
                ));
            }
        }
        Ok(handles)
    }));
    let handles = match checked {
        Ok(Ok(handles)) => handles,
        Ok(Err(err)) => return fail(function, err),
        Err(payload) => return fail(function, Error::new(ErrorKind::Panic, panic_text(&*payload))),
    };
    // SAFETY: checked live and pairwise distinct handles; no other call runs on them (the
    // documented contract).
    let mut values: Vec<&mut T> = handles.iter().map(|&h| unsafe { &mut (*h).value }).collect();
    match catch_unwind(AssertUnwindSafe(|| body(&mut values))) {
        Ok(Ok(())) => muon_status_t::MUON_STATUS_SUCCESS,
        Ok(Err(err)) => fail(function, err),
        Err(payload) => {
            for &handle in &handles {
                // SAFETY: checked live handles; the flag is atomic.
                unsafe { (*handle).poisoned.store(true, Ordering::Release) };
            }
            fail(
                function,
                Error::new(ErrorKind::Panic, format!("internal panic: {}", panic_text(&*payload))),
            )
        }
    }
}

/// Runs `body` with shared access to the handle behind `ptr` (`const` functions, which
/// callers may run concurrently): under the handle's lock, so one `&T` exists at a time.
pub fn with_ref<T: Exposed>(
    function: &str,
    ptr: *const T::C,
    arg: &str,
    body: impl FnOnce(&T) -> Result<()>,
) -> muon_status_t {
    run::<T>(function, ptr, arg, |handle| {
        // SAFETY: `run` checked the handle; the lock orders this `&T` with every other
        // `const` call's, and non-`const` calls do not run concurrently (the contract).
        let _one_at_a_time = unsafe { &(*handle).shared }
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        body(unsafe { &(*handle).value })
    })
}

/// Destroys the handle behind `ptr`: NULL is a no-op; a foreign or already destroyed
/// handle is reported, not freed.
pub fn destroy<T: Exposed>(function: &str, ptr: *mut T::C, arg: &str) -> muon_status_t {
    if ptr.is_null() {
        return muon_status_t::MUON_STATUS_SUCCESS;
    }
    let handle = match check::<T>(ptr, arg) {
        Ok(h) => h,
        Err(err) if err.kind == ErrorKind::InvalidState => ptr as *mut Handle<T>,
        Err(err) => return fail(function, err),
    };
    // SAFETY: a live handle of type T created by `into_raw`; the magic is cleared before the
    // box is dropped so a second destroy is detected on a best-effort basis.
    unsafe { (*handle).magic = 0 };
    match catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(handle) }))) {
        Ok(()) => muon_status_t::MUON_STATUS_SUCCESS,
        Err(payload) => fail(
            function,
            Error::new(
                ErrorKind::Panic,
                format!("panic while destroying: {}", panic_text(&*payload)),
            ),
        ),
    }
}

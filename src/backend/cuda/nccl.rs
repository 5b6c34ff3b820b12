//! NCCL bound to the process's own `libnccl.so.2`: the copy already loaded (RTLD_NOLOAD)
//! first, then a normal `dlopen`; never a second copy next to the caller's. A `ncclComm_t`
//! is only valid inside the NCCL instance that created it (docs/toolchain.md, "NCCL").

use std::ffi::{CStr, c_char, c_int, c_void};

use once_cell::sync::OnceCell;

use crate::bail;
use crate::error::{Error, ErrorKind, Result};

/// `ncclResult_t`.
pub type NcclResult = c_int;
/// Opaque `struct ncclComm`.
#[repr(C)]
pub struct NcclCommRaw {
    _private: [u8; 0],
}
type Stream = *mut c_void;
type Comm = *mut NcclCommRaw;

/// `ncclDataType_t` values the library uses.
pub const NCCL_UINT8: c_int = 1;
pub const NCCL_UINT64: c_int = 5;
pub const NCCL_FLOAT32: c_int = 7;
pub const NCCL_FLOAT64: c_int = 8;
pub const NCCL_BFLOAT16: c_int = 9;
/// `ncclRedOp_t` `ncclSum`.
pub const NCCL_SUM: c_int = 0;
/// `ncclResult_t` `ncclInProgress`: a non-blocking communicator still initializing or
/// running; not an error.
pub const NCCL_IN_PROGRESS: NcclResult = 7;

/// The NCCL entry points the library uses, resolved once per process.
pub struct NcclApi {
    pub get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    pub get_error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
    pub comm_count: unsafe extern "C" fn(Comm, *mut c_int) -> NcclResult,
    pub comm_user_rank: unsafe extern "C" fn(Comm, *mut c_int) -> NcclResult,
    pub comm_get_async_error: unsafe extern "C" fn(Comm, *mut NcclResult) -> NcclResult,
    pub comm_cu_device: unsafe extern "C" fn(Comm, *mut c_int) -> NcclResult,
    pub group_start: unsafe extern "C" fn() -> NcclResult,
    pub group_end: unsafe extern "C" fn() -> NcclResult,
    pub reduce:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, c_int, Comm, Stream) -> NcclResult,
    pub broadcast: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> NcclResult,
    pub reduce_scatter:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> NcclResult,
    pub all_gather: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, Stream) -> NcclResult,
    pub all_reduce: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> NcclResult,
}

// SAFETY: plain function pointers into a library that stays loaded for the process lifetime.
unsafe impl Send for NcclApi {}
unsafe impl Sync for NcclApi {}

const LIBRARY: &CStr = c"libnccl.so.2";

fn open_library() -> Result<*mut c_void> {
    // SAFETY: dlopen with a constant NUL-terminated name.
    let loaded = unsafe { libc::dlopen(LIBRARY.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if !loaded.is_null() {
        return Ok(loaded);
    }
    let handle = unsafe { libc::dlopen(LIBRARY.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        let reason = unsafe { libc::dlerror() };
        let reason = if reason.is_null() {
            "unknown dlopen error".to_string()
        } else {
            unsafe { CStr::from_ptr(reason) }.to_string_lossy().into_owned()
        };
        bail!(
            NcclUnavailable,
            "libnccl.so.2 is neither loaded in this process nor loadable ({reason}); load the NCCL your framework uses first, or put its lib directory on LD_LIBRARY_PATH"
        );
    }
    Ok(handle)
}

fn symbol<T: Copy>(library: *mut c_void, name: &CStr) -> Result<T> {
    // SAFETY: dlsym on a live handle; the caller states the function type of `name`.
    let ptr = unsafe { libc::dlsym(library, name.as_ptr()) };
    if ptr.is_null() {
        bail!(
            NcclUnavailable,
            "libnccl.so.2 has no symbol {}; NCCL 2.12 or newer is required",
            name.to_string_lossy()
        );
    }
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&ptr) })
}

fn resolve() -> Result<NcclApi> {
    let lib = open_library()?;
    Ok(NcclApi {
        get_version: symbol(lib, c"ncclGetVersion")?,
        get_error_string: symbol(lib, c"ncclGetErrorString")?,
        comm_count: symbol(lib, c"ncclCommCount")?,
        comm_user_rank: symbol(lib, c"ncclCommUserRank")?,
        comm_get_async_error: symbol(lib, c"ncclCommGetAsyncError")?,
        comm_cu_device: symbol(lib, c"ncclCommCuDevice")?,
        group_start: symbol(lib, c"ncclGroupStart")?,
        group_end: symbol(lib, c"ncclGroupEnd")?,
        reduce: symbol(lib, c"ncclReduce")?,
        broadcast: symbol(lib, c"ncclBroadcast")?,
        reduce_scatter: symbol(lib, c"ncclReduceScatter")?,
        all_gather: symbol(lib, c"ncclAllGather")?,
        all_reduce: symbol(lib, c"ncclAllReduce")?,
    })
}

static API: OnceCell<std::result::Result<NcclApi, Error>> = OnceCell::new();

/// The process's NCCL, resolved on first use; the failure is remembered.
pub fn api() -> Result<&'static NcclApi> {
    API.get_or_init(resolve).as_ref().map_err(Clone::clone)
}

impl NcclApi {
    /// Converts an NCCL result into an error naming the call and NCCL's message.
    pub fn check(&self, call: &str, result: NcclResult) -> Result<()> {
        if result == 0 {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static string for any code.
        let text = unsafe { CStr::from_ptr((self.get_error_string)(result)) }.to_string_lossy();
        Err(Error::new(
            ErrorKind::NcclError,
            format!("{call} failed with ncclResult_t {result}: {text}"),
        ))
    }
}

/// A borrowed NCCL communicator: never finalized, destroyed or aborted by this library.
pub struct NcclComm {
    pub api: &'static NcclApi,
    pub raw: Comm,
    pub rank: usize,
    pub size: usize,
}

// SAFETY: a ncclComm_t may be used from any thread as long as calls are not concurrent,
// which the one-thread-per-handle contract guarantees.
unsafe impl Send for NcclComm {}
unsafe impl Sync for NcclComm {}

impl NcclComm {
    /// Wraps the caller's communicator after asking NCCL for its size and rank.
    ///
    /// # Safety
    /// `raw` must be a live communicator of the process's NCCL that outlives the result.
    pub unsafe fn borrow(raw: Comm) -> Result<Self> {
        let api = api()?;
        let (mut count, mut rank) = (0, 0);
        // SAFETY: `raw` is the caller's live communicator (documented contract).
        api.check("ncclCommCount", unsafe { (api.comm_count)(raw, &mut count) })?;
        api.check("ncclCommUserRank", unsafe { (api.comm_user_rank)(raw, &mut rank) })?;
        if count < 1 || rank < 0 || rank >= count {
            bail!(CommMismatch, "nccl: communicator reports rank {rank} of {count}");
        }
        Ok(NcclComm {
            api,
            raw,
            rank: rank as usize,
            size: count as usize,
        })
    }

    /// The CUDA device the communicator was created on (`ncclCommCuDevice`).
    pub fn cu_device(&self) -> Result<i32> {
        let mut device = -1;
        // SAFETY: `raw` is the caller's live communicator (contract of `borrow`).
        self.api.check("ncclCommCuDevice", unsafe {
            (self.api.comm_cu_device)(self.raw, &mut device)
        })?;
        Ok(device)
    }

    /// Waits until a non-blocking communicator finished the calls it reported `ncclInProgress`
    /// for (its asynchronous state leaves `ncclInProgress`), polling; `CommTimeout` after
    /// `timeout`, the communicator's error if it failed. Immediate for a blocking one.
    pub fn wait_until_ready(&self, timeout: std::time::Duration, what: &str) -> Result<()> {
        let start = std::time::Instant::now();
        loop {
            let mut state = 0;
            // SAFETY: as in `cu_device`.
            self.api.check("ncclCommGetAsyncError", unsafe {
                (self.api.comm_get_async_error)(self.raw, &mut state)
            })?;
            if state != NCCL_IN_PROGRESS {
                return self.api.check(what, state);
            }
            if start.elapsed() > timeout {
                bail!(
                    CommTimeout,
                    "{what}: the non-blocking communicator stayed in progress beyond collective_timeout_ms = {} ms",
                    timeout.as_millis()
                );
            }
            std::thread::yield_now();
        }
    }

    /// The communicator's asynchronous error state (`ncclCommGetAsyncError`) as an error with
    /// NCCL's message. The communicator belongs to the caller: this library never aborts it.
    pub fn async_error(&self) -> Result<()> {
        let mut state = 0;
        // SAFETY: as in `cu_device`.
        self.api.check("ncclCommGetAsyncError", unsafe {
            (self.api.comm_get_async_error)(self.raw, &mut state)
        })?;
        if state == NCCL_IN_PROGRESS {
            return Ok(());
        }
        self.api.check(
            "the communicator (ncclCommGetAsyncError reports an asynchronous error; muon does not abort the caller's communicator)",
            state,
        )
    }
}

/// `ncclUniqueId`.
#[repr(C)]
struct UniqueId {
    internal: [c_char; 128],
}

/// A one-rank communicator on the current device, created and destroyed by the library: for
/// `muon-opt measure` and the GPU tests, which have no framework to borrow one from.
pub struct SingleRankComm {
    raw: Comm,
    destroy: unsafe extern "C" fn(Comm) -> NcclResult,
}

// SAFETY: as for `NcclComm`: one thread uses it at a time.
unsafe impl Send for SingleRankComm {}
unsafe impl Sync for SingleRankComm {}

impl SingleRankComm {
    /// `ncclGetUniqueId` + `ncclCommInitRank(1 rank)` on the device of the current context.
    pub fn new() -> Result<SingleRankComm> {
        let nccl = api()?;
        let lib = open_library()?;
        let get_id: unsafe extern "C" fn(*mut UniqueId) -> NcclResult = symbol(lib, c"ncclGetUniqueId")?;
        let init: unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> NcclResult =
            symbol(lib, c"ncclCommInitRank")?;
        let destroy = symbol(lib, c"ncclCommDestroy")?;
        let mut id = UniqueId { internal: [0; 128] };
        let mut raw = std::ptr::null_mut();
        // SAFETY: out-parameters; one rank on the current device.
        nccl.check("ncclGetUniqueId", unsafe { get_id(&mut id) })?;
        nccl.check("ncclCommInitRank(1 rank)", unsafe { init(&mut raw, 1, id, 0) })?;
        Ok(SingleRankComm { raw, destroy })
    }

    /// The communicator, borrowed for as long as `self` lives.
    pub fn borrow(&self) -> Result<NcclComm> {
        // SAFETY: live until `self` drops, which the borrow cannot outlive in safe use.
        unsafe { NcclComm::borrow(self.raw) }
    }
}

impl Drop for SingleRankComm {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once.
        unsafe { (self.destroy)(self.raw) };
    }
}

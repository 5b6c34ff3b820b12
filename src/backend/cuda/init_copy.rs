//! Copies of a caller's `init_data` device arrays, made at registration in the CUDA context
//! current on the calling thread (the framework's) and held until finalize has cast them into
//! place: the model never passes through host memory, and the caller may reuse its array as
//! soon as `muon_optimizer_add_param` returns.

use std::panic::{AssertUnwindSafe, catch_unwind};

use cudarc::driver::sys as cu;

use crate::backend::cuda::CallerStream;
use crate::backend::cuda::action::DevPtr;
use crate::backend::cuda::device::{Current, driver_check};
use crate::backend::cuda::probe::device_count;
use crate::bail;
use crate::error::Result;

/// A device allocation holding a copy of a caller's device array; freed on drop.
#[derive(Debug)]
pub struct DeviceInit {
    ptr: DevPtr,
    ctx: cu::CUcontext,
}

// SAFETY: a device address and the context it lives in may be used from any thread; the
// copy is never written after creation.
unsafe impl Send for DeviceInit {}
// SAFETY: as for Send; `&DeviceInit` only reads the address.
unsafe impl Sync for DeviceInit {}

impl DeviceInit {
    /// Copies `len` bytes at device address `src` on the caller's `stream` (so after the
    /// caller's earlier work on it) and waits for the copy.
    pub fn copy_of(src: u64, len: usize, stream: CallerStream) -> Result<DeviceInit> {
        device_count()?;
        match catch_unwind(AssertUnwindSafe(|| Self::copy(src, len, stream))) {
            Ok(result) => result,
            Err(_) => bail!(CudaUnavailable, "the CUDA driver could not be loaded to copy init_data"),
        }
    }

    fn copy(src: u64, len: usize, stream: CallerStream) -> Result<DeviceInit> {
        let mut ctx = std::ptr::null_mut();
        // SAFETY: plain out-parameter.
        driver_check(|| "cuCtxGetCurrent".into(), unsafe { cu::cuCtxGetCurrent(&mut ctx) })?;
        if ctx.is_null() {
            bail!(
                CudaError,
                "init_data: no CUDA context is current on this thread; make the framework's device current (cudaSetDevice) before muon_optimizer_add_param"
            );
        }
        let mut ptr = 0;
        // SAFETY: plain out-parameter in the current context.
        driver_check(|| format!("cuMemAlloc({len} bytes for init_data)"), unsafe {
            cu::cuMemAlloc_v2(&mut ptr, len)
        })?;
        let copy = DeviceInit { ptr, ctx };
        let stream = stream.0.cast();
        // SAFETY: `ptr` holds `len` bytes; the caller guarantees `src` addresses `len` readable
        // device bytes in this context; the stream is the caller's, alive during the call.
        driver_check(|| format!("cuMemcpyDtoDAsync(init_data, {len} bytes)"), unsafe {
            cu::cuMemcpyDtoDAsync_v2(ptr, src, len, stream)
        })?;
        // SAFETY: as above.
        driver_check(|| "cuStreamSynchronize(init_data copy)".into(), unsafe {
            cu::cuStreamSynchronize(stream)
        })?;
        Ok(copy)
    }

    /// The copy's device address.
    pub fn address(&self) -> DevPtr {
        self.ptr
    }
}

impl Drop for DeviceInit {
    fn drop(&mut self) {
        let Ok(_current) = Current::enter(self.ctx) else { return };
        // SAFETY: our allocation, freed once; readers synchronized before detaching it.
        unsafe { cu::cuMemFree_v2(self.ptr) };
    }
}

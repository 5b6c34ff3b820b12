//! Copies a caller's device array to the host, in the CUDA context current on the calling
//! thread (the framework's). Used to read `init_data` device pointers at registration.

use std::panic::{AssertUnwindSafe, catch_unwind};

use cudarc::driver::sys as cu;

use crate::backend::cuda::device::driver_check;
use crate::backend::cuda::probe::device_count;
use crate::bail;
use crate::error::Result;

/// Reads `len` bytes at device address `src` (synchronous `cuMemcpyDtoH`).
pub fn read_device(src: u64, len: usize) -> Result<Vec<u8>> {
    device_count()?;
    let mut out = vec![0u8; len];
    // SAFETY: the driver is present (checked); `out` has `len` writable bytes; the caller
    // guarantees `src` addresses `len` readable device bytes in the current context.
    let result = catch_unwind(AssertUnwindSafe(|| unsafe {
        cu::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), src, len)
    }));
    match result {
        Ok(status) => driver_check(|| format!("cuMemcpyDtoH(init_data, {len} bytes)"), status)?,
        Err(_) => bail!(CudaUnavailable, "the CUDA driver could not be loaded to read init_data"),
    }
    Ok(out)
}

//! Is a CUDA driver usable here? Answered without ever letting cudarc panic: cudarc panics
//! when libcuda cannot be loaded (docs/toolchain.md), so the presence check comes first and the
//! rest runs under `catch_unwind`.

use std::panic::catch_unwind;

use crate::bail;
use crate::error::Result;

/// Number of CUDA devices, or a CudaUnavailable / CudaNoDevice / CudaError error.
pub fn device_count() -> Result<usize> {
    // SAFETY: is_culib_present only attempts to load the library.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        bail!(
            CudaUnavailable,
            "no CUDA driver: libcuda.so could not be loaded (install the NVIDIA driver, or add its directory to LD_LIBRARY_PATH); use a host group (muon_host_group_create) to run on the CPU"
        );
    }
    match catch_unwind(cudarc::driver::CudaContext::device_count) {
        Ok(Ok(0)) => bail!(
            CudaNoDevice,
            "the CUDA driver reports no device (check CUDA_VISIBLE_DEVICES)"
        ),
        Ok(Ok(n)) => Ok(n as usize),
        Ok(Err(e)) if format!("{e:?}").contains("NO_DEVICE") => {
            bail!(CudaNoDevice, "cuDeviceGetCount: {e:?} (check CUDA_VISIBLE_DEVICES)")
        }
        Ok(Err(e)) => bail!(CudaError, "cuDeviceGetCount failed: {e:?}"),
        Err(_) => bail!(
            CudaUnavailable,
            "the CUDA driver could not be initialised (cudarc panicked while loading it)"
        ),
    }
}

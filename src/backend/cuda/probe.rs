//! Is a CUDA driver usable here? Answered without ever letting cudarc panic: cudarc panics
//! when libcuda cannot be loaded (docs/toolchain.md), so the presence check comes first and the
//! rest runs under `catch_unwind`.

use std::panic::catch_unwind;

use crate::bail;
use crate::error::Result;

/// The oldest driver API the library runs on: CUDA 12.4 (`cuDriverGetVersion` 12040, driver
/// R550). Every driver function it calls exists there; the kernels are compiled at run time by
/// the NVRTC found on the library path.
pub const MIN_DRIVER_VERSION: i32 = 12040;

/// Checks the driver's CUDA version (`cuDriverGetVersion`, e.g. 12040) against the minimum and
/// against the NVRTC that will compile the kernels: a CUBIN from a newer major version of
/// NVRTC than the driver's does not load.
pub fn check_versions(driver: i32, nvrtc: Option<(i32, i32)>) -> Result<()> {
    let text = |v: i32| format!("{}.{}", v / 1000, (v % 1000) / 10);
    if driver < MIN_DRIVER_VERSION {
        bail!(
            CudaUnavailable,
            "the CUDA driver supports CUDA {} but this library needs {} or newer (NVIDIA driver R550+)",
            text(driver),
            text(MIN_DRIVER_VERSION)
        );
    }
    if let Some((major, minor)) = nvrtc
        && major > driver / 1000
    {
        bail!(
            CudaUnavailable,
            "NVRTC {major}.{minor} was loaded but the CUDA driver supports CUDA {}: kernels it compiles would not load; put an NVRTC {}.x (libnvrtc.so.{}) on LD_LIBRARY_PATH and no newer one",
            text(driver),
            driver / 1000,
            driver / 1000
        );
    }
    Ok(())
}

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

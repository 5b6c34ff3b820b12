//! The kernels of a backend: `kernels/*.cu` compiled by NVRTC at first use to a CUBIN for the
//! device's compute capability (cached per process and capability), loaded as modules into
//! the backend's CUDA context (per handle, unloaded with it).

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::sys as cu;
use once_cell::sync::Lazy;

use crate::backend::cuda::action::Kernel;
use crate::backend::cuda::device::driver_check;
use crate::backend::cuda::nvrtc::{self, INCLUDE_DIR_ENV, SOURCES, Target};
use crate::bail;
use crate::error::{Error, ErrorKind, Result};

type Images = HashMap<(&'static str, u32), Arc<Vec<u8>>>;

static IMAGES: Lazy<Mutex<Images>> = Lazy::new(|| Mutex::new(HashMap::new()));

/// The CUBIN of `source` for `sm_<cc>`, compiled on first request.
pub fn image(source: &'static str, cc: u32) -> Result<Arc<Vec<u8>>> {
    let mut images = IMAGES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(image) = images.get(&(source, cc)) {
        return Ok(image.clone());
    }
    let Some(src) = SOURCES.iter().find(|s| s.name == source) else {
        bail!(Internal, "kernel source {source} is not embedded")
    };
    let image = nvrtc::compile(src, Target::Cubin(cc)).map_err(|e| explain(e, cc))?;
    let image = Arc::new(image);
    images.insert((source, cc), image.clone());
    Ok(image)
}

/// Adds what would fix a compile failure: the NVRTC version and the include directory.
fn explain(err: Error, cc: u32) -> Error {
    if err.kind != ErrorKind::KernelCompileFailed {
        return err;
    }
    let version = nvrtc::version().map_or("unknown".into(), |(major, minor)| format!("{major}.{minor}"));
    let include = nvrtc::cuda_include_dir().map_or_else(
        || format!("none found (set {INCLUDE_DIR_ENV}, or CUDA_HOME, or install /usr/local/cuda/include)"),
        |dir| dir.display().to_string(),
    );
    Error::new(
        err.kind,
        format!(
            "{} [compiling for sm_{cc} with NVRTC {version}; CUDA include directory: {include}; a device newer than this NVRTC needs a newer libnvrtc on LD_LIBRARY_PATH]",
            err.message
        ),
    )
}

/// The loaded modules and the function of every kernel. Unloading needs the context current:
/// the owner calls [`Modules::unload`] under its context.
pub struct Modules {
    modules: Vec<cu::CUmodule>,
    functions: HashMap<Kernel, cu::CUfunction>,
}

impl Modules {
    /// No modules.
    pub fn empty() -> Modules {
        Modules {
            modules: Vec::new(),
            functions: HashMap::new(),
        }
    }

    /// Compiles (or takes from the cache) and loads every kernel for `sm_<cc>` into the
    /// current context.
    pub fn load(cc: u32) -> Result<Modules> {
        let mut loaded = Modules::empty();
        let mut by_source: HashMap<&'static str, cu::CUmodule> = HashMap::new();
        let result = (|| {
            for kernel in Kernel::ALL {
                let module = match by_source.get(kernel.source()) {
                    Some(&module) => module,
                    None => {
                        let image = image(kernel.source(), cc)?;
                        let mut module = std::ptr::null_mut();
                        // SAFETY: a CUBIN image for this device, alive across the call.
                        driver_check(|| format!("cuModuleLoadData({})", kernel.source()), unsafe {
                            cu::cuModuleLoadData(&mut module, image.as_ptr().cast())
                        })?;
                        loaded.modules.push(module);
                        by_source.insert(kernel.source(), module);
                        module
                    }
                };
                let Ok(name) = CString::new(kernel.name()) else {
                    bail!(Internal, "kernel name {} has a NUL", kernel.name())
                };
                let mut function = std::ptr::null_mut();
                // SAFETY: a loaded module and a NUL-terminated name.
                driver_check(|| format!("cuModuleGetFunction({})", kernel.name()), unsafe {
                    cu::cuModuleGetFunction(&mut function, module, name.as_ptr())
                })?;
                loaded.functions.insert(kernel, function);
            }
            Ok(())
        })();
        match result {
            Ok(()) => Ok(loaded),
            Err(err) => {
                loaded.unload();
                Err(err)
            }
        }
    }

    /// The function of `kernel`.
    pub fn function(&self, kernel: Kernel) -> Result<cu::CUfunction> {
        match self.functions.get(&kernel) {
            Some(&f) => Ok(f),
            None => bail!(Internal, "kernel {} is not loaded", kernel.name()),
        }
    }

    /// Unloads every module (the context must be current). Errors are ignored: this runs at
    /// teardown.
    pub fn unload(&mut self) {
        self.functions.clear();
        for module in self.modules.drain(..) {
            // SAFETY: a module loaded by `load`, unloaded once.
            unsafe { cu::cuModuleUnload(module) };
        }
    }
}

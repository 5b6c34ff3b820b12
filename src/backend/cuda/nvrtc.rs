//! NVRTC: kernel sources embedded in the library (`include_str!`), compiled to PTX or CUBIN.
//! Never with fast-math or flush-to-zero, and with `--fmad=false` so that device results
//! match the host backend bit for bit (no contraction of `a*b+c` into one rounding).

use std::ffi::{CString, c_char};
use std::panic::catch_unwind;
use std::path::PathBuf;

use cudarc::nvrtc::sys;

use crate::bail;
use crate::error::Result;

/// One embedded kernel source or header.
#[derive(Debug, Clone, Copy)]
pub struct Source {
    /// File name under `kernels/`.
    pub name: &'static str,
    /// File contents.
    pub text: &'static str,
}

/// Every `kernels/*.cu` translation unit.
pub const SOURCES: &[Source] = &[
    Source {
        name: "adamw.cu",
        text: include_str!("../../../kernels/adamw.cu"),
    },
    Source {
        name: "cast.cu",
        text: include_str!("../../../kernels/cast.cu"),
    },
    Source {
        name: "muon.cu",
        text: include_str!("../../../kernels/muon.cu"),
    },
    Source {
        name: "mxfp8_quantize.cu",
        text: include_str!("../../../kernels/mxfp8_quantize.cu"),
    },
    Source {
        name: "qk_clip.cu",
        text: include_str!("../../../kernels/qk_clip.cu"),
    },
    Source {
        name: "reduce.cu",
        text: include_str!("../../../kernels/reduce.cu"),
    },
    Source {
        name: "step.cu",
        text: include_str!("../../../kernels/step.cu"),
    },
];

/// Every `kernels/*.cuh` header, handed to NVRTC by name so no kernels directory is needed
/// at run time.
pub const HEADERS: &[Source] = &[
    Source {
        name: "muon_common.cuh",
        text: include_str!("../../../kernels/muon_common.cuh"),
    },
    Source {
        name: "mxfp8.cuh",
        text: include_str!("../../../kernels/mxfp8.cuh"),
    },
];

/// What to produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// PTX for a virtual architecture, e.g. `Ptx(90)` = compute_90.
    Ptx(u32),
    /// CUBIN for a real architecture, e.g. `Cubin(100)` = sm_100.
    Cubin(u32),
}

/// Environment variable naming the CUDA include directory (for `cuda_bf16.h` and friends).
pub const INCLUDE_DIR_ENV: &str = "MUON_CUDA_INCLUDE_DIR";

/// The CUDA include directory: `MUON_CUDA_INCLUDE_DIR`, then `$CUDA_HOME/include`, then
/// `/usr/local/cuda/include`; the first that exists.
pub fn cuda_include_dir() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os(INCLUDE_DIR_ENV).map(PathBuf::from),
        std::env::var_os("CUDA_HOME").map(|home| PathBuf::from(home).join("include")),
        Some(PathBuf::from("/usr/local/cuda/include")),
    ];
    candidates.into_iter().flatten().find(|dir| dir.is_dir())
}

/// Whether libnvrtc can be loaded.
pub fn available() -> bool {
    // SAFETY: only attempts to load the library.
    catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false)
}

fn check(call: &str, result: sys::nvrtcResult, log: &str) -> Result<()> {
    if result == sys::nvrtcResult::NVRTC_SUCCESS {
        return Ok(());
    }
    bail!(KernelCompileFailed, "{call} failed with {result:?}{log}");
}

struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: a program created by nvrtcCreateProgram, destroyed once.
        unsafe { sys::nvrtcDestroyProgram(&mut self.0) };
    }
}

fn program_log(program: &Program) -> String {
    let mut size = 0usize;
    // SAFETY: valid program; the buffer is sized by NVRTC.
    if unsafe { sys::nvrtcGetProgramLogSize(program.0, &mut size) } != sys::nvrtcResult::NVRTC_SUCCESS || size <= 1 {
        return String::new();
    }
    let mut buf = vec![0u8; size];
    unsafe { sys::nvrtcGetProgramLog(program.0, buf.as_mut_ptr().cast()) };
    format!(":\n{}", String::from_utf8_lossy(&buf[..size - 1]))
}

fn to_cstring(text: &str) -> Result<CString> {
    CString::new(text).or_else(|_| bail!(Internal, "kernel text contains a NUL byte"))
}

/// Compiles `source` for `target`. Errors: NvrtcUnavailable when libnvrtc is missing,
/// KernelCompileFailed with NVRTC's log otherwise.
pub fn compile(source: &Source, target: Target) -> Result<Vec<u8>> {
    if !available() {
        bail!(
            NvrtcUnavailable,
            "libnvrtc.so.13 or libnvrtc.so.12 could not be loaded: install the NVRTC of the driver's CUDA major version, 12.4 or newer (e.g. pip wheel nvidia-cuda-nvrtc==13.0.88, or nvidia-cuda-nvrtc-cu12 for a CUDA 12 driver) and put its lib directory on LD_LIBRARY_PATH"
        );
    }
    let text = to_cstring(source.text)?;
    let name = to_cstring(source.name)?;
    let header_texts = HEADERS.iter().map(|h| to_cstring(h.text)).collect::<Result<Vec<_>>>()?;
    let header_names = HEADERS.iter().map(|h| to_cstring(h.name)).collect::<Result<Vec<_>>>()?;
    let header_text_ptrs: Vec<*const c_char> = header_texts.iter().map(|c| c.as_ptr()).collect();
    let header_name_ptrs: Vec<*const c_char> = header_names.iter().map(|c| c.as_ptr()).collect();
    let mut raw = std::ptr::null_mut();
    // SAFETY: all pointers are valid NUL-terminated strings living across the call.
    let created = unsafe {
        sys::nvrtcCreateProgram(
            &mut raw,
            text.as_ptr(),
            name.as_ptr(),
            HEADERS.len() as i32,
            header_text_ptrs.as_ptr(),
            header_name_ptrs.as_ptr(),
        )
    };
    check("nvrtcCreateProgram", created, "")?;
    let program = Program(raw);
    let arch = match target {
        Target::Ptx(cc) => format!("--gpu-architecture=compute_{cc}"),
        Target::Cubin(cc) => format!("--gpu-architecture=sm_{cc}"),
    };
    let mut options = vec![arch, "--std=c++17".into(), "--fmad=false".into(), "--ftz=false".into()];
    options.extend(["--prec-div=true".into(), "--prec-sqrt=true".into()]);
    if let Some(dir) = cuda_include_dir() {
        options.push(format!("--include-path={}", dir.display()));
    }
    let options = options.iter().map(|o| to_cstring(o)).collect::<Result<Vec<_>>>()?;
    let option_ptrs: Vec<*const c_char> = options.iter().map(|c| c.as_ptr()).collect();
    let compiled = unsafe { sys::nvrtcCompileProgram(program.0, option_ptrs.len() as i32, option_ptrs.as_ptr()) };
    check(
        &format!("nvrtcCompileProgram({}, {target:?})", source.name),
        compiled,
        &program_log(&program),
    )?;
    let mut size = 0usize;
    let mut out;
    match target {
        Target::Ptx(_) => {
            check(
                "nvrtcGetPTXSize",
                unsafe { sys::nvrtcGetPTXSize(program.0, &mut size) },
                "",
            )?;
            out = vec![0u8; size];
            check(
                "nvrtcGetPTX",
                unsafe { sys::nvrtcGetPTX(program.0, out.as_mut_ptr().cast()) },
                "",
            )?;
        }
        Target::Cubin(_) => {
            check(
                "nvrtcGetCUBINSize",
                unsafe { sys::nvrtcGetCUBINSize(program.0, &mut size) },
                "",
            )?;
            out = vec![0u8; size];
            check(
                "nvrtcGetCUBIN",
                unsafe { sys::nvrtcGetCUBIN(program.0, out.as_mut_ptr().cast()) },
                "",
            )?;
        }
    }
    Ok(out)
}

/// NVRTC's version as (major, minor), or None when it cannot be loaded.
pub fn version() -> Option<(i32, i32)> {
    if !available() {
        return None;
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: plain out-parameters.
    let result = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    (result == sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
}

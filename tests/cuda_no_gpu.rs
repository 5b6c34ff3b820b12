//! On a machine without a CUDA driver (CI) the cuda backend fails with clean statuses whose
//! messages name the missing piece and what fixes it — never a crash. On a machine that has
//! the missing piece, the corresponding check prints a SKIPPED notice instead.

use std::ffi::CStr;
use std::time::Duration;

use muon_opt::backend::cuda::action::{Action, Kernel};
use muon_opt::backend::cuda::device::driver_error;
use muon_opt::backend::cuda::dry_run::{DryRun, Translated};
use muon_opt::backend::cuda::nvrtc::{self, Target};
use muon_opt::backend::cuda::{CallerStream, CudaBackend, Groups, probe};
use muon_opt::backend::host::comm::HostGroup;
use muon_opt::backend::ops::{BufferSizes, Mem, MemoryLayout, MuonWork, Op, Span, StreamKind};
use muon_opt::backend::recording::Observer;
use muon_opt::capi::comm::{muon_comm_create_nccl, muon_comm_t, muon_cuda_available, ncclComm};
use muon_opt::capi::status::{muon_last_error_message, muon_status_t};
use muon_opt::comm::{Communicator, Transport};
use muon_opt::config::{Config, Dtype};
use muon_opt::error::ErrorKind;
use muon_opt::numerics::muon::MuonOptions;
use muon_opt::numerics::mxfp8::ScaleLayout;

fn driver_present() -> bool {
    // SAFETY: only attempts to load the library.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

fn last_error() -> String {
    // SAFETY: never NULL, valid until the next muon_* call on this thread.
    unsafe { CStr::from_ptr(muon_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn no_driver_is_cuda_unavailable_with_the_fix_in_the_message() {
    if driver_present() {
        eprintln!("SKIPPED: a CUDA driver is installed here; the no-driver status cannot be observed");
        return;
    }
    let err = probe::device_count().unwrap_err();
    assert_eq!(err.kind, ErrorKind::CudaUnavailable);
    for needle in ["libcuda", "LD_LIBRARY_PATH", "muon_host_group_create"] {
        assert!(err.message.contains(needle), "{needle} missing from: {}", err.message);
    }
    assert!(!muon_cuda_available());
    assert!(last_error().contains("libcuda"), "{}", last_error());
}

#[test]
fn the_backend_constructor_reports_the_missing_driver() {
    if driver_present() {
        eprintln!("SKIPPED: a CUDA driver is installed here; the no-driver status cannot be observed");
        return;
    }
    let comm = Communicator::new(Transport::Host(HostGroup::new(1, Duration::from_secs(1)).remove(0)));
    let muon = MuonOptions::from_config(&Config::default());
    let err = CudaBackend::new(
        comm,
        Groups::default(),
        CallerStream::NULL,
        muon,
        Duration::from_secs(1),
    )
    .err()
    .expect("no driver");
    assert_eq!(err.kind, ErrorKind::CudaUnavailable);
    assert!(err.message.contains("libcuda.so"), "{}", err.message);
    assert_eq!(
        muon_status_t::from_kind(err.kind),
        muon_status_t::MUON_STATUS_CUDA_UNAVAILABLE
    );
}

fn nccl_loadable() -> bool {
    // SAFETY: dlopen/dlclose of a library name; closed again at once.
    unsafe {
        let handle = libc::dlopen(c"libnccl.so.2".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if handle.is_null() {
            return false;
        }
        libc::dlclose(handle);
        true
    }
}

#[test]
fn a_communicator_without_nccl_is_nccl_unavailable() {
    if nccl_loadable() {
        eprintln!("SKIPPED: libnccl.so.2 loads here; the NCCL-unavailable status cannot be observed");
        return;
    }
    // Never dereferenced: the library is resolved before the communicator is used.
    let fake = std::ptr::NonNull::<u64>::dangling().as_ptr().cast::<ncclComm>();
    let mut out: *mut muon_comm_t = std::ptr::null_mut();
    // SAFETY: the call fails before touching `fake`; `out` is a valid out-pointer.
    let status = unsafe { muon_comm_create_nccl(fake, &mut out) };
    assert_eq!(status, muon_status_t::MUON_STATUS_NCCL_UNAVAILABLE);
    assert!(out.is_null(), "outputs are written only on success");
    let message = last_error();
    for needle in ["libnccl.so.2", "LD_LIBRARY_PATH"] {
        assert!(message.contains(needle), "{needle} missing from: {message}");
    }
}

#[test]
fn nvrtc_absence_and_compile_failures_have_their_own_statuses() {
    let source = nvrtc::SOURCES[0];
    match nvrtc::compile(&source, Target::Cubin(90)) {
        Ok(_) => eprintln!("SKIPPED (absence): NVRTC is available here"),
        Err(err) => {
            assert_eq!(err.kind, ErrorKind::NvrtcUnavailable);
            assert!(err.message.contains("LD_LIBRARY_PATH"), "{}", err.message);
        }
    }
    let kinds = [
        ErrorKind::CudaUnavailable,
        ErrorKind::CudaNoDevice,
        ErrorKind::NvrtcUnavailable,
        ErrorKind::NcclUnavailable,
        ErrorKind::KernelCompileFailed,
        ErrorKind::OutOfMemory,
        ErrorKind::CudaError,
    ];
    let statuses: std::collections::HashSet<u32> = kinds.iter().map(|&k| muon_status_t::from_kind(k) as u32).collect();
    assert_eq!(statuses.len(), kinds.len(), "each failure has its own status");
}

#[test]
fn driver_errors_map_out_of_memory_and_no_device_to_their_statuses() {
    use cudarc::driver::sys::CUresult;
    let oom = driver_error("cuMemAlloc(1 GiB)", CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(oom.kind, ErrorKind::OutOfMemory);
    assert!(oom.message.contains("cuMemAlloc(1 GiB)") && oom.message.contains("CUDA_ERROR_OUT_OF_MEMORY"));
    assert_eq!(
        driver_error("x", CUresult::CUDA_ERROR_NO_DEVICE).kind,
        ErrorKind::CudaNoDevice
    );
    assert_eq!(
        driver_error("x", CUresult::CUDA_ERROR_LAUNCH_FAILED).kind,
        ErrorKind::CudaError
    );
}

/// The translator's own checks are the host backend's: bad spans are errors, not device faults.
#[test]
fn the_translator_rejects_what_the_host_backend_rejects() {
    let layout = MemoryLayout {
        buffers: vec![BufferSizes::whole(100, Dtype::Bf16)],
        grad_dtype: Dtype::F32,
        master: 10,
        momentum: 0,
        momentum_dtype: muon_opt::config::Dtype::F32,
        moment2: 0,
        adam_moments: 0,
        max_component: (0, 0),
        muon_work: MuonWork::default(),
        tp_components: Vec::new(),
        mxfp8: Vec::new(),
        mxfp8_scale_layout: ScaleLayout::Compact,
    };
    let mut dry = DryRun::new(0, 2, MuonOptions::from_config(&Config::default()));
    dry.observe(&Op::Allocate(layout));
    dry.observe(&Op::MemsetZero {
        stream: StreamKind::Compute,
        span: Span::new(Mem::Param(0), 90, 11),
    });
    dry.observe(&Op::Cast {
        src: Span::new(Mem::Master, 0, 10),
        dst: Span::new(Mem::Param(0), 0, 9),
    });
    dry.observe(&Op::Collectives(vec![muon_opt::backend::ops::CollOp::AllGather {
        span: Span::new(Mem::Param(0), 0, 99),
    }]));
    dry.observe(&Op::Cast {
        src: Span::new(Mem::Master, 0, 10),
        dst: Span::new(Mem::Param(0), 0, 10),
    });
    let results: Vec<_> = dry.log.iter().map(|(_, r)| r.as_ref().map_err(|e| e.kind)).collect();
    assert!(matches!(results[0], Ok(Translated::Actions(_))));
    assert_eq!(results[1], Err(ErrorKind::Internal), "out of bounds");
    assert_eq!(results[2], Err(ErrorKind::Internal), "length mismatch");
    assert_eq!(results[3], Err(ErrorKind::Internal), "99 elements over 2 ranks");
    let Ok(Translated::Actions(actions)) = &results[4] else {
        panic!("{:?}", results[4])
    };
    let [Action::Launch(launch)] = actions.as_slice() else {
        panic!("{actions:?}")
    };
    assert_eq!(launch.kernel, Kernel::Cast);
}

/// CUDA 12.4+ and 13 drivers: the driver's version is checked against the minimum and against
/// the NVRTC that compiles the kernels (a newer major NVRTC than the driver's makes CUBINs the
/// driver cannot load), each refusal naming the versions and the fix.
#[test]
fn driver_and_nvrtc_versions_are_checked_before_any_kernel_is_built() {
    use muon_opt::backend::cuda::probe::check_versions;
    for (driver, nvrtc) in [
        (12040, Some((12, 4))),
        (12080, Some((12, 8))),
        (12090, None),
        (13000, Some((13, 0))),
        (13000, Some((12, 8))),
    ] {
        check_versions(driver, nvrtc).unwrap_or_else(|e| panic!("driver {driver}, NVRTC {nvrtc:?}: {e}"));
    }
    let old = check_versions(12020, Some((12, 2))).unwrap_err();
    assert_eq!(old.kind, ErrorKind::CudaUnavailable);
    assert!(
        old.message.contains("supports CUDA 12.2 but this library needs 12.4"),
        "{old}"
    );
    let mixed = check_versions(12060, Some((13, 0))).unwrap_err();
    assert_eq!(mixed.kind, ErrorKind::CudaUnavailable);
    assert!(
        mixed
            .message
            .contains("NVRTC 13.0 was loaded but the CUDA driver supports CUDA 12.6")
            && mixed.message.contains("libnvrtc.so.12"),
        "{mixed}"
    );
}

/// The README and docs/toolchain.md state the oldest driver the code accepts
/// (`probe::MIN_DRIVER_VERSION`), and neither asks for a newer one.
#[test]
fn the_docs_state_the_minimum_driver_of_the_code() {
    let min = probe::MIN_DRIVER_VERSION;
    let stated = format!("CUDA {}.{}+", min / 1000, (min % 1000) / 10);
    for (name, text) in [
        ("README.md", include_str!("../README.md")),
        ("docs/toolchain.md", include_str!("../docs/toolchain.md")),
    ] {
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(text.contains(&stated), "{name} does not say '{stated}'");
        assert!(
            !text.contains("needs a CUDA 13 driver"),
            "{name} asks for a CUDA 13 driver"
        );
    }
}

//! The executor of device actions: the CUDA context current on the calling thread at
//! creation, the caller's stream (borrowed: only raw driver calls on it, never a type that
//! would destroy it), the library's own comm stream and events, device allocations, the
//! loaded kernels, a cuBLAS handle and the caller's NCCL communicator (borrowed, never
//! aborted). Everything this type created it destroys on drop; nothing else.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::cublas::sys as blas;
use cudarc::driver::sys as cu;

use crate::backend::cuda::action::{
    Action, Arg, Buf, DevPtr, Gemm, GemmInputs, Matrices, NcclCall, NcclComm as ActionComm, NcclType,
};
use crate::backend::cuda::kernels::Modules;
use crate::backend::cuda::nccl::{
    NCCL_BFLOAT16, NCCL_FLOAT32, NCCL_FLOAT64, NCCL_IN_PROGRESS, NCCL_SUM, NCCL_UINT8, NCCL_UINT64, NcclComm,
};
use crate::backend::cuda::pinned::PinnedRing;
use crate::backend::cuda::timing::TimingEvents;
use crate::backend::cuda::{nvrtc, probe};
use crate::backend::ops::StreamKind;
use crate::bail;
use crate::comm::{Communicator, Transport};
use crate::error::{Error, ErrorKind, Result};

/// `CU_STREAM_NON_BLOCKING`: the comm stream never synchronizes implicitly with the legacy
/// default stream; it is ordered against the caller's stream by events only.
const STREAM_NON_BLOCKING: u32 = 1;
/// `CU_EVENT_DISABLE_TIMING`.
const EVENT_DISABLE_TIMING: u32 = 2;
/// cuBLAS workspace, set explicitly so cuBLAS never allocates while the step runs (32 MiB is
/// NVIDIA's recommendation for Hopper and Blackwell).
const BLAS_WORKSPACE: usize = 32 << 20;

/// An error for a failed driver call; out of memory and "no device" get their own kinds. The
/// message names the call and the `CUresult` (by name, without calling into the driver).
pub fn driver_error(call: &str, result: cu::CUresult) -> Error {
    let kind = match result {
        cu::CUresult::CUDA_ERROR_OUT_OF_MEMORY => ErrorKind::OutOfMemory,
        cu::CUresult::CUDA_ERROR_NO_DEVICE => ErrorKind::CudaNoDevice,
        _ => ErrorKind::CudaError,
    };
    Error::new(kind, format!("{call} failed with {result:?} ({})", result as i32))
}

/// `Ok` for `CUDA_SUCCESS`, else [`driver_error`] naming the call.
pub fn driver_check(call: impl FnOnce() -> String, result: cu::CUresult) -> Result<()> {
    if result == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(driver_error(&call(), result))
    }
}

fn blas_check(call: &str, status: blas::cublasStatus_t) -> Result<()> {
    match status {
        blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS => Ok(()),
        blas::cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED => bail!(OutOfMemory, "{call} failed with {status:?}"),
        _ => bail!(CudaError, "{call} failed with {status:?}"),
    }
}

/// Makes a context current for the lifetime of the guard (push/pop, only if it is not
/// current already), so calls from any thread run in the backend's context.
pub struct Current {
    pushed: bool,
}

impl Current {
    pub(crate) fn enter(ctx: cu::CUcontext) -> Result<Current> {
        let mut current = std::ptr::null_mut();
        // SAFETY: plain out-parameter.
        driver_check(|| "cuCtxGetCurrent".into(), unsafe {
            cu::cuCtxGetCurrent(&mut current)
        })?;
        if current == ctx {
            return Ok(Current { pushed: false });
        }
        // SAFETY: a live context (the one current at creation; primary contexts stay alive).
        driver_check(|| "cuCtxPushCurrent".into(), unsafe { cu::cuCtxPushCurrent_v2(ctx) })?;
        Ok(Current { pushed: true })
    }
}

impl Drop for Current {
    fn drop(&mut self) {
        if self.pushed {
            let mut popped = std::ptr::null_mut();
            // SAFETY: pops what `enter` pushed.
            unsafe { cu::cuCtxPopCurrent_v2(&mut popped) };
        }
    }
}

/// The device side of one rank's cuda backend.
pub struct Device {
    ctx: cu::CUcontext,
    compute: cu::CUstream,
    comm_stream: cu::CUstream,
    /// Private events for host waits, per stream.
    host_waits: [cu::CUevent; 2],
    /// The schedule's events, created on first use.
    events: HashMap<usize, cu::CUevent>,
    buffers: HashMap<Buf, (DevPtr, u64)>,
    modules: Modules,
    blas: blas::cublasHandle_t,
    blas_workspace: DevPtr,
    comm: Arc<Communicator>,
    /// The norm group's communicator, when the gradient norm is summed over one.
    norm_group: Option<Arc<Communicator>>,
    /// The tensor-parallel group's communicator, when TP shards are orthogonalized over it.
    tp_group: Option<Arc<Communicator>>,
    timeout: Duration,
    staging: PinnedRing,
    /// Events of `muon-opt measure`'s per-action timing ([`super::timing`]).
    pub(crate) timing: TimingEvents,
}

// SAFETY: the handles are used by one thread at a time (one thread per optimizer handle);
// every call makes the backend's context current first.
unsafe impl Send for Device {}

/// The CUDA context of the caller's setup and its device's compute capability.
struct Setup {
    ctx: cu::CUcontext,
    cc: u32,
}

fn setup(comm: &NcclComm, stream: cu::CUstream) -> Result<Setup> {
    // SAFETY: the driver library is loaded (checked by the caller); plain out-parameters.
    driver_check(|| "cuInit".into(), unsafe { cu::cuInit(0) })?;
    let mut driver = 0;
    driver_check(|| "cuDriverGetVersion".into(), unsafe {
        cu::cuDriverGetVersion(&mut driver)
    })?;
    probe::check_versions(driver, nvrtc::version())?;
    let mut ctx = std::ptr::null_mut();
    driver_check(|| "cuCtxGetCurrent".into(), unsafe { cu::cuCtxGetCurrent(&mut ctx) })?;
    if !stream.is_null() {
        let mut stream_ctx = std::ptr::null_mut();
        // SAFETY: the caller's live stream (documented contract).
        driver_check(|| "cuStreamGetCtx(stream)".into(), unsafe {
            cu::cuStreamGetCtx(stream, &mut stream_ctx)
        })?;
        if ctx.is_null() {
            ctx = stream_ctx;
        } else if ctx != stream_ctx {
            bail!(
                InvalidArgument,
                "stream: belongs to a different CUDA context than the one current on this thread; create the optimizer with a stream of the framework's device and make that device current"
            );
        }
    }
    if ctx.is_null() {
        bail!(
            InvalidState,
            "no CUDA context is current on this thread: make the framework's device current (cudaSetDevice / torch.cuda.set_device) before muon_optimizer_finalize"
        );
    }
    let _current = Current::enter(ctx)?;
    let mut device = 0;
    driver_check(|| "cuCtxGetDevice".into(), unsafe { cu::cuCtxGetDevice(&mut device) })?;
    let nccl_device = comm.cu_device()?;
    if nccl_device != device {
        bail!(
            CommMismatch,
            "the NCCL communicator was created on CUDA device {nccl_device} but the current context is on device {device}"
        );
    }
    let attribute = |attr| {
        let mut value = 0;
        // SAFETY: plain out-parameter, valid device.
        driver_check(|| format!("cuDeviceGetAttribute({attr:?})"), unsafe {
            cu::cuDeviceGetAttribute(&mut value, attr, device)
        })
        .map(|()| value as u32)
    };
    let major = attribute(cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attribute(cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    Ok(Setup {
        ctx,
        cc: major * 10 + minor,
    })
}

impl Device {
    /// Binds to the context current on this thread (or the stream's), checks that the NCCL
    /// communicator lives on the same device, creates the comm stream and events, compiles and
    /// loads the kernels for the device and creates the cuBLAS handle on the caller's stream.
    pub fn new(comm: Arc<Communicator>, stream: cu::CUstream, timeout: Duration) -> Result<Device> {
        let Transport::Nccl(nccl) = &comm.transport else {
            bail!(CommMismatch, "the cuda backend needs an NCCL communicator");
        };
        let setup = setup(nccl, stream)?;
        let _current = Current::enter(setup.ctx)?;
        let mut device = Device {
            ctx: setup.ctx,
            compute: stream,
            comm_stream: std::ptr::null_mut(),
            host_waits: [std::ptr::null_mut(); 2],
            events: HashMap::new(),
            buffers: HashMap::new(),
            modules: Modules::empty(),
            blas: std::ptr::null_mut(),
            blas_workspace: 0,
            comm: comm.clone(),
            norm_group: None,
            tp_group: None,
            timeout,
            staging: PinnedRing::default(),
            timing: TimingEvents::default(),
        };
        // SAFETY (this block): plain out-parameters in the current context; everything created
        // is owned by `device` and released by its Drop if a later step fails.
        // The comm stream at the greatest priority the context offers: a collective's kernels
        // are scheduled ahead of queued compute kernels, so a peer waiting on this rank's part
        // is not held up by this rank's Newton–Schulz (PyTorch offers the same for its NCCL
        // streams: `ProcessGroupNCCL.Options(is_high_priority_stream=True)`).
        let (mut least, mut greatest) = (0, 0);
        driver_check(|| "cuCtxGetStreamPriorityRange".into(), unsafe {
            cu::cuCtxGetStreamPriorityRange(&mut least, &mut greatest)
        })?;
        driver_check(|| format!("cuStreamCreateWithPriority(priority {greatest})"), unsafe {
            cu::cuStreamCreateWithPriority(&mut device.comm_stream, STREAM_NON_BLOCKING, greatest)
        })?;
        for event in &mut device.host_waits {
            driver_check(|| "cuEventCreate".into(), unsafe {
                cu::cuEventCreate(event, EVENT_DISABLE_TIMING)
            })?;
        }
        device.modules = Modules::load(setup.cc)?;
        // SAFETY: only attempts to load the library.
        if !unsafe { blas::is_culib_present() } {
            bail!(
                CudaUnavailable,
                "libcublas.so.13 could not be loaded (cuBLAS runs the Newton-Schulz products): install the CUDA 13 cuBLAS (e.g. pip wheel nvidia-cublas) and put its lib directory on LD_LIBRARY_PATH"
            );
        }
        blas_check("cublasCreate", unsafe { blas::cublasCreate_v2(&mut device.blas) })?;
        blas_check("cublasSetStream", unsafe {
            blas::cublasSetStream_v2(device.blas, stream.cast())
        })?;
        blas_check("cublasSetMathMode(CUBLAS_DEFAULT_MATH)", unsafe {
            blas::cublasSetMathMode(device.blas, blas::cublasMath_t::CUBLAS_DEFAULT_MATH)
        })?;
        driver_check(
            || format!("cuMemAlloc({BLAS_WORKSPACE} bytes, cuBLAS workspace)"),
            unsafe { cu::cuMemAlloc_v2(&mut device.blas_workspace, BLAS_WORKSPACE) },
        )?;
        blas_check("cublasSetWorkspace", unsafe {
            blas::cublasSetWorkspace_v2(device.blas, device.blas_workspace as *mut c_void, BLAS_WORKSPACE)
        })?;
        Ok(device)
    }

    /// Makes the backend's context current for the guard's lifetime.
    pub fn enter(&self) -> Result<Current> {
        Current::enter(self.ctx)
    }

    /// Orthogonalizes tensor-parallel shards over `group`, an NCCL communicator on this
    /// device.
    pub fn with_tp_group(mut self, group: Arc<Communicator>) -> Result<Device> {
        if !matches!(group.transport, Transport::Nccl(_)) {
            bail!(CommMismatch, "tp group: the cuda backend needs an NCCL communicator");
        }
        self.tp_group = Some(group);
        Ok(self)
    }

    /// Sums the gradient norm over `group`, an NCCL communicator on this device spanning the
    /// data-parallel group.
    pub fn with_norm_group(mut self, group: Arc<Communicator>) -> Result<Device> {
        if !matches!(group.transport, Transport::Nccl(_)) {
            bail!(CommMismatch, "norm group: the cuda backend needs an NCCL communicator");
        }
        self.norm_group = Some(group);
        Ok(self)
    }

    /// Every communicator the optimizer issues on: the data-parallel one, then the norm and
    /// tensor-parallel groups it has. A host wait polls each one's asynchronous error, all
    /// bounded by the one `collective_timeout_ms`.
    fn comms(&self) -> impl Iterator<Item = &Arc<Communicator>> {
        std::iter::once(&self.comm)
            .chain(&self.norm_group)
            .chain(&self.tp_group)
    }

    fn nccl(&self) -> &NcclComm {
        Self::nccl_of(&self.comm)
    }

    fn nccl_of(comm: &Communicator) -> &NcclComm {
        match &comm.transport {
            Transport::Nccl(nccl) => nccl,
            Transport::Host(_) => unreachable!("checked in Device::new and with_norm_group"),
        }
    }

    /// The NCCL communicator an action names.
    fn nccl_for(&self, which: ActionComm) -> &NcclComm {
        let group = match which {
            ActionComm::Data => None,
            ActionComm::Norm => self.norm_group.as_ref(),
            ActionComm::Tensor => self.tp_group.as_ref(),
        };
        group.map_or_else(|| self.nccl(), |g| Self::nccl_of(g))
    }

    pub(crate) fn stream(&self, kind: StreamKind) -> cu::CUstream {
        match kind {
            StreamKind::Compute => self.compute,
            StreamKind::Comm => self.comm_stream,
        }
    }

    /// Allocates `bytes` zeroed device bytes for `buf` (zeroed on the compute stream),
    /// replacing and freeing an earlier allocation of `buf`. Zero bytes allocate nothing and
    /// give address 0.
    pub fn alloc(&mut self, buf: Buf, bytes: u64) -> Result<DevPtr> {
        let mut ptr = 0;
        if bytes > 0 {
            // SAFETY: plain out-parameter in the current context.
            driver_check(|| format!("cuMemAlloc({bytes} bytes for {buf:?})"), unsafe {
                cu::cuMemAlloc_v2(&mut ptr, bytes as usize)
            })?;
            // SAFETY: the allocation just made, on the caller's stream.
            let zeroed = unsafe { cu::cuMemsetD8Async(ptr, 0, bytes as usize, self.compute) };
            if let Err(err) = driver_check(|| format!("cuMemsetD8Async({buf:?})"), zeroed) {
                unsafe { cu::cuMemFree_v2(ptr) };
                return Err(err);
            }
        }
        if let Some((old, _)) = self.buffers.insert(buf, (ptr, bytes))
            && old != 0
        {
            // SAFETY: our allocation, replaced; the memory is freed once.
            unsafe { cu::cuMemFree_v2(old) };
        }
        Ok(ptr)
    }

    /// Executes one action (except `Alloc`, see [`Device::alloc`]); a `CopyOut` appends the
    /// bytes it read to `out`.
    pub fn execute(&mut self, action: &Action, out: &mut Vec<Vec<u8>>) -> Result<()> {
        match action {
            Action::Alloc { buf, .. } => bail!(Internal, "Alloc of {buf:?} must go through Device::alloc"),
            Action::CopyIn { dst, bytes, stream } => {
                // SAFETY: `bytes` stays alive until the wait below finished the copy.
                driver_check(|| format!("cuMemcpyHtoDAsync({} bytes)", bytes.len()), unsafe {
                    cu::cuMemcpyHtoDAsync_v2(*dst, bytes.as_ptr().cast(), bytes.len(), self.stream(*stream))
                })?;
                self.wait_for(*stream, "a host-to-device copy")
            }
            Action::CopyInAsync { dst, bytes, stream } => {
                let stream = self.stream(*stream);
                // SAFETY: our live stream in the current context; the translator checked the range.
                unsafe { self.staging.copy(*dst, bytes, stream) }
            }
            Action::CopyOut { src, bytes, stream } => {
                // A copy into pageable memory blocks inside the driver until the stream's earlier
                // work is done, where no timeout or NCCL error is seen: wait for that work
                // first, polling, so the copy itself only moves the bytes.
                self.wait_for(*stream, "the work before a device-to-host copy")?;
                let mut host = vec![0u8; *bytes as usize];
                // SAFETY: `host` stays alive until the wait below finished the copy.
                driver_check(|| format!("cuMemcpyDtoHAsync({bytes} bytes)"), unsafe {
                    cu::cuMemcpyDtoHAsync_v2(host.as_mut_ptr().cast(), *src, host.len(), self.stream(*stream))
                })?;
                self.wait_for(*stream, "a device-to-host copy")?;
                out.push(host);
                Ok(())
            }
            Action::Zero { dst, bytes, stream } => {
                if *bytes == 0 {
                    return Ok(());
                }
                // SAFETY: a range of our allocations (the translator checked the bounds).
                driver_check(|| format!("cuMemsetD8Async({bytes} bytes)"), unsafe {
                    cu::cuMemsetD8Async(*dst, 0, *bytes as usize, self.stream(*stream))
                })
            }
            Action::CopyDevice {
                dst,
                src,
                bytes,
                stream,
            } => {
                if *bytes == 0 {
                    return Ok(());
                }
                // SAFETY: ranges of our allocations (bounds checked by the translator).
                driver_check(|| format!("cuMemcpyDtoDAsync({bytes} bytes)"), unsafe {
                    cu::cuMemcpyDtoDAsync_v2(*dst, *src, *bytes as usize, self.stream(*stream))
                })
            }
            Action::CopyDevice2D {
                dst,
                dst_pitch,
                src,
                src_pitch,
                width,
                height,
                stream,
            } => {
                if *width == 0 || *height == 0 {
                    return Ok(());
                }
                let copy = cu::CUDA_MEMCPY2D {
                    srcXInBytes: 0,
                    srcY: 0,
                    srcMemoryType: cu::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                    srcHost: std::ptr::null(),
                    srcDevice: *src,
                    srcArray: std::ptr::null_mut(),
                    srcPitch: *src_pitch as usize,
                    dstXInBytes: 0,
                    dstY: 0,
                    dstMemoryType: cu::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                    dstHost: std::ptr::null_mut(),
                    dstDevice: *dst,
                    dstArray: std::ptr::null_mut(),
                    dstPitch: *dst_pitch as usize,
                    WidthInBytes: *width as usize,
                    Height: *height as usize,
                };
                // SAFETY: pitched ranges of our allocations (bounds checked by the translator);
                // the descriptor is read during the call.
                driver_check(|| format!("cuMemcpy2DAsync({height} rows of {width} bytes)"), unsafe {
                    cu::cuMemcpy2DAsync_v2(&copy, self.stream(*stream))
                })
            }
            Action::Launch(launch) => {
                let function = self.modules.function(launch.kernel)?;
                let mut words: Vec<Vec<u64>> = launch.args.iter().map(Arg::words).collect();
                let mut params: Vec<*mut c_void> = words.iter_mut().map(|w| w.as_mut_ptr().cast()).collect();
                let ([gx, gy, gz], [bx, by, bz]) = (launch.grid, launch.block);
                // SAFETY: the arguments match the kernel's signature (the translator builds them
                // per kernel); `words` outlives the call, which copies the parameters.
                driver_check(|| format!("cuLaunchKernel({})", launch.kernel.name()), unsafe {
                    cu::cuLaunchKernel(
                        function,
                        gx,
                        gy,
                        gz,
                        bx,
                        by,
                        bz,
                        0,
                        self.stream(launch.stream),
                        params.as_mut_ptr(),
                        std::ptr::null_mut(),
                    )
                })
            }
            Action::Gemm(gemm) => self.gemm(gemm),
            Action::Nccl(which, calls) => self.nccl_group(*which, calls),
            Action::Record { stream, event } => {
                let event = self.event(event.0)?;
                // SAFETY: our event, recorded on a live stream.
                driver_check(|| "cuEventRecord".into(), unsafe {
                    cu::cuEventRecord(event, self.stream(*stream))
                })
            }
            Action::Wait { stream, event } => {
                let event = self.event(event.0)?;
                // SAFETY: as above.
                driver_check(|| "cuStreamWaitEvent".into(), unsafe {
                    cu::cuStreamWaitEvent(self.stream(*stream), event, 0)
                })
            }
            Action::Synchronize(stream) => self.wait_for(*stream, "synchronize"),
        }
    }

    fn event(&mut self, id: usize) -> Result<cu::CUevent> {
        if let Some(&event) = self.events.get(&id) {
            return Ok(event);
        }
        let mut event = std::ptr::null_mut();
        // SAFETY: plain out-parameter in the current context.
        driver_check(|| "cuEventCreate".into(), unsafe {
            cu::cuEventCreate(&mut event, EVENT_DISABLE_TIMING)
        })?;
        self.events.insert(id, event);
        Ok(event)
    }

    /// Blocks the host until `stream` finished its work: records a private event and polls
    /// it, checking the asynchronous error of every communicator and `collective_timeout_ms`
    /// while it waits.
    fn wait_for(&self, stream: StreamKind, what: &str) -> Result<()> {
        let event = self.host_waits[stream as usize];
        // SAFETY: our event on a live stream.
        driver_check(|| "cuEventRecord".into(), unsafe {
            cu::cuEventRecord(event, self.stream(stream))
        })?;
        let start = Instant::now();
        let mut polls = 0u32;
        loop {
            // SAFETY: our event.
            match unsafe { cu::cuEventQuery(event) } {
                cu::CUresult::CUDA_SUCCESS => return Ok(()),
                cu::CUresult::CUDA_ERROR_NOT_READY => {}
                other => {
                    return Err(driver_error(
                        &format!("cuEventQuery ({what} on the {stream:?} stream)"),
                        other,
                    ));
                }
            }
            for comm in self.comms() {
                Self::nccl_of(comm).async_error()?;
            }
            if start.elapsed() > self.timeout {
                bail!(
                    CommTimeout,
                    "{what}: the {stream:?} stream did not finish within collective_timeout_ms = {} ms (a rank may have stopped calling the collectives)",
                    self.timeout.as_millis()
                );
            }
            polls += 1;
            if polls < 1000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }

    fn gemm(&self, g: &Gemm) -> Result<()> {
        let input = match g.inputs {
            GemmInputs::Bf16 => blas::cudaDataType_t::CUDA_R_16BF,
            GemmInputs::F32 => blas::cudaDataType_t::CUDA_R_32F,
        };
        let transa = if g.transpose_a {
            blas::cublasOperation_t::CUBLAS_OP_T
        } else {
            blas::cublasOperation_t::CUBLAS_OP_N
        };
        let (one, c_type) = (blas::cublasOperation_t::CUBLAS_OP_N, blas::cudaDataType_t::CUDA_R_32F);
        let (compute, algo) = (
            blas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            blas::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
        );
        let (alpha, beta) = ((&g.alpha as *const f32).cast(), (&g.beta as *const f32).cast());
        let (call, status) = match g.matrices {
            // SAFETY: pointers into our workspace with the dimensions the translator checked
            // against its size; alpha and beta are host scalars (the default pointer mode).
            Matrices::Strided {
                a,
                stride_a,
                b,
                stride_b,
                c,
                stride_c,
            } => ("cublasGemmStridedBatchedEx", unsafe {
                blas::cublasGemmStridedBatchedEx(
                    self.blas,
                    transa,
                    one,
                    g.m,
                    g.n,
                    g.k,
                    alpha,
                    a as *const c_void,
                    input,
                    g.lda,
                    stride_a,
                    b as *const c_void,
                    input,
                    g.ldb,
                    stride_b,
                    beta,
                    c as *mut c_void,
                    c_type,
                    g.ldc,
                    stride_c,
                    g.batch,
                    compute,
                    algo,
                )
            }),
            // SAFETY: `table` holds three device arrays of `batch` pointers (written on this
            // stream before, by `muon_gemm_tile_tables`), each into our workspace.
            Matrices::Listed { table, .. } => {
                let list = |k: u64| (table + k * g.batch as u64 * 8) as *const *const c_void;
                ("cublasGemmBatchedEx", unsafe {
                    blas::cublasGemmBatchedEx(
                        self.blas,
                        transa,
                        one,
                        g.m,
                        g.n,
                        g.k,
                        alpha,
                        list(0),
                        input,
                        g.lda,
                        list(1),
                        input,
                        g.ldb,
                        beta,
                        list(2) as *const *mut c_void,
                        c_type,
                        g.ldc,
                        g.batch,
                        compute,
                        algo,
                    )
                })
            }
        };
        blas_check(&format!("{call}({}x{}x{}, batch {})", g.m, g.n, g.k, g.batch), status)
    }

    fn nccl_group(&self, which: ActionComm, calls: &[NcclCall]) -> Result<()> {
        let nccl = self.nccl_for(which);
        let (api, comm) = (nccl.api, nccl.raw);
        let stream = self.comm_stream.cast::<c_void>();
        let dtype = |t: NcclType| match t {
            NcclType::U8 => NCCL_UINT8,
            NcclType::U64 => NCCL_UINT64,
            NcclType::F64 => NCCL_FLOAT64,
            NcclType::F32 => NCCL_FLOAT32,
            NcclType::Bf16 => NCCL_BFLOAT16,
        };
        let ptr = |p: DevPtr| p as *mut c_void;
        // SAFETY: device ranges of our allocations (bounds checked by the translator), the
        // caller's live communicator, our comm stream.
        api.check("ncclGroupStart", unsafe { (api.group_start)() })?;
        let mut first_error = Ok(());
        for call in calls {
            let (name, result) = unsafe {
                match *call {
                    NcclCall::Reduce {
                        send,
                        recv,
                        count,
                        dtype: t,
                        root,
                    } => (
                        "ncclReduce",
                        (api.reduce)(
                            ptr(send),
                            ptr(recv),
                            count as usize,
                            dtype(t),
                            NCCL_SUM,
                            root as i32,
                            comm,
                            stream,
                        ),
                    ),
                    NcclCall::Broadcast {
                        send,
                        recv,
                        count,
                        dtype: t,
                        root,
                    } => (
                        "ncclBroadcast",
                        (api.broadcast)(
                            ptr(send),
                            ptr(recv),
                            count as usize,
                            dtype(t),
                            root as i32,
                            comm,
                            stream,
                        ),
                    ),
                    NcclCall::ReduceScatter {
                        send,
                        recv,
                        recv_count,
                        dtype: t,
                    } => (
                        "ncclReduceScatter",
                        (api.reduce_scatter)(
                            ptr(send),
                            ptr(recv),
                            recv_count as usize,
                            dtype(t),
                            NCCL_SUM,
                            comm,
                            stream,
                        ),
                    ),
                    NcclCall::AllGather {
                        send,
                        recv,
                        send_count,
                        dtype: t,
                    } => (
                        "ncclAllGather",
                        (api.all_gather)(ptr(send), ptr(recv), send_count as usize, dtype(t), comm, stream),
                    ),
                    NcclCall::AllReduce {
                        send,
                        recv,
                        count,
                        dtype: t,
                    } => (
                        "ncclAllReduce",
                        (api.all_reduce)(ptr(send), ptr(recv), count as usize, dtype(t), NCCL_SUM, comm, stream),
                    ),
                }
            };
            // A non-blocking communicator may answer ncclInProgress: queued, not failed.
            if first_error.is_ok() && result != NCCL_IN_PROGRESS {
                first_error = api.check(name, result);
            }
        }
        // The group is always closed, also after a failed call inside it.
        let ended = match unsafe { (api.group_end)() } {
            NCCL_IN_PROGRESS => nccl.wait_until_ready(self.timeout, "ncclGroupEnd"),
            result => api.check("ncclGroupEnd", result),
        };
        first_error.and(ended)
    }
}

impl Drop for Device {
    /// Waits (bounded by the timeout) for both streams, then destroys what the backend
    /// created: allocations, events, the comm stream, the cuBLAS handle, the modules. The
    /// caller's stream and communicator are left alone. Errors are ignored: this is teardown.
    fn drop(&mut self) {
        let Ok(_current) = self.enter() else { return };
        for stream in [StreamKind::Compute, StreamKind::Comm] {
            let created = stream == StreamKind::Compute || !self.comm_stream.is_null();
            if created && !self.host_waits[stream as usize].is_null() {
                let _ = self.wait_for(stream, "teardown");
            }
        }
        self.staging.destroy();
        self.timing.destroy();
        // SAFETY (this block): each handle was created by this backend and is released once.
        unsafe {
            for (_, (ptr, _)) in self.buffers.drain() {
                if ptr != 0 {
                    cu::cuMemFree_v2(ptr);
                }
            }
            for (_, event) in self.events.drain() {
                cu::cuEventDestroy_v2(event);
            }
            for event in self.host_waits {
                if !event.is_null() {
                    cu::cuEventDestroy_v2(event);
                }
            }
            if !self.blas.is_null() {
                blas::cublasDestroy_v2(self.blas);
            }
            if self.blas_workspace != 0 {
                cu::cuMemFree_v2(self.blas_workspace);
            }
            if !self.comm_stream.is_null() {
                cu::cuStreamDestroy_v2(self.comm_stream);
            }
        }
        self.modules.unload();
    }
}

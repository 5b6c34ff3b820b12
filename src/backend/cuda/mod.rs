//! The CUDA backend: the caller's stream and NCCL communicator, NVRTC-compiled kernels,
//! cuBLAS for the Newton–Schulz products.
//!
//! It is built in two halves. The [`translate::Translator`] turns every backend operation
//! into a list of device [`action::Action`]s (kernel launches with grids and arguments,
//! cuBLAS calls, NCCL calls, event records and waits, copies) and needs no device; the
//! [`device::Device`] executes those actions with the driver. [`CudaBackend`] is the two
//! together; [`dry_run::DryRun`] is the translator alone with virtual addresses, which lets
//! the no-GPU tests run every op of a real schedule through the CUDA translation.
//!
//! Pointer kinds: every address this backend hands out (param and grad views, MXFP8
//! storage) is a device pointer of the context current at finalize. `Backend::upload` and
//! `Backend::download` take and return host values (copied through the caller's stream).
//! `muon_param_desc_t::init_data` is a device pointer on this backend: registration copies it
//! device to device on the caller's stream ([`init_copy::DeviceInit`]); finalize casts the copy
//! into the param storage and the masters and synchronizes, then the optimizer frees it.

pub mod action;
pub mod capture;
pub mod device;
pub mod dry_run;
pub mod init_copy;
pub mod kernels;
pub mod nccl;
pub mod nvrtc;
pub mod pinned;
pub mod probe;
pub mod timing;
pub mod translate;

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;

use crate::backend::ops::{NormTerm, Op, Scalar, Span};
use crate::backend::{Backend, PeerGroup};
use crate::bail;
use crate::comm::Communicator;
use crate::config::Dtype;
use crate::error::{Error, Result, panic_text};
use crate::numerics::bf16::bf16_to_f32;
use crate::numerics::muon::MuonOptions;
use action::{Action, Buf, DevPtr};
use device::Device;
use translate::Translator;

/// The caller's `cudaStream_t`, borrowed: NULL is the legacy default stream. The library never
/// destroys it.
#[derive(Debug, Clone, Copy)]
pub struct CallerStream(pub *mut c_void);

// SAFETY: a stream handle may be used from any thread; the library uses it from one thread at a
// time (one thread per optimizer handle).
unsafe impl Send for CallerStream {}

impl CallerStream {
    /// The legacy default stream.
    pub const NULL: CallerStream = CallerStream(std::ptr::null_mut());

    pub fn is_null(self) -> bool {
        self.0.is_null()
    }
}

/// Runs translated actions: the GPU ([`Device`]) or, in tests, a stand-in.
pub trait Executor: Send {
    /// Executes `actions` in order; `Alloc` actions allocate and report their address through
    /// `bind`. Returns what the `CopyOut` actions read, in order.
    fn run(&mut self, actions: &[Action], bind: &mut dyn FnMut(Buf, DevPtr, u64)) -> Result<Vec<Vec<u8>>>;
}

impl Executor for Device {
    fn run(&mut self, actions: &[Action], bind: &mut dyn FnMut(Buf, DevPtr, u64)) -> Result<Vec<Vec<u8>>> {
        let _current = self.enter()?;
        let mut out = Vec::new();
        for action in actions {
            match *action {
                Action::Alloc { buf, bytes } => bind(buf, self.alloc(buf, bytes)?, bytes),
                ref other => self.execute(other, &mut out)?,
            }
        }
        Ok(out)
    }
}

/// One rank's cuda backend: the translator and an executor of its actions.
pub struct CudaBackend<E: Executor = Device> {
    translator: Translator,
    executor: E,
    /// The failure that made the communicator unusable, once one happened.
    broken: Option<Error>,
}

/// The single readback of an op's actions.
fn single(mut out: Vec<Vec<u8>>) -> Result<Vec<u8>> {
    match (out.pop(), out.is_empty()) {
        (Some(bytes), true) => Ok(bytes),
        _ => bail!(Internal, "expected exactly one device-to-host copy"),
    }
}

fn words(bytes: &[u8]) -> impl Iterator<Item = [u8; 8]> + '_ {
    bytes.chunks_exact(8).map(|c| {
        let mut word = [0u8; 8];
        word.copy_from_slice(c);
        word
    })
}

impl CudaBackend {
    /// A backend for `comm`'s rank on the caller's `stream`, in the CUDA context current on
    /// this thread (the framework's device). Fails with CudaUnavailable / CudaNoDevice without
    /// a usable driver, NvrtcUnavailable / KernelCompileFailed when the kernels cannot be
    /// built, CudaUnavailable without cuBLAS, CommMismatch when the communicator lives on
    /// another device. Never panics: the driver library is only entered after its presence
    /// check, and inside `catch_unwind`. With `groups.norm`, the gradient norm is summed over
    /// that communicator's ranks instead of the data-parallel group's; with `groups.tensor`,
    /// tensor-parallel shards are orthogonalized over it.
    pub fn new(
        comm: Arc<Communicator>,
        groups: Groups,
        stream: CallerStream,
        muon: MuonOptions,
        timeout: Duration,
    ) -> Result<Self> {
        probe::device_count()?;
        match catch_unwind(AssertUnwindSafe(|| Self::create(comm, groups, stream, muon, timeout))) {
            Ok(result) => result,
            Err(payload) => bail!(
                CudaError,
                "the CUDA driver binding panicked while setting up the cuda backend: {}",
                panic_text(payload.as_ref())
            ),
        }
    }

    fn create(
        comm: Arc<Communicator>,
        groups: Groups,
        stream: CallerStream,
        muon: MuonOptions,
        timeout: Duration,
    ) -> Result<Self> {
        let mut translator = Translator::new(comm.rank(), comm.size(), muon);
        let mut device = Device::new(comm, stream.0.cast(), timeout)?;
        if let Some(group) = groups.norm {
            translator = translator.with_norm_group(group.size());
            device = device.with_norm_group(group)?;
        }
        if let Some(group) = groups.tensor {
            translator = translator.with_tp_group(group.size(), group.rank());
            device = device.with_tp_group(group)?;
        }
        CudaBackend::with_executor(translator, device)
    }
}

/// The communicators of a backend beside its data-parallel one.
#[derive(Default)]
pub struct Groups {
    /// The norm group (`muon_optimizer_set_norm_group`).
    pub norm: Option<Arc<Communicator>>,
    /// The tensor-parallel group (`muon_optimizer_set_tp_group`).
    pub tensor: Option<Arc<Communicator>>,
}

impl<E: Executor> CudaBackend<E> {
    /// A backend whose `translator` decides and whose `executor` runs; runs the setup.
    pub fn with_executor(translator: Translator, executor: E) -> Result<Self> {
        let mut backend = CudaBackend {
            translator,
            executor,
            broken: None,
        };
        let setup = backend.translator.setup();
        backend.run(&setup)?;
        Ok(backend)
    }

    /// The executor (tests read an emulated device's memory through it).
    pub fn executor(&self) -> &E {
        &self.executor
    }

    /// Runs `actions`. After a failure that leaves the communicator unusable (a timeout, an
    /// NCCL error) every later call fails at once with `CommBroken`, naming it, instead of
    /// issuing collectives peers will never match.
    fn run(&mut self, actions: &[Action]) -> Result<Vec<Vec<u8>>> {
        if let Some(failure) = &self.broken {
            bail!(
                CommBroken,
                "the communicator is unusable since an earlier call failed ({:?}: {}); destroy the optimizer, then abort the communicator (ncclCommAbort; muon never aborts the caller's communicator)",
                failure.kind,
                failure.message
            );
        }
        let translator = &mut self.translator;
        let result = self
            .executor
            .run(actions, &mut |buf, ptr, bytes| translator.bind(buf, ptr, bytes));
        if let Err(err) = &result
            && err.kind.breaks_communicator()
        {
            self.broken = Some(err.clone());
        }
        result
    }

    fn op(&mut self, op: &Op) -> Result<Vec<Vec<u8>>> {
        let actions = self.translator.translate(op)?;
        self.run(&actions)
    }

    /// Every rank of the tensor-parallel group's `value`, indexed by TP rank
    /// (host-synchronizing; the agreement at finalize).
    pub fn tp_all_gather_u64(&mut self, value: u64) -> Result<Vec<u64>> {
        let actions = self.translator.tp_exchange(value)?;
        self.gathered_u64(&actions)
    }

    /// Every rank of the norm group's `value`, indexed by norm-group rank (host-synchronizing;
    /// the agreement at finalize).
    pub fn norm_all_gather_u64(&mut self, value: u64) -> Result<Vec<u64>> {
        let actions = self.translator.norm_exchange(value)?;
        self.gathered_u64(&actions)
    }

    /// Runs an exchange's actions and reads the gathered values.
    fn gathered_u64(&mut self, actions: &[Action]) -> Result<Vec<u64>> {
        let bytes = single(self.run(actions)?)?;
        Ok(words(&bytes).map(u64::from_le_bytes).collect())
    }
}

impl<E: Executor> Backend for CudaBackend<E> {
    fn execute(&mut self, op: &Op) -> Result<()> {
        self.op(op).map(drop)
    }

    fn peer_all_gather_u64(&mut self, group: PeerGroup, value: u64) -> Result<Vec<u64>> {
        match group {
            PeerGroup::Tensor => self.tp_all_gather_u64(value),
            PeerGroup::Norm => self.norm_all_gather_u64(value),
        }
    }

    fn download(&mut self, src: Span) -> Result<Vec<f32>> {
        let dtype = self.translator.dtype(src)?;
        let bytes = single(self.op(&Op::Download(src))?)?;
        Ok(match dtype {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::Bf16 => bytes
                .chunks_exact(2)
                .map(|b| bf16_to_f32(u16::from_le_bytes([b[0], b[1]])))
                .collect(),
        })
    }

    fn download_mxfp8(&mut self, param: u32, part: u8) -> Result<Vec<u8>> {
        single(self.op(&Op::DownloadMxfp8 { param, part })?)
    }

    fn read_scalars(&mut self) -> Result<[f64; Scalar::COUNT]> {
        let bytes = single(self.op(&Op::ReadScalars)?)?;
        let values: Vec<f64> = words(&bytes).map(f64::from_le_bytes).collect();
        match <[f64; Scalar::COUNT]>::try_from(values) {
            Ok(values) => Ok(values),
            Err(values) => bail!(
                Internal,
                "read_scalars: {} values, expected {}",
                values.len(),
                Scalar::COUNT
            ),
        }
    }

    /// The ranks' values are all-gathered and summed on the host in rank order, so the sum
    /// is bit-identical to the host backend's at any dp (an NCCL all-reduce would add in the
    /// order of its ring or tree).
    /// NCCL all-gather of one word per rank on the comm stream; host-synchronizing.
    fn all_gather_u64(&mut self, value: u64) -> Result<Vec<u64>> {
        let bytes = single(self.op(&Op::AllGatherU64 { value })?)?;
        Ok(words(&bytes).map(u64::from_le_bytes).collect())
    }

    fn mxfp8_addresses(&self, param: u32) -> Option<[*mut u8; 4]> {
        self.translator
            .mxfp8_addresses(param)
            .map(|parts| parts.map(|p| p as *mut u8))
    }

    fn address(&self, span: Span) -> *mut c_void {
        self.translator
            .address(span)
            .map_or(std::ptr::null_mut(), |p| p as *mut c_void)
    }

    fn norm_term(&self) -> Result<NormTerm> {
        self.translator.norm_term()
    }
}

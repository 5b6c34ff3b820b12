//! The host backend: the schedule's operations on host memory. Compute-stream operations run
//! on the calling thread; collectives run on the rank's [`HostStream`] worker over a
//! [`HostComm`]. The commands are in `executor/commands.rs`.

mod commands;
mod qk_clip;

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, PoisonError};

use crate::backend::Backend;
use crate::backend::host::comm::{Collective, HostComm, Region};
use crate::backend::host::stream::{HostEvent, HostStream};
use crate::backend::ops::{CollOp, EventId, Mem, NormSums, NormTerm, Op, Scalar, Span};
use crate::bail;
use crate::comm::{Communicator, Transport};
use crate::config::{CommMode, Dtype};
use crate::error::{Error, ErrorKind, Result};
use crate::numerics::RankNorm;
use crate::numerics::bf16::bf16_to_f32;
use crate::numerics::muon::{MuonOptions, MuonWorkspace};
use crate::numerics::mxfp8::{Input, QuantizedMut, ScaleLayout, quantize_both};

const ALIGN: usize = 64;

/// One zeroed, 64-byte aligned host allocation.
struct Storage {
    ptr: *mut u8,
    numel: usize,
    dtype: Dtype,
}

impl Storage {
    fn new(numel: u64, dtype: Dtype) -> Result<Storage> {
        let bytes = (numel as usize)
            .checked_mul(dtype.size())
            .filter(|b| *b < isize::MAX as usize);
        let Some(bytes) = bytes else {
            bail!(OutOfMemory, "host allocation of {numel} elements overflows")
        };
        if bytes == 0 {
            return Ok(Storage {
                ptr: std::ptr::null_mut(),
                numel: 0,
                dtype,
            });
        }
        let layout =
            Layout::from_size_align(bytes, ALIGN).map_err(|e| Error::new(ErrorKind::OutOfMemory, e.to_string()))?;
        // SAFETY: non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            bail!(OutOfMemory, "host allocation of {bytes} bytes failed");
        }
        Ok(Storage {
            ptr,
            numel: numel as usize,
            dtype,
        })
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            let layout = Layout::from_size_align(self.numel * self.dtype.size(), ALIGN).expect("checked at allocation");
            // SAFETY: allocated in `new` with this layout.
            unsafe { dealloc(self.ptr, layout) };
        }
    }
}

/// Persistent MXFP8 storage of one param: rowwise data, rowwise scales, columnwise data,
/// columnwise scales. Boxed slices never move, so their pointers stay valid for queued work.
struct Mxfp8Storage {
    rows: usize,
    cols: usize,
    parts: [Box<[u8]>; 4],
}

/// The destination of a queued quantize: the four parts' addresses and lengths.
struct Mxfp8Target {
    parts: [(*mut u8, usize); 4],
}

// SAFETY: the target is only written by the one queued op that owns it, while the storage
// outlives the stream (field order of `HostBackend`).
unsafe impl Send for Mxfp8Target {}

impl Mxfp8Target {
    /// # Safety
    /// No other live slice may alias the storage while the quantize runs.
    unsafe fn quantize(&self, src: &[u16], rows: usize, cols: usize, layout: ScaleLayout) -> Result<()> {
        let part = |i: usize| unsafe { std::slice::from_raw_parts_mut(self.parts[i].0, self.parts[i].1) };
        quantize_both(
            Input::Bf16(src),
            rows,
            cols,
            layout,
            QuantizedMut {
                data: part(0),
                scales: part(1),
            },
            QuantizedMut {
                data: part(2),
                scales: part(3),
            },
        )
    }
}

/// The step's scalars (the device's `Buf::Scalars` on the cuda backend).
#[derive(Debug, Default)]
struct HostScalars {
    values: [f64; Scalar::COUNT],
}

impl HostScalars {
    fn get(&self, s: Scalar) -> f64 {
        self.values[s.slot()]
    }

    fn f32(&self, s: Scalar) -> f32 {
        self.get(s) as f32
    }
}

/// One rank's host backend.
pub struct HostBackend {
    // Field order matters: the stream (and the closures it holds) is dropped before memory.
    stream: HostStream,
    comm: Arc<Communicator>,
    events: Vec<HostEvent>,
    mems: HashMap<Mem, Storage>,
    mxfp8: HashMap<u32, Mxfp8Storage>,
    mxfp8_layout: ScaleLayout,
    muon_opts: MuonOptions,
    workspace: MuonWorkspace,
    /// Threads of this rank's matrix products.
    threads: usize,
    scratch: Vec<f32>,
    scalars: Arc<Mutex<HostScalars>>,
    /// This rank's part of the norm: its Σ g² and its steps (the device's words after
    /// `muon_norm_partials` and the copy of its step slot).
    own_sum: Arc<Mutex<RankNorm>>,
    /// Every rank's Σ g², which the comm stream gathers and the compute stream (of this
    /// backend, or of another optimizer's sharing the clip) reads after an event.
    rank_sums: Arc<Mutex<Vec<RankNorm>>>,
    /// The group whose ranks' Σ g² make the global norm (the data-parallel group when None).
    norm_group: Option<Arc<Communicator>>,
    /// The tensor-parallel group TP shards are orthogonalized over (duplicated or distributed).
    tp_group: Option<Arc<Communicator>>,
}

// SAFETY: the raw pointers in `mems` are owned allocations only touched by this backend's
// calls and by its own stream worker under the event ordering of the schedule.
unsafe impl Send for HostBackend {}

impl HostBackend {
    /// A backend for `comm`'s rank with the Muon options of the config.
    pub fn new(comm: Arc<Communicator>, mode: CommMode, muon_opts: MuonOptions) -> Result<Self> {
        if !matches!(comm.transport, Transport::Host(_)) {
            bail!(CommMismatch, "the host backend needs a host group communicator");
        }
        Ok(HostBackend {
            stream: HostStream::new(mode)?,
            comm,
            events: Vec::new(),
            mems: HashMap::new(),
            mxfp8: HashMap::new(),
            mxfp8_layout: ScaleLayout::Compact,
            muon_opts,
            workspace: MuonWorkspace::default(),
            threads: 1,
            scratch: Vec::new(),
            scalars: Arc::default(),
            own_sum: Arc::default(),
            rank_sums: Arc::default(),
            norm_group: None,
            tp_group: None,
        })
    }

    /// Runs this rank's matrix products on `threads` threads (1, the calling thread, unless
    /// set; the optimizer passes `Config::host_threads_for` its group size).
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads.max(1);
        self
    }

    /// Sums the gradient norm over `group` (a host group spanning this rank's data-parallel
    /// group) instead of the data-parallel group alone.
    pub fn with_norm_group(mut self, group: Arc<Communicator>) -> Result<Self> {
        if !matches!(group.transport, Transport::Host(_)) {
            bail!(
                CommMismatch,
                "norm group: the host backend needs a host group communicator"
            );
        }
        self.norm_group = Some(group);
        Ok(self)
    }

    /// Orthogonalizes tensor-parallel shards over `group` (this rank's TP group:
    /// the ranks holding the other shards of its matrices, at the same data-parallel index).
    pub fn with_tp_group(mut self, group: Arc<Communicator>) -> Result<Self> {
        if !matches!(group.transport, Transport::Host(_)) {
            bail!(
                CommMismatch,
                "tp group: the host backend needs a host group communicator"
            );
        }
        self.tp_group = Some(group);
        Ok(self)
    }

    /// All-gathers `shard` over the TP group on the calling (compute) thread: every rank's
    /// values in rank order.
    fn gather_tp(group: &Communicator, shard: &[f32]) -> Result<Vec<f32>> {
        let mut send = shard.to_vec();
        let mut gathered = vec![0.0f32; shard.len() * group.size()];
        // SAFETY: both buffers live until the collective returns.
        let (send_region, recv_region) = unsafe { (Region::from_f32(&mut send), Region::from_f32(&mut gathered)) };
        Self::host_comm(group).all_gather(send_region, recv_region)?;
        Ok(gathered)
    }

    fn scalars(&self) -> std::sync::MutexGuard<'_, HostScalars> {
        self.scalars.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn host_comm(comm: &Communicator) -> &HostComm {
        match &comm.transport {
            Transport::Host(host) => host,
            Transport::Nccl(_) => unreachable!("checked in HostBackend::new"),
        }
    }

    /// The first byte of `span` and the dtype its elements have, bounds-checked. A staging
    /// span views its grad buffer's bytes as bf16.
    fn resolve(&self, span: Span) -> Result<(*mut u8, Dtype)> {
        let (key, dtype) = match span.mem {
            Mem::Staging(i) => (Mem::Grad(i), Some(Dtype::Bf16)),
            other => (other, None),
        };
        let Some(storage) = self.mems.get(&key) else {
            bail!(Internal, "{:?} is not allocated", span.mem)
        };
        let dtype = dtype.unwrap_or(storage.dtype);
        let capacity = (storage.numel * storage.dtype.size() / dtype.size()) as u64;
        if span.start + span.len > capacity {
            bail!(Internal, "span {span:?} exceeds its allocation of {capacity} elements");
        }
        // SAFETY: inside the allocation (checked above).
        Ok((unsafe { storage.ptr.add(span.start as usize * dtype.size()) }, dtype))
    }

    fn region(&self, span: Span) -> Result<Region> {
        let (ptr, dtype) = self.resolve(span)?;
        // SAFETY: inside a live allocation that outlives the stream's queued work (field order).
        Ok(unsafe { Region::new(ptr, span.len as usize, dtype) })
    }

    /// # Safety
    /// No other live slice may alias `span` while the returned slice is used.
    // The storage is raw memory owned through pointers, not through `self`'s fields, so a
    // mutable view from `&self` aliases nothing Rust tracks.
    #[allow(clippy::mut_from_ref)]
    unsafe fn f32s(&self, span: Span) -> Result<&mut [f32]> {
        let (ptr, dtype) = self.resolve(span)?;
        if dtype != Dtype::F32 {
            bail!(Internal, "{:?} is not f32", span.mem);
        }
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr.cast::<f32>(), span.len as usize) })
    }

    /// # Safety
    /// As for [`HostBackend::f32s`].
    #[allow(clippy::mut_from_ref)]
    unsafe fn u16s(&self, span: Span) -> Result<&mut [u16]> {
        let (ptr, dtype) = self.resolve(span)?;
        if dtype != Dtype::Bf16 {
            bail!(Internal, "{:?} is not bf16", span.mem);
        }
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr.cast::<u16>(), span.len as usize) })
    }

    /// `span` as f32 values: borrowed when f32, converted into `scratch` when bf16.
    fn read_as_f32<'a>(&'a self, span: Span, scratch: &'a mut Vec<f32>) -> Result<&'a [f32]> {
        match self.resolve(span)?.1 {
            Dtype::F32 => Ok(unsafe { self.f32s(span) }?),
            Dtype::Bf16 => {
                scratch.clear();
                scratch.extend(unsafe { self.u16s(span) }?.iter().map(|&b| bf16_to_f32(b)));
                Ok(scratch)
            }
        }
    }

    fn event(&mut self, event: EventId) -> &HostEvent {
        if self.events.len() <= event.0 {
            self.events.resize_with(event.0 + 1, HostEvent::new);
        }
        &self.events[event.0]
    }

    fn to_collective(&self, op: &CollOp) -> Result<Collective> {
        let rank = self.comm.rank();
        let dp = self.comm.size() as u64;
        Ok(match *op {
            CollOp::Reduce { root, span } => {
                let r = self.region(span)?;
                Collective::Reduce {
                    root: root as usize,
                    send: r,
                    recv: r,
                }
            }
            CollOp::Broadcast { root, span } => Collective::Broadcast {
                root: root as usize,
                buf: self.region(span)?,
            },
            CollOp::ReduceScatter { span } => {
                let whole = self.region(span)?;
                let chunk = span.len / dp;
                Collective::ReduceScatter {
                    send: whole,
                    recv: whole.sub(rank * chunk as usize, chunk as usize)?,
                }
            }
            CollOp::AllGather { span } => {
                let whole = self.region(span)?;
                let chunk = span.len / dp;
                Collective::AllGather {
                    send: whole.sub(rank * chunk as usize, chunk as usize)?,
                    recv: whole,
                }
            }
            CollOp::AllReduce { span } => {
                let r = self.region(span)?;
                Collective::AllReduce { send: r, recv: r }
            }
        })
    }
}

impl Backend for HostBackend {
    fn execute(&mut self, op: &Op) -> Result<()> {
        self.run_command(op)
    }

    fn download(&mut self, src: Span) -> Result<Vec<f32>> {
        let mut scratch = Vec::new();
        Ok(self.read_as_f32(src, &mut scratch)?.to_vec())
    }

    fn read_scalars(&mut self) -> Result<[f64; Scalar::COUNT]> {
        Ok(self.scalars().values)
    }

    fn all_gather_u64(&mut self, value: u64) -> Result<Vec<u64>> {
        let result = Arc::new(Mutex::new(None));
        let (comm, slot) = (self.comm.clone(), result.clone());
        self.stream.enqueue(move || {
            let values = Self::host_comm(&comm).all_gather_u64(value)?;
            *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(values);
            Ok(())
        })?;
        self.stream.synchronize()?;
        let values = result.lock().unwrap_or_else(PoisonError::into_inner).take();
        values.ok_or_else(|| Error::new(ErrorKind::Internal, "all_gather_u64: no result after synchronize"))
    }

    fn mxfp8_addresses(&self, param: u32) -> Option<[*mut u8; 4]> {
        let storage = self.mxfp8.get(&param)?;
        Some(storage.parts.each_ref().map(|p| p.as_ptr().cast_mut()))
    }

    fn download_mxfp8(&mut self, param: u32, part: u8) -> Result<Vec<u8>> {
        match self.mxfp8.get(&param).and_then(|s| s.parts.get(part as usize)) {
            Some(bytes) => Ok(bytes.to_vec()),
            None => bail!(Internal, "param {param} has no MXFP8 storage part {part}"),
        }
    }

    fn address(&self, span: Span) -> *mut c_void {
        self.region(span).map_or(std::ptr::null_mut(), |r| r.as_ptr().cast())
    }

    fn norm_term(&self) -> Result<NormTerm> {
        Ok(NormTerm {
            ranks: self.norm_group.as_ref().unwrap_or(&self.comm).size(),
            sums: NormSums::Host(self.rank_sums.clone()),
        })
    }
}

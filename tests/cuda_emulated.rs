//! The cuda backend's translation, executed on a CPU emulation of the device, against the
//! host backend — without a GPU.
//!
//! The emulated device runs every action of the translator: copies and memsets on a byte
//! arena at the translator's (virtual) addresses, each kernel of `kernels/*.cu` re-stated in
//! Rust line for line (the same thread partition and reduction trees for the sums of squares),
//! cuBLAS's column-major strided-batched GEMM, and NCCL for one rank. This checks what the
//! translator decides — pointers, offsets, dtype flags, kernel arguments, the Newton–Schulz
//! sequence with its transposes, ping-pong buffers and batches, the GEMM parameters in
//! column-major form, the packed reduction structs — by comparing whole optimizer runs with
//! the host backend: element-wise results bit for bit, Newton–Schulz within tolerance. What it
//! cannot check is the CUDA code itself (that takes a GPU: `--features gpu-tests`).

mod support;

use std::time::Duration;

use muon_opt::backend::Backend;
use muon_opt::backend::cuda::action::{
    Action, Arg, Buf, DevPtr, Gemm, GemmInputs, Kernel, Launch, Matrices, NcclCall, NcclComm, NcclType,
};
use muon_opt::backend::cuda::translate::Translator;
use muon_opt::backend::cuda::{CudaBackend, Executor};
use muon_opt::backend::host::comm::{HostComm, HostGroup, Region};
use muon_opt::backend::ops::{Mem, Scalar, StreamKind};
use muon_opt::comm::{Communicator, Transport};
use muon_opt::config::{CommMode, Config, Dtype, MuonLayout, NsPrecision};
use muon_opt::error::{ErrorKind, Result};
use muon_opt::model::ParamSpec;
use muon_opt::numerics::bf16::{bf16_to_f32, f32_to_bf16_rne};
use muon_opt::numerics::gemm::{Output, Strides, SymmetricTiles, gemm};
use muon_opt::numerics::muon::MuonOptions;
use muon_opt::numerics::mxfp8::{Input, QuantizedMut, ScaleLayout, quantize_both};
use support::cuda::{cuda_model, elementwise_script, host_backend, iterate, runtime};
use support::ranks::on_ranks;
use support::training::bits;

/// First emulated device address (allocations follow, 512-byte aligned).
const BASE: DevPtr = 1 << 40;
const THREADS: usize = 256;
/// Tile of the symmetric products in the runs compared with the host: the test matrices
/// (order up to 64) are 2 to 4 tiles a side.
const SMALL_TILE: u32 = 16;

/// A CPU stand-in for one GPU with a one-rank communicator and, when given, a tensor-parallel
/// group whose all-gathers run over a host group (one emulator per TP rank, on threads).
struct Emulator {
    mem: Vec<u8>,
    tp: Option<HostComm>,
}

fn word(args: &[Arg], i: usize) -> u64 {
    match args[i] {
        Arg::Ptr(v) | Arg::U64(v) => v,
        Arg::U32(v) => u64::from(v),
        Arg::I32(v) => v as u32 as u64,
        ref other => panic!("argument {i} is {other:?}, not an integer"),
    }
}

fn float(args: &[Arg], i: usize) -> f32 {
    match args[i] {
        Arg::F32(v) => v,
        ref other => panic!("argument {i} is {other:?}, not f32"),
    }
}

fn words(args: &[Arg], i: usize) -> &[u64] {
    match &args[i] {
        Arg::Words(w) => w,
        other => panic!("argument {i} is {other:?}, not a struct"),
    }
}

/// `lanes[0] = Σ lanes` by the kernels' tree (`muon_block_sum`).
fn block_sum(lanes: &mut [f64; THREADS]) -> f64 {
    let mut width = THREADS / 2;
    while width > 0 {
        for t in 0..width {
            lanes[t] += lanes[t + width];
        }
        width /= 2;
    }
    lanes[0]
}

/// The cuda backend (its real translator and Backend glue) over the emulated device.
fn emulated_backend(muon: MuonOptions) -> CudaBackend<Emulator> {
    CudaBackend::with_executor(
        Translator::new(0, 1, muon),
        Emulator {
            mem: Vec::new(),
            tp: None,
        },
    )
    .unwrap()
}

impl Emulator {
    fn at(&self, ptr: DevPtr, bytes: usize) -> std::ops::Range<usize> {
        let start = (ptr - BASE) as usize;
        assert!(
            ptr >= BASE && start + bytes <= self.mem.len(),
            "access outside the arena"
        );
        start..start + bytes
    }
    fn ld_f32(&self, ptr: DevPtr) -> f32 {
        f32::from_le_bytes(self.mem[self.at(ptr, 4)].try_into().unwrap())
    }
    fn st_f32(&mut self, ptr: DevPtr, v: f32) {
        let r = self.at(ptr, 4);
        self.mem[r].copy_from_slice(&v.to_le_bytes());
    }
    fn ld_u16(&self, ptr: DevPtr) -> u16 {
        u16::from_le_bytes(self.mem[self.at(ptr, 2)].try_into().unwrap())
    }
    fn st_u16(&mut self, ptr: DevPtr, v: u16) {
        let r = self.at(ptr, 2);
        self.mem[r].copy_from_slice(&v.to_le_bytes());
    }
    fn ld_f64(&self, ptr: DevPtr) -> f64 {
        f64::from_le_bytes(self.mem[self.at(ptr, 8)].try_into().unwrap())
    }
    fn ld_u64(&self, ptr: DevPtr) -> u64 {
        u64::from_le_bytes(self.mem[self.at(ptr, 8)].try_into().unwrap())
    }
    fn st_u64(&mut self, ptr: DevPtr, v: u64) {
        let r = self.at(ptr, 8);
        self.mem[r].copy_from_slice(&v.to_le_bytes());
    }
    fn st_f64(&mut self, ptr: DevPtr, v: f64) {
        let r = self.at(ptr, 8);
        self.mem[r].copy_from_slice(&v.to_le_bytes());
    }
    /// `muon_load`: element `i` of an f32 or bf16 buffer as f32.
    fn load(&self, ptr: DevPtr, bf16: bool, i: u64) -> f32 {
        if bf16 {
            bf16_to_f32(self.ld_u16(ptr + 2 * i))
        } else {
            self.ld_f32(ptr + 4 * i)
        }
    }
    /// `muon_store`.
    fn store(&mut self, ptr: DevPtr, bf16: bool, i: u64, v: f32) {
        if bf16 {
            self.st_u16(ptr + 2 * i, f32_to_bf16_rne(v));
        } else {
            self.st_f32(ptr + 4 * i, v);
        }
    }
    fn copy(&mut self, dst: DevPtr, src: DevPtr, bytes: usize) {
        let (s, d) = (self.at(src, bytes), self.at(dst, bytes));
        self.mem.copy_within(s, d.start);
    }

    fn execute(&mut self, actions: &[Action], bind: &mut dyn FnMut(Buf, DevPtr, u64)) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for action in actions {
            match action {
                Action::Alloc { buf, bytes } => {
                    let ptr = if *bytes == 0 {
                        0
                    } else {
                        let ptr = BASE + self.mem.len() as u64;
                        self.mem
                            .resize(self.mem.len() + bytes.next_multiple_of(512) as usize, 0);
                        ptr
                    };
                    bind(*buf, ptr, *bytes);
                }
                Action::CopyIn { dst, bytes, .. } | Action::CopyInAsync { dst, bytes, .. } => {
                    let r = self.at(*dst, bytes.len());
                    self.mem[r].copy_from_slice(bytes);
                }
                Action::CopyOut { src, bytes, .. } => out.push(self.mem[self.at(*src, *bytes as usize)].to_vec()),
                Action::Zero { dst, bytes, .. } => {
                    if *bytes > 0 {
                        let r = self.at(*dst, *bytes as usize);
                        self.mem[r].fill(0);
                    }
                }
                Action::CopyDevice { dst, src, bytes, .. } => {
                    if *bytes > 0 {
                        self.copy(*dst, *src, *bytes as usize);
                    }
                }
                Action::CopyDevice2D {
                    dst,
                    dst_pitch,
                    src,
                    src_pitch,
                    width,
                    height,
                    ..
                } => {
                    for row in 0..*height {
                        self.copy(dst + row * dst_pitch, src + row * src_pitch, *width as usize);
                    }
                }
                Action::Launch(launch) => self.launch(launch),
                Action::Gemm(gemm) => self.gemm(gemm),
                Action::Nccl(NcclComm::Tensor, calls) => calls.iter().for_each(|c| self.tp_collective(c)),
                Action::Nccl(_, calls) => calls.iter().for_each(|c| self.nccl(c)),
                Action::Record { .. } | Action::Wait { .. } | Action::Synchronize(_) => {}
            }
        }
        out
    }

    /// One rank: every collective is the identity, except that a copy from `send` to a
    /// different `recv` still moves the rank's own chunk.
    /// A collective over the tensor-parallel host group: an f32 all-gather, or an f32 or f64
    /// all-reduce summing in rank order (NCCL's sum for two ranks, whose order does not matter).
    fn tp_collective(&mut self, call: &NcclCall) {
        let group = self.tp.as_ref().expect("a TP collective needs the emulator's TP group");
        match *call {
            NcclCall::AllGather {
                send,
                recv,
                send_count,
                dtype: NcclType::F32,
            } => {
                let mut shard: Vec<f32> = (0..send_count).map(|i| self.ld_f32(send + 4 * i)).collect();
                let mut gathered = vec![0.0f32; send_count as usize * group.size()];
                // SAFETY: both buffers outlive the collective.
                let (send_region, recv_region) =
                    unsafe { (Region::from_f32(&mut shard), Region::from_f32(&mut gathered)) };
                group.all_gather(send_region, recv_region).unwrap();
                for (i, v) in gathered.into_iter().enumerate() {
                    self.st_f32(recv + 4 * i as u64, v);
                }
            }
            NcclCall::AllReduce {
                send,
                recv,
                count,
                dtype: NcclType::F32,
            } => {
                let mut values: Vec<f32> = (0..count).map(|i| self.ld_f32(send + 4 * i)).collect();
                // SAFETY: the buffer outlives the collective.
                group.all_reduce(unsafe { Region::from_f32(&mut values) }).unwrap();
                for (i, v) in values.into_iter().enumerate() {
                    self.st_f32(recv + 4 * i as u64, v);
                }
            }
            NcclCall::AllReduce {
                send,
                recv,
                count,
                dtype: NcclType::F64,
            } => {
                for i in 0..count {
                    let all = group.all_gather_u64(self.ld_f64(send + 8 * i).to_bits()).unwrap();
                    let sum = all
                        .iter()
                        .skip(1)
                        .fold(f64::from_bits(all[0]), |acc, &b| acc + f64::from_bits(b));
                    let r = self.at(recv + 8 * i, 8);
                    self.mem[r].copy_from_slice(&sum.to_le_bytes());
                }
            }
            ref other => panic!("the TP group runs f32 all-gathers and f32/f64 all-reduces, got {other:?}"),
        }
    }

    fn nccl(&mut self, call: &NcclCall) {
        let size = |t: NcclType| match t {
            NcclType::U8 => 1,
            NcclType::F64 => 8,
            NcclType::F32 => 4,
            NcclType::Bf16 => 2,
        };
        let (send, recv, count, dtype) = match *call {
            NcclCall::Reduce {
                send,
                recv,
                count,
                dtype,
                root,
            }
            | NcclCall::Broadcast {
                send,
                recv,
                count,
                dtype,
                root,
            } => {
                assert_eq!(root, 0);
                (send, recv, count, dtype)
            }
            NcclCall::ReduceScatter {
                send,
                recv,
                recv_count: count,
                dtype,
            }
            | NcclCall::AllGather {
                send,
                recv,
                send_count: count,
                dtype,
            }
            | NcclCall::AllReduce {
                send,
                recv,
                count,
                dtype,
            } => (send, recv, count, dtype),
        };
        if send != recv && count > 0 {
            self.copy(recv, send, count as usize * size(dtype));
        }
    }

    /// `cublasGemmStridedBatchedEx` or `cublasGemmBatchedEx` (the lists read from emulated
    /// memory) with `CUBLAS_OP_N` for B, column-major: each product is handed to
    /// `numerics::gemm::gemm` (the host backend's GEMM) as the row-major product it stands
    /// for, so a correct translation reproduces the host's products bit for bit.
    fn gemm(&mut self, g: &Gemm) {
        let bf16 = g.inputs == GemmInputs::Bf16;
        let elem = if bf16 { 2 } else { 4 };
        let (m, n, k) = (g.m as usize, g.n as usize, g.k as usize);
        let (lda, ldb, ldc) = (g.lda as usize, g.ldb as usize, g.ldc as usize);
        let read = |emu: &Self, ptr: DevPtr, len: usize, bf16: bool| -> Vec<f32> {
            (0..len as u64).map(|i| emu.load(ptr, bf16, i)).collect()
        };
        for batch in 0..g.batch as u64 {
            let [a_ptr, b_ptr, c_ptr] = match g.matrices {
                Matrices::Strided {
                    a,
                    stride_a,
                    b,
                    stride_b,
                    c,
                    stride_c,
                } => [
                    a + batch * stride_a as u64 * elem,
                    b + batch * stride_b as u64 * elem,
                    c + batch * stride_c as u64 * 4,
                ],
                Matrices::Listed { table, .. } => {
                    [0, 1, 2].map(|list| self.ld_u64(table + (list * g.batch as u64 + batch) * 8))
                }
            };
            let a_len = if g.transpose_a {
                (m - 1) * lda + k
            } else {
                (k - 1) * lda + m
            };
            let a = read(self, a_ptr, a_len, bf16);
            let b = read(self, b_ptr, (n - 1) * ldb + k, bf16);
            let mut c = read(self, c_ptr, (n - 1) * ldc + m, false);
            let a_shape = if g.transpose_a {
                Strides::column_major(k, m, lda).transposed()
            } else {
                Strides::column_major(m, k, lda)
            };
            let (b_shape, c_shape) = (Strides::column_major(k, n, ldb), Strides::column_major(m, n, ldc));
            // The column-major `C = op(A)·B` is the row-major `Cᵀ = Bᵀ·op(A)ᵀ` the host asked
            // for; computed in that form. A symmetric product arrives as its tiles (each one
            // such GEMM), then `muon_ns_symmetrize` fills the upper triangle, as the host does.
            gemm(
                g.alpha,
                (&b, b_shape.transposed()),
                (&a, a_shape.transposed()),
                g.beta,
                (&mut c, c_shape.transposed()),
                Output::Full,
                1,
            );
            // Only the elements of the `m × n` product: a tile's C is a window of a larger
            // matrix whose other elements belong to other tiles.
            for col in 0..n {
                for row in 0..m {
                    let i = col * ldc + row;
                    self.st_f32(c_ptr + 4 * i as u64, c[i]);
                }
            }
        }
    }

    fn launch(&mut self, launch: &Launch) {
        let a = &launch.args;
        let n = |i| word(a, i);
        match launch.kernel {
            Kernel::CastF32ToBf16 => {
                for i in 0..n(2) {
                    let v = self.ld_f32(n(0) + 4 * i);
                    self.st_u16(n(1) + 2 * i, f32_to_bf16_rne(v));
                }
            }
            Kernel::Cast => {
                for i in 0..n(4) {
                    let v = self.load(n(0), n(1) != 0, i);
                    self.store(n(2), n(3) != 0, i, v);
                }
            }
            Kernel::SumsqPartials => self.sumsq_partials(words(a, 0), n(1), launch.grid[0]),
            Kernel::SumsqFinish => {
                let groups = words(a, 0);
                let (partials, out) = (n(1), n(2));
                for g in 0..launch.grid[0] as usize {
                    let (first, count) = (groups[2 * g] as u32 as u64, groups[2 * g] >> 32);
                    let (slot, accumulate) = (groups[2 * g + 1] as u32 as u64, groups[2 * g + 1] >> 32 != 0);
                    let mut lanes = [0.0f64; THREADS];
                    for (t, lane) in lanes.iter_mut().enumerate() {
                        let mut i = t as u64;
                        while i < count {
                            *lane += self.ld_f64(partials + 8 * (first + i));
                            i += THREADS as u64;
                        }
                    }
                    let sum = block_sum(&mut lanes);
                    let start = if accumulate { self.ld_f64(out + 8 * slot) } else { 0.0 };
                    self.st_f64(out + 8 * slot, start + sum);
                }
            }
            Kernel::MuonMomentum => {
                if self.skipped(n(7)) {
                    return;
                }
                let (mu, one_minus_mu, clip) = (float(a, 5), float(a, 6), self.scalar(n(7), Scalar::GradScale));
                for i in 0..n(4) {
                    let g = self.load(n(0), n(1) != 0, i) * clip;
                    let m = mu * self.ld_f32(n(2) + 4 * i) + one_minus_mu * g;
                    self.st_f32(n(2) + 4 * i, m);
                    if n(3) != n(2) {
                        self.st_f32(n(3) + 4 * i, if n(8) != 0 { g + mu * (m - g) } else { m });
                    }
                }
            }
            Kernel::NsNormalize => {
                let (u, x, sumsq) = (n(0), n(1), n(2));
                let (batch, rows, cols, transpose, eps) = (n(3), n(4), n(5), n(6) != 0, float(a, 7));
                let size = rows * cols;
                for e in 0..batch * size {
                    let (k, within) = (e / size, e % size);
                    let (r, c) = (within / cols, within % cols);
                    let norm = (self.ld_f64(sumsq + 8 * k).sqrt() as f32).max(eps);
                    let at = if transpose { k * size + c * rows + r } else { e };
                    let v = self.ld_f32(u + 4 * e) / norm;
                    self.st_f32(x + 4 * at, v);
                }
            }
            Kernel::NsSymmetrize => {
                let (src, dst, to_bf16, batch, m) = (n(0), n(1), n(2) != 0, n(3), n(4));
                for e in 0..batch * m * m {
                    let (k, i, j) = (e / (m * m), e % (m * m) / m, e % m);
                    let v = self.ld_f32(src + 4 * (k * m * m + i.max(j) * m + i.min(j)));
                    if to_bf16 {
                        self.store(dst, true, e, v);
                    } else if i < j {
                        self.st_f32(dst + 4 * e, v);
                    }
                }
            }
            Kernel::GemmTileTables => {
                // `struct muon_tile_lists`: 12 lists of 13 words, then count | rows << 32, entries.
                let w = words(a, 0);
                let header = w.len() - 2;
                let (count, rows, entries) = (w[header] & 0xffff_ffff, w[header] >> 32, w[header + 1]);
                let tiles = SymmetricTiles {
                    rows: rows as usize,
                    size: 0,
                };
                let (positions, per_matrix): (Vec<_>, u64) = (tiles.positions().collect(), tiles.count() as u64);
                for l in 0..count as usize {
                    let list = &w[l * 13..(l + 1) * 13];
                    for q in 0..entries {
                        let (matrix, (i, j)) = (q / per_matrix, positions[(q % per_matrix) as usize]);
                        let (i, j) = (i as u64, j as u64);
                        for o in 0..3 {
                            let [base, stride, row, col] = [1, 2, 3, 4].map(|x| list[4 * o + x]);
                            let at = list[0] + (o as u64 * entries + q) * 8;
                            self.st_u64(at, base + matrix * stride + i * row + j * col);
                        }
                    }
                }
            }
            Kernel::NsAddIdentity => {
                let (src, dst, shift, batch, m) = (n(0), n(1), float(a, 2), n(3), n(4));
                for e in 0..batch * m * m {
                    let v = self.ld_f32(src + 4 * e);
                    let within = e % (m * m);
                    self.st_f32(dst + 4 * e, if within / m == within % m { v + shift } else { v });
                }
            }
            Kernel::MuonApply => {
                let (w, x) = (n(0), n(1));
                let (batch, rows, cols, transposed, ld) = (n(2), n(3), n(4), n(5) != 0, n(6));
                if self.skipped(n(7)) {
                    return;
                }
                let lr_eff = self.scalar(n(7), Scalar::Lr) * float(a, 8);
                let wd_eff = self.scalar(n(7), Scalar::WeightDecay) * float(a, 9);
                let (decay, step) = (1.0 - lr_eff * wd_eff, lr_eff * float(a, 10));
                let size = rows * cols;
                for e in 0..batch * size {
                    let (k, within) = (e / size, e % size);
                    let (r, c) = (within / cols, within % cols);
                    let at = if transposed {
                        k * size + c * ld + r
                    } else {
                        k * size + r * ld + c
                    };
                    let v = self.ld_f32(w + 4 * e) * decay - step * self.ld_f32(x + 4 * at);
                    self.st_f32(w + 4 * e, v);
                }
            }
            Kernel::Adamw => {
                let [b1, b2, omb1, omb2, eps, lr_scale, wd_scale] = std::array::from_fn(|i| float(a, 6 + i));
                let scalars = n(13);
                if self.skipped(scalars) {
                    return;
                }
                let clip = self.scalar(scalars, Scalar::GradScale);
                let (bc1, bc2) = (self.scalar(scalars, Scalar::Bc1), self.scalar(scalars, Scalar::Bc2));
                let lr = self.scalar(scalars, Scalar::AdamLr) * lr_scale;
                let decay = 1.0 - lr * (self.scalar(scalars, Scalar::AdamWeightDecay) * wd_scale);
                let (w, m, v) = (n(0), n(1), n(2));
                for i in 0..n(5) {
                    let g = self.load(n(3), n(4) != 0, i) * clip;
                    let mi = b1 * self.ld_f32(m + 4 * i) + omb1 * g;
                    let vi = b2 * self.ld_f32(v + 4 * i) + omb2 * g * g;
                    self.st_f32(m + 4 * i, mi);
                    self.st_f32(v + 4 * i, vi);
                    let (mhat, vhat) = (mi / bc1, vi / bc2);
                    let wi = self.ld_f32(w + 4 * i) * decay - lr * mhat / (vhat.sqrt() + eps);
                    self.st_f32(w + 4 * i, wi);
                }
            }
            Kernel::QkClip => {
                for (ptr, v) in support::qk_clip::emulate(a, |p| self.ld_f32(p)) {
                    self.st_f32(ptr, v);
                }
            }
            Kernel::StepScalars => {
                let Arg::Words(terms) = &a[1] else {
                    panic!("muon_step_scalars: argument 1 is {:?}", a[1])
                };
                self.step_scalars(n(0), terms, n(2), [float(a, 3), float(a, 4), float(a, 5)])
            }
            Kernel::Mxfp8Quantize => {
                let (rows, cols) = (n(1) as usize, n(2) as usize);
                let input: Vec<u16> = (0..(rows * cols) as u64).map(|i| self.ld_u16(n(0) + 2 * i)).collect();
                let layout = if n(7) != 0 {
                    ScaleLayout::Swizzled
                } else {
                    ScaleLayout::Compact
                };
                let mut parts: Vec<Vec<u8>> = part_sizes(rows, cols).iter().map(|&len| vec![0u8; len]).collect();
                let [d0, s0, d1, s1] = parts.get_disjoint_mut([0, 1, 2, 3]).unwrap();
                quantize_both(
                    Input::Bf16(&input),
                    rows,
                    cols,
                    layout,
                    QuantizedMut { data: d0, scales: s0 },
                    QuantizedMut { data: d1, scales: s1 },
                )
                .unwrap();
                for (part, bytes) in parts.iter().enumerate() {
                    let r = self.at(n(3 + part), bytes.len());
                    self.mem[r].copy_from_slice(bytes);
                }
            }
        }
    }

    /// `muon_sumsq_partials`: block b strides over its span with 256 threads, then the tree.
    fn sumsq_partials(&mut self, spans: &[u64], partials: DevPtr, grid: u32) {
        let count = spans[32 * 3] as usize;
        let span = |s: usize| {
            (
                spans[3 * s],
                spans[3 * s + 1],
                spans[3 * s + 2] & 1 != 0,
                (spans[3 * s + 2] >> 32) as u32,
                spans[3 * s + 2] & 2 != 0,
            )
        };
        for block in 0..grid {
            let mut s = 0;
            while s + 1 < count && span(s + 1).3 <= block {
                s += 1;
            }
            let (ptr, len, bf16, first, check_only) = span(s);
            let end = if s + 1 < count { span(s + 1).3 } else { grid };
            let stride = u64::from(end - first) * THREADS as u64;
            let mut lanes = [0.0f64; THREADS];
            for (t, lane) in lanes.iter_mut().enumerate() {
                let mut i = u64::from(block - first) * THREADS as u64 + t as u64;
                while i < len {
                    let v = f64::from(self.load(ptr, bf16, i));
                    let square = v * v;
                    *lane += if check_only { 0.0 * square } else { square };
                    i += stride;
                }
            }
            let sum = block_sum(&mut lanes);
            self.st_f64(partials + 8 * u64::from(block), sum);
        }
    }

    /// An f32 scalar of the step (`muon_scalar`).
    fn scalar(&self, scalars: DevPtr, s: Scalar) -> f32 {
        self.ld_f64(scalars + 8 * s.slot() as u64) as f32
    }

    /// `muon_step_skipped`.
    fn skipped(&self, scalars: DevPtr) -> bool {
        self.ld_f64(scalars + 8 * Scalar::Skip.slot() as u64) != 0.0
    }

    /// `muon_term_squared_norm` of `kernels/step.cu`: term k of `struct muon_norm_terms`.
    fn term_squared_norm(&self, terms: &[u64], k: usize) -> f64 {
        let half = |word: u64, k: usize| (word >> (32 * (k % 2))) & 0xFFFF_FFFF;
        let (sums, ranks, dp) = (terms[k], half(terms[8 + k / 2], k), half(terms[12 + k / 2], k));
        let mut summed = self.ld_f64(sums);
        for r in 1..ranks {
            summed += self.ld_f64(sums + 8 * r);
        }
        summed / (dp as f64 * dp as f64)
    }

    /// `muon_step_scalars` of `kernels/step.cu`, statement for statement.
    fn step_scalars(&mut self, scalars: DevPtr, terms: &[u64], dp: u64, [clip_grad, beta1, beta2]: [f32; 3]) {
        let mut total = self.term_squared_norm(terms, 0);
        for k in 1..terms[16] as usize {
            total += self.term_squared_norm(terms, k);
        }
        let skipped = !total.is_finite();
        let mut clip_coef = 1.0f32;
        if !skipped && clip_grad != 0.0 {
            clip_coef = (f64::from(clip_grad) / (total.sqrt() + 1e-6)).min(1.0) as f32;
        }
        let grad_scale = if dp > 1 {
            clip_coef * (1.0 / dp as f32)
        } else {
            clip_coef
        };
        let at = |s: Scalar| scalars + 8 * s.slot() as u64;
        let step = self.ld_f64(at(Scalar::Step)) as u64 + u64::from(!skipped);
        // `muon_powi_f32` is the host's powi_f32 product for product.
        let powi = muon_opt::numerics::adamw::powi_f32;
        for (s, v) in [
            (Scalar::GradNorm, total.sqrt()),
            (Scalar::ClipCoef, f64::from(clip_coef)),
            (Scalar::GradScale, f64::from(grad_scale)),
            (Scalar::Skip, if skipped { 1.0 } else { 0.0 }),
            (Scalar::Step, step as f64),
            (Scalar::Bc1, f64::from(1.0 - powi(beta1, step))),
            (Scalar::Bc2, f64::from(1.0 - powi(beta2, step))),
        ] {
            self.st_f64(at(s), v);
        }
    }

    /// The host view of emulated device memory (for MXFP8 storage).
    fn bytes(&self, ptr: DevPtr, len: usize) -> Vec<u8> {
        self.mem[self.at(ptr, len)].to_vec()
    }
}

impl Executor for Emulator {
    fn run(&mut self, actions: &[Action], bind: &mut dyn FnMut(Buf, DevPtr, u64)) -> Result<Vec<Vec<u8>>> {
        Ok(self.execute(actions, bind))
    }
}

/// The sizes of the four MXFP8 parts of a `rows × cols` tensor.
fn part_sizes(rows: usize, cols: usize) -> [usize; 4] {
    use muon_opt::numerics::mxfp8::{Direction, scale_shape};
    let scales = |d| {
        let (r, c) = scale_shape(rows, cols, d);
        r * c
    };
    [
        rows * cols,
        scales(Direction::Rowwise),
        rows * cols,
        scales(Direction::Colwise),
    ]
}

/// dp=1 runs of the optimizer on the emulated device and on the host backend, compared after
/// every step bit for bit: params, masters, optimizer state and MXFP8 bytes. The GEMM is the
/// host's, so the only difference left is the order of the f64 sums of squares (a fixed tree
/// instead of the host's 8 lanes), which agrees with the host's after rounding to f32 here; the
/// reported grad norm itself is compared to 1e-12.
fn compare_runs(label: &str, cfg: &Config, specs: &[ParamSpec]) {
    let mut host = runtime(cfg, specs, 0, 1, Box::new(host_backend(cfg)));
    let mut emu = runtime(
        cfg,
        specs,
        0,
        1,
        Box::new(emulated_backend(MuonOptions::from_config(cfg))),
    );
    for step in 0..4 {
        let nan = step == 2;
        let (a, b) = (iterate(&mut host, 0, step, nan), iterate(&mut emu, 0, step, nan));
        assert_eq!((a.skipped, a.step), (b.skipped, b.step), "{label}: step {step}");
        if !a.skipped {
            let rel = ((a.grad_norm - b.grad_norm) / a.grad_norm).abs();
            assert!(
                rel < 1e-12,
                "{label}: step {step} grad norm {} vs {}",
                a.grad_norm,
                b.grad_norm
            );
            assert_eq!(a.clip_coef, b.clip_coef, "{label}: step {step} clip coefficient");
        }
        let (sa, sb) = (host.owned_state().unwrap(), emu.owned_state().unwrap());
        assert_eq!(sa.len(), sb.len());
        for (x, y) in sa.iter().zip(&sb) {
            assert_eq!((x.param, x.range), (y.param, y.range));
            let name = &specs[x.param as usize].name;
            let arrays = std::iter::once((&x.master, &y.master)).chain(x.moments.iter().zip(&y.moments));
            for (k, (u, v)) in arrays.enumerate() {
                assert!(
                    bits(u) == bits(v),
                    "{label}: step {step} {name} state array {k} differs"
                );
            }
        }
        for (p, spec) in specs.iter().enumerate() {
            let (u, v) = (host.param_values(p).unwrap(), emu.param_values(p).unwrap());
            assert!(bits(&u) == bits(&v), "{label}: step {step} param {} differs", spec.name);
            if let (Some(host_parts), Some(emu_parts)) = (host.mxfp8_addresses(p), emu.mxfp8_addresses(p)) {
                let (rows, cols) = spec.flat_2d();
                let sizes = part_sizes(rows as usize, cols as usize);
                // SAFETY: the runtime's backend is the emulated cuda backend built above; only read here.
                let backend = unsafe { &*(emu.backend_mut() as *mut dyn Backend as *const CudaBackend<Emulator>) };
                let device = backend.executor();
                for ((h, e), len) in host_parts.iter().zip(emu_parts).zip(sizes) {
                    // SAFETY: host MXFP8 storage of `len` bytes.
                    let host_bytes = unsafe { std::slice::from_raw_parts(*h, len) };
                    assert!(
                        host_bytes == device.bytes(e as DevPtr, len),
                        "{label}: step {step} MXFP8 bytes of {}",
                        spec.name
                    );
                }
            }
        }
    }
}

#[test]
fn emulated_translation_matches_the_host_backend_f32_newton_schulz() {
    let cfg = Config {
        bucket_size: 4096,
        muon_ns_symmetric_tile: SMALL_TILE,
        muon_ns_precision: NsPrecision::F32,
        host_comm_mode: CommMode::Eager,
        ..Config::default()
    };
    compare_runs("f32 NS, compact", &cfg, &cuda_model());
    let cfg = Config {
        muon_layout: MuonLayout::Padded,
        muon_nesterov: true,
        grad_dtype: Dtype::Bf16,
        clip_grad: 0.05,
        ..cfg
    };
    compare_runs("f32 NS, padded, bf16 grads, nesterov, clipping", &cfg, &cuda_model());
}

#[test]
fn emulated_translation_matches_the_host_backend_bf16_newton_schulz() {
    let cfg = Config {
        bucket_size: 4096,
        muon_ns_symmetric_tile: SMALL_TILE,
        host_comm_mode: CommMode::Eager,
        mxfp8_param_gather: true,
        mxfp8_swizzled_scales: true,
        ..Config::default()
    };
    compare_runs("bf16 NS, MXFP8 gather", &cfg, &cuda_model());
    let cfg = Config {
        mxfp8_param_gather: false,
        muon_layout: MuonLayout::Allreduce,
        ..cfg
    };
    compare_runs("bf16 NS, MXFP8 local, allreduce", &cfg, &cuda_model());
}

#[test]
fn emulated_translation_matches_the_host_backend_bf16_iterate_newton_schulz() {
    let cfg = Config {
        bucket_size: 4096,
        muon_ns_symmetric_tile: SMALL_TILE,
        host_comm_mode: CommMode::Eager,
        muon_ns_precision: NsPrecision::Bf16Iterate,
        muon_coefficient_set: muon_opt::config::CoefficientSet::QuinticCyclic,
        muon_num_ns_steps: 7,
        ..Config::default()
    };
    compare_runs("bf16-iterate NS, cyclic quintic, 7 steps", &cfg, &cuda_model());
}

/// The Gram Newton–Schulz iteration (`muon_ns_method = gram`) on the emulated device, bit for
/// bit like the host in every precision: bf16 and bf16_iterate with 5 quintic steps (one
/// restart), f32 with 9 Polar Express steps (restarts at steps 2, 5 and 8). The model's wide
/// matrices (order 32 and 64 with tiles of 16: the symmetric products 2 and 4 tiles a side),
/// its expert stack and fused components (strided batches, tall ones transposed)
/// take the Gram iteration; its square and near-square ones (`n/m < 1.5`) the standard one,
/// checked against a host run with `standard`: after one step those params are equal to it
/// bit for bit and every other Muon param differs.
#[test]
fn emulated_gram_newton_schulz_matches_the_host_backend_bitwise() {
    use muon_opt::config::{CoefficientSet, NsMethod};
    let mut specs = cuda_model();
    specs.push(ParamSpec::new("wide.deep.weight", &[64, 160], Dtype::Bf16));
    let standard_only = [
        "layers.0.qkv.weight",
        "layers.0.proj.weight",
        "layers.1.qkv.weight",
        "layers.1.proj.weight",
        "deep.weight",
        "mx.fc.weight",
    ];
    for (precision, coefficients, steps) in [
        (NsPrecision::Bf16, CoefficientSet::Quintic, 5),
        (NsPrecision::Bf16Iterate, CoefficientSet::QuinticCyclic, 5),
        (NsPrecision::F32, CoefficientSet::PolarExpress, 9),
    ] {
        let cfg = Config {
            bucket_size: 4096,
            muon_ns_symmetric_tile: SMALL_TILE,
            host_comm_mode: CommMode::Eager,
            muon_ns_precision: precision,
            muon_coefficient_set: coefficients,
            muon_num_ns_steps: steps,
            muon_ns_method: NsMethod::Gram,
            ..Config::default()
        };
        compare_runs(&format!("gram NS, {precision:?}, {steps} steps"), &cfg, &specs);
        let standard = Config {
            muon_ns_method: NsMethod::Standard,
            ..cfg.clone()
        };
        let mut gram = runtime(&cfg, &specs, 0, 1, Box::new(host_backend(&cfg)));
        let mut plain = runtime(&standard, &specs, 0, 1, Box::new(host_backend(&standard)));
        iterate(&mut gram, 0, 0, false);
        iterate(&mut plain, 0, 0, false);
        let (a, b) = (gram.owned_state().unwrap(), plain.owned_state().unwrap());
        for (x, y) in a.iter().zip(&b) {
            let name = &specs[x.param as usize].name;
            if gram.plan().params[x.param as usize].route != muon_opt::model::Route::Muon {
                continue;
            }
            let same = bits(&x.master) == bits(&y.master);
            let expected = standard_only.contains(&name.as_str());
            assert_eq!(same, expected, "{precision:?}: {name} equal to the standard iteration");
        }
    }
}

/// The element-wise ops the dp=1 runs do not reach (scale, casts in every direction, bf16
/// buffers), bit for bit, including NaN, infinities, subnormals and rounding ties.
#[test]
fn emulated_elementwise_ops_match_the_host_backend_bit_for_bit() {
    let cfg = Config::default();
    let specials = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        f32::from_bits(1),
        f32::from_bits(0x3F80_8000),
        f32::from_bits(0x3F81_8000),
        f32::MAX,
    ];
    let (host, _) = elementwise_script(&mut host_backend(&cfg), 512, &specials);
    let (emu, _) = elementwise_script(&mut emulated_backend(MuonOptions::from_config(&cfg)), 512, &specials);
    assert_eq!(host, emu);
}

/// `Op::QkClip` (kernels/qk_clip.cu) with the maxima in device memory, bit for bit like the
/// host backend: every head layout, α = 0, ½, 1, 0.3, maxima above, under, at τ and not finite.
#[test]
fn emulated_qk_clip_matches_the_host_backend_bit_for_bit() {
    let cfg = Config::default();
    let host = support::qk_clip::clip_script(&mut host_backend(&cfg), false);
    let emu = support::qk_clip::clip_script(&mut emulated_backend(MuonOptions::from_config(&cfg)), true);
    assert!(host == emu);
}

/// The emulated device with a fault: its `fail_at`-th NCCL group fails with `kind`, as a
/// collective whose peer never arrives (the device's polling wait gives `CommTimeout`) or one
/// NCCL reports failed (`NcclError`).
struct Faulty {
    device: Emulator,
    fail_at: usize,
    kind: ErrorKind,
    groups: usize,
}

impl Executor for Faulty {
    fn run(&mut self, actions: &[Action], bind: &mut dyn FnMut(Buf, DevPtr, u64)) -> Result<Vec<Vec<u8>>> {
        for action in actions {
            if matches!(action, Action::Nccl(..)) {
                self.groups += 1;
                if self.groups == self.fail_at {
                    return Err(muon_opt::error::Error::new(
                        self.kind,
                        "ncclReduce: the peer did not arrive within collective_timeout_ms".to_string(),
                    ));
                }
            }
        }
        self.device.run(actions, bind)
    }
}

/// A collective that times out or fails in NCCL returns its status, and every later call of
/// the backend returns `CommBroken` at once naming it — nothing more is issued to a
/// communicator the peers will never match again. Other failures (a span out of bounds) do not
/// break the backend.
#[test]
fn a_failed_collective_breaks_the_backend_and_later_calls_return_at_once() {
    use muon_opt::backend::ops::{BufferSizes, CollOp, MemoryLayout, MuonWork, Span};
    for kind in [ErrorKind::CommTimeout, ErrorKind::NcclError] {
        let faulty = Faulty {
            device: Emulator {
                mem: Vec::new(),
                tp: None,
            },
            fail_at: 2,
            kind,
            groups: 0,
        };
        let muon = MuonOptions::from_config(&Config::default());
        let mut backend = CudaBackend::with_executor(Translator::new(0, 1, muon), faulty).unwrap();
        backend
            .allocate(&MemoryLayout {
                buffers: vec![BufferSizes::whole(256, Dtype::F32)],
                grad_dtype: Dtype::F32,
                master: 0,
                momentum: 0,
                adam_moments: 0,
                max_component: (0, 0),
                muon_work: MuonWork::default(),
                tp_components: Vec::new(),
                mxfp8: Vec::new(),
                mxfp8_scale_layout: ScaleLayout::Compact,
            })
            .unwrap();
        let grads = Span::new(Mem::Grad(0), 0, 256);
        let reduce = [CollOp::Reduce { root: 0, span: grads }];
        backend.collectives(reduce.to_vec()).unwrap();
        let bad = backend
            .upload(Span::new(Mem::Grad(0), 250, 100), &[0.0; 100])
            .unwrap_err();
        assert_eq!(bad.kind, ErrorKind::Internal, "{bad:?}");
        assert_eq!(backend.collectives(reduce.to_vec()).unwrap_err().kind, kind);
        for err in [
            backend.memset_zero(StreamKind::Compute, grads).unwrap_err(),
            backend.collectives(reduce.to_vec()).unwrap_err(),
            backend.synchronize().unwrap_err(),
        ] {
            assert_eq!(err.kind, ErrorKind::CommBroken, "{err:?}");
            assert!(
                err.message.contains("peer did not arrive") && err.message.contains("ncclCommAbort"),
                "{}",
                err.message
            );
        }
    }
}

/// Tensor-parallel shards on the emulated device, TP 2 (one emulator per TP rank on threads,
/// their collectives over a host group) against the host backend's TP 2 run, bit for bit after
/// every step: column-parallel and row-parallel matrices whose whole result is stored plain or
/// transposed (both for each split dimension), a square shard, an expert stack split per
/// expert (expert tensor parallelism), and Megatron's QKV split per query group (two groups per
/// shard). `duplicated` in f32 and bf16 Newton–Schulz — the gather,
/// the 2-D assembly of column blocks, the chunk of a transposed result read with its row
/// stride, the whole-shape scale; `distributed` in f32 and bf16_iterate — the forced
/// orientation and the all-reduced norm and Gram matrices; the Gram iteration in both modes
/// and every precision (its `X·Xᵀ` all-reduced in `distributed`, its products with `Q`
/// shard-local), on the wide iterates, the others taking the standard one.
#[test]
fn tensor_parallel_shards_match_the_host_backend_bitwise() {
    use muon_opt::config::{NsMethod, TpMode};
    use muon_opt::model::ParamFlags;
    const TP: usize = 2;
    let shard = |name: &str, shape: &[u64], flags: u32| ParamSpec {
        flags: ParamFlags(flags),
        ..ParamSpec::new(name, shape, Dtype::F32)
    };
    let mut qkv = shard("attn.qkv.weight", &[32, 16], ParamFlags::TP_SHARD_ROWS);
    qkv.split_sizes = vec![8, 4, 4];
    qkv.split_groups = 2;
    let specs = vec![
        qkv,
        shard("mlp.fc1.weight", &[32, 24], ParamFlags::TP_SHARD_ROWS),
        shard("mlp.fc2.weight", &[24, 16], ParamFlags::TP_SHARD_COLS),
        shard("attn.proj.weight", &[16, 16], ParamFlags::TP_SHARD_COLS),
        shard("mlp.down.weight", &[40, 8], ParamFlags::TP_SHARD_COLS),
        // Iterate and Gram matrix of order 64: the symmetric products by 4 tiles a side.
        shard("attn.out.weight", &[64, 40], ParamFlags::TP_SHARD_COLS),
        shard(
            "experts.fc2",
            &[3, 16, 12],
            ParamFlags::EXPERT_STACK | ParamFlags::TP_SHARD_COLS,
        ),
        // Wide iterates in both modes (the Gram iteration's): whole 32 × 128 and 16 × 192
        // (transposed); shards 32 × 64 (order 32: 2 tiles a side) and 16 × 96.
        shard("mlp.wide.weight", &[32, 64], ParamFlags::TP_SHARD_COLS),
        shard("attn.tall.weight", &[96, 16], ParamFlags::TP_SHARD_ROWS),
    ];
    let mut runs = vec![
        (NsPrecision::F32, TpMode::Duplicated, NsMethod::Standard),
        (NsPrecision::Bf16, TpMode::Duplicated, NsMethod::Standard),
        (NsPrecision::F32, TpMode::Distributed, NsMethod::Standard),
        (NsPrecision::Bf16Iterate, TpMode::Distributed, NsMethod::Standard),
    ];
    for precision in [NsPrecision::F32, NsPrecision::Bf16, NsPrecision::Bf16Iterate] {
        for mode in [TpMode::Duplicated, TpMode::Distributed] {
            runs.push((precision, mode, NsMethod::Gram));
        }
    }
    for (precision, mode, method) in runs {
        let cfg = Config {
            bucket_size: 4096,
            muon_ns_symmetric_tile: SMALL_TILE,
            muon_ns_precision: precision,
            muon_ns_method: method,
            muon_tp_mode: mode,
            host_comm_mode: CommMode::Eager,
            ..Config::default()
        };
        let host_tp = HostGroup::new(TP, Duration::from_secs(20));
        let emu_tp = HostGroup::new(TP, Duration::from_secs(20));
        on_ranks(host_tp.into_iter().zip(emu_tp), |t, (host_comm, emu_comm)| {
            let (cfg, specs) = (&cfg, &specs);
            let host = host_backend(cfg)
                .with_tp_group(Communicator::new(Transport::Host(host_comm)))
                .unwrap();
            let device = Emulator {
                mem: Vec::new(),
                tp: Some(emu_comm),
            };
            let translator = Translator::new(0, 1, MuonOptions::from_config(cfg)).with_tp_group(TP, t);
            let emulated = CudaBackend::with_executor(translator, device).unwrap();
            let mut host = runtime(cfg, specs, 0, 1, Box::new(host));
            let mut emu = runtime(cfg, specs, 0, 1, Box::new(emulated));
            for step in 0..3 {
                let (a, b) = (iterate(&mut host, t, step, false), iterate(&mut emu, t, step, false));
                assert_eq!(a.step, b.step);
                for (x, y) in host.owned_state().unwrap().iter().zip(&emu.owned_state().unwrap()) {
                    let name = &specs[x.param as usize].name;
                    assert!(
                        bits(&x.master) == bits(&y.master),
                        "{mode:?} {precision:?} {method:?} TP rank {t} step {step}: {name} master differs"
                    );
                }
            }
        });
    }
}

//! The emulated device of `cuda_emulated.rs`: a byte arena at the translator's (virtual)
//! addresses, every kernel of `kernels/*.cu` re-stated in Rust, cuBLAS's GEMM on the host and
//! NCCL for one rank (or a tensor-parallel group over a host group).

use muon_opt::backend::cuda::action::{
    Action, Arg, Buf, DevPtr, Gemm, GemmInputs, Kernel, Launch, Matrices, NcclCall, NcclComm, NcclType,
};
use muon_opt::backend::cuda::translate::Translator;
use muon_opt::backend::cuda::{CudaBackend, Executor};
use muon_opt::backend::host::comm::{HostComm, Region};
use muon_opt::backend::ops::Scalar;
use muon_opt::error::Result;
use muon_opt::numerics::bf16::{bf16_to_f32, f32_to_bf16_rne};
use muon_opt::numerics::gemm::{Output, Strides, SymmetricTiles, gemm};
use muon_opt::numerics::muon::MuonOptions;
use muon_opt::numerics::mxfp8::{Input, QuantizedMut, ScaleLayout, quantize_both};

/// First emulated device address (allocations follow, 512-byte aligned).
const BASE: DevPtr = 1 << 40;
const THREADS: usize = 256;
/// Tile of the symmetric products in the runs compared with the host: the test matrices
/// (order up to 64) are 2 to 4 tiles a side.
pub(crate) const SMALL_TILE: u32 = 16;

/// A CPU stand-in for one GPU with a one-rank communicator and, when given, a tensor-parallel
/// group whose all-gathers run over a host group (one emulator per TP rank, on threads).
pub(crate) struct Emulator {
    pub(crate) mem: Vec<u8>,
    pub(crate) tp: Option<HostComm>,
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
pub(crate) fn emulated_backend(muon: MuonOptions) -> CudaBackend<Emulator> {
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
                for (ptr, v) in crate::support::qk_clip::emulate(a, |p| self.ld_f32(p)) {
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
    pub(crate) fn bytes(&self, ptr: DevPtr, len: usize) -> Vec<u8> {
        self.mem[self.at(ptr, len)].to_vec()
    }
}

impl Executor for Emulator {
    fn run(&mut self, actions: &[Action], bind: &mut dyn FnMut(Buf, DevPtr, u64)) -> Result<Vec<Vec<u8>>> {
        Ok(self.execute(actions, bind))
    }
}

/// The sizes of the four MXFP8 parts of a `rows × cols` tensor.
pub(crate) fn part_sizes(rows: usize, cols: usize) -> [usize; 4] {
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

//! The emulated device of `cuda_emulated.rs`: every allocation a heap block of its own whose
//! address is the device pointer, every kernel launch run by the real `kernels/*.cu` on the
//! CPU (`kernels_cpu`: plain or under a sanitizer), cuBLAS's GEMM on the host and NCCL over
//! host groups (`nccl`), each call checked as strictly as the real libraries document them.

#[path = "cublas.rs"]
mod cublas;
#[path = "nccl.rs"]
mod nccl;

use std::collections::{BTreeMap, BTreeSet};

use muon_opt::backend::cuda::action::{Action, Buf, DevPtr, Gemm, GemmInputs, NcclComm};
use muon_opt::backend::cuda::translate::Translator;
use muon_opt::backend::cuda::{CudaBackend, Executor};
use muon_opt::backend::host::comm::HostComm;
use muon_opt::error::Result;
use muon_opt::numerics::bf16::bf16_to_f32;
use muon_opt::numerics::gemm::{Output, Strides, gemm};
use muon_opt::numerics::muon::MuonOptions;

use super::kernels_cpu;

/// Tile of the symmetric products in the runs compared with the host: the test matrices
/// (order up to 64) are 2 to 4 tiles a side.
pub(crate) const SMALL_TILE: u32 = 16;

/// A CPU stand-in for one GPU whose NCCL communicators run over host groups (one emulator per
/// rank, on threads); a communicator without a group is a one-rank one.
pub(crate) struct Emulator {
    /// Every allocation by its address (8-byte aligned, as the kernels' f64 accesses need; an
    /// access past its end is AddressSanitizer's to report when the kernels run under it).
    allocations: BTreeMap<DevPtr, Vec<u64>>,
    comms: Vec<(NcclComm, HostComm)>,
    /// The kernels launched so far.
    launched: BTreeSet<&'static str>,
}

/// The cuda backend (its real translator and Backend glue) over the emulated device.
pub(crate) fn emulated_backend(muon: MuonOptions) -> CudaBackend<Emulator> {
    CudaBackend::with_executor(Translator::new(0, 1, muon), Emulator::new()).unwrap()
}

impl Emulator {
    pub(crate) fn new() -> Self {
        Emulator {
            allocations: BTreeMap::new(),
            comms: Vec::new(),
            launched: BTreeSet::new(),
        }
    }

    /// The names of the kernels launched so far.
    pub(crate) fn launched(&self) -> &BTreeSet<&'static str> {
        &self.launched
    }

    /// Communicator `which` runs over `comm`'s host group.
    pub(crate) fn with_comm(mut self, which: NcclComm, comm: HostComm) -> Self {
        self.comms.retain(|(c, _)| *c != which);
        self.comms.push((which, comm));
        self
    }

    /// The allocation holding `ptr`: its address and length in bytes.
    fn allocation_of(&self, ptr: DevPtr) -> Option<(DevPtr, usize)> {
        let (&start, block) = self.allocations.range(..=ptr).next_back()?;
        Some((start, block.len() * 8))
    }

    /// Where the `bytes` at `ptr` are: their allocation and offset in it (inside it, or a panic).
    fn locate(&self, ptr: DevPtr, bytes: usize) -> (DevPtr, usize) {
        let (start, len) = self.allocation_of(ptr).expect("an address below every allocation");
        let offset = (ptr - start) as usize;
        assert!(offset + bytes <= len, "access outside an allocation");
        (start, offset)
    }

    /// The `bytes` at `ptr`, inside one allocation.
    fn span(&self, ptr: DevPtr, bytes: usize) -> &[u8] {
        let (start, offset) = self.locate(ptr, bytes);
        // SAFETY: `offset + bytes` bytes lie inside the block, which lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.allocations[&start].as_ptr().cast::<u8>().add(offset), bytes) }
    }

    fn span_mut(&mut self, ptr: DevPtr, bytes: usize) -> &mut [u8] {
        let (start, offset) = self.locate(ptr, bytes);
        let block = self.allocations.get_mut(&start).expect("located above");
        // SAFETY: as in `span`, and `self` is borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(block.as_mut_ptr().cast::<u8>().add(offset), bytes) }
    }

    fn ld_f32(&self, ptr: DevPtr) -> f32 {
        f32::from_le_bytes(self.span(ptr, 4).try_into().unwrap())
    }
    fn st_f32(&mut self, ptr: DevPtr, v: f32) {
        self.span_mut(ptr, 4).copy_from_slice(&v.to_le_bytes());
    }
    fn ld_u16(&self, ptr: DevPtr) -> u16 {
        u16::from_le_bytes(self.span(ptr, 2).try_into().unwrap())
    }
    fn ld_f64(&self, ptr: DevPtr) -> f64 {
        f64::from_le_bytes(self.span(ptr, 8).try_into().unwrap())
    }
    fn ld_u64(&self, ptr: DevPtr) -> u64 {
        u64::from_le_bytes(self.span(ptr, 8).try_into().unwrap())
    }
    fn st_f64(&mut self, ptr: DevPtr, v: f64) {
        self.span_mut(ptr, 8).copy_from_slice(&v.to_le_bytes());
    }
    /// Element `i` of an f32 or bf16 GEMM operand, as f32.
    fn load(&self, ptr: DevPtr, bf16: bool, i: u64) -> f32 {
        if bf16 {
            bf16_to_f32(self.ld_u16(ptr + 2 * i))
        } else {
            self.ld_f32(ptr + 4 * i)
        }
    }

    fn copy(&mut self, dst: DevPtr, src: DevPtr, bytes: usize) {
        let source = self.span(src, bytes).to_vec();
        self.span_mut(dst, bytes).copy_from_slice(&source);
    }

    fn execute(&mut self, actions: &[Action], bind: &mut dyn FnMut(Buf, DevPtr, u64)) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for action in actions {
            match action {
                Action::Alloc { buf, bytes } => {
                    let ptr = if *bytes == 0 {
                        0
                    } else {
                        let block = vec![0u64; bytes.div_ceil(8) as usize];
                        let ptr = block.as_ptr() as DevPtr;
                        self.allocations.insert(ptr, block);
                        ptr
                    };
                    bind(*buf, ptr, *bytes);
                }
                Action::CopyIn { dst, bytes, .. } | Action::CopyInAsync { dst, bytes, .. } => {
                    self.span_mut(*dst, bytes.len()).copy_from_slice(bytes);
                }
                Action::CopyOut { src, bytes, .. } => out.push(self.span(*src, *bytes as usize).to_vec()),
                Action::Zero { dst, bytes, .. } => {
                    if *bytes > 0 {
                        self.span_mut(*dst, *bytes as usize).fill(0);
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
                Action::Launch(launch) => {
                    self.launched.insert(launch.kernel.name());
                    kernels_cpu::launch(launch);
                }
                Action::Gemm(gemm) => self.gemm(gemm),
                Action::Nccl(which, calls) => self.nccl_group(*which, calls),
                Action::Record { .. } | Action::Wait { .. } | Action::Synchronize(_) => {}
            }
        }
        out
    }

    /// `cublasGemmStridedBatchedEx` or `cublasGemmBatchedEx` (the lists read from emulated
    /// memory) with `CUBLAS_OP_N` for B, column-major: each product is handed to
    /// `numerics::gemm::gemm` (the host backend's GEMM) as the row-major product it stands
    /// for, so a correct translation reproduces the host's products bit for bit.
    fn gemm(&mut self, g: &Gemm) {
        let bf16 = g.inputs == GemmInputs::Bf16;
        let (m, n, k) = (g.m as usize, g.n as usize, g.k as usize);
        let (lda, ldb, ldc) = (g.lda as usize, g.ldb as usize, g.ldc as usize);
        let read = |emu: &Self, ptr: DevPtr, len: usize, bf16: bool| -> Vec<f32> {
            (0..len as u64).map(|i| emu.load(ptr, bf16, i)).collect()
        };
        self.check_gemm(g);
        for batch in 0..g.batch as u64 {
            let [a_ptr, b_ptr, c_ptr] = self.gemm_pointers(g, batch);
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

    pub(crate) fn bytes(&self, ptr: DevPtr, len: usize) -> Vec<u8> {
        self.span(ptr, len).to_vec()
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

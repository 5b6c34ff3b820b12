//! cuBLAS's documented argument rules for the GEMMs the translator issues
//! (`cublasGemmStridedBatchedEx` and `cublasGemmBatchedEx`, column-major, `op(A)` `N` or `T`,
//! B `N`): `m`, `n`, `k` and `batchCount` not negative; `lda ≥ max(1, m)` for `N` or
//! `max(1, k)` for `T`, `ldb ≥ max(1, k)`, `ldc ≥ max(1, m)`; every matrix inside one allocation
//! and aligned to its elements; and — results are undefined otherwise — C overlapping neither A
//! nor B, and no two C matrices of a batch sharing an element. A call that breaks one fails
//! the test, naming the argument.

use muon_opt::backend::cuda::action::{DevPtr, Gemm, GemmInputs, Matrices};

use super::Emulator;

/// Where one matrix of a batch lies: its allocation, the rows and columns of the allocation
/// (seen as a column-major matrix of leading dimension `ld`) it covers, and its byte range.
struct Window {
    allocation: DevPtr,
    ld: u64,
    rows: (u64, u64),
    cols: (u64, u64),
    bytes: (DevPtr, DevPtr),
}

impl Window {
    /// Whether the two matrices share an element: by rows and columns when both are windows of
    /// one column-major matrix (same leading dimension, no column wrapping into the next), else
    /// by byte range.
    fn overlaps(&self, other: &Window) -> bool {
        let windows = self.ld == other.ld && self.rows.1 <= self.ld && other.rows.1 <= other.ld;
        if !windows {
            return self.bytes.0 < other.bytes.1 && other.bytes.0 < self.bytes.1;
        }
        self.allocation == other.allocation
            && self.rows.0 < other.rows.1
            && other.rows.0 < self.rows.1
            && self.cols.0 < other.cols.1
            && other.cols.0 < self.cols.1
    }
}

impl Emulator {
    /// The `rows × cols` matrix at `ptr` with leading dimension `ld` (elements of `elem` bytes):
    /// inside one allocation, aligned, its window of that allocation.
    fn window(&self, what: &str, ptr: DevPtr, rows: u64, cols: u64, ld: u64, elem: u64) -> Window {
        let (allocation, len) = self
            .allocation_of(ptr)
            .unwrap_or_else(|| panic!("GEMM {what} at {ptr:#x} is below every allocation"));
        assert!(
            ptr.is_multiple_of(elem),
            "GEMM {what} at {ptr:#x} is not aligned to its {elem}-byte elements"
        );
        let offset = (ptr - allocation) / elem;
        let last = if rows == 0 || cols == 0 {
            0
        } else {
            (cols - 1) * ld + rows
        };
        assert!(
            (offset + last) * elem <= len as u64,
            "GEMM {what} ({rows} × {cols}, ld {ld}) runs past its allocation"
        );
        Window {
            allocation,
            ld,
            rows: (offset % ld, offset % ld + rows),
            cols: (offset / ld, offset / ld + cols),
            bytes: (ptr, ptr + last * elem),
        }
    }

    /// The matrices of batch entry `i`: A, B, C pointers.
    pub(super) fn gemm_pointers(&self, g: &Gemm, i: u64) -> [DevPtr; 3] {
        let elem = if g.inputs == GemmInputs::Bf16 { 2 } else { 4 };
        match g.matrices {
            Matrices::Strided {
                a,
                stride_a,
                b,
                stride_b,
                c,
                stride_c,
            } => [
                a + i * stride_a as u64 * elem,
                b + i * stride_b as u64 * elem,
                c + i * stride_c as u64 * 4,
            ],
            Matrices::Listed { table, .. } => {
                [0, 1, 2].map(|list| self.ld_u64(table + (list * g.batch as u64 + i) * 8))
            }
        }
    }

    pub(super) fn check_gemm(&self, g: &Gemm) {
        for (name, value) in [("m", g.m), ("n", g.n), ("k", g.k), ("batchCount", g.batch)] {
            assert!(value >= 0, "GEMM {name} = {value} is negative: {g:?}");
        }
        let (m, n, k) = (g.m as u64, g.n as u64, g.k as u64);
        let (a_rows, a_cols) = if g.transpose_a { (k, m) } else { (m, k) };
        for (name, ld, least) in [("lda", g.lda, a_rows), ("ldb", g.ldb, k), ("ldc", g.ldc, m)] {
            assert!(
                i64::from(ld) >= least.max(1) as i64,
                "GEMM {name} = {ld} is below max(1, {least}): {g:?}"
            );
        }
        if let Matrices::Strided {
            stride_a,
            stride_b,
            stride_c,
            ..
        } = g.matrices
        {
            for (name, stride) in [("strideA", stride_a), ("strideB", stride_b), ("strideC", stride_c)] {
                assert!(stride >= 0, "GEMM {name} = {stride} is negative: {g:?}");
            }
        }
        if let Matrices::Listed { table, .. } = g.matrices {
            self.window("pointer lists", table, 3 * g.batch as u64, 1, 3 * g.batch as u64, 8);
        }
        let elem = if g.inputs == GemmInputs::Bf16 { 2 } else { 4 };
        let mut outputs: Vec<Window> = Vec::with_capacity(g.batch as usize);
        for i in 0..g.batch as u64 {
            let [a, b, c] = self.gemm_pointers(g, i);
            let a = self.window("A", a, a_rows, a_cols, g.lda as u64, elem);
            let b = self.window("B", b, k, n, g.ldb as u64, elem);
            let c = self.window("C", c, m, n, g.ldc as u64, 4);
            for (name, input) in [("A", &a), ("B", &b)] {
                assert!(
                    input.bytes.1 <= c.bytes.0 || c.bytes.1 <= input.bytes.0,
                    "GEMM batch entry {i}: C overlaps {name}: {g:?}"
                );
            }
            if let Some(j) = outputs.iter().position(|o| o.overlaps(&c)) {
                panic!("GEMM batch entries {j} and {i} write the same elements of C: {g:?}");
            }
            outputs.push(c);
        }
    }
}

/// GEMMs cuBLAS documents as invalid or undefined are refused; valid batches are not.
#[cfg(test)]
mod rules {
    use muon_opt::backend::cuda::Executor;
    use muon_opt::backend::cuda::action::{Action, Buf, Gemm, GemmInputs, Matrices};

    use super::Emulator;

    /// An emulator with one 64 KiB allocation; its address.
    fn device() -> (Emulator, u64) {
        let mut emu = Emulator::new();
        let mut base = 0;
        emu.run(
            &[Action::Alloc {
                buf: Buf::Scalars,
                bytes: 1 << 16,
            }],
            &mut |_, ptr, _| base = ptr,
        )
        .unwrap();
        (emu, base)
    }

    /// A batch of two 8 × 8 f32 products in one allocation: A at 0, B at 4 KiB, C at 8 KiB.
    fn gemm(base: u64) -> Gemm {
        Gemm {
            inputs: GemmInputs::F32,
            transpose_a: false,
            m: 8,
            n: 8,
            k: 8,
            alpha: 1.0,
            lda: 8,
            ldb: 8,
            beta: 0.0,
            ldc: 8,
            batch: 2,
            matrices: Matrices::Strided {
                a: base,
                stride_a: 64,
                b: base + 4096,
                stride_b: 64,
                c: base + 8192,
                stride_c: 64,
            },
        }
    }

    fn with(base: u64, edit: impl FnOnce(&mut Gemm)) -> Gemm {
        let mut g = gemm(base);
        edit(&mut g);
        g
    }

    #[test]
    fn a_valid_batch_passes() {
        let (emu, base) = device();
        emu.check_gemm(&gemm(base));
        // Two windows of one matrix side by side (the tiles of a symmetric product).
        emu.check_gemm(&with(base, |g| {
            g.ldc = 16;
            g.matrices = Matrices::Strided {
                a: base,
                stride_a: 0,
                b: base + 4096,
                stride_b: 0,
                c: base + 8192,
                stride_c: 8,
            };
        }));
    }

    #[test]
    #[should_panic(expected = "lda = 4 is below max(1, 8)")]
    fn a_short_leading_dimension_is_refused() {
        let (emu, base) = device();
        emu.check_gemm(&with(base, |g| g.lda = 4));
    }

    #[test]
    #[should_panic(expected = "write the same elements of C")]
    fn overlapping_outputs_of_a_batch_are_refused() {
        let (emu, base) = device();
        emu.check_gemm(&with(base, |g| {
            if let Matrices::Strided { stride_c, .. } = &mut g.matrices {
                *stride_c = 32;
            }
        }));
    }

    #[test]
    #[should_panic(expected = "C overlaps A")]
    fn an_output_over_an_input_is_refused() {
        let (emu, base) = device();
        emu.check_gemm(&with(base, |g| {
            if let Matrices::Strided { c, .. } = &mut g.matrices {
                *c = base + 128;
            }
        }));
    }

    #[test]
    #[should_panic(expected = "runs past its allocation")]
    fn a_matrix_past_its_allocation_is_refused() {
        let (emu, base) = device();
        emu.check_gemm(&with(base, |g| {
            if let Matrices::Strided { c, .. } = &mut g.matrices {
                *c = base + 65_280;
            }
        }));
    }
}

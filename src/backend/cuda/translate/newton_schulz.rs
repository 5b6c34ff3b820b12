//! Newton–Schulz on the device: the normalization kernel, the products on cuBLAS, the bf16
//! roundings, step for step as `numerics::newton_schulz`.

use super::collectives::{all_reduce, on_tp_comm};
use super::memory::Resolved;
use super::norm::{SumInto, SumSpan};
use super::{Translator, launch, to_i32, to_u32};
use crate::backend::cuda::action::{Action, Arg, DevPtr, Gemm, GemmInputs, Kernel, NcclType, Work};
use crate::backend::ops::StreamKind;
use crate::bail;
use crate::config::{Dtype, NsPrecision};
use crate::error::Result;
use crate::numerics::gemm::symmetric_blocks;
use crate::numerics::newton_schulz::{ns_coefficients, runs_gram};

/// One row-major product `C (m×n) = alpha·A (m×k)·op(B) + beta·C` per matrix of a strided
/// batch; `B` is `k×n`, or `n×k` read transposed when `b_transposed`. `ld` holds the row
/// strides of A, B (as stored) and C, `stride` the distances between the batch's matrices, in
/// elements. The same call as the host's `gemm` in `numerics::gemm`.
#[derive(Clone, Copy)]
pub(super) struct Product {
    inputs: GemmInputs,
    m: u64,
    k: u64,
    n: u64,
    alpha: f32,
    a: DevPtr,
    b: DevPtr,
    b_transposed: bool,
    beta: f32,
    c: DevPtr,
    batch: u64,
    ld: [u64; 3],
    stride: [u64; 3],
}

impl Product {
    /// The product of `batch` contiguous matrices.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn contiguous(
        inputs: GemmInputs,
        (m, k, n): (u64, u64, u64),
        alpha: f32,
        a: DevPtr,
        b: DevPtr,
        b_transposed: bool,
        beta: f32,
        c: DevPtr,
        batch: u64,
    ) -> Self {
        Product {
            inputs,
            m,
            k,
            n,
            alpha,
            a,
            b,
            b_transposed,
            beta,
            c,
            batch,
            ld: [k, if b_transposed { k } else { n }, n],
            stride: [m * k, k * n, m * n],
        }
    }

    /// The product as cuBLAS's column-major `Cᵀ = op(B)ᵀ·Aᵀ`: a row-major matrix is its
    /// column-major transpose, so A and B swap places and the dimensions read `n, m, k`.
    pub(super) fn gemm(&self) -> Result<Action> {
        let dimension = |v| to_i32("Newton–Schulz dimension", v);
        let leading = |v| to_i32("leading dimension", v);
        Ok(Action::Gemm(Gemm {
            inputs: self.inputs,
            transpose_a: self.b_transposed,
            m: dimension(self.n)?,
            n: dimension(self.m)?,
            k: dimension(self.k)?,
            alpha: self.alpha,
            a: self.b,
            lda: leading(self.ld[1])?,
            stride_a: self.stride[1] as i64,
            b: self.a,
            ldb: leading(self.ld[0])?,
            stride_b: self.stride[0] as i64,
            beta: self.beta,
            c: self.c,
            ldc: leading(self.ld[2])?,
            stride_c: self.stride[2] as i64,
            batch: to_i32("batch", self.batch)?,
        }))
    }

    /// A product that is symmetric by construction (`X·Xᵀ`, `A·A`; `m = n`, contiguous
    /// matrices) by the blocks of `numerics::gemm::symmetric_blocks` with the smallest block
    /// `leaf`, as the host's `Output::SymmetricLower`: the lower triangle is exact, the upper
    /// one is left to [`symmetrize`] (the host mirrors it at once). A single matrix takes one
    /// strided batch of equal blocks per level; a batch of matrices one batch of the matrices
    /// per block.
    pub(super) fn symmetric(&self, leaf: usize) -> Result<Vec<Action>> {
        let elem = match self.inputs {
            GemmInputs::Bf16 => 2,
            GemmInputs::F32 => 4,
        };
        // Elements from one column of the stored B to the next.
        let b_column = if self.b_transposed { self.ld[1] } else { 1 };
        let block = |row: u64, col: u64, size: u64, batch: u64, stride: [u64; 3]| Product {
            m: size,
            n: size,
            a: self.a + row * self.ld[0] * elem,
            b: self.b + col * b_column * elem,
            c: self.c + (row * self.ld[2] + col) * 4,
            batch,
            stride,
            ..*self
        };
        let mut actions = Vec::new();
        for blocks in symmetric_blocks(self.m as usize, leaf) {
            let [count, size, row, col, step] =
                [blocks.count, blocks.size, blocks.row, blocks.col, blocks.step].map(|v| v as u64);
            if self.batch == 1 {
                let stride = [step * self.ld[0], step * b_column, step * (self.ld[2] + 1)];
                actions.push(block(row, col, size, count, stride).gemm()?);
            } else {
                for i in 0..count {
                    let at = i * step;
                    actions.push(block(row + at, col + at, size, self.batch, self.stride).gemm()?);
                }
            }
        }
        Ok(actions)
    }
}

/// `batch` symmetric `m × m` matrices at `src` whole from their lower triangles: into `dst` as
/// bf16 (`to_bf16`: the host's rounding of the mirrored matrix), or in place (`dst = src`).
pub(super) fn symmetrize(src: DevPtr, dst: DevPtr, to_bf16: bool, batch: u64, m: u64) -> Result<Action> {
    Ok(launch(
        Kernel::NsSymmetrize,
        batch * m * m,
        StreamKind::Compute,
        vec![
            Arg::Ptr(src),
            Arg::Ptr(dst),
            Arg::I32(i32::from(to_bf16)),
            Arg::U32(to_u32("batch", batch)?),
            Arg::U32(to_u32("rows", m)?),
        ],
    ))
}

/// f32 → bf16: `count` values of `src` rounded into `dst`.
pub(super) fn round(src: DevPtr, dst: DevPtr, count: u64) -> Action {
    launch(
        Kernel::CastF32ToBf16,
        count,
        StreamKind::Compute,
        vec![Arg::Ptr(src), Arg::Ptr(dst), Arg::U64(count)],
    )
}

/// bf16 → f32: `values` takes the `count` values `scratch` holds.
pub(super) fn widen(scratch: DevPtr, values: DevPtr, count: u64) -> Action {
    let args = vec![
        Arg::Ptr(scratch),
        Arg::I32(1),
        Arg::Ptr(values),
        Arg::I32(0),
        Arg::U64(count),
    ];
    launch(Kernel::Cast, count, StreamKind::Compute, args)
}

/// f32 → bf16 → f32 in place: the value a bf16 store keeps, through `scratch`.
pub(super) fn store_bf16(actions: &mut Vec<Action>, values: DevPtr, scratch: DevPtr, count: u64) {
    actions.push(round(values, scratch, count));
    actions.push(widen(scratch, values, count));
}

/// `count` f32 values from `src` to `dst`.
pub(super) fn copy(src: DevPtr, dst: DevPtr, count: u64) -> Action {
    Action::CopyDevice {
        dst,
        src,
        bytes: count * 4,
        stream: StreamKind::Compute,
    }
}

/// How a Newton–Schulz input is split over the tensor-parallel group.
#[derive(Clone, Copy)]
pub(super) enum Sharding {
    /// Not split: the iterate is the input or, when it is tall, its transpose.
    None,
    /// The iterate (the input, or its transpose with `transpose`) is one shard of a matrix
    /// split along its columns: the norm and every Gram matrix are all-reduced.
    Columns { transpose: bool },
}

impl Translator {
    /// Newton–Schulz of `batch` consecutive `rows × cols` f32 matrices at `u`
    /// (`numerics::newton_schulz`, step for step): the Gram iteration where
    /// `numerics::newton_schulz::runs_gram` holds ([`Translator::iterate_gram`]), the standard
    /// one elsewhere. Returns where the result is (`m × n`, per matrix) and whether it is
    /// transposed.
    pub(super) fn newton_schulz(
        &self,
        actions: &mut Vec<Action>,
        u: DevPtr,
        rows: u64,
        cols: u64,
        batch: u64,
        sharding: Sharding,
    ) -> Result<(DevPtr, bool)> {
        let transposed = match sharding {
            Sharding::None => rows > cols,
            Sharding::Columns { transpose } => transpose,
        };
        let (m, n) = if transposed { (cols, rows) } else { (rows, cols) };
        let reduce = matches!(sharding, Sharding::Columns { .. });
        let (mn, mm) = (m * n, m * m);
        if batch * mm > self.work.gram || batch > self.work.norms {
            bail!(
                Internal,
                "newton_schulz: {batch}×{rows}×{cols} exceeds the workspace sized at allocate"
            );
        }
        let norms = self.work(Work::Norms)?;
        let spans: Vec<SumSpan> = (0..batch)
            .map(|k| SumSpan {
                span: Resolved {
                    ptr: u + k * mn * 4,
                    dtype: Dtype::F32,
                    len: mn,
                },
                check_only: false,
            })
            .collect();
        self.sumsq(actions, &spans, SumInto::PerSpan, norms)?;
        if reduce {
            on_tp_comm(actions, all_reduce(norms, batch, NcclType::F64));
        }
        let x = self.work(Work::X)?;
        actions.push(launch(
            Kernel::NsNormalize,
            batch * mn,
            StreamKind::Compute,
            vec![
                Arg::Ptr(u),
                Arg::Ptr(x),
                Arg::Ptr(norms),
                Arg::U32(to_u32("batch", batch)?),
                Arg::U32(to_u32("rows", rows)?),
                Arg::U32(to_u32("cols", cols)?),
                Arg::I32(i32::from(transposed)),
                Arg::F32(self.muon.ns.eps),
            ],
        ));
        let gram = self.work(Work::Gram)?;
        let product = |inputs, shape, alpha, a, b, b_transposed, beta, c| {
            Product::contiguous(inputs, shape, alpha, a, b, b_transposed, beta, c, batch)
        };
        let leaf = self.muon.ns.symmetric_leaf;
        let mut current = x;
        if self.muon.ns.precision == NsPrecision::Bf16Iterate {
            store_bf16(actions, x, self.work(Work::XBf16)?, batch * mn);
        }
        if runs_gram(m as usize, n as usize, &self.muon.ns) {
            let x = self.iterate_gram(actions, x, (m, n), batch, reduce)?;
            return Ok((x, transposed));
        }
        for step in 0..self.muon.ns.steps as usize {
            let [a, b, c] = ns_coefficients(self.muon.ns.coefficients, step);
            match self.muon.ns.precision {
                NsPrecision::Bf16 | NsPrecision::Bf16Iterate => {
                    // Bf16Iterate keeps `x` at bf16 values, with `xb` holding the same values
                    // as bf16 (`store_bf16`); `A` is stored at bf16 values before `b·A` reads it.
                    // The f32 `A` and `B` are exact in their lower triangles only: each is read
                    // whole as its bf16 copy (`symmetrize`), and `b·A` only where the blocks of
                    // `A·A` write (upper values there are replaced by the mirror).
                    use GemmInputs::Bf16;
                    let iterate = self.muon.ns.precision == NsPrecision::Bf16Iterate;
                    let (xb, gb) = (self.work(Work::XBf16)?, self.work(Work::GramBf16)?);
                    if !iterate {
                        actions.push(round(x, xb, batch * mn));
                    }
                    actions.extend(product(Bf16, (m, n, m), 1.0, xb, xb, true, 0.0, gram).symmetric(leaf)?);
                    if reduce {
                        on_tp_comm(actions, all_reduce(gram, batch * mm, NcclType::F32));
                    }
                    actions.push(symmetrize(gram, gb, true, batch, m)?);
                    if iterate {
                        actions.push(widen(gb, gram, batch * mm));
                    }
                    actions.extend(product(Bf16, (m, m, m), c, gb, gb, false, b, gram).symmetric(leaf)?);
                    actions.push(symmetrize(gram, gb, true, batch, m)?);
                    actions.push(product(Bf16, (m, m, n), 1.0, gb, xb, false, a, x).gemm()?);
                    if iterate {
                        store_bf16(actions, x, xb, batch * mn);
                    }
                }
                NsPrecision::F32 => {
                    use GemmInputs::F32;
                    let poly = self.work(Work::Poly)?;
                    let next = if current == x { self.work(Work::XNext)? } else { x };
                    actions.extend(product(F32, (m, n, m), 1.0, current, current, true, 0.0, gram).symmetric(leaf)?);
                    if reduce {
                        on_tp_comm(actions, all_reduce(gram, batch * mm, NcclType::F32));
                    }
                    actions.push(symmetrize(gram, gram, false, batch, m)?);
                    actions.push(copy(gram, poly, batch * mm));
                    actions.extend(product(F32, (m, m, m), c, gram, gram, false, b, poly).symmetric(leaf)?);
                    actions.push(symmetrize(poly, poly, false, batch, m)?);
                    actions.push(copy(current, next, batch * mn));
                    actions.push(product(F32, (m, m, n), 1.0, poly, current, false, a, next).gemm()?);
                    current = next;
                }
            }
        }
        Ok((current, transposed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The C elements (matrix, row, column) each GEMM of `actions` writes, in order, for
    /// `matrices` contiguous `m × m` row-major outputs at `base`.
    fn written(actions: &[Action], base: DevPtr, matrices: u64, m: u64) -> Vec<(u64, u64, u64)> {
        let mut out = Vec::new();
        for action in actions {
            let Action::Gemm(g) = action else { continue };
            for batch in 0..g.batch as u64 {
                // Column-major C: element (i, j) of the cuBLAS product is row j, column i of
                // the row-major product.
                for j in 0..g.n as u64 {
                    for i in 0..g.m as u64 {
                        let at = (g.c - base) / 4 + batch * g.stride_c as u64 + j * g.ldc as u64 + i;
                        assert!(at < matrices * m * m, "write outside the outputs");
                        out.push((at / (m * m), at % (m * m) / m, at % m));
                    }
                }
            }
        }
        out
    }

    /// `X·Xᵀ` and `A·A` of order 64 with blocks down to order 16 (two levels of halving), for
    /// one matrix and a batch of 3: the GEMMs write every element on and below the diagonal
    /// once, the upper triangle only inside the diagonal blocks, at 5/8 of the full product's
    /// flops.
    #[test]
    fn symmetric_products_compute_the_lower_blocks_once_then_mirror() {
        let (m, k) = (64u64, 80u64);
        let (x, c) = (1u64 << 40, 1u64 << 41);
        for matrices in [1u64, 3] {
            for (inputs, k, b_transposed) in [(GemmInputs::Bf16, k, true), (GemmInputs::F32, m, false)] {
                let full = Product::contiguous(inputs, (m, k, m), 1.0, x, x, b_transposed, 0.0, c, matrices);
                let actions = full.symmetric(16).unwrap();
                let cells = written(&actions, c, matrices, m);
                let unique: std::collections::BTreeSet<_> = cells.iter().copied().collect();
                assert_eq!(unique.len(), cells.len(), "an element is written twice");
                let leaf = m / 4;
                for b in 0..matrices {
                    for i in 0..m {
                        for j in 0..m {
                            let expected = i >= j || i / leaf == j / leaf;
                            assert_eq!(unique.contains(&(b, i, j)), expected, "({b}, {i}, {j})");
                        }
                    }
                }
                let flops: u64 = actions
                    .iter()
                    .filter_map(|a| match a {
                        Action::Gemm(g) => Some(2 * (g.m * g.n * g.k * g.batch) as u64),
                        _ => None,
                    })
                    .sum();
                assert_eq!(flops * 8, 5 * 2 * m * m * k * matrices);
            }
        }
    }
}

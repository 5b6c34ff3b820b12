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
use crate::numerics::newton_schulz::ns_coefficients;

/// One row-major product `C (m×n) = alpha·A (m×k)·op(B) + beta·C` per matrix of a batch of
/// contiguous matrices; `B` is `k×n`, or `n×k` read transposed when `b_transposed`. The same
/// call as the host's `gemm` in `numerics::newton_schulz`.
pub(super) struct Product {
    pub(super) inputs: GemmInputs,
    pub(super) m: u64,
    pub(super) k: u64,
    pub(super) n: u64,
    pub(super) alpha: f32,
    pub(super) a: DevPtr,
    pub(super) b: DevPtr,
    pub(super) b_transposed: bool,
    pub(super) beta: f32,
    pub(super) c: DevPtr,
    pub(super) batch: u64,
}

impl Product {
    /// The product as cuBLAS's column-major `Cᵀ = op(B)ᵀ·Aᵀ`: a row-major matrix is its
    /// column-major transpose, so A and B swap places and the dimensions read `n, m, k`.
    pub(super) fn gemm(self) -> Result<Action> {
        let (m, k, n) = (self.m, self.k, self.n);
        Ok(Action::Gemm(Gemm {
            inputs: self.inputs,
            transpose_a: self.b_transposed,
            m: to_i32("Newton–Schulz dimension", n)?,
            n: to_i32("Newton–Schulz dimension", m)?,
            k: to_i32("Newton–Schulz dimension", k)?,
            alpha: self.alpha,
            a: self.b,
            lda: to_i32("leading dimension", if self.b_transposed { k } else { n })?,
            stride_a: (k * n) as i64,
            b: self.a,
            ldb: to_i32("leading dimension", k)?,
            stride_b: (m * k) as i64,
            beta: self.beta,
            c: self.c,
            ldc: to_i32("leading dimension", n)?,
            stride_c: (m * n) as i64,
            batch: to_i32("batch", self.batch)?,
        }))
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
    /// (`numerics::newton_schulz`, step for step). Returns where the result is (`m × n`, per
    /// matrix) and whether it is transposed.
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
        let product = |inputs, (m, k, n), alpha, a, b, b_transposed, beta, c| Product {
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
        };
        let round = |src: DevPtr, dst: DevPtr, count: u64| {
            launch(
                Kernel::CastF32ToBf16,
                count,
                StreamKind::Compute,
                vec![Arg::Ptr(src), Arg::Ptr(dst), Arg::U64(count)],
            )
        };
        // f32 → bf16 → f32 in place: the value a bf16 store keeps, through `scratch`.
        let store_bf16 = |actions: &mut Vec<Action>, values: DevPtr, scratch: DevPtr, count: u64| {
            actions.push(round(values, scratch, count));
            let widen = vec![
                Arg::Ptr(scratch),
                Arg::I32(1),
                Arg::Ptr(values),
                Arg::I32(0),
                Arg::U64(count),
            ];
            actions.push(launch(Kernel::Cast, count, StreamKind::Compute, widen));
        };
        let copy = |src: DevPtr, dst: DevPtr, count: u64| Action::CopyDevice {
            dst,
            src,
            bytes: count * 4,
            stream: StreamKind::Compute,
        };
        let mut current = x;
        if self.muon.ns.precision == NsPrecision::Bf16Iterate {
            store_bf16(actions, x, self.work(Work::XBf16)?, batch * mn);
        }
        for step in 0..self.muon.ns.steps as usize {
            let [a, b, c] = ns_coefficients(self.muon.ns.coefficients, step);
            match self.muon.ns.precision {
                NsPrecision::Bf16 | NsPrecision::Bf16Iterate => {
                    // Bf16Iterate keeps `x` at bf16 values, with `xb` holding the same values
                    // as bf16 (`store_bf16`); `A` is stored at bf16 values before `b·A` reads it.
                    use GemmInputs::Bf16;
                    let iterate = self.muon.ns.precision == NsPrecision::Bf16Iterate;
                    let (xb, gb) = (self.work(Work::XBf16)?, self.work(Work::GramBf16)?);
                    if !iterate {
                        actions.push(round(x, xb, batch * mn));
                    }
                    actions.push(product(Bf16, (m, n, m), 1.0, xb, xb, true, 0.0, gram).gemm()?);
                    if reduce {
                        on_tp_comm(actions, all_reduce(gram, batch * mm, NcclType::F32));
                    }
                    if iterate {
                        store_bf16(actions, gram, gb, batch * mm);
                    } else {
                        actions.push(round(gram, gb, batch * mm));
                    }
                    actions.push(product(Bf16, (m, m, m), c, gb, gb, false, b, gram).gemm()?);
                    actions.push(round(gram, gb, batch * mm));
                    actions.push(product(Bf16, (m, m, n), 1.0, gb, xb, false, a, x).gemm()?);
                    if iterate {
                        store_bf16(actions, x, xb, batch * mn);
                    }
                }
                NsPrecision::F32 => {
                    use GemmInputs::F32;
                    let poly = self.work(Work::Poly)?;
                    let next = if current == x { self.work(Work::XNext)? } else { x };
                    actions.push(product(F32, (m, n, m), 1.0, current, current, true, 0.0, gram).gemm()?);
                    if reduce {
                        on_tp_comm(actions, all_reduce(gram, batch * mm, NcclType::F32));
                    }
                    actions.push(copy(gram, poly, batch * mm));
                    actions.push(product(F32, (m, m, m), c, gram, gram, false, b, poly).gemm()?);
                    actions.push(copy(current, next, batch * mn));
                    actions.push(product(F32, (m, m, n), 1.0, poly, current, false, a, next).gemm()?);
                    current = next;
                }
            }
        }
        Ok((current, transposed))
    }
}

//! The Gram Newton–Schulz iteration on the device (`numerics::newton_schulz::newton_schulz_gram`),
//! product for product, copy for copy and rounding for rounding as the host's `iterate_gram`:
//! the square products by tiles ([`Product::symmetric`]) made whole by [`symmetrize`], the two
//! products with `X` full ([`Product::gemm`]), `Q = Z + a·I` by `muon_ns_add_identity`.
//!
//! Buffers (`batch` matrices each, `Work::*`): `R` in `Gram`, `Z` in `Poly`, `Q` in `GramQ`.
//! In f32 every product reads its f32 operands whole (each result mirrored in place), so a
//! product whose `β·C` addend is one of its operands writes a copy: the next `Q` and
//! `RZ = a·R + Z·R` go to `GramSpare`, which swaps with `GramQ`. In the bf16 precisions every
//! product reads the bf16 copies `GramBf16`, `PolyBf16`, `GramQBf16`, `XBf16` (each made whole
//! from the lower triangle of its f32 matrix by `muon_ns_symmetrize`), so `Q`, `RZ` and `R`
//! are computed in place; `bf16_iterate` stores every result at bf16 values (the bf16 copy
//! widened back).

use super::collectives::{all_reduce, on_tp_comm};
use super::newton_schulz::{Product, TileTables, copy, round, store_bf16, symmetrize, widen};
use super::{Translator, launch, to_u32};
use crate::backend::cuda::action::{Action, Arg, DevPtr, GemmInputs, Kernel, NcclType, Work};
use crate::backend::ops::StreamKind;
use crate::bail;
use crate::config::NsPrecision;
use crate::error::Result;
use crate::numerics::newton_schulz::gram_restarts_at;

/// One Gram iteration's translation: its shape, buffers and the actions so far.
struct Gram<'a> {
    actions: &'a mut Vec<Action>,
    precision: NsPrecision,
    batch: u64,
    m: u64,
    n: u64,
    tables: &'a mut TileTables,
    /// Each `X·Xᵀ` all-reduced over the tensor-parallel group (a `distributed` shard).
    reduce: bool,
    /// The f32 matrices: the iterate, `R`, `Z`, `Q`.
    x: DevPtr,
    r: DevPtr,
    z: DevPtr,
    q: DevPtr,
    /// f32 precision: the other iterate and the other `Q` / `RZ` buffer (0 otherwise).
    x_next: DevPtr,
    spare: DevPtr,
    /// bf16 precisions: the bf16 copies the products read (0 otherwise).
    xb: DevPtr,
    rb: DevPtr,
    zb: DevPtr,
    qb: DevPtr,
}

impl Gram<'_> {
    fn f32(&self) -> bool {
        self.precision == NsPrecision::F32
    }

    /// What a product reads for the f32 matrix `v` whose bf16 copy is `vb`.
    fn operand(&self, v: DevPtr, vb: DevPtr) -> DevPtr {
        if self.f32() { v } else { vb }
    }

    /// `out ← α·a·b + β·out` of square matrices, `b` of `k`-long rows read transposed when
    /// `b_transposed` (`X·Xᵀ`), by tiles: the upper triangle is left to [`Gram::settle`].
    #[allow(clippy::too_many_arguments)]
    fn symmetric(
        &mut self,
        k: u64,
        alpha: f32,
        a: DevPtr,
        b: DevPtr,
        b_transposed: bool,
        beta: f32,
        out: DevPtr,
    ) -> Result<()> {
        let inputs = if self.f32() { GemmInputs::F32 } else { GemmInputs::Bf16 };
        let product = Product::contiguous(
            inputs,
            (self.m, k, self.m),
            alpha,
            a,
            b,
            b_transposed,
            beta,
            out,
            self.batch,
        );
        self.actions.extend(product.symmetric(self.tables)?);
        Ok(())
    }

    /// The symmetric result at `v` made whole as the host stores it: mirrored in place (f32),
    /// or its bf16 copy `vb` made whole (bf16) and widened back into `v` (bf16_iterate).
    fn settle(&mut self, v: DevPtr, vb: DevPtr) -> Result<()> {
        let (batch, m) = (self.batch, self.m);
        match self.precision {
            NsPrecision::F32 => self.actions.push(symmetrize(v, v, false, batch, m)?),
            NsPrecision::Bf16 => self.actions.push(symmetrize(v, vb, true, batch, m)?),
            NsPrecision::Bf16Iterate => {
                self.actions.push(symmetrize(v, vb, true, batch, m)?);
                self.actions.push(widen(vb, v, batch * m * m));
            }
        }
        Ok(())
    }

    /// `R = X·Xᵀ`, completed over the shards, stored.
    fn gram(&mut self) -> Result<()> {
        let (x, r, n) = (self.x, self.r, self.n);
        // bf16_iterate keeps `XBf16` equal to the stored `X`; bf16 rounds the f32 `X`.
        if self.precision == NsPrecision::Bf16 {
            self.actions.push(round(x, self.xb, self.batch * self.m * n));
        }
        let xs = self.operand(x, self.xb);
        self.symmetric(n, 1.0, xs, xs, true, 0.0, r)?;
        if self.reduce {
            on_tp_comm(self.actions, all_reduce(r, self.batch * self.m * self.m, NcclType::F32));
        }
        self.settle(r, self.rb)
    }

    /// `Z = b·R + c·R·R`, stored.
    fn poly(&mut self, b: f32, c: f32) -> Result<()> {
        let (r, z, m) = (self.r, self.z, self.m);
        let rs = self.operand(r, self.rb);
        self.actions.push(copy(r, z, self.batch * m * m));
        self.symmetric(m, c, rs, rs, false, b, z)?;
        self.settle(z, self.zb)
    }

    /// `Q = Z + a·I`, stored (in f32 `Z` is whole already, and so is `Q`).
    fn first_q(&mut self, a: f32) -> Result<()> {
        let (z, q, batch, m) = (self.z, self.q, self.batch, self.m);
        self.actions.push(launch(
            Kernel::NsAddIdentity,
            batch * m * m,
            StreamKind::Compute,
            vec![
                Arg::Ptr(z),
                Arg::Ptr(q),
                Arg::F32(a),
                Arg::U32(to_u32("batch", batch)?),
                Arg::U32(to_u32("rows", m)?),
            ],
        ));
        if self.f32() { Ok(()) } else { self.settle(q, self.qb) }
    }

    /// `Q = a·Q + Z·Q`, stored: in f32 into the spare buffer (a copy of `Q`), which becomes `Q`.
    fn next_q(&mut self, a: f32) -> Result<()> {
        let (z, q, m) = (self.z, self.q, self.m);
        if self.f32() {
            let next = self.spare;
            self.actions.push(copy(q, next, self.batch * m * m));
            self.symmetric(m, 1.0, z, q, false, a, next)?;
            self.settle(next, 0)?;
            (self.q, self.spare) = (next, q);
            Ok(())
        } else {
            self.symmetric(m, 1.0, self.zb, self.qb, false, a, q)?;
            self.settle(q, self.qb)
        }
    }

    /// `RZ = a·R + Z·R`, then `R = a·RZ + Z·RZ`, each stored: `R` of the next step's iterate.
    /// In f32 `RZ` is a copy of `R` in the spare buffer; in bf16 both products run in place.
    fn update_r(&mut self, a: f32) -> Result<()> {
        let (r, z, m, count) = (self.r, self.z, self.m, self.batch * self.m * self.m);
        if self.f32() {
            let rz = self.spare;
            self.actions.push(copy(r, rz, count));
            self.symmetric(m, 1.0, z, r, false, a, rz)?;
            self.settle(rz, 0)?;
            self.actions.push(copy(rz, r, count));
            self.symmetric(m, 1.0, z, rz, false, a, r)?;
            self.settle(r, 0)
        } else {
            for _ in 0..2 {
                self.symmetric(m, 1.0, self.zb, self.rb, false, a, r)?;
                self.settle(r, self.rb)?;
            }
            Ok(())
        }
    }

    /// `X = Q·X`, stored: in f32 into the other iterate buffer, in bf16 in place (the
    /// product reads the bf16 copies).
    fn apply(&mut self) -> Result<()> {
        let (m, n, batch) = (self.m, self.n, self.batch);
        let (inputs, q, x, out) = if self.f32() {
            (GemmInputs::F32, self.q, self.x, self.x_next)
        } else {
            (GemmInputs::Bf16, self.qb, self.xb, self.x)
        };
        let product = Product::contiguous(inputs, (m, m, n), 1.0, q, x, false, 0.0, out, batch);
        self.actions.push(product.gemm()?);
        match self.precision {
            NsPrecision::F32 => (self.x, self.x_next) = (self.x_next, self.x),
            NsPrecision::Bf16 => {}
            NsPrecision::Bf16Iterate => store_bf16(self.actions, self.x, self.xb, batch * m * n),
        }
        Ok(())
    }
}

impl Translator {
    /// The Gram iteration (`numerics::newton_schulz::newton_schulz_gram`) on the normalized
    /// iterate at `x` (`batch` matrices of `m × n`, stored as the precision stores them), each
    /// `X·Xᵀ` all-reduced over the tensor-parallel group when `reduce` (the products with `Q`
    /// are shard-local). Returns where the result is.
    pub(super) fn iterate_gram(
        &self,
        actions: &mut Vec<Action>,
        x: DevPtr,
        (m, n): (u64, u64),
        batch: u64,
        reduce: bool,
        tables: &mut TileTables,
    ) -> Result<DevPtr> {
        let ns = &self.muon.ns;
        if batch * m * m > self.work.gram_iteration {
            bail!(
                Internal,
                "newton_schulz: the Gram iteration of {batch}×{m}×{n} exceeds the workspace sized at allocate"
            );
        }
        let f32 = ns.precision == NsPrecision::F32;
        let only = |yes: bool, work: Work| if yes { self.work(work) } else { Ok(0) };
        let mut gram = Gram {
            actions,
            precision: ns.precision,
            batch,
            m,
            n,
            tables,
            reduce,
            x,
            r: self.work(Work::Gram)?,
            z: self.work(Work::Poly)?,
            q: self.work(Work::GramQ)?,
            x_next: only(f32, Work::XNext)?,
            spare: only(f32, Work::GramSpare)?,
            xb: only(!f32, Work::XBf16)?,
            rb: only(!f32, Work::GramBf16)?,
            zb: only(!f32, Work::PolyBf16)?,
            qb: only(!f32, Work::GramQBf16)?,
        };
        let steps = ns.steps as usize;
        gram.gram()?;
        let mut accumulated = false;
        for step in 0..steps {
            if gram_restarts_at(step) {
                gram.apply()?;
                gram.gram()?;
                accumulated = false;
            }
            let [a, b, c] = ns.coefficients_at(step);
            gram.poly(b, c)?;
            if accumulated {
                gram.next_q(a)?;
            } else {
                gram.first_q(a)?;
                accumulated = true;
            }
            if step + 1 < steps && !gram_restarts_at(step + 1) {
                gram.update_r(a)?;
            }
        }
        gram.apply()?;
        Ok(gram.x)
    }
}

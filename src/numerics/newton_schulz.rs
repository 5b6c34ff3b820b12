//! Host Newton–Schulz orthogonalization (docs/design.md §6, step 3).
//!
//! For an input `U` of `rows × cols`:
//! 1. if `rows > cols`, work on `Uᵀ` so the Gram matrix is the smaller one; below, `X` is
//!    `m × n` with `m = min(rows, cols)`, `n = max(rows, cols)`;
//! 2. `X = U / max(‖U‖_F, eps)` (`eps` = `muon_ns_eps`, 1e-7 by default as in Megatron-LM,
//!    see [`crate::config::DEFAULT_NS_EPS`]; the squared norm is
//!    summed in f64, see [`squared_norm`]; the quotient is an f32 division by the f32 norm);
//! 3. for `t` in `0..steps`, with `(a, b, c)` = [`ns_coefficients`]`(set, table, t)`:
//!    `A = X·Xᵀ`, `B = b·A + c·A·A`, `X = a·X + B·X`;
//! 4. transpose back if step 1 transposed.
//!
//! Every matrix product is [`gemm`] (`C ← α·A·B + β·C`, faer): `A` is formed as
//! `gemm(α = 1, X, Xᵀ, β = 0)`, `B` as `gemm(α = c, A, A, β = b, C = copy of A)` and the new
//! `X` as `gemm(α = 1, B, X, β = a, C = copy of X)`. `A` and `B` are symmetric, so only their
//! lower triangles are computed and then mirrored ([`Output::SymmetricLower`]): about
//! `3·m²·n + m³` flops per step instead of `4·m²·n + 2·m³`. The CUDA backend computes the
//! tiles of side `symmetric_tile` (128 by default) on and below the diagonal, which gives
//! the lower triangle the same bits: at order 4096, `(2 + 33/32)·m²·n + (33/32)·m³` flops.
//! The products use the workspace's thread count ([`NsWorkspace::with_threads`]); the result
//! does not depend on it.
//!
//! Precision ([`NsPrecision`]):
//! - `F32`: every operand, product, accumulation and output is f32.
//! - `Bf16`: bf16 GEMM inputs with f32 accumulation. The two operands of every product
//!   (`X` and `Xᵀ` in `X·Xᵀ`, `A` and `A` in `A·A`, `B` and `X` in `B·X`) are rounded to bf16
//!   (round to nearest even) before multiplying; the accumulation, the `β·C` addends
//!   (`b·A` and `a·X` use the unrounded f32 `A` and `X`) and every stored result stay f32.
//!   This is what cuBLAS computes with bf16 A/B, f32 C and `CUBLAS_COMPUTE_32F`, up to the
//!   order of accumulation; the CUDA backend uses exactly that.
//! - `Bf16Iterate`: Megatron-LM's `--muon-fp32-matmul-prec medium` (Emerging-Optimizers'
//!   `newton_schulz` converts the normalized `X` to bf16 and runs every step in bf16): the
//!   normalized `X` and the results `A`, `B` and the next `X` are each rounded to bf16 once,
//!   so every operand and every `β·C` addend is a bf16 value; products accumulate in f32.

use crate::bail;
use crate::config::{CoefficientSet, Config, MAX_NS_STEPS, NsMethod, NsPrecision, check_coefficients};
use crate::error::Result;
use crate::numerics::bf16::{
    round_slice_through_bf16_in_place, round_through_bf16, round_through_bf16_and_scale, scale_then_round_through_bf16,
};
use crate::numerics::gemm::{Output, Strides, gemm};
use crate::numerics::simd;
use crate::numerics::squared_norm;
use crate::numerics::transpose::transpose_map;

mod coefficients;

pub use coefficients::{CustomCoefficients, ns_coefficients};

/// What a Newton–Schulz run computes: coefficient set, number of steps, product precision,
/// normalization floor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NsOptions {
    /// The coefficient schedule.
    pub coefficients: CoefficientSet,
    /// The caller's table of the `custom` set ([`CustomCoefficients::NONE`] otherwise).
    pub custom: CustomCoefficients,
    /// Number of iterations, `1..=MAX_NS_STEPS`.
    pub steps: u32,
    /// Precision of the matrix products.
    pub precision: NsPrecision,
    /// Floor of the input's Frobenius norm in the normalization (`muon_ns_eps`).
    pub eps: f32,
    /// Side of the CUDA backend's tiles of the symmetric products
    /// (`numerics::gemm::SymmetricTiles`); the host's products have the same bits whatever it
    /// is.
    pub symmetric_tile: usize,
    /// The iteration: standard, or Gram where [`gram_applies`] holds.
    pub method: NsMethod,
}

impl NsOptions {
    /// The Newton–Schulz fields of a configuration.
    pub fn from_config(cfg: &Config) -> Self {
        NsOptions {
            coefficients: cfg.muon_coefficient_set,
            custom: CustomCoefficients::new(&cfg.muon_custom_coefficients),
            steps: cfg.muon_num_ns_steps,
            precision: cfg.muon_ns_precision,
            eps: cfg.muon_ns_eps,
            symmetric_tile: cfg.muon_ns_symmetric_tile as usize,
            method: cfg.muon_ns_method,
        }
    }

    /// Checks `steps` and the coefficients ([`check_coefficients`]).
    ///
    /// # Errors
    /// `OutOfRange` if `steps` is outside `1..=MAX_NS_STEPS` or the `custom` table is empty or
    /// holds a non-finite value; `IncompatibleOptions` for a fixed schedule run with another
    /// step count, or a table with a named set.
    pub fn validate(&self) -> Result<()> {
        if self.steps == 0 || self.steps > MAX_NS_STEPS {
            bail!(
                OutOfRange,
                "newton_schulz: steps {} is outside 1..={MAX_NS_STEPS}",
                self.steps
            );
        }
        check_coefficients(
            ("coefficient_set", self.coefficients),
            ("steps", self.steps),
            ("custom coefficients", self.custom.as_slice()),
        )
    }

    /// The `(a, b, c)` triple of step `step` ([`ns_coefficients`]).
    pub fn coefficients_at(&self, step: usize) -> [f32; 3] {
        ns_coefficients(self.coefficients, self.custom.as_slice(), step)
    }
}

/// Scratch memory of the Newton–Schulz iteration, reused across calls.
///
/// A workspace made by [`NsWorkspace::new`]`(max_rows, max_cols)` never allocates for a matrix
/// with `rows <= max_rows` and `cols <= max_cols` (either orientation of the same bound works
/// too, since only `rows·cols` and `min(rows, cols)` matter); [`NsWorkspace::for_need`] sizes
/// it by those two figures directly. Larger matrices grow it once. `NsWorkspace::default()`
/// starts empty, runs its products on the calling thread, and grows on first use.
#[derive(Debug, Clone, Default)]
pub struct NsWorkspace {
    /// Threads of every matrix product (0 and 1: the calling thread).
    threads: usize,
    /// The iterate `X`, `m × n`.
    x: Vec<f32>,
    /// The next iterate, `m × n`.
    x_next: Vec<f32>,
    /// `X` rounded to bf16 (bf16 precision only), `m × n`.
    x_bf16: Vec<f32>,
    /// `A = X·Xᵀ`, `m × m`.
    gram: Vec<f32>,
    /// `B = b·A + c·A·A`, `m × m`.
    poly: Vec<f32>,
    /// The Gram iteration's matrices, grown on its first use (fallibly: `OutOfMemory`).
    gram_iteration: GramBuffers,
}

/// The buffers of [`NsWorkspace::iterate_gram`] beside the workspace's own (`R` in `gram`, `Z`
/// in `poly`): `Q` and `RZ` (`m × m`), and the operands as the products read them where they
/// differ from the stored values (`X`: `m × n`; `R`, `Z`, `Q`: `m × m`).
#[derive(Debug, Clone, Default)]
struct GramBuffers {
    q: Vec<f32>,
    rz: Vec<f32>,
    x_op: Vec<f32>,
    r_op: Vec<f32>,
    z_op: Vec<f32>,
    q_op: Vec<f32>,
}

impl GramBuffers {
    /// Grows every buffer for an `m × n` iterate; on failure nothing is used.
    fn grow(&mut self, mn: usize, mm: usize) -> Result<()> {
        let squares = [
            &mut self.q,
            &mut self.rz,
            &mut self.r_op,
            &mut self.z_op,
            &mut self.q_op,
        ];
        for (buffer, len) in squares.into_iter().map(|b| (b, mm)).chain([(&mut self.x_op, mn)]) {
            if buffer.len() < len {
                if buffer.try_reserve_exact(len - buffer.len()).is_err() {
                    bail!(
                        OutOfMemory,
                        "newton_schulz: the Gram iteration's {mm}-element matrices do not fit in host memory"
                    );
                }
                buffer.resize(len, 0.0);
            }
        }
        Ok(())
    }
}

impl NsWorkspace {
    /// A workspace sized for every matrix up to `max_rows × max_cols`, in both precisions.
    pub fn new(max_rows: usize, max_cols: usize) -> Self {
        let mut ws = NsWorkspace::default();
        ws.reserve(max_rows, max_cols, max_rows > max_cols, NsPrecision::Bf16);
        ws
    }

    /// A workspace for every matrix of at most `elements` elements whose shorter side is at
    /// most `short_side`, in `precision`.
    ///
    /// # Errors
    /// `OutOfMemory` (naming the bytes) if the allocation fails; nothing is allocated then.
    pub fn for_need(elements: usize, short_side: usize, precision: NsPrecision) -> Result<Self> {
        let gram = short_side.checked_mul(short_side);
        let sizes = [
            Some(elements),
            Some(elements),
            gram,
            gram,
            Some(if precision == NsPrecision::Bf16 { elements } else { 0 }),
        ];
        let mut buffers: [Vec<f32>; 5] = Default::default();
        for (buffer, len) in buffers.iter_mut().zip(sizes) {
            let reserved = len.map(|len| buffer.try_reserve_exact(len).map(|()| buffer.resize(len, 0.0)));
            if !matches!(reserved, Some(Ok(()))) {
                bail!(
                    OutOfMemory,
                    "newton_schulz: a workspace for {elements} elements with a {short_side}² Gram matrix does not fit in host memory"
                );
            }
        }
        let [x, x_next, gram, poly, x_bf16] = buffers;
        Ok(NsWorkspace {
            threads: 0,
            x,
            x_next,
            x_bf16,
            gram,
            poly,
            gram_iteration: GramBuffers::default(),
        })
    }

    /// The same workspace running every matrix product on `threads` threads.
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    fn reserve(&mut self, rows: usize, cols: usize, transpose: bool, precision: NsPrecision) {
        let mn = rows * cols;
        let m = if transpose { cols } else { rows };
        grow(&mut self.x, mn);
        grow(&mut self.x_next, mn);
        grow(&mut self.gram, m * m);
        grow(&mut self.poly, m * m);
        if precision == NsPrecision::Bf16 {
            grow(&mut self.x_bf16, mn);
        }
    }

    /// Runs the whole iteration on `input` (`rows × cols`, validated) and leaves the result in
    /// `self.x` as `m × n` (transposed when `rows > cols`).
    fn orthogonalize(&mut self, input: &[f32], rows: usize, cols: usize, opts: &NsOptions) {
        self.orthogonalize_sharded(input, rows, cols, rows > cols, opts, None)
            .expect("without shard sums nothing fails");
    }

    /// [`Self::orthogonalize`] with the orientation given (`transpose`: work on `inputᵀ`) and,
    /// for one shard of a matrix split along the columns of `X`, the squared norm and every
    /// Gram matrix completed over the shards by `sums`.
    fn orthogonalize_sharded(
        &mut self,
        input: &[f32],
        rows: usize,
        cols: usize,
        transpose: bool,
        opts: &NsOptions,
        mut sums: Option<&mut dyn ShardSums>,
    ) -> Result<()> {
        let (m, n) = self.normalize(input, rows, cols, transpose, opts, sums.as_deref_mut())?;
        if runs_gram(m, n, opts) {
            self.iterate_gram(m, n, opts, sums)
        } else {
            self.iterate(m, n, opts, sums)
        }
    }

    /// Step 2 of the module documentation: `self.x` ← the normalized input (`inputᵀ` with
    /// `transpose`), the norm completed by `sums` for a shard. Returns the iterate's `(m, n)`.
    fn normalize(
        &mut self,
        input: &[f32],
        rows: usize,
        cols: usize,
        transpose: bool,
        opts: &NsOptions,
        sums: Option<&mut (dyn ShardSums + '_)>,
    ) -> Result<(usize, usize)> {
        self.reserve(rows, cols, transpose, opts.precision);
        let local = squared_norm(input);
        let total = match sums {
            Some(sums) => sums.norm(local)?,
            None => local,
        };
        let norm = (total.sqrt() as f32).max(opts.eps);
        let x = &mut self.x[..rows * cols];
        if transpose {
            transpose_map(input, rows, cols, x, |v| v / norm);
        } else {
            simd::widest(|| {
                for (d, &s) in x.iter_mut().zip(input) {
                    *d = s / norm;
                }
            });
        }
        if opts.precision == NsPrecision::Bf16Iterate {
            round_slice_through_bf16_in_place(x);
        }
        Ok(if transpose { (cols, rows) } else { (rows, cols) })
    }

    fn iterate(&mut self, m: usize, n: usize, opts: &NsOptions, mut sums: Option<&mut dyn ShardSums>) -> Result<()> {
        let (mn, mm) = (m * n, m * m);
        let bf16 = opts.precision == NsPrecision::Bf16;
        // Megatron-LM's scheme: X, A = X·Xᵀ, B = b·A + c·A·A and the next X are each stored in
        // bf16, so every product reads bf16 values and its result is rounded once.
        let stored_bf16 = opts.precision == NsPrecision::Bf16Iterate;
        let NsWorkspace {
            threads,
            x,
            x_next,
            x_bf16,
            gram,
            poly,
            gram_iteration: _,
        } = self;
        let threads = *threads;
        let (wide, square) = (Strides::row_major(m, n), Strides::row_major(m, m));
        for step in 0..opts.steps as usize {
            let [a, b, c] = opts.coefficients_at(step);
            // The next X starts as a·X (the last product adds B·X to it, as gemm's β = a pass
            // would scale it: the same f32 products); in bf16 the products read X rounded, made
            // in the same pass.
            let x_operand: &[f32] = if bf16 {
                round_through_bf16_and_scale(&x[..mn], &mut x_bf16[..mn], &mut x_next[..mn], a);
                &x_bf16[..mn]
            } else {
                scale_into(&x[..mn], &mut x_next[..mn], a);
                &x[..mn]
            };
            let (xs, gram, poly) = ((x_operand, wide), &mut gram[..mm], &mut poly[..mm]);
            gemm(
                1.0,
                xs,
                (x_operand, wide.transposed()),
                0.0,
                (gram, square),
                Output::SymmetricLower,
                threads,
            );
            if let Some(sums) = sums.as_deref_mut() {
                sums.gram(gram)?;
            }
            if stored_bf16 {
                round_slice_through_bf16_in_place(gram);
            }
            // B starts as b·A (likewise gemm's β = b pass, made here).
            if bf16 {
                scale_then_round_through_bf16(gram, poly, b);
            } else {
                scale_into(gram, poly, b);
            }
            let gram: &[f32] = gram;
            gemm(
                c,
                (gram, square),
                (gram, square),
                prescaled(b),
                (poly, square),
                Output::SymmetricLower,
                threads,
            );
            if bf16 || stored_bf16 {
                round_slice_through_bf16_in_place(poly);
            }
            let poly: &[f32] = poly;
            gemm(
                1.0,
                (poly, square),
                xs,
                prescaled(a),
                (&mut x_next[..mn], wide),
                Output::Full,
                threads,
            );
            if stored_bf16 {
                round_slice_through_bf16_in_place(&mut x_next[..mn]);
            }
            std::mem::swap(x, x_next);
        }
        Ok(())
    }

    /// [`Self::orthogonalize`] by the Gram iteration whatever the shape and options.
    fn orthogonalize_gram_always(&mut self, input: &[f32], rows: usize, cols: usize, opts: &NsOptions) {
        let (m, n) = self
            .normalize(input, rows, cols, rows > cols, opts, None)
            .expect("without shard sums nothing fails");
        self.iterate_gram(m, n, opts, None)
            .expect("without shard sums nothing fails");
    }

    /// The Gram iteration of [`newton_schulz_gram`] on the normalized `m × n` iterate in
    /// `self.x`, each `X·Xᵀ` completed over the shards by `sums` (the products with `Q` are
    /// shard-local: `Q` is the same `m × m` matrix on every shard).
    fn iterate_gram(
        &mut self,
        m: usize,
        n: usize,
        opts: &NsOptions,
        mut sums: Option<&mut dyn ShardSums>,
    ) -> Result<()> {
        let (mn, mm) = (m * n, m * m);
        let (wide, square) = (Strides::row_major(m, n), Strides::row_major(m, m));
        let rounded = opts.precision != NsPrecision::F32;
        let stored = opts.precision == NsPrecision::Bf16Iterate;
        let NsWorkspace {
            threads,
            x,
            x_next,
            x_bf16: _,
            gram: r,
            poly: z,
            gram_iteration: buffers,
        } = self;
        let threads = *threads;
        buffers.grow(mn, mm)?;
        let GramBuffers {
            q,
            rz,
            x_op: xs,
            r_op,
            z_op,
            q_op,
        } = buffers;
        let (r, z, q, rz) = (&mut r[..mm], &mut z[..mm], &mut q[..mm], &mut rz[..mm]);
        // An operand as the product reads it: its bf16 values in `scratch` in both bf16
        // precisions, the stored values themselves in f32.
        fn read<'a>(values: &'a [f32], scratch: &'a mut [f32], rounded: bool) -> &'a [f32] {
            if rounded { copy(values, scratch, true) } else { values }
        }
        // The operand in `scratch`, rounded to bf16 values when `rounded`.
        fn copy<'a>(values: &[f32], scratch: &'a mut [f32], rounded: bool) -> &'a [f32] {
            let scratch = &mut scratch[..values.len()];
            let value = |v: f32| if rounded { round_through_bf16(v) } else { v };
            scratch.iter_mut().zip(values).for_each(|(s, &v)| *s = value(v));
            scratch
        }
        let store = |values: &mut [f32]| {
            if stored {
                round_slice_through_bf16_in_place(values);
            }
        };
        let symmetric = Output::SymmetricLower;
        // out ← α·lhs·rhs + β·out, a symmetric product of square matrices, stored.
        let square_product = |alpha: f32, lhs: &[f32], rhs: &[f32], beta: f32, out: &mut [f32]| {
            gemm(
                alpha,
                (lhs, square),
                (rhs, square),
                beta,
                (&mut *out, square),
                symmetric,
                threads,
            );
            store(out);
        };
        // R = X·Xᵀ, completed over the shards.
        let gram = |x: &[f32], xs: &mut [f32], r: &mut [f32], sums: &mut Option<&mut dyn ShardSums>| {
            let xs = read(x, xs, rounded);
            gemm(
                1.0,
                (xs, wide),
                (xs, wide.transposed()),
                0.0,
                (&mut *r, square),
                symmetric,
                threads,
            );
            if let Some(sums) = sums.as_deref_mut() {
                sums.gram(r)?;
            }
            store(r);
            Ok::<(), crate::error::Error>(())
        };
        // X ← Q·X: into the other iterate buffer, which becomes the iterate.
        let apply = |q: &[f32], q_op: &mut [f32], x: &mut Vec<f32>, xs: &mut [f32], next: &mut Vec<f32>| {
            let (q, xs) = (read(q, q_op, rounded), read(&x[..mn], xs, rounded));
            gemm(
                1.0,
                (q, square),
                (xs, wide),
                0.0,
                (&mut next[..mn], wide),
                Output::Full,
                threads,
            );
            store(&mut next[..mn]);
            std::mem::swap(x, next);
        };
        gram(&x[..mn], xs, r, &mut sums)?;
        let mut accumulated = false;
        for step in 0..opts.steps as usize {
            if gram_restarts_at(step) {
                apply(q, q_op, x, xs, x_next);
                gram(&x[..mn], xs, r, &mut sums)?;
                accumulated = false;
            }
            let [a, b, c] = opts.coefficients_at(step);
            // Z = b·R + c·R·R.
            z.copy_from_slice(r);
            let r_read = read(r, r_op, rounded);
            square_product(c, r_read, r_read, b, z);
            let z_read = read(z, z_op, rounded);
            if accumulated {
                // Q = a·Q + Z·Q: Q is read from a copy (it is also the output).
                let q_read = copy(q, q_op, rounded);
                square_product(1.0, z_read, q_read, a, q);
            } else {
                // Q = Z + a·I.
                q.copy_from_slice(z);
                (0..m).for_each(|i| q[i * m + i] += a);
                store(q);
                accumulated = true;
            }
            if step + 1 < opts.steps as usize && !gram_restarts_at(step + 1) {
                // R = (a·I + Z)·R·(a·I + Z) as RZ = a·R + Z·R, R = a·RZ + Z·RZ.
                rz.copy_from_slice(r);
                square_product(1.0, z_read, r_read, a, rz);
                let rz_read = read(rz, r_op, rounded);
                r.copy_from_slice(rz);
                square_product(1.0, z_read, rz_read, a, r);
            }
        }
        apply(q, q_op, x, xs, x_next);
        Ok(())
    }

    /// Writes the result of [`Self::orthogonalize`] into `output` (`rows × cols`).
    fn store(&self, output: &mut [f32], rows: usize, cols: usize) {
        self.store_oriented(output, rows, cols, rows > cols);
    }

    fn store_oriented(&self, output: &mut [f32], rows: usize, cols: usize, transposed: bool) {
        let x = &self.x[..rows * cols];
        if transposed {
            transpose_map(x, cols, rows, output, |v| v);
        } else {
            output.copy_from_slice(x);
        }
    }
}

/// `dst` ← `factor·src`, each product rounded to f32 ([`simd::widest`]).
fn scale_into(src: &[f32], dst: &mut [f32], factor: f32) {
    simd::widest(|| {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = factor * s;
        }
    });
}

/// The `β` of a product whose output was scaled by `coefficient` beforehand: 1 (add to it), or
/// 0 (overwrite it) for a zero coefficient, as a `β = 0` product overwrites its output.
fn prescaled(coefficient: f32) -> f32 {
    if coefficient == 0.0 { 0.0 } else { 1.0 }
}

fn grow(buffer: &mut Vec<f32>, len: usize) {
    if buffer.len() < len {
        buffer.resize(len, 0.0);
    }
}

/// Checks that `len` holds exactly a `rows × cols` matrix with both dimensions >= 1.
fn check_matrix(what: &str, len: usize, rows: usize, cols: usize) -> Result<()> {
    if rows == 0 || cols == 0 {
        bail!(
            InvalidArgument,
            "newton_schulz: {what} is {rows}×{cols}; both dimensions must be >= 1"
        );
    }
    match rows.checked_mul(cols) {
        Some(elems) if elems == len => Ok(()),
        _ => bail!(
            InvalidArgument,
            "newton_schulz: {what} has {len} elements, expected {rows}×{cols}"
        ),
    }
}

/// Orthogonalizes `input` (`rows × cols`, row-major) into `output` (same shape).
///
/// See the module documentation for the algorithm and the precision modes.
///
/// # Errors
/// `InvalidArgument` if a dimension is 0 or a slice length is not `rows·cols`; `OutOfRange` if
/// `opts.steps` is outside `1..=MAX_NS_STEPS`.
pub fn newton_schulz(
    input: &[f32],
    output: &mut [f32],
    rows: usize,
    cols: usize,
    opts: &NsOptions,
    ws: &mut NsWorkspace,
) -> Result<()> {
    checked_into(input, output, rows, cols, opts, ws, NsWorkspace::orthogonalize)
}

/// Checks the arguments of [`newton_schulz`] or [`newton_schulz_gram`], runs `iteration` and
/// stores its result into `output`.
fn checked_into(
    input: &[f32],
    output: &mut [f32],
    rows: usize,
    cols: usize,
    opts: &NsOptions,
    ws: &mut NsWorkspace,
    iteration: fn(&mut NsWorkspace, &[f32], usize, usize, &NsOptions),
) -> Result<()> {
    opts.validate()?;
    check_matrix("input", input.len(), rows, cols)?;
    check_matrix("output", output.len(), rows, cols)?;
    iteration(ws, input, rows, cols, opts);
    ws.store(output, rows, cols);
    Ok(())
}

/// The step at which [`newton_schulz_gram`] recomputes the iterate from the input: Dao AI Lab's
/// and DeepSpeed's `restart_at = 2` (DeepSpeed `deepspeed/runtime/zero/muon/original_muon.py`,
/// commit 8a77f381, "Add Gram Newton-Schulz orthogonalization"; tridao.me/blog/2026/gram-newton-schulz).
pub const GRAM_RESTART_STEP: usize = 2;

/// Steps at which [`newton_schulz_gram`] restarts: [`GRAM_RESTART_STEP`], then every
/// [`GRAM_RESTART_EVERY`] steps.
pub fn gram_restarts_at(step: usize) -> bool {
    step >= GRAM_RESTART_STEP && (step - GRAM_RESTART_STEP).is_multiple_of(GRAM_RESTART_EVERY)
}

/// Steps between the restarts after the first: up to 5 steps the schedule is the published one
/// (one restart, at step 2); without more, 8 and 10 steps in f32 reach 5× to 100× the standard
/// iteration's distance to the polar factor on ill-conditioned inputs, with a restart every 3
/// steps at most 1.0× (the accuracy study).
pub const GRAM_RESTART_EVERY: usize = 3;

/// The narrowest iterate (`n / m`, long side over short side) [`newton_schulz_gram`] iterates
/// on the Gram matrix; narrower ones take the standard iteration. Five steps cost
/// `8·m²·n + 28·m³` flops by the Gram iteration against `20·m²·n + 10·m³` (full products):
/// equal at `n/m = 1.5`. With symmetric products by tiles (`X·Xᵀ` and every square product
/// about half) the break-even falls to `n/m ≈ 1`; the accuracy study's 1.5 is kept, and
/// square matrices, where the Gram iteration saves nothing, always take the standard path.
pub const GRAM_MIN_ASPECT: f64 = 1.5;

/// Orthogonalizes `input` (`rows × cols`) into `output` by the Gram Newton–Schulz iteration:
/// the same polynomial steps as [`newton_schulz`], carried on the `m × m` Gram matrix instead
/// of the `m × n` iterate. With `X` the normalized input (as [`newton_schulz`]) and
/// `(a, b, c)` the step's coefficients:
/// 1. `R = X·Xᵀ`; `Q` is not yet accumulated;
/// 2. each step: `Z = b·R + c·R·R`; `Q = Z + a·I` on the first step after a (re)start, else
///    `Q = a·Q + Z·Q`; unless it is the last step or the one before the restart,
///    `RZ = a·R + Z·R` and `R = a·RZ + Z·RZ` (so `R` stays `X_t·X_tᵀ` of the iterate the
///    standard method would hold);
/// 3. at step [`GRAM_RESTART_STEP`] and every [`GRAM_RESTART_EVERY`] steps after it
///    (restart; [`gram_restarts_at`]): `X = Q·X`, `R = X·Xᵀ`, `Q` restarts — the
///    products of the first steps' polynomials are folded into the iterate before their
///    rounding errors grow;
/// 4. the result is `Q·X`, transposed back for a tall input.
///
/// Every square product is symmetric (polynomials in one symmetric matrix commute) and
/// computed as [`Output::SymmetricLower`]; the two products with `X` are full. Precision of
/// each product: `F32` all f32; `Bf16` operands rounded to bf16, accumulation, `β·C` addends
/// and results f32; `Bf16Iterate` additionally stores `R`, `Z`, `Q`, `RZ` and `X` at bf16
/// values. This is [`newton_schulz`] with `opts.method` = [`NsMethod::Gram`]: where
/// [`gram_applies`] does not hold, the standard steps run instead.
///
/// # Errors
/// As [`newton_schulz`].
pub fn newton_schulz_gram(
    input: &[f32],
    output: &mut [f32],
    rows: usize,
    cols: usize,
    opts: &NsOptions,
    ws: &mut NsWorkspace,
) -> Result<()> {
    let opts = NsOptions {
        method: NsMethod::Gram,
        ..*opts
    };
    newton_schulz(input, output, rows, cols, &opts, ws)
}

/// Whether [`newton_schulz_gram`] runs the Gram iteration on an `m × n` iterate (`m ≤ n`):
/// `n/m ≥ GRAM_MIN_ASPECT` (flops), and in the bf16 precisions at most 5 steps of `quintic`,
/// `quintic_cyclic` or `simple`, the sets the study below found accurate (the other sets, whose
/// first coefficients are as large as `polar_express`'s or which the study has not covered,
/// keep the standard iteration in bf16). The accuracy study (`tests/numerics_ns_accuracy.rs`,
/// docs/newton-schulz.md) finds the Gram iteration within 1.5× the standard iteration's
/// distance to the polar factor in every f32 case and in bf16 with up to 5 steps, except
/// `polar_express` (1.54×); in bf16 with 8 or 10 steps it loses the small singular values of
/// ill-conditioned and low-rank inputs (their squares in `R` fall below bf16's resolution):
/// up to 16× and worse.
pub fn gram_applies(m: usize, n: usize, opts: &NsOptions) -> bool {
    let studied_in_bf16 = matches!(
        opts.coefficients,
        CoefficientSet::Quintic | CoefficientSet::QuinticCyclic | CoefficientSet::Simple
    );
    let accurate = opts.precision == NsPrecision::F32 || (opts.steps <= 5 && studied_in_bf16);
    (n as f64) >= GRAM_MIN_ASPECT * m as f64 && accurate
}

/// Whether Newton–Schulz with `opts` runs the Gram iteration on an `m × n` iterate: the
/// method is [`NsMethod::Gram`] and [`gram_applies`] holds. The host and the CUDA translation
/// both dispatch on it, and the workspaces are sized by it.
pub fn runs_gram(m: usize, n: usize, opts: &NsOptions) -> bool {
    opts.method == NsMethod::Gram && gram_applies(m, n, opts)
}

/// The Gram iteration of [`newton_schulz_gram`] whatever the shape and options, for studies
/// of where [`gram_applies`] should hold.
///
/// # Errors
/// As [`newton_schulz`].
pub fn newton_schulz_gram_always(
    input: &[f32],
    output: &mut [f32],
    rows: usize,
    cols: usize,
    opts: &NsOptions,
    ws: &mut NsWorkspace,
) -> Result<()> {
    checked_into(
        input,
        output,
        rows,
        cols,
        opts,
        ws,
        NsWorkspace::orthogonalize_gram_always,
    )
}

/// Orthogonalizes `data` (`rows × cols`, row-major) in place; same result as
/// [`newton_schulz`].
///
/// # Errors
/// As [`newton_schulz`].
pub fn newton_schulz_in_place(
    data: &mut [f32],
    rows: usize,
    cols: usize,
    opts: &NsOptions,
    ws: &mut NsWorkspace,
) -> Result<()> {
    opts.validate()?;
    check_matrix("data", data.len(), rows, cols)?;
    ws.orthogonalize(data, rows, cols, opts);
    ws.store(data, rows, cols);
    Ok(())
}

/// How one shard's Newton–Schulz completes its sums over the other shards (Megatron's
/// `distributed` tensor-parallel mode, Emerging-Optimizers' `newton_schulz(tp_group=…)`):
/// every shard calls them in the same order, and each returns the same total on every shard.
pub trait ShardSums {
    /// The squared Frobenius norm of the whole matrix from this shard's.
    fn norm(&mut self, local: f64) -> Result<f64>;
    /// The whole Gram matrix `X·Xᵀ` from this shard's, in place.
    fn gram(&mut self, local: &mut [f32]) -> Result<()>;
}

/// Orthogonalizes in place one shard (`rows × cols`) of a matrix split along the columns of the
/// iterate `X` — the shard's columns, or with `transpose` its rows (`X = shardᵀ`) — with `sums`
/// completing the norm and each `X·Xᵀ` over the shards; the result is this shard of the whole
/// matrix's.
///
/// # Errors
/// As [`newton_schulz`], and whatever `sums` returns.
pub fn newton_schulz_sharded_in_place(
    data: &mut [f32],
    rows: usize,
    cols: usize,
    transpose: bool,
    opts: &NsOptions,
    ws: &mut NsWorkspace,
    sums: &mut dyn ShardSums,
) -> Result<()> {
    opts.validate()?;
    check_matrix("data", data.len(), rows, cols)?;
    ws.orthogonalize_sharded(data, rows, cols, transpose, opts, Some(sums))?;
    ws.store_oriented(data, rows, cols, transpose);
    Ok(())
}

/// Orthogonalizes a fused matrix per component: `input` is `Σ split_rows × cols`, split along
/// the rows into consecutive blocks of `split_rows[i] × cols` (each contiguous), and each
/// block is orthogonalized independently into the same place of `output`.
///
/// # Errors
/// `InvalidArgument` if `split_rows` is empty or has a 0, or a slice length is not
/// `Σ split_rows · cols`; `OutOfRange` for bad `opts.steps`.
pub fn newton_schulz_split(
    input: &[f32],
    output: &mut [f32],
    split_rows: &[usize],
    cols: usize,
    opts: &NsOptions,
    ws: &mut NsWorkspace,
) -> Result<()> {
    opts.validate()?;
    if split_rows.is_empty() || split_rows.contains(&0) {
        bail!(
            InvalidArgument,
            "newton_schulz_split: split_rows {split_rows:?} must be non-empty with every entry >= 1"
        );
    }
    let total_rows = split_rows.iter().try_fold(0usize, |acc, &r| acc.checked_add(r));
    let Some(total_rows) = total_rows else {
        bail!(
            InvalidArgument,
            "newton_schulz_split: split_rows {split_rows:?} overflow"
        );
    };
    check_matrix("input", input.len(), total_rows, cols)?;
    check_matrix("output", output.len(), total_rows, cols)?;
    let mut start = 0;
    for &rows in split_rows {
        let range = start..start + rows * cols;
        ws.orthogonalize(&input[range.clone()], rows, cols, opts);
        ws.store(&mut output[range], rows, cols);
        start += rows * cols;
    }
    Ok(())
}

/// Orthogonalizes a strided batch: `input` holds `batch` matrices of `rows × cols` back to
/// back (an expert stack `[E, rows, cols]`); each is orthogonalized independently.
///
/// # Errors
/// `InvalidArgument` if a dimension is 0 or a slice length is not `batch·rows·cols`;
/// `OutOfRange` for bad `opts.steps`.
pub fn newton_schulz_batched(
    input: &[f32],
    output: &mut [f32],
    batch: usize,
    rows: usize,
    cols: usize,
    opts: &NsOptions,
    ws: &mut NsWorkspace,
) -> Result<()> {
    opts.validate()?;
    let Some(batch_rows) = batch.checked_mul(rows) else {
        bail!(InvalidArgument, "newton_schulz_batched: {batch}×{rows} rows overflow");
    };
    if batch == 0 {
        bail!(InvalidArgument, "newton_schulz_batched: batch must be >= 1");
    }
    check_matrix("input", input.len(), batch_rows, cols)?;
    check_matrix("output", output.len(), batch_rows, cols)?;
    let elems = rows * cols;
    for (src, dst) in input.chunks_exact(elems).zip(output.chunks_exact_mut(elems)) {
        ws.orthogonalize(src, rows, cols, opts);
        ws.store(dst, rows, cols);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Gram iteration's matrices live in the workspace: grown once for a shape (a second
    /// call of the same size keeps the same allocations), and a size the host cannot hold is
    /// `OutOfMemory` with nothing changed, never an abort.
    #[test]
    fn gram_buffers_grow_once_and_fail_without_aborting() {
        let mut buffers = GramBuffers::default();
        buffers.grow(8 * 24, 8 * 8).unwrap();
        let at = (buffers.q.as_ptr(), buffers.x_op.as_ptr());
        buffers.grow(8 * 24, 8 * 8).unwrap();
        assert_eq!(at, (buffers.q.as_ptr(), buffers.x_op.as_ptr()));
        // Too large square matrices, then (the squares fitting) too large an iterate.
        for (mn, mm) in [(8 * 24, usize::MAX / 2), (usize::MAX / 2, 8 * 8)] {
            let err = buffers.grow(mn, mm).unwrap_err();
            assert_eq!(err.kind, crate::error::ErrorKind::OutOfMemory, "{err}");
            assert_eq!((buffers.q.len(), buffers.q_op.len(), buffers.x_op.len()), (64, 64, 192));
        }
    }
}

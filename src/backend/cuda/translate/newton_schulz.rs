//! Newton–Schulz on the device: the normalization kernel, the products on cuBLAS, the bf16
//! roundings, step for step as `numerics::newton_schulz`.

use super::collectives::{all_reduce, on_tp_comm};
use super::memory::Resolved;
use super::norm::SumSpan;
use super::{Translator, launch, launch_tiled, to_i32, to_u32};
use crate::backend::cuda::action::{Action, Arg, DevPtr, Gemm, GemmInputs, Kernel, Matrices, NcclType, Work};
use crate::backend::ops::StreamKind;
use crate::bail;
use crate::config::{Dtype, NsPrecision};
use crate::error::Result;
use crate::numerics::gemm::SymmetricTiles;
use crate::numerics::newton_schulz::runs_gram;

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
        self.cublas(Matrices::Strided {
            a: self.b,
            stride_a: self.stride[1] as i64,
            b: self.a,
            stride_b: self.stride[0] as i64,
            c: self.c,
            stride_c: self.stride[2] as i64,
        })
    }

    fn cublas(&self, matrices: Matrices) -> Result<Action> {
        let dimension = |v| to_i32("Newton–Schulz dimension", v);
        let leading = |v| to_i32("leading dimension", v);
        Ok(Action::Gemm(Gemm {
            inputs: self.inputs,
            transpose_a: self.b_transposed,
            m: dimension(self.n)?,
            n: dimension(self.m)?,
            k: dimension(self.k)?,
            alpha: self.alpha,
            lda: leading(self.ld[1])?,
            ldb: leading(self.ld[0])?,
            beta: self.beta,
            ldc: leading(self.ld[2])?,
            batch: to_i32("batch", self.batch)?,
            matrices,
        }))
    }

    /// A product that is symmetric by construction (`X·Xᵀ`, `A·A`; `m = n`, contiguous
    /// matrices) by the tiles of its call (`tables`, `numerics::gemm::SymmetricTiles`), as the host's
    /// `Output::SymmetricLower`: one batched GEMM over every tile on and below the diagonal of
    /// every matrix (their pointers listed in `tables`), and the rows past the last whole tile
    /// as one strip; the lower triangle is exact, the upper one is left to [`symmetrize`] (the
    /// host mirrors it at once). A matrix too small to tile is one full product.
    pub(super) fn symmetric(&self, tables: &mut TileTables) -> Result<Vec<Action>> {
        let tiles = tables.tiles;
        if SymmetricTiles::of(self.m as usize, tiles.size) != tiles || self.batch != tables.batch {
            bail!(
                Internal,
                "newton_schulz: a symmetric product of another shape than its call's"
            );
        }
        if tiles.rows == 0 {
            return Ok(vec![self.gemm()?]);
        }
        let elem = match self.inputs {
            GemmInputs::Bf16 => 2,
            GemmInputs::F32 => 4,
        };
        let size = tiles.size as u64;
        // Elements from one column of the stored B to the next.
        let b_column = if self.b_transposed { self.ld[1] } else { 1 };
        // In cuBLAS's order: its A is this product's B (a panel of columns per tile column),
        // its B this product's A (a panel of rows per tile row).
        let operands = [
            TileOperand {
                base: self.b,
                matrix: self.stride[1] * elem,
                row: 0,
                col: size * b_column * elem,
            },
            TileOperand {
                base: self.a,
                matrix: self.stride[0] * elem,
                row: size * self.ld[0] * elem,
                col: 0,
            },
            TileOperand {
                base: self.c,
                matrix: self.stride[2] * 4,
                row: size * self.ld[2] * 4,
                col: size * 4,
            },
        ];
        let listed = Product {
            m: size,
            n: size,
            batch: self.batch * tiles.count() as u64,
            ..*self
        };
        let table = tables.list(operands)?;
        let panels = to_u32("tile panels", self.batch * tiles.rows as u64)?;
        let mut actions = vec![listed.cublas(Matrices::Listed { table, panels })?];
        let strip = tiles.strip_start() as u64;
        if strip < self.m {
            let rest = Product {
                m: self.m - strip,
                a: self.a + strip * self.ld[0] * elem,
                c: self.c + strip * self.ld[2] * 4,
                ..*self
            };
            actions.push(rest.gemm()?);
        }
        Ok(actions)
    }
}

/// Where one operand's tiles are (bytes): tile `(i, j)` of matrix `k` at
/// `base + k·matrix + i·row + j·col`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct TileOperand {
    base: DevPtr,
    matrix: u64,
    row: u64,
    col: u64,
}

/// Lists one Newton–Schulz call may hold (`MUON_TILE_LISTS` in `kernels/muon.cu`): the most
/// distinct operand triples of its tiled products (the f32 Gram iteration's nine).
pub(super) const TILE_LISTS: u64 = 12;

/// The pointer lists of one Newton–Schulz call's tiled products (`Work::TileTables`), written
/// by one `muon_gemm_tile_tables` launch ahead of them ([`TileTables::write`]): every product
/// of the call has the same tiles (`batch` matrices of one order), and products with the same
/// operands share a list.
pub(super) struct TileTables {
    base: DevPtr,
    /// Pointers the buffer holds.
    capacity: u64,
    tiles: SymmetricTiles,
    batch: u64,
    lists: Vec<[TileOperand; 3]>,
}

impl TileTables {
    pub(super) fn new(base: DevPtr, capacity: u64, tiles: SymmetricTiles, batch: u64) -> Self {
        TileTables {
            base,
            capacity,
            tiles,
            batch,
            lists: Vec::new(),
        }
    }

    /// Tiles of each list.
    fn entries(&self) -> u64 {
        self.batch * self.tiles.count() as u64
    }

    /// Where list `index` starts.
    fn at(&self, index: usize) -> DevPtr {
        self.base + index as u64 * 3 * self.entries() * 8
    }

    /// The list of the call's tiles with these operands.
    fn list(&mut self, operands: [TileOperand; 3]) -> Result<DevPtr> {
        let index = match self.lists.iter().position(|l| *l == operands) {
            Some(index) => index,
            None => {
                self.lists.push(operands);
                self.lists.len() - 1
            }
        };
        let (lists, entries) = (self.lists.len() as u64, self.entries());
        if lists > TILE_LISTS || lists * 3 * entries > self.capacity {
            bail!(
                Internal,
                "newton_schulz: {lists} tile lists of {entries} tiles exceed the workspace sized at allocate"
            );
        }
        Ok(self.at(index))
    }

    /// The launch that writes every list (`struct muon_tile_lists`), inserted at `at` of
    /// `actions` (ahead of the call's products); nothing when no product was tiled.
    pub(super) fn write(self, actions: &mut Vec<Action>, at: usize) {
        if self.lists.is_empty() {
            return;
        }
        let entries = self.entries();
        let mut words = vec![0u64; TILE_LISTS as usize * 13 + 2];
        for (l, operands) in self.lists.iter().enumerate() {
            let list = &mut words[l * 13..(l + 1) * 13];
            list[0] = self.at(l);
            for (k, o) in operands.iter().enumerate() {
                list[1 + 4 * k..5 + 4 * k].copy_from_slice(&[o.base, o.matrix, o.row, o.col]);
            }
        }
        let header = TILE_LISTS as usize * 13;
        words[header] = self.lists.len() as u64 | ((self.tiles.rows as u64) << 32);
        words[header + 1] = entries;
        let launch = launch(
            Kernel::GemmTileTables,
            self.lists.len() as u64 * entries,
            StreamKind::Compute,
            vec![Arg::Words(words)],
        );
        actions.insert(at, launch);
    }
}

/// `batch` symmetric `m × m` matrices at `src` whole from their lower triangles: into `dst` as
/// bf16 (`to_bf16`: the host's rounding of the mirrored matrix), or in place (`dst = src`).
pub(super) fn symmetrize(src: DevPtr, dst: DevPtr, to_bf16: bool, batch: u64, m: u64) -> Result<Action> {
    launch_tiled(
        Kernel::NsSymmetrize,
        m,
        m,
        batch,
        vec![
            Arg::Ptr(src),
            Arg::Ptr(dst),
            Arg::I32(i32::from(to_bf16)),
            Arg::U32(to_u32("batch", batch)?),
            Arg::U32(to_u32("rows", m)?),
        ],
    )
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
        self.sumsq(actions, &spans, norms)?;
        if reduce {
            on_tp_comm(actions, all_reduce(norms, batch, NcclType::F64));
        }
        let x = self.work(Work::X)?;
        actions.push(launch_tiled(
            Kernel::NsNormalize,
            rows,
            cols,
            batch,
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
        )?);
        let gram = self.work(Work::Gram)?;
        let product = |inputs, shape, alpha, a, b, b_transposed, beta, c| {
            Product::contiguous(inputs, shape, alpha, a, b, b_transposed, beta, c, batch)
        };
        let (start, mut tables) = (actions.len(), self.tile_tables(m, batch)?);
        let mut current = x;
        if self.muon.ns.precision == NsPrecision::Bf16Iterate {
            store_bf16(actions, x, self.work(Work::XBf16)?, batch * mn);
        }
        if runs_gram(m as usize, n as usize, &self.muon.ns) {
            let x = self.iterate_gram(actions, x, (m, n), batch, reduce, &mut tables)?;
            tables.write(actions, start);
            return Ok((x, transposed));
        }
        for step in 0..self.muon.ns.steps as usize {
            let [a, b, c] = self.muon.ns.coefficients_at(step);
            match self.muon.ns.precision {
                NsPrecision::Bf16 | NsPrecision::Bf16Iterate => {
                    // Bf16Iterate keeps `x` at bf16 values, with `xb` holding the same values
                    // as bf16 (`store_bf16`); `A` is stored at bf16 values before `b·A` reads it.
                    // The f32 `A` and `B` are exact in their lower triangles only: each is read
                    // whole as its bf16 copy (`symmetrize`), and `b·A` only where the tiles of
                    // `A·A` write (upper values there are replaced by the mirror).
                    use GemmInputs::Bf16;
                    let iterate = self.muon.ns.precision == NsPrecision::Bf16Iterate;
                    let (xb, gb) = (self.work(Work::XBf16)?, self.work(Work::GramBf16)?);
                    if !iterate {
                        actions.push(round(x, xb, batch * mn));
                    }
                    actions.extend(product(Bf16, (m, n, m), 1.0, xb, xb, true, 0.0, gram).symmetric(&mut tables)?);
                    if reduce {
                        on_tp_comm(actions, all_reduce(gram, batch * mm, NcclType::F32));
                    }
                    actions.push(symmetrize(gram, gb, true, batch, m)?);
                    if iterate {
                        actions.push(widen(gb, gram, batch * mm));
                    }
                    actions.extend(product(Bf16, (m, m, m), c, gb, gb, false, b, gram).symmetric(&mut tables)?);
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
                    actions.extend(
                        product(F32, (m, n, m), 1.0, current, current, true, 0.0, gram).symmetric(&mut tables)?,
                    );
                    if reduce {
                        on_tp_comm(actions, all_reduce(gram, batch * mm, NcclType::F32));
                    }
                    actions.push(symmetrize(gram, gram, false, batch, m)?);
                    actions.push(copy(gram, poly, batch * mm));
                    actions.extend(product(F32, (m, m, m), c, gram, gram, false, b, poly).symmetric(&mut tables)?);
                    actions.push(symmetrize(poly, poly, false, batch, m)?);
                    actions.push(copy(current, next, batch * mn));
                    actions.push(product(F32, (m, m, n), 1.0, poly, current, false, a, next).gemm()?);
                    current = next;
                }
            }
        }
        tables.write(actions, start);
        Ok((current, transposed))
    }

    /// The tile lists of one Newton–Schulz call on `batch` matrices of order `m`, in
    /// `Work::TileTables` (absent when no product of the rank is tiled).
    fn tile_tables(&self, m: u64, batch: u64) -> Result<TileTables> {
        let capacity = self.work.tile_pointers;
        let base = if capacity > 0 { self.work(Work::TileTables)? } else { 0 };
        let tiles = SymmetricTiles::of(m as usize, self.muon.ns.symmetric_tile);
        Ok(TileTables::new(base, capacity, tiles, batch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `muon_gemm_tile_tables` writes for `words`: (address, pointer) pairs, as
    /// `kernels/muon.cu` computes them.
    fn listed_pointers(words: &[u64]) -> std::collections::HashMap<DevPtr, DevPtr> {
        let header = TILE_LISTS as usize * 13;
        let (count, rows, entries) = (words[header] & 0xffff_ffff, words[header] >> 32, words[header + 1]);
        let tiles = SymmetricTiles {
            rows: rows as usize,
            size: 0,
        };
        let (positions, per_matrix): (Vec<_>, u64) = (tiles.positions().collect(), tiles.count() as u64);
        let mut out = std::collections::HashMap::new();
        for l in 0..count as usize {
            let list = &words[l * 13..(l + 1) * 13];
            for q in 0..entries {
                let (matrix, (i, j)) = (q / per_matrix, positions[(q % per_matrix) as usize]);
                for o in 0..3 {
                    let [base, stride, row, col] = [1, 2, 3, 4].map(|w| list[4 * o + w]);
                    let ptr = base + matrix * stride + i as u64 * row + j as u64 * col;
                    out.insert(list[0] + (o as u64 * entries + q) * 8, ptr);
                }
            }
        }
        out
    }

    /// Per GEMM of `actions` (the tile lists resolved through `pointers`): each batch entry's
    /// cuBLAS (A, B, C) pointers.
    fn entries(actions: &[Action], pointers: &std::collections::HashMap<DevPtr, DevPtr>) -> Vec<(Gemm, [DevPtr; 3])> {
        let mut out = Vec::new();
        for action in actions {
            let Action::Gemm(g) = action else { continue };
            for e in 0..g.batch as u64 {
                let at = match g.matrices {
                    Matrices::Strided {
                        a,
                        stride_a,
                        b,
                        stride_b,
                        c,
                        stride_c,
                    } => {
                        let elem = if g.inputs == GemmInputs::Bf16 { 2 } else { 4 };
                        let step = |s: i64, size: u64| e * s as u64 * size;
                        [
                            a + step(stride_a, elem),
                            b + step(stride_b, elem),
                            c + step(stride_c, 4),
                        ]
                    }
                    Matrices::Listed { table, .. } => {
                        [0, 1, 2].map(|k| pointers[&(table + (k * g.batch as u64 + e) * 8)])
                    }
                };
                out.push((g.clone(), at));
            }
        }
        out
    }

    /// `X·Xᵀ` and `A·A` of orders 64 (4 tiles of 16 a side) and 72 (and a strip of 8 rows),
    /// for one matrix and a batch of 3, in bf16 and f32: one listed GEMM over the tiles (one
    /// table launch ahead of it) writes every element on and below the diagonal once, the
    /// upper triangle only inside the diagonal tiles and the strip's corner, each tile from the
    /// row panel of its tile row and the column panel of its tile column, at `(T+1)/(2T)` of
    /// the full product's flops and the strip's.
    #[test]
    fn symmetric_products_compute_the_lower_tiles_once_then_mirror() {
        let (tile, k_wide) = (16u64, 80u64);
        let (x, c, table) = (1u64 << 40, 1u64 << 41, 1u64 << 42);
        for m in [64u64, 72] {
            for matrices in [1u64, 3] {
                for (inputs, k, b_transposed) in [(GemmInputs::Bf16, k_wide, true), (GemmInputs::F32, m, false)] {
                    let full = Product::contiguous(inputs, (m, k, m), 1.0, x, x, b_transposed, 0.0, c, matrices);
                    let tiles = SymmetricTiles::of(m as usize, tile as usize);
                    let mut tables = TileTables::new(table, 1 << 20, tiles, matrices);
                    let mut actions = full.symmetric(&mut tables).unwrap();
                    tables.write(&mut actions, 0);
                    let Action::Launch(crate::backend::cuda::action::Launch { kernel, args, .. }) = &actions[0] else {
                        panic!("the tile lists are written first")
                    };
                    assert_eq!(*kernel, Kernel::GemmTileTables);
                    let Arg::Words(words) = &args[0] else {
                        panic!("the lists are one struct")
                    };
                    let pointers = listed_pointers(words.as_slice());
                    let elem = if inputs == GemmInputs::Bf16 { 2 } else { 4 };
                    let (stride, a_row) = (m * k, k);
                    let b_col = if b_transposed { k } else { 1 };
                    let mut cells = Vec::new();
                    let mut flops = 0;
                    for (g, [pa, pb, pc]) in entries(&actions, &pointers) {
                        flops += 2 * g.m as u64 * g.n as u64 * g.k as u64;
                        let at = (pc - c) / 4;
                        let (matrix, row0, col0) = (at / (m * m), at % (m * m) / m, at % m);
                        // cuBLAS's B is the product's A: the rows of the output's rows; its A the
                        // product's B: the columns of the output's columns.
                        assert_eq!(pb, x + (matrix * stride + row0 * a_row) * elem);
                        assert_eq!(pa, x + (matrix * stride + col0 * b_col) * elem);
                        for j in 0..g.n as u64 {
                            for i in 0..g.m as u64 {
                                let cell = at + j * g.ldc as u64 + i;
                                assert!(cell < matrices * m * m, "write outside the outputs");
                                cells.push((cell / (m * m), cell % (m * m) / m, cell % m));
                            }
                        }
                    }
                    let unique: std::collections::BTreeSet<_> = cells.iter().copied().collect();
                    assert_eq!(unique.len(), cells.len(), "an element is written twice");
                    let strip = 64;
                    for b in 0..matrices {
                        for i in 0..m {
                            for j in 0..m {
                                let expected = i >= j || i / tile == j / tile || i >= strip;
                                assert_eq!(unique.contains(&(b, i, j)), expected, "({b}, {i}, {j})");
                            }
                        }
                    }
                    let rows = strip / tile;
                    let tiled = rows * (rows + 1) / 2 * tile * tile;
                    assert_eq!(flops, 2 * k * matrices * (tiled + (m - strip) * m));
                }
            }
        }
    }
}

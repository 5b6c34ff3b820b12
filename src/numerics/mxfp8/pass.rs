//! The loop nest of the host quantizer (see `quantize.rs`): strips of 32 rows, each encoded
//! row by row and segment by segment while the amax pass runs over the next strip.

use std::ops::Range;

use super::amax::{amax_row, nan_free_max, scale_bytes};
use super::encode::{
    Checks, encode_both_fast, encode_cols_exact, encode_cols_fast, encode_rows_fast, encode_rows_mixed,
};
use super::fast::Element;
use super::quantize::Target;
use super::scalar::{BLOCK_SIZE, scale_inv};
use super::stream::{Staged, Streaming};

/// Columns per segment of a row: the unit of interleaving, and 32 rowwise blocks, whose amaxes
/// `amax_row` reduces together.
pub(super) const SEGMENT: usize = BLOCK_SIZE * BLOCK_SIZE;

/// How many rows past the row whose amaxes are being taken the input is prefetched (see
/// [`Element::PREFETCH`]).
const PREFETCH_ROWS: usize = 1;

/// Raw amax keys of one strip: `32 * ceil(cols/32)` rowwise blocks (row `i`, block `k` at
/// `i * blocks_per_row + k`) and `cols` columns.
struct StripAmax<K> {
    row: Vec<K>,
    col: Vec<K>,
}

/// Per-call scratch: the amaxes of the strip being encoded and of the next one, and the scale
/// bytes and constants of the strip being encoded.
struct Scratch<E: Element> {
    amax: StripAmax<E::Key>,
    next_amax: StripAmax<E::Key>,
    row_b: Vec<u8>,
    row_drop: Vec<E::Lane>,
    col_b: Vec<u8>,
    col_drop: Vec<E::Lane>,
    col_scale_inv: Vec<f32>,
}

impl<E: Element> Scratch<E> {
    fn new(cols: usize) -> Self {
        let blocks = BLOCK_SIZE * cols.div_ceil(BLOCK_SIZE);
        let amax = || StripAmax {
            row: vec![E::Key::default(); blocks],
            col: vec![E::Key::default(); cols],
        };
        Scratch {
            amax: amax(),
            next_amax: amax(),
            row_b: vec![0; blocks],
            row_drop: vec![E::Lane::default(); blocks],
            col_b: vec![0; cols],
            col_drop: vec![E::Lane::default(); cols],
            col_scale_inv: vec![0.0; cols],
        }
    }
}

/// Which copies a call produces.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wanted {
    Both,
    Rowwise,
    Colwise,
}

impl Wanted {
    fn of(rowwise: bool, colwise: bool) -> Option<Self> {
        match (rowwise, colwise) {
            (true, true) => Some(Wanted::Both),
            (true, false) => Some(Wanted::Rowwise),
            (false, true) => Some(Wanted::Colwise),
            (false, false) => None,
        }
    }
}

/// The amax pass over one row segment, for the wanted copies: see `amax_row`.
#[inline(always)]
fn amax_segment<E: Element>(wanted: Wanted, src: &[E], row_raw: &mut [E::Key], col_raw: &mut [E::Key]) {
    match wanted {
        Wanted::Both => amax_row::<E, true, true>(src, row_raw, col_raw),
        Wanted::Rowwise => amax_row::<E, true, false>(src, row_raw, col_raw),
        Wanted::Colwise => amax_row::<E, false, true>(src, row_raw, col_raw),
    }
}

/// Asks the CPU to start loading the cache lines of `data` (a hint: it changes no result).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch<T>(data: &[T]) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    const LINE: usize = 64;
    let start = data.as_ptr().cast::<i8>();
    let skew = start as usize % LINE;
    let first = start.wrapping_sub(skew);
    for offset in (0..skew + size_of_val(data)).step_by(LINE) {
        // SAFETY: a prefetch never faults and changes no architectural state, whatever the
        // address; `wrapping_add` keeps the pointer arithmetic defined.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(first.wrapping_add(offset)) };
    }
}

/// Asks the CPU to start loading the cache lines of `data`: a no-op on this architecture.
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn prefetch<T>(_: &[T]) {}

/// The shape of the loop nest: strips of 32 rows, rows cut into segments of [`SEGMENT`]
/// columns.
#[derive(Clone, Copy)]
struct Grid {
    rows: usize,
    cols: usize,
    blocks_per_row: usize,
    strips: usize,
    segments: usize,
}

impl Grid {
    fn new(rows: usize, cols: usize) -> Self {
        Grid {
            rows,
            cols,
            blocks_per_row: cols.div_ceil(BLOCK_SIZE),
            strips: rows.div_ceil(BLOCK_SIZE),
            segments: cols.div_ceil(SEGMENT),
        }
    }

    /// Rows in strip `strip`: 32, except perhaps in the last one.
    fn strip_rows(self, strip: usize) -> usize {
        BLOCK_SIZE.min(self.rows - strip * BLOCK_SIZE)
    }

    /// Rows in the strip after `strip`, 0 for the last one.
    fn next_strip_rows(self, strip: usize) -> usize {
        if strip + 1 < self.strips {
            self.strip_rows(strip + 1)
        } else {
            0
        }
    }

    /// The columns of segment `seg`, and its rowwise blocks within the row.
    fn segment(self, seg: usize) -> (Range<usize>, Range<usize>) {
        let first_block = seg * BLOCK_SIZE;
        (
            seg * SEGMENT..((seg + 1) * SEGMENT).min(self.cols),
            first_block..(first_block + BLOCK_SIZE).min(self.blocks_per_row),
        )
    }

    /// Element offsets of columns `span` of row `r`.
    fn at(self, r: usize, span: &Range<usize>) -> Range<usize> {
        r * self.cols + span.start..r * self.cols + span.end
    }
}

/// Whether every block of the strip being encoded takes the fast path, per copy.
#[derive(Clone, Copy)]
struct FastStrip {
    rows: bool,
    cols: bool,
}

/// The loop nest of one call: the input, the requested copies and the scratch.
pub(super) struct Pass<'a, 'r, 'c, E: Element> {
    x: &'a [E],
    grid: Grid,
    wanted: Wanted,
    rowwise: Option<&'a mut Target<'r>>,
    colwise: Option<&'a mut Target<'c>>,
    s: Scratch<E>,
    checks: Checks,
    /// With streaming stores, the buffer each segment of the columnwise copy is encoded into
    /// first (the rowwise copy is always written directly).
    stream: Option<(Streaming, Box<Staged>)>,
}

impl<'a, 'r, 'c, E: Element> Pass<'a, 'r, 'c, E> {
    /// The loop nest for the requested copies, whose buffers have been checked; `None` when
    /// there is nothing to do. With `stream` given, the columnwise data is written with
    /// streaming stores when it is the only copy, or, for an element type with
    /// `Element::STREAM_BOTH`, when both copies are produced.
    #[inline(always)]
    pub(super) fn new(
        x: &'a [E],
        (rows, cols): (usize, usize),
        rowwise: Option<&'a mut Target<'r>>,
        colwise: Option<&'a mut Target<'c>>,
        stream: Option<Streaming>,
    ) -> Option<Self> {
        let wanted = Wanted::of(rowwise.is_some(), colwise.is_some())?;
        (rows > 0 && cols > 0).then(|| Pass {
            x,
            grid: Grid::new(rows, cols),
            wanted,
            rowwise,
            colwise,
            s: Scratch::new(cols),
            checks: Checks::default(),
            // Measured with `benches/mxfp8.rs` (AMD EPYC with AVX-512, 4096 × 4096, bf16): streaming
            // stores speed up the columnwise copy alone by about 20 %, but slow down the
            // rowwise copy alone slightly, and a call producing both copies by about 40 % when
            // both stream; streaming its columnwise copy only is faster for bf16, slower for
            // f32 (see `Element::STREAM_BOTH`).
            stream: stream
                .filter(|_| wanted == Wanted::Colwise || (wanted == Wanted::Both && E::STREAM_BOTH))
                .map(|s| (s, Staged::new())),
        })
    }

    /// Runs the loop nest (see the module documentation).
    #[inline(always)]
    pub(super) fn run(mut self) {
        self.amax_first_strip();
        for strip in 0..self.grid.strips {
            let fast = self.scale_strip(strip);
            self.encode_strip(strip, fast);
            std::mem::swap(&mut self.s.amax, &mut self.s.next_amax);
        }
        if let Some((stream, _)) = self.stream {
            stream.fence();
        }
    }

    /// Row `r` of the input.
    #[inline(always)]
    fn row(&self, r: usize) -> &'a [E] {
        let x: &'a [E] = self.x;
        &x[r * self.grid.cols..(r + 1) * self.grid.cols]
    }

    /// Takes the amaxes of the first strip; those of every later strip are taken while its
    /// predecessor is encoded.
    #[inline(always)]
    fn amax_first_strip(&mut self) {
        let nbc = self.grid.blocks_per_row;
        for i in 0..self.grid.strip_rows(0) {
            let src = self.row(i);
            let row_raw = &mut self.s.amax.row[i * nbc..(i + 1) * nbc];
            amax_segment(self.wanted, src, row_raw, &mut self.s.amax.col);
        }
    }

    /// Computes and stores the scale bytes of strip `strip` for the requested copies.
    #[inline(always)]
    fn scale_strip(&mut self, strip: usize) -> FastStrip {
        FastStrip {
            rows: self.row_scales(strip),
            cols: self.col_scales(strip),
        }
    }

    /// The rowwise scale bytes and constants of strip `strip`; whether all its blocks are fast.
    #[inline(always)]
    fn row_scales(&mut self, strip: usize) -> bool {
        let (grid, nbc) = (self.grid, self.grid.blocks_per_row);
        let (r0, nr) = (strip * BLOCK_SIZE, grid.strip_rows(strip));
        let Some(t) = self.rowwise.as_deref_mut() else {
            return false;
        };
        let x = self.x;
        let all_fast = scale_bytes::<E>(
            &self.s.amax.row[..nr * nbc],
            &mut self.s.row_b,
            &mut self.s.row_drop,
            |j| {
                let (r, k) = (r0 + j / nbc, j % nbc);
                let row = &x[r * grid.cols..(r + 1) * grid.cols];
                nan_free_max(row.chunks(BLOCK_SIZE).nth(k).unwrap_or_default().iter().copied())
            },
        );
        for i in 0..nr {
            t.store_scales(r0 + i, &self.s.row_b[i * nbc..(i + 1) * nbc], r0 + i + 1 == grid.rows);
        }
        all_fast
    }

    /// The columnwise scale bytes and constants of strip `strip`; whether all its blocks are
    /// fast.
    #[inline(always)]
    fn col_scales(&mut self, strip: usize) -> bool {
        let grid = self.grid;
        let (r0, nr) = (strip * BLOCK_SIZE, grid.strip_rows(strip));
        let Some(t) = self.colwise.as_deref_mut() else {
            return false;
        };
        let x = self.x;
        let all_fast = scale_bytes::<E>(&self.s.amax.col, &mut self.s.col_b, &mut self.s.col_drop, |c| {
            nan_free_max((r0..r0 + nr).map(|r| x[r * grid.cols + c]))
        });
        t.store_scales(strip, &self.s.col_b, strip + 1 == grid.strips);
        if !all_fast {
            for (si, &b) in self.s.col_scale_inv.iter_mut().zip(&self.s.col_b) {
                *si = scale_inv(b);
            }
        }
        all_fast
    }

    /// Encodes strip `strip`, row by row and segment by segment, taking the amaxes of the
    /// next strip's row of the same index in between.
    #[inline(always)]
    fn encode_strip(&mut self, strip: usize, fast: FastStrip) {
        let r0 = strip * BLOCK_SIZE;
        let next_rows = self.grid.next_strip_rows(strip);
        self.s.next_amax.col.fill(E::Key::default());
        for i in 0..self.grid.strip_rows(strip) {
            for seg in 0..self.grid.segments {
                if i < next_rows {
                    self.amax_next(r0 + BLOCK_SIZE + i, i, seg);
                }
                self.prefetch_input(r0 + i, seg);
                self.encode_segment(r0 + i, i, seg, fast);
            }
        }
    }

    /// The amax pass over segment `seg` of row `r`, row `i` of the next strip.
    #[inline(always)]
    fn amax_next(&mut self, r: usize, i: usize, seg: usize) {
        let (span, blocks) = self.grid.segment(seg);
        let src = &self.row(r)[span.clone()];
        let row_raw = &mut self.s.next_amax.row[i * self.grid.blocks_per_row..][blocks];
        amax_segment(self.wanted, src, row_raw, &mut self.s.next_amax.col[span]);
    }

    /// Prefetches segment `seg` of the input row the amax pass reads after row `r + 32`.
    #[inline(always)]
    fn prefetch_input(&self, r: usize, seg: usize) {
        let input = r + BLOCK_SIZE + PREFETCH_ROWS;
        if E::PREFETCH && input < self.grid.rows {
            prefetch(&self.row(input)[self.grid.segment(seg).0]);
        }
    }

    /// Encodes segment `seg` of row `r`, row `i` of its strip, into the requested copies:
    /// directly, or the columnwise one through the staging buffer with streaming stores.
    #[inline(always)]
    fn encode_segment(&mut self, r: usize, i: usize, seg: usize, fast: FastStrip) {
        let (span, blocks) = self.grid.segment(seg);
        let src = &self.row(r)[span.clone()];
        let at = self.grid.at(r, &span);
        let nbc = self.grid.blocks_per_row;
        let row_block = i * nbc + blocks.start..i * nbc + blocks.end;
        let rowwise = self.rowwise.as_deref_mut().map(|t| &mut t.data[at.clone()]);
        let colwise = self.colwise.as_deref_mut().map(|t| &mut t.data[at]);
        let Some((stream, staged)) = &mut self.stream else {
            return self
                .s
                .encode(src, (row_block, span), fast, &mut self.checks, (rowwise, colwise));
        };
        let n = src.len();
        let col_buf = colwise.is_some().then_some(&mut staged.col[..n]);
        self.s
            .encode(src, (row_block, span), fast, &mut self.checks, (rowwise, col_buf));
        if let Some(dst) = colwise {
            stream.copy(dst, &staged.col[..n]);
        }
    }
}

impl<E: Element> Scratch<E> {
    /// Encodes the row segment `src`, columns `span` of row `i` of the strip (rowwise blocks
    /// `row_block` of the strip's list), into `row` and `col`, those of the requested copies.
    #[inline(always)]
    fn encode(
        &self,
        src: &[E],
        (row_block, span): (Range<usize>, Range<usize>),
        fast: FastStrip,
        checks: &mut Checks,
        (row, col): (Option<&mut [u8]>, Option<&mut [u8]>),
    ) {
        let row_drop = &self.row_drop[row_block.clone()];
        let col_drop = &self.col_drop[span.clone()];
        let (row, col) = match (row, col, fast.rows, fast.cols) {
            (Some(rd), Some(cd), true, true) => {
                return encode_both_fast(src, (row_drop, rd), (col_drop, cd), checks);
            }
            copies => (copies.0, copies.1),
        };
        if let Some(dst) = row {
            if fast.rows {
                encode_rows_fast(src, row_drop, dst, &mut checks.rows);
            } else {
                let (raw, b) = (&self.amax.row[row_block.clone()], &self.row_b[row_block]);
                encode_rows_mixed(src, raw, b, row_drop, dst);
            }
        }
        if let Some(dst) = col {
            if fast.cols {
                encode_cols_fast(src, col_drop, dst, &mut checks.cols);
            } else {
                encode_cols_exact(src, &self.col_scale_inv[span], dst);
            }
        }
    }
}

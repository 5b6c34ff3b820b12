//! Host MXFP8 quantization, rowwise and columnwise, fused into one pass over the input.
//!
//! The loop nest (`pass.rs`) walks the input in strips of 32 rows (one columnwise block row).
//! For a strip, the raw amaxes of all its rowwise blocks and columns are known before it is
//! encoded: they were taken while the previous strip was being encoded, interleaved segment by
//! segment (1024 columns) with that work, so that each strip is read from memory once. The
//! scale bytes of the whole strip are then computed together (`amax.rs`) and the strip, still
//! in L2, is encoded into both copies, sharing the scale-independent half of the fast encoding
//! (`encode.rs`, `fast.rs`). For bf16, the loop prefetches the input the amax pass reads next
//! ahead of each segment: measured with `benches/mxfp8.rs`, the hardware prefetchers alone
//! leave that pass waiting on memory. The inner loops are branch-free over fixed 32-lane
//! groups so that they vectorize; on x86-64 the loop nest is also compiled for AVX2 and
//! AVX-512 and picked at run time.

use super::fast::Element;
use super::pass::Pass;
use super::stream::Streaming;
use super::{Direction, Input, QuantizedMut, ScaleLayout, ScaleMap, check_len, element_count, scale_shape};
use crate::error::Result;

/// Quantizes a `[rows, cols]` row-major input into the requested MXFP8 copies: the host
/// reference behind `muon_mxfp8_quantize_host`. Either copy may be omitted; when both are
/// given they are produced in one pass (see [`quantize_both`]).
///
/// Every buffer length must match exactly: `rows * cols` input elements and data bytes, and
/// `scale_shape(rows, cols, direction)` scale bytes per copy. All scale bytes are written,
/// padding with `0x00`. On error nothing is written.
///
/// # Errors
/// `InvalidArgument` if `rows * cols` overflows or a buffer has the wrong length.
pub fn quantize(
    input: Input<'_>,
    rows: usize,
    cols: usize,
    layout: ScaleLayout,
    rowwise: Option<QuantizedMut<'_>>,
    colwise: Option<QuantizedMut<'_>>,
) -> Result<()> {
    const WHAT: &str = "mxfp8 quantize";
    let n = element_count(WHAT, rows, cols)?;
    check_len(WHAT, "input", input.len(), n)?;
    for (copy, direction, names) in [
        (&rowwise, Direction::Rowwise, ["rowwise data", "rowwise scales"]),
        (&colwise, Direction::Colwise, ["colwise data", "colwise scales"]),
    ] {
        if let Some(q) = copy {
            let (sr, sc) = scale_shape(rows, cols, direction);
            check_len(WHAT, names[0], q.data.len(), n)?;
            check_len(WHAT, names[1], q.scales.len(), sr * sc)?;
        }
    }
    let mut rowwise = rowwise.map(|q| Target::new(q, rows, cols, Direction::Rowwise, layout));
    let mut colwise = colwise.map(|q| Target::new(q, rows, cols, Direction::Colwise, layout));
    match input {
        Input::Bf16(x) => quantize_dispatch(x, rows, cols, rowwise.as_mut(), colwise.as_mut()),
        Input::F32(x) => quantize_dispatch(x, rows, cols, rowwise.as_mut(), colwise.as_mut()),
    }
    Ok(())
}

/// Rowwise (1×32 blocks) quantization into `data_out` (`rows * cols` bytes) and `scales_out`
/// (`scale_shape(rows, cols, Rowwise)` bytes).
///
/// # Errors
/// As [`quantize`].
pub fn quantize_rowwise(
    input: Input<'_>,
    rows: usize,
    cols: usize,
    layout: ScaleLayout,
    data_out: &mut [u8],
    scales_out: &mut [u8],
) -> Result<()> {
    let q = QuantizedMut {
        data: data_out,
        scales: scales_out,
    };
    quantize(input, rows, cols, layout, Some(q), None)
}

/// Columnwise (32×1 blocks) quantization into `data_out` (`rows * cols` bytes, row-major, not
/// transposed) and `scales_out` (`scale_shape(rows, cols, Colwise)` bytes).
///
/// # Errors
/// As [`quantize`].
pub fn quantize_colwise(
    input: Input<'_>,
    rows: usize,
    cols: usize,
    layout: ScaleLayout,
    data_out: &mut [u8],
    scales_out: &mut [u8],
) -> Result<()> {
    let q = QuantizedMut {
        data: data_out,
        scales: scales_out,
    };
    quantize(input, rows, cols, layout, None, Some(q))
}

/// Rowwise and columnwise quantization in one pass over the input (strips of 32 rows), with
/// results identical to [`quantize_rowwise`] followed by [`quantize_colwise`].
///
/// # Errors
/// As [`quantize`].
pub fn quantize_both(
    input: Input<'_>,
    rows: usize,
    cols: usize,
    layout: ScaleLayout,
    rowwise: QuantizedMut<'_>,
    colwise: QuantizedMut<'_>,
) -> Result<()> {
    quantize(input, rows, cols, layout, Some(rowwise), Some(colwise))
}

/// One output copy with its scale index map.
pub(super) struct Target<'a> {
    pub(super) data: &'a mut [u8],
    scales: &'a mut [u8],
    map: ScaleMap,
    /// Swizzled layout only: the compact scales of the current band of tiles
    /// ([`ScaleMap::band_rows`] rows), written out tile by tile once the band is complete, so
    /// that the swizzled buffer is written in whole cache lines.
    band: Vec<u8>,
}

impl<'a> Target<'a> {
    fn new(q: QuantizedMut<'a>, rows: usize, cols: usize, direction: Direction, layout: ScaleLayout) -> Self {
        // The quantization loop never visits padding bytes; they stay 0x00.
        q.scales.fill(0);
        let map = ScaleMap::new(rows, cols, direction, layout);
        let band = match layout {
            ScaleLayout::Compact => Vec::new(),
            ScaleLayout::Swizzled => vec![0; map.band_rows() * map.stride],
        };
        Target {
            data: q.data,
            scales: q.scales,
            map,
            band,
        }
    }

    /// Stores compact scale row `r` (columns `0..bytes.len()`). `last` marks the last row the
    /// call will store.
    pub(super) fn store_scales(&mut self, r: usize, bytes: &[u8], last: bool) {
        let stride = self.map.stride;
        if self.band.is_empty() {
            self.scales[r * stride..][..bytes.len()].copy_from_slice(bytes);
            return;
        }
        let band_rows = self.map.band_rows();
        self.band[(r % band_rows) * stride..][..bytes.len()].copy_from_slice(bytes);
        if r % band_rows == band_rows - 1 || last {
            self.map.store_band(self.scales, r / band_rows, &self.band);
            self.band.fill(0);
        }
    }
}

/// Runs [`quantize_impl`] compiled for the widest vector extension the CPU has.
fn quantize_dispatch<E: Element>(
    x: &[E],
    rows: usize,
    cols: usize,
    rowwise: Option<&mut Target<'_>>,
    colwise: Option<&mut Target<'_>>,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512bw") && std::arch::is_x86_feature_detected!("avx512vl") {
            // SAFETY: the CPU supports every feature `quantize_avx512` is compiled with.
            return unsafe { quantize_avx512(x, rows, cols, rowwise, colwise) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports every feature `quantize_avx2` is compiled with.
            return unsafe { quantize_avx2(x, rows, cols, rowwise, colwise) };
        }
    }
    quantize_impl(x, rows, cols, rowwise, colwise, None)
}

/// [`quantize_impl`] compiled with AVX-512 (F, BW, VL), with streaming stores of the
/// columnwise copy where they pay (`stream.rs`, `pass.rs`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
fn quantize_avx512<E: Element>(
    x: &[E],
    rows: usize,
    cols: usize,
    rowwise: Option<&mut Target<'_>>,
    colwise: Option<&mut Target<'_>>,
) {
    quantize_impl(x, rows, cols, rowwise, colwise, Streaming::detect())
}

/// [`quantize_impl`] compiled with AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn quantize_avx2<E: Element>(
    x: &[E],
    rows: usize,
    cols: usize,
    rowwise: Option<&mut Target<'_>>,
    colwise: Option<&mut Target<'_>>,
) {
    quantize_impl(x, rows, cols, rowwise, colwise, None)
}

/// The quantization loop nest (see the module documentation) for the requested copies, whose
/// buffers have been checked, with streaming stores if `stream` is given.
#[inline(always)]
fn quantize_impl<E: Element>(
    x: &[E],
    rows: usize,
    cols: usize,
    rowwise: Option<&mut Target<'_>>,
    colwise: Option<&mut Target<'_>>,
    stream: Option<Streaming>,
) {
    if let Some(pass) = Pass::new(x, (rows, cols), rowwise, colwise, stream) {
        pass.run();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    /// The loop nest compiled for each instruction set the CPU has.
    #[derive(Debug, Clone, Copy)]
    enum Variant {
        Portable,
        #[cfg(target_arch = "x86_64")]
        Avx2,
        #[cfg(target_arch = "x86_64")]
        Avx512,
    }

    fn variants() -> Vec<Variant> {
        let mut v = vec![Variant::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                v.push(Variant::Avx2);
            }
            if std::arch::is_x86_feature_detected!("avx512bw") && std::arch::is_x86_feature_detected!("avx512vl") {
                v.push(Variant::Avx512);
            }
        }
        v
    }

    /// Rowwise and columnwise data and scales from one variant.
    fn run<E: Element>(variant: Variant, x: &[E], rows: usize, cols: usize, layout: ScaleLayout) -> [Vec<u8>; 4] {
        let n = rows * cols;
        let (rs, cs) = (
            scale_shape(rows, cols, Direction::Rowwise),
            scale_shape(rows, cols, Direction::Colwise),
        );
        let mut out = [
            vec![0xEEu8; n],
            vec![0xEE; rs.0 * rs.1],
            vec![0xEE; n],
            vec![0xEE; cs.0 * cs.1],
        ];
        let [rd, rsc, cd, csc] = &mut out;
        let q = |data, scales| QuantizedMut { data, scales };
        let mut row = Target::new(q(rd, rsc), rows, cols, Direction::Rowwise, layout);
        let mut col = Target::new(q(cd, csc), rows, cols, Direction::Colwise, layout);
        let (row, col) = (Some(&mut row), Some(&mut col));
        match variant {
            Variant::Portable => quantize_impl(x, rows, cols, row, col, None),
            // SAFETY: `variants` lists these only when the CPU supports them.
            #[cfg(target_arch = "x86_64")]
            Variant::Avx2 => unsafe { quantize_avx2(x, rows, cols, row, col) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Variant::Avx512 => unsafe { quantize_avx512(x, rows, cols, row, col) },
        }
        out
    }

    /// bf16 test data: mostly normal values spread over 2^±10, with NaN, ±∞, ±0, subnormals and
    /// runs of tiny values (scales below the fast-path threshold) mixed in.
    fn data(n: usize, seed: u64) -> Vec<u16> {
        let mut rng = SplitMix64::new(seed);
        (0..n)
            .map(|i| {
                let r = rng.next_u64();
                let sign = (r >> 63) as u16 * 0x8000;
                let mant = (r >> 20) as u16 & 0x7F;
                if (i / 4096) % 5 == 4 {
                    return sign | ((r % 12) as u16) << 7 | mant;
                }
                match r % 97 {
                    0 => 0x7FC0 | sign,
                    1 => 0x7F80 | sign,
                    2 => sign,
                    3 => sign | mant,
                    _ => sign | ((117 + (r >> 40) % 21) as u16) << 7 | mant,
                }
            })
            .collect()
    }

    #[test]
    fn every_instruction_set_variant_gives_identical_bytes() {
        let variants = variants();
        for (rows, cols) in [(1, 5), (33, 70), (64, 1024), (35, 2080), (40, 4096 + 33)] {
            let bits = data(rows * cols, (rows * 131 + cols) as u64);
            let values: Vec<f32> = bits.iter().map(|&b| f32::from_bits(u32::from(b) << 16)).collect();
            for layout in [ScaleLayout::Compact, ScaleLayout::Swizzled] {
                let want = run(Variant::Portable, &bits, rows, cols, layout);
                assert_eq!(
                    want,
                    run(Variant::Portable, &values, rows, cols, layout),
                    "f32 {rows}x{cols}"
                );
                for &v in &variants[1..] {
                    assert_eq!(
                        want,
                        run(v, &bits, rows, cols, layout),
                        "{v:?} bf16 {rows}x{cols} {layout:?}"
                    );
                    assert_eq!(
                        want,
                        run(v, &values, rows, cols, layout),
                        "{v:?} f32 {rows}x{cols} {layout:?}"
                    );
                }
            }
        }
    }
}

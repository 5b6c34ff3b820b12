//! Non-temporal (streaming) stores of the encoded data, on x86-64 with AVX.
//!
//! Written with ordinary stores, every output cache line is first read from memory (read for
//! ownership) and later written back. Streaming stores covering a whole 64-byte line (two
//! `_mm256_stream_si256`, VMOVNTDQ in the Intel Intrinsics Guide, combined in a write-combining
//! buffer) write the line without reading it. (The 64-byte `_mm512_stream_si512` is stable
//! only from Rust 1.89, after this crate's minimum version.) The loop nest encodes a segment of
//! the columnwise copy into a buffer that stays in L1 ([`Staged`]) and copies it out with
//! [`Streaming::copy`]; partial lines at either end of the copy use ordinary
//! stores. Streaming stores are weakly ordered: [`Streaming::fence`] (`_mm_sfence`, SFENCE)
//! orders them before the stores that follow it, and the loop nest runs it before returning.
//! Which calls stream is decided in `pass.rs` and by `Element::STREAM_BOTH`, from measurements.

use super::pass::SEGMENT;

/// Bytes per cache line, the unit of a streaming store.
const LINE: usize = 64;

/// Where in its page [`Staged::col`] starts (see below).
const STAGING_OFFSET: usize = 1024;

/// A segment of encoded data of the columnwise copy, the only one written with streaming
/// stores, at page offset [`STAGING_OFFSET`].
///
/// The page offset matters: measured with `benches/mxfp8.rs` (AMD EPYC with AVX-512, 4096 × 4096 bf16,
/// input and outputs at page offset 16), both copies take about 2.4 ms with the buffer at page
/// offset 64, 560, 1024 or 2048, but about 2.55 ms at offset 0, 2.9 ms at offset 3072 and
/// 2.9 ms where the allocator happened to place it (presumably cache-set conflicts or
/// 4K aliasing with the rows of the input and the outputs). 1024 lies between good offsets.
#[repr(C, align(4096))]
pub(super) struct Staged {
    /// Padding that puts `col` at page offset [`STAGING_OFFSET`].
    _lead: [u8; STAGING_OFFSET],
    pub(super) col: [u8; SEGMENT],
}

impl Staged {
    pub(super) fn new() -> Box<Self> {
        Box::new(Staged {
            _lead: [0; STAGING_OFFSET],
            col: [0; SEGMENT],
        })
    }
}

/// Proof that the CPU has AVX: the only way to make one is [`Streaming::detect`].
#[derive(Clone, Copy)]
pub(super) struct Streaming(());

impl Streaming {
    /// `Some` if the CPU has AVX.
    #[cfg(target_arch = "x86_64")]
    pub(super) fn detect() -> Option<Self> {
        std::arch::is_x86_feature_detected!("avx").then_some(Streaming(()))
    }

    /// Copies `src` into `dst` (equal lengths), writing the whole cache lines of `dst` with
    /// streaming stores.
    #[inline(always)]
    pub(super) fn copy(self, dst: &mut [u8], src: &[u8]) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `self` exists, so the CPU has AVX, the only feature `copy_avx` is compiled
        // with.
        unsafe {
            copy_avx(dst, src)
        }
        #[cfg(not(target_arch = "x86_64"))]
        dst.copy_from_slice(src);
    }

    /// Orders the streaming stores before all later stores (`_mm_sfence`, SFENCE).
    #[inline(always)]
    pub(super) fn fence(self) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `_mm_sfence` needs SSE, which every x86-64 CPU has.
        unsafe {
            std::arch::x86_64::_mm_sfence();
        }
    }
}

/// [`Streaming::copy`]: ordinary stores up to the first line boundary of `dst` and after the
/// last one, `_mm256_stream_si256` for the whole lines in between.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
fn copy_avx(dst: &mut [u8], src: &[u8]) {
    use std::arch::x86_64::{_mm256_loadu_si256, _mm256_stream_si256};
    const HALF: usize = LINE / 2;
    let n = dst.len();
    let src = &src[..n];
    let head = dst.as_ptr().align_offset(LINE).min(n);
    let lines = (n - head) / LINE;
    let tail = head + lines * LINE;
    dst[..head].copy_from_slice(&src[..head]);
    for at in (head..tail).step_by(LINE) {
        for half in [at, at + HALF] {
            // SAFETY: `half + 32 <= at + LINE <= tail <= n`, the length of both slices, so both
            // 32-byte accesses are in bounds; `dst + half` is 32-byte aligned, as
            // `_mm256_stream_si256` requires, because `dst + head` is 64-byte aligned and
            // `half - head` is a multiple of 32; the load has no alignment requirement.
            unsafe {
                let v = _mm256_loadu_si256(src.as_ptr().add(half).cast());
                _mm256_stream_si256(dst.as_mut_ptr().add(half).cast(), v);
            }
        }
    }
    dst[tail..].copy_from_slice(&src[tail..]);
}

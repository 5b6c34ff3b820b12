//! Executing a matched collective on the threads of every rank that joined it.
//!
//! The elements of the ops are cut into chunks of [`CHUNK_ELEMENTS`]; every participating
//! rank's thread claims chunks from a shared counter until none is left, so the ranks share
//! the work and the first to arrive never waits for a slow one to do its part. An element's
//! value does not depend on which thread computes it: a sum is always
//! `x₀ + x₁ + … + x_{n−1}` in rank order in f32, over blocks of [`BLOCK`] elements held on
//! the stack (no allocation per call).
//!
//! Chunks of one op touch disjoint elements of every rank's regions, and element `e` of an op
//! is read and written by one thread only, which reads all of its inputs before it writes, so
//! NCCL's in-place forms are safe. Chunks of different ops run concurrently: the ops of one
//! group must not overlap in memory (`HostComm::group` refuses overlaps).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::collective::{Item, Kind, Region};
use crate::config::Dtype;
use crate::numerics::bf16::{bf16_to_f32, f32_to_bf16_rne};

/// Elements per claimed chunk: 256 KiB of f32, large enough that claiming costs nothing,
/// small enough that two ranks share a bucket of a few MB.
const CHUNK_ELEMENTS: usize = 1 << 16;

/// Elements summed at a time on the stack.
const BLOCK: usize = 1024;

#[derive(Debug, Clone, Copy)]
struct Chunk {
    op: usize,
    start: usize,
    end: usize,
}

/// One matched collective being executed: every rank's posted items, and the chunks left.
pub(super) struct Work {
    posts: Vec<Vec<Item>>,
    chunks: Vec<Chunk>,
    next: AtomicUsize,
    done: AtomicUsize,
    panic: Mutex<Option<String>>,
}

impl Work {
    /// The work of `posts` (`posts[r]` is rank r's list of items, all matched).
    pub(super) fn new(posts: Vec<Vec<Item>>) -> Work {
        let size = posts.len();
        let mut chunks = Vec::new();
        for (op, item) in posts[0].iter().enumerate() {
            let elements = match item.desc.kind {
                Kind::ReduceScatter | Kind::AllGather => item.desc.count * size,
                Kind::Reduce | Kind::Broadcast | Kind::AllReduce => item.desc.count,
                Kind::AllGatherU64 => 0,
            };
            chunks.extend((0..elements).step_by(CHUNK_ELEMENTS).map(|start| Chunk {
                op,
                start,
                end: (start + CHUNK_ELEMENTS).min(elements),
            }));
        }
        Work {
            posts,
            chunks,
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            panic: Mutex::new(None),
        }
    }

    /// True when there is nothing to compute (barriers, scalar exchanges, empty regions).
    pub(super) fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Every rank's items.
    pub(super) fn posts(&self) -> &[Vec<Item>] {
        &self.posts
    }

    /// Claims and runs chunks until none is left. Returns true if this call completed the
    /// last chunk (exactly one call does, once every chunk has run).
    pub(super) fn help(&self) -> bool {
        let total = self.chunks.len();
        let mut completed_last = false;
        loop {
            let i = self.next.fetch_add(1, Ordering::AcqRel);
            if i >= total {
                return completed_last;
            }
            let chunk = self.chunks[i];
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| self.run(chunk))) {
                let mut slot = self.panic.lock().unwrap_or_else(|e| e.into_inner());
                slot.get_or_insert_with(|| crate::error::panic_text(payload.as_ref()));
            }
            if self.done.fetch_add(1, Ordering::AcqRel) + 1 == total {
                completed_last = true;
            }
        }
    }

    /// The message of the first panic in a chunk, if any.
    pub(super) fn panic_message(&self) -> Option<String> {
        self.panic.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn item(&self, rank: usize, op: usize) -> Item {
        self.posts[rank][op]
    }

    fn run(&self, c: Chunk) {
        let size = self.posts.len();
        let desc = self.item(0, c.op).desc;
        let root = desc.root.unwrap_or(0);
        // SAFETY (every block below): the regions satisfy the `Region` contract while their
        // ranks wait for this collective; this chunk's elements are touched by this thread only.
        match desc.kind {
            Kind::Reduce => self.sums(c, usize::MAX, |acc, at| unsafe {
                store(self.item(root, c.op).recv, at, acc)
            }),
            Kind::AllReduce => self.sums(c, usize::MAX, |acc, at| {
                for r in 0..size {
                    unsafe { store(self.item(r, c.op).recv, at, acc) };
                }
            }),
            Kind::ReduceScatter => self.sums(c, desc.count, |acc, at| {
                let rank = at / desc.count;
                unsafe { store(self.item(rank, c.op).recv, at % desc.count, acc) };
            }),
            Kind::Broadcast => {
                let source = self.item(root, c.op).send;
                for r in (0..size).filter(|&r| r != root) {
                    unsafe { copy(source, c.start, self.item(r, c.op).recv, c.start, c.end - c.start) };
                }
            }
            Kind::AllGather => {
                let mut at = c.start;
                while at < c.end {
                    let (source, offset) = (at / desc.count, at % desc.count);
                    let len = (desc.count - offset).min(c.end - at);
                    let send = self.item(source, c.op).send;
                    for r in 0..size {
                        unsafe { copy(send, offset, self.item(r, c.op).recv, at, len) };
                    }
                    at += len;
                }
            }
            Kind::AllGatherU64 => {}
        }
    }

    /// Sums every rank's `send` over the chunk, block by block (blocks end at multiples of
    /// `split`), and hands each block's sums and first element to `write`.
    fn sums(&self, c: Chunk, split: usize, mut write: impl FnMut(&[f32], usize)) {
        let mut block = [0.0f32; BLOCK];
        let mut at = c.start;
        while at < c.end {
            let len = (c.end - at).min(BLOCK).min(split - at % split);
            let acc = &mut block[..len];
            // SAFETY: as in `run`; `at + len` is within every send region (its length is the
            // op's element space).
            unsafe {
                load(self.item(0, c.op).send, at, acc);
                for r in 1..self.posts.len() {
                    add(self.item(r, c.op).send, at, acc);
                }
            }
            write(acc, at);
            at += len;
        }
    }
}

/// `out = region[at..at + out.len()]` as f32.
///
/// # Safety
/// The region contract holds and the elements are in bounds.
unsafe fn load(src: Region, at: usize, out: &mut [f32]) {
    match src.dtype() {
        Dtype::F32 => out.copy_from_slice(unsafe { src.sub_f32s(at, out.len()) }),
        Dtype::Bf16 => {
            let len = out.len();
            for (o, &b) in out.iter_mut().zip(unsafe { src.sub_u16s(at, len) }) {
                *o = bf16_to_f32(b);
            }
        }
    }
}

/// `acc += region[at..at + acc.len()]` in f32, bf16 converted exactly.
///
/// # Safety
/// As for [`load`].
unsafe fn add(src: Region, at: usize, acc: &mut [f32]) {
    let len = acc.len();
    match src.dtype() {
        Dtype::F32 => {
            for (a, &x) in acc.iter_mut().zip(unsafe { src.sub_f32s(at, len) }) {
                *a += x;
            }
        }
        Dtype::Bf16 => {
            for (a, &x) in acc.iter_mut().zip(unsafe { src.sub_u16s(at, len) }) {
                *a += bf16_to_f32(x);
            }
        }
    }
}

/// Writes `values` at element `at` of `dst`, rounding once to bf16 (nearest even) for bf16.
///
/// # Safety
/// As for [`load`], and no other view of these elements is alive.
unsafe fn store(dst: Region, at: usize, values: &[f32]) {
    let size = dst.dtype().size();
    // SAFETY: in bounds and exclusive per the caller.
    let bytes = unsafe { std::slice::from_raw_parts_mut(dst.as_ptr().add(at * size), values.len() * size) };
    match dst.dtype() {
        Dtype::F32 => {
            for (out, v) in bytes.chunks_exact_mut(4).zip(values) {
                out.copy_from_slice(&v.to_ne_bytes());
            }
        }
        Dtype::Bf16 => {
            for (out, &v) in bytes.chunks_exact_mut(2).zip(values) {
                out.copy_from_slice(&f32_to_bf16_rne(v).to_ne_bytes());
            }
        }
    }
}

/// Copies `len` elements from element `src_at` of `src` to element `dst_at` of `dst`
/// (nothing when they are the same memory, the in-place forms).
///
/// # Safety
/// As for [`store`], for both regions.
unsafe fn copy(src: Region, src_at: usize, dst: Region, dst_at: usize, len: usize) {
    let size = src.dtype().size();
    let (from, to) = unsafe { (src.as_ptr().add(src_at * size), dst.as_ptr().add(dst_at * size)) };
    if from != to && len > 0 {
        // SAFETY: both ranges are in bounds; distinct ranges of one op never overlap.
        unsafe { std::ptr::copy_nonoverlapping(from, to, len * size) };
    }
}

//! The collectives of a host group: the caller memory they read and write ([`Region`]), the
//! ops ([`Collective`]) and what each rank posts for one (its [`Item`]), checked against NCCL's
//! rules before posting (see the parent module for the semantics).

use std::fmt;

use crate::config::Dtype;
use crate::error::{Error, ErrorKind, Result};
/// A range of `len` elements of `dtype` in caller memory, used as a collective's input or
/// output. Copyable: a region is a description, not an owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    ptr: *mut u8,
    len: usize,
    dtype: Dtype,
}

// SAFETY: a region is only dereferenced inside a collective, under the contract of
// `Region::new`: the memory stays valid and is accessed by nobody else until the collective
// returns, so moving or sharing the description between threads is sound.
unsafe impl Send for Region {}
// SAFETY: as for `Send`; `Region` has no interior mutability.
unsafe impl Sync for Region {}

impl Region {
    /// Describes `len` elements of `dtype` starting at `ptr`.
    ///
    /// # Safety
    /// For as long as any collective that receives this region (or a sub-region of it) has not
    /// returned, `ptr` must be valid for reads of `len` elements of `dtype` if the region is an
    /// input and for writes if it is an output, and nothing else may access that memory except
    /// through the collective. A region may be enqueued on a comm stream: the contract then
    /// extends until that queued op has completed or been dropped. Alignment is checked when
    /// the region is used; a zero-length region may use any pointer, including null.
    pub unsafe fn new(ptr: *mut u8, len: usize, dtype: Dtype) -> Region {
        Region { ptr, len, dtype }
    }

    /// Describes an f32 slice.
    ///
    /// # Safety
    /// The region outlives the borrow: the contract of [`Region::new`] applies.
    pub unsafe fn from_f32(data: &mut [f32]) -> Region {
        Region {
            ptr: data.as_mut_ptr().cast(),
            len: data.len(),
            dtype: Dtype::F32,
        }
    }

    /// Describes a slice of bf16 values (as `u16` bits).
    ///
    /// # Safety
    /// The region outlives the borrow: the contract of [`Region::new`] applies.
    pub unsafe fn from_bf16(data: &mut [u16]) -> Region {
        Region {
            ptr: data.as_mut_ptr().cast(),
            len: data.len(),
            dtype: Dtype::Bf16,
        }
    }

    /// An empty region of `dtype`.
    pub fn empty(dtype: Dtype) -> Region {
        Region {
            ptr: std::ptr::null_mut(),
            len: 0,
            dtype,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the region has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Element type.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// Address of the first element.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The `len` elements starting at element `offset` (for in-place forms: a rank's chunk of
    /// the whole buffer). Fails with `InvalidArgument` if the range does not fit.
    pub fn sub(&self, offset: usize, len: usize) -> Result<Region> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(Region {
                ptr: self.ptr.wrapping_add(offset * self.dtype.size()),
                len,
                dtype: self.dtype,
            }),
            _ => Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "region: elements {offset}..{offset}+{len} are outside the region of {} elements",
                    self.len
                ),
            )),
        }
    }

    pub(super) fn check(&self, op: Kind, role: &str) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        let size = self.dtype.size();
        if self.ptr.is_null() {
            return Err(invalid(format!("{op}: {role} is NULL with {} elements", self.len)));
        }
        let aligned = match self.dtype {
            Dtype::F32 => self.ptr.cast::<f32>().is_aligned(),
            Dtype::Bf16 => self.ptr.cast::<u16>().is_aligned(),
        };
        if !aligned {
            return Err(invalid(format!(
                "{op}: {role} at {:p} is not aligned to its {}-byte {} elements",
                self.ptr,
                size,
                self.dtype.name()
            )));
        }
        if self
            .len
            .checked_mul(size)
            .is_none_or(|bytes| bytes > isize::MAX as usize)
        {
            return Err(invalid(format!("{op}: {role} of {} elements is too large", self.len)));
        }
        Ok(())
    }

    /// The addresses the region covers, as a half-open byte range.
    pub(super) fn address_range(&self) -> std::ops::Range<usize> {
        let start = self.ptr as usize;
        start..start + self.len * self.dtype.size()
    }

    /// Elements `at..at + len` as f32 values (`dtype` must be f32).
    ///
    /// # Safety
    /// The region contract holds, the elements are in bounds, and no mutable view of them is
    /// alive; alignment and non-null were checked at posting.
    pub(super) unsafe fn sub_f32s<'a>(self, at: usize, len: usize) -> &'a [f32] {
        // SAFETY: per the caller's promise.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<f32>().add(at), len) }
    }

    /// Elements `at..at + len` as bf16 bits (`dtype` must be bf16).
    ///
    /// # Safety
    /// As for [`Region::sub_f32s`].
    pub(super) unsafe fn sub_u16s<'a>(self, at: usize, len: usize) -> &'a [u16] {
        // SAFETY: per the caller's promise.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u16>().add(at), len) }
    }
}

pub(super) fn invalid(message: String) -> Error {
    Error::new(ErrorKind::InvalidArgument, message)
}

/// One data collective (NCCL semantics, sum only). All regions of an op share one dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collective {
    /// `ncclReduce`: the sum of every rank's `send` is written to `recv` of rank `root`; the
    /// other ranks' `recv` is not written. `send` and `recv` have equal lengths; in place:
    /// `send == recv`.
    Reduce { root: usize, send: Region, recv: Region },
    /// `ncclBroadcast` in place: `buf` of rank `root` is copied into `buf` of every rank.
    Broadcast { root: usize, buf: Region },
    /// `ncclReduceScatter`: `send` holds `size × c` elements, `recv` receives chunk `rank` of the
    /// sum (`c` elements). In place: `recv = send.sub(rank·c, c)`.
    ReduceScatter { send: Region, recv: Region },
    /// `ncclAllGather`: `recv` (`size × c` elements) receives every rank's `send` (`c`
    /// elements) in rank order. In place: `send = recv.sub(rank·c, c)`.
    AllGather { send: Region, recv: Region },
    /// `ncclAllReduce`: every rank's `recv` receives the sum of all `send`s; equal lengths; in
    /// place: `send == recv`.
    AllReduce { send: Region, recv: Region },
}

impl Collective {
    /// Checks the regions against each other, the rank and the group size and builds the
    /// posted item.
    pub(super) fn item(&self, rank: usize, size: usize) -> Result<Item> {
        let (kind, root, send, recv) = match *self {
            Collective::Reduce { root, send, recv } => (Kind::Reduce, Some(root), send, recv),
            Collective::Broadcast { root, buf } => (Kind::Broadcast, Some(root), buf, buf),
            Collective::ReduceScatter { send, recv } => (Kind::ReduceScatter, None, send, recv),
            Collective::AllGather { send, recv } => (Kind::AllGather, None, send, recv),
            Collective::AllReduce { send, recv } => (Kind::AllReduce, None, send, recv),
        };
        send.check(kind, "send")?;
        recv.check(kind, "recv")?;
        if send.dtype != recv.dtype {
            return Err(invalid(format!(
                "{kind}: send is {} but recv is {}",
                send.dtype.name(),
                recv.dtype.name()
            )));
        }
        if let Some(root) = root.filter(|&root| root >= size) {
            return Err(invalid(format!("{kind}: root {root} is outside 0..{size}")));
        }
        let count = match kind {
            Kind::ReduceScatter => {
                if recv.len.checked_mul(size) != Some(send.len) {
                    return Err(invalid(format!(
                        "{kind}: send has {} elements but must have recv's {} × {size} ranks",
                        send.len, recv.len
                    )));
                }
                recv.len
            }
            Kind::AllGather => {
                if send.len.checked_mul(size) != Some(recv.len) {
                    return Err(invalid(format!(
                        "{kind}: recv has {} elements but must have send's {} × {size} ranks",
                        recv.len, send.len
                    )));
                }
                send.len
            }
            _ => {
                if send.len != recv.len {
                    return Err(invalid(format!(
                        "{kind}: send has {} elements but recv has {}",
                        send.len, recv.len
                    )));
                }
                send.len
            }
        };
        check_in_place(kind, rank, count, send, recv)?;
        Ok(Item {
            desc: Desc {
                kind,
                dtype: send.dtype,
                count,
                root,
            },
            send,
            recv,
            value: 0,
        })
    }
}

/// `send` and `recv` of one op may only overlap in NCCL's in-place form: the same region for
/// reduce, broadcast and all-reduce; `recv` = chunk `rank` of `send` for reduce-scatter; `send`
/// = chunk `rank` of `recv` for all-gather.
fn check_in_place(kind: Kind, rank: usize, count: usize, send: Region, recv: Region) -> Result<()> {
    let (s, r) = (send.address_range(), recv.address_range());
    if send.is_empty() || recv.is_empty() || s.end <= r.start || r.end <= s.start {
        return Ok(());
    }
    let chunk = count * send.dtype.size();
    let in_place = match kind {
        Kind::ReduceScatter => r.start == s.start + rank * chunk && r.len() == chunk,
        Kind::AllGather => s.start == r.start + rank * chunk && s.len() == chunk,
        _ => s == r,
    };
    if in_place {
        return Ok(());
    }
    Err(invalid(format!(
        "{kind}: send {:#x}..{:#x} and recv {:#x}..{:#x} overlap but are not the in-place form of rank {rank}",
        s.start, s.end, r.start, r.end
    )))
}

/// The ops of one group run concurrently, so their memory must not overlap (NCCL leaves it
/// undefined too).
pub(super) fn check_disjoint(items: &[Item]) -> Result<()> {
    let mut ranges: Vec<(std::ops::Range<usize>, usize)> = items
        .iter()
        .enumerate()
        .flat_map(|(op, item)| [(item.send, op), (item.recv, op)])
        .filter(|(region, _)| !region.is_empty())
        .map(|(region, op)| (region.address_range(), op))
        .collect();
    ranges.sort_by_key(|(range, _)| range.start);
    let mut reach: Option<(usize, usize)> = None;
    for (range, op) in ranges {
        if let Some((_, other)) = reach.filter(|&(end, other)| other != op && range.start < end) {
            return Err(invalid(format!(
                "group: op {op} ({}) and op {other} ({}) overlap in memory at {:#x}; the ops of one group must use disjoint memory",
                items[op].desc, items[other].desc, range.start
            )));
        }
        if reach.is_none_or(|(end, _)| range.end > end) {
            reach = Some((range.end, op));
        }
    }
    Ok(())
}

/// The operation kinds, including the private scalar exchanges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Reduce,
    Broadcast,
    ReduceScatter,
    AllGather,
    AllReduce,
    AllGatherU64,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Reduce => "reduce",
            Kind::Broadcast => "broadcast",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::AllGather => "all_gather",
            Kind::AllReduce => "all_reduce",
            Kind::AllGatherU64 => "all_gather_u64",
        })
    }
}

/// What must agree across ranks for one op: kind, dtype, element count (per rank for
/// reduce-scatter and all-gather, as in NCCL) and root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Desc {
    pub(super) kind: Kind,
    pub(super) dtype: Dtype,
    pub(super) count: usize,
    pub(super) root: Option<usize>,
}

impl fmt::Display for Desc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.kind, self.root) {
            (Kind::AllGatherU64, _) => write!(f, "{}(one value)", self.kind),
            (kind, Some(root)) => write!(f, "{kind}(root={root}, {}, count={})", self.dtype.name(), self.count),
            (kind, None) => write!(f, "{kind}({}, count={})", self.dtype.name(), self.count),
        }
    }
}

/// One op as posted by one rank: what must match, and this rank's memory or value.
#[derive(Debug, Clone, Copy)]
pub(super) struct Item {
    pub(super) desc: Desc,
    pub(super) send: Region,
    pub(super) recv: Region,
    pub(super) value: u64,
}

impl Item {
    pub(super) fn scalar(kind: Kind, value: u64) -> Item {
        Item {
            desc: Desc {
                kind,
                dtype: Dtype::F32,
                count: 1,
                root: None,
            },
            send: Region::empty(Dtype::F32),
            recv: Region::empty(Dtype::F32),
            value,
        }
    }
}

/// Describes the ops of one call for messages.
pub(super) fn describe(items: &[Item]) -> String {
    match items {
        [] => "barrier".to_string(),
        [one] => one.desc.to_string(),
        many => {
            let parts: Vec<String> = many.iter().map(|i| i.desc.to_string()).collect();
            format!("group[{}]", parts.join(", "))
        }
    }
}

pub(super) fn same_descs(a: &[Item], b: &[Item]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.desc == y.desc)
}

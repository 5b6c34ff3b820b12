//! NCCL on the emulated device, as strict as the real library: every call of a group is checked
//! against what NCCL documents — counts, datatypes, roots in range, element-aligned buffers
//! inside their allocations, the in-place rules of its user guide ("In-place Operations":
//! `ncclReduceScatter` in place when `recvbuff == sendbuff + rank·recvcount`, `ncclAllGather`
//! when `sendbuff == recvbuff + rank·sendcount`, the others when `sendbuff == recvbuff`), no
//! other overlap of a call's send and receive buffers, and no call of a group writing what
//! another call of the same group reads or writes (NCCL runs a group's calls concurrently) —
//! then run over the host group of its communicator (a one-rank group when the emulator has
//! none), with the host collectives' arithmetic, which the host backend uses too.

use muon_opt::backend::cuda::action::{DevPtr, NcclCall, NcclComm, NcclType};
use muon_opt::backend::host::comm::{Collective, Region};

use super::Emulator;

fn elem(dtype: NcclType) -> u64 {
    match dtype {
        NcclType::U8 => 1,
        NcclType::Bf16 => 2,
        NcclType::F32 => 4,
        NcclType::U64 | NcclType::F64 => 8,
    }
}

/// A byte range of device memory.
#[derive(Debug, Clone, Copy)]
struct Range {
    start: DevPtr,
    bytes: u64,
}

impl Range {
    fn overlaps(&self, other: &Range) -> bool {
        self.bytes > 0
            && other.bytes > 0
            && self.start < other.start + other.bytes
            && other.start < self.start + self.bytes
    }
}

/// What a call reads and writes on this rank.
struct Buffers {
    send: Range,
    recv: Range,
}

/// Checks one call against NCCL's documented rules for rank `rank` of `size`.
fn buffers(call: &NcclCall, size: u64, rank: u64) -> Buffers {
    let range = |start, count, dtype| Range {
        start,
        bytes: count * elem(dtype),
    };
    let check_root = |root: u32| assert!(u64::from(root) < size, "{call:?}: root {root} of {size} ranks");
    let (send, recv, in_place) = match *call {
        NcclCall::AllReduce {
            send,
            recv,
            count,
            dtype,
        } => (range(send, count, dtype), range(recv, count, dtype), send == recv),
        NcclCall::Reduce {
            send,
            recv,
            count,
            dtype,
            root,
        } => {
            check_root(root);
            // recvbuff is only used on the root.
            let recv_count = if u64::from(root) == rank { count } else { 0 };
            (range(send, count, dtype), range(recv, recv_count, dtype), send == recv)
        }
        NcclCall::Broadcast {
            send,
            recv,
            count,
            dtype,
            root,
        } => {
            check_root(root);
            // sendbuff is only used on the root.
            let send_count = if u64::from(root) == rank { count } else { 0 };
            (range(send, send_count, dtype), range(recv, count, dtype), send == recv)
        }
        NcclCall::ReduceScatter {
            send,
            recv,
            recv_count,
            dtype,
        } => (
            range(send, recv_count * size, dtype),
            range(recv, recv_count, dtype),
            recv == send + rank * recv_count * elem(dtype),
        ),
        NcclCall::AllGather {
            send,
            recv,
            send_count,
            dtype,
        } => (
            range(send, send_count, dtype),
            range(recv, send_count * size, dtype),
            send == recv + rank * send_count * elem(dtype),
        ),
    };
    let dtype = dtype_of(call);
    for (what, r) in [("sendbuff", send), ("recvbuff", recv)] {
        assert!(
            r.bytes == 0 || r.start % elem(dtype) == 0,
            "{call:?}: {what} {:#x} is not aligned to its {dtype:?} elements",
            r.start
        );
    }
    assert!(
        in_place || !send.overlaps(&recv),
        "{call:?}: send and receive buffers overlap without being NCCL's in-place case"
    );
    if !matches!(call, NcclCall::AllGather { .. } | NcclCall::Broadcast { .. }) {
        assert!(
            matches!(dtype, NcclType::F32 | NcclType::Bf16 | NcclType::F64),
            "{call:?}: a sum of {dtype:?} values"
        );
    }
    Buffers { send, recv }
}

fn dtype_of(call: &NcclCall) -> NcclType {
    match *call {
        NcclCall::AllReduce { dtype, .. }
        | NcclCall::Reduce { dtype, .. }
        | NcclCall::Broadcast { dtype, .. }
        | NcclCall::ReduceScatter { dtype, .. }
        | NcclCall::AllGather { dtype, .. } => dtype,
    }
}

/// Checks every call of a group and that no call writes memory another call of the group
/// touches.
fn check_group(calls: &[NcclCall], size: u64, rank: u64) {
    let all: Vec<Buffers> = calls.iter().map(|c| buffers(c, size, rank)).collect();
    for (i, a) in all.iter().enumerate() {
        for (j, b) in all.iter().enumerate().filter(|&(j, _)| j != i) {
            assert!(
                !a.recv.overlaps(&b.recv) && !a.recv.overlaps(&b.send),
                "calls {i} and {j} of one NCCL group race: {:?} writes what {:?} touches",
                calls[i],
                calls[j]
            );
        }
    }
}

/// Device memory copied out for a host collective and back after it.
enum Staged {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
}

impl Staged {
    fn read(emu: &Emulator, ptr: DevPtr, count: u64, dtype: NcclType) -> Staged {
        match dtype {
            NcclType::F32 => Staged::F32((0..count).map(|i| emu.ld_f32(ptr + 4 * i)).collect()),
            // Bytes of any other type move through bf16 words (copies only: checked above).
            _ => {
                let bytes = emu.span(ptr, (count * elem(dtype)) as usize);
                assert!(
                    bytes.len().is_multiple_of(2),
                    "{count} {dtype:?} values are an odd number of bytes"
                );
                Staged::Bf16(bytes.chunks(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect())
            }
        }
    }

    fn zeros(count: u64, dtype: NcclType) -> Staged {
        match dtype {
            NcclType::F32 => Staged::F32(vec![0.0; count as usize]),
            _ => Staged::Bf16(vec![0; (count * elem(dtype) / 2) as usize]),
        }
    }

    /// # Safety
    /// The region is used only while `self` lives and is not moved.
    unsafe fn region(&mut self) -> Region {
        // SAFETY: the caller keeps `self` alive and in place while the region is used.
        unsafe {
            match self {
                Staged::F32(v) => Region::from_f32(v),
                Staged::Bf16(v) => Region::from_bf16(v),
            }
        }
    }

    fn write(&self, emu: &mut Emulator, ptr: DevPtr) {
        let bytes: Vec<u8> = match self {
            Staged::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Staged::Bf16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        };
        if !bytes.is_empty() {
            emu.span_mut(ptr, bytes.len()).copy_from_slice(&bytes);
        }
    }
}

impl Emulator {
    /// One NCCL group on communicator `which`: checked, then run as one host group.
    pub(super) fn nccl_group(&mut self, which: NcclComm, calls: &[NcclCall]) {
        let index = self.comms.iter().position(|(c, _)| *c == which);
        let (size, rank) = index.map_or((1, 0), |i| (self.comms[i].1.size(), self.comms[i].1.rank()));
        check_group(calls, size as u64, rank as u64);
        // The communicators are set aside while the group writes back into device memory.
        let comms = std::mem::take(&mut self.comms);
        let group = index.map(|i| &comms[i].1);
        let (f64_sums, others): (Vec<&NcclCall>, Vec<&NcclCall>) = calls.iter().partition(|c| {
            matches!(
                c,
                NcclCall::AllReduce {
                    dtype: NcclType::F64,
                    ..
                }
            )
        });
        let mut staged = self.stage(&others, size as u64);
        let ops: Vec<Collective> = staged
            .iter_mut()
            .zip(&others)
            .map(|((send, recv), call)| {
                // SAFETY: `staged` outlives the group below and is not moved while it runs.
                let (send, recv) = unsafe { (send.region(), recv.region()) };
                match **call {
                    NcclCall::AllReduce { .. } => Collective::AllReduce { send, recv },
                    NcclCall::Reduce { root, .. } => Collective::Reduce {
                        root: root as usize,
                        send,
                        recv,
                    },
                    NcclCall::Broadcast { root, .. } => Collective::Broadcast {
                        root: root as usize,
                        buf: if rank == root as usize { send } else { recv },
                    },
                    NcclCall::ReduceScatter { .. } => Collective::ReduceScatter { send, recv },
                    NcclCall::AllGather { .. } => Collective::AllGather { send, recv },
                }
            })
            .collect();
        match group {
            Some(group) => group.group(&ops).unwrap(),
            None => one_rank(&mut staged, &others),
        }
        drop(ops);
        for ((send, recv), call) in staged.iter().zip(&others) {
            let recv_ptr = recv_of(call);
            match call {
                NcclCall::Broadcast { root, .. } if rank == *root as usize => send.write(self, recv_ptr),
                NcclCall::Reduce { root, .. } if rank != *root as usize => {}
                _ => recv.write(self, recv_ptr),
            }
        }
        for call in f64_sums {
            let NcclCall::AllReduce { send, recv, count, .. } = *call else {
                unreachable!()
            };
            let sums: Vec<f64> = (0..count)
                .map(|i| {
                    let value = self.ld_f64(send + 8 * i);
                    let all = group.map_or(vec![value.to_bits()], |g| g.all_gather_u64(value.to_bits()).unwrap());
                    all.iter()
                        .skip(1)
                        .fold(f64::from_bits(all[0]), |acc, &b| acc + f64::from_bits(b))
                })
                .collect();
            for (i, sum) in sums.into_iter().enumerate() {
                self.st_f64(recv + 8 * i as u64, sum);
            }
        }
        self.comms = comms;
    }

    /// Each call's send and receive memory, copied out.
    fn stage(&self, calls: &[&NcclCall], size: u64) -> Vec<(Staged, Staged)> {
        calls
            .iter()
            .map(|call| match **call {
                NcclCall::AllReduce { send, count, dtype, .. }
                | NcclCall::Reduce { send, count, dtype, .. }
                | NcclCall::Broadcast { send, count, dtype, .. } => {
                    (Staged::read(self, send, count, dtype), Staged::zeros(count, dtype))
                }
                NcclCall::ReduceScatter {
                    send,
                    recv_count,
                    dtype,
                    ..
                } => (
                    Staged::read(self, send, recv_count * size, dtype),
                    Staged::zeros(recv_count, dtype),
                ),
                NcclCall::AllGather {
                    send,
                    send_count,
                    dtype,
                    ..
                } => (
                    Staged::read(self, send, send_count, dtype),
                    Staged::zeros(send_count * size, dtype),
                ),
            })
            .collect()
    }
}

fn recv_of(call: &NcclCall) -> DevPtr {
    match *call {
        NcclCall::AllReduce { recv, .. }
        | NcclCall::Reduce { recv, .. }
        | NcclCall::Broadcast { recv, .. }
        | NcclCall::ReduceScatter { recv, .. }
        | NcclCall::AllGather { recv, .. } => recv,
    }
}

/// A one-rank group: every collective moves the rank's own values from send to receive.
fn one_rank(staged: &mut [(Staged, Staged)], calls: &[&NcclCall]) {
    for ((send, recv), call) in staged.iter_mut().zip(calls) {
        if !matches!(call, NcclCall::Broadcast { .. }) {
            *recv = match send {
                Staged::F32(v) => Staged::F32(v.clone()),
                Staged::Bf16(v) => Staged::Bf16(v.clone()),
            };
        }
    }
}

/// Calls NCCL documents as invalid or undefined are refused; its in-place forms are not.
#[cfg(test)]
mod rules {
    use super::*;

    const F32: NcclType = NcclType::F32;

    fn gather(send: DevPtr, recv: DevPtr) -> NcclCall {
        NcclCall::AllGather {
            send,
            recv,
            send_count: 4,
            dtype: F32,
        }
    }

    #[test]
    fn in_place_forms_pass() {
        // Rank 1 of 2: its chunk starts at recv + 1·16 bytes.
        check_group(&[gather(0x1010, 0x1000)], 2, 1);
        let scatter = NcclCall::ReduceScatter {
            send: 0x1000,
            recv: 0x1010,
            recv_count: 4,
            dtype: F32,
        };
        check_group(&[scatter], 2, 1);
        let reduce = NcclCall::AllReduce {
            send: 0x2000,
            recv: 0x2000,
            count: 8,
            dtype: NcclType::Bf16,
        };
        check_group(&[reduce, gather(0x3000, 0x4000)], 2, 0);
    }

    #[test]
    #[should_panic(expected = "overlap without being NCCL's in-place case")]
    fn an_all_gather_in_place_at_another_rank_offset_is_refused() {
        check_group(&[gather(0x1000, 0x1000)], 2, 1);
    }

    #[test]
    #[should_panic(expected = "overlap without being NCCL's in-place case")]
    fn a_reduce_scatter_in_place_at_another_rank_offset_is_refused() {
        let scatter = NcclCall::ReduceScatter {
            send: 0x1000,
            recv: 0x1000,
            recv_count: 4,
            dtype: F32,
        };
        check_group(&[scatter], 2, 1);
    }

    #[test]
    #[should_panic(expected = "root 2 of 2 ranks")]
    fn a_root_out_of_range_is_refused() {
        let broadcast = NcclCall::Broadcast {
            send: 0x1000,
            recv: 0x1000,
            count: 4,
            dtype: F32,
            root: 2,
        };
        check_group(&[broadcast], 2, 0);
    }

    #[test]
    #[should_panic(expected = "is not aligned")]
    fn a_misaligned_buffer_is_refused() {
        check_group(&[gather(0x1002, 0x2000)], 2, 0);
    }

    #[test]
    #[should_panic(expected = "of one NCCL group race")]
    fn calls_of_a_group_writing_what_another_reads_are_refused() {
        let reduce = NcclCall::Reduce {
            send: 0x2000,
            recv: 0x1000,
            count: 4,
            dtype: F32,
            root: 0,
        };
        check_group(&[gather(0x1000, 0x3000), reduce], 2, 0);
    }

    #[test]
    #[should_panic(expected = "a sum of U8 values")]
    fn a_sum_of_bytes_is_refused() {
        let reduce = NcclCall::AllReduce {
            send: 0x1000,
            recv: 0x2000,
            count: 8,
            dtype: NcclType::U8,
        };
        check_group(&[reduce], 2, 0);
    }
}

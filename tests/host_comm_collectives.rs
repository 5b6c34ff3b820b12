//! Host communicator collectives: every op kind, f32 and bf16, out of place and in place, in
//! groups, bit-identical to the sequential rank-order sum `acc = x₀; acc += x₁; …`.

mod support;

use std::time::Duration;

use muon_opt::backend::host::comm::{Collective, HostComm, HostGroup, Region};
use muon_opt::config::Dtype;
use muon_opt::numerics::bf16::{bf16_to_f32, f32_to_bf16_rne};
use support::ranks::on_ranks;
use support::rng::Rng;

const DP: usize = 4;
const TIMEOUT: Duration = Duration::from_secs(60);
const DTYPES: [Dtype; 2] = [Dtype::F32, Dtype::Bf16];
/// Per-rank element counts: one that fits a single work chunk of the group, and one spread
/// over several (2^16-element) chunks that the ranks' threads compute in parallel, ending
/// mid-chunk and mid-block.
const LENS: [usize; 2] = [1000, 3 * 65_536 + 1_077];

/// A rank's buffer of either dtype.
#[derive(Debug, Clone, PartialEq)]
enum Buf {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
}

impl Buf {
    /// `len` pseudo-random finite values of varied magnitude, exactly representable in `dtype`.
    fn random(dtype: Dtype, len: usize, seed: u64) -> Buf {
        let mut rng = Rng::new(seed);
        let values = (0..len).map(|_| {
            let z = rng.next_u64();
            let unit = (z >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            let exponent = (z & 0x1F) as i32 - 12;
            unit * 2f32.powi(exponent)
        });
        match dtype {
            Dtype::F32 => Buf::F32(values.collect()),
            Dtype::Bf16 => Buf::Bf16(values.map(f32_to_bf16_rne).collect()),
        }
    }

    /// `len` copies of `value` (rounded to bf16 for bf16).
    fn filled(dtype: Dtype, len: usize, value: f32) -> Buf {
        match dtype {
            Dtype::F32 => Buf::F32(vec![value; len]),
            Dtype::Bf16 => Buf::Bf16(vec![f32_to_bf16_rne(value); len]),
        }
    }

    /// Exact f32 values.
    fn values(&self) -> Vec<f32> {
        match self {
            Buf::F32(v) => v.clone(),
            Buf::Bf16(v) => v.iter().map(|&b| bf16_to_f32(b)).collect(),
        }
    }

    /// The elements' bit patterns, for bitwise comparison.
    fn bits(&self) -> Vec<u32> {
        match self {
            Buf::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
            Buf::Bf16(v) => v.iter().map(|&b| u32::from(b)).collect(),
        }
    }

    fn region(&mut self) -> Region {
        // SAFETY: every test uses the region only within the collective call it passes it to,
        // while the buffer lives and is not otherwise accessed.
        match self {
            Buf::F32(v) => unsafe { Region::from_f32(v) },
            Buf::Bf16(v) => unsafe { Region::from_bf16(v) },
        }
    }
}

/// The expected result bits: `acc = x₀; acc += x₁; …` in f32, rounded once to `dtype`.
fn rank_order_sum(dtype: Dtype, inputs: &[Buf]) -> Vec<u32> {
    let mut acc = inputs[0].values();
    for input in &inputs[1..] {
        for (a, x) in acc.iter_mut().zip(input.values()) {
            *a += x;
        }
    }
    match dtype {
        Dtype::F32 => acc.iter().map(|x| x.to_bits()).collect(),
        Dtype::Bf16 => acc.iter().map(|&x| u32::from(f32_to_bf16_rne(x))).collect(),
    }
}

fn inputs(dtype: Dtype, len: usize, seed: u64) -> Vec<Buf> {
    (0..DP)
        .map(|r| Buf::random(dtype, len, seed * 100 + r as u64))
        .collect()
}

#[test]
fn reduce_writes_rank_order_sum_on_root_only() {
    for (dtype, len) in DTYPES.into_iter().flat_map(|d| LENS.map(|l| (d, l))) {
        for root in 0..DP {
            let sends = inputs(dtype, len, root as u64);
            let expected = rank_order_sum(dtype, &sends);
            let sentinel = Buf::filled(dtype, len, 7.0);
            let results = on_ranks(&HostGroup::new(DP, TIMEOUT), |_, comm| {
                let mut send = sends[comm.rank()].clone();
                let mut recv = sentinel.clone();
                comm.reduce(root, send.region(), recv.region()).unwrap();
                (send, recv)
            });
            for (rank, (send, recv)) in results.into_iter().enumerate() {
                assert_eq!(send, sends[rank], "{dtype:?} root {root}: rank {rank}'s send changed");
                if rank == root {
                    assert_eq!(recv.bits(), expected, "{dtype:?} root {root}");
                } else {
                    assert_eq!(
                        recv, sentinel,
                        "{dtype:?} root {root}: non-root rank {rank}'s recv was written"
                    );
                }
            }
        }
    }
}

#[test]
fn reduce_in_place_sums_into_root_region() {
    for dtype in DTYPES {
        let root = 2;
        let sends = inputs(dtype, 777, 11);
        let expected = rank_order_sum(dtype, &sends);
        let results = on_ranks(&HostGroup::new(DP, TIMEOUT), |_, comm| {
            let mut buf = sends[comm.rank()].clone();
            let region = buf.region();
            comm.reduce(root, region, region).unwrap();
            buf
        });
        for (rank, buf) in results.into_iter().enumerate() {
            if rank == root {
                assert_eq!(buf.bits(), expected, "{dtype:?}");
            } else {
                assert_eq!(buf, sends[rank], "{dtype:?}: non-root rank {rank}'s buffer changed");
            }
        }
    }
}

#[test]
fn all_reduce_gives_every_rank_the_rank_order_sum() {
    for (dtype, len) in DTYPES.into_iter().flat_map(|d| LENS.map(|l| (d, l))) {
        let sends = inputs(dtype, len, 3);
        let expected = rank_order_sum(dtype, &sends);
        let in_place = on_ranks(&HostGroup::new(DP, TIMEOUT), |_, comm| {
            let mut buf = sends[comm.rank()].clone();
            comm.all_reduce(buf.region()).unwrap();
            buf
        });
        let out_of_place = on_ranks(&HostGroup::new(DP, TIMEOUT), |_, comm| {
            let mut send = sends[comm.rank()].clone();
            let mut recv = Buf::filled(dtype, len, 0.0);
            comm.group(&[Collective::AllReduce {
                send: send.region(),
                recv: recv.region(),
            }])
            .unwrap();
            assert_eq!(send, sends[comm.rank()], "send changed");
            recv
        });
        for rank in 0..DP {
            assert_eq!(in_place[rank].bits(), expected, "{dtype:?} in place, rank {rank}");
            assert_eq!(
                out_of_place[rank].bits(),
                expected,
                "{dtype:?} out of place, rank {rank}"
            );
        }
    }
}

#[test]
fn reduce_scatter_gives_each_rank_its_chunk_of_the_sum() {
    for (dtype, chunk) in DTYPES.into_iter().flat_map(|d| [333, 70_001].map(|c| (d, c))) {
        let sends = inputs(dtype, DP * chunk, 5);
        let expected = rank_order_sum(dtype, &sends);
        let out_of_place = on_ranks(&HostGroup::new(DP, TIMEOUT), |_, comm| {
            let mut send = sends[comm.rank()].clone();
            let mut recv = Buf::filled(dtype, chunk, 0.0);
            comm.reduce_scatter(send.region(), recv.region()).unwrap();
            recv.bits()
        });
        let in_place = on_ranks(&HostGroup::new(DP, TIMEOUT), |_, comm| {
            let mut buf = sends[comm.rank()].clone();
            let whole = buf.region();
            let mine = whole.sub(comm.rank() * chunk, chunk).unwrap();
            comm.reduce_scatter(whole, mine).unwrap();
            buf.bits()
        });
        for rank in 0..DP {
            let range = rank * chunk..(rank + 1) * chunk;
            assert_eq!(
                out_of_place[rank],
                expected[range.clone()],
                "{dtype:?} out of place, rank {rank}"
            );
            assert_eq!(
                in_place[rank][range.clone()],
                expected[range],
                "{dtype:?} in place, rank {rank}"
            );
        }
    }
}

#[test]
fn all_gather_concatenates_chunks_in_rank_order() {
    for (dtype, chunk) in DTYPES.into_iter().flat_map(|d| [257, 70_001].map(|c| (d, c))) {
        let chunks = inputs(dtype, chunk, 9);
        let expected: Vec<u32> = chunks.iter().flat_map(Buf::bits).collect();
        let out_of_place = on_ranks(&HostGroup::new(DP, TIMEOUT), |_, comm| {
            let mut send = chunks[comm.rank()].clone();
            let mut recv = Buf::filled(dtype, DP * chunk, 0.0);
            comm.all_gather(send.region(), recv.region()).unwrap();
            recv.bits()
        });
        let in_place = on_ranks(&HostGroup::new(DP, TIMEOUT), |_, comm| {
            let rank = comm.rank();
            let mut whole = Buf::random(dtype, DP * chunk, 1000 + rank as u64);
            let mut mine = whole.values();
            mine[rank * chunk..(rank + 1) * chunk].copy_from_slice(&chunks[rank].values());
            whole = match dtype {
                Dtype::F32 => Buf::F32(mine),
                Dtype::Bf16 => Buf::Bf16(mine.into_iter().map(f32_to_bf16_rne).collect()),
            };
            let region = whole.region();
            comm.all_gather(region.sub(rank * chunk, chunk).unwrap(), region)
                .unwrap();
            whole.bits()
        });
        for rank in 0..DP {
            assert_eq!(out_of_place[rank], expected, "{dtype:?} out of place, rank {rank}");
            assert_eq!(in_place[rank], expected, "{dtype:?} in place, rank {rank}");
        }
    }
}

#[test]
fn broadcast_copies_the_root_buffer_bitwise() {
    for (dtype, len) in DTYPES.into_iter().flat_map(|d| LENS.map(|l| (d, l))) {
        for root in 0..DP {
            let bufs = inputs(dtype, len, 20 + root as u64);
            let results = on_ranks(&HostGroup::new(DP, TIMEOUT), |_, comm| {
                let mut buf = bufs[comm.rank()].clone();
                comm.broadcast(root, buf.region()).unwrap();
                buf
            });
            for (rank, buf) in results.into_iter().enumerate() {
                assert_eq!(buf, bufs[root], "{dtype:?} root {root}, rank {rank}");
            }
        }
    }
}

/// The compact layout's grad and param sync: grouped in-place reduces of each owner's range to
/// its owner, then grouped broadcasts from the owners; ranges of different sizes, one empty.
#[test]
fn grouped_reduce_to_owners_then_broadcast_from_owners() {
    let ranges = [(0, 100), (100, 0), (100, 64), (164, 150_300)];
    let len = 150_464;
    for dtype in DTYPES {
        let grads = inputs(dtype, len, 30);
        let expected = rank_order_sum(dtype, &grads);
        let after_reduce = on_ranks(&HostGroup::new(DP, TIMEOUT), |_, comm| {
            let mut buf = grads[comm.rank()].clone();
            let whole = buf.region();
            let ops: Vec<Collective> = ranges
                .iter()
                .enumerate()
                .map(|(owner, &(start, n))| {
                    let range = whole.sub(start, n).unwrap();
                    Collective::Reduce {
                        root: owner,
                        send: range,
                        recv: range,
                    }
                })
                .collect();
            comm.group(&ops).unwrap();
            buf.bits()
        });
        for (rank, bits) in after_reduce.iter().enumerate() {
            for (owner, &(start, n)) in ranges.iter().enumerate() {
                let want = if owner == rank {
                    &expected[start..start + n]
                } else {
                    &grads[rank].bits()[start..start + n]
                };
                assert_eq!(
                    &bits[start..start + n],
                    want,
                    "{dtype:?} rank {rank}, range of owner {owner}"
                );
            }
        }
        let params = inputs(dtype, len, 40);
        let after_broadcast = on_ranks(&HostGroup::new(DP, TIMEOUT), |_, comm| {
            let mut buf = params[comm.rank()].clone();
            let whole = buf.region();
            let ops: Vec<Collective> = ranges
                .iter()
                .enumerate()
                .map(|(owner, &(start, n))| Collective::Broadcast {
                    root: owner,
                    buf: whole.sub(start, n).unwrap(),
                })
                .collect();
            comm.group(&ops).unwrap();
            buf.bits()
        });
        let mut owners_view = vec![0u32; len];
        for (owner, &(start, n)) in ranges.iter().enumerate() {
            owners_view[start..start + n].copy_from_slice(&params[owner].bits()[start..start + n]);
        }
        for (rank, bits) in after_broadcast.iter().enumerate() {
            assert_eq!(bits, &owners_view, "{dtype:?} rank {rank}");
        }
    }
}

/// One group mixing kinds and dtypes (a Muon bucket's reduces beside an AdamW bucket's
/// reduce-scatter), all executed in one rendezvous.
#[test]
fn group_mixes_kinds_and_dtypes() {
    let chunk = 128;
    let grads_f32 = inputs(Dtype::F32, DP * chunk, 50);
    let grads_bf16 = inputs(Dtype::Bf16, 90, 51);
    let expected_f32 = rank_order_sum(Dtype::F32, &grads_f32);
    let expected_bf16 = rank_order_sum(Dtype::Bf16, &grads_bf16);
    let results = on_ranks(&HostGroup::new(DP, TIMEOUT), |_, comm| {
        let rank = comm.rank();
        let mut adam = grads_f32[rank].clone();
        let mut muon = grads_bf16[rank].clone();
        let whole = adam.region();
        let mine = whole.sub(rank * chunk, chunk).unwrap();
        let muon_region = muon.region();
        comm.group(&[
            Collective::ReduceScatter {
                send: whole,
                recv: mine,
            },
            Collective::Reduce {
                root: 1,
                send: muon_region,
                recv: muon_region,
            },
        ])
        .unwrap();
        (adam.bits(), muon.bits())
    });
    for (rank, (adam, muon)) in results.iter().enumerate() {
        let range = rank * chunk..(rank + 1) * chunk;
        assert_eq!(adam[range.clone()], expected_f32[range], "rank {rank}");
        if rank == 1 {
            assert_eq!(muon, &expected_bf16);
        } else {
            assert_eq!(muon, &grads_bf16[rank].bits());
        }
    }
}

/// f32 addition is not associative; the group sums in rank order 0, 1, 2, 3.
#[test]
fn sums_follow_rank_order() {
    let per_rank = [1e8f32, 1.0, -1e8, 1.0];
    let forward = ((per_rank[0] + per_rank[1]) + per_rank[2]) + per_rank[3];
    let backward = ((per_rank[3] + per_rank[2]) + per_rank[1]) + per_rank[0];
    assert_eq!(forward, 1.0);
    assert_ne!(forward, backward, "the values must make the order observable");
    let results = on_ranks(&HostGroup::new(DP, TIMEOUT), |_, comm| {
        let mut buf = vec![per_rank[comm.rank()]; 3];
        // SAFETY: the buffer outlives the call and is not otherwise accessed during it.
        comm.all_reduce(unsafe { Region::from_f32(&mut buf) }).unwrap();
        buf
    });
    for buf in results {
        assert_eq!(buf, vec![forward; 3]);
    }
}

#[test]
fn scalar_exchanges_and_barrier() {
    let results = on_ranks(&HostGroup::new(DP, TIMEOUT), |_, comm| {
        let rank = comm.rank();
        comm.barrier().unwrap();
        let gathered = comm.all_gather_u64(10 * rank as u64 + 7).unwrap();
        comm.barrier().unwrap();
        gathered
    });
    for gathered in results {
        assert_eq!(gathered, vec![7, 17, 27, 37]);
    }
}

/// Many collectives back to back: ranks leave each one at different times and already enter
/// the next while others are still being released.
#[test]
fn back_to_back_collectives_stay_in_lockstep() {
    let rounds = 300u64;
    let results = on_ranks(&HostGroup::new(DP, TIMEOUT), |_, comm| {
        let rank = comm.rank() as u64;
        let mut sums = Vec::new();
        for round in 0..rounds {
            let gathered = comm.all_gather_u64(round * 100 + rank).unwrap();
            assert_eq!(gathered, (0..DP as u64).map(|r| round * 100 + r).collect::<Vec<_>>());
            let mut buf = [(round + rank) as f32];
            // SAFETY: the buffer outlives the call and is not otherwise accessed during it.
            comm.all_reduce(unsafe { Region::from_f32(&mut buf) }).unwrap();
            sums.push(buf[0]);
        }
        sums
    });
    let expected: Vec<f32> = (0..rounds).map(|round| (4 * round + 6) as f32).collect();
    for sums in results {
        assert_eq!(sums, expected);
    }
}

#[test]
fn single_rank_group_copies() {
    let results = on_ranks(&HostGroup::new(1, TIMEOUT), |_, comm| {
        assert_eq!((comm.rank(), comm.size()), (0, 1));
        let mut send = Buf::random(Dtype::Bf16, 64, 60);
        let original = send.clone();
        let mut recv = Buf::filled(Dtype::Bf16, 64, 0.0);
        comm.reduce_scatter(send.region(), recv.region()).unwrap();
        assert_eq!(recv, original);
        comm.all_reduce(send.region()).unwrap();
        assert_eq!(send, original);
        comm.all_gather_u64(5).unwrap()
    });
    assert_eq!(results, vec![vec![5]]);
}

#[test]
fn region_sub_checks_bounds() {
    let mut data = vec![0.0f32; 10];
    // SAFETY: the region is only inspected, never used in a collective.
    let region = unsafe { Region::from_f32(&mut data) };
    let sub = region.sub(4, 6).unwrap();
    assert_eq!((sub.len(), sub.dtype()), (6, Dtype::F32));
    assert_eq!(sub.as_ptr(), region.as_ptr().wrapping_add(16));
    assert!(region.sub(10, 0).unwrap().is_empty());
    let err = region.sub(5, 6).unwrap_err();
    assert_eq!(err.kind, muon_opt::error::ErrorKind::InvalidArgument);
    assert!(err.message.contains("5..5+6"), "{}", err.message);
    assert!(region.sub(usize::MAX, 2).is_err());
}

#[test]
fn handles_can_be_shared_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<HostComm>();
    send_sync::<Region>();
    send_sync::<muon_opt::backend::host::stream::HostStream>();
    send_sync::<muon_opt::backend::host::stream::HostEvent>();
}

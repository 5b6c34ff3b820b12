//! Host communicator failures: timeouts, mismatches and invalid arguments break the group
//! with a clear error on every rank, never a hang; later calls get `CommBroken`.

mod support;

use std::sync::{Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use muon_opt::backend::host::comm::{Collective, HostComm, HostGroup, Region};
use muon_opt::config::Dtype;
use muon_opt::error::{Error, ErrorKind};
use support::ranks::on_ranks;

const LONG: Duration = Duration::from_secs(60);

fn all_reduce(comm: &HostComm, len: usize) -> Result<(), Error> {
    let mut buf = vec![1.0f32; len];
    // SAFETY: the buffer outlives the call and is not otherwise accessed during it.
    comm.all_reduce(unsafe { Region::from_f32(&mut buf) })
}

#[test]
fn missing_rank_times_out_then_group_is_broken() {
    let timeout = Duration::from_millis(200);
    let comms = HostGroup::new(3, timeout);
    let (failed_tx, failed_rx) = mpsc::channel::<()>();
    let failed_rx = Mutex::new(failed_rx);
    let start = Instant::now();
    let results = on_ranks(&comms, |_, comm| {
        if comm.rank() == 2 {
            // Arrives only after the others gave up (bounded wait: at most 10 s).
            for _ in 0..2 {
                failed_rx
                    .lock()
                    .unwrap()
                    .recv_timeout(Duration::from_secs(10))
                    .expect("ranks 0 and 1 did not fail");
            }
            let late = Instant::now();
            let err = all_reduce(comm, 8).unwrap_err();
            return (err, late.elapsed(), None);
        }
        let called = Instant::now();
        let err = all_reduce(comm, 8).unwrap_err();
        let waited = called.elapsed();
        assert!(
            start.elapsed() >= timeout,
            "rank {} failed before any deadline",
            comm.rank()
        );
        failed_tx.send(()).unwrap();
        let next = all_reduce(comm, 8).unwrap_err();
        (err, waited, Some(next))
    });
    for (rank, (err, waited, next)) in results.iter().enumerate().take(2) {
        assert_eq!(err.kind, ErrorKind::CommTimeout, "rank {rank}: {}", err.message);
        assert!(*waited < 2 * timeout, "rank {rank} waited {waited:?}");
        for part in [
            "collective #0",
            "all_reduce(f32, count=8)",
            "200 ms",
            "ranks [2] did not arrive",
        ] {
            assert!(
                err.message.contains(part),
                "rank {rank}: '{part}' not in: {}",
                err.message
            );
        }
        let next = next.as_ref().unwrap();
        assert_eq!(next.kind, ErrorKind::CommBroken, "rank {rank}: {}", next.message);
        assert!(
            next.message.contains("collective #0 failed (CommTimeout)"),
            "{}",
            next.message
        );
    }
    let (late_err, late_wait, _) = &results[2];
    assert_eq!(late_err.kind, ErrorKind::CommBroken, "{}", late_err.message);
    assert!(
        *late_wait < timeout,
        "a late rank must fail at once, waited {late_wait:?}"
    );
}

#[test]
fn late_rank_gets_comm_broken_immediately() {
    let timeout = Duration::from_millis(100);
    let comms = HostGroup::new(2, timeout);
    let err = comms[0].barrier().unwrap_err();
    assert_eq!(err.kind, ErrorKind::CommTimeout);
    assert!(err.message.contains("barrier"), "{}", err.message);
    let called = Instant::now();
    let late = all_reduce(&comms[1], 4).unwrap_err();
    assert!(called.elapsed() < timeout);
    assert_eq!(late.kind, ErrorKind::CommBroken);
    assert!(late.message.contains("rank 1"), "{}", late.message);
    assert!(late.message.contains("timed out"), "{}", late.message);
}

#[test]
fn set_timeout_applies_to_later_calls() {
    let comms = HostGroup::new(2, LONG);
    assert_eq!(comms[0].timeout(), LONG);
    comms[0].set_timeout(Duration::from_millis(50));
    assert_eq!(comms[0].timeout(), Duration::from_millis(50));
    let err = comms[0].all_gather_u64(1).unwrap_err();
    assert_eq!(err.kind, ErrorKind::CommTimeout);
    assert!(err.message.contains("after 50 ms"), "{}", err.message);
    assert!(err.message.contains("ranks [1] did not arrive"), "{}", err.message);
}

/// Two ranks issue different collectives; `expect` must appear in both errors.
fn assert_mismatch(op0: Collective, op1: Collective, expect: [&str; 2]) {
    let comms = HostGroup::new(2, LONG);
    let results = on_ranks(&comms, |_, comm| {
        let op = if comm.rank() == 0 { op0 } else { op1 };
        let err = comm.group(&[op]).unwrap_err();
        let next = comm.barrier().unwrap_err();
        (err, next)
    });
    for (rank, (err, next)) in results.into_iter().enumerate() {
        assert_eq!(err.kind, ErrorKind::CommMismatch, "rank {rank}: {}", err.message);
        for part in expect.iter().chain(&["rank 0", "rank 1", "collective #0"]) {
            assert!(
                err.message.contains(part),
                "rank {rank}: '{part}' not in: {}",
                err.message
            );
        }
        assert_eq!(next.kind, ErrorKind::CommBroken, "rank {rank}: {}", next.message);
        assert!(next.message.contains("CommMismatch"), "{}", next.message);
    }
}

#[test]
fn mismatched_collectives_fail_on_every_rank() {
    let mut a = vec![0.0f32; 16];
    let mut b = vec![0u16; 16];
    // SAFETY: every collective below fails at the rendezvous, before touching memory.
    let (f32_16, f32_12, bf16_16) = unsafe {
        let f32_16 = Region::from_f32(&mut a);
        (f32_16, f32_16.sub(0, 12).unwrap(), Region::from_bf16(&mut b))
    };
    let all_reduce = |buf| Collective::AllReduce { send: buf, recv: buf };
    let reduce = |root, buf| Collective::Reduce {
        root,
        send: buf,
        recv: buf,
    };
    assert_mismatch(
        all_reduce(f32_16),
        all_reduce(f32_12),
        ["all_reduce(f32, count=16)", "all_reduce(f32, count=12)"],
    );
    assert_mismatch(
        all_reduce(f32_16),
        all_reduce(bf16_16),
        ["all_reduce(f32, count=16)", "all_reduce(bf16, count=16)"],
    );
    assert_mismatch(
        reduce(0, f32_16),
        reduce(1, f32_16),
        ["reduce(root=0, f32, count=16)", "reduce(root=1, f32, count=16)"],
    );
    assert_mismatch(
        reduce(0, f32_16),
        Collective::Broadcast { root: 0, buf: f32_16 },
        ["reduce(root=0", "broadcast(root=0"],
    );
}

#[test]
fn mismatched_group_lengths_fail() {
    let comms = HostGroup::new(2, LONG);
    let results = on_ranks(&comms, |_, comm| {
        if comm.rank() == 0 {
            comm.barrier().unwrap_err()
        } else {
            comm.all_gather_u64(3).unwrap_err()
        }
    });
    for err in results {
        assert_eq!(err.kind, ErrorKind::CommMismatch, "{}", err.message);
        assert!(err.message.contains("barrier"), "{}", err.message);
        assert!(err.message.contains("all_gather_u64"), "{}", err.message);
    }
}

/// Every rank whose k-th call is the mismatched collective gets `CommMismatch`, also one
/// arriving after the mismatch was detected.
#[test]
fn rank_arriving_after_a_mismatch_also_gets_it() {
    let comms = HostGroup::new(3, LONG);
    let (tx, rx) = mpsc::channel::<()>();
    let rx = Mutex::new(rx);
    let results = on_ranks(&comms, |_, comm| match comm.rank() {
        0 => all_reduce(comm, 4).unwrap_err(),
        1 => {
            let err = all_reduce(comm, 5).unwrap_err();
            tx.send(()).unwrap();
            err
        }
        _ => {
            rx.lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(10))
                .expect("rank 1 did not fail");
            all_reduce(comm, 4).unwrap_err()
        }
    });
    for (rank, err) in results.iter().enumerate() {
        assert_eq!(err.kind, ErrorKind::CommMismatch, "rank {rank}: {}", err.message);
    }
}

#[test]
fn invalid_arguments_break_the_group_without_waiting() {
    let comms = HostGroup::new(2, LONG);
    let results = on_ranks(&comms, |_, comm| {
        let mut send = vec![0.0f32; 10];
        let mut recv = vec![0.0f32; 5];
        if comm.rank() == 0 {
            recv.truncate(4);
        }
        // SAFETY: the buffers outlive the call and are not otherwise accessed during it.
        let (send, recv) = unsafe { (Region::from_f32(&mut send), Region::from_f32(&mut recv)) };
        comm.reduce_scatter(send, recv).unwrap_err()
    });
    assert_eq!(results[0].kind, ErrorKind::InvalidArgument, "{}", results[0].message);
    assert!(
        results[0]
            .message
            .contains("reduce_scatter: send has 10 elements but must have recv's 4 × 2 ranks"),
        "{}",
        results[0].message
    );
    assert_eq!(results[1].kind, ErrorKind::CommBroken, "{}", results[1].message);
    assert!(
        results[1].message.contains("rank 0: reduce_scatter"),
        "{}",
        results[1].message
    );
}

#[test]
fn invalid_regions_are_rejected() {
    let mut words = [0u32; 4];
    let base = words.as_mut_ptr().cast::<u8>();
    let cases = [
        // SAFETY: rejected before any access.
        (
            unsafe { Region::new(base.wrapping_add(1), 2, Dtype::F32) },
            "not aligned",
        ),
        // SAFETY: rejected before any access.
        (unsafe { Region::new(std::ptr::null_mut(), 2, Dtype::Bf16) }, "NULL"),
    ];
    for (region, expect) in cases {
        let comms = HostGroup::new(1, LONG);
        let err = comms[0].all_reduce(region).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        assert!(err.message.contains(expect), "{}", err.message);
    }
    let comms = HostGroup::new(2, LONG);
    // SAFETY: rejected before any access.
    let region = unsafe { Region::new(base, 4, Dtype::F32) };
    let err = comms[0].broadcast(2, region).unwrap_err();
    assert!(err.message.contains("root 2 is outside 0..2"), "{}", err.message);
    // A zero-length region may be NULL.
    let comms = HostGroup::new(1, LONG);
    comms[0].all_reduce(Region::empty(Dtype::F32)).unwrap();
}

/// The ops of a group run concurrently on the ranks' threads, so overlapping memory is refused
/// before anything is read or written (NCCL leaves it undefined): within an op unless it is
/// the exact in-place form of the calling rank, and between the ops of a group always.
#[test]
fn overlapping_memory_is_rejected_before_any_write() {
    let mut data: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let original = data.clone();
    let base = data.as_mut_ptr();
    // SAFETY (all regions): rejected before any access; `data` outlives the calls.
    let region = |at: usize, len: usize| unsafe { Region::from_f32(std::slice::from_raw_parts_mut(base.add(at), len)) };
    let cases: [(usize, Vec<Collective>, &str); 4] = [
        (
            1,
            vec![Collective::AllReduce {
                send: region(0, 8),
                recv: region(4, 8),
            }],
            "all_reduce: send 0x",
        ),
        (
            2,
            vec![Collective::ReduceScatter {
                send: region(0, 8),
                recv: region(0, 4),
            }],
            "not the in-place form of rank 1",
        ),
        (
            2,
            vec![Collective::AllGather {
                send: region(2, 4),
                recv: region(0, 8),
            }],
            "not the in-place form of rank 1",
        ),
        (
            1,
            vec![
                Collective::Reduce {
                    root: 0,
                    send: region(0, 8),
                    recv: region(0, 8),
                },
                Collective::Broadcast {
                    root: 0,
                    buf: region(6, 4),
                },
            ],
            "group: op 1 (broadcast(root=0, f32, count=4)) and op 0 (reduce(root=0, f32, count=8)) overlap in memory",
        ),
    ];
    for (size, ops, expect) in cases {
        let comms = HostGroup::new(size, LONG);
        let err = comms[size - 1].group(&ops).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument, "{}", err.message);
        assert!(err.message.contains(expect), "{}", err.message);
        if size > 1 {
            let peer = comms[0].barrier().unwrap_err();
            assert_eq!(peer.kind, ErrorKind::CommBroken, "{}", peer.message);
        }
    }
    assert_eq!(data, original);
    // The in-place form itself passes: one rank reduce-scatters into its whole buffer.
    let comms = HostGroup::new(1, LONG);
    comms[0]
        .group(&[Collective::ReduceScatter {
            send: region(0, 8),
            recv: region(0, 8),
        }])
        .unwrap();
}

#[test]
fn a_rank_used_from_two_threads_at_once_is_rejected() {
    let comms = HostGroup::new(2, Duration::from_secs(10));
    let results = thread::scope(|s| {
        let first = s.spawn(|| comms[0].all_gather_u64(1));
        // Sequencing only: whichever rank-0 call posts first is the real one.
        thread::sleep(Duration::from_millis(50));
        let second = s.spawn(|| comms[0].all_gather_u64(2));
        thread::sleep(Duration::from_millis(50));
        let peer = comms[1].all_gather_u64(5);
        (first.join().unwrap(), second.join().unwrap(), peer)
    });
    let (first, second, peer) = results;
    let (accepted, rejected) = if first.is_ok() {
        (first, second)
    } else {
        (second, first)
    };
    let rejected = rejected.unwrap_err();
    assert_eq!(rejected.kind, ErrorKind::InvalidState, "{}", rejected.message);
    assert!(
        rejected.message.contains("one thread at a time"),
        "{}",
        rejected.message
    );
    let gathered = accepted.unwrap();
    assert_eq!(peer.unwrap(), gathered);
    assert!(gathered == vec![1, 5] || gathered == vec![2, 5], "{gathered:?}");
}

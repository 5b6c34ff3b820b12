//! Host comm streams and events: FIFO order, eager and lazy execution, CUDA event semantics,
//! error propagation, and collectives run from per-rank comm streams.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use muon_opt::backend::host::comm::{HostComm, HostGroup, Region};
use muon_opt::backend::host::stream::{HostEvent, HostStream};
use muon_opt::bail;
use muon_opt::config::CommMode;
use muon_opt::error::ErrorKind;
use support::ranks::on_ranks;

const MODES: [CommMode; 2] = [CommMode::Eager, CommMode::Lazy];

fn counter() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(0))
}

/// Enqueues `n` ops that each increment `count`.
fn enqueue_increments(stream: &HostStream, count: &Arc<AtomicUsize>, n: usize) {
    for _ in 0..n {
        let count = count.clone();
        stream
            .enqueue(move || {
                count.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
            .unwrap();
    }
}

#[test]
fn ops_run_in_fifo_order() {
    for mode in MODES {
        let stream = HostStream::new(mode).unwrap();
        assert_eq!(stream.mode(), mode);
        let log = Arc::new(Mutex::new(Vec::new()));
        for i in 0..200 {
            let log = log.clone();
            stream
                .enqueue(move || {
                    log.lock().unwrap().push(i);
                    Ok(())
                })
                .unwrap();
        }
        stream.synchronize().unwrap();
        assert_eq!(*log.lock().unwrap(), (0..200).collect::<Vec<_>>(), "{mode:?}");
    }
}

#[test]
fn eager_runs_without_any_wait() {
    let stream = HostStream::new(CommMode::Eager).unwrap();
    let count = counter();
    enqueue_increments(&stream, &count, 10);
    let deadline = Instant::now() + Duration::from_secs(10);
    while count.load(Ordering::SeqCst) < 10 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(count.load(Ordering::SeqCst), 10);
}

#[test]
fn lazy_runs_nothing_until_a_wait() {
    let stream = HostStream::new(CommMode::Lazy).unwrap();
    let count = counter();
    enqueue_increments(&stream, &count, 10);
    let event = HostEvent::new();
    stream.record_on_comm(&event);
    thread::sleep(Duration::from_millis(50));
    assert_eq!(count.load(Ordering::SeqCst), 0, "lazy mode ran ops nobody waited for");
    event.synchronize().unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 10);
}

#[test]
fn lazy_runs_exactly_up_to_the_awaited_event() {
    let stream = HostStream::new(CommMode::Lazy).unwrap();
    let count = counter();
    let (first, second) = (HostEvent::new(), HostEvent::new());
    enqueue_increments(&stream, &count, 3);
    stream.record_on_comm(&first);
    enqueue_increments(&stream, &count, 2);
    stream.record_on_comm(&second);
    enqueue_increments(&stream, &count, 4);
    first.synchronize().unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 3);
    thread::sleep(Duration::from_millis(50));
    assert_eq!(count.load(Ordering::SeqCst), 3, "ran past the awaited event");
    second.synchronize().unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 5);
    first.synchronize().unwrap();
    assert_eq!(
        count.load(Ordering::SeqCst),
        5,
        "an older event must not drive the stream further"
    );
    stream.synchronize().unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 9);
}

#[test]
fn event_semantics_follow_cuda() {
    for mode in MODES {
        let stream = HostStream::new(mode).unwrap();
        let count = counter();
        let event = HostEvent::new();
        event.synchronize().unwrap();
        enqueue_increments(&stream, &count, 2);
        stream.record_on_comm(&event);
        enqueue_increments(&stream, &count, 3);
        // Re-recording: the latest record counts.
        stream.record_on_comm(&event);
        event.synchronize().unwrap();
        assert_eq!(count.load(Ordering::SeqCst), 5, "{mode:?}");
        // A record on the compute stream is complete at once.
        enqueue_increments(&stream, &count, 1);
        event.record_on_compute();
        event.synchronize().unwrap();
        stream.synchronize().unwrap();
        assert_eq!(count.load(Ordering::SeqCst), 6, "{mode:?}");
    }
}

/// `comm_wait_event` on an event of another stream orders this stream's later ops after it,
/// and in lazy mode drives the other stream only as far as the event.
#[test]
fn comm_wait_event_orders_across_streams() {
    for mode in MODES {
        let (producer, consumer) = (HostStream::new(mode).unwrap(), HostStream::new(mode).unwrap());
        let value = counter();
        let written = HostEvent::new();
        let v = value.clone();
        producer
            .enqueue(move || {
                thread::sleep(Duration::from_millis(20));
                v.store(42, Ordering::SeqCst);
                Ok(())
            })
            .unwrap();
        producer.record_on_comm(&written);
        let after = counter();
        enqueue_increments(&producer, &after, 1);
        consumer.comm_wait_event(&written).unwrap();
        let (seen, v) = (counter(), value.clone());
        let s = seen.clone();
        consumer
            .enqueue(move || {
                s.store(v.load(Ordering::SeqCst), Ordering::SeqCst);
                Ok(())
            })
            .unwrap();
        consumer.synchronize().unwrap();
        assert_eq!(seen.load(Ordering::SeqCst), 42, "{mode:?}");
        if mode == CommMode::Lazy {
            assert_eq!(after.load(Ordering::SeqCst), 0, "drove the producer past the event");
        }
        producer.synchronize().unwrap();
        assert_eq!(after.load(Ordering::SeqCst), 1);
        // Waiting on an event of the same stream or a completed one needs nothing.
        let own = HostEvent::new();
        consumer.record_on_comm(&own);
        consumer.comm_wait_event(&own).unwrap();
        own.record_on_compute();
        consumer.comm_wait_event(&own).unwrap();
        consumer.synchronize().unwrap();
    }
}

#[test]
fn a_failed_op_fails_later_waits_and_drops_later_ops() {
    for mode in MODES {
        let stream = HostStream::new(mode).unwrap();
        let count = counter();
        let (before, after) = (HostEvent::new(), HostEvent::new());
        enqueue_increments(&stream, &count, 2);
        stream.record_on_comm(&before);
        stream
            .enqueue(|| bail!(CommTimeout, "collective #7 timed out"))
            .unwrap();
        // An eager worker may already have failed: then enqueue reports the failure at once,
        // else the op is accepted and dropped when the worker reaches it.
        for _ in 0..3 {
            let count = count.clone();
            let enqueued = stream.enqueue(move || {
                count.fetch_add(1, Ordering::SeqCst);
                Ok(())
            });
            if let Err(err) = enqueued {
                assert_eq!(err.kind, ErrorKind::CommTimeout, "{mode:?}");
            }
        }
        stream.record_on_comm(&after);
        let err = after.synchronize().unwrap_err();
        assert_eq!(err.kind, ErrorKind::CommTimeout, "{mode:?}");
        assert_eq!(err.message, "collective #7 timed out");
        assert_eq!(count.load(Ordering::SeqCst), 2, "{mode:?}: ops behind the failure ran");
        // Work recorded before the failure completed; everything after reports the error.
        before.synchronize().unwrap();
        for _ in 0..2 {
            assert_eq!(stream.synchronize().unwrap_err().kind, ErrorKind::CommTimeout);
            assert_eq!(after.synchronize().unwrap_err().kind, ErrorKind::CommTimeout);
        }
        let err = stream.enqueue(|| Ok(())).unwrap_err();
        assert_eq!(err.kind, ErrorKind::CommTimeout);
        assert_eq!(count.load(Ordering::SeqCst), 2);
    }
}

#[test]
fn a_panicking_op_becomes_a_panic_error() {
    for mode in MODES {
        let stream = HostStream::new(mode).unwrap();
        stream.enqueue(|| panic!("boom in the worker")).unwrap();
        let err = stream.synchronize().unwrap_err();
        assert_eq!(err.kind, ErrorKind::Panic, "{mode:?}");
        assert!(
            err.message.contains("op #0 panicked: boom in the worker"),
            "{}",
            err.message
        );
    }
}

#[test]
fn a_failed_stream_fails_streams_waiting_on_it() {
    for mode in MODES {
        let (failing, waiting) = (HostStream::new(mode).unwrap(), HostStream::new(mode).unwrap());
        let event = HostEvent::new();
        failing.enqueue(|| bail!(Internal, "broken op")).unwrap();
        failing.record_on_comm(&event);
        waiting.comm_wait_event(&event).unwrap();
        let count = counter();
        let increment = {
            let count = count.clone();
            move || {
                count.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        };
        // In eager mode the wait may already have failed the stream, and then enqueueing
        // returns the error at once; else synchronizing does.
        let err = match waiting.enqueue(increment) {
            Ok(()) => waiting.synchronize().unwrap_err(),
            Err(err) => err,
        };
        assert_eq!((err.kind, err.message.as_str()), (ErrorKind::Internal, "broken op"));
        assert_eq!(count.load(Ordering::SeqCst), 0);
    }
}

#[test]
fn drop_discards_unstarted_ops_and_fails_their_events() {
    let count = counter();
    let event = HostEvent::new();
    {
        let stream = HostStream::new(CommMode::Lazy).unwrap();
        enqueue_increments(&stream, &count, 5);
        stream.record_on_comm(&event);
    }
    assert_eq!(count.load(Ordering::SeqCst), 0);
    let err = event.synchronize().unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidState);
    assert!(err.message.contains("destroyed"), "{}", err.message);
}

/// The intended use: each rank's comm stream runs its collectives; the rank's thread (the
/// compute stream) sees the result only after waiting on the event recorded behind them.
#[test]
fn ranks_run_collectives_on_their_comm_streams() {
    const DP: usize = 4;
    for mode in MODES {
        let comms: Vec<Arc<HostComm>> = HostGroup::new(DP, Duration::from_secs(60))
            .into_iter()
            .map(Arc::new)
            .collect();
        let results: Vec<(Option<Vec<f32>>, Vec<f32>)> = on_ranks(comms.iter(), |_, comm| {
            let stream = HostStream::new(mode).unwrap();
            let mut buf = vec![comm.rank() as f32 + 1.0; 64];
            // SAFETY: `buf` lives until after the event wait below and this
            // thread reads it only after that wait.
            let region = unsafe { Region::from_f32(&mut buf) };
            let done = HostEvent::new();
            let c = comm.clone();
            stream.enqueue(move || c.all_reduce(region)).unwrap();
            stream.record_on_comm(&done);
            let c = comm.clone();
            stream.enqueue(move || c.barrier()).unwrap();
            // Only lazy mode guarantees nobody writes `buf` before the wait.
            let before_wait = (mode == CommMode::Lazy).then(|| {
                thread::sleep(Duration::from_millis(20));
                buf.clone()
            });
            done.synchronize().unwrap();
            let after_wait = buf.clone();
            stream.synchronize().unwrap();
            (before_wait, after_wait)
        });
        for (rank, (before_wait, after_wait)) in results.into_iter().enumerate() {
            if let Some(before_wait) = before_wait {
                assert_eq!(
                    before_wait,
                    vec![rank as f32 + 1.0; 64],
                    "lazy: data changed before the wait"
                );
            }
            assert_eq!(after_wait, vec![10.0; 64], "{mode:?} rank {rank}");
        }
    }
}

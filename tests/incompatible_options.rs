//! Options that are valid one by one but cannot be combined return `IncompatibleOptions`
//! (`MUON_STATUS_INCOMPATIBLE_OPTIONS`, 107), naming both: the padded layout with contiguous
//! ownership, a CUDA stream with a host communicator. (Optimizers sharing a clip with other
//! clip_grad values or streams: `shared_clip.rs`.)

use std::time::Duration;

use muon_opt::backend::cuda::CallerStream;
use muon_opt::backend::host::comm::HostGroup;
use muon_opt::comm::{Communicator, Transport};
use muon_opt::config::{Config, MuonLayout, MuonOwnership};
use muon_opt::error::ErrorKind;
use muon_opt::optimizer::Optimizer;

#[test]
fn the_padded_layout_with_contiguous_ownership_is_incompatible() {
    let cfg = Config {
        muon_layout: MuonLayout::Padded,
        muon_ownership: MuonOwnership::Contiguous,
        ..Config::default()
    };
    let err = cfg.validate().unwrap_err();
    assert_eq!(err.kind, ErrorKind::IncompatibleOptions, "{err}");
    assert!(
        err.message.contains("muon_ownership") && err.message.contains("padded"),
        "{err}"
    );
    let claim = Communicator::new(Transport::Host(HostGroup::new(1, Duration::from_secs(5)).remove(0)))
        .claim()
        .unwrap();
    let Err(err) = Optimizer::new(cfg, claim, CallerStream::NULL) else {
        panic!("created an optimizer with padded + contiguous")
    };
    assert_eq!(err.kind, ErrorKind::IncompatibleOptions, "{err}");
}

#[test]
fn a_stream_with_a_host_communicator_is_incompatible() {
    let claim = Communicator::new(Transport::Host(HostGroup::new(1, Duration::from_secs(5)).remove(0)))
        .claim()
        .unwrap();
    // Never dereferenced: the combination is refused before any stream is used.
    let stream = CallerStream(std::ptr::NonNull::dangling().as_ptr());
    let Err(err) = Optimizer::new(Config::default(), claim, stream) else {
        panic!("created a host optimizer on a CUDA stream")
    };
    assert_eq!(err.kind, ErrorKind::IncompatibleOptions, "{err}");
    assert!(
        err.message.contains("stream") && err.message.contains("host communicator"),
        "{err}"
    );
}

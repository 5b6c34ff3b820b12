//! Ranks on threads: host communicator groups, optimizers over them, and one scoped thread per
//! rank.

use std::sync::Arc;
use std::time::Duration;

use muon_opt::backend::cuda::CallerStream;
use muon_opt::backend::host::comm::HostGroup;
use muon_opt::comm::{Communicator, Transport};
use muon_opt::config::Config;
use muon_opt::optimizer::Optimizer;

/// How long a collective of [`host_comms`] waits for the other ranks.
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// Runs `f(rank, item)` on one thread per item of `ranks`; results in rank order.
pub fn on_ranks<I, R>(ranks: I, f: impl Fn(usize, I::Item) -> R + Sync) -> Vec<R>
where
    I: IntoIterator,
    I::Item: Send,
    R: Send,
{
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> = ranks
            .into_iter()
            .enumerate()
            .map(|(rank, item)| scope.spawn(move || f(rank, item)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

/// The communicators of a fresh host group of `n` ranks.
pub fn host_comms(n: usize) -> Vec<Arc<Communicator>> {
    HostGroup::new(n, TIMEOUT)
        .into_iter()
        .map(|c| Communicator::new(Transport::Host(c)))
        .collect()
}

/// One optimizer per rank of a fresh host group of `n` ranks whose collectives time out after
/// `timeout`.
pub fn optimizers(cfg: &Config, n: usize, timeout: Duration) -> Vec<Optimizer> {
    HostGroup::new(n, timeout)
        .into_iter()
        .map(|c| {
            let comm = Communicator::new(Transport::Host(c));
            Optimizer::new(cfg.clone(), comm.claim().unwrap(), CallerStream::NULL).unwrap()
        })
        .collect()
}

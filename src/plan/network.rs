//! The ring a data-parallel group's collectives run on, and what a collective costs on it: the
//! one definition of NCCL's ring α–β cost that the planner (`choice.rs`) and the simulator
//! (`sim::cost`) both price collectives with (docs/design.md §4).
//!
//! A collective over a buffer of S bytes on n ranks costs `(base + steps·hop) µs +
//! traffic / bandwidth`, where a reduce-scatter or all-gather moves `(n−1)/n · S` per rank in
//! `n−1` steps, an all-reduce `2(n−1)/n · S` in `2(n−1)` steps, a reduce or broadcast the whole
//! buffer (a pipelined chain) in `n−1` steps; `traffic / bandwidth` is nccl-tests' bus
//! bandwidth model. Nothing moves on one rank.

use crate::bail;
use crate::error::Result;

/// NCCL's fixed latency of one ring collective (ring, Simple protocol: `src/graph/tuning.cc`),
/// µs: what the planner adds to every collective on a declared network, the figure the
/// simulator's built-in profiles carry as `nccl_base_latency_us`.
pub const NCCL_BASE_LATENCY_US: f64 = 8.4;

/// A declared data-parallel ring (`muon_network_t`): per-hop latency and bus bandwidth.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Network {
    /// Latency of one ring step, µs (≥ 0).
    pub hop_latency_us: f64,
    /// Bus bandwidth (nccl-tests' `busbw`), GB/s (1e9 bytes; > 0).
    pub bus_bandwidth_gbps: f64,
}

impl Network {
    /// Checks both figures, naming `field` (`network`, `expert_network`) and the figure.
    pub fn validate(&self, field: &str) -> Result<()> {
        if !(self.hop_latency_us.is_finite() && self.hop_latency_us >= 0.0) {
            bail!(
                OutOfRange,
                "{field}.hop_latency_us: {} must be finite and >= 0 (µs per ring step)",
                self.hop_latency_us
            );
        }
        if !(self.bus_bandwidth_gbps.is_finite() && self.bus_bandwidth_gbps > 0.0) {
            bail!(
                OutOfRange,
                "{field}.bus_bandwidth_gbps: {} must be finite and > 0 (GB/s of bus bandwidth)",
                self.bus_bandwidth_gbps
            );
        }
        Ok(())
    }

    /// The ring these figures describe.
    pub fn ring(&self) -> Ring {
        Ring {
            hop_latency_us: self.hop_latency_us,
            bytes_per_second: self.bus_bandwidth_gbps * 1e9,
        }
    }
}

/// A ring as the cost formula reads it: hop latency (µs) and bandwidth (bytes/s).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ring {
    pub hop_latency_us: f64,
    pub bytes_per_second: f64,
}

/// A collective as the ring formula sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingCollective {
    ReduceScatter,
    AllGather,
    AllReduce,
    /// To one root (a pipelined chain).
    Reduce,
    /// From one root (a pipelined chain).
    Broadcast,
}

impl Ring {
    /// Seconds of one `collective` over a buffer of `bytes` bytes (the whole buffer: what a
    /// reduce-scatter reads, what an all-gather writes) on `ranks` ranks, with a fixed
    /// `base_latency_us` per call (see the module docs). Zero bytes or one rank: 0.
    pub fn seconds(&self, collective: RingCollective, bytes: u64, ranks: u64, base_latency_us: f64) -> f64 {
        if ranks <= 1 || bytes == 0 {
            return 0.0;
        }
        let n = ranks;
        let (steps, traffic) = match collective {
            RingCollective::ReduceScatter | RingCollective::AllGather => {
                (n - 1, bytes as f64 * (n - 1) as f64 / n as f64)
            }
            RingCollective::AllReduce => (2 * (n - 1), 2.0 * bytes as f64 * (n - 1) as f64 / n as f64),
            RingCollective::Reduce | RingCollective::Broadcast => (n - 1, bytes as f64),
        };
        (base_latency_us + steps as f64 * self.hop_latency_us) * 1e-6 + traffic / self.bytes_per_second
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_collective_pays_its_steps_and_its_traffic() {
        let ring = Network {
            hop_latency_us: 2.0,
            bus_bandwidth_gbps: 1.0,
        }
        .ring();
        let bytes = 8_000_000;
        // 4 ranks: 3 steps, 3/4 of the buffer.
        let rs = ring.seconds(RingCollective::ReduceScatter, bytes, 4, 10.0);
        assert!((rs - ((10.0 + 3.0 * 2.0) * 1e-6 + 6e6 / 1e9)).abs() < 1e-15);
        let ar = ring.seconds(RingCollective::AllReduce, bytes, 4, 10.0);
        assert!((ar - ((10.0 + 6.0 * 2.0) * 1e-6 + 12e6 / 1e9)).abs() < 1e-15);
        let reduce = ring.seconds(RingCollective::Reduce, bytes, 4, 10.0);
        assert!((reduce - ((10.0 + 3.0 * 2.0) * 1e-6 + 8e6 / 1e9)).abs() < 1e-15);
        assert_eq!(ring.seconds(RingCollective::Broadcast, bytes, 1, 10.0), 0.0);
        assert_eq!(ring.seconds(RingCollective::AllGather, 0, 8, 10.0), 0.0);
    }

    #[test]
    fn bad_figures_are_refused_naming_the_field() {
        let bad = [
            (-1.0, 10.0, "network.hop_latency_us"),
            (f64::NAN, 10.0, "network.hop_latency_us"),
            (1.0, 0.0, "network.bus_bandwidth_gbps"),
            (1.0, -5.0, "network.bus_bandwidth_gbps"),
            (1.0, f64::INFINITY, "network.bus_bandwidth_gbps"),
        ];
        for (hop, bw, field) in bad {
            let err = Network {
                hop_latency_us: hop,
                bus_bandwidth_gbps: bw,
            }
            .validate("network")
            .unwrap_err();
            assert!(err.message.starts_with(field), "{hop} {bw}: {err}");
        }
        let zero_latency = Network {
            hop_latency_us: 0.0,
            bus_bandwidth_gbps: 0.5,
        };
        assert!(zero_latency.validate("expert_network").is_ok());
    }
}

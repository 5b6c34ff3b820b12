//! Hardware profiles: every constant of the cost model, in one JSON object per machine. The
//! built-in profiles (`src/sim/hardware/*.json`) carry their public sources in a `sources`
//! object; a user profile is the same JSON read from a file.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::bail;
use crate::error::Result;

/// The modelled machine. Rates are per GPU; `*_efficiency` is the achievable fraction of the
/// peak figure next to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hardware {
    pub name: String,
    pub description: String,
    /// Where each figure comes from.
    pub sources: BTreeMap<String, String>,
    /// Data-parallel ranks that share a node (NVLink); a group larger than this crosses the
    /// network. 1 = every data-parallel peer on another node (tensor parallelism fills a node).
    pub dp_ranks_per_node: u32,
    /// Streaming multiprocessors: GEMM output tiles run in waves of this many.
    pub sms: u32,
    /// Dense BF16 tensor-core peak, TFLOP/s.
    pub bf16_tflops: f64,
    /// FP32 (non-tensor, no TF32) peak, TFLOP/s.
    pub f32_tflops: f64,
    /// Achievable fraction of the GEMM peak for a GEMM that fills every SM.
    pub gemm_efficiency: f64,
    /// Side of a GEMM output tile (elements).
    pub gemm_tile: u32,
    /// HBM bandwidth, GB/s.
    pub hbm_gbps: f64,
    pub hbm_efficiency: f64,
    /// NVLink bandwidth per direction, GB/s.
    pub nvlink_gbps: f64,
    pub nvlink_efficiency: f64,
    /// Network bandwidth per GPU per direction, GB/s.
    pub network_gbps: f64,
    pub network_efficiency: f64,
    /// NCCL ring latency: a base per collective plus one hop latency per ring step.
    pub nccl_base_latency_us: f64,
    pub nccl_hop_latency_nvlink_us: f64,
    pub nccl_hop_latency_network_us: f64,
    /// Fraction of the SMs a running collective occupies when its ring stays inside a node
    /// (NVLink): compute kernels that overlap it run at `1 − comm_sm_share` of their speed for
    /// the overlapped part.
    pub comm_sm_share: f64,
    /// The same when its ring crosses the network (fewer channels: a NIC is the bottleneck).
    pub comm_sm_share_network: f64,
    /// Network interfaces per node: a data-parallel group with several GPUs per node runs
    /// that many rings at once over them (multi-rail), up to one per GPU of the group.
    pub nics_per_node: u32,
    /// Device memory per GPU, GB (1e9 bytes): what the library's allocations must fit in.
    pub memory_gb: f64,
    /// Host time to issue one kernel, GEMM, memset, copy or NCCL group.
    pub launch_host_us: f64,
    /// Shortest device time of any kernel.
    pub kernel_min_us: f64,
    /// Host time of an event record or stream-wait-event call.
    pub event_host_us: f64,
    /// Host↔device copy bandwidth, GB/s, and the fixed latency of a copy the host waits for.
    pub pcie_gbps: f64,
    pub copy_latency_us: f64,
    /// Fraction of the BF16 peak the framework's forward and backward reach (MFU).
    pub model_efficiency: f64,
    /// The figures measured on a GPU (`muon-opt calibrate`, the run named in
    /// `sources.measured`); every other figure is a sourced estimate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measured: Vec<String>,
}

/// The figures that are achievable fractions, latencies and shares rather than datasheet
/// peaks: each is either measured on a GPU (listed in `measured`) or a sourced estimate.
pub const ACHIEVABLE_FIGURES: &[&str] = &[
    "gemm_efficiency",
    "hbm_efficiency",
    "kernel_min_us",
    "launch_host_us",
    "event_host_us",
    "copy_latency_us",
    "nvlink_efficiency",
    "network_efficiency",
    "nccl_base_latency_us",
    "nccl_hop_latency_nvlink_us",
    "nccl_hop_latency_network_us",
    "comm_sm_share",
    "comm_sm_share_network",
    "model_efficiency",
];

/// Names of the built-in profiles.
pub const HARDWARE_NAMES: &[&str] = &[
    "h100-nvlink",
    "h100-ib",
    "h200-nvlink",
    "b200-nvlink",
    "a100-nvlink",
    "gb200-nvl72",
    "gb300-nvl72",
];

/// The built-in profile called `name`, if any.
pub fn builtin(name: &str) -> Option<Hardware> {
    let text = match name {
        "h100-nvlink" => include_str!("hardware/h100-nvlink.json"),
        "h100-ib" => include_str!("hardware/h100-ib.json"),
        "h200-nvlink" => include_str!("hardware/h200-nvlink.json"),
        "b200-nvlink" => include_str!("hardware/b200-nvlink.json"),
        "a100-nvlink" => include_str!("hardware/a100-nvlink.json"),
        "gb200-nvl72" => include_str!("hardware/gb200-nvl72.json"),
        "gb300-nvl72" => include_str!("hardware/gb300-nvl72.json"),
        _ => return None,
    };
    Some(serde_json::from_str(text).expect("built-in hardware profiles parse (tested)"))
}

impl Hardware {
    /// The achievable figures measured on a GPU and those that are estimates, in
    /// [`ACHIEVABLE_FIGURES`] order.
    pub fn provenance(&self) -> (Vec<&'static str>, Vec<&'static str>) {
        ACHIEVABLE_FIGURES
            .iter()
            .partition(|f| self.measured.iter().any(|m| m == **f))
    }

    /// A profile from JSON text (the built-ins' format); every figure must be finite and > 0,
    /// fractions in (0, 1].
    pub fn from_json(text: &str) -> Result<Hardware> {
        let hw: Hardware = match serde_json::from_str(text) {
            Ok(hw) => hw,
            Err(e) => bail!(InvalidArgument, "hardware profile: {e}"),
        };
        hw.validate()?;
        Ok(hw)
    }

    /// Every figure finite and in its range (see `from_json`).
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("bf16_tflops", self.bf16_tflops),
            ("f32_tflops", self.f32_tflops),
            ("hbm_gbps", self.hbm_gbps),
            ("nvlink_gbps", self.nvlink_gbps),
            ("network_gbps", self.network_gbps),
            ("pcie_gbps", self.pcie_gbps),
            ("memory_gb", self.memory_gb),
        ];
        for (field, value) in positive {
            if !(value.is_finite() && value > 0.0) {
                bail!(OutOfRange, "hardware profile: {field} = {value} must be finite and > 0");
            }
        }
        let fractions = [
            ("gemm_efficiency", self.gemm_efficiency),
            ("hbm_efficiency", self.hbm_efficiency),
            ("nvlink_efficiency", self.nvlink_efficiency),
            ("network_efficiency", self.network_efficiency),
            ("model_efficiency", self.model_efficiency),
        ];
        for (field, value) in fractions {
            if !(value > 0.0 && value <= 1.0) {
                bail!(OutOfRange, "hardware profile: {field} = {value} must be in (0, 1]");
            }
        }
        let latencies = [
            ("nccl_base_latency_us", self.nccl_base_latency_us),
            ("nccl_hop_latency_nvlink_us", self.nccl_hop_latency_nvlink_us),
            ("nccl_hop_latency_network_us", self.nccl_hop_latency_network_us),
            ("launch_host_us", self.launch_host_us),
            ("kernel_min_us", self.kernel_min_us),
            ("event_host_us", self.event_host_us),
            ("copy_latency_us", self.copy_latency_us),
        ];
        for (field, value) in latencies {
            if !(value.is_finite() && value >= 0.0) {
                bail!(
                    OutOfRange,
                    "hardware profile: {field} = {value} must be finite and >= 0"
                );
            }
        }
        for (field, value) in [
            ("comm_sm_share", self.comm_sm_share),
            ("comm_sm_share_network", self.comm_sm_share_network),
        ] {
            if !(0.0..1.0).contains(&value) {
                bail!(OutOfRange, "hardware profile: {field} = {value} must be in [0, 1)");
            }
        }
        if let Some(unknown) = self.measured.iter().find(|m| !ACHIEVABLE_FIGURES.contains(&m.as_str())) {
            bail!(
                OutOfRange,
                "hardware profile: measured lists '{unknown}', which is not one of {}",
                ACHIEVABLE_FIGURES.join(", ")
            );
        }
        if self.sms == 0 || self.gemm_tile == 0 || self.dp_ranks_per_node == 0 || self.nics_per_node == 0 {
            bail!(
                OutOfRange,
                "hardware profile: sms, gemm_tile, dp_ranks_per_node and nics_per_node must be >= 1"
            );
        }
        Ok(())
    }
}

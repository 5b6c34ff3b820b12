//! The cost model: a duration for every device action the cuda translator emits, from the
//! constants of one [`Hardware`] profile and nothing else.
//!
//! - kernels: the bytes they move at the achievable HBM bandwidth, never below
//!   `kernel_min_us`;
//! - GEMMs: `2·m·n·k·batch` flops at the achievable peak of their input type, scaled by how
//!   well their output tiles fill the last wave of SMs (a small matrix leaves SMs idle), and
//!   never faster than their operand bytes at HBM bandwidth (a listed batch of tiles reads
//!   each operand panel once);
//! - NCCL: ring α–β per call, `base + steps·hop + traffic / bandwidth`, by the planner's formula
//!   (`crate::plan::network`, one definition for both); the bandwidth is NVLink's while the
//!   group fits in one node, the NIC's once it crosses nodes;
//! - host↔device copies: a fixed latency plus bytes at PCIe bandwidth, and the host waits.

use crate::backend::cuda::action::{
    Action, Arg, Gemm, GemmInputs, Kernel, Launch, Matrices, Moment2Layout, NcclCall, NcclComm, NcclType,
};
use crate::backend::ops::StreamKind;
use crate::plan::network::{Network, Ring, RingCollective};

use super::profile::Hardware;

const US: f64 = 1e-6;
const GB: f64 = 1e9;
const TFLOP: f64 = 1e12;

/// What an action costs: host time to issue it, then what it does on the device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Cost {
    /// `device` seconds of work on `stream`.
    Work {
        stream: StreamKind,
        host: f64,
        device: f64,
    },
    /// A collective group on the comm stream: it ends `device` seconds after the last rank
    /// reached it.
    Collective {
        host: f64,
        device: f64,
    },
    /// Work on `stream` that the host then waits for (a copy to or from host memory).
    Blocking {
        stream: StreamKind,
        host: f64,
        device: f64,
    },
    /// The host waits until `stream` finished everything issued before.
    Sync {
        stream: StreamKind,
    },
    Record {
        stream: StreamKind,
        host: f64,
    },
    Wait {
        stream: StreamKind,
        host: f64,
    },
    /// No time (allocations happen at setup).
    Free,
}

/// The cost model of one profile at one data-parallel size.
#[derive(Debug, Clone)]
pub struct CostModel {
    hw: Hardware,
    dp: u32,
    /// Ranks of the norm group (`muon_optimizer_set_norm_group`), when one is modelled.
    norm_group: Option<u32>,
    /// Ranks of the tensor-parallel group (`muon_optimizer_set_tp_group`), when modelled.
    tp_group: Option<u32>,
}

fn arg_u64(args: &[Arg], i: usize) -> u64 {
    match args.get(i) {
        Some(Arg::U64(v)) => *v,
        Some(Arg::U32(v)) => u64::from(*v),
        _ => 0,
    }
}

fn arg_flag(args: &[Arg], i: usize) -> bool {
    matches!(args.get(i), Some(Arg::I32(v)) if *v != 0)
}

/// Bytes of an element whose dtype flag (`is_bf16`) is argument `i`.
fn elem(args: &[Arg], i: usize) -> u64 {
    if arg_flag(args, i) { 2 } else { 4 }
}

pub(crate) fn nccl_size(dtype: NcclType) -> u64 {
    match dtype {
        NcclType::U8 => 1,
        NcclType::U64 | NcclType::F64 => 8,
        NcclType::Bf16 => 2,
        NcclType::F32 => 4,
    }
}

impl CostModel {
    pub fn new(hw: Hardware, dp: usize) -> Self {
        CostModel {
            hw,
            dp: dp as u32,
            norm_group: None,
            tp_group: None,
        }
    }

    /// Models a tensor-parallel group of `ranks` ranks inside one node (Megatron's placement:
    /// TP ranks are consecutive), joined over NVLink; a node then holds `ranks` times fewer
    /// ranks of one data-parallel group.
    pub fn with_tp_group(mut self, ranks: usize) -> Self {
        self.tp_group = Some(ranks as u32);
        self.hw.dp_ranks_per_node = (self.hw.dp_ranks_per_node / ranks as u32).max(1);
        self
    }

    /// The modelled tensor-parallel group's size, if any.
    pub fn tp_group(&self) -> Option<usize> {
        self.tp_group.map(|n| n as usize)
    }

    /// Models a norm group of `ranks` ranks: the data-parallel group's ranks and the
    /// model-parallel ranks beside them, which share their nodes (tensor and pipeline
    /// parallelism inside a node), so its ring crosses the network as often as the
    /// data-parallel ring.
    pub fn with_norm_group(mut self, ranks: usize) -> Self {
        self.norm_group = Some(ranks as u32);
        self
    }

    /// The modelled norm group's size, if any.
    pub fn norm_group(&self) -> Option<usize> {
        self.norm_group.map(|n| n as usize)
    }

    pub fn hardware(&self) -> &Hardware {
        &self.hw
    }

    fn hbm(&self, bytes: u64) -> f64 {
        bytes as f64 / (self.hw.hbm_gbps * GB * self.hw.hbm_efficiency)
    }

    /// Device seconds of a kernel, memset or copy moving `bytes` of device memory.
    pub fn kernel_seconds(&self, bytes: u64) -> f64 {
        self.hbm(bytes).max(self.hw.kernel_min_us * US)
    }

    /// The cost of `action`.
    pub fn cost(&self, action: &Action) -> Cost {
        let launch = self.hw.launch_host_us * US;
        match action {
            Action::Alloc { .. } => Cost::Free,
            Action::CopyIn { bytes, stream, .. } => self.copy(*stream, bytes.len() as u64),
            Action::CopyOut { bytes, stream, .. } => self.copy(*stream, *bytes),
            // Queued from pinned memory: the host only pays the call.
            Action::CopyInAsync { bytes, stream, .. } => Cost::Work {
                stream: *stream,
                host: launch,
                device: self.hw.copy_latency_us * US + bytes.len() as f64 / (self.hw.pcie_gbps * GB),
            },
            Action::Zero { bytes, stream, .. } => Cost::Work {
                stream: *stream,
                host: launch,
                device: self.kernel_seconds(*bytes),
            },
            Action::CopyDevice { bytes, stream, .. } => Cost::Work {
                stream: *stream,
                host: launch,
                device: self.kernel_seconds(2 * bytes),
            },
            Action::CopyDevice2D {
                width, height, stream, ..
            } => Cost::Work {
                stream: *stream,
                host: launch,
                device: self.kernel_seconds(2 * width * height),
            },
            Action::Launch(l) => Cost::Work {
                stream: l.stream,
                host: launch,
                device: self.kernel_seconds(kernel_bytes(l)),
            },
            Action::Gemm(g) => Cost::Work {
                stream: StreamKind::Compute,
                host: launch,
                device: self.gemm(g),
            },
            // The simulated ranks are one data-parallel group; each one's TP peers are other
            // GPUs running the same schedule, so a TP collective is comm-stream work of its own
            // rank, not a meeting of the simulated ranks.
            Action::Nccl(NcclComm::Tensor, calls) => Cost::Work {
                stream: StreamKind::Comm,
                host: launch,
                device: calls
                    .iter()
                    .map(|c| self.nccl_on(c, self.tp_group.unwrap_or(1), self.nvlink_ring()))
                    .sum(),
            },
            Action::Nccl(which, calls) => {
                let ranks = match (which, self.norm_group) {
                    (NcclComm::Norm, Some(n)) => n,
                    _ => self.dp,
                };
                // A one-rank communicator (an expert data-parallel group of one rank) meets no
                // other rank: the call's launch, and no device time is modelled for it.
                if ranks == 1 {
                    return Cost::Work {
                        stream: StreamKind::Comm,
                        host: launch,
                        device: 0.0,
                    };
                }
                Cost::Collective {
                    host: launch,
                    device: calls.iter().map(|c| self.nccl_over(c, ranks)).sum(),
                }
            }
            Action::Record { stream, .. } => Cost::Record {
                stream: *stream,
                host: self.hw.event_host_us * US,
            },
            Action::Wait { stream, .. } => Cost::Wait {
                stream: *stream,
                host: self.hw.event_host_us * US,
            },
            Action::Synchronize(stream) => Cost::Sync { stream: *stream },
        }
    }

    fn copy(&self, stream: StreamKind, bytes: u64) -> Cost {
        Cost::Blocking {
            stream,
            host: self.hw.launch_host_us * US,
            device: self.hw.copy_latency_us * US + bytes as f64 / (self.hw.pcie_gbps * GB),
        }
    }

    /// Seconds of one GEMM (see the module docs).
    pub fn gemm(&self, g: &Gemm) -> f64 {
        let (m, n, k, batch) = (g.m as f64, g.n as f64, g.k as f64, g.batch as f64);
        let flops = 2.0 * m * n * k * batch;
        let (peak, in_bytes) = match g.inputs {
            GemmInputs::Bf16 => (self.hw.bf16_tflops, 2.0),
            GemmInputs::F32 => (self.hw.f32_tflops, 4.0),
        };
        let tile = f64::from(self.hw.gemm_tile);
        let tiles = (m / tile).ceil() * (n / tile).ceil() * batch;
        let sms = f64::from(self.hw.sms);
        let waves = (tiles / sms).ceil();
        let fill = tiles / (waves * sms);
        let compute = flops / (peak * TFLOP * self.hw.gemm_efficiency * fill);
        let c_reads = if g.beta == 0.0 { 1.0 } else { 2.0 };
        // A listed batch's tiles share their operand panels: each is read once, as the panels
        // of one large product are.
        let operands = match g.matrices {
            Matrices::Strided { .. } => batch,
            Matrices::Listed { panels, .. } => f64::from(panels),
        };
        let bytes = operands * (m * k + k * n) * in_bytes + batch * m * n * 4.0 * c_reads;
        compute.max(self.hbm(bytes as u64)).max(self.hw.kernel_min_us * US)
    }

    /// Seconds of one NCCL call of this data-parallel group (see the module docs).
    pub fn nccl(&self, call: &NcclCall) -> f64 {
        self.nccl_over(call, self.dp)
    }

    /// Seconds of one NCCL call over a group of `ranks` ranks.
    fn nccl_over(&self, call: &NcclCall, ranks: u32) -> f64 {
        self.nccl_on(call, ranks, self.ring(ranks))
    }

    /// A ring inside one node: NVLink's hop latency and bandwidth.
    fn nvlink_ring(&self) -> Ring {
        Ring {
            hop_latency_us: self.hw.nccl_hop_latency_nvlink_us,
            bytes_per_second: self.hw.nvlink_gbps * GB * self.hw.nvlink_efficiency,
        }
    }

    /// `call` over `ranks` ranks on `ring`: the planner's ring formula
    /// ([`crate::plan::network`]) with this profile's base latency.
    fn nccl_on(&self, call: &NcclCall, ranks: u32, ring: Ring) -> f64 {
        let (collective, bytes) = match *call {
            NcclCall::ReduceScatter { recv_count, dtype, .. } => (
                RingCollective::ReduceScatter,
                recv_count * u64::from(ranks) * nccl_size(dtype),
            ),
            NcclCall::AllGather { send_count, dtype, .. } => (
                RingCollective::AllGather,
                send_count * u64::from(ranks) * nccl_size(dtype),
            ),
            NcclCall::AllReduce { count, dtype, .. } => (RingCollective::AllReduce, count * nccl_size(dtype)),
            NcclCall::Reduce { count, dtype, .. } => (RingCollective::Reduce, count * nccl_size(dtype)),
            NcclCall::Broadcast { count, dtype, .. } => (RingCollective::Broadcast, count * nccl_size(dtype)),
        };
        ring.seconds(collective, bytes, u64::from(ranks), self.hw.nccl_base_latency_us)
    }

    /// The declared network that describes this profile's data-parallel ring (its hop latency
    /// and bandwidth at this dp and placement): what a job on this cluster declares in
    /// `muon_config_t.network`, and what `simulate` plans every run with.
    pub fn network(&self) -> Network {
        let ring = self.ring(self.dp);
        Network {
            hop_latency_us: ring.hop_latency_us,
            bus_bandwidth_gbps: ring.bytes_per_second / GB,
        }
    }

    /// Nodes the data-parallel group spans.
    fn nodes(&self) -> u32 {
        self.dp.div_ceil(self.hw.dp_ranks_per_node)
    }

    /// The fraction of the SMs a collective of the data-parallel group occupies: its ring's
    /// transport's share (`comm_sm_share` inside a node, `comm_sm_share_network` across nodes).
    pub fn comm_sm_share(&self) -> f64 {
        if self.nodes() <= 1 {
            self.hw.comm_sm_share
        } else {
            self.hw.comm_sm_share_network
        }
    }

    /// The average hop latency (µs) of a ring over `ranks` ranks spread over the nodes of the
    /// data-parallel group, and its bandwidth (bytes/s): a ring over `nodes` nodes crosses the
    /// network `nodes` times per turn. With several of the group's ranks per node, NCCL runs one
    /// ring per NIC at once (multi-rail): the network bandwidth of `min(nics_per_node, ranks
    /// per node)` NICs, capped by NVLink's, which every ring also crosses inside the nodes.
    fn ring(&self, ranks: u32) -> Ring {
        let n = f64::from(ranks);
        let nodes = self.nodes();
        if nodes <= 1 {
            return self.nvlink_ring();
        }
        let network_hops = f64::from(nodes);
        let hop = (network_hops * self.hw.nccl_hop_latency_network_us
            + (n - network_hops) * self.hw.nccl_hop_latency_nvlink_us)
            / n;
        let rails = f64::from(self.hw.nics_per_node.min(self.hw.dp_ranks_per_node));
        let network = self.hw.network_gbps * GB * self.hw.network_efficiency * rails;
        Ring {
            hop_latency_us: hop,
            bytes_per_second: network.min(self.nvlink_ring().bytes_per_second),
        }
    }

    /// Seconds of the framework's forward (`share` = 1/3) or backward (2/3) over `params`
    /// elements and `tokens` tokens: `6·params·tokens` flops in all, at the model efficiency.
    pub fn model_compute(&self, params: u64, tokens: u64, share: f64) -> f64 {
        6.0 * params as f64 * tokens as f64 * share / (self.hw.bf16_tflops * TFLOP * self.hw.model_efficiency)
    }
}

/// Device-memory bytes a kernel launch reads and writes (its arguments as the translator
/// writes them, `src/backend/cuda/translate.rs`).
pub(crate) fn kernel_bytes(l: &Launch) -> u64 {
    let a = &l.args;
    match l.kernel {
        // src f32 → dst bf16
        Kernel::CastF32ToBf16 => arg_u64(a, 2) * 6,
        // (src, src_bf16, dst, dst_bf16, n)
        Kernel::Cast => arg_u64(a, 4) * (elem(a, 1) + elem(a, 3)),
        // one word triple per span: ptr, len, bf16 | first_block << 32 (the exact norm's
        // integer work per element is priced as memory-bound too: unmeasured on a device)
        Kernel::SumsqPartials | Kernel::NormPartials => match a.first() {
            Some(Arg::Words(w)) => w
                .chunks(3)
                .take_while(|c| c.len() == 3)
                .map(|c| c[1] * if c[2] & 1 == 1 { 2 } else { 4 })
                .sum(),
            _ => 0,
        },
        // a few partials per group
        Kernel::SumsqFinish => u64::from(l.grid[0]) * 8 * 64,
        // grad (dtype), momentum (dtype) read+write, update write unless it is the momentum
        Kernel::MuonMomentum => {
            let in_place = matches!((a.get(2), a.get(3)), (Some(Arg::Ptr(m)), Some(Arg::Ptr(u))) if m == u);
            let update = if in_place { 0 } else { 4 };
            arg_u64(a, 4) * (elem(a, 1) + 2 * elem(a, 7) + update)
        }
        // (u, x, norms, batch, rows, cols, t): read and write f32
        Kernel::NsNormalize => arg_u64(a, 3) * arg_u64(a, 4) * arg_u64(a, 5) * 8,
        // (src, dst, bf16, batch, m): the lower triangle read (2 bytes per element of the
        // matrix), the whole matrix written as bf16 or the upper triangle as f32 (2 bytes).
        Kernel::NsSymmetrize => arg_u64(a, 3) * arg_u64(a, 4) * arg_u64(a, 4) * 4,
        // the lists' three pointers per tile written (`struct muon_tile_lists`: count and
        // entries after the lists)
        Kernel::GemmTileTables => match a.first() {
            Some(Arg::Words(w)) if w.len() >= 2 => (w[w.len() - 2] & 0xffff_ffff) * w[w.len() - 1] * 24,
            _ => 0,
        },
        // (src, dst, a, batch, m): the matrices read and written in f32
        Kernel::NsAddIdentity => arg_u64(a, 3) * arg_u64(a, 4) * arg_u64(a, 4) * 8,
        // (master, x, batch, rows, cols, t, x_ld, scalars, …, moment2_layout at 12, …): master
        // read+write, x read; AdaMuon's element-wise second moment read+write too
        Kernel::MuonApply => {
            let adamuon = matches!(a.get(12), Some(&Arg::I32(l)) if l == Moment2Layout::Elements as i32);
            arg_u64(a, 2) * arg_u64(a, 3) * arg_u64(a, 4) * if adamuon { 20 } else { 12 }
        }
        // (x, sums, batch, lines, n, …): x read, one f64 sum per line written
        Kernel::NormuonLineSums => arg_u64(a, 2) * arg_u64(a, 3) * (arg_u64(a, 4) * 4 + 8),
        // (sums, moment2, ratio, batch, lines, …): the sums read, the moments read and written
        Kernel::NormuonMoments => arg_u64(a, 3) * arg_u64(a, 4) * 16,
        // master, exp_avg, exp_avg_sq read+write, grad read
        Kernel::Adamw => arg_u64(a, 5) * (24 + elem(a, 4)),
        // the scalar slots and one exact sum per rank (dp is argument 2)
        Kernel::StepScalars => {
            (crate::backend::ops::Scalar::COUNT as u64 + crate::numerics::RANK_NORM_WORDS as u64 * arg_u64(a, 2)) * 8
        }
        // bf16 in; rowwise and columnwise E4M3 out, one scale byte per 32 elements each
        Kernel::Mxfp8Quantize => {
            let n = arg_u64(a, 1) * arg_u64(a, 2);
            n * 4 + n / 16
        }
        // (master, maxima, cols, groups, heads per group, segments, rows | role << 32 …):
        // the query, key and rope rows read and written in f32 (value rows are not touched)
        Kernel::QkClip => match a.get(6) {
            Some(Arg::Words(segs)) => {
                let touched: u64 = segs
                    .iter()
                    .filter(|&&w| (w >> 32) != u64::from(crate::numerics::qk_clip::QkRole::Value.code()))
                    .map(|&w| w & 0xffff_ffff)
                    .sum();
                touched * arg_u64(a, 3) * arg_u64(a, 2) * 8
            }
            _ => 0,
        },
    }
}

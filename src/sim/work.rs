//! What a device action costs, stripped of addresses: the quantities the cost model prices an
//! action by. A device run (`muon-opt measure`, [`crate::measure`]) records the measured time of
//! each [`Work`], so any profile can price the same work later and be compared with the card.

use serde::{Deserialize, Serialize};

use crate::backend::cuda::action::{Action, DevPtr, Gemm, GemmInputs, Matrices, NcclCall};

use super::cost::{CostModel, kernel_bytes};

/// One device action's work, as the cost model sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Work {
    /// A batched GEMM: `m×n` outputs over `k`, `batch` matrices, operands `inputs`
    /// (`bf16` | `f32`), C read as well as written when `accumulate` (β ≠ 0); strided, or
    /// listed tiles whose operands are `panels` distinct matrices (0 for strided).
    Gemm {
        inputs: String,
        m: u64,
        n: u64,
        k: u64,
        batch: u64,
        accumulate: bool,
        #[serde(default, skip_serializing_if = "is_zero")]
        panels: u64,
    },
    /// A kernel of `kernels/*.cu` (its `extern "C"` name) moving `bytes` of device memory.
    Kernel { kernel: String, bytes: u64 },
    /// `cuMemsetD8Async` of `bytes`.
    Memset { bytes: u64 },
    /// A device-to-device copy of `bytes` (read once, written once).
    Copy { bytes: u64 },
    /// One NCCL group of `calls` calls over `bytes` of buffers (not priced on one GPU: a
    /// one-rank collective is a local copy, the model's collectives are ring transfers).
    Collective { calls: u64, bytes: u64 },
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn inputs_name(inputs: GemmInputs) -> &'static str {
    match inputs {
        GemmInputs::Bf16 => "bf16",
        GemmInputs::F32 => "f32",
    }
}

fn call_bytes(call: &NcclCall) -> u64 {
    let size = |dtype| crate::sim::cost::nccl_size(dtype);
    match *call {
        NcclCall::Reduce { count, dtype, .. }
        | NcclCall::Broadcast { count, dtype, .. }
        | NcclCall::AllReduce { count, dtype, .. } => count * size(dtype),
        NcclCall::ReduceScatter { recv_count, dtype, .. } => recv_count * size(dtype),
        NcclCall::AllGather { send_count, dtype, .. } => send_count * size(dtype),
    }
}

impl Work {
    /// The work of `action`; None for actions that do no device work of their own (allocations,
    /// host copies, event records and waits, synchronizations).
    pub fn of(action: &Action) -> Option<Work> {
        Some(match action {
            Action::Launch(l) => Work::Kernel {
                kernel: l.kernel.name().to_string(),
                bytes: kernel_bytes(l),
            },
            Action::Gemm(g) => Work::Gemm {
                inputs: inputs_name(g.inputs).to_string(),
                m: g.m as u64,
                n: g.n as u64,
                k: g.k as u64,
                batch: g.batch as u64,
                accumulate: g.beta != 0.0,
                panels: match g.matrices {
                    Matrices::Strided { .. } => 0,
                    Matrices::Listed { panels, .. } => u64::from(panels),
                },
            },
            Action::Zero { bytes, .. } => Work::Memset { bytes: *bytes },
            Action::CopyDevice { bytes, .. } => Work::Copy { bytes: *bytes },
            Action::CopyDevice2D { width, height, .. } => Work::Copy { bytes: width * height },
            Action::Nccl(_, calls) => Work::Collective {
                calls: calls.len() as u64,
                bytes: calls.iter().map(call_bytes).sum(),
            },
            _ => return None,
        })
    }

    /// The op class it is reported under: a GEMM by precision and shape, a kernel by name.
    pub fn class(&self) -> String {
        match self {
            Work::Gemm {
                inputs,
                m,
                n,
                k,
                batch,
                panels,
                ..
            } => match (*batch, *panels) {
                (1, 0) => format!("gemm {inputs} {m}x{n}x{k}"),
                (_, 0) => format!("gemm {inputs} {m}x{n}x{k} x{batch}"),
                _ => format!("gemm {inputs} {m}x{n}x{k} x{batch} tiles"),
            },
            Work::Kernel { kernel, .. } => format!("kernel {kernel}"),
            Work::Memset { .. } => "memset".to_string(),
            Work::Copy { .. } => "copy device-to-device".to_string(),
            Work::Collective { .. } => "nccl (one rank)".to_string(),
        }
    }

    /// Floating-point operations (GEMMs; 0 otherwise).
    pub fn flops(&self) -> f64 {
        match self {
            Work::Gemm { m, n, k, batch, .. } => 2.0 * (*m as f64) * (*n as f64) * (*k as f64) * (*batch as f64),
            _ => 0.0,
        }
    }

    /// Device-memory bytes it moves (kernels, memsets and copies; 0 otherwise).
    pub fn bytes(&self) -> u64 {
        match self {
            Work::Kernel { bytes, .. } | Work::Memset { bytes } => *bytes,
            Work::Copy { bytes } => 2 * bytes,
            Work::Gemm { .. } | Work::Collective { .. } => 0,
        }
    }
}

impl CostModel {
    /// Device seconds of `work` by this model; None for a one-rank collective (see
    /// [`Work::Collective`]) and for a GEMM whose precision the model does not know.
    pub fn work_seconds(&self, work: &Work) -> Option<f64> {
        match work {
            Work::Gemm {
                inputs,
                m,
                n,
                k,
                batch,
                accumulate,
                panels,
            } => {
                let inputs = match inputs.as_str() {
                    "bf16" => GemmInputs::Bf16,
                    "f32" => GemmInputs::F32,
                    _ => return None,
                };
                let dim = |v: u64| i32::try_from(v).ok();
                const NOWHERE: DevPtr = 0;
                let matrices = match *panels {
                    0 => Matrices::Strided {
                        a: NOWHERE,
                        stride_a: 0,
                        b: NOWHERE,
                        stride_b: 0,
                        c: NOWHERE,
                        stride_c: 0,
                    },
                    panels => Matrices::Listed {
                        table: NOWHERE,
                        panels: u32::try_from(panels).ok()?,
                    },
                };
                Some(self.gemm(&Gemm {
                    inputs,
                    transpose_a: false,
                    m: dim(*m)?,
                    n: dim(*n)?,
                    k: dim(*k)?,
                    alpha: 1.0,
                    lda: 0,
                    ldb: 0,
                    beta: if *accumulate { 1.0 } else { 0.0 },
                    ldc: 0,
                    batch: dim(*batch)?,
                    matrices,
                }))
            }
            Work::Kernel { bytes, .. } | Work::Memset { bytes } => Some(self.kernel_seconds(*bytes)),
            Work::Copy { bytes } => Some(self.kernel_seconds(2 * bytes)),
            Work::Collective { .. } => None,
        }
    }
}

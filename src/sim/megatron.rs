//! `muon-opt simulate --schedule megatron`: the same job stepped the way Megatron-LM's
//! layer-wise distributed optimizer steps it in NVIDIA's Muon recipes, through the same
//! schedule runtime, translation, cost model and constants as this library's schedule.
//!
//! What its code does differently, as modelled (Megatron-LM d98e8a64, 2026-08-22;
//! Megatron-Bridge v0.3.1, 2026-03-20, the first release with the Kimi K2 GB300 recipe, and
//! 067f987d, 2026-08-22, which keeps every setting below):
//!
//! - **No distributed optimizer for the gradients**: the Kimi K2 recipe with Muon sets
//!   `ddp.use_distributed_optimizer = False` and `ddp.overlap_param_gather = False` ("Muon
//!   needs this to be False": Megatron-Bridge v0.3.1 `src/megatron/bridge/recipes/kimi/kimi_k2.py`
//!   lines 191–198; 067f987d `src/megatron/bridge/recipes/kimi/h100/kimi_k2.py` lines 66–75),
//!   while with Adam it keeps the distributed optimizer with `overlap_param_gather = True` (the
//!   AdamW baseline). DDP then all-reduces each bucket's gradients
//!   (`megatron/core/distributed/param_and_grad_buffer.py` line 730, `torch.distributed.all_reduce`
//!   when not `use_distributed_optimizer`) as each bucket's backward completes
//!   (`overlap_grad_reduce = True`, v0.3.1 `scripts/performance/configs/kimi/kimi_llm_pretrain.py`
//!   line 93), in bf16 (lines 50–51), in buckets of `max(40M, 1M · dp)` elements
//!   (`megatron/core/distributed/distributed_data_parallel.py` lines 133–134): this library's
//!   `allreduce` layout, whose buckets follow the same rule.
//! - **No MXFP8 param storage**: with Muon and MXFP8 the recipe turns `fp8_param_gather` and
//!   `reuse_grad_buf_for_mxfp8_param_ag` off, as they "require DistributedOptimizer
//!   infrastructure, incompatible with Muon's LayerWiseDistributedOptimizer" (v0.3.1
//!   `kimi_llm_pretrain.py` lines 35–44): the params stay bf16 (`mxfp8` off here; the
//!   forward's quantization is the model compute's in both runs).
//! - **Whole matrices per rank, updated one param at a time**: without a param layout the
//!   layer-wise optimizer assigns whole params to ranks (`layer_wise_optimizer.py` line 643,
//!   `_shard_params_ping_pong`, line 713) and each rank's Emerging-Optimizers
//!   `OrthogonalizedOptimizer` steps its params in a loop, one Newton–Schulz per param
//!   (`megatron/core/optimizer/emerging_optimizers.py` line 382, `orthogonalize(p, grad)` of
//!   one param). A MoE layer's experts are separate params (one weight per expert), so each
//!   expert is orthogonalized alone: here every expert stack `[E, m, n]` is registered as E
//!   pieces `[1, m, n]`, each its own Newton–Schulz (`split_expert_stacks`).
//! - **The param all-gather after the whole step**: `step_with_ready_grads` steps every
//!   chained optimizer, then, without `overlap_param_gather`, calls `allgather_params`
//!   (`layer_wise_optimizer.py` lines 964–990): one all-gather of every rank's updated params
//!   (lines 817–868), which starts after the last update and which the next forward waits for
//!   (`Runtime::sync_params_after_step`, with `overlap_param_gather` off). The layer-wise
//!   optimizer can defer the gather to the forward pre-hooks (lines 975–986), but only with
//!   the distributed optimizer's param layout (`use_buffer_param_sync`, lines 552–558), which
//!   the Muon recipes turn off with `overlap_param_gather` itself.
//! - **Newton–Schulz iterates in bf16**: the recipe's optimizer is
//!   `distributed_muon_with_cosine_annealing` (067f987d `recipes/kimi/h100/kimi_k2.py` line
//!   67), whose `muon_fp32_matmul_prec` is `"medium"`
//!   (`src/megatron/bridge/recipes/utils/optimizer_utils.py` line 25): Emerging-Optimizers then keeps the iterate in bf16, `bf16_iterate` here
//!   (docs/megatron.md, `--muon-fp32-matmul-prec`).
//!
//! Megatron-Bridge has no Muon recipe of Qwen3-30B-A3B (v0.3.1, 067f987d): a job is stepped
//! with the Kimi K2 recipe's Muon settings, which that recipe says Muon needs.
//!
//! Not modelled (named in `docs/validation.md`): the ping-pong-by-numel owner assignment
//! (balanced by Newton–Schulz cost here), the all-gather of uneven sizes as one call (here the
//! `allreduce` layout's broadcast per bucket and owner, the same bytes per rank), PyTorch's
//! eager launches per Newton–Schulz operation and its fp32 copies of gradients and params
//! (`Float16OptimizerWithFloat16Params`), and the AdamW baseline's MXFP8 param all-gather
//! (Adam keeps `fp8_param_gather`: its gather moves 8-bit values where ours moves bf16).

use crate::config::{MuonLayout, MuonOwnership, NsPrecision};
use crate::error::Result;
use crate::plan::presets::ModelDesc;

use super::Scenario;

/// How a simulated job is stepped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Schedule {
    /// This library's schedule, as configured by the scenario.
    #[default]
    Ours,
    /// Megatron-LM's layer-wise distributed optimizer as NVIDIA's Muon recipes run it.
    Megatron,
}

impl Schedule {
    pub fn name(self) -> &'static str {
        match self {
            Schedule::Ours => "ours",
            Schedule::Megatron => "megatron",
        }
    }
}

impl Scenario {
    /// This scenario stepped the way `schedule` steps it: for Megatron's, its gradient
    /// all-reduce (the `allreduce` layout, ownership balanced), bf16 params, its bf16 iterate, the param
    /// all-gather after the step and waited for before the next forward, its experts one param
    /// each.
    pub fn with_schedule(&self, schedule: Schedule) -> Scenario {
        match schedule {
            Schedule::Ours => Scenario {
                schedule,
                ..self.clone()
            },
            Schedule::Megatron => Scenario {
                schedule,
                layout: MuonLayout::Allreduce,
                ownership: MuonOwnership::Balanced,
                ns_precision: NsPrecision::Bf16Iterate,
                mxfp8: false,
                overlap_grad_reduce: true,
                overlap_param_gather: false,
                ..self.clone()
            },
        }
    }
}

/// Every expert stack `[E, m, n]` of `model` as E pieces `[1, m, n]` named `name.e` (flags,
/// splits and hyper-parameters kept): Megatron's experts, one param each, each orthogonalized
/// alone.
///
/// # Errors
/// `InvalidArgument` when the expert stacks do not all hold the same number of experts.
pub fn split_expert_stacks(model: &ModelDesc) -> Result<ModelDesc> {
    let mut experts: Option<u64> = None;
    let mut params = Vec::with_capacity(model.params.len());
    for spec in &model.params {
        if !spec.is_expert_stack() {
            params.push(spec.clone());
            continue;
        }
        let e = spec.shape[0];
        if experts.is_some_and(|n| n != e) {
            crate::bail!(
                InvalidArgument,
                "simulate --schedule megatron: '{}' holds {e} experts, another stack {}",
                spec.name,
                experts.unwrap_or_default()
            );
        }
        experts = Some(e);
        for i in 0..e {
            let mut piece = spec.clone();
            piece.name = format!("{}.{i}", spec.name);
            piece.shape[0] = 1;
            params.push(piece);
        }
    }
    Ok(ModelDesc {
        name: model.name.clone(),
        vocab_size: model.vocab_size,
        params,
    })
}

//! QK-clip in the simulation (issue 28): the clips a MuonClip trainer requests before every
//! step — every fused `…qkv.weight` — priced as what the step then runs: one `muon_qk_clip`
//! pass over each owned QKV's query and key rows (read and write, f32), and no collective of its
//! own (the step's param collective carries the clipped values).

use crate::backend::ops::QkMaxima;
use crate::model::ParamSpec;
use crate::numerics::qk_clip::{QkHeads, QkKind};
use crate::schedule::QkClipRequest;

/// Where the simulated maxima are (never read: the simulation prices, it does not run).
const MAXIMA: u64 = 0x7000_0000_0000;

/// Megatron's threshold and exponent defaults (`--qk-clip-threshold`, `--qk-clip-alpha`).
pub const THRESHOLD: f32 = 100.0;
pub const ALPHA: f32 = 0.5;

/// A clip of every fused QKV of `params` (`[q, k, v]` rows per query group, `k = v`, `q` a
/// multiple of `k`): one key head of `k` rows per group, so every query and key row is
/// touched, as when every group is over τ (the cost does not depend on the head split).
pub fn requests(params: &[ParamSpec]) -> Vec<QkClipRequest> {
    params
        .iter()
        .enumerate()
        .filter_map(|(p, spec)| {
            let &[q, k, v] = spec.split_sizes.as_slice() else {
                return None;
            };
            let fits = spec.name.ends_with("qkv.weight") && spec.shape.len() == 2 && k == v && k > 0 && q % k == 0;
            fits.then(|| QkClipRequest {
                param: p as u32,
                heads: QkHeads {
                    kind: QkKind::FusedQkv,
                    heads: (q / k * spec.split_groups) as u32,
                    query_groups: spec.split_groups as u32,
                    head_dim: k as u32,
                    rope_dim: 0,
                    v_head_dim: 0,
                },
                maxima: QkMaxima::Device(MAXIMA),
            })
        })
        .collect()
}

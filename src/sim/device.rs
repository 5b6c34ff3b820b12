//! What the cuda backend allocates for a plan, without a device: the translator's own
//! allocations for every rank's memory layout.

use crate::backend::cuda::action::Action;
use crate::backend::cuda::translate::Translator;
use crate::backend::ops::Op;
use crate::config::Config;
use crate::error::Result;
use crate::model::ParamSpec;
use crate::numerics::muon::MuonOptions;
use crate::plan::Plan;
use crate::schedule::state::StateLayout;

use super::metrics::DeviceBytes;

/// The device bytes of `rank` by kind: what the translator allocates at creation and for the
/// rank's memory layout.
pub fn rank_device_bytes(plan: &Plan, params: &[ParamSpec], cfg: &Config, rank: usize) -> Result<DeviceBytes> {
    let mut translator = Translator::new(rank, plan.dp as usize, MuonOptions::from_config(cfg));
    let layout = StateLayout::new(plan, params, cfg, rank).memory;
    let mut actions = translator.setup();
    actions.extend(translator.translate(&Op::Allocate(layout))?);
    let allocations: Vec<_> = actions
        .into_iter()
        .filter_map(|action| match action {
            Action::Alloc { buf, bytes } => Some((buf, bytes)),
            _ => None,
        })
        .collect();
    Ok(DeviceBytes::of(&allocations))
}

/// The device bytes of the rank that needs the most, by kind.
pub fn device_bytes(plan: &Plan, params: &[ParamSpec], cfg: &Config) -> Result<DeviceBytes> {
    let mut largest = DeviceBytes::default();
    for rank in 0..plan.dp as usize {
        let bytes = rank_device_bytes(plan, params, cfg, rank)?;
        if bytes.total > largest.total {
            largest = bytes;
        }
    }
    Ok(largest)
}

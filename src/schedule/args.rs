//! A step's arguments: the learning rates and weight decays of both routes, and what the step
//! uses in place of the config's Muon momentum and AdamW β1, β2 and ε ([`StepOverrides`], for
//! the schedules a caller drives: torch's `OneCycleLR` with `cycle_momentum`, a Muon momentum
//! warmup) and of the AdamW learning rate for the embedding and output params (Megatron-LM's
//! `--decoupled-lr`). They reach the device as [`STEP_ARGS`] scalars ([`StepArgs::slots`]), so a step
//! captured in a CUDA graph reads every one of them at each replay.

use crate::backend::ops::STEP_ARGS;
use crate::bail;
use crate::config::Config;
use crate::error::Result;

/// Learning rates and weight decays of one step, and its overrides of the config.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepArgs {
    pub lr: f32,
    pub weight_decay: f32,
    pub adam_lr: f32,
    pub adam_weight_decay: f32,
    pub overrides: StepOverrides,
}

/// Values a step uses in place of the config's; `None` keeps the config's value. An override
/// is per route: every Muon matrix steps with one momentum, every AdamW piece with one β1, β2
/// and ε. AdamW's bias corrections follow `torch.optim.AdamW`: `1 − β^t` with the step's β and
/// its step count `t`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepOverrides {
    /// Muon momentum μ, in [0, 1).
    pub muon_momentum: Option<f32>,
    /// AdamW β1, in [0, 1).
    pub adam_beta1: Option<f32>,
    /// AdamW β2, in [0, 1).
    pub adam_beta2: Option<f32>,
    /// AdamW ε, finite and > 0.
    pub adam_eps: Option<f32>,
    /// The learning rate of the AdamW params flagged `EMBEDDING_OR_OUTPUT`, finite and >= 0,
    /// in place of `adam_lr`: Megatron-LM's decoupled learning rate, which
    /// `get_standard_config_overrides` (`megatron/core/optimizer/__init__.py`, commit d98e8a64)
    /// gives the params with `is_embedding_or_output_parameter` as their group's `max_lr`
    /// (`--decoupled-lr`) and `min_lr` (`--decoupled-min-lr`, else `--min-lr`), scheduled like
    /// `--lr` by the one `OptimizerParamScheduler` — so the caller's schedule computes it.
    pub decoupled_lr: Option<f32>,
}

impl StepOverrides {
    /// The config's values throughout.
    pub const NONE: StepOverrides = StepOverrides {
        muon_momentum: None,
        adam_beta1: None,
        adam_beta2: None,
        adam_eps: None,
        decoupled_lr: None,
    };
}

impl StepArgs {
    /// Checks every value, each named `{arg}{field}` in the message (`args->`, `args[1].`):
    /// rates (the decoupled one too) and decays finite and >= 0, momentum and betas in [0, 1),
    /// ε finite and > 0.
    pub fn check(&self, arg: &str) -> Result<()> {
        for (field, value) in [
            ("lr", self.lr),
            ("weight_decay", self.weight_decay),
            ("adam_lr", self.adam_lr),
            ("adam_weight_decay", self.adam_weight_decay),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                bail!(OutOfRange, "step: {arg}{field} {value} must be finite and >= 0");
            }
        }
        let o = &self.overrides;
        for (field, value) in [
            ("muon_momentum", o.muon_momentum),
            ("adam_beta1", o.adam_beta1),
            ("adam_beta2", o.adam_beta2),
        ] {
            if let Some(value) = value.filter(|v| !(0.0..1.0).contains(v)) {
                bail!(OutOfRange, "step: {arg}{field} {value} is outside [0, 1)");
            }
        }
        if let Some(eps) = o.adam_eps.filter(|e| !(e.is_finite() && *e > 0.0)) {
            bail!(OutOfRange, "step: {arg}adam_eps {eps} must be finite and > 0");
        }
        if let Some(lr) = o.decoupled_lr.filter(|v| !(v.is_finite() && *v >= 0.0)) {
            bail!(OutOfRange, "step: {arg}decoupled_lr {lr} must be finite and >= 0");
        }
        Ok(())
    }

    /// The step's scalars in slot order from [`crate::backend::ops::Scalar::Lr`]: the rates and
    /// decays, then the Muon momentum, AdamW β1, β2 and ε, each the override or `cfg`'s value,
    /// then the embedding and output params' learning rate (the decoupled one, else `adam_lr`).
    pub fn slots(&self, cfg: &Config) -> [f32; STEP_ARGS] {
        let o = &self.overrides;
        [
            self.lr,
            self.weight_decay,
            self.adam_lr,
            self.adam_weight_decay,
            o.muon_momentum.unwrap_or(cfg.muon_momentum),
            o.adam_beta1.unwrap_or(cfg.adam_beta1),
            o.adam_beta2.unwrap_or(cfg.adam_beta2),
            o.adam_eps.unwrap_or(cfg.adam_eps),
            o.decoupled_lr.unwrap_or(self.adam_lr),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARGS: StepArgs = StepArgs {
        lr: 0.02,
        weight_decay: 0.1,
        adam_lr: 3e-4,
        adam_weight_decay: 0.01,
        overrides: StepOverrides::NONE,
    };

    #[test]
    fn slots_take_the_overrides_else_the_config() {
        let cfg = Config::default();
        assert_eq!(ARGS.slots(&cfg), [0.02, 0.1, 3e-4, 0.01, 0.95, 0.9, 0.999, 1e-8, 3e-4]);
        let args = StepArgs {
            overrides: StepOverrides {
                muon_momentum: Some(0.5),
                adam_beta2: Some(0.95),
                decoupled_lr: Some(5e-5),
                ..StepOverrides::NONE
            },
            ..ARGS
        };
        assert_eq!(args.slots(&cfg), [0.02, 0.1, 3e-4, 0.01, 0.5, 0.9, 0.95, 1e-8, 5e-5]);
    }

    /// Every bad override is refused naming the field and its rule; the bounds pass.
    #[test]
    fn bad_overrides_name_the_field_and_the_rule() {
        let with = |o: StepOverrides| StepArgs { overrides: o, ..ARGS };
        for (overrides, message) in [
            (
                StepOverrides {
                    muon_momentum: Some(1.0),
                    ..StepOverrides::NONE
                },
                "args->muon_momentum 1 is outside [0, 1)",
            ),
            (
                StepOverrides {
                    muon_momentum: Some(-0.5),
                    ..StepOverrides::NONE
                },
                "args->muon_momentum -0.5 is outside [0, 1)",
            ),
            (
                StepOverrides {
                    adam_beta1: Some(f32::NAN),
                    ..StepOverrides::NONE
                },
                "args->adam_beta1 NaN is outside [0, 1)",
            ),
            (
                StepOverrides {
                    adam_beta2: Some(1.5),
                    ..StepOverrides::NONE
                },
                "args->adam_beta2 1.5 is outside [0, 1)",
            ),
            (
                StepOverrides {
                    adam_eps: Some(0.0),
                    ..StepOverrides::NONE
                },
                "args->adam_eps 0 must be finite and > 0",
            ),
            (
                StepOverrides {
                    adam_eps: Some(f32::INFINITY),
                    ..StepOverrides::NONE
                },
                "args->adam_eps inf must be finite and > 0",
            ),
            (
                StepOverrides {
                    decoupled_lr: Some(-1e-4),
                    ..StepOverrides::NONE
                },
                "args->decoupled_lr -0.0001 must be finite and >= 0",
            ),
            (
                StepOverrides {
                    decoupled_lr: Some(f32::NAN),
                    ..StepOverrides::NONE
                },
                "args->decoupled_lr NaN must be finite and >= 0",
            ),
        ] {
            let err = with(overrides).check("args->").unwrap_err();
            assert_eq!(err.kind, crate::error::ErrorKind::OutOfRange, "{err}");
            assert!(err.message.contains(message), "{err}");
        }
        let bounds = StepOverrides {
            muon_momentum: Some(0.0),
            adam_beta1: Some(0.0),
            adam_beta2: Some(0.999_999_9),
            adam_eps: Some(f32::MIN_POSITIVE),
            decoupled_lr: Some(0.0),
        };
        with(bounds).check("args->").unwrap();
    }
}

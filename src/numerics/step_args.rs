//! What one parameter's update multiplies by at one step, derived in one place for both
//! optimizers and both backends: the parameter's multipliers ([`ParamScales`], from its spec:
//! `ParamSpec::scales`)
//! and what they make of its optimizer group's learning rate and weight decay
//! ([`param_rates`]). The host updates ([`super::muon`], [`super::adamw`]) call
//! [`param_rates`]; the cuda backend passes the same [`ParamScales`] to its update kernels,
//! which compute [`param_rates`]'s operations, in its order, from the step's device-resident
//! learning rate and weight decay (`kernels/muon.cu`, `kernels/adamw.cu`).

/// A parameter's multipliers of its optimizer group's learning rate and weight decay.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ParamScales {
    pub lr_scale: f32,
    /// 0 for a no-weight-decay parameter.
    pub wd_scale: f32,
}

/// One parameter's learning rate at one step, and the factor its master is decayed by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ParamRates {
    pub lr: f32,
    pub decay: f32,
}

/// The rates of a parameter with `scales` in a group stepping with learning rate `lr` and
/// weight decay `weight_decay`, each operation in f32, in this order: `lr·lr_scale`,
/// `weight_decay·wd_scale`, `decay = 1 − lr_eff·wd_eff` (decoupled weight decay).
pub fn param_rates(lr: f32, weight_decay: f32, scales: ParamScales) -> ParamRates {
    let lr = lr * scales.lr_scale;
    let weight_decay = weight_decay * scales.wd_scale;
    ParamRates {
        lr,
        decay: 1.0 - lr * weight_decay,
    }
}

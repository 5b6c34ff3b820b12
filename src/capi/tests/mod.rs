//! Unit tests of the exports called directly, as C would call them, and their fixtures:
//! handles made and destroyed through the exports.

mod abi;
mod defaults;
mod handles;
mod registration;
mod status_table;
mod step_args;
mod stepping;

use std::ffi::CStr;
use std::ptr::null_mut;

use crate::capi::comm::{muon_comm_destroy, muon_comm_t, muon_host_group_create};
use crate::capi::config::{muon_config_init, muon_config_t};
use crate::capi::optimizer::{
    muon_optimizer_add_param, muon_optimizer_create, muon_optimizer_destroy, muon_optimizer_finalize, muon_optimizer_t,
};
use crate::capi::param::{muon_param_desc_init, muon_param_desc_t};
use crate::capi::status::muon_last_error_message;
use crate::capi::status::muon_status_t::MUON_STATUS_SUCCESS;

/// This thread's last error message.
pub fn last_error() -> String {
    unsafe { CStr::from_ptr(muon_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

/// The default configuration, from `muon_config_init`.
pub fn default_config() -> muon_config_t {
    let mut cfg = unsafe { std::mem::zeroed::<muon_config_t>() };
    unsafe { muon_config_init(&mut cfg) };
    cfg
}

/// A param description from `muon_param_desc_init` with `name` and `shape`.
pub fn desc(name: &CStr, shape: &[i64]) -> muon_param_desc_t {
    let mut d = unsafe { std::mem::zeroed::<muon_param_desc_t>() };
    unsafe { muon_param_desc_init(&mut d) };
    d.name = name.as_ptr();
    d.ndim = shape.len() as u32;
    d.shape[..shape.len()].copy_from_slice(shape);
    d
}

/// The comms of a host group of `n` ranks.
pub fn host_group(n: u32) -> Vec<*mut muon_comm_t> {
    let mut comms = vec![null_mut(); n as usize];
    assert_eq!(
        unsafe { muon_host_group_create(n, comms.as_mut_ptr()) },
        MUON_STATUS_SUCCESS
    );
    comms
}

/// A one-rank optimizer with nothing registered, and its comm.
pub fn single_rank_optimizer(cfg: &muon_config_t) -> (*mut muon_comm_t, *mut muon_optimizer_t) {
    let comm = host_group(1)[0];
    let mut opt = null_mut();
    assert_eq!(
        unsafe { muon_optimizer_create(cfg, comm, null_mut(), &mut opt) },
        MUON_STATUS_SUCCESS,
        "{}",
        last_error()
    );
    (comm, opt)
}

/// A one-rank optimizer with one registered 16×8 matrix `w`, finalized when `finalize`.
pub fn one_param_optimizer(finalize: bool) -> (*mut muon_comm_t, *mut muon_optimizer_t) {
    let (comm, opt) = single_rank_optimizer(&default_config());
    assert_eq!(
        unsafe { muon_optimizer_add_param(opt, &desc(c"w", &[16, 8]), null_mut()) },
        MUON_STATUS_SUCCESS
    );
    if finalize {
        assert_eq!(unsafe { muon_optimizer_finalize(opt) }, MUON_STATUS_SUCCESS);
    }
    (comm, opt)
}

/// Destroys an optimizer and its comm.
pub fn teardown(comm: *mut muon_comm_t, opt: *mut muon_optimizer_t) {
    assert_eq!(unsafe { muon_optimizer_destroy(opt) }, MUON_STATUS_SUCCESS);
    assert_eq!(unsafe { muon_comm_destroy(comm) }, MUON_STATUS_SUCCESS);
}

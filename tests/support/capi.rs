//! The C API as a user's program calls it, from Rust: handles moved to rank threads, statuses
//! with this thread's last error, and how long a call took.

use std::ffi::{CStr, CString};
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use muon_opt::capi::comm::{muon_comm_destroy, muon_comm_t, muon_host_group_create};
use muon_opt::capi::config::{muon_config_init, muon_config_t};
use muon_opt::capi::optimizer::{
    muon_optimizer_add_param, muon_optimizer_create, muon_optimizer_destroy, muon_optimizer_t,
};
use muon_opt::capi::param::{muon_param_desc_init, muon_param_desc_t};
use muon_opt::capi::status::muon_last_error_message;
use muon_opt::capi::status::muon_status_t::{self, MUON_STATUS_SUCCESS};

/// A C handle moved to the thread of the rank that uses it (one thread at a time, as the
/// header's threading rule says).
#[derive(Debug)]
pub struct Handle<T>(pub *mut T);

impl<T> Clone for Handle<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Handle<T> {}

// SAFETY: each handle is used by one rank's thread at a time, as the C API requires.
unsafe impl<T> Send for Handle<T> {}
// SAFETY: as for Send; the tests never use one handle from two threads at once.
unsafe impl<T> Sync for Handle<T> {}

/// A call's status and, on failure, this thread's last error.
pub type Outcome = Result<(), (muon_status_t, String)>;

/// This thread's last error message.
pub fn last_error() -> String {
    // SAFETY: never NULL, valid until the next muon_* call on this thread.
    unsafe { CStr::from_ptr(muon_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

/// `status` as an outcome, with the message of a failure.
pub fn outcome(status: muon_status_t) -> Outcome {
    if status == MUON_STATUS_SUCCESS {
        Ok(())
    } else {
        Err((status, last_error()))
    }
}

/// What `f` returned and how long it took.
pub fn timed<R>(f: impl FnOnce() -> R) -> (R, Duration) {
    let start = Instant::now();
    let result = f();
    (result, start.elapsed())
}

/// The rank handles of a new host group of `n` ranks.
pub fn host_group(n: usize) -> Vec<Handle<muon_comm_t>> {
    let mut comms = vec![null_mut(); n];
    assert_eq!(
        unsafe { muon_host_group_create(n as u32, comms.as_mut_ptr()) },
        MUON_STATUS_SUCCESS
    );
    comms.into_iter().map(Handle).collect()
}

/// Releases the handles of a group (after the optimizers on it).
pub fn destroy_group(comms: &[Handle<muon_comm_t>]) {
    for comm in comms {
        assert_eq!(unsafe { muon_comm_destroy(comm.0) }, MUON_STATUS_SUCCESS);
    }
}

/// The defaults of `muon_config_init` with collectives that time out after `timeout_ms`.
pub fn config(timeout_ms: u32) -> muon_config_t {
    let mut cfg = unsafe { std::mem::zeroed::<muon_config_t>() };
    unsafe { muon_config_init(&mut cfg) };
    cfg.collective_timeout_ms = timeout_ms;
    cfg
}

/// A host optimizer of `cfg` on `comm`; panics naming the error when creation fails.
pub fn create(cfg: &muon_config_t, comm: Handle<muon_comm_t>) -> Handle<muon_optimizer_t> {
    let mut opt = null_mut();
    let created = outcome(unsafe { muon_optimizer_create(cfg, comm.0, null_mut(), &mut opt) });
    created.expect("muon_optimizer_create");
    Handle(opt)
}

/// Registers a zero-initialized f32 param `name` of `shape` with `flags`; returns its id.
pub fn add_param(opt: Handle<muon_optimizer_t>, name: &str, shape: &[i64], flags: u32) -> u32 {
    let name = CString::new(name).unwrap();
    let mut desc = unsafe { std::mem::zeroed::<muon_param_desc_t>() };
    unsafe { muon_param_desc_init(&mut desc) };
    desc.name = name.as_ptr();
    desc.ndim = shape.len() as u32;
    desc.shape[..shape.len()].copy_from_slice(shape);
    desc.flags = flags;
    desc.dtype = muon_opt::capi::constants::MUON_DTYPE_F32;
    let mut id = 0;
    outcome(unsafe { muon_optimizer_add_param(opt.0, &desc, &mut id) }).expect("muon_optimizer_add_param");
    id
}

/// Destroys an optimizer.
pub fn destroy(opt: Handle<muon_optimizer_t>) {
    assert_eq!(unsafe { muon_optimizer_destroy(opt.0) }, MUON_STATUS_SUCCESS);
}

/// Step arguments with the caller's struct_size.
pub fn step_args(lr: f32) -> muon_opt::capi::iteration::muon_step_args_t {
    muon_opt::capi::iteration::muon_step_args_t {
        struct_size: std::mem::size_of::<muon_opt::capi::iteration::muon_step_args_t>() as u32,
        lr,
        weight_decay: 0.0,
        adam_lr: lr,
        adam_weight_decay: 0.0,
        ..Default::default()
    }
}

//! The boundary of every export: NULL arguments, wrong and destroyed handles, call order,
//! one optimizer per communicator, caught panics, per-thread errors and concurrent `const` calls.

use std::ffi::CString;
use std::ptr::{null, null_mut};

use super::{default_config, desc, host_group, last_error, single_rank_optimizer, teardown};
use crate::capi::comm::*;
use crate::capi::config::*;
use crate::capi::constants::*;
use crate::capi::optimizer::*;
use crate::capi::param::*;
use crate::capi::status::muon_status_t::*;

#[test]
fn null_arguments_are_reported_not_dereferenced() {
    assert_eq!(unsafe { muon_config_validate(null()) }, MUON_STATUS_NULL_ARGUMENT);
    assert!(last_error().contains("cfg is NULL"));
    unsafe { muon_config_init(null_mut()) };
    assert_eq!(
        unsafe { muon_host_group_create(2, null_mut()) },
        MUON_STATUS_NULL_ARGUMENT
    );
    let cfg = default_config();
    let mut opt = null_mut();
    assert_eq!(
        unsafe { muon_optimizer_create(&cfg, null_mut(), null_mut(), &mut opt) },
        MUON_STATUS_NULL_ARGUMENT
    );
    assert!(opt.is_null(), "outputs are written only on success");
    assert_eq!(
        unsafe { muon_optimizer_add_param(null_mut(), null(), null_mut()) },
        MUON_STATUS_NULL_ARGUMENT
    );
    assert_eq!(
        unsafe { muon_optimizer_finalize(null_mut()) },
        MUON_STATUS_NULL_ARGUMENT
    );
    let mut rank = 0;
    assert_eq!(unsafe { muon_comm_rank(null(), &mut rank) }, MUON_STATUS_NULL_ARGUMENT);
    assert_eq!(
        unsafe { muon_comm_create_nccl(null_mut(), null_mut()) },
        MUON_STATUS_NULL_ARGUMENT
    );
    let (comm, opt) = single_rank_optimizer(&cfg);
    assert_eq!(
        unsafe { muon_optimizer_add_param(opt, null(), null_mut()) },
        MUON_STATUS_NULL_ARGUMENT
    );
    assert!(last_error().contains("desc is NULL"));
    let mut d = desc(&CString::new("w").unwrap(), &[4, 4]);
    d.name = null();
    assert_eq!(
        unsafe { muon_optimizer_add_param(opt, &d, null_mut()) },
        MUON_STATUS_NULL_ARGUMENT
    );
    assert!(last_error().contains("desc->name is NULL"));
    teardown(comm, opt);
}

#[test]
fn destroy_null_is_success_and_wrong_handles_are_rejected() {
    assert_eq!(unsafe { muon_optimizer_destroy(null_mut()) }, MUON_STATUS_SUCCESS);
    assert_eq!(unsafe { muon_comm_destroy(null_mut()) }, MUON_STATUS_SUCCESS);
    let comm = host_group(1)[0];
    let as_optimizer = comm.cast::<muon_optimizer_t>();
    assert_eq!(
        unsafe { muon_optimizer_finalize(as_optimizer) },
        MUON_STATUS_INVALID_HANDLE
    );
    assert!(last_error().contains("not a live optimizer handle"));
    assert_eq!(unsafe { muon_comm_destroy(comm) }, MUON_STATUS_SUCCESS);
}

#[test]
fn wrong_call_order_is_a_state_error() {
    let cfg = default_config();
    let (comm, opt) = single_rank_optimizer(&cfg);
    assert_eq!(unsafe { muon_optimizer_finalize(opt) }, MUON_STATUS_INVALID_STATE);
    assert!(last_error().contains("no params registered"));
    let mut view = unsafe { std::mem::zeroed::<muon_param_view_t>() };
    view.struct_size = std::mem::size_of::<muon_param_view_t>() as u32;
    assert_eq!(
        unsafe { muon_optimizer_param_view(opt, 0, &mut view) },
        MUON_STATUS_INVALID_ARGUMENT
    );
    let name = CString::new("layers.0.fc1.weight").unwrap();
    let mut id = u32::MAX;
    assert_eq!(
        unsafe { muon_optimizer_add_param(opt, &desc(&name, &[64, 32]), &mut id) },
        MUON_STATUS_SUCCESS
    );
    assert_eq!(id, 0);
    assert_eq!(
        unsafe { muon_optimizer_param_view(opt, 0, &mut view) },
        MUON_STATUS_INVALID_STATE
    );
    assert!(last_error().contains("not finalized"));
    assert_eq!(
        unsafe { muon_optimizer_finalize(opt) },
        MUON_STATUS_SUCCESS,
        "{}",
        last_error()
    );
    let late = CString::new("late").unwrap();
    assert_eq!(
        unsafe { muon_optimizer_add_param(opt, &desc(&late, &[4]), null_mut()) },
        MUON_STATUS_INVALID_STATE
    );
    assert!(last_error().contains("finalized"));
    assert_eq!(unsafe { muon_optimizer_finalize(opt) }, MUON_STATUS_INVALID_STATE);
    assert_eq!(
        unsafe { muon_optimizer_param_view(opt, 0, &mut view) },
        MUON_STATUS_SUCCESS
    );
    assert_eq!((view.route, view.owner, view.numel), (MUON_ROUTE_MUON, 0, 64 * 32));
    assert!(
        !view.data.is_null() && !view.grad.is_null(),
        "finalize allocates the buffers"
    );
    teardown(comm, opt);
}

#[test]
fn a_comm_serves_one_optimizer_at_a_time() {
    let cfg = default_config();
    let (comm, opt) = single_rank_optimizer(&cfg);
    let mut second = null_mut();
    assert_eq!(
        unsafe { muon_optimizer_create(&cfg, comm, null_mut(), &mut second) },
        MUON_STATUS_INVALID_STATE
    );
    assert_eq!(unsafe { muon_optimizer_destroy(opt) }, MUON_STATUS_SUCCESS);
    assert_eq!(
        unsafe { muon_optimizer_create(&cfg, comm, null_mut(), &mut second) },
        MUON_STATUS_SUCCESS
    );
    teardown(comm, second);
}

#[test]
fn a_panic_is_caught_and_poisons_the_handle() {
    let cfg = default_config();
    let (comm, opt) = single_rank_optimizer(&cfg);
    assert_eq!(force_panic(opt), MUON_STATUS_PANIC);
    assert!(last_error().contains("forced panic for a test"), "{}", last_error());
    assert_eq!(unsafe { muon_optimizer_finalize(opt) }, MUON_STATUS_INVALID_STATE);
    assert!(last_error().contains("poisoned"));
    teardown(comm, opt);
}

#[test]
fn last_error_is_per_thread() {
    assert_eq!(unsafe { muon_config_validate(null()) }, MUON_STATUS_NULL_ARGUMENT);
    let here = last_error();
    let there = std::thread::spawn(|| {
        let before = last_error();
        let mut cfg = default_config();
        cfg.muon_layout = 9;
        assert_eq!(unsafe { muon_config_validate(&cfg) }, MUON_STATUS_INVALID_ENUM_VALUE);
        (before, last_error())
    })
    .join()
    .unwrap();
    assert_eq!(there.0, "", "a new thread starts with an empty message");
    assert!(there.1.contains("muon_layout"));
    assert_eq!(
        last_error(),
        here,
        "another thread's failure must not change this thread's message"
    );
}

#[test]
fn host_group_ranks_and_bounds() {
    let comms = host_group(3);
    for (r, comm) in comms.iter().enumerate() {
        let (mut rank, mut size) = (99, 99);
        assert_eq!(unsafe { muon_comm_rank(*comm, &mut rank) }, MUON_STATUS_SUCCESS);
        assert_eq!(unsafe { muon_comm_size(*comm, &mut size) }, MUON_STATUS_SUCCESS);
        assert_eq!((rank, size), (r as u32, 3));
    }
    for comm in comms {
        assert_eq!(unsafe { muon_comm_destroy(comm) }, MUON_STATUS_SUCCESS);
    }
    let mut out = [null_mut(); 1];
    assert_eq!(
        unsafe { muon_host_group_create(0, out.as_mut_ptr()) },
        MUON_STATUS_OUT_OF_RANGE
    );
    assert!(last_error().contains("world_size: 0"));
}

#[test]
fn nccl_and_cuda_absence_are_statuses() {
    let fake = 0x1000usize as *mut ncclComm;
    let mut out = null_mut();
    if unsafe { libc::dlopen(c"libnccl.so.2".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) }.is_null()
        && std::env::var_os("LD_LIBRARY_PATH").is_none_or(|p| !p.to_string_lossy().contains("nccl"))
    {
        assert_eq!(
            unsafe { muon_comm_create_nccl(fake, &mut out) },
            MUON_STATUS_NCCL_UNAVAILABLE
        );
        assert!(last_error().contains("libnccl.so.2"), "{}", last_error());
        assert!(out.is_null());
    }
    if !muon_cuda_available() {
        assert!(last_error().contains("muon_cuda_available: "), "{}", last_error());
    }
}

/// `const` functions may run concurrently on one handle (the header's threading rule): from
/// several threads at once they all succeed and agree.
#[test]
fn const_calls_run_concurrently_on_one_handle() {
    let cfg = default_config();
    let (comm, opt) = single_rank_optimizer(&cfg);
    let names: Vec<CString> = (0..4).map(|i| CString::new(format!("w{i}")).unwrap()).collect();
    for name in &names {
        let mut id = 0;
        assert_eq!(
            unsafe { muon_optimizer_add_param(opt, &desc(name, &[64, 32]), &mut id) },
            MUON_STATUS_SUCCESS
        );
    }
    assert_eq!(unsafe { muon_optimizer_finalize(opt) }, MUON_STATUS_SUCCESS);
    struct Shared(*const muon_optimizer_t);
    // SAFETY: only the const functions run on it from the threads below, as the header allows.
    unsafe impl Sync for Shared {}
    let shared = Shared(opt);
    let results: Vec<Vec<(usize, usize)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let shared = &shared;
                scope.spawn(move || {
                    let mut seen = Vec::new();
                    for round in 0..200 {
                        let mut len = 0usize;
                        let status = unsafe { muon_optimizer_plan_json(shared.0, null_mut(), 0, &mut len) };
                        assert!(matches!(status, MUON_STATUS_SUCCESS | MUON_STATUS_BUFFER_TOO_SMALL));
                        let mut view = unsafe { std::mem::zeroed::<muon_param_view_t>() };
                        view.struct_size = std::mem::size_of::<muon_param_view_t>() as u32;
                        let status = unsafe { muon_optimizer_param_view(shared.0, round % 4, &mut view) };
                        assert_eq!(status, MUON_STATUS_SUCCESS);
                        seen.push((len, view.data as usize));
                    }
                    seen
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in &results[1..] {
        assert_eq!(r, &results[0], "every thread sees the same plan and views");
    }
    assert!(results[0].iter().all(|&(len, data)| len > 0 && data != 0));
    teardown(comm, opt);
}

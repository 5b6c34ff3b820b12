//! `CommMode::FromEnv` reads `MUON_HOST_COMM_MODE`. The only test of this binary, so changing
//! the process environment races with nothing.

use muon_opt::backend::host::stream::{COMM_MODE_ENV, HostStream, resolve_comm_mode};
use muon_opt::config::CommMode;
use muon_opt::error::ErrorKind;

#[test]
fn comm_mode_from_env() {
    // SAFETY (every `set_var`/`remove_var` below): no other thread of this test binary reads
    // or writes the environment.
    unsafe { std::env::remove_var(COMM_MODE_ENV) };
    assert_eq!(resolve_comm_mode(CommMode::FromEnv).unwrap(), CommMode::Eager);
    assert_eq!(HostStream::new(CommMode::FromEnv).unwrap().mode(), CommMode::Eager);

    unsafe { std::env::set_var(COMM_MODE_ENV, "lazy") };
    assert_eq!(HostStream::new(CommMode::FromEnv).unwrap().mode(), CommMode::Lazy);
    assert_eq!(resolve_comm_mode(CommMode::Eager).unwrap(), CommMode::Eager);

    unsafe { std::env::set_var(COMM_MODE_ENV, "eager") };
    assert_eq!(resolve_comm_mode(CommMode::FromEnv).unwrap(), CommMode::Eager);

    unsafe { std::env::set_var(COMM_MODE_ENV, "Lazy!") };
    let err = HostStream::new(CommMode::FromEnv)
        .err()
        .expect("an invalid value must fail");
    assert_eq!(err.kind, ErrorKind::InvalidEnumValue);
    assert!(err.message.contains("MUON_HOST_COMM_MODE"), "{}", err.message);
    assert!(err.message.contains("'Lazy!'"), "{}", err.message);
    assert_eq!(resolve_comm_mode(CommMode::Lazy).unwrap(), CommMode::Lazy);

    unsafe { std::env::remove_var(COMM_MODE_ENV) };
}

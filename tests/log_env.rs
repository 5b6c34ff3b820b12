//! `MUON_LOG`: diagnostics on stderr by level, read from the environment of the process
//! (here the `muon-opt` binary, whose demo drives the library's optimizers on host ranks).

use std::process::Command;

fn demo_stderr(muon_log: Option<&str>) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_muon-opt"));
    cmd.args(["demo", "--steps", "2", "--dp", "2", "--json"]);
    cmd.env_remove("MUON_LOG");
    if let Some(value) = muon_log {
        cmd.env("MUON_LOG", value);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stderr).unwrap()
}

fn lines_with<'a>(text: &'a str, needle: &str) -> Vec<&'a str> {
    text.lines().filter(|l| l.contains(needle)).collect()
}

#[test]
fn info_shows_the_lifecycle_of_every_rank() {
    let err = demo_stderr(Some("info"));
    // Two runs (Muon, AdamW only) of two ranks each.
    assert_eq!(lines_with(&err, "created on the host backend").len(), 4, "{err}");
    let planned = lines_with(&err, ": finalize: 7 params");
    assert_eq!(planned.len(), 4, "{err}");
    assert!(
        planned
            .iter()
            .all(|l| l.starts_with("[muon_opt pid ") && l.contains("] INFO rank "))
    );
    assert!(lines_with(&err, "DEBUG").is_empty(), "debug lines only at debug: {err}");
}

#[test]
fn debug_adds_every_step() {
    let err = demo_stderr(Some("debug"));
    assert_eq!(lines_with(&err, "DEBUG rank 0: step 2: grad norm").len(), 2, "{err}");
}

#[test]
fn default_and_off_are_quiet_and_an_unknown_value_is_named() {
    for value in [None, Some("off"), Some("warn"), Some("ERROR")] {
        let err = demo_stderr(value);
        assert!(
            lines_with(&err, "[muon_opt pid").is_empty(),
            "MUON_LOG={value:?}: {err}"
        );
    }
    let err = demo_stderr(Some("loud"));
    let warned = lines_with(&err, "WARN MUON_LOG='loud' is not one of off, error, warn, info, debug");
    assert_eq!(warned.len(), 1, "once per process: {err}");
}

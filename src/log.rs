//! Diagnostics on stderr, chosen by the environment variable `MUON_LOG` (read once per
//! process): `off`, `error`, `warn` (the default), `info` or `debug`, case-insensitive.
//!
//! - `error`: what breaks a job and may surface far from its cause — a collective that timed
//!   out or whose group broke, ranks that disagree at finalize or on a checkpoint, a panic
//!   caught at the C boundary, an internal error.
//! - `warn`: a setting the library did not take as given (an unknown `MUON_LOG` value).
//! - `info`: the lifecycle of each optimizer — created (backend, rank, dp), planned (layout,
//!   buckets, padding, hash), checkpoint saved or loaded.
//! - `debug`: every failing C call with its message, and each step's outcome.
//!
//! A line reads `[muon_opt pid 4242] INFO rank 0/8: finalize: …`. Logging never fails a call:
//! a write error on stderr is ignored.

use std::io::Write;
use std::sync::OnceLock;

/// Severity of a diagnostic; a level shows itself and every more severe one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error,
    Warn,
    Info,
    Debug,
}

impl Level {
    fn label(self) -> &'static str {
        match self {
            Level::Error => "ERROR",
            Level::Warn => "WARN",
            Level::Info => "INFO",
            Level::Debug => "DEBUG",
        }
    }
}

/// The threshold `MUON_LOG` selects (`None` = off), and a complaint when its value is not
/// one of the names.
pub fn parse(value: Option<&str>) -> (Option<Level>, Option<String>) {
    let Some(text) = value else {
        return (Some(Level::Warn), None);
    };
    match text.trim().to_ascii_lowercase().as_str() {
        "off" | "none" | "0" => (None, None),
        "error" => (Some(Level::Error), None),
        "warn" | "warning" | "" => (Some(Level::Warn), None),
        "info" => (Some(Level::Info), None),
        "debug" | "trace" => (Some(Level::Debug), None),
        _ => (
            Some(Level::Warn),
            Some(format!(
                "MUON_LOG='{text}' is not one of off, error, warn, info, debug; using warn"
            )),
        ),
    }
}

fn threshold() -> Option<Level> {
    static THRESHOLD: OnceLock<Option<Level>> = OnceLock::new();
    *THRESHOLD.get_or_init(|| {
        let value = std::env::var("MUON_LOG").ok();
        let (level, complaint) = parse(value.as_deref());
        if let Some(complaint) = complaint {
            write_line(Level::Warn, &complaint);
        }
        level
    })
}

/// Whether a diagnostic of `level` is shown.
pub fn enabled(level: Level) -> bool {
    threshold().is_some_and(|t| level <= t)
}

fn write_line(level: Level, message: &str) {
    let line = format!("[muon_opt pid {}] {} {message}\n", std::process::id(), level.label());
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Writes `message` when `level` is enabled.
pub fn emit(level: Level, message: &str) {
    if enabled(level) {
        write_line(level, message);
    }
}

/// `log!(Info, "planned {} buckets", n)`: formats only when the level is enabled.
#[macro_export]
macro_rules! log {
    ($level:ident, $($arg:tt)*) => {
        if $crate::log::enabled($crate::log::Level::$level) {
            $crate::log::emit($crate::log::Level::$level, &format!($($arg)*));
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_parses_and_an_unknown_one_is_named() {
        assert_eq!(parse(None), (Some(Level::Warn), None));
        assert_eq!(parse(Some("off")).0, None);
        assert_eq!(parse(Some("ERROR")).0, Some(Level::Error));
        assert_eq!(parse(Some(" info ")).0, Some(Level::Info));
        assert_eq!(parse(Some("debug")).0, Some(Level::Debug));
        let (level, complaint) = parse(Some("verbose"));
        assert_eq!(level, Some(Level::Warn));
        assert!(complaint.unwrap().contains("MUON_LOG='verbose'"));
        assert!(Level::Error < Level::Debug, "a threshold shows the more severe levels");
    }
}

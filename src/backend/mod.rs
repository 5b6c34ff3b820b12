//! Backends execute the schedule's operations; they make no decisions of their own.

pub mod cuda;
pub mod host;

//! placeholder crate docs (rewritten with the C API)
pub mod config;
pub mod error;
pub mod model;
pub mod numerics;
pub mod plan;

//! The only `extern "C"` layer. Every export runs inside [`boundary`]: errors become a
//! `muon_status_t` plus a thread-local message, panics are caught and never unwind into C.

pub mod boundary;
pub mod comm;
pub mod config;
pub mod constants;
pub mod handle;
pub mod iteration;
pub mod optimizer;
pub mod param;
pub mod status;
pub mod version;

#[cfg(test)]
mod tests;

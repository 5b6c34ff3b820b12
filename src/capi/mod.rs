//! The only `extern "C"` layer. Every export runs inside [`boundary`]: errors become a
//! `muon_status_t` plus a thread-local message, panics are caught and never unwind into C.
//!
//! The safety contract of every export is its C documentation (which pointers may be NULL,
//! how many elements they hold, how long they must live), so the Rust `# Safety` sections
//! would only repeat it. `#[must_use]` sits on each status-returning export, although the
//! status type is already `#[must_use]`, because cbindgen turns it into MUON_NODISCARD.
//! The exports' comments use Doxygen's `@param[in]` / `@param[out]` tags (cbindgen copies them
//! into the header), which rustdoc would read as intra-doc links.
#![allow(clippy::missing_safety_doc, clippy::double_must_use, rustdoc::broken_intra_doc_links)]

pub mod boundary;
pub mod checkpoint;
pub mod comm;
pub mod config;
pub mod constants;
pub mod handle;
pub mod iteration;
pub mod mxfp8;
pub mod optimizer;
pub mod param;
pub mod qk_clip;
pub mod status;
pub mod version;

#[cfg(test)]
mod tests;

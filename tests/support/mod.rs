//! Helpers shared by the integration tests: each test file declares `mod support;` and uses
//! what it needs.

// Each test file is its own crate and uses only a subset of these helpers.
#![allow(dead_code)]

pub mod capi;
pub mod checkpoint;
pub mod cuda;
pub mod docs;
pub mod golden;
pub mod mxfp8;
pub mod numerics;
pub mod qk_clip;
pub mod ranks;
pub mod rng;
pub mod tempdir;
pub mod training;

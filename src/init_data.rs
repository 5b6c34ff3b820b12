//! A param's initial values, held from registration until finalize has written them into the
//! param storage and the masters — in the dtype the caller gave them, never converted.

use crate::backend::cuda::init_copy::DeviceInit;
use crate::backend::ops::{InitAt, InitValues};
use crate::config::Dtype;

/// Initial values of one param.
#[derive(Debug)]
pub enum InitData {
    /// A host copy (the host backend, whose buffers are host memory too).
    Host { dtype: Dtype, bytes: Vec<u8> },
    /// A device copy (the cuda backend).
    Device { dtype: Dtype, numel: u64, copy: DeviceInit },
}

impl InitData {
    /// A host copy of f32 values.
    pub fn from_f32(values: &[f32]) -> InitData {
        InitData::Host {
            dtype: Dtype::F32,
            bytes: values.iter().flat_map(|v| v.to_ne_bytes()).collect(),
        }
    }

    pub fn numel(&self) -> u64 {
        match self {
            InitData::Host { dtype, bytes } => (bytes.len() / dtype.size()) as u64,
            InitData::Device { numel, .. } => *numel,
        }
    }

    /// The values, for [`crate::backend::Backend::attach_init`].
    pub fn values(&self) -> InitValues<'_> {
        match self {
            InitData::Host { dtype, bytes } => InitValues {
                dtype: *dtype,
                numel: self.numel(),
                at: InitAt::Host(bytes),
            },
            InitData::Device { dtype, numel, copy } => InitValues {
                dtype: *dtype,
                numel: *numel,
                at: InitAt::Device(copy.address()),
            },
        }
    }
}

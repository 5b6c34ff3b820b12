//! The CUDA backend: the caller's stream and NCCL communicator, NVRTC-compiled kernels.

pub mod nccl;
pub mod nvrtc;
pub mod probe;

//! The host backend's primitives: an in-process communicator for a group of ranks running on
//! threads ([`comm`]) and host streams and events that order work as CUDA streams and events
//! do ([`stream`]).
//!
//! Per rank, the **compute stream** is the calling thread (its work has already run when the
//! call returns) and the **comm stream** is a [`stream::HostStream`] whose worker thread runs
//! queued closures, typically collectives of a [`comm::HostComm`], in FIFO order.

pub mod comm;
pub mod executor;
pub mod stream;

//! Collectives: the data-parallel buckets' NCCL calls, the exchanges of one value per rank,
//! and the tensor-parallel calls of Newton–Schulz with the translation's own events around them.

use super::memory::Resolved;
use super::{RECEIVE_SLOTS, SEND_SLOT, Translator};
use crate::backend::cuda::action::{Action, DevPtr, NcclCall, NcclComm, NcclType};
use crate::backend::ops::{CollOp, EventId, StreamKind};
use crate::bail;
use crate::config::Dtype;
use crate::error::Result;

/// The translation's own events around a tensor-parallel collective (the schedule numbers its
/// events from 0 up): its input is ready on the compute stream, its result on the comm stream.
pub(super) const TP_INPUT_READY: EventId = EventId(usize::MAX - 1);
pub(super) const TP_RESULT_READY: EventId = EventId(usize::MAX);

/// `call` on the tensor-parallel communicator, after the compute stream's work so far and
/// before any later compute (the translation's own two events).
pub(super) fn on_tp_comm(actions: &mut Vec<Action>, call: NcclCall) {
    actions.extend([
        Action::Record {
            stream: StreamKind::Compute,
            event: TP_INPUT_READY,
        },
        Action::Wait {
            stream: StreamKind::Comm,
            event: TP_INPUT_READY,
        },
        Action::Nccl(NcclComm::Tensor, vec![call]),
        Action::Record {
            stream: StreamKind::Comm,
            event: TP_RESULT_READY,
        },
        Action::Wait {
            stream: StreamKind::Compute,
            event: TP_RESULT_READY,
        },
    ]);
}

/// An in-place sum of `count` values at `ptr` over the group.
pub(super) fn all_reduce(ptr: DevPtr, count: u64, dtype: NcclType) -> NcclCall {
    NcclCall::AllReduce {
        send: ptr,
        recv: ptr,
        count,
        dtype,
    }
}

impl Translator {
    /// Every rank of the tensor-parallel group's `value` (a host-synchronizing exchange on the
    /// TP communicator, for the agreement at finalize).
    pub fn tp_exchange(&self, value: u64) -> Result<Vec<Action>> {
        self.exchange_on(NcclComm::Tensor, self.tp_ranks(), value.to_le_bytes())
    }

    /// The all-gather of `value` over the norm group (finalize's agreement).
    pub fn norm_exchange(&self, value: u64) -> Result<Vec<Action>> {
        self.exchange_on(NcclComm::Norm, self.norm_ranks(), value.to_le_bytes())
    }

    pub(super) fn exchange(&self, value: [u8; 8]) -> Result<Vec<Action>> {
        self.exchange_on(NcclComm::Data, self.dp, value)
    }

    /// The all-gather of one 8-byte value per rank of `comm` (`ranks` ranks): the value goes
    /// to the send slot, the ranks' values come back in rank order (`ranks · 8` bytes, the
    /// result of the actions).
    pub(super) fn exchange_on(&self, comm: NcclComm, ranks: usize, value: [u8; 8]) -> Result<Vec<Action>> {
        let (send, recv) = (self.slot(SEND_SLOT)?, self.slot(RECEIVE_SLOTS)?);
        Ok(vec![
            Action::CopyIn {
                dst: send,
                bytes: value.to_vec(),
                stream: StreamKind::Comm,
            },
            Action::Nccl(
                comm,
                vec![NcclCall::AllGather {
                    send,
                    recv,
                    send_count: 8,
                    dtype: NcclType::U8,
                }],
            ),
            Action::CopyOut {
                src: recv,
                bytes: 8 * ranks as u64,
                stream: StreamKind::Comm,
            },
        ])
    }

    pub(super) fn collective(&self, op: &CollOp) -> Result<NcclCall> {
        let nccl_type = |r: &Resolved| match r.dtype {
            Dtype::F32 => NcclType::F32,
            Dtype::Bf16 => NcclType::Bf16,
        };
        let chunk_of = |r: &Resolved| {
            if !r.len.is_multiple_of(self.dp as u64) {
                bail!(
                    Internal,
                    "{op:?}: {} elements do not split into {} equal chunks",
                    r.len,
                    self.dp
                );
            }
            Ok(r.len / self.dp as u64)
        };
        Ok(match *op {
            CollOp::Reduce { root, span } => {
                let r = self.resolve(span)?;
                NcclCall::Reduce {
                    send: r.ptr,
                    recv: r.ptr,
                    count: r.len,
                    dtype: nccl_type(&r),
                    root,
                }
            }
            CollOp::Broadcast { root, span } => {
                let r = self.resolve(span)?;
                NcclCall::Broadcast {
                    send: r.ptr,
                    recv: r.ptr,
                    count: r.len,
                    dtype: nccl_type(&r),
                    root,
                }
            }
            CollOp::ReduceScatter { span } => {
                let r = self.resolve(span)?;
                let chunk = chunk_of(&r)?;
                NcclCall::ReduceScatter {
                    send: r.ptr,
                    recv: r.at(self.rank as u64 * chunk),
                    recv_count: chunk,
                    dtype: nccl_type(&r),
                }
            }
            CollOp::AllGather { span } => {
                let r = self.resolve(span)?;
                let chunk = chunk_of(&r)?;
                NcclCall::AllGather {
                    send: r.at(self.rank as u64 * chunk),
                    recv: r.ptr,
                    send_count: chunk,
                    dtype: nccl_type(&r),
                }
            }
            CollOp::AllReduce { span } => {
                let r = self.resolve(span)?;
                NcclCall::AllReduce {
                    send: r.ptr,
                    recv: r.ptr,
                    count: r.len,
                    dtype: nccl_type(&r),
                }
            }
        })
    }
}

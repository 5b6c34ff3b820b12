//! Sharded params (`param_sharding = sharded`) in the simulator, until the schedule issues
//! them itself: the gathers a framework triggers around its layers, priced with the cost
//! model's collectives and issued on the optimizer's comm stream, ordered against the modelled
//! forward and backward on the compute stream by events (docs/simulate.md, "Sharded params").
//!
//! Per iteration, with buckets in forward order and a window of `param_prefetch_buckets`:
//! - **forward gather** of each bucket: the collective that brings a bucket's params from
//!   their owners today (an all-gather of an equal-shard bucket, a broadcast from each owner of
//!   an owner-range bucket). The first `window + 1` buckets in forward order are gathered by
//!   the step, as replicated params are — each bucket's collective right after its update, so
//!   it overlaps the Newton–Schulz of later buckets — into the working set the next forward
//!   starts with (the schedule's own collectives, priced as they are); the step's collectives
//!   of the other buckets are priced at zero, and each of those buckets is gathered in the
//!   forward once the bucket `window + 1` places before it has been released (its last
//!   forward use done), so at most `window + 1` buckets are gathered. The forward waits for a
//!   gather before the bucket's first use.
//! - **backward re-gather** (`reshard_after_forward`): the same collective again, in reverse
//!   forward order under the same window, waited for before the bucket's first backward use —
//!   but for the forward's last bucket, the backward's first, which stays gathered (as FSDP2
//!   keeps its root module's params, "since its parameters would typically be immediately
//!   all-gathered for backward": PyTorch 2.5 `fully_shard`, `reshard_after_forward`);
//!   without resharding the forward's buckets stay gathered and the backward gathers nothing.
//!
//! The gradients' collectives are the schedule's own (reduced to the owners, as replicated).

use crate::backend::cuda::action::{Action, NcclCall, NcclComm, NcclType};
use crate::backend::ops::{EventId, StreamKind};
use crate::config::{Config, Dtype};
use crate::plan::{BucketSplit, Plan, forward_order};

/// First event id of the gathers' events, far above the translator's.
const FIRST_EVENT: usize = 1 << 40;

/// The phase a gather serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Forward,
    Backward,
}

/// One item the gathers add to a rank's program: an action to price and record, and the
/// bucket it is for (the label's call).
pub(crate) type Issue = (u32, Action);

/// The gathers of one optimizer of a simulated rank (module docs).
pub(crate) struct Gathers {
    /// Buckets in forward order, each one's gather calls, and its first and last param.
    order: Vec<u32>,
    calls: Vec<Vec<NcclCall>>,
    first_param: Vec<usize>,
    last_param: Vec<usize>,
    /// The position in `order` of each bucket.
    position: Vec<usize>,
    /// Positions in backward order: by first backward use (last param), latest first.
    backward: Vec<usize>,
    window: usize,
    reshard: bool,
    /// Per phase: gathers issued, and buckets released (by position).
    issued: [usize; 2],
    released: [Vec<bool>; 2],
}

fn nccl_type(dtype: Dtype) -> NcclType {
    match dtype {
        Dtype::F32 => NcclType::F32,
        Dtype::Bf16 => NcclType::Bf16,
    }
}

impl Gathers {
    /// The gathers of `plan` under `cfg`, or `None` when params are replicated.
    pub(crate) fn new(plan: &Plan, cfg: &Config) -> Option<Self> {
        if !cfg.sharded() {
            return None;
        }
        let order: Vec<u32> = forward_order(&plan.buckets).into_iter().map(|b| b as u32).collect();
        let mut position = vec![0; plan.buckets.len()];
        let mut calls = Vec::with_capacity(order.len());
        let (mut first_param, mut last_param) = (Vec::new(), Vec::new());
        for (i, &b) in order.iter().enumerate() {
            let bucket = &plan.buckets[b as usize];
            position[b as usize] = i;
            let dtype = nccl_type(bucket.dtype);
            calls.push(match &bucket.split {
                BucketSplit::EqualShards { shard_size } => vec![NcclCall::AllGather {
                    send: 0,
                    recv: 0,
                    send_count: *shard_size,
                    dtype,
                }],
                BucketSplit::OwnerRanges(ranges) => ranges
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| !r.is_empty())
                    .map(|(root, r)| NcclCall::Broadcast {
                        send: 0,
                        recv: 0,
                        count: r.len(),
                        dtype,
                        root: root as u32,
                    })
                    .collect(),
            });
            first_param.push(bucket.params.iter().copied().min().unwrap_or(0) as usize);
            last_param.push(bucket.params.iter().copied().max().unwrap_or(0) as usize);
        }
        let n = order.len();
        let mut backward: Vec<usize> = (0..n).collect();
        backward.sort_by_key(|&i| std::cmp::Reverse((last_param[i], i)));
        Some(Gathers {
            backward,
            order,
            calls,
            first_param,
            last_param,
            position,
            window: cfg.param_prefetch_buckets as usize,
            reshard: cfg.reshard_after_forward,
            issued: [0, 0],
            released: [vec![false; n], vec![false; n]],
        })
    }

    fn event(&self, phase: Phase, position: usize, released: bool) -> EventId {
        EventId(FIRST_EVENT + 4 * position + 2 * (phase as usize) + released as usize)
    }

    /// The position of the `k`-th bucket of `phase` (in the backward, by first backward use: a
    /// bucket spanning layers, such as AdamW's of the embedding and every norm, is needed from
    /// the backward's start).
    fn at(&self, phase: Phase, k: usize) -> usize {
        match phase {
            Phase::Forward => k,
            Phase::Backward => self.backward[k],
        }
    }

    /// The buckets the step gathers for the next forward (module docs).
    pub(crate) fn prefetched_at_step(&self) -> usize {
        (self.window + 1).min(self.order.len())
    }

    /// The buckets the backward finds still gathered: the forward's last.
    fn kept_for_backward(&self) -> usize {
        self.order.len().min(1)
    }

    /// An iteration begins: the step before it gathered the first buckets of the forward
    /// (the first iteration's come from the initial values), nothing is released.
    pub(crate) fn start_iteration(&mut self) {
        self.issued = [self.prefetched_at_step(), self.kept_for_backward()];
        for released in &mut self.released {
            released.iter_mut().for_each(|r| *r = false);
        }
    }

    /// The gathers of `phase` the window allows now, through the `through`-th at least: each
    /// waits on the comm stream for the release of the bucket `window + 1` before it.
    pub(crate) fn issue(&mut self, phase: Phase, through: Option<usize>, out: &mut Vec<Issue>) {
        if phase == Phase::Backward && !self.reshard {
            return;
        }
        let p = phase as usize;
        while self.issued[p] < self.order.len() {
            let k = self.issued[p];
            let freed = k <= self.window || self.released[p][self.at(phase, k - self.window - 1)];
            if !freed && through.is_none_or(|t| k > t) {
                break;
            }
            let position = self.at(phase, k);
            let bucket = self.order[position];
            if k > self.window {
                let event = self.event(phase, self.at(phase, k - self.window - 1), true);
                out.push((
                    bucket,
                    Action::Wait {
                        stream: StreamKind::Comm,
                        event,
                    },
                ));
            }
            out.push((bucket, Action::Nccl(NcclComm::Data, self.calls[position].clone())));
            let event = self.event(phase, position, false);
            out.push((
                bucket,
                Action::Record {
                    stream: StreamKind::Comm,
                    event,
                },
            ));
            self.issued[p] += 1;
        }
    }

    /// Before the compute of `param` in `phase`: at its bucket's first use, the gather (issued
    /// now if the window has not yet) and the compute stream's wait for it.
    pub(crate) fn before(&mut self, phase: Phase, param: usize, bucket: u32, out: &mut Vec<Issue>) {
        if phase == Phase::Backward && !self.reshard {
            return;
        }
        let position = self.position[bucket as usize];
        let first_use = match phase {
            Phase::Forward => self.first_param[position],
            Phase::Backward => self.last_param[position],
        };
        if param != first_use {
            return;
        }
        let k = match phase {
            Phase::Forward => position,
            Phase::Backward => self.backward.iter().position(|&p| p == position).unwrap_or(0),
        };
        let gathered = match phase {
            // Gathered by the step: the schedule's own wait_params waits for it.
            Phase::Forward => self.prefetched_at_step(),
            Phase::Backward => self.kept_for_backward(),
        };
        if k < gathered {
            return;
        }
        self.issue(phase, Some(k), out);
        let event = self.event(phase, position, false);
        out.push((
            bucket,
            Action::Wait {
                stream: StreamKind::Compute,
                event,
            },
        ));
    }

    /// After the compute of `param` in `phase`: at its bucket's last use, the release (an event
    /// on the compute stream) and the gathers it lets in.
    pub(crate) fn after(&mut self, phase: Phase, param: usize, bucket: u32, out: &mut Vec<Issue>) {
        let position = self.position[bucket as usize];
        let last_use = match phase {
            Phase::Forward => self.last_param[position],
            Phase::Backward => self.first_param[position],
        };
        if param != last_use || (phase == Phase::Backward && !self.reshard) {
            return;
        }
        self.released[phase as usize][position] = true;
        let event = self.event(phase, position, true);
        out.push((
            bucket,
            Action::Record {
                stream: StreamKind::Compute,
                event,
            },
        ));
        self.issue(phase, None, out);
    }
}

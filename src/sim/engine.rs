//! The discrete-event engine: per rank a host timeline and in-order streams (compute, and one
//! comm stream per optimizer of the rank) ordered by events exactly as CUDA orders them, and
//! collectives that end a fixed time after the last rank reached them.
//!
//! The host issues its program in order; each item costs host time. Work on a stream starts
//! when the stream finished its previous work, the host has issued it, and every event it
//! waits on has fired. A stream wait refers to the event's latest record *issued before the
//! wait* (`cuStreamWaitEvent` semantics; a never-recorded event is no wait). A host sync stalls
//! the host until its stream is idle. Collectives are matched across ranks by the order each
//! rank issues them (NCCL requires every rank to issue them in one order); a rank whose
//! k-th collective differs from rank 0's is an error the engine reports (on NCCL: a hang).

use std::collections::HashMap;

use crate::backend::ops::{EventId, StreamKind};
use crate::bail;
use crate::error::Result;

/// What a piece of work is, for the figures and the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// The framework's forward compute (modelled).
    Forward,
    /// The framework's backward compute (modelled).
    Backward,
    /// The optimizer's kernels, GEMMs, memsets and copies.
    Optimizer,
    /// A collective group.
    Collective,
    /// Event records and waits (no device time).
    Event,
    /// A copy the host waits for.
    HostCopy,
}

/// Which API call issued an item: the trace names slices by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Call {
    Setup,
    ZeroGrad,
    WaitParams(u32),
    /// `grad_ready` of a param of this bucket.
    GradReady(u32),
    Step,
    Forward,
    Backward,
}

/// A name for an item: the API call and what the action is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Label {
    pub call: Call,
    pub what: &'static str,
}

/// One item of a rank's host program.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// `host` seconds of host time, then `device` seconds of work on `stream`.
    Work {
        stream: StreamKind,
        host: f64,
        device: f64,
        class: Class,
        label: Label,
    },
    /// A collective group on the comm stream; `signature` identifies what it moves, so ranks
    /// issuing different collectives at one position are caught.
    Collective {
        host: f64,
        device: f64,
        signature: u64,
        label: Label,
    },
    Record {
        stream: StreamKind,
        event: EventId,
        host: f64,
        label: Label,
    },
    Wait {
        stream: StreamKind,
        event: EventId,
        host: f64,
        label: Label,
    },
    /// The host waits until `stream` finished everything issued before.
    Sync { stream: StreamKind, label: Label },
    /// An iteration begins.
    IterationStart,
    /// The iterations are over: what follows (teardown) belongs to none.
    Teardown,
    /// What follows is issued by optimizer `k` of the rank (0 until the first `Optimizer`):
    /// its comm-stream work goes to that optimizer's own comm stream and its events are its
    /// own (each optimizer creates its comm stream and events; all share the caller's compute
    /// stream).
    Optimizer(usize),
}

/// One scheduled piece of stream work.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slice {
    pub stream: StreamKind,
    pub class: Class,
    pub label: Label,
    pub start: f64,
    pub end: f64,
    /// How long it waited, beyond its stream and the host, for an event or for other ranks.
    pub waited: f64,
    /// Index of the iteration it was issued in (setup = None).
    pub iteration: Option<usize>,
}

/// The timeline of one rank.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    pub slices: Vec<Slice>,
    /// Host time at which each iteration began.
    pub iteration_starts: Vec<f64>,
    /// Per iteration: host syncs, and host time spent stalled in them.
    pub host_syncs: Vec<u64>,
    pub host_stall: Vec<f64>,
    /// When the host finished its program.
    pub host_end: f64,
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Busy(f64),
    Collective(usize),
}

#[derive(Debug, Clone)]
struct Node {
    stream: usize,
    kind: Kind,
    class: Class,
    label: Label,
    iteration: Option<usize>,
    issue: f64,
    prev: Option<usize>,
    dep: Option<usize>,
    end: Option<f64>,
    start: f64,
    waited: f64,
}

/// Streams of a rank: the compute stream, then the comm stream of each optimizer.
const STREAMS: usize = 1 + MAX_OPTIMIZERS;

/// Optimizers a rank may run ([`Item::Optimizer`]).
pub const MAX_OPTIMIZERS: usize = 2;

struct Rank {
    program: Vec<Item>,
    cursor: usize,
    host: f64,
    blocked_on: Option<usize>,
    nodes: Vec<Node>,
    tail: [Option<usize>; STREAMS],
    /// Unresolved nodes per stream, in order.
    queue: [std::collections::VecDeque<usize>; STREAMS],
    /// The optimizer issuing the items, and each optimizer's events.
    optimizer: usize,
    events: HashMap<(usize, EventId), usize>,
    collectives: usize,
    iteration: Option<usize>,
    timeline: Timeline,
}

struct Collective {
    signature: u64,
    device: f64,
    ready: Vec<Option<f64>>,
    arrived: usize,
    end: Option<f64>,
}

/// The stream `s` of optimizer `optimizer`.
fn stream_index(s: StreamKind, optimizer: usize) -> usize {
    match s {
        StreamKind::Compute => 0,
        StreamKind::Comm => 1 + optimizer,
    }
}

fn stream_kind(i: usize) -> StreamKind {
    if i == 0 { StreamKind::Compute } else { StreamKind::Comm }
}

impl Rank {
    fn new(program: Vec<Item>) -> Self {
        Rank {
            program,
            cursor: 0,
            host: 0.0,
            blocked_on: None,
            nodes: Vec::new(),
            tail: [None; STREAMS],
            queue: Default::default(),
            optimizer: 0,
            events: HashMap::new(),
            collectives: 0,
            iteration: None,
            timeline: Timeline::default(),
        }
    }

    fn push(&mut self, stream: usize, kind: Kind, class: Class, label: Label, dep: Option<usize>) -> usize {
        let index = self.nodes.len();
        self.nodes.push(Node {
            stream,
            kind,
            class,
            label,
            iteration: self.iteration,
            issue: self.host,
            prev: self.tail[stream],
            dep,
            end: None,
            start: 0.0,
            waited: 0.0,
        });
        self.tail[stream] = Some(index);
        self.queue[stream].push_back(index);
        index
    }

    fn end_of(&self, node: Option<usize>) -> Option<f64> {
        match node {
            None => Some(0.0),
            Some(n) => self.nodes[n].end,
        }
    }

    fn done(&self) -> bool {
        self.cursor == self.program.len() && self.blocked_on.is_none() && self.queue.iter().all(|q| q.is_empty())
    }
}

/// Runs every rank's program; returns their timelines.
pub fn run(programs: Vec<Vec<Item>>) -> Result<Vec<Timeline>> {
    let dp = programs.len();
    let mut ranks: Vec<Rank> = programs.into_iter().map(Rank::new).collect();
    let mut collectives: Vec<Collective> = Vec::new();
    loop {
        let mut progress = false;
        for (r, rank) in ranks.iter_mut().enumerate() {
            progress |= issue(rank, r, dp, &mut collectives)?;
            progress |= resolve(rank, r, &mut collectives);
        }
        if ranks.iter().all(Rank::done) {
            break;
        }
        if !progress {
            let stuck: Vec<String> = ranks
                .iter()
                .enumerate()
                .filter(|(_, r)| !r.done())
                .map(|(i, r)| format!("rank {i} at collective {}", r.collectives))
                .take(4)
                .collect();
            bail!(
                Internal,
                "simulate: the ranks wait on each other forever ({}); they issue different numbers of collectives",
                stuck.join(", ")
            );
        }
    }
    Ok(ranks
        .into_iter()
        .map(|mut r| {
            r.timeline.host_end = r.host;
            r.timeline.slices = r
                .nodes
                .iter()
                .map(|n| Slice {
                    stream: stream_kind(n.stream),
                    class: n.class,
                    label: n.label,
                    start: n.start,
                    end: n.end.unwrap_or(n.start),
                    waited: n.waited,
                    iteration: n.iteration,
                })
                .collect();
            r.timeline
        })
        .collect())
}

/// Issues rank `r`'s program until it blocks on unfinished work or ends.
fn issue(rank: &mut Rank, r: usize, dp: usize, collectives: &mut Vec<Collective>) -> Result<bool> {
    let mut progress = false;
    loop {
        if let Some(node) = rank.blocked_on {
            let Some(end) = rank.nodes[node].end else {
                return Ok(progress);
            };
            if end > rank.host {
                if let Some(i) = rank.iteration {
                    rank.timeline.host_stall[i] += end - rank.host;
                }
                rank.host = end;
            }
            rank.blocked_on = None;
            progress = true;
        }
        let Some(item) = rank.program.get(rank.cursor).cloned() else {
            return Ok(progress);
        };
        rank.cursor += 1;
        progress = true;
        match item {
            Item::Work {
                stream,
                host,
                device,
                class,
                label,
            } => {
                rank.host += host;
                rank.push(
                    stream_index(stream, rank.optimizer),
                    Kind::Busy(device),
                    class,
                    label,
                    None,
                );
            }
            Item::Collective {
                host,
                device,
                signature,
                label,
            } => {
                rank.host += host;
                let k = rank.collectives;
                rank.collectives += 1;
                if k == collectives.len() {
                    collectives.push(Collective {
                        signature,
                        device,
                        ready: vec![None; dp],
                        arrived: 0,
                        end: None,
                    });
                } else if collectives[k].signature != signature {
                    bail!(
                        Internal,
                        "simulate: rank {r} issues a different collective than another rank at position {k} ({:?}); on NCCL the ranks would hang or mix data",
                        label.call
                    );
                }
                collectives[k].device = collectives[k].device.max(device);
                rank.push(1 + rank.optimizer, Kind::Collective(k), Class::Collective, label, None);
            }
            Item::Record {
                stream,
                event,
                host,
                label,
            } => {
                rank.host += host;
                let node = rank.push(
                    stream_index(stream, rank.optimizer),
                    Kind::Busy(0.0),
                    Class::Event,
                    label,
                    None,
                );
                rank.events.insert((rank.optimizer, event), node);
            }
            Item::Wait {
                stream,
                event,
                host,
                label,
            } => {
                rank.host += host;
                let dep = rank.events.get(&(rank.optimizer, event)).copied();
                rank.push(
                    stream_index(stream, rank.optimizer),
                    Kind::Busy(0.0),
                    Class::Event,
                    label,
                    dep,
                );
            }
            Item::Sync { stream, .. } => {
                if let Some(i) = rank.iteration {
                    rank.timeline.host_syncs[i] += 1;
                }
                rank.blocked_on = rank.tail[stream_index(stream, rank.optimizer)];
            }
            Item::IterationStart => {
                let i = rank.iteration.map_or(0, |i| i + 1);
                rank.iteration = Some(i);
                rank.timeline.iteration_starts.push(rank.host);
                rank.timeline.host_syncs.push(0);
                rank.timeline.host_stall.push(0.0);
            }
            Item::Teardown => rank.iteration = None,
            Item::Optimizer(k) => {
                if k >= MAX_OPTIMIZERS {
                    bail!(
                        Internal,
                        "simulate: rank {r} issues for optimizer {k}; a rank runs at most {MAX_OPTIMIZERS}"
                    );
                }
                rank.optimizer = k;
            }
        }
    }
}

/// Gives every node of rank `r` whose predecessors are known its start and end.
fn resolve(rank: &mut Rank, r: usize, collectives: &mut [Collective]) -> bool {
    let mut progress = false;
    loop {
        let mut moved = false;
        for s in 0..STREAMS {
            while let Some(&n) = rank.queue[s].front() {
                let node = &rank.nodes[n];
                let (Some(prev), Some(dep)) = (rank.end_of(node.prev), rank.end_of(node.dep)) else {
                    break;
                };
                let available = node.issue.max(prev);
                let ready = available.max(dep);
                let (start, end) = match node.kind {
                    Kind::Busy(d) => (ready, ready + d),
                    Kind::Collective(k) => {
                        let c = &mut collectives[k];
                        if c.ready[r].is_none() {
                            c.ready[r] = Some(ready);
                            c.arrived += 1;
                        }
                        if c.end.is_none() && c.arrived == c.ready.len() {
                            let last = c.ready.iter().flatten().fold(0.0f64, |a, &b| a.max(b));
                            c.end = Some(last + c.device);
                        }
                        match c.end {
                            Some(end) => (end - c.device, end),
                            None => break,
                        }
                    }
                };
                let node = &mut rank.nodes[n];
                node.start = start;
                node.end = Some(end);
                node.waited = start - available;
                rank.queue[s].pop_front();
                moved = true;
            }
        }
        if !moved {
            return progress;
        }
        progress = true;
    }
}

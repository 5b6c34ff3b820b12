//! The step's gradient norm and scalars: the exact sum of squares of the gradients and the f64
//! ones of the Newton–Schulz inputs (`kernels/reduce.cu`), and the clip and skip decision
//! (`kernels/step.cu`).

use super::memory::Resolved;
use super::{NORM_SUM_SLOT, RECEIVE_SLOTS, THREADS, Translator, launch, to_u32};
use crate::backend::cuda::action::{Action, Arg, DevPtr, Kernel, Launch, Work};
use crate::backend::ops::{MAX_NORM_TERMS, NormSums, NormTerm, Scalar, Span, StepConstants, StreamKind};
use crate::bail;
use crate::error::Result;
use crate::numerics::mean_scale;
use crate::numerics::square_sum::SQUARE_SUM_WORDS;

/// Spans (or groups) per sum-of-squares launch: the fixed arrays of `kernels/reduce.cu`.
pub(super) const SUMSQ_SPANS: usize = 32;

/// Elements per block of a sum-of-squares span before it gets another block.
pub(super) const SUMSQ_BLOCK_ELEMS: u64 = 4096;

/// Most blocks per span (so one launch writes at most `SUMSQ_SPANS * SUMSQ_MAX_BLOCKS` partials).
pub(super) const SUMSQ_MAX_BLOCKS: u64 = 2048;

/// Capacity of the partials workspace.
pub(super) const PARTIALS: u64 = SUMSQ_SPANS as u64 * SUMSQ_MAX_BLOCKS;

/// The words of `struct muon_sumsq_spans` (`kernels/reduce.cu`): per span the pointer, the
/// length, then `is_bf16 | check_only << 1 | first_block << 32`; then the count.
pub(super) fn sumsq_spans(spans: &[(SumSpan, u32)]) -> Vec<u64> {
    let mut words = vec![0u64; SUMSQ_SPANS * 3 + 1];
    for (i, (s, first_block)) in spans.iter().enumerate() {
        words[3 * i] = s.span.ptr;
        words[3 * i + 1] = s.span.len;
        let flags = s.span.is_bf16() as u64 | (u64::from(s.check_only) << 1);
        words[3 * i + 2] = flags | (u64::from(*first_block) << 32);
    }
    words[SUMSQ_SPANS * 3] = spans.len() as u64;
    words
}

/// One group of `struct muon_sumsq_groups`: partials `[first, first + count)` into `out`.
#[derive(Clone, Copy)]
pub(super) struct Group {
    pub(super) first: u32,
    pub(super) count: u32,
    pub(super) out: u32,
}

/// The words of `struct muon_sumsq_groups`.
pub(super) fn sumsq_groups(groups: &[Group]) -> Vec<u64> {
    let mut words = vec![0u64; SUMSQ_SPANS * 2 + 1];
    for (i, g) in groups.iter().enumerate() {
        words[2 * i] = u64::from(g.first) | (u64::from(g.count) << 32);
        words[2 * i + 1] = u64::from(g.out);
    }
    words[SUMSQ_SPANS * 2] = groups.len() as u64;
    words
}

/// One span of a sum of squares; a `check_only` span of the gradient norm adds no squares, only
/// its non-finite values (`muon_norm_partials`).
#[derive(Clone, Copy)]
pub(super) struct SumSpan {
    pub(super) span: Resolved,
    pub(super) check_only: bool,
}

/// Blocks of one span of a sum-of-squares launch.
pub(super) fn sumsq_blocks(len: u64) -> u32 {
    len.div_ceil(SUMSQ_BLOCK_ELEMS).clamp(1, SUMSQ_MAX_BLOCKS) as u32
}

impl Translator {
    /// f64 sums of squares of the non-empty `spans` (the Newton–Schulz inputs): one partials
    /// launch and one finish launch per 32 spans, span i's sum into `out[i]`.
    pub(super) fn sumsq(&self, actions: &mut Vec<Action>, spans: &[SumSpan], out: DevPtr) -> Result<()> {
        let partials = self.work(Work::Partials)?;
        for (c, chunk) in spans.chunks(SUMSQ_SPANS).enumerate() {
            let mut first = 0u32;
            let mut described = Vec::with_capacity(chunk.len());
            let mut groups = Vec::with_capacity(chunk.len());
            for (i, span) in chunk.iter().enumerate() {
                let blocks = sumsq_blocks(span.span.len);
                described.push((*span, first));
                groups.push(Group {
                    first,
                    count: blocks,
                    out: i as u32,
                });
                first += blocks;
            }
            actions.push(Action::Launch(Launch {
                kernel: Kernel::SumsqPartials,
                grid: [first, 1, 1],
                block: [THREADS, 1, 1],
                stream: StreamKind::Compute,
                args: vec![Arg::Words(sumsq_spans(&described)), Arg::Ptr(partials)],
            }));
            actions.push(Action::Launch(Launch {
                kernel: Kernel::SumsqFinish,
                grid: [groups.len() as u32, 1, 1],
                block: [THREADS, 1, 1],
                stream: StreamKind::Compute,
                args: vec![
                    Arg::Words(sumsq_groups(&groups)),
                    Arg::Ptr(partials),
                    Arg::Ptr(out + (c * SUMSQ_SPANS) as u64 * 8),
                ],
            }));
        }
        Ok(())
    }

    /// This rank's exact Σ (g/dp)² over `counted` and the non-finite counts of `counted` and
    /// `checked`: the sum zeroed, then one `muon_norm_partials` launch per 32 spans adding to it;
    /// then the steps taken, copied beside it (`numerics::RankNorm`).
    pub(super) fn squared_norm(&self, counted: &[Span], checked: &[Span]) -> Result<Vec<Action>> {
        let mark = |check_only: bool| {
            move |s: &Span| -> Result<SumSpan> {
                Ok(SumSpan {
                    span: self.resolve(*s)?,
                    check_only,
                })
            }
        };
        let resolved = counted
            .iter()
            .map(mark(false))
            .chain(checked.iter().map(mark(true)))
            .filter(|r| !matches!(r, Ok(r) if r.span.len == 0))
            .collect::<Result<Vec<_>>>()?;
        let sum = self.slot(NORM_SUM_SLOT)?;
        let mut actions = vec![Action::Zero {
            dst: sum,
            bytes: SQUARE_SUM_WORDS as u64 * 8,
            stream: StreamKind::Compute,
        }];
        for chunk in resolved.chunks(SUMSQ_SPANS) {
            let mut first = 0u32;
            let mut described = Vec::with_capacity(chunk.len());
            for span in chunk {
                described.push((*span, first));
                first += sumsq_blocks(span.span.len);
            }
            actions.push(Action::Launch(Launch {
                kernel: Kernel::NormPartials,
                grid: [first, 1, 1],
                block: [THREADS, 1, 1],
                stream: StreamKind::Compute,
                args: vec![
                    Arg::Words(sumsq_spans(&described)),
                    Arg::F32(mean_scale(self.dp)),
                    Arg::Ptr(sum),
                ],
            }));
        }
        actions.push(Action::CopyDevice {
            dst: sum + SQUARE_SUM_WORDS as u64 * 8,
            src: self.scalar(Scalar::Step)?,
            bytes: 8,
            stream: StreamKind::Compute,
        });
        Ok(actions)
    }

    /// One block derives the step's scalars from the gathered sums of every term
    /// (`numerics::step_scalars`); another backend's sums are read where they are.
    pub(super) fn finish_step(&self, constants: &StepConstants, terms: &[NormTerm]) -> Result<Vec<Action>> {
        Ok(vec![launch(
            Kernel::StepScalars,
            1,
            StreamKind::Compute,
            vec![
                Arg::Ptr(self.slot(0)?),
                Arg::Words(self.norm_terms(terms)?),
                Arg::U32(to_u32("dp", self.dp as u64)?),
                Arg::F32(constants.clip_grad),
            ],
        )])
    }

    /// The words of `struct muon_norm_terms` (`kernels/step.cu`): the sums' addresses, then
    /// the ranks of each term as u32 pairs, then the count.
    pub(super) fn norm_terms(&self, terms: &[NormTerm]) -> Result<Vec<u64>> {
        if terms.is_empty() || terms.len() > MAX_NORM_TERMS {
            bail!(
                InvalidArgument,
                "step: {} optimizers share the clip; 1 to {MAX_NORM_TERMS} can",
                terms.len()
            );
        }
        let pairs = MAX_NORM_TERMS / 2;
        let mut words = vec![0u64; MAX_NORM_TERMS + pairs + 1];
        for (i, term) in terms.iter().enumerate() {
            words[i] = match term.sums {
                NormSums::Own => self.slot(RECEIVE_SLOTS)?,
                NormSums::Device(address) => address,
                NormSums::Host(_) => bail!(
                    CommMismatch,
                    "step: a cuda optimizer cannot share a clip with a host optimizer's norm"
                ),
            };
            let shift = 32 * (i % 2) as u32;
            words[MAX_NORM_TERMS + i / 2] |= u64::from(to_u32("norm ranks", term.ranks as u64)?) << shift;
        }
        words[MAX_NORM_TERMS + pairs] = terms.len() as u64;
        Ok(words)
    }
}

//! The cuda backend's translation without a device: every op goes through the
//! [`Translator`] and allocations get virtual addresses. As a [`Recording`] observer beside a
//! real backend it checks, on any machine, that every op of a schedule run has a CUDA
//! implementation and which device actions it becomes.
//!
//! [`Recording`]: crate::backend::recording::Recording

use crate::backend::cuda::action::{Action, DevPtr};
use crate::backend::cuda::translate::Translator;
use crate::backend::ops::Op;
use crate::backend::recording::Observer;
use crate::error::Result;
use crate::numerics::muon::MuonOptions;

/// First virtual address; allocations are 512-byte aligned like `cuMemAlloc`'s.
const VIRTUAL_BASE: DevPtr = 1 << 40;
const ALIGN: DevPtr = 512;

/// A virtual device address space: consecutive, aligned, never reused. The dry run and the
/// simulator hand out the same addresses for the same allocation sequence.
#[derive(Debug, Clone, Copy)]
pub struct VirtualMemory {
    next: DevPtr,
}

impl Default for VirtualMemory {
    fn default() -> Self {
        VirtualMemory { next: VIRTUAL_BASE }
    }
}

impl VirtualMemory {
    /// The address of a new allocation of `bytes` (0 for an empty one).
    pub fn alloc(&mut self, bytes: u64) -> DevPtr {
        let ptr = if bytes == 0 { 0 } else { self.next };
        self.next += bytes.next_multiple_of(ALIGN);
        ptr
    }
}

/// What one op became.
#[derive(Debug, Clone, PartialEq)]
pub enum Translated {
    /// A command: its device actions.
    Actions(Vec<Action>),
    /// `Address`: the device address.
    Address(DevPtr),
    /// `Mxfp8Addresses`: the four device addresses, or None when the param has no storage.
    Mxfp8(Option<[DevPtr; 4]>),
}

/// The translator of one rank with a virtual address space.
#[derive(Debug)]
pub struct DryRun {
    translator: Translator,
    memory: VirtualMemory,
    /// Every op received, in order, with its translation.
    pub log: Vec<(Op, Result<Translated>)>,
}

impl DryRun {
    /// Rank `rank` of `dp` with the Muon options of the config; the creation-time allocations
    /// are made as `CudaBackend::new` makes them.
    pub fn new(rank: usize, dp: usize, muon: MuonOptions) -> Self {
        Self::with_translator(Translator::new(rank, dp, muon))
    }

    /// A dry run of `translator` (e.g. one with a norm group).
    pub fn with_translator(translator: Translator) -> Self {
        let mut dry = DryRun {
            translator,
            memory: VirtualMemory::default(),
            log: Vec::new(),
        };
        let setup = dry.translator.setup();
        dry.bind(&setup);
        dry
    }

    /// The ops received, in order.
    pub fn received(&self) -> Vec<Op> {
        self.log.iter().map(|(op, _)| op.clone()).collect()
    }

    fn bind(&mut self, actions: &[Action]) {
        for action in actions {
            if let Action::Alloc { buf, bytes } = *action {
                let ptr = self.memory.alloc(bytes);
                self.translator.bind(buf, ptr, bytes);
            }
        }
    }

    fn translate(&mut self, op: &Op) -> Result<Translated> {
        match op {
            Op::Address(span) => self.translator.address(*span).map(Translated::Address),
            Op::Mxfp8Addresses(param) => Ok(Translated::Mxfp8(self.translator.mxfp8_addresses(*param))),
            command => {
                let actions = self.translator.translate(command)?;
                self.bind(&actions);
                Ok(Translated::Actions(actions))
            }
        }
    }
}

impl Observer for DryRun {
    fn observe(&mut self, op: &Op) {
        let translated = self.translate(op);
        self.log.push((op.clone(), translated));
    }
}

//! Initial values on the cuda backend come as device copies made at registration: finalize
//! reads each param's copy in place — into its param storage (or MXFP8 staging) and the
//! masters it owns (an f32 param's master is its storage: one read) — with device copies and
//! cast kernels, uploads none of the model from the
//! host, and waits for the compute stream before it lets the copy go.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use muon_opt::backend::cuda::action::{Action, Arg, Buf, DevPtr, Kernel};
use muon_opt::backend::cuda::dry_run::VirtualMemory;
use muon_opt::backend::cuda::translate::Translator;
use muon_opt::backend::cuda::{CudaBackend, Executor};
use muon_opt::backend::ops::{InitAt, InitValues, StreamKind};
use muon_opt::config::{Config, Dtype};
use muon_opt::error::Result;
use muon_opt::model::Registry;
use muon_opt::numerics::muon::MuonOptions;
use muon_opt::plan::build_plan;
use muon_opt::schedule::Runtime;
use support::cuda::cuda_model;

/// Far above the virtual addresses of the backend's own allocations.
const INIT_BASE: DevPtr = 1 << 50;

/// Runs nothing: binds virtual addresses and keeps every action.
struct Log(Arc<Mutex<Vec<Action>>>, VirtualMemory);

impl Executor for Log {
    fn run(&mut self, actions: &[Action], bind: &mut dyn FnMut(Buf, DevPtr, u64)) -> Result<Vec<Vec<u8>>> {
        let mut out = Vec::new();
        for action in actions {
            match *action {
                Action::Alloc { buf, bytes } => bind(buf, self.1.alloc(bytes), bytes),
                Action::CopyOut { bytes, .. } => out.push(vec![0u8; bytes as usize]),
                _ => {}
            }
        }
        self.0.lock().unwrap().extend_from_slice(actions);
        Ok(out)
    }
}

/// A device-to-device read of `bytes` at `src`, from a copy or a cast kernel.
fn read_of(action: &Action) -> Option<(DevPtr, u64)> {
    match action {
        Action::CopyDevice { src, bytes, .. } => Some((*src, *bytes)),
        Action::Launch(l) if l.kernel == Kernel::Cast => match (&l.args[0], &l.args[1], &l.args[4]) {
            (Arg::Ptr(src), Arg::I32(bf16), Arg::U64(len)) => Some((*src, len * if *bf16 == 1 { 2 } else { 4 })),
            other => panic!("cast arguments {other:?}"),
        },
        _ => None,
    }
}

#[test]
fn finalize_casts_device_copies_in_place_and_uploads_no_model_bytes() {
    for gather in [false, true] {
        let cfg = Config {
            bucket_size: 4096,
            mxfp8_param_gather: gather,
            ..Config::default()
        };
        let specs = cuda_model();
        let mut registry = Registry::default();
        for spec in &specs {
            registry.add(spec.clone(), &cfg).unwrap();
        }
        let plan = build_plan(registry.params(), registry.routes(), &cfg, 1).unwrap();
        let actions = Arc::new(Mutex::new(Vec::new()));
        let translator = Translator::new(0, 1, MuonOptions::from_config(&cfg));
        let backend = CudaBackend::with_executor(translator, Log(actions.clone(), VirtualMemory::default())).unwrap();
        // bf16 copies, one per param, 1 MiB apart.
        let at = |p: usize| INIT_BASE + (p as u64) * (1 << 20);
        let rt = Runtime::new(Box::new(plan), specs.clone(), cfg.clone(), 0, Box::new(backend), |p| {
            Some(InitValues {
                dtype: Dtype::Bf16,
                numel: specs[p].numel(),
                at: InitAt::Device(at(p)),
            })
        })
        .unwrap();
        // What finalize issued, without the synchronize of the runtime's drop.
        let actions = actions.lock().unwrap().clone();
        drop(rt);
        let uploaded: usize = actions
            .iter()
            .map(|a| match a {
                Action::CopyIn { bytes, .. } | Action::CopyInAsync { bytes, .. } => bytes.len(),
                _ => 0,
            })
            .sum();
        assert_eq!(uploaded, 0, "gather {gather}: finalize uploads nothing from the host");
        let mut reads: HashMap<usize, Vec<(usize, DevPtr, u64)>> = HashMap::new();
        for (i, action) in actions.iter().enumerate() {
            if let Some((src, bytes)) = read_of(action)
                && src >= INIT_BASE
            {
                let p = ((src - INIT_BASE) >> 20) as usize;
                assert!(
                    src + bytes <= at(p) + specs[p].numel() * 2,
                    "read past param {p}'s copy"
                );
                reads.entry(p).or_default().push((i, src - at(p), bytes));
            }
        }
        for (p, spec) in specs.iter().enumerate() {
            let whole = spec.numel() * 2;
            let label = format!("gather {gather}, param {p} ({})", spec.name);
            let mut got = reads.remove(&p).unwrap_or_else(|| panic!("{label}: never read"));
            assert_eq!(
                (got[0].1, got[0].2),
                (0, whole),
                "{label}: first read fills its storage"
            );
            let first = got.remove(0).0;
            if spec.dtype == Dtype::F32 {
                assert!(
                    got.is_empty(),
                    "{label}: an f32 param's master is its storage, read once"
                );
            } else {
                // The masters (dp = 1: this rank owns all of every param) tile the copy.
                got.sort_by_key(|&(_, offset, _)| offset);
                let mut next = 0;
                for &(_, offset, bytes) in &got {
                    assert_eq!(offset, next, "{label}: master reads tile the copy");
                    next += bytes;
                }
                assert_eq!(next, whole, "{label}: master reads cover the copy");
            }
            // Freeable only once the host has waited for the compute stream: finalize itself
            // (not the runtime's drop, left out above) synchronizes after the last read.
            let last = got.iter().map(|&(i, _, _)| i).max().unwrap_or(first);
            assert!(
                actions[last + 1..]
                    .iter()
                    .any(|a| matches!(a, Action::Synchronize(StreamKind::Compute))),
                "{label}: the host waits for the reads before the copy is freed"
            );
        }
    }
}

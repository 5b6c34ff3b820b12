//! The Muon update (`kernels/muon.cu`): momentum, the per-group component order, one
//! Newton–Schulz per batch of equal components, tensor-parallel shards gathered or
//! distributed, and the apply.

use super::newton_schulz::Sharding;
use super::{MAX_BLOCKS, THREADS, Translator, launch, launch_tiled, to_u32};
use crate::backend::cuda::action::{Action, Arg, DevPtr, Kernel, Launch, Moment2Layout, NcclCall, NcclType, Work};
use crate::backend::cuda::translate::collectives::on_tp_comm;
use crate::backend::ops::{MemoryLayout, MuonJob, MuonWork, StreamKind};
use crate::bail;
use crate::config::{MuonVariant, TpMode};
use crate::error::Result;
use crate::numerics::muon::{MuonShape, TpDim, TpJob, muon_scale};
use crate::numerics::newton_schulz::runs_gram;
use crate::numerics::{adaptive, normuon};

/// Where a NorMuon apply finds its second moments and norm ratios, and which side they run
/// along.
struct Moment2Args {
    moment2: DevPtr,
    layout: Moment2Layout,
    ratio: DevPtr,
}

/// Copies between a per-group split matrix in param row order (`param`) and in component order
/// (`ordered`), one copy per (component, group) block (`numerics::muon::component_row_order`);
/// `to_param` copies back.
pub(super) fn group_copies(
    param: DevPtr,
    ordered: DevPtr,
    split: &[u64],
    groups: u64,
    cols: u64,
    to_param: bool,
) -> Vec<Action> {
    let group_rows = split.iter().sum::<u64>() / groups;
    let mut actions = Vec::new();
    let (mut offset, mut component_start) = (0u64, 0u64);
    for &rows in split {
        let part = rows / groups;
        for g in 0..groups {
            let at_param = param + (g * group_rows + offset) * cols * 4;
            let at_ordered = ordered + (component_start + g * part) * cols * 4;
            let (src, dst) = if to_param {
                (at_ordered, at_param)
            } else {
                (at_param, at_ordered)
            };
            actions.push(Action::CopyDevice {
                dst,
                src,
                bytes: part * cols * 4,
                stream: StreamKind::Compute,
            });
        }
        offset += part;
        component_start += rows;
    }
    actions
}

/// The whole shape of a tensor-parallel component whose shard is `rows × cols`, split along
/// `dim` over `ranks` ranks.
pub(super) fn whole_shape(dim: TpDim, rows: u64, cols: u64, ranks: u64) -> (u64, u64) {
    match dim {
        TpDim::Rows => (ranks * rows, cols),
        TpDim::Cols => (rows, ranks * cols),
    }
}

impl Translator {
    /// The Muon workspace the layout's jobs need with their tensor-parallel components
    /// orthogonalized whole (this translator knows the TP size), and the elements of the
    /// largest gathered component.
    pub(super) fn tp_need(&self, layout: &MemoryLayout) -> (MuonWork, u64) {
        let Some((ranks, _)) = self.tp_group else {
            return (layout.muon_work, 0);
        };
        layout
            .tp_components
            .iter()
            .fold((layout.muon_work, 0), |(need, gathered), c| match c.mode {
                // The shard is the iterate, its unsplit dimension the Gram matrix's.
                TpMode::Distributed => {
                    let unsplit = match c.dim {
                        TpDim::Rows => c.cols,
                        TpDim::Cols => c.rows,
                    } as u64;
                    let split = match c.dim {
                        TpDim::Rows => c.rows,
                        TpDim::Cols => c.cols,
                    };
                    let square = unsplit * unsplit;
                    let gram = MuonWork {
                        gram: square,
                        gram_iteration: if runs_gram(unsplit as usize, split, &self.muon.ns) {
                            square
                        } else {
                            0
                        },
                        ..MuonWork::default()
                    };
                    (need.max(gram), gathered)
                }
                TpMode::Duplicated | TpMode::Blockwise => {
                    let (rows, cols) = whole_shape(c.dim, c.rows as u64, c.cols as u64, ranks as u64);
                    (
                        need.max(MuonWork::of_job(&[rows as usize], cols as usize, 1, &self.muon.ns)),
                        gathered.max(rows * cols),
                    )
                }
            })
    }

    /// Orthogonalizes the `rows × cols` tensor-parallel shard component at `shard` whole:
    /// all-gathers it over the TP group (ordered after the compute stream's writes, and the
    /// compute stream after the gather), assembles the whole component (row blocks follow each
    /// other; column blocks are placed side by side by a 2-D copy), runs Newton–Schulz on it and
    /// returns this rank's chunk of the result as (pointer, transposed, row stride), with the
    /// whole shape for the scale.
    pub(super) fn gathered_newton_schulz(
        &self,
        actions: &mut Vec<Action>,
        shard: DevPtr,
        (rows, cols): (u64, u64),
        dim: TpDim,
    ) -> Result<(DevPtr, bool, u64, (u64, u64))> {
        let (ranks, rank) = self.tp_group_for("duplicated")?;
        let count = rows * cols;
        let gathered = self.work(Work::Gathered)?;
        on_tp_comm(
            actions,
            NcclCall::AllGather {
                send: shard,
                recv: gathered,
                send_count: count,
                dtype: NcclType::F32,
            },
        );
        let whole = match dim {
            TpDim::Rows => gathered,
            TpDim::Cols => {
                let assembled = self.work(Work::Assembled)?;
                for t in 0..ranks {
                    actions.push(Action::CopyDevice2D {
                        dst: assembled + t * cols * 4,
                        dst_pitch: ranks * cols * 4,
                        src: gathered + t * count * 4,
                        src_pitch: cols * 4,
                        width: cols * 4,
                        height: rows,
                        stream: StreamKind::Compute,
                    });
                }
                assembled
            }
        };
        let (whole_rows, whole_cols) = whole_shape(dim, rows, cols, ranks);
        let (x, transposed) = self.newton_schulz(actions, whole, whole_rows, whole_cols, 1, Sharding::None)?;
        // X is whole_rows × whole_cols, or stored transposed (whole_cols × whole_rows).
        let (chunk, ld) = match (dim, transposed) {
            (TpDim::Rows, false) => (x + rank * count * 4, cols),
            (TpDim::Rows, true) => (x + rank * rows * 4, whole_rows),
            (TpDim::Cols, false) => (x + rank * cols * 4, whole_cols),
            (TpDim::Cols, true) => (x + rank * count * 4, rows),
        };
        Ok((chunk, transposed, ld, (whole_rows, whole_cols)))
    }

    /// Orthogonalizes the `rows × cols` tensor-parallel shard component at `shard` with
    /// Megatron's `distributed` mode: Newton–Schulz on the shard (transposed for a row split,
    /// so the split dimension is the iterate's columns), the norm and every `X·Xᵀ` all-reduced
    /// over the TP group. Returns the result as `gathered_newton_schulz` does.
    pub(super) fn distributed_newton_schulz(
        &self,
        actions: &mut Vec<Action>,
        shard: DevPtr,
        (rows, cols): (u64, u64),
        dim: TpDim,
    ) -> Result<(DevPtr, bool, u64, (u64, u64))> {
        let (ranks, _) = self.tp_group_for("distributed")?;
        let transpose = dim == TpDim::Rows;
        let (x, transposed) = self.newton_schulz(actions, shard, rows, cols, 1, Sharding::Columns { transpose })?;
        let ld = if transposed { rows } else { cols };
        Ok((x, transposed, ld, whole_shape(dim, rows, cols, ranks)))
    }

    /// (ranks, this rank) of the TP group a `mode` shard needs.
    pub(super) fn tp_group_for(&self, mode: &str) -> Result<(u64, u64)> {
        match self.tp_group {
            Some((ranks, rank)) => Ok((ranks as u64, rank as u64)),
            None => bail!(
                InvalidState,
                "muon_update: a {mode} tensor-parallel shard needs the TP group (muon_optimizer_set_tp_group)"
            ),
        }
    }

    /// NorMuon's second moment of `batch` orthogonalized `rows × cols` matrices at `x` (stored
    /// transposed, `cols × rows`, when `transposed`; stored rows `ld` elements apart), whose
    /// state is at `moment2`: the line sums of squares, then the moments and norm ratios
    /// (`numerics::normuon`), for the apply.
    #[allow(clippy::too_many_arguments)]
    fn normuon_moments(
        &self,
        actions: &mut Vec<Action>,
        (x, transposed, ld): (DevPtr, bool, u64),
        batch: u64,
        (rows, cols): (u64, u64),
        moment2: DevPtr,
        scalars: DevPtr,
    ) -> Result<Moment2Args> {
        let per_row = normuon::per_row(rows as usize, cols as usize);
        let lines = normuon::lines(rows as usize, cols as usize) as u64;
        if batch * lines > self.work.lines || batch > self.work.norms {
            bail!(
                Internal,
                "muon_update: {batch} NorMuon matrices of {lines} lines exceed the workspace sized at allocate for {} lines",
                self.work.lines
            );
        }
        // Element (r, c) of X is at r·row + c·col.
        let (row, col) = if transposed { (1, ld) } else { (ld, 1) };
        let (line_stride, element_stride, n) = if per_row { (row, col, cols) } else { (col, row, rows) };
        let sums = self.work(Work::Moment2Sums)?;
        let ratio = sums + self.work.lines * 8;
        let (opts, matrix) = (&self.muon.adaptive, rows * cols);
        actions.push(launch(
            Kernel::NormuonLineSums,
            batch * lines,
            StreamKind::Compute,
            vec![
                Arg::Ptr(x),
                Arg::Ptr(sums),
                Arg::U32(to_u32("batch", batch)?),
                Arg::U32(to_u32("lines", lines)?),
                Arg::U32(to_u32("line length", n)?),
                Arg::U64(matrix),
                Arg::U64(line_stride),
                Arg::U64(element_stride),
                Arg::Ptr(scalars),
            ],
        ));
        actions.push(Action::Launch(Launch {
            kernel: Kernel::NormuonMoments,
            grid: [to_u32("batch", batch)?.min(MAX_BLOCKS as u32), 1, 1],
            block: [THREADS, 1, 1],
            stream: StreamKind::Compute,
            args: vec![
                Arg::Ptr(sums),
                Arg::Ptr(moment2),
                Arg::Ptr(ratio),
                Arg::U32(to_u32("batch", batch)?),
                Arg::U32(to_u32("lines", lines)?),
                Arg::U32(to_u32("line length", n)?),
                Arg::F32(opts.beta2),
                Arg::F32(opts.eps),
                Arg::Ptr(scalars),
            ],
        }));
        Ok(Moment2Args {
            moment2,
            layout: if per_row {
                Moment2Layout::Rows
            } else {
                Moment2Layout::Columns
            },
            ratio,
        })
    }

    pub(super) fn muon_update(&self, job: &MuonJob) -> Result<Vec<Action>> {
        self.muon.ns.validate()?;
        MuonShape {
            rows: job.rows,
            cols: job.cols,
            split_rows: &job.split_rows,
            split_groups: job.split_groups,
        }
        .check()?;
        let (rows, cols) = (job.rows as u64, job.cols as u64);
        let split: Vec<u64> = if job.split_rows.is_empty() {
            vec![rows]
        } else {
            job.split_rows.iter().map(|&r| r as u64).collect()
        };
        let groups = job.split_groups.max(1) as u64;
        let len = rows * cols;
        let master = self.resolve_f32(job.master)?;
        let momentum = self.resolve(job.momentum)?;
        let grad = self.resolve(job.grad)?;
        for (name, r) in [("master", master), ("momentum", momentum), ("grad", grad)] {
            if r.len != len {
                bail!(
                    InvalidArgument,
                    "muon_update: {name} has {} elements, expected {rows}×{cols}",
                    r.len
                );
            }
        }
        if len > self.work.matrix {
            bail!(
                Internal,
                "muon_update: {rows}×{cols} exceeds the workspace sized at allocate for {} elements",
                self.work.matrix
            );
        }
        let opts = &self.muon;
        let moment2 = match opts.variant {
            MuonVariant::Normuon | MuonVariant::Adamuon => {
                let shape = MuonShape {
                    rows: job.rows,
                    cols: job.cols,
                    split_rows: &job.split_rows,
                    split_groups: job.split_groups,
                };
                let r = self.resolve_f32(job.moment2)?;
                if r.len != opts.moment2_len(&shape) as u64 {
                    bail!(
                        InvalidArgument,
                        "muon_update: moment2 has {} elements, expected {} for {rows}×{cols}",
                        r.len,
                        opts.moment2_len(&shape)
                    );
                }
                Some(r.ptr)
            }
            MuonVariant::Standard => None,
        };
        // Without Nesterov the update is the new f32 momentum: Newton–Schulz reads it where it
        // is (nothing writes the momentum before the next step). A bf16 momentum's update is
        // its f32 value, in the workspace.
        let momentum_out = if opts.nesterov || opts.momentum_bf16 {
            self.work(Work::Update)?
        } else {
            momentum.ptr
        };
        let scalars = self.slot(0)?;
        let mut actions = vec![launch(
            Kernel::MuonMomentum,
            len,
            StreamKind::Compute,
            vec![
                Arg::Ptr(grad.ptr),
                Arg::I32(grad.is_bf16()),
                Arg::Ptr(momentum.ptr),
                Arg::Ptr(momentum_out),
                Arg::U64(len),
                Arg::Ptr(scalars),
                Arg::I32(i32::from(opts.nesterov)),
                Arg::I32(momentum.is_bf16()),
            ],
        )];
        // A per-group split runs in component order: the update into the grouped workspace,
        // the masters into the update workspace (a Nesterov update there is copied out by
        // then), and back after the apply.
        let (ns_input, target) = if groups > 1 {
            let (grouped, update) = (self.work(Work::Grouped)?, self.work(Work::Update)?);
            actions.extend(group_copies(momentum_out, grouped, &split, groups, cols, false));
            actions.extend(group_copies(master.ptr, update, &split, groups, cols, false));
            (grouped, update)
        } else {
            (momentum_out, master.ptr)
        };
        // Consecutive components of equal shape form one strided batch; a tensor-parallel
        // shard's components are gathered and orthogonalized whole, one at a time.
        let (mut start, mut line) = (0u64, 0u64);
        let mut i = 0;
        while i < split.len() {
            let comp_rows = split[i];
            let batch = match job.tp {
                Some(_) => 1,
                None => split[i..].iter().take_while(|&&r| r == comp_rows).count() as u64,
            };
            let shard = ns_input + start * 4;
            let (x, transposed, ld, (scale_rows, scale_cols)) = match job.tp {
                Some(TpJob {
                    dim,
                    mode: TpMode::Distributed,
                }) => self.distributed_newton_schulz(&mut actions, shard, (comp_rows, cols), dim)?,
                Some(TpJob { dim, .. }) => self.gathered_newton_schulz(&mut actions, shard, (comp_rows, cols), dim)?,
                None => {
                    let (x, transposed) =
                        self.newton_schulz(&mut actions, shard, comp_rows, cols, batch, Sharding::None)?;
                    let ld = if transposed { comp_rows } else { cols };
                    (x, transposed, ld, (comp_rows, cols))
                }
            };
            let scale = muon_scale(
                opts.scale_mode,
                scale_rows as usize,
                scale_cols as usize,
                opts.extra_scale_factor,
            );
            let m2 = match moment2 {
                Some(state) if opts.variant == MuonVariant::Normuon => Some(self.normuon_moments(
                    &mut actions,
                    (x, transposed, ld),
                    batch,
                    (comp_rows, cols),
                    state + line * 4,
                    scalars,
                )?),
                Some(state) => Some(Moment2Args {
                    moment2: state + line * 4,
                    layout: Moment2Layout::Elements,
                    ratio: 0,
                }),
                None => None,
            };
            line += batch * adaptive::moment2_values(opts.variant, comp_rows as usize, cols as usize) as u64;
            actions.push(launch_tiled(
                Kernel::MuonApply,
                comp_rows,
                cols,
                batch,
                vec![
                    Arg::Ptr(target + start * 4),
                    Arg::Ptr(x),
                    Arg::U32(to_u32("batch", batch)?),
                    Arg::U32(to_u32("rows", comp_rows)?),
                    Arg::U32(to_u32("cols", cols)?),
                    Arg::I32(i32::from(transposed)),
                    Arg::U32(to_u32("x_ld", ld)?),
                    Arg::Ptr(scalars),
                    Arg::F32(job.scales.lr_scale),
                    Arg::F32(job.scales.wd_scale),
                    Arg::F32(scale),
                    Arg::Ptr(m2.as_ref().map_or(0, |m| m.moment2)),
                    Arg::I32(m2.as_ref().map_or(0, |m| m.layout as i32)),
                    Arg::Ptr(m2.as_ref().map_or(0, |m| m.ratio)),
                    Arg::F32(opts.adaptive.beta2),
                    Arg::F32(opts.adaptive.eps),
                    Arg::I32(i32::from(opts.cautious_weight_decay)),
                ],
            )?);
            start += batch * comp_rows * cols;
            i += batch as usize;
        }
        if groups > 1 {
            actions.extend(group_copies(master.ptr, target, &split, groups, cols, true));
        }
        Ok(actions)
    }
}

//! Components, the units a checkpoint keys state by, and the range math between owned ranges
//! and components. Every range is in global item coordinates: items of the whole param
//! (flat, row-major), or items of one component, never of a rank's local shard.
//!
//! - A plain param is one component named like the param.
//! - A fused param (`split_sizes` along dim 0) has one component per part,
//!   `name/part{c}`: rows `Σ_{j<c} s_j .. Σ_{j≤c} s_j`, shape `[s_c, cols]`.
//! - An expert stack `[E, m, n]` has one component per expert, `name/expert{e}` with shape
//!   `[m, n]`; with `split_sizes` (rows of each expert's matrix, dim 1 of the stack) one per
//!   expert and part, `name/expert{e}/part{c}` with shape `[s_c, n]`. Component c of a stack is
//!   therefore not one contiguous item range of the stack, but each (expert, part) pair is.
//! - A per-group split (`split_groups` G > 1, Megatron's fused QKV of G query groups) has one
//!   component per group and part, `name/group{g}/part{c}`: the c-th block of group g, each
//!   contiguous; Muon orthogonalizes part c of every group together.

use crate::bail;
use crate::config::MuonVariant;
use crate::error::Result;
use crate::model::{ParamSpec, Route};
use crate::plan::ElemRange;

/// One component of a param.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Component {
    pub name: String,
    /// The items of the param it covers.
    pub range: ElemRange,
    pub shape: Vec<u64>,
}

/// The fp32 state tensors a checkpoint holds for each item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateKind {
    /// fp32 master weight.
    Master,
    /// Muon momentum.
    Momentum,
    /// NorMuon or AdaMuon second moment (`muon_variant` normuon, adamuon), stored per item:
    /// AdaMuon's is one value per item already; under NorMuon every item holds the
    /// value of its line (the row or column of its component the statistic belongs to,
    /// `numerics::normuon`), so it reshards like the momentum.
    Moment2,
    /// AdamW first moment.
    ExpAvg,
    /// AdamW second moment.
    ExpAvgSq,
}

impl StateKind {
    /// The kinds of a route under `variant`, in the order of [`crate::schedule::OwnedState`]:
    /// the master, then each moment.
    pub fn of(route: Route, variant: MuonVariant) -> &'static [StateKind] {
        match (route, variant) {
            (Route::Muon, MuonVariant::Standard) => &[StateKind::Master, StateKind::Momentum],
            (Route::Muon, MuonVariant::Normuon | MuonVariant::Adamuon) => {
                &[StateKind::Master, StateKind::Momentum, StateKind::Moment2]
            }
            (Route::Adamw, _) => &[StateKind::Master, StateKind::ExpAvg, StateKind::ExpAvgSq],
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            StateKind::Master => "master",
            StateKind::Momentum => "momentum",
            StateKind::Moment2 => "moment2",
            StateKind::ExpAvg => "exp_avg",
            StateKind::ExpAvgSq => "exp_avg_sq",
        }
    }
}

/// The components of `spec`, in item order; together they cover the param exactly.
pub fn components(spec: &ParamSpec) -> Vec<Component> {
    let whole = Component {
        name: spec.name.clone(),
        range: ElemRange::new(0, spec.numel()),
        shape: spec.shape.clone(),
    };
    if !spec.is_expert_stack() && spec.split_sizes.is_empty() {
        return vec![whole];
    }
    let matrix = spec.unit_matrix();
    let unit = matrix.rows * matrix.cols;
    let units: Vec<(String, u64)> = if spec.is_expert_stack() {
        (0..spec.num_units())
            .map(|e| (format!("{}/expert{e}", spec.name), e * unit))
            .collect()
    } else if spec.split_groups > 1 {
        let group = unit / spec.split_groups;
        (0..spec.split_groups)
            .map(|g| (format!("{}/group{g}", spec.name), g * group))
            .collect()
    } else {
        vec![(spec.name.clone(), 0)]
    };
    let mut out = Vec::new();
    for (name, start) in units {
        if spec.split_sizes.is_empty() {
            out.push(Component {
                name,
                range: ElemRange::new(start, start + unit),
                shape: vec![matrix.rows, matrix.cols],
            });
            continue;
        }
        let mut row = 0;
        for (c, &rows) in spec.split_sizes.iter().enumerate() {
            let first = start + row * matrix.cols;
            out.push(Component {
                name: format!("{name}/part{c}"),
                range: ElemRange::new(first, first + rows * matrix.cols),
                shape: vec![rows, matrix.cols],
            });
            row += rows;
        }
    }
    out
}

/// The parts of `range` (items of the param) inside each component it touches: (component
/// index, the part in param items), in item order.
pub fn split_by_component(components: &[Component], range: ElemRange) -> Vec<(usize, ElemRange)> {
    let first = components.partition_point(|c| c.range.end <= range.start);
    components[first..]
        .iter()
        .enumerate()
        .map_while(|(i, c)| c.range.intersect(range).map(|part| (first + i, part)))
        .collect()
}

/// The safetensors key of the `kind` tensor of `component` items `range` (component items, or
/// items of `block` of it, a TP shard's box): `{component}/{kind}@{start}:{end}`, or
/// `{component}/{kind}[{lo}:{hi},…]@{start}:{end}`.
pub fn tensor_key(component: &str, kind: StateKind, block: Option<&[[u64; 2]]>, range: ElemRange) -> String {
    let block = super::tp::block_text(block);
    format!("{component}/{}{block}@{}:{}", kind.name(), range.start, range.end)
}

/// Fails when two components of the model share a name (a param named like another param's
/// component), since their tensors would share keys.
pub fn check_unique_names(specs: &[ParamSpec]) -> Result<()> {
    let mut seen = std::collections::HashMap::new();
    for spec in specs {
        for component in components(spec) {
            if let Some(other) = seen.insert(component.name.clone(), spec.name.clone()) {
                bail!(
                    InvalidArgument,
                    "checkpoint: component '{}' of param '{}' has the same name as a component of param '{other}'; rename one of them",
                    component.name,
                    spec.name
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Dtype;
    use crate::model::ParamFlags;

    fn range(start: u64, end: u64) -> ElemRange {
        ElemRange::new(start, end)
    }

    #[test]
    fn swiglu_halves_are_row_blocks() {
        let mut fc1 = ParamSpec::new("fc1", &[8, 4], Dtype::Bf16);
        fc1.split_sizes = vec![3, 5];
        let c = components(&fc1);
        assert_eq!(c.len(), 2);
        assert_eq!(
            (c[0].name.as_str(), c[0].range, c[0].shape.clone()),
            ("fc1/part0", range(0, 12), vec![3, 4])
        );
        assert_eq!(
            (c[1].name.as_str(), c[1].range, c[1].shape.clone()),
            ("fc1/part1", range(12, 32), vec![5, 4])
        );
    }

    #[test]
    fn expert_stacks_are_keyed_by_expert_and_part() {
        let mut stack = ParamSpec::new("experts", &[3, 6, 2], Dtype::Bf16);
        stack.flags = ParamFlags(ParamFlags::EXPERT_STACK);
        let plain = components(&stack);
        assert_eq!(plain.len(), 3);
        assert_eq!(
            (plain[2].name.as_str(), plain[2].range),
            ("experts/expert2", range(24, 36))
        );
        assert_eq!(plain[2].shape, vec![6, 2]);
        stack.split_sizes = vec![4, 2];
        let parts = components(&stack);
        let names: Vec<_> = parts.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "experts/expert0/part0",
                "experts/expert0/part1",
                "experts/expert1/part0",
                "experts/expert1/part1",
                "experts/expert2/part0",
                "experts/expert2/part1"
            ]
        );
        assert_eq!(parts[3].range, range(20, 24));
        assert_eq!(parts[3].shape, vec![2, 2]);
        let covered: u64 = parts.iter().map(|c| c.range.len()).sum();
        assert_eq!(covered, stack.numel());
        assert!(parts.windows(2).all(|w| w[0].range.end == w[1].range.start));
    }

    #[test]
    fn ranges_that_start_or_end_inside_a_component_are_cut_at_its_bounds() {
        let mut fc1 = ParamSpec::new("fc1", &[8, 4], Dtype::Bf16);
        fc1.split_sizes = vec![3, 5];
        let c = components(&fc1);
        assert_eq!(split_by_component(&c, range(5, 9)), vec![(0, range(5, 9))]);
        assert_eq!(
            split_by_component(&c, range(5, 20)),
            vec![(0, range(5, 12)), (1, range(12, 20))]
        );
        assert_eq!(split_by_component(&c, range(12, 32)), vec![(1, range(12, 32))]);
        assert_eq!(
            split_by_component(&c, range(0, 32)),
            vec![(0, range(0, 12)), (1, range(12, 32))]
        );
        assert_eq!(
            split_by_component(&c, range(11, 13)),
            vec![(0, range(11, 12)), (1, range(12, 13))]
        );
    }

    #[test]
    fn every_split_of_a_range_partitions_it() {
        let mut stack = ParamSpec::new("e", &[4, 6, 4], Dtype::Bf16);
        stack.flags = ParamFlags(ParamFlags::EXPERT_STACK);
        stack.split_sizes = vec![1, 2, 3];
        let c = components(&stack);
        let n = stack.numel();
        for start in 0..n {
            for end in start + 1..=n {
                let parts = split_by_component(&c, range(start, end));
                assert_eq!(parts.first().unwrap().1.start, start);
                assert_eq!(parts.last().unwrap().1.end, end);
                for w in parts.windows(2) {
                    assert_eq!(w[0].1.end, w[1].1.start);
                    assert_eq!(w[0].0 + 1, w[1].0);
                }
                for (i, part) in parts {
                    assert_eq!(c[i].range.intersect(part), Some(part));
                }
            }
        }
    }

    #[test]
    fn keys_carry_component_kind_and_range() {
        assert_eq!(
            tensor_key("fc1/part1", StateKind::ExpAvgSq, None, range(0, 20)),
            "fc1/part1/exp_avg_sq@0:20"
        );
        assert_eq!(
            tensor_key("fc1/part1", StateKind::Master, Some(&[[8, 16], [0, 4]]), range(0, 32)),
            "fc1/part1/master[8:16,0:4]@0:32"
        );
    }

    #[test]
    fn colliding_component_names_are_rejected() {
        let mut fused = ParamSpec::new("a", &[4, 4], Dtype::Bf16);
        fused.split_sizes = vec![2, 2];
        let plain = ParamSpec::new("a/part1", &[4, 4], Dtype::Bf16);
        let err = check_unique_names(&[fused, plain]).unwrap_err();
        assert!(err.message.contains("a/part1"), "{}", err.message);
    }
}

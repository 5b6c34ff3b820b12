//! Cost models. Costs are exact `u128` integers so every rank sums them identically.

use crate::model::{MatrixShape, ParamSpec};

use super::types::ParamPlacement;

/// Newton–Schulz cost of one m×n problem, transposed so that m ≤ n: `T·(4m²n + 2m³)`.
fn ns_matrix_cost(shape: MatrixShape, steps: u32) -> u128 {
    let m = shape.rows.min(shape.cols) as u128;
    let n = shape.rows.max(shape.cols) as u128;
    steps as u128 * (4 * m * m * n + 2 * m * m * m)
}

/// Newton–Schulz cost of one ownership unit of a Muon param: the sum over its fused
/// components (one component when not fused).
pub(crate) fn ns_unit_cost(spec: &ParamSpec, steps: u32) -> u128 {
    spec.unit_components()
        .into_iter()
        .map(|c| ns_matrix_cost(c, steps))
        .sum()
}

/// Newton–Schulz work under the owners in `placements`.
pub(crate) struct NsLoads {
    pub per_rank: Vec<u128>,
    /// The largest cost of any rank.
    pub makespan: u128,
    pub total: u128,
    /// The largest single unit.
    pub largest: u128,
}

impl NsLoads {
    pub(crate) fn of(params: &[ParamSpec], placements: &[ParamPlacement], dp: usize, steps: u32) -> Self {
        let mut per_rank = vec![0u128; dp];
        let (mut total, mut largest) = (0u128, 0u128);
        for (spec, placement) in params.iter().zip(placements) {
            if placement.unit_owners.is_empty() {
                continue;
            }
            let cost = ns_unit_cost(spec, steps);
            largest = largest.max(cost);
            for &owner in &placement.unit_owners {
                per_rank[owner as usize] += cost;
                total += cost;
            }
        }
        NsLoads {
            makespan: per_rank.iter().copied().max().unwrap_or(0),
            per_rank,
            total,
            largest,
        }
    }

    /// The ownership guarantee: `dp · makespan <= total + dp · largest unit`.
    pub(crate) fn within_guarantee(&self, dp: usize) -> bool {
        dp as u128 * self.makespan <= self.total + dp as u128 * self.largest
    }
}

/// Megatron-LM's balancing cost of the padded layout: `max(M,N)·min(M,N)²` of the whole
/// matrix (fused components are not split), times E for an expert stack.
pub(crate) fn megatron_cost(spec: &ParamSpec) -> u128 {
    let unit = spec.unit_matrix();
    let big = unit.rows.max(unit.cols) as u128;
    let small = unit.rows.min(unit.cols) as u128;
    spec.num_units() as u128 * big * small * small
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Dtype;
    use crate::model::ParamFlags;

    #[test]
    fn ns_cost_transposes_and_sums_components() {
        let wide = ParamSpec::new("w", &[2, 3], Dtype::F32);
        let tall = ParamSpec::new("t", &[3, 2], Dtype::F32);
        // m = 2, n = 3: 5·(4·4·3 + 2·8) = 320.
        assert_eq!(ns_unit_cost(&wide, 5), 320);
        assert_eq!(ns_unit_cost(&tall, 5), 320);
        let fused = ParamSpec {
            split_sizes: vec![1, 1],
            ..ParamSpec::new("f", &[2, 3], Dtype::F32)
        };
        // Two 1×3 problems: 2·(4·3 + 2) = 28 per step.
        assert_eq!(ns_unit_cost(&fused, 1), 28);
    }

    #[test]
    fn expert_stack_costs_scale_with_experts() {
        let mut stack = ParamSpec::new("e", &[4, 2, 3], Dtype::F32);
        stack.flags = ParamFlags(ParamFlags::EXPERT_STACK);
        assert_eq!((ns_unit_cost(&stack, 5), stack.num_units()), (320, 4));
        assert_eq!(megatron_cost(&stack), 4 * 3 * 2 * 2);
    }
}

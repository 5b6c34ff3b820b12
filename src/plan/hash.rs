//! The plan hash: FNV-1a 64 over a canonical little-endian encoding of everything that
//! determines the plan (params, routes, the config fields the planner reads, dp) and of the
//! resulting layout. Identical on every machine and every run; ranks compare it at finalize.

use crate::config::Config;
use crate::model::{ParamSpec, Route};

use super::Layout;
use super::types::BucketSplit;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Version tag of the encoding; bump when the encoding changes.
const ENCODING: &str = "muon_opt.plan.v3";

/// FNV-1a 64-bit hasher.
pub(crate) struct Fnv1a(u64);

impl Fnv1a {
    pub(crate) fn new() -> Self {
        Fnv1a(FNV_OFFSET)
    }

    pub(crate) fn finish(&self) -> u64 {
        self.0
    }

    fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(FNV_PRIME);
        }
    }

    pub(crate) fn u64(&mut self, value: u64) {
        self.bytes(&value.to_le_bytes());
    }

    pub(crate) fn str(&mut self, text: &str) {
        self.u64(text.len() as u64);
        self.bytes(text.as_bytes());
    }

    pub(crate) fn list(&mut self, values: impl ExactSizeIterator<Item = u64>) {
        self.u64(values.len() as u64);
        for v in values {
            self.u64(v);
        }
    }

    /// Everything a registered param contributes to the plan.
    pub(crate) fn param(&mut self, spec: &ParamSpec, route: Route) {
        self.str(&spec.name);
        self.list(spec.shape.iter().copied());
        self.u64(spec.dtype.code() as u64);
        self.u64(spec.flags.0 as u64);
        self.u64(spec.tie_group as u64);
        self.list(spec.split_sizes.iter().copied());
        self.u64(spec.split_groups);
        self.u64(spec.lr_scale.to_bits() as u64);
        self.u64(spec.wd_scale.to_bits() as u64);
        self.u64(route_code(route));
    }
}

fn route_code(route: Route) -> u64 {
    match route {
        Route::Muon => 0,
        Route::Adamw => 1,
    }
}

/// Hashes the planner's inputs and the layout it produced.
pub(crate) fn plan_hash(params: &[ParamSpec], routes: &[Route], cfg: &Config, dp: usize, layout: &Layout) -> u64 {
    let mut h = Fnv1a(FNV_OFFSET);
    h.str(ENCODING);
    h.u64(dp as u64);
    h.u64(cfg.muon_layout.code() as u64);
    h.u64(cfg.muon_ownership.code() as u64);
    h.u64(cfg.effective_bucket_size(dp));
    h.u64(cfg.overlap_grad_reduce as u64);
    h.u64(cfg.muon_num_ns_steps as u64);
    h.u64(cfg.grad_dtype.code() as u64);
    h.u64(cfg.param_sharding.code() as u64);
    if cfg.sharded() {
        h.u64(cfg.reshard_after_forward as u64);
        h.u64(cfg.param_prefetch_buckets as u64);
    }
    for network in [cfg.network, cfg.expert_network] {
        match network {
            Some(n) => h.list([1, n.hop_latency_us.to_bits(), n.bus_bandwidth_gbps.to_bits()].into_iter()),
            None => h.list([0].into_iter()),
        }
    }
    h.u64(params.len() as u64);
    for (spec, &route) in params.iter().zip(routes) {
        h.param(spec, route);
    }
    for buffer in &layout.buffers {
        h.u64(route_code(buffer.route));
        h.u64(buffer.dtype.code() as u64);
        h.list(
            [
                buffer.numel,
                buffer.param_numel,
                buffer.first_bucket as u64,
                buffer.num_buckets as u64,
            ]
            .into_iter(),
        );
    }
    for bucket in &layout.buckets {
        h.list([bucket.buffer as u64, bucket.start, bucket.end].into_iter());
        h.list(bucket.params.iter().map(|&p| p as u64));
        match &bucket.split {
            BucketSplit::OwnerRanges(ranges) => {
                h.list(ranges.iter().map(|r| r.start));
                h.list(ranges.iter().map(|r| r.end));
            }
            BucketSplit::EqualShards { shard_size } => h.list([*shard_size].into_iter()),
        }
    }
    for placement in &layout.params {
        h.list(
            [
                placement.buffer as u64,
                placement.bucket as u64,
                placement.offset,
                placement.numel,
            ]
            .into_iter(),
        );
        h.list(placement.unit_owners.iter().map(|&r| r as u64));
    }
    h.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_reference_vectors() {
        let digest = |text: &str| {
            let mut h = Fnv1a(FNV_OFFSET);
            h.bytes(text.as_bytes());
            h.0
        };
        assert_eq!(digest(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(digest("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(digest("foobar"), 0x8594_4171_f739_67e8);
    }
}

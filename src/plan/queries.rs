//! What the runtime asks of a plan: per-param placement, the Muon units a rank owns, and the
//! pieces of AdamW params inside a rank's shards.

use crate::model::Route;

use super::types::{Bucket, ElemRange, ParamPlacement, Plan};

/// One Muon unit (a matrix, or one expert of a stack) owned by a rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OwnedUnit {
    pub param: u32,
    /// Unit index inside the param (the expert index of a stack, else 0).
    pub unit: u32,
    pub buffer: u32,
    pub bucket: u32,
    /// Element range in the buffer.
    pub range: ElemRange,
}

/// The part of one AdamW param that lies inside one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShardPiece {
    pub param: u32,
    /// Element range inside the param (flattened).
    pub param_range: ElemRange,
    /// The same elements in the buffer.
    pub buffer_range: ElemRange,
}

/// A rank's shard of one AdamW bucket and the param pieces inside it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AdamwShard {
    pub bucket: u32,
    pub buffer: u32,
    /// The shard's element range in the buffer (padding included).
    pub range: ElemRange,
    /// Param pieces in buffer order.
    pub pieces: Vec<ShardPiece>,
}

/// The pieces of param `param` (placed at `placement` inside equal-shard `bucket`), with the
/// rank whose shard holds each.
pub(crate) fn shard_pieces(
    bucket: &Bucket,
    param: u32,
    placement: &ParamPlacement,
) -> impl Iterator<Item = (usize, ShardPiece)> + use<> {
    let shard = bucket.shard_size().unwrap_or(bucket.numel()).max(1);
    let whole = placement.range();
    let (bucket_start, offset) = (bucket.start, placement.offset);
    let first = (whole.start - bucket_start) / shard;
    let last = (whole.end - 1 - bucket_start) / shard;
    (first..=last).filter_map(move |rank| {
        let start = bucket_start + rank * shard;
        let buffer_range = ElemRange::new(start, start + shard).intersect(whole)?;
        let param_range = buffer_range.shifted_down(offset);
        Some((
            rank as usize,
            ShardPiece {
                param,
                param_range,
                buffer_range,
            },
        ))
    })
}

impl Plan {
    /// The placement of param `id` (its registration index).
    pub fn param(&self, id: usize) -> &ParamPlacement {
        &self.params[id]
    }

    /// The Muon units rank `rank` owns, in buffer order.
    pub fn muon_units_of(&self, rank: usize) -> Vec<OwnedUnit> {
        let mut units = Vec::new();
        for bucket in self.buckets.iter().filter(|b| b.route == Route::Muon) {
            for &param in &bucket.params {
                let placement = &self.params[param as usize];
                for (unit, &owner) in placement.unit_owners.iter().enumerate() {
                    if owner as usize == rank {
                        let range = placement.unit_range(unit);
                        let (buffer, bucket) = (placement.buffer, placement.bucket);
                        units.push(OwnedUnit {
                            param,
                            unit: unit as u32,
                            buffer,
                            bucket,
                            range,
                        });
                    }
                }
            }
        }
        units.sort_by_key(|u| (u.buffer, u.range.start));
        units
    }

    /// Rank `rank`'s shard of every AdamW bucket, with the param pieces inside it.
    pub fn adamw_shards_of(&self, rank: usize) -> Vec<AdamwShard> {
        self.buckets
            .iter()
            .filter(|b| b.route == Route::Adamw)
            .map(|bucket| {
                let range = bucket.rank_range(rank);
                let pieces = bucket
                    .params
                    .iter()
                    .filter_map(|&param| {
                        let placement = &self.params[param as usize];
                        let buffer_range = placement.range().intersect(range)?;
                        let param_range = buffer_range.shifted_down(placement.offset);
                        Some(ShardPiece {
                            param,
                            param_range,
                            buffer_range,
                        })
                    })
                    .collect();
                AdamwShard {
                    bucket: bucket.id,
                    buffer: bucket.buffer,
                    range,
                    pieces,
                }
            })
            .collect()
    }

    /// The per-rank pieces of AdamW param `param`, in rank order (empty for Muon params).
    pub fn adamw_pieces(&self, param: u32) -> Vec<(u32, ShardPiece)> {
        let placement = &self.params[param as usize];
        if placement.route != Route::Adamw {
            return Vec::new();
        }
        let bucket = &self.buckets[placement.bucket as usize];
        shard_pieces(bucket, param, placement)
            .map(|(r, piece)| (r as u32, piece))
            .collect()
    }

    /// The plan (layout and report) as JSON (docs/plan-json.md), with `schema_version` and
    /// every entry of `params` carrying its registered name (`names`, in registration order).
    pub fn to_json(&self, names: &[String]) -> String {
        let mut document = serde_json::to_value(self).expect("a plan has only string map keys and always serializes");
        document["schema_version"] = crate::SCHEMA_VERSION.into();
        let entries = document["params"].as_array_mut().expect("params serialize to an array");
        for (entry, name) in entries.iter_mut().zip(names) {
            entry["name"] = name.as_str().into();
        }
        document.to_string()
    }
}

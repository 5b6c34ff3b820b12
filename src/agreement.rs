//! Finalize's cross-rank check: every rank must use the same settings that change numerics
//! or communication and register the same params in the same order. Ranks exchange one
//! 64-bit value at a time (an all-gather); on a mismatch they keep exchanging, all taking the
//! same path, until the first differing config field or param is found, and every rank's
//! error names it.

use serde_json::Value;

use crate::bail;
use crate::config::Config;
use crate::error::Result;
use crate::model::{ParamSpec, Registry, Route};
use crate::plan::hash::Fnv1a;

/// One all-gather of a value per rank; the result is indexed by rank.
pub type Exchange<'a> = dyn FnMut(u64) -> Result<Vec<u64>> + 'a;

/// Config fields that change neither the numerics nor the communication of any rank: a
/// rank's own timeout and host comm mode, and the registration-time vocabulary check.
const LOCAL_FIELDS: &[&str] = &["collective_timeout_ms", "host_comm_mode", "host_threads", "vocab_size"];

/// The fields that must agree, as (name, canonical JSON text); `bucket_size` as its
/// effective value.
fn shared_fields(cfg: &Config, dp: usize) -> Vec<(String, String)> {
    // Through text, so an f32 reads as its shortest form (0.95, not 0.949999988079071).
    let text = serde_json::to_string(cfg).expect("the config serializes");
    let mut value: Value = serde_json::from_str(&text).expect("serde_json reads its own output");
    if let Some(map) = value.as_object_mut() {
        map.insert("bucket_size".into(), Value::from(cfg.effective_bucket_size(dp)));
    }
    let Value::Object(map) = value else {
        return Vec::new();
    };
    map.into_iter()
        .filter(|(name, _)| !LOCAL_FIELDS.contains(&name.as_str()))
        .map(|(name, v)| (name, v.to_string()))
        .collect()
}

fn text_hash(text: &str) -> u64 {
    let mut h = Fnv1a::new();
    h.str(text);
    h.finish()
}

fn first_other(values: &[u64], mine: u64) -> Option<(usize, u64)> {
    values.iter().copied().enumerate().find(|&(_, v)| v != mine)
}

/// Fails with `PlanMismatch` naming the first config field whose value differs on another
/// rank.
pub fn verify_config(cfg: &Config, dp: usize, rank: usize, exchange: &mut Exchange) -> Result<()> {
    let fields = shared_fields(cfg, dp);
    let mut all = Fnv1a::new();
    for (name, text) in &fields {
        all.str(name);
        all.str(text);
    }
    if first_other(&exchange(all.finish())?, all.finish()).is_none() {
        return Ok(());
    }
    for (name, text) in &fields {
        let mine = text_hash(text);
        if let Some((other, _)) = first_other(&exchange(mine)?, mine) {
            bail!(
                PlanMismatch,
                "finalize: config field '{name}' is {text} on rank {rank} but differs on rank {other}; every rank must use the same settings that change numerics or communication"
            );
        }
    }
    bail!(
        PlanMismatch,
        "finalize: the ranks' configs differ (rank {rank} found no single differing field)"
    )
}

/// The smallest `k` in `1..=n` for which `differs(k)` holds, given that it holds for `n`, by
/// bisection: every rank sees every rank's values, so all take the same path.
fn first_differing(
    n: usize,
    exchange: &mut Exchange,
    differs: impl Fn(usize, &mut Exchange) -> Result<bool>,
) -> Result<usize> {
    let (mut lo, mut hi) = (0, n);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if differs(mid, exchange)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(hi)
}

/// Hash of the first `k` params.
fn prefix_hash(params: &[ParamSpec], routes: &[Route], k: usize) -> u64 {
    let mut h = Fnv1a::new();
    for (spec, &route) in params[..k].iter().zip(routes) {
        h.param(spec, route);
    }
    h.finish()
}

/// Called when the plan hashes differ with equal configs: fails with `PlanMismatch` naming
/// the first param that differs between this rank and another (or the param counts).
pub fn explain_param_mismatch(
    params: &[ParamSpec],
    routes: &[Route],
    rank: usize,
    exchange: &mut Exchange,
) -> Result<()> {
    let counts = exchange(params.len() as u64)?;
    let common = counts.iter().copied().min().unwrap_or(0) as usize;
    // Smallest k whose prefix of k params differs on some rank.
    let differs = |k: usize, exchange: &mut Exchange| -> Result<bool> {
        let mine = prefix_hash(params, routes, k);
        Ok(first_other(&exchange(mine)?, mine).is_some())
    };
    if common > 0 && differs(common, exchange)? {
        let hi = first_differing(common, exchange, differs)?;
        let spec = &params[hi - 1];
        bail!(
            PlanMismatch,
            "finalize: param {} is '{}' {:?} {} (flags 0x{:x}, tie_group {}, split_sizes {:?}) on rank {rank}, but another rank registered a different param {}; every rank must register the same params in the same order",
            hi - 1,
            spec.name,
            spec.shape,
            spec.dtype.name(),
            spec.flags.0,
            spec.tie_group,
            spec.split_sizes,
            hi - 1
        );
    }
    if let Some((other, n)) = first_other(&counts, params.len() as u64) {
        bail!(
            PlanMismatch,
            "finalize: rank {rank} registered {} params but rank {other} registered {n}; the first {common} agree",
            params.len()
        );
    }
    Ok(())
}

/// One setting the ranks of a group must agree on: what it is, for messages, and its value.
pub struct Setting {
    pub what: String,
    pub value: String,
}

impl Setting {
    pub fn new(what: impl Into<String>, value: impl ToString) -> Setting {
        Setting {
            what: what.into(),
            value: value.to_string(),
        }
    }
}

/// Hash of the values of the first `k` settings.
fn settings_hash(settings: &[Setting], k: usize) -> u64 {
    let mut h = Fnv1a::new();
    for setting in &settings[..k] {
        h.str(&setting.value);
    }
    h.finish()
}

/// Collective over one group (`group` names it and its ranks in messages, e.g. "TP"): fails
/// with `PlanMismatch` naming the first setting whose value differs between this rank and
/// another, with both values, and `rule`; a rank whose list is shorter shows `(none)` for the
/// settings it lacks. Every rank takes the same path, so the group stays usable after a
/// mismatch.
pub fn verify_settings(
    settings: &[Setting],
    (group, rank): (&str, usize),
    rule: &str,
    exchange: &mut Exchange,
) -> Result<()> {
    let mine = settings_hash(settings, settings.len());
    if first_other(&exchange(mine)?, mine).is_none() {
        return Ok(());
    }
    let counts = exchange(settings.len() as u64)?;
    let common = counts.iter().copied().min().unwrap_or(0) as usize;
    let differs = |k: usize, exchange: &mut Exchange| -> Result<bool> {
        let mine = settings_hash(settings, k);
        Ok(first_other(&exchange(mine)?, mine).is_some())
    };
    let first = if common > 0 && differs(common, exchange)? {
        first_differing(common, exchange, differs)? - 1
    } else {
        // Every rank lists `common` equal settings and some list more: compare the next.
        common
    };
    // A rank whose list ends before `first` reads the setting's name from one that has it.
    let setting = settings.get(first);
    let text = setting.map_or("(none)", |s| s.value.as_str());
    let values = exchange_text(text, exchange)?;
    let names = exchange_text(setting.map_or("", |s| s.what.as_str()), exchange)?;
    let (other, theirs) = values
        .iter()
        .enumerate()
        .find(|(_, v)| v.as_str() != text)
        .map_or((rank, text), |(r, v)| (r, v.as_str()));
    let what = names.iter().find(|n| !n.is_empty()).map_or("a setting", String::as_str);
    bail!(
        PlanMismatch,
        "finalize: the {group} group disagrees on {what}: {text} on {group} rank {rank}, {theirs} on {group} rank {other}; {rule}"
    )
}

/// Every rank's `text` (collective; one exchange per 8 bytes of the longest).
fn exchange_text(text: &str, exchange: &mut Exchange) -> Result<Vec<String>> {
    let bytes = text.as_bytes();
    let lengths = exchange(bytes.len() as u64)?;
    let longest = lengths.iter().copied().max().unwrap_or(0) as usize;
    let mut texts = vec![Vec::new(); lengths.len()];
    for start in (0..longest).step_by(8) {
        let mut word = [0u8; 8];
        let mine = bytes.get(start..bytes.len().min(start + 8)).unwrap_or(&[]);
        word[..mine.len()].copy_from_slice(mine);
        for (text, value) in texts.iter_mut().zip(exchange(u64::from_le_bytes(word))?) {
            text.extend_from_slice(&value.to_le_bytes());
        }
    }
    Ok(texts
        .into_iter()
        .zip(lengths)
        .map(|(text, length)| String::from_utf8_lossy(&text[..length as usize]).into_owned())
        .collect())
}

/// Collective over the norm group, which spans the pipeline stages: every tie group declared
/// on more than one rank routes alike on all of them. The copy of an embedding on a later
/// stage (the multi-token-prediction layer's, the output layer's) lives in that stage's
/// optimizer, where the registry's own tie check cannot see the original. `ties` lists this
/// rank's params with a tie group: (tie group, route, name). Every rank finds the same first
/// tie group routed both ways and fails with `PlanMismatch` naming a param on each side.
pub fn verify_tie_routes(ties: &[(u32, Route, &str)], rank: usize, exchange: &mut Exchange) -> Result<()> {
    // One entry per tie group of this rank (the registry keeps a group's copies on one route).
    let mut mine: Vec<(u32, Route, &str)> = Vec::new();
    for &(group, route, name) in ties {
        if !mine.iter().any(|(g, ..)| *g == group) {
            mine.push((group, route, name));
        }
    }
    mine.sort_by_key(|(group, ..)| *group);
    let counts = exchange(mine.len() as u64)?;
    let longest = counts.iter().copied().max().unwrap_or(0) as usize;
    let encode = |(group, route, _): &(u32, Route, &str)| u64::from(*group) << 1 | u64::from(*route == Route::Muon);
    // Every rank's entries: (rank, tie group, routes to Muon).
    let mut all: Vec<(usize, u32, bool)> = Vec::new();
    for i in 0..longest {
        let word = mine.get(i).map_or(u64::MAX, encode);
        for (r, value) in exchange(word)?.into_iter().enumerate() {
            if value != u64::MAX {
                all.push((r, (value >> 1) as u32, value & 1 == 1));
            }
        }
    }
    all.sort_by_key(|&(r, group, _)| (group, r));
    // Sorted by (group, rank): the first entry with a conflict is its group's first.
    let conflict = all.iter().find_map(|&first @ (_, group, muon)| {
        let other = all.iter().find(|&&(_, g, m)| g == group && m != muon)?;
        Some((group, first, *other))
    });
    let Some((group, (rank_a, _, muon_a), (rank_b, _, muon_b))) = conflict else {
        return Ok(());
    };
    let my_name = mine.iter().find(|(g, ..)| *g == group).map_or("", |(.., name)| *name);
    let names = exchange_text(my_name, exchange)?;
    let route = |muon: bool| if muon { "muon" } else { "adamw" };
    bail!(
        PlanMismatch,
        "finalize: tie_group {group} routes both ways across the norm group: '{}' routes to {} on norm rank {rank_a}, '{}' routes to {} on norm rank {rank_b} (this is rank {rank}); every copy of a tied weight — on any pipeline stage, e.g. an MTP layer's embedding — must be flagged alike (EMBEDDING_OR_OUTPUT on all of them)",
        names[rank_a],
        route(muon_a),
        names[rank_b],
        route(muon_b)
    )
}

/// Collective over `group` (the norm group, which spans the pipeline stages, or the
/// data-parallel group without one): `vocab_size`'s default. Every rank contributes the
/// vocabulary its params flagged `EMBEDDING_OR_OUTPUT` declare ([`Registry::embedding_rows`]);
/// on a rank whose `vocab_size` is 0, a Muon-routed param whose dim 0 equals the largest of
/// them is an untagged copy of the embedding — the multi-token-prediction stage's, declared
/// without a tie group — and every rank of the group fails with `RoutingConflict` naming the
/// first such param and its rank.
pub fn verify_vocab_default(
    registry: &Registry,
    vocab_size: u64,
    (group, rank): (&str, usize),
    exchange: &mut Exchange,
) -> Result<()> {
    let vocab = exchange(registry.embedding_rows())?.into_iter().max().unwrap_or(0);
    let copy = (vocab_size == 0 && vocab > 0)
        .then(|| registry.first_with_vocab_rows(vocab))
        .flatten();
    let found = exchange(u64::from(copy.is_some()))?;
    let Some(other) = found.iter().position(|&f| f == 1) else {
        return Ok(());
    };
    let names = exchange_text(copy.map_or("", |p| p.name.as_str()), exchange)?;
    bail!(
        RoutingConflict,
        "finalize: param '{}' on {group} rank {other} routes to Muon but its dim 0 is {vocab}, the vocabulary size of the params flagged EMBEDDING_OR_OUTPUT (this is {group} rank {rank}); with vocab_size 0 the vocabulary size is the largest dim 0 of those params on every rank of the {group} group, and a Muon matrix with that many rows is an untagged copy of an embedding or output layer: flag it EMBEDDING_OR_OUTPUT (with the tie_group of the weight it copies), or ALLOW_VOCAB_DIM if it really is a hidden matrix",
        names[other]
    )
}

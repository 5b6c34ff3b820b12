//! QK-clip (Kimi K2's MuonClip): after a step, every attention head group whose largest
//! pre-softmax logit `S` exceeded the threshold `τ` has its query rows scaled by `η^α` and its
//! key rows by `η^(1−α)`, `η = τ / S`, so the logit `q·k` comes back to `τ`; values are
//! untouched (docs/design.md §14).
//!
//! Sources: Kimi Team, "Kimi K2: Open Agentic Intelligence" (arXiv 2507.20534, §2.1 MuonClip:
//! per head `γ_h = min(1, τ / S_max^h)`; MLA: `q^C`, `k^C` × √γ, the per-head rotary query
//! `q^R` × γ, the shared rotary key untouched); Megatron-LM `megatron/core/optimizer/qk_clip.py`
//! (the maxima all-reduced with MAX over the data-parallel group with context parallelism,
//! then each attention's `clip_qk()` after `optimizer.step()`, also after a skipped step),
//! `transformer/attention.py` `SelfAttention.clip_qk` (one η per query group: the max over
//! the group's heads scales the group's query rows and its shared key rows — the GQA rule),
//! `transformer/multi_latent_attention.py` `MLASelfAttention.clip_qk` (per head: `q_nope ×
//! η^α`, `q_pe × η`, `k_nope × η^(1−α)`, `v` untouched). Tensor parallelism: each TP rank
//! passes the maxima of its own heads (`num_attention_heads_per_partition`).
//!
//! Bit for bit on every backend: `η = τ / S` is one IEEE f32 division, `η^e` is
//! [`pow_unit`] (f64 additions, multiplications and divisions only, the same on the device
//! compiled with `--fmad=false`) rounded to f32, and each weight is multiplied once in f32. A
//! group whose maximum is not above `τ`, or not finite, is not touched at all (its bits stay).

/// What a run of rows of a head group is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QkRole {
    /// Query rows (non-rotary part in MLA): × η^α.
    Query,
    /// Key rows (non-rotary part in MLA): × η^(1−α).
    Key,
    /// MLA's per-head rotary query rows: × η.
    Rope,
    /// Value rows: untouched.
    Value,
}

impl QkRole {
    /// The exponent of η for this role.
    pub fn exponent(self, alpha: f32) -> Exponent {
        match self {
            QkRole::Query => Exponent::Alpha,
            QkRole::Key => Exponent::OneMinusAlpha,
            QkRole::Rope => Exponent::One,
            QkRole::Value => Exponent::Zero,
        }
        .simplify(alpha)
    }

    /// The code the kernel (`kernels/qk_clip.cu`) reads: 0 query, 1 key, 2 rope, 3 value.
    pub fn code(self) -> u32 {
        self as u32
    }
}

/// The exponent of η applied to a role's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exponent {
    Zero,
    One,
    Alpha,
    OneMinusAlpha,
}

impl Exponent {
    fn simplify(self, alpha: f32) -> Exponent {
        let e = self.value(alpha);
        if e == 0.0 {
            Exponent::Zero
        } else if e == 1.0 {
            Exponent::One
        } else {
            self
        }
    }

    /// Its value in f64 (`1 − α` is exact in f64 for an f32 α in [0, 1]).
    pub fn value(self, alpha: f32) -> f64 {
        match self {
            Exponent::Zero => 0.0,
            Exponent::One => 1.0,
            Exponent::Alpha => f64::from(alpha),
            Exponent::OneMinusAlpha => 1.0 - f64::from(alpha),
        }
    }
}

/// Which attention matrix a param is, and its head layout (this TP rank's heads).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QkKind {
    /// Megatron's fused `linear_qkv`: `[G · (H/G·d + d + d), hidden]`, per query group its
    /// heads' query rows, then its key rows, then its value rows.
    FusedQkv,
    /// A separate query projection `[H · d, hidden]` (heads in order).
    Query,
    /// A separate key projection `[G · d, hidden]` (one key head per query group).
    Key,
    /// MLA's query projection (`linear_q_proj` or `linear_q_up_proj`):
    /// `[H · (d + rope_dim), in]`, per head its non-rotary rows then its rotary rows.
    MlaQuery,
    /// MLA's `linear_kv_up_proj`: `[H · (d + v_head_dim), kv_lora_rank]`, per head its key
    /// rows then its value rows.
    MlaKeyValue,
}

/// One param's head layout as the caller gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QkHeads {
    pub kind: QkKind,
    /// Attention heads (maxima) of this param on this TP rank.
    pub heads: u32,
    /// Query groups (key/value heads); equal to `heads` without GQA; ignored by MLA.
    pub query_groups: u32,
    /// Rows per head of the query/key (MLA: the non-rotary `qk_head_dim`).
    pub head_dim: u32,
    /// MLA query: rotary rows per head.
    pub rope_dim: u32,
    /// MLA key/value: value rows per head.
    pub v_head_dim: u32,
}

/// Where η applies inside a matrix: `groups` blocks of rows, block g holding the rows of
/// `segments` in order and taking the η of maxima `g·heads_per_group ..`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QkRowMap {
    pub groups: usize,
    pub heads_per_group: usize,
    /// (role, rows), at most [`MAX_SEGMENTS`].
    pub segments: Vec<(QkRole, usize)>,
}

/// Most row segments of a head group (the kernel's argument struct has this many).
pub const MAX_SEGMENTS: usize = 4;

impl QkRowMap {
    /// Rows of one group's block.
    pub fn group_rows(&self) -> usize {
        self.segments.iter().map(|s| s.1).sum()
    }

    /// Rows of the matrix.
    pub fn rows(&self) -> usize {
        self.groups * self.group_rows()
    }

    /// Maxima it reads.
    pub fn heads(&self) -> usize {
        self.groups * self.heads_per_group
    }
}

impl QkHeads {
    /// The row map of a `rows`-row matrix, or a message naming the field that does not fit.
    pub fn row_map(&self, rows: u64) -> Result<QkRowMap, String> {
        let (h, g, d) = (self.heads as usize, self.query_groups as usize, self.head_dim as usize);
        if h == 0 {
            return Err("num_heads is 0".into());
        }
        if d == 0 {
            return Err("head_dim is 0".into());
        }
        let grouped = matches!(self.kind, QkKind::FusedQkv | QkKind::Query | QkKind::Key);
        if grouped && (g == 0 || h % g != 0) {
            return Err(format!(
                "num_query_groups {g} does not divide num_heads {h} (GQA: every query group has the same number of heads)"
            ));
        }
        let grouped = |segments| QkRowMap {
            groups: g,
            heads_per_group: h / g,
            segments,
        };
        let per_head = |extra: u32, field: &str, why: &str, roles: (QkRole, QkRole)| {
            if extra == 0 {
                return Err(format!("{field} is 0 ({why})"));
            }
            Ok(QkRowMap {
                groups: h,
                heads_per_group: 1,
                segments: vec![(roles.0, d), (roles.1, extra as usize)],
            })
        };
        let map = match self.kind {
            QkKind::FusedQkv => grouped(vec![(QkRole::Query, h / g * d), (QkRole::Key, d), (QkRole::Value, d)]),
            QkKind::Query => grouped(vec![(QkRole::Query, h / g * d)]),
            QkKind::Key => grouped(vec![(QkRole::Key, d)]),
            QkKind::MlaQuery => per_head(
                self.rope_dim,
                "rope_dim",
                "MLA's query has a rotary part per head",
                (QkRole::Query, QkRole::Rope),
            )?,
            QkKind::MlaKeyValue => per_head(
                self.v_head_dim,
                "v_head_dim",
                "MLA's kv_up_proj has value rows per head",
                (QkRole::Key, QkRole::Value),
            )?,
        };
        let expected = (map.groups as u128) * (map.group_rows() as u128);
        if expected != u128::from(rows) {
            return Err(format!(
                "the layout has {expected} rows ({} group(s) × {} rows), the param has {rows}",
                map.groups,
                map.group_rows()
            ));
        }
        Ok(map)
    }
}

/// `x^e` for `x` in (0, 1] and `e` in (0, 1), in f64 with additions, multiplications and
/// divisions only, in one fixed order (the kernel's `muon_pow_unit` is the same code):
/// `ln x = k·ln 2 + 2·atanh(s)` with the mantissa in [√½, √2] and a 14-term series in `s²`,
/// then `exp(e·ln x) = 2^n · exp(r)` with `|r| ≤ ln 2 / 2` and a 20-term Taylor series.
/// Relative error below 1e-15, far inside the f32 rounding of the result.
pub fn pow_unit(x: f64, e: f64) -> f64 {
    const LN2: f64 = std::f64::consts::LN_2;
    const SQRT2: f64 = std::f64::consts::SQRT_2;
    if x == 0.0 {
        return 0.0;
    }
    let bits = x.to_bits();
    let mut k = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let mut m = f64::from_bits((bits & 0x000f_ffff_ffff_ffff) | 0x3ff0_0000_0000_0000);
    if m > SQRT2 {
        m /= 2.0;
        k += 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let mut series = 0.0;
    for i in (0..14).rev() {
        series = series * s2 + 1.0 / (2 * i + 1) as f64;
    }
    let ln = k as f64 * LN2 + 2.0 * s * series;
    let y = e * ln;
    let n = (y / LN2 + 0.5).floor();
    let r = y - n * LN2;
    let mut t = 1.0;
    for i in (1..=20).rev() {
        t = 1.0 + t * r / i as f64;
    }
    t * f64::from_bits(((n as i64 + 1023) as u64) << 52)
}

/// η of a head group from its maxima, or None when the group is left as it is (every maximum
/// at most τ, or one not finite).
pub fn group_eta(maxima: &[f32], tau: f32) -> Option<f32> {
    let mut max = f32::NEG_INFINITY;
    for &s in maxima {
        if !s.is_finite() {
            return None;
        }
        if s > max {
            max = s;
        }
    }
    (max > tau).then(|| tau / max)
}

/// The multiplier of the rows with exponent `e` in a group of η `eta` (None: untouched).
pub fn factor(eta: f32, e: Exponent, alpha: f32) -> Option<f32> {
    match e {
        Exponent::Zero => None,
        Exponent::One => Some(eta),
        _ => Some(pow_unit(f64::from(eta), e.value(alpha)) as f32),
    }
}

/// Applies the clip to `w`, a row-major `[map.rows(), cols]` fp32 matrix, with `maxima`
/// (`map.heads()` values, head order) — the specification every backend reproduces.
pub fn qk_clip(w: &mut [f32], cols: usize, map: &QkRowMap, maxima: &[f32], tau: f32, alpha: f32) {
    let group_len = map.group_rows() * cols;
    for (g, block) in w.chunks_exact_mut(group_len).take(map.groups).enumerate() {
        let heads = &maxima[g * map.heads_per_group..(g + 1) * map.heads_per_group];
        let Some(eta) = group_eta(heads, tau) else { continue };
        let mut row = 0;
        for &(role, rows) in &map.segments {
            if let Some(f) = factor(eta, role.exponent(alpha), alpha) {
                for v in &mut block[row * cols..(row + rows) * cols] {
                    *v *= f;
                }
            }
            row += rows;
        }
    }
}

/// Checks the scalars of a clip: `τ` finite and positive, `α` in [0, 1].
pub fn check_scalars(tau: f32, alpha: f32) -> Result<(), String> {
    if !(tau > 0.0 && tau.is_finite()) {
        return Err(format!("threshold {tau} is not a finite number above 0"));
    }
    if !(0.0..=1.0).contains(&alpha) {
        return Err(format!("alpha {alpha} is not in [0, 1]"));
    }
    Ok(())
}

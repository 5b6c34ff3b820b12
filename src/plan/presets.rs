//! Built-in model descriptions for `muon-opt plan` and the planner's benchmarks: GPT-2 124M,
//! Llama 3 8B and 70B, a DeepSeek-V3-like MoE, Kimi K2 and Qwen3-30B-A3B (each from its
//! Hugging Face `config.json`). Shapes are `[out, in]` as in PyTorch;
//! every param is bf16. Fused matrices carry `split_sizes` (QKV as q|k|v, SwiGLU as gate|up)
//! so Muon orthogonalizes each component.

use crate::config::{Config, Dtype};
use crate::error::{Error, ErrorKind, Result};
use crate::model::{ParamFlags, ParamSpec, Registry};

/// A model: its params in registration (forward) order and its vocabulary size.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelDesc {
    pub name: String,
    /// Vocabulary size for the untagged-embedding check; 0 = unknown.
    pub vocab_size: u64,
    pub params: Vec<ParamSpec>,
}

impl ModelDesc {
    /// The same model with every expert stack `[E, m, n]` registered as E separate `[m, n]`
    /// params `name.0` … `name.{E-1}` (flags, split sizes and hyper-parameters kept), as
    /// Megatron-LM sees a MoE layer: its layouts then apply unchanged.
    pub fn with_experts_as_params(&self) -> ModelDesc {
        let mut params = Vec::with_capacity(self.params.len());
        for spec in &self.params {
            if !spec.is_expert_stack() {
                params.push(spec.clone());
                continue;
            }
            for e in 0..spec.shape[0] {
                let mut expert = spec.clone();
                expert.name = format!("{}.{e}", spec.name);
                expert.shape = spec.shape[1..].to_vec();
                expert.flags = ParamFlags(spec.flags.0 & !ParamFlags::EXPERT_STACK);
                params.push(expert);
            }
        }
        ModelDesc {
            name: format!("{} (experts as params)", self.name),
            vocab_size: self.vocab_size,
            params,
        }
    }

    /// One tensor-parallel rank's part of the model at TP size `tp`, as Megatron-LM shards it:
    /// the column-parallel `…qkv.weight` and `…fc1.weight` split along their rows (each fused
    /// component by `tp`), the row-parallel `…proj.weight` and `…fc2.weight` along their
    /// columns, each flagged as a TP shard; everything else whole.
    ///
    /// # Errors
    /// `InvalidArgument` naming the param whose split dimension (or component) `tp` does not
    /// divide.
    pub fn with_tensor_parallel(&self, tp: usize) -> Result<ModelDesc> {
        let tp = tp as u64;
        let mut params = self.params.clone();
        for spec in params.iter_mut().filter(|s| s.shape.len() == 2 && !s.is_expert_stack()) {
            let split = |n: u64| {
                if n.is_multiple_of(tp) {
                    Ok(n / tp)
                } else {
                    Err(Error::new(
                        ErrorKind::InvalidArgument,
                        format!("tp {tp} does not divide {n}, a split dimension of '{}'", spec.name),
                    ))
                }
            };
            if spec.name.ends_with("qkv.weight") || spec.name.ends_with("fc1.weight") {
                spec.shape[0] = split(spec.shape[0])?;
                spec.split_sizes = spec.split_sizes.iter().map(|&s| split(s)).collect::<Result<_>>()?;
                spec.flags = ParamFlags(spec.flags.0 | ParamFlags::TP_SHARD_ROWS);
            } else if spec.name.ends_with("proj.weight") || spec.name.ends_with("fc2.weight") {
                spec.shape[1] = split(spec.shape[1])?;
                spec.flags = ParamFlags(spec.flags.0 | ParamFlags::TP_SHARD_COLS);
            }
        }
        Ok(ModelDesc {
            name: format!("{} (tp {tp})", self.name),
            vocab_size: self.vocab_size,
            params,
        })
    }

    /// The params pipeline stage `stage` of `stages` holds, as Megatron-LM splits a model
    /// without a custom layout: the decoder layers `layers.{i}.…` split evenly, stage s holding
    /// layers `⌊s·L/stages⌋ .. ⌊(s+1)·L/stages⌋`; the params registered before the first layer
    /// (the embedding) on the first stage, those after the last (the final norm, the output
    /// layer, a multi-token-prediction module) on the last.
    ///
    /// # Errors
    /// `InvalidArgument` when `stage` is not below `stages` or the model has fewer layers than
    /// stages.
    pub fn pipeline_stage(&self, stages: usize, stage: usize) -> Result<ModelDesc> {
        let layer = |spec: &ParamSpec| {
            let rest = spec.name.strip_prefix("layers.")?;
            rest.split('.').next()?.parse::<usize>().ok()
        };
        let layers = self.params.iter().filter_map(layer).max().map_or(0, |last| last + 1);
        if stage >= stages || layers < stages {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "pipeline stage {stage} of {stages}: '{}' has {layers} layers; a stage below the stage count and at least one layer per stage",
                    self.name
                ),
            ));
        }
        let (first, end) = (stage * layers / stages, (stage + 1) * layers / stages);
        let mut seen_layer = false;
        let params = self
            .params
            .iter()
            .filter(|spec| match layer(spec) {
                Some(i) => {
                    seen_layer = true;
                    (first..end).contains(&i)
                }
                None if seen_layer => stage == stages - 1,
                None => stage == 0,
            })
            .cloned()
            .collect();
        Ok(ModelDesc {
            name: format!("{} (pp {stages} stage {stage})", self.name),
            vocab_size: self.vocab_size,
            params,
        })
    }

    /// One expert-parallel rank's part of the model at EP size `ep`: every expert stack
    /// `[E, m, n]` holds its `E/ep` experts `[E/ep, m, n]`; everything else whole.
    ///
    /// # Errors
    /// `InvalidArgument` naming the expert stack whose expert count `ep` does not divide.
    pub fn with_expert_parallel(&self, ep: usize) -> Result<ModelDesc> {
        let mut params = self.params.clone();
        for spec in params.iter_mut().filter(|s| s.is_expert_stack()) {
            if ep == 0 || !spec.shape[0].is_multiple_of(ep as u64) {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "ep {ep} does not divide the {} experts of '{}'",
                        spec.shape[0], spec.name
                    ),
                ));
            }
            spec.shape[0] /= ep as u64;
        }
        Ok(ModelDesc {
            name: format!("{} (ep {ep})", self.name),
            vocab_size: self.vocab_size,
            params,
        })
    }

    /// Registers every param through [`Registry::add`], so routing rules and checks apply.
    pub fn registry(&self, cfg: &Config) -> Result<Registry> {
        let mut registry = Registry::default();
        for spec in &self.params {
            registry.add(spec.clone(), cfg)?;
        }
        Ok(registry)
    }
}

/// Names accepted by [`preset`].
pub const PRESET_NAMES: &[&str] = &[
    "gpt2-124m",
    "llama3-8b",
    "llama3-70b",
    "deepseek-v3-like",
    "kimi-k2",
    "qwen3-30b-a3b",
];

/// The preset called `name`, if any.
pub fn preset(name: &str) -> Option<ModelDesc> {
    let (vocab_size, params) = match name {
        "gpt2-124m" => (GPT2_VOCAB, gpt2_124m()),
        "llama3-8b" => (LLAMA3_VOCAB, llama3(&LLAMA3_8B)),
        "llama3-70b" => (LLAMA3_VOCAB, llama3(&LLAMA3_70B)),
        "deepseek-v3-like" => (DSV3_VOCAB, deepseek_v3_like()),
        "kimi-k2" => (KIMI_K2_VOCAB, kimi_k2()),
        "qwen3-30b-a3b" => (QWEN3_VOCAB, qwen3_30b_a3b()),
        _ => return None,
    };
    Some(ModelDesc {
        name: name.to_string(),
        vocab_size,
        params,
    })
}

/// Appends params in registration order.
#[derive(Default)]
struct Params(Vec<ParamSpec>);

impl Params {
    fn add(&mut self, name: String, shape: &[u64]) -> &mut ParamSpec {
        let index = self.0.len();
        self.0.push(ParamSpec::new(name, shape, Dtype::Bf16));
        &mut self.0[index]
    }

    fn vector(&mut self, name: String, len: u64) {
        self.add(name, &[len]);
    }

    fn matrix(&mut self, name: String, rows: u64, cols: u64) {
        self.add(name, &[rows, cols]);
    }

    /// A matrix of stacked components along dim 0.
    fn fused(&mut self, name: String, splits: &[u64], cols: u64) {
        let spec = self.add(name, &[splits.iter().sum(), cols]);
        spec.split_sizes = splits.to_vec();
    }

    fn flagged(&mut self, name: String, shape: &[u64], flags: u32, tie_group: u32) {
        let spec = self.add(name, shape);
        spec.flags = ParamFlags(flags);
        spec.tie_group = tie_group;
    }

    /// An `[experts, sum(splits), cols]` expert stack.
    fn experts(&mut self, name: String, experts: u64, splits: &[u64], cols: u64) {
        let spec = self.add(name, &[experts, splits.iter().sum(), cols]);
        spec.flags = ParamFlags(ParamFlags::EXPERT_STACK);
        if splits.len() > 1 {
            spec.split_sizes = splits.to_vec();
        }
    }
}

const GPT2_VOCAB: u64 = 50257;

fn gpt2_124m() -> Vec<ParamSpec> {
    let (hidden, layers, ctx) = (768, 12, 1024);
    let emb = ParamFlags::EMBEDDING_OR_OUTPUT;
    let mut p = Params::default();
    p.flagged("embedding.word_embeddings.weight".into(), &[GPT2_VOCAB, hidden], emb, 0);
    p.flagged("embedding.position_embeddings.weight".into(), &[ctx, hidden], emb, 0);
    for i in 0..layers {
        let l = format!("layers.{i}");
        p.vector(format!("{l}.input_layernorm.weight"), hidden);
        p.vector(format!("{l}.input_layernorm.bias"), hidden);
        p.fused(format!("{l}.self_attention.qkv.weight"), &[hidden; 3], hidden);
        p.vector(format!("{l}.self_attention.qkv.bias"), 3 * hidden);
        p.matrix(format!("{l}.self_attention.proj.weight"), hidden, hidden);
        p.vector(format!("{l}.self_attention.proj.bias"), hidden);
        p.vector(format!("{l}.pre_mlp_layernorm.weight"), hidden);
        p.vector(format!("{l}.pre_mlp_layernorm.bias"), hidden);
        p.matrix(format!("{l}.mlp.fc1.weight"), 4 * hidden, hidden);
        p.vector(format!("{l}.mlp.fc1.bias"), 4 * hidden);
        p.matrix(format!("{l}.mlp.fc2.weight"), hidden, 4 * hidden);
        p.vector(format!("{l}.mlp.fc2.bias"), hidden);
    }
    p.vector("final_layernorm.weight".into(), hidden);
    p.vector("final_layernorm.bias".into(), hidden);
    p.0
}

const LLAMA3_VOCAB: u64 = 128_256;

/// Shape of a Llama 3 model.
struct Llama {
    hidden: u64,
    layers: u64,
    heads: u64,
    kv_heads: u64,
    ffn: u64,
}

const LLAMA3_8B: Llama = Llama {
    hidden: 4096,
    layers: 32,
    heads: 32,
    kv_heads: 8,
    ffn: 14336,
};
const LLAMA3_70B: Llama = Llama {
    hidden: 8192,
    layers: 80,
    heads: 64,
    kv_heads: 8,
    ffn: 28672,
};

fn llama3(m: &Llama) -> Vec<ParamSpec> {
    let emb = ParamFlags::EMBEDDING_OR_OUTPUT;
    let kv = m.hidden / m.heads * m.kv_heads;
    let mut p = Params::default();
    p.flagged(
        "embedding.word_embeddings.weight".into(),
        &[LLAMA3_VOCAB, m.hidden],
        emb,
        0,
    );
    for i in 0..m.layers {
        let l = format!("layers.{i}");
        p.vector(format!("{l}.input_layernorm.weight"), m.hidden);
        p.fused(format!("{l}.self_attention.qkv.weight"), &[m.hidden, kv, kv], m.hidden);
        p.matrix(format!("{l}.self_attention.proj.weight"), m.hidden, m.hidden);
        p.vector(format!("{l}.pre_mlp_layernorm.weight"), m.hidden);
        p.fused(format!("{l}.mlp.fc1.weight"), &[m.ffn, m.ffn], m.hidden);
        p.matrix(format!("{l}.mlp.fc2.weight"), m.hidden, m.ffn);
    }
    p.vector("final_layernorm.weight".into(), m.hidden);
    p.flagged("output_layer.weight".into(), &[LLAMA3_VOCAB, m.hidden], emb, 0);
    p.0
}

const DSV3_VOCAB: u64 = 129_280;
const DSV3_HIDDEN: u64 = 7168;
const DSV3_LAYERS: u64 = 61;
const DSV3_DENSE_LAYERS: u64 = 3;
const DSV3_EXPERTS: u64 = 256;
/// Tie group of the embedding and its copy on the multi-token-prediction stage.
const DSV3_EMBEDDING_TIE: u32 = 1;

/// A DeepSeek-V3-style model (multi-head latent attention, dense then MoE layers): the
/// fields of its Hugging Face `config.json`.
struct Mla {
    hidden: u64,
    heads: u64,
    q_lora: u64,
    kv_lora: u64,
    /// `qk_rope_head_dim`, `qk_nope_head_dim`, `v_head_dim`.
    rope: u64,
    nope: u64,
    v: u64,
    /// `intermediate_size` (dense layers) and `moe_intermediate_size`.
    dense_ffn: u64,
    moe_ffn: u64,
    experts: u64,
    /// `n_shared_experts` (each of `moe_intermediate_size`).
    shared: u64,
}

/// DeepSeek-V3 (deepseek-ai/DeepSeek-V3 config.json).
const DSV3: Mla = Mla {
    hidden: DSV3_HIDDEN,
    heads: 128,
    q_lora: 1536,
    kv_lora: 512,
    rope: 64,
    nope: 128,
    v: 128,
    dense_ffn: 18432,
    moe_ffn: 2048,
    experts: DSV3_EXPERTS,
    shared: 1,
};

/// One MLA transformer layer: its attention and a dense or MoE MLP.
fn mla_layer(p: &mut Params, m: &Mla, l: &str, moe: bool) {
    let h = m.hidden;
    let heads = m.heads;
    p.vector(format!("{l}.input_layernorm.weight"), h);
    p.matrix(format!("{l}.self_attention.q_a_proj.weight"), m.q_lora, h);
    p.vector(format!("{l}.self_attention.q_a_layernorm.weight"), m.q_lora);
    p.matrix(
        format!("{l}.self_attention.q_b_proj.weight"),
        heads * (m.nope + m.rope),
        m.q_lora,
    );
    p.fused(format!("{l}.self_attention.kv_a_proj.weight"), &[m.kv_lora, m.rope], h);
    p.vector(format!("{l}.self_attention.kv_a_layernorm.weight"), m.kv_lora);
    p.matrix(
        format!("{l}.self_attention.kv_b_proj.weight"),
        heads * (m.nope + m.v),
        m.kv_lora,
    );
    p.matrix(format!("{l}.self_attention.o_proj.weight"), h, heads * m.v);
    p.vector(format!("{l}.pre_mlp_layernorm.weight"), h);
    if !moe {
        let ffn = m.dense_ffn;
        p.fused(format!("{l}.mlp.fc1.weight"), &[ffn, ffn], h);
        p.matrix(format!("{l}.mlp.fc2.weight"), h, ffn);
        return;
    }
    let ffn = m.moe_ffn;
    p.flagged(
        format!("{l}.mlp.router.weight"),
        &[m.experts, h],
        ParamFlags::NO_MUON,
        0,
    );
    p.vector(format!("{l}.mlp.router.expert_bias"), m.experts);
    p.experts(format!("{l}.mlp.experts.fc1.weight"), m.experts, &[ffn, ffn], h);
    p.experts(format!("{l}.mlp.experts.fc2.weight"), m.experts, &[h], ffn);
    let shared = m.shared * ffn;
    p.fused(format!("{l}.mlp.shared_experts.fc1.weight"), &[shared, shared], h);
    p.matrix(format!("{l}.mlp.shared_experts.fc2.weight"), h, shared);
}

fn deepseek_v3_like() -> Vec<ParamSpec> {
    let h = DSV3_HIDDEN;
    let emb = ParamFlags::EMBEDDING_OR_OUTPUT;
    let mut p = Params::default();
    p.flagged(
        "embedding.word_embeddings.weight".into(),
        &[DSV3_VOCAB, h],
        emb,
        DSV3_EMBEDDING_TIE,
    );
    for i in 0..DSV3_LAYERS {
        mla_layer(&mut p, &DSV3, &format!("layers.{i}"), i >= DSV3_DENSE_LAYERS);
    }
    p.vector("final_layernorm.weight".into(), h);
    p.flagged("output_layer.weight".into(), &[DSV3_VOCAB, h], emb, 0);
    let mtp = "mtp.0";
    p.flagged(
        format!("{mtp}.embedding.word_embeddings.weight"),
        &[DSV3_VOCAB, h],
        emb,
        DSV3_EMBEDDING_TIE,
    );
    p.vector(format!("{mtp}.enorm.weight"), h);
    p.vector(format!("{mtp}.hnorm.weight"), h);
    p.matrix(format!("{mtp}.eh_proj.weight"), h, 2 * h);
    mla_layer(&mut p, &DSV3, &format!("{mtp}.layer"), true);
    p.vector(format!("{mtp}.final_layernorm.weight"), h);
    p.0
}

/// Kimi K2 (moonshotai/Kimi-K2-Instruct config.json): DeepSeek-V3's architecture with 64
/// heads, 384 routed experts (8 per token) and 1 shared expert, one dense first layer
/// (`first_k_dense_replace` 1), a 163,840-token vocabulary, untied embeddings and no
/// multi-token prediction.
const KIMI_K2: Mla = Mla {
    heads: 64,
    experts: 384,
    ..DSV3
};
const KIMI_K2_VOCAB: u64 = 163_840;
const KIMI_K2_LAYERS: u64 = 61;

fn kimi_k2() -> Vec<ParamSpec> {
    let (h, emb) = (KIMI_K2.hidden, ParamFlags::EMBEDDING_OR_OUTPUT);
    let mut p = Params::default();
    p.flagged("embedding.word_embeddings.weight".into(), &[KIMI_K2_VOCAB, h], emb, 0);
    for i in 0..KIMI_K2_LAYERS {
        mla_layer(&mut p, &KIMI_K2, &format!("layers.{i}"), i >= 1);
    }
    p.vector("final_layernorm.weight".into(), h);
    p.flagged("output_layer.weight".into(), &[KIMI_K2_VOCAB, h], emb, 0);
    p.0
}

const QWEN3_VOCAB: u64 = 151_936;

/// Qwen3-30B-A3B (Qwen/Qwen3-30B-A3B config.json): 48 layers, hidden 2048, GQA with 32 query
/// and 4 key-value heads of `head_dim` 128 and QK RMSNorm, every layer MoE with 128 experts
/// (8 per token) of `moe_intermediate_size` 768 and no shared expert, untied embeddings.
fn qwen3_30b_a3b() -> Vec<ParamSpec> {
    let (h, layers, experts, ffn) = (2048, 48, 128, 768);
    let (q, kv, head) = (32 * 128, 4 * 128, 128);
    let emb = ParamFlags::EMBEDDING_OR_OUTPUT;
    let mut p = Params::default();
    p.flagged("embedding.word_embeddings.weight".into(), &[QWEN3_VOCAB, h], emb, 0);
    for i in 0..layers {
        let l = format!("layers.{i}");
        p.vector(format!("{l}.input_layernorm.weight"), h);
        p.fused(format!("{l}.self_attention.qkv.weight"), &[q, kv, kv], h);
        p.vector(format!("{l}.self_attention.q_layernorm.weight"), head);
        p.vector(format!("{l}.self_attention.k_layernorm.weight"), head);
        p.matrix(format!("{l}.self_attention.proj.weight"), h, q);
        p.vector(format!("{l}.pre_mlp_layernorm.weight"), h);
        p.flagged(format!("{l}.mlp.router.weight"), &[experts, h], ParamFlags::NO_MUON, 0);
        p.experts(format!("{l}.mlp.experts.fc1.weight"), experts, &[ffn, ffn], h);
        p.experts(format!("{l}.mlp.experts.fc2.weight"), experts, &[h], ffn);
    }
    p.vector("final_layernorm.weight".into(), h);
    p.flagged("output_layer.weight".into(), &[QWEN3_VOCAB, h], emb, 0);
    p.0
}

/// A model's attention, for its causal-attention FLOPs: query heads and the query-key and
/// value head dimensions (MLA: `qk_nope + qk_rope` and `v_head_dim`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attention {
    pub heads: u64,
    pub qk_head_dim: u64,
    pub v_head_dim: u64,
}

impl Attention {
    /// Whether `name` is the param that closes an attention layer (its output projection):
    /// the layer's attention FLOPs are counted with it.
    pub fn closes_layer(name: &str) -> bool {
        name.ends_with(".self_attention.proj.weight") || name.ends_with(".self_attention.o_proj.weight")
    }
}

/// The attention of the preset called `name` (its config's heads and head dimensions).
pub fn attention(name: &str) -> Option<Attention> {
    let (heads, qk_head_dim, v_head_dim) = match name {
        "gpt2-124m" => (12, 64, 64),
        "llama3-8b" => (LLAMA3_8B.heads, 128, 128),
        "llama3-70b" => (LLAMA3_70B.heads, 128, 128),
        "deepseek-v3-like" => (DSV3.heads, DSV3.nope + DSV3.rope, DSV3.v),
        "kimi-k2" => (KIMI_K2.heads, KIMI_K2.nope + KIMI_K2.rope, KIMI_K2.v),
        "qwen3-30b-a3b" => (32, 128, 128),
        _ => return None,
    };
    Some(Attention {
        heads,
        qk_head_dim,
        v_head_dim,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Route;

    fn total(name: &str) -> u64 {
        preset(name).unwrap().params.iter().map(ParamSpec::numel).sum()
    }

    fn total_without_mtp(name: &str) -> u64 {
        let params = preset(name).unwrap().params;
        params
            .iter()
            .filter(|p| !p.name.starts_with("mtp."))
            .map(ParamSpec::numel)
            .sum()
    }

    /// Megatron's TP sharding of llama3-8b at TP 8: QKV [4096 | 1024 | 1024] rows become
    /// [512 | 128 | 128], fc1's gate|up halves 1792 rows each, proj and fc2 lose 7/8 of their
    /// columns; norms and the embedding stay whole; TP 3 divides nothing and says which param.
    #[test]
    fn tensor_parallel_shards_the_column_and_row_parallel_matrices() {
        let model = preset("llama3-8b").unwrap();
        let tp = model.with_tensor_parallel(8).unwrap();
        let find = |m: &ModelDesc, name: &str| m.params.iter().find(|p| p.name == name).unwrap().clone();
        let qkv = find(&tp, "layers.0.self_attention.qkv.weight");
        assert_eq!(
            (qkv.shape.clone(), qkv.split_sizes.clone()),
            (vec![768, 4096], vec![512, 128, 128])
        );
        assert!(qkv.flags.has(ParamFlags::TP_SHARD_ROWS));
        let fc1 = find(&tp, "layers.0.mlp.fc1.weight");
        assert_eq!(
            (fc1.shape.clone(), fc1.split_sizes.clone()),
            (vec![3584, 4096], vec![1792, 1792])
        );
        for (name, cols) in [
            ("layers.0.self_attention.proj.weight", 512),
            ("layers.0.mlp.fc2.weight", 1792),
        ] {
            let spec = find(&tp, name);
            assert_eq!(spec.shape[1], cols, "{name}");
            assert!(spec.flags.has(ParamFlags::TP_SHARD_COLS), "{name}");
        }
        let untouched = |name: &str| find(&tp, name) == find(&model, name);
        assert!(untouched("layers.0.input_layernorm.weight") && untouched("embedding.word_embeddings.weight"));
        let err = model.with_tensor_parallel(3).unwrap_err();
        assert!(
            err.message.contains("tp 3 does not divide") && err.message.contains("qkv.weight"),
            "{err}"
        );
    }

    /// DeepSeek-V3's 61 layers over 16 stages: stage 8 holds layers 30–33 (MoE layers only),
    /// stage 0 the embedding and layers 0–2, stage 15 layers 57–60, the output layer and the
    /// multi-token-prediction module; the stages partition the model.
    #[test]
    fn pipeline_stages_split_the_layers_evenly_and_partition_the_model() {
        let model = preset("deepseek-v3-like").unwrap();
        let names = |stage: usize| -> Vec<String> {
            let desc = model.pipeline_stage(16, stage).unwrap();
            desc.params.into_iter().map(|p| p.name).collect()
        };
        let layers = |names: &[String]| {
            let mut l: Vec<&str> = names
                .iter()
                .filter_map(|n| n.strip_prefix("layers.")?.split('.').next())
                .collect();
            l.dedup();
            l.join(",")
        };
        let middle = names(8);
        assert_eq!(layers(&middle), "30,31,32,33");
        assert!(middle.iter().all(|n| n.starts_with("layers.")));
        let first = names(0);
        assert_eq!(layers(&first), "0,1,2");
        assert_eq!(first[0], "embedding.word_embeddings.weight");
        let last = names(15);
        assert_eq!(layers(&last), "57,58,59,60");
        assert!(last.iter().any(|n| n == "output_layer.weight") && last.iter().any(|n| n.starts_with("mtp.")));
        let all: Vec<String> = (0..16).flat_map(names).collect();
        let whole: Vec<String> = model.params.iter().map(|p| p.name.clone()).collect();
        assert_eq!(all, whole);
        let err = model.pipeline_stage(64, 0).unwrap_err();
        assert!(err.message.contains("61 layers"), "{err}");
    }

    /// EP 64 leaves 4 of DeepSeek-V3's 256 experts in every stack and touches nothing else;
    /// EP 3 divides no stack and says which.
    #[test]
    fn expert_parallel_keeps_a_share_of_every_expert_stack() {
        let model = preset("deepseek-v3-like").unwrap();
        let ep = model.with_expert_parallel(64).unwrap();
        for (whole, part) in model.params.iter().zip(&ep.params) {
            if whole.is_expert_stack() {
                assert_eq!(part.shape, [4, whole.shape[1], whole.shape[2]], "{}", whole.name);
            } else {
                assert_eq!(part, whole);
            }
        }
        let err = model.with_expert_parallel(3).unwrap_err();
        assert!(err.message.contains("ep 3 does not divide the 256 experts"), "{err}");
    }

    #[test]
    fn preset_sizes_match_the_published_models() {
        assert_eq!(total("gpt2-124m"), 124_439_808);
        assert!((8.02e9..8.04e9).contains(&(total("llama3-8b") as f64)));
        assert!((70.5e9..70.6e9).contains(&(total("llama3-70b") as f64)));
        assert!((670.5e9..671.5e9).contains(&(total_without_mtp("deepseek-v3-like") as f64)));
        // Kimi K2: "1 trillion total parameters" (its model card); Qwen3-30B-A3B: 30.5B.
        assert!((1.02e12..1.035e12).contains(&(total("kimi-k2") as f64)));
        assert!((30.4e9..30.6e9).contains(&(total("qwen3-30b-a3b") as f64)));
        let mtp = total("deepseek-v3-like") - total_without_mtp("deepseek-v3-like");
        assert!(
            (12e9..13e9).contains(&(mtp as f64)),
            "multi-token-prediction stage: {mtp}"
        );
    }

    #[test]
    fn every_preset_registers_and_routes_as_documented() {
        for &name in PRESET_NAMES {
            let model = preset(name).unwrap();
            let cfg = Config {
                vocab_size: model.vocab_size,
                ..Config::default()
            };
            let registry = model.registry(&cfg).unwrap();
            for (spec, route) in registry.params().iter().zip(registry.routes()) {
                let expect_muon = spec.shape.len() >= 2
                    && !spec.flags.has(ParamFlags::EMBEDDING_OR_OUTPUT)
                    && !spec.name.ends_with("router.weight");
                assert_eq!(*route == Route::Muon, expect_muon, "{name}: {}", spec.name);
            }
        }
        assert!(preset("gpt3").is_none());
    }
}

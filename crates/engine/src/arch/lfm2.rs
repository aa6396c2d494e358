//! LFM2 (Liquid): a hybrid of gated short-convolution layers ("conv") and GQA attention layers
//! with per-head q/k RMSNorm, SwiGLU FFN (w1/w3/w2), plain-gain RMSNorms, a final norm HF calls
//! `embedding_norm` (GGUF: `token_embd_norm`), tied embeddings.
//!
//! Quirks: the FFN width is recomputed from the config (`block_auto_adjust_ff_dim`: 2/3 of it,
//! times `block_ffn_dim_multiplier`, rounded up to `block_multiple_of`), as transformers'
//! Lfm2MLP does; the convolution length is `conv_L_cache`. GGUF marks the conv layers by a 0
//! in the per-layer `attention.head_count_kv` array and stores the recomputed FFN width.

use cortiq_formats::gguf::GgufMeta;
use cortiq_formats::hf::{ClassDefaults, HfClass, HfConfig};
use cortiq_formats::names::{ATTN_QKV, Bias, Experts, LayerRow, NameTable};
use cortiq_kernels::ops::RopeStyle;

use super::{Arch, GgufKeys, KvOverride, gguf_dense_base, hf_dense_base};
use crate::config::{LayerSpec, MixerKind, ModelConfig};
use crate::error::{EngineError, Result};
use crate::moe::{ExpertAct, MoeConfig, Scoring};

pub const ARCH: Arch = Arch {
    name: "lfm2",
    hf_names: &["Lfm2ForCausalLM", "lfm2"],
    from_gguf,
    from_hf,
    hf_norm_offset: 0.0,
    hf_plain_norms: &[],
    hf_fix: None,
    // Lfm2Config (hidden_act: LFM2 has no key, its MLP is SwiGLU).
    hf_class: HfClass {
        defaults: Some(ClassDefaults {
            vocab_size: 65536,
            hidden_size: 2560,
            intermediate_size: 12288,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_key_value_heads: Some(8),
            head_dim: None,
            hidden_act: "silu",
            max_position_embeddings: 128_000,
            rms_norm_eps: 1e-5,
            bos: Some(1),
            eos: Some(2),
            pad: Some(0),
            sliding_window: None,
            query_pre_attn_scalar: None,
        }),
        tie_word_embeddings: true,
        rope_theta: (1_000_000.0, 1_000_000.0),
        ..HfClass::GENERIC
    },
    names: NameTable {
        // The final norm: HF embedding_norm, llama.cpp token_embd_norm.
        global: &[
            ("model.embed_tokens.weight", "token_embd.weight"),
            ("lm_head.weight", "output.weight"),
            ("model.embedding_norm.weight", "token_embd_norm.weight"),
        ],
        layer: &[ATTN_QKV, LAYER],
        bare: &[],
        experts: None,
        mtp: false,
    },
};

/// LFM2's own spellings of the block (its attention input norm, output projection and
/// q/k norms, the w1/w3/w2 MLP) and the short convolution.
const LAYER: &[LayerRow] = &[
    ("operator_norm", "attn_norm", Bias::No),
    ("self_attn.out_proj", "attn_output", Bias::Yes),
    ("self_attn.q_layernorm", "attn_q_norm", Bias::No),
    ("self_attn.k_layernorm", "attn_k_norm", Bias::No),
    ("ffn_norm", "ffn_norm", Bias::No),
    ("feed_forward.w1", "ffn_gate", Bias::No),
    ("feed_forward.w3", "ffn_up", Bias::No),
    ("feed_forward.w2", "ffn_down", Bias::No),
    ("conv.in_proj", "shortconv.in_proj", Bias::Yes),
    ("conv.conv", "shortconv.conv", Bias::Yes),
    ("conv.out_proj", "shortconv.out_proj", Bias::Yes),
];

fn from_hf(h: &HfConfig) -> Result<ModelConfig> {
    let mut cfg = hf_dense_base(h, "lfm2")?;
    let bad = |what: String| EngineError::BadConfig { file: h.path.display().to_string(), what };
    let raw = &h.raw;
    let get_bool = |k: &str, d: bool| raw.get(k).and_then(|v| v.as_bool()).unwrap_or(d);
    let kernel = raw.get("conv_L_cache").and_then(|v| v.as_u64()).unwrap_or(3) as usize;
    if kernel == 0 {
        return Err(bad("conv_L_cache must be at least 1".into()));
    }
    let bias = get_bool("conv_bias", false);
    // Lfm2MLP's width rule.
    if get_bool("block_auto_adjust_ff_dim", true) {
        let mut ff = (2 * h.intermediate_size) / 3;
        if let Some(m) = raw.get("block_ffn_dim_multiplier").filter(|v| !v.is_null()) {
            let m = m.as_f64().ok_or_else(|| bad("block_ffn_dim_multiplier must be a number".into()))?;
            ff = (m * ff as f64) as usize;
            let multiple = raw.get("block_multiple_of").and_then(|v| v.as_u64()).unwrap_or(256) as usize;
            if multiple == 0 {
                return Err(bad("block_multiple_of must be at least 1".into()));
            }
            ff = ff.div_ceil(multiple) * multiple;
        }
        cfg.d_ff = ff;
    }
    hf_layers(h, &mut cfg, kernel, bias)?;
    Ok(cfg)
}

/// The conv / attention layers of an HF config (and the q/k norms and final norm every LFM2
/// has).
fn hf_layers(h: &HfConfig, cfg: &mut ModelConfig, kernel: usize, bias: bool) -> Result<()> {
    let bad = |what: String| EngineError::BadConfig { file: h.path.display().to_string(), what };
    cfg.qk_norm = true;
    cfg.output_norm = "token_embd_norm.weight";
    cfg.layers = h
        .layer_types
        .iter()
        .enumerate()
        .map(|(i, t)| match t.as_str() {
            "conv" => Ok(LayerSpec {
                mixer: MixerKind::ShortConv { kernel, bias },
                moe: false,
                sliding_window: None,
                rope: 0,
                ffn: true,
            }),
            "full_attention" => Ok(LayerSpec::attention(0)),
            other => Err(bad(format!("layer_types[{i}] = '{other}': LFM2 layers are 'conv' or 'full_attention'"))),
        })
        .collect::<Result<_>>()?;
    Ok(())
}

fn from_gguf(g: &dyn GgufMeta) -> Result<ModelConfig> {
    gguf_layers(g, "lfm2")
}

/// The conv / attention layers of an `lfm2` or `lfm2moe` file.
fn gguf_layers(g: &dyn GgufMeta, arch: &'static str) -> Result<ModelConfig> {
    let k = GgufKeys { g, arch };
    let n_layers = k.usize("block_count")?;
    // head_count_kv is per layer: 0 marks a conv layer.
    let key = if arch == "lfm2" { "lfm2.attention.head_count_kv" } else { "lfm2moe.attention.head_count_kv" };
    let kv: Vec<usize> = match g.get(key) {
        Some(v) => match v.as_array() {
            Some(a) => a
                .iter()
                .map(|x| x.as_i64().map(|x| x as usize))
                .collect::<Option<_>>()
                .ok_or_else(|| k.bad(format!("{key}: expected integers")))?,
            None => vec![v.as_i64().ok_or_else(|| k.bad(format!("{key}: expected an integer or an array")))? as usize; n_layers],
        },
        None => return Err(k.bad(format!("missing metadata key '{key}'"))),
    };
    if kv.len() != n_layers {
        return Err(k.bad(format!("{key} has {} entries for {n_layers} layers", kv.len())));
    }
    let n_kv = kv.iter().copied().filter(|&x| x > 0).max().ok_or_else(|| k.bad(format!("{key}: no attention layer")))?;
    if kv.iter().any(|&x| x != 0 && x != n_kv) {
        return Err(k.bad(format!("{key}: attention layers disagree on the kv head count ({kv:?})")));
    }
    let kernel = k.usize("shortconv.l_cache")?;
    // gguf_dense_base wants one kv head count: read the rest through it, then fix up.
    let mut cfg = gguf_dense_base(&KvOverride::new(g, key, n_kv), arch, RopeStyle::NeoX)?;
    cfg.qk_norm = true;
    cfg.output_norm = "token_embd_norm.weight";
    cfg.layers = kv
        .iter()
        .map(|&x| {
            if x == 0 {
                LayerSpec {
                    mixer: MixerKind::ShortConv { kernel, bias: false },
                    moe: false,
                    sliding_window: None,
                    rope: 0,
                    ffn: true,
                }
            } else {
                LayerSpec::attention(0)
            }
        })
        .collect();
    Ok(cfg)
}

/// LFM2-MoE (`Lfm2MoeForCausalLM`, llama.cpp's `lfm2moe`; LFM2-8B-A1B): LFM2's conv and
/// attention layers with a dense SwiGLU in the first `num_dense_layers` layers (width
/// `intermediate_size`, no auto-adjustment) and a mixture of experts after: sigmoid scores,
/// experts chosen by score + `expert_bias` (selection only), weighted by the scores
/// renormalized over the top k (+1e-6) and × `routed_scaling_factor`; no shared expert.
pub const ARCH_MOE: Arch = Arch {
    name: "lfm2moe",
    hf_names: &["Lfm2MoeForCausalLM", "lfm2_moe"],
    from_gguf: moe_from_gguf,
    from_hf: moe_from_hf,
    hf_norm_offset: 0.0,
    hf_plain_norms: &[],
    hf_fix: None,
    // Lfm2MoeConfig.
    hf_class: HfClass {
        defaults: Some(ClassDefaults {
            vocab_size: 65536,
            hidden_size: 2048,
            intermediate_size: 7168,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_key_value_heads: Some(8),
            head_dim: None,
            hidden_act: "silu",
            max_position_embeddings: 128_000,
            rms_norm_eps: 1e-5,
            bos: Some(1),
            eos: Some(2),
            pad: Some(0),
            sliding_window: None,
            query_pre_attn_scalar: None,
        }),
        tie_word_embeddings: true,
        rope_theta: (1_000_000.0, 1_000_000.0),
        ..HfClass::GENERIC
    },
    names: NameTable {
        global: ARCH.names.global,
        layer: &[ATTN_QKV, LAYER, &[("feed_forward.gate", "ffn_gate_inp", Bias::No)]],
        bare: &[&[("feed_forward.expert_bias", "exp_probs_b.bias")]],
        experts: Some(Experts {
            prefix: "feed_forward.experts.",
            projs: &[("w1", "ffn_gate_exps"), ("w3", "ffn_up_exps"), ("w2", "ffn_down_exps")],
        }),
        mtp: false,
    },
};

/// The router's renormalization epsilon (Lfm2MoeTopKRouter).
const MOE_TOPK_EPS: f32 = 1e-6;

fn moe_from_hf(h: &HfConfig) -> Result<ModelConfig> {
    let mut cfg = hf_dense_base(h, "lfm2moe")?;
    let bad = |what: String| EngineError::BadConfig { file: h.path.display().to_string(), what };
    let raw = &h.raw;
    let int = |k: &str, d: u64| raw.get(k).and_then(|v| v.as_u64()).unwrap_or(d) as usize;
    let kernel = int("conv_L_cache", 3);
    if kernel == 0 {
        return Err(bad("conv_L_cache must be at least 1".into()));
    }
    hf_layers(h, &mut cfg, kernel, raw.get("conv_bias").and_then(|v| v.as_bool()).unwrap_or(false))?;
    let mc = MoeConfig {
        n_experts: int("num_experts", 32),
        top_k: int("num_experts_per_tok", 4),
        scoring: Scoring::Sigmoid,
        norm_topk: raw.get("norm_topk_prob").and_then(|v| v.as_bool()).unwrap_or(true),
        topk_eps: MOE_TOPK_EPS,
        routed_scale: raw.get("routed_scaling_factor").and_then(|v| v.as_f64()).unwrap_or(1.0) as f32,
        d_ff_expert: int("moe_intermediate_size", 1792),
        d_ff_shared: None,
        shared_gate: false,
        act: ExpertAct::Gated,
        ungated: false,
    };
    set_moe(&mut cfg, mc, int("num_dense_layers", 2)).map_err(bad)?;
    Ok(cfg)
}

fn moe_from_gguf(g: &dyn GgufMeta) -> Result<ModelConfig> {
    let mut cfg = gguf_layers(g, "lfm2moe")?;
    let k = GgufKeys { g, arch: "lfm2moe" };
    // llama.cpp's gating function ids: 1 softmax, 2 sigmoid.
    if k.opt_usize("expert_gating_func")?.is_some_and(|f| f != 2) {
        return Err(k.bad("lfm2moe.expert_gating_func: only sigmoid (2) is an LFM2-MoE router".into()));
    }
    let mc = MoeConfig {
        n_experts: k.usize("expert_count")?,
        top_k: k.usize("expert_used_count")?,
        scoring: Scoring::Sigmoid,
        norm_topk: g.get("lfm2moe.expert_weights_norm").and_then(|v| v.as_bool()).unwrap_or(true),
        topk_eps: MOE_TOPK_EPS,
        routed_scale: k.opt_f64("expert_weights_scale")?.unwrap_or(1.0) as f32,
        d_ff_expert: k.usize("expert_feed_forward_length")?,
        d_ff_shared: None,
        shared_gate: false,
        act: ExpertAct::Gated,
        ungated: false,
    };
    set_moe(&mut cfg, mc, k.opt_usize("leading_dense_block_count")?.unwrap_or(0)).map_err(|e| k.bad(e))?;
    Ok(cfg)
}

/// Layers from `n_dense` on are the experts'.
fn set_moe(cfg: &mut ModelConfig, mc: MoeConfig, n_dense: usize) -> std::result::Result<(), String> {
    if mc.top_k == 0 || mc.top_k > mc.n_experts {
        return Err(format!("{} experts per token of {}", mc.top_k, mc.n_experts));
    }
    for (i, l) in cfg.layers.iter_mut().enumerate() {
        l.moe = i >= n_dense;
    }
    cfg.moe = Some(mc);
    Ok(())
}

//! Qwen3.5 (text): a hybrid of GatedDeltaNet layers ("linear_attention") and gated attention
//! layers ("full_attention": q_proj yields [q | gate] per head, the output multiplied by
//! σ(gate), per-head q/k RMSNorm, partial RoPE), SwiGLU FFN, (1+w) RMSNorms everywhere except
//! the GatedDeltaNet output norm (plain w), A_log stored by HF and turned into −exp(A_log).
//!
//! GGUF files (llama.cpp's `qwen35`): `block_count` includes the MTP blocks
//! (`nextn_predict_layers`), `attention.recurrent_layers` marks the GatedDeltaNet layers, the
//! (1+w) norms are stored folded, the pre-FFN norm is named `post_attention_norm`, A is stored
//! as −exp(A_log), and value heads are reordered so that head h uses key head h % n_k.
//!
//! HF folders come in two layouts with the same text model: the text-only `*ForCausalLM`
//! (flat config.json, `model.*` tensors) and the released multimodal
//! `*ForConditionalGeneration` (the text config under `text_config` beside a `vision_config`,
//! tensors under `model.language_model.*`, the vision tower's `model.visual.*` ignored).

use cortiq_formats::gguf::GgufMeta;
use cortiq_formats::hf::{HfClass, HfConfig};
use cortiq_formats::names::{
    ATTN_NORM_OUT, ATTN_QKV, Bias, DENSE_GLOBAL, LayerRow, MLP_EXPERTS, MOE_ROUTER, NameTable, PRE_FFN_NORM, Pair, QK_NORM,
    SHARED_EXPERT, SWIGLU,
};
use cortiq_kernels::ops::RopeStyle;

use super::{Arch, GgufKeys, gguf_dense_base, hf_dense_base};
use crate::config::{LayerSpec, MixerKind, ModelConfig};
use crate::error::{EngineError, Result};
use crate::mixers::gdn::{GdnConfig, OutGate};
use crate::moe::{ExpertAct, MoeConfig, Scoring};

pub const ARCH: Arch = Arch {
    name: "qwen35",
    hf_names: &["Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration", "qwen3_5_text", "qwen3_5"],
    from_gguf: |g| from_gguf_as(g, "qwen35"),
    from_hf: |h| from_hf_as(h, "qwen35"),
    hf_norm_offset: 1.0,
    hf_plain_norms: &["ssm_norm.weight"],
    hf_fix: None,
    hf_class: HfClass { text_model_type: Some("qwen3_5_text"), full_attention_interval: Some(4), ..HfClass::GENERIC },
    names: NameTable {
        global: DENSE_GLOBAL,
        layer: &[ATTN_QKV, ATTN_NORM_OUT, QK_NORM, PRE_FFN_NORM, SWIGLU, GDN, crate::mixers::vmf::NAMES],
        bare: BARE,
        experts: None,
        mtp: true,
    },
};

/// Qwen3.5-MoE: the same layers with a mixture-of-experts FFN everywhere (softmax routing,
/// top-k renormalized, a shared expert scaled by σ(shared_expert_gate·x)).
pub const ARCH_MOE: Arch = Arch {
    name: "qwen35moe",
    hf_names: &["Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe_text", "qwen3_5_moe"],
    from_gguf: |g| from_gguf_as(g, "qwen35moe"),
    from_hf: |h| from_hf_as(h, "qwen35moe"),
    hf_norm_offset: 1.0,
    hf_plain_norms: &["ssm_norm.weight"],
    hf_fix: None,
    hf_class: HfClass { text_model_type: Some("qwen3_5_moe_text"), full_attention_interval: Some(4), ..HfClass::GENERIC },
    names: NameTable { layer: MOE_LAYER, experts: Some(MLP_EXPERTS), ..ARCH.names },
};

/// Qwen3-Next: Qwen3.5-MoE's layers with fused GatedDeltaNet input projections (split at
/// load); llama.cpp's `qwen3next` files keep value heads in the grouped order.
pub const ARCH_NEXT: Arch = Arch {
    name: "qwen3next",
    hf_names: &["Qwen3NextForCausalLM", "qwen3_next"],
    from_gguf: |g| from_gguf_as(g, "qwen3next"),
    from_hf: |h| from_hf_as(h, "qwen3next"),
    hf_norm_offset: 1.0,
    hf_plain_norms: &["ssm_norm.weight"],
    hf_fix: None,
    // Qwen3NextConfig: partial_rotary_factor 0.25 when absent.
    hf_class: HfClass { full_attention_interval: Some(4), partial_rotary_factor: Some(0.25), ..HfClass::GENERIC },
    names: NameTable {
        layer: &[
            ATTN_QKV,
            ATTN_NORM_OUT,
            QK_NORM,
            PRE_FFN_NORM,
            SWIGLU,
            GDN,
            FUSED,
            MOE_ROUTER,
            SHARED_EXPERT,
            crate::mixers::vmf::NAMES,
        ],
        ..ARCH_MOE.names
    },
};

/// The GatedDeltaNet layers' projections, conv and output norm.
const GDN: &[LayerRow] = &[
    ("linear_attn.in_proj_qkv", "attn_qkv", Bias::No),
    ("linear_attn.in_proj_z", "attn_gate", Bias::No),
    ("linear_attn.in_proj_b", "ssm_beta", Bias::No),
    ("linear_attn.in_proj_a", "ssm_alpha", Bias::No),
    ("linear_attn.conv1d", "ssm_conv1d", Bias::No),
    ("linear_attn.norm", "ssm_norm", Bias::No),
    ("linear_attn.out_proj", "ssm_out", Bias::No),
];
/// Qwen3-Next's fused projections, split at load (grouped per key head: [q, k, v, z] and
/// [b, a]); llama.cpp splits qkvz itself (attn_qkv + attn_gate) but keeps ssm_ba fused.
const FUSED: &[LayerRow] =
    &[("linear_attn.in_proj_qkvz", "ssm_in_qkvz", Bias::No), ("linear_attn.in_proj_ba", "ssm_ba", Bias::No)];
/// Qwen3.5-MoE's layers: the dense ones with the router and the shared expert.
const MOE_LAYER: &[&[LayerRow]] =
    &[ATTN_QKV, ATTN_NORM_OUT, QK_NORM, PRE_FFN_NORM, SWIGLU, GDN, MOE_ROUTER, SHARED_EXPERT, crate::mixers::vmf::NAMES];
/// The GatedDeltaNet decay parameters and vmf_phase's.
const BARE: &[&[Pair]] =
    &[&[("linear_attn.dt_bias", "ssm_dt.bias"), ("linear_attn.A_log", "ssm_a")], crate::mixers::vmf::BARE_NAMES];

fn from_hf_as(h: &HfConfig, arch: &'static str) -> Result<ModelConfig> {
    let mut cfg = hf_dense_base(h, arch)?;
    let bad = |what: String| EngineError::BadConfig { file: h.path.display().to_string(), what };
    // The text model's keys: `text_config` of a released (multimodal) config, else the file.
    let raw = h.text_raw();
    let prefix = if h.outer_model_type.is_some() { "text_config." } else { "" };
    let get = |k: &str| -> Result<usize> {
        raw.get(k)
            .and_then(|v| v.as_u64())
            .map(|v| v as usize)
            .ok_or_else(|| bad(format!("missing or non-integer '{prefix}{k}'")))
    };
    let g = GdnConfig {
        d_model: cfg.d_model,
        n_k_heads: get("linear_num_key_heads")?,
        n_v_heads: get("linear_num_value_heads")?,
        d_k: get("linear_key_head_dim")?,
        d_v: get("linear_value_head_dim")?,
        conv_kernel: get("linear_conv_kernel_dim")?,
        norm_eps: cfg.norm_eps,
        out_gate: OutGate::Silu,
        v_tiled: false,
    };
    if g.n_k_heads == 0 || !g.n_v_heads.is_multiple_of(g.n_k_heads) || g.d_k == 0 || g.d_v == 0 || g.conv_kernel == 0 {
        return Err(bad(format!(
            "linear attention geometry: {} key heads x {}, {} value heads x {}, conv kernel {} is not valid",
            g.n_k_heads, g.d_k, g.n_v_heads, g.d_v, g.conv_kernel
        )));
    }
    let moe = arch != "qwen35";
    if moe {
        cfg.moe = Some(MoeConfig {
            n_experts: get("num_experts")?,
            top_k: get("num_experts_per_tok")?,
            scoring: Scoring::Softmax,
            // Qwen3.5-MoE's router always renormalizes; Qwen3-Next's when norm_topk_prob.
            norm_topk: raw.get("norm_topk_prob").and_then(|v| v.as_bool()).unwrap_or(true),
            topk_eps: 0.0,
            routed_scale: 1.0,
            d_ff_expert: get("moe_intermediate_size")?,
            d_ff_shared: Some(get("shared_expert_intermediate_size")?),
            shared_gate: true,
            act: ExpertAct::Gated,
            ungated: false,
        });
    }
    cfg.qk_norm = true;
    cfg.attn_gate = true;
    cfg.layers = h
        .layer_types
        .iter()
        .enumerate()
        .map(|(i, t)| match t.as_str() {
            "linear_attention" => {
                Ok(LayerSpec { mixer: MixerKind::GatedDeltaNet(g), moe, sliding_window: None, rope: 0, ffn: true })
            }
            "full_attention" => Ok(LayerSpec { moe, ..LayerSpec::attention(0) }),
            other => Err(bad(format!(
                "{prefix}layer_types[{i}] = '{other}': Qwen3.5 layers are 'linear_attention' or 'full_attention'"
            ))),
        })
        .collect::<Result<_>>()?;
    Ok(cfg)
}

fn from_gguf_as(g: &dyn GgufMeta, arch: &'static str) -> Result<ModelConfig> {
    let k = GgufKeys { g, arch };
    let mut cfg = gguf_dense_base(g, arch, RopeStyle::NeoX)?;
    // block_count includes the multi-token-prediction blocks (kept in the file for speculative
    // decoding, not part of the forward pass).
    let mtp = k.opt_usize("nextn_predict_layers")?.unwrap_or(0);
    let n_layers =
        cfg.n_layers.checked_sub(mtp).filter(|&n| n > 0).ok_or_else(|| k.bad(format!("{mtp} MTP blocks of {}", cfg.n_layers)))?;
    let key = format!("{arch}.attention.recurrent_layers");
    let recurrent: Vec<bool> = g
        .get(&key)
        .and_then(|v| v.as_array())
        .and_then(|a| a.iter().map(|x| x.as_bool()).collect::<Option<Vec<bool>>>())
        .ok_or_else(|| k.bad(format!("missing or non-boolean '{key}'")))?;
    if recurrent.len() < n_layers {
        return Err(k.bad(format!("{key} has {} entries for {n_layers} layers", recurrent.len())));
    }
    let (n_k, n_v, d_k, inner) =
        (k.usize("ssm.group_count")?, k.usize("ssm.time_step_rank")?, k.usize("ssm.state_size")?, k.usize("ssm.inner_size")?);
    if n_k == 0 || n_v == 0 || n_v % n_k != 0 || inner % n_v != 0 || d_k == 0 {
        return Err(k.bad(format!("linear attention geometry: {n_k} key heads x {d_k}, {n_v} value heads, inner size {inner}")));
    }
    let gdn = GdnConfig {
        d_model: cfg.d_model,
        n_k_heads: n_k,
        n_v_heads: n_v,
        d_k,
        d_v: inner / n_v,
        conv_kernel: k.usize("ssm.conv_kernel")?,
        norm_eps: cfg.norm_eps,
        out_gate: OutGate::Silu,
        // llama.cpp's qwen35/qwen35moe converter reorders value heads so that head h uses key
        // head h % n_k; its qwen3next one keeps the grouped order.
        v_tiled: arch != "qwen3next",
    };
    let moe = arch != "qwen35";
    if moe {
        cfg.moe = Some(MoeConfig {
            n_experts: k.usize("expert_count")?,
            top_k: k.usize("expert_used_count")?,
            scoring: Scoring::Softmax,
            norm_topk: true,
            topk_eps: 0.0,
            routed_scale: 1.0,
            d_ff_expert: k.usize("expert_feed_forward_length")?,
            d_ff_shared: Some(k.usize("expert_shared_feed_forward_length")?),
            shared_gate: true,
            act: ExpertAct::Gated,
            ungated: false,
        });
    }
    cfg.n_layers = n_layers;
    cfg.qk_norm = true;
    cfg.attn_gate = true;
    cfg.ffn_norm = "post_attention_norm.weight";
    cfg.layers = recurrent[..n_layers]
        .iter()
        .map(|&r| {
            let mixer = if r { MixerKind::GatedDeltaNet(gdn) } else { MixerKind::Attention };
            LayerSpec { mixer, moe, sliding_window: None, rope: 0, ffn: true }
        })
        .collect();
    Ok(cfg)
}

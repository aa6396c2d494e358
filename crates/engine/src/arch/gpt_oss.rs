//! gpt-oss (`GptOssForCausalLM`, llama.cpp's `gpt-oss`; gpt-oss-20b / -120b): GQA attention
//! with biases on q, k, v and o and a learned sink logit per head in every softmax, sliding
//! (`sliding_window`, even layers) and full layers alternating, YaRN RoPE (NeoX pairs); every
//! layer a mixture of experts: router with a bias, softmax over the top-k logits, experts with
//! biases and the clamped SwiGLU (`ExpertAct::ClampedSwiGlu`: gate ≤ limit, up within ±limit,
//! (up + 1)·gate·σ(alpha·gate), alpha 1.702, limit 7).
//!
//! Checkpoint fixes: transformers stores the experts fused and transposed,
//! `mlp.experts.gate_up_proj` [E, d, 2·ff] with gate and up interleaved by column and
//! `down_proj` [E, ff, d]; `hf_fix` builds the [ff, d] / [d, ff] matrices per expert from
//! them (widened to f32: an HF folder of gpt-oss is for checking, the GGUF with MXFP4
//! experts is for running). The pre-FFN norm is `post_attention_layernorm`, llama.cpp's
//! `post_attention_norm`. llama.cpp's YaRN rounds the correction range outwards (what
//! transformers calls `truncate`); the released config says `truncate: false`, so an HF folder
//! and its GGUF differ there by design.

use cortiq_formats::gguf::GgufMeta;
use cortiq_formats::hf::{ClassDefaults, HfClass, HfConfig};
use cortiq_formats::names::{ATTN_NORM_OUT, ATTN_QKV, Bias, DENSE_GLOBAL, LayerRow, NameTable, Pair};
use cortiq_kernels::ops::RopeStyle;
use serde_json::Value;

use super::{Arch, GgufKeys, gguf_dense_base, hf_dense_base};
use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::moe::{ExpertAct, MoeConfig, Scoring};
use crate::qtensor::QTensor;

pub const ARCH: Arch = Arch {
    name: "gpt-oss",
    hf_names: &["GptOssForCausalLM", "gpt_oss"],
    from_gguf,
    from_hf,
    hf_norm_offset: 0.0,
    hf_plain_norms: &[],
    hf_fix: Some(super::HfFix { derive: hf_fix, derives: |s| DERIVED.contains(&s), replaces: hf_replaces }),
    // GptOssConfig.
    hf_class: HfClass {
        defaults: Some(ClassDefaults {
            vocab_size: 201088,
            hidden_size: 2880,
            intermediate_size: 2880,
            num_hidden_layers: 36,
            num_attention_heads: 64,
            num_key_value_heads: Some(8),
            head_dim: Some(64),
            hidden_act: "silu",
            max_position_embeddings: 131072,
            rms_norm_eps: 1e-5,
            bos: None,
            eos: None,
            pad: None,
            sliding_window: Some(128),
            query_pre_attn_scalar: None,
        }),
        ..HfClass::GENERIC
    },
    names: NameTable { global: DENSE_GLOBAL, layer: &[ATTN_QKV, ATTN_NORM_OUT, LAYER], bare: &[BARE], experts: None, mtp: false },
};

const LAYER: &[LayerRow] =
    &[("post_attention_layernorm", "post_attention_norm", Bias::No), ("mlp.router", "ffn_gate_inp", Bias::Yes)];
/// The sinks, and the fused experts under names of their own (`hf_fix` derives llama.cpp's).
const BARE: &[Pair] = &[
    ("self_attn.sinks", "attn_sinks.weight"),
    ("mlp.experts.gate_up_proj", "ffn_gate_up_exps_hf.weight"),
    ("mlp.experts.gate_up_proj_bias", "ffn_gate_up_exps_hf.bias"),
    ("mlp.experts.down_proj", "ffn_down_exps_hf.weight"),
    ("mlp.experts.down_proj_bias", "ffn_down_exps.bias"),
];

/// gpt-oss's SwiGLU constants (GptOssConfig's defaults; llama.cpp's graph hard-codes them).
const ALPHA: f32 = 1.702;
const LIMIT: f32 = 7.0;

fn moe(n_experts: usize, top_k: usize, ff: usize, alpha: f32, limit: f32) -> MoeConfig {
    MoeConfig {
        n_experts,
        top_k,
        scoring: Scoring::Softmax,
        norm_topk: true,
        topk_eps: 0.0,
        routed_scale: 1.0,
        d_ff_expert: ff,
        d_ff_shared: None,
        shared_gate: false,
        act: ExpertAct::ClampedSwiGlu { alpha, limit },
        ungated: false,
    }
}

fn from_hf(h: &HfConfig) -> Result<ModelConfig> {
    let bad = |what: String| EngineError::BadConfig { file: h.path.display().to_string(), what };
    // hf_dense_base refuses output biases, which gpt-oss has (they are read below).
    let mut plain = h.clone();
    plain.o_bias = false;
    let mut cfg = hf_dense_base(&plain, "gpt-oss")?;
    cfg.o_bias = h.o_bias;
    cfg.attn_sinks = true;
    cfg.ffn_norm = "post_attention_norm.weight";
    let raw = h.text_raw();
    let num = |k: &str, d: f64| raw.get(k).and_then(Value::as_f64).unwrap_or(d);
    let int = |k: &str, d: u64| raw.get(k).and_then(Value::as_u64).unwrap_or(d) as usize;
    let n_experts = match raw.get("num_local_experts").filter(|v| !v.is_null()) {
        Some(_) => int("num_local_experts", 128),
        None => int("num_experts", 128),
    };
    let mc = moe(
        n_experts,
        int("num_experts_per_tok", 4),
        h.intermediate_size,
        num("swiglu_alpha", ALPHA as f64) as f32,
        num("swiglu_limit", LIMIT as f64) as f32,
    );
    if mc.top_k == 0 || mc.top_k > mc.n_experts {
        return Err(bad(format!("{} experts per token of {}", mc.top_k, mc.n_experts)));
    }
    cfg.moe = Some(mc);
    let window = h.sliding_window;
    for (i, (l, t)) in cfg.layers.iter_mut().zip(&h.layer_types).enumerate() {
        l.moe = true;
        l.sliding_window = match t.as_str() {
            "sliding_attention" => Some(window.ok_or_else(|| bad("sliding layers without a sliding_window".into()))?),
            "full_attention" => None,
            other => return Err(bad(format!("layer_types[{i}] = '{other}': expected sliding_attention or full_attention"))),
        };
    }
    Ok(cfg)
}

fn from_gguf(g: &dyn GgufMeta) -> Result<ModelConfig> {
    let k = GgufKeys { g, arch: "gpt-oss" };
    let mut cfg = gguf_dense_base(g, "gpt-oss", RopeStyle::NeoX)?;
    let has = |name: &str| g.tensor(name).is_some();
    cfg.qkv_bias = has("blk.0.attn_q.bias");
    cfg.o_bias = has("blk.0.attn_output.bias");
    cfg.attn_sinks = has("blk.0.attn_sinks.weight");
    cfg.ffn_norm = "post_attention_norm.weight";
    let mc = moe(k.usize("expert_count")?, k.usize("expert_used_count")?, k.usize("expert_feed_forward_length")?, ALPHA, LIMIT);
    if mc.top_k == 0 || mc.top_k > mc.n_experts {
        return Err(k.bad(format!("{} experts per token of {}", mc.top_k, mc.n_experts)));
    }
    cfg.moe = Some(mc);
    // llama.cpp: the even layers slide (swa pattern 2).
    let window = k.opt_usize("attention.sliding_window")?;
    for (i, l) in cfg.layers.iter_mut().enumerate() {
        l.moe = true;
        l.sliding_window = if i % 2 == 0 { window } else { None };
    }
    Ok(cfg)
}

/// The tensors `hf_fix` derives (GGUF-name suffixes).
const DERIVED: &[&str] =
    &["ffn_gate_exps.weight", "ffn_gate_exps.bias", "ffn_up_exps.weight", "ffn_up_exps.bias", "ffn_down_exps.weight"];

/// The tensors `hf_fix` derives from each fused one.
fn hf_replaces(suffix: &str) -> &'static [&'static str] {
    match suffix {
        "ffn_gate_up_exps_hf.weight" => &["ffn_gate_exps.weight", "ffn_up_exps.weight"],
        "ffn_gate_up_exps_hf.bias" => &["ffn_gate_exps.bias", "ffn_up_exps.bias"],
        "ffn_down_exps_hf.weight" => &["ffn_down_exps.weight"],
        _ => &[],
    }
}

/// llama.cpp's expert tensors from transformers' fused ones (`ARCH.hf_fix`): per expert,
/// gate = columns 0, 2, 4, ... and up = columns 1, 3, 5, ... of gate_up [d, 2·ff], transposed
/// to [ff, d]; down [ff, d] transposed to [d, ff]; the gate/up biases de-interleaved alike.
fn hf_fix(name: &str, get: &dyn Fn(&str) -> Result<Option<QTensor>>, _config: &Value) -> Result<Option<QTensor>> {
    let Some((blk, rest)) = name.strip_prefix("blk.").and_then(|s| s.split_once('.')) else { return Ok(None) };
    let n = |s: &str| format!("blk.{blk}.{s}");
    let (source, half) = match rest {
        "ffn_gate_exps.weight" | "ffn_gate_exps.bias" => ("ffn_gate_up_exps_hf", Some(0)),
        "ffn_up_exps.weight" | "ffn_up_exps.bias" => ("ffn_gate_up_exps_hf", Some(1)),
        "ffn_down_exps.weight" => ("ffn_down_exps_hf", None),
        _ => return Ok(None),
    };
    let bias = rest.ends_with(".bias");
    let src_name = n(&format!("{source}.{}", if bias { "bias" } else { "weight" }));
    let Some(t) = get(&src_name)? else { return Ok(None) };
    // The experts' count and d from the router [E, d].
    let router = get(&n("ffn_gate_inp.weight"))?
        .ok_or_else(|| EngineError::MissingTensor { file: String::new(), tensor: n("ffn_gate_inp.weight") })?;
    let (e_n, d) = (router.rows, router.cols);
    let v = t.to_f32();
    let (rows, cols) = (t.rows, t.cols);
    let misfit = || EngineError::BadConfig {
        file: String::new(),
        what: format!("{src_name}: [{rows}, {cols}] does not stack {e_n} experts of width {d}"),
    };
    let out = match (half, bias) {
        // [E, 2·ff] -> [E, ff]
        (Some(h), true) => {
            let v: Vec<f32> = v.chunks_exact(2).map(|p| p[h]).collect();
            QTensor::from_f32(name, rows, cols / 2, v)
        }
        // [E·d, 2·ff] (per expert [d, 2·ff]) -> [E·ff, d]
        (Some(h), false) => {
            let ff = cols / 2;
            if rows != e_n * d || cols % 2 != 0 {
                return Err(misfit());
            }
            let mut o = vec![0f32; e_n * ff * d];
            for e in 0..e_n {
                for i in 0..d {
                    for j in 0..ff {
                        o[(e * ff + j) * d + i] = v[(e * d + i) * cols + 2 * j + h];
                    }
                }
            }
            QTensor::from_f32(name, e_n * ff, d, o)
        }
        // [E·ff, d] (per expert [ff, d]) -> [E·d, ff]
        (None, _) => {
            if cols != d || rows % e_n != 0 {
                return Err(misfit());
            }
            let ff = rows / e_n;
            let mut o = vec![0f32; e_n * d * ff];
            for e in 0..e_n {
                for j in 0..ff {
                    for i in 0..d {
                        o[(e * d + i) * ff + j] = v[(e * ff + j) * d + i];
                    }
                }
            }
            QTensor::from_f32(name, e_n * d, ff, o)
        }
    };
    Ok(Some(out))
}

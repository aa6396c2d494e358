//! IBM Granite 4.0 H (`GraniteMoeHybridForCausalLM`, llama.cpp's `granitehybrid`): Mamba2 layers
//! (`mixers::mamba2`) and a few GQA attention layers without positional encoding
//! (`position_embedding_type` "nope"; "rope" turns RoPE on), every layer's FFN a top-k MoE
//! (softmax over the top-k router logits) plus an ungated shared MLP, or the shared MLP alone
//! when the model has no experts (Granite 4.0 H Micro). Granite's multipliers: embeddings ×
//! `embedding_multiplier`, each sub-block's output × `residual_multiplier` before its residual
//! add, attention scaled by `attention_multiplier`, logits ÷ `logits_scaling`.
//!
//! Checkpoint quirks: the routed experts are stored stacked and fused,
//! `block_sparse_moe.input_linear` [E, 2·ff, H] (gate rows first) and `output_linear`
//! [E, H, ff]; the shared MLP's `input_linear` [2·sf, H] likewise; the router is
//! `block_sparse_moe.router.layer`. The loader splits the fused tensors into views (no copy);
//! llama.cpp's converter splits them into `ffn_{gate,up}_exps` / `ffn_{gate,up}_shexp`.
//! Layer types are spelled "mamba" / "attention" on the hub and "linear_attention" /
//! "full_attention" by transformers 5; `time_step_limit` may hold `{"__float__": "Infinity"}`.

use cortiq_formats::gguf::GgufMeta;
use cortiq_formats::hf::{ClassDefaults, HfClass, HfConfig};
use cortiq_formats::names::{ATTN_NORM_OUT, ATTN_QKV, Bias, DENSE_GLOBAL, LayerRow, NameTable, PRE_FFN_NORM, Pair};
use cortiq_kernels::ops::RopeStyle;
use serde_json::Value;

use super::{Arch, GgufKeys, KvOverride, gguf_dense_base, hf_dense_base, per_layer_usize};
use crate::config::{LayerSpec, MixerKind, ModelConfig, Rope, RopeScaling};
use crate::error::{EngineError, Result};
use crate::geometry::Mamba2Config;
use crate::moe::{ExpertAct, MoeConfig, Scoring};

pub const ARCH: Arch = Arch {
    name: "granitehybrid",
    hf_names: &["GraniteMoeHybridForCausalLM", "granitemoehybrid"],
    from_gguf,
    from_hf,
    hf_norm_offset: 0.0,
    hf_plain_norms: &[],
    hf_fix: None,
    // GraniteMoeHybridConfig.
    hf_class: HfClass {
        defaults: Some(ClassDefaults {
            vocab_size: 32000,
            hidden_size: 4096,
            intermediate_size: 11008,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_key_value_heads: None,
            head_dim: None,
            hidden_act: "silu",
            max_position_embeddings: 2048,
            rms_norm_eps: 1e-6,
            bos: Some(1),
            eos: Some(2),
            pad: None,
            sliding_window: None,
            query_pre_attn_scalar: None,
        }),
        ..HfClass::GENERIC
    },
    names: NameTable {
        global: DENSE_GLOBAL,
        layer: &[ATTN_QKV, ATTN_NORM_OUT, PRE_FFN_NORM, LAYER],
        bare: &[BARE],
        experts: None,
        mtp: false,
    },
};

/// The Mamba2 block, the fused MoE and the shared MLP (as the experts' shared expert, or as
/// the dense FFN of a model without experts: the first row wins HF → GGUF, either GGUF name
/// finds the HF tensor).
const LAYER: &[LayerRow] = &[
    ("mamba.in_proj", "ssm_in", Bias::No),
    ("mamba.conv1d", "ssm_conv1d", Bias::Yes),
    ("mamba.norm", "ssm_norm", Bias::No),
    ("mamba.out_proj", "ssm_out", Bias::No),
    ("block_sparse_moe.router.layer", "ffn_gate_inp", Bias::No),
    ("block_sparse_moe.input_linear", "ffn_gate_up_exps", Bias::No),
    ("block_sparse_moe.output_linear", "ffn_down_exps", Bias::No),
    ("shared_mlp.input_linear", "ffn_gate_up_shexp", Bias::No),
    ("shared_mlp.output_linear", "ffn_down_shexp", Bias::No),
    ("shared_mlp.input_linear", "ffn_gate_up", Bias::No),
    ("shared_mlp.output_linear", "ffn_down", Bias::No),
];
/// Mamba2's parameters without a `.weight` (A_log is stored by llama.cpp as −exp(A_log)).
const BARE: &[Pair] = &[("mamba.dt_bias", "ssm_dt.bias"), ("mamba.A_log", "ssm_a"), ("mamba.D", "ssm_d")];

/// Which mixer layer type `t` (either spelling) is.
fn is_mamba(t: &str) -> Option<bool> {
    match t {
        "mamba" | "linear_attention" => Some(true),
        "attention" | "full_attention" => Some(false),
        _ => None,
    }
}

/// A rope that rotates nothing (NoPE attention layers).
fn no_rope() -> Rope {
    Rope::new(RopeStyle::Interleaved, 0, 10_000.0, &RopeScaling::None)
}

fn from_hf(h: &HfConfig) -> Result<ModelConfig> {
    let mut cfg = hf_dense_base(h, "granitehybrid")?;
    let bad = |what: String| EngineError::BadConfig { file: h.path.display().to_string(), what };
    let raw = h.text_raw();
    let num = |k: &str, default: f64| -> Result<f64> {
        match raw.get(k).filter(|v| !v.is_null()) {
            None => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| bad(format!("'{k}' must be a number"))),
        }
    };
    let int = |k: &str, default: usize| -> Result<usize> {
        match raw.get(k).filter(|v| !v.is_null()) {
            None => Ok(default),
            Some(v) => v.as_u64().map(|v| v as usize).ok_or_else(|| bad(format!("'{k}' must be a non-negative integer"))),
        }
    };
    let flag = |k: &str, default: bool| raw.get(k).and_then(Value::as_bool).unwrap_or(default);
    if flag("mamba_proj_bias", false) {
        return Err(bad("mamba_proj_bias: Mamba2 projections with biases are not supported".into()));
    }
    match raw.get("position_embedding_type").and_then(Value::as_str) {
        Some("rope") => {}
        None | Some("nope") => cfg.ropes = vec![no_rope()],
        Some(other) => return Err(bad(format!("position_embedding_type '{other}': expected 'rope' or 'nope'"))),
    }
    cfg.attn_scale = num("attention_multiplier", 1.0)? as f32;
    cfg.embed_scale = Some(num("embedding_multiplier", 1.0)? as f32);
    cfg.residual_scale = Some(num("residual_multiplier", 1.0)? as f32);
    cfg.logit_scale = Some(num("logits_scaling", 1.0)? as f32);

    let (hidden, n_heads) = (h.hidden_size, int("mamba_n_heads", 128)?);
    let d_inner = int("mamba_expand", 2)? * hidden;
    let head_dim = match raw.get("mamba_d_head") {
        None | Some(Value::Null) => d_inner / n_heads.max(1),
        Some(Value::String(s)) if s == "auto" => d_inner / n_heads.max(1),
        Some(v) => v.as_u64().ok_or_else(|| bad("'mamba_d_head' must be an integer or \"auto\"".into()))? as usize,
    };
    let (dt_min, dt_max) = time_step_limit(raw.get("time_step_limit")).map_err(|e| bad(format!("time_step_limit: {e}")))?;
    let n_groups = int("mamba_n_groups", 1)?;
    let m = Mamba2Config {
        d_model: hidden,
        n_heads,
        head_dim,
        n_groups,
        d_state: int("mamba_d_state", 256)?,
        conv_kernel: int("mamba_d_conv", 4)?,
        conv_bias: flag("mamba_conv_bias", true),
        norm_eps: h.rms_norm_eps as f32,
        norm_groups: n_groups,
        norm: crate::geometry::MambaNorm::GateThenNorm,
        dt_min,
        dt_max,
    };
    check_mamba(&m).map_err(bad)?;

    let n_experts = int("num_local_experts", 8)?;
    let shared = int("shared_intermediate_size", 1024)?;
    set_ffn(&mut cfg, n_experts, int("num_experts_per_tok", 2)?, h.intermediate_size, shared).map_err(bad)?;
    cfg.layers = h
        .layer_types
        .iter()
        .enumerate()
        .map(|(i, t)| match is_mamba(t) {
            Some(mamba) => Ok(layer(mamba, m, n_experts > 0)),
            None => Err(bad(format!("layer_types[{i}] = '{t}': Granite hybrid layers are 'mamba' or 'attention'"))),
        })
        .collect::<Result<_>>()?;
    Ok(cfg)
}

/// HF's `time_step_limit` ([min, max], a bound possibly `{"__float__": "Infinity"}`); absent
/// or null: no clamp.
fn time_step_limit(v: Option<&Value>) -> std::result::Result<(f32, f32), String> {
    let Some(Value::Array(a)) = v.filter(|v| !v.is_null()) else {
        return match v.filter(|v| !v.is_null()) {
            None => Ok((0.0, f32::INFINITY)),
            Some(other) => Err(format!("expected [min, max], got {other}")),
        };
    };
    let bound = |x: &Value| -> std::result::Result<f32, String> {
        match x {
            Value::Number(n) => n.as_f64().map(|f| f as f32).ok_or_else(|| format!("{n} is not a number")),
            Value::Object(o) => match o.get("__float__").and_then(Value::as_str) {
                Some("Infinity" | "inf") => Ok(f32::INFINITY),
                Some("-Infinity" | "-inf") => Ok(f32::NEG_INFINITY),
                _ => Err(format!("{x} is not a number")),
            },
            other => Err(format!("{other} is not a number")),
        }
    };
    match &a[..] {
        [lo, hi] => Ok((bound(lo)?, bound(hi)?)),
        _ => Err(format!("expected two bounds, got {}", a.len())),
    }
}

fn check_mamba(m: &Mamba2Config) -> std::result::Result<(), String> {
    let ok = m.n_heads > 0
        && m.head_dim > 0
        && m.d_state > 0
        && m.conv_kernel > 0
        && m.n_groups > 0
        && m.n_heads.is_multiple_of(m.n_groups)
        && m.d_inner().is_multiple_of(m.norm_groups);
    match ok {
        true => Ok(()),
        false => Err(format!(
            "Mamba2 geometry {} heads x {} / {} groups / state {} / conv {} is not valid",
            m.n_heads, m.head_dim, m.n_groups, m.d_state, m.conv_kernel
        )),
    }
}

/// The FFN side: with experts, every layer MoE (softmax over the top-k, renormalized; the
/// shared MLP ungated); without, the shared MLP is the dense FFN.
fn set_ffn(cfg: &mut ModelConfig, n_experts: usize, top_k: usize, ff: usize, shared: usize) -> std::result::Result<(), String> {
    if n_experts == 0 {
        cfg.d_ff = shared;
        cfg.moe = None;
        return Ok(());
    }
    if top_k == 0 || top_k > n_experts {
        return Err(format!("{top_k} experts per token of {n_experts}"));
    }
    cfg.moe = Some(MoeConfig {
        n_experts,
        top_k,
        scoring: Scoring::Softmax,
        norm_topk: true,
        topk_eps: 0.0,
        routed_scale: 1.0,
        d_ff_expert: ff,
        d_ff_shared: (shared > 0).then_some(shared),
        shared_gate: false,
        act: ExpertAct::Gated,
        ungated: false,
    });
    Ok(())
}

fn layer(mamba: bool, m: Mamba2Config, moe: bool) -> LayerSpec {
    let mixer = if mamba { MixerKind::Mamba2(m) } else { MixerKind::Attention };
    LayerSpec { mixer, moe, sliding_window: None, rope: 0, ffn: true }
}

fn from_gguf(g: &dyn GgufMeta) -> Result<ModelConfig> {
    let k = GgufKeys { g, arch: "granitehybrid" };
    let n_layers = k.usize("block_count")?;
    // head_count_kv is per layer: 0 marks a Mamba2 layer.
    let kv = per_layer_usize(&k, "attention.head_count_kv", n_layers)?;
    let n_kv = kv.iter().copied().filter(|&x| x > 0).max().unwrap_or(1);
    if kv.iter().any(|&x| x != 0 && x != n_kv) {
        return Err(k.bad(format!("attention.head_count_kv: attention layers disagree ({kv:?})")));
    }
    let mut cfg = gguf_dense_base(
        &KvOverride::new(g, "granitehybrid.attention.head_count_kv", n_kv),
        "granitehybrid",
        RopeStyle::Interleaved,
    )?;
    // llama.cpp marks RoPE use with rope.scaling.finetuned (off for the Mamba2 hybrids).
    if !g.get("granitehybrid.rope.scaling.finetuned").and_then(|v| v.as_bool()).unwrap_or(false) {
        cfg.ropes = vec![no_rope()];
    }
    let scale = |key: &str| -> Result<Option<f32>> { Ok(k.opt_f64(key)?.map(|v| v as f32)) };
    if let Some(s) = scale("attention.scale")? {
        cfg.attn_scale = s;
    }
    cfg.embed_scale = scale("embedding_scale")?;
    cfg.residual_scale = scale("residual_scale")?;
    cfg.logit_scale = scale("logit_scale")?;

    let (inner, n_heads) = (k.usize("ssm.inner_size")?, k.usize("ssm.time_step_rank")?);
    let n_groups = k.usize("ssm.group_count")?;
    let first_mamba = kv.iter().position(|&x| x == 0);
    let conv_bias = first_mamba.is_some_and(|il| g.tensor(&format!("blk.{il}.ssm_conv1d.bias")).is_some());
    let m = Mamba2Config {
        d_model: cfg.d_model,
        n_heads,
        head_dim: inner / n_heads.max(1),
        n_groups,
        d_state: k.usize("ssm.state_size")?,
        conv_kernel: k.usize("ssm.conv_kernel")?,
        conv_bias,
        norm_eps: cfg.norm_eps,
        norm_groups: n_groups,
        norm: crate::geometry::MambaNorm::GateThenNorm,
        dt_min: 0.0,
        dt_max: f32::INFINITY,
    };
    if m.d_inner() != inner {
        return Err(k.bad(format!("ssm.inner_size {inner} is not a multiple of ssm.time_step_rank {n_heads}")));
    }
    check_mamba(&m).map_err(|e| k.bad(e))?;

    let n_experts = k.opt_usize("expert_count")?.unwrap_or(0);
    let top_k = k.opt_usize("expert_used_count")?.unwrap_or(0);
    let ff = k.opt_usize("expert_feed_forward_length")?.unwrap_or(cfg.d_ff);
    let shared = match k.opt_usize("expert_shared_feed_forward_length")? {
        Some(s) => s,
        None if n_experts == 0 => cfg.d_ff,
        None => 0,
    };
    set_ffn(&mut cfg, n_experts, top_k, ff, shared).map_err(|e| k.bad(e))?;
    cfg.layers = kv.iter().map(|&x| layer(x == 0, m, n_experts > 0)).collect();
    Ok(cfg)
}

//! Falcon-H1 (`FalconH1ForCausalLM`): every layer runs GQA attention (RoPE) and Mamba2 side by
//! side on the same normed input and adds them (`mixers::parallel`), then a SwiGLU FFN. Its μP
//! multipliers are folded into the weights as llama.cpp's converter folds them (so an HF folder
//! and its GGUF run the same graph): attention_in on q/k/v, key on k, attention_out on o,
//! ssm_in and the five `ssm_multipliers` (z, x, B, C, dt rows) on in_proj, ssm_out on out_proj,
//! `mlp_multipliers` on gate and down. embedding_multiplier and lm_head_multiplier stay
//! multipliers (the embedding may be tied to the head). The folded matrices of an HF folder are
//! widened to f32.
//!
//! Mamba2 here: `mamba_d_ssm` channels (not expand × d), and its output norm as configured:
//! with `mamba_rms_norm`, the grouped RMSNorm before or after the gate
//! (`mamba_norm_before_gate`), else y·silu(z) alone.

use cortiq_formats::gguf::GgufMeta;
use cortiq_formats::hf::{ClassDefaults, HfClass, HfConfig};
use cortiq_formats::names::{ATTN_QKV, Bias, LayerRow, NameTable, Pair};
use cortiq_kernels::ops::RopeStyle;
use serde_json::Value;

use super::{Arch, GgufKeys, gguf_dense_base, hf_dense_base};
use crate::config::{LayerSpec, MixerKind, ModelConfig};
use crate::error::{EngineError, Result};
use crate::geometry::{Mamba2Config, MambaNorm};
use crate::qtensor::QTensor;

pub const ARCH: Arch = Arch {
    name: "falcon-h1",
    hf_names: &["FalconH1ForCausalLM", "falcon_h1"],
    from_gguf,
    from_hf,
    hf_norm_offset: 0.0,
    hf_plain_norms: &[],
    hf_fix: Some(super::HfFix { derive: hf_fix, derives: |s| MULTIPLIED.contains(&s), replaces: |_| &[] }),
    // FalconH1Config.
    hf_class: HfClass {
        defaults: Some(ClassDefaults {
            vocab_size: 128000,
            hidden_size: 4096,
            intermediate_size: 14336,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_key_value_heads: Some(8),
            head_dim: None,
            hidden_act: "silu",
            max_position_embeddings: 8192,
            rms_norm_eps: 1e-5,
            bos: Some(1),
            eos: Some(2),
            pad: Some(0),
            sliding_window: None,
            query_pre_attn_scalar: None,
        }),
        ..HfClass::GENERIC
    },
    names: NameTable {
        global: &[
            ("model.embed_tokens.weight", "token_embd.weight"),
            ("model.final_layernorm.weight", "output_norm.weight"),
            ("lm_head.weight", "output.weight"),
        ],
        layer: &[ATTN_QKV, LAYER],
        bare: &[BARE],
        experts: None,
        mtp: false,
    },
};

const LAYER: &[LayerRow] = &[
    ("input_layernorm", "attn_norm", Bias::No),
    ("self_attn.o_proj", "attn_output", Bias::No),
    ("pre_ff_layernorm", "ffn_norm", Bias::No),
    ("feed_forward.gate_proj", "ffn_gate", Bias::No),
    ("feed_forward.up_proj", "ffn_up", Bias::No),
    ("feed_forward.down_proj", "ffn_down", Bias::No),
    ("mamba.in_proj", "ssm_in", Bias::No),
    ("mamba.conv1d", "ssm_conv1d", Bias::Yes),
    ("mamba.norm", "ssm_norm", Bias::No),
    ("mamba.out_proj", "ssm_out", Bias::No),
];
const BARE: &[Pair] = &[("mamba.dt_bias", "ssm_dt.bias"), ("mamba.A_log", "ssm_a"), ("mamba.D", "ssm_d")];

/// The matrices a μP multiplier is folded into (GGUF-name suffixes).
const MULTIPLIED: &[&str] = &[
    "attn_q.weight",
    "attn_k.weight",
    "attn_v.weight",
    "attn_output.weight",
    "ssm_in.weight",
    "ssm_out.weight",
    "ffn_gate.weight",
    "ffn_down.weight",
];

fn num(raw: &Value, k: &str, d: f64) -> f64 {
    raw.get(k).and_then(Value::as_f64).unwrap_or(d)
}

fn list(raw: &Value, k: &str, n: usize) -> Vec<f64> {
    match raw.get(k).and_then(Value::as_array) {
        Some(a) if a.len() == n => a.iter().map(|v| v.as_f64().unwrap_or(1.0)).collect(),
        _ => vec![1.0; n],
    }
}

/// The Mamba2 geometry of the HF config.
fn mamba(raw: &Value, d_model: usize, eps: f32) -> std::result::Result<Mamba2Config, String> {
    let int = |k: &str, d: u64| raw.get(k).and_then(Value::as_u64).unwrap_or(d) as usize;
    let d_ssm = match raw.get("mamba_d_ssm").and_then(Value::as_u64) {
        Some(v) => v as usize,
        None => int("mamba_expand", 2) * d_model,
    };
    let n_heads = int("mamba_n_heads", 128);
    let head_dim = match raw.get("mamba_d_head") {
        Some(Value::Number(n)) => n.as_u64().unwrap_or(0) as usize,
        _ => d_ssm / n_heads.max(1),
    };
    let n_groups = int("mamba_n_groups", 1);
    let flag = |k: &str, d: bool| raw.get(k).and_then(Value::as_bool).unwrap_or(d);
    let norm = match (flag("mamba_rms_norm", false), flag("mamba_norm_before_gate", true)) {
        (false, _) => MambaNorm::GateOnly,
        (true, true) => MambaNorm::NormThenGate,
        (true, false) => MambaNorm::GateThenNorm,
    };
    let m = Mamba2Config {
        d_model,
        n_heads,
        head_dim,
        n_groups,
        d_state: int("mamba_d_state", 256),
        conv_kernel: int("mamba_d_conv", 4),
        conv_bias: flag("mamba_conv_bias", true),
        norm_eps: eps,
        norm_groups: n_groups,
        norm,
        dt_min: 0.0,
        dt_max: f32::INFINITY,
    };
    if n_heads == 0 || n_groups == 0 || n_heads % n_groups != 0 || head_dim * n_heads != d_ssm {
        return Err(format!("Mamba2 geometry: {n_heads} heads × {head_dim} for mamba_d_ssm {d_ssm}, {n_groups} groups"));
    }
    if flag("mamba_proj_bias", false) || flag("projectors_bias", false) || flag("attention_bias", false) {
        return Err("projection biases (mamba_proj_bias, projectors_bias, attention_bias) are not supported".into());
    }
    Ok(m)
}

fn from_hf(h: &HfConfig) -> Result<ModelConfig> {
    let bad = |what: String| EngineError::BadConfig { file: h.path.display().to_string(), what };
    let raw = h.text_raw();
    let mut cfg = hf_dense_base(h, "falcon-h1")?;
    let m = mamba(raw, cfg.d_model, cfg.norm_eps).map_err(bad)?;
    cfg.embed_scale = Some(num(raw, "embedding_multiplier", 1.0) as f32);
    cfg.logit_scale = Some((1.0 / num(raw, "lm_head_multiplier", 1.0)) as f32);
    for l in &mut cfg.layers {
        *l = LayerSpec { mixer: MixerKind::AttnMamba2(m), ..l.clone() };
    }
    Ok(cfg)
}

fn from_gguf(g: &dyn GgufMeta) -> Result<ModelConfig> {
    let k = GgufKeys { g, arch: "falcon-h1" };
    let mut cfg = gguf_dense_base(g, "falcon-h1", RopeStyle::NeoX)?;
    // llama.cpp's converter names the pre-FFN norm `ffn_norm` without `.weight`.
    if g.tensor("blk.0.ffn_norm").is_some() {
        cfg.ffn_norm = "ffn_norm";
    }
    let (inner, n_heads, n_groups) = (k.usize("ssm.inner_size")?, k.usize("ssm.time_step_rank")?, k.usize("ssm.group_count")?);
    let has = |name: &str| g.tensor(name).is_some();
    let m = Mamba2Config {
        d_model: cfg.d_model,
        n_heads,
        head_dim: inner / n_heads.max(1),
        n_groups,
        d_state: k.usize("ssm.state_size")?,
        conv_kernel: k.usize("ssm.conv_kernel")?,
        conv_bias: has("blk.0.ssm_conv1d.bias"),
        norm_eps: cfg.norm_eps,
        norm_groups: n_groups,
        // llama.cpp's falcon-h1 graph: the grouped norm after the gate where the file has one.
        norm: if has("blk.0.ssm_norm.weight") { MambaNorm::GateThenNorm } else { MambaNorm::GateOnly },
        dt_min: 0.0,
        dt_max: f32::INFINITY,
    };
    if n_heads == 0 || n_groups == 0 || m.d_inner() != inner {
        return Err(k.bad(format!("ssm inner size {inner} / {n_heads} heads / {n_groups} groups is not a Mamba2 geometry")));
    }
    for l in &mut cfg.layers {
        *l = LayerSpec { mixer: MixerKind::AttnMamba2(m), ..l.clone() };
    }
    Ok(cfg)
}

/// The μP multipliers folded into an HF folder's matrices (`ARCH.hf_fix`), as llama.cpp's
/// converter folds them into a GGUF.
fn hf_fix(name: &str, get: &dyn Fn(&str) -> Result<Option<QTensor>>, config: &Value) -> Result<Option<QTensor>> {
    let Some((_, rest)) = name.strip_prefix("blk.").and_then(|s| s.split_once('.')) else { return Ok(None) };
    let m = |k: &str| num(config, k, 1.0) as f32;
    let mlp = list(config, "mlp_multipliers", 2);
    let scale: f32 = match rest {
        "attn_q.weight" | "attn_v.weight" => m("attention_in_multiplier"),
        "attn_k.weight" => m("attention_in_multiplier") * m("key_multiplier"),
        "attn_output.weight" => m("attention_out_multiplier"),
        "ssm_out.weight" => m("ssm_out_multiplier"),
        "ffn_gate.weight" => mlp[0] as f32,
        "ffn_down.weight" => mlp[1] as f32,
        "ssm_in.weight" => m("ssm_in_multiplier"),
        _ => return Ok(None),
    };
    let Some(t) = get(name)? else { return Ok(None) };
    let mut v = t.to_f32();
    if rest == "ssm_in.weight" {
        // Rows z | x | B | C | dt, each section times its own multiplier.
        let d_model = t.cols;
        let int = |k: &str, d: u64| config.get(k).and_then(Value::as_u64).unwrap_or(d) as usize;
        let d_ssm = config.get("mamba_d_ssm").and_then(Value::as_u64).map_or(int("mamba_expand", 2) * d_model, |x| x as usize);
        let gs = int("mamba_n_groups", 1) * int("mamba_d_state", 256);
        let mults = list(config, "ssm_multipliers", 5);
        let bounds = [0, d_ssm, 2 * d_ssm, 2 * d_ssm + gs, 2 * d_ssm + 2 * gs, t.rows];
        for (s, w) in bounds.windows(2).zip(&mults) {
            let f = scale * *w as f32;
            v[s[0] * d_model..s[1] * d_model].iter_mut().for_each(|x| *x *= f);
        }
    } else {
        v.iter_mut().for_each(|x| *x *= scale);
    }
    Ok(Some(QTensor::from_f32(name, t.rows, t.cols, v)))
}

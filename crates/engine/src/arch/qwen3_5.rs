//! Qwen3.5 (text): a hybrid of GatedDeltaNet layers ("linear_attention") and gated attention
//! layers ("full_attention": q_proj yields [q | gate] per head, the output multiplied by
//! σ(gate), per-head q/k RMSNorm, partial RoPE), SwiGLU FFN, (1+w) RMSNorms everywhere except
//! the GatedDeltaNet output norm (plain w), A_log stored by HF and turned into −exp(A_log).
//!
//! GGUF files of this architecture (llama.cpp's `qwen35`) are not read yet: their GatedDeltaNet
//! keys and tensor layouts need the converter's fixture (issue 4) to be checked against.

use cortiq_formats::gguf::GgufMeta;
use cortiq_formats::hf::HfConfig;

use super::{Arch, GgufKeys, hf_dense_base};
use crate::config::{LayerSpec, MixerKind, ModelConfig};
use crate::error::{EngineError, Result};
use crate::mixers::gdn::{GdnConfig, OutGate};

pub const ARCH: Arch = Arch {
    name: "qwen35",
    hf_names: &["Qwen3_5ForCausalLM", "qwen3_5_text"],
    from_gguf,
    from_hf,
    hf_norm_offset: 1.0,
    hf_plain_norms: &["ssm_norm.weight"],
};

fn from_hf(h: &HfConfig) -> Result<ModelConfig> {
    let mut cfg = hf_dense_base(h, "qwen35")?;
    let bad = |what: String| EngineError::BadConfig { file: h.path.display().to_string(), what };
    let raw = &h.raw;
    let get = |k: &str| -> Result<usize> {
        raw.get(k).and_then(|v| v.as_u64()).map(|v| v as usize).ok_or_else(|| bad(format!("missing or non-integer '{k}'")))
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
    };
    if g.n_k_heads == 0 || g.n_v_heads % g.n_k_heads != 0 || g.d_k == 0 || g.d_v == 0 || g.conv_kernel == 0 {
        return Err(bad(format!(
            "linear attention geometry: {} key heads x {}, {} value heads x {}, conv kernel {} is not valid",
            g.n_k_heads, g.d_k, g.n_v_heads, g.d_v, g.conv_kernel
        )));
    }
    cfg.qk_norm = true;
    cfg.attn_gate = true;
    cfg.layers = h
        .layer_types
        .iter()
        .enumerate()
        .map(|(i, t)| match t.as_str() {
            "linear_attention" => Ok(LayerSpec { mixer: MixerKind::GatedDeltaNet(g), sliding_window: None, rope: 0 }),
            "full_attention" => Ok(LayerSpec::attention(0)),
            other => Err(bad(format!("layer_types[{i}] = '{other}': Qwen3.5 layers are 'linear_attention' or 'full_attention'"))),
        })
        .collect::<Result<_>>()?;
    Ok(cfg)
}

fn from_gguf(g: &dyn GgufMeta) -> Result<ModelConfig> {
    let k = GgufKeys { g, arch: "qwen35" };
    Err(k.bad("qwen35 GGUF files are not supported yet (load the Hugging Face folder)".into()))
}

//! Qwen2 / Qwen2.5: Llama's block with biases on the Q, K and V projections, rotate-half RoPE.

use cortiq_formats::gguf::GgufMeta;
use cortiq_kernels::ops::RopeStyle;

use cortiq_formats::hf::{ClassDefaults, HfClass, HfConfig};
use cortiq_formats::names::{DENSE_GLOBAL, NameTable};

use super::{Arch, DENSE_BARE, DENSE_LAYER, gguf_dense_base, hf_dense_base};
use crate::config::ModelConfig;
use crate::error::Result;

pub const ARCH: Arch = Arch {
    name: "qwen2",
    hf_names: &["Qwen2ForCausalLM", "qwen2"],
    from_gguf,
    from_hf,
    hf_norm_offset: 0.0,
    hf_plain_norms: &[],
    hf_fix: None,
    hf_class: HfClass { defaults: Some(DEFAULTS), qkv_bias: true, window_layers_from: Some(28), ..HfClass::GENERIC },
    names: NameTable { global: DENSE_GLOBAL, layer: DENSE_LAYER, bare: DENSE_BARE, experts: None, mtp: false },
};

/// Qwen2Config's defaults (Qwen3Config adds head_dim = 128). Its sliding window applies only
/// with `use_sliding_window`, from layer `max_window_layers` (28) on.
pub const DEFAULTS: ClassDefaults = ClassDefaults {
    vocab_size: 151936,
    hidden_size: 4096,
    intermediate_size: 22016,
    num_hidden_layers: 32,
    num_attention_heads: 32,
    num_key_value_heads: Some(32),
    head_dim: None,
    hidden_act: "silu",
    max_position_embeddings: 32768,
    rms_norm_eps: 1e-6,
    bos: None,
    eos: None,
    pad: None,
    sliding_window: Some(4096),
    query_pre_attn_scalar: None,
};

fn from_gguf(g: &dyn GgufMeta) -> Result<ModelConfig> {
    let mut cfg = gguf_dense_base(g, "qwen2", RopeStyle::NeoX)?;
    cfg.qkv_bias = true;
    Ok(cfg)
}

fn from_hf(h: &HfConfig) -> Result<ModelConfig> {
    #[allow(unused_mut)]
    let mut cfg = hf_dense_base(h, "qwen2")?;
    Ok(cfg)
}

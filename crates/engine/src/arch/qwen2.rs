//! Qwen2 / Qwen2.5: Llama's block with biases on the Q, K and V projections, rotate-half RoPE.

use cortiq_formats::gguf::GgufMeta;
use cortiq_kernels::ops::RopeStyle;

use cortiq_formats::hf::HfConfig;

use super::{Arch, gguf_dense_base, hf_dense_base};
use crate::config::ModelConfig;
use crate::error::Result;

pub const ARCH: Arch = Arch {
    name: "qwen2",
    hf_names: &["Qwen2ForCausalLM", "qwen2"],
    from_gguf,
    from_hf,
    hf_norm_offset: 0.0,
    hf_plain_norms: &[],
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

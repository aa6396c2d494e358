//! Qwen3: no QKV bias, RMSNorm on each query and key head before RoPE, and a head_dim that
//! need not equal d_model / n_heads.

use cortiq_formats::gguf::GgufMeta;
use cortiq_kernels::ops::RopeStyle;

use cortiq_formats::hf::HfConfig;

use super::{Arch, gguf_dense_base, hf_dense_base};
use crate::config::ModelConfig;
use crate::error::Result;

pub const ARCH: Arch = Arch {
    name: "qwen3",
    hf_names: &["Qwen3ForCausalLM", "qwen3"],
    from_gguf,
    from_hf,
    hf_norm_offset: 0.0,
    hf_plain_norms: &[],
};

fn from_gguf(g: &dyn GgufMeta) -> Result<ModelConfig> {
    let mut cfg = gguf_dense_base(g, "qwen3", RopeStyle::NeoX)?;
    cfg.qk_norm = true;
    Ok(cfg)
}

fn from_hf(h: &HfConfig) -> Result<ModelConfig> {
    #[allow(unused_mut)]
    let mut cfg = hf_dense_base(h, "qwen3")?;
    cfg.qk_norm = true;
    Ok(cfg)
}

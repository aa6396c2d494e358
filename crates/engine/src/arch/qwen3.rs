//! Qwen3: no QKV bias, RMSNorm on each query and key head before RoPE, and a head_dim that
//! need not equal d_model / n_heads.

use cortiq_formats::gguf::Gguf;
use cortiq_kernels::ops::RopeStyle;

use super::{gguf_dense_base, Arch};
use crate::config::ModelConfig;
use crate::error::Result;

pub const ARCH: Arch = Arch { name: "qwen3", hf_names: &["Qwen3ForCausalLM", "qwen3"], from_gguf };

fn from_gguf(g: &Gguf) -> Result<ModelConfig> {
    let mut cfg = gguf_dense_base(g, "qwen3", RopeStyle::NeoX)?;
    cfg.qk_norm = true;
    Ok(cfg)
}

//! Qwen3: no QKV bias, RMSNorm on each query and key head before RoPE, and a head_dim that
//! need not equal d_model / n_heads.

use cortiq_formats::gguf::GgufMeta;
use cortiq_kernels::ops::RopeStyle;

use cortiq_formats::hf::{ClassDefaults, HfClass, HfConfig};
use cortiq_formats::names::{ATTN_NORM_OUT, ATTN_QKV, DENSE_GLOBAL, NameTable, PRE_FFN_NORM, QK_NORM, SWIGLU};

use super::{Arch, DENSE_BARE, gguf_dense_base, hf_dense_base};
use crate::config::ModelConfig;
use crate::error::Result;

pub const ARCH: Arch = Arch {
    name: "qwen3",
    hf_names: &["Qwen3ForCausalLM", "qwen3"],
    from_gguf,
    from_hf,
    hf_norm_offset: 0.0,
    hf_plain_norms: &[],
    hf_fix: None,
    hf_class: HfClass {
        defaults: Some(ClassDefaults { head_dim: Some(128), ..super::qwen2::DEFAULTS }),
        window_layers_from: Some(28),
        ..HfClass::GENERIC
    },
    names: NameTable {
        global: DENSE_GLOBAL,
        layer: &[ATTN_QKV, ATTN_NORM_OUT, QK_NORM, PRE_FFN_NORM, SWIGLU, crate::mixers::vmf::NAMES],
        bare: DENSE_BARE,
        experts: None,
        mtp: false,
    },
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

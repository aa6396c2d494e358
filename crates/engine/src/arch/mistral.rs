//! Mistral (`MistralForCausalLM`: Mistral 7B, Mistral Nemo, Mistral Small 3): Llama's block with
//! a head_dim that need not be d_model / n_heads and, where `sliding_window` is set (Mistral 7B
//! v0.1), every layer sliding over that many keys. llama.cpp converts these folders to its
//! `llama` architecture (Q/K rows permuted), so a Mistral GGUF loads as `llama`; this entry
//! reads the HF folders.

use cortiq_formats::gguf::GgufMeta;
use cortiq_formats::hf::{ClassDefaults, HfClass, HfConfig};
use cortiq_formats::names::{DENSE_GLOBAL, NameTable};
use cortiq_kernels::ops::RopeStyle;

use super::{Arch, DENSE_BARE, DENSE_LAYER, gguf_dense_base, hf_dense_base};
use crate::config::ModelConfig;
use crate::error::Result;

pub const ARCH: Arch = Arch {
    name: "mistral",
    hf_names: &["MistralForCausalLM", "mistral"],
    from_gguf,
    from_hf,
    hf_norm_offset: 0.0,
    hf_plain_norms: &[],
    hf_fix: None,
    // MistralConfig.
    hf_class: HfClass {
        defaults: Some(ClassDefaults {
            vocab_size: 32000,
            hidden_size: 4096,
            intermediate_size: 14336,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_key_value_heads: Some(8),
            head_dim: None,
            hidden_act: "silu",
            max_position_embeddings: 131072,
            rms_norm_eps: 1e-6,
            bos: Some(1),
            eos: Some(2),
            pad: None,
            sliding_window: Some(4096),
            query_pre_attn_scalar: None,
        }),
        ..HfClass::GENERIC
    },
    names: NameTable { global: DENSE_GLOBAL, layer: DENSE_LAYER, bare: DENSE_BARE, experts: None, mtp: false },
};

/// A GGUF that says `mistral` (llama.cpp writes `llama`): read as Llama's.
fn from_gguf(g: &dyn GgufMeta) -> Result<ModelConfig> {
    gguf_dense_base(g, "mistral", RopeStyle::Interleaved)
}

fn from_hf(h: &HfConfig) -> Result<ModelConfig> {
    let mut cfg = hf_dense_base(h, "mistral")?;
    // MistralAttention slides every layer when sliding_window is set.
    for l in &mut cfg.layers {
        l.sliding_window = h.sliding_window;
    }
    Ok(cfg)
}

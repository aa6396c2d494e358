//! Llama (and SmolLM2, which is Llama-shaped): pre-norm, GQA, SiLU FFN, optional llama3 RoPE
//! scaling. llama.cpp's converter permutes Q/K rows so its GGUFs use interleaved RoPE pairs;
//! HF checkpoints keep the rotate-half layout.

use cortiq_formats::gguf::GgufMeta;
use cortiq_kernels::ops::RopeStyle;

use cortiq_formats::hf::{ClassDefaults, HfClass, HfConfig};
use cortiq_formats::names::{DENSE_GLOBAL, NameTable};

use super::{Arch, DENSE_BARE, DENSE_LAYER, gguf_dense_base, hf_dense_base};
use crate::config::ModelConfig;
use crate::error::Result;

pub const ARCH: Arch = Arch {
    name: "llama",
    hf_names: &["LlamaForCausalLM", "llama"],
    from_gguf,
    from_hf,
    hf_norm_offset: 0.0,
    hf_plain_norms: &[],
    hf_fix: None,
    // LlamaConfig.
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
    names: NameTable { global: DENSE_GLOBAL, layer: DENSE_LAYER, bare: DENSE_BARE, experts: None, mtp: false },
};

fn from_gguf(g: &dyn GgufMeta) -> Result<ModelConfig> {
    let mut cfg = gguf_dense_base(g, "llama", RopeStyle::Interleaved)?;
    // llama3-style scaling travels as a per-pair divisor tensor in GGUF.
    if let Some(info) = g.tensor("rope_freqs.weight") {
        let half = cfg.ropes[0].inv_freq.len();
        if info.n_elements() as usize != half || info.dtype != cortiq_kernels::quant::QuantType::F32 {
            return Err(crate::error::EngineError::ShapeMismatch {
                file: g.meta_path().display().to_string(),
                tensor: "rope_freqs.weight".into(),
                expected: vec![half],
                found: info.shape(),
            });
        }
        let data = g.tensor_data(info);
        for (i, f) in cfg.ropes[0].inv_freq.iter_mut().enumerate() {
            let div = f32::from_le_bytes(data[i * 4..i * 4 + 4].try_into().expect("4 bytes"));
            *f /= div as f64;
        }
    }
    Ok(cfg)
}

fn from_hf(h: &HfConfig) -> Result<ModelConfig> {
    #[allow(unused_mut)]
    let mut cfg = hf_dense_base(h, "llama")?;
    Ok(cfg)
}

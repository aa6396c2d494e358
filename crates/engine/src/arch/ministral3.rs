//! Ministral 3 (`Ministral3ForCausalLM`, and the text model of `Mistral3ForConditionalGeneration`
//! whose `text_config` says `ministral3`: Ministral 3 3B / 8B / 14B): Llama's block with YaRN
//! and Llama 4's query temperature — after RoPE the queries are scaled by
//! 1 + β·ln(1 + ⌊pos / original context⌋) (`Rope::q_temperature`), which leaves every position
//! below the original context (16,384 in the released models) as it is. llama.cpp converts it
//! to its `mistral3` architecture (Q/K rows permuted; `attention.temperature_scale` = β,
//! `rope.scaling.yarn_log_multiplier` = mscale_all_dim). The vision tower of the multimodal
//! checkpoints is not read.

use cortiq_formats::gguf::GgufMeta;
use cortiq_formats::hf::{ClassDefaults, HfClass, HfConfig};
use cortiq_formats::names::{DENSE_GLOBAL, NameTable};
use cortiq_kernels::ops::RopeStyle;

use super::{Arch, DENSE_BARE, DENSE_LAYER, GgufKeys, gguf_dense_base, hf_dense_base};
use crate::config::ModelConfig;
use crate::error::Result;

pub const ARCH: Arch = Arch {
    name: "mistral3",
    hf_names: &["Ministral3ForCausalLM", "ministral3"],
    from_gguf,
    from_hf,
    hf_norm_offset: 0.0,
    hf_plain_norms: &[],
    hf_fix: None,
    // Ministral3Config (its rope_parameters default is the released models' YaRN, factor 16
    // over 16,384, β 0.1; a config.json always carries its own).
    hf_class: HfClass {
        defaults: Some(ClassDefaults {
            vocab_size: 131072,
            hidden_size: 4096,
            intermediate_size: 14336,
            num_hidden_layers: 34,
            num_attention_heads: 32,
            num_key_value_heads: Some(8),
            head_dim: Some(128),
            hidden_act: "silu",
            max_position_embeddings: 262144,
            rms_norm_eps: 1e-5,
            bos: Some(1),
            eos: Some(2),
            pad: Some(11),
            sliding_window: None,
            query_pre_attn_scalar: None,
        }),
        rope_theta: (1_000_000.0, 1_000_000.0),
        ..HfClass::GENERIC
    },
    names: NameTable { global: DENSE_GLOBAL, layer: DENSE_LAYER, bare: DENSE_BARE, experts: None, mtp: false },
};

fn from_gguf(g: &dyn GgufMeta) -> Result<ModelConfig> {
    let mut cfg = gguf_dense_base(g, "mistral3", RopeStyle::Interleaved)?;
    let k = GgufKeys { g, arch: "mistral3" };
    if k.opt_usize("expert_count")?.unwrap_or(0) > 0 {
        return Err(k.bad("a mistral3 file with experts is not supported (dense Ministral 3 only)".into()));
    }
    if let Some(beta) = k.opt_f64("attention.temperature_scale")?.filter(|&b| b != 0.0) {
        // llama.cpp's floor is the YaRN original context, which must then be given.
        let orig = k
            .opt_usize("rope.scaling.original_context_length")?
            .filter(|&o| o > 0)
            .ok_or_else(|| k.bad("attention.temperature_scale needs rope.scaling.original_context_length".into()))?;
        cfg.ropes[0].q_temperature = Some((beta, orig));
    }
    Ok(cfg)
}

fn from_hf(h: &HfConfig) -> Result<ModelConfig> {
    let mut cfg = hf_dense_base(h, "mistral3")?;
    for l in &mut cfg.layers {
        l.sliding_window = h.sliding_window;
    }
    Ok(cfg)
}

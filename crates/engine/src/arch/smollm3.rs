//! SmolLM3 (`SmolLM3ForCausalLM`): Llama-shaped (GQA, SwiGLU, tied embeddings) with no
//! positional encoding in every fourth layer: layer i rotates q/k only where
//! `no_rope_layers[i]` is 1 (transformers derives it as (i + 1) % `no_rope_layer_interval`
//! != 0, interval 4). llama.cpp's `smollm3` files carry no such key: its graph uses the
//! interval 4, and its converter permutes Q/K rows as for Llama (interleaved RoPE pairs).

use cortiq_formats::gguf::GgufMeta;
use cortiq_formats::hf::{ClassDefaults, HfClass, HfConfig};
use cortiq_formats::names::{DENSE_GLOBAL, NameTable};
use cortiq_kernels::ops::RopeStyle;
use serde_json::Value;

use super::{Arch, DENSE_BARE, DENSE_LAYER, gguf_dense_base, hf_dense_base};
use crate::config::{ModelConfig, Rope, RopeScaling};
use crate::error::{EngineError, Result};

pub const ARCH: Arch = Arch {
    name: "smollm3",
    hf_names: &["SmolLM3ForCausalLM", "smollm3"],
    from_gguf,
    from_hf,
    hf_norm_offset: 0.0,
    hf_plain_norms: &[],
    hf_fix: None,
    // SmolLM3Config.
    hf_class: HfClass {
        defaults: Some(ClassDefaults {
            vocab_size: 128256,
            hidden_size: 2048,
            intermediate_size: 11008,
            num_hidden_layers: 36,
            num_attention_heads: 16,
            num_key_value_heads: Some(4),
            head_dim: None,
            hidden_act: "silu",
            max_position_embeddings: 32768,
            rms_norm_eps: 1e-6,
            bos: Some(128000),
            eos: Some(128001),
            pad: Some(128004),
            sliding_window: None,
            query_pre_attn_scalar: None,
        }),
        tie_word_embeddings: true,
        rope_theta: (2_000_000.0, 2_000_000.0),
        ..HfClass::GENERIC
    },
    names: NameTable { global: DENSE_GLOBAL, layer: DENSE_LAYER, bare: DENSE_BARE, experts: None, mtp: false },
};

/// The NoPE interval of transformers' default and of llama.cpp's graph.
const INTERVAL: usize = 4;

/// Rope 1 of the config rotates nothing; the NoPE layers use it.
fn set_nope(cfg: &mut ModelConfig, use_rope: &[bool]) {
    let style = cfg.ropes[0].style;
    cfg.ropes.push(Rope::new(style, 0, cfg.ropes[0].base, &RopeScaling::None));
    for (l, &rope) in cfg.layers.iter_mut().zip(use_rope) {
        l.rope = if rope { 0 } else { 1 };
    }
}

fn from_gguf(g: &dyn GgufMeta) -> Result<ModelConfig> {
    let mut cfg = gguf_dense_base(g, "smollm3", RopeStyle::Interleaved)?;
    let use_rope: Vec<bool> = (0..cfg.n_layers).map(|i| (i + 1) % INTERVAL != 0).collect();
    set_nope(&mut cfg, &use_rope);
    Ok(cfg)
}

fn from_hf(h: &HfConfig) -> Result<ModelConfig> {
    let mut cfg = hf_dense_base(h, "smollm3")?;
    let bad = |what: String| EngineError::BadConfig { file: h.path.display().to_string(), what };
    let raw = h.text_raw();
    let n = cfg.n_layers;
    let use_rope: Vec<bool> = match raw.get("no_rope_layers").filter(|v| !v.is_null()) {
        Some(Value::Array(a)) if a.len() == n => a
            .iter()
            .map(|v| v.as_u64().map(|x| x != 0))
            .collect::<Option<_>>()
            .ok_or_else(|| bad("no_rope_layers must hold 0 or 1 per layer".into()))?,
        Some(v) => return Err(bad(format!("no_rope_layers must be a list of {n} entries, got {v}"))),
        None => {
            let interval = raw.get("no_rope_layer_interval").and_then(Value::as_u64).unwrap_or(INTERVAL as u64) as usize;
            if interval == 0 {
                return Err(bad("no_rope_layer_interval must be at least 1".into()));
            }
            (0..n).map(|i| (i + 1) % interval != 0).collect()
        }
    };
    if raw.get("use_sliding_window").and_then(Value::as_bool).unwrap_or(false) {
        return Err(bad("use_sliding_window: SmolLM3 with sliding layers is not supported".into()));
    }
    set_nope(&mut cfg, &use_rope);
    Ok(cfg)
}

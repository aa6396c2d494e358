//! Gemma 3 (text): sliding-window layers with a global layer every 6th, (1+w) RMSNorms before
//! and after each sub-block, QK-norm, GELU-tanh FFN, embeddings scaled by √d_model, attention
//! scaled by query_pre_attn_scalar^-½, and separate RoPE bases for local and global layers.
//! GGUF files store the norm gains already as (1+w); the HF loader folds the +1 at load time.
//! llama.cpp hard-codes what the GGUF does not carry (pattern 6, local base 10k); so do we.

use cortiq_formats::gguf::GgufMeta;
use cortiq_kernels::ops::RopeStyle;

use cortiq_formats::hf::{ClassDefaults, HfClass, HfConfig};
use cortiq_formats::names::{ATTN_NORM_OUT, ATTN_QKV, Bias, DENSE_GLOBAL, NameTable, QK_NORM, SWIGLU};

use super::{Arch, DENSE_BARE, GgufKeys, gguf_dense_base, hf_dense_base, hf_rope};
use crate::config::{Activation, ModelConfig, Rope, RopeScaling};
use crate::error::Result;

pub const ARCH: Arch = Arch {
    name: "gemma3",
    hf_names: &["Gemma3ForCausalLM", "Gemma3ForConditionalGeneration", "gemma3_text", "gemma3"],
    from_gguf,
    from_hf,
    hf_norm_offset: 1.0,
    hf_plain_norms: &[],
    hf_fix: None,
    // Gemma3TextConfig (the text class of the composite Gemma3Config).
    hf_class: HfClass {
        text_model_type: Some("gemma3_text"),
        defaults: Some(ClassDefaults {
            vocab_size: 262_208,
            hidden_size: 2304,
            intermediate_size: 9216,
            num_hidden_layers: 26,
            num_attention_heads: 8,
            num_key_value_heads: Some(4),
            head_dim: Some(256),
            hidden_act: "gelu_pytorch_tanh",
            max_position_embeddings: 131_072,
            rms_norm_eps: 1e-6,
            bos: Some(2),
            eos: Some(1),
            pad: Some(0),
            sliding_window: Some(4096),
            query_pre_attn_scalar: Some(256.0),
        }),
        tie_word_embeddings: true,
        rope_theta: (1_000_000.0, LOCAL_ROPE_BASE),
        sliding_window_pattern: Some(PATTERN),
        local_rope: true,
        ..HfClass::GENERIC
    },
    names: NameTable {
        global: DENSE_GLOBAL,
        layer: &[ATTN_QKV, ATTN_NORM_OUT, QK_NORM, NORMS, SWIGLU, crate::mixers::vmf::NAMES],
        bare: DENSE_BARE,
        experts: None,
        mtp: false,
    },
};

/// Gemma's norms around each sub-block: HF `post_attention_layernorm` is a real
/// post-attention norm here (GGUF `post_attention_norm`), the pre-FFN norm is
/// `pre_feedforward_layernorm` (GGUF `ffn_norm`).
const NORMS: &[cortiq_formats::names::LayerRow] = &[
    ("post_attention_layernorm", "post_attention_norm", Bias::No),
    ("pre_feedforward_layernorm", "ffn_norm", Bias::No),
    ("post_feedforward_layernorm", "post_ffw_norm", Bias::No),
];

/// Every `PATTERN`th layer (il % 6 == 5) attends globally.
pub const PATTERN: usize = 6;
pub const LOCAL_ROPE_BASE: f64 = 10_000.0;

/// Apply Gemma 3's fixed features to a base config. `global_rope` is the full-attention RoPE,
/// `local_rope` the sliding one; `is_sliding[il]` says which layers slide over `window` keys.
pub fn finish(
    cfg: &mut ModelConfig,
    window: usize,
    is_sliding: &[bool],
    query_pre_attn_scalar: f64,
    global_rope: Rope,
    local_rope: Rope,
) {
    cfg.act = Activation::GeluTanh;
    cfg.qk_norm = true;
    cfg.llamacpp_scales_q = true;
    cfg.post_norms = true;
    // HF casts √d to the weights' dtype; in f32 this is the f32 rounding of the f64 root.
    cfg.embed_scale = Some((cfg.d_model as f64).sqrt() as f32);
    cfg.attn_scale = (1.0 / query_pre_attn_scalar.sqrt()) as f32;
    cfg.ropes = vec![global_rope, local_rope];
    for (spec, &sliding) in cfg.layers.iter_mut().zip(is_sliding) {
        spec.sliding_window = sliding.then_some(window);
        spec.rope = if sliding { 1 } else { 0 };
    }
}

fn from_gguf(g: &dyn GgufMeta) -> Result<ModelConfig> {
    let mut cfg = gguf_dense_base(g, "gemma3", RopeStyle::NeoX)?;
    let k = GgufKeys { g, arch: "gemma3" };
    let window = k.opt_usize("attention.sliding_window")?.unwrap_or(512);
    // Newer converters write the pattern and the local base; older files rely on llama.cpp's
    // hard-coded values, which every released Gemma 3 uses.
    // The pattern key is either a period or a per-layer array of "is sliding" flags.
    let is_sliding: Vec<bool> = match g.get("gemma3.attention.sliding_window_pattern") {
        Some(v) if v.as_array().is_some() => {
            let flags: Vec<bool> = v.as_array().unwrap_or_default().iter().filter_map(|f| f.as_bool()).collect();
            if flags.len() != cfg.n_layers {
                return Err(k.bad(format!(
                    "gemma3.attention.sliding_window_pattern has {} flags for {} layers",
                    flags.len(),
                    cfg.n_layers
                )));
            }
            flags
        }
        _ => {
            let pattern = k.opt_usize("attention.sliding_window_pattern")?.unwrap_or(PATTERN);
            if pattern == 0 {
                return Err(k.bad("gemma3.attention.sliding_window_pattern is 0".into()));
            }
            (0..cfg.n_layers).map(|il| il % pattern != pattern - 1).collect()
        }
    };
    let global = cfg.ropes[0].clone();
    let local_base = k.opt_f64("rope.freq_base_swa")?.unwrap_or(LOCAL_ROPE_BASE);
    let local = Rope::new(RopeStyle::NeoX, global.rot_dim, local_base, &RopeScaling::None);
    // llama.cpp scales attention by 1/√head_dim for every size but 27B (whose
    // query_pre_attn_scalar is d_model/n_heads); 270M's query_pre_attn_scalar equals head_dim.
    let qpas = cfg.head_dim as f64;
    finish(&mut cfg, window, &is_sliding, qpas, global, local);
    Ok(cfg)
}

fn from_hf(h: &HfConfig) -> Result<ModelConfig> {
    let mut cfg = hf_dense_base(h, "gemma3")?;
    let is_sliding: Vec<bool> = h.layer_types.iter().map(|t| t == "sliding_attention").collect();
    let window = match (h.sliding_window, is_sliding.iter().any(|&s| s)) {
        (Some(w), _) => w,
        (None, false) => 0,
        (None, true) => {
            return Err(crate::error::EngineError::BadConfig {
                file: h.path.display().to_string(),
                what: "sliding layers without a sliding_window".into(),
            });
        }
    };
    let global = cfg.ropes[0].clone();
    let local = match &h.rope_local {
        Some(p) => hf_rope(h, p, cfg.head_dim)?,
        None => Rope::new(RopeStyle::NeoX, global.rot_dim, LOCAL_ROPE_BASE, &RopeScaling::None),
    };
    let qpas = h.query_pre_attn_scalar.unwrap_or(cfg.head_dim as f64);
    finish(&mut cfg, window, &is_sliding, qpas, global, local);
    Ok(cfg)
}

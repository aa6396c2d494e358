//! The architecture registry: maps a GGUF `general.architecture` or an HF `architectures[0]`
//! to the file that owns that model's whole description: config parsing (GGUF and HF), the
//! transformers class's defaults ([`HfClass`]), the tensor names in both spellings
//! ([`NameTable`]) and the fixes a checkpoint needs at load. Adding an architecture is one
//! file here plus one line in `ARCHES`.

use std::path::Path;

use cortiq_formats::gguf::GgufMeta;
use cortiq_formats::hf::{self, HfClass, HfConfig};
use cortiq_formats::names::{ATTN_NORM_OUT, ATTN_QKV, LayerRow, NameTable, PRE_FFN_NORM, Pair, SWIGLU};
use cortiq_kernels::ops::RopeStyle;
use serde_json::Value;

use crate::config::{Activation, LayerSpec, ModelConfig, Rope, RopeScaling};
use crate::error::{EngineError, Result};

pub mod falcon_h1;
pub mod gemma3;
pub mod gpt_oss;
pub mod granitehybrid;
pub mod kimi_linear;
pub mod lfm2;
pub mod llama;
pub mod ministral3;
pub mod mistral;
pub mod nemotron_h;
pub mod qwen2;
pub mod qwen3;
pub mod qwen3_5;
pub mod qwen3moe;
pub mod smollm3;

/// What an architecture file provides.
pub struct Arch {
    /// Registry name, as GGUF's general.architecture spells it.
    pub name: &'static str,
    /// HF `architectures` entries (and model_type values) that mean this architecture.
    pub hf_names: &'static [&'static str],
    pub from_gguf: fn(&dyn GgufMeta) -> Result<ModelConfig>,
    pub from_hf: fn(&HfConfig) -> Result<ModelConfig>,
    /// Added to every RMSNorm gain of an HF checkpoint at load time (Gemma's (1+w) norms are
    /// stored as w in HF and as 1+w in GGUF; the engine always multiplies by the stored gain).
    pub hf_norm_offset: f32,
    /// GGUF-name suffixes of norms that keep a plain gain despite `hf_norm_offset`
    /// (Qwen3.5's GatedDeltaNet output norm, "ssm_norm.weight").
    pub hf_plain_norms: &'static [&'static str],
    /// A checkpoint fix at load: the tensor with this GGUF name built from the HF folder's own
    /// tensors (read by their table names through `get`) where the two layouts differ by more
    /// than a rename (gpt-oss's fused, transposed experts); None: not derived.
    pub hf_fix: Option<HfFix>,
    /// The transformers config class: defaults and reading rules of config.json.
    pub hf_class: HfClass,
    /// Tensor names, HF ↔ GGUF.
    pub names: NameTable,
}

/// `Arch::hf_fix`: tensors an HF folder holds in another layout than the engine's.
#[derive(Clone, Copy)]
pub struct HfFix {
    /// (GGUF name, the folder's tensors by table name, the text config) -> the tensor derived
    /// for that name, or None where the name is not derived.
    pub derive:
        fn(&str, &dyn Fn(&str) -> Result<Option<crate::qtensor::QTensor>>, &Value) -> Result<Option<crate::qtensor::QTensor>>,
    /// Whether `derive` builds the tensor of this GGUF-name suffix (after `blk.N.`): a cheap test,
    /// so that a conversion copies no derived tensor's stored bytes.
    pub derives: fn(&str) -> bool,
    /// The GGUF-name suffixes (after `blk.N.`) derived from the table's tensor of this suffix
    /// (empty: a tensor used as it is); a conversion lists those instead of it.
    pub replaces: fn(&str) -> &'static [&'static str],
}

/// The layer rows of a llama-style decoder (attention, pre-FFN norm, SwiGLU) with cortiq's
/// vmf_phase core, which any dense attention layer may be converted to.
pub const DENSE_LAYER: &[&[LayerRow]] = &[ATTN_QKV, ATTN_NORM_OUT, PRE_FFN_NORM, SWIGLU, crate::mixers::vmf::NAMES];
/// The bare parameters of a model whose attention layers may be converted to vmf_phase.
pub const DENSE_BARE: &[&[Pair]] = &[crate::mixers::vmf::BARE_NAMES];

pub const ARCHES: &[Arch] = &[
    llama::ARCH,
    qwen2::ARCH,
    qwen3::ARCH,
    qwen3moe::ARCH,
    gemma3::ARCH,
    lfm2::ARCH,
    lfm2::ARCH_MOE,
    qwen3_5::ARCH,
    qwen3_5::ARCH_MOE,
    qwen3_5::ARCH_NEXT,
    kimi_linear::ARCH,
    granitehybrid::ARCH,
    smollm3::ARCH,
    gpt_oss::ARCH,
    nemotron_h::ARCH,
    nemotron_h::ARCH_MOE,
    mistral::ARCH,
    ministral3::ARCH,
    falcon_h1::ARCH,
];

impl Arch {
    /// config.json text read with this architecture's class (a .cmf built from an HF folder
    /// embeds the file); `path` only names it in errors.
    pub fn hf_config_from_str(&self, path: &Path, s: &str) -> Result<HfConfig> {
        Ok(HfConfig::from_value(path, hf::parse_json(path, s)?, &self.hf_class)?)
    }

    /// The model an HF config describes: the architecture's own reading, then cortiq's
    /// `vmf_phase` layers (converted attention layers) where the config has them.
    pub fn config_from_hf(&self, h: &HfConfig) -> Result<ModelConfig> {
        let mut cfg = (self.from_hf)(h)?;
        crate::mixers::vmf::apply_hf(&h.raw, &h.path.display().to_string(), &mut cfg)?;
        Ok(cfg)
    }

    /// The model a GGUF's metadata (or a .cmf built from one) describes, `vmf_phase` layers
    /// (`cortiq.vmf_phase.*`) included.
    pub fn config_from_gguf(&self, g: &dyn GgufMeta) -> Result<ModelConfig> {
        let mut cfg = (self.from_gguf)(g)?;
        crate::mixers::vmf::apply_gguf(g, &mut cfg)?;
        Ok(cfg)
    }
}

/// The architecture an HF config names (`architectures`, or its model types), if one of ours.
fn hf_lookup(names: &[String]) -> Option<&'static Arch> {
    ARCHES.iter().find(|a| names.iter().any(|n| a.hf_names.contains(&n.as_str())))
}

/// Reads an HF config.json value with the class its names select ([`HfClass::GENERIC`] for a
/// model type none of our architectures claims: its geometry keys are then required).
pub fn hf_config(path: &Path, raw: Value) -> Result<HfConfig> {
    let class = hf_lookup(&hf::peek_names(&raw)).map_or(&HfClass::GENERIC, |a| &a.hf_class);
    Ok(HfConfig::from_value(path, raw, class)?)
}

/// [`hf_config`] on config.json text; `path` only names the file in errors.
pub fn hf_config_from_str(path: &Path, s: &str) -> Result<HfConfig> {
    hf_config(path, hf::parse_json(path, s)?)
}

/// [`hf_config`] on `<dir>/config.json`.
pub fn hf_config_from_dir(dir: &Path) -> Result<HfConfig> {
    let (path, raw) = hf::read_dir_json(dir)?;
    hf_config(&path, raw)
}

/// The architecture a parsed HF config belongs to.
pub fn for_hf(c: &HfConfig) -> Result<&'static Arch> {
    let mut names = c.architectures.clone();
    names.push(c.model_type.clone());
    names.extend(c.outer_model_type.clone());
    by_hf_name(&c.path.display().to_string(), &names)
}

/// The architecture a name means in either spelling: GGUF's `general.architecture` or one of
/// the HF names (class or model type).
pub fn by_any_name(name: &str) -> Option<&'static Arch> {
    ARCHES.iter().find(|a| a.name == name || a.hf_names.contains(&name))
}

pub fn supported() -> String {
    ARCHES.iter().map(|a| a.name).collect::<Vec<_>>().join(", ")
}

pub fn by_gguf_name(file: &str, name: &str) -> Result<&'static Arch> {
    ARCHES.iter().find(|a| a.name == name).ok_or_else(|| EngineError::UnknownArch {
        file: file.to_string(),
        arch: name.to_string(),
        supported: supported(),
    })
}

pub fn by_hf_name(file: &str, names: &[String]) -> Result<&'static Arch> {
    hf_lookup(names).ok_or_else(|| EngineError::UnknownArch {
        file: file.to_string(),
        arch: names.join("/"),
        supported: supported(),
    })
}

/// Reads `{arch}.*` keys of a GGUF file with errors naming the file and key.
pub struct GgufKeys<'a> {
    pub g: &'a dyn GgufMeta,
    pub arch: &'a str,
}

impl GgufKeys<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }
    pub fn usize(&self, k: &str) -> Result<usize> {
        Ok(self.g.get_u64(&self.key(k))? as usize)
    }
    pub fn opt_usize(&self, k: &str) -> Result<Option<usize>> {
        Ok(self.g.opt_u64(&self.key(k))?.map(|v| v as usize))
    }
    pub fn f64(&self, k: &str) -> Result<f64> {
        Ok(self.g.get_f64(&self.key(k))?)
    }
    pub fn opt_f64(&self, k: &str) -> Result<Option<f64>> {
        Ok(self.g.opt_f64(&self.key(k))?)
    }
    pub fn opt_str(&self, k: &str) -> Result<Option<&str>> {
        Ok(self.g.opt_str(&self.key(k))?)
    }
    pub fn bad(&self, what: String) -> EngineError {
        EngineError::BadConfig { file: self.g.meta_path().display().to_string(), what }
    }
}

/// The fields every dense GGUF carries, with one global RoPE; architecture files adjust.
pub fn gguf_dense_base(g: &dyn GgufMeta, arch: &'static str, style: RopeStyle) -> Result<ModelConfig> {
    let k = GgufKeys { g, arch };
    let d_model = k.usize("embedding_length")?;
    let n_layers = k.usize("block_count")?;
    let n_heads = k.usize("attention.head_count")?;
    let n_kv_heads = k.opt_usize("attention.head_count_kv")?.unwrap_or(n_heads);
    if n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 || n_layers == 0 {
        return Err(k.bad(format!("{n_heads} heads / {n_kv_heads} kv heads / {n_layers} layers is not a valid geometry")));
    }
    let head_dim = k.opt_usize("attention.key_length")?.unwrap_or(d_model / n_heads);
    let vocab = match g.tensor("token_embd.weight") {
        Some(t) if t.dims.len() == 2 => t.dims[1] as usize,
        _ => {
            return Err(EngineError::MissingTensor {
                file: g.meta_path().display().to_string(),
                tensor: "token_embd.weight".into(),
            });
        }
    };
    let rot_dim = k.opt_usize("rope.dimension_count")?.unwrap_or(head_dim);
    let theta = k.opt_f64("rope.freq_base")?.unwrap_or(10_000.0);
    let scaling = match k.opt_str("rope.scaling.type")? {
        None | Some("none") => RopeScaling::None,
        Some("linear") => RopeScaling::Linear { factor: k.f64("rope.scaling.factor")? },
        // llama.cpp's YaRN: correction dims rounded outwards, attention factor from the
        // factor unless the file gives one.
        Some("yarn") => {
            let factor = k.f64("rope.scaling.factor")?;
            RopeScaling::Yarn {
                factor,
                original_max_position: k.f64("rope.scaling.original_context_length")?,
                beta_fast: k.opt_f64("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
                beta_slow: k.opt_f64("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
                truncate: true,
                // llama.cpp: with `yarn_log_multiplier` (transformers' mscale_all_dim; its
                // mscale taken as 1) the factor is the ratio of the two mscales.
                attn_factor: match k.opt_f64("rope.scaling.yarn_attn_factor")? {
                    Some(f) => f,
                    None => match k.opt_f64("rope.scaling.yarn_log_multiplier")? {
                        Some(all) if all != 0.0 => RopeScaling::yarn_attn_factor(factor, Some(1.0), Some(all)),
                        _ => RopeScaling::yarn_attn_factor(factor, None, None),
                    },
                },
            }
        }
        Some(other) => return Err(k.bad(format!("rope scaling type '{other}' is not supported"))),
    };
    if rot_dim % 2 != 0 || rot_dim > head_dim {
        return Err(k.bad(format!("rope dimension {rot_dim} does not fit head_dim {head_dim}")));
    }
    Ok(ModelConfig {
        arch,
        n_layers,
        d_model,
        n_heads,
        n_kv_heads,
        head_dim,
        // MoE files may carry only the experts' widths (the architecture reads those).
        d_ff: k.opt_usize("feed_forward_length")?.unwrap_or(0),
        vocab,
        n_ctx_train: k.opt_usize("context_length")?.unwrap_or(4096),
        norm_eps: k.opt_f64("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-6) as f32,
        act: Activation::Silu,
        attn_scale: 1.0 / (head_dim as f32).sqrt(),
        qkv_bias: false,
        o_bias: false,
        attn_sinks: false,
        qk_norm: false,
        post_norms: false,
        embed_scale: None,
        residual_scale: None,
        logit_scale: None,
        final_logit_softcap: None,
        attn_logit_softcap: None,
        ropes: vec![Rope::new(style, rot_dim, theta, &scaling)],
        layers: (0..n_layers).map(|_| LayerSpec::attention(0)).collect(),
        output_norm: "output_norm.weight",
        ffn_norm: "ffn_norm.weight",
        attn_gate: false,
        moe: None,
        llamacpp_scales_q: false,
    })
}

fn hf_bad(h: &HfConfig, what: String) -> EngineError {
    EngineError::BadConfig { file: h.path.display().to_string(), what }
}

/// An HF rope as the engine's Rope (rotate-half layout, the HF convention).
pub fn hf_rope(h: &HfConfig, p: &hf::RopeParams, head_dim: usize) -> Result<Rope> {
    let scaling = match &p.scaling {
        hf::RopeScaling::None => RopeScaling::None,
        hf::RopeScaling::Linear { factor } => RopeScaling::Linear { factor: *factor },
        hf::RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
            RopeScaling::Llama3 {
                factor: *factor,
                low_freq_factor: *low_freq_factor,
                high_freq_factor: *high_freq_factor,
                original_max_position: *original_max_position_embeddings as f64,
            }
        }
        hf::RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            attention_factor,
            beta_fast,
            beta_slow,
            mscale,
            mscale_all_dim,
            truncate,
        } => RopeScaling::Yarn {
            factor: *factor,
            original_max_position: *original_max_position_embeddings as f64,
            beta_fast: *beta_fast,
            beta_slow: *beta_slow,
            truncate: *truncate,
            attn_factor: attention_factor.unwrap_or_else(|| RopeScaling::yarn_attn_factor(*factor, *mscale, *mscale_all_dim)),
        },
        other => return Err(hf_bad(h, format!("rope scaling {other:?} is not supported"))),
    };
    let rot_dim = ((head_dim as f64 * p.partial_rotary_factor) as usize) & !1;
    if rot_dim == 0 || rot_dim > head_dim {
        return Err(hf_bad(
            h,
            format!("partial_rotary_factor {} gives rotary dim {rot_dim} for head_dim {head_dim}", p.partial_rotary_factor),
        ));
    }
    let mut rope = Rope::new(RopeStyle::NeoX, rot_dim, p.theta, &scaling);
    rope.q_temperature = p.query_temperature;
    Ok(rope)
}

/// The dense fields of an HF config with one global RoPE; architecture files adjust.
pub fn hf_dense_base(h: &HfConfig, arch: &'static str) -> Result<ModelConfig> {
    let head_dim = h.head_dim();
    let (n_heads, n_kv_heads, n_layers) = (h.num_attention_heads, h.num_key_value_heads, h.num_hidden_layers);
    if n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 || n_layers == 0 || head_dim == 0 {
        return Err(hf_bad(h, format!("{n_heads} heads / {n_kv_heads} kv heads / {n_layers} layers is not a valid geometry")));
    }
    let act = match h.hidden_act.as_str() {
        "silu" | "swish" => Activation::Silu,
        "gelu_pytorch_tanh" | "gelu_tanh" => Activation::GeluTanh,
        other => return Err(hf_bad(h, format!("hidden activation '{other}' is not supported"))),
    };
    if h.o_bias || h.mlp_bias {
        return Err(hf_bad(h, "attention output / MLP biases are not supported".into()));
    }
    Ok(ModelConfig {
        arch,
        n_layers,
        d_model: h.hidden_size,
        n_heads,
        n_kv_heads,
        head_dim,
        d_ff: h.intermediate_size,
        vocab: h.vocab_size,
        n_ctx_train: h.max_position_embeddings,
        norm_eps: h.rms_norm_eps as f32,
        act,
        attn_scale: 1.0 / (head_dim as f32).sqrt(),
        qkv_bias: h.qkv_bias,
        o_bias: false,
        attn_sinks: false,
        qk_norm: false,
        post_norms: false,
        embed_scale: None,
        residual_scale: None,
        logit_scale: None,
        final_logit_softcap: h.final_logit_softcapping.map(|v| v as f32),
        attn_logit_softcap: h.attn_logit_softcapping.map(|v| v as f32),
        ropes: vec![hf_rope(h, &h.rope, head_dim)?],
        layers: (0..n_layers).map(|_| LayerSpec::attention(0)).collect(),
        output_norm: "output_norm.weight",
        ffn_norm: "ffn_norm.weight",
        attn_gate: false,
        moe: None,
        llamacpp_scales_q: false,
    })
}

/// A metadata view answering one key with one number: files whose `head_count_kv` is a
/// per-layer array (0 marking non-attention layers: LFM2, Kimi Linear) read through
/// `gguf_dense_base` with the attention layers' count.
pub struct KvOverride<'a> {
    g: &'a dyn GgufMeta,
    key: &'static str,
    value: cortiq_formats::gguf::MetaValue,
}

impl<'a> KvOverride<'a> {
    pub fn new(g: &'a dyn GgufMeta, key: &'static str, value: usize) -> KvOverride<'a> {
        KvOverride { g, key, value: cortiq_formats::gguf::MetaValue::U64(value as u64) }
    }
}

impl GgufMeta for KvOverride<'_> {
    fn meta_path(&self) -> &std::path::Path {
        self.g.meta_path()
    }
    fn get(&self, key: &str) -> Option<&cortiq_formats::gguf::MetaValue> {
        if key == self.key { Some(&self.value) } else { self.g.get(key) }
    }
    fn tensor(&self, name: &str) -> Option<&cortiq_formats::gguf::TensorInfo> {
        self.g.tensor(name)
    }
    fn tensor_data(&self, info: &cortiq_formats::gguf::TensorInfo) -> &[u8] {
        self.g.tensor_data(info)
    }
}

/// A per-layer integer array key (`head_count_kv` of hybrid files), or one number repeated.
pub fn per_layer_usize(k: &GgufKeys, key: &str, n_layers: usize) -> Result<Vec<usize>> {
    let full = format!("{}.{key}", k.arch);
    let v = k.g.get(&full).ok_or_else(|| k.bad(format!("missing metadata key '{full}'")))?;
    let vals: Vec<usize> = match v.as_array() {
        Some(a) => a
            .iter()
            .map(|x| x.as_i64().map(|x| x as usize))
            .collect::<Option<_>>()
            .ok_or_else(|| k.bad(format!("{full}: expected integers")))?,
        None => vec![v.as_i64().ok_or_else(|| k.bad(format!("{full}: expected an integer or an array")))? as usize; n_layers],
    };
    if vals.len() != n_layers {
        return Err(k.bad(format!("{full} has {} entries for {n_layers} layers", vals.len())));
    }
    Ok(vals)
}

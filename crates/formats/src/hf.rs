//! Hugging Face folder metadata: `config.json` (typed, both transformers-4 and
//! transformers-5 key styles normalized), `generation_config.json` and
//! `tokenizer_config.json` (+ `chat_template.jinja`).
//!
//! The reference for every default and normalization rule below is transformers 5.24
//! (`configuration_<model>.py` and `modeling_rope_utils.py`); where we follow it the comment
//! names the class. Values the config omits fall back to the model class's default, exactly as
//! transformers would do when it loads the file: each engine architecture file declares its
//! class as an [`HfClass`] (defaults and the class's own reading rules), and a config is read
//! with the class its `architectures` / `model_type` name ([`peek_names`]). Read with
//! [`HfClass::GENERIC`], the geometry fields are required and their absence is a
//! `FormatError::Missing` naming the field and file.
//!
//! Rope normalization (transformers' `standardize_rope_params`):
//! - new style: `rope_parameters` is one flat dict `{rope_type, rope_theta, factor, ...}` or a
//!   dict keyed by layer type (`{"full_attention": {...}, "sliding_attention": {...}}`);
//! - old style: `rope_theta` + `rope_scaling {rope_type|type, factor, ...}` +
//!   `partial_rotary_factor`; Gemma 3 adds `rope_local_base_freq` for its sliding layers and
//!   applies `rope_scaling` to the global (full-attention) layers only;
//! - `rope_scaling` wins over `rope_parameters` when both are present (as in transformers);
//!   values inside the dict win over top-level `rope_theta` / `partial_rotary_factor`.
//!
//! Layer types: explicit `layer_types` if present, else derived by the rule of
//! [`derive_layer_types`] (documented there).

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::{FormatError, Result};

// ---------------------------------------------------------------------------------------
// Rope

/// Frequency scaling of one rope. Field names follow `rope_parameters`.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// `rope_type: "default"` (or no scaling dict at all).
    None,
    /// Positions divided by `factor`.
    Linear { factor: f64 },
    /// Dynamic NTK: the base grows with the sequence length beyond max_position_embeddings.
    Dynamic { factor: f64 },
    /// Llama 3.1 smooth interpolation between scaled and unscaled frequencies.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position_embeddings: usize },
    /// YaRN. `factor` already resolved (transformers derives it from
    /// max_position_embeddings / original_max_position_embeddings when null); `beta_fast`
    /// and `beta_slow` default to 32 and 1, `truncate` to true; `attention_factor` `None`
    /// means "derive from factor/mscale/mscale_all_dim" as transformers does.
    Yarn {
        factor: f64,
        original_max_position_embeddings: usize,
        attention_factor: Option<f64>,
        beta_fast: f64,
        beta_slow: f64,
        mscale: Option<f64>,
        mscale_all_dim: Option<f64>,
        truncate: bool,
    },
    /// A rope type this crate does not model (longrope, proportional, axial, ...). The engine
    /// must refuse it rather than silently run default rope.
    Other { rope_type: String },
}

/// One rope: base, scaling and the fraction of head_dim it rotates.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeParams {
    pub theta: f64,
    pub scaling: RopeScaling,
    /// Fraction of head_dim that is rotated (1.0 = all); rotary dim = int(head_dim * f).
    pub partial_rotary_factor: f64,
    /// Llama 4's query temperature (Ministral 3): `(llama_4_scaling_beta,
    /// original_max_position_embeddings)`; queries are scaled by 1 + β·ln(1 + ⌊pos / orig⌋).
    pub query_temperature: Option<(f64, usize)>,
}

// ---------------------------------------------------------------------------------------
// config.json

/// A typed `config.json`. For multimodal checkpoints that nest the text model under
/// `text_config` (Gemma3ForConditionalGeneration, Qwen3_5ForConditionalGeneration), the fields
/// describe the text model; the vision tower's `vision_config` is not read.
#[derive(Clone, Debug)]
pub struct HfConfig {
    /// The file these values came from (for error messages further up).
    pub path: PathBuf,
    /// Top-level `architectures` (e.g. `["Gemma3ForConditionalGeneration"]`); may be empty.
    pub architectures: Vec<String>,
    /// The text model's `model_type` (`text_config.model_type` when nested, e.g. "gemma3_text").
    pub model_type: String,
    /// The top-level `model_type` when the text model is nested (e.g. "gemma3"), else `None`.
    pub outer_model_type: Option<String>,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Defaults to the class default (llama: = heads; qwen2/qwen3: 32; gemma3_text: 4);
    /// = heads for unknown model types.
    pub num_key_value_heads: usize,
    /// As given, or the class default where the class has one (qwen3 128, gemma3_text 256);
    /// `None` means hidden_size / num_attention_heads (see [`HfConfig::head_dim`]).
    pub head_dim: Option<usize>,
    pub vocab_size: usize,
    pub max_position_embeddings: usize,
    /// `rms_norm_eps` (`norm_eps` in LFM2 configs).
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    /// The `attention_bias` key as given (default false).
    pub attention_bias: bool,
    /// Whether q/k/v projections carry a bias: `attention_bias`, or always for qwen2
    /// (Qwen2Attention hard-codes bias=True on q/k/v and has no key for it).
    pub qkv_bias: bool,
    /// Whether o_proj carries a bias: `attention_bias` (qwen2: false).
    pub o_bias: bool,
    /// `mlp_bias` (llama), default false.
    pub mlp_bias: bool,
    /// `hidden_activation` (gemma) or `hidden_act`, e.g. "silu", "gelu_pytorch_tanh".
    pub hidden_act: String,
    /// Window of sliding-attention layers. For qwen2/qwen3 it is `None` unless
    /// `use_sliding_window` is true (Qwen2Config.__post_init__), whatever `sliding_window` says.
    pub sliding_window: Option<usize>,
    pub query_pre_attn_scalar: Option<f64>,
    pub attn_logit_softcapping: Option<f64>,
    pub final_logit_softcapping: Option<f64>,
    pub bos_token_id: Option<u32>,
    /// `eos_token_id` as a list (an int becomes a one-element list; null/absent: empty).
    /// For nested configs the top-level value wins over text_config's (see `Fields::either`).
    pub eos_token_ids: Vec<u32>,
    pub pad_token_id: Option<u32>,
    /// `dtype` (transformers 5) or `torch_dtype` (4), e.g. "bfloat16".
    pub dtype: Option<String>,
    /// The rope of full-attention layers (and of every layer when `rope_local` is `None`).
    pub rope: RopeParams,
    /// The rope of sliding-attention layers when the config gives them their own
    /// (Gemma 3: `rope_local_base_freq` / `rope_parameters.sliding_attention`).
    pub rope_local: Option<RopeParams>,
    /// One entry per layer: "full_attention", "sliding_attention", "linear_attention",
    /// "conv", ... (length == num_hidden_layers).
    pub layer_types: Vec<String>,
    /// `mtp_num_hidden_layers` (Qwen3-Next, Qwen3.5): the multi-token-prediction layers the
    /// checkpoint was released with; 0 when the key is absent. Fine-tunes may have dropped the
    /// tensors while keeping the key, so this says what to expect, not what is there.
    pub mtp_layers: usize,
    /// The whole file, for fields later issues need.
    pub raw: Value,
}

impl HfConfig {
    /// Normalizes an already-parsed config.json value (see [`parse_json`]) as `class` reads it.
    pub fn from_value(path: impl AsRef<Path>, raw: Value, class: &HfClass) -> Result<HfConfig> {
        let path = path.as_ref().to_path_buf();
        let top = raw.as_object().ok_or_else(|| FormatError::malformed(&path, "config.json is not a JSON object"))?;
        let (text, prefix) = match top.get("text_config") {
            Some(Value::Object(t)) => (t, "text_config."),
            Some(Value::Null) | None => (top, ""),
            Some(v) => {
                return Err(FormatError::field(&path, "text_config", format!("expected object, found {}", kind(v))));
            }
        };
        let f = Fields { path: &path, text, top, prefix };

        let architectures = match top.get("architectures") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| FormatError::field(&path, "architectures", "expected a list of strings"))?,
            Some(v) => {
                return Err(FormatError::field(&path, "architectures", format!("expected list, found {}", kind(v))));
            }
        };
        let outer_type = f.top_str("model_type")?;
        let model_type = match f.text_str("model_type")? {
            Some(t) => t,
            // A nested text_config without model_type: the composite config's text class.
            None => match class.text_model_type.filter(|_| !prefix.is_empty() && outer_type.is_some()) {
                Some(t) => t.to_string(),
                None => outer_type.clone().ok_or_else(|| FormatError::missing(&path, "field 'model_type'"))?,
            },
        };
        let outer_model_type = if prefix.is_empty() { None } else { outer_type };
        let d = class.defaults;

        let hidden_size = f.req_usize("hidden_size", d.map(|d| d.hidden_size))?;
        let num_attention_heads = f.req_usize("num_attention_heads", d.map(|d| d.num_attention_heads))?;
        if num_attention_heads == 0 {
            return Err(FormatError::field(&path, format!("{prefix}num_attention_heads"), "must be > 0"));
        }
        let num_hidden_layers = f.req_usize("num_hidden_layers", d.map(|d| d.num_hidden_layers))?;
        // LFM2 spells it block_ff_dim (Lfm2Config pops it into intermediate_size).
        // Mixture-of-experts configs may give only the experts' widths (Qwen3.5-MoE): the
        // dense width is then 0 and the architecture reads its expert keys.
        let intermediate_size = match (f.opt_usize("intermediate_size")?, f.opt_usize("block_ff_dim")?) {
            (Some(v), _) | (None, Some(v)) => v,
            (None, None) if f.opt_usize("moe_intermediate_size")?.is_some() => 0,
            (None, None) => f.req_usize("intermediate_size", d.map(|d| d.intermediate_size))?,
        };
        let vocab_size = f.req_usize("vocab_size", d.map(|d| d.vocab_size))?;
        let num_key_value_heads =
            f.opt_usize("num_key_value_heads")?.or(d.and_then(|d| d.num_key_value_heads)).unwrap_or(num_attention_heads);
        if num_key_value_heads == 0 || num_attention_heads % num_key_value_heads != 0 {
            return Err(FormatError::field(
                &path,
                format!("{prefix}num_key_value_heads"),
                format!("{num_key_value_heads} does not divide num_attention_heads {num_attention_heads}"),
            ));
        }
        let head_dim = f.opt_usize("head_dim")?.or(d.and_then(|d| d.head_dim));
        if head_dim == Some(0) {
            return Err(FormatError::field(&path, format!("{prefix}head_dim"), "must be > 0"));
        }
        // Kimi Linear spells it model_max_length.
        let max_position_embeddings = match (f.opt_usize("max_position_embeddings")?, f.opt_usize("model_max_length")?) {
            (Some(v), _) | (None, Some(v)) => v,
            (None, None) => f.req_usize("max_position_embeddings", d.map(|d| d.max_position_embeddings))?,
        };
        // LFM2 spells it norm_eps.
        let rms_norm_eps = match (f.opt_f64("rms_norm_eps")?, f.opt_f64("norm_eps")?) {
            (Some(v), _) | (None, Some(v)) => v,
            (None, None) => f.req_f64("rms_norm_eps", d.map(|d| d.rms_norm_eps))?,
        };
        let tie_word_embeddings = match f.opt_bool_either("tie_word_embeddings")? {
            Some(v) => v,
            None => f.opt_bool_either("tie_embedding")?.unwrap_or(class.tie_word_embeddings),
        };
        let attention_bias = f.opt_bool("attention_bias")?.unwrap_or(false);
        let qkv_bias = attention_bias || class.qkv_bias;
        let o_bias = attention_bias;
        let mlp_bias = f.opt_bool("mlp_bias")?.unwrap_or(false);
        // Models without the key (LFM2's fixed SwiGLU) get "silu", the activation of every
        // gated-MLP decoder we know; the arch file decides what it actually runs.
        let hidden_act = match (f.opt_string("hidden_activation")?, f.opt_string("hidden_act")?) {
            (Some(a), _) | (None, Some(a)) => a,
            (None, None) => d.map_or("silu", |d| d.hidden_act).to_string(),
        };
        let sliding_window = {
            let given = if f.text.contains_key("sliding_window") {
                f.opt_usize("sliding_window")?
            } else {
                d.and_then(|d| d.sliding_window)
            };
            if class.window_layers_from.is_some() && !f.opt_bool("use_sliding_window")?.unwrap_or(false) { None } else { given }
        };
        let query_pre_attn_scalar = match f.opt_f64("query_pre_attn_scalar")? {
            Some(v) => Some(v),
            None if !f.text.contains_key("query_pre_attn_scalar") => d.and_then(|d| d.query_pre_attn_scalar),
            None => None,
        };
        let attn_logit_softcapping = f.opt_f64("attn_logit_softcapping")?;
        let final_logit_softcapping = f.opt_f64("final_logit_softcapping")?;

        // Token ids and dtype may sit on either level of a nested config; the text level wins.
        let bos_token_id = f.token_id("bos_token_id", d.and_then(|d| d.bos))?;
        let eos_token_ids = f.token_ids("eos_token_id", d.and_then(|d| d.eos))?;
        let pad_token_id = f.token_id("pad_token_id", d.and_then(|d| d.pad))?;
        let dtype = match f.either_str("dtype")? {
            Some(s) => Some(s),
            None => f.either_str("torch_dtype")?,
        };

        let layer_types = derive_layer_types(&f, class, num_hidden_layers, sliding_window)?;
        let mtp_layers = f.opt_usize("mtp_num_hidden_layers")?.unwrap_or(0);
        let (rope, rope_local) = parse_rope(&f, class, max_position_embeddings)?;

        Ok(HfConfig {
            path,
            architectures,
            model_type,
            outer_model_type,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            vocab_size,
            max_position_embeddings,
            rms_norm_eps,
            tie_word_embeddings,
            attention_bias,
            qkv_bias,
            o_bias,
            mlp_bias,
            hidden_act,
            sliding_window,
            query_pre_attn_scalar,
            attn_logit_softcapping,
            final_logit_softcapping,
            bos_token_id,
            eos_token_ids,
            pad_token_id,
            dtype,
            rope,
            rope_local,
            layer_types,
            mtp_layers,
            raw,
        })
    }

    /// head_dim as given, else hidden_size / num_attention_heads (LlamaConfig.__post_init__).
    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    /// The rope of layer `i`: `rope_local` for sliding-attention layers when present,
    /// `rope` otherwise.
    pub fn rope_for_layer(&self, i: usize) -> &RopeParams {
        match (&self.rope_local, self.layer_types.get(i).map(String::as_str)) {
            (Some(local), Some("sliding_attention")) => local,
            _ => &self.rope,
        }
    }

    /// The text model's JSON object (`text_config` when nested, else the whole file).
    pub fn text_raw(&self) -> &Value {
        match self.raw.get("text_config") {
            Some(t @ Value::Object(_)) => t,
            _ => &self.raw,
        }
    }
}

/// Reads config.json text as JSON (`path` only names the file in errors).
pub fn parse_json(path: &Path, s: &str) -> Result<Value> {
    serde_json::from_str(s).map_err(|e| FormatError::malformed(path, format!("invalid JSON: {e}")))
}

/// Reads `<dir>/config.json` as JSON; returns its path and value.
pub fn read_dir_json(dir: &Path) -> Result<(PathBuf, Value)> {
    let path = dir.join("config.json");
    let s = fs::read_to_string(&path).map_err(|e| FormatError::io(&path, e))?;
    let v = parse_json(&path, &s)?;
    Ok((path, v))
}

/// The names a config gives its model, to find its class by: `architectures`, the text
/// model's `model_type` and the top-level one (they differ in a composite config).
pub fn peek_names(raw: &Value) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    if let Some(a) = raw.get("architectures").and_then(Value::as_array) {
        v.extend(a.iter().filter_map(Value::as_str).map(str::to_string));
    }
    if let Some(t) = raw.get("text_config").and_then(|t| t.get("model_type")).and_then(Value::as_str) {
        v.push(t.to_string());
    }
    if let Some(t) = raw.get("model_type").and_then(Value::as_str) {
        v.push(t.to_string());
    }
    v
}

/// What a transformers config class supplies when a key is absent, and the class's own reading
/// rules: one per architecture file in the engine (sources: the `configuration_<model>.py`
/// dataclasses of transformers 5.24).
#[derive(Clone, Copy, Debug)]
pub struct HfClass {
    /// The text model's `model_type` when a composite config's `text_config` omits it
    /// (Gemma3Config's text class is gemma3_text).
    pub text_model_type: Option<&'static str>,
    /// The geometry a missing key falls back to; `None`: those keys are required.
    pub defaults: Option<ClassDefaults>,
    /// `tie_word_embeddings` when the key is absent.
    pub tie_word_embeddings: bool,
    /// The rope base when neither `rope_theta` nor `rope_parameters.rope_theta` is given:
    /// (full-attention layers, sliding layers).
    pub rope_theta: (f64, f64),
    /// q/k/v projections always carry a bias (Qwen2).
    pub qkv_bias: bool,
    /// Qwen2 / Qwen3: the sliding window applies only with `use_sliding_window`, to the layers
    /// from `max_window_layers` (this default when absent) on.
    pub window_layers_from: Option<usize>,
    /// Every N-th layer is full attention, the others linear, when `full_attention_interval`
    /// is absent (Qwen3-Next / Qwen3.5: 4).
    pub full_attention_interval: Option<usize>,
    /// Every N-th layer is full attention, the others sliding, when `sliding_window_pattern`
    /// is absent (Gemma 3: 6).
    pub sliding_window_pattern: Option<usize>,
    /// `partial_rotary_factor` when absent (Qwen3-Next: 0.25).
    pub partial_rotary_factor: Option<f64>,
    /// Sliding layers run their own rope (`rope_local_base_freq`; Gemma 3).
    pub local_rope: bool,
}

impl HfClass {
    /// A class with no defaults and no rules of its own: how a config of an unknown model
    /// type is read.
    pub const GENERIC: HfClass = HfClass {
        text_model_type: None,
        defaults: None,
        tie_word_embeddings: false,
        rope_theta: (10_000.0, 10_000.0),
        qkv_bias: false,
        window_layers_from: None,
        full_attention_interval: None,
        sliding_window_pattern: None,
        partial_rotary_factor: None,
        local_rope: false,
    };
}

/// The class defaults a missing key can fall back to.
#[derive(Clone, Copy, Debug)]
pub struct ClassDefaults {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// `None` = same as num_attention_heads.
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub hidden_act: &'static str,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub pad: Option<u32>,
    pub sliding_window: Option<usize>,
    pub query_pre_attn_scalar: Option<f64>,
}

/// Derives `layer_types` (length num_hidden_layers), first rule that applies:
/// 1. `layer_types` as given (length must equal num_hidden_layers);
/// 2. `full_attn_idxs` (LFM2): listed layers "full_attention", the others "conv";
/// 3. `linear_attn_config.{full_attn_layers, kda_layers}` (Kimi Linear, 1-based indices):
///    "full_attention" / "linear_attention";
/// 4. `full_attention_interval` N (Qwen3-Next / Qwen3.5; default 4 for those model types):
///    layer i is "full_attention" when (i+1) % N == 0, else "linear_attention";
/// 5. `sliding_window_pattern` / `_sliding_window_pattern` N (Gemma 3 style; default 6 for
///    gemma3_text): layer i is "full_attention" when (i+1) % N == 0, else "sliding_attention";
/// 6. qwen2 / qwen3 with `use_sliding_window`: layers i >= `max_window_layers` slide;
/// 7. otherwise every layer is "full_attention".
fn derive_layer_types(f: &Fields, class: &HfClass, n: usize, sliding_window: Option<usize>) -> Result<Vec<String>> {
    let p = f.prefix;
    if let Some(v) = f.text.get("layer_types").filter(|v| !v.is_null()) {
        let list = v
            .as_array()
            .and_then(|a| a.iter().map(|x| x.as_str().map(str::to_string)).collect::<Option<Vec<_>>>())
            .ok_or_else(|| FormatError::field(f.path, format!("{p}layer_types"), "expected a list of strings"))?;
        if list.len() != n {
            return Err(FormatError::field(
                f.path,
                format!("{p}layer_types"),
                format!("has {} entries but num_hidden_layers is {n}", list.len()),
            ));
        }
        return Ok(list);
    }
    if let Some(v) = f.text.get("full_attn_idxs").filter(|v| !v.is_null()) {
        let idxs = f.usize_list(v, "full_attn_idxs")?;
        return Ok((0..n).map(|i| if idxs.contains(&i) { "full_attention" } else { "conv" }.to_string()).collect());
    }
    if let Some(Value::Object(lac)) = f.text.get("linear_attn_config")
        && let (Some(full), Some(kda)) = (lac.get("full_attn_layers"), lac.get("kda_layers"))
    {
        let full = f.usize_list(full, "linear_attn_config.full_attn_layers")?;
        let kda = f.usize_list(kda, "linear_attn_config.kda_layers")?;
        let mut out = vec![String::new(); n];
        for (list, name) in [(&full, "full_attention"), (&kda, "linear_attention")] {
            for &l in list {
                if l == 0 || l > n {
                    return Err(FormatError::field(
                        f.path,
                        format!("{p}linear_attn_config"),
                        format!("layer {l} is outside 1..={n}"),
                    ));
                }
                out[l - 1] = name.to_string();
            }
        }
        if let Some(i) = out.iter().position(String::is_empty) {
            return Err(FormatError::field(
                f.path,
                format!("{p}linear_attn_config"),
                format!("layer {} is in neither full_attn_layers nor kda_layers", i + 1),
            ));
        }
        return Ok(out);
    }
    let interval = match f.opt_usize("full_attention_interval")? {
        Some(v) => Some(v),
        None => class.full_attention_interval,
    };
    if let Some(k) = interval {
        if k == 0 {
            return Err(FormatError::field(f.path, format!("{p}full_attention_interval"), "must be > 0"));
        }
        return Ok(periodic(n, k, "linear_attention"));
    }
    let pattern = match f.opt_usize("sliding_window_pattern")? {
        Some(v) => Some(v),
        None => match f.opt_usize("_sliding_window_pattern")? {
            Some(v) => Some(v),
            None => class.sliding_window_pattern,
        },
    };
    if let Some(k) = pattern {
        if k == 0 {
            return Err(FormatError::field(f.path, format!("{p}sliding_window_pattern"), "must be > 0"));
        }
        return Ok(periodic(n, k, "sliding_attention"));
    }
    if let Some(default_first) = class.window_layers_from
        && sliding_window.is_some()
    {
        let first = f.opt_usize("max_window_layers")?.unwrap_or(default_first);
        return Ok((0..n).map(|i| if i >= first { "sliding_attention" } else { "full_attention" }.to_string()).collect());
    }
    Ok(vec!["full_attention".to_string(); n])
}

/// Every k-th layer (1-based) is full attention, the others `other`.
fn periodic(n: usize, k: usize, other: &str) -> Vec<String> {
    (0..n).map(|i| if (i + 1) % k == 0 { "full_attention" } else { other }.to_string()).collect()
}

/// Returns (rope of full-attention layers, rope of sliding layers if distinct).
fn parse_rope(f: &Fields, class: &HfClass, max_pos: usize) -> Result<(RopeParams, Option<RopeParams>)> {
    let p = f.prefix;
    let (theta_global, theta_local) = class.rope_theta;
    let top_theta = f.opt_f64("rope_theta")?;
    let top_prf = f.opt_f64("partial_rotary_factor")?;
    let top_prf = top_prf.or(class.partial_rotary_factor);
    // Phi3-style top-level original_max_position_embeddings wins over the dict's.
    let top_orig = f.opt_usize("original_max_position_embeddings")?;

    let scaling = f.text.get("rope_scaling").filter(|v| !v.is_null());
    let params = f.text.get("rope_parameters").filter(|v| !v.is_null());
    let (dict, dict_name) = match (scaling, params) {
        (Some(s), _) => (Some(s), "rope_scaling"),
        (None, Some(pm)) => (Some(pm), "rope_parameters"),
        (None, None) => (None, ""),
    };
    let dict = match dict {
        None => None,
        Some(Value::Object(m)) => Some(m),
        Some(v) => {
            return Err(FormatError::field(f.path, format!("{p}{dict_name}"), format!("expected object, found {}", kind(v))));
        }
    };
    let is_gemma3 = class.local_rope;
    // Nested by layer type iff a value is itself an object (a flat rope dict holds only
    // numbers, strings, bools and lists).
    let nested = dict.is_some_and(|m| m.values().any(Value::is_object));

    let ctx = RopeCtx { f, max_pos, top_orig, top_prf };
    if nested {
        let m = dict.expect("nested implies Some");
        let get = |k: &str| -> Result<Option<&Map<String, Value>>> {
            match m.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Object(o)) => Ok(Some(o)),
                Some(v) => {
                    Err(FormatError::field(f.path, format!("{p}{dict_name}.{k}"), format!("expected object, found {}", kind(v))))
                }
            }
        };
        let full_theta = top_theta.unwrap_or(theta_global);
        let local_theta = if is_gemma3 { f.opt_f64("rope_local_base_freq")?.unwrap_or(theta_local) } else { full_theta };
        let full_dict = get("full_attention")?;
        let rope = ctx.one(full_dict, full_theta, &format!("{p}{dict_name}.full_attention"))?;
        let rope_local = match get("sliding_attention")? {
            Some(sd) => Some(ctx.one(Some(sd), local_theta, &format!("{p}{dict_name}.sliding_attention"))?),
            None if is_gemma3 => Some(ctx.one(None, local_theta, "")?),
            None => None,
        };
        return Ok((rope, rope_local));
    }

    let rope = ctx.one(dict, top_theta.unwrap_or(theta_global), &format!("{p}{dict_name}"))?;
    let rope_local = if is_gemma3 {
        // Gemma3TextConfig.convert_rope_params_to_dict: old-style rope_scaling goes to the
        // full-attention layers; sliding layers run default rope at rope_local_base_freq.
        let theta = f.opt_f64("rope_local_base_freq")?.unwrap_or(theta_local);
        Some(RopeParams {
            theta,
            scaling: RopeScaling::None,
            partial_rotary_factor: top_prf.unwrap_or(1.0),
            query_temperature: None,
        })
    } else {
        None
    };
    Ok((rope, rope_local))
}

struct RopeCtx<'a> {
    f: &'a Fields<'a>,
    max_pos: usize,
    top_orig: Option<usize>,
    top_prf: Option<f64>,
}

impl RopeCtx<'_> {
    /// One flat rope dict (or none) into RopeParams. `name` is the dict's field path.
    fn one(&self, d: Option<&Map<String, Value>>, fallback_theta: f64, name: &str) -> Result<RopeParams> {
        let path = self.f.path;
        let empty = Map::new();
        let d = d.unwrap_or(&empty);
        let field = |k: &str| format!("{name}.{k}");
        let num = |k: &str| -> Result<Option<f64>> {
            match d.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_f64()
                    .map(Some)
                    .ok_or_else(|| FormatError::field(path, field(k), format!("expected number, found {}", kind(v)))),
            }
        };
        let req = |k: &str| -> Result<f64> { num(k)?.ok_or_else(|| FormatError::missing(path, format!("field '{}'", field(k)))) };
        let rope_type = match d.get("rope_type").or_else(|| d.get("type")) {
            None | Some(Value::Null) => "default".to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(v) => {
                return Err(FormatError::field(path, field("rope_type"), format!("expected string, found {}", kind(v))));
            }
        };
        let theta = num("rope_theta")?.unwrap_or(fallback_theta);
        if !(theta.is_finite() && theta > 0.0) {
            return Err(FormatError::field(path, field("rope_theta"), format!("{theta} is not a positive number")));
        }
        let partial_rotary_factor = num("partial_rotary_factor")?.or(self.top_prf).unwrap_or(1.0);
        if !(partial_rotary_factor > 0.0 && partial_rotary_factor <= 1.0) {
            return Err(FormatError::field(
                path,
                field("partial_rotary_factor"),
                format!("{partial_rotary_factor} is outside (0, 1]"),
            ));
        }
        let orig = || -> Result<usize> {
            if let Some(o) = self.top_orig {
                return Ok(o);
            }
            match num("original_max_position_embeddings")? {
                None => Ok(self.max_pos),
                Some(v) if v >= 1.0 && v.fract() == 0.0 => Ok(v as usize),
                Some(v) => Err(FormatError::field(
                    path,
                    field("original_max_position_embeddings"),
                    format!("{v} is not a positive integer"),
                )),
            }
        };
        let scaling = match rope_type.as_str() {
            "default" => RopeScaling::None,
            "linear" => RopeScaling::Linear { factor: req("factor")? },
            "dynamic" => RopeScaling::Dynamic { factor: req("factor")? },
            "llama3" => RopeScaling::Llama3 {
                factor: req("factor")?,
                low_freq_factor: req("low_freq_factor")?,
                high_freq_factor: req("high_freq_factor")?,
                original_max_position_embeddings: orig()?,
            },
            "yarn" => {
                let o = orig()?;
                let factor = num("factor")?.unwrap_or(self.max_pos as f64 / o as f64);
                RopeScaling::Yarn {
                    factor,
                    original_max_position_embeddings: o,
                    attention_factor: num("attention_factor")?,
                    // transformers uses `or`: 0 and null both mean the default.
                    beta_fast: num("beta_fast")?.filter(|&b| b != 0.0).unwrap_or(32.0),
                    beta_slow: num("beta_slow")?.filter(|&b| b != 0.0).unwrap_or(1.0),
                    mscale: num("mscale")?,
                    mscale_all_dim: num("mscale_all_dim")?,
                    truncate: match d.get("truncate") {
                        None | Some(Value::Null) => true,
                        Some(Value::Bool(b)) => *b,
                        Some(v) => {
                            return Err(FormatError::field(path, field("truncate"), format!("expected bool, found {}", kind(v))));
                        }
                    },
                }
            }
            other => RopeScaling::Other { rope_type: other.to_string() },
        };
        if let RopeScaling::Linear { factor } | RopeScaling::Dynamic { factor } | RopeScaling::Llama3 { factor, .. } = &scaling
            && !(factor.is_finite() && *factor > 0.0)
        {
            return Err(FormatError::field(path, field("factor"), format!("{factor} is not a positive number")));
        }
        let query_temperature = match num("llama_4_scaling_beta")? {
            Some(beta) if beta != 0.0 => Some((beta, orig()?)),
            _ => None,
        };
        Ok(RopeParams { theta, scaling, partial_rotary_factor, query_temperature })
    }
}

/// Typed field access over the text-model object (and, for a few keys, the top level).
struct Fields<'a> {
    path: &'a Path,
    text: &'a Map<String, Value>,
    top: &'a Map<String, Value>,
    /// "text_config." when nested, for error messages.
    prefix: &'a str,
}

impl Fields<'_> {
    fn name(&self, k: &str) -> String {
        format!("{}{k}", self.prefix)
    }
    fn bad(&self, k: &str, msg: String) -> FormatError {
        FormatError::field(self.path, self.name(k), msg)
    }
    fn opt_usize(&self, k: &str) -> Result<Option<usize>> {
        match self.text.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|x| usize::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| self.bad(k, format!("expected a non-negative integer, found {v}"))),
        }
    }
    fn req_usize(&self, k: &str, default: Option<usize>) -> Result<usize> {
        self.opt_usize(k)?.or(default).ok_or_else(|| FormatError::missing(self.path, format!("field '{}'", self.name(k))))
    }
    fn opt_f64(&self, k: &str) -> Result<Option<f64>> {
        match self.text.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| self.bad(k, format!("expected a number, found {}", kind(v)))),
        }
    }
    fn req_f64(&self, k: &str, default: Option<f64>) -> Result<f64> {
        self.opt_f64(k)?.or(default).ok_or_else(|| FormatError::missing(self.path, format!("field '{}'", self.name(k))))
    }
    fn opt_bool(&self, k: &str) -> Result<Option<bool>> {
        match self.text.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.bad(k, format!("expected a bool, found {}", kind(v)))),
        }
    }
    /// A bool on the text level, else on the top level (nested configs keep
    /// tie_word_embeddings at the top).
    fn opt_bool_either(&self, k: &str) -> Result<Option<bool>> {
        if let Some(b) = self.opt_bool(k)? {
            return Ok(Some(b));
        }
        match self.top.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(FormatError::field(self.path, k, format!("expected a bool, found {}", kind(v)))),
        }
    }
    fn opt_string(&self, k: &str) -> Result<Option<String>> {
        match self.text.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(self.bad(k, format!("expected a string, found {}", kind(v)))),
        }
    }
    fn text_str(&self, k: &str) -> Result<Option<String>> {
        self.opt_string(k)
    }
    fn top_str(&self, k: &str) -> Result<Option<String>> {
        match self.top.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(FormatError::field(self.path, k, format!("expected a string, found {}", kind(v)))),
        }
    }
    /// A string on the text level, else the top level.
    fn either_str(&self, k: &str) -> Result<Option<String>> {
        match self.text_str(k)? {
            Some(s) => Ok(Some(s)),
            None if self.prefix.is_empty() => Ok(None),
            None => self.top_str(k),
        }
    }
    /// For token ids: the top-level value when the config is nested and the top level has
    /// the key (Gemma 3's `eos_token_id: [1, 106]` lives there, while transformers 5 also
    /// writes the text class default `1` into text_config), else the text level's.
    fn either(&self, k: &str) -> Option<(&Value, String)> {
        if !self.prefix.is_empty()
            && let Some(v) = self.top.get(k)
        {
            return Some((v, k.to_string()));
        }
        self.text.get(k).map(|v| (v, self.name(k)))
    }
    fn token_id(&self, k: &str, default: Option<u32>) -> Result<Option<u32>> {
        match self.either(k) {
            None => Ok(default),
            Some((Value::Null, _)) => Ok(None),
            Some((v, name)) => {
                token(v).map(Some).ok_or_else(|| FormatError::field(self.path, name, format!("expected a token id, found {v}")))
            }
        }
    }
    fn token_ids(&self, k: &str, default: Option<u32>) -> Result<Vec<u32>> {
        match self.either(k) {
            None => Ok(default.into_iter().collect()),
            Some((v, name)) => token_list(v)
                .ok_or_else(|| FormatError::field(self.path, name, format!("expected a token id or a list of them, found {v}"))),
        }
    }
    fn usize_list(&self, v: &Value, k: &str) -> Result<Vec<usize>> {
        v.as_array()
            .and_then(|a| a.iter().map(|x| x.as_u64().and_then(|u| usize::try_from(u).ok())).collect::<Option<Vec<_>>>())
            .ok_or_else(|| self.bad(k, "expected a list of non-negative integers".to_string()))
    }
}

fn token(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|x| u32::try_from(x).ok())
}

/// int | [int] | null into a list.
fn token_list(v: &Value) -> Option<Vec<u32>> {
    match v {
        Value::Null => Some(Vec::new()),
        Value::Array(a) => a.iter().map(token).collect(),
        v => token(v).map(|t| vec![t]),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "object",
    }
}

fn read_json(path: &Path) -> Result<Map<String, Value>> {
    let s = fs::read_to_string(path).map_err(|e| FormatError::io(path, e))?;
    json_object(path, &s)
}

fn json_object(path: &Path, s: &str) -> Result<Map<String, Value>> {
    match serde_json::from_str::<Value>(s) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(v) => Err(FormatError::malformed(path, format!("expected a JSON object, found {}", kind(&v)))),
        Err(e) => Err(FormatError::malformed(path, format!("invalid JSON: {e}"))),
    }
}

// ---------------------------------------------------------------------------------------
// generation_config.json

/// A typed `generation_config.json` (every field optional, as the file is).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationConfig {
    pub bos_token_id: Option<u32>,
    /// int | [int] in the file; empty when absent or null.
    pub eos_token_ids: Vec<u32>,
    pub pad_token_id: Option<u32>,
    pub do_sample: Option<bool>,
    pub temperature: Option<f64>,
    pub top_k: Option<u64>,
    pub top_p: Option<f64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub max_new_tokens: Option<u64>,
    pub max_length: Option<u64>,
}

impl GenerationConfig {
    /// Reads `<dir>/generation_config.json`; `Ok(None)` when the file does not exist.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Option<GenerationConfig>> {
        let path = dir.as_ref().join("generation_config.json");
        if !path.exists() {
            return Ok(None);
        }
        let m = read_json(&path)?;
        Self::from_map(&path, &m).map(Some)
    }

    pub fn from_json_str(path: impl AsRef<Path>, s: &str) -> Result<GenerationConfig> {
        let path = path.as_ref();
        Self::from_map(path, &json_object(path, s)?)
    }

    fn from_map(path: &Path, m: &Map<String, Value>) -> Result<GenerationConfig> {
        let f = Fields { path, text: m, top: m, prefix: "" };
        let opt_u64 = |k: &str| -> Result<Option<u64>> {
            match m.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v.as_u64().map(Some).ok_or_else(|| f.bad(k, format!("expected a non-negative integer, found {v}"))),
            }
        };
        Ok(GenerationConfig {
            bos_token_id: f.token_id("bos_token_id", None)?,
            eos_token_ids: f.token_ids("eos_token_id", None)?,
            pad_token_id: f.token_id("pad_token_id", None)?,
            do_sample: f.opt_bool("do_sample")?,
            temperature: f.opt_f64("temperature")?,
            top_k: opt_u64("top_k")?,
            top_p: f.opt_f64("top_p")?,
            min_p: f.opt_f64("min_p")?,
            repetition_penalty: f.opt_f64("repetition_penalty")?,
            max_new_tokens: opt_u64("max_new_tokens")?,
            max_length: opt_u64("max_length")?,
        })
    }
}

// ---------------------------------------------------------------------------------------
// tokenizer_config.json

/// A special token as the file writes it: a string or `{ "content": ..., ... }`.
#[derive(Clone, Debug, PartialEq)]
pub struct AddedToken {
    pub content: String,
    /// `special` flag (true when the file gives a bare string in the bos/eos slots).
    pub special: bool,
}

/// A typed `tokenizer_config.json`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenizerConfig {
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub pad_token: Option<String>,
    pub unk_token: Option<String>,
    /// `None` when the file does not say (the tokenizer.json post-processor then decides).
    pub add_bos_token: Option<bool>,
    pub add_eos_token: Option<bool>,
    /// The default chat template: `chat_template` as a string, the entry named "default"
    /// of a list, or `chat_template.jinja` beside the file (transformers >= 4.5x saves it
    /// there).
    pub chat_template: Option<String>,
    /// Other named templates (`[{name, template}]` entries other than "default", e.g.
    /// "tool_use"), in file order.
    pub named_chat_templates: Vec<(String, String)>,
    pub model_max_length: Option<f64>,
    pub tokenizer_class: Option<String>,
    pub clean_up_tokenization_spaces: Option<bool>,
    /// `added_tokens_decoder`: id -> token, in id order.
    pub added_tokens: Vec<(u32, AddedToken)>,
}

impl TokenizerConfig {
    /// Reads `<dir>/tokenizer_config.json` (and `chat_template.jinja` when the JSON has no
    /// template); `Ok(None)` when neither file exists.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Option<TokenizerConfig>> {
        let dir = dir.as_ref();
        let path = dir.join("tokenizer_config.json");
        let jinja = dir.join("chat_template.jinja");
        let mut tc = if path.exists() {
            let m = read_json(&path)?;
            Self::from_map(&path, &m)?
        } else if jinja.exists() {
            TokenizerConfig::default()
        } else {
            return Ok(None);
        };
        if tc.chat_template.is_none() && jinja.exists() {
            tc.chat_template = Some(fs::read_to_string(&jinja).map_err(|e| FormatError::io(&jinja, e))?);
        }
        Ok(Some(tc))
    }

    pub fn from_json_str(path: impl AsRef<Path>, s: &str) -> Result<TokenizerConfig> {
        let path = path.as_ref();
        Self::from_map(path, &json_object(path, s)?)
    }

    fn from_map(path: &Path, m: &Map<String, Value>) -> Result<TokenizerConfig> {
        let f = Fields { path, text: m, top: m, prefix: "" };
        let tok = |k: &str| -> Result<Option<String>> {
            match m.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => added_token(v)
                    .map(|t| Some(t.content))
                    .ok_or_else(|| f.bad(k, "expected a string or an object with string 'content'".to_string())),
            }
        };
        let (chat_template, named_chat_templates) = match m.get("chat_template") {
            None | Some(Value::Null) => (None, Vec::new()),
            Some(Value::String(s)) => (Some(s.clone()), Vec::new()),
            Some(Value::Array(a)) => {
                let mut default = None;
                let mut named = Vec::new();
                for (i, e) in a.iter().enumerate() {
                    let name = e.get("name").and_then(Value::as_str);
                    let tmpl = e.get("template").and_then(Value::as_str);
                    let (Some(name), Some(tmpl)) = (name, tmpl) else {
                        return Err(f.bad(&format!("chat_template[{i}]"), "expected {name: string, template: string}".into()));
                    };
                    if name == "default" {
                        default = Some(tmpl.to_string());
                    } else {
                        named.push((name.to_string(), tmpl.to_string()));
                    }
                }
                (default, named)
            }
            Some(v) => return Err(f.bad("chat_template", format!("expected a string or a list, found {}", kind(v)))),
        };
        let mut added_tokens = Vec::new();
        match m.get("added_tokens_decoder") {
            None | Some(Value::Null) => {}
            Some(Value::Object(d)) => {
                for (id, v) in d {
                    let id: u32 =
                        id.parse().map_err(|_| f.bad("added_tokens_decoder", format!("key '{id}' is not a token id")))?;
                    let t = added_token(v)
                        .ok_or_else(|| f.bad(&format!("added_tokens_decoder.{id}"), "expected {content: string, ...}".into()))?;
                    added_tokens.push((id, t));
                }
                added_tokens.sort_by_key(|(id, _)| *id);
            }
            Some(v) => return Err(f.bad("added_tokens_decoder", format!("expected an object, found {}", kind(v)))),
        }
        Ok(TokenizerConfig {
            bos_token: tok("bos_token")?,
            eos_token: tok("eos_token")?,
            pad_token: tok("pad_token")?,
            unk_token: tok("unk_token")?,
            add_bos_token: f.opt_bool("add_bos_token")?,
            add_eos_token: f.opt_bool("add_eos_token")?,
            chat_template,
            named_chat_templates,
            model_max_length: f.opt_f64("model_max_length")?,
            tokenizer_class: f.opt_string("tokenizer_class")?,
            clean_up_tokenization_spaces: f.opt_bool("clean_up_tokenization_spaces")?,
            added_tokens,
        })
    }
}

/// "tok" | {"content": "tok", "special": bool?, ...}
fn added_token(v: &Value) -> Option<AddedToken> {
    match v {
        Value::String(s) => Some(AddedToken { content: s.clone(), special: true }),
        Value::Object(o) => Some(AddedToken {
            content: o.get("content")?.as_str()?.to_string(),
            special: o.get("special").and_then(Value::as_bool).unwrap_or(false),
        }),
        _ => None,
    }
}

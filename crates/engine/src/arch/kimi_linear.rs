//! Kimi Linear (HF folders): Kimi Delta Attention layers ("linear_attention") and multi-head
//! latent attention layers ("full_attention": MLA with no RoPE at all), a dense FFN in the
//! leading layers ("dense" in `mlp_layer_types`) and a mixture of experts elsewhere (sigmoid
//! scores, a selection-only correction bias, top-k renormalized when `moe_renormalize`, the
//! routed sum × `routed_scaling_factor`, `num_shared_experts` shared experts without a gate),
//! plain-gain RMSNorms, the KDA output norm σ-gated.
//!
//! llama.cpp's `kimi-linear` GGUF: per-layer `head_count_kv` (0 = KDA), MLA's kv_b split into
//! per-head k_b (transposed) and v_b (rejoined at load), A stored as −exp(A_log).
//! Not yet: `q_lora_rank`, grouped routing (`num_expert_group` > 1), and the legacy Moonshot
//! config spelling (`linear_attn_config`) in HF folders.

use cortiq_formats::gguf::GgufMeta;
use cortiq_formats::hf::{HfClass, HfConfig};
use cortiq_formats::names::{
    ATTN_NORM_OUT, ATTN_QKV, Bias, DENSE_GLOBAL, Experts, LayerRow, NameTable, PRE_FFN_NORM, Pair, SWIGLU,
};
use cortiq_kernels::ops::RopeStyle;

use super::{Arch, GgufKeys, KvOverride, gguf_dense_base, hf_dense_base, per_layer_usize};
use crate::config::{LayerSpec, MixerKind, ModelConfig};
use crate::error::{EngineError, Result};
use crate::mixers::kda::KdaConfig;
use crate::mixers::mla::MlaConfig;
use crate::moe::{ExpertAct, MoeConfig, Scoring};

pub const ARCH: Arch = Arch {
    name: "kimi-linear",
    hf_names: &["KimiLinearForCausalLM", "kimi_linear"],
    from_gguf,
    from_hf,
    hf_norm_offset: 0.0,
    hf_plain_norms: &[],
    hf_fix: None,
    hf_class: HfClass::GENERIC,
    names: NameTable {
        global: DENSE_GLOBAL,
        layer: &[ATTN_QKV, ATTN_NORM_OUT, PRE_FFN_NORM, SWIGLU, crate::mixers::vmf::NAMES, LAYER],
        bare: &[BARE, crate::mixers::vmf::BARE_NAMES],
        // Kimi's experts: w1 (gate), w3 (up), w2 (down).
        experts: Some(Experts {
            prefix: "block_sparse_moe.experts.",
            projs: &[("w1", "ffn_gate_exps"), ("w3", "ffn_up_exps"), ("w2", "ffn_down_exps")],
        }),
        mtp: false,
    },
};

/// KDA, MLA and Kimi's MoE spellings.
const LAYER: &[LayerRow] = &[
    ("self_attn.q_conv1d", "ssm_conv1d_q", Bias::No),
    ("self_attn.k_conv1d", "ssm_conv1d_k", Bias::No),
    ("self_attn.v_conv1d", "ssm_conv1d_v", Bias::No),
    ("self_attn.f_a_proj", "ssm_f_a", Bias::No),
    ("self_attn.f_b_proj", "ssm_f_b", Bias::No),
    ("self_attn.g_a_proj", "ssm_g_a", Bias::No),
    ("self_attn.g_b_proj", "ssm_g_b", Bias::No),
    ("self_attn.b_proj", "ssm_beta", Bias::No),
    ("self_attn.o_norm", "ssm_norm", Bias::No),
    ("self_attn.kv_a_proj_with_mqa", "attn_kv_a_mqa", Bias::No),
    ("self_attn.kv_a_layernorm", "attn_kv_a_norm", Bias::No),
    // llama.cpp splits kv_b into attn_k_b / attn_v_b; HF folders keep it whole.
    ("self_attn.kv_b_proj", "attn_kv_b", Bias::No),
    ("block_sparse_moe.gate", "ffn_gate_inp", Bias::No),
    ("block_sparse_moe.shared_experts.gate_proj", "ffn_gate_shexp", Bias::No),
    ("block_sparse_moe.shared_experts.up_proj", "ffn_up_shexp", Bias::No),
    ("block_sparse_moe.shared_experts.down_proj", "ffn_down_shexp", Bias::No),
];

/// KDA's decay parameters and the router's selection bias.
const BARE: &[Pair] = &[
    ("self_attn.dt_bias", "ssm_dt.bias"),
    ("self_attn.A_log", "ssm_a"),
    ("block_sparse_moe.gate.e_score_correction_bias", "exp_probs_b.bias"),
];

fn from_hf(h: &HfConfig) -> Result<ModelConfig> {
    let mut cfg = hf_dense_base(h, "kimi-linear")?;
    let bad = |what: String| EngineError::BadConfig { file: h.path.display().to_string(), what };
    let raw = &h.raw;
    let get = |k: &str| -> Result<usize> {
        raw.get(k).and_then(|v| v.as_u64()).map(|v| v as usize).ok_or_else(|| bad(format!("missing or non-integer '{k}'")))
    };
    if raw.get("q_lora_rank").is_some_and(|v| !v.is_null()) {
        return Err(bad("q_lora_rank is not supported yet (only q_proj)".into()));
    }
    if raw.get("num_expert_group").and_then(|v| v.as_u64()).unwrap_or(1) != 1 {
        return Err(bad("grouped expert routing (num_expert_group > 1) is not supported yet".into()));
    }
    let kda = KdaConfig {
        d_model: cfg.d_model,
        n_heads: get("linear_num_heads")?,
        d_head: get("linear_head_dim")?,
        conv_kernel: get("linear_conv_kernel_dim")?,
        norm_eps: cfg.norm_eps,
    };
    let mla = MlaConfig {
        d_model: cfg.d_model,
        n_heads: cfg.n_heads,
        nope: get("qk_nope_head_dim")?,
        rope: get("qk_rope_head_dim")?,
        v_dim: get("v_head_dim")?,
        kv_lora: get("kv_lora_rank")?,
        norm_eps: cfg.norm_eps,
    };
    let n_shared = raw.get("num_shared_experts").and_then(|v| v.as_u64()).unwrap_or(0) as usize;
    let ffe = get("moe_intermediate_size")?;
    cfg.moe = Some(MoeConfig {
        n_experts: get("num_experts")?,
        top_k: raw
            .get("num_experts_per_token")
            .or_else(|| raw.get("num_experts_per_tok"))
            .and_then(|v| v.as_u64())
            .ok_or_else(|| bad("missing 'num_experts_per_token'".into()))? as usize,
        scoring: Scoring::Sigmoid,
        norm_topk: raw.get("moe_renormalize").and_then(|v| v.as_bool()).unwrap_or(true),
        topk_eps: 0.0,
        routed_scale: raw.get("routed_scaling_factor").and_then(|v| v.as_f64()).unwrap_or(1.0) as f32,
        d_ff_expert: ffe,
        d_ff_shared: (n_shared > 0).then_some(n_shared * ffe),
        shared_gate: false,
        act: ExpertAct::Gated,
        ungated: false,
    });
    let mlp_types: Vec<String> = raw
        .get("mlp_layer_types")
        .and_then(|v| v.as_array())
        .map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect())
        .ok_or_else(|| bad("missing 'mlp_layer_types'".into()))?;
    if mlp_types.len() != h.layer_types.len() {
        return Err(bad(format!("mlp_layer_types has {} entries for {} layers", mlp_types.len(), h.layer_types.len())));
    }
    cfg.layers = h
        .layer_types
        .iter()
        .zip(&mlp_types)
        .enumerate()
        .map(|(i, (t, m))| {
            let moe = match m.as_str() {
                "sparse" => true,
                "dense" => false,
                other => return Err(bad(format!("mlp_layer_types[{i}] = '{other}': 'dense' or 'sparse'"))),
            };
            let mixer = match t.as_str() {
                "linear_attention" => MixerKind::Kda(kda),
                "full_attention" => MixerKind::Mla(mla),
                other => {
                    return Err(bad(format!(
                        "layer_types[{i}] = '{other}': Kimi Linear layers are 'linear_attention' or 'full_attention'"
                    )));
                }
            };
            Ok(LayerSpec { mixer, moe, sliding_window: None, rope: 0, ffn: true })
        })
        .collect::<Result<_>>()?;
    Ok(cfg)
}

fn from_gguf(g: &dyn GgufMeta) -> Result<ModelConfig> {
    let arch = "kimi-linear";
    let k = GgufKeys { g, arch };
    let n_layers = k.usize("block_count")?;
    // head_count_kv per layer: 0 marks a KDA layer, the rest are MLA.
    let kv = per_layer_usize(&k, "attention.head_count_kv", n_layers)?;
    let n_kv = kv.iter().copied().filter(|&x| x > 0).max().unwrap_or(1);
    let mut cfg = gguf_dense_base(&KvOverride::new(g, "kimi-linear.attention.head_count_kv", n_kv), arch, RopeStyle::NeoX)?;
    let d = cfg.d_model;
    let dh = k.usize("kda.head_dim")?;
    // KDA heads from the first KDA layer's q projection (the file has no key of its own).
    let kda_heads = match kv.iter().position(|&x| x == 0) {
        Some(il) => {
            let name = format!("blk.{il}.attn_q.weight");
            let t = g
                .tensor(&name)
                .ok_or_else(|| EngineError::MissingTensor { file: g.meta_path().display().to_string(), tensor: name.clone() })?;
            (t.dims.get(1).copied().unwrap_or(0) as usize) / dh.max(1)
        }
        None => 0,
    };
    let kda = KdaConfig {
        d_model: d,
        n_heads: kda_heads,
        d_head: dh,
        conv_kernel: k.usize("ssm.conv_kernel")?,
        norm_eps: cfg.norm_eps,
    };
    let qk = k.usize("attention.key_length_mla")?;
    let rope = k.opt_usize("rope.dimension_count")?.unwrap_or(0);
    let mla = MlaConfig {
        d_model: d,
        n_heads: cfg.n_heads,
        nope: qk.checked_sub(rope).ok_or_else(|| k.bad(format!("MLA key length {qk} < rope dimension {rope}")))?,
        rope,
        v_dim: k.usize("attention.value_length_mla")?,
        kv_lora: k.usize("attention.kv_lora_rank")?,
        norm_eps: cfg.norm_eps,
    };
    let ffe = k.usize("expert_feed_forward_length")?;
    let n_shared = k.opt_usize("expert_shared_count")?.unwrap_or(0);
    cfg.moe = Some(MoeConfig {
        n_experts: k.usize("expert_count")?,
        top_k: k.usize("expert_used_count")?,
        scoring: Scoring::Sigmoid,
        norm_topk: g.get("kimi-linear.expert_weights_norm").and_then(|v| v.as_bool()).unwrap_or(true),
        topk_eps: 0.0,
        routed_scale: k.opt_f64("expert_weights_scale")?.unwrap_or(1.0) as f32,
        d_ff_expert: ffe,
        d_ff_shared: (n_shared > 0).then_some(n_shared * ffe),
        shared_gate: false,
        act: ExpertAct::Gated,
        ungated: false,
    });
    let dense = k.opt_usize("leading_dense_block_count")?.unwrap_or(0);
    cfg.layers = kv
        .iter()
        .enumerate()
        .map(|(il, &x)| LayerSpec {
            mixer: if x == 0 { MixerKind::Kda(kda) } else { MixerKind::Mla(mla) },
            moe: il >= dense,
            sliding_window: None,
            rope: 0,
            ffn: true,
        })
        .collect();
    Ok(cfg)
}

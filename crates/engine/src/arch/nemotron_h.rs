//! NVIDIA Nemotron-H (`NemotronHForCausalLM`; Nemotron Nano 2, Nemotron 3 Nano): a stack of
//! single-purpose blocks, each `norm → mixer → residual` with one of four mixers: Mamba2
//! (`mixers::mamba2`, grouped gated norm), GQA attention without positional encoding, an
//! ungated relu² MLP, or a mixture of experts of relu² MLPs (sigmoid scores, a selection-only
//! correction bias, renormalized top-k × `routed_scaling_factor`, one shared expert). In the
//! engine's layer = mixer + FFN, an MLP or MoE block is a layer with no mixer
//! (`MixerKind::Identity`, its norm the FFN's) and a Mamba2 or attention block a layer with
//! no FFN (`LayerSpec::ffn` false); relu² runs as relu(up)·up (`Activation::Relu2`).
//!
//! Checkpoint quirks: tensors live under `backbone.` (`backbone.embeddings`,
//! `backbone.norm_f`); the layer pattern is `layers_block_type` (transformers 5: mamba →
//! "linear_attention", attention → "full_attention", "mlp", "moe") or the hub's
//! `hybrid_override_pattern` string (M mamba, * attention, - mlp, E moe). Mamba2's dt is
//! clamped below at `time_step_min` (transformers' mixer), which llama.cpp's scan does not do:
//! a GGUF runs without the clamp, as llama.cpp does.

use cortiq_formats::gguf::GgufMeta;
use cortiq_formats::hf::{ClassDefaults, HfClass, HfConfig};
use cortiq_formats::names::{Bias, Experts, LayerRow, NameTable, Pair};
use cortiq_kernels::ops::RopeStyle;
use serde_json::Value;

use super::{Arch, GgufKeys, KvOverride, gguf_dense_base, hf_dense_base, per_layer_usize};
use crate::config::{Activation, LayerSpec, MixerKind, ModelConfig, Rope, RopeScaling};
use crate::error::{EngineError, Result};
use crate::geometry::Mamba2Config;
use crate::moe::{ExpertAct, MoeConfig, Scoring};

pub const ARCH: Arch = Arch {
    name: "nemotron_h",
    hf_names: &["NemotronHForCausalLM", "nemotron_h"],
    from_gguf,
    from_hf,
    hf_norm_offset: 0.0,
    hf_plain_norms: &[],
    hf_fix: None,
    // NemotronHConfig (num_hidden_layers comes from the layer pattern).
    hf_class: HfClass {
        defaults: Some(ClassDefaults {
            vocab_size: 131072,
            hidden_size: 4096,
            intermediate_size: 21504,
            num_hidden_layers: 4,
            num_attention_heads: 32,
            num_key_value_heads: Some(8),
            head_dim: Some(128),
            hidden_act: "silu",
            max_position_embeddings: 4096,
            rms_norm_eps: 1e-5,
            bos: Some(1),
            eos: Some(2),
            pad: Some(0),
            sliding_window: None,
            query_pre_attn_scalar: None,
        }),
        ..HfClass::GENERIC
    },
    names: NameTable {
        global: &[
            ("backbone.embeddings.weight", "token_embd.weight"),
            ("backbone.norm_f.weight", "output_norm.weight"),
            ("lm_head.weight", "output.weight"),
        ],
        layer: &[LAYER],
        bare: &[BARE],
        experts: Some(Experts { prefix: "mixer.experts.", projs: &[("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")] }),
        mtp: false,
    },
};

const LAYER: &[LayerRow] = &[
    ("norm", "attn_norm", Bias::No),
    ("mixer.in_proj", "ssm_in", Bias::No),
    ("mixer.conv1d", "ssm_conv1d", Bias::Yes),
    ("mixer.norm", "ssm_norm", Bias::No),
    ("mixer.out_proj", "ssm_out", Bias::No),
    ("mixer.q_proj", "attn_q", Bias::No),
    ("mixer.k_proj", "attn_k", Bias::No),
    ("mixer.v_proj", "attn_v", Bias::No),
    ("mixer.o_proj", "attn_output", Bias::No),
    ("mixer.up_proj", "ffn_up", Bias::No),
    ("mixer.down_proj", "ffn_down", Bias::No),
    ("mixer.gate", "ffn_gate_inp", Bias::No),
    ("mixer.shared_experts.up_proj", "ffn_up_shexp", Bias::No),
    ("mixer.shared_experts.down_proj", "ffn_down_shexp", Bias::No),
];
const BARE: &[Pair] = &[
    ("mixer.dt_bias", "ssm_dt.bias"),
    ("mixer.A_log", "ssm_a"),
    ("mixer.D", "ssm_d"),
    ("mixer.gate.e_score_correction_bias", "exp_probs_b.bias"),
];

/// A block's kind.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Block {
    Mamba,
    Attention,
    Mlp,
    Moe,
}

fn block(t: &str) -> Option<Block> {
    match t {
        "mamba" | "linear_attention" | "M" => Some(Block::Mamba),
        "attention" | "full_attention" | "*" => Some(Block::Attention),
        "mlp" | "-" => Some(Block::Mlp),
        "moe" | "E" => Some(Block::Moe),
        _ => None,
    }
}

fn spec(b: Block, m: Mamba2Config) -> LayerSpec {
    let mixer = match b {
        Block::Mamba => MixerKind::Mamba2(m),
        Block::Attention => MixerKind::Attention,
        Block::Mlp | Block::Moe => MixerKind::Identity,
    };
    LayerSpec { mixer, moe: b == Block::Moe, sliding_window: None, rope: 0, ffn: matches!(b, Block::Mlp | Block::Moe) }
}

/// Attention without positional encoding.
fn no_rope() -> Rope {
    Rope::new(RopeStyle::NeoX, 0, 10_000.0, &RopeScaling::None)
}

fn moe_config(n_experts: usize, top_k: usize, scale: f32, ff: usize, shared: usize, norm: bool) -> MoeConfig {
    MoeConfig {
        n_experts,
        top_k,
        scoring: Scoring::Sigmoid,
        norm_topk: norm,
        topk_eps: 1e-20,
        routed_scale: scale,
        d_ff_expert: ff,
        d_ff_shared: (shared > 0).then_some(shared),
        shared_gate: false,
        act: ExpertAct::Gated,
        ungated: true,
    }
}

fn from_hf(h: &HfConfig) -> Result<ModelConfig> {
    let bad = |what: String| EngineError::BadConfig { file: h.path.display().to_string(), what };
    let raw = h.text_raw();
    let int = |k: &str, d: u64| raw.get(k).and_then(Value::as_u64).unwrap_or(d) as usize;
    let num = |k: &str, d: f64| raw.get(k).and_then(Value::as_f64).unwrap_or(d);
    let blocks: Vec<Block> = match (
        raw.get("layers_block_type").and_then(Value::as_array),
        raw.get("hybrid_override_pattern").and_then(Value::as_str),
    ) {
        (Some(a), _) => a
            .iter()
            .enumerate()
            .map(|(i, t)| {
                t.as_str()
                    .and_then(block)
                    .ok_or_else(|| bad(format!("layers_block_type[{i}] = {t}: not mamba, attention, mlp or moe")))
            })
            .collect::<Result<_>>()?,
        (None, Some(p)) => p
            .chars()
            .enumerate()
            .map(|(i, c)| {
                block(&c.to_string()).ok_or_else(|| bad(format!("hybrid_override_pattern[{i}] = '{c}': not M, *, - or E")))
            })
            .collect::<Result<_>>()?,
        (None, None) => return Err(bad("neither layers_block_type nor hybrid_override_pattern".into())),
    };
    if raw.get("moe_latent_size").is_some_and(|v| !v.is_null()) {
        return Err(bad("moe_latent_size: latent MoE projections are not supported".into()));
    }
    if raw.get("mamba_proj_bias").and_then(Value::as_bool).unwrap_or(false)
        || raw.get("mlp_bias").and_then(Value::as_bool).unwrap_or(false)
    {
        return Err(bad("mamba_proj_bias / mlp_bias: biases are not supported".into()));
    }
    match raw.get("mlp_hidden_act").and_then(Value::as_str).unwrap_or("relu2") {
        "relu2" => {}
        other => return Err(bad(format!("mlp_hidden_act '{other}': only relu2 is supported"))),
    }
    let mut cfg = hf_dense_base(h, "nemotron_h")?;
    cfg.act = Activation::Relu2;
    cfg.norm_eps = num("layer_norm_epsilon", 1e-5) as f32;
    cfg.ropes = vec![no_rope()];
    cfg.n_layers = blocks.len();
    let n_groups = int("n_groups", 8);
    let m = Mamba2Config {
        d_model: cfg.d_model,
        n_heads: int("mamba_num_heads", 128),
        head_dim: int("mamba_head_dim", 64),
        n_groups,
        d_state: int("ssm_state_size", 128),
        conv_kernel: int("conv_kernel", 4),
        conv_bias: raw.get("use_conv_bias").and_then(Value::as_bool).unwrap_or(true),
        norm_eps: cfg.norm_eps,
        norm_groups: n_groups,
        norm: crate::geometry::MambaNorm::GateThenNorm,
        // transformers' NemotronHMamba2Mixer: (time_step_min, inf), whatever time_step_limit says.
        dt_min: num("time_step_min", 0.001) as f32,
        dt_max: f32::INFINITY,
    };
    if m.n_groups == 0 || m.n_heads % m.n_groups != 0 || m.head_dim == 0 || m.d_state == 0 {
        return Err(bad(format!("Mamba2 geometry {} heads / {} groups is not valid", m.n_heads, m.n_groups)));
    }
    if blocks.contains(&Block::Moe) {
        if int("n_group", 1) != 1 {
            return Err(bad("n_group > 1: group-limited expert choice is not supported".into()));
        }
        let shared = int("n_shared_experts", 1) * int("moe_shared_expert_intermediate_size", 7688);
        let mc = moe_config(
            int("n_routed_experts", 8),
            int("num_experts_per_tok", 2),
            num("routed_scaling_factor", 1.0) as f32,
            int("moe_intermediate_size", 7688),
            shared,
            raw.get("norm_topk_prob").and_then(Value::as_bool).unwrap_or(true),
        );
        if mc.top_k == 0 || mc.top_k > mc.n_experts {
            return Err(bad(format!("{} experts per token of {}", mc.top_k, mc.n_experts)));
        }
        cfg.moe = Some(mc);
    }
    cfg.layers = blocks.iter().map(|&b| spec(b, m)).collect();
    Ok(cfg)
}

/// llama.cpp writes every transformers-5 Nemotron-H (whose config always carries
/// `num_experts_per_tok`) as `nemotron_h_moe`; the same blocks, read the same way.
pub const ARCH_MOE: Arch = Arch { name: "nemotron_h_moe", hf_names: &[], from_gguf: from_gguf_moe, ..ARCH };

fn from_gguf(g: &dyn GgufMeta) -> Result<ModelConfig> {
    gguf_config(g, "nemotron_h", ["nemotron_h.attention.head_count_kv", "nemotron_h.feed_forward_length"])
}

fn from_gguf_moe(g: &dyn GgufMeta) -> Result<ModelConfig> {
    gguf_config(g, "nemotron_h_moe", ["nemotron_h_moe.attention.head_count_kv", "nemotron_h_moe.feed_forward_length"])
}

/// `keys`: the per-layer arrays (kv heads, FFN width) `gguf_dense_base` reads as one number.
fn gguf_config(g: &dyn GgufMeta, arch: &'static str, keys: [&'static str; 2]) -> Result<ModelConfig> {
    let k = GgufKeys { g, arch };
    let n_layers = k.usize("block_count")?;
    // head_count_kv per layer marks the attention blocks, feed_forward_length the MLP ones, a
    // router the MoE ones; the rest are Mamba2.
    let kv = per_layer_usize(&k, "attention.head_count_kv", n_layers)?;
    let ff = per_layer_usize(&k, "feed_forward_length", n_layers).unwrap_or_else(|_| vec![0; n_layers]);
    let n_kv = kv.iter().copied().filter(|&x| x > 0).max().unwrap_or(1);
    let max_ff = ff.iter().copied().max().unwrap_or(0);
    let mut cfg = gguf_dense_base(&KvOverride::new(&KvOverride::new(g, keys[0], n_kv), keys[1], max_ff), arch, RopeStyle::NeoX)?;
    cfg.act = Activation::Relu2;
    // Nemotron-H's files carry a plain `layer_norm_epsilon` key.
    if let Some(eps) = k.opt_f64("attention.layer_norm_epsilon")? {
        cfg.norm_eps = eps as f32;
    }
    cfg.ropes = vec![no_rope()];
    let blocks: Vec<Block> = (0..n_layers)
        .map(|i| {
            if kv[i] > 0 {
                Block::Attention
            } else if g.tensor(&format!("blk.{i}.ffn_gate_inp.weight")).is_some() {
                Block::Moe
            } else if ff[i] > 0 {
                Block::Mlp
            } else {
                Block::Mamba
            }
        })
        .collect();
    let (inner, n_heads, n_groups) = (k.usize("ssm.inner_size")?, k.usize("ssm.time_step_rank")?, k.usize("ssm.group_count")?);
    let m = Mamba2Config {
        d_model: cfg.d_model,
        n_heads,
        head_dim: inner / n_heads.max(1),
        n_groups,
        d_state: k.usize("ssm.state_size")?,
        conv_kernel: k.usize("ssm.conv_kernel")?,
        conv_bias: blocks
            .iter()
            .position(|&b| b == Block::Mamba)
            .is_some_and(|il| g.tensor(&format!("blk.{il}.ssm_conv1d.bias")).is_some()),
        norm_eps: cfg.norm_eps,
        norm_groups: n_groups,
        norm: crate::geometry::MambaNorm::GateThenNorm,
        dt_min: 0.0,
        dt_max: f32::INFINITY,
    };
    if n_groups == 0 || m.d_inner() != inner || n_heads % n_groups != 0 {
        return Err(k.bad(format!("ssm inner size {inner} / {n_heads} heads / {n_groups} groups is not a Mamba2 geometry")));
    }
    if blocks.contains(&Block::Moe) {
        let mc = moe_config(
            k.usize("expert_count")?,
            k.usize("expert_used_count")?,
            k.opt_f64("expert_weights_scale")?.unwrap_or(1.0) as f32,
            k.usize("expert_feed_forward_length")?,
            k.opt_usize("expert_shared_feed_forward_length")?.unwrap_or(0),
            g.get(&format!("{arch}.expert_weights_norm")).and_then(|v| v.as_bool()).unwrap_or(true),
        );
        cfg.moe = Some(mc);
    }
    cfg.layers = blocks.iter().map(|&b| spec(b, m)).collect();
    Ok(cfg)
}

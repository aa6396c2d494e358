//! Qwen3-MoE (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (per-head
//! q/k RMSNorm, no biases, NeoX RoPE) with a mixture-of-experts FFN: softmax over all experts,
//! top-k, renormalized when `norm_topk_prob`, no shared expert. Layer i is MoE when
//! (i + 1) % `decoder_sparse_step` == 0 and i is not in `mlp_only_layers`; the others run a
//! dense SwiGLU of `intermediate_size`.
//!
//! GGUF (llama.cpp's `qwen3moe`): the experts stacked (`ffn_{gate,up,down}_exps`), the router
//! `ffn_gate_inp`; llama.cpp always renormalizes the top-k weights (`expert_weights_norm`, where
//! the file carries it, says so explicitly). A layer without a router is read as dense.

use cortiq_formats::gguf::GgufMeta;
use cortiq_formats::hf::{ClassDefaults, HfClass, HfConfig};
use cortiq_formats::names::{
    ATTN_NORM_OUT, ATTN_QKV, DENSE_GLOBAL, MLP_EXPERTS, MOE_ROUTER, NameTable, PRE_FFN_NORM, QK_NORM, SWIGLU,
};
use cortiq_kernels::ops::RopeStyle;

use super::{Arch, DENSE_BARE, GgufKeys, gguf_dense_base, hf_dense_base};
use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::moe::{ExpertAct, MoeConfig, Scoring};

pub const ARCH: Arch = Arch {
    name: "qwen3moe",
    hf_names: &["Qwen3MoeForCausalLM", "qwen3_moe"],
    from_gguf,
    from_hf,
    hf_norm_offset: 0.0,
    hf_plain_norms: &[],
    hf_fix: None,
    // Qwen3MoeConfig: Qwen2Config's defaults but for its geometry.
    hf_class: HfClass {
        defaults: Some(ClassDefaults {
            hidden_size: 2048,
            intermediate_size: 6144,
            num_hidden_layers: 24,
            num_key_value_heads: Some(4),
            ..super::qwen2::DEFAULTS
        }),
        // use_sliding_window slides every layer (the class has no max_window_layers).
        window_layers_from: Some(0),
        ..HfClass::GENERIC
    },
    names: NameTable {
        global: DENSE_GLOBAL,
        layer: &[ATTN_QKV, ATTN_NORM_OUT, QK_NORM, PRE_FFN_NORM, SWIGLU, MOE_ROUTER, crate::mixers::vmf::NAMES],
        bare: DENSE_BARE,
        experts: Some(MLP_EXPERTS),
        mtp: false,
    },
};

fn from_hf(h: &HfConfig) -> Result<ModelConfig> {
    let mut cfg = hf_dense_base(h, "qwen3moe")?;
    cfg.qk_norm = true;
    let bad = |what: String| EngineError::BadConfig { file: h.path.display().to_string(), what };
    let raw = h.text_raw();
    let num = |k: &str, default: usize| -> Result<usize> {
        match raw.get(k).filter(|v| !v.is_null()) {
            None => Ok(default),
            Some(v) => v.as_u64().map(|v| v as usize).ok_or_else(|| bad(format!("'{k}' must be a non-negative integer"))),
        }
    };
    let moe = MoeConfig {
        // Real checkpoints spell it num_experts; transformers 5 saves num_local_experts.
        n_experts: match raw.get("num_experts").filter(|v| !v.is_null()) {
            Some(_) => num("num_experts", 128)?,
            None => num("num_local_experts", 128)?,
        },
        top_k: num("num_experts_per_tok", 8)?,
        scoring: Scoring::Softmax,
        norm_topk: raw.get("norm_topk_prob").and_then(|v| v.as_bool()).unwrap_or(false),
        topk_eps: 0.0,
        routed_scale: 1.0,
        d_ff_expert: num("moe_intermediate_size", 768)?,
        d_ff_shared: None,
        shared_gate: false,
        act: ExpertAct::Gated,
        ungated: false,
    };
    let step = num("decoder_sparse_step", 1)?;
    let dense_only: Vec<usize> = match raw.get("mlp_only_layers").filter(|v| !v.is_null()) {
        None => Vec::new(),
        Some(v) => v
            .as_array()
            .and_then(|a| a.iter().map(|x| x.as_u64().map(|x| x as usize)).collect::<Option<_>>())
            .ok_or_else(|| bad("'mlp_only_layers' must be a list of layer indices".into()))?,
    };
    check(&moe, step, bad)?;
    for (i, l) in cfg.layers.iter_mut().enumerate() {
        l.moe = moe.n_experts > 0 && (i + 1) % step == 0 && !dense_only.contains(&i);
    }
    finish(&mut cfg, h.layer_types.iter().map(|t| t == "sliding_attention").collect(), h.sliding_window, moe);
    Ok(cfg)
}

fn from_gguf(g: &dyn GgufMeta) -> Result<ModelConfig> {
    let k = GgufKeys { g, arch: "qwen3moe" };
    let mut cfg = gguf_dense_base(g, "qwen3moe", RopeStyle::NeoX)?;
    cfg.qk_norm = true;
    let norm_topk = match g.get("qwen3moe.expert_weights_norm") {
        None => true,
        Some(v) => v.as_bool().ok_or_else(|| k.bad("qwen3moe.expert_weights_norm must be a boolean".into()))?,
    };
    let moe = MoeConfig {
        n_experts: k.usize("expert_count")?,
        top_k: k.usize("expert_used_count")?,
        scoring: Scoring::Softmax,
        norm_topk,
        topk_eps: 0.0,
        routed_scale: 1.0,
        d_ff_expert: k.usize("expert_feed_forward_length")?,
        d_ff_shared: None,
        shared_gate: false,
        act: ExpertAct::Gated,
        ungated: false,
    };
    check(&moe, 1, |what| k.bad(what))?;
    for (i, l) in cfg.layers.iter_mut().enumerate() {
        l.moe = g.tensor(&format!("blk.{i}.ffn_gate_inp.weight")).is_some();
    }
    let n = cfg.n_layers;
    finish(&mut cfg, vec![false; n], None, moe);
    Ok(cfg)
}

fn check(moe: &MoeConfig, step: usize, bad: impl Fn(String) -> EngineError) -> Result<()> {
    if step == 0 || (moe.n_experts > 0 && (moe.top_k == 0 || moe.top_k > moe.n_experts || moe.d_ff_expert == 0)) {
        return Err(bad(format!(
            "{} experts, top-{}, expert width {}, decoder_sparse_step {step} is not a valid mixture of experts",
            moe.n_experts, moe.top_k, moe.d_ff_expert
        )));
    }
    Ok(())
}

/// Qwen2/Qwen3's opt-in sliding window on the given layers; the experts where any layer uses them.
fn finish(cfg: &mut ModelConfig, sliding: Vec<bool>, window: Option<usize>, moe: MoeConfig) {
    for (l, s) in cfg.layers.iter_mut().zip(sliding) {
        l.sliding_window = if s { window } else { None };
    }
    if cfg.layers.iter().any(|l| l.moe) {
        cfg.moe = Some(moe);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The HF reading of the layer pattern: `decoder_sparse_step` and `mlp_only_layers`.
    #[test]
    fn sparse_step_and_dense_layers() {
        let text = r#"{"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 64,
            "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 6, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 16, "decoder_sparse_step": 2, "mlp_only_layers": [3], "norm_topk_prob": true}"#;
        let h = super::super::hf_config_from_str(std::path::Path::new("t/config.json"), text).unwrap();
        let cfg = ARCH.config_from_hf(&h).unwrap();
        let moe: Vec<bool> = cfg.layers.iter().map(|l| l.moe).collect();
        assert_eq!(moe, [false, true, false, false, false, true]);
        let m = cfg.moe.unwrap();
        assert_eq!((m.n_experts, m.top_k, m.d_ff_expert, m.norm_topk, m.d_ff_shared), (4, 2, 16, true, None));
        assert!(cfg.qk_norm && !cfg.qkv_bias);
        let bad = text.replace(r#""num_experts_per_tok": 2"#, r#""num_experts_per_tok": 5"#);
        let h = super::super::hf_config_from_str(std::path::Path::new("t/config.json"), &bad).unwrap();
        let e = ARCH.config_from_hf(&h).unwrap_err().to_string();
        assert!(e.contains("top-5") && e.contains("t/config.json"), "{e}");
    }
}

//! The one table mapping Hugging Face tensor names to GGUF tensor names and back, for the
//! dense architectures llama, qwen2, qwen3 and gemma3, and the hybrid lfm2.
//!
//! GGUF names follow llama.cpp's gguf-py (`gguf/constants.py` TENSOR_NAMES and the per-arch
//! tensor lists); HF names are the module paths of transformers' `*ForCausalLM` classes.
//! Everything else in the crate that needs a name translation comes here, so a new
//! architecture is one new row set, not a new `match` in a loader.
//!
//! Naming pitfalls this table encodes:
//! - HF `post_attention_layernorm` is the *pre-FFN* norm for llama/qwen (GGUF `ffn_norm`),
//!   but a real post-attention norm for gemma3 (GGUF `post_attention_norm`), whose pre-FFN
//!   norm is `pre_feedforward_layernorm` (GGUF `ffn_norm`).
//! - Gemma 3's multimodal checkpoint (`Gemma3ForConditionalGeneration`) prefixes the text
//!   model: `model.language_model.layers.N...` in transformers 5 and
//!   `language_model.model.layers.N...` in transformers 4. [`hf_to_gguf`] accepts both;
//!   [`gguf_to_hf`] answers with the text-only `Gemma3ForCausalLM` spelling
//!   (`model.layers.N...`).
//! - Some GGUF tensors have no HF twin (llama's `rope_freqs`, derived from the rope
//!   scaling config): those map to `None`.

/// Which architectures a row applies to.
#[derive(Clone, Copy)]
enum Archs {
    /// llama, qwen2, qwen3, gemma3, lfm2.
    All,
    /// llama, qwen2, qwen3, gemma3, qwen3.5 (names LFM2 spells its own way).
    Dense,
    /// Qwen3.5's GatedDeltaNet layers (dense and MoE models).
    Qwen35,
    /// Mixture-of-experts FFN rows (router, shared expert).
    Moe,
    /// Qwen3-Next's fused GatedDeltaNet input projections.
    Qwen3Next,
    /// Kimi Linear (KDA, MLA, its MoE names).
    Kimi,
    /// llama, qwen2, qwen3 (post_attention_layernorm is the pre-FFN norm).
    NotGemma,
    /// qwen3, gemma3 (per-head q/k RMSNorm).
    QkNorm,
    Gemma3,
    Lfm2,
}

impl Archs {
    fn has(self, arch: Arch) -> bool {
        match self {
            Archs::All => true,
            Archs::Dense => arch != Arch::Lfm2,
            Archs::NotGemma => matches!(arch, Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Kimi) || arch.qwen_hybrid(),
            Archs::QkNorm => matches!(arch, Arch::Qwen3 | Arch::Gemma3) || arch.qwen_hybrid(),
            Archs::Qwen35 => arch.qwen_hybrid(),
            Archs::Moe => matches!(arch, Arch::Qwen35Moe | Arch::Qwen3Next),
            Archs::Kimi => arch == Arch::Kimi,
            Archs::Qwen3Next => arch == Arch::Qwen3Next,
            Archs::Gemma3 => arch == Arch::Gemma3,
            Archs::Lfm2 => arch == Arch::Lfm2,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Gemma3,
    Lfm2,
    Qwen35,
    Qwen35Moe,
    Qwen3Next,
    Kimi,
}

impl Arch {
    /// Qwen3-Next and Qwen3.5 (dense and MoE): GatedDeltaNet + gated attention.
    fn qwen_hybrid(self) -> bool {
        matches!(self, Arch::Qwen35 | Arch::Qwen35Moe | Arch::Qwen3Next)
    }
}

/// Accepts the GGUF `general.architecture` spelling and the HF `model_type` spelling.
fn parse_arch(arch: &str) -> Option<Arch> {
    Some(match arch {
        "llama" => Arch::Llama,
        "qwen2" => Arch::Qwen2,
        "qwen3" => Arch::Qwen3,
        "gemma3" | "gemma3_text" => Arch::Gemma3,
        "lfm2" => Arch::Lfm2,
        "qwen35" | "qwen3_5" | "qwen3_5_text" => Arch::Qwen35,
        "qwen35moe" | "qwen3_5_moe" | "qwen3_5_moe_text" => Arch::Qwen35Moe,
        "qwen3next" | "qwen3_next" => Arch::Qwen3Next,
        "kimi-linear" | "kimi_linear" => Arch::Kimi,
        _ => return None,
    })
}

/// Tensors outside the layer stack: (HF name, GGUF name, archs).
const GLOBAL: &[(&str, &str, Archs)] = &[
    ("model.embed_tokens.weight", "token_embd.weight", Archs::All),
    ("model.norm.weight", "output_norm.weight", Archs::Dense),
    ("lm_head.weight", "output.weight", Archs::All),
    // LFM2's final norm; llama.cpp names it token_embd_norm.
    ("model.embedding_norm.weight", "token_embd_norm.weight", Archs::Lfm2),
];

/// Per-layer tensors: (HF suffix after `model.layers.N.`, GGUF suffix after `blk.N.`, archs).
/// `.weight` and `.bias` are appended by the lookup for rows that can carry a bias.
const LAYER: &[(&str, &str, Archs, Bias)] = &[
    ("input_layernorm", "attn_norm", Archs::Dense, Bias::No),
    ("self_attn.q_proj", "attn_q", Archs::All, Bias::Yes),
    ("self_attn.k_proj", "attn_k", Archs::All, Bias::Yes),
    ("self_attn.v_proj", "attn_v", Archs::All, Bias::Yes),
    ("self_attn.o_proj", "attn_output", Archs::Dense, Bias::Yes),
    ("self_attn.q_norm", "attn_q_norm", Archs::QkNorm, Bias::No),
    ("self_attn.k_norm", "attn_k_norm", Archs::QkNorm, Bias::No),
    ("post_attention_layernorm", "ffn_norm", Archs::NotGemma, Bias::No),
    ("post_attention_layernorm", "post_attention_norm", Archs::Gemma3, Bias::No),
    ("pre_feedforward_layernorm", "ffn_norm", Archs::Gemma3, Bias::No),
    ("post_feedforward_layernorm", "post_ffw_norm", Archs::Gemma3, Bias::No),
    ("mlp.gate_proj", "ffn_gate", Archs::Dense, Bias::Yes),
    ("mlp.up_proj", "ffn_up", Archs::Dense, Bias::Yes),
    ("mlp.down_proj", "ffn_down", Archs::Dense, Bias::Yes),
    ("operator_norm", "attn_norm", Archs::Lfm2, Bias::No),
    ("self_attn.out_proj", "attn_output", Archs::Lfm2, Bias::Yes),
    ("self_attn.q_layernorm", "attn_q_norm", Archs::Lfm2, Bias::No),
    ("self_attn.k_layernorm", "attn_k_norm", Archs::Lfm2, Bias::No),
    ("ffn_norm", "ffn_norm", Archs::Lfm2, Bias::No),
    ("feed_forward.w1", "ffn_gate", Archs::Lfm2, Bias::No),
    ("feed_forward.w3", "ffn_up", Archs::Lfm2, Bias::No),
    ("feed_forward.w2", "ffn_down", Archs::Lfm2, Bias::No),
    ("conv.in_proj", "shortconv.in_proj", Archs::Lfm2, Bias::Yes),
    ("conv.conv", "shortconv.conv", Archs::Lfm2, Bias::Yes),
    ("conv.out_proj", "shortconv.out_proj", Archs::Lfm2, Bias::Yes),
    ("linear_attn.in_proj_qkv", "attn_qkv", Archs::Qwen35, Bias::No),
    ("linear_attn.in_proj_z", "attn_gate", Archs::Qwen35, Bias::No),
    ("linear_attn.in_proj_b", "ssm_beta", Archs::Qwen35, Bias::No),
    ("linear_attn.in_proj_a", "ssm_alpha", Archs::Qwen35, Bias::No),
    ("linear_attn.conv1d", "ssm_conv1d", Archs::Qwen35, Bias::No),
    ("linear_attn.norm", "ssm_norm", Archs::Qwen35, Bias::No),
    ("linear_attn.out_proj", "ssm_out", Archs::Qwen35, Bias::No),
    // Qwen3-Next's fused projections, split at load (grouped per key head: [q, k, v, z] and
    // [b, a]); llama.cpp splits qkvz itself (attn_qkv + attn_gate) but keeps ssm_ba fused.
    ("linear_attn.in_proj_qkvz", "ssm_in_qkvz", Archs::Qwen3Next, Bias::No),
    ("linear_attn.in_proj_ba", "ssm_ba", Archs::Qwen3Next, Bias::No),
    ("self_attn.q_conv1d", "ssm_conv1d_q", Archs::Kimi, Bias::No),
    ("self_attn.k_conv1d", "ssm_conv1d_k", Archs::Kimi, Bias::No),
    ("self_attn.v_conv1d", "ssm_conv1d_v", Archs::Kimi, Bias::No),
    ("self_attn.f_a_proj", "ssm_f_a", Archs::Kimi, Bias::No),
    ("self_attn.f_b_proj", "ssm_f_b", Archs::Kimi, Bias::No),
    ("self_attn.g_a_proj", "ssm_g_a", Archs::Kimi, Bias::No),
    ("self_attn.g_b_proj", "ssm_g_b", Archs::Kimi, Bias::No),
    ("self_attn.b_proj", "ssm_beta", Archs::Kimi, Bias::No),
    ("self_attn.o_norm", "ssm_norm", Archs::Kimi, Bias::No),
    ("self_attn.kv_a_proj_with_mqa", "attn_kv_a_mqa", Archs::Kimi, Bias::No),
    ("self_attn.kv_a_layernorm", "attn_kv_a_norm", Archs::Kimi, Bias::No),
    // llama.cpp splits kv_b into attn_k_b / attn_v_b; HF folders keep it whole.
    ("self_attn.kv_b_proj", "attn_kv_b", Archs::Kimi, Bias::No),
    ("block_sparse_moe.gate", "ffn_gate_inp", Archs::Kimi, Bias::No),
    ("block_sparse_moe.shared_experts.gate_proj", "ffn_gate_shexp", Archs::Kimi, Bias::No),
    ("block_sparse_moe.shared_experts.up_proj", "ffn_up_shexp", Archs::Kimi, Bias::No),
    ("block_sparse_moe.shared_experts.down_proj", "ffn_down_shexp", Archs::Kimi, Bias::No),
    ("mlp.gate", "ffn_gate_inp", Archs::Moe, Bias::No),
    ("mlp.shared_expert.gate_proj", "ffn_gate_shexp", Archs::Moe, Bias::No),
    ("mlp.shared_expert.up_proj", "ffn_up_shexp", Archs::Moe, Bias::No),
    ("mlp.shared_expert.down_proj", "ffn_down_shexp", Archs::Moe, Bias::No),
    ("mlp.shared_expert_gate", "ffn_gate_inp_shexp", Archs::Moe, Bias::No),
    // cortiq's vmf_phase core (a converted attention layer of a dense model, issue 16).
    ("vmf_attn.thq", "vmf_thq", Archs::Dense, Bias::Yes),
    ("vmf_attn.thk", "vmf_thk", Archs::Dense, Bias::Yes),
    ("vmf_attn.v_proj", "vmf_v", Archs::Dense, Bias::No),
    ("vmf_attn.out_proj", "vmf_out", Archs::Dense, Bias::Yes),
    ("vmf_attn.conv", "vmf_conv", Archs::Dense, Bias::No),
    ("vmf_attn.k_gate", "vmf_kgate", Archs::Dense, Bias::Yes),
    ("vmf_attn.o_norm", "vmf_onorm", Archs::Dense, Bias::No),
    ("vmf_attn.slot", "vmf_slot", Archs::Dense, Bias::Yes),
];

/// Routed experts, one HF tensor each (`mlp.experts.E.<proj>`), named `ffn_<kind>_exps.E` here
/// (llama.cpp stacks them into one `ffn_<kind>_exps` tensor; the loader takes either).
const EXPERT: &[(&str, &str)] = &[("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")];
/// Kimi's experts: w1 (gate), w3 (up), w2 (down).
const KIMI_EXPERT: &[(&str, &str)] = &[("w1", "ffn_gate_exps"), ("w3", "ffn_up_exps"), ("w2", "ffn_down_exps")];

/// Per-layer parameters whose HF names carry no `.weight`/`.bias` suffix: (HF suffix after
/// `model.layers.N.`, GGUF suffix after `blk.N.`, archs). The values may differ by a transform
/// the loader applies (A_log is stored by llama.cpp as −exp(A_log)).
const BARE: &[(&str, &str, Archs)] = &[
    ("linear_attn.dt_bias", "ssm_dt.bias", Archs::Qwen35),
    ("linear_attn.A_log", "ssm_a", Archs::Qwen35),
    ("self_attn.dt_bias", "ssm_dt.bias", Archs::Kimi),
    ("self_attn.A_log", "ssm_a", Archs::Kimi),
    ("block_sparse_moe.gate.e_score_correction_bias", "exp_probs_b.bias", Archs::Kimi),
    // vmf_phase: A_log is stored as A_log by both spellings (the decay is formed at load).
    ("vmf_attn.A_log", "vmf_a_log", Archs::Dense),
    ("vmf_attn.phase_mass", "vmf_mass", Archs::Dense),
];

/// Whether a linear layer row may carry a bias (qwen2 q/k/v always; llama with
/// `attention_bias` / `mlp_bias`). Norms never do in these architectures.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Bias {
    Yes,
    No,
}

/// Prefixes in front of the text model's `layers`/`embed_tokens`/`norm` that mean the same
/// tensor: text-only model, transformers-5 multimodal, transformers-4 multimodal.
const HF_MODEL_PREFIXES: &[&str] = &["model.", "model.language_model.", "language_model.model."];
/// Where lm_head lives: text-only / transformers-5 multimodal, transformers-4 multimodal.
const HF_HEAD_PREFIXES: &[&str] = &["", "language_model."];

/// Splits `name` into (param-less stem, ".weight" | ".bias").
fn split_param(name: &str) -> Option<(&str, &str)> {
    if let Some(s) = name.strip_suffix(".weight") {
        Some((s, ".weight"))
    } else {
        name.strip_suffix(".bias").map(|s| (s, ".bias"))
    }
}

/// Parses `"<N>.<rest>"` into (N, rest); N must be plain decimal (no sign, no leading '+').
fn split_layer(s: &str) -> Option<(usize, &str)> {
    let (n, rest) = s.split_once('.')?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) || (n.len() > 1 && n.starts_with('0')) {
        return None;
    }
    Some((n.parse().ok()?, rest))
}

/// The GGUF name of an HF tensor, or `None` when the arch is not in the table or the tensor
/// has no GGUF twin for that arch (e.g. `q_norm` for llama).
pub fn hf_to_gguf(arch: &str, hf: &str) -> Option<String> {
    let arch = parse_arch(arch)?;
    if let Some(after) = HF_MODEL_PREFIXES.iter().find_map(|p| hf.strip_prefix(p)?.strip_prefix("layers."))
        && let Some((n, rest)) = split_layer(after)
        && let Some(&(_, g, _)) = BARE.iter().find(|&&(h, _, archs)| archs.has(arch) && h == rest)
    {
        return Some(format!("blk.{n}.{g}"));
    }
    let (stem, param) = split_param(hf)?;

    // Global tensors: try each accepted prefix spelling.
    for &(h, g, archs) in GLOBAL {
        if !archs.has(arch) {
            continue;
        }
        let (h_stem, _) = split_param(h)?;
        let matched = if h_stem == "lm_head" {
            HF_HEAD_PREFIXES.iter().any(|p| stem.strip_prefix(p) == Some("lm_head"))
        } else {
            let local = h_stem.strip_prefix("model.")?;
            HF_MODEL_PREFIXES.iter().any(|p| stem.strip_prefix(p) == Some(local))
        };
        if matched && param == ".weight" {
            return Some(g.to_string());
        }
    }

    // Layer tensors.
    let after = HF_MODEL_PREFIXES.iter().find_map(|p| stem.strip_prefix(p)?.strip_prefix("layers."))?;
    let (n, rest) = split_layer(after)?;
    if Archs::Moe.has(arch)
        && let Some((e, proj)) = rest.strip_prefix("mlp.experts.").and_then(split_layer)
    {
        let &(_, g) = EXPERT.iter().find(|(h, _)| *h == proj)?;
        return (param == ".weight").then(|| format!("blk.{n}.{g}.{e}.weight"));
    }
    if Archs::Kimi.has(arch)
        && let Some((e, proj)) = rest.strip_prefix("block_sparse_moe.experts.").and_then(split_layer)
    {
        let &(_, g) = KIMI_EXPERT.iter().find(|(h, _)| *h == proj)?;
        return (param == ".weight").then(|| format!("blk.{n}.{g}.{e}.weight"));
    }
    LAYER
        .iter()
        .find(|&&(h, _, archs, bias)| archs.has(arch) && h == rest && (param == ".weight" || bias == Bias::Yes))
        .map(|&(_, g, _, _)| format!("blk.{n}.{g}{param}"))
}

/// The HF name (text-only `*ForCausalLM` spelling) of a GGUF tensor, or `None` when the arch
/// is not in the table or the tensor has no HF twin.
pub fn gguf_to_hf(arch: &str, gguf: &str) -> Option<String> {
    let arch = parse_arch(arch)?;
    if let Some((n, rest)) = gguf.strip_prefix("blk.").and_then(split_layer)
        && let Some(&(h, _, _)) = BARE.iter().find(|&&(_, g, archs)| archs.has(arch) && g == rest)
    {
        return Some(format!("model.layers.{n}.{h}"));
    }
    for &(h, g, archs) in GLOBAL {
        if archs.has(arch) && g == gguf {
            return Some(h.to_string());
        }
    }
    let (stem, param) = split_param(gguf)?;
    let (n, rest) = split_layer(stem.strip_prefix("blk.")?)?;
    if Archs::Moe.has(arch)
        && let Some(&(h, g)) = EXPERT.iter().find(|(_, g)| rest.starts_with(&format!("{g}.")))
        && let Ok(e) = rest[g.len() + 1..].parse::<usize>()
    {
        return Some(format!("model.layers.{n}.mlp.experts.{e}.{h}.weight"));
    }
    if Archs::Kimi.has(arch)
        && let Some(&(h, g)) = KIMI_EXPERT.iter().find(|(_, g)| rest.starts_with(&format!("{g}.")))
        && let Ok(e) = rest[g.len() + 1..].parse::<usize>()
    {
        return Some(format!("model.layers.{n}.block_sparse_moe.experts.{e}.{h}.weight"));
    }
    LAYER
        .iter()
        .find(|&&(_, g, archs, bias)| archs.has(arch) && g == rest && (param == ".weight" || bias == Bias::Yes))
        .map(|&(h, _, _, _)| format!("model.layers.{n}.{h}{param}"))
}

/// Multi-token-prediction blocks (Qwen3-Next / Qwen3.5): HF keeps them under `mtp.`, GGUF
/// appends them as blocks `n_layers + i` (`block_count` counts them, `nextn_predict_layers`
/// says how many) with four `nextn.*` tensors of their own. The block index depends on the
/// model's layer count, so this is not part of the fixed table.
const MTP_OWN: &[(&str, &str)] = &[
    ("fc.weight", "nextn.eh_proj.weight"),
    ("pre_fc_norm_embedding.weight", "nextn.enorm.weight"),
    ("pre_fc_norm_hidden.weight", "nextn.hnorm.weight"),
    ("norm.weight", "nextn.shared_head_norm.weight"),
];

/// The GGUF name of an HF `mtp.*` tensor of a model with `n_layers` ordinary layers, or `None`
/// when `hf` is not one (or the arch has no MTP blocks). MTP block 0's own tensors live at
/// block `n_layers`, `mtp.layers.i.*` at block `n_layers + i`.
pub fn hf_mtp_to_gguf(arch: &str, hf: &str, n_layers: usize) -> Option<String> {
    if !parse_arch(arch)?.qwen_hybrid() {
        return None;
    }
    let rest = hf.strip_prefix("mtp.")?;
    if let Some(&(_, g)) = MTP_OWN.iter().find(|(h, _)| *h == rest) {
        return Some(format!("blk.{n_layers}.{g}"));
    }
    let (i, inner) = split_layer(rest.strip_prefix("layers.")?)?;
    hf_to_gguf(arch, &format!("model.layers.{}.{inner}", n_layers + i))
}

/// The GGUF names of MTP block 0's own tensors (`nextn.*`) in a model with `n_layers` ordinary
/// layers: with the tensors of its decoder layer, what a complete MTP block holds.
pub fn mtp_own_gguf(n_layers: usize) -> impl Iterator<Item = String> {
    MTP_OWN.iter().map(move |(_, g)| format!("blk.{n_layers}.{g}"))
}

/// The HF name (`mtp.*`) of a GGUF MTP-block tensor of a model with `n_layers` ordinary layers,
/// or `None` when `gguf` is not one: the inverse of [`hf_mtp_to_gguf`].
pub fn gguf_mtp_to_hf(arch: &str, gguf: &str, n_layers: usize) -> Option<String> {
    if !parse_arch(arch)?.qwen_hybrid() {
        return None;
    }
    let (n, rest) = split_layer(gguf.strip_prefix("blk.")?)?;
    let i = n.checked_sub(n_layers)?;
    if i == 0
        && let Some(&(h, _)) = MTP_OWN.iter().find(|(_, g)| *g == rest)
    {
        return Some(format!("mtp.{h}"));
    }
    let hf = gguf_to_hf(arch, gguf)?;
    Some(format!("mtp.layers.{i}.{}", hf.strip_prefix(&format!("model.layers.{n}."))?))
}

/// The architectures this table covers, in GGUF spelling.
pub const ARCHS: &[&str] = &["llama", "qwen2", "qwen3", "gemma3", "lfm2", "qwen35", "qwen35moe", "qwen3next", "kimi-linear"];

#[cfg(test)]
mod lfm2_tests {
    use super::*;

    /// LFM2's own spellings map both ways, and the dense spellings it lacks do not match.
    #[test]
    fn lfm2_names_round_trip() {
        for (hf, gguf) in [
            ("model.embedding_norm.weight", "token_embd_norm.weight"),
            ("model.layers.0.operator_norm.weight", "blk.0.attn_norm.weight"),
            ("model.layers.2.self_attn.out_proj.weight", "blk.2.attn_output.weight"),
            ("model.layers.2.self_attn.q_layernorm.weight", "blk.2.attn_q_norm.weight"),
            ("model.layers.1.feed_forward.w3.weight", "blk.1.ffn_up.weight"),
            ("model.layers.1.conv.conv.weight", "blk.1.shortconv.conv.weight"),
            ("model.layers.1.conv.in_proj.weight", "blk.1.shortconv.in_proj.weight"),
        ] {
            assert_eq!(hf_to_gguf("lfm2", hf).as_deref(), Some(gguf), "{hf}");
            assert_eq!(gguf_to_hf("lfm2", gguf).as_deref(), Some(hf), "{gguf}");
        }
        assert_eq!(hf_to_gguf("lfm2", "model.layers.0.input_layernorm.weight"), None);
        for (hf, gguf) in [
            ("mtp.fc.weight", "blk.24.nextn.eh_proj.weight"),
            ("mtp.pre_fc_norm_embedding.weight", "blk.24.nextn.enorm.weight"),
            ("mtp.pre_fc_norm_hidden.weight", "blk.24.nextn.hnorm.weight"),
            ("mtp.norm.weight", "blk.24.nextn.shared_head_norm.weight"),
            ("mtp.layers.0.self_attn.q_proj.weight", "blk.24.attn_q.weight"),
            ("mtp.layers.0.mlp.experts.3.up_proj.weight", "blk.24.ffn_up_exps.3.weight"),
        ] {
            assert_eq!(hf_mtp_to_gguf("qwen35moe", hf, 24).as_deref(), Some(gguf), "{hf}");
        }
        for hf in [
            "mtp.fc.weight",
            "mtp.norm.weight",
            "mtp.pre_fc_norm_hidden.weight",
            "mtp.layers.0.self_attn.k_norm.weight",
            "mtp.layers.0.mlp.experts.3.up_proj.weight",
            "mtp.layers.1.mlp.shared_expert_gate.weight",
        ] {
            let gguf = hf_mtp_to_gguf("qwen35moe", hf, 24).unwrap();
            assert_eq!(gguf_mtp_to_hf("qwen35moe", &gguf, 24).as_deref(), Some(hf), "{gguf}");
        }
        assert_eq!(mtp_own_gguf(24).count(), MTP_OWN.len());
        // Released Qwen3.5 (Qwen3_5ForConditionalGeneration): the text model under
        // model.language_model., the vision tower's model.visual.* part of no text tensor.
        for (hf, gguf) in [
            ("model.language_model.layers.0.linear_attn.in_proj_qkv.weight", "blk.0.attn_qkv.weight"),
            ("model.language_model.layers.0.linear_attn.A_log", "blk.0.ssm_a"),
            ("model.language_model.embed_tokens.weight", "token_embd.weight"),
            ("model.language_model.norm.weight", "output_norm.weight"),
            ("lm_head.weight", "output.weight"),
        ] {
            assert_eq!(hf_to_gguf("qwen35", hf).as_deref(), Some(gguf), "{hf}");
        }
        for hf in [
            "model.visual.merger.norm.weight",
            "model.visual.blocks.0.norm1.weight",
            "model.visual.blocks.0.attn.qkv.weight",
            "model.visual.patch_embed.proj.weight",
            "model.visual.pos_embed.weight",
        ] {
            assert_eq!(hf_to_gguf("qwen35", hf), None, "{hf}");
            assert_eq!(hf_mtp_to_gguf("qwen35", hf, 24), None, "{hf}");
        }
        assert!(mtp_own_gguf(24).all(|g| gguf_mtp_to_hf("qwen35", &g, 24).is_some()), "own tensors map back");
        assert_eq!(gguf_mtp_to_hf("qwen35", "blk.23.attn_q.weight", 24), None);
        assert_eq!(gguf_mtp_to_hf("qwen35", "blk.25.nextn.eh_proj.weight", 24), None);
        assert_eq!(gguf_mtp_to_hf("lfm2", "blk.24.attn_q.weight", 24), None);
        assert_eq!(hf_mtp_to_gguf("lfm2", "mtp.fc.weight", 24), None);
        assert_eq!(hf_mtp_to_gguf("qwen35", "model.layers.0.self_attn.q_proj.weight", 24), None);
        for (hf, gguf) in [
            ("model.layers.3.linear_attn.dt_bias", "blk.3.ssm_dt.bias"),
            ("model.layers.3.linear_attn.A_log", "blk.3.ssm_a"),
            ("model.layers.0.linear_attn.in_proj_qkv.weight", "blk.0.attn_qkv.weight"),
            ("model.layers.0.linear_attn.norm.weight", "blk.0.ssm_norm.weight"),
            ("model.layers.3.self_attn.q_norm.weight", "blk.3.attn_q_norm.weight"),
            ("model.layers.3.post_attention_layernorm.weight", "blk.3.ffn_norm.weight"),
        ] {
            assert_eq!(hf_to_gguf("qwen3_5_text", hf).as_deref(), Some(gguf), "{hf}");
            assert_eq!(gguf_to_hf("qwen35", gguf).as_deref(), Some(hf), "{gguf}");
        }
        for (hf, gguf) in [
            ("model.layers.2.mlp.experts.3.down_proj.weight", "blk.2.ffn_down_exps.3.weight"),
            ("model.layers.0.mlp.gate.weight", "blk.0.ffn_gate_inp.weight"),
            ("model.layers.0.mlp.shared_expert_gate.weight", "blk.0.ffn_gate_inp_shexp.weight"),
            ("model.layers.0.mlp.shared_expert.up_proj.weight", "blk.0.ffn_up_shexp.weight"),
            ("model.layers.0.linear_attn.A_log", "blk.0.ssm_a"),
        ] {
            assert_eq!(hf_to_gguf("qwen3_5_moe_text", hf).as_deref(), Some(gguf), "{hf}");
            assert_eq!(gguf_to_hf("qwen35moe", gguf).as_deref(), Some(hf), "{gguf}");
        }
        assert_eq!(hf_to_gguf("llama", "model.layers.0.operator_norm.weight"), None);
    }

    /// vmf_phase's tensors (issue 16) in both spellings, for every dense architecture.
    #[test]
    fn vmf_phase_names_round_trip() {
        for arch in ["llama", "qwen2", "qwen3", "gemma3"] {
            for (hf, gguf) in [
                ("model.layers.2.vmf_attn.thq.weight", "blk.2.vmf_thq.weight"),
                ("model.layers.2.vmf_attn.thq.bias", "blk.2.vmf_thq.bias"),
                ("model.layers.2.vmf_attn.thk.weight", "blk.2.vmf_thk.weight"),
                ("model.layers.2.vmf_attn.v_proj.weight", "blk.2.vmf_v.weight"),
                ("model.layers.2.vmf_attn.out_proj.weight", "blk.2.vmf_out.weight"),
                ("model.layers.2.vmf_attn.out_proj.bias", "blk.2.vmf_out.bias"),
                ("model.layers.2.vmf_attn.conv.weight", "blk.2.vmf_conv.weight"),
                ("model.layers.2.vmf_attn.k_gate.weight", "blk.2.vmf_kgate.weight"),
                ("model.layers.2.vmf_attn.k_gate.bias", "blk.2.vmf_kgate.bias"),
                ("model.layers.2.vmf_attn.A_log", "blk.2.vmf_a_log"),
                ("model.layers.2.vmf_attn.phase_mass", "blk.2.vmf_mass"),
                ("model.layers.2.vmf_attn.o_norm.weight", "blk.2.vmf_onorm.weight"),
                ("model.layers.2.vmf_attn.slot.weight", "blk.2.vmf_slot.weight"),
                ("model.layers.2.vmf_attn.slot.bias", "blk.2.vmf_slot.bias"),
            ] {
                assert_eq!(hf_to_gguf(arch, hf).as_deref(), Some(gguf), "{arch}: {hf}");
                assert_eq!(gguf_to_hf(arch, gguf).as_deref(), Some(hf), "{arch}: {gguf}");
            }
            assert_eq!(hf_to_gguf(arch, "model.layers.2.vmf_attn.v_proj.bias"), None, "{arch}: v_proj has no bias");
        }
    }
}

//! Hugging Face ↔ GGUF tensor-name translation over a table that each architecture file of
//! the engine declares ([`NameTable`]): this module owns the machinery and the spellings every
//! architecture shares, never a list of architectures.
//!
//! GGUF names follow llama.cpp's gguf-py (`gguf/constants.py` TENSOR_NAMES and the per-arch
//! tensor lists); HF names are the module paths of transformers' `*ForCausalLM` classes.
//!
//! Naming pitfalls the tables encode:
//! - HF `post_attention_layernorm` is the *pre-FFN* norm for llama/qwen (GGUF `ffn_norm`),
//!   but a real post-attention norm for gemma3 (GGUF `post_attention_norm`), whose pre-FFN
//!   norm is `pre_feedforward_layernorm` (GGUF `ffn_norm`): rows are per architecture.
//! - Multimodal checkpoints (`*ForConditionalGeneration`) prefix the text model:
//!   `model.language_model.layers.N...` in transformers 5 and `language_model.model.layers.N...`
//!   in transformers 4. [`NameTable::hf_to_gguf`] accepts both; [`NameTable::gguf_to_hf`]
//!   answers with the text-only `*ForCausalLM` spelling (`model.layers.N...`).
//! - Some GGUF tensors have no HF twin (llama's `rope_freqs`, derived from the rope
//!   scaling config): those map to `None`.

/// Whether a linear layer row may carry a bias (qwen2 q/k/v always; llama with
/// `attention_bias` / `mlp_bias`). Norms never do in these architectures.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Bias {
    Yes,
    No,
}

/// A per-layer row: (HF suffix after `model.layers.N.`, GGUF suffix after `blk.N.`, bias).
/// `.weight` (and `.bias` where allowed) is appended by the lookup.
pub type LayerRow = (&'static str, &'static str, Bias);

/// A name pair: (HF, GGUF).
pub type Pair = (&'static str, &'static str);

/// Routed experts, one HF tensor each (`<prefix>E.<proj>.weight`), named
/// `blk.N.<stacked>.E.weight` here (llama.cpp stacks them into one `<stacked>` tensor; the
/// engine's loader takes either).
#[derive(Clone, Copy, Debug)]
pub struct Experts {
    /// HF path after `model.layers.N.` up to the expert index, e.g. `mlp.experts.`.
    pub prefix: &'static str,
    /// (HF projection, GGUF stacked name), e.g. `("gate_proj", "ffn_gate_exps")`.
    pub projs: &'static [Pair],
}

/// One architecture's tensor names, composed from row sets (first match wins).
#[derive(Clone, Copy, Debug)]
pub struct NameTable {
    /// Tensors outside the layer stack: (HF name, GGUF name), `.weight` parameters.
    pub global: &'static [Pair],
    /// Per-layer rows.
    pub layer: &'static [&'static [LayerRow]],
    /// Per-layer parameters whose HF names carry no `.weight`/`.bias` suffix: (HF suffix after
    /// `model.layers.N.`, GGUF suffix after `blk.N.`). The values may differ by a transform the
    /// loader applies (A_log is stored by llama.cpp as −exp(A_log)).
    pub bare: &'static [&'static [Pair]],
    /// Routed experts, where the architecture has them.
    pub experts: Option<Experts>,
    /// Whether checkpoints carry multi-token-prediction blocks (`mtp.*`, Qwen3-Next / Qwen3.5).
    pub mtp: bool,
}

/// The tensors outside the layer stack of a llama-style decoder.
pub const DENSE_GLOBAL: &[Pair] = &[
    ("model.embed_tokens.weight", "token_embd.weight"),
    ("model.norm.weight", "output_norm.weight"),
    ("lm_head.weight", "output.weight"),
];
/// Query, key and value projections.
pub const ATTN_QKV: &[LayerRow] = &[
    ("self_attn.q_proj", "attn_q", Bias::Yes),
    ("self_attn.k_proj", "attn_k", Bias::Yes),
    ("self_attn.v_proj", "attn_v", Bias::Yes),
];
/// A llama-style attention block's input norm and output projection.
pub const ATTN_NORM_OUT: &[LayerRow] =
    &[("input_layernorm", "attn_norm", Bias::No), ("self_attn.o_proj", "attn_output", Bias::Yes)];
/// Per-head q/k RMSNorm (Qwen3, Gemma 3, the Qwen hybrids).
pub const QK_NORM: &[LayerRow] = &[("self_attn.q_norm", "attn_q_norm", Bias::No), ("self_attn.k_norm", "attn_k_norm", Bias::No)];
/// llama's naming of the pre-FFN norm (`post_attention_layernorm`).
pub const PRE_FFN_NORM: &[LayerRow] = &[("post_attention_layernorm", "ffn_norm", Bias::No)];
/// The gated MLP.
pub const SWIGLU: &[LayerRow] =
    &[("mlp.gate_proj", "ffn_gate", Bias::Yes), ("mlp.up_proj", "ffn_up", Bias::Yes), ("mlp.down_proj", "ffn_down", Bias::Yes)];
/// A mixture-of-experts router (`mlp.gate`).
pub const MOE_ROUTER: &[LayerRow] = &[("mlp.gate", "ffn_gate_inp", Bias::No)];
/// The shared expert and its σ gate (Qwen2-MoE lineage: Qwen3-Next, Qwen3.5-MoE).
pub const SHARED_EXPERT: &[LayerRow] = &[
    ("mlp.shared_expert.gate_proj", "ffn_gate_shexp", Bias::No),
    ("mlp.shared_expert.up_proj", "ffn_up_shexp", Bias::No),
    ("mlp.shared_expert.down_proj", "ffn_down_shexp", Bias::No),
    ("mlp.shared_expert_gate", "ffn_gate_inp_shexp", Bias::No),
];
/// Routed experts under `mlp.experts.E.{gate,up,down}_proj`.
pub const MLP_EXPERTS: Experts = Experts {
    prefix: "mlp.experts.",
    projs: &[("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")],
};

/// Prefixes in front of the text model's `layers`/`embed_tokens`/`norm` that mean the same
/// tensor: text-only model, transformers-5 multimodal, transformers-4 multimodal, and
/// Nemotron-H's `backbone`.
const HF_MODEL_PREFIXES: &[&str] = &["model.", "model.language_model.", "language_model.model.", "backbone."];
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

/// Multi-token-prediction blocks (Qwen3-Next / Qwen3.5): HF keeps them under `mtp.`, GGUF
/// appends them as blocks `n_layers + i` (`block_count` counts them, `nextn_predict_layers`
/// says how many) with four `nextn.*` tensors of their own. The block index depends on the
/// model's layer count, so this is not part of the fixed rows.
const MTP_OWN: &[Pair] = &[
    ("fc.weight", "nextn.eh_proj.weight"),
    ("pre_fc_norm_embedding.weight", "nextn.enorm.weight"),
    ("pre_fc_norm_hidden.weight", "nextn.hnorm.weight"),
    ("norm.weight", "nextn.shared_head_norm.weight"),
];

/// The GGUF names of MTP block 0's own tensors (`nextn.*`) in a model with `n_layers` ordinary
/// layers: with the tensors of its decoder layer, what a complete MTP block holds.
pub fn mtp_own_gguf(n_layers: usize) -> impl Iterator<Item = String> {
    MTP_OWN.iter().map(move |(_, g)| format!("blk.{n_layers}.{g}"))
}

impl NameTable {
    fn layer_rows(&self) -> impl Iterator<Item = &'static LayerRow> {
        self.layer.iter().flat_map(|set| set.iter())
    }

    fn bare_rows(&self) -> impl Iterator<Item = &'static Pair> {
        self.bare.iter().flat_map(|set| set.iter())
    }

    /// The GGUF name of an HF tensor, or `None` when the tensor has no GGUF twin in this
    /// architecture (e.g. `q_norm` for llama).
    pub fn hf_to_gguf(&self, hf: &str) -> Option<String> {
        if let Some(after) = HF_MODEL_PREFIXES.iter().find_map(|p| hf.strip_prefix(p)?.strip_prefix("layers."))
            && let Some((n, rest)) = split_layer(after)
            && let Some(&(_, g)) = self.bare_rows().find(|&&(h, _)| h == rest)
        {
            return Some(format!("blk.{n}.{g}"));
        }
        let (stem, param) = split_param(hf)?;

        // Global tensors: try each accepted prefix spelling.
        for &(h, g) in self.global {
            let (h_stem, _) = split_param(h)?;
            let matched = if h_stem == "lm_head" {
                HF_HEAD_PREFIXES.iter().any(|p| stem.strip_prefix(p) == Some("lm_head"))
            } else if let Some(local) = h_stem.strip_prefix("model.") {
                HF_MODEL_PREFIXES.iter().any(|p| stem.strip_prefix(p) == Some(local))
            } else {
                // A spelling of its own (Nemotron-H's backbone.embeddings), taken as it is.
                stem == h_stem
            };
            if matched && param == ".weight" {
                return Some(g.to_string());
            }
        }

        // Layer tensors.
        let after = HF_MODEL_PREFIXES.iter().find_map(|p| stem.strip_prefix(p)?.strip_prefix("layers."))?;
        let (n, rest) = split_layer(after)?;
        if let Some(x) = self.experts
            && let Some((e, proj)) = rest.strip_prefix(x.prefix).and_then(split_layer)
        {
            let &(_, g) = x.projs.iter().find(|(h, _)| *h == proj)?;
            return (param == ".weight").then(|| format!("blk.{n}.{g}.{e}.weight"));
        }
        self.layer_rows()
            .find(|&&(h, _, bias)| h == rest && (param == ".weight" || bias == Bias::Yes))
            .map(|&(_, g, _)| format!("blk.{n}.{g}{param}"))
    }

    /// The HF name (text-only `*ForCausalLM` spelling) of a GGUF tensor, or `None` when the
    /// tensor has no HF twin in this architecture.
    pub fn gguf_to_hf(&self, gguf: &str) -> Option<String> {
        if let Some((n, rest)) = gguf.strip_prefix("blk.").and_then(split_layer)
            && let Some(&(h, _)) = self.bare_rows().find(|&&(_, g)| g == rest)
        {
            return Some(format!("model.layers.{n}.{h}"));
        }
        if let Some(&(h, _)) = self.global.iter().find(|&&(_, g)| g == gguf) {
            return Some(h.to_string());
        }
        let (stem, param) = split_param(gguf)?;
        let (n, rest) = split_layer(stem.strip_prefix("blk.")?)?;
        if let Some(x) = self.experts
            && let Some(&(h, g)) = x.projs.iter().find(|(_, g)| rest.starts_with(&format!("{g}.")))
            && let Ok(e) = rest[g.len() + 1..].parse::<usize>()
        {
            return Some(format!("model.layers.{n}.{}{e}.{h}.weight", x.prefix));
        }
        self.layer_rows()
            .find(|&&(_, g, bias)| g == rest && (param == ".weight" || bias == Bias::Yes))
            .map(|&(h, _, _)| format!("model.layers.{n}.{h}{param}"))
    }

    /// The GGUF name of an HF `mtp.*` tensor of a model with `n_layers` ordinary layers, or
    /// `None` when `hf` is not one (or the architecture has no MTP blocks). MTP block 0's own
    /// tensors live at block `n_layers`, `mtp.layers.i.*` at block `n_layers + i`.
    pub fn hf_mtp_to_gguf(&self, hf: &str, n_layers: usize) -> Option<String> {
        if !self.mtp {
            return None;
        }
        let rest = hf.strip_prefix("mtp.")?;
        if let Some(&(_, g)) = MTP_OWN.iter().find(|(h, _)| *h == rest) {
            return Some(format!("blk.{n_layers}.{g}"));
        }
        let (i, inner) = split_layer(rest.strip_prefix("layers.")?)?;
        self.hf_to_gguf(&format!("model.layers.{}.{inner}", n_layers + i))
    }

    /// The HF name (`mtp.*`) of a GGUF MTP-block tensor of a model with `n_layers` ordinary
    /// layers, or `None` when `gguf` is not one: the inverse of [`Self::hf_mtp_to_gguf`].
    pub fn gguf_mtp_to_hf(&self, gguf: &str, n_layers: usize) -> Option<String> {
        if !self.mtp {
            return None;
        }
        let (n, rest) = split_layer(gguf.strip_prefix("blk.")?)?;
        let i = n.checked_sub(n_layers)?;
        if i == 0
            && let Some(&(h, _)) = MTP_OWN.iter().find(|(_, g)| *g == rest)
        {
            return Some(format!("mtp.{h}"));
        }
        let hf = self.gguf_to_hf(gguf)?;
        Some(format!("mtp.layers.{i}.{}", hf.strip_prefix(&format!("model.layers.{n}."))?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: NameTable = NameTable {
        global: DENSE_GLOBAL,
        layer: &[ATTN_QKV, ATTN_NORM_OUT, PRE_FFN_NORM, SWIGLU],
        bare: &[],
        experts: None,
        mtp: false,
    };

    /// The machinery on a llama-shaped table: prefixes, biases, strict layer numbers.
    #[test]
    fn table_lookups_follow_the_rows() {
        assert_eq!(TINY.hf_to_gguf("model.layers.7.post_attention_layernorm.weight").as_deref(), Some("blk.7.ffn_norm.weight"));
        assert_eq!(TINY.hf_to_gguf("model.language_model.layers.0.self_attn.q_proj.bias").as_deref(), Some("blk.0.attn_q.bias"));
        assert_eq!(TINY.hf_to_gguf("language_model.lm_head.weight").as_deref(), Some("output.weight"));
        assert_eq!(TINY.hf_to_gguf("model.layers.0.input_layernorm.bias"), None, "norms carry no bias");
        assert_eq!(TINY.hf_to_gguf("model.layers.01.mlp.up_proj.weight"), None, "leading zero");
        assert_eq!(TINY.hf_to_gguf("model.layers.0.mlp.experts.3.up_proj.weight"), None, "no experts in this table");
        assert_eq!(TINY.gguf_to_hf("blk.12.attn_v.bias").as_deref(), Some("model.layers.12.self_attn.v_proj.bias"));
        assert_eq!(TINY.gguf_to_hf("blk.-1.attn_q.weight"), None);
        assert_eq!(TINY.hf_mtp_to_gguf("mtp.fc.weight", 24), None, "no MTP blocks in this table");
        let moe = NameTable { experts: Some(MLP_EXPERTS), mtp: true, ..TINY };
        assert_eq!(
            moe.hf_to_gguf("model.layers.2.mlp.experts.3.down_proj.weight").as_deref(),
            Some("blk.2.ffn_down_exps.3.weight")
        );
        assert_eq!(
            moe.gguf_to_hf("blk.2.ffn_down_exps.3.weight").as_deref(),
            Some("model.layers.2.mlp.experts.3.down_proj.weight")
        );
        assert_eq!(moe.hf_mtp_to_gguf("mtp.fc.weight", 24).as_deref(), Some("blk.24.nextn.eh_proj.weight"));
        assert_eq!(moe.gguf_mtp_to_hf("blk.25.attn_q.weight", 24).as_deref(), Some("mtp.layers.1.self_attn.q_proj.weight"));
        assert_eq!(mtp_own_gguf(24).count(), MTP_OWN.len());
    }
}

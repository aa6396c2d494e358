//! The engine's model description: one validated struct, built by an architecture file from
//! GGUF metadata or an HF config, that the shared blocks read. Nothing here knows a file format.

pub use crate::rope::{Rope, RopeScaling};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Silu,
    GeluTanh,
    /// relu(x)² of an ungated MLP (Nemotron-H): stored as up/down only, run as the gated
    /// relu(up)·up (the same values: relu(u)·u = relu(u)² exactly).
    Relu2,
}

impl Activation {
    pub fn f(self) -> fn(f32) -> f32 {
        match self {
            Activation::Silu => cortiq_kernels::ops::silu,
            Activation::GeluTanh => cortiq_kernels::ops::gelu_tanh,
            Activation::Relu2 => |x: f32| x.max(0.0),
        }
    }
}

/// Which token mixer a layer runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MixerKind {
    /// Softmax attention with a KV cache (the dense architectures' only kind).
    Attention,
    /// LFM2's gated short convolution over `kernel` taps (`bias`: in/conv/out biases).
    ShortConv { kernel: usize, bias: bool },
    /// GatedDeltaNet (Qwen3-Next, Qwen3.5).
    GatedDeltaNet(crate::geometry::GdnConfig),
    /// Kimi Delta Attention.
    Kda(crate::geometry::KdaConfig),
    /// Mamba2 (Granite 4.0 H, Nemotron-H, Falcon-H1).
    Mamba2(crate::geometry::Mamba2Config),
    /// No token mixer: the layer is its feed-forward block alone (Nemotron-H's MLP and MoE
    /// blocks); its pre-FFN norm is the block's norm (`attn_norm` in GGUF).
    Identity,
    /// Attention and Mamba2 side by side, their outputs added (Falcon-H1).
    AttnMamba2(crate::geometry::Mamba2Config),
    /// Multi-head latent attention (Kimi Linear: no RoPE).
    Mla(crate::geometry::MlaConfig),
    /// cortiq's vmf_phase linear core (a converted attention layer of a dense model).
    VmfPhase(crate::geometry::VmfConfig),
}

/// Per-layer geometry.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerSpec {
    pub mixer: MixerKind,
    /// The FFN is the model's mixture of experts (`ModelConfig::moe`), not a dense one.
    pub moe: bool,
    /// Keys visible to position i are j with i - j < window (the current token included).
    pub sliding_window: Option<usize>,
    /// Index into `ModelConfig::ropes`.
    pub rope: usize,
    /// The layer has a feed-forward block (Nemotron-H's Mamba2 and attention blocks have none).
    pub ffn: bool,
}

impl LayerSpec {
    /// An attention layer over every earlier key with RoPE `rope`.
    pub fn attention(rope: usize) -> LayerSpec {
        LayerSpec { mixer: MixerKind::Attention, moe: false, sliding_window: None, rope, ffn: true }
    }
}

#[derive(Clone, Debug)]
pub struct ModelConfig {
    /// Registry name of the architecture (`arch::ARCHES`), for messages and file metadata.
    pub arch: &'static str,
    pub n_layers: usize,
    pub d_model: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub d_ff: usize,
    pub vocab: usize,
    /// Context length the model was trained for.
    pub n_ctx_train: usize,
    pub norm_eps: f32,
    pub act: Activation,
    /// Multiplies q·k (1/√head_dim, or query_pre_attn_scalar^-½ for Gemma 3).
    pub attn_scale: f32,
    pub qkv_bias: bool,
    /// The attention output projection has a bias (gpt-oss).
    pub o_bias: bool,
    /// Attention layers carry a learned per-head sink: one more logit in each softmax's
    /// denominator that weighs no value (gpt-oss).
    pub attn_sinks: bool,
    pub qk_norm: bool,
    /// Gemma 3 normalises each sub-block's output before the residual add.
    pub post_norms: bool,
    /// Embeddings multiplied by this (Gemma 3: √d_model rounded to f32).
    pub embed_scale: Option<f32>,
    /// Each sub-block's output is multiplied by this before the residual add (Granite's
    /// `residual_multiplier`).
    pub residual_scale: Option<f32>,
    /// The logits are divided by this (Granite's `logits_scaling`).
    pub logit_scale: Option<f32>,
    pub final_logit_softcap: Option<f32>,
    pub attn_logit_softcap: Option<f32>,
    pub ropes: Vec<Rope>,
    pub layers: Vec<LayerSpec>,
    /// The experts of MoE layers (`LayerSpec::moe`).
    pub moe: Option<crate::geometry::MoeConfig>,
    /// Attention layers' q_proj also yields a per-head output gate: rows [q | gate] per head,
    /// the attention output multiplied by σ(gate) before o_proj (Qwen3-Next, Qwen3.5).
    pub attn_gate: bool,
    /// GGUF suffix of the pre-FFN norm ("ffn_norm.weight"; llama.cpp's qwen35 files call it
    /// "post_attention_norm.weight").
    pub ffn_norm: &'static str,
    /// GGUF name of the final norm ("output_norm.weight"; LFM2's GGUF calls it
    /// "token_embd_norm.weight").
    pub output_norm: &'static str,
    /// Under `--numerics llamacpp`: the graph scales Q (f32) before attention and passes
    /// kq_scale = 1, where other architectures scale the f16 dot product (llama.cpp's Gemma 3).
    pub llamacpp_scales_q: bool,
}

impl ModelConfig {
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

//! The engine's model description: one validated struct, built by an architecture file from
//! GGUF metadata or an HF config, that the shared blocks read. Nothing here knows a file format.

use cortiq_kernels::ops::RopeStyle;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Silu,
    GeluTanh,
}

impl Activation {
    pub fn f(self) -> fn(f32) -> f32 {
        match self {
            Activation::Silu => cortiq_kernels::ops::silu,
            Activation::GeluTanh => cortiq_kernels::ops::gelu_tanh,
        }
    }
}

/// RoPE frequency scaling as the model was trained with.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    Linear { factor: f64 },
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position: f64 },
}

/// One RoPE table's recipe: rotated dims and per-pair inverse frequencies.
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    pub style: RopeStyle,
    /// Rotated dimensions (≤ head_dim, even).
    pub rot_dim: usize,
    /// rot_dim/2 inverse frequencies, f64 so long positions keep their precision.
    pub inv_freq: Vec<f64>,
    /// The frequency base and scaling `inv_freq` was built from (llama.cpp numerics recompute
    /// the angles from them the way ggml does).
    pub base: f64,
    pub scaling: RopeScaling,
}

impl Rope {
    /// HF's default / linear / llama3 inverse frequencies (modeling_rope_utils).
    pub fn new(style: RopeStyle, rot_dim: usize, theta: f64, scaling: &RopeScaling) -> Rope {
        let half = rot_dim / 2;
        let mut inv: Vec<f64> = (0..half).map(|i| 1.0 / theta.powf((2 * i) as f64 / rot_dim as f64)).collect();
        match *scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => inv.iter_mut().for_each(|f| *f /= factor),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position } => {
                let low_wavelen = original_max_position / low_freq_factor;
                let high_wavelen = original_max_position / high_freq_factor;
                for f in inv.iter_mut() {
                    let wavelen = 2.0 * std::f64::consts::PI / *f;
                    if wavelen > low_wavelen {
                        *f /= factor;
                    } else if wavelen >= high_wavelen {
                        let smooth = (original_max_position / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                        *f = (1.0 - smooth) * *f / factor + smooth * *f;
                    }
                }
            }
        }
        Rope { style, rot_dim, inv_freq: inv, base: theta, scaling: scaling.clone() }
    }

    /// cos and sin for `n` consecutive positions from `pos0`: each [n, rot_dim/2].
    pub fn tables(&self, pos0: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(n * half);
        let mut sin = Vec::with_capacity(n * half);
        for p in pos0..pos0 + n {
            for &f in &self.inv_freq {
                let a = p as f64 * f;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        (cos, sin)
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
    GatedDeltaNet(crate::mixers::gdn::GdnConfig),
    /// Kimi Delta Attention.
    Kda(crate::mixers::kda::KdaConfig),
    /// Multi-head latent attention (Kimi Linear: no RoPE).
    Mla(crate::mixers::mla::MlaConfig),
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
}

impl LayerSpec {
    /// An attention layer over every earlier key with RoPE `rope`.
    pub fn attention(rope: usize) -> LayerSpec {
        LayerSpec { mixer: MixerKind::Attention, moe: false, sliding_window: None, rope }
    }
}

#[derive(Clone, Debug)]
pub struct ModelConfig {
    /// Registry name of the architecture ("llama", "qwen2", "qwen3", "gemma3").
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
    pub qk_norm: bool,
    /// Gemma 3 normalises each sub-block's output before the residual add.
    pub post_norms: bool,
    /// Embeddings multiplied by this (Gemma 3: √d_model rounded to f32).
    pub embed_scale: Option<f32>,
    pub final_logit_softcap: Option<f32>,
    pub attn_logit_softcap: Option<f32>,
    pub ropes: Vec<Rope>,
    pub layers: Vec<LayerSpec>,
    /// The experts of MoE layers (`LayerSpec::moe`).
    pub moe: Option<crate::moe::MoeConfig>,
    /// Attention layers' q_proj also yields a per-head output gate: rows [q | gate] per head,
    /// the attention output multiplied by σ(gate) before o_proj (Qwen3-Next, Qwen3.5).
    pub attn_gate: bool,
    /// GGUF suffix of the pre-FFN norm ("ffn_norm.weight"; llama.cpp's qwen35 files call it
    /// "post_attention_norm.weight").
    pub ffn_norm: &'static str,
    /// GGUF name of the final norm ("output_norm.weight"; LFM2's GGUF calls it
    /// "token_embd_norm.weight").
    pub output_norm: &'static str,
}

impl ModelConfig {
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

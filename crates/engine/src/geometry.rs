//! The geometry of each mixer and of the experts: plain data that the model config names
//! (`config::MixerKind`, `ModelConfig::moe`) and the mixers read. A leaf, so that the config
//! does not depend on the mixers' code (each mixer module re-exports its own).

// GatedDeltaNet (mixers::gdn).

/// How the per-head output norm is gated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutGate {
    /// x̂·w·silu(z) (Qwen3-Next, Qwen3.5).
    Silu,
    /// x̂·w·σ(z).
    Sigmoid,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GdnConfig {
    pub d_model: usize,
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub d_k: usize,
    pub d_v: usize,
    pub conv_kernel: usize,
    pub norm_eps: f32,
    pub out_gate: OutGate,
    /// Value head h uses key head h % n_k (llama.cpp's GGUF order, "tiled") instead of
    /// h / (n_v / n_k) (transformers' repeat_interleave, "grouped"). Every per-value-head
    /// tensor of a file is in its own order, so only this mapping changes.
    pub v_tiled: bool,
}

impl GdnConfig {
    pub fn key_dim(&self) -> usize {
        self.n_k_heads * self.d_k
    }
    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.d_v
    }
    /// Channels of the short convolution: q, k and v side by side.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
}

// Kimi Delta Attention (mixers::kda).

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KdaConfig {
    pub d_model: usize,
    pub n_heads: usize,
    pub d_head: usize,
    pub conv_kernel: usize,
    pub norm_eps: f32,
}

impl KdaConfig {
    pub fn dim(&self) -> usize {
        self.n_heads * self.d_head
    }
}

// Multi-head latent attention (mixers::mla).

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MlaConfig {
    pub d_model: usize,
    pub n_heads: usize,
    pub nope: usize,
    pub rope: usize,
    pub v_dim: usize,
    pub kv_lora: usize,
    pub norm_eps: f32,
}

impl MlaConfig {
    pub fn qk_dim(&self) -> usize {
        self.nope + self.rope
    }

    /// Values per position of the latent cache: kv_lora + rope, padded to a multiple of 16 (the
    /// decode kernel's SIMD width; the padding is zeros in the rows and in the queries).
    pub fn latent_width(&self) -> usize {
        (self.kv_lora + self.rope).next_multiple_of(16)
    }
}

// vmf_phase (mixers::vmf).

/// One vmf_phase layer's geometry and options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmfConfig {
    pub d_model: usize,
    /// Query heads (phase projections θq and outputs).
    pub n_heads: usize,
    /// States (θk, v, κ, decay, mass); divides `n_heads`.
    pub n_k_heads: usize,
    /// P phases per head: F = 2P kernel components.
    pub nphase: usize,
    pub d_v: usize,
    /// Taps of the causal depthwise conv on the mixer input; 0 = none.
    pub conv_kernel: usize,
    /// The write gate κ = σ(W·x + b).
    pub k_gate: bool,
    /// θq and θk carry a bias (a per-component phase offset).
    pub phase_bias: bool,
    /// The window option (`mixers::vmf_window`): the layer keeps softmax attention over its
    /// first `sinks` positions and the last `window`, and the core stands for the keys that
    /// left the window, as one more slot of the softmax. 0: the plain operator.
    pub window: usize,
    pub sinks: usize,
}

impl VmfConfig {
    /// Kernel components per state, F = 2P.
    pub fn f(&self) -> usize {
        2 * self.nphase
    }
    /// Query heads per state.
    pub fn group(&self) -> usize {
        self.n_heads / self.n_k_heads
    }
    /// Whether the layer runs the window option.
    pub fn windowed(&self) -> bool {
        self.window > 0
    }
    /// Floats of the recurrent state (S of every state; the conv ring).
    pub fn state_floats(&self) -> (usize, usize) {
        (self.n_k_heads * self.f() * self.d_v, self.conv_kernel.saturating_sub(1) * self.d_model)
    }
}

// Mixture of experts (moe).

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scoring {
    Softmax,
    Sigmoid,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeConfig {
    pub n_experts: usize,
    pub top_k: usize,
    pub scoring: Scoring,
    /// Renormalize the top-k weights to sum to 1.
    pub norm_topk: bool,
    /// Multiplies the routed experts' sum.
    pub routed_scale: f32,
    /// Hidden width of each routed expert.
    pub d_ff_expert: usize,
    /// Hidden width of the shared expert, if any.
    pub d_ff_shared: Option<usize>,
    /// The shared expert's output is scaled by σ(shared_gate·x).
    pub shared_gate: bool,
}

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

// Mamba2 (mixers::mamba2).

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mamba2Config {
    pub d_model: usize,
    /// SSM heads (HF `mamba_n_heads`, llama.cpp's `ssm.time_step_rank`).
    pub n_heads: usize,
    pub head_dim: usize,
    /// Groups of B and C: head h reads group h / (n_heads / n_groups).
    pub n_groups: usize,
    /// State size per head and channel (`mamba_d_state`).
    pub d_state: usize,
    pub conv_kernel: usize,
    /// The convolution has a bias.
    pub conv_bias: bool,
    pub norm_eps: f32,
    /// Groups of the gated RMSNorm over the d_inner channels (1: one norm over all of them).
    pub norm_groups: usize,
    /// How the output y meets the gate z and the norm.
    pub norm: MambaNorm,
    /// dt is clamped to [dt_min, dt_max] after the softplus (HF `time_step_limit`; (0, ∞): off).
    pub dt_min: f32,
    pub dt_max: f32,
}

/// Mamba2's output gate and norm: y·silu(z) normalized per group (Granite, Nemotron-H), y
/// normalized then ·silu(z) (Falcon-H1's `mamba_norm_before_gate`), or y·silu(z) with no norm
/// (Falcon-H1 without `mamba_rms_norm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MambaNorm {
    GateThenNorm,
    NormThenGate,
    GateOnly,
}

impl Mamba2Config {
    /// Channels of the SSM's input x (and of the gate z and the output y).
    pub fn d_inner(&self) -> usize {
        self.n_heads * self.head_dim
    }
    /// Channels of the short convolution: x, B and C side by side.
    pub fn conv_dim(&self) -> usize {
        self.d_inner() + 2 * self.n_groups * self.d_state
    }
    /// Rows of in_proj: z | x B C | dt.
    pub fn in_dim(&self) -> usize {
        self.d_inner() + self.conv_dim() + self.n_heads
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
    /// Added to the top-k weights' sum before that renormalization (LFM2-MoE: 1e-6).
    pub topk_eps: f32,
    /// Multiplies the routed experts' sum.
    pub routed_scale: f32,
    /// Hidden width of each routed expert.
    pub d_ff_expert: usize,
    /// Hidden width of the shared expert, if any.
    pub d_ff_shared: Option<usize>,
    /// The shared expert's output is scaled by σ(shared_gate·x).
    pub shared_gate: bool,
    /// How an expert gates its hidden units.
    pub act: ExpertAct,
    /// The experts (and the shared expert) have no gate projection: relu(up)² (Nemotron-H),
    /// run as `Activation::Relu2`'s relu(up)·up with the up projection read as the gate.
    pub ungated: bool,
}

/// An expert's gating: the model's activation (`act(gate)·up`), or gpt-oss's clamped SwiGLU
/// with biases: g = min(gate, limit), u = clamp(up, ±limit), (u + 1)·g·σ(alpha·g).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ExpertAct {
    Gated,
    ClampedSwiGlu { alpha: f32, limit: f32 },
}

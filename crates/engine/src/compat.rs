//! llama.cpp numerics: the engine's second numeric mode, which reproduces the float arithmetic
//! of llama.cpp's x86 CPU backend (AVX-512 build, default settings) op by op, so that greedy
//! text agrees with llama.cpp's token for token through near-ties.
//!
//! Owns: `rope_tables_ggml` (built from the model's RoPE
//! config). The ggml-order twins of the other ops live in `cortiq_kernels::ggml` (kernels own
//! every unsafe/SIMD body) and are re-exported here: `rmsnorm_ggml` (sum of f32 squares in f64, f32 mean and scale),
//! `rope_tables_ggml` (theta advanced by f32 products, `cosf`/`sinf`) and `rope_ggml` (the
//! rotation with GCC's FMA contraction), `swiglu_ggml` (ggml's
//! polynomial `expf`), `geglu_ggml` (GELU through ggml's f16 table) and `flash_attn_ggml`
//! (ggml-cpu's `flash_attn_ext_f16` one-chunk path: f16 K/V, Q rounded to f16, the f16 dot in
//! `ggml_vec_dot_f16`'s lane order, online softmax, V accumulated in f16).
//! The quantized matmuls' side of the mode lives in QTensor (`set_llamacpp_order`).
//!
//! Why a separate mode: llama.cpp rounds activations to 8 bits before every quantized matmul,
//! keeps K/V in f16 and accumulates attention in f16. Each of these moves a logit by ~1e-3,
//! enough to flip a near-tie; reproducing them is the only way to follow llama.cpp's text. The
//! exact mode stays the default because it is the reproducible reference (transformers).
//!
//! `flash_attn_ggml_tiled` is ggml's tiled path, which llama.cpp takes for micro-batches of
//! >= 64 queries (prompts, perplexity).
//!
//! Decode past 256 positions takes ggml's KV-split path, whose chunks depend on llama.cpp's
//! thread count and cache size: `Model::set_llamacpp_threads` says the former (default 4,
//! llama_context_default_params), the state's n_ctx stands for the latter.
//!
//! Verified by `crates/cli/tests/llamacpp_parity.rs` against references from llama.cpp itself
//! (tools/llamacpp/gen_llamacpp_ref.py: the llama-cpp-python 0.3.36 build, `-march=native`, 2
//! threads, flash attention, f16 KV): logits bit-identical for SmolLM2-135M Q4_1, Gemma 3 270M
//! Q4_K_M and Qwen2.5-0.5B Q4_K_M on 3 prompts of 5-90 tokens, every position and 32 greedy
//! steps each; alice29 perplexity (ctx 512, 8 chunks) equal to llama-perplexity's to 4 decimals
//! (`real_models.rs`). Where the CPU has AVX512-FP16 such a build does ggml's f16 vector ops in
//! native f16 arithmetic, and the twins follow the same runtime check. An earlier, uncommitted
//! harness also covered 300 greedy steps and 511-token batches; no committed reference does.

pub use cortiq_kernels::ggml::*;

pub use crate::numerics::{LlamaCppCtx, Numerics};
use crate::rope::{Rope, RopeScaling};

/// cos and sin for `n` positions from `pos0` as ggml_rope_cache_init computes them:
/// `theta_scale = powf(base, -2.0f/n_dims)`, theta starts at the position (f32) and is
/// multiplied by theta_scale once per pair; `cosf(freq_scale*theta)`. Each [n, rot_dim/2].
/// Returns None for scalings ggml expresses differently (Llama 3 frequency factors); the caller
/// falls back to the exact tables.
pub fn rope_tables_ggml(rope: &Rope, pos0: usize, n: usize) -> Option<(Vec<f32>, Vec<f32>)> {
    let freq_scale = match rope.scaling {
        RopeScaling::None => 1.0f32,
        RopeScaling::Linear { factor } => (1.0 / factor) as f32,
        RopeScaling::Llama3 { .. } | RopeScaling::Yarn { .. } => return None,
    };
    let half = rope.rot_dim / 2;
    let theta_scale = (rope.base as f32).powf(-2.0f32 / rope.rot_dim as f32);
    let mut cos = Vec::with_capacity(n * half);
    let mut sin = Vec::with_capacity(n * half);
    for p in pos0..pos0 + n {
        let mut theta = p as f32;
        for _ in 0..half {
            let t = freq_scale * theta;
            cos.push(t.cos());
            sin.push(t.sin());
            theta *= theta_scale;
        }
    }
    Some((cos, sin))
}

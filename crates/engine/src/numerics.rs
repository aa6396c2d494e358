//! The numeric mode switch (`Numerics`) and what llama.cpp's attention order depends on beyond
//! the values (`LlamaCppCtx`). A leaf of the engine: QTensor, the blocks and `compat` (the
//! llama.cpp twins) all read it, so it sits below QTensor; `compat` re-exports both under their
//! old paths.

/// Which arithmetic the engine follows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Numerics {
    /// f32 math on dequantized weights, an f32 KV cache by default: transformers' numerics (the library
    /// default, the reproducible reference).
    #[default]
    Exact,
    /// Quantized weights times 8-bit activations with integer dot products in cortiq's own
    /// kernel order (llama.cpp's arithmetic class, not its bits), an f16 KV cache by default
    /// (llama.cpp's); everything else as `Exact`. The CLI's default.
    Fast,
    /// llama.cpp's CPU numerics: 8-bit activations in ggml's kernel orders, f16 KV cache,
    /// ggml's flash attention, norms, RoPE and activations.
    LlamaCpp,
}

/// What llama.cpp's attention depends on beyond the values: its thread count and the size of
/// its KV cache in cells (only decode past 256 positions uses them), and whether its build does
/// f16 rows in native AVX512-FP16 arithmetic (`kernels::ggml::ggml_f16_arith_len`; the
/// one-chunk flash attention of head_dim >= 128 models).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LlamaCppCtx {
    pub cache_cells: usize,
    pub threads: usize,
    pub fp16_build: bool,
}

//! GGUF parity: the dense fixtures converted by llama.cpp's own convert_hf_to_gguf.py
//! (tools/fixtures/gen_gguf.py; model.gguf beside each fixture's safetensors) must give the
//! transformers float64 logits within 1e-4 max-abs for a whole-sequence forward, a chunked
//! prefill and a token-by-token decode, and the same greedy tokens.
//!
//! What this adds to fixture_parity.rs: the GGUF layout. Llama's converter permutes the Q/K rows
//! so that llama.cpp's interleaved ("normal") RoPE applies, and turns llama3 rope scaling into
//! a rope_freqs tensor; Gemma's converter folds the +1 into every RMSNorm gain; f16, bf16 and
//! f32 storage; tied and untied output. An engine that reads a GGUF like an HF checkpoint fails.
//!
//! Gemma 3 is checked against gguf_ref_*: a gemma3 GGUF carries neither the layer pattern nor
//! query_pre_attn_scalar (llama.cpp hard-codes every 6th layer global and 1/sqrt(head_dim)), and
//! the gemma3 fixture deliberately differs from both, so its GGUF describes another model. The
//! gguf_ref_* files are transformers' float64 logits for that model (same checkpoint, layer_types
//! and query_pre_attn_scalar as llama.cpp reads them); see tools/fixtures/gen_gguf.py.

mod common;

use common::{check_parity, fixture};

#[test]
fn llama_gguf_matches_transformers() {
    check_parity("llama", &fixture("llama").join("model.gguf"), "");
}

#[test]
fn qwen2_gguf_matches_transformers() {
    check_parity("qwen2", &fixture("qwen2").join("model.gguf"), "");
}

#[test]
fn qwen3_gguf_matches_transformers() {
    check_parity("qwen3", &fixture("qwen3").join("model.gguf"), "");
}

#[test]
fn gemma3_gguf_matches_transformers_with_llamacpp_settings() {
    check_parity("gemma3", &fixture("gemma3").join("model.gguf"), "gguf_ref_");
}

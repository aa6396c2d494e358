//! Hybrid architectures against their committed HF transformers fixtures
//! (tools/fixtures/gen_hybrid.py): the same checks as the dense parity tests — whole-sequence
//! logits vs the float64 reference, chunked prefill, token-by-token decode, greedy tokens —
//! with issue 4's tolerances (1e-4 for LFM2, 5e-4 for GatedDeltaNet models). Each sequence is
//! longer than one 64-token chunk of the delta rule's chunked form.

mod common;

use common::{check_parity_tol, fixture};

#[test]
fn lfm2_matches_transformers() {
    check_parity_tol("lfm2", &fixture("lfm2"), "", 1e-4);
}

#[test]
fn lfm2_gguf_matches_transformers() {
    check_parity_tol("lfm2", &fixture("lfm2").join("model.gguf"), "", 1e-4);
}

#[test]
fn qwen3_5_matches_transformers() {
    check_parity_tol("qwen3_5", &fixture("qwen3_5"), "", 5e-4);
}

#[test]
fn qwen3_5_gguf_matches_transformers() {
    check_parity_tol("qwen3_5", &fixture("qwen3_5").join("model.gguf"), "", 5e-4);
}

#[test]
fn qwen3_5_moe_matches_transformers() {
    check_parity_tol("qwen3_5_moe", &fixture("qwen3_5_moe"), "", 5e-4);
}

#[test]
fn qwen3_5_moe_gguf_matches_transformers() {
    check_parity_tol("qwen3_5_moe", &fixture("qwen3_5_moe").join("model.gguf"), "", 5e-4);
}

#[test]
fn qwen3_next_matches_transformers() {
    check_parity_tol("qwen3_next", &fixture("qwen3_next"), "", 5e-4);
}

#[test]
fn qwen3_next_gguf_matches_transformers() {
    check_parity_tol("qwen3_next", &fixture("qwen3_next").join("model.gguf"), "", 5e-4);
}

#[test]
fn kimi_linear_matches_transformers() {
    check_parity_tol("kimi_linear", &fixture("kimi_linear"), "", 5e-4);
}

#[test]
fn kimi_linear_gguf_matches_transformers() {
    check_parity_tol("kimi_linear", &fixture("kimi_linear").join("model.gguf"), "", 5e-4);
}

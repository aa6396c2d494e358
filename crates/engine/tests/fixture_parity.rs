//! Architecture parity against the committed HF transformers fixtures (tools/fixtures/gen_dense.py):
//! logits within 1e-4 max-abs of the float64 reference for a whole-sequence forward, for a
//! chunked prefill, and for token-by-token decode; greedy tokens identical; and a per-layer
//! trace that names the first layer whose residual stream diverges when a check fails.

mod common;

use common::{check_parity, fixture};

#[test]
fn llama_matches_transformers() {
    check_parity("llama", &fixture("llama"), "");
}

#[test]
fn qwen2_matches_transformers() {
    check_parity("qwen2", &fixture("qwen2"), "");
}

#[test]
fn qwen3_matches_transformers() {
    check_parity("qwen3", &fixture("qwen3"), "");
}

#[test]
fn gemma3_matches_transformers() {
    check_parity("gemma3", &fixture("gemma3"), "");
}

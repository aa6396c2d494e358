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

/// The MTP block of a Qwen3-Next / Qwen3.5 checkpoint is loaded (not run) from both the HF
/// folder (`mtp.*`) and its GGUF conversion (block n_layers, `nextn.*`), with the same values:
/// the HF norms get the (1 + w) offset like every other Qwen norm.
fn check_mtp(name: &str) {
    let dir = fixture(name);
    let hf = cortiq_engine::load::load(&dir).expect("HF folder").model;
    let gg = cortiq_engine::load::load(&dir.join("model.gguf")).expect("GGUF").model;
    assert_eq!(hf.mtp.len(), 1, "{name}: MTP blocks from the HF folder");
    assert_eq!(gg.mtp.len(), 1, "{name}: MTP blocks from the GGUF");
    let (a, b) = (&hf.mtp[0], &gg.mtp[0]);
    let mut pairs: Vec<(String, Vec<f32>, Vec<f32>)> = vec![
        ("eh_proj".into(), a.eh_proj.to_f32(), b.eh_proj.to_f32()),
        ("enorm".into(), a.enorm.clone(), b.enorm.clone()),
        ("hnorm".into(), a.hnorm.clone(), b.hnorm.clone()),
        ("shared_head_norm".into(), a.shared_head_norm.clone(), b.shared_head_norm.clone()),
        ("attn_norm".into(), a.layer.attn_norm.clone(), b.layer.attn_norm.clone()),
        ("ffn_norm".into(), a.layer.ffn_norm.clone(), b.layer.ffn_norm.clone()),
    ];
    let (ma, mb) = (a.layer.matrices(), b.layer.matrices());
    assert_eq!(ma.len(), mb.len(), "{name}: MTP layer matrices");
    for (x, y) in ma.iter().zip(&mb) {
        pairs.push((y.name.clone(), x.to_f32(), y.to_f32()));
    }
    for (what, x, y) in &pairs {
        assert_eq!(x.len(), y.len(), "{name} {what}: lengths");
        let scale = y.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(scale > 0.0, "{name} {what}: all zeros");
        let (at, diff) =
            x.iter().zip(y).map(|(p, q)| (p - q).abs()).enumerate().fold((0, 0f32), |m, (i, d)| if d > m.1 { (i, d) } else { m });
        println!("{name} mtp {what}: max |HF - GGUF| {diff:.3e} at {at} (max |w| {scale:.3})");
        // Both files hold the same bf16 draws; the GGUF converter may store them as f16, whose
        // rounding (2^-11 relative) is the only allowed difference.
        assert!(diff <= scale * 1e-3, "{name} {what}: max |HF - GGUF| {diff:e} at {at}");
    }
}

#[test]
fn qwen3_5_mtp_loaded() {
    check_mtp("qwen3_5");
}

#[test]
fn qwen3_5_moe_mtp_loaded() {
    check_mtp("qwen3_5_moe");
}

#[test]
fn qwen3_next_mtp_loaded() {
    check_mtp("qwen3_next");
}

#[test]
fn lfm2_has_no_mtp() {
    assert!(cortiq_engine::load::load(&fixture("lfm2")).expect("HF folder").model.mtp.is_empty());
}

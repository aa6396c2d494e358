//! The HF <-> GGUF tensor-name table against llama.cpp's gguf-py (fixture written by
//! tools/hf_names_reference.py with gguf==0.19.0).

use cortiq_formats::names::{gguf_to_hf, hf_to_gguf};

const FIXTURE: &str = include_str!("fixtures/hf_names_gguf_py.tsv");

#[test]
fn hf_to_gguf_matches_gguf_py_for_every_candidate() {
    let mut checked = 0;
    let mut mapped = 0;
    let mut bad = Vec::new();
    for line in FIXTURE.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        assert_eq!(f.len(), 3, "fixture line {line:?}");
        let (arch, hf, want) = (f[0], f[1], if f[2] == "-" { None } else { Some(f[2].to_string()) });
        let got = hf_to_gguf(arch, hf);
        if got != want {
            bad.push(format!("{arch} {hf}: ours {got:?}, gguf-py {want:?}"));
        }
        checked += 1;
        if let Some(g) = want {
            mapped += 1;
            // And back: the text-only HF spelling.
            let back = gguf_to_hf(arch, &g);
            if back.as_deref() != Some(hf) {
                bad.push(format!("{arch} {g}: back to {back:?}, expected {hf}"));
            }
        }
    }
    println!("checked {checked} names ({mapped} with a GGUF twin)");
    assert!(checked >= 160 && mapped >= 100, "fixture too small: {checked}/{mapped}");
    assert!(bad.is_empty(), "{} mismatches:\n{}", bad.len(), bad.join("\n"));
}

#[test]
fn norm_naming_differs_between_llama_and_gemma3() {
    let h = "model.layers.7.post_attention_layernorm.weight";
    assert_eq!(hf_to_gguf("llama", h).as_deref(), Some("blk.7.ffn_norm.weight"));
    assert_eq!(hf_to_gguf("qwen2", h).as_deref(), Some("blk.7.ffn_norm.weight"));
    assert_eq!(hf_to_gguf("gemma3", h).as_deref(), Some("blk.7.post_attention_norm.weight"));
    assert_eq!(gguf_to_hf("gemma3", "blk.7.ffn_norm.weight").as_deref(), Some("model.layers.7.pre_feedforward_layernorm.weight"));
    assert_eq!(gguf_to_hf("qwen3", "blk.7.ffn_norm.weight").as_deref(), Some("model.layers.7.post_attention_layernorm.weight"));
    assert_eq!(gguf_to_hf("llama", "blk.7.post_ffw_norm.weight"), None);
}

#[test]
fn gemma3_multimodal_prefixes_and_model_type_alias() {
    for (hf, g) in [
        ("model.language_model.layers.3.mlp.down_proj.weight", "blk.3.ffn_down.weight"),
        ("language_model.model.layers.3.self_attn.k_norm.weight", "blk.3.attn_k_norm.weight"),
        ("model.language_model.embed_tokens.weight", "token_embd.weight"),
        ("language_model.model.norm.weight", "output_norm.weight"),
        ("language_model.lm_head.weight", "output.weight"),
    ] {
        assert_eq!(hf_to_gguf("gemma3", hf).as_deref(), Some(g), "{hf}");
        assert_eq!(hf_to_gguf("gemma3_text", hf).as_deref(), Some(g), "{hf} via gemma3_text");
    }
}

#[test]
fn rejects_what_is_not_a_tensor_of_the_arch() {
    assert_eq!(hf_to_gguf("mamba", "model.embed_tokens.weight"), None);
    assert_eq!(hf_to_gguf("llama", "model.layers.0.self_attn.q_norm.weight"), None);
    assert_eq!(hf_to_gguf("llama", "model.layers.x.mlp.up_proj.weight"), None);
    assert_eq!(hf_to_gguf("llama", "model.layers.01.mlp.up_proj.weight"), None);
    assert_eq!(hf_to_gguf("llama", "model.layers.0.input_layernorm.bias"), None);
    assert_eq!(hf_to_gguf("llama", "model.embed_tokens.bias"), None);
    assert_eq!(hf_to_gguf("llama", "model.layers.0.self_attn.rotary_emb.inv_freq"), None);
    assert_eq!(gguf_to_hf("llama", "rope_freqs.weight"), None);
    assert_eq!(gguf_to_hf("llama", "blk.-1.attn_q.weight"), None);
    assert_eq!(gguf_to_hf("llama", "blk.0.attn_q"), None);
    assert_eq!(gguf_to_hf("qwen2", "blk.12.attn_v.bias").as_deref(), Some("model.layers.12.self_attn.v_proj.bias"));
}

//! The HF <-> GGUF tensor-name table against llama.cpp's gguf-py (fixture written by
//! tools/hf_names_reference.py with gguf==0.19.0).

use cortiq_engine::arch::by_any_name;
use cortiq_formats::names::mtp_own_gguf;

// The lookups by an architecture's name in either spelling, through its file's table.
fn hf_to_gguf(arch: &str, hf: &str) -> Option<String> {
    by_any_name(arch)?.names.hf_to_gguf(hf)
}
fn gguf_to_hf(arch: &str, gguf: &str) -> Option<String> {
    by_any_name(arch)?.names.gguf_to_hf(gguf)
}
fn hf_mtp_to_gguf(arch: &str, hf: &str, n_layers: usize) -> Option<String> {
    by_any_name(arch)?.names.hf_mtp_to_gguf(hf, n_layers)
}
fn gguf_mtp_to_hf(arch: &str, gguf: &str, n_layers: usize) -> Option<String> {
    by_any_name(arch)?.names.gguf_mtp_to_hf(gguf, n_layers)
}

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

/// LFM2's own spellings map both ways, and the dense spellings it lacks do not match.
#[test]
fn lfm2_names_round_trip() {
    for (hf, gguf) in [
        ("model.embedding_norm.weight", "token_embd_norm.weight"),
        ("model.layers.0.operator_norm.weight", "blk.0.attn_norm.weight"),
        ("model.layers.2.self_attn.out_proj.weight", "blk.2.attn_output.weight"),
        ("model.layers.2.self_attn.q_layernorm.weight", "blk.2.attn_q_norm.weight"),
        ("model.layers.1.feed_forward.w3.weight", "blk.1.ffn_up.weight"),
        ("model.layers.1.conv.conv.weight", "blk.1.shortconv.conv.weight"),
        ("model.layers.1.conv.in_proj.weight", "blk.1.shortconv.in_proj.weight"),
    ] {
        assert_eq!(hf_to_gguf("lfm2", hf).as_deref(), Some(gguf), "{hf}");
        assert_eq!(gguf_to_hf("lfm2", gguf).as_deref(), Some(hf), "{gguf}");
    }
    assert_eq!(hf_to_gguf("lfm2", "model.layers.0.input_layernorm.weight"), None);
    for (hf, gguf) in [
        ("mtp.fc.weight", "blk.24.nextn.eh_proj.weight"),
        ("mtp.pre_fc_norm_embedding.weight", "blk.24.nextn.enorm.weight"),
        ("mtp.pre_fc_norm_hidden.weight", "blk.24.nextn.hnorm.weight"),
        ("mtp.norm.weight", "blk.24.nextn.shared_head_norm.weight"),
        ("mtp.layers.0.self_attn.q_proj.weight", "blk.24.attn_q.weight"),
        ("mtp.layers.0.mlp.experts.3.up_proj.weight", "blk.24.ffn_up_exps.3.weight"),
    ] {
        assert_eq!(hf_mtp_to_gguf("qwen35moe", hf, 24).as_deref(), Some(gguf), "{hf}");
    }
    for hf in [
        "mtp.fc.weight",
        "mtp.norm.weight",
        "mtp.pre_fc_norm_hidden.weight",
        "mtp.layers.0.self_attn.k_norm.weight",
        "mtp.layers.0.mlp.experts.3.up_proj.weight",
        "mtp.layers.1.mlp.shared_expert_gate.weight",
    ] {
        let gguf = hf_mtp_to_gguf("qwen35moe", hf, 24).unwrap();
        assert_eq!(gguf_mtp_to_hf("qwen35moe", &gguf, 24).as_deref(), Some(hf), "{gguf}");
    }
    assert_eq!(mtp_own_gguf(24).count(), 4);
    // Released Qwen3.5 (Qwen3_5ForConditionalGeneration): the text model under
    // model.language_model., the vision tower's model.visual.* part of no text tensor.
    for (hf, gguf) in [
        ("model.language_model.layers.0.linear_attn.in_proj_qkv.weight", "blk.0.attn_qkv.weight"),
        ("model.language_model.layers.0.linear_attn.A_log", "blk.0.ssm_a"),
        ("model.language_model.embed_tokens.weight", "token_embd.weight"),
        ("model.language_model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
    ] {
        assert_eq!(hf_to_gguf("qwen35", hf).as_deref(), Some(gguf), "{hf}");
    }
    for hf in [
        "model.visual.merger.norm.weight",
        "model.visual.blocks.0.norm1.weight",
        "model.visual.blocks.0.attn.qkv.weight",
        "model.visual.patch_embed.proj.weight",
        "model.visual.pos_embed.weight",
    ] {
        assert_eq!(hf_to_gguf("qwen35", hf), None, "{hf}");
        assert_eq!(hf_mtp_to_gguf("qwen35", hf, 24), None, "{hf}");
    }
    assert!(mtp_own_gguf(24).all(|g| gguf_mtp_to_hf("qwen35", &g, 24).is_some()), "own tensors map back");
    assert_eq!(gguf_mtp_to_hf("qwen35", "blk.23.attn_q.weight", 24), None);
    assert_eq!(gguf_mtp_to_hf("qwen35", "blk.25.nextn.eh_proj.weight", 24), None);
    assert_eq!(gguf_mtp_to_hf("lfm2", "blk.24.attn_q.weight", 24), None);
    assert_eq!(hf_mtp_to_gguf("lfm2", "mtp.fc.weight", 24), None);
    assert_eq!(hf_mtp_to_gguf("qwen35", "model.layers.0.self_attn.q_proj.weight", 24), None);
    for (hf, gguf) in [
        ("model.layers.3.linear_attn.dt_bias", "blk.3.ssm_dt.bias"),
        ("model.layers.3.linear_attn.A_log", "blk.3.ssm_a"),
        ("model.layers.0.linear_attn.in_proj_qkv.weight", "blk.0.attn_qkv.weight"),
        ("model.layers.0.linear_attn.norm.weight", "blk.0.ssm_norm.weight"),
        ("model.layers.3.self_attn.q_norm.weight", "blk.3.attn_q_norm.weight"),
        ("model.layers.3.post_attention_layernorm.weight", "blk.3.ffn_norm.weight"),
    ] {
        assert_eq!(hf_to_gguf("qwen3_5_text", hf).as_deref(), Some(gguf), "{hf}");
        assert_eq!(gguf_to_hf("qwen35", gguf).as_deref(), Some(hf), "{gguf}");
    }
    for (hf, gguf) in [
        ("model.layers.2.mlp.experts.3.down_proj.weight", "blk.2.ffn_down_exps.3.weight"),
        ("model.layers.0.mlp.gate.weight", "blk.0.ffn_gate_inp.weight"),
        ("model.layers.0.mlp.shared_expert_gate.weight", "blk.0.ffn_gate_inp_shexp.weight"),
        ("model.layers.0.mlp.shared_expert.up_proj.weight", "blk.0.ffn_up_shexp.weight"),
        ("model.layers.0.linear_attn.A_log", "blk.0.ssm_a"),
    ] {
        assert_eq!(hf_to_gguf("qwen3_5_moe_text", hf).as_deref(), Some(gguf), "{hf}");
        assert_eq!(gguf_to_hf("qwen35moe", gguf).as_deref(), Some(hf), "{gguf}");
    }
    assert_eq!(hf_to_gguf("llama", "model.layers.0.operator_norm.weight"), None);
}

/// vmf_phase's tensors (issue 16) in both spellings, for every dense architecture.
#[test]
fn vmf_phase_names_round_trip() {
    for arch in ["llama", "qwen2", "qwen3", "gemma3"] {
        for (hf, gguf) in [
            ("model.layers.2.vmf_attn.thq.weight", "blk.2.vmf_thq.weight"),
            ("model.layers.2.vmf_attn.thq.bias", "blk.2.vmf_thq.bias"),
            ("model.layers.2.vmf_attn.thk.weight", "blk.2.vmf_thk.weight"),
            ("model.layers.2.vmf_attn.v_proj.weight", "blk.2.vmf_v.weight"),
            ("model.layers.2.vmf_attn.out_proj.weight", "blk.2.vmf_out.weight"),
            ("model.layers.2.vmf_attn.out_proj.bias", "blk.2.vmf_out.bias"),
            ("model.layers.2.vmf_attn.conv.weight", "blk.2.vmf_conv.weight"),
            ("model.layers.2.vmf_attn.k_gate.weight", "blk.2.vmf_kgate.weight"),
            ("model.layers.2.vmf_attn.k_gate.bias", "blk.2.vmf_kgate.bias"),
            ("model.layers.2.vmf_attn.A_log", "blk.2.vmf_a_log"),
            ("model.layers.2.vmf_attn.phase_mass", "blk.2.vmf_mass"),
            ("model.layers.2.vmf_attn.o_norm.weight", "blk.2.vmf_onorm.weight"),
            ("model.layers.2.vmf_attn.slot.weight", "blk.2.vmf_slot.weight"),
            ("model.layers.2.vmf_attn.slot.bias", "blk.2.vmf_slot.bias"),
        ] {
            assert_eq!(hf_to_gguf(arch, hf).as_deref(), Some(gguf), "{arch}: {hf}");
            assert_eq!(gguf_to_hf(arch, gguf).as_deref(), Some(hf), "{arch}: {gguf}");
        }
        assert_eq!(hf_to_gguf(arch, "model.layers.2.vmf_attn.v_proj.bias"), None, "{arch}: v_proj has no bias");
    }
}

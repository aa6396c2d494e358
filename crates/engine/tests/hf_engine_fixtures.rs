//! The engine's dense reference checkpoints (crates/engine/tests/fixtures/<arch>/, written by
//! transformers 5.24 `save_pretrained`, see tools/fixtures/gen_dense.py) load through this
//! crate: config.json values agree with the generator's reference.json, every stored tensor
//! has the dtype the generator stored and a shape implied by the config, and every name has
//! a GGUF twin in the name table.

use std::path::PathBuf;

use cortiq_formats::hf::{GenerationConfig, HfConfig, RopeScaling};
use cortiq_formats::safetensors::HfWeights;
use cortiq_kernels::quant::QuantType;
use serde_json::Value;

fn fixture(arch: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(arch)
}

/// Row-major shape each HF tensor must have, from the config alone.
fn expected_shape(c: &HfConfig, name: &str) -> Option<Vec<usize>> {
    let (h, hd) = (c.hidden_size, c.head_dim());
    let (q, kv) = (c.num_attention_heads * hd, c.num_key_value_heads * hd);
    let rest = name.strip_prefix("model.layers.").map(|s| s.split_once('.').unwrap().1);
    Some(match (name, rest) {
        ("model.embed_tokens.weight" | "lm_head.weight", _) => vec![c.vocab_size, h],
        ("model.norm.weight", _) => vec![h],
        (_, Some("self_attn.q_proj.weight")) => vec![q, h],
        (_, Some("self_attn.k_proj.weight" | "self_attn.v_proj.weight")) => vec![kv, h],
        (_, Some("self_attn.o_proj.weight")) => vec![h, q],
        (_, Some("self_attn.q_proj.bias")) => vec![q],
        (_, Some("self_attn.k_proj.bias" | "self_attn.v_proj.bias")) => vec![kv],
        (_, Some("self_attn.q_norm.weight" | "self_attn.k_norm.weight")) => vec![hd],
        (_, Some("mlp.gate_proj.weight" | "mlp.up_proj.weight")) => vec![c.intermediate_size, h],
        (_, Some("mlp.down_proj.weight")) => vec![h, c.intermediate_size],
        (_, Some(n)) if n.ends_with("layernorm.weight") => vec![h],
        _ => return None,
    })
}

#[test]
fn engine_fixture_folders_load() {
    let mut total = 0;
    for arch in ["llama", "qwen2", "qwen3", "gemma3"] {
        let dir = fixture(arch);
        let reference: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
        let c = cortiq_engine::arch::hf_config_from_dir(&dir).unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert_eq!(c.model_type, reference["model_type"].as_str().unwrap(), "{arch}");
        assert_eq!(c.architectures, [reference["hf_class"].as_str().unwrap()], "{arch}");
        assert_eq!(c.vocab_size as u64, reference["vocab_size"].as_u64().unwrap(), "{arch}");
        assert_eq!(c.hidden_size as u64, reference["hidden_size"].as_u64().unwrap(), "{arch}");
        assert_eq!(c.num_hidden_layers as u64, reference["num_hidden_layers"].as_u64().unwrap(), "{arch}");
        assert_eq!(c.dtype.as_deref(), reference["storage_dtype"].as_str(), "{arch}");
        assert_eq!(c.layer_types.len(), c.num_hidden_layers);
        let g = GenerationConfig::from_dir(&dir).unwrap().expect("generation_config.json");
        assert_eq!(g.eos_token_ids, c.eos_token_ids, "{arch}");

        let w = HfWeights::open_dir(&dir).unwrap_or_else(|e| panic!("{arch}: {e}"));
        let files: Vec<&str> = reference["safetensors_files"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
        let ours: Vec<String> = w.files().iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(ours, files, "{arch}");
        let want_dtype = match reference["storage_dtype"].as_str().unwrap() {
            "float32" => QuantType::F32,
            "float16" => QuantType::F16,
            "bfloat16" => QuantType::BF16,
            d => panic!("{d}"),
        };
        for name in w.names() {
            let t = w.tensor(name).unwrap();
            assert_eq!(t.dtype, want_dtype, "{arch} {name}");
            let shape = expected_shape(&c, name).unwrap_or_else(|| panic!("{arch}: unexpected tensor {name}"));
            assert_eq!(t.shape, shape, "{arch} {name}");
            assert_eq!(t.data.len(), shape.iter().product::<usize>() * if want_dtype == QuantType::F32 { 4 } else { 2 });
            let names = &cortiq_engine::arch::by_any_name(arch).unwrap().names;
            let g = names.hf_to_gguf(name).unwrap_or_else(|| panic!("{arch}: {name} has no GGUF name"));
            assert_eq!(names.gguf_to_hf(&g).as_deref(), Some(name), "{arch}: {g}");
            total += 1;
        }
        assert_eq!(w.contains("lm_head.weight"), !c.tie_word_embeddings, "{arch}: tie vs lm_head");
        let has_qkv_bias = w.contains("model.layers.0.self_attn.q_proj.bias");
        assert_eq!(has_qkv_bias, c.qkv_bias, "{arch}");
        assert!(!w.contains("model.layers.0.self_attn.o_proj.bias") && !c.o_bias);
        assert_eq!(w.contains("model.layers.0.self_attn.q_norm.weight"), matches!(arch, "qwen3" | "gemma3"));

        // What each fixture's README says it exercises.
        match arch {
            "llama" => assert_eq!(
                c.rope.scaling,
                RopeScaling::Llama3 {
                    factor: 8.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_max_position_embeddings: 64
                }
            ),
            "qwen2" => assert_eq!((c.rope.theta, w.files().len()), (1e6, 2)),
            "qwen3" => assert_eq!((c.head_dim(), c.hidden_size / c.num_attention_heads), (32, 16)),
            "gemma3" => {
                // layer_types wins over the stale _sliding_window_pattern = 6.
                assert_eq!(c.layer_types, ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]);
                assert_eq!((c.sliding_window, c.query_pre_attn_scalar), (Some(8), Some(24.0)));
                assert_eq!((c.rope.theta, c.rope_local.as_ref().map(|r| r.theta)), (1e6, Some(1e4)));
                assert_eq!(c.hidden_act, "gelu_pytorch_tanh");
            }
            _ => unreachable!(),
        }
    }
    println!("{total} tensors checked across 4 fixture folders");
    assert!(total > 100);
}

//! config.json parsing in both key styles (transformers 4: rope_theta/rope_scaling/
//! rope_local_base_freq/sliding_window_pattern; transformers 5: rope_parameters/layer_types/
//! dtype), modelled on the real configs of SmolLM2-135M, Qwen2.5-0.5B, Qwen3-0.6B,
//! Llama-3.2-1B, gemma-3-270m and gemma-3-4b-it. Expected values are the files' own numbers
//! and transformers 5.24's normalization rules (named at each check).

use std::path::Path;

use cortiq_engine::EngineError;
use cortiq_engine::arch::{hf_config_from_dir, hf_config_from_str};
use cortiq_formats::FormatError;
use cortiq_formats::hf::{GenerationConfig, HfConfig, RopeParams, RopeScaling, TokenizerConfig};

fn parse(s: &str) -> HfConfig {
    match hf_config_from_str(Path::new("test/config.json"), s) {
        Ok(c) => c,
        Err(e) => panic!("parse failed: {e}"),
    }
}

fn parse_err(s: &str) -> String {
    match hf_config_from_str(Path::new("test/config.json"), s) {
        Ok(c) => panic!("expected an error, got {c:?}"),
        Err(e) => e.to_string(),
    }
}

fn default_rope(theta: f64) -> RopeParams {
    RopeParams { theta, scaling: RopeScaling::None, partial_rotary_factor: 1.0, query_temperature: None }
}

fn all(n: usize, t: &str) -> Vec<String> {
    vec![t.to_string(); n]
}

const SMOLLM2_V4: &str = r#"{
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 576, "initializer_range": 0.041666666666666664,
  "intermediate_size": 1536, "is_llama_config": true, "max_position_embeddings": 8192,
  "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_interleaved": false, "rope_scaling": null,
  "rope_theta": 100000, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.42.3", "use_cache": true, "vocab_size": 49152
}"#;

const SMOLLM2_V5: &str = r#"{
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 1, "dtype": "bfloat16", "eos_token_id": 2,
  "head_dim": 64, "hidden_act": "silu", "hidden_size": 576, "initializer_range": 0.041666666666666664,
  "intermediate_size": 1536, "max_position_embeddings": 8192, "mlp_bias": false,
  "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3,
  "pad_token_id": null, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
  "tie_word_embeddings": true, "transformers_version": "5.24.0", "use_cache": true, "vocab_size": 49152
}"#;

#[test]
fn smollm2_llama_both_styles() {
    for (style, s) in [("v4", SMOLLM2_V4), ("v5", SMOLLM2_V5)] {
        let c = parse(s);
        assert_eq!(c.architectures, ["LlamaForCausalLM"], "{style}");
        assert_eq!(c.model_type, "llama");
        assert_eq!(c.outer_model_type, None);
        assert_eq!(
            (c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads),
            (576, 1536, 30, 9, 3),
            "{style}"
        );
        assert_eq!(c.head_dim(), 64, "{style}");
        assert_eq!((c.vocab_size, c.max_position_embeddings), (49152, 8192));
        assert_eq!(c.rms_norm_eps, 1e-5);
        assert!(c.tie_word_embeddings);
        assert!(!c.attention_bias && !c.qkv_bias && !c.o_bias && !c.mlp_bias);
        assert_eq!(c.hidden_act, "silu");
        assert_eq!(c.sliding_window, None);
        assert_eq!((c.bos_token_id, c.eos_token_ids.as_slice(), c.pad_token_id), (Some(1), &[2u32][..], None));
        assert_eq!(c.dtype.as_deref(), Some("bfloat16"));
        assert_eq!(c.rope, default_rope(100000.0), "{style}");
        assert_eq!(c.rope_local, None);
        assert_eq!(c.layer_types, all(30, "full_attention"));
        assert_eq!(c.raw["model_type"], "llama");
    }
    // head_dim absent in v4: derived (LlamaConfig.__post_init__), not stored.
    assert_eq!(parse(SMOLLM2_V4).head_dim, None);
    assert_eq!(parse(SMOLLM2_V5).head_dim, Some(64));
}

const QWEN25_V4: &str = r#"{
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu",
  "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
  "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2",
  "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.40.1",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936
}"#;

const QWEN25_V5: &str = r#"{
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
  "bos_token_id": 151643, "dtype": "bfloat16", "eos_token_id": 151643, "hidden_act": "silu",
  "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
  "layer_types": ["full_attention", "full_attention", "full_attention", "full_attention",
    "full_attention", "full_attention", "full_attention", "full_attention", "full_attention",
    "full_attention", "full_attention", "full_attention", "full_attention", "full_attention",
    "full_attention", "full_attention", "full_attention", "full_attention", "full_attention",
    "full_attention", "full_attention", "full_attention", "full_attention", "full_attention"],
  "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2",
  "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
  "sliding_window": null, "tie_word_embeddings": true, "transformers_version": "5.24.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936
}"#;

#[test]
fn qwen25_both_styles() {
    for (style, s) in [("v4", QWEN25_V4), ("v5", QWEN25_V5)] {
        let c = parse(s);
        assert_eq!(c.model_type, "qwen2");
        assert_eq!((c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim()), (896, 14, 2, 64));
        // Qwen2Attention: q/k/v carry a bias although the config has no key for it; o_proj none.
        assert!(c.qkv_bias && !c.o_bias && !c.attention_bias, "{style}");
        // Qwen2Config.__post_init__: sliding_window is dropped unless use_sliding_window.
        assert_eq!(c.sliding_window, None, "{style}");
        assert_eq!(c.layer_types, all(24, "full_attention"), "{style}");
        assert_eq!(c.rope, default_rope(1e6), "{style}");
        assert_eq!(c.eos_token_ids, [151643]);
        assert_eq!(c.rms_norm_eps, 1e-6);
        assert!(c.tie_word_embeddings);
    }
}

#[test]
fn qwen2_use_sliding_window_slides_layers_from_max_window_layers() {
    let s = QWEN25_V4.replace(r#""use_sliding_window": false"#, r#""use_sliding_window": true"#);
    let c = parse(&s.replace(r#""max_window_layers": 24"#, r#""max_window_layers": 21"#));
    assert_eq!(c.sliding_window, Some(32768));
    let want: Vec<String> = (0..24).map(|i| if i >= 21 { "sliding_attention" } else { "full_attention" }.to_string()).collect();
    assert_eq!(c.layer_types, want);
}

const QWEN3_V4: &str = r#"{
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936
}"#;

#[test]
fn qwen3_v4_and_yarn_v5() {
    let c = parse(QWEN3_V4);
    assert_eq!((c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim), (1024, 16, 8, Some(128)));
    assert_eq!(c.head_dim(), 128); // not hidden/heads = 64
    assert!(!c.qkv_bias && !c.o_bias);
    assert_eq!(c.rope, default_rope(1e6));
    assert_eq!((c.bos_token_id, c.eos_token_ids.clone()), (Some(151643), vec![151645]));
    assert_eq!(c.layer_types, all(28, "full_attention"));

    // transformers 5 style with YaRN (Qwen3 long-context recipe); beta/truncate defaults from
    // _compute_yarn_parameters.
    let s = QWEN3_V4.replace(
        r#""rope_scaling": null, "rope_theta": 1000000,"#,
        r#""rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "rope_theta": 1000000.0},"#,
    );
    let c = parse(&s);
    assert_eq!(c.rope.theta, 1e6);
    assert_eq!(
        c.rope.scaling,
        RopeScaling::Yarn {
            factor: 4.0,
            original_max_position_embeddings: 32768,
            attention_factor: None,
            beta_fast: 32.0,
            beta_slow: 1.0,
            mscale: None,
            mscale_all_dim: None,
            truncate: true
        }
    );
    // factor null: max_position_embeddings / original_max_position_embeddings.
    let s2 = s.replace(r#""factor": 4.0"#, r#""factor": null"#).replace("32768", "10240");
    match parse(&s2).rope.scaling {
        RopeScaling::Yarn { factor, original_max_position_embeddings, .. } => {
            assert_eq!((factor, original_max_position_embeddings), (4.0, 10240))
        }
        other => panic!("{other:?}"),
    }
}

const LLAMA32_V4: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256
}"#;

#[test]
fn llama3_rope_both_styles() {
    let v5 = LLAMA32_V4.replace(
        r#""rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0,"#,
        r#""rope_parameters": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192, "rope_theta": 500000.0, "rope_type": "llama3"},"#,
    );
    assert!(v5.contains("rope_parameters"));
    for s in [LLAMA32_V4, &v5] {
        let c = parse(s);
        assert_eq!(
            c.rope,
            RopeParams {
                theta: 500000.0,
                scaling: RopeScaling::Llama3 {
                    factor: 32.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_max_position_embeddings: 8192
                },
                partial_rotary_factor: 1.0,
                query_temperature: None
            }
        );
        assert_eq!(c.eos_token_ids, [128001]);
    }
    // Old key "type" instead of "rope_type"; original_max_position_embeddings missing falls
    // back to max_position_embeddings (standardize_rope_params).
    let old = LLAMA32_V4.replace(r#""rope_type": "llama3""#, r#""type": "llama3""#).replace(
        r#"
    "original_max_position_embeddings": 8192,"#,
        "",
    );
    match parse(&old).rope.scaling {
        RopeScaling::Llama3 { original_max_position_embeddings, .. } => {
            assert_eq!(original_max_position_embeddings, 131072)
        }
        other => panic!("{other:?}"),
    }
    let lin = LLAMA32_V4.replace(
        r#"{"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192, "rope_type": "llama3"}"#,
        r#"{"type": "linear", "factor": 2.0}"#,
    );
    assert_eq!(parse(&lin).rope.scaling, RopeScaling::Linear { factor: 2.0 });
    let dynamic = lin.replace("linear", "dynamic");
    assert_eq!(parse(&dynamic).rope.scaling, RopeScaling::Dynamic { factor: 2.0 });
    let longrope = lin.replace("linear", "longrope");
    assert_eq!(parse(&longrope).rope.scaling, RopeScaling::Other { rope_type: "longrope".into() });
}

fn gemma_layer_types(n: usize, every: usize) -> Vec<String> {
    // Gemma3TextConfig.__post_init__: "sliding_attention" if (i + 1) % pattern else "full_attention".
    (0..n).map(|i| if (i + 1) % every == 0 { "full_attention" } else { "sliding_attention" }.to_string()).collect()
}

fn json_list(v: &[String]) -> String {
    format!("[{}]", v.iter().map(|s| format!("\"{s}\"")).collect::<Vec<_>>().join(", "))
}

fn gemma270m_v4() -> String {
    format!(
        r#"{{
  "_sliding_window_pattern": 6, "architectures": ["Gemma3ForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "attn_logit_softcapping": null, "bos_token_id": 2, "eos_token_id": 1,
  "final_logit_softcapping": null, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 640, "initializer_range": 0.02, "intermediate_size": 2048,
  "layer_types": {}, "max_position_embeddings": 32768, "model_type": "gemma3_text",
  "num_attention_heads": 4, "num_hidden_layers": 18, "num_key_value_heads": 1, "pad_token_id": 0,
  "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0,
  "rope_scaling": null, "rope_theta": 1000000.0, "sliding_window": 512, "torch_dtype": "bfloat16",
  "transformers_version": "4.55.0.dev0", "use_bidirectional_attention": false, "use_cache": true,
  "vocab_size": 262144
}}"#,
        json_list(&gemma_layer_types(18, 6))
    )
}

fn gemma270m_v5() -> String {
    format!(
        r#"{{
  "architectures": ["Gemma3ForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "attn_logit_softcapping": null, "bos_token_id": 2, "dtype": "bfloat16",
  "eos_token_id": 1, "final_logit_softcapping": null, "head_dim": 256,
  "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 640, "initializer_range": 0.02,
  "intermediate_size": 2048, "layer_types": {}, "max_position_embeddings": 32768,
  "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 18,
  "num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
  "rope_parameters": {{
    "full_attention": {{"rope_theta": 1000000.0, "rope_type": "default"}},
    "sliding_attention": {{"rope_theta": 10000.0, "rope_type": "default"}}
  }},
  "sliding_window": 512, "tie_word_embeddings": true, "transformers_version": "5.24.0",
  "use_bidirectional_attention": false, "use_cache": true, "vocab_size": 262144
}}"#,
        json_list(&gemma_layer_types(18, 6))
    )
}

#[test]
fn gemma3_270m_both_styles() {
    for (style, s) in [("v4", gemma270m_v4()), ("v5", gemma270m_v5())] {
        let c = parse(&s);
        assert_eq!(c.model_type, "gemma3_text", "{style}");
        assert_eq!(
            (c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads),
            (640, 2048, 18, 4, 1)
        );
        assert_eq!(c.head_dim(), 256);
        assert_eq!(c.vocab_size, 262144);
        // Gemma3TextConfig defaults tie_word_embeddings to True (absent from the v4 file).
        assert!(c.tie_word_embeddings, "{style}");
        assert_eq!(c.hidden_act, "gelu_pytorch_tanh");
        assert_eq!(c.sliding_window, Some(512));
        assert_eq!(c.query_pre_attn_scalar, Some(256.0));
        assert_eq!((c.attn_logit_softcapping, c.final_logit_softcapping), (None, None));
        assert_eq!((c.bos_token_id, c.eos_token_ids.clone(), c.pad_token_id), (Some(2), vec![1], Some(0)));
        assert_eq!(c.rope, default_rope(1e6), "{style}");
        assert_eq!(c.rope_local, Some(default_rope(1e4)), "{style}");
        assert_eq!(c.layer_types, gemma_layer_types(18, 6));
        // Layers 5, 11, 17 are global.
        assert_eq!(c.rope_for_layer(5).theta, 1e6);
        assert_eq!(c.rope_for_layer(4).theta, 1e4);
        assert_eq!(c.rope_for_layer(17).theta, 1e6);
    }
}

#[test]
fn gemma3_without_layer_types_uses_the_pattern_rule() {
    // Older gemma3 configs: no layer_types, sliding_window_pattern (or none: default 6).
    let base = gemma270m_v4();
    let start = base.find(r#""layer_types""#).unwrap();
    let end = base[start..].find("],").unwrap() + start + 2;
    let no_lt = format!("{}{}", &base[..start], &base[end..]);
    let c = parse(&no_lt);
    assert_eq!(c.layer_types, gemma_layer_types(18, 6));
    let p4 = no_lt.replace(r#""_sliding_window_pattern": 6"#, r#""sliding_window_pattern": 4"#);
    assert_eq!(parse(&p4).layer_types, gemma_layer_types(18, 4));
    let none = no_lt.replace(r#""_sliding_window_pattern": 6,"#, "");
    assert_eq!(parse(&none).layer_types, gemma_layer_types(18, 6));
    let local = no_lt.replace(r#""rope_local_base_freq": 10000.0,"#, r#""rope_local_base_freq": 20000.0,"#);
    assert_eq!(parse(&local).rope_local.unwrap().theta, 20000.0);
    // rope_local_base_freq / rope_theta absent: Gemma3TextConfig.default_theta (1e6 global, 1e4 local).
    let bare = local.replace(r#""rope_local_base_freq": 20000.0,"#, "").replace(r#""rope_theta": 1000000.0,"#, "");
    let c = parse(&bare);
    assert_eq!((c.rope.theta, c.rope_local.unwrap().theta), (1e6, 1e4));
}

const GEMMA3_4B_IT_V4: &str = r#"{
  "architectures": ["Gemma3ForConditionalGeneration"],
  "boi_token_index": 255999, "eoi_token_index": 256000, "eos_token_id": [1, 106],
  "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
  "model_type": "gemma3",
  "text_config": {
    "hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
    "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    "sliding_window": 1024
  },
  "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
  "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
    "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
    "patch_size": 14, "vision_use_head": false}
}"#;

#[test]
fn gemma3_multimodal_uses_text_config_and_class_defaults() {
    let c = parse(GEMMA3_4B_IT_V4);
    assert_eq!(c.architectures, ["Gemma3ForConditionalGeneration"]);
    assert_eq!(c.model_type, "gemma3_text");
    assert_eq!(c.outer_model_type.as_deref(), Some("gemma3"));
    assert_eq!((c.hidden_size, c.intermediate_size, c.num_hidden_layers), (2560, 10240, 34));
    // Omitted from text_config: Gemma3TextConfig's defaults (heads 8, kv 4, head_dim 256,
    // vocab 262208, eps 1e-6, query_pre_attn_scalar 256, gelu_pytorch_tanh, tied).
    assert_eq!((c.num_attention_heads, c.num_key_value_heads, c.head_dim()), (8, 4, 256));
    assert_eq!(c.vocab_size, 262_208);
    assert_eq!(c.max_position_embeddings, 131_072);
    assert_eq!(c.rms_norm_eps, 1e-6);
    assert_eq!(c.query_pre_attn_scalar, Some(256.0));
    assert_eq!(c.hidden_act, "gelu_pytorch_tanh");
    assert!(c.tie_word_embeddings);
    assert_eq!(c.sliding_window, Some(1024));
    // eos from the top level (a list), bos from the class default.
    assert_eq!(c.eos_token_ids, [1, 106]);
    assert_eq!(c.bos_token_id, Some(2));
    assert_eq!(c.dtype.as_deref(), Some("bfloat16"));
    // Gemma3TextConfig.convert_rope_params_to_dict: rope_scaling -> full-attention layers only.
    assert_eq!(
        c.rope,
        RopeParams {
            theta: 1e6,
            scaling: RopeScaling::Linear { factor: 8.0 },
            partial_rotary_factor: 1.0,
            query_temperature: None
        }
    );
    assert_eq!(c.rope_local, Some(default_rope(1e4)));
    assert_eq!(c.layer_types, gemma_layer_types(34, 6));
    assert_eq!(c.text_raw()["hidden_size"], 2560);

    // transformers 5 nests rope_parameters by layer type inside text_config.
    let v5 = GEMMA3_4B_IT_V4.replace(
        r#""rope_scaling": {"factor": 8.0, "rope_type": "linear"}"#,
        r#""rope_parameters": {"full_attention": {"factor": 8.0, "rope_type": "linear", "rope_theta": 1000000.0},
           "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}"#,
    );
    let c5 = parse(&v5);
    assert_eq!(c5.rope, c.rope);
    assert_eq!(c5.rope_local, c.rope_local);
}

/// Shaped like a released Qwen3.5 config.json (Qwen3_5ForConditionalGeneration: the text model
/// under text_config, a vision_config beside it, tie_word_embeddings on top); sizes illustrative.
const QWEN3_5_RELEASED: &str = r#"{
  "architectures": ["Qwen3_5ForConditionalGeneration"],
  "image_token_id": 248056, "model_type": "qwen3_5",
  "text_config": {
    "attention_bias": false, "dtype": "bfloat16", "eos_token_id": 248044, "full_attention_interval": 4,
    "head_dim": 256, "hidden_act": "silu", "hidden_size": 1024, "intermediate_size": 3584,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 16, "linear_value_head_dim": 128, "max_position_embeddings": 262144,
    "model_type": "qwen3_5_text", "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": false,
    "num_attention_heads": 8, "num_hidden_layers": 8, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_parameters": {"mrope_interleaved": true, "mrope_section": [11, 11, 10], "rope_type": "default",
      "rope_theta": 10000000, "partial_rotary_factor": 0.25},
    "vocab_size": 248320
  },
  "tie_word_embeddings": true, "transformers_version": "4.57.0.dev0", "video_token_id": 248057,
  "vision_config": {"deepstack_visual_indexes": [], "depth": 12, "hidden_act": "gelu_pytorch_tanh",
    "hidden_size": 768, "in_channels": 3, "intermediate_size": 3072, "model_type": "qwen3_5",
    "num_heads": 12, "num_position_embeddings": 2304, "out_hidden_size": 1024, "patch_size": 16,
    "spatial_merge_size": 2, "temporal_patch_size": 2},
  "vision_end_token_id": 248054, "vision_start_token_id": 248053
}"#;

#[test]
fn qwen3_5_released_uses_text_config() {
    let c = parse(QWEN3_5_RELEASED);
    assert_eq!(c.architectures, ["Qwen3_5ForConditionalGeneration"]);
    assert_eq!((c.model_type.as_str(), c.outer_model_type.as_deref()), ("qwen3_5_text", Some("qwen3_5")));
    // The text model's geometry, not the vision tower's (hidden_size 768, depth 12, 12 heads).
    assert_eq!((c.hidden_size, c.intermediate_size, c.num_hidden_layers), (1024, 3584, 8));
    assert_eq!((c.num_attention_heads, c.num_key_value_heads, c.head_dim()), (8, 2, 256));
    assert_eq!(c.vocab_size, 248_320);
    assert!(c.tie_word_embeddings, "top-level tie_word_embeddings");
    assert_eq!(c.eos_token_ids, [248_044]);
    assert_eq!(c.mtp_layers, 1);
    assert_eq!(
        c.rope,
        RopeParams { theta: 1e7, scaling: RopeScaling::None, partial_rotary_factor: 0.25, query_temperature: None }
    );
    // full_attention_interval 4: every fourth layer is full attention.
    let mut want = all(8, "linear_attention");
    want[3] = "full_attention".into();
    want[7] = "full_attention".into();
    assert_eq!(c.layer_types, want);
    assert_eq!(c.text_raw()["linear_num_key_heads"], 16);

    // A text_config without model_type is Qwen3_5Config's text class.
    let c = parse(&QWEN3_5_RELEASED.replace(r#""model_type": "qwen3_5_text","#, ""));
    assert_eq!(c.model_type, "qwen3_5_text");
    // Flat configs without the key expect no MTP layers.
    assert_eq!(parse(&QWEN3_5_RELEASED.replace(r#""mtp_num_hidden_layers": 1,"#, "")).mtp_layers, 0);
    let e = parse_err(&QWEN3_5_RELEASED.replace(r#""mtp_num_hidden_layers": 1"#, r#""mtp_num_hidden_layers": "one""#));
    assert!(e.contains("text_config.mtp_num_hidden_layers"), "{e}");
}

#[test]
fn hybrid_layer_type_spellings() {
    // Qwen3-Next style: full_attention_interval, partial_rotary_factor at the top level.
    let qn = r#"{"model_type": "qwen3_next", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
      "vocab_size": 100, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
      "full_attention_interval": 4, "partial_rotary_factor": 0.25, "rope_theta": 10000000}"#;
    let c = parse(qn);
    let want: Vec<String> =
        (0..8).map(|i| if (i + 1) % 4 == 0 { "full_attention" } else { "linear_attention" }.to_string()).collect();
    assert_eq!(c.layer_types, want);
    assert_eq!(
        c.rope,
        RopeParams { theta: 1e7, scaling: RopeScaling::None, partial_rotary_factor: 0.25, query_temperature: None }
    );
    assert!(!c.tie_word_embeddings);

    // LFM2 style: full_attn_idxs, block_ff_dim, norm_eps, tie_embedding, no hidden_act.
    let lfm = r#"{"model_type": "lfm2", "hidden_size": 64, "block_ff_dim": 192,
      "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
      "vocab_size": 100, "max_position_embeddings": 256, "norm_eps": 1e-5,
      "full_attn_idxs": [2, 5], "tie_embedding": true, "rope_theta": 1000000.0}"#;
    let c = parse(lfm);
    assert_eq!(c.layer_types, ["conv", "conv", "full_attention", "conv", "conv", "full_attention"]);
    assert_eq!((c.intermediate_size, c.rms_norm_eps), (192, 1e-5));
    assert!(c.tie_word_embeddings);
    assert_eq!(c.hidden_act, "silu");

    // Kimi Linear style: 1-based full_attn_layers / kda_layers.
    let kimi = r#"{"model_type": "kimi_linear", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 100,
      "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "hidden_act": "silu",
      "linear_attn_config": {"full_attn_layers": [4], "kda_layers": [1, 2, 3], "head_dim": 16}}"#;
    let c = parse(kimi);
    assert_eq!(c.layer_types, ["linear_attention", "linear_attention", "linear_attention", "full_attention"]);
    assert_eq!(c.num_key_value_heads, 4); // unknown model type: = heads
}

#[test]
fn missing_and_bad_fields_name_field_and_file() {
    // Unknown model type: no class defaults, the geometry is required.
    let e = parse_err(r#"{"model_type": "mystery", "num_attention_heads": 4, "num_hidden_layers": 2}"#);
    assert!(e.contains("test/config.json") && e.contains("hidden_size"), "{e}");
    let e = parse_err(
        r#"{"model_type": "mystery", "hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 2,
            "intermediate_size": 16, "vocab_size": 10, "max_position_embeddings": 16}"#,
    );
    assert!(e.contains("rms_norm_eps"), "{e}");
    let e = parse_err(r#"{"hidden_size": 8}"#);
    assert!(e.contains("model_type"), "{e}");
    let e = parse_err(&SMOLLM2_V4.replace(r#""num_attention_heads": 9"#, r#""num_attention_heads": "9""#));
    assert!(e.contains("num_attention_heads") && e.contains("test/config.json"), "{e}");
    let e = parse_err(&SMOLLM2_V4.replace(r#""hidden_size": 576"#, r#""hidden_size": -576"#));
    assert!(e.contains("hidden_size"), "{e}");
    let e = parse_err(&SMOLLM2_V4.replace(r#""num_key_value_heads": 3"#, r#""num_key_value_heads": 4"#));
    assert!(e.contains("num_key_value_heads"), "{e}");
    let e = parse_err(&SMOLLM2_V4.replace(r#""eos_token_id": 2"#, r#""eos_token_id": "2""#));
    assert!(e.contains("eos_token_id"), "{e}");
    let e = parse_err(&LLAMA32_V4.replace(r#""low_freq_factor": 1.0,"#, ""));
    assert!(e.contains("rope_scaling.low_freq_factor"), "{e}");
    let e = parse_err(&LLAMA32_V4.replace(r#""factor": 32.0"#, r#""factor": "32""#));
    assert!(e.contains("rope_scaling.factor"), "{e}");
    let e = parse_err(&SMOLLM2_V5.replace(r#""rope_theta": 100000.0"#, r#""rope_theta": 0"#));
    assert!(e.contains("rope_parameters.rope_theta"), "{e}");
    let e = parse_err(&gemma270m_v5().replace(r#""num_hidden_layers": 18"#, r#""num_hidden_layers": 17"#));
    assert!(e.contains("layer_types") && e.contains("17"), "{e}");
    let e = parse_err(&GEMMA3_4B_IT_V4.replace(r#""num_hidden_layers": 34,"#, r#""num_hidden_layers": 3.5,"#));
    assert!(e.contains("text_config.num_hidden_layers"), "{e}");
    let e = parse_err(r#"{"model_type": "llama", "text_config": 5}"#);
    assert!(e.contains("text_config"), "{e}");
    let e = parse_err(r#"{"model_type": "llama", "#);
    assert!(e.contains("test/config.json") && e.contains("invalid JSON"), "{e}");
    let e = parse_err("[1, 2]");
    assert!(e.contains("not a JSON object"), "{e}");
}

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("cortiq-hf-config-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn from_dir_reads_config_generation_and_tokenizer_files() {
    let d = temp_dir("dir");
    let e = hf_config_from_dir(&d).unwrap_err();
    assert!(matches!(e, EngineError::Format(FormatError::Io { .. })) && e.to_string().contains("config.json"), "{e}");
    assert_eq!(GenerationConfig::from_dir(&d).unwrap(), None);
    assert_eq!(TokenizerConfig::from_dir(&d).unwrap(), None);

    std::fs::write(d.join("config.json"), QWEN25_V4).unwrap();
    // Qwen2.5-Instruct's generation_config.json.
    std::fs::write(
        d.join("generation_config.json"),
        r#"{"bos_token_id": 151643, "pad_token_id": 151643, "do_sample": true,
            "eos_token_id": [151645, 151643], "repetition_penalty": 1.1, "temperature": 0.7,
            "top_p": 0.8, "top_k": 20, "transformers_version": "4.37.0"}"#,
    )
    .unwrap();
    // A tokenizer_config.json with object-style special tokens and no template; the template
    // lives in chat_template.jinja (transformers >= 4.5x layout).
    std::fs::write(
        d.join("tokenizer_config.json"),
        r#"{"add_bos_token": false, "add_prefix_space": false,
            "added_tokens_decoder": {
              "151645": {"content": "<|im_end|>", "lstrip": false, "normalized": false, "rstrip": false, "single_word": false, "special": true},
              "151643": {"content": "<|endoftext|>", "lstrip": false, "normalized": false, "rstrip": false, "single_word": false, "special": true}},
            "bos_token": null,
            "eos_token": {"__type": "AddedToken", "content": "<|im_end|>", "special": true},
            "pad_token": "<|endoftext|>", "unk_token": null, "model_max_length": 131072,
            "tokenizer_class": "Qwen2Tokenizer", "clean_up_tokenization_spaces": false}"#,
    )
    .unwrap();
    std::fs::write(d.join("chat_template.jinja"), "{% for m in messages %}{{ m.content }}{% endfor %}").unwrap();

    let c = hf_config_from_dir(&d).unwrap();
    assert_eq!(c.path, d.join("config.json"));
    assert_eq!(c.hidden_size, 896);
    let g = GenerationConfig::from_dir(&d).unwrap().unwrap();
    assert_eq!(g.eos_token_ids, [151645, 151643]);
    assert_eq!((g.bos_token_id, g.pad_token_id), (Some(151643), Some(151643)));
    assert_eq!((g.do_sample, g.temperature, g.top_p, g.top_k), (Some(true), Some(0.7), Some(0.8), Some(20)));
    assert_eq!(g.repetition_penalty, Some(1.1));
    assert_eq!((g.min_p, g.max_new_tokens), (None, None));
    let t = TokenizerConfig::from_dir(&d).unwrap().unwrap();
    assert_eq!(t.bos_token, None);
    assert_eq!(t.eos_token.as_deref(), Some("<|im_end|>"));
    assert_eq!(t.pad_token.as_deref(), Some("<|endoftext|>"));
    assert_eq!(t.add_bos_token, Some(false));
    assert_eq!(t.add_eos_token, None);
    assert_eq!(t.chat_template.as_deref(), Some("{% for m in messages %}{{ m.content }}{% endfor %}"));
    assert_eq!(t.model_max_length, Some(131072.0));
    assert_eq!(t.tokenizer_class.as_deref(), Some("Qwen2Tokenizer"));
    assert_eq!(t.added_tokens.len(), 2);
    assert_eq!(t.added_tokens[0].0, 151643);
    assert_eq!(t.added_tokens[1].1.content, "<|im_end|>");
    assert!(t.added_tokens[1].1.special);

    // Broken generation_config: error names the file and field.
    std::fs::write(d.join("generation_config.json"), r#"{"top_k": -1}"#).unwrap();
    let e = GenerationConfig::from_dir(&d).unwrap_err().to_string();
    assert!(e.contains("generation_config.json") && e.contains("top_k"), "{e}");
    std::fs::write(d.join("generation_config.json"), "{").unwrap();
    let e = GenerationConfig::from_dir(&d).unwrap_err().to_string();
    assert!(e.contains("generation_config.json") && e.contains("invalid JSON"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn tokenizer_config_template_list_and_string_tokens() {
    // SmolLM2-Instruct style: plain strings and one template string.
    let t = TokenizerConfig::from_json_str(
        "tokenizer_config.json",
        r#"{"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": "{{ x }}",
            "add_bos_token": true}"#,
    )
    .unwrap();
    assert_eq!((t.bos_token.as_deref(), t.eos_token.as_deref()), (Some("<|im_start|>"), Some("<|im_end|>")));
    assert_eq!(t.chat_template.as_deref(), Some("{{ x }}"));
    assert_eq!(t.add_bos_token, Some(true));
    // Named templates list (Hermes / Command-R style).
    let t = TokenizerConfig::from_json_str(
        "tokenizer_config.json",
        r#"{"chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"},
                              {"name": "rag", "template": "R"}]}"#,
    )
    .unwrap();
    assert_eq!(t.chat_template.as_deref(), Some("D"));
    assert_eq!(t.named_chat_templates, [("tool_use".to_string(), "T".to_string()), ("rag".into(), "R".into())]);
    for bad in [
        r#"{"chat_template": [{"name": "default"}]}"#,
        r#"{"chat_template": 3}"#,
        r#"{"bos_token": {"special": true}}"#,
        r#"{"added_tokens_decoder": {"x": {"content": "a"}}}"#,
        r#"{"add_bos_token": "yes"}"#,
    ] {
        let e = TokenizerConfig::from_json_str("tokenizer_config.json", bad).unwrap_err().to_string();
        assert!(e.contains("tokenizer_config.json"), "{bad}: {e}");
    }
}

/// Mistral: a sliding_window slides every layer (MistralAttention); null or absent-with-null
/// leaves every layer full; the class's default window (4096) applies when the key is absent.
#[test]
fn mistral_sliding_window_applies_to_every_layer() {
    let cfg = |extra: &str| {
        let s = format!(
            r#"{{"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 64, "intermediate_size": 96,
               "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256{extra}}}"#
        );
        let h = parse(&s);
        cortiq_engine::arch::for_hf(&h).unwrap().config_from_hf(&h).unwrap()
    };
    let windows = |c: &cortiq_engine::config::ModelConfig| c.layers.iter().map(|l| l.sliding_window).collect::<Vec<_>>();
    assert_eq!(windows(&cfg(r#", "sliding_window": 32"#)), vec![Some(32); 3]);
    assert_eq!(windows(&cfg(r#", "sliding_window": null"#)), vec![None; 3]);
    assert_eq!(windows(&cfg("")), vec![Some(4096); 3], "MistralConfig's default window");
}

//! config.json normalization against transformers 5.24 itself: every config in
//! fixtures/hf_configs/ (transformers-4 style, modelled on real checkpoints) and its
//! transformers-5 re-save in fixtures/hf_configs/v5/ must give the values transformers
//! computed when it loaded them (fixtures/hf_configs/expected.json, written by
//! tools/hf_config_reference.py).

use std::path::PathBuf;

use cortiq_formats::hf::{HfConfig, RopeParams, RopeScaling};
use serde_json::Value;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf_configs")
}

fn f(v: &Value, k: &str) -> Option<f64> {
    v.get(k).and_then(Value::as_f64)
}

/// A transformers `rope_parameters` entry as RopeParams (defaults as in modeling_rope_utils).
fn rope_from(v: &Value) -> RopeParams {
    let ty = v.get("rope_type").and_then(Value::as_str).unwrap_or("default");
    let factor = || f(v, "factor").expect("factor");
    let orig = || v["original_max_position_embeddings"].as_u64().expect("original_max_position_embeddings") as usize;
    let scaling = match ty {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: factor() },
        "dynamic" => RopeScaling::Dynamic { factor: factor() },
        "llama3" => RopeScaling::Llama3 {
            factor: factor(),
            low_freq_factor: f(v, "low_freq_factor").unwrap(),
            high_freq_factor: f(v, "high_freq_factor").unwrap(),
            original_max_position_embeddings: orig(),
        },
        "yarn" => RopeScaling::Yarn {
            factor: factor(),
            original_max_position_embeddings: orig(),
            attention_factor: f(v, "attention_factor"),
            beta_fast: f(v, "beta_fast").unwrap_or(32.0),
            beta_slow: f(v, "beta_slow").unwrap_or(1.0),
            mscale: f(v, "mscale"),
            mscale_all_dim: f(v, "mscale_all_dim"),
            truncate: v.get("truncate").and_then(Value::as_bool).unwrap_or(true),
        },
        other => RopeScaling::Other { rope_type: other.to_string() },
    };
    RopeParams {
        theta: f(v, "rope_theta").expect("rope_theta"),
        scaling,
        partial_rotary_factor: f(v, "partial_rotary_factor").unwrap_or(1.0),
        query_temperature: f(v, "llama_4_scaling_beta")
            .filter(|&b| b != 0.0)
            .map(|b| (b, f(v, "original_max_position_embeddings").expect("original_max_position_embeddings") as usize)),
    }
}

fn opt_u32(v: &Value) -> Option<u32> {
    v.as_u64().map(|x| x as u32)
}

fn check(name: &str, file: &str, c: &HfConfig, e: &Value, bad: &mut Vec<String>) {
    let mut eq = |what: &str, ours: String, theirs: String| {
        if ours != theirs {
            bad.push(format!("{name} ({file}) {what}: ours {ours}, transformers {theirs}"));
        }
    };
    let u = |k: &str| e[k].as_u64().unwrap_or_else(|| panic!("{name}: {k}")) as usize;
    eq("model_type", c.model_type.clone(), e["model_type"].as_str().unwrap().into());
    eq("outer_model_type", format!("{:?}", c.outer_model_type), format!("{:?}", e["outer_model_type"].as_str()));
    eq("hidden_size", c.hidden_size.to_string(), u("hidden_size").to_string());
    eq("intermediate_size", c.intermediate_size.to_string(), u("intermediate_size").to_string());
    eq("num_hidden_layers", c.num_hidden_layers.to_string(), u("num_hidden_layers").to_string());
    eq("num_attention_heads", c.num_attention_heads.to_string(), u("num_attention_heads").to_string());
    eq("num_key_value_heads", c.num_key_value_heads.to_string(), u("num_key_value_heads").to_string());
    eq("head_dim", c.head_dim().to_string(), u("head_dim").to_string());
    eq("vocab_size", c.vocab_size.to_string(), u("vocab_size").to_string());
    eq("max_position_embeddings", c.max_position_embeddings.to_string(), u("max_position_embeddings").to_string());
    eq("rms_norm_eps", c.rms_norm_eps.to_string(), e["rms_norm_eps"].as_f64().unwrap().to_string());
    eq("tie_word_embeddings", c.tie_word_embeddings.to_string(), e["tie_word_embeddings"].to_string());
    eq("attention_bias", c.attention_bias.to_string(), e["attention_bias"].to_string());
    if let Some(act) = e["hidden_act"].as_str() {
        eq("hidden_act", c.hidden_act.clone(), act.into());
    }
    eq("sliding_window", format!("{:?}", c.sliding_window), format!("{:?}", e["sliding_window"].as_u64().map(|x| x as usize)));
    eq("query_pre_attn_scalar", format!("{:?}", c.query_pre_attn_scalar), format!("{:?}", e["query_pre_attn_scalar"].as_f64()));
    eq(
        "attn_logit_softcapping",
        format!("{:?}", c.attn_logit_softcapping),
        format!("{:?}", e["attn_logit_softcapping"].as_f64()),
    );
    eq(
        "final_logit_softcapping",
        format!("{:?}", c.final_logit_softcapping),
        format!("{:?}", e["final_logit_softcapping"].as_f64()),
    );
    eq("bos_token_id", format!("{:?}", c.bos_token_id), format!("{:?}", opt_u32(&e["bos_token_id"])));
    eq("pad_token_id", format!("{:?}", c.pad_token_id), format!("{:?}", opt_u32(&e["pad_token_id"])));
    // Nested configs: the top-level list (what the checkpoint's authors stop on) wins.
    let eos_key =
        if e["eos_token_ids_top"].as_array().is_some_and(|a| !a.is_empty()) { "eos_token_ids_top" } else { "eos_token_ids_text" };
    let eos: Vec<u32> = e[eos_key].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    eq("eos_token_ids", format!("{:?}", c.eos_token_ids), format!("{eos:?}"));
    eq("dtype", format!("{:?}", c.dtype), format!("{:?}", e["dtype"].as_str()));
    let lt: Vec<String> = match e["layer_types"].as_array() {
        Some(a) => a.iter().map(|x| x.as_str().unwrap().to_string()).collect(),
        None => vec!["full_attention".to_string(); c.num_hidden_layers],
    };
    eq("layer_types", format!("{:?}", c.layer_types), format!("{lt:?}"));
    let rp = &e["rope_parameters"];
    let (rope, local) = if rp.get("full_attention").is_some() {
        (rope_from(&rp["full_attention"]), rp.get("sliding_attention").map(rope_from))
    } else {
        (rope_from(rp), None)
    };
    eq("rope", format!("{:?}", c.rope), format!("{rope:?}"));
    eq("rope_local", format!("{:?}", c.rope_local), format!("{local:?}"));
}

#[test]
fn configs_match_transformers_5() {
    let expected: Value = serde_json::from_str(&std::fs::read_to_string(dir().join("expected.json")).unwrap()).unwrap();
    let expected = expected.as_object().unwrap();
    assert!(expected.len() >= 12, "only {} configs in expected.json", expected.len());
    let mut bad = Vec::new();
    let mut n = 0;
    for (name, e) in expected {
        for file in [format!("{name}.json"), format!("v5/{name}.json")] {
            let c = load(&dir().join(&file)).unwrap_or_else(|err| panic!("{file}: {err}"));
            check(name, &file, &c, e, &mut bad);
            n += 1;
        }
    }
    println!("{n} config files compared with transformers 5.24, {} mismatches", bad.len());
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

fn load(p: &std::path::Path) -> cortiq_engine::Result<HfConfig> {
    cortiq_engine::arch::hf_config_from_str(p, &std::fs::read_to_string(p).unwrap())
}

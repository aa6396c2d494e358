//! Bad hybrid checkpoints are rejected with one line naming the tensor or field (issue 4,
//! acceptance 4): the committed fixtures copied to a temporary folder with one thing broken.

use std::path::{Path, PathBuf};

use cortiq_engine::load::load;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// A copy of fixture `name` (config.json, model.safetensors, tokenizer) whose config.json is
/// edited by `edit`; returns the load error's text.
fn load_error(name: &str, edit: impl Fn(&mut serde_json::Value)) -> String {
    let dir =
        std::env::temp_dir().join(format!("cortiq-hybrid-bad-{name}-{}-{:?}", std::process::id(), std::thread::current().id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        let src = fixture(name).join(f);
        if src.exists() {
            std::fs::copy(&src, dir.join(f)).unwrap();
        }
    }
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(name).join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    let r = load(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    match r {
        Ok(_) => panic!("{name}: the broken checkpoint loaded"),
        Err(e) => {
            let s = e.to_string();
            assert!(!s.contains('\n'), "{name}: error is not one line: {s}");
            s
        }
    }
}

#[test]
fn unknown_layer_type_is_named() {
    let e = load_error("qwen3_5", |c| c["layer_types"][1] = "mamba".into());
    assert!(e.contains("layer_types[1]") && e.contains("mamba"), "{e}");
    let e = load_error("lfm2", |c| c["layer_types"][0] = "linear_attention".into());
    assert!(e.contains("layer_types[0]"), "{e}");
}

#[test]
fn wrong_head_counts_are_named() {
    let e = load_error("qwen3_5", |c| c["linear_num_value_heads"] = 3.into());
    assert!(e.contains("value heads") && e.contains('3'), "{e}");
    // More heads than the tensors hold: the first tensor whose shape disagrees is named.
    let e = load_error("qwen3_5", |c| c["linear_num_key_heads"] = 4.into());
    assert!(e.contains("blk.0.") && e.contains("shape"), "{e}");
}

#[test]
fn missing_tensor_is_named() {
    // One layer more than the checkpoint holds.
    let e = load_error("qwen3_5_moe", |c| {
        c["num_hidden_layers"] = 5.into();
        c["layer_types"].as_array_mut().unwrap().push("linear_attention".into());
    });
    assert!(e.contains("blk.4.") && e.contains("missing"), "{e}");
}

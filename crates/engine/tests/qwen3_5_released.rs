//! Qwen3.5 as shipped (issue 13, point 6): the released `Qwen3_5ForConditionalGeneration`
//! folder — the text config under `text_config` beside a `vision_config`, the text model's
//! tensors under `model.language_model.*`, the vision tower's `model.visual.*` beside them, the
//! MTP block under `mtp.*`, two shards and an index — built here from the committed flat
//! fixture (`Qwen3_5ForCausalLM`, transformers' text-only class) by rewriting config.json and the
//! tensor names, no torch needed. The same text model must give bit-identical logits; an absent
//! or partial MTP block (how transformers saves fine-tunes) loads with a warning and no MTP.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use common::{assert_bits_equal, fixture, ids};
use cortiq_engine::Model;
use cortiq_engine::convert::{ConvertOptions, QuantSpec, convert};
use cortiq_engine::load::{Loaded, load};
use serde_json::{Value, json};

/// One safetensors entry: (name, dtype, shape, bytes).
#[derive(Clone)]
struct Tensor {
    name: String,
    dtype: String,
    shape: Vec<usize>,
    data: Vec<u8>,
}

/// Every tensor of a single safetensors file, in header order.
fn read_safetensors(path: &Path) -> Vec<Tensor> {
    let b = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, Value> = serde_json::from_slice(&b[8..8 + n]).unwrap();
    let data = &b[8 + n..];
    header
        .into_iter()
        .filter(|(k, _)| k != "__metadata__")
        .map(|(name, v)| {
            let off: Vec<usize> = v["data_offsets"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
            Tensor {
                name,
                dtype: v["dtype"].as_str().unwrap().to_string(),
                shape: v["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect(),
                data: data[off[0]..off[1]].to_vec(),
            }
        })
        .collect()
}

/// A safetensors file as transformers writes one: 8-byte header length, JSON header padded with
/// spaces to 8 bytes, the tensors back to back in the order given.
fn write_safetensors(path: &Path, tensors: &[&Tensor]) {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut at = 0;
    for t in tensors {
        header.insert(t.name.clone(), json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [at, at + t.data.len()]}));
        at += t.data.len();
    }
    let mut h = serde_json::to_vec(&Value::Object(header)).unwrap();
    h.resize(h.len().div_ceil(8) * 8, b' ');
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    tensors.iter().for_each(|t| out.extend(&t.data));
    std::fs::write(path, out).unwrap();
}

/// A small vision tower in Qwen3.5's names: bf16 values that no text tensor shares. The 5-D
/// patch embedding would fail the text loader's shape check if it were ever mapped.
fn visual_tensors() -> Vec<Tensor> {
    let shapes: &[(&str, &[usize])] = &[
        ("model.visual.patch_embed.proj.weight", &[16, 3, 2, 2, 2]),
        ("model.visual.patch_embed.proj.bias", &[16]),
        ("model.visual.pos_embed.weight", &[16, 16]),
        ("model.visual.blocks.0.norm1.weight", &[16]),
        ("model.visual.blocks.0.norm1.bias", &[16]),
        ("model.visual.blocks.0.attn.qkv.weight", &[48, 16]),
        ("model.visual.blocks.0.attn.proj.weight", &[16, 16]),
        ("model.visual.blocks.0.norm2.weight", &[16]),
        ("model.visual.blocks.0.mlp.linear_fc1.weight", &[32, 16]),
        ("model.visual.blocks.0.mlp.linear_fc2.weight", &[16, 32]),
        ("model.visual.merger.norm.weight", &[16]),
        ("model.visual.merger.linear_fc1.weight", &[64, 64]),
        ("model.visual.merger.linear_fc2.weight", &[64, 64]),
    ];
    shapes
        .iter()
        .map(|&(name, shape)| {
            let n: usize = shape.iter().product();
            let data = (0..n).flat_map(|i| (((0.5 + i as f32 * 1e-3).to_bits() >> 16) as u16).to_le_bytes()).collect();
            Tensor { name: name.into(), dtype: "BF16".into(), shape: shape.to_vec(), data }
        })
        .collect()
}

/// A flat fixture and the released class of its model.
struct Flat {
    fixture: &'static str,
    architecture: &'static str,
    /// The composite config's model_type (the text one, `<this>_text`, stays in text_config).
    model_type: &'static str,
}

const DENSE: Flat = Flat { fixture: "qwen3_5", architecture: "Qwen3_5ForConditionalGeneration", model_type: "qwen3_5" };
const MOE: Flat = Flat { fixture: "qwen3_5_moe", architecture: "Qwen3_5MoeForConditionalGeneration", model_type: "qwen3_5_moe" };

/// The flat fixture's config.json nested as the released class's: the text keys under
/// `text_config` (model_type `qwen3_5[_moe]_text`), the multimodal ones on top.
fn released_config(f: &Flat, flat: &Value) -> Value {
    let mut text = flat.as_object().unwrap().clone();
    for k in ["architectures", "tie_word_embeddings", "transformers_version"] {
        text.remove(k);
    }
    json!({
        "architectures": [f.architecture],
        "model_type": f.model_type,
        "image_token_id": 248056,
        "video_token_id": 248057,
        "vision_start_token_id": 248053,
        "vision_end_token_id": 248054,
        "tie_word_embeddings": flat["tie_word_embeddings"],
        "transformers_version": flat["transformers_version"],
        "text_config": Value::Object(text),
        // The vision tower's geometry uses the same key names as the text model's: it must
        // not be read.
        "vision_config": {
            "model_type": f.model_type,
            "depth": 1,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_heads": 2,
            "in_channels": 3,
            "patch_size": 2,
            "temporal_patch_size": 2,
            "spatial_merge_size": 2,
            "out_hidden_size": 64,
            "num_position_embeddings": 16,
            "hidden_act": "gelu_pytorch_tanh",
            "deepstack_visual_indexes": []
        }
    })
}

/// The released layout of the dense fixture (see `released_from`).
fn released(tag: &str, edit: impl FnOnce(&mut Vec<Tensor>, &mut Value)) -> PathBuf {
    released_from(&DENSE, tag, edit)
}

/// A scratch folder holding the released layout of flat fixture `f`, after `edit` has changed
/// the tensor list (HF released names) and the nested config.json.
fn released_from(f: &Flat, tag: &str, edit: impl FnOnce(&mut Vec<Tensor>, &mut Value)) -> PathBuf {
    let src = fixture(f.fixture);
    let dir = std::env::temp_dir().join(format!("cortiq-{}-released-{}-{tag}", f.fixture, std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let mut tensors: Vec<Tensor> = read_safetensors(&src.join("model.safetensors"))
        .into_iter()
        .map(|mut t| {
            if let Some(rest) = t.name.strip_prefix("model.") {
                t.name = format!("model.language_model.{rest}");
            }
            t
        })
        .collect();
    tensors.extend(visual_tensors());
    let flat: Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let mut cfg = released_config(f, &flat);
    edit(&mut tensors, &mut cfg);
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&cfg).unwrap()).unwrap();

    // Shard 1 the language model, shard 2 the vision tower and MTP block, as in the release.
    let (a, b): (Vec<&Tensor>, Vec<&Tensor>) =
        tensors.iter().partition(|t| !t.name.starts_with("model.visual.") && !t.name.starts_with("mtp."));
    let files = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"];
    let mut weight_map = serde_json::Map::new();
    for (file, part) in files.iter().zip([&a, &b]) {
        write_safetensors(&dir.join(file), part);
        for t in part {
            weight_map.insert(t.name.clone(), json!(file));
        }
    }
    let total: usize = tensors.iter().map(|t| t.data.len()).sum();
    let index = json!({"metadata": {"total_size": total}, "weight_map": Value::Object(weight_map)});
    std::fs::write(dir.join("model.safetensors.index.json"), serde_json::to_string_pretty(&index).unwrap()).unwrap();
    dir
}

/// Collects the messages (and fields) of WARN events emitted on this thread while installed.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

struct Fields<'a>(&'a mut String);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={value:?} ", field.name()));
    }
}

impl tracing::Subscriber for Warnings {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, e: &tracing::Event<'_>) {
        if *e.metadata().level() == tracing::Level::WARN {
            let mut s = String::new();
            e.record(&mut Fields(&mut s));
            self.0.lock().unwrap().push(s);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Loads `dir` (panicking with the error), returning the warnings logged meanwhile.
fn load_warned(dir: &Path) -> (Loaded, Vec<String>) {
    let w = Warnings::default();
    let loaded = tracing::subscriber::with_default(w.clone(), || load(dir))
        .unwrap_or_else(|e| panic!("loading {} failed: {e}", dir.display()));
    let warnings = w.0.lock().unwrap().clone();
    for s in &warnings {
        println!("  warning: {s}");
    }
    (loaded, warnings)
}

/// Logits of the dense fixture's tokens in one forward, then of 8 cached greedy decode steps.
fn run(m: &Model) -> Vec<f32> {
    run_on(&DENSE, m)
}

/// `run` with fixture `f`'s tokens.
fn run_on(f: &Flat, m: &Model) -> Vec<f32> {
    common::logits_then_greedy(m, &ids(&fixture(f.fixture).join("tokens.json")))
}

/// The flat fixture's model and its logits, the reference for every layout here.
fn flat() -> (Model, Vec<f32>) {
    let m = load(&fixture("qwen3_5")).expect("flat qwen3_5 fixture").model;
    let logits = run(&m);
    (m, logits)
}

#[test]
fn released_layout_matches_the_flat_fixture() {
    let (want, want_logits) = flat();
    let dir = released("whole", |_, _| {});
    let (loaded, warnings) = load_warned(&dir);
    let m = &loaded.model;
    assert_eq!(m.cfg.arch, "qwen35");
    assert_eq!(format!("{:?}", m.cfg), format!("{:?}", want.cfg), "the nested config gives the flat one's model");
    assert_bits_equal("released layout vs flat", &run(m), &want_logits);
    assert!(warnings.is_empty(), "a whole checkpoint warns: {warnings:?}");
    // The MTP block is loaded, with the flat fixture's values.
    assert_eq!(m.mtp.len(), 1, "MTP blocks from the released layout");
    assert_eq!(want.mtp.len(), 1, "MTP blocks from the flat fixture");
    let (a, b) = (&m.mtp[0], &want.mtp[0]);
    assert_eq!(a.eh_proj.to_f32(), b.eh_proj.to_f32(), "mtp eh_proj");
    assert_eq!((&a.enorm, &a.hnorm, &a.shared_head_norm), (&b.enorm, &b.hnorm, &b.shared_head_norm), "mtp norms");
    let (ma, mb) = (a.layer.matrices(), b.layer.matrices());
    assert_eq!(ma.len(), mb.len(), "mtp layer matrices");
    for (x, y) in ma.iter().zip(&mb) {
        assert_eq!(x.to_f32(), y.to_f32(), "mtp {}", y.name);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Qwen3.5-MoE as shipped: the same, with routed experts in the MTP layer, whose absence (one
/// expert tensor of the MTP layer) disables MTP like any other missing tensor.
#[test]
fn released_moe_layout_matches_and_checks_the_experts() {
    let want = load(&fixture(MOE.fixture)).expect("flat qwen3_5_moe fixture").model;
    let want_logits = run_on(&MOE, &want);
    let dir = released_from(&MOE, "whole", |_, _| {});
    let (loaded, warnings) = load_warned(&dir);
    assert_eq!(loaded.model.cfg.arch, "qwen35moe");
    assert_bits_equal("moe released layout vs flat", &run_on(&MOE, &loaded.model), &want_logits);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!((loaded.model.mtp.len(), want.mtp.len()), (1, 1), "MTP blocks (released, flat)");
    let _ = std::fs::remove_dir_all(&dir);

    let gone = "mtp.layers.0.mlp.experts.1.down_proj.weight";
    let dir = released_from(&MOE, "no-expert", |t, _| t.retain(|t| t.name != gone));
    let (loaded, warnings) = load_warned(&dir);
    assert!(loaded.model.mtp.is_empty(), "a partial MoE MTP block was loaded");
    assert_bits_equal("moe released layout, one MTP expert gone", &run_on(&MOE, &loaded.model), &want_logits);
    assert!(warnings.iter().any(|w| w.contains("MTP block is incomplete") && w.contains(gone)), "{warnings:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A text_config without model_type: Qwen3_5Config's text class (qwen3_5_text) is implied.
#[test]
fn released_layout_without_nested_model_type() {
    let (_, want_logits) = flat();
    let dir = released("no-type", |_, c| {
        c["text_config"].as_object_mut().unwrap().remove("model_type");
    });
    let (loaded, _) = load_warned(&dir);
    assert_eq!(loaded.model.cfg.arch, "qwen35");
    assert_bits_equal("released layout, implied text model_type", &run(&loaded.model), &want_logits);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn absent_mtp_loads_without_mtp_and_warns() {
    let (_, want_logits) = flat();
    let dir = released("no-mtp", |t, _| t.retain(|t| !t.name.starts_with("mtp.")));
    let (loaded, warnings) = load_warned(&dir);
    assert!(loaded.model.mtp.is_empty(), "no mtp.* tensors, yet MTP blocks were loaded");
    assert_bits_equal("released layout without mtp.*", &run(&loaded.model), &want_logits);
    assert!(
        warnings.iter().any(|w| w.contains("mtp_num_hidden_layers") && w.contains("no mtp.* tensors")),
        "no warning about the absent MTP block: {warnings:?}"
    );
    // Without the config key there is nothing to expect and nothing to warn about.
    let dir2 = released("no-mtp-no-key", |t, c| {
        t.retain(|t| !t.name.starts_with("mtp."));
        c["text_config"].as_object_mut().unwrap().remove("mtp_num_hidden_layers");
    });
    let (loaded, warnings) = load_warned(&dir2);
    assert!(loaded.model.mtp.is_empty() && warnings.is_empty(), "{warnings:?}");
    for d in [dir, dir2] {
        let _ = std::fs::remove_dir_all(&d);
    }
}

#[test]
fn partial_mtp_loads_without_mtp_and_names_what_is_missing() {
    let (_, want_logits) = flat();
    // A decoder-layer tensor (today's loader refuses the block: eh_proj present, k_norm absent),
    // one of the block's own tensors, and the whole layer with only fc left.
    for (tag, drop_names, named) in [
        ("k-norm", vec!["mtp.layers.0.self_attn.k_norm.weight"], vec!["mtp.layers.0.self_attn.k_norm.weight"]),
        ("fc", vec!["mtp.fc.weight"], vec!["mtp.fc.weight"]),
        ("only-fc", vec![], vec!["mtp.norm.weight", "mtp.layers.0.self_attn.q_proj.weight"]),
    ] {
        let keep_only_fc = tag == "only-fc";
        let dir = released(tag, |t, _| {
            t.retain(|t| {
                !drop_names.contains(&t.name.as_str())
                    && (!keep_only_fc || !t.name.starts_with("mtp.") || t.name == "mtp.fc.weight")
            })
        });
        let (loaded, warnings) = load_warned(&dir);
        assert!(loaded.model.mtp.is_empty(), "{tag}: a partial MTP block was loaded");
        assert_bits_equal(&format!("released layout, partial mtp ({tag})"), &run(&loaded.model), &want_logits);
        assert!(
            warnings.iter().any(|w| w.contains("MTP block is incomplete") && named.iter().all(|n| w.contains(n))),
            "{tag}: no warning naming {named:?}: {warnings:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Converting the released layout: the .cmf (which embeds the nested config.json) runs the
/// same model; the vision tower and a partial MTP block are reported dropped, not written.
#[test]
fn released_layout_converts() {
    let (_, want_logits) = flat();
    for (tag, whole) in [("cmf-whole", true), ("cmf-partial", false)] {
        let dir = released(tag, |t, _| {
            if !whole {
                t.retain(|t| t.name != "mtp.layers.0.mlp.up_proj.weight");
            }
        });
        let out = dir.join("model.cmf");
        let opts = ConvertOptions { quant: QuantSpec::Keep, embeddings: None, f32_as: None, force: false, plain_experts: false };
        let r = convert(&dir, &out, &opts, &|_, _, _| {}).unwrap_or_else(|e| panic!("{tag}: convert failed: {e}"));
        let n_visual = visual_tensors().len();
        assert_eq!(r.dropped.iter().filter(|d| d.starts_with("model.visual.")).count(), n_visual, "{tag}: {:?}", r.dropped);
        let dropped_mtp = r.dropped.iter().filter(|d| d.starts_with("mtp.")).count();
        assert_eq!(dropped_mtp > 0, !whole, "{tag}: dropped {:?}", r.dropped);
        let m = load(&out).unwrap_or_else(|e| panic!("{tag}: loading the .cmf failed: {e}")).model;
        assert_eq!(m.mtp.len(), usize::from(whole), "{tag}: MTP blocks in the .cmf");
        assert_bits_equal(&format!("released layout -> cmf ({tag})"), &run(&m), &want_logits);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A broken text_config is a one-line error naming the field, not a panic.
#[test]
fn malformed_text_config_is_named() {
    type Edit = fn(&mut Value);
    let cases: [(&str, Edit, &str); 4] = [
        ("list", |c| c["text_config"] = json!([1, 2]), "text_config"),
        (
            "no-linear-heads",
            |c| {
                c["text_config"].as_object_mut().unwrap().remove("linear_num_key_heads");
            },
            "text_config.linear_num_key_heads",
        ),
        ("bad-hidden", |c| c["text_config"]["hidden_size"] = json!("wide"), "text_config.hidden_size"),
        ("bad-layer-type", |c| c["text_config"]["layer_types"][1] = json!("mamba"), "text_config.layer_types[1]"),
    ];
    for (tag, edit, named) in cases {
        let dir = released(tag, |_, c| edit(c));
        let r = std::panic::catch_unwind(|| load(&dir).map(|_| ()));
        let _ = std::fs::remove_dir_all(&dir);
        let e = match r {
            Ok(Ok(())) => panic!("{tag}: the broken config loaded"),
            Ok(Err(e)) => e.to_string(),
            Err(_) => panic!("{tag}: loading panicked"),
        };
        println!("{tag}: {e}");
        assert!(e.contains(named) && !e.contains('\n'), "{tag}: error does not name {named} on one line: {e}");
    }
}

//! Shared parity checks for the fixture tests: whole-sequence forward, chunked prefill and
//! token-by-token decode against transformers' float64 logits (1e-4 max-abs), greedy tokens
//! identical, and on failure the first layer whose residual stream leaves trace.npy.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use cortiq_engine::load::load;
use cortiq_engine::{Logits, Model};
use cortiq_formats::npy::read_f32;

pub const TOL: f32 = 1e-4;

pub fn fixture(arch: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(arch)
}

pub fn ids(path: &Path) -> Vec<u32> {
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// (max |a - b|, flat index of it); NaN (at its first index) when either side holds a NaN, so
/// a broken output fails every `md <= tol`. The one shared measure (cortiq-testkit).
pub fn max_diff(a: &[f32], b: &[f32]) -> (f32, usize) {
    cortiq_testkit::max_abs_diff(a, b)
}

pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Per-layer residual stream vs trace.npy (only where the reference is the fixture's own, so
/// the trace applies); returns the first layer beyond `tol`, for the failure message.
pub fn first_divergence(model: &Model, tokens: &[u32], trace_path: &Path) -> Option<String> {
    let (shape, trace) = read_f32(trace_path).unwrap(); // [L+1, T, d]
    let (t, d) = (shape[1], shape[2]);
    let mut ours: Vec<Vec<f32>> = Vec::new();
    let mut st = model.new_state(tokens.len());
    model
        .forward_traced(tokens, &mut st, Logits::None, &mut |name, _il, vals| {
            if name == "embd" || name == "l_out" {
                ours.push(vals.to_vec());
            }
        })
        .unwrap();
    for (i, got) in ours.iter().enumerate() {
        let want = &trace[i * t * d..(i + 1) * t * d];
        let (md, at) = max_diff(got, want);
        let scale = cortiq_testkit::max_abs(want).max(1.0);
        println!("  trace[{i}] max diff {md:.3e} at pos {} dim {}", at / d, at % d);
        if !(md <= TOL * scale) {
            let what = if i == 0 { "embedding".to_string() } else { format!("layer {}", i - 1) };
            return Some(format!("trace[{i}] = {what} diverges: max diff {md:.3e} at pos {} dim {}", at / d, at % d));
        }
    }
    None
}

/// Parity of the model at `path` (the fixture's HF folder or its model.gguf) with a reference.
/// `prefix` names the reference files: "" for the fixture's own (logits.npy, greedy.json,
/// greedy_logits.npy), "gguf_ref_" for gemma3's llama.cpp-semantics reference.
pub fn check_parity(arch: &str, path: &Path, prefix: &str) {
    check_parity_tol(arch, path, prefix, TOL);
}

/// `check_parity` with its own tolerance: the hybrid fixtures each carry theirs, set within ~10x
/// of the max diff measured for that fixture (table in fixture_parity_hybrid.rs).
pub fn check_parity_tol(arch: &str, path: &Path, prefix: &str, tol: f32) {
    let dir = fixture(arch);
    let what = if path.is_dir() { "HF" } else { "GGUF" };
    let model = load(path).unwrap_or_else(|e| panic!("{arch}: loading {} failed: {e}", path.display())).model;
    let tokens = ids(&dir.join("tokens.json"));
    let greedy = ids(&dir.join(format!("{prefix}greedy.json")));
    let (shape, want) = read_f32(&dir.join(format!("{prefix}logits.npy"))).unwrap(); // [T, vocab]
    let vocab = shape[1];
    assert_eq!(vocab, model.cfg.vocab, "{arch}: vocab of model.gguf");
    println!("{arch} ({what}, reference {prefix}logits.npy): {} tokens, vocab {vocab}", tokens.len());

    // 1. Whole sequence in one forward.
    let mut st = model.new_state(tokens.len() + greedy.len());
    let got = model.forward(&tokens, &mut st, Logits::From(0)).unwrap();
    let (md, at) = max_diff(&got, &want);
    println!("{arch}: {what} full forward logits max diff {md:.3e} at pos {} tok {}", at / vocab, at % vocab);
    if !(md <= tol) {
        let why = if prefix.is_empty() { first_divergence(&model, &tokens, &dir.join("trace.npy")) } else { None };
        panic!(
            "{arch}: {what} logits max diff {md:.3e} at pos {} token {} (tolerance {tol}); {}",
            at / vocab,
            at % vocab,
            why.unwrap_or("trace agrees".into())
        );
    }

    // 2. Chunked prefill (uneven chunks).
    let mut st2 = model.new_state(tokens.len());
    let mut chunked = Vec::new();
    for c in tokens.chunks(7) {
        chunked.extend(model.forward(c, &mut st2, Logits::From(0)).unwrap());
    }
    let (md2, at2) = max_diff(&chunked, &want);
    println!("{arch}: {what} chunked (7) prefill logits max diff {md2:.3e}");
    assert!(md2 <= tol, "{arch}: {what} chunked prefill max diff {md2:.3e} at pos {} token {}", at2 / vocab, at2 % vocab);

    // 3. Greedy decode with the KV cache, each step's logits against the reference.
    let (gshape, gwant) = read_f32(&dir.join(format!("{prefix}greedy_logits.npy"))).unwrap(); // [N, vocab]
    assert_eq!(gshape[0], greedy.len());
    let mut last = got[(tokens.len() - 1) * vocab..].to_vec();
    let mut produced = Vec::new();
    let mut worst = (0f32, 0usize, 0usize);
    for k in 0..greedy.len() {
        let (md, at) = max_diff(&last, &gwant[k * vocab..(k + 1) * vocab]);
        if md > worst.0 || md.is_nan() {
            worst = (md, k, at);
        }
        let next = argmax(&last);
        produced.push(next);
        last = model.forward(&[next], &mut st, Logits::Last).unwrap();
    }
    println!(
        "{arch}: {what} decode-step logits max diff {:.3e} (step {}, token {}); greedy {produced:?}",
        worst.0, worst.1, worst.2
    );
    assert!(worst.0 <= tol, "{arch}: {what} decode logits max diff {:.3e} at step {} token {}", worst.0, worst.1, worst.2);
    assert_eq!(produced, greedy, "{arch}: {what} greedy tokens differ from the reference");
}

/// Logits of the whole token sequence, then of 8 cached greedy decode steps, concatenated
/// (the bitwise comparisons of converted or re-laid-out models).
pub fn logits_then_greedy(m: &Model, tokens: &[u32]) -> Vec<f32> {
    let v = m.cfg.vocab;
    let mut st = m.new_state(tokens.len() + 8);
    let mut all = m.forward(tokens, &mut st, Logits::From(0)).unwrap();
    let mut last = all[all.len() - v..].to_vec();
    for _ in 0..8 {
        last = m.forward(&[argmax(&last)], &mut st, Logits::Last).unwrap();
        all.extend_from_slice(&last);
    }
    all
}

/// Every logit equal in bits, or a failure naming how many differ and the largest gap.
pub fn assert_bits_equal(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: logit counts differ");
    let differing = got.iter().zip(want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
    let (md, at) = max_diff(got, want);
    println!("{what}: {differing} of {} logits differ in bits, max diff {md:.3e} at {at}", got.len());
    assert_eq!(differing, 0, "{what}: {differing} logits differ (max diff {md:.3e} at flat index {at})");
}

/// A model with attention sinks (gpt-oss) under llama.cpp numerics: its forward must refuse
/// with an error naming the limit (no panic, nothing half-run); true then, and the caller skips
/// that mode (llama.cpp's flash-attention twin has no sink term). False for any other case.
#[allow(dead_code)]
pub fn sinks_refuse_llamacpp(name: &str, model: &Model, num: cortiq_engine::Numerics) -> bool {
    if !(model.cfg.attn_sinks && num == cortiq_engine::Numerics::LlamaCpp) {
        return false;
    }
    let mut st = model.new_state(16);
    match model.forward(&[1, 2, 3], &mut st, Logits::Last) {
        Err(e) => assert!(e.to_string().contains("attention sinks"), "{name}: {e}"),
        Ok(_) => panic!("{name}: attention sinks ran under llama.cpp numerics"),
    }
    true
}

//! Architecture parity against the committed HF transformers fixtures (tools/fixtures/gen_dense.py):
//! logits within 1e-4 max-abs of the float64 reference for a whole-sequence forward, for a
//! chunked prefill, and for token-by-token decode; greedy tokens identical; and a per-layer
//! trace that names the first layer whose residual stream diverges when a check fails.

use std::path::{Path, PathBuf};

use cortiq_engine::load::load;
use cortiq_engine::{Logits, Model};
use cortiq_formats::npy::read_f32;

const TOL: f32 = 1e-4;

fn fixture(arch: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(arch)
}

fn ids(path: &Path) -> Vec<u32> {
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// (max |a - b|, flat index of it)
fn max_diff(a: &[f32], b: &[f32]) -> (f32, usize) {
    assert_eq!(a.len(), b.len());
    let mut best = (0f32, 0);
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let d = (x - y).abs();
        if d > best.0 || d.is_nan() {
            best = (d, i);
        }
    }
    best
}

/// Per-layer residual stream vs trace.npy; returns a description of the first layer beyond `tol`.
fn first_divergence(model: &Model, tokens: &[u32], trace_path: &Path) -> Option<String> {
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
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1.0);
        println!(
            "  trace[{i}] ({}) max diff {md:.3e} at pos {} dim {}",
            if i == 0 { "embedding" } else { "layer out" },
            at / d,
            at % d
        );
        if !(md <= TOL * scale) {
            return Some(format!(
                "trace[{i}] = {} diverges: max diff {md:.3e} at pos {} dim {}",
                if i == 0 { "embedding".into() } else { format!("layer {}", i - 1) },
                at / d,
                at % d
            ));
        }
    }
    None
}

fn check_arch(arch: &str) {
    let dir = fixture(arch);
    let model = load(&dir).unwrap_or_else(|e| panic!("{arch}: load failed: {e}")).model;
    let tokens = ids(&dir.join("tokens.json"));
    let greedy = ids(&dir.join("greedy.json"));
    let (shape, want) = read_f32(&dir.join("logits.npy")).unwrap(); // [T, vocab]
    let vocab = shape[1];
    assert_eq!(vocab, model.cfg.vocab);
    println!("{arch}: {} tokens, vocab {vocab}", tokens.len());

    let diverged = first_divergence(&model, &tokens, &dir.join("trace.npy"));

    // 1. Whole sequence in one forward.
    let mut st = model.new_state(tokens.len() + greedy.len());
    let got = model.forward(&tokens, &mut st, Logits::From(0)).unwrap();
    let (md, at) = max_diff(&got, &want);
    println!("{arch}: full forward logits max diff {md:.3e} at pos {} tok {}", at / vocab, at % vocab);
    assert!(
        md <= TOL,
        "{arch}: logits max diff {md:.3e} at pos {} token {} (tolerance {TOL}); {}",
        at / vocab,
        at % vocab,
        diverged.unwrap_or("trace agrees".into())
    );

    // 2. Chunked prefill (uneven chunks) then compare the logits of each chunk.
    let mut st2 = model.new_state(tokens.len());
    let mut chunked = Vec::new();
    for c in tokens.chunks(7) {
        chunked.extend(model.forward(c, &mut st2, Logits::From(0)).unwrap());
    }
    let (md2, at2) = max_diff(&chunked, &want);
    println!("{arch}: chunked (7) prefill logits max diff {md2:.3e}");
    assert!(md2 <= TOL, "{arch}: chunked prefill max diff {md2:.3e} at pos {}", at2 / vocab);

    // 3. Greedy decode with the KV cache, each step's logits against the reference.
    let (gshape, gwant) = read_f32(&dir.join("greedy_logits.npy")).unwrap(); // [N, vocab]
    assert_eq!(gshape[0], greedy.len());
    let mut last = got[(tokens.len() - 1) * vocab..].to_vec();
    let mut produced = Vec::new();
    let mut worst = 0f32;
    for (k, _) in greedy.iter().enumerate() {
        let (md, _) = max_diff(&last, &gwant[k * vocab..(k + 1) * vocab]);
        worst = worst.max(md);
        let next = argmax(&last);
        produced.push(next);
        last = model.forward(&[next], &mut st, Logits::Last).unwrap();
    }
    println!("{arch}: decode-step logits max diff {worst:.3e}; greedy {produced:?}");
    assert!(worst <= TOL, "{arch}: decode logits max diff {worst:.3e}");
    assert_eq!(produced, greedy, "{arch}: greedy tokens differ from the reference");
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn llama_matches_transformers() {
    check_arch("llama");
}

#[test]
fn qwen2_matches_transformers() {
    check_arch("qwen2");
}

#[test]
fn qwen3_matches_transformers() {
    check_arch("qwen3");
}

#[test]
fn gemma3_matches_transformers() {
    check_arch("gemma3");
}

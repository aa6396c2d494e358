//! Embeddings (issue 51) in a decoder embedding model's layout (Qwen3-Embedding: a Qwen3
//! model, the final norm's output at the last position, unit length), against transformers'
//! float64 `Qwen3Model` on the qwen3 fixture's weights (tools/fixtures/gen_embedding.py writes
//! fixtures/qwen3/embedding.json): three inputs, last-position and mean pooling, from the HF
//! folder and from its GGUF, within 1e-4.

mod common;

use common::{TOL, fixture, max_diff};
use cortiq_engine::load::load;
use cortiq_engine::{Numerics, Pooling};

#[test]
fn qwen3_layout_embeddings_match_transformers_f64() {
    let refs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("qwen3").join("embedding.json")).unwrap()).unwrap();
    let floats =
        |v: &serde_json::Value| -> Vec<f32> { v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect() };
    for source in [fixture("qwen3"), fixture("qwen3").join("model.gguf")] {
        let mut m = load(&source).unwrap().model;
        m.set_numerics(Numerics::Exact);
        for input in refs["inputs"].as_array().unwrap() {
            let tokens: Vec<u32> = input["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
            for (pooling, key) in [(Pooling::Last, "last"), (Pooling::Mean, "mean")] {
                let e = m.embed_pooled(&tokens, pooling, true).unwrap();
                let (md, at) = max_diff(&e, &floats(&input[key]));
                println!("{} {} tokens, {key}: max |diff| {md:.2e}", source.display(), tokens.len());
                assert!(md <= TOL, "{}: {} tokens, {key} pooling: max |diff| {md} at {at}", source.display(), tokens.len());
                let len: f32 = e.iter().map(|v| v * v).sum::<f32>().sqrt();
                assert!((len - 1.0).abs() < 1e-5, "not unit length: {len}");
            }
        }
        // no tokens, a token outside the vocabulary: errors, not panics
        assert!(m.embed_pooled(&[], Pooling::Last, true).is_err());
        assert!(m.embed_pooled(&[1, 1 << 30], Pooling::Mean, true).is_err());
    }
}

/// Under fast numerics (the server's) the same embeddings to the products' rounding, and the
/// unnormalized vector is the normalized one scaled.
#[test]
fn fast_embeddings_are_close_and_normalize_alone() {
    let mut m = load(&fixture("qwen3")).unwrap().model;
    m.set_numerics(Numerics::Exact);
    let tokens: Vec<u32> = (0..20).map(|i| (i * 37 % 250) as u32).collect();
    let exact = m.embed_pooled(&tokens, Pooling::Last, true).unwrap();
    m.set_numerics(Numerics::Fast);
    let fast = m.embed_pooled(&tokens, Pooling::Last, true).unwrap();
    let cos: f32 = exact.iter().zip(&fast).map(|(a, b)| a * b).sum();
    assert!(cos > 0.999, "cosine fast vs exact {cos}");
    let raw = m.embed_pooled(&tokens, Pooling::Last, false).unwrap();
    let len: f32 = raw.iter().map(|v| v * v).sum::<f32>().sqrt();
    let (md, _) = max_diff(&raw.iter().map(|v| v / len).collect::<Vec<_>>(), &fast);
    assert!(md < 1e-6 && (len - 1.0).abs() > 1e-3, "raw length {len}, diff {md}");
}

/// `embed_batch` (one forward over many inputs, what the server runs) gives each input exactly
/// what `embed_pooled` gives it alone, whatever the grouping, under exact and fast numerics,
/// on the dense fixture and a mixture of experts.
#[test]
fn batched_embeddings_equal_each_alone() {
    for arch in ["qwen3", "qwen3_moe"] {
        for numerics in [Numerics::Exact, Numerics::Fast] {
            let mut m = load(&fixture(arch)).unwrap().model;
            m.set_numerics(numerics);
            let vocab = m.cfg.vocab as u32;
            let inputs: Vec<Vec<u32>> = [5usize, 1, 17, 9, 32]
                .iter()
                .enumerate()
                .map(|(k, &n)| (0..n).map(|i| ((i * 31 + k * 7) as u32) % vocab).collect())
                .collect();
            for pooling in [Pooling::Last, Pooling::Mean, Pooling::First] {
                let alone: Vec<Vec<f32>> = inputs.iter().map(|t| m.embed_pooled(t, pooling, true).unwrap()).collect();
                for max_tokens in [1, 20, 4096] {
                    let batch = m.embed_batch(&inputs, pooling, true, max_tokens).unwrap();
                    assert_eq!(batch, alone, "{arch} {numerics:?} {pooling:?}: grouped by {max_tokens} positions");
                }
            }
            let err = m.embed_batch(&[vec![1, 2], vec![]], Pooling::Last, true, 64).unwrap_err();
            assert!(err.to_string().contains("entry 1"), "{err}");
        }
    }
}

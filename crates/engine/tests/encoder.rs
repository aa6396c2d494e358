//! The BERT encoder (issue 51's embedding models) against transformers' float64 `BertModel`
//! on a random-weight fixture (tools/fixtures/gen_bert.py: 2 layers, width 64, 4 heads, every
//! bias and LayerNorm drawn): the last hidden state of two inputs within 1e-4, and the mean
//! pooled, normalized embedding (sentence-transformers' Pooling + Normalize) likewise.

mod common;

use common::{TOL, fixture, max_diff};
use cortiq_engine::Pooling;
use cortiq_engine::encoder::Encoder;

#[test]
fn bert_hidden_states_and_embeddings_match_transformers_f64() {
    let enc = Encoder::load(&fixture("bert")).unwrap();
    let refs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("bert").join("reference.json")).unwrap()).unwrap();
    let floats =
        |v: &serde_json::Value| -> Vec<f32> { v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect() };
    for input in refs["inputs"].as_array().unwrap() {
        let tokens: Vec<u32> = input["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
        let (md, at) = max_diff(&enc.hidden(&tokens).unwrap(), &floats(&input["hidden"]));
        println!("{} tokens: hidden max |diff| {md:.2e}", tokens.len());
        assert!(md <= TOL, "{} tokens: hidden state max |diff| {md} at {at}", tokens.len());
        let (md, at) = max_diff(&enc.embed(&tokens, Pooling::Mean, true).unwrap(), &floats(&input["mean_normalized"]));
        println!("{} tokens: embedding max |diff| {md:.2e}", tokens.len());
        assert!(md <= TOL, "{} tokens: embedding max |diff| {md} at {at}", tokens.len());
    }
    // bad input: errors naming it
    assert!(enc.hidden(&[]).is_err());
    assert!(enc.hidden(&[1, 96]).unwrap_err().to_string().contains("96"));
    assert!(enc.hidden(&vec![1; 65]).is_err(), "more positions than the encoder has");
    // not a BERT folder: a clear error
    let e = Encoder::load(&fixture("qwen3")).err().expect("a decoder folder refused");
    assert!(e.to_string().contains("not a BERT encoder"), "{e}");
}

/// A list of inputs embedded in one batch equals each input embedded alone, bit for bit: the
/// stacked rows go through the same products (each output a dot product of one row and one
/// weight column, summed in the same order) and attention stays within each input.
#[test]
fn bert_batch_equals_one_by_one() {
    let enc = Encoder::load(&fixture("bert")).unwrap();
    let mut rng = cortiq_testkit::XorShift(0x5eed);
    let inputs: Vec<Vec<u32>> =
        (0..9).map(|i| (0..1 + (i * 7) % 23).map(|_| 1 + (rng.next() % (enc.cfg.vocab as u64 - 1)) as u32).collect()).collect();
    for (pooling, normalize) in [(Pooling::Mean, true), (Pooling::First, false), (Pooling::Last, true)] {
        let batch = enc.embed_batch(&inputs, pooling, normalize).unwrap();
        assert_eq!(batch.len(), inputs.len());
        for (t, b) in inputs.iter().zip(&batch) {
            let one = enc.embed(t, pooling, normalize).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(b), bits(&one), "{} tokens, {pooling:?}: batched differs from alone", t.len());
        }
    }
}

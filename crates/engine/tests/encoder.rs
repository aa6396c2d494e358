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

/// The fixture as llama.cpp's converter writes a BERT GGUF (tools/fixtures/gen_bert_gguf.py:
/// its names and metadata, f32): the same hidden states bit for bit as the folder, the GGUF's
/// pooling (mean) declared; its WordPiece vocabulary (the converter's "▁"-prefixed form)
/// segments as WordPiece does, `[CLS]` … `[SEP]` around the text.
#[test]
fn bert_gguf_equals_the_folder_and_its_vocabulary_segments() {
    let dir = fixture("bert");
    let gguf = dir.join("model.gguf");
    let (a, b) = (Encoder::load(&dir).unwrap(), Encoder::load(&gguf).unwrap());
    let tokens = [2, 40, 17, 9, 61, 3];
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    assert_eq!(bits(a.hidden(&tokens).unwrap()), bits(b.hidden(&tokens).unwrap()), "GGUF and folder differ");
    assert_eq!(cortiq_engine::encoder::declared_pooling(&gguf), Some((Pooling::Mean, true)));
    assert!(cortiq_engine::encoder::is_encoder(&gguf) && cortiq_engine::encoder::is_encoder(&dir));
    assert!(!cortiq_engine::encoder::is_encoder(&fixture("qwen3").join("model.gguf")));

    let g = cortiq_formats::gguf::Gguf::open(&gguf).unwrap();
    let tok = cortiq_formats::tokenizer::Tokenizer::from_gguf(&g).unwrap();
    // vocabulary: 5 specials, "▁a".."▁z" = 5..30, "a".."z" = 31..56, then ▁hello 57, ▁world 58,
    // ▁play 59, ing 60, ▁caf 61, ▁, 62, ▁! 63
    assert_eq!(tok.encode_input("Hello, WORLD! Playing café").unwrap(), [2, 57, 62, 58, 63, 59, 60, 61, 35, 3]);
    assert_eq!(tok.encode_input("xyz").unwrap(), [2, 28, 55, 56, 3], "unknown words split into single letters");
}

//! Tokenization on the real models' vocabularies (SmolLM2, Qwen2.5-Coder, Gemma 3) against
//! llama.cpp, plus decoding, streaming and speed on them (a whole book, alice29.txt from the
//! brotli 1.2.1 source package, pulled into the cache: count and digest equal to llama.cpp's).
//!
//! Fixtures (tests/data/tokenizer/<model>.json, from tools/tokenizer/gen_expected.py) hold the ids
//! llama.cpp's llama-tokenize gives for varied texts, and the ids transformers gives on the same
//! GGUF. cortiq must equal llama.cpp; where transformers differs (it does on two cases: SmolLM2's
//! `½`/`¼`, which llama.cpp's `\p{N}` split isolates, and Gemma's `</s>`, which llama.cpp makes a
//! control token) the difference is printed, not failed.
//!
//! The GGUFs and alice29.txt come from the model cache (`cortiq pull`; `scripts/test` pulls them
//! first). A test whose file is absent FAILS with the path and how to fetch it
//! (`cortiq_testkit::real_model`): a skipped check must never read as a pass.

mod tokenizer_support;

use std::time::Instant;

use cortiq_formats::gguf::Gguf;
use cortiq_formats::tokenizer::{StreamDecoder, Tokenizer};
use serde_json::Value;
use tokenizer_support::ids_digest;

fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/data/tokenizer/{name}.json", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// The model's tokenizer; panics (naming the path) when the model is not in the cache.
fn load(fx: &Value) -> Tokenizer {
    let file = fx["model_file"].as_str().unwrap();
    let path = cortiq_testkit::real_model(file);
    let g = Gguf::open(&path).unwrap();
    let t0 = Instant::now();
    let tok = Tokenizer::from_gguf(&g).unwrap();
    eprintln!("[{file}] tokenizer loaded in {:.0} ms: {tok:?}", t0.elapsed().as_secs_f64() * 1e3);
    let eog: Vec<String> = tok.eos_ids().iter().map(|&i| format!("{i}:{}", tok.token_text(i).unwrap())).collect();
    eprintln!("[{file}] end-of-generation tokens: {eog:?}");
    tok
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn check_fixture(name: &str) -> Tokenizer {
    let fx = fixture(name);
    let tok = load(&fx);
    let mut failed = 0;
    let cases = fx["cases"].as_array().unwrap();
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let label = c["name"].as_str().unwrap();
        let add_special = c["add_special"].as_bool().unwrap();
        let parse_special = c["parse_special"].as_bool().unwrap();
        let want = ids(if c["llama_cpp"].is_null() { &c["hf"] } else { &c["llama_cpp"] });
        let got = tok.encode_with(text, add_special && tok.add_bos(), parse_special).unwrap();
        if got != want {
            failed += 1;
            let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
            eprintln!("[{name}] {label}: MISMATCH at token {at}\n  want {want:?}\n  got  {got:?}");
        }
        let hf = ids(&c["hf"]);
        if hf != got {
            eprintln!("[{name}] {label}: transformers differs from llama.cpp/cortiq:\n  hf   {hf:?}\n  ours {got:?}");
        }
        // The text comes back from its ids (special tokens rendered, BOS left out).
        let body = if add_special && tok.add_bos() { &got[1..] } else { &got[..] };
        assert_eq!(tok.decode_with(body, true), text, "[{name}] {label}: decode does not round-trip");
    }
    eprintln!("[{name}] {} cases, {} identical to llama.cpp", cases.len(), cases.len() - failed);
    assert_eq!(failed, 0, "[{name}] {failed} cases differ from llama.cpp");
    tok
}

/// Ids of a whole 152 KB book (alice29.txt) against llama.cpp's count and digests.
fn check_long_text(tok: &Tokenizer, name: &str, ids: &[u32]) {
    let fx = fixture(name);
    let lt = &fx["long_text"];
    let want = if lt["llama_cpp"].is_null() { &lt["hf"] } else { &lt["llama_cpp"] };
    let (n, digest) = (want["n"].as_u64().unwrap() as usize, want["sha256"].as_str().unwrap());
    let hf = &lt["hf"];
    if hf["sha256"] != want["sha256"] {
        eprintln!("[{name}] alice29: transformers gives {} tokens, llama.cpp {n}", hf["n"]);
    }
    if ids.len() == n && ids_digest(ids) == digest {
        eprintln!("[{name}] alice29: {n} tokens, identical to llama.cpp");
        return;
    }
    let chunk = want["chunk"].as_u64().unwrap() as usize;
    let first_bad = want["chunk_sha256"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .find(|(i, h)| {
            let part = &ids[(i * chunk).min(ids.len())..((i + 1) * chunk).min(ids.len())];
            ids_digest(part) != h.as_str().unwrap()
        })
        .map(|(i, _)| i);
    let ctx = first_bad.map(|c| {
        let part = &ids[(c * chunk).min(ids.len())..((c + 1) * chunk).min(ids.len())];
        tok.decode_with(&part[..part.len().min(40)], true)
    });
    panic!(
        "[{name}] alice29: {} tokens vs llama.cpp {n}; first differing chunk of {chunk}: {first_bad:?}, starting {ctx:?}",
        ids.len()
    );
}

/// Streaming the ids one at a time gives the whole text, never a broken character.
fn check_stream(tok: &Tokenizer, text: &str) {
    let ids = tok.encode_with(text, false, false).unwrap();
    let mut dec = StreamDecoder::new(tok);
    let mut out = String::new();
    for &id in &ids {
        out.push_str(&dec.push(id));
    }
    out.push_str(&dec.finish());
    assert_eq!(out, text, "streamed decode differs from the input");
}

fn speed(tok: &Tokenizer, name: &str, limit_s: f64) {
    let path = cortiq_testkit::real_text("alice29.txt");
    let text = std::fs::read_to_string(&path).unwrap();
    let t0 = Instant::now();
    let ids = tok.encode_with(&text, false, false).unwrap();
    let dt = t0.elapsed().as_secs_f64();
    eprintln!(
        "[{name}] encoded {} KB into {} tokens in {:.1} ms ({:.1} MB/s)",
        text.len() / 1000,
        ids.len(),
        dt * 1e3,
        text.len() as f64 / dt / 1e6
    );
    assert!(dt < limit_s, "[{name}] encoding {} bytes took {dt:.2} s (limit {limit_s} s)", text.len());
    check_long_text(tok, name, &ids);
    assert_eq!(tok.decode_with(&ids, true), text);
    check_stream(tok, &text);
}

#[test]
fn real_smollm2_vocab() {
    let tok = check_fixture("smollm2");
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.bos_id(), Some(1));
    assert!(!tok.add_bos());
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    assert!(tok.eos_ids().contains(&im_end) && tok.eos_ids().contains(&tok.token_to_id("<|endoftext|>").unwrap()));
    assert!(tok.chat_template().unwrap().contains("<|im_start|>"));
    speed(&tok, "smollm2", 3.0);
}

#[test]
fn real_qwen25_coder_vocab() {
    let tok = check_fixture("qwen2.5-coder");
    assert_eq!(tok.vocab_size(), 151936);
    assert!(!tok.add_bos());
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    assert_eq!(tok.eos_id(), Some(im_end));
    assert!(tok.eos_ids().contains(&tok.token_to_id("<|endoftext|>").unwrap()));
    speed(&tok, "qwen2.5-coder", 3.0);
}

#[test]
fn real_gemma3_vocab() {
    let tok = check_fixture("gemma3");
    assert_eq!(tok.vocab_size(), 262144);
    assert_eq!(tok.bos_id(), Some(2));
    assert!(tok.add_bos());
    let eot = tok.token_to_id("<end_of_turn>").unwrap();
    assert!(tok.eos_ids().contains(&eot) && tok.eos_ids().contains(&1));
    // encode(_, true) adds BOS and parses the turn markers.
    let ids = tok.encode("<start_of_turn>user\nHi<end_of_turn>\n", true).unwrap();
    assert_eq!(ids[0], 2);
    assert_eq!(ids[1], tok.token_to_id("<start_of_turn>").unwrap());
    assert!(ids.contains(&eot));
    // Byte-fallback tokens stream whole characters: "€" is <0xE2><0x82><0xAC> when spelled as bytes.
    let bytes: Vec<u32> = [0xE2u8, 0x82, 0xAC].iter().map(|b| tok.token_to_id(&format!("<0x{b:02X}>")).unwrap()).collect();
    let mut dec = StreamDecoder::new(&tok);
    assert_eq!(dec.push(bytes[0]), "");
    assert_eq!(dec.push(bytes[1]), "");
    assert_eq!(dec.push(bytes[2]), "€");
    speed(&tok, "gemma3", 3.0);
}

//! Mutation fuzzing of the readers a downloaded file reaches first: GGUF (header, metadata,
//! tensor table; and a vocabulary GGUF's tokenizer, llama.cpp's ggml-vocab-qwen2 from the
//! llama-cpp-python 0.3.36 sdist, built and run) and safetensors. Each target starts
//! from a valid committed fixture, mutates it (flipped bytes, counts and lengths overwritten with
//! edge values, truncations, spliced chunks, seeded and reproducible) and requires an `Ok` or a
//! typed `Err` — a panic fails the test and prints the seed.
//!
//! The mutator and driver are `cortiq_testkit::fuzz`. Bounded in the test command
//! (CORTIQ_FUZZ_SECS, default 2 seconds a target); a long local run:
//! `CORTIQ_FUZZ_SECS=600 cargo test --release -p cortiq-formats --test fuzz -- --nocapture`.

mod tokenizer_support;

use std::path::{Path, PathBuf};

use cortiq_formats::gguf::Gguf;
use cortiq_formats::safetensors::HfWeights;
use cortiq_formats::tokenizer::Tokenizer;
use cortiq_testkit::fuzz::fuzz_file as fuzz;

fn fixture(arch: &str, file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures").join(arch).join(file)
}

#[test]
fn fuzz_gguf_reader() {
    // The Qwen3.5 fixture's GGUF: a full metadata block and tensor table.
    let seed = fixture("qwen3_5", "model.gguf");
    fuzz("gguf", &seed, "model.gguf", 64 << 10, |p| {
        if let Ok(g) = Gguf::open(p) {
            for t in &g.tensors {
                let d = g.tensor_data(t);
                assert_eq!(d.len() as u64, t.n_bytes);
            }
            let _ = Tokenizer::from_gguf(&g);
        }
    });
}

#[test]
fn fuzz_gguf_tokenizer() {
    let dir = tokenizer_support::extract(
        &tokenizer_support::LLAMA_CPP_PYTHON,
        "llama_cpp_python-0.3.36/vendor/llama.cpp/models/",
        "ggml-vocab-*",
        "llama.cpp-0.3.36-vocab",
    )
    .unwrap_or_else(|e| panic!("llama.cpp test vocabularies unavailable: {e}"));
    let seed = dir.join("ggml-vocab-qwen2.gguf");
    let tok = Tokenizer::from_gguf(&Gguf::open(&seed).unwrap()).expect("the seed vocabulary builds");
    assert!(!tok.encode_with("hello", false, true).unwrap().is_empty());
    // Mutations land in the metadata: the token list, types, merges and the pre-tokenizer name.
    fuzz("gguf-tokenizer", &seed, "vocab.gguf", 1 << 20, |p| {
        if let Ok(g) = Gguf::open(p)
            && let Ok(tok) = Tokenizer::from_gguf(&g)
        {
            for text in ["<|im_start|>user\nhello wörld 🦙<|im_end|>", "  \n\n\tx", "12345 abc.def"] {
                if let Ok(ids) = tok.encode_with(text, true, true) {
                    let _ = tok.decode(&ids);
                }
            }
        }
    });
}

#[test]
fn fuzz_safetensors_reader() {
    let seed = fixture("llama", "model.safetensors");
    fuzz("safetensors", &seed, "model.safetensors", 16 << 10, |p| {
        if let Ok(w) = HfWeights::open_file(p) {
            let names: Vec<String> = w.names().map(str::to_string).collect();
            for n in names {
                let _ = w.tensor(&n);
            }
        }
    });
}

//! Tokenizer conformance against llama.cpp's own test vocabularies.
//!
//! llama.cpp ships vocab-only GGUFs (`models/ggml-vocab-*.gguf`) with input texts (`.inp`,
//! separated by a marker line) and the ids its tokenizer must produce (`.out`), checked by its
//! test-tokenizer-0 with add_special = false and parse_special = false. We read the same files
//! from the llama-cpp-python 0.3.36 source package (which vendors llama.cpp), fetched once into
//! the user cache and verified by sha256, and require identical ids.
//!
//! Run: every vocabulary of a type we implement (SentencePiece "llama", BPE "gpt2", and
//! "gemma4" SPM-style BPE) and bert-bge (WordPiece, ids only: it is lossy). Not run:
//! nomic-bert-moe (Unigram/T5, refused), aquila, baichuan, gpt-neox (no .inp/.out shipped).

mod tokenizer_support;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cortiq_formats::gguf::Gguf;
use cortiq_formats::tokenizer::Tokenizer;
use tokenizer_support::{LLAMA_CPP_PYTHON, extract};

const MODELS_PREFIX: &str = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/";
const SEPARATOR: &str = "\n__ggml_vocab_test__\n";

/// Folder holding llama.cpp's ggml-vocab-* files, extracted once into the cache.
fn vocab_dir() -> &'static Path {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match DIR.get_or_init(|| extract(&LLAMA_CPP_PYTHON, MODELS_PREFIX, "ggml-vocab-*", "llama.cpp-0.3.36-vocab")) {
        Ok(p) => p,
        Err(e) => panic!("llama.cpp test vocabularies unavailable: {e}"),
    }
}

/// (input text, expected ids) pairs, read as llama.cpp's test-tokenizer-0 reads them.
fn read_cases(vocab: &Path) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(vocab.with_extension("gguf.inp")).expect(".inp");
    let out = std::fs::read_to_string(vocab.with_extension("gguf.out")).expect(".out");
    let mut texts = Vec::new();
    let mut pos = 0;
    while pos < inp.len() {
        match inp[pos..].find(SEPARATOR) {
            Some(k) => {
                texts.push(inp[pos..pos + k].to_string());
                pos += k + SEPARATOR.len();
            }
            None => {
                texts.push(inp[pos..].to_string());
                break;
            }
        }
    }
    let ids: Vec<Vec<u32>> =
        out.lines().map(|l| l.split_whitespace().map(|t| t.parse().expect("id in .out")).collect()).collect();
    assert_eq!(texts.len(), ids.len(), "{}: .inp and .out disagree on the number of tests", vocab.display());
    texts.into_iter().zip(ids).collect()
}

fn check_vocab(name: &str) {
    check_vocab_with(name, true)
}

/// `check_vocab`; `lossless`: decoding the reference ids must give the input back (not for
/// WordPiece, which lower-cases and strips accents).
fn check_vocab_with(name: &str, lossless: bool) {
    let path = vocab_dir().join(format!("ggml-vocab-{name}.gguf"));
    let g = Gguf::open(&path).unwrap();
    let tok = Tokenizer::from_gguf(&g).unwrap();
    let cases = read_cases(&path);
    let mut failed = 0;
    let mut roundtrip_failed = 0;
    for (text, want) in &cases {
        let got = tok.encode_with(text, false, false).unwrap();
        if &got != want {
            failed += 1;
            let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
            let show = |ids: &[u32]| {
                ids.iter()
                    .map(|&i| format!("{i}:{:?}", String::from_utf8_lossy(&tok.token_bytes(i))))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            eprintln!(
                "[{name}] MISMATCH on {text:?}: first difference at token {at}\n  want {want:?}\n  got  {got:?}\n  want pieces {}\n  got  pieces {}",
                show(want),
                show(&got)
            );
        }
        // Decoding the reference ids must give the input back (byte fallback makes every
        // vocabulary here lossless).
        let back = tok.decode_with(want, true);
        if lossless && &back != text {
            roundtrip_failed += 1;
            eprintln!("[{name}] decode({want:?}) = {back:?}, expected {text:?}");
        }
    }
    eprintln!(
        "[{name}] {} cases: {} ids match, {failed} mismatch; decode round trip {} ok, {roundtrip_failed} off",
        cases.len(),
        cases.len() - failed,
        cases.len() - roundtrip_failed
    );
    assert_eq!(failed, 0, "[{name}] {failed} of {} cases differ from llama.cpp", cases.len());
    assert_eq!(roundtrip_failed, 0, "[{name}] {roundtrip_failed} cases do not decode back to their text");
}

macro_rules! vocab_tests {
    ($($f:ident => $name:literal,)*) => {
        $(
            #[test]
            fn $f() {
                check_vocab($name);
            }
        )*
    };
}

vocab_tests! {
    llama_spm => "llama-spm",
    phi_3 => "phi-3",
    llama_bpe => "llama-bpe",
    gpt_2 => "gpt-2",
    qwen2 => "qwen2",
    qwen35 => "qwen35",
    starcoder => "starcoder",
    refact => "refact",
    command_r => "command-r",
    mpt => "mpt",
    falcon => "falcon",
    deepseek_llm => "deepseek-llm",
    deepseek_coder => "deepseek-coder",
    gemma_4 => "gemma-4",
}

/// WordPiece (`tokenizer.ggml.model` "bert", BGE's vocabulary as llama.cpp's converter writes
/// it): cortiq turns it back into the library's WordPiece form (`gguf_vocab::wordpiece`).
#[test]
fn bert_bge() {
    check_vocab_with("bert-bge", false);
}

#[test]
fn unsupported_models_are_an_error_naming_the_field() {
    let path = vocab_dir().join("ggml-vocab-nomic-bert-moe.gguf");
    let g = Gguf::open(&path).unwrap();
    let e = Tokenizer::from_gguf(&g).unwrap_err().to_string();
    assert!(e.contains("tokenizer.ggml.model") && e.contains("t5"), "{e}");
}

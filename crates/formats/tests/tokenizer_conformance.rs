//! Tokenizer conformance against llama.cpp's own test vocabularies.
//!
//! llama.cpp ships vocab-only GGUFs (`models/ggml-vocab-*.gguf`) with input texts (`.inp`,
//! separated by a marker line) and the ids its tokenizer must produce (`.out`), checked by its
//! test-tokenizer-0 with add_special = false and parse_special = false. We read the same files
//! from the llama-cpp-python 0.3.36 source package (which vendors llama.cpp), fetched once into
//! the user cache and verified by sha256, and require identical ids.
//!
//! Run: every vocabulary of a type we implement (SentencePiece "llama", BPE "gpt2", and
//! "gemma4" SPM-style BPE). Not run: bert-bge (WordPiece); nomic-bert-moe (Unigram/T5), aquila,
//! baichuan, gpt-neox (no .inp/.out shipped).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use cortiq_formats::gguf::Gguf;
use cortiq_formats::tokenizer::Tokenizer;
use sha2::{Digest, Sha256};

const SDIST_NAME: &str = "llama_cpp_python-0.3.36.tar.gz";
const SDIST_URL: &str = "https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-0.3.36.tar.gz";
const SDIST_SHA256: &str = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e";
const MODELS_PREFIX: &str = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/";
const SEPARATOR: &str = "\n__ggml_vocab_test__\n";

/// `$CORTIQ_CACHE`, else `$XDG_CACHE_HOME/cortiq`, else `~/.cache/cortiq`.
fn cache_root() -> PathBuf {
    if let Some(p) = std::env::var_os("CORTIQ_CACHE") {
        return PathBuf::from(p);
    }
    if let Some(p) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(p).join("cortiq");
    }
    PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| ".".into())).join(".cache").join("cortiq")
}

fn sha256_file(p: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(p)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The sdist in the cache, downloaded (curl, else pip) and verified if needed.
fn sdist(dir: &Path) -> Result<PathBuf, String> {
    let path = dir.join(SDIST_NAME);
    if !path.exists() {
        let tmp = dir.join(format!("{SDIST_NAME}.part{}", std::process::id()));
        let curl = Command::new("curl").args(["-fsSL", "--retry", "3", "-o"]).arg(&tmp).arg(SDIST_URL).status();
        if !matches!(curl, Ok(s) if s.success()) {
            let _ = std::fs::remove_file(&tmp);
            // Fall back to pip, which knows the index configuration of this machine.
            let pip = Command::new("python3")
                .args(["-m", "pip", "download", "--no-deps", "--no-binary", ":all:"])
                .arg("llama-cpp-python==0.3.36")
                .arg("-d")
                .arg(dir)
                .status();
            if !matches!(pip, Ok(s) if s.success()) || !path.exists() {
                return Err(format!("could not download {SDIST_URL} (curl and pip both failed)"));
            }
        } else {
            std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    let sum = sha256_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    if sum != SDIST_SHA256 {
        let _ = std::fs::remove_file(&path);
        return Err(format!("{}: sha256 {sum}, expected {SDIST_SHA256} (removed; rerun to refetch)", path.display()));
    }
    Ok(path)
}

/// Folder holding llama.cpp's ggml-vocab-* files, extracted once.
fn vocab_dir() -> &'static Path {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let r = DIR.get_or_init(|| {
        let root = cache_root().join("testdata");
        let out = root.join("llama.cpp-0.3.36-vocab");
        if out.join(".complete").exists() {
            return Ok(out);
        }
        std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
        let tgz = sdist(&root)?;
        let tmp = root.join(format!("extract.{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
        let st = Command::new("tar")
            .arg("xzf")
            .arg(&tgz)
            .arg("-C")
            .arg(&tmp)
            .arg("--wildcards")
            .arg(format!("{MODELS_PREFIX}ggml-vocab-*"))
            .status()
            .map_err(|e| format!("tar: {e}"))?;
        if !st.success() {
            return Err(format!("tar failed extracting {}", tgz.display()));
        }
        let _ = std::fs::remove_dir_all(&out);
        std::fs::rename(tmp.join(MODELS_PREFIX), &out).map_err(|e| format!("{}: {e}", out.display()))?;
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::write(out.join(".complete"), SDIST_SHA256).map_err(|e| format!("{}: {e}", out.display()))?;
        Ok(out)
    });
    match r {
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
        if &back != text {
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

#[test]
fn unsupported_models_are_an_error_naming_the_field() {
    let path = vocab_dir().join("ggml-vocab-bert-bge.gguf");
    let g = Gguf::open(&path).unwrap();
    let e = Tokenizer::from_gguf(&g).unwrap_err().to_string();
    assert!(e.contains("tokenizer.ggml.model") && e.contains("bert"), "{e}");
}

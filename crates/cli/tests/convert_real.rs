//! `cortiq convert` on the real Gemma 3 270M GGUF (the cached gemma-3-270m-q4_k_m.gguf,
//! `cortiq_testkit::real_model`; absent, the tests fail), checking two claims of the README:
//! 1. `--quant q8r --keep-embeddings-as q8_0` keeps the model within +0.4% perplexity of its
//!    f32 source, measured as BENCHMARKS.md "Quantization quality" does: the source is the GGUF
//!    dequantized to f32 (`convert --quant f32`), alice29.txt, ctx 512, default numerics, 2
//!    threads; on its first 8 chunks of 16, where the excess is smaller (`Q8R_PPL_EXCESS`).
//! 2. `--quant q8_0` is produced "bit for bit as ggml": every tensor of the .cmf is stored as
//!    ggml's Q8_0 conversion of the same GGUF would store it (the sha256 of each tensor's bytes
//!    against tests/data/gemma3_q8_0_ref/reference.json, written by the `gguf` PyPI package's
//!    reference quantizer), and the file loads and runs: its logits stay within a measured bound
//!    of the source's.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use cortiq_formats::cmf::Cmf;
use cortiq_formats::npy::read_f32;
use cortiq_testkit::{max_abs, max_abs_diff, real_model_arg, real_text_arg};
use serde_json::Value;
use sha2::{Digest, Sha256};

const MODEL: &str = "gemma3-270m";

/// The real-model tests each take the 2 cores; run them one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// q8r (embeddings q8_0) perplexity over the f32 source's, minus one, on 8 chunks. BENCHMARKS.md
/// records 16 chunks, 14.1946 vs 14.1380 (+0.40%); 8 chunks measured 2026-12-07 (Intel Xeon,
/// 2 threads): 14.185757 / 14.155451 = +0.214% with the AVX-512 kernels, 14.196883 / 14.155345 =
/// +0.293% with the AVX2 ones (`CORTIQ_SIMD=avx2`; their activation rounding differs). The bound
/// is the larger, the AVX2 tier's, to two decimals of a percent (< 0.305%). The computation is
/// deterministic (same file, same threads, same kernels): any loss in the q8r path shows. 16
/// chunks took 84 s of the test's 94 s on the AVX2 tier.
const Q8R_PPL_EXCESS: f64 = 0.00305;

/// q8_0 .cmf vs the source GGUF, both in exact numerics, max |logit diff| over all 262,144
/// logits at the 21 positions of the gemma3_hf_ref sentence: measured 0.380 (position 2,
/// largest |logit| 25.3), the source's Q5_0/Q4_K/Q6_K weights requantized to Q8_0 (up to 1/254
/// of each 32-block's largest weight), the size of the fast numerics' 8-bit activations
/// (README: ~0.3). The computation is deterministic, so the bound sits 1.3x above: a Q8_0 grid
/// of half the levels (d = max/63) measured 0.781 and fails it; a wrong scale, row or tensor
/// moves logits by units.
const Q8_0_LOGITS_TOL: f32 = 0.5;

/// A scratch folder removed on drop.
struct Scratch(PathBuf);
impl Scratch {
    fn new(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("cortiq-convert-real-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
    fn path(&self, name: &str) -> String {
        self.0.join(name).to_str().unwrap().to_string()
    }
}
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn cortiq(args: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cortiq")).args(args).output().expect("spawn cortiq");
    let (so, se) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "cortiq {args:?} failed: {se}");
    (so, se)
}

fn convert(src: &str, out: &str, extra: &[&str]) {
    let mut args = vec!["convert", "-m", src, "-o", out];
    args.extend(extra);
    let (_, err) = cortiq(&args);
    eprintln!("convert {extra:?}:\n{}", err.trim());
}

/// `cortiq ppl` with BENCHMARKS.md's settings (alice29, ctx 512, 2 threads) on 8 chunks of its
/// 16 (`Q8R_PPL_EXCESS`), in the default numerics.
fn ppl(model: &str) -> f64 {
    let text = real_text_arg("alice29.txt");
    let (out, err) = cortiq(&["ppl", "-m", model, "-f", &text, "--ctx", "512", "--chunks", "8", "-t", "2"]);
    let line = out.lines().find(|l| l.starts_with("PPL = ")).unwrap_or_else(|| panic!("no PPL line in {out:?}"));
    eprintln!("{model}: {line}\n{}", err.trim());
    line[6..].split_whitespace().next().unwrap().parse().unwrap()
}

fn dtypes(cmf: &str) -> Cmf {
    Cmf::open(cmf).unwrap_or_else(|e| panic!("{cmf}: {e}"))
}

#[test]
fn real_q8r_with_q8_0_embeddings_keeps_gemma3_within_0_4_percent() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Scratch::new("q8r");
    let gguf = real_model_arg(MODEL);
    let (f32_cmf, q8r_cmf) = (dir.path("gemma3-f32.cmf"), dir.path("gemma3-q8r.cmf"));
    convert(&gguf, &f32_cmf, &["--quant", "f32"]);
    convert(&gguf, &q8r_cmf, &["--quant", "q8r", "--keep-embeddings-as", "q8_0"]);

    // What was asked is what is stored: the vocabulary matrix (tied: the only one) in Q8_0,
    // every other matrix in q8r, norms in f32.
    let c = dtypes(&q8r_cmf);
    let mut n_q8r = 0;
    for t in &c.tensors {
        let want = match (t.dims.len(), t.name.as_str()) {
            (1, _) => "f32",
            (_, "token_embd.weight" | "output.weight") => "q8_0",
            _ => "q8r",
        };
        assert_eq!(t.dtype.name(), want, "{}: stored as {}", t.name, t.dtype.name());
        n_q8r += (want == "q8r") as usize;
    }
    assert!(c.tensor("token_embd.weight").is_some() && n_q8r == 126, "{n_q8r} q8r matrices (Gemma 3 270M has 126)");
    for t in &dtypes(&f32_cmf).tensors {
        assert_eq!(t.dtype.name(), "f32", "{}: the source must be f32", t.name);
    }

    let (base, q8r) = (ppl(&f32_cmf), ppl(&q8r_cmf));
    let excess = q8r / base - 1.0;
    eprintln!(
        "gemma3-270m alice29 ctx 512 8 chunks: f32 source {base:.6}, q8r + q8_0 embeddings {q8r:.6}: {:+.4}%",
        100.0 * excess
    );
    assert!(
        excess <= Q8R_PPL_EXCESS,
        "q8r (embeddings q8_0) ppl {q8r} is {:+.4}% over the f32 source's {base}: more than {:+.3}%",
        100.0 * excess,
        100.0 * Q8R_PPL_EXCESS
    );
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn data_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

/// `cortiq logits` in exact numerics: [T, vocab].
fn logits(model: &str, tokens: &str, out: &str) -> (Vec<usize>, Vec<f32>) {
    cortiq(&["logits", "-m", model, "-t", "2", "--numerics", "exact", "--tokens", tokens, "--out", out]);
    read_f32(Path::new(out)).unwrap_or_else(|e| panic!("{out}: {e}"))
}

#[test]
fn real_q8_0_conversion_is_ggml_bit_for_bit_and_runs_close_to_the_source() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Scratch::new("q8_0");
    let gguf = real_model_arg(MODEL);
    let q8 = dir.path("gemma3-q8_0.cmf");
    convert(&gguf, &q8, &["--quant", "q8_0"]);

    // It loads and runs; its logits stay near the source's (both f32 math on the weights).
    let sentence = json(&data_dir("gemma3_hf_ref/reference.json"));
    let tokens: Vec<String> = sentence["tokens"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap().to_string()).collect();
    let tokens = tokens.join(",");
    let (shape, ours) = logits(&q8, &tokens, &dir.path("q8_0.npy"));
    let (shape_src, src) = logits(&gguf, &tokens, &dir.path("src.npy"));
    assert_eq!(shape, shape_src);
    let (d, at) = max_abs_diff(&ours, &src);
    let (vocab, m) = (shape[1], max_abs(&src));
    eprintln!(
        "q8_0 .cmf vs source GGUF, exact numerics, {} positions x {vocab}: max |logit diff| {d:.3e} at position {} token {} (largest |logit| {m:.2}; tolerance {Q8_0_LOGITS_TOL})",
        shape[0],
        at / vocab,
        at % vocab
    );
    assert!(
        d <= Q8_0_LOGITS_TOL,
        "q8_0 .cmf logits differ from the source's by {d:.3e} > {Q8_0_LOGITS_TOL} at position {} token {}",
        at / vocab,
        at % vocab
    );

    // Every tensor stored as ggml stores it: the type, the shape and the sha256 of the bytes.
    let reference = json(&data_dir("gemma3_q8_0_ref/reference.json"));
    let want = reference["tensors"].as_array().unwrap();
    let c = dtypes(&q8);
    assert_eq!(c.tensors.len(), want.len(), "tensor count");
    let mut bad = Vec::new();
    let mut by_source = std::collections::BTreeMap::<String, usize>::new();
    for w in want {
        let name = w["name"].as_str().unwrap();
        let t = c.tensor(name).unwrap_or_else(|| panic!("{name} missing from the .cmf"));
        let shape: Vec<usize> = w["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
        let dims: Vec<usize> = t.dims.iter().rev().map(|&d| d as usize).collect();
        assert_eq!(t.dtype.name(), w["stored"].as_str().unwrap(), "{name}: stored type");
        assert_eq!(dims, shape, "{name}: shape");
        let bytes = c.tensor_data(t);
        let got = hex(&Sha256::digest(bytes));
        if bytes.len() as u64 != w["bytes"].as_u64().unwrap() || got != w["sha256"].as_str().unwrap() {
            bad.push(format!("{name} (from {}): {} bytes, sha256 {got}", w["source_type"].as_str().unwrap(), bytes.len()));
        }
        *by_source.entry(format!("{} -> {}", w["source_type"].as_str().unwrap(), t.dtype.name())).or_default() += 1;
    }
    eprintln!("{} tensors checked against gguf-py's Q8_0 conversion: {by_source:?}; {} differ", want.len(), bad.len());
    assert!(bad.is_empty(), "{} tensors differ from ggml's Q8_0 conversion: {bad:#?}", bad.len());
}

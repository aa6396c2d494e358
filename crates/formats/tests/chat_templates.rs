//! Chat-template rendering against Hugging Face transformers' own renderer.
//!
//! Fixtures (tests/data/tokenizer/chat_templates.json) come from tools/tokenizer/gen_expected.py:
//! the SmolLM2 and Qwen2.5-Coder templates stored in their GGUFs, llama.cpp's copy of the Gemma 2
//! template, and the Gemma 4 template stored in llama.cpp's Gemma 4 test vocabulary, each rendered
//! over a few conversations with and without the generation prompt. A case whose template raises
//! (Gemma 2 rejects system messages) must fail with the same message.

use cortiq_formats::chat::{ChatMessage, render};
use serde_json::Value;

fn fixtures() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tokenizer/chat_templates.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn first_difference(a: &str, b: &str) -> String {
    let i = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
    let ctx = |s: &str| s.chars().skip(i.saturating_sub(20)).take(50).collect::<String>();
    format!("first difference at char {i}: got ...{:?}... want ...{:?}...", ctx(a), ctx(b))
}

fn check(name: &str) {
    let doc = fixtures();
    let t = doc["templates"].as_array().unwrap().iter().find(|t| t["name"] == name).unwrap();
    let template = t["template"].as_str().unwrap();
    let (bos, eos) = (t["bos"].as_str().unwrap(), t["eos"].as_str().unwrap());
    let mut n = 0;
    for case in t["cases"].as_array().unwrap() {
        let msgs: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
        let agp = case["add_generation_prompt"].as_bool().unwrap();
        let label = format!("{name}/{}/agp={agp}", case["conversation"].as_str().unwrap());
        let got = render(template, &msgs, agp, bos, eos);
        match (case.get("expected").and_then(Value::as_str), case.get("error").and_then(Value::as_str)) {
            (Some(want), _) => {
                let got = got.unwrap_or_else(|e| panic!("{label}: render failed: {e}"));
                assert!(got == want, "{label}: {}\n got: {got:?}\nwant: {want:?}", first_difference(&got, want));
            }
            (None, Some(err)) => {
                let e = got.expect_err(&format!("{label}: expected the template to raise {err:?}"));
                assert!(e.to_string().contains(err), "{label}: error {e} does not carry {err:?}");
            }
            _ => panic!("{label}: fixture has neither expected nor error"),
        }
        n += 1;
    }
    eprintln!("[{name}] {n} renders identical to transformers");
}

#[test]
fn smollm2_chatml() {
    check("smollm2");
}

#[test]
fn qwen25_coder_chatml() {
    check("qwen2.5-coder");
}

#[test]
fn gemma2() {
    check("gemma2");
}

#[test]
fn gemma4() {
    check("gemma4");
}

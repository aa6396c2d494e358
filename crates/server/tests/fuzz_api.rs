//! Fuzzing the request parser (`api.rs`): random JSON bodies over the fields the endpoints
//! read (each field given values of every JSON type, nested at random, plus raw byte noise) must
//! parse to a value or to an error naming a field — never a panic. Bounded in the test command
//! (CORTIQ_FUZZ_SECS, default 2 s); `CORTIQ_FUZZ_SECS=600 cargo test --release -p cortiq-server
//! --test fuzz_api -- --nocapture` for a long run.

use std::time::{Duration, Instant};

use cortiq_formats::calls::Family;
use cortiq_server::api;
use cortiq_testkit::XorShift as Rng;
use cortiq_testkit::fuzz::below;
use serde_json::{Map, Value, json};

const FIELDS: &[&str] = &[
    "messages",
    "prompt",
    "model",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "n",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "stream",
    "stream_options",
    "response_format",
    "echo",
    "speculative",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template_kwargs",
    "reasoning_effort",
    "reasoning_budget",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
    "repeat_last_n",
    "ignore_eos",
    "cache_prompt",
    "return_tokens",
];

const WORDS: &[&str] = &[
    "role",
    "content",
    "user",
    "assistant",
    "tool",
    "system",
    "function",
    "name",
    "arguments",
    "type",
    "text",
    "tool_calls",
    "tool_call_id",
    "json_schema",
    "schema",
    "auto",
    "none",
    "required",
    "parameters",
    "ngram",
    "draft",
    "n_max",
    "id",
    "include_usage",
    "reasoning_content",
    "image_url",
    "json_object",
];

fn value(r: &mut Rng, depth: usize) -> Value {
    match below(r, if depth > 3 { 6 } else { 9 }) {
        0 => Value::Null,
        1 => Value::Bool(below(r, 2) == 0),
        2 => {
            let edge: [i64; 7] = [0, -1, 1, i64::MAX, i64::MIN, 1 << 31, 65536];
            json!(edge[below(r, edge.len())])
        }
        3 => json!((r.next() as f64 / u64::MAX as f64 - 0.5) * 10f64.powi(below(r, 40) as i32 - 20)),
        4 => json!(WORDS[below(r, WORDS.len())]),
        5 => {
            let n = below(r, 12);
            Value::String((0..n).map(|_| char::from_u32(below(r, 0x1_0000) as u32).unwrap_or('x')).collect())
        }
        6 => Value::Array((0..below(r, 5)).map(|_| value(r, depth + 1)).collect()),
        _ => {
            let mut m = Map::new();
            for _ in 0..below(r, 5) {
                m.insert(WORDS[below(r, WORDS.len())].to_string(), value(r, depth + 1));
            }
            Value::Object(m)
        }
    }
}

fn body(r: &mut Rng) -> Vec<u8> {
    let mut m = Map::new();
    for _ in 0..below(r, 8) {
        m.insert(FIELDS[below(r, FIELDS.len())].to_string(), value(r, 0));
    }
    let mut b = serde_json::to_vec(&Value::Object(m)).unwrap();
    if below(r, 8) == 0 && !b.is_empty() {
        // Byte noise: the JSON itself broken.
        let i = below(r, b.len());
        b[i] = r.next() as u8;
    }
    b
}

#[test]
fn fuzz_request_parser() {
    let secs: f64 = std::env::var("CORTIQ_FUZZ_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(2.0);
    let t0 = Instant::now();
    let mut n = 0u64;
    while t0.elapsed() < Duration::from_secs_f64(secs) {
        let case = 0xF0CC_0000_0000 + n;
        let mut r = Rng(case.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let b = body(&mut r);
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let Ok(o) = api::object(&b) else { return };
            for chat in [true, false] {
                if let Err(e) = api::gen_params(&o, 1000, chat) {
                    assert!(!e.message.is_empty());
                }
            }
            let _ = api::messages(&o);
            if let Ok(a) = api::agent_params(&o) {
                let f = Family::from_name(Family::NAMES[below(&mut r, Family::NAMES.len())]).unwrap();
                let _ = a.forced_grammar(f, None);
                let _ = a.lazy_call(f);
            }
            let _ = api::prompts(&o, 1000);
            let _ = api::prompt_count(&o);
        }));
        assert!(res.is_ok(), "case {case:#x} panicked on {}", String::from_utf8_lossy(&b));
        // The byte-level look agrees with the full parse wherever it answers.
        let res = std::panic::catch_unwind(|| quick_agrees(&b));
        assert!(res.is_ok(), "case {case:#x}: quick_shape disagrees on {}", String::from_utf8_lossy(&b));
        assert!(res.is_ok(), "case {case:#x} panicked on {}", String::from_utf8_lossy(&b));
        n += 1;
    }
    eprintln!("[request parser] {n} bodies in {:.1}s, no panic", t0.elapsed().as_secs_f64());
}

/// Where `quick_shape` reads a body, the full parse reads the same `n`, prompt count and
/// longest token-id prompt.
fn quick_agrees(b: &[u8]) {
    let Some(sh) = api::quick_shape(b, None) else { return };
    let o = api::object(b).expect("a body quick_shape reads is an object");
    let n = o.get("n").and_then(Value::as_u64).unwrap_or(1) as usize;
    assert_eq!(sh.n, n, "n");
    assert_eq!(sh.prompts, api::prompt_count(&o), "prompts");
    let longest = match api::prompts(&o, usize::MAX) {
        Ok(ps) => ps.iter().map(|p| if let api::Prompt::Tokens(t) = p { t.len() } else { 0 }).max().unwrap_or(0),
        Err(_) => sh.longest_ids, // an empty list of lists, say: the full parse's error stands
    };
    assert_eq!(sh.longest_ids, longest, "longest ids");
}

#[test]
fn quick_shape_reads_what_the_parser_reads() {
    let cases: &[(&str, Option<(usize, usize, usize)>)] = &[
        (r#"{"prompt": "hi", "n": 3}"#, Some((3, 1, 0))),
        (r#" { "n" : null , "prompt" : [ "a" , "b\"]" ] , "x": {"prompt": [1]} } "#, Some((1, 2, 0))),
        (r#"{"prompt": [1, 2, 3]}"#, Some((1, 1, 3))),
        (r#"{"prompt": [[1], [2, 3], []], "n": 2}"#, Some((2, 3, 2))),
        (r#"{"n": 1, "n": 4, "prompt": "a"}"#, Some((4, 1, 0))), // the last duplicate, as serde_json
        (r#"{}"#, Some((1, 1, 0))),
        (r#"{"n": 17, "prompt": "a"}"#, None), // out of range: the parser names it
        (r#"{"n": 2.0, "prompt": "a"}"#, None),
        (r#"{"prompt": [1, "a"]}"#, None),
        (r#"{"prompt": [-1]}"#, None),
        (r#"{"prompt": []}"#, None),
        (r#"{"prompt": "a"} x"#, None),
        (r#"{"pr\u006fmpt": [1, 2]}"#, None),
        (r#"[1, 2]"#, None),
    ];
    for (body, want) in cases {
        let got = api::quick_shape(body.as_bytes(), None).map(|s| (s.n, s.prompts, s.longest_ids));
        assert_eq!(got, *want, "{body}");
        quick_agrees(body.as_bytes());
    }
    // A million prompts, or a million ids, read without a value built.
    let many = format!(r#"{{"prompt": [{}"a"], "n": 16}}"#, "\"a\", ".repeat(999_999));
    let t0 = std::time::Instant::now();
    assert_eq!(api::quick_shape(many.as_bytes(), None).map(|s| (s.n, s.prompts)), Some((16, 1_000_000)));
    let t_many = t0.elapsed();
    let ids = format!(r#"{{"prompt": [{}7], "n": 16}}"#, "123, ".repeat(999_999));
    let t0 = std::time::Instant::now();
    assert_eq!(api::quick_shape(ids.as_bytes(), None).map(|s| s.longest_ids), Some(1_000_000));
    eprintln!(
        "quick_shape: 1M prompts ({} MB) in {t_many:?}, 1M ids ({} MB) in {:?}",
        many.len() >> 20,
        ids.len() >> 20,
        t0.elapsed()
    );
    // With a stop (the queue's room 256, a 4096 context) the look ends at the limit.
    let t0 = std::time::Instant::now();
    let cut = api::quick_shape(many.as_bytes(), Some((256, 4096))).unwrap();
    assert!(cut.cut && cut.prompts == 257 && cut.n == 1, "{cut:?}"); // n comes after the prompts here
    let cut = api::quick_shape(ids.as_bytes(), Some((256, 4096))).unwrap();
    assert!(cut.cut && cut.longest_ids == 4096, "{cut:?}");
    let n_first = format!(r#"{{"n": 16, "prompt": [{}"a"]}}"#, "\"a\", ".repeat(999));
    let cut = api::quick_shape(n_first.as_bytes(), Some((256, 4096))).unwrap();
    assert!(cut.cut && cut.prompts == 17 && cut.n == 16, "{cut:?}");
    assert!(!api::quick_shape(b"{\"prompt\": [\"a\", \"b\"]}", Some((256, 4096))).unwrap().cut);
    eprintln!("quick_shape with a stop: {:?} for all three", t0.elapsed());
}

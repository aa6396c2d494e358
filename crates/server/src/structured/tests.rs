//! The lazy call grammar (`LazyCall`) driven token by token over a byte-level vocabulary:
//! free before the opener and inside the thinking block, a schema-valid call after it, free
//! again once the call is closed.

use std::path::Path;

use serde_json::json;

use cortiq_formats::calls::{self, Family, Piece};

use super::*;
use crate::api;

const EOS: u32 = 256;

fn setup() -> (Arc<Tokenizer>, Structured, api::LazyCall) {
    setup_for(Family::Hermes)
}

fn setup_for(family: Family) -> (Arc<Tokenizer>, Structured, api::LazyCall) {
    let json = cortiq_testkit::byte_tokenizer_json();
    let tok = Arc::new(Tokenizer::from_tokenizer_json_str(Path::new("bytes.json"), &json, None).unwrap());
    let st = Structured::new(tok.clone(), 257, EOS).unwrap();
    let body = json!({"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 0, "maximum": 30}},
        "required": ["city", "days"]}}}]});
    let agent = api::agent_params(body.as_object().unwrap()).unwrap();
    let (opener, grammar) = agent.lazy_call(family).unwrap();
    (tok, st, api::LazyCall { opener, grammar, think: Some(ThinkTags::think()), in_think: false })
}

/// Logits from a seeded generator (no model needed: the mask alone decides what is allowed).
fn logits(seed: &mut u64) -> Vec<f32> {
    (0..257)
        .map(|_| {
            *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (*seed >> 40) as f32 / (1u64 << 24) as f32
        })
        .collect()
}

fn free(c: &mut dyn Constraint, seed: &mut u64) -> bool {
    let mut l = logits(seed);
    c.mask(&mut l).unwrap();
    l.iter().all(|x| x.is_finite())
}

/// Write `text` as the model would (each byte a token), checking nothing is masked.
fn write_free(c: &mut dyn Constraint, text: &str, seed: &mut u64) {
    for b in text.bytes() {
        assert!(free(c, seed), "masked before {:?} of {text:?}", b as char);
        assert!(!c.commit(b as u32).unwrap());
    }
}

/// Sample the highest allowed logit until the grammar lets everything through again.
fn write_held(c: &mut dyn Constraint, seed: &mut u64) -> String {
    let mut out = Vec::new();
    for _ in 0..400 {
        let mut l = logits(seed);
        c.mask(&mut l).unwrap();
        if l.iter().all(|x| x.is_finite()) {
            return String::from_utf8(out).unwrap();
        }
        let (id, _) = l.iter().enumerate().filter(|(_, x)| x.is_finite()).max_by(|a, b| a.1.total_cmp(b.1)).unwrap();
        assert_ne!(id as u32, EOS, "the grammar allowed the end inside a call: {:?}", String::from_utf8_lossy(&out));
        out.push(id as u8);
        assert!(!c.commit(id as u32).unwrap());
    }
    panic!("the call did not close in 400 tokens: {:?}", String::from_utf8_lossy(&out));
}

fn check_call(body: &str) {
    let inner = body.strip_prefix('\n').and_then(|b| b.strip_suffix("\n</tool_call>")).unwrap_or_else(|| panic!("{body:?}"));
    // Written as the templates show calls (Python's json.dumps separators).
    assert!(inner.starts_with("{\"name\": \"get_weather\", \"arguments\": {\"city\": \""), "{inner}");
    let v: Value = serde_json::from_str(inner).unwrap_or_else(|e| panic!("{e}: {inner:?}"));
    assert_eq!(v["name"], "get_weather", "{inner}");
    let city = v["arguments"]["city"].as_str().unwrap_or_else(|| panic!("{inner}"));
    let days = v["arguments"]["days"].as_i64().unwrap_or_else(|| panic!("{inner}"));
    assert!(city.chars().count() <= 12 && (0..=30).contains(&days), "{inner}");
}

#[test]
fn lazy_call_grammar_engages_at_the_opener() {
    let (tok, st, l) = setup();
    let compiled = st.compile_lark(&l.grammar).unwrap();
    for seed0 in 0..8u64 {
        let mut seed = seed0;
        let mut c = compiled.lazy(tok.clone(), &l.opener, l.think.clone(), false);
        // Text, and the opener inside the thinking block, are free.
        write_free(&mut *c, "<think>maybe <tool_call> later</think>Let me check. <tool_call", &mut seed);
        assert!(!c.commit(b'>' as u32).unwrap());
        check_call(&write_held(&mut *c, &mut seed));
        // Free again: text, then a second call.
        write_free(&mut *c, "\nAnd <tool_call>", &mut seed);
        check_call(&write_held(&mut *c, &mut seed));
        assert!(free(&mut *c, &mut seed));
    }
    // The prompt ends inside the thinking block: the opener there is thinking.
    let mut seed = 1;
    let mut c = compiled.lazy(tok.clone(), &l.opener, l.think.clone(), true);
    write_free(&mut *c, "a <tool_call> b</think><tool_call>", &mut seed);
    check_call(&write_held(&mut *c, &mut seed));
}

/// Write `text` where the grammar holds the output: each byte must be allowed.
fn write_allowed(c: &mut dyn Constraint, text: &str, seed: &mut u64) {
    for b in text.bytes() {
        let mut l = logits(seed);
        c.mask(&mut l).unwrap();
        assert!(l[b as usize].is_finite(), "{:?} of {text:?} not allowed", b as char);
        assert!(!c.commit(b as u32).unwrap());
    }
}

/// Qwen's XML form: a string parameter as raw text up to its closer, an integer as JSON, the
/// required parameters present in the schema's order; the parser reads the call back.
#[test]
fn lazy_call_grammar_qwen_xml() {
    let (tok, st, l) = setup_for(Family::QwenXml);
    let compiled = st.compile_lark(&l.grammar).unwrap_or_else(|e| panic!("{e}\n{}", l.grammar));
    for seed0 in 0..8u64 {
        let mut seed = seed0;
        let mut c = compiled.lazy(tok.clone(), &l.opener, l.think.clone(), false);
        let mut text = "Checking.\n<tool_call>".to_string();
        write_free(&mut *c, &text, &mut seed);
        // Only the declared function, then its first (required) parameter.
        let mut l0 = logits(&mut seed);
        c.mask(&mut l0).unwrap();
        assert!(l0[b'\n' as usize].is_finite() && l0.iter().filter(|x| x.is_finite()).count() == 1);
        let head = "\n<function=get_weather>\n<parameter=city>\nSã\n</param>\n</parameter>\n<parameter=days>\n";
        write_allowed(&mut *c, head, &mut seed);
        text.push_str(head);
        text.push_str(&write_held(&mut *c, &mut seed));
        assert!(text.ends_with("</function>\n</tool_call>"), "{text:?}");
        let mut o = calls::Options { family: Some(Family::QwenXml), ..Default::default() };
        o.tools = serde_json::from_str(
            r#"[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]"#,
        )
        .unwrap();
        let mut p = calls::Parser::new(o);
        let mut pieces = p.feed(&text);
        pieces.extend(p.finish());
        let [Piece::Text(t), Piece::Call(call)] = &pieces[..] else { panic!("{pieces:?}") };
        assert_eq!((t.as_str(), call.name.as_str()), ("Checking.", "get_weather"));
        let args: Value = serde_json::from_str(&call.arguments).unwrap();
        assert_eq!(args["city"], "Sã\n</param>");
        assert!((0..=30).contains(&args["days"].as_i64().unwrap()), "{args}");
    }
}

/// gpt-oss under `tool_choice: required`: the forced grammar writes harmony's header
/// (`<|channel|>` first, nothing else allowed), the tool's name, the arguments following its
/// schema and the control token `<|call|>`, which ends the grammar; the harmony parser reads
/// the call back.
#[test]
fn forced_call_grammar_harmony() {
    const SPECIALS: [&str; 7] = ["<|channel|>", "<|message|>", "<|constrain|>", "<|call|>", "<|start|>", "<|end|>", "<|return|>"];
    let vocab = 256 + SPECIALS.len() + 1;
    let eos = vocab as u32 - 1;
    let added: Vec<String> = SPECIALS
        .iter()
        .chain(["<|endoftext|>"].iter())
        .enumerate()
        .map(|(i, t)| {
            format!(
                r#"{{"id":{},"content":"{t}","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}}"#,
                256 + i
            )
        })
        .collect();
    let json = cortiq_testkit::byte_tokenizer_json()
        .replace(r#""added_tokens":[]"#, &format!(r#""added_tokens":[{}]"#, added.join(",")));
    let tok = Arc::new(Tokenizer::from_tokenizer_json_str(Path::new("harmony.json"), &json, None).unwrap());
    // As gpt-oss's tokenizer: the header markup renders as text, <|call|> is a control token.
    assert!(!tok.is_control(256) && tok.is_control(259), "the test vocabulary's markup tokens are not as gpt-oss's");
    let st = Structured::new(tok.clone(), vocab, eos).unwrap();
    let body = json!({"tool_choice": "required", "tools": [
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 0, "maximum": 30}},
            "required": ["city", "days"]}}}]});
    let agent = api::agent_params(body.as_object().unwrap()).unwrap();
    let grammar = agent.forced_grammar(Family::Harmony, None).expect("a forced grammar for harmony");
    let compiled = st.compile_lark(&grammar).unwrap_or_else(|e| panic!("{e}\n{grammar}"));
    let mut names = Vec::new();
    for seed0 in 0..8u64 {
        let mut seed = seed0;
        let mut c = compiled.constraint().unwrap();
        let mut bytes = Vec::new();
        let mut stopped = false;
        for step in 0..400 {
            let mut l: Vec<f32> = (0..vocab)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (seed >> 40) as f32 / (1u64 << 24) as f32
                })
                .collect();
            c.mask(&mut l).unwrap();
            let allowed: Vec<usize> = (0..vocab).filter(|&i| l[i].is_finite()).collect();
            if step == 0 {
                // The forced header's first token: <|channel|> itself, as the model writes it.
                assert_eq!(allowed, vec![256], "the first token allowed is not <|channel|> alone");
            }
            let id = *allowed.iter().max_by(|a, b| l[**a].total_cmp(&l[**b])).expect("something allowed") as u32;
            if id == eos {
                break;
            }
            match id {
                0..=255 => bytes.push(id as u8),
                _ => bytes.extend_from_slice(SPECIALS[id as usize - 256].as_bytes()),
            }
            if c.commit(id).unwrap() {
                stopped = true;
                break;
            }
        }
        let text = String::from_utf8(bytes).expect("the grammar writes UTF-8");
        assert!(stopped && text.ends_with("<|call|>"), "the call did not end: {text:?}");
        let mut p = calls::Parser::new(calls::Options {
            family: Some(Family::Harmony),
            tools: agent.tools.clone(),
            ..Default::default()
        });
        let mut pieces = p.feed(&text);
        pieces.extend(p.finish());
        let [Piece::Call(call)] = &pieces[..] else { panic!("{text:?} -> {pieces:?}") };
        let args: Value = serde_json::from_str(&call.arguments).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        match call.name.as_str() {
            "get_weather" => {
                let city = args["city"].as_str().unwrap_or_else(|| panic!("{text:?}"));
                assert!(city.chars().count() <= 12 && (0..=30).contains(&args["days"].as_i64().unwrap()), "{text:?}");
            }
            "get_time" => assert_eq!(args, json!({}), "{text:?}"),
            other => panic!("a call to {other}: {text:?}"),
        }
        names.push(call.name.clone());
    }
    println!("harmony forced calls over 8 seeds: {names:?}");
}

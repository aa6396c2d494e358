//! The chat output's route without a model: which splitter a request runs (`chat_parse`), and
//! what a whole message (`Out::message`) and a stream's deltas (`Streamer::deltas`) make of a
//! model's text. gpt-oss's harmony channels are split whether or not the request has tools.

use super::*;
use cortiq_formats::tokenizer::Tokenizer;

/// What gpt-oss's chat template shows the model (the markup `Family::detect` reads).
const HARMONY: &str = "{%- for m in messages %}<|start|>{{ m.role }}<|channel|>final<|message|>{{ m.content }}<|end|>{%- endfor %}\
{%- if add_generation_prompt %}<|start|>assistant{%- endif %} to=functions.{{ name }}<|channel|>commentary <|constrain|>json";

fn agent(tools: Vec<Value>) -> api::AgentParams {
    api::AgentParams { tools, choice: ToolChoice::Auto, parallel: true, kwargs: api::Obj::new(), budget: None }
}

fn weather() -> Vec<Value> {
    vec![json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}}}})]
}

/// A chat `Out` (its tokenizer is only read for log-probabilities, which these tests do not ask).
fn out(parse: Option<calls::Options>) -> Out {
    let tok = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": null, "post_processor": null, "decoder": null,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "vocab": {"a": 0}, "merges": []},
    });
    let tok = Tokenizer::from_tokenizer_json_str(std::path::Path::new("test"), &tok.to_string(), None).unwrap();
    Out {
        kind: Kind::Chat,
        id: "chatcmpl-test".into(),
        created: 0,
        model: "gpt-oss".into(),
        n_prompt: 1,
        choices: 1,
        per_prompt: 1,
        return_tokens: false,
        include_usage: false,
        spec: false,
        tok: Arc::new(tok),
        parse,
    }
}

/// The stream's deltas for `tokens` fed one at a time (as `Streamer::on` feeds each token's
/// text, then the end), joined per field: (reasoning, content, [(name, arguments)]).
fn streamed(out: Out, tokens: &[&str]) -> (String, String, Vec<(String, String)>) {
    let (_tx, rx) = mpsc::unbounded_channel();
    let mut st = Streamer {
        parsers: vec![Some(out.parser())],
        out,
        rx: EventRx { rx, pending: Arc::new(std::sync::atomic::AtomicUsize::new(0)) },
        pending: VecDeque::new(),
        done: 0,
        counts: Counts::default(),
        sent_chars: vec![0],
        n_calls: vec![0],
        ended: false,
    };
    let mut deltas = Vec::new();
    for t in tokens {
        let p = st.parsers[0].as_mut().unwrap().feed(t);
        deltas.extend(st.deltas(0, p));
    }
    let p = st.parsers[0].as_mut().unwrap().finish();
    deltas.extend(st.deltas(0, p));
    let (mut reasoning, mut content, mut calls) = (String::new(), String::new(), Vec::<(String, String)>::new());
    for d in deltas {
        assert!(!d.to_string().contains("<|"), "markup in a delta: {d}");
        if let Some(r) = d["reasoning_content"].as_str() {
            reasoning.push_str(r);
        }
        if let Some(c) = d["content"].as_str() {
            content.push_str(c);
        }
        if let Some(f) = d["tool_calls"][0]["function"].as_object() {
            match f.get("name").and_then(Value::as_str) {
                Some(n) => calls.push((n.into(), f["arguments"].as_str().unwrap().into())),
                None => calls.last_mut().unwrap().1.push_str(f["arguments"].as_str().unwrap()),
            }
        }
    }
    (reasoning, content, calls)
}

/// gpt-oss's tokens (cut at each '·') as the engine gives them out: markup rendered,
/// `<|call|>` and `<|return|>` ending generation unseen.
const ANSWER: &str =
    "<|channel|>·analysis·<|message|>·User· greets·.·<|end|>·<|start|>·assistant·<|channel|>·final·<|message|>·Hello·!";
const CALL: &str = "<|channel|>·analysis·<|message|>·Need· weather·<|end|>·<|start|>·assistant·<|channel|>·commentary· to·=·functions·.get·_weather· ·<|constrain|>·json·<|message|>·{\"·city·\":\"·Oslo·\"}";

fn tokens(s: &str) -> Vec<&str> {
    s.split('·').collect()
}

#[test]
fn harmony_is_split_without_tools() {
    let p = chat_parse(None, true, HARMONY, "<|start|>assistant", false, &agent(vec![])).expect("harmony always splits");
    assert_eq!((p.family, p.think, p.start_in_think), (Some(calls::Family::Harmony), Some(calls::ThinkTags::harmony()), false));
    assert!(p.tools.is_empty());
    // Without the reasoning split the channels are still read (the analysis becomes text).
    let p = chat_parse(None, false, HARMONY, "", false, &agent(vec![])).unwrap();
    assert_eq!((p.family, p.think), (Some(calls::Family::Harmony), None));
    // Named by the flag over a template that does not show it.
    let p = chat_parse(Some(calls::Family::Harmony), true, "{{ messages }}", "", false, &agent(vec![])).unwrap();
    assert_eq!(p.family, Some(calls::Family::Harmony));
    // Other families as before: no tools and no thinking block, nothing to split; a thinking
    // block alone splits reasoning only.
    assert!(chat_parse(None, true, "{{ messages }}", "", false, &agent(vec![])).is_none());
    let p = chat_parse(None, true, "<tool_call><think>", "<think>\n", false, &agent(vec![])).unwrap();
    assert_eq!((p.family, p.start_in_think), (None, true));
}

#[test]
fn harmony_message_whole_and_streamed() {
    let o = out(chat_parse(None, true, HARMONY, "", false, &agent(vec![])));
    let (m, finish) = o.message(0, &ANSWER.replace('·', ""), Finish::Stop);
    assert_eq!((m["reasoning_content"].as_str(), m["content"].as_str(), finish), (Some("User greets."), Some("Hello!"), "stop"));
    assert_eq!(streamed(o, &tokens(ANSWER)), ("User greets.".into(), "Hello!".into(), vec![]));

    let o = out(chat_parse(None, true, HARMONY, "", true, &agent(weather())));
    let (m, finish) = o.message(0, &CALL.replace('·', ""), Finish::Stop);
    assert_eq!((m["reasoning_content"].as_str(), &m["content"], finish), (Some("Need weather"), &Value::Null, "tool_calls"));
    let f = &m["tool_calls"][0]["function"];
    assert_eq!((f["name"].as_str(), f["arguments"].as_str()), (Some("get_weather"), Some("{\"city\":\"Oslo\"}")));
    assert_eq!(
        streamed(o, &tokens(CALL)),
        ("Need weather".into(), String::new(), vec![("get_weather".into(), "{\"city\":\"Oslo\"}".into())])
    );
}

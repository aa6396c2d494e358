//! Golden outputs per family, each parsed whole and then cut at every byte offset (and fed one
//! byte at a time): the pieces must not depend on the cut.

use super::*;
use serde_json::json;

fn tools() -> Vec<Value> {
    vec![
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}),
        json!({"type": "function", "function": {"name": "search", "parameters": {"type": "object",
            "properties": {"query": {"type": "string"}, "filters": {"type": "object"}}}}}),
    ]
}

fn opts(family: Family, think: bool) -> Options {
    Options {
        family: Some(family),
        tools: tools(),
        think: think.then(ThinkTags::think),
        start_in_think: false,
        stream_args: false,
        single_call: false,
    }
}

fn whole(o: &Options, chunks: &[&[u8]]) -> Vec<Piece> {
    let mut p = Parser::new(o.clone());
    let mut out = Vec::new();
    for c in chunks {
        out.extend(p.feed_bytes(c));
    }
    out.extend(p.finish());
    merge(out)
}

fn text(s: &str) -> Piece {
    Piece::Text(s.into())
}

fn call(name: &str, args: Value) -> Piece {
    Piece::Call(Call { name: name.into(), arguments: args.to_string() })
}

fn check(o: &Options, out: &str, want: &[Piece]) {
    let b = out.as_bytes();
    let got = collapse(whole(o, &[b]));
    assert_eq!(got, want, "whole: {out:?}");
    for k in 0..=b.len() {
        let got = collapse(whole(o, &[&b[..k], &b[k..]]));
        assert_eq!(got, want, "cut at byte {k} of {out:?}");
    }
    let bytes: Vec<&[u8]> = b.chunks(1).collect();
    assert_eq!(collapse(whole(o, &bytes)), want, "one byte at a time: {out:?}");
}

/// A streamed call: its arguments exactly as written.
fn raw_call(name: &str, args: &str) -> Piece {
    Piece::Call(Call { name: name.into(), arguments: args.into() })
}

#[test]
fn hermes_streamed_arguments() {
    let mut o = opts(Family::Hermes, true);
    o.stream_args = true;
    let out = "<think>go</think>\n\nOn it.\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"a } \\\" { ü\", \"filters\": {\"a\": [1, {}]}}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>";
    let want = [
        Piece::Reasoning("go".into()),
        text("On it."),
        raw_call("search", "{\"query\": \"a } \\\" { ü\", \"filters\": {\"a\": [1, {}]}}"),
        raw_call("get_weather", "{}"),
    ];
    check(&o, out, &want);
    // The name goes out as soon as the head is read, the arguments as they arrive.
    let mut p = Parser::new(o.clone());
    let mut got = p.feed("<think>go</think>On it.\n<tool_call>\n{\"name\": \"search\", \"argum");
    assert!(!got.iter().any(|x| matches!(x, Piece::CallStart(_))), "{got:?}");
    got = p.feed("ents\": {\"query\": \"ab");
    assert_eq!(got, [Piece::CallStart("search".into()), Piece::CallArgs("{\"query\": \"ab".into())]);
    assert_eq!(p.feed("c\"}}\n</tool"), [Piece::CallArgs("c\"}".into())]);
    assert_eq!(p.feed("_call>"), [Piece::CallEnd]);
    assert_eq!(p.finish(), []);
    // Cut by the token limit: the call ends with what it has.
    let cut = "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"ab";
    check(&o, cut, &[raw_call("search", "{\"query\": \"ab")]);
    // Bodies that do not open with the head are parsed whole, as without streaming.
    check(
        &o,
        "<tool_call>\n{\"arguments\": {\"city\": \"Oslo\"}, \"name\": \"get_weather\"}\n</tool_call>",
        &[call("get_weather", json!({"city": "Oslo"}))],
    );
    let bad = "<tool_call>\n{\"name\": \"get weather\", \"arguments\": {}}\n</tool_call>";
    check(&o, bad, &[text(bad)]);
}

#[test]
fn detect_from_the_templates_markup() {
    assert_eq!(Family::detect("... <tool_call>\\n{\"name\": <function-name> ..."), Family::Hermes);
    assert_eq!(Family::detect("<tool_call>\\n<function=example_function_name>\\n<parameter=x>"), Family::QwenXml);
    assert_eq!(Family::detect("{{- '[TOOL_CALLS]' }}"), Family::Mistral);
    assert_eq!(Family::detect("<|tool_call_start|>"), Family::Lfm2);
    assert_eq!(Family::detect("<|tool_calls_section_begin|>"), Family::Kimi);
    assert_eq!(Family::detect("<|python_tag|>"), Family::Llama3);
    assert_eq!(Family::detect("{{ messages }}"), Family::Json);
    for n in Family::NAMES {
        assert_eq!(Family::from_name(n).map(Family::name), Some(n));
    }
}

#[test]
fn hermes() {
    let o = opts(Family::Hermes, false);
    check(&o, "The weather is sunny.", &[text("The weather is sunny.")]);
    check(
        &o,
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        &[call("get_weather", json!({"city": "Paris"}))],
    );
    check(
        &o,
        "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"Zürich 🦙 \\\"quoted\\\" }\", \"filters\": {\"a\": [1, {\"b\": null}]}}}\n</tool_call>",
        &[
            text("Let me check."),
            call("get_weather", json!({"city": "Paris", "days": 3})),
            call("search", json!({"query": "Zürich 🦙 \"quoted\" }", "filters": {"a": [1, {"b": null}]}})),
        ],
    );
    // Malformed: the markup comes back as text, as written.
    let bad = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>";
    check(&o, bad, &[text(bad)]);
    // Unclosed at the end of the output (max_tokens): text.
    let open = "<tool_call>\n{\"name\": \"get_weather\"";
    check(&o, open, &[text(open)]);
    // Text after a call: the separating whitespace is not content.
    check(
        &o,
        "<tool_call>\n{\"name\": \"search\", \"arguments\": {}}\n</tool_call>\n\nDone.\n",
        &[call("search", json!({})), text("Done.")],
    );
    // A lone '<' and look-alikes are text.
    check(&o, "a < b and <tool> x", &[text("a < b and <tool> x")]);
}

/// `parallel_tool_calls: false`: the first call only, whole or streamed; the later ones' markup
/// is not text either.
#[test]
fn single_call_keeps_the_first() {
    let two = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}\n</tool_call>\nDone.";
    let mut o = opts(Family::Hermes, false);
    o.single_call = true;
    check(&o, two, &[call("get_weather", json!({"city": "Oslo"})), text("Done.")]);
    o.stream_args = true;
    check(&o, two, &[raw_call("get_weather", "{\"city\": \"Oslo\"}"), text("Done.")]);
    // Without it, both.
    check(
        &opts(Family::Hermes, false),
        two,
        &[call("get_weather", json!({"city": "Oslo"})), call("search", json!({"query": "x"})), text("Done.")],
    );
}

#[test]
fn hermes_with_reasoning() {
    let o = opts(Family::Hermes, true);
    check(
        &o,
        "<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
        &[Piece::Reasoning("\nThe user wants weather.\n".into()), call("get_weather", json!({"city": "Oslo"}))],
    );
    check(&o, "<think>hmm</think>Hello!", &[Piece::Reasoning("hmm".into()), text("Hello!")]);
    // Markup inside the thinking is thinking.
    check(&o, "<think>maybe <tool_call> later</think>No.", &[Piece::Reasoning("maybe <tool_call> later".into()), text("No.")]);
    let mut s = opts(Family::Hermes, true);
    s.start_in_think = true;
    check(&s, "plan it</think>\n\nDone.", &[Piece::Reasoning("plan it".into()), text("Done.")]);
    // Thinking cut off by the token limit stays thinking.
    check(&s, "still thinking", &[Piece::Reasoning("still thinking".into())]);
}

#[test]
fn json_fallback_fenced_and_bare() {
    // What Qwen2.5-Coder-0.5B writes (../shared/research/agents-and-apis.md).
    let o = opts(Family::Hermes, false);
    check(
        &o,
        "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```",
        &[call("get_weather", json!({"city": "Paris"}))],
    );
    check(
        &o,
        "```json\n[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}]\n```",
        &[call("get_weather", json!({"city": "Paris"})), call("get_weather", json!({"city": "Rome"}))],
    );
    check(&o, "{\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}", &[call("search", json!({"query": "x"}))]);
    // Not a declared tool, or not a call: the block is text.
    let code = "Here:\n```json\n{\"name\": \"other\", \"arguments\": {}}\n```\nDone.";
    check(&o, code, &[text(code)]);
    let code = "```\nfn main() {}\n```";
    check(&o, code, &[text(code)]);
    check(&o, "{\"a\": 1} is JSON", &[text("{\"a\": 1} is JSON")]);
    check(&o, "[1, 2] and {\"name\": \"search\"}", &[text("[1, 2] and {\"name\": \"search\"}")]);
    // Without tools nothing is parsed.
    let none = Options::default();
    check(
        &none,
        "<tool_call>{\"name\": \"search\", \"arguments\": {}}</tool_call>",
        &[text("<tool_call>{\"name\": \"search\", \"arguments\": {}}</tool_call>")],
    );
}

#[test]
fn qwen_xml() {
    let o = opts(Family::QwenXml, false);
    check(
        &o,
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        &[call("get_weather", json!({"city": "São Paulo", "days": 3}))],
    );
    check(
        &o,
        "I'll search.\n\n<tool_call>\n<function=search>\n<parameter=query>\n123\n</parameter>\n<parameter=filters>\n{\"lang\": [\"en\", \"de\"]}\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nline one\nline two\n</parameter>\n</function>\n</tool_call>",
        &[
            text("I'll search."),
            call("search", json!({"query": "123", "filters": {"lang": ["en", "de"]}})),
            call("get_weather", json!({"city": "line one\nline two"})),
        ],
    );
    let bad = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>";
    check(&o, bad, &[text(bad)]);
}

#[test]
fn qwen_xml_streamed_arguments() {
    let mut o = opts(Family::QwenXml, true);
    o.stream_args = true;
    let out = "<think>hm</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSão \"Paulo\"\n</parameter\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=search>\n</function>\n</tool_call>";
    check(
        &o,
        out,
        &[
            Piece::Reasoning("hm".into()),
            raw_call("get_weather", "{\"city\": \"São \\\"Paulo\\\"\\n</parameter\", \"days\": 3}"),
            raw_call("search", "{}"),
        ],
    );
    // The arguments are valid JSON, equal to what the whole parse gives.
    let whole = collapse(whole(&opts(Family::QwenXml, false), &[out.as_bytes()]));
    let streamed = collapse(self::whole(&o, &[out.as_bytes()]));
    for (a, b) in whole.iter().zip(&streamed) {
        if let (Piece::Call(a), Piece::Call(b)) = (a, b) {
            assert_eq!(
                serde_json::from_str::<Value>(&a.arguments).unwrap(),
                serde_json::from_str::<Value>(&b.arguments).unwrap()
            );
        }
    }
    // A string value streams as it is written; the newline before the closer waits.
    let mut p = Parser::new(o.clone());
    let got = p.feed("<tool_call>\n<function=get_weather>\n<parameter=city>\nOs");
    assert_eq!(got, [Piece::CallStart("get_weather".into()), Piece::CallArgs("{\"city\": \"Os".into())]);
    assert_eq!(p.feed("lo\n"), [Piece::CallArgs("lo".into())]);
    assert_eq!(p.feed("</parameter>\n<parameter=days>\n1"), [Piece::CallArgs("\"".into())]);
    assert_eq!(p.feed("2\n</parameter>\n</function>\n</tool_call>"), [Piece::CallArgs(", \"days\": 12}".into()), Piece::CallEnd]);
    // Cut by the token limit: closed where it stands.
    check(&o, "<tool_call>\n<function=get_weather>\n<parameter=city>\nOs", &[raw_call("get_weather", "{\"city\": \"Os\"}")]);
}

#[test]
fn mistral() {
    let o = opts(Family::Mistral, false);
    check(
        &o,
        "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"search\", \"arguments\": {\"query\": \"ü\"}}]",
        &[call("get_weather", json!({"city": "Paris"})), call("search", json!({"query": "ü"}))],
    );
    check(
        &o,
        "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]search[ARGS]{\"query\": \"{[]}\"}",
        &[call("get_weather", json!({"city": "Paris"})), call("search", json!({"query": "{[]}"}))],
    );
    check(&o, "Sure: no tools needed.", &[text("Sure: no tools needed.")]);
    let bad = "[TOOL_CALLS]get weather[ARGS]{\"city\": 1}";
    check(&o, bad, &[text(bad)]);
}

/// Magistral: `[THINK]...[/THINK]` then the answer or `[TOOL_CALLS]`.
#[test]
fn mistral_think() {
    let tmpl = "{%- if m.thinking %}{{- '[THINK]' + m.thinking + '[/THINK]' }}{%- endif %} [TOOL_CALLS]";
    let think = ThinkTags::detect(tmpl).unwrap();
    assert_eq!((think.open.as_str(), think.close.as_str()), ("[THINK]", "[/THINK]"));
    assert_eq!(ThinkTags::detect("<think>\n"), Some(ThinkTags::think()));
    assert_eq!(ThinkTags::detect("{{ messages }}"), None);
    let o = Options { think: Some(think), ..opts(Family::detect(tmpl), false) };
    check(
        &o,
        "[THINK]The user wants Paris [weather].[/THINK][TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}",
        &[Piece::Reasoning("The user wants Paris [weather].".into()), call("get_weather", json!({"city": "Paris"}))],
    );
    check(&o, "[THINK]Simple.[/THINK]\n\nHello!", &[Piece::Reasoning("Simple.".into()), text("Hello!")]);
}

#[test]
fn llama3() {
    let o = opts(Family::Llama3, false);
    check(
        &o,
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
        &[call("get_weather", json!({"city": "Paris"}))],
    );
    check(
        &o,
        "<|python_tag|>{\"type\": \"function\", \"name\": \"search\", \"parameters\": {\"query\": \"日本\"}}",
        &[call("search", json!({"query": "日本"}))],
    );
    check(&o, "The answer is 4.", &[text("The answer is 4.")]);
}

#[test]
fn lfm2() {
    let o = opts(Family::Lfm2, false);
    check(
        &o,
        "<|tool_call_start|>[get_weather(city=\"Paris\", days=2), search(query='it\\'s \\u00e9', filters={'k': [1, 2.5, True, None]})]<|tool_call_end|>Checking.",
        &[
            call("get_weather", json!({"city": "Paris", "days": 2})),
            call("search", json!({"query": "it's é", "filters": {"k": [1, 2.5, true, null]}})),
            text("Checking."),
        ],
    );
    let bad = "<|tool_call_start|>[get_weather(city=Paris)]<|tool_call_end|>";
    check(&o, bad, &[text(bad)]);
}

#[test]
fn kimi() {
    let o = opts(Family::Kimi, false);
    check(
        &o,
        "Let me look.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_call_begin|>functions.search:1<|tool_call_argument_begin|>{\"query\": \"x\"}<|tool_call_end|><|tool_calls_section_end|>",
        &[text("Let me look."), call("get_weather", json!({"city": "Paris"})), call("search", json!({"query": "x"}))],
    );
}

/// Model outputs from llama.cpp's own chat tests (tests/test-chat.cpp in the llama-cpp-python
/// 0.3.36 sdist), parsed to the calls that file expects.
#[test]
fn llamacpp_reference_outputs() {
    let lfm = opts(Family::Lfm2, false);
    check(
        &lfm,
        "<|tool_call_start|>[python(code=\"def hello():\\n    print('hey')\")]<|tool_call_end|>",
        &[call("python", json!({"code": "def hello():\n    print('hey')"}))],
    );
    check(
        &lfm,
        "<|tool_call_start|>[Calendar.create_event(title=\"demo\", participants=[\"Alice\", \"Bob\"])]<|tool_call_end|>",
        &[call("Calendar.create_event", json!({"title": "demo", "participants": ["Alice", "Bob"]}))],
    );
    check(&lfm, "<|tool_call_start|>[empty_args()]<|tool_call_end|>", &[call("empty_args", json!({}))]);
    check(
        &lfm,
        "<|tool_call_start|>[set_config(config={\"enabled\": true, \"note\": null})]<|tool_call_end|>",
        &[call("set_config", json!({"config": {"enabled": true, "note": null}}))],
    );
    let kimi = opts(Family::Kimi, true);
    check(
        &kimi,
        "<think>I need to call two functions</think><|tool_calls_section_begin|><|tool_call_begin|>functions.special_function:0<|tool_call_argument_begin|>{\"arg1\": 1}<|tool_call_end|><|tool_call_begin|>functions.html:1<|tool_call_argument_begin|>{\"markup\": \"<p>test</p>\"}<|tool_call_end|><|tool_calls_section_end|>",
        &[
            Piece::Reasoning("I need to call two functions".into()),
            call("special_function", json!({"arg1": 1})),
            call("html", json!({"markup": "<p>test</p>"})),
        ],
    );
    let mistral = opts(Family::Mistral, false);
    check(
        &mistral,
        "[TOOL_CALLS]special_function[ARGS]{\"arg1\": 1}[TOOL_CALLS]special_function_with_opt[ARGS]{\"arg1\": 1, \"arg2\": 2}",
        &[call("special_function", json!({"arg1": 1})), call("special_function_with_opt", json!({"arg1": 1, "arg2": 2}))],
    );
    // A partial call at the end of the output (llama.cpp streams it; the end of a whole output
    // without the closer is text here, never a half call).
    check(&lfm, "<|tool_call_start|>[special_function(arg1=", &[text("<|tool_call_start|>[special_function(arg1=")]);
}

fn reasoning(s: &str) -> Piece {
    Piece::Reasoning(s.into())
}

/// gpt-oss's harmony messages, as the model writes them after the prompt's `<|start|>assistant`.
/// `<|call|>` and `<|return|>` end generation (the engine gives out neither), so outputs are
/// checked both with and without their last closer.
#[test]
fn harmony() {
    let o = opts(Family::Harmony, true);
    let both = |out: &str, want: &[Piece]| {
        check(&o, out, want);
        for closer in ["<|return|>", "<|call|>"] {
            if let Some(cut) = out.strip_suffix(closer) {
                check(&o, cut, want);
            }
        }
    };
    both(
        "<|channel|>analysis<|message|>The user greets. Answer briefly.<|end|><|start|>assistant<|channel|>final<|message|>Hello! How can I help?<|return|>",
        &[reasoning("The user greets. Answer briefly."), text("Hello! How can I help?")],
    );
    // A call, its recipient after the channel, with and without `<|constrain|>json`.
    let weather = call("get_weather", json!({"city": "Oslo", "days": 2}));
    both(
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\", \"days\": 2}<|call|>",
        &[reasoning("Need weather."), weather.clone()],
    );
    both(
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather<|message|>{\"city\": \"Oslo\", \"days\": 2}<|call|>",
        &[reasoning("Need weather."), weather.clone()],
    );
    // The recipient in the role's place, before the channel.
    both(
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Oslo\", \"days\": 2}<|call|>",
        &[reasoning("Need weather."), weather.clone()],
    );
    both(
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{\"city\": \"Oslo\", \"days\": 2}<|call|>",
        &[reasoning("Need weather."), weather.clone()],
    );
    // The output may open with the recipient (the prompt wrote `<|start|>assistant`).
    both(
        " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Oslo\", \"days\": 2}<|call|>",
        std::slice::from_ref(&weather),
    );
    // Two calls; a preamble (commentary without a recipient) is text.
    both(
        "<|channel|>analysis<|message|>Two lookups.<|end|><|start|>assistant<|channel|>commentary<|message|>Checking both.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\", \"days\": 2}<|call|><|start|>assistant<|channel|>commentary to=functions.search <|constrain|>json<|message|>{\"query\": \"Zürich 🦙 \\\"<|\\\" }\"}<|call|>",
        &[
            reasoning("Two lookups."),
            text("Checking both."),
            weather.clone(),
            call("search", json!({"query": "Zürich 🦙 \"<|\" }"})),
        ],
    );
    // A body that is not JSON comes back as text (the markup left out).
    both(
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": Oslo}<|call|>",
        &[text("{\"city\": Oslo}")],
    );
    // A call cut by the token limit: what it has, as text.
    check(&o, "<|channel|>commentary to=functions.search<|message|>{\"query\": \"a", &[text("{\"query\": \"a")]);
    // No markup at all: text, as written.
    check(&o, "The answer is 4. a <| b to= c", &[text("The answer is 4. a <| b to= c")]);
    check(&o, "to be or not", &[text("to be or not")]);
    // Thinking cut by the token limit stays thinking; a header the output ended in is dropped.
    check(&o, "<|channel|>analysis<|message|>still thinking", &[reasoning("still thinking")]);
    check(&o, "<|channel|>analysis<|message|>done<|end|><|start|>assistant<|channel|>fin", &[reasoning("done")]);
    // A message begun without the previous one's closer.
    check(&o, "<|channel|>analysis<|message|>a<|start|>assistant<|channel|>final<|message|>b", &[reasoning("a"), text("b")]);
    // Without the reasoning split, the analysis is text.
    check(
        &opts(Family::Harmony, false),
        "<|channel|>analysis<|message|>Think. <|end|><|start|>assistant<|channel|>final<|message|>Answer.",
        &[text("Think. Answer.")],
    );
}

#[test]
fn harmony_streamed_arguments() {
    let mut o = opts(Family::Harmony, true);
    o.stream_args = true;
    let out = "<|channel|>analysis<|message|>go<|end|><|start|>assistant<|channel|>commentary to=functions.search <|constrain|>json<|message|>{\"query\": \"a } \\\" { ü\"}<|call|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{}";
    check(&o, out, &[reasoning("go"), raw_call("search", "{\"query\": \"a } \\\" { ü\"}"), raw_call("get_weather", "{}")]);
    // The name goes out at `<|message|>`, the arguments as they arrive; a closer's start waits.
    let mut p = Parser::new(o.clone());
    let got = p.feed("<|channel|>commentary to=functions.search<|message|>{\"query\": \"ab");
    assert_eq!(got, [Piece::CallStart("search".into()), Piece::CallArgs("{\"query\": \"ab".into())]);
    assert_eq!(p.feed("c\"}<|ca"), [Piece::CallArgs("c\"}".into())]);
    assert_eq!(p.feed("ll|>"), [Piece::CallEnd]);
    assert_eq!(p.finish(), []);
}

#[test]
fn harmony_detected_from_the_template() {
    let tmpl = "{{- \"<|start|>assistant<|channel|>analysis<|message|>\" + m.thinking + \"<|end|>\" }} to=functions.{{ name }}<|constrain|>json";
    assert_eq!(Family::detect(tmpl), Family::Harmony);
    assert_eq!(Family::from_name("harmony"), Some(Family::Harmony));
    assert_eq!(ThinkTags::detect(tmpl), Some(ThinkTags::harmony()));
}

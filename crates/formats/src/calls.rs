//! A chat model's output split into what an agent reads: the answer (`content`), the thinking
//! (`reasoning_content`) and tool calls, as a streaming state machine. Each model family writes
//! its calls in its own markup (Hermes `<tool_call>{json}</tool_call>`, Qwen3.5's XML,
//! Mistral's `[TOOL_CALLS]`, LFM2's Python calls, Kimi's sections, Llama 3's bare JSON, gpt-oss's
//! harmony channels); the family is chosen from the chat template (`Family::detect`) or named by the server's flag.
//!
//! The contract, tested at every byte offset the stream can be cut at: what comes out does not
//! depend on how the text arrived. Markup never reaches the text: anything that may still turn
//! into an opener is held back until it cannot. A call whose body does not parse comes back as
//! the text it was, never as an error. Written by hand (not a grammar crate): it is a few
//! string scans per token, and the held-back rule is the whole of its subtlety.

use serde_json::{Map, Value};

mod harmony;

/// How a model family writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (Qwen2.5, Qwen3, Hermes).
    Hermes,
    /// `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>`
    /// (Qwen3.5, Qwen3-Coder).
    QwenXml,
    /// `<|python_tag|>` or bare `{"name": ..., "parameters": {...}}` (Llama 3.1-3.3).
    Llama3,
    /// `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` or `[TOOL_CALLS]NAME[ARGS]{...}`.
    Mistral,
    /// `<|tool_call_start|>[f(a=1, b="x"), g()]<|tool_call_end|>` (LFM2, LFM2.5).
    Lfm2,
    /// `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>
    /// {...}<|tool_call_end|>...<|tool_calls_section_end|>` (Kimi K2).
    Kimi,
    /// No markup of its own: JSON calls in a fenced block or as the whole answer.
    Json,
    /// gpt-oss's harmony messages: `<|channel|>analysis<|message|>...<|end|>` (reasoning),
    /// `<|channel|>final<|message|>...`, `<|channel|>commentary to=functions.NAME
    /// <|constrain|>json<|message|>{...}<|call|>` (`harmony.rs`).
    Harmony,
}

impl Family {
    pub const NAMES: [&'static str; 8] = ["hermes", "qwen-xml", "llama3", "mistral", "lfm2", "kimi", "json", "harmony"];

    pub fn name(self) -> &'static str {
        match self {
            Family::Hermes => "hermes",
            Family::QwenXml => "qwen-xml",
            Family::Llama3 => "llama3",
            Family::Mistral => "mistral",
            Family::Lfm2 => "lfm2",
            Family::Kimi => "kimi",
            Family::Json => "json",
            Family::Harmony => "harmony",
        }
    }

    pub fn from_name(s: &str) -> Option<Family> {
        Family::NAMES.iter().position(|n| *n == s).map(|i| FAMILIES[i])
    }

    /// The family a chat template writes its calls in (by the markup it shows the model).
    pub fn detect(template: &str) -> Family {
        if template.contains("<|channel|>") && template.contains("<|message|>") {
            Family::Harmony
        } else if template.contains("<|tool_calls_section_begin|>") || template.contains("<|tool_call_begin|>") {
            Family::Kimi
        } else if template.contains("<|tool_call_start|>") {
            Family::Lfm2
        } else if template.contains("[TOOL_CALLS]") {
            Family::Mistral
        } else if template.contains("<function=") && template.contains("<parameter=") {
            Family::QwenXml
        } else if template.contains("<tool_call>") {
            Family::Hermes
        } else if template.contains("<|python_tag|>") || template.contains("<|eom_id|>") {
            Family::Llama3
        } else {
            Family::Json
        }
    }

    /// The markup that opens a call, and what closes it.
    fn markers(self) -> &'static [(&'static str, Close)] {
        match self {
            Family::Hermes | Family::QwenXml => &[("<tool_call>", Close::Tag("</tool_call>"))],
            Family::Llama3 => &[("<|python_tag|>", Close::Json)],
            Family::Mistral => &[("[TOOL_CALLS]", Close::Mistral)],
            Family::Lfm2 => &[("<|tool_call_start|>", Close::Tag("<|tool_call_end|>"))],
            Family::Kimi => &[("<|tool_calls_section_begin|>", Close::Tag("<|tool_calls_section_end|>"))],
            // Harmony's messages are split by their own states (`harmony.rs`).
            Family::Json | Family::Harmony => &[],
        }
    }
}

const FAMILIES: [Family; 8] =
    [Family::Hermes, Family::QwenXml, Family::Llama3, Family::Mistral, Family::Lfm2, Family::Kimi, Family::Json, Family::Harmony];

/// What ends a call's body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Close {
    /// A closing tag.
    Tag(&'static str),
    /// The end of one JSON value.
    Json,
    /// Mistral: a JSON array, or NAME[ARGS] and one JSON object.
    Mistral,
}

/// The fenced-block opener of the JSON fallback (every family).
const FENCES: [&str; 2] = ["```json\n", "```\n"];
const FENCE_END: &str = "```";

/// One tool call: the function's name and its arguments as JSON text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub name: String,
    pub arguments: String,
}

/// A piece of the output, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    Reasoning(String),
    /// A call given out whole (its closer seen and its body parsed).
    Call(Call),
    /// A call whose arguments stream (`Options::stream_args`): its name once the head is
    /// read, then its arguments' JSON text as it arrives, then its end. `collapse` joins them.
    CallStart(String),
    CallArgs(String),
    CallEnd,
}

/// The pieces with each streamed call (`CallStart`, `CallArgs`..., `CallEnd`) joined into one
/// `Call`: what a whole (non-streamed) answer holds.
pub fn collapse(pieces: Vec<Piece>) -> Vec<Piece> {
    let mut out = Vec::with_capacity(pieces.len());
    let mut open: Option<Call> = None;
    for p in pieces {
        match p {
            Piece::CallStart(name) => {
                if let Some(c) = open.take() {
                    out.push(Piece::Call(c));
                }
                open = Some(Call { name, arguments: String::new() });
            }
            Piece::CallArgs(a) => {
                if let Some(c) = open.as_mut() {
                    c.arguments.push_str(&a);
                }
            }
            Piece::CallEnd => {
                if let Some(c) = open.take() {
                    out.push(Piece::Call(c));
                }
            }
            p => {
                if let Some(c) = open.take() {
                    out.push(Piece::Call(c));
                }
                out.push(p);
            }
        }
    }
    if let Some(c) = open {
        out.push(Piece::Call(c));
    }
    merge(out)
}

/// The reasoning block's tags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThinkTags {
    pub open: String,
    pub close: String,
}

impl ThinkTags {
    pub fn think() -> ThinkTags {
        ThinkTags { open: "<think>".into(), close: "</think>".into() }
    }

    /// gpt-oss's analysis message. The harmony parser splits by channel (the tags' presence
    /// only says to); the reasoning budget watches for these tags and forces `<|end|>`.
    pub fn harmony() -> ThinkTags {
        ThinkTags { open: "<|channel|>analysis<|message|>".into(), close: "<|end|>".into() }
    }

    /// The thinking block a chat template writes, by its markup: `<think>` (Qwen3, DeepSeek-R1,
    /// SmolLM3 ...), Mistral's `[THINK]` (Magistral) or harmony's analysis channel (gpt-oss);
    /// None for a template without one.
    pub fn detect(template: &str) -> Option<ThinkTags> {
        if Family::detect(template) == Family::Harmony {
            Some(ThinkTags::harmony())
        } else if template.contains("<think>") {
            Some(ThinkTags::think())
        } else if template.contains("[THINK]") {
            Some(ThinkTags { open: "[THINK]".into(), close: "[/THINK]".into() })
        } else {
            None
        }
    }
}

/// What the parser looks for, fixed per request.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Parse tool calls of this family (None: the request has no tools; all text).
    pub family: Option<Family>,
    /// The request's tools (OpenAI's list): the JSON fallback only takes calls of these names,
    /// and the XML form types parameter values by their schema.
    pub tools: Vec<Value>,
    /// Split reasoning off at these tags.
    pub think: Option<ThinkTags>,
    /// The prompt ended inside an open reasoning block (the template wrote the opener).
    pub start_in_think: bool,
    /// Stream a Hermes call's arguments as they arrive (`CallStart`/`CallArgs`/`CallEnd`)
    /// once its head `{"name": "NAME", "arguments": {` is read, instead of the whole call at
    /// its closer. The server sets it where a grammar holds the call's body (so a call that
    /// has begun is well-formed; only the token limit can cut it); a body that does not open
    /// that way is still parsed whole.
    pub stream_args: bool,
    /// `parallel_tool_calls: false`: only the first call is given out; later ones (their
    /// markup included) are left out.
    pub single_call: bool,
}

#[derive(Clone, Debug, PartialEq)]
enum State {
    Text,
    Think,
    /// Inside a call: its opener (given back as text if the body does not parse) and closer.
    Call {
        opener: String,
        close: Close,
    },
    /// Inside a fenced block of the JSON fallback.
    Fence {
        opener: String,
    },
    /// A bare JSON value at the start of the answer (the JSON fallback and Llama 3).
    Bare,
    /// Inside a streamed call's arguments object; the call's closing tag.
    Args(Nest, &'static str),
    /// After a streamed call's arguments, up to its closing tag.
    ArgsTail(&'static str),
    /// A streamed Qwen XML call (`<function=NAME>` read): between parameters; `first`: none
    /// given out yet.
    XmlParams {
        name: String,
        first: bool,
    },
    /// Inside a string parameter's value (its text streams, JSON-escaped); `lead`: its first
    /// newline (the form's, not the value's) may still come.
    XmlStr {
        name: String,
        lead: bool,
    },
    /// Inside another parameter's value (JSON, given out at its closer) after `key`.
    XmlValue {
        name: String,
        key: String,
    },
    /// The harmony family's messages (`harmony.rs`).
    Harmony(harmony::Msg),
}

/// How deep a JSON text is nested, followed across feeds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Nest {
    depth: usize,
    in_str: bool,
    esc: bool,
}

impl Nest {
    /// Follow `s` (the value's text from its first bracket on); the offset just past the
    /// bracket that closes the value, None while it stays open.
    fn scan(&mut self, s: &str) -> Option<usize> {
        for (i, &c) in s.as_bytes().iter().enumerate() {
            if self.in_str {
                if self.esc {
                    self.esc = false;
                } else if c == b'\\' {
                    self.esc = true;
                } else if c == b'"' {
                    self.in_str = false;
                }
                continue;
            }
            match c {
                b'"' => self.in_str = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        return Some(i + 1);
                    }
                }
                _ => {}
            }
        }
        None
    }
}

/// The streaming splitter of one choice.
pub struct Parser {
    opts: Options,
    names: Vec<String>,
    state: State,
    /// Text received and not yet decided.
    buf: String,
    /// Bytes of an incomplete UTF-8 character (`feed_bytes`).
    partial: Vec<u8>,
    /// Whitespace held back from the text: given out before the next text, or at the end
    /// when no call was made.
    ws: String,
    /// Any non-whitespace answer text given out (the bare-JSON form only opens before it).
    said: bool,
    /// A reasoning block or a call just ended: the whitespace that follows is a separator,
    /// not text.
    trim_lead: bool,
    calls: usize,
    /// Calls given out (`Options::single_call`), and a later call's streamed pieces being
    /// left out.
    given: usize,
    dropping: bool,
}

impl Parser {
    pub fn new(opts: Options) -> Parser {
        let names = opts
            .tools
            .iter()
            .filter_map(|t| t.get("function").and_then(|f| f.get("name")).and_then(Value::as_str))
            .map(str::to_string)
            .collect();
        let state = if opts.family == Some(Family::Harmony) {
            State::Harmony(harmony::Msg::Next)
        } else if opts.think.is_some() && opts.start_in_think {
            State::Think
        } else {
            State::Text
        };
        Parser {
            opts,
            names,
            state,
            buf: String::new(),
            partial: Vec::new(),
            ws: String::new(),
            said: false,
            trim_lead: false,
            calls: 0,
            given: 0,
            dropping: false,
        }
    }

    /// Feed raw bytes; a character cut between two feeds is joined first.
    pub fn feed_bytes(&mut self, bytes: &[u8]) -> Vec<Piece> {
        self.partial.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.partial) {
            Ok(_) => self.partial.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.partial.len(),
        };
        let rest = self.partial.split_off(valid);
        let head = std::mem::replace(&mut self.partial, rest);
        self.feed(&String::from_utf8_lossy(&head))
    }

    pub fn feed(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        self.run(false, &mut out);
        self.keep(merge(out))
    }

    /// The end of the output: whatever was held back is decided.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        if !self.partial.is_empty() {
            let p = std::mem::take(&mut self.partial);
            self.buf.push_str(&String::from_utf8_lossy(&p));
        }
        self.run(true, &mut out);
        if self.calls == 0 && !self.ws.is_empty() && !self.trim_lead {
            out.push(Piece::Text(std::mem::take(&mut self.ws)));
        }
        self.keep(merge(out))
    }

    /// `Options::single_call`: the pieces of every call after the first left out.
    fn keep(&mut self, pieces: Vec<Piece>) -> Vec<Piece> {
        if !self.opts.single_call {
            return pieces;
        }
        pieces
            .into_iter()
            .filter(|p| match p {
                Piece::Call(_) | Piece::CallStart(_) => {
                    let first = self.given == 0;
                    self.given += 1;
                    self.dropping = !first && matches!(p, Piece::CallStart(_));
                    first
                }
                Piece::CallArgs(_) => !self.dropping,
                Piece::CallEnd => !std::mem::take(&mut self.dropping),
                Piece::Text(_) | Piece::Reasoning(_) => true,
            })
            .collect()
    }

    fn text(&mut self, s: &str, out: &mut Vec<Piece>) {
        if s.is_empty() {
            return;
        }
        if s.trim().is_empty() {
            self.ws.push_str(s);
            return;
        }
        let mut t = std::mem::take(&mut self.ws);
        t.push_str(s);
        if self.trim_lead {
            t = t.trim_start().to_string();
            self.trim_lead = false;
        }
        // Trailing whitespace waits (it may precede a call).
        let keep = t.trim_end().len();
        self.ws = t[keep..].to_string();
        t.truncate(keep);
        self.said = true;
        out.push(Piece::Text(t));
    }

    fn call(&mut self, c: Call, out: &mut Vec<Piece>) {
        self.ws.clear();
        self.trim_lead = true;
        self.calls += 1;
        out.push(Piece::Call(c));
    }

    /// Openers the text state watches for, with what each starts.
    fn openers(&self) -> Vec<(String, State)> {
        let mut v = Vec::new();
        if let Some(t) = &self.opts.think {
            v.push((t.open.clone(), State::Think));
        }
        if let Some(f) = self.opts.family {
            for (o, c) in f.markers() {
                v.push((o.to_string(), State::Call { opener: o.to_string(), close: *c }));
            }
            for fence in FENCES {
                v.push((fence.to_string(), State::Fence { opener: fence.to_string() }));
            }
        }
        v
    }

    fn run(&mut self, end: bool, out: &mut Vec<Piece>) {
        loop {
            match self.state.clone() {
                State::Text => {
                    // A bare JSON value may open the answer (before any text).
                    if self.opts.family.is_some() && !self.said {
                        let t = self.buf.trim_start();
                        // Not where an opener starts (Mistral's "[TOOL_CALLS]" begins with '[').
                        let opener = self.openers().iter().any(|(o, _)| o.starts_with(t) || t.starts_with(o.as_str()));
                        if !opener && (t.starts_with('{') || t.starts_with('[')) {
                            let lead = self.buf.len() - t.len();
                            let lead_ws = self.buf[..lead].to_string();
                            self.ws.push_str(&lead_ws);
                            self.buf.drain(..lead);
                            self.state = State::Bare;
                            continue;
                        }
                        if t.is_empty() && !end {
                            return;
                        }
                    }
                    let openers = self.openers();
                    let first =
                        openers.iter().filter_map(|(o, st)| self.buf.find(o.as_str()).map(|i| (i, o, st))).min_by_key(|x| x.0);
                    if let Some((i, o, st)) = first {
                        let before = self.buf[..i].to_string();
                        self.text(&before, out);
                        let n = i + o.len();
                        self.buf.drain(..n);
                        self.state = st.clone();
                        continue;
                    }
                    let hold = if end { 0 } else { held(&self.buf, openers.iter().map(|(o, _)| o.as_str())) };
                    let cut = self.buf.len() - hold;
                    let s: String = self.buf.drain(..cut).collect();
                    self.text(&s, out);
                    return;
                }
                State::Think => {
                    let close = self.opts.think.as_ref().map(|t| t.close.clone()).unwrap_or_default();
                    if let Some(i) = self.buf.find(&close) {
                        let r: String = self.buf.drain(..i).collect();
                        self.buf.drain(..close.len());
                        if !r.is_empty() {
                            out.push(Piece::Reasoning(r));
                        }
                        self.trim_lead = true;
                        self.state = State::Text;
                        continue;
                    }
                    let hold = if end { 0 } else { held(&self.buf, [close.as_str()].into_iter()) };
                    let r: String = self.buf.drain(..self.buf.len() - hold).collect();
                    if !r.is_empty() {
                        out.push(Piece::Reasoning(r));
                    }
                    if end {
                        self.state = State::Text;
                    }
                    return;
                }
                State::Call { opener, close } => {
                    if self.opts.stream_args
                        && self.opts.family == Some(Family::Hermes)
                        && let Close::Tag(tag) = close
                        && let Head::Yes(name, n) = hermes_head(&self.buf)
                    {
                        self.ws.clear();
                        self.calls += 1;
                        self.buf.drain(..n);
                        out.push(Piece::CallStart(name));
                        self.state = State::Args(Nest::default(), tag);
                        continue;
                    }
                    if self.opts.stream_args
                        && self.opts.family == Some(Family::QwenXml)
                        && let Some((name, n)) = xml_head(&self.buf)
                    {
                        self.ws.clear();
                        self.calls += 1;
                        self.buf.drain(..n);
                        out.push(Piece::CallStart(name.clone()));
                        self.state = State::XmlParams { name, first: true };
                        continue;
                    }
                    let body_end = match close {
                        Close::Tag(t) => self.buf.find(t).map(|i| (i, i + t.len())),
                        Close::Json => json_end(&self.buf).map(|i| (i, i)),
                        Close::Mistral => mistral_end(&self.buf).map(|i| (i, i)),
                    };
                    let Some((i, j)) = body_end.or(end.then_some((self.buf.len(), self.buf.len()))) else { return };
                    let body = self.buf[..i].to_string();
                    let whole: String = self.buf.drain(..j).collect();
                    let family = self.opts.family.unwrap_or(Family::Json);
                    match parse_body(family, &body, &self.opts.tools) {
                        Some(calls) if (i < j || !matches!(close, Close::Tag(_))) => {
                            for c in calls {
                                self.call(c, out);
                            }
                        }
                        _ => {
                            let lit = format!("{opener}{whole}");
                            self.text(&lit, out);
                        }
                    }
                    self.state = State::Text;
                }
                State::Fence { opener } => {
                    let Some(i) = self.buf.find(FENCE_END) else {
                        if end {
                            let lit = format!("{opener}{}", std::mem::take(&mut self.buf));
                            self.text(&lit, out);
                            self.state = State::Text;
                        }
                        return;
                    };
                    let body = self.buf[..i].to_string();
                    let whole: String = self.buf.drain(..i + FENCE_END.len()).collect();
                    match json_calls(&body, &self.names) {
                        Some(calls) => {
                            for c in calls {
                                self.call(c, out);
                            }
                        }
                        None => {
                            let lit = format!("{opener}{whole}");
                            self.text(&lit, out);
                        }
                    }
                    self.state = State::Text;
                }
                State::Args(mut nest, tag) => {
                    let done = nest.scan(&self.buf);
                    let n = done.unwrap_or(self.buf.len());
                    let a: String = self.buf.drain(..n).collect();
                    if !a.is_empty() {
                        out.push(Piece::CallArgs(a));
                    }
                    if done.is_some() {
                        self.state = State::ArgsTail(tag);
                        continue;
                    }
                    if end {
                        // Cut by the token limit: the call ends with what it has.
                        out.push(Piece::CallEnd);
                        self.trim_lead = true;
                        self.state = State::Text;
                    } else {
                        self.state = State::Args(nest, tag);
                    }
                    return;
                }
                State::ArgsTail(tag) => {
                    // The body's closing brace and the separator before the closing tag.
                    match self.buf.find(tag) {
                        Some(i) => {
                            self.buf.drain(..i + tag.len());
                        }
                        None if end => self.buf.clear(),
                        None => return,
                    }
                    out.push(Piece::CallEnd);
                    self.trim_lead = true;
                    self.state = State::Text;
                }
                State::XmlParams { name, first } => {
                    let t = self.buf.trim_start();
                    let lead = self.buf.len() - t.len();
                    if let Some(r) = t.strip_prefix("<parameter=")
                        && let Some(gt) = r.find('>')
                    {
                        let p = r[..gt].trim().to_string();
                        let n = lead + "<parameter=".len() + gt + 1;
                        self.buf.drain(..n);
                        let key = format!("{}{}: ", if first { "{" } else { ", " }, Value::String(p.clone()));
                        if param_type(&self.opts.tools, &name, &p) == Some("string") {
                            out.push(Piece::CallArgs(format!("{key}\"")));
                            self.state = State::XmlStr { name, lead: true };
                        } else {
                            self.state = State::XmlValue { name, key };
                        }
                        continue;
                    }
                    if t.starts_with("</function>") {
                        self.buf.drain(..lead + "</function>".len());
                        out.push(Piece::CallArgs(if first { "{}" } else { "}" }.into()));
                        self.state = State::ArgsTail("</tool_call>");
                        continue;
                    }
                    // Still becoming one of the two (a parameter's name not yet closed).
                    let maybe = t.starts_with("<parameter=") || "<parameter=".starts_with(t) || "</function>".starts_with(t);
                    if !end && maybe {
                        return;
                    }
                    // Cut by the token limit (or, unheld, off the form): the call ends here.
                    out.push(Piece::CallArgs(if first { "{}" } else { "}" }.into()));
                    self.state = State::ArgsTail("</tool_call>");
                }
                State::XmlStr { name, lead } => {
                    const END: &str = "\n</parameter>";
                    let mut lead = lead;
                    if lead {
                        if self.buf.is_empty() && !end {
                            return;
                        }
                        if self.buf.starts_with('\n') {
                            self.buf.drain(..1);
                        }
                        lead = false;
                    }
                    let (upto, done) = match self.buf.find(END) {
                        Some(i) => (i, true),
                        // A newline a closer may follow, or a piece of the closer, waits.
                        None if !end => (self.buf.len() - held(&self.buf, [END].into_iter()), false),
                        None => (self.buf.len(), false),
                    };
                    let v: String = self.buf.drain(..upto).collect();
                    let q = Value::String(v).to_string();
                    let esc = &q[1..q.len() - 1];
                    if done {
                        self.buf.drain(..END.len());
                        out.push(Piece::CallArgs(format!("{esc}\"")));
                        self.state = State::XmlParams { name, first: false };
                        continue;
                    }
                    if !esc.is_empty() {
                        out.push(Piece::CallArgs(esc.to_string()));
                    }
                    if end {
                        out.push(Piece::CallArgs("\"}".into()));
                        self.state = State::ArgsTail("</tool_call>");
                        continue;
                    }
                    self.state = State::XmlStr { name, lead };
                    return;
                }
                State::XmlValue { name, key } => {
                    let close = self.buf.find("</parameter>");
                    let Some(i) = close.or(end.then_some(self.buf.len())) else { return };
                    let raw: String = self.buf.drain(..i).collect();
                    if close.is_some() {
                        self.buf.drain(.."</parameter>".len());
                    }
                    let mut v = raw.as_str();
                    v = v.strip_prefix('\n').unwrap_or(v);
                    v = v.strip_suffix('\n').unwrap_or(v);
                    let value = serde_json::from_str::<Value>(v).unwrap_or_else(|_| Value::String(v.to_string()));
                    out.push(Piece::CallArgs(format!("{key}{value}")));
                    self.state = State::XmlParams { name, first: false };
                }
                State::Harmony(m) => {
                    if !self.harmony(m, end, out) {
                        return;
                    }
                }
                State::Bare => {
                    let Some(i) = json_end(&self.buf).or(end.then_some(self.buf.len())) else { return };
                    let body: String = self.buf.drain(..i).collect();
                    // Llama 3 writes `parameters`; its calls need no declared name check
                    // beyond the fallback's.
                    match json_calls(&body, &self.names) {
                        Some(calls) => {
                            for c in calls {
                                self.call(c, out);
                            }
                        }
                        None => {
                            self.text(&body, out);
                            // The answer has begun: no bare value opens again.
                            self.said = true;
                        }
                    }
                    self.state = State::Text;
                }
            }
        }
    }
}

/// Adjacent pieces of one kind joined (a feed gives out at most one text and one reasoning run
/// between calls).
fn merge(v: Vec<Piece>) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::with_capacity(v.len());
    for p in v {
        match (out.last_mut(), p) {
            (Some(Piece::Text(a)), Piece::Text(b)) => a.push_str(&b),
            (Some(Piece::Reasoning(a)), Piece::Reasoning(b)) => a.push_str(&b),
            (Some(Piece::CallArgs(a)), Piece::CallArgs(b)) => a.push_str(&b),
            (_, p) => out.push(p),
        }
    }
    out
}

/// Bytes at the end of `buf` that may be the start of one of `markers` (held back).
fn held<'a>(buf: &str, markers: impl Iterator<Item = &'a str>) -> usize {
    let mut best = 0;
    for m in markers {
        for k in (1..m.len().min(buf.len() + 1)).rev() {
            if k <= best {
                break;
            }
            if buf.is_char_boundary(buf.len() - k) && m.is_char_boundary(k) && buf.ends_with(&m[..k]) {
                best = k;
                break;
            }
        }
    }
    best
}

/// The byte offset just past the first complete JSON value in `s` (leading whitespace
/// allowed), None while it is incomplete. Only the nesting is followed; the value is parsed
/// later.
fn json_end(s: &str) -> Option<usize> {
    let t = s.trim_start();
    if !(t.starts_with('{') || t.starts_with('[')) {
        return None;
    }
    Nest::default().scan(t).map(|i| s.len() - t.len() + i)
}

/// A Hermes body's head, `{"name": "NAME", "arguments": ` before the arguments' `{`: the name
/// and the offset of that brace. Wait while the text so far may still become one.
enum Head {
    Yes(String, usize),
    No,
    Wait,
}

fn hermes_head(s: &str) -> Head {
    let b = s.as_bytes();
    let mut i = 0;
    let ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    let lit = |i: &mut usize, l: &[u8]| -> Option<bool> {
        let n = l.len().min(b.len() - *i);
        if b[*i..*i + n] != l[..n] {
            return Some(false);
        }
        *i += n;
        (n == l.len()).then_some(true)
    };
    macro_rules! step {
        ($l:expr) => {
            ws(&mut i);
            match lit(&mut i, $l) {
                Some(true) => {}
                Some(false) => return Head::No,
                None => return Head::Wait,
            }
        };
    }
    step!(b"{");
    step!(b"\"name\"");
    step!(b":");
    step!(b"\"");
    let st = i;
    while i < b.len() && b[i] != b'"' {
        if b[i] == b'\\' {
            return Head::No;
        }
        i += 1;
    }
    if i == b.len() {
        return Head::Wait;
    }
    let name = &s[st..i];
    if !valid_name(name) {
        return Head::No;
    }
    i += 1;
    step!(b",");
    step!(b"\"arguments\"");
    step!(b":");
    ws(&mut i);
    match b.get(i) {
        None => Head::Wait,
        Some(b'{') => Head::Yes(name.to_string(), i),
        Some(_) => Head::No,
    }
}

/// A Qwen XML body's head, `<function=NAME>`: the name and the offset past it.
fn xml_head(s: &str) -> Option<(String, usize)> {
    let t = s.trim_start();
    let r = t.strip_prefix("<function=")?;
    let gt = r.find('>')?;
    let name = r[..gt].trim();
    valid_name(name).then(|| (name.to_string(), s.len() - t.len() + "<function=".len() + gt + 1))
}

/// Mistral's body: a JSON array, or NAME[ARGS] followed by one JSON object (possibly several
/// such, each after its own [TOOL_CALLS], which the text state opens again).
fn mistral_end(s: &str) -> Option<usize> {
    let t = s.trim_start();
    let lead = s.len() - t.len();
    if t.starts_with('[') || t.starts_with('{') {
        return json_end(s);
    }
    let a = t.find("[ARGS]")?;
    json_end(&t[a + 6..]).map(|j| lead + a + 6 + j)
}

/// A body of `family`'s markup as calls; None when it is not a well-formed call.
fn parse_body(family: Family, body: &str, tools: &[Value]) -> Option<Vec<Call>> {
    match family {
        Family::Hermes | Family::Llama3 | Family::Json | Family::Harmony => json_calls(body, &[]),
        Family::QwenXml => xml_call(body, tools).map(|c| vec![c]).or_else(|| json_calls(body, &[])),
        Family::Mistral => {
            let t = body.trim();
            if t.starts_with('[') || t.starts_with('{') {
                return json_calls(t, &[]);
            }
            let a = t.find("[ARGS]")?;
            let name = t[..a].trim();
            let args: Value = serde_json::from_str(t[a + 6..].trim()).ok()?;
            (valid_name(name) && args.is_object()).then(|| vec![Call { name: name.into(), arguments: args.to_string() }])
        }
        Family::Lfm2 => python_calls(body),
        Family::Kimi => kimi_calls(body),
    }
}

fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'))
}

/// JSON calls: one object `{"name", "arguments" | "parameters"}` (Llama 3 may add
/// `"type": "function"`; OpenAI's `{"function": {...}}` form too) or a list of them. With
/// `names` non-empty (the fallback), every name must be one of them.
fn json_calls(body: &str, names: &[String]) -> Option<Vec<Call>> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let list = match v {
        Value::Array(a) if !a.is_empty() => a,
        o @ Value::Object(_) => vec![o],
        _ => return None,
    };
    let mut out = Vec::with_capacity(list.len());
    for item in list {
        let Value::Object(mut o) = item else { return None };
        if let Some(Value::Object(f)) = o.remove("function") {
            o = f;
        }
        let name = o.get("name")?.as_str()?.to_string();
        if !valid_name(&name) || (!names.is_empty() && !names.contains(&name)) {
            return None;
        }
        let args = o.get("arguments").or_else(|| o.get("parameters")).cloned().unwrap_or(Value::Object(Map::new()));
        let arguments = match args {
            Value::Object(_) => args.to_string(),
            // Arguments already as JSON text (OpenAI's own wire form).
            Value::String(s) if serde_json::from_str::<Value>(&s).is_ok_and(|v| v.is_object()) => s,
            _ => return None,
        };
        out.push(Call { name, arguments });
    }
    Some(out)
}

/// The declared JSON-schema type of `param` of tool `name` ("string", "integer" ...).
fn param_type<'a>(tools: &'a [Value], name: &str, param: &str) -> Option<&'a str> {
    let f = tools.iter().filter_map(|t| t.get("function")).find(|f| f.get("name").and_then(Value::as_str) == Some(name))?;
    f.get("parameters")?.get("properties")?.get(param)?.get("type")?.as_str()
}

/// Qwen3.5's XML form: `<function=NAME>` then `<parameter=P>\nVALUE\n</parameter>` each, then
/// `</function>`. A value is a string when the schema says so (or it is not JSON), else JSON.
fn xml_call(body: &str, tools: &[Value]) -> Option<Call> {
    let t = body.trim();
    let rest = t.strip_prefix("<function=")?;
    let gt = rest.find('>')?;
    let name = rest[..gt].trim().to_string();
    if !valid_name(&name) {
        return None;
    }
    let mut rest = rest[gt + 1..].trim_start();
    let mut args = Map::new();
    loop {
        if let Some(r) = rest.strip_prefix("</function>") {
            if !r.trim().is_empty() {
                return None;
            }
            break;
        }
        let r = rest.strip_prefix("<parameter=")?;
        let gt = r.find('>')?;
        let p = r[..gt].trim().to_string();
        let r = &r[gt + 1..];
        let close = r.find("</parameter>")?;
        let mut v = &r[..close];
        v = v.strip_prefix('\n').unwrap_or(v);
        v = v.strip_suffix('\n').unwrap_or(v);
        let value = match param_type(tools, &name, &p) {
            Some("string") => Value::String(v.to_string()),
            _ => serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_string())),
        };
        args.insert(p, value);
        rest = r[close + "</parameter>".len()..].trim_start();
    }
    Some(Call { name, arguments: Value::Object(args).to_string() })
}

/// Kimi K2: `<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>`
/// repeated inside the section.
fn kimi_calls(body: &str) -> Option<Vec<Call>> {
    let mut out = Vec::new();
    let mut rest = body.trim();
    while !rest.is_empty() {
        let r = rest.strip_prefix("<|tool_call_begin|>")?;
        let a = r.find("<|tool_call_argument_begin|>")?;
        let id = r[..a].trim();
        let name = id.strip_prefix("functions.").unwrap_or(id);
        let name = name.rsplit_once(':').map_or(name, |(n, _)| n).to_string();
        let r = &r[a + "<|tool_call_argument_begin|>".len()..];
        let e = r.find("<|tool_call_end|>")?;
        let args: Value = serde_json::from_str(r[..e].trim()).ok()?;
        if !valid_name(&name) || !args.is_object() {
            return None;
        }
        out.push(Call { name, arguments: args.to_string() });
        rest = r[e + "<|tool_call_end|>".len()..].trim();
    }
    (!out.is_empty()).then_some(out)
}

/// LFM2's Python calls: `[f(a=1, b="x"), g()]` with literal arguments (strings, numbers,
/// True/False/None, lists, dicts).
fn python_calls(body: &str) -> Option<Vec<Call>> {
    let mut p = Py { s: body.trim().as_bytes(), i: 0 };
    let bracket = p.eat(b'[');
    let mut out = Vec::new();
    loop {
        p.ws();
        let name = p.ident()?;
        p.ws();
        if !p.eat(b'(') {
            return None;
        }
        let mut args = Map::new();
        loop {
            p.ws();
            if p.eat(b')') {
                break;
            }
            let k = p.ident()?;
            p.ws();
            if !p.eat(b'=') {
                return None;
            }
            let v = p.value()?;
            args.insert(k, v);
            p.ws();
            if p.eat(b',') {
                continue;
            }
            if p.eat(b')') {
                break;
            }
            return None;
        }
        out.push(Call { name, arguments: Value::Object(args).to_string() });
        p.ws();
        if p.eat(b',') {
            continue;
        }
        if bracket && !p.eat(b']') {
            return None;
        }
        p.ws();
        return (p.i == p.s.len()).then_some(out);
    }
}

/// A cursor over Python literal syntax.
struct Py<'a> {
    s: &'a [u8],
    i: usize,
}

impl Py<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        if self.s.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn ident(&mut self) -> Option<String> {
        let st = self.i;
        while self.i < self.s.len() && (self.s[self.i].is_ascii_alphanumeric() || matches!(self.s[self.i], b'_' | b'.' | b'-')) {
            self.i += 1;
        }
        (self.i > st && !self.s[st].is_ascii_digit()).then(|| String::from_utf8_lossy(&self.s[st..self.i]).into_owned())
    }

    fn value(&mut self) -> Option<Value> {
        self.ws();
        let c = *self.s.get(self.i)?;
        match c {
            b'"' | b'\'' => self.string(c).map(Value::String),
            b'[' | b'(' => {
                let close = if c == b'[' { b']' } else { b')' };
                self.i += 1;
                let mut v = Vec::new();
                loop {
                    self.ws();
                    if self.eat(close) {
                        return Some(Value::Array(v));
                    }
                    v.push(self.value()?);
                    self.ws();
                    if !self.eat(b',') {
                        self.ws();
                        return self.eat(close).then_some(Value::Array(v));
                    }
                }
            }
            b'{' => {
                self.i += 1;
                let mut m = Map::new();
                loop {
                    self.ws();
                    if self.eat(b'}') {
                        return Some(Value::Object(m));
                    }
                    let k = match self.value()? {
                        Value::String(s) => s,
                        v => v.to_string(),
                    };
                    self.ws();
                    if !self.eat(b':') {
                        return None;
                    }
                    m.insert(k, self.value()?);
                    self.ws();
                    if !self.eat(b',') {
                        self.ws();
                        return self.eat(b'}').then_some(Value::Object(m));
                    }
                }
            }
            _ => {
                let st = self.i;
                while self.i < self.s.len()
                    && (self.s[self.i].is_ascii_alphanumeric() || matches!(self.s[self.i], b'.' | b'-' | b'+' | b'_'))
                {
                    self.i += 1;
                }
                let w = std::str::from_utf8(&self.s[st..self.i]).ok()?;
                match w {
                    "True" | "true" => Some(Value::Bool(true)),
                    "False" | "false" => Some(Value::Bool(false)),
                    "None" | "null" => Some(Value::Null),
                    w => serde_json::from_str::<serde_json::Number>(w).ok().map(Value::Number),
                }
            }
        }
    }

    fn string(&mut self, q: u8) -> Option<String> {
        self.i += 1;
        let mut out = Vec::new();
        while self.i < self.s.len() {
            let c = self.s[self.i];
            self.i += 1;
            if c == q {
                return String::from_utf8(out).ok();
            }
            if c == b'\\' {
                let e = *self.s.get(self.i)?;
                self.i += 1;
                match e {
                    b'n' => out.push(b'\n'),
                    b't' => out.push(b'\t'),
                    b'r' => out.push(b'\r'),
                    b'u' => {
                        let h = std::str::from_utf8(self.s.get(self.i..self.i + 4)?).ok()?;
                        let ch = char::from_u32(u32::from_str_radix(h, 16).ok()?)?;
                        self.i += 4;
                        out.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes());
                    }
                    e => out.push(e),
                }
            } else {
                out.push(c);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests;

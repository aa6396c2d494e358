//! Chat templates: rendering a model's Jinja `chat_template` the way Hugging Face transformers
//! does (`apply_chat_template`), with minijinja.
//!
//! transformers renders with trim_blocks and lstrip_blocks on, loop controls, and three extras
//! templates rely on: `raise_exception(msg)`, `strftime_now(fmt)` and a `tojson` filter that writes
//! JSON as Python's `json.dumps` does (", " and ": " separators, non-ASCII kept). Python string and
//! dict methods (`.strip()`, `.startswith()`, `.items()` ...) come from minijinja-contrib's pycompat.

use std::path::Path;

#[cfg(test)]
use minijinja::context;
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::error::{FormatError, Result};

/// One turn of a conversation, with the fields transformers' templates read besides role and
/// content: an assistant turn's `tool_calls` and `reasoning_content`, a tool result's
/// `tool_call_id` and `name`. Absent fields stay undefined to the template (never null), as in
/// a Python dict without the key.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage { role: role.into(), content: content.into(), ..ChatMessage::default() }
    }
}

/// An assistant's call of a tool, as OpenAI's API and transformers' templates both spell it:
/// `{"id", "type": "function", "function": {"name", "arguments"}}`. The arguments are the
/// parsed JSON object (templates write `arguments | tojson` or iterate `arguments | items`, as
/// transformers expects dicts); a string that is not JSON stays a string.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionCall,
}

fn function_type() -> String {
    "function".into()
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: serde_json::Value,
}

/// What a render takes besides the messages.
#[derive(Clone, Debug, Default)]
pub struct RenderOptions<'a> {
    pub add_generation_prompt: bool,
    /// The tool definitions (OpenAI's `tools` list), None when the request has none: templates
    /// test `tools` for truthiness and `is not none`.
    pub tools: Option<&'a serde_json::Value>,
    /// Extra template variables (`chat_template_kwargs`, e.g. `enable_thinking`); the fixed
    /// names (messages, tools, bos_token ...) win over them.
    pub kwargs: Option<&'a serde_json::Map<String, serde_json::Value>>,
    /// Parse control tokens' texts inside message content too (the old behaviour: a user who
    /// types `<|im_end|>` ends the turn). Off: content is text (`encode_guarded`).
    pub special_in_content: bool,
}

fn template_error(e: &Error) -> FormatError {
    // minijinja's Display omits the chain; keep the detail (line, raised message).
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    FormatError::field(Path::new("<chat template>"), "tokenizer.chat_template", msg)
}

/// Instructions a render may run: a template comes with a downloaded model, and one that loops
/// must end in an error (within a second here), not hold a server thread for hours; a
/// 1,000-message conversation through a template that loops over every character of every
/// message renders well inside it (`fuel_bounds_a_runaway_template`).
pub const TEMPLATE_FUEL: u64 = 20_000_000;

/// The environment transformers renders chat templates in.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> std::result::Result<Value, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_function("strftime_now", |fmt: String| strftime_utc(&fmt, unix_now()));
    env.add_filter("tojson", tojson);
    env
}

/// Render `template` over `messages`. `bos`/`eos` are the model's BOS/EOS token texts (templates
/// write them as `{{ bos_token }}`).
pub fn render(template: &str, messages: &[ChatMessage], add_generation_prompt: bool, bos: &str, eos: &str) -> Result<String> {
    render_with(template, messages, &RenderOptions { add_generation_prompt, ..RenderOptions::default() }, bos, eos)
}

/// `render` with tools and template kwargs.
pub fn render_with(template: &str, messages: &[ChatMessage], opts: &RenderOptions, bos: &str, eos: &str) -> Result<String> {
    let env = environment();
    let tmpl = env.template_from_str(template).map_err(|e| template_error(&e))?;
    let mut ctx = opts.kwargs.cloned().unwrap_or_default();
    let fixed = serde_json::json!({
        "messages": messages,
        "add_generation_prompt": opts.add_generation_prompt,
        "bos_token": bos,
        "eos_token": eos,
        // transformers passes these as None when absent; `tools is not none` must see that.
        "tools": opts.tools,
        "documents": null,
    });
    if let serde_json::Value::Object(m) = fixed {
        ctx.extend(m);
    }
    let cap = output_cap(serde_json::to_string(&ctx).map_or(0, |s| s.len()));
    let mut out = Capped { buf: Vec::new(), cap, over: false };
    match tmpl.render_captured_to(Value::from_serialize(&ctx), &mut out) {
        Ok(_) => String::from_utf8(out.buf).map_err(|_| {
            FormatError::field(Path::new("<chat template>"), "tokenizer.chat_template", "the rendered text is not UTF-8")
        }),
        Err(_) if out.over => Err(FormatError::field(
            Path::new("<chat template>"),
            "tokenizer.chat_template",
            format!("the rendered prompt passed {cap} bytes (4x its inputs + 1 MiB): the template repeats more than a chat does"),
        )),
        Err(e) => Err(template_error(&e)),
    }
}

/// The most a render may write for inputs (messages, tools, kwargs) of `input` bytes as JSON:
/// a chat template lays each input out once with some markup around it, so 4x + 1 MiB is far
/// above any real template and bounds one that repeats its inputs (memory, and the tokenizer's
/// time after it).
pub fn output_cap(input: usize) -> usize {
    input.saturating_mul(4).saturating_add(1 << 20)
}

/// A writer that refuses to grow past `cap` bytes.
struct Capped {
    buf: Vec<u8>,
    cap: usize,
    over: bool,
}

impl std::io::Write for Capped {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + b.len() > self.cap {
            self.over = true;
            return Err(std::io::Error::other("template output cap"));
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The conversation as the model reads it: the rendered text and its ids.
pub struct Encoded {
    pub text: String,
    pub ids: Vec<u32>,
}

/// Render the conversation with the tokenizer's chat template and tokenize it (special tokens
/// parsed; BOS added only when the template did not already write it). The one place the CLI's
/// `--chat` and the server's chat endpoint turn messages into ids.
pub fn encode(tok: &crate::tokenizer::Tokenizer, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<Vec<u32>> {
    let opts = RenderOptions { add_generation_prompt, ..RenderOptions::default() };
    Ok(encode_with(tok, messages, &opts)?.ids)
}

/// `encode` with tools and template kwargs; keeps the rendered text (the server reads how the
/// generation prompt ends, e.g. inside an open `<think>`).
pub fn encode_with(tok: &crate::tokenizer::Tokenizer, messages: &[ChatMessage], opts: &RenderOptions) -> Result<Encoded> {
    let template = tok
        .chat_template()
        .ok_or_else(|| FormatError::field(tok.source(), "tokenizer.chat_template", "the model has no chat template"))?;
    let text_of = |id: u32| tok.token_text(id).unwrap_or_default().to_string();
    let bos = tok.bos_id().map(text_of).unwrap_or_default();
    let eos = tok.eos_id().map(text_of).unwrap_or_default();
    let text = render_with(template, messages, opts, &bos, &eos)?;
    let add_bos = tok.add_bos() && (bos.is_empty() || !text.starts_with(&bos));
    let ids = if opts.special_in_content {
        tok.encode_with(&text, add_bos, true)?
    } else {
        tok.encode_guarded(&text, add_bos, &content_ranges(&text, messages))?
    };
    Ok(Encoded { text, ids })
}

/// Where each message's content sits in the rendered text, found in order (as written, or
/// trimmed when the template trims it); content the template rewrote is not found and keeps the
/// plain rules.
fn content_ranges(text: &str, messages: &[ChatMessage]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    for m in messages {
        for c in [m.content.as_str(), m.content.trim()] {
            if c.is_empty() {
                continue;
            }
            if let Some(i) = text[at..].find(c) {
                out.push((at + i, at + i + c.len()));
                at += i + c.len();
                break;
            }
        }
    }
    out
}

/// `tojson` as transformers defines it: json.dumps(x, ensure_ascii=False, indent=indent).
fn tojson(v: &Value, kwargs: Kwargs) -> std::result::Result<String, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(v, indent, sort_keys.unwrap_or(false), 0, &mut out)?;
    Ok(out)
}

fn write_json_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

fn newline_indent(indent: Option<usize>, depth: usize, out: &mut String) {
    if let Some(n) = indent {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', n * depth));
    }
}

fn write_json(
    v: &Value,
    indent: Option<usize>,
    sort_keys: bool,
    depth: usize,
    out: &mut String,
) -> std::result::Result<(), Error> {
    // Python's separators: ", " between items without indent, "," with it; ": " always.
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else {
                let f = f64::try_from(v.clone())?;
                // Python prints floats with a fractional part or exponent ("1.0", "1e+20").
                if f.is_finite() && f == f.trunc() && f.abs() < 1e16 {
                    out.push_str(&format!("{f:.1}"));
                } else if f.is_nan() {
                    out.push_str("NaN");
                } else if f.is_infinite() {
                    out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
                } else {
                    out.push_str(&format!("{f:?}"));
                }
            }
        }
        ValueKind::String => write_json_str(v.as_str().unwrap_or_default(), out),
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if sort_keys {
                keys.sort();
            }
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline_indent(indent, depth + 1, out);
                match k.as_str() {
                    Some(s) => write_json_str(s, out),
                    None => write_json_str(&k.to_string(), out),
                }
                out.push_str(": ");
                write_json(&v.get_item(k)?, indent, sort_keys, depth + 1, out)?;
            }
            newline_indent(indent, depth, out);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline_indent(indent, depth + 1, out);
                write_json(x, indent, sort_keys, depth + 1, out)?;
            }
            newline_indent(indent, depth, out);
            out.push(']');
        }
        _ => write_json_str(&v.to_string(), out),
    }
    Ok(())
}

fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// Civil date from days since 1970-01-01 (proleptic Gregorian).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + (m <= 2) as i64, m, d)
}

/// The C strftime subset chat templates use (e.g. Llama 3's "%d %b %Y"), in UTC.
fn strftime_utc(fmt: &str, t: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
    let days = t.div_euclid(86_400);
    let secs = t.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (secs / 3600, secs / 60 % 60, secs % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let yday = days - {
        // days since epoch of Jan 1st of year y
        let (mut lo, mut hi) = (days - 366, days);
        while lo < hi {
            let mid = (lo + hi).div_euclid(2);
            if civil_from_days(mid).0 < y { lo = mid + 1 } else { hi = mid }
        }
        lo
    } + 1;
    let mut out = String::new();
    let mut it = fmt.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:2}")),
            Some('H') => out.push_str(&format!("{hh:02}")),
            Some('I') => out.push_str(&format!("{:02}", if hh % 12 == 0 { 12 } else { hh % 12 })),
            Some('p') => out.push_str(if hh < 12 { "AM" } else { "PM" }),
            Some('M') => out.push_str(&format!("{mm:02}")),
            Some('S') => out.push_str(&format!("{ss:02}")),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('b') | Some('h') => out.push_str(&MONTHS[m as usize - 1][..3]),
            Some('B') => out.push_str(MONTHS[m as usize - 1]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('F') => out.push_str(&format!("{y}-{m:02}-{d:02}")),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_known_instants() {
        // 2024-02-29 13:05:09 UTC, a Thursday, day 60 of a leap year.
        let t = 1_709_211_909;
        assert_eq!(strftime_utc("%Y-%m-%d %H:%M:%S", t), "2024-02-29 13:05:09");
        assert_eq!(strftime_utc("%d %b %Y %a %j %B %A", t), "29 Feb 2024 Thu 060 February Thursday");
        assert_eq!(strftime_utc("%F %%", 0), "1970-01-01 %");
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let env = environment();
        let out = env
            .render_str(
                "{{ x | tojson }}|{{ y | tojson(indent=2) }}",
                context! { x => serde_json::json!({"b": [1, 2.5, "é\n\"q\""], "a": null, "t": true}), y => vec![1, 2] },
            )
            .unwrap();
        // Keys in the order written (serde_json and minijinja with preserve_order), as Python.
        assert_eq!(out, "{\"b\": [1, 2.5, \"é\\n\\\"q\\\"\"], \"a\": null, \"t\": true}|[\n  1,\n  2\n]");
    }

    #[test]
    fn fuel_bounds_a_runaway_template() {
        let t0 = std::time::Instant::now();
        let e = render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", &[], false, "", "")
            .unwrap_err();
        assert!(e.to_string().contains("fuel"), "{e}");
        assert!(t0.elapsed().as_secs_f64() < 10.0, "stopped after {:?}", t0.elapsed());
        // A long conversation with a loop per message stays far inside the budget.
        let msgs: Vec<ChatMessage> =
            (0..1000).map(|i| ChatMessage::new(if i % 2 == 0 { "user" } else { "assistant" }, format!("turn {i}"))).collect();
        let t = "{% for m in messages %}{% for c in m.content %}{{ c }}{% endfor %}{{ m.role | upper }}{% endfor %}";
        let out = render(t, &msgs, true, "", "").unwrap();
        assert!(out.ends_with("turn 999ASSISTANT"));
    }

    #[test]
    fn output_cap_bounds_a_repeating_template() {
        let msgs = [ChatMessage::new("user", "x".repeat(1000))];
        let t0 = std::time::Instant::now();
        // 100 MB from a 1 KB message, well within the fuel.
        let e = render("{% for i in range(100000) %}{{ messages[0].content }}{% endfor %}", &msgs, false, "", "").unwrap_err();
        assert!(e.to_string().contains("passed") && e.to_string().contains("bytes"), "{e}");
        assert!(t0.elapsed().as_secs_f64() < 5.0, "stopped after {:?}", t0.elapsed());
        // A real layout of the same message is far inside it.
        let ok = render(
            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}",
            &msgs,
            true,
            "",
            "",
        );
        assert_eq!(ok.unwrap().len(), 1000 + 28);
    }

    #[test]
    fn raise_exception_is_an_error_with_the_message() {
        let e = render("{{ raise_exception('roles must alternate') }}", &[], false, "", "").unwrap_err();
        assert!(e.to_string().contains("roles must alternate"), "{e}");
    }
}

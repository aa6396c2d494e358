//! gpt-oss's harmony format (OpenAI's openai-harmony): after the prompt's `<|start|>assistant`
//! the model writes messages, each a header up to `<|message|>`, a body, and a closer:
//!
//! ```text
//! <|channel|>analysis<|message|>THINKING<|end|>
//! <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>
//! <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>
//! <|start|>assistant<|channel|>final<|message|>ANSWER<|return|>
//! ```
//!
//! The analysis channel is reasoning, the final channel and commentary without a recipient
//! (preambles) are text, a message to `functions.NAME` is a call whose body is its arguments.
//! `<|call|>` and `<|return|>` end generation, so the last message usually arrives without its
//! closer: the end of the output closes it. None of the markup reaches text or reasoning; output
//! without any (a model that just answers) is text.

use serde_json::Value;

use super::{Call, Parser, Piece, State, held};

/// What ends a message's body: its closers, and the markup of a next message written without
/// one (`<|start|>`, `<|channel|>`: left for the next header).
const CLOSERS: [&str; 3] = ["<|end|>", "<|return|>", "<|call|>"];
const OPENERS: [&str; 2] = ["<|start|>", "<|channel|>"];
const MESSAGE: &str = "<|message|>";

/// Where the harmony splitter stands.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Msg {
    /// Between messages (and at the start): a header, or text without markup, comes next.
    Next,
    /// Inside a header, up to `<|message|>`.
    Head,
    /// Inside a body: reasoning, text, or a call's arguments (given out whole at its end).
    Body(Kind),
    /// A call's arguments streaming (`Options::stream_args`).
    Args,
}

#[derive(Clone, Debug, PartialEq)]
pub(super) enum Kind {
    Reasoning,
    Text,
    Call(String),
}

/// A header's recipient and channel: `assistant to=functions.NAME<|channel|>commentary json`,
/// `<|channel|>commentary to=functions.NAME <|constrain|>json`, `<|channel|>analysis`.
fn header(h: &str) -> (Option<&str>, Option<&str>) {
    fn word(s: &str) -> &str {
        s.split(|c: char| c.is_whitespace() || c == '<').next().unwrap_or("")
    }
    let to = h.find("to=").map(|i| word(&h[i + 3..])).filter(|w| !w.is_empty());
    let channel = h.find("<|channel|>").map(|i| word(h[i + "<|channel|>".len()..].trim_start()));
    (to, channel)
}

/// The earliest of `markers` in `s`: its offset and the marker.
fn first<'a>(s: &str, markers: impl Iterator<Item = &'a str>) -> Option<(usize, &'a str)> {
    markers.filter_map(|m| s.find(m).map(|i| (i, m))).min_by_key(|x| x.0)
}

impl Parser {
    /// One step of the harmony splitter: true to go on, false to wait for more text.
    pub(super) fn harmony(&mut self, m: Msg, end: bool, out: &mut Vec<Piece>) -> bool {
        let body_end = || CLOSERS.iter().chain(OPENERS.iter()).copied();
        match m {
            Msg::Next => {
                let t = self.buf.trim_start();
                if t.is_empty() {
                    if end {
                        let ws = std::mem::take(&mut self.buf);
                        self.text(&ws, out);
                    }
                    return false;
                }
                let starts = ["<|start|>", "<|channel|>", "to="];
                if let Some(s) = starts.iter().find(|s| t.starts_with(**s)) {
                    // The whitespace before a header separates messages; it is not text.
                    let skip = self.buf.len() - t.len() + if *s == "<|start|>" { s.len() } else { 0 };
                    self.buf.drain(..skip);
                    self.state = State::Harmony(Msg::Head);
                    return true;
                }
                if !end && starts.iter().any(|s| s.starts_with(t)) {
                    return false;
                }
                // No markup: a model that just answers.
                self.state = State::Harmony(Msg::Body(Kind::Text));
                true
            }
            Msg::Head => {
                let Some(i) = self.buf.find(MESSAGE) else {
                    if end {
                        // A header the output ended inside: markup only.
                        self.buf.clear();
                    }
                    return false;
                };
                let h: String = self.buf.drain(..i + MESSAGE.len()).collect();
                let kind = match header(&h[..i]) {
                    (Some(to), _) => Kind::Call(to.strip_prefix("functions.").unwrap_or(to).to_string()),
                    (None, Some("analysis")) if self.opts.think.is_some() => Kind::Reasoning,
                    _ => Kind::Text,
                };
                self.state = match kind {
                    Kind::Call(name) if self.opts.stream_args => {
                        self.ws.clear();
                        self.calls += 1;
                        out.push(Piece::CallStart(name));
                        State::Harmony(Msg::Args)
                    }
                    k => State::Harmony(Msg::Body(k)),
                };
                true
            }
            Msg::Body(Kind::Call(name)) => {
                let found = first(&self.buf, body_end());
                let Some((i, mark)) = found.or(end.then_some((self.buf.len(), ""))) else { return false };
                let body: String = self.buf.drain(..i).collect();
                if CLOSERS.contains(&mark) {
                    self.buf.drain(..mark.len());
                }
                match serde_json::from_str::<Value>(body.trim()) {
                    Ok(args @ Value::Object(_)) if super::valid_name(&name) => {
                        self.call(Call { name, arguments: args.to_string() }, out);
                    }
                    _ => self.text(&body, out),
                }
                self.state = State::Harmony(Msg::Next);
                true
            }
            Msg::Body(kind) => {
                let found = first(&self.buf, body_end());
                let upto = match found {
                    Some((i, _)) => i,
                    None if end => self.buf.len(),
                    None => self.buf.len() - held(&self.buf, body_end()),
                };
                let s: String = self.buf.drain(..upto).collect();
                match kind {
                    Kind::Reasoning if !s.is_empty() => out.push(Piece::Reasoning(s)),
                    Kind::Reasoning => {}
                    _ => self.text(&s, out),
                }
                match found {
                    Some((_, mark)) => {
                        if CLOSERS.contains(&mark) {
                            self.buf.drain(..mark.len());
                        }
                        if kind == Kind::Reasoning {
                            self.trim_lead = true;
                        }
                        self.state = State::Harmony(Msg::Next);
                        true
                    }
                    None => false,
                }
            }
            Msg::Args => {
                let found = first(&self.buf, body_end());
                let upto = match found {
                    Some((i, _)) => i,
                    None if end => self.buf.len(),
                    None => self.buf.len() - held(&self.buf, body_end()),
                };
                let a: String = self.buf.drain(..upto).collect();
                if !a.is_empty() {
                    out.push(Piece::CallArgs(a));
                }
                if found.is_none() && !end {
                    return false;
                }
                if let Some((_, mark)) = found
                    && CLOSERS.contains(&mark)
                {
                    self.buf.drain(..mark.len());
                }
                out.push(Piece::CallEnd);
                self.trim_lead = true;
                self.state = State::Harmony(Msg::Next);
                true
            }
        }
    }
}

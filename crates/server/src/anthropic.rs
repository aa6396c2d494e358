//! Anthropic's Messages API over the chat path: `POST /v1/messages` (whole, or the Anthropic
//! SSE event sequence) and `POST /v1/messages/count_tokens`. A request becomes the same
//! conversation, tools and agent settings the OpenAI route builds (`generate::queue_chat`), so
//! templates, tool-call parsing, reasoning, budgets and the prompt cache behave alike; only
//! the wire format differs. Errors use Anthropic's body (`{"type": "error", "error": {type,
//! message}}`).
//!
//! Any `model` is answered (Claude Code and other agents name their own); Claude Code's
//! per-request billing header, sent as a system block, is left out of the prompt so it does not
//! defeat the prompt cache.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use crate::models::Served;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use cortiq_engine::sched::{Event, Finish};
use cortiq_formats::calls::{self, Piece};
use cortiq_formats::chat::{ChatMessage, FunctionCall, ToolCall};
use serde_json::{Value, json};

use crate::api::{self, AgentParams, Obj, ToolChoice};
use crate::error::ApiError;
use crate::generate::{self, Out, Queued};
use crate::{App, body_error};

/// An error in Anthropic's form.
fn error_response(e: ApiError) -> Response {
    let kind = match e.status.as_u16() {
        400 | 413 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        _ => "api_error",
    };
    (e.status, axum::Json(json!({"type": "error", "error": {"type": kind, "message": e.message_with_param()}}))).into_response()
}

/// `POST /v1/messages`.
pub(crate) async fn messages(
    Served(app): Served,
    tenant: Option<axum::Extension<crate::Tenant>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let scope = app.scope(tenant);
    match messages_inner(app, scope, body).await {
        Ok(r) => r,
        Err(e) => error_response(e),
    }
}

/// `POST /v1/messages/count_tokens` -> `{"input_tokens": N}`: the prompt the same request
/// would run, counted.
pub(crate) async fn count_tokens(Served(app): Served, body: Result<Bytes, BytesRejection>) -> Response {
    let r = async {
        let body = body.map_err(body_error)?;
        generate::blocking(app, move |app| {
            let info = app.info()?;
            let o = api::object(&body)?;
            let (msgs, agent) = conversation(&o)?;
            let (enc, _) = generate::render_chat(&app, info, &msgs, &agent)?;
            Ok(axum::Json(json!({"input_tokens": enc.ids.len()})).into_response())
        })
        .await
    };
    r.await.unwrap_or_else(error_response)
}

async fn messages_inner(
    app: Arc<App>,
    scope: cortiq_engine::prefix::Scope,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(body_error)?;
    let q = generate::blocking(app, move |app| {
        let info = app.info()?;
        let o = api::object(&body)?;
        let (msgs, agent) = conversation(&o)?;
        let mut gp = api::gen_params(&sampling(&o)?, info.vocab, true)?;
        gp.cache_scope = scope;
        generate::admit(info, gp.n)?;
        generate::queue_chat(&app, &msgs, &agent, gp, "messages")
    })
    .await?;
    if q.stream { Ok(stream(q).into_response()) } else { whole(q).await }
}

/// The sampling fields in the chat route's names: `max_tokens` (required here, as Anthropic
/// has it), `stop_sequences`, `temperature`, `top_p`, `top_k`, `stream`.
fn sampling(o: &Obj) -> Result<Obj, ApiError> {
    let mut m = Obj::new();
    match o.get("max_tokens") {
        Some(v @ Value::Number(_)) => {
            m.insert("max_tokens".into(), v.clone());
        }
        _ => return Err(ApiError::invalid("max_tokens", "'max_tokens' (a positive integer) is required")),
    }
    for k in ["temperature", "top_p", "top_k", "stream", "seed"] {
        if let Some(v) = o.get(k).filter(|v| !v.is_null()) {
            m.insert(k.into(), v.clone());
        }
    }
    if let Some(v) = o.get("stop_sequences").filter(|v| !v.is_null()) {
        m.insert("stop".into(), v.clone());
    }
    // Structured output: `output_config.format` {"type": "json_schema", "schema"}; `effort`
    // has no meaning for a local model and is accepted as is.
    if let Some(f) = o.get("output_config").and_then(|c| c.get("format")).filter(|v| !v.is_null()) {
        match (f.get("type").and_then(Value::as_str), f.get("schema")) {
            (Some("json_schema"), Some(schema)) => {
                m.insert("response_format".into(), json!({"type": "json_schema", "json_schema": {"schema": schema}}));
            }
            _ => {
                return Err(ApiError::invalid(
                    "output_config.format",
                    "'output_config.format' must be {\"type\": \"json_schema\", \"schema\": {...}}",
                ));
            }
        }
    }
    Ok(m)
}

/// A content field: a string or a list of blocks.
fn blocks<'a>(v: &'a Value, param: &str) -> Result<Vec<std::borrow::Cow<'a, Value>>, ApiError> {
    match v {
        Value::String(s) => Ok(vec![std::borrow::Cow::Owned(json!({"type": "text", "text": s}))]),
        Value::Array(a) => Ok(a.iter().map(std::borrow::Cow::Borrowed).collect()),
        _ => Err(ApiError::invalid(param, format!("{param} must be a string or a list of content blocks"))),
    }
}

fn block_text<'a>(b: &'a Value, param: &str) -> Result<&'a str, ApiError> {
    b.get("text").and_then(Value::as_str).ok_or_else(|| ApiError::invalid(param, format!("{param}.text must be a string")))
}

/// The text of a tool result's content (a string or text blocks).
fn result_text(v: Option<&Value>, param: &str) -> Result<String, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(String::new()) };
    let mut s = String::new();
    for (i, b) in blocks(v, param)?.iter().enumerate() {
        let p = format!("{param}[{i}]");
        match b.get("type").and_then(Value::as_str) {
            Some("text") => s.push_str(block_text(b, &p)?),
            Some(t) => {
                return Err(unsupported(&p, &format!("{p}: tool result blocks of type '{t}' are not supported (text only)")));
            }
            None => return Err(ApiError::invalid(&p, format!("{p} must have a 'type'"))),
        }
    }
    Ok(s)
}

fn unsupported(param: &str, msg: &str) -> ApiError {
    ApiError { code: Some("unsupported_value"), ..ApiError::invalid(param, msg) }
}

/// `system`, `messages`, `tools`, `tool_choice` and `thinking` as the chat route's
/// conversation and agent settings.
fn conversation(o: &Obj) -> Result<(Vec<ChatMessage>, AgentParams), ApiError> {
    let mut msgs = Vec::new();
    if let Some(sys) = o.get("system").filter(|v| !v.is_null()) {
        let mut text = Vec::new();
        for (i, b) in blocks(sys, "system")?.iter().enumerate() {
            let p = format!("system[{i}]");
            let t = block_text(b, &p)?;
            // Claude Code's per-request billing header changes on every request.
            if !t.starts_with("x-anthropic-billing-header") {
                text.push(t.to_string());
            }
        }
        if !text.is_empty() {
            msgs.push(ChatMessage::new("system", text.join("\n\n")));
        }
    }
    let Some(Value::Array(list)) = o.get("messages") else {
        return Err(ApiError::invalid("messages", "'messages' must be a non-empty list of messages"));
    };
    if list.is_empty() {
        return Err(ApiError::invalid("messages", "'messages' must be a non-empty list of messages"));
    }
    for (i, m) in list.iter().enumerate() {
        let param = format!("messages[{i}]");
        let role = m.get("role").and_then(Value::as_str);
        let Some(content) = m.get("content") else {
            return Err(ApiError::invalid(&format!("{param}.content"), format!("{param}.content is required")));
        };
        match role {
            Some("user") => {
                let mut text = String::new();
                for (j, b) in blocks(content, &format!("{param}.content"))?.iter().enumerate() {
                    let p = format!("{param}.content[{j}]");
                    match b.get("type").and_then(Value::as_str) {
                        Some("text") => text.push_str(block_text(b, &p)?),
                        Some("tool_result") => {
                            let id = b.get("tool_use_id").and_then(Value::as_str).ok_or_else(|| {
                                ApiError::invalid(&format!("{p}.tool_use_id"), format!("{p}.tool_use_id must be a string"))
                            })?;
                            let mut t = ChatMessage::new("tool", result_text(b.get("content"), &format!("{p}.content"))?);
                            t.tool_call_id = Some(id.to_string());
                            msgs.push(t);
                        }
                        Some(t) => return Err(unsupported(&p, &format!("{p}: user blocks of type '{t}' are not supported"))),
                        None => return Err(ApiError::invalid(&p, format!("{p} must have a 'type'"))),
                    }
                }
                if !text.is_empty() || !matches!(content, Value::Array(_)) {
                    msgs.push(ChatMessage::new("user", text));
                }
            }
            Some("assistant") => {
                let mut a = ChatMessage::new("assistant", "");
                for (j, b) in blocks(content, &format!("{param}.content"))?.iter().enumerate() {
                    let p = format!("{param}.content[{j}]");
                    match b.get("type").and_then(Value::as_str) {
                        Some("text") => a.content.push_str(block_text(b, &p)?),
                        Some("thinking") => {
                            let t = b.get("thinking").and_then(Value::as_str).unwrap_or_default();
                            a.reasoning_content.get_or_insert_with(String::new).push_str(t);
                        }
                        Some("redacted_thinking") => {}
                        Some("tool_use") => {
                            let name = b
                                .get("name")
                                .and_then(Value::as_str)
                                .ok_or_else(|| ApiError::invalid(&format!("{p}.name"), format!("{p}.name must be a string")))?;
                            let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                            let id = b.get("id").and_then(Value::as_str).unwrap_or_default().to_string();
                            a.tool_calls.push(ToolCall {
                                id,
                                kind: "function".into(),
                                function: FunctionCall { name: name.to_string(), arguments: input },
                            });
                        }
                        Some(t) => {
                            return Err(unsupported(&p, &format!("{p}: assistant blocks of type '{t}' are not supported")));
                        }
                        None => return Err(ApiError::invalid(&p, format!("{p} must have a 'type'"))),
                    }
                }
                msgs.push(a);
            }
            _ => {
                return Err(ApiError::invalid(&format!("{param}.role"), format!("{param}.role must be 'user' or 'assistant'")));
            }
        }
    }

    // Tools in OpenAI's form; the chat route's parser checks them.
    let mut chat = Obj::new();
    if let Some(Value::Array(ts)) = o.get("tools") {
        let mut out = Vec::new();
        for (i, t) in ts.iter().enumerate() {
            let p = format!("tools[{i}]");
            if let Some(k) = t.get("type").and_then(Value::as_str).filter(|k| *k != "custom") {
                return Err(unsupported(
                    &format!("{p}.type"),
                    &format!("{p}.type '{k}': server tools are not supported (client tools only)"),
                ));
            }
            let mut f = json!({"name": t.get("name").cloned().unwrap_or(Value::Null)});
            if let Some(d) = t.get("description") {
                f["description"] = d.clone();
            }
            if let Some(s) = t.get("input_schema") {
                f["parameters"] = s.clone();
            }
            out.push(json!({"type": "function", "function": f}));
        }
        chat.insert("tools".into(), Value::Array(out));
    } else if let Some(v) = o.get("tools").filter(|v| !v.is_null()) {
        return Err(ApiError::invalid("tools", format!("'tools' must be a list of tools, got {v}")));
    }
    let mut parallel = true;
    if let Some(tc) = o.get("tool_choice").filter(|v| !v.is_null()) {
        let choice = match tc.get("type").and_then(Value::as_str) {
            Some("auto") => json!("auto"),
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => json!({"type": "function", "function": {"name": tc.get("name").cloned().unwrap_or(Value::Null)}}),
            _ => return Err(ApiError::invalid("tool_choice", "'tool_choice.type' must be 'auto', 'any', 'tool' or 'none'")),
        };
        parallel = !tc.get("disable_parallel_tool_use").and_then(Value::as_bool).unwrap_or(false);
        chat.insert("tool_choice".into(), choice);
    }
    chat.insert("parallel_tool_calls".into(), Value::Bool(parallel));
    match o.get("thinking").filter(|v| !v.is_null()) {
        None => {}
        Some(t) => match t.get("type").and_then(Value::as_str) {
            Some("enabled") => {
                let b = t.get("budget_tokens").and_then(Value::as_u64).ok_or_else(|| {
                    ApiError::invalid("thinking.budget_tokens", "'thinking.budget_tokens' must be a positive integer")
                })?;
                chat.insert("reasoning_budget".into(), json!(b));
            }
            Some("disabled") => {
                chat.insert("chat_template_kwargs".into(), json!({"enable_thinking": false}));
            }
            // The model thinks as its template has it, without a budget.
            Some("adaptive") => {}
            _ => return Err(ApiError::invalid("thinking.type", "'thinking.type' must be 'enabled', 'adaptive' or 'disabled'")),
        },
    }
    let agent = api::agent_params(&chat).map_err(|e| {
        // The chat route's names back to this API's.
        let param = e.param.as_ref().map(|p| p.replace(".function.parameters", ".input_schema").replace(".function.", "."));
        ApiError { param, ..e }
    })?;
    if agent.choice == ToolChoice::Required && agent.tools.is_empty() {
        return Err(ApiError::invalid("tool_choice", "'tool_choice' asks for a tool but 'tools' is empty"));
    }
    Ok((msgs, agent))
}

/// A tool_use block's id: "toolu_" and the chat route's call id letters.
fn tool_id(out: &Out, k: usize) -> String {
    format!("toolu_{}", &out.call_id(0, k)[5..])
}

fn stop_reason(finish: Finish, stop: &Option<String>, calls: usize) -> (&'static str, Value) {
    match (calls, finish, stop) {
        // A call cut by the token limit says so (its input may be incomplete).
        (_, Finish::Length, _) => ("max_tokens", Value::Null),
        (1.., _, _) => ("tool_use", Value::Null),
        (0, Finish::Stop, Some(s)) => ("stop_sequence", json!(s)),
        (0, Finish::Stop, None) => ("end_turn", Value::Null),
    }
}

fn usage(out: &Out, generated: usize, cached: usize) -> Value {
    json!({
        "input_tokens": out.n_prompt.saturating_sub(cached),
        "output_tokens": generated,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    })
}

async fn whole(mut q: Queued) -> Result<Response, ApiError> {
    let generate::Finished { text, finish, stop, generated, cached } = generate::finish_one(&mut q.rx).await?;
    let out = &q.out;
    let pieces = out.pieces(&text);
    let mut content = Vec::new();
    let mut calls = 0;
    for piece in pieces {
        match piece {
            Piece::Text(t) => content.push(json!({"type": "text", "text": t})),
            Piece::Reasoning(r) => content.push(json!({"type": "thinking", "thinking": r, "signature": ""})),
            Piece::Call(c) => {
                let input: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
                content.push(json!({"type": "tool_use", "id": tool_id(out, calls), "name": c.name, "input": input}));
                calls += 1;
            }
            // `pieces` gives every call whole.
            Piece::CallStart(_) | Piece::CallArgs(_) | Piece::CallEnd => {}
        }
    }
    let (reason, seq) = stop_reason(finish, &stop, calls);
    Ok(axum::Json(json!({
        "id": format!("msg_{}", out.id.trim_start_matches("chatcmpl-")),
        "type": "message",
        "role": "assistant",
        "model": out.model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": seq,
        "usage": usage(out, generated, cached),
    }))
    .into_response())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Block {
    Text,
    Thinking,
}

/// The Anthropic event sequence: message_start, ping, per block content_block_start /
/// content_block_delta ... / content_block_stop, message_delta (stop reason, usage),
/// message_stop.
struct Streamer {
    out: Out,
    rx: generate::EventRx,
    parser: calls::Parser,
    pending: VecDeque<SseEvent>,
    open: Option<(Block, usize)>,
    next: usize,
    calls: usize,
    /// The open `tool_use` block's index (a call whose arguments stream).
    call_block: Option<usize>,
    ended: bool,
}

impl Streamer {
    fn event(&mut self, name: &str, data: Value) {
        self.pending.push_back(SseEvent::default().event(name).data(data.to_string()));
    }

    fn close(&mut self) {
        self.call_end();
        if let Some((kind, i)) = self.open.take() {
            if kind == Block::Thinking {
                self.event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": i, "delta": {"type": "signature_delta", "signature": ""}}),
                );
            }
            self.event("content_block_stop", json!({"type": "content_block_stop", "index": i}));
        }
    }

    fn ensure(&mut self, kind: Block) -> usize {
        match self.open {
            Some((k, i)) if k == kind => i,
            _ => {
                self.close();
                let i = self.next;
                self.next += 1;
                let block = match kind {
                    Block::Text => json!({"type": "text", "text": ""}),
                    Block::Thinking => json!({"type": "thinking", "thinking": ""}),
                };
                self.event("content_block_start", json!({"type": "content_block_start", "index": i, "content_block": block}));
                self.open = Some((kind, i));
                i
            }
        }
    }

    fn pieces(&mut self, pieces: Vec<Piece>) {
        for piece in pieces {
            match piece {
                Piece::Text(t) => {
                    let i = self.ensure(Block::Text);
                    self.event(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": t}}),
                    );
                }
                Piece::Reasoning(r) => {
                    let i = self.ensure(Block::Thinking);
                    self.event(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": i, "delta": {"type": "thinking_delta", "thinking": r}}),
                    );
                }
                Piece::Call(c) => {
                    self.call_start(c.name);
                    self.call_args(c.arguments);
                    self.call_end();
                }
                Piece::CallStart(name) => self.call_start(name),
                Piece::CallArgs(a) => self.call_args(a),
                Piece::CallEnd => self.call_end(),
            }
        }
    }

    /// A `tool_use` block opens.
    fn call_start(&mut self, name: String) {
        self.close();
        let i = self.next;
        self.next += 1;
        let id = tool_id(&self.out, self.calls);
        self.calls += 1;
        self.event(
            "content_block_start",
            json!({"type": "content_block_start", "index": i, "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
        );
        self.call_block = Some(i);
    }

    fn call_args(&mut self, args: String) {
        if let Some(i) = self.call_block.filter(|_| !args.is_empty()) {
            self.event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": args}}),
            );
        }
    }

    fn call_end(&mut self) {
        if let Some(i) = self.call_block.take() {
            self.event("content_block_stop", json!({"type": "content_block_stop", "index": i}));
        }
    }

    fn on(&mut self, ev: Option<Event>) {
        match ev {
            None => self.fail(ApiError::internal("the engine stopped before the request finished")),
            Some(Event::Started { .. }) => {}
            Some(Event::Token { text, .. }) => {
                let p = self.parser.feed(&text);
                self.pieces(p);
            }
            Some(Event::Done { finish, stop, tail, n_generated, n_cached, .. }) => {
                let mut p = self.parser.feed(&tail);
                p.extend(self.parser.finish());
                self.pieces(p);
                self.close();
                let (reason, seq) = stop_reason(finish, &stop, self.calls);
                let u = usage(&self.out, n_generated, n_cached);
                self.event(
                    "message_delta",
                    json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq}, "usage": u}),
                );
                self.event("message_stop", json!({"type": "message_stop"}));
                self.ended = true;
            }
            Some(Event::Error { kind, message, .. }) => self.fail(generate::engine_error(kind, message)),
        }
    }

    fn fail(&mut self, e: ApiError) {
        let kind = if e.status == StatusCode::GATEWAY_TIMEOUT { "timeout_error" } else { "api_error" };
        self.event("error", json!({"type": "error", "error": {"type": kind, "message": e.message}}));
        self.ended = true;
    }
}

fn stream(q: Queued) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    let keepalive = q.keepalive;
    let parser = q.out.parser();
    let mut st = Streamer {
        out: q.out,
        rx: q.rx,
        parser,
        pending: VecDeque::new(),
        open: None,
        next: 0,
        calls: 0,
        call_block: None,
        ended: false,
    };
    let start = json!({"type": "message_start", "message": {
        "id": format!("msg_{}", st.out.id.trim_start_matches("chatcmpl-")),
        "type": "message",
        "role": "assistant",
        "model": st.out.model,
        "content": [],
        "stop_reason": null,
        "stop_sequence": null,
        "usage": {"input_tokens": st.out.n_prompt, "output_tokens": 0, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
    }});
    st.event("message_start", start);
    st.event("ping", json!({"type": "ping"}));
    generate::sse(st, keepalive)
}

impl generate::SseWriter for Streamer {
    fn pending(&mut self) -> &mut VecDeque<SseEvent> {
        &mut self.pending
    }
    fn ended(&self) -> bool {
        self.ended
    }
    fn rx(&mut self) -> &mut generate::EventRx {
        &mut self.rx
    }
    fn on(&mut self, ev: Option<Event>) {
        Streamer::on(self, ev)
    }
}

//! OpenAI's Responses API, stateless: `POST /v1/responses` over the chat path. `input` (a
//! string or items: messages, `function_call`, `function_call_output`, `reasoning`),
//! `instructions`, function tools, `tool_choice`, `text.format`, `reasoning.effort` and the
//! sampling fields become the chat route's conversation (`generate::queue_chat`); the answer
//! comes back as output items (reasoning, message, function_call), whole or as the
//! `response.*` event stream. Nothing is stored: `previous_response_id` is refused with a 400
//! naming it (send the whole conversation as `input`).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use crate::models::Served;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use cortiq_engine::sched::{Event, Finish};
use cortiq_formats::calls::{self, Piece};
use cortiq_formats::chat::{ChatMessage, FunctionCall, ToolCall};
use serde_json::{Value, json};

use crate::api::{self, AgentParams, Obj};
use crate::error::ApiError;
use crate::generate::{self, Out, Queued};
use crate::{App, body_error};

pub(crate) async fn responses(
    Served(app): Served,
    tenant: Option<axum::Extension<crate::Tenant>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(body_error)?;
    let scope = app.scope(tenant);
    let (q, echo) = generate::blocking(app, move |app| prepare(&app, scope, &body)).await?;
    if q.stream { Ok(stream(q, echo).into_response()) } else { whole(q, echo).await }
}

fn prepare(app: &Arc<App>, scope: cortiq_engine::prefix::Scope, body: &[u8]) -> Result<(Queued, Echo), ApiError> {
    let info = app.info()?;
    let o = api::object(body)?;
    if o.get("previous_response_id").is_some_and(|v| !v.is_null()) {
        return Err(ApiError {
            code: Some("unsupported_value"),
            ..ApiError::invalid(
                "previous_response_id",
                "this server keeps no responses ('previous_response_id' is not supported): send the whole conversation as 'input'",
            )
        });
    }
    let (msgs, agent, chat) = conversation(&o)?;
    let mut gp = api::gen_params(&chat, info.vocab, true)?;
    gp.cache_scope = scope;
    app.check_model(&gp.model)?;
    generate::admit(info, gp.n)?;
    let q = generate::queue_chat(app, &msgs, &agent, gp, "input")?;
    Ok((q, Echo::of(&o, &agent)))
}

/// The request's settings a response object repeats.
#[derive(Clone)]
struct Echo {
    fields: Obj,
}

impl Echo {
    fn of(o: &Obj, agent: &AgentParams) -> Echo {
        let mut fields = Obj::new();
        for k in ["instructions", "max_output_tokens", "temperature", "top_p", "tool_choice", "text", "reasoning", "metadata"] {
            fields.insert(k.into(), o.get(k).cloned().unwrap_or(Value::Null));
        }
        if fields["tool_choice"].is_null() {
            fields["tool_choice"] = json!("auto");
        }
        fields.insert("tools".into(), o.get("tools").cloned().unwrap_or_else(|| json!([])));
        fields.insert("parallel_tool_calls".into(), json!(agent.parallel));
        fields.insert("previous_response_id".into(), Value::Null);
        fields.insert("store".into(), json!(false));
        fields.insert("truncation".into(), json!("disabled"));
        Echo { fields }
    }
}

/// Text of a message's content: a string or parts (`input_text`, `output_text`, `text`).
fn content_text(v: &Value, param: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut s = String::new();
            for (j, p) in parts.iter().enumerate() {
                let pp = format!("{param}[{j}]");
                match p.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => match p.get("text") {
                        Some(Value::String(t)) => s.push_str(t),
                        _ => return Err(ApiError::invalid(&pp, format!("{pp}.text must be a string"))),
                    },
                    Some("refusal") => {}
                    Some(t) => {
                        return Err(ApiError {
                            code: Some("unsupported_value"),
                            ..ApiError::invalid(&pp, format!("{pp}: content of type '{t}' is not supported (text only)"))
                        });
                    }
                    None => return Err(ApiError::invalid(&pp, format!("{pp} must have a 'type'"))),
                }
            }
            Ok(s)
        }
        _ => Err(ApiError::invalid(param, format!("{param} must be a string or a list of content parts"))),
    }
}

/// `instructions` and `input` as chat messages; `tools` (flat function tools), `tool_choice`,
/// `text.format`, `reasoning.effort` and the sampling fields in the chat route's names.
fn conversation(o: &Obj) -> Result<(Vec<ChatMessage>, AgentParams, Obj), ApiError> {
    let mut msgs: Vec<ChatMessage> = Vec::new();
    if let Some(i) = api::opt_str(o, "instructions")? {
        msgs.push(ChatMessage::new("system", i));
    }
    match o.get("input") {
        Some(Value::String(s)) => msgs.push(ChatMessage::new("user", s.clone())),
        Some(Value::Array(items)) if !items.is_empty() => {
            for (i, it) in items.iter().enumerate() {
                let p = format!("input[{i}]");
                let kind = it.get("type").and_then(Value::as_str).unwrap_or("message");
                match kind {
                    "message" => {
                        let role = match it.get("role").and_then(Value::as_str) {
                            Some(r @ ("user" | "assistant" | "system")) => r,
                            Some("developer") => "system",
                            _ => {
                                return Err(ApiError::invalid(
                                    &format!("{p}.role"),
                                    format!("{p}.role must be user, assistant, system or developer"),
                                ));
                            }
                        };
                        let text = content_text(it.get("content").unwrap_or(&Value::Null), &format!("{p}.content"))?;
                        // An assistant message after a reasoning item carries it.
                        match msgs.last_mut() {
                            Some(last)
                                if role == "assistant"
                                    && last.role == "assistant"
                                    && last.content.is_empty()
                                    && last.tool_calls.is_empty() =>
                            {
                                last.content = text;
                            }
                            _ => msgs.push(ChatMessage::new(role, text)),
                        }
                    }
                    "function_call" => {
                        let name = it
                            .get("name")
                            .and_then(Value::as_str)
                            .ok_or_else(|| ApiError::invalid(&format!("{p}.name"), format!("{p}.name must be a string")))?;
                        let args = it.get("arguments").and_then(Value::as_str).unwrap_or("{}");
                        let call = ToolCall {
                            id: it.get("call_id").and_then(Value::as_str).unwrap_or_default().to_string(),
                            kind: "function".into(),
                            function: FunctionCall {
                                name: name.to_string(),
                                arguments: serde_json::from_str(args).unwrap_or_else(|_| Value::String(args.to_string())),
                            },
                        };
                        // Calls of one turn gather on one assistant message.
                        match msgs.last_mut() {
                            Some(last) if last.role == "assistant" => last.tool_calls.push(call),
                            _ => {
                                let mut a = ChatMessage::new("assistant", "");
                                a.tool_calls.push(call);
                                msgs.push(a);
                            }
                        }
                    }
                    "function_call_output" => {
                        let out = match it.get("output") {
                            Some(Value::String(s)) => s.clone(),
                            Some(v @ Value::Array(_)) => content_text(v, &format!("{p}.output"))?,
                            _ => return Err(ApiError::invalid(&format!("{p}.output"), format!("{p}.output must be a string"))),
                        };
                        let mut t = ChatMessage::new("tool", out);
                        t.tool_call_id = it.get("call_id").and_then(Value::as_str).map(str::to_string);
                        msgs.push(t);
                    }
                    "reasoning" => {
                        let mut text = String::new();
                        for key in ["content", "summary"] {
                            if let Some(Value::Array(parts)) = it.get(key) {
                                for part in parts {
                                    text.push_str(part.get("text").and_then(Value::as_str).unwrap_or_default());
                                }
                            }
                            if !text.is_empty() {
                                break;
                            }
                        }
                        let mut a = ChatMessage::new("assistant", "");
                        a.reasoning_content = Some(text);
                        msgs.push(a);
                    }
                    k => {
                        return Err(ApiError {
                            code: Some("unsupported_value"),
                            ..ApiError::invalid(&format!("{p}.type"), format!("{p}.type '{k}' is not supported"))
                        });
                    }
                }
            }
        }
        _ => return Err(ApiError::invalid("input", "'input' must be a string or a non-empty list of items")),
    }

    let mut chat = Obj::new();
    for k in ["temperature", "top_p", "top_k", "stream", "seed", "model", "parallel_tool_calls", "chat_template_kwargs"] {
        if let Some(v) = o.get(k).filter(|v| !v.is_null()) {
            chat.insert(k.into(), v.clone());
        }
    }
    if let Some(v) = o.get("max_output_tokens").filter(|v| !v.is_null()) {
        chat.insert("max_tokens".into(), v.clone());
    }
    if let Some(Value::Array(ts)) = o.get("tools") {
        let mut out = Vec::new();
        for (i, t) in ts.iter().enumerate() {
            match t.get("type").and_then(Value::as_str) {
                Some("function") => {
                    let mut f = Obj::new();
                    for k in ["name", "description", "parameters"] {
                        if let Some(v) = t.get(k) {
                            f.insert(k.into(), v.clone());
                        }
                    }
                    out.push(json!({"type": "function", "function": f}));
                }
                k => {
                    return Err(ApiError {
                        code: Some("unsupported_value"),
                        ..ApiError::invalid(
                            &format!("tools[{i}].type"),
                            format!("tools[{i}].type {k:?} is not supported (function tools only)"),
                        )
                    });
                }
            }
        }
        chat.insert("tools".into(), Value::Array(out));
    }
    match o.get("tool_choice").filter(|v| !v.is_null()) {
        None => {}
        Some(Value::Object(c)) if c.get("type").and_then(Value::as_str) == Some("function") => {
            chat.insert(
                "tool_choice".into(),
                json!({"type": "function", "function": {"name": c.get("name").cloned().unwrap_or(Value::Null)}}),
            );
        }
        Some(v) => {
            chat.insert("tool_choice".into(), v.clone());
        }
    }
    if let Some(e) = o.get("reasoning").and_then(|r| r.get("effort")).filter(|v| !v.is_null()) {
        chat.insert("reasoning_effort".into(), e.clone());
    }
    if let Some(f) = o.get("text").and_then(|t| t.get("format")).filter(|v| !v.is_null()) {
        let rf = match f.get("type").and_then(Value::as_str) {
            Some("json_schema") => {
                json!({"type": "json_schema", "json_schema": {"schema": f.get("schema").cloned().unwrap_or(Value::Null)}})
            }
            _ => f.clone(),
        };
        chat.insert("response_format".into(), rf);
    }
    let rename = |e: ApiError| {
        let param = e.param.as_ref().map(|p| {
            let p = p.replace("max_tokens", "max_output_tokens").replace("reasoning_effort", "reasoning.effort");
            let p = p.replace("response_format", "text.format");
            p.replace(".function.", ".")
        });
        ApiError { param, ..e }
    };
    let agent = api::agent_params(&chat).map_err(rename)?;
    // Sampling errors are checked by the caller with the same names.
    api::gen_params(&chat, usize::MAX, true).map_err(rename)?;
    Ok((msgs, agent, chat))
}

/// The output of one response, built piece by piece (the stream and the whole response
/// share it).
struct Items {
    items: Vec<Value>,
    /// The item still taking text: (its place, reasoning or message).
    open: Option<(usize, bool)>,
    /// The call item still taking arguments.
    call: Option<usize>,
    calls: usize,
}

impl Items {
    fn new() -> Items {
        Items { items: Vec::new(), open: None, call: None, calls: 0 }
    }
}

fn item_id(out: &Out, prefix: &str, k: usize) -> String {
    format!("{prefix}_{}", &out.call_id(1000 + k, k)[5..])
}

fn usage(out: &Out, generated: usize, cached: usize, reasoning: usize) -> Value {
    json!({
        "input_tokens": out.n_prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": generated,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": out.n_prompt + generated,
    })
}

fn response_object(out: &Out, echo: &Echo, status: &str, output: Vec<Value>, usage: Value, finish: Option<Finish>) -> Value {
    let mut r = json!({
        "id": format!("resp_{}", out.id.trim_start_matches("chatcmpl-")),
        "object": "response",
        "created_at": out.created,
        "status": status,
        "error": null,
        "incomplete_details": if finish == Some(Finish::Length) { json!({"reason": "max_output_tokens"}) } else { Value::Null },
        "model": out.model,
        "output": output,
        "usage": usage,
    });
    for (k, v) in &echo.fields {
        r[k] = v.clone();
    }
    r
}

async fn whole(mut q: Queued, echo: Echo) -> Result<Response, ApiError> {
    let generate::Finished { text, finish, generated, cached, .. } = generate::finish_one(&mut q.rx).await?;
    let pieces = q.out.pieces(&text);
    let mut st = Streamer::new(q.out, echo, None);
    st.pieces(pieces);
    st.close();
    let output = std::mem::take(&mut st.items.items);
    let status = if finish == Finish::Length { "incomplete" } else { "completed" };
    let r = response_object(
        &st.out,
        &st.echo,
        status,
        output,
        usage(&st.out, generated, cached, st.reasoning_tokens()),
        Some(finish),
    );
    Ok(axum::Json(r).into_response())
}

/// The `response.*` event stream; without events to read (`rx` None) the whole response's
/// item builder, emitting nothing.
struct Streamer {
    out: Out,
    echo: Echo,
    rx: Option<generate::EventRx>,
    parser: calls::Parser,
    items: Items,
    pending: VecDeque<SseEvent>,
    seq: u64,
    emit: bool,
    ended: bool,
    reasoning_text: String,
}

impl Streamer {
    fn new(out: Out, echo: Echo, rx: Option<generate::EventRx>) -> Streamer {
        let parser = out.parser();
        Streamer {
            out,
            echo,
            emit: rx.is_some(),
            rx,
            parser,
            items: Items::new(),
            pending: VecDeque::new(),
            seq: 0,
            ended: false,
            reasoning_text: String::new(),
        }
    }

    fn reasoning_tokens(&self) -> usize {
        if self.reasoning_text.is_empty() {
            0
        } else {
            self.out.tok.encode_with(&self.reasoning_text, false, true).map(|v| v.len()).unwrap_or(0)
        }
    }

    fn event(&mut self, name: &str, mut data: Value) {
        if !self.emit {
            return;
        }
        data["type"] = json!(name);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        self.pending.push_back(SseEvent::default().event(name).data(data.to_string()));
    }

    /// End the open message or reasoning item.
    fn close(&mut self) {
        self.call_end();
        let Some((i, reasoning)) = self.items.open.take() else { return };
        let item = &mut self.items.items[i];
        item["status"] = json!("completed");
        let id = item["id"].clone();
        let text = item["content"][0]["text"].clone();
        let item = item.clone();
        if reasoning {
            self.event(
                "response.reasoning_text.done",
                json!({"item_id": id, "output_index": i, "content_index": 0, "text": text}),
            );
        } else {
            let part = item["content"][0].clone();
            self.event(
                "response.output_text.done",
                json!({"item_id": id, "output_index": i, "content_index": 0, "text": text, "logprobs": []}),
            );
            self.event("response.content_part.done", json!({"item_id": id, "output_index": i, "content_index": 0, "part": part}));
        }
        self.event("response.output_item.done", json!({"output_index": i, "item": item}));
    }

    fn text(&mut self, t: &str, reasoning: bool) {
        let i = match self.items.open {
            Some((i, r)) if r == reasoning => i,
            _ => {
                self.close();
                let i = self.items.items.len();
                let id = item_id(&self.out, if reasoning { "rs" } else { "msg" }, i);
                let (item, part) = if reasoning {
                    (
                        json!({"type": "reasoning", "id": id, "summary": [], "content": [{"type": "reasoning_text", "text": ""}], "status": "in_progress"}),
                        None,
                    )
                } else {
                    let part = json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []});
                    (
                        json!({"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": [part.clone()]}),
                        Some(part),
                    )
                };
                let mut added = item.clone();
                added["content"] = json!([]);
                self.event("response.output_item.added", json!({"output_index": i, "item": added}));
                if let Some(part) = part {
                    self.event(
                        "response.content_part.added",
                        json!({"item_id": id, "output_index": i, "content_index": 0, "part": part}),
                    );
                } else {
                    // Reasoning text arrives as reasoning_text deltas of content part 0.
                }
                self.items.items.push(item);
                self.items.open = Some((i, reasoning));
                i
            }
        };
        let item = &mut self.items.items[i];
        let cur = item["content"][0]["text"].as_str().unwrap_or_default().to_string() + t;
        item["content"][0]["text"] = json!(cur);
        let id = item["id"].clone();
        let name = if reasoning { "response.reasoning_text.delta" } else { "response.output_text.delta" };
        let mut d = json!({"item_id": id, "output_index": i, "content_index": 0, "delta": t});
        if !reasoning {
            d["logprobs"] = json!([]);
        }
        self.event(name, d);
    }

    fn pieces(&mut self, pieces: Vec<Piece>) {
        for piece in pieces {
            match piece {
                Piece::Text(t) => self.text(&t, false),
                Piece::Reasoning(r) => {
                    self.reasoning_text.push_str(&r);
                    self.text(&r, true)
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

    /// A `function_call` item opens.
    fn call_start(&mut self, name: String) {
        self.close();
        let i = self.items.items.len();
        let id = item_id(&self.out, "fc", i);
        let call_id = self.out.call_id(0, self.items.calls);
        self.items.calls += 1;
        let item = json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": "", "status": "in_progress"});
        self.event("response.output_item.added", json!({"output_index": i, "item": item}));
        self.items.items.push(item);
        self.items.call = Some(i);
    }

    fn call_args(&mut self, args: String) {
        let Some(i) = self.items.call.filter(|_| !args.is_empty()) else { return };
        let item = &mut self.items.items[i];
        let all = item["arguments"].as_str().unwrap_or_default().to_string() + &args;
        item["arguments"] = json!(all);
        let id = item["id"].clone();
        self.event("response.function_call_arguments.delta", json!({"item_id": id, "output_index": i, "delta": args}));
    }

    fn call_end(&mut self) {
        let Some(i) = self.items.call.take() else { return };
        let item = &mut self.items.items[i];
        item["status"] = json!("completed");
        let item = item.clone();
        self.event(
            "response.function_call_arguments.done",
            json!({"item_id": item["id"], "output_index": i, "name": item["name"], "arguments": item["arguments"]}),
        );
        self.event("response.output_item.done", json!({"output_index": i, "item": item}));
    }

    fn on(&mut self, ev: Option<Event>) {
        match ev {
            None => self.fail("the engine stopped before the request finished".into()),
            Some(Event::Started { .. }) => {}
            Some(Event::Token { text, .. }) => {
                let p = self.parser.feed(&text);
                self.pieces(p);
            }
            Some(Event::Done { finish, tail, n_generated, n_cached, .. }) => {
                let mut p = self.parser.feed(&tail);
                p.extend(self.parser.finish());
                self.pieces(p);
                self.close();
                let (status, name) = if finish == Finish::Length {
                    ("incomplete", "response.incomplete")
                } else {
                    ("completed", "response.completed")
                };
                let u = usage(&self.out, n_generated, n_cached, self.reasoning_tokens());
                let r = response_object(&self.out, &self.echo, status, self.items.items.clone(), u, Some(finish));
                self.event(name, json!({"response": r}));
                self.ended = true;
            }
            Some(Event::Error { message, .. }) => self.fail(message),
        }
    }

    fn fail(&mut self, message: String) {
        let mut r = response_object(&self.out, &self.echo, "failed", self.items.items.clone(), Value::Null, None);
        r["error"] = json!({"code": "server_error", "message": message});
        self.event("response.failed", json!({"response": r}));
        self.ended = true;
    }
}

fn stream(q: Queued, echo: Echo) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    let keepalive = q.keepalive;
    let mut st = Streamer::new(q.out, echo, Some(q.rx));
    let r = response_object(&st.out, &st.echo, "in_progress", Vec::new(), Value::Null, None);
    st.event("response.created", json!({"response": r.clone()}));
    st.event("response.in_progress", json!({"response": r}));
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
        self.rx.as_mut().expect("only a Streamer made with its events is streamed")
    }
    fn on(&mut self, ev: Option<Event>) {
        Streamer::on(self, ev)
    }
}

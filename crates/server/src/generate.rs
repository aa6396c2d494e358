//! The two generation endpoints: `/v1/chat/completions` and `/v1/completions`, whole or
//! streamed (SSE as the official clients expect: the role first, one id on every chunk,
//! exactly one finish_reason per choice, a usage chunk only when `include_usage` asks, then
//! `data: [DONE]`; keep-alive comments while a long prompt is processed).
//!
//! Everything the client sent is checked (api.rs) and the prompt measured against the context
//! before anything is queued or any stream byte is written, so input errors are always a plain
//! 4xx response.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use crate::models::Served;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use cortiq_engine::sched::{ErrorKind, Event, Finish, Request, Sink, SubmitError, TokenLogprob};
use cortiq_formats::{calls, chat};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::api::{self, GenParams, Prompt, ToolChoice};
use crate::error::ApiError;
use crate::reasoning::ThinkBudget;
use crate::structured;
use crate::{App, Info, Tenant, body_error, unix_now};

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Chat,
    Text,
}

/// Events a request may have waiting for its client before the stall clock starts.
const PENDING_EVENTS: usize = 1024;

/// The engine's side of a request's event channel. The channel is unbounded (the engine thread
/// never waits on a client) but watched: past PENDING_EVENTS unread events the stall clock
/// runs, and a client that reads nothing for `--http-timeout` has its request cancelled (the
/// sink reports closed), so a client that stops reading holds a bounded amount of memory.
struct ChanSink {
    tx: mpsc::UnboundedSender<Event>,
    pending: Arc<std::sync::atomic::AtomicUsize>,
    stalled_since: std::sync::Mutex<Option<std::time::Instant>>,
    stall: std::time::Duration,
}

impl ChanSink {
    fn stalled(&self) -> bool {
        let mut since = self.stalled_since.lock().unwrap_or_else(|e| e.into_inner());
        if self.pending.load(std::sync::atomic::Ordering::Relaxed) <= PENDING_EVENTS {
            *since = None;
            return false;
        }
        since.get_or_insert_with(std::time::Instant::now).elapsed() > self.stall
    }
}

impl Sink for ChanSink {
    fn send(&self, ev: Event) -> bool {
        if self.stalled() {
            return false;
        }
        self.pending.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.tx.send(ev).is_ok()
    }
    fn is_closed(&self) -> bool {
        self.tx.is_closed() || self.stalled()
    }
}

/// The HTTP side of a request's events (counts what it has read, for `ChanSink`).
pub(crate) struct EventRx {
    rx: mpsc::UnboundedReceiver<Event>,
    pending: Arc<std::sync::atomic::AtomicUsize>,
}

impl EventRx {
    pub(crate) async fn recv(&mut self) -> Option<Event> {
        let ev = self.rx.recv().await;
        if ev.is_some() {
            self.pending.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
        ev
    }
}

pub(crate) async fn chat(
    Served(app): Served,
    tenant: Option<axum::Extension<Tenant>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(body_error)?;
    let scope = app.scope(tenant);
    let q = blocking(app, move |app| {
        let info = app.info()?;
        let o = api::object(&body)?;
        let mut gp = api::gen_params(&o, info.vocab, true)?;
        gp.cache_scope = scope;
        app.check_model(&gp.model)?;
        admit(info, gp.n)?;
        let msgs = api::messages(&o)?;
        let agent = api::agent_params(&o)?;
        queue_chat(&app, &msgs, &agent, gp, "messages")
    })
    .await?;
    respond(q).await
}

/// A request's preparation (JSON, templates, tokenization, grammar compiles: CPU work that
/// grows with the request) on the runtime's bounded blocking pool, so the HTTP threads stay
/// free to answer `/health` and stream tokens.
pub(crate) async fn blocking<T: Send + 'static>(
    app: Arc<App>,
    f: impl FnOnce(Arc<App>) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(move || f(app))
        .await
        .map_err(|e| ApiError::internal(format!("request preparation failed: {e}")))?
}

/// Admission before any per-choice work: `n` sequences must fit the queue's free room (503
/// `server_busy` otherwise, as the scheduler would answer after the work).
pub(crate) fn admit(info: &Info, n: usize) -> Result<(), ApiError> {
    if info.embed_only {
        return Err(ApiError::invalid(
            "model",
            "this model is an embedding model (an encoder): it does not generate text; use /v1/embeddings or /api/embed",
        ));
    }
    let room = info.sched.room();
    if n > room {
        return Err(ApiError::busy(format!(
            "the request queue has room for {room} sequences, the request needs {n}; retry later"
        )));
    }
    Ok(())
}

/// The conversation as the model reads it, with the tools unless `tool_choice` is none (the
/// model is then not shown them and nothing is parsed as a call); true when tools are on.
pub(crate) fn render_chat(
    app: &App,
    info: &Info,
    msgs: &[chat::ChatMessage],
    agent: &api::AgentParams,
) -> Result<(chat::Encoded, bool), ApiError> {
    let use_tools = !agent.tools.is_empty() && agent.choice != ToolChoice::None;
    let tools = Value::Array(agent.tools.clone());
    let template = info.tok.chat_template().unwrap_or_default();
    // A template that knows no tools (SmolLM2's, Gemma's): the tools and the calls are written
    // into the conversation itself, as JSON the fallback parser reads.
    let generic;
    let msgs = if use_tools && !template.contains("tools") {
        generic = generic_tools(msgs, &agent.tools);
        &generic[..]
    } else {
        msgs
    };
    let opts = chat::RenderOptions {
        add_generation_prompt: true,
        tools: use_tools.then_some(&tools),
        kwargs: Some(&agent.kwargs),
        special_in_content: app.opts.special_in_content,
    };
    let enc =
        chat::encode_with(&info.tok, msgs, &opts).map_err(|e| ApiError::bad_request("chat_template_failed", e.to_string()))?;
    Ok((enc, use_tools))
}

/// The conversation for a template without tool support: the tools described in the system
/// message (JSON calls asked for), earlier calls as the JSON the model was asked to write, tool
/// results as user turns.
fn generic_tools(msgs: &[chat::ChatMessage], tools: &[Value]) -> Vec<chat::ChatMessage> {
    let list: Vec<String> = tools.iter().map(|t| t["function"].to_string()).collect();
    let desc = format!(
        "You can call these tools:\n{}\n\nTo call a tool, answer with only a JSON object {{\"name\": <tool name>, \"arguments\": <arguments object>}} \
         (a list of such objects for several calls); otherwise answer normally.",
        list.join("\n")
    );
    let mut out = Vec::with_capacity(msgs.len() + 1);
    match msgs.first() {
        Some(m) if m.role == "system" => out.push(chat::ChatMessage::new("system", format!("{}\n\n{desc}", m.content))),
        _ => out.push(chat::ChatMessage::new("system", desc)),
    }
    let skip = usize::from(msgs.first().is_some_and(|m| m.role == "system"));
    for m in &msgs[skip..] {
        match m.role.as_str() {
            "assistant" if !m.tool_calls.is_empty() => {
                let calls: Vec<Value> =
                    m.tool_calls.iter().map(|c| json!({"name": c.function.name, "arguments": c.function.arguments})).collect();
                let text = if calls.len() == 1 { calls[0].to_string() } else { Value::Array(calls).to_string() };
                let content = if m.content.is_empty() { text } else { format!("{}\n{text}", m.content) };
                out.push(chat::ChatMessage::new("assistant", content));
            }
            "tool" => out.push(chat::ChatMessage::new("user", format!("Tool result: {}", m.content))),
            _ => out.push(m.clone()),
        }
    }
    out
}

/// A conversation queued: rendered with the tools (unless `tool_choice` is none), its output
/// parser set up (tool calls of the template's family, the thinking block), a forced call's
/// grammar or the reasoning budget attached. The chat, Anthropic and Responses routes all
/// come through here.
pub(crate) fn queue_chat(
    app: &Arc<App>,
    msgs: &[chat::ChatMessage],
    agent: &api::AgentParams,
    mut gp: GenParams,
    prompt_param: &str,
) -> Result<Queued, ApiError> {
    let info = app.info()?;
    let (enc, use_tools) = render_chat(app, info, msgs, agent)?;
    let template = info.tok.chat_template().unwrap_or_default();
    let parse = chat_parse(app.opts.tool_parser, app.opts.reasoning, template, &enc.text, use_tools, agent);
    if let Some(p) = parse.as_ref()
        && let Some(t) = &p.think
    {
        let budget = agent.budget.unwrap_or(app.opts.reasoning_budget);
        gp.think_budget = budget.map(|n| (t.clone(), p.start_in_think, n));
    }
    if let Some(p) = parse.as_ref()
        && let Some(f) = p.family
    {
        let close = p.think.as_ref().filter(|_| p.start_in_think).map(|t| t.close.as_str());
        gp.grammar = agent.forced_grammar(f, close);
        if gp.grammar.is_some() && gp.json_schema.is_some() {
            return Err(ApiError::invalid("response_format", "'response_format' cannot be combined with a forced 'tool_choice'"));
        }
        // Under auto the call's grammar waits for the opener (not with a response format,
        // whose schema already holds the whole output).
        if gp.json_schema.is_none() {
            gp.lazy_call = agent.lazy_call(f).map(|(opener, grammar)| api::LazyCall {
                opener,
                grammar,
                think: p.think.clone(),
                in_think: p.start_in_think,
            });
        }
    }
    // A call the grammar holds (forced, or lazily from its opener) is well-formed once its
    // head is read: its arguments can stream.
    let parse = parse.map(|mut p| {
        p.stream_args = matches!(p.family, Some(calls::Family::Hermes | calls::Family::QwenXml))
            && (gp.grammar.is_some() || gp.lazy_call.is_some());
        p
    });
    let mut out = run(app.clone(), Kind::Chat, vec![enc.ids], gp, prompt_param)?;
    out.parse = parse;
    Ok(out)
}

/// The output splitter a chat request runs (None: its text is all content): the tool calls of
/// the template's family (or `--tool-parser`'s) when tools are on, the thinking block when the
/// template writes one and `reasoning` (the split) is on. `prompt`: the rendered conversation.
pub(crate) fn chat_parse(
    tool_parser: Option<calls::Family>,
    reasoning: bool,
    template: &str,
    prompt: &str,
    use_tools: bool,
    agent: &api::AgentParams,
) -> Option<calls::Options> {
    let family = tool_parser.unwrap_or_else(|| calls::Family::detect(template));
    // gpt-oss writes every answer in harmony channels, tools or not: its splitter always runs
    // (with the reasoning split, the analysis channel is `reasoning_content`; without, text).
    let harmony = family == calls::Family::Harmony;
    let think = if harmony { Some(calls::ThinkTags::harmony()) } else { calls::ThinkTags::detect(template) };
    let think = think.filter(|_| reasoning);
    (use_tools || harmony || think.is_some()).then(|| calls::Options {
        family: (use_tools || harmony).then_some(family),
        tools: if use_tools { agent.tools.clone() } else { Vec::new() },
        start_in_think: think.as_ref().is_some_and(|t| prompt.trim_end().ends_with(&t.open)),
        think,
        stream_args: false,
        single_call: !agent.parallel,
    })
}

pub(crate) async fn completions(
    Served(app): Served,
    tenant: Option<axum::Extension<Tenant>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(body_error)?;
    let scope = app.scope(tenant);
    let q = blocking(app, move |app| {
        let info = app.info()?;
        // A body too big to admit is refused from its bytes, before a value is built for
        // each of its prompts or ids.
        let n_ctx = info.sched.config().n_ctx;
        if let Some(sh) = api::quick_shape(&body, Some((info.sched.room(), n_ctx))) {
            if sh.longest_ids >= n_ctx {
                return Err(ApiError::context_exceeded(sh.longest_ids, n_ctx, "prompt"));
            }
            let needs = sh.prompts.saturating_mul(sh.n);
            let room = info.sched.room();
            if sh.cut && needs > room {
                // Stopped past the room: the count read so far is a lower bound.
                return Err(ApiError::busy(format!(
                    "the request queue has room for {room} sequences, the request needs at least {needs}; retry later"
                )));
            }
            admit(info, needs)?;
        }
        let o = api::object(&body)?;
        let mut gp = api::gen_params(&o, info.vocab, false)?;
        gp.cache_scope = scope;
        app.check_model(&gp.model)?;
        // Prompts x n against the queue before any prompt is copied or tokenized.
        admit(info, api::prompt_count(&o).saturating_mul(gp.n))?;
        let mut prompts = Vec::new();
        for p in api::prompts(&o, info.vocab)? {
            prompts.push(match p {
                // As llama-server: BOS where the model adds one, special tokens parsed.
                Prompt::Text(s) => {
                    info.tok.encode_with(&s, info.tok.add_bos(), true).map_err(|e| ApiError::invalid("prompt", e.to_string()))?
                }
                Prompt::Tokens(t) => t,
            });
        }
        run(app.clone(), Kind::Text, prompts, gp, "prompt")
    })
    .await?;
    respond(q).await
}

/// One text prompt (its ids) queued as a completion (the ollama route's `raw` prompts).
pub(crate) fn queue_text(app: &Arc<App>, ids: Vec<u32>, gp: GenParams, prompt_param: &str) -> Result<Queued, ApiError> {
    run(app.clone(), Kind::Text, vec![ids], gp, prompt_param)
}

/// A queued request, answered by `respond` (or another route's own writer).
pub(crate) struct Queued {
    pub out: Out,
    pub rx: EventRx,
    pub stream: bool,
    pub keepalive: std::time::Duration,
}

impl std::ops::Deref for Queued {
    type Target = Out;
    fn deref(&self) -> &Out {
        &self.out
    }
}

impl std::ops::DerefMut for Queued {
    fn deref_mut(&mut self) -> &mut Out {
        &mut self.out
    }
}

/// Answer a queued request whole or as SSE.
async fn respond(q: Queued) -> Result<Response, ApiError> {
    if q.stream { Ok(stream(q.out, q.rx, q.keepalive).into_response()) } else { whole(q.out, q.rx).await }
}

/// Check the prompts against the context and queue `n` choices per prompt.
fn run(app: Arc<App>, kind: Kind, prompts: Vec<Vec<u32>>, gp: GenParams, prompt_param: &str) -> Result<Queued, ApiError> {
    let info = app.info()?;
    let n_ctx = info.sched.config().n_ctx;
    for p in &prompts {
        if p.is_empty() {
            return Err(ApiError::invalid(prompt_param, "the prompt is empty"));
        }
        if p.len() >= n_ctx {
            return Err(ApiError::context_exceeded(p.len(), n_ctx, prompt_param));
        }
    }
    let structured = match (&gp.json_schema, &gp.grammar, &gp.lazy_call) {
        (None, None, None) => None,
        _ => Some(app.structured(info).map_err(|e| ApiError::internal(format!("structured output unavailable: {e}")))?),
    };
    // A tool call's grammar (forced, or lazy from its opener), and the response format's.
    let tools_grammar = |st: &structured::Structured, g: &str| {
        st.compile_lark(g).map_err(|e| ApiError {
            code: Some("invalid_schema"),
            ..ApiError::invalid("tools", format!("a tool's parameter schema cannot be used: {e}"))
        })
    };
    // The grammar compiled once per request; each choice runs its own copy.
    let compiled = match (&structured, &gp.json_schema, &gp.grammar) {
        (Some(st), Some(schema), _) => Some(st.compile_json(schema).map_err(|e| ApiError {
            code: Some("invalid_schema"),
            ..ApiError::invalid("response_format", format!("the JSON schema cannot be used: {e}"))
        })?),
        (Some(st), None, Some(g)) => Some(tools_grammar(st, g)?),
        _ => None,
    };
    let lazy = match (&structured, &gp.lazy_call) {
        (Some(st), Some(l)) => Some((l, tools_grammar(st, &l.grammar)?)),
        _ => None,
    };
    let spec = gp.speculative.resolve(app.opts.spec, info.has_draft)?;
    let (tx, rx) = mpsc::unbounded_channel();
    let pending = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let rx = EventRx { rx, pending: pending.clone() };
    let eos = if gp.ignore_eos { Vec::new() } else { info.eos.clone() };
    let mut reqs = Vec::new();
    for (pi, p) in prompts.iter().enumerate() {
        for j in 0..gp.n {
            let mut held: Vec<Box<dyn cortiq_engine::sched::Constraint>> = Vec::new();
            match &compiled {
                Some(c) => held.push(c.constraint().map_err(|e| ApiError {
                    code: Some("invalid_schema"),
                    ..ApiError::invalid("response_format", format!("the grammar cannot be used: {e}"))
                })?),
                None => {
                    if let Some((tags, inside, n)) = &gp.think_budget {
                        held.push(Box::new(
                            ThinkBudget::new(info.tok.clone(), tags.clone(), *n, *inside).map_err(ApiError::internal)?,
                        ));
                    }
                    if let Some((l, c)) = &lazy {
                        held.push(c.lazy(info.tok.clone(), &l.opener, l.think.clone(), l.in_think));
                    }
                }
            }
            let constraint = match held.len() {
                0 => None,
                1 => held.pop(),
                _ => Some(Box::new(structured::Chain(held)) as Box<dyn cortiq_engine::sched::Constraint>),
            };
            let mut sampler = gp.sampler.clone();
            // Choice j of a request draws from its own stream: seed + j.
            sampler.seed = sampler.seed.wrapping_add(j as u64);
            reqs.push(Request {
                prompt: p.clone(),
                n_predict: gp.max_tokens.unwrap_or(n_ctx),
                sampler,
                eos: eos.clone(),
                stops: gp.stops.clone(),
                logprobs: gp.logprobs,
                logit_bias: gp.logit_bias.clone(),
                index: pi * gp.n + j,
                sink: Box::new(ChanSink {
                    tx: tx.clone(),
                    pending: pending.clone(),
                    stalled_since: std::sync::Mutex::new(None),
                    stall: app.opts.http_timeout,
                }),
                constraint,
                spec,
                cache: gp.cache_prompt,
                cache_scope: gp.cache_scope,
            });
        }
    }
    drop(tx);
    info.sched.submit(reqs).map_err(|e| match e {
        SubmitError::QueueFull(_) | SubmitError::ShuttingDown => ApiError::busy(format!("{e}; retry later")),
        SubmitError::TooLong { n_prompt, n_ctx } => ApiError::context_exceeded(n_prompt, n_ctx, prompt_param),
        SubmitError::EmptyPrompt => ApiError::invalid(prompt_param, "the prompt is empty"),
    })?;
    let out = Out {
        kind,
        id: app.new_id(if kind == Kind::Chat { "chatcmpl" } else { "cmpl" }),
        created: unix_now(),
        model: app.opts.model_id.clone(),
        n_prompt: prompts.iter().map(Vec::len).sum(),
        choices: prompts.len() * gp.n,
        per_prompt: gp.n,
        return_tokens: gp.return_tokens,
        include_usage: gp.include_usage,
        spec: spec.is_some(),
        tok: info.tok.clone(),
        parse: None,
    };
    Ok(Queued { out, rx, stream: gp.stream, keepalive: app.opts.keepalive })
}

/// What every chunk or response of one request shares.
pub(crate) struct Out {
    pub(crate) kind: Kind,
    pub(crate) id: String,
    pub(crate) created: u64,
    pub(crate) model: String,
    /// Prompt tokens over the distinct prompts (an n > 1 prompt counts once).
    pub(crate) n_prompt: usize,
    pub(crate) choices: usize,
    /// Choices per prompt (`n`): choice i answers prompt i / per_prompt.
    pub(crate) per_prompt: usize,
    /// Whole responses list each choice's generated ids (`return_tokens`).
    pub(crate) return_tokens: bool,
    pub(crate) include_usage: bool,
    /// The request speculated: its usage reports drafted tokens kept and rejected.
    pub(crate) spec: bool,
    pub(crate) tok: Arc<cortiq_formats::tokenizer::Tokenizer>,
    /// Chat: split each choice's text into content, reasoning and tool calls (the first call
    /// only under `parallel_tool_calls: false`).
    pub(crate) parse: Option<calls::Options>,
}

/// Tokens a choice generated, and of speculative decoding's drafts those kept and not.
#[derive(Clone, Default)]
struct Counts {
    generated: usize,
    drafted: usize,
    accepted: usize,
    /// Prompt positions each choice restored from the prompt cache.
    cached: Vec<usize>,
}

impl Counts {
    fn add(&mut self, index: usize, n_generated: usize, drafted: usize, accepted: usize, n_cached: usize) {
        self.generated += n_generated;
        self.drafted += drafted;
        self.accepted += accepted;
        if self.cached.len() <= index {
            self.cached.resize(index + 1, 0);
        }
        self.cached[index] = n_cached;
    }
}

fn finish_reason(f: Finish) -> &'static str {
    match f {
        Finish::Stop => "stop",
        Finish::Length => "length",
    }
}

pub(crate) fn engine_error(kind: ErrorKind, message: String) -> ApiError {
    match kind {
        ErrorKind::Timeout => ApiError::timeout(message),
        ErrorKind::Engine => ApiError::internal(message),
    }
}

impl Out {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Text, _) => "text_completion",
        }
    }

    /// OpenAI's usage object: `prompt_tokens_details.cached_tokens`, the prompt positions
    /// restored from the prompt cache (per prompt, the most any of its choices restored); with
    /// speculation, its predicted-output counts: the drafted tokens kept
    /// (`accepted_prediction_tokens`) and not.
    fn usage(&self, c: &Counts) -> Value {
        let cached: usize = c.cached.chunks(self.per_prompt.max(1)).map(|ch| ch.iter().copied().max().unwrap_or(0)).sum();
        let mut u = json!({
            "prompt_tokens": self.n_prompt,
            "completion_tokens": c.generated,
            "total_tokens": self.n_prompt + c.generated,
            "prompt_tokens_details": {"cached_tokens": cached},
        });
        if self.spec {
            u["completion_tokens_details"] =
                json!({"accepted_prediction_tokens": c.accepted, "rejected_prediction_tokens": c.drafted - c.accepted});
        }
        u
    }

    /// A call's id: "call_" and 9 letters and digits from the response id, the choice and the
    /// call's place (unique per request; Mistral's templates take exactly 9 alphanumerics).
    pub(crate) fn call_id(&self, choice: usize, k: usize) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self.id.bytes().chain(choice.to_le_bytes()).chain(k.to_le_bytes()) {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        const A: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
        let id: String = (0..9).map(|i| A[((h >> (i * 6)) % 62) as usize] as char).collect();
        format!("call_{id}")
    }

    /// A choice's whole message: its text split by the parser (when the request asks for
    /// one) into content, reasoning and tool calls, and the finish reason that goes with it.
    /// A splitter for one choice (all text when the request parses nothing).
    pub(crate) fn parser(&self) -> calls::Parser {
        calls::Parser::new(self.parse.clone().unwrap_or_default())
    }

    /// A whole choice's text split (what the stream's pieces add up to).
    /// Each call whole (`calls::collapse`).
    pub(crate) fn pieces(&self, text: &str) -> Vec<calls::Piece> {
        let mut p = self.parser();
        let mut pieces = p.feed(text);
        pieces.extend(p.finish());
        calls::collapse(pieces)
    }

    fn message(&self, index: usize, text: &str, finish: Finish) -> (Value, &'static str) {
        if self.parse.is_none() {
            return (json!({"role": "assistant", "content": text}), finish_reason(finish));
        }
        let pieces = self.pieces(text);
        let (mut content, mut reasoning, mut list) = (String::new(), String::new(), Vec::new());
        for piece in pieces {
            match piece {
                calls::Piece::Text(t) => content.push_str(&t),
                calls::Piece::Reasoning(r) => reasoning.push_str(&r),
                calls::Piece::Call(c) => {
                    let id = self.call_id(index, list.len());
                    list.push(json!({"id": id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}));
                }
                // `pieces` gives every call whole.
                calls::Piece::CallStart(_) | calls::Piece::CallArgs(_) | calls::Piece::CallEnd => {}
            }
        }
        let mut m = json!({"role": "assistant", "content": if content.is_empty() && !list.is_empty() { Value::Null } else { json!(content) }});
        if !reasoning.is_empty() {
            m["reasoning_content"] = json!(reasoning);
            m["reasoning"] = json!(reasoning);
        }
        if list.is_empty() {
            return (m, finish_reason(finish));
        }
        m["tool_calls"] = Value::Array(list);
        // A call cut by the token limit says so (its arguments may be incomplete).
        (m, if finish == Finish::Length { "length" } else { "tool_calls" })
    }

    fn bytes_of(&self, id: u32) -> Vec<u8> {
        self.tok.token_bytes(id)
    }

    /// A chat logprobs entry: the token as it reads in the text, its bytes, the alternatives.
    fn chat_logprob(&self, piece: &str, lp: &TokenLogprob) -> Value {
        let top: Vec<Value> = lp
            .top
            .iter()
            .map(|&(id, l)| {
                let b = self.bytes_of(id);
                json!({"token": String::from_utf8_lossy(&b), "logprob": l, "bytes": b})
            })
            .collect();
        json!({"token": piece, "logprob": lp.logprob, "bytes": self.bytes_of(lp.id), "top_logprobs": top})
    }

    /// The legacy completions logprobs object for a run of tokens starting at `offset` chars.
    fn text_logprobs(&self, toks: &[(String, TokenLogprob)], mut offset: usize) -> Value {
        let mut tokens = Vec::new();
        let mut lps = Vec::new();
        let mut tops = Vec::new();
        let mut offsets = Vec::new();
        for (piece, lp) in toks {
            tokens.push(json!(piece));
            lps.push(json!(lp.logprob));
            let mut m = serde_json::Map::new();
            for &(id, l) in &lp.top {
                m.insert(String::from_utf8_lossy(&self.bytes_of(id)).into_owned(), json!(l));
            }
            tops.push(Value::Object(m));
            offsets.push(json!(offset));
            offset += piece.chars().count();
        }
        json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
    }
}

#[derive(Default)]
struct Choice {
    text: String,
    logprobs: Vec<(String, TokenLogprob)>,
    finish: Option<Finish>,
    ids: Vec<u32>,
}

/// One choice run to its end (the Anthropic and Responses routes answer n = 1).
pub(crate) struct Finished {
    pub text: String,
    pub finish: Finish,
    pub stop: Option<String>,
    pub generated: usize,
    pub cached: usize,
}

pub(crate) async fn finish_one(rx: &mut EventRx) -> Result<Finished, ApiError> {
    let mut text = String::new();
    loop {
        match rx.recv().await {
            None => return Err(ApiError::internal("the engine stopped before the request finished")),
            Some(Event::Token { text: t, .. }) => text.push_str(&t),
            Some(Event::Done { finish, stop, tail, n_generated, n_cached, .. }) => {
                text.push_str(&tail);
                return Ok(Finished { text, finish, stop, generated: n_generated, cached: n_cached });
            }
            Some(Event::Error { kind, message, .. }) => return Err(engine_error(kind, message)),
            Some(Event::Started { .. }) => {}
        }
    }
}

/// An SSE writer over a request's events: `on` turns each event into frames, `pending`
/// holds the frames not yet sent, `ended` says the last one is queued. The three APIs' streams
/// share the driving loop (`sse`).
pub(crate) trait SseWriter: Send + 'static {
    fn pending(&mut self) -> &mut VecDeque<SseEvent>;
    fn ended(&self) -> bool;
    fn rx(&mut self) -> &mut EventRx;
    fn on(&mut self, ev: Option<Event>);
}

pub(crate) fn sse<W: SseWriter>(
    w: W,
    keepalive: std::time::Duration,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    let s = futures_util::stream::unfold(w, |mut w| async move {
        loop {
            if let Some(ev) = w.pending().pop_front() {
                return Some((Ok(ev), w));
            }
            if w.ended() {
                return None;
            }
            let ev = w.rx().recv().await;
            w.on(ev);
        }
    });
    Sse::new(s).keep_alive(KeepAlive::new().interval(keepalive))
}

/// Collect every choice, then answer once.
async fn whole(out: Out, mut rx: EventRx) -> Result<Response, ApiError> {
    let mut choices: Vec<Choice> = (0..out.choices).map(|_| Choice::default()).collect();
    let mut counts = Counts::default();
    let mut done = 0;
    while done < out.choices {
        let Some(ev) = rx.recv().await else { return Err(ApiError::internal("the engine stopped before the request finished")) };
        match ev {
            Event::Started { .. } => {}
            Event::Token { index, id, piece, text, logprob } => {
                let c = &mut choices[index];
                c.ids.push(id);
                c.text.push_str(&text);
                if let Some(lp) = logprob {
                    c.logprobs.push((piece, lp));
                }
            }
            Event::Done { index, finish, tail, n_generated, drafted, accepted, n_cached, .. } => {
                let c = &mut choices[index];
                c.text.push_str(&tail);
                c.finish = Some(finish);
                counts.add(index, n_generated, drafted, accepted, n_cached);
                done += 1;
            }
            Event::Error { kind, message, .. } => return Err(engine_error(kind, message)),
        }
    }
    let with_lp = choices.iter().any(|c| !c.logprobs.is_empty());
    let list: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let f = c.finish.expect("every choice finished");
            let mut v = match out.kind {
                Kind::Chat => {
                    let lp = with_lp
                        .then(|| json!({"content": c.logprobs.iter().map(|(p, l)| out.chat_logprob(p, l)).collect::<Vec<_>>()}));
                    let (message, finish) = out.message(i, &c.text, f);
                    json!({"index": i, "message": message, "logprobs": lp, "finish_reason": finish})
                }
                Kind::Text => {
                    let finish = finish_reason(f);
                    let lp = with_lp.then(|| out.text_logprobs(&c.logprobs, 0));
                    json!({"index": i, "text": c.text, "logprobs": lp, "finish_reason": finish})
                }
            };
            if out.return_tokens {
                v["tokens"] = json!(c.ids);
            }
            v
        })
        .collect();
    Ok(axum::Json(json!({
        "id": out.id,
        "object": out.object(false),
        "created": out.created,
        "model": out.model,
        "system_fingerprint": fingerprint(),
        "choices": list,
        "usage": out.usage(&counts),
    }))
    .into_response())
}

fn fingerprint() -> String {
    format!("cortiq-{}", env!("CARGO_PKG_VERSION"))
}

/// The SSE stream's state: events become chunks; `pending` holds chunks not yet yielded.
struct Streamer {
    out: Out,
    rx: EventRx,
    pending: VecDeque<SseEvent>,
    done: usize,
    counts: Counts,
    /// Characters of text sent per choice (completions' text_offset).
    sent_chars: Vec<usize>,
    /// Per choice, its output splitter (chat requests with tools or a thinking template).
    parsers: Vec<Option<calls::Parser>>,
    /// Tool calls sent per choice.
    n_calls: Vec<usize>,
    ended: bool,
}

impl Streamer {
    /// A chunk's envelope around `choices`: the id, object, creation time and model every
    /// chunk of the stream repeats.
    fn envelope(&self, choices: Value) -> Value {
        json!({
            "id": self.out.id,
            "object": self.out.object(true),
            "created": self.out.created,
            "model": self.out.model,
            "system_fingerprint": fingerprint(),
            "choices": choices,
        })
    }

    fn chunk(&self, choice: Value) -> SseEvent {
        let mut c = self.envelope(json!([choice]));
        if self.out.include_usage {
            c["usage"] = Value::Null;
        }
        SseEvent::default().data(c.to_string())
    }

    /// A content chunk for `text` (and the log-probabilities of the tokens it completes).
    fn content(&mut self, index: usize, text: &str, lps: &[(String, TokenLogprob)]) {
        let choice = match self.out.kind {
            Kind::Chat => {
                let lp = (!lps.is_empty())
                    .then(|| json!({"content": lps.iter().map(|(p, l)| self.out.chat_logprob(p, l)).collect::<Vec<_>>()}));
                json!({"index": index, "delta": {"content": text}, "logprobs": lp, "finish_reason": null})
            }
            Kind::Text => {
                let lp = (!lps.is_empty()).then(|| self.out.text_logprobs(lps, self.sent_chars[index]));
                json!({"index": index, "text": text, "logprobs": lp, "finish_reason": null})
            }
        };
        self.sent_chars[index] += text.chars().count();
        let ev = self.chunk(choice);
        self.pending.push_back(ev);
    }

    /// The parser's pieces as chat deltas: content, reasoning (`reasoning_content` and its
    /// alias `reasoning`), and each tool call as two chunks (id and name, then its arguments).
    /// The tokens' log-probabilities ride on the first chunk (or one of their own).
    fn pieces(&mut self, index: usize, pieces: Vec<calls::Piece>, lps: &[(String, TokenLogprob)]) {
        let mut lp = (!lps.is_empty())
            .then(|| json!({"content": lps.iter().map(|(p, l)| self.out.chat_logprob(p, l)).collect::<Vec<_>>()}));
        let mut deltas = self.deltas(index, pieces);
        if deltas.is_empty() && lp.is_some() {
            deltas.push(json!({}));
        }
        for d in deltas {
            let ev = self.chunk(json!({"index": index, "delta": d, "logprobs": lp.take(), "finish_reason": null}));
            self.pending.push_back(ev);
        }
    }

    /// The chat deltas of a choice's pieces.
    fn deltas(&mut self, index: usize, pieces: Vec<calls::Piece>) -> Vec<Value> {
        let mut deltas = Vec::new();
        for piece in pieces {
            match piece {
                calls::Piece::Text(t) => deltas.push(json!({"content": t})),
                calls::Piece::Reasoning(r) => deltas.push(json!({"reasoning_content": r, "reasoning": r})),
                calls::Piece::Call(c) => {
                    self.call_start(index, c.name, &mut deltas);
                    self.call_args(index, c.arguments, &mut deltas);
                }
                calls::Piece::CallStart(name) => self.call_start(index, name, &mut deltas),
                calls::Piece::CallArgs(a) => self.call_args(index, a, &mut deltas),
                calls::Piece::CallEnd => {}
            }
        }
        deltas
    }

    /// A call's first chunk: its index, id and name.
    fn call_start(&mut self, index: usize, name: String, deltas: &mut Vec<Value>) {
        let k = self.n_calls[index];
        self.n_calls[index] += 1;
        let id = self.out.call_id(index, k);
        deltas.push(
            json!({"tool_calls": [{"index": k, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}),
        );
    }

    /// A piece of the open call's arguments.
    fn call_args(&mut self, index: usize, args: String, deltas: &mut Vec<Value>) {
        if args.is_empty() {
            return;
        }
        let k = self.n_calls[index] - 1;
        deltas.push(json!({"tool_calls": [{"index": k, "function": {"arguments": args}}]}));
    }

    fn finish(&mut self, index: usize, f: Finish) {
        let reason = if self.n_calls[index] > 0 && f != Finish::Length { "tool_calls" } else { finish_reason(f) };
        let choice = match self.out.kind {
            Kind::Chat => json!({"index": index, "delta": {}, "logprobs": null, "finish_reason": reason}),
            Kind::Text => json!({"index": index, "text": "", "logprobs": null, "finish_reason": reason}),
        };
        let ev = self.chunk(choice);
        self.pending.push_back(ev);
    }

    fn end(&mut self, error: Option<ApiError>) {
        if let Some(e) = error {
            self.pending.push_back(SseEvent::default().data(e.body().to_string()));
        } else if self.out.include_usage {
            let mut c = self.envelope(json!([]));
            c["usage"] = self.out.usage(&self.counts);
            self.pending.push_back(SseEvent::default().data(c.to_string()));
        }
        self.pending.push_back(SseEvent::default().data("[DONE]"));
        self.ended = true;
    }

    fn on(&mut self, ev: Option<Event>) {
        match ev {
            None => self.end(Some(ApiError::internal("the engine stopped before the request finished"))),
            Some(Event::Started { .. }) => {}
            Some(Event::Token { index, piece, text, logprob, .. }) => {
                let lps: Vec<_> = logprob.map(|l| (piece, l)).into_iter().collect();
                if let Some(p) = self.parsers[index].as_mut() {
                    let pieces = p.feed(&text);
                    self.pieces(index, pieces, &lps);
                } else if !text.is_empty() || !lps.is_empty() {
                    self.content(index, &text, &lps);
                }
            }
            Some(Event::Done { index, finish, tail, n_generated, drafted, accepted, n_cached, .. }) => {
                if let Some(p) = self.parsers[index].as_mut() {
                    let mut pieces = p.feed(&tail);
                    pieces.extend(p.finish());
                    self.pieces(index, pieces, &[]);
                } else if !tail.is_empty() {
                    self.content(index, &tail, &[]);
                }
                self.finish(index, finish);
                self.counts.add(index, n_generated, drafted, accepted, n_cached);
                self.done += 1;
                if self.done == self.out.choices {
                    self.end(None);
                }
            }
            Some(Event::Error { kind, message, .. }) => self.end(Some(engine_error(kind, message))),
        }
    }
}

fn stream(
    out: Out,
    rx: EventRx,
    keepalive: std::time::Duration,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    let n = out.choices;
    let parsers = (0..n).map(|_| out.parse.is_some().then(|| out.parser())).collect();
    let mut st = Streamer {
        out,
        rx,
        pending: VecDeque::new(),
        done: 0,
        counts: Counts::default(),
        sent_chars: vec![0; n],
        parsers,
        n_calls: vec![0; n],
        ended: false,
    };
    if st.out.kind == Kind::Chat {
        for i in 0..n {
            let c = st.chunk(
                json!({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}),
            );
            st.pending.push_back(c);
        }
    }
    sse(st, keepalive)
}

impl SseWriter for Streamer {
    fn pending(&mut self) -> &mut VecDeque<SseEvent> {
        &mut self.pending
    }
    fn ended(&self) -> bool {
        self.ended
    }
    fn rx(&mut self) -> &mut EventRx {
        &mut self.rx
    }
    fn on(&mut self, ev: Option<Event>) {
        Streamer::on(self, ev)
    }
}

#[cfg(test)]
mod tests;

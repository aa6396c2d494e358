//! Request parsing: JSON bodies into validated types at the boundary, every error naming the
//! field (`param`). Fields follow OpenAI's definitions, plus llama.cpp's samplers (top_k, min_p,
//! repeat_penalty); unknown fields are ignored, `null` means absent.

use cortiq_engine::sampling::{SamplerParams, random_seed};
use cortiq_engine::spec::{SpecMethod, SpecParams};
use cortiq_formats::calls::Family;
use cortiq_formats::chat::{ChatMessage, FunctionCall, ToolCall};
use serde_json::{Map, Value};

use crate::error::ApiError;

pub type Obj = Map<String, Value>;

/// Parse a body as a JSON object.
pub fn object(body: &[u8]) -> Result<Obj, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request("invalid_json", format!("the body is not valid JSON: {e}")))?;
    match v {
        Value::Object(o) => Ok(o),
        _ => Err(ApiError::bad_request("invalid_json", "the body must be a JSON object")),
    }
}

fn field<'a>(o: &'a Obj, key: &str) -> Option<&'a Value> {
    o.get(key).filter(|v| !v.is_null())
}

pub fn opt_bool(o: &Obj, key: &str) -> Result<Option<bool>, ApiError> {
    match field(o, key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(ApiError::invalid(key, format!("'{key}' must be a boolean, got {v}"))),
    }
}

pub fn opt_f32(o: &Obj, key: &str, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
    match field(o, key) {
        None => Ok(None),
        Some(Value::Number(n)) => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            if !(lo..=hi).contains(&x) {
                return Err(ApiError::invalid(key, format!("'{key}' must be within [{lo}, {hi}], got {x}")));
            }
            Ok(Some(x as f32))
        }
        Some(v) => Err(ApiError::invalid(key, format!("'{key}' must be a number, got {v}"))),
    }
}

pub fn opt_int(o: &Obj, key: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
    match field(o, key) {
        None => Ok(None),
        Some(Value::Number(n)) => {
            let x = n.as_i64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9e15).map(|f| f as i64));
            match x {
                Some(x) if (lo..=hi).contains(&x) => Ok(Some(x)),
                Some(x) => Err(ApiError::invalid(key, format!("'{key}' must be within [{lo}, {hi}], got {x}"))),
                None => Err(ApiError::invalid(key, format!("'{key}' must be an integer, got {n}"))),
            }
        }
        Some(v) => Err(ApiError::invalid(key, format!("'{key}' must be an integer, got {v}"))),
    }
}

pub fn opt_str<'a>(o: &'a Obj, key: &str) -> Result<Option<&'a str>, ApiError> {
    match field(o, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(ApiError::invalid(key, format!("'{key}' must be a string, got {v}"))),
    }
}

/// What both completion endpoints take besides the prompt.
#[derive(Debug, Clone)]
pub struct GenParams {
    pub sampler: SamplerParams,
    /// `max_tokens` / `max_completion_tokens`; None = until the context fills.
    pub max_tokens: Option<usize>,
    pub stops: Vec<String>,
    pub n: usize,
    /// Some(top) when log-probabilities are asked for.
    pub logprobs: Option<usize>,
    pub logit_bias: Vec<(u32, f32)>,
    pub stream: bool,
    pub include_usage: bool,
    pub ignore_eos: bool,
    /// `cache_prompt` (llama-server's field, default true): use the prompt cache.
    pub cache_prompt: bool,
    /// `return_tokens` (llama-server's field): each choice of a whole response carries the ids
    /// it generated (`tokens`), so a client can resend them exactly.
    pub return_tokens: bool,
    pub model: Option<String>,
    /// The JSON schema the output must follow (`json_object`: any object).
    pub json_schema: Option<Value>,
    /// A Lark grammar the output must follow (a forced tool call: `tool_choice` "required" or
    /// a named function).
    pub grammar: Option<String>,
    /// Under `tool_choice` auto: the call's grammar, held back until the model opens a call.
    pub lazy_call: Option<LazyCall>,
    /// The prompt cache's scope (the route sets it from the request's API key).
    pub cache_scope: cortiq_engine::prefix::Scope,
    /// The reasoning budget to hold the request to: (the thinking tags, the prompt ends inside
    /// the block, at most this many thinking tokens).
    pub think_budget: Option<(cortiq_formats::calls::ThinkTags, bool, usize)>,
    /// The request's `speculative` settings, over the server's default (`spec_params`).
    pub speculative: SpecRequest,
}

/// A request's `speculative` object, llama-server's names: `{"type": "ngram" | "draft" |
/// "none", "n_max": N, "n_min": N}`; every field optional, each over the server's default.
#[derive(Debug, Clone, Default)]
pub struct SpecRequest {
    /// The drafter asked for (None: the server's default).
    pub kind: Option<SpecKind>,
    pub n_max: Option<usize>,
    pub n_min: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecKind {
    None,
    Ngram,
    Draft,
}

/// Draft tokens per verify at most, per request.
pub const MAX_DRAFT: i64 = 64;

impl SpecRequest {
    fn parse(o: &Obj) -> Result<SpecRequest, ApiError> {
        let Some(v) = field(o, "speculative") else { return Ok(SpecRequest::default()) };
        let Value::Object(so) = v else {
            return Err(ApiError::invalid("speculative", format!("'speculative' must be an object, got {v}")));
        };
        let sub = |e: ApiError, key: &str| ApiError { param: Some(format!("speculative.{key}")), ..e };
        let kind = match opt_str(so, "type").map_err(|e| sub(e, "type"))? {
            None => None,
            Some("none") => Some(SpecKind::None),
            Some("ngram") => Some(SpecKind::Ngram),
            Some("draft") => Some(SpecKind::Draft),
            Some(t) => {
                let msg = format!("'speculative.type' must be 'ngram', 'draft' or 'none', got {t:?}");
                return Err(sub(ApiError::invalid("type", msg), "type"));
            }
        };
        let n_max = opt_int(so, "n_max", 1, MAX_DRAFT).map_err(|e| sub(e, "n_max"))?.map(|n| n as usize);
        let n_min = opt_int(so, "n_min", 0, MAX_DRAFT).map_err(|e| sub(e, "n_min"))?.map(|n| n as usize);
        Ok(SpecRequest { kind, n_max, n_min })
    }

    /// The settings the request runs with: the server's `default` with this request's fields
    /// over it ("ngram" on a server without n-gram settings takes the CLI's defaults; "draft"
    /// needs the server's draft model).
    pub fn resolve(&self, default: Option<SpecParams>, has_draft: bool) -> Result<Option<SpecParams>, ApiError> {
        let is_draft = |p: &SpecParams| matches!(p.method, SpecMethod::Draft { .. });
        let base = match (self.kind, default) {
            (Some(SpecKind::None), _) | (None, None) => return Ok(None),
            (None, Some(d)) => d,
            (Some(SpecKind::Ngram), Some(d)) if matches!(d.method, SpecMethod::Ngram { .. }) => d,
            (Some(SpecKind::Ngram), _) => SpecParams::ngram(),
            (Some(SpecKind::Draft), Some(d)) if is_draft(&d) => d,
            (Some(SpecKind::Draft), d) => {
                if !has_draft {
                    return Err(ApiError::invalid(
                        "speculative.type",
                        "'speculative.type' \"draft\" needs a server started with a draft model (--spec-draft MODEL)",
                    ));
                }
                SpecParams { method: SpecMethod::Draft { p_min: 0.0 }, ..d.unwrap_or_else(SpecParams::ngram) }
            }
        };
        let p = SpecParams { n_max: self.n_max.unwrap_or(base.n_max), n_min: self.n_min.unwrap_or(base.n_min), ..base };
        if p.n_min > p.n_max {
            return Err(ApiError::invalid(
                "speculative.n_min",
                format!("'speculative.n_min' ({}) is above 'speculative.n_max' ({})", p.n_min, p.n_max),
            ));
        }
        Ok(Some(p))
    }
}

/// Stop strings per request at most (OpenAI allows 4; llama.cpp any number).
const MAX_STOPS: usize = 16;
/// Choices per request at most.
pub const MAX_N: i64 = 16;

/// Parse the sampling and output fields. `chat` selects the chat form of `logprobs` (a boolean
/// plus `top_logprobs`) over the completions form (an integer).
pub fn gen_params(o: &Obj, vocab: usize, chat: bool) -> Result<GenParams, ApiError> {
    let mut p = SamplerParams::default();
    if let Some(t) = opt_f32(o, "temperature", 0.0, 2.0)? {
        p.temperature = t;
    }
    if let Some(t) = opt_f32(o, "top_p", 0.0, 1.0)? {
        p.top_p = t;
    }
    if let Some(k) = opt_int(o, "top_k", 0, 1 << 31)? {
        p.top_k = k as usize;
    }
    if let Some(m) = opt_f32(o, "min_p", 0.0, 1.0)? {
        p.min_p = m;
    }
    if let Some(r) = opt_f32(o, "repeat_penalty", 0.0, 10.0)? {
        p.repeat_penalty = r;
    }
    if let Some(v) = opt_f32(o, "presence_penalty", -2.0, 2.0)? {
        p.presence_penalty = v;
    }
    if let Some(v) = opt_f32(o, "frequency_penalty", -2.0, 2.0)? {
        p.frequency_penalty = v;
    }
    if let Some(n) = opt_int(o, "repeat_last_n", -1, 1 << 31)? {
        p.repeat_last_n = if n < 0 { usize::MAX } else { n as usize };
    }
    // OpenAI's seed is a signed 64-bit integer; its bits seed the RNG.
    p.seed = match field(o, "seed") {
        None => random_seed(),
        Some(Value::Number(n)) => match (n.as_i64(), n.as_u64()) {
            (Some(s), _) => s as u64,
            (_, Some(s)) => s,
            _ => return Err(ApiError::invalid("seed", format!("'seed' must be an integer, got {n}"))),
        },
        Some(v) => return Err(ApiError::invalid("seed", format!("'seed' must be an integer, got {v}"))),
    };

    let max_completion = opt_int(o, "max_completion_tokens", 1, i64::MAX)?;
    let max_tokens = match opt_int(o, "max_tokens", -1, i64::MAX)? {
        // llama.cpp's n_predict = -1 means "no limit"; 0 is no completion, refused as OpenAI does.
        Some(0) => return Err(ApiError::invalid("max_tokens", "'max_tokens' must be at least 1")),
        Some(-1) => None,
        Some(n) => Some(n as usize),
        None => None,
    };
    let max_tokens = max_completion.map(|n| n as usize).or(max_tokens);

    let stops = match field(o, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => {
            if a.len() > MAX_STOPS {
                return Err(ApiError::invalid("stop", format!("at most {MAX_STOPS} stop strings, got {}", a.len())));
            }
            a.iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.clone()),
                    v => Err(ApiError::invalid("stop", format!("'stop' entries must be strings, got {v}"))),
                })
                .collect::<Result<_, _>>()?
        }
        Some(v) => return Err(ApiError::invalid("stop", format!("'stop' must be a string or a list of strings, got {v}"))),
    };

    let n = opt_int(o, "n", 1, MAX_N)?.unwrap_or(1) as usize;

    let logprobs = if chat {
        let on = opt_bool(o, "logprobs")?.unwrap_or(false);
        let top = opt_int(o, "top_logprobs", 0, 20)?;
        if top.is_some() && !on {
            return Err(ApiError::invalid("top_logprobs", "'top_logprobs' needs 'logprobs': true"));
        }
        on.then_some(top.unwrap_or(0) as usize)
    } else {
        opt_int(o, "logprobs", 0, 20)?.map(|n| n as usize)
    };

    let logit_bias = match field(o, "logit_bias") {
        None => Vec::new(),
        Some(Value::Object(m)) => {
            let mut out = Vec::with_capacity(m.len());
            for (k, v) in m {
                let id: u32 = k.parse().ok().filter(|&id: &u32| (id as usize) < vocab).ok_or_else(|| {
                    ApiError::invalid("logit_bias", format!("'logit_bias' key {k:?} is not a token id below {vocab}"))
                })?;
                let b = v.as_f64().filter(|b| (-100.0..=100.0).contains(b)).ok_or_else(|| {
                    ApiError::invalid("logit_bias", format!("'logit_bias' values must be numbers within [-100, 100], got {v}"))
                })?;
                out.push((id, b as f32));
            }
            out.sort_by_key(|&(id, _)| id);
            out
        }
        Some(v) => {
            return Err(ApiError::invalid("logit_bias", format!("'logit_bias' must be an object of token id -> bias, got {v}")));
        }
    };

    let stream = opt_bool(o, "stream")?.unwrap_or(false);
    let include_usage = match field(o, "stream_options") {
        None => false,
        Some(Value::Object(so)) => {
            if !stream {
                return Err(ApiError::invalid("stream_options", "'stream_options' is only allowed with 'stream': true"));
            }
            opt_bool(so, "include_usage")
                .map_err(|e| ApiError { param: Some("stream_options.include_usage".into()), ..e })?
                .unwrap_or(false)
        }
        Some(v) => return Err(ApiError::invalid("stream_options", format!("'stream_options' must be an object, got {v}"))),
    };

    let json_schema = match field(o, "response_format") {
        None => None,
        Some(Value::Object(rf)) => match rf.get("type").and_then(Value::as_str) {
            Some("text") => None,
            Some("json_object") => Some(match rf.get("schema") {
                // llama.cpp's form: a schema beside json_object.
                Some(s @ Value::Object(_)) => s.clone(),
                _ => serde_json::json!({"type": "object"}),
            }),
            Some("json_schema") => match rf.get("json_schema").and_then(|j| j.get("schema")) {
                Some(s @ (Value::Object(_) | Value::Bool(true))) => Some(s.clone()),
                _ => {
                    return Err(ApiError::invalid(
                        "response_format",
                        "'response_format.json_schema.schema' must be a JSON schema object",
                    ));
                }
            },
            _ => {
                return Err(ApiError::invalid(
                    "response_format",
                    "'response_format.type' must be 'text', 'json_object' or 'json_schema'",
                ));
            }
        },
        Some(v) => return Err(ApiError::invalid("response_format", format!("'response_format' must be an object, got {v}"))),
    };
    if opt_bool(o, "echo")?.unwrap_or(false) {
        return Err(ApiError { code: Some("unsupported_value"), ..ApiError::invalid("echo", "'echo' is not supported") });
    }

    Ok(GenParams {
        sampler: p,
        max_tokens,
        stops,
        n,
        logprobs,
        logit_bias,
        stream,
        include_usage,
        ignore_eos: opt_bool(o, "ignore_eos")?.unwrap_or(false),
        cache_prompt: opt_bool(o, "cache_prompt")?.unwrap_or(true),
        return_tokens: opt_bool(o, "return_tokens")?.unwrap_or(false),
        model: opt_str(o, "model")?.map(str::to_string),
        json_schema,
        grammar: None,
        lazy_call: None,
        cache_scope: cortiq_engine::prefix::SHARED,
        think_budget: None,
        speculative: SpecRequest::parse(o)?,
    })
}

/// `messages`: roles system / developer (as system) / user / assistant / tool, content a string
/// or a list of text parts; an assistant turn may carry `tool_calls` (its content then may be
/// null) and `reasoning_content` (or `reasoning`), a tool turn its `tool_call_id` and `name`.
pub fn messages(o: &Obj) -> Result<Vec<ChatMessage>, ApiError> {
    let Some(Value::Array(list)) = field(o, "messages") else {
        return Err(ApiError::invalid("messages", "'messages' must be a non-empty list of messages"));
    };
    if list.is_empty() {
        return Err(ApiError::invalid("messages", "'messages' must be a non-empty list of messages"));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let param = format!("messages[{i}]");
        let Value::Object(m) = m else {
            return Err(ApiError::invalid(&param, format!("{param} must be an object with 'role' and 'content'")));
        };
        let role = match m.get("role") {
            Some(Value::String(r)) => r.as_str(),
            _ => return Err(ApiError::invalid(&format!("{param}.role"), format!("{param}.role must be a string"))),
        };
        let role = match role {
            "system" | "user" | "assistant" | "tool" => role,
            "developer" => "system",
            r => {
                return Err(ApiError::invalid(
                    &format!("{param}.role"),
                    format!("{param}.role '{r}' is not one of system, developer, user, assistant, tool"),
                ));
            }
        };
        let content = match m.get("content") {
            Some(Value::Array(parts)) => text_parts(parts, &format!("{param}.content"))?,
            Some(Value::String(s)) => s.clone(),
            None | Some(Value::Null) if role == "assistant" => String::new(),
            _ => {
                return Err(ApiError::invalid(
                    &format!("{param}.content"),
                    format!("{param}.content must be a string or a list of text parts"),
                ));
            }
        };
        let mut msg = ChatMessage::new(role, content);
        if role == "assistant" {
            msg.reasoning_content = match (field(m, "reasoning_content"), field(m, "reasoning")) {
                (Some(Value::String(r)), _) | (None, Some(Value::String(r))) => Some(r.clone()),
                (None, None) => None,
                _ => {
                    return Err(ApiError::invalid(&format!("{param}.reasoning_content"), "reasoning_content must be a string"));
                }
            };
            if let Some(v) = field(m, "tool_calls") {
                msg.tool_calls = tool_calls(v, &format!("{param}.tool_calls"))?;
            }
        }
        if role == "tool" {
            msg.tool_call_id = opt_str(m, "tool_call_id")
                .map_err(|e| ApiError { param: Some(format!("{param}.tool_call_id")), ..e })?
                .map(str::to_string);
            msg.name =
                opt_str(m, "name").map_err(|e| ApiError { param: Some(format!("{param}.name")), ..e })?.map(str::to_string);
        }
        out.push(msg);
    }
    Ok(out)
}

/// A content list: text parts joined.
fn text_parts(parts: &[Value], param: &str) -> Result<String, ApiError> {
    let mut s = String::new();
    for (j, part) in parts.iter().enumerate() {
        let pp = format!("{param}[{j}]");
        match (part.get("type").and_then(Value::as_str), part.get("text")) {
            (Some("text"), Some(Value::String(t))) => s.push_str(t),
            (Some("text"), _) => return Err(ApiError::invalid(&pp, format!("{pp}.text must be a string"))),
            (Some(t), _) => {
                return Err(ApiError {
                    code: Some("unsupported_value"),
                    ..ApiError::invalid(&pp, format!("{pp}: content parts of type '{t}' are not supported (text only)"))
                });
            }
            (None, _) => return Err(ApiError::invalid(&pp, format!("{pp} must be an object with 'type'"))),
        }
    }
    Ok(s)
}

/// An assistant turn's `tool_calls`: `[{"id", "type": "function", "function": {"name",
/// "arguments": JSON text}}]`. The arguments reach the template parsed (transformers' form).
fn tool_calls(v: &Value, param: &str) -> Result<Vec<ToolCall>, ApiError> {
    let Value::Array(list) = v else { return Err(ApiError::invalid(param, format!("{param} must be a list"))) };
    let mut out = Vec::with_capacity(list.len());
    for (k, c) in list.iter().enumerate() {
        let pk = format!("{param}[{k}]");
        let f = c.get("function").and_then(Value::as_object);
        let name = f.and_then(|f| f.get("name")).and_then(Value::as_str);
        let (Some(f), Some(name)) = (f, name) else {
            return Err(ApiError::invalid(
                &pk,
                format!("{pk} must be {{\"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}"),
            ));
        };
        let arguments = match f.get("arguments") {
            None | Some(Value::Null) => Value::Object(Obj::new()),
            Some(Value::String(a)) => serde_json::from_str(a).unwrap_or_else(|_| Value::String(a.clone())),
            Some(a @ Value::Object(_)) => a.clone(),
            Some(_) => {
                return Err(ApiError::invalid(
                    &format!("{pk}.function.arguments"),
                    format!("{pk}.function.arguments must be a JSON string"),
                ));
            }
        };
        let id = c.get("id").and_then(Value::as_str).unwrap_or_default().to_string();
        out.push(ToolCall { id, kind: "function".into(), function: FunctionCall { name: name.to_string(), arguments } });
    }
    Ok(out)
}

/// How the model may call tools (`tool_choice`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    Auto,
    None,
    Required,
    Named(String),
}

/// The chat request's agent fields: `tools`, `tool_choice`, `parallel_tool_calls`,
/// `chat_template_kwargs`, `reasoning_effort`.
/// A tool call's grammar under `tool_choice` auto (`structured::Compiled::lazy`).
#[derive(Debug, Clone)]
pub struct LazyCall {
    /// The family's call opener; nothing is constrained before it.
    pub opener: String,
    /// The grammar of what follows the opener up to the call's closer.
    pub grammar: String,
    /// The thinking block's tags (an opener inside it is thinking) and whether the prompt
    /// ends inside the block.
    pub think: Option<cortiq_formats::calls::ThinkTags>,
    pub in_think: bool,
}

#[derive(Debug, Clone)]
pub struct AgentParams {
    /// The tool list as sent (each checked to be a function with a name).
    pub tools: Vec<Value>,
    pub choice: ToolChoice,
    pub parallel: bool,
    /// Template variables (`chat_template_kwargs`; `reasoning_effort: "none"` adds
    /// `enable_thinking: false`).
    pub kwargs: Obj,
    /// `reasoning_budget`: None, the server's (`--reasoning-budget`); Some(None) unlimited (-1);
    /// Some(Some(n)) at most n thinking tokens.
    pub budget: Option<Option<usize>>,
}

pub fn agent_params(o: &Obj) -> Result<AgentParams, ApiError> {
    let tools = match field(o, "tools") {
        None => Vec::new(),
        Some(Value::Array(a)) => a.clone(),
        Some(v) => return Err(ApiError::invalid("tools", format!("'tools' must be a list of tools, got {v}"))),
    };
    let mut names = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        let p = format!("tools[{i}]");
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(k) => {
                return Err(ApiError {
                    code: Some("unsupported_value"),
                    ..ApiError::invalid(&format!("{p}.type"), format!("{p}.type '{k}' is not supported (function tools only)"))
                });
            }
            None => return Err(ApiError::invalid(&format!("{p}.type"), format!("{p} must have \"type\": \"function\""))),
        }
        let f = t.get("function").and_then(Value::as_object);
        match f.and_then(|f| f.get("name")).and_then(Value::as_str) {
            Some(n) if !n.is_empty() => names.push(n.to_string()),
            _ => {
                return Err(ApiError::invalid(
                    &format!("{p}.function.name"),
                    format!("{p}.function.name must be a non-empty string"),
                ));
            }
        }
        if let Some(ps) = f.and_then(|f| f.get("parameters")).filter(|v| !v.is_null()) {
            if !ps.is_object() {
                return Err(ApiError::invalid(
                    &format!("{p}.function.parameters"),
                    format!("{p}.function.parameters must be a JSON schema object"),
                ));
            }
        }
    }
    let choice = match field(o, "tool_choice") {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            s => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("'tool_choice' must be 'auto', 'none', 'required' or a function, got {s:?}"),
                ));
            }
        },
        Some(Value::Object(c)) => match c.get("function").and_then(|f| f.get("name")).and_then(Value::as_str) {
            Some(n) if names.iter().any(|x| x == n) => ToolChoice::Named(n.to_string()),
            Some(n) => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("'tool_choice' names the function {n:?}, which is not in 'tools'"),
                ));
            }
            None => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    "'tool_choice' must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                ));
            }
        },
        Some(v) => return Err(ApiError::invalid("tool_choice", format!("'tool_choice' must be a string or an object, got {v}"))),
    };
    if matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) && tools.is_empty() {
        return Err(ApiError::invalid("tool_choice", "'tool_choice' asks for a tool call but 'tools' is empty"));
    }
    let parallel = opt_bool(o, "parallel_tool_calls")?.unwrap_or(true);
    let mut kwargs = match field(o, "chat_template_kwargs") {
        None => Obj::new(),
        Some(Value::Object(k)) => k.clone(),
        Some(v) => {
            return Err(ApiError::invalid("chat_template_kwargs", format!("'chat_template_kwargs' must be an object, got {v}")));
        }
    };
    match opt_str(o, "reasoning_effort")? {
        None | Some("low" | "medium" | "high" | "minimal") => {}
        Some("none") => {
            kwargs.entry("enable_thinking").or_insert(Value::Bool(false));
        }
        Some(e) => {
            return Err(ApiError::invalid(
                "reasoning_effort",
                format!("'reasoning_effort' must be 'none', 'minimal', 'low', 'medium' or 'high', got {e:?}"),
            ));
        }
    }
    let budget = opt_int(o, "reasoning_budget", -1, i32::MAX as i64)?.map(|n| (n >= 0).then_some(n as usize));
    Ok(AgentParams { tools, choice, parallel, kwargs, budget })
}

impl AgentParams {
    /// The grammar of a forced call (`required`: any of the tools, one or more when parallel;
    /// a named function: that one, once), in `family`'s own form where the grammar writes it
    /// (Hermes: `<tool_call>` + a JSON object `{"name", "arguments"}`; Qwen XML: `<tool_call>` +
    /// `<function=...>` with a `<parameter=...>` per argument), a bare JSON object otherwise
    /// (every family's parser takes bare JSON calls); the arguments follow the tool's parameter
    /// schema. None when the choice forces nothing.
    /// `close_think`: the prompt ends inside an open thinking block; the grammar closes it
    /// first (a forced call skips the thinking).
    pub fn forced_grammar(&self, family: Family, close_think: Option<&str>) -> Option<String> {
        let names: Vec<&str> = match &self.choice {
            ToolChoice::Auto | ToolChoice::None => return None,
            ToolChoice::Required => self.tools.iter().filter_map(tool_name).collect(),
            ToolChoice::Named(n) => vec![n.as_str()],
        };
        if family == Family::Harmony {
            return Some(self.harmony_grammar(&names));
        }
        let many = self.parallel && self.choice == ToolChoice::Required;
        let first = match close_think {
            Some(tag) => format!("{} ", lark_str(&format!("{tag}\n\n"))),
            None => String::new(),
        };
        let more = if many { " (\"\\n\" call)*" } else { "" };
        let call = match family {
            Family::Hermes | Family::QwenXml => "\"<tool_call>\" body",
            _ => "body",
        };
        let body = match family {
            Family::Hermes => format!("\"\\n\" json \"\\n</tool_call>\"\njson: %json {}\n", self.call_schema(&names)),
            Family::QwenXml => self.xml_grammar(&names),
            _ => format!("%json {}\n", self.call_schema(&names)),
        };
        Some(format!("start: {first}call{more}\ncall: {call}\nbody: {body}"))
    }

    /// gpt-oss's forced call: right after the prompt's `<|start|>assistant`, a commentary
    /// message to `functions.NAME` whose body is the arguments as JSON (the tool's parameter
    /// schema), `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`
    /// as the template renders calls. The header's markup tokens render as text (as in
    /// llama.cpp, `tokenizer::harmony_markup`), so the grammar writes them as text; `<|call|>`
    /// is a control token that ends the generation, written as llguidance's `<|...|>` lexeme
    /// (the token trie holds control tokens under their text). One call per turn, and no
    /// analysis message first: a forced call skips the thinking, as `close_think` does for the
    /// other families.
    fn harmony_grammar(&self, names: &[&str]) -> String {
        let mut alts = Vec::new();
        let mut rules = String::new();
        for (i, t) in self.tools.iter().enumerate().filter(|(_, t)| tool_name(t).is_some_and(|n| names.contains(&n))) {
            let schema = as_templates_write(params_schema(t));
            let head = lark_str(&format!(
                "<|channel|>commentary to=functions.{} <|constrain|>json<|message|>",
                tool_name(t).unwrap_or_default()
            ));
            rules.push_str(&format!("f{i}: {head} f{i}_args <|call|>\nf{i}_args: %json {schema}\n"));
            alts.push(format!("f{i}"));
        }
        format!("start: {}\n{rules}", alts.join(" | "))
    }

    /// Under `auto`, for the families whose `<tool_call>` body a grammar writes (Hermes' JSON,
    /// Qwen's XML): the opener, and the grammar of the rest of the call (any of the tools, its
    /// arguments following that tool's schema, then the closing tag). None for the other
    /// families and other choices: their calls are checked by the parser alone.
    pub fn lazy_call(&self, family: Family) -> Option<(String, String)> {
        if self.choice != ToolChoice::Auto || self.tools.is_empty() {
            return None;
        }
        let names: Vec<&str> = self.tools.iter().filter_map(tool_name).collect();
        let body = match family {
            Family::Hermes => format!("\"\\n\" json \"\\n</tool_call>\"\njson: %json {}\n", self.call_schema(&names)),
            Family::QwenXml => self.xml_grammar(&names),
            _ => return None,
        };
        Some(("<tool_call>".to_string(), format!("start: body\nbody: {body}")))
    }

    /// Qwen's XML call after `<tool_call>`: `\n<function=NAME>\n`, the parameters in the
    /// schema's order (the required ones present, the others optional), each
    /// `<parameter=P>\nVALUE\n</parameter>\n` with a string's value as raw text and any other
    /// as JSON following its schema, then `</function>\n</tool_call>`. The rule `body` and
    /// its own rules.
    fn xml_grammar(&self, names: &[&str]) -> String {
        let mut alts = Vec::new();
        let mut rules = String::new();
        for (i, t) in self.tools.iter().enumerate().filter(|(_, t)| tool_name(t).is_some_and(|n| names.contains(&n))) {
            let f = &t["function"];
            let params = f.get("parameters").map(|p| closed(p.clone())).unwrap_or(Value::Null);
            let required: Vec<&str> =
                params.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
            let mut seq = vec![lark_str(&format!("\n<function={}>\n", tool_name(t).unwrap_or_default()))];
            for (j, (p, ps)) in params.get("properties").and_then(Value::as_object).into_iter().flatten().enumerate() {
                let r = format!("f{i}_p{j}");
                let open = lark_str(&format!("<parameter={p}>\n"));
                let close = lark_str("\n</parameter>\n");
                match ps.get("type").and_then(Value::as_str) {
                    Some("string") | None => {
                        // Raw text up to the first closer; an enum's values, or the schema's
                        // length bounds (in characters, as JSON schema counts them).
                        let value = match ps.get("enum").and_then(Value::as_array) {
                            Some(e) if e.iter().all(Value::is_string) => {
                                let alts: Vec<String> = e.iter().filter_map(Value::as_str).map(lark_str).collect();
                                format!("({})", alts.join(" | "))
                            }
                            _ => {
                                let min = ps.get("minLength").and_then(Value::as_u64).unwrap_or(0);
                                let max = ps.get("maxLength").and_then(Value::as_u64).map_or(String::new(), |m| m.to_string());
                                format!("/(?s:.{{{min},{max}}})/")
                            }
                        };
                        rules.push_str(&format!("{r}: {open} {r}_v\n{r}_v[suffix={close}]: {value}\n"));
                    }
                    Some(_) => {
                        let schema = as_templates_write(ps.clone());
                        rules.push_str(&format!("{r}: {open} {r}_v {close}\n{r}_v: %json {schema}\n"));
                    }
                }
                seq.push(if required.contains(&p.as_str()) { r } else { format!("{r}?") });
            }
            seq.push(lark_str("</function>\n</tool_call>"));
            rules.push_str(&format!("f{i}: {}\n", seq.join(" ")));
            alts.push(format!("f{i}"));
        }
        format!("{}\n{rules}", alts.join(" | "))
    }

    /// A call of one of `names` as JSON, `{"name": "f", "arguments": {...}}`, written as the
    /// templates show it (Python's `json.dumps` separators, `", "` and `": "`) and no other
    /// whitespace between tokens (a weak model could otherwise pad without end).
    fn call_schema(&self, names: &[&str]) -> Value {
        let schemas: Vec<Value> = self
            .tools
            .iter()
            .filter(|t| tool_name(t).is_some_and(|n| names.contains(&n)))
            .map(|t| {
                serde_json::json!({
                    "type": "object",
                    "properties": {"name": {"const": t["function"]["name"]}, "arguments": params_schema(t)},
                    "required": ["name", "arguments"],
                    "additionalProperties": false,
                })
            })
            .collect();
        as_templates_write(if schemas.len() == 1 { schemas[0].clone() } else { serde_json::json!({"anyOf": schemas}) })
    }
}

/// A tool's parameter schema, closed (`closed`); an object of any keys where it declares none.
fn params_schema(t: &Value) -> Value {
    match t["function"].get("parameters") {
        Some(p @ Value::Object(_)) => closed(p.clone()),
        _ => serde_json::json!({"type": "object"}),
    }
}

/// `schema` as the chat templates write JSON: Python's `json.dumps` separators (`", "` and
/// `": "`) and no other whitespace between tokens (a weak model could otherwise pad without end).
fn as_templates_write(mut schema: Value) -> Value {
    schema["x-guidance"] = serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "});
    schema
}

/// A parameter schema whose objects with declared `properties` take no others unless they
/// say so (`additionalProperties` unset): a call's grammar admits the declared arguments only,
/// as OpenAI's strict tools and llama.cpp's schema grammars do.
fn closed(mut v: Value) -> Value {
    let Value::Object(o) = &mut v else { return v };
    if o.contains_key("properties") && !o.contains_key("additionalProperties") {
        o.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (k, x) in o.iter_mut() {
        match (k.as_str(), x) {
            ("properties" | "$defs" | "definitions", Value::Object(m)) => m.values_mut().for_each(|s| *s = closed(s.take())),
            ("anyOf" | "oneOf" | "allOf" | "prefixItems", Value::Array(a)) => a.iter_mut().for_each(|s| *s = closed(s.take())),
            ("items" | "additionalProperties" | "not", s @ Value::Object(_)) => *s = closed(s.take()),
            _ => {}
        }
    }
    v
}

/// A Lark string literal (JSON's string syntax).
fn lark_str(s: &str) -> String {
    serde_json::to_string(s).expect("a string")
}

fn tool_name(t: &Value) -> Option<&str> {
    t.get("function")?.get("name")?.as_str()
}

/// One prompt of the completions endpoint: text or token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

/// What admission needs of a completions body, read from its raw bytes before anything is
/// parsed into values (`quick_shape`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// `n` (1 when absent or null).
    pub n: usize,
    /// Prompts in `prompt`.
    pub prompts: usize,
    /// The longest token-id prompt's length (0: the prompts are text).
    pub longest_ids: usize,
    /// The look stopped at a limit (`quick_shape`'s `stop`): `prompts` or `longest_ids` is a
    /// lower bound already past it, the rest of the body unread.
    pub cut: bool,
}

/// `n` and the prompts' count and token lengths, from a single pass over the body's bytes
/// that allocates nothing: a body of a million prompts (or a million-token prompt) is refused
/// in milliseconds, before the full parse would build a value for each (time and memory that
/// grow with the hostile body). None whenever the body is anything but a plain JSON object
/// whose `n` is an integer in range and whose `prompt` is a string or a list of one kind:
/// the full parse then decides, so this only ever refuses what it would refuse too (a prompt
/// of ids both too long and out of the vocabulary is named too long here). Written by
/// hand because a serde pass, even skipping, costs tens of nanoseconds per element.
///
/// `stop` (the queue's room, the context): the look stops as soon as the prompts x the `n`
/// read so far pass the room, or a token-id prompt reaches the context (`Shape::cut`): a
/// million-prompt body is refused after reading a few hundred of them.
pub fn quick_shape(body: &[u8], stop: Option<(usize, usize)>) -> Option<Shape> {
    let mut c = Scan { b: body, i: 0, n: 1, stop, cut: false };
    let mut shape = Shape { n: 1, prompts: 1, longest_ids: 0, cut: false };
    c.ws();
    c.eat(b'{')?;
    c.ws();
    if c.eat(b'}').is_none() {
        loop {
            c.ws();
            let key = c.plain_string()?;
            c.ws();
            c.eat(b':')?;
            c.ws();
            match key {
                b"n" => {
                    shape.n =
                        if c.literal(b"null") { 1 } else { c.integer().filter(|n| (1..=MAX_N as u64).contains(n))? as usize };
                    c.n = shape.n;
                }
                b"prompt" => {
                    (shape.prompts, shape.longest_ids) = c.prompt()?;
                    if c.cut {
                        shape.cut = true;
                        return Some(shape);
                    }
                }
                _ => c.value(0)?,
            }
            c.ws();
            if c.eat(b',').is_some() {
                continue;
            }
            c.eat(b'}')?;
            break;
        }
    }
    c.ws();
    // serde_json reads UTF-8 only.
    (c.i == c.b.len() && std::str::from_utf8(body).is_ok()).then_some(shape)
}

/// A cursor over JSON bytes (`quick_shape`).
struct Scan<'a> {
    b: &'a [u8],
    i: usize,
    /// `n` as read so far, and where to stop (the room, the context); `cut` once stopped.
    n: usize,
    stop: Option<(usize, usize)>,
    cut: bool,
}

impl<'a> Scan<'a> {
    fn ws(&mut self) {
        while self.i < self.b.len() && matches!(self.b[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.b.get(self.i) == Some(&c)).then(|| self.i += 1)
    }

    fn literal(&mut self, l: &[u8]) -> bool {
        let hit = self.b[self.i..].starts_with(l);
        if hit {
            self.i += l.len();
        }
        hit
    }

    /// A key: a string without escapes, its bytes.
    fn plain_string(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let st = self.i;
        let len = self.b[st..].iter().position(|&c| c == b'"' || c == b'\\' || c < 0x20)?;
        self.i += len;
        self.eat(b'"')?;
        Some(&self.b[st..st + len])
    }

    /// Any string, its escapes checked as serde_json checks them (not decoded).
    fn string(&mut self) -> Option<()> {
        self.eat(b'"')?;
        while self.i < self.b.len() {
            match self.b[self.i] {
                b'"' => {
                    self.i += 1;
                    return Some(());
                }
                b'\\' => {
                    self.i += 1;
                    match *self.b.get(self.i)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.i += 1,
                        b'u' => {
                            let u = self.hex4()?;
                            if (0xDC00..0xE000).contains(&u) {
                                return None; // a lone trailing surrogate
                            }
                            if (0xD800..0xDC00).contains(&u) {
                                // A leading surrogate: its trailing half must follow.
                                (self.eat(b'\\').is_some() && self.b.get(self.i) == Some(&b'u')).then_some(())?;
                                (0xDC00..0xE000).contains(&self.hex4()?).then_some(())?;
                            }
                        }
                        _ => return None,
                    }
                }
                c if c < 0x20 => return None,
                _ => self.i += 1,
            }
        }
        None
    }

    /// `uXXXX` (the cursor on the `u`): the code unit.
    fn hex4(&mut self) -> Option<u32> {
        let h = self.b.get(self.i + 1..self.i + 5)?;
        let v = u32::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()?;
        h.iter().all(u8::is_ascii_hexdigit).then_some(())?;
        self.i += 5;
        Some(v)
    }

    /// A number as JSON writes it: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
    fn number(&mut self) -> Option<()> {
        let digits = |s: &mut Self| {
            let st = s.i;
            while s.b.get(s.i).is_some_and(u8::is_ascii_digit) {
                s.i += 1;
            }
            (s.i > st).then_some(())
        };
        let st = self.i;
        let _ = self.eat(b'-');
        if self.eat(b'0').is_none() {
            self.b.get(self.i).filter(|c| c.is_ascii_digit())?;
            digits(self)?;
        }
        if self.eat(b'.').is_some() {
            digits(self)?;
        }
        if matches!(self.b.get(self.i), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.b.get(self.i), Some(b'+' | b'-')) {
                self.i += 1;
            }
            digits(self)?;
        }
        // serde_json refuses a float past f64's range.
        let t = std::str::from_utf8(&self.b[st..self.i]).ok()?;
        (!t.contains(['.', 'e', 'E']) || t.parse::<f64>().is_ok_and(f64::is_finite)).then_some(())
    }

    /// A non-negative integer literal.
    fn integer(&mut self) -> Option<u64> {
        let st = self.i;
        let mut v: u64 = 0;
        while let Some(d) = self.b.get(self.i).filter(|c| c.is_ascii_digit()) {
            v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
            self.i += 1;
        }
        if self.i == st || (self.b[st] == b'0' && self.i > st + 1) || matches!(self.b.get(self.i), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        Some(v)
    }

    /// Any value, skipped (nesting bounded as serde_json bounds it).
    fn value(&mut self, depth: usize) -> Option<()> {
        if depth > 128 {
            return None;
        }
        match *self.b.get(self.i)? {
            b'"' => self.string(),
            b'{' | b'[' => {
                let close = if self.b[self.i] == b'{' { b'}' } else { b']' };
                self.i += 1;
                self.ws();
                if self.eat(close).is_some() {
                    return Some(());
                }
                loop {
                    self.ws();
                    if close == b'}' {
                        self.string()?;
                        self.ws();
                        self.eat(b':')?;
                        self.ws();
                    }
                    self.value(depth + 1)?;
                    self.ws();
                    if self.eat(b',').is_some() {
                        continue;
                    }
                    return self.eat(close);
                }
            }
            b't' => self.literal(b"true").then_some(()),
            b'f' => self.literal(b"false").then_some(()),
            b'n' => self.literal(b"null").then_some(()),
            _ => self.number(),
        }
    }

    /// `prompt`: (prompts, the longest token-id prompt's length).
    fn prompt(&mut self) -> Option<(usize, usize)> {
        if self.b.get(self.i) == Some(&b'"') {
            self.string()?;
            return Some((1, 0));
        }
        self.eat(b'[')?;
        self.ws();
        if self.eat(b']').is_some() {
            return None; // empty: the full parse names the error
        }
        // The list's kind, from its first element: ids, strings, or lists of ids.
        let kind = *self.b.get(self.i)?;
        let (mut count, mut longest) = (0usize, 0usize);
        let (room, n_ctx) = self.stop.unwrap_or((usize::MAX, usize::MAX));
        loop {
            self.ws();
            match kind {
                b'"' => self.string()?,
                b'[' => {
                    self.eat(b'[')?;
                    let mut n = 0;
                    self.ws();
                    if self.eat(b']').is_none() {
                        loop {
                            self.ws();
                            self.integer()?;
                            n += 1;
                            if n >= n_ctx {
                                self.cut = true;
                                return Some((count + 1, n));
                            }
                            self.ws();
                            if self.eat(b',').is_some() {
                                continue;
                            }
                            self.eat(b']')?;
                            break;
                        }
                    }
                    longest = longest.max(n);
                }
                b'0'..=b'9' => {
                    self.integer()?;
                }
                _ => return None,
            }
            count += 1;
            let past = if kind.is_ascii_digit() { count >= n_ctx } else { count.saturating_mul(self.n) > room };
            if past {
                self.cut = true;
                break;
            }
            self.ws();
            if self.eat(b',').is_some() {
                continue;
            }
            self.eat(b']')?;
            break;
        }
        Some(if kind.is_ascii_digit() { (1, count) } else { (count, longest) })
    }
}

/// How many prompts `prompt` holds, read from its shape without copying any (admission).
pub fn prompt_count(o: &Obj) -> usize {
    match field(o, "prompt") {
        Some(Value::Array(a)) if !a.is_empty() && !a.iter().all(Value::is_number) => a.len(),
        _ => 1,
    }
}

/// `prompt`: a string, a list of strings, a list of token ids, or a list of lists of ids.
pub fn prompts(o: &Obj, vocab: usize) -> Result<Vec<Prompt>, ApiError> {
    let ids = |a: &[Value]| -> Result<Vec<u32>, ApiError> {
        a.iter()
            .map(|v| {
                v.as_u64()
                    .filter(|&id| (id as usize) < vocab)
                    .map(|id| id as u32)
                    .ok_or_else(|| ApiError::invalid("prompt", format!("prompt token {v} is not a token id below {vocab}")))
            })
            .collect()
    };
    let bad = || {
        ApiError::invalid("prompt", "'prompt' must be a string, a list of strings, a list of token ids or a list of such lists")
    };
    let out = match field(o, "prompt") {
        Some(Value::String(s)) => vec![Prompt::Text(s.clone())],
        Some(Value::Array(a)) if a.is_empty() => return Err(bad()),
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => vec![Prompt::Tokens(ids(a)?)],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(Prompt::Text(s.clone())),
                Value::Array(t) if t.iter().all(Value::is_number) => Ok(Prompt::Tokens(ids(t)?)),
                _ => Err(bad()),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(bad()),
    };
    Ok(out)
}

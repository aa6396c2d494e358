//! Request parsing: JSON bodies into validated types at the boundary, every error naming the
//! field (`param`). Fields follow OpenAI's definitions, plus llama.cpp's samplers (top_k, min_p,
//! repeat_penalty); unknown fields are ignored, `null` means absent.

use cortiq_engine::sampling::{SamplerParams, random_seed};
use cortiq_engine::spec::{SpecMethod, SpecParams};
use cortiq_formats::chat::ChatMessage;
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
            (Some(SpecKind::Ngram), Some(d)) if !is_draft(&d) => d,
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
        speculative: SpecRequest::parse(o)?,
    })
}

/// `messages`: roles system / developer (as system) / user / assistant / tool, content a string
/// or a list of text parts.
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
            Some(Value::String(s)) => s.clone(),
            None | Some(Value::Null) if role == "assistant" => String::new(),
            Some(Value::Array(parts)) => {
                let mut s = String::new();
                for (j, part) in parts.iter().enumerate() {
                    let pp = format!("{param}.content[{j}]");
                    match (part.get("type").and_then(Value::as_str), part.get("text")) {
                        (Some("text"), Some(Value::String(t))) => s.push_str(t),
                        (Some("text"), _) => return Err(ApiError::invalid(&pp, format!("{pp}.text must be a string"))),
                        (Some(t), _) => {
                            return Err(ApiError {
                                code: Some("unsupported_value"),
                                ..ApiError::invalid(
                                    &pp,
                                    format!("{pp}: content parts of type '{t}' are not supported (text only)"),
                                )
                            });
                        }
                        (None, _) => return Err(ApiError::invalid(&pp, format!("{pp} must be an object with 'type'"))),
                    }
                }
                s
            }
            _ => {
                return Err(ApiError::invalid(
                    &format!("{param}.content"),
                    format!("{param}.content must be a string or a list of text parts"),
                ));
            }
        };
        out.push(ChatMessage::new(role, content));
    }
    Ok(out)
}

/// One prompt of the completions endpoint: text or token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
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

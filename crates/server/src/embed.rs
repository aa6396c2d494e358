//! Embeddings (issue 51): OpenAI's `POST /v1/embeddings` and ollama's `POST /api/embed` (and
//! its older `POST /api/embeddings`). Each input is tokenized as the model adds its special
//! tokens, run from an empty sequence on the engine thread between two generation steps
//! (`Handle::embed`: the weights stay where the generations read them), its final hidden states
//! pooled as `--pooling` says (the last position by default: decoder embedding models such as
//! Qwen3-Embedding) and scaled to unit length. `dimensions` keeps the first k values and scales
//! them to unit length again (Matryoshka truncation, as OpenAI's and ollama's `dimensions`).

use std::sync::Arc;

use crate::models::Served;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::{App, api, body_error, generate};

/// Inputs one request may hold.
const MAX_INPUTS: usize = 2048;

/// The request's inputs as token ids: a string, a list of strings, a list of ids or a list
/// of lists of ids (OpenAI's four forms; ollama's two string forms). Longer than the context:
/// cut to it where `truncate`, else a 400.
fn inputs(app: &App, v: Option<&Value>, param: &str, truncate: bool) -> Result<Vec<Vec<u32>>, ApiError> {
    let info = app.info()?;
    let n_ctx = info.sched.config().n_ctx;
    let text =
        |s: &str| -> Result<Vec<u32>, ApiError> { info.tok.encode_input(s).map_err(|e| ApiError::invalid(param, e.to_string())) };
    let ids = |a: &[Value]| -> Option<Vec<u32>> { a.iter().map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok())).collect() };
    let mut list = match v {
        Some(Value::String(s)) => vec![text(s)?],
        Some(Value::Array(a)) if a.is_empty() => return Err(ApiError::invalid(param, format!("'{param}' is an empty list"))),
        Some(Value::Array(a)) if a.len() > MAX_INPUTS => {
            return Err(ApiError::invalid(param, format!("at most {MAX_INPUTS} inputs per request, got {}", a.len())));
        }
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => {
            a.iter().map(|s| text(s.as_str().unwrap_or_default())).collect::<Result<_, _>>()?
        }
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => {
            vec![ids(a).ok_or_else(|| ApiError::invalid(param, "token ids must be non-negative integers"))?]
        }
        Some(Value::Array(a)) if a.iter().all(Value::is_array) => a
            .iter()
            .map(|x| ids(x.as_array().map_or(&[][..], Vec::as_slice)))
            .collect::<Option<_>>()
            .ok_or_else(|| ApiError::invalid(param, "token ids must be non-negative integers"))?,
        Some(v) => {
            return Err(ApiError::invalid(param, format!("'{param}' must be a string, a list of strings or token ids, got {v}")));
        }
        None => return Err(ApiError::invalid(param, format!("'{param}' is required"))),
    };
    for (i, t) in list.iter_mut().enumerate() {
        if t.is_empty() {
            return Err(ApiError::invalid(param, format!("input {i} is empty")));
        }
        if let Some(&bad) = t.iter().find(|&&id| id as usize >= info.vocab) {
            return Err(ApiError::invalid(
                param,
                format!("input {i}: token id {bad} is outside the vocabulary of {}", info.vocab),
            ));
        }
        if t.len() > n_ctx {
            if !truncate {
                return Err(ApiError::context_exceeded(t.len(), n_ctx, param));
            }
            // The text is cut, not the token the model appends after it (BERT's [SEP]), as
            // sentence-transformers' tokenizer cuts.
            let tail = info.tok.eos_id().filter(|&e| info.tok.add_eos() && t.last() == Some(&e) && n_ctx > 1);
            t.truncate(n_ctx - usize::from(tail.is_some()));
            t.extend(tail);
        }
    }
    Ok(list)
}

/// `dimensions`: a positive count up to the model's width.
fn dimensions(o: &api::Obj, d: usize) -> Result<Option<usize>, ApiError> {
    match api::opt_int(o, "dimensions", 1, i64::MAX)? {
        None => Ok(None),
        Some(k) if k as usize <= d => Ok(Some(k as usize)),
        Some(k) => Err(ApiError::invalid("dimensions", format!("'dimensions' must be at most the model's {d}, got {k}"))),
    }
}

/// The first `k` values of a unit vector, scaled to unit length again.
fn truncated(mut e: Vec<f32>, k: Option<usize>) -> Vec<f32> {
    if let Some(k) = k.filter(|&k| k < e.len()) {
        e.truncate(k);
        let n = e.iter().map(|v| f64::from(*v) * f64::from(*v)).sum::<f64>().sqrt();
        if n > 0.0 {
            e.iter_mut().for_each(|v| *v = (f64::from(*v) / n) as f32);
        }
    }
    e
}

/// Run the inputs on the engine thread.
async fn run(app: Arc<App>, list: Vec<Vec<u32>>) -> Result<Vec<Vec<f32>>, ApiError> {
    generate::blocking(app, move |app| {
        let info = app.info()?;
        info.sched.embed(list, info.pooling, info.normalize).map_err(|e| match e {
            cortiq_engine::sched::SessionOpError::Refused(m) => ApiError::invalid("input", m),
            cortiq_engine::sched::SessionOpError::Failed(m) => ApiError::internal(m),
        })
    })
    .await
}

/// `POST /v1/embeddings` (OpenAI): `input`, `encoding_format` ("float" or "base64"),
/// `dimensions`, `model` (the served one, or absent).
pub(crate) async fn openai(Served(app): Served, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let body = body.map_err(body_error)?;
    let (list, base64, dims) = generate::blocking(app.clone(), move |app| {
        let info = app.info()?;
        let o = api::object(&body)?;
        app.check_model(&api::opt_str(&o, "model")?.map(str::to_string))?;
        let base64 = match api::opt_str(&o, "encoding_format")? {
            None | Some("float") => false,
            Some("base64") => true,
            Some(f) => {
                return Err(ApiError::invalid(
                    "encoding_format",
                    format!("'encoding_format' must be float or base64, got {f:?}"),
                ));
            }
        };
        let dims = dimensions(&o, info.d_model)?;
        Ok((inputs(&app, o.get("input"), "input", false)?, base64, dims))
    })
    .await?;
    let n_tokens: usize = list.iter().map(Vec::len).sum();
    let rows = run(app.clone(), list).await?;
    let data: Vec<Value> = rows
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            let e = truncated(e, dims);
            let embedding =
                if base64 { json!(b64(&e.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())) } else { json!(e) };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(axum::Json(json!({
        "object": "list",
        "data": data,
        "model": app.opts.model_id,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }))
    .into_response())
}

/// `POST /api/embed` (ollama): `input` (a string or a list), `truncate` (default true),
/// `dimensions`; `embeddings` a list of lists whatever the input's form.
pub(crate) async fn ollama(Served(app): Served, body: Result<Bytes, BytesRejection>) -> Response {
    let t0 = std::time::Instant::now();
    let r = async {
        let body = body.map_err(body_error)?;
        let (list, dims, model) = generate::blocking(app.clone(), move |app| {
            let info = app.info()?;
            let o = api::object(&body)?;
            crate::ollama::check_model(&app, &o)?;
            let truncate = api::opt_bool(&o, "truncate")?.unwrap_or(true);
            let dims = dimensions(&o, info.d_model)?;
            let model = o.get("model").and_then(Value::as_str).unwrap_or_default().to_string();
            Ok((inputs(&app, o.get("input"), "input", truncate)?, dims, model))
        })
        .await?;
        let n_tokens: usize = list.iter().map(Vec::len).sum();
        let rows = run(app.clone(), list).await?;
        let embeddings: Vec<Vec<f32>> = rows.into_iter().map(|e| truncated(e, dims)).collect();
        Ok(axum::Json(json!({
            "model": model,
            "embeddings": embeddings,
            "total_duration": t0.elapsed().as_nanos() as u64,
            "load_duration": 0,
            "prompt_eval_count": n_tokens,
        }))
        .into_response())
    };
    r.await.unwrap_or_else(crate::ollama::error_response)
}

/// `POST /api/embeddings` (ollama's older route): `prompt` -> `embedding`.
pub(crate) async fn ollama_legacy(Served(app): Served, body: Result<Bytes, BytesRejection>) -> Response {
    let r = async {
        let body = body.map_err(body_error)?;
        let list = generate::blocking(app.clone(), move |app| {
            let o = api::object(&body)?;
            crate::ollama::check_model(&app, &o)?;
            inputs(&app, o.get("prompt"), "prompt", true)
        })
        .await?;
        let mut rows = run(app.clone(), list).await?;
        Ok(axum::Json(json!({"embedding": rows.pop().unwrap_or_default()})).into_response())
    };
    r.await.unwrap_or_else(crate::ollama::error_response)
}

/// Standard base64 with padding (OpenAI's `encoding_format: "base64"`: the little-endian f32
/// bytes). Written here: a dozen lines against a dependency for one call.
fn b64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16) | (u32::from(*c.get(1).unwrap_or(&0)) << 8) | u32::from(*c.get(2).unwrap_or(&0));
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            out.push(if i <= c.len() { A[(n >> shift) as usize & 63] as char } else { '=' });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_rfc_examples() {
        for (plain, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(b64(plain.as_bytes()), enc, "{plain:?}");
        }
    }

    #[test]
    fn truncation_renormalizes() {
        let e = truncated(vec![0.6, 0.8, 0.0], Some(1));
        assert_eq!(e, vec![1.0]);
        let same = truncated(vec![0.6, 0.8], None);
        assert_eq!(same, vec![0.6, 0.8]);
    }
}

//! The server's one error type and its one mapping to the wire: OpenAI's
//! `{"error": {"message", "type", "param", "code"}}` with the HTTP status beside it.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    /// OpenAI's `type`: invalid_request_error, authentication_error, not_found_error, ...
    pub kind: &'static str,
    pub message: String,
    /// The request field at fault.
    pub param: Option<String>,
    /// A stable machine-readable code (`context_length_exceeded`, `model_not_found`, ...).
    pub code: Option<&'static str>,
}

impl ApiError {
    /// The message with the field at fault in front where it does not name it already (the
    /// APIs whose errors have no `param` of their own: Anthropic's, ollama's).
    pub fn message_with_param(&self) -> String {
        match self.param.as_ref().filter(|p| !self.message.contains(p.as_str())) {
            Some(p) => format!("{p}: {}", self.message),
            None => self.message.clone(),
        }
    }

    /// 400: a field is malformed, of the wrong type or out of range.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message: message.into(),
            param: Some(param.to_string()),
            code: Some("invalid_value"),
        }
    }

    /// 400 about the request as a whole (no single field).
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message: message.into(),
            param: None,
            code: Some(code),
        }
    }

    pub fn context_exceeded(n_prompt: usize, n_ctx: usize, param: &str) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message: format!(
                "This model's maximum context length is {n_ctx} tokens. However, your prompt has {n_prompt} tokens; \
                 it must leave room for at least one generated token."
            ),
            param: Some(param.to_string()),
            code: Some("context_length_exceeded"),
        }
    }

    pub fn unauthorized(message: &str) -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            kind: "authentication_error",
            message: message.to_string(),
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    pub fn not_found(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            kind: "not_found_error",
            message: message.into(),
            param: None,
            code: Some(code),
        }
    }

    pub fn busy(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "unavailable_error",
            message: message.into(),
            param: None,
            code: Some("server_busy"),
        }
    }

    pub fn loading() -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "unavailable_error",
            message: "Loading model".into(),
            param: None,
            code: Some("loading"),
        }
    }

    pub fn timeout(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::GATEWAY_TIMEOUT,
            kind: "timeout_error",
            message: message.into(),
            param: None,
            code: Some("timeout"),
        }
    }

    /// 500: the engine failed on input that had passed validation (a bug, never the client's).
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "server_error",
            message: message.into(),
            param: None,
            code: Some("internal_error"),
        }
    }

    /// The JSON body (also sent as an SSE event when a stream fails after it started).
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}

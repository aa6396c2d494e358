//! `POST /slots/{id}?action=save|restore` (llama-server's session routes): save the
//! conversation slot `id` last served to a file under `--slot-dir`, or read a file from there
//! into the prompt cache, so that a conversation survives a restart. The body names the file:
//! `{"filename": "chat1.bin"}` — a plain name, no folders. Without `--slot-dir` the routes
//! answer 501; a bad file (truncated, corrupted, another model's, another version) is a 400
//! naming the problem.

use std::time::Instant;

use crate::models::Served;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::error::ApiError;
use crate::{api, body_error};
use cortiq_engine::sched::SessionOpError;

#[derive(serde::Deserialize)]
pub(crate) struct Action {
    action: Option<String>,
}

pub(crate) async fn slot_action(
    Served(app): Served,
    tenant: Option<axum::Extension<crate::Tenant>>,
    Path(id): Path<String>,
    Query(q): Query<Action>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let info = app.info()?;
    let Some(dir) = app.opts.slot_dir.clone() else {
        return Err(ApiError {
            status: StatusCode::NOT_IMPLEMENTED,
            kind: "not_supported_error",
            message: "slot save/restore is off: start the server with --slot-dir DIR".into(),
            param: None,
            code: Some("not_supported"),
        });
    };
    let slots = info.sched.config().slots;
    let slot = match id.parse::<usize>() {
        Ok(s) if s < slots => s,
        _ => {
            return Err(ApiError::invalid(
                "id_slot",
                format!("slot {id:?} does not exist (there are {slots}: 0..{})", slots - 1),
            ));
        }
    };
    let o = api::object(&body.map_err(body_error)?)?;
    let Some(name) = api::opt_str(&o, "filename")? else {
        return Err(ApiError::invalid("filename", "'filename' (a file name under --slot-dir) is required"));
    };
    if name.is_empty() || name.contains(['/', '\\']) || name.starts_with('.') || name.contains('\0') {
        return Err(ApiError::invalid("filename", format!("{name:?} is not a plain file name (no folders, not hidden)")));
    }
    let path = dir.join(name);
    let sched = info.sched.clone();
    let scope = app.scope(tenant);
    let action = q.action.unwrap_or_default();
    let t0 = Instant::now();
    let run = |f: Box<dyn FnOnce() -> Result<cortiq_engine::sched::SessionInfo, SessionOpError> + Send>| async move {
        tokio::task::spawn_blocking(f).await.map_err(|e| ApiError::internal(format!("session task: {e}")))?.map_err(|e| match e {
            SessionOpError::Refused(m) => ApiError { code: Some("invalid_session"), ..ApiError::invalid("filename", m) },
            SessionOpError::Failed(m) => ApiError::internal(format!("the session file operation failed: {m}")),
        })
    };
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
    match action.as_str() {
        "save" => {
            let s = run(Box::new(move || sched.save_session_in(scope, slot, &path))).await?;
            let body = json!({"id_slot": slot, "filename": name, "n_saved": s.tokens, "n_written": s.bytes, "timings": {"save_ms": ms(t0)}});
            Ok(axum::Json(body).into_response())
        }
        "restore" => {
            if !path.is_file() {
                return Err(ApiError::invalid("filename", format!("no session file {name:?} under --slot-dir")));
            }
            let s = run(Box::new(move || sched.restore_session_in(scope, &path))).await?;
            let body = json!({"id_slot": slot, "filename": name, "n_restored": s.tokens, "n_read": s.bytes, "timings": {"restore_ms": ms(t0)}});
            Ok(axum::Json(body).into_response())
        }
        other => Err(ApiError::invalid("action", format!("action {other:?} is not one of save, restore"))),
    }
}

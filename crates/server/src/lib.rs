//! cortiq-server: the OpenAI-compatible HTTP server (axum + tokio) over the engine's serving
//! core. It knows HTTP, JSON and SSE only: requests are parsed and validated here (api.rs),
//! tokenized, and handed to the scheduler (`cortiq_engine::sched`), which runs on the engine's
//! own thread and answers through a channel per request. No kernels, no model math here.
//!
//! Routes: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`, `GET /health`
//! (503 while the model loads, 200 when ready), `GET /metrics` (Prometheus text),
//! `POST /tokenize`, `POST /detokenize`. Every error is OpenAI's JSON (error.rs); one log line
//! per request.

mod anthropic;
pub mod api;
mod embed;
pub mod error;
mod generate;
mod models;
mod ollama;
mod reasoning;
mod responses;
mod slots;
mod structured;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use cortiq_engine::Model;
use cortiq_engine::sched::{Handle, SchedConfig};
use cortiq_formats::tokenizer::Tokenizer;
use serde_json::{Value, json};

use crate::error::ApiError;

/// How the server runs (the CLI's `cortiq serve` flags).
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub host: String,
    pub port: u16,
    /// `sched.n_ctx == 0`: the model's training context, at most 4096.
    /// The model id clients see and send (`--alias`); requests naming another model get 404.
    pub model_id: String,
    /// The API keys (`--api-key`, repeated, or a line each of `--api-key-file`); empty: none
    /// needed.
    pub api_keys: Vec<String>,
    /// `--cache-scope key`: each key's requests read and fill only their own prompt-cache
    /// entries (and sessions), so no tenant sees another's prefixes in `cached_tokens` or
    /// timing; otherwise one cache serves everyone.
    pub cache_scope_by_key: bool,
    pub sched: SchedConfig,
    /// Largest request body accepted (413 beyond).
    pub body_limit: usize,
    /// SSE keep-alive comment interval while a stream has nothing to send (long prompts).
    pub keepalive: Duration,
    /// Threads of the HTTP runtime (the engine has its own pool).
    pub http_threads: usize,
    /// Speculative decoding for requests that do not say (`--spec`); a request's
    /// `speculative` object overrides it.
    pub spec: Option<cortiq_engine::spec::SpecParams>,
    /// Where `POST /slots/{id}?action=save|restore` keeps session files (`--slot-dir`; None:
    /// the routes answer 501).
    pub slot_dir: Option<std::path::PathBuf>,
    /// The tool-call markup to parse (`--tool-parser`); None: read from the chat template.
    pub tool_parser: Option<cortiq_formats::calls::Family>,
    /// Split a thinking model's reasoning off the answer (`--reasoning-format deepseek`).
    pub reasoning: bool,
    /// Thinking tokens a request may spend (`--reasoning-budget`; None: no limit); a request's
    /// `reasoning_budget` overrides it.
    pub reasoning_budget: Option<usize>,
    /// Host names requests may name besides localhost and IP literals (`--allowed-hosts`; "*":
    /// any).
    pub allowed_hosts: Vec<String>,
    /// Control tokens typed inside message content are parsed as tokens
    /// (`--parse-special-in-messages`; off: they are text, no role injection).
    pub special_in_content: bool,
    /// How long a connection may take to send a request's headers (idle keep-alive included)
    /// and its body (`--http-timeout`); slower clients are closed.
    pub http_timeout: Duration,
    /// Open connections at most (`--max-connections`); beyond, a new one gets 503 and is closed.
    pub max_connections: usize,
    /// How the embeddings routes pool a text's positions (`--pooling`; None: as the model
    /// declares, else the last position).
    pub pooling: Option<cortiq_engine::Pooling>,
}

/// Bytes of a connection's kernel send buffer (Linux doubles it for its bookkeeping): tokens
/// stream in events of a few hundred bytes, so this holds hundreds of them.
const SEND_BUFFER: usize = 128 << 10;

/// What a served model computes with.
pub enum Weights {
    /// A language model: generation, and embeddings of its final norm's output.
    Decoder(Model),
    /// An encoder (BERT): embeddings only.
    Encoder(cortiq_engine::encoder::Encoder),
}

/// What the load step hands over, on the engine's thread.
pub struct Ready {
    pub weights: Weights,
    /// The pooling the model declares (sentence-transformers' modules) and whether it
    /// normalizes: the embeddings routes' default.
    pub pooling: Option<(cortiq_engine::Pooling, bool)>,
    pub tok: Tokenizer,
    /// The constant-memory plan (`--o1` / `--kv-window`, or what a polished model records),
    /// which the serving core applies to every request at its prompt's length; None serves
    /// exact attention. Known once the model is loaded, so it joins `SchedConfig` here.
    pub o1: Option<cortiq_engine::o1::O1Plan>,
    /// The draft model of draft-model speculation (checked to share the vocabulary).
    pub draft: Option<Arc<Model>>,
    /// A line about how the model is served (printed once it is ready), if any.
    pub note: Option<String>,
    /// The model's file (ollama's `/api/tags` lists its size and time), when known.
    pub file: Option<std::path::PathBuf>,
}

pub use models::{Catalog, Loader, ModelSource, Puller};

/// `--keep-alive`: a duration ("5m", "1h30m", "30s"), seconds, or negative for forever (None).
pub fn parse_keep_alive(s: &str) -> Result<Option<Duration>, String> {
    models::keep_alive(&Value::String(s.to_string()))
}
use models::{Registry, Served};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("{0}")]
    Load(String),
    #[error("the HTTP runtime failed: {0}")]
    Runtime(std::io::Error),
}

/// The model as the HTTP side sees it, set once loading is done.
pub(crate) struct Info {
    pub tok: Arc<Tokenizer>,
    pub vocab: usize,
    pub eos: Vec<u32>,
    pub arch: String,
    pub n_ctx_train: usize,
    /// The scheduler (its context size resolved against the model).
    pub sched: Handle,
    /// A draft model is loaded (requests may ask for draft-model speculation).
    pub has_draft: bool,
    /// The model's file, parameter count and most common weight type (ollama's model details).
    pub file: Option<std::path::PathBuf>,
    pub n_params: u64,
    pub weight_type: String,
    /// The model's width (an embedding's length).
    pub d_model: usize,
    /// How the embeddings routes pool and whether they normalize.
    pub pooling: cortiq_engine::Pooling,
    pub normalize: bool,
    /// An encoder: embeddings only (the generation routes answer 400).
    pub embed_only: bool,
}

/// One served model as its routes see it (`models::Served`): the server's options with its
/// id, its facts once loaded, its structured-output engine.
pub(crate) struct App {
    pub opts: ServeOptions,
    pub info: OnceLock<Info>,
    pub created: u64,
    /// Shared by every model's app: response ids stay unique across models.
    pub next_id: Arc<AtomicU64>,
    /// The structured-output engine, built on the first request that asks for it.
    pub structured: OnceLock<Result<Arc<structured::Structured>, String>>,
}

impl App {
    /// A fresh app for the model `id` of `reg` (its facts set once its engine has loaded it).
    pub fn new(reg: &Registry, id: &str) -> App {
        App {
            opts: ServeOptions { model_id: id.to_string(), ..reg.opts.clone() },
            info: OnceLock::new(),
            created: reg.created,
            next_id: reg.next_id.clone(),
            structured: OnceLock::new(),
        }
    }

    pub fn info(&self) -> Result<&Info, ApiError> {
        self.info.get().ok_or_else(ApiError::loading)
    }

    /// A request's `model`: absent, or this model's name (`models::select` chose it by that
    /// name, with or without ollama's `:latest`).
    pub fn check_model(&self, m: &Option<String>) -> Result<(), ApiError> {
        match m {
            Some(m) if !models::names(&self.opts.model_id, m) => Err(ApiError {
                param: Some("model".into()),
                ..ApiError::not_found(
                    "model_not_found",
                    format!("The model '{m}' does not exist; this server serves '{}'", self.opts.model_id),
                )
            }),
            _ => Ok(()),
        }
    }

    pub fn structured(&self, info: &Info) -> Result<Arc<structured::Structured>, String> {
        self.structured
            .get_or_init(|| {
                let eos = info.tok.eos_id().or(info.eos.first().copied()).unwrap_or(0);
                structured::Structured::new(info.tok.clone(), info.vocab, eos).map(Arc::new)
            })
            .clone()
    }

    pub fn new_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{n:06x}", self.created)
    }
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Bind, start loading the default model (if any) on its engine thread, serve until Ctrl-C
/// (or a failed start-time load). Other models of the catalog load on the first request that
/// names them.
pub fn serve(opts: ServeOptions, catalog: Catalog) -> Result<(), ServeError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(opts.http_threads.max(1))
        // Request preparation (generate::blocking): bounded, so a flood of heavy requests
        // queues here instead of spawning a thread each.
        .max_blocking_threads(BLOCKING_THREADS)
        .thread_name("cortiq-http")
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    rt.block_on(serve_async(opts, catalog))
}

async fn serve_async(opts: ServeOptions, catalog: Catalog) -> Result<(), ServeError> {
    let addr = format!("{}:{}", opts.host, opts.port);
    let listener =
        tokio::net::TcpListener::bind(&addr).await.map_err(|source| ServeError::Bind { addr: addr.clone(), source })?;
    let local: SocketAddr = listener.local_addr().map_err(|source| ServeError::Bind { addr: addr.clone(), source })?;
    let reg = Arc::new(Registry::new(opts.clone(), catalog, unix_now()));
    match reg.eager.map(|i| reg.source(i).id.clone()) {
        Some(id) if reg.count() == 1 => eprintln!("cortiq serve: listening on http://{local} (model '{id}' loading)"),
        Some(id) => eprintln!(
            "cortiq serve: listening on http://{local} (model '{id}' loading; {} models on demand, {} loaded at most)",
            reg.count(),
            reg.max_loaded
        ),
        None => eprintln!(
            "cortiq serve: listening on http://{local} ({} models on demand, {} loaded at most)",
            reg.count(),
            reg.max_loaded
        ),
    }

    let (fail_tx, fail_rx) = tokio::sync::oneshot::channel::<String>();
    *reg.fail.lock().unwrap_or_else(|e| e.into_inner()) = Some(fail_tx);
    reg.start();
    let reaper = tokio::spawn(reg.clone().reap());

    let router = router(reg.clone());
    let failed = Arc::new(Mutex::new(None::<String>));
    let failed_w = failed.clone();
    let shutdown = async move {
        // SIGTERM (systemd, containers) as Ctrl-C: stop accepting, let running requests end.
        #[cfg(unix)]
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let term = std::future::pending::<()>();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => { eprintln!("cortiq serve: shutting down"); }
            _ = term => { eprintln!("cortiq serve: SIGTERM, shutting down"); }
            msg = fail_rx => { if let Ok(m) = msg { *failed_w.lock().unwrap_or_else(|e| e.into_inner()) = Some(m); } }
        }
    };
    accept_loop(listener, router, &opts, shutdown).await;
    reaper.abort();
    reg.shutdown();
    if let Some(m) = failed.lock().unwrap_or_else(|e| e.into_inner()).take() {
        return Err(ServeError::Load(m));
    }
    Ok(())
}

/// Threads preparing requests at once (templates, tokenization, grammar compiles).
const BLOCKING_THREADS: usize = 4;

/// How long running requests may go on after a shutdown signal before they are cut.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// Accept connections until `shutdown`, each served by hyper's HTTP/1 with the header-read
/// timeout (idle keep-alive included: a connection that sends nothing is closed) and under the
/// connection cap; then let the running requests end (at most SHUTDOWN_GRACE). Written out
/// rather than `axum::serve`, which sets no timer, hence no timeout, and no cap.
async fn accept_loop(listener: tokio::net::TcpListener, router: Router, opts: &ServeOptions, shutdown: impl Future<Output = ()>) {
    let conns = Arc::new(tokio::sync::Semaphore::new(opts.max_connections.max(1)));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let tcp = tokio::select! {
            r = listener.accept() => match r {
                Ok((tcp, _)) => tcp,
                // Out of file descriptors and the like: back off, keep serving.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = tcp.set_nodelay(true);
        // The kernel's send buffer held small (autotuned it grows to tcp_wmem's max, MBs per
        // connection): a client that stops reading backs the stream up within a few hundred
        // events, so the stall clock (`ChanSink`) starts and cancels it after --http-timeout,
        // and thousands of connections cannot pin gigabytes of kernel memory.
        let _ = socket2::SockRef::from(&tcp).set_send_buffer_size(SEND_BUFFER);
        let Ok(permit) = conns.clone().try_acquire_owned() else {
            tokio::spawn(refuse_connection(tcp));
            continue;
        };
        let svc = hyper_util::service::TowerToHyperService::new(router.clone());
        let mut b = hyper::server::conn::http1::Builder::new();
        b.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(opts.http_timeout);
        let conn = graceful.watch(b.serve_connection(hyper_util::rt::TokioIo::new(tcp), svc));
        tokio::spawn(async move {
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(SHUTDOWN_GRACE) => {
            eprintln!("cortiq serve: requests still running after {}s; stopping", SHUTDOWN_GRACE.as_secs());
        }
    }
}

/// Over the connection cap: one 503 in OpenAI's form, then close.
async fn refuse_connection(mut tcp: tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt;
    let body = ApiError::busy("too many open connections; retry later").body().to_string();
    let msg = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), tcp.write_all(msg.as_bytes())).await;
}

/// The request body read whole within `--http-timeout` (a client that trickles its body is
/// cut with 408), before any handler sees it.
async fn body_deadline(State(app): State<Arc<Registry>>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let limit = app.opts.body_limit;
    match tokio::time::timeout(app.opts.http_timeout, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => next.run(Request::from_parts(parts, axum::body::Body::from(bytes))).await,
        Ok(Err(_)) => ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            code: Some("request_too_large"),
            ..ApiError::bad_request("request_too_large", "the request body is too large or could not be read")
        }
        .into_response(),
        Err(_) => ApiError {
            status: StatusCode::REQUEST_TIMEOUT,
            ..ApiError::bad_request("body_timeout", format!("the request body did not arrive within {:?}", app.opts.http_timeout))
        }
        .into_response(),
    }
}

/// A model's own engine thread: load, publish the model's facts, tell `done`, run the
/// scheduler until it is shut down (the model unloaded or the server stopping).
fn engine_thread(app: Arc<App>, load: Loader, done: tokio::sync::oneshot::Sender<Result<(), String>>) {
    let t0 = Instant::now();
    let ready = match load() {
        Ok(x) => x,
        Err(e) => {
            let _ = done.send(Err(e));
            return;
        }
    };
    let Ready { weights, tok, o1, draft, note, file, pooling } = ready;
    let tok = Arc::new(tok);
    let mut eos = tok.eos_ids();
    eos.sort_unstable();
    eos.dedup();
    let mut cfg = app.opts.sched.clone();
    cfg.o1 = o1;
    // The pooling `--pooling` names, else the one the model declares, else the last position;
    // normalized unless the model declares a pooling without Normalize.
    let (pooling, normalize) = match (app.opts.pooling, pooling) {
        (Some(p), declared) => (p, declared.is_none_or(|d| d.1)),
        (None, Some(d)) => d,
        (None, None) => (cortiq_engine::Pooling::Last, true),
    };
    let facts = |sched: Handle, arch: String, shape: (usize, usize, usize), n_params: u64, weight_type: String| Info {
        tok: tok.clone(),
        vocab: shape.0,
        eos: eos.clone(),
        arch,
        n_ctx_train: shape.1,
        sched,
        has_draft: draft.is_some(),
        file: file.clone(),
        n_params,
        weight_type,
        d_model: shape.2,
        pooling,
        normalize,
        embed_only: false,
    };
    // A panic in the engine is a bug; a server whose engine is gone would accept requests and
    // never answer them, so it exits (non-zero) for its supervisor to restart it.
    let guard = |run: &dyn Fn()| {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).is_err() {
            eprintln!("cortiq serve: the engine thread panicked; exiting");
            std::process::exit(70);
        }
    };
    match weights {
        Weights::Decoder(model) => {
            if cfg.n_ctx == 0 {
                cfg.n_ctx = model.cfg.n_ctx_train.clamp(1, 4096);
            }
            let (fixed, per_pos) = state_cost(&model);
            let per_slot = fixed + per_pos * cfg.n_ctx;
            eprintln!(
                "cortiq serve: model '{}' ({}, {} layers) ready in {:.1}s; {} slots x {} ctx, state up to {:.1} MiB per slot ({:.1} MiB in all), prefill chunk {} (up to {} positions a step)",
                app.opts.model_id,
                model.cfg.arch,
                model.layers.len(),
                t0.elapsed().as_secs_f64(),
                cfg.slots,
                cfg.n_ctx,
                per_slot as f64 / (1 << 20) as f64,
                (per_slot * cfg.slots) as f64 / (1 << 20) as f64,
                cfg.prefill_chunk,
                cfg.prefill_budget.max(cfg.prefill_chunk),
            );
            if let Some(n) = &note {
                eprintln!("cortiq serve: {n}");
            }
            let sched = Handle::new(cfg);
            let c = &model.cfg;
            let shape = (c.vocab, c.n_ctx_train, c.d_model);
            let _ = app.info.set(facts(sched.clone(), c.arch.to_string(), shape, model.param_count(), model.main_weight_type()));
            let _ = done.send(Ok(()));
            guard(&|| sched.run_with_draft(&model, draft.as_ref(), &tok));
        }
        Weights::Encoder(enc) => {
            let c = &enc.cfg;
            // Inputs up to the model's max_seq_length (longer ones cut where the route
            // truncates, as sentence-transformers cuts them).
            if cfg.n_ctx == 0 || cfg.n_ctx > c.max_seq {
                cfg.n_ctx = c.max_seq;
            }
            eprintln!(
                "cortiq serve: model '{}' (bert encoder, {} layers: embeddings only, {pooling:?} pooling) ready in {:.1}s; inputs up to {} tokens",
                app.opts.model_id,
                c.n_layers,
                t0.elapsed().as_secs_f64(),
                cfg.n_ctx,
            );
            let sched = Handle::new(cfg);
            let shape = (c.vocab, c.max_positions, c.d_model);
            let info = Info { embed_only: true, ..facts(sched.clone(), "bert".into(), shape, enc.param_count(), "F32".into()) };
            let _ = app.info.set(info);
            let _ = done.send(Ok(()));
            guard(&|| sched.run_embedder(&|inputs, p, norm| enc.embed_batch(inputs, p, norm)));
        }
    }
    // Unloaded: the weights' map and copies went with their scope; the allocator's free pages
    // go back now.
    drop(draft);
    cortiq_formats::return_free_memory();
}

/// (bytes every slot holds whatever its length, bytes per position): two one-token steps on a
/// scratch state (KV grows per position; recurrent states are fixed).
fn state_cost(model: &Model) -> (usize, usize) {
    let mut st = model.new_state(4);
    let one = |st: &mut cortiq_engine::state::SeqState| {
        let _ = model.forward(&[0], st, cortiq_engine::Logits::None);
        st.bytes()
    };
    let b1 = one(&mut st);
    let b2 = one(&mut st);
    let per = b2.saturating_sub(b1);
    (b1.saturating_sub(per), per)
}

fn router(reg: Arc<Registry>) -> Router {
    // The routes of one model: `models::select` picks (and loads) the model the body names.
    let per_model = Router::new()
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/v1/chat/completions", post(generate::chat))
        .route("/v1/completions", post(generate::completions))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/responses", post(responses::responses))
        .route("/apply-template", post(apply_template))
        .route("/slots/{id}", post(slots::slot_action))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route("/api/show", post(ollama::show))
        .route("/api/embed", post(embed::ollama))
        .route("/api/embeddings", post(embed::ollama_legacy))
        .route("/v1/embeddings", post(embed::openai))
        .route_layer(middleware::from_fn_with_state(reg.clone(), models::select));
    Router::new()
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/v1/models", get(list_models))
        .route("/metrics", get(metrics))
        .route("/api/tags", get(ollama::tags))
        .route("/api/ps", get(ollama::ps))
        .route("/api/version", get(ollama::version))
        .route("/api/pull", post(ollama::pull))
        .route("/", get(chat_page))
        .merge(per_model)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(reg.clone(), body_deadline))
        .layer(middleware::from_fn(json_only))
        .layer(middleware::from_fn_with_state(reg.clone(), auth))
        .layer(middleware::from_fn_with_state(reg.clone(), host_guard))
        .layer(middleware::from_fn(ollama_errors))
        .layer(middleware::from_fn_with_state(reg.clone(), log_and_count))
        .layer(DefaultBodyLimit::max(reg.opts.body_limit))
        .with_state(reg)
}

/// One log line per request and the per-status counter.
async fn log_and_count(State(app): State<Arc<Registry>>, req: Request, next: Next) -> Response {
    let t0 = Instant::now();
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let resp = next.run(req).await;
    let status = resp.status().as_u16();
    *app.statuses.lock().unwrap_or_else(|e| e.into_inner()).entry(status).or_default() += 1;
    tracing::info!(target: "cortiq::server", "{method} {path} {status} {:.1}ms", t0.elapsed().as_secs_f64() * 1e3);
    resp
}

/// DNS rebinding: a page on an attacker's domain that resolves to this machine reaches the
/// server with its own name in `Host`. Requests may name localhost (and `*.localhost`), an IP
/// literal (a name an attacker cannot rebind) or a host of `--allowed-hosts`; others get 421.
async fn host_guard(State(app): State<Arc<Registry>>, req: Request, next: Next) -> Response {
    let host = req.headers().get(header::HOST).map(|h| h.to_str().unwrap_or("\u{0}").to_string());
    match host {
        Some(h) if !host_allowed(&h, &app.opts.allowed_hosts) => ApiError {
            status: StatusCode::MISDIRECTED_REQUEST,
            ..ApiError::bad_request(
                "host_not_allowed",
                format!("Host {h:?} is not served here (localhost, IP addresses and --allowed-hosts are)"),
            )
        }
        .into_response(),
        _ => next.run(req).await,
    }
}

/// `Host` (with or without a port) against the allow-list.
pub fn host_allowed(host: &str, extra: &[String]) -> bool {
    let host = host.trim();
    let name = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((v6, _)) => v6,
            None => return false,
        }
    } else {
        match host.rsplit_once(':') {
            Some((n, port)) if port.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => host,
        }
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if name.is_empty() {
        return false;
    }
    extra.iter().any(|e| e == "*" || e.eq_ignore_ascii_case(&name))
        || name == "localhost"
        || name.ends_with(".localhost")
        || name.parse::<std::net::IpAddr>().is_ok()
}

/// JSON routes take `Content-Type: application/json` only (415 otherwise): a cross-site page
/// can POST text/plain without a preflight, never JSON. ollama's routes (`/api/*`) take a body
/// of any type from a client that names no `Origin`, as ollama does (its documented calls are
/// `curl -d '{...}'`, form-typed); a browser names the page's origin on every POST (and its
/// `Sec-Fetch-Site`), so a page still gets the JSON rule there.
async fn json_only(req: Request, next: Next) -> Response {
    let h = req.headers();
    let from_page = h.contains_key(header::ORIGIN)
        || h.get("sec-fetch-site").and_then(|v| v.to_str().ok()).is_some_and(|v| !v.eq_ignore_ascii_case("none"));
    let ollama_tool = req.uri().path().starts_with("/api/") && !from_page;
    if req.method() == axum::http::Method::POST && !ollama_tool {
        let ct = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
        let mime = ct.split(';').next().unwrap_or("").trim();
        if !mime.eq_ignore_ascii_case("application/json") {
            let shown = if ct.is_empty() { "none".to_string() } else { format!("{ct:?}") };
            return ApiError {
                status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ..ApiError::bad_request(
                    "unsupported_media_type",
                    format!("the body must be sent as Content-Type: application/json (got {shown})"),
                )
            }
            .into_response();
        }
    }
    next.run(req).await
}

/// ollama's clients read an error as `{"error": "message"}`: on `/api/*`, an error a layer
/// before the route answered in OpenAI's form (authentication, content type, body size, host,
/// an unknown path) is rewritten so, its status and headers kept.
async fn ollama_errors(req: Request, next: Next) -> Response {
    if !req.uri().path().starts_with("/api/") {
        return next.run(req).await;
    }
    let resp = next.run(req).await;
    if resp.status().is_success() {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 1 << 20).await else {
        return (parts.status, axum::Json(json!({"error": parts.status.to_string()}))).into_response();
    };
    let msg = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.get("message")).and_then(|m| m.as_str()).map(str::to_string));
    match msg {
        Some(m) => {
            let body = serde_json::to_vec(&json!({"error": m})).expect("a JSON value serializes");
            parts.headers.remove(header::CONTENT_LENGTH);
            parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            Response::from_parts(parts, axum::body::Body::from(body))
        }
        None => Response::from_parts(parts, axum::body::Body::from(bytes)),
    }
}

/// Which API key a request came with (1 for the first): its prompt-cache scope under
/// `--cache-scope key`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tenant(u64);

impl App {
    /// The prompt-cache scope of a request that came with `tenant`'s key.
    pub(crate) fn scope(&self, tenant: Option<axum::Extension<Tenant>>) -> cortiq_engine::prefix::Scope {
        match tenant {
            Some(axum::Extension(Tenant(t))) if self.opts.cache_scope_by_key => t,
            _ => cortiq_engine::prefix::SHARED,
        }
    }
}

/// Equal keys, compared in time that does not depend on where they differ.
fn same_key(given: &str, key: &str) -> bool {
    let (a, b) = (given.as_bytes(), key.as_bytes());
    let mut diff = (a.len() ^ b.len()) as u8 | u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

/// `--api-key`: every route but /health needs `Authorization: Bearer KEY` (or `x-api-key`).
async fn auth(State(app): State<Arc<Registry>>, mut req: Request, next: Next) -> Response {
    if app.opts.api_keys.is_empty() {
        return next.run(req).await;
    }
    // The chat page itself is public (it asks for the key and sends it with its requests).
    if matches!(req.uri().path(), "/health" | "/v1/health" | "/") {
        return next.run(req).await;
    }
    let h = req.headers();
    let given = h
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").map(str::trim))
        .or_else(|| h.get("x-api-key").and_then(|v| v.to_str().ok()));
    // Every key compared (no early exit that would time which one matched).
    let hit =
        given.map(|g| app.opts.api_keys.iter().enumerate().fold(None, |hit, (i, k)| if same_key(g, k) { Some(i) } else { hit }));
    match hit {
        Some(Some(i)) => {
            req.extensions_mut().insert(Tenant(i as u64 + 1));
            next.run(req).await
        }
        Some(None) => ApiError::unauthorized("Invalid API key").into_response(),
        None => ApiError::unauthorized("Missing API key: send 'Authorization: Bearer KEY'").into_response(),
    }
}

/// `GET /`: the chat page, one static file embedded in the binary (chat.html: no build step,
/// no framework; it streams from /v1/chat/completions and shows each turn's prompt tokens
/// processed and reused, and tok/s).
async fn chat_page() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], include_str!("chat.html")).into_response()
}

async fn not_found(req: Request) -> ApiError {
    ApiError::not_found("unknown_route", format!("Unknown route {} {}", req.method(), req.uri().path()))
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        ..ApiError::not_found("method_not_allowed", format!("{} is not allowed on {}", req.method(), req.uri().path()))
    }
}

/// A body extractor's failure (too large, unreadable) as OpenAI JSON.
pub(crate) fn body_error(r: BytesRejection) -> ApiError {
    let status = r.status();
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError {
            status,
            code: Some("request_too_large"),
            ..ApiError::bad_request("request_too_large", "the request body is too large")
        };
    }
    ApiError { status, ..ApiError::bad_request("invalid_body", r.body_text()) }
}

/// 200 once the server can answer: 503 while the start-time model loads.
async fn health(State(reg): State<Arc<Registry>>) -> Response {
    if reg.starting() {
        return ApiError::loading().into_response();
    }
    axum::Json(json!({"status": "ok"})).into_response()
}

/// `GET /v1/models`: every model the server can serve, loaded or not; a loaded one with its
/// facts (`meta`).
async fn list_models(State(reg): State<Arc<Registry>>) -> Response {
    let data: Vec<Value> = reg
        .list()
        .into_iter()
        .map(|l| {
            let mut m = json!({"id": l.id, "object": "model", "created": reg.created, "owned_by": "cortiq"});
            if let Some((app, _)) = &l.loaded
                && let Some(info) = app.info.get()
            {
                let cfg = info.sched.config();
                m["meta"] = json!({"arch": info.arch, "vocab": info.vocab, "n_ctx": cfg.n_ctx, "n_ctx_train": info.n_ctx_train, "slots": cfg.slots});
            }
            m["status"] = json!({"value": if l.loaded.is_some() { "loaded" } else { "unloaded" }});
            m
        })
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /metrics`: Prometheus text; the scheduler's counters summed over the loaded models.
async fn metrics(State(reg): State<Arc<Registry>>) -> Response {
    let apps = reg.loaded();
    let handles: Vec<&Handle> = apps.iter().filter_map(|a| a.info.get()).map(|i| &i.sched).collect();
    let slots: usize = handles.iter().map(|h| h.config().slots).sum();
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, lines: Vec<(String, f64)>| {
        out.push_str(&format!("# HELP cortiq_{name} {help}\n# TYPE cortiq_{name} {kind}\n"));
        for (labels, v) in lines {
            out.push_str(&format!("cortiq_{name}{labels} {v}\n"));
        }
    };
    let statuses = reg.statuses.lock().unwrap_or_else(|e| e.into_inner()).clone();
    metric(
        "requests_total",
        "counter",
        "HTTP responses by status code.",
        statuses.iter().map(|(s, n)| (format!("{{status=\"{s}\"}}"), *n as f64)).collect(),
    );
    let g = |f: fn(&cortiq_engine::sched::Counters) -> &AtomicU64| {
        handles.iter().map(|h| f(h.counters()).load(Ordering::Relaxed) as f64).sum::<f64>()
    };
    let n = |f: fn(&cortiq_engine::sched::Counters) -> &std::sync::atomic::AtomicUsize| {
        handles.iter().map(|h| f(h.counters()).load(Ordering::Relaxed) as f64).sum::<f64>()
    };
    let one = |v: f64| vec![(String::new(), v)];
    type Count = fn(&cortiq_engine::sched::Counters) -> &AtomicU64;
    let counts: [(&str, &str, &str, Count); 13] = [
        ("prompt_tokens_total", "counter", "Prompt tokens processed.", |c| &c.prompt_tokens),
        ("generated_tokens_total", "counter", "Tokens generated.", |c| &c.generated_tokens),
        ("decode_steps_total", "counter", "Batched decode steps.", |c| &c.decode_steps),
        ("decode_rows_total", "counter", "Sequences decoded over all decode steps.", |c| &c.decode_rows),
        ("requests_cancelled_total", "counter", "Requests whose client went away.", |c| &c.cancelled),
        ("requests_timed_out_total", "counter", "Requests that ran past the timeout.", |c| &c.timed_out),
        ("cache_hits_total", "counter", "Requests that restored a prefix from the prompt cache.", |c| &c.cache_hits),
        ("cache_misses_total", "counter", "Requests that found no cached prefix.", |c| &c.cache_misses),
        ("cache_reused_tokens_total", "counter", "Prompt tokens restored from the cache, not computed.", |c| {
            &c.cache_reused_tokens
        }),
        ("cache_bytes", "gauge", "Bytes the prompt cache holds (states, checkpoints, tokens).", |c| &c.cache_bytes),
        ("cache_evictions_total", "counter", "Cached prefixes dropped to stay within --cache-ram.", |c| &c.cache_evictions),
        ("cache_refills_total", "counter", "Finished generations prefilled again while idle, for the cache.", |c| {
            &c.cache_refills
        }),
        ("cache_refill_tokens_total", "counter", "Positions those refills computed.", |c| &c.cache_refill_tokens),
    ];
    for (name, kind, help, f) in counts {
        metric(name, kind, help, one(g(f)));
    }
    metric("queue_length", "gauge", "Requests waiting for a slot.", one(n(|c| &c.queued)));
    metric("cache_entries", "gauge", "Prefixes the prompt cache holds.", one(n(|c| &c.cache_entries)));
    metric("busy_slots", "gauge", "Slots running a request.", one(n(|c| &c.busy_slots)));
    metric("slots", "gauge", "Slots (--parallel) over the loaded models.", one(slots as f64));
    metric(
        "tokens_per_second",
        "gauge",
        "Generated tokens per second over the last seconds of work.",
        one(g(|c| &c.tok_per_s_milli) / 1000.0),
    );
    metric("models_loaded", "gauge", "Models loaded now.", one(handles.len() as f64));
    metric(
        "ready",
        "gauge",
        "1 once the server answers (the start-time model loaded).",
        one(if reg.starting() { 0.0 } else { 1.0 }),
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

/// `POST /tokenize {"content", "add_special": false, "parse_special": true, "with_pieces": false}`
/// as llama-server's.
async fn tokenize(Served(app): Served, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let info = app.info()?;
    let o = api::object(&body.map_err(body_error)?)?;
    let Some(text) = api::opt_str(&o, "content")? else {
        return Err(ApiError::invalid("content", "'content' (a string) is required"));
    };
    let add = api::opt_bool(&o, "add_special")?.unwrap_or(false);
    let parse = api::opt_bool(&o, "parse_special")?.unwrap_or(true);
    let pieces = api::opt_bool(&o, "with_pieces")?.unwrap_or(false);
    let mut ids = info
        .tok
        .encode_with(text, add && info.tok.add_bos(), parse)
        .map_err(|e| ApiError::bad_request("tokenize_failed", e.to_string()))?;
    // and the token the model appends (BERT's [SEP]), as the embeddings routes encode
    ids.extend(info.tok.eos_id().filter(|_| add && info.tok.add_eos()));
    let tokens: Vec<Value> = if pieces {
        ids.iter()
            .map(|&id| {
                let b = info.tok.token_bytes(id);
                let piece = match String::from_utf8(b) {
                    Ok(s) => json!(s),
                    Err(e) => json!(e.into_bytes()),
                };
                json!({"id": id, "piece": piece})
            })
            .collect()
    } else {
        ids.iter().map(|&id| json!(id)).collect()
    };
    Ok(axum::Json(json!({"tokens": tokens})).into_response())
}

/// `POST /apply-template {"messages", "tools"?, ...}` -> `{"prompt"}`: the text the chat route
/// would run (llama-server's route), tools and template kwargs included.
async fn apply_template(Served(app): Served, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let info = app.info()?;
    let o = api::object(&body.map_err(body_error)?)?;
    let msgs = api::messages(&o)?;
    let agent = api::agent_params(&o)?;
    let (enc, _) = generate::render_chat(&app, info, &msgs, &agent)?;
    Ok(axum::Json(json!({"prompt": enc.text})).into_response())
}

/// `POST /detokenize {"tokens": [ids]}` -> `{"content"}`.
async fn detokenize(Served(app): Served, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let info = app.info()?;
    let o = api::object(&body.map_err(body_error)?)?;
    let Some(Value::Array(a)) = o.get("tokens") else {
        return Err(ApiError::invalid("tokens", "'tokens' (a list of token ids) is required"));
    };
    let ids = a
        .iter()
        .map(|v| {
            v.as_u64()
                .filter(|&id| (id as usize) < info.vocab)
                .map(|id| id as u32)
                .ok_or_else(|| ApiError::invalid("tokens", format!("{v} is not a token id below {}", info.vocab)))
        })
        .collect::<Result<Vec<u32>, _>>()?;
    Ok(axum::Json(json!({"content": info.tok.decode(&ids)})).into_response())
}

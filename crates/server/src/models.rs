//! Models on demand: the models a server can serve (`Catalog`, from `-m` and `--models DIR`),
//! which of them are loaded, and the request's way to one (`select`, a route layer: it reads
//! the body's `model`, loads that model if it is not loaded, and hands the route its `App`).
//!
//! Each loaded model is an `App` of its own: its engine thread, scheduler, prompt cache,
//! tokenizer and structured-output engine. At most `max_loaded` are loaded (or loading), their
//! files within `budget` bytes (`--models-ram`): a
//! request for another waits until the least recently used idle one is unloaded (its scheduler
//! drains what it runs, its thread ends and drops the weights' map). A model idle for its
//! keep-alive (the server's `--keep-alive`, or the last request's ollama `keep_alive`) is
//! unloaded by the reaper. A load that fails is the request's error (500 naming the file);
//! the server goes on. Written here: the policy is the product's (ollama's and llama-server's
//! router semantics on our scheduler), a few dozen lines over tokio's `Notify`.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use crate::error::ApiError;
use crate::{App, Ready, ServeOptions};

/// Loads a model (on its engine thread): called again for every reload.
pub type Loader = Arc<dyn Fn() -> Result<Ready, String> + Send + Sync>;

/// Fetches a model by name (ollama's `/api/pull`: a known name or a hub model, into the cache)
/// and says how to serve it. Blocking (it downloads); run off the HTTP threads.
pub type Puller = Arc<dyn Fn(&str) -> Result<ModelSource, String> + Send + Sync>;

/// One model the server can serve.
#[derive(Clone)]
pub struct ModelSource {
    /// The name requests give (`model`); ollama's clients may add `:latest`.
    pub id: String,
    /// Its file or folder (listed with its size and time before it is loaded).
    pub file: Option<PathBuf>,
    pub load: Loader,
}

/// What the server serves and how many at once.
pub struct Catalog {
    pub sources: Vec<ModelSource>,
    /// The model a request that names none gets (`-m`), loaded at start: while it loads the
    /// server answers 503 (as llama-server), and a failed load stops the server. None: with one
    /// source that one, otherwise a request must name its model.
    pub default: Option<usize>,
    /// Models loaded at once at most (`--max-loaded`).
    pub max_loaded: usize,
    /// Bytes of model files loaded at once at most (`--models-ram`; None: no budget): a model
    /// is counted at its file's size (mapped weights and their copies come to about that).
    pub budget: Option<u64>,
    /// How long an idle model stays loaded (`--keep-alive`; None: until the server stops or it
    /// makes room for another).
    pub keep_alive: Option<Duration>,
    /// How `/api/pull` fetches a model (None: the route answers 501).
    pub pull: Option<Puller>,
}

enum Slot {
    Unloaded,
    /// `startup`: the start-time load of the default model (requests get 503 meanwhile).
    Loading {
        startup: bool,
    },
    Loaded(Live),
    Unloading,
}

struct Live {
    app: Arc<App>,
    /// Requests between choosing this model and handing their work to its scheduler.
    leases: usize,
    last_used: Instant,
    /// How long it stays loaded once idle (None: until evicted).
    keep: Option<Duration>,
    engine: std::thread::JoinHandle<()>,
}

impl Live {
    fn busy(&self) -> bool {
        self.leases > 0
            || self.app.info.get().is_none_or(|i| {
                let c = i.sched.counters();
                c.queued.load(Ordering::Relaxed) > 0 || c.busy_slots.load(Ordering::Relaxed) > 0
            })
    }
}

/// `Registry::step`'s decision.
enum Step {
    Got(Arc<App>),
    /// The model alone is larger than the memory budget (its bytes, the budget).
    TooBig(u64, u64),
    Starting,
    Load,
    Evict(usize),
    Wait,
}

/// The served models and the shared parts of the server.
pub(crate) struct Registry {
    pub opts: ServeOptions,
    /// The models, in the catalog's order and then as `/api/pull` adds them (a slot each).
    sources: std::sync::RwLock<Vec<Entry>>,
    pub pull: Option<Puller>,
    /// The model loaded at start (`Catalog::default`).
    pub eager: Option<usize>,
    /// The model a request that names none gets.
    pub default: Option<usize>,
    pub max_loaded: usize,
    pub budget: Option<u64>,
    pub keep_alive: Option<Duration>,
    pub created: u64,
    pub next_id: Arc<std::sync::atomic::AtomicU64>,
    /// Responses by HTTP status.
    pub statuses: Arc<Mutex<std::collections::BTreeMap<u16, u64>>>,
    slots: Mutex<Vec<Slot>>,
    changed: tokio::sync::Notify,
    /// Set when the start-time load fails (the server stops with its message).
    pub fail: Mutex<Option<tokio::sync::oneshot::Sender<String>>>,
}

/// Whether a request's model `name` means the model `id`: the id, or ollama's `id:latest`.
pub(crate) fn names(id: &str, name: &str) -> bool {
    name == id || name.strip_suffix(":latest") == Some(id)
}

/// A model the registry serves, with its bytes on disk (read once: `--models-ram` and the
/// listings use them).
struct Entry {
    src: Arc<ModelSource>,
    bytes: u64,
}

impl Entry {
    fn new(src: ModelSource) -> Entry {
        let bytes = src.file.as_deref().map_or(0, model_bytes);
        Entry { src: Arc::new(src), bytes }
    }
}

/// A request's hold on a loaded model until its work is queued: the model is not unloaded
/// under it.
pub(crate) struct Lease {
    reg: Arc<Registry>,
    idx: usize,
    pub app: Arc<App>,
    keep: Option<Option<Duration>>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut slots = self.reg.lock();
        if let Slot::Loaded(l) = &mut slots[self.idx] {
            l.leases -= 1;
            l.last_used = Instant::now();
            if let Some(k) = self.keep {
                l.keep = k;
            }
        }
        drop(slots);
        self.reg.changed.notify_waiters();
    }
}

/// The selected model's `App`, for the per-model routes (put there by `select`).
#[derive(Clone)]
pub(crate) struct Served(pub Arc<App>);

impl<S: Send + Sync> FromRequestParts<S> for Served {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        parts.extensions.get::<Served>().cloned().ok_or_else(|| ApiError::internal("no model was selected for this route"))
    }
}

/// What a model's facts are, as listed without loading it.
pub(crate) struct Listed {
    pub id: String,
    pub file: Option<PathBuf>,
    /// Its bytes on disk.
    pub bytes: u64,
    /// Loaded now: its app and when it unloads (None: not while the server runs).
    pub loaded: Option<(Arc<App>, Option<std::time::SystemTime>)>,
}

impl Registry {
    pub fn new(opts: ServeOptions, catalog: Catalog, created: u64) -> Registry {
        let n = catalog.sources.len();
        let default = catalog.default.or((n == 1).then_some(0));
        Registry {
            opts,
            sources: std::sync::RwLock::new(catalog.sources.into_iter().map(Entry::new).collect()),
            pull: catalog.pull,
            eager: catalog.default,
            default,
            max_loaded: catalog.max_loaded.max(1),
            budget: catalog.budget,
            keep_alive: catalog.keep_alive,
            created,
            next_id: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            statuses: Arc::new(Mutex::new(Default::default())),
            slots: Mutex::new((0..n).map(|_| Slot::Unloaded).collect()),
            changed: tokio::sync::Notify::new(),
            fail: Mutex::new(None),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Model `i` (sources are only ever added).
    pub fn source(&self, i: usize) -> Arc<ModelSource> {
        self.sources.read().unwrap_or_else(|e| e.into_inner())[i].src.clone()
    }

    /// Models the server can serve.
    pub fn count(&self) -> usize {
        self.sources.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Serve one more model (a pulled one), unloaded until asked for; a model of the same id
    /// already there is kept (its file is the one just pulled, or the one given at start).
    /// -> its id and bytes on disk.
    pub fn add(&self, src: ModelSource) -> (String, u64) {
        let mut sources = self.sources.write().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = sources.iter().find(|e| e.src.id == src.id) {
            return (src.id, e.bytes);
        }
        let e = Entry::new(src);
        let out = (e.src.id.clone(), e.bytes);
        self.lock().push(Slot::Unloaded);
        sources.push(e);
        out
    }

    /// Every model, loaded or not, in the catalog's order.
    pub fn list(&self) -> Vec<Listed> {
        let sources = self.sources.read().unwrap_or_else(|e| e.into_inner());
        let slots = self.lock();
        let now = (Instant::now(), std::time::SystemTime::now());
        sources
            .iter()
            .zip(slots.iter())
            .map(|(e, slot)| Listed {
                id: e.src.id.clone(),
                file: e.src.file.clone(),
                bytes: e.bytes,
                loaded: match slot {
                    Slot::Loaded(l) if l.app.info.get().is_some() => {
                        let until = l.keep.map(|k| now.1 + (l.last_used + k).saturating_duration_since(now.0));
                        Some((l.app.clone(), until))
                    }
                    _ => None,
                },
            })
            .collect()
    }

    /// The loaded models' apps (for /metrics).
    pub fn loaded(&self) -> Vec<Arc<App>> {
        self.list().into_iter().filter_map(|l| l.loaded.map(|(a, _)| a)).collect()
    }

    /// The start-time load still running (health answers 503).
    pub fn starting(&self) -> bool {
        self.lock().iter().any(|s| matches!(s, Slot::Loading { startup: true }))
    }

    /// Which model a request means: its name (`id` or `id:latest`), or the default.
    fn resolve(&self, name: Option<&str>, ollama: bool) -> Result<usize, ApiError> {
        let sources = self.sources.read().unwrap_or_else(|e| e.into_inner());
        let available = || {
            let names: Vec<String> =
                sources.iter().map(|e| if ollama { crate::ollama::tagged(&e.src.id) } else { e.src.id.clone() }).collect();
            names.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ")
        };
        let Some(name) = name.filter(|n| !n.is_empty()) else {
            return self
                .default
                .ok_or_else(|| ApiError::invalid("model", format!("model is required: this server serves {}", available())));
        };
        let hit = sources.iter().position(|s| names(&s.src.id, name));
        hit.ok_or_else(|| {
            let msg = if ollama {
                format!("model '{name}' not found; this server serves {}", available())
            } else {
                format!("The model '{name}' does not exist; this server serves {}", available())
            };
            ApiError { param: (!ollama).then(|| "model".into()), ..ApiError::not_found("model_not_found", msg) }
        })
    }

    /// Load the start-time default model (its failure stops the server).
    pub fn start(self: &Arc<Self>) {
        if let Some(i) = self.eager {
            self.lock()[i] = Slot::Loading { startup: true };
            let reg = self.clone();
            tokio::spawn(async move {
                if let Err(e) = reg.load(i).await
                    && let Some(tx) = reg.fail.lock().unwrap_or_else(|e| e.into_inner()).take()
                {
                    let _ = tx.send(e);
                }
            });
        }
    }

    /// The model `name` means, loaded (waiting for room or for its load), held until the lease
    /// drops. `keep`: the request's `keep_alive` (Some(None): forever).
    pub async fn acquire(
        self: &Arc<Self>,
        name: Option<&str>,
        ollama: bool,
        keep: Option<Option<Duration>>,
    ) -> Result<Lease, ApiError> {
        let idx = self.resolve(name, ollama)?;
        let id = &self.source(idx).id.clone();
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.step(idx) {
                Step::Got(app) => return Ok(Lease { reg: self.clone(), idx, app, keep }),
                Step::Starting => return Err(ApiError::loading()),
                Step::TooBig(size, budget) => {
                    let mib = |b: u64| b >> 20;
                    return Err(ApiError {
                        status: axum::http::StatusCode::INSUFFICIENT_STORAGE,
                        ..ApiError::invalid(
                            "model",
                            format!("model '{id}' ({} MiB) does not fit --models-ram ({} MiB)", mib(size), mib(budget)),
                        )
                    });
                }
                Step::Load => {
                    // A task of its own: a client that goes away does not leave the model half
                    // loaded. Others waiting for it try again if this load fails.
                    let reg = self.clone();
                    let done = tokio::spawn(async move { reg.load(idx).await }).await.map_err(|e| e.to_string());
                    if let Err(e) = done.and_then(|r| r) {
                        return Err(ApiError::internal(format!("loading model '{id}' failed: {e}")));
                    }
                }
                Step::Evict(v) => {
                    let reg = self.clone();
                    let _ = tokio::spawn(async move { reg.unload(v, "to make room").await }).await;
                    continue;
                }
                // Wait for a change (a load, an unload, a lease returned); a busy model's work
                // ending is not signalled, so look again after a short while.
                Step::Wait => {
                    let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
                }
            }
        }
    }

    /// What a request for model `idx` does next, decided under the lock: take a lease, start
    /// its load (the slot marked `Loading`), unload another to make room, or wait.
    fn step(&self, idx: usize) -> Step {
        let mut slots = self.lock();
        match &mut slots[idx] {
            Slot::Loaded(l) if l.app.info.get().is_some() => {
                l.leases += 1;
                l.last_used = Instant::now();
                return Step::Got(l.app.clone());
            }
            Slot::Loading { startup: true } => return Step::Starting,
            Slot::Loaded(_) | Slot::Loading { .. } | Slot::Unloading => return Step::Wait,
            Slot::Unloaded => {}
        }
        let held = slots.iter().filter(|s| !matches!(s, Slot::Unloaded)).count();
        let sizes: Vec<u64> = self.sources.read().unwrap_or_else(|e| e.into_inner()).iter().map(|e| e.bytes).collect();
        let used: u64 = slots.iter().zip(&sizes).filter(|(s, _)| !matches!(s, Slot::Unloaded)).map(|(_, b)| b).sum();
        if let Some(budget) = self.budget
            && sizes[idx] > budget
        {
            return Step::TooBig(sizes[idx], budget);
        }
        if held < self.max_loaded && self.budget.is_none_or(|b| used + sizes[idx] <= b) {
            slots[idx] = Slot::Loading { startup: false };
            return Step::Load;
        }
        // Full: unload the least recently used idle model, if there is one.
        let victim = slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match s {
                Slot::Loaded(l) if !l.busy() => Some((l.last_used, i)),
                _ => None,
            })
            .min()
            .map(|(_, i)| i);
        victim.map_or(Step::Wait, Step::Evict)
    }

    /// Load model `idx` (its slot is `Loading`) on a new engine thread; Loaded once ready,
    /// Unloaded again on failure.
    async fn load(self: &Arc<Self>, idx: usize) -> Result<(), String> {
        let src = self.source(idx);
        let app = Arc::new(App::new(self, &src.id));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (load, engine_app) = (src.load.clone(), app.clone());
        let spawned = std::thread::Builder::new()
            .name("cortiq-engine".into())
            .spawn(move || crate::engine_thread(engine_app, load, tx))
            .map_err(|e| format!("cannot start an engine thread: {e}"));
        let result = match spawned {
            Ok(handle) => match rx.await {
                Ok(Ok(())) => Ok(handle),
                Ok(Err(e)) => Err(e),
                Err(_) => Err("the engine thread ended while loading".to_string()),
            },
            Err(e) => Err(e),
        };
        let out = {
            let mut slots = self.lock();
            match result {
                Ok(handle) => {
                    let keep = self.keep_alive;
                    slots[idx] = Slot::Loaded(Live { app, leases: 0, last_used: Instant::now(), keep, engine: handle });
                    Ok(())
                }
                Err(e) => {
                    slots[idx] = Slot::Unloaded;
                    Err(e)
                }
            }
        };
        self.changed.notify_waiters();
        out
    }

    /// Unload model `idx` if it is loaded and idle: its scheduler drains, its thread ends.
    async fn unload(self: &Arc<Self>, idx: usize, why: &str) {
        let live = {
            let mut slots = self.lock();
            match &slots[idx] {
                Slot::Loaded(l) if !l.busy() => {}
                _ => return,
            }
            match std::mem::replace(&mut slots[idx], Slot::Unloading) {
                Slot::Loaded(l) => l,
                _ => unreachable!("checked just above"),
            }
        };
        if let Some(info) = live.app.info.get() {
            info.sched.shutdown();
        }
        let engine = live.engine;
        let _ = tokio::task::spawn_blocking(move || engine.join()).await;
        eprintln!("cortiq serve: model '{}' unloaded ({why})", self.source(idx).id);
        self.lock()[idx] = Slot::Unloaded;
        self.changed.notify_waiters();
    }

    /// Unload the models idle past their keep-alive, every quarter second, until the server
    /// stops.
    pub async fn reap(self: Arc<Self>) {
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let now = Instant::now();
            let due: Vec<usize> = {
                let mut slots = self.lock();
                let mut due = Vec::new();
                for (i, s) in slots.iter_mut().enumerate() {
                    if let Slot::Loaded(l) = s {
                        if l.busy() {
                            l.last_used = now;
                        } else if l.keep.is_some_and(|k| now >= l.last_used + k) {
                            due.push(i);
                        }
                    }
                }
                due
            };
            for i in due {
                self.unload(i, "idle past its keep-alive").await;
            }
        }
    }

    /// Stop every loaded model's scheduler (the server is stopping).
    pub fn shutdown(&self) {
        for s in self.lock().iter() {
            if let Slot::Loaded(l) = s
                && let Some(i) = l.app.info.get()
            {
                i.sched.shutdown();
            }
        }
    }
}

/// A model's bytes on disk: the file's, or a folder's files' (an HF folder).
pub(crate) fn model_bytes(path: &std::path::Path) -> u64 {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => std::fs::read_dir(path)
            .map(|rd| rd.flatten().filter_map(|e| e.metadata().ok()).filter(|m| m.is_file()).map(|m| m.len()).sum())
            .unwrap_or(0),
        Ok(m) => m.len(),
        Err(_) => 0,
    }
}

/// ollama's `keep_alive`: a duration ("5m", "1h30m", "10s", "250ms"), a number of seconds, or
/// negative for forever. `Some(None)`: forever.
pub(crate) fn keep_alive(v: &Value) -> Result<Option<Duration>, String> {
    let secs = match v {
        Value::Number(n) => n.as_f64().ok_or("not a number")?,
        Value::String(s) => {
            let s = s.trim();
            if let Ok(x) = s.parse::<f64>() {
                x
            } else {
                duration(s).ok_or_else(|| format!("{s:?} is not a duration such as \"5m\", \"30s\" or \"-1\""))?
            }
        }
        _ => return Err("expected a duration such as \"5m\" or a number of seconds".into()),
    };
    if !secs.is_finite() {
        return Err("not a finite duration".into());
    }
    Ok((secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(1e9))))
}

/// "1h30m", "5m", "2.5s", "250ms", "-1m" in seconds (Go's duration syntax, which ollama
/// parses).
fn duration(s: &str) -> Option<f64> {
    let (neg, mut rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s),
    };
    let mut total = 0.0;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let n = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let value: f64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let u = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let unit = match &rest[..u] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += value * unit;
        rest = &rest[u..];
    }
    Some(if neg { -total } else { total })
}

/// The per-model routes' layer: the body's `model` (ollama's older `name` too) chooses the
/// model, loaded here if it is not; the route gets it as `Served`. ollama's `keep_alive` sets
/// how long the model stays loaded after this request.
pub(crate) async fn select(State(reg): State<Arc<Registry>>, req: Request, next: Next) -> Response {
    if req.method() != axum::http::Method::POST {
        return next.run(req).await;
    }
    let req_path = req.uri().path().to_string();
    let ollama = req_path.starts_with("/api/");
    let (parts, body) = req.into_parts();
    // The body is whole already (`body_deadline`): this only takes it back out.
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return ApiError::bad_request("invalid_body", "the request body could not be read").into_response();
    };
    // Only these fields are read: the rest is skipped, not built (a body of a million prompts
    // is refused from its bytes by the route, in milliseconds).
    #[derive(serde::Deserialize)]
    struct Ask {
        model: Option<Value>,
        name: Option<Value>,
        keep_alive: Option<Value>,
    }
    let (mut name, keep) = match serde_json::from_slice::<Ask>(&bytes) {
        Ok(a) => {
            let name = [a.model, a.name].into_iter().flatten().find_map(|v| v.as_str().map(str::to_string));
            let keep = match a.keep_alive.filter(|v| ollama && !v.is_null()) {
                None => None,
                Some(v) => match keep_alive(&v) {
                    Ok(k) => Some(k),
                    Err(e) => return ApiError::invalid("keep_alive", format!("keep_alive: {e}")).into_response(),
                },
            };
            (name, keep)
        }
        // Not an object: the route says what is wrong with it, on the default model.
        Err(_) => (None, None),
    };
    // Anthropic's clients name their own models (Claude Code's `claude-*`): any name there
    // means the default model where there is one.
    if req_path.starts_with("/v1/messages")
        && reg.default.is_some()
        && name.as_deref().is_some_and(|n| reg.resolve(Some(n), false).is_err())
    {
        name = None;
    }
    let lease = match reg.acquire(name.as_deref(), ollama, keep).await {
        Ok(l) => l,
        // A body that is not JSON and no default model: the route's own error would be the
        // better one, but there is no model to give it.
        Err(e) => return e.into_response(),
    };
    let mut req = Request::from_parts(parts, axum::body::Body::from(bytes));
    req.extensions_mut().insert(Served(lease.app.clone()));
    let resp = next.run(req).await;
    drop(lease);
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keep_alive_forms() {
        let k = |v: Value| keep_alive(&v);
        assert_eq!(k(json!("5m")), Ok(Some(Duration::from_secs(300))));
        assert_eq!(k(json!("1h30m")), Ok(Some(Duration::from_secs(5400))));
        assert_eq!(k(json!("250ms")), Ok(Some(Duration::from_millis(250))));
        assert_eq!(k(json!(0)), Ok(Some(Duration::ZERO)));
        assert_eq!(k(json!("0")), Ok(Some(Duration::ZERO)));
        assert_eq!(k(json!(30)), Ok(Some(Duration::from_secs(30))));
        assert_eq!(k(json!(-1)), Ok(None));
        assert_eq!(k(json!("-1m")), Ok(None));
        assert!(k(json!("5 minutes")).is_err());
        assert!(k(json!("m")).is_err());
        assert!(k(json!([1])).is_err());
    }
}

//! The serving core's scheduler: N slots over one model, a bounded admission queue, prompts
//! prefilled in chunks between the running sequences' decode steps (continuous batching),
//! cancellation, timeouts and per-request context limits. It knows sequences, tokens and text;
//! it knows no HTTP (the server crate feeds it requests and reads events through a [`Sink`]).
//!
//! Written here rather than taken from a crate: the scheduler is the product's core (what runs
//! in the next step decides latency and throughput), and it must keep the determinism contract.
//!
//! **A sequence's result does not depend on what else runs, nor on the prompt cache.** A step
//! goes through `Model::forward_batch`, whose every entry (a decode position, a prompt chunk)
//! is bit-identical to that entry run alone; a prompt is prefilled in chunks whose boundaries
//! are a function of the prompt and where its prefill started, never of the load
//! (`prefix::next_cut`: up to multiples of `C = SchedConfig::prefill_chunk`, every chunk on the
//! grid and two positions or more, which makes the values independent of the cuts), so the
//! prompt's state is the same whenever its chunks run and whether it started from a cached
//! prefix (`prefix` module doc). The sampler is the request's own (its seed, its RNG stream).
//! So for the same request and seed the tokens are identical alone or beside any neighbours,
//! whatever step each chunk ran in and whatever the cache held (tests/sched.rs checks it).
//!
//! The prompt cache (`SchedConfig::cache`): at admission a request's state becomes the longest
//! cached prefix of its prompt; while prefilling, checkpoints every `CacheConfig::every`
//! positions and the prompt's entry are kept; after a generation, while no request waits, the
//! prompt and the generated tokens are prefilled again and cached (a decode step's values
//! differ from a prefill's in the last bits, so they are not cached as they are), so that a
//! conversation's next turn processes only its new tokens.
//!
//! One step: drop cancelled or timed-out work, admit queued requests into free slots, then one
//! forward over every slot that has a token to decode and the next prompt chunk of each
//! prefilling slot, oldest first, while their positions fit `prefill_budget` (the oldest
//! always goes; with no stream running, every prefilling slot goes). That is continuous
//! batching: the weights stream once for the decode rows and the prompt rows together. A
//! running stream thus waits at most one step of its neighbours' decode rows plus
//! `prefill_budget` prompt positions between two tokens. After an idle spell the first
//! request waits up to `gather` for the others of its burst.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use cortiq_formats::tokenizer::{StreamDecoder, Tokenizer};

use crate::mixers::StateBytes;
use crate::model::{BatchEntry, Logits, Model};
use crate::numerics::Numerics;
use crate::o1::{O1Plan, O1Stats};
use crate::par::pool;
use crate::prefix::{CacheConfig, Filling, Keep, PrefixCache, Scope, entry_point, next_cut};
use crate::sampling::{Sampler, SamplerParams};
use crate::spec::{SpecParams, Speculator};
use crate::state::SeqState;
use crate::stop::StopMatcher;

/// The scheduler's fixed settings.
#[derive(Clone, Debug)]
pub struct SchedConfig {
    /// Sequences decoded together at most (`--parallel`).
    pub slots: usize,
    /// Positions each slot's state may hold (prompt + generated).
    pub n_ctx: usize,
    /// Requests waiting for a slot at most; beyond that `submit` refuses.
    pub queue: usize,
    /// Prompt positions per prefill chunk (also the determinism grid, see the module doc).
    pub prefill_chunk: usize,
    /// Prompt positions per step over all prefilling slots (raised to `prefill_chunk`): several
    /// short prompts start in one step, while a step stays bounded for the running streams.
    pub prefill_budget: usize,
    /// Draft positions per step over all speculating slots while streams that do not speculate
    /// share the step (decode rows or prompt chunks; `--draft-budget`), split evenly: it bounds
    /// how much longer their step gets. None: every draft in full. A drafted token changes
    /// nothing in what is generated, only how many positions a verify checks.
    pub draft_budget: Option<usize>,
    /// How long the first request after an idle spell waits for others sent with it (0: not
    /// at all), so that a burst starts in one step.
    pub gather: Duration,
    /// A request still running this long after it was submitted ends with an error.
    pub timeout: Option<Duration>,
    /// The prompt cache (None: off). Not used under llama.cpp numerics (`prefix` module doc).
    pub cache: Option<CacheConfig>,
    /// Constant-memory decode (`--o1` / `--kv-window`): every request's state follows this plan,
    /// its prompt sealed at its own length (`O1Plan::with_prompt`). None: exact attention.
    pub o1: Option<O1Plan>,
}

/// Where a request's events go. `send` returns false once the receiver is gone; `is_closed`
/// says so without sending (a client that disconnected): the slot is freed at the next step.
pub trait Sink: Send {
    fn send(&self, ev: Event) -> bool;
    fn is_closed(&self) -> bool;
}

/// One generation to run.
pub struct Request {
    pub prompt: Vec<u32>,
    /// Tokens to generate at most.
    pub n_predict: usize,
    pub sampler: SamplerParams,
    /// Generation ends when one of these is sampled (not emitted).
    pub eos: Vec<u32>,
    /// Generation ends when the text contains one of these (not emitted).
    pub stops: Vec<String>,
    /// Report each token's log-probability and this many most likely alternatives.
    pub logprobs: Option<usize>,
    /// Added to the logits of these ids before sampling (and before the log-probabilities).
    pub logit_bias: Vec<(u32, f32)>,
    /// Passed back in every event (the choice index of an `n > 1` request).
    pub index: usize,
    pub sink: Box<dyn Sink>,
    /// Structured output: only tokens the constraint allows are sampled.
    pub constraint: Option<Box<dyn Constraint>>,
    /// Speculative decoding: the slot drafts and verifies (`Model::forward_verify`), same
    /// tokens as without.
    pub spec: Option<SpecParams>,
    /// Use the prompt cache (when the scheduler has one): start from the longest cached
    /// prefix, cache this prompt and, after the generation, prompt + output.
    pub cache: bool,
    /// The prompt cache's scope the request reads and fills (`prefix::SHARED` unless the
    /// server separates its API keys').
    pub cache_scope: Scope,
}

/// A constraint on the tokens a request may generate (structured output; the server's JSON
/// schema matcher implements it). Applied after the logit bias, before sampling, so the
/// log-probabilities reported are those of the constrained distribution.
pub trait Constraint: Send {
    /// Set the logits of the tokens not allowed next to -inf.
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String>;
    /// Advance by the sampled token; true when the output is complete (nothing may follow).
    fn commit(&mut self, id: u32) -> Result<bool, String>;
}

/// A token's log-probability and the most likely alternatives at its position.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    /// (id, logprob), most likely first.
    pub top: Vec<(u32, f32)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `n_predict` tokens, or the context filled up.
    Length,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The prompt is admitted to a slot and its processing begins.
    Started {
        index: usize,
    },
    /// A generated token: `piece` is its own text (what a log-probability entry names), `text`
    /// what is safe to show now (stop strings held back or cut).
    Token {
        index: usize,
        id: u32,
        piece: String,
        text: String,
        logprob: Option<TokenLogprob>,
    },
    /// The end: `tail` is text still held back that belongs to the output.
    Done {
        index: usize,
        finish: Finish,
        /// The stop string that ended the output (None: an end-of-generation token or a limit).
        stop: Option<String>,
        tail: String,
        n_prompt: usize,
        /// Prompt positions restored from the prompt cache rather than computed.
        n_cached: usize,
        n_generated: usize,
        /// Speculative decoding: tokens drafted and of those accepted (0 without it).
        drafted: usize,
        accepted: usize,
        /// Verifies run (decode steps that checked a draft).
        verifies: usize,
        /// The sequence's state when it ended.
        state: StateReport,
    },
    Error {
        index: usize,
        kind: ErrorKind,
        message: String,
    },
}

/// A sequence's state when its request ended (`Event::Done`): its length and bytes by kind,
/// and the O(1) guard's counts under a constant-memory plan. The bytes are the state's as it
/// stands: a request that ends inside a verify still holds the drafted positions past its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateReport {
    /// Positions the state holds as plain decoding would have it.
    pub len: usize,
    pub bytes: StateBytes,
    pub o1: Option<O1Stats>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request ran past `SchedConfig::timeout`.
    Timeout,
    /// The forward failed (a bug or an exhausted resource, never the client's input: that is
    /// checked before `submit`).
    Engine,
}

/// Why a session save or restore failed: the request cannot be honoured (a bad or foreign file,
/// nothing to save) or the server failed (I/O, shutting down).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SessionOpError {
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Failed(String),
}

/// Why `submit` refused a request.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SubmitError {
    #[error("the request queue is full ({0} waiting)")]
    QueueFull(usize),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {n_prompt} tokens; the context is {n_ctx}")]
    TooLong { n_prompt: usize, n_ctx: usize },
    #[error("the server is shutting down")]
    ShuttingDown,
}

/// Counters the scheduler keeps (read by /metrics).
#[derive(Default, Debug)]
pub struct Counters {
    pub queued: AtomicUsize,
    pub busy_slots: AtomicUsize,
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub decode_steps: AtomicU64,
    /// Rows decoded over all decode steps (rows / steps = mean batch).
    pub decode_rows: AtomicU64,
    pub cancelled: AtomicU64,
    pub timed_out: AtomicU64,
    /// Generated tokens per second over the last few seconds of work, × 1000.
    pub tok_per_s_milli: AtomicU64,
    /// Prompt cache: requests that restored a prefix, requests that found none.
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    /// Prompt positions restored instead of computed.
    pub cache_reused_tokens: AtomicU64,
    /// Bytes and prefixes held now.
    pub cache_bytes: AtomicU64,
    pub cache_entries: AtomicUsize,
    /// Entries dropped to stay within the budget.
    pub cache_evictions: AtomicU64,
    /// Finished generations prefilled again while idle, and the positions that took.
    pub cache_refills: AtomicU64,
    pub cache_refill_tokens: AtomicU64,
}

struct Queue {
    items: VecDeque<(Request, Instant)>,
    shutdown: bool,
    /// Session saves and restores for the engine thread, with where to answer.
    controls: VecDeque<(Control, std::sync::mpsc::Sender<Result<ControlDone, SessionOpError>>)>,
}

/// A session operation the engine thread runs between steps (`Handle::save_session`): only
/// the memory side (the cache's entry to bytes, bytes into the cache); the file is written or
/// read by the asking thread, with no lock held.
/// Positions an embeddings request runs per forward at least (`Model::embed_batch`): short
/// inputs share one read of the weights.
const EMBED_BATCH_TOKENS: usize = 2048;

enum Control {
    Save {
        slot: usize,
        scope: Scope,
    },
    Restore {
        path: String,
        bytes: Vec<u8>,
        scope: Scope,
    },
    /// Embeddings of these inputs (`Model::embed_pooled`), between two steps.
    Embed {
        inputs: Vec<Vec<u32>>,
        pooling: crate::Pooling,
        normalize: bool,
    },
}

/// What the engine thread answers a `Control` with.
enum ControlDone {
    /// A save's bytes and how many tokens they hold.
    Saved(Vec<u8>, usize),
    Restored(SessionInfo),
    Embedded(Vec<Vec<f32>>),
}

/// What a session save or restore did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionInfo {
    /// Tokens saved or restored.
    pub tokens: usize,
    /// File bytes written or read.
    pub bytes: u64,
}

/// The submitting side: cheap to clone, shared by the HTTP handlers.
#[derive(Clone)]
pub struct Handle {
    inner: Arc<Shared>,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    cfg: SchedConfig,
    counters: Counters,
    ready: AtomicBool,
    /// Finished generations (prompt + output) to prefill again and cache while idle, newest last.
    refills: Mutex<VecDeque<(Vec<u32>, Scope)>>,
    /// Each slot's last cached request's prompt and output (what a session save of it writes).
    last: Mutex<Vec<(Vec<u32>, Scope)>>,
}

impl Handle {
    pub fn new(cfg: SchedConfig) -> Handle {
        let cfg_slots = cfg.slots;
        let q = Queue { items: VecDeque::new(), shutdown: false, controls: VecDeque::new() };
        Handle {
            inner: Arc::new(Shared {
                queue: Mutex::new(q),
                wake: Condvar::new(),
                cfg,
                counters: Counters::default(),
                ready: AtomicBool::new(false),
                refills: Mutex::new(VecDeque::new()),
                last: Mutex::new(vec![(Vec::new(), crate::prefix::SHARED); cfg_slots]),
            }),
        }
    }

    pub fn config(&self) -> &SchedConfig {
        &self.inner.cfg
    }

    pub fn counters(&self) -> &Counters {
        &self.inner.counters
    }

    /// True once `run` has started (the model is loaded).
    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Acquire)
    }

    /// Queue requests that belong together (the choices of one `n > 1` request): all or none.
    /// Requests the queue can take now (a hint for admission: `submit` decides).
    pub fn room(&self) -> usize {
        self.inner.cfg.queue.saturating_sub(self.inner.counters.queued.load(Ordering::Relaxed))
    }

    pub fn submit(&self, reqs: Vec<Request>) -> Result<(), SubmitError> {
        let cfg = &self.inner.cfg;
        for r in &reqs {
            if r.prompt.is_empty() {
                return Err(SubmitError::EmptyPrompt);
            }
            if r.prompt.len() >= cfg.n_ctx {
                return Err(SubmitError::TooLong { n_prompt: r.prompt.len(), n_ctx: cfg.n_ctx });
            }
        }
        let mut q = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.shutdown {
            return Err(SubmitError::ShuttingDown);
        }
        if q.items.len() + reqs.len() > cfg.queue {
            return Err(SubmitError::QueueFull(q.items.len()));
        }
        let now = Instant::now();
        q.items.extend(reqs.into_iter().map(|r| (r, now)));
        self.inner.counters.queued.store(q.items.len(), Ordering::Relaxed);
        drop(q);
        self.inner.wake.notify_one();
        Ok(())
    }

    /// Save the conversation slot `slot` last served (its prompt and output, as the prompt
    /// cache holds it: the entry sharing the longest prefix) to the session file `path`
    /// (atomically). Waits for the engine thread (between two steps).
    /// The file is written on the calling thread.
    pub fn save_session(&self, slot: usize, path: &std::path::Path) -> Result<SessionInfo, SessionOpError> {
        self.save_session_in(crate::prefix::SHARED, slot, path)
    }

    /// `save_session` of a conversation in `scope` (a slot whose last one was another scope's
    /// has nothing to save for this one).
    pub fn save_session_in(&self, scope: Scope, slot: usize, path: &std::path::Path) -> Result<SessionInfo, SessionOpError> {
        let (bytes, tokens) = match self.control(Control::Save { slot, scope })? {
            ControlDone::Saved(bytes, tokens) => (bytes, tokens),
            _ => return Err(SessionOpError::Failed("another operation's answer to a save".into())),
        };
        // Writing failed (disk full, permissions): the server's trouble, not the request's.
        crate::session::write_file(path, &bytes).map_err(|e| SessionOpError::Failed(e.to_string()))?;
        Ok(SessionInfo { tokens, bytes: bytes.len() as u64 })
    }

    /// Read the session file `path` into the prompt cache: a request whose prompt starts with
    /// the saved tokens continues from the saved state. The file is read on the calling thread
    /// (a file past what the cache could hold is refused unread).
    pub fn restore_session(&self, path: &std::path::Path) -> Result<SessionInfo, SessionOpError> {
        self.restore_session_in(crate::prefix::SHARED, path)
    }

    /// `restore_session` into `scope`.
    pub fn restore_session_in(&self, scope: Scope, path: &std::path::Path) -> Result<SessionInfo, SessionOpError> {
        let Some(cache) = self.inner.cfg.cache else { return Err(no_cache()) };
        let cap = cache.ram as u64 + (1 << 20);
        let bytes = crate::session::read_file(path, cap).map_err(|e| SessionOpError::Refused(e.to_string()))?;
        match self.control(Control::Restore { path: path.display().to_string(), bytes, scope })? {
            ControlDone::Restored(info) => Ok(info),
            _ => Err(SessionOpError::Failed("another operation's answer to a restore".into())),
        }
    }

    /// Embeddings of `inputs` (token ids, each within the context), computed on the engine
    /// thread between two steps of whatever it is generating (`Model::embed_pooled`); a row
    /// per input, in order.
    pub fn embed(
        &self,
        inputs: Vec<Vec<u32>>,
        pooling: crate::Pooling,
        normalize: bool,
    ) -> Result<Vec<Vec<f32>>, SessionOpError> {
        match self.control(Control::Embed { inputs, pooling, normalize })? {
            ControlDone::Embedded(rows) => Ok(rows),
            _ => Err(SessionOpError::Failed("another operation's answer to an embedding".into())),
        }
    }

    fn control(&self, c: Control) -> Result<ControlDone, SessionOpError> {
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let mut q = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
            if q.shutdown {
                return Err(SessionOpError::Failed("the server is shutting down".into()));
            }
            q.controls.push_back((c, tx));
        }
        self.inner.wake.notify_all();
        rx.recv().map_err(|_| SessionOpError::Failed("the engine stopped".into()))?
    }

    /// Ask `run` to return once the running and queued requests are done.
    pub fn shutdown(&self) {
        let mut q = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.shutdown = true;
        drop(q);
        self.inner.wake.notify_all();
    }

    /// The loop of a model that only embeds (an encoder, `crate::encoder::Encoder`): each
    /// `embed` runs `embed` (inputs, pooling, normalize) as it comes; a generation request is
    /// ended with an error and a session operation refused (the server checks both before,
    /// this is the backstop). Returns after `shutdown`.
    pub fn run_embedder(&self, embed: &dyn Fn(&[Vec<u32>], crate::Pooling, bool) -> crate::error::Result<Vec<Vec<f32>>>) {
        const ONLY: &str = "this model only makes embeddings";
        self.inner.ready.store(true, Ordering::Release);
        loop {
            let mut q = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
            while q.controls.is_empty() && q.items.is_empty() && !q.shutdown {
                q = self.inner.wake.wait(q).unwrap_or_else(|e| e.into_inner());
            }
            if q.shutdown && q.controls.is_empty() && q.items.is_empty() {
                return;
            }
            let items: Vec<_> = q.items.drain(..).collect();
            let controls: Vec<_> = q.controls.drain(..).collect();
            self.inner.counters.queued.store(0, Ordering::Relaxed);
            drop(q);
            for (req, _) in items {
                req.sink.send(Event::Error { index: req.index, kind: ErrorKind::Engine, message: ONLY.into() });
            }
            for (c, answer) in controls {
                let done = match c {
                    Control::Embed { inputs, pooling, normalize } => embed(&inputs, pooling, normalize)
                        .map(ControlDone::Embedded)
                        .map_err(|e| SessionOpError::Refused(e.to_string())),
                    _ => Err(SessionOpError::Refused(format!("{ONLY}: it keeps no sessions"))),
                };
                let _ = answer.send(done);
            }
        }
    }

    /// The scheduler loop: call on the engine's own thread; returns after `shutdown` once the
    /// work in hand is done.
    pub fn run(&self, model: &Model, tok: &Tokenizer) {
        self.run_with_draft(model, None, tok)
    }

    /// `run` with a draft model for the requests that speculate with one
    /// (`SpecMethod::Draft`; checked against the target's vocabulary when it was loaded).
    pub fn run_with_draft(&self, model: &Model, draft: Option<&Arc<Model>>, tok: &Tokenizer) {
        let cfg = self.inner.cfg.clone();
        let mut slots: Vec<Option<Slot<'_>>> = (0..cfg.slots).map(|_| None).collect();
        let mut states: Vec<SeqState> = (0..cfg.slots).map(|_| slot_state(model, cfg.n_ctx)).collect();
        // Whether a slot's state is the plain kind (else it was built for an O(1) plan).
        let mut plain = vec![true; cfg.slots];
        let mut rate = Rate::new();
        let mut admitted = 0u64;
        let mut logits = Vec::new(); // each step's logits rows, the buffer kept between steps
        // llama.cpp numerics order a matmul by the call's length: a prompt's values depend on
        // its cuts there, which the cache cannot allow (`prefix` module doc).
        let mut cache = cfg.cache.filter(|_| model.numerics != Numerics::LlamaCpp).map(PrefixCache::new);
        if cfg.cache.is_some() && cache.is_none() {
            tracing::warn!("the prompt cache is off under llama.cpp numerics (its values depend on how a prompt is cut)");
        }
        self.inner.ready.store(true, Ordering::Release);
        loop {
            // Wait for work; admit what fits.
            {
                let mut q = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
                let mut idle = false;
                while q.items.is_empty() && slots.iter().all(Option::is_none) && !q.shutdown {
                    idle = true;
                    // A restore waits for no refill; a save goes after them, so that it writes
                    // the conversation's prompt and output (the refill of a generation that
                    // just ended is queued before its Done event reaches the asking thread).
                    if q.controls.iter().any(|(c, _)| matches!(c, Control::Restore { .. } | Control::Embed { .. })) {
                        break;
                    }
                    // Idle: prefill a finished generation again for the cache (slot 0's state
                    // is free), stopping at the first chunk boundary after a request arrives.
                    let job = self.inner.refills.lock().unwrap_or_else(|e| e.into_inner()).pop_back();
                    if let (Some(c), Some((tokens, scope))) = (cache.as_mut(), job) {
                        drop(q);
                        if !plain[0] {
                            states[0] = slot_state(model, cfg.n_ctx);
                            plain[0] = true;
                        }
                        self.refill(model, &cfg, c, tokens, scope, &mut states[0]);
                        q = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
                        continue;
                    }
                    if !q.controls.is_empty() {
                        break;
                    }
                    rate.idle();
                    self.inner.counters.tok_per_s_milli.store(0, Ordering::Relaxed);
                    q = self.inner.wake.wait(q).unwrap_or_else(|e| e.into_inner());
                }
                // Work after idling: requests sent together (parallel calls, n > 1 split by a
                // client) reach the queue a few milliseconds apart; gather them for up to
                // `gather`, so that they start in one step instead of one step each.
                if idle && !cfg.gather.is_zero() {
                    let until = Instant::now() + cfg.gather;
                    while q.items.len() < cfg.slots && !q.shutdown {
                        let left = until.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            break;
                        }
                        q = self.inner.wake.wait_timeout(q, left).unwrap_or_else(|e| e.into_inner()).0;
                    }
                }
                // Session operations run with the queue free (submits go on meanwhile).
                if !q.controls.is_empty() {
                    let controls: Vec<_> = q.controls.drain(..).collect();
                    drop(q);
                    for (c, answer) in controls {
                        let _ = answer.send(self.session_op(model, &cfg, cache.as_mut(), c));
                    }
                    q = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
                }
                if q.shutdown && q.items.is_empty() && slots.iter().all(Option::is_none) {
                    return;
                }
                // Requests whose client left while they waited never take a slot.
                let before = q.items.len();
                q.items.retain(|(r, _)| !r.sink.is_closed());
                let gone = before - q.items.len();
                self.inner.counters.cancelled.fetch_add(gone as u64, Ordering::Relaxed);
                for (si, slot) in slots.iter_mut().enumerate() {
                    if slot.is_some() {
                        continue;
                    }
                    let Some((req, t_submit)) = q.items.pop_front() else { break };
                    match cfg.o1.map(|p| p.with_prompt(req.prompt.len())) {
                        Some(plan) => match model.new_state_o1(cfg.n_ctx, plan) {
                            Ok(st) => {
                                states[si] = st;
                                plain[si] = false;
                            }
                            Err(e) => {
                                req.sink.send(Event::Error { index: req.index, kind: ErrorKind::Engine, message: e.to_string() });
                                continue;
                            }
                        },
                        None if !plain[si] => {
                            states[si] = slot_state(model, cfg.n_ctx);
                            plain[si] = true;
                        }
                        None => states[si].clear(),
                    }
                    // The longest cached prefix of the prompt (plain states only).
                    let (fill, cached) = match cache.as_mut() {
                        Some(c) if req.cache && states[si].cacheable() => {
                            let (fill, n) = Filling::start_in(c, req.cache_scope, &req.prompt, &mut states[si]);
                            let counter = if n > 0 { &self.inner.counters.cache_hits } else { &self.inner.counters.cache_misses };
                            counter.fetch_add(1, Ordering::Relaxed);
                            self.inner.counters.cache_reused_tokens.fetch_add(n as u64, Ordering::Relaxed);
                            (Some(fill), n)
                        }
                        _ => (None, 0),
                    };
                    // An MTP drafter reads the final-normed hidden row of every position
                    // (`BatchEntry::hidden`): after a prefix restored from the cache, whose rows
                    // it never saw, it stays silent (plain decoding, same tokens).
                    let spec = match req.spec.map(|p| p.speculator(draft, cfg.n_ctx)).transpose() {
                        Ok(sp) => sp,
                        Err(e) => {
                            req.sink.send(Event::Error { index: req.index, kind: ErrorKind::Engine, message: e.to_string() });
                            continue;
                        }
                    };
                    admitted += 1;
                    req.sink.send(Event::Started { index: req.index });
                    let mut s = Slot::new(req, tok, t_submit, admitted, cfg.timeout, spec);
                    s.phase = Phase::Prefill { done: cached };
                    (s.fill, s.cached, s.slot) = (fill, cached, si);
                    *slot = Some(s);
                }
                self.inner.counters.queued.store(q.items.len(), Ordering::Relaxed);
            }
            let now = Instant::now();
            for slot in slots.iter_mut() {
                let Some(s) = slot else { continue };
                if s.req.sink.is_closed() {
                    self.inner.counters.cancelled.fetch_add(1, Ordering::Relaxed);
                    *slot = None;
                } else if s.deadline.is_some_and(|d| now >= d) {
                    self.inner.counters.timed_out.fetch_add(1, Ordering::Relaxed);
                    let secs = cfg.timeout.map_or(0.0, |t| t.as_secs_f64());
                    s.req.sink.send(Event::Error {
                        index: s.req.index,
                        kind: ErrorKind::Timeout,
                        message: format!("the request ran past the timeout of {secs:.0} s"),
                    });
                    *slot = None;
                }
            }
            self.inner.counters.busy_slots.store(slots.iter().filter(|s| s.is_some()).count(), Ordering::Relaxed);

            let generated = self.step(model, &cfg, &mut slots, &mut states, &mut logits, cache.as_mut());
            if let Some(c) = &cache {
                self.inner.counters.cache_bytes.store(c.bytes() as u64, Ordering::Relaxed);
                self.inner.counters.cache_entries.store(c.len(), Ordering::Relaxed);
            }
            rate.add(generated);
            self.inner.counters.tok_per_s_milli.store((rate.per_second() * 1000.0) as u64, Ordering::Relaxed);
            self.inner.counters.busy_slots.store(slots.iter().filter(|s| s.is_some()).count(), Ordering::Relaxed);
        }
    }

    /// One step: a forward over every slot with a token to decode and the next prompt chunk of
    /// the prefilling slots, oldest first, as long as their positions stay within
    /// `prefill_budget` (at least one chunk) — one weight pass for all of it
    /// (`Model::forward_batch`, each entry as if alone). Returns tokens generated.
    fn step(
        &self,
        model: &Model,
        cfg: &SchedConfig,
        slots: &mut [Option<Slot<'_>>],
        states: &mut [SeqState],
        logits: &mut Vec<f32>,
        mut cache: Option<&mut PrefixCache>,
    ) -> usize {
        // What each slot runs: (slot, tokens, for a prompt chunk: its end and what to keep
        // there, a verify). A decoding slot whose drafter has a draft verifies its token and
        // the draft in the same batch (`BatchEntry::verify`): one read of the weights for
        // every stream, speculating or not.
        type Planned = (usize, Vec<u32>, Option<(usize, Keep)>, bool);
        let mut plan: Vec<Planned> = Vec::new();
        let share = draft_share(cfg.draft_budget, slots);
        // The remainder's extra positions go round the speculating slots from step to step.
        let turn = self.inner.counters.decode_steps.load(Ordering::Relaxed) as usize;
        let mut k = 0;
        for (si, s) in slots.iter_mut().enumerate() {
            let Some(Slot { phase: Phase::Decode { next }, spec, history, generated, req, .. }) = s else { continue };
            let st = &states[si];
            let draft = match spec {
                Some(sp) => {
                    let cap = share.map_or(usize::MAX, |(q, r, n)| q + usize::from((k + turn) % n < r));
                    k += 1;
                    let n_max = (req.n_predict - *generated - 1).min(st.n_ctx - st.len - 1).min(cap);
                    if n_max == 0 { Vec::new() } else { sp.draft(model, history, n_max) }
                }
                None => Vec::new(),
            };
            if draft.is_empty() {
                plan.push((si, vec![*next], None, false));
            } else {
                plan.push((si, [&[*next][..], &draft].concat(), None, true));
            }
        }
        let mut prefilling: Vec<(u64, usize)> = slots
            .iter()
            .enumerate()
            .filter_map(|(si, s)| match s {
                Some(Slot { phase: Phase::Prefill { .. }, order, .. }) => Some((*order, si)),
                _ => None,
            })
            .collect();
        prefilling.sort_unstable();
        let chunk = cfg.prefill_chunk.max(1);
        // The budget bounds the running streams' wait; with none running, every prefilling
        // slot takes its next chunk.
        let running = !plan.is_empty();
        let mut budget = if running { cfg.prefill_budget.max(chunk) } else { usize::MAX };
        for (k, &(_, si)) in prefilling.iter().enumerate() {
            let s = slots[si].as_ref().expect("a prefilling slot");
            let Phase::Prefill { done } = s.phase else { unreachable!("listed as prefilling") };
            let every = cache.as_ref().filter(|_| s.fill.is_some()).map(|c| c.config().every);
            let (len, grid) = (s.req.prompt.len(), states[si].grid());
            let cut = match &s.fill {
                Some(f) => f.cut(done, len, chunk, every, grid),
                None => next_cut(done, len, chunk, every, false, grid),
            };
            let end = cut.end;
            if k > 0 && end - done > budget {
                break;
            }
            budget = budget.saturating_sub(end - done);
            plan.push((si, s.req.prompt[done..end].to_vec(), Some((end, cut.keep)), false));
        }
        let mut n = 0;
        if plan.is_empty() {
            return n;
        }
        // Entries in slot order (so the states come out of one pass over them).
        plan.sort_unstable_by_key(|p| p.0);
        let wants: Vec<Logits> = plan
            .iter()
            .map(|(si, _, end, verify)| match end {
                Some((e, _)) if *e < slots[*si].as_ref().expect("planned").req.prompt.len() => Logits::None,
                _ if *verify => Logits::From(0),
                _ => Logits::Last,
            })
            .collect();
        let result = {
            let mut states_of = states.iter_mut().enumerate();
            let mut slots_of = slots.iter_mut().enumerate();
            let mut batch: Vec<BatchEntry<'_>> = Vec::with_capacity(plan.len());
            for ((si, toks, _, verify), &want) in plan.iter().zip(&wants) {
                let state = states_of.find(|(i, _)| i == si).map(|(_, st)| st).expect("slot order ascends");
                let slot = slots_of.find(|(i, _)| i == si).map(|(_, s)| s).expect("slot order ascends");
                // A verify journals its rows; an MTP drafter's other entries hand theirs out.
                let (journal, hidden) = match slot {
                    Some(Slot { spec: Some(sp), hidden, .. }) => match (*verify, sp.wants_hidden()) {
                        (true, _) => (Some(&mut sp.journal), None),
                        (false, true) => (None, Some(hidden)),
                        (false, false) => (None, None),
                    },
                    _ => (None, None),
                };
                batch.push(BatchEntry { tokens: toks, state, want, verify: journal, hidden });
            }
            model.forward_batch_into(&mut batch, logits)
        };
        let c = &self.inner.counters;
        match result {
            Ok(()) => {}
            Err(e) => {
                // Nothing in the batch moved; the entry at fault ends, the others retry.
                let (entry, msg) = match &e {
                    crate::EngineError::Batch { entry, source } => (Some(*entry), source.to_string()),
                    other => (None, other.to_string()),
                };
                for (i, (si, _, _, _)) in plan.iter().enumerate() {
                    if (entry.is_none() || entry == Some(i))
                        && let Some(s) = slots[*si].take()
                    {
                        s.req.sink.send(Event::Error { index: s.req.index, kind: ErrorKind::Engine, message: msg.clone() });
                    }
                }
                return n;
            }
        }
        let n_decode = plan.iter().filter(|p| p.2.is_none()).count();
        if n_decode > 0 {
            c.decode_steps.fetch_add(1, Ordering::Relaxed);
            c.decode_rows.fetch_add(n_decode as u64, Ordering::Relaxed);
        }
        let vocab = model.cfg.vocab;
        let mut idx = Vec::new(); // (slot, its logits row) of the slots that take one token
        let mut verified = Vec::new(); // (slot, its first row, its tokens) of the verifies
        let mut row = 0;
        for ((si, toks, end, verify), want) in plan.iter().zip(&wants) {
            if let Some(Slot { spec: Some(sp), hidden, .. }) = slots[*si].as_mut()
                && sp.wants_hidden()
                && !*verify
            {
                sp.observe(hidden, model.cfg.d_model);
            }
            if *verify {
                verified.push((*si, row, toks));
                row += toks.len();
                continue;
            }
            if let Some((end, keep)) = end {
                c.prompt_tokens.fetch_add(toks.len() as u64, Ordering::Relaxed);
                let s = slots[*si].as_mut().expect("planned");
                if let (Some(fill), Some(cache)) = (s.fill.as_mut(), cache.as_deref_mut()) {
                    let evicted = fill.after(cache, *keep, &s.req.prompt[..*end], &states[*si]);
                    c.cache_evictions.fetch_add(evicted as u64, Ordering::Relaxed);
                }
                if *want == Logits::None {
                    slots[*si].as_mut().expect("planned").phase = Phase::Prefill { done: *end };
                    continue;
                }
            }
            idx.push((*si, row));
            row += 1;
        }
        let drawn = presample(slots, &idx, logits, vocab);
        for (&(si, r), d) in idx.iter().zip(drawn) {
            let row = &logits[r * vocab..(r + 1) * vocab];
            n += self.take_token(&mut slots[si], row, states[si].len, &states[si], d);
        }
        for (si, r, toks) in verified {
            let rows = &logits[r * vocab..(r + toks.len()) * vocab];
            n += self.verified(model, &mut slots[si], &mut states[si], toks, rows);
        }
        n
    }

    /// A decoding slot's verify of `toks` (its sampled token, then the draft), after the
    /// batch computed its `rows` (`BatchEntry::verify`): sample-and-match row by row through
    /// `take_token` (each row's token sent as in a plain step; the next row only while the
    /// token drawn is the drafted one), and the state cut back to what was fed and kept.
    /// Returns tokens generated.
    fn verified(&self, model: &Model, slot: &mut Option<Slot<'_>>, state: &mut SeqState, toks: &[u32], rows: &[f32]) -> usize {
        // (Counted as one decode row of the step's batch.)
        let (vocab, d, pos0) = (model.cfg.vocab, toks.len() - 1, state.len - toks.len());
        let (mut n, mut accepted) = (0, 0);
        for i in 0..=d {
            // The state as plain decoding would have it: the positions fed so far.
            n += self.take_token(slot, &rows[i * vocab..(i + 1) * vocab], pos0 + 1 + i, state, None);
            let Some(s) = slot.as_mut() else { break };
            let Phase::Decode { next } = s.phase else { unreachable!("a live slot after a token decodes") };
            if i == d || next != toks[1 + i] {
                break;
            }
            accepted += 1;
            s.spec.as_mut().expect("speculating").accept_one();
        }
        // A slot that ended is cleared on its next admission; a live one keeps what was fed.
        if let Some(sp) = slot.as_mut().and_then(|s| s.spec.as_mut()) {
            sp.adapt(d, accepted);
            if let Err(e) = model.verify_keep(state, &mut sp.journal, 1 + accepted) {
                return n + self.fail(slot, e.to_string());
            }
            if sp.wants_hidden() {
                let dm = model.cfg.d_model;
                let rows = sp.journal.hidden(dm).to_vec();
                sp.observe(&rows, dm);
            }
        }
        n
    }

    /// Sample the slot's next token from `logits` (the state now `len` long), send it, and
    /// either set up its decode or end the request. Returns 1 when a token was generated.
    /// `drawn`: the token `presample` already drew from this row, if it did.
    fn take_token(&self, slot: &mut Option<Slot<'_>>, logits: &[f32], len: usize, state: &SeqState, drawn: Option<u32>) -> usize {
        let s = slot.as_mut().expect("a live slot");
        let adjusted;
        let logits = if s.req.logit_bias.is_empty() && s.req.constraint.is_none() {
            logits
        } else {
            let mut l = logits.to_vec();
            for &(id, b) in &s.req.logit_bias {
                if let Some(v) = l.get_mut(id as usize) {
                    *v += b;
                }
            }
            if let Some(c) = s.req.constraint.as_mut()
                && let Err(e) = c.mask(&mut l)
            {
                return self.fail(slot, format!("structured output: {e}"));
            }
            adjusted = l;
            &adjusted
        };
        let id = drawn.unwrap_or_else(|| s.sampler.sample(logits, &s.history));
        let index = s.req.index;
        let report = StateReport { len, bytes: state.bytes_by_kind(), o1: state.o1_stats() };
        if s.req.eos.contains(&id) {
            let done = s.finish(Finish::Stop, true, report);
            self.queue_refill(s);
            s.req.sink.send(done);
            *slot = None;
            return 0;
        }
        let logprob = s.req.logprobs.map(|top| token_logprob(logits, id, top));
        let complete = match s.req.constraint.as_mut().map(|c| c.commit(id)) {
            Some(Err(e)) => return self.fail(slot, format!("structured output: {e}")),
            Some(Ok(done)) => done,
            None => false,
        };
        s.generated += 1;
        s.history.push(id);
        self.inner.counters.generated_tokens.fetch_add(1, Ordering::Relaxed);
        let piece = s.dec.push(id);
        let (text, stopped) = s.stops.push(&piece);
        s.req.sink.send(Event::Token { index, id, piece, text, logprob });
        let finish = if stopped {
            Some((Finish::Stop, false))
        } else if complete {
            Some((Finish::Stop, true))
        } else if s.generated >= s.req.n_predict || len >= state.n_ctx {
            Some((Finish::Length, true))
        } else {
            None
        };
        match finish {
            Some((f, flush)) => {
                let done = s.finish(f, flush, report);
                self.queue_refill(s);
                s.req.sink.send(done);
                *slot = None;
            }
            None => s.phase = Phase::Decode { next: id },
        }
        1
    }
}

impl Handle {
    /// A cached request's generation ended: its prompt and output go to the idle refills (the
    /// most recent few; older ones are dropped).
    fn queue_refill(&self, s: &mut Slot<'_>) {
        if s.fill.is_none() || s.generated == 0 {
            return;
        }
        let scope = s.req.cache_scope;
        if let Some(l) = self.inner.last.lock().unwrap_or_else(|e| e.into_inner()).get_mut(s.slot) {
            l.0.clone_from(&s.history);
            l.1 = scope;
        }
        let mut q = self.inner.refills.lock().unwrap_or_else(|e| e.into_inner());
        q.push_back((std::mem::take(&mut s.history), scope));
        while q.len() > 2 * self.inner.cfg.slots.max(1) {
            q.pop_front();
        }
    }

    /// Whether a request waits (or shutdown was asked): an idle refill stops.
    fn work_waiting(&self) -> bool {
        let q = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
        !q.items.is_empty() || q.shutdown
    }

    /// Prefill `tokens` (a finished generation's prompt and output) from the longest cached
    /// prefix up to its entry point and cache it, the same cuts a prompt of these tokens takes;
    /// stops early when a request arrives (the request goes first; the refill goes back to the
    /// list, newest, and starts over at the next idle spell).
    fn refill(
        &self,
        model: &Model,
        cfg: &SchedConfig,
        cache: &mut PrefixCache,
        tokens: Vec<u32>,
        scope: Scope,
        state: &mut SeqState,
    ) {
        let c = &self.inner.counters;
        state.clear();
        let (mut fill, mut done) = Filling::start_in(cache, scope, &tokens, state);
        let (start, stop) = (done, entry_point(tokens.len(), state.grid()));
        while done < stop {
            if self.work_waiting() {
                let mut q = self.inner.refills.lock().unwrap_or_else(|e| e.into_inner());
                q.push_back((tokens, scope));
                while q.len() > 2 * self.inner.cfg.slots.max(1) {
                    q.pop_front();
                }
                break;
            }
            let cut = fill.cut(done, tokens.len(), cfg.prefill_chunk.max(1), Some(cache.config().every), state.grid());
            if let Err(e) = model.forward(&tokens[done..cut.end], state, Logits::None) {
                tracing::warn!("prompt cache refill stopped: {e}");
                break;
            }
            done = cut.end;
            let evicted = fill.after(cache, cut.keep, &tokens[..done], state);
            c.cache_evictions.fetch_add(evicted as u64, Ordering::Relaxed);
        }
        if done == stop && done > start {
            c.cache_refills.fetch_add(1, Ordering::Relaxed);
            c.cache_refill_tokens.fetch_add((done - start) as u64, Ordering::Relaxed);
        }
        c.cache_bytes.store(cache.bytes() as u64, Ordering::Relaxed);
        c.cache_entries.store(cache.len(), Ordering::Relaxed);
        state.clear();
    }

    /// A session save or restore (`Handle::save_session`), on the engine thread: the memory
    /// side only.
    fn session_op(
        &self,
        model: &Model,
        cfg: &SchedConfig,
        cache: Option<&mut PrefixCache>,
        c: Control,
    ) -> Result<ControlDone, SessionOpError> {
        let refused = |m: String| SessionOpError::Refused(m);
        if let Control::Embed { inputs, pooling, normalize } = c {
            let rows = model.embed_batch(&inputs, pooling, normalize, cfg.prefill_chunk.max(EMBED_BATCH_TOKENS));
            return rows.map(ControlDone::Embedded).map_err(|e| refused(e.to_string()));
        }
        let Some(cache) = cache else { return Err(no_cache()) };
        match c {
            Control::Save { slot, scope } => {
                let last = self.inner.last.lock().unwrap_or_else(|e| e.into_inner()).get(slot).cloned();
                let Some((history, _)) = last.filter(|(h, s)| !h.is_empty() && *s == scope) else {
                    return Err(refused(format!("slot {slot} has served no cached request to save")));
                };
                let Some((tokens, state, cps)) = cache.best_for_in(scope, &history) else {
                    return Err(refused(format!("slot {slot}'s conversation is no longer in the prompt cache")));
                };
                let bytes = crate::session::encode(model, tokens, state, cps).map_err(|e| refused(e.to_string()))?;
                Ok(ControlDone::Saved(bytes, tokens.len()))
            }
            Control::Restore { path, bytes, scope } => {
                let s = crate::session::decode(&path, &bytes, model, cfg.n_ctx).map_err(|e| refused(e.to_string()))?;
                let evicted = cache.insert_in(scope, &s.tokens, &s.state, s.checkpoints);
                let c = &self.inner.counters;
                c.cache_evictions.fetch_add(evicted as u64, Ordering::Relaxed);
                c.cache_bytes.store(cache.bytes() as u64, Ordering::Relaxed);
                c.cache_entries.store(cache.len(), Ordering::Relaxed);
                if cache.best_for_in(scope, &s.tokens).is_none_or(|(t, _, _)| t.len() < s.tokens.len()) {
                    return Err(refused(format!("the session ({} tokens) does not fit --cache-ram", s.tokens.len())));
                }
                Ok(ControlDone::Restored(SessionInfo { tokens: s.tokens.len(), bytes: bytes.len() as u64 }))
            }
            // answered above, without the cache
            Control::Embed { .. } => Err(SessionOpError::Failed("an embedding reached the session operations".into())),
        }
    }

    /// End the slot's request with an engine error.
    fn fail(&self, slot: &mut Option<Slot<'_>>, message: String) -> usize {
        if let Some(s) = slot.take() {
            s.req.sink.send(Event::Error { index: s.req.index, kind: ErrorKind::Engine, message });
        }
        0
    }
}

fn no_cache() -> SessionOpError {
    SessionOpError::Refused("the prompt cache is off (--cache-ram 0, or llama.cpp numerics)".into())
}

/// A serving slot's plain state, its KV caches' room for the whole context taken at once: pages
/// the slot never writes cost no memory, and the buffers are never grown again (a grown
/// buffer's old one stays with the allocator, which RSS counts), as a restore from the prompt
/// cache copies into them (`SeqState::copy_from`).
fn slot_state(model: &Model, n_ctx: usize) -> SeqState {
    let mut s = model.new_state(n_ctx);
    s.reserve(n_ctx);
    s
}

/// Draws the next token of every slot of the step whose row needs no adjustment (no logit
/// bias, no constraint) over the pool, one slot per task: a stochastic draw over a large
/// vocabulary costs ~100-500 µs and a greedy one (two passes over the row) ~30-40 µs, and the
/// step's slots are independent. Each slot's sampler makes the same call on the same row as
/// `take_token` would, so its RNG and its tokens are the same. `drawn[i]` is None for the slots
/// left to `take_token` (adjusted rows, or a step with one such row: not worth a dispatch).
fn presample(slots: &mut [Option<Slot<'_>>], idx: &[(usize, usize)], logits: &[f32], vocab: usize) -> Vec<Option<u32>> {
    let mut drawn = vec![None; idx.len()];
    struct Job<'a> {
        sampler: &'a mut Sampler,
        history: &'a [u32],
        row: &'a [f32],
        out: &'a mut Option<u32>,
    }
    let mut jobs: Vec<Job<'_>> = Vec::new();
    let mut rest = &mut slots[..];
    let mut base = 0;
    for (&(si, i), out) in idx.iter().zip(drawn.iter_mut()) {
        // idx ascends: split the slots so that each job borrows its own slot.
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(si - base);
        let (slot, after) = tail.split_first_mut().expect("si is a slot index");
        rest = after;
        base = si + 1;
        let Some(s) = slot else { continue };
        if !s.req.logit_bias.is_empty() || s.req.constraint.is_some() {
            continue;
        }
        jobs.push(Job { sampler: &mut s.sampler, history: &s.history, row: &logits[i * vocab..(i + 1) * vocab], out });
    }
    if jobs.len() > 1 {
        pool().for_rows_mut_dynamic(&mut jobs, 1, 1, |_, js| {
            for j in js {
                *j.out = Some(j.sampler.sample(j.row, j.history));
            }
        });
    }
    // (A single job is not worth a dispatch: it stays None and take_token draws it.)
    drop(jobs);
    drawn
}

/// `log softmax(logits)[id]` and the `top` most likely ids (ties: lower id first).
fn token_logprob(logits: &[f32], id: u32, top: usize) -> TokenLogprob {
    let max = logits.iter().copied().filter(|v| !v.is_nan()).fold(f32::NEG_INFINITY, f32::max);
    let z: f64 = logits.iter().filter(|v| !v.is_nan()).map(|&v| ((v - max) as f64).exp()).sum();
    let lz = max as f64 + z.ln();
    let lp = |v: f32| if v.is_nan() { f32::NEG_INFINITY } else { (v as f64 - lz) as f32 };
    let mut best: Vec<(u32, f32)> = Vec::new();
    if top > 0 {
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        let key = |i: &u32| {
            let v = logits[*i as usize];
            if v.is_nan() { f32::NEG_INFINITY } else { v }
        };
        let k = top.min(order.len());
        order.select_nth_unstable_by(k - 1, |a, b| key(b).total_cmp(&key(a)).then(a.cmp(b)));
        order.truncate(k);
        order.sort_unstable_by(|a, b| key(b).total_cmp(&key(a)).then(a.cmp(b)));
        // Masked tokens (-inf) are not alternatives.
        best = order.into_iter().map(|i| (i, lp(logits[i as usize]))).filter(|(_, l)| l.is_finite()).collect();
    }
    TokenLogprob { id, logprob: lp(logits[id as usize]), top: best }
}

enum Phase {
    /// `done` prompt positions are in the state.
    Prefill { done: usize },
    /// `next` was sampled and goes through the next decode batch.
    Decode { next: u32 },
}

struct Slot<'t> {
    req: Request,
    phase: Phase,
    dec: StreamDecoder<'t>,
    stops: StopMatcher,
    sampler: Sampler,
    /// Prompt and generated ids (the penalties' window).
    history: Vec<u32>,
    generated: usize,
    /// Admission order: the oldest prefilling slot gets the next chunk.
    order: u64,
    deadline: Option<Instant>,
    /// Speculative decoding's drafter, journal and counts.
    spec: Option<Speculator>,
    /// The prompt cache's bookkeeping (None: the request does not use the cache).
    fill: Option<Filling>,
    /// Prompt positions restored from the cache.
    cached: usize,
    /// Its index among the slots.
    slot: usize,
    /// The last step's final-normed hidden rows of this slot's entry, for a drafter that
    /// reads them (MTP); the buffer is kept from step to step.
    hidden: Vec<f32>,
}

impl<'t> Slot<'t> {
    fn new(
        req: Request,
        tok: &'t Tokenizer,
        t_submit: Instant,
        order: u64,
        timeout: Option<Duration>,
        spec: Option<Speculator>,
    ) -> Slot<'t> {
        let stops = StopMatcher::new(req.stops.clone());
        let sampler = Sampler::new(req.sampler.clone());
        let history = req.prompt.clone();
        Slot {
            req,
            phase: Phase::Prefill { done: 0 },
            dec: StreamDecoder::new(tok),
            stops,
            sampler,
            history,
            generated: 0,
            order,
            deadline: timeout.map(|t| t_submit + t),
            spec,
            fill: None,
            cached: 0,
            slot: 0,
            hidden: Vec::new(),
        }
    }

    /// The final event; `flush` gives back text the stop matcher and the decoder still hold.
    fn finish(&mut self, finish: Finish, flush: bool, state: StateReport) -> Event {
        let stop = self.stops.matched().map(str::to_string);
        let mut tail = String::new();
        if flush {
            let rest = self.dec.finish();
            let (t, _) = self.stops.push(&rest);
            tail.push_str(&t);
            let held = std::mem::replace(&mut self.stops, StopMatcher::new(Vec::new()));
            tail.push_str(&held.finish());
        }
        let st = self.spec.as_ref().map(|sp| sp.stats).unwrap_or_default();
        Event::Done {
            index: self.req.index,
            finish,
            stop,
            tail,
            n_prompt: self.req.prompt.len(),
            n_cached: self.cached,
            n_generated: self.generated,
            drafted: st.drafted,
            accepted: st.accepted,
            verifies: st.verifies,
            state,
        }
    }
}

/// Generated tokens per second over a sliding window of recent steps.
struct Rate {
    window: VecDeque<(Instant, usize)>,
}

impl Rate {
    const SPAN: Duration = Duration::from_secs(5);

    fn new() -> Rate {
        Rate { window: VecDeque::new() }
    }

    fn add(&mut self, n: usize) {
        let now = Instant::now();
        self.window.push_back((now, n));
        while self.window.front().is_some_and(|(t, _)| now.duration_since(*t) > Self::SPAN) {
            self.window.pop_front();
        }
    }

    fn idle(&mut self) {
        self.window.clear();
    }

    fn per_second(&self) -> f64 {
        let (Some(first), Some(last)) = (self.window.front(), self.window.back()) else { return 0.0 };
        let span = last.0.duration_since(first.0).as_secs_f64();
        if span <= 0.0 {
            return 0.0;
        }
        let n: usize = self.window.iter().skip(1).map(|(_, n)| n).sum();
        n as f64 / span
    }
}

/// Each speculating slot's share of `budget` draft positions this step, as (quotient,
/// remainder: that many of the slots take one more, the speculating slots' count), when a stream that does not speculate
/// shares the step (a decode slot without a drafter, or a prompt being prefilled); None: no
/// bound (no budget, or every stream in the step speculates).
fn draft_share(budget: Option<usize>, slots: &[Option<Slot<'_>>]) -> Option<(usize, usize, usize)> {
    let budget = budget?;
    let spec = slots.iter().flatten().filter(|s| matches!(s.phase, Phase::Decode { .. }) && s.spec.is_some()).count();
    let shared = slots.iter().flatten().any(|s| !matches!(s.phase, Phase::Decode { .. }) || s.spec.is_none());
    (spec > 0 && shared).then(|| (budget / spec, budget % spec, spec))
}

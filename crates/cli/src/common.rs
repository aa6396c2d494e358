//! What the model-running subcommands share: the flags every one takes (`Common`: MODEL,
//! threads, numerics, profiling), opening the model and its tokenizer, the `--profile` report,
//! the O(1) / StreamingLLM flags (`O1Args`, re-exported from `o1args`, which the `o1` feature
//! builds) with their plan and a polished model's served settings, and the one-line summary of
//! a sequence's state bytes.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use cortiq_engine::load::{Loaded, load};
use cortiq_engine::state::KvType;
use cortiq_formats::tokenizer::Tokenizer;

pub use crate::o1args::{O1Args, Served, describe_plan, note_served, served_o1};
use crate::pull;

/// The flags every model-running subcommand flattens in first.
#[derive(Args, Clone)]
pub struct Common {
    /// A .gguf file, an HF folder, a hub model hf:ORG/REPO[@REV][:QUANT], or a known model
    /// name (the last two pulled on first use).
    #[arg(short, long, value_name = "MODEL")]
    pub model: Option<String>,
    /// Worker threads (default: all cores).
    #[arg(short, long)]
    pub threads: Option<usize>,
    /// Whose arithmetic to follow: `fast` (the default: quantized weights times 8-bit
    /// activations with integer dot products, llama.cpp's arithmetic class in cortiq's kernel
    /// order), `exact` (f32 math on dequantized weights: transformers' numerics, reproducible to
    /// ~1e-5) or `llamacpp` (llama.cpp's bits: its kernel orders, f16 KV cache, its flash
    /// attention and ops, for reproducing its greedy text; keep --batch at 512 = its ubatch).
    #[arg(long, value_enum, default_value_t = NumericsArg::Fast)]
    pub numerics: NumericsArg,
    /// Keep the model's weights in RAM (mlock, as llama.cpp's --mlock): the file stays memory-
    /// mapped, but no page of it is dropped and read from disk again (a large mixture's
    /// rarely routed experts, under memory pressure or proactive reclaim). Reads the whole file
    /// at load.
    #[arg(long)]
    pub mlock: bool,
    /// Copy a mixture-of-experts model's experts into RAM (as llama.cpp's --no-mmap reads the
    /// model into memory) in the layout the fast decode kernels read best, instead of reading
    /// them from the memory-mapped file on AVX-512 CPUs (the other matrices are copied
    /// already): decode up to ~1.2x faster on some CPUs (an Intel Xeon; no faster on an AMD
    /// EPYC Zen 4), at the price of the experts' size in memory and a longer load. Fast
    /// numerics; a no-op for dense models and on CPUs without AVX-512 (copied there anyway). A .cmf's experts, stored in that layout (`cortiq convert`), are read from the
    /// map at the copy's speed: this moves the same bytes into RAM.
    #[arg(long)]
    pub no_mmap: bool,
    /// Print where the time went per op class (matvec/matmat per weight type, attention, norms,
    /// sampling, pool waits) when the command ends.
    #[arg(long)]
    pub profile: bool,
    /// How the KV cache stores keys and values: f32, f16 (half the memory; llama.cpp's
    /// default cache type) or q8 (8-bit blocks of 32 with a scale: ~28% of f32's bytes). Decode
    /// reads each type in place. Default: f16 (f32 with --numerics exact).
    #[arg(long, value_enum)]
    pub kv_type: Option<KvTypeArg>,
    /// The same as --kv-type f16.
    #[arg(long, conflicts_with = "kv_type")]
    pub kv_f16: bool,
    /// With --numerics llamacpp: the thread count of the llama.cpp run to reproduce (its decode
    /// attention past 256 positions depends on it; llama-cli's -t, 4 for the library default).
    #[arg(long, default_value_t = 4)]
    pub llamacpp_threads: usize,
    /// With --numerics llamacpp: whether the llama.cpp build to reproduce does f16 rows in
    /// AVX512-FP16 arithmetic (`auto`: as a native build on this CPU would; `on`/`off` to match a
    /// run made on another machine: head_dim >= 128 models' attention depends on it).
    #[arg(long, value_enum, default_value_t = Fp16Arg::Auto)]
    pub llamacpp_fp16: Fp16Arg,
}

impl Common {
    /// MODEL (`-m`): required by every command but `serve --models`.
    pub fn model_arg(&self) -> Result<&str> {
        self.model.as_deref().ok_or_else(|| {
            anyhow::anyhow!("no model given: -m MODEL (a .gguf file, an HF folder, hf:ORG/REPO or a known model name)")
        })
    }
}

/// `--llamacpp-fp16`: the f16 arithmetic of the llama.cpp build to reproduce.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fp16Arg {
    Auto,
    On,
    Off,
}

/// `--numerics`: which arithmetic the engine follows (see `Common::numerics`).
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NumericsArg {
    Fast,
    Exact,
    Llamacpp,
}

/// `--kv-type`: how attention layers store their KV cache.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KvTypeArg {
    F32,
    F16,
    Q8,
}

impl KvTypeArg {
    pub fn kind(self) -> KvType {
        match self {
            KvTypeArg::F32 => KvType::F32,
            KvTypeArg::F16 => KvType::F16,
            KvTypeArg::Q8 => KvType::Q8,
        }
    }
}

/// `--threads`: sizes the global pool once, before anything uses it (None: all cores).
pub fn set_threads(n: Option<usize>) -> Result<()> {
    if let Some(n) = n {
        if n == 0 {
            bail!("--threads must be at least 1");
        }
        cortiq_engine::par::init(n).map_err(anyhow::Error::msg).context("setting up the thread pool")?;
    }
    Ok(())
}

/// Sets the threads, resolves MODEL (pulling a known name), loads it and applies --numerics,
/// --llamacpp-threads and --kv-type.
pub fn open_model(c: &Common) -> Result<Loaded> {
    set_threads(c.threads)?;
    let path = pull::resolve_model(c.model_arg()?)?;
    if cortiq_engine::encoder::is_encoder(&path) {
        bail!(
            "{}: a BERT sentence encoder, which makes embeddings only: serve it (`cortiq serve -m {}`) and ask /v1/embeddings or /api/embed",
            path.display(),
            c.model_arg()?
        );
    }
    let t = Instant::now();
    let mut loaded = load(&path)?;
    use cortiq_engine::compat::Numerics;
    match c.numerics {
        NumericsArg::Fast => loaded.model.set_numerics(Numerics::Fast),
        NumericsArg::Exact => loaded.model.set_numerics(Numerics::Exact),
        NumericsArg::Llamacpp => {
            if loaded.model.cfg.attn_sinks {
                bail!(
                    "--numerics llamacpp: {} has attention sinks (gpt-oss), which run under fast or exact numerics only",
                    c.model_arg()?
                );
            }
            loaded.model.set_numerics(Numerics::LlamaCpp);
            loaded.model.set_llamacpp_threads(c.llamacpp_threads);
            match c.llamacpp_fp16 {
                Fp16Arg::Auto => {}
                Fp16Arg::On => loaded.model.set_llamacpp_fp16(true),
                Fp16Arg::Off => loaded.model.set_llamacpp_fp16(false),
            }
        }
    }
    let kv = if c.kv_f16 { Some(KvTypeArg::F16) } else { c.kv_type };
    if let Some(kv) = kv {
        loaded.model.set_kv_type(kv.kind()).context("--kv-type")?;
    }
    if c.no_mmap && loaded.model.cfg.moe.is_some() {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} expert matrices copied")
                .expect("valid template"),
        );
        loaded.model.copy_experts(&|done, total| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        });
        bar.finish_and_clear();
    }
    if !c.no_mmap && !c.mlock {
        let visible = cortiq_formats::page_cache_visible(&path);
        if visible {
            warn_small_pages(&loaded.model, &path);
        }
        populate_experts(&loaded.model, visible);
    }
    if c.mlock {
        loaded.model.lock_resident().map_err(|e| {
            anyhow::anyhow!(
                "--mlock: could not lock {} in memory ({e}); raise `ulimit -l` or run without --mlock",
                path.display()
            )
        })?;
    }
    tracing::info!("loaded {} ({}) in {:.2}s", path.display(), loaded.model.cfg.arch, t.elapsed().as_secs_f64());
    Ok(loaded)
}

/// 2 MiB windows of a mixture's mapped experts sampled by `warn_small_pages` and bench.
pub const PAGE_SAMPLE: usize = 64;

/// A warning when the page cache holds most of a mixture's mapped experts in small pages
/// (`cortiq_formats::PageShare`): decode then streams them more slowly, and dropping the file
/// from the cache once lets the next load read it back in 2 MiB pages.
fn warn_small_pages(model: &cortiq_engine::Model, path: &std::path::Path) {
    let Some(s) = model.expert_page_share(PAGE_SAMPLE) else { return };
    if s.windows >= PAGE_SAMPLE / 4 && 2 * s.huge < s.windows {
        tracing::warn!(
            "{}: the page cache holds this file's experts in small pages ({} of {} sampled 2 MiB windows in 2 MiB pages), \
             which decode reads more slowly; drop it from the cache once (`dd if={} iflag=nocache count=0`) and the next load reads it back in 2 MiB pages",
            path.display(),
            s.huge,
            s.windows,
            path.display()
        );
    }
}

/// Memory `populate_experts` leaves free beside the experts it reads in (the KV cache,
/// buffers, the rest of the system).
const POPULATE_HEADROOM: usize = 2 << 30;

/// Read a mixture's mapped experts in at load (`Model::populate_experts`), as llama.cpp's map
/// does, when the memory can hold what is not cached yet: decode then never waits on the disk
/// for an expert's first use, and a cold file comes in as 2 MiB pages. Skipped, with a line
/// saying so, when it would not fit; a kernel without `MADV_POPULATE_READ` only loses the head
/// start. `visible`: the page cache's state of the file can be told (`page_cache_visible`);
/// else all of the experts count as to be read.
fn populate_experts(model: &cortiq_engine::Model, visible: bool) {
    let missing = if visible { model.expert_missing_bytes() } else { model.expert_mapped_bytes() };
    if let Some(avail) = mem_available()
        && missing + POPULATE_HEADROOM > avail
    {
        tracing::info!(
            "experts left to be read as routed: {:.1} GB of them are not in memory and {:.1} GB is available",
            missing as f64 / 1e9,
            avail as f64 / 1e9
        );
        return;
    }
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {bytes}/{total_bytes} experts read in")
            .expect("valid template"),
    );
    let done = model.populate_experts(&|done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    });
    bar.finish_and_clear();
    if let Err(e) = done {
        tracing::debug!("experts not read in at load ({e}): decode reads them as routed");
    }
}

/// `MemAvailable` of /proc/meminfo in bytes (Linux).
fn mem_available() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: usize =
        info.lines().find_map(|l| l.strip_prefix("MemAvailable:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}

/// `--profile`: counters on from `start`; `finish` prints where the time went to stderr.
pub struct Profiler(Option<Instant>);

impl Profiler {
    pub fn start(c: &Common) -> Profiler {
        if !c.profile {
            return Profiler(None);
        }
        cortiq_engine::profile::enable(true);
        cortiq_engine::profile::reset();
        Profiler(Some(Instant::now()))
    }

    /// Print the report against the wall time since `start`, and stop counting.
    pub fn finish(self, what: &str) {
        if let Some(t0) = self.0 {
            self.finish_over(what, t0.elapsed().as_secs_f64());
        }
    }

    /// Print the report against `total_s` (the time of the model calls the caller timed, so
    /// set-up between them is not "unaccounted"), and stop counting: what runs after (the
    /// roofline's bandwidth probe) is not charged to the run.
    pub fn finish_over(self, what: &str, total_s: f64) {
        if self.0.is_some() {
            cortiq_engine::profile::enable(false);
            eprint!("{what} {}", cortiq_engine::profile::format_report(total_s * 1e3));
        }
    }
}

/// The loaded model's tokenizer (from the GGUF metadata or the HF folder).
pub fn open_tokenizer(l: &Loaded) -> Result<Tokenizer> {
    Ok(l.tokenizer()?)
}

/// A sequence's state bytes by kind, at `len` positions.
pub fn state_line(b: &cortiq_engine::mixers::StateBytes, len: usize) -> String {
    format!("{} bytes per sequence at {len} positions (KV {}, O(1) {}, recurrent {})", b.total(), b.kv, b.o1, b.recurrent)
}

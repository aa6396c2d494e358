//! `cortiq convert`: a GGUF file, an HF folder (or a .cmf) to cortiq's own .cmf, with a
//! progress bar. A thin shell over `cortiq_engine::convert`, which owns the type rules.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use cortiq_engine::convert::{ConvertOptions, QuantSpec, convert};
use cortiq_kernels::quant::QuantType;
use indicatif::{ProgressBar, ProgressStyle};

use crate::pull;

#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// The source: a .gguf file, an HF folder, a .cmf, or a known model name (pulled on first use).
    #[arg(short, long, value_name = "SRC")]
    pub model: String,
    /// The .cmf to write (written to a temporary file beside it, renamed when complete).
    #[arg(short, long, value_name = "OUT.cmf")]
    pub out: PathBuf,
    /// Stored type of the 2-D weights: keep (the source's bytes), f32, f16, bf16, or cortiq's
    /// quantized types (q8r, q4t, q1) where available. 1-D tensors (norms, biases) are always f32.
    #[arg(long, default_value = "keep", value_parser = parse_spec)]
    pub quant: QuantSpec,
    /// Stored type of the vocabulary matrices (token embedding and a separate output head);
    /// default: as --quant.
    #[arg(long, value_name = "TYPE", value_parser = parse_spec)]
    pub keep_embeddings_as: Option<QuantSpec>,
    /// Stored type of the source's f32 matrices (a hybrid's linear-core matrices, a polished
    /// model's trained ones), whatever --quant says of the others: `--quant keep --f32-as q8r`
    /// keeps the quantized weights' bytes and stores the f32 ones in 8 bits (an f32 matrix whose rows are not whole blocks of TYPE stays f32).
    /// With --linear-core: the fold's matrices stored so (q8r: ~8% faster decode of a ¾ hybrid).
    #[arg(long, value_name = "TYPE", value_parser = parse_type)]
    pub f32_as: Option<QuantType>,
    /// Overwrite OUT if it exists.
    #[arg(long)]
    pub force: bool,
    /// Store a mixture's experts row-major, as GGUF does. By default they are stored in the
    /// fast decode kernels' interleaved layout (read in place from the map, no copy at load;
    /// a file version-1 readers cannot open).
    #[arg(long)]
    pub plain_experts: bool,
    /// Fold attention layers onto a linear core (`vmf_phase`) and write the hybrid: the layers
    /// of --layers, from a GGUF or .cmf source (the stored weights are kept as they are).
    #[arg(long, value_name = "CORE")]
    pub linear_core: Option<String>,
    /// With --linear-core: `auto:F` (the fraction F of the layers whose bypass costs least on
    /// the calibration text; never layers 0-1) or a list `3,7,11`.
    #[arg(long, value_name = "auto:F|LIST", default_value = "auto:0.25")]
    pub layers: String,
    /// With --linear-core: phases per head (2·P kernel components).
    #[arg(long, default_value_t = 32)]
    pub nphase: usize,
    /// With --linear-core: calibration texts (paths or known text names).
    #[arg(long, num_args = 1.., default_value = "alice29.txt")]
    pub calib: Vec<String>,
    /// With --linear-core: tokens per calibration window [default: 512; with --window, 4 ×
    /// (sinks + window) to the next power of two if more: the fold needs many rows past the
    /// window]
    #[arg(long)]
    pub calib_ctx: Option<usize>,
    /// With --linear-core: calibration windows.
    #[arg(long, default_value_t = 4)]
    pub calib_windows: usize,
    /// With --linear-core, auto: weight of the copy probe (the calibration windows' first half
    /// repeated; its bypass cost ranks the layers that retrieve) beside the perplexity cost; 0
    /// ranks by perplexity alone.
    #[arg(long, default_value_t = 1.0)]
    pub recall_weight: f64,
    /// With --linear-core: seed of the random features.
    #[arg(long, default_value_t = 16)]
    pub seed: u64,
    /// With --linear-core: the operator's output norm (each head's core output over its rms,
    /// times a per-head gain the fold fits) — scale-free in the number of tokens written, as
    /// softmax's average is. Off: the plain operator.
    #[arg(long)]
    pub out_norm: bool,
    /// With --linear-core: the window option — each converted layer keeps softmax attention
    /// over its --sinks first and its last W positions, and the core stands for the keys that
    /// left the window (one more slot of the softmax; the core's output norm on). 0: the
    /// plain core.
    #[arg(long, default_value_t = 0, value_name = "W")]
    pub window: usize,
    /// With --linear-core --window: the first positions every query keeps exactly.
    #[arg(long, default_value_t = 0, value_name = "S")]
    pub sinks: usize,
    /// With --linear-core --window: `on` splits the budget of n·(S + W) exact positions (n
    /// converted layers) over the layers by what each loses to short sinks and window on the
    /// calibration text (sinks from S, 4S, 16S; window from W/4, W/2, W, 3W/2, 2W); `off`:
    /// every layer S + W. Off by default: on Qwen2.5-Coder-0.5B ½ the windows' split alone
    /// lowered perplexity at 1024 tokens (1.041× → 1.028×) and cost HumanEval 3.6 points
    /// (59.1% → 55.5%), short prompts losing the positions it moved to long ones (BENCHMARKS.md,
    /// 2026-12-07, "issue 52: the layer choice at the window"); with each layer's sinks chosen
    /// too, 1.041× → 1.029× and HumanEval 53.7% → 54.9%, within its noise ("issue 52: passkey
    /// at 8k and 32k")
    #[arg(long, default_value = "off", value_name = "ON", value_parser = ["on", "off"])]
    pub window_split: String,
}

fn parse_spec(s: &str) -> std::result::Result<QuantSpec, String> {
    QuantSpec::parse(s)
}

fn parse_type(s: &str) -> std::result::Result<QuantType, String> {
    match QuantSpec::parse(s)? {
        QuantSpec::To(t) => Ok(t),
        QuantSpec::Keep => Err("a stored type is needed here, not 'keep'".into()),
    }
}

pub fn cmd_convert(a: ConvertArgs) -> Result<()> {
    if a.out.exists() && !a.force {
        bail!("{} already exists (pass --force to overwrite)", a.out.display());
    }
    let src = pull::resolve_model(&a.model)?;
    if let Some(core) = &a.linear_core {
        if core != "vmf_phase" {
            bail!("--linear-core {core}: the linear cores are: vmf_phase");
        }
        if !matches!(a.quant, QuantSpec::Keep) || a.keep_embeddings_as.is_some() {
            bail!("--linear-core keeps the source's stored weights; convert with --quant separately");
        }
        let o = cortiq_convert::linearize::LinearizeOpts {
            layers: a.layers.clone(),
            nphase: a.nphase,
            calib: a.calib.iter().map(|n| pull::resolve_text(n)).collect::<Result<_>>()?,
            ctx: a.calib_ctx.unwrap_or(if a.window > 0 { (4 * (a.sinks + a.window)).next_power_of_two().max(512) } else { 512 }),
            windows: a.calib_windows,
            recall_weight: a.recall_weight,
            seed: a.seed,
            out_norm: a.out_norm,
            window: a.window,
            sinks: a.sinks,
            split: a.window_split == "on",
            force: a.force,
        };
        let Some(ty) = a.f32_as else {
            return Ok(cortiq_convert::linearize::linearize(&src, &a.out, &o)?);
        };
        // `--f32-as`: the fold's f32 matrices stored in TYPE, every other byte kept: the hybrid
        // folded into a temporary file beside OUT, then converted into OUT.
        let mut name = a.out.file_name().unwrap_or_default().to_os_string();
        name.push(".fold.tmp");
        let tmp = a.out.with_file_name(name);
        let r = cortiq_convert::linearize::linearize(&src, &tmp, &cortiq_convert::linearize::LinearizeOpts { force: true, ..o })
            .map_err(anyhow::Error::from)
            .and_then(|()| {
                let opts = ConvertOptions {
                    quant: QuantSpec::Keep,
                    embeddings: None,
                    f32_as: Some(ty),
                    force: a.force,
                    plain_experts: a.plain_experts,
                };
                convert(&tmp, &a.out, &opts, &|_, _, _| {}).with_context(|| format!("storing the fold's matrices as {ty}"))
            });
        let _ = std::fs::remove_file(&tmp);
        r?;
        eprintln!("stored the fold's f32 matrices as {ty} in {}", a.out.display());
        return Ok(());
    }
    if a.out_norm || a.window > 0 || a.sinks > 0 || a.window_split != "off" {
        bail!("--out-norm, --window, --sinks and --window-split are settings of --linear-core");
    }
    let opts = ConvertOptions {
        quant: a.quant,
        embeddings: a.keep_embeddings_as,
        f32_as: a.f32_as,
        force: a.force,
        plain_experts: a.plain_experts,
    };
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} tensors {msg}").expect("valid template"),
    );
    let t0 = Instant::now();
    let report = convert(&src, &a.out, &opts, &|done, total, name| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        bar.set_message(name.to_string());
    })
    .with_context(|| format!("converting {}", src.display()));
    bar.finish_and_clear();
    let report = report?;
    eprintln!(
        "wrote {} ({:.1} MB, {} tensors) in {:.1}s",
        report.out.display(),
        report.bytes as f64 / 1e6,
        report.tensors,
        t0.elapsed().as_secs_f64()
    );
    for (dtype, (n, bytes)) in &report.by_dtype {
        eprintln!("  {dtype:>5}: {n:>4} tensors, {:.1} MB", *bytes as f64 / 1e6);
    }
    if report.interleaved > 0 {
        eprintln!("  {} expert tensors in the interleaved layout (--plain-experts: row-major)", report.interleaved);
    }
    for f in &report.fallbacks {
        eprintln!("  note: {f}");
    }
    if !report.dropped.is_empty() {
        eprintln!("  left out {} source tensors the model does not use: {}", report.dropped.len(), report.dropped.join(", "));
    }
    Ok(())
}

//! `cortiq polish`: distillation that heals the O(1) conversion (issue 6). The student is the
//! model with its global attention layers served by the Nyström operator (`student`), the
//! teacher the same model in the exact engine (`teacher`); the train crate's [`Trainer`] steps
//! the converted layers' norm gains and FFNs on windows of the training texts, validating the
//! student/teacher ppl ratio on a held-out text, checkpointing atomically, and stopping on
//! Ctrl-C after the current step with a resumable checkpoint. The result is a .cmf (`export`)
//! whose header records the O(1) settings, so `run` / `ppl` serve it in O(1) mode by default.
//!
//! With `--o1-far linear` it fits the learned far field instead: stage 1 (`far`, each layer
//! alone against the exact attention output) or, on a model that carries one, stage 2
//! (`--stage distill`, here: the student serves every planned layer as the .cmf does and the far
//! fields train end to end with the same trainer and loss).
//!
//! ```text
//! cortiq polish -m MODEL -o OUT.cmf --train A.txt B.txt --valid C.txt [--steps N] [--ctx T]
//!     [--lr LR] [--kl-weight λ] [--o1-window W --o1-sinks S --o1-landmarks M --o1-ridge R]
//!     [--checkpoint-every K] [--resume]
//! cortiq polish -m FAR.cmf -o OUT.cmf --o1-far linear --stage distill [--far-lr LR] [--distill-ffn] ...
//! ```

pub mod export;
pub mod far;
pub mod heal;
pub mod student;
pub mod teacher;

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::error::{Context, Result, bail};
use clap::Args;
use cortiq_engine::Numerics;
use cortiq_engine::config::ModelConfig;
use cortiq_engine::load::load;
use cortiq_engine::o1::farfield::{DECAY_TENSOR, TENSORS};
use cortiq_engine::o1::nystrom::DEFAULT_RIDGE;
use cortiq_formats::cmf::O1Header;
use cortiq_kernels::quant::QuantType;
use cortiq_train::data::{TokenFile, Windows, split};
use cortiq_train::nystrom::{Far, O1Config};
use cortiq_train::optim::AdamW;
use cortiq_train::trainer::{Event, Params, RunEnd, RunOptions, TrainConfig, Trainer, ValidReport};
use cortiq_train::vmf_window::VmfLayer;
use indicatif::{ProgressBar, ProgressStyle};

use student::{GlobalAttn, StudentWeights};

#[derive(Args, Debug)]
pub struct PolishArgs {
    /// The model to polish: a .gguf file, a .cmf, or a known model name (pulled on first use).
    #[arg(short, long, value_name = "MODEL")]
    pub model: String,
    /// The polished .cmf to write.
    #[arg(short, long, value_name = "OUT.cmf")]
    pub out: PathBuf,
    /// Start the student from this model's weights instead of MODEL's (e.g. an earlier polish's
    /// output, to go on at another --ctx or O(1) setting); MODEL stays the teacher and the base
    /// that OUT is written from. Must have MODEL's architecture and shapes.
    #[arg(long, value_name = "MODEL")]
    pub init: Option<String>,
    /// Training text files (or known text names such as alice29.txt).
    #[arg(long, num_args = 1.., value_name = "FILES")]
    pub train: Vec<String>,
    /// The held-out validation text (never trained on).
    #[arg(long, value_name = "FILE")]
    pub valid: String,
    /// Optimizer steps (the end of the cosine schedule).
    #[arg(long, default_value_t = 100)]
    pub steps: u64,
    /// Tokens per training window T; the first T/2 are the sealed prompt, the rest is scored
    /// (as `ppl --o1`).
    #[arg(long, default_value_t = 1024)]
    pub ctx: usize,
    /// Windows per step.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Peak learning rate (AdamW).
    #[arg(long, default_value_t = 1e-4)]
    pub lr: f64,
    /// Final learning rate of the cosine [default: lr/10].
    #[arg(long)]
    pub min_lr: Option<f64>,
    /// Learning-rate multiplier for the norm gains (the FFN matrices take --lr itself).
    #[arg(long, value_name = "X", default_value_t = 1.0)]
    pub gain_lr_mult: f64,
    /// The vmf_phase heal's stage 2: learning-rate multiplier for the vmf_phase layers' own
    /// parameters (their copied v_proj/out_proj take a tenth of it), so that with
    /// `--distill-ffn` the norms and FFNs can move slower than the core (e.g. `--lr 1e-5
    /// --vmf-lr-mult 8`).
    #[arg(long, value_name = "X", default_value_t = 1.0)]
    pub vmf_lr_mult: f64,
    /// Linear warmup steps [default: steps/10, at most 50].
    #[arg(long)]
    pub warmup: Option<u64>,
    /// λ of the loss (1−λ)·CE + λ·KL(teacher‖student), in [0, 1].
    #[arg(long, default_value_t = 0.5)]
    pub kl_weight: f64,
    /// Global gradient-norm clip (0: off).
    #[arg(long, default_value_t = 1.0)]
    pub clip: f64,
    /// Seed of the window order.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// O(1) exact window W (as `run --o1`) [default: 64].
    #[arg(long, value_name = "W")]
    pub o1_window: Option<usize>,
    /// O(1) sink keys S <= W [default: 4].
    #[arg(long, value_name = "S")]
    pub o1_sinks: Option<usize>,
    /// O(1) landmark cap m, 4..=256 [default: 64].
    #[arg(long, value_name = "M")]
    pub o1_landmarks: Option<usize>,
    /// O(1) ridge factor [default: the engine's, 1e-3].
    #[arg(long, value_name = "R")]
    pub o1_ridge: Option<f64>,
    /// Checkpoint file [default: OUT.ckpt].
    #[arg(long, value_name = "PATH")]
    pub checkpoint: Option<PathBuf>,
    /// Write a checkpoint every K steps (and always at the end and on Ctrl-C).
    #[arg(long, value_name = "K", default_value_t = 10)]
    pub checkpoint_every: u64,
    /// Continue from the checkpoint (same model, texts, --ctx, --batch, --seed); the run goes on
    /// bit-identically to one that never stopped.
    #[arg(long)]
    pub resume: bool,
    /// Stop after N steps of this run, as Ctrl-C does (checkpoint written, no OUT yet):
    /// time-boxed runs on a shared machine; --resume continues.
    #[arg(long, value_name = "N")]
    pub stop_after: Option<u64>,
    /// Validate every N steps (and at the start and the end; 0: start and end only).
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub valid_every: u64,
    /// Validation windows of T tokens, spread over the validation text.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub valid_windows: usize,
    /// Stored type of the polished matrices: f16 or f32 (norm gains are always f32).
    #[arg(long, default_value = "f16", value_parser = ["f16", "f32"])]
    pub store: String,
    /// What is trained: `nystrom` (the converted layers' norm gains and FFNs under the Nyström
    /// operator, end to end) or `linear` (a learned far field beside sink+window of
    /// --o1-window/--o1-sinks, fitted per layer to the exact attention output with the model
    /// frozen; served by `--kv-window W --o1-far linear`) [default: nystrom].
    #[arg(long, value_name = "KIND", value_parser = ["nystrom", "linear"])]
    pub o1_far: Option<String>,
    /// --o1-far linear: features per KV head (state r·(head_dim + 3) values per KV head)
    /// [default: 16].
    #[arg(long, value_name = "R")]
    pub far_rank: Option<usize>,
    /// --o1-far linear: peak learning rate of the far fields (stage 1's per-layer fit: 1e-2;
    /// stage 2: 1e-3) [default: by stage].
    #[arg(long, value_name = "LR")]
    pub far_lr: Option<f64>,
    /// --o1-far linear: `transfer` (stage 1: each layer's far field fitted alone to the exact
    /// attention output, the model frozen) or `distill` (stage 2: MODEL carries a far field; the
    /// far fields of every planned layer train together end to end, KL against the exact model,
    /// each layer served as the .cmf serves it) [default: transfer].
    #[arg(long, value_name = "STAGE", value_parser = ["transfer", "distill"])]
    pub stage: Option<String>,
    /// --stage distill: the planned layers' norm gains and FFNs (and the final norm) train too.
    #[arg(long)]
    pub distill_ffn: bool,
    /// --o1-far linear: training windows of --ctx tokens (taken in order from the training texts)
    /// [default: 8].
    #[arg(long, value_name = "N")]
    pub far_windows: Option<usize>,
    /// --o1-far linear: split the planned layers' windows by how much each loses to a short
    /// window (measured on the training texts; the same total of positions as --o1-window on
    /// every layer), fit each layer's far field at its own window, and record the curves so
    /// that `--kv-window W` on the polished model splits any W the same way [default: on].
    #[arg(long, value_name = "ON", value_parser = ["on", "off"])]
    pub o1_split: Option<String>,
    /// --o1-far linear: the eviction rule the far field is fitted beside: `window` (sink+window,
    /// every position of the training windows), `score` (the first half of each window the
    /// exact prompt, then `--kv-evict score`'s slots, the keys they drop absorbed), as it will be
    /// served, or `auto` (fitted beside sink+window, then each layer served with score eviction
    /// where that loses less of its attention output on the held-out windows) [default: window].
    #[arg(long, value_name = "RULE", value_parser = ["window", "score", "auto"])]
    pub far_rule: Option<String>,
    /// --o1-far linear: each feature forgets far keys at its own learned rate (a key's weight
    /// e^{−δ·distance}; `off`: every far key weighs the same whatever its distance) [default: on].
    #[arg(long, value_name = "ON", value_parser = ["on", "off"])]
    pub far_decay: Option<String>,
    /// Heal a model folded onto vmf_phase (`convert --linear-core`): the original it was
    /// converted from, the teacher. MODEL is the hybrid; `--stage transfer` fits each converted
    /// layer to the teacher's attention output (--steps per layer, --batch windows per step,
    /// --lr; --far-windows training windows of --ctx tokens [default: 32]).
    #[arg(long, value_name = "ORIGINAL")]
    pub teacher: Option<String>,
    /// Overwrite OUT if it exists.
    #[arg(long)]
    pub force: bool,
    /// Worker threads (default: all cores).
    #[arg(short, long)]
    pub threads: Option<usize>,
}

impl PolishArgs {
    pub fn o1_window(&self) -> usize {
        self.o1_window.unwrap_or(64)
    }
    pub fn o1_sinks(&self) -> usize {
        self.o1_sinks.unwrap_or(4)
    }
    pub fn o1_landmarks(&self) -> usize {
        self.o1_landmarks.unwrap_or(64)
    }
    pub fn far_rank(&self) -> usize {
        self.far_rank.unwrap_or(16)
    }
    pub fn far_windows(&self) -> usize {
        self.far_windows.unwrap_or(8)
    }
}

/// A stop request (the CLI's first Ctrl-C): the trainer stops after the current step and
/// checkpoints.
pub static STOP: AtomicBool = AtomicBool::new(false);

/// The trained tensors under their GGUF names (what the .cmf replaces).
pub fn polished_tensors(cfg: &ModelConfig, p: &Params<f32>) -> HashMap<String, Vec<f32>> {
    let mut out = HashMap::new();
    for (il, g) in p.layers.iter().enumerate() {
        let Some(g) = g else { continue };
        let n = |s: &str| format!("blk.{il}.{s}");
        out.insert(n("attn_norm.weight"), g.attn_norm.clone());
        out.insert(n(cfg.ffn_norm), g.ffn_norm.clone());
        out.insert(n("ffn_gate.weight"), g.gate.clone());
        out.insert(n("ffn_up.weight"), g.up.clone());
        out.insert(n("ffn_down.weight"), g.down.clone());
        for (name, t) in [
            ("attn_q_norm.weight", &g.q_norm),
            ("attn_k_norm.weight", &g.k_norm),
            ("post_attention_norm.weight", &g.post_attn_norm),
            ("post_ffw_norm.weight", &g.post_ffn_norm),
        ] {
            if let Some(t) = t {
                out.insert(n(name), t.clone());
            }
        }
    }
    if !p.final_norm.is_empty() {
        out.insert(cfg.output_norm.to_string(), p.final_norm.clone());
    }
    // The heal's vmf_phase layers.
    for (il, v) in p.vmf.iter().enumerate() {
        match v {
            Some(VmfLayer::Plain(v)) => out.extend(heal::tensors_of(il, v)),
            Some(VmfLayer::Window(v)) => out.extend(heal::win_tensors_of(il, v)),
            None => {}
        }
    }
    // Stage 2's far fields (the layers that have one: rank > 0).
    for (il, f) in p.far.iter().enumerate() {
        let Some(f) = f.as_ref().filter(|f| !f.alpha.is_empty()) else { continue };
        for (suffix, v) in TENSORS.iter().zip(f.tensors()) {
            out.insert(format!("blk.{il}.{suffix}"), v.to_vec());
        }
        // A field without decay (stage 1 with --far-decay off, or a file from before it) has
        // no decay tensor to replace, and needs none: all δ stay 0.
        let decay = f.decay();
        if decay.iter().any(|&d| d != 0.0) {
            out.insert(format!("blk.{il}.{DECAY_TENSOR}"), decay);
        }
    }
    out
}

/// --init must be the teacher's model with other weights: same architecture and shapes.
fn check_same_shape(a: &ModelConfig, b: &ModelConfig) -> Result<()> {
    let fields = [
        ("layers", a.n_layers, b.n_layers),
        ("d_model", a.d_model, b.d_model),
        ("d_ff", a.d_ff, b.d_ff),
        ("vocab", a.vocab, b.vocab),
        ("head dim", a.head_dim, b.head_dim),
        ("heads", a.n_heads, b.n_heads),
        ("kv heads", a.n_kv_heads, b.n_kv_heads),
    ];
    if a.arch != b.arch {
        bail!("architecture {} differs from the teacher's {}", b.arch, a.arch);
    }
    for (what, x, y) in fields {
        if x != y {
            bail!("{what} {y} differs from the teacher's {x}");
        }
    }
    Ok(())
}

/// `n` windows spread evenly over `w` (all when there are fewer).
fn spread(w: Windows, n: usize) -> Windows {
    let k = w.len();
    if n == 0 || n >= k {
        return w;
    }
    let windows = (0..n).map(|i| w.windows[i * k / n].clone()).collect();
    Windows { ctx: w.ctx, windows }
}

fn valid_line(step: u64, r: &ValidReport) -> String {
    format!(
        "valid @ step {step}: student ppl {:.3}, teacher ppl {:.3}, ratio {:.4} (KL {:.4})",
        r.ppl, r.teacher_ppl, r.ppl_ratio, r.kl
    )
}

/// OUT is not overwritten without --force (both kinds of polish).
fn check_out(a: &PolishArgs) -> Result<()> {
    if a.out.exists() && !a.force {
        bail!("{} already exists (pass --force to overwrite)", a.out.display());
    }
    Ok(())
}

/// The thread pool of -t, shared by the engine (the teacher, the recordings) and the trainer
/// (they never run at once, so -t bounds both).
pub(crate) fn start_pool(threads: Option<usize>) -> Result<()> {
    if let Some(n) = threads {
        if n == 0 {
            bail!("--threads must be at least 1");
        }
        cortiq_engine::par::init(n).map_err(crate::error::ConvertError::Bad).context("setting up the thread pool")?;
    }
    cortiq_train::par::install(cortiq_engine::par::pool());
    Ok(())
}

/// The stage flags' combinations (`cmd_polish`), before anything loads.
fn check_stage_flags(a: &PolishArgs, heal: bool, linear: bool, distill: bool) -> Result<()> {
    if a.stage.is_some() && !linear && !heal {
        bail!("--stage: the stages are the learned far field's; give --o1-far linear");
    }
    if a.distill_ffn && !distill {
        bail!("--distill-ffn needs --stage distill");
    }
    if !(a.vmf_lr_mult.is_finite() && a.vmf_lr_mult > 0.0) {
        bail!("--vmf-lr-mult {}: must be a finite number > 0", a.vmf_lr_mult);
    }
    if a.vmf_lr_mult != 1.0 && !heal {
        bail!("--vmf-lr-mult: a setting of the vmf_phase heal (--teacher ... --stage distill)");
    }
    if distill {
        for (flag, given) in [
            ("--o1-window", a.o1_window.is_some()),
            ("--o1-sinks", a.o1_sinks.is_some()),
            ("--o1-landmarks", a.o1_landmarks.is_some()),
            ("--o1-ridge", a.o1_ridge.is_some()),
            ("--far-rank", a.far_rank.is_some()),
            ("--far-windows", a.far_windows.is_some()),
        ] {
            if given {
                bail!("{flag}: stage 2 serves MODEL's own settings (its windows, sinks, rank)");
            }
        }
    }
    if distill && a.init.is_some() {
        bail!("--init: stage 2 trains the far fields MODEL carries and writes OUT from it; give stage 1's output as -m");
    }
    Ok(())
}

/// The trainer's flags (`cmd_polish`), before anything loads: (the far fields' learning rate,
/// the skeleton's ridge, the O(1) settings, the prompt half tp).
fn trainer_flags(a: &PolishArgs, linear: bool, distill: bool) -> Result<(f64, f64, O1Config, usize)> {
    for (flag, given) in
        [("--o1-split", a.o1_split.is_some()), ("--far-rule", a.far_rule.is_some()), ("--far-decay", a.far_decay.is_some())]
    {
        match (given, distill) {
            (true, true) => bail!("{flag}: a stage-1 setting (--stage transfer); stage 2 serves each layer as MODEL records"),
            (true, false) => bail!("{flag} needs --o1-far linear"),
            _ => {}
        }
    }
    if a.far_lr.is_some() && !linear {
        bail!("--far-lr needs --o1-far linear");
    }
    let far_lr = a.far_lr.unwrap_or(1e-3);
    if !(far_lr.is_finite() && far_lr > 0.0) {
        bail!("--far-lr: must be a positive number, got {far_lr}");
    }
    let ridge = a.o1_ridge.unwrap_or(DEFAULT_RIDGE);
    let o1 = O1Config { window: a.o1_window(), sinks: a.o1_sinks(), landmarks: a.o1_landmarks(), ridge, far: Far::Skeleton };
    o1.validate()?;
    let tp = a.ctx / 2;
    if a.ctx >= 2 && !distill && !o1.seals_skeleton(tp) {
        bail!(
            "--ctx {}: its prompt half ({tp} tokens) is too short for a skeleton with --o1-window {} --o1-sinks {} (needs more than {})",
            a.ctx,
            a.o1_window(),
            a.o1_sinks(),
            a.o1_window() + a.o1_sinks() + 8
        );
    }
    Ok((far_lr, ridge, o1, tp))
}

/// The trainer's settings from the flags (`cmd_polish`).
fn train_config(a: &PolishArgs, far_lr: f64, heal: bool) -> TrainConfig {
    TrainConfig {
        ctx: a.ctx,
        batch: a.batch,
        steps: a.steps,
        warmup: a.warmup.unwrap_or((a.steps / 10).min(50)),
        lr: a.lr,
        min_lr: a.min_lr.unwrap_or(a.lr / 10.0),
        gain_lr_mult: a.gain_lr_mult,
        far_lr_mult: far_lr / a.lr,
        vmf_lr_mult: a.vmf_lr_mult,
        // As stage 1: the copied teacher projections at a tenth of the rate.
        vmf_copied_mult: 0.1,
        adamw: AdamW { lr: a.lr, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 },
        clip: a.clip,
        kl_weight: a.kl_weight,
        seed: a.seed,
        shuffle: true,
        // The heal has no sealed prompt: every position is scored.
        score_all: heal,
    }
}

/// Write OUT: the model with the polished tensors, its O(1) header (stage 1: the flags'
/// settings; stage 2: the model's own; the heal: none). Returns the bytes written.
#[allow(clippy::too_many_arguments)]
fn write_out(
    a: &PolishArgs,
    loaded: &cortiq_engine::load::Loaded,
    replaced: &std::collections::HashMap<String, Vec<f32>>,
    steps: u64,
    distill: bool,
    heal: bool,
    ridge: f64,
) -> Result<u64> {
    let store = if a.store == "f32" { QuantType::F32 } else { QuantType::F16 };
    let source_header = match &loaded.origin {
        cortiq_engine::load::Origin::Cmf(c) => c.header.o1.clone(),
        _ => None,
    };
    let header = match (distill, source_header) {
        _ if heal => None,
        // Stage 2 keeps the model's settings, rules and split.
        (true, Some(h)) => Some(h),
        _ => Some(O1Header {
            window: a.o1_window(),
            sinks: a.o1_sinks(),
            landmarks: a.o1_landmarks(),
            ridge,
            trained_ctx: a.ctx,
            steps,
            far_rank: None,
            split: None,
            far_rule: None,
            score_layers: None,
        }),
    };
    let store = if heal { QuantType::F32 } else { store };
    export::write_polished(loaded, &a.out, replaced, store, header, &[], a.force)
}

/// How the student serves its global layers (`cmd_polish`): the heal's, stage 1's O(1)
/// operator, or stage 2's far fields (the model's own settings, which must exist).
fn global_attn(
    a: &PolishArgs,
    served: Option<cortiq_engine::o1::Served>,
    distill: bool,
    heal: bool,
    o1: O1Config,
    tp: usize,
) -> Result<GlobalAttn> {
    Ok(match (distill, served) {
        _ if heal => GlobalAttn::Heal { train_ffn: a.distill_ffn },
        (false, _) => GlobalAttn::O1 { cfg: o1, tp },
        (true, Some(s)) if s.linear => {
            let (window, sinks) = (s.settings.window, s.settings.sinks);
            if a.ctx <= window + sinks {
                bail!("--ctx {}: no key ever leaves the model's window {window} + {sinks} sinks; give a longer --ctx", a.ctx);
            }
            GlobalAttn::Far { tp, window, sinks, score_all: s.score && !s.score_layers, train_ffn: a.distill_ffn }
        }
        (true, _) => bail!(
            "{}: carries no learned far field; stage 2 starts from stage 1's output (cortiq polish --o1-far linear ...)",
            a.init.as_deref().unwrap_or(&a.model)
        ),
    })
}

/// What the run trains, for its first line (`cmd_polish`).
fn describe(a: &PolishArgs, global: GlobalAttn, n_conv: usize, cfg: &cortiq_engine::config::ModelConfig, ridge: f64) -> String {
    match global {
        GlobalAttn::Far { .. } => "stage 2".to_string(),
        GlobalAttn::Heal { .. } => format!(
            "the vmf_phase heal, stage 2 (KL against {}){}",
            a.teacher.as_deref().unwrap_or_default(),
            if a.distill_ffn { format!(", with the norms and FFNs of {n_conv} layers") } else { String::new() }
        ),
        _ => format!(
            "{n_conv} of {} layers converted (W {}, S {}, m {}, ridge {ridge:e})",
            cfg.n_layers,
            a.o1_window(),
            a.o1_sinks(),
            a.o1_landmarks()
        ),
    }
}

/// The checkpoint file (--checkpoint, or OUT.ckpt), checked against --resume and --stop-after.
fn checkpoint_path(a: &PolishArgs) -> Result<PathBuf> {
    let ckpt = a.checkpoint.clone().unwrap_or_else(|| {
        let mut s = a.out.clone().into_os_string();
        s.push(".ckpt");
        PathBuf::from(s)
    });
    if a.stop_after == Some(0) {
        bail!("--stop-after: must be at least 1");
    }
    if a.resume && !ckpt.exists() {
        bail!("--resume: no checkpoint at {}", ckpt.display());
    }
    Ok(ckpt)
}

/// The data: tokenized whole files, packed into windows, split by file -> (training windows,
/// validation windows, training tokens).
fn windows(a: &PolishArgs, tok: &cortiq_formats::tokenizer::Tokenizer) -> Result<(Windows, Windows, usize)> {
    let read = |name: &str| -> Result<TokenFile> {
        let p = PathBuf::from(name);
        let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        Ok(TokenFile { name: p.display().to_string(), tokens: tok.encode_with(&text, false, false)? })
    };
    let train_files = a.train.iter().map(|f| read(f)).collect::<Result<Vec<_>>>()?;
    let valid_files = vec![read(&a.valid)?];
    let bos = if tok.add_bos() { tok.bos_id() } else { None };
    let (train_w, valid_w) = split(&train_files, &valid_files, a.ctx, bos)?;
    let n_train_tokens: usize = train_files.iter().map(|f| f.tokens.len()).sum();
    Ok((train_w, spread(valid_w, a.valid_windows), n_train_tokens))
}

/// --init: the student's starting weights, shaped as the teacher.
fn load_init(name: &str, cfg: &cortiq_engine::config::ModelConfig) -> Result<cortiq_engine::load::Loaded> {
    let ip = PathBuf::from(name);
    let l = load(&ip)?;
    check_same_shape(cfg, &l.model.cfg).with_context(|| format!("--init {}", ip.display()))?;
    Ok(l)
}

/// The run's progress bar (hidden off a terminal: the lines go to stderr instead).
fn progress(steps: u64, at: u64) -> ProgressBar {
    let bar = if std::io::stderr().is_terminal() { ProgressBar::new(steps) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:25} {pos}/{len} steps {msg}").expect("valid template"),
    );
    bar.set_position(at);
    bar
}

/// `cortiq polish`: `arm_stop` runs just before the training loop starts (the CLI installs its
/// Ctrl-C handler there, which raises [`STOP`]).
pub fn cmd_polish(a: PolishArgs, arm_stop: &dyn Fn()) -> Result<()> {
    // The vmf_phase heal: stage 1 on its own (heal.rs), stage 2 through the trainer below.
    let heal = a.teacher.is_some();
    if heal {
        heal::check_flags(&a)?;
        if a.stage.as_deref() != Some("distill") {
            return heal::cmd_polish_heal(&a, a.teacher.as_deref().expect("heal"));
        }
    }
    let linear = a.o1_far.as_deref() == Some("linear");
    let distill = a.stage.as_deref() == Some("distill");
    check_stage_flags(&a, heal, linear, distill)?;
    if linear && !distill {
        return far::cmd_polish_far(&a);
    }
    let (far_lr, ridge, o1, tp) = trainer_flags(&a, linear, distill)?;
    check_out(&a)?;
    let ckpt = checkpoint_path(&a)?;
    start_pool(a.threads)?;

    // The teacher: the model in exact numerics (the heal's: the original, --teacher).
    let path = PathBuf::from(&a.model);
    let t0 = Instant::now();
    let mut loaded = load(&path)?;
    loaded.model.set_numerics(Numerics::Exact);
    let heal_teacher = match &a.teacher {
        Some(t) => {
            heal::check_windowed(&loaded.model, &path, a.ctx)?;
            Some(heal::load_teacher(&loaded.model, &path, t)?.0)
        }
        None => None,
    };
    let tok = loaded.tokenizer()?;
    let model = heal_teacher.as_ref().map_or(&loaded.model, |l| &l.model);
    if a.ctx > model.cfg.n_ctx_train {
        bail!("--ctx {} exceeds the model's {} positions", a.ctx, model.cfg.n_ctx_train);
    }

    let (train_w, valid_w, n_train_tokens) = windows(&a, &tok)?;

    // The student: dequantized, global layers on the Nyström operator.
    let init = a.init.as_deref().map(|name| load_init(name, &model.cfg)).transpose()?;
    let start = init.as_ref().map_or(&loaded.model, |l| &l.model);
    let served = init.as_ref().unwrap_or(&loaded).served_o1();
    let global = global_attn(&a, served, distill, heal, o1, tp)?;
    let weights = StudentWeights::from_model(start, a.ctx, global)?;
    drop(init);
    let n_conv = weights.train.iter().filter(|&&t| t).count();
    if let GlobalAttn::Far { window, sinks, .. } = global {
        let n_far = weights.far.iter().flatten().filter(|f| !f.alpha.is_empty()).count();
        let ffn = if a.distill_ffn { format!(", with the norms and FFNs of {n_conv} layers") } else { String::new() };
        let (p, arch) = (path.display(), model.cfg.arch);
        eprintln!(
            "polish --stage distill: {p} ({arch}), {n_far} far fields train beside the model's rules (window {window} average, {sinks} sinks){ffn}"
        );
    }
    let what = describe(&a, global, n_conv, &model.cfg, ridge);
    eprintln!(
        "polish: {} ({}), {what}; {} training windows of {} tokens ({n_train_tokens} tokens), {} validation windows; loaded in {:.1}s",
        path.display(),
        model.cfg.arch,
        train_w.len(),
        a.ctx,
        valid_w.len(),
        t0.elapsed().as_secs_f64()
    );
    let cfg = train_config(&a, far_lr, heal);
    let mut trainer = Trainer::new(weights.student(), cfg, train_w)?;
    if a.resume {
        trainer.load_checkpoint(&ckpt)?;
        eprintln!("resumed {} at step {} of {}", ckpt.display(), trainer.step, a.steps);
    }

    let s0 = cfg.score_from();
    let mut teacher = |w: &[u32]| teacher::teacher_logits(model, w, s0);
    let mut vteacher = teacher::CachedTeacher::new(model, s0);
    let mut vt = |w: &[u32]| vteacher.logits(w);

    let bar = progress(a.steps, trainer.step);
    let say = |line: String| if bar.is_hidden() { eprintln!("{line}") } else { bar.println(line) };
    let mut first_ratio = None;
    if trainer.step == 0 {
        bar.set_message("validating the unpolished student");
        let t = Instant::now();
        let r = trainer.validate(&valid_w, &mut vt)?;
        say(format!("{} [{:.1}s]", valid_line(0, &r), t.elapsed().as_secs_f64()));
        first_ratio = Some(r.ppl_ratio);
    }

    let start_step = trainer.step;
    let opts = RunOptions { checkpoint: Some(ckpt.clone()), checkpoint_every: a.checkpoint_every, valid_every: a.valid_every };
    let valid_every = if a.valid_every == 0 { a.steps.max(1) } else { a.valid_every };
    let opts = RunOptions { valid_every, ..opts };
    arm_stop();
    let t_run = Instant::now();
    let mut t_step = Instant::now();
    let mut last_ratio: Option<f64> = None;
    let mut last_valid = None;
    let mut on_event = |e: &Event| match e {
        Event::Step(r) => {
            let tps = r.tokens as f64 / t_step.elapsed().as_secs_f64();
            let ratio = last_ratio.map_or(String::new(), |x| format!(" | valid ratio {x:.4}"));
            let msg = format!("loss {:.4} ce {:.4} kl {:.4} | {tps:.0} tok/s{ratio}", r.loss, r.ce, r.kl);
            if bar.is_hidden() {
                eprintln!("step {}/{}: {msg} | lr {:.2e} |g| {:.3}", r.step, a.steps, r.lr, r.grad_norm);
            }
            bar.set_position(r.step);
            bar.set_message(msg);
            if a.stop_after.is_some_and(|n| r.step - start_step >= n) {
                STOP.store(true, Ordering::SeqCst);
            }
            t_step = Instant::now();
        }
        Event::Valid { step, report } => {
            last_ratio = Some(report.ppl_ratio);
            last_valid = Some(*report);
            say(valid_line(*step, report));
            t_step = Instant::now();
        }
        Event::Checkpoint { step, path } => {
            if bar.is_hidden() {
                eprintln!("checkpoint: step {step} -> {}", path.display());
            }
            t_step = Instant::now();
        }
    };
    let end = trainer.run(&mut teacher, Some((&valid_w, &mut vt)), &opts, Some(&STOP), &mut on_event);
    bar.finish_and_clear();
    let end = end.with_context(|| format!("the last good checkpoint is {}", ckpt.display()))?;
    let secs = t_run.elapsed().as_secs_f64();
    if end == RunEnd::Stopped {
        eprintln!(
            "stopped at step {} of {} ({secs:.0}s); checkpoint {} — rerun the same command with --resume to continue",
            trainer.step,
            a.steps,
            ckpt.display()
        );
        return Ok(());
    }
    let replaced = polished_tensors(&model.cfg, &trainer.params);
    let bytes = write_out(&a, &loaded, &replaced, trainer.step, distill, heal, ridge)?;
    let before = first_ratio.map_or(String::new(), |r| format!("{r:.4} -> "));
    let after = last_valid.map_or(String::from("?"), |r| format!("{:.4}", r.ppl_ratio));
    eprintln!(
        "polished {} steps in {secs:.0}s ({:.0} tok/s); validation ppl ratio {before}{after}; wrote {} ({:.1} MB, {} tensors polished)",
        trainer.step,
        ((trainer.step - start_step) as usize * a.batch * a.ctx) as f64 / secs.max(1e-9),
        a.out.display(),
        bytes as f64 / 1e6,
        replaced.len()
    );
    Ok(())
}

/// Up to `max` windows of t tokens (BOS first where the model adds one), in order, from the
/// text files (the flags' names, which the CLI resolved to paths).
pub(crate) fn text_windows(
    tok: &cortiq_formats::tokenizer::Tokenizer,
    names: &[String],
    bos: Option<u32>,
    t: usize,
    max: usize,
) -> Result<Vec<Vec<u32>>> {
    let files: Vec<PathBuf> = names.iter().map(PathBuf::from).collect();
    Ok(crate::calib::text_windows(tok, &files, bos, t, max)?)
}

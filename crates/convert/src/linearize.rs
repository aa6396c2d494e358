//! `cortiq convert --linear-core vmf_phase`: fold chosen softmax-attention layers of a dense
//! model onto cortiq's vmf_phase core (issue 16) and write the hybrid .cmf. The heal
//! (`cortiq polish`) restores what the fold loses.
//!
//! 1. **Layers.** `--layers 3,7,11` as given, or `auto:F`: the fraction F of the attention
//!    layers whose bypass (the layer's attention output dropped) costs least: the rise in mean
//!    NLL per token on the calibration text, plus `--recall-weight` × the rise on a copy probe
//!    (the first half of each calibration window repeated: the NLL of the repeat measures the
//!    layers that retrieve — induction / copy heads — which a linear core's fixed state cannot
//!    stand in for, and which perplexity alone ranks as cheap). Layers 0 and 1 are never chosen
//!    by auto (the literature's "first layers stay softmax": bypassing them is catastrophic on
//!    every model measured).
//! 2. **Fold**, per converted layer, from the layer's own inputs on the calibration windows
//!    (the exact model teacher-forced):
//!    - phases: random-Fourier features of the pre-RoPE queries and keys. Per KV group g an
//!      orthogonal random Ω_g [P, head_dim] (Performer's ORF: Gram-Schmidt blocks, rows scaled
//!      to χ_d norms), θq_h = σ_g·d^{−1/4}·Ω_g(W_q,h x + b_q,h), θk_g likewise from W_k,g: then
//!      (1/P)Σ_j cos(θq_j − θk_j) → exp(−σ²|q − k|²/(2√d)), the Gaussian kernel behind softmax
//!      (σ < 1 a softer one). The q/k biases become phase biases.
//!    - one state per KV group (queries of the group read it: the state is n_kv × 2P × d_v,
//!      not per query head), v_proj = W_v copied;
//!    - the bandwidth σ_g and one decay half-life H_g per group (every component of the group:
//!      λ = 2^(−1/H)) by a grid search that minimises the group's relative error against the
//!      teacher's attention output, each head's output scaled by its least-squares factor
//!      (folded into out_proj's columns of that head: the plain core has no normaliser);
//!    - a value bias b_v (Qwen2) is not the core's: softmax passes it through unchanged, so
//!      the fit is against the output minus b_v and out_proj·b_v is the output bias;
//!    - a 4-tap conv at the identity, the write gate at a constant κ = ½ (weight 0, bias 0),
//!      phase mass 0;
//!    - with `--out-norm` the operator's output norm (each head's output over its rms, times a
//!      gain): the grid search fits the normed output, and each head's least-squares scale is
//!      its gain instead of a factor on out_proj.
//!
//!    Per layer the fold prints its relative squared error and cosine to the teacher.
//! 3. **Write**: the source's tensors byte for byte, minus the converted layers' attention
//!    tensors, plus their vmf tensors (f32), and the plan in the metadata (`vmf_phase` in an
//!    embedded config.json, `cortiq.vmf_phase.*` keys in GGUF metadata).
//!
//! With `--window W --sinks S` (the window option) a converted layer keeps its attention
//! tensors and softmax over S sinks and the last W positions; auto ranks the layers by what
//! sink+window alone costs instead of the bypass, and the fold is `linearize_window`'s (the
//! core and the slot fitted to the keys that left the window).
//!
//! Hand-written: the fold is the product's own method; the search is a few hundred small core
//! evaluations (the training crate's f32 core).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::error::{Context, ConvertError, Result, bail};
use cortiq_engine::config::MixerKind;
use cortiq_engine::load::{Loaded, Origin, load};
use cortiq_engine::mixers::Mixer;
use cortiq_engine::mixers::attention::Attention;
use cortiq_engine::mixers::identity::Identity;
use cortiq_engine::mixers::vmf::{VmfConfig, VmfPlan};
use cortiq_engine::{Logits, Model};
use cortiq_formats::cmf::{self, CmfHeader, CmfWriter, Metadata, PlannedTensor, SourceInfo, TypedKv};
use cortiq_formats::gguf::{MetaValue, TensorInfo};
use cortiq_kernels::quant::QuantType;
use cortiq_train::vmf::{CoreCheckpoints, CoreShape, core_forward, phase_forward};

use crate::linearize_window::WinRec;
use crate::window_split::Span;
use indicatif::{ProgressBar, ProgressStyle};

/// Bandwidths σ tried per KV group.
pub(crate) const SIGMAS: [f32; 8] = [0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0];
/// Decay half-lives (tokens) tried per KV group.
pub(crate) const HALF_LIVES: [f32; 7] = [2.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0];
/// Taps of the identity-initialised conv.
pub(crate) const CONV: usize = 4;

/// What `convert --linear-core vmf_phase` was asked for.
pub struct LinearizeOpts {
    /// "auto:F" or a comma-separated list of layer indices.
    pub layers: String,
    pub nphase: usize,
    /// Calibration text files.
    pub calib: Vec<PathBuf>,
    /// Tokens per calibration window, and windows.
    pub ctx: usize,
    pub windows: usize,
    /// Weight of the copy probe's cost in the auto choice (0: perplexity only).
    pub recall_weight: f64,
    pub seed: u64,
    /// The operator's output norm (per head g ⊙ o / rms(o)): the fold sets each head's gain
    /// to its least-squares scale instead of scaling out_proj.
    pub out_norm: bool,
    /// The window option (`linearize_window`): sinks + window exact positions per converted
    /// layer, the core for the keys that left; window 0: the plain core.
    pub window: usize,
    pub sinks: usize,
    /// With a window: split the budget of n·(sinks + window) exact positions over the n layers
    /// by what each loses to short sinks and window (`window_split`); off: every layer
    /// `sinks` + `window`.
    pub split: bool,
    pub force: bool,
}

/// The layer choice.
enum Choice {
    Auto(f64),
    List(Vec<usize>),
}

fn parse_layers(s: &str) -> Result<Choice> {
    if let Some(f) = s.strip_prefix("auto:") {
        let f: f64 = f.parse().map_err(|_| ConvertError::Bad(format!("--layers {s}: auto:F needs a fraction F in (0, 1]")))?;
        if !(f > 0.0 && f <= 1.0) {
            bail!("--layers {s}: auto:F needs a fraction F in (0, 1]");
        }
        return Ok(Choice::Auto(f));
    }
    let v: Result<Vec<usize>, _> = s.split(',').map(|x| x.trim().parse::<usize>()).collect();
    match v {
        Ok(v) if !v.is_empty() => Ok(Choice::List(v)),
        _ => bail!("--layers {s}: expected auto:F or a comma-separated list of layer indices"),
    }
}

pub fn linearize(src: &Path, out: &Path, o: &LinearizeOpts) -> Result<()> {
    if out.exists() && !o.force {
        bail!("{} already exists (pass --force to overwrite)", out.display());
    }
    if !(1..=256).contains(&o.nphase) {
        bail!("--nphase: must be in 1..=256, got {}", o.nphase);
    }
    if o.ctx < 16 || o.windows == 0 {
        bail!("--calib-ctx must be at least 16 and --calib-windows at least 1");
    }
    if o.window == 0 && o.sinks > 0 {
        bail!("--sinks {}: a setting of --window (the window option)", o.sinks);
    }
    if o.window > 0 && o.sinks + o.window + 16 > o.ctx {
        bail!(
            "--window {} --sinks {}: the calibration windows (--calib-ctx {}) must reach at least 16 positions past them",
            o.window,
            o.sinks,
            o.ctx
        );
    }
    if !(o.recall_weight >= 0.0 && o.recall_weight.is_finite()) {
        bail!("--recall-weight: must be a finite number >= 0, got {}", o.recall_weight);
    }
    let choice = parse_layers(&o.layers)?;
    let mut loaded = load(src).with_context(|| format!("loading {}", src.display()))?;
    if let Origin::Hf { dir, .. } = &loaded.origin {
        bail!(
            "--linear-core writes from a GGUF or .cmf source; convert the folder first: cortiq convert -m {} -o MODEL.cmf",
            dir.display()
        );
    }
    let cfg = loaded.model.cfg.clone();
    if cfg.qk_norm || cfg.attn_gate {
        bail!("--linear-core: models with per-head q/k norms or gated attention are not folded yet (this is {})", cfg.arch);
    }
    let attn: Vec<usize> = (0..cfg.n_layers).filter(|&il| cfg.layers[il].mixer == MixerKind::Attention).collect();
    if attn.len() != cfg.n_layers {
        bail!("--linear-core: {} is not a dense model (every layer softmax attention)", src.display());
    }
    // An explicit list is checked before the calibration runs (a bad flag is one line).
    let listed = match &choice {
        Choice::List(v) => {
            if let Some(&il) = v.iter().find(|&&il| il >= cfg.n_layers) {
                bail!("--layers: layer {il} does not exist (the model has {} layers)", cfg.n_layers);
            }
            let mut s = v.clone();
            s.sort_unstable();
            s.dedup();
            if s.len() != v.len() {
                bail!("--layers: a layer is named twice");
            }
            Some(s)
        }
        Choice::Auto(_) => None,
    };
    let tok = loaded.tokenizer()?;
    let bos = if tok.add_bos() { tok.bos_id() } else { None };
    let windows = crate::calib::text_windows(&tok, &o.calib, bos, o.ctx, o.windows)?;
    if windows.is_empty() {
        bail!(
            "--calib {}: fewer than {} tokens of text",
            o.calib.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" "),
            o.ctx
        );
    }
    eprintln!(
        "calibration: {} windows of {} tokens from {}",
        windows.len(),
        o.ctx,
        o.calib.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    );
    let t0 = Instant::now();
    let layers = match (listed, choice) {
        (Some(v), _) => v,
        (None, Choice::Auto(f)) => {
            auto_layers(&mut loaded.model, &windows, bos.is_some(), f, o.recall_weight, &|m: &Model, il: usize| {
                // The window option's layers keep sink+window: rank by what losing the rest costs.
                let a: Option<&Attention> = m.layers[il].mixer.downcast_ref();
                match a {
                    Some(a) if o.window > 0 => {
                        crate::linearize_window::sink_window_mixer(&window_config(&m.cfg, o), &a.w, m.cfg.layers[il].rope)
                    }
                    // The attention bypassed (output zero), for the auto choice.
                    _ => Box::new(Identity),
                }
            })?
        }
        (None, Choice::List(_)) => unreachable!("a list is checked above"),
    };
    eprintln!("converting layers {layers:?}");
    let model = &loaded.model;
    let (d, q) = (cfg.d_model, cfg.n_heads * cfg.head_dim);
    let rec = record(model, &layers, &windows, ("attn_norm", d), ("attn_out", q))?;
    let vc = window_config(&cfg, o);
    let qkv = if o.window > 0 {
        let kv = cfg.n_kv_heads * cfg.head_dim;
        let qk = record(model, &layers, &windows, ("q", q), ("k", kv))?;
        let v = record(model, &layers, &windows, ("v", kv), ("attn_out", q))?;
        Some((qk, v))
    } else {
        None
    };
    let win_recs = |il: usize| -> Vec<WinRec<'_>> {
        let Some((qk, v)) = &qkv else { return Vec::new() };
        rec[&il].iter().zip(&qk[&il]).zip(&v[&il]).map(|(((x, y), (q, k)), (v, _))| WinRec { x, q, k, v, y }).collect()
    };
    let spans = if o.window > 0 && o.split { split_windows(&cfg, o, &layers, &win_recs) } else { Vec::new() };
    let windows = spans.iter().map(|c| c.window).collect();
    // (each layer's sinks written only where one differs from --sinks: a file as before otherwise)
    let layer_sinks = if spans.iter().any(|c| c.sinks != o.sinks) { spans.iter().map(|c| c.sinks).collect() } else { Vec::new() };
    let plan = VmfPlan { layers: layers.clone(), cfg: vc, windows, layer_sinks };
    let mut added: Vec<(String, Vec<u64>, Vec<f32>)> = Vec::new();
    let mut removed: HashSet<String> = HashSet::new();
    for (i, &il) in layers.iter().enumerate() {
        let a: &Attention = model.layers[il].mixer.downcast_ref().context("a dense layer's mixer is attention")?;
        if qkv.is_some() {
            let recs = win_recs(il);
            let seed = o.seed.wrapping_add(il as u64);
            let lc = plan.layer_config(i);
            let (tensors, report) = crate::linearize_window::fold_window(&lc, &a.w, &recs, o.ctx, cfg.attn_scale as f64, seed);
            eprintln!("layer {il:>3}: {report}");
            added.extend(tensors.into_iter().map(|(n, shape, v)| (format!("blk.{il}.{n}"), shape, v)));
            continue;
        }
        let (x, y): (Vec<Vec<f32>>, Vec<Vec<f32>>) = rec[&il].iter().cloned().unzip();
        let (tensors, report) = fold(&vc, a, &x, &y, o.ctx, o.seed.wrapping_add(il as u64), o.out_norm);
        eprintln!("layer {il:>3}: {report}");
        for s in ["attn_q", "attn_k", "attn_v", "attn_output"] {
            for p in ["weight", "bias"] {
                removed.insert(format!("blk.{il}.{s}.{p}"));
            }
        }
        added.extend(tensors.into_iter().map(|(n, shape, v)| (format!("blk.{il}.{n}"), shape, v)));
    }
    let bytes = write_hybrid(&loaded, out, &removed, &added, &plan, o.force)?;
    eprintln!("wrote {} ({:.1} MB) in {:.1}s", out.display(), bytes as f64 / 1e6, t0.elapsed().as_secs_f64());
    Ok(())
}

/// The window option's split (`window_split`): each layer's sinks and window from the
/// candidates around (`o.sinks`, `o.window`), the budget n·(sinks + window); printed per layer
/// with sink+window's relative error at its span and at (`o.sinks`, `o.window`). Empty (every
/// layer at those) where the split does no better.
fn split_windows<'r>(
    cfg: &cortiq_engine::config::ModelConfig,
    o: &LinearizeOpts,
    layers: &[usize],
    win_recs: &dyn Fn(usize) -> Vec<WinRec<'r>>,
) -> Vec<Span> {
    let grid = crate::window_split::candidates(o.window, o.sinks, o.ctx);
    let hs =
        crate::window_split::Heads { n_heads: cfg.n_heads, n_kv: cfg.n_kv_heads, head_dim: cfg.head_dim, scale: cfg.attn_scale };
    let rel: Vec<Vec<f64>> = layers
        .iter()
        .map(|&il| {
            let (err, yy) = crate::window_split::sink_window_errors(hs, &win_recs(il), o.ctx, &grid);
            err.iter().map(|e| e / yy.max(1e-30)).collect()
        })
        .collect();
    let base = Span { sinks: o.sinks, window: o.window };
    let at_base = grid.iter().position(|&c| c == base).expect("the base span is a candidate");
    let uniform: f64 = rel.iter().map(|r| r[at_base]).sum();
    let costs: Vec<usize> = grid.iter().map(|c| c.cost()).collect();
    let Some(picked) = crate::window_split::allocate(&rel, &costs, layers.len() * base.cost()) else { return Vec::new() };
    let split: f64 = picked.iter().zip(&rel).map(|(&gi, r)| r[gi]).sum();
    let line: Vec<String> = layers
        .iter()
        .zip(&picked)
        .zip(&rel)
        .map(|((il, &gi), r)| {
            format!("{il}:{}+{} ({:.3}, at {}+{}: {:.3})", grid[gi].sinks, grid[gi].window, r[gi], o.sinks, o.window, r[at_base])
        })
        .collect();
    eprintln!(
        "window split (budget {} positions; sinks {:?}, windows {:?}): sink+window alone relative error {split:.3} summed, \
         {uniform:.3} at {}+{} on every layer; per layer (sinks+window) {}",
        layers.len() * base.cost(),
        grid.iter().map(|c| c.sinks).collect::<std::collections::BTreeSet<_>>(),
        grid.iter().map(|c| c.window).collect::<std::collections::BTreeSet<_>>(),
        o.sinks,
        o.window,
        line.join(", ")
    );
    if split < uniform { picked.iter().map(|&gi| grid[gi]).collect() } else { Vec::new() }
}

/// The converted layers' configuration: one state per KV group, the fold's options, and the
/// window option's sinks and window.
fn window_config(cfg: &cortiq_engine::config::ModelConfig, o: &LinearizeOpts) -> VmfConfig {
    VmfConfig {
        d_model: cfg.d_model,
        n_heads: cfg.n_heads,
        n_k_heads: cfg.n_kv_heads,
        nphase: o.nphase,
        d_v: cfg.head_dim,
        conv_kernel: CONV,
        k_gate: true,
        phase_bias: true,
        window: o.window,
        sinks: o.sinks,
    }
}

/// Mean NLL per predicted token at positions `from..` of each window (`from` ≥ 1).
fn mean_nll(model: &Model, windows: &[Vec<u32>], from: usize) -> Result<f64> {
    let (mut sum, mut n) = (0f64, 0usize);
    let v = model.cfg.vocab;
    for w in windows {
        let mut st = model.new_state(w.len());
        let logits = model.forward(w, &mut st, Logits::From(0))?;
        for (i, &next) in w.iter().enumerate().skip(from.max(1)) {
            sum += cortiq_engine::perplexity::nll(&logits[(i - 1) * v..i * v], next);
            n += 1;
        }
    }
    Ok(sum / n as f64)
}

/// The copy probe: each window's first half (after BOS when the model adds one) followed by
/// itself; the cost is measured on the repeat (positions `from..`).
fn copy_windows(windows: &[Vec<u32>], bos: bool) -> (Vec<Vec<u32>>, usize) {
    let skip = usize::from(bos);
    let half = (windows[0].len() - skip) / 2;
    let probe = windows
        .iter()
        .map(|w| {
            let body = &w[skip..skip + half];
            w[..skip].iter().chain(body).chain(body).copied().collect()
        })
        .collect();
    (probe, skip + half)
}

/// The fraction `f` of layers 2.. whose bypass costs least: the rise in mean NLL on the
/// windows plus `recall_weight` × the rise on the copy probe's repeat.
fn auto_layers(
    model: &mut Model,
    windows: &[Vec<u32>],
    bos: bool,
    f: f64,
    recall_weight: f64,
    stand_in: &dyn Fn(&Model, usize) -> Box<dyn Mixer>,
) -> Result<Vec<usize>> {
    let n_layers = model.cfg.n_layers;
    let n = ((f * n_layers as f64).round() as usize).max(1);
    let candidates: Vec<usize> = (2..n_layers).collect();
    if n > candidates.len() {
        bail!("--layers auto:{f}: {n} layers asked, only {} may be converted (layers 0 and 1 stay softmax)", candidates.len());
    }
    let (probe, from) = copy_windows(windows, bos);
    let recall = recall_weight > 0.0;
    let costs = |m: &Model| -> Result<(f64, f64)> {
        let text = mean_nll(m, windows, 1)?;
        let copy = if recall { mean_nll(m, &probe, from)? } else { 0.0 };
        Ok((text, copy))
    };
    let base = costs(model)?;
    let bar = ProgressBar::new(candidates.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} layers bypassed")
            .expect("valid template"),
    );
    let mut cost = Vec::with_capacity(candidates.len());
    for &il in &candidates {
        let sub = stand_in(model, il);
        let orig = std::mem::replace(&mut model.layers[il].mixer, sub);
        let r = costs(model);
        model.layers[il].mixer = orig;
        let (text, copy) = r?;
        cost.push((text - base.0, copy - base.1, il));
        bar.inc(1);
    }
    bar.finish_and_clear();
    let total = |c: &(f64, f64, usize)| c.0 + recall_weight * c.1;
    let mut sorted = cost.clone();
    sorted.sort_by(|a, b| total(a).total_cmp(&total(b)).then(a.2.cmp(&b.2)));
    let line: Vec<String> = cost.iter().map(|(t, _, il)| format!("{il}:{t:+.3}")).collect();
    eprintln!("bypass cost (mean NLL, base {:.4}; sink+window's with --window): {}", base.0, line.join(" "));
    if recall {
        let line: Vec<String> = cost.iter().map(|(_, c, il)| format!("{il}:{c:+.3}")).collect();
        eprintln!("bypass cost on the copy probe (mean NLL of the repeat, base {:.4}): {}", base.1, line.join(" "));
    }
    let mut chosen: Vec<usize> = sorted[..n].iter().map(|&(_, _, il)| il).collect();
    chosen.sort_unstable();
    Ok(chosen)
}

/// Per layer, per window: two traced tensors of the exact model (`a`, `b`: trace names, e.g.
/// "attn_norm" and "attn_out"), each `width_a` / `width_b` values per position.
pub(crate) type Recs = HashMap<usize, Vec<(Vec<f32>, Vec<f32>)>>;

/// Runs `model` over each window, recording traces `a` and `b` of every layer in `layers`.
pub fn record(model: &Model, layers: &[usize], windows: &[Vec<u32>], a: (&str, usize), b: (&str, usize)) -> Result<Recs> {
    let mut recs: Recs = layers.iter().map(|&il| (il, Vec::new())).collect();
    for w in windows {
        let mut cur: HashMap<usize, (Vec<f32>, Vec<f32>)> = layers.iter().map(|&il| (il, (Vec::new(), Vec::new()))).collect();
        let mut st = model.new_state(w.len());
        model.forward_traced(w, &mut st, Logits::None, &mut |name, il, x| {
            let Some(r) = cur.get_mut(&il) else { return };
            if name == a.0 {
                r.0.extend_from_slice(x);
            } else if name == b.0 {
                r.1.extend_from_slice(x);
            }
        })?;
        for (il, (x, y)) in cur {
            if x.len() != w.len() * a.1 || y.len() != w.len() * b.1 {
                bail!("layer {il}: recorded {} / {} values of {} / {} for {} positions", x.len(), y.len(), a.0, b.0, w.len());
            }
            recs.get_mut(&il).expect("recorded layer").push((x, y));
        }
    }
    Ok(recs)
}

/// xorshift64* and Box-Muller: the fold's random features, reproducible from the seed.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    pub(crate) fn normal(&mut self) -> f64 {
        (-2.0 * self.uniform().ln()).sqrt() * (std::f64::consts::TAU * self.uniform()).cos()
    }
}

/// Orthogonal random features Ω [p, d]: blocks of d orthonormal rows (Gram-Schmidt of Gaussian
/// rows), each row rescaled to the norm of an independent d-dimensional Gaussian vector.
fn orthogonal_features(rng: &mut Rng, p: usize, d: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(p * d);
    while out.len() < p * d {
        let mut block: Vec<Vec<f64>> = Vec::new();
        while block.len() < d && out.len() + block.len() * d < p * d {
            let mut r: Vec<f64> = (0..d).map(|_| rng.normal()).collect();
            for b in &block {
                let c: f64 = r.iter().zip(b).map(|(x, y)| x * y).sum();
                r.iter_mut().zip(b).for_each(|(x, y)| *x -= c * y);
            }
            let n = r.iter().map(|x| x * x).sum::<f64>().sqrt();
            r.iter_mut().for_each(|x| *x /= n);
            block.push(r);
        }
        for r in block {
            let chi = (0..d).map(|_| rng.normal().powi(2)).sum::<f64>().sqrt();
            out.extend(r.iter().map(|x| x * chi));
        }
    }
    out
}

/// A projection onto phases: Ω·W [P, d] and Ω·b [P] (unscaled).
pub(crate) type PhaseMap = (Vec<f64>, Vec<f64>);

/// KV group s's random features (module header, step 2): an orthogonal Ω [P, hd] drawn from
/// `rng`, and Ω·W, Ω·b for the group's key head and each of its g query heads. `q`, `k`: the
/// attention's (weight [rows, d], bias [rows]) as f32.
#[allow(clippy::too_many_arguments)]
pub(crate) fn group_features(
    rng: &mut Rng,
    q: (&[f32], &[f32]),
    k: (&[f32], &[f32]),
    s: usize,
    g: usize,
    p: usize,
    d: usize,
    hd: usize,
) -> (PhaseMap, Vec<PhaseMap>) {
    let om = orthogonal_features(rng, p, hd); // [P, hd]
    let proj = |w: &[f32], b: &[f32], head: usize| -> PhaseMap {
        let mut m = vec![0f64; p * d];
        let mut bb = vec![0f64; p];
        for j in 0..p {
            for e in 0..hd {
                let o = om[j * hd + e];
                let row = &w[(head * hd + e) * d..(head * hd + e + 1) * d];
                m[j * d..(j + 1) * d].iter_mut().zip(row).for_each(|(x, &y)| *x += o * y as f64);
                bb[j] += o * b[head * hd + e] as f64;
            }
        }
        (m, bb)
    };
    (proj(k.0, k.1, s), (0..g).map(|j| proj(q.0, q.1, s * g + j)).collect())
}

/// Unscaled phases θ0 = Ω(Wx + b) of one window x [T, d]: the queries' [T, g, P] and the key's
/// [T, P].
pub(crate) fn group_phases(kp: &PhaseMap, qp: &[PhaseMap], x: &[f32], t: usize, p: usize, d: usize) -> (Vec<f32>, Vec<f32>) {
    let phases = |m: &PhaseMap| -> Vec<f32> {
        let mut out = vec![0f32; t * p];
        for i in 0..t {
            for j in 0..p {
                let r = &m.0[j * d..(j + 1) * d];
                out[i * p + j] = (r.iter().zip(&x[i * d..(i + 1) * d]).map(|(a, &b)| a * b as f64).sum::<f64>() + m.1[j]) as f32;
            }
        }
        out
    };
    let g = qp.len();
    let mut tq = vec![0f32; t * g * p]; // [T, g, P]
    for (j, qpj) in qp.iter().enumerate() {
        let ph = phases(qpj);
        for i in 0..t {
            tq[(i * g + j) * p..(i * g + j + 1) * p].copy_from_slice(&ph[i * p..(i + 1) * p]);
        }
    }
    (tq, phases(kp))
}

/// Group s's phase maps scaled by `sc` into the θq / θk tensors (weights [heads·P, d], biases).
#[allow(clippy::too_many_arguments)]
pub(crate) fn put_phases(
    kp: &PhaseMap,
    qp: &[PhaseMap],
    sc: f64,
    s: usize,
    g: usize,
    p: usize,
    d: usize,
    thq: (&mut [f32], &mut [f32]),
    thk: (&mut [f32], &mut [f32]),
) {
    let (thq, thk) = (thq, thk);
    for (j, m) in std::iter::once(kp).chain(qp).enumerate() {
        let (dst, dst_b, head) = if j == 0 { (&mut *thk.0, &mut *thk.1, s) } else { (&mut *thq.0, &mut *thq.1, s * g + j - 1) };
        for r in 0..p {
            for e in 0..d {
                dst[(head * p + r) * d + e] = (m.0[r * d + e] * sc) as f32;
            }
            dst_b[head * p + r] = (m.1[r] * sc) as f32;
        }
    }
}

/// The fold of one layer (module header, step 2): its vmf tensors (GGUF suffix, [rows, cols]
/// shape, f32 values) and a one-line report.
#[allow(clippy::type_complexity)]
fn fold(
    c: &VmfConfig,
    a: &Attention,
    xs: &[Vec<f32>],
    ys: &[Vec<f32>],
    t: usize,
    seed: u64,
    out_norm: bool,
) -> (Vec<(String, Vec<u64>, Vec<f32>)>, String) {
    let (d, nh, nk, hd, p) = (c.d_model, c.n_heads, c.n_k_heads, c.d_v, c.nphase);
    let g = nh / nk;
    let f = 2 * p;
    let (wq, wk, wv, mut wo) = (a.w.wq.to_f32(), a.w.wk.to_f32(), a.w.wv.to_f32(), a.w.wo.to_f32());
    let bq = a.w.bq.clone().unwrap_or_else(|| vec![0.0; nh * hd]);
    let bk = a.w.bk.clone().unwrap_or_else(|| vec![0.0; nk * hd]);
    // A value bias reaches softmax's output unchanged (the weights sum to one): the core fits
    // the output without it, and out_proj·b_v becomes the layer's output bias.
    let bv = a.w.bv.clone().unwrap_or_else(|| vec![0.0; nk * hd]);
    let out_b: Option<Vec<f32>> = a.w.bv.as_ref().map(|_| {
        (0..d)
            .map(|r| (0..nh * hd).map(|c| wo[r * nh * hd + c] as f64 * bv[(c / hd / g) * hd + c % hd] as f64).sum::<f64>() as f32)
            .collect()
    });
    let mut rng = Rng(seed | 1);
    let inv4 = (hd as f64).powf(-0.25);
    let (mut thq, mut thq_b) = (vec![0f32; nh * p * d], vec![0f32; nh * p]);
    let (mut thk, mut thk_b) = (vec![0f32; nk * p * d], vec![0f32; nk * p]);
    let mut a_log = vec![0f32; nk * f];
    let mut o_norm = vec![0f32; if out_norm { nh * hd } else { 0 }];
    let mut chosen = Vec::with_capacity(nk);
    let (mut num_all, mut den_all) = (0f64, 0f64);
    for s in 0..nk {
        let (kp, qp) = group_features(&mut rng, (&wq, &bq), (&wk, &bk), s, g, p, d, hd);
        let per_window: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = xs
            .iter()
            .map(|x| {
                let (tq, tk) = group_phases(&kp, &qp, x, t, p, d);
                let mut v = vec![0f32; t * hd];
                for i in 0..t {
                    for e in 0..hd {
                        let row = &wv[(s * hd + e) * d..(s * hd + e + 1) * d];
                        v[i * hd + e] = row.iter().zip(&x[i * d..(i + 1) * d]).map(|(a, b)| a * b).sum();
                    }
                }
                (tq, tk, v)
            })
            .collect();
        // Grid search: (σ, H) -> per head least-squares scale, the group's residual.
        let sh = CoreShape { n_heads: g, n_states: 1, f, dv: hd };
        let mut best: Option<(f64, f32, f32, Vec<f64>, f64)> = None;
        for &sigma in &SIGMAS {
            let sc = (sigma as f64 * inv4) as f32;
            for &hl in &HALF_LIVES {
                let al = ((std::f64::consts::LN_2 / hl as f64).ln()) as f32;
                let a_row = vec![al; f];
                let (mut yo, mut oo, mut yy) = (vec![0f64; g], vec![0f64; g], vec![0f64; g]);
                for ((tq, tk, v), y) in per_window.iter().zip(ys) {
                    let s_q: Vec<f32> = tq.iter().map(|&x| x * sc).collect();
                    let s_k: Vec<f32> = tk.iter().map(|&x| x * sc).collect();
                    let (mut phq, mut phk) = (vec![0f32; 2 * s_q.len()], vec![0f32; 2 * s_k.len()]);
                    phase_forward(&s_q, &[0f32], g, p, &mut phq);
                    phase_forward(&s_k, &[0f32], 1, p, &mut phk);
                    let kap = vec![0.5f32; t];
                    let mut o = vec![0f32; t * g * hd];
                    core_forward(&sh, &phq, &phk, &kap, v, &a_row, &mut o, &mut CoreCheckpoints::default());
                    if out_norm {
                        o = cortiq_kernels::vmf::out_norm(&o, &vec![1.0; g * hd], hd);
                    }
                    for i in 0..t {
                        for j in 0..g {
                            let ov = &o[(i * g + j) * hd..(i * g + j + 1) * hd];
                            let yv = &y[(i * nh + s * g + j) * hd..(i * nh + s * g + j + 1) * hd];
                            for ((&a, &b), &bb) in ov.iter().zip(yv).zip(&bv[s * hd..(s + 1) * hd]) {
                                let b = b - bb;
                                yo[j] += a as f64 * b as f64;
                                oo[j] += a as f64 * a as f64;
                                yy[j] += b as f64 * b as f64;
                            }
                        }
                    }
                }
                let total: f64 = yy.iter().sum();
                let resid: f64 = (0..g).map(|j| yy[j] - if oo[j] > 0.0 { yo[j] * yo[j] / oo[j] } else { 0.0 }).sum();
                let scales: Vec<f64> = (0..g).map(|j| if oo[j] > 0.0 { yo[j] / oo[j] } else { 0.0 }).collect();
                let rel = resid / total.max(1e-30);
                if best.as_ref().is_none_or(|b| rel < b.0) {
                    best = Some((rel, sigma, hl, scales, total));
                }
            }
        }
        let (rel, sigma, hl, scales, total) = best.expect("a grid point");
        num_all += rel * total;
        den_all += total;
        chosen.push(format!("σ {sigma} H {hl}"));
        let sc = sigma as f64 * inv4;
        put_phases(&kp, &qp, sc, s, g, p, d, (&mut thq, &mut thq_b), (&mut thk, &mut thk_b));
        a_log[s * f..(s + 1) * f].fill(((std::f64::consts::LN_2 / hl as f64).ln()) as f32);
        // out_proj columns of the group's heads times their least-squares scale (with the
        // output norm: the head's gains).
        for (j, &scale) in scales.iter().enumerate() {
            let h = s * g + j;
            if out_norm {
                o_norm[h * hd..(h + 1) * hd].fill(scale as f32);
                continue;
            }
            for r in 0..d {
                wo[r * nh * hd + h * hd..r * nh * hd + (h + 1) * hd].iter_mut().for_each(|w| *w = (*w as f64 * scale) as f32);
            }
        }
    }
    let mut conv = vec![0f32; d * CONV];
    (0..d).for_each(|i| conv[i * CONV + CONV - 1] = 1.0);
    let rel = num_all / den_all.max(1e-30);
    // With each head's least-squares scale, |y − c·o|²/|y|² = 1 − cos²(y, o).
    let report =
        format!("fold relative error {rel:.3} (cosine {:.3}); per KV group {}", (1.0 - rel).max(0.0).sqrt(), chosen.join(", "));
    let t2 = |n: &str, r: usize, c: usize, v: Vec<f32>| (n.to_string(), vec![r as u64, c as u64], v);
    let t1 = |n: &str, v: Vec<f32>| (n.to_string(), vec![v.len() as u64], v);
    let mut tensors = vec![
        t2("vmf_thq.weight", nh * p, d, thq),
        t1("vmf_thq.bias", thq_b),
        t2("vmf_thk.weight", nk * p, d, thk),
        t1("vmf_thk.bias", thk_b),
        t2("vmf_v.weight", nk * hd, d, wv),
        t2("vmf_out.weight", d, nh * hd, wo),
        t1("vmf_a_log", a_log),
        t2("vmf_conv.weight", d, CONV, conv),
        t2("vmf_kgate.weight", nk, d, vec![0.0; nk * d]),
        t1("vmf_kgate.bias", vec![0.0; nk]),
        t1("vmf_mass", vec![0.0; nk]),
    ];
    tensors.extend(out_b.map(|b| t1("vmf_out.bias", b)));
    if out_norm {
        tensors.push(t1("vmf_onorm.weight", o_norm));
    }
    (tensors, report)
}

/// The source's tensors minus `removed`, plus `added` (f32), with the plan in the metadata.
fn write_hybrid(
    l: &Loaded,
    out: &Path,
    removed: &HashSet<String>,
    added: &[(String, Vec<u64>, Vec<f32>)],
    plan: &VmfPlan,
    force: bool,
) -> Result<u64> {
    let (tensors, arch, source, metadata, norm_offset): (Vec<&TensorInfo>, String, SourceInfo, Metadata, f32) = match &l.origin {
        Origin::Gguf(g) => (
            g.tensors.iter().collect(),
            g.architecture()?.to_string(),
            SourceInfo { kind: "gguf".into(), file: file_name(&g.path) },
            Metadata::Gguf { kv: TypedKv(g.metadata.clone()) },
            0.0,
        ),
        Origin::Cmf(c) => (
            c.tensors.iter().collect(),
            c.header.architecture.clone(),
            SourceInfo { kind: "cmf".into(), file: file_name(&c.path) },
            c.header.metadata.clone(),
            c.header.norm_offset_folded,
        ),
        Origin::Hf { .. } => unreachable!("refused in linearize"),
    };
    let metadata = match metadata {
        Metadata::Gguf { kv: TypedKv(mut kv) } => {
            let c = &plan.cfg;
            let u = |x: usize| MetaValue::U32(x as u32);
            kv.insert("cortiq.vmf_phase.layers".into(), MetaValue::Array(plan.layers.iter().map(|&x| u(x)).collect()));
            for (k, v) in [
                ("nphase", c.nphase),
                ("n_heads", c.n_heads),
                ("n_k_heads", c.n_k_heads),
                ("head_dim_v", c.d_v),
                ("conv_kernel", c.conv_kernel),
                ("k_gate", usize::from(c.k_gate)),
                ("phase_bias", usize::from(c.phase_bias)),
                ("window", c.window),
                ("sinks", c.sinks),
            ] {
                // (the window option's keys only when it is on: a plain hybrid's metadata as before)
                if c.window > 0 || !matches!(k, "window" | "sinks") {
                    kv.insert(format!("cortiq.vmf_phase.{k}"), u(v));
                }
            }
            for (k, v) in [("windows", &plan.windows), ("layer_sinks", &plan.layer_sinks)] {
                if !v.is_empty() {
                    kv.insert(format!("cortiq.vmf_phase.{k}"), MetaValue::Array(v.iter().map(|&x| u(x)).collect()));
                }
            }
            Metadata::Gguf { kv: TypedKv(kv) }
        }
        Metadata::Hf { mut files } => {
            let text = files.get("config.json").context("the .cmf embeds no config.json")?;
            let mut v: serde_json::Value = serde_json::from_str(text).context("the embedded config.json")?;
            v["vmf_phase"] = plan.to_json();
            files.insert("config.json".into(), serde_json::to_string_pretty(&v)?);
            Metadata::Hf { files }
        }
    };
    let kept: Vec<&TensorInfo> = tensors.into_iter().filter(|t| !removed.contains(&t.name)).collect();
    let mut planned: Vec<PlannedTensor> = kept
        .iter()
        .map(|t| PlannedTensor {
            // raw bytes are copied: an interleaved tensor stays so
            interleaved: t.interleaved,
            ..PlannedTensor::new(t.name.clone(), t.dtype, t.shape().iter().map(|&d| d as u64).collect())
        })
        .collect();
    for (name, shape, v) in added {
        if v.len() as u64 != shape.iter().product::<u64>() {
            bail!("vmf tensor '{name}': {} values for shape {shape:?}", v.len());
        }
        planned.push(PlannedTensor::new(name.clone(), QuantType::F32, shape.clone()));
    }
    let header = CmfHeader {
        format_version: cmf::FORMAT_VERSION,
        architecture: arch,
        source,
        quant: "keep (vmf_phase tensors f32)".into(),
        norm_offset_folded: norm_offset,
        metadata,
        o1: None,
        tensors: Vec::new(),
    };
    let mut w = CmfWriter::create(out, header, &planned, force)?;
    for t in &kept {
        let bytes = match &l.origin {
            Origin::Gguf(g) => g.tensor_data(t),
            Origin::Cmf(c) => c.tensor_data(t),
            Origin::Hf { .. } => unreachable!(),
        };
        w.write_data(bytes)?;
        w.end_tensor()?;
    }
    for (_, _, v) in added {
        let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        w.write_data(&b)?;
        w.end_tensor()?;
    }
    let bytes = w.finish()?;
    // Read back: a file this build cannot open is a bug, reported now.
    load(out).with_context(|| format!("reading back {}", out.display()))?;
    Ok(bytes)
}

fn file_name(p: &Path) -> String {
    p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::copy_windows;

    /// The probe repeats each window's first half after its BOS; the cost starts at the repeat.
    #[test]
    fn copy_probe_repeats_the_first_half() {
        let w: Vec<u32> = (0..9).collect(); // BOS 0, then 8 tokens
        let (p, from) = copy_windows(&[w.clone(), w.iter().map(|x| x + 100).collect()], true);
        assert_eq!(p[0], vec![0, 1, 2, 3, 4, 1, 2, 3, 4]);
        assert_eq!(p[1], vec![100, 101, 102, 103, 104, 101, 102, 103, 104]);
        assert_eq!(from, 5);
        let (p, from) = copy_windows(&[w], false);
        assert_eq!(p[0], vec![0, 1, 2, 3, 0, 1, 2, 3]);
        assert_eq!(from, 4);
    }
}

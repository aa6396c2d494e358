//! `cortiq polish --o1-far linear`: stage 1 of the learned far field (issue 15). The model runs
//! exact on windows of the training texts while every planned layer's post-RoPE q, k, v and
//! attention output are recorded; then each layer's feature maps are fitted alone, the model
//! frozen, to the exact attention output beside the eviction rule it will serve with
//! (--far-rule: sink+window, or score eviction's slots) of --o1-window/--o1-sinks; with
//! --o1-split on (the default) each layer at its own share of the windows' total
//! (`cortiq_train::farfield`). The result is the source model plus `blk.N.attn_far_*` (f32) in a
//! .cmf whose header records window, sinks and rank.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::time::Instant;

use crate::error::{Result, bail};
use cortiq_engine::Logits;
use cortiq_engine::Numerics;
use cortiq_engine::load::load;
use cortiq_engine::o1::O1Split;
use cortiq_engine::o1::farfield::{DECAY_TENSOR, MAX_RANK, TENSORS};
use cortiq_formats::cmf::O1Header;
use cortiq_train::budget::{CurveShape, CurveSums, window_sums};
use cortiq_train::farfield::{FarParams, FarShape, LayerSeq, fit_layer, init_params};
use indicatif::{ProgressBar, ProgressStyle};

use super::{PolishArgs, export};

/// A layer keeps its far field when the held-out error is below this share of its rule's alone.
const KEEP_BELOW: f64 = 0.95;

/// One planned layer's recordings over all windows: q, k, v, attention output (f32).
#[derive(Default)]
struct Rec {
    q: Vec<Vec<f32>>,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    y: Vec<Vec<f32>>,
}

/// The far-field flags (`cmd_polish_far`), before anything loads: the learning rate.
fn check_far_flags(a: &PolishArgs) -> Result<f64> {
    let (window, sinks, rank, t) = (a.o1_window(), a.o1_sinks(), a.far_rank(), a.ctx);
    if window == 0 {
        bail!("--o1-window: must be at least 1, got 0");
    }
    if sinks > window {
        bail!("--o1-sinks: {sinks} exceeds --o1-window {window}");
    }
    if !(1..=MAX_RANK).contains(&rank) {
        bail!("--far-rank: must be in 1..={MAX_RANK}, got {rank}");
    }
    if t <= window + sinks {
        bail!("--ctx {t}: no key ever leaves a window of {window} + {sinks} sinks; give a longer --ctx");
    }
    if a.far_windows() == 0 {
        bail!("--far-windows: must be at least 1");
    }
    let far_lr = a.far_lr.unwrap_or(1e-2);
    if !(far_lr.is_finite() && far_lr > 0.0) {
        bail!("--far-lr: must be a positive number, got {far_lr}");
    }
    Ok(far_lr)
}

pub fn cmd_polish_far(a: &PolishArgs) -> Result<()> {
    let (window, sinks, rank, t) = (a.o1_window(), a.o1_sinks(), a.far_rank(), a.ctx);
    let far_lr = check_far_flags(a)?;
    super::check_out(a)?;
    super::start_pool(a.threads)?;
    let path = std::path::PathBuf::from(&a.model);
    let mut loaded = load(&path)?;
    loaded.model.set_numerics(Numerics::Exact);
    let tok = loaded.tokenizer()?;
    let model = &loaded.model;
    let cfg = &model.cfg;
    if t > cfg.n_ctx_train {
        bail!("--ctx {t} exceeds the model's {} positions", cfg.n_ctx_train);
    }
    if cfg.attn_logit_softcap.is_some() {
        bail!("{}: attention logit soft-capping is not supported by the O(1) operator", cfg.arch);
    }
    let planned = model.o1_planned_layers();
    if planned.is_empty() {
        bail!("{}: no global softmax-attention layer for a far field", cfg.arch);
    }

    // Windows of t tokens, in order, from the training texts; the validation text (never
    // trained on) gives the held-out error of the report.
    let bos = if tok.add_bos() { tok.bos_id() } else { None };
    if a.train.iter().any(|n| n == &a.valid) {
        bail!("--valid {} is also a training text", a.valid);
    }
    let windows = super::text_windows(&tok, &a.train, bos, t, a.far_windows())?;
    if windows.is_empty() {
        bail!("--train: no window of {t} tokens in the training texts");
    }
    let n_tokens = windows.len() * t;
    let (nh, nkv, hd) = (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim);
    eprintln!(
        "polish --o1-far linear: {} ({}), {} planned layers, rank {rank}, window {window} + {sinks} sinks; {} windows of {t} tokens ({n_tokens} tokens)",
        path.display(),
        cfg.arch,
        planned.len(),
        windows.len()
    );

    // Record: the training windows, and two windows of the held-out text (four with
    // --far-rule auto) for the report and the choices made on them.
    let t0 = Instant::now();
    let mut recs = record(model, &planned, &windows, t)?;
    // `--far-rule auto` chooses each layer's rule on the held-out windows: twice as many.
    let auto = a.far_rule.as_deref() == Some("auto");
    let valid_windows = super::text_windows(&tok, std::slice::from_ref(&a.valid), bos, t, if auto { 4 } else { 2 })?;
    let mut vrecs = record(model, &planned, &valid_windows, t)?;
    eprintln!("recorded {} layers in {:.1}s", planned.len(), t0.elapsed().as_secs_f64());

    // The window split: each layer's curve on the training windows, then its share of the
    // same total.
    let split = (a.o1_split.as_deref() != Some("off")).then(|| {
        let t2 = Instant::now();
        let sp = window_split(&recs, &planned, t, nh, nkv, hd, sinks, cfg.attn_scale as f64);
        eprintln!("measured the window curves in {:.1}s", t2.elapsed().as_secs_f64());
        sp
    });
    let windows: HashMap<usize, usize> = match &split {
        Some(sp) => sp.windows(window).into_iter().collect(),
        None => planned.iter().map(|&il| (il, window)).collect(),
    };
    if split.is_some() {
        let list: Vec<String> = planned.iter().map(|il| format!("{il}:{}", windows[il])).collect();
        eprintln!("window split (layer:window, {window} each on average): {}", list.join(" "));
    }

    // Fit each layer.
    let score = a.far_rule.as_deref() == Some("score");
    let decay = a.far_decay.as_deref() != Some("off");
    let rule = if score { "score eviction" } else { "sink+window" };
    let s0 = FarShape { t, n_heads: nh, n_kv: nkv, hd, rank, sinks, window, scale: cfg.attn_scale as f64 };
    let bar = if std::io::stderr().is_terminal() { ProgressBar::new(planned.len() as u64) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:25} {pos}/{len} layers {msg}").expect("valid template"),
    );
    let say = |line: String| if bar.is_hidden() { eprintln!("{line}") } else { bar.println(line) };
    let run = FitRun { a, score, auto, decay, far_lr, rule, attn_scale: cfg.attn_scale as f64 };
    let t1 = Instant::now();
    let mut added = Vec::new();
    let (mut sw_sum, mut far_sum) = (0.0, 0.0);
    let mut kept = 0;
    let mut score_layers = Vec::new();
    for &il in &planned {
        let s = FarShape { window: windows[&il], ..s0 };
        if s.first_far() >= t {
            say(format!("layer {il}: window {} holds the whole --ctx {t}; no far field", s.window));
            bar.inc(1);
            continue;
        }
        let (r, vr) = (recs.remove(&il).expect("recorded"), vrecs.remove(&il).expect("recorded"));
        let f = fit_far_layer(&run, il, &s, r, vr, &bar, &say)?;
        if f.score {
            score_layers.push(il);
        }
        sw_sum += f.vsw;
        let Some(p) = f.params else {
            far_sum += f.vsw;
            bar.inc(1);
            continue;
        };
        far_sum += f.vkept;
        kept += 1;
        for (suffix, v) in TENSORS.iter().zip(p.tensors()) {
            added.push((format!("blk.{il}.{suffix}"), v.to_vec()));
        }
        if decay {
            added.push((format!("blk.{il}.{DECAY_TENSOR}"), p.decay()));
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    if kept == 0 {
        bail!("no layer's far field beat {rule} on the held-out windows; nothing written");
    }
    let secs = t1.elapsed().as_secs_f64();
    let header = O1Header {
        window,
        sinks,
        landmarks: 4,
        ridge: cortiq_engine::o1::nystrom::DEFAULT_RIDGE,
        trained_ctx: t,
        steps: a.steps,
        far_rank: Some(rank),
        far_rule: (score || !score_layers.is_empty()).then(|| "score".to_string()),
        score_layers: auto.then_some(score_layers).filter(|l| !l.is_empty()),
        split: split.map(|sp| cortiq_formats::cmf::O1SplitHeader { step: sp.step, layers: sp.layers, curves: sp.curves }),
    };
    let bytes = export::write_polished(
        &loaded,
        &a.out,
        &HashMap::new(),
        cortiq_kernels::quant::QuantType::F16,
        Some(header),
        &added,
        a.force,
    )?;
    eprintln!(
        "fitted {} layers, {kept} with a far field, in {secs:.0}s ({} steps each over {n_tokens} tokens; recording {:.0}s); held-out mse {:.1}% of {rule}'s (layer sum); wrote {} ({:.1} MB)",
        planned.len(),
        a.steps,
        t0.elapsed().as_secs_f64() - secs,
        100.0 * far_sum / sw_sum.max(f64::MIN_POSITIVE),
        a.out.display(),
        bytes as f64 / 1e6
    );
    Ok(())
}

/// The settings every layer's fit shares (`cmd_polish_far`).
struct FitRun<'a> {
    a: &'a PolishArgs,
    score: bool,
    auto: bool,
    decay: bool,
    far_lr: f64,
    rule: &'static str,
    attn_scale: f64,
}

/// What the fit of one layer's far field settled.
struct Fitted {
    /// The held-out error of the layer's rule alone, and with its far field (when kept).
    vsw: f64,
    vkept: f64,
    /// The far field, None where it did not beat the rule alone.
    params: Option<FarParams<f32>>,
    /// `--far-rule auto` chose score eviction for the layer.
    score: bool,
}

/// Fit layer `il`'s far field on its recordings `r` (held out: `vr`) beside its rule, report
/// it, and decide whether the layer keeps it (and, under auto, its rule).
fn fit_far_layer(
    run: &FitRun<'_>,
    il: usize,
    s: &FarShape,
    r: Rec,
    vr: Rec,
    bar: &ProgressBar,
    say: &dyn Fn(String),
) -> Result<Fitted> {
    let (a, score, auto, decay, far_lr, rule) = (run.a, run.score, run.auto, run.decay, run.far_lr, run.rule);
    let (t, nh, nkv, hd, sinks) = (s.t, s.n_heads, s.n_kv, s.hd, s.sinks);
    let s = *s;
    let mut chose_score = false;
    // A window under score eviction's schedule (`--far-rule score`, and auto's choice).
    let score_seq = |q: Vec<f32>, k: Vec<f32>, v: Vec<f32>, y: Vec<f32>| {
        let exits = score_exits(&q, &k, &v, t, t / 2, nh, nkv, hd, sinks, s.window, run.attn_scale);
        LayerSeq::with_exits(&s, exits, q, k, v, y)
    };
    // Each window under the rule the far field will serve beside.
    let seq = |q: Vec<f32>, k: Vec<f32>, v: Vec<f32>, y: Vec<f32>| match score {
        true => score_seq(q, k, v, y),
        false => LayerSeq::new(&s, q, k, v, y),
    };
    let data: Vec<LayerSeq<f32>> = r.q.into_iter().zip(r.k).zip(r.v).zip(r.y).map(|(((q, k), v), y)| seq(q, k, v, y)).collect();
    // --far-rule auto: the held-out windows under score eviction too.
    let held_score: Vec<LayerSeq<f32>> = match auto {
        true => (0..vr.q.len()).map(|i| score_seq(vr.q[i].clone(), vr.k[i].clone(), vr.v[i].clone(), vr.y[i].clone())).collect(),
        false => Vec::new(),
    };
    let held: Vec<LayerSeq<f32>> =
        vr.q.into_iter().zip(vr.k).zip(vr.v).zip(vr.y).map(|(((q, k), v), y)| seq(q, k, v, y)).collect();
    let mean = |f: &dyn Fn(&LayerSeq<f32>) -> (f64, usize), d: &[LayerSeq<f32>]| {
        let (e, n) = d.iter().map(f).fold((0.0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        e / n.max(1) as f64
    };
    let sw = mean(&|d| d.window_err(&s), &data);
    let vsw = mean(&|d| d.window_err(&s), &held);
    let energy = mean(&|d| d.energy(&s), &data);
    let init = init_params(&s, &data, 0x5EED ^ il as u64, decay).map(|x| x as f32);
    let start = mean(&|d| d.loss(&s, &init, None), &data);
    let vstart = mean(&|d| d.loss(&s, &init, None), &held);
    // The held-out windows every tenth of the fit: the parameters where they did best.
    let period = (a.steps as usize / 10).max(1);
    let fitted = fit_layer(&s, &data, init.clone(), a.steps as usize, a.batch, far_lr, Some((&held, period)), |st| {
        bar.set_message(format!("layer {il} step {} mse {:.4e}", st.step, st.loss));
    });
    let fin = mean(&|d| d.loss(&s, &fitted, None), &data);
    let vfit = mean(&|d| d.loss(&s, &fitted, None), &held);
    say(format!(
        "layer {il} (window {}): attention-output mse {rule} {sw:.4e} (relative {:.4}); far field at start (mean field) {start:.4e} ({:.1}%), held out {vstart:.4e} ({:.1}%); fitted {fin:.4e} ({:.1}% of {rule}'s), held out {vfit:.4e} ({:.1}%)",
        s.window,
        sw / energy,
        100.0 * start / sw,
        100.0 * vstart / vsw,
        100.0 * fin / sw,
        100.0 * vfit / vsw
    ));
    if decay {
        let scales: Vec<f32> = fitted.decay().iter().map(|d| 1.0 / d).collect();
        let (lo, hi) = scales.iter().fold((f32::INFINITY, 0f32), |m, &x| (m.0.min(x), m.1.max(x)));
        say(format!("layer {il}: fitted time scales 1/δ from {lo:.0} to {hi:.0} positions"));
    }
    // The fit can end worse than its start on windows it did not see (it overfits, or a
    // feature's mass collapses): the start is kept then.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    let (p, vfin) = if !(vfit <= vstart) && vstart.is_finite() {
        say(format!("layer {il}: keeps the mean-field start (held out {:.1}% of {rule}'s)", 100.0 * vstart / vsw));
        (init, vstart)
    } else {
        (fitted, vfit)
    };
    if !vfin.is_finite() {
        bail!("layer {il}: the fit diverged (held-out mse {vfin}); try a lower --far-lr");
    }
    // A far field that does not beat dropping the keys on the held-out windows is left out:
    // the layer keeps its eviction rule alone.
    // (Written so that a NaN error also leaves the layer out.)
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    let helps = vfin < KEEP_BELOW * vsw;
    if auto {
        // The layer's rule: score eviction where it loses less of the attention output on
        // the held-out windows than sink+window does, each with the layer's far field (or
        // without, when the layer keeps none).
        let v_window = if helps { vfin } else { vsw };
        let v_score = match helps {
            true => mean(&|d| d.loss(&s, &p, None), &held_score),
            false => mean(&|d| d.window_err(&s), &held_score),
        };
        let takes = v_score < v_window;
        say(format!(
            "layer {il}: held out with score eviction {v_score:.4e} ({:.1}% of sink+window's): {}",
            100.0 * v_score / v_window,
            if takes { "score eviction" } else { "sink+window" }
        ));
        if takes {
            chose_score = true;
        }
    }
    if !helps {
        say(format!(
            "layer {il}: no far field (held out {:.1}% of {rule}'s, keep below {:.0}%)",
            100.0 * vfin / vsw,
            100.0 * KEEP_BELOW
        ));
        return Ok(Fitted { vsw, vkept: vsw, params: None, score: chose_score });
    }
    Ok(Fitted { vsw, vkept: vfin, params: Some(p), score: chose_score })
}

/// Score eviction's schedule on one recorded window (`--far-rule score`): exact attention over
/// the first tp positions (the sealed prompt of `ppl`: t/2), then the engine's own layer-shared
/// slots (`evict::Slots`, the default rule) step through the rest, and each key's exit is the
/// first position that no longer sees it (tp for the prompt keys the seal drops, t' + 1 for
/// the key evicted after the step at t'). The serving form's scores also count the far
/// field's mass in each head's normalizer; this schedule is without it (the far field is
/// fitted to the schedule, not the other way around), so the keys it evicts can differ.
#[allow(clippy::too_many_arguments)]
fn score_exits(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    t: usize,
    tp: usize,
    nh: usize,
    nkv: usize,
    hd: usize,
    sinks: usize,
    window: usize,
    scale: f64,
) -> Vec<usize> {
    use cortiq_engine::o1::evict::{ScoreRule, Slots};
    use cortiq_train::farfield::NEVER;
    let row = nkv * hd;
    let mut exits = vec![NEVER; t];
    let mut slots = Slots::seal(&k[..tp * row], &v[..tp * row], row, sinks, window, ScoreRule::default());
    let mut kept: std::collections::BTreeSet<u32> = slots.positions().iter().copied().collect();
    for (j, e) in exits.iter_mut().enumerate().take(tp) {
        if !kept.contains(&(j as u32)) {
            *e = tp;
        }
    }
    let mut o = vec![0f32; nh * hd];
    for p in tp..t {
        slots.step(&q[p * nh * hd..][..nh * hd], &k[p * row..][..row], &v[p * row..][..row], &mut o, nh, nkv, scale, None);
        kept.insert(p as u32);
        let now: std::collections::BTreeSet<u32> = slots.positions().iter().copied().collect();
        for &gone in kept.difference(&now) {
            exits[gone as usize] = p + 1;
        }
        kept = now;
    }
    exits
}

/// Score eviction's schedule as a stage-2 student's block computes it from its own q, k, v
/// (`cortiq_train::block::Schedule`): the prompt of `tp` positions, then the slots.
pub fn score_schedule(s: &FarShape, tp: usize, q: &[f32], k: &[f32], v: &[f32]) -> Vec<usize> {
    score_exits(q, k, v, s.t, tp, s.n_heads, s.n_kv, s.hd, s.sinks, s.window, s.scale)
}

/// Grid of the window curves: every SPLIT_STEP positions up to the whole context.
const SPLIT_STEP: usize = 8;

/// The window split of the recorded layers: each layer's curve over every training window
/// (queries of the second half, every 4th: the positions a sealed prompt of half the context
/// serves).
#[allow(clippy::too_many_arguments)]
fn window_split(
    recs: &HashMap<usize, Rec>,
    planned: &[usize],
    t: usize,
    nh: usize,
    nkv: usize,
    hd: usize,
    sinks: usize,
    scale: f64,
) -> O1Split {
    let cs = CurveShape {
        t,
        n_heads: nh,
        n_kv: nkv,
        hd,
        sinks,
        scale,
        step: SPLIT_STEP,
        points: t / SPLIT_STEP,
        from: t / 2,
        stride: 4,
    };
    let curves = planned
        .iter()
        .map(|il| {
            let r = &recs[il];
            let mut sum = CurveSums::zeros(cs.points);
            for ((q, k), v) in r.q.iter().zip(&r.k).zip(&r.v) {
                sum.add(&window_sums(&cs, q, k, v));
            }
            sum.curve()
        })
        .collect();
    O1Split { step: SPLIT_STEP, layers: planned.to_vec(), curves }
}

/// Runs the model exact over each window, recording every planned layer's q, k, v and
/// attention output.
fn record(model: &cortiq_engine::model::Model, planned: &[usize], windows: &[Vec<u32>], t: usize) -> Result<HashMap<usize, Rec>> {
    let (nh, nkv, hd) = (model.cfg.n_heads, model.cfg.n_kv_heads, model.cfg.head_dim);
    let mut recs: HashMap<usize, Rec> = planned.iter().map(|&il| (il, Rec::default())).collect();
    for w in windows {
        let mut st = model.new_state(t);
        let mut cur: HashMap<usize, Rec> = planned.iter().map(|&il| (il, Rec::default())).collect();
        model.forward_traced(w, &mut st, Logits::None, &mut |name, il, x| {
            let Some(r) = cur.get_mut(&il) else { return };
            let dst = match name {
                "q" => &mut r.q,
                "k" => &mut r.k,
                "v" => &mut r.v,
                "attn_out" => &mut r.y,
                _ => return,
            };
            if dst.is_empty() {
                dst.push(Vec::new());
            }
            dst[0].extend_from_slice(x);
        })?;
        for (il, r) in cur {
            let all = recs.get_mut(&il).expect("every planned layer recorded");
            for (d, s) in [(&mut all.q, r.q), (&mut all.k, r.k), (&mut all.v, r.v), (&mut all.y, r.y)] {
                let s = s.into_iter().next().unwrap_or_default();
                d.push(s);
            }
        }
    }
    for (il, r) in &recs {
        let ok = r.q.iter().all(|x| x.len() == t * nh * hd)
            && r.k.iter().chain(&r.v).all(|x| x.len() == t * nkv * hd)
            && r.y.iter().all(|x| x.len() == t * nh * hd);
        if !ok {
            bail!("layer {il}: the recorded attention tensors do not have {t} positions of {nh}/{nkv} heads of {hd}");
        }
    }
    Ok(recs)
}

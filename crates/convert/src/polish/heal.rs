//! `cortiq polish -m HYBRID.cmf --teacher ORIGINAL --stage transfer`: stage 1 of the heal of a
//! dense model folded onto vmf_phase (issue 16, `convert --linear-core`), attention transfer.
//! Each converted layer alone, teacher-forced: its input is the original model's normed input at
//! that layer and its target the original attention block's output (after o_proj), on windows
//! of the training texts; the layer's vmf_phase parameters (phases and their biases, decays,
//! conv, gate, mass, output norm; v_proj and out_proj at a tenth of the rate) fit the relative squared error
//! (the teacher output's energy as the normaliser), everything else frozen
//! (`cortiq_train::vmf::transfer_layer`). Held-out windows of the validation text choose the
//! step kept and give the per-layer report: relative error and cosine to the teacher, before
//! and after. OUT is HYBRID with the converted layers' tensors replaced (f32).
//!
//! A windowed layer (`convert --window`: exact softmax over its sinks and last W positions, the
//! core as one more slot for the keys that left) is fitted the same way as a whole
//! (`cortiq_train::vmf_window::WinMixer`): the teacher's own W_q, W_k, W_v, W_o and biases at a
//! tenth of the rate, the core's parameters and the slot's map at the full rate; stage 2 trains
//! it end to end the same way (`cortiq_train::block::BlockMixer::VmfWin`).
//!
//! Stage 2 (`--stage distill`) runs through `polish`'s trainer (mod.rs): the student is the
//! hybrid (softmax layers exact and frozen, the vmf_phase layers' parameters trained, with
//! `--distill-ffn` their norms and FFNs too), the teacher the original, KL over every position.

use std::collections::HashMap;
use std::time::Instant;

use crate::error::{Context, Result, bail};
use cortiq_engine::config::MixerKind;
use cortiq_engine::load::load;
use cortiq_engine::mixers::vmf::{CoreWeights, VmfConfig, VmfPhase};
use cortiq_engine::mixers::vmf_window::VmfWindow;
use cortiq_engine::model::Model;
use cortiq_kernels::quant::QuantType;
use cortiq_train::rope::RopeTable;
use cortiq_train::vmf::{TransferMixer, TransferSeq, VmfParams, VmfShape, transfer_error, transfer_layer};
use cortiq_train::vmf_window::{WinMixer, WinParams, WinShape};
use indicatif::{ProgressBar, ProgressStyle};

use super::text_windows;
use super::{PolishArgs, export, start_pool};

/// Rate of the copied teacher projections (v_proj, out_proj) relative to --lr.
const COPIED_MULT: f64 = 0.1;

/// The flags the heal refuses (both stages); and the stage given.
pub fn check_flags(a: &PolishArgs) -> Result<()> {
    if a.stage.is_none() {
        bail!("--teacher: give --stage transfer (stage 1, attention transfer) or --stage distill (stage 2, KL end to end)");
    }
    for (flag, given) in [
        ("--o1-far", a.o1_far.is_some()),
        ("--o1-window", a.o1_window.is_some()),
        ("--o1-sinks", a.o1_sinks.is_some()),
        ("--o1-landmarks", a.o1_landmarks.is_some()),
        ("--o1-ridge", a.o1_ridge.is_some()),
        ("--far-rank", a.far_rank.is_some()),
        ("--far-lr", a.far_lr.is_some()),
        ("--far-rule", a.far_rule.is_some()),
        ("--far-decay", a.far_decay.is_some()),
        ("--o1-split", a.o1_split.is_some()),
        ("--init", a.init.is_some()),
    ] {
        if given {
            bail!("{flag}: not a setting of the vmf_phase heal (--teacher)");
        }
    }
    if a.stage.as_deref() == Some("transfer") {
        if a.resume {
            bail!("--resume: stage 1 (transfer) keeps no checkpoint; rerun it");
        }
        if a.distill_ffn {
            bail!("--distill-ffn needs --stage distill");
        }
        if a.vmf_lr_mult != 1.0 {
            bail!("--vmf-lr-mult: a setting of --stage distill (stage 1 fits one layer at --lr)");
        }
    } else if a.far_windows.is_some() {
        bail!("--far-windows: a setting of stage 1 (--stage transfer)");
    }
    Ok(())
}

/// The heal's teacher, checked against the hybrid `h` (loaded from `hybrid`): the dense model
/// it was converted from, in exact numerics.
/// Also returns the hybrid's vmf_phase layers.
pub fn load_teacher(h: &Model, hybrid: &std::path::Path, teacher: &str) -> Result<(cortiq_engine::load::Loaded, Vec<usize>)> {
    let teacher_path = std::path::PathBuf::from(teacher);
    let mut tl = load(&teacher_path).with_context(|| format!("loading the teacher {}", teacher_path.display()))?;
    tl.model.set_numerics(cortiq_engine::Numerics::Exact);
    let (hc, tc) = (&h.cfg, &tl.model.cfg);
    let layers: Vec<usize> = (0..hc.n_layers).filter(|&il| matches!(hc.layers[il].mixer, MixerKind::VmfPhase(_))).collect();
    if layers.is_empty() {
        bail!("{}: no vmf_phase layers to heal (make them with cortiq convert --linear-core vmf_phase)", hybrid.display());
    }
    if (hc.n_layers, hc.d_model, hc.vocab) != (tc.n_layers, tc.d_model, tc.vocab) {
        bail!(
            "--teacher {}: {} layers × {} wide, vocab {}; the hybrid has {} × {}, vocab {} (not the model it was converted from)",
            teacher_path.display(),
            tc.n_layers,
            tc.d_model,
            tc.vocab,
            hc.n_layers,
            hc.d_model,
            hc.vocab
        );
    }
    if let Some(&il) = layers.iter().find(|&&il| tc.layers[il].mixer != MixerKind::Attention) {
        bail!("--teacher: its layer {il} is not softmax attention");
    }
    Ok((tl, layers))
}

/// The windowed layers of the hybrid `h`, checked for what the heal trains: an attention the
/// trainer models (no QK-norms, sinks or gated output: `cortiq_train::vmf_window` has none,
/// and a layer trained without them would be served with them) and windows of `ctx` tokens that
/// reach past each layer's sinks and window (else its core and slot never see a key and take
/// no gradient). Both stages call it.
pub fn check_windowed(h: &Model, hybrid: &std::path::Path, ctx: usize) -> Result<()> {
    for (il, l) in h.layers.iter().enumerate() {
        let Some(w) = l.mixer.downcast_ref::<VmfWindow>() else { continue };
        let a = &w.att;
        if a.q_norm.is_some() || a.k_norm.is_some() || a.sinks.is_some() || h.cfg.attn_gate {
            bail!(
                "{}: layer {il}'s attention has QK-norms, sinks or a gated output, which the heal of windowed layers does not train",
                hybrid.display()
            );
        }
        let reach = w.cfg.sinks + w.cfg.window;
        if ctx <= reach {
            bail!("--ctx {ctx}: layer {il} keeps {reach} positions exact (sinks + window); the heal's windows must be longer");
        }
    }
    Ok(())
}

pub fn cmd_polish_heal(a: &PolishArgs, teacher: &str) -> Result<()> {
    if a.out.exists() && !a.force {
        bail!("{} already exists (pass --force to overwrite)", a.out.display());
    }
    if !(a.lr.is_finite() && a.lr > 0.0) {
        bail!("--lr: must be a positive number, got {}", a.lr);
    }
    if a.steps == 0 || a.batch == 0 || a.ctx < 8 {
        bail!("--steps and --batch must be at least 1 and --ctx at least 8");
    }
    start_pool(a.threads)?;
    let t0 = Instant::now();
    let hybrid_path = std::path::PathBuf::from(&a.model);
    let hybrid = load(&hybrid_path).with_context(|| format!("loading {}", hybrid_path.display()))?;
    let (tl, layers) = load_teacher(&hybrid.model, &hybrid_path, teacher)?;
    check_windowed(&hybrid.model, &hybrid_path, a.ctx)?;
    let tok = tl.tokenizer()?;
    let bos = if tok.add_bos() { tok.bos_id() } else { None };
    let n_train = a.far_windows.unwrap_or(32);
    let train = text_windows(&tok, &a.train, bos, a.ctx, n_train)?;
    let held = text_windows(&tok, std::slice::from_ref(&a.valid), bos, a.ctx, a.valid_windows.max(1))?;
    if train.is_empty() || held.is_empty() {
        bail!("--ctx {}: the training or validation texts hold less than one window", a.ctx);
    }
    eprintln!(
        "stage 1 (attention transfer) on layers {layers:?}: {} training windows of {} tokens ({} tokens), {} held out",
        train.len(),
        a.ctx,
        train.len() * a.ctx,
        held.len()
    );
    let rec_t = record(&tl.model, &layers, &train)?;
    let rec_h = record(&tl.model, &layers, &held)?;
    eprintln!("teacher recorded in {:.1}s", t0.elapsed().as_secs_f64());
    let mut replaced: HashMap<String, Vec<f32>> = HashMap::new();
    let total_steps = a.steps as usize * layers.len();
    let bar = ProgressBar::new(total_steps as u64);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} steps {msg}").expect("valid template"),
    );
    let mut lines = Vec::new();
    let fit = FitRun { a, bar: &bar };
    for &il in &layers {
        let (data, hd) = (&rec_t[&il], &rec_h[&il]);
        let mixer = &hybrid.model.layers[il].mixer;
        let (line, tensors) = if let Some(l) = mixer.downcast_ref::<VmfPhase>() {
            let (sh, init) = params_of(l);
            let (line, p) = fit.layer(il, &sh, init, data, hd);
            (line, tensors_of(il, &p))
        } else {
            let l: &VmfWindow = mixer.downcast_ref().context("a vmf_phase layer")?;
            let (sh, init) = win_params_of(&hybrid.model, il, l);
            let mc = &hybrid.model.cfg;
            let pos: Vec<usize> = (0..a.ctx).collect();
            let m = WinMixer { sh, rope: RopeTable::from_inv_freq(&pos, &mc.ropes[mc.layers[il].rope].inv_freq) };
            let (line, p) = fit.layer(il, &m, init, data, hd);
            (line, win_tensors_of(il, &p))
        };
        bar.println(&line);
        lines.push(line);
        replaced.extend(tensors);
    }
    bar.finish_and_clear();
    for l in &lines {
        eprintln!("{l}");
    }
    let bytes = export::write_polished(&hybrid, &a.out, &replaced, QuantType::F32, None, &[], a.force)?;
    eprintln!(
        "wrote {} ({:.1} MB) in {:.1} min ({} layers × {} steps × {} windows of {} tokens)",
        a.out.display(),
        bytes as f64 / 1e6,
        t0.elapsed().as_secs_f64() / 60.0,
        layers.len(),
        a.steps,
        a.batch,
        a.ctx
    );
    Ok(())
}

/// One stage-1 run's settings and progress bar.
struct FitRun<'a> {
    a: &'a PolishArgs,
    bar: &'a ProgressBar,
}

impl FitRun<'_> {
    /// Stage 1 on layer `il` from `init`: the fitted parameters and the report line (held-out
    /// relative error and cosine before and after, the training batches' first and last error).
    fn layer<M: TransferMixer<f32>>(
        &self,
        il: usize,
        m: &M,
        init: M::Params,
        data: &[TransferSeq<f32>],
        held: &[TransferSeq<f32>],
    ) -> (String, M::Params) {
        let (a, bar) = (self.a, self.bar);
        let (e0, c0) = stats(m, &init, held);
        let every = (a.valid_every as usize).max(1);
        let (mut first, mut last) = (f64::NAN, f64::NAN);
        let fit = transfer_layer(m, data, init, a.steps as usize, a.batch, a.lr, COPIED_MULT, Some((held, every)), |s| {
            if s.step < a.steps as usize {
                bar.inc(1);
                if s.step == 0 {
                    first = s.rel;
                }
                last = s.rel;
            }
            if let Some(h) = s.held {
                bar.set_message(format!("layer {il}: held-out {h:.4}"));
            }
        });
        let (e1, c1) = stats(m, &fit, held);
        let line = format!(
            "layer {il:>3}: held-out relative error {e0:.4} -> {e1:.4}, cosine {c0:.4} -> {c1:.4} (training batches {first:.4} -> {last:.4})"
        );
        (line, fit)
    }
}

/// (relative error, cosine) of the mixer against the teacher over windows.
fn stats<M: TransferMixer<f32>>(m: &M, p: &M::Params, data: &[TransferSeq<f32>]) -> (f64, f64) {
    let (mut yo, mut oo, mut yy) = (0f64, 0f64, 0f64);
    for s in data {
        let o = m.output(s, p);
        for (&a, &b) in o.iter().zip(&s.y) {
            yo += a as f64 * b as f64;
            oo += a as f64 * a as f64;
            yy += b as f64 * b as f64;
        }
    }
    (transfer_error(m, p, data), yo / (oo.sqrt() * yy.sqrt()).max(1e-300))
}

/// The engine layer's geometry and weights as the trainer's.
pub(crate) fn params_of(l: &VmfPhase) -> (VmfShape, VmfParams<f32>) {
    let c = &l.cfg;
    let w = &l.w;
    let sh = vmf_shape(c);
    (sh, core_params(&w.core, w.v.to_f32(), w.out.to_f32(), w.out_b.clone()))
}

/// The engine's vmf_phase geometry as the trainer's (a windowed layer's core too).
fn vmf_shape(c: &VmfConfig) -> VmfShape {
    VmfShape {
        d_model: c.d_model,
        n_heads: c.n_heads,
        n_states: c.n_k_heads,
        nphase: c.nphase,
        dv: c.d_v,
        conv_kernel: c.conv_kernel,
        k_gate: c.k_gate,
        phase_bias: c.phase_bias,
    }
}

/// A vmf_phase core's weights with the given value and output projections, as the trainer's.
fn core_params(c: &CoreWeights, v: Vec<f32>, out: Vec<f32>, out_b: Vec<f32>) -> VmfParams<f32> {
    let (kg_w, kg_b) = match &c.k_gate {
        Some((g, b)) => (g.to_f32(), b.clone()),
        None => (Vec::new(), Vec::new()),
    };
    VmfParams {
        thq: c.thq.to_f32(),
        thq_b: c.thq_b.clone(),
        thk: c.thk.to_f32(),
        thk_b: c.thk_b.clone(),
        v,
        out,
        out_b,
        a_log: c.a_log.clone(),
        conv: c.conv.clone(),
        kg_w,
        kg_b,
        mass: c.mass.clone(),
        o_norm: c.o_norm.clone(),
    }
}

/// A windowed layer's geometry and weights as the trainer's.
pub(crate) fn win_params_of(model: &Model, il: usize, l: &VmfWindow) -> (WinShape, WinParams<f32>) {
    let (mc, c, att) = (&model.cfg, &l.cfg, &l.att);
    let rope = &mc.ropes[mc.layers[il].rope];
    let core = vmf_shape(c);
    let sh = WinShape { core, sinks: c.sinks, window: c.window, scale: mc.attn_scale as f64, rope: rope.style };
    let or_empty = |b: &Option<Vec<f32>>| b.clone().unwrap_or_default();
    let p = WinParams {
        core: core_params(&l.core, att.wv.to_f32(), att.wo.to_f32(), or_empty(&att.bo)),
        wq: att.wq.to_f32(),
        bq: or_empty(&att.bq),
        wk: att.wk.to_f32(),
        bk: or_empty(&att.bk),
        bv: or_empty(&att.bv),
        wb: l.slot.to_f32(),
        cb: l.slot_b.clone(),
    };
    (sh, p)
}

/// A windowed layer's trained tensors under their GGUF names: the attention's, the core's (no
/// vmf_v / vmf_out: the attention's W_v and W_o are its values and output) and the slot's.
pub(crate) fn win_tensors_of(il: usize, p: &WinParams<f32>) -> Vec<(String, Vec<f32>)> {
    let mut out: Vec<(String, Vec<f32>)> =
        tensors_of(il, &p.core).into_iter().filter(|(n, _)| !n.contains(".vmf_v.") && !n.contains(".vmf_out.")).collect();
    let names = [
        ("attn_q.weight", &p.wq),
        ("attn_q.bias", &p.bq),
        ("attn_k.weight", &p.wk),
        ("attn_k.bias", &p.bk),
        ("attn_v.weight", &p.core.v),
        ("attn_v.bias", &p.bv),
        ("attn_output.weight", &p.core.out),
        ("attn_output.bias", &p.core.out_b),
        ("vmf_slot.weight", &p.wb),
        ("vmf_slot.bias", &p.cb),
    ];
    out.extend(names.into_iter().filter(|(_, v)| !v.is_empty()).map(|(n, v)| (format!("blk.{il}.{n}"), v.clone())));
    out
}

/// The trained tensors under their GGUF names (options that are off have none; the mass only
/// where the file has it: `convert --linear-core` writes it).
pub(crate) fn tensors_of(il: usize, p: &VmfParams<f32>) -> Vec<(String, Vec<f32>)> {
    let names = [
        ("vmf_thq.weight", &p.thq),
        ("vmf_thq.bias", &p.thq_b),
        ("vmf_thk.weight", &p.thk),
        ("vmf_thk.bias", &p.thk_b),
        ("vmf_v.weight", &p.v),
        ("vmf_out.weight", &p.out),
        ("vmf_out.bias", &p.out_b),
        ("vmf_a_log", &p.a_log),
        ("vmf_conv.weight", &p.conv),
        ("vmf_kgate.weight", &p.kg_w),
        ("vmf_kgate.bias", &p.kg_b),
        ("vmf_mass", &p.mass),
        ("vmf_onorm.weight", &p.o_norm),
    ];
    names.into_iter().filter(|(_, v)| !v.is_empty()).map(|(n, v)| (format!("blk.{il}.{n}"), v.clone())).collect()
}

/// The teacher's normed input and attention block output (after o_proj) at each layer, per
/// window.
fn record(model: &Model, layers: &[usize], windows: &[Vec<u32>]) -> Result<HashMap<usize, Vec<TransferSeq<f32>>>> {
    let d = model.cfg.d_model;
    let recs = crate::linearize::record(model, layers, windows, ("attn_norm", d), ("attn_proj", d))?;
    Ok(recs.into_iter().map(|(il, v)| (il, v.into_iter().map(|(x, y)| TransferSeq { x, y }).collect())).collect())
}

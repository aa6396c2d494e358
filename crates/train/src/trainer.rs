//! The polish's training loop as a library: master copies of the trainable tensors (f32 in
//! production; the loop is generic so the PyTorch agreement test runs it in f64), AdamW with
//! warmup + cosine and global-norm clipping, batches of packed windows (the first half of each
//! the sealed prompt, scored from T/2 as `ppl --o1`), teacher logits from a caller-provided
//! [`Teacher`] (the exact engine), validation (the student/teacher ppl ratio), and atomic,
//! resumable checkpoints ([`crate::ckpt`]). Owns: [`Trainer`], [`TrainConfig`], [`TrainError`].
//! Not here: building the [`Student`] from a loaded model, tokenization, the CLI.
//!
//! ```text
//! per step s (0-based):  lr = lr_schedule(s)
//!   for each of B windows w (T + 1 tokens):  teacher z_T = teacher(w[..T])   [T, V]
//!     (loss_w, g_w) = student.step(w[..T], z_T, w[1..], λ, score_from = T/2)
//!   L = mean_w loss_w;  g = mean_w g_w;  c = min(1, clip / (‖g‖ + 1e-6))
//!   AdamW(t = s + 1, lr) on every trainable tensor with gradient c·g
//! ```
//! A non-finite loss or gradient norm stops before the update with [`TrainError::NonFinite`],
//! so neither the weights nor any checkpoint on disk see it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::data::{Cursor, Windows};
use crate::float::Float;
use crate::model::{Kind, Student, StudentGrads, StudentLayer};
use crate::nystrom::NystromError;
use crate::optim::{AdamState, AdamW, clip_factor, lr_schedule};

/// Errors of the data pipeline and the trainer; each names the file, flag or step at fault.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("no {what} files given")]
    NoFiles { what: &'static str },
    #[error("{name}: empty (no tokens)")]
    EmptyFile { name: String },
    #[error("no {what} window: a window takes {need} tokens (--ctx + 1), the longest file has {longest}")]
    NoWindows { what: &'static str, need: usize, longest: usize },
    #[error("{name}: given both for training and for validation")]
    TrainValidOverlap { name: String },
    #[error("--ctx {ctx} exceeds the model's {max} positions")]
    CtxTooLong { ctx: usize, max: usize },
    #[error("{what} window {window}: token {token} is outside the vocabulary of {vocab}")]
    TokenOutOfVocab { what: &'static str, window: usize, token: u32, vocab: usize },
    #[error("{0}")]
    Config(String),
    #[error("teacher: {0}")]
    Teacher(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("teacher: logits of a window have {got} values, expected {want} ([T, V])")]
    TeacherShape { got: usize, want: usize },
    #[error("teacher: logit {col} of row {row} of a window is {value} (not finite)")]
    TeacherNonFinite { row: usize, col: usize, value: f64 },
    #[error("step {step}: {what} is {value} (not finite); stopped before updating, the last checkpoint is intact")]
    NonFinite { step: u64, what: &'static str, value: f64 },
    #[error(transparent)]
    Nystrom(#[from] NystromError),
    #[error("checkpoint {}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("checkpoint {}: {what}", path.display())]
    Checkpoint { path: PathBuf, what: String },
}

/// Where the teacher's logits come from (the exact engine in `cortiq polish`): `[T, V]` row-major
/// for the T input tokens of a window. Only rows from T/2 enter the loss. Closures
/// `FnMut(&[u32]) -> Result<Vec<F>, E>` implement it.
pub trait Teacher<F> {
    fn logits(&mut self, tokens: &[u32]) -> Result<Vec<F>, Box<dyn std::error::Error + Send + Sync>>;
}

impl<F, E, C> Teacher<F> for C
where
    C: FnMut(&[u32]) -> Result<Vec<F>, E>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn logits(&mut self, tokens: &[u32]) -> Result<Vec<F>, Box<dyn std::error::Error + Send + Sync>> {
        self(tokens).map_err(Into::into)
    }
}

/// Hyper-parameters of a run (part of a checkpoint's identity: ctx, batch, seed, shuffle).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainConfig {
    /// T: input tokens per window; the first T/2 are the sealed prompt.
    pub ctx: usize,
    /// Windows per step.
    pub batch: usize,
    /// Total steps (the end of the cosine).
    pub steps: u64,
    pub warmup: u64,
    /// Peak and final learning rate.
    pub lr: f64,
    pub min_lr: f64,
    /// Multiplier of the learning rate for norm gains (vectors of O(1) values, which AdamW at an
    /// FFN matrix's rate barely moves: lr 1e-4 shifts a gain by at most ~1e-4 per step).
    pub gain_lr_mult: f64,
    /// Multiplier of the learning rate for far fields' feature maps (stage 1 fits them at 1e-2).
    pub far_lr_mult: f64,
    /// Multiplier of the learning rate for vmf_phase layers' parameters (the heal's stage 2).
    pub vmf_lr_mult: f64,
    /// Further multiplier for the vmf_phase layers' copied projections (v_proj, out_proj).
    pub vmf_copied_mult: f64,
    /// β1, β2, eps, weight decay (its `lr` is unused: the schedule gives each step's).
    pub adamw: AdamW,
    /// Global gradient-norm clip (≤ 0: off).
    pub clip: f64,
    /// λ of L = (1−λ)·CE + λ·KL(teacher‖student).
    pub kl_weight: f64,
    /// Seed of the epoch order.
    pub seed: u64,
    pub shuffle: bool,
    /// Score every position (the vmf_phase heal) instead of the half after the sealed prompt.
    pub score_all: bool,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            ctx: 1024,
            batch: 1,
            steps: 1000,
            warmup: 50,
            lr: 1e-4,
            min_lr: 1e-5,
            gain_lr_mult: 1.0,
            far_lr_mult: 1.0,
            vmf_lr_mult: 1.0,
            vmf_copied_mult: 1.0,
            adamw: AdamW { lr: 1e-4, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 },
            clip: 1.0,
            kl_weight: 0.5,
            seed: 0,
            shuffle: true,
            score_all: false,
        }
    }
}

impl TrainConfig {
    /// Scored positions start here (the prompt is the first half).
    pub fn score_from(&self) -> usize {
        if self.score_all { 0 } else { self.ctx / 2 }
    }

    fn validate(&self) -> Result<(), TrainError> {
        let bad = |m: String| Err(TrainError::Config(m));
        if self.ctx < 2 {
            return bad(format!("--ctx {}: a window needs at least 2 positions", self.ctx));
        }
        if self.batch == 0 {
            return bad("--batch: must be at least 1".into());
        }
        if !(self.lr.is_finite() && self.lr > 0.0 && self.min_lr.is_finite() && self.min_lr >= 0.0) {
            return bad(format!("--lr {} / min lr {}: must be finite, lr > 0, min lr ≥ 0", self.lr, self.min_lr));
        }
        if !(self.gain_lr_mult.is_finite() && self.gain_lr_mult > 0.0) {
            return bad(format!("--gain-lr-mult {}: must be finite and > 0", self.gain_lr_mult));
        }
        if !(self.vmf_copied_mult.is_finite() && self.vmf_copied_mult > 0.0) {
            return bad(format!("vmf_phase copied-projection lr multiplier {}: must be finite and > 0", self.vmf_copied_mult));
        }
        if !(self.vmf_lr_mult.is_finite() && self.vmf_lr_mult > 0.0) {
            return bad(format!("vmf_phase lr multiplier {}: must be finite and > 0", self.vmf_lr_mult));
        }
        if !(self.far_lr_mult.is_finite() && self.far_lr_mult > 0.0) {
            return bad(format!("far field lr multiplier {}: must be finite and > 0 (--far-lr)", self.far_lr_mult));
        }
        if !(0.0..=1.0).contains(&self.kl_weight) {
            return bad(format!("--kl-weight {}: must be in [0, 1]", self.kl_weight));
        }
        let a = &self.adamw;
        if !((0.0..1.0).contains(&a.beta1) && (0.0..1.0).contains(&a.beta2) && a.eps > 0.0 && a.weight_decay >= 0.0) {
            return bad(format!(
                "AdamW: betas {}, {} must be in [0, 1), eps {} > 0, weight decay {} ≥ 0",
                a.beta1, a.beta2, a.eps, a.weight_decay
            ));
        }
        Ok(())
    }
}

/// One step's numbers (means over the batch; `grad_norm` before clipping).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// Steps done after this one.
    pub step: u64,
    pub lr: f64,
    pub loss: f64,
    pub ce: f64,
    pub kl: f64,
    pub grad_norm: f64,
    /// Input tokens processed (B·T).
    pub tokens: usize,
}

/// Validation over windows: the student's numbers, the teacher's CE on the same scored
/// positions, and the ppl ratio exp(CE_student − CE_teacher) (the O(1)/exact ratio of `ppl`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ValidReport {
    pub loss: f64,
    pub ce: f64,
    pub kl: f64,
    pub teacher_ce: f64,
    pub ppl: f64,
    pub teacher_ppl: f64,
    pub ppl_ratio: f64,
}

/// The trainable tensors of a student, in [`StudentGrads`]' layout (same order for the
/// optimizer): the master copies.
pub type Params<F> = StudentGrads<F>;

/// Copies the trainable tensors out of a student.
pub fn params_of<F: Float>(s: &Student<'_, F>) -> Params<F> {
    let mut p = StudentGrads::new(s);
    for (g, l) in p.layers.iter_mut().zip(&s.layers) {
        if let Some(g) = g {
            let w = &l.w;
            g.attn_norm.copy_from_slice(w.attn_norm);
            g.ffn_norm.copy_from_slice(w.ffn_norm);
            g.gate.copy_from_slice(w.gate);
            g.up.copy_from_slice(w.up);
            g.down.copy_from_slice(w.down);
            for (dst, src) in [
                (&mut g.q_norm, w.q_norm),
                (&mut g.k_norm, w.k_norm),
                (&mut g.post_attn_norm, w.post_attn_norm),
                (&mut g.post_ffn_norm, w.post_ffn_norm),
            ] {
                if let (Some(d), Some(s)) = (dst.as_mut(), src) {
                    d.copy_from_slice(s);
                }
            }
        }
    }
    if !p.final_norm.is_empty() {
        p.final_norm.copy_from_slice(s.final_norm);
    }
    for (dst, l) in p.far.iter_mut().zip(&s.layers) {
        if let (Some(d), Some(src)) = (dst.as_mut(), l.w.far) {
            d.clone_from(src);
        }
    }
    for (dst, l) in p.vmf.iter_mut().zip(&s.layers) {
        if let (Some(d), Some(src)) = (dst.as_mut(), l.w.vmf) {
            d.clone_from(src);
        }
    }
    p
}

/// The student with its trainable tensors read from `p` (frozen ones from `base`).
pub fn student_view<'s, F: Float>(base: &'s Student<'_, F>, p: &'s Params<F>) -> Student<'s, F> {
    let layers = base
        .layers
        .iter()
        .zip(&p.layers)
        .enumerate()
        .map(|(i, (l, g))| {
            let mut w = l.w;
            if let Some(g) = g {
                w.attn_norm = &g.attn_norm;
                w.ffn_norm = &g.ffn_norm;
                w.gate = &g.gate;
                w.up = &g.up;
                w.down = &g.down;
                w.q_norm = g.q_norm.as_deref().or(w.q_norm);
                w.k_norm = g.k_norm.as_deref().or(w.k_norm);
                w.post_attn_norm = g.post_attn_norm.as_deref().or(w.post_attn_norm);
                w.post_ffn_norm = g.post_ffn_norm.as_deref().or(w.post_ffn_norm);
            }
            w.far = p.far[i].as_ref().or(w.far);
            w.vmf = p.vmf[i].as_ref().or(w.vmf);
            StudentLayer { cfg: l.cfg, w, rope: l.rope, train: l.train, train_vmf: l.train_vmf }
        })
        .collect();
    Student {
        embed: base.embed,
        embed_scale: base.embed_scale,
        layers,
        final_norm: if p.final_norm.is_empty() { base.final_norm } else { &p.final_norm },
        norm_style: base.norm_style,
        norm_eps: base.norm_eps,
        lm_head: base.lm_head,
        vocab: base.vocab,
        d_model: base.d_model,
    }
}

/// Teacher cross-entropy (nats, summed) of rows `[N, V]` against targets `[N]`, softmax in f64.
fn ce_sum<F: Float>(z: &[F], targets: &[u32], v: usize) -> f64 {
    z.chunks_exact(v)
        .zip(targets)
        .map(|(r, &y)| {
            let m = r.iter().fold(f64::NEG_INFINITY, |a, x| a.max(x.to_f64()));
            let s: f64 = r.iter().map(|x| (x.to_f64() - m).exp()).sum();
            m + s.ln() - r[y as usize].to_f64()
        })
        .sum()
}

/// The training state: base student (frozen tensors), master copies, AdamW moments, the step
/// count and the data cursor. Everything a checkpoint holds; nothing else changes across steps.
pub struct Trainer<'a, F: Float> {
    pub base: Student<'a, F>,
    pub cfg: TrainConfig,
    pub params: Params<F>,
    pub moments: Vec<AdamState<F>>,
    /// Steps done.
    pub step: u64,
    pub cursor: Cursor,
    data: Windows,
    grads: StudentGrads<F>,
}

/// Checks a split's windows against the config and the vocabulary.
fn check_windows(w: &Windows, cfg: &TrainConfig, vocab: usize, what: &'static str) -> Result<(), TrainError> {
    if w.ctx != cfg.ctx {
        return Err(TrainError::Config(format!("{what} windows are packed for ctx {}, the run has --ctx {}", w.ctx, cfg.ctx)));
    }
    if w.is_empty() {
        return Err(TrainError::NoWindows { what, need: cfg.ctx + 1, longest: 0 });
    }
    for (i, win) in w.windows.iter().enumerate() {
        if win.len() != cfg.ctx + 1 {
            return Err(TrainError::Config(format!("{what} window {i}: {} tokens, expected {}", win.len(), cfg.ctx + 1)));
        }
        if let Some(&t) = win.iter().find(|&&t| t as usize >= vocab) {
            return Err(TrainError::TokenOutOfVocab { what, window: i, token: t, vocab });
        }
    }
    Ok(())
}

impl<'a, F: Float> Trainer<'a, F> {
    /// A fresh run from `base` (its trainable tensors are the starting point).
    pub fn new(base: Student<'a, F>, cfg: TrainConfig, data: Windows) -> Result<Self, TrainError> {
        cfg.validate()?;
        check_windows(&data, &cfg, base.vocab, "training")?;
        for l in &base.layers {
            let max = l.rope.cos.len() / l.rope.half.max(1);
            if cfg.ctx > max {
                return Err(TrainError::CtxTooLong { ctx: cfg.ctx, max });
            }
        }
        let mut params = params_of(&base);
        let moments = params.tensors_mut().iter().map(|t| AdamState::new(t.len())).collect();
        let grads = StudentGrads::new(&base);
        Ok(Trainer { base, cfg, params, moments, step: 0, cursor: Cursor::default(), data, grads })
    }

    /// The current student.
    pub fn student(&self) -> Student<'_, F> {
        student_view(&self.base, &self.params)
    }

    /// Teacher logits of one window's inputs, shape-checked.
    fn teacher_logits(&self, teacher: &mut dyn Teacher<F>, inputs: &[u32]) -> Result<Vec<F>, TrainError> {
        let z = teacher.logits(inputs).map_err(TrainError::Teacher)?;
        let want = inputs.len() * self.base.vocab;
        if z.len() != want {
            return Err(TrainError::TeacherShape { got: z.len(), want });
        }
        // Only the scored rows enter the loss (the softmax would hide a NaN there in the KL).
        let (v, s0) = (self.base.vocab, self.cfg.score_from());
        if let Some(i) = z[s0 * v..].iter().position(|x| !x.is_finite()) {
            let i = s0 * v + i;
            return Err(TrainError::TeacherNonFinite { row: i / v, col: i % v, value: z[i].to_f64() });
        }
        Ok(z)
    }

    /// One optimizer step over the next batch of windows.
    pub fn train_step(&mut self, teacher: &mut dyn Teacher<F>) -> Result<StepReport, TrainError> {
        let b = self.cfg.batch;
        let lr = lr_schedule(self.step, self.cfg.lr, self.cfg.min_lr, self.cfg.warmup, self.cfg.steps);
        let mut cursor = self.cursor;
        let idx = cursor.take(self.data.len(), b, self.cfg.seed, self.cfg.shuffle);
        // The gradient buffers leave self for the step (the student view borrows self) and
        // come back on every path.
        let mut grads = std::mem::replace(
            &mut self.grads,
            StudentGrads { layers: Vec::new(), final_norm: Vec::new(), far: Vec::new(), vmf: Vec::new() },
        );
        grads.zero();
        let sums = self.accumulate(&idx, teacher, &mut grads);
        let r = sums.and_then(|sums| self.update(sums, lr, &mut grads));
        self.grads = grads;
        let r = r?;
        self.cursor = cursor;
        Ok(r)
    }

    /// Sums of (loss, CE, KL) over the windows `idx`; their gradients added into `grads`.
    fn accumulate(
        &self,
        idx: &[usize],
        teacher: &mut dyn Teacher<F>,
        grads: &mut StudentGrads<F>,
    ) -> Result<(f64, f64, f64), TrainError> {
        let (t, s0) = (self.cfg.ctx, self.cfg.score_from());
        let s = self.student();
        let (mut loss, mut ce, mut kl) = (0.0, 0.0, 0.0);
        for &i in idx {
            let w = &self.data.windows[i];
            let z = self.teacher_logits(teacher, &w[..t])?;
            let (out, _) = s.step(&w[..t], &z, &w[1..], self.cfg.kl_weight, s0, grads)?;
            loss += out.loss;
            ce += out.ce;
            kl += out.kl;
        }
        Ok((loss, ce, kl))
    }

    /// Mean, clip and AdamW from the batch sums; the weights change only when everything is finite.
    fn update(
        &mut self,
        (loss, ce, kl): (f64, f64, f64),
        lr: f64,
        grads: &mut StudentGrads<F>,
    ) -> Result<StepReport, TrainError> {
        let (t, b) = (self.cfg.ctx, self.cfg.batch);
        let bf = b as f64;
        let (loss, ce, kl) = (loss / bf, ce / bf, kl / bf);
        // g = mean over windows (torch: the gradient of the batch-mean loss).
        let inv_b = F::from_f64(1.0 / bf);
        let mut gt = grads.tensors_mut();
        if b > 1 {
            gt.iter_mut().for_each(|g| g.iter_mut().for_each(|x| *x *= inv_b));
        }
        let views: Vec<&[F]> = gt.iter().map(|g| &g[..]).collect();
        let (norm, factor) = clip_factor(&views, self.cfg.clip);
        let step_no = self.step + 1;
        for (what, value) in [("loss", loss), ("gradient norm", norm)] {
            if !value.is_finite() {
                return Err(TrainError::NonFinite { step: step_no, what, value });
            }
        }
        let opt = self.cfg.adamw;
        let mut pt = self.params.tensors_kinds_mut();
        for (((p, kind), g), st) in pt.iter_mut().zip(&gt).zip(self.moments.iter_mut()) {
            let lr_t = match kind {
                Kind::Gain => lr * self.cfg.gain_lr_mult,
                Kind::Matrix => lr,
                Kind::Far => lr * self.cfg.far_lr_mult,
                Kind::Vmf => lr * self.cfg.vmf_lr_mult,
                Kind::VmfCopied => lr * self.cfg.vmf_lr_mult * self.cfg.vmf_copied_mult,
            };
            opt.step(step_no, lr_t, p, g, factor, st);
        }
        self.step = step_no;
        Ok(StepReport { step: step_no, lr, loss, ce, kl, grad_norm: norm, tokens: b * t })
    }

    /// The student against the teacher over `valid` (all windows, no gradient).
    pub fn validate(&self, valid: &Windows, teacher: &mut dyn Teacher<F>) -> Result<ValidReport, TrainError> {
        check_windows(valid, &self.cfg, self.base.vocab, "validation")?;
        let (t, s0, v) = (self.cfg.ctx, self.cfg.score_from(), self.base.vocab);
        let s = self.student();
        let (mut loss, mut ce, mut kl, mut tce) = (0.0, 0.0, 0.0, 0.0);
        for w in &valid.windows {
            let z = self.teacher_logits(teacher, &w[..t])?;
            let out = s.loss(&w[..t], &z, &w[1..], self.cfg.kl_weight, s0, None)?;
            loss += out.loss;
            ce += out.ce;
            kl += out.kl;
            tce += ce_sum(&z[s0 * v..], &w[s0 + 1..], v) / (t - s0) as f64;
        }
        let n = valid.len() as f64;
        let (loss, ce, kl, tce) = (loss / n, ce / n, kl / n, tce / n);
        Ok(ValidReport { loss, ce, kl, teacher_ce: tce, ppl: ce.exp(), teacher_ppl: tce.exp(), ppl_ratio: (ce - tce).exp() })
    }

    /// Writes the training state to `path` atomically (see [`crate::ckpt`]).
    pub fn save_checkpoint(&mut self, path: &std::path::Path) -> Result<(), TrainError> {
        crate::ckpt::save(self, path)
    }

    /// Restores the state saved by [`Trainer::save_checkpoint`] into a trainer built with the
    /// same base student, config and data; the run then continues bit-identically.
    pub fn load_checkpoint(&mut self, path: &std::path::Path) -> Result<(), TrainError> {
        crate::ckpt::load(self, path)
    }

    /// Training windows (the checkpoint records only the cursor into them).
    pub fn data(&self) -> &Windows {
        &self.data
    }
}

/// What [`Trainer::run`] reports as it goes.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Step(StepReport),
    Valid { step: u64, report: ValidReport },
    Checkpoint { step: u64, path: PathBuf },
}

/// How [`Trainer::run`] validates and checkpoints.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Checkpoint file (None: no checkpoints).
    pub checkpoint: Option<PathBuf>,
    /// Checkpoint every K steps (0: only at the end and on stop).
    pub checkpoint_every: u64,
    /// Validate every N steps (0: never).
    pub valid_every: u64,
}

/// Why [`Trainer::run`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    Finished,
    /// The stop flag was raised (Ctrl-C); a checkpoint was written when one is configured.
    Stopped,
}

impl<F: Float> Trainer<'_, F> {
    /// Steps until `cfg.steps`, validating and checkpointing as `opts` says; `stop` (set by a
    /// Ctrl-C handler) ends the loop after the current step with a checkpoint. An error leaves
    /// the last checkpoint written as it was.
    pub fn run(
        &mut self,
        teacher: &mut dyn Teacher<F>,
        mut valid: Option<(&Windows, &mut dyn Teacher<F>)>,
        opts: &RunOptions,
        stop: Option<&AtomicBool>,
        on_event: &mut dyn FnMut(&Event),
    ) -> Result<RunEnd, TrainError> {
        let save = |tr: &mut Self, on_event: &mut dyn FnMut(&Event)| -> Result<(), TrainError> {
            if let Some(p) = &opts.checkpoint {
                tr.save_checkpoint(p)?;
                on_event(&Event::Checkpoint { step: tr.step, path: p.clone() });
            }
            Ok(())
        };
        while self.step < self.cfg.steps {
            if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
                save(self, on_event)?;
                return Ok(RunEnd::Stopped);
            }
            let r = self.train_step(teacher)?;
            on_event(&Event::Step(r));
            if opts.valid_every > 0
                && (self.step.is_multiple_of(opts.valid_every) || self.step == self.cfg.steps)
                && let Some((w, vt)) = valid.as_mut()
            {
                let report = self.validate(w, &mut **vt)?;
                on_event(&Event::Valid { step: self.step, report });
            }
            if opts.checkpoint_every > 0 && self.step.is_multiple_of(opts.checkpoint_every) && self.step < self.cfg.steps {
                save(self, on_event)?;
            }
        }
        save(self, on_event)?;
        Ok(RunEnd::Finished)
    }
}

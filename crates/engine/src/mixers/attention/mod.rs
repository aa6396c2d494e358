//! Softmax attention as a mixer, in all its variants: exact or sliding-window, gated or not,
//! an f32, f16 or 8-bit KV cache, and the sealed O(1) state an `o1` plan turns a cache into at the end
//! of the prompt (`o1::nystrom`'s operator). Owns the layer's weights and their loading
//! (`Attention`), its per-sequence state (`KvState`) and that state's operations (truncate,
//! reserve, clear, bytes), its forward and the serving batch's (projections over all rows
//! at once, attention per sequence). The arithmetic is in `core` (projections, QK-norm, RoPE,
//! the softmax kernels, the O(1) hook), which MTP layers, MLA and vmf_phase's window reuse.

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

use cortiq_kernels::kvattn::{KvRows, Q8_BLOCK, dequantize_q8, hadamard, quantize_q8};
use cortiq_kernels::ops::RopeStyle;
use half::f16;

pub mod core;

pub use self::core::{AttentionWeights, DecodeSeq, attention, attention_core, attention_rows, attn_output, attn_project};
pub(crate) use self::core::{attend_latent, attn_prep};
use crate::config::{LayerSpec, ModelConfig};
use crate::error::Result;
use crate::mixers::{Env, Journal, KvType, LayerState, Mixer, MixerState, Seq, StateBytes, segments_apart, steps_apart};
use crate::o1::Serve;
use crate::o1::nystrom::O1Layer;
use crate::qtensor::QTensor;
use crate::weights::TensorSource;

/// An attention layer: its weights, which of the model's RoPE tables it rotates by, its
/// sliding window (None: every earlier key) and its cache's row width.
pub struct Attention {
    pub w: AttentionWeights,
    /// Index into `ModelConfig::ropes`.
    rope: usize,
    window: Option<usize>,
    /// n_kv_heads · head_dim.
    kv_dim: usize,
    hd: usize,
    /// The layer's input-norm gain and its RoPE's pairing (style, rotated dims): what
    /// `key_scales` needs beside the key projection.
    gain: Vec<f32>,
    pairs: (RopeStyle, usize),
    /// Per-channel scales of an 8-bit cache's keys (`KeyForm`), from the weights (`key_scales`),
    /// made when the first 8-bit state is.
    key_scale: OnceLock<Arc<[f32]>>,
}

impl Attention {
    /// Layer `il`'s projections (biases and QK-norms where the model has them).
    pub fn load(src: &dyn TensorSource, cfg: &ModelConfig, il: usize, spec: &LayerSpec) -> Result<Attention> {
        let (d, q_dim, kv_dim, hd) = (cfg.d_model, cfg.q_dim(), cfg.kv_dim(), cfg.head_dim);
        let n = |s: &str| format!("blk.{il}.{s}");
        let bias = |s: &str, len: usize| -> Result<Option<Vec<f32>>> {
            if cfg.qkv_bias { Ok(Some(src.vector(&n(s), len)?)) } else { Ok(None) }
        };
        let qk_norm =
            |s: &str| -> Result<Option<Vec<f32>>> { if cfg.qk_norm { Ok(Some(src.vector(&n(s), hd)?)) } else { Ok(None) } };
        let w = AttentionWeights {
            // A gated q_proj holds [q | gate] per head: twice the rows.
            wq: src.require(&n("attn_q.weight"), if cfg.attn_gate { 2 * q_dim } else { q_dim }, d)?,
            wk: src.require(&n("attn_k.weight"), kv_dim, d)?,
            wv: src.require(&n("attn_v.weight"), kv_dim, d)?,
            wo: src.require(&n("attn_output.weight"), d, q_dim)?,
            bq: bias("attn_q.bias", q_dim)?,
            bk: bias("attn_k.bias", kv_dim)?,
            bv: bias("attn_v.bias", kv_dim)?,
            q_norm: qk_norm("attn_q_norm.weight")?,
            k_norm: qk_norm("attn_k_norm.weight")?,
            bo: if cfg.o_bias { Some(src.vector(&n("attn_output.bias"), d)?) } else { None },
            sinks: if cfg.attn_sinks { Some(src.vector(&n("attn_sinks.weight"), cfg.n_heads)?) } else { None },
        };
        let gain = src.vector(&n("attn_norm.weight"), d)?;
        let rope = &cfg.ropes[spec.rope];
        let pairs = (rope.style, rope.rot_dim);
        Ok(Attention { w, rope: spec.rope, window: spec.sliding_window, kv_dim, hd, gain, pairs, key_scale: OnceLock::new() })
    }
}

/// An 8-bit cache's per-channel key scales (`KeyForm`), from the layer's weights alone: a
/// sequence's keys must be stored alike whatever it saw first (the prompt cache shares
/// prefixes between sequences; a saved session is read back by a fresh model). Channel c's
/// expected size over an input of unit RMS is √(Σ_i (W_ci·γ_i)² + b_c²) (its row of the key
/// projection, γ the layer's input-norm gain, b the bias); with a QK-norm, that relative to its
/// head's RMS, times the norm's gain. The two channels RoPE rotates together share one size
/// (rotation mixes them), a head's sizes are taken relative to their RMS (only the ratios within
/// a head matter: an 8-bit block never spans two heads), and each is rounded to a power of two,
/// so that dividing by it and multiplying back are exact.
fn key_scales(w: &AttentionWeights, gain: &[f32], hd: usize, (style, rot_dim): (RopeStyle, usize)) -> Vec<f32> {
    let mut row = vec![0f32; w.wk.cols];
    let mut size: Vec<f64> = (0..w.wk.rows)
        .map(|c| {
            w.wk.row_f32(c, &mut row);
            let wg: f64 = row.iter().zip(gain).map(|(&x, &g)| (x as f64 * g as f64).powi(2)).sum();
            let b = w.bk.as_ref().map_or(0.0, |b| b[c] as f64);
            (wg + b * b).sqrt()
        })
        .collect();
    let rms = |x: &[f64]| (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64).sqrt();
    for head in size.chunks_mut(hd) {
        if let Some(g) = &w.k_norm {
            let r = rms(head);
            head.iter_mut().zip(g).for_each(|(x, &g)| *x = *x / r * (g as f64).abs());
        }
        let half = rot_dim / 2;
        for i in 0..half {
            let (a, b) = match style {
                RopeStyle::NeoX => (i, i + half),
                RopeStyle::Interleaved => (2 * i, 2 * i + 1),
            };
            let m = ((head[a] * head[a] + head[b] * head[b]) / 2.0).sqrt();
            (head[a], head[b]) = (m, m);
        }
        let r = rms(head);
        head.iter_mut().for_each(|x| *x /= r);
    }
    // A channel of no size (a zero row) or a degenerate head keeps scale 1.
    size.iter()
        .map(|&x| if x.is_finite() && x > 0.0 { (x.log2().round().clamp(-24.0, 24.0) as f32).exp2() } else { 1.0 })
        .collect()
}

/// How an 8-bit cache stores its keys: each channel divided by its scale (a power of two), then
/// Walsh-Hadamard-transformed in blocks of `rot` values (`kvattn::hadamard`; rot divides
/// head_dim). Both keep a head's few large channels from setting its blocks' 8-bit scales
/// alone: the scales even out the channels' expected sizes (`key_scales`), the transform spreads
/// what is left. Scores need no keys back: q multiplied by the scales and transformed alike
/// (`query`) dots the stored keys to the same value, the transform being orthonormal and its
/// own inverse.
#[derive(Clone, Debug)]
pub struct KeyForm {
    pub rot: usize,
    /// Per channel of a cache row [n_kv_heads · head_dim]; empty: every scale 1.
    pub scale: Arc<[f32]>,
}

impl KeyForm {
    /// Rows of keys [n, kv_dim] into their stored form, in place.
    fn encode(&self, k: &mut [f32]) {
        if !self.scale.is_empty() {
            for row in k.chunks_exact_mut(self.scale.len()) {
                row.iter_mut().zip(&*self.scale).for_each(|(x, &s)| *x /= s);
            }
        }
        hadamard(k, self.rot);
    }

    /// Stored keys back, in place: x holds channels off.. of one row (whole heads), or whole rows
    /// from off = 0.
    pub(crate) fn decode(&self, x: &mut [f32], off: usize) {
        hadamard(x, self.rot);
        let s = &*self.scale;
        if s.is_empty() {
            return;
        }
        if off + x.len() <= s.len() {
            x.iter_mut().zip(&s[off..]).for_each(|(v, &s)| *v *= s);
        } else {
            assert!(
                off == 0 && x.len().is_multiple_of(s.len()),
                "key form: {} values from channel {off} of {}",
                x.len(),
                s.len()
            );
            x.chunks_exact_mut(s.len()).for_each(|row| row.iter_mut().zip(s).for_each(|(v, &s)| *v *= s));
        }
    }

    /// One row's queries [n_heads, hd] (heads in groups of `group` per kv head) into the form
    /// whose dot with a stored key is the query's dot with the key, in place.
    pub(crate) fn query(&self, q: &mut [f32], hd: usize, group: usize) {
        if !self.scale.is_empty() {
            for (h, head) in q.chunks_exact_mut(hd).enumerate() {
                let s = &self.scale[(h / group) * hd..][..hd];
                head.iter_mut().zip(s).for_each(|(x, &s)| *x *= s);
            }
        }
        hadamard(q, self.rot);
    }
}

impl Mixer for Attention {
    fn name(&self) -> &'static str {
        "softmax attention"
    }

    fn matrices(&self) -> Vec<&QTensor> {
        vec![&self.w.wq, &self.w.wk, &self.w.wv, &self.w.wo]
    }

    /// The key scales are made again from the weights after (states made before keep theirs).
    fn matrices_mut(&mut self) -> Vec<&mut QTensor> {
        self.key_scale = OnceLock::new();
        vec![&mut self.w.wq, &mut self.w.wk, &mut self.w.wv, &mut self.w.wo]
    }

    fn new_state(&self, kv: KvType) -> LayerState {
        let st = KvState::with_head(self.kv_dim, self.hd, kv);
        if kv != KvType::Q8 {
            return LayerState::new(st);
        }
        let scale = self.key_scale.get_or_init(|| key_scales(&self.w, &self.gain, self.hd, self.pairs).into());
        LayerState::new(st.with_key_scale(scale.clone()))
    }

    fn o1_serve(&self) -> Serve {
        match self.window {
            None => Serve::Planned,
            Some(w) => Serve::Sliding(w.max(1)),
        }
    }

    fn forward(&self, env: &Env, h: &[f32], n: usize, seq: Seq<'_>, trace: &mut dyn FnMut(&str, &[f32])) -> Result<Vec<f32>> {
        let cfg = env.cfg;
        let kv = &mut seq.state.of::<KvState>().cache;
        attention(cfg, &self.w, &cfg.ropes[self.rope], self.window, h, n, seq.pos0, kv, env.num, seq.lc, seq.o1, trace)
    }

    /// Decode rows only: the merged path of `forward_segments` (always row-wise for one
    /// position), so the decode rows of a step whose chunks run apart still share one pass.
    fn forward_rows(&self, env: &Env, h: &[f32], rows: Vec<Seq<'_>>) -> Result<Vec<f32>> {
        self.forward_segments(env, h, rows.into_iter().map(|s| (s, 1)).collect())
    }

    /// The projections over all n rows at once (each on the decode path), then each position's
    /// attention as its own step: in one dispatch for every position (`attention_rows`), or
    /// step by step where that path does not apply. A sealed O(1) state is journaled as its
    /// snapshot and the projected rows.
    fn forward_steps(&self, env: &Env, h: &[f32], n: usize, mut seq: Seq<'_>, journal: &mut Journal) -> Result<Vec<f32>> {
        let (q, k, v) = attn_project(&self.w, h, n, true);
        journal.begin(seq.state, n);
        if journal.is_recurrent() {
            journal.record = Some(Box::new((q.clone(), k.clone(), v.clone())));
        }
        let (o, gate) = self.steps_core(env, &q, &k, &v, n, &mut seq)?;
        Ok(attn_output(env.cfg, &self.w, o, gate.as_deref(), n, true, &mut |_, _| {}))
    }

    fn rewind(&self, env: &Env, mut seq: Seq<'_>, journal: &mut Journal, keep: usize) -> Result<()> {
        if journal.restore(seq.state) {
            let (q, k, v): &(Vec<f32>, Vec<f32>, Vec<f32>) = journal.record();
            let (qr, kvr) = (self.w.wq.rows, self.kv_dim);
            self.steps_core(env, &q[..keep * qr], &k[..keep * kvr], &v[..keep * kvr], keep, &mut seq)?;
        } else {
            seq.state.truncate(seq.pos0 + keep);
        }
        Ok(())
    }

    /// The input and output projections run over the rows of every segment at once when they
    /// are row-wise for its chunks (`QTensor::rowwise`: each row on the decode path, as the
    /// segment alone would have it), the attention itself per sequence on its own cache;
    /// otherwise the segments run apart.
    fn forward_segments(&self, env: &Env, h: &[f32], segs: Vec<(Seq<'_>, usize)>) -> Result<Vec<f32>> {
        let none = segs.iter().map(|_| None).collect();
        self.segments(env, h, segs, none)
    }

    /// The verified segments' projections join everyone's (one read of each weight for the
    /// step); their attention runs as `forward_steps` runs it, journaled the same way.
    fn forward_segments_steps(
        &self,
        env: &Env,
        h: &[f32],
        segs: Vec<(Seq<'_>, usize)>,
        steps: Vec<Option<&mut Journal>>,
    ) -> Result<Vec<f32>> {
        self.segments(env, h, segs, steps)
    }
}

impl Attention {
    /// `forward_segments` with the verified segments (`steps[i]` Some) stepped position by
    /// position (`steps_core`) and journaled as `forward_steps` journals them.
    fn segments(
        &self,
        env: &Env,
        h: &[f32],
        segs: Vec<(Seq<'_>, usize)>,
        mut steps: Vec<Option<&mut Journal>>,
    ) -> Result<Vec<f32>> {
        let n_max = segs.iter().map(|(_, n)| *n).max().unwrap_or(0);
        let w = &self.w;
        if segs.len() == 1 || ![&w.wq, &w.wk, &w.wv, &w.wo].iter().all(|m| m.rowwise(n_max)) {
            return if steps.iter().all(Option::is_none) {
                segments_apart(self, env, h, segs)
            } else {
                steps_apart(self, env, h, segs, steps)
            };
        }
        let cfg = env.cfg;
        let rope = &cfg.ropes[self.rope];
        let total: usize = segs.iter().map(|(_, n)| n).sum();
        let (q, k, v) = attn_project(w, h, total, true); // [total, wq.rows], [total, kv_dim] x2
        let (qr, kvr, q_dim) = (w.wq.rows, w.wk.rows, cfg.q_dim());
        let starts: Vec<usize> = segs.iter().scan(0, |r, (_, n)| Some(std::mem::replace(r, *r + n))).collect();
        let mut o = vec![0f32; total * q_dim]; // [total, n_heads, head_dim]
        let mut gate = if cfg.attn_gate { vec![0f32; total * q_dim] } else { Vec::new() }; // the same, gated
        let mut segs = segs;
        // The decode rows (one position each): every sequence's attention in one dispatch.
        let singles: Vec<usize> = (0..segs.len()).filter(|&i| segs[i].1 == 1 && steps[i].is_none()).collect();
        let mut singles_done = false;
        if singles.len() > 1 {
            let rows_of = |x: &[f32], width: usize| -> Vec<f32> {
                let mut out = Vec::with_capacity(singles.len() * width);
                for &i in &singles {
                    out.extend_from_slice(&x[starts[i] * width..(starts[i] + 1) * width]);
                }
                out
            };
            let gathered;
            let (qs, ks, vs): (&[f32], &[f32], &[f32]) = if singles.len() == segs.len() {
                (&q, &k, &v)
            } else {
                gathered = (rows_of(&q, qr), rows_of(&k, kvr), rows_of(&v, kvr));
                (&gathered.0, &gathered.1, &gathered.2)
            };
            let done = {
                let mut rows: Vec<DecodeSeq> = segs
                    .iter_mut()
                    .zip(&steps)
                    .filter(|((_, n), j)| *n == 1 && j.is_none())
                    .map(|((seq, _), _)| DecodeSeq {
                        pos0: seq.pos0,
                        n: 1,
                        kv: &mut seq.state.of::<KvState>().cache,
                        o1: &seq.o1,
                    })
                    .collect();
                attention_rows(cfg, w, rope, self.window, qs, ks, vs, env.num, &mut rows)
            };
            if let Some((os, gs)) = done {
                for (t, &i) in singles.iter().enumerate() {
                    let (at, from) = (starts[i] * q_dim..(starts[i] + 1) * q_dim, t * q_dim..(t + 1) * q_dim);
                    o[at.clone()].copy_from_slice(&os[from.clone()]);
                    if let Some(g) = &gs {
                        gate[at].copy_from_slice(&g[from]);
                    }
                }
                singles_done = true;
            }
        }
        // The prompt chunks (and the decode rows, where they could not share a dispatch).
        for (i, (mut seq, n)) in segs.into_iter().enumerate() {
            if singles_done && singles.contains(&i) {
                continue;
            }
            let (r, e) = (starts[i], starts[i] + n);
            let (oi, gi) = if let Some(journal) = steps[i].as_deref_mut() {
                // A verify: as `forward_steps` over these rows.
                let (qi, ki, vi) = (&q[r * qr..e * qr], &k[r * kvr..e * kvr], &v[r * kvr..e * kvr]);
                journal.begin(seq.state, n);
                if journal.is_recurrent() {
                    journal.record = Some(Box::new((qi.to_vec(), ki.to_vec(), vi.to_vec())));
                }
                self.steps_core(env, qi, ki, vi, n, &mut seq)?
            } else {
                let kv = &mut seq.state.of::<KvState>().cache;
                let (qi, ki, vi) = (q[r * qr..e * qr].to_vec(), k[r * kvr..e * kvr].to_vec(), v[r * kvr..e * kvr].to_vec());
                attention_core(cfg, w, rope, self.window, qi, ki, vi, n, seq.pos0, kv, env.num, seq.lc, seq.o1, &mut |_, _| {})?
            };
            o[r * q_dim..e * q_dim].copy_from_slice(&oi);
            if let Some(g) = gi {
                gate[r * q_dim..e * q_dim].copy_from_slice(&g);
            }
        }
        let gate = cfg.attn_gate.then_some(&gate[..]);
        Ok(attn_output(cfg, w, o, gate, total, true, &mut |_, _| {}))
    }
}

impl Attention {
    /// The attention of n projected positions (q [n, wq.rows], k, v [n, kv_dim]) of one
    /// sequence, each as its own decode step -> (o [n, n_heads, head_dim], the gate).
    fn steps_core(
        &self,
        env: &Env,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        n: usize,
        seq: &mut Seq<'_>,
    ) -> Result<(Vec<f32>, Option<Vec<f32>>)> {
        let cfg = env.cfg;
        let rope = &cfg.ropes[self.rope];
        let done = {
            let kv = &mut seq.state.of::<KvState>().cache;
            let mut one = [DecodeSeq { pos0: seq.pos0, n, kv, o1: &seq.o1 }];
            attention_rows(cfg, &self.w, rope, self.window, q, k, v, env.num, &mut one)
        };
        if let Some(r) = done {
            return Ok(r);
        }
        let (qr, kvr) = (self.w.wq.rows, self.kv_dim);
        let (mut o, mut gate) = (Vec::with_capacity(n * cfg.q_dim()), Vec::new());
        for i in 0..n {
            let kv = &mut seq.state.of::<KvState>().cache;
            let (qi, ki, vi) =
                (q[i * qr..(i + 1) * qr].to_vec(), k[i * kvr..(i + 1) * kvr].to_vec(), v[i * kvr..(i + 1) * kvr].to_vec());
            let (oi, gi) = attention_core(
                cfg,
                &self.w,
                rope,
                self.window,
                qi,
                ki,
                vi,
                1,
                seq.pos0 + i,
                kv,
                env.num,
                seq.lc,
                seq.o1.reborrow(),
                &mut |_, _| {},
            )?;
            o.extend(oi);
            gate.extend(gi.unwrap_or_default());
        }
        Ok((o, cfg.attn_gate.then_some(gate)))
    }
}

/// What an attention layer keeps of a sequence.
pub enum Cache {
    /// Keys and values of every position so far: each [len, n_kv_heads, head_dim].
    Kv { k: Vec<f32>, v: Vec<f32> },
    /// The same, stored as f16 (llama.cpp's default cache type): half the bytes. Values are
    /// rounded to nearest-even on append, as ggml's f32 -> f16 copy does.
    KvF16 { k: Vec<f16>, v: Vec<f16> },
    /// The same in 8 bits: blocks of `kvattn::Q8_BLOCK` values with one f32 scale each
    /// (`kvattn::quantize_q8`; kd, vd [len, kv_dim / Q8_BLOCK]), ~28% of f32's bytes. Keys are
    /// stored in `form` (scaled per channel and Walsh-Hadamard-transformed), so their few huge
    /// channels do not set a block's scale alone: decode takes q into the form alike,
    /// `f32_from` takes the keys back.
    KvQ8 { k: Vec<i8>, kd: Vec<f32>, v: Vec<i8>, vd: Vec<f32>, form: KeyForm },
    /// Sealed at the end of the prompt by an O(1) plan: sinks, a window ring and the Nyström
    /// skeleton's accumulators, constant size.
    O1(Box<O1Layer>),
}

impl Clone for Cache {
    fn clone(&self) -> Cache {
        match self {
            Cache::Kv { k, v } => Cache::Kv { k: k.clone(), v: v.clone() },
            Cache::KvF16 { k, v } => Cache::KvF16 { k: k.clone(), v: v.clone() },
            Cache::KvQ8 { k, kd, v, vd, form } => {
                Cache::KvQ8 { k: k.clone(), kd: kd.clone(), v: v.clone(), vd: vd.clone(), form: form.clone() }
            }
            Cache::O1(o) => Cache::O1(o.clone()),
        }
    }

    /// Into this cache's own buffers where the formats match (the prompt cache restores a slot
    /// this way: no allocation, no freed buffer left behind).
    fn clone_from(&mut self, src: &Cache) {
        match (self, src) {
            (Cache::Kv { k, v }, Cache::Kv { k: sk, v: sv }) => {
                k.clone_from(sk);
                v.clone_from(sv);
            }
            (Cache::KvF16 { k, v }, Cache::KvF16 { k: sk, v: sv }) => {
                k.clone_from(sk);
                v.clone_from(sv);
            }
            (Cache::KvQ8 { k, kd, v, vd, form }, Cache::KvQ8 { k: sk, kd: skd, v: sv, vd: svd, form: sform }) => {
                k.clone_from(sk);
                kd.clone_from(skd);
                v.clone_from(sv);
                vd.clone_from(svd);
                form.clone_from(sform);
            }
            (dst, src) => *dst = src.clone(),
        }
    }
}

impl Cache {
    /// Append positions' keys and values k, v [n, kv_dim] (rounded to f16 for an f16 cache,
    /// quantized for an 8-bit one).
    /// A sealed state takes its streaming step instead; calling this on one is a bug.
    pub(crate) fn append(&mut self, k: &[f32], v: &[f32]) {
        match self {
            Cache::Kv { k: kc, v: vc } => {
                kc.extend_from_slice(k);
                vc.extend_from_slice(v);
            }
            Cache::KvF16 { k: kc, v: vc } => {
                kc.extend(k.iter().map(|&x| f16::from_f32(x)));
                vc.extend(v.iter().map(|&x| f16::from_f32(x)));
            }
            Cache::KvQ8 { k: kc, kd, v: vc, vd, form } => {
                let mut kr = k.to_vec();
                form.encode(&mut kr);
                quantize_q8(&kr, kc, kd);
                quantize_q8(v, vc, vd);
            }
            Cache::O1(_) => unreachable!("a sealed state takes its streaming step, not an append"),
        }
    }

    /// The keys and values of positions lo.. as f32: borrowed from an f32 cache, an f16 one
    /// widened over that span alone (a sliding layer's window, not the whole context).
    pub(crate) fn f32_from(&self, lo: usize, kv_dim: usize) -> (Cow<'_, [f32]>, Cow<'_, [f32]>) {
        match self {
            Cache::Kv { k, v } => (Cow::Borrowed(&k[lo * kv_dim..]), Cow::Borrowed(&v[lo * kv_dim..])),
            Cache::KvF16 { k, v } => (
                Cow::Owned(k[lo * kv_dim..].iter().map(|x| x.to_f32()).collect()),
                Cow::Owned(v[lo * kv_dim..].iter().map(|x| x.to_f32()).collect()),
            ),
            Cache::KvQ8 { k, kd, v, vd, form } => {
                let (at, ad) = (lo * kv_dim, lo * kv_dim / Q8_BLOCK);
                let mut kf = dequantize_q8(&k[at..], &kd[ad..]);
                form.decode(&mut kf, 0);
                (Cow::Owned(kf), Cow::Owned(dequantize_q8(&v[at..], &vd[ad..])))
            }
            Cache::O1(_) => unreachable!("a sealed state has no cache rows to attend"),
        }
    }

    /// The keys and values in their stored type, for the decode kernel (`kvattn`), and the form
    /// the keys are stored in (None: as they are; else q is to be taken into it alike).
    pub(crate) fn rows(&self) -> (KvRows<'_>, KvRows<'_>, Option<&KeyForm>) {
        match self {
            Cache::Kv { k, v } => (KvRows::F32(k), KvRows::F32(v), None),
            Cache::KvF16 { k, v } => (KvRows::F16(k), KvRows::F16(v), None),
            Cache::KvQ8 { k, kd, v, vd, form } => (KvRows::Q8 { q: k, d: kd }, KvRows::Q8 { q: v, d: vd }, Some(form)),
            Cache::O1(_) => unreachable!("a sealed state has no cache rows to attend"),
        }
    }
}

/// An attention layer's per-sequence state: the cache, its row width and format (what `clear`
/// returns to), and whether a seal made it a sliding layer's bounded cache.
pub struct KvState {
    pub cache: Cache,
    /// Values per position in `k` and in `v` (n_kv_heads · head_dim).
    row: usize,
    kind: KvType,
    /// How an 8-bit cache stores its keys: Hadamard blocks of the largest power of two dividing
    /// head_dim, the layer's key scales (`with_key_scale`; none by default).
    form: KeyForm,
    /// Sealed as a sliding layer's window (counts as KV in `bytes`, not as O(1) state).
    sliding: bool,
}

impl Clone for KvState {
    fn clone(&self) -> KvState {
        KvState { cache: self.cache.clone(), row: self.row, kind: self.kind, form: self.form.clone(), sliding: self.sliding }
    }

    fn clone_from(&mut self, src: &KvState) {
        self.cache.clone_from(&src.cache);
        (self.row, self.kind, self.sliding) = (src.row, src.kind, src.sliding);
        self.form.clone_from(&src.form);
    }
}

impl KvState {
    /// An empty cache of `row` values per position (one head) in the stored type `kind`.
    pub fn new(row: usize, kind: KvType) -> KvState {
        KvState::with_head(row, row, kind)
    }

    /// An empty cache of `row` values per position, heads of `hd`, in the stored type `kind`
    /// (8-bit rows need heads in whole blocks: `Model::set_kv_type` checks the head size).
    pub fn with_head(row: usize, hd: usize, kind: KvType) -> KvState {
        assert!(kind != KvType::Q8 || hd % Q8_BLOCK == 0, "an 8-bit cache of {hd}-value heads");
        assert!(hd > 0 && row % hd == 0, "a cache row of {row} values in heads of {hd}");
        let form = KeyForm { rot: 1 << hd.trailing_zeros(), scale: Arc::from([]) };
        KvState { cache: KvState::empty(kind, &form), row, kind, form, sliding: false }
    }

    /// The same with an 8-bit cache's keys scaled per channel by `scale` [row] (powers of two:
    /// `key_scales`) before their transform.
    pub fn with_key_scale(mut self, scale: Arc<[f32]>) -> KvState {
        assert_eq!(scale.len(), self.row, "key scales for a row of {} values", self.row);
        self.form.scale = scale;
        self.cache = KvState::empty(self.kind, &self.form);
        self
    }

    fn empty(kind: KvType, form: &KeyForm) -> Cache {
        match kind {
            KvType::F32 => Cache::Kv { k: Vec::new(), v: Vec::new() },
            KvType::F16 => Cache::KvF16 { k: Vec::new(), v: Vec::new() },
            KvType::Q8 => Cache::KvQ8 { k: Vec::new(), kd: Vec::new(), v: Vec::new(), vd: Vec::new(), form: form.clone() },
        }
    }

    /// Replace the cache by its sealed O(1) state (`o1::O1Run::seal`); `sliding`: a sliding
    /// layer's bounded window rather than a planned layer.
    pub(crate) fn seal(&mut self, sealed: O1Layer, sliding: bool) {
        self.cache = Cache::O1(Box::new(sealed));
        self.sliding = sliding;
    }
}

impl MixerState for KvState {
    fn is_recurrent(&self) -> bool {
        matches!(self.cache, Cache::O1(_))
    }

    fn truncate(&mut self, len: usize) {
        let n = len * self.row;
        match &mut self.cache {
            Cache::Kv { k, v } => {
                k.truncate(n);
                v.truncate(n);
            }
            Cache::KvF16 { k, v } => {
                k.truncate(n);
                v.truncate(n);
            }
            Cache::KvQ8 { k, kd, v, vd, .. } => {
                k.truncate(n);
                v.truncate(n);
                kd.truncate(n / Q8_BLOCK);
                vd.truncate(n / Q8_BLOCK);
            }
            Cache::O1(_) => unreachable!("a sealed O(1) state is recurrent: a checkpoint snapshots it"),
        }
    }

    fn reserve(&mut self, extra: usize) {
        let n = extra * self.row;
        match &mut self.cache {
            Cache::Kv { k, v } => {
                k.reserve(n);
                v.reserve(n);
            }
            Cache::KvF16 { k, v } => {
                k.reserve(n);
                v.reserve(n);
            }
            Cache::KvQ8 { k, kd, v, vd, .. } => {
                k.reserve(n);
                v.reserve(n);
                kd.reserve(n / Q8_BLOCK);
                vd.reserve(n / Q8_BLOCK);
            }
            Cache::O1(_) => {}
        }
    }

    /// Back to an empty cache in the layer's format (a sealed layer too: an O(1) plan seals
    /// it again at the next prompt's end). A plain cache keeps its buffers: a serving slot
    /// reuses them for its next request rather than growing new ones (the allocator keeps
    /// freed KV buffers as holes it cannot always fill, which RSS counts).
    fn clear(&mut self) {
        match (&mut self.cache, self.kind) {
            (Cache::Kv { k, v }, KvType::F32) => {
                k.clear();
                v.clear();
            }
            (Cache::KvF16 { k, v }, KvType::F16) => {
                k.clear();
                v.clear();
            }
            (Cache::KvQ8 { k, kd, v, vd, .. }, KvType::Q8) => {
                k.clear();
                kd.clear();
                v.clear();
                vd.clear();
            }
            (c, kind) => *c = KvState::empty(kind, &self.form),
        }
        self.sliding = false;
    }

    fn save(&self, out: &mut Vec<u8>) -> std::result::Result<(), String> {
        use crate::codec::{put_f16s, put_f32s};
        match &self.cache {
            Cache::Kv { k, v } => {
                put_f32s(out, k);
                put_f32s(out, v);
            }
            Cache::KvF16 { k, v } => {
                put_f16s(out, k);
                put_f16s(out, v);
            }
            Cache::KvQ8 { k, kd, v, vd, .. } => {
                for (q, d) in [(k, kd), (v, vd)] {
                    out.extend(q.iter().map(|&x| x as u8));
                    put_f32s(out, d);
                }
            }
            Cache::O1(_) => return Err("a sealed constant-memory (O(1)) layer is not saved".into()),
        }
        Ok(())
    }

    fn load(&mut self, r: &mut &[u8], len: usize) -> std::result::Result<(), String> {
        use crate::codec::{get_f16s, get_f32s};
        let n = len * self.row;
        let mut q8 = |what: &str| -> std::result::Result<(Vec<i8>, Vec<f32>), String> {
            if r.len() < n {
                return Err(format!("8-bit {what}: {} bytes where {n} are needed", r.len()));
            }
            let (q, rest) = r.split_at(n);
            *r = rest;
            Ok((q.iter().map(|&b| b as i8).collect(), get_f32s(r, n / Q8_BLOCK, what)?))
        };
        self.cache = match self.kind {
            KvType::F16 => Cache::KvF16 { k: get_f16s(r, n, "f16 keys")?, v: get_f16s(r, n, "f16 values")? },
            KvType::F32 => Cache::Kv { k: get_f32s(r, n, "keys")?, v: get_f32s(r, n, "values")? },
            KvType::Q8 => {
                let ((k, kd), (v, vd)) = (q8("keys")?, q8("values")?);
                Cache::KvQ8 { k, kd, v, vd, form: self.form.clone() }
            }
        };
        self.sliding = false;
        Ok(())
    }

    fn bytes(&self) -> StateBytes {
        match &self.cache {
            Cache::Kv { k, v } => StateBytes { kv: (k.len() + v.len()) * 4, ..StateBytes::default() },
            Cache::KvF16 { k, v } => StateBytes { kv: (k.len() + v.len()) * 2, ..StateBytes::default() },
            Cache::KvQ8 { k, kd, v, vd, .. } => {
                StateBytes { kv: k.len() + v.len() + (kd.len() + vd.len()) * 4, ..StateBytes::default() }
            }
            Cache::O1(o) if self.sliding => StateBytes { kv: o.bytes(), ..StateBytes::default() },
            Cache::O1(o) => StateBytes { o1: o.bytes(), ..StateBytes::default() },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weights(wk: Vec<f32>, kv_dim: usize, d: usize, bk: Option<Vec<f32>>, k_norm: Option<Vec<f32>>) -> AttentionWeights {
        let m = |name: &str| QTensor::from_f32(name, 1, d, vec![0.0; d]);
        AttentionWeights {
            wq: m("q"),
            wk: QTensor::from_f32("k", kv_dim, d, wk),
            wv: m("v"),
            wo: m("o"),
            bq: None,
            bk,
            bv: None,
            q_norm: None,
            k_norm,
            bo: None,
            sinks: None,
        }
    }

    /// A key channel with a large bias gets a large scale, shared with its RoPE pair (NeoX:
    /// c, c + hd/2; interleaved: 2i, 2i + 1); the rest of its head and a plain head stay near 1;
    /// every scale is a power of two; the QK-norm's gain sets the sizes where there is one.
    #[test]
    fn key_scales_follow_the_channels_sizes() {
        let (hd, nkv, d) = (8usize, 2usize, 4usize);
        let kv_dim = hd * nkv;
        let wk: Vec<f32> = (0..kv_dim * d).map(|i| if i % d == i / d % d { 1.0 } else { 0.0 }).collect();
        let mut bk = vec![0f32; kv_dim];
        bk[1] = 64.0;
        let gain = vec![1f32; d];
        for (style, pair) in [(RopeStyle::NeoX, 5usize), (RopeStyle::Interleaved, 0)] {
            let s = key_scales(&weights(wk.clone(), kv_dim, d, Some(bk.clone()), None), &gain, hd, (style, hd));
            assert!(s.iter().all(|&x| x.log2().fract() == 0.0), "{style:?}: not powers of two: {s:?}");
            assert_eq!(s[1], s[pair], "{style:?}: the RoPE pair shares its scale: {s:?}");
            let rest = (0..hd).filter(|&c| c != 1 && c != pair).map(|c| s[c]).fold(0f32, f32::max);
            assert!(s[1] >= 16.0 * rest, "{style:?}: the biased channel {} vs the rest {rest}: {s:?}", s[1]);
            assert!(s[hd..].iter().all(|&x| x == s[hd]), "{style:?}: a plain head's scales differ: {s:?}");
        }
        // Partial rotary (4 of 8 dims, NeoX): channel 1 pairs with 3, the rest rotate with none.
        let s = key_scales(&weights(wk.clone(), kv_dim, d, Some(bk.clone()), None), &gain, hd, (RopeStyle::NeoX, 4));
        assert_eq!(s[1], s[3], "partial rotary: the pair (1, 3) shares its scale: {s:?}");
        assert!(s[1] >= 16.0 * s[5], "partial rotary: {s:?}");
        // With a QK-norm the norm's gain decides: a channel with gain 32 is the large one.
        let mut g = vec![1f32; hd];
        g[2] = 32.0;
        let s = key_scales(&weights(wk, kv_dim, d, None, Some(g)), &gain, hd, (RopeStyle::NeoX, hd));
        assert!(s[2] == s[6] && s[2] >= 16.0 * s[0], "{s:?}");
    }

    /// The layer's 8-bit states carry its key scales (the same for every state); other types
    /// are plain.
    #[test]
    fn eight_bit_states_carry_the_layers_key_scales() {
        let (hd, nkv, d) = (32usize, 2usize, 8usize);
        let kv_dim = hd * nkv;
        let wk: Vec<f32> = (0..kv_dim * d).map(|i| ((i * 29 % 31) as f32 - 15.0) / 8.0).collect();
        let bk: Vec<f32> = (0..kv_dim).map(|c| if c % 13 == 0 { 100.0 } else { 0.0 }).collect();
        let gain: Vec<f32> = (0..d).map(|i| 1.0 + i as f32 / 4.0).collect();
        let w = weights(wk.clone(), kv_dim, d, Some(bk.clone()), None);
        let pairs = (RopeStyle::NeoX, hd);
        let att = Attention { w, rope: 0, window: None, kv_dim, hd, gain: gain.clone(), pairs, key_scale: OnceLock::new() };
        let want = key_scales(&weights(wk, kv_dim, d, Some(bk), None), &gain, hd, pairs);
        assert!(want.iter().any(|&s| s != want[0]), "the case has channels of different sizes: {want:?}");
        for _ in 0..2 {
            let st = att.new_state(KvType::Q8);
            match &st.get::<KvState>().expect("an attention state").cache {
                Cache::KvQ8 { form, .. } => assert_eq!(&*form.scale, &want[..]),
                _ => panic!("an 8-bit state is not 8-bit"),
            }
        }
        let st = att.new_state(KvType::F16);
        assert!(matches!(st.get::<KvState>().unwrap().cache, Cache::KvF16 { .. }));
    }

    /// Keys taken into their stored form and back are the keys (to the transform's rounding),
    /// and a query taken into the form dots a stored key to the query's dot with the key.
    #[test]
    fn key_form_round_trips_and_keeps_scores() {
        let (hd, nkv, group) = (64usize, 2usize, 3usize);
        let kv_dim = hd * nkv;
        let scale: Vec<f32> = (0..kv_dim).map(|c| ((c * 7 % 9) as f32 - 4.0).exp2()).collect();
        let form = KeyForm { rot: hd, scale: scale.into() };
        let k: Vec<f32> = (0..2 * kv_dim).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        let q: Vec<f32> = (0..group * kv_dim).map(|i| ((i * 53 % 97) as f32 - 48.0) / 9.0).collect();
        let mut stored = k.clone();
        form.encode(&mut stored);
        let mut back = stored.clone();
        form.decode(&mut back, 0);
        // The transform rounds in the scaled domain (≤ 6 f32 roundings of values up to the
        // largest |k / s|); the scale takes that back exactly.
        let big = k.iter().enumerate().map(|(i, x)| (x / form.scale[i % kv_dim]).abs()).fold(0f32, f32::max);
        for (i, (b, x)) in back.iter().zip(&k).enumerate() {
            assert!((b - x).abs() <= 1e-6 * big * form.scale[i % kv_dim], "round trip: {b} for {x} at {i}");
        }
        // One head of the second row, from its offset in the row.
        let mut head = stored[kv_dim + hd..kv_dim + 2 * hd].to_vec();
        form.decode(&mut head, hd);
        assert!(head.iter().zip(&back[kv_dim + hd..]).all(|(x, y)| x == y), "a head from its offset differs from its row");
        let mut qf = q.clone();
        form.query(&mut qf, hd, group);
        for h in 0..group * nkv {
            let kvh = h / group;
            let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum::<f64>();
            let want = dot(&q[h * hd..][..hd], &k[kvh * hd..][..hd]);
            let got = dot(&qf[h * hd..][..hd], &stored[kvh * hd..][..hd]);
            assert!((want - got).abs() <= 1e-4 * want.abs().max(1.0), "head {h}: {got} vs {want}");
        }
    }
}

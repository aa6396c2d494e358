//! Kimi Delta Attention (Kimi Linear's linear-attention mixer): q, k, v projections behind one
//! depthwise short convolution + SiLU (the checkpoint's three convolutions side by side),
//! L2-normalized q and k (q also × 1/√d), a decay per key channel from a low-rank forget gate,
//! g = −exp(A_log[h])·softplus(f_b(f_a(x)) + dt_bias), β = σ(b_proj·x), the delta rule with
//! per-channel decay (`kernels::delta`: chunked WY form for prefill, the recurrence for one
//! token), then a σ-gated RMSNorm per head whose
//! gate is low-rank (g_b(g_a(x))), and the output projection. Heads: n_q = n_k = n_v.

use cortiq_kernels::conv::causal_conv1d_par;
use cortiq_kernels::delta::{CHUNK, kda_chunked, kda_recurrent};

use crate::error::{EngineError, Result};
pub use crate::geometry::KdaConfig;
use crate::mixers::{Env, Journal, KvType, LayerState, Mixer, MixerState, Seq, StateBytes, rows_or_verifies};
use crate::par::pool;
use crate::profile::{self, Op};
use crate::qtensor::QTensor;
use crate::weights::TensorSource;

pub struct KdaWeights {
    /// [3·dim, d_model]: q | k | v.
    pub qkv: QTensor,
    /// [3·dim, conv_kernel]
    pub conv: Vec<f32>,
    /// [d_head, d_model] then [dim, d_head]: the forget gate's low-rank projection.
    pub f_a: QTensor,
    pub f_b: QTensor,
    /// [dim]
    pub dt_bias: Vec<f32>,
    /// [n_heads]: −exp(A_log).
    pub a: Vec<f32>,
    /// [n_heads, d_model]
    pub b_proj: QTensor,
    /// [d_head, d_model] then [dim, d_head]: the output gate's low-rank projection.
    pub g_a: QTensor,
    pub g_b: QTensor,
    /// [d_head]
    pub o_norm: Vec<f32>,
    /// [d_model, dim]
    pub o_proj: QTensor,
}

#[derive(Debug, PartialEq)]
pub struct KdaState {
    /// [conv_kernel − 1, 3·dim]
    pub conv: Vec<f32>,
    /// [n_heads, d_head, d_head]
    pub s: Vec<f32>,
}

/// By hand for `clone_from`: a verify's snapshot is copied into the buffers of the last one,
/// the recurrent matrices (megabytes per layer) over the pool.
impl Clone for KdaState {
    fn clone(&self) -> KdaState {
        KdaState { conv: self.conv.clone(), s: self.s.clone() }
    }
    fn clone_from(&mut self, o: &KdaState) {
        self.conv.clone_from(&o.conv);
        if self.s.len() != o.s.len() {
            self.s.clone_from(&o.s);
            return;
        }
        pool().for_rows_mut(&mut self.s, 1 << 14, 1, |r0, rows| rows.copy_from_slice(&o.s[r0 * (1 << 14)..][..rows.len()]));
    }
}

impl KdaState {
    pub fn new(c: &KdaConfig) -> KdaState {
        KdaState { conv: vec![0.0; (c.conv_kernel - 1) * 3 * c.dim()], s: vec![0.0; c.n_heads * c.d_head * c.d_head] }
    }
    pub fn bytes(&self) -> usize {
        (self.conv.len() + self.s.len()) * 4
    }
}

impl MixerState for KdaState {
    fn is_recurrent(&self) -> bool {
        true
    }
    fn clear(&mut self) {
        self.conv.fill(0.0);
        self.s.fill(0.0);
    }
    fn save(&self, out: &mut Vec<u8>) -> std::result::Result<(), String> {
        crate::codec::put_f32s(out, &self.conv);
        crate::codec::put_f32s(out, &self.s);
        Ok(())
    }
    fn load(&mut self, r: &mut &[u8], _len: usize) -> std::result::Result<(), String> {
        self.conv = crate::codec::get_f32s(r, self.conv.len(), "KDA conv state")?;
        self.s = crate::codec::get_f32s(r, self.s.len(), "KDA recurrent state")?;
        Ok(())
    }
    fn bytes(&self) -> StateBytes {
        StateBytes { recurrent: KdaState::bytes(self), ..StateBytes::default() }
    }
}

/// A KDA layer: its geometry and weights.
pub struct Kda {
    pub cfg: KdaConfig,
    pub w: KdaWeights,
}

impl Kda {
    pub fn load(src: &dyn TensorSource, c: KdaConfig, il: usize) -> Result<Kda> {
        Ok(Kda { w: load_kda(src, &c, il)?, cfg: c })
    }
}

impl Mixer for Kda {
    /// The chunked delta-rule kernel chunks from a call's start.
    fn cut_grid(&self) -> usize {
        CHUNK
    }

    fn name(&self) -> &'static str {
        "Kimi delta attention"
    }
    fn matrices(&self) -> Vec<&QTensor> {
        let k = &self.w;
        vec![&k.qkv, &k.f_a, &k.f_b, &k.b_proj, &k.g_a, &k.g_b, &k.o_proj]
    }
    fn matrices_mut(&mut self) -> Vec<&mut QTensor> {
        let k = &mut self.w;
        vec![&mut k.qkv, &mut k.f_a, &mut k.f_b, &mut k.b_proj, &mut k.g_a, &mut k.g_b, &mut k.o_proj]
    }
    fn new_state(&self, _kv: KvType) -> LayerState {
        LayerState::new(KdaState::new(&self.cfg))
    }
    fn forward(&self, _env: &Env, h: &[f32], n: usize, seq: Seq<'_>, _trace: &mut dyn FnMut(&str, &[f32])) -> Result<Vec<f32>> {
        Ok(kda(&self.cfg, &self.w, h, n, seq.state.of()))
    }
    /// The projections (q|k|v, both low-rank gates, β, output) over all rows at once (each row
    /// on the decode path, `QTensor::matvec_rows`); conv ring and delta state per sequence.
    fn forward_rows(&self, _env: &Env, h: &[f32], rows: Vec<Seq<'_>>) -> Result<Vec<f32>> {
        let c = &self.cfg;
        let kb = rows.len();
        let p = project(&self.w, h, kb, true);
        let mut o = Vec::with_capacity(kb * c.dim()); // [kb, dim]
        for (i, seq) in rows.into_iter().enumerate() {
            o.extend(core(c, &self.w, &p.row(c, i), 1, seq.state.of()));
        }
        Ok(self.w.o_proj.project(&o, kb, true)) // [kb, d_model]
    }
    /// Decode rows and verifies together (a step with no prompt chunk): the projections over
    /// every row at once, then per sequence its row, or its verified positions one at a time
    /// journaled as `forward_steps` journals them.
    fn forward_rows_verifies(
        &self,
        _env: &Env,
        h: &[f32],
        segs: Vec<(Seq<'_>, usize)>,
        verifies: Vec<Option<&mut Journal>>,
    ) -> Result<Vec<f32>> {
        let c = &self.cfg;
        let total: usize = segs.iter().map(|(_, n)| n).sum();
        let p = project(&self.w, h, total, true);
        let o = rows_or_verifies(
            segs,
            verifies,
            |r0, n| p.rows(c, r0, n),
            |part, n, verify, st| match verify {
                true => steps(c, &self.w, part, n, st.of()),
                false => core(c, &self.w, part, 1, st.of()),
            },
        ); // [total, dim]
        Ok(self.w.o_proj.project(&o, total, true)) // [total, d_model]
    }
    /// The projections over all n rows at once (each on the decode path), then the conv ring
    /// and the delta rule one position at a time; journaled as the state's snapshot and the
    /// projected rows.
    fn forward_steps(&self, _env: &Env, h: &[f32], n: usize, seq: Seq<'_>, journal: &mut Journal) -> Result<Vec<f32>> {
        let p = project(&self.w, h, n, true);
        journal.begin(seq.state, n);
        let o = steps(&self.cfg, &self.w, &p, n, seq.state.of());
        journal.record = Some(Box::new(p));
        Ok(self.w.o_proj.project(&o, n, true)) // [n, d_model]
    }
    fn rewind(&self, _env: &Env, seq: Seq<'_>, journal: &mut Journal, keep: usize) -> Result<()> {
        assert!(journal.restore(seq.state), "a KDA state is recurrent: forward_steps snapshotted it");
        steps(&self.cfg, &self.w, journal.record(), keep, seq.state.of());
        Ok(())
    }
}

/// The first `n` projected rows of `p`, each as its own decode step on `state` -> o [n, dim].
fn steps(c: &KdaConfig, w: &KdaWeights, p: &Projected, n: usize, state: &mut KdaState) -> Vec<f32> {
    let mut o = Vec::with_capacity(n * c.dim()); // [n, dim]
    for i in 0..n {
        o.extend(core(c, w, &p.row(c, i), 1, state));
    }
    o
}

/// A KDA layer: q/k/v projections joined into one [3·dim, d] tensor (their three depthwise
/// convolutions side by side), the low-rank forget and output gates, β, the σ-gated norm.
fn load_kda(src: &dyn TensorSource, c: &KdaConfig, il: usize) -> Result<KdaWeights> {
    let n = |s: &str| format!("blk.{il}.{s}");
    let (d, dim, dh) = (c.d_model, c.dim(), c.d_head);
    let (q, k, v) = (
        src.require(&n("attn_q.weight"), dim, d)?,
        src.require(&n("attn_k.weight"), dim, d)?,
        src.require(&n("attn_v.weight"), dim, d)?,
    );
    let qkv = QTensor::concat_rows(n("attn_qkv.weight"), &[&q, &k, &v]).ok_or_else(|| EngineError::BadConfig {
        file: src.file(),
        what: format!("{}: q, k and v projections differ in type or width", n("attn_q.weight")),
    })?;
    let mut conv = Vec::with_capacity(3 * dim * c.conv_kernel);
    for part in ["q", "k", "v"] {
        conv.extend(src.require(&n(&format!("ssm_conv1d_{part}.weight")), dim, c.conv_kernel)?.to_f32());
    }
    Ok(KdaWeights {
        qkv,
        conv,
        f_a: src.require(&n("ssm_f_a.weight"), dh, d)?,
        f_b: src.require(&n("ssm_f_b.weight"), dim, dh)?,
        dt_bias: src.vector(&n("ssm_dt.bias"), dim)?,
        a: src.vector(&n("ssm_a"), c.n_heads)?,
        b_proj: src.require(&n("ssm_beta.weight"), c.n_heads, d)?,
        g_a: src.require(&n("ssm_g_a.weight"), dh, d)?,
        g_b: src.require(&n("ssm_g_b.weight"), dim, dh)?,
        o_norm: src.vector(&n("ssm_norm.weight"), dh)?,
        o_proj: src.require(&n("attn_output.weight"), d, dim)?,
    })
}

fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// x / sqrt(Σx² + 1e-6) (FLA's l2norm as Kimi uses it), times `scale`.
fn l2norm(x: &mut [f32], scale: f32) {
    let n = (x.iter().map(|v| v * v).sum::<f32>() + 1e-6).sqrt();
    x.iter_mut().for_each(|v| *v = *v / n * scale);
}

/// The mixer over `n` tokens. h: [n, d_model] -> [n, d_model].
pub fn kda(c: &KdaConfig, w: &KdaWeights, h: &[f32], n: usize, state: &mut KdaState) -> Vec<f32> {
    let p = project(w, h, n, false);
    let o = core(c, w, &p, n, state);
    w.o_proj.project(&o, n, false) // [n, d_model]
}

/// The input projections of `n` rows.
struct Projected {
    mixed: Vec<f32>, // [n, 3·dim]
    g: Vec<f32>,     // [n, dim] forget-gate input
    b: Vec<f32>,     // [n, n_heads]
    gate: Vec<f32>,  // [n, dim] output-gate input
}

impl Projected {
    /// Row i alone.
    fn row(&self, c: &KdaConfig, i: usize) -> Projected {
        self.rows(c, i, 1)
    }

    /// Rows r0..r0 + n.
    fn rows(&self, c: &KdaConfig, r0: usize, n: usize) -> Projected {
        let (dim, nh) = (c.dim(), c.n_heads);
        Projected {
            mixed: self.mixed[r0 * 3 * dim..(r0 + n) * 3 * dim].to_vec(),
            g: self.g[r0 * dim..(r0 + n) * dim].to_vec(),
            b: self.b[r0 * nh..(r0 + n) * nh].to_vec(),
            gate: self.gate[r0 * dim..(r0 + n) * dim].to_vec(),
        }
    }
}

/// h [n, d_model] through the input projections; `rows`: n independent decode rows
/// (`matvec_rows`, each row as its own n = 1 step) rather than n positions of one sequence.
fn project(w: &KdaWeights, h: &[f32], n: usize, rows: bool) -> Projected {
    let mm = |t: &QTensor, x: &[f32]| t.project(x, n, rows);
    let fa = mm(&w.f_a, h); // [n, d_head]
    let ga = mm(&w.g_a, h); // [n, d_head]
    Projected { mixed: mm(&w.qkv, h), g: mm(&w.f_b, &fa), b: mm(&w.b_proj, h), gate: mm(&w.g_b, &ga) }
}

/// Conv, delta rule and gated norm over `n` positions of one sequence -> o [n, dim] (before
/// the output projection); `state` is advanced by the n positions.
fn core(c: &KdaConfig, w: &KdaWeights, p: &Projected, n: usize, state: &mut KdaState) -> Vec<f32> {
    let (nh, dh, dim) = (c.n_heads, c.d_head, c.dim());
    let (g, b, gate) = (&p.g, &p.b, &p.gate);
    let conv_span = profile::span(Op::Mixer);
    let mut conv = vec![0f32; n * 3 * dim]; // [n, 3·dim]
    causal_conv1d_par(pool(), &p.mixed, n, 3 * dim, &w.conv, c.conv_kernel, &[], &mut state.conv, true, &mut conv);
    drop(conv_span);

    let mixer_span = profile::span(Op::Mixer);
    let mut per_head = vec![0f32; nh * n * dh]; // [n_heads, n, d_head]
    let qscale = 1.0 / (dh as f32).sqrt();
    let mut work: Vec<(&mut [f32], &mut [f32])> = per_head.chunks_mut(n * dh).zip(state.s.chunks_mut(dh * dh)).collect();
    pool().for_rows_mut_dynamic(&mut work, 1, 1, |hh, items| {
        let (out_h, s_h) = &mut items[0];
        let (mut q, mut k, mut v) = (vec![0f32; n * dh], vec![0f32; n * dh], vec![0f32; n * dh]);
        let mut gh = vec![0f32; n * dh]; // [n, d_head] log decays
        let mut beta = vec![0f32; n];
        for t in 0..n {
            let row = &conv[t * 3 * dim..(t + 1) * 3 * dim];
            q[t * dh..(t + 1) * dh].copy_from_slice(&row[hh * dh..(hh + 1) * dh]);
            k[t * dh..(t + 1) * dh].copy_from_slice(&row[dim + hh * dh..dim + (hh + 1) * dh]);
            v[t * dh..(t + 1) * dh].copy_from_slice(&row[2 * dim + hh * dh..2 * dim + (hh + 1) * dh]);
            l2norm(&mut q[t * dh..(t + 1) * dh], qscale);
            l2norm(&mut k[t * dh..(t + 1) * dh], 1.0);
            for ch in 0..dh {
                let i = hh * dh + ch;
                gh[t * dh + ch] = w.a[hh] * softplus(g[t * dim + i] + w.dt_bias[i]);
            }
            beta[t] = 1.0 / (1.0 + (-b[t * nh + hh]).exp());
        }
        if n == 1 {
            kda_recurrent(&q, &k, &v, &gh, &beta, n, dh, dh, s_h, out_h);
        } else {
            kda_chunked(&q, &k, &v, &gh, &beta, n, dh, dh, CHUNK, s_h, out_h);
        }
    });
    drop(work);
    // σ-gated RMSNorm per (token, head).
    let mut o = vec![0f32; n * dim]; // [n, dim]
    for t in 0..n {
        for hh in 0..nh {
            let src = &per_head[(hh * n + t) * dh..(hh * n + t + 1) * dh];
            let ms: f32 = src.iter().map(|x| x * x).sum::<f32>() / dh as f32;
            let inv = 1.0 / (ms + c.norm_eps).sqrt();
            for ch in 0..dh {
                let z = gate[t * dim + hh * dh + ch];
                o[t * dim + hh * dh + ch] = src[ch] * inv * w.o_norm[ch] / (1.0 + (-z).exp());
            }
        }
    }
    drop(mixer_span);
    o
}

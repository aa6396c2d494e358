//! vmf_phase with a window (issue 16, `vmf_phase.window` / `sinks` > 0): a converted layer keeps
//! softmax attention over its first `sinks` positions and its last `window` (its own W_q, W_k,
//! W_v, W_o, biases, QK-norms and RoPE, as stored), and the vmf_phase core stands for every key
//! that has left the window, as one more slot of the same softmax. Per query head h at
//! position t, N_t = {j ≤ t : j < sinks or j > t − window}, s_tj = scale·q_t·k_j:
//! ```text
//! o_t = (Σ_{j∈N_t} e^{s_tj} v_j + e^{b_t} f_t) / (Σ_{j∈N_t} e^{s_tj} + e^{b_t})
//! b_t = x_t·slotᵀ + slot_b                  (per head: `vmf_slot.{weight,bias}` [n_heads, d])
//! f_t = the core's output for h (output norm included), its state holding the keys
//!       sinks ≤ j ≤ t − window, each written at t = j + window (delayed write), decayed
//!       λ^{t − j − window}; φk_j and κ_j from the core's own conv'd input, v_j the attention's
//! out = W_o · o
//! ```
//! The slot joins at t = sinks + window, when the first key has left: before it the layer is
//! exact attention.
//! The core's states are the layer's KV heads and its values their value rows. The
//! definition, its backward and gradcheck are `cortiq_train::vmf_window`; the f64 reference is
//! tools/fixtures/gen_vmf.py (`--window`).
//!
//! State per sequence (constant size): a ring of the sinks and the last `window` positions (the
//! roped key, the value, φk and κ of each: the key and value for the softmax, the rest for the
//! write when the ring lets the position go), the core's state and its conv ring.
//!
//! Prefill runs the core's chunk-parallel form over the chunk's shifted rows (row t carries
//! key t − window, from the ring or from the chunk itself; κ = 0 where no key leaves) and the
//! softmax over ring ∪ chunk; decode and `forward_steps` take the recurrence, so the k-position
//! verify equals single steps bit for bit. The softmax reads each row's near keys as the same
//! runs of positions however the sequence was cut (`near_runs`), in place from the ring in a
//! decode step. Written here rather than taken from a crate: it is
//! a step of the model's forward.

use cortiq_kernels::kvattn::{Exp, KvRows, ScoreRule, Split, attend_split, merge, part_len};
use cortiq_kernels::vmf::{self as kvmf, CHUNK};

use crate::config::{LayerSpec, ModelConfig};
use crate::error::{EngineError, Result};
use crate::mixers::attention::{AttentionWeights, attn_output, attn_prep, attn_project};
use crate::mixers::vmf::{CoreWeights, Projected, VmfConfig, VmfState, core, features};
use crate::mixers::{Env, Journal, KvType, LayerState, Mixer, MixerState, Seq, StateBytes};
use crate::numerics::Numerics;
use crate::par::pool;
use crate::profile::{self, Op};
use crate::qtensor::QTensor;
use crate::weights::TensorSource;

/// A windowed vmf_phase layer.
pub struct VmfWindow {
    pub cfg: VmfConfig,
    /// The attention's own projections (W_v and W_o are the core's values and output too).
    pub att: AttentionWeights,
    /// Index into `ModelConfig::ropes`.
    rope: usize,
    pub core: CoreWeights,
    /// The slot logit's map: [n_heads, d_model] and [n_heads].
    pub slot: QTensor,
    pub slot_b: Vec<f32>,
}

impl VmfWindow {
    /// From its parts (the converter builds one to rank layers by their sink+window cost).
    pub fn new(
        cfg: VmfConfig,
        att: AttentionWeights,
        rope: usize,
        core: CoreWeights,
        slot: QTensor,
        slot_b: Vec<f32>,
    ) -> VmfWindow {
        VmfWindow { cfg, att, rope, core, slot, slot_b }
    }

    /// Layer `il` by GGUF names: the attention's tensors, the core's (no vmf_v / vmf_out) and
    /// the slot's.
    pub fn load(src: &dyn TensorSource, mc: &ModelConfig, c: VmfConfig, il: usize, spec: &LayerSpec) -> Result<VmfWindow> {
        let n = |s: &str| format!("blk.{il}.{s}");
        let (d, nh) = (c.d_model, c.n_heads);
        let att = crate::mixers::attention::Attention::load(src, mc, il, spec)?.w;
        for t in [n("vmf_v.weight"), n("vmf_out.weight")] {
            if src.get(&t)?.is_some() {
                return Err(EngineError::BadConfig {
                    file: src.file(),
                    what: format!("{t}: a windowed vmf_phase layer takes its values and output from the attention's tensors"),
                });
            }
        }
        Ok(VmfWindow {
            cfg: c,
            att,
            rope: spec.rope,
            core: CoreWeights::load(src, &c, il)?,
            slot: src.require(&n("vmf_slot.weight"), nh, d)?,
            slot_b: src.vector(&n("vmf_slot.bias"), nh)?,
        })
    }
}

/// One sequence's state: the ring of sinks + window positions and the core's state.
#[derive(Clone, Debug, PartialEq)]
pub struct WindowState {
    /// [sinks + window, n_kv·hd] roped keys and values.
    k: Vec<f32>,
    v: Vec<f32>,
    /// [sinks + window, n_kv, F] and [sinks + window, n_kv]: the core's key features and gate.
    phk: Vec<f32>,
    kappa: Vec<f32>,
    pub core: VmfState,
}

impl WindowState {
    pub fn new(c: &VmfConfig) -> WindowState {
        let rows = c.sinks + c.window;
        let nk = c.n_k_heads;
        WindowState {
            k: vec![0.0; rows * nk * c.d_v],
            v: vec![0.0; rows * nk * c.d_v],
            phk: vec![0.0; rows * nk * c.f()],
            kappa: vec![0.0; rows * nk],
            core: VmfState::new(c),
        }
    }
}

/// The ring slot of position j: the sinks first, then the window's positions modulo its length.
fn slot_of(c: &VmfConfig, j: usize) -> usize {
    if j < c.sinks { j } else { c.sinks + (j - c.sinks) % c.window }
}

/// Row t's near keys as the softmax reads them, in position order: the sinks [0, min(S, t + 1)),
/// then the window's positions max(S, t + 1 − W)..=t cut after each position j with
/// (j − S) mod W = W − 1 (where the ring wraps) -> three runs [a, b), some empty. Each run's
/// positions sit in consecutive rows of the ring.
fn near_runs(c: &VmfConfig, t: usize) -> [(usize, usize); 3] {
    let (s, w) = (c.sinks, c.window);
    let hi = t + 1;
    let lo = (hi.saturating_sub(w)).max(s).min(hi);
    let cut = if lo < hi { (lo + w - (lo - s) % w).min(hi) } else { hi };
    [(0, s.min(hi)), (lo, cut), (cut, hi)]
}

/// A call's near keys where the ring cannot serve them: several rows read the positions
/// e0..pos0 + n in order (those before pos0 copied from the ring before it takes the call's
/// rows, then the rows themselves), the sinks from the ring when the call starts past them. A
/// single row reads all of them from the ring, which holds it already (`None`).
struct Near {
    e0: usize,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Near {
    fn copy(c: &VmfConfig, r: &Rows, i0: usize, n: usize, pos0: usize, ring: &WindowState) -> Option<Near> {
        if n == 1 {
            return None;
        }
        let kvd = c.n_k_heads * c.d_v;
        let e0 = if pos0 < c.sinks { 0 } else { (pos0 + 1).saturating_sub(c.window).max(c.sinks) };
        let (mut k, mut v) = (Vec::with_capacity((pos0 + n - e0) * kvd), Vec::with_capacity((pos0 + n - e0) * kvd));
        for j in e0..pos0 {
            let sl = slot_of(c, j) * kvd;
            k.extend_from_slice(&ring.k[sl..sl + kvd]);
            v.extend_from_slice(&ring.v[sl..sl + kvd]);
        }
        k.extend_from_slice(&r.k[i0 * kvd..(i0 + n) * kvd]);
        v.extend_from_slice(&r.v[i0 * kvd..(i0 + n) * kvd]);
        Some(Near { e0, k, v })
    }
}

/// The run of near keys starting at position a: (keys, values, its first row in them). The
/// sinks' run starts at 0, before a copy's e0 whenever the call starts past them.
fn near_span<'a>(c: &VmfConfig, near: Option<&'a Near>, ring: &'a WindowState, a: usize) -> (&'a [f32], &'a [f32], usize) {
    match near {
        Some(nr) if a >= nr.e0 => (&nr.k, &nr.v, a - nr.e0),
        _ => (&ring.k, &ring.v, slot_of(c, a)),
    }
}

/// The ring takes the rows `i0..i0 + n` of `r` (positions `pos0..`) that it keeps: the sinks
/// and the last W positions. Before the softmax: the core's write took the keys leaving
/// (`VmfWindow::run`'s shifted rows) and `Near::copy` the window the call's rows read.
fn keep_rows(c: &VmfConfig, r: &Rows, i0: usize, n: usize, pos0: usize, st: &mut WindowState) {
    let (nk, f) = (c.n_k_heads, c.f());
    let kvd = nk * c.d_v;
    for i in 0..n {
        let (t, ri) = (pos0 + i, i0 + i);
        if t >= c.sinks && t + c.window < pos0 + n {
            continue; // written and overwritten within this call
        }
        let sl = slot_of(c, t);
        st.k[sl * kvd..][..kvd].copy_from_slice(&r.k[ri * kvd..][..kvd]);
        st.v[sl * kvd..][..kvd].copy_from_slice(&r.v[ri * kvd..][..kvd]);
        st.phk[sl * nk * f..][..nk * f].copy_from_slice(&r.feat.phk[ri * nk * f..][..nk * f]);
        st.kappa[sl * nk..][..nk].copy_from_slice(&r.feat.kappa[ri * nk..][..nk]);
    }
}

impl MixerState for WindowState {
    fn is_recurrent(&self) -> bool {
        true
    }
    fn clear(&mut self) {
        for a in [&mut self.k, &mut self.v, &mut self.phk, &mut self.kappa] {
            a.fill(0.0);
        }
        self.core.clear();
    }
    fn save(&self, out: &mut Vec<u8>) -> std::result::Result<(), String> {
        for a in [&self.k, &self.v, &self.phk, &self.kappa] {
            crate::codec::put_f32s(out, a);
        }
        self.core.save(out)
    }
    fn load(&mut self, r: &mut &[u8], len: usize) -> std::result::Result<(), String> {
        self.k = crate::codec::get_f32s(r, self.k.len(), "vmf_phase window keys")?;
        self.v = crate::codec::get_f32s(r, self.v.len(), "vmf_phase window values")?;
        self.phk = crate::codec::get_f32s(r, self.phk.len(), "vmf_phase window key features")?;
        self.kappa = crate::codec::get_f32s(r, self.kappa.len(), "vmf_phase window gates")?;
        self.core.load(r, len)
    }
    /// All of it is constant-size state (the ring's sinks + window rows included): recurrent.
    fn bytes(&self) -> StateBytes {
        let ring = (self.k.len() + self.v.len() + self.phk.len() + self.kappa.len()) * 4;
        StateBytes { recurrent: ring + self.core.bytes().recurrent, ..StateBytes::default() }
    }
}

/// A chunk's projected rows: q [n, n_heads·hd] and k, v [n, n_kv·hd] after biases, norms and
/// RoPE; the core's φq, φk, κ; the slot logits [n, n_heads].
struct Rows {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    feat: Projected,
    b: Vec<f32>,
}

impl VmfWindow {
    /// The projections of n rows of one sequence from `pos0` (`rows`: each on the decode path;
    /// the conv then runs row by row, as n single steps run it).
    fn project(&self, env: &Env, h: &[f32], n: usize, pos0: usize, st: &mut WindowState, rows: bool) -> Rows {
        let (c, d) = (&self.cfg, self.cfg.d_model);
        let (mut q, mut k, mut v) = attn_project(&self.att, h, n, rows);
        let gate = attn_prep(env.cfg, &self.att, &env.cfg.ropes[self.rope], &mut q, &mut k, &mut v, n, pos0, env.num);
        debug_assert!(gate.is_none(), "the plan refuses gated attention");
        let x = if rows {
            h.chunks_exact(d).flat_map(|hr| self.core.conv(c, hr, &mut [&mut st.core.conv], false)).collect()
        } else {
            self.core.conv(c, h, &mut [&mut st.core.conv], false)
        };
        let feat = features(c, &self.core, &x, n, rows);
        let mut b = self.slot.project(h, n, rows); // [n, n_heads]
        crate::mixers::add_bias(&mut b, &self.slot_b);
        Rows { q, k, v, feat, b }
    }

    /// Rows `i0..i0 + n` of `r` at positions `pos0..pos0 + n`: the core over the shifted rows
    /// (n = 1: the recurrence), the ring updated, the softmax over the near keys with the slot
    /// -> o [n, n_heads·hd] before W_o.
    fn run(&self, env: &Env, r: &Rows, i0: usize, n: usize, pos0: usize, st: &mut WindowState) -> Vec<f32> {
        let c = &self.cfg;
        let (nh, nk, hd, f, g) = (c.n_heads, c.n_k_heads, c.d_v, c.f(), c.group());
        let (s, w) = (c.sinks, c.window);
        let kvd = nk * hd;
        // The core's inputs: row t carries key j = t − W when S ≤ j (from this call's rows when
        // j ≥ pos0, else from the ring), nothing (κ = 0) otherwise.
        let mut sh = Projected {
            phq: r.feat.phq[i0 * nh * f..(i0 + n) * nh * f].to_vec(),
            phk: vec![0.0; n * nk * f],
            kappa: vec![0.0; n * nk],
            v: vec![0.0; n * kvd],
        };
        for i in 0..n {
            let t = pos0 + i;
            let Some(j) = t.checked_sub(w).filter(|&j| j >= s) else { continue };
            let (phk, kap, v): (&[f32], &[f32], &[f32]) = if j >= pos0 {
                let jr = i0 + j - pos0;
                (&r.feat.phk[jr * nk * f..][..nk * f], &r.feat.kappa[jr * nk..][..nk], &r.v[jr * kvd..][..kvd])
            } else {
                let sl = slot_of(c, j);
                (&st.phk[sl * nk * f..][..nk * f], &st.kappa[sl * nk..][..nk], &st.v[sl * kvd..][..kvd])
            };
            sh.phk[i * nk * f..][..nk * f].copy_from_slice(phk);
            sh.kappa[i * nk..][..nk].copy_from_slice(kap);
            sh.v[i * kvd..][..kvd].copy_from_slice(v);
        }
        let mut fo = core(c, &self.core, &sh, 0, n, &mut st.core); // [n, n_heads·hd]
        if !self.core.o_norm.is_empty() {
            fo = kvmf::out_norm(&fo, &self.core.o_norm, hd);
        }
        // The softmax over the near keys and the slot, one task per (row, kv head): the kernel
        // over each of the row's near runs (`near_runs`: the sinks, the window cut where the
        // ring wraps) for the group's query heads at once, read where they lie, and the runs'
        // partials merged with the slot's (m = b, l = 1, sums = the core's output) in that
        // order. The runs depend on the position alone, so a row's value does not depend on how
        // the sequence was cut into calls; each run is one contiguous span of the ring and of
        // `near` (a decode step reads the ring in place: no copy of its keys).
        let span = profile::span(Op::Attention);
        // (the dense layers' exp under the same numerics)
        let rule = ScoreRule { scale: env.cfg.attn_scale, softcap: None, exp: Exp::for_fast(env.num == Numerics::Fast) };
        let pl = part_len(hd);
        let near = Near::copy(c, r, i0, n, pos0, st);
        keep_rows(c, r, i0, n, pos0, st);
        let mut o = vec![0f32; n * nh * hd]; // [n, n_heads, hd]
        let ring = &*st;
        pool().for_rows_mut(&mut o, g * hd, 1, |idx0, out| {
            let (mut scratch, mut parts, mut slot) = (Vec::new(), vec![0f32; 3 * g * pl], vec![0f32; pl]);
            for (ii, orows) in out.chunks_exact_mut(g * hd).enumerate() {
                let (i, kh) = ((idx0 + ii) / nk, (idx0 + ii) % nk);
                let t = pos0 + i;
                let q = &r.q[((i0 + i) * nh + kh * g) * hd..][..g * hd];
                let mut used = 0;
                for (a, b) in near_runs(c, t) {
                    if a == b {
                        continue;
                    }
                    let (keys, vals, row0) = near_span(c, near.as_ref(), ring, a);
                    let split =
                        Split { keys: KvRows::F32(keys), vals: KvRows::F32(vals), stride: kvd, off: kh * hd, row0, n: b - a };
                    attend_split(q, hd, g, &split, &rule, &mut scratch, &mut parts[used * g * pl..][..g * pl]);
                    used += 1;
                }
                for (hh, orow) in orows.chunks_exact_mut(hd).enumerate() {
                    let h = kh * g + hh;
                    let runs = (0..used).map(|u| &parts[(u * g + hh) * pl..][..pl]);
                    if t >= s + w {
                        slot[0] = r.b[(i0 + i) * nh + h];
                        slot[1] = 1.0;
                        slot[2..].copy_from_slice(&fo[(i * nh + h) * hd..][..hd]);
                        merge(runs.chain(std::iter::once(&slot[..])), rule.exp, orow);
                    } else {
                        merge(runs, rule.exp, orow);
                    }
                }
            }
        });
        drop(span);
        o
    }

    /// n positions each as its own decode step (projections of all rows on the decode path).
    fn steps(&self, env: &Env, h: &[f32], n: usize, pos0: usize, st: &mut WindowState) -> Vec<f32> {
        let r = self.project(env, h, n, pos0, st, true);
        let mut o = Vec::with_capacity(n * self.cfg.n_heads * self.cfg.d_v);
        for i in 0..n {
            o.extend(self.run(env, &r, i, 1, pos0 + i, st));
        }
        o
    }
}

impl Mixer for VmfWindow {
    fn name(&self) -> &'static str {
        "a vmf_phase linear core beside a window"
    }
    fn matrices(&self) -> Vec<&QTensor> {
        let a = &self.att;
        let mut m = vec![&a.wq, &a.wk, &a.wv, &a.wo, &self.slot];
        m.extend(self.core.matrices());
        m
    }
    fn matrices_mut(&mut self) -> Vec<&mut QTensor> {
        let a = &mut self.att;
        let mut m = vec![&mut a.wq, &mut a.wk, &mut a.wv, &mut a.wo, &mut self.slot];
        m.extend(self.core.matrices_mut());
        m
    }
    fn new_state(&self, _kv: KvType) -> LayerState {
        LayerState::new(WindowState::new(&self.cfg))
    }
    /// The core's chunk-parallel form chunks from a call's start.
    fn cut_grid(&self) -> usize {
        CHUNK
    }
    fn forward(&self, env: &Env, h: &[f32], n: usize, seq: Seq<'_>, trace: &mut dyn FnMut(&str, &[f32])) -> Result<Vec<f32>> {
        let st: &mut WindowState = seq.state.of();
        let r = self.project(env, h, n, seq.pos0, st, false);
        let o = self.run(env, &r, 0, n, seq.pos0, st);
        Ok(attn_output(env.cfg, &self.att, o, None, n, false, trace))
    }
    /// One position of each sequence: the projections over all rows at once (each on the
    /// decode path), RoPE at each row's own position, the rest per sequence.
    fn forward_rows(&self, env: &Env, h: &[f32], rows: Vec<Seq<'_>>) -> Result<Vec<f32>> {
        let (c, d, kb) = (&self.cfg, self.cfg.d_model, rows.len());
        let (nh, kvd, f, nk) = (c.n_heads, c.n_k_heads * c.d_v, c.f(), c.n_k_heads);
        let (mut q, mut k, mut v) = attn_project(&self.att, h, kb, true);
        let mut pos = Vec::with_capacity(kb);
        let mut states: Vec<&mut WindowState> = Vec::with_capacity(kb);
        for s in rows {
            pos.push(s.pos0);
            states.push(s.state.of());
        }
        let qd = nh * c.d_v;
        for (i, &p) in pos.iter().enumerate() {
            let mut qi = q[i * qd..(i + 1) * qd].to_vec();
            attn_prep(
                env.cfg,
                &self.att,
                &env.cfg.ropes[self.rope],
                &mut qi,
                &mut k[i * kvd..(i + 1) * kvd],
                &mut v[i * kvd..(i + 1) * kvd],
                1,
                p,
                env.num,
            );
            q[i * qd..(i + 1) * qd].copy_from_slice(&qi);
        }
        let x = self.core.conv(c, h, &mut states.iter_mut().map(|s| &mut s.core.conv).collect::<Vec<_>>(), true);
        let feat = features(c, &self.core, &x, kb, true);
        let mut b = self.slot.project(h, kb, true);
        crate::mixers::add_bias(&mut b, &self.slot_b);
        let mut o = Vec::with_capacity(kb * qd); // [kb, n_heads·hd]
        for (i, st) in states.into_iter().enumerate() {
            let r = Rows {
                q: q[i * qd..(i + 1) * qd].to_vec(),
                k: k[i * kvd..(i + 1) * kvd].to_vec(),
                v: v[i * kvd..(i + 1) * kvd].to_vec(),
                feat: Projected {
                    phq: feat.phq[i * nh * f..(i + 1) * nh * f].to_vec(),
                    phk: feat.phk[i * nk * f..(i + 1) * nk * f].to_vec(),
                    kappa: feat.kappa[i * nk..(i + 1) * nk].to_vec(),
                    v: Vec::new(),
                },
                b: b[i * nh..(i + 1) * nh].to_vec(),
            };
            o.extend(self.run(env, &r, 0, 1, pos[i], st));
        }
        debug_assert_eq!(h.len(), kb * d);
        Ok(attn_output(env.cfg, &self.att, o, None, kb, true, &mut |_, _| {}))
    }
    /// The projections over all n rows at once (each on the decode path), then each position
    /// as its own step; journaled as the state's snapshot and the input rows.
    fn forward_steps(&self, env: &Env, h: &[f32], n: usize, seq: Seq<'_>, journal: &mut Journal) -> Result<Vec<f32>> {
        journal.begin(seq.state, n);
        journal.record = Some(Box::new(h.to_vec()));
        let o = self.steps(env, h, n, seq.pos0, seq.state.of());
        Ok(attn_output(env.cfg, &self.att, o, None, n, true, &mut |_, _| {}))
    }
    fn rewind(&self, env: &Env, seq: Seq<'_>, journal: &mut Journal, keep: usize) -> Result<()> {
        assert!(journal.restore(seq.state), "a windowed vmf_phase state is recurrent: forward_steps snapshotted it");
        let h: &Vec<f32> = journal.record();
        self.steps(env, &h[..keep * env.cfg.d_model], keep, seq.pos0, seq.state.of());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The runs of every position are its near keys (the sinks and the last W), each once, in
    /// position order, and each run sits in consecutive rows of the ring.
    #[test]
    fn near_runs_cover_the_window_in_ring_order() {
        for (sinks, window) in [(0, 5), (2, 5), (4, 1), (3, 8)] {
            let c = VmfConfig {
                d_model: 8,
                n_heads: 2,
                n_k_heads: 1,
                nphase: 2,
                d_v: 4,
                conv_kernel: 0,
                k_gate: false,
                phase_bias: false,
                window,
                sinks,
            };
            for t in 0..40 {
                let near: Vec<usize> = (0..sinks.min(t + 1)).chain((t + 1).saturating_sub(window).max(sinks)..=t).collect();
                let runs = near_runs(&c, t);
                let got: Vec<usize> = runs.iter().flat_map(|&(a, b)| a..b).collect();
                assert_eq!(got, near, "S {sinks} W {window} t {t}: runs {runs:?}");
                for (a, b) in runs {
                    for j in a + 1..b {
                        assert_eq!(slot_of(&c, j), slot_of(&c, a) + (j - a), "S {sinks} W {window} t {t}: run {a}..{b}");
                    }
                }
            }
        }
    }
}

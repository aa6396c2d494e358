//! vmf_phase beside an exact window (issue 16, the next option of the operator): a converted
//! layer keeps softmax attention over its sinks and the last W positions (the layer's own
//! W_q/W_k/W_v, RoPE) and the vmf_phase core stands for every key that has left the window, as
//! one more slot of the same softmax. Per query head h at position t, with N_t the near keys of
//! sink+window's schedule (`farfield::window_exits`) and s_tj = scale·q_t·k_j:
//! ```text
//! o_t = (Σ_{j∈N_t} e^{s_tj} v_j + e^{b_t} f_t) / (Σ_{j∈N_t} e^{s_tj} + e^{b_t})
//! ```
//! f_t [hd] is the core's output for the head (its state written with each key as it leaves
//! the window: the core run over inputs shifted by W) and b_t its slot logit (an affine map of
//! the layer input, per head). The slot joins at t = S + W, when the first key has left: before
//! it the near keys are every key and o_t is exact attention (no empty slot dilutes it). The denominator is positive whatever the sign of the cos kernel
//! inside the core, which is why the far part enters as a slot and not as kernel mass in the
//! normaliser (LoLCATs' form needs positive features). Teacher-forced stage 1 needs ∂f and ∂b;
//! stage 2 also ∂q, ∂k, ∂v, which are the near keys' softmax backward against the whole
//! normaliser (`farfield::near_backward`), the slot being one more key with score b and value f.
//!
//! The engine serves the option (`cortiq_engine::mixers::vmf_window`, `convert --linear-core
//! vmf_phase --window`); stage 1 of the heal fits a windowed layer through [`WinMixer`]
//! (`cortiq polish --teacher --stage transfer`).
//!
//! Accumulation contract: param grads +=, activations =.

use crate::farfield::{FarShape, near_backward, near_rows, window_exits};
use crate::float::Float;
use crate::matmul::{linear_backward, linear_forward};
use crate::rope::{RopeStyle, RopeTable, rope_backward, rope_forward};
use crate::vmf::{
    CoreGrads, LayerParams, TransferMixer, TransferSeq, VmfActs, VmfParams, VmfShape, add_bias, bias_grad, core_backward,
    core_forward, features_backward, features_forward, opt, out_norm_backward, out_norm_forward,
};

/// o [T, n_heads, hd] and each row's log-normaliser lse [T, n_heads] (written) from q
/// [T, n_heads, hd], k and v [T, n_kv, hd], the core's output f [T, n_heads, hd] and the slot
/// logits b [T, n_heads]. `s.rank` is not used.
#[allow(clippy::too_many_arguments)]
pub fn slot_forward<F: Float>(s: &FarShape, q: &[F], k: &[F], v: &[F], f: &[F], b: &[F], o: &mut [F], lse: &mut [f64]) {
    let (nh, hd) = (s.n_heads, s.hd);
    assert!(f.len() == q.len() && o.len() == q.len() && b.len() == s.t * nh && lse.len() == s.t * nh, "slot: shapes");
    let near = near_rows(s, window_exits(s), 0, q, k, v);
    for r in 0..s.t * nh {
        // Shift by m = max(c, b): both weights ≤ 1, the sum ≥ 1.
        let (c, bb) = (near.c[r], b[r]);
        let on = slot_on(s, r / nh);
        let m = if on { c.max(bb) } else { c };
        let (wn, ws) = ((c - m).exp(), if on { (bb - m).exp() } else { F::ZERO });
        let den = near.den[r] * wn + ws;
        let inv = F::ONE / den;
        let (num, fr) = (&near.num[r * hd..][..hd], &f[r * hd..][..hd]);
        o[r * hd..][..hd].iter_mut().zip(num).zip(fr).for_each(|((o, &n), &f)| *o = (n * wn + ws * f) * inv);
        lse[r] = m.to_f64() + den.to_f64().ln();
    }
}

/// Backward of [`slot_forward`] (its o and lse): dq, dk, dv, df, db += given ∂L/∂o.
/// fwd: o = (Σ_N e^{s_j} v_j + e^{b} f) / e^{ℓ}  =>  the near keys as softmax against ℓ;
///      p = e^{b − ℓ}: df = p·do, db = p·(do·f − do·o).
#[allow(clippy::too_many_arguments)]
pub fn slot_backward<F: Float>(
    s: &FarShape,
    q: &[F],
    k: &[F],
    v: &[F],
    f: &[F],
    b: &[F],
    o: &[F],
    lse: &[f64],
    d_o: &[F],
    dq: &mut [F],
    dk: &mut [F],
    dv: &mut [F],
    df: &mut [F],
    db: &mut [F],
) {
    let (nh, hd) = (s.n_heads, s.hd);
    assert!(df.len() == f.len() && db.len() == b.len() && d_o.len() == o.len(), "slot backward: shapes");
    near_backward(s, &window_exits(s), 0, q, k, v, o, lse, d_o, dq, dk, dv);
    for r in 0..s.t * nh {
        if !slot_on(s, r / nh) {
            continue;
        }
        let p = F::from_f64((b[r].to_f64() - lse[r]).exp());
        let (dor, fr, or) = (&d_o[r * hd..][..hd], &f[r * hd..][..hd], &o[r * hd..][..hd]);
        let (mut dof, mut doo) = (F::ZERO, F::ZERO);
        for ((&g, &x), &y) in dor.iter().zip(fr).zip(or) {
            dof += g * x;
            doo += g * y;
        }
        df[r * hd..][..hd].iter_mut().zip(dor).for_each(|(a, &g)| *a += p * g);
        db[r] += p * (dof - doo);
    }
}

/// Whether position t's softmax has the slot: from t = S + W on (a key has left the window).
pub fn slot_on(s: &FarShape, t: usize) -> bool {
    t >= s.sinks + s.window
}

/// The core's inputs as it sees them beside the window: row t carries the key that leaves the
/// window at t (position j = t − W, when j ≥ the sinks), zeros (κ = 0) where none leaves. The
/// core run over these rows has written key j from t = j + W on, decayed λ^{t − j − W}: what
/// the engine's state holds when it writes each key as the ring evicts it. `x` [T, n·width]
/// (φk: width F, κ: 1, v: dv; n states).
pub fn shift_in<F: Float>(x: &[F], t: usize, width: usize, sinks: usize, window: usize) -> Vec<F> {
    assert!(x.len().is_multiple_of(t.max(1)), "shift_in: rows");
    let row = x.len() / t.max(1);
    assert!(row.is_multiple_of(width), "shift_in: row width");
    let mut out = vec![F::ZERO; x.len()];
    for r in window..t {
        let j = r - window;
        if j >= sinks {
            out[r * row..][..row].copy_from_slice(&x[j * row..][..row]);
        }
    }
    out
}

/// Backward of [`shift_in`]: dx[j] += dy[j + W] for every key j ≥ the sinks that leaves.
pub fn shift_in_backward<F: Float>(dy: &[F], t: usize, sinks: usize, window: usize, dx: &mut [F]) {
    let row = dy.len() / t.max(1);
    for r in window..t {
        let j = r - window;
        if j >= sinks {
            dx[j * row..][..row].iter_mut().zip(&dy[r * row..][..row]).for_each(|(a, &b)| *a += b);
        }
    }
}

/// A windowed layer's extra geometry: the core's shape (states = KV heads, dv = head_dim), the
/// exact part's sinks and window, the score scale and the RoPE pairing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WinShape {
    pub core: VmfShape,
    pub sinks: usize,
    pub window: usize,
    pub scale: f64,
    pub rope: RopeStyle,
}

/// A windowed layer's parameters: the core's (its `v` is W_v, shared by the window and the
/// core; its `out` is W_o over the combined output), the exact part's W_q/W_k with their
/// biases and the value bias (empty when absent), and the slot logit's map b = x·wbᵀ + cb.
#[derive(Debug, Clone, Default)]
pub struct WinParams<F> {
    pub core: VmfParams<F>,
    /// [n_heads·hd, d], [n_heads·hd] or empty
    pub wq: Vec<F>,
    pub bq: Vec<F>,
    /// [n_kv·hd, d], [n_kv·hd] or empty
    pub wk: Vec<F>,
    pub bk: Vec<F>,
    /// [n_kv·hd] or empty
    pub bv: Vec<F>,
    /// [n_heads, d], [n_heads]
    pub wb: Vec<F>,
    pub cb: Vec<F>,
}

impl<F: Float> WinParams<F> {
    pub fn zeros_like(&self) -> WinParams<F> {
        let z = |v: &Vec<F>| vec![F::ZERO; v.len()];
        WinParams {
            core: self.core.zeros_like(),
            wq: z(&self.wq),
            bq: z(&self.bq),
            wk: z(&self.wk),
            bk: z(&self.bk),
            bv: z(&self.bv),
            wb: z(&self.wb),
            cb: z(&self.cb),
        }
    }

    /// Every tensor, the core's first (the optimizer's and the gradcheck's view).
    pub fn tensors_mut(&mut self) -> Vec<(&'static str, &mut Vec<F>)> {
        let mut v: Vec<(&'static str, &mut Vec<F>)> = self.core.tensors_mut().into_iter().collect();
        v.extend([
            ("wq", &mut self.wq),
            ("bq", &mut self.bq),
            ("wk", &mut self.wk),
            ("bk", &mut self.bk),
            ("bv", &mut self.bv),
            ("wb", &mut self.wb),
            ("cb", &mut self.cb),
        ]);
        v
    }
}

impl<F: Float> LayerParams<F> for WinParams<F> {
    fn zeros_like(&self) -> Self {
        WinParams::zeros_like(self)
    }
    fn tensors(&mut self) -> Vec<(&'static str, &mut Vec<F>)> {
        self.tensors_mut()
    }
}

/// A windowed layer as stage 1 fits it: its shape and the RoPE table of the windows' positions
/// (0..T, every window starting at position 0).
pub struct WinMixer<F> {
    pub sh: WinShape,
    pub rope: RopeTable<F>,
}

/// The exact part's projections and the output are the teacher attention's own (W_q, W_k, W_v,
/// W_o and their biases); the core's features, decays, conv, gate, mass, output norm and the
/// slot's map are new.
impl<F: Float> TransferMixer<F> for WinMixer<F> {
    type Params = WinParams<F>;
    fn loss(&self, s: &TransferSeq<F>, p: &WinParams<F>, grads: Option<&mut WinParams<F>>) -> (f64, f64) {
        let mut y = vec![F::ZERO; s.y.len()];
        let mut acts = WinActs::default();
        win_mixer_forward(&self.sh, p, &self.rope, &s.x, &mut y, &mut acts);
        let (e, n, dy) = s.residual(&y);
        if let Some(g) = grads {
            win_mixer_backward(&self.sh, p, &self.rope, &s.x, &acts, &dy, None, g);
        }
        (e, n)
    }
    fn output(&self, s: &TransferSeq<F>, p: &WinParams<F>) -> Vec<F> {
        let mut y = vec![F::ZERO; s.y.len()];
        win_mixer_forward(&self.sh, p, &self.rope, &s.x, &mut y, &mut WinActs::default());
        y
    }
    fn copied(&self, name: &str) -> bool {
        window_copied(name)
    }
}

/// A converted layer's parameters as a block and the trainer hold them: the plain vmf_phase
/// mixer's or the windowed one's.
#[derive(Debug, Clone)]
pub enum VmfLayer<F> {
    Plain(VmfParams<F>),
    Window(WinParams<F>),
}

impl<F: Float> VmfLayer<F> {
    pub fn zeros_like(&self) -> VmfLayer<F> {
        match self {
            VmfLayer::Plain(p) => VmfLayer::Plain(p.zeros_like()),
            VmfLayer::Window(p) => VmfLayer::Window(p.zeros_like()),
        }
    }

    /// Every tensor by name (an empty one is absent: not trained).
    pub fn tensors_mut(&mut self) -> Vec<(&'static str, &mut Vec<F>)> {
        match self {
            VmfLayer::Plain(p) => p.tensors_mut().into_iter().collect(),
            VmfLayer::Window(p) => p.tensors_mut(),
        }
    }

    /// Every tensor with whether it starts as the teacher's own (`TransferMixer::copied`):
    /// v_proj and out_proj of a plain layer; a windowed layer's W_q, W_k, W_v, W_o and biases.
    pub fn tensors_copied_mut(&mut self) -> Vec<(&mut Vec<F>, bool)> {
        let copied = match self {
            VmfLayer::Plain(_) => plain_copied,
            VmfLayer::Window(_) => window_copied,
        };
        self.tensors_mut().into_iter().map(|(n, t)| (t, copied(n))).collect()
    }
}

fn plain_copied(name: &str) -> bool {
    name == "v" || name == "out"
}

fn window_copied(name: &str) -> bool {
    matches!(name, "v" | "out" | "out_b" | "wq" | "bq" | "wk" | "bk" | "bv")
}

/// What the windowed mixer's backward needs of its forward.
#[derive(Debug, Clone, Default)]
pub struct WinActs<F> {
    /// [T, n_heads·hd] before RoPE, [T, n_heads·hd] after; k likewise [T, n_kv·hd]; v [T, n_kv·hd]
    pub q: Vec<F>,
    pub k: Vec<F>,
    pub v: Vec<F>,
    /// The core's inputs and activations (its `v` the shifted values, `o` its raw output).
    pub core: VmfActs<F>,
    /// Shifted φk [T, n_kv, F] and κ [T, n_kv].
    pub phk_s: Vec<F>,
    pub kappa_s: Vec<F>,
    /// The core's output as the slot's value [T, n_heads, hd] (normed when the core has gains).
    pub f: Vec<F>,
    /// Slot logits [T, n_heads], the combined output [T, n_heads·hd], its log-normalisers.
    pub b: Vec<F>,
    pub o: Vec<F>,
    pub lse: Vec<f64>,
}

fn far_shape(sh: &WinShape, t: usize) -> FarShape {
    let c = &sh.core;
    FarShape { t, n_heads: c.n_heads, n_kv: c.n_states, hd: c.dv, rank: 0, sinks: sh.sinks, window: sh.window, scale: sh.scale }
}

/// The windowed mixer: x [T, d] (the layer's normed input) -> y [T, d] (written).
pub fn win_mixer_forward<F: Float>(
    sh: &WinShape,
    w: &WinParams<F>,
    rope: &RopeTable<F>,
    x: &[F],
    y: &mut [F],
    a: &mut WinActs<F>,
) {
    let c = &sh.core;
    let (d, p, nh, nk, hd) = (c.d_model, c.nphase, c.n_heads, c.n_states, c.dv);
    let t = x.len() / d;
    let zeros = |n: usize| vec![F::ZERO; n];
    // The exact part's q, k (RoPE) and v.
    let mut q0 = zeros(t * nh * hd); // [T, n_heads·hd] before RoPE
    linear_forward(x, &w.wq, &mut q0, t, d, nh * hd);
    add_bias(&mut q0, &w.bq);
    let mut k0 = zeros(t * nk * hd); // [T, n_kv·hd] before RoPE
    linear_forward(x, &w.wk, &mut k0, t, d, nk * hd);
    add_bias(&mut k0, &w.bk);
    a.v = zeros(t * nk * hd); // [T, n_kv·hd]
    linear_forward(x, &w.core.v, &mut a.v, t, d, nk * hd);
    add_bias(&mut a.v, &w.bv);
    a.q = zeros(q0.len());
    rope_forward(sh.rope, rope, &q0, &mut a.q, nh, hd);
    a.k = zeros(k0.len());
    rope_forward(sh.rope, rope, &k0, &mut a.k, nk, hd);
    // The core's phases and gate from the (conv'd) input; its keys as they leave the window.
    features_forward(c, &w.core, x, &mut a.core);
    let ca = &mut a.core;
    a.phk_s = shift_in(&ca.phk, t, 2 * p, sh.sinks, sh.window); // [T, n_kv, F], row t: key t − W
    a.kappa_s = shift_in(&ca.kappa, t, 1, sh.sinks, sh.window);
    ca.v = shift_in(&a.v, t, hd, sh.sinks, sh.window);
    ca.o = zeros(t * nh * hd); // [T, n_heads, hd]
    core_forward(&c.core(), &ca.phq, &a.phk_s, &a.kappa_s, &ca.v, &w.core.a_log, &mut ca.o, &mut ca.ck);
    if w.core.o_norm.is_empty() {
        a.f = ca.o.clone();
    } else {
        a.f = zeros(ca.o.len());
        ca.inv_rms = zeros(t * nh);
        out_norm_forward(&ca.o, &w.core.o_norm, hd, &mut a.f, &mut ca.inv_rms);
    }
    // The slot logits, the combined softmax, out_proj.
    a.b = zeros(t * nh); // [T, n_heads]
    linear_forward(x, &w.wb, &mut a.b, t, d, nh);
    add_bias(&mut a.b, &w.cb);
    let fs = far_shape(sh, t);
    a.o = zeros(t * nh * hd); // [T, n_heads, hd]
    a.lse = vec![0.0; t * nh];
    slot_forward(&fs, &a.q, &a.k, &a.v, &a.f, &a.b, &mut a.o, &mut a.lse);
    linear_forward(&a.o, &w.core.out, y, t, nh * hd, d);
    add_bias(y, &w.core.out_b);
}

/// Backward of [`win_mixer_forward`]: dx += (when given), grads += for every parameter (a
/// tensor left empty in `grads` is not trained).
#[allow(clippy::too_many_arguments)]
pub fn win_mixer_backward<F: Float>(
    sh: &WinShape,
    w: &WinParams<F>,
    rope: &RopeTable<F>,
    x: &[F],
    a: &WinActs<F>,
    dy: &[F],
    dx: Option<&mut [F]>,
    g: &mut WinParams<F>,
) {
    let c = &sh.core;
    let (d, nh, nk, hd) = (c.d_model, c.n_heads, c.n_states, c.dv);
    let t = x.len() / d;
    let zeros = |n: usize| vec![F::ZERO; n];
    let ca = &a.core;
    // fwd: y = o·W_oᵀ + b
    bias_grad(dy, &mut g.core.out_b);
    let mut d_o = zeros(t * nh * hd);
    linear_backward(dy, &a.o, &w.core.out, Some(&mut d_o), opt(&mut g.core.out), t, nh * hd, d);
    // The slot softmax.
    let (mut dq, mut dk, mut dv) = (zeros(a.q.len()), zeros(a.k.len()), zeros(a.v.len()));
    let (mut df, mut db) = (zeros(a.f.len()), zeros(a.b.len()));
    slot_backward(
        &far_shape(sh, t),
        &a.q,
        &a.k,
        &a.v,
        &a.f,
        &a.b,
        &a.o,
        &a.lse,
        &d_o,
        &mut dq,
        &mut dk,
        &mut dv,
        &mut df,
        &mut db,
    );
    let mut dxx = zeros(t * d);
    // fwd: b = x·wbᵀ + cb
    bias_grad(&db, &mut g.cb);
    linear_backward(&db, x, &w.wb, Some(&mut dxx), opt(&mut g.wb), t, d, nh);
    // The core (and its output norm).
    let d_core = if w.core.o_norm.is_empty() {
        df
    } else {
        let mut dc = zeros(ca.o.len());
        out_norm_backward(&ca.o, &w.core.o_norm, &ca.inv_rms, hd, &df, &mut dc, opt(&mut g.core.o_norm));
        dc
    };
    let (mut dphq, mut dphk_s) = (zeros(ca.phq.len()), zeros(a.phk_s.len()));
    let (mut dkap_s, mut dv_s) = (zeros(a.kappa_s.len()), zeros(ca.v.len()));
    let mut da = zeros(w.core.a_log.len());
    let cg = CoreGrads { dphq: &mut dphq, dphk: &mut dphk_s, dkappa: &mut dkap_s, dv: &mut dv_s, da_log: &mut da };
    core_backward(&c.core(), &ca.phq, &a.phk_s, &a.kappa_s, &ca.v, &w.core.a_log, &ca.ck, &d_core, cg);
    if !g.core.a_log.is_empty() {
        g.core.a_log.iter_mut().zip(&da).for_each(|(x, &y)| *x += y);
    }
    let (mut dphk, mut dkap) = (zeros(ca.phk.len()), zeros(ca.kappa.len()));
    // fwd: the core's key rows shifted by W  =>  each key's gradient from the row it left at
    shift_in_backward(&dphk_s, t, sh.sinks, sh.window, &mut dphk);
    shift_in_backward(&dkap_s, t, sh.sinks, sh.window, &mut dkap);
    shift_in_backward(&dv_s, t, sh.sinks, sh.window, &mut dv);
    features_backward(c, &w.core, x, ca, &dphq, &dphk, &dkap, zeros(t * d), Some(&mut dxx), &mut g.core);
    // The exact part: v (both parts' gradients by now), k and q through RoPE.
    bias_grad(&dv, &mut g.bv);
    // fwd: v = x·W_vᵀ + b_v  (read by the window and, shifted, by the core)
    linear_backward(&dv, x, &w.core.v, Some(&mut dxx), opt(&mut g.core.v), t, d, nk * hd);
    // fwd: q = rope(x·W_qᵀ + b_q), k = rope(x·W_kᵀ + b_k)
    let (mut dq0, mut dk0) = (zeros(dq.len()), zeros(dk.len()));
    rope_backward(sh.rope, rope, &dq, &mut dq0, nh, hd);
    rope_backward(sh.rope, rope, &dk, &mut dk0, nk, hd);
    bias_grad(&dq0, &mut g.bq);
    linear_backward(&dq0, x, &w.wq, Some(&mut dxx), opt(&mut g.wq), t, d, nh * hd);
    bias_grad(&dk0, &mut g.bk);
    linear_backward(&dk0, x, &w.wk, Some(&mut dxx), opt(&mut g.wk), t, d, nk * hd);
    if let Some(dx) = dx {
        dx.iter_mut().zip(&dxx).for_each(|(a, &b)| *a += b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::Rng;
    use crate::vmf::{CoreCheckpoints, CoreShape, core_forward, transfer_error, transfer_layer};

    /// Stage 1 on a teacher that is itself a windowed layer: from a start whose core and slot
    /// map are perturbed (the exact part's projections right, as the heal starts from the
    /// teacher's own), the fit takes most of the held-out error away.
    #[test]
    fn transfer_recovers_a_windowed_teacher() {
        let (d, p, nh, nk, hd, t) = (8, 4, 4, 2, 4, 24);
        let core =
            VmfShape { d_model: d, n_heads: nh, n_states: nk, nphase: p, dv: hd, conv_kernel: 3, k_gate: true, phase_bias: true };
        let sh = WinShape { core, sinks: 2, window: 4, scale: 0.5, rope: RopeStyle::NeoX };
        let m = WinMixer { sh, rope: RopeTable::<f64>::new(t, hd, 100.0) };
        let mut rng = Rng(0x51ab);
        let teacher = WinParams {
            core: VmfParams {
                thq: rng.vec(nh * p * d, 0.5),
                thq_b: rng.vec(nh * p, 0.3),
                thk: rng.vec(nk * p * d, 0.5),
                thk_b: rng.vec(nk * p, 0.3),
                v: rng.vec(nk * hd * d, 0.5),
                out: rng.vec(d * nh * hd, 0.3),
                out_b: Vec::new(),
                a_log: (0..nk * 2 * p).map(|_| -2.0 + 2.0 * rng.uniform()).collect(),
                conv: (0..d * 3).map(|i| if i % 3 == 2 { 1.0 } else { 0.0 }).collect(),
                kg_w: vec![0.0; nk * d],
                kg_b: vec![0.0; nk],
                mass: vec![0.0; nk],
                o_norm: Vec::new(),
            },
            wq: rng.vec(nh * hd * d, 0.5),
            bq: Vec::new(),
            wk: rng.vec(nk * hd * d, 0.5),
            bk: Vec::new(),
            bv: Vec::new(),
            wb: rng.vec(nh * d, 0.5),
            cb: vec![1.0; nh],
        };
        let mut seqs: Vec<TransferSeq<f64>> = (0..6)
            .map(|_| {
                let x = rng.vec(t * d, 1.0);
                let mut y = vec![0.0; t * d];
                win_mixer_forward(&m.sh, &teacher, &m.rope, &x, &mut y, &mut WinActs::default());
                TransferSeq { x, y }
            })
            .collect();
        let held = seqs.split_off(4);
        let mut start = teacher.clone();
        start.core.thq.iter_mut().chain(start.core.thk.iter_mut()).for_each(|w| *w += 0.2 * rng.normal());
        start.core.a_log.iter_mut().for_each(|a| *a += 0.5);
        start.wb.iter_mut().for_each(|w| *w += 0.3 * rng.normal());
        let e0 = transfer_error(&m, &start, &held);
        let fit = transfer_layer(&m, &seqs, start, 800, 4, 3e-2, 0.1, Some((&held, 50)), |_| {});
        let e1 = transfer_error(&m, &fit, &held);
        println!("windowed transfer: held-out relative error {e0:.5} -> {e1:.5}");
        assert!(e0 > 1e-4 && e1 < 0.3 * e0, "held-out {e0} -> {e1}");
    }

    /// The core over shifted rows is the far sum of the definition: f_t = Σ over keys
    /// S ≤ j ≤ t − W of κ_j λ^{t − j − W} (φq_t·φk_j) v_j (here in f64, to rounding).
    #[test]
    fn shifted_core_is_the_far_sum() {
        let (t, ns, g, f, dv, sinks, w) = (20, 2, 2, 6, 3, 2, 5);
        let nh = ns * g;
        let mut rng = Rng(77);
        let phq = rng.vec(t * nh * f, 1.0);
        let phk = rng.vec(t * ns * f, 1.0);
        let kappa: Vec<f64> = (0..t * ns).map(|_| rng.uniform()).collect();
        let v = rng.vec(t * ns * dv, 1.0);
        let a_log: Vec<f64> = (0..ns * f).map(|_| -2.0 + 2.0 * rng.uniform()).collect();
        let sh = CoreShape { n_heads: nh, n_states: ns, f, dv };
        let mut o = vec![0.0; t * nh * dv];
        core_forward(
            &sh,
            &phq,
            &shift_in(&phk, t, f, sinks, w),
            &shift_in(&kappa, t, 1, sinks, w),
            &shift_in(&v, t, dv, sinks, w),
            &a_log,
            &mut o,
            &mut CoreCheckpoints::default(),
        );
        let mut worst = 0f64;
        for tt in 0..t {
            for h in 0..nh {
                let s = h / g;
                for e in 0..dv {
                    let mut want = 0.0;
                    for j in sinks..(tt + 1).saturating_sub(w) {
                        let k: f64 = (0..f)
                            .map(|fi| {
                                let lam = (-(a_log[s * f + fi]).exp()).exp();
                                phq[(tt * nh + h) * f + fi] * lam.powi((tt - j - w) as i32) * phk[(j * ns + s) * f + fi]
                            })
                            .sum();
                        want += kappa[j * ns + s] * k * v[(j * ns + s) * dv + e];
                    }
                    worst = worst.max((o[(tt * nh + h) * dv + e] - want).abs());
                }
            }
        }
        assert!(worst < 1e-12, "shifted core vs the far sum: {worst:e}");
        // Nothing reaches the core before the first key leaves (t = S + W).
        assert!(o[..(sinks + w) * nh * dv].iter().all(|&x| x == 0.0));
    }

    /// shift_in_backward is shift_in's adjoint: ⟨shift_in(x), y⟩ = ⟨x, shift_in_backward(y)⟩.
    #[test]
    fn shift_backward_is_the_adjoint() {
        let (t, width, sinks, w) = (11, 3, 1, 4);
        let mut rng = Rng(5);
        let x = rng.vec(t * 2 * width, 1.0);
        let y = rng.vec(x.len(), 1.0);
        let sx = shift_in(&x, t, width, sinks, w);
        let mut dx = vec![0.0; x.len()];
        shift_in_backward(&y, t, sinks, w, &mut dx);
        let a: f64 = sx.iter().zip(&y).map(|(a, b)| a * b).sum();
        let b: f64 = x.iter().zip(&dx).map(|(a, b)| a * b).sum();
        assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    }
}

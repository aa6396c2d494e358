//! The learned far field of the O(1) mode (`--o1-far linear`): a constant-size linear-attention
//! state per KV head that absorbs every key leaving the sink+window cache, combined with the
//! exact part under one softmax normalizer (LESS, arXiv 2402.09398, with exponential feature
//! maps so that the far mass lives on the same scale as the exact scores).
//!
//! Per KV head g and feature f < r, a key k leaving the window adds
//!   b_f(k) = W_g[f]·k − γk_g·|k|² + β_g[f],   H_g[f] += e^{b_f(k)}·v,   z_g[f] += e^{b_f(k)};
//! per query head h (of group g) at position t with score s_j = scale·q·k_j over the near keys N_t
//! (sinks j < S, window t − W < j ≤ t):
//!   a_f(q) = U_h[f]·q − γq_h·|q|² + α_h[f],
//!   o = (Σ_{N_t} e^{s_j} v_j + Σ_f e^{a_f} H_g[f]) / (Σ_{N_t} e^{s_j} + Σ_f e^{a_f} z_g[f]),
//! with H, z summing the keys S ≤ j ≤ t − W (those that left). Σ_f e^{a_f(q)+b_f(k)} stands for
//! e^{s(q, k)} of a far key; the state is r·(hd + 1) values per KV head, whatever the length.
//!
//! Each feature forgets at its own rate δ_g[f] = e^{ρ_g[f]} ≥ 0: a far key j seen from t weighs
//! e^{a_f(q) + b_f(k_j) − δ_f·(t − j)}, so that features can stand for the keys just evicted
//! (fast) or for the whole past (slow), a mixture of exponentials in the distance. As a state:
//! H, z decay by e^{−δ_f} per position and a key joins with e^{b_f − δ_f·(t − j)} at the t it
//! leaves. ρ = −∞ is no decay (the field as first built). Without the decay, the far field fitted
//! at 4096 tokens on SmolLM2 closed 27% of sink+window's excess at 2048 but 10% at 4096: one
//! bag of every past key, whatever its distance, does not carry over lengths.
//!
//! Teacher-forced form here, f64-checkable like every op of the crate: keys and queries are the
//! frozen model's (post-RoPE), only the feature maps train (stage 1 of the issue: per-layer
//! attention transfer, MSE against the exact attention output). The exact part has no
//! parameters, so it is computed once per sequence ([`near_part`]: its log-shift c, Σ e^{s−c} v
//! and Σ e^{s−c}); forward and backward then cost O(T·r·hd) per head. Stabilizers (the per-feature
//! max B_f over the sequence's far keys, the per-row max of the far logits) cancel exactly in o
//! and are held constant by the backward. No gradient reaches q, k or v (the model is frozen).
//! The engine's streaming form (`cortiq_engine::o1::farfield`) keeps running maxima instead
//! and must equal this one (tests in crates/cli/tests/o1_far.rs).
//!
//! Stage 2 ([`far_mixer_forward`] / [`far_mixer_backward`]): the same field as a decoder block's
//! attention inside the student, trained end to end on the distillation loss. There q, k and v
//! are the block's own, so the backward also gives ∂q, ∂k, ∂v (the near keys' softmax against
//! the whole normalizer, the far field's ∂a_f → q and ∂b_f → k, v), and the rows before the
//! prompt's end tp are exact causal attention, as the engine prefills them.
//!
//! Accumulation contract: param grads +=, activations =.

use crate::float::Float;

/// Sizes and the cache policy the far field sits beside.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FarShape {
    pub t: usize,
    pub n_heads: usize,
    pub n_kv: usize,
    pub hd: usize,
    pub rank: usize,
    pub sinks: usize,
    pub window: usize,
    pub scale: f64,
}

impl FarShape {
    fn group(&self) -> usize {
        self.n_heads / self.n_kv
    }

    /// The first position whose far set is not empty (key S left at t = S + W).
    pub fn first_far(&self) -> usize {
        self.sinks + self.window
    }
}

/// The trainable feature maps of one layer.
#[derive(Debug, Clone, PartialEq)]
pub struct FarParams<F> {
    /// [n_heads, rank, hd]
    pub u: Vec<F>,
    /// [n_heads, rank]
    pub alpha: Vec<F>,
    /// [n_heads]
    pub gq: Vec<F>,
    /// [n_kv, rank, hd]
    pub w: Vec<F>,
    /// [n_kv, rank]
    pub beta: Vec<F>,
    /// [n_kv]
    pub gk: Vec<F>,
    /// [n_kv, rank]: log decay rates, δ = e^ρ per position (−∞: none).
    pub rho: Vec<F>,
}

impl<F: Float> FarParams<F> {
    /// All zero (gradient buffers).
    pub fn zeros(s: &FarShape) -> Self {
        let z = |n: usize| vec![F::ZERO; n];
        FarParams {
            u: z(s.n_heads * s.rank * s.hd),
            alpha: z(s.n_heads * s.rank),
            gq: z(s.n_heads),
            w: z(s.n_kv * s.rank * s.hd),
            beta: z(s.n_kv * s.rank),
            gk: z(s.n_kv),
            rho: z(s.n_kv * s.rank),
        }
    }

    /// No decay (every ρ = −∞).
    pub fn without_decay(mut self) -> Self {
        self.rho.iter_mut().for_each(|x| *x = F::from_f64(f64::NEG_INFINITY));
        self
    }

    /// The tensors in a fixed order (optimizer and checkpoint walk them so).
    pub fn tensors(&self) -> [&[F]; 7] {
        [&self.u, &self.alpha, &self.gq, &self.w, &self.beta, &self.gk, &self.rho]
    }

    pub fn tensors_mut(&mut self) -> [&mut Vec<F>; 7] {
        [&mut self.u, &mut self.alpha, &mut self.gq, &mut self.w, &mut self.beta, &mut self.gk, &mut self.rho]
    }

    /// The decay rates δ = e^ρ [n_kv, rank] (what the engine stores).
    pub fn decay(&self) -> Vec<F> {
        self.rho.iter().map(|&x| x.exp()).collect()
    }

    /// Element-wise map into another float type.
    pub fn map<G: Float>(&self, f: impl Fn(F) -> G) -> FarParams<G> {
        let m = |v: &[F]| v.iter().map(|&x| f(x)).collect();
        FarParams {
            u: m(&self.u),
            alpha: m(&self.alpha),
            gq: m(&self.gq),
            w: m(&self.w),
            beta: m(&self.beta),
            gk: m(&self.gk),
            rho: m(&self.rho),
        }
    }
}

impl FarParams<f64> {
    /// Random maps for checks: every feature carries mass and the norm terms are live (U, W
    /// spread 0.4; α, β 0.5; γ 0.05; decay rates δ about 0.1, a key's weight halving in ~7
    /// positions), drawn in a fixed order from `rng`.
    pub fn random(s: &FarShape, rng: &mut crate::gradcheck::Rng) -> Self {
        let mut p = FarParams::zeros(s);
        p.u = rng.vec(p.u.len(), 0.4);
        p.alpha = rng.vec(p.alpha.len(), 0.5);
        p.gq = rng.vec(p.gq.len(), 0.05);
        p.w = rng.vec(p.w.len(), 0.4);
        p.beta = rng.vec(p.beta.len(), 0.5);
        p.gk = rng.vec(p.gk.len(), 0.05);
        p.rho = rng.vec(p.rho.len(), 0.5).into_iter().map(|x| x + 0.1f64.ln()).collect();
        p
    }
}

/// The exact part of every row, which no parameter touches: per (t, h) the log-shift c (max
/// near score), Σ_{N_t} e^{s−c} v and Σ_{N_t} e^{s−c}; and the schedule it was computed for.
#[derive(Debug, Clone)]
pub struct Near<F> {
    /// [T, n_heads]
    pub c: Vec<F>,
    /// [T, n_heads, hd]
    pub num: Vec<F>,
    /// [T, n_heads]
    pub den: Vec<F>,
    /// [T]: the first position whose query no longer sees key j exactly (it has joined the far
    /// state by then); `NEVER` for a key that stays near to the end (see [`window_exits`]).
    pub exits: Vec<usize>,
}

/// A key that never leaves the near set.
pub const NEVER: usize = usize::MAX;

impl<F: Float> Near<F> {
    /// The eviction rule's own output, no far field: Σ_near e^s v / Σ_near e^s per row
    /// [T, n_heads, hd].
    pub fn output(&self, hd: usize) -> Vec<F> {
        self.num.chunks(hd).zip(&self.den).flat_map(|(n, &d)| n.iter().map(move |&x| x / d)).collect()
    }
}

impl<F> Near<F> {
    /// The first position with a far set (T when no key ever leaves).
    pub fn first_far(&self) -> usize {
        self.exits.iter().copied().min().unwrap_or(NEVER).min(self.exits.len())
    }

    /// Per position t, the keys that leave at t (ascending).
    fn leaving(&self) -> Vec<Vec<usize>> {
        let t = self.exits.len();
        let mut out = vec![Vec::new(); t];
        for (j, &x) in self.exits.iter().enumerate() {
            if x < t {
                out[x].push(j);
            }
        }
        out
    }
}

/// Sink+window's schedule: key j ≥ S leaves at t = j + W (the query at t sees keys t − W < j ≤ t
/// and the sinks), the sinks never.
pub fn window_exits(s: &FarShape) -> Vec<usize> {
    (0..s.t).map(|j| if j < s.sinks { NEVER } else { j + s.window }).collect()
}

/// [`Near`] of one sequence under sink+window: q [T, n_heads, hd], k and v [T, n_kv, hd].
pub fn near_part<F: Float>(s: &FarShape, q: &[F], k: &[F], v: &[F]) -> Near<F> {
    near_part_with(s, window_exits(s), q, k, v)
}

/// [`Near`] of one sequence under any schedule (`exits` [T]; a key must leave after it came:
/// exits[j] > j). The near keys of t are, in position order, those j ≤ t with exits[j] > t.
pub fn near_part_with<F: Float>(s: &FarShape, exits: Vec<usize>, q: &[F], k: &[F], v: &[F]) -> Near<F> {
    near_rows(s, exits, 0, q, k, v)
}

/// Per t ≥ `from`, the near keys of t (ascending positions).
fn near_sets(exits: &[usize], from: usize) -> Vec<Vec<usize>> {
    let mut keys: Vec<usize> = Vec::new();
    let mut out = Vec::with_capacity(exits.len().saturating_sub(from));
    for t in 0..exits.len() {
        keys.retain(|&j| exits[j] > t);
        keys.push(t);
        if t >= from {
            out.push(keys.clone());
        }
    }
    out
}

/// [`near_part_with`] for the rows from `from` (those below stay zero), one pool task per query
/// head.
pub(crate) fn near_rows<F: Float>(s: &FarShape, exits: Vec<usize>, from: usize, q: &[F], k: &[F], v: &[F]) -> Near<F> {
    let (nh, nkv, hd) = (s.n_heads, s.n_kv, s.hd);
    assert_eq!(exits.len(), s.t, "far field: one exit per key");
    assert!(exits.iter().enumerate().all(|(j, &x)| x > j), "far field: a key leaves after it came");
    let group = s.group();
    let sets = near_sets(&exits, from);
    let scale = F::from_f64(s.scale);
    // Per head: c [T] | den [T] | num [T, hd].
    let row = s.t * (hd + 2);
    let mut buf = vec![F::ZERO; nh * row];
    crate::par::pool().for_rows_mut_dynamic(&mut buf, row, 1, |h, out| {
        let g = h / group;
        let (cd, num) = out.split_at_mut(2 * s.t);
        let mut sc = Vec::new();
        for (i, keys) in sets.iter().enumerate() {
            let t = from + i;
            let qr = &q[(t * nh + h) * hd..][..hd];
            sc.clear();
            sc.extend(keys.iter().map(|&j| dot(qr, &k[(j * nkv + g) * hd..][..hd]) * scale));
            let c = sc.iter().fold(sc[0], |m, &x| m.max(x));
            let nr = &mut num[t * hd..][..hd];
            let mut den = F::ZERO;
            for (&j, &x) in keys.iter().zip(&sc) {
                let e = (x - c).exp();
                den += e;
                nr.iter_mut().zip(&v[(j * nkv + g) * hd..][..hd]).for_each(|(o, &y)| *o += e * y);
            }
            cd[t] = c;
            cd[s.t + t] = den;
        }
    });
    let mut near =
        Near { c: vec![F::ZERO; s.t * nh], num: vec![F::ZERO; s.t * nh * hd], den: vec![F::ZERO; s.t * nh], exits: Vec::new() };
    for h in 0..nh {
        let b = &buf[h * row..][..row];
        for t in from..s.t {
            near.c[t * nh + h] = b[t];
            near.den[t * nh + h] = b[s.t + t];
            near.num[(t * nh + h) * hd..][..hd].copy_from_slice(&b[2 * s.t + t * hd..][..hd]);
        }
    }
    near.exits = exits;
    near
}

/// Eight independent partial sums (so the f32 instantiation vectorizes; measured 1.5× on the
/// fit of SmolLM2's shapes), added pairwise, then the tail.
fn dot<F: Float>(a: &[F], b: &[F]) -> F {
    let n = a.len().min(b.len());
    let body = n / 8 * 8;
    let mut acc = [F::ZERO; 8];
    for (x, y) in a[..body].chunks_exact(8).zip(b[..body].chunks_exact(8)) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for i in body..n {
        s += a[i] * b[i];
    }
    s
}

fn sq<F: Float>(a: &[F]) -> F {
    dot(a, a)
}

/// Per KV head: every key's feature logits as it joins the state, b̃ = b_f(k_j) − δ_f·(x_j − j)
/// at its exit x_j, [T, r], and the stabilizer B_f = max over the keys that leave within the
/// sequence (None when none does).
fn key_logits<F: Float>(s: &FarShape, p: &FarParams<F>, near: &Near<F>, k: &[F], g: usize) -> Option<(Vec<F>, Vec<F>)> {
    let (nkv, hd, r) = (s.n_kv, s.hd, s.rank);
    if near.first_far() >= s.t {
        return None;
    }
    let mut b = vec![F::ZERO; s.t * r];
    let mut bmax = vec![F::from_f64(f64::NEG_INFINITY); r];
    for j in (0..s.t).filter(|&j| near.exits[j] < s.t) {
        let kr = &k[(j * nkv + g) * hd..][..hd];
        let k2 = sq(kr);
        let age = F::from_f64((near.exits[j] - j) as f64);
        for f in 0..r {
            let x = dot(&p.w[(g * r + f) * hd..][..hd], kr) - p.gk[g] * k2 + p.beta[g * r + f] - p.rho[g * r + f].exp() * age;
            b[j * r + f] = x;
            bmax[f] = bmax[f].max(x);
        }
    }
    Some((b, bmax))
}

/// One row's far weights: ε_f = a_f + B_f − c, shifted by top = max(0, max ε) so nothing
/// overflows; writes w_f = e^{ε_f − top} and returns top.
fn row_weights<F: Float>(s: &FarShape, p: &FarParams<F>, h: usize, qr: &[F], bmax: &[F], c: F, w: &mut [F]) -> F {
    let (hd, r) = (s.hd, s.rank);
    let q2 = sq(qr);
    let mut top = F::ZERO;
    for f in 0..r {
        let a = dot(&p.u[(h * r + f) * hd..][..hd], qr) - p.gq[h] * q2 + p.alpha[h * r + f];
        w[f] = a + bmax[f] - c;
        top = top.max(w[f]);
    }
    w.iter_mut().for_each(|x| *x = (*x - top).exp());
    top
}

/// The far field's output: o [T, n_heads, hd] (written) from the exact part and the keys
/// leaving the window.
pub fn far_forward<F: Float>(s: &FarShape, p: &FarParams<F>, near: &Near<F>, q: &[F], k: &[F], v: &[F], o: &mut [F]) {
    sweep(s, p, near, q, k, v, Some(o), Upstream::None, None, Rows::all());
}

/// Adds ∂L/∂params to `grads` given ∂L/∂o (`d_o`, [T, n_heads, hd]).
#[allow(clippy::too_many_arguments)]
pub fn far_backward<F: Float>(
    s: &FarShape,
    p: &FarParams<F>,
    near: &Near<F>,
    q: &[F],
    k: &[F],
    v: &[F],
    d_o: &[F],
    grads: &mut FarParams<F>,
) {
    sweep(s, p, near, q, k, v, None, Upstream::Given(d_o), Some(grads), Rows::all());
}

/// The far field as a decoder block's attention (stage 2, end to end): rows before `tp` are
/// the prompt, exact causal attention as the engine prefills it; rows from `tp` attend to their
/// near keys under `exits` and to the far field, as the sealed engine serves them. Unlike the
/// teacher-forced form above, q, k and v are the block's own and get gradients.
/// o [T, n_heads, hd] and lse [T, n_heads] (each row's log-normalizer, for the backward) written.
#[allow(clippy::too_many_arguments)]
pub fn far_mixer_forward<F: Float>(
    s: &FarShape,
    p: &FarParams<F>,
    exits: &[usize],
    tp: usize,
    q: &[F],
    k: &[F],
    v: &[F],
    o: &mut [F],
    lse: &mut [f64],
) {
    let (nh, nkv, hd) = (s.n_heads, s.n_kv, s.hd);
    assert!(tp <= s.t && o.len() == q.len() && lse.len() == s.t * nh, "far mixer: o must be [T, nh, hd], lse [T, nh]");
    let near = near_rows(s, exits.to_vec(), tp, q, k, v);
    sweep(s, p, &near, q, k, v, Some(o), Upstream::None, None, Rows { from: tp, lse: Some(lse), din: None });
    if tp > 0 {
        let (qd, kd) = (tp * nh * hd, tp * nkv * hd);
        crate::attention::attention_forward(&prompt_shape(s), &q[..qd], &k[..kd], &v[..kd], &mut o[..qd], &mut lse[..tp * nh]);
    }
}

fn prompt_shape(s: &FarShape) -> crate::attention::AttnShape {
    crate::attention::AttnShape { n_heads: s.n_heads, n_kv_heads: s.n_kv, head_dim: s.hd, scale: s.scale, window: None }
}

/// Backward of [`far_mixer_forward`] (its o and lse): dq, dk, dv += and the far field's
/// parameter gradients += given ∂L/∂o.
/// fwd: o_t = (Σ_near e^{s_tj} v_j + Σ_f e^{a_f} H_f) / e^{ℓ_t}
///   =>  near keys as softmax attention against ℓ (D_t = do_t·o_t, ds = p·(do_t·v_j − D_t));
///       the far field by the sweep (∂a_f → dq, U, α, γq; ∂b_f → dk, W, β, γk, ρ; dv_j = Σ_f e·G_f);
///       the prompt rows by exact attention's backward.
#[allow(clippy::too_many_arguments)]
pub fn far_mixer_backward<F: Float>(
    s: &FarShape,
    p: &FarParams<F>,
    exits: &[usize],
    tp: usize,
    q: &[F],
    k: &[F],
    v: &[F],
    o: &[F],
    lse: &[f64],
    d_o: &[F],
    dq: &mut [F],
    dk: &mut [F],
    dv: &mut [F],
    grads: &mut FarParams<F>,
) {
    let (nh, nkv, hd) = (s.n_heads, s.n_kv, s.hd);
    assert!(
        d_o.len() == q.len() && dq.len() == q.len() && dk.len() == k.len() && dv.len() == v.len(),
        "far mixer backward: do, dq must be [T, nh, hd], dk, dv [T, nkv, hd]"
    );
    if tp > 0 {
        let (qd, kd) = (tp * nh * hd, tp * nkv * hd);
        crate::attention::attention_backward(
            &prompt_shape(s),
            &q[..qd],
            &k[..kd],
            &v[..kd],
            &o[..qd],
            &lse[..tp * nh],
            &d_o[..qd],
            &mut dq[..qd],
            &mut dk[..kd],
            &mut dv[..kd],
        );
    }
    near_backward(s, exits, tp, q, k, v, o, lse, d_o, dq, dk, dv);
    let near = near_rows(s, exits.to_vec(), tp, q, k, v);
    sweep(s, p, &near, q, k, v, None, Upstream::Given(d_o), Some(grads), Rows { from: tp, lse: None, din: Some((dq, dk, dv)) });
}

/// The near keys' part of [`far_mixer_backward`] for the rows from `tp`, one pool task per query
/// head (each head's dk, dv in its own buffer, summed over the group afterwards).
/// fwd: p_tj = e^{s_tj − ℓ_t}, s_tj = scale·q_t·k_j  =>  dv_j += p·do_t; ds = p·(do_t·v_j − do_t·o_t);
///      dq_t += scale·ds·k_j; dk_j += scale·ds·q_t
#[allow(clippy::too_many_arguments)]
pub(crate) fn near_backward<F: Float>(
    s: &FarShape,
    exits: &[usize],
    tp: usize,
    q: &[F],
    k: &[F],
    v: &[F],
    o: &[F],
    lse: &[f64],
    d_o: &[F],
    dq: &mut [F],
    dk: &mut [F],
    dv: &mut [F],
) {
    let (nh, nkv, hd) = (s.n_heads, s.n_kv, s.hd);
    let group = s.group();
    let sets = near_sets(exits, tp);
    let scale = F::from_f64(s.scale);
    // Per head: dq [T, hd] | dk [T, hd] | dv [T, hd].
    let row = 3 * s.t * hd;
    let mut buf = vec![F::ZERO; nh * row];
    crate::par::pool().for_rows_mut_dynamic(&mut buf, row, 1, |h, out| {
        let g = h / group;
        let (dqh, rest) = out.split_at_mut(s.t * hd);
        let (dkh, dvh) = rest.split_at_mut(s.t * hd);
        for (i, keys) in sets.iter().enumerate() {
            let t = tp + i;
            let r = (t * nh + h) * hd;
            let (qr, dor) = (&q[r..][..hd], &d_o[r..][..hd]);
            let dd = dot(dor, &o[r..][..hd]);
            let l = lse[t * nh + h];
            for &j in keys {
                let (kr, vr) = (&k[(j * nkv + g) * hd..][..hd], &v[(j * nkv + g) * hd..][..hd]);
                let pj = F::from_f64((dot(qr, kr) * scale).to_f64() - l).exp();
                let ds = scale * pj * (dot(dor, vr) - dd);
                dqh[t * hd..][..hd].iter_mut().zip(kr).for_each(|(x, &y)| *x += ds * y);
                dkh[j * hd..][..hd].iter_mut().zip(qr).for_each(|(x, &y)| *x += ds * y);
                dvh[j * hd..][..hd].iter_mut().zip(dor).for_each(|(x, &y)| *x += pj * y);
            }
        }
    });
    crate::attention::add_head_grads(&buf, s.t, nh, nkv, hd, dq, dk, dv);
}

/// What the backward starts from.
#[derive(Clone, Copy)]
enum Upstream<'a, F> {
    /// Forward only.
    None,
    /// ∂L/∂o given.
    Given(&'a [F]),
    /// L = Σ |o − y|² over the rows with a far set: ∂L/∂o = 2(o − y), formed row by row in the
    /// one sweep (no second forward).
    Mse(&'a [F]),
}

/// What the sweep does beyond the parameters' gradients (the block mixer's needs, stage 2).
struct Rows<'a, F> {
    /// Rows before this one are another operator's (the exact prompt): no gradient from them.
    from: usize,
    /// Per row [T, n_heads], the log of the whole normalizer in score units: ℓ = log(Σ_near e^s
    /// + Σ_far …), so a near key's weight is e^{s − ℓ} (written when given).
    lse: Option<&'a mut [f64]>,
    /// ∂L/∂q [T, n_heads, hd], ∂L/∂k and ∂L/∂v [T, n_kv, hd] through the far field (+=).
    din: Option<(&'a mut [F], &'a mut [F], &'a mut [F])>,
}

impl<F> Rows<'_, F> {
    fn all() -> Self {
        Rows { from: 0, lse: None, din: None }
    }
}

/// The forward sweep over t (optionally writing o) and, given ∂L/∂o, the backward: the row
/// parts (U, α, γq) in the same sweep, the state's per-t gradients summed in reverse into each
/// key as it left (W, β, γk, ρ). With λ_f = e^{−δ_f} the reverse keeps G(t) = Σ_{t'≥t}
/// λ^{t'−t} ∂L/∂H(t') and M(t) = Σ_{t'≥t} (t'−t) λ^{t'−t} ∂L/∂H(t') (M(t) = λ(M(t+1) + G(t+1))):
/// a key j leaving at x with weight ẽ gives ∂b̃ = ẽ(⟨G(x), v⟩ + G_z(x)) and
/// ∂δ = −(x − j)·∂b̃ − ẽ(⟨M(x), v⟩ + M_z(x)), the two parts of its distance t − j.
#[allow(clippy::too_many_arguments)]
fn sweep<F: Float>(
    s: &FarShape,
    p: &FarParams<F>,
    near: &Near<F>,
    q: &[F],
    k: &[F],
    v: &[F],
    mut o: Option<&mut [F]>,
    up: Upstream<'_, F>,
    mut grads: Option<&mut FarParams<F>>,
    mut rows: Rows<'_, F>,
) -> f64 {
    let backward = !matches!(up, Upstream::None);
    let mut sq_err = 0.0;
    let mut dmse = vec![F::ZERO; s.hd];
    let (nh, nkv, hd, r) = (s.n_heads, s.n_kv, s.hd, s.rank);
    assert!(s.n_kv > 0 && nh.is_multiple_of(nkv), "far field: n_heads must be a multiple of n_kv");
    assert!(q.len() == s.t * nh * hd && k.len() == s.t * nkv * hd && v.len() == k.len(), "far field: q/k/v shapes");
    let group = s.group();
    let mut w = vec![F::ZERO; r];
    let mut hs = vec![F::ZERO; r * hd];
    let mut zs = vec![F::ZERO; r];
    let mut out = vec![F::ZERO; hd];
    let leaving = near.leaving();
    let first_far = near.first_far();
    let mut lam = vec![F::ONE; r];
    let mut ms = vec![F::ZERO; r * hd];
    let mut mz = vec![F::ZERO; r];
    for g in 0..nkv {
        lam.iter_mut().enumerate().for_each(|(f, l)| *l = (-p.rho[g * r + f].exp()).exp());
        let lk = key_logits(s, p, near, k, g);
        // ∂L/∂H(t), ∂L/∂z(t) per position (backward only): [T, r, hd], [T, r].
        let (mut gh, mut gz) = match (backward, &lk) {
            (true, Some(_)) => (vec![F::ZERO; s.t * r * hd], vec![F::ZERO; s.t * r]),
            _ => (Vec::new(), Vec::new()),
        };
        hs.fill(F::ZERO);
        zs.fill(F::ZERO);
        for t in 0..s.t {
            // The keys leaving the near set at t join the far state.
            let far = match &lk {
                Some((b, bmax)) if t >= first_far => {
                    // (A feature without decay, λ = 1, is left alone.)
                    for f in (0..r).filter(|&f| lam[f] != F::ONE) {
                        zs[f] *= lam[f];
                        hs[f * hd..][..hd].iter_mut().for_each(|x| *x *= lam[f]);
                    }
                    for &j in &leaving[t] {
                        let vr = &v[(j * nkv + g) * hd..][..hd];
                        for f in 0..r {
                            let e = (b[j * r + f] - bmax[f]).exp();
                            zs[f] += e;
                            hs[f * hd..][..hd].iter_mut().zip(vr).for_each(|(x, &y)| *x += e * y);
                        }
                    }
                    Some(bmax)
                }
                _ => None,
            };
            if t < rows.from {
                continue;
            }
            for h in g * group..(g + 1) * group {
                let row = t * nh + h;
                let (c, nnum, nden) = (near.c[row], &near.num[row * hd..][..hd], near.den[row]);
                let qr = &q[row * hd..][..hd];
                let Some(bmax) = far else {
                    if let Some(o) = o.as_deref_mut() {
                        o[row * hd..][..hd].iter_mut().zip(nnum).for_each(|(y, &x)| *y = x / nden);
                    }
                    if let Some(l) = rows.lse.as_deref_mut() {
                        l[row] = c.to_f64() + nden.to_f64().ln();
                    }
                    continue;
                };
                let top = row_weights(s, p, h, qr, bmax, c, &mut w);
                let e0 = (-top).exp();
                let mut den = e0 * nden;
                out.iter_mut().zip(nnum).for_each(|(y, &x)| *y = e0 * x);
                for f in 0..r {
                    den += w[f] * zs[f];
                    out.iter_mut().zip(&hs[f * hd..][..hd]).for_each(|(y, &x)| *y += w[f] * x);
                }
                let inv = F::ONE / den;
                out.iter_mut().for_each(|y| *y *= inv);
                if let Some(o) = o.as_deref_mut() {
                    o[row * hd..][..hd].copy_from_slice(&out);
                }
                if let Some(l) = rows.lse.as_deref_mut() {
                    // den is in units of e^{c + top} (e0 = e^{−top} may underflow; top does not).
                    l[row] = c.to_f64() + top.to_f64() + den.to_f64().ln();
                }
                let Some(gr) = grads.as_deref_mut() else { continue };
                let dor = match up {
                    Upstream::None => continue,
                    Upstream::Given(d_o) => &d_o[row * hd..][..hd],
                    Upstream::Mse(y) => {
                        for ((d, &a), &b) in dmse.iter_mut().zip(&out).zip(&y[row * hd..][..hd]) {
                            let e = a - b;
                            sq_err += (e * e).to_f64();
                            *d = F::from_f64(2.0) * e;
                        }
                        &dmse[..]
                    }
                };
                // o = num/den: ∂num = dO/den, ∂den = −(dO·o)/den.
                let dden = -dot(dor, &out) * inv;
                let q2 = sq(qr);
                for f in 0..r {
                    let hf = &hs[f * hd..][..hd];
                    let de = w[f] * (dot(dor, hf) * inv + dden * zs[f]);
                    gr.u[(h * r + f) * hd..][..hd].iter_mut().zip(qr).for_each(|(x, &y)| *x += de * y);
                    gr.alpha[h * r + f] += de;
                    gr.gq[h] -= de * q2;
                    // fwd: a_f = U_h[f]·q − γq·|q|² + α  =>  dq += ∂a·(U_h[f] − 2γq·q)
                    if let Some((dq, _, _)) = rows.din.as_mut() {
                        let two_g = F::from_f64(2.0) * p.gq[h];
                        dq[row * hd..][..hd]
                            .iter_mut()
                            .zip(&p.u[(h * r + f) * hd..][..hd])
                            .zip(qr)
                            .for_each(|((x, &u), &y)| *x += de * (u - two_g * y));
                    }
                    let wi = w[f] * inv;
                    gh[(t * r + f) * hd..][..hd].iter_mut().zip(dor).for_each(|(x, &y)| *x += wi * y);
                    gz[t * r + f] += w[f] * dden;
                }
            }
        }
        // Reverse: a key leaving at t is in every far set from t on.
        let (Some(gr), Some((b, bmax)), true) = (grads.as_deref_mut(), &lk, backward) else { continue };
        hs.fill(F::ZERO); // now G(t)
        zs.fill(F::ZERO);
        ms.fill(F::ZERO); // and M(t)
        mz.fill(F::ZERO);
        let mut d_delta = vec![F::ZERO; r];
        for t in (first_far..s.t).rev() {
            for f in 0..r {
                let l = lam[f];
                let (hf, mf) = (&mut hs[f * hd..][..hd], &mut ms[f * hd..][..hd]);
                mf.iter_mut().zip(hf.iter_mut()).zip(&gh[(t * r + f) * hd..][..hd]).for_each(|((m, h), &y)| {
                    *m = l * (*m + *h);
                    *h = l * *h + y;
                });
                mz[f] = l * (mz[f] + zs[f]);
                zs[f] = l * zs[f] + gz[t * r + f];
            }
            for &j in &leaving[t] {
                let kr = &k[(j * nkv + g) * hd..][..hd];
                let vr = &v[(j * nkv + g) * hd..][..hd];
                let k2 = sq(kr);
                let age = F::from_f64((t - j) as f64);
                for f in 0..r {
                    let e = (b[j * r + f] - bmax[f]).exp();
                    let db = e * (dot(&hs[f * hd..][..hd], vr) + zs[f]);
                    gr.w[(g * r + f) * hd..][..hd].iter_mut().zip(kr).for_each(|(x, &y)| *x += db * y);
                    gr.beta[g * r + f] += db;
                    gr.gk[g] -= db * k2;
                    d_delta[f] -= age * db + e * (dot(&ms[f * hd..][..hd], vr) + mz[f]);
                    // fwd: b_f = W_g[f]·k − γk·|k|² + β, H += e^{b̃}·v  =>  dk += ∂b·(W_g[f] − 2γk·k); dv += e·G
                    if let Some((_, dk, dv)) = rows.din.as_mut() {
                        let two_g = F::from_f64(2.0) * p.gk[g];
                        let at = (j * nkv + g) * hd;
                        dk[at..][..hd]
                            .iter_mut()
                            .zip(&p.w[(g * r + f) * hd..][..hd])
                            .zip(kr)
                            .for_each(|((x, &w), &y)| *x += db * (w - two_g * y));
                        dv[at..][..hd].iter_mut().zip(&hs[f * hd..][..hd]).for_each(|(x, &y)| *x += e * y);
                    }
                }
            }
        }
        // δ = e^ρ: ∂ρ = δ·∂δ (zero for a feature without decay).
        for ((gr, &rho), &dd) in gr.rho[g * r..(g + 1) * r].iter_mut().zip(&p.rho[g * r..(g + 1) * r]).zip(&d_delta) {
            let delta = rho.exp();
            if delta > F::ZERO {
                *gr += delta * dd;
            }
        }
    }
    sq_err
}

/// One training sequence of one layer: the frozen model's q [T, n_heads, hd], k and v
/// [T, n_kv, hd] and exact attention output y [T, n_heads, hd], with its exact part.
#[derive(Debug, Clone)]
pub struct LayerSeq<F> {
    pub q: Vec<F>,
    pub k: Vec<F>,
    pub v: Vec<F>,
    pub y: Vec<F>,
    pub near: Near<F>,
}

impl<F: Float> LayerSeq<F> {
    /// Under sink+window's schedule.
    pub fn new(s: &FarShape, q: Vec<F>, k: Vec<F>, v: Vec<F>, y: Vec<F>) -> Self {
        Self::with_exits(s, window_exits(s), q, k, v, y)
    }

    /// Under any schedule (see [`near_part_with`]).
    pub fn with_exits(s: &FarShape, exits: Vec<usize>, q: Vec<F>, k: Vec<F>, v: Vec<F>, y: Vec<F>) -> Self {
        let near = near_part_with(s, exits, &q, &k, &v);
        LayerSeq { q, k, v, y, near }
    }

    /// Σ |o − y|² over the rows with a far set, and their count (rows = positions × heads).
    fn sq_err(&self, s: &FarShape, o: &[F]) -> (f64, usize) {
        let ff = self.near.first_far();
        let from = ff * s.n_heads * s.hd;
        let e = o[from..].iter().zip(&self.y[from..]).map(|(&a, &b)| (a - b).to_f64().powi(2)).sum();
        (e, (s.t - ff) * s.n_heads)
    }

    /// Σ |y|² over the same rows as the errors (their normaliser for a relative error).
    pub fn energy(&self, s: &FarShape) -> (f64, usize) {
        let zero = vec![F::ZERO; self.y.len()];
        self.sq_err(s, &zero)
    }

    /// The same error of plain sink+window (no far field).
    pub fn window_err(&self, s: &FarShape) -> (f64, usize) {
        let o = self.near.output(s.hd);
        self.sq_err(s, &o)
    }

    /// Mean squared error per row with the far field `p`, and ∂(that)/∂p added to `grads` when
    /// given.
    pub fn loss(&self, s: &FarShape, p: &FarParams<F>, grads: Option<&mut FarParams<F>>) -> (f64, usize) {
        match grads {
            None => {
                let mut o = vec![F::ZERO; self.q.len()];
                far_forward(s, p, &self.near, &self.q, &self.k, &self.v, &mut o);
                self.sq_err(s, &o)
            }
            Some(gr) => {
                let e = sweep(s, p, &self.near, &self.q, &self.k, &self.v, None, Upstream::Mse(&self.y), Some(gr), Rows::all());
                (e, (s.t - self.near.first_far()) * s.n_heads)
            }
        }
    }
}

/// The fit's starting point. U·q and W·k start as small random logits (spread ~0.1, which breaks
/// the features' symmetry); the norm terms γ start at zero; α = β = b, one shared offset, so the
/// far field starts as a *mean field*: every far key weighs e^{2b}·r, and the far part adds the
/// mean of the evicted values with that mass. b is the best such constant mass on `data`, found
/// by a line search in steps of e (from e^-32 to e^24 of a guess that puts e^-6 of the mean row's
/// near mass on the far keys). The guess alone was measured wrong by 2.5 in b on Gemma 3's layer 5
/// (a far mass that made its error 30% worse than dropping the keys, from which the fit never
/// recovered: it learned nothing); from the searched start the same layer's fit reaches 58% of
/// sink+window's error. When no mass helps, the search ends at the smallest (≈ no far field).
/// With `decay` the features start at time scales 1/δ spread geometrically from 32 positions to
/// four times the sequence (the search then runs with them in place); without, δ = 0.
pub fn init_params<F: Float>(s: &FarShape, data: &[LayerSeq<F>], seed: u64, decay: bool) -> FarParams<f64> {
    let mut rng = crate::gradcheck::Rng(seed);
    let mut p = FarParams::zeros(s);
    if decay {
        let (lo, hi) = (32f64.ln(), (4.0 * s.t.max(32) as f64).ln());
        for (i, x) in p.rho.iter_mut().enumerate() {
            let f = i % s.rank;
            let frac = if s.rank > 1 { f as f64 / (s.rank - 1) as f64 } else { 1.0 };
            *x = -(lo + frac * (hi - lo));
        }
    } else {
        p = p.without_decay();
    }
    let rho: Vec<F> = p.rho.iter().map(|&x| F::from_f64(x)).collect();
    let (mut sum, mut n) = (0.0, 0usize);
    let (mut near_count, mut far_count) = (0.0, 0.0);
    for d in data {
        // Keys gone by t: a running count of exits ≤ t.
        let mut gone_at = vec![0usize; s.t + 1];
        d.near.exits.iter().filter(|&&x| x < s.t).for_each(|&x| gone_at[x] += 1);
        let mut gone = 0;
        for (t, &g) in gone_at.iter().enumerate().take(s.t) {
            gone += g;
            if t < d.near.first_far() {
                continue;
            }
            let n_near = (t + 1 - gone) as f64;
            near_count += n_near;
            far_count += gone as f64;
            for h in 0..s.n_heads {
                let i = t * s.n_heads + h;
                sum += d.near.c[i].to_f64() + (d.near.den[i].to_f64() / n_near).ln();
                n += 1;
            }
        }
    }
    // The guess: total far mass e^{-6} of the near mass, per key near over far keys on the mean row.
    let ratio = if far_count > 0.0 { near_count / far_count } else { 1.0 };
    let per_key = if n > 0 { sum / n as f64 } else { 0.0 } - 6.0 + ratio.ln();
    let guess = (per_key - (s.rank as f64).ln()) / 2.0;
    // The line search over the mean field's offset (U = W = 0: every feature the same).
    let err = |b: f64| {
        let mut m = FarParams::<F>::zeros(s);
        m.rho.clone_from(&rho);
        m.alpha.iter_mut().chain(m.beta.iter_mut()).for_each(|x| *x = F::from_f64(b));
        let (e, rows) = data.iter().map(|d| d.loss(s, &m, None)).fold((0.0, 0), |a, x| (a.0 + x.0, a.1 + x.1));
        e / rows.max(1) as f64
    };
    let b = (-16..=12)
        .map(|k| guess + 0.5 * k as f64)
        .map(|b| (b, err(b)))
        .fold((guess - 8.0, f64::INFINITY), |best, x| if x.1 < best.1 { x } else { best })
        .0;
    let (qs, ks) = rms_norms(s, data);
    // U·q and W·k start with spread ~0.1 whatever the norms of q and k.
    p.u = rng.vec(p.u.len(), 0.1 / (qs * (s.hd as f64).sqrt()).max(1e-30));
    p.w = rng.vec(p.w.len(), 0.1 / (ks * (s.hd as f64).sqrt()).max(1e-30));
    p.alpha.iter_mut().chain(p.beta.iter_mut()).for_each(|x| *x = b);
    p
}

/// Root-mean-square norms of the queries and of the keys in `data` (the fit's input scales).
fn rms_norms<F: Float>(s: &FarShape, data: &[LayerSeq<F>]) -> (f64, f64) {
    let ms = |x: &[F], rows: usize| x.iter().map(|v| v.to_f64().powi(2)).sum::<f64>() / rows.max(1) as f64;
    let (mut q2, mut k2) = (0.0, 0.0);
    for d in data {
        q2 += ms(&d.q, s.t * s.n_heads);
        k2 += ms(&d.k, s.t * s.n_kv);
    }
    let n = data.len().max(1) as f64;
    ((q2 / n).sqrt(), (k2 / n).sqrt())
}

/// What `fit_layer` reports per step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FitStep {
    pub step: usize,
    /// Mean squared error per row over the step's sequences.
    pub loss: f64,
}

/// Stage 1 for one layer: full-batch AdamW over `data` (every sequence each step, spread over
/// the crate's pool), `steps` steps at `lr` with a cosine to lr/20. Returns the parameters.
/// Adam's step is the same size for every element whatever its gradient, so the norm terms take
/// lr/|q|² (γq) and lr/|k|² (γk), |·| the data's RMS norms: a step then moves the logits by about
/// lr, not lr·|q|² (which at lr 1e-2 threw the far field away in a few steps on SmolLM2's deep
/// layers; scaling U and W by 1/|q|, 1/|k| as well slowed the fit, measured).
/// `batch` sequences per step, taken in order and cycling (all of them: full batch).
/// With `held` (sequences never trained on, and a period) the fit is stopped early in effect:
/// the held-out error is measured every `period` steps and after the last, and the parameters
/// where it was lowest are returned (the deep layers of SmolLM2 fitted to 35% of sink+window's
/// error on the training windows but kept 50–65% on held-out ones).
#[allow(clippy::too_many_arguments)]
pub fn fit_layer<F: Float>(
    s: &FarShape,
    data: &[LayerSeq<F>],
    init: FarParams<F>,
    steps: usize,
    batch: usize,
    lr: f64,
    held: Option<(&[LayerSeq<F>], usize)>,
    mut report: impl FnMut(FitStep),
) -> FarParams<F> {
    let batch = batch.clamp(1, data.len().max(1));
    let opt = crate::optim::AdamW { lr, beta1: 0.9, beta2: 0.999, eps: 1e-12, weight_decay: 0.0 };
    let mut p = init;
    let mut st: Vec<crate::optim::AdamState<F>> = p.tensors().iter().map(|t| crate::optim::AdamState::new(t.len())).collect();
    let (qs, ks) = rms_norms(s, data);
    let (qs, ks) = (qs.max(1e-30), ks.max(1e-30));
    let mult = [1.0, 1.0, 1.0 / (qs * qs), 1.0, 1.0, 1.0 / (ks * ks), 1.0];
    let held_err = |p: &FarParams<F>, h: &[LayerSeq<F>]| {
        let mut parts: Vec<(f64, usize)> = vec![(0.0, 0); h.len()];
        crate::par::pool().for_rows_mut_dynamic(&mut parts, 1, 1, |i, it| it[0] = h[i].loss(s, p, None));
        let (e, n) = parts.iter().fold((0.0, 0), |a, x| (a.0 + x.0, a.1 + x.1));
        e / n.max(1) as f64
    };
    let mut best: Option<(f64, FarParams<F>)> = None;
    let mut keep_best = |p: &FarParams<F>| {
        if let Some((h, _)) = held {
            let e = held_err(p, h);
            if best.as_ref().is_none_or(|b| e < b.0 || b.0.is_nan()) {
                best = Some((e, p.clone()));
            }
        }
    };
    for step in 0..steps {
        if let Some((_, period)) = held
            && step > 0
            && step % period.max(1) == 0
        {
            keep_best(&p);
        }
        let mut parts: Vec<(FarParams<F>, f64, usize)> = (0..batch).map(|_| (FarParams::zeros(s), 0.0, 0)).collect();
        crate::par::pool().for_rows_mut_dynamic(&mut parts, 1, 1, |i, it| {
            let (g, e, n) = &mut it[0];
            (*e, *n) = data[(step * batch + i) % data.len()].loss(s, &p, Some(g));
        });
        let rows: usize = parts.iter().map(|x| x.2).sum::<usize>().max(1);
        let loss = parts.iter().map(|x| x.1).sum::<f64>() / rows as f64;
        let mut g = FarParams::zeros(s);
        for (pg, _, _) in &parts {
            for (a, b) in g.tensors_mut().into_iter().zip(pg.tensors()) {
                a.iter_mut().zip(b).for_each(|(x, &y)| *x += y);
            }
        }
        report(FitStep { step, loss });
        let lr_t = crate::optim::lr_schedule(step as u64, lr, lr / 20.0, (steps / 20).max(1) as u64, steps as u64);
        for (((t, gt), m), k) in p.tensors_mut().into_iter().zip(g.tensors()).zip(st.iter_mut()).zip(mult) {
            opt.step(step as u64 + 1, lr_t * k, t, gt, 1.0 / rows as f64, m);
        }
    }
    keep_best(&p);
    best.map_or(p, |b| b.1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::Rng;

    /// The start is a mean field at the best constant mass: on keys that all weigh the same
    /// (scores ≈ 0, the exact output the running mean of the values) the far keys should weigh
    /// what the near ones do, and the start then takes most of sink+window's error away; the
    /// bare guess (e^-6 of the near mass) does not.
    #[test]
    fn init_finds_the_mean_field_mass() {
        let s = FarShape { t: 48, n_heads: 4, n_kv: 2, hd: 6, rank: 4, sinks: 2, window: 6, scale: 1e-6 };
        let mut rng = Rng(11);
        let (q, k, v) = (rng.vec(s.t * 4 * 6, 1.0), rng.vec(s.t * 2 * 6, 1.0), rng.vec(s.t * 2 * 6, 1.0));
        let mut y = vec![0.0; q.len()];
        for t in 0..s.t {
            for h in 0..4 {
                let g = h / 2;
                for e in 0..6 {
                    y[(t * 4 + h) * 6 + e] = (0..=t).map(|j| v[(j * 2 + g) * 6 + e]).sum::<f64>() / (t + 1) as f64;
                }
            }
        }
        let d = LayerSeq::new(&s, q, k, v, y);
        let (sw, _) = d.window_err(&s);
        let p = init_params(&s, std::slice::from_ref(&d), 5, false);
        let (e, _) = d.loss(&s, &p, None);
        println!("sink+window {sw:.4e}, start {e:.4e}");
        assert!(e < 0.1 * sw, "the start keeps {:.1}% of sink+window's error", 100.0 * e / sw);
    }

    /// With held-out sequences the fit returns the parameters where their error was lowest:
    /// never worse there than the last step's, and here (a fit to noise, high lr) better.
    #[test]
    fn fit_keeps_the_best_held_out_parameters() {
        let s = FarShape { t: 24, n_heads: 2, n_kv: 1, hd: 4, rank: 2, sinks: 1, window: 4, scale: 0.5 };
        let mut rng = Rng(21);
        let seq = |rng: &mut Rng| {
            let (q, k, v, y) = (rng.vec(24 * 8, 1.0), rng.vec(24 * 4, 1.0), rng.vec(24 * 4, 1.0), rng.vec(24 * 8, 1.0));
            LayerSeq::new(&s, q, k, v, y)
        };
        let train = vec![seq(&mut rng)];
        let held = vec![seq(&mut rng)];
        let init = init_params(&s, &train, 1, true);
        let err = |p: &FarParams<f64>| held[0].loss(&s, p, None).0;
        let last = fit_layer(&s, &train, init.clone(), 60, 1, 0.1, None, |_| {});
        let best = fit_layer(&s, &train, init, 60, 1, 0.1, Some((&held, 5)), |_| {});
        println!("held out: last step {:.4e}, best {:.4e}", err(&last), err(&best));
        assert!(err(&best) < err(&last), "held out: best {} vs last {}", err(&best), err(&last));
    }

    /// The fused MSE sweep (`LayerSeq::loss` with gradients) gives the forward's loss and the
    /// gradients of `far_backward` fed 2(o − y).
    #[test]
    fn fused_mse_equals_forward_then_backward() {
        let s = FarShape { t: 16, n_heads: 4, n_kv: 2, hd: 6, rank: 3, sinks: 2, window: 5, scale: 0.4 };
        let mut rng = Rng(7);
        let (q, k, v, y) = (
            rng.vec(s.t * s.n_heads * s.hd, 1.0),
            rng.vec(s.t * s.n_kv * s.hd, 1.0),
            rng.vec(s.t * s.n_kv * s.hd, 1.0),
            rng.vec(s.t * s.n_heads * s.hd, 0.5),
        );
        let d = LayerSeq::new(&s, q, k, v, y);
        let mut p = init_params(&s, std::slice::from_ref(&d), 3, true);
        p.u.iter_mut().chain(p.w.iter_mut()).for_each(|x| *x *= 20.0);
        let (e0, n0) = d.loss(&s, &p, None);
        let mut g1 = FarParams::zeros(&s);
        let (e1, n1) = d.loss(&s, &p, Some(&mut g1));
        assert_eq!(n0, n1);
        assert!((e0 - e1).abs() <= 1e-12 * e0, "loss {e0} vs fused {e1}");
        let mut o = vec![0.0; d.q.len()];
        far_forward(&s, &p, &d.near, &d.q, &d.k, &d.v, &mut o);
        let from = d.near.first_far() * s.n_heads * s.hd;
        let d_o: Vec<f64> = (0..o.len()).map(|i| if i < from { 0.0 } else { 2.0 * (o[i] - d.y[i]) }).collect();
        let mut g2 = FarParams::zeros(&s);
        far_backward(&s, &p, &d.near, &d.q, &d.k, &d.v, &d_o, &mut g2);
        for (a, b) in g1.tensors().iter().zip(g2.tensors()) {
            for (x, y) in a.iter().zip(b) {
                assert!((x - y).abs() <= 1e-12 * (1.0 + y.abs()), "{x} vs {y}");
            }
        }
    }

    /// A schedule with a seal (many keys leave at one position), single evictions out of
    /// order and keys that never leave: the sweep's output equals the definition formed
    /// directly per row, o = (Σ_near e^s v + Σ_far Σ_f e^{a_f + b_f − δ_f(t − j)} v) / (Σ_near e^s + Σ_far …),
    /// with every feature decaying at its own rate.
    #[test]
    fn any_schedule_equals_the_direct_formula() {
        let s = FarShape { t: 24, n_heads: 4, n_kv: 2, hd: 5, rank: 3, sinks: 1, window: 4, scale: 0.4 };
        let exits = mixed_exits(s.t);
        let mut rng = Rng(9);
        let (q, k, v) = (rng.vec(s.t * 4 * 5, 1.0), rng.vec(s.t * 2 * 5, 1.0), rng.vec(s.t * 2 * 5, 1.0));
        let near = near_part_with(&s, exits.clone(), &q, &k, &v);
        assert_eq!(near.first_far(), 10);
        let p = FarParams::<f64>::random(&s, &mut rng);
        let mut o = vec![0.0; q.len()];
        far_forward(&s, &p, &near, &q, &k, &v, &mut o);
        let mut worst = 0f64;
        for t in 0..s.t {
            for h in 0..4 {
                let g = h / 2;
                let qr = &q[(t * 4 + h) * 5..][..5];
                let (mut num, mut den) = (vec![0.0; 5], 0.0);
                for j in 0..=t {
                    let kr = &k[(j * 2 + g) * 5..][..5];
                    let e = if exits[j] > t {
                        (dot(qr, kr) * s.scale).exp()
                    } else {
                        (0..3)
                            .map(|f| {
                                let a = dot(&p.u[(h * 3 + f) * 5..][..5], qr) - p.gq[h] * sq(qr) + p.alpha[h * 3 + f];
                                let b = dot(&p.w[(g * 3 + f) * 5..][..5], kr) - p.gk[g] * sq(kr) + p.beta[g * 3 + f];
                                (a + b - p.rho[g * 3 + f].exp() * (t - j) as f64).exp()
                            })
                            .sum()
                    };
                    den += e;
                    num.iter_mut().zip(&v[(j * 2 + g) * 5..][..5]).for_each(|(x, &y)| *x += e * y);
                }
                for d in 0..5 {
                    worst = worst.max((o[(t * 4 + h) * 5 + d] - num[d] / den).abs());
                }
            }
        }
        println!("max |sweep − direct| {worst:.3e}");
        assert!(worst < 1e-12, "sweep vs direct: {worst:.3e}");
    }

    /// Keys 1..=8 leave together at 10 (a seal), key 12 at 13, key 9 at 15, key 14 at 20; the
    /// sink (0) and the rest never.
    pub(crate) fn mixed_exits(t: usize) -> Vec<usize> {
        let mut e = vec![NEVER; t];
        (1..=8).for_each(|j| e[j] = 10);
        e[12] = 13;
        e[9] = 15;
        e[14] = 20;
        e
    }
}

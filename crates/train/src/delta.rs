//! GatedDeltaNet's recurrence with its backward by backpropagation through time, for polishing
//! hybrid models: the mixer has no trainable parameters here (its projections stay frozen), but
//! the gradient must flow through it to the layers below. Per head, with S: [dk, dv] from zero:
//! ```text
//! S ← e^{g_t}·S;   S ← S + k_t ⊗ β_t·(v_t − Sᵀk_t);   o_t = Sᵀq_t
//! ```
//! (the engine's `kernels::delta::gated_delta_recurrent`; q, k arrive normalized and scaled).
//! The forward keeps S at every CHECKPOINT-th step (T/64·dk·dv per head instead of T·dk·dv);
//! the backward replays each span from its checkpoint and walks it in reverse.
//!
//! Accumulation contract: param grads +=, activations =.

use crate::float::{Float, dot, wide};
use crate::par::pool;

/// Steps between stored states.
pub const CHECKPOINT: usize = 64;

/// q, k: [T, n_heads, dk]; v: [T, n_heads, dv]; g, beta: [T, n_heads]; o: [T, n_heads, dv].
#[derive(Debug, Clone, Copy)]
pub struct DeltaShape {
    pub n_heads: usize,
    pub dk: usize,
    pub dv: usize,
}

impl DeltaShape {
    #[track_caller]
    fn check<F>(&self, op: &str, q: &[F], k: &[F], v: &[F], g: &[F], beta: &[F]) -> usize {
        let (nh, dk, dv) = (self.n_heads, self.dk, self.dv);
        assert!(nh > 0 && dk > 0 && dv > 0 && q.len().is_multiple_of(nh * dk), "{op}: q must be [T, {nh}, {dk}]");
        let t = q.len() / (nh * dk);
        assert!(
            k.len() == q.len() && v.len() == t * nh * dv && g.len() == t * nh && beta.len() == t * nh,
            "{op}: k must be [{t}, {nh}, {dk}], v [{t}, {nh}, {dv}], g and beta [{t}, {nh}]"
        );
        t
    }
}

/// States saved by the forward: [n_heads, ceil(T/CHECKPOINT), dk, dv].
#[derive(Debug, Clone, Default)]
pub struct DeltaCheckpoints<F> {
    pub states: Vec<F>,
}

/// One step of head h at token t on S (in place); returns nothing, leaves kS, δ in the scratch.
#[inline]
#[allow(clippy::too_many_arguments)]
fn step<F: Float>(s: &mut [F], k: &[F], v: &[F], eg: F, beta: F, dk: usize, dv: usize, ks: &mut [F], delta: &mut [F]) {
    s.iter_mut().for_each(|x| *x *= eg); // S' = e^g·S
    ks.fill(F::ZERO);
    for r in 0..dk {
        let kr = k[r];
        ks.iter_mut().zip(&s[r * dv..][..dv]).for_each(|(a, &b)| *a += kr * b); // kS = S'ᵀk
    }
    for c in 0..dv {
        delta[c] = beta * (v[c] - ks[c]); // δ = β(v − kS)
    }
    for r in 0..dk {
        let kr = k[r];
        s[r * dv..][..dv].iter_mut().zip(delta.iter()).for_each(|(a, &b)| *a += kr * b); // S = S' + k⊗δ
    }
}

/// Forward: o [T, nh, dv] (written) and the checkpoints (written).
#[allow(clippy::too_many_arguments)]
pub fn delta_forward<F: Float>(
    sh: &DeltaShape,
    q: &[F],
    k: &[F],
    v: &[F],
    g: &[F],
    beta: &[F],
    o: &mut [F],
    ck: &mut DeltaCheckpoints<F>,
) {
    let t_len = sh.check("delta_forward", q, k, v, g, beta);
    let (nh, dk, dv) = (sh.n_heads, sh.dk, sh.dv);
    assert_eq!(o.len(), t_len * nh * dv, "delta_forward: o must be [T, nh, dv]");
    let n_ck = t_len.div_ceil(CHECKPOINT);
    let row = t_len * dv + n_ck * dk * dv; // per head: o [T, dv] | states [n_ck, dk, dv]
    let mut buf = vec![F::ZERO; nh * row];
    pool().for_rows_mut_dynamic(&mut buf, row, 1, |h, out| {
        wide(|| {
            let (oh, st) = out.split_at_mut(t_len * dv);
            let mut s = vec![F::ZERO; dk * dv]; // [dk, dv]
            let (mut ks, mut delta) = (vec![F::ZERO; dv], vec![F::ZERO; dv]);
            for t in 0..t_len {
                if t % CHECKPOINT == 0 {
                    st[t / CHECKPOINT * dk * dv..][..dk * dv].copy_from_slice(&s);
                }
                let (kt, vt) = (&k[(t * nh + h) * dk..][..dk], &v[(t * nh + h) * dv..][..dv]);
                step(&mut s, kt, vt, g[t * nh + h].exp(), beta[t * nh + h], dk, dv, &mut ks, &mut delta);
                let qt = &q[(t * nh + h) * dk..][..dk];
                let ot = &mut oh[t * dv..][..dv];
                ot.fill(F::ZERO);
                for r in 0..dk {
                    let qr = qt[r];
                    ot.iter_mut().zip(&s[r * dv..][..dv]).for_each(|(a, &b)| *a += qr * b); // o = Sᵀq
                }
            }
        })
    });
    ck.states.clear();
    ck.states.resize(nh * n_ck * dk * dv, F::ZERO);
    for h in 0..nh {
        let (oh, st) = buf[h * row..][..row].split_at(t_len * dv);
        for t in 0..t_len {
            o[(t * nh + h) * dv..][..dv].copy_from_slice(&oh[t * dv..][..dv]);
        }
        ck.states[h * n_ck * dk * dv..][..n_ck * dk * dv].copy_from_slice(st);
    }
}

/// Gradients of one backward call (all +=).
pub struct DeltaGrads<'a, F> {
    pub dq: &'a mut [F],
    pub dk: &'a mut [F],
    pub dv: &'a mut [F],
    pub dg: &'a mut [F],
    pub dbeta: &'a mut [F],
}

/// Backward through time (per step, dS the gradient w.r.t. S_t coming from later steps):
/// fwd: o = S_tᵀq           =>  dS += q⊗do;  dq += S_t·do
/// fwd: S_t = S' + k⊗δ       =>  dk += dS·δ;  dδ = dSᵀk;  dS' = dS
/// fwd: δ = β(v − S'ᵀk)      =>  dβ += dδ·(v − S'ᵀk);  dv += β·dδ;  d(kS) = −β·dδ
/// fwd: kS = S'ᵀk            =>  dS' += k⊗d(kS);  dk += S'·d(kS)
/// fwd: S' = e^g·S_{t−1}     =>  dg += ⟨dS', S'⟩;  dS_{t−1} = e^g·dS'
#[allow(clippy::too_many_arguments)]
pub fn delta_backward<F: Float>(
    sh: &DeltaShape,
    q: &[F],
    k: &[F],
    v: &[F],
    g: &[F],
    beta: &[F],
    ck: &DeltaCheckpoints<F>,
    d_o: &[F],
    grads: DeltaGrads<'_, F>,
) {
    let t_len = sh.check("delta_backward", q, k, v, g, beta);
    let (nh, dk, dv) = (sh.n_heads, sh.dk, sh.dv);
    let n_ck = t_len.div_ceil(CHECKPOINT);
    assert_eq!(ck.states.len(), nh * n_ck * dk * dv, "delta_backward: checkpoints are not from a forward of this shape");
    assert!(
        d_o.len() == v.len()
            && grads.dq.len() == q.len()
            && grads.dk.len() == k.len()
            && grads.dv.len() == v.len()
            && grads.dg.len() == g.len()
            && grads.dbeta.len() == beta.len(),
        "delta_backward: gradient buffers must match their inputs"
    );
    // Per head: dq [T, dk] | dk [T, dk] | dv [T, dv] | dg [T] | dβ [T].
    let row = t_len * (2 * dk + dv + 2);
    let mut buf = vec![F::ZERO; nh * row];
    pool().for_rows_mut_dynamic(&mut buf, row, 1, |h, out| {
        wide(|| {
            let (bq, rest) = out.split_at_mut(t_len * dk);
            let (bk, rest) = rest.split_at_mut(t_len * dk);
            let (bv, rest) = rest.split_at_mut(t_len * dv);
            let (bg, bb) = rest.split_at_mut(t_len);
            let mut ds = vec![F::ZERO; dk * dv]; // dS [dk, dv]
            let mut prev = vec![F::ZERO; CHECKPOINT * dk * dv]; // S_{t−1} of the span's steps
            let mut s = vec![F::ZERO; dk * dv];
            let (mut ks, mut delta, mut dks, mut dd) =
                (vec![F::ZERO; dv], vec![F::ZERO; dv], vec![F::ZERO; dv], vec![F::ZERO; dv]);
            for c in (0..n_ck).rev() {
                let (t0, t1) = (c * CHECKPOINT, ((c + 1) * CHECKPOINT).min(t_len));
                s.copy_from_slice(&ck.states[(h * n_ck + c) * dk * dv..][..dk * dv]);
                for t in t0..t1 {
                    prev[(t - t0) * dk * dv..][..dk * dv].copy_from_slice(&s);
                    let (kt, vt) = (&k[(t * nh + h) * dk..][..dk], &v[(t * nh + h) * dv..][..dv]);
                    step(&mut s, kt, vt, g[t * nh + h].exp(), beta[t * nh + h], dk, dv, &mut ks, &mut delta);
                }
                for t in (t0..t1).rev() {
                    let i = t * nh + h;
                    let (qt, kt, vt, dot_) = (&q[i * dk..][..dk], &k[i * dk..][..dk], &v[i * dv..][..dv], &d_o[i * dv..][..dv]);
                    let eg = g[i].exp();
                    // Rebuild S' (in `s`), kS, δ from S_{t−1}; S_t = S' + k⊗δ.
                    s.copy_from_slice(&prev[(t - t0) * dk * dv..][..dk * dv]);
                    s.iter_mut().for_each(|x| *x *= eg);
                    ks.fill(F::ZERO);
                    for r in 0..dk {
                        ks.iter_mut().zip(&s[r * dv..][..dv]).for_each(|(a, &b)| *a += kt[r] * b);
                    }
                    for cc in 0..dv {
                        delta[cc] = beta[i] * (vt[cc] - ks[cc]);
                    }
                    // fwd: o = S_tᵀq  =>  dS += q⊗do; dq += S_t·do   (S_t row r = S'_r + k_r·δ)
                    for r in 0..dk {
                        let sr = &s[r * dv..][..dv];
                        bq[t * dk + r] += dot(sr, dot_) + kt[r] * dot(&delta, dot_);
                        ds[r * dv..][..dv].iter_mut().zip(dot_).for_each(|(a, &b)| *a += qt[r] * b);
                    }
                    // fwd: S_t = S' + k⊗δ  =>  dk += dS·δ; dδ = dSᵀk
                    dd.fill(F::ZERO);
                    for r in 0..dk {
                        let dsr = &ds[r * dv..][..dv];
                        bk[t * dk + r] += dot(dsr, &delta);
                        dd.iter_mut().zip(dsr).for_each(|(a, &b)| *a += kt[r] * b);
                    }
                    // fwd: δ = β(v − kS)  =>  dβ += dδ·(v − kS); dv += β·dδ; d(kS) = −β·dδ
                    let mut db = F::ZERO;
                    for cc in 0..dv {
                        db += dd[cc] * (vt[cc] - ks[cc]);
                        bv[t * dv + cc] += beta[i] * dd[cc];
                        dks[cc] = -beta[i] * dd[cc];
                    }
                    bb[t] += db;
                    // fwd: kS = S'ᵀk  =>  dS' += k⊗d(kS); dk += S'·d(kS)
                    for r in 0..dk {
                        bk[t * dk + r] += dot(&s[r * dv..][..dv], &dks);
                        ds[r * dv..][..dv].iter_mut().zip(&dks).for_each(|(a, &b)| *a += kt[r] * b);
                    }
                    // fwd: S' = e^g·S_{t−1}  =>  dg += ⟨dS', S'⟩; dS_{t−1} = e^g·dS'
                    bg[t] += dot(&ds, &s);
                    ds.iter_mut().for_each(|x| *x *= eg);
                }
            }
        })
    });
    for h in 0..nh {
        let b = &buf[h * row..][..row];
        let (bq, rest) = b.split_at(t_len * dk);
        let (bk, rest) = rest.split_at(t_len * dk);
        let (bv, rest) = rest.split_at(t_len * dv);
        let (bg, bb) = rest.split_at(t_len);
        for t in 0..t_len {
            let i = t * nh + h;
            grads.dq[i * dk..][..dk].iter_mut().zip(&bq[t * dk..][..dk]).for_each(|(a, &x)| *a += x);
            grads.dk[i * dk..][..dk].iter_mut().zip(&bk[t * dk..][..dk]).for_each(|(a, &x)| *a += x);
            grads.dv[i * dv..][..dv].iter_mut().zip(&bv[t * dv..][..dv]).for_each(|(a, &x)| *a += x);
            grads.dg[i] += bg[t];
            grads.dbeta[i] += bb[t];
        }
    }
}

//! Exact causal softmax attention with GQA (query head h reads kv head h / (n_heads/n_kv)) and an
//! optional sliding window (key j visible from t when t − j < window; Gemma's local layers).
//! Nothing T×T is stored: the forward keeps the per-row log-sum-exp [T, n_heads] (f64) and the
//! backward recomputes the probabilities, FlashAttention style, in two pooled passes: one over
//! query rows (dq, rows are independent) and one over key rows (dk, dv), so no two threads add
//! into the same row.
//!
//! Accumulation contract: param grads +=, activations =.

use crate::float::{Float, dot};
use crate::par::pool;

/// Shapes and constants of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Score scale (usually 1/√head_dim).
    pub scale: f64,
    /// Sliding window (None: full causal).
    pub window: Option<usize>,
}

impl AttnShape {
    /// First visible key of row t.
    #[inline]
    fn lo(&self, t: usize) -> usize {
        self.window.map_or(0, |w| (t + 1).saturating_sub(w))
    }
    /// One past the last row that sees key j.
    #[inline]
    fn hi(&self, j: usize, t_len: usize) -> usize {
        self.window.map_or(t_len, |w| (j + w).min(t_len))
    }
    #[track_caller]
    fn check<F>(&self, op: &str, q: &[F], k: &[F], v: &[F]) -> usize {
        let (nh, nkv, hd) = (self.n_heads, self.n_kv_heads, self.head_dim);
        assert!(nkv > 0 && hd > 0 && nh.is_multiple_of(nkv) && nh > 0, "{op}: {nh} query heads over {nkv} kv heads");
        assert!(q.len().is_multiple_of(nh * hd), "{op}: q must be [T, {nh}, {hd}]");
        let t = q.len() / (nh * hd);
        assert!(k.len() == t * nkv * hd && v.len() == k.len(), "{op}: k, v must be [{t}, {nkv}, {hd}]");
        assert!(self.window != Some(0), "{op}: window 0 sees no key");
        t
    }
}

/// Forward: q [T, nh, hd], k, v [T, nkv, hd] -> o [T, nh, hd] (written), lse [T, nh] (written).
/// fwd: p[t,j] = exp(q_t·k_j·s − lse_t), o_t = Σ_j p[t,j]·v_j
pub fn attention_forward<F: Float>(sh: &AttnShape, q: &[F], k: &[F], v: &[F], o: &mut [F], lse: &mut [f64]) {
    let t_len = sh.check("attention_forward", q, k, v);
    let (nh, nkv, hd) = (sh.n_heads, sh.n_kv_heads, sh.head_dim);
    assert!(o.len() == q.len() && lse.len() == t_len * nh, "attention_forward: o must be [T, nh, hd], lse [T, nh]");
    let grp = nh / nkv;
    let s = F::from_f64(sh.scale);
    let row = nh * (hd + 1); // o row, then lse row
    let mut buf = vec![F::ZERO; t_len * row];
    pool().for_rows_mut_dynamic(&mut buf, row, 8, |t0, rows| {
        let mut sc = vec![F::ZERO; t_len];
        for (r, out) in rows.chunks_exact_mut(row).enumerate() {
            let t = t0 + r;
            let lo = sh.lo(t);
            let (orow, lrow) = out.split_at_mut(nh * hd);
            for h in 0..nh {
                let g = h / grp;
                let qh = &q[(t * nh + h) * hd..][..hd];
                let mut mx = F::from_f64(f64::NEG_INFINITY);
                for j in lo..=t {
                    sc[j] = dot(qh, &k[(j * nkv + g) * hd..][..hd]) * s;
                    mx = mx.max(sc[j]);
                }
                let oh = &mut orow[h * hd..][..hd];
                oh.fill(F::ZERO);
                let mut z = F::ZERO;
                for j in lo..=t {
                    let p = (sc[j] - mx).exp();
                    z += p;
                    oh.iter_mut().zip(&v[(j * nkv + g) * hd..][..hd]).for_each(|(a, &b)| *a += p * b);
                }
                let inv = F::ONE / z;
                oh.iter_mut().for_each(|a| *a *= inv);
                lrow[h] = mx + z.ln();
            }
        }
    });
    for t in 0..t_len {
        o[t * nh * hd..][..nh * hd].copy_from_slice(&buf[t * row..][..nh * hd]);
        for h in 0..nh {
            lse[t * nh + h] = buf[t * row + nh * hd + h].to_f64();
        }
    }
}

/// Backward.
/// fwd: s = q_t·k_j·scale, p = softmax_j(s), o_t = Σ_j p·v_j
///   =>  dv_j += p·do_t;  ds = p·(do_t·v_j − do_t·o_t);  dq_t += scale·ds·k_j;  dk_j += scale·ds·q_t
#[allow(clippy::too_many_arguments)]
pub fn attention_backward<F: Float>(
    sh: &AttnShape,
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
    let t_len = sh.check("attention_backward", q, k, v);
    let (nh, nkv, hd) = (sh.n_heads, sh.n_kv_heads, sh.head_dim);
    assert!(
        o.len() == q.len() && d_o.len() == q.len() && dq.len() == q.len() && dk.len() == k.len() && dv.len() == v.len(),
        "attention_backward: o, do, dq must be [T, nh, hd], dk, dv [T, nkv, hd]"
    );
    assert_eq!(lse.len(), t_len * nh, "attention_backward: lse must be [T, nh]");
    let grp = nh / nkv;
    let s = F::from_f64(sh.scale);
    // D[t,h] = do_t·o_t  [T, nh]
    let dd: Vec<F> = (0..t_len * nh).map(|r| dot(&d_o[r * hd..][..hd], &o[r * hd..][..hd])).collect();
    let p_of = |t: usize, h: usize, x: F| F::from_f64((x.to_f64() - lse[t * nh + h]).exp());
    // Pass 1, query rows: dq_t += scale·Σ_j ds·k_j.
    pool().for_rows_mut_dynamic(dq, nh * hd, 8, |t0, rows| {
        for (r, dqr) in rows.chunks_exact_mut(nh * hd).enumerate() {
            let t = t0 + r;
            for h in 0..nh {
                let g = h / grp;
                let (qh, doh) = (&q[(t * nh + h) * hd..][..hd], &d_o[(t * nh + h) * hd..][..hd]);
                let dqh = &mut dqr[h * hd..][..hd];
                for j in sh.lo(t)..=t {
                    let kj = &k[(j * nkv + g) * hd..][..hd];
                    let p = p_of(t, h, dot(qh, kj) * s);
                    let ds = p * (dot(doh, &v[(j * nkv + g) * hd..][..hd]) - dd[t * nh + h]);
                    dqh.iter_mut().zip(kj).for_each(|(a, &b)| *a += s * ds * b);
                }
            }
        }
    });
    // Pass 2, key rows: dk_j, dv_j over every (t, h) that sees j. Scratch [T, 2, nkv, hd].
    let row = 2 * nkv * hd;
    let mut buf = vec![F::ZERO; t_len * row];
    pool().for_rows_mut_dynamic(&mut buf, row, 8, |j0, rows| {
        for (r, out) in rows.chunks_exact_mut(row).enumerate() {
            let j = j0 + r;
            let (dkr, dvr) = out.split_at_mut(nkv * hd);
            for h in 0..nh {
                let g = h / grp;
                let (kj, vj) = (&k[(j * nkv + g) * hd..][..hd], &v[(j * nkv + g) * hd..][..hd]);
                let (dkj, dvj) = (&mut dkr[g * hd..][..hd], &mut dvr[g * hd..][..hd]);
                for t in j..sh.hi(j, t_len) {
                    let (qh, doh) = (&q[(t * nh + h) * hd..][..hd], &d_o[(t * nh + h) * hd..][..hd]);
                    let p = p_of(t, h, dot(qh, kj) * s);
                    dvj.iter_mut().zip(doh).for_each(|(a, &b)| *a += p * b);
                    let ds = p * (dot(doh, vj) - dd[t * nh + h]);
                    dkj.iter_mut().zip(qh).for_each(|(a, &b)| *a += s * ds * b);
                }
            }
        }
    });
    for j in 0..t_len {
        let (bk, bv) = buf[j * row..][..row].split_at(nkv * hd);
        dk[j * nkv * hd..][..nkv * hd].iter_mut().zip(bk).for_each(|(a, &b)| *a += b);
        dv[j * nkv * hd..][..nkv * hd].iter_mut().zip(bv).for_each(|(a, &b)| *a += b);
    }
}

//! Exact causal softmax attention with GQA (query head h reads kv head h / (n_heads/n_kv)) and an
//! optional sliding window (key j visible from t when t − j < window; Gemma's local layers).
//! Nothing T×T is stored: the forward keeps the per-row log-sum-exp [T, n_heads] (f64) and the
//! backward recomputes the probabilities. Both run per query head (pooled over heads; a head's
//! dk, dv go to its own buffer, summed over the group afterwards) in blocks of BLOCK query rows
//! against the keys the block sees, as matrix products through [`Float::gemm_nn`] (f32: the
//! kernels' AVX-512 attention-form kernel): S = Q·Kᵀ, O = P·V; dP = dO·Vᵀ, dQ = dS·K,
//! dK = dSᵀ·Q, dV = Pᵀ·dO. A block's scores are [BLOCK, T] (512 KB at T = 2048 in f32).
//!
//! Accumulation contract: param grads +=, activations =.

use crate::float::{Float, dot, transpose_heads, wide};
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

/// Query rows per block.
const BLOCK: usize = 64;

/// x [T, n, hd] -> [n, T, hd] (each head's rows contiguous).
fn split_heads<F: Float>(x: &[F], n: usize, hd: usize) -> Vec<F> {
    let t_len = x.len() / (n * hd);
    let mut out = vec![F::ZERO; x.len()];
    for t in 0..t_len {
        for g in 0..n {
            out[(g * t_len + t) * hd..][..hd].copy_from_slice(&x[(t * n + g) * hd..][..hd]);
        }
    }
    out
}

/// a [rows, cols] -> [cols, rows].
fn transpose<F: Float>(a: &[F], rows: usize, cols: usize, out: &mut [F]) {
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = a[r * cols + c];
        }
    }
}

/// Forward: q [T, nh, hd], k, v [T, nkv, hd] -> o [T, nh, hd] (written), lse [T, nh] (written).
/// fwd: p\[t,j\] = exp(q_t·k_j·s − lse_t), o_t = Σ_j p\[t,j\]·v_j
pub fn attention_forward<F: Float>(sh: &AttnShape, q: &[F], k: &[F], v: &[F], o: &mut [F], lse: &mut [f64]) {
    let t_len = sh.check("attention_forward", q, k, v);
    let (nh, nkv, hd) = (sh.n_heads, sh.n_kv_heads, sh.head_dim);
    assert!(o.len() == q.len() && lse.len() == t_len * nh, "attention_forward: o must be [T, nh, hd], lse [T, nh]");
    let grp = nh / nkv;
    let s = F::from_f64(sh.scale);
    let (qh, kt, vh) = (split_heads(q, nh, hd), transpose_heads(k, nkv, hd), split_heads(v, nkv, hd));
    // Per head: o [T, hd] | lse [T], in f64 so lse keeps its precision (o values are exact in it).
    let row = t_len * (hd + 1);
    let mut buf = vec![0.0f64; nh * row];
    pool().for_rows_mut_dynamic(&mut buf, row, 1, |h, out| {
        wide(|| {
            let g = h / grp;
            let (oh, lh) = out.split_at_mut(t_len * hd);
            let mut sc = vec![F::ZERO; BLOCK * t_len]; // S, then P [nb, nk]
            let mut ob = vec![F::ZERO; BLOCK * hd]; // [nb, hd]
            for t0 in (0..t_len).step_by(BLOCK) {
                let (t1, klo) = ((t0 + BLOCK).min(t_len), sh.lo(t0));
                let (nb, nk) = (t1 - t0, t1 - klo);
                // S [nb, nk] = Q_B·Kᵀ[:, klo..t1]
                F::gemm_nn(&qh[(h * t_len + t0) * hd..][..nb * hd], nb, &kt[g * hd * t_len + klo..], t_len, hd, nk, &mut sc, nk);
                for r in 0..nb {
                    let t = t0 + r;
                    let (lo, hi) = (sh.lo(t) - klo, t + 1 - klo);
                    let sr = &mut sc[r * nk..][..nk];
                    sr[..lo].fill(F::ZERO);
                    sr[hi..].fill(F::ZERO);
                    let mut mx = F::from_f64(f64::NEG_INFINITY);
                    for x in &mut sr[lo..hi] {
                        *x *= s;
                        mx = mx.max(*x);
                    }
                    sr[lo..hi].iter_mut().for_each(|x| *x -= mx);
                    F::exp_inplace(&mut sr[lo..hi]);
                    let z: f64 = sr[lo..hi].iter().map(|x| x.to_f64()).sum();
                    let inv = F::from_f64(1.0 / z);
                    sr[lo..hi].iter_mut().for_each(|x| *x *= inv);
                    lh[t] = mx.to_f64() + z.ln();
                }
                // O_B [nb, hd] = P·V[klo..t1]
                F::gemm_nn(&sc, nb, &vh[(g * t_len + klo) * hd..], hd, nk, hd, &mut ob, hd);
                oh[t0 * hd..t1 * hd].iter_mut().zip(&ob[..nb * hd]).for_each(|(a, b)| *a = b.to_f64());
            }
        })
    });
    for h in 0..nh {
        let (oh, lh) = buf[h * row..][..row].split_at(t_len * hd);
        for t in 0..t_len {
            o[(t * nh + h) * hd..][..hd].iter_mut().zip(&oh[t * hd..][..hd]).for_each(|(a, &b)| *a = F::from_f64(b));
            lse[t * nh + h] = lh[t];
        }
    }
}

/// Backward.
/// fwd: s = q_t·k_j·scale, p = softmax_j(s), o_t = Σ_j p·v_j
///   =>  dv_j += p·do_t;  ds = p·(do_t·v_j − do_t·o_t);  dq_t += scale·ds·k_j;  dk_j += scale·ds·q_t
/// (per block: dP = dO·Vᵀ, dS = P ⊙ (dP − D)·scale, dQ += dS·K, dK += dSᵀ·Q, dV += Pᵀ·dO)
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
    let (qh, dh) = (split_heads(q, nh, hd), split_heads(d_o, nh, hd)); // [nh, T, hd]
    let kh = split_heads(k, nkv, hd); // [nkv, T, hd]
    let (kt, vt) = (transpose_heads(k, nkv, hd), transpose_heads(v, nkv, hd)); // [nkv, hd, T]
    // Per query head: dq [T, hd] | dk [T, hd] | dv [T, hd].
    let row = 3 * t_len * hd;
    let mut buf = vec![F::ZERO; nh * row];
    pool().for_rows_mut_dynamic(&mut buf, row, 1, |h, out| {
        wide(|| {
            let g = h / grp;
            let (dqh, rest) = out.split_at_mut(t_len * hd);
            let (dkh, dvh) = rest.split_at_mut(t_len * hd);
            let mut p = vec![F::ZERO; BLOCK * t_len]; // P [nb, nk]
            let mut ds = vec![F::ZERO; BLOCK * t_len]; // dP, then dS [nb, nk]
            let mut tr = vec![F::ZERO; BLOCK * t_len]; // Pᵀ or dSᵀ [nk, nb]
            let mut tmp = vec![F::ZERO; t_len * hd];
            for t0 in (0..t_len).step_by(BLOCK) {
                let (t1, klo) = ((t0 + BLOCK).min(t_len), sh.lo(t0));
                let (nb, nk) = (t1 - t0, t1 - klo);
                let qb = &qh[(h * t_len + t0) * hd..][..nb * hd];
                let db = &dh[(h * t_len + t0) * hd..][..nb * hd];
                F::gemm_nn(qb, nb, &kt[g * hd * t_len + klo..], t_len, hd, nk, &mut p, nk); // S
                F::gemm_nn(db, nb, &vt[g * hd * t_len + klo..], t_len, hd, nk, &mut ds, nk); // dP
                for r in 0..nb {
                    let t = t0 + r;
                    let (lo, hi) = (sh.lo(t) - klo, t + 1 - klo);
                    let (pr, dr) = (&mut p[r * nk..][..nk], &mut ds[r * nk..][..nk]);
                    let l = lse[t * nh + h];
                    pr[..lo].fill(F::ZERO);
                    pr[hi..].fill(F::ZERO);
                    pr[lo..hi].iter_mut().for_each(|x| *x = F::from_f64((*x * s).to_f64() - l));
                    F::exp_inplace(&mut pr[lo..hi]);
                    let d = dd[t * nh + h];
                    dr.iter_mut().zip(pr.iter()).for_each(|(x, &pv)| *x = s * pv * (*x - d));
                }
                // dQ_B += dS·K[klo..t1]
                F::gemm_nn(&ds, nb, &kh[(g * t_len + klo) * hd..], hd, nk, hd, &mut tmp, hd);
                dqh[t0 * hd..t1 * hd].iter_mut().zip(&tmp[..nb * hd]).for_each(|(a, &b)| *a += b);
                // dK[klo..t1] += dSᵀ·Q_B
                transpose(&ds[..nb * nk], nb, nk, &mut tr);
                F::gemm_nn(&tr, nk, qb, hd, nb, hd, &mut tmp, hd);
                dkh[klo * hd..t1 * hd].iter_mut().zip(&tmp[..nk * hd]).for_each(|(a, &b)| *a += b);
                // dV[klo..t1] += Pᵀ·dO_B
                transpose(&p[..nb * nk], nb, nk, &mut tr);
                F::gemm_nn(&tr, nk, db, hd, nb, hd, &mut tmp, hd);
                dvh[klo * hd..t1 * hd].iter_mut().zip(&tmp[..nk * hd]).for_each(|(a, &b)| *a += b);
            }
        })
    });
    add_head_grads(&buf, t_len, nh, nkv, hd, dq, dk, dv);
}

/// Adds per-query-head gradient buffers (`buf`: per head dq [T, hd] | dk [T, hd] | dv [T, hd])
/// into dq [T, nh, hd] and, summed over each kv group, dk, dv [T, nkv, hd] (+=).
#[allow(clippy::too_many_arguments)]
pub(crate) fn add_head_grads<F: Float>(
    buf: &[F],
    t_len: usize,
    nh: usize,
    nkv: usize,
    hd: usize,
    dq: &mut [F],
    dk: &mut [F],
    dv: &mut [F],
) {
    let (grp, row) = (nh / nkv, 3 * t_len * hd);
    for h in 0..nh {
        let g = h / grp;
        let b = &buf[h * row..][..row];
        let (bq, rest) = b.split_at(t_len * hd);
        let (bk, bv) = rest.split_at(t_len * hd);
        for t in 0..t_len {
            dq[(t * nh + h) * hd..][..hd].iter_mut().zip(&bq[t * hd..][..hd]).for_each(|(a, &x)| *a += x);
            dk[(t * nkv + g) * hd..][..hd].iter_mut().zip(&bk[t * hd..][..hd]).for_each(|(a, &x)| *a += x);
            dv[(t * nkv + g) * hd..][..hd].iter_mut().zip(&bv[t * hd..][..hd]).for_each(|(a, &x)| *a += x);
        }
    }
}

//! The Nyström O(1) attention operator in matrix form (teacher-forced, every row of a training
//! window at once) with its backward: the student's attention in `cortiq polish`. It re-implements
//! the contract of the engine's `o1::nystrom::matrix_form` (no engine dependency; the forward
//! agrees with it to f64 rounding), with the ridge inverse M held constant in the backward.
//!
//! Agreement with the engine's matrix_form (checked with a scratch crate depending on both,
//! outside the workspace, since this crate must not depend on the engine): max |diff| 1.3e-12
//! on outputs of size O(1) over 8 random cases (GQA, odd dims, tp = 1, the degenerate boundary,
//! scores up to ±150, StreamingLLM), identical dropped rows.
//!
//! # The operator (per query head h, kv head g = h / (n_heads / n_kv_heads))
//! * Rows t < tp (the prompt) are exact causal attention.
//! * Landmarks: m = clamp(tp/8, 4, landmarks) segments [i·tp/m, (i+1)·tp/m) of the prompt;
//!   q̃_i, k̃_i = segment means of the prompt's (post-RoPE) queries of head h / keys of head g.
//!   Au\[i,l\] = exp(q̃_i·k̃_l·s); M = (AuᵀAu + λI)⁻¹Auᵀ, λ = ridge·tr(AuᵀAu)/m, in f64 by
//!   Cholesky, stored scaled (M = e^{−γ}·M̂, γ = max q̃·k̃·s, so nothing overflows). M is part of
//!   the [`NystromPlan`], built once per forward and **constant** in the backward (the landmark
//!   means are not: gradients flow through q̃, k̃ into the prompt's q and k).
//! * A prompt with tp ≤ window + sinks + 8 has no skeleton: every row is exact.
//! * Row t ≥ tp: near keys (t − j < window, or j < sinks) weigh exp(q_t·k_j·s − c); far keys
//!   (the other j ≤ t) weigh a\[t,j\] = e^{−c}·Σ_i w_i·e\[i,j\], w = fu·M, fu_l = exp(q_t·k̃_l·s),
//!   e\[i,j\] = exp(q̃_i·k_j·s). Aggregate guard: Σ_far a\[t,j\] < 0 drops the row's far field
//!   entirely, otherwise it is kept raw. o_t = Σ weight·v / max(Σ weight, 1e-30).
//!   c = max(max near score, u_max − γ + max over far keys seen so far of max_i q̃_i·k_j·s), as
//!   the engine; o does not depend on c except through the floor, so c is a constant in the
//!   backward.
//!
//! # Numerics
//! Everything runs in f64 whatever F is: the far field is a cancelling sum (w has mixed signs,
//! |w| up to ~1/√λ), which f32 would amplify. Stored factors are max-shifted as in the engine:
//! E'\[i,j\] = exp(x_ij − cm_j) with x_ij = q̃_i·k_j·s and cm_j = max_i x_ij; f̂u = exp(u − u_max);
//! ŵ = f̂u·M̂; a_j = r_j·Σ_i ŵ_i·E'\[i,j\] with r_j = exp(u_max − γ − c + cm_j) ≤ 1 (computed as
//! a per-row factor times exp(cm_j − max cm) when the spread of cm allows; agrees with the
//! engine's per-key exp to f64 rounding).
//!
//! # Two far-field paths
//! The direct path forms every a\[t,j\] (O(T²·m) per head): the reference, kept and tested. The
//! default path (`head_stream`) uses the streaming form's accumulators teacher-forced: the far
//! range of row t is the prefix [sinks, t+1−window), so Σ_far a·v and Σ_far a are prefix sums
//! over keys of E''·v and E'' contracted with ŵ_t, O(m·(m + hd)) per row, and the backward is the
//! same sums swept in reverse. The two agree to ~1e-13 (unit test); the prefix path needs the
//! spread of cm under 600 (else the direct path runs). At T = 1024, tp = 512, W = 64, m = 64,
//! 9 heads of 64: forward 152 -> 50 ms, backward 401 -> 119 ms on this machine's 2 threads; what
//! remains is the exact attention of the prompt rows.
//!
//! # Backward (per row, den ≥ floor; D = do_t·o_t)
//! fwd: o = Σ_j x_j·v_j / den  =>  dx_j = (do·v_j − D)/den;  dv_j += x_j·do/den
//! near: fwd: x_j = exp(q_t·k_j·s − c)  =>  ds = x_j·dx_j; dq_t += s·ds·k_j; dk_j += s·ds·q_t
//! far (kept row only; a dropped row contributes no far gradient):
//!   fwd: a_j = r_j Σ_i ŵ_i E'_ij  =>  dŵ_i += Σ_j dx_j·r_j·E'_ij;
//!        ∂a_j/∂x_ij = r_j ŵ_i E'_ij, so G\[i,j\] += ŵ_i·dx_j·r_j and, after all rows,
//!        P = G ⊙ E': dq̃_i += s·Σ_j P_ij·k_j; dk_j += s·Σ_i P_ij·q̃_i
//!   fwd: ŵ_i = Σ_l f̂u_l M̂\[l,i\], f̂u_l = exp(u_l − u_max)  =>  du_l = f̂u_l·Σ_i M̂\[l,i\]·dŵ_i;
//!        dq_t += s·Σ_l du_l·k̃_l;  dk̃_l += s·du_l·q_t
//!   (u_max cancels between f̂u and r_j, so it is a constant too.)
//! Finally dq̃, dk̃ scatter back to the prompt's rows (landmark::segment_means_backward).
//!
//! Accumulation contract: param grads +=, activations =.

// Index loops over parallel arrays (landmark i, landmark key l, channel c) mirror the formulas.
#![allow(clippy::needless_range_loop)]

use crate::attention::{AttnShape, attention_backward, attention_forward};
use crate::float::Float;
use crate::landmark::{segment, segment_means_backward};
use crate::par::pool;

/// Largest landmark count accepted (the m×m solve is by hand in f64).
pub const MAX_LANDMARKS: usize = 256;
/// Default ridge factor.
pub const DEFAULT_RIDGE: f64 = 1e-6;
/// Output denominator floor (applied to the e^{−c}-scaled sum).
pub const DEN_FLOOR: f64 = 1e-30;

/// Bad O(1) settings, or a ridge system that is not positive definite. Setting errors name the
/// CLI flag, as the engine's.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NystromError {
    #[error("--o1-window: must be at least 1, got 0")]
    ZeroWindow,
    #[error("--o1-sinks: {sinks} exceeds --o1-window {window}")]
    SinksOverWindow { sinks: usize, window: usize },
    #[error("--o1-landmarks: {landmarks} is outside 4..={MAX_LANDMARKS}")]
    Landmarks { landmarks: usize },
    #[error("--o1-ridge: {ridge} must be finite and > 0")]
    Ridge { ridge: f64 },
    #[error("nystrom: ridge system of query head {head} is not positive definite (ridge too small?)")]
    NotPositiveDefinite { head: usize },
}

/// What happens to keys that are neither sinks nor in the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Far {
    /// Nyström landmark skeleton.
    Skeleton,
    /// StreamingLLM: far keys dropped.
    Drop,
}

/// O(1) settings (the engine's `O1Settings` plus the far-field kind).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct O1Config {
    pub window: usize,
    pub sinks: usize,
    pub landmarks: usize,
    pub ridge: f64,
    pub far: Far,
}

impl O1Config {
    pub fn validate(&self) -> Result<(), NystromError> {
        if self.window == 0 {
            return Err(NystromError::ZeroWindow);
        }
        if self.sinks > self.window {
            return Err(NystromError::SinksOverWindow { sinks: self.sinks, window: self.window });
        }
        if !(4..=MAX_LANDMARKS).contains(&self.landmarks) {
            return Err(NystromError::Landmarks { landmarks: self.landmarks });
        }
        if !(self.ridge.is_finite() && self.ridge > 0.0) {
            return Err(NystromError::Ridge { ridge: self.ridge });
        }
        Ok(())
    }

    /// m_eff = clamp(tp/8, 4, landmarks).
    pub fn m_eff(&self, tp: usize) -> usize {
        (tp / 8).clamp(4, self.landmarks.max(4))
    }

    /// Whether a prompt of tp tokens seals a skeleton.
    pub fn seals_skeleton(&self, tp: usize) -> bool {
        self.far == Far::Skeleton && tp > self.window + self.sinks + 8
    }
}

/// Shapes of one call: q [T, n_heads, hd], k, v [T, n_kv_heads, hd]; the first tp rows are the
/// prompt.
#[derive(Debug, Clone, Copy)]
pub struct NyShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub scale: f64,
    pub tp: usize,
}

impl NyShape {
    #[track_caller]
    fn check<F>(&self, op: &str, q: &[F], k: &[F], v: Option<&[F]>) -> usize {
        let (nh, nkv, hd) = (self.n_heads, self.n_kv_heads, self.head_dim);
        assert!(nkv > 0 && nh > 0 && hd > 0 && nh.is_multiple_of(nkv), "{op}: {nh} query heads over {nkv} kv heads");
        assert!(q.len().is_multiple_of(nh * hd), "{op}: q must be [T, {nh}, {hd}]");
        let t = q.len() / (nh * hd);
        assert!(k.len() == t * nkv * hd && v.is_none_or(|v| v.len() == k.len()), "{op}: k, v must be [{t}, {nkv}, {hd}]");
        assert!(self.tp <= t, "{op}: prompt length {} exceeds T = {t}", self.tp);
        t
    }
}

/// The frozen part of the operator for one window: per query head (γ, M̂ [m, m]) with
/// M = e^{−γ}·M̂, M̂\[l,i\] rows over landmark keys l, columns over landmark queries i.
#[derive(Debug, Clone)]
pub struct NystromPlan {
    pub m: usize,
    /// A skeleton was sealed (else rows past the prompt are windowed (Drop) or exact).
    pub skeleton: bool,
    /// Rows past the prompt see sinks + window exactly (false: a short prompt, all exact).
    pub windowed: bool,
    pub inv: Vec<(f64, Vec<f64>)>,
}

/// Segment means in f64: x [T, n, hd] -> [n, m, hd].
fn means64<F: Float>(x: &[F], tp: usize, m: usize, n: usize, hd: usize) -> Vec<f64> {
    let mut out = vec![0.0; n * m * hd];
    for i in 0..m {
        let (lo, hi) = segment(i, tp, m);
        for p in lo..hi {
            for g in 0..n {
                let src = &x[(p * n + g) * hd..][..hd];
                out[(g * m + i) * hd..][..hd].iter_mut().zip(src).for_each(|(o, s)| *o += s.to_f64());
            }
        }
        let inv = 1.0 / (hi - lo) as f64;
        for g in 0..n {
            out[(g * m + i) * hd..][..hd].iter_mut().for_each(|o| *o *= inv);
        }
    }
    out
}

#[inline(always)]
fn dot64(a: &[f64], b: &[f64]) -> f64 {
    let mut acc = [0.0f64; 4];
    let (ca, cb) = (a.chunks_exact(4), b.chunks_exact(4));
    let tail: f64 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for u in 0..4 {
            acc[u] += x[u] * y[u];
        }
    }
    acc[0] + acc[1] + acc[2] + acc[3] + tail
}

/// `out[j] = x·mt[·, j]` for j in lo..hi, mt [len(x), ld] (a transposed K or V): the dot
/// products of one row against a range of keys as len(x) contiguous multiply-adds over the keys,
/// which vectorize without reassociating a sum (the per-key dot was the op's hot spot).
#[inline(always)]
fn row_dots(x: &[f64], mt: &[f64], ld: usize, lo: usize, hi: usize, out: &mut [f64]) {
    let o = &mut out[lo..hi];
    o.fill(0.0);
    for (c, &xc) in x.iter().enumerate() {
        o.iter_mut().zip(&mt[c * ld + lo..c * ld + hi]).for_each(|(y, &z)| *y += xc * z);
    }
}

/// (γ, M̂) of one head from its landmarks qt, kt [m, hd].
fn ridge_inverse(
    qt: &[f64],
    kt: &[f64],
    m: usize,
    hd: usize,
    scale: f64,
    ridge: f64,
    head: usize,
) -> Result<(f64, Vec<f64>), NystromError> {
    let mut s = vec![0.0; m * m]; // [m_q, m_k]
    for i in 0..m {
        for l in 0..m {
            s[i * m + l] = dot64(&qt[i * hd..][..hd], &kt[l * hd..][..hd]) * scale;
        }
    }
    // γ rounded to f32 as the engine's streaming state stores it (M = e^{−γ}M̂ for any γ).
    let gamma = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max) as f32 as f64;
    let a: Vec<f64> = s.iter().map(|x| (x - gamma).exp()).collect(); // Âu [m_q, m_k]
    let mut g = vec![0.0; m * m]; // ÂᵀÂ + λI [m_k, m_k]
    for i in 0..m {
        let ai = &a[i * m..][..m];
        for l in 0..m {
            let f = ai[l];
            g[l * m..][..m].iter_mut().zip(ai).for_each(|(x, &y)| *x += f * y);
        }
    }
    let lambda = ridge * (0..m).map(|l| g[l * m + l]).sum::<f64>() / m as f64;
    (0..m).for_each(|l| g[l * m + l] += lambda);
    // Cholesky G = L·Lᵀ in place (lower triangle).
    for j in 0..m {
        for p in 0..j {
            let x = (g[j * m + p] - dot64(&g[j * m..][..p], &g[p * m..][..p])) / g[p * m + p];
            g[j * m + p] = x;
        }
        let d = g[j * m + j] - dot64(&g[j * m..][..j], &g[j * m..][..j]);
        if !(d > 0.0 && d.is_finite()) {
            return Err(NystromError::NotPositiveDefinite { head });
        }
        g[j * m + j] = d.sqrt();
    }
    // X = G⁻¹Âᵀ [m_k, m_q]: forward L·Y = Âᵀ, back Lᵀ·X = Y, all columns at once.
    let mut x = vec![0.0; m * m];
    for l in 0..m {
        for i in 0..m {
            x[l * m + i] = a[i * m + l];
        }
    }
    for r in 0..m {
        for p in 0..r {
            let f = g[r * m + p];
            for i in 0..m {
                x[r * m + i] -= f * x[p * m + i];
            }
        }
        let inv = 1.0 / g[r * m + r];
        x[r * m..][..m].iter_mut().for_each(|y| *y *= inv);
    }
    for r in (0..m).rev() {
        for p in r + 1..m {
            let f = g[p * m + r];
            for i in 0..m {
                x[r * m + i] -= f * x[p * m + i];
            }
        }
        let inv = 1.0 / g[r * m + r];
        x[r * m..][..m].iter_mut().for_each(|y| *y *= inv);
    }
    Ok((gamma, x))
}

/// Builds the frozen plan (landmarks of q[..tp], k[..tp] and the ridge inverses).
pub fn nystrom_plan<F: Float>(cfg: &O1Config, sh: &NyShape, q: &[F], k: &[F]) -> Result<NystromPlan, NystromError> {
    cfg.validate()?;
    sh.check("nystrom_plan", q, k, None);
    let (nh, nkv, hd, tp) = (sh.n_heads, sh.n_kv_heads, sh.head_dim, sh.tp);
    let skeleton = cfg.seals_skeleton(tp);
    let m = cfg.m_eff(tp);
    let mut inv = Vec::new();
    if skeleton {
        let (qt, kt) = (means64(q, tp, m, nh, hd), means64(k, tp, m, nkv, hd));
        for h in 0..nh {
            let g = h / (nh / nkv);
            inv.push(ridge_inverse(&qt[h * m * hd..][..m * hd], &kt[g * m * hd..][..m * hd], m, hd, sh.scale, cfg.ridge, h)?);
        }
    }
    Ok(NystromPlan { m, skeleton, windowed: cfg.far == Far::Drop || skeleton, inv })
}

/// One call's inputs in f64, shared by its per-head work items.
struct Ctx<'a> {
    cfg: &'a O1Config,
    plan: &'a NystromPlan,
    sh: NyShape,
    t_len: usize,
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    /// [nh, m, hd], [nkv, m, hd] landmark means (empty without a skeleton).
    qt: Vec<f64>,
    kt: Vec<f64>,
    /// Backward only: do [T, nh, hd].
    d_o: Vec<f64>,
    /// Use the direct O(T²·m) far field (the reference) instead of the prefix sums.
    direct: bool,
    /// First row of the per-head pass (rows before it: exact attention, done by the attention op).
    t_start: usize,
}

/// Per-head output row layout: o [T, hd] | dropped [T] | dq [T, hd] | dk [T, hd] | dv [T, hd] |
/// dq̃ [m, hd] | dk̃ [m, hd] (the gradient parts only in the backward).
fn head_row(t_len: usize, hd: usize, m: usize, bwd: bool) -> usize {
    t_len * (hd + 1) + if bwd { 3 * t_len * hd + 2 * m * hd } else { 0 }
}

impl Ctx<'_> {
    /// Query head h, written into `out` (see [`head_row`]). The same source is compiled twice:
    /// for the baseline target (the scalar twin, 2-wide SSE2) and with AVX-512 enabled, chosen at
    /// run time. Rust never contracts a·b + c into an FMA nor reorders a float reduction on its
    /// own, so the two compilations give bit-identical results (unit test); the wide one runs the
    /// head-dim and key loops 8 f64 lanes at a time.
    fn head(&self, h: usize, out: &mut [f64], bwd: bool) {
        #[cfg(target_arch = "x86_64")]
        if cortiq_kernels::simd::level() == cortiq_kernels::simd::Level::Avx512 {
            // SAFETY: level() returns Avx512 only after detecting avx512f and fma at run time.
            return unsafe { self.head_avx512(h, out, bwd) };
        }
        self.head_impl(h, out, bwd)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn head_avx512(&self, h: usize, out: &mut [f64], bwd: bool) {
        self.head_impl(h, out, bwd)
    }

    #[inline(always)]
    fn head_impl(&self, h: usize, out: &mut [f64], bwd: bool) {
        let (nh, nkv, hd, tp, scale) = (self.sh.n_heads, self.sh.n_kv_heads, self.sh.head_dim, self.sh.tp, self.sh.scale);
        let (t_len, m) = (self.t_len, self.plan.m);
        let (w, sn) = (self.cfg.window, self.cfg.sinks);
        let g = h / (nh / nkv);
        let qr = |t: usize| &self.q[(t * nh + h) * hd..][..hd];
        let kr = |j: usize| &self.k[(j * nkv + g) * hd..][..hd];
        let vr = |j: usize| &self.v[(j * nkv + g) * hd..][..hd];
        let (o, rest) = out.split_at_mut(t_len * hd);
        let (dropped, rest) = rest.split_at_mut(t_len);
        let (dq, rest) = rest.split_at_mut(if bwd { t_len * hd } else { 0 });
        let (dk, rest) = rest.split_at_mut(if bwd { t_len * hd } else { 0 });
        let (dv, rest) = rest.split_at_mut(if bwd { t_len * hd } else { 0 });
        let (dqt, dkt) = rest.split_at_mut(if bwd { m * hd } else { 0 });
        let qt = |i: usize| &self.qt[(h * m + i) * hd..][..hd];
        let kt = |l: usize| &self.kt[(g * m + l) * hd..][..hd];
        // Kᵀ, Vᵀ [hd, T] of kv head g (row_dots).
        let (mut k_t, mut v_t) = (vec![0.0; hd * t_len], vec![0.0; if bwd { hd * t_len } else { 0 }]);
        for j in 0..t_len {
            for c in 0..hd {
                k_t[c * t_len + j] = kr(j)[c];
                if bwd {
                    v_t[c * t_len + j] = vr(j)[c];
                }
            }
        }
        // Skeleton: E' [m, T], cm [T] (module header).
        let sk = self.plan.inv.get(h).filter(|_| self.plan.skeleton).map(|(gm, mhat)| {
            let mut el = vec![0.0; m * t_len];
            let mut cm = vec![f64::NEG_INFINITY; t_len];
            for i in 0..m {
                let ei = &mut el[i * t_len..][..t_len];
                row_dots(qt(i), &k_t, t_len, 0, t_len, ei);
                for (x, c) in ei.iter_mut().zip(cm.iter_mut()) {
                    *x *= scale;
                    *c = c.max(*x);
                }
            }
            for i in 0..m {
                el[i * t_len..][..t_len].iter_mut().zip(&cm).for_each(|(x, &c)| *x = (*x - c).exp());
            }
            // r_j = exp(base − c + cm_j) is needed for every (far row, far key) pair: the most
            // frequent exp of the op. Factored as exp(base − c + μ)·exp(cm_j − μ), μ = max cm, it
            // costs one exp per row instead; exact up to one rounding, and safe while the spread
            // of cm stays under 600 (no overflow of the first factor, which is ≤ e^{μ − min cm},
            // no underflow of the second), else the per-key exp is kept.
            let mu = cm.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lo = cm.iter().cloned().fold(f64::INFINITY, f64::min);
            let ecm: Vec<f64> = if mu - lo < 600.0 { cm.iter().map(|&x| (x - mu).exp()).collect() } else { Vec::new() };
            (*gm, mhat, el, cm, mu, ecm)
        });
        if let Some((gm, mhat, el, cm, mu, ecm)) = &sk
            && !self.direct
            && !ecm.is_empty()
        {
            let sk = Skel { gamma: *gm, mhat, el, cm, mu: *mu, ecm };
            return self.head_stream(h, (o, dropped, dq, dk, dv, dqt, dkt), bwd, &k_t, &v_t, &sk);
        }
        let mut gacc = if bwd && sk.is_some() { vec![0.0; m * t_len] } else { Vec::new() }; // G [m, T]
        let mut s = vec![0.0; t_len]; // near scores of one row
        let mut pv = vec![0.0; if bwd { t_len } else { 0 }]; // do_t·v_j of one row
        let mut a = vec![0.0; t_len]; // scaled far weights of one row
        let mut r = vec![0.0; t_len]; // r_j of one row
        let (mut fu, mut wv, mut dw) = (vec![0.0; m], vec![0.0; m], vec![0.0; m]);
        let (mut far_max, mut far_seen) = (f64::NEG_INFINITY, sn);
        for t in self.t_start..t_len {
            let qh = qr(t);
            let exact = t < tp || !self.plan.windowed;
            let far_end = if exact { sn } else { sn.max((t + 1).saturating_sub(w)) };
            let n1 = if exact { t + 1 } else { sn.min(t + 1) };
            let n2 = if exact { t + 1 } else { far_end.min(t + 1) };
            let mut c = f64::NEG_INFINITY;
            row_dots(qh, &k_t, t_len, 0, n1, &mut s);
            row_dots(qh, &k_t, t_len, n2, t + 1, &mut s);
            for j in (0..n1).chain(n2..t + 1) {
                s[j] *= scale;
                c = c.max(s[j]);
            }
            let mut far_on = false;
            if let (Some((gm, mhat, el, cm, mu, ecm)), true) = (&sk, far_end > sn) {
                far_on = true;
                for l in 0..m {
                    fu[l] = dot64(qh, kt(l)) * scale;
                }
                let umax = fu.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                fu.iter_mut().for_each(|x| *x = (*x - umax).exp());
                // ŵ = f̂u·M̂ as rows of M̂ (contiguous) scaled and added.
                wv.fill(0.0);
                for l in 0..m {
                    let f = fu[l];
                    wv.iter_mut().zip(&mhat[l * m..][..m]).for_each(|(a, &b)| *a += f * b);
                }
                let base = umax - gm;
                while far_seen < far_end {
                    far_max = far_max.max(cm[far_seen]);
                    far_seen += 1;
                }
                c = c.max(base + far_max);
                a[sn..far_end].fill(0.0);
                for i in 0..m {
                    let wi = wv[i];
                    a[sn..far_end].iter_mut().zip(&el[i * t_len + sn..i * t_len + far_end]).for_each(|(x, &e)| *x += wi * e);
                }
                if ecm.is_empty() {
                    r[sn..far_end].iter_mut().zip(&cm[sn..far_end]).for_each(|(x, &cj)| *x = (base - c + cj).exp());
                } else {
                    let f = (base - c + mu).exp();
                    r[sn..far_end].iter_mut().zip(&ecm[sn..far_end]).for_each(|(x, &e)| *x = f * e);
                }
                let mut total = 0.0;
                for j in sn..far_end {
                    a[j] *= r[j];
                    total += a[j];
                }
                if total < 0.0 {
                    far_on = false;
                    dropped[t] = 1.0;
                }
            }
            let far = if far_on { sn..far_end } else { 0..0 };
            let ot = &mut o[t * hd..][..hd];
            let mut den = 0.0;
            for j in (0..n1).chain(n2..t + 1) {
                let x = (s[j] - c).exp();
                s[j] = x; // s now holds the near weight
                den += x;
                ot.iter_mut().zip(vr(j)).for_each(|(y, &z)| *y += x * z);
            }
            for j in far.clone() {
                den += a[j];
                ot.iter_mut().zip(vr(j)).for_each(|(y, &z)| *y += a[j] * z);
            }
            let inv = 1.0 / den.max(DEN_FLOOR);
            ot.iter_mut().for_each(|y| *y *= inv);
            if !bwd {
                continue;
            }
            let dot_ = &self.d_o[(t * nh + h) * hd..][..hd];
            // The floor is a max(): below it den is a constant and has no gradient.
            let dd = if den >= DEN_FLOOR { dot64(dot_, ot) } else { 0.0 };
            let dqt_row = &mut dq[t * hd..][..hd];
            // pv[j] = do_t·v_j over the row's near and far keys.
            row_dots(dot_, &v_t, t_len, 0, n1, &mut pv);
            row_dots(dot_, &v_t, t_len, if far_on { sn } else { n2 }, t + 1, &mut pv);
            for j in (0..n1).chain(n2..t + 1) {
                let x = s[j];
                // fwd: o = Σ x_j·v_j / den  =>  dv_j += x_j·do/den; dx_j = (do·v_j − D)/den
                dv[j * hd..][..hd].iter_mut().zip(dot_).for_each(|(y, &z)| *y += x * inv * z);
                let dx = (pv[j] - dd) * inv;
                // fwd: x_j = exp(q_t·k_j·s − c)  =>  ds = x_j·dx_j; dq_t += s·ds·k_j; dk_j += s·ds·q_t
                let ds = x * dx * scale;
                dqt_row.iter_mut().zip(kr(j)).for_each(|(y, &z)| *y += ds * z);
                dk[j * hd..][..hd].iter_mut().zip(qh).for_each(|(y, &z)| *y += ds * z);
            }
            if let (Some((_, mhat, el, ..)), true) = (&sk, far_on) {
                for j in far.clone() {
                    dv[j * hd..][..hd].iter_mut().zip(dot_).for_each(|(y, &z)| *y += a[j] * inv * z);
                    r[j] *= (pv[j] - dd) * inv; // r_j·da_j from here on
                }
                // fwd: a_j = r_j Σ_i ŵ_i E'_ij  =>  dŵ_i += da_j·r_j·E'_ij; G[i,j] += ŵ_i·da_j·r_j
                // (i outer: rows of E' and G are contiguous in j)
                let dar = &r[far.clone()];
                for i in 0..m {
                    let (eli, gi) = (&el[i * t_len..][far.clone()], &mut gacc[i * t_len..][far.clone()]);
                    dw[i] = dot64(dar, eli);
                    let wi = wv[i];
                    gi.iter_mut().zip(dar).for_each(|(y, &z)| *y += wi * z);
                }
                // fwd: ŵ_i = Σ_l f̂u_l M̂[l,i], f̂u_l = exp(u_l − u_max)
                //   =>  du_l = f̂u_l·Σ_i M̂[l,i]·dŵ_i; dq_t += s·du_l·k̃_l; dk̃_l += s·du_l·q_t
                for l in 0..m {
                    let du = fu[l] * dot64(&mhat[l * m..][..m], &dw) * scale;
                    dqt_row.iter_mut().zip(kt(l)).for_each(|(y, &z)| *y += du * z);
                    dkt[l * hd..][..hd].iter_mut().zip(qh).for_each(|(y, &z)| *y += du * z);
                }
            }
        }
        // fwd: E'_ij ∝ exp(x_ij), x_ij = q̃_i·k_j·s  =>  P = G ⊙ E'; dq̃_i += s·Σ_j P_ij·k_j; dk_j += s·Σ_i P_ij·q̃_i
        if let (Some((_, _, el, ..)), true) = (&sk, bwd) {
            for i in 0..m {
                for j in 0..t_len {
                    let p = gacc[i * t_len + j] * el[i * t_len + j] * scale;
                    if p != 0.0 {
                        dqt[i * hd..][..hd].iter_mut().zip(kr(j)).for_each(|(y, &z)| *y += p * z);
                        dk[j * hd..][..hd].iter_mut().zip(qt(i)).for_each(|(y, &z)| *y += p * z);
                    }
                }
            }
        }
    }
}

/// The sealed skeleton of one head, as the streaming path reads it.
struct Skel<'a> {
    gamma: f64,
    /// M̂ [m, m]
    mhat: &'a [f64],
    /// E' [m, T]
    el: &'a [f64],
    /// cm_j = max_i x_ij [T]
    cm: &'a [f64],
    /// μ = max cm; ecm_j = exp(cm_j − μ) [T]
    mu: f64,
    ecm: &'a [f64],
}

/// One head's output slices: o, dropped, dq, dk, dv, dq̃, dk̃ (see [`head_row`]).
type HeadOut<'a> = (&'a mut [f64], &'a mut [f64], &'a mut [f64], &'a mut [f64], &'a mut [f64], &'a mut [f64], &'a mut [f64]);

impl Ctx<'_> {
    /// The far field by prefix sums (the streaming form's accumulators, teacher-forced): with
    /// E''_ij = E'_ij·exp(cm_j − μ) = exp(x_ij − μ) and f_t = exp(u_max − γ − c_t + μ),
    /// a\[t,j\] = f_t·Σ_i ŵ_ti·E''_ij, so over the row's far keys (a prefix [sn, far_end) that
    /// only grows with t)
    ///   Σ_far a·v = f_t·Σ_i ŵ_ti·N_i,  Σ_far a = f_t·Σ_i ŵ_ti·D_i,
    ///   N_i = Σ_{j<far_end} E''_ij·v_j [hd],  D_i = Σ_{j<far_end} E''_ij,
    /// O(m·hd) per row instead of O(far·(m + hd)). The backward is the same sums transposed
    /// (y_t = f_t·ŵ_t/den_t per kept row; U_i(j), Wd_i(j) = sums of y_ti·do_t, y_ti·D_t over the
    /// rows whose far range holds j, a suffix of the rows, swept from the last key down):
    ///   fwd: far = f·Σ_i ŵ_i·(N_i, D_i)  =>  dŵ_i = f/den·(do·N_i − D·D_i)
    ///   fwd: a\[t,j\] = f_t Σ_i ŵ_ti E''_ij  =>  dv_j += Σ_i E''_ij·U_i(j);
    ///        P_ij = E''_ij·(v_j·U_i(j) − Wd_i(j)); dq̃_i += s·P_ij·k_j; dk_j += s·P_ij·q̃_i
    /// Near keys and prompt rows as in the direct path. Agrees with it to f64 rounding (test).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn head_stream(&self, h: usize, out: HeadOut<'_>, bwd: bool, k_t: &[f64], v_t: &[f64], sk: &Skel<'_>) {
        let (nh, nkv, hd, tp, scale) = (self.sh.n_heads, self.sh.n_kv_heads, self.sh.head_dim, self.sh.tp, self.sh.scale);
        let (t_len, m) = (self.t_len, self.plan.m);
        let (w, sn) = (self.cfg.window, self.cfg.sinks);
        let g = h / (nh / nkv);
        let qr = |t: usize| &self.q[(t * nh + h) * hd..][..hd];
        let kr = |j: usize| &self.k[(j * nkv + g) * hd..][..hd];
        let vr = |j: usize| &self.v[(j * nkv + g) * hd..][..hd];
        let qt = |i: usize| &self.qt[(h * m + i) * hd..][..hd];
        let kt = |l: usize| &self.kt[(g * m + l) * hd..][..hd];
        let (o, dropped, dq, dk, dv, dqt, dkt) = out;
        // E'' [m, T]
        let mut e2 = sk.el.to_vec();
        for i in 0..m {
            e2[i * t_len..][..t_len].iter_mut().zip(sk.ecm).for_each(|(x, &e)| *x *= e);
        }
        let (mut nacc, mut dacc, mut added) = (vec![0.0; m * hd], vec![0.0; m], sn); // N [m, hd], D [m]
        let mut s = vec![0.0; t_len];
        let mut pv = vec![0.0; if bwd { t_len } else { 0 }];
        let (mut fu, mut wv, mut dw) = (vec![0.0; m], vec![0.0; m], vec![0.0; m]);
        let mut yw = vec![0.0; if bwd { t_len * m } else { 0 }]; // y_t [T, m] (0: no kept far field)
        let mut ddr = vec![0.0; if bwd { t_len } else { 0 }]; // D_t = do_t·o_t
        let mut far_max = f64::NEG_INFINITY;
        for t in self.t_start..t_len {
            let qh = qr(t);
            let exact = t < tp || !self.plan.windowed;
            let far_end = if exact { sn } else { sn.max((t + 1).saturating_sub(w)) };
            let n1 = if exact { t + 1 } else { sn.min(t + 1) };
            let n2 = if exact { t + 1 } else { far_end.min(t + 1) };
            let mut c = f64::NEG_INFINITY;
            row_dots(qh, k_t, t_len, 0, n1, &mut s);
            row_dots(qh, k_t, t_len, n2, t + 1, &mut s);
            for j in (0..n1).chain(n2..t + 1) {
                s[j] *= scale;
                c = c.max(s[j]);
            }
            let (mut far_on, mut f, mut total) = (false, 0.0, 0.0);
            if far_end > sn {
                far_on = true;
                for l in 0..m {
                    fu[l] = dot64(qh, kt(l)) * scale;
                }
                let umax = fu.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                fu.iter_mut().for_each(|x| *x = (*x - umax).exp());
                wv.fill(0.0);
                for l in 0..m {
                    let f = fu[l];
                    wv.iter_mut().zip(&sk.mhat[l * m..][..m]).for_each(|(a, &b)| *a += f * b);
                }
                let base = umax - sk.gamma;
                // Extend N, D (and the far max of cm) to the row's far range.
                while added < far_end {
                    let j = added;
                    far_max = far_max.max(sk.cm[j]); // sets c, as in the direct path
                    let vj = vr(j);
                    for i in 0..m {
                        let e = e2[i * t_len + j];
                        dacc[i] += e;
                        nacc[i * hd..][..hd].iter_mut().zip(vj).for_each(|(y, &z)| *y += e * z);
                    }
                    added += 1;
                }
                c = c.max(base + far_max);
                f = (base - c + sk.mu).exp();
                total = f * dot64(&wv, &dacc);
                if total < 0.0 {
                    far_on = false;
                    dropped[t] = 1.0;
                }
            }
            let ot = &mut o[t * hd..][..hd];
            let mut den = 0.0;
            for j in (0..n1).chain(n2..t + 1) {
                let x = (s[j] - c).exp();
                s[j] = x; // s now holds the near weight
                den += x;
                ot.iter_mut().zip(vr(j)).for_each(|(y, &z)| *y += x * z);
            }
            if far_on {
                den += total;
                for i in 0..m {
                    let fw = f * wv[i];
                    ot.iter_mut().zip(&nacc[i * hd..][..hd]).for_each(|(y, &z)| *y += fw * z);
                }
            }
            let inv = 1.0 / den.max(DEN_FLOOR);
            ot.iter_mut().for_each(|y| *y *= inv);
            if !bwd {
                continue;
            }
            let dot_ = &self.d_o[(t * nh + h) * hd..][..hd];
            // The floor is a max(): below it den is a constant and has no gradient.
            let dd = if den >= DEN_FLOOR { dot64(dot_, ot) } else { 0.0 };
            let dqt_row = &mut dq[t * hd..][..hd];
            row_dots(dot_, v_t, t_len, 0, n1, &mut pv);
            row_dots(dot_, v_t, t_len, n2, t + 1, &mut pv);
            for j in (0..n1).chain(n2..t + 1) {
                let x = s[j];
                // fwd: o = Σ x_j·v_j / den  =>  dv_j += x_j·do/den; dx_j = (do·v_j − D)/den
                dv[j * hd..][..hd].iter_mut().zip(dot_).for_each(|(y, &z)| *y += x * inv * z);
                // fwd: x_j = exp(q_t·k_j·s − c)  =>  ds = x_j·dx_j; dq_t += s·ds·k_j; dk_j += s·ds·q_t
                let ds = x * (pv[j] - dd) * inv * scale;
                dqt_row.iter_mut().zip(kr(j)).for_each(|(y, &z)| *y += ds * z);
                dk[j * hd..][..hd].iter_mut().zip(qh).for_each(|(y, &z)| *y += ds * z);
            }
            if far_on {
                // fwd: far = f·Σ_i ŵ_i·(N_i, D_i)  =>  dŵ_i = f/den·(do·N_i − D·D_i)
                for i in 0..m {
                    dw[i] = f * inv * (dot64(dot_, &nacc[i * hd..][..hd]) - dd * dacc[i]);
                    yw[t * m + i] = f * inv * wv[i];
                }
                ddr[t] = dd;
                // fwd: ŵ_i = Σ_l f̂u_l M̂[l,i], f̂u_l = exp(u_l − u_max)
                //   =>  du_l = f̂u_l·Σ_i M̂[l,i]·dŵ_i; dq_t += s·du_l·k̃_l; dk̃_l += s·du_l·q_t
                for l in 0..m {
                    let du = fu[l] * dot64(&sk.mhat[l * m..][..m], &dw) * scale;
                    dqt_row.iter_mut().zip(kt(l)).for_each(|(y, &z)| *y += du * z);
                    dkt[l * hd..][..hd].iter_mut().zip(qh).for_each(|(y, &z)| *y += du * z);
                }
            }
        }
        if !bwd {
            return;
        }
        // Key sweep, last key first: row t's far range ends at key t − w (far_end = t + 1 − w),
        // so U, Wd gain row t = j + w on reaching key j and keep every row after it.
        let (mut u, mut wd) = (vec![0.0; m * hd], vec![0.0; m]); // U [m, hd], Wd [m]
        let mut dkj = vec![0.0; hd];
        for j in (sn..t_len).rev() {
            let t = j + w;
            if t < t_len && t >= tp && self.plan.windowed {
                let dot_ = &self.d_o[(t * nh + h) * hd..][..hd];
                for i in 0..m {
                    let y = yw[t * m + i];
                    if y != 0.0 {
                        u[i * hd..][..hd].iter_mut().zip(dot_).for_each(|(a, &b)| *a += y * b);
                        wd[i] += y * ddr[t];
                    }
                }
            }
            let (kj, vj) = (kr(j), vr(j));
            let dvj = &mut dv[j * hd..][..hd];
            dkj.fill(0.0);
            for i in 0..m {
                let e = e2[i * t_len + j];
                let ui = &u[i * hd..][..hd];
                // fwd: a[t,j] = f_t Σ_i ŵ_ti E''_ij  =>  dv_j += Σ_i E''_ij·U_i(j)
                dvj.iter_mut().zip(ui).for_each(|(a, &b)| *a += e * b);
                // P_ij = E''_ij·(v_j·U_i − Wd_i); dq̃_i += s·P_ij·k_j; dk_j += s·P_ij·q̃_i
                let p = e * (dot64(vj, ui) - wd[i]) * scale;
                if p != 0.0 {
                    dqt[i * hd..][..hd].iter_mut().zip(kj).for_each(|(a, &b)| *a += p * b);
                    dkj.iter_mut().zip(qt(i)).for_each(|(a, &b)| *a += p * b);
                }
            }
            dk[j * hd..][..hd].iter_mut().zip(&dkj).for_each(|(a, &b)| *a += b);
        }
    }
}

fn widen<F: Float>(x: &[F]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

fn build<'a, F: Float>(
    cfg: &'a O1Config,
    plan: &'a NystromPlan,
    sh: &NyShape,
    q: &[F],
    k: &[F],
    v: &[F],
    t_len: usize,
) -> Ctx<'a> {
    let (qt, kt) = if plan.skeleton {
        (means64(q, sh.tp, plan.m, sh.n_heads, sh.head_dim), means64(k, sh.tp, plan.m, sh.n_kv_heads, sh.head_dim))
    } else {
        (Vec::new(), Vec::new())
    };
    assert!(
        !plan.skeleton || plan.inv.len() == sh.n_heads,
        "nystrom: plan holds {} heads, the call has {}",
        plan.inv.len(),
        sh.n_heads
    );
    Ctx { cfg, plan, sh: *sh, t_len, q: widen(q), k: widen(k), v: widen(v), qt, kt, d_o: Vec::new(), direct: false, t_start: 0 }
}

/// Rows [0, end) are plain exact causal attention over keys [0, end) (the prompt; every row
/// when no window applies) and go to the attention op; the direct (reference) path does them
/// itself.
fn prompt_end(plan: &NystromPlan, sh: &NyShape, t_len: usize, direct: bool) -> usize {
    if direct {
        0
    } else if plan.windowed {
        sh.tp
    } else {
        t_len
    }
}

fn attn_shape(sh: &NyShape) -> AttnShape {
    AttnShape { n_heads: sh.n_heads, n_kv_heads: sh.n_kv_heads, head_dim: sh.head_dim, scale: sh.scale, window: None }
}

/// Forward: q [T, nh, hd], k, v [T, nkv, hd] -> o [T, nh, hd] (written), dropped [T, nh]
/// (written: rows whose far field the aggregate guard dropped). The plan comes from
/// [`nystrom_plan`] on the same q, k (the gradient check passes a plan frozen at the base
/// point).
#[allow(clippy::too_many_arguments)]
pub fn nystrom_forward<F: Float>(
    cfg: &O1Config,
    plan: &NystromPlan,
    sh: &NyShape,
    q: &[F],
    k: &[F],
    v: &[F],
    o: &mut [F],
    dropped: &mut [bool],
) {
    forward_impl(cfg, plan, sh, q, k, v, o, dropped, false)
}

#[allow(clippy::too_many_arguments)]
fn forward_impl<F: Float>(
    cfg: &O1Config,
    plan: &NystromPlan,
    sh: &NyShape,
    q: &[F],
    k: &[F],
    v: &[F],
    o: &mut [F],
    dropped: &mut [bool],
    direct: bool,
) {
    let t_len = sh.check("nystrom_forward", q, k, Some(v));
    let (nh, hd) = (sh.n_heads, sh.head_dim);
    assert!(o.len() == q.len() && dropped.len() == t_len * nh, "nystrom_forward: o must be [T, nh, hd], dropped [T, nh]");
    let mut cx = build(cfg, plan, sh, q, k, v, t_len);
    cx.direct = direct;
    cx.t_start = prompt_end(plan, sh, t_len, direct);
    // Exact rows first, by the attention op (blocked matrix products, in F).
    let (pe, (nkv, nq)) = (cx.t_start, (sh.n_kv_heads * hd, nh * hd));
    if pe > 0 {
        let mut lse = vec![0.0; pe * nh];
        attention_forward(&attn_shape(sh), &q[..pe * nq], &k[..pe * nkv], &v[..pe * nkv], &mut o[..pe * nq], &mut lse);
        dropped[..pe * nh].fill(false);
    }
    let row = head_row(t_len, hd, plan.m, false);
    let mut buf = vec![0.0; nh * row];
    pool().for_rows_mut_dynamic(&mut buf, row, 1, |h, out| cx.head(h, out, false));
    for h in 0..nh {
        let (oh, dh) = buf[h * row..][..row].split_at(t_len * hd);
        for t in pe..t_len {
            o[(t * nh + h) * hd..][..hd].iter_mut().zip(&oh[t * hd..][..hd]).for_each(|(a, &b)| *a = F::from_f64(b));
            dropped[t * nh + h] = dh[t] != 0.0;
        }
    }
}

/// Backward with the plan (M) constant: dq, dk, dv += (module header).
#[allow(clippy::too_many_arguments)]
pub fn nystrom_backward<F: Float>(
    cfg: &O1Config,
    plan: &NystromPlan,
    sh: &NyShape,
    q: &[F],
    k: &[F],
    v: &[F],
    d_o: &[F],
    dq: &mut [F],
    dk: &mut [F],
    dv: &mut [F],
) {
    backward_impl(cfg, plan, sh, q, k, v, d_o, dq, dk, dv, false)
}

#[allow(clippy::too_many_arguments)]
fn backward_impl<F: Float>(
    cfg: &O1Config,
    plan: &NystromPlan,
    sh: &NyShape,
    q: &[F],
    k: &[F],
    v: &[F],
    d_o: &[F],
    dq: &mut [F],
    dk: &mut [F],
    dv: &mut [F],
    direct: bool,
) {
    let t_len = sh.check("nystrom_backward", q, k, Some(v));
    let (nh, nkv, hd, m) = (sh.n_heads, sh.n_kv_heads, sh.head_dim, plan.m);
    assert!(
        d_o.len() == q.len() && dq.len() == q.len() && dk.len() == k.len() && dv.len() == v.len(),
        "nystrom_backward: do, dq must be [T, nh, hd], dk, dv [T, nkv, hd]"
    );
    let mut cx = build(cfg, plan, sh, q, k, v, t_len);
    cx.d_o = widen(d_o);
    cx.direct = direct;
    cx.t_start = prompt_end(plan, sh, t_len, direct);
    // Exact rows: the attention op's backward (its forward recomputed for o and lse).
    let (pe, (nkv_hd, nq)) = (cx.t_start, (nkv * hd, nh * hd));
    if pe > 0 {
        let ash = attn_shape(sh);
        let (qp, kp, vp) = (&q[..pe * nq], &k[..pe * nkv_hd], &v[..pe * nkv_hd]);
        let (mut op, mut lse) = (vec![F::ZERO; pe * nq], vec![0.0; pe * nh]);
        attention_forward(&ash, qp, kp, vp, &mut op, &mut lse);
        let (dqp, dkp, dvp) = (&mut dq[..pe * nq], &mut dk[..pe * nkv_hd], &mut dv[..pe * nkv_hd]);
        attention_backward(&ash, qp, kp, vp, &op, &lse, &d_o[..pe * nq], dqp, dkp, dvp);
    }
    let row = head_row(t_len, hd, m, true);
    let mut buf = vec![0.0; nh * row];
    pool().for_rows_mut_dynamic(&mut buf, row, 1, |h, out| cx.head(h, out, true));
    let th = t_len * hd;
    let mut dqt = vec![F::ZERO; nh * m * hd]; // [nh, m, hd]
    let mut dkt = vec![F::ZERO; nkv * m * hd]; // [nkv, m, hd]
    for h in 0..nh {
        let g = h / (nh / nkv);
        let b = &buf[h * row..][..row];
        let (bq, bk, bv) = (&b[th + t_len..][..th], &b[2 * th + t_len..][..th], &b[3 * th + t_len..][..th]);
        for t in 0..t_len {
            dq[(t * nh + h) * hd..][..hd].iter_mut().zip(&bq[t * hd..][..hd]).for_each(|(a, &x)| *a += F::from_f64(x));
            dk[(t * nkv + g) * hd..][..hd].iter_mut().zip(&bk[t * hd..][..hd]).for_each(|(a, &x)| *a += F::from_f64(x));
            dv[(t * nkv + g) * hd..][..hd].iter_mut().zip(&bv[t * hd..][..hd]).for_each(|(a, &x)| *a += F::from_f64(x));
        }
        if plan.skeleton {
            let (bqt, bkt) = (&b[4 * th + t_len..][..m * hd], &b[4 * th + t_len + m * hd..][..m * hd]);
            dqt[h * m * hd..][..m * hd].iter_mut().zip(bqt).for_each(|(a, &x)| *a += F::from_f64(x));
            dkt[g * m * hd..][..m * hd].iter_mut().zip(bkt).for_each(|(a, &x)| *a += F::from_f64(x));
        }
    }
    if plan.skeleton {
        // fwd: q̃ = segment means of q[..tp], k̃ of k[..tp]  =>  scatter-back
        segment_means_backward(&dqt, sh.tp, m, nh, hd, dq);
        segment_means_backward(&dkt, sh.tp, m, nkv, hd, dk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::Rng;

    /// (max |a − b| / max |b|, index)
    fn rel(a: &[f64], b: &[f64]) -> (f64, usize) {
        let scale = cortiq_testkit::max_err(b.iter().map(|x| x.abs())).max(1e-300);
        let (d, i) = cortiq_testkit::max_abs_diff_f64(a, b); // NaN-propagating
        (d / scale, i)
    }

    /// The prefix-sum far field (the default) against the direct O(T²·m) one (the reference):
    /// outputs, guard decisions and all three gradients, on GQA heads with rows on both sides of
    /// the guard, odd sizes, sinks 0, and scores sharp enough to exercise large ŵ.
    #[test]
    fn stream_path_matches_direct_path() {
        let cases = [
            // nh, nkv, hd, T, tp, window, sinks, landmarks, q scale
            (4, 2, 16, 173, 97, 16, 4, 12, 1.0),
            (6, 3, 13, 151, 83, 9, 3, 64, 1.7),
            (4, 2, 8, 160, 40, 4, 1, 4, 2.2),
            (4, 4, 8, 140, 70, 10, 0, 16, 1.0),
            (2, 1, 16, 130, 64, 8, 2, 16, 4.0),
        ];
        for (n, &(nh, nkv, hd, t, tp, w, sn, l, qs)) in cases.iter().enumerate() {
            let mut r = Rng(300 + n as u64);
            let (q, k, v, d_o) =
                (r.vec(t * nh * hd, qs), r.vec(t * nkv * hd, 1.0), r.vec(t * nkv * hd, 1.0), r.vec(t * nh * hd, 1.0));
            let cfg = O1Config { window: w, sinks: sn, landmarks: l, ridge: DEFAULT_RIDGE, far: Far::Skeleton };
            let sh = NyShape { n_heads: nh, n_kv_heads: nkv, head_dim: hd, scale: 1.0 / (hd as f64).sqrt(), tp };
            let plan = nystrom_plan(&cfg, &sh, &q, &k).unwrap();
            assert!(plan.skeleton);
            let mut outs = Vec::new();
            for direct in [false, true] {
                let (mut o, mut dr) = (vec![0.0; q.len()], vec![false; t * nh]);
                forward_impl(&cfg, &plan, &sh, &q, &k, &v, &mut o, &mut dr, direct);
                let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
                backward_impl(&cfg, &plan, &sh, &q, &k, &v, &d_o, &mut dq, &mut dk, &mut dv, direct);
                outs.push((o, dr, dq, dk, dv));
            }
            let (a, b) = (&outs[0], &outs[1]);
            assert_eq!(a.1, b.1, "case {n}: the two paths' guards drop different rows");
            let n_drop = a.1.iter().filter(|&&d| d).count();
            for (name, x, y) in [("o", &a.0, &b.0), ("dq", &a.2, &b.2), ("dk", &a.3, &b.3), ("dv", &a.4, &b.4)] {
                let (e, i) = rel(x, y);
                println!("nystrom stream vs direct, case {n} ({n_drop} rows dropped): {name} max |diff|/scale {e:.3e} at {i}");
                assert!(e < 1e-10, "case {n}: {name} differs by {e:.3e} of scale at {i}");
            }
        }
    }

    /// Bad settings are typed errors naming the flag; a seal never panics on them.
    #[test]
    fn bad_settings_are_typed_errors() {
        let c = |window, sinks, landmarks, ridge| O1Config { window, sinks, landmarks, ridge, far: Far::Skeleton };
        let e = |cfg: O1Config| cfg.validate().unwrap_err().to_string();
        assert!(e(c(0, 0, 8, 1e-6)).contains("--o1-window"));
        assert!(e(c(4, 5, 8, 1e-6)).contains("--o1-sinks"));
        assert!(e(c(4, 1, 3, 1e-6)).contains("--o1-landmarks"));
        assert!(e(c(4, 1, MAX_LANDMARKS + 1, 1e-6)).contains("--o1-landmarks"));
        assert!(e(c(4, 1, 8, 0.0)).contains("--o1-ridge"));
        assert!(e(c(4, 1, 8, f64::NAN)).contains("--o1-ridge"));
        let sh = NyShape { n_heads: 2, n_kv_heads: 1, head_dim: 4, scale: 0.5, tp: 30 };
        let x = vec![0.0f64; 40 * 2 * 4];
        assert_eq!(nystrom_plan(&c(0, 0, 8, 1e-6), &sh, &x, &x[..40 * 4]).unwrap_err(), NystromError::ZeroWindow);
        // All-zero keys: Au is all ones (rank 1) and the ridge keeps the system definite.
        assert!(nystrom_plan(&c(4, 1, 8, 1e-6), &sh, &x, &x[..40 * 4]).unwrap().skeleton);
    }

    /// The AVX-512 compilation of a head against the baseline one: bit-identical.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn wide_compilation_is_bit_identical() {
        if cortiq_kernels::simd::level() != cortiq_kernels::simd::Level::Avx512 {
            println!("no AVX-512 here; nothing to compare");
            return;
        }
        let (nh, nkv, hd, t, tp) = (4, 2, 16, 150, 80);
        let mut r = Rng(9);
        let (q, k, v, d_o) =
            (r.vec(t * nh * hd, 1.5), r.vec(t * nkv * hd, 1.0), r.vec(t * nkv * hd, 1.0), r.vec(t * nh * hd, 1.0));
        let cfg = O1Config { window: 8, sinks: 2, landmarks: 16, ridge: DEFAULT_RIDGE, far: Far::Skeleton };
        let sh = NyShape { n_heads: nh, n_kv_heads: nkv, head_dim: hd, scale: 0.25, tp };
        let plan = nystrom_plan(&cfg, &sh, &q, &k).unwrap();
        for direct in [false, true] {
            let mut cx = build(&cfg, &plan, &sh, &q, &k, &v, t);
            cx.d_o = d_o.clone();
            cx.direct = direct;
            let row = head_row(t, hd, plan.m, true);
            for h in 0..nh {
                let (mut a, mut b) = (vec![0.0; row], vec![0.0; row]);
                cx.head_impl(h, &mut a, true);
                // SAFETY: level() reported AVX-512.
                unsafe { cx.head_avx512(h, &mut b, true) };
                assert!(a == b, "head {h} (direct {direct}): AVX-512 compilation differs from the baseline one");
            }
        }
    }
}

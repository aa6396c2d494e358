//! The vmf_phase linear core (issue 16) for one state: a decayed, unnormalised cos/sin phase
//! kernel smoother. Per token s, with φk_s, φq_s ∈ R^F (F = 2·nphase, [cos θ; sin θ]), a write
//! weight κ_s and a per-component decay λ_f ∈ (0, 1]:
//! ```text
//! S[f][:] ← λ_f · S[f][:] + κ_s · φk_s[f] · v_s[:]        S: [F, d_v]
//! o_s[:]  = Σ_f φq_s[f] · S[f][:]                           (each of the r query heads reading S)
//! ```
//! so o_t = Σ_{s≤t} κ_s Σ_f φq_t[f] λ_f^{t−s} φk_s[f] · v_s (φq·φk = Σ_j cos(θq_j − θk_j)).
//!
//! Two forms that must agree: the recurrence (decode, and the reference forever) and the
//! chunk-parallel form for prefill. With the decay diagonal, a chunk of L tokens entering with
//! state S0 gives, for its i-th token (0-based),
//! `o_i = (φq_i ⊙ λ^{i+1})·S0 + Σ_{j≤i} A_ij v_j`, `A_ij = κ_j Σ_f φq_i[f] λ_f^{i−j} φk_j[f]`, and
//! leaves `S = λ^L ⊙ S0 + Σ_j (κ_j λ^{L−1−j} ⊙ φk_j) ⊗ v_j`. Only non-negative powers of λ are
//! ever formed (no λ^{−j} rescaling: it overflows for fast-decaying components), each computed
//! in f64 and rounded once.
//!
//! Phases: `phase_features` turns an f32 phase into cos/sin through f64 (`f64::sin_cos` on the
//! f32 value: exact range reduction, one rounding at the end). Phases are projections of the
//! hidden state and reach tens of radians; an f32 sin/cos of such an argument would lose
//! ~|θ|·2^−24 absolute before the kernel even starts, and the fold's bandwidth search
//! (`θ/(1+mass)`) is exactly where small differences of large phases matter. The state itself
//! is f32: it is a sum of bounded terms (|φ| ≤ 1) under a decay ≤ 1, so its rounding stays at
//! the f32 level of the largest term.
//!
//! Why hand-written: this is the product's own core (issue 16); F and d_v are small (≤ 128),
//! the state of one head lives in L1, and the loops are elementwise over d_v.

use crate::dot::gemm_nn;

/// Chunk length of the chunk-parallel form (the call's tokens are cut into chunks from its
/// first token; the engine reports it as the mixer's cut grid).
pub const CHUNK: usize = 32;

/// φ = [cos(θ·scale); sin(θ·scale)] of `theta` [P] -> out [2P], through f64 (module header).
/// `scale` is 1/(1 + phase mass), given in f64.
pub fn phase_features(theta: &[f32], scale: f64, out: &mut [f32]) {
    let p = theta.len();
    assert_eq!(out.len(), 2 * p, "phase_features: {p} phases need an output of {}", 2 * p);
    let (c, s) = out.split_at_mut(p);
    for ((&t, c), s) in theta.iter().zip(c).zip(s) {
        let (sn, cs) = (t as f64 * scale).sin_cos();
        *c = cs as f32;
        *s = sn as f32;
    }
}

/// ε of the output norm's rms (the operator's definition; the training crate's is the same).
pub const OUT_NORM_EPS: f64 = 1e-6;

/// The output norm (an option of the operator): each head's row o_h [d_v] of `o` ([rows,
/// n_heads·d_v], heads in order; `gain` [n_heads·d_v]) -> g_h ⊙ o_h / sqrt(mean(o_h²) + ε), in
/// f64 with one rounding per output. Per row and head, so any grouping of rows (prefill, decode
/// rows, steps) gives the same bits.
pub fn out_norm(o: &[f32], gain: &[f32], dv: usize) -> Vec<f32> {
    let nh = gain.len() / dv;
    assert!(nh > 0 && gain.len() == nh * dv && o.len().is_multiple_of(nh * dv), "out_norm: shapes");
    let mut y = vec![0f32; o.len()];
    for (i, (oh, yh)) in o.chunks_exact(dv).zip(y.chunks_exact_mut(dv)).enumerate() {
        let g = &gain[(i % nh) * dv..(i % nh + 1) * dv];
        let ms = oh.iter().map(|&x| x as f64 * x as f64).sum::<f64>() / dv as f64;
        let r = 1.0 / (ms + OUT_NORM_EPS).sqrt();
        yh.iter_mut().zip(oh).zip(g).for_each(|((y, &x), &g)| *y = (g as f64 * x as f64 * r) as f32);
    }
    y
}

/// λ_f^n for n = 0..=len, each in f64 and rounded once: [len + 1, F].
pub fn decay_powers(decay: &[f64], len: usize) -> Vec<f32> {
    let f = decay.len();
    let mut out = vec![0f32; (len + 1) * f]; // [len + 1, F]
    for (n, row) in out.chunks_exact_mut(f).enumerate() {
        for (o, &l) in row.iter_mut().zip(decay) {
            *o = l.powi(n as i32) as f32;
        }
    }
    out
}

#[track_caller]
#[allow(clippy::too_many_arguments)]
fn check(
    func: &str,
    phk: &[f32],
    kappa: &[f32],
    v: &[f32],
    phq: &[f32],
    r: usize,
    t: usize,
    f: usize,
    dv: usize,
    state: &[f32],
    out: &[f32],
) {
    assert!(
        phk.len() == t * f && kappa.len() == t && v.len() == t * dv && phq.len() == t * r * f,
        "{func}: {t} tokens need φk [{t}x{f}], κ [{t}], v [{t}x{dv}], φq [{t}x{r}x{f}]; got {}, {}, {}, {}",
        phk.len(),
        kappa.len(),
        v.len(),
        phq.len()
    );
    assert!(state.len() == f * dv && out.len() == t * r * dv, "{func}: state must be [{f}x{dv}] and out [{t}x{r}x{dv}]");
}

/// The recurrence, token by token, for one state read by `r` query heads: φk [t, F], κ [t],
/// v [t, d_v], φq [t, r, F], decay [F] (λ, f32), state [F, d_v] (read and advanced),
/// out [t, r, d_v]. SIMD chosen at run time; the AVX-512 and AVX2 builds of the same loops
/// (elementwise over d_v, no reassociated sum, nothing contracted into an FMA) equal the scalar
/// twin (`recurrent_scalar`) bit for bit.
#[allow(clippy::too_many_arguments)]
pub fn recurrent(
    phk: &[f32],
    kappa: &[f32],
    v: &[f32],
    phq: &[f32],
    r: usize,
    decay: &[f32],
    t: usize,
    dv: usize,
    state: &mut [f32],
    out: &mut [f32],
) {
    let f = decay.len();
    check("vmf::recurrent", phk, kappa, v, phq, r, t, f, dv, state, out);
    match crate::simd::level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512F and FMA detected at run time; the body is safe code.
        crate::simd::Level::Avx512 => unsafe { recurrent_avx512(phk, kappa, v, phq, r, decay, t, dv, state, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 and FMA detected at run time; the body is safe code.
        crate::simd::Level::Avx2 => unsafe { recurrent_avx2(phk, kappa, v, phq, r, decay, t, dv, state, out) },
        _ => recurrent_body(phk, kappa, v, phq, r, decay, t, dv, state, out),
    }
}

/// The scalar twin of `recurrent` (the baseline target's code generation).
#[allow(clippy::too_many_arguments)]
pub fn recurrent_scalar(
    phk: &[f32],
    kappa: &[f32],
    v: &[f32],
    phq: &[f32],
    r: usize,
    decay: &[f32],
    t: usize,
    dv: usize,
    state: &mut [f32],
    out: &mut [f32],
) {
    let f = decay.len();
    check("vmf::recurrent_scalar", phk, kappa, v, phq, r, t, f, dv, state, out);
    recurrent_body(phk, kappa, v, phq, r, decay, t, dv, state, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn recurrent_avx512(
    phk: &[f32],
    kappa: &[f32],
    v: &[f32],
    phq: &[f32],
    r: usize,
    decay: &[f32],
    t: usize,
    dv: usize,
    state: &mut [f32],
    out: &mut [f32],
) {
    recurrent_body(phk, kappa, v, phq, r, decay, t, dv, state, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn recurrent_avx2(
    phk: &[f32],
    kappa: &[f32],
    v: &[f32],
    phq: &[f32],
    r: usize,
    decay: &[f32],
    t: usize,
    dv: usize,
    state: &mut [f32],
    out: &mut [f32],
) {
    recurrent_body(phk, kappa, v, phq, r, decay, t, dv, state, out)
}

/// One pass over S per token: each row is decayed and written, then read by the r query heads
/// while it is in registers / L1.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn recurrent_body(
    phk: &[f32],
    kappa: &[f32],
    v: &[f32],
    phq: &[f32],
    r: usize,
    decay: &[f32],
    t: usize,
    dv: usize,
    state: &mut [f32],
    out: &mut [f32],
) {
    let f = decay.len();
    for s in 0..t {
        let (ks, vs) = (&phk[s * f..(s + 1) * f], &v[s * dv..(s + 1) * dv]);
        let qs = &phq[s * r * f..(s + 1) * r * f]; // [r, F]
        let o = &mut out[s * r * dv..(s + 1) * r * dv]; // [r, d_v]
        o.fill(0.0);
        for (fi, row) in state.chunks_exact_mut(dv).enumerate() {
            let (l, c) = (decay[fi], kappa[s] * ks[fi]);
            for (x, &vv) in row.iter_mut().zip(vs) {
                *x = l * *x + c * vv;
            }
            for (h, oh) in o.chunks_exact_mut(dv).enumerate() {
                let q = qs[h * f + fi];
                for (y, &x) in oh.iter_mut().zip(row.iter()) {
                    *y += q * x;
                }
            }
        }
    }
}

/// The chunk-parallel form (module header) over `t` tokens, chunks of `CHUNK` from the first:
/// the same arguments as `recurrent` plus the decay in f64 (`decay64`, λ before rounding:
/// the powers are formed from it). Agrees with the recurrence to f32 rounding, not bit for
/// bit (sums are regrouped).
#[allow(clippy::too_many_arguments)]
pub fn chunked(
    phk: &[f32],
    kappa: &[f32],
    v: &[f32],
    phq: &[f32],
    r: usize,
    decay64: &[f64],
    t: usize,
    dv: usize,
    state: &mut [f32],
    out: &mut [f32],
) {
    let f = decay64.len();
    check("vmf::chunked", phk, kappa, v, phq, r, t, f, dv, state, out);
    let pw = decay_powers(decay64, CHUNK); // [CHUNK + 1, F]
    let mut qd = vec![0f32; CHUNK * r * f]; // [L, r, F]: φq_i ⊙ λ^{i+1}
    let mut kd = vec![0f32; f * CHUNK]; // [F, L]: (κ_j λ^{L−1−j} ⊙ φk_j)ᵀ
    let mut a = vec![0f32; CHUNK * CHUNK]; // [L, L] for one query head
    let mut s_new = vec![0f32; f * dv]; // [F, d_v]
    for c0 in (0..t).step_by(CHUNK) {
        let l = CHUNK.min(t - c0);
        let (k_c, v_c) = (&phk[c0 * f..(c0 + l) * f], &v[c0 * dv..(c0 + l) * dv]);
        let q_c = &phq[c0 * r * f..(c0 + l) * r * f]; // [l, r, F]
        let o_c = &mut out[c0 * r * dv..(c0 + l) * r * dv]; // [l, r, d_v]
        // Inter-chunk: o_i = (φq_i ⊙ λ^{i+1}) · S0, all l·r rows in one GEMM.
        for i in 0..l {
            let p = &pw[(i + 1) * f..(i + 2) * f];
            for h in 0..r {
                let row = &mut qd[(i * r + h) * f..(i * r + h + 1) * f];
                row.iter_mut().zip(&q_c[(i * r + h) * f..]).zip(p).for_each(|((x, &q), &p)| *x = q * p);
            }
        }
        o_c.fill(0.0);
        gemm_nn(&qd[..l * r * f], l * r, state, dv, f, dv, o_c, dv); // [l·r, d_v]
        // Intra-chunk: A_ij = κ_j Σ_f φq_i[f] λ_f^{i−j} φk_j[f], j ≤ i, per query head.
        for h in 0..r {
            a[..l * l].fill(0.0);
            for i in 0..l {
                let q = &q_c[(i * r + h) * f..(i * r + h + 1) * f];
                for j in 0..=i {
                    let (k, p) = (&k_c[j * f..(j + 1) * f], &pw[(i - j) * f..(i - j + 1) * f]);
                    let mut acc = 0f32;
                    for ((&q, &k), &p) in q.iter().zip(k).zip(p) {
                        acc += q * p * k;
                    }
                    a[i * l + j] = kappa[c0 + j] * acc;
                }
            }
            // o_i += Σ_j A_ij v_j: rows of head h are strided by r in o_c.
            for i in 0..l {
                let o = &mut o_c[(i * r + h) * dv..(i * r + h + 1) * dv];
                for j in 0..=i {
                    let w = a[i * l + j];
                    o.iter_mut().zip(&v_c[j * dv..(j + 1) * dv]).for_each(|(y, &x)| *y += w * x);
                }
            }
        }
        // State: S = λ^l ⊙ S0 + Σ_j (κ_j λ^{l−1−j} ⊙ φk_j) ⊗ v_j.
        for fi in 0..f {
            for j in 0..l {
                kd[fi * l + j] = kappa[c0 + j] * pw[(l - 1 - j) * f + fi] * k_c[j * f + fi];
            }
        }
        s_new.fill(0.0);
        gemm_nn(&kd[..f * l], f, v_c, dv, l, dv, &mut s_new, dv); // [F, d_v]
        for (fi, (row, add)) in state.chunks_exact_mut(dv).zip(s_new.chunks_exact(dv)).enumerate() {
            let p = pw[l * f + fi];
            row.iter_mut().zip(add).for_each(|(x, &a)| *x = p * *x + a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rng(seed: u64) -> impl FnMut() -> f32 {
        let mut s = seed;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        }
    }

    /// The recurrence in f64 from the definition (o_t = Σ_{s≤t} κ_s Σ_f φq_t λ^{t−s} φk_s v_s).
    #[allow(clippy::too_many_arguments)]
    fn direct(
        phk: &[f32],
        kappa: &[f32],
        v: &[f32],
        phq: &[f32],
        r: usize,
        decay: &[f64],
        t: usize,
        dv: usize,
        s0: &[f32],
    ) -> Vec<f64> {
        let f = decay.len();
        let mut out = vec![0f64; t * r * dv];
        for tt in 0..t {
            for h in 0..r {
                for d in 0..dv {
                    let mut acc = 0f64;
                    for fi in 0..f {
                        let q = phq[(tt * r + h) * f + fi] as f64;
                        acc += q * decay[fi].powi(tt as i32 + 1) * s0[fi * dv + d] as f64;
                        for s in 0..=tt {
                            acc += kappa[s] as f64
                                * q
                                * decay[fi].powi((tt - s) as i32)
                                * phk[s * f + fi] as f64
                                * v[s * dv + d] as f64;
                        }
                    }
                    out[(tt * r + h) * dv + d] = acc;
                }
            }
        }
        out
    }

    /// Recurrence (SIMD), its scalar twin, the chunked form and the direct f64 sum agree; the
    /// SIMD and scalar recurrences bit for bit, the chunked form to f32 rounding, across a
    /// partial last chunk and a non-zero start state.
    #[test]
    fn recurrence_chunked_and_direct_agree() {
        let mut g = rng(0x5EED_0F_7A5E);
        let (r, p, dv, t) = (3, 8, 20, 2 * CHUNK + 7);
        let f = 2 * p;
        let theta: Vec<f32> = (0..t * (r + 1) * p).map(|_| 12.0 * g()).collect();
        let mut phk = vec![0f32; t * f];
        let mut phq = vec![0f32; t * r * f];
        for s in 0..t {
            phase_features(&theta[s * p..(s + 1) * p], 0.7, &mut phk[s * f..(s + 1) * f]);
            for h in 0..r {
                let th = &theta[(t + s * r + h) * p..(t + s * r + h + 1) * p];
                phase_features(th, 0.7, &mut phq[(s * r + h) * f..(s * r + h + 1) * f]);
            }
        }
        let kappa: Vec<f32> = (0..t).map(|_| 0.5 + 0.5 * g()).collect();
        let v: Vec<f32> = (0..t * dv).map(|_| g()).collect();
        let decay64: Vec<f64> = (0..f).map(|i| (-(-3.0 + 0.4 * i as f64).exp()).exp()).collect();
        let decay: Vec<f32> = decay64.iter().map(|&x| x as f32).collect();
        let s0: Vec<f32> = (0..f * dv).map(|_| g()).collect();
        let want = direct(&phk, &kappa, &v, &phq, r, &decay64, t, dv, &s0);
        let scale = want.iter().fold(0f64, |m, x| m.max(x.abs()));

        let (mut s_simd, mut o_simd) = (s0.clone(), vec![0f32; t * r * dv]);
        recurrent(&phk, &kappa, &v, &phq, r, &decay, t, dv, &mut s_simd, &mut o_simd);
        let (mut s_sc, mut o_sc) = (s0.clone(), vec![0f32; t * r * dv]);
        recurrent_scalar(&phk, &kappa, &v, &phq, r, &decay, t, dv, &mut s_sc, &mut o_sc);
        assert!(o_simd.iter().zip(&o_sc).all(|(a, b)| a.to_bits() == b.to_bits()), "SIMD recurrence != scalar twin");
        assert!(s_simd.iter().zip(&s_sc).all(|(a, b)| a.to_bits() == b.to_bits()), "SIMD state != scalar twin");

        let (mut s_ch, mut o_ch) = (s0.clone(), vec![0f32; t * r * dv]);
        chunked(&phk, &kappa, &v, &phq, r, &decay64, t, dv, &mut s_ch, &mut o_ch);
        let rel = |o: &[f32]| o.iter().zip(&want).fold(0f64, |m, (&a, &b)| m.max((a as f64 - b).abs())) / scale;
        let (e_rec, e_ch) = (rel(&o_simd), rel(&o_ch));
        let e_state = s_ch.iter().zip(&s_simd).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        println!(
            "vmf: recurrence vs f64 {e_rec:.2e}, chunked vs f64 {e_ch:.2e} (of max |o| {scale:.2}), state chunked vs recurrent {e_state:.2e}"
        );
        assert!(e_rec < 1e-5 && e_ch < 1e-5 && e_state < 1e-4, "recurrence {e_rec:e}, chunked {e_ch:e}, state {e_state:e}");
    }

    /// cos/sin through f64 at large phases: equal to the f64 value of the f32 phase to one
    /// rounding.
    #[test]
    fn phase_features_at_large_phases() {
        let th = [1.0e4f32, -3.3e3, 0.1, 77.7];
        let mut out = [0f32; 8];
        phase_features(&th, 0.5, &mut out);
        for (i, &t) in th.iter().enumerate() {
            let x = t as f64 * 0.5;
            assert_eq!(out[i], x.cos() as f32);
            assert_eq!(out[4 + i], x.sin() as f32);
        }
    }
}

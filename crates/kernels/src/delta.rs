//! The gated delta rule (GatedDeltaNet's mixer core; KDA's with a per-channel decay is the same
//! shape) for one head: the token-by-token recurrence (decode, and the reference forever) and
//! the chunkwise-parallel WY form (prefill), which must agree. Pure functions on slices; the
//! engine's mixer does the projections, the short convolutions, the L2 norms and the output
//! gate, and spreads heads over its pool.
//!
//! Per token t, with q_t already L2-normalized and scaled by 1/√d_k, k_t L2-normalized,
//! g_t ≤ 0 the log decay and β_t ∈ (0, 1):
//! ```text
//! S ← e^{g_t} · S                       S: [d_k, d_v]
//! S ← S + k_t ⊗ β_t (v_t − Sᵀ k_t)
//! o_t = Sᵀ q_t
//! ```
//! Chunked form (DeltaNet arXiv 2406.06484; the layout of FLA's chunk_gated_delta_rule and
//! transformers' torch_chunk_gated_delta_rule): within a chunk of L tokens, with Γ_i the
//! cumulative sum of g inside the chunk, the lower-triangular system
//! `T = (I + tril₋₁(diag(β) K Kᵀ ⊙ e^{Γ_i − Γ_j}))⁻¹` (forward substitution) gives
//! U = T·diag(β)V and W = T·diag(β e^{Γ})K; then with the state S entering the chunk,
//! `V' = U − W·S`, `O = (Q ⊙ e^{Γ}) S + tril₀(Q Kᵀ ⊙ e^{Γ_i − Γ_j}) V'` and
//! `S ← e^{Γ_L} S + (K ⊙ e^{Γ_L − Γ})ᵀ V'`. Only the j ≤ i half of e^{Γ_i − Γ_j} is ever formed
//! (the other half overflows for strong decay).
//!
//! Why hand-written: this is the product's core (prefill of hybrid models); the per-chunk
//! matrices are small (L ≤ 64 by default, d ≤ 256) and live in L1/L2.

use crate::act::exp_fast;
use crate::dot::gemm_nn;

/// Chunk length of the WY form, tuned on this CPU (`examples/delta_bench`, one head of
/// 128 × 128, 512 tokens, one thread, ms: chunk 8 0.64, 16 0.60, 24 0.73, 32 0.76, 48 0.88,
/// 64 0.98 — transformers' and FLA's choice —, 128 2.0; the recurrence 1.4). The state terms
/// (3·d_k·d_v per token) do not depend on the chunk; the intra-chunk ones grow with it, and
/// the GEMMs stay efficient down to 16 rows.
pub const CHUNK: usize = 16;

#[track_caller]
#[allow(clippy::too_many_arguments)]
fn check(
    func: &str,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    t: usize,
    dk: usize,
    dv: usize,
    state: &[f32],
    out: &[f32],
) {
    assert!(
        q.len() == t * dk && k.len() == t * dk && v.len() == t * dv && g.len() == t && beta.len() == t,
        "{func}: {t} tokens need q, k [{t}x{dk}], v [{t}x{dv}], g and beta [{t}]; got {}, {}, {}, {}, {}",
        q.len(),
        k.len(),
        v.len(),
        g.len(),
        beta.len()
    );
    assert!(state.len() == dk * dv && out.len() == t * dv, "{func}: state must be [{dk}x{dv}] and out [{t}x{dv}]");
}

/// The recurrence, token by token: the reference, and decode. q, k: [t, dk]; v: [t, dv];
/// g, beta: [t]; state: [dk, dv] (read and advanced); out: [t, dv].
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_recurrent(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    t: usize,
    dk: usize,
    dv: usize,
    state: &mut [f32],
    out: &mut [f32],
) {
    check("gated_delta_recurrent", q, k, v, g, beta, t, dk, dv, state, out);
    let e: Vec<f32> = g[..t].iter().map(|x| x.exp()).collect(); // [t]
    recurrence(q, k, v, beta, t, dk, dv, state, out, |s, _| e[s]);
}

/// Runs `f` built for AVX-512 (or AVX2) when the CPU has it, else as the baseline target
/// builds it. The chunk steps are `#[inline(always)]` down to the GEMM and exp calls (which
/// dispatch on their own), so their elementwise loops (decay masks, scalings, the forward
/// substitution) vectorize 16 (8) wide inside `run_avx512` (`run_avx2`); no sum is
/// reassociated and nothing is contracted into an FMA, so every build gives the same bits.
#[inline(always)]
fn simd_run(f: impl FnOnce()) {
    match crate::simd::level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512F and FMA detected at run time; `f` is safe code.
        crate::simd::Level::Avx512 => unsafe { run_avx512(f) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2, FMA and F16C detected at run time; `f` is safe code.
        crate::simd::Level::Avx2 => unsafe { run_avx2(f) },
        _ => f(),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn run_avx512(f: impl FnOnce()) {
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_avx2(f: impl FnOnce()) {
    f()
}

/// The delta-rule recurrence shared by GDN and KDA: `decay(token, channel)` is e^{g} for row
/// `channel` of the state (one value per token for GDN, per key channel for KDA). SIMD chosen
/// at run time; the AVX-512 and AVX2 builds of the same loops (elementwise over d_v, no
/// reassociated sums, no contraction into FMA) equal the scalar twin bit for bit.
#[allow(clippy::too_many_arguments)]
fn recurrence(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    beta: &[f32],
    t: usize,
    dk: usize,
    dv: usize,
    state: &mut [f32],
    out: &mut [f32],
    decay: impl Fn(usize, usize) -> f32,
) {
    match crate::simd::level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512F and FMA detected at run time; the body is safe code.
        crate::simd::Level::Avx512 => unsafe { recurrence_avx512(q, k, v, beta, t, dk, dv, state, out, decay) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 and FMA detected at run time; the body is safe code.
        crate::simd::Level::Avx2 => unsafe { recurrence_avx2(q, k, v, beta, t, dk, dv, state, out, decay) },
        _ => recurrence_scalar(q, k, v, beta, t, dk, dv, state, out, decay),
    }
}

/// The scalar twin of `recurrence` (the baseline target's code generation).
#[allow(clippy::too_many_arguments)]
pub fn recurrence_scalar(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    beta: &[f32],
    t: usize,
    dk: usize,
    dv: usize,
    state: &mut [f32],
    out: &mut [f32],
    decay: impl Fn(usize, usize) -> f32,
) {
    recurrence_body(q, k, v, beta, t, dk, dv, state, out, decay)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn recurrence_avx512(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    beta: &[f32],
    t: usize,
    dk: usize,
    dv: usize,
    state: &mut [f32],
    out: &mut [f32],
    decay: impl Fn(usize, usize) -> f32,
) {
    recurrence_body(q, k, v, beta, t, dk, dv, state, out, decay)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn recurrence_avx2(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    beta: &[f32],
    t: usize,
    dk: usize,
    dv: usize,
    state: &mut [f32],
    out: &mut [f32],
    decay: impl Fn(usize, usize) -> f32,
) {
    recurrence_body(q, k, v, beta, t, dk, dv, state, out, decay)
}

/// Two passes over S per token (decode streams every GDN layer's state, 1 MB for 16 heads of
/// 128 × 128, from memory and back: the passes, not the arithmetic, are the cost):
/// pass 1 reads S: Sᵀk with the decay folded into k, (e ⊙ k)ᵀS = (diag(e) S)ᵀ k;
/// pass 2 rewrites each row once, S_c ← e_c S_c + k_c δ, and accumulates o += q_c S_c from it.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn recurrence_body(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    beta: &[f32],
    t: usize,
    dk: usize,
    dv: usize,
    state: &mut [f32],
    out: &mut [f32],
    decay: impl Fn(usize, usize) -> f32,
) {
    let mut kv = vec![0f32; dv]; // [dv]: (diag(e) S)ᵀ k, then δ
    let mut e = vec![0f32; dk]; // [dk]: this token's decay per state row
    for s in 0..t {
        let (qs, ks, vs) = (&q[s * dk..(s + 1) * dk], &k[s * dk..(s + 1) * dk], &v[s * dv..(s + 1) * dv]);
        e.iter_mut().enumerate().for_each(|(c, x)| *x = decay(s, c));
        kv.fill(0.0);
        for ((&kc, &ec), row) in ks.iter().zip(&e).zip(state.chunks_exact(dv)) {
            let a = kc * ec;
            for (o, &sv) in kv.iter_mut().zip(row) {
                *o += a * sv;
            }
        }
        // δ = β (v − Sᵀk)
        for (o, &vv) in kv.iter_mut().zip(vs) {
            *o = beta[s] * (vv - *o);
        }
        let o = &mut out[s * dv..(s + 1) * dv];
        o.fill(0.0);
        for (((&kc, &ec), &qc), row) in ks.iter().zip(&e).zip(qs).zip(state.chunks_exact_mut(dv)) {
            for ((sv, &d), ov) in row.iter_mut().zip(&kv).zip(o.iter_mut()) {
                *sv = ec * *sv + kc * d;
                *ov += qc * *sv;
            }
        }
    }
}

/// Kimi Delta Attention's recurrence: as `gated_delta_recurrent` with a decay per key channel,
/// S ← diag(e^{g_t}) S (row c of S scaled by e^{g_t,c}). g: [t, dk] log decays (≤ 0); other
/// arguments as there. Used for decode and, until the per-channel WY form lands, for prefill.
#[allow(clippy::too_many_arguments)]
pub fn kda_recurrent(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    t: usize,
    dk: usize,
    dv: usize,
    state: &mut [f32],
    out: &mut [f32],
) {
    assert_eq!(g.len(), t * dk, "kda_recurrent: g must be [{t}x{dk}], got {} values", g.len());
    check("kda_recurrent", q, k, v, &g[..t.min(g.len())], beta, t, dk, dv, state, out);
    recurrence(q, k, v, beta, t, dk, dv, state, out, |s, ch| g[s * dk + ch].exp());
}

/// KDA's chunkwise-parallel form: the WY algebra of `gated_delta_chunked` with the scalar
/// decays replaced by diagonal ones (per key channel; diagonal matrices commute, so every
/// step carries over): A_ij = β_i (k_i ⊙ e^{Γ_i−Γ_j})·k_j, W_i = Σ_j T_ij β_j (k_j ⊙ e^{Γ_j}),
/// O_i = (q_i ⊙ e^{Γ_i}) S + Σ_{j≤i} ((q_i ⊙ e^{Γ_i−Γ_j})·k_j) V'_j and
/// S ← diag(e^{Γ_L}) S + Σ_j (k_j ⊙ e^{Γ_L−Γ_j}) ⊗ V'_j. Only j ≤ i exponents are formed.
/// Same contract as `kda_recurrent` (g: [t, dk]); equal to it up to f32 rounding.
#[allow(clippy::too_many_arguments)]
pub fn kda_chunked(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    t: usize,
    dk: usize,
    dv: usize,
    chunk: usize,
    state: &mut [f32],
    out: &mut [f32],
) {
    assert_eq!(g.len(), t * dk, "kda_chunked: g must be [{t}x{dk}], got {} values", g.len());
    check("kda_chunked", q, k, v, &g[..t.min(g.len())], beta, t, dk, dv, state, out);
    simd_run(|| kda_chunked_scalar(q, k, v, g, beta, t, dk, dv, chunk, state, out));
}

/// `kda_chunked` as the baseline target compiles it (see `gated_delta_chunked_scalar`).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn kda_chunked_scalar(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    t: usize,
    dk: usize,
    dv: usize,
    chunk: usize,
    state: &mut [f32],
    out: &mut [f32],
) {
    assert_eq!(g.len(), t * dk, "kda_chunked: g must be [{t}x{dk}], got {} values", g.len());
    check("kda_chunked", q, k, v, &g[..t.min(g.len())], beta, t, dk, dv, state, out);
    for_chunks(t, chunk, |c0, l| {
        kda_chunk_step(
            &q[c0 * dk..(c0 + l) * dk],
            &k[c0 * dk..(c0 + l) * dk],
            &v[c0 * dv..(c0 + l) * dv],
            &g[c0 * dk..(c0 + l) * dk],
            &beta[c0..c0 + l],
            l,
            dk,
            dv,
            state,
            &mut out[c0 * dv..(c0 + l) * dv],
        )
    });
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn kda_chunk_step(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    l: usize,
    dk: usize,
    dv: usize,
    s: &mut [f32],
    out: &mut [f32],
) {
    // Γ: per-channel cumulative log decay. [l, dk]
    let mut gam = vec![0f32; l * dk];
    for i in 0..l {
        for ch in 0..dk {
            gam[i * dk + ch] = g[i * dk + ch] + if i > 0 { gam[(i - 1) * dk + ch] } else { 0.0 };
        }
    }
    // Decayed inner products for j <= i: dot(a_i ⊙ e^{Γ_i−Γ_j}, k_j).
    let decayed_dot = |a: &[f32], i: usize, j: usize| -> f32 {
        (0..dk).map(|ch| a[i * dk + ch] * (gam[i * dk + ch] - gam[j * dk + ch]).exp() * k[j * dk + ch]).sum::<f32>()
    };
    let mut a = vec![0f32; l * l]; // [l, l]
    for i in 0..l {
        for j in 0..i {
            a[i * l + j] = -beta[i] * decayed_dot(k, i, j);
        }
    }
    forward_substitute(&mut a, l);
    let mut vb = vec![0f32; l * dv]; // [l, dv]: β V
    let mut kb = vec![0f32; l * dk]; // [l, dk]: β (K ⊙ e^Γ)
    for j in 0..l {
        for (o, &x) in vb[j * dv..(j + 1) * dv].iter_mut().zip(&v[j * dv..(j + 1) * dv]) {
            *o = beta[j] * x;
        }
        for ch in 0..dk {
            kb[j * dk + ch] = beta[j] * gam[j * dk + ch].exp() * k[j * dk + ch];
        }
    }
    let mut vn = vec![0f32; l * dv]; // U, then V' = U − W S
    gemm_nn(&a, l, &vb, dv, l, dv, &mut vn, dv);
    let mut w = vec![0f32; l * dk];
    gemm_nn(&a, l, &kb, dk, l, dk, &mut w, dk);
    let mut tmp = vec![0f32; l * dv];
    gemm_nn(&w, l, s, dv, dk, dv, &mut tmp, dv);
    vn.iter_mut().zip(&tmp).for_each(|(o, &x)| *o -= x);
    // O = (Q ⊙ e^Γ) S + Σ_{j≤i} decayed(q_i, k_j) V'_j
    let mut qe = vec![0f32; l * dk];
    for i in 0..l {
        for ch in 0..dk {
            qe[i * dk + ch] = q[i * dk + ch] * gam[i * dk + ch].exp();
        }
    }
    gemm_nn(&qe, l, s, dv, dk, dv, out, dv);
    let mut p = vec![0f32; l * l];
    for i in 0..l {
        for j in 0..=i {
            p[i * l + j] = decayed_dot(q, i, j);
        }
    }
    gemm_nn(&p, l, &vn, dv, l, dv, &mut tmp, dv);
    out.iter_mut().zip(&tmp).for_each(|(o, &x)| *o += x);
    // S ← diag(e^{Γ_L}) S + Σ_j (k_j ⊙ e^{Γ_L−Γ_j}) ⊗ V'_j
    let last = (l - 1) * dk;
    for ch in 0..dk {
        let e = gam[last + ch].exp();
        s[ch * dv..(ch + 1) * dv].iter_mut().for_each(|x| *x *= e);
    }
    let mut kdt = vec![0f32; dk * l]; // [dk, l]
    for j in 0..l {
        for ch in 0..dk {
            kdt[ch * l + j] = k[j * dk + ch] * (gam[last + ch] - gam[j * dk + ch]).exp();
        }
    }
    let mut ds = vec![0f32; dk * dv];
    gemm_nn(&kdt, dk, &vn, dv, l, dv, &mut ds, dv);
    s.iter_mut().zip(&ds).for_each(|(x, &d)| *x += d);
}

/// The chunkwise-parallel form over chunks of `chunk` tokens (the last may be shorter); same
/// contract and, up to f32 rounding, same results as `gated_delta_recurrent`.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_chunked(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    t: usize,
    dk: usize,
    dv: usize,
    chunk: usize,
    state: &mut [f32],
    out: &mut [f32],
) {
    check("gated_delta_chunked", q, k, v, g, beta, t, dk, dv, state, out);
    simd_run(|| gated_delta_chunked_scalar(q, k, v, g, beta, t, dk, dv, chunk, state, out));
}

/// `gated_delta_chunked` as the baseline target compiles it: the scalar twin (the dispatched
/// version runs the same code built for AVX-512 and equals it bit for bit).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn gated_delta_chunked_scalar(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    t: usize,
    dk: usize,
    dv: usize,
    chunk: usize,
    state: &mut [f32],
    out: &mut [f32],
) {
    check("gated_delta_chunked", q, k, v, g, beta, t, dk, dv, state, out);
    for_chunks(t, chunk, |c0, l| {
        chunk_step(
            &q[c0 * dk..(c0 + l) * dk],
            &k[c0 * dk..(c0 + l) * dk],
            &v[c0 * dv..(c0 + l) * dv],
            &g[c0..c0 + l],
            &beta[c0..c0 + l],
            l,
            dk,
            dv,
            state,
            &mut out[c0 * dv..(c0 + l) * dv],
        )
    });
}

/// One chunk of `l` tokens (see the module header for the algebra), as f32 GEMMs
/// (`dot::gemm_nn`) around an O(L³/6) forward substitution; the per-chunk buffers are small.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn chunk_step(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    l: usize,
    dk: usize,
    dv: usize,
    s: &mut [f32],
    out: &mut [f32],
) {
    // Γ: cumulative log decay inside the chunk.
    let mut gam = vec![0f32; l]; // [l]
    let mut acc = 0f32;
    for (o, &x) in gam.iter_mut().zip(g) {
        acc += x;
        *o = acc;
    }
    let mut kt = vec![0f32; dk * l]; // [dk, l]: Kᵀ
    for i in 0..l {
        for (c, &x) in k[i * dk..(i + 1) * dk].iter().enumerate() {
            kt[c * l + i] = x;
        }
    }
    // A = −tril₋₁(β_i k_i·k_j e^{Γ_i−Γ_j}); forward substitution turns it into T (diag 1).
    let mut a = vec![0f32; l * l]; // [l, l]
    gemm_nn(k, l, &kt, l, dk, l, &mut a, l);
    // e^{Γ_i−Γ_j} for j ≤ i (the other half would overflow), one vector-exp pass per row.
    let mut decay = vec![0f32; l * l]; // [l, l]
    for i in 0..l {
        let row = &mut decay[i * l..i * l + i + 1];
        row.iter_mut().zip(&gam[..=i]).for_each(|(d, &gj)| *d = gam[i] - gj);
        exp_fast(row);
    }
    for i in 0..l {
        for j in 0..l {
            a[i * l + j] = if j < i { -beta[i] * a[i * l + j] * decay[i * l + j] } else { 0.0 };
        }
    }
    forward_substitute(&mut a, l);
    // U = T·diag(β)V [l, dv]; W = T·diag(β e^Γ)K [l, dk]
    let mut vb = vec![0f32; l * dv]; // [l, dv]
    let mut kb = vec![0f32; l * dk]; // [l, dk]
    for j in 0..l {
        let (cv, ck) = (beta[j], beta[j] * gam[j].exp());
        vb[j * dv..(j + 1) * dv].iter_mut().zip(&v[j * dv..(j + 1) * dv]).for_each(|(o, &x)| *o = cv * x);
        kb[j * dk..(j + 1) * dk].iter_mut().zip(&k[j * dk..(j + 1) * dk]).for_each(|(o, &x)| *o = ck * x);
    }
    let mut vn = vec![0f32; l * dv]; // [l, dv]: U, then V' = U − W·S
    gemm_nn(&a, l, &vb, dv, l, dv, &mut vn, dv);
    let mut w = vec![0f32; l * dk]; // [l, dk]
    gemm_nn(&a, l, &kb, dk, l, dk, &mut w, dk);
    let mut tmp = vec![0f32; l * dv.max(l)];
    gemm_nn(&w, l, s, dv, dk, dv, &mut tmp[..l * dv], dv);
    vn.iter_mut().zip(&tmp[..l * dv]).for_each(|(o, &x)| *o -= x);
    // O = (Q ⊙ e^Γ) S + tril₀(Q Kᵀ ⊙ e^{Γ_i−Γ_j}) V'
    let mut qe = vec![0f32; l * dk]; // [l, dk]
    for i in 0..l {
        let e = gam[i].exp();
        qe[i * dk..(i + 1) * dk].iter_mut().zip(&q[i * dk..(i + 1) * dk]).for_each(|(o, &x)| *o = e * x);
    }
    gemm_nn(&qe, l, s, dv, dk, dv, out, dv);
    let mut p = vec![0f32; l * l]; // [l, l]
    gemm_nn(q, l, &kt, l, dk, l, &mut p, l);
    for i in 0..l {
        for j in 0..l {
            p[i * l + j] = if j <= i { p[i * l + j] * decay[i * l + j] } else { 0.0 };
        }
    }
    gemm_nn(&p, l, &vn, dv, l, dv, &mut tmp[..l * dv], dv);
    out.iter_mut().zip(&tmp[..l * dv]).for_each(|(o, &x)| *o += x);
    // S ← e^{Γ_L} S + (K ⊙ e^{Γ_L − Γ})ᵀ V'
    let gl = gam[l - 1];
    let el = gl.exp();
    for c in 0..dk {
        for j in 0..l {
            kt[c * l + j] *= (gl - gam[j]).exp();
        }
    }
    let mut ds = vec![0f32; dk * dv]; // [dk, dv]
    gemm_nn(&kt, dk, &vn, dv, l, dv, &mut ds, dv);
    s.iter_mut().zip(&ds).for_each(|(x, &d)| *x = *x * el + d);
}

/// Calls `step(first, len)` for consecutive chunks of `chunk` (≥ 1) tokens covering `0..t`.
#[inline(always)]
fn for_chunks(t: usize, chunk: usize, mut step: impl FnMut(usize, usize)) {
    let c = chunk.max(1);
    let mut c0 = 0;
    while c0 < t {
        let l = (t - c0).min(c);
        step(c0, l);
        c0 += l;
    }
}

/// In place, a (strictly lower-triangular, [l, l]) becomes T = (I − a)⁻¹ as the WY form needs
/// it: row by row, a[i][j] += Σ_{j<m<i} a[i][m]·a[m][j] (rows m < i already final), then a
/// unit diagonal. Shared by the GDN and KDA chunk steps.
#[inline(always)]
fn forward_substitute(a: &mut [f32], l: usize) {
    // Row i of T is Σ_{m<i} A[i][m] · T[m] (T[m][m] = 1): axpys over the final rows above,
    // which vectorize; each element still sums m = j, j+1, .. in order.
    let mut row = vec![0f32; l]; // [l]: A[i][0..i]
    for i in 1..l {
        let (done, rest) = a.split_at_mut(i * l);
        let out = &mut rest[..i];
        row[..i].copy_from_slice(out);
        out.fill(0.0);
        for m in 0..i {
            let c = row[m];
            out[m] += c;
            for (o, &t) in out[..m].iter_mut().zip(&done[m * l..m * l + m]) {
                *o += c * t;
            }
        }
    }
    for i in 0..l {
        a[i * l + i] = 1.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rng(u64);
    impl Rng {
        fn f(&mut self) -> f32 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 40) as f32 / (1u64 << 24) as f32
        }
    }

    /// max |a − b| relative to max |a| (floored at 1e-6).
    fn rel_to_max(a: &[f32], b: &[f32]) -> f32 {
        // NaN-propagating (cortiq-testkit): a NaN in either makes the result NaN.
        let scale = cortiq_testkit::max_abs(a).max(1e-6);
        cortiq_testkit::max_abs_diff(a, b).0 / scale
    }

    /// Random q, k [t, dk] per token L2-normalized as the mixers deliver them (q also ×1/√dk).
    fn normed_qk(rng: &mut Rng, t: usize, dk: usize) -> (Vec<f32>, Vec<f32>) {
        let mut q: Vec<f32> = (0..t * dk).map(|_| rng.f() - 0.5).collect();
        let mut k: Vec<f32> = (0..t * dk).map(|_| rng.f() - 0.5).collect();
        for s in 0..t {
            l2n(&mut q[s * dk..(s + 1) * dk], 1.0 / (dk as f32).sqrt());
            l2n(&mut k[s * dk..(s + 1) * dk], 1.0);
        }
        (q, k)
    }

    fn l2n(x: &mut [f32], scale: f32) {
        let n = x.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-6);
        x.iter_mut().for_each(|v| *v *= scale / n);
    }

    /// The dispatched recurrence (AVX-512 where the CPU has it) equals its scalar twin bit for
    /// bit, GDN-style (decay per token) and KDA-style (per channel), odd widths included.
    #[test]
    fn recurrence_simd_matches_scalar() {
        let mut rng = Rng(0x5EED_0000_0000_0042);
        for &(t, dk, dv) in &[(1, 128, 128), (7, 64, 32), (5, 17, 33), (3, 128, 100)] {
            let mut v = |n: usize, sc: f32| -> Vec<f32> { (0..n).map(|_| (rng.f() * 2.0 - 1.0) * sc).collect() };
            let (q, k, vv) = (v(t * dk, 0.3), v(t * dk, 0.3), v(t * dv, 1.0));
            let g: Vec<f32> = v(t * dk, 1.0).iter().map(|x| -x.abs()).collect();
            let beta: Vec<f32> = v(t, 1.0).iter().map(|x| 0.5 + 0.4 * x).collect();
            let s0 = v(dk * dv, 0.5);
            let per_token = |s: usize, _c: usize| g[s * dk].exp();
            let per_channel = |s: usize, c: usize| g[s * dk + c].exp();
            for (name, decay) in [("per token", &per_token as &dyn Fn(usize, usize) -> f32), ("per channel", &per_channel)] {
                let (mut sa, mut sb) = (s0.clone(), s0.clone());
                let (mut oa, mut ob) = (vec![0f32; t * dv], vec![0f32; t * dv]);
                recurrence(&q, &k, &vv, &beta, t, dk, dv, &mut sa, &mut oa, decay);
                recurrence_scalar(&q, &k, &vv, &beta, t, dk, dv, &mut sb, &mut ob, decay);
                let same = |a: &[f32], b: &[f32]| a.iter().zip(b).position(|(x, y)| x.to_bits() != y.to_bits());
                assert_eq!(same(&oa, &ob), None, "t {t} dk {dk} dv {dv} {name}: outputs differ from the scalar twin");
                assert_eq!(same(&sa, &sb), None, "t {t} dk {dk} dv {dv} {name}: states differ from the scalar twin");
                assert!(oa.iter().any(|x| *x != 0.0), "outputs all zero");
            }
        }
    }

    /// The dispatched chunked forms (AVX-512 builds) equal their scalar twins bit for bit.
    #[test]
    fn chunked_simd_matches_scalar() {
        let mut rng = Rng(0x5EED_0000_0000_0C4C);
        for &(t, dk, dv) in &[(150, 64, 48), (70, 17, 33), (64, 128, 128)] {
            let mut v = |n: usize, sc: f32| -> Vec<f32> { (0..n).map(|_| (rng.f() * 2.0 - 1.0) * sc).collect() };
            let (q, k, vv) = (v(t * dk, 0.2), v(t * dk, 0.2), v(t * dv, 1.0));
            let gk: Vec<f32> = v(t * dk, 0.3).iter().map(|x| -x.abs()).collect();
            let g: Vec<f32> = gk[..t].to_vec();
            let beta: Vec<f32> = v(t, 1.0).iter().map(|x| 0.5 + 0.4 * x).collect();
            let s0 = v(dk * dv, 0.5);
            let same = |a: &[f32], b: &[f32]| a.iter().zip(b).position(|(x, y)| x.to_bits() != y.to_bits());
            let (mut sa, mut sb) = (s0.clone(), s0.clone());
            let (mut oa, mut ob) = (vec![0f32; t * dv], vec![0f32; t * dv]);
            gated_delta_chunked(&q, &k, &vv, &g, &beta, t, dk, dv, CHUNK, &mut sa, &mut oa);
            gated_delta_chunked_scalar(&q, &k, &vv, &g, &beta, t, dk, dv, CHUNK, &mut sb, &mut ob);
            assert_eq!((same(&oa, &ob), same(&sa, &sb)), (None, None), "GDN t {t} dk {dk} dv {dv}");
            let (mut sa, mut sb) = (s0.clone(), s0.clone());
            kda_chunked(&q, &k, &vv, &gk, &beta, t, dk, dv, CHUNK, &mut sa, &mut oa);
            kda_chunked_scalar(&q, &k, &vv, &gk, &beta, t, dk, dv, CHUNK, &mut sb, &mut ob);
            assert_eq!((same(&oa, &ob), same(&sa, &sb)), (None, None), "KDA t {t} dk {dk} dv {dv}");
        }
    }

    /// Chunked == recurrence on random heads: 1-4 chunks, odd lengths, a non-zero initial
    /// state, weak and strong decay. Also the f64 recurrence as the common reference.
    #[test]
    fn chunked_matches_recurrence() {
        let mut rng = Rng(0x0DE1_7A00_1234_5678);
        for &(t, dk, dv, chunk, gscale) in &[
            (1, 8, 8, 64, 0.1),
            (63, 16, 8, 64, 0.5),
            (64, 16, 16, 64, 0.05),
            (129, 32, 16, 64, 1.0),
            (200, 16, 24, 64, 3.0),
            (77, 8, 8, 16, 0.3),
        ] {
            let (q, k) = normed_qk(&mut rng, t, dk);
            let v: Vec<f32> = (0..t * dv).map(|_| rng.f() * 2.0 - 1.0).collect();
            let g: Vec<f32> = (0..t).map(|_| -gscale * rng.f()).collect();
            let beta: Vec<f32> = (0..t).map(|_| 0.05 + 0.9 * rng.f()).collect();
            let s0: Vec<f32> = (0..dk * dv).map(|_| rng.f() - 0.5).collect();
            let (mut sr, mut sc) = (s0.clone(), s0.clone());
            let (mut or, mut oc) = (vec![0f32; t * dv], vec![0f32; t * dv]);
            gated_delta_recurrent(&q, &k, &v, &g, &beta, t, dk, dv, &mut sr, &mut or);
            gated_delta_chunked(&q, &k, &v, &g, &beta, t, dk, dv, chunk, &mut sc, &mut oc);
            let (dout, dst) = (rel_to_max(&or, &oc), rel_to_max(&sr, &sc));
            println!("t {t} dk {dk} dv {dv} chunk {chunk} decay {gscale}: out rel {dout:.2e}, state rel {dst:.2e}");
            assert!(dout <= 1e-5 && dst <= 1e-5, "chunked vs recurrent: out {dout:e}, state {dst:e} (relative to max)");
        }
    }

    /// KDA's chunked form equals its recurrence: 1-4 chunks, odd lengths, channel decays from
    /// weak to strong, a non-zero initial state.
    #[test]
    fn kda_chunked_matches_recurrence() {
        let mut rng = Rng(0x4B44_4100_0000_0777);
        for &(t, dk, dv, chunk, gscale) in
            &[(1, 8, 8, 64, 0.1), (63, 16, 8, 64, 0.5), (129, 16, 16, 64, 1.0), (200, 8, 24, 64, 3.0), (77, 8, 8, 16, 0.3)]
        {
            let (q, k) = normed_qk(&mut rng, t, dk);
            let v: Vec<f32> = (0..t * dv).map(|_| rng.f() * 2.0 - 1.0).collect();
            let g: Vec<f32> = (0..t * dk).map(|_| -gscale * rng.f()).collect();
            let beta: Vec<f32> = (0..t).map(|_| 0.05 + 0.9 * rng.f()).collect();
            let s0: Vec<f32> = (0..dk * dv).map(|_| rng.f() - 0.5).collect();
            let (mut sr, mut sc) = (s0.clone(), s0.clone());
            let (mut or, mut oc) = (vec![0f32; t * dv], vec![0f32; t * dv]);
            kda_recurrent(&q, &k, &v, &g, &beta, t, dk, dv, &mut sr, &mut or);
            kda_chunked(&q, &k, &v, &g, &beta, t, dk, dv, chunk, &mut sc, &mut oc);
            let (dout, dst) = (rel_to_max(&or, &oc), rel_to_max(&sr, &sc));
            println!("kda t {t} dk {dk} dv {dv} chunk {chunk} decay {gscale}: out rel {dout:.2e}, state rel {dst:.2e}");
            assert!(dout <= 1e-5 && dst <= 1e-5, "kda chunked vs recurrent: out {dout:e}, state {dst:e}");
        }
    }

    /// KDA with the same decay on every channel is the gated delta rule.
    #[test]
    fn kda_with_uniform_decay_is_gdn() {
        let mut rng = Rng(0x4B44_4100_0000_0001);
        let (t, dk, dv) = (50, 8, 6);
        let q: Vec<f32> = (0..t * dk).map(|_| (rng.f() - 0.5) * 0.3).collect();
        let k: Vec<f32> = (0..t * dk).map(|_| (rng.f() - 0.5) * 0.5).collect();
        let v: Vec<f32> = (0..t * dv).map(|_| rng.f() - 0.5).collect();
        let g: Vec<f32> = (0..t).map(|_| -0.3 * rng.f()).collect();
        let gc: Vec<f32> = g.iter().flat_map(|&x| std::iter::repeat_n(x, dk)).collect();
        let beta: Vec<f32> = (0..t).map(|_| rng.f()).collect();
        let (mut s1, mut s2) = (vec![0f32; dk * dv], vec![0f32; dk * dv]);
        let (mut o1, mut o2) = (vec![0f32; t * dv], vec![0f32; t * dv]);
        gated_delta_recurrent(&q, &k, &v, &g, &beta, t, dk, dv, &mut s1, &mut o1);
        kda_recurrent(&q, &k, &v, &gc, &beta, t, dk, dv, &mut s2, &mut o2);
        assert_eq!(o1, o2);
        assert_eq!(s1, s2);
    }

    /// Splitting a sequence at any point (state carried over) equals one pass: what prefill in
    /// several calls and decode after prefill rely on.
    #[test]
    fn state_carries_across_calls() {
        let mut rng = Rng(0x5EED_0000_0000_0042);
        let (t, dk, dv) = (90, 16, 16);
        let q: Vec<f32> = (0..t * dk).map(|_| (rng.f() - 0.5) * 0.25).collect();
        let k: Vec<f32> = (0..t * dk).map(|_| (rng.f() - 0.5) * 0.5).collect();
        let v: Vec<f32> = (0..t * dv).map(|_| rng.f() - 0.5).collect();
        let g: Vec<f32> = (0..t).map(|_| -0.2 * rng.f()).collect();
        let beta: Vec<f32> = (0..t).map(|_| rng.f()).collect();
        let mut s_all = vec![0f32; dk * dv];
        let mut o_all = vec![0f32; t * dv];
        gated_delta_chunked(&q, &k, &v, &g, &beta, t, dk, dv, CHUNK, &mut s_all, &mut o_all);
        let cut = 37;
        let mut s = vec![0f32; dk * dv];
        let mut o = vec![0f32; t * dv];
        gated_delta_chunked(
            &q[..cut * dk],
            &k[..cut * dk],
            &v[..cut * dv],
            &g[..cut],
            &beta[..cut],
            cut,
            dk,
            dv,
            CHUNK,
            &mut s,
            &mut o[..cut * dv],
        );
        gated_delta_recurrent(
            &q[cut * dk..],
            &k[cut * dk..],
            &v[cut * dv..],
            &g[cut..],
            &beta[cut..],
            t - cut,
            dk,
            dv,
            &mut s,
            &mut o[cut * dv..],
        );
        let (d, _) = cortiq_testkit::max_abs_diff(&o, &o_all);
        println!("split at {cut}: max out diff {d:.2e}");
        assert!(d <= 1e-5, "split run differs by {d}");
    }
}

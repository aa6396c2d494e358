//! The distillation loss per position, mean over positions:
//! `L = (1−λ)·CE(student, target) + λ·KL(teacher ‖ student)`, softmaxes in f64 whatever F is
//! (a 262k-token vocabulary in f32 loses the tail the KL is about).
//!
//! Accumulation contract: param grads +=, activations =.

use std::sync::Mutex;

use crate::float::Float;

/// Loss of one batch (means over positions).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossOut {
    pub loss: f64,
    pub ce: f64,
    pub kl: f64,
}

/// log-softmax of one row in f64: (max, log Σ exp(x − max)).
fn log_norm<F: Float>(row: &[F]) -> (f64, f64) {
    let mx = row.iter().fold(f64::NEG_INFINITY, |m, x| m.max(x.to_f64()));
    let z: f64 = row.iter().map(|x| (x.to_f64() - mx).exp()).sum();
    (mx, z.ln())
}

#[track_caller]
fn check<F>(op: &str, student: &[F], teacher: &[F], targets: &[u32], vocab: usize, lambda: f64) -> usize {
    assert!(vocab > 0 && student.len().is_multiple_of(vocab), "{op}: student logits must be [N, {vocab}]");
    let n = student.len() / vocab;
    assert!(teacher.len() == student.len() && targets.len() == n, "{op}: teacher must be [{n}, {vocab}], targets [{n}]");
    assert!(targets.iter().all(|&t| (t as usize) < vocab), "{op}: a target is outside the vocabulary of {vocab}");
    assert!((0.0..=1.0).contains(&lambda), "{op}: KL weight {lambda} is outside [0, 1]");
    n
}

/// Forward: student, teacher logits `[N, V]`, targets `[N]`.
/// fwd: L = (1/N)·Σ_t [(1−λ)·(−log p_S[t, y_t]) + λ·Σ_v p_T·(log p_T − log p_S)]
pub fn distill_loss_forward<F: Float>(student: &[F], teacher: &[F], targets: &[u32], vocab: usize, lambda: f64) -> LossOut {
    let n = check("distill_loss_forward", student, teacher, targets, vocab, lambda);
    let (mut ce, mut kl) = (0.0, 0.0);
    for t in 0..n {
        let (sr, tr) = (&student[t * vocab..][..vocab], &teacher[t * vocab..][..vocab]);
        let ((sm, sz), (tm, tz)) = (log_norm(sr), log_norm(tr));
        ce -= sr[targets[t] as usize].to_f64() - sm - sz;
        for (s, tv) in sr.iter().zip(tr) {
            let lt = tv.to_f64() - tm - tz;
            let ls = s.to_f64() - sm - sz;
            kl += lt.exp() * (lt - ls);
        }
    }
    let nf = n.max(1) as f64;
    let (ce, kl) = (ce / nf, kl / nf);
    LossOut { loss: (1.0 - lambda) * ce + lambda * kl, ce, kl }
}

/// Backward, scaled by `dloss` (1 for the loss itself).
/// fwd: L as above  =>  dz\[t,v\] += dloss/N·[(1−λ)·(p_S − onehot(y_t)) + λ·(p_S − p_T)]
pub fn distill_loss_backward<F: Float>(
    student: &[F],
    teacher: &[F],
    targets: &[u32],
    vocab: usize,
    lambda: f64,
    dloss: f64,
    dlogits: &mut [F],
) {
    let n = check("distill_loss_backward", student, teacher, targets, vocab, lambda);
    assert_eq!(dlogits.len(), student.len(), "distill_loss_backward: dlogits must be [N, V]");
    let f = dloss / n.max(1) as f64;
    for t in 0..n {
        let (sr, tr) = (&student[t * vocab..][..vocab], &teacher[t * vocab..][..vocab]);
        let ((sm, sz), (tm, tz)) = (log_norm(sr), log_norm(tr));
        let dr = &mut dlogits[t * vocab..][..vocab];
        for (v, (d, (s, tv))) in dr.iter_mut().zip(sr.iter().zip(tr)).enumerate() {
            let ps = (s.to_f64() - sm - sz).exp();
            let pt = (tv.to_f64() - tm - tz).exp();
            let hot = if v == targets[t] as usize { 1.0 } else { 0.0 };
            *d += F::from_f64(f * ((1.0 - lambda) * (ps - hot) + lambda * (ps - pt)));
        }
    }
}

/// One position's loss terms and (optionally) gradient, two exps per logit: es, et get the
/// shifted exponentials of the student and teacher rows. Returns (CE, KL) of the row; writes
/// dz = scale·[(1−λ)(p_S − onehot) + λ(p_S − p_T)].
#[allow(clippy::too_many_arguments)]
fn row_loss<F: Float>(
    zs: &[F],
    zt: &[F],
    y: usize,
    lambda: f64,
    scale: f64,
    dz: Option<&mut [F]>,
    es: &mut [f64],
    et: &mut [f64],
) -> (f64, f64) {
    let ms = zs.iter().fold(f64::NEG_INFINITY, |m, x| m.max(x.to_f64()));
    let mt = zt.iter().fold(f64::NEG_INFINITY, |m, x| m.max(x.to_f64()));
    let (mut zsum, mut tsum) = (0.0, 0.0);
    for ((e, f), (a, b)) in es.iter_mut().zip(et.iter_mut()).zip(zs.iter().zip(zt)) {
        *e = (a.to_f64() - ms).exp();
        *f = (b.to_f64() - mt).exp();
        zsum += *e;
        tsum += *f;
    }
    let (ls0, lt0) = (ms + zsum.ln(), mt + tsum.ln()); // log-normalizers
    let ce = ls0 - zs[y].to_f64();
    let (is, it) = (1.0 / zsum, 1.0 / tsum);
    let mut kl = 0.0;
    for (&f, (a, b)) in et.iter().zip(zs.iter().zip(zt)) {
        let pt = f * it;
        if pt > 0.0 {
            kl += pt * ((b.to_f64() - lt0) - (a.to_f64() - ls0));
        }
    }
    if let Some(dz) = dz {
        for (v, (d, (&e, &f))) in dz.iter_mut().zip(es.iter().zip(et.iter())).enumerate() {
            let (ps, pt) = (e * is, f * it);
            let hot = if v == y { 1.0 } else { 0.0 };
            *d = F::from_f64(scale * ((1.0 - lambda) * (ps - hot) + lambda * (ps - pt)));
        }
    }
    (ce, kl)
}

/// Logits per chunk of the fused LM head + loss (rows = LM_LOGITS / V, at least 8): 32 MB of
/// f32, against 1 GB for a whole 1024-token window of Gemma 3's 262,144-token vocabulary.
pub const LM_LOGITS: usize = 1 << 23;

thread_local! {
    /// Per-thread exp buffers of `row_loss` (2·V f64; allocated once per thread).
    static SCRATCH: std::cell::RefCell<Vec<f64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The LM head fused with the distillation loss, chunked over positions so the student's
/// [T, V] logits and their gradient never exist whole: per chunk, logits = h·Wᵀ, the loss rows
/// (f64 softmaxes, as [`distill_loss_forward`]), dlogits, and dh += dlogits·W. h: [T, d] (the
/// final norm's output), w: [V, d] (frozen: no dW), teacher: [T, V], targets: `[T]`.
/// fwd: z = h·Wᵀ, L = mean_t [(1−λ)·CE + λ·KL]
///   =>  dz = (1/N)·[(1−λ)(p_S − onehot) + λ(p_S − p_T)];  dh += dz·W
#[allow(clippy::too_many_arguments)]
pub fn lm_head_distill<F: Float>(
    h: &[F],
    w: &[F],
    teacher: &[F],
    targets: &[u32],
    vocab: usize,
    d: usize,
    lambda: f64,
    dh: Option<&mut [F]>,
) -> LossOut {
    let chunk = (LM_LOGITS / vocab.max(1)).max(8);
    lm_head_distill_chunked(h, w, teacher, targets, vocab, d, lambda, dh, chunk)
}

/// [`lm_head_distill`] with the rows per chunk given (tests cover several chunks on a small
/// vocabulary).
#[allow(clippy::too_many_arguments)]
pub fn lm_head_distill_chunked<F: Float>(
    h: &[F],
    w: &[F],
    teacher: &[F],
    targets: &[u32],
    vocab: usize,
    d: usize,
    lambda: f64,
    dh: Option<&mut [F]>,
    chunk: usize,
) -> LossOut {
    assert!(chunk > 0, "lm_head_distill: chunk of 0 rows");
    assert!(d > 0 && h.len().is_multiple_of(d), "lm_head_distill: h must be [T, {d}]");
    let t_len = h.len() / d;
    assert_eq!(w.len(), vocab * d, "lm_head_distill: W must be [{vocab}, {d}]");
    assert!(
        teacher.len() == t_len * vocab && targets.len() == t_len,
        "lm_head_distill: teacher must be [{t_len}, {vocab}], targets [{t_len}]"
    );
    let mut dh = dh;
    if let Some(g) = dh.as_deref() {
        assert_eq!(g.len(), h.len(), "lm_head_distill: dh must be [T, d]");
    }
    let (mut ce, mut kl) = (0.0, 0.0);
    let want_grad = dh.is_some();
    // Each chunk streams W once per thread, so chunks are as large as memory allows (SmolLM2's
    // 49k vocabulary: 170 rows; Gemma 3's 262k: 32).
    let mut z = vec![F::ZERO; chunk.min(t_len) * vocab]; // [chunk, V]
    let mut dz = vec![F::ZERO; if want_grad { z.len() } else { 0 }];
    let scale = 1.0 / t_len as f64; // the loss is a mean over all T rows
    for t0 in (0..t_len).step_by(chunk) {
        let t1 = (t0 + chunk).min(t_len);
        let n = t1 - t0;
        let zc = &mut z[..n * vocab];
        F::gemm_xwt(&h[t0 * d..t1 * d], w, zc, n, vocab, d); // [n, V]
        let zc = &*zc;
        // Rows in parallel (two f64 exps per logit). Each task owns its dz row and result slot
        // (uncontended locks: the safe way to hand disjoint outputs to the pool's tasks).
        let dz_rows: Vec<Mutex<&mut [F]>> =
            if want_grad { dz[..n * vocab].chunks_mut(vocab).map(Mutex::new).collect() } else { Vec::new() };
        let res: Vec<Mutex<(f64, f64)>> = (0..n).map(|_| Mutex::new((0.0, 0.0))).collect();
        crate::par::pool().run(n, |r| {
            SCRATCH.with(|sc| {
                let mut sc = sc.borrow_mut();
                sc.resize(2 * vocab, 0.0);
                let (es, et) = sc.split_at_mut(vocab);
                let zs = &zc[r * vocab..][..vocab];
                let zt = &teacher[(t0 + r) * vocab..][..vocab];
                let mut guard = dz_rows.get(r).map(|m| m.lock().unwrap_or_else(|p| p.into_inner()));
                let g = guard.as_deref_mut().map(|x| &mut **x);
                let out = row_loss(zs, zt, targets[t0 + r] as usize, lambda, scale, g, es, et);
                *res[r].lock().unwrap_or_else(|p| p.into_inner()) = out;
            })
        });
        drop(dz_rows);
        for m in res {
            let (c, k) = m.into_inner().unwrap_or_else(|p| p.into_inner());
            ce += c;
            kl += k;
        }
        if let Some(g) = dh.as_deref_mut() {
            F::gemm_acc_dyw(&dz[..n * vocab], w, &mut g[t0 * d..t1 * d], n, vocab, d); // dh += dz·W
        }
    }
    let nf = t_len.max(1) as f64;
    let (ce, kl) = (ce / nf, kl / nf);
    LossOut { loss: (1.0 - lambda) * ce + lambda * kl, ce, kl }
}

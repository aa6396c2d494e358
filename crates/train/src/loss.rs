//! The distillation loss per position, mean over positions:
//! `L = (1−λ)·CE(student, target) + λ·KL(teacher ‖ student)`, softmaxes in f64 whatever F is
//! (a 262k-token vocabulary in f32 loses the tail the KL is about).
//!
//! Accumulation contract: param grads +=, activations =.

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

/// Forward: student, teacher logits [N, V], targets [N].
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
/// fwd: L as above  =>  dz[t,v] += dloss/N·[(1−λ)·(p_S − onehot(y_t)) + λ·(p_S − p_T)]
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

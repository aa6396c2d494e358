//! Landmark segment means over the prompt and their scatter-back: m segments, segment i
//! covering prompt positions [i·tp/m, (i+1)·tp/m) (integer division, the split of the engine's
//! Nyström seal), landmark = mean of the rows of its segment, per head.
//!
//! Accumulation contract: param grads +=, activations =.

use crate::float::Float;

/// Segment [lo, hi) of landmark i of m over a prompt of tp tokens.
#[inline]
pub fn segment(i: usize, tp: usize, m: usize) -> (usize, usize) {
    (i * tp / m, (i + 1) * tp / m)
}

#[track_caller]
fn check<F>(op: &str, x: &[F], means: &[F], tp: usize, m: usize, n: usize, hd: usize) {
    let row = n * hd;
    assert!(row > 0 && x.len().is_multiple_of(row) && x.len() / row >= tp, "{op}: x must be [T ≥ {tp}, {n}, {hd}]");
    assert!(m >= 1 && m <= tp, "{op}: {m} segments over a prompt of {tp} (each needs a position)");
    assert_eq!(means.len(), n * m * hd, "{op}: means must be [{n}, {m}, {hd}]");
}

/// x [T, n, hd] (rows past tp ignored) -> means [n, m, hd] (head-major, written).
/// fwd: x̃\[g,i\] = Σ_{p∈seg i} x\[p,g\] / (hi − lo)
pub fn segment_means_forward<F: Float>(x: &[F], tp: usize, m: usize, n: usize, hd: usize, means: &mut [F]) {
    check("segment_means_forward", x, means, tp, m, n, hd);
    means.fill(F::ZERO);
    for i in 0..m {
        let (lo, hi) = segment(i, tp, m);
        for p in lo..hi {
            for g in 0..n {
                let (src, dst) = (&x[(p * n + g) * hd..][..hd], &mut means[(g * m + i) * hd..][..hd]);
                dst.iter_mut().zip(src).for_each(|(o, &s)| *o += s);
            }
        }
        let inv = F::ONE / F::from_f64((hi - lo) as f64);
        for g in 0..n {
            means[(g * m + i) * hd..][..hd].iter_mut().for_each(|o| *o *= inv);
        }
    }
}

/// Scatter-back.
/// fwd: x̃\[g,i\] = Σ_{p∈seg i} x\[p,g\] / (hi − lo)  =>  dx\[p,g\] += dx̃\[g,i\] / (hi − lo)
pub fn segment_means_backward<F: Float>(dmeans: &[F], tp: usize, m: usize, n: usize, hd: usize, dx: &mut [F]) {
    check("segment_means_backward", dx, dmeans, tp, m, n, hd);
    for i in 0..m {
        let (lo, hi) = segment(i, tp, m);
        let inv = F::ONE / F::from_f64((hi - lo) as f64);
        for p in lo..hi {
            for g in 0..n {
                let (src, dst) = (&dmeans[(g * m + i) * hd..][..hd], &mut dx[(p * n + g) * hd..][..hd]);
                dst.iter_mut().zip(src).for_each(|(o, &s)| *o += s * inv);
            }
        }
    }
}

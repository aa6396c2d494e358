//! RMSNorm in both gain styles: `x̂·w` (Llama, Qwen) and `x̂·(1 + w)` (Gemma, Qwen3-Next as HF
//! stores them), x̂ = x / √(mean(x²) + eps). The sum of squares and the backward's row dot are
//! accumulated in f64 whatever F is, as the engine's forward does, so f32 training sees the same
//! norm as inference. Rows are independent: per-head q/k norms are this op over [T·n_heads, hd].
//!
//! Accumulation contract: param grads +=, activations =.

use crate::float::Float;

/// How the gain enters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormStyle {
    /// y = x̂·w
    Plain,
    /// y = x̂·(1 + w)
    OnePlus,
}

impl NormStyle {
    #[inline]
    fn gain<F: Float>(self, w: F) -> F {
        match self {
            NormStyle::Plain => w,
            NormStyle::OnePlus => F::ONE + w,
        }
    }
}

/// Forward over rows: x `[rows, d]`, w `[d]` -> y `[rows, d]` (written), rstd `[rows]` (written,
/// f64: 1/√(mean(x²) + eps), what the backward needs).
pub fn rmsnorm_forward<F: Float>(style: NormStyle, x: &[F], w: &[F], eps: f64, y: &mut [F], rstd: &mut [f64]) {
    let d = w.len();
    assert!(d > 0 && x.len() == y.len() && x.len() == rstd.len() * d, "rmsnorm_forward: x, y must be [rows, {d}], rstd [rows]");
    for ((xr, yr), r) in x.chunks_exact(d).zip(y.chunks_exact_mut(d)).zip(rstd.iter_mut()) {
        let ss: f64 = xr.iter().map(|&v| v.to_f64() * v.to_f64()).sum();
        *r = 1.0 / (ss / d as f64 + eps).sqrt();
        let rf = F::from_f64(*r);
        for ((yv, &xv), &wv) in yr.iter_mut().zip(xr).zip(w) {
            *yv = xv * rf * style.gain(wv);
        }
    }
}

/// Backward.
/// fwd: y = x̂·g, x̂ = x·r, r = (Σx²/d + eps)^(−1/2), g = w or 1 + w
///   =>  dw += dy·x̂ (both styles: dg/dw = 1);  dx̂ = dy·g;
///       dx += r·(dx̂ − x̂·(Σ_j dx̂_j·x̂_j)/d)
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm_backward<F: Float>(
    style: NormStyle,
    x: &[F],
    w: &[F],
    rstd: &[f64],
    dy: &[F],
    mut dx: Option<&mut [F]>,
    mut dw: Option<&mut [F]>,
) {
    let d = w.len();
    assert!(
        d > 0 && x.len() == dy.len() && x.len() == rstd.len() * d,
        "rmsnorm_backward: x, dy must be [rows, {d}], rstd [rows]"
    );
    if let Some(dx) = dx.as_deref() {
        assert_eq!(dx.len(), x.len(), "rmsnorm_backward: dx is not [rows, d]");
    }
    if let Some(dw) = dw.as_deref() {
        assert_eq!(dw.len(), d, "rmsnorm_backward: dw is not [d]");
    }
    for (row, ((xr, dyr), &r)) in x.chunks_exact(d).zip(dy.chunks_exact(d)).zip(rstd).enumerate() {
        if let Some(dw) = dw.as_deref_mut() {
            let rf = F::from_f64(r);
            for ((g, &xv), &dyv) in dw.iter_mut().zip(xr).zip(dyr) {
                *g += dyv * xv * rf;
            }
        }
        if let Some(dx) = dx.as_deref_mut() {
            // Σ_j dx̂_j·x̂_j in f64 (the same cancellation the forward's Σx² guards against).
            let dot: f64 = (0..d).map(|j| dyr[j].to_f64() * style.gain(w[j]).to_f64() * xr[j].to_f64() * r).sum();
            let k = dot / d as f64;
            let dxr = &mut dx[row * d..][..d];
            for j in 0..d {
                let xhat = xr[j].to_f64() * r;
                let dxhat = dyr[j].to_f64() * style.gain(w[j]).to_f64();
                dxr[j] += F::from_f64(r * (dxhat - xhat * k));
            }
        }
    }
}

//! vmf_phase beside an exact window (issue 16, the next option of the operator): a converted
//! layer keeps softmax attention over its sinks and the last W positions (the layer's own
//! W_q/W_k/W_v, RoPE) and the vmf_phase core stands for every key that has left the window, as
//! one more slot of the same softmax. Per query head h at position t, with N_t the near keys of
//! sink+window's schedule (`farfield::window_exits`) and s_tj = scale·q_t·k_j:
//! ```text
//! o_t = (Σ_{j∈N_t} e^{s_tj} v_j + e^{b_t} f_t) / (Σ_{j∈N_t} e^{s_tj} + e^{b_t})
//! ```
//! f_t [hd] is the core's output for the head (its state written with each key as it leaves
//! the window: the core run over inputs shifted by W) and b_t its slot logit (an affine map of
//! the layer input, per head). The denominator is positive whatever the sign of the cos kernel
//! inside the core, which is why the far part enters as a slot and not as kernel mass in the
//! normaliser (LoLCATs' form needs positive features). Teacher-forced stage 1 needs ∂f and ∂b;
//! stage 2 also ∂q, ∂k, ∂v, which are the near keys' softmax backward against the whole
//! normaliser (`farfield::near_backward`), the slot being one more key with score b and value f.
//!
//! Accumulation contract: param grads +=, activations =.

use crate::farfield::{FarShape, near_backward, near_rows, window_exits};
use crate::float::Float;

/// o [T, n_heads, hd] and each row's log-normaliser lse [T, n_heads] (written) from q
/// [T, n_heads, hd], k and v [T, n_kv, hd], the core's output f [T, n_heads, hd] and the slot
/// logits b [T, n_heads]. `s.rank` is not used.
#[allow(clippy::too_many_arguments)]
pub fn slot_forward<F: Float>(s: &FarShape, q: &[F], k: &[F], v: &[F], f: &[F], b: &[F], o: &mut [F], lse: &mut [f64]) {
    let (nh, hd) = (s.n_heads, s.hd);
    assert!(f.len() == q.len() && o.len() == q.len() && b.len() == s.t * nh && lse.len() == s.t * nh, "slot: shapes");
    let near = near_rows(s, window_exits(s), 0, q, k, v);
    for r in 0..s.t * nh {
        // Shift by m = max(c, b): both weights ≤ 1, the sum ≥ 1.
        let (c, bb) = (near.c[r], b[r]);
        let m = c.max(bb);
        let (wn, ws) = ((c - m).exp(), (bb - m).exp());
        let den = near.den[r] * wn + ws;
        let inv = F::ONE / den;
        let (num, fr) = (&near.num[r * hd..][..hd], &f[r * hd..][..hd]);
        o[r * hd..][..hd].iter_mut().zip(num).zip(fr).for_each(|((o, &n), &f)| *o = (n * wn + ws * f) * inv);
        lse[r] = m.to_f64() + den.to_f64().ln();
    }
}

/// Backward of [`slot_forward`] (its o and lse): dq, dk, dv, df, db += given ∂L/∂o.
/// fwd: o = (Σ_N e^{s_j} v_j + e^{b} f) / e^{ℓ}  =>  the near keys as softmax against ℓ;
///      p = e^{b − ℓ}: df = p·do, db = p·(do·f − do·o).
#[allow(clippy::too_many_arguments)]
pub fn slot_backward<F: Float>(
    s: &FarShape,
    q: &[F],
    k: &[F],
    v: &[F],
    f: &[F],
    b: &[F],
    o: &[F],
    lse: &[f64],
    d_o: &[F],
    dq: &mut [F],
    dk: &mut [F],
    dv: &mut [F],
    df: &mut [F],
    db: &mut [F],
) {
    let (nh, hd) = (s.n_heads, s.hd);
    assert!(df.len() == f.len() && db.len() == b.len() && d_o.len() == o.len(), "slot backward: shapes");
    near_backward(s, &window_exits(s), 0, q, k, v, o, lse, d_o, dq, dk, dv);
    for r in 0..s.t * nh {
        let p = F::from_f64((b[r].to_f64() - lse[r]).exp());
        let (dor, fr, or) = (&d_o[r * hd..][..hd], &f[r * hd..][..hd], &o[r * hd..][..hd]);
        let (mut dof, mut doo) = (F::ZERO, F::ZERO);
        for ((&g, &x), &y) in dor.iter().zip(fr).zip(or) {
            dof += g * x;
            doo += g * y;
        }
        df[r * hd..][..hd].iter_mut().zip(dor).for_each(|(a, &g)| *a += p * g);
        db[r] += p * (dof - doo);
    }
}

/// The core's inputs as it sees them beside the window: row t carries the key that leaves the
/// window at t (position j = t − W, when j ≥ the sinks), zeros (κ = 0) where none leaves. The
/// core run over these rows has written key j from t = j + W on, decayed λ^{t − j − W}: what
/// the engine's state holds when it writes each key as the ring evicts it. `x` [T, n·width]
/// (φk: width F, κ: 1, v: dv; n states).
pub fn shift_in<F: Float>(x: &[F], t: usize, width: usize, sinks: usize, window: usize) -> Vec<F> {
    assert!(x.len().is_multiple_of(t.max(1)), "shift_in: rows");
    let row = x.len() / t.max(1);
    assert!(row.is_multiple_of(width), "shift_in: row width");
    let mut out = vec![F::ZERO; x.len()];
    for r in window..t {
        let j = r - window;
        if j >= sinks {
            out[r * row..][..row].copy_from_slice(&x[j * row..][..row]);
        }
    }
    out
}

/// Backward of [`shift_in`]: dx[j] += dy[j + W] for every key j ≥ the sinks that leaves.
pub fn shift_in_backward<F: Float>(dy: &[F], t: usize, sinks: usize, window: usize, dx: &mut [F]) {
    let row = dy.len() / t.max(1);
    for r in window..t {
        let j = r - window;
        if j >= sinks {
            dx[j * row..][..row].iter_mut().zip(&dy[r * row..][..row]).for_each(|(a, &b)| *a += b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::Rng;
    use crate::vmf::{CoreCheckpoints, CoreShape, core_forward};

    /// The core over shifted rows is the far sum of the definition: f_t = Σ over keys
    /// S ≤ j ≤ t − W of κ_j λ^{t − j − W} (φq_t·φk_j) v_j (here in f64, to rounding).
    #[test]
    fn shifted_core_is_the_far_sum() {
        let (t, ns, g, f, dv, sinks, w) = (20, 2, 2, 6, 3, 2, 5);
        let nh = ns * g;
        let mut rng = Rng(77);
        let phq = rng.vec(t * nh * f, 1.0);
        let phk = rng.vec(t * ns * f, 1.0);
        let kappa: Vec<f64> = (0..t * ns).map(|_| rng.uniform()).collect();
        let v = rng.vec(t * ns * dv, 1.0);
        let a_log: Vec<f64> = (0..ns * f).map(|_| -2.0 + 2.0 * rng.uniform()).collect();
        let sh = CoreShape { n_heads: nh, n_states: ns, f, dv };
        let mut o = vec![0.0; t * nh * dv];
        core_forward(
            &sh,
            &phq,
            &shift_in(&phk, t, f, sinks, w),
            &shift_in(&kappa, t, 1, sinks, w),
            &shift_in(&v, t, dv, sinks, w),
            &a_log,
            &mut o,
            &mut CoreCheckpoints::default(),
        );
        let mut worst = 0f64;
        for tt in 0..t {
            for h in 0..nh {
                let s = h / g;
                for e in 0..dv {
                    let mut want = 0.0;
                    for j in sinks..(tt + 1).saturating_sub(w) {
                        let k: f64 = (0..f)
                            .map(|fi| {
                                let lam = (-(a_log[s * f + fi]).exp()).exp();
                                phq[(tt * nh + h) * f + fi] * lam.powi((tt - j - w) as i32) * phk[(j * ns + s) * f + fi]
                            })
                            .sum();
                        want += kappa[j * ns + s] * k * v[(j * ns + s) * dv + e];
                    }
                    worst = worst.max((o[(tt * nh + h) * dv + e] - want).abs());
                }
            }
        }
        assert!(worst < 1e-12, "shifted core vs the far sum: {worst:e}");
        // Nothing reaches the core before the first key leaves (t = S + W).
        assert!(o[..(sinks + w) * nh * dv].iter().all(|&x| x == 0.0));
    }

    /// shift_in_backward is shift_in's adjoint: ⟨shift_in(x), y⟩ = ⟨x, shift_in_backward(y)⟩.
    #[test]
    fn shift_backward_is_the_adjoint() {
        let (t, width, sinks, w) = (11, 3, 1, 4);
        let mut rng = Rng(5);
        let x = rng.vec(t * 2 * width, 1.0);
        let y = rng.vec(x.len(), 1.0);
        let sx = shift_in(&x, t, width, sinks, w);
        let mut dx = vec![0.0; x.len()];
        shift_in_backward(&y, t, sinks, w, &mut dx);
        let a: f64 = sx.iter().zip(&y).map(|(a, b)| a * b).sum();
        let b: f64 = x.iter().zip(&dx).map(|(a, b)| a * b).sum();
        assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    }
}

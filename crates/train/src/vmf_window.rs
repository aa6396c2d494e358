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

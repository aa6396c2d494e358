//! Activations (SiLU, GELU-tanh) and the gated FFN `y = down(act(gate·x) ⊙ up·x)` of every
//! architecture the engine serves (SwiGLU for Llama/Qwen, GeGLU-tanh for Gemma).
//!
//! Accumulation contract: param grads +=, activations =.

use crate::float::Float;
use crate::matmul::{linear_backward, linear_forward};

/// The FFN's activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    /// x·σ(x)
    Silu,
    /// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), PyTorch's approximate="tanh".
    GeluTanh,
}

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const GELU_C: f64 = 0.044715;

impl Act {
    /// (act(x), act'(x)).
    #[inline]
    pub fn value_and_slope<F: Float>(self, x: F) -> (F, F) {
        match self {
            Act::Silu => {
                // fwd: y = x·σ(x)  =>  dy/dx = σ(x)·(1 + x·(1 − σ(x)))
                let s = F::ONE / (F::ONE + (-x).exp());
                (x * s, s * (F::ONE + x * (F::ONE - s)))
            }
            Act::GeluTanh => {
                // fwd: y = ½x(1 + tanh u), u = c(x + a·x³)
                //   =>  dy/dx = ½(1 + tanh u) + ½x(1 − tanh² u)·c(1 + 3a·x²)
                let (c, a, half) = (F::from_f64(SQRT_2_OVER_PI), F::from_f64(GELU_C), F::from_f64(0.5));
                let th = (c * (x + a * x * x * x)).tanh();
                let y = half * x * (F::ONE + th);
                let dy = half * (F::ONE + th) + half * x * (F::ONE - th * th) * c * (F::ONE + F::from_f64(3.0) * a * x * x);
                (y, dy)
            }
        }
    }
}

/// y = act(x), elementwise (written).
pub fn act_forward<F: Float>(act: Act, x: &[F], y: &mut [F]) {
    assert_eq!(x.len(), y.len(), "act_forward: x and y differ in length");
    for (yv, &xv) in y.iter_mut().zip(x) {
        *yv = act.value_and_slope(xv).0;
    }
}

/// fwd: y = act(x)  =>  dx += dy·act'(x)
pub fn act_backward<F: Float>(act: Act, x: &[F], dy: &[F], dx: &mut [F]) {
    assert!(x.len() == dy.len() && x.len() == dx.len(), "act_backward: x, dy, dx differ in length");
    for ((d, &xv), &g) in dx.iter_mut().zip(x).zip(dy) {
        *d += g * act.value_and_slope(xv).1;
    }
}

/// h = act(gate) ⊙ up, elementwise (written). gate, up, h: [T, ff].
pub fn gated_forward<F: Float>(act: Act, gate: &[F], up: &[F], h: &mut [F]) {
    assert!(gate.len() == up.len() && gate.len() == h.len(), "gated_forward: gate, up, h differ in length");
    for ((hv, &g), &u) in h.iter_mut().zip(gate).zip(up) {
        *hv = act.value_and_slope(g).0 * u;
    }
}

/// fwd: h = act(g) ⊙ u  =>  dg += dh·u·act'(g); du += dh·act(g)
pub fn gated_backward<F: Float>(act: Act, gate: &[F], up: &[F], dh: &[F], dgate: &mut [F], dup: &mut [F]) {
    let n = gate.len();
    assert!(
        up.len() == n && dh.len() == n && dgate.len() == n && dup.len() == n,
        "gated_backward: gate, up, dh, dgate, dup differ in length"
    );
    for i in 0..n {
        let (a, s) = act.value_and_slope(gate[i]);
        dgate[i] += dh[i] * up[i] * s;
        dup[i] += dh[i] * a;
    }
}

/// FFN weights: gate, up [ff, d]; down [d, ff].
#[derive(Clone, Copy)]
pub struct FfnWeights<'a, F> {
    pub gate: &'a [F],
    pub up: &'a [F],
    pub down: &'a [F],
}

/// Gradients of the FFN weights (None: frozen).
pub struct FfnGrads<'a, F> {
    pub gate: Option<&'a mut [F]>,
    pub up: Option<&'a mut [F]>,
    pub down: Option<&'a mut [F]>,
}

/// What the FFN backward needs from its forward, each [T, ff].
#[derive(Debug, Clone, Default)]
pub struct FfnActs<F> {
    pub gate: Vec<F>,
    pub up: Vec<F>,
    pub h: Vec<F>,
}

/// Gated FFN forward: x [T, d] -> y [T, d] (written); fills `acts` (resized as needed).
#[allow(clippy::too_many_arguments)]
pub fn ffn_forward<F: Float>(
    act: Act,
    w: FfnWeights<'_, F>,
    x: &[F],
    acts: &mut FfnActs<F>,
    y: &mut [F],
    t: usize,
    d: usize,
    ff: usize,
) {
    for b in [&mut acts.gate, &mut acts.up, &mut acts.h] {
        b.clear();
        b.resize(t * ff, F::ZERO);
    }
    linear_forward(x, w.gate, &mut acts.gate, t, d, ff); // [T, ff]
    linear_forward(x, w.up, &mut acts.up, t, d, ff); // [T, ff]
    gated_forward(act, &acts.gate, &acts.up, &mut acts.h); // [T, ff]
    linear_forward(&acts.h, w.down, y, t, ff, d); // [T, d]
}

/// Gated FFN backward.
/// fwd: y = down(h), h = act(gate) ⊙ up, gate = x·W_gᵀ, up = x·W_uᵀ
///   =>  dh = dy·W_down, dW_down += dyᵀh; dgate, dup (gated_backward);
///       dx += dgate·W_g + dup·W_u; dW_g += dgateᵀx; dW_u += dupᵀx
#[allow(clippy::too_many_arguments)]
pub fn ffn_backward<F: Float>(
    act: Act,
    w: FfnWeights<'_, F>,
    x: &[F],
    acts: &FfnActs<F>,
    dy: &[F],
    dx: Option<&mut [F]>,
    grads: FfnGrads<'_, F>,
    t: usize,
    d: usize,
    ff: usize,
) {
    let mut dh = vec![F::ZERO; t * ff]; // [T, ff]
    linear_backward(dy, &acts.h, w.down, Some(&mut dh), grads.down, t, ff, d);
    let mut dgate = vec![F::ZERO; t * ff]; // [T, ff]
    let mut dup = vec![F::ZERO; t * ff]; // [T, ff]
    gated_backward(act, &acts.gate, &acts.up, &dh, &mut dgate, &mut dup);
    match dx {
        Some(dx) => {
            linear_backward(&dgate, x, w.gate, Some(&mut *dx), grads.gate, t, d, ff);
            linear_backward(&dup, x, w.up, Some(dx), grads.up, t, d, ff);
        }
        None => {
            linear_backward(&dgate, x, w.gate, None, grads.gate, t, d, ff);
            linear_backward(&dup, x, w.up, None, grads.up, t, d, ff);
        }
    }
}

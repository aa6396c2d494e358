//! AdamW (PyTorch's `torch.optim.AdamW` step, decoupled weight decay, bias-corrected moments) with
//! a linear-warmup + cosine learning-rate schedule and gradient clipping by global norm.
//! Only trainable tensors have master copies and moments (the trainer keeps them in f32).

use crate::float::Float;

/// Hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamW {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamW {
    fn default() -> Self {
        AdamW { lr: 1e-4, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 }
    }
}

/// Moments of one tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct AdamState<F> {
    pub m: Vec<F>,
    pub v: Vec<F>,
}

impl<F: Float> AdamState<F> {
    pub fn new(n: usize) -> Self {
        AdamState { m: vec![F::ZERO; n], v: vec![F::ZERO; n] }
    }
}

/// Learning rate of step `step` (0-based): linear warmup over `warmup` steps to `peak`, then a
/// cosine from `peak` down to `min_lr` at step `total` (held there after).
pub fn lr_schedule(step: u64, peak: f64, min_lr: f64, warmup: u64, total: u64) -> f64 {
    if step < warmup {
        return peak * (step + 1) as f64 / warmup as f64;
    }
    let span = total.saturating_sub(warmup).max(1);
    let p = ((step - warmup) as f64 / span as f64).min(1.0);
    min_lr + 0.5 * (peak - min_lr) * (1.0 + (std::f64::consts::PI * p).cos())
}

/// Global L2 norm over every gradient tensor (f64 accumulation) and the factor that clips it to
/// `max_norm` (1 when already inside, or when max_norm ≤ 0 disables clipping; torch's
/// clip_grad_norm_ uses max_norm / (norm + 1e-6)).
pub fn clip_factor<F: Float>(grads: &[&[F]], max_norm: f64) -> (f64, f64) {
    let ss: f64 = grads.iter().flat_map(|g| g.iter()).map(|x| x.to_f64() * x.to_f64()).sum();
    let norm = ss.sqrt();
    let f = if max_norm > 0.0 { (max_norm / (norm + 1e-6)).min(1.0) } else { 1.0 };
    (norm, f)
}

impl AdamW {
    /// One step on one tensor: `step` is 1-based (the bias corrections' t), `lr` this step's
    /// learning rate, the gradient multiplied by `grad_scale` (the clip factor) on the fly.
    /// fwd (torch): p ← p·(1 − lr·wd); m ← β1·m + (1−β1)·g; v ← β2·v + (1−β2)·g²;
    ///   p ← p − (lr/(1−β1^t))·m / (√v/√(1−β2^t) + eps)
    #[allow(clippy::too_many_arguments)]
    pub fn step<F: Float>(&self, step: u64, lr: f64, param: &mut [F], grad: &[F], grad_scale: f64, st: &mut AdamState<F>) {
        assert!(
            step >= 1 && param.len() == grad.len() && st.m.len() == param.len() && st.v.len() == param.len(),
            "AdamW::step: step must be ≥ 1 and param, grad, moments the same length"
        );
        let bc1 = 1.0 - self.beta1.powi(step.min(i32::MAX as u64) as i32);
        let bc2 = 1.0 - self.beta2.powi(step.min(i32::MAX as u64) as i32);
        let (decay, step_size, bc2_sqrt) = (1.0 - lr * self.weight_decay, lr / bc1, bc2.sqrt());
        let (b1, b2) = (F::from_f64(self.beta1), F::from_f64(self.beta2));
        let (one_b1, one_b2) = (F::from_f64(1.0 - self.beta1), F::from_f64(1.0 - self.beta2));
        for i in 0..param.len() {
            let g = grad[i] * F::from_f64(grad_scale);
            param[i] *= F::from_f64(decay);
            st.m[i] = b1 * st.m[i] + one_b1 * g;
            st.v[i] = b2 * st.v[i] + one_b2 * g * g;
            let denom = st.v[i].sqrt() / F::from_f64(bc2_sqrt) + F::from_f64(self.eps);
            param[i] -= F::from_f64(step_size) * st.m[i] / denom;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two steps worked out by hand from the update rule (β1 = 0.9, β2 = 0.99, eps = 1e-8,
    /// lr = 0.1, wd = 0.01; p = 1, g1 = 0.5, g2 = −0.25):
    /// step 1: p ← 1·(1 − 0.001) = 0.999; m = 0.05; v = 0.0025; m̂ = 0.5, v̂ = 0.25 → √ = 0.5;
    ///         p ← 0.999 − 0.1·0.5/(0.5 + 1e-8) ≈ 0.899
    /// step 2: p ← p·0.999; m = 0.045 − 0.025 = 0.02; v = 0.002475 + 0.000625 = 0.0031;
    ///         m̂ = 0.02/0.19, v̂ = 0.0031/0.0199; p ← p − 0.1·m̂/(√v̂ + 1e-8)
    #[test]
    fn adamw_two_steps_by_hand() {
        let opt = AdamW { lr: 0.1, beta1: 0.9, beta2: 0.99, eps: 1e-8, weight_decay: 0.01 };
        let mut p = vec![1.0f64];
        let mut st = AdamState::new(1);
        opt.step(1, 0.1, &mut p, &[0.5], 1.0, &mut st);
        let p1 = 0.999 - 0.1 * 0.5 / (0.5 + 1e-8);
        println!("adamw step 1: {} vs hand {p1} (diff {:.3e})", p[0], (p[0] - p1).abs());
        assert!((p[0] - p1).abs() < 1e-15, "step 1: {} vs {p1}", p[0]);
        assert!((st.m[0] - 0.05).abs() < 1e-16 && (st.v[0] - 0.0025).abs() < 1e-17);
        opt.step(2, 0.1, &mut p, &[-0.25], 1.0, &mut st);
        let mh = 0.02 / (1.0 - 0.81);
        let vh = 0.0031 / (1.0 - 0.9801);
        let p2 = p1 * 0.999 - 0.1 * mh / (vh.sqrt() + 1e-8);
        println!("adamw step 2: {} vs hand {p2} (diff {:.3e})", p[0], (p[0] - p2).abs());
        assert!((p[0] - p2).abs() < 1e-12, "step 2: {} vs {p2}", p[0]);
        // The clip factor scales the gradient before the moments.
        let mut q = vec![1.0f64];
        let mut sq = AdamState::new(1);
        opt.step(1, 0.1, &mut q, &[5.0], 0.1, &mut sq);
        assert!((sq.m[0] - 0.05).abs() < 1e-15, "grad_scale not applied: m = {}", sq.m[0]);
    }

    #[test]
    fn schedule_and_clip() {
        // warmup 10 to 1e-3, cosine to 1e-5 at step 110.
        let lr = |s| lr_schedule(s, 1e-3, 1e-5, 10, 110);
        assert!((lr(0) - 1e-4).abs() < 1e-18 && (lr(9) - 1e-3).abs() < 1e-18);
        assert!((lr(10) - 1e-3).abs() < 1e-18, "cosine starts at the peak");
        assert!((lr(60) - (1e-5 + 0.5 * (1e-3 - 1e-5))).abs() < 1e-15, "half way is the mean");
        assert!((lr(110) - 1e-5).abs() < 1e-18 && (lr(500) - 1e-5).abs() < 1e-18);
        let (a, b) = (vec![3.0f32, 0.0], vec![4.0f32]);
        let (norm, f) = clip_factor(&[&a, &b], 1.0);
        assert!((norm - 5.0).abs() < 1e-12 && (f - 1.0 / (5.0 + 1e-6)).abs() < 1e-12, "norm {norm}, factor {f}");
        assert_eq!(clip_factor(&[&a, &b], 10.0).1, 1.0);
        assert_eq!(clip_factor(&[&a, &b], 0.0).1, 1.0);
    }
}

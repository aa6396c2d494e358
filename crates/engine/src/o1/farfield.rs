//! The learned far field of the O(1) mode (`--o1-far linear`), streaming form: per KV head a
//! constant-size linear-attention state that absorbs every key leaving the sink+window cache,
//! read by each query under the exact part's softmax normalizer. The operator and its training
//! are `cortiq_train::farfield` (teacher-forced, gradchecked); this is the same sum kept as a
//! running state, with a running log-offset per feature instead of the training form's
//! per-sequence maximum (the two cancel exactly; crates/cli/tests/o1_far.rs holds them equal).
//!
//! A key k (post-RoPE) of KV head g leaving the window: b_f = W_g[f]·k − γk_g·|k|² + β_g[f],
//! H_g[f] += e^{b_f − off_f}·v, z_g[f] += e^{b_f − off_f} (off_f raised to b_f first when b_f is
//! larger, the state rescaled). A query q of head h: ε_f = U_h[f]·q − γq_h·|q|² + α_h[f] + off_f,
//! on the scores' scale: the step adds Σ_f e^{ε_f − c} H_g[f] to its numerator and Σ_f e^{ε_f − c}
//! z_g[f] to its denominator, c the row's shift. Hand-written: it is the mixer's hot path beside
//! the window scan (r·hd multiply-adds per head and step).
//!
//! Decay (`blk.N.attn_far_decay`, δ_g[f] ≥ 0; absent: none): a key of position j seen from t
//! weighs e^{b_f − δ_f·(t − j)}. The state keeps the position it stands at (`now`); a key joins
//! with b_f − δ_f·(now − j), and moving to a later t lowers every offset by δ_f·(t − now), which
//! decays H and z without touching them. The offsets are f64 so that the drift of a long decode
//! costs no precision (they are counted so in the state's bytes).

use std::sync::Arc;

/// The trained feature maps of one layer (the .cmf's `blk.N.attn_far_*` tensors, f32).
#[derive(Debug, Clone, PartialEq)]
pub struct FarWeights {
    pub rank: usize,
    pub n_heads: usize,
    pub n_kv: usize,
    pub hd: usize,
    /// [n_heads, rank, hd]
    pub u: Vec<f32>,
    /// [n_heads, rank]
    pub alpha: Vec<f32>,
    /// [n_heads]
    pub gq: Vec<f32>,
    /// [n_kv, rank, hd]
    pub w: Vec<f32>,
    /// [n_kv, rank]
    pub beta: Vec<f32>,
    /// [n_kv]
    pub gk: Vec<f32>,
    /// [n_kv, rank]: decay per position, δ ≥ 0 (all zero: none).
    pub decay: Vec<f32>,
}

/// The largest feature count a layer may have (a step keeps its logits on the stack).
pub const MAX_RANK: usize = 64;

/// The tensor suffixes under `blk.N.`, in `FarWeights` field order, with their shapes.
pub const TENSORS: [&str; 6] = ["attn_far_u", "attn_far_alpha", "attn_far_gq", "attn_far_w", "attn_far_beta", "attn_far_gk"];

/// The optional decay tensor [n_kv, rank] (files written before it have none: no decay).
pub const DECAY_TENSOR: &str = "attn_far_decay";

impl FarWeights {
    /// Every tensor's expected length, in `TENSORS` order.
    pub fn lens(rank: usize, n_heads: usize, n_kv: usize, hd: usize) -> [usize; 6] {
        [n_heads * rank * hd, n_heads * rank, n_heads, n_kv * rank * hd, n_kv * rank, n_kv]
    }

    /// From the six tensors in `TENSORS` order; None when a length disagrees.
    pub fn from_tensors(rank: usize, n_heads: usize, n_kv: usize, hd: usize, t: [Vec<f32>; 6]) -> Option<FarWeights> {
        if t.iter().zip(Self::lens(rank, n_heads, n_kv, hd)).any(|(v, n)| v.len() != n) || !(1..=MAX_RANK).contains(&rank) {
            return None;
        }
        let [u, alpha, gq, w, beta, gk] = t;
        Some(FarWeights { rank, n_heads, n_kv, hd, u, alpha, gq, w, beta, gk, decay: vec![0.0; n_kv * rank] })
    }

    /// With decay rates [n_kv, rank]; None when the length disagrees or a rate is negative or
    /// not finite.
    pub fn with_decay(mut self, decay: Vec<f32>) -> Option<FarWeights> {
        if decay.len() != self.n_kv * self.rank || !decay.iter().all(|d| d.is_finite() && *d >= 0.0) {
            return None;
        }
        self.decay = decay;
        Some(self)
    }

    /// Bytes of a sequence's state for this layer (H and z f32, the offsets f64).
    pub fn state_bytes(&self) -> usize {
        self.n_kv * self.rank * ((self.hd + 1) * 4 + 8)
    }
}

/// One layer's far state (all KV heads). Clone is the checkpoint.
#[derive(Debug, Clone)]
pub struct FarState {
    pub weights: Arc<FarWeights>,
    /// [n_kv, rank, hd]
    h: Vec<f32>,
    /// [n_kv, rank]
    z: Vec<f32>,
    /// [n_kv, rank] log-offsets at position `now` (−∞ while no key was absorbed).
    off: Vec<f64>,
    /// The position the state stands at (its decay applied up to it).
    now: usize,
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

impl FarState {
    pub fn new(weights: Arc<FarWeights>) -> FarState {
        let (r, nkv, hd) = (weights.rank, weights.n_kv, weights.hd);
        FarState { h: vec![0.0; nkv * r * hd], z: vec![0.0; nkv * r], off: vec![f64::NEG_INFINITY; nkv * r], now: 0, weights }
    }

    pub fn bytes(&self) -> usize {
        (self.h.len() + self.z.len()) * 4 + self.off.len() * 8
    }

    /// Moves the state to position t ≥ now (the query position about to read it): every
    /// feature's mass decays by e^{−δ·(t − now)}.
    pub fn advance(&mut self, t: usize) {
        debug_assert!(t >= self.now, "far state: positions only move on");
        if t <= self.now {
            return;
        }
        let dt = (t - self.now) as f64;
        for (o, &d) in self.off.iter_mut().zip(&self.weights.decay) {
            *o -= d as f64 * dt;
        }
        self.now = t;
    }

    /// Absorbs keys/values of position `pos` leaving the near set: k, v [n_kv, hd].
    pub fn absorb(&mut self, k: &[f32], v: &[f32], pos: usize) {
        let wt = &*self.weights;
        let (r, hd) = (wt.rank, wt.hd);
        let age = self.now as f64 - pos as f64;
        for g in 0..wt.n_kv {
            let (kr, vr) = (&k[g * hd..][..hd], &v[g * hd..][..hd]);
            let k2 = dot(kr, kr);
            for f in 0..r {
                let i = g * r + f;
                let b = dot(&wt.w[i * hd..][..hd], kr) - wt.gk[g] as f64 * k2 + wt.beta[i] as f64 - wt.decay[i] as f64 * age;
                let hf = &mut self.h[i * hd..][..hd];
                let mut off = self.off[i];
                if b > off {
                    let s = (off - b).exp();
                    hf.iter_mut().for_each(|x| *x = (*x as f64 * s) as f32);
                    self.z[i] = (self.z[i] as f64 * s) as f32;
                    self.off[i] = b;
                    off = b;
                }
                let e = (b - off).exp();
                hf.iter_mut().zip(vr).for_each(|(x, &y)| *x = (*x as f64 + e * y as f64) as f32);
                self.z[i] = (self.z[i] as f64 + e) as f32;
            }
        }
    }

    /// Query head h of KV head g: writes its far logits ε_f (on the scores' scale) into `eps`
    /// [rank] and returns their max (−∞ while the state is empty).
    pub fn logits(&self, h: usize, g: usize, q: &[f32], eps: &mut [f64]) -> f64 {
        let wt = &*self.weights;
        let (r, hd) = (wt.rank, wt.hd);
        let q2 = dot(q, q);
        let mut top = f64::NEG_INFINITY;
        for (f, e) in eps.iter_mut().enumerate().take(r) {
            let off = self.off[g * r + f];
            *e = if off == f64::NEG_INFINITY {
                f64::NEG_INFINITY
            } else {
                dot(&wt.u[(h * r + f) * hd..][..hd], q) - wt.gq[h] as f64 * q2 + wt.alpha[h * r + f] as f64 + off
            };
            top = top.max(*e);
        }
        top
    }

    /// Adds the far field of KV head g under shift c to a row's numerator `out` [hd] and returns
    /// its denominator part (`eps` from `logits`).
    pub fn apply(&self, g: usize, eps: &[f64], c: f64, out: &mut [f64]) -> f64 {
        let (r, hd) = (self.weights.rank, self.weights.hd);
        let mut den = 0.0;
        for (f, &ef) in eps.iter().enumerate().take(r) {
            if ef == f64::NEG_INFINITY {
                continue;
            }
            let e = (ef - c).exp();
            let i = g * r + f;
            den += e * self.z[i] as f64;
            out.iter_mut().zip(&self.h[i * hd..][..hd]).for_each(|(o, &x)| *o += e * x as f64);
        }
        den
    }
}

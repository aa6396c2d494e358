//! One decoder block of the student, assembled from this crate's ops: the dense layers of
//! Llama, Qwen2 (QKV bias), Qwen3 (QK-norm) and Gemma 3 (QK-norm, post-norms, sliding or global
//! layers), with the attention served exactly, by the Nyström operator, or by an eviction rule
//! with the learned far field (`farfield`, stage 2), or replaced whole by a converted layer's
//! vmf_phase mixer (`vmf`: its projections, core and out_proj trainable). Trainable: every RMSNorm gain and the FFN,
//! and the far field's feature maps; frozen: the q/k/v/o projections and their biases (the
//! polish contract). Layer checkpointing is the caller's: keep each block's input, and before the
//! block's backward run its forward again into a scratch [`BlockActs`] (the Nyström plan of the
//! first forward is passed back in, so M stays the one the loss saw).
//!
//! ```text
//! h1 = norm(x)                                    [T, d]
//! q, k, v = h1·Wqᵀ (+bq), h1·Wkᵀ (+bk), h1·Wvᵀ (+bv) [T, nh·hd], [T, nkv·hd] ×2
//! q, k = qk_norm(q, k) per head (optional); RoPE  [T, nh, hd], [T, nkv, hd]
//! o = mixer(q, k, v)                              [T, nh·hd]
//! a = o·Woᵀ; a = post_attn_norm(a) (optional)     [T, d]
//! x1 = x + a
//! f = ffn(ffn_norm(x1)); f = post_ffn_norm(f) (optional)
//! y = x1 + f
//! ```
//! Accumulation contract: param grads +=, activations =.

use crate::act::{Act, FfnActs, FfnGrads, FfnWeights, ffn_backward, ffn_forward};
use crate::attention::{AttnShape, attention_backward, attention_forward};
use crate::farfield::{FarParams, FarShape, far_mixer_backward, far_mixer_forward, window_exits};
use crate::float::Float;
use crate::matmul::{linear_backward, linear_forward};
use crate::norm::{NormStyle, rmsnorm_backward, rmsnorm_forward};
use crate::nystrom::{NyShape, NystromError, NystromPlan, O1Config, nystrom_backward, nystrom_forward, nystrom_plan};
use crate::rope::{RopeStyle, RopeTable, rope_backward, rope_forward};
use crate::vmf::{VmfActs, VmfShape, vmf_mixer_backward, vmf_mixer_forward};
use crate::vmf_window::{VmfLayer, WinActs, WinShape, win_mixer_backward, win_mixer_forward};

/// The block's attention.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BlockMixer {
    /// Exact causal attention (sliding when window is Some).
    Exact { window: Option<usize> },
    /// The Nyström O(1) operator; the first `tp` rows are the prompt.
    Nystrom { cfg: O1Config, tp: usize },
    /// An eviction rule and the learned far field ([`BlockWeights::far`]); the first `tp` rows
    /// are the prompt (exact). The rule: sink+window of `sinks` + `window`, or `schedule`'s
    /// exits computed from the block's own q, k, v at every forward (score eviction).
    Far { tp: usize, sinks: usize, window: usize, schedule: Option<Schedule> },
    /// A converted layer on the vmf_phase core ([`BlockWeights::vmf`]): the whole attention path
    /// (projections, core, out_proj) is the mixer's; wq/wk/wv/wo are unused.
    Vmf(VmfShape),
    /// A converted layer with the window option ([`BlockWeights::vmf`], `VmfLayer::Window`):
    /// exact softmax over its sinks and last positions, the core as one more slot; the whole
    /// attention path is the mixer's (its own W_q, W_k, W_v, W_o); wq/wk/wv/wo are unused.
    VmfWin(WinShape),
}

/// A key schedule computed from a block's own post-RoPE q [T, nh, hd], k, v [T, nkv, hd] (f32,
/// as the engine serves): each key's exit (`farfield::near_part_with`). The CLI gives score
/// eviction's, which lives in the engine.
#[derive(Clone, Copy)]
pub struct Schedule(pub ScheduleFn);

/// (shape, prompt length tp, q, k, v) -> exits [T].
pub type ScheduleFn = fn(&FarShape, usize, &[f32], &[f32], &[f32]) -> Vec<usize>;

impl std::fmt::Debug for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Schedule(fn)")
    }
}

impl PartialEq for Schedule {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::fn_addr_eq(self.0, other.0)
    }
}

/// Shapes and switches of one block.
#[derive(Debug, Clone, Copy)]
pub struct BlockConfig {
    pub d_model: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub d_ff: usize,
    pub norm_eps: f64,
    /// How every norm gain of the block enters (the engine folds Gemma's +1 at load: Plain).
    pub norm_style: NormStyle,
    pub act: Act,
    pub attn_scale: f64,
    pub rope_style: RopeStyle,
    pub mixer: BlockMixer,
}

/// The block's tensors. Biases, QK-norms and post-norms are present or not per architecture.
#[derive(Clone, Copy)]
pub struct BlockWeights<'a, F> {
    pub attn_norm: &'a [F],
    pub wq: &'a [F],
    pub wk: &'a [F],
    pub wv: &'a [F],
    pub bq: Option<&'a [F]>,
    pub bk: Option<&'a [F]>,
    pub bv: Option<&'a [F]>,
    pub q_norm: Option<&'a [F]>,
    pub k_norm: Option<&'a [F]>,
    pub wo: &'a [F],
    pub post_attn_norm: Option<&'a [F]>,
    pub ffn_norm: &'a [F],
    pub gate: &'a [F],
    pub up: &'a [F],
    pub down: &'a [F],
    pub post_ffn_norm: Option<&'a [F]>,
    /// The far field of a [`BlockMixer::Far`] block.
    pub far: Option<&'a FarParams<F>>,
    /// The parameters of a [`BlockMixer::Vmf`] or [`BlockMixer::VmfWin`] block.
    pub vmf: Option<&'a VmfLayer<F>>,
}

/// Gradients of the trainable tensors (None: not trained, or absent).
#[derive(Default)]
pub struct BlockGrads<'a, F> {
    pub attn_norm: Option<&'a mut [F]>,
    pub q_norm: Option<&'a mut [F]>,
    pub k_norm: Option<&'a mut [F]>,
    pub post_attn_norm: Option<&'a mut [F]>,
    pub ffn_norm: Option<&'a mut [F]>,
    pub gate: Option<&'a mut [F]>,
    pub up: Option<&'a mut [F]>,
    pub down: Option<&'a mut [F]>,
    pub post_ffn_norm: Option<&'a mut [F]>,
    pub far: Option<&'a mut FarParams<F>>,
    /// A vmf_phase block's parameter gradients (the layout of its parameters; a tensor left
    /// empty there is not trained).
    pub vmf: Option<&'a mut VmfLayer<F>>,
}

/// Everything the backward reads, written by the forward (reused across layers and steps).
#[derive(Debug, Clone, Default)]
pub struct BlockActs<F> {
    h1: Vec<F>,
    rstd1: Vec<f64>,
    q_lin: Vec<F>,
    k_lin: Vec<F>,
    rstd_q: Vec<f64>,
    rstd_k: Vec<f64>,
    q_nrm: Vec<F>,
    k_nrm: Vec<F>,
    q: Vec<F>,
    k: Vec<F>,
    v: Vec<F>,
    o: Vec<F>,
    lse: Vec<f64>,
    a: Vec<F>,
    rstd_pa: Vec<f64>,
    x1: Vec<F>,
    h2: Vec<F>,
    rstd2: Vec<f64>,
    ffn: FfnActs<F>,
    f: Vec<F>,
    rstd_pf: Vec<f64>,
    /// Rows whose Nyström far field the guard dropped [T, nh].
    pub dropped: Vec<bool>,
    /// A far-field block's key exits [T] (the schedule of this forward).
    exits: Vec<usize>,
    /// A vmf_phase block's mixer activations (plain or windowed).
    vmf: VmfActs<F>,
    win: WinActs<F>,
}

fn zeros<F: Float>(v: &mut Vec<F>, n: usize) {
    v.clear();
    v.resize(n, F::ZERO);
}

fn add_bias<F: Float>(y: &mut [F], b: Option<&[F]>) {
    if let Some(b) = b {
        for row in y.chunks_exact_mut(b.len()) {
            row.iter_mut().zip(b).for_each(|(a, &c)| *a += c);
        }
    }
}

impl BlockConfig {
    fn attn_shape(&self, window: Option<usize>) -> AttnShape {
        AttnShape { n_heads: self.n_heads, n_kv_heads: self.n_kv_heads, head_dim: self.head_dim, scale: self.attn_scale, window }
    }
    fn ny_shape(&self, tp: usize) -> NyShape {
        NyShape { n_heads: self.n_heads, n_kv_heads: self.n_kv_heads, head_dim: self.head_dim, scale: self.attn_scale, tp }
    }
    fn far_shape<F>(&self, t: usize, p: &FarParams<F>, sinks: usize, window: usize) -> FarShape {
        let (n_heads, n_kv, hd) = (self.n_heads, self.n_kv_heads, self.head_dim);
        FarShape { t, n_heads, n_kv, hd, rank: p.alpha.len() / n_heads, sinks, window, scale: self.attn_scale }
    }
}

fn to_f32<F: Float>(x: &[F]) -> Vec<f32> {
    x.iter().map(|v| v.to_f64() as f32).collect()
}

/// Forward: x [T, d] -> y [T, d] (written), `acts` (written). `plan`: for a Nyström block,
/// None seals a new plan from this forward's q, k and stores it; Some reuses it (the recompute
/// of layer checkpointing, and the gradient check's frozen M).
#[allow(clippy::too_many_arguments)]
pub fn block_forward<F: Float>(
    cfg: &BlockConfig,
    w: &BlockWeights<'_, F>,
    rope: &RopeTable<F>,
    plan: &mut Option<NystromPlan>,
    x: &[F],
    y: &mut [F],
    acts: &mut BlockActs<F>,
) -> Result<(), NystromError> {
    let (d, nh, nkv, hd) = (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim);
    assert!(x.len().is_multiple_of(d) && y.len() == x.len(), "block_forward: x, y must be [T, {d}]");
    let t = x.len() / d;
    let (qd, kd) = (nh * hd, nkv * hd);
    let a = acts;
    zeros(&mut a.h1, t * d);
    a.rstd1.resize(t, 0.0);
    rmsnorm_forward(cfg.norm_style, x, w.attn_norm, cfg.norm_eps, &mut a.h1, &mut a.rstd1); // [T, d]
    if matches!(cfg.mixer, BlockMixer::Vmf(_) | BlockMixer::VmfWin(_)) {
        zeros(&mut a.a, t * d);
        match (cfg.mixer, w.vmf) {
            (BlockMixer::Vmf(sh), Some(VmfLayer::Plain(p))) => vmf_mixer_forward(&sh, p, &a.h1, &mut a.a, &mut a.vmf), // [T, d]
            (BlockMixer::VmfWin(sh), Some(VmfLayer::Window(p))) => win_mixer_forward(&sh, p, rope, &a.h1, &mut a.a, &mut a.win),
            _ => panic!("block_forward: a vmf_phase block needs its parameters, of its kind"),
        }
        a.dropped.clear();
        ffn_half(cfg, w, x, y, a, t);
        return Ok(());
    }
    zeros(&mut a.q_lin, t * qd);
    zeros(&mut a.k_lin, t * kd);
    zeros(&mut a.v, t * kd);
    linear_forward(&a.h1, w.wq, &mut a.q_lin, t, d, qd); // [T, nh·hd]
    linear_forward(&a.h1, w.wk, &mut a.k_lin, t, d, kd); // [T, nkv·hd]
    linear_forward(&a.h1, w.wv, &mut a.v, t, d, kd); // [T, nkv·hd]
    add_bias(&mut a.q_lin, w.bq);
    add_bias(&mut a.k_lin, w.bk);
    add_bias(&mut a.v, w.bv);
    // QK-norm: per-head RMSNorm over rows [T·n, hd].
    match (w.q_norm, w.k_norm) {
        (Some(qn), Some(kn)) => {
            zeros(&mut a.q_nrm, t * qd);
            zeros(&mut a.k_nrm, t * kd);
            a.rstd_q.resize(t * nh, 0.0);
            a.rstd_k.resize(t * nkv, 0.0);
            rmsnorm_forward(cfg.norm_style, &a.q_lin, qn, cfg.norm_eps, &mut a.q_nrm, &mut a.rstd_q); // [T, nh, hd]
            rmsnorm_forward(cfg.norm_style, &a.k_lin, kn, cfg.norm_eps, &mut a.k_nrm, &mut a.rstd_k); // [T, nkv, hd]
        }
        (None, None) => {
            a.q_nrm.clone_from(&a.q_lin);
            a.k_nrm.clone_from(&a.k_lin);
        }
        _ => panic!("block_forward: q_norm and k_norm come together"),
    }
    zeros(&mut a.q, t * qd);
    zeros(&mut a.k, t * kd);
    rope_forward(cfg.rope_style, rope, &a.q_nrm, &mut a.q, nh, hd); // [T, nh, hd]
    rope_forward(cfg.rope_style, rope, &a.k_nrm, &mut a.k, nkv, hd); // [T, nkv, hd]
    zeros(&mut a.o, t * qd);
    a.dropped.clear();
    a.dropped.resize(t * nh, false);
    match cfg.mixer {
        BlockMixer::Exact { window } => {
            a.lse.resize(t * nh, 0.0);
            attention_forward(&cfg.attn_shape(window), &a.q, &a.k, &a.v, &mut a.o, &mut a.lse); // [T, nh, hd]
        }
        BlockMixer::Nystrom { cfg: o1, tp } => {
            let sh = cfg.ny_shape(tp);
            if plan.is_none() {
                *plan = Some(nystrom_plan(&o1, &sh, &a.q, &a.k)?);
            }
            let p = plan.as_ref().expect("plan set above");
            nystrom_forward(&o1, p, &sh, &a.q, &a.k, &a.v, &mut a.o, &mut a.dropped); // [T, nh, hd]
        }
        BlockMixer::Far { tp, sinks, window, schedule } => {
            let p = w.far.expect("block_forward: a far-field block needs its far field");
            let s = cfg.far_shape(t, p, sinks, window);
            a.exits = match schedule {
                Some(f) => (f.0)(&s, tp, &to_f32(&a.q), &to_f32(&a.k), &to_f32(&a.v)),
                None => window_exits(&s),
            };
            a.lse.resize(t * nh, 0.0);
            far_mixer_forward(&s, p, &a.exits, tp, &a.q, &a.k, &a.v, &mut a.o, &mut a.lse); // [T, nh, hd]
        }
        BlockMixer::Vmf(_) | BlockMixer::VmfWin(_) => unreachable!("returned above"),
    }
    zeros(&mut a.a, t * d);
    linear_forward(&a.o, w.wo, &mut a.a, t, qd, d); // [T, d]
    ffn_half(cfg, w, x, y, a, t);
    Ok(())
}

/// The block from the mixer's output a [T, d] on: post-attention norm, residual, FFN half.
fn ffn_half<F: Float>(cfg: &BlockConfig, w: &BlockWeights<'_, F>, x: &[F], y: &mut [F], a: &mut BlockActs<F>, t: usize) {
    let d = cfg.d_model;
    let mut a2 = a.a.clone();
    if let Some(pn) = w.post_attn_norm {
        a.rstd_pa.resize(t, 0.0);
        rmsnorm_forward(cfg.norm_style, &a.a, pn, cfg.norm_eps, &mut a2, &mut a.rstd_pa);
    }
    zeros(&mut a.x1, t * d);
    a.x1.iter_mut().zip(x.iter().zip(&a2)).for_each(|(o, (&p, &q))| *o = p + q); // [T, d]
    zeros(&mut a.h2, t * d);
    a.rstd2.resize(t, 0.0);
    rmsnorm_forward(cfg.norm_style, &a.x1, w.ffn_norm, cfg.norm_eps, &mut a.h2, &mut a.rstd2); // [T, d]
    zeros(&mut a.f, t * d);
    let fw = FfnWeights { gate: w.gate, up: w.up, down: w.down };
    ffn_forward(cfg.act, fw, &a.h2, &mut a.ffn, &mut a.f, t, d, cfg.d_ff); // [T, d]
    let mut f2 = a.f.clone();
    if let Some(pn) = w.post_ffn_norm {
        a.rstd_pf.resize(t, 0.0);
        rmsnorm_forward(cfg.norm_style, &a.f, pn, cfg.norm_eps, &mut f2, &mut a.rstd_pf);
    }
    y.iter_mut().zip(a.x1.iter().zip(&f2)).for_each(|(o, (&p, &q))| *o = p + q); // [T, d]
}

/// Backward from dy [T, d]: dx += (the block's input gradient), trainable grads +=. `acts`
/// and `plan` are those of the forward on the same x (recomputed under checkpointing).
/// fwd: y = x1 + pf(ffn(norm2(x1))), x1 = x + pa(o·Woᵀ), o = mixer(rope(qkn(norm1(x)·W)))
///   =>  the ops' backwards in reverse order; both residuals pass dy straight through.
#[allow(clippy::too_many_arguments)]
pub fn block_backward<F: Float>(
    cfg: &BlockConfig,
    w: &BlockWeights<'_, F>,
    rope: &RopeTable<F>,
    plan: Option<&NystromPlan>,
    x: &[F],
    acts: &BlockActs<F>,
    dy: &[F],
    dx: &mut [F],
    g: BlockGrads<'_, F>,
) {
    let (d, nh, nkv, hd) = (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim);
    assert!(
        x.len().is_multiple_of(d) && dy.len() == x.len() && dx.len() == x.len(),
        "block_backward: x, dy, dx must be [T, {d}]"
    );
    let t = x.len() / d;
    let (qd, kd) = (nh * hd, nkv * hd);
    let a = acts;
    let BlockGrads { attn_norm, q_norm, k_norm, post_attn_norm, ffn_norm, gate, up, down, post_ffn_norm, far, vmf } = g;
    // fwd: y = x1 + f2  =>  dx1 = dy; df2 = dy
    let mut dx1 = dy.to_vec(); // [T, d]
    // fwd: f2 = post_ffn_norm(f)  =>  df
    let df = match w.post_ffn_norm {
        Some(pn) => {
            let mut df = vec![F::ZERO; t * d];
            rmsnorm_backward(cfg.norm_style, &a.f, pn, &a.rstd_pf, dy, Some(&mut df), post_ffn_norm);
            df
        }
        None => dy.to_vec(),
    };
    // fwd: f = ffn(h2)  =>  dh2, dW_gate, dW_up, dW_down
    let mut dh2 = vec![F::ZERO; t * d];
    let fw = FfnWeights { gate: w.gate, up: w.up, down: w.down };
    ffn_backward(cfg.act, fw, &a.h2, &a.ffn, &df, Some(&mut dh2), FfnGrads { gate, up, down }, t, d, cfg.d_ff);
    // fwd: h2 = norm2(x1)  =>  dx1 +=
    rmsnorm_backward(cfg.norm_style, &a.x1, w.ffn_norm, &a.rstd2, &dh2, Some(&mut dx1), ffn_norm);
    // fwd: x1 = x + a2  =>  dx += dx1; da2 = dx1
    dx.iter_mut().zip(&dx1).for_each(|(p, &q)| *p += q);
    // fwd: a2 = post_attn_norm(a)  =>  da
    let da = match w.post_attn_norm {
        Some(pn) => {
            let mut da = vec![F::ZERO; t * d];
            rmsnorm_backward(cfg.norm_style, &a.a, pn, &a.rstd_pa, &dx1, Some(&mut da), post_attn_norm);
            da
        }
        None => dx1,
    };
    if matches!(cfg.mixer, BlockMixer::Vmf(_) | BlockMixer::VmfWin(_)) {
        // fwd: a = vmf(h1)  =>  dh1; the mixer's own gradients (a frozen block's to scratch)
        let p = w.vmf.expect("block_backward: a vmf_phase block needs its parameters");
        let mut scratch;
        let gp = match vmf {
            Some(g) => g,
            None => {
                scratch = p.zeros_like();
                &mut scratch
            }
        };
        let mut dh1 = vec![F::ZERO; t * d];
        match (cfg.mixer, p, gp) {
            (BlockMixer::Vmf(sh), VmfLayer::Plain(p), VmfLayer::Plain(g)) => {
                vmf_mixer_backward(&sh, p, &a.h1, &a.vmf, &da, Some(&mut dh1), g)
            }
            (BlockMixer::VmfWin(sh), VmfLayer::Window(p), VmfLayer::Window(g)) => {
                win_mixer_backward(&sh, p, rope, &a.h1, &a.win, &da, Some(&mut dh1), g)
            }
            _ => panic!("block_backward: a vmf_phase block's parameters and gradients are of its kind"),
        }
        rmsnorm_backward(cfg.norm_style, x, w.attn_norm, &a.rstd1, &dh1, Some(dx), attn_norm);
        return;
    }
    // fwd: a = o·Woᵀ  =>  do (Wo frozen)
    let mut d_o = vec![F::ZERO; t * qd];
    linear_backward(&da, &a.o, w.wo, Some(&mut d_o), None, t, qd, d);
    // fwd: o = mixer(q, k, v)  =>  dq, dk, dv (post-RoPE)
    let (mut dq, mut dk, mut dv) = (vec![F::ZERO; t * qd], vec![F::ZERO; t * kd], vec![F::ZERO; t * kd]);
    match cfg.mixer {
        BlockMixer::Exact { window } => {
            attention_backward(&cfg.attn_shape(window), &a.q, &a.k, &a.v, &a.o, &a.lse, &d_o, &mut dq, &mut dk, &mut dv);
        }
        BlockMixer::Nystrom { cfg: o1, tp } => {
            let p = plan.expect("block_backward: a Nyström block needs the plan of its forward");
            nystrom_backward(&o1, p, &cfg.ny_shape(tp), &a.q, &a.k, &a.v, &d_o, &mut dq, &mut dk, &mut dv);
        }
        BlockMixer::Far { tp, sinks, window, .. } => {
            let p = w.far.expect("block_backward: a far-field block needs its far field");
            let s = cfg.far_shape(t, p, sinks, window);
            // A frozen far field still passes the gradient to q, k, v: its own goes to scratch.
            let mut scratch;
            let gp = match far {
                Some(g) => g,
                None => {
                    scratch = FarParams::zeros(&s);
                    &mut scratch
                }
            };
            far_mixer_backward(&s, p, &a.exits, tp, &a.q, &a.k, &a.v, &a.o, &a.lse, &d_o, &mut dq, &mut dk, &mut dv, gp);
        }
        BlockMixer::Vmf(_) | BlockMixer::VmfWin(_) => unreachable!("returned above"),
    }
    // fwd: q = rope(qn)  =>  dqn = rope⁻¹(dq)
    let (mut dqn, mut dkn) = (vec![F::ZERO; t * qd], vec![F::ZERO; t * kd]);
    rope_backward(cfg.rope_style, rope, &dq, &mut dqn, nh, hd);
    rope_backward(cfg.rope_style, rope, &dk, &mut dkn, nkv, hd);
    // fwd: qn = q_norm(q_lin) per head  =>  dq_lin
    let (dql, dkl) = match (w.q_norm, w.k_norm) {
        (Some(qn), Some(kn)) => {
            let (mut dql, mut dkl) = (vec![F::ZERO; t * qd], vec![F::ZERO; t * kd]);
            rmsnorm_backward(cfg.norm_style, &a.q_lin, qn, &a.rstd_q, &dqn, Some(&mut dql), q_norm);
            rmsnorm_backward(cfg.norm_style, &a.k_lin, kn, &a.rstd_k, &dkn, Some(&mut dkl), k_norm);
            (dql, dkl)
        }
        _ => (dqn, dkn),
    };
    // fwd: q_lin = h1·Wqᵀ + bq, ...  =>  dh1 (projections and biases frozen)
    let mut dh1 = vec![F::ZERO; t * d];
    linear_backward(&dql, &a.h1, w.wq, Some(&mut dh1), None, t, d, qd);
    linear_backward(&dkl, &a.h1, w.wk, Some(&mut dh1), None, t, d, kd);
    linear_backward(&dv, &a.h1, w.wv, Some(&mut dh1), None, t, d, kd);
    // fwd: h1 = norm1(x)  =>  dx +=
    rmsnorm_backward(cfg.norm_style, x, w.attn_norm, &a.rstd1, &dh1, Some(dx), attn_norm);
}

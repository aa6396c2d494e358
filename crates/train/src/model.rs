//! The student as a stack of [`crate::block`] layers between a frozen embedding and the fused
//! LM head + distillation loss, with layer checkpointing: a step keeps only each layer's input
//! (`[T, d]` per layer) and its Nyström plan, and recomputes the layer's forward into one scratch
//! [`BlockActs`] right before its backward. Peak activation memory: L·T·d plus one layer's
//! activations plus one chunk of logits. Weight loading (engine model -> [`Student`]) and the
//! optimizer loop are the trainer's.
//!
//! ```text
//! x_0 = embed[tokens]·scale            [T, d]
//! x_{l+1} = block_l(x_l)                [T, d]   (input x_l kept)
//! L = lm_head_distill(norm(x_L))        scalar   (dh from the same pass)
//! backward: dx_L = norm⁻ᵀ(dh); for l = L−1..0: recompute block_l(x_l), dx_l = block_lᵀ(dx_{l+1})
//! ```
//! Accumulation contract: param grads +=, activations =.

use crate::block::{BlockActs, BlockConfig, BlockGrads, BlockWeights, block_backward, block_forward};
use crate::farfield::FarParams;
use crate::float::Float;
use crate::loss::{LossOut, lm_head_distill};
use crate::norm::{NormStyle, rmsnorm_backward, rmsnorm_forward};
use crate::nystrom::{NystromError, NystromPlan};
use crate::rope::RopeTable;
use crate::vmf_window::VmfLayer;

/// One layer: its config, tensors, RoPE table (Gemma's local and global layers differ) and
/// whether its norms and FFN train (the polish trains converted layers only).
pub struct StudentLayer<'a, F> {
    pub cfg: BlockConfig,
    pub w: BlockWeights<'a, F>,
    pub rope: &'a RopeTable<F>,
    pub train: bool,
    /// A vmf_phase block's parameters train (the heal's stage 2).
    pub train_vmf: bool,
}

/// The student.
pub struct Student<'a, F> {
    /// [V, d], frozen.
    pub embed: &'a [F],
    /// Gemma 3 multiplies embeddings by √d (rounded to f32 as the engine does).
    pub embed_scale: Option<f64>,
    pub layers: Vec<StudentLayer<'a, F>>,
    /// `[d]`, trainable.
    pub final_norm: &'a [F],
    pub norm_style: NormStyle,
    pub norm_eps: f64,
    /// `[V, d]`, frozen (the embedding when tied).
    pub lm_head: &'a [F],
    pub vocab: usize,
    pub d_model: usize,
}

/// Gradient buffers of one trainable layer (present tensors only).
#[derive(Debug, Clone, Default)]
pub struct LayerGrads<F> {
    pub attn_norm: Vec<F>,
    pub q_norm: Option<Vec<F>>,
    pub k_norm: Option<Vec<F>>,
    pub post_attn_norm: Option<Vec<F>>,
    pub ffn_norm: Vec<F>,
    pub gate: Vec<F>,
    pub up: Vec<F>,
    pub down: Vec<F>,
    pub post_ffn_norm: Option<Vec<F>>,
}

/// Gradients of every trainable tensor: per layer (None: frozen layer), the final norm, and per
/// layer the far field of a far-field block (None: the layer has none).
#[derive(Debug, Clone)]
pub struct StudentGrads<F> {
    pub layers: Vec<Option<LayerGrads<F>>>,
    pub final_norm: Vec<F>,
    pub far: Vec<Option<FarParams<F>>>,
    /// Per layer, a vmf_phase block's parameters (None: not one, or frozen).
    pub vmf: Vec<Option<VmfLayer<F>>>,
}

/// What a trainable tensor is, for its learning rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A norm gain (a vector of O(1) values).
    Gain,
    /// An FFN matrix.
    Matrix,
    /// A far field's feature map (U, α, W, β, ρ; the norm terms γ stay as stage 1 fitted them:
    /// a step of AdamW moves γ·|q|² by lr·|q|², hundreds of times the others' step).
    Far,
    /// A vmf_phase layer's own parameter (phases, decays, conv, gate, mass: the heal's stage 2).
    Vmf,
    /// A vmf_phase layer's projection copied from the teacher (v_proj, out_proj): it starts
    /// right and takes a smaller rate (`TrainConfig::vmf_copied_mult`).
    VmfCopied,
}

impl<F: Float> StudentGrads<F> {
    /// Zeroed buffers shaped like the student's trainable tensors.
    pub fn new(s: &Student<'_, F>) -> Self {
        let z = |x: &[F]| vec![F::ZERO; x.len()];
        let zo = |x: Option<&[F]>| x.map(z);
        let layers = s
            .layers
            .iter()
            .map(|l| {
                l.train.then(|| LayerGrads {
                    attn_norm: z(l.w.attn_norm),
                    q_norm: zo(l.w.q_norm),
                    k_norm: zo(l.w.k_norm),
                    post_attn_norm: zo(l.w.post_attn_norm),
                    ffn_norm: z(l.w.ffn_norm),
                    gate: z(l.w.gate),
                    up: z(l.w.up),
                    down: z(l.w.down),
                    post_ffn_norm: zo(l.w.post_ffn_norm),
                })
            })
            .collect();
        let far = s.layers.iter().map(|l| l.w.far.map(|p| p.map(|_| F::ZERO))).collect();
        // The final norm trains with the layers' norms and FFNs: a student whose only trainable
        // tensors are far fields (stage 2 of the far field) keeps it as it is (empty buffer).
        let final_norm = if s.layers.iter().any(|l| l.train) { z(s.final_norm) } else { Vec::new() };
        let vmf = s.layers.iter().map(|l| l.w.vmf.filter(|_| l.train_vmf).map(|p| p.zeros_like())).collect();
        StudentGrads { layers, final_norm, far, vmf }
    }

    /// Every buffer, in a fixed order (for clipping and the optimizer).
    pub fn tensors_mut(&mut self) -> Vec<&mut Vec<F>> {
        self.tensors_kinds_mut().into_iter().map(|(t, _)| t).collect()
    }

    /// [`Self::tensors_mut`] with, per buffer, its [`Kind`]: the trainer gives gains and far
    /// fields their own learning-rate multipliers. One list, so the order and the kinds cannot
    /// drift apart.
    pub fn tensors_kinds_mut(&mut self) -> Vec<(&mut Vec<F>, Kind)> {
        use Kind::{Gain, Matrix};
        let mut out = Vec::new();
        for g in self.layers.iter_mut().flatten() {
            out.extend([(&mut g.attn_norm, Gain), (&mut g.ffn_norm, Gain)]);
            out.extend([(&mut g.gate, Matrix), (&mut g.up, Matrix), (&mut g.down, Matrix)]);
            for o in [&mut g.q_norm, &mut g.k_norm, &mut g.post_attn_norm, &mut g.post_ffn_norm] {
                if let Some(v) = o.as_mut() {
                    out.push((v, Gain));
                }
            }
        }
        if !self.final_norm.is_empty() {
            out.push((&mut self.final_norm, Gain));
        }
        for p in self.far.iter_mut().flatten() {
            out.extend([&mut p.u, &mut p.alpha, &mut p.w, &mut p.beta, &mut p.rho].map(|t| (t, Kind::Far)));
        }
        for p in self.vmf.iter_mut().flatten() {
            out.extend(
                p.tensors_copied_mut()
                    .into_iter()
                    .filter(|(t, _)| !t.is_empty())
                    .map(|(t, c)| (t, if c { Kind::VmfCopied } else { Kind::Vmf })),
            );
        }
        out
    }

    pub fn zero(&mut self) {
        for t in self.tensors_mut() {
            t.iter_mut().for_each(|x| *x = F::ZERO);
        }
        // The far fields' norm terms are not trained, but their backward still adds into them.
        for p in self.far.iter_mut().flatten() {
            p.gq.iter_mut().chain(p.gk.iter_mut()).for_each(|x| *x = F::ZERO);
        }
    }
}

impl<F: Float> Student<'_, F> {
    /// x_0 = embed[tokens]·scale, [T, d].
    fn embed_tokens(&self, tokens: &[u32]) -> Vec<F> {
        let d = self.d_model;
        let sc = F::from_f64(self.embed_scale.unwrap_or(1.0));
        let mut x = Vec::with_capacity(tokens.len() * d);
        for &t in tokens {
            assert!((t as usize) < self.vocab, "student: token {t} outside the vocabulary of {}", self.vocab);
            x.extend(self.embed[t as usize * d..][..d].iter().map(|&e| e * sc));
        }
        x
    }

    /// The loss only (validation), sealing plans unless `plans` gives them. Positions before
    /// `score_from` are context only (`ppl --o1` scores the half after the prompt); teacher
    /// `[T, V]` and targets `[T]` cover every position.
    #[allow(clippy::too_many_arguments)]
    pub fn loss(
        &self,
        tokens: &[u32],
        teacher: &[F],
        targets: &[u32],
        lambda: f64,
        score_from: usize,
        plans: Option<&[Option<NystromPlan>]>,
    ) -> Result<LossOut, NystromError> {
        let mut x = self.embed_tokens(tokens);
        let mut y = vec![F::ZERO; x.len()];
        let mut acts = BlockActs::default();
        for (l, layer) in self.layers.iter().enumerate() {
            let mut plan = plans.and_then(|p| p[l].clone());
            block_forward(&layer.cfg, &layer.w, layer.rope, &mut plan, &x, &mut y, &mut acts)?;
            std::mem::swap(&mut x, &mut y);
        }
        let (mut h, mut rstd) = (vec![F::ZERO; x.len()], vec![0.0; tokens.len()]);
        rmsnorm_forward(self.norm_style, &x, self.final_norm, self.norm_eps, &mut h, &mut rstd);
        let (s0, d, v) = (self.check_scored(tokens, teacher, targets, score_from), self.d_model, self.vocab);
        Ok(lm_head_distill(&h[s0 * d..], self.lm_head, &teacher[s0 * v..], &targets[s0..], v, d, lambda, None))
    }

    /// Checks the loss inputs; returns the first scored position.
    fn check_scored(&self, tokens: &[u32], teacher: &[F], targets: &[u32], score_from: usize) -> usize {
        let t = tokens.len();
        assert!(
            teacher.len() == t * self.vocab && targets.len() == t,
            "student: teacher must be [{t}, {}], targets [{t}]",
            self.vocab
        );
        assert!(score_from < t, "student: scoring from position {score_from} of {t} scores nothing");
        score_from
    }

    /// One training step's forward and backward with layer checkpointing: returns the loss (over
    /// positions from `score_from`, as [`Student::loss`]), adds the gradients into `grads`, and
    /// hands back the plans the loss was computed with.
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &self,
        tokens: &[u32],
        teacher: &[F],
        targets: &[u32],
        lambda: f64,
        score_from: usize,
        grads: &mut StudentGrads<F>,
    ) -> Result<(LossOut, Vec<Option<NystromPlan>>), NystromError> {
        let (t, d) = (tokens.len(), self.d_model);
        let s0 = self.check_scored(tokens, teacher, targets, score_from);
        assert_eq!(grads.layers.len(), self.layers.len(), "student step: gradients of another student");
        // Forward, keeping each layer's input and plan.
        let mut inputs: Vec<Vec<F>> = Vec::with_capacity(self.layers.len()); // L × [T, d]
        let mut plans: Vec<Option<NystromPlan>> = Vec::with_capacity(self.layers.len());
        let mut x = self.embed_tokens(tokens);
        let mut acts = BlockActs::default();
        for layer in &self.layers {
            let mut plan = None;
            let mut y = vec![F::ZERO; t * d];
            block_forward(&layer.cfg, &layer.w, layer.rope, &mut plan, &x, &mut y, &mut acts)?;
            inputs.push(std::mem::replace(&mut x, y));
            plans.push(plan);
        }
        let (mut h, mut rstd) = (vec![F::ZERO; t * d], vec![0.0; t]);
        rmsnorm_forward(self.norm_style, &x, self.final_norm, self.norm_eps, &mut h, &mut rstd); // [T, d]
        let (mut dh, v) = (vec![F::ZERO; t * d], self.vocab);
        let (hs, dhs) = (&h[s0 * d..], &mut dh[s0 * d..]);
        let out = lm_head_distill(hs, self.lm_head, &teacher[s0 * v..], &targets[s0..], v, d, lambda, Some(dhs));
        // fwd: h = norm(x_L)  =>  dx_L, d final_norm
        let mut dx = vec![F::ZERO; t * d];
        let dw = Some(&mut grads.final_norm[..]).filter(|g| !g.is_empty());
        rmsnorm_backward(self.norm_style, &x, self.final_norm, &rstd, &dh, Some(&mut dx), dw);
        // Layers in reverse: recompute the forward from the kept input, then its backward.
        let mut y = vec![F::ZERO; t * d];
        for (l, layer) in self.layers.iter().enumerate().rev() {
            block_forward(&layer.cfg, &layer.w, layer.rope, &mut plans[l], &inputs[l], &mut y, &mut acts)?;
            let mut dxl = vec![F::ZERO; t * d];
            let g = match grads.layers[l].as_mut() {
                Some(g) => BlockGrads {
                    attn_norm: Some(&mut g.attn_norm[..]),
                    q_norm: g.q_norm.as_deref_mut(),
                    k_norm: g.k_norm.as_deref_mut(),
                    post_attn_norm: g.post_attn_norm.as_deref_mut(),
                    ffn_norm: Some(&mut g.ffn_norm[..]),
                    gate: Some(&mut g.gate[..]),
                    up: Some(&mut g.up[..]),
                    down: Some(&mut g.down[..]),
                    post_ffn_norm: g.post_ffn_norm.as_deref_mut(),
                    far: None,
                    vmf: None,
                },
                None => BlockGrads::default(),
            };
            let g = BlockGrads { far: grads.far[l].as_mut(), vmf: grads.vmf[l].as_mut(), ..g };
            block_backward(&layer.cfg, &layer.w, layer.rope, plans[l].as_ref(), &inputs[l], &acts, &dx, &mut dxl, g);
            dx = dxl;
        }
        Ok((out, plans))
    }
}

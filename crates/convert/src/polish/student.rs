//! The engine's loaded [`Model`] as the train crate's [`Student`]: every tensor dequantized to
//! f32 (`QTensor::to_f32`) and owned here, the per-layer block configs (GQA, attention scale,
//! QK-norm, Qwen2 biases, Gemma 3 post-norms and embedding scale, RoPE tables per layer kind),
//! and the mixer each layer runs in the polish: the global softmax-attention layers take the
//! Nyström O(1) operator (or exact attention, for checking), sliding-window layers (Gemma 3
//! local) keep their exact window, exactly as `--o1` serves them; or, for a model that carries a
//! learned far field (stage 2), each planned layer as the .cmf serves it: its eviction rule at
//! its split window beside its far field. Trainable: the converted layers' norm gains and FFN,
//! and the final norm (the polish contract); in stage 2 the far fields (and with
//! `--distill-ffn` the planned layers' norms and FFNs).
//!
//! Conventions the mapping relies on (checked by tests/polish_student.rs against the engine's
//! exact logits): the engine holds norm gains ready to multiply (a GGUF's Gemma gains already
//! store 1 + w, an HF Gemma's get the +1 at load), so every norm is [`NormStyle::Plain`]; the
//! engine's RoPE recipes (style, rotated dims, inverse frequencies, Llama 3 scaling already
//! applied) become f64-angle tables over positions 0..ctx; a tied head is the embedding.
//!
//! Not supported (a one-line error naming the layer): mixtures of experts, gated attention,
//! recurrent or convolutional mixers, MLA, logit soft-capping.

use cortiq_engine::Model;
use cortiq_engine::config::{Activation, MixerKind};
use cortiq_engine::mixers::attention::Attention;
use cortiq_engine::mixers::attention::AttentionWeights;
use cortiq_engine::mixers::vmf::VmfPhase;
use cortiq_engine::mixers::vmf_window::VmfWindow;
use cortiq_engine::model::Ffn;
use cortiq_train::act::Act;
use cortiq_train::block::{BlockConfig, BlockMixer, BlockWeights, Schedule};
use cortiq_train::farfield::{FarParams, FarShape};
use cortiq_train::model::{Student, StudentLayer};
use cortiq_train::norm::NormStyle;
use cortiq_train::nystrom::O1Config;
use cortiq_train::rope::RopeTable;
use cortiq_train::vmf_window::VmfLayer;

/// How the student's global attention layers run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GlobalAttn {
    /// Exact causal attention (the teacher's operator; for checking the mapping).
    Exact,
    /// The Nyström O(1) operator with the first `tp` rows the sealed prompt.
    O1 { cfg: O1Config, tp: usize },
    /// The model's own learned far field beside its eviction rule (`Model::o1_far`, its window
    /// split, its score layers; `score_all`: score eviction on every planned layer), the first
    /// `tp` rows the sealed prompt; `train_ffn`: the planned layers' norms and FFNs train too.
    Far { tp: usize, window: usize, sinks: usize, score_all: bool, train_ffn: bool },
    /// A hybrid made by `convert --linear-core vmf_phase` (the heal's stage 2): its softmax
    /// layers exact and frozen, its vmf_phase layers' parameters trained; `train_ffn`: their
    /// norms and FFNs too.
    Heal { train_ffn: bool },
}

/// Why a model cannot become a student.
#[derive(Debug, thiserror::Error)]
pub enum StudentError {
    #[error("polish: layer {layer}: {what} is not supported (dense softmax-attention models only: llama, qwen2, qwen3, gemma3)")]
    Unsupported { layer: usize, what: &'static str },
    #[error("polish: the model uses {0} soft-capping, which the student does not implement")]
    Softcap(&'static str),
    #[error("polish: --ctx {ctx} exceeds the model's {max} positions")]
    CtxTooLong { ctx: usize, max: usize },
}

/// One layer's tensors in f32.
pub struct LayerF32 {
    pub attn_norm: Vec<f32>,
    pub wq: Vec<f32>,
    pub wk: Vec<f32>,
    pub wv: Vec<f32>,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub wo: Vec<f32>,
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub down: Vec<f32>,
    pub post_ffn_norm: Option<Vec<f32>>,
}

/// Everything a [`Student`] borrows, owned.
pub struct StudentWeights {
    /// [V, d]
    pub embed: Vec<f32>,
    /// [V, d]; None: tied to the embedding.
    pub lm_head: Option<Vec<f32>>,
    /// [d]
    pub final_norm: Vec<f32>,
    pub layers: Vec<LayerF32>,
    pub cfgs: Vec<BlockConfig>,
    /// One table per engine RoPE recipe, positions 0..ctx: [ctx, rot_dim/2].
    pub ropes: Vec<RopeTable<f32>>,
    /// Per layer: index into `ropes`.
    pub layer_rope: Vec<usize>,
    /// Per layer: whether its norms and FFN train (the layers the O(1) mode converts).
    pub train: Vec<bool>,
    /// Per layer: the far field of a [`GlobalAttn::Far`] student's planned layer (rank 0 where
    /// the model has none: the layer keeps its rule alone).
    pub far: Vec<Option<FarParams<f32>>>,
    /// Per layer: a vmf_phase layer's parameters (trained in the heal's stage 2).
    pub vmf: Vec<Option<VmfLayer<f32>>>,
    pub embed_scale: Option<f64>,
    pub norm_eps: f64,
    pub vocab: usize,
    pub d_model: usize,
}

/// Whether the engine serves layer `il` with the O(1) plan (a global softmax-attention layer):
/// the layers the polish converts and trains.
pub fn is_converted(model: &Model, il: usize) -> bool {
    let spec = &model.cfg.layers[il];
    spec.mixer == MixerKind::Attention && spec.sliding_window.is_none()
}

impl StudentWeights {
    /// Dequantizes `model` for windows of `ctx` tokens; global attention layers run `global`.
    pub fn from_model(model: &Model, ctx: usize, global: GlobalAttn) -> Result<StudentWeights, StudentError> {
        let cfg = &model.cfg;
        if cfg.final_logit_softcap.is_some() {
            return Err(StudentError::Softcap("final logit"));
        }
        if cfg.attn_logit_softcap.is_some() {
            return Err(StudentError::Softcap("attention logit"));
        }
        if ctx > cfg.n_ctx_train {
            return Err(StudentError::CtxTooLong { ctx, max: cfg.n_ctx_train });
        }
        let (d, norm_eps) = (cfg.d_model, cfg.norm_eps as f64);
        let act = match cfg.act {
            Activation::Silu => Act::Silu,
            Activation::GeluTanh => Act::GeluTanh,
            Activation::Relu2 => return Err(StudentError::Unsupported { layer: 0, what: "a relu² MLP" }),
        };
        // The student has no residual or logit multipliers (Granite), output biases or sinks (gpt-oss).
        if cfg.residual_scale.is_some() || cfg.logit_scale.is_some() || cfg.o_bias || cfg.attn_sinks {
            return Err(StudentError::Unsupported { layer: 0, what: "Granite's multipliers or gpt-oss's attention" });
        }
        let mut layers = Vec::with_capacity(cfg.n_layers);
        let mut cfgs = Vec::with_capacity(cfg.n_layers);
        let mut train = Vec::with_capacity(cfg.n_layers);
        let mut far = Vec::with_capacity(cfg.n_layers);
        let mut vmf = Vec::with_capacity(cfg.n_layers);
        let windows: std::collections::HashMap<usize, usize> = match (global, model.o1_split.as_deref()) {
            (GlobalAttn::Far { window, .. }, Some(sp)) => sp.windows(window).into_iter().collect(),
            _ => Default::default(),
        };
        for (il, (lw, spec)) in model.layers.iter().zip(&cfg.layers).enumerate() {
            let unsupported = |what| Err(StudentError::Unsupported { layer: il, what });
            let Ffn::Dense(fw) = &lw.ffn else { return unsupported("a mixture of experts") };
            // A vmf_phase layer (the heal), plain or windowed, brings its own mixer; any other
            // must be attention.
            let vmf_layer = match (lw.mixer.downcast_ref::<VmfPhase>(), lw.mixer.downcast_ref::<VmfWindow>()) {
                (Some(l), _) => {
                    let (sh, p) = super::heal::params_of(l);
                    Some((BlockMixer::Vmf(sh), VmfLayer::Plain(p)))
                }
                (None, Some(l)) => {
                    let (sh, p) = super::heal::win_params_of(model, il, l);
                    Some((BlockMixer::VmfWin(sh), VmfLayer::Window(p)))
                }
                (None, None) => None,
            };
            let aw: Option<&AttentionWeights> = match (&vmf_layer, lw.mixer.downcast_ref::<Attention>()) {
                (Some(_), _) if !matches!(global, GlobalAttn::Heal { .. }) => {
                    return unsupported("a vmf_phase layer outside the heal");
                }
                (Some(_), _) => None,
                (None, Some(a)) if spec.mixer == MixerKind::Attention => Some(&a.w),
                (None, Some(_)) => return unsupported("an attention variant"),
                (None, None) => return unsupported(lw.mixer.name()),
            };
            if cfg.attn_gate {
                return unsupported("a gated attention output");
            }
            let converted = aw.is_some() && is_converted(model, il);
            let heal_layer = vmf_layer.is_some();
            let mixer = match (vmf_layer, spec.sliding_window, global) {
                (Some((m, p)), _, _) => {
                    vmf.push(Some(p));
                    m
                }
                (None, Some(w), _) => BlockMixer::Exact { window: Some(w) },
                (None, None, GlobalAttn::Exact | GlobalAttn::Heal { .. }) => BlockMixer::Exact { window: None },
                (None, None, GlobalAttn::O1 { cfg, tp }) => BlockMixer::Nystrom { cfg, tp },
                (None, None, GlobalAttn::Far { tp, window, sinks, score_all, .. }) => {
                    let score = score_all || model.o1_score_layers.as_deref().is_some_and(|l| l.contains(&il));
                    let mut window = windows.get(&il).copied().unwrap_or(window);
                    // A planned layer the polish left without a far field spends the far
                    // state's bytes on its window, as the engine serves it (O1Run's seal).
                    if model.o1_far.get(il).is_none_or(Option::is_none) {
                        let per_pos = 2 * cfg.n_kv_heads * cfg.head_dim * 4;
                        let far_bytes = model.o1_far.iter().flatten().map(|w| w.state_bytes()).max().unwrap_or(0);
                        window += far_bytes / per_pos.max(1);
                    }
                    let schedule = score.then_some(Schedule(super::far::score_schedule));
                    BlockMixer::Far { tp, sinks, window, schedule }
                }
            };
            if !heal_layer {
                vmf.push(None);
            }
            far.push(match (global, converted) {
                (GlobalAttn::Far { .. }, true) => Some(far_params(model, il)),
                _ => None,
            });
            cfgs.push(BlockConfig {
                d_model: d,
                n_heads: cfg.n_heads,
                n_kv_heads: cfg.n_kv_heads,
                head_dim: cfg.head_dim,
                d_ff: cfg.d_ff,
                norm_eps,
                norm_style: NormStyle::Plain,
                act,
                attn_scale: cfg.attn_scale as f64,
                rope_style: cfg.ropes[spec.rope].style,
                mixer,
            });
            // Norms and FFN train: the O(1) polish's converted layers (not in stage 2 without
            // --distill-ffn); the heal's vmf_phase layers with --distill-ffn.
            train.push(match global {
                GlobalAttn::Heal { train_ffn } => train_ffn && heal_layer,
                GlobalAttn::Far { train_ffn, .. } => train_ffn && converted,
                _ => converted,
            });
            // A vmf_phase layer has no attention tensors (its block reads `vmf`).
            let m = |t: &cortiq_engine::qtensor::QTensor| t.to_f32();
            layers.push(LayerF32 {
                attn_norm: lw.attn_norm.clone(),
                wq: aw.map(|a| m(&a.wq)).unwrap_or_default(),
                wk: aw.map(|a| m(&a.wk)).unwrap_or_default(),
                wv: aw.map(|a| m(&a.wv)).unwrap_or_default(),
                bq: aw.and_then(|a| a.bq.clone()),
                bk: aw.and_then(|a| a.bk.clone()),
                bv: aw.and_then(|a| a.bv.clone()),
                q_norm: aw.and_then(|a| a.q_norm.clone()),
                k_norm: aw.and_then(|a| a.k_norm.clone()),
                wo: aw.map(|a| m(&a.wo)).unwrap_or_default(),
                post_attn_norm: lw.post_attn_norm.clone(),
                ffn_norm: lw.ffn_norm.clone(),
                gate: fw.gate.to_f32(),
                up: fw.up.to_f32(),
                down: fw.down.to_f32(),
                post_ffn_norm: lw.post_ffn_norm.clone(),
            });
        }
        let pos: Vec<usize> = (0..ctx).collect();
        let ropes = cfg.ropes.iter().map(|r| RopeTable::from_inv_freq(&pos, &r.inv_freq)).collect();
        // A tied head is the embedding's own tensor (the loader clones the QTensor handle).
        let tied = model.output.name == model.tok_embd.name;
        Ok(StudentWeights {
            embed: model.tok_embd.to_f32(),
            lm_head: (!tied).then(|| model.output.to_f32()),
            final_norm: model.output_norm.clone(),
            layers,
            cfgs,
            ropes,
            layer_rope: cfg.layers.iter().map(|l| l.rope).collect(),
            train,
            far,
            vmf,
            embed_scale: cfg.embed_scale.map(|s| s as f64),
            norm_eps,
            vocab: cfg.vocab,
            d_model: d,
        })
    }

    /// The student borrowing these tensors.
    pub fn student(&self) -> Student<'_, f32> {
        let layers = self
            .layers
            .iter()
            .zip(&self.cfgs)
            .zip(&self.layer_rope)
            .zip(&self.train)
            .zip(&self.far)
            .zip(&self.vmf)
            .map(|(((((l, cfg), &r), &train), far), vmf)| StudentLayer {
                cfg: *cfg,
                w: BlockWeights {
                    attn_norm: &l.attn_norm,
                    wq: &l.wq,
                    wk: &l.wk,
                    wv: &l.wv,
                    bq: l.bq.as_deref(),
                    bk: l.bk.as_deref(),
                    bv: l.bv.as_deref(),
                    q_norm: l.q_norm.as_deref(),
                    k_norm: l.k_norm.as_deref(),
                    wo: &l.wo,
                    post_attn_norm: l.post_attn_norm.as_deref(),
                    ffn_norm: &l.ffn_norm,
                    gate: &l.gate,
                    up: &l.up,
                    down: &l.down,
                    post_ffn_norm: l.post_ffn_norm.as_deref(),
                    far: far.as_ref(),
                    vmf: vmf.as_ref(),
                },
                rope: &self.ropes[r],
                train,
                train_vmf: vmf.is_some(),
            })
            .collect();
        Student {
            embed: &self.embed,
            embed_scale: self.embed_scale,
            layers,
            final_norm: &self.final_norm,
            norm_style: NormStyle::Plain,
            norm_eps: self.norm_eps,
            lm_head: self.lm_head.as_deref().unwrap_or(&self.embed),
            vocab: self.vocab,
            d_model: self.d_model,
        }
    }
}

/// Layer `il`'s far field as the train crate holds it (ρ = ln δ; −∞ where a feature does not
/// decay); rank 0 when the model has none there.
fn far_params(model: &Model, il: usize) -> FarParams<f32> {
    let cfg = &model.cfg;
    match model.o1_far.get(il).and_then(|f| f.as_deref()) {
        Some(f) => FarParams {
            u: f.u.clone(),
            alpha: f.alpha.clone(),
            gq: f.gq.clone(),
            w: f.w.clone(),
            beta: f.beta.clone(),
            gk: f.gk.clone(),
            rho: f.decay.iter().map(|&d| d.ln()).collect(),
        },
        None => {
            let s = FarShape {
                t: 0,
                n_heads: cfg.n_heads,
                n_kv: cfg.n_kv_heads,
                hd: cfg.head_dim,
                rank: 0,
                sinks: 0,
                window: 0,
                scale: 1.0,
            };
            FarParams::zeros(&s)
        }
    }
}

/// The student's logits at every position of `tokens` ([T, V]): its forward (the same block
/// code the trainer steps through) then the final norm and the head. For checking the mapping
/// against the engine; the trainer never materializes full logits (the fused head + loss does).
pub fn student_logits(s: &Student<'_, f32>, tokens: &[u32]) -> Result<Vec<f32>, cortiq_train::nystrom::NystromError> {
    use cortiq_train::block::{BlockActs, block_forward};
    let (t, d, v) = (tokens.len(), s.d_model, s.vocab);
    let sc = s.embed_scale.unwrap_or(1.0) as f32;
    let mut x: Vec<f32> = tokens.iter().flat_map(|&tk| s.embed[tk as usize * d..][..d].iter().map(move |&e| e * sc)).collect(); // [T, d]
    let mut y = vec![0f32; t * d];
    let mut acts = BlockActs::default();
    for layer in &s.layers {
        let mut plan = None;
        block_forward(&layer.cfg, &layer.w, layer.rope, &mut plan, &x, &mut y, &mut acts)?;
        std::mem::swap(&mut x, &mut y);
    }
    let (mut h, mut rstd) = (vec![0f32; t * d], vec![0f64; t]);
    cortiq_train::norm::rmsnorm_forward(s.norm_style, &x, s.final_norm, s.norm_eps, &mut h, &mut rstd); // [T, d]
    let mut z = vec![0f32; t * v];
    cortiq_train::matmul::linear_forward(&h, s.lm_head, &mut z, t, d, v); // [T, V]
    Ok(z)
}

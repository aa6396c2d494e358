//! Issue 6, acceptance 1 (model level): a whole tiny student, assembled from this crate's ops as
//! the trainer will assemble a real one, gradient-checked in f64 w.r.t. every trainable tensor
//! (the RMSNorm gains and the FFN weights of every layer, the final norm). Everything else is
//! frozen: embedding, q/k/v/o projections, the mixers, the LM head. Three layers, one per mixer
//! the polish trains through: Nyström (skeleton sealed, M frozen at the base point), exact
//! sliding-window attention, gated delta rule. Loss: (1−λ)·CE + λ·KL against random teacher
//! logits. Accumulation contract as in the crate: param grads +=, activations =.

use cortiq_train::act::{self, Act, FfnActs, FfnGrads, FfnWeights};
use cortiq_train::attention::{AttnShape, attention_backward, attention_forward};
use cortiq_train::delta::{DeltaCheckpoints, DeltaGrads, DeltaShape, delta_backward, delta_forward};
use cortiq_train::gradcheck::{Report, Rng, check};
use cortiq_train::loss::{distill_loss_backward, distill_loss_forward};
use cortiq_train::matmul::{linear_backward, linear_forward};
use cortiq_train::norm::{NormStyle, rmsnorm_backward, rmsnorm_forward};
use cortiq_train::nystrom::{
    DEFAULT_RIDGE, Far, NyShape, NystromPlan, O1Config, nystrom_backward, nystrom_forward, nystrom_plan,
};
use cortiq_train::rope::{RopeStyle, RopeTable, rope_backward, rope_forward};

const V: usize = 13;
const D: usize = 8;
const NH: usize = 2;
const NKV: usize = 1;
const HD: usize = 4;
const FF: usize = 12;
const T: usize = 40;
const TP: usize = 20;
const EPS_NORM: f64 = 1e-6;
const LAMBDA: f64 = 0.4;
/// Finite-difference step per layer. Layer 0's tensors act through three layers of sharp
/// attention, which makes the loss's fifth derivative large: h = 1e-4 leaves a 6e-5 truncation
/// error on its gains, h = 1e-5 about 1e-9 (the error falls as h⁴: truncation, not a wrong
/// gradient). The last layer's gradients are small (scale 2e-2 against a loss of 3), where
/// h = 1e-5 leaves rounding noise of 1e-10 absolute, so it keeps the op-level 1e-4.
const EPS_FD: [f64; 3] = [1e-5, 1e-4, 1e-4];

#[derive(Clone, Copy, PartialEq)]
enum Mixer {
    Nystrom,
    Window(usize),
    Delta,
}

/// Trainable tensors of one layer (also used for their gradients).
#[derive(Clone)]
struct Train {
    attn_norm: Vec<f64>,
    ffn_norm: Vec<f64>,
    gate: Vec<f64>,
    up: Vec<f64>,
    down: Vec<f64>,
}

struct Frozen {
    mixer: Mixer,
    style: NormStyle,
    wq: Vec<f64>, // [NH·HD, D]
    wk: Vec<f64>, // [NKV·HD, D] (Delta: [NH·HD, D])
    wv: Vec<f64>,
    wo: Vec<f64>, // [D, NH·HD]
    g: Vec<f64>,  // Delta: [T, NH]
    beta: Vec<f64>,
}

struct Model {
    emb: Vec<f64>, // [V, D]
    frozen: Vec<Frozen>,
    train: Vec<Train>,
    final_norm: Vec<f64>,
    lm: Vec<f64>, // [V, D]
}

/// What one layer's backward needs.
#[derive(Default)]
struct LayerActs {
    x_in: Vec<f64>,
    h: Vec<f64>,
    rstd1: Vec<f64>,
    q_pre: Vec<f64>,
    k_pre: Vec<f64>,
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    o: Vec<f64>,
    lse: Vec<f64>,
    plan: Option<NystromPlan>,
    dropped: Vec<bool>,
    ck: DeltaCheckpoints<f64>,
    x_mid: Vec<f64>,
    h2: Vec<f64>,
    rstd2: Vec<f64>,
    ffn: FfnActs<f64>,
}

fn kv_heads(m: Mixer) -> usize {
    if m == Mixer::Delta { NH } else { NKV }
}

fn o1() -> O1Config {
    O1Config { window: 4, sinks: 1, landmarks: 4, ridge: DEFAULT_RIDGE, far: Far::Skeleton }
}

fn ny_shape() -> NyShape {
    NyShape { n_heads: NH, n_kv_heads: NKV, head_dim: HD, scale: 1.5 / (HD as f64).sqrt(), tp: TP }
}

impl Model {
    fn new(seed: u64) -> Model {
        let mut r = Rng(seed);
        let mut frozen = Vec::new();
        let mut train = Vec::new();
        for (l, mixer) in [Mixer::Nystrom, Mixer::Window(6), Mixer::Delta].into_iter().enumerate() {
            let nkv = kv_heads(mixer);
            frozen.push(Frozen {
                mixer,
                style: if l == 1 { NormStyle::OnePlus } else { NormStyle::Plain },
                wq: r.vec(NH * HD * D, 0.5),
                wk: r.vec(nkv * HD * D, 0.5),
                wv: r.vec(nkv * HD * D, 0.5),
                wo: r.vec(D * NH * HD, 0.4),
                g: (0..T * NH).map(|_| -0.05 - 0.2 * r.uniform()).collect(),
                beta: (0..T * NH).map(|_| 0.2 + 0.6 * r.uniform()).collect(),
            });
            let gain = |r: &mut Rng| -> Vec<f64> {
                if l == 1 { r.vec(D, 0.1) } else { (0..D).map(|_| 1.0 + 0.1 * r.normal()).collect() }
            };
            train.push(Train {
                attn_norm: gain(&mut r),
                ffn_norm: gain(&mut r),
                gate: r.vec(FF * D, 0.4),
                up: r.vec(FF * D, 0.4),
                down: r.vec(D * FF, 0.4),
            });
        }
        Model {
            emb: r.vec(V * D, 1.0),
            frozen,
            train,
            final_norm: (0..D).map(|_| 1.0 + 0.1 * r.normal()).collect(),
            lm: r.vec(V * D, 0.5),
        }
    }

    /// Forward to logits [T, V]; `plans` fixes the Nyström M (None: seal from this forward).
    fn forward(
        &self,
        tokens: &[u32],
        plans: Option<&[Option<NystromPlan>]>,
        acts: &mut Vec<LayerActs>,
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let table = RopeTable::<f64>::new(T, HD, 10_000.0);
        let mut x: Vec<f64> = tokens.iter().flat_map(|&t| self.emb[t as usize * D..][..D].to_vec()).collect(); // [T, D]
        acts.clear();
        for (l, (fz, tr)) in self.frozen.iter().zip(&self.train).enumerate() {
            let nkv = kv_heads(fz.mixer);
            let mut a = LayerActs { x_in: x.clone(), h: vec![0.0; T * D], rstd1: vec![0.0; T], ..Default::default() };
            rmsnorm_forward(fz.style, &x, &tr.attn_norm, EPS_NORM, &mut a.h, &mut a.rstd1); // [T, D]
            a.q_pre = vec![0.0; T * NH * HD];
            a.k_pre = vec![0.0; T * nkv * HD];
            a.v = vec![0.0; T * nkv * HD];
            linear_forward(&a.h, &fz.wq, &mut a.q_pre, T, D, NH * HD); // [T, NH, HD]
            linear_forward(&a.h, &fz.wk, &mut a.k_pre, T, D, nkv * HD); // [T, nkv, HD]
            linear_forward(&a.h, &fz.wv, &mut a.v, T, D, nkv * HD); // [T, nkv, HD]
            a.o = vec![0.0; T * NH * HD]; // [T, NH, HD]
            match fz.mixer {
                Mixer::Delta => {
                    (a.q, a.k) = (a.q_pre.clone(), a.k_pre.clone());
                    let sh = DeltaShape { n_heads: NH, dk: HD, dv: HD };
                    delta_forward(&sh, &a.q, &a.k, &a.v, &fz.g, &fz.beta, &mut a.o, &mut a.ck);
                }
                m => {
                    a.q = vec![0.0; a.q_pre.len()];
                    a.k = vec![0.0; a.k_pre.len()];
                    rope_forward(RopeStyle::NeoX, &table, &a.q_pre, &mut a.q, NH, HD);
                    rope_forward(RopeStyle::NeoX, &table, &a.k_pre, &mut a.k, nkv, HD);
                    if m == Mixer::Nystrom {
                        let plan = match plans {
                            Some(p) => p[l].clone().unwrap(),
                            None => nystrom_plan(&o1(), &ny_shape(), &a.q, &a.k).unwrap(),
                        };
                        assert!(plan.skeleton, "the tiny model must seal a skeleton");
                        let mut dropped = vec![false; T * NH];
                        nystrom_forward(&o1(), &plan, &ny_shape(), &a.q, &a.k, &a.v, &mut a.o, &mut dropped);
                        a.plan = Some(plan);
                        a.dropped = dropped;
                    } else if let Mixer::Window(w) = m {
                        let sh = AttnShape {
                            n_heads: NH,
                            n_kv_heads: nkv,
                            head_dim: HD,
                            scale: 1.0 / (HD as f64).sqrt(),
                            window: Some(w),
                        };
                        a.lse = vec![0.0; T * NH];
                        attention_forward(&sh, &a.q, &a.k, &a.v, &mut a.o, &mut a.lse);
                    }
                }
            }
            let mut y = vec![0.0; T * D];
            linear_forward(&a.o, &fz.wo, &mut y, T, NH * HD, D); // [T, D]
            x.iter_mut().zip(&y).for_each(|(a, b)| *a += b);
            a.x_mid = x.clone();
            a.h2 = vec![0.0; T * D];
            a.rstd2 = vec![0.0; T];
            rmsnorm_forward(fz.style, &x, &tr.ffn_norm, EPS_NORM, &mut a.h2, &mut a.rstd2); // [T, D]
            let w = FfnWeights { gate: &tr.gate, up: &tr.up, down: &tr.down };
            act::ffn_forward(Act::Silu, w, &a.h2, &mut a.ffn, &mut y, T, D, FF); // [T, D]
            x.iter_mut().zip(&y).for_each(|(a, b)| *a += b);
            acts.push(a);
        }
        let (mut hf, mut rf) = (vec![0.0; T * D], vec![0.0; T]);
        rmsnorm_forward(NormStyle::Plain, &x, &self.final_norm, EPS_NORM, &mut hf, &mut rf); // [T, D]
        let mut logits = vec![0.0; T * V];
        linear_forward(&hf, &self.lm, &mut logits, T, D, V); // [T, V]
        (logits, x, rf)
    }

    /// Backward from dlogits: gradients of every trainable tensor (+=).
    fn backward(&self, acts: &[LayerActs], x_last: &[f64], rf: &[f64], dlogits: &[f64], grads: &mut [Train], dfinal: &mut [f64]) {
        let table = RopeTable::<f64>::new(T, HD, 10_000.0);
        let mut hf = vec![0.0; T * D];
        rmsnorm_forward(NormStyle::Plain, x_last, &self.final_norm, EPS_NORM, &mut hf, &mut vec![0.0; T]);
        let mut dhf = vec![0.0; T * D];
        linear_backward(dlogits, &hf, &self.lm, Some(&mut dhf), None, T, D, V);
        let mut dx = vec![0.0; T * D]; // gradient of the residual stream
        rmsnorm_backward(NormStyle::Plain, x_last, &self.final_norm, rf, &dhf, Some(&mut dx), Some(dfinal));
        for l in (0..self.frozen.len()).rev() {
            let (fz, tr, a, g) = (&self.frozen[l], &self.train[l], &acts[l], &mut grads[l]);
            let nkv = kv_heads(fz.mixer);
            // fwd: x_out = x_mid + ffn(norm(x_mid))  =>  dx_mid = dx + (through ffn and norm)
            let mut dh2 = vec![0.0; T * D];
            let w = FfnWeights { gate: &tr.gate, up: &tr.up, down: &tr.down };
            let fg = FfnGrads { gate: Some(&mut g.gate[..]), up: Some(&mut g.up[..]), down: Some(&mut g.down[..]) };
            act::ffn_backward(Act::Silu, w, &a.h2, &a.ffn, &dx, Some(&mut dh2), fg, T, D, FF);
            rmsnorm_backward(fz.style, &a.x_mid, &tr.ffn_norm, &a.rstd2, &dh2, Some(&mut dx), Some(&mut g.ffn_norm));
            // fwd: x_mid = x_in + o·Woᵀ  =>  dx_in = dx_mid + (through the mixer)
            let mut d_o = vec![0.0; T * NH * HD];
            linear_backward(&dx, &a.o, &fz.wo, Some(&mut d_o), None, T, NH * HD, D);
            let (mut dq, mut dk, mut dv) = (vec![0.0; a.q.len()], vec![0.0; a.k.len()], vec![0.0; a.v.len()]);
            let (mut dq_pre, mut dk_pre) = (vec![0.0; a.q.len()], vec![0.0; a.k.len()]);
            match fz.mixer {
                Mixer::Delta => {
                    let sh = DeltaShape { n_heads: NH, dk: HD, dv: HD };
                    let (mut dg, mut db) = (vec![0.0; T * NH], vec![0.0; T * NH]);
                    let dg_ = DeltaGrads { dq: &mut dq_pre, dk: &mut dk_pre, dv: &mut dv, dg: &mut dg, dbeta: &mut db };
                    delta_backward(&sh, &a.q, &a.k, &a.v, &fz.g, &fz.beta, &a.ck, &d_o, dg_);
                }
                m => {
                    if m == Mixer::Nystrom {
                        nystrom_backward(
                            &o1(),
                            a.plan.as_ref().unwrap(),
                            &ny_shape(),
                            &a.q,
                            &a.k,
                            &a.v,
                            &d_o,
                            &mut dq,
                            &mut dk,
                            &mut dv,
                        );
                    } else if let Mixer::Window(w) = m {
                        let sh = AttnShape {
                            n_heads: NH,
                            n_kv_heads: nkv,
                            head_dim: HD,
                            scale: 1.0 / (HD as f64).sqrt(),
                            window: Some(w),
                        };
                        attention_backward(&sh, &a.q, &a.k, &a.v, &a.o, &a.lse, &d_o, &mut dq, &mut dk, &mut dv);
                    }
                    rope_backward(RopeStyle::NeoX, &table, &dq, &mut dq_pre, NH, HD);
                    rope_backward(RopeStyle::NeoX, &table, &dk, &mut dk_pre, nkv, HD);
                }
            }
            let mut dh = vec![0.0; T * D];
            linear_backward(&dq_pre, &a.h, &fz.wq, Some(&mut dh), None, T, D, NH * HD);
            linear_backward(&dk_pre, &a.h, &fz.wk, Some(&mut dh), None, T, D, nkv * HD);
            linear_backward(&dv, &a.h, &fz.wv, Some(&mut dh), None, T, D, nkv * HD);
            rmsnorm_backward(fz.style, &a.x_in, &tr.attn_norm, &a.rstd1, &dh, Some(&mut dx), Some(&mut g.attn_norm));
        }
    }
}

fn tensor_mut<'a>(m: &'a mut Model, l: usize, name: &str) -> &'a mut Vec<f64> {
    let t = &mut m.train[l];
    match name {
        "attn_norm" => &mut t.attn_norm,
        "ffn_norm" => &mut t.ffn_norm,
        "W_gate" => &mut t.gate,
        "W_up" => &mut t.up,
        _ => &mut t.down,
    }
}

#[test]
fn gradcheck_tiny_model_every_trainable_tensor() {
    let mut model = Model::new(42);
    let mut r = Rng(7);
    let tokens: Vec<u32> = (0..T).map(|_| (r.uniform() * V as f64) as u32).collect();
    let targets: Vec<u32> = tokens[1..].iter().copied().chain([0]).collect();
    let teacher = r.vec(T * V, 2.0);
    let mut acts = Vec::new();
    let (logits, x_last, rf) = model.forward(&tokens, None, &mut acts);
    let plans: Vec<Option<NystromPlan>> = acts.iter().map(|a| a.plan.clone()).collect(); // M frozen
    let base_dropped = acts[0].dropped.clone();
    let far_rows = (TP..T).filter(|&t| t + 1 > o1().window + o1().sinks).count() * NH;
    println!("tiny model: layer 0 guard drops {} of {far_rows} far rows", base_dropped.iter().filter(|&&d| d).count());
    let base = distill_loss_forward(&logits, &teacher, &targets, V, LAMBDA);
    println!("tiny model: loss {:.6} (ce {:.6}, kl {:.6})", base.loss, base.ce, base.kl);
    let mut dlogits = vec![0.0; T * V];
    distill_loss_backward(&logits, &teacher, &targets, V, LAMBDA, 1.0, &mut dlogits);
    let mut grads: Vec<Train> = model
        .train
        .iter()
        .map(|t| Train {
            attn_norm: vec![0.0; t.attn_norm.len()],
            ffn_norm: vec![0.0; t.ffn_norm.len()],
            gate: vec![0.0; t.gate.len()],
            up: vec![0.0; t.up.len()],
            down: vec![0.0; t.down.len()],
        })
        .collect();
    let mut dfinal = vec![0.0; D];
    model.backward(&acts, &x_last, &rf, &dlogits, &mut grads, &mut dfinal);

    let loss_of = |m: &Model| {
        let mut acts = Vec::new();
        let (lg, _, _) = m.forward(&tokens, Some(&plans), &mut acts);
        assert_eq!(acts[0].dropped, base_dropped, "a finite-difference step crossed the aggregate guard");
        distill_loss_forward(&lg, &teacher, &targets, V, LAMBDA).loss
    };
    let mut reps: Vec<Report> = Vec::new();
    let names = ["L0 nystrom", "L1 window", "L2 delta"];
    for l in 0..model.train.len() {
        for (tensor, g) in [
            ("attn_norm", grads[l].attn_norm.clone()),
            ("ffn_norm", grads[l].ffn_norm.clone()),
            ("W_gate", grads[l].gate.clone()),
            ("W_up", grads[l].up.clone()),
            ("W_down", grads[l].down.clone()),
        ] {
            // The tensor is copied out, perturbed by `check`, and written back for each evaluation.
            let mut x = tensor_mut(&mut model, l, tensor).clone();
            let rep = check(&format!("tiny model {}", names[l]), tensor, &mut x, &g, EPS_FD[l], |xv| {
                tensor_mut(&mut model, l, tensor).copy_from_slice(xv);
                loss_of(&model)
            });
            tensor_mut(&mut model, l, tensor).copy_from_slice(&x);
            reps.push(rep);
        }
    }
    let mut x = model.final_norm.clone();
    reps.push(check("tiny model final", "norm", &mut x, &dfinal, 1e-4, |xv| {
        model.final_norm.copy_from_slice(xv);
        loss_of(&model)
    }));
    for rep in &reps {
        println!("{rep}");
    }
    for rep in &reps {
        assert!(rep.max_rel <= 1e-6, "{} {}: max rel err {:.3e} at {}", rep.op, rep.tensor, rep.max_rel, rep.at);
        assert!(rep.scale > 0.0, "{} {}: zero gradient", rep.op, rep.tensor);
    }
}

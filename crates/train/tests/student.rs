//! The checkpointed student step (model.rs) in f64: its loss equals the plain forward's, its
//! gradients w.r.t. every trainable tensor match finite differences (M frozen at the step's
//! plans), and a frozen layer gets no gradient buffers while still passing gradient through.

use cortiq_train::act::Act;
use cortiq_train::block::{BlockConfig, BlockMixer, BlockWeights};
use cortiq_train::gradcheck::{Report, Rng, check};
use cortiq_train::model::{Student, StudentGrads, StudentLayer};
use cortiq_train::norm::NormStyle;
use cortiq_train::nystrom::{DEFAULT_RIDGE, Far, O1Config};
use cortiq_train::rope::{RopeStyle, RopeTable};

const T: usize = 40;
const V: usize = 11;
const D: usize = 8;
const LAMBDA: f64 = 0.5;

/// Owned tensors of one layer by name.
type Named = Vec<(&'static str, Vec<f64>)>;

fn get<'a>(l: &'a Named, n: &str) -> Option<&'a [f64]> {
    l.iter().find(|(k, _)| *k == n).map(|(_, v)| &v[..])
}

fn weights(l: &Named) -> BlockWeights<'_, f64> {
    let g = |n| get(l, n).expect(n);
    BlockWeights {
        attn_norm: g("attn_norm"),
        wq: g("wq"),
        wk: g("wk"),
        wv: g("wv"),
        bq: None,
        bk: None,
        bv: None,
        q_norm: get(l, "q_norm"),
        k_norm: get(l, "k_norm"),
        wo: g("wo"),
        post_attn_norm: get(l, "post_attn_norm"),
        ffn_norm: g("ffn_norm"),
        gate: g("gate"),
        up: g("up"),
        down: g("down"),
        post_ffn_norm: get(l, "post_ffn_norm"),
        far: None,
        vmf: None,
    }
}

struct Owned {
    cfgs: Vec<BlockConfig>,
    train: Vec<bool>,
    layers: Vec<Named>,
    embed: Vec<f64>,
    final_norm: Vec<f64>,
    rope: RopeTable<f64>,
}

impl Owned {
    fn new() -> Owned {
        let o1 = O1Config { window: 4, sinks: 1, landmarks: 4, ridge: DEFAULT_RIDGE, far: Far::Skeleton };
        let base = BlockConfig {
            d_model: D,
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 4,
            d_ff: 12,
            norm_eps: 1e-6,
            norm_style: NormStyle::Plain,
            act: Act::GeluTanh,
            attn_scale: 0.6,
            rope_style: RopeStyle::NeoX,
            mixer: BlockMixer::Nystrom { cfg: o1, tp: 20 },
        };
        let cfgs = vec![
            base,
            BlockConfig { mixer: BlockMixer::Exact { window: Some(6) }, ..base },
            BlockConfig { mixer: BlockMixer::Nystrom { cfg: o1, tp: 20 }, act: Act::Silu, ..base },
        ];
        let mut r = Rng(21);
        let layers = (0..3)
            .map(|l| {
                let gain = |r: &mut Rng, n: usize| -> Vec<f64> { (0..n).map(|_| 1.0 + 0.2 * r.normal()).collect() };
                let mut v: Named = vec![
                    ("attn_norm", gain(&mut r, D)),
                    ("wq", r.vec(8 * D, 0.5)),
                    ("wk", r.vec(4 * D, 0.5)),
                    ("wv", r.vec(4 * D, 0.5)),
                    ("wo", r.vec(D * 8, 0.4)),
                    ("ffn_norm", gain(&mut r, D)),
                    ("gate", r.vec(12 * D, 0.4)),
                    ("up", r.vec(12 * D, 0.4)),
                    ("down", r.vec(D * 12, 0.4)),
                ];
                if l == 2 {
                    v.extend([("q_norm", gain(&mut r, 4)), ("k_norm", gain(&mut r, 4))]);
                    v.extend([("post_attn_norm", gain(&mut r, D)), ("post_ffn_norm", gain(&mut r, D))]);
                }
                v
            })
            .collect();
        Owned {
            cfgs,
            train: vec![true, false, true],
            layers,
            embed: r.vec(V * D, 1.0),
            final_norm: (0..D).map(|_| 1.0 + 0.1 * r.normal()).collect(),
            rope: RopeTable::new(T, 4, 10_000.0),
        }
    }

    fn student(&self) -> Student<'_, f64> {
        Student {
            embed: &self.embed,
            embed_scale: Some((D as f64).sqrt()),
            layers: (0..3)
                .map(|l| StudentLayer {
                    cfg: self.cfgs[l],
                    w: weights(&self.layers[l]),
                    rope: &self.rope,
                    train: self.train[l],
                    train_vmf: false,
                })
                .collect(),
            final_norm: &self.final_norm,
            norm_style: NormStyle::Plain,
            norm_eps: 1e-6,
            lm_head: &self.embed, // tied
            vocab: V,
            d_model: D,
        }
    }
}

#[test]
fn checkpointed_student_step_gradcheck() {
    // Every position scored, then only those after the prompt (as `ppl --o1`).
    for score_from in [0, 20] {
        student_gradcheck(score_from);
    }
}

fn student_gradcheck(score_from: usize) {
    let mut own = Owned::new();
    let mut r = Rng(3);
    let tokens: Vec<u32> = (0..T).map(|_| (r.uniform() * V as f64) as u32).collect();
    let targets: Vec<u32> = tokens[1..].iter().copied().chain([0]).collect();
    let teacher = r.vec(T * V, 2.0);
    let s = own.student();
    let mut grads = StudentGrads::new(&s);
    assert!(grads.layers[1].is_none(), "a frozen layer got gradient buffers");
    let (out, plans) = s.step(&tokens, &teacher, &targets, LAMBDA, score_from, &mut grads).unwrap();
    let again = s.loss(&tokens, &teacher, &targets, LAMBDA, score_from, Some(&plans)).unwrap();
    println!("student (scored from {score_from}) step loss {:.15}, plain forward {:.15}", out.loss, again.loss);
    assert!((out.loss - again.loss).abs() < 1e-13, "checkpointed step and plain forward disagree");
    drop(s);
    let loss = |o: &Owned| o.student().loss(&tokens, &teacher, &targets, LAMBDA, score_from, Some(&plans)).unwrap().loss;
    let mut reps: Vec<Report> = Vec::new();
    for l in [0usize, 2] {
        let g = grads.layers[l].clone().unwrap();
        let mut named: Vec<(&str, Vec<f64>)> =
            vec![("attn_norm", g.attn_norm), ("ffn_norm", g.ffn_norm), ("gate", g.gate), ("up", g.up), ("down", g.down)];
        for (n, o) in
            [("q_norm", g.q_norm), ("k_norm", g.k_norm), ("post_attn_norm", g.post_attn_norm), ("post_ffn_norm", g.post_ffn_norm)]
        {
            if let Some(v) = o {
                named.push((n, v));
            }
        }
        for (n, an) in named {
            let idx = own.layers[l].iter().position(|(k, _)| *k == n).unwrap();
            let mut x = own.layers[l][idx].1.clone();
            reps.push(check(&format!("student s0={score_from} L{l}"), n, &mut x, &an, 1e-5, |xv| {
                own.layers[l][idx].1.copy_from_slice(xv);
                loss(&own)
            }));
            own.layers[l][idx].1.copy_from_slice(&x);
        }
    }
    let mut x = own.final_norm.clone();
    reps.push(check(&format!("student s0={score_from}"), "final_norm", &mut x, &grads.final_norm, 1e-5, |xv| {
        own.final_norm.copy_from_slice(xv);
        loss(&own)
    }));
    for rep in &reps {
        println!("{rep}");
    }
    for rep in &reps {
        assert!(rep.max_rel <= 1e-6, "{} {}: max rel err {:.3e} at {}", rep.op, rep.tensor, rep.max_rel, rep.at);
        assert!(rep.scale > 0.0, "{} {}: zero gradient", rep.op, rep.tensor);
    }
}

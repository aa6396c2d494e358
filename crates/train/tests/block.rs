//! The decoder block (block.rs) gradient-checked in f64 for the layer kinds the polish meets:
//! Gemma 3-like (QKV bias, QK-norm, post-norms, GELU-tanh, (1+w) gains) served by Nyström with
//! the guard active; Llama-like (SiLU, interleaved partial RoPE) exact; a sliding-window layer
//! with QK-norm; a layer served by sink+window and the learned far field (stage 2); a layer
//! converted to vmf_phase, plain and with the window option (every one of its parameters). Gradients
//! w.r.t. the block input and every trainable tensor; M frozen.

use cortiq_train::act::Act;
use cortiq_train::block::{BlockActs, BlockConfig, BlockGrads, BlockMixer, BlockWeights, block_backward, block_forward};
use cortiq_train::farfield::{FarParams, FarShape};
use cortiq_train::gradcheck::{Report, Rng, check};
use cortiq_train::norm::NormStyle;
use cortiq_train::nystrom::{DEFAULT_RIDGE, Far, NystromPlan, O1Config};
use cortiq_train::rope::{RopeStyle, RopeTable};
use cortiq_train::vmf::{VmfParams, VmfShape};
use cortiq_train::vmf_window::{VmfLayer, WinParams, WinShape};

const T: usize = 40;

/// Every tensor of a block, by name (trainable ones listed in TRAIN).
struct Tensors {
    v: Vec<(&'static str, Vec<f64>)>,
    far: Option<FarParams<f64>>,
    vmf: Option<VmfLayer<f64>>,
}

const TRAIN: [&str; 9] = ["attn_norm", "q_norm", "k_norm", "post_attn_norm", "ffn_norm", "gate", "up", "down", "post_ffn_norm"];

impl Tensors {
    fn get(&self, n: &str) -> Option<&[f64]> {
        self.v.iter().find(|(k, _)| *k == n).map(|(_, x)| &x[..])
    }
    fn get_mut(&mut self, n: &str) -> &mut Vec<f64> {
        &mut self.v.iter_mut().find(|(k, _)| *k == n).expect("tensor").1
    }
    fn weights(&self) -> BlockWeights<'_, f64> {
        let g = |n| self.get(n).expect(n);
        BlockWeights {
            attn_norm: g("attn_norm"),
            wq: g("wq"),
            wk: g("wk"),
            wv: g("wv"),
            bq: self.get("bq"),
            bk: self.get("bk"),
            bv: self.get("bv"),
            q_norm: self.get("q_norm"),
            k_norm: self.get("k_norm"),
            wo: g("wo"),
            post_attn_norm: self.get("post_attn_norm"),
            ffn_norm: g("ffn_norm"),
            gate: g("gate"),
            up: g("up"),
            down: g("down"),
            post_ffn_norm: self.get("post_ffn_norm"),
            far: self.far.as_ref(),
            vmf: self.vmf.as_ref(),
        }
    }
}

fn make(cfg: &BlockConfig, bias: bool, qk_norm: bool, post: bool, seed: u64) -> Tensors {
    let (d, qd, kd, ff, hd) = (cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.d_ff, cfg.head_dim);
    let mut r = Rng(seed);
    let gain = |r: &mut Rng, n: usize| -> Vec<f64> {
        match cfg.norm_style {
            NormStyle::Plain => (0..n).map(|_| 1.0 + 0.2 * r.normal()).collect(),
            NormStyle::OnePlus => r.vec(n, 0.2),
        }
    };
    let mut v = vec![
        ("attn_norm", gain(&mut r, d)),
        ("wq", r.vec(qd * d, 0.5)),
        ("wk", r.vec(kd * d, 0.5)),
        ("wv", r.vec(kd * d, 0.5)),
        ("wo", r.vec(d * qd, 0.4)),
        ("ffn_norm", gain(&mut r, d)),
        ("gate", r.vec(ff * d, 0.4)),
        ("up", r.vec(ff * d, 0.4)),
        ("down", r.vec(d * ff, 0.4)),
    ];
    if bias {
        v.extend([("bq", r.vec(qd, 0.3)), ("bk", r.vec(kd, 0.3)), ("bv", r.vec(kd, 0.3))]);
    }
    if qk_norm {
        v.extend([("q_norm", gain(&mut r, hd)), ("k_norm", gain(&mut r, hd))]);
    }
    if post {
        v.extend([("post_attn_norm", gain(&mut r, d)), ("post_ffn_norm", gain(&mut r, d))]);
    }
    let far = match cfg.mixer {
        BlockMixer::Far { sinks, window, .. } => {
            let s =
                FarShape { t: T, n_heads: cfg.n_heads, n_kv: cfg.n_kv_heads, hd, rank: 3, sinks, window, scale: cfg.attn_scale };
            Some(FarParams::random(&s, &mut r))
        }
        _ => None,
    };
    let core = |sh: VmfShape, r: &mut Rng| {
        let (p, nh, ns, dv) = (sh.nphase, sh.n_heads, sh.n_states, sh.dv);
        VmfParams {
            thq: r.vec(nh * p * d, 0.5),
            thq_b: r.vec(nh * p, 0.3),
            thk: r.vec(ns * p * d, 0.5),
            thk_b: r.vec(ns * p, 0.3),
            v: r.vec(ns * dv * d, 0.5),
            out: r.vec(d * nh * dv, 0.4),
            out_b: r.vec(d, 0.2),
            a_log: (0..ns * 2 * p).map(|_| -2.0 + 2.0 * r.uniform()).collect(),
            conv: r.vec(d * sh.conv_kernel, 0.6),
            kg_w: r.vec(ns * d, 0.5),
            kg_b: r.vec(ns, 0.3),
            mass: (0..ns).map(|_| 0.3 * r.uniform()).collect(),
            o_norm: (0..nh * dv).map(|_| 0.5 + r.uniform()).collect(),
        }
    };
    let vmf = match cfg.mixer {
        BlockMixer::Vmf(sh) => Some(VmfLayer::Plain(core(sh, &mut r))),
        BlockMixer::VmfWin(sh) => {
            let (nh, nk, hd) = (sh.core.n_heads, sh.core.n_states, sh.core.dv);
            let core = core(sh.core, &mut r);
            Some(VmfLayer::Window(WinParams {
                core,
                wq: r.vec(nh * hd * d, 0.5),
                bq: r.vec(nh * hd, 0.3),
                wk: r.vec(nk * hd * d, 0.5),
                bk: r.vec(nk * hd, 0.3),
                bv: r.vec(nk * hd, 0.3),
                wb: r.vec(nh * d, 0.5),
                cb: r.vec(nh, 0.5),
            }))
        }
        _ => None,
    };
    Tensors { v, far, vmf }
}

fn run(name: &str, cfg: BlockConfig, rope: RopeTable<f64>, bias: bool, qk_norm: bool, post: bool) -> Vec<Report> {
    let mut ts = make(&cfg, bias, qk_norm, post, 5);
    let mut rng = Rng(6);
    let mut x = rng.vec(T * cfg.d_model, 1.0);
    let r = rng.vec(T * cfg.d_model, 1.0);
    let mut plan: Option<NystromPlan> = None;
    let mut acts = BlockActs::default();
    let mut y = vec![0.0; x.len()];
    block_forward(&cfg, &ts.weights(), &rope, &mut plan, &x, &mut y, &mut acts).unwrap();
    let base_drop = acts.dropped.clone();
    if let BlockMixer::Nystrom { .. } = cfg.mixer {
        let n = base_drop.iter().filter(|&&b| b).count();
        println!("{name}: the guard drops {n} rows");
        assert!(plan.as_ref().unwrap().skeleton, "{name}: no skeleton sealed");
    }
    // Analytic gradients (buffers pre-filled with 0.5 to catch a backward that writes).
    let mut grads: Vec<(&str, Vec<f64>)> = TRAIN.iter().filter_map(|&n| ts.get(n).map(|t| (n, vec![0.5; t.len()]))).collect();
    let mut dx = vec![0.5; x.len()];
    let mut far_grads = ts.far.as_ref().map(|p| p.map(|_| 0.5));
    let mut vmf_grads = ts.vmf.as_ref().map(|p| {
        let mut g = p.zeros_like();
        g.tensors_mut().into_iter().for_each(|(_, t)| t.iter_mut().for_each(|x| *x = 0.5));
        g
    });
    {
        let mut g = BlockGrads { far: far_grads.as_mut(), vmf: vmf_grads.as_mut(), ..BlockGrads::default() };
        for (n, buf) in grads.iter_mut() {
            let slot = Some(&mut buf[..]);
            match *n {
                "attn_norm" => g.attn_norm = slot,
                "q_norm" => g.q_norm = slot,
                "k_norm" => g.k_norm = slot,
                "post_attn_norm" => g.post_attn_norm = slot,
                "ffn_norm" => g.ffn_norm = slot,
                "gate" => g.gate = slot,
                "up" => g.up = slot,
                "down" => g.down = slot,
                _ => g.post_ffn_norm = slot,
            }
        }
        block_backward(&cfg, &ts.weights(), &rope, plan.as_ref(), &x, &acts, &r, &mut dx, g);
    }
    let loss = |ts: &Tensors, x: &[f64]| {
        let mut p = plan.clone();
        let (mut a, mut y) = (BlockActs::default(), vec![0.0; x.len()]);
        block_forward(&cfg, &ts.weights(), &rope, &mut p, x, &mut y, &mut a).unwrap();
        assert_eq!(a.dropped, base_drop, "{name}: a finite-difference step crossed the aggregate guard");
        y.iter().zip(&r).map(|(a, b)| a * b).sum::<f64>()
    };
    let unpre = |g: &[f64]| g.iter().map(|v| v - 0.5).collect::<Vec<f64>>();
    let mut reps = vec![check(name, "x", &mut x, &unpre(&dx), 1e-4, |xv| loss(&ts, xv))];
    for (n, g) in &grads {
        let mut t0 = ts.get(n).unwrap().to_vec();
        reps.push(check(name, n, &mut t0, &unpre(g), 1e-4, |tv| {
            ts.get_mut(n).copy_from_slice(tv);
            loss(&ts, &x)
        }));
        ts.get_mut(n).copy_from_slice(&t0);
    }
    let names = ["far U", "far alpha", "far gamma_q", "far W", "far beta", "far gamma_k", "far rho"];
    for (i, fg) in far_grads.iter().flat_map(|g| g.tensors()).enumerate() {
        let mut t0 = ts.far.as_ref().unwrap().tensors()[i].to_vec();
        reps.push(check(name, names[i], &mut t0, &unpre(fg), 1e-4, |tv| {
            *ts.far.as_mut().unwrap().tensors_mut()[i] = tv.to_vec();
            loss(&ts, &x)
        }));
        *ts.far.as_mut().unwrap().tensors_mut()[i] = t0;
    }
    if let Some(vg) = vmf_grads.as_mut() {
        for (i, (n, g)) in vg.tensors_mut().into_iter().enumerate() {
            let mut t0 = ts.vmf.as_mut().unwrap().tensors_mut()[i].1.clone();
            reps.push(check(name, n, &mut t0, &unpre(g), 1e-4, |tv| {
                *ts.vmf.as_mut().unwrap().tensors_mut()[i].1 = tv.to_vec();
                loss(&ts, &x)
            }));
            *ts.vmf.as_mut().unwrap().tensors_mut()[i].1 = t0;
        }
    }
    reps
}

#[test]
fn gradcheck_blocks() {
    let o1 = O1Config { window: 4, sinks: 1, landmarks: 4, ridge: DEFAULT_RIDGE, far: Far::Skeleton };
    let base = BlockConfig {
        d_model: 8,
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 4,
        d_ff: 10,
        norm_eps: 1e-6,
        norm_style: NormStyle::OnePlus,
        act: Act::GeluTanh,
        attn_scale: 1.5 / 2.0,
        rope_style: RopeStyle::NeoX,
        mixer: BlockMixer::Nystrom { cfg: o1, tp: 20 },
    };
    let mut reps = run("block gemma-like nystrom", base, RopeTable::new(T, 4, 10_000.0), true, true, true);
    let llama = BlockConfig {
        norm_style: NormStyle::Plain,
        act: Act::Silu,
        rope_style: RopeStyle::Interleaved,
        mixer: BlockMixer::Exact { window: None },
        head_dim: 6,
        n_heads: 3,
        n_kv_heads: 3,
        ..base
    };
    reps.extend(run("block llama-like exact", llama, RopeTable::new(T, 4, 500.0), false, false, false));
    let local = BlockConfig { mixer: BlockMixer::Exact { window: Some(5) }, ..base };
    reps.extend(run("block sliding qk-norm", local, RopeTable::new(T, 4, 10_000.0), false, true, true));
    let far = BlockConfig { mixer: BlockMixer::Far { tp: 20, sinks: 1, window: 6, schedule: None }, ..llama };
    reps.extend(run("block llama-like far", far, RopeTable::new(T, 4, 500.0), true, false, false));
    let sh = VmfShape { d_model: 8, n_heads: 3, n_states: 3, nphase: 3, dv: 6, conv_kernel: 3, k_gate: true, phase_bias: true };
    let vmf = BlockConfig { mixer: BlockMixer::Vmf(sh), ..llama };
    reps.extend(run("block vmf_phase", vmf, RopeTable::new(T, 4, 500.0), false, false, false));
    let wsh = WinShape { core: sh, sinks: 2, window: 6, scale: llama.attn_scale, rope: llama.rope_style };
    let win = BlockConfig { mixer: BlockMixer::VmfWin(wsh), ..llama };
    reps.extend(run("block vmf_phase window", win, RopeTable::new(T, 4, 500.0), false, false, false));
    for rep in &reps {
        println!("{rep}");
    }
    for rep in &reps {
        assert!(rep.max_rel <= 1e-6, "{} {}: max rel err {:.3e} at {}", rep.op, rep.tensor, rep.max_rel, rep.at);
        assert!(rep.scale > 0.0, "{} {}: zero gradient", rep.op, rep.tensor);
    }
}

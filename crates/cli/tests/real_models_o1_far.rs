//! The learned far field (`--o1-far linear`): the engine's streaming state
//! (`cortiq_engine::o1::farfield`, running offsets, f32 state) against the trainer's
//! teacher-forced form (`cortiq_train::farfield`, f64) on a real model (SmolLM2-135M), every
//! planned layer: the same q, k and v give the same attention output within 1e-5 relative, on
//! the positions after the seal (the prompt's far keys absorbed at once) and past it (one key
//! absorbed per step). The feature maps are random, scaled as the trainer starts them and then
//! spread, so every feature carries mass; every feature decays (the trainer's starting rates,
//! time scales 32 to 2800 positions). A model absent from the cache is a failure.

use std::collections::HashMap;
use std::sync::Arc;

use cortiq_engine::Logits;
use cortiq_engine::Numerics;
use cortiq_engine::load::load;
use cortiq_engine::o1::O1Plan;
use cortiq_engine::o1::farfield::FarWeights;
use cortiq_engine::o1::nystrom::{Far, O1Settings};
use cortiq_train::farfield::{FarShape, LayerSeq, far_forward, init_params};
use cortiq_train::gradcheck::Rng;

const T: usize = 700;
const TP: usize = 400;
const WINDOW: usize = 60;
const SINKS: usize = 4;
const RANK: usize = 8;

/// One forward over `ids` recording, per layer, q, k, v and the attention output.
fn record(
    m: &cortiq_engine::model::Model,
    st: &mut cortiq_engine::state::SeqState,
    ids: &[u32],
) -> HashMap<usize, [Vec<f32>; 4]> {
    let mut rec: HashMap<usize, [Vec<f32>; 4]> = HashMap::new();
    m.forward_traced(ids, st, Logits::None, &mut |name, il, x| {
        let slot = match name {
            "q" => 0,
            "k" => 1,
            "v" => 2,
            "attn_out" => 3,
            _ => return,
        };
        rec.entry(il).or_default()[slot].extend_from_slice(x);
    })
    .expect("forward");
    rec
}

#[test]
fn real_smollm2_far_field_streaming_equals_teacher_forced() {
    check(false);
}

/// The same with the windows split by curves (each planned layer its own window, the same
/// total): each layer's teacher-forced form at its own window.
#[test]
fn real_smollm2_far_field_split_windows_streaming_equals_teacher_forced() {
    check(true);
}

fn check(split: bool) {
    let path = cortiq_testkit::real_model("smollm2-135m");
    let mut loaded = load(&path).expect("load");
    loaded.model.set_numerics(Numerics::Exact);
    let text = std::fs::read_to_string(cortiq_testkit::real_text("alice29.txt")).expect("alice29");
    let tok = loaded.tokenizer().expect("tokenizer");
    let ids: Vec<u32> = tok.encode_with(&text, false, false).expect("encode")[..T].to_vec();
    let cfg = loaded.model.cfg.clone();
    let (nh, nkv, hd) = (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim);
    let s = FarShape { t: T, n_heads: nh, n_kv: nkv, hd, rank: RANK, sinks: SINKS, window: WINDOW, scale: cfg.attn_scale as f64 };
    let planned = loaded.model.o1_planned_layers();

    // Feature maps per layer from an exact run's statistics, spread so every feature matters.
    let mut st = loaded.model.new_state(T);
    let exact = record(&loaded.model, &mut st, &ids);
    let mut rng = Rng(0xFA2);
    let mut weights = vec![None; cfg.n_layers];
    for &il in &planned {
        let [q, k, v, y] = exact[&il].clone();
        let data = [LayerSeq::new(&s, q, k, v, y)];
        let mut p = init_params(&s, &data, il as u64, true);
        p.u.iter_mut().chain(p.w.iter_mut()).for_each(|x| *x *= 3.0);
        p.alpha.iter_mut().chain(p.beta.iter_mut()).for_each(|x| *x += rng.normal());
        let p = p.map(|x| x as f32);
        let [u, alpha, gq, w, beta, gk, _] = p.tensors().map(|t| t.to_vec());
        let fw = FarWeights::from_tensors(RANK, nh, nkv, hd, [u, alpha, gq, w, beta, gk])
            .and_then(|fw| fw.with_decay(p.decay()))
            .expect("shapes");
        assert!(fw.decay.iter().all(|&d| d > 0.0), "every feature decays");
        weights[il] = Some(Arc::new(fw));
    }
    loaded.model.o1_far = weights;
    // Curves whose error falls at three different rates: the windows come out 16 to a few
    // hundred, summing to WINDOW per layer.
    let mut windows: HashMap<usize, usize> = planned.iter().map(|&il| (il, WINDOW)).collect();
    if split {
        let curves =
            planned.iter().map(|&il| (1..=64).map(|j| ((il % 3 + 1) as f32 * (64 - j) as f32).max(0.0)).collect()).collect();
        let sp = cortiq_engine::o1::O1Split { step: 8, layers: planned.clone(), curves };
        windows = sp.windows(WINDOW).into_iter().collect();
        println!("split windows: {windows:?}");
        assert!(windows.values().any(|&w| w != WINDOW));
        loaded.model.o1_split = Some(Arc::new(sp));
    }

    // The streaming run: exact prompt of TP tokens, sealed, then every position a step.
    let settings = O1Settings { window: WINDOW, sinks: SINKS, landmarks: 4, ..O1Settings::default() };
    let plan = O1Plan { tp: TP, settings, far: Far::Linear(None), check: None, split };
    let mut st = loaded.model.new_state_o1(T, plan).expect("plan");
    let mut rec = record(&loaded.model, &mut st, &ids[..TP]);
    for (il, r) in record(&loaded.model, &mut st, &ids[TP..]) {
        let e = rec.get_mut(&il).expect("layer");
        for (a, b) in e.iter_mut().zip(r) {
            a.extend(b);
        }
    }

    let mut worst = 0f64;
    for &il in &planned {
        let [q, k, v, y] = &rec[&il];
        let f = |x: &Vec<f32>| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
        let fw = loaded.model.o1_far[il].as_ref().expect("weights");
        let p = cortiq_train::farfield::FarParams {
            u: f(&fw.u),
            alpha: f(&fw.alpha),
            gq: f(&fw.gq),
            w: f(&fw.w),
            beta: f(&fw.beta),
            gk: f(&fw.gk),
            rho: fw.decay.iter().map(|&d| (d as f64).ln()).collect(),
        };
        let (q, k, v) = (f(q), f(k), f(v));
        let s = FarShape { window: windows[&il], ..s };
        let near = cortiq_train::farfield::near_part(&s, &q, &k, &v);
        let mut o = vec![0.0; q.len()];
        far_forward(&s, &p, &near, &q, &k, &v, &mut o);
        let from = TP * nh * hd;
        let scale = o[from..].iter().fold(0f64, |m, x| m.max(x.abs()));
        let md = o[from..].iter().zip(&y[from..]).fold(0f64, |m, (a, &b)| m.max((a - b as f64).abs()));
        // The far field is live on this layer: it moves the output away from sink+window's.
        let sw = near.output(hd);
        let moved = o[from..].iter().zip(&sw[from..]).fold(0f64, |m, (a, b)| m.max((a - b).abs()));
        let rel = md / scale;
        println!(
            "layer {il}: max |streaming − teacher-forced| {md:.3e} (relative {rel:.3e}); far field moves the output by {moved:.3e}"
        );
        assert!(moved > 1e-3 * scale, "layer {il}: the far field does nothing ({moved:.3e}), the check would be empty");
        worst = worst.max(rel);
    }
    println!("worst relative difference over {} layers: {worst:.3e}", planned.len());
    assert!(worst <= 1e-5, "streaming and teacher-forced far field differ by {worst:.3e} relative");
}

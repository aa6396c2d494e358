//! The f32 instantiation of every op (the one that trains) against the f64 one (the one the
//! gradient check validates) on the same inputs: outputs and gradients agree to f32 rounding.
//! Error measure: max |f32 − f64| / max |f64| over the tensor, printed with where.

use cortiq_testkit::{max_abs_diff_f64, max_err};
use cortiq_train::Float;
use cortiq_train::act::{self, Act, FfnActs, FfnGrads, FfnWeights};
use cortiq_train::attention::{AttnShape, attention_backward, attention_forward};
use cortiq_train::delta::{DeltaCheckpoints, DeltaGrads, DeltaShape, delta_backward, delta_forward};
use cortiq_train::gradcheck::Rng;
use cortiq_train::loss::{distill_loss_backward, distill_loss_forward};
use cortiq_train::norm::{NormStyle, rmsnorm_backward, rmsnorm_forward};
use cortiq_train::nystrom::{DEFAULT_RIDGE, Far, NyShape, O1Config, nystrom_backward, nystrom_forward, nystrom_plan};
use cortiq_train::rope::{RopeStyle, RopeTable, rope_backward, rope_forward};

fn narrow(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&v| v as f32).collect()
}

/// Asserts max |a − b| / max |b| ≤ tol and prints it.
fn agree(what: &str, a: &[f32], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let scale = max_err(b.iter().map(|x| x.abs())).max(1e-300);
    // NaN-propagating (cortiq-testkit): a NaN on either side makes d NaN and fails the bound.
    let wide: Vec<f64> = a.iter().map(|&x| x as f64).collect();
    let (d, i) = max_abs_diff_f64(&wide, b);
    println!("f32 vs f64 {what:<28} max |diff|/scale {:.3e} at {i} (scale {scale:.3e})", d / scale);
    assert!(
        d / scale <= tol && a.iter().all(|x| x.is_finite()),
        "{what}: f32 differs from f64 by {:.3e} of scale at {i}",
        d / scale
    );
}

#[test]
fn ffn_and_norm_f32() {
    let (t, d, ff) = (70, 48, 80); // past the f32 kernels' 4/16/32 tiles
    let mut r = Rng(1);
    let (x, wg, wu, wd, dy) = (r.vec(t * d, 1.0), r.vec(ff * d, 0.2), r.vec(ff * d, 0.2), r.vec(d * ff, 0.2), r.vec(t * d, 1.0));
    #[allow(clippy::too_many_arguments)]
    fn run<F: Float>(x: &[F], wg: &[F], wu: &[F], wd: &[F], dy: &[F], t: usize, d: usize, ff: usize) -> [Vec<F>; 5] {
        let w = FfnWeights { gate: wg, up: wu, down: wd };
        let (mut acts, mut y) = (FfnActs::default(), vec![F::ZERO; t * d]);
        act::ffn_forward(Act::GeluTanh, w, x, &mut acts, &mut y, t, d, ff);
        let (mut dx, mut dg, mut du, mut dd) =
            (vec![F::ZERO; t * d], vec![F::ZERO; ff * d], vec![F::ZERO; ff * d], vec![F::ZERO; d * ff]);
        let g = FfnGrads { gate: Some(&mut dg[..]), up: Some(&mut du[..]), down: Some(&mut dd[..]) };
        act::ffn_backward(Act::GeluTanh, w, x, &acts, dy, Some(&mut dx), g, t, d, ff);
        [y, dx, dg, du, dd]
    }
    let a = run(&narrow(&x), &narrow(&wg), &narrow(&wu), &narrow(&wd), &narrow(&dy), t, d, ff);
    let b = run(&x, &wg, &wu, &wd, &dy, t, d, ff);
    for (n, (p, q)) in ["ffn y", "ffn dx", "ffn dW_gate", "ffn dW_up", "ffn dW_down"].iter().zip(a.iter().zip(&b)) {
        agree(n, p, q, 2e-5);
    }
    for style in [NormStyle::Plain, NormStyle::OnePlus] {
        let w = r.vec(d, 0.5);
        fn norm<F: Float>(style: NormStyle, x: &[F], w: &[F], dy: &[F], d: usize) -> [Vec<F>; 3] {
            let rows = x.len() / d;
            let (mut y, mut rs, mut dx, mut dw) =
                (vec![F::ZERO; x.len()], vec![0.0; rows], vec![F::ZERO; x.len()], vec![F::ZERO; d]);
            rmsnorm_forward(style, x, w, 1e-6, &mut y, &mut rs);
            rmsnorm_backward(style, x, w, &rs, dy, Some(&mut dx), Some(&mut dw));
            [y, dx, dw]
        }
        let a = norm(style, &narrow(&x), &narrow(&w), &narrow(&dy), d);
        let b = norm(style, &x, &w, &dy, d);
        for (n, (p, q)) in ["rmsnorm y", "rmsnorm dx", "rmsnorm dw"].iter().zip(a.iter().zip(&b)) {
            agree(&format!("{n} {style:?}"), p, q, 1e-5);
        }
    }
    let table64 = RopeTable::<f64>::new(t, 32, 10_000.0);
    let table32 = RopeTable::<f32>::new(t, 32, 10_000.0);
    let (mut y32, mut y64) = (vec![0f32; t * d], vec![0f64; t * d]);
    rope_forward(RopeStyle::NeoX, &table32, &narrow(&x), &mut y32, 1, d);
    rope_forward(RopeStyle::NeoX, &table64, &x, &mut y64, 1, d);
    agree("rope y", &y32, &y64, 1e-6);
    let (mut d32, mut d64) = (vec![0f32; t * d], vec![0f64; t * d]);
    rope_backward(RopeStyle::Interleaved, &table32, &narrow(&dy), &mut d32, 1, d);
    rope_backward(RopeStyle::Interleaved, &table64, &dy, &mut d64, 1, d);
    agree("rope dx", &d32, &d64, 1e-6);
}

#[test]
fn attention_nystrom_delta_loss_f32() {
    let (t, nh, nkv, hd) = (150, 4, 2, 16);
    let mut r = Rng(2);
    let (q, k, v, d_o) = (r.vec(t * nh * hd, 1.0), r.vec(t * nkv * hd, 1.0), r.vec(t * nkv * hd, 1.0), r.vec(t * nh * hd, 1.0));
    let scale = 1.0 / (hd as f64).sqrt();
    fn attn<F: Float>(sh: &AttnShape, q: &[F], k: &[F], v: &[F], d_o: &[F]) -> [Vec<F>; 4] {
        let (mut o, mut lse) = (vec![F::ZERO; q.len()], vec![0.0; q.len() / sh.head_dim]);
        attention_forward(sh, q, k, v, &mut o, &mut lse);
        let (mut dq, mut dk, mut dv) = (vec![F::ZERO; q.len()], vec![F::ZERO; k.len()], vec![F::ZERO; v.len()]);
        attention_backward(sh, q, k, v, &o, &lse, d_o, &mut dq, &mut dk, &mut dv);
        [o, dq, dk, dv]
    }
    let sh = AttnShape { n_heads: nh, n_kv_heads: nkv, head_dim: hd, scale, window: Some(40) };
    let a = attn(&sh, &narrow(&q), &narrow(&k), &narrow(&v), &narrow(&d_o));
    let b = attn(&sh, &q, &k, &v, &d_o);
    for (n, (p, x)) in ["attention o", "attention dq", "attention dk", "attention dv"].iter().zip(a.iter().zip(&b)) {
        agree(n, p, x, 1e-5);
    }
    let cfg = O1Config { window: 16, sinks: 4, landmarks: 12, ridge: DEFAULT_RIDGE, far: Far::Skeleton };
    let ny = NyShape { n_heads: nh, n_kv_heads: nkv, head_dim: hd, scale, tp: 80 };
    fn nys<F: Float>(cfg: &O1Config, ny: &NyShape, q: &[F], k: &[F], v: &[F], d_o: &[F]) -> [Vec<F>; 4] {
        let plan = nystrom_plan(cfg, ny, q, k).unwrap();
        let (mut o, mut dr) = (vec![F::ZERO; q.len()], vec![false; q.len() / ny.head_dim]);
        nystrom_forward(cfg, &plan, ny, q, k, v, &mut o, &mut dr);
        let (mut dq, mut dk, mut dv) = (vec![F::ZERO; q.len()], vec![F::ZERO; k.len()], vec![F::ZERO; v.len()]);
        nystrom_backward(cfg, &plan, ny, q, k, v, d_o, &mut dq, &mut dk, &mut dv);
        [o, dq, dk, dv]
    }
    // Same f32-rounded inputs on both sides: the Nyström internals are f64 either way, so this
    // measures only the f32 output rounding.
    let (q32, k32, v32, do32) = (narrow(&q), narrow(&k), narrow(&v), narrow(&d_o));
    let wide = |x: &[f32]| x.iter().map(|&a| a as f64).collect::<Vec<f64>>();
    let a = nys(&cfg, &ny, &q32, &k32, &v32, &do32);
    let b = nys(&cfg, &ny, &wide(&q32), &wide(&k32), &wide(&v32), &wide(&do32));
    for (n, (p, x)) in ["nystrom o", "nystrom dq", "nystrom dk", "nystrom dv"].iter().zip(a.iter().zip(&b)) {
        agree(n, p, x, 1e-6);
    }
    // Gated delta rule over 130 steps (three checkpoint spans).
    let ds = DeltaShape { n_heads: 2, dk: 8, dv: 8 };
    let n = 130 * 2;
    let unit = |x: Vec<f64>, s: f64| -> Vec<f64> {
        x.chunks(8)
            .flat_map(|c| {
                let z = c.iter().map(|a| a * a).sum::<f64>().sqrt();
                c.iter().map(move |a| a / z * s).collect::<Vec<_>>()
            })
            .collect()
    };
    let (dq_, dk_, dv_) = (unit(r.vec(n * 8, 1.0), 0.35), unit(r.vec(n * 8, 1.0), 1.0), r.vec(n * 8, 1.0));
    let g: Vec<f64> = (0..n).map(|_| -0.02 - 0.2 * r.uniform()).collect();
    let beta: Vec<f64> = (0..n).map(|_| 0.1 + 0.8 * r.uniform()).collect();
    let dout = r.vec(n * 8, 1.0);
    fn delta<F: Float>(sh: &DeltaShape, q: &[F], k: &[F], v: &[F], g: &[F], b: &[F], d_o: &[F]) -> [Vec<F>; 6] {
        let mut o = vec![F::ZERO; v.len()];
        let mut ck = DeltaCheckpoints::default();
        delta_forward(sh, q, k, v, g, b, &mut o, &mut ck);
        let (mut dq, mut dk, mut dv, mut dg, mut db) = (
            vec![F::ZERO; q.len()],
            vec![F::ZERO; k.len()],
            vec![F::ZERO; v.len()],
            vec![F::ZERO; g.len()],
            vec![F::ZERO; b.len()],
        );
        delta_backward(
            sh,
            q,
            k,
            v,
            g,
            b,
            &ck,
            d_o,
            DeltaGrads { dq: &mut dq, dk: &mut dk, dv: &mut dv, dg: &mut dg, dbeta: &mut db },
        );
        [o, dq, dk, dv, dg, db]
    }
    let a = delta(&ds, &narrow(&dq_), &narrow(&dk_), &narrow(&dv_), &narrow(&g), &narrow(&beta), &narrow(&dout));
    let b = delta(&ds, &dq_, &dk_, &dv_, &g, &beta, &dout);
    for (nm, (p, x)) in ["delta o", "delta dq", "delta dk", "delta dv", "delta dg", "delta dbeta"].iter().zip(a.iter().zip(&b)) {
        agree(nm, p, x, 2e-5);
    }
    // Loss over a wide vocabulary: f64 softmax either way.
    let (nn, vocab) = (6, 5000);
    let (s, tch) = (r.vec(nn * vocab, 3.0), r.vec(nn * vocab, 3.0));
    let tg: Vec<u32> = (0..nn as u32).map(|i| i * 611 % vocab as u32).collect();
    let (s32, t32) = (narrow(&s), narrow(&tch));
    let (sw, tw) = (wide(&s32), wide(&t32));
    let (l32, l64) = (distill_loss_forward(&s32, &t32, &tg, vocab, 0.5), distill_loss_forward(&sw, &tw, &tg, vocab, 0.5));
    println!("f32 vs f64 loss {:.12} vs {:.12}", l32.loss, l64.loss);
    assert_eq!(l32, l64, "the loss is computed in f64 from the same values");
    let (mut g32, mut g64) = (vec![0f32; s.len()], vec![0f64; s.len()]);
    distill_loss_backward(&s32, &t32, &tg, vocab, 0.5, 1.0, &mut g32);
    distill_loss_backward(&sw, &tw, &tg, vocab, 0.5, 1.0, &mut g64);
    agree("loss dlogits", &g32, &g64, 1e-6);
}

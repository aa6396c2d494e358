//! Issue 6, acceptance 1 (op level): every op's backward against central finite differences in
//! f64 (fourth-order central differences, h = 1e-4·max(|x|, 1) rounded to a power of two), max relative error ≤ 1e-6 per input and parameter gradient (printed per op: name, worst
//! relative error, where). Each check uses the loss L = Σ r ⊙ y with a fixed random r, so the
//! backward gets dy = r; gradient buffers start at 0.5 (subtracted before comparing) so a
//! backward that writes instead of accumulating fails.
//! Run: `cargo test --release -p cortiq-train --test gradcheck -- --nocapture`.

use cortiq_testkit::max_abs_diff_f64;
use cortiq_train::act::{self, Act, FfnActs, FfnGrads, FfnWeights};
use cortiq_train::attention::{AttnShape, attention_backward, attention_forward};
use cortiq_train::delta::{DeltaCheckpoints, DeltaGrads, DeltaShape, delta_backward, delta_forward};
use cortiq_train::gradcheck::{Report, Rng, check};
use cortiq_train::landmark::{segment_means_backward, segment_means_forward};
use cortiq_train::loss::{distill_loss_backward, distill_loss_forward};
use cortiq_train::matmul::{linear_backward, linear_forward};
use cortiq_train::norm::{NormStyle, rmsnorm_backward, rmsnorm_forward};
use cortiq_train::nystrom::{DEFAULT_RIDGE, Far, NyShape, O1Config, nystrom_backward, nystrom_forward, nystrom_plan};
use cortiq_train::rope::{RopeStyle, RopeTable, rope_backward, rope_forward};

const TOL: f64 = 1e-6;
const EPS: f64 = 1e-4;
const PRE: f64 = 0.5;

fn grad_buf(n: usize) -> Vec<f64> {
    vec![PRE; n]
}

/// Removes the pre-fill (see the file header).
fn unpre(g: &[f64]) -> Vec<f64> {
    g.iter().map(|x| x - PRE).collect()
}

fn dotr(r: &[f64], y: &[f64]) -> f64 {
    r.iter().zip(y).map(|(a, b)| a * b).sum()
}

fn assert_all(reports: &[Report]) {
    for r in reports {
        println!("{r}");
    }
    for r in reports {
        assert!(
            r.max_rel <= TOL,
            "{} {}: max rel err {:.3e} > {TOL:e} at {} (analytic {}, numeric {})",
            r.op,
            r.tensor,
            r.max_rel,
            r.at,
            r.analytic,
            r.numeric
        );
        assert!(r.scale > 0.0, "{} {}: gradient identically zero; the check exercises nothing", r.op, r.tensor);
    }
}

#[test]
fn gradcheck_matmul() {
    let (t, din, dout) = (5, 7, 6);
    let mut rng = Rng(1);
    let (mut x, mut w, r) = (rng.vec(t * din, 1.0), rng.vec(dout * din, 1.0), rng.vec(t * dout, 1.0));
    let loss = |x: &[f64], w: &[f64]| {
        let mut y = vec![0.0; t * dout];
        linear_forward(x, w, &mut y, t, din, dout);
        dotr(&r, &y)
    };
    let (mut dx, mut dw) = (grad_buf(t * din), grad_buf(dout * din));
    linear_backward(&r, &x, &w, Some(&mut dx), Some(&mut dw), t, din, dout);
    let wc = w.clone();
    let a = check("matmul", "x", &mut x, &unpre(&dx), EPS, |x| loss(x, &wc));
    let xc = x.clone();
    let b = check("matmul", "W", &mut w, &unpre(&dw), EPS, |w| loss(&xc, w));
    assert_all(&[a, b]);
}

#[test]
fn gradcheck_activations_and_gated() {
    let mut reps = Vec::new();
    for (act, name) in [(Act::Silu, "silu"), (Act::GeluTanh, "gelu_tanh")] {
        let n = 40;
        let mut rng = Rng(2);
        let (mut x, r) = (rng.vec(n, 2.0), rng.vec(n, 1.0));
        let mut dx = grad_buf(n);
        act::act_backward(act, &x, &r, &mut dx);
        reps.push(check(name, "x", &mut x, &unpre(&dx), EPS, |x| {
            let mut y = vec![0.0; n];
            act::act_forward(act, x, &mut y);
            dotr(&r, &y)
        }));
        let (mut g, mut u) = (rng.vec(n, 2.0), rng.vec(n, 1.0));
        let (mut dg, mut du) = (grad_buf(n), grad_buf(n));
        act::gated_backward(act, &g, &u, &r, &mut dg, &mut du);
        let gl = |g: &[f64], u: &[f64]| {
            let mut h = vec![0.0; n];
            act::gated_forward(act, g, u, &mut h);
            dotr(&r, &h)
        };
        let uc = u.clone();
        reps.push(check(&format!("gated {name}"), "gate", &mut g, &unpre(&dg), EPS, |g| gl(g, &uc)));
        let gc = g.clone();
        reps.push(check(&format!("gated {name}"), "up", &mut u, &unpre(&du), EPS, |u| gl(&gc, u)));
    }
    assert_all(&reps);
}

#[test]
fn gradcheck_ffn() {
    let (t, d, ff) = (4, 6, 10);
    let mut reps = Vec::new();
    for (act, name) in [(Act::Silu, "ffn swiglu"), (Act::GeluTanh, "ffn geglu")] {
        let mut rng = Rng(3);
        let mut x = rng.vec(t * d, 1.0);
        let mut wg = rng.vec(ff * d, 0.5);
        let mut wu = rng.vec(ff * d, 0.5);
        let mut wd = rng.vec(d * ff, 0.5);
        let r = rng.vec(t * d, 1.0);
        let loss = |x: &[f64], wg: &[f64], wu: &[f64], wd: &[f64]| {
            let mut acts = FfnActs::default();
            let mut y = vec![0.0; t * d];
            act::ffn_forward(act, FfnWeights { gate: wg, up: wu, down: wd }, x, &mut acts, &mut y, t, d, ff);
            dotr(&r, &y)
        };
        let mut acts = FfnActs::default();
        let mut y = vec![0.0; t * d];
        act::ffn_forward(act, FfnWeights { gate: &wg, up: &wu, down: &wd }, &x, &mut acts, &mut y, t, d, ff);
        let (mut dx, mut dg, mut du, mut dd) = (grad_buf(t * d), grad_buf(ff * d), grad_buf(ff * d), grad_buf(d * ff));
        act::ffn_backward(
            act,
            FfnWeights { gate: &wg, up: &wu, down: &wd },
            &x,
            &acts,
            &r,
            Some(&mut dx),
            FfnGrads { gate: Some(&mut dg), up: Some(&mut du), down: Some(&mut dd) },
            t,
            d,
            ff,
        );
        let (a, b, c) = (wg.clone(), wu.clone(), wd.clone());
        reps.push(check(name, "x", &mut x, &unpre(&dx), EPS, |x| loss(x, &a, &b, &c)));
        let xc = x.clone();
        reps.push(check(name, "W_gate", &mut wg, &unpre(&dg), EPS, |w| loss(&xc, w, &b, &c)));
        let a = wg.clone();
        reps.push(check(name, "W_up", &mut wu, &unpre(&du), EPS, |w| loss(&xc, &a, w, &c)));
        let b = wu.clone();
        reps.push(check(name, "W_down", &mut wd, &unpre(&dd), EPS, |w| loss(&xc, &a, &b, w)));
    }
    assert_all(&reps);
}

#[test]
fn gradcheck_rmsnorm() {
    let (rows, d) = (5, 8);
    let mut reps = Vec::new();
    for (style, name) in [(NormStyle::Plain, "rmsnorm x̂·w"), (NormStyle::OnePlus, "rmsnorm x̂·(1+w)")] {
        let mut rng = Rng(4);
        let (mut x, mut w, r) = (rng.vec(rows * d, 1.5), rng.vec(d, 0.7), rng.vec(rows * d, 1.0));
        let loss = |x: &[f64], w: &[f64]| {
            let (mut y, mut rs) = (vec![0.0; rows * d], vec![0.0; rows]);
            rmsnorm_forward(style, x, w, 1e-6, &mut y, &mut rs);
            dotr(&r, &y)
        };
        let (mut y, mut rs) = (vec![0.0; rows * d], vec![0.0; rows]);
        rmsnorm_forward(style, &x, &w, 1e-6, &mut y, &mut rs);
        let (mut dx, mut dw) = (grad_buf(rows * d), grad_buf(d));
        rmsnorm_backward(style, &x, &w, &rs, &r, Some(&mut dx), Some(&mut dw));
        let wc = w.clone();
        reps.push(check(name, "x", &mut x, &unpre(&dx), EPS, |x| loss(x, &wc)));
        let xc = x.clone();
        reps.push(check(name, "w", &mut w, &unpre(&dw), EPS, |w| loss(&xc, w)));
    }
    assert_all(&reps);
}

#[test]
fn gradcheck_rope() {
    let (t, nh, hd, rot) = (6, 2, 10, 6); // partial rotary: dims 6..10 pass through
    let table = RopeTable::<f64>::new(t, rot, 10_000.0);
    let mut reps = Vec::new();
    for (style, name) in [(RopeStyle::NeoX, "rope neox partial"), (RopeStyle::Interleaved, "rope interleaved partial")] {
        let mut rng = Rng(5);
        let (mut x, r) = (rng.vec(t * nh * hd, 1.0), rng.vec(t * nh * hd, 1.0));
        let mut dx = grad_buf(x.len());
        rope_backward(style, &table, &r, &mut dx, nh, hd);
        reps.push(check(name, "x", &mut x, &unpre(&dx), EPS, |x| {
            let mut y = vec![0.0; x.len()];
            rope_forward(style, &table, x, &mut y, nh, hd);
            dotr(&r, &y)
        }));
    }
    assert_all(&reps);
}

#[test]
fn gradcheck_landmark_means() {
    let (t, tp, m, n, hd) = (30, 23, 5, 2, 3); // uneven segments, rows past tp unused
    let mut rng = Rng(6);
    let (mut x, r) = (rng.vec(t * n * hd, 1.0), rng.vec(n * m * hd, 1.0));
    let mut dx = grad_buf(x.len());
    segment_means_backward(&r, tp, m, n, hd, &mut dx);
    let rep = check("landmark means", "x", &mut x, &unpre(&dx), EPS, |x| {
        let mut y = vec![0.0; n * m * hd];
        segment_means_forward(x, tp, m, n, hd, &mut y);
        dotr(&r, &y)
    });
    // Rows past the prompt get exactly zero.
    assert!(unpre(&dx)[tp * n * hd..].iter().all(|&g| g == 0.0), "gradient leaked past the prompt");
    assert_all(&[rep]);
}

fn qkv_check(
    op: &str,
    q: &mut [f64],
    k: &mut [f64],
    v: &mut [f64],
    grads: (&[f64], &[f64], &[f64]),
    loss: impl Fn(&[f64], &[f64], &[f64]) -> f64,
) -> Vec<Report> {
    let (kc, vc) = (k.to_vec(), v.to_vec());
    let a = check(op, "q", q, &unpre(grads.0), EPS, |q| loss(q, &kc, &vc));
    let qc = q.to_vec();
    let b = check(op, "k", k, &unpre(grads.1), EPS, |k| loss(&qc, k, &vc));
    let c = check(op, "v", v, &unpre(grads.2), EPS, |v| loss(&qc, &kc, v));
    vec![a, b, c]
}

/// Plain exact causal attention in f64 (the definition, no blocking), [T, nh, hd].
#[allow(clippy::too_many_arguments)]
fn naive_attention(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    nh: usize,
    nkv: usize,
    hd: usize,
    scale: f64,
    window: Option<usize>,
) -> Vec<f64> {
    let t_len = q.len() / (nh * hd);
    let mut o = vec![0.0; q.len()];
    for t in 0..t_len {
        let lo = window.map_or(0, |w| (t + 1).saturating_sub(w));
        for h in 0..nh {
            let g = h / (nh / nkv);
            let s: Vec<f64> = (lo..=t)
                .map(|j| (0..hd).map(|c| q[(t * nh + h) * hd + c] * k[(j * nkv + g) * hd + c]).sum::<f64>() * scale)
                .collect();
            let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|x| (x - mx).exp()).sum();
            for (n, j) in (lo..=t).enumerate() {
                for c in 0..hd {
                    o[(t * nh + h) * hd + c] += (s[n] - mx).exp() / z * v[(j * nkv + g) * hd + c];
                }
            }
        }
    }
    o
}

#[test]
fn gradcheck_attention() {
    let mut reps = Vec::new();
    // Short (one block of query rows) and long (three blocks of 64, windows crossing blocks).
    for (t, nh, nkv, hd, window, name) in [
        (9, 4, 2, 5, None, "attention causal gqa"),
        (9, 4, 2, 5, Some(3), "attention window 3 gqa"),
        (150, 2, 1, 3, None, "attention T=150 (3 blocks)"),
        (150, 2, 1, 3, Some(50), "attention T=150 window 50"),
    ] {
        let sh = AttnShape { n_heads: nh, n_kv_heads: nkv, head_dim: hd, scale: 1.0 / (hd as f64).sqrt(), window };
        let mut rng = Rng(7);
        let (mut q, mut k, mut v) = (rng.vec(t * nh * hd, 1.0), rng.vec(t * nkv * hd, 1.0), rng.vec(t * nkv * hd, 1.0));
        let r = rng.vec(t * nh * hd, 1.0);
        let (mut o, mut lse) = (vec![0.0; q.len()], vec![0.0; t * nh]);
        attention_forward(&sh, &q, &k, &v, &mut o, &mut lse);
        let naive = naive_attention(&q, &k, &v, nh, nkv, hd, sh.scale, window);
        let (diff, at) = max_abs_diff_f64(&o, &naive); // NaN-propagating
        println!("{name}: forward vs the naive definition max |diff| {diff:.3e} at {at}");
        assert!(diff < 1e-13, "{name}: forward differs from the naive definition by {diff:.3e} at {at}");
        let (mut dq, mut dk, mut dv) = (grad_buf(q.len()), grad_buf(k.len()), grad_buf(v.len()));
        attention_backward(&sh, &q, &k, &v, &o, &lse, &r, &mut dq, &mut dk, &mut dv);
        reps.extend(qkv_check(name, &mut q, &mut k, &mut v, (&dq, &dk, &dv), |q, k, v| {
            let (mut o, mut lse) = (vec![0.0; q.len()], vec![0.0; t * nh]);
            attention_forward(&sh, q, k, v, &mut o, &mut lse);
            dotr(&r, &o)
        }));
    }
    assert_all(&reps);
}

/// The Nyström operator with M frozen at the base point. Sharp scores and few landmarks make
/// the skeleton overshoot negative on some rows: the data are chosen so that rows on both sides
/// of the aggregate guard occur, and every finite-difference evaluation is checked to drop
/// exactly the same rows as the base point (the difference never crosses the guard).
#[test]
fn gradcheck_nystrom() {
    let (nh, nkv, hd, t, tp) = (4, 2, 6, 44, 26);
    let cfg = O1Config { window: 4, sinks: 1, landmarks: 4, ridge: DEFAULT_RIDGE, far: Far::Skeleton };
    let sh = NyShape { n_heads: nh, n_kv_heads: nkv, head_dim: hd, scale: 2.2 / (hd as f64).sqrt(), tp };
    assert!(cfg.seals_skeleton(tp));
    // The first seed whose far rows fall on both sides of the guard.
    let mut found = None;
    for seed in 0..200u64 {
        let mut rng = Rng(1000 + seed);
        let (q, k, v) = (rng.vec(t * nh * hd, 1.0), rng.vec(t * nkv * hd, 1.0), rng.vec(t * nkv * hd, 1.0));
        let plan = nystrom_plan(&cfg, &sh, &q, &k).unwrap();
        let (mut o, mut dropped) = (vec![0.0; q.len()], vec![false; t * nh]);
        nystrom_forward(&cfg, &plan, &sh, &q, &k, &v, &mut o, &mut dropped);
        let n_drop = dropped.iter().filter(|&&d| d).count();
        // Far rows: t ≥ tp with t − window + 1 > sinks.
        let n_far = (tp..t).filter(|&tt| tt + 1 > cfg.window + cfg.sinks).count() * nh;
        if n_drop >= 3 && n_far - n_drop >= 3 * nh {
            println!("nystrom data seed {}: {n_drop} of {n_far} far rows dropped by the guard", 1000 + seed);
            found = Some((q, k, v, rng.vec(t * nh * hd, 1.0), dropped));
            break;
        }
    }
    let (mut q, mut k, mut v, r, base_drop) = found.expect("no seed puts rows on both sides of the guard");
    let plan = nystrom_plan(&cfg, &sh, &q, &k).unwrap(); // frozen M
    let (mut dq, mut dk, mut dv) = (grad_buf(q.len()), grad_buf(k.len()), grad_buf(v.len()));
    nystrom_backward(&cfg, &plan, &sh, &q, &k, &v, &r, &mut dq, &mut dk, &mut dv);
    let reps = qkv_check("nystrom (M frozen)", &mut q, &mut k, &mut v, (&dq, &dk, &dv), |q, k, v| {
        let (mut o, mut dropped) = (vec![0.0; q.len()], vec![false; t * nh]);
        nystrom_forward(&cfg, &plan, &sh, q, k, v, &mut o, &mut dropped);
        assert_eq!(dropped, base_drop, "a finite-difference step crossed the aggregate guard");
        dotr(&r, &o)
    });
    assert_all(&reps);
}

/// StreamingLLM (far keys dropped) and the short-prompt fallback (all exact) through the same
/// code: gradients, and the fallback equals exact attention.
#[test]
fn gradcheck_nystrom_drop_and_fallback() {
    let (nh, nkv, hd, t) = (2, 1, 4, 24);
    let mut reps = Vec::new();
    for (far, tp, name) in [(Far::Drop, 10, "streamingllm"), (Far::Skeleton, 12, "nystrom short prompt")] {
        let cfg = O1Config { window: 3, sinks: 1, landmarks: 4, ridge: DEFAULT_RIDGE, far };
        let sh = NyShape { n_heads: nh, n_kv_heads: nkv, head_dim: hd, scale: 0.5, tp };
        let mut rng = Rng(8);
        let (mut q, mut k, mut v) = (rng.vec(t * nh * hd, 1.0), rng.vec(t * nkv * hd, 1.0), rng.vec(t * nkv * hd, 1.0));
        let r = rng.vec(t * nh * hd, 1.0);
        let plan = nystrom_plan(&cfg, &sh, &q, &k).unwrap();
        assert!(!plan.skeleton);
        let (mut dq, mut dk, mut dv) = (grad_buf(q.len()), grad_buf(k.len()), grad_buf(v.len()));
        nystrom_backward(&cfg, &plan, &sh, &q, &k, &v, &r, &mut dq, &mut dk, &mut dv);
        if far == Far::Skeleton {
            let ash = AttnShape { n_heads: nh, n_kv_heads: nkv, head_dim: hd, scale: 0.5, window: None };
            let (mut o, mut lse, mut on, mut dr) =
                (vec![0.0; q.len()], vec![0.0; t * nh], vec![0.0; q.len()], vec![false; t * nh]);
            attention_forward(&ash, &q, &k, &v, &mut o, &mut lse);
            nystrom_forward(&cfg, &plan, &sh, &q, &k, &v, &mut on, &mut dr);
            let (diff, _) = max_abs_diff_f64(&o, &on);
            println!("nystrom short prompt vs exact attention: max |diff| {diff:.3e}");
            assert!(diff < 1e-12, "short-prompt fallback differs from exact attention by {diff:.3e}");
        }
        reps.extend(qkv_check(name, &mut q, &mut k, &mut v, (&dq, &dk, &dv), |q, k, v| {
            let (mut o, mut dropped) = (vec![0.0; q.len()], vec![false; t * nh]);
            nystrom_forward(&cfg, &plan, &sh, q, k, v, &mut o, &mut dropped);
            dotr(&r, &o)
        }));
    }
    assert_all(&reps);
}

#[test]
fn gradcheck_gated_delta_bptt() {
    // T crosses a checkpoint boundary (64) so the replay of two spans is covered.
    let (t, nh, dk, dv) = (70, 2, 4, 5);
    let sh = DeltaShape { n_heads: nh, dk, dv };
    let mut rng = Rng(9);
    let unit = |x: Vec<f64>| -> Vec<f64> {
        x.chunks(dk)
            .flat_map(|c| {
                let n = c.iter().map(|a| a * a).sum::<f64>().sqrt();
                c.iter().map(move |a| a / n).collect::<Vec<_>>()
            })
            .collect()
    };
    let mut q: Vec<f64> = unit(rng.vec(t * nh * dk, 1.0)).iter().map(|x| x / (dk as f64).sqrt()).collect();
    let mut k = unit(rng.vec(t * nh * dk, 1.0));
    let mut v = rng.vec(t * nh * dv, 1.0);
    let mut g: Vec<f64> = (0..t * nh).map(|_| -0.05 - 0.3 * rng.uniform()).collect();
    let mut beta: Vec<f64> = (0..t * nh).map(|_| 0.1 + 0.8 * rng.uniform()).collect();
    let r = rng.vec(t * nh * dv, 1.0);
    let loss = |q: &[f64], k: &[f64], v: &[f64], g: &[f64], b: &[f64]| {
        let mut o = vec![0.0; t * nh * dv];
        delta_forward(&sh, q, k, v, g, b, &mut o, &mut DeltaCheckpoints::default());
        dotr(&r, &o)
    };
    let mut o = vec![0.0; t * nh * dv];
    let mut ck = DeltaCheckpoints::default();
    delta_forward(&sh, &q, &k, &v, &g, &beta, &mut o, &mut ck);
    let (mut dq, mut dk_, mut dv_, mut dg, mut db) =
        (grad_buf(q.len()), grad_buf(k.len()), grad_buf(v.len()), grad_buf(g.len()), grad_buf(beta.len()));
    delta_backward(
        &sh,
        &q,
        &k,
        &v,
        &g,
        &beta,
        &ck,
        &r,
        DeltaGrads { dq: &mut dq, dk: &mut dk_, dv: &mut dv_, dg: &mut dg, dbeta: &mut db },
    );
    let op = "gated delta bptt";
    let (kc, vc, gc, bc) = (k.clone(), v.clone(), g.clone(), beta.clone());
    let mut reps = vec![check(op, "q", &mut q, &unpre(&dq), EPS, |x| loss(x, &kc, &vc, &gc, &bc))];
    let qc = q.clone();
    reps.push(check(op, "k", &mut k, &unpre(&dk_), EPS, |x| loss(&qc, x, &vc, &gc, &bc)));
    reps.push(check(op, "v", &mut v, &unpre(&dv_), EPS, |x| loss(&qc, &kc, x, &gc, &bc)));
    reps.push(check(op, "g", &mut g, &unpre(&dg), EPS, |x| loss(&qc, &kc, &vc, x, &bc)));
    reps.push(check(op, "beta", &mut beta, &unpre(&db), EPS, |x| loss(&qc, &kc, &vc, &gc, x)));
    assert_all(&reps);
}

#[test]
fn gradcheck_distill_loss() {
    let (n, vocab) = (5, 11);
    let mut reps = Vec::new();
    for lambda in [0.0, 0.3, 1.0] {
        let mut rng = Rng(10);
        let (mut s, tch) = (rng.vec(n * vocab, 2.0), rng.vec(n * vocab, 2.0));
        let targets: Vec<u32> = (0..n).map(|i| ((i * 7 + 3) % vocab) as u32).collect();
        let mut ds = grad_buf(s.len());
        distill_loss_backward(&s, &tch, &targets, vocab, lambda, 1.0, &mut ds);
        reps.push(check(&format!("loss ce+kl λ={lambda}"), "logits", &mut s, &unpre(&ds), EPS, |s| {
            distill_loss_forward(s, &tch, &targets, vocab, lambda).loss
        }));
    }
    // KL(teacher‖student) is zero when the logits agree up to a constant shift.
    let mut rng = Rng(11);
    let s = rng.vec(n * vocab, 2.0);
    let sh: Vec<f64> = s.iter().map(|x| x + 3.0).collect();
    let out = distill_loss_forward(&s, &sh, &[0, 1, 2, 3, 4], vocab, 0.5);
    println!("loss: KL of shifted logits {:.3e}", out.kl);
    assert!(out.kl.abs() < 1e-12, "KL of identical distributions is {}", out.kl);
    assert_all(&reps);
}

/// The fused, chunked LM head + loss: gradient w.r.t. h by finite differences, and equal to the
/// unfused ops (linear, loss, linear backward) over several chunks.
#[test]
fn gradcheck_lm_head_distill() {
    use cortiq_train::loss::lm_head_distill_chunked;
    let (t, d, vocab, lambda, chunk) = (29, 6, 17, 0.35, 8); // four chunks, the last ragged
    let mut rng = Rng(12);
    let (mut h, w, tch) = (rng.vec(t * d, 1.0), rng.vec(vocab * d, 0.7), rng.vec(t * vocab, 2.0));
    let targets: Vec<u32> = (0..t).map(|i| (i * 5 % vocab) as u32).collect();
    let mut dh = grad_buf(t * d);
    let fused = lm_head_distill_chunked(&h, &w, &tch, &targets, vocab, d, lambda, Some(&mut dh), chunk);
    // Unfused.
    let mut z = vec![0.0; t * vocab];
    linear_forward(&h, &w, &mut z, t, d, vocab);
    let plain = distill_loss_forward(&z, &tch, &targets, vocab, lambda);
    let mut dz = vec![0.0; t * vocab];
    distill_loss_backward(&z, &tch, &targets, vocab, lambda, 1.0, &mut dz);
    let mut dh2 = vec![0.0; t * d];
    linear_backward(&dz, &h, &w, Some(&mut dh2), None, t, d, vocab);
    let (dd, _) = max_abs_diff_f64(&unpre(&dh), &dh2);
    println!("lm head fused vs unfused: loss {:.15} vs {:.15}, dh max |diff| {dd:.3e}", fused.loss, plain.loss);
    assert!((fused.loss - plain.loss).abs() < 1e-13 && dd < 1e-13, "fused LM head + loss differs from the unfused ops");
    let rep = check("lm head + loss (fused)", "h", &mut h, &unpre(&dh), EPS, |h| {
        lm_head_distill_chunked(h, &w, &tch, &targets, vocab, d, lambda, None, chunk).loss
    });
    assert_all(&[rep]);
}

/// The learned far field (`farfield`): every feature-map tensor, at a shape where keys leave the
/// window at several positions, GQA groups of 2, and the sink set non-empty. The parameters are
/// scaled up from `init_params` so the features matter (norm terms included).
#[test]
fn gradcheck_far_field() {
    let s = cortiq_train::farfield::FarShape { t: 14, n_heads: 4, n_kv: 2, hd: 5, rank: 3, sinks: 1, window: 4, scale: 0.45 };
    gradcheck_far_field_with(s, cortiq_train::farfield::window_exits(&s));
}

/// The same under score eviction's kind of schedule: the sealed prompt's keys leave together,
/// later ones one at a time out of position order, some never.
#[test]
fn gradcheck_far_field_any_schedule() {
    use cortiq_train::farfield::NEVER;
    let s = cortiq_train::farfield::FarShape { t: 16, n_heads: 4, n_kv: 2, hd: 5, rank: 3, sinks: 1, window: 4, scale: 0.45 };
    let mut exits = vec![NEVER; s.t];
    (1..=5).for_each(|j| exits[j] = 8);
    exits[9] = 10;
    exits[6] = 12;
    exits[11] = 14;
    gradcheck_far_field_with(s, exits);
}

fn gradcheck_far_field_with(s: cortiq_train::farfield::FarShape, exits: Vec<usize>) {
    use cortiq_train::farfield::{FarParams, far_backward, far_forward, near_part_with};
    let mut rng = Rng(0xFA5);
    let q = rng.vec(s.t * s.n_heads * s.hd, 1.0);
    let k = rng.vec(s.t * s.n_kv * s.hd, 1.0);
    let v = rng.vec(s.t * s.n_kv * s.hd, 1.0);
    let near = near_part_with(&s, exits, &q, &k, &v);
    let p = FarParams::<f64>::random(&s, &mut rng);
    let r = rng.vec(q.len(), 1.0);
    let loss = |p: &FarParams<f64>| {
        let mut o = vec![0.0; q.len()];
        far_forward(&s, p, &near, &q, &k, &v, &mut o);
        dotr(&r, &o)
    };
    let mut g = FarParams::zeros(&s);
    g.tensors_mut().into_iter().for_each(|t| t.iter_mut().for_each(|x| *x = PRE));
    far_backward(&s, &p, &near, &q, &k, &v, &r, &mut g);
    let names = ["U", "alpha", "gamma_q", "W", "beta", "gamma_k", "rho"];
    let mut reports = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let analytic = unpre(g.tensors()[i]);
        let mut x = p.tensors()[i].to_vec();
        let rep = check("far_field", name, &mut x, &analytic, EPS, |x| {
            let mut pp = p.clone();
            *pp.tensors_mut()[i] = x.to_vec();
            loss(&pp)
        });
        reports.push(rep);
    }
    // The far field is live: it moves the rows past the window.
    let mut o = vec![0.0; q.len()];
    far_forward(&s, &p, &near, &q, &k, &v, &mut o);
    let from = near.first_far() * s.n_heads * s.hd;
    let sw = near.output(s.hd);
    let (md, _) = max_abs_diff_f64(&o[from..], &sw[from..]);
    assert!(md > 1e-2, "the far field changed nothing ({md:.3e})");
    let (md0, _) = max_abs_diff_f64(&o[..from], &sw[..from]);
    assert!(md0 < 1e-15, "rows before the first eviction must be sink+window's ({md0:.3e})");
    assert_all(&reports);
}

/// The far field as a block's attention (stage 2): gradients to q, k, v and to every feature
/// map, with the exact prompt rows before tp, keys that left before tp (absorbed at the seal),
/// keys that leave after it one at a time, and a sink that never leaves.
#[test]
fn gradcheck_far_mixer() {
    use cortiq_train::farfield::{FarParams, FarShape, NEVER, far_mixer_backward, far_mixer_forward};
    let s = FarShape { t: 16, n_heads: 4, n_kv: 2, hd: 5, rank: 3, sinks: 1, window: 4, scale: 0.45 };
    let tp = 7;
    let mut exits = vec![NEVER; s.t];
    (1..=3).for_each(|j| exits[j] = 7);
    exits[4] = 9;
    exits[6] = 11;
    exits[8] = 12;
    exits[5] = 14;
    let mut rng = Rng(0xFA7);
    let q = rng.vec(s.t * s.n_heads * s.hd, 1.0);
    let k = rng.vec(s.t * s.n_kv * s.hd, 1.0);
    let v = rng.vec(s.t * s.n_kv * s.hd, 1.0);
    let p = FarParams::<f64>::random(&s, &mut rng);
    let r = rng.vec(q.len(), 1.0);
    let fwd = |p: &FarParams<f64>, q: &[f64], k: &[f64], v: &[f64]| {
        let (mut o, mut lse) = (vec![0.0; q.len()], vec![0.0; s.t * s.n_heads]);
        far_mixer_forward(&s, p, &exits, tp, q, k, v, &mut o, &mut lse);
        (o, lse)
    };
    let (o, lse) = fwd(&p, &q, &k, &v);
    let (mut dq, mut dk, mut dv) = (grad_buf(q.len()), grad_buf(k.len()), grad_buf(v.len()));
    let mut g = FarParams::zeros(&s);
    g.tensors_mut().into_iter().for_each(|t| t.iter_mut().for_each(|x| *x = PRE));
    far_mixer_backward(&s, &p, &exits, tp, &q, &k, &v, &o, &lse, &r, &mut dq, &mut dk, &mut dv, &mut g);
    let mut reports = Vec::new();
    let (mut x, ana) = (q.clone(), unpre(&dq));
    reports.push(check("far_mixer", "q", &mut x, &ana, EPS, |x| dotr(&r, &fwd(&p, x, &k, &v).0)));
    let (mut x, ana) = (k.clone(), unpre(&dk));
    reports.push(check("far_mixer", "k", &mut x, &ana, EPS, |x| dotr(&r, &fwd(&p, &q, x, &v).0)));
    let (mut x, ana) = (v.clone(), unpre(&dv));
    reports.push(check("far_mixer", "v", &mut x, &ana, EPS, |x| dotr(&r, &fwd(&p, &q, &k, x).0)));
    let names = ["U", "alpha", "gamma_q", "W", "beta", "gamma_k", "rho"];
    for (i, name) in names.iter().enumerate() {
        let analytic = unpre(g.tensors()[i]);
        let mut x = p.tensors()[i].to_vec();
        reports.push(check("far_mixer", name, &mut x, &analytic, EPS, |x| {
            let mut pp = p.clone();
            *pp.tensors_mut()[i] = x.to_vec();
            dotr(&r, &fwd(&pp, &q, &k, &v).0)
        }));
    }
    // The prompt rows are exact causal attention; the rows after it differ from it.
    let (mut oe, mut le) = (vec![0.0; q.len()], vec![0.0; s.t * s.n_heads]);
    let sh = AttnShape { n_heads: s.n_heads, n_kv_heads: s.n_kv, head_dim: s.hd, scale: s.scale, window: None };
    attention_forward(&sh, &q, &k, &v, &mut oe, &mut le);
    let cut = tp * s.n_heads * s.hd;
    let (d0, _) = max_abs_diff_f64(&o[..cut], &oe[..cut]);
    let (d1, _) = max_abs_diff_f64(&o[cut..], &oe[cut..]);
    println!("far mixer vs exact attention: prompt rows {d0:.3e}, served rows {d1:.3e}");
    assert!(d0 < 1e-14 && d1 > 1e-2, "prompt rows {d0:.3e}, served rows {d1:.3e}");
    assert_all(&reports);
}

/// vmf_phase's core (issue 16) by BPTT: two states read by two query heads each, T across a
/// checkpoint boundary (64), every input and A_log.
#[test]
fn gradcheck_vmf_core() {
    use cortiq_train::vmf::{CoreCheckpoints, CoreGrads, CoreShape, core_backward, core_forward};
    let sh = CoreShape { n_heads: 4, n_states: 2, f: 6, dv: 3 };
    let t = 70;
    let mut rng = Rng(16);
    let mut phq = rng.vec(t * 4 * 6, 1.0);
    let mut phk = rng.vec(t * 2 * 6, 1.0);
    let mut kap: Vec<f64> = (0..t * 2).map(|_| 0.1 + 0.8 * rng.uniform()).collect();
    let mut v = rng.vec(t * 2 * 3, 1.0);
    let mut a: Vec<f64> = (0..12).map(|_| -3.0 + 3.0 * rng.uniform()).collect();
    let r = rng.vec(t * 4 * 3, 1.0);
    let loss = |q: &[f64], k: &[f64], kp: &[f64], v: &[f64], a: &[f64]| {
        let mut o = vec![0.0; t * 4 * 3];
        core_forward(&sh, q, k, kp, v, a, &mut o, &mut CoreCheckpoints::default());
        dotr(&r, &o)
    };
    let mut o = vec![0.0; t * 4 * 3];
    let mut ck = CoreCheckpoints::default();
    core_forward(&sh, &phq, &phk, &kap, &v, &a, &mut o, &mut ck);
    let (mut dq, mut dk, mut dkap, mut dv, mut da) =
        (grad_buf(phq.len()), grad_buf(phk.len()), grad_buf(kap.len()), grad_buf(v.len()), grad_buf(a.len()));
    let g = CoreGrads { dphq: &mut dq, dphk: &mut dk, dkappa: &mut dkap, dv: &mut dv, da_log: &mut da };
    core_backward(&sh, &phq, &phk, &kap, &v, &a, &ck, &r, g);
    let op = "vmf core bptt";
    let (kc, kpc, vc, ac) = (phk.clone(), kap.clone(), v.clone(), a.clone());
    let mut reps = vec![check(op, "phq", &mut phq, &unpre(&dq), EPS, |x| loss(x, &kc, &kpc, &vc, &ac))];
    let qc = phq.clone();
    reps.push(check(op, "phk", &mut phk, &unpre(&dk), EPS, |x| loss(&qc, x, &kpc, &vc, &ac)));
    reps.push(check(op, "kappa", &mut kap, &unpre(&dkap), EPS, |x| loss(&qc, &kc, x, &vc, &ac)));
    reps.push(check(op, "v", &mut v, &unpre(&dv), EPS, |x| loss(&qc, &kc, &kpc, x, &ac)));
    reps.push(check(op, "A_log", &mut a, &unpre(&da), EPS, |x| loss(&qc, &kc, &kpc, &vc, x)));
    assert_all(&reps);
}

/// The phase features (θ and the mass, heads grouped over states) and the causal conv.
#[test]
fn gradcheck_vmf_phase_and_conv() {
    use cortiq_train::vmf::{conv_backward, conv_forward, phase_backward, phase_forward};
    let mut rng = Rng(17);
    let (t, p, group, ns) = (5, 3, 2, 2);
    let mut th = rng.vec(t * ns * group * p, 4.0);
    let mut m: Vec<f64> = (0..ns).map(|_| 0.2 + rng.uniform()).collect();
    let r = rng.vec(2 * th.len(), 1.0);
    let loss = |th: &[f64], m: &[f64]| {
        let mut y = vec![0.0; 2 * th.len()];
        phase_forward(th, m, group, p, &mut y);
        dotr(&r, &y)
    };
    let (mut dth, mut dm) = (grad_buf(th.len()), grad_buf(m.len()));
    phase_backward(&th, &m, group, p, &r, &mut dth, &mut dm);
    let mc = m.clone();
    let mut reps = vec![check("vmf phase", "theta", &mut th, &unpre(&dth), EPS, |x| loss(x, &mc))];
    let thc = th.clone();
    reps.push(check("vmf phase", "mass", &mut m, &unpre(&dm), EPS, |x| loss(&thc, x)));
    let (d, k) = (6, 4);
    let mut x = rng.vec(t * d, 1.0);
    let mut w = rng.vec(d * k, 1.0);
    let r2 = rng.vec(t * d, 1.0);
    let closs = |x: &[f64], w: &[f64]| {
        let mut y = vec![0.0; t * d];
        conv_forward(x, w, d, k, &mut y);
        dotr(&r2, &y)
    };
    let (mut dx, mut dw) = (grad_buf(x.len()), grad_buf(w.len()));
    conv_backward(&r2, &x, &w, d, k, Some(&mut dx), Some(&mut dw));
    let wc = w.clone();
    reps.push(check("vmf conv", "x", &mut x, &unpre(&dx), EPS, |x| closs(x, &wc)));
    let xc = x.clone();
    reps.push(check("vmf conv", "taps", &mut w, &unpre(&dw), EPS, |w| closs(&xc, w)));
    assert_all(&reps);
}

/// The whole vmf_phase mixer with every option on (the output norm too): x and every
/// parameter tensor.
#[test]
fn gradcheck_vmf_mixer() {
    use cortiq_train::vmf::{VmfActs, VmfParams, VmfShape, vmf_mixer_backward, vmf_mixer_forward};
    let sh = VmfShape { d_model: 6, n_heads: 4, n_states: 2, nphase: 3, dv: 2, conv_kernel: 3, k_gate: true, phase_bias: true };
    let (d, p, nh, ns, dv, t) = (6, 3, 4, 2, 2, 9);
    let mut rng = Rng(18);
    let w = VmfParams {
        thq: rng.vec(nh * p * d, 1.0),
        thq_b: rng.vec(nh * p, 0.5),
        thk: rng.vec(ns * p * d, 1.0),
        thk_b: rng.vec(ns * p, 0.5),
        v: rng.vec(ns * dv * d, 1.0),
        out: rng.vec(d * nh * dv, 1.0),
        out_b: rng.vec(d, 0.2),
        a_log: (0..ns * 2 * p).map(|_| -2.0 + 2.0 * rng.uniform()).collect(),
        conv: rng.vec(d * 3, 1.0),
        kg_w: rng.vec(ns * d, 1.0),
        kg_b: rng.vec(ns, 0.5),
        mass: (0..ns).map(|_| 0.2 + rng.uniform()).collect(),
        o_norm: (0..nh * dv).map(|_| 0.5 + rng.uniform()).collect(),
    };
    let mut x = rng.vec(t * d, 1.0);
    let r = rng.vec(t * d, 1.0);
    let loss = |w: &VmfParams<f64>, x: &[f64]| {
        let mut y = vec![0.0; t * d];
        vmf_mixer_forward(&sh, w, x, &mut y, &mut VmfActs::default());
        dotr(&r, &y)
    };
    let mut acts = VmfActs::default();
    let mut y = vec![0.0; t * d];
    vmf_mixer_forward(&sh, &w, &x, &mut y, &mut acts);
    let mut g = w.zeros_like();
    g.tensors_mut().into_iter().for_each(|(_, v)| v.iter_mut().for_each(|x| *x = PRE));
    let mut dx = grad_buf(x.len());
    vmf_mixer_backward(&sh, &w, &x, &acts, &r, Some(&mut dx), &mut g);
    let wc = w.clone();
    let mut reps = vec![check("vmf mixer", "x", &mut x, &unpre(&dx), EPS, |x| loss(&wc, x))];
    let names: Vec<&'static str> = g.clone().tensors_mut().into_iter().map(|(n, _)| n).collect();
    for (i, name) in names.into_iter().enumerate() {
        let mut wv = w.clone();
        let analytic = unpre(g.clone().tensors_mut()[i].1);
        let mut vals = wv.tensors_mut()[i].1.clone();
        reps.push(check("vmf mixer", name, &mut vals, &analytic, EPS, |v| {
            let mut w2 = w.clone();
            *w2.tensors_mut()[i].1 = v.to_vec();
            loss(&w2, &x)
        }));
    }
    assert_all(&reps);
}

/// vmf_phase beside an exact window (issue 16's next option): sinks + window softmax with the
/// core's output as one more slot; q, k, v, the core output f and the slot logits b. Also: with
/// the slot's logit far below every score the rows are plain sink+window attention.
#[test]
fn gradcheck_vmf_window_slot() {
    use cortiq_train::farfield::{FarShape, near_part};
    use cortiq_train::vmf_window::{slot_backward, slot_forward};
    let s = FarShape { t: 14, n_heads: 4, n_kv: 2, hd: 5, rank: 0, sinks: 2, window: 4, scale: 0.45 };
    let mut rng = Rng(0x5107);
    let q = rng.vec(s.t * s.n_heads * s.hd, 1.0);
    let k = rng.vec(s.t * s.n_kv * s.hd, 1.0);
    let v = rng.vec(s.t * s.n_kv * s.hd, 1.0);
    let f = rng.vec(q.len(), 1.0);
    let b = rng.vec(s.t * s.n_heads, 1.5);
    let r = rng.vec(q.len(), 1.0);
    let fwd = |q: &[f64], k: &[f64], v: &[f64], f: &[f64], b: &[f64]| {
        let (mut o, mut lse) = (vec![0.0; q.len()], vec![0.0; s.t * s.n_heads]);
        slot_forward(&s, q, k, v, f, b, &mut o, &mut lse);
        (o, lse)
    };
    let (o, lse) = fwd(&q, &k, &v, &f, &b);
    let (mut dq, mut dk, mut dv) = (grad_buf(q.len()), grad_buf(k.len()), grad_buf(v.len()));
    let (mut df, mut db) = (grad_buf(f.len()), grad_buf(b.len()));
    slot_backward(&s, &q, &k, &v, &f, &b, &o, &lse, &r, &mut dq, &mut dk, &mut dv, &mut df, &mut db);
    let mut reports = Vec::new();
    let (mut x, ana) = (q.clone(), unpre(&dq));
    reports.push(check("vmf window slot", "q", &mut x, &ana, EPS, |x| dotr(&r, &fwd(x, &k, &v, &f, &b).0)));
    let (mut x, ana) = (k.clone(), unpre(&dk));
    reports.push(check("vmf window slot", "k", &mut x, &ana, EPS, |x| dotr(&r, &fwd(&q, x, &v, &f, &b).0)));
    let (mut x, ana) = (v.clone(), unpre(&dv));
    reports.push(check("vmf window slot", "v", &mut x, &ana, EPS, |x| dotr(&r, &fwd(&q, &k, x, &f, &b).0)));
    let (mut x, ana) = (f.clone(), unpre(&df));
    reports.push(check("vmf window slot", "f", &mut x, &ana, EPS, |x| dotr(&r, &fwd(&q, &k, &v, x, &b).0)));
    let (mut x, ana) = (b.clone(), unpre(&db));
    reports.push(check("vmf window slot", "b", &mut x, &ana, EPS, |x| dotr(&r, &fwd(&q, &k, &v, &f, x).0)));
    // A slot that weighs nothing: sink+window's own output.
    let off = vec![-1e3; b.len()];
    let (o0, _) = fwd(&q, &k, &v, &f, &off);
    let sw = near_part(&s, &q, &k, &v).output(s.hd);
    let (d, _) = max_abs_diff_f64(&o0, &sw);
    let (d1, _) = max_abs_diff_f64(&o, &sw);
    println!("slot off vs sink+window {d:.3e}; slot on {d1:.3e}");
    assert!(d < 1e-14 && d1 > 1e-2, "slot off {d:.3e}, on {d1:.3e}");
    assert_all(&reports);
}

/// The windowed vmf_phase mixer with every option on (conv, gate, mass, phase and q/k/v
/// biases, the output norm, the output bias): x and every parameter tensor.
#[test]
fn gradcheck_vmf_window_mixer() {
    use cortiq_train::rope::{RopeStyle, RopeTable};
    use cortiq_train::vmf::{VmfParams, VmfShape};
    use cortiq_train::vmf_window::{WinActs, WinParams, WinShape, win_mixer_backward, win_mixer_forward};
    let (d, p, nh, nk, hd, t) = (6, 3, 4, 2, 4, 13);
    let core =
        VmfShape { d_model: d, n_heads: nh, n_states: nk, nphase: p, dv: hd, conv_kernel: 3, k_gate: true, phase_bias: true };
    let sh = WinShape { core, sinks: 2, window: 4, scale: 0.5, rope: RopeStyle::NeoX };
    let rope = RopeTable::<f64>::new(t, hd, 100.0);
    let mut rng = Rng(0x3177);
    let w = WinParams {
        core: VmfParams {
            thq: rng.vec(nh * p * d, 1.0),
            thq_b: rng.vec(nh * p, 0.5),
            thk: rng.vec(nk * p * d, 1.0),
            thk_b: rng.vec(nk * p, 0.5),
            v: rng.vec(nk * hd * d, 1.0),
            out: rng.vec(d * nh * hd, 1.0),
            out_b: rng.vec(d, 0.2),
            a_log: (0..nk * 2 * p).map(|_| -2.0 + 2.0 * rng.uniform()).collect(),
            conv: rng.vec(d * 3, 1.0),
            kg_w: rng.vec(nk * d, 1.0),
            kg_b: rng.vec(nk, 0.5),
            mass: (0..nk).map(|_| 0.2 + rng.uniform()).collect(),
            o_norm: (0..nh * hd).map(|_| 0.5 + rng.uniform()).collect(),
        },
        wq: rng.vec(nh * hd * d, 0.7),
        bq: rng.vec(nh * hd, 0.3),
        wk: rng.vec(nk * hd * d, 0.7),
        bk: rng.vec(nk * hd, 0.3),
        bv: rng.vec(nk * hd, 0.3),
        wb: rng.vec(nh * d, 0.5),
        cb: rng.vec(nh, 0.5),
    };
    let mut x = rng.vec(t * d, 1.0);
    let r = rng.vec(t * d, 1.0);
    let loss = |w: &WinParams<f64>, x: &[f64]| {
        let mut y = vec![0.0; t * d];
        win_mixer_forward(&sh, w, &rope, x, &mut y, &mut WinActs::default());
        dotr(&r, &y)
    };
    let mut acts = WinActs::default();
    let mut y = vec![0.0; t * d];
    win_mixer_forward(&sh, &w, &rope, &x, &mut y, &mut acts);
    let mut g = w.zeros_like();
    g.tensors_mut().into_iter().for_each(|(_, v)| v.iter_mut().for_each(|x| *x = PRE));
    let mut dx = grad_buf(x.len());
    win_mixer_backward(&sh, &w, &rope, &x, &acts, &r, Some(&mut dx), &mut g);
    let wc = w.clone();
    let mut reps = vec![check("vmf window mixer", "x", &mut x, &unpre(&dx), EPS, |x| loss(&wc, x))];
    let names: Vec<&'static str> = g.clone().tensors_mut().into_iter().map(|(n, _)| n).collect();
    for (i, name) in names.into_iter().enumerate() {
        let analytic = unpre(g.clone().tensors_mut()[i].1);
        let mut vals = w.clone().tensors_mut()[i].1.clone();
        reps.push(check("vmf window mixer", name, &mut vals, &analytic, EPS, |v| {
            let mut w2 = w.clone();
            *w2.tensors_mut()[i].1 = v.to_vec();
            loss(&w2, &x)
        }));
    }
    assert_all(&reps);
}

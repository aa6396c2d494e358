//! Throughput of the f32 training ops at SmolLM2-135M-like shapes (d 576, ff 1536, 9/3 heads of
//! 64): GFLOP/s of the linear forward and its two gradients, and the time of the attention and
//! Nyström forward + backward over one window, and the gated delta rule's.
//! Run: `cargo run --release -p cortiq-train --example train_ops_bench [T]`.

use std::time::Instant;

use cortiq_train::attention::{AttnShape, attention_backward, attention_forward};
use cortiq_train::delta::{DeltaCheckpoints, DeltaGrads, DeltaShape, delta_backward, delta_forward};
use cortiq_train::gradcheck::Rng;
use cortiq_train::matmul::{linear_backward, linear_forward};
use cortiq_train::nystrom::{DEFAULT_RIDGE, Far, NyShape, O1Config, nystrom_backward, nystrom_forward, nystrom_plan};

fn f32v(r: &mut Rng, n: usize, s: f64) -> Vec<f32> {
    r.vec(n, s).into_iter().map(|x| x as f32).collect()
}

fn time<F: FnMut()>(reps: usize, mut f: F) -> f64 {
    f();
    let t0 = Instant::now();
    for _ in 0..reps {
        f();
    }
    t0.elapsed().as_secs_f64() / reps as f64
}

fn main() {
    let t: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(512);
    let mut r = Rng(1);
    // A second argument names one part to run alone (for a profiler): linear, attention, nystrom.
    let only = std::env::args().nth(2).unwrap_or_default();
    let run = |part: &str| only.is_empty() || only == part;
    println!("threads: {}", cortiq_train::par::pool().n_threads());
    for (din, dout) in [(576, 1536), (1536, 576)].into_iter().filter(|_| run("linear")) {
        let (x, w, dy) = (f32v(&mut r, t * din, 1.0), f32v(&mut r, dout * din, 0.05), f32v(&mut r, t * dout, 1.0));
        let mut y = vec![0f32; t * dout];
        let (mut dx, mut dw) = (vec![0f32; t * din], vec![0f32; dout * din]);
        let flops = 2.0 * (t * din * dout) as f64;
        let fwd = time(5, || linear_forward(&x, &w, &mut y, t, din, dout));
        let bx = time(5, || linear_backward(&dy, &x, &w, Some(&mut dx), None, t, din, dout));
        let bw = time(5, || linear_backward(&dy, &x, &w, None, Some(&mut dw), t, din, dout));
        println!(
            "linear T={t} {din}->{dout}: fwd {:.1} GFLOP/s, dx {:.1}, dW {:.1}",
            flops / fwd / 1e9,
            flops / bx / 1e9,
            flops / bw / 1e9
        );
    }
    if run("lmhead") {
        // SmolLM2's tied head: V = 49152, d = 576.
        let (vocab, d) = (49152, 576);
        let (hh, w, tch) = (f32v(&mut r, t * d, 1.0), f32v(&mut r, vocab * d, 0.05), f32v(&mut r, t * vocab, 2.0));
        let tg: Vec<u32> = (0..t as u32).map(|i| i * 7919 % vocab as u32).collect();
        let mut dh = vec![0f32; t * d];
        let dt = time(1, || {
            cortiq_train::loss::lm_head_distill(&hh, &w, &tch, &tg, vocab, d, 0.5, Some(&mut dh));
        });
        let gf = 4.0 * (t * vocab * d) as f64 / 1e9;
        println!("lm head + loss T={t} V={vocab} d={d}: {:.0} ms ({gf:.0} GFLOP of matmuls)", dt * 1e3);
    }
    let (nh, nkv, hd) = (9, 3, 64);
    let scale = 1.0 / (hd as f64).sqrt();
    let (q, k, v, d_o) = (
        f32v(&mut r, t * nh * hd, 1.0),
        f32v(&mut r, t * nkv * hd, 1.0),
        f32v(&mut r, t * nkv * hd, 1.0),
        f32v(&mut r, t * nh * hd, 1.0),
    );
    let sh = AttnShape { n_heads: nh, n_kv_heads: nkv, head_dim: hd, scale, window: None };
    let (mut o, mut lse) = (vec![0f32; q.len()], vec![0f64; t * nh]);
    let (mut dq, mut dk, mut dv) = (vec![0f32; q.len()], vec![0f32; k.len()], vec![0f32; v.len()]);
    if run("attention") {
        let fa = time(3, || attention_forward(&sh, &q, &k, &v, &mut o, &mut lse));
        let ba = time(3, || attention_backward(&sh, &q, &k, &v, &o, &lse, &d_o, &mut dq, &mut dk, &mut dv));
        println!("attention T={t} 9/3x64: fwd {:.1} ms, bwd {:.1} ms", fa * 1e3, ba * 1e3);
    }
    if run("delta") {
        // Qwen3-Next-like gated delta heads: 8 of 128 x 128.
        let ds = DeltaShape { n_heads: 8, dk: 128, dv: 128 };
        let n = t * 8 * 128;
        let (dq_, dk_, dv_, dout) = (f32v(&mut r, n, 0.01), f32v(&mut r, n, 0.08), f32v(&mut r, n, 1.0), f32v(&mut r, n, 1.0));
        let g: Vec<f32> = (0..t * 8).map(|i| -0.05 - 0.001 * (i % 7) as f32).collect();
        let beta = vec![0.5f32; t * 8];
        let (mut o, mut ck) = (vec![0f32; n], DeltaCheckpoints::default());
        let fd = time(2, || delta_forward(&ds, &dq_, &dk_, &dv_, &g, &beta, &mut o, &mut ck));
        let (mut gq, mut gk, mut gv, mut gg, mut gb) =
            (vec![0f32; n], vec![0f32; n], vec![0f32; n], vec![0f32; t * 8], vec![0f32; t * 8]);
        let bd = time(2, || {
            let grads = DeltaGrads { dq: &mut gq, dk: &mut gk, dv: &mut gv, dg: &mut gg, dbeta: &mut gb };
            delta_backward(&ds, &dq_, &dk_, &dv_, &g, &beta, &ck, &dout, grads)
        });
        println!("gated delta T={t} 8x128x128: fwd {:.1} ms, bwd {:.1} ms", fd * 1e3, bd * 1e3);
    }
    if !run("nystrom") {
        return;
    }
    let cfg = O1Config { window: 64, sinks: 4, landmarks: 64, ridge: DEFAULT_RIDGE, far: Far::Skeleton };
    let ny = NyShape { n_heads: nh, n_kv_heads: nkv, head_dim: hd, scale, tp: t / 2 };
    let plan = nystrom_plan(&cfg, &ny, &q, &k).unwrap();
    let mut dropped = vec![false; t * nh];
    let fny = time(2, || nystrom_forward(&cfg, &plan, &ny, &q, &k, &v, &mut o, &mut dropped));
    let bny = time(2, || nystrom_backward(&cfg, &plan, &ny, &q, &k, &v, &d_o, &mut dq, &mut dk, &mut dv));
    println!("nystrom T={t} tp={} W={} m={}: fwd {:.1} ms, bwd {:.1} ms", t / 2, cfg.window, plan.m, fny * 1e3, bny * 1e3);
}

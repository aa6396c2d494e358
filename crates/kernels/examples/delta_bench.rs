//! Delta-rule prefill per head (d_k = d_v = 128, 512 tokens), one thread, best of N: the
//! chunked WY form at several chunk lengths beside the token-by-token recurrence.
//! `cargo run --release -p cortiq-kernels --example delta_bench [tokens]`

use std::hint::black_box;
use std::time::Instant;

use cortiq_kernels::delta::{gated_delta_chunked, gated_delta_recurrent};

fn main() {
    let t: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(512);
    let (dk, dv) = (128, 128);
    let mut s = 0x9E37_79B9u64;
    let mut r = |n: usize, sc: f32| -> Vec<f32> {
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * sc
            })
            .collect()
    };
    let (q, k, v) = (r(t * dk, 0.09), r(t * dk, 0.09), r(t * dv, 1.0));
    let g: Vec<f32> = r(t, 0.5).iter().map(|x| -x.abs()).collect();
    let beta: Vec<f32> = r(t, 0.4).iter().map(|x| 0.5 + x).collect();
    let best = |f: &mut dyn FnMut()| {
        let mut b = f64::INFINITY;
        for _ in 0..20 {
            let t0 = Instant::now();
            f();
            b = b.min(t0.elapsed().as_secs_f64());
        }
        b * 1e3
    };
    println!("{t} tokens, d_k = d_v = 128, one head, one thread (ms, best of 20)");
    for chunk in [8, 16, 24, 32, 48, 64, 96, 128] {
        let ms = best(&mut || {
            let mut st = vec![0f32; dk * dv];
            let mut o = vec![0f32; t * dv];
            gated_delta_chunked(&q, &k, &v, &g, &beta, t, dk, dv, chunk, &mut st, &mut o);
            black_box(&o);
        });
        println!("chunked, chunk {chunk:>3}: {ms:.3}");
    }
    let ms = best(&mut || {
        let mut st = vec![0f32; dk * dv];
        let mut o = vec![0f32; t * dv];
        gated_delta_recurrent(&q, &k, &v, &g, &beta, t, dk, dv, &mut st, &mut o);
        black_box(&o);
    });
    println!("recurrence:         {ms:.3}");
}

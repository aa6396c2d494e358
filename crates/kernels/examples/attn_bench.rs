//! Decode attention's loops (`attn::dot_rows`, `attn::axpy_rows`), single thread, hot in cache:
//! ns per (query head, cached position) for a few shapes — heads sharing a kv head, head_dim,
//! positions, and the row stride (2 × head_dim is a cache holding 2 kv heads side by side, as
//! Qwen2.5-0.5B's does; 1 × is one kv head's contiguous rows).
//!
//! `cargo run --release -p cortiq-kernels --example attn_bench`

use cortiq_kernels::attn::{axpy_rows, dot_rows};
use std::time::Instant;
fn main() {
    for (g, hd, n, sm) in [
        (1usize, 64usize, 110usize, 2usize),
        (7, 64, 110, 2),
        (7, 64, 110, 1),
        (7, 64, 32, 1),
        (1, 128, 500, 2),
        (8, 128, 2000, 2),
    ] {
        let stride = sm * hd;
        let q: Vec<f32> = (0..g * hd).map(|i| (i as f32 * 0.1).sin()).collect();
        let k: Vec<f32> = (0..n * stride).map(|i| (i as f32 * 0.37).cos()).collect();
        let mut s = vec![0f32; g * n];
        let mut o = vec![0f32; g * hd];
        let reps = 20000 / n.max(1) * 10;
        let t = Instant::now();
        for _ in 0..reps {
            dot_rows(&q, hd, &k, stride, n, &mut s);
            std::hint::black_box(&s);
        }
        let d = t.elapsed().as_secs_f64() / (reps * g * n) as f64;
        let t = Instant::now();
        for _ in 0..reps {
            axpy_rows(&s, n, &k, stride, hd, &mut o);
            std::hint::black_box(&o);
        }
        let a = t.elapsed().as_secs_f64() / (reps * g * n) as f64;
        println!("g {g} hd {hd} n {n} stride {stride}: dot {:.2} ns per pair, axpy {:.2} ns per pair", d * 1e9, a * 1e9);
    }
}

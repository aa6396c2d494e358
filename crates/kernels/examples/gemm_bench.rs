//! f32 GEMM throughput of the attention shapes (dot::gemm_nn) and the weight-tile shape
//! (dot::gemm_nt), single thread, GFLOP/s, best of several repetitions.
//!
//! `cargo run --release -p cortiq-kernels --example gemm_bench`

use cortiq_kernels::dot::{gemm_nn, gemm_nt};
use std::hint::black_box;
use std::time::Instant;

fn main() {
    let v = |n: usize| (0..n).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect::<Vec<f32>>();
    for (m, k, n) in [
        (32, 64, 512),
        (32, 512, 64),
        (32, 256, 512),
        (32, 512, 256),
        (64, 256, 512),
        (32, 64, 8448),
        (32, 8448, 64),
        (224, 64, 8448),
        (224, 8448, 64),
        (32, 256, 8704),
        (32, 8704, 256),
    ] {
        let (x, b) = (v(m * k), v(k * n));
        let mut y = vec![0f32; m * n];
        let mut best = f64::INFINITY;
        for _ in 0..50 {
            let t = Instant::now();
            gemm_nn(&x, m, &b, n, k, n, &mut y, n);
            black_box(&y);
            best = best.min(t.elapsed().as_secs_f64());
        }
        let mut best_nt = f64::INFINITY;
        let bt = v(n * k);
        for _ in 0..50 {
            let t = Instant::now();
            gemm_nt(&x, m, &bt, n, k, &mut y, n);
            black_box(&y);
            best_nt = best_nt.min(t.elapsed().as_secs_f64());
        }
        let fl = 2.0 * (m * k * n) as f64;
        println!("{m}x{k}x{n}: gemm_nn {:.1} GFLOP/s, gemm_nt {:.1} GFLOP/s", fl / best / 1e9, fl / best_nt / 1e9);
    }
}

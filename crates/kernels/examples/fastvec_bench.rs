//! Decode matvec throughput, single thread: ggml's order (`matvec_q`) against cortiq's own
//! (`matvec_fast`), per 32-element type, on a cache-resident matrix and a streamed one.
//! Prints G weights/s, best of several repetitions (compare ratios on a shared machine).
//!
//! `cargo run --release -p cortiq-kernels --example fastvec_bench [-- ROWS COLS]`

use cortiq_kernels::quant::{QuantType, act_type, matvec_own, matvec_q, quantize_act};
use std::hint::black_box;
use std::time::Instant;

mod common;

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let shapes = match args[..] {
        [r, c, ..] => vec![(r, c)],
        _ => vec![(2048, 640), (262144, 640)],
    };
    for (rows, cols) in shapes {
        println!("{rows} x {cols}: G weights/s   ggml order   fast   ratio");
        for ty in [QuantType::Q4_0, QuantType::Q4_1, QuantType::Q5_0, QuantType::Q5_1, QuantType::Q8_0, QuantType::Q4K] {
            if ty.row_bytes(cols).is_none() {
                println!("    {:<5}  (no whole blocks in {cols} columns)", ty.name());
                continue;
            }
            let w = common::random_weights(ty, rows, cols, 0x9E37_79B9);
            let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.37).sin()).collect();
            let mut a = Vec::new();
            quantize_act(act_type(ty).unwrap(), &x, &mut a);
            let mut y = vec![0f32; rows];
            let mut best = |f: &mut dyn FnMut(&mut [f32])| {
                let mut b = f64::INFINITY;
                for _ in 0..if rows > 100_000 { 3 } else { 50 } {
                    let t = Instant::now();
                    f(&mut y);
                    black_box(&y);
                    b = b.min(t.elapsed().as_secs_f64());
                }
                (rows * cols) as f64 / b / 1e9
            };
            let g = best(&mut |y| matvec_q(ty, &w, rows, cols, &a, y));
            let f = best(&mut |y| matvec_own(ty, &w, rows, cols, &a, y));
            println!("{:>8} {g:>18.2} {f:>8.2} {:>7.2}x", ty.name(), f / g);
        }
    }
}

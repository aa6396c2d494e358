//! The interleaved decode kernels over a model-shaped sequence of matrices with 2 threads, no
//! engine around them: per layer q/k/v (1152 × 896 Q5_0), o (896 × 896 Q5_0), gate + up (9728 ×
//! 896 Q5_0), down (896 × 4864 Q4_K), then a 151936 × 896 Q8_0 LM head (Qwen2.5-0.5B's shapes and
//! the bulk of its types). Each matrix is one dispatch of the kernels' pool, split by row groups
//! over THREADS, as the engine runs it. Prints ms per step for k = 1, 2, 4, 8, the weight bytes
//! read per second and the k-step cost over the 1-step cost: what the decode batch could reach
//! with nothing but the weight products.
//!
//! `cargo run --release -p cortiq-kernels --example ileave_stream [-- LAYERS [THREADS]]`

use cortiq_kernels::quant::{QuantType, act_type, ileave, ileave_bytes, matvec_ileave, quantize_act};
use std::time::Instant;

mod common;

struct Mat {
    ty: QuantType,
    rows: usize,
    cols: usize,
    packed: Vec<u8>,
}

fn mat(ty: QuantType, rows: usize, cols: usize, seed: u64) -> Mat {
    Mat { ty, rows, cols, packed: ileave(ty, &common::random_weights(ty, rows, cols, seed), rows, cols) }
}

fn main() {
    let layers: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(24);
    let nt: usize = std::env::args().nth(2).and_then(|a| a.parse().ok()).unwrap_or(2);
    let mut mats = Vec::new();
    for l in 0..layers as u64 {
        mats.push(mat(QuantType::Q5_0, 1152, 896, 4 * l + 1));
        mats.push(mat(QuantType::Q5_0, 896, 896, 4 * l + 2));
        mats.push(mat(QuantType::Q5_0, 9728, 896, 4 * l + 3));
        mats.push(mat(QuantType::Q4K, 896, 4864, 4 * l + 4));
    }
    mats.push(mat(QuantType::Q8_0, 151936, 896, 99));
    let bytes: usize = mats.iter().map(|m| ileave_bytes(m.ty, m.rows, m.cols).unwrap()).sum();
    println!("{} matrices, {:.1} MB", mats.len(), bytes as f64 / 1e6);
    let mut base = 0.0;
    for k in [1usize, 2, 4, 8] {
        // activations per matrix input width
        let acts: Vec<Vec<u8>> = mats
            .iter()
            .map(|m| {
                let mut all = Vec::new();
                let mut a = Vec::new();
                for j in 0..k {
                    let x: Vec<f32> = (0..m.cols).map(|i| ((i * (j + 3)) as f32 * 0.37).sin()).collect();
                    quantize_act(act_type(m.ty).unwrap(), &x, &mut a);
                    all.extend_from_slice(&a);
                }
                all
            })
            .collect();
        let steps = 12;
        let pool = cortiq_kernels::pool::Pool::new(nt).unwrap();
        let mut y = vec![0f32; 151936 * k];
        let t = Instant::now();
        for _ in 0..steps {
            for (m, a) in mats.iter().zip(&acts) {
                let gb = ileave_bytes(m.ty, 16, m.cols).unwrap();
                // y [k, rows]: every column's rows side by side, as the engine's batch writes them
                pool.for_cols_mut(&mut y[..m.rows * k], k, m.rows, 16, |r0, ys| {
                    let (g0, g1) = (r0 / 16, (r0 + ys[0].len()) / 16);
                    matvec_ileave(m.ty, &m.packed[g0 * gb..g1 * gb], m.cols, a, ys);
                });
            }
        }
        let dt = t.elapsed().as_secs_f64() / steps as f64;
        if k == 1 {
            base = dt;
        }
        println!(
            "k {k}: {:.2} ms per step, {:.1} GB/s, {:.2}x the k = 1 step, {:.1} tok/s aggregate",
            dt * 1e3,
            bytes as f64 / dt / 1e9,
            dt / base,
            k as f64 / dt
        );
    }
}

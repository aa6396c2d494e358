//! Mamba2's selective scan (`ssm::scan_head`) against its scalar twin, one thread: one head of
//! Granite-4.0-H-Tiny's shape (head_dim 64, d_state 128) over 128 tokens. Prints ms per call,
//! best of several repetitions.
//!
//! `cargo run --release -p cortiq-kernels --example ssm_bench [-- HEAD_DIM D_STATE TOKENS]`

use cortiq_kernels::ssm::{ScanInputs, scan_head, scan_head_scalar};
use std::hint::black_box;

mod common;
use common::{best_secs, next};

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (hd, ds, n) = match args[..] {
        [a, b, c, ..] => (a, b, c),
        _ => (64, 128, 128),
    };
    let stride = hd + 2 * ds;
    let mut seed = 0x55A1_0002u64;
    let rows: Vec<f32> = (0..n * stride).map(|_| (next(&mut seed) >> 40) as f32 / (1u64 << 24) as f32 - 0.5).collect();
    let dt: Vec<f32> = (0..n).map(|t| 0.1 + 0.001 * t as f32).collect();
    let decay: Vec<f32> = dt.iter().map(|d| (-d * 0.5f32).exp()).collect();
    let inp = ScanInputs { rows: &rows, stride, x_at: 0, b_at: hd, c_at: hd + ds, d_state: ds, dt: &dt, decay: &decay, d: 0.5 };
    let mut s = vec![0f32; hd * ds];
    let mut y = vec![0f32; n * hd];
    let simd = best_secs(|| scan_head(black_box(&inp), &mut s, &mut y));
    let scalar = best_secs(|| scan_head_scalar(black_box(&inp), &mut s, &mut y));
    let elems = (hd * ds * n) as f64;
    println!(
        "scan {hd}x{ds}, {n} tokens ({:?}): simd {:.3} ms ({:.2} G state elements/s), scalar {:.3} ms ({:.2})",
        cortiq_kernels::simd::level(),
        simd * 1e3,
        elems / simd / 1e9,
        scalar * 1e3,
        elems / scalar / 1e9
    );
}

//! Dequantization throughput, scalar twin vs the run-time-selected path, per type.
//!
//! `cargo run --release -p cortiq-kernels --example dequant_bench [-- ROWS COLS]`
//!
//! Mimics decode: a [ROWS, COLS] weight is dequantized row by row into one reused f32 row, the
//! way QTensor walks a matrix. Default: 256 x 2048 (about 0.5 MiB of Q8_0, cache-resident: the
//! kernels' own speed) and 8192 x 2048 (about 17 MiB: closer to decode, which streams the model
//! from memory). Prints G elements/s for both paths and their ratio; each figure is
//! the best of several repetitions, since the machine may be shared and loaded.

use cortiq_kernels::quant::{QuantType, dequantize_row, dequantize_row_scalar};
use std::hint::black_box;
use std::time::Instant;

const TYPES: [QuantType; 21] = [
    QuantType::Q8_0,
    QuantType::Q4K,
    QuantType::Q6K,
    QuantType::Q5_0,
    QuantType::Q4_1,
    QuantType::Q4_0,
    QuantType::Q5K,
    QuantType::Q5_1,
    QuantType::F16,
    QuantType::BF16,
    QuantType::Q2K,
    QuantType::Q3K,
    QuantType::Q8K,
    QuantType::IQ4NL,
    QuantType::IQ4XS,
    QuantType::MXFP4,
    QuantType::IQ2XXS,
    QuantType::IQ2XS,
    QuantType::IQ2S,
    QuantType::IQ3XXS,
    QuantType::IQ3S,
];

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let shapes = match args[..] {
        [rows, cols, ..] => vec![(rows, cols)],
        _ => vec![(256, 2048), (8192, 2048)],
    };
    println!("AVX-512 BW dequantizers active: {}", cortiq_kernels::simd::avx512bw());
    for (rows, cols) in shapes {
        bench(rows, cols);
    }
}

fn bench(rows: usize, cols: usize) {
    println!("\ndequantize {rows} x {cols} row by row into one reused row buffer");
    println!("{:>7} {:>9} {:>12} {:>12} {:>7}", "type", "src MiB", "scalar G/s", "simd G/s", "ratio");
    let mut seed = 0x00C0_FFEEu64;
    for ty in TYPES {
        let Some(rb) = ty.row_bytes(cols) else {
            println!("{ty:>5}: {cols} columns is not a whole number of blocks, skipped");
            continue;
        };
        let src = random_matrix(ty, rows * rb, &mut seed);
        let mut row = vec![0f32; cols];
        let elems = (rows * cols) as f64;
        let scalar = best_rate(elems, || {
            for r in src.chunks_exact(rb) {
                dequantize_row_scalar(ty, black_box(r), &mut row);
                black_box(&mut row);
            }
        });
        let fast = best_rate(elems, || {
            for r in src.chunks_exact(rb) {
                dequantize_row(ty, black_box(r), &mut row);
                black_box(&mut row);
            }
        });
        let mib = src.len() as f64 / (1 << 20) as f64;
        println!("{:>7} {mib:>9.2} {:>12.2} {:>12.2} {:>6.1}x", ty.name(), scalar / 1e9, fast / 1e9, fast / scalar);
    }
}

/// Best elements/s over repetitions lasting ~0.3 s in all.
fn best_rate(elems: f64, mut f: impl FnMut()) -> f64 {
    f(); // warm caches and the feature detection
    let mut best = 0f64;
    let start = Instant::now();
    let mut reps = 0;
    while reps < 3 || start.elapsed().as_secs_f64() < 0.3 {
        let t = Instant::now();
        f();
        best = best.max(elems / t.elapsed().as_secs_f64());
        reps += 1;
    }
    best
}

/// Random bytes with every f16 scale replaced by a finite value in [2^-14, 2) (a realistic range;
/// NaN/inf scales would only measure the same code on other numbers).
fn random_matrix(ty: QuantType, len: usize, seed: &mut u64) -> Vec<u8> {
    let mut next = || {
        *seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut v: Vec<u8> = (0..len).map(|_| next() as u8).collect();
    let scale = |r: u64| ((r as u16) & 0x3FFF).max(0x0400).to_le_bytes();
    // (an f16 or bf16 "block" is one value: kept finite too)
    let fields: &[usize] = match ty {
        QuantType::F16 | QuantType::BF16 => &[0],
        _ => ty.f16_scale_fields(),
    };
    for b in v.chunks_exact_mut(ty.type_size()) {
        for &o in fields {
            b[o..o + 2].copy_from_slice(&scale(next()));
        }
        if ty == QuantType::Q8K {
            b[..4].copy_from_slice(&1.0e-3f32.to_le_bytes());
        }
        if ty == QuantType::MXFP4 {
            b[0] = 112 + (next() % 24) as u8; // 2^-16 .. 2^7
        }
    }
    v
}

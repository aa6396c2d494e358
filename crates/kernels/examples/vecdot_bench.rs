//! Integer dot-product throughput (quant::vecdot), per weight type: the scalar twin, the
//! AVX-512 one-row kernel (`vec_dot`), the 4-row kernel (`matvec_q`), and for comparison the
//! dequantize-to-f32 path the engine used before (`dot_row`).
//!
//! `cargo run --release -p cortiq-kernels --example vecdot_bench [-- ROWS COLS]`
//!
//! A [ROWS, COLS] weight times one activation row quantized once with `quantize_act`, as decode
//! does. Default: 256 x 2048 (cache-resident: the kernels' own speed) and 8192 x 2048 (tens of
//! MiB: closer to decode, which streams weights from memory). Prints G weights/s, the best of
//! several repetitions (the machine may be shared: compare the ratios, not the absolutes), and
//! the 4-row kernel's weight bytes read per second (GB/s, what bounds decode).

use cortiq_kernels::quant::{QuantType, act_type, dot_row, matvec_q, quantize_act, vec_dot, vec_dot_scalar};
use std::hint::black_box;

mod common;
use common::{best_secs, next, random_matrix};

const TYPES: [QuantType; 18] = [
    QuantType::Q8_0,
    QuantType::Q4_1,
    QuantType::Q5_0,
    QuantType::Q4K,
    QuantType::Q6K,
    QuantType::Q4_0,
    QuantType::Q5_1,
    QuantType::Q5K,
    QuantType::Q3K,
    QuantType::Q2K,
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
    println!("AVX-512 VNNI vec_dot active: {}", cortiq_kernels::quant::vecdot_avx512::available());
    for (rows, cols) in shapes {
        bench(rows, cols);
    }
}

fn bench(rows: usize, cols: usize) {
    println!("\n{rows} x {cols} weight . one quantized activation row, G weights/s");
    println!(
        "{:>7} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>9} {:>9}",
        "type", "MiB", "f32 path", "scalar", "simd 1r", "simd 4r", "4r/scal", "4r/f32", "quant µs", "4r GB/s"
    );
    let mut seed = 0x00C0_FFEEu64;
    for ty in TYPES {
        let (Some(rb), Some(at)) = (ty.row_bytes(cols), act_type(ty)) else {
            println!("{ty:>5}: {cols} columns is not a whole number of blocks, skipped");
            continue;
        };
        let w = random_matrix(ty, rows, rb, &mut seed);
        let x: Vec<f32> = (0..cols).map(|_| (next(&mut seed) % 2001) as f32 / 1000.0 - 1.0).collect();
        let mut a = Vec::new();
        let quant_s = best_secs(|| quantize_act(at, black_box(&x), &mut a));
        let elems = (rows * cols) as f64;
        let mut y = vec![0f32; rows];
        let f32_path = elems
            / best_secs(|| {
                for (o, r) in y.iter_mut().zip(w.chunks_exact(rb)) {
                    *o = dot_row(ty, black_box(r), &x);
                }
                black_box(&mut y);
            });
        let scalar = elems
            / best_secs(|| {
                for (o, r) in y.iter_mut().zip(w.chunks_exact(rb)) {
                    *o = vec_dot_scalar(ty, black_box(r), &a, cols);
                }
                black_box(&mut y);
            });
        let one = elems
            / best_secs(|| {
                for (o, r) in y.iter_mut().zip(w.chunks_exact(rb)) {
                    *o = vec_dot(ty, black_box(r), &a, cols);
                }
                black_box(&mut y);
            });
        let four = elems
            / best_secs(|| {
                matvec_q(ty, black_box(&w), rows, cols, &a, &mut y);
                black_box(&mut y);
            });
        let mib = w.len() as f64 / (1 << 20) as f64;
        println!(
            "{:>7} {mib:>8.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>7.1}x {:>7.1}x {:>9.2} {:>9.2}",
            ty.name(),
            f32_path / 1e9,
            scalar / 1e9,
            one / 1e9,
            four / 1e9,
            four / scalar,
            four / f32_path,
            quant_s * 1e6,
            four / 1e9 * w.len() as f64 / elems
        );
    }
}

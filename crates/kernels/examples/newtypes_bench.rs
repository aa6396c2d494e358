//! Throughput of cortiq's own weight types (q8r, q4t, q1) against Q8_0 and Q4_K, single thread.
//!
//! `cargo run --release -p cortiq-kernels --example newtypes_bench [-- ROWS COLS]`
//!
//! 1. `matvec_q` over a large weight matrix (default 262144 x 640, Gemma 3's tied embedding /
//!    output matrix, 168M weights streamed from memory, as decode does), one activation row
//!    quantized once. Q4_K needs rows that are a multiple of 256, so it runs 163840 x 1024 (the
//!    same weight count) and q4t runs that shape too for a like-for-like line.
//! 2. The same on 256 x 2048 (cache-resident: the kernels' own speed).
//! 3. `dequantize_row` and `quantize_row` speed per type (a 2048-wide row).
//!
//! Prints G weights/s (best of several runs; the machine may be shared, compare ratios).

use cortiq_kernels::quant::{QuantType, act_type, dequantize_row, matvec_q, quantize_act, quantize_row};
use std::hint::black_box;
use std::time::Instant;

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    println!("AVX-512 VNNI vec_dot active: {}", cortiq_kernels::quant::vecdot_avx512::available());
    let big = match args[..] {
        [rows, cols, ..] => vec![(rows, cols)],
        _ => vec![(262144, 640), (163840, 1024)],
    };
    let types = [QuantType::Q8_0, QuantType::Q4K, QuantType::Q8R, QuantType::Q4T, QuantType::Q1];
    println!("\nmatvec_q, single thread, G weights/s (GB/s of weight bytes)");
    for &(rows, cols) in big.iter().chain(&[(256, 2048)]) {
        println!("{rows} x {cols}:");
        for ty in types {
            let Some(rb) = ty.row_bytes(cols) else {
                println!("  {:>5}: {cols} columns is not a whole number of blocks", ty.name());
                continue;
            };
            let w = matrix(ty, rows, cols);
            let x = gauss_row(cols, 7);
            let mut a = Vec::new();
            quantize_act(act_type(ty).unwrap(), &x, &mut a);
            let mut y = vec![0f32; rows];
            let reps = if rows * cols > 1 << 24 { 5 } else { 200 };
            let s = best_secs(reps, || matvec_q(ty, black_box(&w), rows, cols, &a, &mut y));
            let gw = (rows * cols) as f64 / s / 1e9;
            println!(
                "  {:>5}: {gw:6.2} G weights/s  ({:5.1} GB/s, {:6.1} MiB)",
                ty.name(),
                (rows * rb) as f64 / s / 1e9,
                (rows * rb) as f64 / 1048576.0
            );
        }
    }
    println!("\ndequantize_row / quantize_row, 2048-wide row, single thread");
    for ty in types {
        let n = 2048;
        let w = matrix(ty, 1, n);
        let mut y = vec![0f32; n];
        let s = best_secs(2000, || dequantize_row(ty, black_box(&w), &mut y));
        print!("  {:>5}: dequantize {:6.2} G elem/s", ty.name(), n as f64 / s / 1e9);
        if ty.is_cortiq() {
            let x = gauss_row(n, 3);
            let mut out = vec![0u8; ty.row_bytes(n).unwrap()];
            let s = best_secs(50, || quantize_row(ty, black_box(&x), &mut out).unwrap());
            print!(", quantize_row {:7.1} M weights/s", n as f64 / s / 1e6);
        }
        println!();
    }
}

/// Best wall time of `reps` runs of `f`.
fn best_secs(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// Roughly Gaussian values (sum of 4 uniforms), deterministic.
fn gauss_row(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut u = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..n).map(|_| (u() + u() + u() + u() - 2.0) * 0.05).collect()
}

/// A [rows, cols] matrix of `ty`: 512 distinct rows (quantized from random values for cortiq's
/// types, random bytes with sane f16 scales for the GGUF ones), repeated. The content does not
/// change the speed; quantizing 168M weights with q4t's search would take longer than the bench.
fn matrix(ty: QuantType, rows: usize, cols: usize) -> Vec<u8> {
    let rb = ty.row_bytes(cols).unwrap();
    let distinct = rows.min(512);
    let mut base = vec![0u8; distinct * rb];
    for (r, row) in base.chunks_exact_mut(rb).enumerate() {
        if ty.is_cortiq() {
            quantize_row(ty, &gauss_row(cols, r as u64 + 1), row).unwrap();
        } else {
            let mut s = r as u64 * 0x2545_F491_4F6C_DD1D + 1;
            for b in row.iter_mut() {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                *b = s as u8;
            }
            // f16 scale fields: 2^-7 (Q8_0: d at 0 of 34; Q4_K: d, dmin at 0, 2 of 144)
            let (bs, fields): (usize, &[usize]) = if ty == QuantType::Q8_0 { (34, &[0]) } else { (144, &[0, 2]) };
            for b in row.chunks_exact_mut(bs) {
                for &o in fields {
                    b[o..o + 2].copy_from_slice(&0x2000u16.to_le_bytes());
                }
            }
        }
    }
    let mut w = Vec::with_capacity(rows * rb);
    while w.len() < rows * rb {
        let take = (rows * rb - w.len()).min(base.len());
        w.extend_from_slice(&base[..take]);
    }
    w
}

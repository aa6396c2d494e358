//! Prefill matrix-matrix throughput (quant::matmat), per weight type, single thread:
//! `matmat_q` (AVX-512 VNNI), `matmat_q_prepared` (activation scalars prepared once per
//! matmul, as an engine sharing one `MatmatActs` across its pool would), the scalar twin, and
//! the f32 path the engine used before
//! (dequantize a 32-row weight tile with `dequantize_row`, then `dot::gemm_nt`, as
//! engine/src/qtensor.rs `tile_times` does).
//!
//! `cargo run --release -p cortiq-kernels --example matmat_bench [-- ROWS COLS TOKENS] [all]`
//! (env `RANGE`: rows per call, default 32)
//!
//! Default shapes (rows, cols, tokens): Gemma3-270M's FFN up/down and Qwen2.5-0.5B's, at 64 or
//! 128 tokens. Both fast paths are called per 32-row range, as the engine's thread pool splits a
//! matmul (so matmat_q's per-call activation prep is counted); activation quantization (once
//! per matmul in the engine) is not. Prints G MAC/s, the best of several repetitions (the
//! machine may be shared: compare the ratios). `all` adds Q4_0, Q5_1, Q5_K, Q3_K, Q2_K and the
//! lookup-table types IQ4_NL, IQ4_XS, MXFP4 and the grid types IQ2_XXS .. IQ3_S; `lut` runs only
//! the lookup-table types, `grid` only the grid types.

use cortiq_kernels::dot::gemm_nt;
use cortiq_kernels::quant::{
    MatmatActs, QuantType, act_type, dequantize_act, dequantize_row, matmat_q, matmat_q_prepared, matmat_q_scalar, quantize_act,
};
use std::hint::black_box;

mod common;
use common::{best_secs, next, random_matrix};

const MAIN: [QuantType; 5] = [QuantType::Q4K, QuantType::Q5_0, QuantType::Q6K, QuantType::Q8_0, QuantType::Q4_1];
const MORE: [QuantType; 5] = [QuantType::Q4_0, QuantType::Q5_1, QuantType::Q5K, QuantType::Q3K, QuantType::Q2K];
/// The lookup-table types (`lut` alone, or with `all`).
const LUT: [QuantType; 3] = [QuantType::IQ4NL, QuantType::IQ4XS, QuantType::MXFP4];
/// The 2-/3-bit grid types (`grid` alone, or with `all`): no matmat kernel, so `matmat` is
/// one `vec_dot` per (row, token).
const GRID: [QuantType; 5] = [QuantType::IQ2XXS, QuantType::IQ2XS, QuantType::IQ2S, QuantType::IQ3XXS, QuantType::IQ3S];
/// Rows per call, as the engine's pool splits a matmul (env `RANGE`, default 32).
static RANGE: std::sync::LazyLock<usize> =
    std::sync::LazyLock::new(|| std::env::var("RANGE").ok().and_then(|v| v.parse().ok()).unwrap_or(32));

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let nums: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let shapes = match nums[..] {
        [rows, cols, n_t, ..] => vec![(rows, cols, n_t)],
        _ => vec![(2048, 640, 64), (640, 2048, 64), (4864, 896, 64), (896, 4864, 128)],
    };
    let has = |s: &str| args.iter().any(|a| a == s);
    let mut types = if (has("lut") || has("grid")) && !has("all") { Vec::new() } else { MAIN.to_vec() };
    if has("all") {
        types.extend(MORE);
    }
    if has("all") || has("lut") {
        types.extend(LUT);
    }
    if has("all") || has("grid") {
        types.extend(GRID);
    }
    println!("AVX-512 VNNI active: {}", cortiq_kernels::quant::vecdot_avx512::available());
    for (rows, cols, n_t) in shapes {
        bench(&types, rows, cols, n_t);
    }
}

fn bench(types: &[QuantType], rows: usize, cols: usize, n_t: usize) {
    println!("\n{rows} x {cols} weight x {n_t} tokens, G MAC/s (single thread, {}-row calls)", *RANGE);
    println!(
        "{:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "type", "f32 path", "scalar", "matmat", "prepared", "/f32", "prep/f32", "/scalar"
    );
    let mut seed = 0x00C0_FFEEu64;
    for &ty in types {
        let (Some(rb), Some(at)) = (ty.row_bytes(cols), act_type(ty)) else {
            println!("{ty:>5}: {cols} columns is not a whole number of blocks, skipped");
            continue;
        };
        let w = random_matrix(ty, rows, rb, &mut seed);
        // activations: quantized rows for matmat, their exact f32 decode for the f32 path
        let mut acts = Vec::new();
        let mut xf = vec![0f32; n_t * cols];
        let mut q = Vec::new();
        let mut wide = vec![0f64; cols];
        for t in 0..n_t {
            let x: Vec<f32> = (0..cols).map(|_| (next(&mut seed) % 2001) as f32 / 1000.0 - 1.0).collect();
            quantize_act(at, &x, &mut q);
            dequantize_act(at, &q, &mut wide);
            for (o, &v) in xf[t * cols..(t + 1) * cols].iter_mut().zip(&wide) {
                *o = v as f32;
            }
            acts.extend_from_slice(&q);
        }
        let macs = (rows * cols * n_t) as f64;
        let mut y = vec![0f32; rows * n_t];
        let mut tile = vec![0f32; *RANGE * cols];
        let f32_path = macs
            / best_secs(|| {
                for (r0, out) in (0..rows).step_by(*RANGE).zip(y.chunks_mut(*RANGE * n_t)) {
                    let nr = out.len() / n_t;
                    dequantize_row(ty, black_box(&w[r0 * rb..(r0 + nr) * rb]), &mut tile[..nr * cols]);
                    gemm_nt(&tile[..nr * cols], nr, &xf, n_t, cols, out, n_t);
                }
                black_box(&mut y);
            });
        let fast = macs
            / best_secs(|| {
                for (r0, out) in (0..rows).step_by(*RANGE).zip(y.chunks_mut(*RANGE * n_t)) {
                    let nr = out.len() / n_t;
                    matmat_q(ty, black_box(&w[r0 * rb..(r0 + nr) * rb]), nr, cols, &acts, n_t, out);
                }
                black_box(&mut y);
            });
        let prepared = macs
            / best_secs(|| {
                let pa = MatmatActs::new(ty, &acts, cols, n_t);
                for (r0, out) in (0..rows).step_by(*RANGE).zip(y.chunks_mut(*RANGE * n_t)) {
                    let nr = out.len() / n_t;
                    matmat_q_prepared(ty, black_box(&w[r0 * rb..(r0 + nr) * rb]), nr, &pa, out);
                }
                black_box(&mut y);
            });
        // the scalar twin on one range only (it is slow), scaled to MAC/s
        let nr = RANGE.min(rows);
        let scalar = (nr * cols * n_t) as f64
            / best_secs(|| {
                matmat_q_scalar(ty, black_box(&w[..nr * rb]), nr, cols, &acts, n_t, &mut y[..nr * n_t]);
                black_box(&mut y);
            });
        println!(
            "{:>7} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>8.1}x {:>8.1}x {:>8.1}x",
            ty.name(),
            f32_path / 1e9,
            scalar / 1e9,
            fast / 1e9,
            prepared / 1e9,
            fast / f32_path,
            prepared / f32_path,
            fast / scalar
        );
    }
}

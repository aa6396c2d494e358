//! Multi-column decode matvec (`matvec_fast_multi`), single thread: k activation rows through
//! one weight stream (Q4_K, Q6_K, Q8_0, Q5_0) against k separate `matvec_fast` calls, on a cache-resident matrix
//! and a streamed one (larger than L3). Prints, per k, the time of one call and the products
//! computed per second (k × rows × cols weight·activation products, in G/s) for both, best of
//! several repetitions; the ratio is what batching k sequences' decode rows buys.
//!
//! `[KS=1,2,4,8,16] [IL_ONLY=1] cargo run --release -p cortiq-kernels --example multivec_bench [-- ROWS COLS] [TYPE ...]`
//! (TYPE: q4_k, q6_k, q8_0, q5_0, q4_0, q4_1, q5_1; default the first four; Q4_0 / Q5_0 / Q8_0
//! also run in the 16-row interleaved layout, `quant::ileave`)

use cortiq_kernels::quant::{
    QuantType, act_type, ileave, ileave_rows, ileave_supported, matvec_fast, matvec_fast_multi, matvec_ileave, quantize_act,
};
use std::hint::black_box;

mod common;
use std::time::Instant;

fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    let mut b = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        f();
        b = b.min(t.elapsed().as_secs_f64());
    }
    b
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let shapes = match args[..] {
        [r, c, ..] => vec![(r, c)],
        _ => vec![(2048, 1024), (65536, 1024)],
    };
    let all =
        [QuantType::Q4K, QuantType::Q6K, QuantType::Q8_0, QuantType::Q5_0, QuantType::Q4_0, QuantType::Q4_1, QuantType::Q5_1];
    let mut types: Vec<QuantType> = std::env::args()
        .skip(1)
        .filter_map(|a| all.iter().copied().find(|t| t.to_string().to_lowercase() == a.to_lowercase()))
        .collect();
    if types.is_empty() {
        types = all[..4].to_vec();
    }
    // env KS: the column counts (default 1,2,4,8,16; a prompt chunk takes up to 256)
    let ks: Vec<usize> = std::env::var("KS")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2, 4, 8, 16]);
    // env IL_ONLY=1: the interleaved kernel only
    let il_only = std::env::var("IL_ONLY").is_ok_and(|v| v == "1");
    for ty in types {
        let at = act_type(ty).unwrap();
        for &(rows, cols) in &shapes {
            let rb = ty.row_bytes(cols).unwrap();
            let w = common::random_weights(ty, rows, cols, 0x9E37_79B9);
            let reps = if rows * rb > 16 << 20 { 5 } else { 50 };
            if ileave_supported(ty) {
                // the inverse layout change prefill pays per matmul over whole tiles
                let p = ileave(ty, &w, rows, cols);
                let mut back = vec![0u8; rows * rb];
                let t = best(reps, || ileave_rows(ty, black_box(&p), cols, 0, rows, &mut back));
                println!("{ty} {rows} x {cols}: un-interleave {:.3} ms ({:.1} GB/s)", t * 1e3, (rows * rb) as f64 / t / 1e9);
            }
            println!(
                "{ty} {rows} x {cols} ({:.1} MB): k   multi ms   G prod/s   k x single ms   G prod/s   ratio",
                (rows * rb) as f64 / 1e6
            );
            let il = (ileave_supported(ty) && rows % 16 == 0).then(|| ileave(ty, &w, rows, cols));
            for &k in ks.iter() {
                let mut acts = Vec::new();
                let mut a = Vec::new();
                for j in 0..k {
                    let x: Vec<f32> = (0..cols).map(|i| ((i * (j + 3)) as f32 * 0.37).sin()).collect();
                    quantize_act(at, &x, &mut a);
                    acts.extend_from_slice(&a);
                }
                let ab = acts.len() / k;
                let mut y = vec![0f32; rows * k];
                let mut yj = vec![0f32; rows];
                let prods = (k * rows * cols) as f64;
                // the interleaved layout (packed once per matrix, outside the k loop's timing)
                if let Some(p) = &il {
                    let mut ys: Vec<&mut [f32]> = y.chunks_exact_mut(rows).collect();
                    let ti = best(reps, || matvec_ileave(ty, black_box(p), cols, &acts, &mut ys));
                    println!("                        interleaved {k:>2}   {:>8.3}   {:>8.1}", ti * 1e3, prods / ti / 1e9);
                }
                if il_only {
                    continue;
                }
                let tm = best(reps, || matvec_fast_multi(ty, black_box(&w), rows, cols, &acts, k, &mut y));
                let ts = best(reps, || {
                    for j in 0..k {
                        matvec_fast(ty, black_box(&w), rows, cols, &acts[j * ab..(j + 1) * ab], &mut yj);
                    }
                });
                black_box((&y, &yj));
                println!(
                    "                                 {k:>2}   {:>8.3}   {:>8.1}   {:>13.3}   {:>8.1}   {:>5.2}",
                    tm * 1e3,
                    prods / tm / 1e9,
                    ts * 1e3,
                    prods / ts / 1e9,
                    ts / tm
                );
            }
        }
    }
}

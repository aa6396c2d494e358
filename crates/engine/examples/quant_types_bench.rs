//! Matrix products per GGUF weight type through `QTensor`, the engine's own path (fast
//! numerics, interleaved where the type has the layout, the thread pool), on the shape
//! llama.cpp's `test-backend-ops perf -o MUL_MAT` uses for every type: weights 4096 × 14336,
//! times n = 1 (decode: a matrix-vector product) and n = 512 (a prompt chunk) f32 columns.
//! `bench/quant_types.sh` runs both tools and prints the ratios.
//!
//! `cargo run --release -p cortiq-engine --example quant_types_bench -- [THREADS] [NS] [TYPES] [plain]`
//! (NS: comma-separated column counts, default 1,512; TYPES: comma-separated ggml names (q4_K),
//! or `all`; `plain`: keep every matrix in GGUF's row-major layout, as llama.cpp's
//! test-backend-ops keeps its weights, without the repacking llama-bench does). Prints one line per type and n: `TYPE n=N: G GFLOPS (B GB/s of weights)`, the
//! best of the repetitions (~1 s per case; the machine may be shared: compare ratios measured
//! in one run). Weights are random blocks with small finite scales: speed does not depend on
//! the values.

use std::hint::black_box;
use std::sync::Arc;

use cortiq_engine::qtensor::QTensor;
use cortiq_engine::{Numerics, par};

#[path = "../../kernels/examples/common/mod.rs"]
mod common;
use common::{next, random_matrix};
use cortiq_kernels::quant::QuantType;

const M: usize = 4096;
const K: usize = 14336;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let threads = args.first().and_then(|a| a.parse().ok()).unwrap_or(2);
    let ns: Vec<usize> =
        args.get(1).map(|a| a.split(',').filter_map(|n| n.parse().ok()).collect()).unwrap_or_else(|| vec![1, 512]);
    let only: Option<Vec<String>> = args.get(2).filter(|a| *a != "all").map(|a| a.split(',').map(String::from).collect());
    let plain = args.get(3).is_some_and(|a| a == "plain");
    par::init(threads).unwrap();
    let mut seed = 0x5EED_u64;
    // Every GGUF weight type: the quantized ones (not the floats, not Q8_K, an activation format).
    let types =
        QuantType::ALL.into_iter().filter(|t| !matches!(t, QuantType::F32 | QuantType::F16 | QuantType::BF16 | QuantType::Q8K));
    for ty in types {
        let name = ty.name();
        if only.as_ref().is_some_and(|o| !o.iter().any(|n| n.eq_ignore_ascii_case(name))) {
            continue;
        }
        let rb = ty.row_bytes(K).expect("14336 is a whole number of blocks of every type");
        let bytes = random_matrix(ty, M, rb, &mut seed);
        let mut w = QTensor::new(name, ty, M, K, Arc::new(bytes), 0).expect("sizes agree");
        // As `Model::set_numerics` leaves a dense layer's matrix under fast numerics.
        w.set_numerics(Numerics::Fast, true);
        w.set_interleaved(!plain);
        for &n in &ns {
            let x: Vec<f32> = (0..n * K).map(|_| (next(&mut seed) >> 40) as f32 / (1u64 << 24) as f32 - 0.5).collect();
            let mut y = vec![0f32; n * M]; // [n, M]
            let s = common::best_secs_for(1.0, || w.matmul(black_box(&x), n, &mut y));
            let gflops = 2.0 * (M * K * n) as f64 / s / 1e9;
            let gbs = (M * rb) as f64 / s / 1e9;
            println!("{name} n={n}: {gflops:.2} GFLOPS ({gbs:.2} GB/s of weights)");
        }
    }
}

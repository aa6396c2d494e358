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
use std::time::Instant;

use cortiq_engine::qtensor::QTensor;
use cortiq_engine::{Numerics, par};
use cortiq_kernels::quant::QuantType;

const M: usize = 4096;
const K: usize = 14336;

const TYPES: [QuantType; 18] = [
    QuantType::Q4_0,
    QuantType::Q4_1,
    QuantType::Q5_0,
    QuantType::Q5_1,
    QuantType::Q8_0,
    QuantType::Q2K,
    QuantType::Q3K,
    QuantType::Q4K,
    QuantType::Q5K,
    QuantType::Q6K,
    QuantType::IQ2XXS,
    QuantType::IQ2XS,
    QuantType::IQ2S,
    QuantType::IQ3XXS,
    QuantType::IQ3S,
    QuantType::IQ4NL,
    QuantType::IQ4XS,
    QuantType::MXFP4,
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let threads = args.first().and_then(|a| a.parse().ok()).unwrap_or(2);
    let ns: Vec<usize> =
        args.get(1).map(|a| a.split(',').filter_map(|n| n.parse().ok()).collect()).unwrap_or_else(|| vec![1, 512]);
    let only: Option<Vec<String>> = args.get(2).filter(|a| *a != "all").map(|a| a.split(',').map(String::from).collect());
    let plain = args.get(3).is_some_and(|a| a == "plain");
    par::init(threads).unwrap();
    let mut seed = 0x5EED_u64;
    for ty in TYPES {
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
            let s = best_secs(|| w.matmul(black_box(&x), n, &mut y));
            let gflops = 2.0 * (M * K * n) as f64 / s / 1e9;
            let gbs = (M * rb) as f64 / s / 1e9;
            println!("{name} n={n}: {gflops:.2} GFLOPS ({gbs:.2} GB/s of weights)");
        }
    }
}

/// Best seconds per call over repetitions lasting ~1 s in all (at least 3).
fn best_secs(mut f: impl FnMut()) -> f64 {
    f(); // warm caches and the pool
    let mut best = f64::INFINITY;
    let start = Instant::now();
    let mut reps = 0;
    while reps < 3 || start.elapsed().as_secs_f64() < 1.0 {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        reps += 1;
    }
    best
}

fn next(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Random blocks with small finite f16 scales at each type's scale fields (as the kernels'
/// vecdot_bench draws them).
fn random_matrix(ty: QuantType, rows: usize, rb: usize, seed: &mut u64) -> Vec<u8> {
    let mut v: Vec<u8> = (0..rows * rb).map(|_| next(seed) as u8).collect();
    let fields: &[usize] = match ty {
        QuantType::Q4_0 | QuantType::Q5_0 | QuantType::Q8_0 | QuantType::IQ4NL | QuantType::IQ4XS => &[0],
        QuantType::IQ2XXS | QuantType::IQ2XS | QuantType::IQ2S | QuantType::IQ3XXS | QuantType::IQ3S => &[0],
        QuantType::Q4_1 | QuantType::Q5_1 | QuantType::Q4K | QuantType::Q5K => &[0, 2],
        QuantType::Q2K => &[80, 82],
        QuantType::Q3K => &[108],
        QuantType::Q6K => &[208],
        _ => &[],
    };
    for b in v.chunks_exact_mut(ty.type_size()) {
        for &off in fields {
            b[off..off + 2].copy_from_slice(&0x2000u16.to_le_bytes()); // 2^-7
        }
        if ty == QuantType::MXFP4 {
            b[0] = 121; // 2^-7
        }
    }
    v
}

//! QTensor products in fast numerics: the speculative pair (`matvec2`, one weight stream for
//! two inputs) and a prefill chunk (`matmul` with n_t tokens, the integer matmat, split by
//! tokens over the pool from 32 tokens) against one decode matvec per token — the same 8-bit
//! activations, different kernels and float orders — within 1e-5 of Σ|w·x| per output.

use std::sync::Arc;

use cortiq_engine::compat::Numerics;
use cortiq_engine::qtensor::QTensor;
use cortiq_kernels::quant::QuantType;
use cortiq_testkit::XorShift as Rng;
use cortiq_testkit::{max_err, nan_max};
use half::f16;

/// Random blocks of `ty` with sane f16 (MXFP4: E8M0) scale fields.
fn random_tensor(ty: QuantType, rows: usize, cols: usize, rng: &mut Rng) -> QTensor {
    let rb = ty.row_bytes(cols).unwrap();
    let bb = ty.type_size();
    let mut w: Vec<u8> = (0..rows * rb).map(|_| rng.next() as u8).collect();
    let h = |rng: &mut Rng| f16::from_f32(0.001 + 0.01 * rng.f().abs()).to_le_bytes();
    for blk in w.chunks_exact_mut(bb) {
        match ty {
            QuantType::Q4K | QuantType::Q5K => {
                blk[..2].copy_from_slice(&h(rng));
                blk[2..4].copy_from_slice(&h(rng));
            }
            QuantType::Q6K => blk[bb - 2..].copy_from_slice(&h(rng)),
            // E8M0: 2^(e - 128), 2^-10 .. 2^-3
            QuantType::MXFP4 => blk[0] = 118 + (rng.next() % 8) as u8,
            QuantType::Q4_1 | QuantType::Q5_1 => {
                blk[..2].copy_from_slice(&h(rng));
                blk[2..4].copy_from_slice(&h(rng));
            }
            _ => blk[..2].copy_from_slice(&h(rng)),
        }
    }
    let mut t = QTensor::new(format!("w.{ty}"), ty, rows, cols, Arc::new(w), 0).unwrap();
    t.set_numerics(Numerics::Fast, true);
    t
}

/// Worst |a - b| / Σ|w·x| over the outputs (the dequantized weights' magnitudes times |x|).
fn worst(w: &QTensor, x: &[f32], a: &[f32], b: &[f32]) -> f64 {
    let mut row = vec![0f32; w.cols];
    // max_err propagates a NaN output (f64::max would drop it and pass).
    max_err((0..w.rows).map(|r| {
        w.row_f32(r, &mut row);
        let scale: f64 = row.iter().zip(x).map(|(p, q)| (*p as f64 * *q as f64).abs()).sum::<f64>().max(1e-30);
        (a[r] as f64 - b[r] as f64).abs() / scale
    }))
}

#[test]
fn matvec2_and_prefill_match_single_token_matvecs() {
    let mut rng = Rng(0xC0FF_EE12_3456_789B);
    for ty in [
        QuantType::Q4K,
        QuantType::Q5_0,
        QuantType::Q6K,
        QuantType::Q8_0,
        QuantType::Q4_1,
        QuantType::IQ4NL,
        QuantType::IQ4XS,
        QuantType::MXFP4,
        QuantType::IQ2XXS,
        QuantType::IQ2XS,
        QuantType::IQ2S,
        QuantType::IQ3XXS,
        QuantType::IQ3S,
    ] {
        let (rows, cols) = (70, 512);
        let w = random_tensor(ty, rows, cols, &mut rng);
        let n_t = 40; // >= 16 per thread on 2 threads: the token-split path
        let x: Vec<f32> = (0..n_t * cols).map(|_| rng.f() * 2.0).collect();
        let mut single = vec![0f32; n_t * rows];
        for t in 0..n_t {
            w.matmul(&x[t * cols..(t + 1) * cols], 1, &mut single[t * rows..(t + 1) * rows]);
        }
        let (mut y0, mut y1) = (vec![0f32; rows], vec![0f32; rows]);
        w.matvec2(&x[..cols], &x[cols..2 * cols], &mut y0, &mut y1);
        let e2 =
            nan_max(worst(&w, &x[..cols], &y0, &single[..rows]), worst(&w, &x[cols..2 * cols], &y1, &single[rows..2 * rows]));
        let mut chunk = vec![0f32; n_t * rows];
        w.matmul(&x, n_t, &mut chunk);
        let ec = max_err((0..n_t).map(|t| {
            worst(&w, &x[t * cols..(t + 1) * cols], &chunk[t * rows..(t + 1) * rows], &single[t * rows..(t + 1) * rows])
        }));
        println!("{:>5}: matvec2 vs matvec {e2:.2e}, {n_t}-token matmul vs matvec {ec:.2e} (of Σ|w·x|)", ty.name());
        assert!(e2 <= 1e-5 && ec <= 1e-5, "{ty}: matvec2 {e2:e}, matmul {ec:e} from the single-token products");
    }
}

/// `matvec_each` (an MoE layer's experts in one dispatch, each matrix on its own input, some
/// inputs shared) gives every row the bits `matmul(x, 1, ..)` gives it alone: interleaved and
/// row-major matrices, quantized and f32, mixed in one call.
#[test]
fn matvec_each_equals_each_matrix_alone() {
    let mut rng = Rng(0x5EED_0FE4_C4C4_1234);
    let cols = 512;
    let mut ws = Vec::new();
    for (i, ty) in [QuantType::Q4K, QuantType::Q6K, QuantType::Q8_0, QuantType::Q4K, QuantType::F32].into_iter().enumerate() {
        let rows = 40 + 8 * i;
        let mut w = if ty == QuantType::F32 {
            let v: Vec<u8> = (0..rows * cols).flat_map(|_| rng.f().to_le_bytes()).collect();
            QTensor::new("w.f32", ty, rows, cols, Arc::new(v), 0).unwrap()
        } else {
            random_tensor(ty, rows, cols, &mut rng)
        };
        // Row-major (an expert left in its file layout) for every other matrix.
        w.set_numerics(Numerics::Fast, i % 2 == 0);
        ws.push(w);
    }
    let inputs: Vec<Vec<f32>> = (0..3).map(|_| (0..cols).map(|_| rng.f() * 2.0).collect()).collect();
    let which = [0, 1, 0, 2, 1]; // matrices 0 and 2, 1 and 4 share an input
    let refs: Vec<&QTensor> = ws.iter().collect();
    let xs: Vec<&[f32]> = which.iter().map(|&i| &inputs[i][..]).collect();
    let mut y = vec![0f32; ws.iter().map(|w| w.rows).sum()];
    QTensor::matvec_each(&refs, &xs, &mut y);
    let mut at = 0;
    for (w, x) in ws.iter().zip(&xs) {
        let mut alone = vec![0f32; w.rows];
        w.matmul(x, 1, &mut alone);
        let got = &y[at..at + w.rows];
        assert!(
            got.iter().zip(&alone).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{}: matvec_each differs from the matrix alone",
            w.name
        );
        at += w.rows;
    }
}

//! quant::fastvec (decode matvec in cortiq's own order): the AVX-512 kernel against its scalar
//! twin, and both against ggml's `vec_dot_scalar` on the same quantized activations, relative
//! to Σ|w·x̃| (the scale of the rounding). Prints a per-type table (STYLE.md principle 11).

use cortiq_kernels::quant::{
    QuantType, act_type, dequantize_act, dequantize_row, matvec_fast_scalar, matvec_own, quantize_act, vec_dot_scalar,
};
use cortiq_testkit::XorShift as Rng;
use cortiq_testkit::nan_max;
use half::f16;

/// Random blocks with sane f16 scales (and mins) in their first bytes.
fn random_rows(ty: QuantType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let rb = ty.row_bytes(cols).unwrap();
    let bb = ty.type_size();
    let mut w: Vec<u8> = (0..rows * rb).map(|_| rng.next() as u8).collect();
    for blk in w.chunks_exact_mut(bb) {
        blk[..2].copy_from_slice(&f16::from_f32(0.002 + 0.02 * rng.f().abs()).to_le_bytes());
        if matches!(ty, QuantType::Q4_1 | QuantType::Q5_1) {
            blk[2..4].copy_from_slice(&f16::from_f32(0.05 * rng.f()).to_le_bytes());
        }
    }
    w
}

#[test]
fn simd_matches_scalar_twin_and_ggml() {
    let mut rng = Rng(0x5EED_1234_ABCD_0001);
    println!("{:>5} {:>6} {:>14} {:>14}", "type", "cols", "simd-scalar", "fast-ggml");
    for ty in [QuantType::Q4_0, QuantType::Q4_1, QuantType::Q5_0, QuantType::Q5_1, QuantType::Q8_0] {
        let at = act_type(ty).unwrap();
        for cols in [32, 64, 96, 576, 640, 896, 2048] {
            let rows = 37;
            let w = random_rows(ty, rows, cols, &mut rng);
            let x: Vec<f32> = (0..cols).map(|_| rng.f() * 3.0).collect();
            let mut a = Vec::new();
            quantize_act(at, &x, &mut a);
            let (mut ys, mut yv) = (vec![0f32; rows], vec![0f32; rows]);
            matvec_own(ty, &w, rows, cols, &a, &mut yv);
            matvec_fast_scalar(ty, &w, rows, cols, &a, &mut ys);
            // Σ|w·x̃| per row, from the dequantized operands in f64.
            let mut xa = vec![0f64; cols];
            dequantize_act(at, &a, &mut xa);
            let rb = w.len() / rows;
            let (mut worst_sv, mut worst_g) = (0f64, 0f64);
            for r in 0..rows {
                let mut wr = vec![0f32; cols];
                dequantize_row(ty, &w[r * rb..(r + 1) * rb], &mut wr);
                let scale: f64 = wr.iter().zip(&xa).map(|(a, b)| (*a as f64 * b).abs()).sum::<f64>().max(1e-30);
                let g = vec_dot_scalar(ty, &w[r * rb..(r + 1) * rb], &a, cols) as f64;
                // nan_max: a NaN output must fail the bound (f64::max would drop it).
                worst_sv = nan_max(worst_sv, (yv[r] as f64 - ys[r] as f64).abs() / scale);
                worst_g = nan_max(worst_g, (yv[r] as f64 - g).abs() / scale);
            }
            println!("{:>5} {cols:>6} {worst_sv:>14.2e} {worst_g:>14.2e}", ty.name());
            // The AVX2 kernel keeps the scalar twin's block order: equal bit for bit.
            if cortiq_kernels::simd::level() == cortiq_kernels::simd::Level::Avx2 {
                assert!(yv.iter().zip(&ys).all(|(v, s)| v.to_bits() == s.to_bits()), "{ty} cols {cols}: AVX2 != scalar twin");
            }
            assert!(worst_sv <= 1e-6, "{ty} cols {cols}: SIMD vs scalar twin {worst_sv:e} of Σ|w·x|");
            // ggml's Q8_1 `s` is rounded to f16, so the min types agree to that rounding only.
            let tol = if matches!(ty, QuantType::Q4_1 | QuantType::Q5_1) { 1e-3 } else { 1e-6 };
            assert!(worst_g <= tol, "{ty} cols {cols}: fast vs ggml's vec_dot {worst_g:e} of Σ|w·x|");
        }
    }
}

/// Q4_K in our own order (quant/fastk.rs): the AVX-512 kernel equals its scalar twin bit for
/// bit (the lanes are defined so), and both agree with the f64 dot of the dequantized operands
/// (as ggml's `vec_dot_scalar` does) to f32 rounding of Σ|w·x̃|. The blocks carry random
/// 6-bit scales and mins (packed) and f16 d / dmin.
#[test]
fn q4k_own_order_matches_scalar_twin_bitwise_and_ggml() {
    let ty = QuantType::Q4K;
    let at = act_type(ty).unwrap();
    let mut rng = Rng(0x5EED_0004_0000_0004);
    for cols in [256, 1024, 3584] {
        let rows = 29;
        let rb = ty.row_bytes(cols).unwrap();
        let mut w: Vec<u8> = (0..rows * rb).map(|_| rng.next() as u8).collect();
        for blk in w.chunks_exact_mut(ty.type_size()) {
            blk[..2].copy_from_slice(&f16::from_f32(0.001 + 0.01 * rng.f().abs()).to_le_bytes());
            blk[2..4].copy_from_slice(&f16::from_f32(0.002 * rng.f().abs()).to_le_bytes());
        }
        let x: Vec<f32> = (0..cols).map(|_| rng.f() * 3.0).collect();
        let mut a = Vec::new();
        quantize_act(at, &x, &mut a);
        let (mut ys, mut yv) = (vec![0f32; rows], vec![0f32; rows]);
        matvec_own(ty, &w, rows, cols, &a, &mut yv);
        matvec_fast_scalar(ty, &w, rows, cols, &a, &mut ys);
        let first = yv.iter().zip(&ys).position(|(p, q)| p.to_bits() != q.to_bits());
        assert_eq!(first, None, "Q4_K cols {cols}: SIMD {:?} vs scalar twin", first.map(|i| (yv[i], ys[i])));
        let mut xa = vec![0f64; cols];
        dequantize_act(at, &a, &mut xa);
        let (mut worst, mut worst_g) = (0f64, 0f64);
        for r in 0..rows {
            let mut wr = vec![0f32; cols];
            dequantize_row(ty, &w[r * rb..(r + 1) * rb], &mut wr);
            let scale: f64 = wr.iter().zip(&xa).map(|(p, q)| (*p as f64 * q).abs()).sum::<f64>().max(1e-30);
            let exact: f64 = wr.iter().zip(&xa).map(|(p, q)| *p as f64 * q).sum();
            let g = vec_dot_scalar(ty, &w[r * rb..(r + 1) * rb], &a, cols) as f64;
            worst = nan_max(worst, (yv[r] as f64 - exact).abs() / scale);
            worst_g = nan_max(worst_g, (g - exact).abs() / scale);
        }
        println!(
            "Q4_K own order, cols {cols}: SIMD == scalar twin bitwise; |own - f64| {worst:.2e}, |ggml - f64| {worst_g:.2e} of Σ|w·x|"
        );
        assert!(worst <= 1e-6, "Q4_K cols {cols}: {worst:e} of Σ|w·x| from the f64 dot");
    }
}

//! q1: cortiq's 1-bit weight type (scalar reference).
//!
//! Owns: the q1 quantizer, scalar dequantizer and scalar dot product with Q8_0 activations.
//! Block layout: `blocks::BlockQ1` (128 signs + f16 scale, 18 bytes, 1.125 bits per weight).
//! The AVX-512 twins live in `own_avx512.rs`.
//!
//! Element = `±d` with d = mean |w| over the 128-element block: for fixed signs that is the
//! scale minimizing the squared error (d* = Σ|w| / n). Zero maps to +d. Quality is poor by
//! nature (a Gaussian row keeps ~60% of its RMS as error); the type exists for experiments with
//! trained or distilled 1-bit weights, which it stores exactly up to the f16 scale.

use super::blocks::*;
use half::f16;

/// Quantize one row (`src.len()` a multiple of 128, `out.len() == src.len() / 128 * 18`, finite
/// values, `importance` (if any) as long as `src`, finite and >= 0: checked by
/// `quantize::quantize_row_weighted`). With importance the scale is the weighted mean
/// Σ w|x| / Σ w, which minimizes Σ w (x - x̂)² for the fixed signs (a block whose importance is
/// all zero uses the plain mean).
pub(super) fn quantize(src: &[f32], importance: Option<&[f32]>, out: &mut [u8]) {
    for (b, (x, ob)) in src.chunks_exact(QK_T).zip(out.chunks_exact_mut(size_of::<BlockQ1>())).enumerate() {
        // f64 sums: 128 terms, one rounding at the end
        let plain = || x.iter().map(|&v| v.abs() as f64).sum::<f64>() / QK_T as f64;
        let mean = match importance.map(|imp| &imp[QK_T * b..QK_T * (b + 1)]) {
            Some(w) if w.iter().any(|&v| v > 0.0) => {
                let sw: f64 = w.iter().map(|&v| v as f64).sum();
                x.iter().zip(w).map(|(&v, &w)| v.abs() as f64 * w as f64).sum::<f64>() / sw
            }
            _ => plain(),
        } as f32;
        let mut bits = [0u8; QK_T / 8];
        for (i, &v) in x.iter().enumerate() {
            // v >= 0 (-0.0 included: it is not negative) -> +d; inputs are finite here
            if v >= 0.0 {
                bits[i / 8] |= 1 << (i % 8);
            }
        }
        ob[..QK_T / 8].copy_from_slice(&bits);
        ob[QK_T / 8..].copy_from_slice(&f16::from_f32(mean).to_bits().to_le_bytes());
    }
}

/// Scalar dequantization: `+d` where the bit is set, `-d` where clear.
pub(super) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in view::<BlockQ1>(src).iter().zip(dst.chunks_exact_mut(QK_T)) {
        let d = f16_soft(b.d);
        for (i, o) in y.iter_mut().enumerate() {
            *o = if (b.qs[i / 8] >> (i % 8)) & 1 == 1 { d } else { -d };
        }
    }
}

/// Scalar dot with a Q8_0 activation row: per 32-element activation block b of weight block k,
/// `acc += (d_k * d_b) * Σ ±q_x` in f32, block order. Lengths checked by the caller.
pub(super) fn vec_dot(w: &[u8], a: &[u8]) -> f32 {
    let act = view::<BlockQ8_0>(a);
    let mut acc = 0f32;
    for (b, ys) in view::<BlockQ1>(w).iter().zip(act.chunks_exact(QK_T / QK)) {
        let d = f16_soft(b.d);
        for (j, y) in ys.iter().enumerate() {
            let bits = u32::from_le_bytes([b.qs[4 * j], b.qs[4 * j + 1], b.qs[4 * j + 2], b.qs[4 * j + 3]]);
            let p: i32 = y.qs.iter().enumerate().map(|(i, &q)| if (bits >> i) & 1 == 1 { q as i32 } else { -(q as i32) }).sum();
            acc = (d * f16_soft(y.d)).mul_add(p as f32, acc);
        }
    }
    acc
}

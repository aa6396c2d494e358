//! q8r: cortiq's 8-bit row-scaled weight type (scalar reference).
//!
//! Owns: the q8r row layout, its quantizer, scalar dequantizer and scalar dot product with Q8_0
//! activations. The AVX-512 twins live in `own_avx512.rs`.
//!
//! Layout of a row of n elements (n a multiple of 32): n i8 quants q in -127..=127, then one
//! little-endian f32 scale s: `row_bytes(n) = n + 4`, element i = `q[i] * s`. The scale sits at
//! the row's end so the quants of a tensor's first row start where the tensor starts (aligned
//! when the file aligns tensors); rows are n + 4 bytes, so later rows are not aligned anyway.
//! Symmetric, `s = max|w| / 127`: one scale for hundreds of values costs 4 bytes per row, and an
//! 8-bit grid over the row's range is fine-grained enough (~0.7% RMS error on Gaussian rows).
//!
//! Because of the per-row trailer a run of k rows is NOT one longer row (`row_bytes(k*n) !=
//! k * row_bytes(n)`): multi-row callers use `dequant::dequantize_rows`.

use super::blocks::*;

/// Bytes after a row's quants: the f32 scale.
pub const TRAILER: usize = 4;

/// Quantize one row (`out.len() == src.len() + 4`, `src.len()` a multiple of 32, finite values:
/// checked by `quantize::quantize_row`).
pub(super) fn quantize(src: &[f32], out: &mut [u8]) {
    let n = src.len();
    let amax = src.iter().fold(0f32, |m, &v| m.max(v.abs()));
    let s = amax / 127.0;
    let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    for (o, &v) in out[..n].iter_mut().zip(src) {
        // |v * inv| <= 127 up to one rounding: the clamp only guards that ulp
        *o = (v * inv).round().clamp(-127.0, 127.0) as i8 as u8;
    }
    out[n..n + TRAILER].copy_from_slice(&s.to_le_bytes());
}

/// The row's scale.
#[inline]
pub(super) fn scale(row: &[u8]) -> f32 {
    let n = row.len() - TRAILER;
    f32::from_le_bytes([row[n], row[n + 1], row[n + 2], row[n + 3]])
}

/// Scalar dequantization of one row (`src.len() == dst.len() + 4`): `q as f32 * s`.
pub(super) fn dequantize(src: &[u8], dst: &mut [f32]) {
    let s = scale(src);
    for (o, &q) in dst.iter_mut().zip(src) {
        *o = q as i8 as f32 * s;
    }
}

/// Scalar dot with a Q8_0 activation row: `s * Σ_b d_b * Σ_{i in b} q_w,i * q_x,i`, the block
/// terms accumulated in f32 in block order. Lengths checked by the caller.
pub(super) fn vec_dot(w: &[u8], a: &[u8]) -> f32 {
    let s = scale(w);
    let mut acc = 0f32;
    for (wq, y) in w.chunks_exact(QK).zip(view::<BlockQ8_0>(a)) {
        let p: i32 = wq.iter().zip(&y.qs).map(|(&x, &q)| x as i8 as i32 * q as i32).sum();
        acc = f16_soft(y.d).mul_add(p as f32, acc);
    }
    acc * s
}

//! q4t: cortiq's 4-bit tiled weight type (scalar reference).
//!
//! Owns: the q4t quantizer (an error-minimizing scale search), scalar dequantizer and scalar
//! dot product with Q8_0 activations. Block layout: `blocks::BlockQ4T` (128 elements, 4 f16
//! scales + 64 nibble bytes tiled for one 512-bit load, 72 bytes, 4.5 bits per weight). The
//! AVX-512 twins live in `own_avx512.rs`.
//!
//! Why symmetric per-32 scales rather than Q4_K-style per-32 (scale, min) pairs quantized to 6
//! bits under a 256-element super-block: rows must split into 128-element blocks (Gemma 3's
//! width 640 is not a multiple of 256), and 8 header bytes per 128 elements buy either 4 exact
//! f16 scales or 2 (scale, min) pairs per 64. On zero-centred weight groups the min buys little
//! and the smaller group buys more (expected |max| of 32 Gaussians ~2.0σ vs ~2.4σ of 64, so a
//! finer step), and the symmetric form needs no activation sums in the dot product. The 16
//! levels are -8..7: the searched scale may be negative, which puts the extra level on whichever
//! side holds the group's largest magnitude.
//!
//! Scale search (the idea of llama.cpp's make_qkx2_quants, re-derived for this grid): for a
//! range of candidate inverse scales that map the group's largest-magnitude value to levels
//! around -8 and +7, round every value to its level, then take the least-squares scale for those
//! levels (d = Σ x·l / Σ l²; its squared error is Σx² - (Σx·l)² / Σl², no second pass needed).
//! The two best candidates' scales (and the plain max/-8 and max/7) are then rounded to f16, the
//! levels re-rounded against the stored scale and the scale refit once more; the one with the
//! least actual error (stored scale, stored levels) wins. Unweighted squared error: exactly what the tests' RMSE measures.

use super::blocks::*;
use half::f16;

/// Candidate divisors per orientation: the largest magnitude lands on level ±(base ± 1.0) in
/// steps of 1/4 (9 candidates each; 16 or 32 steps and wider ranges measured no better).
const STEPS: usize = 8;

/// Quantize one row (`src.len()` a multiple of 128, `out.len() == src.len() / 128 * 72`, finite
/// values: checked by `quantize::quantize_row`).
pub(super) fn quantize(src: &[f32], out: &mut [u8]) {
    for (x, ob) in src.chunks_exact(QK_T).zip(out.chunks_exact_mut(size_of::<BlockQ4T>())) {
        let mut q = [0u8; QK_T];
        for (g, (xg, qg)) in x.chunks_exact(QK).zip(q.chunks_exact_mut(QK)).enumerate() {
            let d = quantize_group(xg, qg);
            ob[2 * g..2 * g + 2].copy_from_slice(&d.to_le_bytes());
        }
        for (j, o) in ob[8..].iter_mut().enumerate() {
            *o = q[j] | (q[j + QK_T / 2] << 4);
        }
    }
}

/// Levels (0..16, i.e. l + 8) of one 32-element group into `q`; returns the f16 scale bits.
fn quantize_group(x: &[f32], q: &mut [u8]) -> u16 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        q.fill(8);
        return 0;
    }
    let sum_x2: f32 = x.iter().map(|v| v * v).sum();
    // phase 1: every candidate's closed-form least-squares error; keep the best two scales
    let mut top = [(f32::INFINITY, 0f32); 2];
    for (base, sign) in [(8f32, -1f32), (7f32, 1f32)] {
        for k in 0..=STEPS {
            let div = base - 1.0 + 2.0 * k as f32 / STEPS as f32;
            let iscale = sign * div / max;
            let (mut sxl, mut sll) = (0f32, 0f32);
            for &v in x {
                let l = rnd(v * iscale).clamp(-8.0, 7.0);
                sxl += v * l;
                sll += l * l;
            }
            if sll > 0.0 {
                let cand = (sum_x2 - sxl * sxl / sll, sxl / sll);
                if cand.0 < top[0].0 {
                    top = [cand, top[0]];
                } else if cand.0 < top[1].0 {
                    top[1] = cand;
                }
            }
        }
    }
    // phase 2: the actual error with the stored f16 scale and re-rounded levels, refit twice
    // (actual squared error, f16 bits, levels) of the best
    let mut best = (f32::INFINITY, 0u16, [0i8; QK]);
    let mut levels = [0i8; QK];
    for (err, d) in top {
        if err.is_finite() {
            refine(x, d, &mut levels, &mut best);
        }
    }
    // and the plain scales that put the largest magnitude exactly on -8 or 7: when the group
    // sits on such a grid (a constant row, weights that were 4-bit already) phase 1's
    // candidates all tie at ~0 error and may not include the one an f16 can store exactly
    refine(x, -max / 8.0, &mut levels, &mut best);
    refine(x, max / 7.0, &mut levels, &mut best);
    if best.0 == f32::INFINITY {
        // the scale underflows f16 (|w| < ~3e-8 everywhere): store zeros
        q.fill(8);
        return 0;
    }
    for (o, &l) in q.iter_mut().zip(&best.2) {
        *o = (l + 8) as u8;
    }
    best.1
}

/// From scale `d`: round it to f16, re-round the levels against the stored scale, measure the
/// actual error (keeping it in `best` if lower), refit the least-squares scale; twice.
#[inline]
fn refine(x: &[f32], mut d: f32, levels: &mut [i8; QK], best: &mut (f32, u16, [i8; QK])) {
    for _ in 0..2 {
        let dh = f16::from_f32(d);
        let df = dh.to_f32();
        if df == 0.0 || !df.is_finite() {
            return;
        }
        let inv = 1.0 / df;
        let (mut err, mut sxl, mut sll) = (0f32, 0f32, 0f32);
        for (l, &v) in levels.iter_mut().zip(x) {
            let lv = rnd(v * inv).clamp(-8.0, 7.0);
            *l = lv as i8;
            let e = v - df * lv;
            err += e * e;
            sxl += v * lv;
            sll += lv * lv;
        }
        if err < best.0 {
            *best = (err, dh.to_bits(), *levels);
        }
        if sll == 0.0 {
            return;
        }
        d = sxl / sll;
    }
}

/// Round to nearest (ties to even) by the 1.5 * 2^23 trick: `f32::round` is a libm call per
/// value on baseline x86-64 (no SSE4.1), which made the search 5x slower. Exact for |v| < 2^22;
/// beyond that (only for values the clamp after it maps to -8 or 7 anyway) it keeps the sign.
#[inline(always)]
fn rnd(v: f32) -> f32 {
    (v + 12582912.0) - 12582912.0
}

/// Level (0..16) of element e of a block.
#[inline(always)]
fn level(b: &BlockQ4T, e: usize) -> u8 {
    if e < QK_T / 2 { b.qs[e] & 0x0F } else { b.qs[e - QK_T / 2] >> 4 }
}

/// Scalar dequantization: `d[e / 32] * (q - 8)`, one exact product per element (an f16 scale
/// times a 4-bit integer fits f32's mantissa).
pub(super) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in view::<BlockQ4T>(src).iter().zip(dst.chunks_exact_mut(QK_T)) {
        for (g, yg) in y.chunks_exact_mut(QK).enumerate() {
            let d = f16_soft(b.d[g]);
            for (i, o) in yg.iter_mut().enumerate() {
                *o = d * (level(b, QK * g + i) as i32 - 8) as f32;
            }
        }
    }
}

/// Scalar dot with a Q8_0 activation row: per 32-element group g of weight block k (activation
/// block 4k + g), `acc += (d_g * d_x) * Σ (q - 8) * q_x` in f32, block order. Lengths checked by
/// the caller.
pub(super) fn vec_dot(w: &[u8], a: &[u8]) -> f32 {
    let act = view::<BlockQ8_0>(a);
    let mut acc = 0f32;
    for (b, ys) in view::<BlockQ4T>(w).iter().zip(act.chunks_exact(QK_T / QK)) {
        for (g, y) in ys.iter().enumerate() {
            let p: i32 = y.qs.iter().enumerate().map(|(i, &qx)| (level(b, QK * g + i) as i32 - 8) * qx as i32).sum();
            acc = (f16_soft(b.d[g]) * f16_soft(y.d)).mul_add(p as f32, acc);
        }
    }
    acc
}

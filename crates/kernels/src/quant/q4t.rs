//! q4t: cortiq's 4-bit tiled weight type (scalar reference).
//!
//! Owns: the q4t quantizer (an error-minimizing scale search), scalar dequantizer and scalar
//! dot product with Q8_0 activations. Block layout: `blocks::BlockQ4T` (128 elements, 4 f16
//! scales + 64 nibble bytes tiled for one 512-bit load, 72 bytes, 4.5 bits per weight); levels:
//! `blocks::Q4T_LEVELS` (16 non-uniform i8 values). The AVX-512 twins live in `own_avx512.rs`.
//!
//! Why per-32 scales and no mins, rather than Q4_K-style per-32 (scale, min) pairs quantized to
//! 6 bits under a 256-element super-block: rows must split into 128-element blocks (Gemma 3's
//! width 640 is not a multiple of 256), and 8 header bytes per 128 elements buy either 4 exact
//! f16 scales or 2 (scale, min) pairs per 64. On zero-centred weight groups the min buys little
//! and the smaller group buys more (expected |max| of 32 Gaussians ~2.0σ vs ~2.4σ of 64), and the
//! symmetric form needs no per-weight-row activation sums. Why non-uniform levels: see
//! `Q4T_LEVELS` (10-19% less RMS error than the uniform -8..7 at the same size and speed).
//!
//! Scale search (the idea of llama.cpp's make_qkx2_quants, re-derived for this codebook): for a
//! range of candidate scales that map the group's largest-magnitude value to around the lowest
//! (-127) or highest (106) level, round every value to its nearest level, then take the
//! least-squares scale for those levels (d = Σ x·l / Σ l²; its squared error is
//! Σx² - (Σx·l)² / Σl², no second pass needed). The two best candidates' scales (and the plain
//! max/-127, max/106) are then rounded to f16, the levels re-chosen against the stored scale and
//! the scale refit once more; the one with the least actual error (stored scale, stored levels)
//! wins. The error is plain squared error (what the tests' RMSE measures) unless the caller
//! passes per-column importance (`quantize_row_weighted`, e.g. mean x_j² of the activations
//! this matrix multiplies: then the search minimizes the expected output error). Self-derived
//! weights (|x| + group RMS, or x²) measured no better on Gemma 3 (perplexity 17.65 and 18.15 vs
//! 17.64 unweighted), so none are applied by default.

use super::blocks::*;
use half::f16;

/// Candidate scales per end level: the largest magnitude lands at `end * t` for t in 0.8..=1.2
/// in steps of 0.05 (9 candidates each; finer or wider searches measured no better).
const STEPS: usize = 8;

/// Bins of `NEAREST`: one per unit of level over [-LUT_HALF, LUT_HALF).
const LUT_HALF: usize = 160;

/// Midpoints between consecutive levels: level j + 1 is nearer than j above `MID[j]`.
const MID: [f32; 15] = {
    let mut m = [0f32; 15];
    let mut j = 0;
    while j < 15 {
        m[j] = (Q4T_LEVELS[j] as f32 + Q4T_LEVELS[j + 1] as f32) * 0.5;
        j += 1;
    }
    m
};

/// `NEAREST[b]`: the level index nearest to the bin's lower edge `b - LUT_HALF`. Levels are at
/// least 12 apart, so a bin (width 1) holds at most one midpoint and one comparison with `MID`
/// finishes the lookup.
const NEAREST: [u8; 2 * LUT_HALF] = {
    let mut t = [0u8; 2 * LUT_HALF];
    let mut b = 0;
    while b < 2 * LUT_HALF {
        let u = b as f32 - LUT_HALF as f32;
        let mut j = 0;
        while j < 15 && u > MID[j] {
            j += 1;
        }
        t[b] = j as u8;
        b += 1;
    }
    t
};

/// Index of the level nearest to `u` (in level units; ties go down).
#[inline(always)]
fn nearest(u: f32) -> usize {
    let b = (u + LUT_HALF as f32).clamp(0.0, (2 * LUT_HALF - 1) as f32) as usize;
    let j = NEAREST[b] as usize;
    if j < 15 && u > MID[j] { j + 1 } else { j }
}

/// Quantize one row (`src.len()` a multiple of 128, `out.len() == src.len() / 128 * 72`, finite
/// values, `importance` (if any) as long as `src`, finite and >= 0: checked by
/// `quantize::quantize_row_weighted`). The search minimizes Σ importance_i * (x_i - x̂_i)²
/// (plain squared error without importance, or in a group whose importance is all zero).
pub(super) fn quantize(src: &[f32], importance: Option<&[f32]>, out: &mut [u8]) {
    for (b, (x, ob)) in src.chunks_exact(QK_T).zip(out.chunks_exact_mut(size_of::<BlockQ4T>())).enumerate() {
        let mut q = [0u8; QK_T];
        for (g, (xg, qg)) in x.chunks_exact(QK).zip(q.chunks_exact_mut(QK)).enumerate() {
            let mut wt = [1f32; QK];
            if let Some(imp) = importance {
                let ig = &imp[QK_T * b + QK * g..][..QK];
                // scaled to max 1, so that no magnitude of importance can overflow the sums
                let m = ig.iter().fold(0f32, |m, &v| m.max(v));
                if m > 0.0 {
                    for (w, &v) in wt.iter_mut().zip(ig) {
                        *w = v / m;
                    }
                }
            }
            let d = quantize_group(xg, &wt, qg);
            ob[2 * g..2 * g + 2].copy_from_slice(&d.to_le_bytes());
        }
        for (j, o) in ob[8..].iter_mut().enumerate() {
            *o = q[j] | (q[j + QK_T / 2] << 4);
        }
    }
}

/// The index of the exact-zero level.
const ZERO: u8 = 8;
const _: () = assert!(Q4T_LEVELS[ZERO as usize] == 0);

/// Level indices (0..16) of one 32-element group into `q`, minimizing Σ wt * error²; returns
/// the f16 scale bits.
fn quantize_group(x: &[f32], wt: &[f32; QK], q: &mut [u8]) -> u16 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        q.fill(ZERO);
        return 0;
    }
    let sum_x2: f32 = x.iter().zip(wt).map(|(v, w)| w * v * v).sum();
    let (lo, hi) = (Q4T_LEVELS[0] as f32, Q4T_LEVELS[15] as f32);
    // phase 1: every candidate's closed-form least-squares error; keep the best two scales
    let mut top = [(f32::INFINITY, 0f32); 2];
    for end in [lo, hi] {
        for k in 0..=STEPS {
            let t = 0.8 + 0.4 * k as f32 / STEPS as f32;
            let iscale = end * t / max;
            let (mut sxl, mut sll) = (0f32, 0f32);
            for (&v, &w) in x.iter().zip(wt) {
                let l = Q4T_LEVELS[nearest(v * iscale)] as f32;
                sxl += w * v * l;
                sll += w * l * l;
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
    // phase 2: the actual error with the stored f16 scale and re-chosen levels, refit twice;
    // also from the plain scales that put the largest magnitude exactly on an end level (a
    // group already on such a grid ties every phase-1 candidate at ~0 error)
    let mut best = (f32::INFINITY, 0u16, [0u8; QK]);
    let mut idx = [0u8; QK];
    for (err, d) in top {
        if err.is_finite() {
            refine(x, wt, d, &mut idx, &mut best);
        }
    }
    refine(x, wt, max / lo, &mut idx, &mut best);
    refine(x, wt, max / hi, &mut idx, &mut best);
    if best.0 == f32::INFINITY {
        // the scale underflows f16 (|w| < ~1e-9 everywhere): store zeros
        q.fill(ZERO);
        return 0;
    }
    q.copy_from_slice(&best.2);
    best.1
}

/// From scale `d`: round it to f16, re-choose the levels against the stored scale, measure the
/// actual (weighted) error (keeping it in `best` if lower), refit the weighted least-squares
/// scale; twice.
#[inline]
fn refine(x: &[f32], wt: &[f32; QK], mut d: f32, idx: &mut [u8; QK], best: &mut (f32, u16, [u8; QK])) {
    for _ in 0..2 {
        let dh = f16::from_f32(d);
        let df = dh.to_f32();
        if df == 0.0 || !df.is_finite() {
            return;
        }
        let inv = 1.0 / df;
        let (mut err, mut sxl, mut sll) = (0f32, 0f32, 0f32);
        for ((o, &v), &w) in idx.iter_mut().zip(x).zip(wt) {
            let j = nearest(v * inv);
            *o = j as u8;
            let l = Q4T_LEVELS[j] as f32;
            let e = v - df * l;
            err += w * e * e;
            sxl += w * v * l;
            sll += w * l * l;
        }
        if err < best.0 {
            *best = (err, dh.to_bits(), *idx);
        }
        if sll == 0.0 {
            return;
        }
        d = sxl / sll;
    }
}

/// Level index (0..16) of element e of a block.
#[inline(always)]
fn index(b: &BlockQ4T, e: usize) -> usize {
    (if e < QK_T / 2 { b.qs[e] & 0x0F } else { b.qs[e - QK_T / 2] >> 4 }) as usize
}

/// Scalar dequantization: `d[e / 32] * level`, one exact product per element (an f16 scale times
/// an i8 level fits f32's mantissa).
pub(super) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in view::<BlockQ4T>(src).iter().zip(dst.chunks_exact_mut(QK_T)) {
        for (g, yg) in y.chunks_exact_mut(QK).enumerate() {
            let d = f16_soft(b.d[g]);
            for (i, o) in yg.iter_mut().enumerate() {
                *o = d * Q4T_LEVELS[index(b, QK * g + i)] as f32;
            }
        }
    }
}

/// Scalar dot with a Q8_0 activation row: per 32-element group g of weight block k (activation
/// block 4k + g), `acc += (d_g * d_x) * Σ level * q_x` in f32, block order. Lengths checked by
/// the caller.
pub(super) fn vec_dot(w: &[u8], a: &[u8]) -> f32 {
    let act = view::<BlockQ8_0>(a);
    let mut acc = 0f32;
    for (b, ys) in view::<BlockQ4T>(w).iter().zip(act.chunks_exact(QK_T / QK)) {
        for (g, y) in ys.iter().enumerate() {
            let p: i32 = y.qs.iter().enumerate().map(|(i, &qx)| Q4T_LEVELS[index(b, QK * g + i)] as i32 * qx as i32).sum();
            acc = (f16_soft(b.d[g]) * f16_soft(y.d)).mul_add(p as f32, acc);
        }
    }
    acc
}

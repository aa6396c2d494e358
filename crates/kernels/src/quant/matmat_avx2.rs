//! The AVX2 kernel of `matmat` (no AVX-512: Zen 1-3, Intel client cores), bit for bit its
//! scalar twin (`matmat::scalar`; the arithmetic is in matmat.rs's header).
//!
//! The group sums Σ u·a are exact integers. Types whose unsigned quants stay below 128 (all but
//! Q8_0: at most 63) multiply the bytes as they are, `vpmaddubsw` (32 products a step; a pair of
//! them, at most 2·63·128, fits i16 without saturating) then `vpmaddwd` by ones into i32; Q8_0
//! (quants up to 255) widens both sides to i16 once and takes `vpmaddwd` (16 products a step,
//! |u·a| <= 255·128). The 8 lanes of 8 groups are reduced together by a transposed `vphaddd`
//! tree.
//! The float steps then run per (row, token) in the twin's order: the same FMAs, the same bits.
//! Why by hand: prefill at all positions (perplexity) spends most of its time here on models
//! whose output matrix is the embedding (Gemma 3: 262k rows); the twin compiled for AVX2 widens
//! to i32 and multiplies with `vpmulld`, about a third of this speed.

use super::QuantType;
use super::matmat::{Geo, Mins, Prep, act_quants, decode_row};
use std::arch::x86_64::*;

/// `matmat::scalar` (same contract). The caller checked lengths and that the CPU has AVX2,
/// FMA and F16C (`simd::level()` returned `Avx2`).
///
/// # Safety
/// AVX2, FMA and F16C available.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn matmat(
    ty: QuantType,
    geo: &Geo,
    w: &[u8],
    rows: usize,
    cols: usize,
    acts: &[u8],
    n_t: usize,
    p: &Prep,
    y: &mut [f32],
) {
    let (g_el, n_g, n_sb) = (geo.group, cols / geo.group, cols / geo.sb());
    let (rb, ab) = (w.len() / rows, acts.len() / n_t);
    // Bytes as they are (`vpmaddubsw`) unless a quant may reach 128 (Q8_0's offset form).
    let bytes = ty != QuantType::Q8_0;
    // every token's quants: [n_t][cols] as i8, and as i16 for the wide path
    let mut a8 = vec![0i8; n_t * cols];
    for (o, row) in a8.chunks_exact_mut(cols).zip(acts.chunks_exact(ab)) {
        act_quants(geo.act, row, o);
    }
    let a16: Vec<i16> = if bytes { Vec::new() } else { a8.iter().map(|&s| s as i16).collect() };
    let (mut u, mut fw, mut fmin) = (vec![0u8; cols], vec![0f32; n_g], vec![0f32; n_g]);
    let mut u16s = vec![0i16; if bytes { 0 } else { cols }];
    let ld = n_g.div_ceil(8) * 8;
    let mut isum = vec![0i32; 4 * ld];
    for (r, yr) in y.chunks_exact_mut(n_t).enumerate() {
        decode_row(ty, &w[r * rb..(r + 1) * rb], &mut u, &mut fw, &mut fmin);
        for (d, &s) in u16s.iter_mut().zip(&u) {
            *d = s as i16;
        }
        // Four tokens at a time: their float chains are independent, so they overlap (one
        // chain alone waits on each FMA's latency). A short last step repeats its last token.
        let mut t0 = 0;
        while t0 < n_t {
            let nt = (n_t - t0).min(4);
            let ts = [t0, t0 + 1.min(nt - 1), t0 + 2.min(nt - 1), t0 + 3.min(nt - 1)];
            for (k, &t) in ts.iter().enumerate() {
                let out = &mut isum[k * ld..(k + 1) * ld];
                if bytes {
                    group_sums8(&u, &a8[t * cols..(t + 1) * cols], g_el, out);
                } else {
                    group_sums(&u16s, &a16[t * cols..(t + 1) * cols], g_el, out);
                }
            }
            let mut acc = [0f32; 4];
            for sb in 0..n_sb {
                let mut temp = [0f32; 4];
                let mut last_g = 0;
                for j in 0..geo.sb_groups {
                    let g = sb * geo.sb_groups + j;
                    for k in 0..4 {
                        let t = ts[k];
                        let i = if geo.off != 0 { p.init[t * n_g + g] } else { 0 } + isum[k * ld + g];
                        temp[k] = (i as f32).mul_add(fw[g], temp[k]);
                        if geo.mins == Mins::Group {
                            temp[k] = fmin[g].mul_add(p.fbs[t * n_g + g], temp[k]);
                        }
                    }
                    last_g = g;
                }
                for k in 0..4 {
                    let t = ts[k];
                    acc[k] = temp[k].mul_add(p.da[t * n_sb + sb], acc[k]);
                    if geo.mins == Mins::Block {
                        acc[k] = fmin[last_g].mul_add(p.fbs[t * n_g + last_g], acc[k]);
                    }
                }
            }
            yr[t0..t0 + nt].copy_from_slice(&acc[..nt]);
            t0 += nt;
        }
    }
}

/// Σ_g u·a of every group of `g_el` (16 or 32) elements into `out` (room for whole batches of
/// 8 groups; the spare entries get 0).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn group_sums(u: &[i16], a: &[i16], g_el: usize, out: &mut [i32]) {
    let n_g = u.len() / g_el;
    let mut g0 = 0;
    while g0 < n_g {
        let mut v = [_mm256_setzero_si256(); 8];
        for (k, vk) in v.iter_mut().enumerate().take((n_g - g0).min(8)) {
            let e = (g0 + k) * g_el;
            *vk = madd16(&u[e..e + 16], &a[e..e + 16]);
            if g_el == 32 {
                *vk = _mm256_add_epi32(*vk, madd16(&u[e + 16..e + 32], &a[e + 16..e + 32]));
            }
        }
        let s = reduce8(v);
        let o = &mut out[g0..g0 + 8];
        // SAFETY: o holds 8 i32.
        unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), s) };
        g0 += 8;
    }
}

/// `group_sums` on the bytes themselves: u < 128 (unsigned), a signed; g_el 16 or 32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn group_sums8(u: &[u8], a: &[i8], g_el: usize, out: &mut [i32]) {
    let n_g = u.len() / g_el;
    let ones = _mm256_set1_epi16(1);
    let mut g0 = 0;
    while g0 < n_g {
        let mut v = [_mm256_setzero_si256(); 8];
        for (k, vk) in v.iter_mut().enumerate().take((n_g - g0).min(8)) {
            let e = (g0 + k) * g_el;
            let (ue, ae) = (&u[e..e + g_el], &a[e..e + g_el]);
            // SAFETY: ue and ae hold g_el (16 or 32) readable bytes each.
            *vk = unsafe {
                if g_el == 32 {
                    let p = _mm256_maddubs_epi16(_mm256_loadu_si256(ue.as_ptr().cast()), _mm256_loadu_si256(ae.as_ptr().cast()));
                    _mm256_madd_epi16(p, ones)
                } else {
                    let p = _mm_maddubs_epi16(_mm_loadu_si128(ue.as_ptr().cast()), _mm_loadu_si128(ae.as_ptr().cast()));
                    _mm256_set_m128i(_mm_setzero_si128(), _mm_madd_epi16(p, _mm256_castsi256_si128(ones)))
                }
            };
        }
        let s = reduce8(v);
        let o = &mut out[g0..g0 + 8];
        // SAFETY: o holds 8 i32.
        unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), s) };
        g0 += 8;
    }
}

/// Pairwise products of 16 i16 summed into 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn madd16(u: &[i16], a: &[i16]) -> __m256i {
    let (u, a) = (&u[..16], &a[..16]);
    // SAFETY: u and a are 16 readable i16 each.
    unsafe { _mm256_madd_epi16(_mm256_loadu_si256(u.as_ptr().cast()), _mm256_loadu_si256(a.as_ptr().cast())) }
}

/// Lane k = the sum of v[k]'s 8 lanes (exact integer sums).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn reduce8(v: [__m256i; 8]) -> __m256i {
    // Per 128-bit half: lane k of h0123 holds v[k]'s half sum (k < 4), likewise h4567.
    let h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    let h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    let r0123 = _mm_add_epi32(_mm256_castsi256_si128(h0123), _mm256_extracti128_si256::<1>(h0123));
    let r4567 = _mm_add_epi32(_mm256_castsi256_si128(h4567), _mm256_extracti128_si256::<1>(h4567));
    _mm256_set_m128i(r4567, r0123)
}

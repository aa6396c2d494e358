//! AVX-512 twins of cortiq's own types' scalar code (`q8r.rs`, `q4t.rs`, `q1.rs`): row
//! dequantization (F + BW + VL, F16C) and the dot product with Q8_0 activations (plus VNNI).
//!
//! Owns: the kernels only; `dequant_avx512::dispatch` and `vecdot_avx512::dispatch/matvec` call
//! them behind the same CPU checks as the GGUF kernels, so `CORTIQ_SIMD=scalar` turns them off
//! too. Every `unsafe` here says why it is sound.
//!
//! Agreement with the scalar twins: dequantization is bit-identical (each lane does the scalar
//! code's single f32 multiply, or picks ±d); the dot products compute the same exact integer
//! sums per 32-element activation block but add the float terms in 16 lanes, so they differ from
//! the scalar order by a few f32 roundings (tests/newtypes.rs prints and bounds the difference).
//!
//! Shape of the dot kernels: 64 weights per 512-bit register (q8r: 64 bytes; q4t: one load of a
//! block's 64 nibble bytes gives elements 0..64 by mask and 64..128 by shift + mask; q1: a
//! 64-bit mask), the matching 64 activations from two Q8_0 blocks (two 256-bit loads, since
//! each block's f16 scale sits between its quants), one `vpdpbusd` into 16 i32 lanes (lanes 0..8
//! = first activation block, 8..16 = second), then one FMA with the per-lane scale product.
#![cfg(target_arch = "x86_64")]

use super::QuantType;
use super::blocks::*;
use std::arch::x86_64::*;

/// 16 bytes of `s` from `off` (bounds-checked).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn ld16(s: &[u8], off: usize) -> __m128i {
    let s = &s[off..off + 16];
    // SAFETY: `s` is exactly 16 readable bytes; loadu has no alignment requirement.
    unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
}

/// 32 bytes of `s` from `off` (bounds-checked).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn ld32(s: &[u8], off: usize) -> __m256i {
    let s = &s[off..off + 32];
    // SAFETY: `s` is exactly 32 readable bytes; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
}

/// 64 bytes of `s` from `off` (bounds-checked).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn ld64(s: &[u8], off: usize) -> __m512i {
    let s = &s[off..off + 64];
    // SAFETY: `s` is exactly 64 readable bytes; loadu has no alignment requirement.
    unsafe { _mm512_loadu_si512(s.as_ptr().cast()) }
}

/// Store 16 f32 at `dst[off..off + 16]` (bounds-checked).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn st16(dst: &mut [f32], off: usize, v: __m512) {
    let d = &mut dst[off..off + 16];
    // SAFETY: `d` is exactly 16 writable f32; storeu has no alignment requirement.
    unsafe { _mm512_storeu_ps(d.as_mut_ptr(), v) }
}

/// The f16 scale bits of Q8_0 activation block `b`.
#[inline(always)]
fn act_d(a: &[u8], b: usize) -> i16 {
    i16::from_le_bytes([a[34 * b], a[34 * b + 1]])
}

/// The 64 activation quants of Q8_0 blocks `b` and `b + 1` as one register.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn act64(a: &[u8], b: usize) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(ld32(a, 34 * b + 2)), ld32(a, 34 * b + 36))
}

/// The f32 scales of four consecutive Q8_0 activation blocks from `b`, in lanes 0..4.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn act_d4(a: &[u8], b: usize) -> __m128 {
    _mm_cvtph_ps(_mm_set_epi16(0, 0, 0, 0, act_d(a, b + 3), act_d(a, b + 2), act_d(a, b + 1), act_d(a, b)))
}

/// Lanes 0..4 of `v` spread as [v0 x8, v1 x8] (`HI` false) or [v2 x8, v3 x8] (`HI` true): the
/// per-lane scales of one `vpdpbusd` result spanning two activation blocks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn spread<const HI: bool>(v: __m128) -> __m512 {
    let (a, b) = if HI { (2, 3) } else { (0, 1) };
    let idx = _mm512_set_epi32(b, b, b, b, b, b, b, b, a, a, a, a, a, a, a, a);
    // lanes 4..16 of the cast are undefined, but the permute reads only lanes a and b (< 4)
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v))
}

// ---------------------------------------------------------------- dequantization

/// Dequantize a row of `ty` (q8r, q4t or q1), bit-identical to the scalar twin. Lengths were
/// checked by the caller (a wrong one panics on a bounds check, never reads out of bounds).
///
/// # Safety
/// The CPU must support avx512f, avx512bw, avx512vl and f16c.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(super) unsafe fn dequantize(ty: QuantType, src: &[u8], dst: &mut [f32]) {
    match ty {
        QuantType::Q8R => q8r_row(src, dst),
        QuantType::Q4T => q4t_row(src, dst),
        QuantType::Q1 => q1_row(src, dst),
        _ => unreachable!("own_avx512::dequantize({ty}): not a cortiq type"),
    }
}

/// q8r: `q * s` per lane.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn q8r_row(src: &[u8], dst: &mut [f32]) {
    let s = _mm512_set1_ps(super::q8r::scale(src));
    for c in 0..dst.len() / 16 {
        let q = _mm512_cvtepi8_epi32(ld16(src, 16 * c));
        st16(dst, 16 * c, _mm512_mul_ps(_mm512_cvtepi32_ps(q), s));
    }
}

/// q4t: `d[g] * (q - 8)` per lane, 16 lanes per step from the low / high nibble registers.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn q4t_row(src: &[u8], dst: &mut [f32]) {
    let m4 = _mm512_set1_epi8(0x0F);
    let eight = _mm512_set1_epi8(8);
    for (b, y) in view::<BlockQ4T>(src).iter().zip(dst.chunks_exact_mut(QK_T)) {
        let d: [f32; 4] = std::array::from_fn(|g| f16_soft(b.d[g]));
        let wv = ld64(&b.qs, 0);
        // signed levels -8..7 as bytes: elements 0..64, then 64..128
        let lo = _mm512_sub_epi8(_mm512_and_si512(wv, m4), eight);
        let hi = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16::<4>(wv), m4), eight);
        let parts = [
            _mm512_extracti32x4_epi32::<0>(lo),
            _mm512_extracti32x4_epi32::<1>(lo),
            _mm512_extracti32x4_epi32::<2>(lo),
            _mm512_extracti32x4_epi32::<3>(lo),
            _mm512_extracti32x4_epi32::<0>(hi),
            _mm512_extracti32x4_epi32::<1>(hi),
            _mm512_extracti32x4_epi32::<2>(hi),
            _mm512_extracti32x4_epi32::<3>(hi),
        ];
        for (c, &p) in parts.iter().enumerate() {
            // elements 16c..16c+16 belong to group (16c)/32 = c/2
            let v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(p));
            st16(y, 16 * c, _mm512_mul_ps(_mm512_set1_ps(d[c / 2]), v));
        }
    }
}

/// q1: `+d` where the bit is set, `-d` where clear (a masked blend, exact).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn q1_row(src: &[u8], dst: &mut [f32]) {
    for (b, y) in view::<BlockQ1>(src).iter().zip(dst.chunks_exact_mut(QK_T)) {
        let d = f16_soft(b.d);
        let (pos, neg) = (_mm512_set1_ps(d), _mm512_set1_ps(-d));
        for c in 0..QK_T / 16 {
            let m = u16::from_le_bytes([b.qs[2 * c], b.qs[2 * c + 1]]);
            st16(y, 16 * c, _mm512_mask_blend_ps(m, neg, pos));
        }
    }
}

// ---------------------------------------------------------------- dot products

/// One row of `ty` (q8r, q4t or q1) times a Q8_0 activation row. Lengths were checked by the
/// caller; a short slice panics on a bounds check, never reads out of bounds.
///
/// # Safety
/// The CPU must support avx512f, avx512bw, avx512vl, avx512vnni, avx2, fma and f16c.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn vec_dot(ty: QuantType, w: &[u8], a: &[u8]) -> f32 {
    match ty {
        QuantType::Q8R => q8r_dot(w, a),
        QuantType::Q4T => q4t_dot(w, a),
        QuantType::Q1 => q1_dot(w, a),
        _ => unreachable!("own_avx512::vec_dot({ty}): not a cortiq type"),
    }
}

/// q8r: signed x signed bytes through `vpdpbusd(|w|, a negated where w < 0)` (w >= -127 and the
/// activations are -127..127, so neither |w| nor -a wraps); acc += lanes * d_x per 64; the row
/// scale multiplies the reduced sum once.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q8r_dot(w: &[u8], a: &[u8]) -> f32 {
    let n = w.len() - super::q8r::TRAILER;
    let nb = n / QK;
    let zero = _mm512_setzero_si512();
    // two chains: one FMA per 64 elements would otherwise wait on its predecessor's latency
    let mut acc = [_mm512_setzero_ps(); 2];
    let mut j = 0;
    while j + 2 <= nb {
        let wv = ld64(w, QK * j);
        let av = act64(a, j);
        let sa = _mm512_mask_sub_epi8(av, _mm512_movepi8_mask(wv), zero, av);
        let p = _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(wv), sa);
        let dx = _mm512_cvtph_ps(_mm256_set_m128i(_mm_set1_epi16(act_d(a, j + 1)), _mm_set1_epi16(act_d(a, j))));
        let k = (j / 2) & 1;
        acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), dx, acc[k]);
        j += 2;
    }
    let mut r = _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
    if j < nb {
        // an odd 32-element block at the end
        let wv = ld32(w, QK * j);
        let av = ld32(a, 34 * j + 2);
        let p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(wv), _mm256_sign_epi8(av, wv));
        let p = _mm512_reduce_add_epi32(_mm512_zextsi256_si512(p));
        r = f16_soft(act_d(a, j).to_le_bytes()).mul_add(p as f32, r);
    }
    r * super::q8r::scale(w)
}

/// q4t: Σ (q - 8) * x = Σ q * x - 8 * Σ x, both by `vpdpbusd` (q and 8 unsigned, x signed);
/// per block two FMAs with the 4 scale products d_w[g] * d_x[g] spread over their lanes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q4t_dot(w: &[u8], a: &[u8]) -> f32 {
    let zero = _mm512_setzero_si512();
    let m4 = _mm512_set1_epi8(0x0F);
    let eight = _mm512_set1_epi8(8);
    let mut acc = [_mm512_setzero_ps(); 2];
    for (k, b) in view::<BlockQ4T>(w).iter().enumerate() {
        let wv = ld64(&b.qs, 0);
        let lo = _mm512_and_si512(wv, m4);
        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(wv), m4);
        let (a0, a1) = (act64(a, 4 * k), act64(a, 4 * k + 2));
        let p0 = _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, lo, a0), _mm512_dpbusd_epi32(zero, eight, a0));
        let p1 = _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, hi, a1), _mm512_dpbusd_epi32(zero, eight, a1));
        let dw = _mm_cvtph_ps(_mm_set_epi64x(0, i64::from_le_bytes(*b.d.as_flattened().first_chunk::<8>().unwrap())));
        let dd = _mm_mul_ps(dw, act_d4(a, 4 * k));
        acc[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), spread::<false>(dd), acc[0]);
        acc[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), spread::<true>(dd), acc[1]);
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]))
}

/// q1: Σ ±x as `vpdpbusd(1, x negated where the bit is clear)`; per block two FMAs with
/// d_w * d_x[g].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q1_dot(w: &[u8], a: &[u8]) -> f32 {
    let zero = _mm512_setzero_si512();
    let ones = _mm512_set1_epi8(1);
    let mut acc = [_mm512_setzero_ps(); 2];
    for (k, b) in view::<BlockQ1>(w).iter().enumerate() {
        let m0 = u64::from_le_bytes(*b.qs.first_chunk::<8>().unwrap());
        let m1 = u64::from_le_bytes(*b.qs.last_chunk::<8>().unwrap());
        let (a0, a1) = (act64(a, 4 * k), act64(a, 4 * k + 2));
        let p0 = _mm512_dpbusd_epi32(zero, ones, _mm512_mask_sub_epi8(a0, !m0, zero, a0));
        let p1 = _mm512_dpbusd_epi32(zero, ones, _mm512_mask_sub_epi8(a1, !m1, zero, a1));
        let dd = _mm_mul_ps(_mm_set1_ps(f16_soft(b.d)), act_d4(a, 4 * k));
        acc[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), spread::<false>(dd), acc[0]);
        acc[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), spread::<true>(dd), acc[1]);
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]))
}

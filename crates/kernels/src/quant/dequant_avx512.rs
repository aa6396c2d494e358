//! AVX-512 (F + BW + VL, F16C) row dequantizers: the fast twins of the scalar decoders in
//! `dequant.rs`, which stay the reference forever.
//!
//! Owns: one row kernel per block type (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K,
//! Q6_K, Q8_K, IQ4_NL, IQ4_XS, MXFP4, F16, BF16) and `dequantize_row`, which `quant::dequantize_row` tries first
//! (cortiq's own q8r / q4t / q1 kernels live in `own_avx512.rs`; `row` hands those over). This is
//! the only file of the crate's quant module with `unsafe`; every block says why it is sound.
//!
//! Why it matters: in decode the engine dequantizes every weight row of the model once per token,
//! so this loop, not the dot products, was the decode bottleneck (a Q8_0 262144x640 output matrix
//! alone is 168M elements per token).
//!
//! Bit-identity with the scalar twins (and so with gguf-py) is by construction, not tolerance:
//! each output lane performs the very same IEEE f32 operations in the same order as the scalar
//! code: the quant is formed as an exact small integer (byte ops, then a widening to i32 and an
//! exact i32->f32 conversion), scale products `d * sc` are single f32 multiplies, and the
//! with-min types do a separate `mul` then `add`/`sub` (LLVM never fuses the intrinsics into an
//! FMA). Offsets are applied to the integer quant before conversion (`d * (q - 8)`), so signs of
//! zero match too. f16 scales go through F16C's `vcvtph2ps`, exact for every f16 and quieting NaNs
//! as `half` does. tests/dequant_simd.rs checks all of it on fixtures and random blocks.
//!
//! Two kernel shapes. Q8_0, Q8_K, Q6_K, Q2_K, Q3_K: 16 quants are assembled as bytes (in an
//! xmm, or 32 at a time in a ymm), widened to 16 i32 lanes (`vpmovzxbd`/`vpmovsxbd`), converted,
//! scaled and stored as one zmm of f32. Nibble types (Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K): each
//! block or group builds the table of its 16 (or 2x16) possible outputs with the scalar twin's
//! operations and `vpermps` looks 16 lanes up at once (see the note above `q4_0`); that replaced
//! convert + multiply (+ add) per vector and made them 1.3-1.7x faster. The lookup-table types
//! (IQ4_NL, IQ4_XS, MXFP4) are nibble types whose table is `scale * level` for their 16 levels.
//!
//! Measured with examples/dequant_bench.rs (AMD EPYC with AVX-512, 2 cores shared with other
//! builds, so +-20%; 256x2048 rows, cache-resident), scalar -> AVX-512 in G elements/s:
//! Q8_0 10.8 -> 37-41, Q4_K 7.6 -> 29, Q6_K 3.2 -> 28, Q5_0 4.0 -> 29, Q4_1 8.0 -> 38,
//! Q4_0 7.2 -> 41-52, Q5_K 5.5 -> 22, Q5_1 4.2 -> 23, F16 7.2 -> 37-48, BF16 15 -> 40-49,
//! Q2_K 2.1 -> 22, Q3_K 1.4 -> 19. Decode (engine quick example, 64-token prompt, tg32) went
//! from 6.0 to 7.9 tok/s on Gemma3-270M Q4_K_M, 11.6 -> 18.7 on SmolLM2-135M Q4_1 and
//! 2.9 -> 5.0 on Qwen2.5-0.5B Q4_K_M.

use super::QuantType;

/// Dequantize one row with AVX-512 when this CPU has it (and `CORTIQ_SIMD` is not `scalar`) and
/// `ty` has a kernel here; returns `false`, with `dst` untouched, otherwise (F32 always: the scalar
/// copy is already memory-bound).
///
/// Output is bit-identical to `quant::dequantize_row_scalar`. Panics when `src.len()` is not
/// `ty.row_bytes(dst.len())`, like `quant::dequantize_row`.
#[track_caller]
pub fn dequantize_row(ty: QuantType, src: &[u8], dst: &mut [f32]) -> bool {
    let want = ty.row_bytes(dst.len());
    assert!(
        want == Some(src.len()),
        "dequant_avx512::dequantize_row({ty}): {} elements need {want:?} bytes, got {}",
        dst.len(),
        src.len()
    );
    dispatch(ty, src, dst)
}

/// `dequantize_row` after the caller checked the length (`quant::dequantize_row` does), so a
/// decode step's thousands of short rows pay for one check, not two.
#[inline]
pub(super) fn dispatch(ty: QuantType, src: &[u8], dst: &mut [f32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::avx512bw() && imp::has_kernel(ty) {
            // SAFETY: simd::avx512bw() is true only after is_x86_feature_detected! confirmed
            // avx512f, avx512bw, avx512vl and f16c on this CPU, the features `imp::row` enables.
            // A wrong `src` length cannot cause out-of-bounds access (see `imp::row`).
            unsafe { imp::row(ty, src, dst) };
            return true;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (ty, src, dst);
    false
}

/// Whether `dequantize_row` would take the AVX-512 path for `ty` on this machine now.
pub fn available(ty: QuantType) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::simd::avx512bw() && imp::has_kernel(ty)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ty;
        false
    }
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use super::super::QuantType;
    use super::super::blocks::*;
    use super::super::dequant::{iq4xs_scales, q3k_scales};
    use std::arch::x86_64::*;

    pub(super) fn has_kernel(ty: QuantType) -> bool {
        !matches!(ty, QuantType::F32)
    }

    // ------------------------------------------------------------ small helpers
    // Every helper carries the same target features so it inlines into the kernels; the
    // intrinsics without pointers are safe to call inside such functions.

    /// 16 bytes of `s` from `off` (bounds-checked).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn ld16(s: &[u8], off: usize) -> __m128i {
        let s = &s[off..off + 16];
        // SAFETY: `s` is exactly 16 readable bytes (the slice above checked the range);
        // loadu has no alignment requirement.
        unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
    }

    /// 32 bytes of `s` from `off` (bounds-checked).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn ld32(s: &[u8], off: usize) -> __m256i {
        let s = &s[off..off + 32];
        // SAFETY: `s` is exactly 32 readable bytes (the slice above checked the range);
        // loadu has no alignment requirement.
        unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
    }

    /// 16 i8 of `s` from `off` (bounds-checked).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn ld16i(s: &[i8], off: usize) -> __m128i {
        let s = &s[off..off + 16];
        // SAFETY: as ld16: 16 readable bytes, unaligned load.
        unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
    }

    /// Store 16 f32 at `y[off..off + 16]` (bounds-checked).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn st(y: &mut [f32], off: usize, v: __m512) {
        let y = &mut y[off..off + 16];
        // SAFETY: `y` is exactly 16 writable f32 (the slice above checked the range);
        // storeu has no alignment requirement.
        unsafe { _mm512_storeu_ps(y.as_mut_ptr(), v) }
    }

    /// Little-endian f16 -> f32 (exact; NaNs quieted as `half::f16::to_f32` does) in all 16
    /// lanes: `vpbroadcastw` + `vcvtph2ps`. Never a scalar `_mm_cvtph_ps` of one lane: LLVM
    /// narrows that to a `vpinsrw` merging into whatever register the previous block's kernel
    /// wrote last, a false dependency chain through the whole row (it made Q8_0, one scale per
    /// 32 elements, 2.5x slower, and Q5_K 1.3x).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn f16_splat(b: [u8; 2]) -> __m512 {
        _mm512_cvtph_ps(_mm256_set1_epi16(u16::from_le_bytes(b) as i16))
    }

    /// 16 unsigned bytes -> 16 f32 (exact).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn u8_ps(v: __m128i) -> __m512 {
        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v))
    }

    /// 16 signed bytes -> 16 f32 (exact).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn i8_ps(v: __m128i) -> __m512 {
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v))
    }

    /// Bytes shifted right by `n` (0..8) and masked with `m`: `(v >> n) & m` per byte. The 16-bit
    /// shift drags bits across byte borders; `m` must clear them (m < 1 << (8 - n)).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn shr_and(v: __m128i, n: u32, m: i8) -> __m128i {
        _mm_and_si128(_mm_srl_epi16(v, _mm_cvtsi32_si128(n as i32)), _mm_set1_epi8(m))
    }

    /// `d * s[k] as f32` for 16 scales, each one f32 product as in the scalar code, stored so
    /// that each can be broadcast from memory.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn scale16(d: __m512, s: __m512) -> [f32; 16] {
        let mut out = [0f32; 16];
        st(&mut out, 0, _mm512_mul_ps(d, s));
        out
    }

    // ------------------------------------------------------------ dispatch

    /// Run block kernel `$f` (on `$B`, `$n` elements) over a row. A macro, not a generic function
    /// taking the kernel, because `#[target_feature]` functions do not implement the `Fn` traits.
    macro_rules! blocks {
        ($src:expr, $dst:expr, $B:ty, $n:literal, $f:ident) => {{
            let (ys, rest) = $dst.as_chunks_mut::<$n>();
            debug_assert!(rest.is_empty());
            for (b, y) in view::<$B>($src).iter().zip(ys) {
                $f(b, y);
            }
        }};
    }

    /// # Safety
    /// The CPU must support avx512f, avx512bw, avx512vl and f16c. `src.len()` should be
    /// `ty.row_bytes(dst.len())`; all accesses are bounds-checked, so a violation panics or
    /// leaves elements unwritten, never reads or writes out of bounds.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    pub(super) unsafe fn row(ty: QuantType, src: &[u8], dst: &mut [f32]) {
        match ty {
            QuantType::Q8_0 => blocks!(src, dst, BlockQ8_0, 32, q8_0),
            QuantType::Q4_0 => blocks!(src, dst, BlockQ4_0, 32, q4_0),
            QuantType::Q4_1 => blocks!(src, dst, BlockQ4_1, 32, q4_1),
            QuantType::Q5_0 => blocks!(src, dst, BlockQ5_0, 32, q5_0),
            QuantType::Q5_1 => blocks!(src, dst, BlockQ5_1, 32, q5_1),
            QuantType::Q2K => blocks!(src, dst, BlockQ2K, 256, q2k),
            QuantType::Q3K => blocks!(src, dst, BlockQ3K, 256, q3k),
            QuantType::Q4K => blocks!(src, dst, BlockQ4K, 256, q4k),
            QuantType::Q5K => blocks!(src, dst, BlockQ5K, 256, q5k),
            QuantType::Q6K => blocks!(src, dst, BlockQ6K, 256, q6k),
            QuantType::Q8K => blocks!(src, dst, BlockQ8K, 256, q8k),
            QuantType::IQ4NL => blocks!(src, dst, BlockIQ4NL, 32, iq4nl),
            QuantType::IQ4XS => blocks!(src, dst, BlockIQ4XS, 256, iq4xs),
            QuantType::MXFP4 => blocks!(src, dst, BlockMXFP4, 32, mxfp4),
            QuantType::IQ2XXS => blocks!(src, dst, BlockIQ2XXS, 256, iq2xxs),
            QuantType::IQ2XS => blocks!(src, dst, BlockIQ2XS, 256, iq2xs),
            QuantType::IQ2S => blocks!(src, dst, BlockIQ2S, 256, iq2s),
            QuantType::IQ3XXS => blocks!(src, dst, BlockIQ3XXS, 256, iq3xxs),
            QuantType::IQ3S => blocks!(src, dst, BlockIQ3S, 256, iq3s),
            QuantType::F16 => row_f16(src, dst),
            QuantType::BF16 => row_bf16(src, dst),
            // SAFETY: this function's features are the ones `own_avx512::dequantize` needs.
            QuantType::Q8R | QuantType::Q4T | QuantType::Q1 => unsafe { super::super::own_avx512::dequantize(ty, src, dst) },
            QuantType::F32 => unreachable!("has_kernel excludes f32"),
        }
    }

    // The 2-/3-bit grid types' kernels live with their dot products.
    use super::super::iq23_simd::avx512::{
        dq_iq2s as iq2s, dq_iq2xs as iq2xs, dq_iq2xxs as iq2xxs, dq_iq3s as iq3s, dq_iq3xxs as iq3xxs,
    };

    // ------------------------------------------------------------ legacy 32-element blocks

    /// Scalar: `q as f32 * d`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn q8_0(b: &BlockQ8_0, y: &mut [f32; 32]) {
        let d = f16_splat(b.d);
        st(y, 0, _mm512_mul_ps(i8_ps(ld16i(&b.qs, 0)), d));
        st(y, 16, _mm512_mul_ps(i8_ps(ld16i(&b.qs, 16)), d));
    }

    // Nibble types decode through a 16-entry table instead of convert-multiply-add per element:
    // `t[q]` is computed for q = 0..16 with exactly the scalar twin's operations on the f32 value
    // of q (`d * (q - 8)`, `d * q + m`, ...), and `vpermps` picks `t[q]` for 16 lanes at once.
    // `vpermps` reads only the low 4 bits of each index lane, so the widened byte serves as the
    // index of its low nibble as is, and shifted right by 4 as that of its high nibble. 5-bit
    // types take a second table for q = 16..32, chosen per lane by bit 4 with a masked permute.

    /// [0, 1, ..., 15] + `base` as f32 (exact).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn iota(base: f32) -> __m512 {
        let i = _mm512_setr_ps(0., 1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11., 12., 13., 14., 15.);
        _mm512_add_ps(i, _mm512_set1_ps(base))
    }

    /// 16 bytes of `s` from `off`, zero-extended to 16 i32 lanes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn widen16(s: &[u8], off: usize) -> __m512i {
        _mm512_cvtepu8_epi32(ld16(s, off))
    }

    /// `t[idx & 15]` per lane, or `hi[idx & 15]` in the lanes set in `k`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn lut2(idx: __m512i, t: __m512, hi: __m512, k: u16) -> __m512 {
        _mm512_mask_permutexvar_ps(_mm512_permutexvar_ps(idx, t), k, idx, hi)
    }

    /// Scalar: `d * (nibble - 8) as f32`; table `d * [-8 .. 8)`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn q4_0(b: &BlockQ4_0, y: &mut [f32; 32]) {
        let t = _mm512_mul_ps(f16_splat(b.d), iota(-8.));
        let w = widen16(&b.qs, 0);
        st(y, 0, _mm512_permutexvar_ps(w, t));
        st(y, 16, _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(w), t));
    }

    /// Scalar: `d * q as f32 + m`, a rounded multiply then a rounded add; table `d * [0 .. 16) + m`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn q4_1(b: &BlockQ4_1, y: &mut [f32; 32]) {
        let t = _mm512_add_ps(_mm512_mul_ps(f16_splat(b.d), iota(0.)), f16_splat(b.m));
        let w = widen16(&b.qs, 0);
        st(y, 0, _mm512_permutexvar_ps(w, t));
        st(y, 16, _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(w), t));
    }

    /// Scalar: `d * (q - 16) as f32`; tables `d * [-16 .. 0)` and `d * [0 .. 16)`, bit 4 of
    /// element j being bit j of the little-endian u32 `qh`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn q5_0(b: &BlockQ5_0, y: &mut [f32; 32]) {
        let d = f16_splat(b.d);
        let (t, t16) = (_mm512_mul_ps(d, iota(-16.)), _mm512_mul_ps(d, iota(0.)));
        let qh = u32::from_le_bytes(b.qh);
        let w = widen16(&b.qs, 0);
        st(y, 0, lut2(w, t, t16, qh as u16));
        st(y, 16, lut2(_mm512_srli_epi32::<4>(w), t, t16, (qh >> 16) as u16));
    }

    /// Scalar: `d * q as f32 + m`; tables `d * [0 .. 16) + m` and `d * [16 .. 32) + m`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn q5_1(b: &BlockQ5_1, y: &mut [f32; 32]) {
        let (d, m) = (f16_splat(b.d), f16_splat(b.m));
        let t = _mm512_add_ps(_mm512_mul_ps(d, iota(0.)), m);
        let t16 = _mm512_add_ps(_mm512_mul_ps(d, iota(16.)), m);
        let qh = u32::from_le_bytes(b.qh);
        let w = widen16(&b.qs, 0);
        st(y, 0, lut2(w, t, t16, qh as u16));
        st(y, 16, lut2(_mm512_srli_epi32::<4>(w), t, t16, (qh >> 16) as u16));
    }

    // ------------------------------------------------------------ k-quants, 256 elements

    /// Scalar: `dl = d * (sc & 15)`, `ml = dmin * (sc >> 4)`, `dl * q - ml`; group g = 8h + 2s +
    /// l0/16 takes bit pair s of `qs[32h + l0 ..][..16]`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn q2k(b: &BlockQ2K, y: &mut [f32; 256]) {
        let sc = ld16(&b.scales, 0);
        let dl = scale16(f16_splat(b.d), u8_ps(_mm_and_si128(sc, _mm_set1_epi8(0x0F))));
        let ml = scale16(f16_splat(b.dmin), u8_ps(shr_and(sc, 4, 0x0F)));
        for h in 0..2 {
            for l0 in [0, 16] {
                let qs = ld16(&b.qs, 32 * h + l0);
                for s in 0..4 {
                    let g = 8 * h + 2 * s + l0 / 16;
                    let q = u8_ps(shr_and(qs, 2 * s as u32, 3));
                    let v = _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(dl[g]), q), _mm512_set1_ps(ml[g]));
                    st(y, 16 * g, v);
                }
            }
        }
    }

    /// Scalar: `dl = d * scale`, `dl * (low - 4 * !hbit)`; low as Q2_K, hbit = bit 4h + s of
    /// `hmask[l0 ..][..16]`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn q3k(b: &BlockQ3K, y: &mut [f32; 256]) {
        let scales = q3k_scales(&b.scales);
        let dl = scale16(f16_splat(b.d), i8_ps(ld16i(&scales, 0)));
        let four = _mm_set1_epi8(4);
        for h in 0..2 {
            for l0 in [0, 16] {
                let qs = ld16(&b.qs, 32 * h + l0);
                let hm = ld16(&b.hmask, l0);
                for s in 0..4 {
                    let g = 8 * h + 2 * s + l0 / 16;
                    let low = shr_and(qs, 2 * s as u32, 3);
                    let set = _mm_test_epi8_mask(hm, _mm_set1_epi8((1u8 << (4 * h + s)) as i8));
                    let q = _mm_mask_sub_epi8(low, !set, low, four);
                    st(y, 16 * g, _mm512_mul_ps(_mm512_set1_ps(dl[g]), i8_ps(q)));
                }
            }
        }
    }

    /// The per-group `d * sc` and `dmin * m` of a Q4_K/Q5_K block, one f32 product each.
    ///
    /// The 6-bit unpacking is `k4_scale_min`'s, done on three little-endian u32 words at once
    /// (4 groups per word; the random-block tests check it against the scalar twin): with
    /// w0..w2 = bytes 0..4, 4..8, 8..12, groups 0..4 are `w0 & 63` / `w1 & 63`, groups 4..8 take
    /// a nibble of w2 and the top 2 bits of w0 / w1 as bits 4..6.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn k4_dm(d: [u8; 2], dmin: [u8; 2], scales: &[u8; 12]) -> ([f32; 8], [f32; 8]) {
        let w = |i: usize| u32::from_le_bytes([scales[i], scales[i + 1], scales[i + 2], scales[i + 3]]);
        let (w0, w1, w2) = (w(0), w(4), w(8));
        let sc_lo = w0 & 0x3F3F_3F3F;
        let mn_lo = w1 & 0x3F3F_3F3F;
        let sc_hi = (w2 & 0x0F0F_0F0F) | ((w0 >> 2) & 0x3030_3030);
        let mn_hi = ((w2 >> 4) & 0x0F0F_0F0F) | ((w1 >> 2) & 0x3030_3030);
        let sc = sc_lo as u64 | (sc_hi as u64) << 32;
        let mn = mn_lo as u64 | (mn_hi as u64) << 32;
        // [sc | mn] as 16 bytes -> 16 f32, times [d x8 | dmin x8]: the scalar twin's 16 products
        let both = _mm_set_epi64x(mn as i64, sc as i64);
        // [d, dmin] from one zero-extending 32-bit move (no merge, so no false dependency; see
        // f16_splat), converted, then spread to [d x8 | dmin x8]
        let pair = _mm_cvtph_ps(_mm_cvtsi32_si128(u32::from_le_bytes([d[0], d[1], dmin[0], dmin[1]]) as i32));
        let dd = _mm512_permutexvar_ps(
            _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
            _mm512_castps128_ps512(pair),
        );
        let mut out = [0f32; 16];
        st(&mut out, 0, _mm512_mul_ps(dd, u8_ps(both)));
        let (a, b) = out.split_at(8);
        (a.try_into().expect("8 values"), b.try_into().expect("8 values"))
    }

    /// Scalar: `d1 * q - m1` per group of 32; group g = 2c + n takes nibble n of `qs[32c ..][..32]`.
    /// Table `d1 * [0 .. 16) - m1` per group (see the note above `q4_0`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn q4k(b: &BlockQ4K, y: &mut [f32; 256]) {
        let (d1, m1) = k4_dm(b.d, b.dmin, &b.scales);
        let i0 = iota(0.);
        for c in 0..4 {
            let t = |g: usize| _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(d1[g]), i0), _mm512_set1_ps(m1[g]));
            let (tl, th) = (t(2 * c), t(2 * c + 1));
            for half in [0, 16] {
                let w = widen16(&b.qs, 32 * c + half);
                st(y, 64 * c + half, _mm512_permutexvar_ps(w, tl));
                st(y, 64 * c + 32 + half, _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(w), th));
            }
        }
    }

    /// As Q4_K, plus bit 4 = bit g of `qh[l]` for lane l of group g: tables `d1 * [0 .. 16) - m1`
    /// and `d1 * [16 .. 32) - m1`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn q5k(b: &BlockQ5K, y: &mut [f32; 256]) {
        let (d1, m1) = k4_dm(b.d, b.dmin, &b.scales);
        let (i0, i16) = (iota(0.), iota(16.));
        let qh = ld32(&b.qh, 0);
        for c in 0..4 {
            let t = |g: usize, i: __m512| _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(d1[g]), i), _mm512_set1_ps(m1[g]));
            let (g0, g1) = (2 * c, 2 * c + 1);
            let (tl, tl16, th, th16) = (t(g0, i0), t(g0, i16), t(g1, i0), t(g1, i16));
            // bit 4 of lanes 0..32 of groups g0 and g1
            let k0 = _mm256_test_epi8_mask(qh, _mm256_set1_epi8((1u8 << g0) as i8));
            let k1 = _mm256_test_epi8_mask(qh, _mm256_set1_epi8((1u8 << g1) as i8));
            for half in [0, 16] {
                let w = widen16(&b.qs, 32 * c + half);
                st(y, 32 * g0 + half, lut2(w, tl, tl16, (k0 >> half) as u16));
                st(y, 32 * g1 + half, lut2(_mm512_srli_epi32::<4>(w), th, th16, (k1 >> half) as u16));
            }
        }
    }

    /// Scalar: `dl = d * scale`, `dl * (q - 32)`; element 128h + 32s + l takes nibble s/2 of
    /// `ql[64h + 32(s%2) + l]` and bit pair s of `qh[32h + l]`; group g = 8h + 2s + l0/16.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn q6k(b: &BlockQ6K, y: &mut [f32; 256]) {
        let dl = scale16(f16_splat(b.d), i8_ps(ld16i(&b.scales, 0)));
        let off = _mm256_set1_epi8(32);
        for h in 0..2 {
            // 32 lanes l at a time: groups g and g + 1 (l0 = 0 and 16) share the byte work
            let qh = ld32(&b.qh, 32 * h);
            let ql = [ld32(&b.ql, 64 * h), ld32(&b.ql, 64 * h + 32)];
            for s in 0..4 {
                let g = 8 * h + 2 * s;
                let lo = _mm256_srl_epi16(ql[s % 2], _mm_cvtsi32_si128(4 * (s / 2) as i32));
                let lo = _mm256_and_si256(lo, _mm256_set1_epi8(0x0F));
                // ((qh >> 2s) & 3) << 4 as one shift and one mask
                let hi = match s {
                    3 => _mm256_srli_epi16::<2>(qh),
                    _ => _mm256_sll_epi16(qh, _mm_cvtsi32_si128(4 - 2 * s as i32)),
                };
                let hi = _mm256_and_si256(hi, _mm256_set1_epi8(0x30));
                let q = _mm256_sub_epi8(_mm256_or_si256(lo, hi), off);
                st(y, 16 * g, _mm512_mul_ps(_mm512_set1_ps(dl[g]), i8_ps(_mm256_castsi256_si128(q))));
                st(y, 16 * g + 16, _mm512_mul_ps(_mm512_set1_ps(dl[g + 1]), i8_ps(_mm256_extracti128_si256::<1>(q))));
            }
        }
    }

    /// Scalar: `q as f32 * d` with an f32 `d`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn q8k(b: &BlockQ8K, y: &mut [f32; 256]) {
        let d = _mm512_set1_ps(f32::from_le_bytes(b.d));
        for k in 0..16 {
            st(y, 16 * k, _mm512_mul_ps(i8_ps(ld16i(&b.qs, 16 * k)), d));
        }
    }

    // ------------------------------------------------------------ 4-bit lookup-table types

    /// The 16 levels of a table as f32 (exact).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn levels(k: &[i8; 16]) -> __m512 {
        i8_ps(ld16i(k, 0))
    }

    /// 32 elements in Q4_0's nibble order from the table `t` of their 16 possible values.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn nibbles_lut(qs: &[u8], t: __m512, y: &mut [f32]) {
        let w = widen16(qs, 0);
        st(y, 0, _mm512_permutexvar_ps(w, t));
        st(y, 16, _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(w), t));
    }

    /// Scalar: `d * KVALUES_IQ4NL[q] as f32`; table `d * levels`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn iq4nl(b: &BlockIQ4NL, y: &mut [f32; 32]) {
        nibbles_lut(&b.qs, _mm512_mul_ps(f16_splat(b.d), levels(&KVALUES_IQ4NL)), y);
    }

    /// Scalar: `dl = d * (ls - 32)` per sub-block (one f32 product), `dl * KVALUES_IQ4NL[q]`;
    /// table `dl * levels` per sub-block.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn iq4xs(b: &BlockIQ4XS, y: &mut [f32; 256]) {
        let d = f16_splat(b.d);
        let k = levels(&KVALUES_IQ4NL);
        let sc = iq4xs_scales(b);
        for (ib, &s) in sc.iter().enumerate() {
            let dl = _mm512_mul_ps(d, _mm512_set1_ps(s as f32));
            nibbles_lut(&b.qs[16 * ib..16 * ib + 16], _mm512_mul_ps(dl, k), &mut y[32 * ib..32 * ib + 32]);
        }
    }

    /// Scalar: `e8m0_half(e) * KVALUES_MXFP4[q] as f32`; table `e8m0_half(e) * levels`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn mxfp4(b: &BlockMXFP4, y: &mut [f32; 32]) {
        let t = _mm512_mul_ps(_mm512_set1_ps(e8m0_half(b.e)), levels(&KVALUES_MXFP4));
        nibbles_lut(&b.qs, t, y);
    }

    // ------------------------------------------------------------ 16-bit floats

    /// Up to 16 u16 (mask `k`) of `s`, zeros in the other lanes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn ld_u16x16(s: &[u8], k: u16) -> __m256i {
        assert!(s.len() >= 2 * k.count_ones() as usize && (k as u32 + 1).is_power_of_two());
        // SAFETY: `k` selects the first k.count_ones() u16 lanes (a low run of ones, asserted) and
        // `s` holds at least that many u16; a masked load does not touch (or fault on) the
        // memory of masked-off lanes. No alignment requirement.
        unsafe { _mm256_maskz_loadu_epi16(k, s.as_ptr().cast()) }
    }

    /// Store the lanes of `v` selected by `k` (a low run of ones) to `d`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn st_masked(d: &mut [f32], k: u16, v: __m512) {
        assert!(d.len() >= k.count_ones() as usize && (k as u32 + 1).is_power_of_two());
        // SAFETY: only the first k.count_ones() lanes are written and `d` has that many f32;
        // masked-off lanes are not accessed. No alignment requirement.
        unsafe { _mm512_mask_storeu_ps(d.as_mut_ptr(), k, v) }
    }

    /// Walk a 16-bit-float row: full 16-element chunks with plain loads and stores (masked
    /// stores are slow on some cores), then the tail of < 16 elements with a masked pair.
    /// `$cvt` maps 16 u16 (`__m256i`) to 16 f32 (`__m512`).
    macro_rules! row_16bit {
        ($src:expr, $dst:expr, $cvt:expr) => {{
            let (ss, s_tail) = $src.as_chunks::<32>();
            let (ds, d_tail) = $dst.as_chunks_mut::<16>();
            for (s, d) in ss.iter().zip(ds.iter_mut()) {
                st(d, 0, $cvt(ld32(s, 0)));
            }
            if !d_tail.is_empty() {
                let k = (1u16 << d_tail.len()) - 1;
                st_masked(d_tail, k, $cvt(ld_u16x16(s_tail, k)));
            }
        }};
    }

    /// F16 row: `vcvtph2ps`, the instruction `half`'s slice conversion uses on F16C CPUs.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn row_f16(src: &[u8], dst: &mut [f32]) {
        row_16bit!(src, dst, _mm512_cvtph_ps)
    }

    /// BF16 row: the bits shifted into the top half of an f32, as the scalar `<< 16`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn row_bf16(src: &[u8], dst: &mut [f32]) {
        row_16bit!(src, dst, bf16x16)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    fn bf16x16(v: __m256i) -> __m512 {
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(v)))
    }
}

//! AVX2 (+ FMA + F16C, no AVX-512, no VNNI) twins of the integer dot products in `vecdot.rs`,
//! which stay the reference forever: every GGUF weight type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//! Q2_K .. Q6_K, IQ4_NL, IQ4_XS, MXFP4, and the 2-/3-bit grid types of `iq23_simd.rs`) in ggml's `vec_dot` order, Q4_0, Q4_K and Q2_K in
//! llama.cpp's repacked gemv/gemm orders, Q2_K .. Q6_K in its tiled order (cortiq's own types
//! run their scalar twins compiled for AVX2).
//!
//! Owns: the kernels (generic over R rows sharing one activation row, like the AVX-512 twins in
//! `vecdot_avx512.rs`), `dispatch` / `matvec` for the `Level::Avx2` tier, and `vec_dot_order` /
//! `matvec_order`, which run these kernels on any CPU with AVX2 + FMA + F16C whatever the
//! tier, so the bit-identity tests cover them on AVX-512 machines too.
//!
//! Why by hand: the scalar twins compiled for AVX2 (`vecdot::rows_avx2`) do not find
//! `vpmaddubsw` in their widening loops; Q5_0 ran at 1.2 G weights/s a thread that way against
//! ~13 here. On an AVX2 CPU `--numerics llamacpp` prefill spent 87% of its time in Q5_0
//! (Qwen2.5-Coder-0.5B), and the real-model tests run that mode.
//!
//! Bit-identity with the scalar twins (and so with ggml's AVX2 kernels, whose instruction
//! choice this is): per block the integer products land in the same 8 i32 lanes (lane l owns
//! bytes 4l..4l+3 of the 32-element block: `vpmaddubsw` + `vpmaddwd` by ones, exact — at most
//! 2·128·127 per i16 pair, since activation quants are in -127..127), then the same per-block
//! FMA into an 8-lane f32 accumulator and the same final reduction (`hsum8`).

use super::QuantType;
use super::vecdot::{Order, Reads};

/// Whether this CPU runs these kernels at all (AVX2 + FMA + F16C), whatever `CORTIQ_SIMD` says.
fn cpu_has() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| {
            std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") && std::is_x86_feature_detected!("f16c")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the engine's dispatch takes these kernels: the AVX2 tier (`simd::level()`).
fn active() -> bool {
    crate::simd::level() == crate::simd::Level::Avx2
}

/// Whether a kernel here covers `(ty, order)`.
pub fn covers(ty: QuantType, order: Order) -> bool {
    match order {
        Order::VecDot => matches!(
            ty,
            QuantType::Q4_0
                | QuantType::Q4_1
                | QuantType::Q5_0
                | QuantType::Q5_1
                | QuantType::Q8_0
                | QuantType::Q2K
                | QuantType::Q3K
                | QuantType::Q4K
                | QuantType::Q5K
                | QuantType::Q6K
                | QuantType::IQ4NL
                | QuantType::IQ4XS
                | QuantType::MXFP4
                | QuantType::IQ2XXS
                | QuantType::IQ2XS
                | QuantType::IQ2S
                | QuantType::IQ3XXS
                | QuantType::IQ3S
        ),
        Order::RepackGemv | Order::RepackGemm => matches!(ty, QuantType::Q4_0 | QuantType::Q4K | QuantType::Q2K),
        Order::Tiled => matches!(ty, QuantType::Q2K | QuantType::Q3K | QuantType::Q4K | QuantType::Q5K | QuantType::Q6K),
    }
}

/// One row's dot product on the AVX2 tier, `None` off it or for a pair `covers` rejects.
/// Lengths were checked by the caller (`vecdot::check`).
pub(super) fn dispatch(ty: QuantType, w: &[u8], a: &[u8], order: Order) -> Option<f32> {
    if active() { vec_dot_order(ty, order, w, a) } else { None }
}

/// `matvec` on the AVX2 tier; `false` (nothing written) off it or when `covers` rejects.
pub(super) fn matvec(ty: QuantType, w: &[u8], rb: usize, a: &[u8], y: &mut [f32], order: Order, reads: Reads) -> bool {
    active() && matvec_order(ty, order, w, rb, a, y, reads)
}

/// The AVX2 kernel's dot product of one weight row with one activation row (lengths as
/// `vecdot::vec_dot_order` checks them), on any CPU with AVX2 + FMA + F16C: `None` without
/// them or for a pair `covers` rejects. The tests' entry to these kernels.
pub fn vec_dot_order(ty: QuantType, order: Order, w: &[u8], a: &[u8]) -> Option<f32> {
    if !cpu_has() || !covers(ty, order) {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: cpu_has() confirmed avx2, fma and f16c; every load is bounds-checked.
        unsafe { imp::rows::<1>(ty, order, [w], a) }.map(|r| r[0])
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// `y[r] = dot(row r, a)` for rows of `rb` bytes stored back to back, with these kernels on any
/// CPU with AVX2 + FMA + F16C; `false` (nothing written) without them or when `covers` rejects.
///
/// Four rows at a time share each activation load and give the core four independent FMA
/// chains on a tile the caller keeps in cache (`Reads::Tile`: the llama.cpp-order prefill hands
/// over tiles of 16 rows); streamed weights go one row at a time, front to back (the hardware
/// prefetcher follows one stream best; see `vecdot_avx512::matvec`).
pub fn matvec_order(ty: QuantType, order: Order, w: &[u8], rb: usize, a: &[u8], y: &mut [f32], reads: Reads) -> bool {
    if !cpu_has() || !covers(ty, order) || rb == 0 {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let mut rows = w.chunks_exact(rb);
        let mut done = 0;
        if reads == Reads::Tile {
            for yc in y.chunks_exact_mut(4) {
                let ws = [
                    rows.next().unwrap_or(&[]),
                    rows.next().unwrap_or(&[]),
                    rows.next().unwrap_or(&[]),
                    rows.next().unwrap_or(&[]),
                ];
                // SAFETY: as in `vec_dot_order`.
                let v = unsafe { imp::rows::<4>(ty, order, ws, a) }.expect("covered");
                yc.copy_from_slice(&v);
                done += 4;
            }
        }
        for (r, (o, row)) in y[done..].iter_mut().zip(rows).enumerate() {
            super::vecdot_avx512::prefetch_ahead(w, (done + r) * rb, rb);
            // SAFETY: as in `vec_dot_order`.
            *o = unsafe { imp::rows::<1>(ty, order, [row], a) }.expect("covered")[0];
        }
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (a, y, reads);
        false
    }
}

/// Quantize one activation row on the AVX2 tier, the bytes of `vecdot::quantize_act_scalar`;
/// `false` (nothing written) off the tier. `out` is `act.row_bytes(x.len())` bytes (checked by
/// the callers).
pub(super) fn quantize_act(act: super::vecdot::ActType, x: &[f32], out: &mut [u8]) -> bool {
    active() && quantize_act_any(act, x, out)
}

/// `quantize_act` on any CPU with AVX2 + FMA + F16C whatever the tier (the tests' entry).
pub fn quantize_act_any(act: super::vecdot::ActType, x: &[f32], out: &mut [u8]) -> bool {
    use super::vecdot::ActType;
    if !cpu_has() {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: cpu_has() confirmed the features these functions enable; every load and
        // store is bounds-checked.
        unsafe {
            match act {
                ActType::Q8K => imp::quantize_q8k(x, out),
                _ => imp::quantize_q8(x, out, act == ActType::Q8_1),
            }
        }
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (act, x, out);
        false
    }
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use super::super::QuantType;
    use super::super::blocks::*;
    use super::super::dequant::{iq4xs_scales, k4_scale_min, q3k_scales};
    use super::super::iq23_simd::avx2 as iq23;
    use super::super::vecdot::{Order, Q8_1_BYTES, hsum4, hsum8};
    use std::arch::x86_64::*;

    // Every helper carries the kernels' target features so it inlines into them; intrinsics
    // without pointers are safe to call inside such functions.

    /// 16 bytes of `s` from `off` (bounds-checked).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn ld16(s: &[u8], off: usize) -> __m128i {
        let s = &s[off..off + 16];
        // SAFETY: `s` is exactly 16 readable bytes; loadu has no alignment requirement.
        unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
    }

    /// 32 bytes of `s` from `off` (bounds-checked).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn ld32(s: &[u8], off: usize) -> __m256i {
        let s = &s[off..off + 32];
        // SAFETY: `s` is exactly 32 readable bytes; loadu has no alignment requirement.
        unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
    }

    /// 32 i8 (bounds-checked).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn ld32i(s: &[i8]) -> __m256i {
        let s = &s[..32];
        // SAFETY: `s` is exactly 32 readable bytes; loadu has no alignment requirement.
        unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
    }

    /// An f16's value as f32 (exact).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn f16s(b: [u8; 2]) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(u16::from_le_bytes(b) as i16)))
    }

    /// ggml's `hsum_float_8`, via the scalar twin's function on the stored lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn hsum(v: __m256) -> f32 {
        let mut a = [0f32; 8];
        // SAFETY: `a` is 8 writable f32; storeu has no alignment requirement.
        unsafe { _mm256_storeu_ps(a.as_mut_ptr(), v) };
        hsum8(a)
    }

    /// Sum of the 8 i32 lanes (exact).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn hsum_i32(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }

    /// Signed x signed bytes -> 8 i32 lanes of 4 products each: `|x|` (a -128 reads as 128
    /// unsigned) times `sign(y, x)`, ggml's `mul_sum_i8_pairs`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn dot_i8(x: __m256i, y: __m256i) -> __m256i {
        dot_u8(_mm256_abs_epi8(x), _mm256_sign_epi8(y, x))
    }

    /// Unsigned x signed bytes -> 8 i32 lanes of 4 products each, ggml's `mul_sum_us8_pairs`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn dot_u8(x: __m256i, y: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1))
    }

    /// 16 packed bytes -> 32 nibbles: low nibbles in bytes 0..16, high nibbles in 16..32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn nib32(qs: &[u8]) -> __m256i {
        let b = ld16(qs, 0);
        let m = _mm_set1_epi8(0x0F);
        _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16::<4>(b), m), _mm_and_si128(b, m))
    }

    /// 0xFF in byte j where bit j of the little-endian `qh` is set, else 0 (ggml's
    /// `bytes_from_bits_32`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn bits32(qh: [u8; 4]) -> __m256i {
        let shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(i32::from_le_bytes(qh)), shuf);
        let bit = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
        _mm256_cmpeq_epi8(_mm256_or_si256(bytes, bit), _mm256_set1_epi64x(-1))
    }

    /// `acc = fma(d, float(lanes), acc)`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn fma_lanes(acc: __m256, d: f32, p: __m256i) -> __m256 {
        _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc)
    }

    /// 8 f32 of `s` from `off` (bounds-checked).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn ld8f(s: &[f32], off: usize) -> __m256 {
        let s = &s[off..off + 8];
        // SAFETY: `s` is exactly 8 readable f32; loadu has no alignment requirement.
        unsafe { _mm256_loadu_ps(s.as_ptr()) }
    }

    /// |v| by clearing the sign bits.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn abs8(v: __m256) -> __m256 {
        _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff)))
    }

    /// The largest of 8 lanes (max is exact: any order gives it).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn hmax(v: __m256) -> f32 {
        let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
    }

    /// f32 -> f16 bits, round to nearest even (`vcvtps2ph` imm 0, ggml's FP32_TO_FP16).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn f16_bits(v: f32) -> [u8; 2] {
        (_mm_extract_epi16::<0>(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(v))) as u16).to_le_bytes()
    }

    /// 32 i32 lanes (elements in order across the four) -> 32 bytes saturated to i8, in order:
    /// ggml's two `packs` and its `permutevar8x32` (0, 4, 1, 5, 2, 6, 3, 7) that undoes their
    /// per-128-bit-lane interleave.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn pack32(i: [__m256i; 4]) -> __m256i {
        let p = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
        _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }

    /// Q8_0 / Q8_1 activation blocks as ggml's AVX2 `quantize_row_q8_0/1` (the scalar twin
    /// `quantize_block_q8_0` spells out the same steps): the max of |x|, `d = amax / 127`,
    /// `id = 127 / amax`, `vcvtps2dq` of `x * id` (ties to even under the default MXCSR,
    /// i32::MIN for NaN), two saturating packs. Q8_1 adds `s = f16(d * sum)` with the wrapping
    /// i32 sum of the unsaturated quants.
    ///
    /// # Safety
    /// The CPU must support avx2, fma and f16c.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn quantize_q8(x: &[f32], out: &mut [u8], q8_1: bool) {
        let bsz = if q8_1 { Q8_1_BYTES } else { 34 };
        let qoff = if q8_1 { 4 } else { 2 };
        for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(bsz)) {
            let v = [ld8f(xb, 0), ld8f(xb, 8), ld8f(xb, 16), ld8f(xb, 24)];
            let m = _mm256_max_ps(_mm256_max_ps(abs8(v[0]), abs8(v[1])), _mm256_max_ps(abs8(v[2]), abs8(v[3])));
            let amax = hmax(m);
            let d = amax / 127.0;
            let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
            let i = v.map(|v| _mm256_cvtps_epi32(_mm256_mul_ps(v, id)));
            ob[0..2].copy_from_slice(&f16_bits(d));
            if q8_1 {
                let sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3])));
                ob[2..4].copy_from_slice(&f16_bits(d * sum as f32));
            }
            let dst = &mut ob[qoff..qoff + 32];
            // SAFETY: `dst` is exactly 32 writable bytes; storeu has no alignment requirement.
            unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), pack32(i)) };
        }
    }

    /// Q8_K activation blocks as `quantize_row_q8_K_ref` (the scalar twin
    /// `quantize_block_q8k`): the signed value of the FIRST element of largest magnitude (the
    /// lowest lane equal to the max, which is what the scalar loop's strict `>` keeps),
    /// `iscale = -127 / max`, `q = min(127, nearest_int(iscale * x))` with ggml's magic-number
    /// `nearest_int` itself, 16-element sums (wrapping to i16), `d = 1 / iscale`. All-zero
    /// blocks are all zero bytes.
    ///
    /// # Safety
    /// The CPU must support avx2, fma and f16c.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn quantize_q8k(x: &[f32], out: &mut [u8]) {
        for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(292)) {
            let mut m = _mm256_setzero_ps();
            for c in 0..QK_K / 8 {
                m = _mm256_max_ps(m, abs8(ld8f(xb, 8 * c)));
            }
            let amax = hmax(m);
            if amax == 0.0 || amax.is_nan() {
                ob.fill(0);
                continue;
            }
            let mut max = 0f32;
            for c in 0..QK_K / 8 {
                let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(abs8(ld8f(xb, 8 * c)), _mm256_set1_ps(amax)));
                if hit != 0 {
                    max = xb[8 * c + hit.trailing_zeros() as usize];
                    break;
                }
            }
            let iscale = -127.0f32 / max;
            let sc = _mm256_set1_ps(iscale);
            let (magic, mant, bias) =
                (_mm256_set1_ps(12582912.0), _mm256_set1_epi32(0x007f_ffff), _mm256_set1_epi32(0x0040_0000));
            let q8 = |off: usize| {
                // ggml's nearest_int bit for bit (also for the inf that a subnormal max gives)
                let v = _mm256_castps_si256(_mm256_add_ps(_mm256_mul_ps(sc, ld8f(xb, off)), magic));
                let q = _mm256_sub_epi32(_mm256_and_si256(v, mant), bias);
                // min(127, v) stored into an int8 (C truncates to the low byte); the group sums
                // add the stored bytes, so sign-extend that byte back first
                let q = _mm256_min_epi32(q, _mm256_set1_epi32(127));
                _mm256_srai_epi32::<24>(_mm256_slli_epi32::<24>(q))
            };
            for c in 0..QK_K / 32 {
                let i = [q8(32 * c), q8(32 * c + 8), q8(32 * c + 16), q8(32 * c + 24)];
                for g in 0..2 {
                    let sum = hsum_i32(_mm256_add_epi32(i[2 * g], i[2 * g + 1])) as i16;
                    let o = 4 + QK_K + 2 * (2 * c + g);
                    ob[o..o + 2].copy_from_slice(&sum.to_le_bytes());
                }
                let dst = &mut ob[4 + 32 * c..4 + 32 * c + 32];
                // SAFETY: `dst` is exactly 32 writable bytes; storeu has no alignment requirement.
                unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), pack32(i)) };
            }
            ob[0..4].copy_from_slice(&(1.0f32 / iscale).to_le_bytes());
        }
    }

    /// R rows (each a whole number of blocks; an empty row gives 0) times one activation row
    /// in `order`; `None` for a pair `super::covers` rejects.
    ///
    /// # Safety
    /// The CPU must support avx2, fma and f16c.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn rows<const R: usize>(ty: QuantType, order: Order, ws: [&[u8]; R], a: &[u8]) -> Option<[f32; R]> {
        if !super::covers(ty, order) {
            return None;
        }
        macro_rules! v {
            ($B:ty) => {{
                let mut out: [&[$B]; R] = [&[]; R];
                for (o, w) in out.iter_mut().zip(ws) {
                    *o = view::<$B>(w);
                }
                out
            }};
        }
        let nb = |bs: usize| ws.iter().map(|w| w.len()).max().unwrap_or(0) / bs;
        let repack = order != Order::VecDot;
        Some(match ty {
            QuantType::Q8_0 => q8_0::<R>(v!(BlockQ8_0), view(a), false),
            QuantType::Q4_0 => q4_0::<R>(v!(BlockQ4_0), view(a), repack),
            QuantType::Q5_0 => q5_0::<R>(v!(BlockQ5_0), view(a), false),
            QuantType::Q4_1 => q4_1::<R>(v!(BlockQ4_1), a, nb(20)),
            QuantType::Q5_1 => q5_1::<R>(v!(BlockQ5_1), a, nb(24)),
            QuantType::Q2K => match order {
                Order::VecDot => q2k::<R, 0>(v!(BlockQ2K), view(a)),
                Order::RepackGemv => q2k::<R, 1>(v!(BlockQ2K), view(a)),
                Order::RepackGemm => q2k::<R, 2>(v!(BlockQ2K), view(a)),
                Order::Tiled => q2k::<R, 3>(v!(BlockQ2K), view(a)),
            },
            QuantType::Q3K if order == Order::Tiled => q3k::<R, 3>(v!(BlockQ3K), view(a)),
            QuantType::Q3K => q3k::<R, 0>(v!(BlockQ3K), view(a)),
            QuantType::Q4K => match order {
                Order::VecDot => q4k::<R, 0>(v!(BlockQ4K), view(a)),
                Order::RepackGemv => q4k::<R, 1>(v!(BlockQ4K), view(a)),
                Order::RepackGemm => q4k::<R, 2>(v!(BlockQ4K), view(a)),
                Order::Tiled => q4k::<R, 3>(v!(BlockQ4K), view(a)),
            },
            QuantType::Q5K if order == Order::Tiled => q5k::<R, 3>(v!(BlockQ5K), view(a)),
            QuantType::Q5K => q5k::<R, 0>(v!(BlockQ5K), view(a)),
            QuantType::Q6K if order == Order::Tiled => q6k::<R, 3>(v!(BlockQ6K), view(a)),
            QuantType::Q6K => q6k::<R, 0>(v!(BlockQ6K), view(a)),
            QuantType::IQ4NL => iq4nl::<R>(v!(BlockIQ4NL), view(a)),
            QuantType::MXFP4 => mxfp4::<R>(v!(BlockMXFP4), view(a)),
            QuantType::IQ4XS => iq4xs::<R>(v!(BlockIQ4XS), view(a)),
            QuantType::IQ2XXS => iq23::iq2xxs::<R>(v!(BlockIQ2XXS), view(a)),
            QuantType::IQ2XS => iq23::iq2xs::<R>(v!(BlockIQ2XS), view(a)),
            QuantType::IQ2S => iq23::iq2s::<R>(v!(BlockIQ2S), view(a)),
            QuantType::IQ3XXS => iq23::iq3xxs::<R>(v!(BlockIQ3XXS), view(a)),
            QuantType::IQ3S => iq23::iq3s::<R>(v!(BlockIQ3S), view(a)),
            _ => return None,
        })
    }

    // Per block: lanes from `vpmaddubsw` + `vpmaddwd`, then acc = fma(dx*dy, lanes, acc). Rows
    // shorter than `a` (matvec's empty padding rows) stop contributing.

    macro_rules! legacy_q8_0 {
        ($name:ident, $B:ty, |$x:ident, $qy:ident| $lanes:expr) => {
            /// `repack`: llama.cpp's repacked gemv and gemm (the same for 32-element blocks):
            /// the block's whole integer sum, one scalar FMA per block.
            #[target_feature(enable = "avx2,fma,f16c")]
            fn $name<const R: usize>(w: [&[$B]; R], a: &[BlockQ8_0], repack: bool) -> [f32; R] {
                let mut acc = [_mm256_setzero_ps(); R];
                let mut acc_s = [0f32; R];
                for (i, y) in a.iter().enumerate() {
                    let dy = f16s(y.d);
                    let $qy = ld32i(&y.qs);
                    for r in 0..R {
                        let Some($x) = w[r].get(i) else { continue };
                        let d = f16s($x.d) * dy;
                        if repack {
                            acc_s[r] = (hsum_i32($lanes) as f32).mul_add(d, acc_s[r]);
                        } else {
                            acc[r] = fma_lanes(acc[r], d, $lanes);
                        }
                    }
                }
                let mut out = [0f32; R];
                for r in 0..R {
                    out[r] = if repack { acc_s[r] } else { hsum(acc[r]) };
                }
                out
            }
        };
    }

    legacy_q8_0!(q8_0, BlockQ8_0, |x, qy| dot_i8(ld32i(&x.qs), qy));
    legacy_q8_0!(q4_0, BlockQ4_0, |x, qy| dot_i8(_mm256_sub_epi8(nib32(&x.qs), _mm256_set1_epi8(8)), qy));
    // q = nibble + 16*bit - 16: where the qh bit is clear, nibble | 0xF0 is nibble - 16 as i8
    legacy_q8_0!(q5_0, BlockQ5_0, |x, qy| {
        let high = _mm256_andnot_si256(bits32(x.qh), _mm256_set1_epi8(0xF0u8 as i8));
        dot_i8(_mm256_or_si256(nib32(&x.qs), high), qy)
    });

    macro_rules! legacy_q8_1 {
        ($name:ident, $B:ty, |$x:ident| $q:expr) => {
            /// acc = fma(dx*dy, lanes, acc); summs = fma(m, s, summs); hsum(acc) + summs.
            #[target_feature(enable = "avx2,fma,f16c")]
            fn $name<const R: usize>(w: [&[$B]; R], a: &[u8], nb: usize) -> [f32; R] {
                let mut acc = [_mm256_setzero_ps(); R];
                let mut summs = [0f32; R];
                for i in 0..nb {
                    let yb = &a[i * Q8_1_BYTES..(i + 1) * Q8_1_BYTES];
                    let dy = f16s([yb[0], yb[1]]);
                    let sy = f16s([yb[2], yb[3]]);
                    let qy = ld32(yb, 4);
                    for r in 0..R {
                        let Some($x) = w[r].get(i) else { continue };
                        summs[r] = f16s($x.m).mul_add(sy, summs[r]);
                        acc[r] = fma_lanes(acc[r], f16s($x.d) * dy, dot_u8($q, qy));
                    }
                }
                let mut out = [0f32; R];
                for r in 0..R {
                    out[r] = hsum(acc[r]) + summs[r];
                }
                out
            }
        };
    }

    legacy_q8_1!(q4_1, BlockQ4_1, |x| nib32(&x.qs));
    legacy_q8_1!(q5_1, BlockQ5_1, |x| _mm256_or_si256(nib32(&x.qs), _mm256_and_si256(bits32(x.qh), _mm256_set1_epi8(0x10))));

    // ------------------------------------------------------------ k-quants (ported from the
    // AVX-512 twins, which use only 256-bit AVX2 instructions here: the same instructions,
    // so the same bits; Q5_K's masked adds become compare-and-add)

    /// One block of llama.cpp's tiled k-quant matmul: `r = s1 * d_w`,
    /// `r = fnmadd(dmin_w, s2, r)`, `acc = fma(r, d_act, acc)` (the scalar twin's `tiled_step`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn tiled_step(acc: f32, s1: i32, s2: i32, d: [u8; 2], dmin: Option<[u8; 2]>, dy: f32) -> f32 {
        let mut r = s1 as f32 * f16s(d);
        if let Some(m) = dmin {
            r = (-f16s(m)).mul_add(s2 as f32, r);
        }
        r.mul_add(dy, acc)
    }

    /// Sum of 4 i32 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn hsum4_i32(v: __m128i) -> i32 {
        let s = _mm_add_epi32(v, _mm_shuffle_epi32::<0b01_00_11_10>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }

    /// The 16 i16 group sums of a Q8_K block as one vector.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn bsums(y: &BlockQ8K) -> __m256i {
        ld32(y.bsums.as_flattened(), 0)
    }

    /// The i16 scale vector of a 32-element chunk made of groups g (bytes 0..16) and g+1.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn scale_pair(s: &[i16; 16], g: usize) -> __m256i {
        _mm256_set_m128i(_mm_set1_epi16(s[g + 1]), _mm_set1_epi16(s[g]))
    }

    /// `madd(maddubs(q, q8), scales)`: ggml's k-quant lane step (q unsigned, q8 signed).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn mad(q: __m256i, q8: __m256i, sc: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(q, q8), sc)
    }

    /// 32 i8 of `s` from `off` (bounds-checked).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn ld32io(s: &[i8], off: usize) -> __m256i {
        ld32i(&s[off..])
    }

    /// 0xFF in each byte of `v` that has `bit` set, else 0.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn bit_set(v: __m256i, bit: u8) -> __m256i {
        let b = _mm256_set1_epi8(bit as i8);
        _mm256_cmpeq_epi8(_mm256_and_si256(v, b), b)
    }

    /// Q4_K/Q5_K min lanes: pm[k] = m[2k]*(bs[4k]+bs[4k+1]) + m[2k+1]*(bs[4k+2]+bs[4k+3]).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn k4_mins(mins: &[u8; 8], bs: __m256i) -> __m128i {
        // ggml: hadd of the two 8-sum halves gives the 32-element sums, madd with the mins
        let q8s = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256::<1>(bs));
        let m = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(i64::from_le_bytes(*mins)));
        _mm_madd_epi16(m, q8s)
    }

    /// `(v >> 2k) & 3` per byte.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn crumb(v: __m256i, k: usize) -> __m256i {
        _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * k as i32)), _mm256_set1_epi8(3))
    }

    /// ggml_vec_dot_q2_K_q8_K: acc = fma(dmin, min lanes, acc), then acc = fma(d, lanes, acc).
    /// With K = 1, llama.cpp's repacked gemv order instead: acc = fma(sum, dx*dy, acc) and
    /// acc_min = fma(min sum, dmin_x*dy, acc_min) in scalars per block, result acc - acc_min;
    /// K = 2 (its gemm) does the same per 128-element half block; K = 3 its tiled order.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn q2k<const R: usize, const K: u8>(w: [&[BlockQ2K]; R], a: &[BlockQ8K]) -> [f32; R] {
        let mut acc = [_mm256_setzero_ps(); R];
        let (mut acc_s, mut acc_m) = ([0f32; R], [0f32; R]);
        for (i, y) in a.iter().enumerate() {
            let dy = f32::from_le_bytes(y.d);
            let bs = bsums(y);
            for r in 0..R {
                let Some(x) = w[r].get(i) else { continue };
                let d = dy * f16s(x.d);
                let dmin = -dy * f16s(x.dmin);
                let sc8 = ld16(&x.scales, 0);
                let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(sc8), _mm_set1_epi8(0x0F)));
                let pm = _mm256_madd_epi16(mins, bs);
                let dmin_r = f16s(x.dmin) * dy;
                match K {
                    0 => acc[r] = fma_lanes(acc[r], dmin, pm),
                    1 => acc_m[r] = (hsum_i32(pm) as f32).mul_add(dmin_r, acc_m[r]),
                    3 => {}
                    _ => {
                        // lanes 0..4 hold groups 0..8 (first 128 elements), lanes 4..8 the rest
                        let lo = _mm256_blend_epi32::<0b1111_0000>(pm, _mm256_setzero_si256());
                        let hi = _mm256_blend_epi32::<0b0000_1111>(pm, _mm256_setzero_si256());
                        acc_m[r] = (hsum_i32(lo) as f32).mul_add(dmin_r, acc_m[r]);
                        acc_m[r] = (hsum_i32(hi) as f32).mul_add(dmin_r, acc_m[r]);
                    }
                }
                let mut sc = [0i16; 16];
                for (s, &b) in sc.iter_mut().zip(&x.scales) {
                    *s = (b & 0x0F) as i16;
                }
                let d_r = f16s(x.d) * dy;
                let mut sumi = _mm256_setzero_si256();
                for j in 0..2 {
                    let bits = ld32(&x.qs, 32 * j);
                    let mut sj = _mm256_setzero_si256();
                    for k in 0..4 {
                        let p = mad(crumb(bits, k), ld32io(&y.qs, 128 * j + 32 * k), scale_pair(&sc, 8 * j + 2 * k));
                        sj = _mm256_add_epi32(sj, p);
                    }
                    if K == 2 {
                        acc_s[r] = (hsum_i32(sj) as f32).mul_add(d_r, acc_s[r]);
                    }
                    sumi = _mm256_add_epi32(sumi, sj);
                }
                match K {
                    0 => acc[r] = fma_lanes(acc[r], d, sumi),
                    1 => acc_s[r] = (hsum_i32(sumi) as f32).mul_add(d_r, acc_s[r]),
                    3 => acc_s[r] = tiled_step(acc_s[r], hsum_i32(sumi), hsum_i32(pm), x.d, Some(x.dmin), dy),
                    _ => {}
                }
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = match K {
                0 => hsum(acc[r]),
                3 => acc_s[r],
                _ => acc_s[r] - acc_m[r],
            };
        }
        out
    }

    /// ggml_vec_dot_q3_K_q8_K: q = low2 - 4 where the hmask bit is clear, as two `vpmaddubsw`
    /// (low2 · a and 4 · a where the bit is clear) subtracted, then `vpmaddwd` by the scales;
    /// K = 3: llama.cpp's tiled order.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn q3k<const R: usize, const K: u8>(w: [&[BlockQ3K]; R], a: &[BlockQ8K]) -> [f32; R] {
        let mut acc = [_mm256_setzero_ps(); R];
        let mut acc_s = [0f32; R];
        for (i, y) in a.iter().enumerate() {
            let dy = f32::from_le_bytes(y.d);
            for r in 0..R {
                let Some(x) = w[r].get(i) else { continue };
                let d = dy * f16s(x.d);
                let s6 = q3k_scales(&x.scales);
                let mut sc = [0i16; 16];
                for (s, &v) in sc.iter_mut().zip(&s6) {
                    *s = v as i16;
                }
                let hbits = ld32(&x.hmask, 0);
                let mut sumi = _mm256_setzero_si256();
                for j in 0..2 {
                    let bits = ld32(&x.qs, 32 * j);
                    for k in 0..4 {
                        let q8 = ld32io(&y.qs, 128 * j + 32 * k);
                        let h4 = _mm256_andnot_si256(bit_set(hbits, 1u8 << (4 * j + k)), _mm256_set1_epi8(4));
                        let p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(crumb(bits, k), q8), _mm256_maddubs_epi16(h4, q8));
                        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, scale_pair(&sc, 8 * j + 2 * k)));
                    }
                }
                if K == 3 {
                    acc_s[r] = tiled_step(acc_s[r], hsum_i32(sumi), 0, x.d, None, dy);
                } else {
                    acc[r] = fma_lanes(acc[r], d, sumi);
                }
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = if K == 3 { acc_s[r] } else { hsum(acc[r]) };
        }
        out
    }

    /// ggml_vec_dot_q4_K_q8_K: acc = fma(d, lanes, acc); acc_m = fma(dmin, min lanes, acc_m)
    /// (4 lanes); hsum8(acc) + hsum4(acc_m).
    #[target_feature(enable = "avx2,fma,f16c")]
    /// With K = 1 / 2, llama.cpp's repacked gemv / gemm orders (as Q2_K's; the gemm steps per
    /// 64-element quarter block).
    fn q4k<const R: usize, const K: u8>(w: [&[BlockQ4K]; R], a: &[BlockQ8K]) -> [f32; R] {
        let mut acc = [_mm256_setzero_ps(); R];
        let mut acc_m = [_mm_setzero_ps(); R];
        let (mut acc_s, mut acc_ms) = ([0f32; R], [0f32; R]);
        let m4 = _mm256_set1_epi8(0x0F);
        for (i, y) in a.iter().enumerate() {
            let dy = f32::from_le_bytes(y.d);
            let bs = bsums(y);
            for r in 0..R {
                let Some(x) = w[r].get(i) else { continue };
                let d = dy * f16s(x.d);
                let dmin = -dy * f16s(x.dmin);
                let (sc, mn) = k4_scale_min(&x.scales);
                let pm = k4_mins(&mn, bs);
                let dmin_r = f16s(x.dmin) * dy;
                match K {
                    0 => acc_m[r] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(pm), acc_m[r]),
                    3 => {}
                    1 => {
                        let t = _mm_add_epi32(pm, _mm_shuffle_epi32::<0b01_00_11_10>(pm));
                        let t = _mm_add_epi32(t, _mm_shuffle_epi32::<0b10_11_00_01>(t));
                        acc_ms[r] = (_mm_cvtsi128_si32(t) as f32).mul_add(dmin_r, acc_ms[r]);
                    }
                    _ => {
                        // lane j: the min terms of quarter j (sub-blocks 2j, 2j+1), one FMA each
                        let mut m = [0i32; 4];
                        // SAFETY: `m` is 4 writable i32; storeu has no alignment requirement.
                        unsafe { _mm_storeu_si128(m.as_mut_ptr().cast(), pm) };
                        for &v in &m {
                            acc_ms[r] = (v as f32).mul_add(dmin_r, acc_ms[r]);
                        }
                    }
                }
                let d_r = f16s(x.d) * dy;
                let mut sumi = _mm256_setzero_si256();
                for j in 0..4 {
                    let bits = ld32(&x.qs, 32 * j);
                    let lo = _mm256_and_si256(bits, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
                    let pl = mad(lo, ld32io(&y.qs, 64 * j), _mm256_set1_epi16(sc[2 * j] as i16));
                    let ph = mad(hi, ld32io(&y.qs, 64 * j + 32), _mm256_set1_epi16(sc[2 * j + 1] as i16));
                    let sj = _mm256_add_epi32(pl, ph);
                    if K == 2 {
                        acc_s[r] = (hsum_i32(sj) as f32).mul_add(d_r, acc_s[r]);
                    }
                    sumi = _mm256_add_epi32(sumi, sj);
                }
                match K {
                    0 => acc[r] = fma_lanes(acc[r], d, sumi),
                    1 => acc_s[r] = (hsum_i32(sumi) as f32).mul_add(d_r, acc_s[r]),
                    3 => acc_s[r] = tiled_step(acc_s[r], hsum_i32(sumi), hsum4_i32(pm), x.d, Some(x.dmin), dy),
                    _ => {}
                }
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            if K == 3 {
                out[r] = acc_s[r];
                continue;
            }
            if K != 0 {
                out[r] = acc_s[r] - acc_ms[r];
                continue;
            }
            let mut m = [0f32; 4];
            // SAFETY: `m` is 4 writable f32; storeu has no alignment requirement.
            unsafe { _mm_storeu_ps(m.as_mut_ptr(), acc_m[r]) };
            out[r] = hsum(acc[r]) + hsum4(m);
        }
        out
    }

    /// ggml_vec_dot_q5_K_q8_K: as Q4_K with the fifth bit; the min lanes are summed as integers
    /// and folded into a scalar, summs = fma(sum as f32, dmin, summs).
    #[target_feature(enable = "avx2,fma,f16c")]
    fn q5k<const R: usize, const K: u8>(w: [&[BlockQ5K]; R], a: &[BlockQ8K]) -> [f32; R] {
        let mut acc = [_mm256_setzero_ps(); R];
        let mut acc_s = [0f32; R];
        let mut summs = [0f32; R];
        let m4 = _mm256_set1_epi8(0x0F);
        let b4 = _mm256_set1_epi8(16);
        for (i, y) in a.iter().enumerate() {
            let dy = f32::from_le_bytes(y.d);
            let bs = bsums(y);
            for r in 0..R {
                let Some(x) = w[r].get(i) else { continue };
                let d = dy * f16s(x.d);
                let dmin = -dy * f16s(x.dmin);
                let (sc, mn) = k4_scale_min(&x.scales);
                let pm = hsum4_i32(k4_mins(&mn, bs));
                if K != 3 {
                    summs[r] = (pm as f32).mul_add(dmin, summs[r]);
                }
                let hbits = ld32(&x.qh, 0);
                let mut sumi = _mm256_setzero_si256();
                for j in 0..4 {
                    let bits = ld32(&x.qs, 32 * j);
                    let lo = _mm256_and_si256(bits, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
                    // + 16 where the element's high bit (bit 2j / 2j+1 of its qh byte) is set
                    let lo = _mm256_add_epi8(lo, _mm256_and_si256(bit_set(hbits, 1u8 << (2 * j)), b4));
                    let hi = _mm256_add_epi8(hi, _mm256_and_si256(bit_set(hbits, 1u8 << (2 * j + 1)), b4));
                    let pl = mad(lo, ld32io(&y.qs, 64 * j), _mm256_set1_epi16(sc[2 * j] as i16));
                    let ph = mad(hi, ld32io(&y.qs, 64 * j + 32), _mm256_set1_epi16(sc[2 * j + 1] as i16));
                    sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
                }
                if K == 3 {
                    acc_s[r] = tiled_step(acc_s[r], hsum_i32(sumi), pm, x.d, Some(x.dmin), dy);
                } else {
                    acc[r] = fma_lanes(acc[r], d, sumi);
                }
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = if K == 3 { acc_s[r] } else { hsum(acc[r]) + summs[r] };
        }
        out
    }

    /// ggml_vec_dot_q6_K_q8_K: unsigned 6-bit quants, the -32 offset subtracted per lane as
    /// 32 * madd(bsums, scales).
    #[target_feature(enable = "avx2,fma,f16c")]
    fn q6k<const R: usize, const K: u8>(w: [&[BlockQ6K]; R], a: &[BlockQ8K]) -> [f32; R] {
        let mut acc = [_mm256_setzero_ps(); R];
        let mut acc_s = [0f32; R];
        let m4 = _mm256_set1_epi8(0x0F);
        for (i, y) in a.iter().enumerate() {
            let dy = f32::from_le_bytes(y.d);
            let bs = bsums(y);
            for r in 0..R {
                let Some(x) = w[r].get(i) else { continue };
                let d = dy * f16s(x.d);
                // SAFETY: `x.scales` is 16 readable bytes; loadu has no alignment requirement.
                let scales = unsafe { _mm_loadu_si128(x.scales.as_ptr().cast()) };
                let sub = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bs, _mm256_cvtepi8_epi16(scales)));
                let mut sc = [0i16; 16];
                for (s, &v) in sc.iter_mut().zip(&x.scales) {
                    *s = v as i16;
                }
                let mut sumi = _mm256_setzero_si256();
                for j in 0..2 {
                    let l1 = ld32(&x.ql, 64 * j);
                    let l2 = ld32(&x.ql, 64 * j + 32);
                    let h = ld32(&x.qh, 32 * j);
                    let q = [
                        _mm256_or_si256(
                            _mm256_and_si256(l1, m4),
                            _mm256_slli_epi16::<4>(_mm256_and_si256(h, _mm256_set1_epi8(3))),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(l2, m4),
                            _mm256_slli_epi16::<2>(_mm256_and_si256(h, _mm256_set1_epi8(12))),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(l1), m4),
                            _mm256_and_si256(h, _mm256_set1_epi8(48)),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(l2), m4),
                            _mm256_srli_epi16::<2>(_mm256_and_si256(h, _mm256_set1_epi8(-64))),
                        ),
                    ];
                    for (k, &qk) in q.iter().enumerate() {
                        let p = mad(qk, ld32io(&y.qs, 128 * j + 32 * k), scale_pair(&sc, 8 * j + 2 * k));
                        sumi = _mm256_add_epi32(sumi, p);
                    }
                }
                let p = _mm256_sub_epi32(sumi, sub);
                if K == 3 {
                    acc_s[r] = tiled_step(acc_s[r], hsum_i32(p), 0, x.d, None, dy);
                } else {
                    acc[r] = fma_lanes(acc[r], d, p);
                }
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = if K == 3 { acc_s[r] } else { hsum(acc[r]) };
        }
        out
    }

    // ------------------------------------------------------------ 4-bit lookup-table types
    // ggml's instructions: the nibbles index a 16-byte table of the signed levels with
    // `vpshufb` (the table in both 128-bit halves), then the signed x signed byte dot of the
    // legacy types (`dot_i8`: |w| * sign(a, w), exact for activations in -127..127).

    /// The 16 levels of a table in both 128-bit halves, for `vpshufb`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn levels(k: &[i8; 16]) -> __m256i {
        // SAFETY: `k` is 16 readable bytes; loadu has no alignment requirement.
        _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(k.as_ptr().cast()) })
    }

    /// The 32 levels of 16 nibble bytes, in element order (low nibbles, then high nibbles).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn lut32(qs: &[u8], t: __m256i) -> __m256i {
        _mm256_shuffle_epi8(t, nib32(qs))
    }

    macro_rules! lut_q8_0 {
        ($name:ident, $B:ty, $levels:expr, |$x:ident| $d:expr) => {
            /// `vecdot::dot_pairs`: the even block of each pair into `acc[.][0]`, the odd one into
            /// `acc[.][1]` (ggml's accum1 / accum2), added and reduced at the end; an odd last
            /// block as a scalar FMA of its lane sum. Matvec's empty padding rows give 0.
            #[target_feature(enable = "avx2,fma,f16c")]
            fn $name<const R: usize>(w: [&[$B]; R], a: &[BlockQ8_0]) -> [f32; R] {
                let t = levels(&$levels);
                let mut acc = [[_mm256_setzero_ps(); 2]; R];
                let mut tail = [0f32; R];
                let pairs = a.len() - a.len() % 2;
                let mut out = [0f32; R];
                for (i, y) in a.iter().enumerate() {
                    let dy = f16s(y.d);
                    let qy = ld32i(&y.qs);
                    for r in 0..R {
                        let Some($x) = w[r].get(i) else { continue };
                        let d = dy * $d;
                        let p = dot_i8(lut32(&$x.qs, t), qy);
                        if i < pairs {
                            acc[r][i % 2] = fma_lanes(acc[r][i % 2], d, p);
                        } else {
                            tail[r] = d;
                            out[r] = hsum_i32(p) as f32;
                        }
                    }
                }
                for r in 0..R {
                    let sum = hsum(_mm256_add_ps(acc[r][0], acc[r][1]));
                    // the odd last block's FMA only where ggml's tail loop runs (padding rows
                    // have no blocks)
                    out[r] = if pairs < a.len() && w[r].len() == a.len() { tail[r].mul_add(out[r], sum) } else { sum };
                }
                out
            }
        };
    }

    lut_q8_0!(iq4nl, BlockIQ4NL, KVALUES_IQ4NL, |x| f16s(x.d));
    lut_q8_0!(mxfp4, BlockMXFP4, KVALUES_MXFP4, |x| e8m0_half(x.e));

    /// ggml_vec_dot_iq4_xs_q8_K: per pair of sub-blocks `vpmaddubsw(|w|, sign(a, w))` and
    /// `vpmaddwd` by the sub-block's `ls - 32`, summed over the super-block in i32 lanes, then
    /// acc = fma(f16(dx) * dy, lanes, acc); hsum8.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn iq4xs<const R: usize>(w: [&[BlockIQ4XS]; R], a: &[BlockQ8K]) -> [f32; R] {
        let t = levels(&KVALUES_IQ4NL);
        let mut acc = [_mm256_setzero_ps(); R];
        for (i, y) in a.iter().enumerate() {
            let dy = f32::from_le_bytes(y.d);
            let qy: [__m256i; 8] = std::array::from_fn(|ib| ld32io(&y.qs, 32 * ib));
            for r in 0..R {
                let Some(x) = w[r].get(i) else { continue };
                let sc = iq4xs_scales(x);
                let mut sumi = _mm256_setzero_si256();
                for (ib, &q8) in qy.iter().enumerate() {
                    let q = lut32(&x.qs[16 * ib..16 * ib + 16], t);
                    let p16 = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(q8, q));
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, _mm256_set1_epi16(sc[ib] as i16)));
                }
                acc[r] = fma_lanes(acc[r], f16s(x.d) * dy, sumi);
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = hsum(acc[r]);
        }
        out
    }
}

//! AVX2 and AVX-512 twins of the 2-/3-bit grid types' scalar kernels in `iq23.rs` (IQ2_XXS,
//! IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S), which stay their reference.
//!
//! Owns: `avx2::dot` and `avx512::dot` (a weight row, or R rows sharing one activation row,
//! times a Q8_K activation row in ggml's AVX2 order), and `avx512::dequant` (a block to 256
//! floats). The dispatch stays where every type's is (`vecdot_avx2`, `vecdot_avx512`,
//! `dequant_avx512`), which call these only after checking the CPU features.
//!
//! Both dot kernels are ggml's AVX2 recipe: the grid magnitudes (unsigned bytes, at most 62) go
//! into a register from `IqBlock::grid` (scalar table loads, as ggml's `_mm256_set_epi64x`),
//! the sign bits negate the activation bytes (xor + sub, or a masked `0 - q`), `vpmaddubsw`
//! pairs them (at most 2 * 62 * 128, no saturation) and `vpmaddwd` by the sub-block's scale
//! gives the 8 i32 lanes of `iq23::lanes`, exactly. The AVX-512 kernel takes two sub-blocks
//! per 512-bit register and folds its halves into the same 8 lanes (integers: any order). The
//! float steps are the scalar twin's: one FMA per super-block, `FACTOR * hsum8` at the end, so
//! the results are bit-identical (tests/vecdot.rs).
//!
//! Where the time goes: the grid gathers (4-8 scalar loads and inserts per 32 weights) and the
//! sign decode, not the multiply-adds; see examples/vecdot_bench.rs.

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use super::super::blocks::*;
    use super::super::iq23::IqBlock;
    use super::super::vecdot::hsum8;
    use std::arch::x86_64::*;

    /// 32 i8 of `s` from `off` (bounds-checked).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn ld32i(s: &[i8], off: usize) -> __m256i {
        let s = &s[off..off + 32];
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

    /// 0xFF in byte j where bit j of `s` is set, else 0 (ggml's `k_mask1` shuffle, `k_mask2`
    /// and-compare).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn sign_mask(s: u32) -> __m256i {
        let shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(s as i32), shuf);
        let bit = _mm256_set1_epi64x(0x8040201008040201u64 as i64);
        _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit)
    }

    /// The 8 i32 lanes of sub-block `ib` of `x` against its 32 activation bytes `q8`, times the
    /// sub-block's scales.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn sub_lanes<B: IqBlock>(x: &B, ib: usize, q8: __m256i) -> __m256i {
        let g = x.grid(ib);
        let gv = _mm256_set_epi64x(g[3] as i64, g[2] as i64, g[1] as i64, g[0] as i64);
        let m = sign_mask(x.signs(ib));
        // -q where the mask is set: (q ^ -1) - (-1) = !q + 1, wrapping like `vpsignb`
        let q8s = _mm256_sub_epi8(_mm256_xor_si256(q8, m), m);
        let sc = x.scales(ib);
        let scv = _mm256_set_m128i(_mm_set1_epi16(sc[1] as i16), _mm_set1_epi16(sc[0] as i16));
        _mm256_madd_epi16(_mm256_maddubs_epi16(gv, q8s), scv)
    }

    /// R weight rows (whole super-blocks; a shorter row, matvec's empty padding, stops
    /// contributing) times one Q8_K activation row: `iq23::dot` for each.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) fn dot<B: IqBlock, const R: usize>(w: [&[B]; R], a: &[BlockQ8K]) -> [f32; R] {
        let mut acc = [_mm256_setzero_ps(); R];
        for (i, y) in a.iter().enumerate() {
            let dy = f32::from_le_bytes(y.d);
            let qy: [__m256i; 8] = std::array::from_fn(|ib| ld32i(&y.qs, 32 * ib));
            for r in 0..R {
                let Some(x) = w[r].get(i) else { continue };
                let mut sumi = _mm256_setzero_si256();
                for (ib, &q8) in qy.iter().enumerate() {
                    sumi = _mm256_add_epi32(sumi, sub_lanes(x, ib, q8));
                }
                let d = f16s(x.d()) * dy;
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc[r]);
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = B::FACTOR * hsum(acc[r]);
        }
        out
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    use super::super::blocks::*;
    use super::super::iq23::IqBlock;
    use super::super::vecdot::hsum8;
    use std::arch::x86_64::*;

    /// 64 i8 of `s` from `off` (bounds-checked).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn ld64i(s: &[i8], off: usize) -> __m512i {
        let s = &s[off..off + 64];
        // SAFETY: `s` is exactly 64 readable bytes; loadu has no alignment requirement.
        unsafe { _mm512_loadu_si512(s.as_ptr().cast()) }
    }

    /// An f16's value as f32 (exact).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn f16s(b: [u8; 2]) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(u16::from_le_bytes(b) as i16)))
    }

    /// ggml's `hsum_float_8`, via the scalar twin's function on the stored lanes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn hsum(v: __m256) -> f32 {
        let mut a = [0f32; 8];
        // SAFETY: `a` is 8 writable f32; storeu has no alignment requirement.
        unsafe { _mm256_storeu_ps(a.as_mut_ptr(), v) };
        hsum8(a)
    }

    /// A scale in all four i16 of a u64.
    #[inline(always)]
    fn rep4(s: u8) -> i64 {
        (s as u64 * 0x0001_0001_0001_0001) as i64
    }

    /// Sub-blocks 2j and 2j + 1 of `x` against their 64 activation bytes: 16 i32 lanes, the
    /// low 8 sub-block 2j's `iq23::lanes` terms, the high 8 sub-block 2j + 1's.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn pair_lanes<B: IqBlock>(x: &B, j: usize, q8: __m512i) -> __m512i {
        let (g0, g1) = (x.grid(2 * j), x.grid(2 * j + 1));
        let gv = _mm512_set_epi64(
            g1[3] as i64,
            g1[2] as i64,
            g1[1] as i64,
            g1[0] as i64,
            g0[3] as i64,
            g0[2] as i64,
            g0[1] as i64,
            g0[0] as i64,
        );
        let k = x.signs(2 * j) as u64 | (x.signs(2 * j + 1) as u64) << 32;
        // 0 - q where the sign bit is set, wrapping like the AVX2 twin
        let q8s = _mm512_mask_sub_epi8(q8, k, _mm512_setzero_si512(), q8);
        let (s0, s1) = (x.scales(2 * j), x.scales(2 * j + 1));
        // i16 lane m covers bytes 2m, 2m+1: lanes 0..8 elements 0..16 of sub-block 2j, ...
        let scv = _mm512_set_epi64(
            rep4(s1[1]),
            rep4(s1[1]),
            rep4(s1[0]),
            rep4(s1[0]),
            rep4(s0[1]),
            rep4(s0[1]),
            rep4(s0[0]),
            rep4(s0[0]),
        );
        _mm512_madd_epi16(_mm512_maddubs_epi16(gv, q8s), scv)
    }

    /// As `avx2::dot`, two sub-blocks per 512-bit register.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub(in super::super) fn dot<B: IqBlock, const R: usize>(w: [&[B]; R], a: &[BlockQ8K]) -> [f32; R] {
        let mut acc = [_mm256_setzero_ps(); R];
        for (i, y) in a.iter().enumerate() {
            let dy = f32::from_le_bytes(y.d);
            let qy: [__m512i; 4] = std::array::from_fn(|j| ld64i(&y.qs, 64 * j));
            for r in 0..R {
                let Some(x) = w[r].get(i) else { continue };
                let mut sumi = _mm512_setzero_si512();
                for (j, &q8) in qy.iter().enumerate() {
                    sumi = _mm512_add_epi32(sumi, pair_lanes(x, j, q8));
                }
                let s8 = _mm256_add_epi32(_mm512_castsi512_si256(sumi), _mm512_extracti64x4_epi64::<1>(sumi));
                let d = f16s(x.d()) * dy;
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s8), acc[r]);
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = B::FACTOR * hsum(acc[r]);
        }
        out
    }

    /// One block -> 256 floats, the bits of `iq23::dequant`: per 16 elements
    /// `db = d * (2s + 1) * FACTOR` (scalar, the same three roundings-free products), then
    /// `db * magnitude` in 16 lanes and the sign bit xored in where the block's bit is set.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    pub(in super::super) fn dequant<B: IqBlock>(b: &B, y: &mut [f32; 256]) {
        let d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(u16::from_le_bytes(b.d()) as i16)));
        let sign = _mm512_set1_epi32(i32::MIN);
        for (ib, out) in y.chunks_exact_mut(32).enumerate() {
            let g = b.grid(ib);
            let s = b.signs(ib);
            let sc = b.scales(ib);
            for (h, o) in out.chunks_exact_mut(16).enumerate() {
                let db = d * sc[h] as f32 * B::FACTOR;
                let gb = _mm_set_epi64x(g[2 * h + 1] as i64, g[2 * h] as i64);
                let v = _mm512_mul_ps(_mm512_set1_ps(db), _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(gb)));
                let v = _mm512_mask_xor_epi32(_mm512_castps_si512(v), (s >> (16 * h)) as u16, _mm512_castps_si512(v), sign);
                let o = &mut o[..16];
                // SAFETY: `o` is exactly 16 writable f32; storeu has no alignment requirement.
                unsafe { _mm512_storeu_si512(o.as_mut_ptr().cast(), v) };
            }
        }
    }
}

//! AVX2 and AVX-512 twins of the 2-/3-bit grid types' scalar kernels in `iq23.rs` (IQ2_XXS,
//! IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S), which stay their reference.
//!
//! Owns: one dot-product kernel per type and tier (`avx2::iq2xxs` .. `avx512::iq3s`: R weight
//! rows sharing one Q8_K activation row, in ggml's AVX2 float order) and the AVX-512
//! dequantizers `avx512::dq_iq2xxs` .. `dq_iq3s` (a block to 256 floats, decoded as the dot
//! kernels decode it). The dispatch stays where every type's is
//! (`vecdot_avx2`, `vecdot_avx512`, `dequant_avx512`), which call these only after checking the
//! CPU features.
//!
//! The integer work is ggml's AVX2 recipe: the grid magnitudes (unsigned bytes, at most 62) in
//! one register, the activation bytes negated where the element's sign bit is set (xor + sub, or
//! a masked `0 - q`: both wrap a -128 as `vpsignb` does), `vpmaddubsw` (at most 2 * 62 * 128,
//! no saturation) and `vpmaddwd` by the 16-element group's scale `2s + 1`, giving exactly the
//! 8 i32 lanes of `iq23::lanes`. The AVX-512 kernels take two sub-blocks per 512-bit register
//! and fold its halves into the same 8 lanes (integers: any order). The float steps are the
//! scalar twin's (one FMA per super-block, `FACTOR * hsum8` at the end), so the results are
//! bit-identical to it and to ggml (tests/vecdot.rs).
//!
//! Per super-block each kernel first decodes the sign bits of all 256 elements and the 16
//! group scales in vector registers (the 7-bit sign patterns of IQ2_XXS / IQ2_XS / IQ3_XXS by
//! computing the parity bit instead of looking `KSIGNS_IQ2XS` up), then per sub-block (pair)
//! fetches the grid entries: AVX2 by scalar table loads and inserts, as ggml does; AVX-512 by
//! `vpgatherdq` / `vpgatherdd` from indices decoded in vector registers. That ordering is where
//! the speed came from (examples/vecdot_bench, 256 x 2048, G weights/s on a 2-core share of an
//! AVX-512 Xeon, 2026-12-06; first per-sub-block trait version -> these kernels): AVX-512
//! IQ2_XXS 11 -> 20, IQ2_XS 8 -> 22.5, IQ2_S 8 -> 23, IQ3_XXS 7 -> 18.7, IQ3_S 3 -> 19.5 (Q4_K
//! 33.7 on the same run); AVX2 11 -> 14, 10 -> 12, 13 -> 13, 8 -> 12.8, 8.6 -> 9.9. ggml's own
//! AVX2 kernels on the same machine: 17.5, 14.5, 16.3, 12.9, 9.75.

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use super::super::blocks::*;
    use super::super::iq_grids::*;
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

    #[inline(always)]
    fn u32_at(s: &[u8], off: usize) -> u32 {
        u32::from_le_bytes([s[off], s[off + 1], s[off + 2], s[off + 3]])
    }

    /// 32 bytes of `s` from `off` (bounds-checked).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn ld32(s: &[u8], off: usize) -> __m256i {
        let s = &s[off..off + 32];
        // SAFETY: `s` is exactly 32 readable bytes; loadu has no alignment requirement.
        unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
    }

    /// `KSIGNS_IQ2XS` of the four 7-bit fields (bits 7k..7k+7) of each dword of `a`, computed
    /// instead of looked up: the table's byte for index i is i with bit 7 set to the parity of
    /// i (an even count of negative signs), so spread the fields into bytes and xor-fold each
    /// byte's bits down to bit 0 (the shifts' spill from the byte above lands in bits 4..7,
    /// which the later steps never read). tests/vecdot.rs compares with the scalar twin's table.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn ksigns8x32(a: __m256i) -> [u32; 8] {
        let m = |v: i32| _mm256_set1_epi32(v);
        let v = _mm256_or_si256(
            _mm256_or_si256(_mm256_and_si256(a, m(0x7F)), _mm256_and_si256(_mm256_slli_epi32::<1>(a), m(0x7F00))),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_slli_epi32::<2>(a), m(0x7F_0000)),
                _mm256_and_si256(_mm256_slli_epi32::<3>(a), m(0x7F00_0000)),
            ),
        );
        let p = _mm256_xor_si256(v, _mm256_srli_epi32::<4>(v));
        let p = _mm256_xor_si256(p, _mm256_srli_epi32::<2>(p));
        let p = _mm256_xor_si256(p, _mm256_srli_epi32::<1>(p));
        let sb = _mm256_or_si256(v, _mm256_slli_epi32::<7>(_mm256_and_si256(p, m(0x0101_0101))));
        let mut out = [0u32; 8];
        // SAFETY: `out` is 32 writable bytes; storeu has no alignment requirement.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), sb) };
        out
    }

    /// `2s + 1` of each byte `s` (at most 31: no carry out of a byte).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn odd8(v: __m128i) -> __m128i {
        _mm_add_epi8(_mm_add_epi8(v, v), _mm_set1_epi8(1))
    }

    /// Low and high nibbles of the 8 bytes of `b`, interleaved: byte 2k the low nibble of byte
    /// k, 2k + 1 its high nibble.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn nibbles8(b: u64) -> __m128i {
        let v = _mm_set_epi64x(0, b as i64);
        let m = _mm_set1_epi8(0x0F);
        _mm_unpacklo_epi8(_mm_and_si128(v, m), _mm_and_si128(_mm_srli_epi16::<4>(v), m))
    }

    // Per type: `prep(x)`, once per super-block: the sign bits of each sub-block (u32 ib) and
    // the 16 group scales `2s + 1` as bytes in group order; `grid(x, ib)`: sub-block ib's 32
    // magnitudes in element order (scalar table loads, as ggml's `_mm256_set_epi*`).

    /// The 8 sign-and-scale words of an XXS block -> (their sign bits, the group scales).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn xxs_prep(aux: __m256i) -> ([u32; 8], __m128i) {
        // `>> 28` leaves scale ib (0..16) in dword ib; pack the two halves' dwords to words,
        // then to bytes, in order
        let s = _mm256_srli_epi32::<28>(aux);
        let w = _mm_packus_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
        let b = _mm_packus_epi16(w, w); // bytes 0..8: scale of sub-block ib
        (ksigns8x32(aux), odd8(_mm_unpacklo_epi8(b, b)))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn iq2xxs_prep(x: &BlockIQ2XXS) -> ([u32; 8], __m128i) {
        let a: [i32; 8] = std::array::from_fn(|ib| u32_at(&x.qs, 8 * ib + 4) as i32);
        xxs_prep(_mm256_setr_epi32(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn iq3xxs_prep(x: &BlockIQ3XXS) -> ([u32; 8], __m128i) {
        xxs_prep(ld32(&x.qs, QK_K / 4))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn iq2xs_prep(x: &BlockIQ2XS) -> ([u32; 8], __m128i) {
        // 32 u16: the top 7 bits index KSIGNS_IQ2XS, computed per lane as in `ksigns8x32`
        let sb = |q: __m256i| {
            let v = _mm256_srli_epi16::<9>(q);
            let p = _mm256_xor_si256(v, _mm256_srli_epi16::<4>(v));
            let p = _mm256_xor_si256(p, _mm256_srli_epi16::<2>(p));
            let p = _mm256_xor_si256(p, _mm256_srli_epi16::<1>(p));
            _mm256_or_si256(v, _mm256_slli_epi16::<7>(_mm256_and_si256(p, _mm256_set1_epi16(1))))
        };
        // in-lane pack, then the 64-bit quarters back in order (0, 2, 1, 3)
        let b = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi16(sb(ld32(&x.qs, 0)), sb(ld32(&x.qs, 32))));
        let mut signs = [0u32; 8];
        // SAFETY: `signs` is 32 writable bytes; storeu has no alignment requirement.
        unsafe { _mm256_storeu_si256(signs.as_mut_ptr().cast(), b) };
        (signs, odd8(nibbles8(u64::from_le_bytes(x.scales))))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn iq2s_prep(x: &BlockIQ2S) -> ([u32; 8], __m128i) {
        let signs = std::array::from_fn(|ib| u32_at(&x.qs, QK_K / 8 + 4 * ib));
        (signs, odd8(nibbles8(u64::from_le_bytes(x.scales))))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn iq3s_prep(x: &BlockIQ3S) -> ([u32; 8], __m128i) {
        // sub-block ib: nibble ib%2 of scales[ib/2]; groups 2ib, 2ib + 1 share it
        let sub = nibbles8(u32::from_le_bytes(x.scales) as u64);
        (std::array::from_fn(|ib| u32_at(&x.signs, 4 * ib)), odd8(_mm_unpacklo_epi8(sub, sub)))
    }

    /// IQ2 types: four 8-magnitude entries.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn grid64<B: IqBlock>(x: &B, ib: usize) -> __m256i {
        let g = x.grid(ib);
        _mm256_set_epi64x(g[3] as i64, g[2] as i64, g[1] as i64, g[0] as i64)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn iq3xxs_grid(x: &BlockIQ3XXS, ib: usize) -> __m256i {
        let g: [i32; 8] = std::array::from_fn(|k| IQ3XXS_GRID[x.qs[8 * ib + k] as usize] as i32);
        _mm256_setr_epi32(g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7])
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn iq3s_grid(x: &BlockIQ3S, ib: usize) -> __m256i {
        let h = x.qh[ib] as usize;
        let g: [i32; 8] = std::array::from_fn(|k| IQ3S_GRID[x.qs[8 * ib + k] as usize | ((h >> k) & 1) << 8] as i32);
        _mm256_setr_epi32(g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7])
    }

    macro_rules! kernel {
        ($name:ident, $B:ty, $prep:ident, $grid:path) => {
            /// `iq23::dot` for R rows (whole super-blocks; a shorter row, matvec's empty
            /// padding, stops contributing): per sub-block the magnitudes, the activation
            /// bytes negated where the sign bit is set, `vpmaddubsw`, `vpmaddwd` by the two
            /// group scales, summed into the 8 i32 lanes of `iq23::lanes`.
            #[target_feature(enable = "avx2,fma,f16c")]
            pub(in super::super) fn $name<const R: usize>(w: [&[$B]; R], a: &[BlockQ8K]) -> [f32; R] {
                let mut acc = [_mm256_setzero_ps(); R];
                for (i, y) in a.iter().enumerate() {
                    let dy = f32::from_le_bytes(y.d);
                    let qy: [__m256i; 8] = std::array::from_fn(|ib| ld32i(&y.qs, 32 * ib));
                    for r in 0..R {
                        let Some(x) = w[r].get(i) else { continue };
                        let (signs, scb) = $prep(x);
                        let mut sumi = _mm256_setzero_si256();
                        for (ib, &q8) in qy.iter().enumerate() {
                            let m = sign_mask(signs[ib]);
                            // -q where the mask is set: (q ^ -1) - (-1), wrapping like `vpsignb`
                            let q8s = _mm256_sub_epi8(_mm256_xor_si256(q8, m), m);
                            // i16 lanes 0..8: group 2ib's scale, 8..16: group 2ib + 1's
                            let g2 = (2 * ib) as i64 * 0x0101_0101_0101_0101;
                            let sel = _mm_set_epi64x(g2 + 0x0101_0101_0101_0101, g2);
                            let scv = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(scb, sel));
                            let p = _mm256_madd_epi16(_mm256_maddubs_epi16($grid(x, ib), q8s), scv);
                            sumi = _mm256_add_epi32(sumi, p);
                        }
                        let d = f16s(x.d) * dy;
                        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc[r]);
                    }
                }
                let mut out = [0f32; R];
                for r in 0..R {
                    out[r] = <$B as IqBlock>::FACTOR * hsum(acc[r]);
                }
                out
            }
        };
    }

    kernel!(iq2xxs, BlockIQ2XXS, iq2xxs_prep, grid64);
    kernel!(iq2xs, BlockIQ2XS, iq2xs_prep, grid64);
    kernel!(iq2s, BlockIQ2S, iq2s_prep, grid64);
    kernel!(iq3xxs, BlockIQ3XXS, iq3xxs_prep, iq3xxs_grid);
    kernel!(iq3s, BlockIQ3S, iq3s_prep, iq3s_grid);
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    use super::super::blocks::*;
    use super::super::iq_grids::*;
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

    /// 16 bytes of `s` from `off` (bounds-checked).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn ld16(s: &[u8], off: usize) -> __m128i {
        let s = &s[off..off + 16];
        // SAFETY: `s` is exactly 16 readable bytes; loadu has no alignment requirement.
        unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
    }

    #[inline(always)]
    fn u32_at(s: &[u8], off: usize) -> u32 {
        u32::from_le_bytes([s[off], s[off + 1], s[off + 2], s[off + 3]])
    }

    #[inline(always)]
    fn u64_at(s: &[u8], off: usize) -> u64 {
        u64::from_le_bytes(s[off..off + 8].try_into().expect("8 bytes"))
    }

    /// `avx2::ksigns8x32`, as the sign bits of the four 64-element pairs.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn ksigns8x32(a: __m256i) -> [u64; 4] {
        let w = super::avx2::ksigns8x32(a);
        std::array::from_fn(|j| w[2 * j] as u64 | (w[2 * j + 1] as u64) << 32)
    }

    /// The 16 group scales `2s + 1` (one per 16 elements) as i16 lanes 0..16 of the result,
    /// from 16 bytes of raw 4-bit scales `s` in group order.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn odd16(s: __m128i) -> __m512i {
        let v = _mm256_cvtepu8_epi16(s);
        _mm512_castsi256_si512(_mm256_add_epi16(_mm256_slli_epi16::<1>(v), _mm256_set1_epi16(1)))
    }

    /// Low and high nibbles of the 8 bytes of `b`, interleaved: byte 2k the low nibble of byte
    /// k, 2k + 1 its high nibble.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn nibbles8(b: u64) -> __m128i {
        let v = _mm_set_epi64x(0, b as i64);
        let m = _mm_set1_epi8(0x0F);
        _mm_unpacklo_epi8(_mm_and_si128(v, m), _mm_and_si128(_mm_srli_epi16::<4>(v), m))
    }

    /// i16 lane m of pair j's scale register: group 4j + m/8 (i16 lane m covers bytes 2m, 2m+1
    /// of the pair's 64 elements, so 8 lanes per 16-element group).
    static PAIR_GROUPS: [[i16; 32]; 4] = {
        let mut t = [[0i16; 32]; 4];
        let mut j = 0;
        while j < 4 {
            let mut m = 0;
            while m < 32 {
                t[j][m] = (4 * j + m / 8) as i16;
                m += 1;
            }
            j += 1;
        }
        t
    };

    /// IQ2_XXS / IQ3_XXS: sub-block ib's scale is the top 4 bits of its sign-and-scale u32;
    /// with the 8 such words as dwords, `>> 28` leaves it in i16 lane 2ib; groups 2ib and 2ib + 1
    /// share it.
    static XXS_GROUPS: [i16; 32] = {
        let mut t = [0i16; 32];
        let mut g = 0;
        while g < 16 {
            t[g] = (2 * (g / 2)) as i16;
            g += 1;
        }
        t
    };

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn ld_i16x32(t: &[i16; 32]) -> __m512i {
        // SAFETY: `t` is 64 readable bytes; loadu has no alignment requirement.
        unsafe { _mm512_loadu_si512(t.as_ptr().cast()) }
    }

    /// 8 grid entries of 8 magnitudes (64 elements) gathered from `grid` at the 8 dword
    /// indices `idx`, each below `grid.len()` (the callers mask them to the table size).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn gather8(grid: &[u64], idx: __m256i) -> __m512i {
        // SAFETY: every index is < grid.len() (the callers build them from at most 8, 9 or 10
        // bits for tables of 256, 512 and 1024 entries), so each 8-byte read is inside `grid`.
        unsafe { _mm512_i32gather_epi64::<8>(idx, grid.as_ptr().cast()) }
    }

    /// 16 grid entries of 4 magnitudes (64 elements) gathered from `grid` at `idx`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn gather16(grid: &[u32], idx: __m512i) -> __m512i {
        // SAFETY: every index is < grid.len() (8 or 9 bits for tables of 256 and 512 entries),
        // so each 4-byte read is inside `grid`.
        unsafe { _mm512_i32gather_epi32::<4>(idx, grid.as_ptr().cast()) }
    }

    // Per type: `prep(x)` (the 16 group scales in `odd16`'s layout, and the sign bits of each
    // 64-element pair j as u64 j) and `grid(x, j)` (the magnitudes of elements 64j..64j+64 in
    // element order).

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn iq2xxs_prep(x: &BlockIQ2XXS) -> (__m512i, [u64; 4]) {
        // SAFETY: x.qs is 64 readable bytes; loadu has no alignment requirement.
        let q = unsafe { _mm512_loadu_si512(x.qs.as_ptr().cast()) };
        // each sub-block's second u32 (signs and scale): the high dword of each qword
        let a = _mm512_cvtepi64_epi32(_mm512_srli_epi64::<32>(q));
        let s = _mm512_permutexvar_epi16(ld_i16x32(&XXS_GROUPS), _mm512_castsi256_si512(_mm256_srli_epi32::<28>(a)));
        (_mm512_add_epi16(_mm512_slli_epi16::<1>(s), _mm512_set1_epi16(1)), ksigns8x32(a))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn iq2xxs_grid(x: &BlockIQ2XXS, j: usize) -> __m512i {
        let (e, o) = (16 * j, 16 * j + 8);
        let idx = _mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, u32_at(&x.qs, o) as i32, u32_at(&x.qs, e) as i32));
        gather8(&IQ2XXS_GRID, idx)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn iq2xs_prep(x: &BlockIQ2XS) -> (__m512i, [u64; 4]) {
        // SAFETY: x.qs is 64 readable bytes; loadu has no alignment requirement.
        let q = unsafe { _mm512_loadu_si512(x.qs.as_ptr().cast()) };
        // 32 u16: the top 7 bits index KSIGNS_IQ2XS, computed per lane as in `ksigns8x32`
        let v = _mm512_srli_epi16::<9>(q);
        let p = _mm512_xor_si512(v, _mm512_srli_epi16::<4>(v));
        let p = _mm512_xor_si512(p, _mm512_srli_epi16::<2>(p));
        let p = _mm512_xor_si512(p, _mm512_srli_epi16::<1>(p));
        let sb = _mm512_or_si512(v, _mm512_slli_epi16::<7>(_mm512_and_si512(p, _mm512_set1_epi16(1))));
        let mut signs = [0u64; 4];
        // SAFETY: `signs` is 32 writable bytes; storeu has no alignment requirement.
        unsafe { _mm256_storeu_si256(signs.as_mut_ptr().cast(), _mm512_cvtepi16_epi8(sb)) };
        (odd16(nibbles8(u64::from_le_bytes(x.scales))), signs)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn iq2xs_grid(x: &BlockIQ2XS, j: usize) -> __m512i {
        // 8 u16: 9-bit grid index, 7-bit sign index
        let idx = _mm256_and_si256(_mm256_cvtepu16_epi32(ld16(&x.qs, 16 * j)), _mm256_set1_epi32(511));
        gather8(&IQ2XS_GRID, idx)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn iq2s_prep(x: &BlockIQ2S) -> (__m512i, [u64; 4]) {
        let signs = std::array::from_fn(|j| u64_at(&x.qs, QK_K / 8 + 8 * j));
        (odd16(nibbles8(u64::from_le_bytes(x.scales))), signs)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn iq2s_grid(x: &BlockIQ2S, j: usize) -> __m512i {
        let lo = _mm256_cvtepu8_epi32(_mm_set_epi64x(0, u64_at(&x.qs, 8 * j) as i64));
        // index 4ib + k takes bits 2k, 2k+1 of qh[ib]: lane m of the pair, bits 2m of qh[2j] | qh[2j+1] << 8
        let h = x.qh[2 * j] as i32 | (x.qh[2 * j + 1] as i32) << 8;
        let hi = _mm256_srlv_epi32(_mm256_set1_epi32(h), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
        let idx = _mm256_or_si256(lo, _mm256_slli_epi32::<8>(_mm256_and_si256(hi, _mm256_set1_epi32(3))));
        gather8(&IQ2S_GRID, idx)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn iq3xxs_prep(x: &BlockIQ3XXS) -> (__m512i, [u64; 4]) {
        // SAFETY: qs[64..96] is 32 readable bytes; loadu has no alignment requirement.
        let a = unsafe { _mm256_loadu_si256(x.qs[QK_K / 4..].as_ptr().cast()) };
        let s = _mm512_permutexvar_epi16(ld_i16x32(&XXS_GROUPS), _mm512_castsi256_si512(_mm256_srli_epi32::<28>(a)));
        (_mm512_add_epi16(_mm512_slli_epi16::<1>(s), _mm512_set1_epi16(1)), ksigns8x32(a))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn iq3xxs_grid(x: &BlockIQ3XXS, j: usize) -> __m512i {
        gather16(&IQ3XXS_GRID, _mm512_cvtepu8_epi32(ld16(&x.qs, 16 * j)))
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn iq3s_prep(x: &BlockIQ3S) -> (__m512i, [u64; 4]) {
        // sub-block ib: nibble ib%2 of scales[ib/2]; groups 2ib, 2ib + 1 share it
        let sub = nibbles8(u32::from_le_bytes(x.scales) as u64);
        (odd16(_mm_unpacklo_epi8(sub, sub)), std::array::from_fn(|j| u64_at(&x.signs, 8 * j)))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn iq3s_grid(x: &BlockIQ3S, j: usize) -> __m512i {
        let idx = _mm512_cvtepu8_epi32(ld16(&x.qs, 16 * j));
        // bit 8 of index 8ib + k is bit k of qh[ib]: lane m of the pair, bit m of the u16
        let h = x.qh[2 * j] as u16 | (x.qh[2 * j + 1] as u16) << 8;
        gather16(&IQ3S_GRID, _mm512_mask_or_epi32(idx, h, idx, _mm512_set1_epi32(256)))
    }

    macro_rules! kernel {
        ($name:ident, $B:ty, $prep:ident, $grid:ident) => {
            /// `iq23::dot` for R rows: per pair of sub-blocks the gathered magnitudes, the
            /// activation bytes negated where the sign bit is set (wrapping, as the AVX2 twin),
            /// `vpmaddubsw`, `vpmaddwd` by the groups' scales; the two halves of the 16 i32
            /// lanes fold into the 8 of `iq23::lanes`.
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
            pub(in super::super) fn $name<const R: usize>(w: [&[$B]; R], a: &[BlockQ8K]) -> [f32; R] {
                let perm: [__m512i; 4] = std::array::from_fn(|j| ld_i16x32(&PAIR_GROUPS[j]));
                let mut acc = [_mm256_setzero_ps(); R];
                for (i, y) in a.iter().enumerate() {
                    let dy = f32::from_le_bytes(y.d);
                    let qy: [__m512i; 4] = std::array::from_fn(|j| ld64i(&y.qs, 64 * j));
                    for r in 0..R {
                        let Some(x) = w[r].get(i) else { continue };
                        let (sc, signs) = $prep(x);
                        let mut sumi = _mm512_setzero_si512();
                        for (j, &q8) in qy.iter().enumerate() {
                            let q8s = _mm512_mask_sub_epi8(q8, signs[j], _mm512_setzero_si512(), q8);
                            let scv = _mm512_permutexvar_epi16(perm[j], sc);
                            let p = _mm512_madd_epi16(_mm512_maddubs_epi16($grid(x, j), q8s), scv);
                            sumi = _mm512_add_epi32(sumi, p);
                        }
                        let s8 = _mm256_add_epi32(_mm512_castsi512_si256(sumi), _mm512_extracti64x4_epi64::<1>(sumi));
                        let d = f16s(x.d) * dy;
                        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s8), acc[r]);
                    }
                }
                let mut out = [0f32; R];
                for r in 0..R {
                    out[r] = <$B as IqBlock>::FACTOR * hsum(acc[r]);
                }
                out
            }
        };
    }

    kernel!(iq2xxs, BlockIQ2XXS, iq2xxs_prep, iq2xxs_grid);
    kernel!(iq2xs, BlockIQ2XS, iq2xs_prep, iq2xs_grid);
    kernel!(iq2s, BlockIQ2S, iq2s_prep, iq2s_grid);
    kernel!(iq3xxs, BlockIQ3XXS, iq3xxs_prep, iq3xxs_grid);
    kernel!(iq3s, BlockIQ3S, iq3s_prep, iq3s_grid);

    /// 16 magnitudes (bytes 16c..16c+16 of `g`) as f32, exact.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn mags16<const C: i32>(g: __m512i) -> __m512 {
        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32::<C>(g)))
    }

    macro_rules! dequant {
        ($name:ident, $B:ty, $prep:ident, $grid:ident) => {
            /// One block -> 256 floats, the bits of `iq23::dequant`: per 16-element group
            /// `db = d * (2s + 1) * FACTOR` (the same exact products, all 16 in one register),
            /// then
            /// `db * magnitude` in 16 lanes and the sign bit xored in where the element's bit
            /// is set; the magnitudes and bits as the dot kernel decodes them.
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
            pub(in super::super) fn $name(b: &$B, y: &mut [f32; 256]) {
                let (sc, signs) = $prep(b);
                // db of the 16 groups in 16 lanes: (d * (2s + 1)) * FACTOR, exact
                let sc = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(sc)));
                let f = _mm512_set1_ps(<$B as IqBlock>::FACTOR);
                let db = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(f16s(b.d)), sc), f);
                let sign = _mm512_set1_epi32(i32::MIN);
                for (j, out) in y.chunks_exact_mut(64).enumerate() {
                    let g = $grid(b, j);
                    let m = [mags16::<0>(g), mags16::<1>(g), mags16::<2>(g), mags16::<3>(g)];
                    for (c, o) in out.chunks_exact_mut(16).enumerate() {
                        let db = _mm512_permutexvar_ps(_mm512_set1_epi32((4 * j + c) as i32), db);
                        let v = _mm512_castps_si512(_mm512_mul_ps(db, m[c]));
                        let v = _mm512_mask_xor_epi32(v, (signs[j] >> (16 * c)) as u16, v, sign);
                        let o = &mut o[..16];
                        // SAFETY: `o` is exactly 16 writable f32; storeu has no alignment
                        // requirement.
                        unsafe { _mm512_storeu_si512(o.as_mut_ptr().cast(), v) };
                    }
                }
            }
        };
    }

    dequant!(dq_iq2xxs, BlockIQ2XXS, iq2xxs_prep, iq2xxs_grid);
    dequant!(dq_iq2xs, BlockIQ2XS, iq2xs_prep, iq2xs_grid);
    dequant!(dq_iq2s, BlockIQ2S, iq2s_prep, iq2s_grid);
    dequant!(dq_iq3xxs, BlockIQ3XXS, iq3xxs_prep, iq3xxs_grid);
    dequant!(dq_iq3s, BlockIQ3S, iq3s_prep, iq3s_grid);
}

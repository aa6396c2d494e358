//! AVX-512 VNNI twin of `fastvec::row_scalar` (see fastvec.rs for the arithmetic). Per pair of
//! 32-element blocks: the 64 unsigned weight quants in one register, one `vpdpbusd` against the
//! unpacked activation quants started from the offset correction, one FMA with per-lane
//! (d_w · d_a) scales; lanes 0..8 carry the first block, 8..16 the second.

use super::QuantType;
use super::fastvec::Unpacked;

/// `false` (nothing written) when the CPU lacks the features; lengths checked by the caller.
pub(super) fn matvec(ty: QuantType, w: &[u8], rows: usize, cols: usize, u: &Unpacked, y: &mut [f32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if super::vecdot_avx512::available() {
            if matches!(ty, QuantType::Q4_1 | QuantType::Q5_1) {
                // The one-column case of the multi-column kernel: the same lane operations as
                // `imp::row` (bit for bit, tests/fastvec_multi.rs), 1.3-1.6x its speed
                // (examples/multivec_bench, k = 1) without its per-pair scale shuffles.
                let mut m = MultiCol::default();
                m.fill(u);
                return matvec_multi(ty, w, rows, cols, std::slice::from_ref(u), std::slice::from_ref(&m), y);
            }
            let rb = w.len() / rows;
            for (r, (o, row)) in y.iter_mut().zip(w.chunks_exact(rb)).enumerate() {
                super::vecdot_avx512::prefetch_ahead(w, r * rb, rb);
                // SAFETY: available() confirmed avx512f/bw/vl/vnni and f16c on this CPU.
                *o = unsafe { imp::row(ty, row, cols, u) };
            }
            return true;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (ty, w, rows, cols, u, y);
    false
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use super::super::QuantType;
    use super::super::fastvec::{Unpacked, geo, row_scalar};
    use std::arch::x86_64::*;

    /// [a x8, b x8] from lanes `ia`, `ib` of a 128-bit vector.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
    fn spread(v: __m128, ia: i32, ib: i32) -> __m512 {
        let idx = _mm512_set_epi32(ib, ib, ib, ib, ib, ib, ib, ib, ia, ia, ia, ia, ia, ia, ia, ia);
        // lanes 4..16 of the cast are undefined, but the permute reads lanes ia, ib < 4 only
        _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v))
    }

    /// Two blocks' 16 nibble bytes as 64 unsigned quants in element order:
    /// [b0 lo nibbles | b0 hi | b1 lo | b1 hi].
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
    fn nibbles(q0: __m128i, q1: __m128i) -> __m512i {
        let v = _mm512_inserti32x4::<1>(_mm512_castsi128_si512(q0), q0);
        let v = _mm512_inserti32x4::<3>(_mm512_inserti32x4::<2>(v, q1), q1);
        let hi = _mm512_srli_epi16::<4>(v);
        _mm512_and_si512(_mm512_mask_blend_epi64(0b1100_1100, v, hi), _mm512_set1_epi8(0x0F))
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
    fn ld16(s: &[u8]) -> __m128i {
        let s = &s[..16];
        // SAFETY: `s` is 16 readable bytes; no alignment needed.
        unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
    fn ld32(s: &[u8]) -> __m256i {
        let s = &s[..32];
        // SAFETY: `s` is 32 readable bytes; no alignment needed.
        unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
    }

    fn u16_at(s: &[u8], i: usize) -> u16 {
        u16::from_le_bytes([s[i], s[i + 1]])
    }

    fn u32_at(s: &[u8], i: usize) -> u32 {
        u32::from_le_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]])
    }

    /// One row. Pairs of blocks in SIMD; an odd last block by the scalar twin's formula.
    ///
    /// # Safety
    /// The CPU must support avx512f, avx512bw, avx512vl, avx512vnni and f16c. `row` holds whole
    /// blocks of `ty` for `cols` elements and `u` was filled for the same `cols` (checked by
    /// `fastvec::matvec_fast`; a mismatch panics on a bounds check, never reads out of bounds).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
    pub(super) unsafe fn row(ty: QuantType, row: &[u8], cols: usize, u: &Unpacked) -> f32 {
        let (bb, off, min) = geo(ty).expect("checked by the caller");
        let nb = cols / 32;
        let pairs = nb / 2;
        let shift = off.trailing_zeros(); // off is 0 (no correction), 8, 16 or 128
        let mut acc = _mm512_setzero_ps();
        let mut macc = _mm_setzero_ps();
        for p in 0..pairs {
            let (b0, b1) = (&row[2 * p * bb..(2 * p + 1) * bb], &row[(2 * p + 1) * bb..(2 * p + 2) * bb]);
            let wq = match ty {
                QuantType::Q4_0 => nibbles(ld16(&b0[2..]), ld16(&b1[2..])),
                QuantType::Q4_1 => nibbles(ld16(&b0[4..]), ld16(&b1[4..])),
                QuantType::Q5_0 | QuantType::Q5_1 => {
                    let (qh_at, qs_at) = if ty == QuantType::Q5_0 { (2, 6) } else { (4, 8) };
                    let v = nibbles(ld16(&b0[qs_at..]), ld16(&b1[qs_at..]));
                    let hb = u32_at(b0, qh_at) as u64 | (u32_at(b1, qh_at) as u64) << 32;
                    _mm512_mask_blend_epi8(hb, v, _mm512_or_si512(v, _mm512_set1_epi8(0x10)))
                }
                QuantType::Q8_0 => {
                    let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(ld32(&b0[2..])), ld32(&b1[2..]));
                    _mm512_xor_si512(v, _mm512_set1_epi8(-128))
                }
                _ => unreachable!("checked by geo"),
            };
            let aq = &u.q[p * 64..p * 64 + 64];
            // SAFETY: aq is 64 readable i8.
            let a = unsafe { _mm512_loadu_si512(aq.as_ptr().cast()) };
            let init = if off == 0 {
                _mm512_setzero_si512()
            } else {
                let s4 = &u.sum4[p * 16..p * 16 + 16];
                // SAFETY: s4 is 16 readable i32.
                let s = unsafe { _mm512_loadu_si512(s4.as_ptr().cast()) };
                _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_sll_epi32(s, _mm_cvtsi32_si128(shift as i32)))
            };
            let isum = _mm512_dpbusd_epi32(init, wq, a);
            // [d0, m0, d1, m1] (min types) or [d0, d1, ..]: one F16C convert for both blocks.
            let (dw, lanes) = if min {
                let dm = _mm_set_epi32(0, 0, u32_at(b1, 0) as i32, u32_at(b0, 0) as i32);
                (_mm_cvtph_ps(dm), (0, 2))
            } else {
                let d = _mm_cvtsi32_si128((u16_at(b0, 0) as u32 | (u16_at(b1, 0) as u32) << 16) as i32);
                (_mm_cvtph_ps(d), (0, 1))
            };
            let da = _mm_set_ps(0.0, u.d[2 * p + 1], 0.0, u.d[2 * p]);
            let da = if min { da } else { _mm_set_ps(0.0, 0.0, u.d[2 * p + 1], u.d[2 * p]) };
            let scale = _mm_mul_ps(dw, da);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), spread(scale, lanes.0, lanes.1), acc);
            if min {
                // lanes 1, 3 of dw are m0, m1; s0, s1 in the same lanes
                let s = _mm_set_ps(u.s[2 * p + 1], 0.0, u.s[2 * p], 0.0);
                macc = _mm_fmadd_ps(dw, s, macc);
            }
        }
        let mut r = _mm512_reduce_add_ps(acc);
        let mut m = [0f32; 4];
        // SAFETY: m holds 4 f32.
        unsafe { _mm_storeu_ps(m.as_mut_ptr(), macc) };
        r += m[1] + m[3];
        if nb % 2 == 1 {
            // The odd last block: the scalar twin's terms over a one-block row.
            let last = Unpacked {
                q: u.q[(nb - 1) * 32..nb * 32].to_vec(),
                d: vec![u.d[nb - 1]],
                sum4: u.sum4[(nb - 1) * 8..nb * 8].to_vec(),
                s: if min { vec![u.s[nb - 1]] } else { Vec::new() },
            };
            r += row_scalar(ty, &row[(nb - 1) * bb..nb * bb], &last);
        }
        r
    }

    /// `K` columns of one Q4_1 (T = 0) / Q5_1 (T = 1) row: per block pair the weight quants and
    /// `[d0, m0, d1, m1]` are unpacked once; per column the very lane operations of `row` (the
    /// `vpdpbusd`, the convert, `d_w · d_a` per lane, the FMA, the min lanes' FMA, the same
    /// final reduction and odd-block term), so `out[j]` equals `row(ty, row, cols, &us[j])`
    /// bit for bit.
    ///
    /// # Safety
    /// As `row`; `us`, `ms` and `out` hold `K` columns, `ms[j]` filled from `us[j]`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
    pub(super) unsafe fn row_multi<const K: usize, const T: u8>(
        row: &[u8],
        cols: usize,
        us: &[Unpacked],
        ms: &[super::MultiCol],
        out: &mut [f32],
    ) {
        let ty = if T == 0 { QuantType::Q4_1 } else { QuantType::Q5_1 };
        let (bb, _, _) = geo(ty).expect("a min type");
        let nb = cols / 32;
        let pairs = nb / 2;
        assert!(us.len() == K && ms.len() == K && out.len() == K, "row_multi: {K} columns");
        for (u, m) in us.iter().zip(ms) {
            assert!(
                u.q.len() >= pairs * 64 && m.da16.len() >= pairs * 16 && m.s4.len() >= pairs * 4,
                "activation shorter than the row"
            );
        }
        let mut acc = [_mm512_setzero_ps(); K];
        let mut macc = [_mm_setzero_ps(); K];
        for p in 0..pairs {
            let (b0, b1) = (&row[2 * p * bb..(2 * p + 1) * bb], &row[(2 * p + 1) * bb..(2 * p + 2) * bb]);
            let wq = if T == 0 {
                nibbles(ld16(&b0[4..]), ld16(&b1[4..]))
            } else {
                let v = nibbles(ld16(&b0[8..]), ld16(&b1[8..]));
                let hb = u32_at(b0, 4) as u64 | (u32_at(b1, 4) as u64) << 32;
                _mm512_mask_blend_epi8(hb, v, _mm512_or_si512(v, _mm512_set1_epi8(0x10)))
            };
            let dw = _mm_cvtph_ps(_mm_set_epi32(0, 0, u32_at(b1, 0) as i32, u32_at(b0, 0) as i32));
            let dw16 = spread(dw, 0, 2);
            for j in 0..K {
                let (u, m) = (&us[j], &ms[j]);
                // SAFETY: q has >= 64·pairs i8, da16 >= 16·pairs and s4 >= 4·pairs f32 (asserted).
                let (a, da, s) = unsafe {
                    (
                        _mm512_loadu_si512(u.q.as_ptr().add(64 * p).cast()),
                        _mm512_loadu_ps(m.da16.as_ptr().add(16 * p)),
                        _mm_loadu_ps(m.s4.as_ptr().add(4 * p)),
                    )
                };
                let isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq, a);
                // lane for lane `row`'s spread(dw · da): the same products
                acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw16, da), acc[j]);
                macc[j] = _mm_fmadd_ps(dw, s, macc[j]);
            }
        }
        for j in 0..K {
            let mut r = _mm512_reduce_add_ps(acc[j]);
            let mut m = [0f32; 4];
            // SAFETY: m holds 4 f32.
            unsafe { _mm_storeu_ps(m.as_mut_ptr(), macc[j]) };
            r += m[1] + m[3];
            if nb % 2 == 1 {
                let u = &us[j];
                let last = Unpacked {
                    q: u.q[(nb - 1) * 32..nb * 32].to_vec(),
                    d: vec![u.d[nb - 1]],
                    sum4: u.sum4[(nb - 1) * 8..nb * 8].to_vec(),
                    s: vec![u.s[nb - 1]],
                };
                r += row_scalar(ty, &row[(nb - 1) * bb..nb * bb], &last);
            }
            out[j] = r;
        }
    }
}

/// Per column of a multi-column call, `Unpacked`'s scales laid out for `imp::row_multi`: per
/// block pair `[d_a,0 x8, d_a,1 x8]` and `[0, s0, 0, s1]`.
#[derive(Default)]
pub(super) struct MultiCol {
    da16: Vec<f32>,
    s4: Vec<f32>,
}

impl MultiCol {
    pub(super) fn fill(&mut self, u: &Unpacked) {
        self.da16.clear();
        self.s4.clear();
        for (d, s) in u.d.chunks_exact(2).zip(u.s.chunks_exact(2)) {
            self.da16.extend([d[0]; 8]);
            self.da16.extend([d[1]; 8]);
            self.s4.extend([0.0, s[0], 0.0, s[1]]);
        }
    }
}

/// Columns per pass over a row of `matvec_multi`.
pub(super) const MULTI_MAX: usize = 8;

/// `y[r, j]` for the k columns `us` / `ms` (y: [rows, k]) of a Q4_1 / Q5_1 matrix, each column
/// bit-identical to `matvec` on it alone; `false` (nothing written) without the CPU features.
pub(super) fn matvec_multi(
    ty: QuantType,
    w: &[u8],
    rows: usize,
    cols: usize,
    us: &[Unpacked],
    ms: &[MultiCol],
    y: &mut [f32],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if super::vecdot_avx512::available() && rows > 0 && !us.is_empty() && matches!(ty, QuantType::Q4_1 | QuantType::Q5_1) {
            let (rb, k) = (w.len() / rows, us.len());
            for (r, (yr, row)) in y.chunks_exact_mut(k).zip(w.chunks_exact(rb)).enumerate() {
                super::vecdot_avx512::prefetch_ahead(w, r * rb, rb);
                for (j0, (us, ms)) in us.chunks(MULTI_MAX).zip(ms.chunks(MULTI_MAX)).enumerate() {
                    let out = &mut yr[j0 * MULTI_MAX..][..us.len()];
                    macro_rules! go {
                        ($T:literal) => {
                            match us.len() {
                                1 => imp::row_multi::<1, $T>(row, cols, us, ms, out),
                                2 => imp::row_multi::<2, $T>(row, cols, us, ms, out),
                                3 => imp::row_multi::<3, $T>(row, cols, us, ms, out),
                                4 => imp::row_multi::<4, $T>(row, cols, us, ms, out),
                                5 => imp::row_multi::<5, $T>(row, cols, us, ms, out),
                                6 => imp::row_multi::<6, $T>(row, cols, us, ms, out),
                                7 => imp::row_multi::<7, $T>(row, cols, us, ms, out),
                                _ => imp::row_multi::<8, $T>(row, cols, us, ms, out),
                            }
                        };
                    }
                    // SAFETY: available() confirmed avx512f/bw/vl/vnni and f16c on this CPU.
                    unsafe { if ty == QuantType::Q4_1 { go!(0) } else { go!(1) } }
                }
            }
            return true;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (ty, w, rows, cols, us, ms, y);
    false
}

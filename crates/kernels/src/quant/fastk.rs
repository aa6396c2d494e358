//! Decode matvec in cortiq's own float order (`Numerics::Fast`) for Q4_K, the bulk of every
//! Q4_K_M file: `y[r] = W[r] · x̃` with x̃ the Q8_K activation row.
//!
//! Why beside `vecdot::matvec_q`: that kernel reproduces ggml's order with 256-bit
//! `maddubs`/`madd` steps and one horizontal scale/min pass per block; on this machine it
//! streamed Q4_K at ~38 GB/s in decode while Q6_K ran at ~54 GB/s — compute-bound. Here the
//! activation row is unpacked once per call (quants permuted into the weights' nibble order,
//! per-sub-block sums), then each 256-weight block takes two 512-bit loads, four
//! `vpmaddubsw` + `vpdpwssd` pairs (the 6-bit scales applied inside the accumulation) and one
//! FMA. (Four `vpdpbusd` and four 32-bit lane multiplies before: the same exact integers.)
//!
//! Arithmetic, defined lane by lane so the scalar twin reproduces the SIMD one bit for bit:
//! the block's 128 quant bytes in two halves c = 0, 1 of 64; in half c the low nibbles hold
//! sub-blocks 4c (bytes 0..32) and 4c+2 (32..64), the high nibbles 4c+1 and 4c+3. Lane l of 16
//! covers elements 4(l mod 8)..+4 of one sub-block in each of the four (half, nibble) groups,
//! so its exact integer is `s_l = Σ_groups sc[sb]·Σ_4 q·a`. Then per block
//! `acc_l = fma(f32(s_l), d_a·d_w, acc_l)` (16 lanes) and
//! `accm_k = fma(f32(m_k·Σa_k), d_a·dmin_w, accm_k)` (8 lanes, one per sub-block); the row's
//! value is `tree16(acc) − tree8(accm)` with a fixed pairwise reduction.
//!
//! `matvec_q4k_multi` runs k activation rows (continuous batching, speculative verification)
//! through one pass over the weights: the block's nibbles, scales and mins are loaded and
//! unpacked once for up to 8 columns, and each column then takes exactly the per-lane operations
//! above, so each column is bit-identical to the single-row kernel whatever runs beside it. The
//! per-column work (four `vpmaddubsw` + `vpdpwssd`, the min lanes' multiply, two FMAs) stays:
//! measured 1.85x the products per second of k single calls at k = 8 (examples/multivec_bench;
//! 1.56x with `vpdpbusd` + `vpmulld`), not k x.

use super::blocks::{BlockQ4K, BlockQ8K, QK_K, f16_soft};
use super::dequant::k4_scale_min;

/// Sub-block order of the permuted activation quants: per half c, the sub-blocks the low
/// nibbles (two 32-byte groups) then the high nibbles of that half hold.
const SB_ORDER: [usize; 8] = [0, 2, 1, 3, 4, 6, 5, 7];

/// The Q8_K activation row unpacked: per block its f32 scale, its 256 quants permuted into
/// `SB_ORDER` (32 per sub-block), and its 8 sub-block sums.
#[derive(Default)]
pub struct ActK {
    pub(super) d: Vec<f32>,
    pub(super) q: Vec<i8>,
    pub(super) sums: Vec<i32>,
}

impl ActK {
    /// From `nb` Q8_K blocks (`a`: their bytes back to back).
    pub(super) fn fill(&mut self, a: &[u8], nb: usize) {
        let bb = std::mem::size_of::<BlockQ8K>();
        self.d.clear();
        self.q.clear();
        self.sums.clear();
        for blk in a.chunks_exact(bb).take(nb) {
            self.d.push(f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]));
            let qs = &blk[4..4 + QK_K];
            for &sb in &SB_ORDER {
                self.q.extend(qs[32 * sb..32 * sb + 32].iter().map(|&b| b as i8));
            }
            for sb in 0..8 {
                self.sums.push(qs[32 * sb..32 * sb + 32].iter().map(|&b| b as i8 as i32).sum());
            }
        }
    }
}

/// Fixed pairwise reductions shared by both twins.
#[inline(always)]
pub(super) fn tree16(v: [f32; 16]) -> f32 {
    let mut a = [0f32; 8];
    for i in 0..8 {
        a[i] = v[i] + v[i + 8];
    }
    tree8(a)
}

#[inline(always)]
pub(super) fn tree8(a: [f32; 8]) -> f32 {
    let b: [f32; 4] = std::array::from_fn(|i| a[i] + a[i + 4]);
    let c = [b[0] + b[2], b[1] + b[3]];
    c[0] + c[1]
}

/// Scalar twin of one Q4_K row (`row`: whole blocks; `u` from the matching activation).
pub(super) fn row_scalar(row: &[u8], u: &ActK) -> f32 {
    let bb = std::mem::size_of::<BlockQ4K>();
    let mut acc = [0f32; 16];
    let mut accm = [0f32; 8];
    for (b, blk) in row.chunks_exact(bb).enumerate() {
        let dw = f16_soft([blk[0], blk[1]]);
        let dmin = f16_soft([blk[2], blk[3]]);
        let scales: &[u8; 12] = blk[4..16].try_into().expect("12 scale bytes");
        let (sc, mn) = k4_scale_min(scales);
        let qs = &blk[16..16 + QK_K / 2];
        let aq = &u.q[b * QK_K..(b + 1) * QK_K];
        let mut s = [0i32; 16];
        for c in 0..2 {
            let half = &qs[64 * c..64 * c + 64];
            for (g, nib) in [(0usize, 0u32), (1, 4)] {
                // group (c, nibble): activation bytes 128c + 64g .., sub-blocks per lane half
                let act = &aq[128 * c + 64 * g..128 * c + 64 * g + 64];
                for (l, sl) in s.iter_mut().enumerate() {
                    let sb = SB_ORDER[4 * c + 2 * g + l / 8];
                    let mut dot = 0i32;
                    for e in 4 * l..4 * l + 4 {
                        dot += ((half[e] >> nib) & 0xF) as i32 * act[e] as i32;
                    }
                    *sl += sc[sb] as i32 * dot;
                }
            }
        }
        let (dd, dm) = (u.d[b] * dw, u.d[b] * dmin);
        for (a, &sl) in acc.iter_mut().zip(&s) {
            *a = (sl as f32).mul_add(dd, *a);
        }
        for (k, a) in accm.iter_mut().enumerate() {
            *a = ((mn[k] as i32 * u.sums[b * 8 + k]) as f32).mul_add(dm, *a);
        }
    }
    tree16(acc) - tree8(accm)
}

thread_local! {
    static ACT: std::cell::RefCell<ActK> = std::cell::RefCell::new(ActK::default());
}

/// `y[r] = W[r] · x̃` for `rows` Q4_K rows of `cols` elements back to back and one Q8_K
/// activation row (lengths checked by `fastvec::matvec_fast`). AVX-512 VNNI when available.
pub(super) fn matvec_q4k(w: &[u8], rows: usize, cols: usize, act: &[u8], y: &mut [f32]) {
    ACT.with(|u| {
        let mut u = u.borrow_mut();
        u.fill(act, cols / QK_K);
        if !avx512::matvec(w, rows, &u, y) {
            matvec_q4k_rows_scalar(w, rows, &u, y);
        }
    });
}

/// The scalar twin of `matvec_q4k`.
pub(super) fn matvec_q4k_scalar(w: &[u8], rows: usize, cols: usize, act: &[u8], y: &mut [f32]) {
    let mut u = ActK::default();
    u.fill(act, cols / QK_K);
    matvec_q4k_rows_scalar(w, rows, &u, y);
}

fn matvec_q4k_rows_scalar(w: &[u8], rows: usize, u: &ActK, y: &mut [f32]) {
    if rows == 0 {
        return;
    }
    let rb = w.len() / rows;
    for (o, row) in y.iter_mut().zip(w.chunks_exact(rb)) {
        *o = row_scalar(row, u);
    }
}

/// Columns of a multi-column call handled per pass over the weights: the AVX-512 kernel keeps
/// one 16-lane and one 8-lane accumulator per column in registers (8 columns: 16 of the 32).
pub(super) const MULTI_MAX: usize = 8;

thread_local! {
    static ACTS: std::cell::RefCell<Vec<ActK>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `y[r, j] = W[r] · x̃_j` for `k` Q8_K activation rows (`acts`: [k, act row bytes]) and `rows`
/// Q4_K rows: each weight block is read once for up to `MULTI_MAX` columns, and every column's
/// value is computed exactly as `matvec_q4k` computes it alone (same lanes, same order), so
/// `y[.., j]` is bit-identical to the single-column call whatever `k` is. y: [rows, k]
pub(super) fn matvec_q4k_multi(w: &[u8], rows: usize, cols: usize, acts: &[u8], k: usize, y: &mut [f32]) {
    let ab = acts.len() / k.max(1);
    ACTS.with(|us| {
        let mut us = us.borrow_mut();
        us.resize_with(k, ActK::default);
        for (u, a) in us.iter_mut().zip(acts.chunks_exact(ab.max(1))) {
            u.fill(a, cols / QK_K);
        }
        if !avx512::matvec_multi(w, rows, &us[..k], y) {
            multi_rows_scalar(w, rows, &us[..k], y);
        }
    });
}

/// The scalar twin of `matvec_q4k_multi`: `row_scalar` per (row, column).
pub(super) fn matvec_q4k_multi_scalar(w: &[u8], rows: usize, cols: usize, acts: &[u8], k: usize, y: &mut [f32]) {
    let ab = acts.len() / k.max(1);
    let us: Vec<ActK> = acts
        .chunks_exact(ab.max(1))
        .take(k)
        .map(|a| {
            let mut u = ActK::default();
            u.fill(a, cols / QK_K);
            u
        })
        .collect();
    multi_rows_scalar(w, rows, &us, y);
}

fn multi_rows_scalar(w: &[u8], rows: usize, us: &[ActK], y: &mut [f32]) {
    if rows == 0 || us.is_empty() {
        return;
    }
    let rb = w.len() / rows;
    for (yr, row) in y.chunks_exact_mut(us.len()).zip(w.chunks_exact(rb)) {
        for (o, u) in yr.iter_mut().zip(us) {
            *o = row_scalar(row, u);
        }
    }
}

mod avx512 {
    use super::ActK;

    /// `false` (nothing written) when the CPU lacks the features; lengths checked by the caller.
    pub(super) fn matvec(w: &[u8], rows: usize, u: &ActK, y: &mut [f32]) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            if super::super::vecdot_avx512::available() && rows > 0 {
                let rb = w.len() / rows;
                for (r, (o, row)) in y.iter_mut().zip(w.chunks_exact(rb)).enumerate() {
                    super::super::vecdot_avx512::prefetch_ahead(w, r * rb, rb);
                    // SAFETY: available() confirmed avx512f/bw/vl/vnni and f16c on this CPU.
                    *o = unsafe { imp::row(row, u) };
                }
                return true;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (w, rows, u, y);
        false
    }

    /// `false` (nothing written) when the CPU lacks the features. y: [rows, us.len()]
    pub(super) fn matvec_multi(w: &[u8], rows: usize, us: &[ActK], y: &mut [f32]) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            if super::super::vecdot_avx512::available() && rows > 0 && !us.is_empty() {
                let (rb, k) = (w.len() / rows, us.len());
                for (r, (yr, row)) in y.chunks_exact_mut(k).zip(w.chunks_exact(rb)).enumerate() {
                    super::super::vecdot_avx512::prefetch_ahead(w, r * rb, rb);
                    for (j0, us) in us.chunks(super::MULTI_MAX).enumerate() {
                        let out = &mut yr[j0 * super::MULTI_MAX..][..us.len()];
                        // SAFETY: available() confirmed avx512f/bw/vl/vnni and f16c on this CPU.
                        unsafe {
                            match us.len() {
                                1 => imp::row_multi::<1>(row, us, out),
                                2 => imp::row_multi::<2>(row, us, out),
                                3 => imp::row_multi::<3>(row, us, out),
                                4 => imp::row_multi::<4>(row, us, out),
                                5 => imp::row_multi::<5>(row, us, out),
                                6 => imp::row_multi::<6>(row, us, out),
                                7 => imp::row_multi::<7>(row, us, out),
                                _ => imp::row_multi::<8>(row, us, out),
                            }
                        }
                    }
                }
                return true;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (w, rows, us, y);
        false
    }

    #[cfg(target_arch = "x86_64")]
    mod imp {
        use super::super::super::blocks::{BlockQ4K, QK_K};
        use super::super::{ActK, tree8, tree16};
        use std::arch::x86_64::*;

        /// The 6-bit scales and mins of a Q4_K block as two little-endian u64 of 8 bytes each
        /// (the bytes of `dequant::k4_scale_min`), with 32-bit word operations instead of 16
        /// byte extractions: the byte version was half of this kernel's time.
        #[inline(always)]
        fn scale_min_words(b: &[u8; 12]) -> (u64, u64) {
            let w = |i: usize| u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
            let (w0, w1, w2) = (w(0), w(1), w(2));
            const M6: u32 = 0x3f3f_3f3f;
            const M4: u32 = 0x0f0f_0f0f;
            const M2: u32 = 0x0303_0303;
            let sc_lo = w0 & M6;
            let sc_hi = (w2 & M4) | (((w0 >> 6) & M2) << 4);
            let mn_lo = w1 & M6;
            let mn_hi = ((w2 >> 4) & M4) | (((w1 >> 6) & M2) << 4);
            (sc_lo as u64 | (sc_hi as u64) << 32, mn_lo as u64 | (mn_hi as u64) << 32)
        }

        /// One row; see the module header for the lane layout.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
        pub(super) fn row(row: &[u8], u: &ActK) -> f32 {
            let bb = std::mem::size_of::<BlockQ4K>();
            let nb = row.len() / bb;
            assert!(u.d.len() >= nb && u.q.len() >= nb * QK_K && u.sums.len() >= nb * 8, "activation shorter than the row");
            let m4 = _mm512_set1_epi8(0x0F);
            // Lane l of group g (0..4 = (c, nibble)) uses sub-block SB_ORDER[2g + l/8]: as
            // indices into the 8 scales.
            let idx: [__m512i; 4] = std::array::from_fn(|g| {
                let (a, b) = (super::super::SB_ORDER[2 * g] as i32, super::super::SB_ORDER[2 * g + 1] as i32);
                _mm512_set_epi32(b, b, b, b, b, b, b, b, a, a, a, a, a, a, a, a)
            });
            let mut acc = _mm512_setzero_ps();
            let mut accm = _mm256_setzero_ps();
            for b in 0..nb {
                let blk = &row[b * bb..(b + 1) * bb];
                // d and dmin together: one F16C convert.
                let dd2 = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]])));
                let (dw, dmin) = (_mm_cvtss_f32(dd2), _mm_cvtss_f32(_mm_movehdup_ps(dd2)));
                let (sc, mn) = scale_min_words(blk[4..16].try_into().expect("12 scale bytes"));
                let sc32 = _mm512_cvtepu8_epi32(_mm_cvtsi64_si128(sc as i64));
                let qs = &blk[16..16 + QK_K / 2];
                let aq = &u.q[b * QK_K..(b + 1) * QK_K];
                // Lane integers sc · Σ4 q·a per group as `vpmaddubsw` pairs (|q·a + q·a| <=
                // 2·15·127: no saturation) into `vpdpwssd` with the scale in both i16 halves of
                // each lane: exact, the same integers as `vpdpbusd` + `vpmulld`, one op fewer.
                // SAFETY: qs has 128 bytes and aq 256, so the 64-byte loads at 0/64 and
                // 0/64/128/192 are in bounds; unaligned loads.
                let s = unsafe {
                    let mut s = _mm512_setzero_si512();
                    for c in 0..2 {
                        let bits = _mm512_loadu_si512(qs.as_ptr().add(64 * c).cast());
                        let lo = _mm512_and_si512(bits, m4);
                        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(bits), m4);
                        for (g, q) in [(0, lo), (1, hi)] {
                            let a = _mm512_loadu_si512(aq.as_ptr().add(128 * c + 64 * g).cast());
                            let scl = _mm512_permutexvar_epi32(idx[2 * c + g], sc32);
                            let scl = _mm512_or_si512(scl, _mm512_slli_epi32::<16>(scl));
                            s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(q, a), scl);
                        }
                    }
                    s
                };
                let (dd, dm) = (u.d[b] * dw, u.d[b] * dmin);
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(dd), acc);
                // SAFETY: mn has 8 bytes, sums[b*8..b*8+8] is in bounds (asserted above).
                let mm = unsafe {
                    let m32 = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(mn as i64));
                    let s32 = _mm256_loadu_si256(u.sums.as_ptr().add(b * 8).cast());
                    _mm256_mullo_epi32(m32, s32)
                };
                accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mm), _mm256_set1_ps(dm), accm);
            }
            let mut a = [0f32; 16];
            let mut m = [0f32; 8];
            // SAFETY: a holds 16 f32 and m 8; unaligned stores.
            unsafe {
                _mm512_storeu_ps(a.as_mut_ptr(), acc);
                _mm256_storeu_ps(m.as_mut_ptr(), accm);
            }
            tree16(a) - tree8(m)
        }

        /// `K` columns of one row, each weight block loaded and unpacked once: per column the
        /// very operations of `row` in the same order (integer block sums, then the two FMAs),
        /// so `out[j]` equals `row(row, &us[j])` bit for bit. `us.len() == K == out.len()`.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
        pub(super) fn row_multi<const K: usize>(row: &[u8], us: &[ActK], out: &mut [f32]) {
            let bb = std::mem::size_of::<BlockQ4K>();
            let nb = row.len() / bb;
            assert!(us.len() == K && out.len() == K, "row_multi: {K} columns");
            for u in us {
                assert!(u.d.len() >= nb && u.q.len() >= nb * QK_K && u.sums.len() >= nb * 8, "activation shorter than the row");
            }
            let m4 = _mm512_set1_epi8(0x0F);
            let idx: [__m512i; 4] = std::array::from_fn(|g| {
                let (a, b) = (super::super::SB_ORDER[2 * g] as i32, super::super::SB_ORDER[2 * g + 1] as i32);
                _mm512_set_epi32(b, b, b, b, b, b, b, b, a, a, a, a, a, a, a, a)
            });
            let mut acc = [_mm512_setzero_ps(); K];
            let mut accm = [_mm256_setzero_ps(); K];
            for b in 0..nb {
                let blk = &row[b * bb..(b + 1) * bb];
                let dd2 = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]])));
                let (dw, dmin) = (_mm_cvtss_f32(dd2), _mm_cvtss_f32(_mm_movehdup_ps(dd2)));
                let (sc, mn) = scale_min_words(blk[4..16].try_into().expect("12 scale bytes"));
                let sc32 = _mm512_cvtepu8_epi32(_mm_cvtsi64_si128(sc as i64));
                let m32 = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(mn as i64));
                let (dwv, dminv) = (_mm512_set1_ps(dw), _mm256_set1_ps(dmin));
                let qs = &blk[16..16 + QK_K / 2];
                // The block's nibbles and their scales, shared by every column: [c][g]; each
                // 32-bit scale lane as two equal i16 halves for `vpdpwssd`.
                // SAFETY: qs has 128 bytes, so the 64-byte loads at 0 and 64 are in bounds.
                let (q, scl): ([__m512i; 4], [__m512i; 4]) = unsafe {
                    let b0 = _mm512_loadu_si512(qs.as_ptr().cast());
                    let b1 = _mm512_loadu_si512(qs.as_ptr().add(64).cast());
                    (
                        [
                            _mm512_and_si512(b0, m4),
                            _mm512_and_si512(_mm512_srli_epi16::<4>(b0), m4),
                            _mm512_and_si512(b1, m4),
                            _mm512_and_si512(_mm512_srli_epi16::<4>(b1), m4),
                        ],
                        std::array::from_fn(|i| {
                            let v = _mm512_permutexvar_epi32(idx[i], sc32);
                            _mm512_or_si512(v, _mm512_slli_epi32::<16>(v))
                        }),
                    )
                };
                for j in 0..K {
                    let u = &us[j];
                    let aq = &u.q[b * QK_K..(b + 1) * QK_K];
                    // The same exact lane integers as `row` (sc · Σ4 q·a per group) with two
                    // instructions per group instead of three: `vpmaddubsw` pairs (|q·a + q·a| <=
                    // 2·15·127, no saturation), then `vpdpwssd` multiplies both by the scale and
                    // accumulates.
                    // SAFETY: aq has 256 bytes: the 64-byte loads at 0/64/128/192 are in bounds.
                    let s = unsafe {
                        let mut s = _mm512_setzero_si512();
                        for (i, (&qi, &si)) in q.iter().zip(&scl).enumerate() {
                            let a = _mm512_loadu_si512(aq.as_ptr().add(64 * i).cast());
                            s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(qi, a), si);
                        }
                        s
                    };
                    // d_a · d_w and d_a · dmin_w lane-wise from the shared broadcasts (the same
                    // products as `row`'s scalar ones; one vector multiply with a broadcast load
                    // each instead of a scalar multiply and a broadcast)
                    let da = u.d[b];
                    let (dd, dm) = (_mm512_mul_ps(_mm512_set1_ps(da), dwv), _mm256_mul_ps(_mm256_set1_ps(da), dminv));
                    acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), dd, acc[j]);
                    // SAFETY: sums[b*8..b*8+8] is in bounds (asserted above).
                    let mm = unsafe {
                        let s32 = _mm256_loadu_si256(u.sums.as_ptr().add(b * 8).cast());
                        _mm256_mullo_epi32(m32, s32)
                    };
                    accm[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mm), dm, accm[j]);
                }
            }
            for j in 0..K {
                let mut a = [0f32; 16];
                let mut m = [0f32; 8];
                // SAFETY: a holds 16 f32 and m 8; unaligned stores.
                unsafe {
                    _mm512_storeu_ps(a.as_mut_ptr(), acc[j]);
                    _mm256_storeu_ps(m.as_mut_ptr(), accm[j]);
                }
                out[j] = tree16(a) - tree8(m);
            }
        }
    }
}

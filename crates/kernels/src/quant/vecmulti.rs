//! Multi-column decode matvec in ggml's vec_dot order for the weight types `matvec_fast` leaves
//! to `vecdot::matvec_q`: Q8_0, Q4_0, Q5_0 and Q6_K. `y[r, j] = W[r] · x̃_j` for k activation
//! rows, each weight block read and unpacked once for up to `MULTI_MAX` columns. Qwen2.5-0.5B's
//! Q4_K_M file is mostly these: Q5_0 for every 896-column matrix (44% of its weight bytes), Q8_0
//! for the output matrix (37%), Q6_K for half of the FFN down projections. The engine's fast
//! decode runs Q4_0 / Q5_0 / Q8_0 matrices in the interleaved layout instead (`quant::ileave`,
//! 1.3-2.7x these kernels); the row-major ones here serve Q6_K and any matrix left row-major.
//!
//! Contract: every column is bit-identical to `vecdot::matvec_q` on that activation row alone,
//! whatever k and the other columns are. That kernel's float order per row: per block b the
//! exact i32 lanes p_b[0..8] (lane l sums the elements with (e mod 32) / 4 == l; Q6_K subtracts
//! its -32 offset as 32·(bs[2l]·sc[2l] + bs[2l+1]·sc[2l+1]), a partition by 16-element group,
//! as ggml does), then `acc[l] = fma(d_w,b · d_a,b, f32(p_b[l]), acc[l])` block after block and
//! `hsum8(acc)`. Integers are exact whichever instructions produce them, so the lanes are
//! computed here the cheapest way for many columns, and the float steps are the same per column:
//! - Q8_0/Q4_0/Q5_0: the weight quants as unsigned bytes u = q + off (off 128 / 8 / 16),
//!   unpacked once per block into both halves of a 512-bit register; the columns go in pairs,
//!   their activations interleaved per block at unpack time (lanes 0..8 column 2i, 8..16
//!   column 2i+1), so one `vpdpbusd` from the precomputed `-off · Σ4 a` lanes, one convert, one
//!   multiply (dx · dy) and one FMA serve two columns' block step.
//! - Q6_K: the 6-bit quants (0..63) and the scales as i16 lanes unpacked once per block; per
//!   column four `vpmaddubsw` + `vpdpwssd` (the scale step fused into the accumulation), one
//!   `vpdpwssd` for the offset term, a fold of 16 lanes to 8, one convert and one FMA.
//!
//! The scalar twin (`matvec_multi_scalar`) unpacks each weight block once too and runs
//! `vecdot`'s own lane and FMA helpers per column; both twins agree with `vec_dot_scalar` bit
//! for bit (tests/fastvec_multi.rs).

use super::QuantType;
use super::blocks::{BlockQ6K, BlockQ8_0, BlockQ8K, QK, view};
use super::vecdot::{fma_lanes, h16, high_bits, hsum8, lanes32, nibbles, q6k_lanes_of, q6k_quants, q8k_d};

/// Columns per pass over a row: one 8-lane accumulator per column lives in a register.
pub(super) const MULTI_MAX: usize = 8;

/// Whether this module has a multi-column kernel for `ty` (in ggml's order).
pub(super) fn supported(ty: QuantType) -> bool {
    matches!(ty, QuantType::Q8_0 | QuantType::Q4_0 | QuantType::Q5_0 | QuantType::Q6K)
}

/// (weight block bytes, unsigned offset) of the 32-element types.
fn legacy_geo(ty: QuantType) -> Option<(usize, i32)> {
    match ty {
        QuantType::Q8_0 => Some((34, 128)),
        QuantType::Q4_0 => Some((18, 8)),
        QuantType::Q5_0 => Some((22, 16)),
        _ => None,
    }
}

/// Two Q8_0 activation rows (a column pair) unpacked for the SIMD legacy kernel, interleaved
/// per block so that one 512-bit register holds block b of both columns (lanes 0..8 the first,
/// 8..16 the second): per block 32 + 32 quants, the per-lane (4 quants) offset terms
/// `-off · Σ4 a` and each column's f32 scale repeated for its 8 lanes. A pair's missing second
/// column is all zeros (its lanes compute 0 and are dropped).
#[derive(Default)]
pub struct Pair32 {
    q: Vec<i8>,
    bias: Vec<i32>,
    d: Vec<f32>,
}

impl Pair32 {
    fn fill(&mut self, a0: &[u8], a1: Option<&[u8]>, nb: usize, off: i32) {
        self.q.clear();
        self.bias.clear();
        self.d.clear();
        let zero = BlockQ8_0 { d: [0; 2], qs: [0; QK] };
        let c0 = view::<BlockQ8_0>(&a0[..nb * 34]);
        let c1 = a1.map(|a| view::<BlockQ8_0>(&a[..nb * 34]));
        for b in 0..nb {
            let ys = [&c0[b], c1.map_or(&zero, |c| &c[b])];
            for y in ys {
                self.q.extend_from_slice(&y.qs);
            }
            for y in ys {
                self.bias.extend(y.qs.chunks_exact(4).map(|c| -off * c.iter().map(|&v| v as i32).sum::<i32>()));
            }
            for y in ys {
                self.d.extend([h16(y.d); 8]);
            }
        }
    }
}

thread_local! {
    static PAIRS: std::cell::RefCell<Vec<Pair32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `y[r, j] = W[r] · x̃_j` (y: [rows, k]) in ggml's order per column; lengths checked by
/// `fastvec::matvec_fast_multi`, `ty` one of `supported`. AVX-512 VNNI when available, else
/// the scalar twin.
pub(super) fn matvec_multi(ty: QuantType, w: &[u8], rows: usize, cols: usize, acts: &[u8], k: usize, y: &mut [f32]) {
    if rows == 0 || k == 0 {
        return;
    }
    let ab = acts.len() / k;
    if let Some((_, off)) = legacy_geo(ty) {
        let nb = cols / QK;
        let done = PAIRS.with(|ps| {
            let mut ps = ps.borrow_mut();
            let np = k.div_ceil(2);
            ps.resize_with(np, Pair32::default);
            let cols: Vec<&[u8]> = acts.chunks_exact(ab).collect();
            for (p, c) in ps.iter_mut().zip(cols.chunks(2)) {
                p.fill(c[0], c.get(1).copied(), nb, off);
            }
            avx512::legacy(ty, w, rows, &ps[..np], k, y)
        });
        if !done {
            matvec_multi_scalar(ty, w, rows, cols, acts, k, y);
        }
        return;
    }
    if !avx512::q6k(w, rows, acts, k, y) {
        matvec_multi_scalar(ty, w, rows, cols, acts, k, y);
    }
}

/// The scalar twin of `matvec_multi`: per row, each weight block unpacked once, then per column
/// `vecdot`'s lane sums and FMA step (the very helpers of `vec_dot_scalar`).
pub(super) fn matvec_multi_scalar(ty: QuantType, w: &[u8], rows: usize, cols: usize, acts: &[u8], k: usize, y: &mut [f32]) {
    if rows == 0 || k == 0 {
        return;
    }
    let ab = acts.len() / k;
    let rb = w.len() / rows;
    let mut acc = vec![[0f32; 8]; k];
    for (yr, row) in y.chunks_exact_mut(k).zip(w.chunks_exact(rb)) {
        acc.iter_mut().for_each(|a| *a = [0f32; 8]);
        if let Some((bb, _)) = legacy_geo(ty) {
            for (b, blk) in row.chunks_exact(bb).take(cols / QK).enumerate() {
                let (dx, q) = legacy_quants(ty, blk);
                for (j, a) in acc.iter_mut().enumerate() {
                    let yb = &view::<BlockQ8_0>(&acts[j * ab..(j + 1) * ab])[b];
                    fma_lanes(a, dx * h16(yb.d), &lanes32(&q, &yb.qs));
                }
            }
        } else {
            for (b, x) in view::<BlockQ6K>(row).iter().enumerate() {
                let q = q6k_quants(x);
                let sc: [i32; 16] = std::array::from_fn(|g| x.scales[g] as i32);
                let dx = h16(x.d);
                for (j, a) in acc.iter_mut().enumerate() {
                    let yb = &view::<BlockQ8K>(&acts[j * ab..(j + 1) * ab])[b];
                    fma_lanes(a, q8k_d(yb) * dx, &q6k_lanes_of(&q, &sc, yb));
                }
            }
        }
        for (o, a) in yr.iter_mut().zip(&acc) {
            *o = hsum8(*a);
        }
    }
}

/// (d, signed quants in element order) of a Q8_0 / Q4_0 / Q5_0 block, as `vecdot`'s dot_*.
fn legacy_quants(ty: QuantType, blk: &[u8]) -> (f32, [i8; QK]) {
    let d = h16([blk[0], blk[1]]);
    let q = match ty {
        QuantType::Q8_0 => std::array::from_fn(|e| blk[2 + e] as i8),
        QuantType::Q4_0 => nibbles(blk[2..18].try_into().expect("16 bytes")).map(|v| v - 8),
        _ => {
            let mut q = nibbles(blk[6..22].try_into().expect("16 bytes"));
            for (v, h) in q.iter_mut().zip(high_bits([blk[2], blk[3], blk[4], blk[5]])) {
                *v = (*v | (h << 4)) - 16;
            }
            q
        }
    };
    (d, q)
}

mod avx512 {
    use super::super::QuantType;
    use super::Pair32;

    /// Column pairs per pass over a row (8 columns). 8 pairs ran k = 16 slower than two passes of
    /// 4: their unpacked activations (6 KiB per pair per 1024 columns) overflow L1.
    const PAIRS_MAX: usize = 4;

    /// Weight rows per tile when the columns take more than one pass.
    const ROW_TILE: usize = 16;

    /// The legacy kernel over all rows (`ps`: the k columns in pairs); `false` (nothing
    /// written) without the CPU features. y: [rows, k]
    pub(super) fn legacy(ty: QuantType, w: &[u8], rows: usize, ps: &[Pair32], k: usize, y: &mut [f32]) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            if super::super::vecdot_avx512::available() && rows > 0 && k > 0 && ps.len() == k.div_ceil(2) {
                let rb = w.len() / rows;
                // Tiles of rows, each column chunk over the whole tile before the next: more
                // than 8 columns' unpacked activations do not fit L1 beside each other, a tile's
                // weight rows (a few KiB) do.
                for (t, (yt, wt)) in y.chunks_mut(k * ROW_TILE).zip(w.chunks(rb * ROW_TILE)).enumerate() {
                    for (i0, ps) in ps.chunks(PAIRS_MAX).enumerate() {
                        // two rows at a time (four for a single pair): as many more independent
                        // FMA chains (one per pair and row; with one row and k <= 4 the loop
                        // waited on FMA latency), and each activation load serves every row
                        let j0 = 2 * PAIRS_MAX * i0;
                        let j1 = (j0 + 2 * ps.len()).min(k);
                        let rg = if ps.len() == 1 { 4 } else { 2 };
                        let mut r = 0;
                        for (yr2, rows2) in yt.chunks_mut(rg * k).zip(wt.chunks(rg * rb)) {
                            if i0 == 0 {
                                for i in 0..rows2.len() / rb {
                                    super::super::vecdot_avx512::prefetch_ahead(w, (t * ROW_TILE + r + i) * rb, rb);
                                }
                            }
                            r += rg;
                            macro_rules! go {
                                ($R:literal, $T:literal, $rows:expr, $outs:expr) => {
                                    match ps.len() {
                                        1 => imp::legacy::<1, $T, $R>($rows, ps, $outs),
                                        2 => imp::legacy::<2, $T, $R>($rows, ps, $outs),
                                        3 => imp::legacy::<3, $T, $R>($rows, ps, $outs),
                                        _ => imp::legacy::<4, $T, $R>($rows, ps, $outs),
                                    }
                                };
                            }
                            macro_rules! ty {
                                ($R:literal, $rows:expr, $outs:expr) => {
                                    match ty {
                                        QuantType::Q8_0 => go!($R, 0, $rows, $outs),
                                        QuantType::Q4_0 => go!($R, 1, $rows, $outs),
                                        _ => go!($R, 2, $rows, $outs),
                                    }
                                };
                            }
                            let n = rows2.len() / rb;
                            let mut ys = yr2.chunks_exact_mut(k);
                            let mut outs = std::iter::from_fn(|| ys.next().map(|y| &mut y[j0..j1]));
                            if n == 4 {
                                let rows: [&[u8]; 4] = std::array::from_fn(|i| &rows2[i * rb..(i + 1) * rb]);
                                let outs: [&mut [f32]; 4] = std::array::from_fn(|_| outs.next().expect("4 rows"));
                                // SAFETY: available() confirmed avx512f/bw/vl/vnni, avx2, fma, f16c.
                                unsafe {
                                    match ty {
                                        QuantType::Q8_0 => imp::legacy::<1, 0, 4>(rows, ps, outs),
                                        QuantType::Q4_0 => imp::legacy::<1, 1, 4>(rows, ps, outs),
                                        _ => imp::legacy::<1, 2, 4>(rows, ps, outs),
                                    }
                                }
                            } else if n == 2 {
                                let rows = [&rows2[..rb], &rows2[rb..]];
                                let outs: [&mut [f32]; 2] = std::array::from_fn(|_| outs.next().expect("2 rows"));
                                // SAFETY: as above.
                                unsafe { ty!(2, rows, outs) }
                            } else {
                                for (row, out) in rows2.chunks_exact(rb).zip(outs) {
                                    // SAFETY: as above.
                                    unsafe { ty!(1, [row], [out]) }
                                }
                            }
                        }
                    }
                }
                return true;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (ty, w, rows, ps, k, y);
        false
    }

    /// The Q6_K kernel over all rows (acts: [k, Q8_K row bytes]); `false` without the features.
    pub(super) fn q6k(w: &[u8], rows: usize, acts: &[u8], k: usize, y: &mut [f32]) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            if super::super::vecdot_avx512::available() && rows > 0 && k > 0 {
                let (rb, ab) = (w.len() / rows, acts.len() / k);
                let cols: Vec<&[u8]> = acts.chunks_exact(ab).collect();
                for (r, (yr, row)) in y.chunks_exact_mut(k).zip(w.chunks_exact(rb)).enumerate() {
                    super::super::vecdot_avx512::prefetch_ahead(w, r * rb, rb);
                    for (j0, a) in cols.chunks(super::MULTI_MAX).enumerate() {
                        let out = &mut yr[j0 * super::MULTI_MAX..][..a.len()];
                        // SAFETY: available() confirmed avx512f/bw/vl/vnni, avx2, fma and f16c.
                        unsafe {
                            match a.len() {
                                1 => imp::q6k::<1>(row, a, out),
                                2 => imp::q6k::<2>(row, a, out),
                                3 => imp::q6k::<3>(row, a, out),
                                4 => imp::q6k::<4>(row, a, out),
                                5 => imp::q6k::<5>(row, a, out),
                                6 => imp::q6k::<6>(row, a, out),
                                7 => imp::q6k::<7>(row, a, out),
                                _ => imp::q6k::<8>(row, a, out),
                            }
                        }
                    }
                }
                return true;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (w, rows, acts, k, y);
        false
    }

    #[cfg(target_arch = "x86_64")]
    mod imp {
        use super::super::super::blocks::{QK, QK_K};
        use super::super::super::vecdot::{h16, hsum8};
        use super::super::Pair32;
        use std::arch::x86_64::*;

        /// 8 f32 lanes -> `hsum8`, ggml's reduction.
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        fn hsum(v: __m256) -> f32 {
            let mut a = [0f32; 8];
            // SAFETY: `a` is 8 writable f32; storeu has no alignment requirement.
            unsafe { _mm256_storeu_ps(a.as_mut_ptr(), v) };
            hsum8(a)
        }

        /// A block's unsigned quants u = q + off in element order, in both 256-bit halves (T: 0
        /// Q8_0, 1 Q4_0, 2 Q5_0).
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        fn unsigned_quants<const T: u8>(blk: &[u8]) -> __m512i {
            // Both 256-bit halves hold the block (one column of the pair each): the packed bytes
            // are broadcast straight from memory, so the unpack works on all 64 lanes at once.
            match T {
                0 => {
                    let q = &blk[2..34];
                    // SAFETY: `q` is exactly 32 readable bytes; unaligned broadcast load.
                    let v = unsafe { _mm512_broadcast_i64x4(_mm256_loadu_si256(q.as_ptr().cast())) };
                    _mm512_xor_si512(v, _mm512_set1_epi8(-128))
                }
                _ => {
                    let (qs, qh) = if T == 1 {
                        (&blk[2..18], 0u32)
                    } else {
                        (&blk[6..22], u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]))
                    };
                    // SAFETY: `qs` is exactly 16 readable bytes; unaligned broadcast load.
                    let b = unsafe { _mm512_broadcast_i32x4(_mm_loadu_si128(qs.as_ptr().cast())) };
                    // 128-bit lanes 0, 2: low nibbles (elements 0..16), 1, 3: high (16..32)
                    let shift = _mm512_set_epi64(
                        0x0004_0004_0004_0004,
                        0x0004_0004_0004_0004,
                        0,
                        0,
                        0x0004_0004_0004_0004,
                        0x0004_0004_0004_0004,
                        0,
                        0,
                    );
                    let n = _mm512_and_si512(_mm512_srlv_epi16(b, shift), _mm512_set1_epi8(0x0F));
                    if T == 1 {
                        n
                    } else {
                        let m = qh as u64 | (qh as u64) << 32;
                        _mm512_mask_add_epi8(n, m, n, _mm512_set1_epi8(16))
                    }
                }
            }
        }

        /// `P` column pairs of `R` Q8_0 / Q4_0 / Q5_0 rows (T as `unsigned_quants`); each `outs[r]`
        /// holds 2P columns, or 2P - 1 when the last pair has no second column. Per block the
        /// unsigned quants are unpacked once into both halves of a 512-bit register; per pair one
        /// `vpdpbusd` from the offset lanes, one convert, one multiply (dx · dy) and one FMA,
        /// lane for lane `vecdot_avx512`'s per-block step for each of the two columns.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        pub(super) fn legacy<const P: usize, const T: u8, const R: usize>(
            rows: [&[u8]; R],
            ps: &[Pair32],
            outs: [&mut [f32]; R],
        ) {
            let bb = [34, 18, 22][T as usize];
            let nb = rows[0].len() / bb;
            assert!(rows.iter().all(|r| r.len() == nb * bb), "legacy: rows of equal length");
            for out in &outs {
                assert!(ps.len() == P && (out.len() == 2 * P || out.len() + 1 == 2 * P), "legacy: {P} column pairs");
            }
            for p in ps {
                assert!(
                    p.q.len() >= nb * 2 * QK && p.bias.len() >= nb * 16 && p.d.len() >= nb * 16,
                    "activation shorter than the row"
                );
            }
            let mut acc = [[_mm512_setzero_ps(); P]; R];
            for b in 0..nb {
                let mut w = [_mm512_setzero_si512(); R];
                let mut dx = [_mm512_setzero_ps(); R];
                for r in 0..R {
                    let x = &rows[r][b * bb..(b + 1) * bb];
                    w[r] = unsigned_quants::<T>(x);
                    // the f16 scale in all 16 lanes (exact); broadcast first, as vecdot_avx512's f16x8
                    dx[r] = _mm512_cvtph_ps(_mm256_set1_epi16(i16::from_le_bytes([x[0], x[1]])));
                }
                for i in 0..P {
                    let p = &ps[i];
                    // SAFETY: q has >= nb*64 i8, bias and d >= nb*16 (asserted) and b < nb: the
                    // 64-byte loads at q[64b..], bias[16b..] and d[16b..] are in bounds; unaligned.
                    let (a, bias, dy) = unsafe {
                        (
                            _mm512_loadu_si512(p.q.as_ptr().add(2 * QK * b).cast()),
                            _mm512_loadu_si512(p.bias.as_ptr().add(16 * b).cast()),
                            _mm512_loadu_ps(p.d.as_ptr().add(16 * b)),
                        )
                    };
                    for r in 0..R {
                        let lanes = _mm512_dpbusd_epi32(bias, w[r], a);
                        acc[r][i] = _mm512_fmadd_ps(_mm512_mul_ps(dx[r], dy), _mm512_cvtepi32_ps(lanes), acc[r][i]);
                    }
                }
            }
            for (acc, out) in acc.iter().zip(outs) {
                for i in 0..P {
                    let mut a = [0f32; 16];
                    // SAFETY: `a` is 16 writable f32; storeu has no alignment requirement.
                    unsafe { _mm512_storeu_ps(a.as_mut_ptr(), acc[i]) };
                    out[2 * i] = hsum8(a[..8].try_into().expect("8 lanes"));
                    if let Some(o) = out.get_mut(2 * i + 1) {
                        *o = hsum8(a[8..].try_into().expect("8 lanes"));
                    }
                }
            }
        }

        /// `K` columns of one Q6_K row, each activation column a whole Q8_K row (`a[j]`). Per
        /// block the 6-bit quants (4 x 64 bytes in element order) and the scales as i16 lanes
        /// are unpacked once; per column the lanes of ggml's kernel are built as
        /// `-32·(bs·sc)` (one `vpdpwssd`, lanes 0..8) plus four `vpmaddubsw` + `vpdpwssd`
        /// (16 lanes, lane m of step c = elements 64c+4m..+4 times scale 4c + m/4), folded
        /// 16 -> 8 (lane l + lane l+8), then `acc = fma(dy·dx, lanes, acc)`.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        pub(super) fn q6k<const K: usize>(row: &[u8], a: &[&[u8]], out: &mut [f32]) {
            const BB: usize = 210;
            const AB: usize = 292;
            let nb = row.len() / BB;
            assert!(a.len() == K && out.len() == K, "q6k: {K} columns");
            for aj in a {
                assert!(aj.len() >= nb * AB, "activation shorter than the row");
            }
            let m4 = _mm512_set1_epi8(0x0F);
            let m30 = _mm512_set1_epi8(0x30);
            // i16 lane i of step c takes the scale of group 4c + i/8
            let sidx: [__m512i; 4] = std::array::from_fn(|c| {
                let v: [i16; 32] = std::array::from_fn(|i| (4 * c + i / 8) as i16);
                // SAFETY: `v` is 64 readable bytes; unaligned load.
                unsafe { _mm512_loadu_si512(v.as_ptr().cast()) }
            });
            let mut acc = [_mm256_setzero_ps(); K];
            for b in 0..nb {
                let x = &row[b * BB..(b + 1) * BB];
                let (ql, qh, scales) = (&x[0..128], &x[128..192], &x[192..208]);
                let dxv = _mm256_set1_ps(h16([x[208], x[209]]));
                // SAFETY: ql is 128 bytes, qh 64 and scales 16: the loads at 64h (64 bytes),
                // 32h (32 bytes) and 0 (16 bytes) are in bounds; unaligned loads.
                let (q, sc16) = unsafe {
                    let mut q = [_mm512_setzero_si512(); 4];
                    for h in 0..2 {
                        let l = _mm512_loadu_si512(ql.as_ptr().add(64 * h).cast());
                        let hq = _mm256_loadu_si256(qh.as_ptr().add(32 * h).cast());
                        // [hq | hq >> 2]: bits 4..6 of the quants of sub-blocks 2h.. and 2h+1..
                        let hx = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(hq), _mm256_srli_epi16::<2>(hq));
                        q[2 * h] = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_slli_epi16::<4>(hx), m30));
                        q[2 * h + 1] =
                            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(l), m4), _mm512_and_si512(hx, m30));
                    }
                    (q, _mm256_cvtepi8_epi16(_mm_loadu_si128(scales.as_ptr().cast())))
                };
                let scl: [__m512i; 4] = std::array::from_fn(|c| _mm512_permutexvar_epi16(sidx[c], _mm512_zextsi256_si512(sc16)));
                let neg32 = _mm512_zextsi256_si512(_mm256_mullo_epi16(sc16, _mm256_set1_epi16(-32)));
                for j in 0..K {
                    let y = &a[j][b * AB..(b + 1) * AB];
                    let dy = f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
                    // SAFETY: y is 292 bytes: quants at 4..260 (64-byte loads at 4 + 64c) and
                    // bsums at 260..292 (one 32-byte load) are in bounds; unaligned loads.
                    let s = unsafe {
                        let bs = _mm512_zextsi256_si512(_mm256_loadu_si256(y.as_ptr().add(4 + QK_K).cast()));
                        let mut s = _mm512_dpwssd_epi32(_mm512_setzero_si512(), bs, neg32);
                        for c in 0..4 {
                            let av = _mm512_loadu_si512(y.as_ptr().add(4 + 64 * c).cast());
                            s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(q[c], av), scl[c]);
                        }
                        s
                    };
                    let p = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64::<1>(s));
                    // dy · dx lane-wise (the scalar product of ggml's kernel) from a broadcast load
                    let d = _mm256_mul_ps(_mm256_set1_ps(dy), dxv);
                    acc[j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[j]);
                }
            }
            for j in 0..K {
                out[j] = hsum(acc[j]);
            }
        }
    }
}

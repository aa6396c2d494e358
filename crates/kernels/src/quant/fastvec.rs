//! Decode matvec in cortiq's own float order (`Numerics::Fast`) for the 32-element GGUF types
//! Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0: `y[r] = W[r] · x̃` with x̃ the Q8_0 / Q8_1 activation row.
//!
//! Why a second kernel beside `vecdot::matvec_q`: that one reproduces ggml's float order bit for
//! bit (256-bit lanes, one FMA per 32-element block, a scalar f16 convert and FMA per block for
//! the min term) and is compute-bound on these types (Q4_1 ~17 G weights/s a core, under
//! memory speed). Here the activation row is unpacked once per call (contiguous int8 quants,
//! per-block f32 scales, per-lane sums for the quant offset, Q8_1's `s` widened), then every
//! 64 weights take one 512-bit unpack, one `vpdpbusd` and one FMA with per-lane scales.
//!
//! Arithmetic (both twins): per block b the exact integer sum
//! `i_b = Σ u·a - off·Σ a` (u the unsigned stored quant, `off` the type's offset), then
//! `acc += f32(i_b) · (d_w,b · d_a,b)`; Q4_1/Q5_1 add `Σ_b m_b · s_b`. The SIMD twin adds the
//! block terms in 16 lanes (8 per block of a pair) and reduces at the end, the scalar twin in
//! block order: they agree to a few f32 roundings of Σ|w·x| (tests/fastvec.rs prints them).

use super::QuantType;
use super::blocks::f16_le;
use super::vecdot::{ActType, Q8_1_BYTES, act_type};

/// Whether `matvec_fast` runs a kernel of its own for `ty` rather than `matvec_q`: only where
/// it measured faster (examples/fastvec_bench, single thread, G weights/s ggml order -> own:
/// Q4_1 19.7 -> 26.3 in cache and 12.9 -> 24.9 streamed; Q5_1 even; Q4_0, Q5_0 and Q8_0 lose
/// 10-30% to ggml's kernels, whose per-block work is already light). `matvec_own` runs it for
/// every type of `geo` (tests, benches). The engine's fast decode keeps Q4_0, Q5_0 and Q8_0 in the
/// interleaved layout of `quant::ileave`, whose kernel beats both.
/// Q4_K (quant/fastk.rs): 40 -> 59 in cache, 39 -> 58 streamed (2048 / 65536 x 1024).
pub fn fastvec_supported(ty: QuantType) -> bool {
    matches!(ty, QuantType::Q4_1 | QuantType::Q5_1 | QuantType::Q4K)
}

/// (block bytes, quant offset, has min) of the supported weight types.
pub(super) fn geo(ty: QuantType) -> Option<(usize, i32, bool)> {
    match ty {
        QuantType::Q4_0 => Some((18, 8, false)),
        QuantType::Q4_1 => Some((20, 0, true)),
        QuantType::Q5_0 => Some((22, 16, false)),
        QuantType::Q5_1 => Some((24, 0, true)),
        QuantType::Q8_0 => Some((34, 128, false)),
        _ => None,
    }
}

/// The activation row unpacked: quants in element order, per-block scale, per-4-element sums
/// (the `vpdpbusd` lanes' offset corrections), Q8_1's `s` per block.
#[derive(Default)]
pub struct Unpacked {
    pub(super) q: Vec<i8>,
    pub(super) d: Vec<f32>,
    pub(super) sum4: Vec<i32>,
    pub(super) s: Vec<f32>,
}

impl Unpacked {
    pub(super) fn fill(&mut self, act: ActType, a: &[u8], cols: usize) {
        let nb = cols / 32;
        let (bb, qo) = match act {
            ActType::Q8_1 => (Q8_1_BYTES, 4),
            _ => (34, 2),
        };
        self.q.clear();
        self.d.clear();
        self.s.clear();
        self.sum4.clear();
        for blk in a.chunks_exact(bb).take(nb) {
            self.d.push(f16_le([blk[0], blk[1]]));
            if act == ActType::Q8_1 {
                self.s.push(f16_le([blk[2], blk[3]]));
            }
            let qs = &blk[qo..qo + 32];
            self.q.extend(qs.iter().map(|&b| b as i8));
            self.sum4.extend(qs.chunks_exact(4).map(|c| c.iter().map(|&b| b as i8 as i32).sum::<i32>()));
        }
    }
}

/// Unsigned quant `u` of element `j` (0..32) of a weight block (offset not applied).
fn quant(ty: QuantType, blk: &[u8], j: usize) -> i32 {
    let nib = |qs: &[u8]| if j < 16 { qs[j] & 0xF } else { qs[j - 16] >> 4 } as i32;
    match ty {
        QuantType::Q4_0 => nib(&blk[2..18]),
        QuantType::Q4_1 => nib(&blk[4..20]),
        QuantType::Q5_0 => {
            let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
            nib(&blk[6..22]) | (((qh >> j) & 1) as i32) << 4
        }
        QuantType::Q5_1 => {
            let qh = u32::from_le_bytes([blk[4], blk[5], blk[6], blk[7]]);
            nib(&blk[8..24]) | (((qh >> j) & 1) as i32) << 4
        }
        QuantType::Q8_0 => blk[2 + j] as i8 as i32 + 128,
        _ => unreachable!("checked by geo"),
    }
}

/// Scalar twin of one row (lengths checked by the caller).
pub(super) fn row_scalar(ty: QuantType, row: &[u8], u: &Unpacked) -> f32 {
    let (bb, off, min) = geo(ty).expect("checked by the caller");
    let mut acc = 0f32;
    let mut macc = 0f32;
    for (b, blk) in row.chunks_exact(bb).enumerate() {
        let mut isum = 0i32;
        for j in 0..32 {
            isum += quant(ty, blk, j) * u.q[b * 32 + j] as i32;
        }
        isum -= off * u.sum4[b * 8..b * 8 + 8].iter().sum::<i32>();
        let dw = f16_le([blk[0], blk[1]]);
        acc = (isum as f32).mul_add(dw * u.d[b], acc);
        if min {
            macc = f16_le([blk[2], blk[3]]).mul_add(u.s[b], macc);
        }
    }
    acc + macc
}

thread_local! {
    static UNPACKED: std::cell::RefCell<Unpacked> = std::cell::RefCell::new(Unpacked::default());
    static MULTI: std::cell::RefCell<(Vec<Unpacked>, Vec<super::fastvec_avx512::MultiCol>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

#[track_caller]
fn check(func: &str, ty: QuantType, w: &[u8], rows: usize, cols: usize, act: &[u8], y: &[f32]) -> ActType {
    let at = act_type(ty).unwrap_or_else(|| panic!("{func}({ty}): no quantized-activation format"));
    let (wb, ab) = (ty.row_bytes(cols), at.row_bytes(cols));
    assert!(
        wb.map(|b| b * rows) == Some(w.len()) && ab == Some(act.len()) && y.len() == rows,
        "{func}({ty}): {rows}x{cols} needs {:?} weight and {ab:?} activation bytes and {rows} outputs, got {}, {} and {}",
        wb.map(|b| b * rows),
        w.len(),
        act.len(),
        y.len()
    );
    at
}

/// `y[r] = W[r] · x̃` for `rows` rows of `ty` back to back and one activation row quantized by
/// `quantize_act(act_type(ty), ..)`; single-threaded (the engine splits row ranges). Types
/// without a kernel here fall back to `matvec_q` (ggml's order). AVX-512 VNNI when available.
#[track_caller]
pub fn matvec_fast(ty: QuantType, w: &[u8], rows: usize, cols: usize, act: &[u8], y: &mut [f32]) {
    if !fastvec_supported(ty) {
        super::vecdot::matvec_q(ty, w, rows, cols, act, y);
        return;
    }
    matvec_own(ty, w, rows, cols, act, y);
}

/// `matvec_fast`'s own kernel for any of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (others: `matvec_q`).
#[track_caller]
pub fn matvec_own(ty: QuantType, w: &[u8], rows: usize, cols: usize, act: &[u8], y: &mut [f32]) {
    if ty == QuantType::Q4K {
        check("matvec_own", ty, w, rows, cols, act, y);
        super::fastk::matvec_q4k(w, rows, cols, act, y);
        return;
    }
    if geo(ty).is_none() {
        super::vecdot::matvec_q(ty, w, rows, cols, act, y);
        return;
    }
    let at = check("matvec_own", ty, w, rows, cols, act, y);
    if rows == 0 {
        return;
    }
    UNPACKED.with(|u| {
        let mut u = u.borrow_mut();
        u.fill(at, act, cols);
        if !super::fastvec_avx512::matvec(ty, w, rows, cols, &u, y) {
            let rb = w.len() / rows;
            #[cfg(target_arch = "x86_64")]
            if crate::simd::level() == crate::simd::Level::Avx2 {
                // SAFETY: level() returned Avx2 after detecting avx2, fma and f16c.
                unsafe { avx2::rows(ty, w, rb, &u, y) };
                return;
            }
            for (o, row) in y.iter_mut().zip(w.chunks_exact(rb)) {
                *o = row_scalar(ty, row, &u);
            }
        }
    });
}

/// The scalar twin of `matvec_own` (same contract; types outside `geo` use `vec_dot_scalar`).
#[track_caller]
pub fn matvec_fast_scalar(ty: QuantType, w: &[u8], rows: usize, cols: usize, act: &[u8], y: &mut [f32]) {
    if ty == QuantType::Q4K {
        check("matvec_fast_scalar", ty, w, rows, cols, act, y);
        super::fastk::matvec_q4k_scalar(w, rows, cols, act, y);
        return;
    }
    if geo(ty).is_none() {
        for (o, row) in y.iter_mut().zip(w.chunks_exact((w.len() / rows.max(1)).max(1))) {
            *o = super::vecdot::vec_dot_scalar(ty, row, act, cols);
        }
        return;
    }
    let at = check("matvec_fast_scalar", ty, w, rows, cols, act, y);
    if rows == 0 {
        return;
    }
    let mut u = Unpacked::default();
    u.fill(at, act, cols);
    let rb = w.len() / rows;
    for (o, row) in y.iter_mut().zip(w.chunks_exact(rb)) {
        *o = row_scalar(ty, row, &u);
    }
}

/// Several activation rows through one weight stream (continuous batching: one decode row per
/// running sequence; speculative verification: k drafted positions): `y[r, j] = W[r] · x̃_j`
/// for `k` activation rows back to back in `acts` ([k, act row bytes], each quantized by
/// `quantize_act(act_type(ty), ..)`). y: [rows, k] (row-major, so a thread's slab of weight rows
/// is a contiguous slab of y).
///
/// Every column is **bit-identical to `matvec_fast` on that activation row alone**, whatever
/// `k` and the other columns are: a sequence's result must not depend on what runs beside it.
/// Q4_K reads each weight block once for up to 8 columns (`fastk::matvec_q4k_multi`), and so do
/// Q8_0, Q4_0, Q5_0 and Q6_K in ggml's order (`vecmulti`) and Q4_1 / Q5_1 in cortiq's
/// (`fastvec_avx512::matvec_multi`); the other types (Q2_K, Q3_K, Q5_K, ...) run `matvec_fast`
/// per column over tiles of `MULTI_TILE_ROWS` rows (same bits: each row's dot product is its
/// own): a tile's bytes stay in L1/L2 while every column passes, so memory streams the matrix
/// once and only the unpacking is repeated per column.
#[track_caller]
pub fn matvec_fast_multi(ty: QuantType, w: &[u8], rows: usize, cols: usize, acts: &[u8], k: usize, y: &mut [f32]) {
    check_multi("matvec_fast_multi", ty, w, rows, cols, acts, k, y);
    if k == 0 || rows == 0 {
        return;
    }
    if ty == QuantType::Q4K {
        super::fastk::matvec_q4k_multi(w, rows, cols, acts, k, y);
        return;
    }
    if super::vecmulti::supported(ty) {
        super::vecmulti::matvec_multi(ty, w, rows, cols, acts, k, y);
        return;
    }
    if matches!(ty, QuantType::Q4_1 | QuantType::Q5_1) {
        let at = act_type(ty).expect("checked");
        let ab = acts.len() / k;
        let done = MULTI.with(|m| {
            let (us, ms) = &mut *m.borrow_mut();
            us.resize_with(k, Unpacked::default);
            ms.resize_with(k, Default::default);
            for ((u, mc), a) in us.iter_mut().zip(ms.iter_mut()).zip(acts.chunks_exact(ab)) {
                u.fill(at, a, cols);
                mc.fill(u);
            }
            super::fastvec_avx512::matvec_multi(ty, w, rows, cols, &us[..k], &ms[..k], y)
        });
        if done {
            return;
        }
    }
    per_column_tiled(ty, w, rows, cols, acts, k, y, matvec_fast);
}

/// A single-column kernel: (type, rows' bytes, rows, cols, activation row, [rows] out).
type RowsKernel = fn(QuantType, &[u8], usize, usize, &[u8], &mut [f32]);

/// Rows per tile of the per-column fallback: 16 rows of a k-quant at 4096 columns are ~40 KiB.
const MULTI_TILE_ROWS: usize = 16;

/// y [rows, k] by `f(ty, tile rows, n, cols, activation row j, [n] out)` tile by tile, every
/// column over a tile before the next tile.
#[allow(clippy::too_many_arguments)]
fn per_column_tiled(ty: QuantType, w: &[u8], rows: usize, cols: usize, acts: &[u8], k: usize, y: &mut [f32], f: RowsKernel) {
    let rb = w.len() / rows;
    let ab = acts.len() / k;
    let mut yj = [0f32; MULTI_TILE_ROWS];
    for r0 in (0..rows).step_by(MULTI_TILE_ROWS) {
        let n = MULTI_TILE_ROWS.min(rows - r0);
        let tile = &w[r0 * rb..(r0 + n) * rb];
        for (j, a) in acts.chunks_exact(ab).enumerate() {
            f(ty, tile, n, cols, a, &mut yj[..n]);
            for (i, &v) in yj[..n].iter().enumerate() {
                y[(r0 + i) * k + j] = v;
            }
        }
    }
}

/// The scalar twin of `matvec_fast_multi` (Q4_K: `fastk`'s scalar row per column; Q8_0, Q4_0,
/// Q5_0, Q6_K: `vecmulti`'s scalar twin; the other types: `matvec_fast_scalar` per column).
#[track_caller]
pub fn matvec_fast_multi_scalar(ty: QuantType, w: &[u8], rows: usize, cols: usize, acts: &[u8], k: usize, y: &mut [f32]) {
    check_multi("matvec_fast_multi_scalar", ty, w, rows, cols, acts, k, y);
    if k == 0 || rows == 0 {
        return;
    }
    if ty == QuantType::Q4K {
        super::fastk::matvec_q4k_multi_scalar(w, rows, cols, acts, k, y);
        return;
    }
    if super::vecmulti::supported(ty) {
        super::vecmulti::matvec_multi_scalar(ty, w, rows, cols, acts, k, y);
        return;
    }
    per_column(acts, k, rows, y, |a, yj| matvec_fast_scalar(ty, w, rows, cols, a, yj));
}

/// Column j of y [rows, k] from `f(activation row j, [rows] output)`.
fn per_column(acts: &[u8], k: usize, rows: usize, y: &mut [f32], mut f: impl FnMut(&[u8], &mut [f32])) {
    let mut yj = vec![0f32; rows];
    for (j, a) in acts.chunks_exact(acts.len() / k).enumerate() {
        f(a, &mut yj);
        for (r, &v) in yj.iter().enumerate() {
            y[r * k + j] = v;
        }
    }
}

#[allow(clippy::too_many_arguments)]
#[track_caller]
fn check_multi(func: &str, ty: QuantType, w: &[u8], rows: usize, cols: usize, acts: &[u8], k: usize, y: &[f32]) {
    let at = act_type(ty).unwrap_or_else(|| panic!("{func}({ty}): no quantized-activation format"));
    let (wb, ab) = (ty.row_bytes(cols), at.row_bytes(cols));
    assert!(
        wb.map(|b| b * rows) == Some(w.len()) && ab.map(|b| b * k) == Some(acts.len()) && y.len() == rows * k,
        "{func}({ty}): {rows}x{cols} times {k} columns needs {:?} weight and {:?} activation bytes and {} outputs, got {}, {} and {}",
        wb.map(|b| b * rows),
        ab.map(|b| b * k),
        rows * k,
        w.len(),
        acts.len(),
        y.len()
    );
}

/// `row_scalar` with AVX2 (no AVX-512), four rows at a time: each block's integer sums by
/// `vpmaddubsw` + `vpmaddwd` (exact: the unsigned 4/5-bit quants stay under i16 saturation;
/// Q8_0 takes the signed form |w|, a·sign(w), whose Σ w·a is Σ u·a − 128·Σ a), then per row
/// the scalar twin's float steps in block order, one row per lane: the same bits. Four rows
/// side by side hide the FMA chain's latency.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{QuantType, Unpacked, geo};
    use std::arch::x86_64::*;

    /// y[r] = row r of w (`rb` bytes a row) · the activation row.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; lengths as `row_scalar` takes them (slices panic otherwise).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn rows(ty: QuantType, w: &[u8], rb: usize, u: &Unpacked, y: &mut [f32]) {
        let mut r = 0;
        while r < y.len() {
            let n = (y.len() - r).min(4);
            // A short last step repeats its last row in the spare lanes.
            let at = |i: usize| (r + i.min(n - 1)) * rb;
            let rs = [&w[at(0)..at(0) + rb], &w[at(1)..at(1) + rb], &w[at(2)..at(2) + rb], &w[at(3)..at(3) + rb]];
            let v = rows4(ty, rs, u);
            y[r..r + n].copy_from_slice(&v[..n]);
            r += n;
        }
    }

    /// 16 nibble bytes as 32 unsigned quants in element order [low nibbles | high nibbles].
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn nibbles(q: &[u8]) -> __m256i {
        let q = &q[..16];
        // SAFETY: q is 16 readable bytes.
        let v = unsafe { _mm_loadu_si128(q.as_ptr().cast()) };
        let m4 = _mm_set1_epi8(0x0F);
        _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16::<4>(v), m4), _mm_and_si128(v, m4))
    }

    #[inline]
    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }

    #[inline]
    fn f16_bits(b: &[u8], at: usize) -> i16 {
        i16::from_le_bytes([b[at], b[at + 1]])
    }

    /// One block's products of one row, 8 i32 lanes. (No closures in these kernels: they
    /// would not inherit the target features.)
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn block(ty: QuantType, blk: &[u8], a: __m256i) -> __m256i {
        let p = match ty {
            QuantType::Q4_0 => _mm256_maddubs_epi16(nibbles(&blk[2..]), a),
            QuantType::Q4_1 => _mm256_maddubs_epi16(nibbles(&blk[4..]), a),
            QuantType::Q5_0 => {
                _mm256_maddubs_epi16(_mm256_or_si256(nibbles(&blk[6..]), crate::quant::ileave::avx2_bits16(u32_at(blk, 2))), a)
            }
            QuantType::Q5_1 => {
                _mm256_maddubs_epi16(_mm256_or_si256(nibbles(&blk[8..]), crate::quant::ileave::avx2_bits16(u32_at(blk, 4))), a)
            }
            QuantType::Q8_0 => {
                let q = &blk[2..34];
                // SAFETY: q is 32 readable bytes.
                let w = unsafe { _mm256_loadu_si256(q.as_ptr().cast()) };
                _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w))
            }
            _ => unreachable!("checked by geo"),
        };
        _mm256_madd_epi16(p, _mm256_set1_epi16(1))
    }

    /// Four rows' dot products.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn rows4(ty: QuantType, rs: [&[u8]; 4], u: &Unpacked) -> [f32; 4] {
        let (bb, off, min) = geo(ty).expect("checked by the caller");
        let nb = rs[0].len() / bb;
        let (mut acc, mut macc) = (_mm_setzero_ps(), _mm_setzero_ps());
        for b in 0..nb {
            let aq = &u.q[b * 32..b * 32 + 32];
            // SAFETY: aq is 32 readable i8.
            let a = unsafe { _mm256_loadu_si256(aq.as_ptr().cast()) };
            let (b0, b1, b2, b3) = (
                &rs[0][b * bb..(b + 1) * bb],
                &rs[1][b * bb..(b + 1) * bb],
                &rs[2][b * bb..(b + 1) * bb],
                &rs[3][b * bb..(b + 1) * bb],
            );
            let (s0, s1, s2, s3) = (block(ty, b0, a), block(ty, b1, a), block(ty, b2, a), block(ty, b3, a));
            // Lane i of the reduction: row i's exact sum.
            let h = _mm256_hadd_epi32(_mm256_hadd_epi32(s0, s1), _mm256_hadd_epi32(s2, s3));
            let mut isum = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
            if ty != QuantType::Q8_0 && off != 0 {
                let mut sa = 0i32;
                for &v in &u.sum4[b * 8..b * 8 + 8] {
                    sa += v;
                }
                isum = _mm_sub_epi32(isum, _mm_set1_epi32(off * sa));
            }
            let dw = _mm_cvtph_ps(_mm_setr_epi16(f16_bits(b0, 0), f16_bits(b1, 0), f16_bits(b2, 0), f16_bits(b3, 0), 0, 0, 0, 0));
            acc = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), _mm_mul_ps(dw, _mm_set1_ps(u.d[b])), acc);
            if min {
                let m =
                    _mm_cvtph_ps(_mm_setr_epi16(f16_bits(b0, 2), f16_bits(b1, 2), f16_bits(b2, 2), f16_bits(b3, 2), 0, 0, 0, 0));
                macc = _mm_fmadd_ps(m, _mm_set1_ps(u.s[b]), macc);
            }
        }
        let mut out = [0f32; 4];
        // SAFETY: out holds 4 f32.
        unsafe { _mm_storeu_ps(out.as_mut_ptr(), _mm_add_ps(acc, macc)) };
        out
    }
}

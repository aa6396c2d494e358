use super::{AHEAD, Block, Exp, KvRows, Q8_BLOCK, ScoreRule, Split, TB, part_len};
pub(super) use crate::act::avx2::expf8;
use std::arch::x86_64::*;

/// Rows row0..row0 + n, values off..off + width, as f32: in place for f32, else converted
/// into `tile` [n, width]. Also prefetches the rows AHEAD further on.
///
/// # Safety
/// AVX2, FMA and F16C available; the rows lie inside `src` (checked by `super::check`);
/// width a multiple of 16 (of 32 for 8-bit, with stride and off); tile holds n · width.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block(src: KvRows, stride: usize, off: usize, width: usize, row0: usize, n: usize, tile: &mut [f32]) -> Block {
    super::prefetch(src, stride, off, width, row0 + AHEAD, row0 + AHEAD + n);
    match src {
        KvRows::F32(x) => Block { ptr: x[row0 * stride + off..].as_ptr(), stride },
        KvRows::F16(x) => {
            for t in 0..n {
                let base = (row0 + t) * stride + off;
                let dst = tile[t * width..(t + 1) * width].as_mut_ptr();
                for j in (0..width).step_by(8) {
                    // SAFETY: base + j + 8 <= base + width lies inside x; 8 f16 = 128 bits.
                    unsafe { _mm256_storeu_ps(dst.add(j), _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().add(base + j).cast()))) };
                }
            }
            Block { ptr: tile.as_ptr(), stride: width }
        }
        KvRows::Q8 { q, d } => {
            for t in 0..n {
                let base = (row0 + t) * stride + off;
                let dst = tile[t * width..(t + 1) * width].as_mut_ptr();
                // width is a multiple of 32 (checked): 8 values never straddle two blocks.
                for j in (0..width).step_by(8) {
                    let sc = _mm256_set1_ps(d[(base + j) / Q8_BLOCK]);
                    // SAFETY: base + j + 8 <= base + width lies inside q; 8 i8 = 64 bits.
                    unsafe {
                        let b = _mm_loadl_epi64(q.as_ptr().add(base + j).cast());
                        _mm256_storeu_ps(dst.add(j), _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), sc));
                    }
                }
            }
            Block { ptr: tile.as_ptr(), stride: width }
        }
    }
}

/// # Safety
/// AVX2, FMA and F16C available; arguments as `super::check` accepts them, hd % 16 == 0.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn attend_split(
    q: &[f32],
    hd: usize,
    group: usize,
    s: &Split,
    rule: &ScoreRule,
    scratch: &mut Vec<f32>,
    out: &mut [f32],
) {
    let (nq, n, pl) = (q.len() / hd, s.n, part_len(hd));
    let width = nq / group * hd; // every kv head the heads read
    let need = nq * n + TB * width;
    if scratch.len() < need {
        scratch.resize(need, 0.0);
    }
    let (scores, tile) = scratch.split_at_mut(nq * n); // [nq, n], [TB, width]
    // The split's first rows, then each block's values for the second pass (as the AVX-512
    // kernel does).
    super::prefetch(s.keys, s.stride, s.off, width, s.row0, s.row0 + AHEAD.min(n));
    for t0 in (0..n).step_by(TB) {
        let nt = TB.min(n - t0);
        super::prefetch_l2(s.vals, s.stride, s.off, width, s.row0 + t0, s.row0 + t0 + nt);
        // SAFETY: rows s.row0 + t0 .. + nt lie inside the keys (checked); tile holds TB · width.
        let b = unsafe { block(s.keys, s.stride, s.off, width, s.row0 + t0, nt, tile) };
        for (h, qh) in q.chunks_exact(hd).enumerate() {
            let (rows, dst) = (b.ptr.wrapping_add(h / group * hd), &mut scores[h * n + t0..h * n + t0 + nt]);
            // SAFETY: the block's nt rows hold width values from b.ptr, kv head h / group at
            // (h / group) · hd; scores row h has n >= t0 + nt values.
            unsafe { if hd == 64 { scores_head64(qh, rows, b.stride, dst) } else { scores_head(qh, rows, b.stride, nt, dst) } }
        }
    }
    for (sh, oh) in scores.chunks_exact_mut(n).zip(out.chunks_exact_mut(pl)) {
        match rule.softcap {
            None => {
                let sc = _mm256_set1_ps(rule.scale);
                let n8 = n / 8 * 8;
                for i in (0..n8).step_by(8) {
                    // SAFETY: i + 8 <= n values of sh.
                    unsafe { _mm256_storeu_ps(sh.as_mut_ptr().add(i), _mm256_mul_ps(_mm256_loadu_ps(sh.as_ptr().add(i)), sc)) };
                }
                sh[n8..].iter_mut().for_each(|x| *x = rule.score(*x));
            }
            Some(_) => sh.iter_mut().for_each(|x| *x = rule.score(*x)),
        }
        // SAFETY: AVX2, FMA and F16C available.
        let (m, l) = unsafe { softmax_part(sh, rule.exp) };
        oh[0] = m;
        oh[1] = l;
        oh[2..].fill(0.0);
    }
    for t0 in (0..n).step_by(TB) {
        let nt = TB.min(n - t0);
        // SAFETY: rows s.row0 + t0 .. + nt lie inside the values (checked).
        let b = unsafe { block(s.vals, s.stride, s.off, width, s.row0 + t0, nt, tile) };
        // Heads in pairs of the same kv head share each value row's load; a group of odd
        // size leaves its last head alone.
        let mut h = 0;
        while h < nq {
            let ph = &scores[h * n + t0..h * n + t0 + nt];
            let rows = b.ptr.wrapping_add(h / group * hd);
            if h + 1 < nq && (h + 1) / group == h / group {
                let (o0, o1) = out[h * pl..(h + 2) * pl].split_at_mut(pl);
                // SAFETY: as the scores' pass; o0[2..], o1[2..] hold hd sums each.
                unsafe {
                    acc_pair(ph, &scores[(h + 1) * n + t0..(h + 1) * n + t0 + nt], rows, b.stride, &mut o0[2..], &mut o1[2..])
                };
                h += 2;
            } else {
                // SAFETY: as the scores' pass; out[h] holds hd sums after m and l.
                unsafe { acc_head(ph, rows, b.stride, &mut out[h * pl + 2..(h + 1) * pl]) };
                h += 1;
            }
        }
    }
}

/// The two rows' 16-lane dot products with q (`super::dot_lanes`' accumulators, lanes 0..8
/// and 8..16 in two registers each), each folded to `hsum_scalar`'s first step: s8[i] =
/// v[i] + v[i + 8] with v = a0 + a1.
///
/// # Safety
/// AVX2 and FMA; r0 and r1 valid for q.len() reads; q.len() % 16 == 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot2(q: &[f32], r0: *const f32, r1: *const f32) -> (__m256, __m256) {
    let n = q.len();
    let qp = q.as_ptr();
    let mut a = [_mm256_setzero_ps(); 4];
    let mut b = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY (whole block): i + 32 <= n (or i + 16 <= n) inside q and both rows.
    unsafe {
        while i + 32 <= n {
            for c in 0..4 {
                let qv = _mm256_loadu_ps(qp.add(i + 8 * c));
                a[c] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(r0.add(i + 8 * c)), a[c]);
                b[c] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(r1.add(i + 8 * c)), b[c]);
            }
            i += 32;
        }
        if i + 16 <= n {
            for c in 0..2 {
                let qv = _mm256_loadu_ps(qp.add(i + 8 * c));
                a[c] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(r0.add(i + 8 * c)), a[c]);
                b[c] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(r1.add(i + 8 * c)), b[c]);
            }
        }
    }
    // a[0], a[1]: a0's lanes 0..8, 8..16; a[2], a[3]: a1's.
    (
        _mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[1], a[3])),
        _mm256_add_ps(_mm256_add_ps(b[0], b[2]), _mm256_add_ps(b[1], b[3])),
    )
}

/// `hsum_scalar`'s remaining steps for eight rows at once: x[r] holds row r's s8; lane r of
/// the result is (s4[0] + s4[2]) + (s4[1] + s4[3]) with s4[i] = s8[i] + s8[i + 4].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn reduce8(x: &[__m256; 8]) -> __m256 {
    // y[r]: row r's s4 in the low half, row r + 4's in the high half.
    let mut y = [_mm256_setzero_ps(); 4];
    for (r, v) in y.iter_mut().enumerate() {
        *v = _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(x[r], x[r + 4]), _mm256_permute2f128_ps::<0x31>(x[r], x[r + 4]));
    }
    // Per half: [s4[0] + s4[2] of rows 0, 1, then s4[1] + s4[3] of rows 0, 1] (and 2, 3).
    let p = _mm256_add_ps(_mm256_unpacklo_ps(y[0], y[1]), _mm256_unpackhi_ps(y[0], y[1]));
    let r = _mm256_add_ps(_mm256_unpacklo_ps(y[2], y[3]), _mm256_unpackhi_ps(y[2], y[3]));
    _mm256_add_ps(_mm256_shuffle_ps::<0x44>(p, r), _mm256_shuffle_ps::<0xEE>(p, r))
}

/// Unscaled scores of one head q [hd] against nt <= 16 rows `stride` apart: out[t].
///
/// # Safety
/// AVX2 and FMA; rows valid for (nt - 1) · stride + hd reads; out.len() == nt <= 16.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_head(q: &[f32], rows: *const f32, stride: usize, nt: usize, out: &mut [f32]) {
    let mut s8 = [[_mm256_setzero_ps(); 8]; 2];
    let mut t = 0;
    while t < nt {
        // An odd last row pairs with itself (its second result unused).
        let t1 = if t + 1 < nt { t + 1 } else { t };
        // SAFETY: rows t, t1 < nt.
        let (x0, x1) = unsafe { dot2(q, rows.add(t * stride), rows.add(t1 * stride)) };
        s8[t / 8][t % 8] = x0;
        s8[t1 / 8][t1 % 8] = x1;
        t += 2;
    }
    let mut sums = [0f32; 16];
    for (b, x) in s8.iter().enumerate().take(nt.div_ceil(8)) {
        // SAFETY: sums holds 16 values.
        unsafe { _mm256_storeu_ps(sums.as_mut_ptr().add(8 * b), reduce8(x)) };
    }
    out.copy_from_slice(&sums[..nt]);
}

/// `scores_head` for head size 64, q in eight registers (each row's values loaded once, one
/// load per FMA); the same arithmetic as `dot2` row by row.
///
/// # Safety
/// AVX2 and FMA; rows valid for (out.len() - 1) · stride + 64 reads; q.len() == 64,
/// out.len() <= 16.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_head64(q: &[f32], rows: *const f32, stride: usize, out: &mut [f32]) {
    let mut qv = [_mm256_setzero_ps(); 8];
    for (c, v) in qv.iter_mut().enumerate() {
        // SAFETY: 8 · c + 8 <= 64 values of q.
        *v = unsafe { _mm256_loadu_ps(q.as_ptr().add(8 * c)) };
    }
    let nt = out.len();
    let mut s8 = [[_mm256_setzero_ps(); 8]; 2];
    for t in 0..nt {
        let r = rows.wrapping_add(t * stride);
        // SAFETY: row t < nt holds 64 values from r.
        let a = unsafe {
            let mut a = [_mm256_setzero_ps(); 4];
            for c in 0..4 {
                a[c] = _mm256_fmadd_ps(qv[c], _mm256_loadu_ps(r.add(8 * c)), a[c]);
            }
            for c in 0..4 {
                a[c] = _mm256_fmadd_ps(qv[4 + c], _mm256_loadu_ps(r.add(32 + 8 * c)), a[c]);
            }
            a
        };
        s8[t / 8][t % 8] = _mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[1], a[3]));
    }
    let mut sums = [0f32; 16];
    for (b, x) in s8.iter().enumerate().take(nt.div_ceil(8)) {
        // SAFETY: sums holds 16 values.
        unsafe { _mm256_storeu_ps(sums.as_mut_ptr().add(8 * b), reduce8(x)) };
    }
    out.copy_from_slice(&sums[..nt]);
}

/// `acc_head` for two heads reading the same rows (p0 into o0, p1 into o1): 32 values of a
/// row loaded once for both, the same FMAs per value in the same order.
///
/// # Safety
/// AVX2 and FMA; rows valid for (p0.len() - 1) · stride + o0.len() reads; p1.len() ==
/// p0.len(); o1.len() == o0.len(), a multiple of 16.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn acc_pair(p0: &[f32], p1: &[f32], rows: *const f32, stride: usize, o0: &mut [f32], o1: &mut [f32]) {
    let hd = o0.len();
    let mut c0 = 0;
    // SAFETY (whole block): columns c0..c0 + 8·NV <= hd of each row, o0 and o1.
    unsafe {
        while c0 + 32 <= hd {
            acc_cols2::<4>(p0, p1, rows.add(c0), stride, o0.as_mut_ptr().add(c0), o1.as_mut_ptr().add(c0));
            c0 += 32;
        }
        if c0 < hd {
            acc_cols2::<2>(p0, p1, rows.add(c0), stride, o0.as_mut_ptr().add(c0), o1.as_mut_ptr().add(c0));
        }
    }
}

/// `acc_pair` for the 8·NV values from `rows`, `o0` and `o1`.
///
/// # Safety
/// As `acc_pair`, for 8·NV values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn acc_cols2<const NV: usize>(p0: &[f32], p1: &[f32], rows: *const f32, stride: usize, o0: *mut f32, o1: *mut f32) {
    let mut a0 = [_mm256_setzero_ps(); NV];
    let mut a1 = [_mm256_setzero_ps(); NV];
    // SAFETY (whole block): as promised by the caller.
    unsafe {
        for v in 0..NV {
            a0[v] = _mm256_loadu_ps(o0.add(8 * v));
            a1[v] = _mm256_loadu_ps(o1.add(8 * v));
        }
        for (t, (&x0, &x1)) in p0.iter().zip(p1).enumerate() {
            let (b0, b1) = (_mm256_set1_ps(x0), _mm256_set1_ps(x1));
            let r = rows.add(t * stride);
            for v in 0..NV {
                let x = _mm256_loadu_ps(r.add(8 * v));
                a0[v] = _mm256_fmadd_ps(b0, x, a0[v]);
                a1[v] = _mm256_fmadd_ps(b1, x, a1[v]);
            }
        }
        for v in 0..NV {
            _mm256_storeu_ps(o0.add(8 * v), a0[v]);
            _mm256_storeu_ps(o1.add(8 * v), a1[v]);
        }
    }
}

/// out[d] = fma(p[t], rows[t][d], out[d]) for t < nt in order, 64 values at a time in
/// registers.
///
/// # Safety
/// AVX2 and FMA; rows valid for (p.len() - 1) · stride + out.len() reads; out.len() % 16 == 0.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn acc_head(p: &[f32], rows: *const f32, stride: usize, out: &mut [f32]) {
    let hd = out.len();
    let mut c0 = 0;
    // SAFETY (whole block): columns c0..c0 + 8·NV <= hd of each row and of out.
    unsafe {
        while c0 + 64 <= hd {
            acc_cols::<8>(p, rows.add(c0), stride, out.as_mut_ptr().add(c0));
            c0 += 64;
        }
        match (hd - c0) / 8 {
            6 => acc_cols::<6>(p, rows.add(c0), stride, out.as_mut_ptr().add(c0)),
            4 => acc_cols::<4>(p, rows.add(c0), stride, out.as_mut_ptr().add(c0)),
            2 => acc_cols::<2>(p, rows.add(c0), stride, out.as_mut_ptr().add(c0)),
            _ => {}
        }
    }
}

/// `acc_head` for the 8·NV values from `rows` and `out`.
///
/// # Safety
/// As `acc_head`, for 8·NV values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn acc_cols<const NV: usize>(p: &[f32], rows: *const f32, stride: usize, out: *mut f32) {
    // No closures here: they would not inherit the target features (each intrinsic a call).
    let mut acc = [_mm256_setzero_ps(); NV];
    // SAFETY (whole block): as promised by the caller.
    unsafe {
        for (v, a) in acc.iter_mut().enumerate() {
            *a = _mm256_loadu_ps(out.add(8 * v));
        }
        for (t, &pt) in p.iter().enumerate() {
            let pb = _mm256_set1_ps(pt);
            let r = rows.add(t * stride);
            for (v, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(pb, _mm256_loadu_ps(r.add(8 * v)), *a);
            }
        }
        for (v, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(out.add(8 * v), *a);
        }
    }
}

/// `super::max_of` on 8 lanes (the maximum does not depend on the order; its zero is +0).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn max_of(s: &[f32]) -> f32 {
    let n8 = s.len() / 8 * 8;
    let mut mv = _mm256_set1_ps(f32::NEG_INFINITY);
    for i in (0..n8).step_by(8) {
        // SAFETY: i + 8 <= s.len().
        mv = _mm256_max_ps(mv, unsafe { _mm256_loadu_ps(s.as_ptr().add(i)) });
    }
    let mut lanes = [0f32; 8];
    // SAFETY: lanes holds 8 values.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), mv) };
    super::max_of(&lanes).max(super::max_of(&s[n8..]))
}

/// m, p = exp(s − m) in place, l: `super::softmax_part_scalar`'s arithmetic on 8 lanes (its
/// 16 lane sums in two registers).
///
/// # Safety
/// AVX2, FMA and F16C available.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn softmax_part(s: &mut [f32], exp: Exp) -> (f32, f32) {
    let m = max_of(s);
    let n8 = s.len() / 8 * 8;
    let sp = s.as_mut_ptr();
    let mut acc = [_mm256_setzero_ps(); 2];
    match exp {
        Exp::Fast => {
            let mv = _mm256_set1_ps(m);
            for i in (0..n8).step_by(8) {
                // SAFETY: i + 8 <= s.len().
                unsafe {
                    let e = expf8(_mm256_sub_ps(_mm256_loadu_ps(sp.add(i)), mv));
                    _mm256_storeu_ps(sp.add(i), e);
                    acc[i / 8 % 2] = _mm256_add_ps(acc[i / 8 % 2], e);
                }
            }
            s[n8..].iter_mut().for_each(|x| *x = super::expf_ggml(*x - m));
        }
        Exp::Libm => {
            s.iter_mut().for_each(|x| *x = (*x - m).exp());
            for i in (0..n8).step_by(8) {
                // SAFETY: i + 8 <= s.len().
                acc[i / 8 % 2] = _mm256_add_ps(acc[i / 8 % 2], unsafe { _mm256_loadu_ps(sp.add(i)) });
            }
        }
    }
    // The tail's lanes (p >= 0, so the zero lanes leave the sums as they are).
    let mut lanes = [0f32; 16];
    // SAFETY: lanes holds 16 values.
    unsafe {
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc[0]);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc[1]);
    }
    for (t, &x) in s.iter().enumerate().skip(n8) {
        lanes[t % 16] += x;
    }
    (m, super::hsum_scalar(lanes))
}

use super::{AHEAD, Block, Exp, KvRows, Q8_BLOCK, ScoreRule, Split, TB, part_len};
use crate::attn::avx512::{dot_rows as dot_rows_f32, hsum16};
use std::arch::x86_64::*;

/// Rows row0..row0 + n, values off..off + width, as f32: in place for f32, else converted
/// into `tile` [n, width]. Also prefetches the rows AHEAD further on.
///
/// # Safety
/// AVX-512 F available; the rows lie inside `src` (checked by `super::check`); for 8-bit,
/// stride, off and width are multiples of Q8_BLOCK; tile holds n · width values.
#[target_feature(enable = "avx512f,fma")]
unsafe fn block(src: KvRows, stride: usize, off: usize, width: usize, row0: usize, n: usize, tile: &mut [f32]) -> Block {
    super::prefetch(src, stride, off, width, row0 + AHEAD, row0 + AHEAD + n);
    let whole = width / 16 * 16;
    match src {
        KvRows::F32(x) => Block { ptr: x[row0 * stride + off..].as_ptr(), stride },
        KvRows::F16(x) => {
            for t in 0..n {
                let base = (row0 + t) * stride + off;
                let dst = &mut tile[t * width..(t + 1) * width];
                for j in (0..whole).step_by(16) {
                    // SAFETY: base + j + 16 <= base + width lies inside x; 16 f16 = 256 bits.
                    unsafe {
                        let h = _mm256_loadu_si256(x.as_ptr().add(base + j) as *const __m256i);
                        _mm512_storeu_ps(dst.as_mut_ptr().add(j), _mm512_cvtph_ps(h));
                    }
                }
                for j in whole..width {
                    dst[j] = x[base + j].to_f32();
                }
            }
            Block { ptr: tile.as_ptr(), stride: width }
        }
        KvRows::Q8 { q, d } => {
            for t in 0..n {
                let base = (row0 + t) * stride + off;
                let dst = &mut tile[t * width..(t + 1) * width];
                // width is a multiple of 32 (checked): 16 values never straddle two blocks.
                for j in (0..width).step_by(16) {
                    let sc = _mm512_set1_ps(d[(base + j) / Q8_BLOCK]);
                    // SAFETY: base + j + 16 <= base + width lies inside q; 16 i8 = 128 bits.
                    unsafe {
                        let b = _mm_loadu_si128(q.as_ptr().add(base + j) as *const __m128i);
                        let f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
                        _mm512_storeu_ps(dst.as_mut_ptr().add(j), _mm512_mul_ps(f, sc));
                    }
                }
            }
            Block { ptr: tile.as_ptr(), stride: width }
        }
    }
}

/// # Safety
/// AVX-512 F and FMA available; arguments as `super::check` accepts them.
#[target_feature(enable = "avx512f,fma")]
pub unsafe fn attend_split(
    q: &[f32],
    hd: usize,
    group: usize,
    s: &Split,
    rule: &ScoreRule,
    scratch: &mut Vec<f32>,
    out: &mut [f32],
) {
    let (nq, n) = (q.len() / hd, s.n);
    let kvc = nq / group; // kv heads the heads read
    let width = kvc * hd;
    let need = nq * n + TB * width + nq * TB;
    if scratch.len() < need {
        scratch.resize(need, 0.0);
    }
    let (scores, rest) = scratch.split_at_mut(nq * n); // [nq, n]
    let (tile, blk) = rest.split_at_mut(TB * width); // [TB, width], [group, TB]
    // The split's first rows (`block` prefetches AHEAD of the block it reads, from the
    // second on): a split starts where the last one left the cache.
    super::prefetch(s.keys, s.stride, s.off, width, s.row0, s.row0 + AHEAD.min(n));
    // Scores, a block of rows at a time (all kv heads of the row: one contiguous read).
    for t0 in (0..n).step_by(TB) {
        let nt = TB.min(n - t0);
        // The same rows' values, for the weighted sums' pass (into L2 meanwhile).
        super::prefetch_l2(s.vals, s.stride, s.off, width, s.row0 + t0, s.row0 + t0 + nt);
        // SAFETY: rows s.row0 + t0 .. + nt lie inside the keys (checked); tile holds TB · width.
        let b = unsafe { block(s.keys, s.stride, s.off, width, s.row0 + t0, nt, tile) };
        for j in 0..kvc {
            let qj = &q[j * group * hd..(j + 1) * group * hd];
            // SAFETY: the block's nt rows hold width values from b.ptr, kv head j at j·hd.
            unsafe { scores_block(qj, hd, b.ptr.add(j * hd), b.stride, nt, &mut scores[j * group * n..], n, t0, blk) };
        }
    }
    for (sh, oh) in scores.chunks_exact_mut(n).zip(out.chunks_exact_mut(part_len(hd))) {
        sh.iter_mut().for_each(|x| *x = rule.score(*x));
        // SAFETY: AVX-512 F and FMA available.
        let (m, l) = unsafe { softmax_part(sh, rule.exp) };
        oh[0] = m;
        oh[1] = l;
        oh[2..].fill(0.0);
    }
    // Weighted sums, the same blocks of value rows.
    for t0 in (0..n).step_by(TB) {
        let nt = TB.min(n - t0);
        // SAFETY: rows s.row0 + t0 .. + nt lie inside the values (checked).
        let b = unsafe { block(s.vals, s.stride, s.off, width, s.row0 + t0, nt, tile) };
        for j in 0..kvc {
            let heads = j * group..(j + 1) * group;
            let oj = &mut out[heads.start * part_len(hd)..heads.end * part_len(hd)];
            let pj = &scores[heads.start * n..heads.end * n];
            // SAFETY: the block's nt rows hold width values from b.ptr, kv head j at j·hd.
            unsafe { accumulate_block(pj, n, t0, nt, b.ptr.add(j * hd), b.stride, hd, oj) };
        }
    }
}

/// Scores of the heads q [g, hd] against nt <= 16 rows `stride` apart from `rows`:
/// out[h * ldo + t0 + t]. The common head sizes keep q in registers per head and take 16
/// scores per transposed horizontal sum; others go through `attn::dot_rows` (the same
/// arithmetic) into `blk`.
///
/// # Safety
/// AVX-512 F and FMA; rows valid for (nt - 1) · stride + hd reads; out holds g rows of ldo
/// with t0 + nt <= ldo; blk holds g · 16.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,fma")]
unsafe fn scores_block(
    q: &[f32],
    hd: usize,
    rows: *const f32,
    stride: usize,
    nt: usize,
    out: &mut [f32],
    ldo: usize,
    t0: usize,
    blk: &mut [f32],
) {
    // SAFETY (whole block): forwarded.
    unsafe {
        match hd {
            64 => scores_hd::<4>(q, rows, stride, nt, out, ldo, t0),
            128 => scores_hd::<8>(q, rows, stride, nt, out, ldo, t0),
            256 => scores_hd::<16>(q, rows, stride, nt, out, ldo, t0),
            _ => {
                let g = q.len() / hd;
                let rows = std::slice::from_raw_parts(rows, (nt - 1) * stride + hd);
                dot_rows_f32(q, hd, rows, stride, nt, &mut blk[..g * nt]);
                for h in 0..g {
                    out[h * ldo + t0..h * ldo + t0 + nt].copy_from_slice(&blk[h * nt..(h + 1) * nt]);
                }
            }
        }
    }
}

/// `dot::avx512::parts` of one q row (in registers) and one key row, hd = 16·NV.
///
/// # Safety
/// AVX-512 F and FMA; r valid for 16·NV reads.
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn parts_q<const NV: usize>(qv: &[__m512; NV], r: *const f32) -> __m512 {
    let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut c = 0;
    // SAFETY (whole block): chunk c < NV lies inside the row.
    unsafe {
        while c + 2 <= NV {
            a0 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(r.add(16 * c)), a0);
            a1 = _mm512_fmadd_ps(qv[c + 1], _mm512_loadu_ps(r.add(16 * c + 16)), a1);
            c += 2;
        }
        if c < NV {
            a0 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(r.add(16 * c)), a0);
        }
    }
    _mm512_add_ps(a0, a1)
}

/// `parts_q` of two q rows (in registers) against one key row, each key vector loaded once
/// for both: the same two chains per head, in the same order.
///
/// # Safety
/// AVX-512 F and FMA; r valid for 16·NV reads.
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn parts_q2<const NV: usize>(qa: &[__m512; NV], qb: &[__m512; NV], r: *const f32) -> (__m512, __m512) {
    let (mut a0, mut a1, mut b0, mut b1) = (_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps());
    let mut c = 0;
    // SAFETY (whole block): chunk c < NV lies inside the row.
    unsafe {
        while c + 2 <= NV {
            let (k0, k1) = (_mm512_loadu_ps(r.add(16 * c)), _mm512_loadu_ps(r.add(16 * c + 16)));
            a0 = _mm512_fmadd_ps(qa[c], k0, a0);
            a1 = _mm512_fmadd_ps(qa[c + 1], k1, a1);
            b0 = _mm512_fmadd_ps(qb[c], k0, b0);
            b1 = _mm512_fmadd_ps(qb[c + 1], k1, b1);
            c += 2;
        }
        if c < NV {
            let k0 = _mm512_loadu_ps(r.add(16 * c));
            a0 = _mm512_fmadd_ps(qa[c], k0, a0);
            b0 = _mm512_fmadd_ps(qb[c], k0, b0);
        }
    }
    (_mm512_add_ps(a0, a1), _mm512_add_ps(b0, b1))
}

/// `scores_block` for hd = 16·NV.
///
/// # Safety
/// As `scores_block`.
#[target_feature(enable = "avx512f,fma")]
unsafe fn scores_hd<const NV: usize>(
    q: &[f32],
    rows: *const f32,
    stride: usize,
    nt: usize,
    out: &mut [f32],
    ldo: usize,
    t0: usize,
) {
    let hd = 16 * NV;
    let g = q.len() / hd;
    let mut h0 = 0;
    if NV == 4 && nt == 16 {
        // Head size 64: two heads at a time, 8 rows per transposed sum, each key vector
        // loaded once for both (q of both heads in 8 registers). The same parts and the
        // same per-lane tree: hsum16's lanes do not depend on each other. `rows` opaque for
        // the reason the one-head loop below gives (reloads from L1, not spilled hoists).
        let rows = std::hint::black_box(rows);
        while h0 + 2 <= g {
            let mut qa = [_mm512_setzero_ps(); NV];
            let mut qb = [_mm512_setzero_ps(); NV];
            for c in 0..NV {
                // SAFETY: heads h0 and h0 + 1 have hd values each in q.
                unsafe {
                    qa[c] = _mm512_loadu_ps(q.as_ptr().add(h0 * hd + 16 * c));
                    qb[c] = _mm512_loadu_ps(q.as_ptr().add((h0 + 1) * hd + 16 * c));
                }
            }
            for b in [0, 8] {
                let mut v = [_mm512_setzero_ps(); 16];
                for i in 0..8 {
                    // SAFETY: row b + i < nt = 16.
                    (v[i], v[8 + i]) = unsafe { parts_q2(&qa, &qb, rows.add((b + i) * stride)) };
                }
                let r = hsum16(v);
                // SAFETY: lanes 0..8 go to out[h0 ldo + t0 + b..][..8], lanes 8..16 to
                // out[(h0 + 1) ldo + t0 + b..][..8], inside out (t0 + 16 <= ldo).
                unsafe {
                    let o = out.as_mut_ptr();
                    _mm256_storeu_ps(o.add(h0 * ldo + t0 + b), _mm512_castps512_ps256(r));
                    let hi = _mm512_castps512_ps256(_mm512_shuffle_f32x4::<0b11_10_11_10>(r, r));
                    _mm256_storeu_ps(o.add((h0 + 1) * ldo + t0 + b), hi);
                }
            }
            h0 += 2;
        }
    }
    // No closures here: they would not inherit the target features (each intrinsic a call).
    let mut qv = [_mm512_setzero_ps(); NV];
    for h in h0..g {
        for (c, x) in qv.iter_mut().enumerate() {
            // SAFETY: head h has hd values in q.
            *x = unsafe { _mm512_loadu_ps(q.as_ptr().add(h * hd + 16 * c)) };
        }
        if nt == 16 {
            // Opaque per head, so the compiler reloads the block's rows from L1 rather than
            // hoisting all of them out of the head loop into spilled registers.
            let rows = std::hint::black_box(rows);
            // Wide heads (q in 16 registers) sum 8 rows at a time: hsum16's lanes of a
            // row do not depend on the other rows', zeros stand in for the missing 8.
            let batch = if NV <= 8 { 16 } else { 8 };
            for b in (0..16).step_by(batch) {
                let mut v = [_mm512_setzero_ps(); 16];
                for (i, x) in v.iter_mut().enumerate().take(batch) {
                    // SAFETY: row b + i < nt.
                    *x = unsafe { parts_q(&qv, rows.add((b + i) * stride)) };
                }
                let m: __mmask16 = if batch == 16 { 0xffff } else { 0x00ff };
                // SAFETY: out[h ldo + t0 + b..][..batch] is inside out (t0 + 16 <= ldo).
                unsafe { _mm512_mask_storeu_ps(out.as_mut_ptr().add(h * ldo + t0 + b), m, hsum16(v)) };
            }
        } else {
            for t in 0..nt {
                // SAFETY: row t < nt.
                out[h * ldo + t0 + t] = crate::dot::avx512::hsum(unsafe { parts_q(&qv, rows.add(t * stride)) });
            }
        }
    }
}

/// out[h][2 + d] = fma(p[h][t0 + t], rows[t][d], ·) for t < nt in order, for the heads of
/// out ([g, hd + 2]); p is [g, n]. The common head sizes keep HG heads' sums in registers
/// and load each value row once for them.
///
/// # Safety
/// AVX-512 F and FMA; rows valid for (nt - 1) · stride + hd reads; t0 + nt <= n.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,fma")]
unsafe fn accumulate_block(
    p: &[f32],
    n: usize,
    t0: usize,
    nt: usize,
    rows: *const f32,
    stride: usize,
    hd: usize,
    out: &mut [f32],
) {
    let g = out.len() / part_len(hd);
    // SAFETY (whole block): forwarded; each call's heads are < g.
    unsafe {
        match hd {
            64 => {
                let mut h = 0;
                while h + 4 <= g {
                    acc_heads::<4, 4>(p, n, t0, nt, rows, stride, out, h, 0);
                    h += 4;
                }
                match g - h {
                    3 => acc_heads::<4, 3>(p, n, t0, nt, rows, stride, out, h, 0),
                    2 => acc_heads::<4, 2>(p, n, t0, nt, rows, stride, out, h, 0),
                    1 => acc_heads::<4, 1>(p, n, t0, nt, rows, stride, out, h, 0),
                    _ => {}
                }
            }
            128 => {
                let mut h = 0;
                while h + 2 <= g {
                    acc_heads::<8, 2>(p, n, t0, nt, rows, stride, out, h, 0);
                    h += 2;
                }
                if h < g {
                    acc_heads::<8, 1>(p, n, t0, nt, rows, stride, out, h, 0);
                }
            }
            256 => {
                // Two halves of 128 values: two heads' sums fit the registers beside the
                // row, which is loaded once for both.
                for col in [0, 128] {
                    let mut h = 0;
                    while h + 2 <= g {
                        acc_heads::<8, 2>(p, n, t0, nt, rows, stride, out, h, col);
                        h += 2;
                    }
                    if h < g {
                        acc_heads::<8, 1>(p, n, t0, nt, rows, stride, out, h, col);
                    }
                }
            }
            _ => accumulate_any(p, n, t0, nt, rows, stride, hd, out),
        }
    }
}

/// Heads h0..h0 + HG of `accumulate_block`, values col..col + 16·NV of each: their sums
/// loaded into registers, one fma per row and vector in row order, stored back.
///
/// # Safety
/// As `accumulate_block`; heads h0..h0 + HG are in out; col + 16·NV <= hd.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn acc_heads<const NV: usize, const HG: usize>(
    p: &[f32],
    n: usize,
    t0: usize,
    nt: usize,
    rows: *const f32,
    stride: usize,
    out: &mut [f32],
    h0: usize,
    col: usize,
) {
    let pl = out.len() / (p.len() / n);
    let op = out.as_mut_ptr();
    // No closures here: they would not inherit the target features (each intrinsic a call).
    let mut acc = [[_mm512_setzero_ps(); NV]; HG];
    let mut vv = [_mm512_setzero_ps(); NV];
    for (h, ah) in acc.iter_mut().enumerate() {
        for (c, a) in ah.iter_mut().enumerate() {
            // SAFETY: head h0 + h has pl values in out, its sums from offset 2.
            *a = unsafe { _mm512_loadu_ps(op.add((h0 + h) * pl + 2 + col + 16 * c)) };
        }
    }
    for t in 0..nt {
        if NV * (HG + 1) <= 28 {
            // The row in registers, shared by the HG heads.
            for (c, x) in vv.iter_mut().enumerate() {
                // SAFETY: row t < nt.
                *x = unsafe { _mm512_loadu_ps(rows.add(t * stride + col + 16 * c)) };
            }
            for (h, ah) in acc.iter_mut().enumerate() {
                let pb = _mm512_set1_ps(p[(h0 + h) * n + t0 + t]);
                for (a, &v) in ah.iter_mut().zip(&vv) {
                    *a = _mm512_fmadd_ps(pb, v, *a);
                }
            }
        } else {
            // Too wide to hold the row beside the sums: each fma loads its vector.
            for (h, ah) in acc.iter_mut().enumerate() {
                let pb = _mm512_set1_ps(p[(h0 + h) * n + t0 + t]);
                for (c, a) in ah.iter_mut().enumerate() {
                    // SAFETY: row t < nt.
                    *a = _mm512_fmadd_ps(pb, unsafe { _mm512_loadu_ps(rows.add(t * stride + col + 16 * c)) }, *a);
                }
            }
        }
    }
    for (h, ah) in acc.iter().enumerate() {
        for (c, a) in ah.iter().enumerate() {
            // SAFETY: as the loads above.
            unsafe { _mm512_storeu_ps(op.add((h0 + h) * pl + 2 + col + 16 * c), *a) };
        }
    }
}

/// `accumulate_block` for any head size: 8 vectors of a head's sums at a time, the tail
/// masked.
///
/// # Safety
/// As `accumulate_block`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,fma")]
unsafe fn accumulate_any(p: &[f32], n: usize, t0: usize, nt: usize, rows: *const f32, stride: usize, hd: usize, out: &mut [f32]) {
    const W: usize = 8;
    for (h, oh) in out.chunks_exact_mut(part_len(hd)).enumerate() {
        let acc_row = &mut oh[2..];
        let ph = &p[h * n + t0..h * n + t0 + nt];
        for c0 in (0..hd).step_by(16 * W) {
            let nv = (hd - c0).div_ceil(16).min(W);
            let mut masks = [0u16; W];
            for (i, m) in masks.iter_mut().enumerate().take(nv) {
                let rem = hd - c0 - 16 * i;
                *m = if rem >= 16 { 0xffff } else { ((1u32 << rem) - 1) as u16 };
            }
            let mut acc = [_mm512_setzero_ps(); W];
            for (i, a) in acc.iter_mut().enumerate().take(nv) {
                // SAFETY: masked load of acc_row[c0 + 16i..], lanes < hd - c0 - 16i.
                *a = unsafe { _mm512_maskz_loadu_ps(masks[i], acc_row.as_ptr().add(c0 + 16 * i)) };
            }
            for (t, &pt) in ph.iter().enumerate() {
                let pv = _mm512_set1_ps(pt);
                for (i, a) in acc.iter_mut().enumerate().take(nv) {
                    // SAFETY: row t < nt; lanes masked to < hd.
                    let x = unsafe { _mm512_maskz_loadu_ps(masks[i], rows.add(t * stride + c0 + 16 * i)) };
                    *a = _mm512_fmadd_ps(pv, x, *a);
                }
            }
            for (i, a) in acc.iter().enumerate().take(nv) {
                // SAFETY: masked store to acc_row[c0 + 16i..], lanes < hd - c0 - 16i.
                unsafe { _mm512_mask_storeu_ps(acc_row.as_mut_ptr().add(c0 + 16 * i), masks[i], *a) };
            }
        }
    }
}

/// m, p = exp(s − m) in place, l: `super::softmax_part_scalar`'s arithmetic on 16 lanes.
///
/// # Safety
/// AVX-512 F and FMA available.
#[target_feature(enable = "avx512f,fma")]
unsafe fn softmax_part(s: &mut [f32], exp: Exp) -> (f32, f32) {
    let m = super::max_of(s);
    let n16 = s.len() / 16 * 16;
    let mut acc = _mm512_setzero_ps();
    match exp {
        Exp::Fast => {
            let mv = _mm512_set1_ps(m);
            for i in (0..n16).step_by(16) {
                // SAFETY: i + 16 <= s.len().
                unsafe {
                    let e = crate::act::avx512::expf16(_mm512_sub_ps(_mm512_loadu_ps(s.as_ptr().add(i)), mv));
                    _mm512_storeu_ps(s.as_mut_ptr().add(i), e);
                    acc = _mm512_add_ps(acc, e);
                }
            }
            s[n16..].iter_mut().for_each(|x| *x = super::expf_ggml(*x - m));
        }
        Exp::Libm => {
            s.iter_mut().for_each(|x| *x = (*x - m).exp());
            for i in (0..n16).step_by(16) {
                // SAFETY: i + 16 <= s.len().
                acc = _mm512_add_ps(acc, unsafe { _mm512_loadu_ps(s.as_ptr().add(i)) });
            }
        }
    }
    if n16 < s.len() {
        let mask = ((1u32 << (s.len() - n16)) - 1) as u16;
        // SAFETY: masked lanes < s.len() - n16.
        acc = _mm512_add_ps(acc, unsafe { _mm512_maskz_loadu_ps(mask, s.as_ptr().add(n16)) });
    }
    (m, crate::dot::avx512::hsum(acc))
}

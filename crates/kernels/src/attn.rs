//! Decode attention's two inner loops over a run of cached positions, for one or several query
//! heads that share a kv head: the scores `q_h · k_t` and the weighted sum `Σ_t p_ht · v_t`.
//!
//! Why not `dot` and `axpy` per position: at the contexts decode mostly runs at (tens to a few
//! thousand positions, head_dim 64-256) a call per (head, position) spends more on the call,
//! the horizontal sum and reloading the output row than on the arithmetic; a 4-sequence decode
//! batch of Qwen2.5-0.5B spent 13% of its step there. Here the scores of 16 positions share one
//! transposed horizontal sum and the weighted sum keeps the output row in registers.
//!
//! Both loops give bit for bit the values of the per-position calls they replace, so every path
//! that attends (decode, short prompt chunks, the batch) keeps one arithmetic:
//! - `dot_rows`: each score is `dot(q_h, k_t)` — the same lane sums (`dot::avx512::parts`) and
//!   the same summation tree (`dot::avx512::hsum`: lanes (i, i+8), (i, i+4), (i, i+2), (0, 1)),
//!   done for 16 positions at once with shuffles that pair exactly those lanes.
//! - `axpy_rows`: each output element is `((o + p_0 v_0) + p_1 v_1) + ...` in position order, a
//!   rounded multiply then a rounded add per term, as `axpy` computes it.
//!
//! The scalar twins are `dot_scalar` per pair (a different summation order: compared with a
//! tolerance) and the same sequential multiply-add (compared bit for bit).

use crate::dot::{axpy_scalar, dot_scalar};
use crate::simd::{Level, level};

#[track_caller]
fn check(what: &str, g: usize, hd: usize, rows: &[f32], stride: usize, n: usize) {
    assert!(hd > 0 && stride >= hd, "{what}: head_dim {hd}, row stride {stride}");
    assert!(
        n == 0 || rows.len() >= (n - 1) * stride + hd,
        "{what}: {n} rows of stride {stride} need {} values, got {}",
        (n - 1) * stride + hd,
        rows.len()
    );
    assert!(g > 0, "{what}: no heads");
}

/// `out[h * n + t] = dot(q[h * hd..][..hd], keys[t * stride..][..hd])` for the g = q.len() / hd
/// query heads and n key rows `stride` apart (a kv head's slice of the cache). Bit-identical to
/// `dot` per pair.
#[track_caller]
pub fn dot_rows(q: &[f32], hd: usize, keys: &[f32], stride: usize, n: usize, out: &mut [f32]) {
    let g = q.len() / hd.max(1);
    check("dot_rows", g, hd, keys, stride, n);
    assert!(
        q.len() == g * hd && out.len() == g * n,
        "dot_rows: q {} values for head_dim {hd}, out {} for {g} x {n}",
        q.len(),
        out.len()
    );
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: level() returned Avx512 only after detecting avx512f and fma; lengths checked.
        Level::Avx512 => unsafe { avx512::dot_rows(q, hd, keys, stride, n, out) },
        _ => dot_rows_scalar(q, hd, keys, stride, n, out),
    }
}

/// Scalar twin of `dot_rows`: `dot_scalar` per pair.
#[track_caller]
pub fn dot_rows_scalar(q: &[f32], hd: usize, keys: &[f32], stride: usize, n: usize, out: &mut [f32]) {
    let g = q.len() / hd.max(1);
    check("dot_rows_scalar", g, hd, keys, stride, n);
    assert!(q.len() == g * hd && out.len() == g * n, "dot_rows_scalar: q {} values, out {}", q.len(), out.len());
    for (qh, oh) in q.chunks_exact(hd).zip(out.chunks_exact_mut(n.max(1))) {
        for (t, o) in oh.iter_mut().enumerate().take(n) {
            *o = dot_scalar(qh, &keys[t * stride..t * stride + hd]);
        }
    }
}

/// `out[h * hd..][..hd] += Σ_t p[h * n + t] · vals[t * stride..][..hd]` for the g = p.len() / n
/// heads, term by term in position order with `axpy`'s rounding (a multiply, then an add).
#[track_caller]
pub fn axpy_rows(p: &[f32], n: usize, vals: &[f32], stride: usize, hd: usize, out: &mut [f32]) {
    let g = out.len() / hd.max(1);
    check("axpy_rows", g, hd, vals, stride, n);
    assert!(
        out.len() == g * hd && p.len() == g * n,
        "axpy_rows: out {} values for head_dim {hd}, p {} for {g} x {n}",
        out.len(),
        p.len()
    );
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: level() returned Avx512 only after detecting avx512f; lengths checked.
        Level::Avx512 => unsafe { avx512::axpy_rows(p, n, vals, stride, hd, out) },
        _ => axpy_rows_scalar(p, n, vals, stride, hd, out),
    }
}

/// Scalar twin of `axpy_rows`: `axpy_scalar` per term.
#[track_caller]
pub fn axpy_rows_scalar(p: &[f32], n: usize, vals: &[f32], stride: usize, hd: usize, out: &mut [f32]) {
    let g = out.len() / hd.max(1);
    check("axpy_rows_scalar", g, hd, vals, stride, n);
    assert!(out.len() == g * hd && p.len() == g * n, "axpy_rows_scalar: out {} values, p {}", out.len(), p.len());
    for (h, oh) in out.chunks_exact_mut(hd).enumerate() {
        for t in 0..n {
            axpy_scalar(p[h * n + t], &vals[t * stride..t * stride + hd], oh);
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use crate::dot::avx512::{hsum, parts};
    use std::arch::x86_64::*;

    /// The 16 horizontal sums of `v[0..16]` in `hsum`'s tree, lane t = hsum(v[t]).
    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    pub(crate) fn hsum16(v: [__m512; 16]) -> __m512 {
        // (i, i + 8): pair keys 2p and 2p + 1 in one register, lanes 0..8 and 8..16.
        let s: [__m512; 8] = std::array::from_fn(|p| {
            let (a, b) = (v[2 * p], v[2 * p + 1]);
            _mm512_add_ps(_mm512_shuffle_f32x4::<0b01_00_01_00>(a, b), _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b))
        });
        // (i, i + 4): 128-bit chunk c of t[m] = key 4m + c.
        let t: [__m512; 4] = std::array::from_fn(|m| {
            let (a, b) = (s[2 * m], s[2 * m + 1]);
            _mm512_add_ps(_mm512_shuffle_f32x4::<0b10_00_10_00>(a, b), _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b))
        });
        // (i, i + 2): chunk c of z[n], lanes 0-1 = key 8n + c, lanes 2-3 = key 8n + 4 + c.
        let z: [__m512; 2] = std::array::from_fn(|n| {
            let (a, b) = (t[2 * n], t[2 * n + 1]);
            _mm512_add_ps(_mm512_shuffle_ps::<0x44>(a, b), _mm512_shuffle_ps::<0xEE>(a, b))
        });
        // (0, 1): lane 4c + i = key 4i + c; then put key t at lane t.
        let r = _mm512_add_ps(_mm512_shuffle_ps::<0x88>(z[0], z[1]), _mm512_shuffle_ps::<0xDD>(z[0], z[1]));
        let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        _mm512_permutexvar_ps(idx, r)
    }

    /// Positions per transposed horizontal sum.
    const TB: usize = 16;

    /// # Safety
    /// AVX-512 F and FMA available; lengths as `super::dot_rows` checks them.
    #[target_feature(enable = "avx512f,fma")]
    pub unsafe fn dot_rows(q: &[f32], hd: usize, keys: &[f32], stride: usize, n: usize, out: &mut [f32]) {
        // SAFETY: forwarded; the common head sizes get their own unrolled copy.
        unsafe {
            match hd {
                64 => dot_rows_hd::<64>(q, hd, keys, stride, n, out),
                128 => dot_rows_hd::<128>(q, hd, keys, stride, n, out),
                256 => dot_rows_hd::<256>(q, hd, keys, stride, n, out),
                _ => dot_rows_hd::<0>(q, hd, keys, stride, n, out),
            }
        }
    }

    /// `dot_rows` for head size HD (0: the run-time `hd`).
    ///
    /// # Safety
    /// As `dot_rows`; HD is 0 or equals hd.
    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn dot_rows_hd<const HD: usize>(q: &[f32], hd: usize, keys: &[f32], stride: usize, n: usize, out: &mut [f32]) {
        let hd = if HD == 0 { hd } else { HD };
        let g = q.len() / hd;
        // Blocks of 16 positions outer, heads inner: the block's key rows (16 × hd values) stay
        // in L1 for every head. Over the whole run they would not: a cache that holds several kv
        // heads side by side puts a head's rows a multiple of 512 bytes apart, which maps them
        // onto a fraction of L1's sets (7 heads over 110 positions: 4.3 -> 2.6 ns per pair).
        let mut t0 = 0;
        while t0 + TB <= n {
            for (h, qh) in q.chunks_exact(hd).enumerate() {
                // Opaque per head, so the compiler reloads the block's rows from L1 rather than
                // hoisting all of them out of the head loop into spilled registers.
                let kp = std::hint::black_box(keys.as_ptr());
                let mut v = [_mm512_setzero_ps(); TB];
                for (i, v) in v.iter_mut().enumerate() {
                    // SAFETY: key rows t0..t0 + 16 < n start at t * stride and have hd values
                    // inside keys (checked: keys.len() >= (n - 1) * stride + hd); qh has hd.
                    *v = unsafe { parts(qh.as_ptr(), kp.add((t0 + i) * stride), hd) };
                }
                // SAFETY: out[h n + t0..h n + t0 + 16] is in bounds (t0 + 16 <= n, h < g).
                unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(h * n + t0), hsum16(v)) };
            }
            t0 += TB;
        }
        let kp = keys.as_ptr();
        for h in 0..g {
            let qh = &q[h * hd..(h + 1) * hd];
            for t in t0..n {
                // SAFETY: as above, row t < n.
                out[h * n + t] = hsum(unsafe { parts(qh.as_ptr(), kp.add(t * stride), hd) });
            }
        }
    }

    /// # Safety
    /// AVX-512 F available; lengths as `super::axpy_rows` checks them.
    #[target_feature(enable = "avx512f,fma")]
    pub unsafe fn axpy_rows(p: &[f32], n: usize, vals: &[f32], stride: usize, hd: usize, out: &mut [f32]) {
        // SAFETY: forwarded; the common head sizes get their own unrolled copy.
        unsafe {
            match hd {
                64 => axpy_rows_hd::<64>(p, n, vals, stride, hd, out),
                128 => axpy_rows_hd::<128>(p, n, vals, stride, hd, out),
                256 => axpy_rows_hd::<256>(p, n, vals, stride, hd, out),
                _ => axpy_rows_hd::<0>(p, n, vals, stride, hd, out),
            }
        }
    }

    /// `axpy_rows` for head size HD (0: the run-time `hd`).
    ///
    /// # Safety
    /// As `axpy_rows`; HD is 0 or equals hd.
    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn axpy_rows_hd<const HD: usize>(p: &[f32], n: usize, vals: &[f32], stride: usize, hd: usize, out: &mut [f32]) {
        const W: usize = 8; // vectors of a row kept in registers at once
        let hd = if HD == 0 { hd } else { HD };
        // Blocks of 16 positions outer, heads inner, as in dot_rows: the block's value rows stay
        // in L1 for every head; each head's output row is loaded and stored once per block.
        for t0 in (0..n).step_by(TB) {
            let t1 = (t0 + TB).min(n);
            for (h, oh) in out.chunks_exact_mut(hd).enumerate() {
                let vp = std::hint::black_box(vals.as_ptr());
                let ph = &p[h * n + t0..h * n + t1];
                for c0 in (0..hd).step_by(16 * W) {
                    let nv = (hd - c0).div_ceil(16).min(W);
                    let mask = |i: usize| -> __mmask16 {
                        let rem = hd - c0 - 16 * i;
                        if rem >= 16 { 0xffff } else { ((1u32 << rem) - 1) as u16 }
                    };
                    let mut acc = [_mm512_setzero_ps(); W];
                    for (i, a) in acc.iter_mut().enumerate().take(nv) {
                        // SAFETY: masked load of oh[c0 + 16i..] lanes < hd - c0 - 16i, in bounds.
                        *a = unsafe { _mm512_maskz_loadu_ps(mask(i), oh.as_ptr().add(c0 + 16 * i)) };
                    }
                    for (t, &pt) in (t0..t1).zip(ph) {
                        let pv = _mm512_set1_ps(pt);
                        for (i, a) in acc.iter_mut().enumerate().take(nv) {
                            // SAFETY: row t < n lies inside vals (checked); lanes masked to < hd.
                            let x = unsafe { _mm512_maskz_loadu_ps(mask(i), vp.add(t * stride + c0 + 16 * i)) };
                            *a = _mm512_add_ps(*a, _mm512_mul_ps(pv, x));
                        }
                    }
                    for (i, a) in acc.iter().enumerate().take(nv) {
                        // SAFETY: masked store to oh[c0 + 16i..], lanes < hd - c0 - 16i.
                        unsafe { _mm512_mask_storeu_ps(oh.as_mut_ptr().add(c0 + 16 * i), mask(i), *a) };
                    }
                }
            }
        }
    }
}

//! Attention scores over a run of cached positions for one or several query heads that share
//! a kv head: `dot_rows`, `q_h · k_t` for 16 positions per transposed horizontal sum. The
//! decode kernel (`kvattn`) takes its scores from here for head sizes it does not specialise,
//! and its own specialised loops follow the same arithmetic.
//!
//! Why not `dot` per position: a call per (head, position) spends more on the call and the
//! horizontal sum than on the arithmetic at decode's head sizes (64-256). Each score is
//! `dot(q_h, k_t)` bit for bit — the same lane sums (`dot::avx512::parts`) and the same
//! summation tree (`dot::avx512::hsum`: lanes (i, i+8), (i, i+4), (i, i+2), (0, 1)), done for 16
//! positions at once with shuffles that pair exactly those lanes. The scalar twin is
//! `dot_scalar` per pair (a different summation order: compared with a tolerance).

use crate::dot::dot_scalar;
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
}

//! f32 dot products and the dot-product-form matrix kernel `y[t, r] = x[t, :] · w[r, :]`.
//!
//! Both operands are row-major along K, which is how weights are stored (GGUF and HF) and how
//! activations come out of the previous op, so no transposes are needed. The microkernel works on
//! 4 tokens × 4 weight rows at a time: 8 vector loads feed 16 FMAs per 16 lanes of K. Callers
//! (the engine's QTensor) dequantize a tile of weight rows into f32 once and reuse it across all
//! tokens of a prefill chunk, which is where prefill time goes (~90% of it).

use crate::simd::{Level, level};

/// Scalar reference dot product (kept forever as the SIMD twin's oracle).
pub fn dot_scalar(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    // Eight independent partial sums, like the SIMD version's lanes, keep error growth similar.
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += a[c * 8 + l] * b[c * 8 + l];
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for i in chunks * 8..a.len() {
        s += a[i] * b[i];
    }
    s
}

/// Dot product, SIMD chosen at run time.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: level() returned Avx512 only after is_x86_feature_detected!("avx512f").
        Level::Avx512 => unsafe { avx512::dot(a, b) },
        _ => dot_scalar(a, b),
    }
}

/// `y[t*ldy + r] = dot(x[t*k..][..k], w[r*k..][..k])` for t < n_t, r < n_r. Scalar reference.
pub fn gemm_nt_scalar(x: &[f32], n_t: usize, w: &[f32], n_r: usize, k: usize, y: &mut [f32], ldy: usize) {
    check_gemm(x, n_t, w, n_r, k, y, ldy);
    for t in 0..n_t {
        for r in 0..n_r {
            y[t * ldy + r] = dot_scalar(&x[t * k..(t + 1) * k], &w[r * k..(r + 1) * k]);
        }
    }
}

/// `y[t*ldy + r] = x[t] · w[r]`, SIMD chosen at run time. Single-threaded; callers split rows.
pub fn gemm_nt(x: &[f32], n_t: usize, w: &[f32], n_r: usize, k: usize, y: &mut [f32], ldy: usize) {
    check_gemm(x, n_t, w, n_r, k, y, ldy);
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512F detected at run time; bounds checked by check_gemm.
        Level::Avx512 => unsafe { avx512::gemm_nt(x, n_t, w, n_r, k, y, ldy) },
        _ => gemm_nt_scalar(x, n_t, w, n_r, k, y, ldy),
    }
}

fn check_gemm(x: &[f32], n_t: usize, w: &[f32], n_r: usize, k: usize, y: &[f32], ldy: usize) {
    assert!(x.len() >= n_t * k, "gemm_nt: x has {} < {n_t}x{k}", x.len());
    assert!(w.len() >= n_r * k, "gemm_nt: w has {} < {n_r}x{k}", w.len());
    assert!(ldy >= n_r, "gemm_nt: ldy {ldy} < n_r {n_r}");
    assert!(n_t == 0 || y.len() >= (n_t - 1) * ldy + n_r, "gemm_nt: y too small");
}

/// `y[i] += a * x[i]`.
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    // Simple enough that the compiler vectorises it well at the baseline target.
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f,fma")]
    pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc0 = _mm512_setzero_ps();
        let mut acc1 = _mm512_setzero_ps();
        let mut i = 0;
        // SAFETY (whole block): every load reads lanes < n (full vectors below n, masked tail).
        unsafe {
            while i + 32 <= n {
                acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i)), _mm512_loadu_ps(pb.add(i)), acc0);
                acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i + 16)), _mm512_loadu_ps(pb.add(i + 16)), acc1);
                i += 32;
            }
            while i + 16 <= n {
                acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i)), _mm512_loadu_ps(pb.add(i)), acc0);
                i += 16;
            }
            if i < n {
                let m: __mmask16 = (1u32 << (n - i)) as u16 - 1;
                let m = if n - i == 16 { 0xffff } else { m };
                acc1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, pa.add(i)), _mm512_maskz_loadu_ps(m, pb.add(i)), acc1);
            }
        }
        _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1))
    }

    #[inline(always)]
    fn tail_mask(rem: usize) -> __mmask16 {
        if rem >= 16 { 0xffff } else { ((1u32 << rem) - 1) as u16 }
    }

    #[target_feature(enable = "avx512f,fma")]
    pub unsafe fn gemm_nt(x: &[f32], n_t: usize, w: &[f32], n_r: usize, k: usize, y: &mut [f32], ldy: usize) {
        let px = x.as_ptr();
        let pw = w.as_ptr();
        let kfull = k / 16 * 16;
        let mtail = tail_mask(k - kfull);
        let has_tail = kfull < k;
        let mut r = 0;
        while r < n_r {
            let nr = (n_r - r).min(4);
            let mut t = 0;
            while t < n_t {
                let nt = (n_t - t).min(4);
                // acc[i][j]: token t+i, weight row r+j. Rows/tokens beyond the edge reuse the
                // last valid pointer (their results are discarded), keeping the loop branch-free.
                let mut acc = [[_mm512_setzero_ps(); 4]; 4];
                let xr: [*const f32; 4] = std::array::from_fn(|i| unsafe { px.add((t + i.min(nt - 1)) * k) });
                let wr: [*const f32; 4] = std::array::from_fn(|j| unsafe { pw.add((r + j.min(nr - 1)) * k) });
                let mut kk = 0;
                // SAFETY: kk + 16 <= kfull <= k, rows < n_t / n_r, so every load is in bounds.
                unsafe {
                    while kk < kfull {
                        let xv: [__m512; 4] = std::array::from_fn(|i| _mm512_loadu_ps(xr[i].add(kk)));
                        let wv: [__m512; 4] = std::array::from_fn(|j| _mm512_loadu_ps(wr[j].add(kk)));
                        for i in 0..4 {
                            for j in 0..4 {
                                acc[i][j] = _mm512_fmadd_ps(xv[i], wv[j], acc[i][j]);
                            }
                        }
                        kk += 16;
                    }
                    if has_tail {
                        let xv: [__m512; 4] = std::array::from_fn(|i| _mm512_maskz_loadu_ps(mtail, xr[i].add(kk)));
                        let wv: [__m512; 4] = std::array::from_fn(|j| _mm512_maskz_loadu_ps(mtail, wr[j].add(kk)));
                        for i in 0..4 {
                            for j in 0..4 {
                                acc[i][j] = _mm512_fmadd_ps(xv[i], wv[j], acc[i][j]);
                            }
                        }
                    }
                }
                for i in 0..nt {
                    for j in 0..nr {
                        y[(t + i) * ldy + r + j] = _mm512_reduce_add_ps(acc[i][j]);
                    }
                }
                t += 4;
            }
            r += 4;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rnd(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn dot_simd_matches_scalar() {
        for n in [0, 1, 7, 15, 16, 17, 31, 33, 64, 100, 577, 896] {
            let a = rnd(n, 1);
            let b = rnd(n, 2);
            let (s, v) = (dot_scalar(&a, &b), dot(&a, &b));
            let tol = 1e-5 * (n as f32).sqrt().max(1.0);
            assert!((s - v).abs() <= tol, "n={n}: scalar {s} simd {v} diff {}", (s - v).abs());
        }
    }

    #[test]
    fn gemm_simd_matches_scalar() {
        for &(nt, nr, k) in &[(1, 1, 16), (3, 5, 17), (4, 4, 64), (7, 9, 100), (13, 6, 576), (1, 33, 33)] {
            let x = rnd(nt * k, 3);
            let w = rnd(nr * k, 4);
            let ldy = nr + 3;
            let mut ys = vec![0f32; nt * ldy];
            let mut yv = vec![0f32; nt * ldy];
            gemm_nt_scalar(&x, nt, &w, nr, k, &mut ys, ldy);
            gemm_nt(&x, nt, &w, nr, k, &mut yv, ldy);
            let (mut md, mut at) = (0f32, 0);
            for i in 0..ys.len() {
                let d = (ys[i] - yv[i]).abs();
                if d > md {
                    md = d;
                    at = i;
                }
            }
            println!("gemm {nt}x{nr}x{k}: max diff {md:e} at {at}");
            assert!(md <= 1e-5 * (k as f32).sqrt(), "gemm {nt}x{nr}x{k}: max diff {md} at {at}");
        }
    }
}

//! f32 dot products and the dot-product-form matrix kernel `y[t, r] = x[t, :] · w[r, :]`.
//!
//! Both operands are row-major along K, which is how weights are stored (GGUF and HF) and how
//! activations come out of the previous op, so no transposes are needed. The microkernel works on
//! 4 tokens × 4 weight rows at a time: 8 vector loads feed 16 FMAs per 16 lanes of K. Callers
//! (the engine's QTensor) dequantize a tile of weight rows into f32 once and reuse it across all
//! tokens of a prefill chunk, which is where prefill time goes (~90% of it).

use crate::simd::{Level, level};

/// Scalar reference dot product (kept forever as the SIMD twin's oracle).
#[inline(always)]
pub fn dot_scalar(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    // Eight independent partial sums, like the SIMD version's lanes, keep error growth similar;
    // one rounding per product and sum (FMA), as the SIMD kernels.
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] = a[c * 8 + l].mul_add(b[c * 8 + l], acc[l]);
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for i in chunks * 8..a.len() {
        s = a[i].mul_add(b[i], s);
    }
    s
}

/// Little-endian f32 values stored in `b` as a slice of f32, without a copy, where the bytes
/// are 4-byte aligned and a whole number of values (an f32 tensor in a memory map: GGUF aligns
/// tensor data to 32 bytes); `None` otherwise (the caller copies). x86_64 and every other
/// target cortiq builds for are little-endian.
pub fn f32s_of_bytes(b: &[u8]) -> Option<&[f32]> {
    if cfg!(target_endian = "big") {
        return None;
    }
    // SAFETY: every bit pattern is a valid f32 and u8 → f32 reinterpretation changes no byte;
    // align_to hands back only the aligned middle, which is used only when nothing is left over.
    let (head, mid, tail) = unsafe { b.align_to::<f32>() };
    (head.is_empty() && tail.is_empty()).then_some(mid)
}

/// Dot product, SIMD chosen at run time.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: level() returned Avx512 only after is_x86_feature_detected!("avx512f").
        Level::Avx512 => unsafe { avx512::dot(a, b) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: level() returned Avx2 only after detecting avx2, fma and f16c.
        Level::Avx2 => unsafe { avx2::dot(a, b) },
        _ => dot_scalar(a, b),
    }
}

/// `y[t*ldy + r] = dot(x[t*k..][..k], w[r*k..][..k])` for t < n_t, r < n_r. Scalar reference.
#[inline(always)]
pub fn gemm_nt_scalar(x: &[f32], n_t: usize, w: &[f32], n_r: usize, k: usize, y: &mut [f32], ldy: usize) {
    check_gemm(x, n_t, w, n_r, k, y, ldy);
    for t in 0..n_t {
        for r in 0..n_r {
            y[t * ldy + r] = dot_scalar(&x[t * k..(t + 1) * k], &w[r * k..(r + 1) * k]);
        }
    }
}

/// `y[t*ldy + c] = Σ_k x[t*k_len + k] · b[k*ldb + c]` for t < n_t, c < n: x [n_t, k_len] times
/// the [k_len, n] block of b whose rows are `ldb` apart (ldb >= n), both row-major. Scalar
/// reference.
#[allow(clippy::too_many_arguments)]
pub fn gemm_nn_scalar(x: &[f32], n_t: usize, b: &[f32], ldb: usize, k_len: usize, n: usize, y: &mut [f32], ldy: usize) {
    check_gemm_nn(x, n_t, b, ldb, k_len, n, y, ldy);
    for t in 0..n_t {
        let yr = &mut y[t * ldy..t * ldy + n];
        yr.fill(0.0);
        for k in 0..k_len {
            let a = x[t * k_len + k];
            for (yv, &bv) in yr.iter_mut().zip(&b[k * ldb..k * ldb + n]) {
                *yv = a.mul_add(bv, *yv);
            }
        }
    }
}

/// `gemm_nn_scalar` with AVX-512 when available: the attention form (scores = Q·Kᵀ with Kᵀ
/// stored [head_dim, keys], output = P·V with V stored [keys, head_dim]). Each output element
/// is one FMA chain over k in order, as the scalar twin, so the two agree bit for bit. No
/// horizontal sums (the `gemm_nt` microkernel reduces 16 lanes per output, which dominates when
/// k is a 64-wide head). Single-threaded.
#[allow(clippy::too_many_arguments)]
pub fn gemm_nn(x: &[f32], n_t: usize, b: &[f32], ldb: usize, k_len: usize, n: usize, y: &mut [f32], ldy: usize) {
    check_gemm_nn(x, n_t, b, ldb, k_len, n, y, ldy);
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512F detected at run time; bounds checked by check_gemm_nn.
        Level::Avx512 => unsafe { avx512::gemm_nn(x, n_t, b, ldb, k_len, n, y, ldy) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 and FMA detected at run time; bounds checked by check_gemm_nn.
        Level::Avx2 => unsafe { avx2::gemm_nn(x, n_t, b, ldb, k_len, n, y, ldy) },
        _ => gemm_nn_scalar(x, n_t, b, ldb, k_len, n, y, ldy),
    }
}

#[allow(clippy::too_many_arguments)]
#[track_caller]
fn check_gemm_nn(x: &[f32], n_t: usize, b: &[f32], ldb: usize, k_len: usize, n: usize, y: &[f32], ldy: usize) {
    assert!(x.len() >= n_t * k_len, "gemm_nn: x has {} values, needs {n_t}x{k_len}", x.len());
    assert!(ldb >= n, "gemm_nn: ldb {ldb} < n {n}");
    assert!(
        k_len == 0 || b.len() >= (k_len - 1) * ldb + n,
        "gemm_nn: b has {} values, needs {k_len} rows of stride {ldb}",
        b.len()
    );
    assert!(ldy >= n, "gemm_nn: ldy {ldy} < n {n}");
    assert!(n_t == 0 || y.len() >= (n_t - 1) * ldy + n, "gemm_nn: y has {} values, needs {n_t} rows of stride {ldy}", y.len());
}

/// `y[t*ldy + r] = x[t] · w[r]`, SIMD chosen at run time. Single-threaded; callers split rows.
pub fn gemm_nt(x: &[f32], n_t: usize, w: &[f32], n_r: usize, k: usize, y: &mut [f32], ldy: usize) {
    check_gemm(x, n_t, w, n_r, k, y, ldy);
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512F detected at run time; bounds checked by check_gemm.
        Level::Avx512 => unsafe { avx512::gemm_nt(x, n_t, w, n_r, k, y, ldy) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 and FMA detected at run time; bounds checked by check_gemm.
        Level::Avx2 => unsafe { avx2::gemm_nt(x, n_t, w, n_r, k, y, ldy) },
        _ => gemm_nt_scalar(x, n_t, w, n_r, k, y, ldy),
    }
}

fn check_gemm(x: &[f32], n_t: usize, w: &[f32], n_r: usize, k: usize, y: &[f32], ldy: usize) {
    assert!(x.len() >= n_t * k, "gemm_nt: x has {} < {n_t}x{k}", x.len());
    assert!(w.len() >= n_r * k, "gemm_nt: w has {} < {n_r}x{k}", w.len());
    assert!(ldy >= n_r, "gemm_nt: ldy {ldy} < n_r {n_r}");
    assert!(n_t == 0 || y.len() >= (n_t - 1) * ldy + n_r, "gemm_nt: y too small");
}

/// `y[i] += a * x[i]`, SIMD chosen at run time: the same loop built for AVX-512 (16 lanes; the
/// baseline target vectorizes it 4 wide only), elementwise and without contraction into an
/// FMA, so it equals `axpy_scalar` bit for bit. Decode attention's P·V is one axpy per key and
/// head: at 8k keys the 4-wide build was most of a Qwen3.5-like token.
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy: x has {} values, y {}", x.len(), y.len());
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512F detected at run time; the body is safe code.
        Level::Avx512 => unsafe { axpy_avx512(a, x, y) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 detected at run time; the body is safe code.
        Level::Avx2 => unsafe { avx2::axpy(a, x, y) },
        _ => axpy_scalar(a, x, y),
    }
}

/// Scalar twin of `axpy`.
#[inline(always)]
pub fn axpy_scalar(a: f32, x: &[f32], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn axpy_avx512(a: f32, x: &[f32], y: &mut [f32]) {
    axpy_scalar(a, x, y)
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f,fma")]
    pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: a and b have a.len() elements (asserted by the caller).
        hsum(unsafe { parts(a.as_ptr(), b.as_ptr(), a.len()) })
    }

    /// The 16 lane sums of `dot(a[..n], b[..n])` before the horizontal sum: two accumulators
    /// over 32-element steps, then a 16-element step into the first, then a masked tail into
    /// the second. `attn` batches many dot products on exactly this sequence, so its scores are
    /// bit-identical to `dot`.
    ///
    /// # Safety
    /// `pa` and `pb` must be valid for reads of `n` f32 each; AVX-512 F and FMA available.
    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    pub(crate) unsafe fn parts(pa: *const f32, pb: *const f32, n: usize) -> __m512 {
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
        _mm512_add_ps(acc0, acc1)
    }

    /// The horizontal sum in a fixed tree: lanes (i, i + 8), then (i, i + 4), then (i, i + 2),
    /// then (0, 1) — the order `_mm512_reduce_add_ps` lowers to, written out so that `attn`'s
    /// 16-at-once transposed sums can follow it exactly.
    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    pub(crate) fn hsum(v: __m512) -> f32 {
        let hi = _mm512_castps512_ps256(_mm512_shuffle_f32x4::<0b11_10_11_10>(v, v));
        let u = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
        let w = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps::<1>(u));
        let x = _mm_add_ps(w, _mm_movehl_ps(w, w));
        _mm_cvtss_f32(_mm_add_ss(x, _mm_shuffle_ps::<1>(x, x)))
    }

    #[inline(always)]
    fn tail_mask(rem: usize) -> __mmask16 {
        if rem >= 16 { 0xffff } else { ((1u32 << rem) - 1) as u16 }
    }

    /// `gemm_nn`'s microkernel: MR rows of x by 16·NV columns of b, keys in blocks of KC.
    const MR: usize = 8;
    const NV: usize = 2;
    const KC: usize = 128;

    /// MR rows of x by 16·NV columns of b per microkernel step: MR broadcasts + NV loads feed
    /// MR·NV FMAs per k (8 × 2: 16 accumulators, twice the chains both FMA pipes need to stay
    /// busy, 19 of the 32 registers). k runs in blocks of `KC`, the partial sums parked in y
    /// between blocks, so the [KC, 16·NV] block of b a step reads stays in L1 for every row
    /// (the attention's P·V has thousands of keys); each output is still one FMA chain over k
    /// in order, the twin's bits. Column tails are masked, row tails reuse the last valid row
    /// (results discarded).
    ///
    /// # Safety
    /// AVX-512 F available; bounds as `super::check_gemm_nn` checks them.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,fma")]
    pub unsafe fn gemm_nn(x: &[f32], n_t: usize, b: &[f32], ldb: usize, k_len: usize, n: usize, y: &mut [f32], ldy: usize) {
        let (px, pb, py) = (x.as_ptr(), b.as_ptr(), y.as_mut_ptr());
        let mut k0 = 0;
        loop {
            let k1 = (k0 + KC).min(k_len);
            let mut c = 0;
            while c < n {
                let rem = n - c;
                let m: [__mmask16; NV] = std::array::from_fn(|j| tail_mask(rem.saturating_sub(16 * j)));
                let mut t = 0;
                while t < n_t {
                    let nt = (n_t - t).min(MR);
                    let rows: [usize; MR] = std::array::from_fn(|i| t + i.min(nt - 1));
                    let mut acc = [[_mm512_setzero_ps(); NV]; MR];
                    // SAFETY (whole block): rows < n_t, k < k_len, columns c.. masked to < n:
                    // every access is inside x [n_t, k_len], b (k_len rows of stride ldb >= n)
                    // and y (checked by the caller). wrapping_add: with a short tail a later
                    // vector's address may lie past the end; its lanes are all masked off, and
                    // a masked lane is never touched.
                    unsafe {
                        if k0 > 0 {
                            for (i, a) in acc.iter_mut().enumerate() {
                                let yr = py.add(rows[i] * ldy + c);
                                for (j, v) in a.iter_mut().enumerate() {
                                    *v = _mm512_maskz_loadu_ps(m[j], yr.wrapping_add(16 * j));
                                }
                            }
                        }
                        let xr: [*const f32; MR] = std::array::from_fn(|i| px.add(rows[i] * k_len));
                        for k in k0..k1 {
                            let bp = pb.wrapping_add(k * ldb + c);
                            let bv: [__m512; NV] = std::array::from_fn(|j| _mm512_maskz_loadu_ps(m[j], bp.wrapping_add(16 * j)));
                            for (a, &r) in acc.iter_mut().zip(&xr) {
                                let av = _mm512_set1_ps(*r.add(k));
                                for (v, &bj) in a.iter_mut().zip(&bv) {
                                    *v = _mm512_fmadd_ps(av, bj, *v);
                                }
                            }
                        }
                        for (i, a) in acc.iter().enumerate().take(nt) {
                            let yr = py.add((t + i) * ldy + c);
                            for (j, &v) in a.iter().enumerate() {
                                _mm512_mask_storeu_ps(yr.wrapping_add(16 * j), m[j], v);
                            }
                        }
                    }
                    t += MR;
                }
                c += 16 * NV;
            }
            k0 = k1;
            if k0 >= k_len {
                break;
            }
        }
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

/// AVX2 (no AVX-512): `dot` and `axpy` are their scalar twins compiled for AVX2 + FMA (the
/// same code, so the same bits; no contraction: Rust never fuses a*b+c), `gemm_nt` the twin's
/// lanes register-blocked; `gemm_nn`
/// is a 4-row × 16-column microkernel, each output one FMA chain over k in order as the twin.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
        super::dot_scalar(a, b)
    }

    /// `dot_scalar`'s end: the 8 lanes summed in order, then the tail from k8 on.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn finish(acc: __m256, xr: &[f32], wr: &[f32], k8: usize) -> f32 {
        let mut l = [0f32; 8];
        // SAFETY: l holds 8 f32.
        unsafe { _mm256_storeu_ps(l.as_mut_ptr(), acc) };
        let mut s = l.iter().sum::<f32>();
        for (a, b) in xr[k8..].iter().zip(&wr[k8..]) {
            s = a.mul_add(*b, s);
        }
        s
    }

    /// `dot_scalar`'s lanes for 2 tokens × 4 weight rows at a time (each x and w vector loaded
    /// once for the block): per lane `acc = fma(x, w, acc)` as the twin, the 8 lanes summed in
    /// order, then the tail: the twin's bits.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn gemm_nt(x: &[f32], n_t: usize, w: &[f32], n_r: usize, k: usize, y: &mut [f32], ldy: usize) {
        let k8 = k / 8 * 8;
        let mut t = 0;
        while t < n_t {
            let nt = (n_t - t).min(2);
            let xs = [&x[t * k..(t + 1) * k], &x[(t + nt - 1) * k..(t + nt) * k]];
            let mut r = 0;
            while r < n_r {
                let nr = (n_r - r).min(4);
                let ws = [
                    &w[r * k..(r + 1) * k],
                    &w[(r + 1.min(nr - 1)) * k..][..k],
                    &w[(r + 2.min(nr - 1)) * k..][..k],
                    &w[(r + 3.min(nr - 1)) * k..][..k],
                ];
                let mut acc = [[_mm256_setzero_ps(); 4]; 2];
                let mut i = 0;
                while i < k8 {
                    // SAFETY: i + 8 <= k8 <= k: every row slice has k values.
                    unsafe {
                        let xv = [_mm256_loadu_ps(xs[0].as_ptr().add(i)), _mm256_loadu_ps(xs[1].as_ptr().add(i))];
                        for (j, wr) in ws.iter().enumerate() {
                            let wv = _mm256_loadu_ps(wr.as_ptr().add(i));
                            acc[0][j] = _mm256_fmadd_ps(xv[0], wv, acc[0][j]);
                            acc[1][j] = _mm256_fmadd_ps(xv[1], wv, acc[1][j]);
                        }
                    }
                    i += 8;
                }
                for (a, (acc_t, xr)) in acc.iter().zip(xs).enumerate().take(nt) {
                    for (j, (&aj, wr)) in acc_t.iter().zip(ws).enumerate().take(nr) {
                        y[(t + a) * ldy + r + j] = finish(aj, xr, wr, k8);
                    }
                }
                r += 4;
            }
            t += 2;
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
        super::axpy_scalar(a, x, y)
    }

    /// Lane mask of the first `rem` (capped at 8) lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn tail_mask(rem: usize) -> __m256i {
        let r = rem.min(8) as i32;
        _mm256_cmpgt_epi32(_mm256_set1_epi32(r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
    }

    /// `gemm_nn`'s microkernel: MR rows of x by 8·NV columns of b, keys in blocks of KC.
    const MR: usize = 6;
    const NV: usize = 2;
    const KC: usize = 256;

    /// MR rows of x by 8·NV columns of b per microkernel step: MR broadcasts + NV loads feed
    /// MR·NV FMAs per k (6 × 2: 12 accumulators, enough chains for both FMA pipes, and with the
    /// two b vectors and the broadcast 15 of the 16 registers; 3 × 4 needs 17 and spills). k
    /// runs in blocks of `KC`, the partial sums parked in y between blocks, so the [KC, 8·NV]
    /// block of b a step reads stays in L1 for every row (the attention's P·V has thousands of
    /// keys); each output is still one FMA chain over k in order, the twin's bits. Column tails
    /// are masked, row tails reuse the last valid row (results discarded).
    ///
    /// # Safety
    /// AVX2 and FMA available; bounds as `super::check_gemm_nn` checks them.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn gemm_nn(
        x: &[f32],
        n_t: usize,
        b: &[f32],
        ldb: usize,
        k_len: usize,
        n: usize,
        y: &mut [f32],
        ldy: usize,
    ) {
        let (px, pb, py) = (x.as_ptr(), b.as_ptr(), y.as_mut_ptr());
        let mut k0 = 0;
        loop {
            let k1 = (k0 + KC).min(k_len);
            let mut c = 0;
            while c < n {
                let rem = n - c;
                let full = rem >= 8 * NV;
                let m: [__m256i; NV] = std::array::from_fn(|j| tail_mask(rem.saturating_sub(8 * j)));
                let mut t = 0;
                while t < n_t {
                    let nt = (n_t - t).min(MR);
                    let rows: [usize; MR] = std::array::from_fn(|i| t + i.min(nt - 1));
                    let mut acc = [[_mm256_setzero_ps(); NV]; MR];
                    // SAFETY (whole block): rows < n_t, k < k_len, columns c.. masked to < n
                    // (or all of c..c + 8·NV <= n when full): every access is inside x [n_t,
                    // k_len], b (k_len rows of stride ldb >= n) and y (checked by the caller).
                    // wrapping_add: with a short tail a later vector's address may lie past the
                    // end; its lanes are all masked off, and a masked lane is never touched.
                    unsafe {
                        if k0 > 0 {
                            for (i, a) in acc.iter_mut().enumerate() {
                                let yr = py.add(rows[i] * ldy + c);
                                for (j, v) in a.iter_mut().enumerate() {
                                    *v = if full {
                                        _mm256_loadu_ps(yr.add(8 * j))
                                    } else {
                                        _mm256_maskload_ps(yr.wrapping_add(8 * j), m[j])
                                    };
                                }
                            }
                        }
                        let xr: [*const f32; MR] = std::array::from_fn(|i| px.add(rows[i] * k_len));
                        if full {
                            for k in k0..k1 {
                                let bp = pb.add(k * ldb + c);
                                let bv: [__m256; NV] = std::array::from_fn(|j| _mm256_loadu_ps(bp.add(8 * j)));
                                for (a, &r) in acc.iter_mut().zip(&xr) {
                                    let av = _mm256_set1_ps(*r.add(k));
                                    for (v, &bj) in a.iter_mut().zip(&bv) {
                                        *v = _mm256_fmadd_ps(av, bj, *v);
                                    }
                                }
                            }
                        } else {
                            for k in k0..k1 {
                                let bp = pb.wrapping_add(k * ldb + c);
                                let bv: [__m256; NV] = std::array::from_fn(|j| _mm256_maskload_ps(bp.wrapping_add(8 * j), m[j]));
                                for (a, &r) in acc.iter_mut().zip(&xr) {
                                    let av = _mm256_set1_ps(*r.add(k));
                                    for (v, &bj) in a.iter_mut().zip(&bv) {
                                        *v = _mm256_fmadd_ps(av, bj, *v);
                                    }
                                }
                            }
                        }
                        for (i, a) in acc.iter().enumerate().take(nt) {
                            let yr = py.add((t + i) * ldy + c);
                            for (j, &v) in a.iter().enumerate() {
                                if full {
                                    _mm256_storeu_ps(yr.add(8 * j), v);
                                } else {
                                    _mm256_maskstore_ps(yr.wrapping_add(8 * j), m[j], v);
                                }
                            }
                        }
                    }
                    t += MR;
                }
                c += 8 * NV;
            }
            k0 = k1;
            if k0 >= k_len {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32s_of_bytes_views_only_aligned_whole_values() {
        let v: Vec<f32> = vec![1.5, -2.25, 3.0e-7, f32::MAX];
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        // A Vec<u8>'s start may sit anywhere: find a 4-aligned copy inside a wider buffer.
        let mut wide = vec![0u8; bytes.len() + 8];
        let at = (4 - wide.as_ptr() as usize % 4) % 4;
        wide[at..at + bytes.len()].copy_from_slice(&bytes);
        assert_eq!(f32s_of_bytes(&wide[at..at + bytes.len()]), Some(&v[..]));
        assert_eq!(f32s_of_bytes(&wide[at + 1..at + 1 + bytes.len()]), None, "misaligned start");
        assert_eq!(f32s_of_bytes(&wide[at..at + bytes.len() - 1]), None, "a partial value");
    }

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
    fn axpy_simd_matches_scalar_bitwise() {
        for n in [0, 1, 15, 16, 17, 64, 256, 577] {
            let (x, y0) = (rnd(n, 3), rnd(n, 4));
            let (mut ys, mut yv) = (y0.clone(), y0.clone());
            axpy_scalar(0.37, &x, &mut ys);
            axpy(0.37, &x, &mut yv);
            let bad = ys.iter().zip(&yv).position(|(a, b)| a.to_bits() != b.to_bits());
            assert_eq!(bad, None, "n={n}: axpy SIMD differs from the scalar twin");
            assert!(n == 0 || ys != y0, "n={n}: axpy changed nothing");
        }
    }

    #[test]
    fn gemm_nn_simd_matches_scalar() {
        for &(nt, k, n) in &[
            (1, 1, 1),
            (3, 5, 17),
            (4, 64, 32),
            (7, 9, 100),
            (13, 64, 70),
            (5, 256, 33),
            (33, 3, 16),
            (4, 600, 64),
            (7, 513, 40),
            (9, 260, 48),
            (2, 0, 9),
        ] {
            let x = rnd(nt * k, 5);
            let ldb = n + 5; // a column block of a wider matrix
            let b = rnd(k * ldb, 6);
            let ldy = n + 2;
            let mut ys = vec![7f32; nt * ldy];
            let mut yv = vec![7f32; nt * ldy];
            gemm_nn_scalar(&x, nt, &b, ldb, k, n, &mut ys, ldy);
            gemm_nn(&x, nt, &b, ldb, k, n, &mut yv, ldy);
            // Same FMA chain per element: bit-identical, and the padding untouched.
            let bad = (0..ys.len()).find(|&i| ys[i].to_bits() != yv[i].to_bits());
            assert!(bad.is_none(), "gemm_nn {nt}x{k}x{n}: first difference at {bad:?}");
            let mut md = 0f64;
            for t in 0..nt {
                for c in 0..n {
                    let exact: f64 = (0..k).map(|j| x[t * k + j] as f64 * b[j * ldb + c] as f64).sum();
                    md = cortiq_testkit::nan_max(md, (exact - yv[t * ldy + c] as f64).abs());
                }
            }
            println!("gemm_nn {nt}x{k}x{n}: bit-identical to scalar; max diff vs f64 {md:.2e}");
            assert!(md <= 1e-5 * (k as f64).sqrt(), "gemm_nn {nt}x{k}x{n}: {md} from the f64 product");
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
            let (md, at) = cortiq_testkit::max_abs_diff(&ys, &yv); // NaN-propagating
            println!("gemm {nt}x{nr}x{k}: max diff {md:e} at {at}");
            assert!(md <= 1e-5 * (k as f32).sqrt(), "gemm {nt}x{nr}x{k}: max diff {md} at {at}");
            // The AVX2 kernel keeps the twin's lanes and order: equal bit for bit.
            if level() == Level::Avx2 {
                assert!(ys.iter().zip(&yv).all(|(a, b)| a.to_bits() == b.to_bits()), "gemm {nt}x{nr}x{k}: AVX2 != scalar twin");
            }
        }
    }
}

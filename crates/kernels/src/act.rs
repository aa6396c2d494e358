//! The gated FFN's elementwise middle, fast: `gate[i] = act(gate[i]) * up[i]` for SiLU and
//! GELU-tanh with a vectorized exp (the Cody-Waite + degree-5 polynomial of ggml's
//! `ggml_v_expf`, within ~1.5 ulp of expf) instead of libm's scalar exp/tanh. In decode the
//! libm path cost as much as a small matvec (GELU-tanh on Gemma3's 2048-wide FFN: ~30 µs a
//! call, 7% of a token); this one is ~20x faster. Both use `x·σ(z)`:
//! SiLU(x) = x / (1 + e^{-x}); GELU-tanh(x) = ½x(1 + tanh y) = x / (1 + e^{-2y}),
//! y = √(2/π)(x + 0.044715x³).
//!
//! Also `softmax_fast`, the attention softmax on the same vector exp (prefill computes one exp
//! per visible (query, key) pair: with libm's scalar exp that was most of the attention time).
//!
//! The scalar twins compute the same formulas lane for lane (`ggml::expf_ggml` is the vector
//! exp's lane function), so SIMD and scalar agree to the last bit up to FMA contraction.

use crate::ggml::expf_ggml;
use crate::simd::{Level, level};

/// Which activation gates the FFN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GatedAct {
    Silu,
    GeluTanh,
}

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_A: f32 = 0.044715;

/// The exponent `z` with act(x) = x / (1 + e^z).
#[inline(always)]
fn neg_arg(kind: GatedAct, x: f32) -> f32 {
    match kind {
        GatedAct::Silu => -x,
        // -2y = -2·√(2/π)·x·(1 + 0.044715x²)
        GatedAct::GeluTanh => (-2.0 * SQRT_2_OVER_PI) * x * (GELU_A * x).mul_add(x, 1.0),
    }
}

/// Scalar twin of `gated_act_fast`.
#[inline(always)]
pub fn gated_act_fast_scalar(kind: GatedAct, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "gated_act_fast: gate and up differ in length");
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = x / (1.0 + expf_ggml(neg_arg(kind, x))) * u;
    }
}

/// `gate[i] = act(gate[i]) * up[i]`, AVX-512 when available.
pub fn gated_act_fast(kind: GatedAct, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "gated_act_fast: gate and up differ in length");
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: level() == Avx512 means avx512f and fma were detected at run time.
        Level::Avx512 => unsafe { avx512::gated(kind, gate, up) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: level() == Avx2 means avx2, fma and f16c were detected at run time.
        Level::Avx2 => unsafe { avx2::gated(kind, gate, up) },
        _ => gated_act_fast_scalar(kind, gate, up),
    }
}

/// Scalar twin of `exp_fast`.
#[inline(always)]
pub fn exp_fast_scalar(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = expf_ggml(*v));
}

/// x ← e^x in place with the vector exp (within ~1.5 ulp of expf; the delta rule's decay
/// factors).
pub fn exp_fast(x: &mut [f32]) {
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: level() == Avx512 means avx512f and fma were detected at run time.
        Level::Avx512 => unsafe { avx512::exp(x) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: level() == Avx2 means avx2, fma and f16c were detected at run time.
        Level::Avx2 => unsafe { avx2::exp(x) },
        _ => exp_fast_scalar(x),
    }
}

/// Scalar twin of `silu_fast`.
#[inline(always)]
pub fn silu_fast_scalar(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v /= 1.0 + expf_ggml(-*v);
    }
}

/// x ← x·σ(x) in place with the vector exp (the short convolutions' activation).
pub fn silu_fast(x: &mut [f32]) {
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: level() == Avx512 means avx512f and fma were detected at run time.
        Level::Avx512 => unsafe { avx512::silu(x) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: level() == Avx2 means avx2, fma and f16c were detected at run time.
        Level::Avx2 => unsafe { avx2::silu(x) },
        _ => silu_fast_scalar(x),
    }
}

/// Scalar twin of `exp_minus_max`: the same max, exps and sums in the same lane order.
#[inline(always)]
pub fn exp_minus_max_scalar(x: &mut [f32]) -> f32 {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY {
        return 0.0;
    }
    // 16 lane sums, as the vector loop keeps them, then the tail, then lanes reduced in order.
    let mut lanes = [0f32; 16];
    let n16 = x.len() / 16 * 16;
    for c in x[..n16].chunks_exact_mut(16) {
        for (l, v) in c.iter_mut().enumerate() {
            *v = expf_ggml(*v - m);
            lanes[l] += *v;
        }
    }
    let mut s = 0f32;
    for v in &mut x[n16..] {
        *v = expf_ggml(*v - m);
        s += *v;
    }
    lanes.iter().fold(s, |a, &b| a + b)
}

/// The softmax's weights before their normalisation: x ← e^{x − max x} with the vector exp,
/// returning their sum (16 lane sums in position order, then the tail, reduced in order). A
/// row of only -inf is left unchanged and gives 0. Attention divides its P·V rows by the sum
/// instead of every weight.
pub fn exp_minus_max(x: &mut [f32]) -> f32 {
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: level() == Avx512 means avx512f and fma were detected at run time.
        Level::Avx512 => unsafe { avx512::exp_minus_max(x) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: level() == Avx2 means avx2, fma and f16c were detected at run time.
        Level::Avx2 => unsafe { avx2::exp_minus_max(x) },
        _ => exp_minus_max_scalar(x),
    }
}

/// Scalar twin of `softmax_fast`: `exp_minus_max_scalar`, then every weight times 1/sum.
#[inline(always)]
pub fn softmax_fast_scalar(x: &mut [f32]) {
    let s = exp_minus_max_scalar(x);
    normalise(x, s);
}

/// Weights times 1/sum (a row of only -inf, sum 0, stays as it is).
fn normalise(x: &mut [f32], s: f32) {
    if s != 0.0 {
        let inv = 1.0 / s;
        x.iter_mut().for_each(|v| *v *= inv);
    }
}

/// In-place softmax with the vector exp (within a few ulp of `ops::softmax_inplace`). A row of
/// only -inf is left unchanged.
pub fn softmax_fast(x: &mut [f32]) {
    let s = exp_minus_max(x);
    normalise(x, s);
}

/// The AVX2 kernels: the scalar twins' formulas on 8 lanes with `expf8` (`expf_ggml` lane for
/// lane), the same bits. (The twins compiled for AVX2 left the exp scalar: its out-of-range
/// branch and f64 scaling kept the loops from vectorizing, and prefill at depth spends one exp
/// per visible (query, key) pair.)
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::{
        GELU_A, GatedAct, SQRT_2_OVER_PI, exp_fast_scalar, exp_minus_max_scalar, gated_act_fast_scalar, silu_fast_scalar,
    };
    use std::arch::x86_64::*;

    /// `ggml::expf_ggml` on 8 lanes, bit for bit: the same FMAs, the out-of-range lanes 0 or
    /// ∞, and j · 2^n as one rounding of the exact f64 product.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn expf8(x: __m256) -> __m256 {
        // No closures here: they would not inherit the target features (each intrinsic a call).
        let r = _mm256_set1_ps(f32::from_bits(0x4b40_0000));
        let z = _mm256_fmadd_ps(x, _mm256_set1_ps(f32::from_bits(0x3fb8_aa3b)), r);
        let n = _mm256_sub_ps(z, r);
        let b = _mm256_fnmadd_ps(
            n,
            _mm256_set1_ps(f32::from_bits(0x35bf_be8e)),
            _mm256_fnmadd_ps(n, _mm256_set1_ps(f32::from_bits(0x3f31_7200)), x),
        );
        let u = _mm256_mul_ps(b, b);
        let j0 = _mm256_fmadd_ps(_mm256_set1_ps(f32::from_bits(0x3c07_2010)), b, _mm256_set1_ps(f32::from_bits(0x3d2b_9f17)));
        let j1 = _mm256_fmadd_ps(_mm256_set1_ps(f32::from_bits(0x3e2a_af33)), b, _mm256_set1_ps(f32::from_bits(0x3eff_fedb)));
        let j2 = _mm256_fmadd_ps(_mm256_set1_ps(f32::from_bits(0x3f7f_fff6)), b, _mm256_set1_ps(1.0));
        let j = _mm256_fmadd_ps(_mm256_fmadd_ps(j0, u, j1), u, j2);
        // 2^n as f64 bits for |n| <= 192 (other lanes are replaced below; clamped to stay finite).
        let lim = _mm256_set1_ps(192.0);
        let ni = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(n, _mm256_set1_ps(-192.0)), lim));
        let bias = _mm256_set1_epi64x(1023);
        let pow_lo = _mm256_slli_epi64::<52>(_mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(ni)), bias));
        let pow_hi = _mm256_slli_epi64::<52>(_mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_extracti128_si256::<1>(ni)), bias));
        let lo = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(j)), _mm256_castsi256_pd(pow_lo)));
        let hi = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps::<1>(j)), _mm256_castsi256_pd(pow_hi)));
        let v = _mm256_set_m128(hi, lo);
        // |n| > 192: 0 where n <= 0, else ∞.
        let absn = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
        let out = _mm256_cmp_ps::<_CMP_GT_OQ>(absn, lim);
        let big = _mm256_and_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(n, _mm256_setzero_ps()), _mm256_set1_ps(f32::INFINITY));
        _mm256_blendv_ps(v, big, out)
    }

    /// x / (1 + e^z), the twins' `x / (1.0 + expf_ggml(z))`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn x_over_1_exp(x: __m256, z: __m256) -> __m256 {
        _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), expf8(z)))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn gated(kind: GatedAct, gate: &mut [f32], up: &[f32]) {
        let n8 = gate.len() / 8 * 8;
        let (gp, upp) = (gate.as_mut_ptr(), up.as_ptr());
        for i in (0..n8).step_by(8) {
            // SAFETY: i + 8 <= n8 <= gate.len() == up.len() (asserted by the caller).
            unsafe {
                let x = _mm256_loadu_ps(gp.add(i));
                // `neg_arg`: −x, or (−2·√(2/π))·x·fma(0.044715·x, x, 1) in that order.
                let z = match kind {
                    GatedAct::Silu => _mm256_xor_ps(x, _mm256_set1_ps(-0.0)),
                    GatedAct::GeluTanh => {
                        let t = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(GELU_A), x), x, _mm256_set1_ps(1.0));
                        _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(-2.0 * SQRT_2_OVER_PI), x), t)
                    }
                };
                _mm256_storeu_ps(gp.add(i), _mm256_mul_ps(x_over_1_exp(x, z), _mm256_loadu_ps(upp.add(i))));
            }
        }
        gated_act_fast_scalar(kind, &mut gate[n8..], &up[n8..]);
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn exp(x: &mut [f32]) {
        let n8 = x.len() / 8 * 8;
        let p = x.as_mut_ptr();
        for i in (0..n8).step_by(8) {
            // SAFETY: i + 8 <= x.len().
            unsafe { _mm256_storeu_ps(p.add(i), expf8(_mm256_loadu_ps(p.add(i)))) };
        }
        exp_fast_scalar(&mut x[n8..]);
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn silu(x: &mut [f32]) {
        let n8 = x.len() / 8 * 8;
        let p = x.as_mut_ptr();
        for i in (0..n8).step_by(8) {
            // SAFETY: i + 8 <= x.len().
            unsafe {
                let v = _mm256_loadu_ps(p.add(i));
                _mm256_storeu_ps(p.add(i), x_over_1_exp(v, _mm256_xor_ps(v, _mm256_set1_ps(-0.0))));
            }
        }
        silu_fast_scalar(&mut x[n8..]);
    }

    /// `exp_minus_max_scalar` on 8 lanes: its 16 lane sums are two vectors (lanes 0–7, 8–15),
    /// added position by position as the twin adds them, then reduced in its order.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn exp_minus_max(x: &mut [f32]) -> f32 {
        let n16 = x.len() / 16 * 16;
        if n16 == 0 {
            return exp_minus_max_scalar(x);
        }
        let p = x.as_mut_ptr();
        // The maximum does not depend on the order; NaN lanes are skipped (`max_ps` returns its
        // second operand when the first is NaN), as `f32::max` skips them.
        let mut mv = _mm256_set1_ps(f32::NEG_INFINITY);
        for i in (0..n16).step_by(8) {
            // SAFETY: i + 8 <= n16 <= x.len().
            mv = _mm256_max_ps(unsafe { _mm256_loadu_ps(p.add(i)) }, mv);
        }
        let mut lanes = [0f32; 16];
        // SAFETY: lanes holds 16 values.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), mv) };
        let m = lanes[..8].iter().chain(&x[n16..]).copied().fold(f32::NEG_INFINITY, f32::max);
        if m == f32::NEG_INFINITY {
            return 0.0;
        }
        let mb = _mm256_set1_ps(m);
        let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for i in (0..n16).step_by(16) {
            // SAFETY: i + 16 <= n16 <= x.len().
            unsafe {
                let e0 = expf8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), mb));
                let e1 = expf8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i + 8)), mb));
                _mm256_storeu_ps(p.add(i), e0);
                _mm256_storeu_ps(p.add(i + 8), e1);
                s0 = _mm256_add_ps(s0, e0);
                s1 = _mm256_add_ps(s1, e1);
            }
        }
        // SAFETY: lanes holds 16 values.
        unsafe {
            _mm256_storeu_ps(lanes.as_mut_ptr(), s0);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), s1);
        }
        let mut s = 0f32;
        for v in &mut x[n16..] {
            *v = crate::ggml::expf_ggml(*v - m);
            s += *v;
        }
        lanes.iter().fold(s, |a, &b| a + b)
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use super::{GELU_A, GatedAct, SQRT_2_OVER_PI, gated_act_fast_scalar};
    use std::arch::x86_64::*;

    /// ggml_v_expf: e^x for 16 lanes.
    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    pub(crate) fn expf16(x: __m512) -> __m512 {
        let r = _mm512_set1_ps(f32::from_bits(0x4b40_0000));
        let z = _mm512_fmadd_ps(x, _mm512_set1_ps(f32::from_bits(0x3fb8_aa3b)), r);
        let n = _mm512_sub_ps(z, r);
        let b = _mm512_fnmadd_ps(
            n,
            _mm512_set1_ps(f32::from_bits(0x35bf_be8e)),
            _mm512_fnmadd_ps(n, _mm512_set1_ps(f32::from_bits(0x3f31_7200)), x),
        );
        let u = _mm512_mul_ps(b, b);
        let j = _mm512_fmadd_ps(
            _mm512_fmadd_ps(
                _mm512_fmadd_ps(_mm512_set1_ps(f32::from_bits(0x3c07_2010)), b, _mm512_set1_ps(f32::from_bits(0x3d2b_9f17))),
                u,
                _mm512_fmadd_ps(_mm512_set1_ps(f32::from_bits(0x3e2a_af33)), b, _mm512_set1_ps(f32::from_bits(0x3eff_fedb))),
            ),
            u,
            _mm512_fmadd_ps(_mm512_set1_ps(f32::from_bits(0x3f7f_fff6)), b, _mm512_set1_ps(1.0)),
        );
        // |n| > 192: 0 or +inf, as the scalar lane function.
        let big = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192.0), _CMP_GT_OQ);
        let res = _mm512_scalef_ps(j, n);
        if big == 0 {
            return res;
        }
        let neg = _mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ);
        let sat = _mm512_mask_blend_ps(neg, _mm512_set1_ps(f32::INFINITY), _mm512_setzero_ps());
        _mm512_mask_blend_ps(big, res, sat)
    }

    /// # Safety
    /// The CPU must support avx512f and fma.
    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn exp(x: &mut [f32]) {
        let n16 = x.len() / 16 * 16;
        for i in (0..n16).step_by(16) {
            // SAFETY: i + 16 <= n16 <= x.len().
            unsafe { _mm512_storeu_ps(x.as_mut_ptr().add(i), expf16(_mm512_loadu_ps(x.as_ptr().add(i)))) };
        }
        super::exp_fast_scalar(&mut x[n16..]);
    }

    /// # Safety
    /// The CPU must support avx512f and fma.
    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn silu(x: &mut [f32]) {
        let n16 = x.len() / 16 * 16;
        let one = _mm512_set1_ps(1.0);
        for i in (0..n16).step_by(16) {
            // SAFETY: i + 16 <= n16 <= x.len().
            unsafe {
                let v = _mm512_loadu_ps(x.as_ptr().add(i));
                let e = expf16(_mm512_sub_ps(_mm512_setzero_ps(), v));
                _mm512_storeu_ps(x.as_mut_ptr().add(i), _mm512_div_ps(v, _mm512_add_ps(one, e)));
            }
        }
        super::silu_fast_scalar(&mut x[n16..]);
    }

    /// # Safety
    /// The CPU must support avx512f and fma.
    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn exp_minus_max(x: &mut [f32]) -> f32 {
        let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if m == f32::NEG_INFINITY {
            return 0.0;
        }
        let n16 = x.len() / 16 * 16;
        let mv = _mm512_set1_ps(m);
        let mut acc = _mm512_setzero_ps();
        for i in (0..n16).step_by(16) {
            // SAFETY: i + 16 <= n16 <= x.len().
            unsafe {
                let e = expf16(_mm512_sub_ps(_mm512_loadu_ps(x.as_ptr().add(i)), mv));
                _mm512_storeu_ps(x.as_mut_ptr().add(i), e);
                acc = _mm512_add_ps(acc, e);
            }
        }
        let mut s = 0f32;
        for v in &mut x[n16..] {
            *v = super::expf_ggml(*v - m);
            s += *v;
        }
        let mut lanes = [0f32; 16];
        // SAFETY: lanes holds 16 f32.
        unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc) };
        lanes.iter().fold(s, |a, &b| a + b)
    }

    /// # Safety
    /// The CPU must support avx512f and fma.
    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn gated(kind: GatedAct, gate: &mut [f32], up: &[f32]) {
        let n16 = gate.len() / 16 * 16;
        let one = _mm512_set1_ps(1.0);
        for i in (0..n16).step_by(16) {
            // SAFETY: i + 16 <= n16 <= len of both slices (checked equal by the caller).
            let (x, u) = unsafe { (_mm512_loadu_ps(gate.as_ptr().add(i)), _mm512_loadu_ps(up.as_ptr().add(i))) };
            let z = match kind {
                GatedAct::Silu => _mm512_sub_ps(_mm512_setzero_ps(), x),
                GatedAct::GeluTanh => {
                    let inner = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(GELU_A), x), x, one);
                    _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(-2.0 * SQRT_2_OVER_PI), x), inner)
                }
            };
            let y = _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, expf16(z))), u);
            // SAFETY: as the loads.
            unsafe { _mm512_storeu_ps(gate.as_mut_ptr().add(i), y) };
        }
        gated_act_fast_scalar(kind, &mut gate[n16..], &up[n16..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{gelu_tanh, silu};

    fn inputs() -> (Vec<f32>, Vec<f32>) {
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        let mut r = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32
        };
        // Include the saturation regions and exact zero.
        let mut g: Vec<f32> = (0..1000).map(|_| (r() - 0.5) * 24.0).collect();
        g.extend([0.0, -0.0, 100.0, -100.0, 1e-30, -200.0, 200.0]);
        let u: Vec<f32> = g.iter().map(|_| r() * 2.0 - 1.0).collect();
        (g, u)
    }

    #[test]
    fn exp_simd_matches_scalar_and_libm() {
        let (g, _) = inputs();
        let (mut a, mut b) = (g.clone(), g.clone());
        exp_fast(&mut a);
        exp_fast_scalar(&mut b);
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "exp SIMD vs scalar twin");
        // max_err propagates NaN (f32::max would drop it and pass).
        let worst = cortiq_testkit::max_err(
            g.iter().zip(&a).filter(|(x, _)| x.abs() < 80.0).map(|(&x, &y)| ((x.exp() - y) / x.exp()).abs() as f64),
        );
        assert!(worst <= 3e-7, "exp_fast {worst} relative from libm");
    }

    #[test]
    fn silu_simd_matches_scalar() {
        let (g, _) = inputs();
        let (mut a, mut b) = (g.clone(), g.clone());
        silu_fast(&mut a);
        silu_fast_scalar(&mut b);
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "silu SIMD vs scalar twin");
        let worst = cortiq_testkit::max_err(g.iter().zip(&a).map(|(&x, &y)| ((silu(x) - y) / x.abs().max(1e-30)).abs() as f64));
        assert!(worst <= 2e-6, "silu_fast {worst} relative from libm");
    }

    #[test]
    fn softmax_simd_matches_scalar_and_libm() {
        let (g, _) = inputs();
        for len in [0, 1, 5, 16, 17, 100, 1000] {
            let row: Vec<f32> = g[..len].iter().map(|v| v * 0.5).collect();
            let (mut a, mut b, mut c) = (row.clone(), row.clone(), row.clone());
            softmax_fast(&mut a);
            softmax_fast_scalar(&mut b);
            crate::ops::softmax_inplace(&mut c);
            let bad = (0..len).find(|&i| a[i].to_bits() != b[i].to_bits());
            assert!(bad.is_none(), "len {len}: SIMD and scalar twin differ at {bad:?}");
            let worst = cortiq_testkit::max_err((0..len).map(|i| ((a[i] - c[i]) / c[i].max(1e-30)).abs() as f64));
            println!("softmax len {len}: bit-identical to scalar; max rel vs libm {worst:.2e}");
            assert!(worst <= 2e-6, "len {len}: {worst} relative from the libm softmax");
        }
        let mut all_neg_inf = [f32::NEG_INFINITY; 3];
        softmax_fast(&mut all_neg_inf);
        assert!(all_neg_inf.iter().all(|v| *v == f32::NEG_INFINITY));
    }

    #[test]
    fn exp_minus_max_matches_scalar_and_sums_its_weights() {
        let (g, _) = inputs();
        for len in [0, 1, 7, 16, 31, 48, 100, 1000, 1007] {
            let mut row: Vec<f32> = g[..len.min(g.len())].iter().map(|v| v * 0.5).collect();
            row.resize(len, -3.0);
            // masked keys, as attention leaves them
            if len > 20 {
                row[3] = f32::NEG_INFINITY;
                row[len - 2] = f32::NEG_INFINITY;
            }
            let (mut a, mut b) = (row.clone(), row.clone());
            let (sa, sb) = (exp_minus_max(&mut a), exp_minus_max_scalar(&mut b));
            assert_eq!(sa.to_bits(), sb.to_bits(), "len {len}: sums differ");
            let bad = (0..len).find(|&i| a[i].to_bits() != b[i].to_bits());
            assert!(bad.is_none(), "len {len}: SIMD and scalar twin differ at {bad:?}");
            let exact: f64 = a.iter().map(|&v| v as f64).sum();
            assert!((exact - sa as f64).abs() <= 1e-6 * exact.max(1.0), "len {len}: sum {sa} vs {exact}");
            // normalised, the weights are softmax_fast's
            let mut c = row.clone();
            softmax_fast(&mut c);
            if len > 0 {
                let inv = 1.0 / sa;
                assert!(a.iter().zip(&c).all(|(x, y)| (x * inv).to_bits() == y.to_bits()), "len {len}: softmax_fast differs");
            }
        }
        let mut all_neg_inf = [f32::NEG_INFINITY; 20];
        assert_eq!(exp_minus_max(&mut all_neg_inf), 0.0);
        assert!(all_neg_inf.iter().all(|v| *v == f32::NEG_INFINITY));
    }

    #[test]
    fn simd_matches_scalar_and_libm() {
        for (kind, reference) in [(GatedAct::Silu, silu as fn(f32) -> f32), (GatedAct::GeluTanh, gelu_tanh)] {
            let (g, u) = inputs();
            let (mut a, mut b) = (g.clone(), g.clone());
            gated_act_fast(kind, &mut a, &u);
            gated_act_fast_scalar(kind, &mut b, &u);
            let (mut worst_simd, mut worst_ref, mut at) = (0f64, 0f64, 0);
            for i in 0..g.len() {
                let scale = (g[i] * u[i]).abs().max(1e-30);
                worst_simd = cortiq_testkit::nan_max(worst_simd, ((a[i] - b[i]).abs() / scale) as f64);
                let exact = reference(g[i]) as f64 * u[i] as f64;
                let e = (a[i] as f64 - exact).abs() / (scale as f64);
                if (e > worst_ref || e.is_nan()) && !worst_ref.is_nan() {
                    (worst_ref, at) = (e, i);
                }
            }
            println!("{kind:?}: simd vs scalar max rel {worst_simd:.2e}; vs libm max rel {worst_ref:.2e} at x = {}", g[at]);
            assert!(worst_simd <= 2e-7, "{kind:?}: SIMD and scalar twin differ by {worst_simd:e} relative");
            if level() == Level::Avx2 {
                // The AVX2 kernel is the twin's arithmetic lane for lane.
                let bad = (0..g.len()).find(|&i| a[i].to_bits() != b[i].to_bits());
                assert!(bad.is_none(), "{kind:?}: AVX2 and scalar twin differ at {bad:?}");
            }
            assert!(worst_ref <= 2e-6, "{kind:?}: {worst_ref:e} relative from libm at x = {}", g[at]);
        }
    }
}

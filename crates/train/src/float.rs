//! The scalar type the ops are generic over: f32 for training, f64 for the gradient check.
//! Besides arithmetic it carries the three matrix products of a linear layer's forward and
//! backward as associated functions, so f32 can route them to the SIMD kernels of
//! `cortiq-kernels` while f64 runs the plain loops of [`crate::matmul`] (no specialization in
//! stable Rust; a trait hook is the honest way to pick an implementation per type).

use std::fmt::{Debug, Display};
use std::iter::Sum;
use std::ops::{Add, AddAssign, Div, DivAssign, Mul, MulAssign, Neg, Sub, SubAssign};

use crate::matmul;

pub trait Float:
    Copy
    + Send
    + Sync
    + Default
    + PartialOrd
    + Debug
    + Display
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
    + DivAssign
    + Sum
{
    const ZERO: Self;
    const ONE: Self;
    /// "f32" or "f64", for messages.
    const NAME: &'static str;

    fn from_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn sqrt(self) -> Self;
    fn tanh(self) -> Self;
    fn abs(self) -> Self;
    fn max(self, other: Self) -> Self;
    fn min(self, other: Self) -> Self;
    fn is_finite(self) -> bool;
    /// (sin x, cos x); f32 through f64 as the engine's vmf_phase features (one rounding).
    fn sin_cos(self) -> (Self, Self);

    /// `y[t, c] = Σ_k x[t, k]·b[k·ldb + c]` for t < n_t, c < n (written): x [n_t, k_len]
    /// times a [k_len, n] block of b whose rows are ldb apart. Single-threaded (callers split
    /// work); f32: the kernels' AVX-512 attention-form kernel.
    #[allow(clippy::too_many_arguments)]
    fn gemm_nn(x: &[Self], n_t: usize, b: &[Self], ldb: usize, k_len: usize, n: usize, y: &mut [Self], ldy: usize) {
        for t in 0..n_t {
            let yr = &mut y[t * ldy..t * ldy + n];
            yr.fill(Self::ZERO);
            for k in 0..k_len {
                let a = x[t * k_len + k];
                yr.iter_mut().zip(&b[k * ldb..k * ldb + n]).for_each(|(yv, &bv)| *yv += a * bv);
            }
        }
    }
    /// `x ← e^x` elementwise (f32: the kernels' vector exp, within ~1.5 ulp of expf).
    fn exp_inplace(x: &mut [Self]) {
        x.iter_mut().for_each(|v| *v = v.exp());
    }
    /// `y[t, o] = Σ_i x[t, i] · w[o, i]`: x [n_t, k], w [n_o, k], y [n_t, n_o] (written, =).
    fn gemm_xwt(x: &[Self], w: &[Self], y: &mut [Self], n_t: usize, n_o: usize, k: usize) {
        matmul::gemm_xwt_generic(x, w, y, n_t, n_o, k)
    }
    /// `dx[t, i] += Σ_o dy[t, o] · w[o, i]`: dy [n_t, n_o], w [n_o, k], dx [n_t, k].
    fn gemm_acc_dyw(dy: &[Self], w: &[Self], dx: &mut [Self], n_t: usize, n_o: usize, k: usize) {
        matmul::gemm_acc_dyw_generic(dy, w, dx, n_t, n_o, k)
    }
    /// `dw[o, i] += Σ_t dy[t, o] · x[t, i]`: dy [n_t, n_o], x [n_t, k], dw [n_o, k].
    fn gemm_acc_dytx(dy: &[Self], x: &[Self], dw: &mut [Self], n_t: usize, n_o: usize, k: usize) {
        matmul::gemm_acc_dytx_generic(dy, x, dw, n_t, n_o, k)
    }
}

macro_rules! float_common {
    ($t:ty, $name:expr) => {
        const ZERO: Self = 0.0;
        const ONE: Self = 1.0;
        const NAME: &'static str = $name;
        #[inline]
        fn from_f64(x: f64) -> Self {
            x as $t
        }
        #[inline]
        fn to_f64(self) -> f64 {
            self as f64
        }
        #[inline]
        fn exp(self) -> Self {
            <$t>::exp(self)
        }
        #[inline]
        fn ln(self) -> Self {
            <$t>::ln(self)
        }
        #[inline]
        fn sqrt(self) -> Self {
            <$t>::sqrt(self)
        }
        #[inline]
        fn tanh(self) -> Self {
            <$t>::tanh(self)
        }
        #[inline]
        fn abs(self) -> Self {
            <$t>::abs(self)
        }
        #[inline]
        fn max(self, other: Self) -> Self {
            <$t>::max(self, other)
        }
        #[inline]
        fn min(self, other: Self) -> Self {
            <$t>::min(self, other)
        }
        #[inline]
        fn is_finite(self) -> bool {
            <$t>::is_finite(self)
        }
    };
}

impl Float for f64 {
    float_common!(f64, "f64");
    fn sin_cos(self) -> (f64, f64) {
        f64::sin_cos(self)
    }
}

impl Float for f32 {
    float_common!(f32, "f32");
    fn sin_cos(self) -> (f32, f32) {
        let (s, c) = (self as f64).sin_cos();
        (s as f32, c as f32)
    }

    fn exp_inplace(x: &mut [f32]) {
        cortiq_kernels::act::exp_fast(x)
    }
    fn gemm_nn(x: &[f32], n_t: usize, b: &[f32], ldb: usize, k_len: usize, n: usize, y: &mut [f32], ldy: usize) {
        cortiq_kernels::dot::gemm_nn(x, n_t, b, ldb, k_len, n, y, ldy)
    }

    fn gemm_xwt(x: &[f32], w: &[f32], y: &mut [f32], n_t: usize, n_o: usize, k: usize) {
        matmul::gemm_xwt_f32(x, w, y, n_t, n_o, k)
    }
    fn gemm_acc_dyw(dy: &[f32], w: &[f32], dx: &mut [f32], n_t: usize, n_o: usize, k: usize) {
        matmul::gemm_acc_dyw_f32(dy, w, dx, n_t, n_o, k)
    }
    fn gemm_acc_dytx(dy: &[f32], x: &[f32], dw: &mut [f32], n_t: usize, n_o: usize, k: usize) {
        matmul::gemm_acc_dytx_f32(dy, x, dw, n_t, n_o, k)
    }
}

/// Dot product accumulated in f64 whatever F is (norms, softmax statistics).
#[inline]
pub fn dot_f64<F: Float>(a: &[F], b: &[F]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x.to_f64() * y.to_f64()).sum()
}

/// Dot product in F (4 partial sums).
#[inline]
pub fn dot<F: Float>(a: &[F], b: &[F]) -> F {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [F::ZERO; 4];
    let (ca, cb) = (a.chunks_exact(4), b.chunks_exact(4));
    let mut tail = F::ZERO;
    for (&x, &y) in ca.remainder().iter().zip(cb.remainder()) {
        tail += x * y;
    }
    for (x, y) in ca.zip(cb) {
        for u in 0..4 {
            acc[u] += x[u] * y[u];
        }
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail
}

/// `y += a·x`.
#[inline]
pub fn axpy<F: Float>(a: F, x: &[F], y: &mut [F]) {
    debug_assert_eq!(x.len(), y.len());
    for (yv, &xv) in y.iter_mut().zip(x) {
        *yv += a * xv;
    }
}

/// `out[j] = x·mt[·, j]` for j in lo..hi, mt [len(x), ld] row-major (a transposed K, V or Q):
/// one row's dot products against a range of keys as len(x) contiguous multiply-adds, which
/// vectorize over the keys without reassociating any sum (a per-key dot product does not).
#[inline(always)]
pub fn row_dots<F: Float>(x: &[F], mt: &[F], ld: usize, lo: usize, hi: usize, out: &mut [F]) {
    let o = &mut out[lo..hi];
    o.fill(F::ZERO);
    for (c, &xc) in x.iter().enumerate() {
        o.iter_mut().zip(&mt[c * ld + lo..c * ld + hi]).for_each(|(y, &z)| *y += xc * z);
    }
}

/// Runs `f` compiled with AVX-512 enabled when the CPU has it (chosen at run time), else as
/// compiled for the baseline target: the same source twice, the baseline one being the scalar
/// twin. Rust neither fuses a·b + c into an FMA nor reorders float sums by itself, so both give
/// bit-identical results; the wide one runs elementwise loops 16 f32 / 8 f64 lanes at a time.
/// `f` must be a closure used only here so that it is inlined into the wide function.
#[inline(always)]
pub fn wide<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if cortiq_kernels::simd::level() == cortiq_kernels::simd::Level::Avx512 {
        // SAFETY: level() returns Avx512 only after detecting avx512f and fma at run time.
        return unsafe { wide_avx512(f) };
    }
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn wide_avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// `x` [T, n, hd] -> [n, hd, T] (per head, channels as rows over positions: `row_dots` operand).
pub fn transpose_heads<F: Float>(x: &[F], n: usize, hd: usize) -> Vec<F> {
    let t_len = x.len() / (n * hd);
    let mut out = vec![F::ZERO; x.len()];
    for t in 0..t_len {
        for g in 0..n {
            for c in 0..hd {
                out[(g * hd + c) * t_len + t] = x[(t * n + g) * hd + c];
            }
        }
    }
    out
}

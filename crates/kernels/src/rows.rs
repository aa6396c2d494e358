//! Deterministic passes over a whole logit row for the sampler: `det_exp` (an `e^x` built from
//! IEEE-exact operations, bit-identical on every platform) and the vectorised row kernels
//! (`exp_rel_into`, `count_ge`, `mass_ge`). Each kernel has one body compiled for the baseline,
//! AVX2 and AVX-512 and picked at run time; only the vector width changes, never the operations
//! or their order, so every path gives the same bits (tested against the scalar twins).

/// `e^x` computed with IEEE-exact operations only, so it is bit-identical on every platform
/// (libm's `exp` is not: glibc, musl, macOS and MSVC round differently in the last ulp, and
/// the sampler must not pick a different token because of that). Relative error ~1 ulp.
/// Returns 0 for `x < -708` (and -inf, NaN), `+inf` for `x > 709`.
///
/// Branch-free apart from the final selects so loops over slices vectorise: the rounding to
/// an integer uses the 1.5*2^52 trick (an IEEE add, ties to even) instead of `floor`, which
/// is a libm call on baseline x86-64.
#[inline(always)]
pub fn det_exp(x: f64) -> f64 {
    // fdlibm's split of ln 2: LN2_HI has 32 trailing zero bits, so k * LN2_HI is exact.
    const LN2_HI: f64 = 6.931_471_803_691_238e-1;
    const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
    const LOG2_E: f64 = std::f64::consts::LOG2_E;
    const MAGIC: f64 = 6_755_399_441_055_744.0; // 1.5 * 2^52
    // 1/n! for n = 13 down to 0; Taylor to degree 13 leaves r^14/14! < 2.6e-18 for |r| <= 0.347.
    const C: [f64; 14] = [
        1.0 / 6_227_020_800.0,
        1.0 / 479_001_600.0,
        1.0 / 39_916_800.0,
        1.0 / 3_628_800.0,
        1.0 / 362_880.0,
        1.0 / 40_320.0,
        1.0 / 5_040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        1.0 / 2.0,
        1.0,
        1.0,
    ];
    let xc = x.clamp(-708.0, 709.0);
    // x = k ln2 + r, |r| <= ln2/2 (+ rounding); t holds k in its low mantissa bits.
    let t = xc * LOG2_E + MAGIC;
    let k = t - MAGIC;
    let r = (xc - k * LN2_HI) - k * LN2_LO;
    let mut p = C[0];
    for &c in &C[1..] {
        p = p * r + c;
    }
    // 2^k from k's bits; k in [-1022, 1023].
    let ki = (t.to_bits() as i64).wrapping_sub(MAGIC.to_bits() as i64);
    let y = p * f64::from_bits(((ki + 1023) as u64) << 52);
    if x > 709.0 {
        f64::INFINITY
    } else if x >= -708.0 {
        y
    } else {
        0.0 // also NaN and -inf
    }
}

/// `l - max` in f64: exact for any two finite f32 whose exponents differ by < 29, and the
/// single definition every softmax term uses.
#[inline]
pub fn rel(l: f32, max: f32) -> f64 {
    l as f64 - max as f64
}

// ---------------------------------------------------------------- row kernels
//
// The passes over the whole vocabulary. Each has one body, compiled three times (baseline,
// AVX2, AVX-512) and picked at run time: only the vector width changes, never the operations
// or their order (Rust does not contract a*b+c into FMA), so every path gives bit-identical
// results; `simd_paths_are_bit_identical` checks it. det_exp over 262,144 logits: ~1 ms
// baseline (2 f64 lanes), ~0.25 ms with AVX-512.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
enum Isa {
    Scalar,
    Avx2,
    Avx512,
}

fn isa() -> Isa {
    static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *ISA.get_or_init(|| {
        match crate::simd::level() {
            crate::simd::Level::Avx512 => return Isa::Avx512,
            crate::simd::Level::Avx2 => return Isa::Avx2,
            crate::simd::Level::Scalar => {}
        }
        // level() is Scalar when forced (CORTIQ_SIMD=scalar) or when the CPU lacks FMA/F16C;
        // these kernels need AVX2 alone.
        let forced_scalar = std::env::var("CORTIQ_SIMD").map(|v| v == "scalar").unwrap_or(false);
        #[cfg(target_arch = "x86_64")]
        {
            if !forced_scalar && std::is_x86_feature_detected!("avx2") {
                return Isa::Avx2;
            }
        }
        let _ = forced_scalar;
        Isa::Scalar
    })
}

/// Defines `$name(args) -> ret` dispatching to the same `$body` compiled for each ISA, plus
/// `$scalar`, the baseline twin (used by the bit-identity test).
macro_rules! row_kernel {
    ($name:ident, $scalar:ident, ($($arg:ident : $ty:ty),*) -> $ret:ty, $body:block) => {
        #[inline(always)]
        pub fn $scalar($($arg: $ty),*) -> $ret $body

        pub fn $name($($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                fn avx512($($arg: $ty),*) -> $ret { $scalar($($arg),*) }
                #[target_feature(enable = "avx2")]
                fn avx2($($arg: $ty),*) -> $ret { $scalar($($arg),*) }
                match isa() {
                    // SAFETY: `isa()` returned these only after detecting the feature.
                    Isa::Avx512 => return unsafe { avx512($($arg),*) },
                    Isa::Avx2 => return unsafe { avx2($($arg),*) },
                    Isa::Scalar => {}
                }
            }
            $scalar($($arg),*)
        }
    };
}

row_kernel!(exp_rel_into, exp_rel_into_scalar, (src: &[f32], max: f32, scale: f64, dst: &mut Vec<f64>) -> (), {
    // dst[i] = e^((src[i] - max) * scale)   [len(src)]
    // A plain zip loop: `extend` would leave the loop in a generic function compiled
    // without the caller's target features.
    dst.clear();
    dst.resize(src.len(), 0.0);
    for (d, &l) in dst.iter_mut().zip(src) {
        *d = det_exp(rel(l, max) * scale);
    }
});

row_kernel!(count_ge, count_ge_scalar, (src: &[f32], cut: f32) -> usize, {
    // #{i : src[i] >= cut}; token ids are u32, so a u32 count cannot overflow.
    let mut n = 0u32;
    for &l in src {
        n += (l >= cut) as u32;
    }
    n as usize
});

row_kernel!(mass_ge, mass_ge_scalar, (src: &[f32], w: &[f64], cut: f32) -> f64, {
    // Σ w[i] over src[i] >= cut, in 8 fixed lanes.
    let mut acc = [0.0f64; 8];
    let mut xs = src.chunks_exact(8);
    let mut ws = w.chunks_exact(8);
    for (x, w) in (&mut xs).zip(&mut ws) {
        for l in 0..8 {
            // Adds w or +0.0, as `if x >= cut { w } else { 0.0 }` would, but as a bit mask:
            // the compiler vectorises this form and not the select (~6x at V = 262,144).
            let mask = 0u64.wrapping_sub((x[l] >= cut) as u64);
            acc[l] += f64::from_bits(w[l].to_bits() & mask);
        }
    }
    for (l, (&x, &w)) in xs.remainder().iter().zip(ws.remainder()).enumerate() {
        acc[l] += if x >= cut { w } else { 0.0 };
    }
    ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn det_exp_matches_libm_closely() {
        let mut worst = (0.0f64, 0.0f64);
        let mut x = -700.0;
        while x <= 5.0 {
            let a = det_exp(x);
            let b = x.exp();
            let rel = ((a - b) / b).abs();
            if (rel > worst.0 || rel.is_nan()) && !worst.0.is_nan() {
                worst = (rel, x);
            }
            x += 0.0137;
        }
        println!("det_exp max rel diff vs libm {:.3e} at x={}", worst.0, worst.1);
        assert!(worst.0 < 4e-16, "max rel diff {:.3e} at x={}", worst.0, worst.1);
        assert_eq!(det_exp(0.0), 1.0);
        assert_eq!(det_exp(f64::NEG_INFINITY), 0.0);
        assert_eq!(det_exp(f64::NAN), 0.0);
    }

    #[test]
    fn simd_paths_are_bit_identical() {
        // Baseline twins vs the dispatched kernels (AVX-512 or AVX2 on this machine).
        println!("isa {:?}", isa());
        let mut s = 9u64;
        let mut next = || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut src: Vec<f32> = (0..10_007).map(|_| ((next() - 0.5) * 120.0) as f32).collect();
        src[3] = f32::NEG_INFINITY;
        src[5] = 0.0;
        src[7] = -800.0;
        let max = 30.0f32;
        for scale in [1.0f64, 1.0 / 0.7, 3.0, 1e-3] {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            exp_rel_into(&src, max, scale, &mut a);
            exp_rel_into_scalar(&src, max, scale, &mut b);
            let bad = a.iter().zip(&b).position(|(x, y)| x.to_bits() != y.to_bits());
            assert_eq!(bad, None, "exp_rel_into differs at {bad:?} (scale {scale})");
            for cut in [-50.0f32, 0.0, 29.0, f32::NEG_INFINITY, 30.0, 31.0, -1e30] {
                let c = count_ge(&src, cut);
                assert_eq!(c, count_ge_scalar(&src, cut));
                assert_eq!(c, src.iter().filter(|&&l| l >= cut).count(), "cut {cut}");
                let (m1, m2) = (mass_ge(&src, &a, cut), mass_ge_scalar(&src, &a, cut));
                assert_eq!(m1.to_bits(), m2.to_bits(), "mass_ge cut {cut}: {m1} vs {m2}");
            }
        }
    }
}

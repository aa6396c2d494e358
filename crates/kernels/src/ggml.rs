//! ggml's CPU arithmetic, op by op: the twins that cortiq's llama.cpp numerics mode
//! (engine `compat`) runs so that logits are bit-identical to llama.cpp's x86 build (AVX-512,
//! GCC). Owns ggml-order RMSNorm, RoPE rotation, the polynomial `expf`, SwiGLU/GeGLU (GELU via
//! ggml's f16 table), `ggml_vec_dot_f16`'s lane order, and flash attention's one-chunk,
//! KV-split and tiled paths. Each function quotes the ggml expression whose rounding it follows;
//! the flash-attention bodies are compiled a second time with FMA enabled (same bits: a fused
//! multiply-add is correctly rounded either way; without the feature `mul_add` is a libm call).

use half::f16;

use crate::ops::RopeStyle;

/// ggml_rms_norm followed by ggml_mul with the gain: `sum += (double)(x*x)` (the square
/// rounded to f32 first), `mean = (float)(sum/n)`, `scale = 1.0f/sqrtf(mean + eps)`,
/// `y = (x*scale)*w`. x, w, out: [d]
pub fn rmsnorm_ggml(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    assert!(x.len() == w.len() && x.len() == out.len());
    let scale = ggml_rms_scale(x, eps);
    for ((o, &xi), &wi) in out.iter_mut().zip(x).zip(w) {
        *o = (xi * scale) * wi;
    }
}

/// In-place `rmsnorm_ggml` of every `w.len()`-sized segment of x.
pub fn rmsnorm_ggml_segments(x: &mut [f32], w: &[f32], eps: f32) {
    for seg in x.chunks_mut(w.len()) {
        let scale = ggml_rms_scale(seg, eps);
        for (v, &wi) in seg.iter_mut().zip(w) {
            *v = (*v * scale) * wi;
        }
    }
}

fn ggml_rms_scale(x: &[f32], eps: f32) -> f32 {
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    1.0f32 / (mean + eps).sqrt()
}

/// Rotate one head in place as ggml's rope (rotate_pairs) does. GCC contracts
/// `x0*cos - x1*sin` and `x0*sin + x1*cos` into one FMA each (the first product fused, the
/// second rounded). x: [head_dim]; cos/sin: [rot_dim/2]
pub fn rope_ggml(x: &mut [f32], cos: &[f32], sin: &[f32], style: RopeStyle) {
    let half = cos.len();
    let (stride, off) = match style {
        RopeStyle::NeoX => (1, half),
        RopeStyle::Interleaved => (2, 1),
    };
    for i in 0..half {
        let (a, b) = (i * stride, i * stride + off);
        let (x0, x1) = (x[a], x[b]);
        x[a] = x0.mul_add(cos[i], -(x1 * sin[i]));
        x[b] = x0.mul_add(sin[i], x1 * cos[i]);
    }
}

/// ggml's AVX-512 `ggml_v_expf` (a polynomial, within ~1.5 ulp of expf), lane for lane.
#[inline(always)]
pub fn expf_ggml(x: f32) -> f32 {
    let r = f32::from_bits(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), r); // 0x1.715476p+0 = log2(e)
    let n = z - r;
    // fnmadd(a, b, c) = c - a*b, fused
    let b = (-n).mul_add(f32::from_bits(0x35bf_be8e), (-n).mul_add(f32::from_bits(0x3f31_7200), x));
    let u = b * b;
    let j = f32::from_bits(0x3c07_2010)
        .mul_add(b, f32::from_bits(0x3d2b_9f17))
        .mul_add(u, f32::from_bits(0x3e2a_af33).mul_add(b, f32::from_bits(0x3eff_fedb)))
        .mul_add(u, f32::from_bits(0x3f7f_fff6).mul_add(b, 1.0));
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    // _mm512_scalef_ps(j, n) = j * 2^floor(n): one rounding, done in f64 (exact product);
    // 2^n (|n| <= 192, so a normal f64) built from its exponent bits rather than by powi.
    let two_n = f64::from_bits(((n as i64 + 1023) as u64) << 52);
    (j as f64 * two_n) as f32
}

/// `gate[i] = silu(gate[i]) * up[i]` as ggml_vec_swiglu_f32 computes it on AVX-512:
/// `x / (1 + ggml_v_expf(0 - x))`.
pub fn swiglu_ggml(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = (x / (1.0 + expf_ggml(0.0 - x))) * u;
    }
}

/// ggml's scalar GELU (tanh form), the values of its f16 table; GCC contracts
/// `1.0f + GELU_COEF_A*x*x` into one FMA.
fn gelu_f32_ggml(x: f32) -> f32 {
    const GELU_COEF_A: f32 = 0.044715;
    const SQRT_2_OVER_PI: f32 = 0.797_884_6; // ggml's 0.79788456080286535587989211986876f, the same f32
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (GELU_COEF_A * x).mul_add(x, 1.0)).tanh())
}

/// `gate[i] = gelu(gate[i]) * up[i]` as ggml_vec_geglu_f32 computes it (GGML_GELU_FP16): 0
/// below -10, identity above 10, else the f16 table entry of f16(x).
pub fn geglu_ggml(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x * u
        } else {
            let xh = f16::from_f32(x).to_f32();
            f16::from_f32(gelu_f32_ggml(xh)).to_f32() * u
        };
    }
}

/// Round an f32 to the nearest f16 (ties to even, as F16C does) and back.
#[inline]
pub fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// Sum the 16 lanes of an AVX-512 register as GCC's `_mm512_reduce_add_ps` does: upper 256
/// bits + lower, upper 128 + lower, then lanes (0+2) + (1+3).
#[inline(always)]
fn reduce_add_16(a: &[f32; 16]) -> f32 {
    let t3: [f32; 8] = std::array::from_fn(|i| a[i + 8] + a[i]);
    let t6: [f32; 4] = std::array::from_fn(|i| t3[i + 4] + t3[i]);
    (t6[0] + t6[2]) + (t6[1] + t6[3])
}

/// ggml_vec_dot_f16 on an AVX-512 build without FP16 arithmetic: four 16-lane f32 accumulators
/// over 64-element steps (one FMA each), reduced (0+2, 1+3, 0+1, then the register), the
/// leftovers added in f64.
#[inline(always)]
/// x and y hold f16 values widened to f32 (exact), so the cache is widened once per call
/// rather than once per product.
pub fn vec_dot_f16_ggml(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len();
    let np = n & !63;
    let mut acc = [[0f32; 16]; 4];
    for i in (0..np).step_by(64) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, al) in a.iter_mut().enumerate() {
                let e = i + j * 16 + l;
                *al = x[e].mul_add(y[e], *al);
            }
        }
    }
    let [mut a0, mut a1, a2, a3] = acc;
    for l in 0..16 {
        a0[l] += a2[l];
        a1[l] += a3[l];
    }
    for (x, y) in a0.iter_mut().zip(&a1) {
        *x += y;
    }
    let mut sum = reduce_add_16(&a0) as f64;
    for e in np..n {
        sum += (x[e] * y[e]) as f64;
    }
    sum as f32
}

/// ggml's `GGML_F16_STEP` on a build with AVX512-FP16 arithmetic (`__AVX512FP16__`).
const GGML_F16_STEP_FP16: usize = 128;

/// How many leading elements of an `n`-element f16 row `ggml_vec_mad_f16` / `ggml_vec_scale_f16`
/// compute in native f16 arithmetic: a `-march=native` build on a CPU with AVX512-FP16 (GCC
/// defines `__AVX512FP16__`; `fp16_build`) runs whole 128-element steps as `vfmadd213ph` /
/// `vmulph` with the scalar rounded to f16; the leftovers, and every element on any other x86
/// build, take the f32 path (`f16(fma(x, v, y))`, `f16(y*v)`). So head_dim 64 rows are all f32,
/// head_dim 256 rows all f16 on such a build. Both are emulated here on any CPU: which one to
/// follow is the build being matched, not this machine (`cpu_has_avx512fp16` says what a native
/// build here would be).
pub fn ggml_f16_arith_len(n: usize, fp16_build: bool) -> usize {
    if fp16_build { n & !(GGML_F16_STEP_FP16 - 1) } else { 0 }
}

/// Whether this CPU has AVX512-FP16: what a llama.cpp built with `GGML_NATIVE` here computes its
/// f16 rows with (`ggml_f16_arith_len`).
pub fn cpu_has_avx512fp16() -> bool {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512fp16") {
        return true;
    }
    false
}

/// Round an f64 to the nearest f16 (ties to even) in one step, as `vcvtsd2sh` does; `half`'s
/// `f16::from_f64` drops the low 32 mantissa bits first, losing the sticky bit of a near-tie.
#[inline(always)]
fn round_f16_f64(x: f64) -> f32 {
    if x == 0.0 || !x.is_finite() {
        return x as f32;
    }
    // The f16 ulp at |x|: 2^(e - 10), e clamped at the subnormal exponent -14. Scaling by a
    // power of two and rounding to an integer are exact in f64.
    let e = (((x.to_bits() >> 52) & 0x7ff) as i32 - 1023).max(-14);
    let ulp = f64::from_bits(((e - 10 + 1023) as u64) << 52);
    let r = (x / ulp).round_ties_even() * ulp;
    // r is an f16 value, or >= 65536 (overflow to infinity).
    f16::from_f64(r).to_f32()
}

/// `ggml_vec_mad_f16(n, y, x, v)`: `y += x*v` on f16 rows (held widened to f32). The first
/// `np_h` elements as `vfmadd213ph` does them: `v` rounded to f16, then `x*vh + y` rounded once
/// to f16 (emulated by an f64 `fma`: the f16 product is exact and the f64 sum, exact unless the
/// operands lie over 53 bits apart, cannot land on an f16 tie the exact sum misses; then one
/// rounding to f16. f32 `fma` then f16 rounds twice and misses by an ulp); the rest `f16(fma(x, v, y))` in f32.
#[inline(always)]
pub fn vec_mad_f16_ggml(y: &mut [f32], x: &[f32], v: f32, np_h: usize) {
    let vh = round_f16(v) as f64;
    for (a, &xv) in y[..np_h].iter_mut().zip(x) {
        *a = round_f16_f64((xv as f64).mul_add(vh, *a as f64));
    }
    for (a, &xv) in y[np_h..].iter_mut().zip(&x[np_h..]) {
        *a = round_f16(xv.mul_add(v, *a));
    }
}

/// `ggml_vec_scale_f16(n, y, v)`: `y *= v` on an f16 row (held widened to f32). The first
/// `np_h` elements as `vmulph`: `f16(y * f16(v))` (the product of two f16 values is exact in
/// f32); the rest `f16(y*v)` in f32.
#[inline(always)]
pub fn vec_scale_f16_ggml(y: &mut [f32], v: f32, np_h: usize) {
    let vh = round_f16(v);
    for a in y[..np_h].iter_mut() {
        *a = round_f16(*a * vh);
    }
    for a in y[np_h..].iter_mut() {
        *a = round_f16(*a * v);
    }
}

/// One query head against keys/values `first..=last` of an f16 cache, as ggml-cpu's
/// `flash_attn_ext_f16_one_chunk` computes it: Q rounded to f16; per key `s = dot*scale`
/// (softcap: `c*tanhf(s*scale/c)`); online softmax with libm `expf`; the f16 accumulator scaled
/// on a new maximum and updated by `acc += v*p` (`vec_scale_f16_ggml` / `vec_mad_f16_ggml`:
/// native f16 arithmetic on the 128-element steps of an AVX512-FP16 build (`fp16_build`), else
/// f32 then f16);
/// finally `acc * (1/S)` in f32.
/// q: [hd]; kc/vc: [len, kv_dim] f16 cache values widened to f32; `off` = the head's offset in
/// a row; out: [hd]
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_ggml(
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    kv_dim: usize,
    off: usize,
    first: usize,
    last: usize,
    scale: f32,
    softcap: Option<f32>,
    split: Option<(usize, usize)>,
    fp16_build: bool,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has FMA (just checked).
        unsafe { flash_attn_ggml_fma(q, kc, vc, kv_dim, off, first, last, scale, softcap, split, fp16_build, out) };
        return;
    }
    flash_attn_ggml_body(q, kc, vc, kv_dim, off, first, last, scale, softcap, split, fp16_build, out)
}

/// `flash_attn_ggml` compiled with FMA instructions (f32::mul_add is otherwise a libm call); the
/// same bits, as a fused multiply-add is correctly rounded either way.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn flash_attn_ggml_fma(
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    kv_dim: usize,
    off: usize,
    first: usize,
    last: usize,
    scale: f32,
    softcap: Option<f32>,
    split: Option<(usize, usize)>,
    fp16_build: bool,
    out: &mut [f32],
) {
    flash_attn_ggml_body(q, kc, vc, kv_dim, off, first, last, scale, softcap, split, fp16_build, out)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn flash_attn_ggml_body(
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    kv_dim: usize,
    off: usize,
    first: usize,
    last: usize,
    scale: f32,
    softcap: Option<f32>,
    split: Option<(usize, usize)>,
    fp16_build: bool,
    out: &mut [f32],
) {
    let hd = q.len();
    let np_h = ggml_f16_arith_len(hd, fp16_build);
    let qh: Vec<f32> = q.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
    let scale = match softcap {
        Some(c) => scale / c,
        None => scale,
    };
    // One chunk of cells lo..=hi: the running max, the sum and the (f16) accumulator.
    let chunk = |lo: usize, hi: usize| -> (f32, f32, Vec<f32>) {
        let mut acc = vec![0f32; hd]; // f16 values
        let (mut s_sum, mut m) = (0f32, f32::NEG_INFINITY);
        for j in lo..=hi {
            let k = &kc[j * kv_dim + off..][..hd];
            let v = &vc[j * kv_dim + off..][..hd];
            let mut s = vec_dot_f16_ggml(k, &qh) * scale;
            if let Some(c) = softcap {
                s = c * s.tanh();
            }
            let (mut ms, mut vs) = (1f32, 1f32);
            if s > m {
                let m_old = m;
                m = s;
                ms = (m_old - m).exp();
                vec_scale_f16_ggml(&mut acc, ms, np_h);
            } else {
                vs = (s - m).exp();
            }
            vec_mad_f16_ggml(&mut acc, v, vs, np_h);
            s_sum = s_sum.mul_add(ms, vs);
        }
        (m, s_sum, acc)
    };
    let (s_sum, acc) = match split {
        None => {
            let (_, s, acc) = chunk(first, last);
            (s, acc)
        }
        Some((n_kv, nth)) => {
            // ggml's KV-split decode: nth chunks of ceil(n_kv/nth) cells, each a partial
            // (M, S, unnormalised V), merged in chunk order.
            let size = n_kv.div_ceil(nth);
            let (mut m_f, mut s_f, mut acc_f) = (f32::NEG_INFINITY, 0f32, vec![0f32; hd]);
            for c0 in (0..n_kv).step_by(size) {
                let (lo, hi) = (c0.max(first), (c0 + size - 1).min(last));
                if lo > hi {
                    continue; // no visible cell: S = 0, skipped by the merge
                }
                let (m_c, s_c, acc_c) = chunk(lo, hi);
                if s_c == 0.0 {
                    continue;
                }
                let m_new = m_f.max(m_c);
                let (so, sn) = ((m_f - m_new).exp(), (m_c - m_new).exp());
                for (a, &b) in acc_f.iter_mut().zip(&acc_c) {
                    *a = a.mul_add(so, b * sn);
                }
                s_f = s_f.mul_add(so, s_c * sn);
                m_f = m_new;
            }
            (s_f, acc_f)
        }
    };
    let inv = if s_sum == 0.0 { 0.0 } else { 1.0 / s_sum };
    for (o, a) in out.iter_mut().zip(&acc) {
        *o = a * inv;
    }
}

/// The cache cells llama.cpp's attention spans for `used` filled cells of a `cache`-cell
/// cache: the used cells padded to 256, at least 256, at most the cache (llama_kv_cache
/// get_n_kv). Single-query attention over >= 512 of them takes ggml's KV-split path.
pub fn llamacpp_n_kv(used: usize, cache: usize) -> usize {
    cache.min(used.div_ceil(256).max(1) * 256)
}

pub const FA_TILE_Q: usize = 64;
const FA_TILE_KV: usize = 64;

/// One query head as ggml-cpu's `flash_attn_ext_tiled` computes it (micro-batches of >= 64
/// queries): keys in tiles of 64 cache cells aligned at 0; a tile with no visible key is
/// skipped. Per tile: `s = Σ_d q[d]·k[d]` as one f32 FMA chain (Q stays f32, K widened from
/// f16) times scale (softcap: `c*tanh`); the running max and sum rescaled with libm `expf` on a
/// new maximum; probabilities `ggml_v_expf(s - M)` summed per 16 lanes into f64 and added to
/// the f32 sum; the f32 accumulator updated by one FMA chain over the tile's keys.
/// q: [hd]; kc/vc: [len, kv_dim] f16 cache values widened to f32; `off` = the head's offset in
/// a row; out: [hd]
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_ggml_tiled(
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    kv_dim: usize,
    off: usize,
    first: usize,
    last: usize,
    scale: f32,
    softcap: Option<f32>,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has FMA (just checked).
        unsafe { flash_attn_ggml_tiled_fma(q, kc, vc, kv_dim, off, first, last, scale, softcap, out) };
        return;
    }
    flash_attn_ggml_tiled_body(q, kc, vc, kv_dim, off, first, last, scale, softcap, out)
}

/// `flash_attn_ggml_tiled` compiled with FMA instructions (f32::mul_add is otherwise a libm call); the
/// same bits, as a fused multiply-add is correctly rounded either way.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn flash_attn_ggml_tiled_fma(
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    kv_dim: usize,
    off: usize,
    first: usize,
    last: usize,
    scale: f32,
    softcap: Option<f32>,
    out: &mut [f32],
) {
    flash_attn_ggml_tiled_body(q, kc, vc, kv_dim, off, first, last, scale, softcap, out)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn flash_attn_ggml_tiled_body(
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    kv_dim: usize,
    off: usize,
    first: usize,
    last: usize,
    scale: f32,
    softcap: Option<f32>,
    out: &mut [f32],
) {
    let hd = q.len();
    let scale = match softcap {
        Some(c) => scale / c,
        None => scale,
    };
    let mut acc = vec![0f32; hd];
    let (mut s_sum, mut m) = (0f32, f32::NEG_INFINITY);
    let mut kq = [f32::NEG_INFINITY; FA_TILE_KV];
    let mut t0 = first - first % FA_TILE_KV;
    while t0 <= last {
        let (lo, hi) = (t0.max(first), (t0 + FA_TILE_KV - 1).min(last));
        kq.fill(f32::NEG_INFINITY);
        for j in lo..=hi {
            let kf = &kc[j * kv_dim + off..][..hd];
            let mut s = q.iter().zip(kf).fold(0f32, |acc, (&a, &b)| a.mul_add(b, acc)) * scale;
            if let Some(c) = softcap {
                s = s.tanh() * c;
            }
            kq[j - t0] = s;
        }
        let tile_max = kq.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let m_new = m.max(tile_max);
        if m_new > m {
            let ms = (m - m_new).exp();
            acc.iter_mut().for_each(|a| *a *= ms);
            s_sum *= ms;
        }
        m = m_new;
        let mut sum = 0f64;
        for chunk in kq.chunks_mut(16) {
            let mut p = [0f32; 16];
            for (pi, x) in p.iter_mut().zip(chunk.iter_mut()) {
                *pi = expf_ggml(*x - m);
                *x = *pi;
            }
            sum += reduce_add_16(&p) as f64;
        }
        s_sum = (s_sum as f64 + sum) as f32;
        // Masked keys have p = 0 and fma(0, v, a) = a: only visible keys change the sum.
        for j in lo..=hi {
            let p = kq[j - t0];
            for (a, &v) in acc.iter_mut().zip(&vc[j * kv_dim + off..][..hd]) {
                *a = p.mul_add(v, *a);
            }
        }
        t0 += FA_TILE_KV;
    }
    let inv = if s_sum == 0.0 { 0.0 } else { 1.0 / s_sum };
    for (o, a) in out.iter_mut().zip(&acc) {
        *o = a * inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expf_ggml_is_close_to_expf() {
        let mut worst = (0f32, 0f32);
        for i in -2000..2000 {
            let x = i as f32 * 0.043;
            let (a, b) = (expf_ggml(x), x.exp());
            let rel = ((a - b) / b).abs();
            if (rel > worst.0 || rel.is_nan()) && !worst.0.is_nan() {
                worst = (rel, x);
            }
        }
        assert!(worst.0 < 4e-7, "expf_ggml off by {} (relative) at x = {}", worst.0, worst.1);
        assert_eq!(expf_ggml(-200.0), 0.0);
        assert_eq!(expf_ggml(200.0), f32::INFINITY);
    }

    #[test]
    fn vec_dot_f16_matches_f64_dot() {
        let x: Vec<f32> = (0..200).map(|i| round_f16(((i * 37 % 101) as f32 - 50.0) / 32.0)).collect();
        let y: Vec<f32> = (0..200).map(|i| round_f16(((i * 53 % 97) as f32 - 48.0) / 16.0)).collect();
        let exact: f64 = x.iter().zip(&y).map(|(&a, &b)| a as f64 * b as f64).sum();
        let got = vec_dot_f16_ggml(&x, &y) as f64;
        assert!((got - exact).abs() <= 1e-6 * exact.abs().max(1.0), "dot {got} vs {exact}");
    }

    #[test]
    fn vec_mad_f16_rounds_once_on_the_fp16_steps() {
        // x*f16(v) + y rounded once to f16 (as vfmadd213ph, checked against it on an
        // AVX512-FP16 CPU) vs f32 fma then f16, which rounds twice and lands one ulp below.
        let x = f16::from_bits(0x30b1).to_f32();
        let y = f16::from_bits(0x3760).to_f32();
        let v = f32::from_bits(0x3d8a_1e82);
        let (mut a, mut b) = ([y], [y]);
        vec_mad_f16_ggml(&mut a, &[x], v, 1);
        vec_mad_f16_ggml(&mut b, &[x], v, 0);
        assert_eq!(f16::from_f32(a[0]).to_bits(), 0x3789);
        assert_eq!(f16::from_f32(b[0]).to_bits(), 0x3788);
        // Every f16-step result is the f16 nearest the exact x*f16(v) + y.
        let vh = round_f16(v) as f64;
        let xs: Vec<f32> = (0..256).map(|i| round_f16(((i * 37 % 101) as f32 - 50.0) / 64.0)).collect();
        let ys: Vec<f32> = (0..256).map(|i| round_f16(((i * 53 % 97) as f32 - 48.0) / 8.0)).collect();
        let mut acc = ys.clone();
        vec_mad_f16_ggml(&mut acc, &xs, v, 256);
        for ((&r, &x), &y) in acc.iter().zip(&xs).zip(&ys) {
            let exact = x as f64 * vh + y as f64;
            let h = f16::from_f32(r);
            let below = f16::from_bits(h.to_bits().wrapping_sub(1)).to_f64();
            let above = f16::from_bits(h.to_bits() + 1).to_f64();
            let d = (h.to_f64() - exact).abs();
            assert!(d <= (below - exact).abs() && d <= (above - exact).abs(), "{x}*{vh}+{y} -> {r}");
        }
    }

    #[test]
    fn vec_scale_f16_uses_the_f16_scalar_on_the_fp16_steps() {
        let y: Vec<f32> = (0..200).map(|i| round_f16((i as f32 - 100.0) / 7.0)).collect();
        let v = 0.3f32;
        let mut a = y.clone();
        vec_scale_f16_ggml(&mut a, v, 128);
        for (i, (&r, &y)) in a.iter().zip(&y).enumerate() {
            let want = if i < 128 { round_f16(y * round_f16(v)) } else { round_f16(y * v) };
            assert_eq!(r.to_bits(), want.to_bits(), "element {i}");
        }
    }
}

//! AVX-512 twins of cortiq's own types' scalar code (`q8r.rs`, `q4t.rs`, `q1.rs`): row
//! dequantization (F + BW + VL, F16C) and the dot product with Q8_0 activations (plus VNNI).
//!
//! Owns: the kernels only; `dequant_avx512::dispatch` and `vecdot_avx512::dispatch/matvec` call
//! them behind the same CPU checks as the GGUF kernels, so `CORTIQ_SIMD=scalar` turns them off
//! too. Every `unsafe` here says why it is sound.
//!
//! Agreement with the scalar twins: dequantization is bit-identical (each lane does the scalar
//! code's single f32 multiply, or picks ±d); the dot products compute the same exact integer
//! sums per 32-element activation block but add the float terms in 16 lanes, so they differ from
//! the scalar order by a few f32 roundings (tests/newtypes.rs prints and bounds the difference).
//!
//! Shape of the dot kernels: the activation row is first unpacked (`Unpacked`: contiguous
//! quants, per-lane scales, per-lane offset sums) once per call; then per 64 weights one
//! 512-bit register of unsigned weight bytes (q8r: 64 bytes with the top bit flipped; q4t: one
//! load of a block's 64 nibble bytes gives elements 0..64 by mask and 64..128 by shift + mask,
//! and a `vpshufb` turns each index into its level + 128; q1: 2 or 0 by a 64-bit mask), one `vpdpbusd` into 16 i32 lanes (lanes 0..8 = first
//! activation block, 8..16 = second) started from the offset correction, then one FMA with the
//! per-lane scale product.
//!
//! Measured with examples/newtypes_bench.rs (AMD EPYC with AVX-512 VNNI, 2 cores shared with
//! other builds, load ~4-8: +-20%), `matvec_q` single thread, G weights/s. Streaming a
//! 262144 x 640 matrix from memory: q8r 23-27 (Q8_0 25-27), q4t 40-49, q1 44-50; 163840 x 1024:
//! q8r 19-22, q4t 31-36 (Q4_K 39-40, Q8_0 25-26), q1 45-48; cache-resident 256 x 2048: q8r
//! 56-58 (Q8_0 35), q4t 62-64 (Q4_K 46), q1 51-53. Unpacking the activation once per call took
//! q4t from 12-19 to 40-49 streaming.
#![cfg(target_arch = "x86_64")]

use super::QuantType;
use super::blocks::*;
use std::arch::x86_64::*;

/// 16 bytes of `s` from `off` (bounds-checked).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn ld16(s: &[u8], off: usize) -> __m128i {
    let s = &s[off..off + 16];
    // SAFETY: `s` is exactly 16 readable bytes; loadu has no alignment requirement.
    unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
}

/// 64 bytes of `s` from `off` (bounds-checked).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn ld64(s: &[u8], off: usize) -> __m512i {
    let s = &s[off..off + 64];
    // SAFETY: `s` is exactly 64 readable bytes; loadu has no alignment requirement.
    unsafe { _mm512_loadu_si512(s.as_ptr().cast()) }
}

/// Store 16 f32 at `dst[off..off + 16]` (bounds-checked).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn st16(dst: &mut [f32], off: usize, v: __m512) {
    let d = &mut dst[off..off + 16];
    // SAFETY: `d` is exactly 16 writable f32; storeu has no alignment requirement.
    unsafe { _mm512_storeu_ps(d.as_mut_ptr(), v) }
}

/// Lanes 0..4 of `v` spread as [v0 x8, v1 x8] (`HI` false) or [v2 x8, v3 x8] (`HI` true): the
/// per-lane scales of one `vpdpbusd` result spanning two activation blocks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn spread<const HI: bool>(v: __m128) -> __m512 {
    let (a, b) = if HI { (2, 3) } else { (0, 1) };
    let idx = _mm512_set_epi32(b, b, b, b, b, b, b, b, a, a, a, a, a, a, a, a);
    // lanes 4..16 of the cast are undefined, but the permute reads only lanes a and b (< 4)
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v))
}

// ---------------------------------------------------------------- dequantization

/// Dequantize a row of `ty` (q8r, q4t or q1), bit-identical to the scalar twin. Lengths were
/// checked by the caller (a wrong one panics on a bounds check, never reads out of bounds).
///
/// # Safety
/// The CPU must support avx512f, avx512bw, avx512vl and f16c.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(super) unsafe fn dequantize(ty: QuantType, src: &[u8], dst: &mut [f32]) {
    match ty {
        QuantType::Q8R => q8r_row(src, dst),
        QuantType::Q4T => q4t_row(src, dst),
        QuantType::Q1 => q1_row(src, dst),
        _ => unreachable!("own_avx512::dequantize({ty}): not a cortiq type"),
    }
}

/// q8r: `q * s` per lane.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn q8r_row(src: &[u8], dst: &mut [f32]) {
    let s = _mm512_set1_ps(super::q8r::scale(src));
    for c in 0..dst.len() / 16 {
        let q = _mm512_cvtepi8_epi32(ld16(src, 16 * c));
        st16(dst, 16 * c, _mm512_mul_ps(_mm512_cvtepi32_ps(q), s));
    }
}

/// The 16 q4t levels in every 128-bit lane, as `vpshufb` tables: signed (`OFFSET` 0) or plus
/// 128 as unsigned bytes (`OFFSET` 128: every level + 128 is in 1..=234).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn levels<const OFFSET: i32>() -> __m512i {
    let l: [u8; 16] = std::array::from_fn(|j| (Q4T_LEVELS[j] as i32 + OFFSET) as u8);
    _mm512_broadcast_i32x4(ld16(&l, 0))
}

/// q4t: `d[g] * level` per lane, 16 lanes per step from the low / high nibble registers looked
/// up in the level table.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn q4t_row(src: &[u8], dst: &mut [f32]) {
    let m4 = _mm512_set1_epi8(0x0F);
    let tbl = levels::<0>();
    for (b, y) in view::<BlockQ4T>(src).iter().zip(dst.chunks_exact_mut(QK_T)) {
        let d: [f32; 4] = std::array::from_fn(|g| f16_soft(b.d[g]));
        let wv = ld64(&b.qs, 0);
        // signed levels as bytes: elements 0..64, then 64..128
        let lo = _mm512_shuffle_epi8(tbl, _mm512_and_si512(wv, m4));
        let hi = _mm512_shuffle_epi8(tbl, _mm512_and_si512(_mm512_srli_epi16::<4>(wv), m4));
        let parts = [
            _mm512_extracti32x4_epi32::<0>(lo),
            _mm512_extracti32x4_epi32::<1>(lo),
            _mm512_extracti32x4_epi32::<2>(lo),
            _mm512_extracti32x4_epi32::<3>(lo),
            _mm512_extracti32x4_epi32::<0>(hi),
            _mm512_extracti32x4_epi32::<1>(hi),
            _mm512_extracti32x4_epi32::<2>(hi),
            _mm512_extracti32x4_epi32::<3>(hi),
        ];
        for (c, &p) in parts.iter().enumerate() {
            // elements 16c..16c+16 belong to group (16c)/32 = c/2
            let v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(p));
            st16(y, 16 * c, _mm512_mul_ps(_mm512_set1_ps(d[c / 2]), v));
        }
    }
}

/// q1: `+d` where the bit is set, `-d` where clear (a masked blend, exact).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn q1_row(src: &[u8], dst: &mut [f32]) {
    for (b, y) in view::<BlockQ1>(src).iter().zip(dst.chunks_exact_mut(QK_T)) {
        let d = f16_soft(b.d);
        let (pos, neg) = (_mm512_set1_ps(d), _mm512_set1_ps(-d));
        for c in 0..QK_T / 16 {
            let m = u16::from_le_bytes([b.qs[2 * c], b.qs[2 * c + 1]]);
            st16(y, 16 * c, _mm512_mask_blend_ps(m, neg, pos));
        }
    }
}

// ---------------------------------------------------------------- dot products

/// A Q8_0 activation row unpacked for these kernels, once per `vec_dot` / `matvec` call rather
/// than once per weight row: the Q8_0 layout puts each block's f16 scale between its quants, so
/// reading it directly costs two loads + an insert per 64 quants, four scalar loads + a gather
/// for the scales and a second `vpdpbusd` for the offset term, all of it the same for every row
/// (q4t ran at 12-19 G weights/s that way, Q4_K's kernel at 40-46).
/// Padded with zeros to a whole number of 64-element chunks.
#[derive(Default)]
struct Unpacked {
    /// The quants, contiguous.
    q: Vec<u8>,
    /// Per 64 quants, 16 lanes: the f32 scale of the first activation block in lanes 0..8, of the
    /// second in 8..16 (the lane layout of a `vpdpbusd` result).
    dx: Vec<f32>,
    /// Per 64 quants, 16 i32 lanes: `-k * (sum of the lane's 4 quants)`, the start value of the
    /// `vpdpbusd` that adds an unsigned-offset weight's products (k = 128 for q8r and q4t, whose
    /// weights / levels are fed as w + 128; 1 for q1).
    corr: Vec<i32>,
}

thread_local! {
    /// Reused across calls: matvec runs once per tile of rows, and the engine's tiles are small.
    static UNPACKED: std::cell::RefCell<Unpacked> = std::cell::RefCell::new(Unpacked::default());
}

/// Unpack `a` (Q8_0 blocks of an `n`-element row) for weight type `ty` into `u`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn unpack(ty: QuantType, a: &[u8], n: usize, u: &mut Unpacked) {
    let chunks = n.div_ceil(64);
    u.q.clear();
    u.q.resize(64 * chunks, 0);
    u.dx.clear();
    u.dx.resize(16 * chunks, 0.0);
    u.corr.clear();
    u.corr.resize(16 * chunks, 0);
    let k = match ty {
        QuantType::Q8R | QuantType::Q4T => 128,
        _ => 1,
    };
    for (b, blk) in a.chunks_exact(34).enumerate() {
        u.q[32 * b..32 * b + 32].copy_from_slice(&blk[2..]);
        let d = f16_soft([blk[0], blk[1]]);
        let lanes = 16 * (b / 2) + 8 * (b % 2);
        u.dx[lanes..lanes + 8].fill(d);
    }
    let ones = _mm512_set1_epi8(1);
    for c in 0..chunks {
        let s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, ld64(&u.q, 64 * c));
        let v = _mm512_mullo_epi32(s, _mm512_set1_epi32(-k));
        let dst = &mut u.corr[16 * c..16 * c + 16];
        // SAFETY: `dst` is exactly 16 writable i32; storeu has no alignment requirement.
        unsafe { _mm512_storeu_si512(dst.as_mut_ptr().cast(), v) };
    }
}

/// 16 f32 of `s` from `off` (bounds-checked).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn ldf(s: &[f32], off: usize) -> __m512 {
    let s = &s[off..off + 16];
    // SAFETY: `s` is exactly 16 readable f32; loadu has no alignment requirement.
    unsafe { _mm512_loadu_ps(s.as_ptr()) }
}

/// 16 i32 of `s` from `off` (bounds-checked).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn ldi(s: &[i32], off: usize) -> __m512i {
    let s = &s[off..off + 16];
    // SAFETY: `s` is exactly 16 readable i32; loadu has no alignment requirement.
    unsafe { _mm512_loadu_si512(s.as_ptr().cast()) }
}

/// One row of `ty` (q8r, q4t or q1) times a Q8_0 activation row of `n` elements. Lengths were
/// checked by the caller; a short slice panics on a bounds check, never reads out of bounds.
///
/// # Safety
/// The CPU must support avx512f, avx512bw, avx512vl, avx512vnni, avx2, fma and f16c.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn vec_dot(ty: QuantType, w: &[u8], a: &[u8]) -> f32 {
    let n = a.len() / 34 * QK;
    UNPACKED.with_borrow_mut(|u| {
        unpack(ty, a, n, u);
        row_dot(ty, w, u)
    })
}

/// `y[r] = vec_dot(ty, row r, a)` for rows of `rb` bytes back to back (lengths checked by the
/// caller), one row at a time (see `vecdot_avx512::matvec` for why), the activation unpacked
/// once.
///
/// # Safety
/// As `vec_dot`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn matvec(ty: QuantType, w: &[u8], rb: usize, a: &[u8], y: &mut [f32]) {
    let n = a.len() / 34 * QK;
    UNPACKED.with_borrow_mut(|u| {
        unpack(ty, a, n, u);
        for (r, (o, row)) in y.iter_mut().zip(w.chunks_exact(rb)).enumerate() {
            super::vecdot_avx512::prefetch_ahead(w, r * rb, rb);
            *o = row_dot(ty, row, u);
        }
    })
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn row_dot(ty: QuantType, w: &[u8], u: &Unpacked) -> f32 {
    match ty {
        QuantType::Q8R => q8r_dot(w, u),
        QuantType::Q4T => q4t_dot(w, u),
        QuantType::Q1 => q1_dot(w, u),
        _ => unreachable!("own_avx512::vec_dot({ty}): not a cortiq type"),
    }
}

/// q8r: the i8 weights become unsigned by flipping their top bit (w + 128), so one
/// `vpdpbusd(corr = -128 * Σx, w + 128, x)` gives Σ w * x per lane; acc += lanes * d_x per 64;
/// the row scale multiplies the reduced sum once.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q8r_dot(w: &[u8], u: &Unpacked) -> f32 {
    let n = w.len() - super::q8r::TRAILER;
    let flip = _mm512_set1_epi8(-128);
    // two chains: one FMA per 64 elements would otherwise wait on its predecessor's latency
    let mut acc = [_mm512_setzero_ps(); 2];
    let full = n / 64;
    let step = |acc: __m512, c: usize| {
        let wv = _mm512_xor_si512(ld64(w, 64 * c), flip);
        let p = _mm512_dpbusd_epi32(ldi(&u.corr, 16 * c), wv, ld64(&u.q, 64 * c));
        _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), ldf(&u.dx, 16 * c), acc)
    };
    for c in (0..full - full % 2).step_by(2) {
        acc[0] = step(acc[0], c);
        acc[1] = step(acc[1], c + 1);
    }
    if full % 2 == 1 {
        acc[0] = step(acc[0], full - 1);
    }
    if !n.is_multiple_of(64) {
        // a last lone 32-element block: its weights in the low half, the padding quants are 0
        let mut t = [0u8; 64];
        t[..32].copy_from_slice(&w[64 * full..64 * full + 32]);
        let wv = _mm512_xor_si512(ld64(&t, 0), flip);
        let p = _mm512_dpbusd_epi32(ldi(&u.corr, 16 * full), wv, ld64(&u.q, 64 * full));
        acc[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), ldf(&u.dx, 16 * full), acc[0]);
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1])) * super::q8r::scale(w)
}

/// q4t: the nibbles looked up as level + 128 (one `vpshufb`), then Σ level * x =
/// `vpdpbusd(corr = -128 * Σx, level + 128, x)` per 64; per block two FMAs with the scale
/// products d_w[g] * d_x[g] spread over their lanes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q4t_dot(w: &[u8], u: &Unpacked) -> f32 {
    let m4 = _mm512_set1_epi8(0x0F);
    let tbl = levels::<128>();
    let mut acc = [_mm512_setzero_ps(); 2];
    let blocks = view::<BlockQ4T>(w);
    let nb = blocks.len();
    // The per-64 loads below are unchecked (this loop is decode's hot spot: ~90% of a q4t
    // token); these three asserts cover every one of them.
    assert!(
        u.q.len() >= 128 * nb && u.corr.len() >= 32 * nb && u.dx.len() >= 32 * nb,
        "q4t_dot: activation shorter than the row"
    );
    let (pq, pc, pd) = (u.q.as_ptr(), u.corr.as_ptr(), u.dx.as_ptr());
    for (k, b) in blocks.iter().enumerate() {
        let wv = ld64(&b.qs, 0);
        let lo = _mm512_shuffle_epi8(tbl, _mm512_and_si512(wv, m4));
        let hi = _mm512_shuffle_epi8(tbl, _mm512_and_si512(_mm512_srli_epi16::<4>(wv), m4));
        let (c0, c1) = (2 * k, 2 * k + 1);
        // SAFETY: c1 < 2 * nb, so 64 * c1 + 64 <= 128 * nb <= u.q.len() and 16 * c1 + 16 <=
        // 32 * nb <= u.corr.len(), u.dx.len() (asserted above); loadu needs no alignment.
        let (q0, q1, r0, r1, x0, x1) = unsafe {
            (
                _mm512_loadu_si512(pq.add(64 * c0).cast()),
                _mm512_loadu_si512(pq.add(64 * c1).cast()),
                _mm512_loadu_si512(pc.add(16 * c0).cast()),
                _mm512_loadu_si512(pc.add(16 * c1).cast()),
                _mm512_loadu_ps(pd.add(16 * c0)),
                _mm512_loadu_ps(pd.add(16 * c1)),
            )
        };
        let p0 = _mm512_dpbusd_epi32(r0, lo, q0);
        let p1 = _mm512_dpbusd_epi32(r1, hi, q1);
        let dw = _mm_cvtph_ps(_mm_set_epi64x(0, i64::from_le_bytes(*b.d.as_flattened().first_chunk::<8>().unwrap())));
        let d0 = _mm512_mul_ps(spread::<false>(dw), x0);
        let d1 = _mm512_mul_ps(spread::<true>(dw), x1);
        acc[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), d0, acc[0]);
        acc[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), d1, acc[1]);
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]))
}

/// q1: Σ ±x = 2 Σ_{bit set} x - Σ x = `vpdpbusd(corr = -Σx, 2 where the bit is set, x)`; per
/// block two FMAs with d_w * d_x[g].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q1_dot(w: &[u8], u: &Unpacked) -> f32 {
    let two = _mm512_set1_epi8(2);
    let mut acc = [_mm512_setzero_ps(); 2];
    for (k, b) in view::<BlockQ1>(w).iter().enumerate() {
        let m0 = u64::from_le_bytes(*b.qs.first_chunk::<8>().unwrap());
        let m1 = u64::from_le_bytes(*b.qs.last_chunk::<8>().unwrap());
        let (c0, c1) = (2 * k, 2 * k + 1);
        let p0 = _mm512_dpbusd_epi32(ldi(&u.corr, 16 * c0), _mm512_maskz_mov_epi8(m0, two), ld64(&u.q, 64 * c0));
        let p1 = _mm512_dpbusd_epi32(ldi(&u.corr, 16 * c1), _mm512_maskz_mov_epi8(m1, two), ld64(&u.q, 64 * c1));
        let d = _mm512_set1_ps(f16_soft(b.d));
        acc[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), _mm512_mul_ps(d, ldf(&u.dx, 16 * c0)), acc[0]);
        acc[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), _mm512_mul_ps(d, ldf(&u.dx, 16 * c1)), acc[1]);
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]))
}

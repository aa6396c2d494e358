//! Scalar dequantization of GGUF blocks to f32, and a row dot product built on it.
//!
//! Owns: one decode function per block type, `dequantize_row` (the dispatch the engine's
//! QTensor calls: the AVX-512 kernels of `dequant_avx512` when the CPU has them, else these),
//! `dequantize_row_scalar` and `dot_row`. These are the scalar references: the SIMD kernels are
//! tested bit for bit against them (tests/dequant_simd.rs).
//!
//! Bit-exactness contract: every value equals what the `gguf` PyPI package (0.19.0,
//! gguf/quants.py) produces, bit for bit. That package computes in numpy f32 with a fixed
//! operation order, and each step below mirrors it:
//!   * f16 scale fields are widened to f32 first (exact), then every product is one f32
//!     multiply (one rounding);
//!   * "with min" types compute `(d * q) + m` / `(d*sc) * q - (dmin*m)`, never fused. Rust
//!     never contracts `a * b + c` into an FMA on its own;
//!   * k-quant sub-block scales `d * sc` are rounded to f32 once per group before multiplying
//!     the quant, exactly as numpy's `dl = d * scales` array does;
//!   * offsets are applied to the integer quant (`d * (q - 8)`), never as `d*q - 8*d`;
//!   * lookup-table types (IQ4_NL, IQ4_XS, MXFP4) multiply the scale by the table's integer
//!     level converted to f32, IQ4_XS through the per-32 `dl = d * (ls - 32)` as numpy does;
//!   * the 2-/3-bit grid types (IQ2_*, IQ3_*) live in `iq23.rs`, whose header says why their
//!     products are exact in any order.
//!
//! Where the order actually matters (checked by mutating this file against the fixtures, and by
//! enumerating products in numpy): an f16 scale has 11 significant bits and every
//! scale*quant product here fits in 13 bits (Q6_K: i8 scale * 6-bit q), so `d * q`,
//! `(d * sc) * q` and `d * (sc * q)` are all exact in f32 and an FMA or a regrouping of the
//! products gives the same bits. What does change bits:
//!   * the sign of zero: `d * (q - 8)` with d < 0 and q = 8 is -0.0, `d*q - 8*d` is +0.0;
//!     likewise `(d*scale) * 0` keeps the sign of d*scale, `d * (scale*0)` that of d (a Q6_K
//!     regrouping mutation fails the fixture on exactly these);
//!   * the add/sub of the min (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K): the one rounding step, which must
//!     be the last operation;
//!   * Q8_K's scale is a full f32, so `q * d` rounds (the same single op on both sides).
//!
//! Every output is a single correctly-rounded IEEE f32 op sequence identical to gguf-py's, so no
//! ulp slack is needed; the tests demand 0 ulp (bit patterns, so -0.0 != +0.0).

use super::QuantType;
use super::blocks::*;
use super::iq23;
use half::f16;
use half::slice::HalfFloatSliceExt;

// ---------------------------------------------------------------- legacy 32-element blocks

/// Q4_0 -> 32 floats. gguf-py: `d * (q.astype(i8) - 8).astype(f32)`.
#[inline]
pub fn dequant_q4_0(b: &BlockQ4_0, y: &mut [f32]) {
    let d = f16_le(b.d);
    for j in 0..QK / 2 {
        let lo = (b.qs[j] & 0x0F) as i32 - 8;
        let hi = (b.qs[j] >> 4) as i32 - 8;
        y[j] = d * lo as f32;
        y[j + QK / 2] = d * hi as f32;
    }
}

/// Q4_1 -> 32 floats. gguf-py: `(d * q) + m` (two roundings).
#[inline]
pub fn dequant_q4_1(b: &BlockQ4_1, y: &mut [f32]) {
    let d = f16_le(b.d);
    let m = f16_le(b.m);
    for j in 0..QK / 2 {
        let lo = (b.qs[j] & 0x0F) as f32;
        let hi = (b.qs[j] >> 4) as f32;
        y[j] = d * lo + m;
        y[j + QK / 2] = d * hi + m;
    }
}

/// The 32 5-bit quants of a Q5 block: element j < 16 is the low nibble of `qs[j]`, element
/// j >= 16 the high nibble of `qs[j - 16]`; bit 4 of element j is bit j of the little-endian u32
/// `qh`. Written as two straight 16-lane loops so the compiler vectorizes them.
#[inline(always)]
fn q5_unpack(qs: &[u8; QK / 2], qh: [u8; 4]) -> [u8; QK] {
    let qh = u32::from_le_bytes(qh);
    let mut q = [0u8; QK];
    for j in 0..QK / 2 {
        q[j] = (qs[j] & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
        q[j + QK / 2] = (qs[j] >> 4) | ((((qh >> (j + QK / 2)) & 1) as u8) << 4);
    }
    q
}

/// Q5_0 -> 32 floats. gguf-py: `d * (q - 16)`.
#[inline]
pub fn dequant_q5_0(b: &BlockQ5_0, y: &mut [f32]) {
    let d = f16_le(b.d);
    let q = q5_unpack(&b.qs, b.qh);
    for (out, &q) in y[..QK].iter_mut().zip(q.iter()) {
        *out = d * (q as i32 - 16) as f32;
    }
}

/// Q5_1 -> 32 floats. gguf-py: `(d * q) + m`.
#[inline]
pub fn dequant_q5_1(b: &BlockQ5_1, y: &mut [f32]) {
    let d = f16_le(b.d);
    let m = f16_le(b.m);
    let q = q5_unpack(&b.qs, b.qh);
    for (out, &q) in y[..QK].iter_mut().zip(q.iter()) {
        *out = d * q as f32 + m;
    }
}

/// Q8_0 -> 32 floats. gguf-py: `x * d`.
#[inline]
pub fn dequant_q8_0(b: &BlockQ8_0, y: &mut [f32]) {
    let d = f16_le(b.d);
    for (out, &q) in y[..QK].iter_mut().zip(b.qs.iter()) {
        *out = q as f32 * d;
    }
}

// ---------------------------------------------------------------- k-quants, 256 elements

/// Q2_K -> 256 floats. Element i: half h = i/128, shift s = (i%128)/32, lane l = i%32,
/// q = (qs[32h + l] >> 2s) & 3, group g = i/16.
/// gguf-py: `dl = d * (sc & 15)`, `ml = dmin * (sc >> 4)` (each rounded to f32), `dl * q - ml`.
#[inline]
pub fn dequant_q2k(b: &BlockQ2K, y: &mut [f32]) {
    let d = f16_le(b.d);
    let dmin = f16_le(b.dmin);
    // loop nest (h, s, l0) walks the 16 groups in order; g = i/16 = 8h + 2s + l0/16
    for h in 0..2 {
        for s in 0..4 {
            for l0 in [0, 16] {
                let g = 8 * h + 2 * s + l0 / 16;
                let dl = d * (b.scales[g] & 0x0F) as f32;
                let ml = dmin * (b.scales[g] >> 4) as f32;
                let qs = &b.qs[32 * h + l0..32 * h + l0 + 16];
                for (o, &q) in y[16 * g..16 * g + 16].iter_mut().zip(qs) {
                    *o = dl * ((q >> (2 * s)) & 3) as f32 - ml;
                }
            }
        }
    }
}

/// The 16 signed 6-bit scales of a Q3_K block (value - 32), unpacked from 12 bytes:
/// low 4 bits of scale k from byte k%8 (nibble k/8), high 2 bits from byte 8 + k%4
/// (bit pair k/4).
#[inline]
pub fn q3k_scales(sc: &[u8; 12]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (k, o) in out.iter_mut().enumerate() {
        let lo = (sc[k % 8] >> (4 * (k / 8))) & 0x0F;
        let hi = (sc[8 + k % 4] >> (2 * (k / 4))) & 0x03;
        *o = (lo | (hi << 4)) as i8 - 32;
    }
    out
}

/// Q3_K -> 256 floats. Element i: low 2 bits as Q2_K, high bit = (hmask[i%32] >> (i/32)) & 1;
/// q = low - 4 when that bit is clear. gguf-py: `dl = d * scale` (f32), `dl * q`.
#[inline]
pub fn dequant_q3k(b: &BlockQ3K, y: &mut [f32]) {
    let d = f16_le(b.d);
    let scales = q3k_scales(&b.scales);
    // same loop nest as Q2_K; the hmask bit index is i/32 = 4h + s
    for h in 0..2 {
        for s in 0..4 {
            for l0 in [0, 16] {
                let g = 8 * h + 2 * s + l0 / 16;
                let dl = d * scales[g] as f32;
                let qs = &b.qs[32 * h + l0..32 * h + l0 + 16];
                let hm = &b.hmask[l0..l0 + 16];
                for ((o, &q), &m) in y[16 * g..16 * g + 16].iter_mut().zip(qs).zip(hm) {
                    let low = ((q >> (2 * s)) & 3) as i32;
                    let hbit = ((m >> (4 * h + s)) & 1) as i32;
                    *o = dl * (low - ((hbit ^ 1) << 2)) as f32;
                }
            }
        }
    }
}

/// The 8 (scale, min) 6-bit pairs of a Q4_K/Q5_K block, unpacked from 12 bytes
/// (ggml's `get_scale_min_k4`): for j < 4 the low 6 bits of bytes j and j+4; for j >= 4 a nibble
/// of byte j+4 plus the top 2 bits of bytes j-4 and j.
#[inline]
pub fn k4_scale_min(sc: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut s = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..4 {
        s[j] = sc[j] & 0x3F;
        m[j] = sc[j + 4] & 0x3F;
    }
    for j in 4..8 {
        s[j] = (sc[j + 4] & 0x0F) | ((sc[j - 4] >> 6) << 4);
        m[j] = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
    }
    (s, m)
}

/// Q4_K -> 256 floats. Element i: chunk c = i/64, nibble n = (i%64)/32, lane l = i%32,
/// q = (qs[32c + l] >> 4n) & 15, group g = i/32.
/// gguf-py: `d1 = d * sc`, `m1 = dmin * m` (each rounded to f32), `d1 * q - m1`.
#[inline]
pub fn dequant_q4k(b: &BlockQ4K, y: &mut [f32]) {
    let d = f16_le(b.d);
    let dmin = f16_le(b.dmin);
    let (sc, mn) = k4_scale_min(&b.scales);
    for (g, out) in y[..QK_K].chunks_exact_mut(32).enumerate() {
        let d1 = d * sc[g] as f32;
        let m1 = dmin * mn[g] as f32;
        let (c, n) = (g / 2, g % 2);
        for (l, o) in out.iter_mut().enumerate() {
            let q = (b.qs[32 * c + l] >> (4 * n)) & 0x0F;
            *o = d1 * q as f32 - m1;
        }
    }
}

/// Q5_K -> 256 floats. As Q4_K, plus bit 4 = `(qh[l] >> g) & 1` for group g = i/32, lane l = i%32.
#[inline]
pub fn dequant_q5k(b: &BlockQ5K, y: &mut [f32]) {
    let d = f16_le(b.d);
    let dmin = f16_le(b.dmin);
    let (sc, mn) = k4_scale_min(&b.scales);
    for (g, out) in y[..QK_K].chunks_exact_mut(32).enumerate() {
        let d1 = d * sc[g] as f32;
        let m1 = dmin * mn[g] as f32;
        let (c, n) = (g / 2, g % 2);
        for (l, o) in out.iter_mut().enumerate() {
            let lo = (b.qs[32 * c + l] >> (4 * n)) & 0x0F;
            let hi = (b.qh[l] >> g) & 1;
            *o = d1 * (lo | (hi << 4)) as f32 - m1;
        }
    }
}

/// Q6_K -> 256 floats. Element i: half h = i/128, low nibble from ql[64h + i%64] (nibble
/// (i%128)/64), high 2 bits from qh[32h + i%32] (pair (i%128)/32); q - 32; group g = i/16.
/// gguf-py: `dl = d * scale` (f32), `dl * (q - 32)`.
#[inline]
pub fn dequant_q6k(b: &BlockQ6K, y: &mut [f32]) {
    let d = f16_le(b.d);
    // i = 128h + 32s + l: low nibble of ql[64h + 32(s%2) + l] (nibble s/2), high bits
    // (qh[32h + l] >> 2s) & 3; group g = i/16 = 8h + 2s + l0/16
    for h in 0..2 {
        for s in 0..4 {
            for l0 in [0, 16] {
                let g = 8 * h + 2 * s + l0 / 16;
                let dl = d * b.scales[g] as f32;
                let base = 64 * h + 32 * (s % 2) + l0;
                let ql = &b.ql[base..base + 16];
                let qh = &b.qh[32 * h + l0..32 * h + l0 + 16];
                for ((o, &lo), &hi) in y[16 * g..16 * g + 16].iter_mut().zip(ql).zip(qh) {
                    let lo = (lo >> (4 * (s / 2))) & 0x0F;
                    let hi = (hi >> (2 * s)) & 0x03;
                    *o = dl * ((lo | (hi << 4)) as i32 - 32) as f32;
                }
            }
        }
    }
}

/// Q8_K -> 256 floats: `q * d` with an f32 `d` (gguf-py 0.19.0 has no Q8_K dequantizer;
/// this is ggml's `dequantize_row_q8_K`, a single product per element).
#[inline]
pub fn dequant_q8k(b: &BlockQ8K, y: &mut [f32]) {
    let d = f32::from_le_bytes(b.d);
    for (out, &q) in y[..QK_K].iter_mut().zip(b.qs.iter()) {
        *out = q as f32 * d;
    }
}

// ---------------------------------------------------------------- 4-bit lookup-table types

/// IQ4_NL -> 32 floats. gguf-py: `d * kvalues[q].astype(f32)` (one exact product: an f16 times
/// a 7-bit integer).
#[inline]
pub fn dequant_iq4nl(b: &BlockIQ4NL, y: &mut [f32]) {
    let d = f16_le(b.d);
    for j in 0..QK / 2 {
        y[j] = d * KVALUES_IQ4NL[(b.qs[j] & 0x0F) as usize] as f32;
        y[j + QK / 2] = d * KVALUES_IQ4NL[(b.qs[j] >> 4) as usize] as f32;
    }
}

/// IQ4_XS sub-block scales, `ls - 32` in -32..32: low 4 bits from nibble ib%2 of
/// `scales_l[ib/2]`, high 2 bits from bit pair ib of the little-endian u16 `scales_h`.
#[inline]
pub fn iq4xs_scales(b: &BlockIQ4XS) -> [i8; 8] {
    let h = u16::from_le_bytes(b.scales_h);
    std::array::from_fn(|ib| {
        let lo = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0F;
        let hi = ((h >> (2 * ib)) & 3) as u8;
        (lo | (hi << 4)) as i8 - 32
    })
}

/// IQ4_XS -> 256 floats. gguf-py: `dl = d * scale` (f32, exact), `dl * kvalues[q]`; sub-block ib
/// takes `qs[16ib..16ib + 16]` in IQ4_NL's nibble order.
#[inline]
pub fn dequant_iq4xs(b: &BlockIQ4XS, y: &mut [f32]) {
    let d = f16_le(b.d);
    let sc = iq4xs_scales(b);
    for (ib, out) in y[..QK_K].chunks_exact_mut(QK).enumerate() {
        let dl = d * sc[ib] as f32;
        let qs = &b.qs[16 * ib..16 * ib + 16];
        for (j, &q) in qs.iter().enumerate() {
            out[j] = dl * KVALUES_IQ4NL[(q & 0x0F) as usize] as f32;
            out[j + QK / 2] = dl * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
        }
    }
}

/// MXFP4 -> 32 floats. gguf-py: `e8m0_half(e) * kvalues[q].astype(f32)`: a power of two times
/// a small integer, exact unless it overflows (e >= 253) or leaves the subnormal range.
#[inline]
pub fn dequant_mxfp4(b: &BlockMXFP4, y: &mut [f32]) {
    let d = e8m0_half(b.e);
    for j in 0..QK / 2 {
        y[j] = d * KVALUES_MXFP4[(b.qs[j] & 0x0F) as usize] as f32;
        y[j + QK / 2] = d * KVALUES_MXFP4[(b.qs[j] >> 4) as usize] as f32;
    }
}

// ---------------------------------------------------------------- row dispatch

fn blockwise<B: Block>(src: &[u8], dst: &mut [f32], f: fn(&B, &mut [f32])) {
    for (b, y) in view::<B>(src).iter().zip(dst.chunks_exact_mut(B::ELEMS)) {
        f(b, y);
    }
}

/// Panic with a message naming the function, type and both sizes when a row's byte length is
/// not `ty.row_bytes(n)`. With `#[track_caller]` on the public entry points too, the
/// report names the caller's line.
#[track_caller]
fn check_len(func: &str, ty: QuantType, n: usize, want: Option<usize>, got: usize) {
    match want {
        Some(w) if w == got => {}
        Some(w) => panic!("{func}({ty}): {n} elements need {w} bytes, got {got}"),
        None => {
            panic!("{func}({ty}): {n} elements is not a whole number of {}-element blocks ({got} bytes given)", ty.block_size())
        }
    }
}

/// Dequantize one row of `dst.len()` elements of type `ty` from its raw GGUF bytes.
///
/// `src` must be exactly `ty.row_bytes(dst.len())` bytes. A mismatch is a caller bug (the
/// engine validates tensor shapes at load time), so it panics with both lengths named.
/// Output is bit-identical to gguf-py 0.19.0's `gguf.quants.dequantize`.
///
/// Runs the AVX-512 kernels of `dequant_avx512` when the CPU has them (and `CORTIQ_SIMD` is not
/// `scalar`), else `dequantize_row_scalar`; both give the same bits.
#[track_caller]
pub fn dequantize_row(ty: QuantType, src: &[u8], dst: &mut [f32]) {
    let n = dst.len();
    let want = ty.row_bytes(n);
    check_len("dequantize_row", ty, n, want, src.len());
    if super::dequant_avx512::dispatch(ty, src, dst) {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::simd::level() == crate::simd::Level::Avx2 {
        // SAFETY: level() returned Avx2 after detecting avx2, fma and f16c.
        unsafe { scalar_row_avx2(ty, src, dst) };
        return;
    }
    scalar_row(ty, src, dst);
}

/// `scalar_row` compiled for AVX2 + FMA (no AVX-512): the same code, so the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn scalar_row_avx2(ty: QuantType, src: &[u8], dst: &mut [f32]) {
    scalar_row(ty, src, dst)
}

/// The scalar reference of `dequantize_row` (same contract), kept as the SIMD kernels' oracle.
#[track_caller]
pub fn dequantize_row_scalar(ty: QuantType, src: &[u8], dst: &mut [f32]) {
    let n = dst.len();
    let want = ty.row_bytes(n);
    check_len("dequantize_row_scalar", ty, n, want, src.len());
    scalar_row(ty, src, dst);
}

/// `dequantize_row_scalar` after the length check.
#[inline(always)]
fn scalar_row(ty: QuantType, src: &[u8], dst: &mut [f32]) {
    match ty {
        QuantType::F32 => {
            for (o, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        QuantType::F16 => {
            // half's per-value to_f32 re-detects F16C on every call (~0.3 Gelem/s); its slice
            // conversion detects once and converts 8 at a time. Both are exact for every
            // non-NaN f16 (NaN payloads may be quieted).
            let mut bits = [f16::ZERO; 256];
            for (d, s) in dst.chunks_mut(256).zip(src.chunks(512)) {
                let bits = &mut bits[..d.len()];
                for (b, c) in bits.iter_mut().zip(s.chunks_exact(2)) {
                    *b = f16::from_bits(u16::from_le_bytes([c[0], c[1]]));
                }
                bits.convert_to_f32_slice(d);
            }
        }
        QuantType::BF16 => {
            for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                // bf16 is the top half of an f32: a shift, exactly gguf-py's `int32 << 16`
                // (NaN payloads included, unlike a quieting conversion)
                *o = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
            }
        }
        QuantType::Q4_0 => blockwise(src, dst, dequant_q4_0),
        QuantType::Q4_1 => blockwise(src, dst, dequant_q4_1),
        QuantType::Q5_0 => blockwise(src, dst, dequant_q5_0),
        QuantType::Q5_1 => blockwise(src, dst, dequant_q5_1),
        QuantType::Q8_0 => blockwise(src, dst, dequant_q8_0),
        QuantType::Q2K => blockwise(src, dst, dequant_q2k),
        QuantType::Q3K => blockwise(src, dst, dequant_q3k),
        QuantType::Q4K => blockwise(src, dst, dequant_q4k),
        QuantType::Q5K => blockwise(src, dst, dequant_q5k),
        QuantType::Q6K => blockwise(src, dst, dequant_q6k),
        QuantType::Q8K => blockwise(src, dst, dequant_q8k),
        QuantType::IQ4NL => blockwise(src, dst, dequant_iq4nl),
        QuantType::IQ4XS => blockwise(src, dst, dequant_iq4xs),
        QuantType::MXFP4 => blockwise(src, dst, dequant_mxfp4),
        QuantType::IQ2XXS => blockwise(src, dst, iq23::dequant::<BlockIQ2XXS>),
        QuantType::IQ2XS => blockwise(src, dst, iq23::dequant::<BlockIQ2XS>),
        QuantType::IQ2S => blockwise(src, dst, iq23::dequant::<BlockIQ2S>),
        QuantType::IQ3XXS => blockwise(src, dst, iq23::dequant::<BlockIQ3XXS>),
        QuantType::IQ3S => blockwise(src, dst, iq23::dequant::<BlockIQ3S>),
        QuantType::Q8R => super::q8r::dequantize(src, dst),
        QuantType::Q4T => super::q4t::dequantize(src, dst),
        QuantType::Q1 => super::q1::dequantize(src, dst),
    }
}

/// Dequantize `dst.len() / cols` whole rows of `cols` elements stored back to back
/// (`src.len() == rows * ty.row_bytes(cols)`). For every type but q8r that is one
/// `dequantize_row` call; q8r rows each end in their own scale (`QuantType::row_trailer`), so a
/// run of them is not one longer row and is decoded row by row. Panics on lengths that do not
/// fit (a caller bug, as for `dequantize_row`).
#[track_caller]
pub fn dequantize_rows(ty: QuantType, src: &[u8], cols: usize, dst: &mut [f32]) {
    let rows = dst.len().checked_div(cols).unwrap_or(0);
    let rb = ty.row_bytes(cols);
    assert!(
        rows * cols == dst.len() && rb.and_then(|rb| rb.checked_mul(rows)) == Some(src.len()),
        "dequantize_rows({ty}): {} values of {cols}-element rows need {:?} bytes per row, got {} bytes",
        dst.len(),
        rb,
        src.len()
    );
    if ty.row_trailer() == 0 {
        dequantize_row(ty, src, dst);
        return;
    }
    let rb = rb.unwrap_or(0);
    for (s, d) in src.chunks_exact(rb.max(1)).zip(dst.chunks_exact_mut(cols.max(1))) {
        dequantize_row(ty, s, d);
    }
}

// ---------------------------------------------------------------- dot product

/// Elements decoded per step of `dot_row`: one k-quant super-block, a whole number of blocks
/// of every type, 1 KiB of stack.
const DOT_CHUNK: usize = QK_K;

/// Dot product of one quantized row (type `ty`, `x.len()` elements) with an f32 vector.
///
/// Correctness-first scalar reference: each 256-element chunk is dequantized (bit-exactly, as
/// `dequantize_row`) into a stack buffer and multiplied with `x` in f32 into 8 interleaved
/// accumulators (lane `i % 8`), which are summed pairwise at the end. The result therefore
/// equals `dot(dequantize_row(src), x)` under that fixed summation order; SIMD kernels added
/// later are compared to it with a tolerance, not bitwise (they round products differently).
///
/// `src_row` must be exactly `ty.row_bytes(x.len())` bytes; panics otherwise.
#[track_caller]
pub fn dot_row(ty: QuantType, src_row: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    let want = ty.row_bytes(n);
    check_len("dot_row", ty, n, want, src_row.len());
    if ty.row_trailer() != 0 {
        // the row's scale sits at its end: decode it whole, then the same 8-lane sum
        let mut y = vec![0f32; n];
        dequantize_row(ty, src_row, &mut y);
        let mut acc = [0f32; 8];
        for (i, (a, b)) in y.iter().zip(x).enumerate() {
            acc[i % 8] += a * b;
        }
        return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    }
    // bytes per DOT_CHUNK elements; exact because DOT_CHUNK is a multiple of every block size
    let chunk_bytes = DOT_CHUNK / ty.block_size() * ty.type_size();
    let mut buf = [0f32; DOT_CHUNK];
    let mut acc = [0f32; 8];
    for (xs, bytes) in x.chunks(DOT_CHUNK).zip(src_row.chunks(chunk_bytes)) {
        // the last chunk may be shorter (a row of e.g. 96 Q8_0 elements)
        let y = &mut buf[..xs.len()];
        dequantize_row(ty, bytes, y);
        // lane k accumulates elements i with i % 8 == k; chunks are multiples of 8 except
        // a row's last, so the tail keeps that assignment. The fixed 8-lane inner loop has no
        // cross-lane dependency, so it vectorizes without reassociating anything.
        let mut ya = y.chunks_exact(8);
        let mut xa = xs.chunks_exact(8);
        for (yc, xc) in (&mut ya).zip(&mut xa) {
            for k in 0..8 {
                acc[k] += yc[k] * xc[k];
            }
        }
        for (k, (a, b)) in ya.remainder().iter().zip(xa.remainder()).enumerate() {
            acc[k] += a * b;
        }
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

//! Q4_K, Q5_K and Q6_K in the 16-row interleaved layout of `quant::ileave` (the same idea: lane r of a
//! register holds 4 consecutive quants of row r, one `vpdpbusd` against 4 broadcast activation
//! bytes does 64 products of 16 rows, no lane reduction), with Q8_K activations.
//!
//! Q4_K layout: per group of 16 rows, per 256-element super-block b, 2368 bytes (GGUF's 16 × 144 =
//! 2304 plus 64: the 6-bit scales and mins are stored unpacked, one byte each, so that a
//! sub-block's 16 row scales are one 16-byte load):
//! - 16 f16 `d`, 16 f16 `dmin` (64 bytes, row order);
//! - 8 × 16 scale bytes (sub-block j, row r), then 8 × 16 min bytes (256 bytes);
//! - 4 × 8 chunks of 64 bytes: chunk (c, i) bytes 4r..4r+4 = row r's `qs[32c + 4i..+4]` (low
//!   nibbles: sub-block 2c elements 4i.., high nibbles: sub-block 2c + 1).
//!
//! Arithmetic (both twins, bit for bit), per row r and super-block b with activation scale d_a:
//! `S = Σ_j sc_j · Σ_{e in j} q·a` and `M = Σ_j m_j · Σ_{e in j} a` (exact i32), then
//! `acc = fma(f32(S), d·d_a, acc)` and `acc = fma(-f32(M), dmin·d_a, acc)`; y_r = acc.
//!
//! Q5_K: the Q4_K layout plus 64 × u64 masks of the fifth bits (2880 bytes, GGUF's 2816 + 64):
//! mask 2·(8c + i) + h, bit 4r + l = the fifth bit of element 4i + l of sub-block 2c + h of row
//! r; u = nibble + 16·bit, the same arithmetic.
//!
//! Q6_K layout: per group of 16 rows, per super-block, 3360 bytes (exactly GGUF's 16 × 210):
//! - 16 f16 `d` (32 bytes), then 16 × 16 signed scale bytes (sub-block j of 16, row r);
//! - 32 chunks of 64 bytes of nibbles: chunk n bytes 4r..4r+4 = the low 4 bits of row r's
//!   elements 4n..4n+4 (low nibbles) and 128 + 4n.. (high nibbles);
//! - 16 planes of 64 bytes: plane j byte 4r + i bits 2s..2s+2 = the top 2 bits of row r's
//!   element 16j + 4s + i.
//!
//! Q6_K arithmetic: `S = Σ_j sc_j · (Σ_{e in j} u·a − 32·Σ_{e in j} a)` (u the unsigned 6-bit
//! quant, exact i32), then `acc = fma(f32(S), d·d_a, acc)`.

use super::blocks::f16_le;
use super::dequant::k4_scale_min;
use super::ileave::{Ahead, IL_ROWS, PassOut};

/// GGUF bytes of one Q4_K block, and of one interleaved 16-row block-group.
const BB: usize = 144;
pub(super) const GBB: usize = 2368;
/// Q5_K: GGUF block bytes and the interleaved block-group (GBB + the 512 bytes of masks).
const Q5_BB: usize = 176;
pub(super) const Q5_GBB: usize = GBB + 512;

/// (GGUF block bytes, interleaved block-group bytes) for Q4_K (`h5` false) or Q5_K.
fn sizes(h5: bool) -> (usize, usize) {
    if h5 { (Q5_BB, Q5_GBB) } else { (BB, GBB) }
}
/// Bytes of one Q8_K activation block.
const AB: usize = 292;
/// Columns per pass over a group (register budget: 16 unpacked quant registers plus two
/// accumulators per column).
const PASS_COLS: usize = 4;

/// The interleaved form of `rows` Q4_K rows (`w`: rows × row bytes), zero rows padding the last
/// group; groups packed in parallel.
pub(super) fn ileave(h5: bool, w: &[u8], rows: usize, cols: usize, out: &mut [u8]) {
    use rayon::prelude::*;
    let (bb, gbb) = sizes(h5);
    let nb = cols / 256;
    let rb = nb * bb;
    let zero = vec![0u8; rb];
    out.par_chunks_mut((nb * gbb).max(1)).enumerate().for_each(|(g, dst)| {
        let src: [&[u8]; IL_ROWS] = std::array::from_fn(|r| {
            let row = g * IL_ROWS + r;
            if row < rows { &w[row * rb..(row + 1) * rb] } else { &zero[..] }
        });
        for (b, d) in dst.chunks_exact_mut(gbb).enumerate() {
            pack_block(h5, &src, b * bb, d);
        }
    });
}

fn pack_block(h5: bool, src: &[&[u8]; IL_ROWS], at: usize, dst: &mut [u8]) {
    let (bb, _) = sizes(h5);
    // Q5_K's quants follow its 32 fifth-bit bytes
    let q0 = if h5 { 48 } else { 16 };
    for (r, row) in src.iter().enumerate() {
        let blk = &row[at..at + bb];
        dst[2 * r..2 * r + 2].copy_from_slice(&blk[0..2]);
        dst[32 + 2 * r..32 + 2 * r + 2].copy_from_slice(&blk[2..4]);
        let (sc, mn) = k4_scale_min(blk[4..16].try_into().expect("12 bytes"));
        for j in 0..8 {
            dst[64 + 16 * j + r] = sc[j];
            dst[192 + 16 * j + r] = mn[j];
        }
        for c in 0..4 {
            for i in 0..8 {
                let o = 320 + (8 * c + i) * 64 + 4 * r;
                dst[o..o + 4].copy_from_slice(&blk[q0 + 32 * c + 4 * i..q0 + 32 * c + 4 * i + 4]);
                if h5 {
                    for h in 0..2 {
                        let mi = GBB + 8 * (2 * (8 * c + i) + h);
                        let mut m = u64::from_le_bytes(dst[mi..mi + 8].try_into().expect("8 bytes"));
                        for l in 0..4 {
                            let bit = (blk[16 + 4 * i + l] >> (2 * c + h)) & 1;
                            m |= u64::from(bit) << (4 * r + l);
                        }
                        dst[mi..mi + 8].copy_from_slice(&m.to_le_bytes());
                    }
                }
            }
        }
    }
}

/// Row r's GGUF block out of one block-group (the inverse of `pack_block`; the 12 scale bytes
/// re-packed as ggml packs them).
pub(super) fn unpack_block(h5: bool, src: &[u8], r: usize, blk: &mut [u8]) {
    let q0 = if h5 { 48 } else { 16 };
    blk[0..2].copy_from_slice(&src[2 * r..2 * r + 2]);
    blk[2..4].copy_from_slice(&src[32 + 2 * r..32 + 2 * r + 2]);
    let sc: [u8; 8] = std::array::from_fn(|j| src[64 + 16 * j + r]);
    let mn: [u8; 8] = std::array::from_fn(|j| src[192 + 16 * j + r]);
    let q = &mut blk[4..16];
    for j in 0..4 {
        q[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        q[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
        q[j + 8] = (sc[j + 4] & 0x0F) | ((mn[j + 4] & 0x0F) << 4);
    }
    for c in 0..4 {
        for i in 0..8 {
            let o = 320 + (8 * c + i) * 64 + 4 * r;
            blk[q0 + 32 * c + 4 * i..q0 + 32 * c + 4 * i + 4].copy_from_slice(&src[o..o + 4]);
        }
    }
    if h5 {
        for e in 0..32 {
            let (i, l) = (e / 4, e % 4);
            let mut qh = 0u8;
            for j in 0..8 {
                let mi = GBB + 8 * (2 * (8 * (j / 2) + i) + j % 2);
                let m = u64::from_le_bytes(src[mi..mi + 8].try_into().expect("8 bytes"));
                qh |= (((m >> (4 * r + l)) & 1) as u8) << j;
            }
            blk[16 + e] = qh;
        }
    }
}

/// One column's activation side: per super-block d_a and the 8 sub-block sums Σ a.
#[derive(Default)]
pub(super) struct Col {
    d: Vec<f32>,
    sums: Vec<[i32; 8]>,
    /// `sums` as f32 (exact: |sum| <= 4096), for the kernel's float min term.
    sumsf: Vec<[f32; 8]>,
}

impl Col {
    pub(super) fn fill(&mut self, act: &[u8], nb: usize) {
        self.d.clear();
        self.sums.clear();
        self.sumsf.clear();
        for blk in act.chunks_exact(AB).take(nb) {
            self.d.push(f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]));
            let bs = |i: usize| i16::from_le_bytes([blk[260 + 2 * i], blk[261 + 2 * i]]) as i32;
            let sums: [i32; 8] = std::array::from_fn(|j| bs(2 * j) + bs(2 * j + 1));
            self.sums.push(sums);
            self.sumsf.push(sums.map(|x| x as f32));
        }
    }
}

/// `matvec_ileave` for Q4_K and Q5_K with the columns prepared (`cs[j]` filled from activation
/// row j; lengths checked by the caller).
pub(super) fn matvec_with(h5: bool, packed: &[u8], cols: usize, acts: &[u8], cs: &[Col], ys: &mut [&mut [f32]]) {
    if !avx512::matvec(h5, packed, cols / 256, acts, cs, ys) && !avx2::matvec(h5, packed, cols / 256, acts, cs, ys) {
        matvec_scalar(h5, packed, cols, acts, ys);
    }
}

/// `matvec_ileave` for Q6_K with the columns prepared (`cs[j]` filled from activation row j;
/// lengths checked by the caller).
pub(super) fn q6_matvec_with(packed: &[u8], cols: usize, acts: &[u8], cs: &[Col6], ys: &mut [&mut [f32]]) {
    if !avx512::q6_matvec(packed, cols / 256, acts, cs, ys) && !avx2::q6_matvec(packed, cols / 256, acts, cs, ys) {
        q6_matvec_scalar(packed, cols, acts, ys);
    }
}

/// The scalar twin (lengths checked by the caller).
pub(super) fn matvec_scalar(h5: bool, packed: &[u8], cols: usize, acts: &[u8], ys: &mut [&mut [f32]]) {
    let gbb = sizes(h5).1;
    let nb = cols / 256;
    let groups = packed.len() / (nb * gbb).max(1);
    let mut col = Col::default();
    for (j, a) in acts.chunks_exact(AB * nb).enumerate() {
        col.fill(a, nb);
        for g in 0..groups {
            let mut acc = [0f32; IL_ROWS];
            for b in 0..nb {
                let src = &packed[(g * nb + b) * gbb..][..gbb];
                let q = &a[b * AB + 4..b * AB + 260];
                for (r, acc) in acc.iter_mut().enumerate() {
                    let (mut s, mut m) = (0i32, 0i32);
                    for sb in 0..8 {
                        let (c, hi) = (sb / 2, sb % 2 == 1);
                        let mut isum = 0i32;
                        for e in 0..32 {
                            let (i, l) = (e / 4, e % 4);
                            let byte = src[320 + (8 * c + i) * 64 + 4 * r + l];
                            let mut u = if hi { byte >> 4 } else { byte & 0x0F } as i32;
                            if h5 {
                                let mi = GBB + 8 * (2 * (8 * c + i) + usize::from(hi));
                                let mask = u64::from_le_bytes(src[mi..mi + 8].try_into().expect("8 bytes"));
                                u += 16 * ((mask >> (4 * r + l)) & 1) as i32;
                            }
                            isum += u * q[32 * sb + e] as i8 as i32;
                        }
                        s += src[64 + 16 * sb + r] as i32 * isum;
                        m += src[192 + 16 * sb + r] as i32 * col.sums[b][sb];
                    }
                    let d = f16_le([src[2 * r], src[2 * r + 1]]);
                    let dmin = f16_le([src[32 + 2 * r], src[33 + 2 * r]]);
                    *acc = (s as f32).mul_add(d * col.d[b], *acc);
                    *acc = (-(m as f32)).mul_add(dmin * col.d[b], *acc);
                }
            }
            ys[j][g * IL_ROWS..(g + 1) * IL_ROWS].copy_from_slice(&acc);
        }
    }
}

mod avx512 {
    use super::{AB, Ahead, Col, Col6, GBB, PASS_COLS, PassOut, Q6_GBB};

    pub(super) fn q6_matvec(packed: &[u8], nb: usize, acts: &[u8], cs: &[Col6], ys: &mut [&mut [f32]]) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            if !super::super::vecdot_avx512::available() {
                return false;
            }
            let ab = AB * nb;
            let gb = nb * Q6_GBB;
            super::super::ileave::passes(
                (packed, gb, PASS_COLS),
                (acts, ab, cs),
                ys,
                |grp, pf, _, kk, a: &[&[u8]; PASS_COLS], c: &[&Col6; PASS_COLS], out| {
                    // SAFETY: available() confirmed avx512f/bw/vl/vnni, avx2, fma and f16c.
                    unsafe {
                        match kk {
                            1 => imp::q6_group::<1>(grp, pf, nb, a, c, out),
                            2 => imp::q6_group::<2>(grp, pf, nb, a, c, out),
                            3 => imp::q6_group::<3>(grp, pf, nb, a, c, out),
                            _ => imp::q6_group::<4>(grp, pf, nb, a, c, out),
                        }
                    }
                },
            );
            true
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (packed, nb, acts, cs, ys);
            false
        }
    }

    pub(super) fn matvec(h5: bool, packed: &[u8], nb: usize, acts: &[u8], cs: &[Col], ys: &mut [&mut [f32]]) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            if !super::super::vecdot_avx512::available() {
                return false;
            }
            let ab = AB * nb;
            let gb = nb * super::sizes(h5).1;
            super::super::ileave::passes(
                (packed, gb, PASS_COLS),
                (acts, ab, cs),
                ys,
                |grp, pf, _, kk, a: &[&[u8]; PASS_COLS], c: &[&Col; PASS_COLS], out| {
                    // SAFETY: available() confirmed avx512f/bw/vl/vnni, avx2, fma and f16c.
                    unsafe {
                        match (h5, kk) {
                            (false, 1) => imp::group::<1, false>(grp, pf, nb, a, c, out),
                            (false, 2) => imp::group::<2, false>(grp, pf, nb, a, c, out),
                            (false, 3) => imp::group::<3, false>(grp, pf, nb, a, c, out),
                            (false, _) => imp::group::<4, false>(grp, pf, nb, a, c, out),
                            (true, 1) => imp::group::<1, true>(grp, pf, nb, a, c, out),
                            (true, 2) => imp::group::<2, true>(grp, pf, nb, a, c, out),
                            (true, 3) => imp::group::<3, true>(grp, pf, nb, a, c, out),
                            (true, _) => imp::group::<4, true>(grp, pf, nb, a, c, out),
                        }
                    }
                },
            );
            true
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (h5, packed, nb, acts, cs, ys);
            false
        }
    }

    #[cfg(target_arch = "x86_64")]
    mod imp {
        use super::{AB, Ahead, Col, Col6, GBB, PASS_COLS, PassOut, Q6_GBB};
        use std::arch::x86_64::*;

        /// One Q6_K group of 16 rows times K columns; `out[j][r]` = row r · column j.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        pub(super) fn q6_group<const K: usize>(
            grp: &[u8],
            pf: Ahead,
            nb: usize,
            a: &[&[u8]; PASS_COLS],
            c: &[&Col6; PASS_COLS],
            out: &mut PassOut,
        ) {
            assert!(grp.len() == nb * Q6_GBB, "q6_group: {nb} block-groups");
            for j in 0..K {
                assert!(a[j].len() >= AB * nb && c[j].d.len() >= nb && c[j].bias.len() >= nb, "activation shorter than the row");
            }
            let (m4, m30) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
            let mut acc = [_mm512_setzero_ps(); K];
            let ap: [*const u8; K] = std::array::from_fn(|j| a[j].as_ptr());
            for b in 0..nb {
                let p = grp[b * Q6_GBB..(b + 1) * Q6_GBB].as_ptr();
                // SAFETY: the block-group is Q6_GBB = 3360 bytes: d at 0..32, the scale bytes at
                // 32..288 (16-byte loads at 32 + 16j, j < 16), the nibble chunks at 288 + 64n
                // (n < 32) and the planes at 2336 + 64j (j < 16) are in bounds; unaligned loads.
                let dw = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(p.cast()) });
                // SAFETY: as above.
                let sc = |j: usize| unsafe { _mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(32 + 16 * j).cast())) };
                let mut s = [_mm512_setzero_si512(); K];
                // sub-blocks h (elements 16h.., low nibbles of chunks 4h..4h+4) and h + 8
                // (128 + 16h.., their high nibbles)
                for h in 0..8 {
                    pf.fetch(b * Q6_GBB + h * (Q6_GBB / 8), Q6_GBB / 8);
                    let mut u = [[_mm512_setzero_si512(); 4]; 2];
                    for (half, plane) in [(0, h), (1, h + 8)] {
                        // SAFETY: as above.
                        let hb = unsafe { _mm512_loadu_si512(p.add(2336 + 64 * plane).cast()) };
                        for (t, ut) in u[half].iter_mut().enumerate() {
                            // SAFETY: as above (chunk 4h + t < 32).
                            let v = unsafe { _mm512_loadu_si512(p.add(288 + 64 * (4 * h + t)).cast()) };
                            let nib =
                                if half == 0 { _mm512_and_si512(v, m4) } else { _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4) };
                            // the 2 top bits of chunk t sit at bits 2t..2t+2: move them to 4..6
                            let top = match t {
                                0 => _mm512_slli_epi16::<4>(hb),
                                1 => _mm512_slli_epi16::<2>(hb),
                                2 => hb,
                                _ => _mm512_srli_epi16::<2>(hb),
                            };
                            *ut = _mm512_ternarylogic_epi32::<0xF8>(nib, top, m30);
                        }
                    }
                    let scs = [sc(h), sc(h + 8)];
                    for j in 0..K {
                        for half in 0..2 {
                            let sb = h + 8 * half;
                            // SAFETY: a[j] has >= AB nb bytes (asserted) and b < nb: the 4-byte
                            // reads at AB b + 4 + 16 sb + 4t lie inside block b's quants.
                            let q = unsafe { ap[j].add(AB * b + 4 + 16 * sb) };
                            // SAFETY: as above.
                            let bc = |t: usize| _mm512_set1_epi32(unsafe { q.add(4 * t).cast::<i32>().read_unaligned() });
                            let mut pp = _mm512_set1_epi32(c[j].bias[b][sb]);
                            for (t, &ut) in u[half].iter().enumerate() {
                                pp = _mm512_dpbusd_epi32(pp, ut, bc(t));
                            }
                            s[j] = _mm512_add_epi32(s[j], _mm512_mullo_epi32(pp, scs[half]));
                        }
                    }
                }
                for j in 0..K {
                    let da = _mm512_set1_ps(c[j].d[b]);
                    acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[j]), _mm512_mul_ps(dw, da), acc[j]);
                }
            }
            for j in 0..K {
                // SAFETY: out[j] is 16 writable f32; storeu has no alignment requirement.
                unsafe { _mm512_storeu_ps(out[j].as_mut_ptr(), acc[j]) };
            }
        }

        /// One group of 16 rows times K columns; `out[j][r]` = row r · column j.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        pub(super) fn group<const K: usize, const H5: bool>(
            grp: &[u8],
            pf: Ahead,
            nb: usize,
            a: &[&[u8]; PASS_COLS],
            c: &[&Col; PASS_COLS],
            out: &mut PassOut,
        ) {
            let gbb = if H5 { super::super::Q5_GBB } else { GBB };
            assert!(grp.len() == nb * gbb, "group: {nb} block-groups");
            for j in 0..K {
                assert!(a[j].len() >= AB * nb && c[j].d.len() >= nb && c[j].sumsf.len() >= nb, "activation shorter than the row");
            }
            let m4 = _mm512_set1_epi8(0x0F);
            let mut acc = [_mm512_setzero_ps(); K];
            let ap: [*const u8; K] = std::array::from_fn(|j| a[j].as_ptr());
            for b in 0..nb {
                let src = &grp[b * gbb..(b + 1) * gbb];
                let p = src.as_ptr();
                // SAFETY: src is GBB = 2368 bytes: d at 0..32, dmin at 32..64, the scale and
                // min bytes at 64..320 (16-byte loads at 64 + 16j and 192 + 16j, j < 8) and the
                // quant chunks at 320 + 64n (n < 32) are in bounds; unaligned loads.
                let (dw, dm) = unsafe {
                    (_mm512_cvtph_ps(_mm256_loadu_si256(p.cast())), _mm512_cvtph_ps(_mm256_loadu_si256(p.add(32).cast())))
                };
                // SAFETY: as above.
                let sc = |j: usize| unsafe { _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(64 + 16 * j).cast())) };
                // SAFETY: as above.
                let mn = |j: usize| unsafe { _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(192 + 16 * j).cast())) };
                let mut s = [_mm512_setzero_si512(); K];
                for cc in 0..4 {
                    pf.fetch(b * gbb + cc * (gbb / 4), gbb / 4);
                    let mut lo = [_mm512_setzero_si512(); 8];
                    let mut hi = [_mm512_setzero_si512(); 8];
                    for i in 0..8 {
                        // SAFETY: as above (chunk 8cc + i < 32).
                        let v = unsafe { _mm512_loadu_si512(p.add(320 + (8 * cc + i) * 64).cast()) };
                        lo[i] = _mm512_and_si512(v, m4);
                        hi[i] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
                        if H5 {
                            // the fifth bits: masks 2(8cc + i) and 2(8cc + i) + 1 after the Q4_K part
                            let mi = GBB + 16 * (8 * cc + i);
                            let ml = u64::from_le_bytes(src[mi..mi + 8].try_into().expect("8 bytes"));
                            let mh = u64::from_le_bytes(src[mi + 8..mi + 16].try_into().expect("8 bytes"));
                            lo[i] = _mm512_mask_add_epi8(lo[i], ml, lo[i], _mm512_set1_epi8(16));
                            hi[i] = _mm512_mask_add_epi8(hi[i], mh, hi[i], _mm512_set1_epi8(16));
                        }
                    }
                    let (sl, sh) = (sc(2 * cc), sc(2 * cc + 1));
                    for j in 0..K {
                        // SAFETY: a[j] has >= AB nb bytes (asserted) and b < nb: the 4-byte
                        // reads at AB b + 4 + 64cc + 4i and + 32 lie inside block b's quants.
                        let q = unsafe { ap[j].add(AB * b + 4 + 64 * cc) };
                        // SAFETY: as above.
                        let bc = |o: usize| _mm512_set1_epi32(unsafe { q.add(o).cast::<i32>().read_unaligned() });
                        let (mut pl, mut ph) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                        for i in 0..8 {
                            pl = _mm512_dpbusd_epi32(pl, lo[i], bc(4 * i));
                            ph = _mm512_dpbusd_epi32(ph, hi[i], bc(32 + 4 * i));
                        }
                        s[j] = _mm512_add_epi32(s[j], _mm512_add_epi32(_mm512_mullo_epi32(pl, sl), _mm512_mullo_epi32(ph, sh)));
                    }
                }
                // The min term Σ_sb min[sb] · sum[sb] in f32 FMAs: every partial sum is an integer
                // below 2^24 (63 · 4096 · 8), so each step is exact and the result equals the
                // integer sum converted, as the scalar twin computes it. FMAs issue on two ports
                // where the integer multiply (two uops) has one, beside the dpbusd chains.
                let mnf: [__m512; 8] = std::array::from_fn(|sb| _mm512_cvtepi32_ps(mn(sb)));
                for j in 0..K {
                    let sums = &c[j].sumsf[b];
                    let mut m = _mm512_setzero_ps();
                    for (sb, &sum) in sums.iter().enumerate() {
                        m = _mm512_fmadd_ps(mnf[sb], _mm512_set1_ps(sum), m);
                    }
                    let da = _mm512_set1_ps(c[j].d[b]);
                    acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[j]), _mm512_mul_ps(dw, da), acc[j]);
                    acc[j] = _mm512_fnmadd_ps(m, _mm512_mul_ps(dm, da), acc[j]);
                }
            }
            for j in 0..K {
                // SAFETY: out[j] is 16 writable f32; storeu has no alignment requirement.
                unsafe { _mm512_storeu_ps(out[j].as_mut_ptr(), acc[j]) };
            }
        }
    }
}

/// The AVX2 kernels (no AVX-512): `avx512`'s in two halves of 8 rows, `vpmaddubsw` +
/// `vpmaddwd` for the products of 4 quants (exact: the unsigned quants, at most 63, keep the
/// pair sums under i16 saturation), the same integer sums and the same float steps per lane.
mod avx2 {
    use super::{AB, Col, Col6, PASS_COLS, Q6_GBB};

    pub(super) fn q6_matvec(packed: &[u8], nb: usize, acts: &[u8], cs: &[Col6], ys: &mut [&mut [f32]]) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            if crate::simd::level() != crate::simd::Level::Avx2 {
                return false;
            }
            let ab = AB * nb;
            let gb = nb * Q6_GBB;
            // More columns than one pass (a prompt chunk): each group is decoded once, at its
            // first pass, into this thread's scratch (the passes over a group run back to back
            // on one thread: `ileave::passes`).
            let many = cs.len() > PASS_COLS;
            super::super::ileave::passes(
                (packed, gb, PASS_COLS),
                (acts, ab, cs),
                ys,
                |grp, pf, j0, kk, a: &[&[u8]; PASS_COLS], c: &[&Col6; PASS_COLS], out| {
                    // SAFETY: level() returned Avx2 after detecting avx2, fma and f16c.
                    unsafe {
                        if many {
                            imp::PRE6.with_borrow_mut(|pre| {
                                if super::super::ileave::first_pass(j0) {
                                    imp::q6_decode_group(grp, pf, nb, pre);
                                }
                                match kk {
                                    1 => imp::q6_group_pre::<1>(pre, nb, a, c, out),
                                    2 => imp::q6_group_pre::<2>(pre, nb, a, c, out),
                                    3 => imp::q6_group_pre::<3>(pre, nb, a, c, out),
                                    _ => imp::q6_group_pre::<4>(pre, nb, a, c, out),
                                }
                            })
                        } else {
                            match kk {
                                1 => imp::q6_group::<1>(grp, pf, nb, a, c, out),
                                2 => imp::q6_group::<2>(grp, pf, nb, a, c, out),
                                3 => imp::q6_group::<3>(grp, pf, nb, a, c, out),
                                _ => imp::q6_group::<4>(grp, pf, nb, a, c, out),
                            }
                        }
                    }
                },
            );
            true
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (packed, nb, acts, cs, ys);
            false
        }
    }

    pub(super) fn matvec(h5: bool, packed: &[u8], nb: usize, acts: &[u8], cs: &[Col], ys: &mut [&mut [f32]]) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            if crate::simd::level() != crate::simd::Level::Avx2 {
                return false;
            }
            let ab = AB * nb;
            let gb = nb * super::sizes(h5).1;
            // More columns than one pass: each group decoded once (as `q6_matvec`).
            let many = cs.len() > PASS_COLS;
            super::super::ileave::passes(
                (packed, gb, PASS_COLS),
                (acts, ab, cs),
                ys,
                |grp, pf, j0, kk, a: &[&[u8]; PASS_COLS], c: &[&Col; PASS_COLS], out| {
                    // SAFETY: level() returned Avx2 after detecting avx2, fma and f16c.
                    unsafe {
                        if many {
                            imp::PRE4.with_borrow_mut(|pre| {
                                if super::super::ileave::first_pass(j0) {
                                    if h5 {
                                        imp::decode_group::<true>(grp, pf, nb, pre);
                                    } else {
                                        imp::decode_group::<false>(grp, pf, nb, pre);
                                    }
                                }
                                match (h5, kk) {
                                    (false, 1) => imp::group_pre::<1, false>(pre, nb, a, c, out),
                                    (false, 2) => imp::group_pre::<2, false>(pre, nb, a, c, out),
                                    (false, 3) => imp::group_pre::<3, false>(pre, nb, a, c, out),
                                    (false, _) => imp::group_pre::<4, false>(pre, nb, a, c, out),
                                    (true, 1) => imp::group_pre::<1, true>(pre, nb, a, c, out),
                                    (true, 2) => imp::group_pre::<2, true>(pre, nb, a, c, out),
                                    (true, 3) => imp::group_pre::<3, true>(pre, nb, a, c, out),
                                    (true, _) => imp::group_pre::<4, true>(pre, nb, a, c, out),
                                }
                            })
                        } else {
                            match (h5, kk) {
                                (false, 1) => imp::group::<1, false>(grp, pf, nb, a, c, out),
                                (false, 2) => imp::group::<2, false>(grp, pf, nb, a, c, out),
                                (false, 3) => imp::group::<3, false>(grp, pf, nb, a, c, out),
                                (false, _) => imp::group::<4, false>(grp, pf, nb, a, c, out),
                                (true, 1) => imp::group::<1, true>(grp, pf, nb, a, c, out),
                                (true, 2) => imp::group::<2, true>(grp, pf, nb, a, c, out),
                                (true, 3) => imp::group::<3, true>(grp, pf, nb, a, c, out),
                                (true, _) => imp::group::<4, true>(grp, pf, nb, a, c, out),
                            }
                        }
                    }
                },
            );
            true
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (h5, packed, nb, acts, cs, ys);
            false
        }
    }

    #[cfg(target_arch = "x86_64")]
    mod imp {
        use super::super::super::ileave::{avx2_bits16 as bits16, avx2_store as store};
        use super::{AB, Col, Col6, PASS_COLS, Q6_GBB};
        use crate::quant::ileave::{Ahead, PassOut};
        use std::arch::x86_64::*;

        /// `init` plus Σ over the registers of 4-quant products (u unsigned, a the broadcast
        /// bytes) times each row's scale `sc` (in both i16 halves of the row's lane, `pair16`;
        /// all ones for the plain sum), as 8 i32 lanes. FL registers' `vpmaddubsw` pair sums
        /// add up in i16 before one `vpmaddwd` by `sc` multiplies and widens them: exact while
        /// FL · 2 · umax · 128 stays within i16 (Q4_K 8 · 3840, Q5_K 4 · 7936, Q6_K 2 · 16128),
        /// and an exact integer sum is the same whatever its grouping, so the lanes are the
        /// scalar twin's `sc · Σ u·a` (at most 63 · 32 · 31 · 128, far inside i32) with no
        /// `vpmulld`.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        fn dots<const FL: usize>(init: __m256i, u: &[__m256i], q: &[u8], sc: __m256i) -> __m256i {
            let mut s = init;
            for t0 in (0..u.len()).step_by(FL) {
                let mut h = _mm256_maddubs_epi16(u[t0], bcast4(q, t0));
                // Index loops (u.len() is a multiple of FL): the iterator form with take/skip
                // was not unrolled and made the kernels 2-3x slower.
                #[allow(clippy::needless_range_loop)]
                for t in t0 + 1..t0 + FL {
                    h = _mm256_add_epi16(h, _mm256_maddubs_epi16(u[t], bcast4(q, t)));
                }
                s = _mm256_add_epi32(s, _mm256_madd_epi16(h, sc));
            }
            s
        }

        /// Lanes of i32 values within i16 with the value in both of their i16 halves.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        fn pair16(v: __m256i) -> __m256i {
            pair16_of(v, v)
        }

        /// Lanes of i32 values within i16: `lo`'s value in the low i16 half, `hi`'s in the high.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        fn pair16_of(lo: __m256i, hi: __m256i) -> __m256i {
            _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32::<16>(hi))
        }

        /// Bytes 4t..4t + 4 of `q` in every 32-bit lane.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        fn bcast4(q: &[u8], t: usize) -> __m256i {
            _mm256_set1_epi32(i32::from_le_bytes(q[4 * t..4 * t + 4].try_into().expect("4 bytes")))
        }

        /// The 32 bytes at `o` (no closures in these kernels: they would not inherit the
        /// target features).
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        fn ld32(src: &[u8], o: usize) -> __m256i {
            let s = &src[o..o + 32];
            // SAFETY: s is 32 readable bytes.
            unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
        }

        /// 8 bytes at `p` widened to i32 lanes, signed or not.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        fn widen8<const SIGNED: bool>(p: &[u8]) -> __m256i {
            // SAFETY: p has >= 8 bytes (the slice below panics otherwise).
            let v = unsafe { _mm_loadl_epi64(p[..8].as_ptr().cast()) };
            if SIGNED { _mm256_cvtepi8_epi32(v) } else { _mm256_cvtepu8_epi32(v) }
        }

        /// 8 f16 at `p` as f32 lanes.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        fn halves8(p: &[u8]) -> __m256 {
            // SAFETY: p has >= 16 bytes (the slice below panics otherwise).
            _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p[..16].as_ptr().cast()) })
        }

        /// One Q6_K group of 16 rows times K columns, rows 8h.. in half h.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) fn q6_group<const K: usize>(
            grp: &[u8],
            pf: Ahead,
            nb: usize,
            a: &[&[u8]; PASS_COLS],
            c: &[&Col6; PASS_COLS],
            out: &mut PassOut,
        ) {
            assert!(grp.len() == nb * Q6_GBB, "q6_group: {nb} block-groups");
            q6_check::<K>(nb, a, c);
            let mut acc = [[_mm256_setzero_ps(); 2]; K];
            for b in 0..nb {
                let src = &grp[b * Q6_GBB..(b + 1) * Q6_GBB];
                pf.fetch(b * Q6_GBB, Q6_GBB);
                for hr in 0..2 {
                    let mut s = [_mm256_setzero_si256(); K];
                    for h in 0..8 {
                        let (u, scs) = q6_sub(src, hr, h);
                        q6_cols::<K>(&u, &scs, b, h, a, c, &mut s);
                    }
                    q6_fin::<K>(halves8(&src[16 * hr..]), b, hr, c, &s, &mut acc);
                }
            }
            store::<K>(&acc, out);
        }

        /// A Q6_K group decoded once for all the passes of a many-column product: per block,
        /// row half hr and sub-block pair h, the quant registers and the scales (`pair16`);
        /// per block and half the rows' f32 scales and the scale pairs of sub-blocks 2k, 2k + 1
        /// (`pair16_of`) that weigh the activation sums.
        #[derive(Default)]
        pub(super) struct Pre6 {
            u: Vec<[[__m256i; 4]; 2]>,
            scs: Vec<[__m256i; 2]>,
            scp: Vec<[__m256i; 8]>,
            dw: Vec<__m256>,
        }

        thread_local! {
            pub(super) static PRE6: std::cell::RefCell<Pre6> = std::cell::RefCell::new(Pre6::default());
        }

        /// Decode every block of a Q6_K group into `pre`.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) fn q6_decode_group(grp: &[u8], pf: Ahead, nb: usize, pre: &mut Pre6) {
            assert!(grp.len() == nb * Q6_GBB, "q6_decode_group: {nb} block-groups");
            pre.u.clear();
            pre.scs.clear();
            pre.scp.clear();
            pre.dw.clear();
            for b in 0..nb {
                let src = &grp[b * Q6_GBB..(b + 1) * Q6_GBB];
                pf.fetch(b * Q6_GBB, Q6_GBB);
                for hr in 0..2 {
                    pre.dw.push(halves8(&src[16 * hr..]));
                    let sc = |j: usize| widen8::<true>(&src[32 + 16 * j + 8 * hr..]);
                    let mut scp = [_mm256_setzero_si256(); 8];
                    for (k, p) in scp.iter_mut().enumerate() {
                        *p = pair16_of(sc(2 * k), sc(2 * k + 1));
                    }
                    pre.scp.push(scp);
                    for h in 0..8 {
                        let (u, scs) = q6_sub(src, hr, h);
                        pre.u.push(u);
                        pre.scs.push([pair16(scs[0]), pair16(scs[1])]);
                    }
                }
            }
        }

        /// `q6_group` on a group `q6_decode_group` put in `pre`, weight-stationary (as
        /// `group_pre`): `S = Σ_j sc_j · Σ u·a − 32 · Σ_j sc_j · Σ_j a`, the scalar twin's
        /// `Σ_j sc_j · (Σ u·a − 32 · Σ_j a)` regrouped, every step an exact i32 (|S| < 2^29),
        /// so the same integer and the same float steps: the same bits.
        // index loops over columns, rows and steps: the form LLVM unrolls (see `dots`)
        #[allow(clippy::needless_range_loop)]
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) fn q6_group_pre<const K: usize>(
            pre: &Pre6,
            nb: usize,
            a: &[&[u8]; PASS_COLS],
            c: &[&Col6; PASS_COLS],
            out: &mut PassOut,
        ) {
            assert!(
                pre.dw.len() == 2 * nb && pre.u.len() == 16 * nb && pre.scs.len() == 16 * nb && pre.scp.len() == 2 * nb,
                "q6_group_pre: {nb} blocks decoded"
            );
            q6_check::<K>(nb, a, c);
            for cj in c.iter().take(K) {
                assert!(cj.pairs.len() >= nb, "activation shorter than the row");
            }
            let ap: [*const u8; K] = std::array::from_fn(|j| a[j].as_ptr());
            let mut acc = [[_mm256_setzero_ps(); 2]; K];
            for b in 0..nb {
                let mut s = [[_mm256_setzero_si256(); K]; 2];
                for h in 0..8 {
                    for hr in 0..2 {
                        let i = (2 * b + hr) * 8 + h;
                        let (u, sc) = (&pre.u[i], &pre.scs[i]);
                        for half in 0..2 {
                            let o = AB * b + 4 + 16 * (h + 8 * half);
                            for t0 in [0, 2] {
                                let mut x = [_mm256_setzero_si256(); K];
                                for t in t0..t0 + 2 {
                                    for j in 0..K {
                                        // SAFETY: a[j] has >= AB nb bytes (q6_check) and b < nb:
                                        // the 4 bytes at AB b + 4 + 16 sb + 4t (sb < 16, t < 4)
                                        // lie inside block b's 256 quants.
                                        let v = unsafe { ap[j].add(o + 4 * t).cast::<i32>().read_unaligned() };
                                        x[j] = _mm256_add_epi16(x[j], _mm256_maddubs_epi16(u[half][t], _mm256_set1_epi32(v)));
                                    }
                                }
                                for j in 0..K {
                                    s[hr][j] = _mm256_add_epi32(s[hr][j], _mm256_madd_epi16(x[j], sc[half]));
                                }
                            }
                        }
                    }
                }
                for (hr, s) in s.iter_mut().enumerate() {
                    let scp = &pre.scp[2 * b + hr];
                    for j in 0..K {
                        let pairs = &c[j].pairs[b];
                        let mut m = _mm256_madd_epi16(scp[0], _mm256_set1_epi32(pairs[0]));
                        for k in 1..8 {
                            m = _mm256_add_epi32(m, _mm256_madd_epi16(scp[k], _mm256_set1_epi32(pairs[k])));
                        }
                        s[j] = _mm256_sub_epi32(s[j], _mm256_slli_epi32::<5>(m));
                    }
                    q6_fin::<K>(pre.dw[2 * b + hr], b, hr, c, s, &mut acc);
                }
            }
            store::<K>(&acc, out);
        }

        /// The activation rows and prepared columns cover `nb` blocks.
        #[inline]
        fn q6_check<const K: usize>(nb: usize, a: &[&[u8]; PASS_COLS], c: &[&Col6; PASS_COLS]) {
            for j in 0..K {
                assert!(a[j].len() >= AB * nb && c[j].d.len() >= nb && c[j].bias.len() >= nb, "activation shorter than the row");
            }
        }

        /// Sub-blocks h and h + 8 of row half hr of one Q6_K block: their quant registers and
        /// their scales widened to i32 lanes.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        fn q6_sub(src: &[u8], hr: usize, h: usize) -> ([[__m256i; 4]; 2], [__m256i; 2]) {
            let (m4, m30) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
            let mut u = [[_mm256_setzero_si256(); 4]; 2];
            for (half, plane) in [(0, h), (1, h + 8)] {
                let hb = ld32(src, 2336 + 64 * plane + 32 * hr);
                for (t, ut) in u[half].iter_mut().enumerate() {
                    let v = ld32(src, 288 + 64 * (4 * h + t) + 32 * hr);
                    let nib = if half == 0 { _mm256_and_si256(v, m4) } else { _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4) };
                    let top = match t {
                        0 => _mm256_slli_epi16::<4>(hb),
                        1 => _mm256_slli_epi16::<2>(hb),
                        2 => hb,
                        _ => _mm256_srli_epi16::<2>(hb),
                    };
                    *ut = _mm256_or_si256(nib, _mm256_and_si256(top, m30));
                }
            }
            (u, [widen8::<true>(&src[32 + 16 * h + 8 * hr..]), widen8::<true>(&src[32 + 16 * (h + 8) + 8 * hr..])])
        }

        /// Sub-blocks h and h + 8 of block b times the K columns, into the integer sums `s`.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        #[allow(clippy::too_many_arguments)]
        fn q6_cols<const K: usize>(
            u: &[[__m256i; 4]; 2],
            scs: &[__m256i; 2],
            b: usize,
            h: usize,
            a: &[&[u8]; PASS_COLS],
            c: &[&Col6; PASS_COLS],
            s: &mut [__m256i; K],
        ) {
            for j in 0..K {
                for half in 0..2 {
                    let sb = h + 8 * half;
                    let q = &a[j][AB * b + 4 + 16 * sb..][..16];
                    let pp = dots::<2>(_mm256_set1_epi32(c[j].bias[b][sb]), &u[half], q, _mm256_set1_epi16(1));
                    s[j] = _mm256_add_epi32(s[j], _mm256_mullo_epi32(pp, scs[half]));
                }
            }
        }

        /// A block's integer sums into the accumulators of row half hr.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        fn q6_fin<const K: usize>(
            dw: __m256,
            b: usize,
            hr: usize,
            c: &[&Col6; PASS_COLS],
            s: &[__m256i; K],
            acc: &mut [[__m256; 2]; K],
        ) {
            for j in 0..K {
                let da = _mm256_set1_ps(c[j].d[b]);
                acc[j][hr] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[j]), _mm256_mul_ps(dw, da), acc[j][hr]);
            }
        }

        /// One Q4_K (or Q5_K) group of 16 rows times K columns, rows 8h.. in half h.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) fn group<const K: usize, const H5: bool>(
            grp: &[u8],
            pf: Ahead,
            nb: usize,
            a: &[&[u8]; PASS_COLS],
            c: &[&Col; PASS_COLS],
            out: &mut PassOut,
        ) {
            let gbb = if H5 { super::super::Q5_GBB } else { super::super::GBB };
            assert!(grp.len() == nb * gbb, "group: {nb} block-groups");
            k_check::<K>(nb, a, c);
            let mut acc = [[_mm256_setzero_ps(); 2]; K];
            for b in 0..nb {
                let src = &grp[b * gbb..(b + 1) * gbb];
                pf.fetch(b * gbb, gbb);
                for hr in 0..2 {
                    let (dw, dm) = (halves8(&src[16 * hr..]), halves8(&src[32 + 16 * hr..]));
                    let mut s = [_mm256_setzero_si256(); K];
                    for cc in 0..4 {
                        k_cols::<K, H5>(&k_sub::<H5>(src, hr, cc), b, cc, a, &mut s);
                    }
                    k_fin::<K>(dw, dm, &k_mins(src, hr), b, hr, c, &s, &mut acc);
                }
            }
            store::<K>(&acc, out);
        }

        /// Quarter cc (sub-blocks 2cc, 2cc + 1) of row half hr of a Q4_K/Q5_K block: the low and
        /// high sub-block's quant registers and their scales, each in both i16 halves of its
        /// row's 32-bit lane (the `vpmaddwd` operand of `dots`).
        #[derive(Clone, Copy)]
        pub(super) struct KSub {
            lo: [__m256i; 8],
            hi: [__m256i; 8],
            sl: __m256i,
            sh: __m256i,
        }

        /// Per row half of a block: the scales, the min scales and the 8 sub-blocks' mins.
        #[derive(Clone, Copy)]
        pub(super) struct KHalf {
            dw: __m256,
            dm: __m256,
            mnf: [__m256; 8],
        }

        /// A Q4_K/Q5_K group decoded once for all the passes of a many-column product.
        #[derive(Default)]
        pub(super) struct Pre4 {
            sub: Vec<KSub>,
            half: Vec<KHalf>,
        }

        thread_local! {
            pub(super) static PRE4: std::cell::RefCell<Pre4> = std::cell::RefCell::new(Pre4::default());
        }

        /// Decode every block of a Q4_K/Q5_K group into `pre` (what `group` decodes per pass).
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) fn decode_group<const H5: bool>(grp: &[u8], pf: Ahead, nb: usize, pre: &mut Pre4) {
            let gbb = if H5 { super::super::Q5_GBB } else { super::super::GBB };
            assert!(grp.len() == nb * gbb, "decode_group: {nb} block-groups");
            pre.sub.clear();
            pre.half.clear();
            for b in 0..nb {
                let src = &grp[b * gbb..(b + 1) * gbb];
                pf.fetch(b * gbb, gbb);
                for hr in 0..2 {
                    pre.half.push(KHalf {
                        dw: halves8(&src[16 * hr..]),
                        dm: halves8(&src[32 + 16 * hr..]),
                        mnf: k_mins(src, hr),
                    });
                    for cc in 0..4 {
                        pre.sub.push(k_sub::<H5>(src, hr, cc));
                    }
                }
            }
        }

        /// `group` on a group `decode_group` put in `pre`, weight-stationary: each decoded
        /// register (one 8-row half; both halves in one loop measured the same) is loaded
        /// once for the K columns' broadcast activation bytes, and a sub-block's
        /// `vpmaddubsw` sums stay in i16 registers (`dots`' bound, FL steps) until one
        /// `vpmaddwd` by the rows' scales. The same exact integer sums and the same float steps
        /// per lane as `group`, so the same bits.
        // index loops over columns, rows and steps: the form LLVM unrolls (see `dots`)
        #[allow(clippy::needless_range_loop)]
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) fn group_pre<const K: usize, const H5: bool>(
            pre: &Pre4,
            nb: usize,
            a: &[&[u8]; PASS_COLS],
            c: &[&Col; PASS_COLS],
            out: &mut PassOut,
        ) {
            assert!(pre.half.len() == 2 * nb && pre.sub.len() == 8 * nb, "group_pre: {nb} blocks decoded");
            k_check::<K>(nb, a, c);
            let fl = if H5 { 4 } else { 8 };
            let ap: [*const u8; K] = std::array::from_fn(|j| a[j].as_ptr());
            let mut acc = [[_mm256_setzero_ps(); 2]; K];
            for b in 0..nb {
                let mut s = [[_mm256_setzero_si256(); K]; 2];
                for cc in 0..4 {
                    for hr in 0..2 {
                        let k = &pre.sub[(2 * b + hr) * 4 + cc];
                        for half in 0..2 {
                            let (u, sc) = if half == 0 { (&k.lo, k.sl) } else { (&k.hi, k.sh) };
                            let o = AB * b + 4 + 64 * cc + 32 * half;
                            for t0 in (0..8).step_by(fl) {
                                let mut h = [_mm256_setzero_si256(); K];
                                for t in t0..t0 + fl {
                                    let w = u[t];
                                    for j in 0..K {
                                        // SAFETY: a[j] has >= AB nb bytes (k_check) and b < nb:
                                        // the 4 bytes at AB b + 4 + 64 cc + 32 half + 4t (cc < 4,
                                        // half < 2, t < 8) lie inside block b's 256 quants.
                                        let x = unsafe { ap[j].add(o + 4 * t).cast::<i32>().read_unaligned() };
                                        h[j] = _mm256_add_epi16(h[j], _mm256_maddubs_epi16(w, _mm256_set1_epi32(x)));
                                    }
                                }
                                for j in 0..K {
                                    s[hr][j] = _mm256_add_epi32(s[hr][j], _mm256_madd_epi16(h[j], sc));
                                }
                            }
                        }
                    }
                }
                // `k_fin`'s steps, written out here: as a call (not inlined) it took a sixth
                // of this kernel's time passing the sums and accumulators through memory
                for (hr, s) in s.iter().enumerate() {
                    let hf = &pre.half[2 * b + hr];
                    for j in 0..K {
                        let sums = &c[j].sumsf[b];
                        let mut m = _mm256_setzero_ps();
                        for (sb, &sum) in sums.iter().enumerate() {
                            m = _mm256_fmadd_ps(hf.mnf[sb], _mm256_set1_ps(sum), m);
                        }
                        let da = _mm256_set1_ps(c[j].d[b]);
                        acc[j][hr] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[j]), _mm256_mul_ps(hf.dw, da), acc[j][hr]);
                        acc[j][hr] = _mm256_fnmadd_ps(m, _mm256_mul_ps(hf.dm, da), acc[j][hr]);
                    }
                }
            }
            store::<K>(&acc, out);
        }

        /// The activation rows and prepared columns cover `nb` blocks.
        #[inline]
        fn k_check<const K: usize>(nb: usize, a: &[&[u8]; PASS_COLS], c: &[&Col; PASS_COLS]) {
            for j in 0..K {
                assert!(a[j].len() >= AB * nb && c[j].d.len() >= nb && c[j].sumsf.len() >= nb, "activation shorter than the row");
            }
        }

        /// Decode quarter cc of row half hr of one block (`KSub`).
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        fn k_sub<const H5: bool>(src: &[u8], hr: usize, cc: usize) -> KSub {
            let m4 = _mm256_set1_epi8(0x0F);
            let mut lo = [_mm256_setzero_si256(); 8];
            let mut hi = [_mm256_setzero_si256(); 8];
            for i in 0..8 {
                let v = ld32(src, 320 + (8 * cc + i) * 64 + 32 * hr);
                lo[i] = _mm256_and_si256(v, m4);
                hi[i] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                if H5 {
                    let mi = super::super::GBB + 16 * (8 * cc + i);
                    let ml = u64::from_le_bytes(src[mi..mi + 8].try_into().expect("8 bytes"));
                    let mh = u64::from_le_bytes(src[mi + 8..mi + 16].try_into().expect("8 bytes"));
                    lo[i] = _mm256_or_si256(lo[i], bits16((ml >> (32 * hr)) as u32));
                    hi[i] = _mm256_or_si256(hi[i], bits16((mh >> (32 * hr)) as u32));
                }
            }
            KSub {
                lo,
                hi,
                sl: pair16(widen8::<false>(&src[64 + 16 * (2 * cc) + 8 * hr..])),
                sh: pair16(widen8::<false>(&src[64 + 16 * (2 * cc + 1) + 8 * hr..])),
            }
        }

        /// The 8 sub-blocks' mins of row half hr, as f32 lanes.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        fn k_mins(src: &[u8], hr: usize) -> [__m256; 8] {
            let mut mnf = [_mm256_setzero_ps(); 8];
            for (sb, m) in mnf.iter_mut().enumerate() {
                *m = _mm256_cvtepi32_ps(widen8::<false>(&src[192 + 16 * sb + 8 * hr..]));
            }
            mnf
        }

        /// Quarter cc of block b times the K columns, into the integer sums `s`.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        fn k_cols<const K: usize, const H5: bool>(k: &KSub, b: usize, cc: usize, a: &[&[u8]; PASS_COLS], s: &mut [__m256i; K]) {
            for j in 0..K {
                let q = &a[j][AB * b + 4 + 64 * cc..][..64];
                s[j] = if H5 {
                    dots::<4>(dots::<4>(s[j], &k.lo, &q[..32], k.sl), &k.hi, &q[32..], k.sh)
                } else {
                    dots::<8>(dots::<8>(s[j], &k.lo, &q[..32], k.sl), &k.hi, &q[32..], k.sh)
                };
            }
        }

        /// A block's integer sums and min term into the accumulators of row half hr (the min
        /// term in exact f32 FMAs, as in the AVX-512 kernel).
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        #[allow(clippy::too_many_arguments)]
        fn k_fin<const K: usize>(
            dw: __m256,
            dm: __m256,
            mnf: &[__m256; 8],
            b: usize,
            hr: usize,
            c: &[&Col; PASS_COLS],
            s: &[__m256i; K],
            acc: &mut [[__m256; 2]; K],
        ) {
            for j in 0..K {
                let sums = &c[j].sumsf[b];
                let mut m = _mm256_setzero_ps();
                for (sb, &sum) in sums.iter().enumerate() {
                    m = _mm256_fmadd_ps(mnf[sb], _mm256_set1_ps(sum), m);
                }
                let da = _mm256_set1_ps(c[j].d[b]);
                acc[j][hr] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[j]), _mm256_mul_ps(dw, da), acc[j][hr]);
                acc[j][hr] = _mm256_fnmadd_ps(m, _mm256_mul_ps(dm, da), acc[j][hr]);
            }
        }
    }
}

/// Q6_K: GGUF bytes of one block and of one interleaved 16-row block-group.
const Q6_BB: usize = 210;
pub(super) const Q6_GBB: usize = 3360;

/// The 256 unsigned 6-bit quants of a GGUF Q6_K block, in element order.
fn q6_quants(blk: &[u8]) -> [u8; 256] {
    let (ql, qh) = (&blk[0..128], &blk[128..192]);
    let mut u = [0u8; 256];
    for h in 0..2 {
        for l in 0..32 {
            let (a, b, hb) = (ql[64 * h + l], ql[64 * h + l + 32], qh[32 * h + l]);
            u[128 * h + l] = (a & 0x0F) | ((hb & 3) << 4);
            u[128 * h + l + 32] = (b & 0x0F) | (((hb >> 2) & 3) << 4);
            u[128 * h + l + 64] = (a >> 4) | (((hb >> 4) & 3) << 4);
            u[128 * h + l + 96] = (b >> 4) | (((hb >> 6) & 3) << 4);
        }
    }
    u
}

/// The interleaved form of `rows` Q6_K rows, zero rows padding the last group.
pub(super) fn q6_ileave(w: &[u8], rows: usize, cols: usize, out: &mut [u8]) {
    use rayon::prelude::*;
    let nb = cols / 256;
    let rb = nb * Q6_BB;
    let zero = vec![0u8; rb];
    out.par_chunks_mut((nb * Q6_GBB).max(1)).enumerate().for_each(|(g, dst)| {
        for (b, d) in dst.chunks_exact_mut(Q6_GBB).enumerate() {
            for r in 0..IL_ROWS {
                let row = g * IL_ROWS + r;
                let blk = if row < rows { &w[row * rb + b * Q6_BB..][..Q6_BB] } else { &zero[..Q6_BB] };
                d[2 * r..2 * r + 2].copy_from_slice(&blk[208..210]);
                for j in 0..16 {
                    d[32 + 16 * j + r] = blk[192 + j];
                }
                let u = q6_quants(blk);
                for (e, &v) in u.iter().enumerate() {
                    let (n, i, hi) = ((e % 128) / 4, e % 4, e >= 128);
                    let o = 288 + 64 * n + 4 * r + i;
                    d[o] |= if hi { (v & 0x0F) << 4 } else { v & 0x0F };
                    let (j, s) = (e / 16, (e % 16) / 4);
                    d[2336 + 64 * j + 4 * r + i] |= (v >> 4) << (2 * s);
                }
            }
        }
    });
}

/// The 256 unsigned quants of row r in a Q6_K block-group, in element order: element
/// e = 4n + i (e < 128) is the low nibble of byte i of row r's 4 bytes in nibble chunk n,
/// 128 + e the high nibble; its top 2 bits sit in plane e / 16 at bits 2·((e % 16) / 4). Read
/// run by run (4 bytes of the row per chunk and per plane), not element by element (4x faster
/// un-interleaving). The scalar twin reads its quants here too; `q6_ileave`'s round trip
/// (tests/ileave.rs `layout_round_trips_and_pads`) checks this reading against the GGUF blocks.
fn q6_row_quants(src: &[u8], r: usize) -> [u8; 256] {
    let mut u = [0u8; 256];
    let (lo, hi) = u.split_at_mut(128);
    for (n, (l, h)) in lo.chunks_exact_mut(4).zip(hi.chunks_exact_mut(4)).enumerate() {
        let b = &src[288 + 64 * n + 4 * r..][..4];
        for i in 0..4 {
            l[i] = b[i] & 0x0F;
            h[i] = b[i] >> 4;
        }
    }
    for (j, g) in u.chunks_exact_mut(16).enumerate() {
        let hb = &src[2336 + 64 * j + 4 * r..][..4];
        for (s, q) in g.chunks_exact_mut(4).enumerate() {
            for i in 0..4 {
                q[i] |= ((hb[i] >> (2 * s)) & 3) << 4;
            }
        }
    }
    u
}

/// Row r's GGUF Q6_K block out of one block-group.
pub(super) fn q6_unpack_block(src: &[u8], r: usize, blk: &mut [u8]) {
    let u = q6_row_quants(src, r);
    for h in 0..2 {
        for l in 0..32 {
            let (u1, u2, u3, u4) = (u[128 * h + l], u[128 * h + l + 32], u[128 * h + l + 64], u[128 * h + l + 96]);
            blk[64 * h + l] = (u1 & 0x0F) | ((u3 & 0x0F) << 4);
            blk[64 * h + l + 32] = (u2 & 0x0F) | ((u4 & 0x0F) << 4);
            blk[128 + 32 * h + l] = (u1 >> 4) | ((u2 >> 4) << 2) | ((u3 >> 4) << 4) | ((u4 >> 4) << 6);
        }
    }
    for j in 0..16 {
        blk[192 + j] = src[32 + 16 * j + r];
    }
    blk[208..210].copy_from_slice(&src[2 * r..2 * r + 2]);
}

/// One column's Q6_K activation side: per super-block d_a and the 16 offset terms -32·Σ a.
#[derive(Default)]
pub(super) struct Col6 {
    d: Vec<f32>,
    bias: Vec<[i32; 16]>,
    /// The sub-block sums Σ a of sub-blocks 2k and 2k + 1 as the i16 halves of word k (Q8_K's
    /// `bsums` bytes as they are).
    pairs: Vec<[i32; 8]>,
}

impl Col6 {
    pub(super) fn fill(&mut self, act: &[u8], nb: usize) {
        self.d.clear();
        self.bias.clear();
        self.pairs.clear();
        for blk in act.chunks_exact(AB).take(nb) {
            self.d.push(f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]));
            self.bias.push(std::array::from_fn(|j| -32 * i16::from_le_bytes([blk[260 + 2 * j], blk[261 + 2 * j]]) as i32));
            self.pairs
                .push(std::array::from_fn(|k| i32::from_le_bytes(blk[260 + 4 * k..264 + 4 * k].try_into().expect("4 bytes"))));
        }
    }
}

/// The Q6_K scalar twin (lengths checked by the caller).
pub(super) fn q6_matvec_scalar(packed: &[u8], cols: usize, acts: &[u8], ys: &mut [&mut [f32]]) {
    let nb = cols / 256;
    let groups = packed.len() / (nb * Q6_GBB).max(1);
    let mut col = Col6::default();
    for (jc, a) in acts.chunks_exact(AB * nb).enumerate() {
        col.fill(a, nb);
        for g in 0..groups {
            let mut acc = [0f32; IL_ROWS];
            for b in 0..nb {
                let src = &packed[(g * nb + b) * Q6_GBB..][..Q6_GBB];
                let q = &a[b * AB + 4..b * AB + 260];
                for (r, acc) in acc.iter_mut().enumerate() {
                    let u = q6_row_quants(src, r);
                    let mut s = 0i32;
                    for j in 0..16 {
                        let mut isum = col.bias[b][j];
                        for (&ue, &qa) in u.iter().zip(q).skip(16 * j).take(16) {
                            isum += ue as i32 * qa as i8 as i32;
                        }
                        s += src[32 + 16 * j + r] as i8 as i32 * isum;
                    }
                    let d = f16_le([src[2 * r], src[2 * r + 1]]);
                    *acc = (s as f32).mul_add(d * col.d[b], *acc);
                }
            }
            ys[jc][g * IL_ROWS..(g + 1) * IL_ROWS].copy_from_slice(&acc);
        }
    }
}

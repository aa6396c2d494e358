//! AVX-512 VNNI twin of `matmat.rs` (quantized weights x 8-bit activations, many tokens at
//! once), which stays the reference forever: same integers, same float steps, same bits.
//!
//! Owns: the weight-tile unpacker (one per type: packed quants -> unsigned bytes + f32 group
//! scales; the lookup-table types through one `vpshufb` of their 16 levels + offset), the 16-row transposes into the kernel's layout, the register-blocked kernel, the
//! activation prep (`Prep::fill`'s fast path), and the run-time dispatch. The only `unsafe` of
//! the matmat module lives here; every block says why it is sound.
//!
//! Layout (weight-stationary, like llama.cpp's repacked gemm): a tile of 32 weight rows and a
//! K-chunk of up to `KC` elements is unpacked once into `wq`: per 4 consecutive elements two
//! zmm (rows 0..16, 16..32), lane r holding those 4 bytes of row r. One
//! `vpdpbusd(acc, wq[k], broadcast(4 activation bytes of token t at k))` then advances 16
//! (row, token) dot products by 4 elements each, fully reduced: no horizontal sums anywhere.
//! Each activation broadcast feeds both halves; blocks of 6 tokens (4 for the k-quants, which
//! keep a per-block float temp) stream over one group's weight vectors. Per (group, token, 16
//! rows): 8 (or 4) `vpdpbusd`, 1 convert, 1-2 FMAs; per (activation block, token) one more FMA.
//! Activations are read in place from the quantized rows (Q8_0 / Q8_1 / Q8_K blocks).
//!
//! Weights are unsigned (`u = q + off`, 0..255) because `vpdpbusd` takes its broadcast memory
//! operand as the signed one; the offset comes back as `-off * Σa` per (token, group), which is
//! where each integer chain starts (`Prep::init`). Q8_K carries those sums (bsums); for Q8_0
//! they are computed here (`prep_q8`).
//!
//! What bounds it (AMD EPYC Zen 5, 2 cores; measured with small loops, not documented):
//! `vpdpbusd` and FMA/convert share two pipes (a dpbusd+FMA mix runs at their summed cost), and
//! broadcast loads issue about two per cycle: each extra broadcast per (group, token) cost ~20%
//! before the 32-row tile shared them. The kernel alone (weights hot in L1) reaches ~360 G MAC/s
//! single-threaded, ~90% of the pipe bound for 8 `vpdpbusd` + 2 FMA + 1 convert; unpacking the
//! tile costs another ~15-20% at 64 tokens (it is per call, not per token), and `matmat_q`'s
//! activation prep ~15-20% for the 32-element types with 32-row calls (`MatmatActs` shares it).
//!
//! Figures (examples/matmat_bench, single thread, 32-row calls, 64 tokens; 128 for the last;
//! G MAC/s, machine shared with other builds so +-10%), f32 path / `matmat_q` /
//! `matmat_q_prepared`:
//!   2048x640 (Gemma3 FFN up):   Q5_0 92 / 231 / 287, Q8_0 84 / 233 / 292, Q4_1 83 / 243 / 271
//!   640x2048 (Gemma3 FFN down): Q4_K 81 / 312 / 326, Q5_0 85 / 250 / 309, Q6_K 74 / 307 / 322,
//!                               Q8_0 76 / 249 / 314, Q4_1 69 / 258 / 284
//!   4864x896 (Qwen2.5 FFN up):  Q5_0 84 / 236 / 295, Q8_0 82 / 237 / 297, Q4_1 92 / 241 / 270
//!   896x4864, 128 tokens:       Q4_K 54 / 339 / 356, Q5_0 70 / 265 / 344, Q6_K 67 / 341 / 357,
//!                               Q8_0 53 / 265 / 338, Q4_1 89 / 290 / 328
//! The lookup-table types, same columns (Intel Xeon with AVX-512, 2 shared cores, 64 tokens):
//!   640x2048: IQ4_NL 33 / 128 / 167, IQ4_XS 43 / 184 / 196, MXFP4 43 / 125 / 161; at a
//!   Qwen3-30B-A3B expert's 768x2048 and 32 tokens IQ4_NL 31 / 108 / 135, IQ4_XS 43 / 153 /
//!   161, MXFP4 31 / 104 / 129 (Q8_0 there: 43 / 96 / 106).
//! The scalar twin runs 3-5 G MAC/s.

use super::QuantType;
use super::matmat::{Geo, Prep};
use std::cell::RefCell;

/// Whether this CPU runs these kernels (AVX-512 F/BW/VL + VNNI, FMA, F16C; `CORTIQ_SIMD` not
/// `scalar`): the same test as the vec_dot kernels.
pub fn available() -> bool {
    super::vecdot_avx512::available()
}

/// `matmat_q` with AVX-512 VNNI; `false` (nothing written) without the CPU features.
/// Lengths were checked by the caller; `rows, n_t > 0`; `geo == geo(ty)`; `p` filled for `acts`.
/// `tm_ldy`: `None` writes y as [rows, n_t]; `Some(ldy)` writes it token-major, y[t·ldy + r]
/// (the accumulators are token-major already, so this saves the caller a transpose).
#[allow(clippy::too_many_arguments)]
pub(super) fn matmat(
    ty: QuantType,
    geo: &Geo,
    w: &[u8],
    rows: usize,
    cols: usize,
    acts: &[u8],
    n_t: usize,
    p: &Prep,
    y: &mut [f32],
    tm_ldy: Option<usize>,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if available() {
            SCRATCH.with(|s| {
                let mut s = s.borrow_mut();
                // SAFETY: available() confirmed the features `run` enables; `run` documents the
                // shapes it relies on, all checked by matmat's `check` (w, acts, y lengths) and
                // asserted inside against `p`.
                unsafe { imp::run(ty, geo, w, rows, cols, acts, n_t, p, &mut s, y, tm_ldy) };
            });
            return true;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (ty, geo, w, rows, cols, acts, n_t, p, y, tm_ldy);
    false
}

/// `Prep::fill` with AVX-512 (vectors already sized); `false` (nothing written) without the
/// CPU features.
pub(super) fn prep(geo: &Geo, acts: &[u8], n_t: usize, n_sb: usize, p: &mut Prep) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if available() {
            // SAFETY: available() confirmed the features these functions enable; every access
            // is bounds-checked.
            unsafe {
                match geo.act {
                    super::vecdot::ActType::Q8K => imp::prep_q8k(geo, acts, n_t, n_sb, p),
                    _ => imp::prep_q8(geo, acts, n_t, n_sb, p),
                }
            }
            return true;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (geo, acts, n_t, n_sb, p);
    false
}

/// 64 bytes, 64-byte aligned: one zmm of the tile buffers.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct A64([u8; 64]);

/// Per-thread buffers, reused across calls.
#[derive(Default)]
struct Scratch {
    /// RS rows of unpacked bytes, `kcp` each ([RS][kcp]).
    rowbuf: Vec<A64>,
    /// The transposed tile: [kcp / 4][2] zmm, lane r of half h = 4 bytes of row 16h + r.
    wq: Vec<A64>,
    /// Group scales and mins of the tile: [groups][RS rows] f32.
    fw: Vec<A64>,
    fmin: Vec<A64>,
    /// The same, as unpacked: [RS rows][groups].
    fwrow: Vec<A64>,
    fminrow: Vec<A64>,
    /// Partial sums across K-chunks: [n_t][RS rows] f32.
    acc: Vec<A64>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// K-chunk (elements) unpacked at a time: a 16-row tile of `KC` bytes (16 KiB) plus its scales
/// and T token rows of it stay in L1 while all tokens stream over it.
const KC: usize = 1024;
/// Rows per weight tile (two zmm of 16 lanes), and the row stride of its scale arrays.
const RS: usize = 32;

#[cfg(target_arch = "x86_64")]
mod imp {
    use super::super::QuantType;
    use super::super::blocks::*;
    use super::super::dequant::{iq4xs_scales, q3k_scales};
    use super::super::matmat::{Geo, MXFP4_OFF, Mins, Prep, lut_u};
    use super::super::vecdot::{ActType, Q8_1_BYTES};
    use super::{A64, KC, RS, Scratch};
    use std::arch::x86_64::*;

    // Every helper carries the same target features so it inlines into the kernels; intrinsics
    // without pointers are safe to call inside such functions.

    /// 32 bytes of `s` from `off` (bounds-checked).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn ld32(s: &[u8], off: usize) -> __m256i {
        let s = &s[off..off + 32];
        // SAFETY: `s` is exactly 32 readable bytes; loadu has no alignment requirement.
        unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
    }

    /// Store 32 bytes at `d[off..off + 32]` (bounds-checked).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn st32(d: &mut [u8], off: usize, v: __m256i) {
        let d = &mut d[off..off + 32];
        // SAFETY: `d` is exactly 32 writable bytes; storeu has no alignment requirement.
        unsafe { _mm256_storeu_si256(d.as_mut_ptr().cast(), v) }
    }

    /// f16 -> f32, exact (F16C).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn f16s(b: [u8; 2]) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(u16::from_le_bytes(b) as i16)))
    }

    /// `(v >> 2k) & 3` per byte.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn crumb(v: __m256i, k: u32) -> __m256i {
        _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * k as i32)), _mm256_set1_epi8(3))
    }

    /// `Prep::fill` for Q8_0 / Q8_1 rows: `da` (F16C), Q8_1's `s` into `fbs`, and for Q8_0
    /// weights with an offset `init[t][b] = -off * Σ(block quants)`, 4 blocks per step with
    /// `vpsadbw` (Σ|q ^ 0x80 - 0| = Σ(q + 128) per 8 bytes) and two `vphaddd`.
    ///
    /// # Safety
    /// The CPU must support the features enabled below (every access is bounds-checked).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn prep_q8(geo: &Geo, acts: &[u8], n_t: usize, nb: usize, p: &mut Prep) {
        let q8_1 = geo.act == ActType::Q8_1;
        let (ts, qo) = if q8_1 { (Q8_1_BYTES, 4) } else { (34, 2) };
        let off = geo.off;
        let flip = _mm256_set1_epi8(-128);
        let z = _mm256_setzero_si256();
        let sad = |row: &[u8], b: usize| _mm256_sad_epu8(_mm256_xor_si256(ld32(row, ts * b + qo), flip), z);
        let ab = nb * ts;
        let h2f = |h: u16| _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)));
        for t in 0..n_t {
            let row = &acts[t * ab..(t + 1) * ab];
            let da = &mut p.da[t * nb..(t + 1) * nb];
            if q8_1 {
                let fbs = &mut p.fbs[t * nb..(t + 1) * nb];
                for (b, (d, s)) in da.iter_mut().zip(fbs.iter_mut()).enumerate() {
                    // SAFETY: bytes ts*b..ts*b+4 lie in `row` (b < nb, row is nb * ts bytes).
                    let v = unsafe { row.as_ptr().add(ts * b).cast::<u32>().read_unaligned() };
                    *d = h2f(v as u16);
                    *s = h2f((v >> 16) as u16);
                }
            } else {
                for (b, d) in da.iter_mut().enumerate() {
                    // SAFETY: bytes ts*b..ts*b+2 lie in `row` (b < nb, row is nb * ts bytes).
                    *d = h2f(unsafe { row.as_ptr().add(ts * b).cast::<u16>().read_unaligned() });
                }
            }
            if off == 0 {
                continue;
            }
            let out = &mut p.init[t * nb..(t + 1) * nb];
            let mut b = 0;
            while b + 4 <= nb {
                // each sad: 4 u64 partial sums (< 2^11) = 4 i32 pairs (value, 0)
                let h01 = _mm256_hadd_epi32(sad(row, b), sad(row, b + 1));
                let h23 = _mm256_hadd_epi32(sad(row, b + 2), sad(row, b + 3));
                let h = _mm256_hadd_epi32(h01, h23); // [b0 lo, b1 lo, b2 lo, b3 lo | the hi halves]
                let s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
                // Σ(q + 128) - 32 * 128 = Σq; times -off
                let s = _mm_mullo_epi32(_mm_sub_epi32(s, _mm_set1_epi32(32 * 128)), _mm_set1_epi32(-off));
                let o = &mut out[b..b + 4];
                // SAFETY: `o` is 4 writable i32; storeu has no alignment requirement.
                unsafe { _mm_storeu_si128(o.as_mut_ptr().cast(), s) };
                b += 4;
            }
            for (bb, o) in out.iter_mut().enumerate().skip(b) {
                let q = &row[ts * bb + qo..ts * bb + qo + 32];
                *o = -off * q.iter().map(|&v| v as i8 as i32).sum::<i32>();
            }
        }
    }

    /// `Prep::fill` for Q8_K rows: `da`, and from the 16 bsums per block `init = -off * bsum`
    /// (16-element groups) or `fbs` = the group sums as f32 (pairs summed for 32-element
    /// groups).
    ///
    /// # Safety
    /// The CPU must support the features enabled below (every access is bounds-checked).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn prep_q8k(geo: &Geo, acts: &[u8], n_t: usize, n_sb: usize, p: &mut Prep) {
        let ab = n_sb * 292;
        let n_g = n_sb * geo.sb_groups;
        for t in 0..n_t {
            let row = &acts[t * ab..(t + 1) * ab];
            for (sb, blk) in view::<BlockQ8K>(row).iter().enumerate() {
                p.da[t * n_sb + sb] = f32::from_le_bytes(blk.d);
                let bs = _mm512_cvtepi16_epi32(ld32(blk.bsums.as_flattened(), 0)); // 16 i32
                let g0 = t * n_g + sb * geo.sb_groups;
                if geo.group == 16 {
                    if geo.off != 0 {
                        let o = &mut p.init[g0..g0 + 16];
                        let v = _mm512_mullo_epi32(bs, _mm512_set1_epi32(-geo.off));
                        // SAFETY: `o` is 16 writable i32; storeu has no alignment requirement.
                        unsafe { _mm512_storeu_si512(o.as_mut_ptr().cast(), v) };
                    }
                    if geo.mins == Mins::Group {
                        let o = &mut p.fbs[g0..g0 + 16];
                        // SAFETY: `o` is 16 writable f32.
                        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), _mm512_cvtepi32_ps(bs)) };
                    }
                } else {
                    // 32-element groups: pair sums. Q4_K, Q5_K: no offset, mins per group;
                    // IQ4_XS: an offset, no mins.
                    let pairs = _mm512_add_epi32(bs, _mm512_srli_epi64::<32>(bs)); // even lanes
                    let v = _mm512_cvtepi64_epi32(pairs); // 8 i32
                    if geo.off != 0 {
                        let o = &mut p.init[g0..g0 + 8];
                        let v = _mm256_mullo_epi32(v, _mm256_set1_epi32(-geo.off));
                        // SAFETY: `o` is 8 writable i32; storeu has no alignment requirement.
                        unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), v) };
                    }
                    if geo.mins == Mins::Group {
                        let o = &mut p.fbs[g0..g0 + 8];
                        // SAFETY: `o` is 8 writable f32.
                        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), _mm256_cvtepi32_ps(v)) };
                    }
                }
            }
        }
    }

    /// `out[0..8] = s * f32(q[0..8])` for 8 unsigned bytes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn scale8(q: u64, s: f32, out: &mut [f32]) {
        let v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(q as i64)));
        let o = &mut out[..8];
        // SAFETY: `o` is 8 writable f32.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), _mm256_mul_ps(v, _mm256_set1_ps(s))) };
    }

    /// `out[0..16] = s * f32(v)` for 16 i32 lanes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn scale16(v: __m512i, s: f32, out: &mut [f32]) {
        let o = &mut out[..16];
        // SAFETY: `o` is 16 writable f32.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), _mm512_mul_ps(_mm512_cvtepi32_ps(v), _mm512_set1_ps(s))) };
    }

    /// 16 bytes of `s` from `off` as 16 i32 (zero- or sign-extended).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn bytes16(s: &[u8], signed: bool) -> __m512i {
        let s = &s[..16];
        // SAFETY: `s` is 16 readable bytes.
        let b = unsafe { _mm_loadu_si128(s.as_ptr().cast()) };
        if signed { _mm512_cvtepi8_epi32(b) } else { _mm512_cvtepu8_epi32(b) }
    }

    /// Unpack the blocks `wrow` (one row's blocks of this K-chunk) into unsigned bytes `u` (in
    /// element order) and its group scales / mins, exactly as `matmat::decode_row` does: every
    /// scale is the same single f32 product (`d * sc`, `-dmin * m` = `-(dmin * m)`).
    ///
    /// The legacy types (one f16 per block) store theirs straight into the tile layout,
    /// `ft[g * RS + r]`; the k-quants convert 8 or 16 at a time into this row's run `fw[g]`,
    /// `fmin[g]` (transposed for the whole tile afterwards): as scalar code their scales were
    /// ~3/4 of this function's time.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn unpack_row(
        ty: QuantType,
        wrow: &[u8],
        u: &mut [u8],
        r: usize,
        ft: &mut [f32],
        fmint: &mut [f32],
        fw: &mut [f32],
        fmin: &mut [f32],
    ) {
        let m4 = _mm256_set1_epi8(0x0F);
        match ty {
            QuantType::Q8_0 => unpack_legacy::<0>(wrow, u, r, ft, fmint),
            QuantType::Q4_0 => unpack_legacy::<1>(wrow, u, r, ft, fmint),
            QuantType::Q4_1 => unpack_legacy::<2>(wrow, u, r, ft, fmint),
            QuantType::Q5_0 => unpack_legacy::<3>(wrow, u, r, ft, fmint),
            QuantType::Q5_1 => unpack_legacy::<4>(wrow, u, r, ft, fmint),
            QuantType::Q4K => {
                for (i, b) in view::<BlockQ4K>(wrow).iter().enumerate() {
                    let o = &mut u[256 * i..256 * i + 256];
                    for j in 0..4 {
                        let bits = ld32(&b.qs, 32 * j);
                        st32(o, 64 * j, _mm256_and_si256(bits, m4));
                        st32(o, 64 * j + 32, _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4));
                    }
                    k4_scales(b.d, b.dmin, &b.scales, &mut fw[8 * i..], &mut fmin[8 * i..]);
                }
            }
            QuantType::Q5K => {
                for (i, b) in view::<BlockQ5K>(wrow).iter().enumerate() {
                    let o = &mut u[256 * i..256 * i + 256];
                    let hbits = ld32(&b.qh, 0);
                    let b16 = _mm256_set1_epi8(16);
                    for j in 0..4 {
                        let bits = ld32(&b.qs, 32 * j);
                        let lo = _mm256_and_si256(bits, m4);
                        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
                        let ml = _mm256_test_epi8_mask(hbits, _mm256_set1_epi8((1u8 << (2 * j)) as i8));
                        let mh = _mm256_test_epi8_mask(hbits, _mm256_set1_epi8((1u8 << (2 * j + 1)) as i8));
                        st32(o, 64 * j, _mm256_mask_add_epi8(lo, ml, lo, b16));
                        st32(o, 64 * j + 32, _mm256_mask_add_epi8(hi, mh, hi, b16));
                    }
                    k4_scales(b.d, b.dmin, &b.scales, &mut fw[8 * i..], &mut fmin[8 * i..]);
                }
            }
            QuantType::Q6K => {
                for (i, b) in view::<BlockQ6K>(wrow).iter().enumerate() {
                    let o = &mut u[256 * i..256 * i + 256];
                    for j in 0..2 {
                        let l1 = ld32(&b.ql, 64 * j);
                        let l2 = ld32(&b.ql, 64 * j + 32);
                        let h = ld32(&b.qh, 32 * j);
                        let hb = |k: i32| {
                            _mm256_slli_epi16::<4>(_mm256_and_si256(
                                _mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * k)),
                                _mm256_set1_epi8(3),
                            ))
                        };
                        let lo1 = _mm256_and_si256(l1, m4);
                        let lo2 = _mm256_and_si256(l2, m4);
                        let hi1 = _mm256_and_si256(_mm256_srli_epi16::<4>(l1), m4);
                        let hi2 = _mm256_and_si256(_mm256_srli_epi16::<4>(l2), m4);
                        st32(o, 128 * j, _mm256_or_si256(lo1, hb(0)));
                        st32(o, 128 * j + 32, _mm256_or_si256(lo2, hb(1)));
                        st32(o, 128 * j + 64, _mm256_or_si256(hi1, hb(2)));
                        st32(o, 128 * j + 96, _mm256_or_si256(hi2, hb(3)));
                    }
                    // SAFETY-free: i8 scales viewed as bytes
                    let sc: [u8; 16] = b.scales.map(|v| v as u8);
                    scale16(bytes16(&sc, true), f16s(b.d), &mut fw[16 * i..]);
                }
            }
            QuantType::Q2K => {
                for (i, b) in view::<BlockQ2K>(wrow).iter().enumerate() {
                    let o = &mut u[256 * i..256 * i + 256];
                    for j in 0..2 {
                        let bits = ld32(&b.qs, 32 * j);
                        for k in 0..4 {
                            st32(o, 128 * j + 32 * k as usize, crumb(bits, k));
                        }
                    }
                    let sc = bytes16(&b.scales, false);
                    scale16(_mm512_and_si512(sc, _mm512_set1_epi32(0x0F)), f16s(b.d), &mut fw[16 * i..]);
                    scale16(_mm512_srli_epi32::<4>(sc), -f16s(b.dmin), &mut fmin[16 * i..]);
                }
            }
            QuantType::Q3K => {
                for (i, b) in view::<BlockQ3K>(wrow).iter().enumerate() {
                    let o = &mut u[256 * i..256 * i + 256];
                    let hbits = ld32(&b.hmask, 0);
                    let b4 = _mm256_set1_epi8(4);
                    for j in 0..2 {
                        let bits = ld32(&b.qs, 32 * j);
                        for k in 0..4 {
                            let q = crumb(bits, k);
                            let m = _mm256_test_epi8_mask(hbits, _mm256_set1_epi8((1u8 << (4 * j as u32 + k)) as i8));
                            st32(o, 128 * j + 32 * k as usize, _mm256_mask_add_epi8(q, m, q, b4));
                        }
                    }
                    let sc: [u8; 16] = q3k_scales(&b.scales).map(|v| v as u8);
                    scale16(bytes16(&sc, true), f16s(b.d), &mut fw[16 * i..]);
                }
            }
            QuantType::IQ4NL => unpack_lut::<false>(wrow, u, r, ft),
            QuantType::MXFP4 => unpack_lut::<true>(wrow, u, r, ft),
            QuantType::IQ4XS => {
                let lut = _mm256_broadcastsi128_si256(lut16(&lut_u(&KVALUES_IQ4NL, 128)));
                for (i, b) in view::<BlockIQ4XS>(wrow).iter().enumerate() {
                    let o = &mut u[256 * i..256 * i + 256];
                    for j in 0..4 {
                        // sub-blocks 2j, 2j + 1: 16 nibble bytes each, low nibbles first
                        let bits = ld32(&b.qs, 32 * j);
                        let lo = _mm256_and_si256(bits, m4);
                        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
                        let q0 = _mm256_permute2x128_si256::<0x20>(lo, hi); // sub-block 2j
                        let q1 = _mm256_permute2x128_si256::<0x31>(lo, hi); // sub-block 2j + 1
                        st32(o, 64 * j, _mm256_shuffle_epi8(lut, q0));
                        st32(o, 64 * j + 32, _mm256_shuffle_epi8(lut, q1));
                    }
                    let d = f16s(b.d);
                    for (g, &sc) in iq4xs_scales(b).iter().enumerate() {
                        fw[8 * i + g] = d * sc as f32;
                    }
                }
            }
            // the grid types: scalar decode (their grids are gathers; ~1/10 of the tile's time)
            QuantType::IQ2XXS | QuantType::IQ2XS | QuantType::IQ2S | QuantType::IQ3XXS | QuantType::IQ3S => {
                crate::quant::matmat::decode_row(ty, wrow, u, fw, fmin)
            }
            _ => unreachable!("unpack_row({ty}): no geometry"),
        }
    }

    /// 16 bytes as one xmm.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn lut16(t: &[u8; 16]) -> __m128i {
        // SAFETY: `t` is 16 readable bytes.
        unsafe { _mm_loadu_si128(t.as_ptr().cast()) }
    }

    /// `unpack_row` for IQ4_NL (MX = false: 18-byte blocks, f16 scale) and MXFP4 (MX = true:
    /// 17-byte blocks, E8M0 scale): nibbles as Q4_0, then one `vpshufb` through the table of
    /// `level + off` (`matmat::lut_u`, the bytes `decode_row` produces); scales straight into
    /// the tile layout, `ft[i * RS + r]`, as the legacy types do.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn unpack_lut<const MX: bool>(wrow: &[u8], u: &mut [u8], r: usize, ft: &mut [f32]) {
        let ts = if MX { 17 } else { 18 };
        let lut = if MX { lut_u(&KVALUES_MXFP4, MXFP4_OFF) } else { lut_u(&KVALUES_IQ4NL, 128) };
        let lut = _mm256_broadcastsi128_si256(lut16(&lut));
        let m4 = _mm_set1_epi8(0x0F);
        let nb = wrow.len() / ts;
        assert!(nb * ts == wrow.len() && u.len() >= 32 * nb && ft.len() >= RS * nb && r < RS);
        for i in 0..nb {
            let b = &wrow[ts * i..ts * (i + 1)];
            let qs = &b[ts - 16..];
            // SAFETY: `qs` is 16 readable bytes.
            let p = unsafe { _mm_loadu_si128(qs.as_ptr().cast()) };
            let q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16::<4>(p), m4), _mm_and_si128(p, m4));
            st32(u, 32 * i, _mm256_shuffle_epi8(lut, q));
            ft[RS * i + r] = if MX { e8m0_half(b[0]) } else { f16s([b[0], b[1]]) };
        }
    }

    /// The legacy part of `unpack_row`, K = 0..5 for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: one pass of
    /// unchecked loads and stores over the blocks (with bounds checks and the `half`-style
    /// scalar convert this loop was ~1/5 of the legacy types' time at 64 tokens).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn unpack_legacy<const K: u8>(wrow: &[u8], u: &mut [u8], r: usize, ft: &mut [f32], fmint: &mut [f32]) {
        // block bytes, quants offset, qh offset (Q5), min offset (Q4_1/Q5_1)
        let (ts, qo, ho, mo) = match K {
            0 => (34, 2, 0, 0),
            1 => (18, 2, 0, 0),
            2 => (20, 4, 0, 2),
            3 => (22, 6, 2, 0),
            _ => (24, 8, 4, 2),
        };
        let nb = wrow.len() / ts;
        assert!(nb * ts == wrow.len() && u.len() >= 32 * nb && ft.len() >= RS * nb && r < RS);
        assert!(mo == 0 || fmint.len() >= RS * nb);
        let h2f = |h: u16| _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)));
        let m4 = _mm_set1_epi8(0x0F);
        for i in 0..nb {
            // SAFETY: block i is bytes ts*i..ts*(i+1) of `wrow` and every read below stays in
            // it (quants at qo..qo+16/32, qh at ho..ho+4, f16s at 0 and mo); the stores are
            // within the lengths asserted above.
            unsafe {
                let b = wrow.as_ptr().add(ts * i);
                let q = if K == 0 {
                    _mm256_xor_si256(_mm256_loadu_si256(b.add(qo).cast()), _mm256_set1_epi8(-128))
                } else {
                    let p = _mm_loadu_si128(b.add(qo).cast());
                    let q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16::<4>(p), m4), _mm_and_si128(p, m4));
                    if K >= 3 {
                        let qh = b.add(ho).cast::<u32>().read_unaligned();
                        _mm256_mask_add_epi8(q, qh, q, _mm256_set1_epi8(16))
                    } else {
                        q
                    }
                };
                _mm256_storeu_si256(u.as_mut_ptr().add(32 * i).cast(), q);
                *ft.get_unchecked_mut(RS * i + r) = h2f(b.cast::<u16>().read_unaligned());
                if mo != 0 {
                    *fmint.get_unchecked_mut(RS * i + r) = h2f(b.add(mo).cast::<u16>().read_unaligned());
                }
            }
        }
    }

    /// Q4_K/Q5_K group scales `d * sc` and mins `-dmin * m` of one block into `fw[0..8]`,
    /// `fmin[0..8]`. The 6-bit fields are unpacked with 32-bit masks (as ggml's utmp code):
    /// same values as `k4_scale_min`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn k4_scales(d: [u8; 2], dmin: [u8; 2], scales: &[u8; 12], fw: &mut [f32], fmin: &mut [f32]) {
        let w = |k: usize| u32::from_le_bytes([scales[4 * k], scales[4 * k + 1], scales[4 * k + 2], scales[4 * k + 3]]);
        let (u0, u1, u2) = (w(0), w(1), w(2));
        let (m1, m2, m3) = (0x3f3f_3f3fu32, 0x0f0f_0f0fu32, 0x0303_0303u32);
        // scales j<4: low 6 bits of bytes 0..4; j>=4: low nibbles of bytes 8..12 + top bits of 0..4
        let sc = (u0 & m1) as u64 | ((((u2 & m2) | (((u0 >> 6) & m3) << 4)) as u64) << 32);
        // mins j<4: low 6 bits of bytes 4..8; j>=4: high nibbles of bytes 8..12 + top bits of 4..8
        let mn = (u1 & m1) as u64 | (((((u2 >> 4) & m2) | (((u1 >> 6) & m3) << 4)) as u64) << 32);
        scale8(sc, f16s(d), fw);
        scale8(mn, -f16s(dmin), fmin);
    }

    /// Transpose 16 rows x 16 dwords (`rows[r]` = 64 bytes of row r) into `out[j]` = dword j of
    /// every row (lane r = row r): unpack 32-bit, unpack 64-bit, two 128-bit lane shuffles.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn transpose16(r: [__m512i; 16]) -> [__m512i; 16] {
        // t[2p], t[2p+1]: rows 2p, 2p+1 interleaved by dword (lo: elements 0,1 of each lane)
        let mut t = [_mm512_setzero_si512(); 16];
        for p in 0..8 {
            t[2 * p] = _mm512_unpacklo_epi32(r[2 * p], r[2 * p + 1]);
            t[2 * p + 1] = _mm512_unpackhi_epi32(r[2 * p], r[2 * p + 1]);
        }
        // u[4q + e]: in 128-bit lane L, rows 4q..4q+4 of dword 4L + e
        let mut u = [_mm512_setzero_si512(); 16];
        for q in 0..4 {
            let (a0, a1, b0, b1) = (t[4 * q], t[4 * q + 1], t[4 * q + 2], t[4 * q + 3]);
            u[4 * q] = _mm512_unpacklo_epi64(a0, b0);
            u[4 * q + 1] = _mm512_unpackhi_epi64(a0, b0);
            u[4 * q + 2] = _mm512_unpacklo_epi64(a1, b1);
            u[4 * q + 3] = _mm512_unpackhi_epi64(a1, b1);
        }
        let mut out = [_mm512_setzero_si512(); 16];
        for e in 0..4 {
            // v0: [q0 L0, q0 L2, q1 L0, q1 L2], v1: [q0 L1, q0 L3, q1 L1, q1 L3], v2/v3: q2, q3
            let v0 = _mm512_shuffle_i32x4::<0x88>(u[e], u[4 + e]);
            let v1 = _mm512_shuffle_i32x4::<0xDD>(u[e], u[4 + e]);
            let v2 = _mm512_shuffle_i32x4::<0x88>(u[8 + e], u[12 + e]);
            let v3 = _mm512_shuffle_i32x4::<0xDD>(u[8 + e], u[12 + e]);
            out[e] = _mm512_shuffle_i32x4::<0x88>(v0, v2); // lane 0 of all quads: dword e
            out[8 + e] = _mm512_shuffle_i32x4::<0xDD>(v0, v2); // lane 2: dword 8 + e
            out[4 + e] = _mm512_shuffle_i32x4::<0x88>(v1, v3); // lane 1: dword 4 + e
            out[12 + e] = _mm512_shuffle_i32x4::<0xDD>(v1, v3); // lane 3: dword 12 + e
        }
        out
    }

    /// Everything one token block of the kernel needs about the current tile and chunk.
    struct Tile {
        /// [groups of the chunk][CH][2 halves] zmm (half h: rows 16h..16h+16).
        wq: *const __m512i,
        /// [groups of the chunk][RS] f32.
        fw: *const f32,
        fmin: *const f32,
        /// First quant byte of the chunk in token row 0; token rows are `arb` bytes apart,
        /// activation blocks `ats` bytes.
        acts: *const u8,
        arb: usize,
        ats: usize,
        /// Activation blocks in this chunk.
        n_sbc: usize,
        /// Prep rows at this chunk: da + t * n_sb, init / fbs + t * n_g.
        da: *const f32,
        n_sb: usize,
        init: *const i32,
        fbs: *const f32,
        n_g: usize,
        /// [n_t][RS] f32 partial sums; `first`: start from zero instead.
        acc: *mut f32,
        first: bool,
    }

    /// T tokens from `t0` over the whole chunk for R x 16 rows: the module header's formula,
    /// one lane per row. CH = group / 4 chunks of 4 elements per group, SBG groups per
    /// activation block, OFF: chains start at `init`, MINS: 0 none, 1 per block, 2 per group.
    ///
    /// Broadcast loads are what limits this loop on Zen 5 (about two per cycle, whatever the
    /// pipes are doing): each activation broadcast feeds R = 2 `vpdpbusd`, and the per-group
    /// scalars (init, fbs, da) are broadcast once for both halves.
    ///
    /// # Safety
    /// CPU features as enabled; every pointer of `k` covers the extents documented on `Tile`
    /// for `n_sbc` blocks and tokens `t0..t0 + T`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn tile<const T: usize, const R: usize, const CH: usize, const SBG: usize, const OFF: bool, const MINS: u8>(
        k: &Tile,
        t0: usize,
    ) {
        // SAFETY (whole body): every offset below stays inside the extents the caller
        // guarantees (see `run`); loads are unaligned-tolerant except wq/fw/fmin/acc, which are
        // A64 buffers (64-byte aligned, whole zmm each).
        unsafe {
            let mut facc = [[_mm512_setzero_ps(); R]; T];
            let mut ap = [k.acts; T];
            let (mut dp, mut ip, mut fp) = ([k.da; T], [k.init; T], [k.fbs; T]);
            for t in 0..T {
                if !k.first {
                    for (h, f) in facc[t].iter_mut().enumerate() {
                        *f = _mm512_load_ps(k.acc.add(RS * (t0 + t) + 16 * h));
                    }
                }
                ap[t] = k.acts.add((t0 + t) * k.arb);
                dp[t] = k.da.add((t0 + t) * k.n_sb);
                if OFF {
                    ip[t] = k.init.add((t0 + t) * k.n_g);
                }
                if MINS != 0 {
                    fp[t] = k.fbs.add((t0 + t) * k.n_g);
                }
            }
            let (mut wp, mut fwp, mut fmp) = (k.wq, k.fw, k.fmin);
            let mut gi = 0; // group index in the chunk
            for sb in 0..k.n_sbc {
                let mut temp = [[_mm512_setzero_ps(); R]; T];
                let mut fmv = [_mm512_setzero_ps(); R];
                for j in 0..SBG {
                    // T x R independent chains, interleaved: consecutive vpdpbusd never wait on
                    // each other (latency ~4-5 cycles, two issue per cycle)
                    let mut acc = [[_mm512_setzero_si512(); R]; T];
                    if OFF {
                        for a in acc.iter_mut().zip(&ip) {
                            let v = _mm512_set1_epi32(*a.1.add(gi));
                            *a.0 = [v; R];
                        }
                    }
                    for c in 0..CH {
                        let mut wc = [_mm512_setzero_si512(); R];
                        for (h, w) in wc.iter_mut().enumerate() {
                            *w = _mm512_load_si512(wp.add(2 * c + h));
                        }
                        for t in 0..T {
                            let a = ap[t].add(sb * k.ats + j * 4 * CH + 4 * c).cast::<i32>().read_unaligned();
                            let a = _mm512_set1_epi32(a);
                            for h in 0..R {
                                acc[t][h] = _mm512_dpbusd_epi32(acc[t][h], wc[h], a);
                            }
                        }
                    }
                    let mut fwv = [_mm512_setzero_ps(); R];
                    for h in 0..R {
                        fwv[h] = _mm512_load_ps(fwp.add(16 * h));
                        if MINS != 0 {
                            fmv[h] = _mm512_load_ps(fmp.add(16 * h));
                        }
                    }
                    for t in 0..T {
                        let fb = if MINS == 2 { _mm512_set1_ps(*fp[t].add(gi)) } else { _mm512_setzero_ps() };
                        for h in 0..R {
                            temp[t][h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[t][h]), fwv[h], temp[t][h]);
                            if MINS == 2 {
                                temp[t][h] = _mm512_fmadd_ps(fmv[h], fb, temp[t][h]);
                            }
                        }
                    }
                    wp = wp.add(2 * CH);
                    fwp = fwp.add(RS);
                    fmp = fmp.add(RS);
                    gi += 1;
                }
                for t in 0..T {
                    let d = _mm512_set1_ps(*dp[t].add(sb));
                    // one group per block when MINS == 1: gi - 1 is this block's
                    let s = if MINS == 1 { _mm512_set1_ps(*fp[t].add(gi - 1)) } else { _mm512_setzero_ps() };
                    for h in 0..R {
                        facc[t][h] = _mm512_fmadd_ps(temp[t][h], d, facc[t][h]);
                        if MINS == 1 {
                            facc[t][h] = _mm512_fmadd_ps(fmv[h], s, facc[t][h]);
                        }
                    }
                }
            }
            for (t, f) in facc.iter().enumerate() {
                for (h, v) in f.iter().enumerate() {
                    _mm512_store_ps(k.acc.add(RS * (t0 + t) + 16 * h), *v);
                }
            }
        }
    }

    /// The kernel for one type class over all `n_t` tokens: blocks of TM tokens, then the tail.
    ///
    /// # Safety
    /// As `tile`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn tiles<const TM: usize, const R: usize, const CH: usize, const SBG: usize, const OFF: bool, const MINS: u8>(
        k: &Tile,
        n_t: usize,
    ) {
        let mut t0 = 0;
        // SAFETY: forwarded; every call covers tokens t0..t0 + T <= n_t.
        unsafe {
            while t0 + TM <= n_t {
                tile::<TM, R, CH, SBG, OFF, MINS>(k, t0);
                t0 += TM;
            }
            match n_t - t0 {
                0 => {}
                1 => tile::<1, R, CH, SBG, OFF, MINS>(k, t0),
                2 => tile::<2, R, CH, SBG, OFF, MINS>(k, t0),
                3 => tile::<3, R, CH, SBG, OFF, MINS>(k, t0),
                4 => tile::<4, R, CH, SBG, OFF, MINS>(k, t0),
                _ => tile::<5, R, CH, SBG, OFF, MINS>(k, t0),
            }
        }
    }

    /// `tiles` for the type class of `ty`, with R = 2 (32 rows) or 1 (up to 16).
    ///
    /// # Safety
    /// As `tile`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn dispatch<const R: usize>(ty: QuantType, k: &Tile, n_t: usize) {
        // token blocks: 6 for the one-group-per-block types (2 accumulators per token and
        // row half), 4 for the k-quants (3: integer chain, block temp, total)
        // SAFETY: forwarded.
        unsafe {
            match ty {
                QuantType::Q4_1 | QuantType::Q5_1 => tiles::<6, R, 8, 1, false, 1>(k, n_t),
                QuantType::Q4K | QuantType::Q5K => tiles::<4, R, 8, 8, false, 2>(k, n_t),
                QuantType::Q2K => tiles::<4, R, 4, 16, false, 2>(k, n_t),
                QuantType::Q3K | QuantType::Q6K => tiles::<4, R, 4, 16, true, 0>(k, n_t),
                QuantType::IQ2XXS | QuantType::IQ2XS | QuantType::IQ2S | QuantType::IQ3XXS | QuantType::IQ3S => {
                    tiles::<4, R, 4, 16, true, 0>(k, n_t)
                }
                QuantType::IQ4XS => tiles::<4, R, 8, 8, true, 0>(k, n_t),
                _ => tiles::<6, R, 8, 1, true, 0>(k, n_t), // Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4
            }
        }
    }

    /// The whole product: tiles of 32 rows (the last one 16 when it fits), K-chunks of at most
    /// `KC` elements (whole activation blocks), blocks of 4-6 tokens.
    ///
    /// # Safety
    /// The CPU must support the features enabled below. `w`, `acts`, `y` have the lengths
    /// `matmat::check` demands for (ty, rows, cols, n_t), `rows, n_t > 0`, `geo == geo(ty)`,
    /// and `p` was filled for these activations (`Prep::fill`).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn run(
        ty: QuantType,
        geo: &Geo,
        w: &[u8],
        rows: usize,
        cols: usize,
        acts: &[u8],
        n_t: usize,
        p: &Prep,
        s: &mut Scratch,
        y: &mut [f32],
        tm_ldy: Option<usize>,
    ) {
        let (sb_el, g_el) = (geo.sb(), geo.group);
        let (n_sb, n_g) = (cols / sb_el, cols / g_el);
        let rb = w.len() / rows; // weight row bytes
        let wsb = rb / n_sb; // weight bytes per activation block (= one weight block)
        let arb = acts.len() / n_t;
        let (ats, qoff) = match geo.act {
            ActType::Q8_0 => (34, 2),
            ActType::Q8_1 => (Q8_1_BYTES, 4),
            ActType::Q8K => (292, 4),
        };
        // the prep vectors the kernel reads (it reads init / fbs only when OFF / MINS say so)
        assert!(p.da.len() == n_t * n_sb);
        assert!(geo.off == 0 || p.init.len() == n_t * n_g);
        assert!(geo.mins == Mins::None || p.fbs.len() == n_t * n_g);
        let sbc = (KC / sb_el).max(1); // activation blocks per chunk
        let kcp = (sbc * sb_el).div_ceil(64) * 64; // chunk bytes per row, padded for transpose16
        let zero = A64([0; 64]);
        s.rowbuf.resize(RS * kcp / 64, zero);
        s.wq.resize(2 * kcp / 4, zero);
        let ngp = (sbc * geo.sb_groups).div_ceil(16) * 16; // groups per chunk, padded
        s.fw.resize(ngp * RS / 16, zero);
        s.fmin.resize(ngp * RS / 16, zero);
        s.fwrow.resize(ngp * RS / 16, zero);
        s.fminrow.resize(ngp * RS / 16, zero);
        s.acc.resize(n_t * RS / 16, zero);
        let mut r0 = 0;
        while r0 < rows {
            let nr = (rows - r0).min(RS);
            let halves = nr.div_ceil(16);
            let mut sb0 = 0;
            while sb0 < n_sb {
                let nsb = sbc.min(n_sb - sb0);
                // 1. unpack each row's blocks sb0..sb0+nsb (one sequential read per row)
                {
                    let rowbuf = as_bytes_mut(&mut s.rowbuf);
                    let (ft, fmint) = (as_f32_mut(&mut s.fw), as_f32_mut(&mut s.fmin));
                    let fwrow = as_f32_mut(&mut s.fwrow);
                    let fminrow = as_f32_mut(&mut s.fminrow);
                    for r in 0..nr {
                        let wr = &w[(r0 + r) * rb + sb0 * wsb..(r0 + r) * rb + (sb0 + nsb) * wsb];
                        let (fw, fmin) = (&mut fwrow[r * ngp..(r + 1) * ngp], &mut fminrow[r * ngp..(r + 1) * ngp]);
                        unpack_row(ty, wr, &mut rowbuf[r * kcp..(r + 1) * kcp], r, ft, fmint, fw, fmin);
                    }
                    // rows nr..16 * halves keep stale bytes and scales: their lanes are never
                    // written out, and lanes do not mix
                }
                // 1b. k-quant scales [row][group] -> [group][row], 16 x 16 at a time
                let with_min = geo.mins != Mins::None;
                for h in (0..halves).filter(|_| geo.sb_groups > 1) {
                    for gb in 0..ngp / 16 {
                        for (src, dst) in
                            [(&s.fwrow, &mut s.fw), (&s.fminrow, &mut s.fmin)].into_iter().take(1 + with_min as usize)
                        {
                            let mut v = [_mm512_setzero_si512(); 16];
                            for (r, vr) in v.iter_mut().enumerate() {
                                // SAFETY: the row buffers are RS * ngp f32 (A64-aligned, ngp a
                                // multiple of 16): row 16h + r, groups 16gb..16gb + 16.
                                *vr = unsafe {
                                    _mm512_load_si512(src.as_ptr().cast::<f32>().add((16 * h + r) * ngp + 16 * gb).cast())
                                };
                            }
                            for (j, oj) in transpose16(v).iter().enumerate() {
                                // SAFETY: fw / fmin hold ngp * RS f32: group 16gb + j, lanes 16h..16h + 16.
                                unsafe {
                                    _mm512_store_si512(
                                        dst.as_mut_ptr().cast::<f32>().add((16 * gb + j) * RS + 16 * h).cast(),
                                        *oj,
                                    )
                                };
                            }
                        }
                    }
                }
                // 2. transpose into wq, 64 elements x 16 rows (16 zmm) at a time
                let spans = (nsb * sb_el).div_ceil(64);
                for sp in 0..spans {
                    for h in 0..halves {
                        let mut v = [_mm512_setzero_si512(); 16];
                        for (r, vr) in v.iter_mut().enumerate() {
                            // SAFETY: rowbuf is RS * kcp bytes, A64-aligned, kcp a multiple of
                            // 64, 16h + r < RS and sp * 64 + 64 <= kcp.
                            *vr = unsafe {
                                _mm512_load_si512(s.rowbuf.as_ptr().cast::<u8>().add((16 * h + r) * kcp + 64 * sp).cast())
                            };
                        }
                        let o = transpose16(v);
                        for (j, oj) in o.iter().enumerate() {
                            // SAFETY: wq has 2 * kcp / 4 zmm and 2 * (16 * sp + j) + h <
                            // 2 * 4 * spans <= 2 * kcp / 16.
                            unsafe { _mm512_store_si512(s.wq.as_mut_ptr().add(2 * (16 * sp + j) + h).cast(), *oj) };
                        }
                    }
                }
                // 3. all tokens over the tile
                let k = Tile {
                    wq: s.wq.as_ptr().cast(),
                    fw: s.fw.as_ptr().cast(),
                    fmin: s.fmin.as_ptr().cast(),
                    // SAFETY: sb0 * ats + qoff < arb (a block of row 0 inside acts).
                    acts: unsafe { acts.as_ptr().add(sb0 * ats + qoff) },
                    arb,
                    ats,
                    n_sbc: nsb,
                    // SAFETY (the three adds): offsets within the prep rows of token 0, whose
                    // lengths were asserted above (init / fbs only when read).
                    da: unsafe { p.da.as_ptr().add(sb0) },
                    n_sb,
                    init: if geo.off != 0 { unsafe { p.init.as_ptr().add(sb0 * geo.sb_groups) } } else { p.init.as_ptr() },
                    fbs: if geo.mins != Mins::None { unsafe { p.fbs.as_ptr().add(sb0 * geo.sb_groups) } } else { p.fbs.as_ptr() },
                    n_g,
                    acc: s.acc.as_mut_ptr().cast(),
                    first: sb0 == 0,
                };
                // SAFETY: wq/fw/fmin cover nsb * sb_groups groups of both halves (sized for
                // sbc >= nsb); acts rows t < n_t hold blocks sb0..sb0+nsb; da/init/fbs rows
                // t < n_t hold entries sb0.. / g0.. of this chunk; acc holds n_t * RS f32.
                unsafe {
                    if halves == 2 {
                        dispatch::<2>(ty, &k, n_t);
                    } else {
                        dispatch::<1>(ty, &k, n_t);
                    }
                }
                sb0 += nsb;
            }
            // 4. [n_t][RS] partial sums -> y rows r0..r0+nr (or token-major columns)
            let acc = as_f32_mut(&mut s.acc);
            match tm_ldy {
                None => {
                    for r in 0..nr {
                        let yr = &mut y[(r0 + r) * n_t..(r0 + r + 1) * n_t];
                        for (t, o) in yr.iter_mut().enumerate() {
                            *o = acc[RS * t + r];
                        }
                    }
                }
                Some(ldy) => {
                    for t in 0..n_t {
                        y[t * ldy + r0..t * ldy + r0 + nr].copy_from_slice(&acc[RS * t..RS * t + nr]);
                    }
                }
            }
            r0 += nr;
        }
    }

    fn as_bytes_mut(v: &mut [A64]) -> &mut [u8] {
        // SAFETY: A64 is 64 plain bytes (repr C); the length is 64 bytes per A64.
        unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), v.len() * 64) }
    }

    fn as_f32_mut(v: &mut [A64]) -> &mut [f32] {
        // SAFETY: A64 is 64 plain bytes (repr C, align 64 >= align of f32); every bit pattern is
        // a valid f32; the length is 16 f32 per A64.
        unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<f32>(), v.len() * 16) }
    }
}

//! The AVX2 kernels of `matmat` (no AVX-512: Zen 1-3, Intel client cores), bit for bit their
//! scalar twin (`matmat::scalar`; the arithmetic is in matmat.rs's header).
//!
//! Layout (weight-stationary, as `matmat_avx512.rs`, at half the width): a tile of 16 weight
//! rows and a K-chunk of up to `KC` elements is decoded once (`decode_row`) and interleaved into
//! `wq`: per 4 consecutive elements two ymm (rows 0..8, 8..16), lane r holding those 4 bytes of
//! row r. `vpmaddubsw(wq[k], broadcast(4 activation bytes of token t at k))` then gives each row
//! two i16 pair sums; a group's steps add up in i16 (exact: see `flush`) and one
//! `vpmaddwd(·, 1)` folds them into 8 lanes of i32, one per row, fully reduced: no horizontal
//! sums. The float steps (convert, FMA by the group scale, the min terms, FMA by the activation
//! block scale) then run 8 rows per instruction in the twin's order: the same bits. Tokens go
//! in blocks of `T`, each weight vector loaded once per block.
//!
//! `vpmaddubsw` takes the weights as its unsigned operand (u = q + off, 0..63 for every type
//! but Q8_0, IQ4_NL and IQ4_XS; MXFP4's level + 12 is 0..24) and saturates a pair sum at i16,
//! which at most 2·63·128 never reaches. Q8_0's quants reach 255 and IQ4_NL's table levels + 128
//! reach 241, so those keep the widening kernel (`wide`): both sides to i16, `vpmaddwd`, 8
//! groups reduced together by a transposed `vphaddd` tree, the float chain per (row, token).
//!
//! Why by hand: prefill is ~90% weight x activation products; the twin compiled for AVX2 widens
//! to i32 and multiplies with `vpmulld`, and dequantizing to f32 tiles for an f32 GEMM does 8
//! multiply-adds per instruction where `vpmaddubsw` does 32.

use super::QuantType;
use super::blocks::{KVALUES_IQ4NL, KVALUES_MXFP4, e8m0_half};
use super::matmat::{Geo, MXFP4_OFF, Mins, Prep, act_quants, decode_row, h16, lut_u};
use super::vecdot::{ActType, Q8_1_BYTES};
use std::arch::x86_64::*;
use std::cell::RefCell;

/// K-chunk (elements) decoded at a time: a 16-row tile of `KC` bytes (16 KiB, in L1 beside the
/// activations streaming past it) plus its scales.
const KC: usize = 1024;
/// Rows per weight tile (two ymm of 8 lanes), and the row stride of its scale arrays.
const RS: usize = 16;

/// A 32-byte-aligned block (one ymm), so the tile buffers take aligned loads.
#[derive(Clone, Copy, Default)]
#[repr(C, align(32))]
struct A32([u8; 32]);

/// Per-thread buffers, reused across calls.
#[derive(Default)]
struct Scratch {
    /// One decoded row chunk: unsigned quants, group scales, group mins.
    u: Vec<u8>,
    fwr: Vec<f32>,
    fminr: Vec<f32>,
    /// The interleaved tile: [KC / 4][2] ymm, lane r of half h = 4 bytes of row 8h + r.
    wq: Vec<A32>,
    /// Group scales and mins of the tile, [groups][RS] f32.
    fw: Vec<A32>,
    fmin: Vec<A32>,
    /// [n_t][RS] f32 partial sums across K-chunks.
    acc: Vec<A32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// `matmat::scalar`, bit for bit, on the AVX2 kernels. `false` (nothing written) unless
/// `simd::level()` is `Avx2`, or for the `wide` types (Q8_0, IQ4_NL, IQ4_XS) with `tm_ldy` (the
/// caller goes through its buffer).
/// Lengths were checked by the caller; `rows, n_t > 0`; `geo == geo(ty)`; `p` filled for
/// `acts`. `tm_ldy`: `None` writes y as [rows, n_t]; `Some(ldy)` writes it token-major,
/// y[t·ldy + r].
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
    if crate::simd::level() != crate::simd::Level::Avx2 {
        return false;
    }
    if matches!(ty, QuantType::Q8_0 | QuantType::IQ4NL | QuantType::IQ4XS) {
        if tm_ldy.is_some() {
            return false;
        }
        // SAFETY: level() returned Avx2 after detecting avx2, fma and f16c.
        unsafe { wide(ty, geo, w, rows, cols, acts, n_t, p, y) };
        return true;
    }
    SCRATCH.with(|s| {
        // SAFETY: as above for the features; `tiled` relies on the lengths matmat's `check`
        // verified and asserts the prep vectors' against n_t.
        unsafe { tiled(ty, geo, w, rows, cols, acts, n_t, p, &mut s.borrow_mut(), y, tm_ldy) };
    });
    true
}

/// Everything one token block of the kernel needs about the current tile and chunk.
struct Tile {
    /// [groups of the chunk][CH][2 halves] ymm (half h: rows 8h..8h+8).
    wq: *const __m256i,
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

/// T tokens from `t0` over the whole chunk for 16 rows: the module header's formula, one lane
/// per row. CH = group / 4 steps of 4 elements per group, FL steps per i16 flush (`dispatch`),
/// SBG groups per activation block, OFF: chains start at `init`, MINS: 0 none, 1 per block,
/// 2 per group.
///
/// # Safety
/// AVX2, FMA available; every pointer of `k` covers the extents documented on `Tile` for
/// `n_sbc` blocks and tokens `t0..t0 + T`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const T: usize, const CH: usize, const FL: usize, const SBG: usize, const OFF: bool, const MINS: u8>(
    k: &Tile,
    t0: usize,
) {
    // SAFETY (whole body): every offset below stays inside the extents the caller guarantees
    // (see `tiled`); wq/fw/fmin/acc are A32 buffers (32-byte aligned, whole ymm each), the
    // activation loads are unaligned reads of 4 bytes.
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let mut ap = [k.acts; T];
        let (mut dp, mut ip, mut fp) = ([k.da; T], [k.init; T], [k.fbs; T]);
        for t in 0..T {
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
            let mut temp = [[_mm256_setzero_ps(); 2]; T];
            let mut fmv = [_mm256_setzero_ps(); 2];
            for j in 0..SBG {
                let mut isum = [[_mm256_setzero_si256(); 2]; T];
                if OFF {
                    for (s, p) in isum.iter_mut().zip(&ip) {
                        *s = [_mm256_set1_epi32(*p.add(gi)); 2];
                    }
                }
                let mut c0 = 0;
                while c0 < CH {
                    // T x 2 independent i16 chains, interleaved
                    let mut h16 = [[_mm256_setzero_si256(); 2]; T];
                    for c in c0..c0 + FL.min(CH) {
                        let w0 = _mm256_load_si256(wp.add(2 * c));
                        let w1 = _mm256_load_si256(wp.add(2 * c + 1));
                        for t in 0..T {
                            let a = ap[t].add(sb * k.ats + j * 4 * CH + 4 * c).cast::<i32>().read_unaligned();
                            let a = _mm256_set1_epi32(a);
                            h16[t][0] = _mm256_add_epi16(h16[t][0], _mm256_maddubs_epi16(w0, a));
                            h16[t][1] = _mm256_add_epi16(h16[t][1], _mm256_maddubs_epi16(w1, a));
                        }
                    }
                    for t in 0..T {
                        for h in 0..2 {
                            isum[t][h] = _mm256_add_epi32(isum[t][h], _mm256_madd_epi16(h16[t][h], ones));
                        }
                    }
                    c0 += FL.min(CH);
                }
                let fwv = [_mm256_load_ps(fwp), _mm256_load_ps(fwp.add(8))];
                if MINS != 0 {
                    fmv = [_mm256_load_ps(fmp), _mm256_load_ps(fmp.add(8))];
                }
                for t in 0..T {
                    let fb = if MINS == 2 { _mm256_set1_ps(*fp[t].add(gi)) } else { _mm256_setzero_ps() };
                    for h in 0..2 {
                        temp[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t][h]), fwv[h], temp[t][h]);
                        if MINS == 2 {
                            temp[t][h] = _mm256_fmadd_ps(fmv[h], fb, temp[t][h]);
                        }
                    }
                }
                wp = wp.add(2 * CH);
                fwp = fwp.add(RS);
                fmp = fmp.add(RS);
                gi += 1;
            }
            for t in 0..T {
                let d = _mm256_set1_ps(*dp[t].add(sb));
                // one group per block when MINS == 1: gi - 1 is this block's
                let s = if MINS == 1 { _mm256_set1_ps(*fp[t].add(gi - 1)) } else { _mm256_setzero_ps() };
                let a = k.acc.add(RS * (t0 + t));
                for h in 0..2 {
                    let mut f = if k.first && sb == 0 { _mm256_setzero_ps() } else { _mm256_load_ps(a.add(8 * h)) };
                    f = _mm256_fmadd_ps(temp[t][h], d, f);
                    if MINS == 1 {
                        f = _mm256_fmadd_ps(fmv[h], s, f);
                    }
                    _mm256_store_ps(a.add(8 * h), f);
                }
            }
        }
    }
}

/// The kernel for one type class over all `n_t` tokens: blocks of TM tokens, then the tail.
///
/// # Safety
/// As `tile`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tiles<const TM: usize, const CH: usize, const FL: usize, const SBG: usize, const OFF: bool, const MINS: u8>(
    k: &Tile,
    n_t: usize,
) {
    let mut t0 = 0;
    // SAFETY: forwarded; every call covers tokens t0..t0 + T <= n_t.
    unsafe {
        while t0 + TM <= n_t {
            tile::<TM, CH, FL, SBG, OFF, MINS>(k, t0);
            t0 += TM;
        }
        while t0 < n_t {
            tile::<1, CH, FL, SBG, OFF, MINS>(k, t0);
            t0 += 1;
        }
    }
}

/// `tiles` for the type class of `ty`. FL, the 4-element steps whose `vpmaddubsw` pair sums
/// add up in i16 before one `vpmaddwd` folds them to i32: a pair sum is at most 2·umax·128 in
/// magnitude (umax the largest unsigned quant, 128 the largest activation magnitude, Q8_K's
/// -128), and FL · 2·umax·128 must stay within i16: 4 bits 8 · 3840, 5 bits 4 · 7936, 6 bits
/// 2 · 16128; Q2_K/Q3_K's 2-3 bits fit a whole group of 16.
///
/// # Safety
/// As `tile`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dispatch(ty: QuantType, k: &Tile, n_t: usize) {
    // SAFETY: forwarded.
    unsafe {
        match ty {
            QuantType::Q4_1 => tiles::<3, 8, 8, 1, false, 1>(k, n_t),
            QuantType::Q5_1 => tiles::<3, 8, 4, 1, false, 1>(k, n_t),
            QuantType::Q4K => tiles::<3, 8, 8, 8, false, 2>(k, n_t),
            QuantType::Q5K => tiles::<3, 8, 4, 8, false, 2>(k, n_t),
            QuantType::Q2K => tiles::<3, 4, 4, 16, false, 2>(k, n_t),
            QuantType::Q3K => tiles::<3, 4, 4, 16, true, 0>(k, n_t),
            QuantType::Q6K => tiles::<3, 4, 2, 16, true, 0>(k, n_t),
            // grid types: u up to 126 (7 bits), one pair per i16: 1 · 2 · 126 · 128 = 32256
            QuantType::IQ2XXS | QuantType::IQ2XS | QuantType::IQ2S | QuantType::IQ3XXS | QuantType::IQ3S => {
                tiles::<3, 4, 1, 16, true, 0>(k, n_t)
            }
            QuantType::Q4_0 => tiles::<3, 8, 8, 1, true, 0>(k, n_t),
            QuantType::Q5_0 => tiles::<3, 8, 4, 1, true, 0>(k, n_t),
            QuantType::MXFP4 => tiles::<3, 8, 4, 1, true, 0>(k, n_t), // u 0..24: 4 · 6144
            _ => unreachable!("matmat_avx2::dispatch({ty}): Q8_0, IQ4_NL and IQ4_XS run `wide`"),
        }
    }
}

/// The whole product: tiles of 16 rows, K-chunks of at most `KC` elements (whole activation
/// blocks), blocks of tokens.
///
/// # Safety
/// AVX2, FMA and F16C available. `w`, `acts`, `y` have the lengths `matmat::check` demands for
/// (ty, rows, cols, n_t), `rows, n_t > 0`, `geo == geo(ty)`, `ty` not a `wide` type, and `p` was filled
/// for these activations (`Prep::fill`).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tiled(
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
    let kc = sbc * sb_el; // elements per chunk (at most)
    let gpc = sbc * geo.sb_groups; // groups per chunk (at most)
    s.u.resize(kc, 0);
    s.fwr.resize(gpc, 0.0);
    s.fminr.resize(gpc, 0.0);
    s.wq.resize(2 * kc / 4, A32::default());
    s.fw.resize(gpc * RS / 8, A32::default());
    s.fmin.resize(gpc * RS / 8, A32::default());
    s.acc.resize(n_t * RS / 8, A32::default());
    let mut r0 = 0;
    while r0 < rows {
        let nr = (rows - r0).min(RS);
        let mut sb0 = 0;
        while sb0 < n_sb {
            let nsb = sbc.min(n_sb - sb0);
            let (ne, ng) = (nsb * sb_el, nsb * geo.sb_groups);
            // 1. decode each row's blocks sb0..sb0+nsb and interleave them into the tile; rows
            // nr..RS keep stale bytes and scales: their lanes are never written out, and lanes
            // do not mix
            {
                let wq = as_bytes_mut(&mut s.wq);
                let (fw, fmin) = (as_f32_mut(&mut s.fw), as_f32_mut(&mut s.fmin));
                for r in 0..nr {
                    let wr = &w[(r0 + r) * rb + sb0 * wsb..(r0 + r) * rb + (sb0 + nsb) * wsb];
                    decode_row_avx2(ty, wr, &mut s.u[..ne], &mut s.fwr[..ng], &mut s.fminr[..ng]);
                    let lane = 32 * (r / 8) + 4 * (r % 8);
                    for (st, q) in s.u[..ne].chunks_exact(4).enumerate() {
                        wq[64 * st + lane..64 * st + lane + 4].copy_from_slice(q);
                    }
                    for g in 0..ng {
                        fw[g * RS + r] = s.fwr[g];
                        if geo.mins != Mins::None {
                            fmin[g * RS + r] = s.fminr[g];
                        }
                    }
                }
            }
            // 2. all tokens over the tile
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
            // sbc >= nsb); acts rows t < n_t hold blocks sb0..sb0+nsb; da/init/fbs rows t < n_t
            // hold entries sb0.. / g0.. of this chunk; acc holds n_t * RS f32.
            unsafe { dispatch(ty, &k, n_t) };
            sb0 += nsb;
        }
        // 3. [n_t][RS] partial sums -> y rows r0..r0+nr (or token-major columns)
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

/// `decode_row` compiled for AVX2 (its loops vectorize to 32-byte runs), and for IQ4_NL /
/// MXFP4 `decode_lut`: their table lookups stay scalar byte loads in `decode_row`, which made
/// the tile's decoding MXFP4's bound at few tokens (8 tokens, 768x2048: 14 G MAC/s, 1.1x the
/// f32 path, against Q5_0's 21).
#[target_feature(enable = "avx2,fma,f16c")]
fn decode_row_avx2(ty: QuantType, row: &[u8], u: &mut [u8], fw: &mut [f32], fmin: &mut [f32]) {
    match ty {
        QuantType::IQ4NL => decode_lut::<false>(row, u, fw),
        QuantType::MXFP4 => decode_lut::<true>(row, u, fw),
        _ => decode_row(ty, row, u, fw, fmin),
    }
}

/// `decode_row` for IQ4_NL (MX = false: 18-byte blocks, f16 scale) and MXFP4 (MX = true:
/// 17-byte blocks, E8M0 scale): the nibbles as Q4_0's, each looked up by `vpshufb` in the table
/// of level + off (`lut_u`); the same bytes and scales.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn decode_lut<const MX: bool>(row: &[u8], u: &mut [u8], fw: &mut [f32]) {
    let ts = if MX { 17 } else { 18 };
    let lut = if MX { lut_u(&KVALUES_MXFP4, MXFP4_OFF) } else { lut_u(&KVALUES_IQ4NL, 128) };
    // SAFETY: `lut` is 16 readable bytes.
    let lut = unsafe { _mm_loadu_si128(lut.as_ptr().cast()) };
    let m4 = _mm_set1_epi8(0x0F);
    for ((b, o), f) in row.chunks_exact(ts).zip(u.chunks_exact_mut(32)).zip(fw.iter_mut()) {
        let qs = &b[ts - 16..];
        // SAFETY: `qs` is 16 readable bytes.
        let p = unsafe { _mm_loadu_si128(qs.as_ptr().cast()) };
        let lo = _mm_shuffle_epi8(lut, _mm_and_si128(p, m4));
        let hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16::<4>(p), m4));
        // SAFETY: `o` is 32 writable bytes; storeu has no alignment requirement.
        unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), _mm256_set_m128i(hi, lo)) };
        *f = if MX { e8m0_half(b[0]) } else { h16([b[0], b[1]]) };
    }
}

fn as_bytes_mut(v: &mut [A32]) -> &mut [u8] {
    // SAFETY: A32 is 32 plain bytes (repr C); the length is 32 bytes per A32.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), v.len() * 32) }
}

fn as_f32_mut(v: &mut [A32]) -> &mut [f32] {
    // SAFETY: A32 is 32 plain bytes (repr C, align 32 >= align of f32); every bit pattern is a
    // valid f32; the length is 8 f32 per A32.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<f32>(), v.len() * 8) }
}

/// `matmat::scalar` for Q8_0, IQ4_NL and IQ4_XS (same contract): group sums widened to i16,
/// `vpmaddwd`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
fn wide(ty: QuantType, geo: &Geo, w: &[u8], rows: usize, cols: usize, acts: &[u8], n_t: usize, p: &Prep, y: &mut [f32]) {
    let (g_el, n_g, n_sb) = (geo.group, cols / geo.group, cols / geo.sb());
    let (rb, ab) = (w.len() / rows, acts.len() / n_t);
    // every token's quants: [n_t][cols] as i16
    let mut a8 = vec![0i8; n_t * cols];
    for (o, row) in a8.chunks_exact_mut(cols).zip(acts.chunks_exact(ab)) {
        act_quants(geo.act, row, o);
    }
    let a16: Vec<i16> = a8.iter().map(|&s| s as i16).collect();
    let (mut u, mut fw, mut fmin) = (vec![0u8; cols], vec![0f32; n_g], vec![0f32; n_g]);
    let mut u16s = vec![0i16; cols];
    let ld = n_g.div_ceil(8) * 8;
    let mut isum = vec![0i32; 4 * ld];
    for (r, yr) in y.chunks_exact_mut(n_t).enumerate() {
        decode_row(ty, &w[r * rb..(r + 1) * rb], &mut u, &mut fw, &mut fmin);
        for (d, &s) in u16s.iter_mut().zip(&u) {
            *d = s as i16;
        }
        // Four tokens at a time: their float chains are independent, so they overlap (one
        // chain alone waits on each FMA's latency). A short last step repeats its last token.
        let mut t0 = 0;
        while t0 < n_t {
            let nt = (n_t - t0).min(4);
            let ts = [t0, t0 + 1.min(nt - 1), t0 + 2.min(nt - 1), t0 + 3.min(nt - 1)];
            for (k, &t) in ts.iter().enumerate() {
                group_sums(&u16s, &a16[t * cols..(t + 1) * cols], g_el, &mut isum[k * ld..(k + 1) * ld]);
            }
            let mut acc = [0f32; 4];
            for sb in 0..n_sb {
                let mut temp = [0f32; 4];
                let mut last_g = 0;
                for j in 0..geo.sb_groups {
                    let g = sb * geo.sb_groups + j;
                    for k in 0..4 {
                        let t = ts[k];
                        let i = if geo.off != 0 { p.init[t * n_g + g] } else { 0 } + isum[k * ld + g];
                        temp[k] = (i as f32).mul_add(fw[g], temp[k]);
                        if geo.mins == Mins::Group {
                            temp[k] = fmin[g].mul_add(p.fbs[t * n_g + g], temp[k]);
                        }
                    }
                    last_g = g;
                }
                for k in 0..4 {
                    let t = ts[k];
                    acc[k] = temp[k].mul_add(p.da[t * n_sb + sb], acc[k]);
                    if geo.mins == Mins::Block {
                        acc[k] = fmin[last_g].mul_add(p.fbs[t * n_g + last_g], acc[k]);
                    }
                }
            }
            yr[t0..t0 + nt].copy_from_slice(&acc[..nt]);
            t0 += nt;
        }
    }
}

/// Σ_g u·a of every group of `g_el` (16 or 32) elements into `out` (room for whole batches of
/// 8 groups; the spare entries get 0).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn group_sums(u: &[i16], a: &[i16], g_el: usize, out: &mut [i32]) {
    let n_g = u.len() / g_el;
    let mut g0 = 0;
    while g0 < n_g {
        let mut v = [_mm256_setzero_si256(); 8];
        for (k, vk) in v.iter_mut().enumerate().take((n_g - g0).min(8)) {
            let e = (g0 + k) * g_el;
            *vk = madd16(&u[e..e + 16], &a[e..e + 16]);
            if g_el == 32 {
                *vk = _mm256_add_epi32(*vk, madd16(&u[e + 16..e + 32], &a[e + 16..e + 32]));
            }
        }
        let s = reduce8(v);
        let o = &mut out[g0..g0 + 8];
        // SAFETY: o holds 8 i32.
        unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), s) };
        g0 += 8;
    }
}

/// Pairwise products of 16 i16 summed into 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn madd16(u: &[i16], a: &[i16]) -> __m256i {
    let (u, a) = (&u[..16], &a[..16]);
    // SAFETY: u and a are 16 readable i16 each.
    unsafe { _mm256_madd_epi16(_mm256_loadu_si256(u.as_ptr().cast()), _mm256_loadu_si256(a.as_ptr().cast())) }
}

/// Lane k = the sum of v[k]'s 8 lanes (exact integer sums).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn reduce8(v: [__m256i; 8]) -> __m256i {
    // Per 128-bit half: lane k of h0123 holds v[k]'s half sum (k < 4), likewise h4567.
    let h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    let h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    let r0123 = _mm_add_epi32(_mm256_castsi256_si128(h0123), _mm256_extracti128_si256::<1>(h0123));
    let r4567 = _mm_add_epi32(_mm256_castsi256_si128(h4567), _mm256_extracti128_si256::<1>(h4567));
    _mm256_set_m128i(r4567, r0123)
}

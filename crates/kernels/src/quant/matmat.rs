//! Quantized-weight x 8-bit-activation matrix-matrix products for prefill:
//! `y[r, t] = Σ_k W[r, k] · x̃[t, k]` with x̃ the activation rows quantized by
//! `quantize_act(act_type(ty), ..)`.
//!
//! Owns: `matmat_q` (the public entry, SIMD chosen at run time), `matmat_q_scalar` (its scalar
//! twin, the reference forever), `MatmatActs` + `matmat_q_prepared` (the same with the
//! activation side prepared once per matmul), `matmat_supported`, and the pieces both twins
//! share: `Geo` (how a weight type splits into integer quants and float scales), `decode_row`
//! (one weight row to unsigned bytes + per-group scales) and `Prep` (the per-token activation
//! scalars). The AVX-512 VNNI kernels live in `matmat_avx512.rs`, with their figures: 2.5-6x
//! the dequantize + f32 GEMM path single-threaded, ~3-6x with `MatmatActs`; the AVX2 ones
//! (`vpmaddubsw`, no VNNI) in `matmat_avx2.rs`: 1.7-4x that path (`matmat_bench 256 1536
//! {64,2048}`, AMD EPYC Zen 4 under `CORTIQ_SIMD=avx2`: Q4_K 79 / 95, Q6_K 50 / 83, Q5_0
//! 79 / 98, Q4_1 81 / 101 G MAC/s against 25-33 for the f32 path; Q8_0 12, so the engine keeps
//! the f32 path for it there).
//!
//! Why hand-written: prefill is ~90% weight x activation products. Dequantizing weights to f32
//! and running an f32 GEMM does 16 multiply-adds per instruction; multiplying the 8-bit
//! activations by the weights' integer quants does 64 (`vpdpbusd`), which is how llama.cpp's
//! prefill is 2x ours on the same machine.
//!
//! The arithmetic (identical in both twins, so they agree bit for bit): every weight type is
//! seen as groups of G = 16 or 32 elements with unsigned byte quants u (0..255), an f32 group
//! scale `fw` and, for types with a min, an f32 group min `fmin`, such that the weight is
//! `fw * (u - off) + fmin` (per type constant `off`; the k-quants' `fmin` is already the scaled
//! `-dmin * m`). The lookup-table types (IQ4_NL, IQ4_XS, MXFP4) fit the same form with u = the
//! nibble's integer table level + `off` (`lut_u`) and `fw` the block's f16, IQ4_XS's
//! `d * (ls - 32)`, or MXFP4's E8M0 power of two; the grid types (IQ2_XXS, IQ2_XS, IQ2_S,
//! IQ3_XXS, IQ3_S) with u = ±grid magnitude + 64 and `fw` = `d * (2s + 1) * FACTOR` per 16. Activations come in blocks of one scale `da` (32 elements for Q8_0/Q8_1, 256
//! for Q8_K), i.e. `sb_groups` weight groups share one `da`. Per (row, token):
//!
//! ```text
//! acc = 0
//! for each activation block:
//!     temp = 0
//!     for each group g in it:
//!         isum = -off * Σ_g a  +  Σ_g u * a            (exact i32: vpdpbusd)
//!         temp = fma(f32(isum), fw[g], temp)
//!         if min per group (k-quants):  temp = fma(fmin[g], Σ_g a, temp)
//!     acc = fma(temp, da, acc)
//!     if min per block (Q4_1/Q5_1):     acc = fma(fmin, s, acc)      (s: Q8_1's stored d*Σa)
//! ```
//!
//! The float order is ours (llama.cpp's kernels each use their own); results agree with
//! `vec_dot_scalar` to a few f32 ulps of Σ|w·x| (tests/matmat.rs prints the figures per type).
//! The group integer sums are exact, and every `fw`/`fmin` is an exact product (f16 times a
//! small integer, or a power of two), so only the FMA chain rounds.

use super::QuantType;
use super::blocks::*;
use super::vecdot::{ActType, Q8_1_BYTES, act_type, vec_dot};

/// Where a type's min term enters (see the module header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mins {
    /// No min term (symmetric types).
    None,
    /// Once per activation block, `fmin * s` with Q8_1's stored `s` (Q4_1, Q5_1).
    Block,
    /// Per group, `fmin[g] * Σ_g a` inside the block's temp (Q2_K, Q4_K, Q5_K).
    Group,
}

/// How a weight type maps onto the integer kernel.
#[derive(Clone, Copy, Debug)]
pub(super) struct Geo {
    pub act: ActType,
    /// Elements per weight scale group (16 or 32).
    pub group: usize,
    /// Weight groups per activation block (one `da`).
    pub sb_groups: usize,
    /// Quant offset: the signed quant is `u - off`.
    pub off: i32,
    pub mins: Mins,
}

impl Geo {
    /// Elements per activation block.
    pub fn sb(&self) -> usize {
        self.group * self.sb_groups
    }
}

/// The kernel geometry of `ty`, or `None` for types without one.
pub(super) fn geo(ty: QuantType) -> Option<Geo> {
    let g = |act, group, sb_groups, off, mins| Some(Geo { act, group, sb_groups, off, mins });
    match ty {
        QuantType::Q4_0 => g(ActType::Q8_0, 32, 1, 8, Mins::None),
        QuantType::Q5_0 => g(ActType::Q8_0, 32, 1, 16, Mins::None),
        QuantType::Q8_0 => g(ActType::Q8_0, 32, 1, 128, Mins::None),
        QuantType::Q4_1 | QuantType::Q5_1 => g(ActType::Q8_1, 32, 1, 0, Mins::Block),
        QuantType::Q4K | QuantType::Q5K => g(ActType::Q8K, 32, 8, 0, Mins::Group),
        QuantType::Q2K => g(ActType::Q8K, 16, 16, 0, Mins::Group),
        QuantType::Q3K => g(ActType::Q8K, 16, 16, 4, Mins::None),
        QuantType::Q6K => g(ActType::Q8K, 16, 16, 32, Mins::None),
        // lookup-table types: u = level + off, the levels' range shifted to start at >= 0
        QuantType::IQ4NL => g(ActType::Q8_0, 32, 1, 128, Mins::None),
        QuantType::IQ4XS => g(ActType::Q8K, 32, 8, 128, Mins::None),
        QuantType::MXFP4 => g(ActType::Q8_0, 32, 1, MXFP4_OFF, Mins::None),
        // grid types: u = ±magnitude + 64 (magnitudes <= 62), one scale per 16 elements
        QuantType::IQ2XXS | QuantType::IQ2XS | QuantType::IQ2S | QuantType::IQ3XXS | QuantType::IQ3S => {
            g(ActType::Q8K, 16, 16, IQ_GRID_OFF, Mins::None)
        }
        _ => None,
    }
}

/// The grid types' quant offset: their signed magnitudes are -62..62, so u = q + 64 stays in
/// 2..126 (7 bits: one `vpmaddubsw` pair per i16 on AVX2, 2 · 126 · 128 < 2^15).
pub(super) const IQ_GRID_OFF: i32 = 64;

/// MXFP4's quant offset: its levels are -12..12, so u = level + 12 stays in 0..24 (5 bits,
/// which `matmat_avx2`'s `vpmaddubsw` takes; IQ4_NL's -127..113 need 128).
pub(super) const MXFP4_OFF: i32 = 12;

/// The 16 levels of a lookup-table type plus `off`, as the unsigned quants of `decode_row`.
pub(super) fn lut_u(levels: &[i8; 16], off: i32) -> [u8; 16] {
    levels.map(|l| (l as i32 + off) as u8)
}

/// Whether `matmat_q` has an integer matrix kernel for `ty` (else it still works, one
/// `vec_dot` per (row, token), as long as `ty` has an activation format).
pub fn matmat_supported(ty: QuantType) -> bool {
    geo(ty).is_some()
}

/// `y[r * n_t + t] = Σ_k W[r, k] · x̃[t, k]` for `rows` weight rows of type `ty` stored back to
/// back (`w.len() == rows * ty.row_bytes(cols)`) and `n_t` activation rows quantized by
/// `quantize_act(act_type(ty), ..)` stored back to back (`acts.len() == n_t *
/// act.row_bytes(cols)`). y: [rows, n_t].
///
/// Single-threaded: the engine splits row ranges over its pool and calls this per range. Runs
/// the AVX-512 VNNI kernels when the CPU has them, else the AVX2 ones (per `CORTIQ_SIMD`); the
/// result is bit-identical to `matmat_q_scalar` either way. Panics on a type without an activation
/// format or on wrong lengths (caller bugs: the engine validates shapes at load time).
///
/// Each call first reads every activation row once for its per-block scalars (`MatmatActs`);
/// with 32-row ranges that is ~1/5 of the time for the 32-element types (Q8_0 and friends).
/// A caller with many ranges over the same activations should build one `MatmatActs` and call
/// `matmat_q_prepared` per range instead.
#[track_caller]
pub fn matmat_q(ty: QuantType, w: &[u8], rows: usize, cols: usize, acts: &[u8], n_t: usize, y: &mut [f32]) {
    check("matmat_q", ty, w, rows, cols, acts, n_t, y);
    if rows == 0 || n_t == 0 {
        return;
    }
    let Some(geo) = geo(ty) else {
        fallback(ty, w, rows, cols, acts, n_t, y, vec_dot);
        return;
    };
    PREP.with(|p| {
        let mut p = p.borrow_mut();
        let simd = super::matmat_avx512::available();
        p.fill(&geo, acts, cols, n_t, simd);
        run(ty, &geo, w, rows, cols, acts, n_t, &p, y, simd);
    });
}

/// The scalar twin of `matmat_q` (same contract, same bits): plain loops over (row, token).
#[track_caller]
pub fn matmat_q_scalar(ty: QuantType, w: &[u8], rows: usize, cols: usize, acts: &[u8], n_t: usize, y: &mut [f32]) {
    check("matmat_q_scalar", ty, w, rows, cols, acts, n_t, y);
    if rows == 0 || n_t == 0 {
        return;
    }
    let Some(geo) = geo(ty) else {
        fallback(ty, w, rows, cols, acts, n_t, y, super::vecdot::vec_dot_scalar);
        return;
    };
    let mut p = Prep::default();
    p.fill(&geo, acts, cols, n_t, false);
    scalar(ty, &geo, w, rows, cols, acts, n_t, &p, y);
}

/// Activation rows prepared once for any number of `matmat_q_prepared` calls: the rows
/// themselves (borrowed) and their per-block scalars. Build one per matmul and share it across
/// the pool's row ranges (it is `Sync`); that saves `matmat_q`'s per-call pass over them.
pub struct MatmatActs<'a> {
    ty: QuantType,
    acts: &'a [u8],
    cols: usize,
    n_t: usize,
    prep: Prep,
}

impl<'a> MatmatActs<'a> {
    /// `n_t` rows of `cols` elements quantized by `quantize_act(act_type(ty), ..)`, back to
    /// back. Panics on a type without an activation format or on a wrong length (caller bugs).
    #[track_caller]
    pub fn new(ty: QuantType, acts: &'a [u8], cols: usize, n_t: usize) -> Self {
        let Some(at) = act_type(ty) else {
            panic!("MatmatActs::new({ty}): no quantized-activation dot product for this type");
        };
        let ab = at.row_bytes(cols);
        assert!(
            ab.and_then(|b| b.checked_mul(n_t)) == Some(acts.len()),
            "MatmatActs::new({ty}): {n_t} rows of {cols} columns need {:?} {at} bytes, got {}",
            ab.map(|b| b * n_t),
            acts.len()
        );
        let mut prep = Prep::default();
        if let Some(geo) = geo(ty)
            && n_t > 0
        {
            prep.fill(&geo, acts, cols, n_t, super::matmat_avx512::available());
        }
        MatmatActs { ty, acts, cols, n_t, prep }
    }

    /// Activation rows held.
    pub fn n_t(&self) -> usize {
        self.n_t
    }

    /// Columns per row.
    pub fn cols(&self) -> usize {
        self.cols
    }
}

/// `matmat_q` over activations prepared by `MatmatActs::new` (same `ty`); y: [rows, n_t].
/// Same results, bit for bit.
#[track_caller]
pub fn matmat_q_prepared(ty: QuantType, w: &[u8], rows: usize, acts: &MatmatActs, y: &mut [f32]) {
    assert!(ty == acts.ty, "matmat_q_prepared({ty}): activations were prepared for {}", acts.ty);
    let (cols, n_t) = (acts.cols, acts.n_t);
    check("matmat_q_prepared", ty, w, rows, cols, acts.acts, n_t, y);
    if rows == 0 || n_t == 0 {
        return;
    }
    let Some(geo) = geo(ty) else {
        fallback(ty, w, rows, cols, acts.acts, n_t, y, vec_dot);
        return;
    };
    run(ty, &geo, w, rows, cols, acts.acts, n_t, &acts.prep, y, super::matmat_avx512::available());
}

/// As `matmat_q_prepared`, writing token-major: `y[t * ldy + r]` (y: [n_t, ldy], ldy >= rows),
/// the layout the next op reads, so a caller splitting *tokens* over threads needs no
/// transpose. Computed 32 rows at a time into a per-thread [32, n_t] buffer (the kernel's own
/// row tile), then scattered: 32 contiguous floats per token. Same values, bit for bit.
#[track_caller]
pub fn matmat_q_prepared_tm(ty: QuantType, w: &[u8], rows: usize, acts: &MatmatActs, y: &mut [f32], ldy: usize) {
    let n_t = acts.n_t;
    let rb = ty.row_bytes(acts.cols);
    assert!(
        rb.and_then(|b| b.checked_mul(rows)) == Some(w.len()),
        "matmat_q_prepared_tm({ty}): {rows} rows of {} columns need {:?} weight bytes, got {}",
        acts.cols,
        rb.map(|b| b * rows),
        w.len()
    );
    assert!(
        ldy >= rows && (n_t == 0 || y.len() >= (n_t - 1) * ldy + rows),
        "matmat_q_prepared_tm({ty}): y of {} values cannot hold {n_t} rows of stride {ldy} >= {rows}",
        y.len()
    );
    let rb = rb.unwrap_or(0);
    // The SIMD kernel writes token-major directly; the scalar twin goes through a buffer.
    if let Some(geo) = geo(ty)
        && n_t > 0
        && rows > 0
        && (super::matmat_avx512::matmat(ty, &geo, w, rows, acts.cols, acts.acts, n_t, &acts.prep, y, Some(ldy))
            || avx2_tm(ty, &geo, w, rows, acts, y, ldy))
    {
        return;
    }
    TM_BUF.with(|b| {
        let mut buf = b.borrow_mut();
        let mut r0 = 0;
        while r0 < rows {
            let nr = (rows - r0).min(32);
            buf.resize(nr * n_t, 0.0);
            matmat_q_prepared(ty, &w[r0 * rb..(r0 + nr) * rb], nr, acts, &mut buf[..nr * n_t]);
            for t in 0..n_t {
                let yt = &mut y[t * ldy + r0..t * ldy + r0 + nr];
                for (r, o) in yt.iter_mut().enumerate() {
                    *o = buf[r * n_t + t];
                }
            }
            r0 += nr;
        }
    });
}

/// The AVX2 kernel writing token-major (`matmat_avx2::matmat`; false where it does not run).
fn avx2_tm(ty: QuantType, geo: &Geo, w: &[u8], rows: usize, acts: &MatmatActs, y: &mut [f32], ldy: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    return super::matmat_avx2::matmat(ty, geo, w, rows, acts.cols, acts.acts, acts.n_t, &acts.prep, y, Some(ldy));
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (ty, geo, w, rows, acts, y, ldy);
        false
    }
}

thread_local! {
    static TM_BUF: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The SIMD kernel when `simd`, else the scalar twin. Lengths checked, `rows, n_t > 0`, `p`
/// filled for `acts`.
#[allow(clippy::too_many_arguments)]
fn run(
    ty: QuantType,
    geo: &Geo,
    w: &[u8],
    rows: usize,
    cols: usize,
    acts: &[u8],
    n_t: usize,
    p: &Prep,
    y: &mut [f32],
    simd: bool,
) {
    if simd && super::matmat_avx512::matmat(ty, geo, w, rows, cols, acts, n_t, p, y, None) {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if super::matmat_avx2::matmat(ty, geo, w, rows, cols, acts, n_t, p, y, None) {
        return;
    }
    scalar(ty, geo, w, rows, cols, acts, n_t, p, y);
}

/// Types without a kernel: one dot product per (row, token).
#[allow(clippy::too_many_arguments)]
fn fallback(
    ty: QuantType,
    w: &[u8],
    rows: usize,
    cols: usize,
    acts: &[u8],
    n_t: usize,
    y: &mut [f32],
    dot: fn(QuantType, &[u8], &[u8], usize) -> f32,
) {
    let (rb, ab) = (w.len() / rows, acts.len() / n_t);
    for (yr, wr) in y.chunks_exact_mut(n_t).zip(w.chunks_exact(rb)) {
        for (o, a) in yr.iter_mut().zip(acts.chunks_exact(ab)) {
            *o = dot(ty, wr, a, cols);
        }
    }
}

#[allow(clippy::too_many_arguments)]
#[track_caller]
fn check(func: &str, ty: QuantType, w: &[u8], rows: usize, cols: usize, acts: &[u8], n_t: usize, y: &[f32]) {
    let Some(at) = act_type(ty) else {
        panic!("{func}({ty}): no quantized-activation dot product for this type");
    };
    let (wb, ab) = (ty.row_bytes(cols), at.row_bytes(cols));
    assert!(
        wb.and_then(|b| b.checked_mul(rows)) == Some(w.len())
            && ab.and_then(|b| b.checked_mul(n_t)) == Some(acts.len())
            && rows.checked_mul(n_t) == Some(y.len()),
        "{func}({ty}): {rows} rows x {n_t} tokens x {cols} columns need {:?} weight bytes, {:?} {at} bytes and {} outputs; \
         got {}, {} and {}",
        wb.map(|b| b * rows),
        ab.map(|b| b * n_t),
        rows * n_t,
        w.len(),
        acts.len(),
        y.len()
    );
}

/// Little-endian IEEE half -> f32, exact (software: no per-call feature detection).
#[inline(always)]
pub(super) fn h16(b: [u8; 2]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes(b)).to_f32_const()
}

// ---------------------------------------------------------------- activation side

/// Per-token activation scalars, [token][block] and [token][group] (token-major: one token's
/// values are contiguous, filled by one sequential pass over its row).
#[derive(Default)]
pub(super) struct Prep {
    /// Activation block scales, [n_t][n_sb].
    pub da: Vec<f32>,
    /// `-off * Σ_g a` per group, [n_t][n_groups] (empty when off == 0).
    pub init: Vec<i32>,
    /// Per-group `Σ_g a` as f32 (Mins::Group) or per-block `s` (Mins::Block), [n_t][n_groups].
    pub fbs: Vec<f32>,
}

thread_local! {
    /// Reused across calls: the engine calls once per row range and token batch.
    pub(super) static PREP: std::cell::RefCell<Prep> = std::cell::RefCell::new(Prep::default());
}

impl Prep {
    /// Fill from `n_t > 0` activation rows of `cols` elements (lengths already checked),
    /// reusing the vectors' capacity. `simd`: let `matmat_avx512` do it (same values).
    pub fn fill(&mut self, geo: &Geo, acts: &[u8], cols: usize, n_t: usize, simd: bool) {
        let (n_sb, n_g) = (cols / geo.sb(), cols / geo.group);
        self.da.resize(n_t * n_sb, 0.0);
        self.init.resize(if geo.off != 0 { n_t * n_g } else { 0 }, 0);
        self.fbs.resize(if geo.mins != Mins::None { n_t * n_g } else { 0 }, 0.0);
        if simd && super::matmat_avx512::prep(geo, acts, n_t, n_sb, self) {
            return;
        }
        let ab = acts.len() / n_t;
        for t in 0..n_t {
            let row = &acts[t * ab..(t + 1) * ab];
            let da = &mut self.da[t * n_sb..(t + 1) * n_sb];
            let init = if geo.off != 0 { &mut self.init[t * n_g..(t + 1) * n_g] } else { &mut [][..] };
            let fbs = if geo.mins != Mins::None { &mut self.fbs[t * n_g..(t + 1) * n_g] } else { &mut [][..] };
            match geo.act {
                ActType::Q8_0 => {
                    for (b, blk) in view::<BlockQ8_0>(row).iter().enumerate() {
                        da[b] = h16(blk.d);
                        if geo.off != 0 {
                            init[b] = -geo.off * blk.qs.iter().map(|&q| q as i32).sum::<i32>();
                        }
                    }
                }
                ActType::Q8_1 => {
                    for (b, blk) in row.chunks_exact(Q8_1_BYTES).enumerate() {
                        da[b] = h16([blk[0], blk[1]]);
                        fbs[b] = h16([blk[2], blk[3]]);
                    }
                }
                ActType::Q8K => {
                    let per = geo.group / 16; // bsums per group
                    for (sb, blk) in view::<BlockQ8K>(row).iter().enumerate() {
                        da[sb] = f32::from_le_bytes(blk.d);
                        for j in 0..geo.sb_groups {
                            let s: i32 = blk.bsums[j * per..(j + 1) * per].iter().map(|&b| i16::from_le_bytes(b) as i32).sum();
                            let g = sb * geo.sb_groups + j;
                            if geo.off != 0 {
                                init[g] = -geo.off * s;
                            }
                            if geo.mins == Mins::Group {
                                fbs[g] = s as f32;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The i8 quants of one activation row in element order.
pub(super) fn act_quants(act: ActType, row: &[u8], out: &mut [i8]) {
    let (bs, ts, off) = match act {
        ActType::Q8_0 => (QK, 34, 2),
        ActType::Q8_1 => (QK, Q8_1_BYTES, 4),
        ActType::Q8K => (QK_K, 292, 4),
    };
    for (o, b) in out.chunks_exact_mut(bs).zip(row.chunks_exact(ts)) {
        for (q, &v) in o.iter_mut().zip(&b[off..off + bs]) {
            *q = v as i8;
        }
    }
}

// ---------------------------------------------------------------- weight side

/// One weight row (`ty`, `u.len()` elements) as unsigned quants `u` in element order, group
/// scales `fw` and group mins `fmin` (left alone for types without a min), per `geo(ty)`.
/// The AVX-512 unpackers produce the same bytes and floats. Written as loops over whole 32-byte
/// runs with uniform shifts, which the compiler vectorizes: `matmat_avx2` inlines this into an
/// AVX2 function (`decode_row_avx2`), where it is the per-tile cost of the kernel.
#[inline(always)]
pub(super) fn decode_row(ty: QuantType, row: &[u8], u: &mut [u8], fw: &mut [f32], fmin: &mut [f32]) {
    // element j of a 32-element run: low nibble of qs[j] (j < 16), high nibble of qs[j - 16]
    let nib = |o: &mut [u8], qs: &[u8; 16]| {
        for j in 0..16 {
            o[j] = qs[j] & 0x0F;
            o[j + 16] = qs[j] >> 4;
        }
    };
    // bit 4 of element j = bit j of qh (byte j / 8, bit j % 8)
    let bit5 = |o: &mut [u8], qh: [u8; 4]| {
        // (a byte per element, tested against its bit: no per-lane shift)
        let mut hb = [0u8; 32];
        for (j, b) in hb.iter_mut().enumerate() {
            *b = qh[j / 8];
        }
        for (j, v) in o.iter_mut().enumerate() {
            *v |= (((hb[j] & (1 << (j % 8))) != 0) as u8) << 4;
        }
    };
    // Q2_K/Q3_K low bits: element 128h + 32s + l is (qs[32h + l] >> 2s) & 3
    let crumbs = |o: &mut [u8], qs: &[u8; 64]| {
        for h in 0..2 {
            for s in 0..4 {
                for l in 0..32 {
                    o[128 * h + 32 * s + l] = (qs[32 * h + l] >> (2 * s)) & 3;
                }
            }
        }
    };
    match ty {
        QuantType::Q4_0 => {
            for (i, b) in view::<BlockQ4_0>(row).iter().enumerate() {
                nib(&mut u[32 * i..32 * i + 32], &b.qs);
                fw[i] = h16(b.d);
            }
        }
        QuantType::Q4_1 => {
            for (i, b) in view::<BlockQ4_1>(row).iter().enumerate() {
                nib(&mut u[32 * i..32 * i + 32], &b.qs);
                fw[i] = h16(b.d);
                fmin[i] = h16(b.m);
            }
        }
        QuantType::Q5_0 => {
            for (i, b) in view::<BlockQ5_0>(row).iter().enumerate() {
                nib(&mut u[32 * i..32 * i + 32], &b.qs);
                bit5(&mut u[32 * i..32 * i + 32], b.qh);
                fw[i] = h16(b.d);
            }
        }
        QuantType::Q5_1 => {
            for (i, b) in view::<BlockQ5_1>(row).iter().enumerate() {
                nib(&mut u[32 * i..32 * i + 32], &b.qs);
                bit5(&mut u[32 * i..32 * i + 32], b.qh);
                fw[i] = h16(b.d);
                fmin[i] = h16(b.m);
            }
        }
        QuantType::Q8_0 => {
            for (i, b) in view::<BlockQ8_0>(row).iter().enumerate() {
                for (o, &q) in u[32 * i..32 * i + 32].iter_mut().zip(&b.qs) {
                    *o = (q as u8) ^ 0x80; // q + 128
                }
                fw[i] = h16(b.d);
            }
        }
        QuantType::Q2K => {
            for (i, b) in view::<BlockQ2K>(row).iter().enumerate() {
                crumbs(&mut u[256 * i..256 * i + 256], &b.qs);
                let (d, dmin) = (h16(b.d), h16(b.dmin));
                for g in 0..16 {
                    fw[16 * i + g] = d * (b.scales[g] & 0x0F) as f32;
                    fmin[16 * i + g] = -(dmin * (b.scales[g] >> 4) as f32);
                }
            }
        }
        QuantType::Q3K => {
            for (i, b) in view::<BlockQ3K>(row).iter().enumerate() {
                let o = &mut u[256 * i..256 * i + 256];
                crumbs(o, &b.qs);
                // + 4 where the hmask bit is set (q = low - 4 where it is clear): element
                // 32j + l has bit j of hmask[l]
                for j in 0..8 {
                    for l in 0..32 {
                        o[32 * j + l] += ((b.hmask[l] >> j) & 1) << 2;
                    }
                }
                let d = h16(b.d);
                for (g, &s) in super::dequant::q3k_scales(&b.scales).iter().enumerate() {
                    fw[16 * i + g] = d * s as f32;
                }
            }
        }
        QuantType::Q4K | QuantType::Q5K => {
            let (ts, qs_off) = if ty == QuantType::Q4K { (144, 16) } else { (176, 48) };
            for (i, b) in row.chunks_exact(ts).enumerate() {
                let o = &mut u[256 * i..256 * i + 256];
                // element 64c + 32n + l is nibble n of qs[32c + l]
                for c in 0..4 {
                    let q = &b[qs_off + 32 * c..qs_off + 32 * c + 32];
                    for l in 0..32 {
                        o[64 * c + l] = q[l] & 0x0F;
                        o[64 * c + 32 + l] = q[l] >> 4;
                    }
                }
                if ty == QuantType::Q5K {
                    // element 32j + l: bit j of qh[l]
                    let qh = &b[16..48];
                    for j in 0..8 {
                        for l in 0..32 {
                            o[32 * j + l] |= ((qh[l] >> j) & 1) << 4;
                        }
                    }
                }
                let (d, dmin) = (h16([b[0], b[1]]), h16([b[2], b[3]]));
                let (sc, mn) = super::dequant::k4_scale_min(b[4..16].try_into().unwrap());
                for g in 0..8 {
                    fw[8 * i + g] = d * sc[g] as f32;
                    fmin[8 * i + g] = -(dmin * mn[g] as f32);
                }
            }
        }
        QuantType::Q6K => {
            for (i, b) in view::<BlockQ6K>(row).iter().enumerate() {
                // element 128h + 32s + l: nibble s/2 of ql[64h + 32(s%2) + l], high bits
                // (qh[32h + l] >> 2s) & 3
                let o = &mut u[256 * i..256 * i + 256];
                for h in 0..2 {
                    for s in 0..4 {
                        for l in 0..32 {
                            let lo = (b.ql[64 * h + 32 * (s % 2) + l] >> (4 * (s / 2))) & 0x0F;
                            o[128 * h + 32 * s + l] = lo | (((b.qh[32 * h + l] >> (2 * s)) & 3) << 4);
                        }
                    }
                }
                let d = h16(b.d);
                for g in 0..16 {
                    fw[16 * i + g] = d * b.scales[g] as f32;
                }
            }
        }
        QuantType::IQ2XXS => iq_rows::<BlockIQ2XXS>(row, u, fw),
        QuantType::IQ2XS => iq_rows::<BlockIQ2XS>(row, u, fw),
        QuantType::IQ2S => iq_rows::<BlockIQ2S>(row, u, fw),
        QuantType::IQ3XXS => iq_rows::<BlockIQ3XXS>(row, u, fw),
        QuantType::IQ3S => iq_rows::<BlockIQ3S>(row, u, fw),
        QuantType::IQ4NL | QuantType::MXFP4 => {
            // one table level per nibble (order as Q4_0); scale f16 or E8M0 (a power of two)
            let (ts, lut) =
                if ty == QuantType::IQ4NL { (18, lut_u(&KVALUES_IQ4NL, 128)) } else { (17, lut_u(&KVALUES_MXFP4, MXFP4_OFF)) };
            for (i, b) in row.chunks_exact(ts).enumerate() {
                let qs: &[u8; 16] = b[ts - 16..].try_into().unwrap();
                let o = &mut u[32 * i..32 * i + 32];
                nib(o, qs);
                for v in o.iter_mut() {
                    *v = lut[*v as usize];
                }
                fw[i] = if ty == QuantType::IQ4NL { h16([b[0], b[1]]) } else { e8m0_half(b[0]) };
            }
        }
        QuantType::IQ4XS => {
            let lut = lut_u(&KVALUES_IQ4NL, 128);
            for (i, b) in view::<BlockIQ4XS>(row).iter().enumerate() {
                // sub-block ib: an IQ4_NL block's nibbles in qs[16ib..16ib + 16], scale d * (ls - 32)
                for ib in 0..8 {
                    let o = &mut u[256 * i + 32 * ib..256 * i + 32 * ib + 32];
                    nib(o, b.qs[16 * ib..16 * ib + 16].try_into().unwrap());
                    for v in o.iter_mut() {
                        *v = lut[*v as usize];
                    }
                }
                let d = h16(b.d);
                for (g, &s) in super::dequant::iq4xs_scales(b).iter().enumerate() {
                    fw[8 * i + g] = d * s as f32;
                }
            }
        }
        _ => unreachable!("decode_row({ty}): no geometry (checked by geo())"),
    }
}

// ---------------------------------------------------------------- scalar twin

/// The module header's formula with plain loops. Lengths checked, `rows, n_t > 0`.
#[allow(clippy::too_many_arguments)]
fn scalar(ty: QuantType, geo: &Geo, w: &[u8], rows: usize, cols: usize, acts: &[u8], n_t: usize, p: &Prep, y: &mut [f32]) {
    let (g_el, n_g, n_sb) = (geo.group, cols / geo.group, cols / geo.sb());
    let (rb, ab) = (w.len() / rows, acts.len() / n_t);
    // every token's quants decoded once: [n_t][cols]
    let mut a = vec![0i8; n_t * cols];
    for (o, row) in a.chunks_exact_mut(cols).zip(acts.chunks_exact(ab)) {
        act_quants(geo.act, row, o);
    }
    let (mut u, mut fw, mut fmin) = (vec![0u8; cols], vec![0f32; n_g], vec![0f32; n_g]);
    for (r, yr) in y.chunks_exact_mut(n_t).enumerate() {
        decode_row(ty, &w[r * rb..(r + 1) * rb], &mut u, &mut fw, &mut fmin);
        for (t, o) in yr.iter_mut().enumerate() {
            let at = &a[t * cols..(t + 1) * cols];
            let mut acc = 0f32;
            for sb in 0..n_sb {
                let mut temp = 0f32;
                let mut last_g = 0;
                for j in 0..geo.sb_groups {
                    let g = sb * geo.sb_groups + j;
                    let e = g * g_el;
                    let mut isum = if geo.off != 0 { p.init[t * n_g + g] } else { 0 };
                    for (&uq, &aq) in u[e..e + g_el].iter().zip(&at[e..e + g_el]) {
                        isum += uq as i32 * aq as i32;
                    }
                    temp = (isum as f32).mul_add(fw[g], temp);
                    if geo.mins == Mins::Group {
                        temp = fmin[g].mul_add(p.fbs[t * n_g + g], temp);
                    }
                    last_g = g;
                }
                acc = temp.mul_add(p.da[t * n_sb + sb], acc);
                if geo.mins == Mins::Block {
                    acc = fmin[last_g].mul_add(p.fbs[t * n_g + last_g], acc);
                }
            }
            *o = acc;
        }
    }
}

/// `decode_row` of a grid type: each block through `iq23::matmat_unpack`.
fn iq_rows<B: super::iq23::IqBlock>(row: &[u8], u: &mut [u8], fw: &mut [f32]) {
    for (i, b) in view::<B>(row).iter().enumerate() {
        super::iq23::matmat_unpack(b, IQ_GRID_OFF, &mut u[256 * i..256 * i + 256], &mut fw[16 * i..16 * i + 16]);
    }
}

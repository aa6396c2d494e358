//! Decode attention over a KV cache in its stored type (f32, f16 or 8-bit), one split of the
//! keys at a time (flash-decoding): for the query heads that share a kv head and a run of
//! cached positions, `attend_split` gives each head's score maximum m, its sum of exponentials
//! l and the unnormalised weighted sum of the values Σ_t e^{s_t − m} v_t; `merge` joins the
//! splits of one head exactly (rescaling each by e^{m_j − M}). The caller (the engine's decode
//! attention) cuts the keys at fixed positions, so a head's value does not depend on how many
//! threads ran it, which rows were batched with it or how its heads were grouped.
//!
//! Why by hand: this is decode's hot loop at long context (at 8k tokens the cache of
//! Qwen2.5-0.5B is 200 MB of f32 read per token against 400 MB of weights). The cache is read
//! in place, 16 rows at a time (every kv head of the split in one contiguous read): an f32
//! cache directly; an f16 or 8-bit one converted into a 16-row f32 tile (in L1) once for all
//! the query heads and never widened as a whole. 8-bit rows are blocks of `Q8_BLOCK` values
//! with one f32 scale each (`quantize_q8`), the layout of ggml's q8_0 with an f32 scale; the
//! engine stores keys scaled per channel and Hadamard-transformed in it (`hadamard`; the
//! engine's `attention::KeyForm`).
//!
//! Where it stands (2 cores, Zen 5 in a VM): ~45% of the FMA peak from cache (4.7 ns per
//! (key, head) at head size 64, 7 heads per kv head), and the DRAM stream is not overlapped
//! with the arithmetic yet (10-13 ns read from memory). BENCHMARKS.md, 2026-12-03, "issue 18: decode attention in the cache's own type".
//! On AVX2 (Zen 3, no AVX-512) the same shape, with q in registers for head size 64 (one load
//! per FMA of the scores) and value rows shared by two heads (32 values of a row, loaded once
//! for both), gives 7.8 ns (f16, head size 64, 7 heads per kv head, from cache, fastest pass
//! of `attn_bench`; 9.2 ns in the same run without those two, 31 ns with one pass per query
//! head). The 16 ymm registers bound it: the weighted sum still loads 3 values per 4 FMAs.
//! On an Intel Xeon (AVX-512, 2 MB L2 per core; BENCHMARKS.md, 2026-12-04, "issue 18 on an Intel Xeon") the Qwen2.5 shape takes
//! 5.3 ns per (key, head) from L2/L3 and ~7 from memory, where one core streams ~10 GB/s: the
//! stream, not the arithmetic, bounds it there (prefetch distances and an L2-only prefetch did
//! not help). At head size 64 the scores take two heads at a time (each key vector loaded once).
//!
//! Arithmetic, the same in the SIMD kernel and its scalar twin, bit for bit:
//! - score: `dot(q_h, k_t)` in `dot::dot`'s lane order (`attn::dot_rows`) on the key as f32
//!   (f16 widened exactly; 8-bit `q · d`, one rounding), times `scale`, then the softcap
//!   `c·tanh(s/c)` (libm) where the model has one;
//! - m = max_t s_t; p_t = exp(s_t − m) (libm, or the vector exp of `act` whose scalar lane
//!   function is `ggml::expf_ggml`); l = Σ_t p_t as 16 lane sums in position order reduced in
//!   `dot::hsum`'s tree;
//! - acc[d] = fma(p_t, v_t[d], acc[d]) in position order.

use half::f16;

use crate::ggml::expf_ggml;
use crate::simd::{Level, level};

/// Values per scale in the 8-bit cache rows.
pub const Q8_BLOCK: usize = 32;

/// Rows of a cache in their stored type. Element j of row t of the kv head at offset `off` is at
/// `t · stride + off + j`; an 8-bit cache keeps one scale per `Q8_BLOCK` values (`d[i / 32]`).
#[derive(Clone, Copy, Debug)]
pub enum KvRows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Q8 { q: &'a [i8], d: &'a [f32] },
}

impl KvRows<'_> {
    fn len(&self) -> usize {
        match self {
            KvRows::F32(x) => x.len(),
            KvRows::F16(x) => x.len(),
            KvRows::Q8 { q, .. } => q.len(),
        }
    }

    /// Elements at..at + out.len() as f32, each as `get` gives it (the prefill attention's
    /// widening of a cache span).
    pub fn widen(&self, at: usize, out: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        match self {
            KvRows::F32(x) => out.copy_from_slice(&x[at..at + out.len()]),
            KvRows::F16(x) => x[at..at + out.len()].convert_to_f32_slice(out),
            KvRows::Q8 { .. } => out.iter_mut().enumerate().for_each(|(i, o)| *o = self.get(at + i)),
        }
    }

    /// Element i as f32 (exact for f16; `q · d` for 8-bit).
    #[inline(always)]
    fn get(&self, i: usize) -> f32 {
        match self {
            KvRows::F32(x) => x[i],
            KvRows::F16(x) => x[i].to_f32(),
            KvRows::Q8 { q, d } => q[i] as f32 * d[i / Q8_BLOCK],
        }
    }
}

/// Which exponential the softmax takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exp {
    /// libm's `expf` (exact numerics).
    Libm,
    /// The vector exp (`act::exp_fast`; scalar lane `ggml::expf_ggml`).
    Fast,
}

impl Exp {
    /// The exp of fast numerics (`Fast`) or of exact ones (`Libm`): one choice for every
    /// softmax of the engine.
    pub fn for_fast(fast: bool) -> Exp {
        if fast { Exp::Fast } else { Exp::Libm }
    }

    #[inline(always)]
    pub fn of(self, x: f32) -> f32 {
        match self {
            Exp::Libm => x.exp(),
            Exp::Fast => expf_ggml(x),
        }
    }
}

/// How a dot product becomes a score, and the exponential of the softmax.
#[derive(Clone, Copy, Debug)]
pub struct ScoreRule {
    pub scale: f32,
    pub softcap: Option<f32>,
    pub exp: Exp,
}

impl ScoreRule {
    #[inline(always)]
    fn score(&self, dot: f32) -> f32 {
        let s = dot * self.scale;
        match self.softcap {
            Some(c) => (s / c).tanh() * c,
            None => s,
        }
    }
}

/// One split: rows `row0 .. row0 + n` of the keys and values of one or more consecutive kv
/// heads, the first at `off` in each row.
#[derive(Clone, Copy, Debug)]
pub struct Split<'a> {
    pub keys: KvRows<'a>,
    pub vals: KvRows<'a>,
    pub stride: usize,
    pub off: usize,
    pub row0: usize,
    pub n: usize,
}

/// Values `attend_split` writes per head: m, l, then the hd sums.
pub const fn part_len(hd: usize) -> usize {
    hd + 2
}

#[track_caller]
fn check(q: &[f32], hd: usize, group: usize, s: &Split, out: &[f32]) -> usize {
    assert!(hd > 0 && q.len() % hd == 0 && !q.is_empty(), "attend_split: q {} values for head_dim {hd}", q.len());
    let g = q.len() / hd;
    assert!(group > 0 && g % group == 0, "attend_split: {g} heads in groups of {group}");
    let width = g / group * hd;
    assert!(s.n > 0, "attend_split: an empty split");
    assert!(s.off + width <= s.stride, "attend_split: heads at {} + {width} past the row stride {}", s.off, s.stride);
    let end = (s.row0 + s.n - 1) * s.stride + s.off + width;
    for (what, r) in [("keys", &s.keys), ("values", &s.vals)] {
        assert!(r.len() >= end, "attend_split: {what} hold {} values, the split needs {end}", r.len());
        if let KvRows::Q8 { q, d } = r {
            assert!(
                s.stride % Q8_BLOCK == 0 && s.off % Q8_BLOCK == 0 && hd % Q8_BLOCK == 0,
                "attend_split: 8-bit rows need stride, offset and head_dim in blocks of {Q8_BLOCK}"
            );
            assert!(d.len() * Q8_BLOCK >= q.len().min(end), "attend_split: {what} scales too few");
        }
    }
    assert!(out.len() == g * part_len(hd), "attend_split: out {} values for {g} heads of {hd}", out.len());
    g
}

/// The split's partial for the g = q.len() / hd query heads `q` [g, hd], `group` consecutive
/// heads per kv head (head i reads the kv head at `off + (i / group) · hd`): out [g, hd + 2] =
/// per head (m, l, Σ_t e^{s_t − m} v_t). Each block of rows is read once for all the heads.
/// `scratch` is reused across calls (scores and a tile).
#[track_caller]
pub fn attend_split(q: &[f32], hd: usize, group: usize, s: &Split, rule: &ScoreRule, scratch: &mut Vec<f32>, out: &mut [f32]) {
    check(q, hd, group, s, out);
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: level() returned Avx512 only after detecting avx512f and fma; bounds checked.
        Level::Avx512 => unsafe { avx512::attend_split(q, hd, group, s, rule, scratch, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: level() returned Avx2 only after detecting avx2, fma and f16c; bounds checked.
        Level::Avx2 if hd % 16 == 0 => unsafe { avx2::attend_split(q, hd, group, s, rule, scratch, out) },
        _ => attend_split_scalar(q, hd, group, s, rule, out),
    }
}

/// `dot::avx512::hsum`'s tree on 16 lanes.
#[inline(always)]
fn hsum_scalar(v: [f32; 16]) -> f32 {
    let s8: [f32; 8] = std::array::from_fn(|i| v[i] + v[i + 8]);
    let s4: [f32; 4] = std::array::from_fn(|i| s8[i] + s8[i + 4]);
    (s4[0] + s4[2]) + (s4[1] + s4[3])
}

/// `dot::dot` on AVX-512, lane for lane (`dot::avx512::parts`: two accumulators over 32-value
/// steps, a 16-value step into the first, the masked tail into the second), with `b` read
/// through `get`.
fn dot_lanes(a: &[f32], b: impl Fn(usize) -> f32) -> f32 {
    let n = a.len();
    let (mut a0, mut a1) = ([0f32; 16], [0f32; 16]);
    let mut i = 0;
    while i + 32 <= n {
        for l in 0..16 {
            a0[l] = a[i + l].mul_add(b(i + l), a0[l]);
            a1[l] = a[i + 16 + l].mul_add(b(i + 16 + l), a1[l]);
        }
        i += 32;
    }
    while i + 16 <= n {
        for l in 0..16 {
            a0[l] = a[i + l].mul_add(b(i + l), a0[l]);
        }
        i += 16;
    }
    if i < n {
        for l in 0..16 {
            let (x, y) = if i + l < n { (a[i + l], b(i + l)) } else { (0.0, 0.0) };
            a1[l] = x.mul_add(y, a1[l]);
        }
    }
    hsum_scalar(std::array::from_fn(|l| a0[l] + a1[l]))
}

/// The largest value (−∞ for none), its zero +0 whichever zero came first: the kernels find it
/// in other orders, and the m they report must not depend on it.
#[inline(always)]
fn max_of(s: &[f32]) -> f32 {
    s.iter().copied().fold(f32::NEG_INFINITY, f32::max) + 0.0
}

/// m, then p_t = exp(s_t − m) in place, then l (16 lane sums, `hsum`'s tree).
#[inline(always)]
fn softmax_part_scalar(s: &mut [f32], exp: Exp) -> (f32, f32) {
    let m = max_of(s);
    let mut lanes = [0f32; 16];
    for (t, x) in s.iter_mut().enumerate() {
        *x = exp.of(*x - m);
        lanes[t % 16] += *x;
    }
    (m, hsum_scalar(lanes))
}

/// Scalar twin of `attend_split`, bit for bit.
#[track_caller]
pub fn attend_split_scalar(q: &[f32], hd: usize, group: usize, s: &Split, rule: &ScoreRule, out: &mut [f32]) {
    check(q, hd, group, s, out);
    let mut p = vec![0f32; s.n];
    for (h, (qh, oh)) in q.chunks_exact(hd).zip(out.chunks_exact_mut(part_len(hd))).enumerate() {
        let at = |t: usize| (s.row0 + t) * s.stride + s.off + (h / group) * hd;
        for (t, x) in p.iter_mut().enumerate() {
            let base = at(t);
            *x = rule.score(dot_lanes(qh, |j| s.keys.get(base + j)));
        }
        let (m, l) = softmax_part_scalar(&mut p, rule.exp);
        oh[0] = m;
        oh[1] = l;
        let acc = &mut oh[2..];
        acc.fill(0.0);
        for (t, &pt) in p.iter().enumerate() {
            let base = at(t);
            for (d, a) in acc.iter_mut().enumerate() {
                *a = pt.mul_add(s.vals.get(base + d), *a);
            }
        }
    }
}

/// One head's value from its splits' partials (each [hd + 2]: m, l, sums), in split order:
/// M = max m_j, w_j = exp(m_j − M), out = Σ_j w_j·sums_j / Σ_j w_j·l_j. Compiled with FMA where
/// the CPU has it (`merge_scalar`'s arithmetic, each `mul_add` one instruction instead of a
/// call to libm's fmaf: a 32k decode step merges ~10^5 values per layer on one thread).
pub fn merge<'a>(parts: impl Iterator<Item = &'a [f32]> + Clone, exp: Exp, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if level() != Level::Scalar {
        // SAFETY: the Avx512 and Avx2 levels are detected with FMA.
        return unsafe { merge_fma(parts, exp, out) };
    }
    merge_scalar(parts, exp, out)
}

/// `merge_scalar` compiled with FMA.
///
/// # Safety
/// FMA available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn merge_fma<'a>(parts: impl Iterator<Item = &'a [f32]> + Clone, exp: Exp, out: &mut [f32]) {
    merge_body(parts, exp, out)
}

/// Scalar twin of `merge`, bit for bit.
pub fn merge_scalar<'a>(parts: impl Iterator<Item = &'a [f32]> + Clone, exp: Exp, out: &mut [f32]) {
    merge_body(parts, exp, out)
}

#[inline(always)]
fn merge_body<'a>(parts: impl Iterator<Item = &'a [f32]> + Clone, exp: Exp, out: &mut [f32]) {
    let m = parts.clone().map(|p| p[0]).fold(f32::NEG_INFINITY, f32::max);
    let mut l = 0f32;
    out.fill(0.0);
    for p in parts {
        assert_eq!(p.len(), out.len() + 2, "merge: a partial of {} values for head_dim {}", p.len(), out.len());
        let w = exp.of(p[0] - m);
        l = p[1].mul_add(w, l);
        for (o, &a) in out.iter_mut().zip(&p[2..]) {
            *o = a.mul_add(w, *o);
        }
    }
    let inv = 1.0 / l;
    out.iter_mut().for_each(|o| *o *= inv);
}

/// Append rows x [n, row] as 8-bit blocks of `Q8_BLOCK` values: d = max |x| / 127, q = round(x
/// / d) (ties away from zero); an all-zero block keeps d = 0. `row` must be a multiple of the
/// block.
pub fn quantize_q8(x: &[f32], q: &mut Vec<i8>, d: &mut Vec<f32>) {
    assert!(x.len() % Q8_BLOCK == 0, "quantize_q8: {} values are not whole blocks of {Q8_BLOCK}", x.len());
    for b in x.chunks_exact(Q8_BLOCK) {
        let amax = b.iter().fold(0f32, |a, &v| a.max(v.abs()));
        let s = amax / 127.0;
        let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
        q.extend(b.iter().map(|&v| (v * inv).round().clamp(-127.0, 127.0) as i8));
        d.push(s);
    }
}

/// The normalised Walsh-Hadamard transform of every consecutive block of `r` values of x (r a
/// power of two dividing x.len()): orthonormal and its own inverse, so a dot product of two
/// rows transformed alike is unchanged. An 8-bit cache stores keys transformed: the few huge
/// channels of some models' keys (Qwen2's, up to ~150 beside values of ~1) are spread over
/// their block and no longer set its scale alone (llama.cpp rotates its quantized caches the
/// same way).
pub fn hadamard(x: &mut [f32], r: usize) {
    assert!(r.is_power_of_two() && x.len() % r == 0, "hadamard: {} values in blocks of {r}", x.len());
    let norm = 1.0 / (r as f32).sqrt();
    for b in x.chunks_exact_mut(r) {
        let mut h = 1;
        while h < r {
            for i in (0..r).step_by(2 * h) {
                for j in i..i + h {
                    let (a, c) = (b[j], b[j + h]);
                    b[j] = a + c;
                    b[j + h] = a - c;
                }
            }
            h *= 2;
        }
        b.iter_mut().for_each(|v| *v *= norm);
    }
}

/// The values of 8-bit rows as f32 (`q · d`).
pub fn dequantize_q8(q: &[i8], d: &[f32]) -> Vec<f32> {
    q.iter().enumerate().map(|(i, &v)| v as f32 * d[i / Q8_BLOCK]).collect()
}

/// Prefetch (into L1) rows r0..r1 (those inside `src`), values off..off + width.
#[cfg(target_arch = "x86_64")]
#[inline]
fn prefetch(src: KvRows, stride: usize, off: usize, width: usize, r0: usize, r1: usize) {
    prefetch_hint::<{ std::arch::x86_64::_MM_HINT_T0 }>(src, stride, off, width, r0, r1)
}

/// `prefetch` into L2.
#[cfg(target_arch = "x86_64")]
#[inline]
fn prefetch_l2(src: KvRows, stride: usize, off: usize, width: usize, r0: usize, r1: usize) {
    prefetch_hint::<{ std::arch::x86_64::_MM_HINT_T1 }>(src, stride, off, width, r0, r1)
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn prefetch_hint<const HINT: i32>(src: KvRows, stride: usize, off: usize, width: usize, r0: usize, r1: usize) {
    use std::arch::x86_64::_mm_prefetch;
    let len = src.len();
    for r in r0..r1 {
        let at = r * stride + off;
        if at + width > len {
            break;
        }
        let (p, bytes) = match src {
            KvRows::F32(x) => (x.as_ptr().wrapping_add(at) as *const i8, width * 4),
            KvRows::F16(x) => (x.as_ptr().wrapping_add(at) as *const i8, width * 2),
            KvRows::Q8 { q, .. } => (q.as_ptr().wrapping_add(at), width),
        };
        for c in (0..bytes).step_by(64) {
            // SAFETY: SSE is part of x86_64; a prefetch never faults, and the line lies inside
            // the rows anyway (checked above).
            unsafe { _mm_prefetch::<HINT>(p.wrapping_add(c)) };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Exp, KvRows, Q8_BLOCK, ScoreRule, Split, part_len};
    use crate::attn::avx512::{dot_rows as dot_rows_f32, hsum16};
    use std::arch::x86_64::*;

    /// Rows per block: one transposed horizontal sum of scores, one tile of converted rows.
    const TB: usize = 16;
    /// Rows ahead of the block in use that the passes prefetch.
    const AHEAD: usize = 8 * TB;

    /// Where a block's rows are read as f32: in place (an f32 cache) or in the tile.
    struct Block {
        ptr: *const f32,
        stride: usize,
    }

    /// Rows row0..row0 + n, values off..off + width, as f32: in place for f32, else converted
    /// into `tile` [n, width]. Also prefetches the rows AHEAD further on.
    ///
    /// # Safety
    /// AVX-512 F available; the rows lie inside `src` (checked by `super::check`); for 8-bit,
    /// stride, off and width are multiples of Q8_BLOCK; tile holds n · width values.
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn block(src: KvRows, stride: usize, off: usize, width: usize, row0: usize, n: usize, tile: &mut [f32]) -> Block {
        super::prefetch(src, stride, off, width, row0 + AHEAD, row0 + AHEAD + n);
        let whole = width / 16 * 16;
        match src {
            KvRows::F32(x) => Block { ptr: x[row0 * stride + off..].as_ptr(), stride },
            KvRows::F16(x) => {
                for t in 0..n {
                    let base = (row0 + t) * stride + off;
                    let dst = &mut tile[t * width..(t + 1) * width];
                    for j in (0..whole).step_by(16) {
                        // SAFETY: base + j + 16 <= base + width lies inside x; 16 f16 = 256 bits.
                        unsafe {
                            let h = _mm256_loadu_si256(x.as_ptr().add(base + j) as *const __m256i);
                            _mm512_storeu_ps(dst.as_mut_ptr().add(j), _mm512_cvtph_ps(h));
                        }
                    }
                    for j in whole..width {
                        dst[j] = x[base + j].to_f32();
                    }
                }
                Block { ptr: tile.as_ptr(), stride: width }
            }
            KvRows::Q8 { q, d } => {
                for t in 0..n {
                    let base = (row0 + t) * stride + off;
                    let dst = &mut tile[t * width..(t + 1) * width];
                    // width is a multiple of 32 (checked): 16 values never straddle two blocks.
                    for j in (0..width).step_by(16) {
                        let sc = _mm512_set1_ps(d[(base + j) / Q8_BLOCK]);
                        // SAFETY: base + j + 16 <= base + width lies inside q; 16 i8 = 128 bits.
                        unsafe {
                            let b = _mm_loadu_si128(q.as_ptr().add(base + j) as *const __m128i);
                            let f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
                            _mm512_storeu_ps(dst.as_mut_ptr().add(j), _mm512_mul_ps(f, sc));
                        }
                    }
                }
                Block { ptr: tile.as_ptr(), stride: width }
            }
        }
    }

    /// # Safety
    /// AVX-512 F and FMA available; arguments as `super::check` accepts them.
    #[target_feature(enable = "avx512f,fma")]
    pub unsafe fn attend_split(
        q: &[f32],
        hd: usize,
        group: usize,
        s: &Split,
        rule: &ScoreRule,
        scratch: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        let (nq, n) = (q.len() / hd, s.n);
        let kvc = nq / group; // kv heads the heads read
        let width = kvc * hd;
        let need = nq * n + TB * width + nq * TB;
        if scratch.len() < need {
            scratch.resize(need, 0.0);
        }
        let (scores, rest) = scratch.split_at_mut(nq * n); // [nq, n]
        let (tile, blk) = rest.split_at_mut(TB * width); // [TB, width], [group, TB]
        // The split's first rows (`block` prefetches AHEAD of the block it reads, from the
        // second on): a split starts where the last one left the cache.
        super::prefetch(s.keys, s.stride, s.off, width, s.row0, s.row0 + AHEAD.min(n));
        // Scores, a block of rows at a time (all kv heads of the row: one contiguous read).
        for t0 in (0..n).step_by(TB) {
            let nt = TB.min(n - t0);
            // The same rows' values, for the weighted sums' pass (into L2 meanwhile).
            super::prefetch_l2(s.vals, s.stride, s.off, width, s.row0 + t0, s.row0 + t0 + nt);
            // SAFETY: rows s.row0 + t0 .. + nt lie inside the keys (checked); tile holds TB · width.
            let b = unsafe { block(s.keys, s.stride, s.off, width, s.row0 + t0, nt, tile) };
            for j in 0..kvc {
                let qj = &q[j * group * hd..(j + 1) * group * hd];
                // SAFETY: the block's nt rows hold width values from b.ptr, kv head j at j·hd.
                unsafe { scores_block(qj, hd, b.ptr.add(j * hd), b.stride, nt, &mut scores[j * group * n..], n, t0, blk) };
            }
        }
        for (sh, oh) in scores.chunks_exact_mut(n).zip(out.chunks_exact_mut(part_len(hd))) {
            sh.iter_mut().for_each(|x| *x = rule.score(*x));
            // SAFETY: AVX-512 F and FMA available.
            let (m, l) = unsafe { softmax_part(sh, rule.exp) };
            oh[0] = m;
            oh[1] = l;
            oh[2..].fill(0.0);
        }
        // Weighted sums, the same blocks of value rows.
        for t0 in (0..n).step_by(TB) {
            let nt = TB.min(n - t0);
            // SAFETY: rows s.row0 + t0 .. + nt lie inside the values (checked).
            let b = unsafe { block(s.vals, s.stride, s.off, width, s.row0 + t0, nt, tile) };
            for j in 0..kvc {
                let heads = j * group..(j + 1) * group;
                let oj = &mut out[heads.start * part_len(hd)..heads.end * part_len(hd)];
                let pj = &scores[heads.start * n..heads.end * n];
                // SAFETY: the block's nt rows hold width values from b.ptr, kv head j at j·hd.
                unsafe { accumulate_block(pj, n, t0, nt, b.ptr.add(j * hd), b.stride, hd, oj) };
            }
        }
    }

    /// Scores of the heads q [g, hd] against nt <= 16 rows `stride` apart from `rows`:
    /// out[h * ldo + t0 + t]. The common head sizes keep q in registers per head and take 16
    /// scores per transposed horizontal sum; others go through `attn::dot_rows` (the same
    /// arithmetic) into `blk`.
    ///
    /// # Safety
    /// AVX-512 F and FMA; rows valid for (nt - 1) · stride + hd reads; out holds g rows of ldo
    /// with t0 + nt <= ldo; blk holds g · 16.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn scores_block(
        q: &[f32],
        hd: usize,
        rows: *const f32,
        stride: usize,
        nt: usize,
        out: &mut [f32],
        ldo: usize,
        t0: usize,
        blk: &mut [f32],
    ) {
        // SAFETY (whole block): forwarded.
        unsafe {
            match hd {
                64 => scores_hd::<4>(q, rows, stride, nt, out, ldo, t0),
                128 => scores_hd::<8>(q, rows, stride, nt, out, ldo, t0),
                256 => scores_hd::<16>(q, rows, stride, nt, out, ldo, t0),
                _ => {
                    let g = q.len() / hd;
                    let rows = std::slice::from_raw_parts(rows, (nt - 1) * stride + hd);
                    dot_rows_f32(q, hd, rows, stride, nt, &mut blk[..g * nt]);
                    for h in 0..g {
                        out[h * ldo + t0..h * ldo + t0 + nt].copy_from_slice(&blk[h * nt..(h + 1) * nt]);
                    }
                }
            }
        }
    }

    /// `dot::avx512::parts` of one q row (in registers) and one key row, hd = 16·NV.
    ///
    /// # Safety
    /// AVX-512 F and FMA; r valid for 16·NV reads.
    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn parts_q<const NV: usize>(qv: &[__m512; NV], r: *const f32) -> __m512 {
        let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut c = 0;
        // SAFETY (whole block): chunk c < NV lies inside the row.
        unsafe {
            while c + 2 <= NV {
                a0 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(r.add(16 * c)), a0);
                a1 = _mm512_fmadd_ps(qv[c + 1], _mm512_loadu_ps(r.add(16 * c + 16)), a1);
                c += 2;
            }
            if c < NV {
                a0 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(r.add(16 * c)), a0);
            }
        }
        _mm512_add_ps(a0, a1)
    }

    /// `parts_q` of two q rows (in registers) against one key row, each key vector loaded once
    /// for both: the same two chains per head, in the same order.
    ///
    /// # Safety
    /// AVX-512 F and FMA; r valid for 16·NV reads.
    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn parts_q2<const NV: usize>(qa: &[__m512; NV], qb: &[__m512; NV], r: *const f32) -> (__m512, __m512) {
        let (mut a0, mut a1, mut b0, mut b1) =
            (_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps());
        let mut c = 0;
        // SAFETY (whole block): chunk c < NV lies inside the row.
        unsafe {
            while c + 2 <= NV {
                let (k0, k1) = (_mm512_loadu_ps(r.add(16 * c)), _mm512_loadu_ps(r.add(16 * c + 16)));
                a0 = _mm512_fmadd_ps(qa[c], k0, a0);
                a1 = _mm512_fmadd_ps(qa[c + 1], k1, a1);
                b0 = _mm512_fmadd_ps(qb[c], k0, b0);
                b1 = _mm512_fmadd_ps(qb[c + 1], k1, b1);
                c += 2;
            }
            if c < NV {
                let k0 = _mm512_loadu_ps(r.add(16 * c));
                a0 = _mm512_fmadd_ps(qa[c], k0, a0);
                b0 = _mm512_fmadd_ps(qb[c], k0, b0);
            }
        }
        (_mm512_add_ps(a0, a1), _mm512_add_ps(b0, b1))
    }

    /// `scores_block` for hd = 16·NV.
    ///
    /// # Safety
    /// As `scores_block`.
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn scores_hd<const NV: usize>(
        q: &[f32],
        rows: *const f32,
        stride: usize,
        nt: usize,
        out: &mut [f32],
        ldo: usize,
        t0: usize,
    ) {
        let hd = 16 * NV;
        let g = q.len() / hd;
        let mut h0 = 0;
        if NV == 4 && nt == 16 {
            // Head size 64: two heads at a time, 8 rows per transposed sum, each key vector
            // loaded once for both (q of both heads in 8 registers). The same parts and the
            // same per-lane tree: hsum16's lanes do not depend on each other. `rows` opaque for
            // the reason the one-head loop below gives (reloads from L1, not spilled hoists).
            let rows = std::hint::black_box(rows);
            while h0 + 2 <= g {
                let mut qa = [_mm512_setzero_ps(); NV];
                let mut qb = [_mm512_setzero_ps(); NV];
                for c in 0..NV {
                    // SAFETY: heads h0 and h0 + 1 have hd values each in q.
                    unsafe {
                        qa[c] = _mm512_loadu_ps(q.as_ptr().add(h0 * hd + 16 * c));
                        qb[c] = _mm512_loadu_ps(q.as_ptr().add((h0 + 1) * hd + 16 * c));
                    }
                }
                for b in [0, 8] {
                    let mut v = [_mm512_setzero_ps(); 16];
                    for i in 0..8 {
                        // SAFETY: row b + i < nt = 16.
                        (v[i], v[8 + i]) = unsafe { parts_q2(&qa, &qb, rows.add((b + i) * stride)) };
                    }
                    let r = hsum16(v);
                    // SAFETY: lanes 0..8 go to out[h0 ldo + t0 + b..][..8], lanes 8..16 to
                    // out[(h0 + 1) ldo + t0 + b..][..8], inside out (t0 + 16 <= ldo).
                    unsafe {
                        let o = out.as_mut_ptr();
                        _mm256_storeu_ps(o.add(h0 * ldo + t0 + b), _mm512_castps512_ps256(r));
                        let hi = _mm512_castps512_ps256(_mm512_shuffle_f32x4::<0b11_10_11_10>(r, r));
                        _mm256_storeu_ps(o.add((h0 + 1) * ldo + t0 + b), hi);
                    }
                }
                h0 += 2;
            }
        }
        // No closures here: they would not inherit the target features (each intrinsic a call).
        let mut qv = [_mm512_setzero_ps(); NV];
        for h in h0..g {
            for (c, x) in qv.iter_mut().enumerate() {
                // SAFETY: head h has hd values in q.
                *x = unsafe { _mm512_loadu_ps(q.as_ptr().add(h * hd + 16 * c)) };
            }
            if nt == 16 {
                // Opaque per head, so the compiler reloads the block's rows from L1 rather than
                // hoisting all of them out of the head loop into spilled registers.
                let rows = std::hint::black_box(rows);
                // Wide heads (q in 16 registers) sum 8 rows at a time: hsum16's lanes of a
                // row do not depend on the other rows', zeros stand in for the missing 8.
                let batch = if NV <= 8 { 16 } else { 8 };
                for b in (0..16).step_by(batch) {
                    let mut v = [_mm512_setzero_ps(); 16];
                    for (i, x) in v.iter_mut().enumerate().take(batch) {
                        // SAFETY: row b + i < nt.
                        *x = unsafe { parts_q(&qv, rows.add((b + i) * stride)) };
                    }
                    let m: __mmask16 = if batch == 16 { 0xffff } else { 0x00ff };
                    // SAFETY: out[h ldo + t0 + b..][..batch] is inside out (t0 + 16 <= ldo).
                    unsafe { _mm512_mask_storeu_ps(out.as_mut_ptr().add(h * ldo + t0 + b), m, hsum16(v)) };
                }
            } else {
                for t in 0..nt {
                    // SAFETY: row t < nt.
                    out[h * ldo + t0 + t] = crate::dot::avx512::hsum(unsafe { parts_q(&qv, rows.add(t * stride)) });
                }
            }
        }
    }

    /// out[h][2 + d] = fma(p[h][t0 + t], rows[t][d], ·) for t < nt in order, for the heads of
    /// out ([g, hd + 2]); p is [g, n]. The common head sizes keep HG heads' sums in registers
    /// and load each value row once for them.
    ///
    /// # Safety
    /// AVX-512 F and FMA; rows valid for (nt - 1) · stride + hd reads; t0 + nt <= n.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn accumulate_block(
        p: &[f32],
        n: usize,
        t0: usize,
        nt: usize,
        rows: *const f32,
        stride: usize,
        hd: usize,
        out: &mut [f32],
    ) {
        let g = out.len() / part_len(hd);
        // SAFETY (whole block): forwarded; each call's heads are < g.
        unsafe {
            match hd {
                64 => {
                    let mut h = 0;
                    while h + 4 <= g {
                        acc_heads::<4, 4>(p, n, t0, nt, rows, stride, out, h, 0);
                        h += 4;
                    }
                    match g - h {
                        3 => acc_heads::<4, 3>(p, n, t0, nt, rows, stride, out, h, 0),
                        2 => acc_heads::<4, 2>(p, n, t0, nt, rows, stride, out, h, 0),
                        1 => acc_heads::<4, 1>(p, n, t0, nt, rows, stride, out, h, 0),
                        _ => {}
                    }
                }
                128 => {
                    let mut h = 0;
                    while h + 2 <= g {
                        acc_heads::<8, 2>(p, n, t0, nt, rows, stride, out, h, 0);
                        h += 2;
                    }
                    if h < g {
                        acc_heads::<8, 1>(p, n, t0, nt, rows, stride, out, h, 0);
                    }
                }
                256 => {
                    // Two halves of 128 values: two heads' sums fit the registers beside the
                    // row, which is loaded once for both.
                    for col in [0, 128] {
                        let mut h = 0;
                        while h + 2 <= g {
                            acc_heads::<8, 2>(p, n, t0, nt, rows, stride, out, h, col);
                            h += 2;
                        }
                        if h < g {
                            acc_heads::<8, 1>(p, n, t0, nt, rows, stride, out, h, col);
                        }
                    }
                }
                _ => accumulate_any(p, n, t0, nt, rows, stride, hd, out),
            }
        }
    }

    /// Heads h0..h0 + HG of `accumulate_block`, values col..col + 16·NV of each: their sums
    /// loaded into registers, one fma per row and vector in row order, stored back.
    ///
    /// # Safety
    /// As `accumulate_block`; heads h0..h0 + HG are in out; col + 16·NV <= hd.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn acc_heads<const NV: usize, const HG: usize>(
        p: &[f32],
        n: usize,
        t0: usize,
        nt: usize,
        rows: *const f32,
        stride: usize,
        out: &mut [f32],
        h0: usize,
        col: usize,
    ) {
        let pl = out.len() / (p.len() / n);
        let op = out.as_mut_ptr();
        // No closures here: they would not inherit the target features (each intrinsic a call).
        let mut acc = [[_mm512_setzero_ps(); NV]; HG];
        let mut vv = [_mm512_setzero_ps(); NV];
        for (h, ah) in acc.iter_mut().enumerate() {
            for (c, a) in ah.iter_mut().enumerate() {
                // SAFETY: head h0 + h has pl values in out, its sums from offset 2.
                *a = unsafe { _mm512_loadu_ps(op.add((h0 + h) * pl + 2 + col + 16 * c)) };
            }
        }
        for t in 0..nt {
            if NV * (HG + 1) <= 28 {
                // The row in registers, shared by the HG heads.
                for (c, x) in vv.iter_mut().enumerate() {
                    // SAFETY: row t < nt.
                    *x = unsafe { _mm512_loadu_ps(rows.add(t * stride + col + 16 * c)) };
                }
                for (h, ah) in acc.iter_mut().enumerate() {
                    let pb = _mm512_set1_ps(p[(h0 + h) * n + t0 + t]);
                    for (a, &v) in ah.iter_mut().zip(&vv) {
                        *a = _mm512_fmadd_ps(pb, v, *a);
                    }
                }
            } else {
                // Too wide to hold the row beside the sums: each fma loads its vector.
                for (h, ah) in acc.iter_mut().enumerate() {
                    let pb = _mm512_set1_ps(p[(h0 + h) * n + t0 + t]);
                    for (c, a) in ah.iter_mut().enumerate() {
                        // SAFETY: row t < nt.
                        *a = _mm512_fmadd_ps(pb, unsafe { _mm512_loadu_ps(rows.add(t * stride + col + 16 * c)) }, *a);
                    }
                }
            }
        }
        for (h, ah) in acc.iter().enumerate() {
            for (c, a) in ah.iter().enumerate() {
                // SAFETY: as the loads above.
                unsafe { _mm512_storeu_ps(op.add((h0 + h) * pl + 2 + col + 16 * c), *a) };
            }
        }
    }

    /// `accumulate_block` for any head size: 8 vectors of a head's sums at a time, the tail
    /// masked.
    ///
    /// # Safety
    /// As `accumulate_block`.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn accumulate_any(
        p: &[f32],
        n: usize,
        t0: usize,
        nt: usize,
        rows: *const f32,
        stride: usize,
        hd: usize,
        out: &mut [f32],
    ) {
        const W: usize = 8;
        for (h, oh) in out.chunks_exact_mut(part_len(hd)).enumerate() {
            let acc_row = &mut oh[2..];
            let ph = &p[h * n + t0..h * n + t0 + nt];
            for c0 in (0..hd).step_by(16 * W) {
                let nv = (hd - c0).div_ceil(16).min(W);
                let mut masks = [0u16; W];
                for (i, m) in masks.iter_mut().enumerate().take(nv) {
                    let rem = hd - c0 - 16 * i;
                    *m = if rem >= 16 { 0xffff } else { ((1u32 << rem) - 1) as u16 };
                }
                let mut acc = [_mm512_setzero_ps(); W];
                for (i, a) in acc.iter_mut().enumerate().take(nv) {
                    // SAFETY: masked load of acc_row[c0 + 16i..], lanes < hd - c0 - 16i.
                    *a = unsafe { _mm512_maskz_loadu_ps(masks[i], acc_row.as_ptr().add(c0 + 16 * i)) };
                }
                for (t, &pt) in ph.iter().enumerate() {
                    let pv = _mm512_set1_ps(pt);
                    for (i, a) in acc.iter_mut().enumerate().take(nv) {
                        // SAFETY: row t < nt; lanes masked to < hd.
                        let x = unsafe { _mm512_maskz_loadu_ps(masks[i], rows.add(t * stride + c0 + 16 * i)) };
                        *a = _mm512_fmadd_ps(pv, x, *a);
                    }
                }
                for (i, a) in acc.iter().enumerate().take(nv) {
                    // SAFETY: masked store to acc_row[c0 + 16i..], lanes < hd - c0 - 16i.
                    unsafe { _mm512_mask_storeu_ps(acc_row.as_mut_ptr().add(c0 + 16 * i), masks[i], *a) };
                }
            }
        }
    }

    /// m, p = exp(s − m) in place, l: `super::softmax_part_scalar`'s arithmetic on 16 lanes.
    ///
    /// # Safety
    /// AVX-512 F and FMA available.
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn softmax_part(s: &mut [f32], exp: Exp) -> (f32, f32) {
        let m = super::max_of(s);
        let n16 = s.len() / 16 * 16;
        let mut acc = _mm512_setzero_ps();
        match exp {
            Exp::Fast => {
                let mv = _mm512_set1_ps(m);
                for i in (0..n16).step_by(16) {
                    // SAFETY: i + 16 <= s.len().
                    unsafe {
                        let e = crate::act::avx512::expf16(_mm512_sub_ps(_mm512_loadu_ps(s.as_ptr().add(i)), mv));
                        _mm512_storeu_ps(s.as_mut_ptr().add(i), e);
                        acc = _mm512_add_ps(acc, e);
                    }
                }
                s[n16..].iter_mut().for_each(|x| *x = super::expf_ggml(*x - m));
            }
            Exp::Libm => {
                s.iter_mut().for_each(|x| *x = (*x - m).exp());
                for i in (0..n16).step_by(16) {
                    // SAFETY: i + 16 <= s.len().
                    acc = _mm512_add_ps(acc, unsafe { _mm512_loadu_ps(s.as_ptr().add(i)) });
                }
            }
        }
        if n16 < s.len() {
            let mask = ((1u32 << (s.len() - n16)) - 1) as u16;
            // SAFETY: masked lanes < s.len() - n16.
            acc = _mm512_add_ps(acc, unsafe { _mm512_maskz_loadu_ps(mask, s.as_ptr().add(n16)) });
        }
        (m, crate::dot::avx512::hsum(acc))
    }
}

/// The AVX2 kernel (no AVX-512), head sizes that are multiples of 16, with the AVX-512 kernel's
/// shape: blocks of 16 rows read once for every query head of the split (f16 and 8-bit rows
/// converted into a 16-row f32 tile, exactly for f16 and `q · d` with one rounding for 8-bit,
/// as `KvRows::get`), then per head:
/// - scores two rows at a time (each q vector loaded once for both), each the twin's 16-lane
///   dot product held in 8-lane halves (the same FMAs per lane), eight rows' horizontal sums in
///   one transposed tree with `hsum_scalar`'s pairing;
/// - the softmax part on 8 lanes (`expf8` is `expf_ggml` lane for lane, its 2^n step in f64
///   as the twin's), the 16 lane sums in two registers;
/// - the weighted sum 64 values at a time in registers, one FMA per value and row in
///   position order.
/// The twin's bits throughout.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Exp, KvRows, Q8_BLOCK, ScoreRule, Split, part_len};
    pub(super) use crate::act::avx2::expf8;
    use std::arch::x86_64::*;

    /// Rows per block (one tile of converted rows).
    const TB: usize = 16;
    /// Rows ahead of the block in use that the passes prefetch.
    const AHEAD: usize = 8 * TB;

    /// Where a block's rows are read as f32: in place (an f32 cache) or in the tile.
    struct Block {
        ptr: *const f32,
        stride: usize,
    }

    /// Rows row0..row0 + n, values off..off + width, as f32: in place for f32, else converted
    /// into `tile` [n, width]. Also prefetches the rows AHEAD further on.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; the rows lie inside `src` (checked by `super::check`);
    /// width a multiple of 16 (of 32 for 8-bit, with stride and off); tile holds n · width.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block(src: KvRows, stride: usize, off: usize, width: usize, row0: usize, n: usize, tile: &mut [f32]) -> Block {
        super::prefetch(src, stride, off, width, row0 + AHEAD, row0 + AHEAD + n);
        match src {
            KvRows::F32(x) => Block { ptr: x[row0 * stride + off..].as_ptr(), stride },
            KvRows::F16(x) => {
                for t in 0..n {
                    let base = (row0 + t) * stride + off;
                    let dst = tile[t * width..(t + 1) * width].as_mut_ptr();
                    for j in (0..width).step_by(8) {
                        // SAFETY: base + j + 8 <= base + width lies inside x; 8 f16 = 128 bits.
                        unsafe {
                            _mm256_storeu_ps(dst.add(j), _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().add(base + j).cast())))
                        };
                    }
                }
                Block { ptr: tile.as_ptr(), stride: width }
            }
            KvRows::Q8 { q, d } => {
                for t in 0..n {
                    let base = (row0 + t) * stride + off;
                    let dst = tile[t * width..(t + 1) * width].as_mut_ptr();
                    // width is a multiple of 32 (checked): 8 values never straddle two blocks.
                    for j in (0..width).step_by(8) {
                        let sc = _mm256_set1_ps(d[(base + j) / Q8_BLOCK]);
                        // SAFETY: base + j + 8 <= base + width lies inside q; 8 i8 = 64 bits.
                        unsafe {
                            let b = _mm_loadl_epi64(q.as_ptr().add(base + j).cast());
                            _mm256_storeu_ps(dst.add(j), _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), sc));
                        }
                    }
                }
                Block { ptr: tile.as_ptr(), stride: width }
            }
        }
    }

    /// # Safety
    /// AVX2, FMA and F16C available; arguments as `super::check` accepts them, hd % 16 == 0.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn attend_split(
        q: &[f32],
        hd: usize,
        group: usize,
        s: &Split,
        rule: &ScoreRule,
        scratch: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        let (nq, n, pl) = (q.len() / hd, s.n, part_len(hd));
        let width = nq / group * hd; // every kv head the heads read
        let need = nq * n + TB * width;
        if scratch.len() < need {
            scratch.resize(need, 0.0);
        }
        let (scores, tile) = scratch.split_at_mut(nq * n); // [nq, n], [TB, width]
        // The split's first rows, then each block's values for the second pass (as the AVX-512
        // kernel does).
        super::prefetch(s.keys, s.stride, s.off, width, s.row0, s.row0 + AHEAD.min(n));
        for t0 in (0..n).step_by(TB) {
            let nt = TB.min(n - t0);
            super::prefetch_l2(s.vals, s.stride, s.off, width, s.row0 + t0, s.row0 + t0 + nt);
            // SAFETY: rows s.row0 + t0 .. + nt lie inside the keys (checked); tile holds TB · width.
            let b = unsafe { block(s.keys, s.stride, s.off, width, s.row0 + t0, nt, tile) };
            for (h, qh) in q.chunks_exact(hd).enumerate() {
                let (rows, dst) = (b.ptr.wrapping_add(h / group * hd), &mut scores[h * n + t0..h * n + t0 + nt]);
                // SAFETY: the block's nt rows hold width values from b.ptr, kv head h / group at
                // (h / group) · hd; scores row h has n >= t0 + nt values.
                unsafe {
                    if hd == 64 { scores_head64(qh, rows, b.stride, dst) } else { scores_head(qh, rows, b.stride, nt, dst) }
                }
            }
        }
        for (sh, oh) in scores.chunks_exact_mut(n).zip(out.chunks_exact_mut(pl)) {
            match rule.softcap {
                None => {
                    let sc = _mm256_set1_ps(rule.scale);
                    let n8 = n / 8 * 8;
                    for i in (0..n8).step_by(8) {
                        // SAFETY: i + 8 <= n values of sh.
                        unsafe {
                            _mm256_storeu_ps(sh.as_mut_ptr().add(i), _mm256_mul_ps(_mm256_loadu_ps(sh.as_ptr().add(i)), sc))
                        };
                    }
                    sh[n8..].iter_mut().for_each(|x| *x = rule.score(*x));
                }
                Some(_) => sh.iter_mut().for_each(|x| *x = rule.score(*x)),
            }
            // SAFETY: AVX2, FMA and F16C available.
            let (m, l) = unsafe { softmax_part(sh, rule.exp) };
            oh[0] = m;
            oh[1] = l;
            oh[2..].fill(0.0);
        }
        for t0 in (0..n).step_by(TB) {
            let nt = TB.min(n - t0);
            // SAFETY: rows s.row0 + t0 .. + nt lie inside the values (checked).
            let b = unsafe { block(s.vals, s.stride, s.off, width, s.row0 + t0, nt, tile) };
            // Heads in pairs of the same kv head share each value row's load; a group of odd
            // size leaves its last head alone.
            let mut h = 0;
            while h < nq {
                let ph = &scores[h * n + t0..h * n + t0 + nt];
                let rows = b.ptr.wrapping_add(h / group * hd);
                if h + 1 < nq && (h + 1) / group == h / group {
                    let (o0, o1) = out[h * pl..(h + 2) * pl].split_at_mut(pl);
                    // SAFETY: as the scores' pass; o0[2..], o1[2..] hold hd sums each.
                    unsafe {
                        acc_pair(ph, &scores[(h + 1) * n + t0..(h + 1) * n + t0 + nt], rows, b.stride, &mut o0[2..], &mut o1[2..])
                    };
                    h += 2;
                } else {
                    // SAFETY: as the scores' pass; out[h] holds hd sums after m and l.
                    unsafe { acc_head(ph, rows, b.stride, &mut out[h * pl + 2..(h + 1) * pl]) };
                    h += 1;
                }
            }
        }
    }

    /// The two rows' 16-lane dot products with q (`super::dot_lanes`' accumulators, lanes 0..8
    /// and 8..16 in two registers each), each folded to `hsum_scalar`'s first step: s8[i] =
    /// v[i] + v[i + 8] with v = a0 + a1.
    ///
    /// # Safety
    /// AVX2 and FMA; r0 and r1 valid for q.len() reads; q.len() % 16 == 0.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot2(q: &[f32], r0: *const f32, r1: *const f32) -> (__m256, __m256) {
        let n = q.len();
        let qp = q.as_ptr();
        let mut a = [_mm256_setzero_ps(); 4];
        let mut b = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        // SAFETY (whole block): i + 32 <= n (or i + 16 <= n) inside q and both rows.
        unsafe {
            while i + 32 <= n {
                for c in 0..4 {
                    let qv = _mm256_loadu_ps(qp.add(i + 8 * c));
                    a[c] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(r0.add(i + 8 * c)), a[c]);
                    b[c] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(r1.add(i + 8 * c)), b[c]);
                }
                i += 32;
            }
            if i + 16 <= n {
                for c in 0..2 {
                    let qv = _mm256_loadu_ps(qp.add(i + 8 * c));
                    a[c] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(r0.add(i + 8 * c)), a[c]);
                    b[c] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(r1.add(i + 8 * c)), b[c]);
                }
            }
        }
        // a[0], a[1]: a0's lanes 0..8, 8..16; a[2], a[3]: a1's.
        (
            _mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[1], a[3])),
            _mm256_add_ps(_mm256_add_ps(b[0], b[2]), _mm256_add_ps(b[1], b[3])),
        )
    }

    /// `hsum_scalar`'s remaining steps for eight rows at once: x[r] holds row r's s8; lane r of
    /// the result is (s4[0] + s4[2]) + (s4[1] + s4[3]) with s4[i] = s8[i] + s8[i + 4].
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn reduce8(x: &[__m256; 8]) -> __m256 {
        // y[r]: row r's s4 in the low half, row r + 4's in the high half.
        let mut y = [_mm256_setzero_ps(); 4];
        for (r, v) in y.iter_mut().enumerate() {
            *v = _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(x[r], x[r + 4]), _mm256_permute2f128_ps::<0x31>(x[r], x[r + 4]));
        }
        // Per half: [s4[0] + s4[2] of rows 0, 1, then s4[1] + s4[3] of rows 0, 1] (and 2, 3).
        let p = _mm256_add_ps(_mm256_unpacklo_ps(y[0], y[1]), _mm256_unpackhi_ps(y[0], y[1]));
        let r = _mm256_add_ps(_mm256_unpacklo_ps(y[2], y[3]), _mm256_unpackhi_ps(y[2], y[3]));
        _mm256_add_ps(_mm256_shuffle_ps::<0x44>(p, r), _mm256_shuffle_ps::<0xEE>(p, r))
    }

    /// Unscaled scores of one head q [hd] against nt <= 16 rows `stride` apart: out[t].
    ///
    /// # Safety
    /// AVX2 and FMA; rows valid for (nt - 1) · stride + hd reads; out.len() == nt <= 16.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scores_head(q: &[f32], rows: *const f32, stride: usize, nt: usize, out: &mut [f32]) {
        let mut s8 = [[_mm256_setzero_ps(); 8]; 2];
        let mut t = 0;
        while t < nt {
            // An odd last row pairs with itself (its second result unused).
            let t1 = if t + 1 < nt { t + 1 } else { t };
            // SAFETY: rows t, t1 < nt.
            let (x0, x1) = unsafe { dot2(q, rows.add(t * stride), rows.add(t1 * stride)) };
            s8[t / 8][t % 8] = x0;
            s8[t1 / 8][t1 % 8] = x1;
            t += 2;
        }
        let mut sums = [0f32; 16];
        for (b, x) in s8.iter().enumerate().take(nt.div_ceil(8)) {
            // SAFETY: sums holds 16 values.
            unsafe { _mm256_storeu_ps(sums.as_mut_ptr().add(8 * b), reduce8(x)) };
        }
        out.copy_from_slice(&sums[..nt]);
    }

    /// `scores_head` for head size 64, q in eight registers (each row's values loaded once, one
    /// load per FMA); the same arithmetic as `dot2` row by row.
    ///
    /// # Safety
    /// AVX2 and FMA; rows valid for (out.len() - 1) · stride + 64 reads; q.len() == 64,
    /// out.len() <= 16.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scores_head64(q: &[f32], rows: *const f32, stride: usize, out: &mut [f32]) {
        let mut qv = [_mm256_setzero_ps(); 8];
        for (c, v) in qv.iter_mut().enumerate() {
            // SAFETY: 8 · c + 8 <= 64 values of q.
            *v = unsafe { _mm256_loadu_ps(q.as_ptr().add(8 * c)) };
        }
        let nt = out.len();
        let mut s8 = [[_mm256_setzero_ps(); 8]; 2];
        for t in 0..nt {
            let r = rows.wrapping_add(t * stride);
            // SAFETY: row t < nt holds 64 values from r.
            let a = unsafe {
                let mut a = [_mm256_setzero_ps(); 4];
                for c in 0..4 {
                    a[c] = _mm256_fmadd_ps(qv[c], _mm256_loadu_ps(r.add(8 * c)), a[c]);
                }
                for c in 0..4 {
                    a[c] = _mm256_fmadd_ps(qv[4 + c], _mm256_loadu_ps(r.add(32 + 8 * c)), a[c]);
                }
                a
            };
            s8[t / 8][t % 8] = _mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[1], a[3]));
        }
        let mut sums = [0f32; 16];
        for (b, x) in s8.iter().enumerate().take(nt.div_ceil(8)) {
            // SAFETY: sums holds 16 values.
            unsafe { _mm256_storeu_ps(sums.as_mut_ptr().add(8 * b), reduce8(x)) };
        }
        out.copy_from_slice(&sums[..nt]);
    }

    /// `acc_head` for two heads reading the same rows (p0 into o0, p1 into o1): 32 values of a
    /// row loaded once for both, the same FMAs per value in the same order.
    ///
    /// # Safety
    /// AVX2 and FMA; rows valid for (p0.len() - 1) · stride + o0.len() reads; p1.len() ==
    /// p0.len(); o1.len() == o0.len(), a multiple of 16.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn acc_pair(p0: &[f32], p1: &[f32], rows: *const f32, stride: usize, o0: &mut [f32], o1: &mut [f32]) {
        let hd = o0.len();
        let mut c0 = 0;
        // SAFETY (whole block): columns c0..c0 + 8·NV <= hd of each row, o0 and o1.
        unsafe {
            while c0 + 32 <= hd {
                acc_cols2::<4>(p0, p1, rows.add(c0), stride, o0.as_mut_ptr().add(c0), o1.as_mut_ptr().add(c0));
                c0 += 32;
            }
            if c0 < hd {
                acc_cols2::<2>(p0, p1, rows.add(c0), stride, o0.as_mut_ptr().add(c0), o1.as_mut_ptr().add(c0));
            }
        }
    }

    /// `acc_pair` for the 8·NV values from `rows`, `o0` and `o1`.
    ///
    /// # Safety
    /// As `acc_pair`, for 8·NV values.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn acc_cols2<const NV: usize>(p0: &[f32], p1: &[f32], rows: *const f32, stride: usize, o0: *mut f32, o1: *mut f32) {
        let mut a0 = [_mm256_setzero_ps(); NV];
        let mut a1 = [_mm256_setzero_ps(); NV];
        // SAFETY (whole block): as promised by the caller.
        unsafe {
            for v in 0..NV {
                a0[v] = _mm256_loadu_ps(o0.add(8 * v));
                a1[v] = _mm256_loadu_ps(o1.add(8 * v));
            }
            for (t, (&x0, &x1)) in p0.iter().zip(p1).enumerate() {
                let (b0, b1) = (_mm256_set1_ps(x0), _mm256_set1_ps(x1));
                let r = rows.add(t * stride);
                for v in 0..NV {
                    let x = _mm256_loadu_ps(r.add(8 * v));
                    a0[v] = _mm256_fmadd_ps(b0, x, a0[v]);
                    a1[v] = _mm256_fmadd_ps(b1, x, a1[v]);
                }
            }
            for v in 0..NV {
                _mm256_storeu_ps(o0.add(8 * v), a0[v]);
                _mm256_storeu_ps(o1.add(8 * v), a1[v]);
            }
        }
    }

    /// out[d] = fma(p[t], rows[t][d], out[d]) for t < nt in order, 64 values at a time in
    /// registers.
    ///
    /// # Safety
    /// AVX2 and FMA; rows valid for (p.len() - 1) · stride + out.len() reads; out.len() % 16 == 0.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn acc_head(p: &[f32], rows: *const f32, stride: usize, out: &mut [f32]) {
        let hd = out.len();
        let mut c0 = 0;
        // SAFETY (whole block): columns c0..c0 + 8·NV <= hd of each row and of out.
        unsafe {
            while c0 + 64 <= hd {
                acc_cols::<8>(p, rows.add(c0), stride, out.as_mut_ptr().add(c0));
                c0 += 64;
            }
            match (hd - c0) / 8 {
                6 => acc_cols::<6>(p, rows.add(c0), stride, out.as_mut_ptr().add(c0)),
                4 => acc_cols::<4>(p, rows.add(c0), stride, out.as_mut_ptr().add(c0)),
                2 => acc_cols::<2>(p, rows.add(c0), stride, out.as_mut_ptr().add(c0)),
                _ => {}
            }
        }
    }

    /// `acc_head` for the 8·NV values from `rows` and `out`.
    ///
    /// # Safety
    /// As `acc_head`, for 8·NV values.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn acc_cols<const NV: usize>(p: &[f32], rows: *const f32, stride: usize, out: *mut f32) {
        // No closures here: they would not inherit the target features (each intrinsic a call).
        let mut acc = [_mm256_setzero_ps(); NV];
        // SAFETY (whole block): as promised by the caller.
        unsafe {
            for (v, a) in acc.iter_mut().enumerate() {
                *a = _mm256_loadu_ps(out.add(8 * v));
            }
            for (t, &pt) in p.iter().enumerate() {
                let pb = _mm256_set1_ps(pt);
                let r = rows.add(t * stride);
                for (v, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(pb, _mm256_loadu_ps(r.add(8 * v)), *a);
                }
            }
            for (v, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(out.add(8 * v), *a);
            }
        }
    }

    /// `super::max_of` on 8 lanes (the maximum does not depend on the order; its zero is +0).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn max_of(s: &[f32]) -> f32 {
        let n8 = s.len() / 8 * 8;
        let mut mv = _mm256_set1_ps(f32::NEG_INFINITY);
        for i in (0..n8).step_by(8) {
            // SAFETY: i + 8 <= s.len().
            mv = _mm256_max_ps(mv, unsafe { _mm256_loadu_ps(s.as_ptr().add(i)) });
        }
        let mut lanes = [0f32; 8];
        // SAFETY: lanes holds 8 values.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), mv) };
        super::max_of(&lanes).max(super::max_of(&s[n8..]))
    }

    /// m, p = exp(s − m) in place, l: `super::softmax_part_scalar`'s arithmetic on 8 lanes (its
    /// 16 lane sums in two registers).
    ///
    /// # Safety
    /// AVX2, FMA and F16C available.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn softmax_part(s: &mut [f32], exp: Exp) -> (f32, f32) {
        let m = max_of(s);
        let n8 = s.len() / 8 * 8;
        let sp = s.as_mut_ptr();
        let mut acc = [_mm256_setzero_ps(); 2];
        match exp {
            Exp::Fast => {
                let mv = _mm256_set1_ps(m);
                for i in (0..n8).step_by(8) {
                    // SAFETY: i + 8 <= s.len().
                    unsafe {
                        let e = expf8(_mm256_sub_ps(_mm256_loadu_ps(sp.add(i)), mv));
                        _mm256_storeu_ps(sp.add(i), e);
                        acc[i / 8 % 2] = _mm256_add_ps(acc[i / 8 % 2], e);
                    }
                }
                s[n8..].iter_mut().for_each(|x| *x = super::expf_ggml(*x - m));
            }
            Exp::Libm => {
                s.iter_mut().for_each(|x| *x = (*x - m).exp());
                for i in (0..n8).step_by(8) {
                    // SAFETY: i + 8 <= s.len().
                    acc[i / 8 % 2] = _mm256_add_ps(acc[i / 8 % 2], unsafe { _mm256_loadu_ps(sp.add(i)) });
                }
            }
        }
        // The tail's lanes (p >= 0, so the zero lanes leave the sums as they are).
        let mut lanes = [0f32; 16];
        // SAFETY: lanes holds 16 values.
        unsafe {
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc[1]);
        }
        for (t, &x) in s.iter().enumerate().skip(n8) {
            lanes[t % 16] += x;
        }
        (m, super::hsum_scalar(lanes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cortiq_testkit::XorShift;

    fn rnd(n: usize, seed: &mut XorShift) -> Vec<f32> {
        (0..n).map(|_| seed.f()).collect()
    }

    /// Every stored type, head size, group size, split length and rule: the SIMD kernel equals
    /// its scalar twin bit for bit.
    #[test]
    fn attend_split_matches_its_scalar_twin_bit_for_bit() {
        let mut seed = XorShift(7u64);
        for &hd in &[64usize, 128, 256, 96, 80] {
            for &(g, nkv) in &[(1usize, 1usize), (3, 2), (7, 2), (4, 1)] {
                let stride = nkv * hd;
                let rows = 300;
                let kf = rnd(rows * stride, &mut seed);
                let vf = rnd(rows * stride, &mut seed);
                let kh: Vec<f16> = kf.iter().map(|&x| f16::from_f32(x)).collect();
                let vh: Vec<f16> = vf.iter().map(|&x| f16::from_f32(x)).collect();
                let (mut kq, mut kd, mut vq, mut vd) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                let q8 = hd % Q8_BLOCK == 0;
                if q8 {
                    quantize_q8(&kf, &mut kq, &mut kd);
                    quantize_q8(&vf, &mut vq, &mut vd);
                }
                let q_all: Vec<f32> = rnd(nkv * g * hd, &mut seed).iter().map(|x| x * 3.0).collect();
                let q = &q_all[..g * hd];
                let mut kinds = vec![(KvRows::F32(&kf), KvRows::F32(&vf)), (KvRows::F16(&kh), KvRows::F16(&vh))];
                if q8 {
                    kinds.push((KvRows::Q8 { q: &kq, d: &kd }, KvRows::Q8 { q: &vq, d: &vd }));
                }
                for (keys, vals) in kinds {
                    for &(row0, n) in &[(0usize, 1usize), (5, 16), (17, 33), (40, 256), (0, 300)] {
                        for kvh in 0..nkv {
                            for rule in [
                                ScoreRule { scale: 0.125, softcap: None, exp: Exp::Fast },
                                ScoreRule { scale: 0.125, softcap: Some(5.0), exp: Exp::Libm },
                            ] {
                                // One kv head's group, or all kv heads from the first (every group).
                                let (off, qs) =
                                    if kvh + 1 < nkv || nkv == 1 { (kvh * hd, &q[..g * hd]) } else { (0, &q_all[..]) };
                                let s = Split { keys, vals, stride, off, row0, n };
                                let nq = qs.len() / hd;
                                let (mut a, mut b) = (vec![0f32; nq * part_len(hd)], vec![0f32; nq * part_len(hd)]);
                                let mut scratch = Vec::new();
                                attend_split(qs, hd, g, &s, &rule, &mut scratch, &mut a);
                                attend_split_scalar(qs, hd, g, &s, &rule, &mut b);
                                let bad = a.iter().zip(&b).position(|(x, y)| x.to_bits() != y.to_bits());
                                assert!(
                                    bad.is_none(),
                                    "hd {hd} g {g} {keys:?} rows {row0}+{n}: value {} differs: {} vs {}",
                                    bad.unwrap(),
                                    a[bad.unwrap()],
                                    b[bad.unwrap()]
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// Splitting the keys and merging equals a one-pass softmax attention in f64 (to f32
    /// rounding), whatever the cut.
    #[test]
    fn merged_splits_equal_the_softmax_attention() {
        let mut seed = XorShift(3u64);
        let (hd, n) = (64, 200);
        let k = rnd(n * hd, &mut seed);
        let v = rnd(n * hd, &mut seed);
        let q: Vec<f32> = rnd(hd, &mut seed).iter().map(|x| x * 4.0).collect();
        let s: Vec<f64> = (0..n).map(|t| (0..hd).map(|d| q[d] as f64 * k[t * hd + d] as f64).sum::<f64>() * 0.125).collect();
        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = w.iter().sum();
        let want: Vec<f64> = (0..hd).map(|d| (0..n).map(|t| w[t] * v[t * hd + d] as f64).sum::<f64>() / z).collect();
        let rule = ScoreRule { scale: 0.125, softcap: None, exp: Exp::Fast };
        for cuts in [vec![0, 200], vec![0, 64, 200], vec![0, 1, 100, 199, 200]] {
            let parts: Vec<Vec<f32>> = cuts
                .windows(2)
                .map(|c| {
                    let s =
                        Split { keys: KvRows::F32(&k), vals: KvRows::F32(&v), stride: hd, off: 0, row0: c[0], n: c[1] - c[0] };
                    let mut out = vec![0f32; part_len(hd)];
                    attend_split(&q, hd, 1, &s, &rule, &mut Vec::new(), &mut out);
                    out
                })
                .collect();
            let mut o = vec![0f32; hd];
            merge(parts.iter().map(|p| &p[..]), Exp::Fast, &mut o);
            let worst = o.iter().zip(&want).map(|(a, b)| (*a as f64 - b).abs()).fold(0.0, f64::max);
            assert!(worst < 2e-6, "cuts {cuts:?}: max |diff| {worst:.2e} from f64");
        }
    }

    /// `merge` (FMA where the CPU has it) equals its scalar twin bit for bit.
    #[test]
    fn merge_matches_its_scalar_twin_bit_for_bit() {
        let mut seed = XorShift(11u64);
        for hd in [1usize, 16, 64, 72, 256] {
            for n_parts in [1usize, 2, 3, 129] {
                let parts: Vec<Vec<f32>> = (0..n_parts)
                    .map(|j| {
                        let mut p = rnd(hd + 2, &mut seed);
                        p[0] *= 20.0;
                        p[1] = p[1].abs() * (j + 1) as f32;
                        p
                    })
                    .collect();
                for exp in [Exp::Fast, Exp::Libm] {
                    let (mut a, mut b) = (vec![0f32; hd], vec![0f32; hd]);
                    merge(parts.iter().map(|p| &p[..]), exp, &mut a);
                    merge_scalar(parts.iter().map(|p| &p[..]), exp, &mut b);
                    let bad = a.iter().zip(&b).position(|(x, y)| x.to_bits() != y.to_bits());
                    assert!(bad.is_none(), "hd {hd}, {n_parts} parts, {exp:?}: value {bad:?} differs: {a:?} vs {b:?}");
                }
            }
        }
    }

    /// The transform is orthonormal and its own inverse: dot products survive it, twice is the
    /// identity.
    #[test]
    fn hadamard_keeps_dot_products_and_undoes_itself() {
        let mut seed = XorShift(5u64);
        for r in [1usize, 2, 32, 64, 256] {
            let (a, b) = (rnd(2 * 256, &mut seed), rnd(2 * 256, &mut seed));
            let (mut ha, mut hb) = (a.clone(), b.clone());
            hadamard(&mut ha, r);
            hadamard(&mut hb, r);
            let dot = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(p, q)| *p as f64 * *q as f64).sum::<f64>();
            assert!((dot(&a, &b) - dot(&ha, &hb)).abs() < 1e-4, "r {r}: dot {} vs {}", dot(&a, &b), dot(&ha, &hb));
            hadamard(&mut ha, r);
            let worst = a.iter().zip(&ha).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(worst < 1e-5, "r {r}: twice is {worst} from the identity");
        }
    }

    /// The AVX2 exponential equals its scalar lane function on every kind of input: normal and
    /// subnormal results, underflow to 0, overflow to ∞.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_exp_is_the_scalar_exp_bit_for_bit() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")) {
            eprintln!("no AVX2: nothing to compare");
            return;
        }
        let mut x: Vec<f32> = (0..40_000).map(|i| -200.0 + i as f32 * 0.0071).collect();
        x.extend([0.0, -0.0, 88.7, 89.0, -87.3, -103.9, -149.5, -1e-30, f32::MIN_POSITIVE, 1e6, -1e6]);
        x.resize(x.len().next_multiple_of(8), 1.0);
        for c in x.chunks_exact(8) {
            let mut got = [0f32; 8];
            // SAFETY: AVX2, FMA and F16C detected above; got holds 8 values.
            unsafe {
                use std::arch::x86_64::*;
                _mm256_storeu_ps(got.as_mut_ptr(), avx2::expf8(_mm256_loadu_ps(c.as_ptr())));
            }
            for (a, &v) in got.iter().zip(c) {
                assert_eq!(a.to_bits(), expf_ggml(v).to_bits(), "exp({v}): {a} vs {}", expf_ggml(v));
            }
        }
    }

    #[test]
    fn q8_rows_round_trip_within_half_a_step() {
        let mut seed = XorShift(11u64);
        let x = rnd(4 * 64, &mut seed);
        let (mut q, mut d) = (Vec::new(), Vec::new());
        quantize_q8(&x, &mut q, &mut d);
        assert_eq!((q.len(), d.len()), (256, 8));
        let y = dequantize_q8(&q, &d);
        for (i, (a, b)) in x.iter().zip(&y).enumerate() {
            assert!((a - b).abs() <= d[i / Q8_BLOCK] * 0.5 + 1e-7, "value {i}: {a} -> {b}");
        }
        let (mut q0, mut d0) = (Vec::new(), Vec::new());
        quantize_q8(&[0.0; 32], &mut q0, &mut d0);
        assert!(q0.iter().all(|&v| v == 0) && d0 == [0.0]);
    }
}

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

/// Rows per block of both SIMD kernels: one tile of converted rows (and, for AVX-512, one
/// transposed horizontal sum of scores).
const TB: usize = 16;
/// Rows ahead of the block in use that the kernels' passes prefetch.
const AHEAD: usize = 8 * TB;

/// Where a kernel's block of rows is read as f32: in place (an f32 cache) or in its tile.
struct Block {
    ptr: *const f32,
    stride: usize,
}

#[track_caller]
fn check(q: &[f32], hd: usize, group: usize, s: &Split, out: &[f32]) -> usize {
    assert!(hd > 0 && q.len().is_multiple_of(hd) && !q.is_empty(), "attend_split: q {} values for head_dim {hd}", q.len());
    let g = q.len() / hd;
    assert!(group > 0 && g.is_multiple_of(group), "attend_split: {g} heads in groups of {group}");
    let width = g / group * hd;
    assert!(s.n > 0, "attend_split: an empty split");
    assert!(s.off + width <= s.stride, "attend_split: heads at {} + {width} past the row stride {}", s.off, s.stride);
    let end = (s.row0 + s.n - 1) * s.stride + s.off + width;
    for (what, r) in [("keys", &s.keys), ("values", &s.vals)] {
        assert!(r.len() >= end, "attend_split: {what} hold {} values, the split needs {end}", r.len());
        if let KvRows::Q8 { q, d } = r {
            assert!(
                s.stride.is_multiple_of(Q8_BLOCK) && s.off.is_multiple_of(Q8_BLOCK) && hd.is_multiple_of(Q8_BLOCK),
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
        Level::Avx2 if hd.is_multiple_of(16) => unsafe { avx2::attend_split(q, hd, group, s, rule, scratch, out) },
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
    merge_scalar(parts, exp, out)
}

/// Scalar twin of `merge`, bit for bit (inlined into `merge_fma`, where it takes FMA).
#[inline(always)]
pub fn merge_scalar<'a>(parts: impl Iterator<Item = &'a [f32]> + Clone, exp: Exp, out: &mut [f32]) {
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
    assert!(x.len().is_multiple_of(Q8_BLOCK), "quantize_q8: {} values are not whole blocks of {Q8_BLOCK}", x.len());
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
    assert!(r.is_power_of_two() && x.len().is_multiple_of(r), "hadamard: {} values in blocks of {r}", x.len());
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
mod avx512;

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
///
/// The twin's bits throughout.
#[cfg(target_arch = "x86_64")]
mod avx2;

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

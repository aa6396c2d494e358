//! AVX-512 (BW + VL + VNNI, with AVX2/FMA/F16C) twins of the integer dot products in
//! `vecdot.rs`, which stay the reference forever.
//!
//! Owns: one kernel per weight type (the lookup-table types IQ4_NL, IQ4_XS and MXFP4 included,
//! two blocks per 512-bit register; the 2-/3-bit grid types' kernel is in `iq23_simd.rs`), each generic over R rows sharing one activation row
//! (`vec_dot` runs R = 1, `matvec` R = 4) and over the float order K (`vecdot::Order`: ggml's
//! vec_dot, or llama.cpp's repacked gemv / gemm kernels for Q4_0/Q4_K/Q2_K), the activation
//! quantizers, and the
//! run-time dispatch (which also routes cortiq's own q8r / q4t / q1 to `own_avx512.rs`). The only `unsafe` of the vecdot module lives here; every block says why it
//! is sound.
//!
//! Bit-identity with the scalar twins (and so with ggml's x86 kernels) is by construction: the
//! integer work per block lands in the same 8 i32 lanes (lane l owns bytes 4l..4l+3 of each
//! 32-element chunk: `vpdpbusd`, or `vpmaddubsw` + `vpmaddwd` with the scale, exactly ggml's
//! instruction choice), those integers are exact whatever the order, and the float steps are the
//! same per-block FMA sequence into an 8-lane accumulator followed by the same final reduction.
//! tests/vecdot.rs checks 0-ulp equality on random rows and against ggml's own outputs.
//!
//! Measured with examples/vecdot_bench.rs (AMD EPYC with AVX-512 VNNI, 2 shared cores under load
//! ~8, so ratios matter more than absolutes; 256 x 2048, cache-resident), G weights/s, scalar
//! twin -> 4-row kernel: Q8_0 1.7 -> 52, Q4_1 1.5 -> 32, Q5_0 1.3 -> 27, Q4_K 2.6 -> 48,
//! Q6_K 2.8 -> 51 (the dequantize-then-f32-dot path: 4.2-4.6). Quantizing a 2048 activation row:
//! 0.2 us (Q8_0) / 0.4 us (Q8_K), 10x the scalar twin. The lookup-table types (2026-12-06, an
//! Intel Xeon with AVX-512 VNNI, 2 cores shared with builds; same shape, one row at a time as
//! this size streams): IQ4_NL 1.0 -> 18, IQ4_XS 1.2 -> 22, MXFP4 1.1 -> 19 (their AVX2 twins 13,
//! 18, 12.5; Q4_0 15 on the same run). Taking each pair's two `dy * dx` as one 128-bit multiply
//! instead of two scalar f16 conversions and broadcasts, and IQ4_XS's scales in vector form,
//! gave 1.3-1.4x of that: the f16 work had been half the uops.
//!
//! The 4-row kernel is where the speed comes from: one row's blocks form a serial FMA chain (one
//! FMA per block, ~4 cycles of latency each), which is the order ggml uses and so must be kept;
//! four rows give the core four independent chains and reuse every activation load four times.
//!
//! Activation rows must come from `quantize_act` (i8 quants in -127..127, as ggml's): the
//! sign trick of the legacy kernels (`|x| * sign(y, x)`, ggml's too) would wrap a -128.

use super::QuantType;
use super::vecdot::{Order, Reads};
use std::sync::OnceLock;

static AVAILABLE: OnceLock<bool> = OnceLock::new();

/// Whether this CPU runs the AVX-512 VNNI dot products (and `CORTIQ_SIMD` is not `scalar`).
pub fn available() -> bool {
    *AVAILABLE.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            crate::simd::avx512bw()
                && std::is_x86_feature_detected!("avx512vnni")
                && std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// One row's dot product, or `None` when there is no kernel on this machine (or no such order
/// for this type). Lengths were checked by the caller (`vecdot::check`).
pub(super) fn dispatch(ty: QuantType, w: &[u8], a: &[u8], order: Order) -> Option<f32> {
    #[cfg(target_arch = "x86_64")]
    {
        if available() {
            // SAFETY: available() confirmed every feature `imp::rows` enables on this CPU.
            // Block counts come from slice lengths, every load is bounds-checked.
            let r = unsafe { rows_in(ty, order, [w], a) };
            return r.map(|r| r[0]);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (ty, w, a, order);
    None
}

/// `imp::rows` with the order as a run-time value (its const parameter K).
///
/// # Safety
/// As `imp::rows`: the CPU must have the features `available()` checks.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn rows_in<const R: usize>(ty: QuantType, order: Order, ws: [&[u8]; R], a: &[u8]) -> Option<[f32; R]> {
    // SAFETY: the caller's contract is `imp::rows`'s.
    unsafe {
        match order {
            Order::VecDot => imp::rows::<R, 0>(ty, ws, a),
            Order::RepackGemv => imp::rows::<R, 1>(ty, ws, a),
            Order::RepackGemm => imp::rows::<R, 2>(ty, ws, a),
            Order::Tiled => imp::rows::<R, 3>(ty, ws, a),
        }
    }
}

/// How far ahead of the row being multiplied the matvec loops prefetch, in bytes, on AMD's
/// AVX-512 CPUs. Weights come from a memory map of the page cache in 4 KiB pages, and the
/// hardware prefetchers stop at every page boundary: without this, decode read such weights at
/// ~37 GB/s where the same loop over anonymous (huge-page) memory reads ~60 GB/s (5562a9f).
const PREFETCH_AHEAD: usize = 8192;

/// The same distance on Intel's AVX-512 CPUs (2026-12-06, Intel Xeon Emerald Rapids, 2 threads,
/// examples/expert_stream: Q4_K matvecs over 0.9 MB expert matrices, alternated). The machine
/// went through two states: in one, 2 and 8 KiB streamed alike (24-25 GB/s of weights); in the
/// other, 8 KiB throttled the stream to 13.8-14.6 GB/s where 2 KiB kept 21.7-23.5 (and no
/// prefetch 18.7-20.7). 2 KiB was never the slower.
const PREFETCH_AHEAD_INTEL: usize = 2048;

/// The same distance on the AVX2 tier, whose kernels consume bytes more slowly: 8192 bytes ahead
/// left the streamed Q4_K/Q6_K decode at ~60% of its cache-resident speed (2026-12-05, AMD EPYC
/// Zen 4 under CORTIQ_SIMD=avx2, multivec_bench 151936 1536, one thread: Q4_K 7.96 -> 5.68 ms,
/// Q6_K 9.43 -> 7.33 ms at 2048; the Qwen2.5-1.5B-geometry decode, 2 threads, 28.7 -> 34.2 tok/s).
const PREFETCH_AHEAD_AVX2: usize = 2048;

/// No software prefetch on AMD's Zen 4 (CPU family 25 with AVX-512): the weights sit in 2 MiB
/// pages now (the interleaved copies in anonymous huge pages, a mapped file's pages read in as
/// 2 MiB pages at load), which the hardware prefetchers follow, and the prefetches 8 KiB ahead
/// only took load slots (2026-12-08, AMD EPYC Zen 4, `cortiq bench -p 0 -n 64 -r 2`,
/// `CORTIQ_PREFETCH_AHEAD=8192` against 0 alternated three times, tok/s: the Qwen3-30B-A3B
/// geometry at 4 layers 68.4 -> 87.5 (2048: 80.7), Granite-4.0-H-Tiny 87 -> 114, gpt-oss-20b
/// MXFP4 43.3 -> 52.3, LFM2-8B-A1B 43.8 -> 44.9, Gemma 3 270M Q4_K_M 105 -> 117, the ¾ window
/// hybrid of Qwen2.5-Coder-0.5B 69 -> 72, the full-size Qwen3-30B-A3B GGUF's row-major
/// experts on the map 17.1 -> 17.8). Zen 5 (family 26) keeps `PREFETCH_AHEAD`.
const PREFETCH_AHEAD_ZEN4: usize = 0;

/// The prefetch distance of this process, chosen once from the SIMD level and the CPU's vendor;
/// `CORTIQ_PREFETCH_AHEAD=BYTES` (0..=65536) overrides it (to measure another distance on a
/// CPU, examples/expert_stream). Speed only: a prefetch never changes a value.
pub(super) fn prefetch_distance() -> usize {
    static D: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *D.get_or_init(|| {
        if let Ok(v) = std::env::var("CORTIQ_PREFETCH_AHEAD") {
            match v.parse::<usize>() {
                Ok(b) if b <= 65536 => return b,
                _ => eprintln!("warning: CORTIQ_PREFETCH_AHEAD={v:?} is not a byte count in 0..=65536: ignored"),
            }
        }
        if crate::simd::level() == crate::simd::Level::Avx2 {
            PREFETCH_AHEAD_AVX2
        } else if intel() {
            PREFETCH_AHEAD_INTEL
        } else if amd_family() == 25 {
            PREFETCH_AHEAD_ZEN4
        } else {
            PREFETCH_AHEAD
        }
    })
}

/// The CPU's family (CPUID leaf 1: the base family, plus the extended family where the base is
/// 15) on AMD's CPUs, 0 on any other vendor's.
fn amd_family() -> u32 {
    #[cfg(target_arch = "x86_64")]
    if &vendor() == b"AuthenticAMD" {
        let eax = std::arch::x86_64::__cpuid(1).eax;
        let base = (eax >> 8) & 0xF;
        return if base == 0xF { base + ((eax >> 20) & 0xFF) } else { base };
    }
    0
}

/// Whether the CPU's vendor string (CPUID leaf 0) is Intel's.
fn intel() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        &vendor() == b"GenuineIntel"
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The CPU's vendor string (CPUID leaf 0).
#[cfg(target_arch = "x86_64")]
fn vendor() -> [u8; 12] {
    let r = std::arch::x86_64::__cpuid(0);
    let mut v = [0u8; 12];
    v[..4].copy_from_slice(&r.ebx.to_le_bytes());
    v[4..8].copy_from_slice(&r.edx.to_le_bytes());
    v[8..].copy_from_slice(&r.ecx.to_le_bytes());
    v
}

/// Prefetch (into all cache levels) the lines of `w[start + prefetch_distance() ..][..len]`
/// that exist: called once per row with the row's start and length, it keeps a sliding window
/// of that many bytes in flight ahead of the kernel.
#[inline(always)]
pub(super) fn prefetch_ahead(w: &[u8], start: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let ahead = prefetch_distance();
        if ahead == 0 {
            return;
        }
        let from = start + ahead;
        let to = (from + len).min(w.len());
        let mut off = from;
        while off < to {
            // SAFETY: off < w.len(), so the address is inside the slice; a prefetch never
            // faults and writes nothing.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(w.as_ptr().add(off).cast()) };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (w, start, len);
}

/// `y[r] = dot(row r, a)` for rows of `rb` bytes stored back to back; `false` (nothing written)
/// when `dispatch` would return `None`. Lengths were checked by the caller.
///
/// One row at a time, front to back: a single sequential stream. Interleaving 2-4 rows (sharing
/// each activation load) is ~1.5x faster while the weights sit in cache, but streaming from
/// memory the interleaved streams defeat this CPU's hardware prefetcher and run 2-4x *slower*
/// (examples/vecdot_bench, 262144 x 640 Q8_0: 28 G weights/s one row, 7-8 with 2 or 4). Decode
/// streams every weight from memory once per token, so the single stream wins; a tile the
/// caller keeps in cache (`Reads::Tile`) goes four rows at a time.
///
/// The caller says which, not the slice's size: a size bound (256 KiB) took every piece of the
/// decode's balanced split (`PIECE_BYTES`, 256 KiB) for a cached tile, and a mixture's
/// row-major Q6_K experts streamed four rows at a time without prefetch at ~9 GB/s (2026-12-08,
/// AMD EPYC Zen 4, the Qwen3-30B-A3B-geometry GGUF on the map: tg32 11 -> 14-17 tok/s).
pub(super) fn matvec(ty: QuantType, w: &[u8], rb: usize, a: &[u8], y: &mut [f32], order: Order, reads: Reads) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if available() && rb > 0 {
            if !super::vecdot::order_supported(ty, order) {
                return false;
            }
            if ty.is_cortiq() {
                // SAFETY: available() confirmed every feature `own_avx512::matvec` enables;
                // lengths were checked by the caller, every load is bounds-checked.
                unsafe { super::own_avx512::matvec(ty, w, rb, a, y) };
                return true;
            }
            let mut rows = w.chunks_exact(rb);
            let mut done = 0;
            if reads == Reads::Tile {
                // cache-resident weights (the llama.cpp-order prefill's tiles): four rows share
                // each activation load and run four independent FMA chains
                for yc in y.chunks_exact_mut(4) {
                    let ws: [&[u8]; 4] = std::array::from_fn(|_| rows.next().unwrap_or(&[]));
                    // SAFETY: as in `dispatch`.
                    match unsafe { rows_in(ty, order, ws, a) } {
                        Some(v) => yc.copy_from_slice(&v),
                        None => return false,
                    }
                    done += 4;
                }
            }
            let mut ys = y[done..].chunks_exact_mut(1);
            for (r, yc) in (&mut ys).enumerate() {
                let r = done + r;
                prefetch_ahead(w, r * rb, rb);
                let ws: [&[u8]; 1] = [rows.next().unwrap_or(&[])];
                // SAFETY: as in `dispatch`.
                match unsafe { rows_in(ty, order, ws, a) } {
                    Some(v) => yc.copy_from_slice(&v),
                    None => return false,
                }
            }
            for (o, row) in ys.into_remainder().iter_mut().zip(rows) {
                match dispatch(ty, row, a, order) {
                    Some(v) => *o = v,
                    None => return false,
                }
            }
            return true;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (ty, w, rb, a, y, order, reads);
    false
}

/// `vecdot::quantize_act` with AVX-512; `false` (nothing written) without the CPU features. `out` is already `act.row_bytes(x.len())` bytes.
pub(super) fn quantize_act(act: super::vecdot::ActType, x: &[f32], out: &mut [u8]) -> bool {
    use super::vecdot::ActType;
    #[cfg(target_arch = "x86_64")]
    {
        if available() {
            // SAFETY: available() confirmed the features these functions enable; every load and
            // store is bounds-checked.
            unsafe {
                match act {
                    ActType::Q8K => imp::quantize_q8k(x, out),
                    _ => imp::quantize_q8(x, out, act == ActType::Q8_1),
                }
            }
            return true;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (act, x, out);
    false
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use super::super::QuantType;
    use super::super::blocks::*;
    use super::super::dequant::{k4_scale_min, q3k_scales};
    use super::super::iq23_simd::avx512 as iq23;
    use super::super::vecdot::{Q8_1_BYTES, hsum4, hsum8};
    use std::arch::x86_64::*;

    // Every helper carries the same target features so it inlines into the kernels; intrinsics
    // without pointers are safe to call inside such functions.

    /// 16 bytes of `s` from `off` (bounds-checked).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn ld16(s: &[u8], off: usize) -> __m128i {
        let s = &s[off..off + 16];
        // SAFETY: `s` is exactly 16 readable bytes; loadu has no alignment requirement.
        unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
    }

    /// 32 bytes of `s` from `off` (bounds-checked).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn ld32(s: &[u8], off: usize) -> __m256i {
        let s = &s[off..off + 32];
        // SAFETY: `s` is exactly 32 readable bytes; loadu has no alignment requirement.
        unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
    }

    /// 32 i8 of `s` from `off` (bounds-checked).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn ld32i(s: &[i8], off: usize) -> __m256i {
        let s = &s[off..off + 32];
        // SAFETY: as ld32.
        unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
    }

    /// f16 (little-endian bytes) -> f32 in all 8 lanes, exact. Broadcast first (`vpbroadcastw`),
    /// never a one-lane insert, which would chain a false dependency through the row.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn f16x8(b: [u8; 2]) -> __m256 {
        _mm256_cvtph_ps(_mm_set1_epi16(u16::from_le_bytes(b) as i16))
    }

    /// f16 -> scalar f32, exact.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn f16s(b: [u8; 2]) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(u16::from_le_bytes(b) as i16)))
    }

    /// ggml's `hsum_float_8`, via the scalar twin's function on the stored lanes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn hsum(v: __m256) -> f32 {
        let mut a = [0f32; 8];
        // SAFETY: `a` is 8 writable f32; storeu has no alignment requirement.
        unsafe { _mm256_storeu_ps(a.as_mut_ptr(), v) };
        hsum8(a)
    }

    /// Sum of the 8 i32 lanes (exact, wrapping like the integer adds it stands for).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn hsum_i32(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }

    /// Sum of 4 i32 lanes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn hsum4_i32(v: __m128i) -> i32 {
        let s = _mm_add_epi32(v, _mm_shuffle_epi32::<0b01_00_11_10>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }

    /// Signed x signed bytes -> 8 i32 lanes of 4 products each: `vpdpbusd(|x|, sign(y, x))`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn dot_i8(x: __m256i, y: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(x), _mm256_sign_epi8(y, x))
    }

    /// Unsigned x signed bytes -> 8 i32 lanes of 4 products each.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn dot_u8(x: __m256i, y: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), x, y)
    }

    /// 16 packed bytes -> 32 nibbles: low nibbles in bytes 0..16, high nibbles in 16..32.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn nib32(qs: &[u8]) -> __m256i {
        let b = ld16(qs, 0);
        let m = _mm_set1_epi8(0x0F);
        _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16::<4>(b), m), _mm_and_si128(b, m))
    }

    /// `(v >> 2k) & 3` per byte.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn crumb(v: __m256i, k: usize) -> __m256i {
        _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * k as i32)), _mm256_set1_epi8(3))
    }

    /// The i16 scale vector of a 32-element chunk made of groups g (bytes 0..16) and g+1.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn scale_pair(s: &[i16; 16], g: usize) -> __m256i {
        _mm256_set_m128i(_mm_set1_epi16(s[g + 1]), _mm_set1_epi16(s[g]))
    }

    /// `madd(maddubs(q, q8), scales)`: ggml's k-quant lane step (q unsigned, q8 signed).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn mad(q: __m256i, q8: __m256i, sc: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(q, q8), sc)
    }

    /// `acc = fma(d, float(lanes), acc)`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn fma_lanes(acc: __m256, d: __m256, p: __m256i) -> __m256 {
        _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc)
    }

    /// 16 f32 of `s` from `off` (bounds-checked).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn ld16f(s: &[f32], off: usize) -> __m512 {
        let s = &s[off..off + 16];
        // SAFETY: `s` is exactly 16 readable f32; loadu has no alignment requirement.
        unsafe { _mm512_loadu_ps(s.as_ptr()) }
    }

    /// f32 -> f16 bits, round to nearest even (`vcvtps2ph` imm 0, ggml's FP32_TO_FP16).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn f16_bits(v: f32) -> [u8; 2] {
        (_mm_extract_epi16::<0>(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(v))) as u16).to_le_bytes()
    }

    /// Q8_0 / Q8_1 activation blocks as ggml's AVX2 `quantize_row_q8_0/1`: the max of |x| (order
    /// free: max is exact), `d = amax / 127`, `id = 127 / amax`, `vcvtps2dq` of `x * id` (ties
    /// to even under the default MXCSR, i32::MIN for NaN as the packs path sees it), then a
    /// saturating narrow to i8 (`vpmovsdb`, the same clamp as ggml's two `packs`). Q8_1 adds
    /// `s = f16(d * sum)` with the wrapping i32 sum of the unsaturated quants, as ggml's.
    ///
    /// # Safety
    /// The CPU must support the features enabled below.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn quantize_q8(x: &[f32], out: &mut [u8], q8_1: bool) {
        let bsz = if q8_1 { Q8_1_BYTES } else { 34 };
        let qoff = if q8_1 { 4 } else { 2 };
        let absmask = _mm512_set1_epi32(0x7fff_ffff);
        for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(bsz)) {
            let v0 = ld16f(xb, 0);
            let v1 = ld16f(xb, 16);
            let a0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v0), absmask));
            let a1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v1), absmask));
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
            let d = amax / 127.0;
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let m = _mm512_set1_ps(id);
            let i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, m));
            let i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, m));
            ob[0..2].copy_from_slice(&f16_bits(d));
            if q8_1 {
                let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
                ob[2..4].copy_from_slice(&f16_bits(d * sum as f32));
            }
            let q = _mm256_set_m128i(_mm512_cvtsepi32_epi8(i1), _mm512_cvtsepi32_epi8(i0));
            let dst = &mut ob[qoff..qoff + 32];
            // SAFETY: `dst` is exactly 32 writable bytes; storeu has no alignment requirement.
            unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), q) };
        }
    }

    /// Q8_K activation blocks as `quantize_row_q8_K_ref`: the signed value of the FIRST element
    /// of largest magnitude (found as the lowest lane equal to the max, which is what the scalar
    /// loop's strict `>` keeps), `iscale = -127 / max`, `q = min(127, nearest_int(iscale * x))`
    /// with ggml's magic-number `nearest_int` itself, 16-element sums (wrapping to i16),
    /// `d = 1 / iscale`. All-zero blocks are all zero bytes.
    ///
    /// # Safety
    /// The CPU must support the features enabled below.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn quantize_q8k(x: &[f32], out: &mut [u8]) {
        let absmask = _mm512_set1_epi32(0x7fff_ffff);
        let abs = |v: __m512| _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), absmask));
        for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(292)) {
            let mut m = _mm512_setzero_ps();
            for c in 0..QK_K / 16 {
                m = _mm512_max_ps(m, abs(ld16f(xb, 16 * c)));
            }
            let amax = _mm512_reduce_max_ps(m);
            if amax == 0.0 || amax.is_nan() {
                ob.fill(0);
                continue;
            }
            let mut max = 0f32;
            for c in 0..QK_K / 16 {
                let hit = _mm512_cmpeq_ps_mask(abs(ld16f(xb, 16 * c)), _mm512_set1_ps(amax));
                if hit != 0 {
                    max = xb[16 * c + hit.trailing_zeros() as usize];
                    break;
                }
            }
            let iscale = -127.0f32 / max;
            let sc = _mm512_set1_ps(iscale);
            let (magic, mant, bias) =
                (_mm512_set1_ps(12582912.0), _mm512_set1_epi32(0x007f_ffff), _mm512_set1_epi32(0x0040_0000));
            for c in 0..QK_K / 16 {
                // ggml's nearest_int bit for bit (also for the inf that a subnormal max produces)
                let v = _mm512_castps_si512(_mm512_add_ps(_mm512_mul_ps(sc, ld16f(xb, 16 * c)), magic));
                let q = _mm512_sub_epi32(_mm512_and_si512(v, mant), bias);
                // min(127, v) stored into an int8 (C truncates to the low byte); the group sums
                // add the stored bytes, so sign-extend that byte back first
                let q = _mm512_min_epi32(q, _mm512_set1_epi32(127));
                let q = _mm512_srai_epi32::<24>(_mm512_slli_epi32::<24>(q));
                let sum = _mm512_reduce_add_epi32(q) as i16;
                ob[4 + QK_K + 2 * c..4 + QK_K + 2 * c + 2].copy_from_slice(&sum.to_le_bytes());
                let dst = &mut ob[4 + 16 * c..4 + 16 * c + 16];
                // SAFETY: `dst` is exactly 16 writable bytes; storeu has no alignment requirement.
                unsafe { _mm_storeu_si128(dst.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(q)) };
            }
            ob[0..4].copy_from_slice(&(1.0f32 / iscale).to_le_bytes());
        }
    }

    /// One block of llama.cpp's tiled k-quant matmul (ggml-cpu/tiled, VNNI microkernel): the
    /// block's integer sums s1 (scaled products) and s2 (min terms), `r = s1 * d_w`,
    /// `r = fnmadd(dmin_w, s2, r)`, `acc = fma(r, d_act, acc)` (GCC fuses that last mul+add).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn tiled_step(acc: f32, s1: i32, s2: i32, d: [u8; 2], dmin: Option<[u8; 2]>, dy: f32) -> f32 {
        let h = |b: [u8; 2]| half::f16::from_bits(u16::from_le_bytes(b)).to_f32_const();
        let mut r = s1 as f32 * h(d);
        if let Some(m) = dmin {
            r = (-h(m)).mul_add(s2 as f32, r);
        }
        r.mul_add(dy, acc)
    }

    /// # Safety
    /// The CPU must support avx512f, avx512bw, avx512vl, avx512vnni, avx2, fma and f16c. Rows
    /// are `ty.row_bytes(n)` bytes and `a` is the matching activation row (checked by the
    /// callers; a short slice would panic on a bounds check, never read out of bounds).
    /// Empty rows (matvec's padding) give 0.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    /// K: 0 = ggml's vec_dot order, 1 = llama.cpp's repacked gemv, 2 = its repacked gemm,
    /// 3 = its tiled k-quant matmul (`tiled_step`).
    pub(super) unsafe fn rows<const R: usize, const K: u8>(ty: QuantType, ws: [&[u8]; R], a: &[u8]) -> Option<[f32; R]> {
        let ok = match K {
            0 => true,
            1 | 2 => matches!(ty, QuantType::Q4_0 | QuantType::Q4K | QuantType::Q2K),
            _ => matches!(ty, QuantType::Q2K | QuantType::Q3K | QuantType::Q4K | QuantType::Q5K | QuantType::Q6K),
        };
        if !ok {
            return None;
        }
        // weight rows whose byte length is not a whole number of blocks panic in `view`
        macro_rules! v {
            ($B:ty) => {{
                let mut out: [&[$B]; R] = [&[]; R];
                for (o, w) in out.iter_mut().zip(ws) {
                    *o = view::<$B>(w);
                }
                out
            }};
        }
        let nb = |bs: usize| ws.iter().map(|w| w.len()).max().unwrap_or(0) / bs;
        Some(match ty {
            QuantType::Q8_0 => q8_0::<R, 0>(v!(BlockQ8_0), view(a)),
            QuantType::Q4_0 => q4_0::<R, K>(v!(BlockQ4_0), view(a)),
            QuantType::Q5_0 => q5_0::<R, 0>(v!(BlockQ5_0), view(a)),
            QuantType::Q4_1 => q4_1(v!(BlockQ4_1), a, nb(20)),
            QuantType::Q5_1 => q5_1(v!(BlockQ5_1), a, nb(24)),
            QuantType::Q2K => q2k::<R, K>(v!(BlockQ2K), view(a)),
            QuantType::Q3K => q3k::<R, K>(v!(BlockQ3K), view(a)),
            QuantType::Q4K => q4k::<R, K>(v!(BlockQ4K), view(a)),
            QuantType::Q5K => q5k::<R, K>(v!(BlockQ5K), view(a)),
            QuantType::Q6K => q6k::<R, K>(v!(BlockQ6K), view(a)),
            QuantType::IQ4NL => iq4nl::<R>(v!(BlockIQ4NL), view(a)),
            QuantType::MXFP4 => mxfp4::<R>(v!(BlockMXFP4), view(a)),
            QuantType::IQ4XS => iq4xs::<R>(v!(BlockIQ4XS), view(a)),
            QuantType::IQ2XXS => iq23::iq2xxs::<R>(v!(BlockIQ2XXS), view(a)),
            QuantType::IQ2XS => iq23::iq2xs::<R>(v!(BlockIQ2XS), view(a)),
            QuantType::IQ2S => iq23::iq2s::<R>(v!(BlockIQ2S), view(a)),
            QuantType::IQ3XXS => iq23::iq3xxs::<R>(v!(BlockIQ3XXS), view(a)),
            QuantType::IQ3S => iq23::iq3s::<R>(v!(BlockIQ3S), view(a)),
            QuantType::Q8R | QuantType::Q4T | QuantType::Q1 if K == 0 => {
                let mut out = [0f32; R];
                for (o, w) in out.iter_mut().zip(ws) {
                    // matvec's padding rows are empty: they give 0, as the GGUF kernels'
                    if !w.is_empty() {
                        // SAFETY: this function's features are the ones `own_avx512::vec_dot`
                        // needs; lengths were checked by the caller.
                        *o = unsafe { super::super::own_avx512::vec_dot(ty, w, a) };
                    }
                }
                out
            }
            _ => return None,
        })
    }

    // ------------------------------------------------------------ legacy types
    // Each: per block, lanes from one vpdpbusd, then acc = fma(dx*dy, lanes, acc). Rows shorter
    // than `a` (matvec's empty padding rows) simply stop contributing.

    macro_rules! legacy_q8_0 {
        ($name:ident, $B:ty, |$x:ident, $qy:ident| $lanes:expr) => {
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
            fn $name<const R: usize, const K: u8>(w: [&[$B]; R], a: &[BlockQ8_0]) -> [f32; R] {
                let mut acc = [_mm256_setzero_ps(); R];
                let mut acc_s = [0f32; R];
                for (i, y) in a.iter().enumerate() {
                    let dy = f16x8(y.d);
                    let $qy = ld32i(&y.qs, 0);
                    for r in 0..R {
                        let Some($x) = w[r].get(i) else { continue };
                        let d = _mm256_mul_ps(f16x8($x.d), dy);
                        if K != 0 {
                            // llama.cpp's repacked gemv and gemm (the same for 32-element
                            // blocks): the block's whole integer sum, one scalar FMA per block
                            acc_s[r] = (hsum_i32($lanes) as f32).mul_add(_mm256_cvtss_f32(d), acc_s[r]);
                        } else {
                            acc[r] = fma_lanes(acc[r], d, $lanes);
                        }
                    }
                }
                let mut out = [0f32; R];
                for r in 0..R {
                    out[r] = if K != 0 { acc_s[r] } else { hsum(acc[r]) };
                }
                out
            }
        };
    }

    legacy_q8_0!(q8_0, BlockQ8_0, |x, qy| dot_i8(ld32i(&x.qs, 0), qy));
    legacy_q8_0!(q4_0, BlockQ4_0, |x, qy| dot_i8(_mm256_sub_epi8(nib32(&x.qs), _mm256_set1_epi8(8)), qy));
    // q = nibble + 16*bit - 16: subtract 16 where the qh bit is clear
    legacy_q8_0!(q5_0, BlockQ5_0, |x, qy| {
        let q = nib32(&x.qs);
        dot_i8(_mm256_mask_sub_epi8(q, !u32::from_le_bytes(x.qh), q, _mm256_set1_epi8(16)), qy)
    });

    macro_rules! legacy_q8_1 {
        ($name:ident, $B:ty, |$x:ident| $q:expr) => {
            /// acc = fma(dx*dy, lanes, acc); summs = fma(m, s, summs); hsum(acc) + summs.
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
            fn $name<const R: usize>(w: [&[$B]; R], a: &[u8], nb: usize) -> [f32; R] {
                let mut acc = [_mm256_setzero_ps(); R];
                let mut summs = [0f32; R];
                for i in 0..nb {
                    let yb = &a[i * Q8_1_BYTES..(i + 1) * Q8_1_BYTES];
                    let dy = f16x8([yb[0], yb[1]]);
                    let sy = f16s([yb[2], yb[3]]);
                    let qy = ld32(yb, 4);
                    for r in 0..R {
                        let Some($x) = w[r].get(i) else { continue };
                        summs[r] = f16s($x.m).mul_add(sy, summs[r]);
                        let d = _mm256_mul_ps(f16x8($x.d), dy);
                        acc[r] = fma_lanes(acc[r], d, dot_u8($q, qy));
                    }
                }
                let mut out = [0f32; R];
                for r in 0..R {
                    out[r] = hsum(acc[r]) + summs[r];
                }
                out
            }
        };
    }

    legacy_q8_1!(q4_1, BlockQ4_1, |x| nib32(&x.qs));
    legacy_q8_1!(q5_1, BlockQ5_1, |x| {
        let q = nib32(&x.qs);
        _mm256_mask_add_epi8(q, u32::from_le_bytes(x.qh), q, _mm256_set1_epi8(16))
    });

    // ------------------------------------------------------------ k-quants

    /// The 16 i16 group sums of a Q8_K block as one vector.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn bsums(y: &BlockQ8K) -> __m256i {
        ld32(y.bsums.as_flattened(), 0)
    }

    /// ggml_vec_dot_q2_K_q8_K: acc = fma(dmin, min lanes, acc), then acc = fma(d, lanes, acc).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    /// With K = 1, llama.cpp's repacked gemv order instead: acc = fma(sum, dx*dy, acc) and
    /// acc_min = fma(min sum, dmin_x*dy, acc_min) in scalars per block, result acc - acc_min;
    /// K = 2 (its gemm) does the same per 128-element half block.
    fn q2k<const R: usize, const K: u8>(w: [&[BlockQ2K]; R], a: &[BlockQ8K]) -> [f32; R] {
        let mut acc = [_mm256_setzero_ps(); R];
        let (mut acc_s, mut acc_m) = ([0f32; R], [0f32; R]);
        for (i, y) in a.iter().enumerate() {
            let dy = f32::from_le_bytes(y.d);
            let bs = bsums(y);
            for r in 0..R {
                let Some(x) = w[r].get(i) else { continue };
                let d = dy * f16s(x.d);
                let dmin = -dy * f16s(x.dmin);
                let sc8 = ld16(&x.scales, 0);
                let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(sc8), _mm_set1_epi8(0x0F)));
                let pm = _mm256_madd_epi16(mins, bs);
                let dmin_r = f16s(x.dmin) * dy;
                match K {
                    0 => acc[r] = fma_lanes(acc[r], _mm256_set1_ps(dmin), pm),
                    1 => acc_m[r] = (hsum_i32(pm) as f32).mul_add(dmin_r, acc_m[r]),
                    3 => {}
                    _ => {
                        // lanes 0..4 hold groups 0..8 (first 128 elements), lanes 4..8 the rest
                        let lo = _mm256_blend_epi32::<0b1111_0000>(pm, _mm256_setzero_si256());
                        let hi = _mm256_blend_epi32::<0b0000_1111>(pm, _mm256_setzero_si256());
                        acc_m[r] = (hsum_i32(lo) as f32).mul_add(dmin_r, acc_m[r]);
                        acc_m[r] = (hsum_i32(hi) as f32).mul_add(dmin_r, acc_m[r]);
                    }
                }
                let mut sc = [0i16; 16];
                for (s, &b) in sc.iter_mut().zip(&x.scales) {
                    *s = (b & 0x0F) as i16;
                }
                let d_r = f16s(x.d) * dy;
                let mut sumi = _mm256_setzero_si256();
                for j in 0..2 {
                    let bits = ld32(&x.qs, 32 * j);
                    let mut sj = _mm256_setzero_si256();
                    for k in 0..4 {
                        let p = mad(crumb(bits, k), ld32i(&y.qs, 128 * j + 32 * k), scale_pair(&sc, 8 * j + 2 * k));
                        sj = _mm256_add_epi32(sj, p);
                    }
                    if K == 2 {
                        acc_s[r] = (hsum_i32(sj) as f32).mul_add(d_r, acc_s[r]);
                    }
                    sumi = _mm256_add_epi32(sumi, sj);
                }
                match K {
                    0 => acc[r] = fma_lanes(acc[r], _mm256_set1_ps(d), sumi),
                    1 => acc_s[r] = (hsum_i32(sumi) as f32).mul_add(d_r, acc_s[r]),
                    3 => acc_s[r] = tiled_step(acc_s[r], hsum_i32(sumi), hsum_i32(pm), x.d, Some(x.dmin), dy),
                    _ => {}
                }
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = match K {
                0 => hsum(acc[r]),
                3 => acc_s[r],
                _ => acc_s[r] - acc_m[r],
            };
        }
        out
    }

    /// ggml_vec_dot_q3_K_q8_K: q = low2 - 4 where the hmask bit is clear, as two maddubs.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn q3k<const R: usize, const K: u8>(w: [&[BlockQ3K]; R], a: &[BlockQ8K]) -> [f32; R] {
        let mut acc = [_mm256_setzero_ps(); R];
        let mut acc_s = [0f32; R];
        for (i, y) in a.iter().enumerate() {
            let dy = f32::from_le_bytes(y.d);
            for r in 0..R {
                let Some(x) = w[r].get(i) else { continue };
                let d = dy * f16s(x.d);
                let s6 = q3k_scales(&x.scales);
                let mut sc = [0i16; 16];
                for (s, &v) in sc.iter_mut().zip(&s6) {
                    *s = v as i16;
                }
                let hbits = ld32(&x.hmask, 0);
                let mut sumi = _mm256_setzero_si256();
                for j in 0..2 {
                    let bits = ld32(&x.qs, 32 * j);
                    for k in 0..4 {
                        let q8 = ld32i(&y.qs, 128 * j + 32 * k);
                        let set = _mm256_test_epi8_mask(hbits, _mm256_set1_epi8((1u8 << (4 * j + k)) as i8));
                        let h4 = _mm256_maskz_mov_epi8(!set, _mm256_set1_epi8(4));
                        let p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(crumb(bits, k), q8), _mm256_maddubs_epi16(h4, q8));
                        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, scale_pair(&sc, 8 * j + 2 * k)));
                    }
                }
                if K == 3 {
                    acc_s[r] = tiled_step(acc_s[r], hsum_i32(sumi), 0, x.d, None, dy);
                } else {
                    acc[r] = fma_lanes(acc[r], _mm256_set1_ps(d), sumi);
                }
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = if K == 3 { acc_s[r] } else { hsum(acc[r]) };
        }
        out
    }

    /// Q4_K/Q5_K min lanes: pm[k] = m[2k]*(bs[4k]+bs[4k+1]) + m[2k+1]*(bs[4k+2]+bs[4k+3]).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn k4_mins(mins: &[u8; 8], bs: __m256i) -> __m128i {
        // ggml: hadd of the two 8-sum halves gives the 32-element sums, madd with the mins
        let q8s = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256::<1>(bs));
        let m = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(i64::from_le_bytes(*mins)));
        _mm_madd_epi16(m, q8s)
    }

    /// ggml_vec_dot_q4_K_q8_K: acc = fma(d, lanes, acc); acc_m = fma(dmin, min lanes, acc_m)
    /// (4 lanes); hsum8(acc) + hsum4(acc_m).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    /// With K = 1 / 2, llama.cpp's repacked gemv / gemm orders (as Q2_K's; the gemm steps per
    /// 64-element quarter block).
    fn q4k<const R: usize, const K: u8>(w: [&[BlockQ4K]; R], a: &[BlockQ8K]) -> [f32; R] {
        let mut acc = [_mm256_setzero_ps(); R];
        let mut acc_m = [_mm_setzero_ps(); R];
        let (mut acc_s, mut acc_ms) = ([0f32; R], [0f32; R]);
        let m4 = _mm256_set1_epi8(0x0F);
        for (i, y) in a.iter().enumerate() {
            let dy = f32::from_le_bytes(y.d);
            let bs = bsums(y);
            for r in 0..R {
                let Some(x) = w[r].get(i) else { continue };
                let d = dy * f16s(x.d);
                let dmin = -dy * f16s(x.dmin);
                let (sc, mn) = k4_scale_min(&x.scales);
                let pm = k4_mins(&mn, bs);
                let dmin_r = f16s(x.dmin) * dy;
                match K {
                    0 => acc_m[r] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(pm), acc_m[r]),
                    3 => {}
                    1 => {
                        let t = _mm_add_epi32(pm, _mm_shuffle_epi32::<0b01_00_11_10>(pm));
                        let t = _mm_add_epi32(t, _mm_shuffle_epi32::<0b10_11_00_01>(t));
                        acc_ms[r] = (_mm_cvtsi128_si32(t) as f32).mul_add(dmin_r, acc_ms[r]);
                    }
                    _ => {
                        // lane j: the min terms of quarter j (sub-blocks 2j, 2j+1), one FMA each
                        let mut m = [0i32; 4];
                        // SAFETY: `m` is 4 writable i32; storeu has no alignment requirement.
                        unsafe { _mm_storeu_si128(m.as_mut_ptr().cast(), pm) };
                        for &v in &m {
                            acc_ms[r] = (v as f32).mul_add(dmin_r, acc_ms[r]);
                        }
                    }
                }
                let d_r = f16s(x.d) * dy;
                let mut sumi = _mm256_setzero_si256();
                for j in 0..4 {
                    let bits = ld32(&x.qs, 32 * j);
                    let lo = _mm256_and_si256(bits, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
                    let pl = mad(lo, ld32i(&y.qs, 64 * j), _mm256_set1_epi16(sc[2 * j] as i16));
                    let ph = mad(hi, ld32i(&y.qs, 64 * j + 32), _mm256_set1_epi16(sc[2 * j + 1] as i16));
                    let sj = _mm256_add_epi32(pl, ph);
                    if K == 2 {
                        acc_s[r] = (hsum_i32(sj) as f32).mul_add(d_r, acc_s[r]);
                    }
                    sumi = _mm256_add_epi32(sumi, sj);
                }
                match K {
                    0 => acc[r] = fma_lanes(acc[r], _mm256_set1_ps(d), sumi),
                    1 => acc_s[r] = (hsum_i32(sumi) as f32).mul_add(d_r, acc_s[r]),
                    3 => acc_s[r] = tiled_step(acc_s[r], hsum_i32(sumi), hsum4_i32(pm), x.d, Some(x.dmin), dy),
                    _ => {}
                }
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            if K == 3 {
                out[r] = acc_s[r];
                continue;
            }
            if K != 0 {
                out[r] = acc_s[r] - acc_ms[r];
                continue;
            }
            let mut m = [0f32; 4];
            // SAFETY: `m` is 4 writable f32; storeu has no alignment requirement.
            unsafe { _mm_storeu_ps(m.as_mut_ptr(), acc_m[r]) };
            out[r] = hsum(acc[r]) + hsum4(m);
        }
        out
    }

    /// ggml_vec_dot_q5_K_q8_K: as Q4_K with the fifth bit; the min lanes are summed as integers
    /// and folded into a scalar, summs = fma(sum as f32, dmin, summs).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn q5k<const R: usize, const K: u8>(w: [&[BlockQ5K]; R], a: &[BlockQ8K]) -> [f32; R] {
        let mut acc = [_mm256_setzero_ps(); R];
        let mut acc_s = [0f32; R];
        let mut summs = [0f32; R];
        let m4 = _mm256_set1_epi8(0x0F);
        let b4 = _mm256_set1_epi8(16);
        for (i, y) in a.iter().enumerate() {
            let dy = f32::from_le_bytes(y.d);
            let bs = bsums(y);
            for r in 0..R {
                let Some(x) = w[r].get(i) else { continue };
                let d = dy * f16s(x.d);
                let dmin = -dy * f16s(x.dmin);
                let (sc, mn) = k4_scale_min(&x.scales);
                let pm = hsum4_i32(k4_mins(&mn, bs));
                if K != 3 {
                    summs[r] = (pm as f32).mul_add(dmin, summs[r]);
                }
                let hbits = ld32(&x.qh, 0);
                let mut sumi = _mm256_setzero_si256();
                for j in 0..4 {
                    let bits = ld32(&x.qs, 32 * j);
                    let lo = _mm256_and_si256(bits, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
                    let ml = _mm256_test_epi8_mask(hbits, _mm256_set1_epi8((1u8 << (2 * j)) as i8));
                    let mh = _mm256_test_epi8_mask(hbits, _mm256_set1_epi8((1u8 << (2 * j + 1)) as i8));
                    let lo = _mm256_mask_add_epi8(lo, ml, lo, b4);
                    let hi = _mm256_mask_add_epi8(hi, mh, hi, b4);
                    let pl = mad(lo, ld32i(&y.qs, 64 * j), _mm256_set1_epi16(sc[2 * j] as i16));
                    let ph = mad(hi, ld32i(&y.qs, 64 * j + 32), _mm256_set1_epi16(sc[2 * j + 1] as i16));
                    sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
                }
                if K == 3 {
                    acc_s[r] = tiled_step(acc_s[r], hsum_i32(sumi), pm, x.d, Some(x.dmin), dy);
                } else {
                    acc[r] = fma_lanes(acc[r], _mm256_set1_ps(d), sumi);
                }
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = if K == 3 { acc_s[r] } else { hsum(acc[r]) + summs[r] };
        }
        out
    }

    /// ggml_vec_dot_q6_K_q8_K: unsigned 6-bit quants, the -32 offset subtracted per lane as
    /// 32 * madd(bsums, scales).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn q6k<const R: usize, const K: u8>(w: [&[BlockQ6K]; R], a: &[BlockQ8K]) -> [f32; R] {
        let mut acc = [_mm256_setzero_ps(); R];
        let mut acc_s = [0f32; R];
        let m4 = _mm256_set1_epi8(0x0F);
        for (i, y) in a.iter().enumerate() {
            let dy = f32::from_le_bytes(y.d);
            let bs = bsums(y);
            for r in 0..R {
                let Some(x) = w[r].get(i) else { continue };
                let d = dy * f16s(x.d);
                // SAFETY: `x.scales` is 16 readable bytes; loadu has no alignment requirement.
                let scales = unsafe { _mm_loadu_si128(x.scales.as_ptr().cast()) };
                let sub = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bs, _mm256_cvtepi8_epi16(scales)));
                let mut sc = [0i16; 16];
                for (s, &v) in sc.iter_mut().zip(&x.scales) {
                    *s = v as i16;
                }
                let mut sumi = _mm256_setzero_si256();
                for j in 0..2 {
                    let l1 = ld32(&x.ql, 64 * j);
                    let l2 = ld32(&x.ql, 64 * j + 32);
                    let h = ld32(&x.qh, 32 * j);
                    let q = [
                        _mm256_or_si256(
                            _mm256_and_si256(l1, m4),
                            _mm256_slli_epi16::<4>(_mm256_and_si256(h, _mm256_set1_epi8(3))),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(l2, m4),
                            _mm256_slli_epi16::<2>(_mm256_and_si256(h, _mm256_set1_epi8(12))),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(l1), m4),
                            _mm256_and_si256(h, _mm256_set1_epi8(48)),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(l2), m4),
                            _mm256_srli_epi16::<2>(_mm256_and_si256(h, _mm256_set1_epi8(-64))),
                        ),
                    ];
                    for (k, &qk) in q.iter().enumerate() {
                        let p = mad(qk, ld32i(&y.qs, 128 * j + 32 * k), scale_pair(&sc, 8 * j + 2 * k));
                        sumi = _mm256_add_epi32(sumi, p);
                    }
                }
                let p = _mm256_sub_epi32(sumi, sub);
                if K == 3 {
                    acc_s[r] = tiled_step(acc_s[r], hsum_i32(p), 0, x.d, None, dy);
                } else {
                    acc[r] = fma_lanes(acc[r], _mm256_set1_ps(d), p);
                }
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = if K == 3 { acc_s[r] } else { hsum(acc[r]) };
        }
        out
    }

    // ------------------------------------------------------------ 4-bit lookup-table types
    // Two 32-element blocks (IQ4_NL, MXFP4) or sub-blocks (IQ4_XS) per 512-bit register: the
    // nibbles in 128-bit lanes [low of A, high of A, low of B, high of B] index the table of
    // `level + 128` (unsigned) with one `vpshufb`, and one `vpdpbusd` started from
    // `-128 * (sum of 4 activations)` gives the exact signed lanes: sum (w + 128) a - 128 sum a.
    // Lanes 0..8 belong to A, 8..16 to B, each in the layout of the scalar twin's `lanes32`.
    // For IQ4_NL / MXFP4 a pair of blocks is exactly ggml's accum1 (even block, low 8 f32
    // lanes) and accum2 (odd block, high 8), added as one 256-bit add at the end.

    /// `levels + 128` as unsigned bytes in all four 128-bit lanes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn levels_u(k: &[i8; 16]) -> __m512i {
        // SAFETY: `k` is 16 readable bytes; loadu has no alignment requirement.
        let t = unsafe { _mm_loadu_si128(k.as_ptr().cast()) };
        _mm512_xor_si512(_mm512_broadcast_i32x4(t), _mm512_set1_epi8(0x80u8 as i8))
    }

    /// 16 nibble bytes A and 16 more B -> 64 unsigned levels in element order: [A's low
    /// nibbles, A's high nibbles, B's low, B's high].
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn lut64(a: &[u8], b: &[u8], t: __m512i) -> __m512i {
        let (a, b) = (&a[..16], &b[..16]);
        // [A, A, B, B] from two broadcast loads (no shuffle-port work, unlike a permute)
        // SAFETY: `a` and `b` are 16 readable bytes each; the loads have no alignment requirement.
        let z = unsafe {
            _mm512_mask_broadcast_i32x4(
                _mm512_broadcast_i32x4(_mm_loadu_si128(a.as_ptr().cast())),
                0xFF00,
                _mm_loadu_si128(b.as_ptr().cast()),
            )
        };
        let z = _mm512_mask_srli_epi16::<4>(z, 0xFF00_FF00, z);
        _mm512_shuffle_epi8(t, _mm512_and_si512(z, _mm512_set1_epi8(0x0F)))
    }

    /// `-128 * (sum of each 4 activation bytes)`: the start of `vpdpbusd` on `level + 128`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn bias128(qy: __m512i) -> __m512i {
        _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(0x80u8 as i8), qy))
    }

    /// The lanes of one lookup-table block with the legacy types' 256-bit signed dot (the odd
    /// last block of a row).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn lut_lanes32(qs: &[u8; 16], levels: &[i8; 16], qy: __m256i) -> __m256i {
        // SAFETY: `levels` is 16 readable bytes; loadu has no alignment requirement.
        let t = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(levels.as_ptr().cast()) });
        dot_i8(_mm256_shuffle_epi8(t, nib32(qs)), qy)
    }

    /// Two little-endian f16 -> [a, b, 0, 0] as f32 (exact), one `vcvtph2ps`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn f16x2(a: [u8; 2], b: [u8; 2]) -> __m128 {
        _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes([a[0], a[1], b[0], b[1]])))
    }

    /// `e8m0_half(e)` for every byte: a table, as ggml's x86 build reads it.
    static E8M0_HALF: [f32; 256] = {
        let mut t = [0f32; 256];
        let mut e = 0;
        while e < 256 {
            t[e] = e8m0_half(e as u8);
            e += 1;
        }
        t
    };

    macro_rules! lut_q8_0 {
        ($name:ident, $B:ty, $levels:expr, |$a:ident, $b:ident| $dx:expr) => {
            /// `vecdot::dot_pairs`, a pair of blocks per 16-lane FMA (see above); an odd last
            /// block as a scalar FMA of its lane sum. Matvec's empty padding rows give 0. The
            /// pair's two `dy * dx` are one 128-bit multiply (`$dx`: [dx(a), dx(b), ..]), spread
            /// to [d0 x8, d1 x8] by one permute.
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
            fn $name<const R: usize>(w: [&[$B]; R], a: &[BlockQ8_0]) -> [f32; R] {
                let t = levels_u(&$levels);
                let spread = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
                let mut acc = [_mm512_setzero_ps(); R];
                let (pairs, last) = a.as_chunks::<2>();
                for (i, [y0, y1]) in pairs.iter().enumerate() {
                    let dy = f16x2(y0.d, y1.d);
                    let qy = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(ld32i(&y0.qs, 0)), ld32i(&y1.qs, 0));
                    let bias = bias128(qy);
                    for r in 0..R {
                        let (Some($a), Some($b)) = (w[r].get(2 * i), w[r].get(2 * i + 1)) else { continue };
                        let d = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_mul_ps(dy, $dx)));
                        let p = _mm512_dpbusd_epi32(bias, lut64(&$a.qs, &$b.qs, t), qy);
                        acc[r] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc[r]);
                    }
                }
                let mut out = [0f32; R];
                for r in 0..R {
                    let (lo, hi) = (
                        _mm512_castps512_ps256(acc[r]),
                        _mm256_castsi256_ps(_mm512_extracti64x4_epi64::<1>(_mm512_castps_si512(acc[r]))),
                    );
                    out[r] = hsum(_mm256_add_ps(lo, hi));
                    let i = 2 * pairs.len();
                    if let (Some(y), Some($a)) = (last.first(), w[r].get(i)) {
                        let $b = $a;
                        let d = f16s(y.d) * _mm_cvtss_f32($dx);
                        let s = hsum_i32(lut_lanes32(&$a.qs, &$levels, ld32i(&y.qs, 0)));
                        out[r] = d.mul_add(s as f32, out[r]);
                    }
                }
                out
            }
        };
    }

    lut_q8_0!(iq4nl, BlockIQ4NL, KVALUES_IQ4NL, |x0, x1| f16x2(x0.d, x1.d));
    lut_q8_0!(mxfp4, BlockMXFP4, KVALUES_MXFP4, |x0, x1| _mm_setr_ps(
        E8M0_HALF[x0.e as usize],
        E8M0_HALF[x1.e as usize],
        0.0,
        0.0
    ));

    /// The 8 sub-block scales `ls - 32` of an IQ4_XS block as i32 lanes 0..8 (lanes 8..16 zero):
    /// `dequant::iq4xs_scales` in vector form (the byte interleave of the low and high nibbles of
    /// `scales_l`, the bit pairs of `scales_h` by per-lane shifts).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn iq4xs_scales_v(x: &BlockIQ4XS) -> __m512i {
        let l = _mm_cvtsi32_si128(i32::from_le_bytes(x.scales_l));
        let m = _mm_set1_epi8(0x0F);
        let lo = _mm_unpacklo_epi8(_mm_and_si128(l, m), _mm_and_si128(_mm_srli_epi16::<4>(l), m));
        let h = _mm_set1_epi16(u16::from_le_bytes(x.scales_h) as i16);
        let hi = _mm_and_si128(_mm_srlv_epi16(h, _mm_setr_epi16(0, 2, 4, 6, 8, 10, 12, 14)), _mm_set1_epi16(3));
        let s = _mm_sub_epi16(_mm_or_si128(_mm_cvtepu8_epi16(lo), _mm_slli_epi16::<4>(hi)), _mm_set1_epi16(32));
        _mm512_cvtepi16_epi32(_mm256_zextsi128_si256(s))
    }

    /// ggml_vec_dot_iq4_xs_q8_K: per pair of sub-blocks the exact lanes (see above) times
    /// `ls - 32` (`vpmulld`), summed over the super-block in 16 i32 lanes and folded to 8 (ggml's
    /// sumi1 + sumi2), then acc = fma(f16(dx) * dy, lanes, acc); hsum8.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn iq4xs<const R: usize>(w: [&[BlockIQ4XS]; R], a: &[BlockQ8K]) -> [f32; R] {
        let t = levels_u(&KVALUES_IQ4NL);
        let mut acc = [_mm256_setzero_ps(); R];
        // [2j x8, 2j+1 x8]: sub-block scale lanes of pair j
        let sidx: [__m512i; 4] = std::array::from_fn(|j| {
            let (e, o) = (2 * j as i32, 2 * j as i32 + 1);
            _mm512_setr_epi32(e, e, e, e, e, e, e, e, o, o, o, o, o, o, o, o)
        });
        for (i, y) in a.iter().enumerate() {
            let dy = f32::from_le_bytes(y.d);
            let qy: [__m512i; 4] = std::array::from_fn(|j| {
                let s = &y.qs[64 * j..64 * j + 64];
                // SAFETY: `s` is exactly 64 readable bytes; loadu has no alignment requirement.
                unsafe { _mm512_loadu_si512(s.as_ptr().cast()) }
            });
            let bias = qy.map(|q| bias128(q));
            for r in 0..R {
                let Some(x) = w[r].get(i) else { continue };
                let sc = iq4xs_scales_v(x);
                let mut sumi = _mm512_setzero_si512();
                for j in 0..4 {
                    let p = _mm512_dpbusd_epi32(bias[j], lut64(&x.qs[32 * j..], &x.qs[32 * j + 16..], t), qy[j]);
                    sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(p, _mm512_permutexvar_epi32(sidx[j], sc)));
                }
                let s8 = _mm256_add_epi32(_mm512_castsi512_si256(sumi), _mm512_extracti64x4_epi64::<1>(sumi));
                acc[r] = fma_lanes(acc[r], _mm256_set1_ps(f16s(x.d) * dy), s8);
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = hsum(acc[r]);
        }
        out
    }
}

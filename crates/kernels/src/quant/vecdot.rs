//! Integer dot products of quantized weight rows with 8-bit quantized activations, computed
//! the way llama.cpp's CPU backend computes them on x86 (ggml-cpu `vec_dot_type`).
//!
//! Owns: `ActType` (the activation block formats Q8_0, Q8_1, Q8_K), `act_type` (which one a
//! weight type pairs with), `quantize_act` (f32 row -> activation blocks), `vec_dot` /
//! `vec_dot_scalar` (one weight row . one activation row), `matvec_q`, `Order` with the
//! `*_order` variants, `llamacpp_order` / `llamacpp_repacks`, and `dequantize_act`
//! (the exact `q * d` decode the tests use as a reference). The AVX-512 twins live in
//! `vecdot_avx512.rs`; these scalar versions are their reference forever.
//!
//! Why this exists: dequantize-to-f32 matmuls are exact f32 math (and match transformers), but
//! llama.cpp quantizes the activation vector to 8 bits per block first. That moves logits by a
//! few 1e-3, enough to flip near-ties in greedy decoding (SmolLM2-135M Q4_1 departs from
//! llama.cpp's text after 5 tokens). Matching llama.cpp's tokens needs its arithmetic.
//!
//! Bit-exactness contract (checked against ggml itself, see tests/vecdot.rs):
//!   * `quantize_act` reproduces ggml-cpu's x86 `quantize_row_q8_0` / `quantize_row_q8_1` (the
//!     AVX/AVX2 branch: `d = amax / 127`, `id = 127 / amax`, `round` = ties-to-even,
//!     Q8_1's `s = f16(d * sum(q))`) and `quantize_row_q8_K_ref` (the x86 build uses the
//!     reference: signed max, `iscale = -127 / max`, magic-number `nearest_int`, `d = 1/iscale`).
//!     The `_ref` Q8_0/Q8_1 (roundf, ties away from zero, `id = 1/d`) is what non-SIMD builds
//!     use; it differs on exact ties and on `127/amax` vs `1/(amax/127)`, so it is NOT followed.
//!   * `vec_dot` reproduces ggml's AVX2 `ggml_vec_dot_<w>_<act>` float order exactly. Within a
//!     block every SIMD path reduces the integer products into 8 i32 lanes, lane `l` owning the
//!     elements `e` with `(e % 32) / 4 == l` (a 32-byte register, 4 bytes per i32 lane; exact,
//!     any order). Each lane is converted to f32 and accumulated across blocks with one FMA per
//!     block into an 8-lane f32 accumulator, which is reduced at the end as `hsum_float_8` does:
//!     `((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7))`. Per-type extras (min terms) are spelled out
//!     at each function; GCC contracts ggml's scalar `summs += a * b` into an FMA (checked in the
//!     disassembly of an AVX-512 build), so we use `mul_add` there too (it matters for Q5_K, whose
//!     `dmin` is a full f32: a plain multiply-add fails the ggml fixture on half its rows; for
//!     Q4_1/Q5_1 `m * s` is an exact f16*f16 product and both forms agree).
//!     Integer lane sums stay below 2^24 for every type but Q6_K (whose extreme lanes could reach
//!     ~3e7 and round on conversion, identically on both sides).
//!   * The AVX-512 twins produce identical bits (same lane sums, same FMA sequence).
//!
//! llama.cpp does not always run `ggml_vec_dot_*`; `Order` names the float orders it uses and
//! `llamacpp_order(ty, rows, batch, t)` says which one applies:
//!   * `VecDot`: plain weights in decode, and prompt batches of legacy types (llamafile's
//!     tinyBLAS, which llama.cpp uses for Q8_0/Q4_0/Q5_0 batches, accumulates exactly so);
//!   * `RepackGemv` / `RepackGemm`: the default CPU "repack" buffer stores Q4_0 and Q4_K (AVX2)
//!     and Q2_K (AVX-512) weights with a row count divisible by 8 interleaved by 8 rows and runs
//!     `ggml_gemv_*_8x8_*` (decode, a batch's last n % 4 tokens) or `ggml_gemm_*_8x8_*`;
//!   * `Tiled`: ggml-cpu's tiled k-quant matmul takes batches of >= 8 tokens for the other
//!     Q2_K..Q6_K weights.
//!
//! All of it is checked bit for bit against ggml's whole mul_mat through its CPU backend, with
//! plain and repacked weight buffers, for 1 to 32 activation columns.

use super::QuantType;
use super::blocks::*;

/// Bytes of one Q8_1 activation block: f16 d, f16 s (= d * sum(q)), 32 i8 quants.
pub const Q8_1_BYTES: usize = 36;

/// The 8-bit activation block format a weight type's integer dot product consumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActType {
    /// 32 elements: f16 `d`, 32 i8 (ggml `block_q8_0`, 34 bytes).
    Q8_0,
    /// 32 elements: f16 `d`, f16 `s = d * sum(q)`, 32 i8 (ggml `block_q8_1`, 36 bytes).
    Q8_1,
    /// 256 elements: f32 `d`, 256 i8, 16 i16 group sums (ggml `block_q8_K`, 292 bytes).
    Q8K,
}

impl ActType {
    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            ActType::Q8_0 | ActType::Q8_1 => QK,
            ActType::Q8K => QK_K,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            ActType::Q8_0 => 34,
            ActType::Q8_1 => Q8_1_BYTES,
            ActType::Q8K => 292,
        }
    }

    /// Bytes of a quantized row of `n` elements, `None` when `n` is not a whole number of blocks.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        if !n.is_multiple_of(self.block_size()) {
            return None;
        }
        (n / self.block_size()).checked_mul(self.type_size())
    }

    pub fn name(self) -> &'static str {
        match self {
            ActType::Q8_0 => "q8_0",
            ActType::Q8_1 => "q8_1",
            ActType::Q8K => "q8_K",
        }
    }
}

impl std::fmt::Display for ActType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The activation format ggml pairs with weight type `ty` (its `vec_dot_type`); `None` for
/// float weights (the engine keeps f32 math there) and for Q8_K, which is itself an
/// activation format.
pub fn act_type(ty: QuantType) -> Option<ActType> {
    match ty {
        QuantType::Q4_0 | QuantType::Q5_0 | QuantType::Q8_0 => Some(ActType::Q8_0),
        QuantType::IQ4NL | QuantType::MXFP4 => Some(ActType::Q8_0),
        QuantType::IQ4XS => Some(ActType::Q8K),
        QuantType::IQ2XXS | QuantType::IQ2XS | QuantType::IQ2S | QuantType::IQ3XXS | QuantType::IQ3S => Some(ActType::Q8K),
        // cortiq's own types: one Q8_0 block per 32 weights (see q8r.rs / q4t.rs / q1.rs)
        QuantType::Q8R | QuantType::Q4T | QuantType::Q1 => Some(ActType::Q8_0),
        QuantType::Q4_1 | QuantType::Q5_1 => Some(ActType::Q8_1),
        QuantType::Q2K | QuantType::Q3K | QuantType::Q4K | QuantType::Q5K | QuantType::Q6K => Some(ActType::Q8K),
        QuantType::F32 | QuantType::F16 | QuantType::BF16 | QuantType::Q8K => None,
    }
}

// ---------------------------------------------------------------- activation quantization

/// Quantize one activation row `x` into `out` (cleared and resized to `act.row_bytes(x.len())`),
/// bit for bit as ggml-cpu does on x86 (see the module header for which ggml function each
/// format follows). Panics when `x.len()` is not a whole number of blocks: the engine sizes
/// activations from validated tensor shapes, so that is a caller bug.
#[track_caller]
pub fn quantize_act(act: ActType, x: &[f32], out: &mut Vec<u8>) {
    let Some(bytes) = act.row_bytes(x.len()) else {
        panic!("quantize_act({act}): {} elements is not a whole number of {}-element blocks", x.len(), act.block_size());
    };
    out.clear();
    out.resize(bytes, 0);
    if super::vecdot_avx512::quantize_act(act, x, out) || super::vecdot_avx2::quantize_act(act, x, out) {
        return;
    }
    quantize_act_into(act, x, out);
}

/// `quantize_act` into a slice of exactly `act.row_bytes(x.len())` bytes (one row of a
/// [k, row bytes] buffer, say), the same bytes.
#[track_caller]
pub fn quantize_act_to(act: ActType, x: &[f32], out: &mut [u8]) {
    let Some(bytes) = act.row_bytes(x.len()) else {
        panic!("quantize_act_to({act}): {} elements is not a whole number of {}-element blocks", x.len(), act.block_size());
    };
    assert_eq!(out.len(), bytes, "quantize_act_to({act}): {} output bytes for {} elements, expected {bytes}", out.len(), x.len());
    if super::vecdot_avx512::quantize_act(act, x, out) || super::vecdot_avx2::quantize_act(act, x, out) {
        return;
    }
    quantize_act_into(act, x, out);
}

/// The scalar reference of `quantize_act` (same contract, same bytes).
#[track_caller]
pub fn quantize_act_scalar(act: ActType, x: &[f32], out: &mut Vec<u8>) {
    let Some(bytes) = act.row_bytes(x.len()) else {
        panic!("quantize_act_scalar({act}): {} elements is not a whole number of {}-element blocks", x.len(), act.block_size());
    };
    out.clear();
    out.resize(bytes, 0);
    quantize_act_into(act, x, out);
}

/// Scalar quantization into a buffer of the right size.
fn quantize_act_into(act: ActType, x: &[f32], out: &mut [u8]) {
    match act {
        ActType::Q8_0 => {
            for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(34)) {
                let (d, q, _) = quantize_block_q8_0(xb.try_into().unwrap());
                ob[0..2].copy_from_slice(&f16_bits(d).to_le_bytes());
                for (o, &v) in ob[2..].iter_mut().zip(q.iter()) {
                    *o = v as u8;
                }
            }
        }
        ActType::Q8_1 => {
            for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(Q8_1_BYTES)) {
                let (d, q, sum) = quantize_block_q8_0(xb.try_into().unwrap());
                ob[0..2].copy_from_slice(&f16_bits(d).to_le_bytes());
                // ggml: FP32_TO_FP16(d * hsum_i32_8(...)): the i32 sum converted to f32, one product
                ob[2..4].copy_from_slice(&f16_bits(d * sum as f32).to_le_bytes());
                for (o, &v) in ob[4..].iter_mut().zip(q.iter()) {
                    *o = v as u8;
                }
            }
        }
        ActType::Q8K => {
            for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(292)) {
                quantize_block_q8k(xb, ob);
            }
        }
    }
}

/// Little-endian IEEE half -> f32, exact, in software: `half`'s `to_f32` re-detects F16C on
/// every call, which made the scalar legacy dot products 2x slower.
#[inline(always)]
pub(super) fn h16(b: [u8; 2]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes(b)).to_f32_const()
}

/// f32 -> IEEE half bits, round to nearest even (F16C's `vcvtps2ph` with imm 0, which is what
/// ggml-cpu's `GGML_CPU_FP32_TO_FP16` compiles to on x86).
#[inline]
fn f16_bits(v: f32) -> u16 {
    half::f16::from_f32_const(v).to_bits()
}

/// One 32-element block as ggml-cpu's AVX/AVX2 `quantize_row_q8_0`/`_q8_1` do it:
/// `amax = max|x|`, `d = amax / 127`, `id = amax != 0 ? 127 / amax : 0`,
/// `q = round_ties_even(x * id)` saturated to i8 by the packs instructions. Returns the f32 `d`
/// (before the f16 store), the quants, and their i32 sum (for Q8_1's `s`).
#[inline]
fn quantize_block_q8_0(x: &[f32; QK]) -> (f32, [i8; QK], i32) {
    // |x| by clearing the sign bit, as `andnot(-0.0, v)`; max_ps returns its second operand
    // when either is NaN, which only matters for NaN input (garbage in both implementations).
    let mut amax = 0.0f32;
    for &v in x {
        let a = f32::from_bits(v.to_bits() & 0x7fff_ffff);
        amax = if amax > a { amax } else { a };
    }
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut q = [0i8; QK];
    let mut sum = 0i32;
    for (o, &v) in q.iter_mut().zip(x) {
        // _mm256_round_ps(_MM_ROUND_NEAREST) then cvtps_epi32 then two saturating packs.
        // Ties to even by the 1.5 * 2^23 trick (exact for |v*id| < 2^22, and |v*id| <= 127 here
        // for finite input): `f32::round_ties_even` is a libm call per element without SSE4.1.
        let r = (v * id + 12582912.0) - 12582912.0;
        // cvtps_epi32 gives i32::MIN ("integer indefinite") for NaN and out-of-range values
        let i = if r.is_nan() || r.abs() >= 2147483648.0 { i32::MIN } else { r as i32 };
        let s = i.clamp(-128, 127);
        sum = sum.wrapping_add(i);
        *o = s as i8;
    }
    (d, q, sum)
}

/// ggml's `nearest_int`: round to nearest (ties to even) by adding 1.5 * 2^23 and reading the
/// mantissa; valid for |v| <= 2^22 (always true here, |v| <= 127 * (1 + eps)).
#[inline]
fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12582912.0f32).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// One 256-element Q8_K block as `quantize_row_q8_K_ref` (the x86 build's quantize_row_q8_K):
/// the signed value of the first element of largest magnitude sets `iscale = -127 / max`,
/// `q = min(127, nearest_int(iscale * x))`, `d = 1 / iscale` (f32), bsums = 16-element sums.
/// An all-zero block stores d = 0 and zero quants (ggml leaves its bsums unwritten; we zero
/// them, and every dot product multiplies them by d = 0 anyway).
fn quantize_block_q8k(x: &[f32], ob: &mut [u8]) {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let a = v.abs();
        if a > amax {
            amax = a;
            max = v;
        }
    }
    if amax == 0.0 {
        ob.fill(0);
        return;
    }
    let iscale = -127.0f32 / max;
    let qs = &mut ob[4..4 + QK_K];
    for (o, &v) in qs.iter_mut().zip(x) {
        *o = nearest_int(iscale * v).min(127) as i8 as u8;
    }
    let mut bsums = [0i16; QK_K / 16];
    for (s, g) in bsums.iter_mut().zip(qs.chunks_exact(16)) {
        *s = g.iter().map(|&b| b as i8 as i16).sum();
    }
    for (o, s) in ob[4 + QK_K..].chunks_exact_mut(2).zip(bsums) {
        o.copy_from_slice(&s.to_le_bytes());
    }
    ob[0..4].copy_from_slice(&(1.0f32 / iscale).to_le_bytes());
}

/// Decode a quantized activation row exactly: element = q * d (f16 or f32 d widened to f64, so
/// no rounding at all). The tests' f64 reference dot products start from this.
#[track_caller]
pub fn dequantize_act(act: ActType, bytes: &[u8], out: &mut [f64]) {
    let want = act.row_bytes(out.len());
    assert!(want == Some(bytes.len()), "dequantize_act({act}): {} elements need {want:?} bytes, got {}", out.len(), bytes.len());
    match act {
        ActType::Q8_0 | ActType::Q8_1 => {
            let (off, sz) = if act == ActType::Q8_0 { (2, 34) } else { (4, Q8_1_BYTES) };
            for (b, o) in bytes.chunks_exact(sz).zip(out.chunks_exact_mut(QK)) {
                let d = h16([b[0], b[1]]) as f64;
                for (y, &q) in o.iter_mut().zip(&b[off..]) {
                    *y = q as i8 as f64 * d;
                }
            }
        }
        ActType::Q8K => {
            for (b, o) in view::<BlockQ8K>(bytes).iter().zip(out.chunks_exact_mut(QK_K)) {
                let d = f32::from_le_bytes(b.d) as f64;
                for (y, &q) in o.iter_mut().zip(b.qs.iter()) {
                    *y = q as f64 * d;
                }
            }
        }
    }
}

// ---------------------------------------------------------------- dot products: dispatch

/// Dot product of one weight row (type `ty`, `n` elements, `ty.row_bytes(n)` bytes) with an
/// activation row quantized by `quantize_act(act_type(ty), ..)`.
///
/// Bit-identical to ggml's x86 `ggml_vec_dot_*` and to `vec_dot_scalar`; runs the AVX-512
/// (BW + VL + VNNI) kernels of `vecdot_avx512` when the CPU has them and `CORTIQ_SIMD` is not
/// `scalar`. Panics on a type without an activation format or on wrong lengths (caller bugs:
/// the engine validates shapes at load time).
#[track_caller]
pub fn vec_dot(ty: QuantType, w_row: &[u8], act: &[u8], n: usize) -> f32 {
    check("vec_dot", ty, w_row, act, n, Order::VecDot);
    if let Some(v) = super::vecdot_avx512::dispatch(ty, w_row, act, Order::VecDot) {
        return v;
    }
    if let Some(v) = super::vecdot_avx2::dispatch(ty, w_row, act, Order::VecDot) {
        return v;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::simd::level() == crate::simd::Level::Avx2 {
        let mut y = [0f32];
        // SAFETY: level() returned Avx2 after detecting avx2, fma and f16c.
        unsafe { rows_avx2(ty, Order::VecDot, w_row, w_row.len(), act, &mut y) };
        return y[0];
    }
    scalar(ty, w_row, act)
}

/// The scalar reference of `vec_dot` (same contract, same bits), kept as the SIMD oracle.
#[track_caller]
pub fn vec_dot_scalar(ty: QuantType, w_row: &[u8], act: &[u8], n: usize) -> f32 {
    check("vec_dot_scalar", ty, w_row, act, n, Order::VecDot);
    scalar(ty, w_row, act)
}

/// `y[r] = vec_dot(ty, row r of w, act, cols)` for `rows` rows stored back to back
/// (`w.len() == rows * ty.row_bytes(cols)`). Single-threaded: the engine splits row ranges over
/// its pool and calls this per range.
#[track_caller]
pub fn matvec_q(ty: QuantType, w: &[u8], rows: usize, cols: usize, act: &[u8], y: &mut [f32]) {
    matvec_impl("matvec_q", ty, w, rows, cols, act, y, Order::VecDot, Reads::Stream);
}

/// How a matvec's weight rows reach its kernel, which picks the loop; the values are the same
/// either way (each row's dot product is its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reads {
    /// From memory, once (decode): one row at a time, front to back, prefetched ahead where the
    /// CPU wants it (`vecdot_avx512::prefetch_distance`). Several rows' streams at once defeat
    /// the hardware prefetcher (`vecdot_avx512::matvec`).
    Stream,
    /// A tile the caller keeps in cache while many activation rows pass over it (the
    /// llama.cpp-order prefill): four rows share each activation load and run four
    /// independent FMA chains.
    Tile,
}

// ---------------------------------------------------------------- llama.cpp's repacked order

/// Float accumulation order of a dot product. The activation quantization and every integer
/// product are the same in all three; only how the per-block integers are combined in f32
/// differs (a few ulp).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Order {
    /// ggml's `ggml_vec_dot_*` (and llamafile's tinyBLAS for prompts, which is the same): 8 f32
    /// lanes per row, one FMA per block, reduced at the end.
    VecDot,
    /// llama.cpp's repacked `ggml_gemv_*_8x8_*` (decode, and a prompt's last `n % 4` tokens):
    /// per block one integer sum and one scalar FMA; k-quant min terms in a second chain
    /// subtracted at the end.
    RepackGemv,
    /// llama.cpp's repacked `ggml_gemm_*_8x8_*` (a prompt's first `n - n % 4` tokens): as
    /// RepackGemv, but one FMA per 64 elements (Q4_K) or 128 (Q2_K); Q4_0 is the same as gemv.
    RepackGemm,
    /// llama.cpp's tiled k-quant matmul (ggml-cpu/tiled, VNNI microkernel), which takes prompt
    /// batches of >= 8 tokens for Q2_K..Q6_K weights outside the repack buffer: per block the
    /// integer sums s1 (scaled products) and s2 (min terms), `r = s1 * d_w`,
    /// `r = fnmadd(dmin_w, s2, r)`, `acc = fma(r, d_act, acc)`.
    Tiled,
}

/// Whether `order` exists for weight type `ty`.
pub fn order_supported(ty: QuantType, order: Order) -> bool {
    match order {
        Order::VecDot => act_type(ty).is_some(),
        Order::RepackGemv | Order::RepackGemm => matches!(ty, QuantType::Q4_0 | QuantType::Q4K | QuantType::Q2K),
        Order::Tiled => matches!(ty, QuantType::Q2K | QuantType::Q3K | QuantType::Q4K | QuantType::Q5K | QuantType::Q6K),
    }
}

/// The order llama.cpp's x86 CPU backend (AVX-512 VNNI build, default settings: repacking on,
/// tiled k-quant matmul on) uses for token `t` of a batch of `batch` tokens multiplied by a
/// weight of type `ty` with `rows` rows. Decode is `batch == 1`; llama.cpp computes the output
/// (logits) matmul only for the tokens it returns, so that batch is usually 1 too. Prompt
/// batches are llama.cpp's micro-batches (`n_ubatch`, 512 by default): the engine must split a
/// prompt the same way for the orders to line up.
pub fn llamacpp_order(ty: QuantType, rows: usize, batch: usize, t: usize) -> Order {
    if llamacpp_repacks(ty, rows) {
        // repack: gemm for whole groups of 4 tokens, gemv for the rest
        if t < batch - batch % 4 { Order::RepackGemm } else { Order::RepackGemv }
    } else if batch >= 8 && order_supported(ty, Order::Tiled) {
        Order::Tiled
    } else {
        Order::VecDot
    }
}

/// Whether llama.cpp's x86 CPU backend keeps a weight matrix of this type and row count in its
/// interleaved 8-row "repack" layout (the default; `--no-repack` turns it off): Q4_0 and Q4_K on
/// AVX2 builds, Q2_K on AVX-512 builds, when the row count is a multiple of 8. (The x86 build we
/// match has both.) Tensors read by row lookups (token embeddings, tied output included) stay
/// plain. For these llama.cpp computes `Order::RepackGemv` for decode; for a prompt batch of n
/// tokens `Order::RepackGemm` for tokens 0..n - n%4 and `Order::RepackGemv` for the rest.
pub fn llamacpp_repacks(ty: QuantType, rows: usize) -> bool {
    matches!(ty, QuantType::Q4_0 | QuantType::Q4K | QuantType::Q2K) && rows.is_multiple_of(8)
}

/// `vec_dot` in a given float order (`Order::VecDot` is `vec_dot` itself). Panics when
/// `order_supported(ty, order)` is false.
#[track_caller]
pub fn vec_dot_order(ty: QuantType, order: Order, w_row: &[u8], act: &[u8], n: usize) -> f32 {
    check("vec_dot_order", ty, w_row, act, n, order);
    if let Some(v) = super::vecdot_avx512::dispatch(ty, w_row, act, order) {
        return v;
    }
    if let Some(v) = super::vecdot_avx2::dispatch(ty, w_row, act, order) {
        return v;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::simd::level() == crate::simd::Level::Avx2 {
        let mut y = [0f32];
        // SAFETY: level() returned Avx2 after detecting avx2, fma and f16c.
        unsafe { rows_avx2(ty, order, w_row, w_row.len(), act, &mut y) };
        return y[0];
    }
    scalar_order(ty, order, w_row, act)
}

/// The scalar reference of `vec_dot_order`.
#[track_caller]
pub fn vec_dot_order_scalar(ty: QuantType, order: Order, w_row: &[u8], act: &[u8], n: usize) -> f32 {
    check("vec_dot_order_scalar", ty, w_row, act, n, order);
    scalar_order(ty, order, w_row, act)
}

/// `matvec_q` in a given float order.
#[track_caller]
pub fn matvec_q_order(ty: QuantType, order: Order, w: &[u8], rows: usize, cols: usize, act: &[u8], y: &mut [f32]) {
    matvec_impl("matvec_q_order", ty, w, rows, cols, act, y, order, Reads::Stream);
}

/// `matvec_q_order` on a cache-resident tile of rows (`Reads::Tile`): the same values.
#[track_caller]
pub fn matvec_q_order_tile(ty: QuantType, order: Order, w: &[u8], rows: usize, cols: usize, act: &[u8], y: &mut [f32]) {
    matvec_impl("matvec_q_order_tile", ty, w, rows, cols, act, y, order, Reads::Tile);
}

#[allow(clippy::too_many_arguments)]
#[track_caller]
fn matvec_impl(
    func: &str,
    ty: QuantType,
    w: &[u8],
    rows: usize,
    cols: usize,
    act: &[u8],
    y: &mut [f32],
    order: Order,
    reads: Reads,
) {
    let rb = ty.row_bytes(cols);
    assert!(
        rb.and_then(|rb| rb.checked_mul(rows)) == Some(w.len()) && y.len() == rows,
        "{func}({ty}): {rows}x{cols} needs {:?} weight bytes and {rows} outputs, got {} and {}",
        rb.map(|rb| rb * rows),
        w.len(),
        y.len()
    );
    if rows == 0 {
        return;
    }
    let rb = rb.unwrap_or(0);
    check(func, ty, &w[..rb], act, cols, order);
    if super::vecdot_avx512::matvec(ty, w, rb, act, y, order, reads) {
        return;
    }
    if super::vecdot_avx2::matvec(ty, w, rb, act, y, order, reads) {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::simd::level() == crate::simd::Level::Avx2 {
        // SAFETY: level() returned Avx2 after detecting avx2, fma and f16c.
        unsafe { rows_avx2(ty, order, w, rb, act, y) };
        return;
    }
    for (o, row) in y.iter_mut().zip(w.chunks_exact(rb.max(1))) {
        *o = scalar_order(ty, order, row, act);
    }
}

/// The scalar twins compiled for AVX2 + FMA (no AVX-512), for the types `vecdot_avx2` has no
/// kernel for (cortiq's own): `mul_add` is one instruction here instead of a libm call; the
/// same code, so the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn rows_avx2(ty: QuantType, order: Order, w: &[u8], rb: usize, act: &[u8], y: &mut [f32]) {
    for (o, row) in y.iter_mut().zip(w.chunks_exact(rb.max(1))) {
        *o = scalar_order(ty, order, row, act);
    }
}

#[track_caller]
fn check(func: &str, ty: QuantType, w_row: &[u8], act: &[u8], n: usize, order: Order) {
    let Some(at) = act_type(ty) else {
        panic!("{func}({ty}): no quantized-activation dot product for this type");
    };
    assert!(order_supported(ty, order), "{func}({ty}): llama.cpp has no {order:?} kernel for this type");
    let (wb, ab) = (ty.row_bytes(n), at.row_bytes(n));
    assert!(
        wb == Some(w_row.len()) && ab == Some(act.len()),
        "{func}({ty}): {n} elements need {wb:?} weight and {ab:?} {at} bytes, got {} and {}",
        w_row.len(),
        act.len()
    );
}

/// Lengths already checked.
#[inline(always)]
fn scalar(ty: QuantType, w: &[u8], a: &[u8]) -> f32 {
    match ty {
        QuantType::Q4_0 => dot_q4_0(view(w), view(a)),
        QuantType::Q4_1 => dot_q4_1(view(w), a),
        QuantType::Q5_0 => dot_q5_0(view(w), view(a)),
        QuantType::Q5_1 => dot_q5_1(view(w), a),
        QuantType::Q8_0 => dot_q8_0(view(w), view(a)),
        QuantType::Q2K => dot_q2k(view(w), view(a)),
        QuantType::Q3K => dot_q3k(view(w), view(a)),
        QuantType::Q4K => dot_q4k(view(w), view(a)),
        QuantType::Q5K => dot_q5k(view(w), view(a)),
        QuantType::Q6K => dot_q6k(view(w), view(a)),
        QuantType::IQ4NL => dot_iq4nl(view(w), view(a)),
        QuantType::IQ4XS => dot_iq4xs(view(w), view(a)),
        QuantType::MXFP4 => dot_mxfp4(view(w), view(a)),
        QuantType::IQ2XXS => super::iq23::dot::<BlockIQ2XXS>(view(w), view(a)),
        QuantType::IQ2XS => super::iq23::dot::<BlockIQ2XS>(view(w), view(a)),
        QuantType::IQ2S => super::iq23::dot::<BlockIQ2S>(view(w), view(a)),
        QuantType::IQ3XXS => super::iq23::dot::<BlockIQ3XXS>(view(w), view(a)),
        QuantType::IQ3S => super::iq23::dot::<BlockIQ3S>(view(w), view(a)),
        QuantType::Q8R => super::q8r::vec_dot(w, a),
        QuantType::Q4T => super::q4t::vec_dot(w, a),
        QuantType::Q1 => super::q1::vec_dot(w, a),
        QuantType::F32 | QuantType::F16 | QuantType::BF16 | QuantType::Q8K => unreachable!("checked by act_type"),
    }
}

/// Lengths and type already checked.
#[inline(always)]
fn scalar_order(ty: QuantType, order: Order, w: &[u8], a: &[u8]) -> f32 {
    match order {
        Order::VecDot => return scalar(ty, w, a),
        Order::Tiled => return scalar_tiled(ty, w, a),
        Order::RepackGemv | Order::RepackGemm => {}
    }
    let gemm = order == Order::RepackGemm;
    match ty {
        QuantType::Q4_0 => {
            // gemv and gemm agree: one block is one 32-element step in both
            let mut acc = 0f32;
            for (x, y) in view::<BlockQ4_0>(w).iter().zip(view::<BlockQ8_0>(a)) {
                let sum: i32 = q4_0_lanes(x, y).iter().sum();
                acc = (sum as f32).mul_add(h16(x.d) * h16(y.d), acc);
            }
            acc
        }
        QuantType::Q4K => {
            let (mut acc, mut acc_min) = (0f32, 0f32);
            for (x, y) in view::<BlockQ4K>(w).iter().zip(view::<BlockQ8K>(a)) {
                let (d, dmin) = (h16(x.d) * q8k_d(y), h16(x.dmin) * q8k_d(y));
                let (sc, mn) = super::dequant::k4_scale_min(&x.scales);
                let sc16: [i32; 16] = std::array::from_fn(|g| sc[g / 2] as i32);
                let g = group_sums(&q4k_quants(&x.qs), &sc16, &y.qs);
                // min terms per 64-element quarter j: sub-blocks 2j and 2j+1
                let pm = k4_min_lanes(&mn, &bsums(y));
                if gemm {
                    for j in 0..4 {
                        acc = (g[4 * j..4 * j + 4].iter().sum::<i32>() as f32).mul_add(d, acc);
                        acc_min = (pm[j] as f32).mul_add(dmin, acc_min);
                    }
                } else {
                    acc = (g.iter().sum::<i32>() as f32).mul_add(d, acc);
                    acc_min = (pm.iter().sum::<i32>() as f32).mul_add(dmin, acc_min);
                }
            }
            acc - acc_min
        }
        QuantType::Q2K => {
            let (mut acc, mut acc_min) = (0f32, 0f32);
            for (x, y) in view::<BlockQ2K>(w).iter().zip(view::<BlockQ8K>(a)) {
                let (d, dmin) = (h16(x.d) * q8k_d(y), h16(x.dmin) * q8k_d(y));
                let sc: [i32; 16] = std::array::from_fn(|g| (x.scales[g] & 0x0F) as i32);
                let g = group_sums(&q2k_quants(x), &sc, &y.qs);
                let bs = bsums(y);
                let m: [i32; 16] = std::array::from_fn(|k| (x.scales[k] >> 4) as i32 * bs[k]);
                // gemm: one step per 128-element half (groups 8h..8h+8); gemv: the whole block
                let step = if gemm { 8 } else { 16 };
                for (gp, mp) in g.chunks_exact(step).zip(m.chunks_exact(step)) {
                    acc = (gp.iter().sum::<i32>() as f32).mul_add(d, acc);
                    acc_min = (mp.iter().sum::<i32>() as f32).mul_add(dmin, acc_min);
                }
            }
            acc - acc_min
        }
        _ => unreachable!("checked by check()"),
    }
}

/// One block of `Order::Tiled`: r = s1 * d_w; r = fnmadd(dmin_w, s2, r); acc = fma(r, d_act, acc).
#[inline(always)]
fn tiled_step(acc: f32, s1: i32, s2: i32, d: [u8; 2], dmin: Option<[u8; 2]>, dy: f32) -> f32 {
    let mut r = s1 as f32 * h16(d);
    if let Some(m) = dmin {
        r = (-h16(m)).mul_add(s2 as f32, r);
    }
    r.mul_add(dy, acc)
}

/// `Order::Tiled`, lengths and type already checked. s1 is the exact integer sum of
/// scale * quant * activation over the block (the vec_dot lanes summed), s2 the min terms.
#[inline(always)]
fn scalar_tiled(ty: QuantType, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = 0f32;
    let sum = |l: &[i32]| l.iter().sum::<i32>();
    match ty {
        QuantType::Q2K => {
            for (x, y) in view::<BlockQ2K>(w).iter().zip(view::<BlockQ8K>(a)) {
                let (p, pm) = q2k_lanes(x, y);
                acc = tiled_step(acc, sum(&p), sum(&pm), x.d, Some(x.dmin), q8k_d(y));
            }
        }
        QuantType::Q3K => {
            for (x, y) in view::<BlockQ3K>(w).iter().zip(view::<BlockQ8K>(a)) {
                acc = tiled_step(acc, sum(&q3k_lanes(x, y)), 0, x.d, None, q8k_d(y));
            }
        }
        QuantType::Q4K => {
            for (x, y) in view::<BlockQ4K>(w).iter().zip(view::<BlockQ8K>(a)) {
                let (p, pm) = q4k_lanes(x, y);
                acc = tiled_step(acc, sum(&p), sum(&pm), x.d, Some(x.dmin), q8k_d(y));
            }
        }
        QuantType::Q5K => {
            for (x, y) in view::<BlockQ5K>(w).iter().zip(view::<BlockQ8K>(a)) {
                let (p, pm) = q5k_lanes(x, y);
                acc = tiled_step(acc, sum(&p), sum(&pm), x.d, Some(x.dmin), q8k_d(y));
            }
        }
        QuantType::Q6K => {
            for (x, y) in view::<BlockQ6K>(w).iter().zip(view::<BlockQ8K>(a)) {
                acc = tiled_step(acc, sum(&q6k_lanes(x, y)), 0, x.d, None, q8k_d(y));
            }
        }
        _ => unreachable!("checked by check()"),
    }
    acc
}

// ---------------------------------------------------------------- shared float steps

/// ggml's `hsum_float_8`: (hi128 + lo128), then movehl, then movehdup.
#[inline(always)]
pub(super) fn hsum8(a: [f32; 8]) -> f32 {
    let r = [a[4] + a[0], a[5] + a[1], a[6] + a[2], a[7] + a[3]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// Four-lane reduction of Q4_K's min accumulator: movehl + add, movehdup + add_ss.
#[inline(always)]
pub(super) fn hsum4(a: [f32; 4]) -> f32 {
    (a[0] + a[2]) + (a[1] + a[3])
}

/// `acc[l] = fma(d, lanes[l] as f32, acc[l])`: the one float step per block of every kernel.
#[inline(always)]
pub(super) fn fma_lanes(acc: &mut [f32; 8], d: f32, lanes: &[i32; 8]) {
    for (a, &p) in acc.iter_mut().zip(lanes) {
        *a = d.mul_add(p as f32, *a);
    }
}

/// The 8 lane sums of a 32-element block: lane l = sum of w[e] * a[e] for e in 4l..4l+4.
#[inline(always)]
pub(super) fn lanes32(w: &[i8; QK], a: &[i8; QK]) -> [i32; 8] {
    // products first (a straight 32-lane loop the compiler vectorizes), then the lane sums
    let mut t = [0i16; QK];
    for (o, (&x, &y)) in t.iter_mut().zip(w.iter().zip(a)) {
        *o = x as i16 * y as i16;
    }
    let mut p = [0i32; 8];
    for (o, c) in p.iter_mut().zip(t.chunks_exact(4)) {
        *o = c.iter().map(|&v| v as i32).sum();
    }
    p
}

/// The Q8_1 block at index `i` of an activation row: (d, s, quants).
#[inline(always)]
fn q8_1_block(a: &[u8], i: usize) -> (f32, f32, [i8; QK]) {
    let b = &a[i * Q8_1_BYTES..(i + 1) * Q8_1_BYTES];
    let mut q = [0i8; QK];
    for (o, &v) in q.iter_mut().zip(&b[4..]) {
        *o = v as i8;
    }
    (h16([b[0], b[1]]), h16([b[2], b[3]]), q)
}

/// Nibble-unpacked quants of a 4-bit legacy block: element j < 16 is the low nibble of qs[j],
/// j >= 16 the high nibble of qs[j-16] (`bytes_from_nibbles_32`).
#[inline(always)]
pub(super) fn nibbles(qs: &[u8; QK / 2]) -> [i8; QK] {
    let mut q = [0i8; QK];
    for j in 0..QK / 2 {
        q[j] = (qs[j] & 0x0F) as i8;
        q[j + QK / 2] = (qs[j] >> 4) as i8;
    }
    q
}

/// Bit 4 of each element of a Q5 block: bit j of the little-endian u32 qh.
#[inline(always)]
pub(super) fn high_bits(qh: [u8; 4]) -> [i8; QK] {
    let qh = u32::from_le_bytes(qh);
    let mut h = [0i8; QK];
    for (j, o) in h.iter_mut().enumerate() {
        *o = ((qh >> j) & 1) as i8;
    }
    h
}

// ---------------------------------------------------------------- legacy 32-element types

/// ggml_vec_dot_q4_0_q8_0 (AVX2): acc = fma(dx*dy, lanes, acc); hsum.
#[inline(always)]
fn dot_q4_0(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
    let mut acc = [0f32; 8];
    for (x, y) in w.iter().zip(a) {
        let d = h16(x.d) * h16(y.d);
        fma_lanes(&mut acc, d, &q4_0_lanes(x, y));
    }
    hsum8(acc)
}

#[inline(always)]
fn q4_0_lanes(x: &BlockQ4_0, y: &BlockQ8_0) -> [i32; 8] {
    let mut q = nibbles(&x.qs);
    q.iter_mut().for_each(|v| *v -= 8);
    lanes32(&q, &y.qs)
}

/// ggml_vec_dot_q4_1_q8_1 (AVX2): summs = fma(mx, sy, summs); acc = fma(dx*dy, lanes, acc);
/// result hsum(acc) + summs.
#[inline(always)]
fn dot_q4_1(w: &[BlockQ4_1], a: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for (i, x) in w.iter().enumerate() {
        let (dy, sy, qy) = q8_1_block(a, i);
        summs = h16(x.m).mul_add(sy, summs);
        let d = h16(x.d) * dy;
        fma_lanes(&mut acc, d, &lanes32(&nibbles(&x.qs), &qy));
    }
    hsum8(acc) + summs
}

/// ggml_vec_dot_q5_0_q8_0 (AVX2): as Q4_0 with q = nibble | bit4 << 4, minus 16.
#[inline(always)]
fn dot_q5_0(w: &[BlockQ5_0], a: &[BlockQ8_0]) -> f32 {
    let mut acc = [0f32; 8];
    for (x, y) in w.iter().zip(a) {
        let mut q = nibbles(&x.qs);
        for (v, h) in q.iter_mut().zip(high_bits(x.qh)) {
            *v = (*v | (h << 4)) - 16;
        }
        let d = h16(x.d) * h16(y.d);
        fma_lanes(&mut acc, d, &lanes32(&q, &y.qs));
    }
    hsum8(acc)
}

/// ggml_vec_dot_q5_1_q8_1 (AVX2): as Q4_1 with 5-bit quants.
#[inline(always)]
fn dot_q5_1(w: &[BlockQ5_1], a: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for (i, x) in w.iter().enumerate() {
        let (dy, sy, qy) = q8_1_block(a, i);
        summs = h16(x.m).mul_add(sy, summs);
        let mut q = nibbles(&x.qs);
        for (v, h) in q.iter_mut().zip(high_bits(x.qh)) {
            *v |= h << 4;
        }
        let d = h16(x.d) * dy;
        fma_lanes(&mut acc, d, &lanes32(&q, &qy));
    }
    hsum8(acc) + summs
}

/// ggml_vec_dot_q8_0_q8_0 (AVX2).
#[inline(always)]
fn dot_q8_0(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
    let mut acc = [0f32; 8];
    for (x, y) in w.iter().zip(a) {
        let d = h16(x.d) * h16(y.d);
        fma_lanes(&mut acc, d, &lanes32(&x.qs, &y.qs));
    }
    hsum8(acc)
}

// ---------------------------------------------------------------- k-quants

/// Lane sums of a 256-element block with a per-16-element scale: lane l = sum over elements e
/// with (e % 32) / 4 == l of scale[e / 16] * q[e] * a[e].
#[inline(always)]
pub(super) fn lanes256(q: &[i8; QK_K], sc16: &[i32; 16], a: &[i8; QK_K]) -> [i32; 8] {
    // per 16-element group: 4 sums of 4 products (|q*a| <= 128*128, 4 of them fit an i32
    // comfortably), times the group's scale; group g feeds lanes 4*(g%2)..4*(g%2)+4
    let mut p = [0i32; 8];
    for (g, (qg, ag)) in q.chunks_exact(16).zip(a.chunks_exact(16)).enumerate() {
        let mut t = [0i32; 16];
        for (o, (&x, &y)) in t.iter_mut().zip(qg.iter().zip(ag)) {
            *o = x as i32 * y as i32;
        }
        let base = 4 * (g % 2);
        for (l, c) in t.chunks_exact(4).enumerate() {
            p[base + l] += sc16[g] * (c[0] + c[1] + c[2] + c[3]);
        }
    }
    p
}

/// Scaled sums of a 256-element block per 16-element group: scale[g] * sum(q * a) over group g.
#[inline(always)]
fn group_sums(q: &[i8; QK_K], sc16: &[i32; 16], a: &[i8; QK_K]) -> [i32; 16] {
    let mut out = [0i32; 16];
    for ((o, (qg, ag)), &s) in out.iter_mut().zip(q.chunks_exact(16).zip(a.chunks_exact(16))).zip(sc16) {
        *o = s * qg.iter().zip(ag).map(|(&x, &y)| x as i32 * y as i32).sum::<i32>();
    }
    out
}

#[inline(always)]
pub(super) fn bsums(y: &BlockQ8K) -> [i32; 16] {
    let mut s = [0i32; 16];
    for (o, b) in s.iter_mut().zip(y.bsums) {
        *o = i16::from_le_bytes(b) as i32;
    }
    s
}

#[inline(always)]
pub(super) fn q8k_d(y: &BlockQ8K) -> f32 {
    f32::from_le_bytes(y.d)
}

/// Q2_K quants (0..3) in element order: element 128h + 32s + l is (qs[32h + l] >> 2s) & 3.
fn q2k_quants(x: &BlockQ2K) -> [i8; QK_K] {
    crumbs(&x.qs)
}

/// 2-bit fields of 64 bytes in element order: element 128h + 32s + l is (qs[32h + l] >> 2s) & 3.
#[inline(always)]
fn crumbs(qs: &[u8; QK_K / 4]) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for h in 0..2 {
        for s in 0..4 {
            let out = &mut q[128 * h + 32 * s..128 * h + 32 * s + 32];
            for (o, &b) in out.iter_mut().zip(&qs[32 * h..32 * h + 32]) {
                *o = ((b >> (2 * s)) & 3) as i8;
            }
        }
    }
    q
}

/// ggml_vec_dot_q2_K_q8_K (AVX2). Per block: min lanes pm[l] = m[2l]*bsum[2l] + m[2l+1]*bsum[2l+1]
/// go in first, acc = fma(dmin, pm, acc) with dmin = -dy * dmin_x; then acc = fma(d, lanes, acc).
#[inline(always)]
fn dot_q2k(w: &[BlockQ2K], a: &[BlockQ8K]) -> f32 {
    let mut acc = [0f32; 8];
    for (x, y) in w.iter().zip(a) {
        let dy = q8k_d(y);
        let d = dy * h16(x.d);
        let dmin = -dy * h16(x.dmin);
        let (p, pm) = q2k_lanes(x, y);
        fma_lanes(&mut acc, dmin, &pm);
        fma_lanes(&mut acc, d, &p);
    }
    hsum8(acc)
}

/// Q2_K product lanes and min lanes pm[l] = m[2l]*bsum[2l] + m[2l+1]*bsum[2l+1].
#[inline(always)]
fn q2k_lanes(x: &BlockQ2K, y: &BlockQ8K) -> ([i32; 8], [i32; 8]) {
    let bs = bsums(y);
    let mut pm = [0i32; 8];
    for (l, o) in pm.iter_mut().enumerate() {
        *o = (x.scales[2 * l] >> 4) as i32 * bs[2 * l] + (x.scales[2 * l + 1] >> 4) as i32 * bs[2 * l + 1];
    }
    let sc: [i32; 16] = std::array::from_fn(|g| (x.scales[g] & 0x0F) as i32);
    (lanes256(&q2k_quants(x), &sc, &y.qs), pm)
}

/// ggml_vec_dot_q3_K_q8_K (AVX2): q = low2 - 4 * (hmask bit clear), signed 6-bit scales.
#[inline(always)]
fn dot_q3k(w: &[BlockQ3K], a: &[BlockQ8K]) -> f32 {
    let mut acc = [0f32; 8];
    for (x, y) in w.iter().zip(a) {
        let d = q8k_d(y) * h16(x.d);
        fma_lanes(&mut acc, d, &q3k_lanes(x, y));
    }
    hsum8(acc)
}

/// Q3_K product lanes.
#[inline(always)]
fn q3k_lanes(x: &BlockQ3K, y: &BlockQ8K) -> [i32; 8] {
    let sc6 = super::dequant::q3k_scales(&x.scales);
    let sc: [i32; 16] = std::array::from_fn(|g| sc6[g] as i32);
    let mut q = crumbs(&x.qs);
    for (c, qc) in q.chunks_exact_mut(32).enumerate() {
        for (v, &m) in qc.iter_mut().zip(&x.hmask) {
            *v -= ((((m >> c) & 1) ^ 1) << 2) as i8;
        }
    }
    lanes256(&q, &sc, &y.qs)
}

/// Q4_K/Q5_K min terms: pm[k] = m[2k] * (bsum[4k] + bsum[4k+1]) + m[2k+1] * (bsum[4k+2] + bsum[4k+3])
/// (`_mm_hadd_epi16` of the 16 group sums, then `_mm_madd_epi16` with the 8 mins).
#[inline(always)]
fn k4_min_lanes(mins: &[u8; 8], bs: &[i32; 16]) -> [i32; 4] {
    std::array::from_fn(|k| {
        mins[2 * k] as i32 * (bs[4 * k] + bs[4 * k + 1]) + mins[2 * k + 1] as i32 * (bs[4 * k + 2] + bs[4 * k + 3])
    })
}

/// Q4_K quants (0..15) in element order: element 64c + 32n + l is (qs[32c + l] >> 4n) & 15.
fn q4k_quants(qs: &[u8; QK_K / 2]) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for (qc, bytes) in q.chunks_exact_mut(64).zip(qs.chunks_exact(32)) {
        let (lo, hi) = qc.split_at_mut(32);
        for ((l, h), &b) in lo.iter_mut().zip(hi.iter_mut()).zip(bytes) {
            *l = (b & 0x0F) as i8;
            *h = (b >> 4) as i8;
        }
    }
    q
}

/// ggml_vec_dot_q4_K_q8_K (AVX2): acc = fma(d, lanes, acc); a separate 4-lane
/// acc_m = fma(dmin, pm, acc_m); result hsum8(acc) + hsum4(acc_m).
#[inline(always)]
fn dot_q4k(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
    let mut acc = [0f32; 8];
    let mut acc_m = [0f32; 4];
    for (x, y) in w.iter().zip(a) {
        let dy = q8k_d(y);
        let d = dy * h16(x.d);
        let dmin = -dy * h16(x.dmin);
        let (p, pm) = q4k_lanes(x, y);
        for (m, &v) in acc_m.iter_mut().zip(&pm) {
            *m = dmin.mul_add(v as f32, *m);
        }
        fma_lanes(&mut acc, d, &p);
    }
    hsum8(acc) + hsum4(acc_m)
}

/// Q4_K product lanes and the 4 min lanes.
#[inline(always)]
fn q4k_lanes(x: &BlockQ4K, y: &BlockQ8K) -> ([i32; 8], [i32; 4]) {
    let (sc, mn) = super::dequant::k4_scale_min(&x.scales);
    let sc16: [i32; 16] = std::array::from_fn(|g| sc[g / 2] as i32);
    (lanes256(&q4k_quants(&x.qs), &sc16, &y.qs), k4_min_lanes(&mn, &bsums(y)))
}

/// ggml_vec_dot_q5_K_q8_K (AVX2): as Q4_K, but the min terms are summed in integers per block
/// and folded into a scalar: summs = fma(sum(pm) as f32, dmin, summs); result hsum8(acc) + summs.
#[inline(always)]
fn dot_q5k(w: &[BlockQ5K], a: &[BlockQ8K]) -> f32 {
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for (x, y) in w.iter().zip(a) {
        let dy = q8k_d(y);
        let d = dy * h16(x.d);
        let dmin = -dy * h16(x.dmin);
        let (p, pm) = q5k_lanes(x, y);
        summs = (pm.iter().sum::<i32>() as f32).mul_add(dmin, summs);
        fma_lanes(&mut acc, d, &p);
    }
    hsum8(acc) + summs
}

/// Q5_K product lanes and the 4 min lanes.
#[inline(always)]
fn q5k_lanes(x: &BlockQ5K, y: &BlockQ8K) -> ([i32; 8], [i32; 4]) {
    let (sc, mn) = super::dequant::k4_scale_min(&x.scales);
    let mut q = q4k_quants(&x.qs);
    for (c, qc) in q.chunks_exact_mut(32).enumerate() {
        for (v, &h) in qc.iter_mut().zip(&x.qh) {
            *v |= (((h >> c) & 1) << 4) as i8;
        }
    }
    let sc16: [i32; 16] = std::array::from_fn(|g| sc[g / 2] as i32);
    (lanes256(&q, &sc16, &y.qs), k4_min_lanes(&mn, &bsums(y)))
}

/// ggml_vec_dot_q6_K_q8_K (AVX2): the quants are used unsigned (0..63) and the -32 offset is
/// subtracted per lane as 32 * (bsum[2l]*sc[2l] + bsum[2l+1]*sc[2l+1]) — a different element
/// partition than the product lanes, which is why it has to be done exactly this way.
#[inline(always)]
fn dot_q6k(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
    let mut acc = [0f32; 8];
    for (x, y) in w.iter().zip(a) {
        let d = q8k_d(y) * h16(x.d);
        fma_lanes(&mut acc, d, &q6k_lanes(x, y));
    }
    hsum8(acc)
}

/// Q6_K lanes, the per-lane -32 offset correction included.
#[inline(always)]
fn q6k_lanes(x: &BlockQ6K, y: &BlockQ8K) -> [i32; 8] {
    let sc: [i32; 16] = std::array::from_fn(|g| x.scales[g] as i32);
    q6k_lanes_of(&q6k_quants(x), &sc, y)
}

/// Q6_K quants (0..63, offset not applied) in element order: element 128h + 32s + l is the
/// nibble s/2 of ql[64h + 32(s%2) + l] with bits 4..6 from (qh[32h + l] >> 2s) & 3.
#[inline(always)]
pub(super) fn q6k_quants(x: &BlockQ6K) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for h in 0..2 {
        for s in 0..4 {
            let out = &mut q[128 * h + 32 * s..128 * h + 32 * s + 32];
            let ql = &x.ql[64 * h + 32 * (s % 2)..64 * h + 32 * (s % 2) + 32];
            let qh = &x.qh[32 * h..32 * h + 32];
            for ((o, &lo), &hi) in out.iter_mut().zip(ql).zip(qh) {
                *o = (((lo >> (4 * (s / 2))) & 0x0F) | (((hi >> (2 * s)) & 0x03) << 4)) as i8;
            }
        }
    }
    q
}

/// Q6_K lanes of one activation block from the unpacked quants `q` and scales `sc`.
#[inline(always)]
pub(super) fn q6k_lanes_of(q: &[i8; QK_K], sc: &[i32; 16], y: &BlockQ8K) -> [i32; 8] {
    let bs = bsums(y);
    let mut p = lanes256(q, sc, &y.qs);
    for (l, v) in p.iter_mut().enumerate() {
        *v -= (bs[2 * l] * sc[2 * l] + bs[2 * l + 1] * sc[2 * l + 1]) << 5;
    }
    p
}

// ---------------------------------------------------------------- 4-bit lookup-table types

/// The 32 levels of a lookup-table block in element order (Q4_0's nibble order: element j < 16
/// is `levels[qs[j] & 15]`, element j >= 16 is `levels[qs[j - 16] >> 4]`).
#[inline(always)]
pub(super) fn lut_levels(qs: &[u8; QK / 2], levels: &[i8; 16]) -> [i8; QK] {
    let mut q = [0i8; QK];
    for j in 0..QK / 2 {
        q[j] = levels[(qs[j] & 0x0F) as usize];
        q[j + QK / 2] = levels[(qs[j] >> 4) as usize];
    }
    q
}

/// ggml's AVX2 float order of `ggml_vec_dot_iq4_nl_q8_0` and `ggml_vec_dot_mxfp4_q8_0`: blocks
/// go in pairs, the even block of each pair into one 8-lane accumulator and the odd one into a
/// second (`acc = fma(dx*dy, lanes, acc)`), the two are added lane by lane and reduced with
/// `hsum8`; an odd last block is then added as a scalar `fma(dx*dy, sum of its lanes, result)`
/// (ggml's C tail loop, `sumf += d * sumi`, which GCC contracts). `block(i)` gives block i's
/// `dx*dy` and lanes.
#[inline(always)]
fn dot_pairs(nb: usize, block: impl Fn(usize) -> (f32, [i32; 8])) -> f32 {
    let mut acc = [[0f32; 8]; 2];
    let pairs = nb - nb % 2;
    for i in 0..pairs {
        let (d, p) = block(i);
        fma_lanes(&mut acc[i % 2], d, &p);
    }
    let mut sum = hsum8(std::array::from_fn(|l| acc[0][l] + acc[1][l]));
    if pairs < nb {
        let (d, p) = block(pairs);
        sum = d.mul_add(p.iter().sum::<i32>() as f32, sum);
    }
    sum
}

/// ggml_vec_dot_iq4_nl_q8_0 (AVX2): `dot_pairs` with lanes of the table levels times the
/// activation quants, `dx*dy = f16(dy) * f16(dx)`.
#[inline(always)]
fn dot_iq4nl(w: &[BlockIQ4NL], a: &[BlockQ8_0]) -> f32 {
    dot_pairs(w.len().min(a.len()), |i| {
        let (x, y) = (&w[i], &a[i]);
        (h16(y.d) * h16(x.d), lanes32(&lut_levels(&x.qs, &KVALUES_IQ4NL), &y.qs))
    })
}

/// ggml_vec_dot_mxfp4_q8_0 (AVX2): as IQ4_NL with MXFP4's levels and `dx = e8m0_half(e)`.
#[inline(always)]
fn dot_mxfp4(w: &[BlockMXFP4], a: &[BlockQ8_0]) -> f32 {
    dot_pairs(w.len().min(a.len()), |i| {
        let (x, y) = (&w[i], &a[i]);
        (h16(y.d) * e8m0_half(x.e), lanes32(&lut_levels(&x.qs, &KVALUES_MXFP4), &y.qs))
    })
}

/// ggml_vec_dot_iq4_xs_q8_K (AVX2): per super-block the lanes of its 8 sub-blocks, each scaled
/// by the sub-block's `ls - 32` and summed in integers (exact), then one
/// `acc = fma(f16(dx) * dy, lanes, acc)`; result `hsum8(acc)`.
#[inline(always)]
fn dot_iq4xs(w: &[BlockIQ4XS], a: &[BlockQ8K]) -> f32 {
    let mut acc = [0f32; 8];
    for (x, y) in w.iter().zip(a) {
        let d = h16(x.d) * q8k_d(y);
        fma_lanes(&mut acc, d, &iq4xs_lanes(x, y));
    }
    hsum8(acc)
}

/// IQ4_XS lanes: lane l = sum over sub-blocks ib of (ls_ib - 32) * (the sub-block's products of
/// elements 4l..4l+4).
#[inline(always)]
fn iq4xs_lanes(x: &BlockIQ4XS, y: &BlockQ8K) -> [i32; 8] {
    let sc = super::dequant::iq4xs_scales(x);
    let mut p = [0i32; 8];
    for (ib, (qs, ys)) in x.qs.chunks_exact(QK / 2).zip(y.qs.chunks_exact(QK)).enumerate() {
        let l = lanes32(&lut_levels(qs.try_into().expect("16 bytes"), &KVALUES_IQ4NL), ys.try_into().expect("32 quants"));
        for (o, v) in p.iter_mut().zip(l) {
            *o += sc[ib] as i32 * v;
        }
    }
    p
}

//! The 2- and 3-bit grid ("i-quant") GGUF types IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S.
//!
//! Owns: `IqBlock`, the one view of their blocks every kernel reads (per 32-element sub-block
//! the grid magnitudes, the sign bits and the odd scales `2s + 1`), their scalar dequantization
//! (`dequant`) and their scalar dot product with Q8_K activations (`dot`). These scalar
//! functions are the references of the AVX2 / AVX-512 twins in `iq23_simd.rs`, kept forever.
//!
//! All five decode as `element = d * (2s + 1) * FACTOR * magnitude * sign` with the magnitude
//! from a fixed grid (`iq_grids`) and the sign from a bit per element (IQ2_S, IQ3_S) or a 7-bit
//! even-parity pattern per 8 elements (`KSIGNS_IQ2XS`: IQ2_XXS, IQ2_XS, IQ3_XXS).
//!
//! Dequantization is bit-exact against gguf-py 0.19.0 (`db = d * (0.5 + s) * 0.25`, then
//! `db * grid * sign`, in numpy f32) without following its order: d has 11 significant bits,
//! `2s + 1` at most 5 and a magnitude (<= 62) at most 6, so every product is exact in f32
//! (22 bits), and FACTOR is a power of two (d >= 2^-24 keeps it far from f32's subnormals).
//! The sign is a negation applied last, as gguf-py's `* -1.0`, so zero keeps d's sign the
//! same way.
//!
//! The dot product follows ggml's AVX2 `ggml_vec_dot_iq*_q8_K` float order exactly (checked
//! against ggml in tests/vecdot.rs): per super-block the integer products `magnitude *
//! sign(q8)` times the sub-block scale are summed into 8 i32 lanes (lane l owns the elements e
//! with `(e % 32) / 4 == l`: `vpmaddubsw` + `vpmaddwd` by the scale, exact), then one
//! `acc = fma(f16(d) * d8, lanes, acc)` per super-block, and `FACTOR * hsum8(acc)` at the end.
//! The sign is applied to the activation byte as `vpsignb` / xor-sub does, wrapping a -128 to
//! -128 (activations from `quantize_act` are in -127..127, where that never happens). The lane
//! sums stay below 2^23 (8 sub-blocks * 4 * 31 * 62 * 128), so their f32 conversion is exact.

use super::blocks::*;
use super::iq_grids::*;
use super::vecdot::{fma_lanes, h16, hsum8, q8k_d};

/// The per-sub-block view of a 2-/3-bit grid block (256 elements, 8 sub-blocks of 32).
pub trait IqBlock: Block {
    /// The power of two the format's scale carries: `d * (0.5 + s) * 0.25` is
    /// `d * (2s + 1) * 0.125` (IQ2_*), IQ3_XXS's `* 0.5` is 0.25, IQ3_S's `d * (1 + 2s)` is 1.
    const FACTOR: f32;
    /// The f16 super-block scale.
    fn d(&self) -> [u8; 2];
    /// Grid magnitudes of sub-block `ib` (elements 32ib..32ib+32): byte j of the 32 little-endian
    /// bytes of the four u64 is element j.
    fn grid(&self, ib: usize) -> [u64; 4];
    /// Sign bits of sub-block `ib`: bit j set means element 32ib + j is negative.
    fn signs(&self, ib: usize) -> u32;
    /// The odd scales `2s + 1` of elements 0..16 and 16..32 of sub-block `ib`.
    fn scales(&self, ib: usize) -> [u8; 2];
}

#[inline(always)]
fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Four 7-bit `KSIGNS_IQ2XS` indices (bits 7k..7k+7 of `a`) -> 32 sign bits.
#[inline(always)]
fn ksigns32(a: u32) -> u32 {
    (0..4).fold(0, |s, k| s | (KSIGNS_IQ2XS[((a >> (7 * k)) & 127) as usize] as u32) << (8 * k))
}

/// Two IQ3 grid entries (4 magnitudes each) side by side.
#[inline(always)]
fn pair(lo: u32, hi: u32) -> u64 {
    lo as u64 | (hi as u64) << 32
}

/// The two nibble scales of a byte as `2s + 1` (low nibble first).
#[inline(always)]
fn nibble_scales(b: u8) -> [u8; 2] {
    [2 * (b & 15) + 1, 2 * (b >> 4) + 1]
}

impl IqBlock for BlockIQ2XXS {
    const FACTOR: f32 = 0.125;
    fn d(&self) -> [u8; 2] {
        self.d
    }
    #[inline(always)]
    fn grid(&self, ib: usize) -> [u64; 4] {
        std::array::from_fn(|k| IQ2XXS_GRID[self.qs[8 * ib + k] as usize])
    }
    #[inline(always)]
    fn signs(&self, ib: usize) -> u32 {
        ksigns32(u32_at(&self.qs, 8 * ib + 4))
    }
    #[inline(always)]
    fn scales(&self, ib: usize) -> [u8; 2] {
        let s = (u32_at(&self.qs, 8 * ib + 4) >> 28) as u8;
        [2 * s + 1; 2]
    }
}

impl IqBlock for BlockIQ2XS {
    const FACTOR: f32 = 0.125;
    fn d(&self) -> [u8; 2] {
        self.d
    }
    #[inline(always)]
    fn grid(&self, ib: usize) -> [u64; 4] {
        std::array::from_fn(|k| {
            let q = u16::from_le_bytes([self.qs[8 * ib + 2 * k], self.qs[8 * ib + 2 * k + 1]]);
            IQ2XS_GRID[(q & 511) as usize]
        })
    }
    #[inline(always)]
    fn signs(&self, ib: usize) -> u32 {
        (0..4).fold(0, |s, k| {
            let q = u16::from_le_bytes([self.qs[8 * ib + 2 * k], self.qs[8 * ib + 2 * k + 1]]);
            s | (KSIGNS_IQ2XS[(q >> 9) as usize] as u32) << (8 * k)
        })
    }
    #[inline(always)]
    fn scales(&self, ib: usize) -> [u8; 2] {
        nibble_scales(self.scales[ib])
    }
}

impl IqBlock for BlockIQ2S {
    const FACTOR: f32 = 0.125;
    fn d(&self) -> [u8; 2] {
        self.d
    }
    #[inline(always)]
    fn grid(&self, ib: usize) -> [u64; 4] {
        std::array::from_fn(|k| {
            let hi = ((self.qh[ib] >> (2 * k)) & 3) as usize;
            IQ2S_GRID[self.qs[4 * ib + k] as usize | hi << 8]
        })
    }
    #[inline(always)]
    fn signs(&self, ib: usize) -> u32 {
        u32_at(&self.qs, QK_K / 8 + 4 * ib)
    }
    #[inline(always)]
    fn scales(&self, ib: usize) -> [u8; 2] {
        nibble_scales(self.scales[ib])
    }
}

impl IqBlock for BlockIQ3XXS {
    const FACTOR: f32 = 0.25;
    fn d(&self) -> [u8; 2] {
        self.d
    }
    #[inline(always)]
    fn grid(&self, ib: usize) -> [u64; 4] {
        let g = |k: usize| IQ3XXS_GRID[self.qs[8 * ib + k] as usize];
        std::array::from_fn(|m| pair(g(2 * m), g(2 * m + 1)))
    }
    #[inline(always)]
    fn signs(&self, ib: usize) -> u32 {
        ksigns32(u32_at(&self.qs, QK_K / 4 + 4 * ib))
    }
    #[inline(always)]
    fn scales(&self, ib: usize) -> [u8; 2] {
        let s = (u32_at(&self.qs, QK_K / 4 + 4 * ib) >> 28) as u8;
        [2 * s + 1; 2]
    }
}

impl IqBlock for BlockIQ3S {
    const FACTOR: f32 = 1.0;
    fn d(&self) -> [u8; 2] {
        self.d
    }
    #[inline(always)]
    fn grid(&self, ib: usize) -> [u64; 4] {
        let g = |k: usize| {
            let hi = ((self.qh[ib] >> k) & 1) as usize;
            IQ3S_GRID[self.qs[8 * ib + k] as usize | hi << 8]
        };
        std::array::from_fn(|m| pair(g(2 * m), g(2 * m + 1)))
    }
    #[inline(always)]
    fn signs(&self, ib: usize) -> u32 {
        u32_at(&self.signs, 4 * ib)
    }
    #[inline(always)]
    fn scales(&self, ib: usize) -> [u8; 2] {
        let s = (self.scales[ib / 2] >> (4 * (ib % 2))) & 15;
        [2 * s + 1; 2]
    }
}

/// The 32 magnitudes of a sub-block in element order.
#[inline(always)]
pub(super) fn grid_bytes(g: [u64; 4]) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (o, w) in out.chunks_exact_mut(8).zip(g) {
        o.copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// One block -> 256 floats: `db = d * (2s + 1) * FACTOR` per 16 elements (exact), then
/// `db * magnitude`, negated where the sign bit is set (see the module header for why this
/// equals gguf-py's order bit for bit).
#[inline]
pub fn dequant<B: IqBlock>(b: &B, y: &mut [f32]) {
    let d = f16_le(b.d());
    for (ib, out) in y[..QK_K].chunks_exact_mut(32).enumerate() {
        let g = grid_bytes(b.grid(ib));
        let s = b.signs(ib);
        let sc = b.scales(ib);
        for (e, o) in out.iter_mut().enumerate() {
            let v = d * sc[e / 16] as f32 * B::FACTOR * g[e] as f32;
            *o = if (s >> e) & 1 == 1 { -v } else { v };
        }
    }
}

/// One block as the integer matmat kernels see it (`matmat::decode_row`): per element the
/// signed magnitude plus `off` (magnitudes <= 62, so `u` stays in 2..=126 with `off` = 64), per
/// 16 elements the scale `d * (2s + 1) * FACTOR` (exact, as in `dequant`).
#[inline]
pub(super) fn matmat_unpack<B: IqBlock>(b: &B, off: i32, u: &mut [u8], fw: &mut [f32]) {
    let d = f16_le(b.d());
    for ib in 0..QK_K / 32 {
        let g = grid_bytes(b.grid(ib));
        let s = b.signs(ib);
        let sc = b.scales(ib);
        for (e, o) in u[32 * ib..32 * ib + 32].iter_mut().enumerate() {
            let m = g[e] as i32;
            *o = (if (s >> e) & 1 == 1 { off - m } else { off + m }) as u8;
        }
        fw[2 * ib] = d * sc[0] as f32 * B::FACTOR;
        fw[2 * ib + 1] = d * sc[1] as f32 * B::FACTOR;
    }
}

/// The 8 i32 lanes of one super-block: lane l = sum over the elements e with (e % 32) / 4 == l
/// of scale(e) * magnitude(e) * (activation e, negated wrapping where the sign bit is set).
#[inline(always)]
pub(super) fn lanes<B: IqBlock>(x: &B, y: &BlockQ8K) -> [i32; 8] {
    let mut p = [0i32; 8];
    for ib in 0..QK_K / 32 {
        let g = grid_bytes(x.grid(ib));
        let s = x.signs(ib);
        let sc = x.scales(ib);
        for e in 0..32 {
            let q = y.qs[32 * ib + e];
            let q = if (s >> e) & 1 == 1 { q.wrapping_neg() } else { q };
            p[(e % 32) / 4] += sc[e / 16] as i32 * (g[e] as i32 * q as i32);
        }
    }
    p
}

/// ggml_vec_dot_iq*_q8_K (AVX2 order): per super-block `acc = fma(f16(dx) * dy, lanes, acc)`;
/// result `FACTOR * hsum8(acc)`.
#[inline(always)]
pub(super) fn dot<B: IqBlock>(w: &[B], a: &[BlockQ8K]) -> f32 {
    let mut acc = [0f32; 8];
    for (x, y) in w.iter().zip(a) {
        fma_lanes(&mut acc, h16(x.d()) * q8k_d(y), &lanes(x, y));
    }
    B::FACTOR * hsum8(acc)
}

//! On-disk block layouts of GGUF's legacy (Q4_0 .. Q8_0), k-quant (Q2_K .. Q8_K), 4-bit
//! lookup-table (IQ4_NL, IQ4_XS, MXFP4) and 2-/3-bit grid (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
//! IQ3_S) types, and of cortiq's own block types q4t and q1 (q8r has no block struct: a row is its i8 quants and
//! one trailing f32, see `quant::q8r`).
//!
//! Owns: the `#[repr(C)]` structs, their compile-time size checks, and the zero-copy view of a
//! byte slice as a slice of blocks. Field order and widths of the GGUF types follow ggml's
//! `block_*` structs.
//!
//! Every multi-byte field is stored as a little-endian byte array (`[u8; 2]` for an f16,
//! `[u8; 4]` for an f32) rather than `half::f16`/`f32`. That keeps every block's alignment at 1,
//! so a tensor's bytes straight out of an mmap (any alignment) can be viewed as `&[Block]`
//! without a copy and without undefined behaviour, and it keeps the layout independent of the
//! host's endianness (GGUF is little-endian).

use core::mem::{align_of, size_of};
use half::f16;

/// Elements per k-quant super-block.
pub const QK_K: usize = 256;
/// Elements per legacy block.
pub const QK: usize = 32;

/// Decode a little-endian IEEE half to f32 (exact: every f16 is representable in f32).
#[inline(always)]
pub fn f16_le(b: [u8; 2]) -> f32 {
    f16::from_bits(u16::from_le_bytes(b)).to_f32()
}

/// Decode a little-endian IEEE half to f32 in software (exact; `half`'s `to_f32` re-detects F16C
/// on every call, which is slow in per-block loops). Used by cortiq's own types' scalar code.
#[inline(always)]
pub fn f16_soft(b: [u8; 2]) -> f32 {
    f16::from_bits(u16::from_le_bytes(b)).to_f32_const()
}

/// Q4_0: `d * (q - 8)`, q in 0..16. Element j < 16 is the low nibble of `qs[j]`,
/// element j >= 16 the high nibble of `qs[j - 16]`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4_0 {
    pub d: [u8; 2],
    pub qs: [u8; QK / 2],
}

/// Q4_1: `d * q + m`, q in 0..16, nibble order as Q4_0.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qs: [u8; QK / 2],
}

/// Q5_0: `d * (q - 16)`, q in 0..32; bit j of the little-endian u32 `qh` is bit 4 of element j.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5_0 {
    pub d: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// Q5_1: `d * q + m`, q in 0..32, bit layout as Q5_0.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// Q8_0: `d * q`, q an i8.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8_0 {
    pub d: [u8; 2],
    pub qs: [i8; QK],
}

/// Q2_K: 16 groups of 16; `d * (scales[g] & 15) * q - dmin * (scales[g] >> 4)`, q in 0..4.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: [u8; 2],
    pub dmin: [u8; 2],
}

/// Q3_K: 16 groups of 16; 6-bit signed scales (offset 32) packed in 12 bytes; q in -4..4 where
/// the `hmask` bit *clear* means subtract 4.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: [u8; 2],
}

/// Q4_K: 8 groups of 32; 6-bit scales and mins packed in 12 bytes; `d*sc * q - dmin*m`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}

/// Q5_K: as Q4_K plus a fifth bit per element in `qh`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; 12],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

/// Q6_K: 16 groups of 16 with i8 scales; `d*scale * (q - 32)`, q in 0..64.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: [u8; 2],
}

/// Q8_K: f32 scale (not f16), i8 quants, and per-16 sums used only by dot products.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8K {
    pub d: [u8; 4],
    pub qs: [i8; QK_K],
    pub bsums: [[u8; 2]; QK_K / 16],
}

/// IQ4_NL's (and IQ4_XS's) 16 levels, ggml's `kvalues_iq4nl`: element = `d * KVALUES_IQ4NL[q]`.
/// Non-uniform, denser near zero, and no exact zero.
pub const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// MXFP4's 16 levels, ggml's `kvalues_mxfp4`: the FP4 E2M1 values doubled (0, 0.5, 1, 1.5, 2, 3,
/// 4, 6 and their negatives, times 2), so that they are integers; the block scale is halved to
/// match (`e8m0_half`). Index 8 is E2M1's -0, stored here as 0.
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// IQ4_NL: `d * KVALUES_IQ4NL[q]`, q in 0..16, nibble order as Q4_0 (element j < 16 the low
/// nibble of `qs[j]`, element j >= 16 the high nibble of `qs[j - 16]`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockIQ4NL {
    pub d: [u8; 2],
    pub qs: [u8; QK / 2],
}

/// IQ4_XS: 8 sub-blocks of 32, each an IQ4_NL block without its own f16: sub-block ib has the
/// 6-bit scale `ls = (scales_l[ib/2] >> 4*(ib%2)) & 15 | ((scales_h >> 2*ib) & 3) << 4` and
/// decodes as `(d * (ls - 32)) * KVALUES_IQ4NL[q]` over `qs[16*ib..16*ib + 16]` in IQ4_NL's
/// nibble order. 4.25 bits per weight.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockIQ4XS {
    pub d: [u8; 2],
    /// Little-endian u16: bits 2ib..2ib+2 are bits 4..6 of sub-block ib's scale.
    pub scales_h: [u8; 2],
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}

/// MXFP4 (OCP microscaling FP4): an E8M0 exponent byte `e` and 32 E2M1 values as nibbles (order
/// as Q4_0); element = `KVALUES_MXFP4[q] * e8m0_half(e)`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockMXFP4 {
    pub e: u8,
    pub qs: [u8; QK / 2],
}

/// Half the E8M0 scale of an MXFP4 block, 2^(e - 128), as ggml's `GGML_E8M0_TO_FP32_HALF` builds
/// it from bits: e = 0 and 1 are the subnormals 2^-128 and 2^-127 (0x00200000 << e), otherwise
/// the exponent field is e - 1 with a zero mantissa. e = 255 gives 2^127 (ggml keeps no NaN).
/// Exact, and so are the products with the small-integer levels unless they overflow.
#[inline(always)]
pub const fn e8m0_half(e: u8) -> f32 {
    if e < 2 { f32::from_bits(0x0020_0000 << e) } else { f32::from_bits(((e - 1) as u32) << 23) }
}

/// IQ2_XXS: 8 sub-blocks of 32. Sub-block ib owns the two little-endian u32 `a0`, `a1` at
/// `qs[8ib..8ib + 8]`: byte k of `a0` indexes `iq_grids::IQ2XXS_GRID` (8 magnitudes) for elements
/// 8k..8k+8, bits 7k..7k+7 of `a1` index `KSIGNS_IQ2XS` for their signs, and `a1 >> 28` is the
/// scale: element = `d * (0.5 + (a1 >> 28)) * 0.25 * grid * sign`. 2.06 bits per weight.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockIQ2XXS {
    pub d: [u8; 2],
    pub qs: [u8; QK_K / 4],
}

/// IQ2_XS: 32 little-endian u16 `q` in `qs`, one per 8 elements: `q & 511` indexes
/// `IQ2XS_GRID`, `q >> 9` indexes `KSIGNS_IQ2XS`; sub-block ib's scales are the nibbles of
/// `scales[ib]` (low: elements 0..16, high: 16..32), element = `d * (0.5 + s) * 0.25 * grid *
/// sign`. 2.31 bits per weight.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockIQ2XS {
    pub d: [u8; 2],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; QK_K / 32],
}

/// IQ2_S: `qs[0..32]` are the low 8 bits of the 32 grid indices (`IQ2S_GRID`, 8 magnitudes
/// each), bits 2k..2k+2 of `qh[ib]` their high 2 bits (index 4ib + k); `qs[32..64]` are sign
/// bits, one per element (bit j%8 of byte j/8); scales as IQ2_XS. 2.56 bits per weight.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockIQ2S {
    pub d: [u8; 2],
    pub qs: [u8; QK_K / 4],
    pub qh: [u8; QK_K / 32],
    pub scales: [u8; QK_K / 32],
}

/// IQ3_XXS: `qs[0..64]` index `IQ3XXS_GRID` (4 magnitudes each); sub-block ib's little-endian
/// u32 at `qs[64 + 4ib..]` holds four 7-bit `KSIGNS_IQ2XS` indices (bits 7k.., elements
/// 8k..8k+8) and the scale in its top 4 bits: element = `d * (0.5 + s) * 0.5 * grid * sign`.
/// 3.06 bits per weight.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockIQ3XXS {
    pub d: [u8; 2],
    pub qs: [u8; 3 * QK_K / 8],
}

/// IQ3_S: 64 grid indices (`IQ3S_GRID`, 4 magnitudes each) of 9 bits: `qs[k]` and bit k%8 of
/// `qh[k/8]`; one sign bit per element in `signs`; sub-block ib's scale is nibble ib%2 of
/// `scales[ib/2]`: element = `d * (1 + 2s) * grid * sign`. 3.44 bits per weight.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockIQ3S {
    pub d: [u8; 2],
    pub qs: [u8; QK_K / 4],
    pub qh: [u8; QK_K / 32],
    pub signs: [u8; QK_K / 8],
    pub scales: [u8; QK_K / 64],
}

/// Elements per block of cortiq's q4t and q1 types: 128 divides every row length of the models
/// we run (Gemma 3's 640 is 2.5 k-quant super-blocks, so 256 would not), and 64 packed bytes of
/// q4t are exactly one 512-bit load.
pub const QK_T: usize = 128;

/// q4t's 16 levels: element = `d[g] * Q4T_LEVELS[q]`. Non-uniform, denser near zero: a Lloyd-Max
/// design for 32-element groups of Gaussian values under the per-group least-squares scale
/// (iterated on 1.3M values, rounded to i8, the middle level pinned to an exact 0). Against the
/// uniform grid -8..7 it cuts the RMS error by 10% on Gaussian rows and by 12-19% on Gemma 3's
/// weights, and costs the dot product one byte shuffle per 64 weights.
pub const Q4T_LEVELS: [i8; 16] = [-127, -99, -80, -64, -49, -36, -24, -12, 0, 12, 24, 36, 50, 66, 83, 106];

/// q4t: 128 elements in 4 groups of 32, `d[g] * Q4T_LEVELS[q]`, q in 0..16. The 64 nibble bytes are
/// tiled for one 512-bit load: element e < 64 is the low nibble of `qs[e]`, element e >= 64 the
/// high nibble of `qs[e - 64]`, so mask / shift+mask of the loaded register give elements 0..64
/// and 64..128 in order, each register spanning two 32-element groups (two Q8_0 activation
/// blocks), and one byte shuffle maps the indices to levels. 72 bytes per 128 elements: 4.5 bits
/// per weight, scales included.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4T {
    /// f16 scale of elements 32g..32g+32.
    pub d: [[u8; 2]; 4],
    pub qs: [u8; QK_T / 2],
}

/// q1: 128 signs and one f16 scale; element e is `+d` when bit e of the little-endian 128-bit
/// `qs` is set, else `-d` (bit e = bit e%8 of byte e/8). 18 bytes per 128 elements: 1.125 bits
/// per weight.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ1 {
    pub qs: [u8; QK_T / 8],
    /// f16 mean |w| of the block (the least-squares scale for fixed signs).
    pub d: [u8; 2],
}

const _: () = assert!(size_of::<BlockQ4T>() == 72);
const _: () = assert!(size_of::<BlockQ1>() == 18);

// Sizes must equal ggml's (QuantType::type_size); alignment 1 is what makes `view` sound.
const _: () = assert!(size_of::<BlockQ4_0>() == 18);
const _: () = assert!(size_of::<BlockQ4_1>() == 20);
const _: () = assert!(size_of::<BlockQ5_0>() == 22);
const _: () = assert!(size_of::<BlockQ5_1>() == 24);
const _: () = assert!(size_of::<BlockQ8_0>() == 34);
const _: () = assert!(size_of::<BlockQ2K>() == 84);
const _: () = assert!(size_of::<BlockQ3K>() == 110);
const _: () = assert!(size_of::<BlockQ4K>() == 144);
const _: () = assert!(size_of::<BlockQ5K>() == 176);
const _: () = assert!(size_of::<BlockQ6K>() == 210);
const _: () = assert!(size_of::<BlockQ8K>() == 292);
const _: () = assert!(size_of::<BlockIQ4NL>() == 18);
const _: () = assert!(size_of::<BlockIQ4XS>() == 136);
const _: () = assert!(size_of::<BlockMXFP4>() == 17);
const _: () = assert!(size_of::<BlockIQ2XXS>() == 66);
const _: () = assert!(size_of::<BlockIQ2XS>() == 74);
const _: () = assert!(size_of::<BlockIQ2S>() == 82);
const _: () = assert!(size_of::<BlockIQ3XXS>() == 98);
const _: () = assert!(size_of::<BlockIQ3S>() == 110);

/// A block struct that may be viewed from raw bytes.
///
/// # Safety
/// Implementors must be `#[repr(C)]`, have alignment 1, no padding, and accept every bit
/// pattern (only `u8`/`i8` fields and arrays of them).
pub unsafe trait Block: Copy + 'static {
    /// Elements this block decodes to.
    const ELEMS: usize;
}

macro_rules! impl_block {
    ($($t:ty => $n:expr),* $(,)?) => {$(
        const _: () = assert!(align_of::<$t>() == 1);
        // SAFETY: the struct above is repr(C), byte arrays only (align 1, no padding, any bits).
        unsafe impl Block for $t { const ELEMS: usize = $n; }
    )*};
}
impl_block!(
    BlockQ4_0 => QK, BlockQ4_1 => QK, BlockQ5_0 => QK, BlockQ5_1 => QK, BlockQ8_0 => QK,
    BlockQ2K => QK_K, BlockQ3K => QK_K, BlockQ4K => QK_K, BlockQ5K => QK_K, BlockQ6K => QK_K,
    BlockQ8K => QK_K, BlockQ4T => QK_T, BlockQ1 => QK_T, BlockIQ4NL => QK, BlockIQ4XS => QK_K,
    BlockMXFP4 => QK, BlockIQ2XXS => QK_K, BlockIQ2XS => QK_K, BlockIQ2S => QK_K, BlockIQ3XXS => QK_K,
    BlockIQ3S => QK_K,
);

/// View `bytes` as a slice of blocks, zero-copy.
///
/// Panics when `bytes.len()` is not a whole number of blocks (callers size it from
/// `QuantType::row_bytes`, so this is a programming error, not bad input).
pub fn view<B: Block>(bytes: &[u8]) -> &[B] {
    let sz = size_of::<B>();
    assert!(
        bytes.len().is_multiple_of(sz),
        "quant::blocks::view: {} bytes is not a whole number of {}-byte blocks",
        bytes.len(),
        sz
    );
    // SAFETY: B has alignment 1, no padding and accepts any bit pattern (Block's contract), and
    // the length is an exact multiple of size_of::<B>(); the lifetime is tied to `bytes`.
    unsafe { core::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), bytes.len() / sz) }
}

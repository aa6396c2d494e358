//! Quantized tensor element types (GGUF's, numbered as ggml numbers them, and cortiq's own q8r,
//! q4t, q1), their block geometry, and row dequantization. The engine's QTensor is the only
//! caller that dispatches on a type.

pub mod blocks;
pub mod dequant;
pub mod dequant_avx512;
mod fastk;
pub mod fastvec;
mod fastvec_avx512;
pub mod ileave;
mod ileave_k;
pub mod iq23;
mod iq23_simd;
pub mod iq_grids;
pub mod matmat;
#[cfg(target_arch = "x86_64")]
mod matmat_avx2;
pub mod matmat_avx512;
mod own_avx512;
mod q1;
mod q4t;
mod q8r;
pub mod quantize;
pub mod vecdot;
pub mod vecdot_avx2;
pub mod vecdot_avx512;
mod vecmulti;

pub use dequant::{dequantize_row, dequantize_row_scalar, dequantize_rows, dot_row};
pub use fastvec::{fastvec_supported, matvec_fast, matvec_fast_multi, matvec_fast_multi_scalar, matvec_fast_scalar, matvec_own};
pub use ileave::{
    IL_ROWS, IleaveCols, huge_zeroed, ileave, ileave_bytes, ileave_cols, ileave_group_bytes, ileave_rows, ileave_supported,
    matvec_ileave, matvec_ileave_cols, matvec_ileave_scalar,
};
pub use matmat::{MatmatActs, matmat_q, matmat_q_prepared, matmat_q_prepared_tm, matmat_q_scalar, matmat_supported};
pub use quantize::{QuantizeError, quantize_row, quantize_row_weighted};
pub use vecdot::{
    ActType, Order, Reads, act_type, dequantize_act, llamacpp_order, llamacpp_repacks, matvec_q, matvec_q_order,
    matvec_q_order_tile, order_supported, quantize_act, quantize_act_scalar, quantize_act_to, vec_dot, vec_dot_order,
    vec_dot_order_scalar, vec_dot_scalar,
};

/// A tensor element type: GGUF's (numbered as ggml numbers them, the GGUF on-disk id) and
/// cortiq's own (`OWN`: no GGUF id; ids from 1000 on, see `cmf_id`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    /// 4-bit lookup-table levels (`blocks::KVALUES_IQ4NL`), one f16 scale per 32.
    IQ4NL,
    /// IQ4_NL's levels with a 6-bit scale per 32 under one f16 per 256.
    IQ4XS,
    /// OCP microscaling FP4: E2M1 values, one E8M0 (power of two) scale per 32.
    MXFP4,
    /// 2.06 bits per weight: 8-element grid entries (256) with 7-bit sign patterns, a 4-bit
    /// scale per 32, one f16 per 256 (`iq23.rs`).
    IQ2XXS,
    /// 2.31 bits: IQ2_XXS with a 512-entry grid and 4-bit scales per 16.
    IQ2XS,
    /// 2.56 bits: a 1024-entry grid, a sign bit per element, 4-bit scales per 16.
    IQ2S,
    /// 3.06 bits: 4-element grid entries (256), 7-bit sign patterns, a 4-bit scale per 32.
    IQ3XXS,
    /// 3.44 bits: a 512-entry 4-element grid, a sign bit per element, 4-bit scales per 32.
    IQ3S,
    /// cortiq: i8 per element, one f32 scale per row (`q8r.rs`).
    Q8R,
    /// cortiq: 4-bit, 128-element blocks with 4 f16 scales, tiled for 512-bit loads (`q4t.rs`).
    Q4T,
    /// cortiq: 1 bit (sign) per element, one f16 scale per 128 (`q1.rs`).
    Q1,
}

impl QuantType {
    /// Every GGUF type (the ones with ggml ids and gguf-py reference fixtures); cortiq's own
    /// types are `OWN`.
    pub const ALL: [QuantType; 22] = [
        QuantType::F32,
        QuantType::F16,
        QuantType::BF16,
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q5_1,
        QuantType::Q8_0,
        QuantType::Q2K,
        QuantType::Q3K,
        QuantType::Q4K,
        QuantType::Q5K,
        QuantType::Q6K,
        QuantType::Q8K,
        QuantType::IQ4NL,
        QuantType::IQ4XS,
        QuantType::MXFP4,
        QuantType::IQ2XXS,
        QuantType::IQ2XS,
        QuantType::IQ2S,
        QuantType::IQ3XXS,
        QuantType::IQ3S,
    ];

    /// cortiq's own weight types, which only cortiq's files (.cmf) store.
    pub const OWN: [QuantType; 3] = [QuantType::Q8R, QuantType::Q4T, QuantType::Q1];

    /// The ggml type id used in GGUF tensor infos; `None` for ids cortiq does not load. Never
    /// returns a cortiq type: a GGUF file cannot name one.
    pub fn from_ggml_id(id: u32) -> Option<QuantType> {
        Some(match id {
            0 => QuantType::F32,
            1 => QuantType::F16,
            2 => QuantType::Q4_0,
            3 => QuantType::Q4_1,
            6 => QuantType::Q5_0,
            7 => QuantType::Q5_1,
            8 => QuantType::Q8_0,
            10 => QuantType::Q2K,
            11 => QuantType::Q3K,
            12 => QuantType::Q4K,
            13 => QuantType::Q5K,
            14 => QuantType::Q6K,
            15 => QuantType::Q8K,
            16 => QuantType::IQ2XXS,
            17 => QuantType::IQ2XS,
            18 => QuantType::IQ3XXS,
            20 => QuantType::IQ4NL,
            21 => QuantType::IQ3S,
            22 => QuantType::IQ2S,
            23 => QuantType::IQ4XS,
            30 => QuantType::BF16,
            39 => QuantType::MXFP4,
            _ => return None,
        })
    }

    /// The ggml type id; for cortiq's own types their private id (>= 1000, not a ggml id, and
    /// `from_ggml_id` rejects it), the same as `cmf_id`.
    pub fn ggml_id(self) -> u32 {
        match self {
            QuantType::F32 => 0,
            QuantType::F16 => 1,
            QuantType::Q4_0 => 2,
            QuantType::Q4_1 => 3,
            QuantType::Q5_0 => 6,
            QuantType::Q5_1 => 7,
            QuantType::Q8_0 => 8,
            QuantType::Q2K => 10,
            QuantType::Q3K => 11,
            QuantType::Q4K => 12,
            QuantType::Q5K => 13,
            QuantType::Q6K => 14,
            QuantType::Q8K => 15,
            QuantType::IQ2XXS => 16,
            QuantType::IQ2XS => 17,
            QuantType::IQ3XXS => 18,
            QuantType::IQ4NL => 20,
            QuantType::IQ3S => 21,
            QuantType::IQ2S => 22,
            QuantType::IQ4XS => 23,
            QuantType::BF16 => 30,
            QuantType::MXFP4 => 39,
            QuantType::Q8R => 1000,
            QuantType::Q4T => 1001,
            QuantType::Q1 => 1002,
        }
    }

    /// The type id in cortiq's .cmf files: the ggml id for GGUF types, 1000.. for cortiq's own.
    pub fn cmf_id(self) -> u32 {
        self.ggml_id()
    }

    /// Inverse of `cmf_id`: every GGUF type cortiq loads, and cortiq's own.
    pub fn from_cmf_id(id: u32) -> Option<QuantType> {
        match id {
            1000 => Some(QuantType::Q8R),
            1001 => Some(QuantType::Q4T),
            1002 => Some(QuantType::Q1),
            _ => QuantType::from_ggml_id(id),
        }
    }

    /// The type named `name` (as `name()` spells it: "q4_K", "q8r", ...).
    pub fn from_name(name: &str) -> Option<QuantType> {
        QuantType::ALL.into_iter().chain(QuantType::OWN).find(|t| t.name() == name)
    }

    /// Whether this is one of cortiq's own types (`OWN`).
    pub fn is_cortiq(self) -> bool {
        matches!(self, QuantType::Q8R | QuantType::Q4T | QuantType::Q1)
    }

    /// Bytes a row carries besides its blocks: q8r's trailing f32 scale, 0 for every other type.
    /// Non-zero means k rows back to back are not one row of k times the length (use
    /// `dequantize_rows` for runs of rows).
    pub fn row_trailer(self) -> usize {
        if self == QuantType::Q8R { q8r::TRAILER } else { 0 }
    }

    /// ggml's name for the type ("q4_K", "bf16", ...).
    pub fn name(self) -> &'static str {
        match self {
            QuantType::F32 => "f32",
            QuantType::F16 => "f16",
            QuantType::BF16 => "bf16",
            QuantType::Q4_0 => "q4_0",
            QuantType::Q4_1 => "q4_1",
            QuantType::Q5_0 => "q5_0",
            QuantType::Q5_1 => "q5_1",
            QuantType::Q8_0 => "q8_0",
            QuantType::Q2K => "q2_K",
            QuantType::Q3K => "q3_K",
            QuantType::Q4K => "q4_K",
            QuantType::Q5K => "q5_K",
            QuantType::Q6K => "q6_K",
            QuantType::Q8K => "q8_K",
            QuantType::IQ4NL => "iq4_nl",
            QuantType::IQ4XS => "iq4_xs",
            QuantType::MXFP4 => "mxfp4",
            QuantType::IQ2XXS => "iq2_xxs",
            QuantType::IQ2XS => "iq2_xs",
            QuantType::IQ2S => "iq2_s",
            QuantType::IQ3XXS => "iq3_xxs",
            QuantType::IQ3S => "iq3_s",
            QuantType::Q8R => "q8r",
            QuantType::Q4T => "q4t",
            QuantType::Q1 => "q1",
        }
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            QuantType::F32 | QuantType::F16 | QuantType::BF16 => 1,
            QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q5_0 | QuantType::Q5_1 | QuantType::Q8_0 => 32,
            QuantType::IQ4NL | QuantType::MXFP4 => 32,
            QuantType::Q2K | QuantType::Q3K | QuantType::Q4K | QuantType::Q5K | QuantType::Q6K | QuantType::Q8K => 256,
            QuantType::IQ4XS => 256,
            QuantType::IQ2XXS | QuantType::IQ2XS | QuantType::IQ2S | QuantType::IQ3XXS | QuantType::IQ3S => 256,
            QuantType::Q8R => 32,
            QuantType::Q4T | QuantType::Q1 => 128,
        }
    }

    /// Byte offsets in a GGUF block of its f16 scale fields (d, and m / dmin where the type has
    /// one); empty for the float types, MXFP4 (its scale is an E8M0 byte) and cortiq's own types.
    /// What tests and benches set to finite values in random blocks.
    pub fn f16_scale_fields(self) -> &'static [usize] {
        match self {
            QuantType::Q4_0 | QuantType::Q5_0 | QuantType::Q8_0 | QuantType::IQ4NL | QuantType::IQ4XS => &[0],
            QuantType::IQ2XXS | QuantType::IQ2XS | QuantType::IQ2S | QuantType::IQ3XXS | QuantType::IQ3S => &[0],
            QuantType::Q4_1 | QuantType::Q5_1 | QuantType::Q4K | QuantType::Q5K => &[0, 2],
            QuantType::Q2K => &[80, 82],
            QuantType::Q3K => &[108],
            QuantType::Q6K => &[208],
            _ => &[],
        }
    }

    /// Bytes per block (q8r: 32 quants per 32 elements; its row's trailing scale is
    /// `row_trailer`).
    pub fn type_size(self) -> usize {
        match self {
            QuantType::F32 => 4,
            QuantType::F16 | QuantType::BF16 => 2,
            QuantType::Q4_0 => 18,
            QuantType::Q4_1 => 20,
            QuantType::Q5_0 => 22,
            QuantType::Q5_1 => 24,
            QuantType::Q8_0 => 34,
            QuantType::Q2K => 84,
            QuantType::Q3K => 110,
            QuantType::Q4K => 144,
            QuantType::Q5K => 176,
            QuantType::Q6K => 210,
            QuantType::Q8K => 292,
            QuantType::IQ4NL => 18,
            QuantType::IQ4XS => 136,
            QuantType::MXFP4 => 17,
            QuantType::IQ2XXS => 66,
            QuantType::IQ2XS => 74,
            QuantType::IQ2S => 82,
            QuantType::IQ3XXS => 98,
            QuantType::IQ3S => 110,
            QuantType::Q8R => 32,
            QuantType::Q4T => 72,
            QuantType::Q1 => 18,
        }
    }

    /// Bytes of a row of `n` elements (its blocks plus `row_trailer`), or `None` when `n` is not
    /// a whole number of blocks.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        let bs = self.block_size();
        if !n.is_multiple_of(bs) {
            return None;
        }
        (n / bs).checked_mul(self.type_size())?.checked_add(self.row_trailer())
    }
}

impl std::fmt::Display for QuantType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

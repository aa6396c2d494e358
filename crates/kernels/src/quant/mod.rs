//! Quantized tensor element types as GGUF numbers them, their block geometry, and
//! row dequantization. The engine's QTensor is the only caller that dispatches on a type.

pub mod blocks;
pub mod dequant;
pub mod dequant_avx512;
pub mod vecdot;
pub mod vecdot_avx512;
pub mod matmat;
pub mod matmat_avx512;

pub use dequant::{dequantize_row, dequantize_row_scalar, dot_row};
pub use matmat::{matmat_q, matmat_q_scalar, matmat_supported};
pub use vecdot::{
    ActType, Order, act_type, dequantize_act, llamacpp_order, llamacpp_repacks, matvec_q, matvec_q_order, order_supported,
    quantize_act, quantize_act_scalar, vec_dot, vec_dot_order, vec_dot_order_scalar, vec_dot_scalar,
};

/// A tensor element type, numbered as ggml numbers it (the GGUF on-disk id).
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
}

impl QuantType {
    pub const ALL: [QuantType; 14] = [
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
    ];

    /// The ggml type id used in GGUF tensor infos; `None` for ids cortiq does not load.
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
            30 => QuantType::BF16,
            _ => return None,
        })
    }

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
            QuantType::BF16 => 30,
        }
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
        }
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            QuantType::F32 | QuantType::F16 | QuantType::BF16 => 1,
            QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q5_0 | QuantType::Q5_1 | QuantType::Q8_0 => 32,
            QuantType::Q2K | QuantType::Q3K | QuantType::Q4K | QuantType::Q5K | QuantType::Q6K | QuantType::Q8K => 256,
        }
    }

    /// Bytes per block.
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
        }
    }

    /// Bytes of a row of `n` elements, or `None` when `n` is not a whole number of blocks.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        let bs = self.block_size();
        if !n.is_multiple_of(bs) {
            return None;
        }
        (n / bs).checked_mul(self.type_size())
    }
}

impl std::fmt::Display for QuantType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

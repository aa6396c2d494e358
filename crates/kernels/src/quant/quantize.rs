//! f32 rows -> cortiq's own weight types (q8r, q4t, q1).
//!
//! Owns: `quantize_row`, the one public entry point of the three quantizers (`q8r.rs`,
//! `q4t.rs`, `q1.rs`), and `QuantizeError`. GGUF types are not produced here: cortiq reads
//! those as llama.cpp wrote them.

use super::QuantType;

/// Why `quantize_row` refused a row.
#[derive(Clone, Debug, PartialEq)]
pub enum QuantizeError {
    /// `ty` is not one of cortiq's own types (only q8r, q4t, q1 are produced here).
    Unsupported { ty: QuantType },
    /// The row length is not a whole number of `ty`'s blocks, or `out` has the wrong size.
    Length { ty: QuantType, n: usize, want: Option<usize>, got: usize },
    /// A NaN or infinity at `index`: no scale represents it, and silently storing garbage would
    /// surface only as a bad perplexity much later.
    NonFinite { ty: QuantType, index: usize, value: f32 },
}

impl std::fmt::Display for QuantizeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QuantizeError::Unsupported { ty } => write!(f, "quantize_row: {ty} is not a cortiq type (q8r, q4t, q1)"),
            QuantizeError::Length { ty, n, want: Some(w), got } => {
                write!(f, "quantize_row({ty}): {n} elements need {w} output bytes, got {got}")
            }
            QuantizeError::Length { ty, n, want: None, .. } => {
                write!(f, "quantize_row({ty}): {n} elements is not a whole number of {}-element blocks", ty.block_size())
            }
            QuantizeError::NonFinite { ty, index, value } => {
                write!(f, "quantize_row({ty}): element {index} is {value} (not finite)")
            }
        }
    }
}

impl std::error::Error for QuantizeError {}

/// Quantize one row `src` of type `ty` (q8r, q4t or q1) into `out`, which must be exactly
/// `ty.row_bytes(src.len())` bytes (q8r: `src.len()` a multiple of 32; q4t and q1: of 128).
///
/// Errors, with `out` untouched: another type, a length that does not fit, or a non-finite
/// input value. Never panics. Deterministic (same bytes on every machine: scalar code only,
/// since conversion runs once per model and its output is the reference the kernels decode).
pub fn quantize_row(ty: QuantType, src: &[f32], out: &mut [u8]) -> Result<(), QuantizeError> {
    if !ty.is_cortiq() {
        return Err(QuantizeError::Unsupported { ty });
    }
    let want = ty.row_bytes(src.len());
    if want != Some(out.len()) {
        return Err(QuantizeError::Length { ty, n: src.len(), want, got: out.len() });
    }
    if let Some(index) = src.iter().position(|v| !v.is_finite()) {
        return Err(QuantizeError::NonFinite { ty, index, value: src[index] });
    }
    match ty {
        QuantType::Q8R => super::q8r::quantize(src, out),
        QuantType::Q4T => super::q4t::quantize(src, out),
        QuantType::Q1 => super::q1::quantize(src, out),
        _ => unreachable!("is_cortiq checked"),
    }
    Ok(())
}

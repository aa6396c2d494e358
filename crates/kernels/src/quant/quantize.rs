//! f32 rows -> cortiq's own weight types (q8r, q4t, q1).
//!
//! Owns: `quantize_row` / `quantize_row_weighted`, the public entry points of the three
//! quantizers (`q8r.rs`, `q4t.rs`, `q1.rs`), and `QuantizeError`. GGUF types are not produced here: cortiq reads
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
    /// `quantize_row_weighted`: the importance vector's length differs from the row's.
    ImportanceLength { ty: QuantType, n: usize, got: usize },
    /// `quantize_row_weighted`: importance at `index` is negative or not finite.
    BadImportance { ty: QuantType, index: usize, value: f32 },
}

impl std::fmt::Display for QuantizeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QuantizeError::Unsupported { ty } => write!(f, "quantize_row: cannot produce {ty} (q8_0, q8r, q4t, q1)"),
            QuantizeError::Length { ty, n, want: Some(w), got } => {
                write!(f, "quantize_row({ty}): {n} elements need {w} output bytes, got {got}")
            }
            QuantizeError::Length { ty, n, want: None, .. } => {
                write!(f, "quantize_row({ty}): {n} elements is not a whole number of {}-element blocks", ty.block_size())
            }
            QuantizeError::NonFinite { ty, index, value } => {
                write!(f, "quantize_row({ty}): element {index} is {value} (not finite)")
            }
            QuantizeError::ImportanceLength { ty, n, got } => {
                write!(f, "quantize_row_weighted({ty}): {n} elements but {got} importance values")
            }
            QuantizeError::BadImportance { ty, index, value } => {
                write!(f, "quantize_row_weighted({ty}): importance {index} is {value} (must be finite and >= 0)")
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
    quantize_impl(ty, src, None, out)
}

/// `quantize_row` minimizing the importance-weighted squared error Σ_j importance_j · (x_j -
/// x̂_j)² instead of the plain one. `importance` has one value per column (same length as
/// `src`), finite and >= 0; the natural choice is the mean of x_j² over calibration activations
/// that this matrix multiplies (what llama.cpp calls an importance matrix): then the weighted
/// error is the expected squared error of the matrix's outputs, under a diagonal approximation.
///
/// q4t uses it in its scale search, q1 in its scale (the weighted mean |w|); q8r ignores it (its
/// scale is the row's max / 127 by definition, and 8 bits leave little to trade). A group whose
/// importance is all zero is quantized as without importance. Errors as `quantize_row`, plus a
/// wrong-length or negative / non-finite importance.
pub fn quantize_row_weighted(ty: QuantType, src: &[f32], importance: &[f32], out: &mut [u8]) -> Result<(), QuantizeError> {
    if importance.len() != src.len() {
        return Err(QuantizeError::ImportanceLength { ty, n: src.len(), got: importance.len() });
    }
    if let Some(index) = importance.iter().position(|v| !(v.is_finite() && *v >= 0.0)) {
        return Err(QuantizeError::BadImportance { ty, index, value: importance[index] });
    }
    quantize_impl(ty, src, Some(importance), out)
}

fn quantize_impl(ty: QuantType, src: &[f32], importance: Option<&[f32]>, out: &mut [u8]) -> Result<(), QuantizeError> {
    if !ty.is_cortiq() && ty != QuantType::Q8_0 {
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
        QuantType::Q4T => super::q4t::quantize(src, importance, out),
        QuantType::Q1 => super::q1::quantize(src, importance, out),
        QuantType::Q8_0 => quantize_q8_0(src, out),
        _ => unreachable!("checked above"),
    }
    Ok(())
}

/// GGUF's Q8_0 as ggml's reference quantizer writes it (`quantize_row_q8_0_ref`): per 32
/// values d = max|x| / 127 stored as f16 (round to nearest even), q = round(x / d) (half away
/// from zero), computed as x * (1/d) in f32. For the vocabulary matrices of a .cmf (a per-32
/// scale keeps the output head within llama.cpp's Q8_0 quality where q8r's per-row scale does
/// not) and any tensor a user wants in it. Lengths checked by the caller.
fn quantize_q8_0(src: &[f32], out: &mut [u8]) {
    for (x, blk) in src.chunks_exact(32).zip(out.chunks_exact_mut(34)) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        blk[..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
        for (q, &v) in blk[2..].iter_mut().zip(x) {
            *q = (v * id).round() as i8 as u8;
        }
    }
}

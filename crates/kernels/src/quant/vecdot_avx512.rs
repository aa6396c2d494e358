//! AVX-512 twins of `vecdot.rs` (placeholder while the kernels are written).

use super::QuantType;

pub(super) fn dispatch(_ty: QuantType, _w: &[u8], _a: &[u8]) -> Option<f32> {
    None
}

pub(super) fn matvec(_ty: QuantType, _w: &[u8], _rb: usize, _a: &[u8], _y: &mut [f32]) -> bool {
    false
}

pub fn available() -> bool {
    false
}

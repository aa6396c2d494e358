//! What several kernel benches share: a matrix of pseudo-random quantized blocks.

use cortiq_kernels::quant::QuantType;

/// `rows` × `cols` weights of type `ty` in GGUF's row-major blocks: xorshift bytes, with each
/// block's scales (d, and dmin / m where the type has them) set to small f16s so that the sums
/// stay finite. Timing only: the values mean nothing.
pub fn random_weights(ty: QuantType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let rb = ty.row_bytes(cols).expect("whole blocks per row");
    let mut s = seed | 1;
    let mut w: Vec<u8> = (0..rows * rb)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect();
    let bb = ty.type_size();
    for blk in w.chunks_exact_mut(bb) {
        match ty {
            QuantType::Q4K | QuantType::Q5K | QuantType::Q4_1 | QuantType::Q5_1 => {
                blk[..4].copy_from_slice(&[0x1e, 0x20, 0x1e, 0x1c])
            }
            QuantType::Q6K => blk[bb - 2..].copy_from_slice(&[0x1e, 0x20]),
            _ => blk[..2].copy_from_slice(&[0x1e, 0x20]),
        }
    }
    w
}

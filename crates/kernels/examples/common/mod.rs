//! What several benches share: matrices of pseudo-random quantized blocks and a timer. The
//! kernels' examples include it as `mod common;`, the engine's `quant_types_bench` by path
//! (the engine depends on the kernels crate, so the module compiles in either); each uses a
//! part of it.
#![allow(dead_code)]

use std::time::Instant;

use cortiq_kernels::quant::QuantType;

/// Best seconds per call over repetitions lasting `secs` in all (at least 3), after one
/// warm-up call (caches, the pool, feature detection).
pub fn best_secs_for(secs: f64, mut f: impl FnMut()) -> f64 {
    f();
    let mut best = f64::INFINITY;
    let start = Instant::now();
    let mut reps = 0;
    while reps < 3 || start.elapsed().as_secs_f64() < secs {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        reps += 1;
    }
    best
}

/// `best_secs_for` over ~0.3 s.
pub fn best_secs(f: impl FnMut()) -> f64 {
    best_secs_for(0.3, f)
}

/// splitmix64: the next 64 bits of the stream `s`.
pub fn next(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `rows` rows of `rb` bytes of type `ty`: splitmix bytes, with every scale field of every
/// block set to 2^-7 (an f16, or MXFP4's E8M0) so the sums stay finite. Speed does not depend
/// on the values.
pub fn random_matrix(ty: QuantType, rows: usize, rb: usize, seed: &mut u64) -> Vec<u8> {
    let mut v: Vec<u8> = (0..rows * rb).map(|_| next(seed) as u8).collect();
    for b in v.chunks_exact_mut(ty.type_size()) {
        for &off in ty.f16_scale_fields() {
            b[off..off + 2].copy_from_slice(&0x2000u16.to_le_bytes()); // 2^-7
        }
        if ty == QuantType::MXFP4 {
            b[0] = 121; // E8M0: 2^(121 - 128) = 2^-7
        }
    }
    v
}

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

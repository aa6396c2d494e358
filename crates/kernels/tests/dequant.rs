//! GGUF block dequantization against the `gguf` PyPI package's reference dequantizer.
//!
//! Fixtures (tests/data/quant/<type>.bin raw blocks + <type>.f32 expected values) are made by
//! tools/fixtures/quant/gen_quant_fixtures.py with gguf==0.19.0 / numpy==2.4.6 (q8_K: numpy
//! `qs * d`, since gguf 0.19.0 has no Q8_K dequantizer). mxfp4's fixture spans its E8M0 scales
//! from the subnormal 2^-128 to 2^72. Tolerance is 0 ulp for every type:
//! gguf-py computes each output with one or two single IEEE f32 operations in a fixed order, and
//! dequant.rs performs the same operations in the same order (no FMA contraction), so any
//! difference at all is a bug.

use cortiq_kernels::quant::blocks::*;
use cortiq_kernels::quant::{QuantType, dequantize_row, dot_row};
use std::mem::size_of;
use std::path::PathBuf;

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/quant")
}

/// (raw bytes, expected f32 values) of one type's fixture.
fn fixture(ty: QuantType) -> (Vec<u8>, Vec<f32>) {
    let dir = data_dir();
    let raw = std::fs::read(dir.join(format!("{}.bin", ty.name()))).unwrap_or_else(|e| panic!("fixture {}.bin: {e}", ty.name()));
    let exp = std::fs::read(dir.join(format!("{}.f32", ty.name()))).unwrap_or_else(|e| panic!("fixture {}.f32: {e}", ty.name()));
    assert_eq!(exp.len() % 4, 0, "{}.f32 length", ty.name());
    let exp = exp.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    (raw, exp)
}

/// Distance in units in the last place (f32 bit patterns mapped to a monotone integer line).
fn ulp_diff(a: f32, b: f32) -> u64 {
    fn key(x: f32) -> i64 {
        let b = x.to_bits() as i32;
        (if b < 0 { i32::MIN - b } else { b }) as i64
    }
    (key(a) - key(b)).unsigned_abs()
}

/// Compare bit for bit; print the max ulp difference and where it is.
fn check_exact(ty: QuantType, what: &str, got: &[f32], exp: &[f32]) {
    assert_eq!(got.len(), exp.len());
    let mut max = (0u64, 0usize);
    let mut mismatches = 0usize;
    for (i, (&g, &e)) in got.iter().zip(exp).enumerate() {
        if g.to_bits() != e.to_bits() {
            mismatches += 1;
            let u = ulp_diff(g, e);
            if u > max.0 || mismatches == 1 {
                max = (u.max(1), i);
            }
        }
    }
    let i = max.1;
    println!(
        "{ty:>5} {what}: {} values, {mismatches} not bit-identical, max ulp diff {} at index {i} (got {:e}, gguf-py {:e})",
        got.len(),
        max.0,
        got[i],
        exp[i]
    );
    assert_eq!(
        mismatches,
        0,
        "{ty} {what}: {mismatches} values differ from gguf-py; max {} ulp at index {i} (block {}, elem {}): got {:e} ({:#010x}), want {:e} ({:#010x})",
        max.0,
        i / ty.block_size(),
        i % ty.block_size(),
        got[i],
        got[i].to_bits(),
        exp[i],
        exp[i].to_bits()
    );
}

#[test]
fn dequantize_row_matches_gguf_py_bit_for_bit() {
    for ty in QuantType::ALL {
        let (raw, exp) = fixture(ty);
        assert_eq!(ty.row_bytes(exp.len()), Some(raw.len()), "{ty}: fixture sizes disagree with row_bytes");
        assert!(exp.len() >= 4 * ty.block_size().max(64), "{ty}: fixture too small to mean much");
        assert!(exp.iter().any(|v| *v != 0.0), "{ty}: all-zero fixture");

        // the whole fixture as one row
        let mut got = vec![f32::NAN; exp.len()];
        dequantize_row(ty, &raw, &mut got);
        check_exact(ty, "row", &got, &exp);

        // block by block, as a row of one block each: no state may leak across blocks
        let (bs, ts) = (ty.block_size(), ty.type_size());
        let mut got = vec![f32::NAN; exp.len()];
        for (b, y) in raw.chunks_exact(ts).zip(got.chunks_exact_mut(bs)) {
            dequantize_row(ty, b, y);
        }
        check_exact(ty, "per-block", &got, &exp);
    }
}

#[test]
fn block_structs_agree_with_quant_type_sizes() {
    let cases: [(QuantType, usize, usize); 19] = [
        (QuantType::Q4_0, size_of::<BlockQ4_0>(), BlockQ4_0::ELEMS),
        (QuantType::Q4_1, size_of::<BlockQ4_1>(), BlockQ4_1::ELEMS),
        (QuantType::Q5_0, size_of::<BlockQ5_0>(), BlockQ5_0::ELEMS),
        (QuantType::Q5_1, size_of::<BlockQ5_1>(), BlockQ5_1::ELEMS),
        (QuantType::Q8_0, size_of::<BlockQ8_0>(), BlockQ8_0::ELEMS),
        (QuantType::Q2K, size_of::<BlockQ2K>(), BlockQ2K::ELEMS),
        (QuantType::Q3K, size_of::<BlockQ3K>(), BlockQ3K::ELEMS),
        (QuantType::Q4K, size_of::<BlockQ4K>(), BlockQ4K::ELEMS),
        (QuantType::Q5K, size_of::<BlockQ5K>(), BlockQ5K::ELEMS),
        (QuantType::Q6K, size_of::<BlockQ6K>(), BlockQ6K::ELEMS),
        (QuantType::Q8K, size_of::<BlockQ8K>(), BlockQ8K::ELEMS),
        (QuantType::IQ4NL, size_of::<BlockIQ4NL>(), BlockIQ4NL::ELEMS),
        (QuantType::IQ4XS, size_of::<BlockIQ4XS>(), BlockIQ4XS::ELEMS),
        (QuantType::MXFP4, size_of::<BlockMXFP4>(), BlockMXFP4::ELEMS),
        (QuantType::IQ2XXS, size_of::<BlockIQ2XXS>(), BlockIQ2XXS::ELEMS),
        (QuantType::IQ2XS, size_of::<BlockIQ2XS>(), BlockIQ2XS::ELEMS),
        (QuantType::IQ2S, size_of::<BlockIQ2S>(), BlockIQ2S::ELEMS),
        (QuantType::IQ3XXS, size_of::<BlockIQ3XXS>(), BlockIQ3XXS::ELEMS),
        (QuantType::IQ3S, size_of::<BlockIQ3S>(), BlockIQ3S::ELEMS),
    ];
    for (ty, size, elems) in cases {
        println!("{ty:>5}: struct {size} bytes / {elems} elems, QuantType {} / {}", ty.type_size(), ty.block_size());
        assert_eq!(size, ty.type_size(), "{ty}: struct size vs type_size");
        assert_eq!(elems, ty.block_size(), "{ty}: struct elems vs block_size");
        assert_eq!(ty.row_bytes(3 * elems), Some(3 * size), "{ty}: row_bytes of 3 blocks");
        assert_eq!(ty.row_bytes(elems + 1), if elems == 1 { Some(2 * size) } else { None });
    }
    // float types: bytes per element
    assert_eq!(QuantType::F32.row_bytes(7), Some(28));
    assert_eq!(QuantType::F16.row_bytes(7), Some(14));
    assert_eq!(QuantType::BF16.row_bytes(7), Some(14));
}

#[test]
fn e8m0_half_is_two_to_the_e_minus_128() {
    // ggml builds the value from bits; every byte's value is exactly 2^(e - 128)
    for e in 0..=255u8 {
        let want = 2f64.powi(e as i32 - 128) as f32;
        assert_eq!(e8m0_half(e).to_bits(), want.to_bits(), "e = {e}");
    }
    assert_eq!(e8m0_half(0).to_bits(), 0x0020_0000, "2^-128 is an f32 subnormal");
    assert_eq!(e8m0_half(255), 2f32.powi(127), "no NaN: ggml does not keep E8M0's 0xFF");
}

/// Deterministic test input in [-1, 1) (xorshift; no external reference needed for x).
fn test_vector(n: usize, mut s: u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// dot_row against an f64 dot of gguf-py's dequantized values. It accumulates in f32, so the
/// bound is relative to sum |a*b| (a few f32 epsilons times a length factor), not exact.
fn check_dot(ty: QuantType, raw: &[u8], deq: &[f32], seed: u64) {
    let x = test_vector(deq.len(), seed);
    let got = dot_row(ty, raw, &x);
    let reference: f64 = deq.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
    let mag: f64 = deq.iter().zip(&x).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
    let err = (got as f64 - reference).abs();
    let bound = mag * f32::EPSILON as f64 * (deq.len() as f64).sqrt() * 2.0 + 1e-30;
    println!("{ty:>5} dot_row n={:5}: got {got:e}, f64 ref {reference:e}, |err| {err:.3e} (bound {bound:.3e})", deq.len());
    assert!(err <= bound, "{ty} dot_row n={}: |err| {err:e} > bound {bound:e}", deq.len());
}

#[test]
fn dot_row_matches_dequantized_reference() {
    for ty in QuantType::ALL {
        let (raw, exp) = fixture(ty);
        check_dot(ty, &raw, &exp, 0x9E37_79B9_7F4A_7C15 ^ ty.ggml_id() as u64);
        // a row that ends mid-chunk (not a multiple of dot_row's 256-element step)
        let blocks = if ty.block_size() == 1 { 100 } else { 3.min(exp.len() / ty.block_size()) };
        let n = blocks * ty.block_size();
        if n % 256 != 0 {
            check_dot(ty, &raw[..ty.row_bytes(n).unwrap()], &exp[..n], 12345);
        }
    }
}

#[test]
fn dot_row_of_unit_vector_picks_one_element_exactly() {
    // x = e_k: every product but one is exactly 0, so the f32 dot is exactly deq[k].
    for ty in QuantType::ALL {
        let (raw, exp) = fixture(ty);
        for k in [0, exp.len() / 3, exp.len() - 1] {
            let mut x = vec![0f32; exp.len()];
            x[k] = 1.0;
            let got = dot_row(ty, &raw, &x);
            // (a -0.0 element sums to +0.0 with the zero accumulators, hence == for zeros)
            let same = if exp[k] == 0.0 { got == 0.0 } else { got.to_bits() == exp[k].to_bits() };
            assert!(same, "{ty}: dot with e_{k}: got {got:e}, want {:e}", exp[k]);
        }
    }
}

#[test]
#[should_panic(expected = "dequantize_row(q4_K): 256 elements need 144 bytes, got 143")]
fn dequantize_row_rejects_wrong_length() {
    let src = [0u8; 143];
    let mut dst = [0f32; 256];
    dequantize_row(QuantType::Q4K, &src, &mut dst);
}

#[test]
#[should_panic(expected = "dequantize_row(q4_0): 31 elements is not a whole number of 32-element blocks")]
fn dequantize_row_rejects_partial_block() {
    let src = [0u8; 18];
    let mut dst = [0f32; 31];
    dequantize_row(QuantType::Q4_0, &src, &mut dst);
}

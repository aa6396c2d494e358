//! `quantize_row(Q8_0, ..)` against the `gguf` PyPI package's reference quantizer (fixture by
//! tools/fixtures/quant/gen_quantize_fixture.py): the bytes must be identical, since a .cmf's
//! Q8_0 tensors are read by the same kernels as a GGUF's.

use cortiq_kernels::quant::{QuantType, quantize_row};

#[test]
fn q8_0_quantization_is_ggml_bit_for_bit() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/quant/");
    let src: Vec<f32> = std::fs::read(format!("{dir}q8_0_src.f32"))
        .expect("fixture q8_0_src.f32")
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let want = std::fs::read(format!("{dir}q8_0_quant.bin")).expect("fixture q8_0_quant.bin");
    let mut got = vec![0u8; QuantType::Q8_0.row_bytes(src.len()).unwrap()];
    quantize_row(QuantType::Q8_0, &src, &mut got).unwrap();
    assert_eq!(got.len(), want.len());
    let diff: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want[i]).collect();
    println!("q8_0: {} bytes, {} differ from gguf's quantizer", got.len(), diff.len());
    assert!(
        diff.is_empty(),
        "first differing byte {} (block {}): ours {} gguf {}",
        diff[0],
        diff[0] / 34,
        got[diff[0]],
        want[diff[0]]
    );
}

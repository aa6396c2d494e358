//! The AVX-512 dequantizers (quant::dequant_avx512) against their scalar twins and gguf-py.
//!
//! Contract: bit-identical (0 ulp, -0.0 != +0.0) to `dequantize_row_scalar`, for every type,
//! on the committed gguf-py fixtures (tests/data/quant, see tests/dequant.rs for their origin) and
//! on many random blocks: random bytes with the f16 scale fields re-drawn until finite (all
//! exponents, signs, subnormals and zeros occur), rows of several blocks read from unaligned
//! addresses. F16 and BF16 are checked on every one of the 65536 bit patterns, NaNs included.
//!
//! Only finite scales are generated: with a NaN in both `d` and `m`, which NaN payload survives
//! `d*q + m` is the compiler's choice of operand order (IEEE leaves it open) on either side.
//!
//! On a CPU without AVX-512 BW (or with CORTIQ_SIMD=scalar) the SIMD path is absent; the tests
//! then say so and check only that `dequantize_row` still equals the scalar twin.

use cortiq_kernels::quant::dequant_avx512;
use cortiq_kernels::quant::{QuantType, dequantize_row, dequantize_row_scalar};
use std::path::PathBuf;

fn simd_on() -> bool {
    cortiq_kernels::simd::avx512bw()
}

/// Run the SIMD kernel; `None` when this machine has none for `ty`.
fn simd(ty: QuantType, src: &[u8], n: usize) -> Option<Vec<f32>> {
    let mut out = vec![f32::from_bits(0x7FBA_DBAD); n];
    dequant_avx512::dequantize_row(ty, src, &mut out).then_some(out)
}

fn scalar(ty: QuantType, src: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    dequantize_row_scalar(ty, src, &mut out);
    out
}

/// Count bit-pattern mismatches, print the count and the first one, return the count.
fn mismatches(ty: QuantType, what: &str, got: &[f32], want: &[f32]) -> usize {
    assert_eq!(got.len(), want.len());
    let bad: Vec<usize> = (0..got.len()).filter(|&i| got[i].to_bits() != want[i].to_bits()).collect();
    match bad.first() {
        None => println!("{ty:>5} {what}: {} values, 0 mismatches", got.len()),
        Some(&i) => println!(
            "{ty:>5} {what}: {} values, {} MISMATCHES; first at index {i} (block {}, elem {}): simd {:e} ({:#010x}), scalar {:e} ({:#010x})",
            got.len(),
            bad.len(),
            i / ty.block_size(),
            i % ty.block_size(),
            got[i],
            got[i].to_bits(),
            want[i],
            want[i].to_bits()
        ),
    }
    bad.len()
}

/// SplitMix64: a tiny deterministic generator (no dependency).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn finite_f16(&mut self) -> [u8; 2] {
        loop {
            let b = self.next() as u16;
            if b & 0x7C00 != 0x7C00 {
                return b.to_le_bytes();
            }
        }
    }
    fn finite_f32(&mut self) -> [u8; 4] {
        loop {
            let b = self.next() as u32;
            if b & 0x7F80_0000 != 0x7F80_0000 {
                return b.to_le_bytes();
            }
        }
    }
}

/// `blocks` random blocks of `ty` with finite scales.
fn random_blocks(ty: QuantType, blocks: usize, rng: &mut Rng) -> Vec<u8> {
    let ts = ty.type_size();
    let mut v: Vec<u8> = (0..blocks * ts).map(|_| rng.next() as u8).collect();
    for b in v.chunks_exact_mut(ts) {
        for &off in ty.f16_scale_fields() {
            b[off..off + 2].copy_from_slice(&rng.finite_f16());
        }
        match ty {
            QuantType::Q8K => b[..4].copy_from_slice(&rng.finite_f32()),
            QuantType::F32 => b.copy_from_slice(&rng.finite_f32()),
            _ => {}
        }
    }
    v
}

const BLOCK_TYPES: [QuantType; 19] = [
    QuantType::Q8_0,
    QuantType::Q4_0,
    QuantType::Q4_1,
    QuantType::Q5_0,
    QuantType::Q5_1,
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

#[test]
fn simd_kernels_exist_for_every_type_but_f32() {
    println!("AVX-512 BW dequantizers active: {}", simd_on());
    for ty in QuantType::ALL {
        let want = simd_on() && ty != QuantType::F32;
        assert_eq!(dequant_avx512::available(ty), want, "{ty}: available()");
    }
}

#[test]
fn simd_matches_gguf_py_fixtures_bit_for_bit() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/quant");
    let mut total = 0;
    for ty in QuantType::ALL {
        let raw = std::fs::read(dir.join(format!("{}.bin", ty.name()))).expect("fixture .bin");
        let exp: Vec<f32> = std::fs::read(dir.join(format!("{}.f32", ty.name())))
            .expect("fixture .f32")
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let n = exp.len();
        let mut got = vec![0f32; n];
        dequantize_row(ty, &raw, &mut got);
        total += mismatches(ty, "dequantize_row vs gguf-py", &got, &exp);
        total += mismatches(ty, "scalar twin vs gguf-py", &scalar(ty, &raw, n), &exp);
        match simd(ty, &raw, n) {
            Some(s) => total += mismatches(ty, "avx512 vs gguf-py", &s, &exp),
            None => println!("{ty:>5}: no SIMD kernel on this machine"),
        }
    }
    assert_eq!(total, 0, "{total} values differ (see the lines above)");
}

#[test]
fn simd_matches_scalar_on_random_blocks() {
    if !simd_on() {
        println!("AVX-512 BW not available (or CORTIQ_SIMD=scalar): nothing to compare");
    }
    let mut rng = Rng(0x5EED_D0E5_0001);
    let mut total = 0;
    for ty in BLOCK_TYPES {
        // ~1M elements per type, as rows of 1..=8 blocks read from unaligned addresses.
        let target = 1 << 20;
        let (mut done, mut rows) = (0usize, 0usize);
        let mut bad = 0;
        while done < target {
            let nb = 1 + rows % 8;
            let shift = rows % 7;
            let mut buf = vec![0u8; shift];
            buf.extend(random_blocks(ty, nb, &mut rng));
            let src = &buf[shift..];
            let n = nb * ty.block_size();
            let want = scalar(ty, src, n);
            let mut got = vec![0f32; n];
            dequantize_row(ty, src, &mut got);
            let mut row_bad = mismatches_quiet(&got, &want);
            if let Some(s) = simd(ty, src, n) {
                row_bad += mismatches_quiet(&s, &want);
            }
            if row_bad > 0 && bad == 0 {
                mismatches(ty, &format!("random row {rows} ({nb} blocks)"), &got, &want);
            }
            bad += row_bad;
            done += n;
            rows += 1;
        }
        println!("{ty:>5} random: {done} values in {rows} rows, {bad} mismatches");
        total += bad;
    }
    assert_eq!(total, 0, "{total} values differ between the SIMD and scalar dequantizers");
}

fn mismatches_quiet(a: &[f32], b: &[f32]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count()
}

#[test]
fn simd_matches_scalar_on_every_16_bit_pattern() {
    let all: Vec<u8> = (0..=u16::MAX).flat_map(|b| b.to_le_bytes()).collect();
    let mut total = 0;
    for ty in [QuantType::F16, QuantType::BF16] {
        let n = 1 << 16;
        let want = scalar(ty, &all, n);
        let mut got = vec![0f32; n];
        dequantize_row(ty, &all, &mut got);
        total += mismatches(ty, "all 65536 patterns, dequantize_row", &got, &want);
        if let Some(s) = simd(ty, &all, n) {
            total += mismatches(ty, "all 65536 patterns, avx512", &s, &want);
        }
        // every tail length of the 16-lane loop (masked loads/stores), from unaligned addresses
        let mut tails = 0;
        for len in 0..=48usize {
            for shift in [1usize, 2, 3] {
                let src = &all[2 * 1000 + shift..2 * 1000 + shift + 2 * len];
                let want = scalar(ty, src, len);
                // guard values after the row must survive the masked store
                let mut got = vec![f32::from_bits(0x7FBA_DBAD); len + 16];
                dequantize_row(ty, src, &mut got[..len]);
                tails += mismatches_quiet(&got[..len], &want);
                tails += got[len..].iter().filter(|v| v.to_bits() != 0x7FBA_DBAD).count();
            }
        }
        println!("{ty:>5} tails 0..=48 x 3 alignments: {tails} mismatches");
        total += tails;
    }
    assert_eq!(total, 0, "{total} values differ between the SIMD and scalar 16-bit conversions");
}

#[test]
fn simd_respects_sign_of_zero_cases() {
    // Hand-built blocks where only the sign of zero distinguishes a wrong operation order:
    // negative scales with every quant at its offset (Q4_0 q=8, Q5_0 q=16, Q6_K q=32), and
    // zero quants with negative d and -0.0 / +0.0 mins; IQ4_XS sub-block scales of 0 (ls = 32)
    // under a negative d, whose zeros take their sign from d * 0 and then the level.
    let neg = half_bits(-0.75);
    let mut total = 0;
    let mut q4_0 = vec![0u8; 18];
    q4_0[..2].copy_from_slice(&neg);
    q4_0[2..].fill(0x88);
    let mut q5_0 = vec![0u8; 22];
    q5_0[..2].copy_from_slice(&neg);
    q5_0[2..6].fill(0xFF); // qh: bit 4 set everywhere -> q = 16 with zero nibbles
    let mut q6k = vec![0u8; 210];
    q6k[..128].fill(0x00);
    q6k[128..192].fill(0xAA); // high bits 2 -> q = 32
    q6k[192..208].fill(0x85); // negative i8 scales
    q6k[208..210].copy_from_slice(&half_bits(0.5));
    let mut q4_1 = vec![0u8; 20];
    q4_1[..2].copy_from_slice(&neg);
    q4_1[2..4].copy_from_slice(&half_bits(-0.0));
    let mut q4k = vec![0u8; 144];
    q4k[..2].copy_from_slice(&neg);
    q4k[2..4].copy_from_slice(&half_bits(-0.0));
    q4k[4..16].fill(0x3F);
    let mut iq4xs = vec![0u8; 136];
    iq4xs[..2].copy_from_slice(&neg);
    iq4xs[2..4].copy_from_slice(&0xAAAAu16.to_le_bytes()); // high bits 2 -> ls = 32 with zero low bits
    iq4xs[8..].iter_mut().enumerate().for_each(|(i, b)| *b = (i * 37) as u8); // all levels, both signs
    // the grid types have no zero magnitude: only d = -0.0 makes zeros, whose sign the element's
    // sign bit then flips (gguf-py's `* -1.0`)
    let iq = |ty: QuantType| {
        let mut b: Vec<u8> = (0..ty.type_size()).map(|i| (i * 73 + 11) as u8).collect();
        b[..2].copy_from_slice(&half_bits(-0.0));
        b
    };
    for (ty, raw) in [
        (QuantType::IQ2XXS, iq(QuantType::IQ2XXS)),
        (QuantType::IQ2XS, iq(QuantType::IQ2XS)),
        (QuantType::IQ2S, iq(QuantType::IQ2S)),
        (QuantType::IQ3XXS, iq(QuantType::IQ3XXS)),
        (QuantType::IQ3S, iq(QuantType::IQ3S)),
        (QuantType::Q4_0, q4_0),
        (QuantType::Q5_0, q5_0),
        (QuantType::Q6K, q6k),
        (QuantType::Q4_1, q4_1),
        (QuantType::Q4K, q4k),
        (QuantType::IQ4XS, iq4xs),
    ] {
        let n = ty.block_size();
        let want = scalar(ty, &raw, n);
        let zeros = want.iter().filter(|v| **v == 0.0).count();
        assert!(zeros > 0, "{ty}: the hand-built block should decode to zeros");
        if let Some(s) = simd(ty, &raw, n) {
            total += mismatches(ty, &format!("signed-zero block ({zeros} zeros)"), &s, &want);
        }
    }
    assert_eq!(total, 0);
}

fn half_bits(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_bits().to_le_bytes()
}

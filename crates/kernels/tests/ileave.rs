//! quant::ileave (16-row interleaved Q4_0 / Q5_0 / Q8_0 / Q4_K / Q5_K / Q6_K for decode): the layout round-trips to
//! the GGUF bytes; the AVX-512 kernel equals its scalar twin bit for bit for every column count;
//! every column of a k-column call equals the one-column call on that activation row bit for
//! bit, whatever the other columns hold; and the results agree with the f64 dot product of the
//! dequantized operands (and ggml's `vec_dot_scalar`) to f32 rounding of Σ|w·x̃|.

use cortiq_kernels::quant::{
    IL_ROWS, QuantType, act_type, dequantize_act, dequantize_row, ileave, ileave_bytes, ileave_cols, ileave_group_bytes,
    ileave_rows, matvec_ileave, matvec_ileave_cols, matvec_ileave_scalar, quantize_act, vec_dot_scalar,
};
use cortiq_testkit::XorShift as Rng;
use half::f16;

const TYPES: [QuantType; 6] = [QuantType::Q4_0, QuantType::Q5_0, QuantType::Q8_0, QuantType::Q4K, QuantType::Q5K, QuantType::Q6K];

/// Widths to test: the 32-element types take any multiple of 32, Q4_K multiples of 256.
fn widths(ty: QuantType, legacy: &[usize]) -> Vec<usize> {
    if matches!(ty, QuantType::Q4K | QuantType::Q5K | QuantType::Q6K) { vec![256, 512, 1024, 4864] } else { legacy.to_vec() }
}

fn random_rows(ty: QuantType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let rb = ty.row_bytes(cols).unwrap();
    let mut w: Vec<u8> = (0..rows * rb).map(|_| rng.next() as u8).collect();
    let bb = ty.type_size();
    for blk in w.chunks_exact_mut(bb) {
        let d = f16::from_f32(0.002 + 0.02 * rng.f().abs()).to_le_bytes();
        if ty == QuantType::Q6K {
            blk[bb - 2..].copy_from_slice(&d);
            continue;
        }
        blk[..2].copy_from_slice(&d);
        if matches!(ty, QuantType::Q4K | QuantType::Q5K) {
            blk[2..4].copy_from_slice(&f16::from_f32(0.001 + 0.01 * rng.f().abs()).to_le_bytes());
        }
    }
    w
}

/// k activation rows of very different scales (a column leaking into another would show).
fn acts(ty: QuantType, cols: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let mut all = Vec::new();
    let mut a = Vec::new();
    for j in 0..k {
        let scale = [0.01f32, 1.0, 30.0][j % 3];
        let x: Vec<f32> = (0..cols).map(|_| rng.f() * scale).collect();
        quantize_act(act_type(ty).unwrap(), &x, &mut a);
        all.extend_from_slice(&a);
    }
    all
}

fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() { f64::NAN } else { a.max(b) }
}

#[test]
fn layout_round_trips_and_pads() {
    let mut rng = Rng(0x11EA_0001);
    for ty in TYPES {
        for (rows, cols) in [1, 16, 37, 48].into_iter().zip(widths(ty, &[32, 64, 96, 896])) {
            let w = random_rows(ty, rows, cols, &mut rng);
            let p = ileave(ty, &w, rows, cols);
            assert_eq!(p.len(), ileave_bytes(ty, rows, cols).unwrap());
            assert_eq!(p.len(), rows.div_ceil(IL_ROWS) * ileave_group_bytes(ty, cols).unwrap());
            let mut back = vec![0u8; w.len()];
            ileave_rows(ty, &p, cols, 0, rows, &mut back);
            assert!(back == w, "{ty} {rows}x{cols}: ileave_rows(ileave(w)) != w");
            // a range that starts inside a group
            if rows > 5 {
                let rb = ty.row_bytes(cols).unwrap();
                let mut part = vec![0u8; 3 * rb];
                ileave_rows(ty, &p, cols, 3, 3, &mut part);
                assert!(part == w[3 * rb..6 * rb], "{ty}: rows 3..6");
            }
        }
    }
    assert_eq!(ileave_bytes(QuantType::Q3K, 16, 256), None);
    assert_eq!(ileave_bytes(QuantType::Q4K, 16, 320), None, "Q4_K needs whole 256-element blocks");
}

/// The k columns of y [k, n] as the kernels' output pieces.
fn cols_mut(y: &mut [f32], n: usize) -> Vec<&mut [f32]> {
    y.chunks_exact_mut(n).collect()
}

#[test]
fn simd_equals_scalar_and_columns_equal_alone() {
    let mut rng = Rng(0x11EA_0002);
    for ty in TYPES {
        for (rows, cols) in [16, 37, 64].into_iter().zip(widths(ty, &[32, 96, 896])) {
            let w = random_rows(ty, rows, cols, &mut rng);
            let p = ileave(ty, &w, rows, cols);
            let padded = rows.div_ceil(IL_ROWS) * IL_ROWS;
            let ab = act_type(ty).unwrap().row_bytes(cols).unwrap();
            for k in [1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 33, 67, 130] {
                let a = acts(ty, cols, k, &mut rng);
                // y [k, padded]: column j's outputs side by side
                let (mut ys, mut yv) = (vec![0f32; padded * k], vec![0f32; padded * k]);
                matvec_ileave(ty, &p, cols, &a, &mut cols_mut(&mut yv, padded));
                matvec_ileave_scalar(ty, &p, cols, &a, &mut cols_mut(&mut ys, padded));
                for (i, (v, s)) in yv.iter().zip(&ys).enumerate() {
                    assert!(
                        v.to_bits() == s.to_bits(),
                        "{ty} {rows}x{cols} k {k}: row {} col {}: simd {v} scalar {s}",
                        i % padded,
                        i / padded
                    );
                }
                for j in 0..k {
                    let mut y1 = vec![0f32; padded];
                    matvec_ileave(ty, &p, cols, &a[j * ab..(j + 1) * ab], &mut [&mut y1[..]]);
                    for r in 0..padded {
                        let m = yv[j * padded + r];
                        assert!(m.to_bits() == y1[r].to_bits(), "{ty} k {k}: row {r} col {j}: {m} in the batch, {} alone", y1[r]);
                    }
                    // padding rows are zero
                    assert!(yv[j * padded + rows..(j + 1) * padded].iter().all(|&v| v == 0.0), "{ty}: padding rows not zero");
                }
            }
        }
    }
}

/// Columns prepared once (`ileave_cols`) and the product cut into pieces of groups, each piece
/// its own `matvec_ileave_cols` call (a balanced split's pieces), give the one-call
/// `matvec_ileave` result bit for bit; a preparation for another type, width or row count is
/// refused.
#[test]
fn prepared_columns_over_pieces_equal_one_call() {
    let mut rng = Rng(0x11EA_0003);
    for ty in TYPES {
        let cols = if ty.block_size() == 256 { 512 } else { 896 };
        let rows = 80; // 5 groups
        let w = random_rows(ty, rows, cols, &mut rng);
        let p = ileave(ty, &w, rows, cols);
        let gb = ileave_group_bytes(ty, cols).unwrap();
        for k in [1, 3, 4, 8] {
            let a = acts(ty, cols, k, &mut rng);
            let mut whole = vec![0f32; rows * k];
            matvec_ileave(ty, &p, cols, &a, &mut cols_mut(&mut whole, rows));
            let prep = ileave_cols(ty, cols, &a);
            let mut pieced = vec![0f32; rows * k];
            for (g0, g1) in [(0, 2), (2, 3), (3, 5)] {
                let mut ys: Vec<&mut [f32]> = pieced.chunks_exact_mut(rows).map(|y| &mut y[g0 * IL_ROWS..g1 * IL_ROWS]).collect();
                matvec_ileave_cols(ty, &p[g0 * gb..g1 * gb], cols, &a, &prep, &mut ys);
            }
            let same = whole.iter().zip(&pieced).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{ty} k {k}: pieces with prepared columns differ from one call");
        }
        let a = acts(ty, cols, 2, &mut rng);
        let prep = ileave_cols(ty, cols, &a[..a.len() / 2]);
        let mut y = vec![0f32; rows * 2];
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            matvec_ileave_cols(ty, &p, cols, &a, &prep, &mut cols_mut(&mut y, rows))
        }));
        assert!(r.is_err(), "{ty}: columns prepared for one row accepted for two");
    }
}

#[test]
fn agrees_with_the_f64_dot_and_ggml() {
    let mut rng = Rng(0x11EA_0003);
    println!("{:>5} {:>6} {:>14} {:>14}", "type", "cols", "il-f64", "il-ggml");
    for ty in TYPES {
        let at = act_type(ty).unwrap();
        for cols in widths(ty, &[32, 576, 896, 4864]) {
            let rows = 21;
            let w = random_rows(ty, rows, cols, &mut rng);
            let p = ileave(ty, &w, rows, cols);
            let a = acts(ty, cols, 1, &mut rng);
            let mut y = vec![0f32; rows.div_ceil(IL_ROWS) * IL_ROWS];
            matvec_ileave(ty, &p, cols, &a, &mut [&mut y[..]]);
            let mut xa = vec![0f64; cols];
            dequantize_act(at, &a, &mut xa);
            let rb = ty.row_bytes(cols).unwrap();
            let (mut worst_f, mut worst_g) = (0f64, 0f64);
            for r in 0..rows {
                let row = &w[r * rb..(r + 1) * rb];
                let mut wr = vec![0f32; cols];
                dequantize_row(ty, row, &mut wr);
                let exact: f64 = wr.iter().zip(&xa).map(|(a, b)| *a as f64 * b).sum();
                let scale: f64 = wr.iter().zip(&xa).map(|(a, b)| (*a as f64 * b).abs()).sum::<f64>().max(1e-30);
                let g = vec_dot_scalar(ty, row, &a, cols) as f64;
                worst_f = nan_max(worst_f, (y[r] as f64 - exact).abs() / scale);
                worst_g = nan_max(worst_g, (y[r] as f64 - g).abs() / scale);
            }
            println!("{:>5} {cols:>6} {worst_f:>14.2e} {worst_g:>14.2e}", ty.name());
            // f32 rounding of a chain of cols/32 FMAs: a few ulps (6e-8) of Σ|w·x̃|
            assert!(worst_f <= 1e-6, "{ty} cols {cols}: interleaved vs f64 dot {worst_f:e} of Σ|w·x|");
            assert!(worst_g <= 1e-6, "{ty} cols {cols}: interleaved vs ggml's vec_dot {worst_g:e} of Σ|w·x|");
        }
    }
}

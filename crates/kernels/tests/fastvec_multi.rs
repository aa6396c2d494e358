//! quant::matvec_fast_multi (several activation rows through one weight stream): every column
//! must be bit-identical to `matvec_fast` on that row alone, for every column count and whatever
//! the other columns hold — the property that makes a sequence's tokens independent of what is
//! batched beside it. The scalar twin likewise equals the scalar single-row kernel of
//! `matvec_fast`'s order per column (`matvec_fast_scalar` for the types in `fastvec_supported`,
//! ggml's `vec_dot_scalar` for those `matvec_fast` sends to `matvec_q`), and where the two
//! single-row twins agree bit for bit (Q4_K, and the ggml-order Q8_0, Q4_0, Q5_0, Q6_K) the SIMD
//! multi-column kernel equals the scalar one.

use cortiq_kernels::quant::{
    QuantType, act_type, fastvec_supported, matvec_fast, matvec_fast_multi, matvec_fast_multi_scalar, matvec_fast_scalar,
    quantize_act, vec_dot_scalar,
};
use cortiq_testkit::XorShift as Rng;
use half::f16;

/// Random blocks with finite, sane f16 scales where each type keeps them.
fn random_rows(ty: QuantType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let rb = ty.row_bytes(cols).unwrap();
    let bb = ty.type_size();
    let mut w: Vec<u8> = (0..rows * rb).map(|_| rng.next() as u8).collect();
    for blk in w.chunks_exact_mut(bb) {
        let d = f16::from_f32(0.002 + 0.02 * rng.f().abs()).to_le_bytes();
        let m = f16::from_f32(0.05 * rng.f()).to_le_bytes();
        match ty {
            QuantType::Q4K | QuantType::Q5K => {
                blk[..2].copy_from_slice(&d);
                blk[2..4].copy_from_slice(&m);
            }
            // Q2_K: 16 scale bytes and 64 quant bytes, then d and dmin.
            QuantType::Q2K => {
                blk[80..82].copy_from_slice(&d);
                blk[82..84].copy_from_slice(&m);
            }
            // Q3_K: 32 high-bit bytes, 64 quant bytes and 12 scale bytes, then d.
            QuantType::Q3K => blk[bb - 2..].copy_from_slice(&d),
            QuantType::Q6K => blk[bb - 2..].copy_from_slice(&d),
            QuantType::Q4_1 | QuantType::Q5_1 => {
                blk[..2].copy_from_slice(&d);
                blk[2..4].copy_from_slice(&m);
            }
            _ => blk[..2].copy_from_slice(&d),
        }
    }
    w
}

fn acts(ty: QuantType, cols: usize, k: usize, rng: &mut Rng) -> (Vec<u8>, usize) {
    let at = act_type(ty).unwrap();
    let mut all = Vec::new();
    let mut a = Vec::new();
    for j in 0..k {
        // Columns of very different scales, so a column leaking into another would show.
        let scale = [0.01f32, 1.0, 30.0][j % 3];
        let x: Vec<f32> = (0..cols).map(|_| rng.f() * scale).collect();
        quantize_act(at, &x, &mut a);
        all.extend_from_slice(&a);
    }
    let ab = at.row_bytes(cols).unwrap();
    (all, ab)
}

/// First (row, column) where `multi` [rows, k] differs from `single(column)` [rows] in any bit.
fn first_mismatch(multi: &[f32], k: usize, single: &dyn Fn(usize) -> Vec<f32>) -> Option<(usize, usize, f32, f32)> {
    for j in 0..k {
        let s = single(j);
        for (r, &v) in s.iter().enumerate() {
            let m = multi[r * k + j];
            if m.to_bits() != v.to_bits() {
                return Some((r, j, m, v));
            }
        }
    }
    None
}

#[test]
fn every_column_equals_the_single_row_kernel_bit_for_bit() {
    let mut rng = Rng(0x5EED_0000_4B17_0001);
    let types = [
        (QuantType::Q4K, &[256usize, 1024, 2304][..]),
        (QuantType::Q6K, &[256, 768, 4864]),
        (QuantType::Q4_0, &[32, 64, 896]),
        (QuantType::Q4_1, &[64, 96, 576]),
        (QuantType::Q5_1, &[32, 64, 160, 576]),
        (QuantType::Q5_0, &[32, 96, 640, 896]),
        (QuantType::Q8_0, &[32, 96, 896]),
        // The cache-tiled per-column fallback (no multi-column kernel of their own yet).
        (QuantType::Q2K, &[256, 1024]),
        (QuantType::Q3K, &[256, 1024]),
        (QuantType::Q5K, &[256, 1024]),
    ];
    let mut checked = 0;
    for (ty, colss) in types {
        for &cols in colss {
            let rows = 37;
            let w = random_rows(ty, rows, cols, &mut rng);
            for k in 1usize..=17 {
                let (a, ab) = acts(ty, cols, k, &mut rng);
                let mut y = vec![f32::NAN; rows * k];
                matvec_fast_multi(ty, &w, rows, cols, &a, k, &mut y);
                let single = |j: usize| {
                    let mut s = vec![0f32; rows];
                    matvec_fast(ty, &w, rows, cols, &a[j * ab..(j + 1) * ab], &mut s);
                    s
                };
                if let Some((r, j, m, s)) = first_mismatch(&y, k, &single) {
                    panic!("{ty} {rows}x{cols}, k {k}: column {j} row {r}: multi {m:e} vs alone {s:e}");
                }
                let mut ys = vec![f32::NAN; rows * k];
                matvec_fast_multi_scalar(ty, &w, rows, cols, &a, k, &mut ys);
                let single_scalar = |j: usize| {
                    let aj = &a[j * ab..(j + 1) * ab];
                    let mut s = vec![0f32; rows];
                    if fastvec_supported(ty) {
                        matvec_fast_scalar(ty, &w, rows, cols, aj, &mut s);
                    } else {
                        let rb = w.len() / rows;
                        for (o, row) in s.iter_mut().zip(w.chunks_exact(rb)) {
                            *o = vec_dot_scalar(ty, row, aj, cols);
                        }
                    }
                    s
                };
                if let Some((r, j, m, s)) = first_mismatch(&ys, k, &single_scalar) {
                    panic!("{ty} {rows}x{cols}, k {k}: scalar twin column {j} row {r}: multi {m:e} vs alone {s:e}");
                }
                if matches!(ty, QuantType::Q4K | QuantType::Q6K | QuantType::Q4_0 | QuantType::Q5_0 | QuantType::Q8_0) {
                    // These types' SIMD and scalar twins agree bit for bit (Q4_K in cortiq's
                    // order, the others in ggml's), so the multi-column kernels must too.
                    if let Some(i) = y.iter().zip(&ys).position(|(a, b)| a.to_bits() != b.to_bits()) {
                        panic!(
                            "{ty} {rows}x{cols}, k {k}: SIMD {:e} vs scalar {:e} at row {} column {}",
                            y[i],
                            ys[i],
                            i / k,
                            i % k
                        );
                    }
                }
                assert!(y.iter().all(|v| v.is_finite()), "{ty} {rows}x{cols}, k {k}: a non-finite output");
                checked += rows * k;
            }
        }
    }
    println!("{checked} (row, column) values identical to the single-row kernels");
}

#[test]
fn a_column_does_not_depend_on_its_neighbours() {
    // The same activation row as column 0 of a 1-, 3- and 8-column call, the other columns
    // drawn afresh each time: column 0 never moves.
    let mut rng = Rng(0x5EED_0000_4B17_0002);
    let (rows, cols) = (64, 1024);
    for ty in
        [QuantType::Q4K, QuantType::Q6K, QuantType::Q5_0, QuantType::Q8_0, QuantType::Q4_0, QuantType::Q4_1, QuantType::Q5_1]
    {
        let w = random_rows(ty, rows, cols, &mut rng);
        let (a0, ab) = acts(ty, cols, 1, &mut rng);
        let mut first: Option<Vec<u32>> = None;
        for k in [1usize, 3, 8, 5, 2, 16, 11] {
            let (rest, _) = acts(ty, cols, k - 1, &mut rng);
            let mut a = a0.clone();
            a.extend_from_slice(&rest);
            assert_eq!(a.len(), k * ab);
            let mut y = vec![0f32; rows * k];
            matvec_fast_multi(ty, &w, rows, cols, &a, k, &mut y);
            let col0: Vec<u32> = (0..rows).map(|r| y[r * k].to_bits()).collect();
            match &first {
                None => first = Some(col0),
                Some(f) => assert_eq!(f, &col0, "{ty}: column 0 changed with {k} columns"),
            }
        }
    }
}

#[test]
#[should_panic(expected = "activation bytes")]
fn wrong_activation_length_is_refused() {
    let ty = QuantType::Q4K;
    let w = vec![0u8; ty.row_bytes(256).unwrap() * 2];
    let a = vec![0u8; act_type(ty).unwrap().row_bytes(256).unwrap() * 3];
    let mut y = vec![0f32; 2 * 2];
    matvec_fast_multi(ty, &w, 2, 256, &a, 2, &mut y);
}

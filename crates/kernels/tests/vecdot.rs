//! Quantized-activation dot products (quant::vecdot) against ggml itself, against their AVX-512
//! twins, and against an exact f64 reference.
//!
//! 1. `matches_ggml_fixture`: tests/data/vecdot/ggml_x86.bin holds inputs and outputs of
//!    llama.cpp's own CPU code: `quantize_row_q8_0`, `quantize_row_q8_1`, `quantize_row_q8_K`
//!    (activation rows: normal-ish values over 7 decades of scale with outliers, rows of exact
//!    half-integer ties with block max 127, rows with an all-zero block) and every
//!    `ggml_vec_dot_<w>_q8_*` (weights quantized by ggml's `quantize_row_<w>_ref`). It was written
//!    by a small C program linked against libggml-cpu.a/libggml-base.a of the llama.cpp vendored
//!    in llama-cpp-python 0.3.36, built with GCC 12.2 for x86-64 with AVX2/AVX-512 (F, BW, VL,
//!    VNNI, VBMI, BF16). Expected: every byte and every result bit identical. The kind-2 records
//!    of IQ4_NL, IQ4_XS and MXFP4 at the end, and after them those of IQ3_XXS, IQ3_S, IQ2_XXS,
//!    IQ2_XS and IQ2_S, come from tools/fixtures/quant/gen_vecdot_lut.c (same library version,
//!    built the same way).
//!    Format (little-endian): "CVD1", then records. Kind 1: act (0 q8_0, 1 q8_1, 2 q8_K), n,
//!    n f32 inputs, the act row bytes. Kind 2: ggml type id, n, weight byte count + bytes,
//!    act byte count + bytes, the f32 result.
//!    Set CORTIQ_VECDOT_FIXTURE to a larger file in the same format to run more cases.
//!    Kind 3 (ggml's whole decode mul_mat through its CPU backend, f32 activations in, with the
//!    weight in a plain buffer or in the default CPU_REPACK buffer): ggml type id, rows, n,
//!    repacked flag, rows * row_bytes weight bytes, n f32 activations, rows f32 outputs. Checks
//!    `quantize_act` + `matvec_q_order` end to end. Kind 4: the same with several activation
//!    columns (a prompt batch): ggml type id, rows, n, columns, repacked flag, weights,
//!    columns * n f32, columns * rows f32; checks every column against `llamacpp_order`:
//!    vec_dot order for plain weights (llamafile's tinyBLAS for Q8_0/Q4_0/Q5_0 included), the
//!    tiled order for plain k-quants from 8 columns on, repacked gemm/gemv for repacked ones.
//! 2. `simd_matches_scalar`: `vec_dot` (AVX-512 when present) vs `vec_dot_scalar` on random blocks:
//!    0 ulp required for every type.
//!    `quantize_simd_matches_scalar`: the AVX-512 Q8_0/Q8_1 quantizer vs the scalar one, byte for
//!    byte, including ties, zeros, subnormals and huge values (NaN input is unspecified).
//! 3. `close_to_f64_reference`: |vec_dot - sum(w_i * a_i)| in f64, where w is the scalar
//!    dequantization of the weight row and a the exact decode of the activation row, divided by
//!    sum |w_i * a_i|: per-type bound printed as a table.
//! 4. `quantize_act_error_bounds`: |q*d - x| <= d/2 (+ f16 rounding of d) elementwise.

use cortiq_kernels::quant::{
    ActType, Order, QuantType, act_type, dequantize_act, dequantize_row_scalar, llamacpp_order, llamacpp_repacks, matvec_q,
    matvec_q_order, matvec_q_order_tile, order_supported, quantize_act, quantize_act_scalar, quantize_act_to, vec_dot,
    vec_dot_order, vec_dot_order_scalar, vec_dot_scalar,
};
use cortiq_testkit::nan_max;
use std::path::PathBuf;

const DOT_TYPES: [QuantType; 18] = [
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
    QuantType::IQ4NL,
    QuantType::IQ4XS,
    QuantType::MXFP4,
    QuantType::IQ2XXS,
    QuantType::IQ2XS,
    QuantType::IQ2S,
    QuantType::IQ3XXS,
    QuantType::IQ3S,
];

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
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Roughly normal (sum of 4 uniforms), occasional 20x outliers.
    fn act(&mut self, scale: f32) -> f32 {
        let v = (self.unit() + self.unit() + self.unit() + self.unit() - 2.0) * scale;
        if self.next().is_multiple_of(100) { v * 20.0 } else { v }
    }
}

/// Random weight blocks: random quant/scale bytes, f16 scales of either sign with magnitudes
/// 2^-14 .. 2^-2 (realistic; huge scales would only test overflow to inf), MXFP4 exponents
/// for 2^-16 .. 2^7.
fn random_weights(ty: QuantType, blocks: usize, rng: &mut Rng) -> Vec<u8> {
    let ts = ty.type_size();
    let mut v: Vec<u8> = (0..blocks * ts).map(|_| rng.next() as u8).collect();
    for b in v.chunks_exact_mut(ts) {
        for &off in ty.f16_scale_fields() {
            let mag = (rng.unit() + 0.5) * 2f32.powi(-((rng.next() % 13) as i32) - 2);
            let s = if rng.next().is_multiple_of(2) { mag } else { -mag };
            b[off..off + 2].copy_from_slice(&half::f16::from_f32(s).to_bits().to_le_bytes());
        }
        if ty == QuantType::MXFP4 {
            b[0] = 112 + (rng.next() % 24) as u8;
        }
    }
    v
}

fn random_act(at: ActType, n: usize, rng: &mut Rng) -> (Vec<f32>, Vec<u8>) {
    let scale = 10f32.powf(rng.unit() * 5.0 - 3.0);
    let x: Vec<f32> = (0..n).map(|_| rng.act(scale)).collect();
    let mut q = Vec::new();
    quantize_act(at, &x, &mut q);
    (x, q)
}

fn act_from_id(id: u32) -> ActType {
    match id {
        0 => ActType::Q8_0,
        1 => ActType::Q8_1,
        2 => ActType::Q8K,
        _ => panic!("fixture: bad act id {id}"),
    }
}

struct Reader<'a>(&'a [u8]);
impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes(4).try_into().unwrap())
    }
}

#[test]
fn matches_ggml_fixture() {
    let path = std::env::var("CORTIQ_VECDOT_FIXTURE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/vecdot/ggml_x86.bin"));
    let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut r = Reader(&data);
    assert_eq!(r.bytes(4), b"CVD1", "{}: bad magic", path.display());
    // per act type: (rows, mismatching rows); per weight type: (rows, scalar bad, simd bad)
    let mut act_stats = std::collections::BTreeMap::<&str, (usize, usize)>::new();
    let mut dot_stats = std::collections::BTreeMap::<&str, (usize, usize, usize)>::new();
    // ggml's whole mul_mat (f32 activations in, f32 out), per type and layout: (rows, differing)
    // (rows, differing, rows where the plain vec_dot order would differ: shows the repacked
    // order is really needed)
    let mut mm_stats = std::collections::BTreeMap::<String, (usize, usize, usize)>::new();
    // prompt batches (several activation columns): (values, differing, values where the plain
    // vec_dot order would differ)
    let mut batch_stats = std::collections::BTreeMap::<String, (usize, usize, usize)>::new();
    let mut out = Vec::new();
    while !r.0.is_empty() {
        match r.u32() {
            1 => {
                let at = act_from_id(r.u32());
                let n = r.u32() as usize;
                let x: Vec<f32> = r.bytes(4 * n).chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
                let want = r.bytes(at.row_bytes(n).unwrap());
                quantize_act(at, &x, &mut out);
                let e = act_stats.entry(at.name()).or_default();
                e.0 += 1;
                if out != want {
                    e.1 += 1;
                    let i = out.iter().zip(want).position(|(a, b)| a != b).unwrap();
                    println!(
                        "{at} n={n}: first differing byte {i} (block {}, offset {}): ours {:#04x}, ggml {:#04x}",
                        i / at.type_size(),
                        i % at.type_size(),
                        out[i],
                        want[i]
                    );
                }
            }
            2 => {
                let id = r.u32();
                let ty = QuantType::from_ggml_id(id).expect("fixture: weight type");
                let n = r.u32() as usize;
                let wl = r.u32() as usize;
                let w = r.bytes(wl);
                let al = r.u32() as usize;
                let a = r.bytes(al);
                let want = f32::from_le_bytes(r.bytes(4).try_into().unwrap());
                let s = vec_dot_scalar(ty, w, a, n);
                let v = vec_dot(ty, w, a, n);
                let e = dot_stats.entry(ty.name()).or_default();
                e.0 += 1;
                if s.to_bits() != want.to_bits() {
                    e.1 += 1;
                    println!("{ty} n={n}: scalar {s:e} ggml {want:e} (diff {:e})", s - want);
                }
                if v.to_bits() != want.to_bits() {
                    e.2 += 1;
                    println!("{ty} n={n}: vec_dot {v:e} ggml {want:e} (diff {:e})", v - want);
                }
            }
            3 => {
                let ty = QuantType::from_ggml_id(r.u32()).expect("fixture: weight type");
                let rows = r.u32() as usize;
                let n = r.u32() as usize;
                let repack = r.u32() != 0;
                let rb = ty.row_bytes(n).unwrap();
                let w = r.bytes(rows * rb);
                let x: Vec<f32> = r.bytes(4 * n).chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
                let want: Vec<f32> =
                    r.bytes(4 * rows).chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
                quantize_act(act_type(ty).unwrap(), &x, &mut out);
                let mut y = vec![0f32; rows];
                let order = if repack { Order::RepackGemv } else { Order::VecDot };
                matvec_q_order(ty, order, w, rows, n, &out, &mut y);
                let key = if repack { format!("{} repacked", ty.name()) } else { ty.name().to_string() };
                let e = mm_stats.entry(key).or_default();
                for (row, (&got, &exp)) in y.iter().zip(&want).enumerate() {
                    let wr = &w[row * rb..(row + 1) * rb];
                    let s = vec_dot_order_scalar(ty, order, wr, &out, n);
                    e.0 += 1;
                    if repack && vec_dot(ty, wr, &out, n).to_bits() != exp.to_bits() {
                        e.2 += 1;
                    }
                    if got.to_bits() != exp.to_bits() || s.to_bits() != exp.to_bits() {
                        e.1 += 1;
                        println!("{ty} mul_mat (repack {repack}) row {row}: ours {got:e} / scalar {s:e}, ggml {exp:e}");
                    }
                }
                // the harness repacks exactly the types llama.cpp's x86 build repacks
                let repackable = matches!(ty, QuantType::Q4_0 | QuantType::Q4K | QuantType::Q2K);
                assert_eq!(llamacpp_repacks(ty, rows), repackable, "{ty}: llamacpp_repacks({rows})");
            }
            4 => {
                // ggml's mul_mat with several activation columns (a prompt batch): plain weights
                // (vec_dot order, tinyBLAS included) or repacked ones (gemm order for columns
                // 0..nc - nc%4, gemv order for the rest)
                let ty = QuantType::from_ggml_id(r.u32()).expect("fixture: weight type");
                let rows = r.u32() as usize;
                let n = r.u32() as usize;
                let nc = r.u32() as usize;
                let repack = r.u32() != 0;
                let rb = ty.row_bytes(n).unwrap();
                let w = r.bytes(rows * rb);
                let x: Vec<f32> =
                    r.bytes(4 * n * nc).chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
                let want: Vec<f32> =
                    r.bytes(4 * rows * nc).chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
                let key = format!("{} x{nc}{}", ty.name(), if repack { " repacked" } else { "" });
                let e = batch_stats.entry(key).or_default();
                let mut y = vec![0f32; rows];
                for c in 0..nc {
                    // the plain-buffer run of a repackable type is what llama.cpp does for a row
                    // count that is not a multiple of 8: ask for one such (1)
                    let order = llamacpp_order(ty, if repack { rows } else { 1 }, nc, c);
                    quantize_act(act_type(ty).unwrap(), &x[c * n..(c + 1) * n], &mut out);
                    matvec_q_order(ty, order, w, rows, n, &out, &mut y);
                    let exp = &want[c * rows..(c + 1) * rows];
                    e.0 += rows;
                    let bad = y.iter().zip(exp).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                    if bad > 0 && e.1 == 0 {
                        let i = y.iter().zip(exp).position(|(a, b)| a.to_bits() != b.to_bits()).unwrap();
                        println!("{ty} x{nc} column {c} row {i} ({order:?}): ours {:e}, ggml {:e}", y[i], exp[i]);
                    }
                    e.1 += bad;
                    if order != Order::VecDot {
                        matvec_q(ty, w, rows, n, &out, &mut y);
                        e.2 += y.iter().zip(exp).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                    }
                }
            }
            k => panic!("fixture: bad record kind {k}"),
        }
    }
    println!("fixture {}:", path.display());
    for (k, (n, bad)) in &act_stats {
        println!("  quantize_act {k:>5}: {n} rows, {bad} differ");
    }
    for (k, (n, bs, bv)) in &dot_stats {
        println!("  vec_dot      {k:>5}: {n} rows, scalar {bs} differ, dispatch {bv} differ");
    }
    for (k, (n, bad, plain)) in &mm_stats {
        println!("  mul_mat {k:>14}: {n} rows, {bad} differ (plain vec_dot order would differ on {plain})");
    }
    for (k, (n, bad, plain)) in &batch_stats {
        println!("  batch mul_mat {k:>16}: {n} values, {bad} differ (plain vec_dot order would differ on {plain})");
    }
    assert!(batch_stats.values().all(|s| s.1 == 0), "prompt-batch mul_mat differs from ggml");
    assert_eq!(act_stats.len(), 3, "fixture must cover the three activation types");
    assert!(mm_stats.len() >= 10, "fixture must cover ggml's mul_mat, plain and repacked");
    assert!(mm_stats.values().all(|s| s.1 == 0), "matvec_q differs from ggml's mul_mat");
    assert_eq!(dot_stats.len(), DOT_TYPES.len(), "fixture must cover every weight type");
    assert!(act_stats.values().all(|s| s.1 == 0), "quantize_act differs from ggml");
    assert!(dot_stats.values().all(|s| s.1 == 0 && s.2 == 0), "vec_dot differs from ggml");
}

#[test]
fn simd_matches_scalar() {
    let simd = cortiq_kernels::quant::vecdot_avx512::available();
    println!("AVX-512 VNNI vec_dot active: {simd}");
    let mut rng = Rng(7);
    println!("{:>5} {:>6} {:>10} {:>12}", "type", "rows", "mismatches", "max |diff|");
    let mut total_bad = 0;
    for ty in DOT_TYPES {
        let at = act_type(ty).unwrap();
        let mut bad = 0;
        let mut maxd = 0f32;
        let mut rows = 0;
        for blocks in [1usize, 2, 3, 7, 16] {
            let n = blocks * ty.block_size();
            for _ in 0..40 {
                let w = random_weights(ty, blocks, &mut rng);
                let (_, a) = random_act(at, n, &mut rng);
                let s = vec_dot_scalar(ty, &w, &a, n);
                let v = vec_dot(ty, &w, &a, n);
                rows += 1;
                if s.to_bits() != v.to_bits() {
                    bad += 1;
                    maxd = nan_max(maxd as f64, (s - v).abs() as f64) as f32;
                    if bad == 1 {
                        println!("{ty} n={n}: scalar {s:e} simd {v:e}");
                    }
                }
            }
        }
        // matvec_q (the streamed one-row loop) and the tile's 4-row kernel must give the same
        // bits row by row
        let (rows_m, cols) = (13, 4 * ty.block_size().max(256));
        let w = random_weights(ty, rows_m * cols / ty.block_size(), &mut rng);
        let (_, a) = random_act(at, cols, &mut rng);
        let mut y = vec![0f32; 2 * rows_m];
        matvec_q(ty, &w, rows_m, cols, &a, &mut y[..rows_m]);
        matvec_q_order_tile(ty, Order::VecDot, &w, rows_m, cols, &a, &mut y[rows_m..]);
        let rb = ty.row_bytes(cols).unwrap();
        for (r, &got) in y.iter().enumerate() {
            let r = r % rows_m;
            let s = vec_dot_scalar(ty, &w[r * rb..(r + 1) * rb], &a, cols);
            rows += 1;
            if s.to_bits() != got.to_bits() {
                bad += 1;
                maxd = nan_max(maxd as f64, (s - got).abs() as f64) as f32;
                println!("{ty} matvec row {r}: scalar {s:e} matvec {got:e}");
            }
        }
        println!("{:>5} {rows:>6} {bad:>10} {maxd:>12e}", ty.name());
        total_bad += bad;
        for order in [Order::RepackGemv, Order::RepackGemm, Order::Tiled] {
            if !order_supported(ty, order) {
                continue;
            }
            // the repacked orders: one-row and 4-row kernels vs their scalar twin
            let (mut rows, mut bad) = (0, 0);
            for blocks in [1usize, 3, 16] {
                let n = blocks * ty.block_size();
                for _ in 0..40 {
                    let w = random_weights(ty, blocks, &mut rng);
                    let (_, a) = random_act(at, n, &mut rng);
                    rows += 1;
                    if vec_dot_order(ty, order, &w, &a, n).to_bits() != vec_dot_order_scalar(ty, order, &w, &a, n).to_bits() {
                        bad += 1;
                    }
                }
            }
            let mut y = vec![0f32; 2 * rows_m];
            let w = random_weights(ty, rows_m * cols / ty.block_size(), &mut rng);
            matvec_q_order(ty, order, &w, rows_m, cols, &a, &mut y[..rows_m]);
            matvec_q_order_tile(ty, order, &w, rows_m, cols, &a, &mut y[rows_m..]);
            for (r, &got) in y.iter().enumerate() {
                let r = r % rows_m;
                rows += 1;
                if got.to_bits() != vec_dot_order_scalar(ty, order, &w[r * rb..(r + 1) * rb], &a, cols).to_bits() {
                    bad += 1;
                }
            }
            println!("{:>5} {rows:>6} {bad:>10}  ({order:?})", ty.name());
            total_bad += bad;
        }
    }
    assert_eq!(total_bad, 0, "SIMD vec_dot must equal the scalar twin bit for bit");
}

/// The AVX2 kernels (`vecdot_avx2`), run directly whatever tier `CORTIQ_SIMD` picks, so an
/// AVX-512 machine checks them too: one row and the 4-row cached matvec, bit for bit their
/// scalar twins, every order they cover.
#[test]
fn avx2_matches_scalar() {
    use cortiq_kernels::quant::{Reads, vecdot_avx2};
    let mut rng = Rng(23);
    let mut checked = 0;
    for ty in DOT_TYPES {
        let at = act_type(ty).unwrap();
        for order in [Order::VecDot, Order::RepackGemv, Order::RepackGemm, Order::Tiled] {
            if !vecdot_avx2::covers(ty, order) {
                continue;
            }
            let mut bad = 0;
            for blocks in [1usize, 2, 3, 7, 16, 28] {
                let n = blocks * ty.block_size();
                for _ in 0..40 {
                    let w = random_weights(ty, blocks, &mut rng);
                    let (_, a) = random_act(at, n, &mut rng);
                    let Some(v) = vecdot_avx2::vec_dot_order(ty, order, &w, &a) else {
                        eprintln!("no AVX2 + FMA + F16C on this CPU: nothing to compare");
                        return;
                    };
                    checked += 1;
                    if v.to_bits() != vec_dot_order_scalar(ty, order, &w, &a, n).to_bits() {
                        bad += 1;
                    }
                }
                // 13 rows: a tile in three 4-row steps and a one-row remainder, or streamed
                let rows = 13;
                let w = random_weights(ty, rows * blocks, &mut rng);
                let (_, a) = random_act(at, n, &mut rng);
                let rb = ty.row_bytes(n).unwrap();
                for reads in [Reads::Tile, Reads::Stream] {
                    let mut y = vec![f32::NAN; rows];
                    assert!(vecdot_avx2::matvec_order(ty, order, &w, rb, &a, &mut y, reads));
                    for (r, &got) in y.iter().enumerate() {
                        checked += 1;
                        if got.to_bits() != vec_dot_order_scalar(ty, order, &w[r * rb..(r + 1) * rb], &a, n).to_bits() {
                            bad += 1;
                        }
                    }
                }
            }
            println!("{:>5} {order:?}: {bad} mismatches", ty.name());
            assert_eq!(bad, 0, "{ty} {order:?}: the AVX2 kernel differs from its scalar twin");
        }
    }
    assert!(checked > 0, "no type was checked");
}

#[test]
fn quantize_simd_matches_scalar() {
    let mut rng = Rng(17);
    let mut rows: Vec<Vec<f32>> = Vec::new();
    for _ in 0..200 {
        let scale = 10f32.powf(rng.unit() * 12.0 - 8.0);
        rows.push((0..512).map(|_| rng.act(scale)).collect());
    }
    // exact ties (block max 127 makes id = 1), zeros, f32 subnormals, huge finite values
    rows.push((0..512).map(|i| if i % 32 == 0 { 127.0 } else { ((i * 37 % 509) as f32 - 254.0) * 0.5 }).collect());
    rows.push(vec![0.0; 512]);
    rows.push((0..512).map(|i| f32::from_bits(1 + i as u32 * 3)).collect());
    rows.push((0..512).map(|i| if i % 2 == 0 { 3e38 } else { -1e37 }).collect());
    println!("{:>5} {:>5} {:>10}", "act", "rows", "mismatches");
    let mut avx2_checked = 0;
    for at in [ActType::Q8_0, ActType::Q8_1, ActType::Q8K] {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let mut bad = 0;
        for (i, x) in rows.iter().enumerate() {
            quantize_act(at, x, &mut a);
            quantize_act_scalar(at, x, &mut b);
            // The slice form writes the same bytes (into stale ones, which it must overwrite).
            let mut c = vec![0xA5u8; a.len()];
            quantize_act_to(at, x, &mut c);
            assert_eq!(c, a, "{at} row {i}: quantize_act_to differs from quantize_act");
            // The AVX2 tier's kernel, whatever this CPU's tier (skipped only without AVX2).
            let mut v = vec![0x5Au8; a.len()];
            if cortiq_kernels::quant::vecdot_avx2::quantize_act_any(at, x, &mut v) {
                avx2_checked += 1;
                assert_eq!(v, b, "{at} row {i}: the AVX2 quantizer differs from its scalar twin");
            }
            if a != b {
                bad += 1;
                let j = a.iter().zip(&b).position(|(p, q)| p != q).unwrap();
                println!("{at} row {i}: byte {j}: simd {:#04x} scalar {:#04x}", a[j], b[j]);
            }
        }
        println!("{:>5} {:>5} {bad:>10}", at.name(), rows.len());
        assert_eq!(bad, 0, "{at}: quantize_act differs from its scalar twin");
    }
    println!("AVX2 quantizer: {avx2_checked} rows checked");
}

#[test]
fn close_to_f64_reference() {
    let mut rng = Rng(11);
    // bound on |got - exact| / sum|w_i a_i|: the f32 accumulation of n/32 (or n/256) block terms,
    // each an exact integer times a rounded d*d product, plus the weight dequantization's own
    // rounding of the min types (`d*q - m` rounds per element in the f32 reference).
    let tol = 1e-6f64;
    println!("{:>5} {:>7} {:>14} {:>10}", "type", "n", "max rel err", "tolerance");
    let mut fails = Vec::new();
    for ty in DOT_TYPES {
        let at = act_type(ty).unwrap();
        let mut worst = 0f64;
        let mut worst_n = 0;
        for blocks in [1usize, 4, 32] {
            let n = blocks * ty.block_size();
            for _ in 0..20 {
                let w = random_weights(ty, blocks, &mut rng);
                let (_, a) = random_act(at, n, &mut rng);
                let mut wf = vec![0f32; n];
                dequantize_row_scalar(ty, &w, &mut wf);
                let mut af = vec![0f64; n];
                dequantize_act(at, &a, &mut af);
                let mut exact: f64 = wf.iter().zip(&af).map(|(&x, &y)| x as f64 * y).sum();
                if at == ActType::Q8_1 {
                    exact += q8_1_sum_rounding(ty, &w, &a);
                }
                let mag: f64 = wf.iter().zip(&af).map(|(&x, &y)| (x as f64 * y).abs()).sum();
                let got = vec_dot(ty, &w, &a, n) as f64;
                let rel = if mag > 0.0 { (got - exact).abs() / mag } else { (got - exact).abs() };
                // A NaN is kept (nothing compares greater than it) and fails `worst <= tol`.
                if rel > worst || rel.is_nan() {
                    worst = rel;
                    worst_n = n;
                }
            }
        }
        println!("{:>5} {worst_n:>7} {worst:>14e} {tol:>10e}", ty.name());
        if worst.is_nan() || worst > tol {
            fails.push(ty);
        }
    }
    assert!(fails.is_empty(), "beyond tolerance: {fails:?}");
}

/// Q8_1 stores `s = f16(d * sum(q))`, and ggml's Q4_1/Q5_1 dots use that stored `s` for the
/// min term (`m * s`) instead of `m * d * sum(q)`: the format's own rounding, not the kernel's.
/// Returns sum over blocks of m * (s - d * sum(q)), added to the exact reference.
fn q8_1_sum_rounding(ty: QuantType, w: &[u8], a: &[u8]) -> f64 {
    let f16 = |b: &[u8]| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64();
    w.chunks_exact(ty.type_size())
        .zip(a.chunks_exact(36))
        .map(|(wb, ab)| {
            let sum: i32 = ab[4..].iter().map(|&q| q as i8 as i32).sum();
            f16(&wb[2..4]) * (f16(&ab[2..4]) - f16(&ab[0..2]) * sum as f64)
        })
        .sum()
}

#[test]
fn quantize_act_error_bounds() {
    let mut rng = Rng(3);
    for at in [ActType::Q8_0, ActType::Q8_1, ActType::Q8K] {
        let mut worst = 0f64;
        for _ in 0..50 {
            let n = 4 * 256;
            let (x, q) = random_act(at, n, &mut rng);
            let mut deq = vec![0f64; n];
            dequantize_act(at, &q, &mut deq);
            let bs = at.block_size();
            for (xb, db) in x.chunks_exact(bs).zip(deq.chunks_exact(bs)) {
                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                // half a quantization step, plus the f16 rounding of d over 127 steps: 2^-11
                // relative, or 2^-25 absolute once d/127 is an f16 subnormal (< 2^-14; real for
                // tiny activations, and ggml has the same loss)
                let d = amax / 127.0;
                let bound = d * 0.5 + 127.0 * (d * 2f64.powi(-11)).max(2f64.powi(-25)) + 1e-30;
                for (&xv, &dv) in xb.iter().zip(db) {
                    worst = nan_max(worst, (xv as f64 - dv).abs() / bound);
                }
            }
        }
        println!("{at}: max |q*d - x| / bound = {worst:.4}");
        assert!(worst <= 1.0, "{at}: quantization error beyond half a step");
    }
    // an all-zero row quantizes to zero scales and zero quants, and dots to exactly 0
    let mut q = Vec::new();
    for ty in DOT_TYPES {
        let at = act_type(ty).unwrap();
        quantize_act(at, &[0f32; 512], &mut q);
        assert!(q.iter().all(|&b| b == 0), "{at}: zero row");
        let w = random_weights(ty, 512 / ty.block_size(), &mut Rng(5));
        assert_eq!(vec_dot(ty, &w, &q, 512), 0.0, "{ty}: dot with a zero activation row");
    }
}

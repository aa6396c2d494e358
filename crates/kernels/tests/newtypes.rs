//! cortiq's own weight types q8r, q4t, q1 (quant::q8r / q4t / q1 / own_avx512): layout and ids,
//! quantization error on random rows, the AVX-512 twins against the scalar references, and the
//! integer dot products against an exact f64 reference.
//!
//! There is no external reference for these formats (cortiq defines them), so every check is
//! against math: the round trip against the input row, the dot products against the f64 dot of
//! the scalar dequantization with the exact decode of the activation row.
//!
//! Budgets (relative RMSE = RMS(dequant - x) / RMS(x), Gaussian rows, mean over 64 rows [worst
//! row]; measured values are printed, the budgets sit a little above them):
//!   q8r 0.95% [1.1%]: an 8-bit grid over the row's max, RMSE ~ max/127/sqrt(12), ~0.75% of the
//!       RMS for 640 Gaussians (0.82% for 2048: a larger max);
//!   q4t 7.6% [8.6%]: 16 non-uniform levels per 32 with a searched scale (measured 7.3%); the
//!       naive scale (largest magnitude on the lowest level) and the uniform -8..7 grid that the
//!       levels replaced (8.6% naive, 8.1% with the same search) print beside it, must be worse;
//!   q1 61.5% [64%]: sign times mean |w|, sqrt(1 - 2/pi) = 60.3% for a Gaussian.
//!   Rows with 1% of 20x outliers (`outlier_rows_within_budget`): q8r 5.1% [6.2%], q4t 13.3%
//!   [14.5%], q1 92% [97%], each a little above its measured value.
//!   SIMD dequantization: bit-identical to the scalar twin.
//!   vec_dot SIMD vs scalar: |diff| <= 2e-6 * sum |w_i * a_i| (same integers, a different f32
//!       summation order).
//!   vec_dot vs f64: |diff| <= 1e-5 * sum |w_i * a_i| (also printed relative to |result|).

use cortiq_kernels::quant::blocks::Q4T_LEVELS;
use cortiq_kernels::quant::{
    ActType, QuantType, QuantizeError, act_type, dequantize_act, dequantize_row, dequantize_row_scalar, dequantize_rows, dot_row,
    matvec_q, quantize_act, quantize_row, quantize_row_weighted, vec_dot, vec_dot_scalar,
};
use cortiq_testkit::{max_abs_diff, nan_max};

/// SplitMix64 (no dependency).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }
    /// Standard normal (Box-Muller).
    fn gauss(&mut self) -> f32 {
        let (u, v) = (self.unit(), self.unit());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }
    fn gauss_row(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.gauss() * scale).collect()
    }
    /// Activation-like: normal with 1% of 20x outliers.
    fn act_row(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| if self.next().is_multiple_of(100) { self.gauss() * 20.0 } else { self.gauss() }).collect()
    }
}

fn quantize(ty: QuantType, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; ty.row_bytes(x.len()).expect("whole blocks")];
    quantize_row(ty, x, &mut out).expect("quantize_row");
    out
}

fn deq(ty: QuantType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![f32::NAN; n];
    dequantize_row_scalar(ty, bytes, &mut y);
    y
}

fn rel_rmse(x: &[f32], y: &[f32]) -> f64 {
    let e: f64 = x.iter().zip(y).map(|(&a, &b)| (a as f64 - b as f64).powi(2)).sum();
    let r: f64 = x.iter().map(|&a| (a as f64).powi(2)).sum();
    (e / r).sqrt()
}

#[test]
fn layout_ids_and_names() {
    println!("type  block bytes  bytes/256 weights  bits/weight (640-wide row)");
    for ty in QuantType::OWN {
        let rb = ty.row_bytes(640).unwrap();
        println!(
            "{:>4} {:>6} {:>5} {:>18} {:>12.4}",
            ty.name(),
            ty.block_size(),
            ty.type_size(),
            256 / ty.block_size() * ty.type_size(),
            rb as f64 * 8.0 / 640.0
        );
        assert!(ty.is_cortiq());
        assert_eq!(QuantType::from_name(ty.name()), Some(ty));
        assert_eq!(QuantType::from_cmf_id(ty.cmf_id()), Some(ty));
        assert!(ty.cmf_id() >= 1000, "{ty}: private id range");
        assert_eq!(QuantType::from_ggml_id(ty.cmf_id()), None, "{ty}: a GGUF file must not name it");
        assert_eq!(act_type(ty), Some(ActType::Q8_0));
    }
    // GGUF types keep their ids and names through the cmf pair
    for ty in QuantType::ALL {
        assert!(!ty.is_cortiq());
        assert_eq!(QuantType::from_cmf_id(ty.cmf_id()), Some(ty));
        assert_eq!(QuantType::from_name(ty.name()), Some(ty));
    }
    assert_eq!(QuantType::from_name("q4_k"), None, "names are exact");
    // q8r: quants plus a trailing f32 per row; q4t: 72 bytes per 128 (4.5 bpw); q1: 18 per 128
    assert_eq!(QuantType::Q8R.row_bytes(640), Some(644));
    assert_eq!(QuantType::Q8R.row_bytes(48), None);
    assert_eq!(QuantType::Q4T.row_bytes(640), Some(360));
    assert_eq!(QuantType::Q4T.row_bytes(256 + 64), None);
    assert_eq!(QuantType::Q1.row_bytes(640), Some(90));
    assert_eq!(QuantType::Q4T.row_bytes(256).unwrap() * 8 * 2, 256 * 9, "q4t is 4.5 bits/weight");
}

/// q4t's relative RMSE on `x` with naive scales (no search), for comparison only: with q4t's
/// own levels (largest magnitude -> level -127), or with the uniform -8..7 grid (largest
/// magnitude -> -8) that the non-uniform levels replaced.
fn naive_q4t_rmse(x: &[f32], uniform: bool) -> f64 {
    let levels: Vec<f32> =
        if uniform { (-8..8).map(|l| l as f32).collect() } else { Q4T_LEVELS.iter().map(|&l| l as f32).collect() };
    let mut y = vec![0f32; x.len()];
    for (xg, yg) in x.chunks_exact(32).zip(y.chunks_exact_mut(32)) {
        let max = xg.iter().copied().fold(0f32, |m, v| if v.abs() > m.abs() { v } else { m });
        let d = half::f16::from_f32(max / levels[0]).to_f32();
        for (o, &v) in yg.iter_mut().zip(xg) {
            let l = levels.iter().copied().min_by(|a, b| (v - d * a).abs().total_cmp(&(v - d * b).abs())).unwrap();
            *o = d * l;
        }
    }
    rel_rmse(x, &y)
}

#[test]
fn round_trip_error_within_budget() {
    let mut rng = Rng(0x5EED_0001);
    // (type, budget for the mean over rows, budget for the worst row)
    let budgets = [(QuantType::Q8R, 0.0095, 0.011), (QuantType::Q4T, 0.076, 0.086), (QuantType::Q1, 0.615, 0.64)];
    println!("relative RMSE (RMS of error / RMS of row), Gaussian rows; worst row in brackets");
    for (ty, budget, worst_budget) in budgets {
        for n in [640, 2048] {
            let (mut sum, mut worst, mut naive, mut uniform) = (0f64, 0f64, 0f64, 0f64);
            let rows = 64;
            for r in 0..rows {
                // scales over 6 decades: quantization is scale-free up to f16 scale rounding
                let x = rng.gauss_row(n, 10f32.powi(r % 6 - 4));
                let y = deq(ty, &quantize(ty, &x), n);
                let e = rel_rmse(&x, &y);
                sum += e;
                worst = nan_max(worst, e);
                if ty == QuantType::Q4T {
                    naive += naive_q4t_rmse(&x, false);
                    uniform += naive_q4t_rmse(&x, true);
                }
            }
            let mean = sum / rows as f64;
            print!(
                "{:>4} n={n:5}: {:7.3}% [{:7.3}%] budget {:5.2}% [{:5.2}%]",
                ty.name(),
                100.0 * mean,
                100.0 * worst,
                100.0 * budget,
                100.0 * worst_budget
            );
            if ty == QuantType::Q4T {
                let (naive, uniform) = (naive / rows as f64, uniform / rows as f64);
                print!("   (naive scale: {:6.3}%; uniform -8..7 levels, naive scale: {:6.3}%)", 100.0 * naive, 100.0 * uniform);
                assert!(mean < naive && naive < uniform, "q4t: search {mean} vs naive {naive} vs uniform {uniform}");
            }
            println!();
            assert!(mean <= budget, "{ty} n={n}: mean relative RMSE {mean:e} > budget {budget:e}");
            assert!(worst <= worst_budget, "{ty} n={n}: worst relative RMSE {worst:e} > budget {worst_budget:e}");
        }
    }
}

/// Heavy tails (activation-like rows, 1% of 20x outliers): the outliers set the scale, so the
/// bulk sits on fewer levels and the error is larger than on Gaussian rows. Mean over 8 rows of
/// 2048 [worst row]; each budget a little above its measured value, like the Gaussian ones.
/// Measured (seed 0x5EED_0005, this test, x86-64 --release): q8r 4.60% [5.56%], q4t 12.07%
/// [13.06%], q1 89.83% [94.01%]. Was `e < 1.0` on one row, 25x above q8r's 4.0%.
#[test]
fn outlier_rows_within_budget() {
    let mut rng = Rng(0x5EED_0005);
    let rows = 8;
    let budgets = [(QuantType::Q8R, 0.051, 0.062), (QuantType::Q4T, 0.133, 0.145), (QuantType::Q1, 0.92, 0.97)];
    for (ty, budget, worst_budget) in budgets {
        let (mut sum, mut worst) = (0f64, 0f64);
        for _ in 0..rows {
            let x = rng.act_row(2048);
            let e = rel_rmse(&x, &deq(ty, &quantize(ty, &x), 2048));
            sum += e;
            worst = nan_max(worst, e);
        }
        let mean = sum / rows as f64;
        println!(
            "{:>4} n= 2048 with outliers: {:7.3}% [{:7.3}%] budget {:5.2}% [{:5.2}%]",
            ty.name(),
            100.0 * mean,
            100.0 * worst,
            100.0 * budget,
            100.0 * worst_budget
        );
        assert!(mean <= budget, "{ty}: outlier rows' mean relative RMSE {mean:e} > budget {budget:e}");
        assert!(worst <= worst_budget, "{ty}: worst outlier row relative RMSE {worst:e} > budget {worst_budget:e}");
    }
}

#[test]
fn special_rows() {
    for ty in QuantType::OWN {
        // all zeros -> exact zeros
        let z = vec![0f32; 256];
        assert!(deq(ty, &quantize(ty, &z), 256).iter().all(|&v| v == 0.0), "{ty}: zero row");
        // a constant row: one level; exact where the scale is (q1: the mean; q8r: 0.375/127 *
        // 127 rounds back), within the f16 scale's rounding for q4t (0.375/127 is no f16)
        let c = vec![0.375f32; 256];
        let y = deq(ty, &quantize(ty, &c), 256);
        let tol = if ty == QuantType::Q4T { 0.375 / 2048.0 } else { 0.0 };
        assert!(y.iter().all(|&v| (v - 0.375).abs() <= tol), "{ty}: constant row gave {:?}", &y[..4]);
        // values on the type's own grid: q4t's levels times 2^-10 (an exact f16 scale), which
        // its scale search must find exactly; q8r's fixed max/127 scale is off an integer grid
        // -7..7 times 2^-10, so there only the half-step bound holds
        if ty != QuantType::Q1 {
            let g: Vec<f32> = if ty == QuantType::Q4T {
                (0..256).map(|i| Q4T_LEVELS[(i * 7 + i / 32) % 16] as f32 / 1024.0).collect()
            } else {
                (0..256).map(|i| ((i * 7 % 15) as f32 - 7.0) / 1024.0).collect()
            };
            let y = deq(ty, &quantize(ty, &g), 256);
            let (maxd, _) = max_abs_diff(&g, &y);
            println!("{:>4}: on-grid row max |err| {maxd:e}", ty.name());
            let bound = if ty == QuantType::Q8R { 7.0 / 1024.0 / 127.0 * 0.5001 } else { 0.0 };
            assert!(maxd <= bound, "{ty}: on-grid row max |err| {maxd:e} > {bound:e}");
        }
    }
}

#[test]
fn quantize_row_rejects_bad_input() {
    let x = vec![0.5f32; 128];
    let mut out = vec![0u8; 100];
    assert!(matches!(quantize_row(QuantType::Q4K, &x, &mut out), Err(QuantizeError::Unsupported { .. })));
    let e = quantize_row(QuantType::Q4T, &x, &mut out).unwrap_err();
    assert_eq!(e, QuantizeError::Length { ty: QuantType::Q4T, n: 128, want: Some(72), got: 100 });
    println!("{e}");
    let e = quantize_row(QuantType::Q1, &x[..96], &mut out).unwrap_err();
    assert!(matches!(e, QuantizeError::Length { want: None, .. }));
    println!("{e}");
    let mut bad = x.clone();
    bad[77] = f32::NAN;
    let mut out = vec![0xAAu8; 72];
    let e = quantize_row(QuantType::Q4T, &bad, &mut out).unwrap_err();
    assert!(matches!(e, QuantizeError::NonFinite { index: 77, .. }));
    assert!(out.iter().all(|&b| b == 0xAA), "out untouched on error");
    println!("{e}");
}

#[test]
fn importance_weighted_quantization() {
    let mut rng = Rng(0x5EED_0006);
    let n = 2048;
    // bad importance
    let x = rng.gauss_row(n, 0.02);
    let mut out = vec![0u8; QuantType::Q4T.row_bytes(n).unwrap()];
    let e = quantize_row_weighted(QuantType::Q4T, &x, &x[..10], &mut out).unwrap_err();
    assert!(matches!(e, QuantizeError::ImportanceLength { n: 2048, got: 10, .. }), "{e}");
    let mut imp = vec![1f32; n];
    imp[5] = -1.0;
    let e = quantize_row_weighted(QuantType::Q4T, &x, &imp, &mut out).unwrap_err();
    assert!(matches!(e, QuantizeError::BadImportance { index: 5, .. }), "{e}");
    imp[5] = f32::INFINITY;
    assert!(matches!(quantize_row_weighted(QuantType::Q1, &x, &imp, &mut out), Err(QuantizeError::BadImportance { .. })));

    println!("importance-weighted relative RMSE, sqrt(Σ imp·err² / Σ imp·x²): plain -> weighted quantization");
    for ty in QuantType::OWN {
        let mut out = vec![0u8; ty.row_bytes(n).unwrap()];
        // uniform importance: the same bytes as quantize_row (any constant)
        let x = rng.gauss_row(n, 0.02);
        quantize_row_weighted(ty, &x, &vec![3.5f32; n], &mut out).unwrap();
        assert_eq!(out, quantize(ty, &x), "{ty}: constant importance must not change the bytes");
        // skewed importance (activation-like: 1 in 16 columns 50x): the weighted error must drop
        let (mut plain, mut weighted) = (0f64, 0f64);
        for _ in 0..16 {
            let x = rng.gauss_row(n, 0.02);
            let imp: Vec<f32> = (0..n).map(|j| if j % 16 == 3 { 50.0 } else { 1.0 } * (0.5 + rng.unit() as f32)).collect();
            quantize_row_weighted(ty, &x, &imp, &mut out).unwrap();
            let wy = deq(ty, &out, n);
            let py = deq(ty, &quantize(ty, &x), n);
            let werr = |y: &[f32]| {
                let e: f64 = x.iter().zip(y).zip(&imp).map(|((&a, &b), &w)| w as f64 * (a as f64 - b as f64).powi(2)).sum();
                let r: f64 = x.iter().zip(&imp).map(|(&a, &w)| w as f64 * (a as f64).powi(2)).sum();
                (e / r).sqrt()
            };
            plain += werr(&py) / 16.0;
            weighted += werr(&wy) / 16.0;
        }
        println!("{:>4}: {:7.3}% -> {:7.3}%", ty.name(), 100.0 * plain, 100.0 * weighted);
        if ty == QuantType::Q8R {
            assert_eq!(plain, weighted, "q8r ignores importance");
        } else {
            assert!(weighted < 0.97 * plain, "{ty}: importance must lower the weighted error ({weighted} vs {plain})");
        }
    }
}

/// Random but valid rows: random quant bytes with finite scales of random magnitude.
fn random_row(ty: QuantType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let mut v: Vec<u8> = (0..ty.row_bytes(n).unwrap()).map(|_| rng.next() as u8).collect();
    let f16 = |rng: &mut Rng| half::f16::from_f32(rng.gauss() * 0.01).to_bits().to_le_bytes();
    match ty {
        QuantType::Q8R => {
            for b in &mut v[..n] {
                if *b == 0x80 {
                    *b = 0x81; // -128 is not a q8r quant
                }
            }
            let s = (rng.gauss() * 1e-3).to_le_bytes();
            v[n..].copy_from_slice(&s);
        }
        QuantType::Q4T => {
            for b in v.chunks_exact_mut(72) {
                for g in 0..4 {
                    b[2 * g..2 * g + 2].copy_from_slice(&f16(rng));
                }
            }
        }
        QuantType::Q1 => {
            for b in v.chunks_exact_mut(18) {
                b[16..].copy_from_slice(&f16(rng));
            }
        }
        _ => unreachable!(),
    }
    v
}

#[test]
fn simd_dequantize_is_bit_identical() {
    println!("AVX-512 dequantizers active: {}", cortiq_kernels::quant::dequant_avx512::available(QuantType::Q4T));
    let mut rng = Rng(0x5EED_0002);
    for ty in QuantType::OWN {
        let mut count = 0;
        for n in [128, 640, 2048, 4096] {
            for round in 0..8 {
                let w = if round % 2 == 0 { random_row(ty, n, &mut rng) } else { quantize(ty, &rng.gauss_row(n, 0.02)) };
                let s = deq(ty, &w, n);
                let mut f = vec![f32::NAN; n];
                dequantize_row(ty, &w, &mut f);
                if let Some(i) = (0..n).find(|&i| s[i].to_bits() != f[i].to_bits()) {
                    panic!(
                        "{ty} n={n}: element {i}: simd {:e} ({:#x}) vs scalar {:e} ({:#x})",
                        f[i],
                        f[i].to_bits(),
                        s[i],
                        s[i].to_bits()
                    );
                }
                count += n;
            }
        }
        println!("{:>4}: {count} values bit-identical", ty.name());
    }
}

#[test]
fn dequantize_rows_and_dot_row() {
    let mut rng = Rng(0x5EED_0003);
    let (rows, cols) = (5, 384);
    for ty in QuantType::OWN {
        let xs: Vec<Vec<f32>> = (0..rows).map(|r| rng.gauss_row(cols, 0.1 * (r + 1) as f32)).collect();
        let qs: Vec<Vec<u8>> = xs.iter().map(|x| quantize(ty, x)).collect();
        let all: Vec<u8> = qs.concat();
        let mut y = vec![f32::NAN; rows * cols];
        dequantize_rows(ty, &all, cols, &mut y);
        for r in 0..rows {
            let one = deq(ty, &qs[r], cols);
            assert_eq!(&y[r * cols..(r + 1) * cols], &one[..], "{ty}: dequantize_rows row {r}");
            // dot_row is the f32 dot of the dequantized row (fixed 8-lane order)
            let x = rng.gauss_row(cols, 1.0);
            let got = dot_row(ty, &qs[r], &x) as f64;
            let want: f64 = one.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
            let mag: f64 = one.iter().zip(&x).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
            assert!((got - want).abs() <= 1e-6 * mag, "{ty}: dot_row {got} vs {want}");
        }
    }
}

/// Exact f64 dot of the scalar dequantization with the exact activation decode.
fn f64_dot(ty: QuantType, w: &[u8], a: &[u8], n: usize) -> (f64, f64) {
    let wd = deq(ty, w, n);
    let mut ad = vec![0f64; n];
    dequantize_act(ActType::Q8_0, a, &mut ad);
    let dot = wd.iter().zip(&ad).map(|(&x, &y)| x as f64 * y).sum();
    let mag = wd.iter().zip(&ad).map(|(&x, &y)| (x as f64 * y).abs()).sum();
    (dot, mag)
}

#[test]
fn vec_dot_simd_scalar_and_f64() {
    println!("AVX-512 VNNI vec_dot active: {}", cortiq_kernels::quant::vecdot_avx512::available());
    println!("type     n  simd-scalar/mag  scalar-f64/mag  simd-f64/mag  simd-f64/|ref|  (max over rows)");
    let mut rng = Rng(0x5EED_0004);
    for ty in QuantType::OWN {
        // q8r also takes rows with an odd number of 32-element blocks (the kernel's tail path)
        let ns: &[usize] = if ty == QuantType::Q8R { &[32, 96, 128, 672, 640, 2048, 8192] } else { &[128, 640, 2048, 8192] };
        for &n in ns {
            let (mut d_ss, mut d_sf, mut d_vf, mut d_vr) = (0f64, 0f64, 0f64, 0f64);
            for round in 0..12 {
                let w = if round % 3 == 0 { random_row(ty, n, &mut rng) } else { quantize(ty, &rng.gauss_row(n, 0.03)) };
                let x = rng.act_row(n);
                let mut a = Vec::new();
                quantize_act(ActType::Q8_0, &x, &mut a);
                let v = vec_dot(ty, &w, &a, n) as f64;
                let s = vec_dot_scalar(ty, &w, &a, n) as f64;
                let (r, mag) = f64_dot(ty, &w, &a, n);
                let mag = mag.max(f64::MIN_POSITIVE);
                d_ss = nan_max(d_ss, (v - s).abs() / mag);
                d_sf = nan_max(d_sf, (s - r).abs() / mag);
                d_vf = nan_max(d_vf, (v - r).abs() / mag);
                d_vr = nan_max(d_vr, (v - r).abs() / r.abs().max(f64::MIN_POSITIVE));
                assert!((v - s).abs() <= 2e-6 * mag, "{ty} n={n} round {round}: simd {v:e} vs scalar {s:e} (mag {mag:e})");
                assert!((s - r).abs() <= 1e-5 * mag, "{ty} n={n} round {round}: scalar {s:e} vs f64 {r:e} (mag {mag:e})");
                assert!((v - r).abs() <= 1e-5 * mag, "{ty} n={n} round {round}: simd {v:e} vs f64 {r:e} (mag {mag:e})");
            }
            println!("{:>4} {n:5} {d_ss:16.2e} {d_sf:15.2e} {d_vf:13.2e} {d_vr:15.2e}", ty.name());
        }
    }
}

#[test]
fn matvec_q_equals_vec_dot_per_row() {
    let mut rng = Rng(0x5EED_0005);
    for (ty, rows, cols) in
        [(QuantType::Q8R, 37, 640), (QuantType::Q4T, 37, 640), (QuantType::Q1, 37, 640), (QuantType::Q8R, 9, 96)]
    {
        let w: Vec<u8> = (0..rows).flat_map(|_| quantize(ty, &rng.gauss_row(cols, 0.05))).collect();
        let mut a = Vec::new();
        quantize_act(ActType::Q8_0, &rng.act_row(cols), &mut a);
        let mut y = vec![f32::NAN; rows];
        matvec_q(ty, &w, rows, cols, &a, &mut y);
        let rb = ty.row_bytes(cols).unwrap();
        for (r, &got) in y.iter().enumerate() {
            let want = vec_dot(ty, &w[r * rb..(r + 1) * rb], &a, cols);
            assert_eq!(got.to_bits(), want.to_bits(), "{ty}: matvec row {r}: {got:e} vs vec_dot {want:e}");
        }
    }
}

//! Quantized matrix-matrix products (quant::matmat) against their scalar twin, against the
//! integer dot products of quant::vecdot, and against an exact f64 reference.
//!
//! Random weight blocks (random quant and scale bytes, f16 scales 2^-14 .. 2^-2 of either sign,
//! MXFP4's E8M0 scales over the same range)
//! times random activation rows quantized by `quantize_act` (normal-ish values over 5 decades
//! of scale with 20x outliers), for every type with a kernel, over shapes that exercise the
//! kernel's edges: 1 to 37 rows (tiles of 32 and 16 plus ragged tails), 1 to 33 tokens (blocks
//! of 4 or 6 plus every tail length), column counts below and above the 1024-element K-chunk
//! (and, for the 32-element types, not a multiple of 64), aligned and unaligned slices.
//!
//! 1. `simd_matches_scalar_twin`: `matmat_q` (AVX-512 VNNI when present) vs `matmat_q_scalar`:
//!    0 ulp required (the twins run the same integer sums and the same FMA sequence); and
//!    `matmat_q_prepared` over one `MatmatActs` in row ranges of 16 (the engine's way) vs
//!    `matmat_q`, 0 ulp.
//! 2. `close_to_vec_dot`: every (row, token) of both vs `vec_dot_scalar` (ggml's float order),
//!    and vs the exact sum Σ w·x̃ in f64; the error is measured relative to Σ|w·x̃| (the scale
//!    on which a float sum's rounding lives) and must stay below 1e-5 (vs f64 for Q4_1/Q5_1:
//!    within 1e-5 of vec_dot's own distance, which Q8_1's f16-rounded `s` makes ~1e-4). The
//!    worst case per type is printed as a table.

use cortiq_kernels::quant::{
    ActType, MatmatActs, QuantType, act_type, dequantize_act, dequantize_row_scalar, matmat_q, matmat_q_prepared,
    matmat_q_prepared_tm, matmat_q_scalar, matmat_supported, quantize_act, vec_dot, vec_dot_scalar,
};
use cortiq_testkit::nan_max;

const TYPES: [QuantType; 18] = [
    QuantType::Q4K,
    QuantType::Q5_0,
    QuantType::Q6K,
    QuantType::Q8_0,
    QuantType::Q4_1,
    QuantType::Q4_0,
    QuantType::Q5_1,
    QuantType::Q5K,
    QuantType::Q3K,
    QuantType::Q2K,
    QuantType::IQ4NL,
    QuantType::IQ4XS,
    QuantType::MXFP4,
    QuantType::IQ2XXS,
    QuantType::IQ2XS,
    QuantType::IQ2S,
    QuantType::IQ3XXS,
    QuantType::IQ3S,
];

/// (rows, cols, tokens). Columns are multiples of 256 so every type takes them; 2304 spans
/// three K-chunks (1024 + 1024 + 256).
const SHAPES: [(usize, usize, usize); 8] =
    [(1, 256, 1), (5, 512, 3), (16, 256, 7), (19, 768, 16), (37, 512, 33), (16, 2304, 9), (33, 1280, 8), (3, 2304, 17)];

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
/// 2^-14 .. 2^-2 (realistic; huge scales would only test overflow to inf).
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
            // E8M0 scale byte: 2^(e - 128) over 2^-14 .. 2^-2 as the f16 scales above (the sign
            // is in the levels)
            b[0] = 114 + (rng.next() % 13) as u8;
        }
    }
    v
}

/// `n_t` activation rows of `cols` quantized to `at`, back to back.
fn random_acts(at: ActType, cols: usize, n_t: usize, rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::new();
    let mut q = Vec::new();
    for _ in 0..n_t {
        let scale = 10f32.powf(rng.unit() * 5.0 - 3.0);
        let x: Vec<f32> = (0..cols).map(|_| rng.act(scale)).collect();
        quantize_act(at, &x, &mut q);
        out.extend_from_slice(&q);
    }
    out
}

/// One random problem. Odd-numbered cases store weights and activations one byte past an
/// allocation's start, so the kernels see unaligned rows.
struct Case {
    wbuf: Vec<u8>,
    abuf: Vec<u8>,
    off: usize,
    rows: usize,
    cols: usize,
    n_t: usize,
}

impl Case {
    fn w(&self) -> &[u8] {
        &self.wbuf[self.off..]
    }
    fn acts(&self) -> &[u8] {
        &self.abuf[self.off..]
    }
}

/// Extra shapes for the 32-element types: column counts that are not a multiple of 64 (the
/// transpose's unit) and one block past the 1024-element K-chunk.
const LEGACY_SHAPES: [(usize, usize, usize); 3] = [(2, 32, 2), (7, 96, 5), (18, 1056, 9)];

fn cases(ty: QuantType, rng: &mut Rng) -> Vec<Case> {
    let at = act_type(ty).unwrap();
    let extra: &[(usize, usize, usize)] = if ty.block_size() == 32 { &LEGACY_SHAPES } else { &[] };
    SHAPES
        .iter()
        .chain(extra)
        .enumerate()
        .map(|(i, &(rows, cols, n_t))| {
            let off = i % 2;
            let mut wbuf = vec![0u8; off];
            wbuf.extend(random_weights(ty, rows * cols / ty.block_size(), rng));
            let mut abuf = vec![0u8; off];
            abuf.extend(random_acts(at, cols, n_t, rng));
            Case { wbuf, abuf, off, rows, cols, n_t }
        })
        .collect()
}

/// The engine shares one `MatmatActs` across its pool's threads.
fn shareable<T: Sync + Send>(_: &T) {}

#[test]
fn simd_matches_scalar_twin() {
    let simd = cortiq_kernels::quant::vecdot_avx512::available();
    println!("AVX-512 VNNI path active: {simd}");
    let mut rng = Rng(0x5EED_0001);
    let mut bad_types = Vec::new();
    for ty in TYPES {
        assert!(matmat_supported(ty), "{ty}: no matmat kernel");
        let (mut n, mut bad, mut first) = (0, 0, None);
        for c in cases(ty, &mut rng) {
            let mut y = vec![f32::NAN; c.rows * c.n_t];
            let mut ys = vec![f32::NAN; c.rows * c.n_t];
            matmat_q(ty, c.w(), c.rows, c.cols, c.acts(), c.n_t, &mut y);
            matmat_q_scalar(ty, c.w(), c.rows, c.cols, c.acts(), c.n_t, &mut ys);
            let prepared = MatmatActs::new(ty, c.acts(), c.cols, c.n_t);
            shareable(&prepared);
            let mut yp = vec![f32::NAN; c.rows * c.n_t];
            let rb = ty.row_bytes(c.cols).unwrap();
            for (r0, out) in (0..c.rows).step_by(16).zip(yp.chunks_mut(16 * c.n_t)) {
                let nr = out.len() / c.n_t;
                matmat_q_prepared(ty, &c.w()[r0 * rb..(r0 + nr) * rb], nr, &prepared, out);
            }
            let same = y.iter().zip(&yp).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{ty}: matmat_q_prepared differs from matmat_q ({}x{} x {} tokens)", c.rows, c.cols, c.n_t);
            // Token-major output with a row stride wider than the matrix: y[t * ldy + r].
            let ldy = c.rows + 3;
            let mut ytm = vec![f32::NAN; c.n_t * ldy];
            matmat_q_prepared_tm(ty, c.w(), c.rows, &prepared, &mut ytm, ldy);
            for r in 0..c.rows {
                for t in 0..c.n_t {
                    assert_eq!(
                        ytm[t * ldy + r].to_bits(),
                        y[r * c.n_t + t].to_bits(),
                        "{ty}: matmat_q_prepared_tm differs at row {r} token {t} ({}x{} x {} tokens)",
                        c.rows,
                        c.cols,
                        c.n_t
                    );
                }
            }
            for (i, (a, b)) in y.iter().zip(&ys).enumerate() {
                n += 1;
                if a.to_bits() != b.to_bits() {
                    bad += 1;
                    first.get_or_insert((c.rows, c.cols, c.n_t, i / c.n_t, i % c.n_t, *a, *b));
                }
            }
        }
        match first {
            None => println!("{ty:>5}: {n} outputs, 0 mismatches"),
            Some((rows, cols, n_t, r, t, a, b)) => {
                println!(
                    "{ty:>5}: {n} outputs, {bad} MISMATCHES; first in {rows}x{cols} x {n_t} tokens at row {r} token {t}: \
                     simd {a:e} ({:#010x}), scalar {b:e} ({:#010x})",
                    a.to_bits(),
                    b.to_bits()
                );
                bad_types.push(ty);
            }
        }
    }
    assert!(bad_types.is_empty(), "SIMD differs from the scalar twin for {bad_types:?}");
}

#[test]
fn close_to_vec_dot() {
    const TOL: f64 = 1e-5;
    let mut rng = Rng(0x5EED_0002);
    println!(
        "error / Σ|w·x̃|, worst over all (row, token) of {} shapes per type ({} for the 32-element types)",
        SHAPES.len(),
        SHAPES.len() + LEGACY_SHAPES.len()
    );
    println!(
        "{:>5} {:>8} {:>13} {:>13} {:>13} {:>13}  worst case (shape, row, token)",
        "type", "outputs", "vs vec_dot", "scalar vs vd", "vs f64", "vec_dot vs f64"
    );
    let mut failed = Vec::new();
    for ty in TYPES {
        let at = act_type(ty).unwrap();
        let (mut n, mut worst, mut worst_s, mut worst_x, mut worst_vx) = (0usize, 0f64, 0f64, 0f64, 0f64);
        let mut where_ = String::new();
        for c in cases(ty, &mut rng) {
            let rb = ty.row_bytes(c.cols).unwrap();
            let ab = at.row_bytes(c.cols).unwrap();
            let mut y = vec![0f32; c.rows * c.n_t];
            let mut ys = vec![0f32; c.rows * c.n_t];
            matmat_q(ty, c.w(), c.rows, c.cols, c.acts(), c.n_t, &mut y);
            matmat_q_scalar(ty, c.w(), c.rows, c.cols, c.acts(), c.n_t, &mut ys);
            let mut wf = vec![0f32; c.cols];
            let mut xf = vec![0f64; c.cols];
            for r in 0..c.rows {
                let wr = &c.w()[r * rb..(r + 1) * rb];
                dequantize_row_scalar(ty, wr, &mut wf);
                for t in 0..c.n_t {
                    let a = &c.acts()[t * ab..(t + 1) * ab];
                    dequantize_act(at, a, &mut xf);
                    let (mut exact, mut mag) = (0f64, 0f64);
                    for (&wv, &xv) in wf.iter().zip(&xf) {
                        exact += wv as f64 * xv;
                        mag += (wv as f64 * xv).abs();
                    }
                    let vd = vec_dot_scalar(ty, wr, a, c.cols) as f64;
                    let (got, gots) = (y[r * c.n_t + t] as f64, ys[r * c.n_t + t] as f64);
                    let mag = mag.max(f64::MIN_POSITIVE);
                    let e = (got - vd).abs() / mag;
                    n += 1;
                    if e > worst || !e.is_finite() {
                        worst = if e.is_finite() { e } else { f64::INFINITY };
                        where_ = format!("{}x{}x{} r{r} t{t}: got {got:e} vec_dot {vd:e} f64 {exact:e}", c.rows, c.cols, c.n_t);
                    }
                    worst_s = nan_max(worst_s, (gots - vd).abs() / mag);
                    worst_x = nan_max(worst_x, (got - exact).abs() / mag);
                    worst_vx = nan_max(worst_vx, (vd - exact).abs() / mag);
                }
            }
        }
        println!("{ty:>5} {n:>8} {worst:>13.3e} {worst_s:>13.3e} {worst_x:>13.3e} {worst_vx:>13.3e}  {where_}");
        // Q8_1 carries s = d * Σq rounded to f16, which ggml's min term uses: vec_dot (and so
        // matmat) is then ~1e-4 away from the exact sum. Hold matmat to vec_dot's own distance.
        let x_ok = if at == ActType::Q8_1 { worst_x <= worst_vx + TOL } else { worst_x <= TOL };
        if !(worst <= TOL && worst_s <= TOL && x_ok) {
            failed.push(ty);
        }
    }
    assert!(failed.is_empty(), "error above {TOL:e} of Σ|w·x̃| for {failed:?}");
}

/// Types with an activation format but no matrix kernel (cortiq's own) still work: `matmat_q`
/// is then one `vec_dot` per (row, token), and the scalar twin one `vec_dot_scalar`.
#[test]
fn types_without_a_kernel_fall_back_to_vec_dot() {
    let mut rng = Rng(0x5EED_0003);
    let (rows, n_t) = (3, 5);
    for ty in QuantType::ALL.into_iter().chain(QuantType::OWN) {
        let (Some(at), false) = (act_type(ty), matmat_supported(ty)) else { continue };
        let cols = (1..=8).map(|k| 256 * k).find(|&c| ty.row_bytes(c).is_some() && at.row_bytes(c).is_some());
        let Some(cols) = cols else { continue };
        let rb = ty.row_bytes(cols).unwrap();
        let w: Vec<u8> = (0..rows * rb).map(|_| rng.next() as u8).collect();
        let acts = random_acts(at, cols, n_t, &mut rng);
        let (mut y, mut ys) = (vec![0f32; rows * n_t], vec![0f32; rows * n_t]);
        matmat_q(ty, &w, rows, cols, &acts, n_t, &mut y);
        matmat_q_scalar(ty, &w, rows, cols, &acts, n_t, &mut ys);
        let ab = at.row_bytes(cols).unwrap();
        for r in 0..rows {
            for t in 0..n_t {
                let (wr, a) = (&w[r * rb..(r + 1) * rb], &acts[t * ab..(t + 1) * ab]);
                let pairs = [
                    ("matmat_q", y[r * n_t + t], vec_dot(ty, wr, a, cols)),
                    ("matmat_q_scalar", ys[r * n_t + t], vec_dot_scalar(ty, wr, a, cols)),
                ];
                for (what, got, want) in pairs {
                    assert!(got.to_bits() == want.to_bits(), "{ty}: {what} row {r} token {t}: {got:e}, its vec_dot {want:e}");
                }
            }
        }
        println!("{ty:>5}: no matmat kernel, fallback == vec_dot on {rows}x{cols} x {n_t} tokens");
    }
}

#[test]
#[should_panic(expected = "matmat_q(q4_K)")]
fn wrong_lengths_panic_with_the_shapes() {
    let w = vec![0u8; 144];
    let acts = vec![0u8; 292];
    let mut y = vec![0f32; 2];
    matmat_q(QuantType::Q4K, &w, 1, 256, &acts, 2, &mut y); // 2 tokens need 584 act bytes
}

//! Mamba2's selective scan (the SSD recurrence) for one head, token by token: decode steps and
//! prefill run this same loop, so a prompt's outputs and state equal its decode steps' bit for
//! bit and do not depend on where a prefill was cut (the prompt-state cache relies on it).
//!
//! Per token, with the state S [head_dim, d_state], the head's inputs x [head_dim], the group's
//! B and C [d_state], the step dt and decay = e^{dt·A}:
//! ```text
//! S ← decay · S + (dt · x) ⊗ B
//! y = S · C + D · x
//! ```
//! The dot over the state runs in eight interleaved partial sums (element i into sum i mod 8),
//! added pairwise at the end: a fixed order whatever the SIMD width.
//!
//! Why hand-written: the product's core (prefill and decode of the Mamba2 hybrids); the work is
//! three products and two sums per state element and token, over a state that stays in L1.
//! The scalar body is the twin (and the non-x86 build); the 8-lane kernel (AVX instructions,
//! taken at the AVX2 and AVX-512 levels: the eight partial sums are one 8-lane register) does
//! each lane's operations in the
//! same order, nothing contracted into an FMA, so every build gives the same bits, and steps
//! four state rows together so that four chains of partial sums are in flight. LLVM's own
//! vectorization of the body inside a target-feature function shuffled lanes and ran 3x slower
//! than the baseline build. `examples/ssm_bench 64 128 128` (Granite-4.0-H-Tiny's head over
//! 128 tokens, one thread, Intel Xeon, 2026-12-06): 0.096-0.099 ms against the scalar twin's
//! 0.140-0.148 (4 lanes, SSE2).

/// One head's inputs over `n` tokens: token t's projected row is `rows[t * stride..][..stride]`,
/// its x at `x_at` (head_dim values), B at `b_at` and C at `c_at` (`d_state` values each);
/// `dt[t]` the step and `decay[t]` = e^{dt·A}; `d` the skip weight.
#[derive(Clone, Copy)]
pub struct ScanInputs<'a> {
    pub rows: &'a [f32],
    pub stride: usize,
    pub x_at: usize,
    pub b_at: usize,
    pub c_at: usize,
    pub d_state: usize,
    pub dt: &'a [f32],
    pub decay: &'a [f32],
    pub d: f32,
}

/// The scan over `inp.dt.len()` tokens: `state` [head_dim, d_state] advanced, `y` [n, head_dim]
/// written. SIMD chosen at run time; equal to `scan_head_scalar` bit for bit.
pub fn scan_head(inp: &ScanInputs, state: &mut [f32], y: &mut [f32]) {
    let (hd, ds) = check(inp, state, y);
    match crate::simd::level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the kernel uses AVX instructions only (no FMA, no AVX2 integer ops), which both
        // levels imply: Avx2 was detected with avx2, and AVX-512F CPUs have AVX.
        crate::simd::Level::Avx512 | crate::simd::Level::Avx2 => unsafe { scan_avx(inp, hd, ds, state, y) },
        _ => scan_body(inp, hd, ds, state, y),
    }
}

/// The scalar twin of `scan_head` (the baseline target's code generation).
pub fn scan_head_scalar(inp: &ScanInputs, state: &mut [f32], y: &mut [f32]) {
    let (hd, ds) = check(inp, state, y);
    scan_body(inp, hd, ds, state, y)
}

/// (head_dim, d_state) from the shapes, which must agree.
fn check(inp: &ScanInputs, state: &[f32], y: &[f32]) -> (usize, usize) {
    let n = inp.dt.len();
    let ds = inp.d_state;
    assert!(ds > 0 && state.len().is_multiple_of(ds), "scan_head: state of {} values for d_state {ds}", state.len());
    let hd = state.len() / ds;
    assert!(hd > 0, "scan_head: an empty state (head_dim 0)");
    assert!(
        inp.decay.len() == n
            && y.len() == n * hd
            && inp.x_at + hd <= inp.stride
            && inp.b_at.max(inp.c_at) + ds <= inp.stride
            && inp.rows.len() >= n * inp.stride,
        "scan_head: {n} tokens of head_dim {hd}, d_state {ds}: decay {}, y {}, rows {} of stride {}",
        inp.decay.len(),
        y.len(),
        inp.rows.len(),
        inp.stride
    );
    (hd, ds)
}

/// `scan_body` in AVX intrinsics (8-lane f32, no FMA). Each lane's operations are the scalar body's: the state step
/// as two products and a sum (no FMA), the partial sum as a product then a sum, the lanes
/// added in the same pairs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
fn scan_avx(inp: &ScanInputs, hd: usize, ds: usize, state: &mut [f32], y: &mut [f32]) {
    use std::arch::x86_64::*;
    let k8 = ds / 8 * 8;
    for (t, yt) in y.chunks_exact_mut(hd).enumerate() {
        let row = &inp.rows[t * inp.stride..(t + 1) * inp.stride];
        let (x, b, c) = (&row[inp.x_at..inp.x_at + hd], &row[inp.b_at..inp.b_at + ds], &row[inp.c_at..inp.c_at + ds]);
        let (dt, decay) = (inp.dt[t], inp.decay[t]);
        let vdecay = _mm256_set1_ps(decay);
        // four state rows at a time: four independent chains of partial sums in flight (one
        // row's chain of ds / 8 dependent additions left the adders idle)
        let mut r = 0;
        while r < hd {
            let m = (hd - r).min(ROWS);
            let (xs, ys) = (&x[r..r + m], &mut yt[r..r + m]);
            let rows = &mut state[r * ds..(r + m) * ds];
            let mut acc = [_mm256_setzero_ps(); ROWS];
            let vdx: [__m256; ROWS] = std::array::from_fn(|i| _mm256_set1_ps(dt * xs[i.min(m - 1)]));
            for k in (0..k8).step_by(8) {
                // SAFETY: k + 8 <= k8 <= ds = b.len() = c.len(), and i * ds + k + 8 <= m * ds = rows.len().
                unsafe {
                    let bv = _mm256_loadu_ps(b.as_ptr().add(k));
                    let cv = _mm256_loadu_ps(c.as_ptr().add(k));
                    for i in 0..m {
                        let p = rows.as_mut_ptr().add(i * ds + k);
                        let ns = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(p), vdecay), _mm256_mul_ps(vdx[i], bv));
                        _mm256_storeu_ps(p, ns);
                        acc[i] = _mm256_add_ps(acc[i], _mm256_mul_ps(ns, cv));
                    }
                }
            }
            for i in 0..m {
                let (srow, xp) = (&mut rows[i * ds..(i + 1) * ds], xs[i]);
                let dx = dt * xp;
                let mut tail = 0f32;
                for j in k8..ds {
                    srow[j] = srow[j] * decay + dx * b[j];
                    tail += srow[j] * c[j];
                }
                // ((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7))
                let q = _mm_add_ps(_mm256_castps256_ps128(acc[i]), _mm256_extractf128_ps::<1>(acc[i]));
                let pairs = _mm_add_ps(q, _mm_shuffle_ps::<0b10_11_00_01>(q, q));
                let sum = _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehl_ps(pairs, pairs)));
                ys[i] = (sum + tail) + inp.d * xp;
            }
            r += m;
        }
    }
}

/// State rows `scan_avx` steps together.
#[cfg(target_arch = "x86_64")]
const ROWS: usize = 4;

/// The scalar body (`scan_head_scalar`, and the non-x86 build).
fn scan_body(inp: &ScanInputs, hd: usize, ds: usize, state: &mut [f32], y: &mut [f32]) {
    for (t, yt) in y.chunks_exact_mut(hd).enumerate() {
        let row = &inp.rows[t * inp.stride..(t + 1) * inp.stride];
        let (x, b, c) = (&row[inp.x_at..inp.x_at + hd], &row[inp.b_at..inp.b_at + ds], &row[inp.c_at..inp.c_at + ds]);
        let (dt, decay) = (inp.dt[t], inp.decay[t]);
        for ((srow, &xp), yp) in state.chunks_exact_mut(ds).zip(x).zip(yt.iter_mut()) {
            let dx = dt * xp;
            let mut acc = [0f32; 8];
            let mut k = 0;
            for ((sv, bv), cv) in srow.chunks_exact_mut(8).zip(b.chunks_exact(8)).zip(c.chunks_exact(8)) {
                for i in 0..8 {
                    sv[i] = sv[i] * decay + dx * bv[i];
                    acc[i] += sv[i] * cv[i];
                }
                k += 8;
            }
            let mut tail = 0f32;
            for i in k..ds {
                srow[i] = srow[i] * decay + dx * b[i];
                tail += srow[i] * c[i];
            }
            let sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
            *yp = sum + inp.d * xp;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use cortiq_testkit::XorShift as Rng;

    /// Bit-equal slices, or a failure naming the first differing index and the difference.
    fn same(a: &[f32], b: &[f32], what: &str) {
        if let Some(i) = a.iter().zip(b).position(|(x, y)| x.to_bits() != y.to_bits()) {
            panic!("{what}: first difference at {i}: {} vs {} ({:e} apart)", a[i], b[i], (a[i] - b[i]).abs());
        }
    }

    /// The run-time SIMD build equals the scalar twin bit for bit (d_state with and without a
    /// tail past the eight-wide sums), and a scan cut in two equals one call.
    #[test]
    fn simd_equals_scalar_and_cuts_do_not_matter() {
        let mut rng = Rng(0x55A1_0001);
        for (hd, ds, n) in [(64, 128, 9), (8, 20, 5), (4, 7, 3), (6, 24, 4), (3, 16, 2)] {
            let stride = hd + 2 * ds + 3;
            let rows = rng.vec(n * stride, 1.0);
            let dt: Vec<f32> = (0..n).map(|_| 0.5 + 0.5 * rng.f()).collect();
            let decay: Vec<f32> = dt.iter().map(|d| (-d * 0.7f32).exp()).collect();
            let inp = ScanInputs {
                rows: &rows,
                stride,
                x_at: 1,
                b_at: hd + 2,
                c_at: hd + 2 + ds,
                d_state: ds,
                dt: &dt,
                decay: &decay,
                d: 0.3,
            };
            let s0 = rng.vec(hd * ds, 1.0);
            let (mut sa, mut sb) = (s0.clone(), s0.clone());
            let (mut ya, mut yb) = (vec![0f32; n * hd], vec![0f32; n * hd]);
            scan_head(&inp, &mut sa, &mut ya);
            scan_head_scalar(&inp, &mut sb, &mut yb);
            same(&ya, &yb, &format!("{hd}x{ds}: outputs, SIMD against scalar"));
            same(&sa, &sb, &format!("{hd}x{ds}: states, SIMD against scalar"));
            assert!(ya.iter().any(|&v| v != 0.0), "the scan wrote outputs");
            // the same tokens in two calls
            let cut = n / 2;
            let mut sc = s0.clone();
            let mut yc = vec![0f32; n * hd];
            let first = ScanInputs { dt: &dt[..cut], decay: &decay[..cut], ..inp };
            let rest = ScanInputs { rows: &rows[cut * stride..], dt: &dt[cut..], decay: &decay[cut..], ..inp };
            let (y1, y2) = yc.split_at_mut(cut * hd);
            scan_head(&first, &mut sc, y1);
            scan_head(&rest, &mut sc, y2);
            same(&yc, &ya, &format!("{hd}x{ds}: outputs, cut scan against one call"));
            same(&sc, &sa, &format!("{hd}x{ds}: states, cut scan against one call"));
        }
    }
}

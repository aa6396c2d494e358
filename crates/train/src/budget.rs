//! The O(1) mode's window split (issue 15): how much of one layer's attention output a cache of
//! the sinks and the last w positions loses, measured on the frozen model's recorded q, k, v for
//! a grid of w. `cortiq polish` writes these curves into the .cmf, and the engine
//! (`cortiq_engine::o1::O1Split`) gives each planned layer its share of a fixed total of cached
//! positions from them: a layer whose attention is local loses little to a short window and
//! lends its positions to one that reaches far back. Measured (BENCHMARKS.md, fifteenth
//! session): the same total, split by these curves, closes 15% of sink+window's excess over
//! exact on Qwen2.5-Coder-0.5B and SmolLM2-135M at 128 positions per layer, 70% on Qwen at 512;
//! but it loses 10% on SmolLM2 at 512, where the curves starve the local layers: they compare
//! layers by relative error alone, which is not yet the layers' effect on the loss.
//!
//! Not a trained op: no parameter, no backward. Arithmetic in f64 over f32 inputs, in a fixed
//! order (the same curves whatever the pool's schedule).

/// Sizes of one recorded layer and the grid of windows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CurveShape {
    pub t: usize,
    pub n_heads: usize,
    pub n_kv: usize,
    pub hd: usize,
    pub sinks: usize,
    pub scale: f64,
    /// Grid: w = step·(j + 1), j < points.
    pub step: usize,
    pub points: usize,
    /// Queries measured: positions from, from + stride, ... < t.
    pub from: usize,
    pub stride: usize,
}

/// One sequence's sums: per grid point Σ|o_w − o|² over the measured (position, head) rows,
/// and Σ|o|² (the exact outputs' energy). A layer's curve is err / norm summed over its
/// sequences.
#[derive(Debug, Clone, PartialEq)]
pub struct CurveSums {
    pub err: Vec<f64>,
    pub norm: f64,
}

impl CurveSums {
    pub fn zeros(points: usize) -> CurveSums {
        CurveSums { err: vec![0.0; points], norm: 0.0 }
    }

    pub fn add(&mut self, o: &CurveSums) {
        self.err.iter_mut().zip(&o.err).for_each(|(a, b)| *a += b);
        self.norm += o.norm;
    }

    /// The relative errors (the curve the .cmf carries).
    pub fn curve(&self) -> Vec<f32> {
        self.err.iter().map(|e| (e / self.norm.max(f64::MIN_POSITIVE)) as f32).collect()
    }
}

/// The sums of one sequence: q [T, n_heads, hd], k and v [T, n_kv, hd] (post-RoPE). For each
/// measured query, exact attention over keys 0..=t; then the window grows back from t one key
/// at a time (the sinks always in), and at each grid point the renormalized output is compared
/// with the exact one. A window reaching back to the sinks is exact (error 0).
pub fn window_sums(s: &CurveShape, q: &[f32], k: &[f32], v: &[f32]) -> CurveSums {
    let (nh, nkv, hd) = (s.n_heads, s.n_kv, s.hd);
    assert!(nkv > 0 && nh.is_multiple_of(nkv), "window curve: n_heads must be a multiple of n_kv");
    assert!(q.len() == s.t * nh * hd && k.len() == s.t * nkv * hd && v.len() == k.len(), "window curve: q/k/v shapes");
    let rows: Vec<usize> = (s.from..s.t).step_by(s.stride.max(1)).collect();
    let mut parts: Vec<CurveSums> = rows.iter().map(|_| CurveSums::zeros(s.points)).collect();
    crate::par::pool().for_rows_mut_dynamic(&mut parts, 1, 1, |i, it| {
        it[0] = row_sums(s, q, k, v, rows[i]);
    });
    // Summed in position order: the same bits however the rows were scheduled.
    let mut all = CurveSums::zeros(s.points);
    parts.iter().for_each(|p| all.add(p));
    all
}

/// The sums of every head of the query at position t.
fn row_sums(s: &CurveShape, q: &[f32], k: &[f32], v: &[f32], t: usize) -> CurveSums {
    let (nh, nkv, hd) = (s.n_heads, s.n_kv, s.hd);
    let group = nh / nkv;
    let mut out = CurveSums::zeros(s.points);
    let mut e = vec![0.0f64; t + 1];
    let (mut o, mut num) = (vec![0.0f64; hd], vec![0.0f64; hd]);
    let sinks = s.sinks.min(t + 1);
    for h in 0..nh {
        let g = h / group;
        let qr = &q[(t * nh + h) * hd..][..hd];
        let key = |j: usize| &k[(j * nkv + g) * hd..][..hd];
        let val = |j: usize| &v[(j * nkv + g) * hd..][..hd];
        let mut mx = f64::NEG_INFINITY;
        for (j, x) in e.iter_mut().enumerate() {
            *x = qr.iter().zip(key(j)).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * s.scale;
            mx = mx.max(*x);
        }
        // o = Σ e_j v_j / Σ e_j over every key.
        o.fill(0.0);
        let mut den = 0.0;
        for (j, x) in e.iter_mut().enumerate() {
            *x = (*x - mx).exp();
            den += *x;
            o.iter_mut().zip(val(j)).for_each(|(a, &b)| *a += *x * b as f64);
        }
        o.iter_mut().for_each(|a| *a /= den);
        out.norm += o.iter().map(|a| a * a).sum::<f64>();
        // The sinks, then the window back from t: after adding key j the window is t + 1 − j.
        num.fill(0.0);
        let mut wden = 0.0;
        for (j, &ej) in e.iter().enumerate().take(sinks) {
            wden += ej;
            num.iter_mut().zip(val(j)).for_each(|(a, &b)| *a += ej * b as f64);
        }
        let mut j = t + 1;
        for (p, err) in out.err.iter_mut().enumerate() {
            let w = s.step * (p + 1);
            let lo = (t + 1).saturating_sub(w).max(sinks);
            while j > lo {
                j -= 1;
                wden += e[j];
                num.iter_mut().zip(val(j)).for_each(|(a, &b)| *a += e[j] * b as f64);
            }
            if lo > sinks {
                *err += num.iter().zip(&o).map(|(a, b)| (a / wden - b).powi(2)).sum::<f64>();
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::Rng;

    /// Each grid point against a direct sum over the window's keys.
    #[test]
    fn sums_equal_direct_windows() {
        let s = CurveShape { t: 40, n_heads: 4, n_kv: 2, hd: 5, sinks: 2, scale: 0.5, step: 3, points: 16, from: 7, stride: 3 };
        let mut rng = Rng(11);
        let f = |x: Vec<f64>| x.into_iter().map(|y| y as f32).collect::<Vec<f32>>();
        let (q, k, v) =
            (f(rng.vec(s.t * s.n_heads * s.hd, 1.0)), f(rng.vec(s.t * s.n_kv * s.hd, 1.0)), f(rng.vec(s.t * s.n_kv * s.hd, 1.0)));
        let got = window_sums(&s, &q, &k, &v);
        let mut want = CurveSums::zeros(s.points);
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum::<f64>();
        for t in (s.from..s.t).step_by(s.stride) {
            for h in 0..s.n_heads {
                let g = h / 2;
                let qr = &q[(t * 4 + h) * 5..][..5];
                let attend = |keep: &dyn Fn(usize) -> bool| {
                    let js: Vec<usize> = (0..=t).filter(|&j| keep(j)).collect();
                    let sc: Vec<f64> = js.iter().map(|&j| dot(qr, &k[(j * 2 + g) * 5..][..5]) * s.scale).collect();
                    let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let den: f64 = sc.iter().map(|x| (x - mx).exp()).sum();
                    (0..5)
                        .map(|d| {
                            js.iter().zip(&sc).map(|(&j, x)| (x - mx).exp() * v[(j * 2 + g) * 5 + d] as f64).sum::<f64>() / den
                        })
                        .collect::<Vec<f64>>()
                };
                let o = attend(&|_| true);
                want.norm += o.iter().map(|x| x * x).sum::<f64>();
                for p in 0..s.points {
                    let w = s.step * (p + 1);
                    let ow = attend(&|j| j < s.sinks || j + w > t);
                    want.err[p] += ow.iter().zip(&o).map(|(a, b)| (a - b).powi(2)).sum::<f64>();
                }
            }
        }
        assert!((got.norm - want.norm).abs() <= 1e-12 * want.norm, "norm {} vs {}", got.norm, want.norm);
        for (p, (a, b)) in got.err.iter().zip(&want.err).enumerate() {
            assert!((a - b).abs() <= 1e-10 * (1.0 + b), "point {p}: {a} vs {b}");
        }
        // Past every key the window is exact; the curve falls to 0.
        assert_eq!(*got.err.last().unwrap(), 0.0);
        assert!(got.err[0] > 0.0);
    }
}

//! The window option's split (`cortiq convert --linear-core vmf_phase --window W --window-split
//! on`; off by default, see the flag): the converted layers share a budget of exact positions, n·W for n
//! layers, and each layer gets the window it needs within it. Per layer and candidate window w
//! (W/4, W/2, W, 3W/2, 2W; each leaving at least half of a calibration window's rows past it),
//! the error of sink+window alone — the layer's attention output over its sinks and last w keys
//! against the teacher's over all keys, summed over every calibration row (rows that the
//! window still covers count zero) and divided by the layer's Σ‖y‖² — then the windows that
//! minimise the summed relative errors with Σ w ≤ n·W (exact, by dynamic programming over the
//! budget). The split is kept only where it beats every layer at W.
//!
//! Sink+window alone (the slot dead) is the fold's own fallback and its worst case per head
//! (`linearize_window`): a layer whose attention reaches far back loses the most there, which
//! is where the core has the most to stand for. Hand-written: a few nested loops over the
//! recorded calibration windows.

use cortiq_engine::par::pool;
use std::sync::Mutex;

use crate::linearize_window::WinRec;

/// The candidate windows for a mean window `w`: W/4, W/2, W, 3W/2, 2W (at least 1), each
/// leaving half of the `ctx`-token calibration windows' rows past sinks + window. Sorted,
/// without repeats; `w` itself is always among them.
pub(crate) fn candidates(w: usize, sinks: usize, ctx: usize) -> Vec<usize> {
    let mut v: Vec<usize> =
        [w / 4, w / 2, w, 3 * w / 2, 2 * w].into_iter().map(|x| x.max(1)).filter(|&x| x == w || 2 * (sinks + x) <= ctx).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The geometry `sink_window_errors` reads the records with.
#[derive(Clone, Copy)]
pub(crate) struct Heads {
    pub n_heads: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub sinks: usize,
    /// The attention's score scale.
    pub scale: f32,
}

/// Σ over every row of `recs` (each `t` positions) of ‖y − o_near(w)‖² for each window of
/// `grid` (rows t < sinks + w count zero: the window still holds every key), and Σ‖y‖².
pub(crate) fn sink_window_errors(hs: Heads, recs: &[WinRec], t: usize, grid: &[usize]) -> (Vec<f64>, f64) {
    let (nh, nk, hd, s) = (hs.n_heads, hs.n_kv, hs.head_dim, hs.sinks);
    let g = nh / nk;
    let wmax = grid.iter().copied().max().unwrap_or(0);
    let tasks: Vec<(usize, usize)> = (0..recs.len()).flat_map(|r| (0..nh).map(move |h| (r, h))).collect();
    let total = Mutex::new((vec![0f64; grid.len()], 0f64));
    pool().run(tasks.len(), |i| {
        let (r, h) = tasks[i];
        let rec = &recs[r];
        let off = (h / g) * hd;
        let (mut err, mut yy) = (vec![0f64; grid.len()], 0f64);
        let mut sc = vec![0f32; t];
        let mut o = vec![0f64; hd];
        for tt in 0..t {
            let y = &rec.y[(tt * nh + h) * hd..][..hd];
            yy += y.iter().map(|&v| v as f64 * v as f64).sum::<f64>();
            if tt < s + grid[0] {
                continue; // every window still holds every key
            }
            let q = &rec.q[(tt * nh + h) * hd..][..hd];
            // Scores of the keys some window keeps: the sinks and the last wmax.
            let near0 = (tt + 1).saturating_sub(wmax).max(s);
            for j in (0..s.min(tt + 1)).chain(near0..=tt) {
                let k = &rec.k[j * nk * hd + off..][..hd];
                sc[j] = q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * hs.scale;
            }
            for (gi, &w) in grid.iter().enumerate() {
                if tt < s + w {
                    continue;
                }
                let keys = (0..s).chain(tt + 1 - w..=tt);
                let m = keys.clone().map(|j| sc[j]).fold(f32::NEG_INFINITY, f32::max);
                o.fill(0.0);
                let mut z = 0f64;
                for j in keys {
                    let e = ((sc[j] - m) as f64).exp();
                    z += e;
                    o.iter_mut().zip(&rec.v[j * nk * hd + off..][..hd]).for_each(|(a, &b)| *a += e * b as f64);
                }
                err[gi] += o.iter().zip(y).map(|(&a, &b)| (a / z - b as f64).powi(2)).sum::<f64>();
            }
        }
        let mut tot = total.lock().expect("no task panics holding the lock");
        tot.0.iter_mut().zip(&err).for_each(|(a, b)| *a += b);
        tot.1 += yy;
    });
    total.into_inner().expect("no task panicked holding the lock")
}

/// The windows (one per layer, from `grid`) that minimise Σ `rel[layer][window]` with Σ
/// windows ≤ `budget`: a dynamic program over the positions spent. None when no choice fits.
pub(crate) fn allocate(rel: &[Vec<f64>], grid: &[usize], budget: usize) -> Option<Vec<usize>> {
    // best[b]: the least error of the layers so far spending exactly b positions; the choices
    // per layer to trace back.
    let mut best: Vec<f64> = vec![f64::INFINITY; budget + 1];
    best[0] = 0.0;
    let mut picks: Vec<Vec<u8>> = Vec::with_capacity(rel.len());
    for errs in rel {
        let mut next = vec![f64::INFINITY; budget + 1];
        let mut pick = vec![u8::MAX; budget + 1];
        for (b, &e0) in best.iter().enumerate().filter(|(_, e)| e.is_finite()) {
            for (gi, &w) in grid.iter().enumerate() {
                let nb = b + w;
                if nb <= budget && e0 + errs[gi] < next[nb] {
                    next[nb] = e0 + errs[gi];
                    pick[nb] = gi as u8;
                }
            }
        }
        best = next;
        picks.push(pick);
    }
    let (mut b, _) = best.iter().enumerate().filter(|(_, e)| e.is_finite()).min_by(|x, y| x.1.total_cmp(y.1))?;
    let mut out = vec![0; rel.len()];
    for (l, pick) in picks.iter().enumerate().rev() {
        let w = grid[pick[b] as usize];
        out[l] = w;
        b -= w;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_keep_half_the_rows_past_the_window() {
        assert_eq!(candidates(252, 4, 1024), vec![63, 126, 252, 378, 504]);
        // 2W = 504 would leave 4 + 504 > 512 / 2: dropped; W itself stays.
        assert_eq!(candidates(252, 4, 512), vec![63, 126, 252]);
        assert_eq!(candidates(2, 0, 32), vec![1, 2, 3, 4]);
    }

    #[test]
    fn allocation_gives_the_budget_where_it_buys_most() {
        let grid = [1, 2, 4];
        // Layer 0 loses a lot at short windows, layer 1 nothing, layer 2 a little.
        let rel = vec![vec![0.9, 0.5, 0.1], vec![0.0, 0.0, 0.0], vec![0.2, 0.1, 0.05]];
        assert_eq!(allocate(&rel, &grid, 6), Some(vec![4, 1, 1]));
        assert_eq!(allocate(&rel, &grid, 7), Some(vec![4, 1, 2]));
        // Under the smallest windows' sum nothing fits.
        assert_eq!(allocate(&rel, &grid, 2), None);
        // A budget for all of the largest windows: each layer its best.
        let picked = allocate(&rel, &grid, 12).expect("fits");
        let total: f64 = picked.iter().zip(&rel).map(|(w, e)| e[grid.iter().position(|g| g == w).unwrap()]).sum();
        assert!((total - 0.15).abs() < 1e-12, "{picked:?}");
    }

    /// A window that holds every key loses nothing; a shorter one loses more the shorter it is
    /// on attention that spreads over the whole past.
    #[test]
    fn errors_fall_as_the_window_grows() {
        let (t, nh, nk, hd) = (24, 2, 1, 4);
        let mut x = 1u64;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 1000) as f32 / 500.0 - 1.0
        };
        let q: Vec<f32> = (0..t * nh * hd).map(|_| 0.3 * rnd()).collect();
        let k: Vec<f32> = (0..t * nk * hd).map(|_| rnd()).collect();
        let v: Vec<f32> = (0..t * nk * hd).map(|_| rnd()).collect();
        // The teacher's output: softmax over every key.
        let mut y = vec![0f32; t * nh * hd];
        for tt in 0..t {
            for h in 0..nh {
                let qh = &q[(tt * nh + h) * hd..][..hd];
                let sc: Vec<f32> = (0..=tt).map(|j| qh.iter().zip(&k[j * hd..][..hd]).map(|(a, b)| a * b).sum::<f32>()).collect();
                let m = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let z: f32 = sc.iter().map(|s| (s - m).exp()).sum();
                for (j, s) in sc.iter().enumerate() {
                    for e in 0..hd {
                        y[(tt * nh + h) * hd + e] += (s - m).exp() / z * v[j * hd + e];
                    }
                }
            }
        }
        let rec = WinRec { x: Vec::new(), q, k, v, y };
        let hs = Heads { n_heads: nh, n_kv: nk, head_dim: hd, sinks: 1, scale: 1.0 };
        let (err, yy) = sink_window_errors(hs, std::slice::from_ref(&rec), t, &[2, 4, 8, 23]);
        assert!(yy > 0.0);
        assert!(err[3] < 1e-9 * yy, "a window of every key: {err:?}");
        assert!(err[0] > err[1] && err[1] > err[2] && err[2] > err[3], "{err:?}");
    }
}

//! The window option's split (`cortiq convert --linear-core vmf_phase --window W --sinks S
//! --window-split on`; off by default, see the flag): the converted layers share a budget of
//! exact positions, n·(S + W) for n layers, and each layer gets the sinks and window it needs
//! within it. Per layer and candidate span — sinks s of S, 4S, 16S and window w of W/4, W/2, W,
//! 3W/2, 2W, each span leaving at least half of a calibration window's rows past it — the error
//! of sink+window alone — the layer's attention output over its first s and last w keys
//! against the teacher's over all keys, summed over every calibration row (rows that the span
//! still covers count zero) and divided by the layer's Σ‖y‖² — then the spans that minimise
//! the summed relative errors with Σ (s + w) ≤ n·(S + W) (exact, by dynamic programming over
//! the budget). The split is kept only where it beats every layer at (S, W). Longer sinks buy
//! what a layer reads at the start of every prompt (a chat template's system text, a file's
//! header); longer windows what it reads just behind the query.
//!
//! Sink+window alone (the slot dead) is the fold's own fallback and its worst case per head
//! (`linearize_window`): a layer whose attention reaches far back loses the most there, which
//! is where the core has the most to stand for. Hand-written: a few nested loops over the
//! recorded calibration windows; per row the sinks' and the window's softmax sums are
//! accumulated outward once (under one max) and every span is read off them.

use cortiq_engine::par::pool;
use std::sync::Mutex;

use crate::linearize_window::WinRec;

/// A layer's exact positions: its first `sinks` and its last `window`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Span {
    pub sinks: usize,
    pub window: usize,
}

impl Span {
    /// The positions it keeps: what it spends of the budget.
    pub fn cost(self) -> usize {
        self.sinks + self.window
    }
}

/// The candidate spans around (`sinks`, `w`): sinks S, 4S, 16S (S alone when 0) by windows W/4,
/// W/2, W, 3W/2, 2W (at least 1), each leaving half of the `ctx`-token calibration windows'
/// rows past it. Sorted, without repeats; (S, W) itself is always among them.
pub(crate) fn candidates(w: usize, sinks: usize, ctx: usize) -> Vec<Span> {
    let base = Span { sinks, window: w };
    let mut v: Vec<Span> = [sinks, 4 * sinks, 16 * sinks]
        .into_iter()
        .flat_map(|s| [w / 4, w / 2, w, 3 * w / 2, 2 * w].into_iter().map(move |x| Span { sinks: s, window: x.max(1) }))
        .filter(|&c| c == base || 2 * c.cost() <= ctx)
        .collect();
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
    /// The attention's score scale.
    pub scale: f32,
}

/// Σ over every row of `recs` (each `t` positions) of ‖y − o_near(span)‖² for each span of
/// `grid` (rows t < sinks + window count zero: the span still holds every key), and Σ‖y‖².
pub(crate) fn sink_window_errors(hs: Heads, recs: &[WinRec<'_>], t: usize, grid: &[Span]) -> (Vec<f64>, f64) {
    let (nh, nk, hd) = (hs.n_heads, hs.n_kv, hs.head_dim);
    let g = nh / nk;
    let smax = grid.iter().map(|c| c.sinks).max().unwrap_or(0);
    let wmax = grid.iter().map(|c| c.window).max().unwrap_or(0);
    let first = grid.iter().map(|c| c.cost()).min().unwrap_or(0);
    let tasks: Vec<(usize, usize)> = (0..recs.len()).flat_map(|r| (0..nh).map(move |h| (r, h))).collect();
    let total = Mutex::new((vec![0f64; grid.len()], 0f64));
    pool().run(tasks.len(), |i| {
        let (r, h) = tasks[i];
        let rec = &recs[r];
        let off = (h / g) * hd;
        let (mut err, mut yy) = (vec![0f64; grid.len()], 0f64);
        let mut sc = vec![0f32; t];
        // Running sums of the first s keys (sink_sums[s]) and of the last w (win_sums[w]):
        // Σ e and Σ e·v under the row's one max, z first then hd values.
        let (mut sink_sums, mut win_sums) = (vec![0f64; (smax + 1) * (hd + 1)], vec![0f64; (wmax + 1) * (hd + 1)]);
        for tt in 0..t {
            let y = &rec.y[(tt * nh + h) * hd..][..hd];
            yy += y.iter().map(|&v| v as f64 * v as f64).sum::<f64>();
            if tt < first {
                continue; // every span still holds every key
            }
            let q = &rec.q[(tt * nh + h) * hd..][..hd];
            // Scores of the keys some span keeps: the first smax and the last wmax.
            let (ns, nw) = (smax.min(tt + 1), wmax.min(tt + 1));
            let near0 = tt + 1 - nw;
            for j in (0..ns).chain(near0.max(ns)..=tt) {
                let k = &rec.k[j * nk * hd + off..][..hd];
                sc[j] = q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * hs.scale;
            }
            let m = (0..ns).chain(near0..=tt).map(|j| sc[j]).fold(f32::NEG_INFINITY, f32::max);
            let accumulate = |sums: &mut [f64], keys: &mut dyn Iterator<Item = usize>| {
                sums[..hd + 1].fill(0.0);
                for (n, j) in keys.enumerate() {
                    let (prev, next) = sums[n * (hd + 1)..(n + 2) * (hd + 1)].split_at_mut(hd + 1);
                    let e = ((sc[j] - m) as f64).exp();
                    next[0] = prev[0] + e;
                    let v = &rec.v[j * nk * hd + off..][..hd];
                    next[1..].iter_mut().zip(&prev[1..]).zip(v).for_each(|((a, &b), &x)| *a = b + e * x as f64);
                }
            };
            accumulate(&mut sink_sums, &mut (0..ns));
            accumulate(&mut win_sums, &mut (near0..=tt).rev());
            for (gi, c) in grid.iter().enumerate() {
                if tt < c.cost() {
                    continue;
                }
                let (a, b) = (&sink_sums[c.sinks * (hd + 1)..][..hd + 1], &win_sums[c.window * (hd + 1)..][..hd + 1]);
                let z = a[0] + b[0];
                err[gi] += (0..hd).map(|e| ((a[e + 1] + b[e + 1]) / z - y[e] as f64).powi(2)).sum::<f64>();
            }
        }
        let mut tot = total.lock().expect("no task panics holding the lock");
        tot.0.iter_mut().zip(&err).for_each(|(a, b)| *a += b);
        tot.1 += yy;
    });
    total.into_inner().expect("no task panicked holding the lock")
}

/// The candidates (an index into `costs` per layer) that minimise Σ `rel[layer][candidate]`
/// with Σ `costs[candidate]` ≤ `budget`: a dynamic program over the positions spent. None when
/// no choice fits.
pub(crate) fn allocate(rel: &[Vec<f64>], costs: &[usize], budget: usize) -> Option<Vec<usize>> {
    // best[b]: the least error of the layers so far spending exactly b positions; the choices
    // per layer to trace back.
    let mut best: Vec<f64> = vec![f64::INFINITY; budget + 1];
    best[0] = 0.0;
    let mut picks: Vec<Vec<u8>> = Vec::with_capacity(rel.len());
    for errs in rel {
        let mut next = vec![f64::INFINITY; budget + 1];
        let mut pick = vec![u8::MAX; budget + 1];
        for (b, &e0) in best.iter().enumerate().filter(|(_, e)| e.is_finite()) {
            for (gi, &w) in costs.iter().enumerate() {
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
        let gi = pick[b] as usize;
        out[l] = gi;
        b -= costs[gi];
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spans(v: &[(usize, usize)]) -> Vec<Span> {
        v.iter().map(|&(sinks, window)| Span { sinks, window }).collect()
    }

    #[test]
    fn candidates_keep_half_the_rows_past_the_span() {
        let c = candidates(252, 4, 1024);
        assert_eq!(
            c,
            spans(&[
                (4, 63),
                (4, 126),
                (4, 252),
                (4, 378),
                (4, 504),
                (16, 63),
                (16, 126),
                (16, 252),
                (16, 378),
                (64, 63),
                (64, 126),
                (64, 252),
                (64, 378)
            ])
        );
        // 2W = 504 would leave 4 + 504 > 512 / 2: dropped; (S, W) itself stays.
        assert_eq!(candidates(252, 4, 512), spans(&[(4, 63), (4, 126), (4, 252), (16, 63), (16, 126), (64, 63), (64, 126)]));
        assert_eq!(candidates(2, 0, 32), spans(&[(0, 1), (0, 2), (0, 3), (0, 4)]));
    }

    #[test]
    fn allocation_gives_the_budget_where_it_buys_most() {
        let costs = [1, 2, 4];
        // Layer 0 loses a lot at short windows, layer 1 nothing, layer 2 a little.
        let rel = vec![vec![0.9, 0.5, 0.1], vec![0.0, 0.0, 0.0], vec![0.2, 0.1, 0.05]];
        assert_eq!(allocate(&rel, &costs, 6), Some(vec![2, 0, 0]));
        assert_eq!(allocate(&rel, &costs, 7), Some(vec![2, 0, 1]));
        // Under the smallest windows' sum nothing fits.
        assert_eq!(allocate(&rel, &costs, 2), None);
        // A budget for all of the largest windows: each layer its best.
        let picked = allocate(&rel, &costs, 12).expect("fits");
        let total: f64 = picked.iter().zip(&rel).map(|(&gi, e)| e[gi]).sum();
        assert!((total - 0.15).abs() < 1e-12, "{picked:?}");
    }

    /// Random q, k, v of one kv head shared by two query heads; keys 0..4 share a direction the
    /// queries lean on (a sink the attention reads from every row). y: the softmax over every key.
    /// (q, k, v, y)
    fn record(t: usize, hd: usize) -> [Vec<f32>; 4] {
        let (nh, nk) = (2, 1);
        let mut x = 1u64;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 1000) as f32 / 500.0 - 1.0
        };
        let mut q: Vec<f32> = (0..t * nh * hd).map(|_| 0.3 * rnd()).collect();
        let mut k: Vec<f32> = (0..t * nk * hd).map(|_| rnd()).collect();
        let v: Vec<f32> = (0..t * nk * hd).map(|_| rnd()).collect();
        for j in 0..4 {
            k[j * hd] += 3.0;
        }
        for tt in 0..t * nh {
            q[tt * hd] += 0.6;
        }
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
        [q, k, v, y]
    }

    /// The span's error by its definition: softmax over its keys, per row, in f64.
    fn direct(rec: &WinRec<'_>, t: usize, hd: usize, c: Span) -> f64 {
        let mut err = 0f64;
        for tt in c.cost()..t {
            for h in 0..2 {
                let qh = &rec.q[(tt * 2 + h) * hd..][..hd];
                let keys: Vec<usize> = (0..c.sinks).chain(tt + 1 - c.window..=tt).collect();
                let sc: Vec<f64> =
                    keys.iter().map(|&j| qh.iter().zip(&rec.k[j * hd..][..hd]).map(|(a, b)| (a * b) as f64).sum()).collect();
                let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = sc.iter().map(|s| (s - m).exp()).sum();
                for e in 0..hd {
                    let o: f64 = keys.iter().zip(&sc).map(|(&j, s)| (s - m).exp() / z * rec.v[j * hd + e] as f64).sum();
                    err += (o - rec.y[(tt * 2 + h) * hd + e] as f64).powi(2);
                }
            }
        }
        err
    }

    /// The running sums equal the definition for every span; a span that holds every key
    /// loses nothing; a longer window loses less on attention that spreads over the whole past,
    /// and more sinks less where the queries lean on the first keys.
    #[test]
    fn errors_follow_the_definition_and_fall_as_the_span_grows() {
        let (t, hd) = (24, 4);
        let [q, k, v, y] = record(t, hd);
        let rec = WinRec { x: &[], q: &q, k: &k, v: &v, y: &y };
        let hs = Heads { n_heads: 2, n_kv: 1, head_dim: hd, scale: 1.0 };
        // (4, 5) and (1, 8) cost the same: the same rows count.
        let grid = spans(&[(1, 2), (1, 4), (1, 8), (1, 23), (4, 5), (0, 24)]);
        let (err, yy) = sink_window_errors(hs, std::slice::from_ref(&rec), t, &grid);
        assert!(yy > 0.0);
        for (c, &e) in grid.iter().zip(&err) {
            let want = direct(&rec, t, hd, *c);
            // (the scores and their shift by the max are f32 there, as the engine's: ~1e-7 each)
            assert!((e - want).abs() <= 1e-6 * (1.0 + want), "{c:?}: {e} vs {want}");
        }
        assert!(err[3] < 1e-9 * yy && err[5] < 1e-9 * yy, "spans of every key: {err:?}");
        assert!(err[0] > err[1] && err[1] > err[2] && err[2] > err[3], "{err:?}");
        assert!(err[4] < 0.5 * err[2], "sinks the queries lean on: {err:?}");
    }
}

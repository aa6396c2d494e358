//! Layer-shared score eviction for the O(1) mode (issue 15; TOVA, arXiv 2401.06104): a sealed
//! attention layer keeps a fixed set of exact keys, the same set for every head of the layer.
//! Each step attends exactly over the kept keys and the new one; then, when the set is over its
//! capacity, the key with the lowest score leaves (the new key too may be the one). A key's
//! score is its attention from the current query summed over every query head of the layer,
//! plus `decay` times its previous score (decay 0: TOVA's rule, the current query alone). The
//! first `sinks` positions are pinned, and keys fewer than `recent` positions old are not
//! candidates. Why the set is shared by the layer's heads: in the published ablation per-head
//! choices lose to plain sink+window, the layer consensus beats it at every budget.
//!
//! Bytes: `sinks + window` rows of keys and values, the rows of a sink+window layer
//! (`Far::Drop`) with the same settings, plus a position and a score per slot (12 bytes, under
//! 1% of a row on the models here; counted). Keys are stored rotated at their own positions,
//! so a slot's order never matters to the attention.
//!
//! Written here rather than taken from a crate: it is a step of the model's forward.

use super::nystrom::dot32;

/// The score rule (CLI: `--kv-evict score`, `--kv-evict-decay`, `--kv-evict-recent`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoreRule {
    /// Weight of a key's previous score in its new one, 0 ≤ decay < 1.
    pub decay: f32,
    /// Keys this many positions old or younger are not evicted.
    pub recent: usize,
    /// At the seal, the last `obs` prompt queries vote (SnapKV, arXiv 2404.14469): the kept
    /// prompt keys are the sinks, the last `recent` positions and the highest-voted others.
    /// 0: the sinks and the last `window` positions, as sink+window keeps them.
    pub obs: usize,
    /// Only the planned layers the model lists evict by score (`Model::o1_score_layers`,
    /// chosen per layer by `cortiq polish --far-rule auto`); the others keep sink+window. A
    /// model that lists none: every planned layer. false: every planned layer.
    pub model_layers: bool,
}

impl Default for ScoreRule {
    /// The best of a sweep on SmolLM2-135M, lcet10, ctx 2048, 4 sinks + 124 (2026-12-02, with
    /// commit ddafaed; the eviction's figures are in BENCHMARKS.md's issue 15 sections).
    fn default() -> Self {
        ScoreRule { decay: 0.7, recent: 16, obs: 0, model_layers: false }
    }
}

thread_local! {
    /// A step's per-head scores [n + 1] and output row [hd], f64, per pool thread.
    static SCRATCH: std::cell::RefCell<(Vec<f64>, Vec<f64>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// The kept keys of one layer: rows [cap, n_kv, hd] of which the first `n` are filled, the
/// first min(sinks, n) of them the sink positions; per slot its position and score.
#[derive(Debug, Clone)]
pub struct Slots {
    k: Vec<f32>,
    v: Vec<f32>,
    pos: Vec<u32>,
    score: Vec<f64>,
    n: usize,
    cap: usize,
    sinks: usize,
    row: usize,
    rule: ScoreRule,
    /// The next step's position.
    t: usize,
}

impl Slots {
    /// The set at the seal of a prompt k, v [tp, row]: the sinks and the most recent
    /// `window` positions (what sink+window keeps; scores start at 0 and the rule takes over
    /// from the first step on).
    pub fn seal(k: &[f32], v: &[f32], row: usize, sinks: usize, window: usize, rule: ScoreRule) -> Slots {
        let tp = k.len() / row;
        let cap = sinks + window;
        let mut s = Slots {
            k: vec![0.0; cap * row],
            v: vec![0.0; cap * row],
            pos: vec![0; cap],
            score: vec![0.0; cap],
            n: 0,
            cap,
            sinks,
            row,
            rule,
            t: tp,
        };
        for p in (0..sinks.min(tp)).chain(sinks.max(tp.saturating_sub(window))..tp) {
            s.put(s.n, p, &k[p * row..][..row], &v[p * row..][..row]);
            s.n += 1;
        }
        s
    }

    /// The set at the seal chosen by the votes of the prompt's last queries (`ScoreRule::obs`;
    /// `recent` their rows [obs', n_heads, hd] for positions tp − obs'..tp): each key's vote is
    /// its attention from every such query (causal) summed over the heads; its starting score
    /// is the mean vote per query over (1 − decay), where per-step scores settle.
    #[allow(clippy::too_many_arguments)]
    pub fn seal_voted(
        k: &[f32],
        v: &[f32],
        recent: &RecentQueries,
        n_heads: usize,
        n_kv: usize,
        sinks: usize,
        window: usize,
        rule: ScoreRule,
        scale: f64,
    ) -> Slots {
        let row = n_kv * (recent.row / n_heads);
        let tp = k.len() / row;
        let cap = sinks + window;
        if tp <= cap || recent.q.is_empty() {
            return Slots::seal(k, v, row, sinks, window, rule);
        }
        let hd = row / n_kv;
        let group = n_heads / n_kv;
        let nq = recent.q.len() / recent.row;
        let first_q = tp - nq;
        // Votes per key, summed over queries and heads in a fixed order.
        let mut votes = vec![0.0f64; tp];
        let mut p = vec![0.0f64; tp];
        for i in 0..nq {
            let pos = first_q + i;
            for h in 0..n_heads {
                let (g, qh) = (h / group, &recent.q[i * recent.row + h * hd..][..hd]);
                let mut mx = f64::NEG_INFINITY;
                for (j, s) in p[..=pos].iter_mut().enumerate() {
                    *s = dot32(qh, &k[j * row + g * hd..][..hd]) * scale;
                    mx = mx.max(*s);
                }
                let mut den = 0.0;
                for s in p[..=pos].iter_mut() {
                    *s = (*s - mx).exp();
                    den += *s;
                }
                votes[..=pos].iter_mut().zip(&p[..=pos]).for_each(|(a, &e)| *a += e / den);
            }
        }
        let keep_recent = rule.recent.min(window);
        let mut others: Vec<usize> = (sinks..tp - keep_recent).collect();
        // Highest vote first; ties to the later position (the more recent), then sorted back.
        others.sort_by(|&a, &b| votes[b].total_cmp(&votes[a]).then(b.cmp(&a)));
        others.truncate(window - keep_recent);
        others.sort_unstable();
        let mut s = Slots::seal(&k[..0], &v[..0], row, sinks, window, rule);
        s.t = tp;
        let settle = 1.0 / (nq as f64 * (1.0 - rule.decay as f64));
        for p in (0..sinks).chain(others).chain(tp - keep_recent..tp) {
            s.put(s.n, p, &k[p * row..][..row], &v[p * row..][..row]);
            s.score[s.n] = votes[p] * settle;
            s.n += 1;
        }
        s
    }

    pub fn bytes(&self) -> usize {
        (self.k.len() + self.v.len()) * 4 + self.pos.len() * 4 + self.score.len() * 8
    }

    /// Positions of the kept keys, slot order.
    pub fn positions(&self) -> &[u32] {
        &self.pos[..self.n]
    }

    /// One step: q [n_heads, hd] attends over the kept keys and the new k, v [n_kv, hd]
    /// (position `t`); o [n_heads, hd]. Then the set takes the new key, evicting the
    /// lowest-scored candidate when full. Per kv group in parallel; the groups' score sums are
    /// added in group order (the same keys leave however the pool schedules).
    /// With a learned far field (`far`) each head's softmax takes its far mass under the same
    /// normalizer (the scores are the kept keys' shares of it), and the key that leaves is
    /// absorbed into it.
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &mut self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        o: &mut [f32],
        n_heads: usize,
        n_kv: usize,
        scale: f64,
        mut far: Option<&mut super::farfield::FarState>,
    ) {
        let (row, n) = (self.row, self.n);
        let hd = row / n_kv;
        let group = n_heads / n_kv;
        let nc = n + 1; // candidates: the kept keys, then the new one
        if let Some(f) = far.as_deref_mut() {
            f.advance(self.t);
        }
        let mut sums = vec![0.0f64; n_kv * nc];
        let mut items: Vec<(&mut [f32], &mut [f64])> = o.chunks_mut(group * hd).zip(sums.chunks_mut(nc)).collect();
        let (ks, vs) = (&self.k, &self.v);
        let far_ref = far.as_deref();
        crate::par::pool().for_rows_mut_dynamic(&mut items, 1, 1, |g, it| {
            let (og, sum) = &mut it[0];
            SCRATCH.with(|sc| {
                let (p, out) = &mut *sc.borrow_mut();
                p.resize(nc, 0.0);
                out.resize(hd, 0.0);
                let key = |j: usize| if j < n { &ks[j * row + g * hd..][..hd] } else { &k[g * hd..][..hd] };
                let val = |j: usize| if j < n { &vs[j * row + g * hd..][..hd] } else { &v[g * hd..][..hd] };
                for hh in 0..group {
                    let h = g * group + hh;
                    head_attend(&q[h * hd..][..hd], nc, key, val, scale, far_ref.map(|f| (f, h, g)), p, out);
                    og[hh * hd..][..hd].iter_mut().zip(out.iter()).for_each(|(y, &x)| *y = x as f32);
                    sum.iter_mut().zip(p.iter()).for_each(|(a, &pj)| *a += pj);
                }
            });
        });
        drop(items);
        let layer = |j: usize| (0..n_kv).map(|g| sums[g * nc + j]).sum::<f64>();
        let decay = self.rule.decay as f64;
        for j in 0..n {
            self.score[j] = decay * self.score[j] + layer(j);
        }
        let (t, new_score) = (self.t, layer(n));
        self.t += 1;
        if n < self.cap {
            self.put(n, t, k, v);
            self.score[n] = new_score;
            self.n += 1;
            return;
        }
        let row = self.row;
        let recent = self.rule.recent;
        let candidate = |j: usize| if j == n { recent == 0 } else { j >= self.sinks && self.pos[j] as usize + recent <= t };
        let score = |j: usize| if j == n { new_score } else { self.score[j] };
        // The first lowest (slot order) leaves; with no candidate the new key is dropped.
        let victim = (0..nc).filter(|&j| candidate(j)).min_by(|&a, &b| score(a).total_cmp(&score(b))).unwrap_or(n);
        if victim < n {
            if let Some(f) = far.as_deref_mut() {
                f.absorb(&self.k[victim * row..][..row], &self.v[victim * row..][..row], self.pos[victim] as usize);
            }
            self.put(victim, t, k, v);
            self.score[victim] = new_score;
        } else if let Some(f) = far {
            f.absorb(k, v, t);
        }
    }

    fn put(&mut self, slot: usize, pos: usize, k: &[f32], v: &[f32]) {
        let row = self.row;
        self.k[slot * row..][..row].copy_from_slice(k);
        self.v[slot * row..][..row].copy_from_slice(v);
        self.pos[slot] = pos as u32;
    }
}

/// The last `obs` prompt queries of a planned layer ([obs, n_heads, hd], post-RoPE), kept while
/// the prompt streams through for `Slots::seal_voted`.
#[derive(Debug, Clone)]
pub struct RecentQueries {
    tp: usize,
    obs: usize,
    /// n_heads · head_dim.
    row: usize,
    q: Vec<f32>,
}

impl RecentQueries {
    pub fn new(tp: usize, obs: usize, n_heads: usize, head_dim: usize) -> RecentQueries {
        RecentQueries { tp, obs: obs.min(tp), row: n_heads * head_dim, q: Vec::new() }
    }

    /// Queries of positions pos0.. (q: [n, n_heads, head_dim]); only those of the last `obs`
    /// prompt positions are kept.
    pub fn add(&mut self, pos0: usize, q: &[f32]) {
        let first = self.tp - self.obs;
        for (r, qr) in q.chunks_exact(self.row).enumerate() {
            let p = pos0 + r;
            if p >= first && p < self.tp {
                debug_assert_eq!(self.q.len(), (p - first) * self.row, "queries arrive in order");
                self.q.extend_from_slice(qr);
            }
        }
    }

    pub fn bytes(&self) -> usize {
        self.q.capacity() * 4
    }
}

/// One query head's exact attention over `nc` keys: p [nc] gets the probabilities, out [hd]
/// the output, both f64. `far`: the learned far field and the head's (query head, kv head),
/// its mass under the same normalizer.
#[allow(clippy::too_many_arguments)]
fn head_attend<'a>(
    q: &[f32],
    nc: usize,
    key: impl Fn(usize) -> &'a [f32],
    val: impl Fn(usize) -> &'a [f32],
    scale: f64,
    far: Option<(&super::farfield::FarState, usize, usize)>,
    p: &mut [f64],
    out: &mut [f64],
) {
    let mut mx = f64::NEG_INFINITY;
    for (j, s) in p[..nc].iter_mut().enumerate() {
        *s = dot32(q, key(j)) * scale;
        mx = mx.max(*s);
    }
    let mut den = 0.0;
    out.fill(0.0);
    if let Some((f, h, g)) = far {
        let mut eps = [0f64; super::farfield::MAX_RANK];
        let eps = &mut eps[..f.weights.rank];
        mx = mx.max(f.logits(h, g, q, eps));
        den = f.apply(g, eps, mx, out);
    }
    for (j, s) in p[..nc].iter_mut().enumerate() {
        *s = (*s - mx).exp();
        den += *s;
        out.iter_mut().zip(val(j)).for_each(|(x, &y)| *x += *s * y as f64);
    }
    let inv = 1.0 / den;
    out.iter_mut().for_each(|x| *x *= inv);
    p[..nc].iter_mut().for_each(|x| *x *= inv);
}

#[cfg(test)]
mod tests {
    use super::*;
    use cortiq_testkit::XorShift;

    /// The rule, one plain loop per step over a list of (position, k, v, score).
    struct Reference {
        kept: Vec<(usize, Vec<f32>, Vec<f32>, f64)>,
    }

    fn attend_all(
        kept: &[(usize, Vec<f32>, Vec<f32>, f64)],
        q: &[f32],
        nh: usize,
        nkv: usize,
        hd: usize,
        scale: f64,
    ) -> (Vec<f64>, Vec<f64>) {
        let group = nh / nkv;
        let mut o = vec![0.0; nh * hd];
        let mut layer = vec![0.0; kept.len()];
        for h in 0..nh {
            let g = h / group;
            let s: Vec<f64> = kept
                .iter()
                .map(|(_, k, _, _)| (0..hd).map(|i| q[h * hd + i] as f64 * k[g * hd + i] as f64).sum::<f64>() * scale)
                .collect();
            let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
            let den: f64 = e.iter().sum();
            for (j, (_, _, v, _)) in kept.iter().enumerate() {
                layer[j] += e[j] / den;
                for i in 0..hd {
                    o[h * hd + i] += e[j] / den * v[g * hd + i] as f64;
                }
            }
        }
        (o, layer)
    }

    #[test]
    fn steps_follow_the_rule_and_attend_exactly() {
        let (nh, nkv, hd, scale) = (6, 2, 8, 0.35);
        let row = nkv * hd;
        for (sinks, window, rule, seed) in [
            (2, 5, ScoreRule { decay: 0.0, recent: 0, obs: 0, model_layers: false }, 1),
            (1, 6, ScoreRule { decay: 0.7, recent: 3, obs: 0, model_layers: false }, 2),
            (0, 4, ScoreRule { decay: 0.5, recent: 0, obs: 0, model_layers: false }, 3),
            (3, 3, ScoreRule { decay: 0.9, recent: 2, obs: 0, model_layers: false }, 4),
        ] {
            let mut rng = XorShift(0x9E37_79B9 + seed);
            let tp = 9;
            let k: Vec<f32> = (0..tp * row).map(|_| rng.f()).collect();
            let v: Vec<f32> = (0..tp * row).map(|_| rng.f()).collect();
            let mut s = Slots::seal(&k, &v, row, sinks, window, rule);
            let mut r = Reference { kept: Vec::new() };
            for p in (0..sinks.min(tp)).chain(sinks.max(tp - window)..tp) {
                r.kept.push((p, k[p * row..][..row].to_vec(), v[p * row..][..row].to_vec(), 0.0));
            }
            for t in tp..tp + 40 {
                let q: Vec<f32> = (0..nh * hd).map(|_| 6.0 * rng.f()).collect();
                let kn: Vec<f32> = (0..row).map(|_| rng.f()).collect();
                let vn: Vec<f32> = (0..row).map(|_| rng.f()).collect();
                let mut o = vec![0.0; nh * hd];
                s.step(&q, &kn, &vn, &mut o, nh, nkv, scale, None);
                r.kept.push((t, kn, vn, 0.0));
                let (ro, layer) = attend_all(&r.kept, &q, nh, nkv, hd, scale);
                for (a, b) in o.iter().zip(&ro) {
                    assert!((*a as f64 - b).abs() <= 1e-6 * (1.0 + b.abs()), "t={t}: output {a} vs {b}");
                }
                let last = r.kept.len() - 1;
                for (j, e) in r.kept.iter_mut().enumerate() {
                    e.3 = if j == last { layer[j] } else { rule.decay as f64 * e.3 + layer[j] };
                }
                if r.kept.len() > sinks + window {
                    let victim = (0..r.kept.len())
                        .filter(|&j| {
                            let p = r.kept[j].0;
                            p >= sinks && p + rule.recent <= t && (j < last || rule.recent == 0)
                        })
                        .min_by(|&a, &b| r.kept[a].3.total_cmp(&r.kept[b].3));
                    r.kept.remove(victim.unwrap_or(last));
                }
                let mut want: Vec<u32> = r.kept.iter().map(|e| e.0 as u32).collect();
                let mut got = s.positions().to_vec();
                want.sort_unstable();
                got.sort_unstable();
                assert_eq!(got, want, "t={t}: kept positions (sinks {sinks}, window {window}, {rule:?})");
                assert!(got.iter().take(sinks).enumerate().all(|(i, &p)| p as usize == i), "sinks stay");
            }
        }
    }

    /// With a learned far field: the same keys leave as without one when the far mass counts
    /// in every head's normalizer (checked against a plain loop that keeps the evicted keys
    /// and forms each one's far weight Σ_f e^{a_f(q) + b_f(k) − δ_f(t − j)} directly, no running
    /// offsets, every feature decaying at its own rate).
    #[test]
    fn steps_with_a_far_field_absorb_what_leaves() {
        use crate::o1::farfield::{FarState, FarWeights};
        let (nh, nkv, hd, scale, rank) = (4, 2, 6, 0.4, 3);
        let row = nkv * hd;
        let (sinks, window, rule) = (1, 4, ScoreRule { decay: 0.6, recent: 1, obs: 0, model_layers: false });
        let mut rng = XorShift(0xFA7);
        let mut f = |n: usize, a: f32| (0..n).map(|_| a * rng.f()).collect::<Vec<f32>>();
        let fw = FarWeights::from_tensors(
            rank,
            nh,
            nkv,
            hd,
            [f(nh * rank * hd, 1.0), f(nh * rank, 1.0), f(nh, 0.05), f(nkv * rank * hd, 1.0), f(nkv * rank, 1.0), f(nkv, 0.05)],
        )
        .expect("shapes")
        .with_decay((0..nkv * rank).map(|i| 0.02 * i as f32).collect())
        .expect("rates");
        let fw = std::sync::Arc::new(fw);
        let logit = |x: &[f32], m: &[f32], gam: f32, b: f32| {
            (0..hd).map(|i| x[i] as f64 * m[i] as f64).sum::<f64>()
                - gam as f64 * x.iter().map(|&y| y as f64 * y as f64).sum::<f64>()
                + b as f64
        };
        let tp = 7;
        let k = f(tp * row, 1.0);
        let v = f(tp * row, 1.0);
        let mut s = Slots::seal(&k, &v, row, sinks, window, rule);
        let mut far = FarState::new(fw.clone());
        let mut kept: Vec<(usize, Vec<f32>, Vec<f32>, f64)> = Vec::new();
        let mut gone: Vec<(usize, Vec<f32>, Vec<f32>)> = Vec::new();
        far.advance(tp);
        for p in 0..tp {
            let (kr, vr) = (k[p * row..][..row].to_vec(), v[p * row..][..row].to_vec());
            if p < sinks || p >= tp - window {
                kept.push((p, kr, vr, 0.0));
            } else {
                far.absorb(&kr, &vr, p);
                gone.push((p, kr, vr));
            }
        }
        for t in tp..tp + 30 {
            let q = f(nh * hd, 3.0);
            let (kn, vn) = (f(row, 1.0), f(row, 1.0));
            let mut o = vec![0.0; nh * hd];
            s.step(&q, &kn, &vn, &mut o, nh, nkv, scale, Some(&mut far));
            kept.push((t, kn, vn, 0.0));
            let group = nh / nkv;
            let mut layer = vec![0.0; kept.len()];
            for h in 0..nh {
                let g = h / group;
                let qh = &q[h * hd..][..hd];
                let e: Vec<f64> =
                    kept.iter().map(|(_, kk, _, _)| (logit(qh, &kk[g * hd..][..hd], 0.0, 0.0) * scale).exp()).collect();
                let mut num = vec![0.0; hd];
                let mut den: f64 = e.iter().sum();
                for (j, (_, _, vv, _)) in kept.iter().enumerate() {
                    (0..hd).for_each(|i| num[i] += e[j] * vv[g * hd + i] as f64);
                }
                for (pos, kk, vv) in &gone {
                    for r in 0..rank {
                        let a = logit(qh, &fw.u[(h * rank + r) * hd..][..hd], fw.gq[h], fw.alpha[h * rank + r]);
                        let b = logit(&kk[g * hd..][..hd], &fw.w[(g * rank + r) * hd..][..hd], fw.gk[g], fw.beta[g * rank + r]);
                        let w = (a + b - fw.decay[g * rank + r] as f64 * (t - pos) as f64).exp();
                        den += w;
                        (0..hd).for_each(|i| num[i] += w * vv[g * hd + i] as f64);
                    }
                }
                for i in 0..hd {
                    let want = num[i] / den;
                    let got = o[h * hd + i] as f64;
                    assert!((got - want).abs() <= 2e-5 * (1.0 + want.abs()), "t={t} head {h}: {got} vs {want}");
                }
                e.iter().enumerate().for_each(|(j, x)| layer[j] += x / den);
            }
            let last = kept.len() - 1;
            for (j, e) in kept.iter_mut().enumerate() {
                e.3 = if j == last { layer[j] } else { rule.decay as f64 * e.3 + layer[j] };
            }
            if kept.len() > sinks + window {
                let victim = (0..kept.len())
                    .filter(|&j| kept[j].0 >= sinks && kept[j].0 + rule.recent <= t && (j < last || rule.recent == 0))
                    .min_by(|&a, &b| kept[a].3.total_cmp(&kept[b].3))
                    .unwrap_or(last);
                let (pos, kk, vv, _) = kept.remove(victim);
                gone.push((pos, kk, vv));
            }
            let mut want: Vec<u32> = kept.iter().map(|e| e.0 as u32).collect();
            let mut got = s.positions().to_vec();
            want.sort_unstable();
            got.sort_unstable();
            assert_eq!(got, want, "t={t}: kept positions");
        }
        assert!(gone.len() > 20, "keys were absorbed ({})", gone.len());
    }

    #[test]
    fn a_voted_seal_keeps_the_keys_the_last_queries_attend_to() {
        let (nh, nkv, hd, tp, scale) = (4, 2, 8, 40, 0.5);
        let row = nkv * hd;
        let mut rng = XorShift(0x5EED);
        let k: Vec<f32> = (0..tp * row).map(|_| rng.f()).collect();
        let v: Vec<f32> = (0..tp * row).map(|_| rng.f()).collect();
        let q: Vec<f32> = (0..tp * nh * hd).map(|_| 3.0 * rng.f()).collect();
        let (sinks, window, obs) = (2, 10, 6);
        let rule = ScoreRule { decay: 0.5, recent: 3, obs, model_layers: false };
        let mut recent = RecentQueries::new(tp, obs, nh, hd);
        // The prompt arrives in two calls, cut inside the observed positions.
        recent.add(0, &q[..37 * nh * hd]);
        recent.add(37, &q[37 * nh * hd..]);
        let s = Slots::seal_voted(&k, &v, &recent, nh, nkv, sinks, window, rule, scale);
        // Reference: every vote from scratch, the top window − recent of the middle positions.
        let group = nh / nkv;
        let mut votes = vec![0.0f64; tp];
        for pos in tp - obs..tp {
            for h in 0..nh {
                let g = h / group;
                let sc: Vec<f64> = (0..=pos)
                    .map(|j| {
                        (0..hd).map(|i| q[(pos * nh + h) * hd + i] as f64 * k[j * row + g * hd + i] as f64).sum::<f64>() * scale
                    })
                    .collect();
                let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let den: f64 = sc.iter().map(|x| (x - mx).exp()).sum();
                for j in 0..=pos {
                    votes[j] += (sc[j] - mx).exp() / den;
                }
            }
        }
        let mut middle: Vec<usize> = (sinks..tp - 3).collect();
        middle.sort_by(|&a, &b| votes[b].total_cmp(&votes[a]));
        let mut want: Vec<u32> =
            (0..sinks).chain(middle[..window - 3].iter().copied()).chain(tp - 3..tp).map(|p| p as u32).collect();
        want.sort_unstable();
        let mut got = s.positions().to_vec();
        got.sort_unstable();
        assert_eq!(got, want);
        // Not simply the most recent: the votes chose some older key.
        assert!(got.iter().any(|&p| (p as usize) >= sinks && (p as usize) < tp - window), "{got:?}");
    }

    #[test]
    fn a_state_that_never_fills_is_exact_attention() {
        let (nh, nkv, hd) = (4, 1, 16);
        let mut rng = XorShift(0x9E37_79B9);
        let k: Vec<f32> = (0..3 * hd).map(|_| rng.f()).collect();
        let mut s = Slots::seal(&k, &k, hd, 4, 100, ScoreRule::default());
        let mut kept: Vec<(usize, Vec<f32>, Vec<f32>, f64)> =
            (0..3).map(|p| (p, k[p * hd..][..hd].to_vec(), k[p * hd..][..hd].to_vec(), 0.0)).collect();
        for t in 3..60 {
            let q: Vec<f32> = (0..nh * hd).map(|_| rng.f()).collect();
            let kn: Vec<f32> = (0..hd).map(|_| rng.f()).collect();
            let mut o = vec![0.0; nh * hd];
            s.step(&q, &kn, &kn, &mut o, nh, nkv, 0.25, None);
            kept.push((t, kn.clone(), kn, 0.0));
            let (ro, _) = attend_all(&kept, &q, nh, nkv, hd, 0.25);
            assert!(o.iter().zip(&ro).all(|(a, b)| (*a as f64 - b).abs() <= 1e-6 * (1.0 + b.abs())), "t={t}");
        }
        assert_eq!(s.positions().len(), 60);
    }
}

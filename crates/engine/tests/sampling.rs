//! Sampling and stop-string tests.
//!
//! Expected probabilities come from llama.cpp's tests/test-sampling.cpp (same inputs: logits =
//! ln(p), one sampler at a time, then softmax). The fast paths (gather, select_nth, adaptive
//! top-p) are checked against a naive full-sort implementation of the same chain on large
//! random rows; empirical draw frequencies are checked against the returned distribution.

use cortiq_engine::sampling::{Rng, Sampler, SamplerParams};
use cortiq_engine::stop::StopMatcher;
use cortiq_testkit::{max_abs_diff, max_abs_diff_f64};

/// Every filter and penalty off, temperature 1, fixed seed: a base to switch one thing on.
fn plain() -> SamplerParams {
    SamplerParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        repeat_last_n: 64,
        seed: 1234,
    }
}

fn ln_probs(p: &[f32]) -> Vec<f32> {
    p.iter().map(|x| x.ln()).collect()
}

/// Compares `got` (sorted most likely first) with llama.cpp's expected list (its order is the
/// candidate order after the sampler; compared here by descending probability), 1e-5 as there.
fn check_probs(what: &str, got: &[(u32, f32)], expected: &[f32]) {
    let mut exp = expected.to_vec();
    exp.sort_by(|a, b| b.total_cmp(a));
    assert_eq!(got.len(), exp.len(), "{what}: kept {:?}, expected {:?}", got, exp);
    let probs: Vec<f32> = got.iter().map(|&(_, g)| g).collect();
    let (worst, at) = max_abs_diff(&probs, &exp); // NaN if any probability is NaN
    println!("{what}: max |diff| {worst:.2e} at rank {at}");
    assert!(worst < 1e-5, "{what}: max |diff| {worst:.2e} at rank {at}: got {got:?}, expected {exp:?}");
}

/// Full-vocabulary probability vector from a distribution (ids not present get 0).
fn dense(dist: &[(u32, f32)], n: usize) -> Vec<f32> {
    let mut v = vec![0.0; n];
    for &(id, p) in dist {
        v[id as usize] = p;
    }
    v
}

const P4: [f32; 4] = [0.1, 0.2, 0.3, 0.4];

#[test]
fn llama_cpp_temp_cases() {
    let l = ln_probs(&P4);
    let d = Sampler::new(SamplerParams { temperature: 1.0, ..plain() }).distribution(&l, &[]);
    check_probs("temp 1", &d, &[0.1, 0.2, 0.3, 0.4]);
    let d = Sampler::new(SamplerParams { temperature: 0.0, ..plain() }).distribution(&l, &[]);
    check_probs("temp 0", &d, &[1.0]);
    assert_eq!(d[0].0, 3);
}

#[test]
fn llama_cpp_top_k_cases() {
    let l = ln_probs(&P4);
    for (k, exp) in [
        (1usize, &[1.0f32][..]),
        (3, &[0.44444, 0.33333, 0.22222][..]),
        (4, &[0.4, 0.3, 0.2, 0.1][..]),
        (0, &[0.1, 0.2, 0.3, 0.4][..]),
    ] {
        let d = Sampler::new(SamplerParams { top_k: k, ..plain() }).distribution(&l, &[]);
        check_probs(&format!("top_k {k}"), &d, exp);
    }
}

#[test]
fn llama_cpp_top_p_cases() {
    let l = ln_probs(&P4);
    for (p, exp) in [
        (0.0f32, &[1.0f32][..]),
        (0.7, &[0.571429, 0.428571][..]),
        (0.8, &[0.44444, 0.33333, 0.22222][..]),
        (1.0, &[0.1, 0.2, 0.3, 0.4][..]),
    ] {
        let d = Sampler::new(SamplerParams { top_p: p, ..plain() }).distribution(&l, &[]);
        check_probs(&format!("top_p {p}"), &d, exp);
    }
}

#[test]
fn llama_cpp_min_p_cases() {
    let l = ln_probs(&P4);
    for (p, exp) in [
        (0.00f32, &[0.1f32, 0.2, 0.3, 0.4][..]),
        (0.24, &[0.1, 0.2, 0.3, 0.4][..]),
        (0.26, &[0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9][..]),
        (0.49, &[0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9][..]),
        (0.51, &[0.3 / 0.7, 0.4 / 0.7][..]),
        (0.74, &[0.3 / 0.7, 0.4 / 0.7][..]),
        (0.76, &[1.0][..]),
        (1.00, &[1.0][..]),
        (1.05, &[1.0][..]),
    ] {
        let d = Sampler::new(SamplerParams { min_p: p, ..plain() }).distribution(&l, &[]);
        check_probs(&format!("min_p {p}"), &d, exp);
    }
}

#[test]
fn llama_cpp_penalty_cases() {
    let l = ln_probs(&[0.2; 5]);
    // (history, expected probs by id, repeat, frequency, presence)
    type Case = (&'static [u32], [f32; 5], f32, f32, f32);
    let cases: [Case; 6] = [
        (&[0], [0.0, 0.25, 0.25, 0.25, 0.25], 50.0, 0.0, 0.0),
        (&[0, 1, 2], [0.0, 0.0, 0.0, 0.5, 0.5], 50.0, 0.0, 0.0),
        (&[0, 1, 2, 0, 0], [0.0, 0.0, 0.0, 0.5, 0.5], 50.0, 0.0, 0.0),
        (&[0], [0.000011, 0.249997, 0.249997, 0.249997, 0.249997], 1.0, 5.0, 5.0),
        (&[0, 1, 2], [0.000023, 0.000023, 0.000023, 0.499966, 0.499966], 1.0, 5.0, 5.0),
        (&[0, 1, 2, 0, 0], [0.000000, 0.000023, 0.000023, 0.499977, 0.499977], 1.0, 5.0, 5.0),
    ];
    for (hist, exp, rp, fp, pp) in cases {
        let params = SamplerParams {
            repeat_penalty: rp,
            frequency_penalty: fp,
            presence_penalty: pp,
            repeat_last_n: hist.len(),
            ..plain()
        };
        let got = dense(&Sampler::new(params).distribution(&l, hist), 5);
        let (worst, at) = max_abs_diff(&got, &exp[..]);
        println!("penalties {hist:?} r={rp} f={fp} p={pp}: max |diff| {worst:.2e} at id {at}");
        assert!(worst < 1e-5, "penalties {hist:?}: got {got:?}, expected {exp:?}");
    }
}

#[test]
fn repeat_penalty_changes_argmax() {
    // Token 2 leads by a little; it was just generated, so a 1.3 penalty (2.0/1.3 = 1.54 < 1.8)
    // must hand the argmax to token 1. A negative logit is multiplied (moves further down).
    let logits = [0.5f32, 1.8, 2.0, -1.0];
    let mut g = Sampler::new(SamplerParams::greedy());
    assert_eq!(g.sample(&logits, &[2, 3]), 2);
    let params = SamplerParams { repeat_penalty: 1.3, temperature: 0.0, ..plain() };
    let mut s = Sampler::new(params.clone());
    assert_eq!(s.sample(&logits, &[2, 3]), 1);
    // Outside the window (repeat_last_n = 1 sees only the last id, 3): no change.
    let mut s = Sampler::new(SamplerParams { repeat_last_n: 1, ..params.clone() });
    assert_eq!(s.sample(&logits, &[2, 3]), 2);
    // usize::MAX: the whole history is the window.
    let long: Vec<u32> = std::iter::once(2).chain(std::iter::repeat_n(3, 500)).collect();
    let mut s = Sampler::new(SamplerParams { repeat_last_n: usize::MAX, ..params.clone() });
    assert_eq!(s.sample(&logits, &long), 1);
    let mut s = Sampler::new(SamplerParams { repeat_last_n: 64, ..params.clone() });
    assert_eq!(s.sample(&logits, &long), 2);
    // repeat_last_n = 0 switches penalties off, as llama.cpp's penalty_last_n = 0.
    let mut s = Sampler::new(SamplerParams { repeat_last_n: 0, ..params.clone() });
    assert_eq!(s.sample(&logits, &[2, 3]), 2);
    // Ids beyond the vocabulary are ignored, not a panic.
    let mut s = Sampler::new(params);
    assert_eq!(s.sample(&logits, &[2, 99, u32::MAX]), 1);
    // Presence penalty also flips it: 2.0 - 0.5 < 1.8.
    let mut s = Sampler::new(SamplerParams { presence_penalty: 0.5, temperature: 0.0, ..plain() });
    assert_eq!(s.sample(&logits, &[2]), 1);
    // Frequency scales with the count: 2.0 - 2*0.15 = 1.7 < 1.8, but 2.0 - 0.15 > 1.8.
    let mut s = Sampler::new(SamplerParams { frequency_penalty: 0.15, temperature: 0.0, ..plain() });
    assert_eq!(s.sample(&logits, &[2]), 2);
    assert_eq!(s.sample(&logits, &[2, 0, 2]), 1);
}

/// Deterministic test logits: a peaked, LLM-like row (a few strong tokens over Gaussian-ish
/// noise), generated from our RNG so the test has no dependency.
fn llm_like_row(n: usize, seed: u64, spread: f32) -> Vec<f32> {
    let mut r = Rng::new(seed);
    let mut v: Vec<f32> = (0..n)
        .map(|_| {
            // sum of 4 uniforms ~ bell curve on [-2, 2]
            let s: f64 = (0..4).map(|_| r.next_f64()).sum::<f64>() - 2.0;
            (s as f32) * spread
        })
        .collect();
    for j in 0..20 {
        let i = (r.next_u64() % n as u64) as usize;
        v[i] += 3.0 * spread + j as f32 * 0.37;
    }
    v
}

/// A row whose mass sits on ~20 tokens 8-15 nats above a noisy floor, so top-p keeps a
/// handful even at V = 262,144 (what chi-square over draws needs).
fn peaked_row(n: usize, seed: u64) -> Vec<f32> {
    let mut r = Rng::new(seed);
    let mut v: Vec<f32> = (0..n).map(|_| (r.next_f64() * 2.0 - 1.0) as f32).collect();
    for j in 0..20 {
        let i = (r.next_u64() % n as u64) as usize;
        v[i] = 16.0 + j as f32 * 0.37;
    }
    v
}

fn argmax_lowest(v: &[f32]) -> u32 {
    let mut best = 0;
    for i in 0..v.len() {
        if v[i] > v[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn greedy_is_argmax_with_lowest_id_ties() {
    for seed in 0..20 {
        let row = llm_like_row(5000, seed, 3.0);
        let mut s = Sampler::new(SamplerParams::greedy());
        assert_eq!(s.sample(&row, &[]), argmax_lowest(&row), "seed {seed}");
    }
    let tied = [1.0f32, 3.0, -2.0, 3.0, 3.0];
    assert_eq!(Sampler::new(SamplerParams::greedy()).sample(&tied, &[]), 1);
    // -0.0 and +0.0 are a tie too.
    assert_eq!(Sampler::new(SamplerParams::greedy()).sample(&[-1.0, -0.0, 0.0], &[]), 1);
    // Negative and NaN temperatures are greedy.
    for t in [-1.0f32, f32::NAN] {
        let mut s = Sampler::new(SamplerParams { temperature: t, ..SamplerParams::default() });
        assert_eq!(s.sample(&tied, &[]), 1);
    }
}

#[test]
fn top_k_one_equals_greedy_at_any_temperature() {
    for seed in 0..10 {
        let row = llm_like_row(262_144, seed, 2.0);
        let want = argmax_lowest(&row);
        for t in [0.1f32, 0.8, 1.0, 5.0, 1e6, f32::INFINITY] {
            let mut s = Sampler::new(SamplerParams { top_k: 1, temperature: t, seed, ..SamplerParams::default() });
            for _ in 0..3 {
                assert_eq!(s.sample(&row, &[]), want, "seed {seed} temperature {t}");
            }
        }
    }
    // With ties at the top, top-k=1 keeps the lowest id, as greedy does.
    let tied = [1.0f32, 3.0, -2.0, 3.0, 3.0];
    let mut s = Sampler::new(SamplerParams { top_k: 1, temperature: 2.0, ..plain() });
    assert_eq!(s.sample(&tied, &[]), 1);
}

#[test]
fn same_seed_same_tokens_other_seed_differs() {
    let rows: Vec<Vec<f32>> = (0..64).map(|i| llm_like_row(32_000, 100 + i, 1.5)).collect();
    let run = |seed: u64| -> Vec<u32> {
        let mut s =
            Sampler::new(SamplerParams { seed, top_k: 0, top_p: 0.98, min_p: 0.0, temperature: 1.5, ..SamplerParams::default() });
        let mut hist = Vec::new();
        for r in &rows {
            let t = s.sample(r, &hist);
            hist.push(t);
        }
        hist
    };
    let a = run(42);
    assert_eq!(a, run(42));
    let b = run(43);
    let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
    println!("seed 42 vs 43: {same}/64 equal tokens");
    assert!(same < 60, "different seeds gave {same}/64 identical tokens");
    // reseed restarts the stream.
    let mut s = Sampler::new(SamplerParams { seed: 7, ..plain() });
    let x: Vec<u32> = (0..16).map(|i| s.sample(&rows[i], &[])).collect();
    s.reseed(7);
    let y: Vec<u32> = (0..16).map(|i| s.sample(&rows[i], &[])).collect();
    assert_eq!(x, y);
}

#[test]
fn full_row_and_candidate_paths_draw_identically() {
    // With no filter the draw runs straight over the row; a min-p of 1e-30 keeps every token
    // but goes through the gather. Same weights in the same (id) order: same tokens.
    let row = llm_like_row(50_000, 5, 1.0);
    let full = SamplerParams { seed: 2024, temperature: 0.9, ..plain() };
    let gathered = SamplerParams { min_p: 1e-30, ..full.clone() };
    let mut a = Sampler::new(full);
    let mut b = Sampler::new(gathered);
    let ta: Vec<u32> = (0..200).map(|_| a.sample(&row, &[])).collect();
    let tb: Vec<u32> = (0..200).map(|_| b.sample(&row, &[])).collect();
    let first_diff = ta.iter().zip(&tb).position(|(x, y)| x != y);
    assert_eq!(first_diff, None, "paths diverge at draw {first_diff:?}");
    let distinct: std::collections::BTreeSet<_> = ta.iter().collect();
    println!("200 draws, {} distinct tokens", distinct.len());
    assert!(distinct.len() > 20);
}

#[test]
fn nan_and_inf_are_safe() {
    let mut s = Sampler::new(SamplerParams { seed: 3, ..SamplerParams::default() });
    // NaN counts as -inf.
    let l = [f32::NAN, 1.0, f32::NAN, 0.5];
    for _ in 0..50 {
        let t = s.sample(&l, &[]);
        assert!(t == 1 || t == 3, "drew NaN token {t}");
    }
    assert_eq!(Sampler::new(SamplerParams::greedy()).sample(&l, &[]), 1);
    // All NaN / all -inf / empty: token 0, documented.
    for row in [vec![f32::NAN; 8], vec![f32::NEG_INFINITY; 8], vec![]] {
        assert_eq!(s.sample(&row, &[]), 0);
        assert_eq!(Sampler::new(SamplerParams::greedy()).sample(&row, &[]), 0);
        assert_eq!(s.distribution(&row, &[]), vec![(0, 1.0)]);
    }
    // +inf wins; several +inf share the mass evenly.
    let l = [0.0f32, f32::INFINITY, 3.0, f32::INFINITY, f32::NAN];
    let d = s.distribution(&l, &[]);
    assert_eq!(d, vec![(1, 0.5), (3, 0.5)]);
    assert_eq!(Sampler::new(SamplerParams::greedy()).sample(&l, &[]), 1);
    for _ in 0..50 {
        let t = s.sample(&l, &[]);
        assert!(t == 1 || t == 3);
    }
    // Penalties that produce NaN (inf * ...) or absurd params: no panic, a valid id.
    let wild = SamplerParams {
        repeat_penalty: f32::NAN,
        presence_penalty: f32::INFINITY,
        frequency_penalty: f32::NAN,
        top_p: f32::NAN,
        min_p: f32::NAN,
        top_k: usize::MAX,
        temperature: 1e-30,
        ..SamplerParams::default()
    };
    let mut w = Sampler::new(wild);
    let row = [f32::INFINITY, f32::NEG_INFINITY, 2.0, f32::NAN, -3.0];
    for _ in 0..20 {
        assert!((w.sample(&row, &[0, 1, 2, 3, 4]) as usize) < row.len());
    }
    let mut z = Sampler::new(SamplerParams { repeat_penalty: 0.0, ..SamplerParams::default() });
    assert!((z.sample(&[1.0, -1.0, 0.0], &[0, 1, 2]) as usize) < 3);
}

/// Naive reference of the chain: sanitize, penalties (llama.cpp formula), full sort by
/// (logit desc, id asc), top-k, softmax + top-p prefix, min-p. Returns the kept ids (sorted).
fn naive_kept(logits: &[f32], p: &SamplerParams) -> Vec<u32> {
    let mut v: Vec<(f32, u32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (if l.is_nan() { f32::NEG_INFINITY } else { l }, i as u32))
        .filter(|&(l, _)| l > f32::NEG_INFINITY)
        .collect();
    v.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    if p.top_k > 0 && p.top_k < v.len() {
        v.truncate(p.top_k);
    }
    let m = v[0].0 as f64;
    if p.top_p < 1.0 {
        let z: f64 = v.iter().map(|&(l, _)| (l as f64 - m).exp()).sum();
        let mut cum = 0.0;
        let mut n = v.len();
        for (i, &(l, _)) in v.iter().enumerate() {
            cum += (l as f64 - m).exp() / z;
            if cum >= p.top_p as f64 {
                n = i + 1;
                break;
            }
        }
        v.truncate(n);
    }
    if p.min_p > 0.0 {
        let keep = v.iter().position(|&(l, _)| (l as f64 - m).exp() < p.min_p as f64).unwrap_or(v.len());
        v.truncate(keep.max(1));
    }
    let mut ids: Vec<u32> = v.into_iter().map(|(_, i)| i).collect();
    ids.sort_unstable();
    ids
}

#[test]
fn fast_paths_keep_the_same_set_as_a_full_sort() {
    let configs: Vec<(usize, f32, f32)> = vec![
        (40, 0.95, 0.05), // llama.cpp defaults
        (40, 1.0, 0.0),
        (0, 0.9, 0.0),
        (0, 0.5, 0.0),
        (0, 0.999, 0.0),
        (0, 1.0, 0.05),
        (0, 0.95, 0.05),
        (0, 0.95, 0.001),
        (1000, 0.99, 0.0),
        (50_000, 0.9999, 0.0),
        (3, 1.0, 0.9),
    ];
    let mut mismatches = 0;
    for seed in 0..4u64 {
        for spread in [0.3f32, 2.0, 8.0] {
            let row = llm_like_row(262_144, seed * 31 + 7, spread);
            for &(k, tp, mp) in &configs {
                let params = SamplerParams { top_k: k, top_p: tp, min_p: mp, temperature: 0.7, ..plain() };
                let want = naive_kept(&row, &params);
                let mut got: Vec<u32> = Sampler::new(params).distribution(&row, &[]).iter().map(|x| x.0).collect();
                got.sort_unstable();
                if got != want {
                    mismatches += 1;
                    let extra: Vec<_> = got.iter().filter(|x| !want.contains(x)).take(5).collect();
                    let missing: Vec<_> = want.iter().filter(|x| !got.contains(x)).take(5).collect();
                    println!(
                        "seed {seed} spread {spread} k={k} p={tp} min_p={mp}: kept {} vs {}; extra {extra:?} missing {missing:?}",
                        got.len(),
                        want.len()
                    );
                }
            }
        }
    }
    assert_eq!(mismatches, 0);
}

/// Pearson chi-square of `counts` against `probs` (both over the same ids).
fn chi_square(counts: &[u64], probs: &[f64], n: u64) -> f64 {
    counts
        .iter()
        .zip(probs)
        .map(|(&c, &p)| {
            let e = p * n as f64;
            (c as f64 - e).powi(2) / e
        })
        .sum()
}

/// Upper bound for a chi-square with `df` degrees of freedom that a correct sampler exceeds
/// with probability ~1e-6 (Wilson-Hilferty, z = 4.75).
fn chi_bound(df: usize) -> f64 {
    let d = df as f64;
    let z = 4.75;
    d * (1.0 - 2.0 / (9.0 * d) + z * (2.0 / (9.0 * d)).sqrt()).powi(3)
}

/// Draws `n` tokens and checks (a) nothing outside `expected` ever appears and (b) the counts
/// fit `expected`'s probabilities.
fn check_draws(what: &str, logits: &[f32], params: SamplerParams, expected: &[(u32, f64)], n: u64) {
    let mut s = Sampler::new(params);
    let mut counts = vec![0u64; expected.len()];
    for _ in 0..n {
        let t = s.sample(logits, &[]);
        let Some(j) = expected.iter().position(|&(id, _)| id == t) else {
            panic!("{what}: drew token {t} outside the expected set {expected:?}");
        };
        counts[j] += 1;
    }
    let probs: Vec<f64> = expected.iter().map(|x| x.1).collect();
    let chi = chi_square(&counts, &probs, n);
    let df = expected.len().saturating_sub(1).max(1);
    println!("{what}: chi2 {chi:.2} (df {df}, bound {:.2}), counts {counts:?}", chi_bound(df));
    assert!(chi < chi_bound(df), "{what}: chi2 {chi:.2} over bound {:.2}; counts {counts:?} probs {probs:?}", chi_bound(df));
}

/// Renormalised softmax of `logits / t` over `ids` (the expected distribution, in f64).
fn renorm(logits: &[f32], ids: &[u32], t: f64) -> Vec<(u32, f64)> {
    let m = ids.iter().map(|&i| logits[i as usize]).fold(f32::NEG_INFINITY, f32::max) as f64;
    let w: Vec<f64> = ids.iter().map(|&i| ((logits[i as usize] as f64 - m) / t).exp()).collect();
    let z: f64 = w.iter().sum();
    ids.iter().zip(w).map(|(&i, w)| (i, w / z)).collect()
}

#[test]
fn top_p_and_min_p_draws_match_renormalised_probabilities() {
    // llama.cpp's 4-token case with top_p 0.7 keeps {3, 2}; min_p 0.26 keeps {1, 2, 3}.
    let l = ln_probs(&P4);
    let n = 200_000;
    check_draws("top_p 0.7", &l, SamplerParams { top_p: 0.7, seed: 11, ..plain() }, &renorm(&l, &[3, 2], 1.0), n);
    check_draws("min_p 0.26", &l, SamplerParams { min_p: 0.26, seed: 12, ..plain() }, &renorm(&l, &[1, 2, 3], 1.0), n);
    // Temperature applies after the filters (llama.cpp order): the kept set does not change
    // with temperature, only the weights within it.
    check_draws(
        "top_p 0.7 t=0.5",
        &l,
        SamplerParams { top_p: 0.7, temperature: 0.5, seed: 13, ..plain() },
        &renorm(&l, &[3, 2], 0.5),
        n,
    );
    check_draws(
        "min_p 0.26 t=2",
        &l,
        SamplerParams { min_p: 0.26, temperature: 2.0, seed: 14, ..plain() },
        &renorm(&l, &[1, 2, 3], 2.0),
        n,
    );
    check_draws("no filters", &l, SamplerParams { seed: 15, ..plain() }, &renorm(&l, &[0, 1, 2, 3], 1.0), n);

    // A big row: the set comes from the naive full sort, the weights from f64 softmax.
    let row = peaked_row(262_144, 99);
    for (k, tp, mp, t) in
        [(0usize, 0.9f32, 0.0f32, 1.0f32), (0, 0.6, 0.0, 0.7), (0, 1.0, 0.2, 0.8), (40, 0.95, 0.05, 0.8), (8, 1.0, 0.0, 1.3)]
    {
        let params = SamplerParams { top_k: k, top_p: tp, min_p: mp, temperature: t, seed: 21, ..plain() };
        let ids = naive_kept(&row, &params);
        assert!(ids.len() >= 2 && ids.len() <= 64, "test row should keep a handful, kept {}", ids.len());
        // 6,000 draws per setting: the kept sets hold 2-64 tokens, so chi-square still has power,
        // and the test stays a few seconds on a loaded 2-core machine.
        check_draws(&format!("262k row k={k} p={tp} min_p={mp} t={t}"), &row, params, &renorm(&row, &ids, t as f64), 6_000);
    }
}

#[test]
fn distribution_agrees_with_f64_softmax() {
    let row = llm_like_row(262_144, 5, 2.0);
    let params = SamplerParams { top_k: 40, top_p: 0.95, min_p: 0.05, temperature: 0.8, ..plain() };
    let ids = naive_kept(&row, &params);
    let want = renorm(&row, &ids, 0.8);
    let got = Sampler::new(params).distribution(&row, &[]);
    assert_eq!(got.len(), want.len());
    let g: Vec<f64> = want.iter().map(|&(id, _)| got.iter().find(|x| x.0 == id).expect("same set").1 as f64).collect();
    let p: Vec<f64> = want.iter().map(|&(_, p)| p).collect();
    let (worst, i) = max_abs_diff_f64(&g, &p); // NaN if any probability is NaN
    println!("distribution vs f64 softmax: max |diff| {worst:.2e} at id {}", want[i].0);
    assert!(worst < 1e-6, "distribution vs f64 softmax: max |diff| {worst:e} at id {}", want[i].0);
}

#[test]
fn default_params_are_llama_cpp_defaults() {
    let d = SamplerParams::default();
    assert_eq!((d.temperature, d.top_k, d.top_p, d.min_p), (0.8, 40, 0.95, 0.05));
    assert_eq!((d.repeat_penalty, d.presence_penalty, d.frequency_penalty, d.repeat_last_n), (1.0, 0.0, 0.0, 64));
    // Unseeded defaults differ between calls.
    assert_ne!(SamplerParams::default().seed, SamplerParams::default().seed);
    assert!(SamplerParams::greedy().is_greedy());
    assert!(!d.is_greedy());
}

// ---------------------------------------------------------------- stop strings

/// Pushes `chunks`, collecting emitted text until stopped, then `finish`.
fn run_stops(stops: &[&str], chunks: &[&str]) -> (String, bool) {
    let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
    let mut out = String::new();
    for c in chunks {
        let (emit, stopped) = m.push(c);
        out.push_str(&emit);
        if stopped {
            assert!(m.is_stopped());
            assert_eq!(m.finish(), "");
            return (out, true);
        }
    }
    out.push_str(&m.finish());
    (out, false)
}

#[test]
fn stop_split_over_several_pushes() {
    let mut m = StopMatcher::new(vec!["<|im_end|>".into()]);
    assert_eq!(m.push("Hello"), ("Hello".into(), false));
    assert_eq!(m.push(" world<"), (" world".into(), false));
    assert_eq!(m.held(), "<");
    assert_eq!(m.push("|im"), ("".into(), false));
    assert_eq!(m.push("_en"), ("".into(), false));
    assert_eq!(m.push("d|>trailing"), ("".into(), true));
    assert_eq!(m.matched(), Some("<|im_end|>"));
    assert_eq!(m.push("more"), ("".into(), true));
    assert_eq!(m.finish(), "");
}

#[test]
fn stop_partial_match_that_fails_is_released() {
    let mut m = StopMatcher::new(vec!["</s>".into()]);
    assert_eq!(m.push("a </"), ("a ".into(), false));
    assert_eq!(m.push("b>"), ("</b>".into(), false));
    // A held prefix that turns into another possible start: "<</s" holds "</s" back.
    assert_eq!(m.push("<<"), ("<".into(), false));
    assert_eq!(m.push("/x"), ("</x".into(), false));
    assert_eq!(m.push("x</"), ("x".into(), false));
    // End of stream releases what was held.
    assert_eq!(m.finish(), "</");
    // Overlapping self-prefix: "aab" in "aaab".
    assert_eq!(run_stops(&["aab"], &["a", "a", "a", "b!"]), ("a".into(), true));
    assert_eq!(run_stops(&["aab"], &["aaa", "c"]), ("aaac".into(), false));
}

#[test]
fn stop_multiple_strings() {
    let stops = ["\n\nUser:", "###", "END"];
    assert_eq!(run_stops(&stops, &["one ##", "two ###three"]), ("one ##two ".into(), true));
    assert_eq!(run_stops(&stops, &["x\n\nUse", "r: hi"]), ("x".into(), true));
    assert_eq!(run_stops(&stops, &["x\n\nUse", "d to it. EN", "D"]), ("x\n\nUsed to it. ".into(), true));
    // The stop that ends first wins, whatever the chunking: "cd" ends before "abcdef" does.
    assert_eq!(run_stops(&["abcdef", "cd"], &["abcdef"]), ("ab".into(), true));
    assert_eq!(run_stops(&["abcdef", "cd"], &["abc", "def"]), ("ab".into(), true));
    // Same end: the one that starts first (longer) wins, so nothing of it leaks.
    let mut m = StopMatcher::new(vec!["b".into(), "ab".into()]);
    assert_eq!(m.push("xab"), ("x".into(), true));
    assert_eq!(m.matched(), Some("ab"));
    // Empty stop strings are ignored; no stops at all passes everything through.
    assert_eq!(run_stops(&["", "zz"], &["abc"]), ("abc".into(), false));
    assert_eq!(run_stops(&[], &["a", "b"]), ("ab".into(), false));
}

#[test]
fn stop_multibyte_utf8() {
    // Stop strings and text with 2-, 3- and 4-byte characters; a held prefix ends inside a
    // character of the stop string but always starts on a boundary of the text.
    let stops = ["。\n", "🛑停", "é!"];
    assert_eq!(run_stops(&stops, &["日本語", "です。", "\n次"]), ("日本語です".into(), true));
    assert_eq!(run_stops(&stops, &["ok 🛑", "停 no"]), ("ok ".into(), true));
    assert_eq!(run_stops(&stops, &["ok 🛑", "stop"]), ("ok 🛑stop".into(), false));
    assert_eq!(run_stops(&stops, &["caf", "é", "?", "é", "!"]), ("café?".into(), true));
    let mut m = StopMatcher::new(vec!["🛑停".into()]);
    assert_eq!(m.push("a🛑"), ("a".into(), false));
    assert_eq!(m.held(), "🛑");
    // A different 4-byte character sharing the first 3 bytes of 🛑 is not held.
    let mut m = StopMatcher::new(vec!["🛑".into()]);
    assert_eq!(m.push("🛐x"), ("🛐x".into(), false));
}

#[test]
fn stop_result_is_independent_of_chunking() {
    // Random texts over a small alphabet that makes partial matches frequent, cut at random
    // char boundaries; every chunking must give the same output as one push.
    let alphabet: Vec<char> = "ab<|>é🛑 ".chars().collect();
    let stops = vec!["<|a", "ab🛑", "ééb", "b<b"];
    let mut r = Rng::new(77);
    for case in 0..3000 {
        let len = (r.next_u64() % 24) as usize;
        let text: String = (0..len).map(|_| alphabet[(r.next_u64() % alphabet.len() as u64) as usize]).collect();
        let whole = run_stops(&stops, &[&text]);
        let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).chain([text.len()]).collect();
        let mut chunks = Vec::new();
        let mut at = 0;
        for &b in &bounds[1..] {
            if r.next_u64().is_multiple_of(3) || b == text.len() {
                chunks.push(&text[at..b]);
                at = b;
            }
        }
        let pieces = run_stops(&stops, &chunks);
        assert_eq!(pieces, whole, "case {case}: text {text:?} chunks {chunks:?}");
        // And the reference: cut at the first end of any stop, emit what precedes that stop.
        let mut expect = (text.clone(), false);
        'scan: for &end in &bounds[1..] {
            for s in stops.iter().copied() {
                if text[..end].ends_with(s) {
                    let start = stops
                        .iter()
                        .filter(|t| end >= t.len() && text[..end].ends_with(**t))
                        .map(|t| end - t.len())
                        .min()
                        .unwrap();
                    expect = (text[..start].to_string(), true);
                    break 'scan;
                }
            }
        }
        assert_eq!(whole, expect, "case {case}: text {text:?}");
    }
}

//! Tests of the Nyström operator: streaming state vs the f64 matrix form on random heads
//! (GQA, odd lengths, the degenerate seal boundary, extreme scores), exactness on the landmark
//! keys, the guard, constant state size, validation errors.

use super::*;

/// splitmix64 + Box–Muller.
struct Rng(u64);
impl Rng {
    fn u(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f32 {
        let (a, b) = (self.u().max(1e-300), self.u());
        ((-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()) as f32
    }
    fn vec(&mut self, n: usize, s: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal() * s).collect()
    }
}

#[derive(Clone, Copy)]
struct Case {
    st: O1Settings,
    far: Far,
    nh: usize,
    nkv: usize,
    hd: usize,
    t_len: usize,
    tp: usize,
    /// q and k multiplier (score magnitude ~ qk_scale²).
    qk_scale: f32,
    seed: u64,
}

struct Data {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    scale: f32,
}

fn data(c: &Case) -> Data {
    let mut r = Rng(c.seed);
    Data {
        q: r.vec(c.t_len * c.nh * c.hd, c.qk_scale),
        k: r.vec(c.t_len * c.nkv * c.hd, c.qk_scale),
        v: r.vec(c.t_len * c.nkv * c.hd, 1.0),
        scale: 1.0 / (c.hd as f32).sqrt(),
    }
}

/// Seal from the first tp positions (queries fed in chunks of 7), step the rest.
/// Returns outputs [T − tp, nh, hd], per-step dropped-head counts and the final layer.
fn stream(c: &Case, d: &Data) -> (Vec<f32>, Vec<usize>, O1Layer) {
    let (nh, nkv, hd, tp) = (c.nh, c.nkv, c.hd, c.tp);
    let mut qs = QuerySegments::new(tp, c.st.m_eff(tp), nh, hd);
    for p0 in (0..tp).step_by(7) {
        let p1 = (p0 + 7).min(c.t_len);
        qs.add(p0, &d.q[p0 * nh * hd..p1 * nh * hd]);
    }
    let row = nkv * hd;
    let mut layer = O1Layer::seal(&c.st, c.far, d.scale, nh, nkv, hd, Some(&qs), &d.k[..tp * row], &d.v[..tp * row]).unwrap();
    let mut out = vec![0f32; (c.t_len - tp) * nh * hd];
    let mut dropped = Vec::new();
    for t in tp..c.t_len {
        let o = &mut out[(t - tp) * nh * hd..][..nh * hd];
        dropped.push(layer.step(&d.q[t * nh * hd..][..nh * hd], &d.k[t * row..][..row], &d.v[t * row..][..row], o));
    }
    assert_eq!(layer.len(), c.t_len);
    (out, dropped, layer)
}

fn matrix(c: &Case, d: &Data, guard: Guard) -> MatrixOut {
    let w = |x: &[f32]| x.iter().map(|&y| y as f64).collect::<Vec<f64>>();
    matrix_form(&c.st, c.far, guard, d.scale as f64, c.nh, c.nkv, c.hd, c.tp, &w(&d.q), &w(&d.k), &w(&d.v)).unwrap()
}

/// Max over (t, h) of max_c |a − b| / max(max_c |b|, 1e-6), with where.
fn max_rel(a: &[f32], b: &[f64], nh: usize, hd: usize, t0: usize) -> (f64, usize, usize) {
    let mut worst = (0.0, 0, 0);
    for (r, (ar, br)) in a.chunks(hd).zip(b.chunks(hd)).enumerate() {
        let den = br.iter().fold(1e-6f64, |m, x| m.max(x.abs()));
        let diff = ar.iter().zip(br).fold(0.0f64, |m, (&x, &y)| m.max((x as f64 - y).abs()));
        assert!(ar.iter().all(|x| x.is_finite()), "non-finite streaming output at t={}, h={}", t0 + r / nh, r % nh);
        if diff / den > worst.0 {
            worst = (diff / den, t0 + r / nh, r % nh);
        }
    }
    worst
}

/// Streaming vs matrix form within 1e-5 (the contract, pairs); returns (max rel err, rows
/// dropped in the matrix form).
fn agree(name: &str, c: &Case) -> (f64, usize) {
    agree_within(name, c, 1e-5)
}

fn agree_within(name: &str, c: &Case, tol: f64) -> (f64, usize) {
    let d = data(c);
    let (so, sdrop, _) = stream(c, &d);
    let mo = matrix(c, &d, Guard::Aggregate);
    let (nh, hd) = (c.nh, c.hd);
    assert!(mo.o.iter().all(|x| x.is_finite()), "{name}: non-finite matrix output");
    let (err, t, h) = max_rel(&so, &mo.o[c.tp * nh * hd..], nh, hd, c.tp);
    let mdrop: Vec<usize> = (c.tp..c.t_len).map(|t| (0..nh).filter(|&h| mo.dropped[t * nh + h]).count()).collect();
    let n_drop: usize = mdrop.iter().sum();
    println!(
        "{name}: T={} tp={} W={} S={} m={} group={} skeleton={} max rel err {err:.3e} at t={t} h={h}; dropped rows {n_drop}",
        c.t_len,
        c.tp,
        c.st.window,
        c.st.sinks,
        c.st.m_eff(c.tp),
        nh / c.nkv,
        c.far == Far::Skeleton && c.st.seals_skeleton(c.tp)
    );
    assert!(err <= tol, "{name}: streaming vs matrix form max rel err {err:.3e} at t={t} h={h} (tolerance {tol:e})");
    assert_eq!(sdrop, mdrop, "{name}: guard dropped different rows");
    (err, n_drop)
}

/// A tiny ridge: the skeleton must reproduce exact attention on the landmark keys.
fn st(window: usize, sinks: usize, landmarks: usize) -> O1Settings {
    O1Settings { window, sinks, landmarks, ridge: 1e-6, state: StatePrecision::Pair }
}

#[allow(clippy::too_many_arguments)]
fn case(st: O1Settings, far: Far, nh: usize, nkv: usize, hd: usize, t_len: usize, tp: usize, seed: u64) -> Case {
    Case { st, far, nh, nkv, hd, t_len, tp, qk_scale: 1.0, seed }
}

#[test]
fn streaming_matches_matrix_random_gqa() {
    for (i, &(nh, nkv)) in [(2, 2), (4, 2), (8, 2), (4, 1)].iter().enumerate() {
        for far in [Far::Skeleton, Far::Drop] {
            let c = case(st(16, 4, 12), far, nh, nkv, 16, 173, 97, 10 + i as u64);
            agree(&format!("gqa {nh}/{nkv} {far}"), &c);
        }
    }
    // Odd head dim and lengths, landmark cap above tp/8, sharper scores.
    let mut c = case(st(9, 3, 64), Far::Skeleton, 6, 3, 13, 151, 83, 7);
    c.qk_scale = 1.7;
    agree("odd dims", &c);
}

/// Single-f32 storage (the default): same rows dropped, outputs within 2e-4 of the f64 matrix
/// form (the far field's cancellation amplifies the state's rounding; pairs stay within 1e-5),
/// and the skeleton and accumulators take exactly half the pairs' bytes.
#[test]
fn single_f32_state_agrees_and_halves_the_skeleton() {
    let single = |w, s, m| O1Settings { state: StatePrecision::Single, ..st(w, s, m) };
    let mut worst = 0f64;
    for (i, &(nh, nkv)) in [(2, 2), (4, 2), (8, 2), (4, 1)].iter().enumerate() {
        let c = case(single(16, 4, 12), Far::Skeleton, nh, nkv, 16, 173, 97, 10 + i as u64);
        worst = worst.max(agree_within(&format!("single f32 gqa {nh}/{nkv}"), &c, 2e-4).0);
    }
    let mut c = case(single(8, 2, 16), Far::Skeleton, 4, 2, 16, 130, 64, 21);
    c.qk_scale = 7.0;
    worst = worst.max(agree_within("single f32 extreme", &c, 2e-4).0);
    println!("single f32: worst {worst:.3e}");
    // Bytes: pairs hold one more f32 for each of q̃, k̃, M̂, D̂ and N̂.
    let (nh, nkv, hd) = (4, 2, 16);
    let pc = case(st(16, 4, 12), Far::Skeleton, nh, nkv, hd, 173, 97, 10);
    let sc = Case { st: single(16, 4, 12), ..pc };
    let (pb, sb) = (stream(&pc, &data(&pc)).2.bytes(), stream(&sc, &data(&sc)).2.bytes());
    let m = pc.st.m_eff(pc.tp);
    let lo_floats = nh * m * hd + nkv * m * hd + nh * m * m + nh * (m + m * hd);
    println!("state bytes: pairs {pb}, single {sb}, m {m}");
    assert_eq!(pb - sb, 4 * lo_floats, "single f32 must drop exactly the lo halves");
}

/// `skeleton_bytes` is what a sealed single-f32 skeleton layer holds beyond its window's keys
/// (and the layer's fixed struct): a sink+window layer of the same settings holds exactly that
/// much less.
#[test]
fn skeleton_bytes_is_what_the_layer_holds() {
    for &(nh, nkv, hd, m) in &[(4, 2, 16, 12), (8, 2, 16, 8), (4, 1, 13, 4)] {
        let single = O1Settings { state: StatePrecision::Single, ..st(16, 4, m) };
        let c = case(single, Far::Skeleton, nh, nkv, hd, 173, 97, 3);
        assert_eq!(c.st.m_eff(c.tp), m);
        let with = stream(&c, &data(&c)).2.bytes();
        let drop = Case { far: Far::Drop, ..c };
        let without = stream(&drop, &data(&drop)).2.bytes();
        assert_eq!(with - without, super::skeleton_bytes(nh, nkv, hd, m), "{nh}/{nkv} heads of {hd}, m {m}");
    }
}

#[test]
fn streaming_matches_matrix_degenerate_boundary() {
    let (w, s) = (12, 3);
    for tp in [w + s + 8 - 1, w + s + 8, w + s + 8 + 1] {
        for far in [Far::Skeleton, Far::Drop] {
            let c = case(st(w, s, 8), far, 4, 2, 8, tp + 60, tp, tp as u64);
            agree(&format!("boundary tp={tp} {far}"), &c);
            let d = data(&c);
            let layer = stream(&c, &d).2;
            assert_eq!(layer.has_skeleton(), far == Far::Skeleton && tp > w + s + 8, "tp={tp}: skeleton sealed wrongly");
        }
    }
}

#[test]
fn streaming_matches_matrix_window_over_sequence_and_no_sinks() {
    for far in [Far::Skeleton, Far::Drop] {
        agree(&format!("window > T {far}"), &case(st(300, 4, 16), far, 4, 2, 8, 90, 40, 3));
        agree(&format!("sinks 0 {far}"), &case(st(10, 0, 16), far, 4, 4, 8, 140, 70, 4));
        agree(&format!("sinks = window {far}"), &case(st(6, 6, 4), far, 2, 1, 8, 100, 41, 5));
        agree(&format!("tp=1 {far}"), &case(st(5, 2, 4), far, 2, 1, 8, 40, 1, 6));
    }
}

#[test]
fn aggregate_guard_drops_rows_in_both_forms() {
    // Sharp scores with few landmarks make the skeleton overshoot negative on some rows.
    let mut total = 0;
    for seed in 0..6 {
        let mut c = case(st(4, 1, 4), Far::Skeleton, 4, 2, 8, 160, 40, 100 + seed);
        c.qk_scale = 2.2;
        total += agree(&format!("guard seed {seed}"), &c).1;
    }
    assert!(total > 0, "no row was dropped by the aggregate guard; the test does not exercise it");
}

#[test]
fn extreme_scores_stay_finite_and_agree() {
    for far in [Far::Skeleton, Far::Drop] {
        let mut c = case(st(8, 2, 16), far, 4, 2, 16, 130, 64, 21);
        c.qk_scale = 7.0;
        let d = data(&c);
        let mut smax = 0f64;
        for t in 0..c.t_len {
            for h in 0..c.nh {
                for j in 0..=t {
                    let g = h / (c.nh / c.nkv);
                    let s = dot32(&d.q[(t * c.nh + h) * c.hd..][..c.hd], &d.k[(j * c.nkv + g) * c.hd..][..c.hd]) * d.scale as f64;
                    smax = smax.max(s.abs());
                }
            }
        }
        println!("extreme {far}: max |score| {smax:.1}");
        assert!(smax > 150.0, "scores not extreme enough: {smax}");
        agree(&format!("extreme {far}"), &c);
    }
}

/// Plain exact causal attention in f64 (independent of the module's code paths).
fn exact_attention(q: &[f64], k: &[f64], v: &[f64], nh: usize, nkv: usize, hd: usize, scale: f64) -> Vec<f64> {
    let t_len = q.len() / (nh * hd);
    let mut o = vec![0.0; q.len()];
    for t in 0..t_len {
        for h in 0..nh {
            let g = h / (nh / nkv);
            let qh = &q[(t * nh + h) * hd..][..hd];
            let s: Vec<f64> =
                (0..=t).map(|j| qh.iter().zip(&k[(j * nkv + g) * hd..][..hd]).map(|(a, b)| a * b).sum::<f64>() * scale).collect();
            let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
            let z: f64 = e.iter().sum();
            for (j, ej) in e.iter().enumerate() {
                for cc in 0..hd {
                    o[(t * nh + h) * hd + cc] += ej / z * v[(j * nkv + g) * hd + cc];
                }
            }
        }
    }
    o
}

fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&y| y as f64).collect()
}

#[test]
fn matrix_form_with_window_over_sequence_is_exact_attention() {
    let c = case(st(120, 4, 16), Far::Skeleton, 4, 2, 8, 100, 30, 9);
    let d = data(&c);
    let (q, k, v) = (widen(&d.q), widen(&d.k), widen(&d.v));
    let ex = exact_attention(&q, &k, &v, c.nh, c.nkv, c.hd, d.scale as f64);
    for far in [Far::Skeleton, Far::Drop] {
        for tp in [0, 30, 100] {
            let mo = matrix_form(&c.st, far, Guard::Aggregate, d.scale as f64, c.nh, c.nkv, c.hd, tp, &q, &k, &v).unwrap();
            let (i, diff) =
                mo.o.iter()
                    .zip(&ex)
                    .map(|(a, b)| (a - b).abs())
                    .enumerate()
                    .fold((0, 0.0), |m, (i, x)| if x > m.1 { (i, x) } else { m });
            println!("W ≥ T {far} tp={tp}: max |diff| {diff:.3e} at {i}");
            assert!(diff < 1e-12, "{far} tp={tp}: W ≥ T differs from exact attention by {diff:.3e} at {i}");
        }
    }
    // And a windowed Drop run with a short tail: the prompt rows are exact regardless.
    let mo = matrix_form(&st(5, 1, 4), Far::Drop, Guard::Aggregate, d.scale as f64, c.nh, c.nkv, c.hd, 60, &q, &k, &v).unwrap();
    let diff = mo.o[..60 * c.nh * c.hd].iter().zip(&ex).fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
    assert!(diff < 1e-12, "prompt rows not exact: {diff:.3e}");
}

/// Pins the Nyström convention (w = fu·M): when every prompt segment has a single key value,
/// the landmark keys are the keys, and while every far key is a prompt key the skeleton
/// reproduces exact attention up to the ridge.
#[test]
fn nystrom_is_exact_on_landmark_keys() {
    let (nh, nkv, hd, tp, w) = (2, 1, 8, 64, 16);
    let settings = O1Settings { window: w, sinks: 2, landmarks: 8, ridge: 1e-12, state: StatePrecision::Pair };
    let m = settings.m_eff(tp);
    assert_eq!(m, 8);
    let mut r = Rng(77);
    let kc = r.vec(m * nkv * hd, 1.0); // one key per segment
    let qc = r.vec(m * nh * hd, 1.0); // segment-wise query centres: a well-conditioned Au
    let t_len = tp + w; // every far key of every decode row is a prompt key
    let mut q = r.vec(t_len * nh * hd, 0.05);
    let mut k = r.vec(t_len * nkv * hd, 1.0);
    for p in 0..tp {
        let i = segment_of(p, tp, m);
        k[p * nkv * hd..][..nkv * hd].copy_from_slice(&kc[i * nkv * hd..][..nkv * hd]);
        q[p * nh * hd..][..nh * hd].iter_mut().zip(&qc[i * nh * hd..][..nh * hd]).for_each(|(a, b)| *a += b);
    }
    let v = r.vec(t_len * nkv * hd, 1.0);
    let (q, k, v) = (widen(&q), widen(&k), widen(&v));
    let scale = 1.0 / (hd as f64).sqrt();
    let ex = exact_attention(&q, &k, &v, nh, nkv, hd, scale);
    let mo = matrix_form(&settings, Far::Skeleton, Guard::Aggregate, scale, nh, nkv, hd, tp, &q, &k, &v).unwrap();
    let drop = matrix_form(&settings, Far::Drop, Guard::Aggregate, scale, nh, nkv, hd, tp, &q, &k, &v).unwrap();
    let (mut diff, mut at, mut drop_diff) = (0.0f64, 0, 0.0f64);
    for i in tp * nh * hd..ex.len() {
        if (mo.o[i] - ex[i]).abs() > diff {
            (diff, at) = ((mo.o[i] - ex[i]).abs(), i / (nh * hd));
        }
        drop_diff = drop_diff.max((drop.o[i] - ex[i]).abs());
    }
    println!("skeleton on landmark keys: max |diff| vs exact {diff:.3e} at t={at} (StreamingLLM: {drop_diff:.3e})");
    assert!(diff < 1e-6, "skeleton is not exact on landmark keys: {diff:.3e} at t={at}");
    assert!(drop_diff > 1e-3, "far keys carry no weight; the test does not exercise the skeleton");
}

#[test]
fn per_key_clamp_gives_convex_outputs() {
    let mut c = case(st(4, 1, 4), Far::Skeleton, 4, 2, 8, 160, 40, 100);
    c.qk_scale = 2.2;
    let d = data(&c);
    let mo = matrix(&c, &d, Guard::PerKeyClamp);
    let agg = matrix(&c, &d, Guard::Aggregate);
    let (nh, nkv, hd) = (c.nh, c.nkv, c.hd);
    let mut differs = 0.0f64;
    for t in c.tp..c.t_len {
        for h in 0..nh {
            let g = h / (nh / nkv);
            for cc in 0..hd {
                let vs = (0..=t).map(|j| d.v[(j * nkv + g) * hd + cc] as f64);
                let (lo, hi) = vs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(x), b.max(x)));
                let x = mo.o[(t * nh + h) * hd + cc];
                assert!(x >= lo - 1e-9 && x <= hi + 1e-9, "clamped output {x} outside [{lo}, {hi}] at t={t} h={h} c={cc}");
                differs = differs.max((x - agg.o[(t * nh + h) * hd + cc]).abs());
            }
        }
    }
    println!("per-key clamp vs aggregate guard: max |diff| {differs:.3e}");
    assert!(differs > 1e-6, "per-key clamp had no effect on this data");
}

#[test]
fn state_bytes_constant_and_checkpoint_replays() {
    let c = case(st(32, 4, 16), Far::Skeleton, 4, 2, 16, 2000 + 80, 80, 31);
    let d = data(&c);
    let (nh, nkv, hd, tp) = (c.nh, c.nkv, c.hd, c.tp);
    let row = nkv * hd;
    let mut qs = QuerySegments::new(tp, c.st.m_eff(tp), nh, hd);
    qs.add(0, &d.q[..tp * nh * hd]);
    let mut layer = O1Layer::seal(&c.st, c.far, d.scale, nh, nkv, hd, Some(&qs), &d.k[..tp * row], &d.v[..tp * row]).unwrap();
    let mut o = vec![0f32; nh * hd];
    let (mut b200, mut snap, mut replay) = (0, None, Vec::new());
    for t in tp..c.t_len {
        let _ = layer.step(&d.q[t * nh * hd..][..nh * hd], &d.k[t * row..][..row], &d.v[t * row..][..row], &mut o);
        if t - tp + 1 == 200 {
            b200 = layer.bytes();
            snap = Some(layer.clone());
        }
        if (200..210).contains(&(t - tp)) {
            replay.push(o.clone());
        }
    }
    let b2000 = layer.bytes();
    println!("state bytes after 200 steps {b200}, after 2000 steps {b2000}");
    assert_eq!(b200, b2000, "state grows with context");
    let mut back = snap.unwrap();
    for (n, t) in (tp + 200..tp + 210).enumerate() {
        let _ = back.step(&d.q[t * nh * hd..][..nh * hd], &d.k[t * row..][..row], &d.v[t * row..][..row], &mut o);
        assert_eq!(o, replay[n], "restored checkpoint diverges at step {t}");
    }
    // The exact fallback does grow.
    let short = O1Layer::seal(&c.st, Far::Skeleton, d.scale, nh, nkv, hd, None, &d.k[..10 * row], &d.v[..10 * row]).unwrap();
    assert!(!short.has_skeleton());
}

#[test]
fn bad_settings_are_typed_errors() {
    let e = |s: O1Settings| s.validate().unwrap_err().to_string();
    assert!(e(st(0, 0, 8)).contains("--o1-window"));
    assert!(e(st(4, 5, 8)).contains("--o1-sinks"));
    assert!(e(st(4, 1, 3)).contains("--o1-landmarks"));
    assert!(e(st(4, 1, MAX_LANDMARKS + 1)).contains("--o1-landmarks"));
    assert!(e(O1Settings { ridge: 0.0, ..st(4, 1, 8) }).contains("--o1-ridge"));
    assert!(e(O1Settings { ridge: f64::NAN, ..st(4, 1, 8) }).contains("--o1-ridge"));
    assert!(st(4, 4, 4).validate().is_ok());
    // Seal reports bad settings, shapes and missing query segments instead of panicking.
    let k = vec![0f32; 40 * 2 * 8];
    assert!(matches!(O1Layer::seal(&st(0, 0, 8), Far::Drop, 1.0, 2, 2, 8, None, &k, &k), Err(NystromError::ZeroWindow)));
    assert!(matches!(O1Layer::seal(&st(4, 1, 8), Far::Drop, 1.0, 3, 2, 8, None, &k, &k), Err(NystromError::Shape { .. })));
    assert!(matches!(
        O1Layer::seal(&st(4, 1, 8), Far::Skeleton, 1.0, 2, 2, 8, None, &k, &k),
        Err(NystromError::IncompleteSegments { .. })
    ));
    let qs = QuerySegments::new(40, 5, 2, 8);
    assert!(matches!(
        O1Layer::seal(&st(4, 1, 8), Far::Skeleton, 1.0, 2, 2, 8, Some(&qs), &k, &k),
        Err(NystromError::IncompleteSegments { seen: 0, tp: 40 })
    ));
    let q = vec![0f64; 40 * 2 * 8];
    let kk = vec![0f64; 40 * 2 * 8];
    assert!(matches!(
        matrix_form(&st(4, 1, 8), Far::Skeleton, Guard::Aggregate, 1.0, 2, 2, 8, 41, &q, &kk, &kk),
        Err(NystromError::Shape { .. })
    ));
}

//! Cross-check, outside the workspace (cortiq-train must not depend on cortiq-engine): the
//! train crate's Nyström forward against the engine's `matrix_form` on random heads (GQA, odd dims,
//! tp = 1, the degenerate boundary, scores up to ±150, StreamingLLM). Prints max |diff| and the
//! dropped-row counts; panics if the guards disagree.
//! Run: `cd crates/train/engine_xcheck && CARGO_TARGET_DIR=../../../target-train cargo run --release`.

use cortiq_engine::o1::nystrom as en;
use cortiq_train::gradcheck::Rng;
use cortiq_train::nystrom as tr;

fn main() {
    let mut worst = 0.0f64;
    let cases: &[(usize, usize, usize, usize, usize, usize, usize, usize, f64, bool)] = &[
        // nh, nkv, hd, T, tp, window, sinks, landmarks, qk_scale, skeleton
        (4, 2, 16, 173, 97, 16, 4, 12, 1.0, true),
        (8, 2, 16, 173, 97, 16, 4, 12, 1.0, false),
        (6, 3, 13, 151, 83, 9, 3, 64, 1.7, true),
        (4, 2, 8, 160, 40, 4, 1, 4, 2.2, true),
        (4, 2, 16, 130, 64, 8, 2, 16, 7.0, true),
        (2, 1, 8, 40, 1, 5, 2, 4, 1.0, true),
        (4, 2, 8, 90, 22, 12, 3, 8, 1.0, true),
        (4, 2, 8, 90, 24, 12, 3, 8, 1.0, true),
    ];
    for (n, &(nh, nkv, hd, t, tp, w, s, l, qs, sk)) in cases.iter().enumerate() {
        let mut r = Rng(50 + n as u64);
        let q = r.vec(t * nh * hd, qs);
        let k = r.vec(t * nkv * hd, 1.0);
        let v = r.vec(t * nkv * hd, 1.0);
        let scale = 1.0 / (hd as f64).sqrt();
        let est = en::O1Settings { window: w, sinks: s, landmarks: l, ridge: en::DEFAULT_RIDGE, state: en::StatePrecision::Pair };
        let efar = if sk { en::Far::Skeleton } else { en::Far::Drop };
        let eo = en::matrix_form(&est, efar, en::Guard::Aggregate, scale, nh, nkv, hd, tp, &q, &k, &v).unwrap();
        let cfg = tr::O1Config { window: w, sinks: s, landmarks: l, ridge: tr::DEFAULT_RIDGE, far: if sk { tr::Far::Skeleton } else { tr::Far::Drop } };
        let sh = tr::NyShape { n_heads: nh, n_kv_heads: nkv, head_dim: hd, scale, tp };
        let plan = tr::nystrom_plan(&cfg, &sh, &q, &k).unwrap();
        let (mut o, mut d) = (vec![0.0; q.len()], vec![false; t * nh]);
        tr::nystrom_forward(&cfg, &plan, &sh, &q, &k, &v, &mut o, &mut d);
        let (mut md, mut at) = (0.0f64, 0);
        for i in 0..o.len() {
            let e = (o[i] - eo.o[i]).abs();
            // A NaN is kept (nothing compares greater) and fails the bound below.
            if e > md || e.is_nan() { md = e; at = i; if e.is_nan() { break; } }
        }
        let nd = d.iter().filter(|&&x| x).count();
        println!("case {n}: nh={nh} nkv={nkv} hd={hd} T={t} tp={tp} W={w} S={s} L={l} scale×{qs} {}: max |diff| {md:.3e} at t={} (dropped rows train {nd}, engine {}, same: {})",
            if sk {"skeleton"} else {"drop"}, at / (nh * hd), eo.dropped.iter().filter(|&&x| x).count(), d == eo.dropped);
        worst = if md.is_nan() || worst.is_nan() { f64::NAN } else { worst.max(md) };
        assert!(d == eo.dropped);
    }
    println!("worst {worst:.3e}");
    assert!(worst < 1e-10, "train and engine Nyström forwards differ by {worst:.3e}");
}

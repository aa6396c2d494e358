//! The training loop's guarantees on the fixture's tiny student with f32 masters (the
//! production type): a resumed run continues bit-identically (direct save/load and the run
//! loop's stop flag, i.e. Ctrl-C), a NaN loss stops with an error before any update and leaves
//! the last checkpoint byte-identical, and bad input gives typed errors, never a panic.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use common::Fixture;
use cortiq_testkit::max_err;
use cortiq_train::data::{TokenFile, Windows, pack};
use cortiq_train::gradcheck::Rng;
use cortiq_train::trainer::{Event, RunEnd, RunOptions, TrainConfig, TrainError, Trainer};

/// A deterministic stand-in for the engine's teacher: logits as a smooth function of the
/// window's tokens and the position ([T, V]).
fn synthetic_teacher(v: usize) -> impl FnMut(&[u32]) -> Result<Vec<f32>, String> {
    move |toks: &[u32]| {
        let mut z = Vec::with_capacity(toks.len() * v);
        for (t, &tok) in toks.iter().enumerate() {
            for j in 0..v {
                z.push((3.0 * ((tok as f64 + 1.0) * 0.37 * (j as f64 + 1.0) + 0.1 * t as f64).sin()) as f32);
            }
        }
        Ok(z)
    }
}

/// 7 windows of T + 1 from three random token files.
fn data(fx: &Fixture<f32>) -> Windows {
    let (t, v) = (fx.us("T"), fx.us("vocab") as f64);
    let mut r = Rng(5);
    let files: Vec<TokenFile> = [3 * t + 1, 2 * t + 10, 2 * t + 1]
        .iter()
        .enumerate()
        .map(|(i, &n)| TokenFile { name: format!("f{i}"), tokens: (0..n).map(|_| (r.uniform() * v) as u32).collect() })
        .collect();
    let w = pack(&files, t, Some(1), "training").unwrap();
    assert_eq!(w.len(), 7);
    w
}

fn config(fx: &Fixture<f32>) -> TrainConfig {
    TrainConfig { steps: 6, warmup: 2, lr: 5e-3, min_lr: 5e-4, seed: 11, shuffle: true, ..fx.train_config() }
}

/// Every bit of the training state: master copies, moments, step, cursor.
fn state_bits(tr: &mut Trainer<'_, f32>) -> (Vec<u32>, Vec<u32>, u64, (u64, u64)) {
    let p: Vec<u32> = tr.params.tensors_mut().iter().flat_map(|t| t.iter().map(|x| x.to_bits())).collect();
    let m: Vec<u32> = tr.moments.iter().flat_map(|s| s.m.iter().chain(&s.v).map(|x| x.to_bits())).collect();
    (p, m, tr.step, (tr.cursor.epoch, tr.cursor.pos))
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cortiq-train-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn first_diff(a: &[u32], b: &[u32]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y).or((a.len() != b.len()).then_some(a.len().min(b.len())))
}

#[test]
fn resume_continues_bit_identically() {
    let fx = Fixture::<f32>::load();
    let (cfg, v) = (config(&fx), fx.us("vocab"));
    // Straight: 6 steps (7 windows in batches of 2: the cursor wraps into a second epoch).
    let mut a = Trainer::new(fx.student(), cfg, data(&fx)).unwrap();
    let la: Vec<u64> = (0..6).map(|_| a.train_step(&mut synthetic_teacher(v)).unwrap().loss.to_bits()).collect();
    // 3 steps, save, a fresh trainer loads, 3 more.
    let path = tmp("resume.ckpt");
    let mut b = Trainer::new(fx.student(), cfg, data(&fx)).unwrap();
    let mut lb: Vec<u64> = (0..3).map(|_| b.train_step(&mut synthetic_teacher(v)).unwrap().loss.to_bits()).collect();
    b.save_checkpoint(&path).unwrap();
    let saved = state_bits(&mut b);
    drop(b);
    let mut c = Trainer::new(fx.student(), cfg, data(&fx)).unwrap();
    c.load_checkpoint(&path).unwrap();
    assert_eq!(state_bits(&mut c), saved, "load did not restore the saved state");
    lb.extend((0..3).map(|_| c.train_step(&mut synthetic_teacher(v)).unwrap().loss.to_bits()));
    let (sa, sc) = (state_bits(&mut a), state_bits(&mut c));
    println!("resume: straight losses {:?}", la.iter().map(|&x| f64::from_bits(x)).collect::<Vec<_>>());
    println!(
        "resume: 3 + save + load + 3 {:?}; step {} cursor {:?}; {} master values, {} moment values; first differing master: {:?}, moment: {:?}",
        lb.iter().map(|&x| f64::from_bits(x)).collect::<Vec<_>>(),
        sc.2,
        sc.3,
        sc.0.len(),
        sc.1.len(),
        first_diff(&sa.0, &sc.0),
        first_diff(&sa.1, &sc.1)
    );
    assert_eq!(la, lb, "losses differ after resuming");
    assert!(sa == sc, "training state differs after resuming");
    assert_eq!((sc.2, sc.3), (6, (1, 5)));
    assert!(f64::from_bits(la[5]) < f64::from_bits(la[0]), "the loss did not fall");

    // The run loop with a stop flag raised after step 3 (Ctrl-C): it checkpoints and returns
    // Stopped; a fresh trainer resumes from that file with run() and ends where `a` ended.
    let path2 = tmp("stop.ckpt");
    let stop = AtomicBool::new(false);
    let opts = RunOptions { checkpoint: Some(path2.clone()), checkpoint_every: 0, valid_every: 0 };
    let mut d = Trainer::new(fx.student(), cfg, data(&fx)).unwrap();
    let mut events = vec![];
    let end = d
        .run(&mut synthetic_teacher(v), None, &opts, Some(&stop), &mut |e| {
            if matches!(e, Event::Step(r) if r.step == 3) {
                stop.store(true, Ordering::Relaxed);
            }
            events.push(e.clone());
        })
        .unwrap();
    assert_eq!(end, RunEnd::Stopped);
    assert!(matches!(events.last(), Some(Event::Checkpoint { step: 3, .. })), "no checkpoint on stop: {events:?}");
    let mut e = Trainer::new(fx.student(), cfg, data(&fx)).unwrap();
    e.load_checkpoint(&path2).unwrap();
    let end = e.run(&mut synthetic_teacher(v), None, &opts, None, &mut |_| {}).unwrap();
    assert_eq!(end, RunEnd::Finished);
    assert!(state_bits(&mut e) == sa, "stop + resume through run() differs from the straight run");
    println!("resume through run() after a stop at step 3: identical bits");
    for p in [path, path2] {
        std::fs::remove_file(p).unwrap();
    }
}

#[test]
fn nan_loss_stops_and_keeps_the_last_checkpoint() {
    let fx = Fixture::<f32>::load();
    let (cfg, v) = (config(&fx), fx.us("vocab"));
    // (a) The student diverges: a NaN master after step 3 makes step 4's loss NaN.
    let path = tmp("nan.ckpt");
    let mut tr = Trainer::new(fx.student(), cfg, data(&fx)).unwrap();
    for _ in 0..2 {
        tr.train_step(&mut synthetic_teacher(v)).unwrap();
    }
    tr.save_checkpoint(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    tr.train_step(&mut synthetic_teacher(v)).unwrap();
    tr.params.layers[1].as_mut().unwrap().ffn_norm[5] = f32::NAN;
    let before = state_bits(&mut tr);
    let err = tr.train_step(&mut synthetic_teacher(v)).unwrap_err();
    println!("NaN student: {err}");
    assert!(matches!(err, TrainError::NonFinite { step: 4, what: "loss", .. }), "{err:?}");
    assert!(state_bits(&mut tr) == before, "the failed step changed the training state");
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "the last good checkpoint changed");
    let mut back = Trainer::new(fx.student(), cfg, data(&fx)).unwrap();
    back.load_checkpoint(&path).unwrap();
    assert_eq!(back.step, 2);

    // (b) Through run() with a checkpoint every 2 steps: the teacher turns NaN from its 7th
    // window on (step 4); run stops with an error, the step-2 checkpoint byte-identical, no
    // temp file left, the weights those after step 3 and finite.
    let path = tmp("nan-run.ckpt");
    let opts = RunOptions { checkpoint: Some(path.clone()), checkpoint_every: 2, valid_every: 0 };
    let mut tr = Trainer::new(fx.student(), cfg, data(&fx)).unwrap();
    let mut calls = 0;
    let mut good = synthetic_teacher(v);
    let mut teacher = |w: &[u32]| {
        calls += 1;
        let mut z = good(w)?;
        if calls >= 7 {
            z[fx.us("T") / 2 * v + 3] = f32::NAN;
        }
        Ok::<_, String>(z)
    };
    let mut at_ckpt = None;
    let err = tr
        .run(&mut teacher, None, &opts, None, &mut |e| {
            if let Event::Checkpoint { step, path } = e {
                at_ckpt = Some((*step, std::fs::read(path).unwrap()));
            }
        })
        .unwrap_err();
    println!("NaN teacher: {err}");
    assert!(matches!(err, TrainError::TeacherNonFinite { row: 32, col: 3, .. }), "{err:?}");
    let (step, bytes) = at_ckpt.expect("a checkpoint at step 2");
    assert_eq!(step, 2);
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "the last good checkpoint changed");
    assert!(!Path::new(&format!("{}.tmp", path.display())).exists(), "a temp file was left");
    assert_eq!(tr.step, 3);
    assert!(tr.params.tensors_mut().iter().all(|t| t.iter().all(|x| x.is_finite())));
    std::fs::remove_file(path).unwrap();
    std::fs::remove_file(tmp("nan.ckpt")).unwrap();
}

#[test]
fn bad_input_gives_typed_errors() {
    let fx = Fixture::<f32>::load();
    let (cfg, v, t) = (config(&fx), fx.us("vocab"), fx.us("T"));
    let show = |e: &TrainError| println!("  {e}");
    // No windows at all.
    let e = Trainer::new(fx.student(), cfg, Windows { ctx: t, windows: vec![] }).err().unwrap();
    show(&e);
    assert!(matches!(e, TrainError::NoWindows { .. }));
    // No files, an empty file, files too short for a window.
    for e in [
        pack(&[], t, None, "training").unwrap_err(),
        pack(&[TokenFile { name: "empty.txt".into(), tokens: vec![] }], t, None, "training").unwrap_err(),
        pack(&[TokenFile { name: "short.txt".into(), tokens: vec![1; t] }], t, None, "training").unwrap_err(),
    ] {
        show(&e);
        assert!(matches!(e, TrainError::NoFiles { .. } | TrainError::EmptyFile { .. } | TrainError::NoWindows { .. }));
    }
    // ctx beyond the model's positions (the fixture's RoPE table holds T).
    let long = pack(&[TokenFile { name: "a".into(), tokens: vec![1; 4 * t] }], 2 * t, None, "training").unwrap();
    let e = Trainer::new(fx.student(), TrainConfig { ctx: 2 * t, ..cfg }, long).err().unwrap();
    show(&e);
    assert!(matches!(e, TrainError::CtxTooLong { ctx, max } if ctx == 2 * t && max == t));
    // A token outside the vocabulary.
    let mut w = data(&fx);
    w.windows[4][9] = v as u32;
    let e = Trainer::new(fx.student(), cfg, w).err().unwrap();
    show(&e);
    assert!(matches!(e, TrainError::TokenOutOfVocab { window: 4, .. }));
    // Bad settings.
    let e = Trainer::new(fx.student(), TrainConfig { kl_weight: 1.5, ..cfg }, data(&fx)).err().unwrap();
    show(&e);
    assert!(matches!(e, TrainError::Config(_)));
    // A teacher that fails or returns the wrong shape; the trainer stays usable.
    let mut tr = Trainer::new(fx.student(), cfg, data(&fx)).unwrap();
    let e = tr.train_step(&mut |_: &[u32]| Err::<Vec<f32>, _>("engine out of memory")).unwrap_err();
    show(&e);
    assert!(matches!(e, TrainError::Teacher(_)));
    let e = tr.train_step(&mut |_: &[u32]| Ok::<_, String>(vec![0.0f32; 5])).unwrap_err();
    show(&e);
    assert!(matches!(e, TrainError::TeacherShape { got: 5, .. }));
    assert_eq!(tr.step, 0);
    tr.train_step(&mut synthetic_teacher(v)).unwrap();
    // Checkpoints: corrupt, truncated, another run's, missing; a failed load changes nothing.
    let path = tmp("bad.ckpt");
    tr.save_checkpoint(&path).unwrap();
    let good = std::fs::read(&path).unwrap();
    let before = state_bits(&mut tr);
    let mut flipped = good.clone();
    flipped[200] ^= 1;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("flipped", flipped),
        ("truncated", good[..good.len() - 9].to_vec()),
        ("magic", b"NOTACKPT".iter().chain(&good[8..]).copied().collect()),
    ];
    for (what, bytes) in cases {
        std::fs::write(&path, bytes).unwrap();
        let e = tr.load_checkpoint(&path).unwrap_err();
        println!("  {what}: {e}");
        assert!(matches!(e, TrainError::Checkpoint { .. }), "{what}: {e:?}");
    }
    std::fs::write(&path, &good).unwrap();
    let mut other = Trainer::new(fx.student(), TrainConfig { seed: 12, ..cfg }, data(&fx)).unwrap();
    let e = other.load_checkpoint(&path).unwrap_err();
    show(&e);
    assert!(matches!(e, TrainError::Checkpoint { .. }));
    let e = tr.load_checkpoint(&tmp("missing.ckpt")).unwrap_err();
    show(&e);
    assert!(matches!(e, TrainError::Io { .. }));
    assert!(state_bits(&mut tr) == before, "a failed load changed the trainer");
    std::fs::remove_file(path).unwrap();
}

#[test]
fn validation_reports_the_ppl_ratio() {
    let fx = Fixture::<f32>::load();
    let (cfg, v) = (config(&fx), fx.us("vocab"));
    let tr = Trainer::new(fx.student(), cfg, data(&fx)).unwrap();
    let r = tr.validate(&data(&fx), &mut synthetic_teacher(v)).unwrap();
    println!("validation: {r:?}");
    assert!((r.ppl - r.ce.exp()).abs() < 1e-9 * r.ppl && (r.ppl_ratio - r.ppl / r.teacher_ppl).abs() < 1e-9 * r.ppl_ratio);
    // The student's loss here equals the training step's loss on the same windows (no update).
    let fx64 = Fixture::<f64>::load();
    let t64 = Trainer::new(fx64.student(), fx64.train_config(), fx64.windows()).unwrap();
    let want = fx64.list("loss")[0];
    let got = t64.validate(&fx64.windows(), &mut |w: &[u32]| fx64.teacher_for(w)).unwrap().loss;
    println!("validation loss of the fixture batch {got:.15} vs torch step-0 loss {want:.15}");
    assert!((got - want).abs() < 1e-10 * want);
}

#[test]
fn run_validates_and_checkpoints_on_schedule() {
    let fx = Fixture::<f32>::load();
    let (cfg, v) = (config(&fx), fx.us("vocab"));
    let path = tmp("schedule.ckpt");
    let opts = RunOptions { checkpoint: Some(path.clone()), checkpoint_every: 4, valid_every: 3 };
    let mut tr = Trainer::new(fx.student(), cfg, data(&fx)).unwrap();
    let valid = fx.windows();
    let mut vt = |w: &[u32]| fx.teacher_for(w);
    let mut log = vec![];
    let end = tr
        .run(&mut synthetic_teacher(v), Some((&valid, &mut vt)), &opts, None, &mut |e| {
            log.push(match e {
                Event::Step(r) => format!("step {}", r.step),
                Event::Valid { step, report } => {
                    assert!(report.ppl_ratio.is_finite() && report.ppl_ratio > 0.0);
                    format!("valid {step}")
                }
                Event::Checkpoint { step, .. } => format!("ckpt {step}"),
            })
        })
        .unwrap();
    println!("run events: {log:?}");
    assert_eq!(end, RunEnd::Finished);
    let want = ["step 1", "step 2", "step 3", "valid 3", "step 4", "ckpt 4", "step 5", "step 6", "valid 6", "ckpt 6"];
    assert_eq!(log, want);
    let mut back = Trainer::new(fx.student(), cfg, data(&fx)).unwrap();
    back.load_checkpoint(&path).unwrap();
    assert!(state_bits(&mut back) == state_bits(&mut tr));
    std::fs::remove_file(path).unwrap();
}

/// AdamW's first step moves every parameter with a non-zero gradient by lr·g/(|g| + eps) ≈ ±lr;
/// with `gain_lr_mult` the norm gains move by that multiple and the FFN matrices by lr itself.
#[test]
fn gain_lr_mult_scales_only_the_gains() {
    let fx = Fixture::<f32>::load();
    let v = fx.us("vocab");
    let base = config(&fx);
    // No weight decay: it would add lr·wd·p to the move.
    let adamw = cortiq_train::optim::AdamW { weight_decay: 0.0, ..base.adamw };
    let cfg = TrainConfig { warmup: 0, clip: 0.0, gain_lr_mult: 10.0, adamw, ..base };
    let mut tr = Trainer::new(fx.student(), cfg, data(&fx)).unwrap();
    let before: Vec<Vec<f32>> = tr.params.tensors_mut().iter().map(|t| t.to_vec()).collect();
    let gains: Vec<bool> = tr.params.tensors_kinds_mut().iter().map(|(_, k)| *k == cortiq_train::model::Kind::Gain).collect();
    assert!(gains.iter().any(|&g| g) && gains.iter().any(|&g| !g), "the fixture has both kinds");
    let lr = tr.train_step(&mut synthetic_teacher(v)).unwrap().lr;
    let after: Vec<Vec<f32>> = tr.params.tensors_mut().iter().map(|t| t.to_vec()).collect();
    assert_eq!(before.len(), gains.len());
    for (i, ((b, a), &gain)) in before.iter().zip(&after).zip(&gains).enumerate() {
        let want = if gain { 10.0 * lr } else { lr };
        // The largest move of a tensor is the full step (some entries' gradients are ~0).
        let max = max_err(b.iter().zip(a).map(|(x, y)| (x - y).abs() as f64)); // NaN if any move is NaN
        assert!((max - want).abs() <= 0.02 * want, "tensor {i} (gain {gain}): largest move {max:.3e}, expected {want:.3e}");
    }
}

//! `cortiq convert --linear-core vmf_phase` (issue 16) end to end on the tiny llama fixture
//! (as a .cmf with a byte-level tokenizer): the chosen layers become vmf_phase layers, the
//! hybrid loads and scores a text, auto picks layers ≥ 2 only, and bad input is a one-line
//! error.

mod common;

use std::path::Path;
use std::process::Command;

use common::{TempDir, byte_tokenizer_json, copy_fixture, fixture};

fn cortiq(args: &[&str]) -> (String, String, bool) {
    let out = Command::new(env!("CARGO_BIN_EXE_cortiq")).args(args).output().expect("spawn cortiq");
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned(), out.status.success())
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The llama fixture (vocab 512 ⊇ the 256 bytes) as a .cmf with a byte tokenizer.
/// (Its own source copy per `dir`: tests run in parallel.)
fn tiny(dir: &TempDir) -> std::path::PathBuf {
    let tag = format!("lin-src-{}", dir.0.file_name().unwrap().to_string_lossy());
    let src = copy_fixture("llama", &tag);
    std::fs::write(src.0.join("tokenizer.json"), byte_tokenizer_json()).unwrap();
    let model = dir.0.join("tiny.cmf");
    let (_, err, ok) = cortiq(&["convert", "-m", s(&src.0), "-o", s(&model)]);
    assert!(ok, "convert: {err}");
    model
}

fn ppl(model: &Path, text: &Path) -> f64 {
    let (out, err, ok) =
        cortiq(&["ppl", "-m", s(model), "-f", s(text), "-c", "32", "--chunks", "4", "--numerics", "exact", "-t", "1"]);
    assert!(ok, "ppl: {err}");
    let line = out.lines().find(|l| l.starts_with("PPL = ")).unwrap_or_else(|| panic!("no PPL in {out:?}"));
    line[6..].split_whitespace().next().unwrap().parse().unwrap()
}

/// `convert --linear-core vmf_phase` of layer 2 alone (2 calibration windows of 32 tokens,
/// nphase 4) plus `extra`: (stderr, success).
fn fold_layer2(model: &Path, out: &Path, extra: &[&str]) -> (String, bool) {
    fold_layers(model, out, "2", extra)
}

/// `fold_layer2` on the layers of `layers` (a list, as `--layers` takes it).
fn fold_layers(model: &Path, out: &Path, layers: &str, extra: &[&str]) -> (String, bool) {
    let calib = fixture("llama").join("README.md");
    let mut args = vec![
        "convert",
        "-m",
        s(model),
        "-o",
        s(out),
        "--linear-core",
        "vmf_phase",
        "--layers",
        layers,
        "--calib",
        s(&calib),
        "--calib-ctx",
        "32",
        "--calib-windows",
        "2",
        "--nphase",
        "4",
    ];
    args.extend(extra);
    let (_, err, ok) = cortiq(&args);
    (err, ok)
}

#[test]
fn linear_core_writes_a_hybrid_that_runs() {
    let dir = TempDir::new("linearize");
    let model = tiny(&dir);
    let calib = fixture("qwen2").join("README.md");
    let text = fixture("gemma3").join("README.md");
    let out = dir.0.join("hybrid.cmf");
    let args = |layers: &str, o: &Path| -> Vec<String> {
        [
            "convert",
            "-m",
            s(&model),
            "-o",
            s(o),
            "--linear-core",
            "vmf_phase",
            "--layers",
            layers,
            "--calib",
            s(&calib),
            "--calib-ctx",
            "32",
            "--calib-windows",
            "3",
            "--nphase",
            "4",
        ]
        .iter()
        .map(|x| x.to_string())
        .collect()
    };
    let run = |v: Vec<String>| cortiq(&v.iter().map(String::as_str).collect::<Vec<_>>());
    let (_, err, ok) = run(args("1,3", &out));
    assert!(ok, "convert --linear-core: {err}");
    println!("{err}");
    assert!(err.contains("layer   1: fold relative error") && err.contains("layer   3: fold relative error"), "{err}");
    let m = cortiq_engine::load::load(&out).expect("the hybrid loads").model;
    let vmf: Vec<usize> =
        (0..4).filter(|&i| matches!(m.cfg.layers[i].mixer, cortiq_engine::config::MixerKind::VmfPhase(_))).collect();
    assert_eq!(vmf, [1, 3]);
    let (p0, p1) = (ppl(&model, &text), ppl(&out, &text));
    println!("ppl: original {p0:.3}, hybrid (fold only) {p1:.3}");
    assert!(p1.is_finite() && p1 > 0.0);
    // --kl-base: the hybrid against the original, and the original against itself.
    let kl = |m: &Path| -> (f64, f64) {
        let (out, err, ok) = cortiq(&[
            "ppl",
            "-m",
            s(m),
            "-f",
            s(&text),
            "-c",
            "32",
            "--chunks",
            "4",
            "--numerics",
            "exact",
            "-t",
            "1",
            "--kl-base",
            s(&model),
        ]);
        assert!(ok, "ppl --kl-base: {err}");
        let num = |key: &str| -> f64 {
            let l = out.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("no {key} in {out:?}"));
            l[key.len()..].trim_start_matches([' ', '=']).split([' ', '%']).next().unwrap().parse().unwrap()
        };
        (num("KL(base || model)"), num("top-1 agreement"))
    };
    let (k0, t0) = kl(&model);
    assert!(k0 == 0.0 && t0 == 100.0, "a model against itself: KL {k0}, top-1 {t0}%");
    let (k1, t1) = kl(&out);
    println!("hybrid vs original: KL {k1:.4}, top-1 {t1:.1}%");
    assert!(k1 > 0.0 && t1 < 100.0, "the fold changes the distributions: KL {k1}, top-1 {t1}%");
    let healed = heal_both_stages(&dir, &out, &model, &calib, &text);
    for (extra, want) in [
        (vec![], "give --stage transfer"),
        (vec!["--stage", "transfer", "--o1-window", "8"], "--o1-window: not a setting"),
        (vec!["--stage", "transfer", "--vmf-lr-mult", "8"], "--vmf-lr-mult: a setting of --stage distill"),
        (vec!["--stage", "distill", "--ctx", "32", "--vmf-lr-mult", "0"], "--vmf-lr-mult 0: must be"),
    ] {
        let mut v = vec![
            "polish",
            "-m",
            s(&out),
            "--teacher",
            s(&model),
            "-o",
            s(&healed),
            "--force",
            "--train",
            s(&calib),
            "--valid",
            s(&text),
        ];
        v.extend(extra.iter().copied());
        let (_, err, ok) = cortiq(&v);
        assert!(!ok && err.contains(want) && err.trim().lines().count() == 1, "{extra:?}: {err}");
    }
    let (_, err, ok) = cortiq(&[
        "polish",
        "-m",
        s(&model),
        "--teacher",
        s(&model),
        "-o",
        s(&healed),
        "--force",
        "--stage",
        "transfer",
        "--train",
        s(&calib),
        "--valid",
        s(&text),
    ]);
    assert!(!ok && err.contains("no vmf_phase layers"), "{err}");
    // auto: half of the 4 layers, never 0 or 1.
    let auto = dir.0.join("auto.cmf");
    let (_, err, ok) = run(args("auto:0.5", &auto));
    assert!(ok, "auto: {err}");
    assert!(err.contains("converting layers [2, 3]"), "{err}");
    assert!(err.contains("bypass cost on the copy probe"), "{err}");
    // Bad input, one line each.
    for (layers, extra, want) in [
        ("9", vec![], "layer 9 does not exist"),
        ("auto:0", vec![], "auto:F needs a fraction"),
        ("1,1", vec![], "named twice"),
        ("x", vec![], "expected auto:F or a comma-separated list"),
        ("1", vec!["--quant", "f16"], "keeps the source's stored weights"),
        ("1", vec!["--nphase", "0"], "--nphase"),
        ("1", vec!["--keep-embeddings-as", "q8_0"], "keeps the source's stored weights"),
        ("auto:0.5", vec!["--recall-weight", "nan"], "--recall-weight"),
    ] {
        let mut v = args(layers, &dir.0.join("bad.cmf"));
        v.extend(extra.iter().map(|x| x.to_string()));
        let (_, err, ok) = run(v);
        assert!(!ok && err.contains(want) && err.trim().lines().count() == 1, "--layers {layers} {extra:?}: {err}");
    }
    let (_, err, ok) = cortiq(&["convert", "-m", s(&model), "-o", s(&dir.0.join("b.cmf")), "--linear-core", "mamba"]);
    assert!(!ok && err.contains("the linear cores are: vmf_phase"), "{err}");
    let (_, err, ok) =
        cortiq(&["convert", "-m", s(&fixture("llama")), "-o", s(&dir.0.join("b.cmf")), "--linear-core", "vmf_phase"]);
    assert!(!ok && err.contains("convert the folder first"), "{err}");
}

/// The heal of the hybrid `out` against `model`: stage 1 (each converted layer fitted to the
/// teacher's attention output; training error down, held out never worse) then stage 2 (KL end
/// to end; the held-out KL falls). Returns the stage-1 output (`healed.cmf`).
/// Stage 2 of the heal of `healed` against `model` into `distilled`, a few steps: the held-out
/// KL(teacher ‖ student) of the last validation below the first.
fn distill(healed: &Path, model: &Path, distilled: &Path, calib: &Path, text: &Path) {
    let (_, err, ok) = cortiq(&[
        "polish",
        "-m",
        s(healed),
        "--teacher",
        s(model),
        "-o",
        s(distilled),
        "--stage",
        "distill",
        "--train",
        s(calib),
        "--valid",
        s(text),
        "--ctx",
        "32",
        "--steps",
        "8",
        "--lr",
        "3e-4",
        "--warmup",
        "1",
        "--valid-every",
        "4",
        "--valid-windows",
        "2",
        "--kl-weight",
        "1",
        "-t",
        "1",
    ]);
    assert!(ok, "polish --stage distill: {err}");
    // The held-out KL(teacher ‖ student) of each validation.
    let kls: Vec<f64> = err
        .lines()
        .filter(|l| l.starts_with("valid @"))
        .filter_map(|l| l.split("(KL ").nth(1))
        .map(|r| r.split(')').next().unwrap().parse().unwrap())
        .collect();
    println!("distill: held-out KL {kls:?}");
    assert!(kls.len() == 3 && kls[2] < kls[0], "{err}");
}

/// Stage 1 of the heal of `out` against `model` into `healed`, small settings; checks the report
/// of each of its `n_layers` converted layers: training error down by a fifth at least, held
/// out never worse (the best held-out step is kept; this tiny random model's held-out text is
/// unlike its training text: no gain there is promised).
fn transfer(out: &Path, model: &Path, healed: &Path, calib: &Path, text: &Path, n_layers: usize) {
    let (_, err, ok) = cortiq(&[
        "polish",
        "-m",
        s(out),
        "--teacher",
        s(model),
        "-o",
        s(healed),
        "--stage",
        "transfer",
        "--train",
        s(calib),
        "--valid",
        s(text),
        "--ctx",
        "32",
        "--far-windows",
        "6",
        "--steps",
        "40",
        "--batch",
        "2",
        "--lr",
        "1e-2",
        "--valid-every",
        "10",
        "-t",
        "1",
    ]);
    assert!(ok, "polish --teacher: {err}");
    let pair = |l: &str, key: &str| -> (f64, f64) {
        let v: Vec<f64> = l
            .split(key)
            .nth(1)
            .unwrap()
            .split([',', ')'])
            .next()
            .unwrap()
            .split(" -> ")
            .map(|x| x.trim().parse().unwrap())
            .collect();
        (v[0], v[1])
    };
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("held-out relative error")).collect();
    assert_eq!(lines.len(), n_layers, "{err}");
    for l in lines {
        let (held, train) = (pair(l, "held-out relative error "), pair(l, "training batches "));
        println!("transfer: held-out {held:?}, training {train:?}");
        assert!(train.1 < 0.8 * train.0 && held.1 <= held.0, "{l}");
    }
}

fn heal_both_stages(dir: &TempDir, out: &Path, model: &Path, calib: &Path, text: &Path) -> std::path::PathBuf {
    // Stage 1 of the heal: each converted layer fitted to the teacher's attention output.
    let healed = dir.0.join("healed.cmf");
    transfer(out, model, &healed, calib, text, 2);
    let p2 = ppl(&healed, &text);
    println!("ppl: healed (stage 1) {p2:.3}");
    assert!(p2.is_finite());
    // Stage 2: KL end to end against the original, the vmf_phase parameters trained.
    let distilled = dir.0.join("distilled.cmf");
    distill(&healed, model, &distilled, calib, text);
    let p3 = ppl(&distilled, &text);
    println!("ppl: healed (stage 2) {p3:.3}");
    healed
}

/// A value bias (Qwen2's) is folded into the output bias: softmax passes b_v through unchanged,
/// so the hybrid's `vmf_out.bias` is the original out_proj·b_v and the layer still runs.
#[test]
fn value_bias_becomes_the_output_bias() {
    use cortiq_engine::mixers::attention::Attention;
    use cortiq_engine::mixers::vmf::VmfPhase;
    let dir = TempDir::new("linearize-vbias");
    let src = copy_fixture("qwen2", "lin-vbias-src");
    std::fs::write(src.0.join("tokenizer.json"), byte_tokenizer_json()).unwrap();
    let model = dir.0.join("qwen2.cmf");
    let (_, err, ok) = cortiq(&["convert", "-m", s(&src.0), "-o", s(&model)]);
    assert!(ok, "convert: {err}");
    let out = dir.0.join("hybrid.cmf");
    let (err, ok) = fold_layer2(&model, &out, &[]);
    assert!(ok, "convert --linear-core: {err}");
    let orig = cortiq_engine::load::load(&model).unwrap().model;
    let hyb = cortiq_engine::load::load(&out).unwrap().model;
    let a: &Attention = orig.layers[2].mixer.downcast_ref().unwrap();
    let v: &VmfPhase = hyb.layers[2].mixer.downcast_ref().unwrap();
    let (d, nh, hd, g) = (orig.cfg.d_model, orig.cfg.n_heads, orig.cfg.head_dim, orig.cfg.n_heads / orig.cfg.n_kv_heads);
    let (wo, bv) = (a.w.wo.to_f32(), a.w.bv.clone().expect("the qwen2 fixture has a value bias"));
    assert!(bv.iter().any(|&x| x != 0.0));
    assert_eq!(v.w.out_b.len(), d);
    for r in 0..d {
        let want: f64 = (0..nh * hd).map(|c| wo[r * nh * hd + c] as f64 * bv[(c / hd / g) * hd + c % hd] as f64).sum();
        assert!((v.w.out_b[r] as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()), "row {r}: {} vs {want}", v.w.out_b[r]);
    }
    let text = fixture("gemma3").join("README.md");
    assert!(ppl(&out, &text).is_finite());
}

/// `--out-norm`: the fold writes each head's least-squares scale as its output-norm gains and
/// leaves out_proj as the original o_proj; the hybrid runs. Without --linear-core the flag is
/// a one-line error.
#[test]
fn out_norm_fold_puts_the_scales_in_the_gains() {
    use cortiq_engine::mixers::attention::Attention;
    use cortiq_engine::mixers::vmf::VmfPhase;
    let dir = TempDir::new("linearize-onorm");
    let model = tiny(&dir);
    let out = dir.0.join("hybrid.cmf");
    let (err, ok) = fold_layer2(&model, &out, &["--out-norm"]);
    assert!(ok, "convert --linear-core --out-norm: {err}");
    let orig = cortiq_engine::load::load(&model).unwrap().model;
    let hyb = cortiq_engine::load::load(&out).unwrap().model;
    let a: &Attention = orig.layers[2].mixer.downcast_ref().unwrap();
    let v: &VmfPhase = hyb.layers[2].mixer.downcast_ref().unwrap();
    let (nh, hd) = (orig.cfg.n_heads, orig.cfg.head_dim);
    assert_eq!(v.w.core.o_norm.len(), nh * hd);
    for h in 0..nh {
        let g = &v.w.core.o_norm[h * hd..(h + 1) * hd];
        assert!(g.iter().all(|&x| x == g[0]) && g[0].is_finite() && g[0] != 0.0, "head {h}: gains {g:?}");
    }
    assert_eq!(v.w.out.to_f32(), a.w.wo.to_f32(), "out_proj is o_proj unscaled");
    let text = fixture("gemma3").join("README.md");
    assert!(ppl(&out, &text).is_finite());
    let (_, err, ok) = cortiq(&["convert", "-m", s(&model), "-o", s(&dir.0.join("b.cmf")), "--out-norm"]);
    assert!(
        !ok && err.contains("--out-norm, --window, --sinks and --window-split are settings of --linear-core")
            && err.trim().lines().count() == 1,
        "{err}"
    );
}

/// `--window 8 --sinks 2`: layer 2 keeps its attention tensors as stored and gains the core and
/// the slot (`VmfWindow`); the fold beats sink+window alone on its calibration rows; the hybrid
/// runs. The window's settings are checked, one line each.
/// `--window W --sinks S` on two layers splits their budget of 2·(S + W) exact positions by
/// what each loses to a short span: each layer's sinks (S, 4S, 16S) and window (W/4 .. 2W) a
/// candidate, the two within the budget, written to the file and run; the split's summed error
/// is no worse than (S, W) on both. `--window-split off` (the default) keeps (S, W) on every layer.
#[test]
fn window_split_shares_the_budget() {
    use cortiq_engine::mixers::vmf_window::VmfWindow;
    let dir = TempDir::new("linearize-split");
    let model = tiny(&dir);
    let convert = |out: &Path, split: &str| {
        let (err, ok) = fold_layers(&model, out, "2,3", &["--window", "6", "--sinks", "1", "--window-split", split]);
        assert!(ok, "convert --window-split {split}: {err}");
        err
    };
    let spans = |out: &Path| -> Vec<(usize, usize)> {
        let m = cortiq_engine::load::load(out).unwrap().model;
        [2, 3]
            .iter()
            .map(|&il| {
                let c = m.layers[il].mixer.downcast_ref::<VmfWindow>().expect("windowed").cfg;
                (c.sinks, c.window)
            })
            .collect()
    };
    let split = dir.0.join("split.cmf");
    let err = convert(&split, "on");
    let line = err.lines().find(|l| l.starts_with("window split")).unwrap_or_else(|| panic!("no split line: {err}"));
    let num = |key: &str| -> f64 { line.split(key).next().unwrap().rsplit(' ').next().unwrap().parse().unwrap() };
    let (summed, uniform) = (num(" summed"), num(" at 1+6 on every layer"));
    assert!(summed <= uniform, "{line}");
    let got = spans(&split);
    assert!(
        got.iter().all(|(s, w)| [1, 4, 16].contains(s) && [1, 3, 6, 9, 12].contains(w))
            && got.iter().map(|(s, w)| s + w).sum::<usize>() <= 14,
        "{got:?}: {line}"
    );
    assert!(ppl(&split, &fixture("gemma3").join("README.md")).is_finite());
    let plain = dir.0.join("plain.cmf");
    let err = convert(&plain, "off");
    assert!(!err.contains("window split"), "{err}");
    assert_eq!(spans(&plain), vec![(1, 6), (1, 6)]);
}

#[test]
fn window_fold_keeps_the_attention_and_adds_the_slot() {
    use cortiq_engine::mixers::attention::Attention;
    use cortiq_engine::mixers::vmf_window::VmfWindow;
    let dir = TempDir::new("linearize-window");
    let model = tiny(&dir);
    let out = dir.0.join("hybrid.cmf");
    let (err, ok) = fold_layer2(&model, &out, &["--window", "8", "--sinks", "2"]);
    assert!(ok, "convert --linear-core --window: {err}");
    println!("{err}");
    let line = err.lines().find(|l| l.starts_with("layer   2:")).unwrap_or_else(|| panic!("no report: {err}"));
    let num = |key: &str| -> f64 {
        line.split(key).nth(1).unwrap().split([',', ';', '(', ')']).next().unwrap().trim().parse().unwrap()
    };
    let (alone, fold, cos) = (num("sink+window alone relative error"), num("with the fold"), num("(cosine"));
    assert!(fold < alone, "the fold ({fold}) against sink+window alone ({alone})");
    assert!(cos > 0.0 && cos <= 1.0 && cos * cos >= 1.0 - fold - 1e-3, "cosine {cos} with relative error {fold}");
    let orig = cortiq_engine::load::load(&model).unwrap().model;
    let hyb = cortiq_engine::load::load(&out).unwrap().model;
    let a: &Attention = orig.layers[2].mixer.downcast_ref().unwrap();
    let w: &VmfWindow = hyb.layers[2].mixer.downcast_ref().expect("layer 2 is windowed");
    assert_eq!((w.cfg.window, w.cfg.sinks), (8, 2));
    for (x, y) in [(&w.att.wq, &a.w.wq), (&w.att.wk, &a.w.wk), (&w.att.wv, &a.w.wv), (&w.att.wo, &a.w.wo)] {
        assert_eq!(x.to_f32(), y.to_f32(), "the attention's tensors are kept");
    }
    let (nh, d) = (orig.cfg.n_heads, orig.cfg.d_model);
    assert_eq!((w.slot.rows, w.slot.cols, w.slot_b.len()), (nh, d, nh));
    assert_eq!(w.core.o_norm.len(), nh * orig.cfg.head_dim, "the window's core runs with its output norm");
    let text = fixture("gemma3").join("README.md");
    let p32 = ppl(&out, &text);
    assert!(p32.is_finite());
    // `--f32-as q8r`: the same fold, its f32 matrices stored in 8 bits, every other byte kept.
    let out8 = dir.0.join("hybrid-q8r.cmf");
    let (err, ok) = fold_layer2(&model, &out8, &["--window", "8", "--sinks", "2", "--f32-as", "q8r"]);
    assert!(ok && err.contains("stored the fold's f32 matrices as q8r"), "--f32-as q8r: {err}");
    let h8 = cortiq_engine::load::load(&out8).unwrap().model;
    let w8: &VmfWindow = h8.layers[2].mixer.downcast_ref().expect("layer 2 is windowed");
    assert_eq!(w8.slot.dtype.name(), "q8r", "the slot's map");
    assert_eq!(w8.att.wq.to_f32(), a.w.wq.to_f32(), "the attention's tensors are kept");
    let p8 = ppl(&out8, &text);
    // 8-bit rows (one scale per 32 values) move the fold a little, not to another model.
    assert!((p8 / p32 - 1.0).abs() < 0.02, "q8r {p8} against f32 {p32}");
    assert!(!dir.0.join("hybrid-q8r.cmf.fold.tmp").exists(), "the temporary fold is removed");
    // Both stages of the heal train the windowed layer (exact part, core and slot); the healed
    // files keep it windowed and run.
    let healed = dir.0.join("healed.cmf");
    transfer(&out, &model, &healed, &text, &text, 1);
    let h = cortiq_engine::load::load(&healed).unwrap().model;
    let hw: &VmfWindow = h.layers[2].mixer.downcast_ref().expect("layer 2 is still windowed");
    assert_ne!(hw.slot.to_f32(), w.slot.to_f32(), "stage 1 left the slot's map as folded");
    assert!(ppl(&healed, &text).is_finite());
    let distilled = dir.0.join("distilled.cmf");
    distill(&healed, &model, &distilled, &fixture("llama").join("README.md"), &text);
    let h2 = cortiq_engine::load::load(&distilled).unwrap().model;
    let dw: &VmfWindow = h2.layers[2].mixer.downcast_ref().expect("layer 2 is still windowed after stage 2");
    assert_ne!(dw.slot.to_f32(), hw.slot.to_f32(), "stage 2 left the slot's map as stage 1 wrote it");
    assert!(ppl(&distilled, &text).is_finite());
    // Windows that never reach past the sinks and window would train nothing: refused.
    for stage in ["transfer", "distill"] {
        let (_, err, ok) = cortiq(&[
            "polish",
            "-m",
            s(&healed),
            "--teacher",
            s(&model),
            "-o",
            s(&dir.0.join("short.cmf")),
            "--stage",
            stage,
            "--train",
            s(&fixture("llama").join("README.md")),
            "--valid",
            s(&text),
            "--ctx",
            "10",
        ]);
        assert!(
            !ok && err.contains("--ctx 10: layer 2 keeps 10 positions exact") && err.trim().lines().count() == 1,
            "{stage}: {err}"
        );
    }
    for (extra, want) in [
        (vec!["--sinks", "2"], "--sinks 2: a setting of --window"),
        (vec!["--window", "20"], "must reach at least 16 positions past them"),
    ] {
        let (err, ok) = fold_layer2(&model, &dir.0.join("bad.cmf"), &extra);
        assert!(!ok && err.contains(want) && err.trim().lines().count() == 1, "{extra:?}: {err}");
    }
    let (_, err, ok) = cortiq(&["convert", "-m", s(&model), "-o", s(&dir.0.join("b.cmf")), "--window", "8"]);
    assert!(!ok && err.contains("settings of --linear-core") && err.trim().lines().count() == 1, "{err}");
}

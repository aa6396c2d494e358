//! `cortiq polish` end to end on the tiny gemma3 fixture (converted to a .cmf with a byte-level
//! tokenizer; its one global layer on the Nyström operator, the three sliding ones exact):
//! the polished .cmf records its O(1) settings and `ppl` serves it in O(1) mode by default
//! (`--exact` turns that off), with a lower perplexity than the O(1) conversion before the polish; a run stopped after 4 of 6 steps (`--stop-after`, the path Ctrl-C
//! takes) and resumed writes the same bytes as the run that never stopped; bad input is a
//! one-line error.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{TempDir, byte_tokenizer_json, copy_fixture, fixture};
use cortiq_formats::cmf::Cmf;

/// Share of the O(1) conversion's ppl excess over the teacher that 6 polish steps must close
/// (measured 32%).
const MIN_EXCESS_CLOSED: f64 = 0.15;

fn cortiq(args: &[&str]) -> (String, String, bool) {
    let out = Command::new(env!("CARGO_BIN_EXE_cortiq")).args(args).output().expect("spawn cortiq");
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned(), out.status.success())
}

/// The gemma3 fixture as a .cmf with a byte tokenizer, and three texts (the fixtures' READMEs:
/// generated files nobody edits).
struct Setup {
    dir: TempDir,
    model: PathBuf,
    train: Vec<PathBuf>,
    valid: PathBuf,
}

fn setup(tag: &str) -> Setup {
    let src = copy_fixture("gemma3", &format!("{tag}-src"));
    std::fs::write(src.0.join("tokenizer.json"), byte_tokenizer_json()).unwrap();
    let dir = TempDir::new(tag);
    let model = dir.0.join("tiny.cmf");
    let (_, err, ok) = cortiq(&["convert", "-m", src.0.to_str().unwrap(), "-o", model.to_str().unwrap()]);
    assert!(ok, "convert: {err}");
    let text = |arch: &str| fixture(arch).join("README.md");
    Setup { dir, model, train: vec![text("llama"), text("qwen2")], valid: text("gemma3") }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn polish_args<'a>(st: &'a Setup, out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["polish", "-m", s(&st.model), "-o", out, "--train", s(&st.train[0]), s(&st.train[1])];
    v.extend(["--valid", s(&st.valid), "--ctx", "32", "--o1-window", "4", "--o1-sinks", "1", "--o1-landmarks", "4"]);
    v.extend([
        "--lr",
        "1e-3",
        "--warmup",
        "1",
        "--checkpoint-every",
        "2",
        "--valid-every",
        "3",
        "--valid-windows",
        "2",
        "-t",
        "1",
    ]);
    v.extend(extra);
    v
}

fn ppl(model: &str, valid: &str, extra: &[&str]) -> (f64, String) {
    let mut args = vec!["ppl", "-m", model, "-f", valid, "-c", "32", "--chunks", "8", "--numerics", "exact", "-t", "1"];
    args.extend(extra);
    let (out, err, ok) = cortiq(&args);
    assert!(ok, "{args:?}: {err}");
    let line = out.lines().find(|l| l.starts_with("PPL = ")).unwrap_or_else(|| panic!("no PPL in {out:?}"));
    (line[6..].split_whitespace().next().unwrap().parse().unwrap(), err)
}

#[test]
fn polish_writes_an_o1_cmf_and_resumes_bit_identically() {
    let st = setup("polish-e2e");
    let a = st.dir.0.join("a.cmf");
    let (_, polish_err, ok) = cortiq(&polish_args(&st, s(&a), &["--steps", "6"]));
    eprintln!("{polish_err}");
    assert!(ok, "polish: {polish_err}");
    assert!(polish_err.contains("valid @ step 0") && polish_err.contains("valid @ step 6"), "{polish_err}");
    let h = Cmf::open(&a).unwrap().header.o1.expect("the polished .cmf records its O(1) settings");
    assert_eq!((h.window, h.sinks, h.landmarks, h.trained_ctx, h.steps), (4, 1, 4, 32, 6));

    // Stopped after 4 steps (checkpoint, no output), then resumed: the same bytes.
    let b = st.dir.0.join("b.cmf");
    let (_, err, ok) = cortiq(&polish_args(&st, s(&b), &["--steps", "6", "--stop-after", "4"]));
    assert!(ok && err.contains("stopped at step 4 of 6"), "{err}");
    assert!(!b.exists() && st.dir.0.join("b.cmf.ckpt").exists());
    let (_, err, ok) = cortiq(&polish_args(&st, s(&b), &["--steps", "6", "--resume"]));
    assert!(ok && err.contains("resumed") && err.contains("at step 4 of 6"), "{err}");
    let (ba, bb) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    let first = ba.iter().zip(&bb).position(|(x, y)| x != y);
    assert!(
        ba.len() == bb.len() && first.is_none(),
        "resumed output differs (sizes {} {}, first byte {first:?})",
        ba.len(),
        bb.len()
    );

    // Served in O(1) mode by default; --exact serves exact attention; the unpolished model
    // with the same flags is the O(1) conversion before the polish.
    let (p_o1, err) = ppl(s(&a), s(&st.valid), &[]);
    assert!(err.contains("polished model: serving in O(1) mode (window 4, sinks 1, landmarks 4"), "{err}");
    let (p_ex, err) = ppl(s(&a), s(&st.valid), &["--exact"]);
    assert!(!err.contains("O(1) mode"), "{err}");
    let flags = ["--o1", "--o1-far", "nystrom", "--o1-window", "4", "--o1-sinks", "1", "--o1-landmarks", "4"];
    let (p_o1_flags, _) = ppl(s(&a), s(&st.valid), &flags);
    let (p_before, _) = ppl(s(&st.model), s(&st.valid), &flags);
    let (p_teacher, _) = ppl(s(&st.model), s(&st.valid), &[]);
    eprintln!(
        "tiny gemma3, ctx 32: teacher {p_teacher:.4}; O(1) before {p_before:.4}; polished O(1) {p_o1:.4} (explicit flags {p_o1_flags:.4}), polished --exact {p_ex:.4}"
    );
    assert_eq!(p_o1, p_o1_flags, "the default O(1) plan must be the recorded settings");
    assert_ne!(p_o1, p_ex, "--exact must change the serving");
    // The polish improves the O(1) model, not merely changes it: measured (6 steps, lr 1e-3)
    // teacher 2473.98, O(1) before 2764.79, polished 2670.70, i.e. 32% of the O(1) excess over
    // the teacher closed (the run's own validation ratio 1.1338 -> 1.0972). The bound asks for
    // 15%, half the measurement; a polish that trains the wrong way, or not at all, closes none.
    let closed = (p_before - p_o1) / (p_before - p_teacher);
    eprintln!("polish closed {:.1}% of the O(1) excess over the teacher", 100.0 * closed);
    assert!(p_before > p_teacher, "the O(1) conversion should cost ppl before the polish ({p_before} vs {p_teacher})");
    assert!(
        closed >= MIN_EXCESS_CLOSED,
        "the polish closed {:.1}% of the O(1) excess (before {p_before}, after {p_o1}, teacher {p_teacher}); expected at least {:.0}%",
        100.0 * closed,
        100.0 * MIN_EXCESS_CLOSED
    );
    let ratio = |step: u32| -> f64 {
        let l = polish_err
            .lines()
            .find(|l| l.starts_with(&format!("valid @ step {step}:")))
            .unwrap_or_else(|| panic!("{polish_err}"));
        l.split("ratio ").nth(1).and_then(|r| r.split_whitespace().next()).unwrap().parse().unwrap()
    };
    assert!(ratio(6) < ratio(0), "validation ratio did not improve: step 0 {} -> step 6 {}", ratio(0), ratio(6));
    let (_, err, ok) = cortiq(&["ppl", "-m", s(&a), "-f", s(&st.valid), "-c", "32", "--exact", "--o1"]);
    assert!(!ok && err.lines().count() == 1 && err.contains("--exact"), "{err}");
}

#[test]
fn polish_bad_input_is_one_line() {
    let st = setup("polish-bad");
    let out = st.dir.0.join("x.cmf");
    let empty = st.dir.0.join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let m = s(&st.model);
    let v = s(&st.valid);
    let base = |extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = [
            "polish",
            "-m",
            m,
            "-o",
            s(&out),
            "--valid",
            v,
            "--o1-window",
            "4",
            "--o1-sinks",
            "1",
            "--o1-landmarks",
            "4",
            "-t",
            "1",
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        a.extend(extra.iter().map(|x| x.to_string()));
        a
    };
    let t0 = s(&st.train[0]);
    let cases: Vec<(Vec<String>, &str)> = vec![
        (base(&["--ctx", "32"]), "no training files"),
        (base(&["--ctx", "32", "--train", s(&empty)]), "empty.txt: empty"),
        (base(&["--ctx", "1024", "--train", t0]), "--ctx 1024 exceeds the model's 512"),
        (base(&["--ctx", "16", "--train", t0]), "too short for a skeleton"),
        (base(&["--ctx", "32", "--train", v]), "given both for training and for validation"),
        (base(&["--ctx", "32", "--train", t0, "--kl-weight", "2"]), "--kl-weight"),
        (base(&["--ctx", "32", "--train", t0, "--resume"]), "--resume: no checkpoint"),
        (base(&["--ctx", "32", "--train", "/nonexistent/t.txt"]), "/nonexistent/t.txt"),
        // Weights blown up by a learning rate of 1e30: the next step fails (a non-finite loss,
        // or the Nyström ridge system of overflowed landmarks) before its update; the error
        // names the last good checkpoint.
        (
            base(&["--ctx", "32", "--train", t0, "--lr", "1e30", "--warmup", "0", "--steps", "20", "--checkpoint-every", "1"]),
            "the last good checkpoint is",
        ),
    ];
    for (args, want) in cases {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let (_, err, ok) = cortiq(&a);
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
        assert!(!ok, "{a:?}: accepted\n{err}");
        assert_eq!(lines.len(), 1, "{a:?}: expected one error line, got {err:?}");
        assert!(lines[0].contains(want), "{a:?}: {:?} does not say {want:?}", lines[0]);
        assert!(!out.exists(), "{a:?}: wrote an output");
    }
}

/// A real SIGINT (Ctrl-C) while training: the run finishes the current step, writes a
/// resumable checkpoint, says so and exits 0 without writing OUT; --resume goes on from there.
#[test]
fn ctrl_c_leaves_a_resumable_checkpoint() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let st = setup("polish-sigint");
    let out = st.dir.0.join("c.cmf");
    let args = polish_args(&st, s(&out), &["--steps", "400"]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_cortiq")).args(&args).stderr(Stdio::piped()).spawn().expect("spawn cortiq");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    // Wait for the second step, then interrupt.
    for line in lines.by_ref() {
        let line = line.unwrap();
        let at_step = line.starts_with("step 2/");
        seen.push(line);
        if at_step {
            break;
        }
    }
    assert!(seen.last().is_some_and(|l| l.starts_with("step 2/")), "no step 2: {seen:?}");
    let kill = Command::new("kill").args(["-INT", &child.id().to_string()]).status().expect("run kill");
    assert!(kill.success());
    seen.extend(lines.map(|l| l.unwrap()));
    let status = child.wait().unwrap();
    let err = seen.join("\n");
    assert!(status.success(), "exit {status:?} after SIGINT:\n{err}");
    let stopped = seen.iter().find(|l| l.starts_with("stopped at step ")).unwrap_or_else(|| panic!("no stop line:\n{err}"));
    let step: u64 = stopped["stopped at step ".len()..].split_whitespace().next().unwrap().parse().unwrap();
    assert!((2..400).contains(&step), "{stopped}");
    assert!(!out.exists(), "an interrupted run must not write OUT");
    let ckpt = st.dir.0.join("c.cmf.ckpt");
    assert!(ckpt.exists(), "no checkpoint after SIGINT");
    let (_, err, ok) = cortiq(&polish_args(&st, s(&out), &["--steps", "400", "--resume", "--stop-after", "1"]));
    assert!(ok && err.contains(&format!("at step {step} of 400")), "{err}");
    assert!(err.contains(&format!("stopped at step {} of 400", step + 1)), "{err}");
}

/// --init starts the student from another model's weights with the same teacher: a run
/// initialised from a polished output validates at step 0 exactly where that run ended.
#[test]
fn init_continues_from_a_polished_model() {
    let st = setup("polish-init");
    let a = st.dir.0.join("a.cmf");
    let (_, err_a, ok) = cortiq(&polish_args(&st, s(&a), &["--steps", "3", "--store", "f32"]));
    assert!(ok, "{err_a}");
    let b = st.dir.0.join("b.cmf");
    let (_, err_b, ok) = cortiq(&polish_args(&st, s(&b), &["--steps", "1", "--init", s(&a)]));
    assert!(ok, "{err_b}");
    let ratio = |err: &str, step: u32| -> String {
        let l = err.lines().find(|l| l.starts_with(&format!("valid @ step {step}:"))).unwrap_or_else(|| panic!("{err}"));
        l.split(" [").next().unwrap()["valid @ step N".len()..].to_string()
    };
    let (end_a, start_b) = (ratio(&err_a, 3), ratio(&err_b, 0));
    eprintln!("run a ended {end_a}; run b --init a started {start_b}");
    assert_eq!(end_a, start_b, "--init a.cmf must start where a ended");
    // A model of another shape is refused, naming --init.
    let other = fixture("llama");
    let (_, err, ok) = cortiq(&polish_args(&st, s(&st.dir.0.join("x.cmf")), &["--steps", "1", "--init", s(&other)]));
    assert!(!ok && err.contains("--init") && err.lines().filter(|l| l.starts_with("error")).count() == 1, "{err}");
}

/// `--o1-far linear` end to end on the tiny model: the polish fits each global layer's far field
/// and writes a .cmf that `ppl` serves as sink+window with it by default (the state then holds
/// the far field's bytes beside the window), `--o1-far none` drops it, and the source model,
/// which carries none, is refused with a one-line error.
#[test]
fn polish_far_field_writes_a_served_cmf() {
    let st = setup("far");
    let out = st.dir.0.join("far.cmf");
    let args = [
        "polish",
        "-m",
        s(&st.model),
        "-o",
        s(&out),
        "--o1-far",
        "linear",
        "--train",
        s(&st.train[0]),
        s(&st.train[1]),
        "--valid",
        s(&st.valid),
        "--ctx",
        "64",
        "--o1-window",
        "8",
        "--o1-sinks",
        "1",
        "--far-rank",
        "4",
        "--far-windows",
        "6",
        "--steps",
        "60",
        "--batch",
        "2",
        "-t",
        "1",
    ];
    let (_, err, ok) = cortiq(&args);
    assert!(ok, "polish --o1-far linear: {err}");
    assert!(err.contains("with a far field"), "{err}");
    let (with, e1) = ppl(s(&out), s(&st.valid), &[]);
    assert!(e1.contains("with its learned far field"), "served by default: {e1}");
    // --o1 on a model with a far field is its served default (the best measured policy).
    let (with_o1, e3) = ppl(s(&out), s(&st.valid), &["--o1"]);
    assert!(e3.contains("with its learned far field") && with_o1 == with, "--o1 {with_o1} vs served default {with}: {e3}");
    let (without, e2) = ppl(s(&out), s(&st.valid), &["--kv-window", "8", "--kv-sinks", "1", "--o1-far", "none"]);
    let bytes = |e: &str| -> usize {
        let l =
            e.lines().find(|l| l.starts_with("state at the end of a chunk: ")).unwrap_or_else(|| panic!("no state line: {e}"));
        l["state at the end of a chunk: ".len()..].split_whitespace().next().unwrap().parse().unwrap()
    };
    assert!(bytes(&e1) > bytes(&e2), "the far field's state is counted: {} vs {}", bytes(&e1), bytes(&e2));
    assert!(with.is_finite() && without.is_finite() && with != without, "the far field changes the scores: {with} vs {without}");
    // The polish measured the window curves: the served plan splits the windows by them.
    assert!(e1.contains("windows split by the model's curves"), "{e1}");
    // --o1-budget: every policy holds at most the bytes of sink+window 8 (1 sink), each spending
    // them its own way (the far state, the scores, the split all come out of the same bytes).
    let (_, e_sw) = ppl(s(&out), s(&st.valid), &["--kv-window", "8", "--kv-sinks", "1", "--o1-far", "none", "--o1-split", "off"]);
    let cap = bytes(&e_sw);
    for (i, extra) in [
        &["--o1-far", "none", "--o1-split", "off"][..],
        &["--o1-far", "none"],
        &["--o1-far", "none", "--kv-evict", "score"],
        &[],
        &["--kv-evict", "score"],
    ]
    .into_iter()
    .enumerate()
    {
        let mut a = vec!["--o1-budget", "8", "--kv-sinks", "1"];
        a.extend(extra);
        let (p, e) = ppl(s(&out), s(&st.valid), &a);
        let b = bytes(&e);
        eprintln!("--o1-budget 8 {extra:?}: {b} bytes (sink+window 8: {cap}), ppl {p}");
        assert!(b <= cap && p.is_finite(), "{extra:?}: {b} bytes over the budget's {cap}");
        if i < 2 {
            assert_eq!(b, cap, "{extra:?}: sink+window (split or not) fills its own budget exactly");
        }
    }
    // The Nyström skeleton under a budget: its landmarks first, the window the rest (4
    // landmarks on this model take more than sink+window 8, so the budget is 24).
    let (_, e_sw24) =
        ppl(s(&out), s(&st.valid), &["--kv-window", "24", "--kv-sinks", "1", "--o1-far", "none", "--o1-split", "off"]);
    let (p, e) = ppl(
        s(&out),
        s(&st.valid),
        &["--o1", "--o1-far", "nystrom", "--o1-budget", "24", "--o1-sinks", "1", "--o1-landmarks", "4"],
    );
    eprintln!(
        "--o1 --o1-far nystrom --o1-budget 24 --o1-landmarks 4: {} bytes (sink+window 24: {}), ppl {p}",
        bytes(&e),
        bytes(&e_sw24)
    );
    assert!(bytes(&e) <= bytes(&e_sw24) && p.is_finite() && e.contains("landmarks 4 (m_eff 4)"), "{e}");
    let (_, err, ok) =
        cortiq(&["ppl", "-m", s(&st.model), "-f", s(&st.valid), "-c", "64", "--kv-window", "8", "--o1-far", "linear"]);
    // (The ppl progress lines before it are its ordinary stderr.)
    let last = err.lines().last().unwrap_or_default();
    assert!(!ok && last.starts_with("error: ") && last.contains("no trained far field"), "{err}");
}

/// `polish --far-rule auto` fits beside sink+window, then chooses each layer's rule on the
/// held-out windows (one line per layer) and records the score layers; the polished model is
/// served with exactly those: the plain rules when the choice is unanimous, a mix otherwise.
#[test]
fn polish_far_rule_auto_chooses_per_layer() {
    let st = setup("auto");
    let out = st.dir.0.join("auto.cmf");
    let mut args = vec!["polish", "-m", s(&st.model), "-o", s(&out), "--o1-far", "linear", "--far-rule", "auto"];
    args.extend(["--train", s(&st.train[0]), s(&st.train[1]), "--valid", s(&st.valid), "--ctx", "64"]);
    args.extend(["--o1-window", "8", "--o1-sinks", "1", "--far-rank", "4", "--far-windows", "6", "--steps", "60"]);
    args.extend(["--batch", "2", "-t", "1"]);
    let (_, err, ok) = cortiq(&args);
    assert!(ok, "polish --far-rule auto: {err}");
    let choices: Vec<bool> =
        err.lines().filter(|l| l.contains("held out with score eviction")).map(|l| l.ends_with(": score eviction")).collect();
    println!("{err}");
    assert!(!choices.is_empty(), "no per-layer choice: {err}");
    let (served, e) = ppl(s(&out), s(&st.valid), &["--kv-window", "8", "--kv-sinks", "1"]);
    let (window, _) = ppl(s(&out), s(&st.valid), &["--kv-window", "8", "--kv-sinks", "1", "--kv-evict", "window"]);
    let (score, _) = ppl(s(&out), s(&st.valid), &["--kv-window", "8", "--kv-sinks", "1", "--kv-evict", "score"]);
    println!("served {served}, window {window}, score {score}, choices {choices:?}");
    assert!(served.is_finite() && window != score, "the rules differ on this model: {window} vs {score}");
    if choices.iter().all(|&c| c) {
        assert_eq!(served, score, "every layer chose score eviction");
    } else if choices.iter().all(|&c| !c) {
        assert_eq!(served, window, "every layer chose sink+window");
        assert!(e.contains("serving sink+window"), "{e}");
    } else {
        assert!(served != window && served != score, "a mix of the rules: {served} vs {window} / {score}");
        assert!(e.contains("score eviction on the layers it chose"), "{e}");
    }
}

/// Stage 2 (`--stage distill`) on a stage-1 output: the far fields train end to end (the run
/// reports its validation ratio before and after), the result is served with its far field
/// like its source and scores differently; and the stage flags' errors, one line each.
#[test]
fn polish_far_stage_two_distills_the_far_fields() {
    let st = setup("far-s2");
    let s1 = st.dir.0.join("s1.cmf");
    let s2 = st.dir.0.join("s2.cmf");
    let common = |m: &Path, out: &Path| -> Vec<String> {
        let mut v: Vec<String> =
            ["polish", "-m", s(m), "-o", s(out), "--o1-far", "linear", "--train", s(&st.train[0]), s(&st.train[1])]
                .iter()
                .map(|x| x.to_string())
                .collect();
        v.extend(["--valid", s(&st.valid), "--ctx", "64", "-t", "1"].map(String::from));
        v
    };
    let mut a1 = common(&st.model, &s1);
    a1.extend(
        ["--o1-window", "8", "--o1-sinks", "1", "--far-rank", "4", "--far-windows", "4", "--steps", "20"].map(String::from),
    );
    let (_, err, ok) = cortiq(&a1.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(ok, "stage 1: {err}");
    let mut a2 = common(&s1, &s2);
    a2.extend(
        ["--stage", "distill", "--steps", "4", "--lr", "1e-3", "--far-lr", "1e-2", "--kl-weight", "1", "--valid-every", "2"]
            .map(String::from),
    );
    let (_, err, ok) = cortiq(&a2.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(ok, "stage 2: {err}");
    assert!(err.contains("far fields train beside the model's rules") && err.contains("polished 4 steps"), "{err}");
    let (p1, e1) = ppl(s(&s1), s(&st.valid), &[]);
    let (p2, e2) = ppl(s(&s2), s(&st.valid), &[]);
    eprintln!("served ppl: stage 1 {p1}, stage 2 {p2}");
    assert!(e2.contains("with its learned far field") && e1.contains("with its learned far field"), "{e2}");
    assert!(p2.is_finite() && p2 != p1, "stage 2 changed nothing: {p1} vs {p2}");
    // Exact attention is the source model's: stage 2 trained nothing else.
    let (x1, _) = ppl(s(&s1), s(&st.valid), &["--exact"]);
    let (x2, _) = ppl(s(&s2), s(&st.valid), &["--exact"]);
    assert_eq!(x1, x2, "stage 2 without --distill-ffn must leave the model's own weights");
    // Errors.
    let out = st.dir.0.join("x.cmf");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            {
                let mut a = common(&st.model, &out);
                a.extend(["--stage", "distill"].map(String::from));
                a
            },
            "carries no learned far field",
        ),
        (
            {
                let mut a = common(&s1, &out);
                a.extend(["--stage", "distill", "--far-rule", "auto"].map(String::from));
                a
            },
            "a stage-1 setting",
        ),
        (
            {
                let mut a = common(&s1, &out);
                a.retain(|x| x != "--o1-far" && x != "linear");
                a.extend(["--stage", "distill"].map(String::from));
                a
            },
            "give --o1-far linear",
        ),
        (
            {
                let mut a = common(&s1, &out);
                a.extend(["--distill-ffn"].map(String::from));
                a
            },
            "--distill-ffn needs --stage distill",
        ),
        (
            {
                let mut a = common(&st.model, &out);
                a.extend(["--stage".to_string(), "distill".to_string(), "--init".to_string(), s(&s1).to_string()]);
                a
            },
            "give stage 1's output as -m",
        ),
        (
            {
                let mut a = common(&s1, &out);
                a.extend(["--stage", "distill", "--o1-window", "8"].map(String::from));
                a
            },
            "stage 2 serves MODEL's own settings",
        ),
    ];
    for (args, want) in cases {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let (_, err, ok) = cortiq(&a);
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
        assert!(!ok && lines.len() == 1 && lines[0].contains(want), "{a:?}: {err:?} does not say {want:?}");
        assert!(!out.exists(), "{a:?}: wrote an output");
    }
}

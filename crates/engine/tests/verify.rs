//! The verify of speculative decoding (issue 13): `forward_verify` over k positions equals k
//! single decode steps bit for bit, and `verify_keep` of any prefix leaves the state exactly
//! where decoding that prefix leaves it (the next step's logits are compared bitwise) — for
//! every mixer (attention, GatedDeltaNet, KDA, MLA, short convolution, MoE FFNs) from the
//! committed fixtures, in every numerics mode, at draft lengths on both sides of the chunk
//! attention's GEMM threshold, and in O(1) mode (sealed global layers, Gemma 3's sliding
//! layers bounded to rings that have wrapped; before the seal the fallback's checkpoint).

mod common;

use common::{fixture, ids};
use cortiq_engine::load::load;
use cortiq_engine::o1::O1Plan;
use cortiq_engine::o1::nystrom::{DEFAULT_RIDGE, Far, O1Settings, StatePrecision};
use cortiq_engine::state::SeqState;
use cortiq_engine::{Logits, Model, Numerics, VerifyJournal};

/// Position of the first bitwise difference, if any.
fn first_diff(a: &[f32], b: &[f32]) -> Option<(usize, f32, f32)> {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).enumerate().find(|(_, (x, y))| x.to_bits() != y.to_bits()).map(|(i, (x, y))| (i, *x, *y))
}

/// Deterministic draft ids below the vocabulary (the tests' xorshift).
fn draft_ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    cortiq_testkit::XorShift(seed | 1).ids(n, vocab)
}

/// How the sequence's state is made.
#[derive(Clone, Copy, Debug)]
enum Mode {
    Plain,
    /// O(1) decode sealed at the prompt's end (tp = the prompt).
    O1Sealed,
    /// O(1) decode whose seal is still ahead (tp past the verified positions): the fallback.
    O1Pending,
}

fn new_state(m: &Model, mode: Mode, prompt: usize) -> SeqState {
    let plan = |tp| O1Plan {
        tp,
        settings: O1Settings { window: 4, sinks: 2, landmarks: 4, ridge: DEFAULT_RIDGE, state: StatePrecision::Pair },
        far: Far::Skeleton,
        check: None,
        split: false,
    };
    match mode {
        Mode::Plain => m.new_state(128),
        Mode::O1Sealed => m.new_state_o1(128, plan(prompt)).unwrap(),
        Mode::O1Pending => m.new_state_o1(128, plan(prompt + 40)).unwrap(),
    }
}

/// For each draft length k: verify == k steps; for each keep in 0..=k, keep then one more step
/// == that step after decoding the kept prefix; a second verify after a partial keep (the
/// journal reused) == steps again.
fn check(name: &str, path: &std::path::Path, num: Numerics, mode: Mode) {
    let mut model: Model = load(path).unwrap_or_else(|e| panic!("{name}: {e}")).model;
    model.set_numerics(num);
    let v = model.cfg.vocab;
    let prompt = &ids(&fixture(name).join("tokens.json"))[..20];
    let mut base = new_state(&model, mode, prompt.len());
    model.forward(prompt, &mut base, Logits::None).unwrap();
    let probe = draft_ids(1, v, 99)[0];
    for (k, seed) in [(1, 3), (3, 5), (9, 7)] {
        let draft = draft_ids(k, v, seed);
        // Reference: single steps; after each prefix, the probe token's logits.
        let mut st = base.clone();
        let (mut steps, mut next) = (Vec::new(), Vec::new());
        for t in draft.iter().map(Some).chain([None]) {
            next.push(model.forward(&[probe], &mut st.clone(), Logits::Last).unwrap());
            if let Some(&t) = t {
                steps.extend(model.forward(&[t], &mut st, Logits::Last).unwrap());
            }
        }
        assert!(first_diff(&next[0], &next[k]).is_some(), "{name}: the prefix does not change the next logits");
        let mut journal = VerifyJournal::default();
        for (keep, next_kept) in next.iter().enumerate() {
            let mut st = base.clone();
            let logits = model.forward_verify(&draft, &mut st, &mut journal).unwrap();
            assert_eq!(st.len, prompt.len() + k);
            if let Some((i, a, b)) = first_diff(&logits, &steps) {
                panic!(
                    "{name} {num:?} {mode:?} k={k}: verify logits differ from single steps at position {} ({a} vs {b})",
                    i / v
                );
            }
            model.verify_keep(&mut st, &mut journal, keep).unwrap();
            assert_eq!(st.len, prompt.len() + keep);
            // The journal is reused: a second verify from the kept state equals steps from it.
            let again = model.forward_verify(&[probe, draft[0]], &mut st, &mut journal).unwrap();
            assert_eq!(first_diff(&again[..v], next_kept), None, "{name} {num:?} {mode:?} k={k}: state after keeping {keep}");
            model.verify_keep(&mut st, &mut journal, 1).unwrap();
            assert_eq!(st.len, prompt.len() + keep + 1);
        }
    }
    println!("{name} {num:?} {mode:?}: verify == steps, every kept prefix == its steps (bitwise, vocab {v})");
}

fn all_modes(name: &str) {
    for num in [Numerics::Exact, Numerics::Fast, Numerics::LlamaCpp] {
        let mut model = cortiq_engine::load::load(&fixture(name)).unwrap().model;
        model.set_numerics(num);
        if common::sinks_refuse_llamacpp(name, &model, num) {
            continue;
        }
        check(name, &fixture(name), num, Mode::Plain);
    }
    check(name, &fixture(name).join("model.gguf"), Numerics::Fast, Mode::Plain);
}

#[test]
fn verify_dense_llama() {
    all_modes("llama");
}

#[test]
fn verify_dense_qwen2() {
    all_modes("qwen2");
}

#[test]
fn verify_dense_qwen3() {
    all_modes("qwen3");
}

#[test]
fn verify_gemma3_sliding() {
    all_modes("gemma3");
}

#[test]
fn verify_qwen3_5() {
    all_modes("qwen3_5");
}

#[test]
fn verify_qwen3_5_moe() {
    all_modes("qwen3_5_moe");
}

#[test]
fn verify_qwen3_next() {
    all_modes("qwen3_next");
}

#[test]
fn verify_lfm2() {
    all_modes("lfm2");
}

#[test]
fn verify_kimi_linear() {
    all_modes("kimi_linear");
}

#[test]
fn verify_granite_mamba2() {
    all_modes("granitemoehybrid");
}

#[test]
fn verify_falcon_h1() {
    all_modes("falcon_h1");
}

#[test]
fn verify_ministral3() {
    all_modes("ministral3");
}

#[test]
fn verify_nemotron_h() {
    all_modes("nemotron_h");
}

#[test]
fn verify_gpt_oss_sinks() {
    all_modes("gpt_oss");
}

#[test]
fn verify_llama_vmf() {
    all_modes("llama_vmf");
}

#[test]
fn verify_llama_vmf_window() {
    all_modes("llama_vmfw");
}

/// O(1) decode: sealed global layers (and Gemma 3's sliding layers, their rings of 8 long
/// wrapped at 20 positions), and a plan whose seal is still ahead.
#[test]
fn verify_o1() {
    for name in ["llama", "gemma3", "qwen3_5"] {
        for num in [Numerics::Exact, Numerics::Fast] {
            check(name, &fixture(name), num, Mode::O1Sealed);
        }
        check(name, &fixture(name), Numerics::Exact, Mode::O1Pending);
    }
}

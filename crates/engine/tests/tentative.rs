//! The speculative pair (issue 4's state API): `forward_tentative([a, b])` equals two single
//! decode steps bit for bit, and rolling back to its checkpoint leaves the state exactly where
//! one step leaves it — for every mixer (attention, GatedDeltaNet, KDA, MLA, short
//! convolution, MoE FFNs), from the committed fixtures, in every numerics mode.

mod common;

use common::{fixture, ids};
use cortiq_engine::load::load;
use cortiq_engine::{Logits, Model, Numerics};

/// Position of the first bitwise difference, if any.
fn first_diff(a: &[f32], b: &[f32]) -> Option<(usize, f32, f32)> {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).enumerate().find(|(_, (x, y))| x.to_bits() != y.to_bits()).map(|(i, (x, y))| (i, *x, *y))
}

fn check(name: &str, path: &std::path::Path, num: Numerics) {
    let mut model: Model = load(path).unwrap_or_else(|e| panic!("{name}: {e}")).model;
    model.set_numerics(num);
    let toks = ids(&fixture(name).join("tokens.json"));
    let p = toks.len().min(40) - 3;
    let (prompt, a, b, c) = (&toks[..p], toks[p], toks[p + 1], toks[p + 2]);
    let mut base = model.new_state(128);
    model.forward(prompt, &mut base, Logits::None).unwrap();
    let v = model.cfg.vocab;

    // Reference: two single steps, then a third from the one-step state.
    let mut one = model.new_state(128);
    model.forward(prompt, &mut one, Logits::None).unwrap();
    let la = model.forward(&[a], &mut one, Logits::Last).unwrap();
    let mut two = model.new_state(128);
    model.forward(prompt, &mut two, Logits::None).unwrap();
    model.forward(&[a], &mut two, Logits::None).unwrap();
    let lb = model.forward(&[b], &mut two, Logits::Last).unwrap();
    let lc_after_a = model.forward(&[c], &mut one, Logits::Last).unwrap();
    let lc_after_b = model.forward(&[c], &mut two, Logits::Last).unwrap();

    // The pair, accepted: same logits, and the state continues like two steps.
    let mut st = model.new_state(128);
    model.forward(prompt, &mut st, Logits::None).unwrap();
    let mut st2 = model.new_state(128);
    model.forward(prompt, &mut st2, Logits::None).unwrap();
    let (pair, _) = model.forward_tentative([a, b], &mut st).unwrap();
    assert_eq!(st.len, prompt.len() + 2);
    assert_eq!(first_diff(&pair[..v], &la), None, "{name} {num:?}: first position differs from a single step");
    assert_eq!(first_diff(&pair[v..], &lb), None, "{name} {num:?}: second position differs from two single steps");
    let next = model.forward(&[c], &mut st, Logits::Last).unwrap();
    assert_eq!(first_diff(&next, &lc_after_b), None, "{name} {num:?}: state after an accepted pair");

    // The pair, rejected: rollback to the checkpoint = one step.
    let (_, cp) = model.forward_tentative([a, b], &mut st2).unwrap();
    st2.rollback(cp);
    assert_eq!(st2.len, prompt.len() + 1);
    let next = model.forward(&[c], &mut st2, Logits::Last).unwrap();
    assert_eq!(first_diff(&next, &lc_after_a), None, "{name} {num:?}: state after a rejected second position");
    // A sanity check that the comparison can fail: a or b changes the next logits.
    assert!(first_diff(&lc_after_a, &lc_after_b).is_some(), "{name}: one step and two steps gave the same logits");
    println!("{name} {num:?}: pair == two steps, rollback == one step (bitwise, vocab {v})");
}

fn all_modes(name: &str) {
    for num in [Numerics::Exact, Numerics::Fast, Numerics::LlamaCpp] {
        check(name, &fixture(name), num);
    }
    check(name, &fixture(name).join("model.gguf"), Numerics::Fast);
}

#[test]
fn tentative_pair_qwen3_5() {
    all_modes("qwen3_5");
}

#[test]
fn tentative_pair_qwen3_5_moe() {
    all_modes("qwen3_5_moe");
}

#[test]
fn tentative_pair_qwen3_next() {
    all_modes("qwen3_next");
}

#[test]
fn tentative_pair_lfm2() {
    all_modes("lfm2");
}

#[test]
fn tentative_pair_kimi_linear() {
    all_modes("kimi_linear");
}

#[test]
fn tentative_pair_dense_qwen3() {
    all_modes("qwen3");
}

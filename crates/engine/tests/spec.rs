//! Speculative decoding equals plain decoding (issue 13): `generate_spec` gives `generate`'s
//! tokens, token for token, greedy and sampled (temperature 0.8, fixed seeds), for every
//! architecture fixture and the O(1) mode, with the n-gram drafter and with an oracle drafter
//! that proposes the plain output with planted mistakes (so drafts are kept whole, in part and
//! not at all); the state after generation equals plain decoding's (the next step's logits,
//! bitwise), also when generation ends at the context's end. The real-model group does the
//! same on the three real models.

mod common;

use common::fixture;
use cortiq_engine::generate::{GenOptions, generate, generate_spec};
use cortiq_engine::load::load;
use cortiq_engine::o1::O1Plan;
use cortiq_engine::o1::nystrom::{DEFAULT_RIDGE, Far, O1Settings, StatePrecision};
use cortiq_engine::sampling::SamplerParams;
use std::sync::Arc;

use cortiq_engine::spec::{Drafter, ModelDrafter, MtpDrafter, NgramDrafter, Speculator};
use cortiq_engine::state::SeqState;
use cortiq_engine::{Logits, Model, Numerics};

/// Proposes the continuation of `reference` (plain decoding's text) after the history, with
/// the token at every `wrong_every`-th history length replaced: drafts are kept whole, cut at
/// the planted mistake, or (the mistake first) not at all.
struct Oracle {
    reference: Vec<u32>,
    wrong_every: usize,
    vocab: u32,
}

impl Drafter for Oracle {
    fn draft(&mut self, history: &[u32], n_max: usize) -> Vec<u32> {
        if !self.reference.starts_with(history) {
            return Vec::new();
        }
        let at = history.len();
        let mut d: Vec<u32> = self.reference[at..(at + n_max).min(self.reference.len())].to_vec();
        for (i, t) in d.iter_mut().enumerate() {
            if (at + i).is_multiple_of(self.wrong_every) {
                *t = (*t + 1) % self.vocab;
            }
        }
        d
    }
}

fn prompt(vocab: usize) -> Vec<u32> {
    // A prompt with repeats, so that the n-gram drafter finds matches.
    let base: Vec<u32> = (0..12u32).map(|t| 3 + (t * 29 + 7) % (vocab as u32 - 3)).collect();
    [&base[..], &base[..8], &base[2..10]].concat()
}

fn state(m: &Model, o1: bool, n_ctx: usize, tp: usize) -> SeqState {
    if !o1 {
        return m.new_state(n_ctx);
    }
    let plan = O1Plan {
        tp,
        settings: O1Settings { window: 4, sinks: 2, landmarks: 4, ridge: DEFAULT_RIDGE, state: StatePrecision::Pair },
        far: Far::Skeleton,
        check: None,
        split: false,
    };
    m.new_state_o1(n_ctx, plan).unwrap()
}

fn check(name: &str, num: Numerics, o1: bool) {
    let mut model = load(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}")).model;
    model.set_numerics(num);
    let p = prompt(model.cfg.vocab);
    check_model(name, &model, &p, num, o1, 40, 128);
}

/// Every drafter and draft bound against plain decoding on `model` after `p`: greedy and
/// sampled with `n_predict` tokens in a context of `n_ctx`, and greedy in a context that ends
/// before `n_predict`.
fn check_model(name: &str, model: &Model, p: &[u32], num: Numerics, o1: bool, n_predict: usize, n_ctx: usize) {
    check_drafters(name, model, p, num, o1, n_predict, n_ctx, &Drafters::named(&["ngram", "oracle/3", "oracle/7"]));
}

/// The drafters `check_drafters` runs (`"model"`: `draft` decoding ahead), each at every draft
/// length of `n_max`; greedy and sampled, and with `to_full` greedy again into a context that
/// fills before `n_predict`.
struct Drafters<'a> {
    names: &'a [&'a str],
    draft: Option<&'a Arc<Model>>,
    n_max: &'a [usize],
    to_full: bool,
}

impl<'a> Drafters<'a> {
    /// The named drafters at draft lengths 1, 4 and 9 (verify batches of 2, 5 and 10 rows).
    fn named(names: &'a [&'a str]) -> Self {
        Drafters { names, draft: None, n_max: &[1, 4, 9], to_full: true }
    }
}

/// `check_model` with the drafters given.
#[allow(clippy::too_many_arguments)]
fn check_drafters(
    name: &str,
    model: &Model,
    p: &[u32],
    num: Numerics,
    o1: bool,
    n_predict: usize,
    n_ctx: usize,
    drafters: &Drafters,
) {
    let vocab = model.cfg.vocab;
    let (mut drafted, mut accepted, mut partial) = (0, 0, 0);
    let runs = [
        (SamplerParams::greedy(), n_ctx),
        (SamplerParams { seed: 7, ..SamplerParams::default() }, n_ctx),
        (SamplerParams::greedy(), p.len() + n_predict / 2 - 3),
    ];
    for (sampler, n_ctx) in runs.into_iter().take(if drafters.to_full { 3 } else { 2 }) {
        let opt = GenOptions { n_predict, sampler: sampler.clone(), eos: vec![], stops: vec![], prefill_chunk: 8 };
        let mut st = state(model, o1, n_ctx, p.len());
        let plain = generate(model, &mut st, p, &opt, &mut |_| String::new(), &mut |_| {}).unwrap();
        let probe = |m: &Model, st: &mut SeqState| (st.len < st.n_ctx).then(|| m.forward(&[5], st, Logits::Last).unwrap());
        let plain_next = probe(model, &mut st);
        let reference = [p, &plain.tokens[..]].concat();
        for &dname in drafters.names {
            for &n_max in drafters.n_max {
                let mut spec = Speculator::new(drafter(dname, &reference, vocab, drafters.draft, n_ctx), n_max, 0);
                let mut st = state(model, o1, n_ctx, p.len());
                let got = generate_spec(model, &mut st, p, &opt, &mut spec, &mut |_| String::new(), &mut |_| {}).unwrap();
                let what = format!("{name} {num:?} o1={o1} temp {} n_ctx {n_ctx} {dname} n_max {n_max}", sampler.temperature);
                assert_eq!(got.tokens, plain.tokens, "{what}: tokens differ from plain decoding");
                assert_eq!(got.stop, plain.stop, "{what}: stop reason");
                assert_eq!(st.len, p.len() + plain.tokens.len() - 1, "{what}: state length");
                let next = probe(model, &mut st);
                assert_eq!(
                    next.map(|l| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>()),
                    plain_next.as_ref().map(|l| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>()),
                    "{what}: the state after generation differs from plain decoding's"
                );
                let s = spec.stats;
                drafted += s.drafted;
                accepted += s.accepted;
                partial += usize::from(s.accepted > 0 && s.accepted < s.drafted);
            }
        }
    }
    println!("{name} {num:?} o1={o1}: equal to plain decoding; drafted {drafted}, accepted {accepted}");
    assert!(drafted > 0, "{name}: nothing was drafted");
    if drafters.names.iter().any(|d| d.starts_with("oracle")) {
        // The planted mistakes make drafts kept in part.
        assert!(
            accepted > 0 && accepted < drafted && partial > 0,
            "{name}: drafts were not kept in part ({accepted} of {drafted})"
        );
    }
}

/// A fresh drafter by name (each run starts from an empty index).
fn drafter(name: &str, reference: &[u32], vocab: usize, draft: Option<&Arc<Model>>, n_ctx: usize) -> Box<dyn Drafter + Send> {
    let oracle = |wrong_every| Box::new(Oracle { reference: reference.to_vec(), wrong_every, vocab: vocab as u32 });
    match name {
        "ngram" => Box::new(NgramDrafter::new(1, 4)),
        "model" => Box::new(ModelDrafter::new(draft.expect("a draft model").clone(), n_ctx, 0.0)),
        "mtp" => Box::new(MtpDrafter::new(0)),
        "oracle/3" => oracle(3),
        "oracle/7" => oracle(7),
        _ => unreachable!("a drafter of this test"),
    }
}

fn all(name: &str) {
    check(name, Numerics::Fast, false);
    check(name, Numerics::Exact, false);
}

#[test]
fn spec_equals_plain_llama() {
    all("llama");
}

#[test]
fn spec_equals_plain_qwen2() {
    all("qwen2");
}

#[test]
fn spec_equals_plain_qwen3() {
    all("qwen3");
}

#[test]
fn spec_equals_plain_gemma3() {
    all("gemma3");
}

#[test]
fn spec_equals_plain_lfm2() {
    all("lfm2");
}

#[test]
fn spec_equals_plain_qwen3_5() {
    all("qwen3_5");
}

#[test]
fn spec_equals_plain_llama_vmf() {
    all("llama_vmf");
}

#[test]
fn spec_equals_plain_llama_vmf_window() {
    all("llama_vmfw");
}

#[test]
fn spec_equals_plain_qwen3_5_moe() {
    all("qwen3_5_moe");
}

#[test]
fn spec_equals_plain_qwen3_next() {
    all("qwen3_next");
}

#[test]
fn spec_equals_plain_kimi_linear() {
    all("kimi_linear");
}

#[test]
fn spec_equals_plain_granite_mamba2() {
    all("granitemoehybrid");
}

#[test]
fn spec_equals_plain_falcon_h1() {
    all("falcon_h1");
}

#[test]
fn spec_equals_plain_ministral3() {
    all("ministral3");
}

#[test]
fn spec_equals_plain_nemotron_h() {
    all("nemotron_h");
}

#[test]
fn spec_equals_plain_gpt_oss() {
    all("gpt_oss");
}

#[test]
fn spec_equals_plain_o1() {
    for name in ["llama", "gemma3", "qwen3_5"] {
        check(name, Numerics::Exact, true);
    }
}

/// Draft-model speculation on fixtures: a draft of the same weights under other numerics
/// (most drafts kept), other models of the same vocabulary size (few kept), a recurrent
/// draft model (its state rolled back after each draft), one of a larger vocabulary; equal to
/// plain decoding.
#[test]
fn spec_draft_model_equals_plain() {
    let fixture_model = |name: &str, num: Numerics| {
        let mut m = load(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}")).model;
        m.set_numerics(num);
        m
    };
    for (target, draft, num) in [
        ("llama", "llama", Numerics::Exact),
        ("qwen3", "qwen2", Numerics::Fast),
        ("gemma3", "qwen3_5", Numerics::Fast),
        ("qwen3_5", "qwen3_5", Numerics::Exact),
        // A draft model of a larger vocabulary: drafts are cut before the ids the target lacks.
        ("qwen3", "llama", Numerics::Fast),
    ] {
        let model = fixture_model(target, Numerics::Fast);
        let d = Arc::new(fixture_model(draft, num));
        let p = prompt(model.cfg.vocab);
        check_drafters(
            &format!("{target} drafted by {draft} {num:?}"),
            &model,
            &p,
            Numerics::Fast,
            false,
            40,
            128,
            &Drafters { draft: Some(&d), ..Drafters::named(&["model"]) },
        );
    }
}

/// MTP drafts (the fixtures' own MTP blocks, chained for k > 1): equal to plain decoding,
/// greedy and sampled; random weights keep few drafts.
#[test]
fn spec_mtp_equals_plain() {
    for name in ["qwen3_5", "qwen3_5_moe", "qwen3_next"] {
        for num in [Numerics::Fast, Numerics::Exact] {
            let mut model = load(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}")).model;
            assert!(!model.mtp.is_empty(), "{name}: the fixture has an MTP block");
            model.set_numerics(num);
            let p = prompt(model.cfg.vocab);
            check_drafters(name, &model, &p, num, false, 40, 128, &Drafters::named(&["mtp"]));
        }
    }
}

/// A second generation that continues the first one's state (a chat turn): the drafter is told
/// the tokens already in the state (`set_prior`), and the tokens equal plain decoding's over
/// both turns; MTP keeps drafting in the second turn (it has seen every position).
#[test]
fn spec_continues_a_state() {
    for (name, dname) in [("qwen3_5", "mtp"), ("llama", "ngram")] {
        let model = load(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}")).model;
        let vocab = model.cfg.vocab;
        let (p1, p2) = (prompt(vocab), prompt(vocab)[3..11].to_vec());
        let opt = GenOptions {
            n_predict: 24,
            sampler: SamplerParams { seed: 5, ..SamplerParams::default() },
            eos: vec![],
            stops: vec![],
            prefill_chunk: 8,
        };
        let two_turns = |spec: Option<&mut Speculator>| {
            let mut st = model.new_state(256);
            let mut out = Vec::new();
            let mut spec = spec;
            let mut fed: Vec<u32> = Vec::new();
            for p in [&p1, &p2] {
                let r = match spec.as_deref_mut() {
                    Some(sp) => {
                        sp.set_prior(&fed);
                        generate_spec(&model, &mut st, p, &opt, sp, &mut |_| String::new(), &mut |_| {}).unwrap()
                    }
                    None => generate(&model, &mut st, p, &opt, &mut |_| String::new(), &mut |_| {}).unwrap(),
                };
                fed.extend_from_slice(p);
                fed.extend_from_slice(&r.tokens[..r.tokens.len() - 1]);
                assert_eq!(st.len, fed.len(), "{name}: the state holds what was fed");
                out.push(r.tokens);
            }
            out
        };
        let plain = two_turns(None);
        let mut sp = Speculator::new(drafter(dname, &[], vocab, None, 256), 4, 0);
        let got = two_turns(Some(&mut sp));
        assert_eq!(got, plain, "{name} {dname}: two turns differ from plain decoding");
        let first = {
            let mut sp1 = Speculator::new(drafter(dname, &[], vocab, None, 256), 4, 0);
            let mut st = model.new_state(256);
            generate_spec(&model, &mut st, &p1, &opt, &mut sp1, &mut |_| String::new(), &mut |_| {}).unwrap();
            sp1.stats.drafted
        };
        println!("{name} {dname}: two turns equal; drafted {} in turn one, {} in both", first, sp.stats.drafted);
        assert!(sp.stats.drafted > first, "{name} {dname}: nothing was drafted in the second turn");
    }
}

/// Real-model group: the three real models (Q4_K_M interleaved, Q4_K_M with a tied 262k
/// head, Q4_1 on the non-interleaved layout), default numerics, a code-edit prompt; the
/// n-gram and oracle drafters at every draft length, and the model itself as its draft model at
/// one; greedy and sampled. The real files check the real weight types' verify batches; the
/// drafters' variety (the second oracle, the draft model at every length, the context that fills)
/// is the fixtures' (`spec_equals_plain_*`, `spec_draft_model_equals_plain`): the full set took
/// 160 s here on the AVX2 tier (`CORTIQ_SIMD=avx2` on an Intel Xeon, 2026-12-07).
#[test]
fn real_models_spec_equals_plain() {
    for name in ["qwen2.5-coder-0.5b", "gemma3-270m", "smollm2-135m"] {
        let mut loaded = load(&cortiq_testkit::real_model(name)).unwrap();
        let tok = loaded.tokenizer().unwrap();
        let code = "def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n";
        let text = format!("{code}\n# The same two functions, with `w` renamed to `width`:\n");
        let p = tok.encode(&text, true).unwrap();
        loaded.model.set_numerics(Numerics::Fast);
        let drafters = Drafters { to_full: false, ..Drafters::named(&["ngram", "oracle/3"]) };
        check_drafters(name, &loaded.model, &p, Numerics::Fast, false, 48, 256, &drafters);
        // A draft model of the same vocabulary: the model itself under exact numerics.
        let mut draft = load(&cortiq_testkit::real_model(name)).unwrap().model;
        draft.set_numerics(Numerics::Exact);
        let draft = Arc::new(draft);
        let drafters = Drafters { names: &["model"], draft: Some(&draft), n_max: &[4], to_full: false };
        check_drafters(&format!("{name} drafted by itself"), &loaded.model, &p, Numerics::Fast, false, 48, 256, &drafters);
    }
}

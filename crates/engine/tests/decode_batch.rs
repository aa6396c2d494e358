//! The serving core's decode batch (issue 12): `Model::forward_batch` with one position per entry steps several
//! sequences at once, and every sequence's logits must equal, bit for bit, what the same
//! sequence gets decoding alone — whatever else is in the batch, in whatever order, with
//! sequences joining and leaving between steps. Every mixer (attention, GatedDeltaNet, KDA, MLA,
//! short convolution, MoE) from the committed fixtures, in every numerics mode, plus the real
//! Qwen2.5-Coder (real-model group: fails when the model is not in the cache).

mod common;

use common::{fixture, ids};
use cortiq_engine::load::load;
use cortiq_engine::state::SeqState;
use cortiq_engine::{BatchEntry, EngineError, Logits, Model, Numerics, VerifyJournal};

const STEPS: usize = 6;

/// Which sequences run at step s, in which order: 0 always; 1 joins at step 2; 2 leaves after
/// step 3; 3 on odd steps only; the order rotates.
fn schedule(s: usize) -> Vec<usize> {
    let mut on: Vec<usize> = [0, 1, 2, 3]
        .into_iter()
        .filter(|&j| match j {
            1 => s >= 2,
            2 => s <= 3,
            3 => s % 2 == 1,
            _ => true,
        })
        .collect();
    let n = on.len();
    on.rotate_left(s % n);
    on
}

fn first_diff(a: &[f32], b: &[f32]) -> Option<(usize, f32, f32)> {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).enumerate().find(|(_, (x, y))| x.to_bits() != y.to_bits()).map(|(i, (x, y))| (i, *x, *y))
}

/// Four sequences (prompts of different lengths from `toks`), each decoding its own fixed
/// token stream; alone vs batched per `schedule`.
fn check(name: &str, model: &Model, toks: &[u32]) {
    check_with(name, model, toks, &|_| model.new_state(128));
}

/// `check` with each sequence's empty state from `make(j)` (O(1) plans, ...).
fn check_with(name: &str, model: &Model, toks: &[u32], make: &dyn Fn(usize) -> SeqState) {
    let v = model.cfg.vocab;
    let plen = [toks.len().min(40) - 8, 5, 1, 17.min(toks.len() - 8)];
    let prompt = |j: usize| &toks[j..j + plen[j]];
    let stream = |j: usize, i: usize| toks[(3 * j + 5 * i + 1) % toks.len()];
    let fresh = |j: usize| {
        let mut st = make(j);
        model.forward(prompt(j), &mut st, Logits::None).unwrap();
        st
    };
    // Alone: the steps each sequence takes under the schedule, one forward each.
    let mut alone: Vec<Vec<Vec<f32>>> = vec![Vec::new(); 4];
    let mut sts: Vec<SeqState> = (0..4).map(fresh).collect();
    for s in 0..STEPS {
        for j in schedule(s) {
            let i = alone[j].len();
            alone[j].push(model.forward(&[stream(j, i)], &mut sts[j], Logits::Last).unwrap());
        }
    }
    // Batched.
    let mut sts: Vec<SeqState> = (0..4).map(fresh).collect();
    let mut taken = [0usize; 4];
    let mut rows = 0;
    for s in 0..STEPS {
        let on = schedule(s);
        let tokens: Vec<u32> = on.iter().map(|&j| stream(j, taken[j])).collect();
        let mut refs: Vec<&mut SeqState> = Vec::new();
        // Distinct &mut to the scheduled states, in schedule order.
        let mut slots: Vec<Option<&mut SeqState>> = sts.iter_mut().map(Some).collect();
        for &j in &on {
            refs.push(slots[j].take().expect("a sequence appears once per step"));
        }
        let logits = forward_decode_batch(&model, &tokens, &mut refs).unwrap();
        assert_eq!(logits.len(), on.len() * v);
        for (r, &j) in on.iter().enumerate() {
            let want = &alone[j][taken[j]];
            if let Some((i, a, b)) = first_diff(&logits[r * v..(r + 1) * v], want) {
                panic!("{name}: step {s}, sequence {j} (row {r} of {}): logit {i} batched {a:e} vs alone {b:e}", on.len());
            }
            taken[j] += 1;
            rows += 1;
        }
    }
    for (j, st) in sts.iter().enumerate() {
        assert_eq!(st.len, plen[j] + taken[j], "{name}: sequence {j} length");
    }
    // The comparison can fail: different sequences' logits differ.
    assert!(first_diff(&alone[0][0], &alone[1][0]).is_some(), "{name}: two sequences gave the same logits");
    println!("{name}: {rows} batched rows bit-identical to decoding alone (batches of 1-4, vocab {v})");
}

/// Positions each of four sequences runs at step s of the mixed batch (0: not in the step):
/// prompt chunks of 2-40 positions beside decode rows, entries joining and leaving.
const MIXED: [[usize; 4]; 5] = [[7, 1, 12, 0], [1, 5, 3, 20], [1, 1, 9, 1], [2, 0, 1, 33], [1, 1, 1, 1]];

/// What entry j at step s asks for: the last position mostly, nothing or a tail sometimes.
fn mixed_want(s: usize, j: usize, n: usize) -> Logits {
    match (s + j) % 5 {
        1 if n > 1 => Logits::None,
        3 if n > 2 => Logits::From(n - 2),
        _ => Logits::Last,
    }
}

/// `Model::forward_batch` over mixed steps (`MIXED`): every entry's logits equal its own
/// `forward` of the same chunk alone, bit for bit, and so do the states after (one more step
/// of each sequence alone compares them).
fn check_mixed(name: &str, model: &Model, toks: &[u32]) {
    let v = model.cfg.vocab;
    let at = |j: usize, i: usize| toks[(7 * j + i) % toks.len()];
    let mut alone: Vec<SeqState> = (0..4).map(|_| model.new_state(256)).collect();
    let mut batched: Vec<SeqState> = (0..4).map(|_| model.new_state(256)).collect();
    let mut done = [0usize; 4];
    let mut entries = 0;
    for (s, step) in MIXED.iter().enumerate() {
        let on: Vec<usize> = (0..4).filter(|&j| step[j] > 0).collect();
        let chunks: Vec<Vec<u32>> = on.iter().map(|&j| (0..step[j]).map(|i| at(j, done[j] + i)).collect()).collect();
        // Alone: `forward`, and every other step a batch of one that also hands out the
        // final-normed hidden rows (an MTP drafter's), which the batched entry must equal.
        let (mut want, mut hidden_alone) = (Vec::new(), Vec::new());
        for (&j, c) in on.iter().zip(&chunks) {
            let w = mixed_want(s, j, c.len());
            if s % 2 == 1 {
                let mut h = Vec::new();
                let e = BatchEntry { tokens: c, state: &mut alone[j], want: w, verify: None, hidden: Some(&mut h) };
                want.extend(model.forward_batch(&mut [e]).unwrap());
                hidden_alone.push(h);
            } else {
                want.extend(model.forward(c, &mut alone[j], w).unwrap());
            }
        }
        let mut slots: Vec<Option<&mut SeqState>> = batched.iter_mut().map(Some).collect();
        let mut hidden: Vec<Vec<f32>> = vec![Vec::new(); on.len()];
        let mut batch: Vec<BatchEntry<'_>> = on
            .iter()
            .zip(&chunks)
            .zip(hidden.iter_mut())
            .map(|((&j, c), h)| BatchEntry {
                tokens: c,
                state: slots[j].take().unwrap(),
                want: mixed_want(s, j, c.len()),
                verify: None,
                hidden: (s % 2 == 1).then_some(h),
            })
            .collect();
        let got = model.forward_batch(&mut batch).unwrap();
        assert_eq!(got.len(), want.len(), "{name}: step {s}: logits rows");
        if let Some((i, a, b)) = first_diff(&got, &want) {
            panic!("{name}: step {s} (entries {on:?}, sizes {step:?}): logit {i} (row {}) batched {a:e} vs alone {b:e}", i / v);
        }
        if s % 2 == 1 {
            let d = model.cfg.d_model;
            for (k, ((h, a), c)) in hidden.iter().zip(&hidden_alone).zip(&chunks).enumerate() {
                assert_eq!(h.len(), c.len() * d, "{name}: step {s}: entry {k}'s hidden rows");
                assert!(first_diff(h, a).is_none(), "{name}: step {s}: entry {k}'s hidden rows differ from alone");
            }
        }
        for (&j, c) in on.iter().zip(&chunks) {
            done[j] += c.len();
        }
        entries += on.len();
    }
    for j in 0..4 {
        assert_eq!(batched[j].len, done[j], "{name}: sequence {j} length");
        let t = at(j, done[j]);
        let a = model.forward(&[t], &mut alone[j], Logits::Last).unwrap();
        let b = model.forward(&[t], &mut batched[j], Logits::Last).unwrap();
        assert!(first_diff(&a, &b).is_none(), "{name}: sequence {j}'s state differs after the mixed steps");
    }
    println!("{name}: {entries} mixed entries (chunks of 1-40 positions) bit-identical to running alone");
}

/// Verifies in the batch (`BatchEntry::verify`, speculative decoding): steps where two
/// sequences verify drafts of 2-5 tokens beside a decode row and a prompt chunk; every verify's
/// rows equal its `forward_verify` alone, bit for bit, and after `verify_keep` of a part of
/// each draft the states are the same (one more step alone compares them).
fn check_verify(name: &str, model: &Model, toks: &[u32]) {
    let v = model.cfg.vocab;
    let at = |j: usize, i: usize| toks[(5 * j + i) % toks.len()];
    let mut alone: Vec<SeqState> = (0..4).map(|_| model.new_state(256)).collect();
    let mut batched: Vec<SeqState> = (0..4).map(|_| model.new_state(256)).collect();
    let mut ja: Vec<VerifyJournal> = (0..4).map(|_| VerifyJournal::default()).collect();
    let mut jb: Vec<VerifyJournal> = (0..4).map(|_| VerifyJournal::default()).collect();
    let mut done = [0usize; 4];
    for j in 0..4 {
        let p: Vec<u32> = (0..6 + j).map(|i| at(j, i)).collect();
        model.forward(&p, &mut alone[j], Logits::None).unwrap();
        model.forward(&p, &mut batched[j], Logits::None).unwrap();
        done[j] = p.len();
    }
    // Per step and sequence: (positions, a verify keeping this many of them).
    let steps: [[(usize, Option<usize>); 4]; 3] = [
        [(4, Some(2)), (1, None), (3, Some(3)), (5, None)],
        [(1, None), (5, Some(1)), (2, Some(0)), (1, None)],
        [(3, Some(1)), (2, Some(2)), (1, None), (4, Some(4))],
    ];
    let mut rows = 0;
    for (s, step) in steps.iter().enumerate() {
        let chunks: Vec<Vec<u32>> = (0..4).map(|j| (0..step[j].0).map(|i| at(j, done[j] + i)).collect()).collect();
        let mut want = Vec::new();
        for j in 0..4 {
            match step[j].1 {
                Some(_) => want.extend(model.forward_verify(&chunks[j], &mut alone[j], &mut ja[j]).unwrap()),
                None => want.extend(model.forward(&chunks[j], &mut alone[j], Logits::Last).unwrap()),
            }
        }
        let got = {
            let mut batch: Vec<BatchEntry<'_>> = batched
                .iter_mut()
                .zip(jb.iter_mut())
                .enumerate()
                .map(|(j, (st, jn))| BatchEntry {
                    tokens: &chunks[j],
                    state: st,
                    want: Logits::Last,
                    verify: step[j].1.map(|_| jn),
                    hidden: None,
                })
                .collect();
            model.forward_batch(&mut batch).unwrap()
        };
        assert_eq!(got.len(), want.len(), "{name}: step {s}: logits rows");
        if let Some((i, a, b)) = first_diff(&got, &want) {
            panic!("{name}: verify step {s}: logit {i} (row {}) batched {a:e} vs alone {b:e}", i / v);
        }
        rows += got.len() / v;
        for j in 0..4 {
            match step[j].1 {
                Some(keep) => {
                    model.verify_keep(&mut alone[j], &mut ja[j], keep).unwrap();
                    model.verify_keep(&mut batched[j], &mut jb[j], keep).unwrap();
                    done[j] += keep;
                }
                None => done[j] += step[j].0,
            }
            assert_eq!(alone[j].len, done[j], "{name}: sequence {j} length");
            assert_eq!(batched[j].len, done[j], "{name}: sequence {j} length");
        }
    }
    for j in 0..4 {
        let t = at(j, done[j]);
        let a = model.forward(&[t], &mut alone[j], Logits::Last).unwrap();
        let b = model.forward(&[t], &mut batched[j], Logits::Last).unwrap();
        assert!(first_diff(&a, &b).is_none(), "{name}: sequence {j}'s state differs after the verifies");
    }
    println!("{name}: {rows} rows of verifies beside decode rows and chunks bit-identical to running alone");
}

fn all_modes(name: &str) {
    let toks = ids(&fixture(name).join("tokens.json"));
    for (path, num) in [
        (fixture(name), Numerics::Exact),
        (fixture(name), Numerics::Fast),
        (fixture(name), Numerics::LlamaCpp),
        (fixture(name).join("model.gguf"), Numerics::Fast),
    ] {
        let mut model = load(&path).unwrap_or_else(|e| panic!("{name}: {e}")).model;
        model.set_numerics(num);
        if common::sinks_refuse_llamacpp(name, &model, num) {
            continue;
        }
        let label = format!("{name} {num:?} {}", path.file_name().unwrap().to_string_lossy());
        check(&label, &model, &toks);
        check_mixed(&label, &model, &toks);
        check_verify(&label, &model, &toks);
    }
}

#[test]
fn decode_batch_llama() {
    all_modes("llama");
}

#[test]
fn decode_batch_gemma3() {
    all_modes("gemma3");
}

#[test]
fn decode_batch_qwen3() {
    all_modes("qwen3");
}

#[test]
fn decode_batch_qwen3_5() {
    all_modes("qwen3_5");
}

#[test]
fn decode_batch_qwen3_5_moe() {
    all_modes("qwen3_5_moe");
}

#[test]
fn decode_batch_qwen3_next() {
    all_modes("qwen3_next");
}

#[test]
fn decode_batch_lfm2() {
    all_modes("lfm2");
}

#[test]
fn decode_batch_kimi_linear() {
    all_modes("kimi_linear");
}

#[test]
fn decode_batch_granite_mamba2() {
    all_modes("granitemoehybrid");
}

#[test]
fn decode_batch_falcon_h1_parallel() {
    all_modes("falcon_h1");
}

/// Ministral 3: the query temperature per row's own position (the rows stand at different ones).
#[test]
fn decode_batch_ministral3() {
    all_modes("ministral3");
}

#[test]
fn decode_batch_nemotron_h() {
    all_modes("nemotron_h");
}

#[test]
fn decode_batch_gpt_oss_sinks() {
    all_modes("gpt_oss");
}

#[test]
fn decode_batch_llama_vmf() {
    all_modes("llama_vmf");
}

#[test]
fn decode_batch_llama_vmf_window() {
    all_modes("llama_vmfw");
}

/// O(1) states in the batch: sequence 1 sealed at the end of its prompt (Nyström skeleton),
/// sequence 3 sealing at its first batched step (which it takes alone) and stepping sealed in
/// the batch afterwards (StreamingLLM drop), beside exact ones.
#[test]
fn decode_batch_with_o1_states() {
    use cortiq_engine::o1::O1Plan;
    use cortiq_engine::o1::nystrom::{DEFAULT_RIDGE, Far, O1Settings, StatePrecision};
    for name in ["llama", "qwen3_5"] {
        let toks = ids(&fixture(name).join("tokens.json"));
        for num in [Numerics::Exact, Numerics::Fast] {
            let mut model = load(&fixture(name)).unwrap().model;
            model.set_numerics(num);
            let plan = |tp: usize, far: Far| O1Plan {
                tp,
                settings: O1Settings { window: 4, sinks: 1, landmarks: 4, ridge: DEFAULT_RIDGE, state: StatePrecision::Single },
                far,
                check: None,
                split: false,
            };
            let make = |j: usize| match j {
                1 => model.new_state_o1(128, plan(5, Far::Skeleton)).unwrap(),
                3 => model.new_state_o1(128, plan(17.min(toks.len() - 8) + 1, Far::Drop)).unwrap(),
                _ => model.new_state(128),
            };
            check_with(&format!("{name} {num:?} with O(1) states"), &model, &toks, &make);
        }
    }
}

/// A bad token or a full context in any entry is an error naming the entry, and no state moves.
#[test]
fn a_bad_entry_fails_the_batch_before_any_state_moves() {
    let model = load(&fixture("llama")).unwrap().model;
    let toks = ids(&fixture("llama").join("tokens.json"));
    let mut a = model.new_state(16);
    let mut b = model.new_state(16);
    model.forward(&toks[..4], &mut a, Logits::None).unwrap();
    model.forward(&toks[..16], &mut b, Logits::None).unwrap(); // full
    let v = model.cfg.vocab as u32;
    let err = forward_decode_batch(&model, &[toks[4], v], &mut [&mut a, &mut model.new_state(16)]).unwrap_err();
    assert!(matches!(&err, EngineError::Batch { entry: 1, .. }), "{err}");
    assert!(err.to_string().contains("batch entry 1") && err.to_string().contains("outside the vocabulary"), "{err}");
    let err = forward_decode_batch(&model, &[toks[4], toks[5]], &mut [&mut a, &mut b]).unwrap_err();
    assert!(err.to_string().contains("batch entry 1") && err.to_string().contains("context"), "{err}");
    assert_eq!((a.len, b.len), (4, 16), "a failed batch moved a state");
}

/// Real-model group: Qwen2.5-Coder-0.5B Q4_K_M (the serving benchmark's model), default numerics.
#[test]
fn real_qwen25_decode_batch_equals_alone() {
    let path = cortiq_testkit::real_model("qwen2.5-coder-0.5b");
    let mut loaded = load(&path).unwrap();
    let tok = loaded.tokenizer().unwrap();
    let toks = tok.encode("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n", false).unwrap();
    for num in [Numerics::Fast, Numerics::Exact] {
        loaded.model.set_numerics(num);
        check(&format!("qwen2.5-coder-0.5b {num:?}"), &loaded.model, &toks);
        check_mixed(&format!("qwen2.5-coder-0.5b {num:?}"), &loaded.model, &toks);
        // Under fast numerics the chunks above shared their layers' products with the decode
        // rows beside them (the merged path), not only the fallback that runs them apart.
        let m = &loaded.model;
        let rowwise = m.layers.iter().flat_map(|l| l.mixer.matrices().into_iter().chain(l.ffn.matrices())).all(|t| t.rowwise(40));
        assert_eq!(rowwise, num == Numerics::Fast, "{num:?}: chunks of 40 positions are row-wise on every layer matrix");
    }
}

/// The recurrent mixers' batched projections on quantized weights: each hybrid fixture
/// converted to Q8_0 (a multi-column kernel), fast numerics, rows bit-identical to alone.
#[test]
fn decode_batch_hybrids_quantized() {
    use cortiq_engine::convert::{ConvertOptions, QuantSpec, convert};
    use cortiq_kernels::quant::QuantType;
    let dir = std::env::temp_dir().join(format!("cortiq-decode-batch-q8-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["qwen3_5", "qwen3_next", "lfm2", "kimi_linear", "qwen3", "gemma3"] {
        let out = dir.join(format!("{name}.cmf"));
        let opts = ConvertOptions {
            quant: QuantSpec::To(QuantType::Q8_0),
            embeddings: None,
            f32_as: None,
            force: true,
            plain_experts: false,
        };
        convert(&fixture(name), &out, &opts, &|_, _, _| {}).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut model = load(&out).unwrap().model;
        model.set_numerics(Numerics::Fast);
        let quantized = model.layers.iter().flat_map(|l| l.mixer.matrices()).filter(|t| t.dtype == QuantType::Q8_0).count();
        assert!(quantized > 0, "{name}: the mixers' matrices are Q8_0");
        let toks = ids(&fixture(name).join("tokens.json"));
        check(&format!("{name} Q8_0 fast"), &model, &toks);
        check_mixed(&format!("{name} Q8_0 fast"), &model, &toks);
        check_verify(&format!("{name} Q8_0 fast"), &model, &toks);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// One decode step for each of several sequences: `tokens[j]` at position `states[j].len` of
/// sequence j, through `forward_batch` with one position per entry. Logits [k, vocab].
fn forward_decode_batch(model: &Model, tokens: &[u32], states: &mut [&mut SeqState]) -> cortiq_engine::Result<Vec<f32>> {
    assert_eq!(tokens.len(), states.len(), "forward_decode_batch: one token per sequence");
    let mut batch: Vec<BatchEntry<'_>> = tokens
        .iter()
        .zip(states.iter_mut())
        .map(|(t, st)| BatchEntry { tokens: std::slice::from_ref(t), state: st, want: Logits::Last, verify: None, hidden: None })
        .collect();
    model.forward_batch(&mut batch)
}

//! One weight pass per serving step, speculating or not (issue 49): a step of four streams of
//! which two verify drafts reads each weight matrix as often as a step of four plain decode
//! rows — the verifies join the batch (`BatchEntry::verify`) instead of running after it. The
//! count is `qtensor::weight_passes` (one per matrix per product call), alone in this test
//! binary so no other test's products mix in.

mod common;

use common::fixture;
use cortiq_engine::load::load;
use cortiq_engine::qtensor::weight_passes;
use cortiq_engine::state::SeqState;
use cortiq_engine::{BatchEntry, Logits, Model, Numerics, VerifyJournal};

/// Passes of one step: four sequences, those in `verify` verifying three tokens, the others
/// decoding one; `apart`: the verifies run on their own after the batch (the old schedule).
fn step_passes(m: &Model, verify: &[usize], apart: bool) -> u64 {
    let mut states: Vec<SeqState> = (0..4).map(|_| m.new_state(128)).collect();
    for (j, st) in states.iter_mut().enumerate() {
        m.forward(&[3 + j as u32, 7, 11, 13, 17], st, Logits::None).unwrap();
    }
    let mut journals: Vec<VerifyJournal> = (0..4).map(|_| VerifyJournal::default()).collect();
    let toks: Vec<Vec<u32>> = (0..4).map(|j| if verify.contains(&j) { vec![5, 9, 2] } else { vec![5] }).collect();
    let before = weight_passes();
    let mut batch: Vec<BatchEntry<'_>> = Vec::new();
    let mut later = Vec::new();
    for ((j, st), jn) in states.iter_mut().enumerate().zip(journals.iter_mut()) {
        let v = verify.contains(&j);
        if v && apart {
            later.push((j, st, jn));
        } else {
            batch.push(BatchEntry { tokens: &toks[j], state: st, want: Logits::Last, verify: v.then_some(jn) });
        }
    }
    m.forward_batch(&mut batch).unwrap();
    for (j, st, jn) in later {
        m.forward_verify(&toks[j], st, jn).unwrap();
    }
    weight_passes() - before
}

#[test]
fn one_weight_pass_per_step_with_verifies() {
    use cortiq_engine::convert::{ConvertOptions, QuantSpec, convert};
    use cortiq_kernels::quant::QuantType;
    let dir = std::env::temp_dir().join(format!("cortiq-weight-passes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Q8_0 weights under fast numerics: the decode rows of a step share one pass of each
    // matrix (float weights run row by row, one pass per row, verifies or not).
    // (Kimi Linear's KDA and MLA merge their verifies too, but its MoE FFN reads each routed
    // expert per row, decode rows included: a count of its own.)
    for name in ["qwen3", "llama", "qwen3_5", "lfm2"] {
        let out = dir.join(format!("{name}.cmf"));
        let opts = ConvertOptions { quant: QuantSpec::To(QuantType::Q8_0), embeddings: None, f32_as: None, force: true };
        convert(&fixture(name), &out, &opts, &|_, _, _| {}).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut m = load(&out).unwrap().model;
        m.set_numerics(Numerics::Fast);
        let matrices = m.layers.iter().map(|l| l.matrices().len()).sum::<usize>() as u64 + 1;
        let plain = step_passes(&m, &[], false);
        let merged = step_passes(&m, &[1, 3], false);
        let apart = step_passes(&m, &[1, 3], true);
        println!(
            "{name}: {matrices} matrices; a step of 4 decode rows {plain} passes, 2 of them verifying {merged} (apart {apart})"
        );
        assert_eq!(merged, plain, "{name}: the verifies read weights again");
        assert!(apart > plain, "{name}: the count can fail: verifies run apart read more ({apart} vs {plain})");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

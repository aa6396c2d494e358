//! One weight pass per serving step, speculating or not (issue 49): a step of four streams of
//! which two verify drafts reads each weight matrix as often as a step of four plain decode
//! rows — the verifies join the batch (`BatchEntry::verify`) instead of running after it. The
//! count is `qtensor::weight_passes` (one per matrix per product call), process-wide: the
//! tests of this binary take `ONE_AT_A_TIME` so that no other test's products mix in.

mod common;

use common::fixture;
use cortiq_engine::load::load;
use cortiq_engine::qtensor::weight_passes;
use cortiq_engine::state::SeqState;
use cortiq_engine::{BatchEntry, Logits, Model, Numerics, VerifyJournal};

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The fixture `name` converted to Q8_0 (.cmf, in a temporary directory removed once it is
/// loaded: the map keeps the bytes) with its experts row-major, as GGUF stores them, and loaded
/// under fast numerics.
fn q8_fast(name: &str) -> Model {
    q8_converted(name, true, Numerics::Fast)
}

/// `q8_fast` with the experts stored interleaved unless `plain_experts` (`cortiq convert`'s
/// default), under `num`.
fn q8_converted(name: &str, plain_experts: bool, num: Numerics) -> Model {
    use cortiq_engine::convert::{ConvertOptions, QuantSpec, convert};
    use cortiq_kernels::quant::QuantType;
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let k = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("cortiq-weight-passes-{}-{k}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("{name}.cmf"));
    let opts =
        ConvertOptions { quant: QuantSpec::To(QuantType::Q8_0), embeddings: None, f32_as: None, force: true, plain_experts };
    convert(&fixture(name), &out, &opts, &|_, _, _| {}).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut m = load(&out).unwrap().model;
    m.set_numerics(num);
    let _ = std::fs::remove_dir_all(&dir);
    m
}

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
            batch.push(BatchEntry { tokens: &toks[j], state: st, want: Logits::Last, verify: v.then_some(jn), hidden: None });
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
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Q8_0 weights under fast numerics: the decode rows of a step share one pass of each
    // matrix (float weights run row by row, one pass per row, verifies or not).
    // (Kimi Linear's KDA and MLA merge their verifies too, but its MoE FFN reads each routed
    // expert per row, decode rows included: a count of its own.)
    for name in ["qwen3", "llama", "qwen3_5", "lfm2"] {
        let m = q8_fast(name);
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
}

/// Passes of one step of `k` sequences each decoding one token (prompts of different lengths).
fn rows_passes(m: &Model, k: usize) -> u64 {
    let mut states: Vec<SeqState> = (0..k).map(|_| m.new_state(128)).collect();
    for (j, st) in states.iter_mut().enumerate() {
        let p: Vec<u32> = (0..5 + j as u32).map(|t| 3 + (t * 31 + 17 * j as u32) % 200).collect();
        m.forward(&p, st, Logits::None).unwrap();
    }
    let toks: Vec<[u32; 1]> = (0..k).map(|j| [5 + 40 * j as u32]).collect();
    let before = weight_passes();
    let mut batch: Vec<BatchEntry<'_>> = states
        .iter_mut()
        .zip(&toks)
        .map(|(st, t)| BatchEntry { tokens: t, state: st, want: Logits::Last, verify: None, hidden: None })
        .collect();
    m.forward_batch(&mut batch).unwrap();
    weight_passes() - before
}

/// A MoE step reads each selected expert once for all its decode rows (`moe::moe_rows`), not
/// once per row: four identical rows (the same experts) read what one row reads; four rows of
/// different prompts read the router once and at most min(E, 4·top_k) experts (gate, up, down
/// each) per layer, where reading per row would take 4·top_k. On gpt-oss's fixture, whose
/// expert matrices all quantize to Q8_0 (a float matrix is read once per row by design).
#[test]
fn moe_step_reads_each_selected_expert_once() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    use cortiq_kernels::quant::QuantType;
    let name = "gpt_oss";
    let m = q8_fast(name);
    let mc = m.cfg.moe.expect("a MoE fixture");
    let cortiq_engine::model::Ffn::Moe(mw) = &m.layers[0].ffn else { panic!("{name}: layer 0 is MoE") };
    assert!(mw.experts.iter().all(|e| e.gate.dtype == QuantType::Q8_0 && e.down.dtype == QuantType::Q8_0));
    // Fast numerics interleave the dense matrices (Q8_0 has the layout) but leave the experts in
    // the file's layout, memory-mapped: a copy of every expert would double a large file's
    // memory (`Model::set_numerics`); except on CPUs without AVX-512 (`expert_interleaved`).
    assert!(m.output.interleaved(), "{name}: the output head is not interleaved: the check below tests nothing");
    let copied = mw.experts[0].gate.expert_interleaved();
    assert!(
        mw.experts.iter().all(|e| [&e.gate, &e.up, &e.down].iter().all(|t| t.interleaved() == copied)),
        "{name}: experts interleaved where they should be mapped, or the reverse (interleaved expected: {copied})"
    );
    let d = m.cfg.d_model;
    let h: Vec<f32> = (0..d).map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5).collect();
    let layer = |k: usize| {
        let before = weight_passes();
        cortiq_engine::moe::moe_rows(&m.cfg, &mc, mw, &h.repeat(k), k, Numerics::Fast);
        weight_passes() - before
    };
    let (one, four) = (layer(1), layer(4));
    println!("{name}: one MoE layer, one row {one} passes, four identical rows {four}");
    assert_eq!(four, one, "{name}: four rows choosing the same experts read them again");
    let l_moe = m.cfg.layers.iter().filter(|l| l.moe).count() as u64;
    let (e, k) = (mc.n_experts as u64, mc.top_k as u64);
    let (p1, p4) = (rows_passes(&m, 1), rows_passes(&m, 4));
    let non_moe = p1 - l_moe * (1 + 3 * k);
    let (lo, hi) = (non_moe + l_moe * (1 + 3 * k), non_moe + l_moe * (1 + 3 * e.min(4 * k)));
    let per_row = non_moe + 4 * l_moe * (1 + 3 * k);
    println!("{name}: a step of one row {p1} passes; four rows {p4} (each expert once: {lo}..={hi}; once per row: {per_row})");
    assert!(p4 >= lo && p4 <= hi, "{name}: four decode rows read {p4} passes, outside {lo}..={hi}");
    assert!(per_row > hi, "{name}: the count can fail: per-row reads exceed the bound");
}

/// Nemotron-H's ungated relu² FFN (relu(up·x)·(up·x), its experts and shared expert) reads its up
/// projection once per token, not once as up and again as the gate view of it: a decode
/// step's counted weight bytes are the model's active bytes (`decode_weight_bytes`, which
/// counts up once), less the embedding row it reads by row, with no product on it.
#[test]
fn ungated_ffn_reads_up_once() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    use cortiq_engine::model::Ffn;
    let name = "nemotron_h";
    let m = q8_fast(name);
    let (mut dense, mut moe) = (0, 0);
    for l in &m.layers {
        match &l.ffn {
            Ffn::Dense(f) => dense += usize::from(f.gate_is_up),
            Ffn::Moe(mw) => moe += usize::from(mw.experts.iter().all(|e| e.gate_is_up)),
            Ffn::None => {}
        }
    }
    // (The fixture's pattern has expert layers only; a dense ungated layer takes the same
    // `FfnWeights` paths, `blocks::ffn_rows`.)
    assert!(moe > 0, "{name}: the fixture has {dense} ungated dense and {moe} ungated MoE layers: the count below tests nothing");
    let mut st: SeqState = m.new_state(64);
    m.forward(&[3, 7, 11, 13, 17], &mut st, Logits::None).unwrap();
    let before = cortiq_engine::qtensor::weight_bytes();
    m.forward(&[5], &mut st, Logits::Last).unwrap();
    let read = cortiq_engine::qtensor::weight_bytes() - before;
    let row = m.tok_embd.n_bytes() / m.tok_embd.rows;
    let active = m.decode_weight_bytes() - row;
    // The same count from the tensors: per layer its mixer, and of its FFN the up and down
    // projections (top_k experts' and the shared expert's), the router, then the output head.
    let k = m.cfg.moe.as_ref().expect("a MoE fixture").top_k;
    let mut want = m.output.n_bytes();
    let mut gates = 0;
    for l in &m.layers {
        want += l.mixer.matrices().iter().map(|t| t.n_bytes()).sum::<usize>();
        match &l.ffn {
            Ffn::Dense(f) => want += f.up.n_bytes() + f.down.n_bytes(),
            Ffn::Moe(mw) => {
                let e = &mw.experts[0];
                want += mw.router.n_bytes() + k * (e.up.n_bytes() + e.down.n_bytes());
                gates += k * e.gate.n_bytes();
                if let Some(sh) = &mw.shared {
                    want += sh.up.n_bytes() + sh.down.n_bytes();
                    gates += sh.gate.n_bytes();
                }
                want += mw.shared_gate.as_ref().map_or(0, |t| t.n_bytes());
            }
            Ffn::None => {}
        }
    }
    println!(
        "{name}: a decode step read {read} weight bytes; active {active}; from the tensors {want} (+{gates} if the gates were read)"
    );
    assert_eq!(read as usize, want, "{name}: a decode step read {read} bytes where up and down come to {want}");
    assert_eq!(active, want, "{name}: decode_weight_bytes counts {active}, the tensors {want}");
}

/// `Model::copy_experts` (`--no-mmap`) moves every routed expert out of the file map into the
/// interleaved layout: afterwards each is interleaved, a decode step still reads each selected
/// expert once (the same passes as mapped), and its logits match the mapped model's to the
/// products' rounding (the two layouts' kernels sum in other orders).
#[test]
fn copied_experts_are_interleaved_and_read_once() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    use cortiq_engine::model::Ffn;
    let name = "gpt_oss"; // every expert matrix quantizes to Q8_0, a type with the layout
    let mapped = q8_fast(name);
    let mut copied = q8_fast(name);
    let calls = std::cell::Cell::new((0, 0));
    copied.copy_experts(&|done, total| calls.set((done, total)));
    let experts = |m: &Model| -> Vec<bool> {
        m.layers
            .iter()
            .filter_map(|l| if let Ffn::Moe(mw) = &l.ffn { Some(mw) } else { None })
            .flat_map(|mw| mw.experts.iter().flat_map(|e| e.read().into_iter().map(|t| t.interleaved())))
            .collect()
    };
    let (before, after) = (experts(&mapped), experts(&copied));
    let left: Vec<String> = copied
        .layers
        .iter()
        .filter_map(|l| if let Ffn::Moe(mw) = &l.ffn { Some(mw) } else { None })
        .flat_map(|mw| mw.experts.iter().flat_map(|e| e.read()))
        .filter(|t| !t.interleaved())
        .map(|t| format!("{} {:?} {}x{}", t.name, t.dtype, t.rows, t.cols))
        .collect();
    assert!(!after.is_empty() && left.is_empty(), "{name}: experts left out of the copy: {left:?}");
    assert_eq!(calls.get(), (after.len(), after.len()), "{name}: progress did not count every expert matrix");
    println!("{name}: {} expert matrices, {} interleaved before the copy", after.len(), before.iter().filter(|&&i| i).count());
    let step = |m: &Model| {
        let mut st = m.new_state(64);
        m.forward(&[3, 7, 11, 13, 17], &mut st, Logits::None).unwrap();
        let before = weight_passes();
        let l = m.forward(&[5], &mut st, Logits::Last).unwrap();
        (weight_passes() - before, l)
    };
    let ((pm, lm), (pc, lc)) = (step(&mapped), step(&copied));
    assert_eq!(pm, pc, "{name}: a decode step took {pc} passes copied, {pm} mapped");
    let scale = lm.iter().fold(0f32, |a, v| a.max(v.abs()));
    let diff = lm.iter().zip(&lc).fold(0f32, |a, (x, y)| a.max((x - y).abs()));
    println!("{name}: logits max |mapped - copied| {diff:.2e} (max |logit| {scale:.2})");
    assert!(diff <= 1e-3 * scale.max(1.0), "{name}: copied experts' logits {diff} from the mapped ones");
}

/// A .cmf whose experts are stored interleaved (`cortiq convert`'s default for a mixture):
/// under fast numerics they stay interleaved and memory-mapped (no copy), a decode step reads
/// each selected expert once, and its logits are bit-identical to the `--no-mmap` copy's of a
/// row-major file (the same packed bytes, the same kernels), and `copy_experts` (`--no-mmap`)
/// moves them out of the map unchanged; under exact and llama.cpp
/// numerics (rows un-interleaved as they are read) every logit is bit-identical to the
/// row-major file's.
#[test]
fn interleaved_cmf_experts_read_in_place() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    use cortiq_engine::model::Ffn;
    let name = "gpt_oss"; // every expert matrix quantizes to Q8_0, a type with the layout
    let stored = q8_converted(name, false, Numerics::Fast);
    let mut copied = q8_fast(name);
    copied.copy_experts(&|_, _| {});
    let matrices: Vec<&cortiq_engine::qtensor::QTensor> = stored
        .layers
        .iter()
        .filter_map(|l| if let Ffn::Moe(mw) = &l.ffn { Some(mw) } else { None })
        .flat_map(|mw| mw.experts.iter().flat_map(|e| e.read()))
        .collect();
    assert!(!matrices.is_empty() && matrices.iter().all(|t| t.interleaved()), "{name}: stored experts not interleaved");
    let expert_bytes: usize = matrices.iter().map(|t| t.n_bytes()).sum();
    assert!(
        stored.expert_mapped_bytes() >= expert_bytes,
        "{name}: {} expert bytes in the map of {expert_bytes}: the experts were copied",
        stored.expert_mapped_bytes()
    );
    let step = |m: &Model| {
        let mut st = m.new_state(64);
        m.forward(&[3, 7, 11, 13, 17], &mut st, Logits::None).unwrap();
        let before = weight_passes();
        let l = m.forward(&[5], &mut st, Logits::Last).unwrap();
        (weight_passes() - before, l)
    };
    let ((ps, ls), (pc, lc)) = (step(&stored), step(&copied));
    assert_eq!(ps, pc, "{name}: a decode step took {ps} passes stored interleaved, {pc} copied");
    assert_eq!(ls, lc, "{name}: stored-interleaved logits differ from the copy's");
    // `--no-mmap` on such a file moves the same bytes out of the map
    let mut moved = q8_converted(name, false, Numerics::Fast);
    moved.copy_experts(&|_, _| {});
    assert_eq!(moved.expert_mapped_bytes(), 0, "{name}: --no-mmap left interleaved experts in the map");
    assert_eq!(step(&moved), (ps, ls), "{name}: experts moved out of the map changed the step");
    // (gpt-oss's sinks have no llama.cpp-numerics path: Qwen3-MoE's fixture for both)
    for num in [Numerics::Exact, Numerics::LlamaCpp] {
        let (il, plain) = (q8_converted("qwen3_moe", false, num), q8_converted("qwen3_moe", true, num));
        let Ffn::Moe(mw) = &il.layers[0].ffn else { panic!("qwen3_moe: layer 0 is MoE") };
        assert!(mw.experts[0].gate.interleaved(), "qwen3_moe {num:?}: the stored experts were un-interleaved at load");
        let logits = |m: &Model| {
            let mut st = m.new_state(64);
            let mut out = m.forward(&[3, 7, 11, 13, 17], &mut st, Logits::From(0)).unwrap();
            out.extend(m.forward(&[5], &mut st, Logits::Last).unwrap());
            out
        };
        assert_eq!(logits(&il), logits(&plain), "qwen3_moe {num:?}: interleaved experts changed the logits");
    }
}

/// `Model::populate_experts` (what a mapped load does when memory allows) over every mapped
/// routed expert: progress counts all of their bytes, none is outside the page cache after it,
/// and neither it nor the page probe changes a value the model computes. A dense model has no
/// mapped experts: nothing to read, no probe. (This fixture's file is small: the page cache
/// keeps it in pages the loaded model also maps, so the drop below may free nothing; the drop
/// and read-back are checked on a file of their own in `cortiq_formats`' mapping tests.)
#[test]
fn populated_experts_are_all_in_memory() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    use cortiq_engine::convert::{ConvertOptions, QuantSpec, convert};
    use cortiq_kernels::quant::QuantType;
    let dir = std::env::temp_dir().join(format!("cortiq-populate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("qwen3_moe.cmf");
    let opts = ConvertOptions {
        quant: QuantSpec::To(QuantType::Q8_0),
        embeddings: None,
        f32_as: None,
        force: true,
        plain_experts: false,
    };
    convert(&fixture("qwen3_moe"), &out, &opts, &|_, _, _| {}).unwrap();
    // exact numerics: the experts stay in the map on every CPU (fast numerics interleave them
    // on AVX2)
    let mut m = load(&out).unwrap().model;
    m.set_numerics(Numerics::Exact);
    // drop the file's pages the process does not map (the experts: no step has read them)
    let f = std::fs::File::open(&out).unwrap();
    f.sync_all().unwrap();
    {
        use std::os::fd::AsRawFd;
        // SAFETY: advice on an open file descriptor; it changes what the page cache keeps,
        // never the file's bytes.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
    let dropped = m.expert_missing_bytes();
    let progress = std::cell::Cell::new((0, 0));
    m.populate_experts(&|done, total| progress.set((done, total))).unwrap();
    let (done, total) = progress.get();
    assert!(total > 0 && done == total, "progress {done} of {total}");
    assert_eq!(m.expert_missing_bytes(), 0, "experts outside the page cache after populate ({dropped} bytes before)");
    println!("qwen3_moe: {total} expert bytes mapped, {dropped} dropped from the cache before populate");
    let _ = m.expert_page_share(8);
    let logits = |m: &Model| {
        let mut st = m.new_state(16);
        m.forward(&[3, 7, 11, 13], &mut st, Logits::Last).unwrap()
    };
    let mut plain = load(&out).unwrap().model;
    plain.set_numerics(Numerics::Exact);
    assert_eq!(logits(&m), logits(&plain), "populate or the probe changed the model's values");
    let dense = q8_fast("qwen3");
    assert_eq!(dense.expert_missing_bytes(), 0);
    assert!(dense.expert_page_share(8).is_none(), "a dense model has no mapped experts to probe");
    drop(m);
    let _ = std::fs::remove_dir_all(&dir);
}
